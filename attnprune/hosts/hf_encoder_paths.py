"""Which path a forward of the encoder token host (:mod:`attnprune.hosts.hf_encoder`) takes,
and what it may read back on it: the device's path (:func:`sync_free`), the traced one
(:func:`tracing`, :func:`exporting`), the gather widths each fixes (:func:`fixed_width`,
:func:`traced_width`) and the per-forward statistics each keeps (:func:`forward_stats`,
:class:`LazyStats`)."""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Mapping

import torch
from torch import Tensor

from attnprune.compat import exporting as compat_exporting
from attnprune.compat import size_hint

__all__ = ["PAIR_PROTECTED", "LazyStats", "clock", "exporting", "fixed_width", "forward_stats",
           "sync_free", "traced_width", "tracing", "warn_cut"]


def sync_free(device: torch.device, override: bool | None = None) -> bool:
    """Whether a forward on ``device`` takes the sync-free path: the one place the host chooses
    its path by device (``patch(..., sync_free=True/False)`` overrides it).

    * CPU (default: False): the host reads counts back freely (a CPU tensor read costs
      nanoseconds) to cut each gather to the batch's longest kept row and to split rows of
      different kept counts into groups (row bucketing, measured faster on 2 cores:
      ``docs/encoder.md``, "Where the encoder host's time goes").
    * Any other device (CUDA, MPS, …) (default: True): reading a number back waits for every
      queued kernel, and each extra launch costs microseconds, as much as a small layer's work.
      So the forward never reads the device: a fixed-ratio method's gather width is
      W = min(K, max(⌊ρ·K⌋, 4)) from the batch's padded width K alone (every row keeps
      ⌊ρ·n_b⌋ ≤ W tokens; shorter rows are padded, with a mask), one top-k and one batched
      gather per pruning layer, no row groups, the per-layer counts kept as device tensors
      until ``stats`` is read, and the scorer's attention in few large pieces. A threshold
      method (``variable_budget``: LTP, entropy_threshold, DTR, hybrid) reads its largest kept
      count back once per pruning layer (one sync each: its width is data, and a width fixed
      in advance would either cut kept tokens or keep all of them).
    * Traced (``torch.compile``): the same path, without statistics or timers (nothing may
      leave the graph); ``torch.export`` / ONNX keep data-dependent widths
      (:func:`traced_width`), so an exported graph keeps exactly the eager forward's tokens.

    W ≥ 4 holds a sentence pair's CLS and separators ([CLS] a [SEP] b [SEP]; RoBERTa's
    <s> a </s></s> b </s>), so both paths keep the same tokens on single texts and pairs. Only
    a row with more protected tokens than W (separators written inside a text, three or more
    segments, and ⌊ρ·K⌋ below their count) keeps its first W of them on this path, where the
    CPU path keeps them all: counting them would read the device.
    """
    if tracing():
        return True
    if override is not None:
        return override
    return device.type != "cpu"


# The most protected tokens (CLS and separators) of a standard input: a RoBERTa pair's
# <s> a </s></s> b </s> (a BERT pair has 3, a single text 2). The sync-free gather is never
# narrower, so it keeps them all, as the CPU path does (:func:`sync_free`).
PAIR_PROTECTED = 4


def fixed_width(width: int, rho: float, floor: int = 0) -> int:
    """W = min(K, max(⌊ρ·K⌋, PAIR_PROTECTED, min_tokens − 1)): the gather width of a fixed-ratio method from
    the padded width K alone (:func:`sync_free`). ⌊ρ·n_b⌋ ≤ ⌊ρ·K⌋ for every row (n_b ≤ K real
    tokens); at least 4 so a pair's CLS and separators fit (kept by every selection, however
    small ⌊ρ·n_b⌋: the CPU path keeps them all); a row under the short-input floor
    (``floor`` = ``min_tokens``) keeps its n_b ≤ floor − 1 tokens; the 1e-9 is ``selection.budget``'s guard
    against float error (0.7·10 = 6.999…)."""
    return min(width, max(math.floor(width * rho + 1e-9), PAIR_PROTECTED, floor - 1))


def clock(run) -> float:
    """perf_counter for the host's own timers; 0 when traced (a timer would break the graph)."""
    return 0.0 if run.static else time.perf_counter()


class LazyStats(Mapping):
    """The last forward's statistics, whose counts stayed on the device (sync-free path):
    converted to numbers the first time ``stats`` is read, so the forward itself never
    waits for the device. A read-only mapping (``dict(stats)`` for a plain dict, e.g. to
    write it as JSON: a dict subclass would let ``json.dumps`` see it empty)."""

    def __init__(self, make) -> None:
        self._make = make
        self._data: dict | None = None

    def _fill(self) -> dict:
        if self._data is None:
            self._data, self._make = self._make(), None
        return self._data

    def __getitem__(self, key):
        return self._fill()[key]

    def __iter__(self):
        return iter(self._fill())

    def __len__(self) -> int:
        return len(self._fill())

    def __repr__(self) -> str:
        return f"LazyStats({self._fill()!r})"

    def __reduce__(self):  # a copy or pickle of the stats holds the numbers
        return (dict, (dict(self._fill()),))


def forward_stats(kept: list, padded: list, real, n: int, times: dict | None,
           cut: list | None = None) -> dict:
    """The ``stats`` dict from per-layer counts (numbers or device tensors)."""
    kept = [float(k) for k in kept]
    real = int(real)
    out = {"real_tokens": real, "kept_per_layer": kept, "padded_per_layer": [int(p) for p in padded],
           "kept_ratio": sum(kept) / max(n * real, 1)}
    if cut is not None:  # the sync-free path: protected tokens its fixed width left out
        out["protected_cut"] = int(sum(int(c) for c in cut))
    out.update(times or {})
    return out


def warn_cut(state, stats: dict) -> dict:
    """Once per patch, when the stats of a sync-free forward are read: a row had more
    protected tokens (CLS, separators, ``protect_token_ids``) than the fixed gather width
    ⌊ρ·K⌋ (at least ``PAIR_PROTECTED``) holds, so that path dropped some the CPU path keeps.
    Knowing it during the forward would mean reading the device, which that path never does."""
    if stats.get("protected_cut", 0) > 0 and not getattr(state, "_warned_cut", False):
        state._warned_cut = True
        warnings.warn(
            f"sync-free path: {stats['protected_cut']} protected token(s) (CLS, separators, "
            f"protect_token_ids) did not fit the fixed gather width max(floor(keep_ratio*K), "
            f"{PAIR_PROTECTED}) and were dropped, where the CPU path keeps them; raise "
            f"keep_ratio, protect fewer ids, or patch with sync_free=False", stacklevel=2)
    return stats


def tracing() -> bool:
    """True while torch.export / torch.compile / the TorchScript tracer records the forward.

    Python must not branch on values there: the loop skips the per-forward statistics, timers
    and row bucketing (counts read back from tensors) and sizes every gather from shapes
    (:func:`fixed_width`) or, exporting, by :func:`traced_width` (a symbolic size)."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing()


def exporting() -> bool:
    """torch.export / ONNX (dynamo) / the TorchScript tracer: graphs meant to run without
    Python, whose gathers keep the eager forward's exact widths (:func:`traced_width`).

    torch.export's own flag (:func:`attnprune.compat.exporting`: the module attribute
    ``torch.compiler._is_exporting_flag``, set for the whole trace, strict and non-strict, so
    ONNX's dynamo exporter too), not ``torch.compiler.is_exporting()``: up to torch 2.11 dynamo
    answers a traced ``is_exporting()`` with a constant True inside any compiled function
    (pytorch#176347, fixed by #176499), which took the export path's ``.item()`` under plain
    ``torch.compile``: graph breaks, host syncs, split CUDA graphs. Dynamo reads a module
    attribute as it is (a guarded constant), so the flag is False under torch.compile and True
    under torch.export on every torch (tests/test_export_flag.py)."""
    return torch.jit.is_tracing() or compat_exporting()


def traced_width(keep: Tensor):
    """The gather width K of an exported forward: the batch's largest kept count (CLS and
    separators included), as a data-dependent size, at least 2.

    ``.item()`` under torch.export gives an unbacked SymInt, which ONNX carries as a tensor
    (the Slice that cuts the sorted positions), so the graph keeps exactly the tokens the eager
    forward keeps, for fixed budgets and thresholds alike. At least 2 because HF's SDPA call
    branches on ``q_length > 1``, a guard an unbacked size cannot answer; a batch whose rows
    all keep one token gets one padding slot, masked like any other."""
    width = keep.shape[1]
    k = keep.sum(1).max().clamp(2, width).item()
    size_hint(k >= 2)
    size_hint(k <= width)
    return k
