"""``attnprune bench flex``: tile counting, masks and one small kernel run (no timing asserted)."""

from __future__ import annotations

import pytest
import torch

from attnprune.bench.flex import (
    BenchFlexConfig,
    crisp_eager,
    format_table,
    kernel_part,
    random_tiles,
    tile_density,
)
from attnprune.runs.config import ConfigError, parse_command_line


@pytest.mark.parametrize("key,value", [("lengths", "[1000]"), ("block", "0"),
                                       ("densities", "[1.0]"), ("sparsities", "[0]"),
                                       ("real_blocks", "[48]"), ("model", "bert")])
def test_bench_flex_rejects_bad_options(key, value):
    with pytest.raises((ValueError, ConfigError), match=key):
        parse_command_line([f"--{key}", value], BenchFlexConfig)


def test_tile_density_counts_tiles_with_any_kept_entry():
    keep = torch.zeros(2, 8, 8, dtype=torch.bool)
    keep[0, 0, 0] = True  # one entry: one of four 4×4 tiles
    keep[1] = torch.eye(8, dtype=torch.bool)  # diagonal: two of four tiles
    assert tile_density(keep, 4).tolist() == [0.25, 0.5]
    assert tile_density(keep, 1).tolist() == [1 / 64, 8 / 64]


def test_random_tiles_keep_the_diagonal_at_the_asked_density():
    t = random_tiles(3, 10, 0.3, torch.Generator().manual_seed(0))
    assert t.shape == (3, 10, 10) and t[:, range(10), range(10)].all()
    assert t.float().mean((1, 2)).tolist() == pytest.approx([0.3] * 3)


def test_crisp_eager_matches_the_library_crisp_at_s0():
    q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert torch.allclose(crisp_eager(q, k, v, 1e-9), ref, atol=1e-5)


def test_kernel_part_times_every_variant_and_flex_is_exact():
    cfg = BenchFlexConfig(lengths=(128,), heads=2, head_dim=16, block=64, densities=(0.5,),
                          sparsities=(0.9,), model="none", repeats=1, warmup=0, rounds=1)
    rows = kernel_part(cfg, progress=lambda _: None)
    names = [r["variant"] for r in rows]
    assert names == ["sdpa", "flex_dense", "flex_tiles_0.5", "crisp_eager_s0.9",
                     "crisp_flex_s0.9"]
    assert rows[1]["max_abs_err"] < 1e-4  # flex without a mask == SDPA
    assert rows[4]["max_abs_err"] < 1e-4  # crisp through flex == crisp's eager path
    assert rows[2]["tile_density"] == pytest.approx(0.5)
    assert all(r["median_ms"] > 0 for r in rows)
    table = format_table({"config": vars(cfg), "kernel": rows, "real_kernel": [],
                          "real_masks": []})
    assert table.count("\n| 128 |") == 5
