"""results.py and report.py: atomic writes, resume markers, report embedding."""

import json

import numpy as np
import pytest

from attnprune.runs.report import build
from attnprune.runs.results import ResultsDir, atomic_write_text, make_run_dir


def test_atomic_write_leaves_no_temp(tmp_path, monkeypatch):
    atomic_write_text(tmp_path / "a.txt", "one")
    assert (tmp_path / "a.txt").read_text() == "one"

    import attnprune.runs.results as r

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(r.os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write_text(tmp_path / "a.txt", "two")
    assert (tmp_path / "a.txt").read_text() == "one"  # the old file survives
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]  # no temp left behind


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_atomic_write_honours_the_umask(tmp_path, umask, mode):
    """Files written atomically (results, report.html) get 0666 minus the umask, as a plain
    open() gives; they were 0600 whatever the umask (tempfile.mkstemp)."""
    import os
    import stat

    old = os.umask(umask)
    try:
        p = atomic_write_text(tmp_path / "a.txt", "one")
        rd = ResultsDir(tmp_path)
        rd.write_json("summary.json", {"command": "test", "methods": {}})
        page = build(tmp_path)
    finally:
        os.umask(old)
    for f in (p, tmp_path / "summary.json", page):
        assert stat.S_IMODE(f.stat().st_mode) == mode, f.name
    assert sorted(x.name for x in tmp_path.iterdir()) == ["a.txt", "report.html", "summary.json"]


def test_run_dir_and_resume(tmp_path):
    d1 = make_run_dir(tmp_path, "reproduce synthetic")
    d2 = make_run_dir(tmp_path, "reproduce synthetic")
    assert d1 != d2 and d1.name.startswith("reproduce-synthetic-")
    rd = ResultsDir(d1)
    assert not rd.run_done("entropy/seed42")
    rd.save_run("entropy/seed42", {"accuracy": np.float32(0.5), "nan": float("nan")})
    assert rd.run_done("entropy/seed42")
    assert rd.load_run("entropy/seed42") == {"accuracy": 0.5, "nan": None}


def test_predictions_npz_no_pickle(tmp_path):
    rd = ResultsDir(tmp_path)
    p = rd.save_predictions("entropy rho=0.5", 42, [0, 1], [1, 1], [0.2, 0.9])
    z = np.load(p, allow_pickle=False)
    assert z["y_true"].tolist() == [0, 1] and z["scores"].dtype == np.float64


def test_report_embeds_figures_and_tables(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rd = ResultsDir(tmp_path)
    rd.write_json("summary.json", {
        "command": "test", "env": {"torch": "x"},
        "methods": {"full": {"accuracy": {"mean": 0.9, "ci95": [0.88, 0.92], "per_seed": [0.9]}}},
        "comparisons": [{"a": "entropy", "b": "full", "metric": "accuracy", "diff": -0.01,
                         "ci95": [-0.02, 0.0], "test": "mcnemar", "p": 0.03, "p_holm": 0.06}],
    })
    fig, ax = plt.subplots()
    ax.plot([0, 1])
    rd.save_figure("curve.png", fig)
    page = build(tmp_path).read_text()
    assert "data:image/png;base64," in page and "0.9000 [0.8800, 0.9200]" in page
    assert "mcnemar" in page
    with pytest.raises(ValueError, match="not a folder"):
        build(tmp_path / "missing")
    json.loads((tmp_path / "summary.json").read_text())


def test_rerun_with_other_options_is_refused_naming_the_keys(tmp_path, capsys):
    """A folder with finished runs, re-run with other options: refused before any work with
    the differing keys named, config.yaml and summary.json left as they were (it used to
    skip the finished run and write the new options over the folder's)."""
    from attnprune import cli
    from attnprune.research.finetune import FinetuneConfig
    from attnprune.runs.config import ConfigError, parse_command_line

    out = tmp_path / "ft"
    csv = tmp_path / "d.csv"
    csv.write_text("text,label\n" + "".join(f"row {i},{i % 2}\n" for i in range(12)))
    first = ["--data", f"csv:{csv}", "--epochs", "1", "--lr", "5e-5", "--seeds", "0"]
    cfg = parse_command_line([*first, "--out", str(out), "--exact-out"], FinetuneConfig).config
    ResultsDir.start(out, "finetune", True, cfg)
    ResultsDir(out).save_run("full__seed0", {"label": "full", "seed": 0, "test": {"accuracy": 1.0}})
    ResultsDir(out).write_json("summary.json", {"config": {"epochs": 1}})
    before = {f: (out / f).read_bytes() for f in ("config.yaml", "summary.json")}

    rc = cli.main(["finetune", *first, "--epochs", "3", "--lr", "1e-3", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2
    assert "epochs: 1 → 3" in err and "lr: 5e-05 → 0.001" in err, err
    assert "seeds" not in err and "data" not in err  # only the keys that differ
    assert {f: (out / f).read_bytes() for f in before} == before
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml", "runs", "summary.json"]

    # the folder's own options resume it: given again, or taken from it (--out alone); the
    # options that only steer the run (progress bars) may differ
    for argv in ([*first, "--out", str(out)], ["--out", str(out)],
                 ["--out", str(out), "--progress", "false"]):
        cl = parse_command_line(argv, FinetuneConfig)
        assert cl.exact_out and cl.config.epochs == 1 and cl.config.data == f"csv:{csv}"
        assert ResultsDir.start(cl.out, "finetune", cl.exact_out, cl.config).path == out
    assert {f: (out / f).read_bytes() for f in before} == before
    with pytest.raises(ConfigError, match=r"differing keys: keep_ratio: \[0.5\] → \[0.3\]"):
        cl = parse_command_line(["--out", str(out), "--keep-ratio", "0.3"], FinetuneConfig)
        ResultsDir.start(cl.out, "finetune", cl.exact_out, cl.config)
