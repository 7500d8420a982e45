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
    bench would time eager code and call it compiled) while the run lasts, and only then
    (``recompile_limit``: torch 2.13's ``cache_size_limit`` is an alias that
    ``monkeypatch.undo`` leaves hidden, issue 48)."""
    import torch
    import torch._dynamo

    from attnprune.bench import gpu

    seen = {}

    def compile_(fn, mode=None, dynamic=None):
        seen.update(mode=mode, dynamic=dynamic)
        return fn

    monkeypatch.setattr(torch, "compile", compile_)
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 8)
    fn = object()
    assert gpu._maybe_compile(fn, BenchGPUConfig()) is fn  # compile off: untouched
    assert "mode" not in seen
    with gpu._compile_room(BenchGPUConfig()):
        assert torch._dynamo.config.recompile_limit == 8
    cfg = BenchGPUConfig(compile=True, compile_mode="reduce-overhead")
    gpu._maybe_compile(fn, cfg)
    assert seen == {"mode": "reduce-overhead", "dynamic": False}  # one graph per shape
    with gpu._compile_room(cfg):
        assert torch._dynamo.config.recompile_limit >= 64
    assert torch._dynamo.config.recompile_limit == 8  # put back


# -- the headline grid's options (issue 30): cells in order, deadline, timer, profile ---------------
TINY = ["--device", "cpu", "--dtype", "fp32", "--models", "[tiny]", "--decoders", "[]",
        "--keep-ratios", "[0.5]", "--repeats", "1", "--warmup", "0", "--exact-out"]


def _summary(path):
    import json

    return json.loads((path / "summary.json").read_text())


def test_cells_run_in_the_order_given_with_tokens_per_s(tmp_path):
    assert main([*TINY, "--cells", "[2x16,1x24]", "--out", str(tmp_path)]) == 0
    rows = _summary(tmp_path)["rows"]
    assert [(r["B"], r["T"]) for r in rows if r["point"] == "full"] == [(2, 16), (1, 24)]
    for r in rows:
        if r["ms"] is not None:
            assert r["tokens_per_s"] == pytest.approx(r["B"] * r["T"] / (r["ms"] / 1e3))
            assert r["device"] == "cpu" and "compile_s" not in r
    assert {r["point"] for r in rows} == {"full", "mean@0.5/L1", "layers=2", "int8"}
    md = (tmp_path / "table.md").read_text()
    assert "| full tokens/s |" in md and "| tiny | 2 × 16 |" in md


def test_the_deadline_skips_the_cells_it_cannot_hold_with_a_note(tmp_path, monkeypatch):
    """Time left: 100 s before the first cell, then 0.5 s: the first cell runs, the second is
    written as skipped (a note, no time), and the JSON holds both."""
    from attnprune.bench import gpu

    left = iter([100.0, 0.5])
    monkeypatch.setattr(gpu._Deadline, "left", lambda self: next(left))
    assert main([*TINY, "--cells", "[1x16,2x16]", "--deadline-s", "60", "--out",
                 str(tmp_path)]) == 0
    rows = _summary(tmp_path)["rows"]
    assert any(r["ms"] is not None for r in rows if r["B"] == 1)
    skipped = [r for r in rows if r["B"] == 2]
    assert len(skipped) == 1 and skipped[0]["ms"] is None
    assert skipped[0]["note"].startswith("skipped: deadline")
    assert "skipped: deadline" in (tmp_path / "table.md").read_text()


def test_a_point_that_fails_is_noted_and_the_others_are_timed(tmp_path, monkeypatch):
    """A point whose first call raises (a kernel missing for int8, a compile error) must not
    end the grid: its row carries the error, the rest are timed."""
    from attnprune.bench import gpu

    def maybe_compile(m, cfg):
        if len(m.encoder.layer) == 2:  # the shallow copy
            def broken(**kw):
                raise RuntimeError("no kernel for this")
            return broken
        return m

    monkeypatch.setattr(gpu, "_maybe_compile", maybe_compile)
    assert main([*TINY, "--cells", "[1x16]", "--out", str(tmp_path)]) == 0
    rows = {r["point"]: r for r in _summary(tmp_path)["rows"]}
    assert rows["layers=2"]["ms"] is None
    assert rows["layers=2"]["note"] == "failed: RuntimeError: no kernel for this"
    assert rows["full"]["ms"] > 0 and rows["mean@0.5/L1"]["ms"] > 0


def test_compiled_cells_record_compile_time_and_reset_between_cells(tmp_path, monkeypatch):
    """compile=true: each point's first call is recorded (compile_s), dynamo is reset after
    each cell (its graphs freed), and under CUDA graphs each call marks a new step; without
    those torch.compiler functions (an older torch) the bench still runs."""
    import torch
    import torch._dynamo

    from attnprune.bench import gpu

    calls = {"reset": 0, "step": 0}
    limits = []
    before = torch._dynamo.config.recompile_limit

    def compile_(fn, mode=None, dynamic=None):
        limits.append(torch._dynamo.config.recompile_limit)
        return fn

    monkeypatch.setattr(torch, "compile", compile_)
    monkeypatch.setattr(torch.compiler, "reset", lambda: calls.__setitem__("reset", calls["reset"] + 1))
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin",
                        lambda: calls.__setitem__("step", calls["step"] + 1))
    assert main([*TINY, "--compile", "true", "--compile-mode", "reduce-overhead", "--cells",
                 "[1x16,2x16]", "--out", str(tmp_path / "a")]) == 0
    rows = [r for r in _summary(tmp_path / "a")["rows"] if r["ms"] is not None]
    assert rows and all(r["compile_s"] > 0 for r in rows)
    assert calls["reset"] == 2 and calls["step"] >= 2 * 4  # ≥ one call per point and cell
    assert limits and min(limits) >= 64  # room for every graph while the run lasts,
    assert torch._dynamo.config.recompile_limit == before  # and dynamo's limit put back after
    monkeypatch.delattr(torch.compiler, "reset")
    monkeypatch.delattr(torch.compiler, "cudagraph_mark_step_begin")
    assert gpu._step(lambda: 7, graphs=True)() == 7
    assert main([*TINY, "--compile", "true", "--compile-mode", "reduce-overhead", "--cells",
                 "[1x16]", "--out", str(tmp_path / "b")]) == 0


def test_profile_writes_the_top_ops_of_each_point(tmp_path):
    assert main([*TINY, "--cells", "[2x16]", "--profile", "true", "--profile-rows", "5",
                 "--profile-repeats", "1", "--out", str(tmp_path)]) == 0
    rows = [r for r in _summary(tmp_path)["rows"] if "profile" in r]
    assert {r["point"] for r in rows} == {"full", "mean@0.5/L1", "layers=2", "int8"}
    for r in rows:
        p = r["profile"]
        assert 1 <= len(p["top"]) <= 5 and p["per_forward_ms"] > 0
        assert p["sort_by"] == "self_cpu_time_total" and p["ops_or_kernels_per_forward"] > 0
        assert all(t["op"] and t["self_ms"] >= 0 for t in p["top"])
    text = (tmp_path / "profile.txt").read_text()
    assert "== tiny 2 × 16 full:" in text and "== tiny 2 × 16 mean@0.5/L1:" in text


def test_the_packaged_minilm_notes_lengths_past_its_positions(tmp_path):
    assert main([*TINY, "--models", "[minilm-l6]", "--cells", "[1x600]", "--out",
                 str(tmp_path)]) == 0
    s = _summary(tmp_path)
    assert all(r["ms"] is None and "512 positions" in r["note"] for r in s["rows"])
    assert "weights" in s["models"]["minilm-l6"]


def test_quick_keeps_the_order_of_explicit_cells_shrunk():
    from attnprune.bench.gpu import cell_list, resolve

    cfg = resolve(BenchGPUConfig(device="cpu", quick=True, cells=("32x512", "1x512", "8x2048"),
                                 models=("bert-base", "minilm-l6"), decoders=()))
    assert cell_list(cfg) == [(4, 64), (1, 64)]
    assert cfg.models == ("tiny", "minilm-l6") and cfg.decoders == ()


@pytest.mark.parametrize(("option", "value", "field"), [
    ("--cells", "[32by512]", "cells"), ("--cells", "[0x512]", "cells"),
    ("--timer", "gpu", "timer"), ("--deadline-s", "-1", "deadline_s"),
    ("--profile-rows", "0", "profile_rows"), ("--models", "[minilm-l7]", "models")])
def test_bad_grid_options_name_the_field(tmp_path, option, value, field):
    with pytest.raises(ValueError, match=field):
        main([*TINY, option, value, "--out", str(tmp_path)])
    assert not (tmp_path / "summary.json").exists()


def test_a_models_first_cell_is_expected_to_take_the_longest_cell_so_far(tmp_path, monkeypatch):
    """A clock that moves 10 s a reading: the tiny model's cell takes "10 s"; with 5 s left,
    the next model's first cell (no history of its own) must be skipped, not started."""
    import time as real_time
    import types

    from attnprune.bench import gpu

    ticks = iter(range(0, 10_000, 10))
    monkeypatch.setattr(gpu, "time", types.SimpleNamespace(
        monotonic=lambda: next(ticks), perf_counter=real_time.perf_counter))
    left = iter([100.0, 5.0])
    monkeypatch.setattr(gpu._Deadline, "left", lambda self: next(left))
    assert main([*TINY, "--models", "[tiny,minilm]", "--cells", "[1x16]", "--deadline-s", "60",
                 "--out", str(tmp_path)]) == 0
    rows = _summary(tmp_path)["rows"]
    assert all(r["ms"] is not None for r in rows if r["model"] == "tiny" and r["point"] != "int8")
    (skipped,) = [r for r in rows if r["model"] == "minilm"]
    assert skipped["note"] == "skipped: deadline (5 s left, a cell takes ≈ 10 s)"


def test_cudagraphs_mode_captures_every_point_and_notes_what_it_cannot(tmp_path, monkeypatch):
    """cudagraphs=true (issue 46, item 3): on the CPU the capture path runs with the eager
    stand-in and every row says so; each point's first call (warm-up and capture) is
    ``capture_s``; every point's graph is dropped after its cell; a point whose forward cannot
    be captured (here the half-depth model patched with a threshold method, which reads its
    kept count back) is a row naming the cause, and the others are timed."""
    from attnprune import api
    from attnprune.bench import gpu
    from attnprune.deploy import compiled

    resets = []
    real_reset = compiled.CUDAGraphRunner.reset
    monkeypatch.setattr(compiled.CUDAGraphRunner, "reset",
                        lambda self: (resets.append(len(self.graphs)), real_reset(self)))
    real_shallow = gpu._shallow
    monkeypatch.setattr(gpu, "_shallow",
                        lambda m, n: api.patch(real_shallow(m, n), "ltp", keep_ratio=0.5))
    assert main([*TINY, "--cudagraphs", "true", "--cells", "[2x16,1x24]", "--out",
                 str(tmp_path)]) == 0
    rows = _summary(tmp_path)["rows"]
    timed = [r for r in rows if r["ms"] is not None]
    assert {r["point"] for r in timed} == {"full", "mean@0.5/L1", "int8"}
    assert len(timed) == 6
    for r in timed:
        assert r["capture_s"] > 0 and "compile_s" not in r
        assert r["note"].startswith("dry run: no CUDA graph")
    (failed, _) = [r for r in rows if r["point"] == "layers=2"]
    assert failed["ms"] is None
    assert "'ltp' decides its kept count" in failed["note"] and "CUDA graph" in failed["note"]
    assert resets == [1] * 6  # every captured point's graph dropped after its cell
    assert _summary(tmp_path)["config"]["cudagraphs"] is True


def test_cudagraphs_and_compile_are_one_mode_a_run():
    with pytest.raises(ValueError, match="cudagraphs"):
        BenchGPUConfig(compile=True, cudagraphs=True)
