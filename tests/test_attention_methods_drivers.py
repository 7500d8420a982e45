"""The attention benchmark and sweep driver: structure and validation (no timing asserted)."""

from __future__ import annotations

import pytest

from attnprune.bench.attention import BenchAttentionConfig, format_table, run
from attnprune.config import ConfigError, parse_command_line
from attnprune.experiments.attention_sweeps import (
    DENSE,
    SweepConfig,
    settings,
    sparse_proxy_relative,
)


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
    from attnprune.experiments.attention_sweeps import (
        format_table3,
        sparse_label,
        sparse_summary,
    )

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
