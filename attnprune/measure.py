"""Measured cost: FLOPs counted by torch, wall time by one timing function, peak memory.

* FLOPs: ``torch.utils.flop_counter.FlopCounterMode`` with the CPU SDPA gap filled: torch
  2.13 does not count ``aten._scaled_dot_product_flash_attention_for_cpu`` (REFERENCE_VALUES.md),
  so :func:`count_flops` passes a ``custom_mapping`` for it (and its backward) that reuses
  torch's own ``sdpa_flop_count`` formulas, and turns off the fused MultiheadAttention fast path
  that the counter cannot see. Units: FLOPs (2 per multiply-add), as FlopCounterMode reports.
* Wall time: :func:`time_fn` — warm-up runs discarded, then median and MAD of repeats, with the
  thread count recorded. Every benchmark and plot in the project uses it.

Written by hand because no library does this for torch on CPU with the SDPA fix; the formulas
themselves are torch's.
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import time
import tracemalloc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch.utils import flop_counter as fc

from attnprune.compat import cpu_flash_attention_ops

__all__ = ["Timing", "count_flops", "effective_flops", "env_info", "peak_memory", "time_fn", "time_interleaved"]


def _sdpa_cpu_mapping() -> dict:
    """custom_mapping entries for the CPU flash-attention op torch's counter skips."""
    mapping: dict = {}
    fwd, bwd = cpu_flash_attention_ops()
    if fwd is not None:

        def fwd_flops(query, key, value, *args, out_shape=None, **kwargs) -> int:
            return fc.sdpa_flop_count(query, key, value)

        mapping[fwd] = fwd_flops  # FlopCounterMode applies shape_wrapper itself
    if bwd is not None:

        def bwd_flops(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
            return fc.sdpa_backward_flop_count(grad_out, query, key, value)

        mapping[bwd] = bwd_flops
    return mapping


@contextlib.contextmanager
def _no_mha_fastpath():
    prev = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(prev)


def count_flops(fn: Callable[..., Any], *args, by_module: bool = False, **kwargs):
    """Run ``fn(*args, **kwargs)`` once under FlopCounterMode (with the CPU SDPA fix).

    Returns the total FLOPs (int), or ``(total, per_module_dict)`` with ``by_module=True``.
    Causal attention is not halved by the counter (it counts the full score matrix).
    """
    mode = fc.FlopCounterMode(display=False, custom_mapping=_sdpa_cpu_mapping())
    with _no_mha_fastpath(), mode:
        fn(*args, **kwargs)
    total = int(mode.get_total_flops())
    if not by_module:
        return total
    per = {name: int(sum(d.values())) for name, d in mode.get_flop_counts().items()}
    return total, per


def effective_flops(per_layer: Sequence[float], kept_ratio: Sequence[float],
                    total: float | None = None) -> float:
    """Effective FLOPs (``token_pruning_bert_to_gpt2.txt``): Σ_l FLOPs_l · kept_ratio_l.

    ``per_layer``: the full model's FLOPs of each layer (block); ``kept_ratio``: the fraction
    of tokens each layer computes. With ``total`` (the full model's FLOPs), the layers' part of
    it is replaced by their effective FLOPs (embeddings and head are never pruned):
    total − Σ_l FLOPs_l + Σ_l FLOPs_l · kept_ratio_l.
    """
    if len(per_layer) != len(kept_ratio):
        raise ValueError(f"kept_ratio has {len(kept_ratio)} entries for {len(per_layer)} "
                         "layers in per_layer")
    layers = sum(f * k for f, k in zip(per_layer, kept_ratio))
    return layers if total is None else total - sum(per_layer) + layers


@dataclass(frozen=True)
class Timing:
    median_s: float
    mad_s: float
    repeats: int
    warmup: int
    threads: int
    times_s: tuple[float, ...]
    device: str = "cpu"  # what ran: "cpu", or the accelerator synchronised around each call

    def as_dict(self) -> dict:
        d = asdict(self)
        d["times_s"] = list(self.times_s)
        return d


def accelerator() -> str | None:
    """The accelerator this process has started using ("cuda", "mps"), or None (CPU only).

    "Started": CUDA initialised (a tensor or model was moved there). A process that never
    touched the GPU times CPU work and needs no synchronisation."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return "cuda"
    if torch.backends.mps.is_available() and torch.mps.current_allocated_memory() > 0:
        return "mps"
    return None


def synchronize(device: str | None = None) -> None:
    """Wait for the accelerator's queued work (nothing on the CPU). Kernels run
    asynchronously: without this, a timer around a GPU forward measures the launches only
    (an 8192² matmul timed at 24 µs)."""
    device = accelerator() if device is None else device
    if device == "cuda":
        torch.cuda.synchronize()
    elif device == "mps":
        torch.mps.synchronize()


def _device_label(device: str | None) -> str:
    if device == "cuda":
        return f"cuda ({torch.cuda.get_device_name()})"
    return device or "cpu"


def time_fn(fn: Callable[[], Any], repeats: int = 10, warmup: int = 2) -> Timing:
    """Time ``fn()``: ``warmup`` runs discarded, then median and MAD of ``repeats`` runs.

    MAD is the median absolute deviation from the median (unscaled). Call it for the full
    model and the pruned model in the same process, and report their ratio. On an
    accelerator (:func:`accelerator`) the device is synchronised before the clock starts
    and before it stops, so each time covers the work, not its launch.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be ≥ 1, got {repeats}")
    if warmup < 0:
        raise ValueError(f"warmup must be ≥ 0, got {warmup}")
    device = accelerator()
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    mad = statistics.median(abs(t - med) for t in times)
    return Timing(med, mad, repeats, warmup, torch.get_num_threads(), tuple(times),
                  _device_label(device))


def time_interleaved(fns: Mapping[str, Callable[[], Any]], repeats: int = 10,
                     warmup: int = 2,
                     clock: Callable[[], float] = time.perf_counter,
                     cuda_events: bool = False) -> dict[str, Timing]:
    """Time several callables round-robin: ``warmup`` discarded calls of each, then ``repeats``
    rounds in which each is called once (the order rotates every round), so a burst of load
    from elsewhere or a drift of the clock hits all of them alike. Returns a :class:`Timing`
    per name; compare them by the ratio of their medians. ``clock``: wall time by default;
    ``time.process_time`` counts this process's CPU time instead, which on an oversubscribed
    machine leaves out the time spent waiting for a core (meaningful with one thread).

    On an accelerator (:func:`accelerator`) each call is bracketed by device synchronisation.
    ``cuda_events``: on CUDA, time each call by two CUDA events recorded on the current stream
    around it (the GPU's clock, from the call's first queued kernel to its last), read after
    the synchronisation; without CUDA the clock is used, and ``Timing.device`` says which.

    Written here because timing libraries (``timeit``, ``torch.utils.benchmark``) time one
    statement at a time, which puts each candidate in a different stretch of a noisy machine.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be ≥ 1, got {repeats}")
    if warmup < 0:
        raise ValueError(f"warmup must be ≥ 0, got {warmup}")
    names = list(fns)
    device = accelerator()
    for name in names:
        for _ in range(warmup):
            fns[name]()
    events = cuda_events and device == "cuda"
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        for i in range(len(names)):
            name = names[(i + r) % len(names)]
            synchronize(device)
            if events:
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fns[name]()
                stop.record()
                synchronize(device)
                times[name].append(start.elapsed_time(stop) / 1e3)  # ms → s
                continue
            t0 = clock()
            fns[name]()
            synchronize(device)
            times[name].append(clock() - t0)
    label = _device_label(device) + (", CUDA events" if events else "")
    out = {}
    for name, t in times.items():
        med = statistics.median(t)
        mad = statistics.median(abs(v - med) for v in t)
        out[name] = Timing(med, mad, repeats, warmup, torch.get_num_threads(), tuple(t), label)
    return out


def peak_memory(fn: Callable[[], Any], interval_s: float = 2e-4) -> int:
    """Peak growth of the process's resident memory (bytes) while ``fn()`` runs.

    A background thread samples RSS (psutil) every ``interval_s`` seconds and the result is the
    largest sample minus the RSS before the call, or tracemalloc's peak of Python allocations if
    that is larger. Unlike ``ru_maxrss`` (a high-water mark for the whole process life), this
    works for several calls in one process. Torch's CPU allocator returns large blocks to the
    OS on free, so successive calls are comparable; very short peaks can fall between samples.
    If the caller is already tracing with tracemalloc, it keeps tracing (its peak is reset).
    """
    import threading

    import psutil

    proc = psutil.Process()
    gc.collect()
    base = proc.memory_info().rss
    peak = base
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, proc.memory_info().rss)
            done.wait(interval_s)

    thread = threading.Thread(target=sample, daemon=True)
    # A caller's own tracing stays on (its peak is reset: read relative to the traced size
    # now); otherwise trace for this call only.
    mine = not tracemalloc.is_tracing()
    if mine:
        tracemalloc.start()
    else:
        tracemalloc.reset_peak()
    py_base = tracemalloc.get_traced_memory()[0]
    thread.start()
    try:
        fn()
        peak = max(peak, proc.memory_info().rss)
        py_peak = tracemalloc.get_traced_memory()[1] - py_base
    finally:
        done.set()
        thread.join()
        if mine:
            tracemalloc.stop()
    return int(max(peak - base, py_peak, 0))


def env_info(device: str | torch.device | None = None, dtype: str | torch.dtype | None = None) -> dict:
    """The environment block of ``summary.json``: versions, threads, and the device (and
    dtype, when given) that ran. ``device`` None: the accelerator this process used
    (:func:`accelerator`), else "cpu"; a CUDA device is named with its card."""
    import platform

    import transformers

    dev = str(device) if device is not None else (accelerator() or "cpu")
    info = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "device": dev,
        "python": platform.python_version(),
    }
    if dev.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    if dtype is not None:
        info["dtype"] = str(dtype).removeprefix("torch.")
    return info
