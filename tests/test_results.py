"""results.py and report.py: atomic writes, resume markers, report embedding."""

import json

import numpy as np
import pytest

from attnprune.report import build
from attnprune.results import ResultsDir, atomic_write_text, make_run_dir


def test_atomic_write_leaves_no_temp(tmp_path, monkeypatch):
    atomic_write_text(tmp_path / "a.txt", "one")
    assert (tmp_path / "a.txt").read_text() == "one"

    import attnprune.results as r

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(r.os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write_text(tmp_path / "a.txt", "two")
    assert (tmp_path / "a.txt").read_text() == "one"  # the old file survives
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]  # no temp left behind


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
