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
