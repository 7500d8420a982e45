"""The attention benchmark and sweep driver: structure and validation (no timing asserted)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnprune.bench.attention import BenchAttentionConfig, format_table, run
from attnprune.research.experiments.attention_sweeps import (
    DENSE,
    SweepConfig,
    settings,
    sparse_proxy_relative,
)
from attnprune.runs.config import ConfigError, parse_command_line


def test_bench_attention_runs_and_reports_every_variant():
    cfg = BenchAttentionConfig(batch=1, seq_len=16, width=32, heads=2, layers=1, repeats=1,
                               warmup=0, rounds=1)
    s = run(cfg)
    assert set(s["methods"]) == {"dense", "intensity_sdpa", "intensity_eager", "crisp"}
    assert s["methods"]["dense"]["tokens_per_s_ratio"] == 1.0
    assert s["methods"]["intensity_sdpa"]["flops"]["relative"] > 1.0  # predictor counted
    assert "intensity through SDPA" in format_table(s)


@pytest.mark.parametrize("key,value", [("width", "33"), ("crisp_sparsity", "1.0"),
                                       ("rounds", "0")])
def test_bench_attention_rejects_bad_options(key, value):
    with pytest.raises((ValueError, ConfigError), match=key):
        parse_command_line([f"--{key}", value], BenchAttentionConfig)


def test_sweep_settings_share_one_dense_run():
    runs = settings(SweepConfig(sweep="all", sparsities=(0.0, 0.8), schedules=("uniform",),
                                lams=(0.0, 1e-3), locations=("both", "ffn")))
    labels = [r[0] for r in runs]
    assert labels == [DENSE, "crisp-s0.8-uniform", "cost-lam0.001-both", "cost-lam0.001-ffn"]
    assert runs[3][2] == {"lam": 1e-3, "alpha": 1.0, "beta": 1.0, "location": "ffn"}


@pytest.mark.parametrize("key,value", [("sweep", "magic"), ("sparsities", "[1.5]"),
                                       ("locations", "[head]"), ("lams", "[-1]")])
def test_sweep_rejects_bad_options(key, value):
    with pytest.raises((ValueError, ConfigError), match=key):
        parse_command_line([f"--{key}", value], SweepConfig)


def test_sparse_proxy_bounds():
    class C:
        hidden_size, intermediate_size = 384, 1536

    assert sparse_proxy_relative(C, 0.0, 0.0, 64) == pytest.approx(1.0)
    assert sparse_proxy_relative(C, 0.8, 0.5, 64) < 1.0


def test_table3_from_sparse_ffn_records():
    from attnprune.research.experiments.attention_sweeps import sparse_label
    from attnprune.research.experiments.attention_sweeps_tables import format_table3, sparse_summary

    cfg = SweepConfig(sweep="cost", lams=(0.0, 1e-3), locations=("both",),
                      sparse_ffn_thresholds=(0.0,), sparse_ffn_blocks=(16,))
    t = {"median_s": 0.2, "batches": 2, "relative": 1.0}
    test = {"accuracy": 0.8, "mcc": 0.5, "n": 100, "time": t,
            "flops": {"measured": 2e11, "full_measured": 2e11}}
    sub = sparse_label("cost-lam0.001-both", 0.0, 16)
    sp = {"0-b16": {"label": sub, "threshold": 0.0, "mode": "relu", "block": 16,
                    "max_active": 0.5, "accuracy": 0.75, "mcc": 0.4, "n": 100,
                    "flops": {"measured": 1.5e11, "relative": 0.75},
                    "time": {"median_s": 0.18, "batches": 2, "relative": 0.9},
                    "token_sparsity": 0.9, "block_sparsity": 0.5}}
    records = {(DENSE, 0): {"seed": 0, "test": test},
               ("cost-lam0.001-both", 0): {"seed": 0, "test": test, "sparse_ffn": sp}}
    s = sparse_summary(cfg, records, settings(cfg))
    assert list(s) == [sub]
    assert s[sub]["gflops_per_example"] == pytest.approx(1.5)
    assert s[sub]["latency_ms_per_batch"] == pytest.approx(90.0)
    cmp = [{"a": sub, "b": DENSE, "metric": "accuracy", "diff": -0.05, "ci95": [-0.1, 0.0],
            "p": 0.04, "p_holm": 0.08}]
    table = format_table3(cfg, records, s, cmp)
    assert "| 0 (dense FFN) | — | — | 2.000 | 1.000 | 100.0 |" in table
    assert "| 0.001 | 0 | 16 | 1.500 | 0.750 | 90.0 | 0.900 | 0.900 | 0.500 |" in table
    assert "-0.0500 [-0.1000, +0.0000] | 0.08 |" in table


@pytest.mark.parametrize("key,value", [("sparse_ffn_thresholds", "[-0.1]"),
                                       ("sparse_ffn_mode", "topk"),
                                       ("sparse_ffn_blocks", "[0]"),
                                       ("sparse_ffn_max_active", "2")])
def test_sweep_rejects_bad_sparse_ffn_options(key, value):
    with pytest.raises((ValueError, ConfigError), match=key):
        parse_command_line([f"--{key}", value], SweepConfig)


# ----------------------------------------------------------------------------- compaction
@pytest.mark.parametrize("key,value", [("ffn_penalty", "l2"), ("compact_thresholds", "[nan]"),
                                       ("compact_thresholds", "[0, 0]"),
                                       ("compact_criterion", "topk"),
                                       ("compact_fold", "maybe"), ("compact_batches", "0")])
def test_sweep_rejects_bad_compaction_options(key, value):
    with pytest.raises((ValueError, ConfigError), match=key):
        parse_command_line([f"--{key}", value], SweepConfig)


def test_group_penalty_settings_are_labelled_and_passed():
    runs = settings(SweepConfig(sweep="cost", lams=(0.0, 1e-3), locations=("both",),
                                ffn_penalty="group"))
    assert [r[0] for r in runs] == [DENSE, "cost-lam0.001-both-group"]
    assert runs[1][2]["ffn_penalty"] == "group"


def _tiny_loader(n: int = 12, seed: int = 0):
    from torch.utils.data import DataLoader

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 50, (n, 10), generator=g)
    labels = torch.randint(0, 2, (n,), generator=g)

    def collate(rows):
        mask = torch.ones(len(rows), 10, dtype=torch.long)
        mask[0, 7:] = 0
        return {"input_ids": ids[rows], "attention_mask": mask, "labels": labels[rows]}

    return DataLoader(list(range(n)), batch_size=4, collate_fn=collate)


def test_compact_runs_measure_and_summarise(tmp_path):
    from transformers import BertConfig, BertForSequenceClassification

    from attnprune.measure import count_flops
    from attnprune.research.experiments.attention_sweeps import compact_label, compact_runs
    from attnprune.research.experiments.attention_sweeps_tables import (
        compact_summary,
        format_compact_table,
    )
    from attnprune.runs.results import ResultsDir

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, num_labels=2, hidden_act="relu")).eval()
    with torch.no_grad():  # half the units never fire
        for layer in model.bert.encoder.layer:
            layer.intermediate.dense.bias[:32] = -100.0
    cfg = SweepConfig(sweep="cost", lams=(0.0, 1e-3), locations=("both",), seeds=(0,),
                      compact_thresholds=(0.0,), compact_batches=2, timing_batches=1,
                      timing_repeats=1, progress=False)
    test = _tiny_loader()
    dense_flops = sum(count_flops(lambda b=b: model(input_ids=b["input_ids"],
                                                    attention_mask=b["attention_mask"]))
                      for b in test)
    results = ResultsDir(tmp_path)
    out = compact_runs(cfg, model, _tiny_loader(8, seed=1), test, DENSE, 0, results, dense_flops)
    r = out["0"]
    assert r["label"] == compact_label(DENSE, 0.0)
    assert r["removed_fraction"] >= 0.5 and r["kept_by_layer"][0] <= 32
    assert r["flops"]["relative"] < 0.9
    assert r["time"]["relative"] > 0 and r["calibration_batches"] == 2
    assert (tmp_path / "predictions" / f"{compact_label(DENSE, 0.0)}__seed0.npz").is_file()
    # summary and table from records (dense compacted; a λ setting with a made-up record)
    test_rec = {"accuracy": 0.8, "mcc": 0.5, "n": 12, "flops": {"full_measured": dense_flops}}
    lam = {**r, "label": compact_label("cost-lam0.001-both", 0.0), "accuracy": 0.7}
    records = {(DENSE, 0): {"seed": 0, "test": test_rec, "compact": out},
               ("cost-lam0.001-both", 0): {"seed": 0, "test": test_rec, "compact": {"0": lam}}}
    s = compact_summary(cfg, records, settings(cfg))
    assert list(s) == [compact_label(DENSE, 0.0), compact_label("cost-lam0.001-both", 0.0)]
    m = s[compact_label("cost-lam0.001-both", 0.0)]
    assert m["delta_accuracy_vs_lam0"]["mean"] == pytest.approx(-0.1)
    assert m["flops_relative_to_lam0"] == pytest.approx(r["flops"]["relative"])
    cmp = [{"a": lam["label"], "b": DENSE, "metric": "accuracy", "diff": -0.1, "p": 0.01,
            "p_holm": 0.03, "ci95": [-0.2, 0.0]}]
    table = format_compact_table(cfg, records, s, cmp)
    assert "| 0.001 | both | 0 |" in table and "| 0.03 |" in table
    assert table.count("\n| ") == 4  # header, dense, two compacted rows


# ------------------------------------------------- crisp at full strength (issue 13)
@pytest.mark.parametrize("key,value", [("prune_after", "[1.5]"), ("prune_after", "[0.5, 0.5]"),
                                       ("prune_after_layer", "0"), ("mixed_precision", "fp8"),
                                       ("group_by_length", "maybe")])
def test_sweep_rejects_bad_prune_and_speed_options(key, value):
    with pytest.raises((ValueError, ConfigError), match=key):
        parse_command_line([f"--{key}", value], SweepConfig)


def test_group_by_length_loader_pads_less_and_covers_every_row():
    from attnprune.research.data.text import Split
    from attnprune.research.finetune.loaders import make_loader as _loader

    class Tok:  # whitespace "tokenizer": one id per word, padded to the batch's longest
        def __call__(self, texts, pairs, padding, truncation, max_length, return_tensors):
            ids = [[1 + len(w) for w in t.split()][:max_length] for t in texts]
            n = max(map(len, ids))
            return {"input_ids": torch.tensor([x + [0] * (n - len(x)) for x in ids]),
                    "attention_mask": torch.tensor([[1] * len(x) + [0] * (n - len(x))
                                                    for x in ids])}

    rng = np.random.default_rng(0)
    texts = [" ".join(["w"] * int(k)) for k in rng.integers(1, 60, 400)]
    split = Split(texts, np.arange(400) % 2, None)
    pads = {}
    for grouped in (False, True):
        loader = _loader(split, Tok(), 8, 64, True, 0, None, group_by_length=grouped)
        seen, padded, real = [], 0, 0
        for b in loader:
            seen += b["labels"].tolist()
            padded += b["attention_mask"].numel()
            real += int(b["attention_mask"].sum())
        assert len(seen) == 400
        pads[grouped] = padded / real
    assert pads[True] < 1.1 < pads[False]


def _tiny_bert():
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
        intermediate_size=64, num_labels=2)).eval()


def test_prune_after_runs_stack_on_crisp_and_summarise(tmp_path):
    import attnprune
    from attnprune.measure import count_flops
    from attnprune.research.experiments.attention_sweeps import prune_after_runs, prune_label
    from attnprune.research.experiments.attention_sweeps_tables import (
        format_prune_table,
        prune_summary,
    )
    from attnprune.runs.compare import load_predictions
    from attnprune.runs.results import ResultsDir

    cfg = SweepConfig(sparsities=(0.0, 0.8), schedules=("uniform",), seeds=(0, 1),
                      prune_after=(0.5,), prune_after_layer=1, progress=False)
    test = _tiny_loader()
    results = ResultsDir(tmp_path)
    records = {}
    for label, method, options, _ in settings(cfg):
        model = _tiny_bert()
        if method:
            attnprune.patch(model, method, **options)
        before = attnprune.patch_state(model)
        flops = sum(count_flops(lambda b=b, m=model: m(input_ids=b["input_ids"],
                                                        attention_mask=b["attention_mask"]))
                    for b in test)
        for seed in cfg.seeds:
            out = prune_after_runs(cfg, model, test, label, seed, results, flops)
            r = out["0.5"]
            assert r["label"] == prune_label(label, 0.5)
            assert r["kept_ratio"] < 0.9 and r["flops"]["relative"] < 0.95
            # the trained model is left as it was: a copy was pruned
            assert attnprune.patch_state(model) is before
            acc = 0.8 if label == DENSE else 0.7
            records[(label, seed)] = {"seed": seed, "test": {"accuracy": acc},
                                      "pruned": {"0.5": {**r, "accuracy": acc - 0.1 * (seed + 1)
                                                         * (label == DENSE)}}}
    assert (tmp_path / "predictions" / f"{prune_label('crisp-s0.8-uniform', 0.5)}__seed1.npz"
            ).is_file()
    s, cmp = prune_summary(cfg, records, load_predictions(tmp_path))
    m = s[prune_label("crisp-s0.8-uniform", 0.5)]
    assert m["drop_vs_unpruned"]["mean"] == pytest.approx(0.0)
    assert m["drop_minus_dense_drop"]["per_seed"] == pytest.approx([0.1, 0.2])
    assert m["delta_vs_dense_pruned"]["per_seed"] == pytest.approx([0.0, 0.1])
    assert {c["seed"] for c in cmp} == {0, 1} and all(c["b"] == prune_label(DENSE, 0.5)
                                                      for c in cmp)
    table = format_prune_table(cfg, s, cmp)
    assert table.count("\n| ") == 3 and "+0.1500 [" in table
    dense_row = next(r for r in table.splitlines() if r.startswith(f"| {DENSE} |"))
    assert dense_row.endswith("| — | — | — |")  # the reference is not compared with itself


def test_pooled_comparisons_pair_rows_within_seeds_and_keep_two_families(tmp_path):
    from attnprune.research.experiments.attention_sweeps_tables import (
        format_pooled_table,
        pooled_comparisons,
    )
    from attnprune.runs.compare import load_predictions

    cfg = SweepConfig(sparsities=(0.0, 0.8), schedules=("uniform",), seeds=(0, 1, 2),
                      prune_after=(0.5,))
    (tmp_path / "predictions").mkdir()
    y = np.array([0, 1] * 50)

    def save(label, seed, wrong):
        pred = y.copy()
        pred[wrong] = 1 - pred[wrong]
        np.savez(tmp_path / "predictions" / f"{label}__seed{seed}.npz", y_true=y, y_pred=pred)

    for seed in (0, 1):  # crisp gets 2 and 4 more rows wrong than dense; seed 2 has no crisp
        save(DENSE, seed, [0])
        save("crisp-s0.8-uniform", seed, list(range(3 + 2 * seed)))
        save("dense-prune0.5", seed, [0, 1])
        save("crisp-s0.8-uniform-prune0.5", seed, [0, 1])
    save(DENSE, 2, [])
    out = pooled_comparisons(cfg, load_predictions(tmp_path))
    by = {c["a"]: c for c in out}
    c = by["crisp-s0.8-uniform"]
    assert (c["b"], c["family"], c["seeds"], c["n"]) == (DENSE, "sweep", [0, 1], 200)
    assert c["diff"] == pytest.approx(-6 / 200)
    p = by["crisp-s0.8-uniform-prune0.5"]
    assert (p["b"], p["family"], p["diff"]) == ("dense-prune0.5", "prune", 0.0)
    assert all(x["p_holm"] >= x["p"] for x in out)
    table = format_pooled_table(out)
    assert "| sweep | crisp-s0.8-uniform | dense | 0,1 | 200 | -0.0300 [" in table


def test_multi_seed_table_lists_every_seed_and_needs_all_for_a_claim():
    from attnprune.research.experiments.attention_sweeps_tables import format_table

    cfg = SweepConfig(sparsities=(0.0, 0.8), schedules=("uniform",), seeds=(0, 1, 2))
    acc = {"mean": 0.8, "ci95": [0.79, 0.81]}
    m = {"sparsity": 0.8, "schedule": "uniform", "lam": 0.0, "location": "-", "accuracy": acc,
         "auc": None, "attention_sparsity": 0.8, "ffn_sparsity": 0.0, "entropy_bits": 1.0,
         "gini": 0.5, "flops": {"relative": 1.0, "sparse_proxy_relative": 0.9},
         "time": {"relative": 1.1}}
    methods = {DENSE: {**m, "sparsity": 0.0}, "crisp-s0.8-uniform": m}
    cmp = [{"a": "crisp-s0.8-uniform", "b": DENSE, "metric": "accuracy", "diff": d, "p": p,
            "p_holm": p * 3, "ci95": [d - 0.01, d + 0.01], "seed": s}
           for s, d, p in ((2, 0.012, 0.001), (0, 0.010, 0.001), (1, 0.011, 0.03))]
    table = format_table(cfg, methods, cmp)
    assert "+0.0110 [" in table and "| 0.001, 0.03, 0.001 | 0.003, 0.09, 0.003 |" in table
    assert "(accuracy): none;" in table  # seed 1 is not significant after Holm
    cmp[2]["p_holm"] = 0.01
    assert "(accuracy): crisp-s0.8-uniform;" in format_table(cfg, methods, cmp)


def test_tabulate_only_trains_nothing(tmp_path, capsys):
    from attnprune.research.experiments.attention_sweeps import run
    from attnprune.runs.results import ResultsDir

    (tmp_path / "predictions").mkdir()
    cfg = SweepConfig(sparsities=(0.0, 0.8), schedules=("uniform",), seeds=(0,),
                      prune_after=(0.5,), tabulate_only=True, progress=False)
    with pytest.raises(ValueError, match="tabulate_only: no finished run"):
        run(cfg, ResultsDir(tmp_path))
    assert not list(tmp_path.glob("runs/*.json"))
    assert "missing crisp-s0.8-uniform__seed0" in capsys.readouterr().out


def test_main_names_its_folder_after_the_sweep(tmp_path, capsys):
    """The command goes through runs.command.run_command with the folder name a function of
    the config (attention-<sweep>), made after the options parse and before the run."""
    from attnprune.research.experiments.attention_sweeps import main

    with pytest.raises(ValueError, match="tabulate_only: no finished run"):
        main(["--tabulate_only", "true", "--seeds", "0", "--sparsities", "0.0,0.8",
              "--schedules", "uniform", "--progress", "false", "--out", str(tmp_path)])
    assert [p.name.rsplit("-", 2)[0] for p in tmp_path.iterdir()] == ["attention-crisp"]
