"""``attnprune bench gpu``: the dry run on the CPU (the GPU script's own smoke test)."""

from __future__ import annotations

import pytest

from attnprune.bench.gpu import BenchGPUConfig, main


def test_bench_gpu_dry_run_writes_every_point(tmp_path, capsys):
    assert main(["--device", "cpu", "--dtype", "fp32", "--quick", "true",
                 "--out", str(tmp_path), "--exact-out"]) == 0
    out = capsys.readouterr().out
    import json

    summary = json.loads((tmp_path / "summary.json").read_text())
    points = {r["point"] for r in summary["rows"]}
    assert {"full", "mean@0.25/L1", "mean@0.5/L1", "layers=2", "int8", "prefill full",
            "prefill fastv@0.25"} <= points
    assert summary["env"]["device"] == "cpu" and summary["env"]["dtype"] == "float32"
    assert all(r["relative"] > 0 for r in summary["rows"] if r["ms"] is not None)
    assert "| model | B × T |" in out and (tmp_path / "bench_gpu.png").is_file()


def test_bench_gpu_options_are_checked():
    with pytest.raises(ValueError, match="dtype"):
        BenchGPUConfig(dtype="int4")
    with pytest.raises(ValueError, match="models"):
        BenchGPUConfig(models=("gpt-5",))
    with pytest.raises(ValueError, match="keep_ratios"):
        BenchGPUConfig(keep_ratios=(1.5,))
    with pytest.raises(ValueError, match="compile_mode"):
        BenchGPUConfig(compile_mode="fast")


def test_compiled_bench_uses_the_mode_and_room_for_every_graph(monkeypatch):
    """``compile_mode`` reaches torch.compile ("reduce-overhead": CUDA graphs), and dynamo's
    cache has room for every model × shape graph of the one forward (past its default 8 the
    bench would time eager code and call it compiled)."""
    import torch
    import torch._dynamo

    from attnprune.bench import gpu

    seen = {}
    monkeypatch.setattr(torch, "compile", lambda fn, mode=None: seen.setdefault("mode", mode) and fn)
    monkeypatch.setattr(torch._dynamo.config, "cache_size_limit", 8)
    fn = object()
    assert gpu._maybe_compile(fn, BenchGPUConfig()) is fn  # compile off: untouched
    assert "mode" not in seen
    gpu._maybe_compile(fn, BenchGPUConfig(compile=True, compile_mode="reduce-overhead"))
    assert seen["mode"] == "reduce-overhead"
    assert torch._dynamo.config.cache_size_limit >= 64
