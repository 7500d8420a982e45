"""``attnprune reproduce synthetic`` end to end: results contract, resume, bad input, proxies."""

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from attnprune import cli
from attnprune.research.synthetic import run as synth_run
from attnprune.research.synthetic.config import SyntheticConfig
from attnprune.research.synthetic.run import flops_proxy, latency_proxy, plan_runs
from attnprune.runs.config import load_config

REPO = Path(__file__).resolve().parents[1]
# --quick, made smaller still: real training, a few seconds
SMALL = ["--quick", "--n-train", "160", "--n-val", "80", "--epochs", "1",
         "--ablation-noise", "0.15,0.45", "--n-resamples", "200", "--timing-repeats", "2"]
FIGURES = ["loss_curves.png", "val_accuracy.png", "val_auc.png", "bar_accuracy.png",
           "bar_kept_tokens.png", "ablation.png", "roc_entropy.png", "reliability.png"]


def _run(out: Path, *extra: str) -> int:
    return cli.main(["reproduce", "synthetic", *SMALL, *extra, "--out", str(out), "--exact-out"])


@pytest.fixture(scope="module")
def quick_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth") / "run"
    assert _run(out) == 0
    return out


@pytest.mark.slow
def test_results_folder_contract(quick_dir, capsys):
    for name in ["config.yaml", "summary.json", "metrics.csv", "efficiency.json", "table.txt",
                 "roc_full.npy", "roc_entropy.npy", *FIGURES]:
        assert (quick_dir / name).is_file(), name
    cfg = load_config(SyntheticConfig, quick_dir / "config.yaml")
    s = json.loads((quick_dir / "summary.json").read_text())
    assert s["command"] == "reproduce synthetic"
    assert {"torch", "threads", "device", "python"} <= set(s["env"])
    assert list(s["methods"]) == list(cfg.methods)
    for label, m in s["methods"].items():
        for metric in ("accuracy", "auc", "oracle_overlap", "ece"):
            assert set(m[metric]) >= {"mean", "ci95", "per_seed"}, (label, metric)
            assert len(m[metric]["per_seed"]) == len(cfg.seeds)
        assert 0.0 <= m["accuracy"]["mean"] <= 1.0
        assert m["accuracy"]["ci95"][0] <= m["accuracy"]["mean"] <= m["accuracy"]["ci95"][1]
        assert set(m["flops"]) >= {"measured", "relative", "proxy_relative"}
        assert set(m["time"]) >= {"median_s", "mad_s", "relative"}
        assert 0 < m["kept_ratio"] <= 1
    full, ent = s["methods"]["full"], s["methods"]["entropy"]
    assert full["flops"]["relative"] == 1.0 and full["time"]["relative"] == 1.0
    assert ent["kept_ratio"] == 0.5 and ent["flops"]["proxy_relative"] == pytest.approx(0.625)
    assert ent["flops"]["relative"] < 1.0  # pruned tokens really left the tensor
    assert "gate_calibration" in ent and "signal_auc" in ent
    # paired comparisons against full from the statistics module
    assert s["comparisons"], "comparisons missing"
    for c in s["comparisons"]:
        assert c["b"] == "full" and c["a"] in s["methods"]
        assert {"metric", "diff", "ci95", "test", "p", "p_holm", "effect"} <= set(c)
    assert {c["seed"] for c in s["comparisons_per_seed"]} == set(cfg.seeds)
    assert {c["b"] for c in s["comparisons_vs_attention_mass"]} == {"attention_mass"}
    # predictions per (method, seed), metrics.csv one row per run
    for label in cfg.methods:
        for seed in cfg.seeds:
            z = np.load(quick_dir / "predictions" / f"{label}__seed{seed}.npz")
            assert len(z["y_true"]) == cfg.n_val == len(z["y_pred"]) == len(z["scores"])
    rows = list(csv.DictReader((quick_dir / "metrics.csv").open()))
    assert len(rows) == len(plan_runs(cfg))
    fpr, tpr = np.load(quick_dir / "roc_entropy.npy")
    assert fpr[0] == 0 and tpr[-1] == 1
    eff = json.loads((quick_dir / "efficiency.json").read_text())
    assert eff["methods"]["entropy"]["time"]["repeats"] == cfg.timing_repeats
    assert 0 < eff["methods"]["entropy"]["gate_share"] < 1
    ab = s["ablations"]
    assert [c["keep_ratio"] for c in ab["keep_ratio"] if c["method"] == "entropy"] == [0.3, 0.5]
    assert "seeds" in ab["note"]


@pytest.mark.slow
def test_history_is_real_training(quick_dir):
    rec = json.loads(next((quick_dir / "runs").glob("main_entropy_seed42*.json")).read_text())
    assert len(rec["history"]) == 1 and rec["history"][0]["train_loss"] > 0
    assert rec["accuracy"] == pytest.approx(rec["history"][-1]["val_accuracy"])


@pytest.mark.slow
def test_resume_skips_finished_runs(quick_dir, monkeypatch, capsys):
    calls = []
    real = synth_run.run_one

    def counting(cfg, run):
        calls.append(run.key)
        return real(cfg, run)

    monkeypatch.setattr(synth_run, "run_one", counting)
    assert _run(quick_dir) == 0
    assert calls == []  # everything was finished
    assert "resuming" in capsys.readouterr().out
    marker = quick_dir / "runs" / "main_random_seed43.json"
    marker.unlink()
    assert _run(quick_dir) == 0
    assert calls == ["main/random/seed43"]
    assert marker.is_file()


def test_a_workers_reply_is_one_atomic_pipe_write_and_carries_the_whole_run(tmp_path):
    """A pool worker answers with a file's path, a few hundred bytes (one pipe write of at
    most PIPE_BUF, which the kernel makes atomic), not the state dict: a worker terminated by
    a Ctrl-C while sending that (many writes) left half a message in the pipe and the command
    hung at exit, joining the pool's thread that waited for the rest. The file holds exactly
    what ``run_one`` returns, and is removed once read."""
    import pickle
    import select
    from concurrent.futures.process import _ResultItem

    from attnprune.runs.results import jsonable

    cfg = SyntheticConfig(n_train=64, n_val=32, epochs=1, seeds=(0,),
                          methods=("full", "entropy"), ablations=False)
    run = plan_runs(cfg)[1]  # entropy: gate calibration in its record too
    reply = synth_run._run_to_file(cfg, run, str(tmp_path))
    assert len(pickle.dumps(_ResultItem(2**31, result=reply))) + 8 <= select.PIPE_BUF
    record, state, preds = synth_run._read_run_file(reply)
    assert not list(tmp_path.iterdir())
    want_record, want_state, want_preds = synth_run.run_one(cfg, run)  # deterministic per seed
    assert record == json.loads(json.dumps(jsonable(want_record))) | {
        "seconds": record["seconds"], "cpu_seconds": record["cpu_seconds"]}
    assert state.keys() == want_state.keys() and preds.keys() == want_preds.keys()
    pairs = [*((state[k], v) for k, v in want_state.items()),
             *((preds[k], v) for k, v in want_preds.items())]
    for got, want in pairs:
        np.testing.assert_array_equal(got, want)
        assert got.dtype == np.asarray(want).dtype


@pytest.mark.slow
def test_resume_with_other_config_is_refused(quick_dir, capsys):
    assert _run(quick_dir, "--keep-ratio", "0.7") == 2
    assert "different config" in capsys.readouterr().err


@pytest.mark.parametrize("args, field", [  # named as typed (issue 48 item 5)
    (["--keep-ratio", "0"], "--keep-ratio"),
    (["--keep-ratio", "1.5"], "--keep-ratio"),
    (["--keep-ratio", "abc"], "--keep-ratio"),
    (["--ablation-keep-ratios", "0.3,1.2"], "--ablation-keep-ratios: must be in (0, 1], got 1.2"),
    (["--methods", "full,nope"], "methods"),
    (["--length", "0"], "length"),
    (["--epochs", "twelve"], "epochs"),
    (["--seeds", "a,b"], "seeds"),
    (["--config", "/nonexistent/synthetic.yaml"], "config"),
    (["--bogus", "1"], "bogus"),
    (["--noise", "2"], "noise"),
])
def test_bad_input_stops_before_work(tmp_path, capsys, args, field):
    out = tmp_path / "never"
    rc = cli.main(["reproduce", "synthetic", *args, "--out", str(out)])
    assert rc == 2
    assert field in capsys.readouterr().err
    assert not out.exists()  # no folder, no work


def test_default_config_file_matches_defaults():
    assert load_config(SyntheticConfig, REPO / "configs" / "synthetic.yaml") == SyntheticConfig()


def test_proxies_exact():
    full = flops_proxy(64, 64, 1.0)
    assert full == 2 * (64**2 + 64**2) * 64
    assert flops_proxy(64, 64, 0.5) / full == 0.625
    assert 1 - flops_proxy(64, 64, 0.5) / full == 0.375
    assert latency_proxy(64) == pytest.approx(83.92, abs=1e-12)
    assert latency_proxy(32) == pytest.approx(22.48, abs=1e-12)
    assert round(100 * (latency_proxy(32) / latency_proxy(64) - 1), 2) == -73.21


def test_plan_reuses_main_runs_for_ablation_cells():
    cfg = SyntheticConfig()
    runs = plan_runs(cfg)
    keys = [r.key for r in runs]
    assert len(keys) == len(set(keys))
    main = [r for r in runs if r.group == "main"]
    assert len(main) == len(cfg.methods) * len(cfg.seeds)
    # ρ = 0.5 and noise = 0.15 cells are the main entropy runs, not new ones
    assert not any(r.group == "keep_ratio" and r.keep_ratio == 0.5 for r in runs)
    assert not any(r.group == "noise" and r.noise == cfg.noise for r in runs)
    assert not SyntheticConfig(ablations=False).ablations
    assert len(plan_runs(SyntheticConfig(ablations=False))) == len(main)


def _interrupted_synthetic(tmp_path, real: bool):
    """``reproduce synthetic`` (400 runs in 2 workers: many minutes, if not stopped) given one
    Ctrl-C once 2 runs are saved and both workers are past their start-up (a worker still
    importing dies of the SIGINT, which broke the pool and hid the bug)."""
    from interrupt_helpers import ctrl_c

    out = tmp_path / "run"
    seeds = ",".join(str(s) for s in range(200))
    rc, stdout, stderr, pgid = ctrl_c(
        ["reproduce", "synthetic", "--n-train", "160", "--n-val", "80", "--epochs", "3",
         "--seeds", seeds, "--methods", "full,random", "--ablations", "false", "--workers", "2",
         "--out", str(out), "--exact-out"], after=2, ready=tmp_path / "ready", real=real)
    return out, rc, stdout, stderr, pgid


def _assert_runs_whole(out):
    runs = sorted(out.glob("runs/*.json"))
    for r in runs:  # a marker only after its checkpoint and predictions
        rec = json.loads(r.read_text())
        assert (out / synth_run._ckpt_name(rec["key"])).is_file()
        assert (out / "predictions" / f"{rec['label']}__seed{rec['seed']}.npz").is_file()
    assert not list(out.rglob("*.tmp"))
    return runs


@pytest.mark.slow
def test_one_ctrl_c_stops_promptly_keeps_finished_runs_and_no_process(tmp_path):
    """One Ctrl-C (SIGINT to the parent and its workers, as a terminal sends it) during
    training in worker processes, delivered by the command itself right after its second
    saved run: exit 130 with one line and no traceback; promptly: no queued run is trained,
    only the two in flight may finish (the workers used to take the SIGINT, fail their run
    and go on with the queue while the parent waited for it); nothing left running."""
    from interrupt_helpers import assert_group_gone, assert_stopped_cleanly

    out, rc, stdout, stderr, pgid = _interrupted_synthetic(tmp_path, real=False)
    assert_stopped_cleanly(rc, stdout, stderr)
    assert 2 <= len(_assert_runs_whole(out)) <= 2 + 2
    assert_group_gone(pgid)


@pytest.mark.slow
def test_one_real_ctrl_c_stops_cleanly_and_no_process(tmp_path):
    """The same with a real SIGINT to the whole process group, sent once the command says
    (a file written after its second saved run, from inside its loop of runs) that it is
    there: exit 130, one line, the finished runs saved whole, nothing left running."""
    from interrupt_helpers import assert_group_gone, assert_stopped_cleanly

    out, rc, stdout, stderr, pgid = _interrupted_synthetic(tmp_path, real=True)
    assert_stopped_cleanly(rc, stdout, stderr)
    assert 2 <= len(_assert_runs_whole(out)) < 400
    assert_group_gone(pgid)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the dropped one
def test_a_ctrl_c_python_drops_still_stops_at_the_next_saved_run(tmp_path):
    """A KeyboardInterrupt raised inside a finalizer is printed as "Exception ignored" and
    lost (the cause of a Ctrl-C test that exited 0: the command ran on to its end). With
    sticky_ctrl_c (what the command line runs a command under) the next saved run raises it
    again; the clean-up that a Ctrl-C sets off still saves its runs."""
    import gc
    import signal

    from attnprune.runs.results import ResultsDir, sticky_ctrl_c

    class Finalizer:
        def __del__(self):
            signal.raise_signal(signal.SIGINT)  # the Ctrl-C lands while a finalizer runs

    res = ResultsDir(tmp_path)
    with sticky_ctrl_c():
        f = Finalizer()
        del f
        gc.collect()  # nothing raised here: dropped
        with pytest.raises(KeyboardInterrupt):
            res.save_run("a", {"x": 1})
        assert res.run_done("a")
        res.save_run("b", {"x": 2})  # raised once
        Finalizer()  # another dropped Ctrl-C (freed at once) ...
        try:
            raise KeyboardInterrupt  # ... and its clean-up
        except KeyboardInterrupt:
            res.save_run("c", {"x": 3})  # while the Ctrl-C is handled: saved, nothing raised
        with pytest.raises(KeyboardInterrupt):
            res.save_run("d", {"x": 4})
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_training_worker_ignores_ctrl_c_and_dies_with_its_parent(tmp_path):
    """A worker (set up by ``_worker_init``) leaves Ctrl-C to its parent, and ends when the
    parent is killed outright instead of training on as an orphan (parent PID 1)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from interrupt_helpers import assert_group_gone, group_alive

    ready = tmp_path / "ready"
    script = f"""
import multiprocessing, os, pathlib, sys, time
from attnprune.research.synthetic.run import _worker_init

def worker(parent):
    _worker_init(1, parent)
    pathlib.Path({str(ready)!r}).write_text(str(os.getpid()))
    time.sleep(600)  # a long training run

p = multiprocessing.get_context("fork").Process(target=worker, args=(os.getpid(),))
p.start()
time.sleep(600)
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    parent = subprocess.Popen([sys.executable, "-c", script], env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (ready.is_file() and ready.read_text()):
            assert parent.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        child = int(ready.read_text())
        os.kill(child, signal.SIGINT)  # ignored: the parent decides
        time.sleep(0.5)
        os.kill(child, 0)  # still alive
        parent.kill()  # SIGKILL: no handler of the parent's runs
        parent.wait()
        assert_group_gone(parent.pid, timeout=10)  # the worker does not outlive it
    finally:
        if group_alive(parent.pid):
            os.killpg(parent.pid, signal.SIGKILL)


def test_two_seed_intervals_stay_in_the_metrics_range():
    """summary.json's accuracy / AUC intervals are cut to [0, 1] (2 seeds: t = 12.7 gave
    [0.037, 1.118]); unbounded metrics keep the t-interval."""
    from attnprune.research.synthetic.summary import UNIT, aggregate

    cut = aggregate([0.535, 0.62], UNIT)
    assert cut["ci95"][1] == 1.0 and 0.0 <= cut["ci95"][0] < 0.535
    assert aggregate([0.535, 0.62])["ci95"][1] > 1.0
