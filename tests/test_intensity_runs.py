"""``attnprune reproduce intensity`` (Runs 0–4) on a tiny config: end to end, resume after a kill
without redoing finished runs, the shape of the Holm table, config errors naming the field."""

from __future__ import annotations

import json

import numpy as np
import pytest
import test_lm  # tests/ is on sys.path

from attnprune.research import lm
from attnprune.research.experiments import intensity_runs as ir
from attnprune.runs import stats
from attnprune.runs.config import ConfigError, load_config

corpus = test_lm.corpus  # the tiny text fixture, shared

TINY_LM = "{n_layer: 2, n_embd: 32, n_head: 2, context: 32, batch_size: 4, warmup: 1}"


def _argv(text_file, out):
    return ["--data", f"text:{text_file}", "--seeds", "0,1", "--steps", "4", "--eval-every", "2",
            "--eval-windows", "4", "--lm-options", TINY_LM, "--gen-tokens", "6",
            "--speed-repeats", "1", "--speed-batch", "2", "--threads", "1",
            "--out", str(out), "--exact-out"]


@pytest.mark.slow
def test_runs_end_to_end_and_resume_after_a_kill(corpus, tmp_path, monkeypatch):
    out = tmp_path / "runs"
    real_batch, calls = lm.batch, {"n": 0, "killed": False}
    kill_at = 2 * 4 + 3  # third step of run 2, seed 0 (runs 0 and 1 done: 4 steps each)

    def counting_batch(*a, **k):
        calls["n"] += 1
        if calls["n"] == kill_at and not calls["killed"]:
            calls["killed"] = True
            raise KeyboardInterrupt
        return real_batch(*a, **k)

    monkeypatch.setattr(lm, "batch", counting_batch)
    with pytest.raises(KeyboardInterrupt):
        ir.main(_argv(corpus, out))
    assert sorted(p.stem for p in (out / "runs").glob("*.json")) == [
        "run0-baseline__seed0", "run1-basic__seed0"]
    done = {k: (out / "lm" / k / "model.safetensors").stat().st_mtime_ns
            for k in ("run0-baseline__seed0", "run1-basic__seed0")}
    partial = json.loads((out / "summary.json").read_text())  # written after each run
    assert set(partial["methods"]) == {"run0-baseline", "run1-basic"}

    calls["n"] = 0
    assert ir.main(_argv(corpus, out)) == 0
    # 10 runs × 4 steps = 40 batches; the 2 finished runs are skipped and run 2 resumes from
    # its step-2 checkpoint: 40 − 8 − 2 = 30 batches drawn by the rerun.
    assert calls["n"] == 30
    for k, t in done.items():
        assert (out / "lm" / k / "model.safetensors").stat().st_mtime_ns == t
    hist = json.loads((out / "lm" / "run2-conservative__seed0" / "history.json").read_text())
    assert [h["step"] for h in hist] == [2, 4]

    s = json.loads((out / "summary.json").read_text())
    assert list(s["methods"]) == [ir.RUNS[r][0] for r in range(5)]
    for label, m in s["methods"].items():
        assert m["seeds"] == [0, 1]
        lo, hi = m["val_loss"]["ci95"]
        assert lo <= m["val_loss"]["mean"] <= hi
        assert m["gen_tokens_per_s"] > 0 and m["forward_tokens_per_s"] > 0
        assert len(s["curves"][label]["step"]) == 2
    assert s["methods"]["run0-baseline"]["flops_relative"] == 1.0
    assert s["methods"]["run4-multihead"]["flops_relative"] > 1.0  # the predictor costs FLOPs
    assert s["methods"]["run4-multihead"]["n_parameters"] > s["methods"]["run0-baseline"]["n_parameters"]
    assert len(s["comparisons"]) == 4
    for f in ("intensity_runs.png", "table.md", "metrics.csv", "curves.csv", "speed.json"):
        assert (out / f).is_file(), f
    assert len((out / "metrics.csv").read_text().strip().splitlines()) == 1 + 10
    # A finished experiment reruns without training anything.
    calls["n"] = 0
    assert ir.main(_argv(corpus, out)) == 0
    assert calls["n"] == 0


def _records(diffs: dict[int, list[float]], base=(1.50, 1.52, 1.49)) -> dict:
    recs = {}
    for run in range(5):
        for s, b in enumerate(base):
            loss = b + (diffs[run][s] if run else 0.0)
            recs[(run, s)] = {"val_loss": loss, "seed": s, "perplexity": float(np.exp(loss)),
                              "n_parameters": 1, "train_seconds": 0.0,
                              "curve": {"step": [1, 2], "val_loss": [loss + 0.1, loss],
                                        "train_loss": [0, 0]}}
    return recs


def test_holm_table_shape_and_values():
    cfg = ir.IntensityRunsConfig(seeds=(0, 1, 2))
    diffs = {1: [-0.05, -0.051, -0.049], 2: [0.01, -0.01, 0.0], 3: [0.02, 0.03, 0.025],
             4: [0.001, 0.002, -0.004]}
    cmp = ir.paired_comparisons(cfg, _records(diffs))
    assert [c["a"] for c in cmp] == [ir.RUNS[r][0] for r in (1, 2, 3, 4)]
    assert all(c["b"] == "run0-baseline" and c["seeds"] == [0, 1, 2] for c in cmp)
    ps = [c["p"] for c in cmp]
    assert [c["p_holm"] for c in cmp] == pytest.approx(stats.holm(ps).tolist())
    assert all(c["p_holm"] >= c["p"] for c in cmp)
    assert cmp[0]["diff"] == pytest.approx(-0.05) and cmp[0]["ci95"][1] < 0
    assert cmp[0]["p"] < 0.01 and cmp[1]["p"] > 0.5  # consistent vs sign-flipping differences
    assert cmp[2]["diff_per_seed"] == pytest.approx(diffs[3])
    text = ir.format_table(ir.summarize_methods(cfg, _records(diffs)), cmp, None)
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and not ln.startswith("| run ")]
    assert len(rows) == 5 and all(r.count("|") == 14 for r in rows)
    assert "run1-basic" in text.split("Lower validation loss")[1].split(";")[0]


def test_a_missing_seed_leaves_the_pair_out():
    cfg = ir.IntensityRunsConfig(seeds=(0, 1, 2))
    recs = _records({r: [0.01, 0.02, 0.0] for r in range(1, 5)})
    del recs[(3, 2)]
    cmp = {c["a"]: c for c in ir.paired_comparisons(cfg, recs)}
    assert cmp["run3-position"]["seeds"] == [0, 1]
    assert cmp["run4-multihead"]["seeds"] == [0, 1, 2]


@pytest.mark.parametrize("override,field", [({"runs": [1, 2]}, "runs"), ({"runs": [0, 7]}, "runs"),
                                            ({"seeds": [0]}, "seeds"),
                                            ({"lm_options": "{seed: 3}"}, "lm_options"),
                                            ({"lm_options": "{n_layer: 0}"}, "n_layer"),
                                            ({"lm_options": "{bogus: 1}"}, "bogus"),
                                            ({"speed_seed": 9}, "speed_seed"),
                                            ({"preset": "huge"}, "preset")])
def test_bad_config_names_the_field(override, field):
    with pytest.raises(ConfigError, match=field):
        load_config(ir.IntensityRunsConfig, None, override)


def test_run_configs_share_the_backbone_settings():
    cfg = ir.IntensityRunsConfig(steps=300, lm_options="{dropout: 0.1}")
    base, multi = cfg.lm_config(0, 2), cfg.lm_config(4, 2)
    assert base.method == "none" and multi.method == "intensity"
    assert multi.options == {"preset": "multihead"}
    for f in ("n_layer", "n_embd", "steps", "lr", "seed", "dropout", "eval_every", "context"):
        assert getattr(base, f) == getattr(multi, f), f
    assert base.steps == 300 and base.dropout == 0.1 and base.eval_every == 200  # cpu-small's


def test_paper_config_file_is_the_papers_setup():
    from pathlib import Path

    cfg = load_config(ir.IntensityRunsConfig,
                      Path(__file__).parent.parent / "configs" / "intensity_runs_paper.yaml")
    c = cfg.lm_config(4, 0)
    assert (c.n_layer, c.n_head, c.n_embd, c.context, c.dropout) == (6, 6, 384, 256, 0.2)
    assert (c.steps, c.batch_size, c.lr) == (5000, 64, 1e-3)
    assert cfg.seeds == (0, 1, 2)
