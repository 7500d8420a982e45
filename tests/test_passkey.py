"""The passkey-retrieval task of issue 25 (attnprune.research.experiments.passkey): the prompts hold the
key where they say, and accuracy is computed through the pruned prefill."""

from __future__ import annotations

import pytest
import torch

from attnprune.research.experiments import passkey as pk


def test_prompts_hold_the_key_once_and_end_with_the_query():
    g = torch.Generator().manual_seed(0)
    ids, answers, start = pk.passkey_batch(32, 40, 4, 30, g)
    assert ids.shape == (32, 40) and answers.shape == (32, 4)
    assert (ids[:, 0] == pk.BOS).all() and (ids[:, -1] == pk.QUERY).all()
    assert ((ids == pk.KEY).sum(1) == 1).all()
    for b in range(32):
        s = int(start[b])
        assert ids[b, s] == pk.KEY and torch.equal(ids[b, s + 1: s + 5], answers[b])
        rest = torch.cat([ids[b, 1:s], ids[b, s + 5: -1]])
        assert (rest >= pk.FILLER0).all() and (rest < 30).all()  # filler only
    assert (answers >= pk.DIGIT0).all() and (answers < pk.FILLER0).all()


def test_accuracy_runs_pruned_and_unpruned():
    cfg = pk.PasskeyConfig(width=32, layers=2, heads=2, kv_heads=1, ffn=64, steps=2, batch=2,
                           min_len=16, max_len=24)
    model = pk.train(cfg, progress=None)
    for opts in ({}, {"keep": 0.5, "method": "fastv", "layer": 1, "window": 2}):
        acc = pk.accuracy(model, cfg, length=24, n=4, batch=2, **opts)
        assert 0.0 <= acc <= 1.0


def test_run_writes_the_grid_paired_with_unpruned(tmp_path):
    from attnprune.runs.results import ResultsDir

    cfg = pk.PasskeyConfig(width=32, layers=2, heads=2, kv_heads=1, ffn=64, steps=2, batch=2,
                           min_len=16, max_len=24, eval_n=4, keeps=(0.5,), methods=("gemfilter",),
                           threads=0)
    out = ResultsDir.start(tmp_path, "passkey", True, cfg)
    rows = pk.run(cfg, out, progress=None)["rows"]
    assert [r["variant"] for r in rows] == ["unpruned", "gemfilter 0.5", "gemfilter 0.5 random"]
    assert rows[2]["options"]["score"] == "random"
    assert rows[0]["key_kept"] == 1.0 and rows[0]["mcnemar_p"] is None
    assert 0.0 <= rows[1]["key_kept"] <= 1.0 and 0.0 <= rows[1]["mcnemar_p"] <= 1.0
    assert (tmp_path / "summary.json").is_file() and (tmp_path / "model.safetensors").is_file()
    # evaluating saved weights (--init) gives the same rows
    again = pk.run(pk.PasskeyConfig(**{**cfg.__dict__, "init": str(tmp_path / "model.safetensors")}),
                   ResultsDir.start(tmp_path / "again", "passkey", True, cfg), progress=None)["rows"]
    assert [r["accuracy"] for r in again] == [r["accuracy"] for r in rows]


def test_config_checks():
    with pytest.raises(ValueError, match="vocab"):
        pk.PasskeyConfig(vocab=10)
    with pytest.raises(ValueError, match="digits"):
        pk.PasskeyConfig(digits=0)


def test_device_and_training_fields_are_checked():
    with pytest.raises(ValueError, match="device"):
        pk.PasskeyConfig(device="gpu")
    with pytest.raises(ValueError, match="budget_s"):
        pk.PasskeyConfig(budget_s=-1.0)
    assert pk.training_device(pk.PasskeyConfig(device="cpu")).type == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="cuda"):
            pk.training_device(pk.PasskeyConfig(device="cuda"))


def test_batch_tokens_and_time_budget_shape_the_training():
    cfg = pk.PasskeyConfig(width=32, layers=2, heads=2, kv_heads=1, ffn=64, steps=3, batch=2,
                           min_len=16, max_len=24, batch_tokens=200, device="cpu")
    log = []
    pk.train(cfg, progress=None, log=log)
    assert log[0]["batch"] == max(2, 200 // log[0]["length"]) and log[-1]["steps_done"] == 3
    # a budget already spent after the first step ends the schedule there
    log = []
    pk.train(pk.PasskeyConfig(**{**cfg.__dict__, "steps": 50, "budget_s": 1e-9}), progress=None, log=log)
    assert log[-1]["steps_done"] == 1


def test_train_only_saves_weights_that_load_back_the_same(tmp_path):
    import json

    from attnprune.runs.results import ResultsDir

    cfg = pk.PasskeyConfig(width=32, layers=2, heads=2, kv_heads=1, ffn=64, steps=4, batch=4,
                           min_len=16, max_len=24, device="cpu", train_only=True, check_n=8,
                           eval_lengths=(0, 16), threads=0)
    out = ResultsDir.start(tmp_path, "passkey", True, cfg)
    summary = pk.run(cfg, out, progress=None)
    assert not (tmp_path / "summary.json").exists()  # no evaluation grid
    assert set(summary["check"]) == {"24", "16"} and summary["steps_done"] == 4
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["width"] == 32 and saved["device"] == "cpu" and saved["train_only"] is True
    assert json.loads((tmp_path / "train.json").read_text())["check"] == summary["check"]
    model = pk.load_model(pk.PasskeyConfig(**{k: tuple(v) if isinstance(v, list) else v
                                             for k, v in saved.items()}),
                          tmp_path / "model.safetensors")
    # the same weights: the same quick check as at the end of training, and the same logits
    assert pk.quick_check(model, cfg, 24, 8) == summary["check"]["24"]
    again = pk.train(cfg, progress=None)
    ids = pk.passkey_batch(2, 24, 2, 64, torch.Generator().manual_seed(3))[0]
    with torch.no_grad():
        assert torch.equal(model(ids).logits, again(ids).logits)


def test_quick_check_agrees_with_greedy_retrieval():
    cfg = pk.PasskeyConfig(width=32, layers=2, heads=2, kv_heads=1, ffn=64, steps=30, batch=8,
                           min_len=16, max_len=24, device="cpu")
    model = pk.train(cfg, progress=None)
    assert pk.quick_check(model, cfg, 24, n=32, batch=16) == pk.accuracy(model, cfg, 24, n=32, batch=16)


def test_pooled_difference_pairs_the_prompts():
    full = [True] * 90 + [False] * 10
    pruned = [True] * 85 + [False] * 5 + [True] * 2 + [False] * 8  # 5 lost, 2 gained
    d = pk.pooled_difference(pruned, full, n_resamples=2000)
    assert (d["lost"], d["gained"], d["n"]) == (5, 2, 100)
    assert d["diff"] == pytest.approx(-0.03)
    assert -0.1 < d["ci95"][0] < -0.03 < d["ci95"][1] <= 0.03
    assert 0.0 < d["mcnemar_p"] < 1.0 and 0.05 < d["lost_upper95"] < 0.15
    same = pk.pooled_difference(full, full)
    assert same["ci95"] == [0.0, 0.0] and same["mcnemar_p"] == 1.0
    assert same["lost_upper95"] == pytest.approx(1 - 0.05 ** (1 / 100))


def test_models_folder_is_evaluated_per_seed_and_pooled(tmp_path):
    import json

    from attnprune.runs.results import ResultsDir

    small = {"width": 32, "layers": 2, "heads": 2, "kv_heads": 1, "ffn": 64, "steps": 2,
             "batch": 2, "min_len": 16, "max_len": 24, "device": "cpu", "train_only": True,
             "check_n": 4, "threads": 0}
    for seed in (0, 1):
        cfg = pk.PasskeyConfig(seed=seed, **small)
        pk.run(cfg, ResultsDir.start(tmp_path / "models" / f"seed{seed}", "passkey", True, cfg), progress=None)
    ev = pk.PasskeyConfig(models=str(tmp_path / "models"), eval_n=4, eval_lengths=(16, 24), keeps=(0.5,),
                          methods=("fastv",), random_control=False, ttft_repeats=1, threads=0,
                          layer=1, window=2)
    out = ResultsDir.start(tmp_path / "eval", "passkey", True, ev)
    summary = pk.run(ev, out, progress=None)
    assert summary["seeds"] == ["seed0", "seed1"]
    assert [(r["length"], r["variant"]) for r in summary["pooled"]] == [
        (16, "unpruned"), (16, "fastv 0.5"), (24, "unpruned"), (24, "fastv 0.5")]
    assert all(r["n"] == 8 and len(r["accuracy_per_seed"]) == 2 for r in summary["pooled"])
    assert [t["variant"] for t in summary["ttft"]] == ["unpruned", "fastv 0.5"]
    assert summary["ttft"][0]["speedup_per_seed"] == [1.0, 1.0] and summary["ttft"][0]["length"] == 24
    seed1 = json.loads((tmp_path / "eval" / "seed1.json").read_text())
    assert seed1["config"]["seed"] == 1 and seed1["config"]["width"] == 32
    assert len(seed1["rows"][0]["right"]) == 4
    # one seed alone, no TTFT; then a pooling run that reuses its grid (marked) and times it
    one = pk.PasskeyConfig(**{**ev.__dict__, "seeds": (1,), "ttft_repeats": 0})
    alone = pk.run(one, ResultsDir.start(tmp_path / "one", "passkey", True, one), progress=None)
    assert alone["seeds"] == ["seed1"] and alone["ttft"] == []
    marked = json.loads((tmp_path / "one" / "seed1.json").read_text())
    marked["rows"][0]["right"] = [False] * 4
    (tmp_path / "one" / "seed1.json").write_text(json.dumps(marked))
    reuse = pk.PasskeyConfig(**{**one.__dict__, "ttft_repeats": 1})
    pooled = pk.run(reuse, ResultsDir(tmp_path / "one"), progress=None)
    assert pooled["pooled"][0]["accuracy"] == 0.0  # the grid came from seed1.json
    assert [t["variant"] for t in pooled["ttft"]] == ["unpruned", "fastv 0.5"]
    assert (tmp_path / "one" / "figure.png").is_file()
    table = (tmp_path / "one" / "table.md").read_text().splitlines()
    assert len(table) == 2 + 4 and table[3].startswith("| 16 | fastv 0.5 |")
    other = pk.PasskeyConfig(**{**reuse.__dict__, "keeps": (0.25,)})
    with pytest.raises(ValueError, match="another grid"):
        pk.run(other, ResultsDir(tmp_path / "one"), progress=None)
