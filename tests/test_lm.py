"""``attnprune lm`` on tiny configs: config errors, data, schedule, a run, resume after a kill."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from conftest import require_shared_file  # tests/ is on sys.path

from attnprune.research.data import lm_text
from attnprune.research.lm import LMConfig, lr_at, main, run_lm
from attnprune.runs.config import ConfigError, load_config

TINY = ["--n-layer", "3", "--n-embd", "32", "--n-head", "2", "--context", "32", "--batch-size",
        "4", "--eval-windows", "8", "--gen-tokens", "10", "--bench-repeats", "1", "--warmup", "1"]


@pytest.fixture()
def corpus(tmp_path):
    text = ("To be, or not to be, that is the question:\nWhether 'tis nobler in the mind "
            "to suffer\nThe slings and arrows of outrageous fortune,\n") * 40
    p = tmp_path / "tiny.txt"
    p.write_text(text)
    return p


@pytest.mark.parametrize("override,field", [({"n_layer": 0}, "n_layer"), ({"lr": -1}, "lr"),
                                            ({"method": "nope"}, "method"),
                                            ({"lengths": [1000]}, "lengths"),
                                            ({"method_options": "[1, 2]"}, "method_options"),
                                            ({"bogus": 1}, "bogus"), ({"preset": "huge"}, "preset"),
                                            ({"init": "/nonexistent.safetensors"}, "init")])
def test_bad_config_names_the_field(override, field):
    with pytest.raises(ConfigError, match=field):
        load_config(LMConfig, None, override)


def test_unknown_corpus_and_missing_file():
    with pytest.raises(ValueError, match="data"):
        lm_text.load_lm_text("nope")
    with pytest.raises(ValueError, match="data"):
        lm_text.load_lm_text("text:/nonexistent/file.txt")


def test_char_corpus_split_and_roundtrip(corpus):
    d = lm_text.load_lm_text(f"text:{corpus}")
    n = len(corpus.read_text())
    assert len(d.train) == int(0.9 * n) and len(d.train) + len(d.val) == n
    assert d.decode(d.encode("To be")) == "To be"
    x, y = lm_text.eval_windows(d.val, 4, 16)
    assert torch.equal(x[:, 1:], y[:, :-1])
    with pytest.raises(ValueError, match="prompt"):
        d.encode("Z€")


def test_bpe_tokenizer_on_a_file(corpus):
    d = lm_text.load_lm_text(f"text:{corpus}", tokenizer="bpe", bpe_vocab=300)
    assert d.vocab_size <= 300 and len(d.train) > 0
    assert d.decode(d.encode("To be, or not")) == "To be, or not"


def test_shakespeare_char_is_the_shared_file():
    require_shared_file(lm_text.shared_data_dir() / "shakespeare.txt")
    d = lm_text.load_lm_text("shakespeare_char")
    assert d.vocab_size < 120
    assert abs(len(d.train) / (len(d.train) + len(d.val)) - 0.9) < 1e-6


def test_schedule_warmup_then_cosine():
    assert lr_at(0, 100, 1.0, 0.1, 10) == pytest.approx(0.1)
    assert lr_at(9, 100, 1.0, 0.1, 10) == pytest.approx(1.0)
    assert lr_at(10, 100, 1.0, 0.1, 10) == pytest.approx(1.0)
    assert lr_at(100, 100, 1.0, 0.1, 10) == pytest.approx(0.1)
    assert lr_at(55, 100, 1.0, 0.1, 10) == pytest.approx(0.55)


@pytest.mark.slow
def test_dtr_run_writes_results_and_resumes_after_a_kill(corpus, tmp_path, monkeypatch):
    from attnprune.research import lm
    out = tmp_path / "run"
    argv = [*TINY, "--data", f"text:{corpus}", "--method", "dtr", "--steps", "4",
            "--stage2-steps", "2", "--eval-every", "2", "--lengths", "16,32", "--eval-windows", "4",
            "--method-options", "{sparsity_weight: 0.5}", "--out", str(out), "--exact-out"]
    real_batch, calls = lm.batch, {"n": 0}

    def dying_batch(*a, **k):  # killed during the third step of stage 1 (after a checkpoint)
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real_batch(*a, **k)

    monkeypatch.setattr(lm, "batch", dying_batch)
    with pytest.raises(KeyboardInterrupt):
        main(argv)
    meta = json.loads((out / "checkpoint" / "meta.json").read_text())
    assert meta["step"] == 2 and meta["stage"] == 0
    assert not list(out.rglob("*.pt")) and not list(out.rglob("*.bin"))
    monkeypatch.setattr(lm, "batch", real_batch)
    assert main(argv) == 0
    hist = json.loads((out / "history.json").read_text())
    assert [h["step"] for h in hist] == [2, 4, 6]  # resumed at 2, no step repeated
    s = json.loads((out / "summary.json").read_text())
    e = s["methods"]["dtr"]
    assert len(e["kept_per_layer"]) == 3 and e["kept_per_layer"][0] == 1.0
    assert e["flops"]["measured"] > 0 and e["flops"]["relative"] > 0
    assert 0 < e["flops"]["proxy_relative"] <= 1.0
    assert e["time"]["median_s"] > 0 and e["tokens_per_s"] > 0
    assert e["generation"]["cache_consistent"] is True
    assert [r["length"] for r in s["length_sweep"]] == [16, 32]
    for f in ("training_curves.png", "flops_vs_length.png", "perplexity_vs_length.png",
              "effective_flops_vs_layers.png", "model.safetensors", "config.yaml", "metrics.csv"):
        assert (out / f).is_file(), f
    # A finished run is skipped when rerun with the same folder.
    assert main(argv) == 0


@pytest.mark.slow
def test_finetune_from_saved_baseline_compares_to_it(corpus, tmp_path):
    base = run_lm(load_config(LMConfig, None, {**_kv(TINY), "data": f"text:{corpus}", "steps": 2,
                                                "eval_every": 2, "gen_tokens": 0}),
                  tmp_path / "base", exact=True)
    cfg = load_config(LMConfig, None, {**_kv(TINY), "data": f"text:{corpus}", "steps": 2,
                                       "eval_every": 2, "gen_tokens": 0, "method": "ltp",
                                       "init": str(base / "model.safetensors")})
    run = run_lm(cfg, tmp_path / "ltp", exact=True)
    s = json.loads((run / "summary.json").read_text())
    assert "baseline" in s["methods"] and s["comparisons"][0]["b"] == "baseline"
    assert s["methods"]["ltp"]["perplexity_relative"] > 0


def _kv(argv):
    return {argv[i][2:].replace("-", "_"): argv[i + 1] for i in range(0, len(argv), 2)}


def test_paper_preset_from_the_command_line_and_a_config_file(tmp_path, monkeypatch):
    from attnprune.research import lm
    seen = {}
    monkeypatch.setattr(lm, "run_lm", lambda cfg, out, exact: seen.setdefault("cfg", cfg))
    lm.main(["--preset", "paper", "--steps", "3", "--out", str(tmp_path)])
    c = seen.pop("cfg")
    assert (c.n_layer, c.n_head, c.n_embd, c.context, c.dropout) == (6, 6, 384, 256, 0.2)
    f = tmp_path / "c.yaml"
    f.write_text("preset: paper\nsteps: 3\n")
    lm.main(["--config", str(f), "--out", str(tmp_path)])
    assert seen["cfg"].n_embd == 384 and seen["cfg"].steps == 3


def test_bench_lm_over_windows_with_and_without_row_bucketing(corpus, tmp_path):
    """``bench lm --windows N --bucket-rows false``: FLOPs over all N windows in batches; with
    an LTP threshold that keeps different counts per row, bucketing never counts more FLOPs."""
    from attnprune.bench.lm import BenchLMConfig, bench_lm

    cfg = load_config(LMConfig, None, {**_kv(TINY), "data": f"text:{corpus}", "steps": 2,
                                       "eval_every": 2, "gen_tokens": 0, "method": "ltp",
                                       "method_options": "{keep_ratio: 0.5}"})
    run = run_lm(cfg, tmp_path / "ltp", exact=True)
    rows = {}
    for bucket in (True, False):
        out = bench_lm(BenchLMConfig(run=str(run), batch_size=4, windows=8, repeats=1, warmup=0,
                                     gen_tokens=0, bucket_rows=bucket),
                       tmp_path / f"bench{bucket}", exact=True)
        rows[bucket] = json.loads((out / "summary.json").read_text())["methods"]["ltp"]["rows"][0]
    assert rows[True]["windows"] == 8 and rows[True]["bucket_rows"] is True
    assert rows[True]["flops_pruned"] <= rows[False]["flops_pruned"]
    assert rows[True]["flops_full"] == rows[False]["flops_full"]
    # perplexity with pruning off and on, on the same windows; bucketing does not change it
    assert rows[True]["perplexity_pruned"] == pytest.approx(rows[False]["perplexity_pruned"], rel=1e-5)
    assert rows[True]["perplexity_full"] > 1.0
    if rows[False]["flops_pruned"] == rows[False]["flops_full"]:  # nothing pruned yet: same model
        assert rows[False]["perplexity_pruned"] == pytest.approx(rows[False]["perplexity_full"], rel=1e-6)
    with pytest.raises(ValueError, match="windows"):
        BenchLMConfig(run=str(run), windows=-1)


@pytest.mark.slow
def test_dtr_sweep_spreads_runs_resumes_and_tabulates(corpus, tmp_path, monkeypatch):
    """``lm --sweep``: a control and one run per point from the same base; killed during the
    second point, the rerun skips the finished runs and resumes the killed one."""
    from attnprune.research import lm
    base = run_lm(load_config(LMConfig, None, {**_kv(TINY), "data": f"text:{corpus}", "steps": 2,
                                                "eval_every": 2, "gen_tokens": 0}),
                  tmp_path / "base", exact=True)
    out = tmp_path / "sweep"
    argv = [*TINY, "--data", f"text:{corpus}", "--method", "dtr", "--steps", "2",
            "--stage2-steps", "2", "--eval-every", "1", "--gen-tokens", "0", "--seeds", "0,1",
            "--init", str(base / "model.safetensors"), "--method-options", "{samples: 2}",
            "--sweep", "{keep_target: [0.5, 0.9]}", "--out", str(out), "--exact-out"]
    real_save, saves, killed = lm._save_checkpoint, [], []

    def dying_save(folder, *a, **k):  # killed after the 2nd checkpoint of the second point
        real_save(folder, *a, **k)
        saves.append(folder.parent.name)
        if saves.count("keep_target=0.9-s0") == 2 and not killed:
            killed.append(True)
            raise KeyboardInterrupt

    monkeypatch.setattr(lm, "_save_checkpoint", dying_save)
    with pytest.raises(KeyboardInterrupt):
        main(argv)
    assert saves[:4] == ["control-s0"] * 4  # 4 steps, a checkpoint each
    assert (out / "keep_target=0.5-s0" / "summary.json").is_file()
    saves.clear()
    assert main(argv) == 0
    s = json.loads((out / "sweep.json").read_text())
    assert s["control"] == {"steps": 4, "lr": pytest.approx(3e-4)}
    assert [p["keep_target"] for p in s["points"]] == [0.5, 0.9]
    assert len(s["runs"]) == 4 and all(p["seeds"] == 2 for p in s["points"])
    for p in s["points"]:
        assert 0 < p["kept_ratio"] <= 1 and p["flops_relative"] > 0 and 0 <= p["p_holm"] <= 1
        assert p["random_policy_perplexity"] > 0
        lo, hi = p["perplexity_change_ci95"]
        assert lo <= p["perplexity_change_pct"] <= hi
    assert saves[0] == "keep_target=0.9-s0" and "control-s0" not in saves  # resumed, skipped
    hist = json.loads((out / "keep_target=0.9-s0" / "history.json").read_text())
    assert [h["step"] for h in hist] == [1, 2, 3, 4]  # no step repeated
    assert "budget_lambda" in hist[0] and hist[-1]["stage"] == "backbone"
    for f in ("sweep.png", "sweep_table.md", "sweep_table.csv"):
        assert (out / f).is_file(), f


def test_sweep_config_errors_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match="sweep"):
        load_config(LMConfig, None, {"method": "dtr", "sweep": "{keep_target: 0.5}"})
    with pytest.raises(ConfigError, match="init"):
        load_config(LMConfig, None, {"method": "dtr", "sweep": "{keep_target: [0.5]}"})


def test_distillation_from_the_sweep_control(corpus, tmp_path, monkeypatch):
    """``--distill-from control``: each point is distilled from its seed's control (the teacher
    is that run's weights); α = 0 is plain CE, a teacher equal to the model adds no KL."""
    from attnprune.research import lm
    base = run_lm(load_config(LMConfig, None, {**_kv(TINY), "data": f"text:{corpus}", "steps": 2,
                                                "eval_every": 2, "gen_tokens": 0}),
                  tmp_path / "base", exact=True)
    teachers = []
    real = lm.load_teacher
    monkeypatch.setattr(lm, "load_teacher", lambda cfg, v, path: teachers.append(path) or real(cfg, v, path))
    out = tmp_path / "sweep"
    argv = [*TINY, "--data", f"text:{corpus}", "--method", "ltp", "--steps", "2", "--eval-every", "2",
            "--gen-tokens", "0", "--init", str(base / "model.safetensors"), "--distill-from", "control",
            "--distill-weight", "0.5", "--sweep", "{keep_ratios: [[0.5, 0.2]]}",
            "--method-options", "{layers: [1, 2]}", "--out", str(out), "--exact-out"]
    assert main(argv) == 0
    assert teachers == [str(out / "control-s0" / "model.safetensors")]  # the control never distils
    cfg = load_config(LMConfig, None, {**_kv(TINY), "data": f"text:{corpus}"})
    model = lm.build_model(cfg, 40).eval()
    x = torch.randint(0, 40, (2, 16))
    logits = model(x).logits
    ce = torch.tensor(2.0)
    same = lm._distilled(ce, logits, model, x, SimpleNamespace(distill_weight=1.0, distill_temperature=2.0))
    assert float(same) == pytest.approx(0.0, abs=1e-6)
    plain = lm._distilled(ce, logits, model, x, SimpleNamespace(distill_weight=0.0, distill_temperature=1.0))
    assert float(plain) == pytest.approx(2.0)


@pytest.mark.parametrize("override,field", [({"distill_weight": 1.5, "distill_from": "x"}, "distill_weight"),
                                            ({"distill_weight": 0.5}, "distill_from"),
                                            ({"distill_weight": 0.5, "distill_from": "control"}, "distill_from"),
                                            ({"distill_weight": 0.5, "distill_from": "/no/such"}, "distill_from")])
def test_distillation_config_errors_name_the_field(override, field):
    with pytest.raises(ConfigError, match=field):
        load_config(LMConfig, None, override)


def test_lm_device_option(monkeypatch):
    """``device``: auto is CUDA where torch sees one (training runs there), else the CPU;
    a wrong name or a missing GPU is refused naming the field."""
    import attnprune.research.lm as lm_mod

    with pytest.raises(ValueError, match="device"):
        lm_mod.LMConfig(device="tpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert lm_mod.resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ValueError, match="device: cuda"):
        lm_mod.resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert lm_mod.resolve_device("auto") == torch.device("cuda")
