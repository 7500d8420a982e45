"""Sparse FFN execution: FFN units that are off in a whole block of tokens skip the second
projection.

The cost incentive (``methods/cost.py``, ``compute_cost_incentive_ocr_zh.txt`` eq. 2) pushes
FFN pre-activations z = W1x + b1 below 0. A dense kernel still multiplies the zeros, so the
FLOPs do not fall (issue 13). Here the second projection y = W2 a + b2 runs on the active
units only, per block of token rows:

    a       the FFN activation, one row per token: (N, d_ff), N = B·T (padding rows included)
    τ       ``threshold``; entry a_ij counts as zero when
            ``mode="relu"``:      a_ij ≤ τ   (τ = 0 and a GELU FFN: exactly z_ij ≤ 0, since
                                              GELU(z) ≤ 0 ⟺ z ≤ 0 — the units eq. 2's ReLU
                                              penalty pushes off)
            ``mode="magnitude"``: |a_ij| ≤ τ (TEAL's rule; τ = 0: only exact zeros)
    block   rows per block R; J_R = units with an entry that does not count as zero in some
            row of R
    y_R     = a[R, J_R] · W2ᵀ[J_R] + b2 — one dense matmul on an index_select of W2ᵀ's rows

Units in J_R keep their exact values, so the only change to the dense FFN is the skipped
units: none with a ReLU FFN and τ = 0 (the result equals dense; only the summation order
differs); with GELU, Σ_j GELU(z_j)·W2[:, j] over units whose z ≤ 0 in every row of the block
(|GELU(z)| ≤ 0.17 there), whose accuracy effect is measured (``experiments/attention_sweeps.py``).

Why per block and not per token: the price of a skip is the copy of W2ᵀ's k active rows (k·d
floats) per block, which a block of b rows amortises over b·k·d multiply-adds; per token the
copy costs as much as the product. The price of a block is the union: a unit is skipped only
if every row of the block leaves it off, so the skipped share (*block sparsity*) equals the
per-token sparsity only when the same units are off in every token (dead units), and falls
towards 0 when tokens switch units off independently (measured: ``attnprune bench sparse-ffn``,
patterns ``units`` and ``tokens``). ``max_active`` is the break-even: a block whose active share
is above it runs dense (copying W2ᵀ's rows would cost more than the skipped work saves).

Per-token sparsity on CPU without a fused kernel was measured too and does not pay at MiniLM
shapes (N = 2048, d_ff = 1536 → d = 384, 1 thread, 13 % active): the product itself as an
``embedding_bag`` with per-sample weights (a sparse × dense kernel) took 0.66× the dense matmul,
but extracting the active indices and values (mask, nonzero, masked_select) took 1.5× it, and
``Tensor.to_sparse_csr`` alone 1.3×; ``torch.sparse.addmm`` with the conversion 1.9×.

What actually runs is counted: ``measure.count_flops`` sees the smaller ``addmm`` of each
block, so counted FLOPs fall with the block sparsity (index_select is memory traffic, 0
FLOPs). The first projection still runs densely: skipping it needs a predictor of the active
units (Deja Vu, TEAL), not built here.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from attnprune.compat import tensor_version

__all__ = [
    "MODES",
    "SparseFFNOutput",
    "apply",
    "block_reference",
    "block_sparse_linear",
    "remove",
    "reset_stats",
    "stats",
]

MODES = ("relu", "magnitude")
# FFN first layer (cost.py's hook point) → the second projection beside it, per family
SECOND = {"intermediate.dense": "output.dense", "ffn.lin1": "ffn.lin2", "mlp.c_fc": "mlp.c_proj",
          "mlp.fc1": "mlp.fc2", "mlp.up_proj": "mlp.down_proj"}
GATED = ("mlp.up_proj",)  # the second projection's input is act(gate)·up: its sign is no ReLU's
# Break-even active share at MiniLM shapes (N = 2048 rows, d_ff = 1536 → d = 384, 1 thread):
# ``attnprune bench sparse-ffn`` measured the sparse path at time ratio ≈ 1 (vs the dense
# matmul) at ≈ 50 % active units with blocks of 256 rows (≈ 40 % with 64, ≈ 60 % with 2048).
DEFAULT_MAX_ACTIVE = 0.5
DEFAULT_BLOCK = 256


def _row_max(x: Tensor, mode: str) -> Tensor:
    """(m, g, d) → (m, d): the largest value (``relu``) or magnitude of every g rows."""
    hi = x.amax(1)
    return hi if mode == "relu" else torch.maximum(hi, -x.amin(1))  # aminmax: 30× slower here


def active_units(a: Tensor, block: int, threshold: float, mode: str) -> Tensor:
    """(⌈N / block⌉, d_ff) boolean: unit j is active in block r iff some row of r has a value
    that does not count as zero — a max over rows, not a boolean pass over every entry.

    Two levels: maxima over g = gcd(block, 64) rows, then over the block's N/g partials. Torch's
    reduction over the middle axis of (m, g, d) has cliffs: for N = 2048, d = 1536 on this CPU
    g = 64 took 0.9 ms, g = 256 … 1024 21–27 ms and one (1, 2048, d) block 24 ms."""
    n, d_ff = a.shape
    g = math.gcd(block, 64)
    full = n // g
    parts = [_row_max(a[: full * g].view(full, g, d_ff), mode)] if full else []
    if n > full * g:
        parts.append(_row_max(a[full * g:][None], mode))
    part = torch.cat(parts) if len(parts) > 1 else parts[0]  # (⌈N / g⌉, d_ff)
    per, m = block // g, part.shape[0]
    fullb = m // per
    tops = [part[: fullb * per].view(fullb, per, d_ff).amax(1)] if fullb else []
    if m > fullb * per:
        tops.append(part[fullb * per:].amax(0, keepdim=True))
    return (torch.cat(tops) if len(tops) > 1 else tops[0]) > threshold


def zero_count(a: Tensor, threshold: float, mode: str) -> int:
    """Number of entries of ``a`` that count as zero."""
    off = a <= threshold if mode == "relu" else a.abs() <= threshold
    return int(torch.count_nonzero(off))


def block_reference(a: Tensor, block: int, threshold: float, mode: str) -> Tensor:
    """``a`` with, per block of rows, the units that count as zero in every row of the block set
    to 0 — what :func:`block_sparse_linear` multiplies (a readable reference for tests)."""
    act = active_units(a, block, threshold, mode)  # (n_blocks, d_ff)
    keep = act.repeat_interleave(block, dim=0)[: a.shape[0]]
    return a * keep


@torch.no_grad()  # an inference kernel: addmm(out=...) has no autograd
def block_sparse_linear(a: Tensor, weight_t: Tensor, bias: Tensor | None, block: int,
                        threshold: float = 0.0, mode: str = "magnitude",
                        max_active: float = 1.0, count_zeros: bool = False,
                        dense: Callable[[Tensor], Tensor] | None = None
                        ) -> tuple[Tensor, int, int]:
    """y = a · weight_t + bias, skipping per block of ``block`` rows the units that count as
    zero in every row of the block (:func:`block_reference` is the product computed).

    ``a``: (N, d_ff) activations; ``weight_t``: (d_ff, d) contiguous (W2ᵀ). Returns (y (N, d),
    (row, unit) pairs multiplied, entries of ``a`` that count as zero — or -1 unless
    ``count_zeros``: the count is a pass of its own). Units that are computed keep their exact
    values (a GELU's small negatives included): the only change to the dense product is the
    skipped units. A block whose active share is above ``max_active`` runs dense; when every
    block does, one matmul over all rows: ``dense(a)`` when given (the layer itself: its own
    kernel and weight layout, measured 10–25 % faster than ``a · weight_t`` here), else addmm."""
    n, d_ff = a.shape
    act = active_units(a, block, threshold, mode)  # (n_blocks, d_ff)
    counts = act.sum(1).tolist()  # one sync for all blocks
    zeros = zero_count(a, threshold, mode) if count_zeros else -1
    if all(k > max_active * d_ff for k in counts):
        if dense is not None:
            return dense(a), n * d_ff, zeros
        y = torch.mm(a, weight_t) if bias is None else torch.addmm(bias, a, weight_t)
        return y, n * d_ff, zeros
    out = a.new_empty(n, weight_t.shape[1])
    cols = act.nonzero()[:, 1].split(counts)  # one nonzero call, split per block
    used = 0
    for r, (idx, k) in enumerate(zip(cols, counts)):
        blk = a[r * block:(r + 1) * block]  # (b, d_ff)
        dst = out[r * block:(r + 1) * block]  # a contiguous view: addmm writes in place
        if k > max_active * d_ff:
            blk_a, w, k = blk, weight_t, d_ff
        else:  # the copy of W2ᵀ's k rows is the price of the skip: k·d per block
            blk_a, w = blk.index_select(1, idx), weight_t.index_select(0, idx)
        if bias is None:
            torch.mm(blk_a, w, out=dst)
        else:
            torch.addmm(bias, blk_a, w, out=dst)
        used += k * blk.shape[0]
    return out, used, zeros


class SparseFFNOutput(nn.Module):
    """The FFN's second projection run by :func:`block_sparse_linear` (wraps the original
    ``nn.Linear``, or transformers' ``Conv1D``, which :func:`remove` puts back).

    Counters ``units_used`` / ``units_total`` (multiplied vs dense (row, unit) pairs since the
    last :func:`reset_stats`) are updated by every forward, ``units_zero`` (pairs that count
    as zero) only with ``count_zeros`` (a pass of its own: leave it off when timing); all are
    read by :func:`stats`. ``block`` ≥ N makes the whole batch one block."""

    def __init__(self, linear: nn.Module, threshold: float = 0.0, mode: str = "relu",
                 block: int = DEFAULT_BLOCK, max_active: float = DEFAULT_MAX_ACTIVE,
                 count_zeros: bool = False) -> None:
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"mode: must be one of {MODES}, got {mode!r}")
        if not (threshold >= 0 and threshold < float("inf")):
            raise ValueError(f"threshold: must be a finite number >= 0, got {threshold!r}")
        if int(block) != block or block < 1:
            raise ValueError(f"block: must be an integer >= 1, got {block!r}")
        if not 0.0 <= max_active <= 1.0:
            raise ValueError(f"max_active: must be in [0, 1], got {max_active!r}")
        self.linear = linear
        self.threshold, self.mode = float(threshold), mode
        self.block, self.max_active = int(block), float(max_active)
        self.count_zeros = bool(count_zeros)
        self._wt: Tensor | None = None
        self._wt_key: tuple | None = None
        self.units_used = self.units_total = self.units_zero = 0

    def weight_t(self) -> Tensor:
        """W2ᵀ as a contiguous (d_ff, d) tensor; recomputed when the weight changes (an
        in-place update bumps its version), so fine-tuning after :func:`apply` stays correct."""
        w = self.linear.weight
        if isinstance(self.linear, nn.Linear):
            key = (w.data_ptr(), tensor_version(w), w.dtype, w.device)
            if self._wt is None or key != self._wt_key:
                self._wt, self._wt_key = w.detach().t().contiguous(), key
            return self._wt
        return w.detach()  # Conv1D stores (d_in, d_out) = W2ᵀ already

    def forward(self, x: Tensor) -> Tensor:
        if torch.is_grad_enabled() and x.requires_grad:
            return self.linear(x)  # training: the dense path (the skip is an inference kernel)
        shape = x.shape
        a = x.reshape(-1, shape[-1])
        y, used, zeros = block_sparse_linear(a, self.weight_t(), self.linear.bias, self.block,
                                             self.threshold, self.mode, self.max_active,
                                             count_zeros=self.count_zeros, dense=self.linear)
        self.units_used += used
        self.units_total += a.numel()
        self.units_zero += max(zeros, 0)
        return y.reshape(*shape[:-1], y.shape[-1])


def _pairs(model: nn.Module) -> list[tuple[nn.Module, str, str]]:
    """(parent module, attribute, first-layer suffix) of every FFN second projection."""
    names = dict(model.named_modules())
    found = []
    for name in names:
        for first, second in SECOND.items():
            if name.endswith(first) and (name == first or name.endswith("." + first)):
                prefix = name[: len(name) - len(first)]
                target = prefix + second
                if target in names:
                    parent_name, _, attr = target.rpartition(".")
                    found.append((names[parent_name] if parent_name else model, attr, first))
    return found


def apply(model: nn.Module, threshold: float = 0.0, mode: str = "relu",
          block: int = DEFAULT_BLOCK, max_active: float = DEFAULT_MAX_ACTIVE,
          count_zeros: bool = False) -> nn.Module:
    """Run every FFN second projection of ``model`` sparsely (inference; the model is changed
    in place and returned). A second call replaces the settings. Works beside ``attnprune.patch``
    (which hooks the first layer). Raises ValueError when no FFN is found, and for
    ``mode="relu"`` on gated FFNs (the projection's input there is act(gate)·up, whose sign is
    not the activation's)."""
    remove(model)
    pairs = _pairs(model)
    if not pairs:
        raise ValueError("model: no FFN found (known first layers: "
                         f"{', '.join(SECOND)})")
    if mode == "relu" and any(first in GATED for _, _, first in pairs):
        raise ValueError("mode: 'relu' needs a plain FFN; use 'magnitude' for gated FFNs")
    for parent, attr, _ in pairs:
        setattr(parent, attr, SparseFFNOutput(getattr(parent, attr), threshold, mode, block,
                                              max_active, count_zeros))
    return model


def _wrappers(model: nn.Module) -> list[SparseFFNOutput]:
    return [m for m in model.modules() if isinstance(m, SparseFFNOutput)]


def remove(model: nn.Module) -> nn.Module:
    """Put the original second projections back (a no-op on a model without them)."""
    for parent in list(model.modules()):
        for attr, child in list(parent.named_children()):
            if isinstance(child, SparseFFNOutput):
                setattr(parent, attr, child.linear)
    return model


def reset_stats(model: nn.Module) -> None:
    """Zero the counters of every sparse FFN of ``model``."""
    for m in _wrappers(model):
        m.units_used = m.units_total = m.units_zero = 0


def stats(model: nn.Module) -> dict:
    """Since the last reset: ``block_sparsity`` (share of the second projection's multiply-adds
    skipped) and, when applied with ``count_zeros``, ``token_sparsity`` (share of (token, unit)
    activations that count as zero, padding rows included; else None), per layer and overall."""
    ws = _wrappers(model)
    tot = [max(m.units_total, 1) for m in ws]
    tok = [m.units_zero / t for m, t in zip(ws, tot)]
    blk = [1 - m.units_used / t for m, t in zip(ws, tot)]
    total = max(sum(m.units_total for m in ws), 1)
    counted = bool(ws) and all(m.count_zeros for m in ws)
    return {"token_sparsity": sum(m.units_zero for m in ws) / total if counted else None,
            "block_sparsity": 1 - sum(m.units_used for m in ws) / total,
            "token_sparsity_by_layer": tok if counted else None,
            "block_sparsity_by_layer": blk}
