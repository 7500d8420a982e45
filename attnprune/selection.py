"""Pure tensor functions for token selection: scores → keep masks → gathered short batches.

No ``nn.Module`` state lives here (ToMe's ``merge.py`` split): methods compute scores, hosts
wire the result into a model, and both use these functions.

Notation (papers' symbols):
    B batch, L sequence length, d width, ρ keep ratio (``keep_ratio``), k = ⌊ρL⌋ kept tokens,
    H_i per-token entropy, τ temperature, m_i ∈ {0, 1} keep mask, m̃_i relaxed mask.

Conventions:
    * ``mask`` (B, L) bool: True = a real token (not padding). Padding is never kept and never
      counted as kept.
    * ``keep`` (B, L) bool: True = the token survives the pruning step.
    * Scores: higher = more important (keep first).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import NamedTuple

import torch
from torch import Tensor

__all__ = [
    "Gathered",
    "budget",
    "check_keep_ratio",
    "entropy",
    "gather_tokens",
    "group_overhead_slots",
    "gumbel_sigmoid",
    "key_metric",
    "merge_tokens",
    "parse_schedule",
    "row_groups",
    "scatter_tokens",
    "threshold_keep",
    "topk_keep",
]


def check_keep_ratio(keep_ratio: float, name: str = "keep_ratio") -> float:
    """Validate ρ ∈ (0, 1] and return it as a float; the error names the field."""
    try:
        value = float(keep_ratio)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number in (0, 1], got {keep_ratio!r}") from None
    if not (0.0 < value <= 1.0) or math.isnan(value):
        raise ValueError(f"{name} must be in (0, 1], got {keep_ratio!r}")
    return value


def parse_schedule(
    keep_ratio: float | Sequence[float] | None,
    n_layers: int,
    after_layer: int = 1,
    schedule: str | float | Sequence[float] | None = None,
) -> tuple[float, ...]:
    """The cumulative keep ratio r_l after each of the ``n_layers`` layers (ToMe's ``parse_r``).

    r_l is the share of the original real tokens still present after layer l (1-based);
    r is non-increasing, and the last layer never prunes (nothing reads its dropped tokens).
    Accepted forms:

    * ``schedule`` None / ``"single"`` and a number ρ: prune once after layer ``after_layer``:
      r = (1, …, 1, ρ, ρ, …).
    * ``schedule="geometric"``: prune by ρ after every layer from ``after_layer`` on:
      r = (1, …, 1, ρ, ρ², ρ³, …).
    * ``schedule="linear"``: the same number of tokens after every layer from ``after_layer``
      to the last but one, down to ρ (ToMe's constant r per layer): r falls by
      (1 − ρ) / (n_layers − after_layer) a layer.
    * ``schedule`` or ``keep_ratio`` a list of per-layer cumulative ratios, length
      ``n_layers − 1`` or ``n_layers`` (the last value is then ignored).

    Bad values raise ValueError naming the field.
    """
    if n_layers < 2:
        raise ValueError(f"n_layers must be ≥ 2 to prune between layers, got {n_layers}")
    explicit = None
    if isinstance(schedule, (list, tuple)):
        explicit = schedule
    elif isinstance(keep_ratio, (list, tuple)):
        explicit, schedule = keep_ratio, None
    elif isinstance(schedule, str) and schedule.strip().startswith("["):
        import yaml

        explicit = yaml.safe_load(schedule)
    if explicit is not None:
        vals = [check_keep_ratio(v, f"schedule[{i}]") for i, v in enumerate(explicit)]
        if len(vals) not in (n_layers - 1, n_layers):
            raise ValueError(f"schedule: give {n_layers - 1} or {n_layers} values (one per "
                             f"layer), got {len(vals)}")
        vals = vals[: n_layers - 1]
        for i in range(1, len(vals)):
            if vals[i] > vals[i - 1] + 1e-12:
                raise ValueError(f"schedule: cumulative keep ratios must not increase, got "
                                 f"{vals[i - 1]} then {vals[i]} at layer {i + 1}")
        return (*vals, vals[-1])
    if schedule is None or isinstance(schedule, (int, float)):
        rule = "single"
        if isinstance(schedule, (int, float)):
            keep_ratio = schedule
    else:
        rule = str(schedule).strip().lower()
    if rule not in ("single", "geometric", "linear"):
        raise ValueError(f"schedule: must be 'single', 'geometric', 'linear' or a list of "
                         f"per-layer keep ratios, got {schedule!r}")
    rho = check_keep_ratio(1.0 if keep_ratio is None else keep_ratio)
    if isinstance(after_layer, bool) or not isinstance(after_layer, int):
        raise ValueError(f"after_layer must be an integer, got {after_layer!r}")  # noqa: TRY004 (patch() contract: ValueError)
    if not 1 <= after_layer <= n_layers - 1:
        raise ValueError(f"after_layer must be in [1, {n_layers - 1}] for a {n_layers}-layer "
                         f"model, got {after_layer}")
    out = []
    for layer in range(1, n_layers + 1):
        steps = layer - after_layer + 1
        if steps <= 0:
            out.append(1.0)
        elif rule == "single":
            out.append(rho)
        elif rule == "linear":
            steps = min(steps, n_layers - after_layer)
            out.append(1.0 - (1.0 - rho) * steps / (n_layers - after_layer))
        else:
            out.append(rho ** min(steps, n_layers - after_layer))
    return tuple(out)


def budget(n_tokens: Tensor | int, keep_ratio: float, minimum: int = 1) -> Tensor:
    """k = ⌊ρ·n⌋ per example, at least ``minimum`` (a sequence never loses all its tokens).

    ``n_tokens`` is the count of real (non-padding) tokens per example; a row with no real
    tokens gets k = 0. ρ is taken as the exact fraction it denotes (0.7·10 = 7, where floats
    give 6.999…).
    """
    n = torch.as_tensor(n_tokens).to(torch.long)
    # ρ as an exact fraction p/q of Python ints, k = ⌊n·p/q⌋ in int64: no float rounding (an
    # ONNX export turns a Python float into a float32 constant: 0.7 → 0.69999999, ⌊10·ρ⌋ = 6)
    # and no tensor made here (a 0-dim CPU tensor in a CUDA graph keeps CUDA graphs from
    # capturing it; one made on the device is a copy that waits for the device). q ≤ 2^30
    # keeps n·p in int64 for n < 2^33; a ratio with a short decimal form (0.35) is exact.
    p, q = _fraction(keep_ratio)
    k = torch.div(n * p, q, rounding_mode="floor")
    k = torch.clamp(k, min=minimum)
    return torch.minimum(k, n)


def _fraction(ratio: float, max_denominator: int = 1 << 30) -> tuple[int, int]:
    """``ratio`` as p/q with q ≤ ``max_denominator`` (0.7 → 7/10, 1/3 → 1/3)."""
    f = Fraction(ratio).limit_denominator(max_denominator)
    return f.numerator, f.denominator


def topk_keep(
    scores: Tensor,
    mask: Tensor | None = None,
    keep_ratio: float | None = None,
    k: Tensor | int | None = None,
    protect: Tensor | None = None,
) -> Tensor:
    """Keep the k highest-scoring real tokens of each row; returns a (B, L) bool mask.

    Exactly one of ``keep_ratio`` (k = ⌊ρ·n_real⌋, ≥ 1) and ``k`` (int or (B,) tensor) is given.
    ``protect`` (B, L) bool marks tokens kept regardless of score (e.g. CLS); they count
    toward k (and are all kept even where they outnumber k). Ties are broken by position
    (earlier first), so the result is deterministic.
    """
    B, L = scores.shape
    if mask is None:
        mask = torch.ones(B, L, dtype=torch.bool, device=scores.device)
    mask = mask.bool()
    n_real = mask.sum(dim=1)
    if (keep_ratio is None) == (k is None):
        raise ValueError("topk_keep: give exactly one of keep_ratio and k")
    if keep_ratio is not None:
        kk = budget(n_real, check_keep_ratio(keep_ratio))
    else:
        kk = (n_real.new_full((B,), int(k)) if not isinstance(k, Tensor)  # no copy to the device
              else k.to(scores.device).expand(B).long())
        kk = torch.minimum(kk, n_real)
    kk = torch.where(n_real > 0, kk, torch.zeros_like(kk))
    s = scores.detach().float().clone()
    s = torch.nan_to_num(s, nan=-1e30, posinf=1e30, neginf=-1e30)
    # Protected tokens first, then by score; padding last.
    big = torch.finfo(torch.float32).max / 4
    if protect is not None:
        s = torch.where(protect.bool() & mask, torch.full_like(s, big), s)
    s = torch.where(mask, s, torch.full_like(s, -big))
    # Stable sort by descending score: ties keep positional order.
    order = torch.sort(s, dim=1, descending=True, stable=True).indices
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(L, device=scores.device).expand(B, L))
    keep = rank < kk[:, None]
    if protect is not None:  # more protected tokens than k (a short pair's [CLS] + 2 [SEP])
        keep = keep | protect.bool()
    return keep & mask


def threshold_keep(
    scores: Tensor, threshold: float | Tensor, mask: Tensor | None = None,
    protect: Tensor | None = None, min_keep: int = 1,
) -> Tensor:
    """Keep real tokens with score ≥ threshold; at least ``min_keep`` per non-empty row
    (the best-scoring ones), so no sequence is emptied. Returns (B, L) bool."""
    B, L = scores.shape
    if mask is None:
        mask = torch.ones(B, L, dtype=torch.bool, device=scores.device)
    mask = mask.bool()
    keep = (scores.detach() >= threshold) & mask
    if protect is not None:
        keep = keep | (protect.bool() & mask)
    if min_keep > 0:
        floor = topk_keep(scores, mask, k=min_keep, protect=protect)
        keep = keep | floor
    return keep


class Gathered(NamedTuple):
    """A short batch of the kept tokens, padded to the batch maximum K."""

    hidden: Tensor  # (B, K, d)
    mask: Tensor  # (B, K) bool, True = kept real token
    index: Tensor  # (B, K) long, original positions (ascending; padding slots point at 0)


def gather_tokens(hidden: Tensor, keep: Tensor, *extra: Tensor,
                  size: int | None = None) -> tuple[Gathered, ...] | Gathered:
    """Remove dropped tokens from the tensor: (B, L, d) → (B, K, d), K = max kept per row.

    Kept tokens stay in ascending original order (needed for causal masks). Rows with fewer
    than K kept tokens are padded (mask False). ``extra`` tensors shaped (B, L, ...) are
    gathered with the same index and returned after the Gathered tuple. ``size`` fixes K
    instead (it must be ≥ every row's kept count, else kept tokens are cut): a traced graph
    (ONNX export) cannot read the max count back from the data.
    """
    B, L = keep.shape
    if size is not None:
        K = size
    else:
        K = int(keep.sum(dim=1).max().item()) if B > 0 else 0
        K = max(K, 1)
    pos = torch.arange(L, device=keep.device).expand(B, L)
    # Sort key: kept tokens first in original order, dropped after.
    key = torch.where(keep, pos, pos + L)
    index = torch.sort(key, dim=1).indices[:, :K]  # (B, K)
    short_mask = torch.gather(keep, 1, index)
    index = torch.where(short_mask, index, torch.zeros_like(index))
    # One index_select over the flattened (B·L, d) rows: the same copy as torch.gather with an
    # expanded (B, K, d) index, measured 2–3× faster on CPU (B = 32, L = 53, d = 384).
    flat = (index + L * torch.arange(B, device=index.device)[:, None]).reshape(-1)
    h = hidden.reshape(B * L, -1).index_select(0, flat).view(B, K, *hidden.shape[2:])
    out = Gathered(h, short_mask, index)
    if not extra:
        return out
    gathered = []
    for t in extra:
        idx = index.view(B, K, *([1] * (t.dim() - 2))).expand(B, K, *t.shape[2:])
        gathered.append(torch.gather(t, 1, idx))
    return (out, *gathered)


def scatter_tokens(full: Tensor, short: Tensor, index: Tensor, mask: Tensor) -> Tensor:
    """Write short (B, K, d) rows back into a copy of full (B, L, d) at ``index`` where ``mask``.

    Dropped positions keep their value in ``full`` (their last computed state).
    """
    B, K = index.shape
    L = full.shape[1]
    # A copy of full with one spare row at the end: padding slots (which point at position 0
    # and must not overwrite it) are sent there, so one index_copy_ writes every slot without
    # the host sync and copies of boolean indexing.
    buf = full.new_empty(B * L + 1, *full.shape[2:])
    buf[: B * L] = full.reshape(B * L, *full.shape[2:])
    dest = torch.where(mask, index + L * torch.arange(B, device=index.device)[:, None], B * L)
    buf.index_copy_(0, dest.reshape(-1), short.reshape(B * K, *short.shape[2:]).to(buf.dtype))
    return buf[: B * L].view(full.shape)


def key_metric(keys: Tensor, n_heads: int | None = None) -> Tensor:
    """(B, L, H·dh) keys → (B, L, dh) unit vectors in float32: the keys averaged over heads
    (ToMe's similarity metric), normalised. ``n_heads`` None: the vectors as they are,
    normalised."""
    k = keys.float()
    if n_heads and k.shape[-1] % n_heads == 0:
        k = k.view(*k.shape[:-1], n_heads, -1).mean(-2)
    return torch.nn.functional.normalize(k, dim=-1)


def merge_tokens(hidden: Tensor, mask: Tensor, keep: Tensor, metric: Tensor,
                 size: Tensor | None = None, protect: Tensor | None = None,
                 into: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Average every real unkept token into a kept one, weighted by sizes (ToMe's merge).

    ``hidden`` (b, K, d), ``mask`` (b, K) real slots, ``keep`` (b, K) the slots that stay,
    ``metric`` (b, K, m) unit vectors (cosine similarity), ``size`` (b, K) how many originals
    each slot stands for (None: 1), ``protect`` (b, K) slots that keep their own state (CLS,
    separators: never a destination, unless a row keeps nothing else), ``into`` (b, K) a
    destination slot per token chosen by the method (ToMe's match; used where it is kept and
    not protected). Every other unkept token goes to its most similar allowed kept slot.

    Returns (hidden, size, dest): the kept slots hold x_j' = Σ_{i→j} s_i x_i / Σ_{i→j} s_i
    (the sum in float32), sizes s_j' = Σ_{i→j} s_i, and ``dest`` (b, K) each slot's
    destination (itself where kept). Σ_j s_j' x_j' = Σ_i s_i x_i: a size-weighted mean over
    the kept slots equals the mean over the originals. Fixed shapes, no read-back."""
    b, K, d = hidden.shape
    slot = torch.arange(K, device=hidden.device).expand(b, K)
    keep = keep & mask
    allowed = keep if protect is None else keep & ~protect
    allowed = allowed | (keep & ~allowed.any(1, keepdim=True))  # (b, K) destinations
    sim = metric.float() @ metric.float().transpose(1, 2)  # (b, K, K)
    sim = sim.masked_fill(~allowed[:, None, :], float("-inf"))
    dest = sim.argmax(-1)  # (b, K)
    if into is not None:
        ok = torch.gather(allowed, 1, into.clamp(0, K - 1))
        dest = torch.where(ok, into, dest)
    dest = torch.where(keep | ~mask, slot, dest)  # kept and padding slots stay where they are
    w = mask.float() if size is None else size.float() * mask
    acc = torch.zeros(b, K, d, dtype=torch.float32, device=hidden.device)
    acc.scatter_add_(1, dest[..., None].expand(b, K, d), hidden.float() * w[..., None])
    total = torch.zeros(b, K, dtype=torch.float32, device=hidden.device).scatter_add_(1, dest, w)
    merged = acc / total.clamp_min(1e-12)[..., None]
    out = torch.where(keep[..., None], merged.to(hidden.dtype), hidden)
    return out, total, dest


def entropy(probs: Tensor, dim: int = -1, eps: float = 1e-12) -> Tensor:
    """Shannon entropy H = −Σ p log p in nats along ``dim`` (eq. 2 of the entropy paper)."""
    p = probs.clamp_min(eps)
    return -(probs * p.log()).sum(dim=dim)


def gumbel_sigmoid(logits: Tensor, tau: float, training: bool, generator=None) -> Tensor:
    """Relaxed Bernoulli gate m̃ = σ((s + g)/τ), g = Gumbel(0,1) noise in training only (eq. 3–4).

    The difference of two Gumbel(0, 1) draws is Logistic(0, 1); the paper adds one Gumbel
    draw to the logit, which we follow (its mean 0.577 shifts the gate slightly open).
    """
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    if training:
        u = torch.rand(logits.shape, generator=generator, device=logits.device).clamp(1e-9, 1 - 1e-9)
        g = -torch.log(-torch.log(u))
        logits = logits + g.to(logits.dtype)
    return torch.sigmoid(logits / tau)


# group_overhead_slots' model per block kind: (C, p), c = threads · C · (128 / d)^p (see its
# docstring; ``python scripts/group_overhead.py`` measures them).
GROUP_OVERHEAD_MODEL = {"encoder": (24.0, 0.0), "gpt2": (256.0, 1.5), "rotary": (512.0, 1.5),
                        "attention": (60.0, 0.7)}


def group_overhead_slots(d_model: int, threads: int | None = None, block: str = "encoder"
                         ) -> float:
    """c for :func:`row_groups`: one more group's cost in token slots per block, at width d.

    c = threads · C · (128 / d)^p, (C, p) = ``GROUP_OVERHEAD_MODEL[block]``. A group costs
    every block it runs a fixed time (kernel launches and dispatch, the weights read once more,
    the group's slicing and write-back) that a second thread does not shrink, against a
    per-slot time that grows with d and that a second thread halves: ≈ d^1–d^1.5 for blocks
    with an FFN (d² FLOPs, small matmuls below peak), ≈ d^0.7 for the bare attention (its
    per-slot cost is mostly the K·d of the scores, not the projections). ``block``:
    "encoder" (a BERT-like layer), "gpt2", "rotary" (a Llama-like block; its host also
    repeats the later decisions and the rotary gathers per group), "attention" (the
    synthetic track's single-head attention). Measured on a 2-core x86 CPU:
    ``python scripts/group_overhead.py`` times block calls at d ∈ {64, …, 384} (fit
    t = a + s·slots, c = a / s), which gives p and, for the encoder and the attention, C. The
    causal hosts repeat per group the later decisions, key masks and gathers: their C is from
    end-to-end wall time against c (``scripts/bench_group_overhead.py``; at batch 8 and
    d = 128 the block alone says c ≈ 33 (GPT-2) / 80 (rotary), the whole forward is fastest
    at c ≥ 128 / 512). The encoder keeps p = 0 (c = 24 per thread at every width, its earlier
    end-to-end tuning): width-dependent fits (C, p) = (80, 1) and (80, 0.75) ran 4–12 % slower
    end to end than it on MiniLM (d = 384) and BERT-base (d = 768) with
    ``scripts/bench_group_overhead.py`` on a loaded machine; a quiet re-measure may move it.
    ``threads`` defaults to torch's current count.
    """
    if isinstance(d_model, bool) or not isinstance(d_model, int) or d_model < 1:
        raise ValueError(f"d_model must be a positive int, got {d_model!r}")
    t = torch.get_num_threads() if threads is None else threads
    if isinstance(t, bool) or not isinstance(t, int) or t < 1:
        raise ValueError(f"threads must be a positive int, got {threads!r}")
    if block not in GROUP_OVERHEAD_MODEL:
        raise ValueError(f"block must be one of {sorted(GROUP_OVERHEAD_MODEL)}, got {block!r}")
    c, p = GROUP_OVERHEAD_MODEL[block]
    return t * c * (128.0 / d_model) ** p


def row_groups(counts: Tensor, overhead: float = 32.0) -> list[Tensor]:
    """Split b rows with kept counts K_r into groups run separately by the later blocks.

    Rule: minimise Σ_g (|g| · max_{r∈g} K_r + c) — the token slots the group's blocks process
    (each row padded to its group's longest) plus c = ``overhead`` slots per group (the fixed
    cost of running the blocks once more). Some optimal split groups runs of the rows sorted
    by K_r (swapping a longer row out of a group with the smaller maximum for a shorter row of
    the other group raises neither maximum), with equal K_r together, so dynamic programming
    over the m ≤ b distinct counts u_1 < … < u_m finds it in O(m²). Ties go to fewer groups:
    equal counts give one group. Returns the groups as (g,) row indices in ascending order,
    shortest rows first.

    Hosts use it to run the layers after a variable-budget gather on groups of rows of similar
    length instead of padding every row to the batch's longest (written by hand: no library
    buckets rows whose lengths change inside a forward).
    """
    hi, total = torch.stack([counts.max(), counts.sum()]).tolist() if counts.numel() else (0, 0)
    if counts.numel() * hi - total <= overhead:
        # All padding together is worth at most one group's cost: no split can pay (and ties
        # go to fewer groups), so skip the search (cheaper than torch.unique on every gather).
        return [torch.arange(counts.numel(), device=counts.device)]
    values, mult = torch.unique(counts, sorted=True, return_counts=True)
    u, n = values.tolist(), mult.tolist()
    m = len(u)
    best = [0.0] + [float("inf")] * m  # best[j]: cost of the rows with the j smallest counts
    cut = [0] * (m + 1)
    for j in range(1, m + 1):
        rows = 0
        for i in range(j - 1, -1, -1):  # last group = counts u_i … u_{j-1}, padded to u_{j-1}
            rows += n[i]
            cost = best[i] + rows * u[j - 1] + overhead
            if cost <= best[j]:  # ≤ with i falling: ties take the larger group
                best[j], cut[j] = cost, i
    groups, j = [], m
    while j > 0:
        lo, hi = u[cut[j]], u[j - 1]
        groups.append(torch.nonzero((counts >= lo) & (counts <= hi)).flatten())
        j = cut[j]
    return groups[::-1]
