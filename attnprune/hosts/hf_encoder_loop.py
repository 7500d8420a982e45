"""The layer loop of the encoder token host (:mod:`attnprune.hosts.hf_encoder`): the layers
on the tokens still present, the method's selection and the gather after each pruning layer,
merging, soft masks in training, and the row-group recursion (:func:`run_layers` and
:func:`_grouped`, with the hosts' kit: :func:`attnprune.hosts.split_rows` and
:func:`attnprune.hosts.run_row_groups`; after a gather, groups of rows with similar kept
counts run the remaining layers apart, each cut to its own longest row)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from attnprune.attention import attention_received, scorer_attention
from attnprune.hosts import CallData, run_row_groups, split_rows
from attnprune.hosts.hf_encoder_paths import clock, fixed_width, traced_width
from attnprune.methods.base import protect_first
from attnprune.selection import (
    gather_tokens,
    group_overhead_slots,
    key_metric,
    merge_tokens,
    scatter_tokens,
)

__all__ = ["Pass", "Tokens", "bidirectional_mask", "run_layers"]


@dataclass
class Pass:
    """What one forward's layer loop reads at every level of row bucketing."""

    call: CallData  # this forward's own data (hf_encoder's _Call: captured q/k, labels, timers)
    method: nn.Module
    training: bool
    rows: str  # the method's attention_rows
    labels: Tensor | None
    kwargs: dict  # passed to every layer (position_ids dropped after the first gather)
    bucket: bool
    static: bool  # traced (export / compile): no statistics, timers nor Python reads
    sync_free: bool  # never read the device (:func:`sync_free`); implied by static
    exporting: bool  # torch.export / ONNX / jit trace: data-dependent widths (traced_width)
    kept: list  # real tokens (soft mask sums in training) entering layer l, all groups
    padded: list  # token slots layer l computes, summed over groups
    length: int  # L, the input's width (the kept mask is (B, L))
    merge: bool = False  # reduce="merge": unkept tokens are averaged into kept ones
    floor: int = 0  # rows with fewer real tokens than this are never reduced (min_tokens)
    # tokens every selection must keep (protected) that a fixed sync-free width left out,
    # per pruning layer, as device counts (read with the stats, never during the forward)
    cut: list = field(default_factory=list)
    # c of row bucketing at a width (hf_encoder.group_overhead_tokens: its override is read there)
    overhead: Callable[[int], float] = group_overhead_slots


def _rank_loss(call: CallData, attn: Tensor, mask: Tensor) -> None:
    """An auxiliary loss on the scorer's token distribution at the first cut, once per call:
    ``call.rank`` is a callable ``(student (B, L), mask) -> loss`` handed in by the training
    layer (ranking distillation, :mod:`attnprune.train.rank_distill`); the scorer's attention
    is (B, H, 1, L) rows or (B, H, L, L)."""
    loss_fn = call.rank
    call.rank = None
    student = attn[:, :, 0, :].mean(1) if attn.shape[-2] == 1 else attention_received(attn, mask)
    call.aux_losses.append(loss_fn(student, mask))


def _attention(state, run: Pass, layer: int, keymask_add: Tensor, mask: Tensor) -> Tensor:
    """Attention probabilities of layer ``layer`` from the captured q, k projections, in
    the form the method declares (``run.rows``; :func:`attnprune.attention.scorer_attention`),
    with the family's own score terms (``Anatomy.scores``). ``keymask_add`` (B, L) is the
    additive key bias (padding, soft masks)."""
    t0 = clock(run)
    q, k = run.call.captured.pop("q"), run.call.captured.pop("k")  # (B, L, H·dh)
    extra = None  # the family's own score terms (B|1, 1|H, L, L): relative bias, window, …
    if state.anatomy.scores is not None:
        q, k, extra = state.anatomy.scores(state, layer, q, k)
    out = scorer_attention(q, k, keymask_add, mask, state.n_heads, run.rows, extra=extra,
                           queries=state.scorer_queries,
                           kernel=getattr(state, "scorer_kernel", "matmul"),
                           training=run.training, static=run.static, sync_free=run.sync_free)
    run.call.scorer_time_s += clock(run) - t0
    return out


@dataclass
class Tokens:
    """What rows carry through the loop besides their states, for merging and the short-input
    floor (each None when unused): ``size`` (b, K) float32, how many original tokens each slot
    stands for (None: all 1); ``src`` (b, L) long, each original position's current slot (−1
    at padding); ``whole`` (b,) bool, rows never reduced (fewer real tokens than
    ``min_tokens``)."""

    size: Tensor | None = None
    src: Tensor | None = None
    whole: Tensor | None = None

    def rows(self, rows: Tensor, k: int) -> Tokens:
        """The same for the rows ``rows`` cut to their first ``k`` slots (a row group)."""
        return Tokens(None if self.size is None else self.size[rows, :k],
                      None if self.src is None else self.src[rows],
                      None if self.whole is None else self.whole[rows])


def run_layers(state, run: Pass, start: int, hidden: Tensor, mask: Tensor,
               mask4d, index: Tensor, full: Tensor | None, gathered: bool = False,
               protect: Tensor | None = None, tokens: Tokens | None = None
               ) -> tuple[Tensor, Tensor | None, Tensor, tuple | None]:
    """Layers ``start``, ``start + 1``, … on b rows, in the host's output format.

    ``hidden`` (b, K, d) the tokens still present in ascending original order, ``mask``
    (b, K) their real slots, ``mask4d`` the layers' attention mask for them, ``index`` (b, K)
    their original positions, ``full`` (b, L, d) every token's state so far (dropped tokens'
    last states; None for ``output="short"``), ``gathered`` whether a gather already happened,
    ``protect`` (b, K) the tokens every selection keeps (CLS and separators; None: CLS only).
    ``tokens``: sizes, source map and unreduced rows (:class:`Tokens`).
    Returns ((b, L, d) final states, None, kept, merged) for ``output="scatter"``, or the
    compact ((b, K', d), (b, K') mask, kept, merged) for ``output="short"``; kept (b, L) bool
    marks the original positions the last layer computed (:func:`_kept_positions`); merged is
    None, or when merging ((b, L) sizes at the kept positions, (b, L) source map:
    :func:`_merged_outputs`), and with ``output="scatter"`` every real position then holds
    its representative's final state. After a gather at inference on the CPU path the rows
    may be split into groups (:func:`_grouped`), each running the rest of this loop.
    """
    method = run.method
    call = run.call
    n = len(state.layers)
    tokens = tokens or Tokens()
    soft_total: Tensor | None = None  # (b, K) product of the soft masks so far (training)
    # One row without padding (batch-1 serving, CPU path) stays without padding after any
    # gather: every slot is real, so the counts are the width, the gather is one index_select
    # of the kept positions, and the layers keep mask None (the stock no-padding SDPA call)
    # instead of a mask rebuilt by create_bidirectional_mask at every pruning layer.
    single = (not (run.sync_free or run.training or run.merge) and mask4d is None
              and hidden.shape[0] == 1)
    if protect is None:
        protect = protect_first(mask)
    for i in range(start, n):
        layer = state.layers[i]
        prune = i < n - 1 and state.schedule[i] < (state.schedule[i - 1] if i else 1.0) - 1e-12
        need_attn = prune and method.needs_attention
        need_keys = prune and (run.merge or getattr(method, "needs_keys", False))
        if single:
            run.kept[i] += hidden.shape[1]
            run.padded[i] += hidden.shape[1]
        elif not run.static:  # numbers on the CPU path, device tensors on the sync-free one
            count = soft_total.detach().sum() if soft_total is not None else mask.sum()
            run.kept[i] += count if run.sync_free else float(count)
            run.padded[i] += mask.numel()
        call.want = state.qk[i][0] if need_attn or need_keys else None  # hooks keep its q, k
        hidden = (layer(hidden, mask4d, **run.kwargs) if state.anatomy.call is None
                  else state.anatomy.call(state, i, hidden, mask4d, index))  # positions: index
        if not prune:
            continue
        rho = state.schedule[i] / (state.schedule[i - 1] if i else 1.0)
        attn = None
        t0 = clock(run)
        keys = _keys(state, i, call.captured.get("k")) if need_keys else None
        if need_attn:
            add = _additive(mask, _weights(soft_total, tokens.size), hidden.dtype)
            attn = _attention(state, run, i, add, mask)
            if run.training and call.rank is not None and not gathered:
                _rank_loss(call, attn, mask)
        call.captured.clear()
        extra = {"keys": keys} if getattr(method, "needs_keys", False) else {}
        sel = method(hidden, mask, attn=attn, keep_ratio=rho, layer=i,
                     labels=run.labels, protect=protect, **extra)
        t1 = clock(run)
        call.select_time_s += t1 - t0
        if sel.aux_loss is not None:
            call.aux_losses.append(sel.aux_loss)
        if run.training and sel.soft is not None:
            soft = sel.soft * mask.to(sel.soft.dtype)
            soft = torch.where(protect, torch.ones_like(soft), soft)
            soft_total = soft if soft_total is None else soft_total * soft
            if state.soft_mode == "multiply":
                hidden = hidden * soft[..., None]
            else:  # log-mask bias on the keys of every later layer
                mask4d = call.soft_bias = _additive(mask, soft_total, hidden.dtype)[:, None, None, :]
            continue
        keep = (sel.keep | protect) & mask  # the host's guarantee, whatever the method did
        if tokens.whole is not None:  # short inputs stay whole
            keep = keep | (tokens.whole[:, None] & mask)
        dest = None
        if run.merge:
            metric = key_metric(hidden.detach() if keys is None else keys.detach(),
                                None if keys is None else state.n_heads)
            hidden, size, dest = merge_tokens(hidden, mask, keep, metric, tokens.size,
                                              protect, sel.merge_into)
        elif full is not None:  # merging reads final states through the source map instead
            full = scatter_tokens(full, hidden, index, mask)
        if single:
            pos = keep[0].nonzero().squeeze(1)  # (K',) kept positions, ascending
            if pos.numel() > 0:
                hidden, index = hidden.index_select(1, pos), index.index_select(1, pos)
                protect = protect.index_select(1, pos)  # follows its tokens
                mask = mask.new_ones(1, pos.numel())
                gathered = True
                run.kwargs.pop("position_ids", None)
                call.gather_time_s += time.perf_counter() - t1
                continue
        width = _width(run, keep, rho)
        if width is not None and run.sync_free and not run.static:
            run.cut.append((keep.sum(1) - width).clamp_min(0).sum())  # no read: a device count
        g, index = (gather_tokens(hidden, keep, index) if width is None
                    else gather_tokens(hidden, keep, index, size=width))
        hidden, mask = g.hidden, g.mask
        protect = torch.gather(protect, 1, g.index) & mask  # follows its tokens
        if run.merge:
            tokens = Tokens(torch.gather(size, 1, g.index) * mask,
                            _follow(tokens.src, dest, g.index, mask), tokens.whole)
        gathered = True
        run.kwargs.pop("position_ids", None)
        if soft_total is not None:
            soft_total = torch.gather(soft_total, 1, g.index)
            mask4d = call.soft_bias = _additive(mask, _weights(soft_total, tokens.size),
                                                hidden.dtype)[:, None, None, :]
        else:
            if run.bucket and hidden.shape[0] > 1:
                groups = split_rows(mask, run.overhead(hidden.shape[-1]))
                if groups is not None:
                    call.gather_time_s += time.perf_counter() - t1
                    return _grouped(state, run, i + 1, groups, hidden, mask, index, full,
                                    protect, tokens)
            mask4d = _layer_mask(state, run, hidden, mask, tokens)
        call.gather_time_s += clock(run) - t1
    kept = _kept_positions(index, mask, run.length)
    merged = _merged_outputs(index, mask, tokens, run.length) if run.merge else None
    if full is None:
        return hidden, mask, kept, merged
    if gathered:  # even with K = L, rows may have shifted
        t0 = clock(run)
        if run.merge:  # every real position reads its representative's state
            src = tokens.src
            rep = torch.gather(hidden, 1, src.clamp_min(0)[..., None].expand(*src.shape,
                                                                            hidden.shape[-1]))
            full = torch.where((src >= 0)[..., None], rep.to(full.dtype), full)
        else:
            full = scatter_tokens(full, hidden, index, mask)
        call.gather_time_s += clock(run) - t0
        return full, None, kept, merged
    return hidden, None, kept, merged


def _keys(state, i: int, k: Tensor | None) -> Tensor | None:
    """Layer ``i``'s key projection (b, K, H·dh) from what the hooks captured: the key
    linear's output, or the middle third of a fused q/k/v projection (ModernBERT's Wqkv)."""
    if k is None:
        return None
    q_lin, k_lin = state.qk[i]
    if q_lin is k_lin:
        return k.chunk(3, dim=-1)[1]
    return k


def _weights(soft: Tensor | None, size: Tensor | None) -> Tensor | None:
    """The keys' multiplicative weights in attention: soft masks (training) times sizes
    (merged tokens, proportional attention); None when both are."""
    if size is None:
        return soft
    return size if soft is None else soft * size


def _layer_mask(state, run: Pass, hidden: Tensor, mask: Tensor,
                tokens: Tokens):
    """The layers' mask after a gather: the stock helper's, or when merging the additive
    bias log(size) on real keys (proportional attention: a token of size s weighs as s
    copies of itself), which is also the call's ``soft_bias`` (DeBERTa reads it)."""
    if not run.merge:
        return bidirectional_mask(state, hidden, mask, skip=not run.sync_free)
    bias = _additive(mask, tokens.size, hidden.dtype)[:, None, None, :]
    run.call.soft_bias = bias
    return bias


def _follow(src: Tensor, dest: Tensor, index: Tensor, mask: Tensor) -> Tensor:
    """The source map after a merge and gather: ``src`` (b, L) each original position's slot
    before, ``dest`` (b, K) each slot's destination slot, ``index`` (b, K') the old slot of
    each new slot (``mask`` its real ones). Returns each original position's new slot (−1
    stays −1)."""
    b, K = dest.shape
    new = torch.zeros(b, K + 1, dtype=torch.long, device=dest.device)
    cols = torch.arange(index.shape[1], device=dest.device).expand_as(index)
    new.scatter_(1, index.masked_fill(~mask, K), cols)  # padding slots write the spare column
    new = torch.gather(new, 1, dest)  # (b, K): old slot → the new slot of its destination
    out = torch.gather(new, 1, src.clamp_min(0))
    return torch.where(src >= 0, out, src)


def _merged_outputs(index: Tensor, mask: Tensor, tokens: Tokens, length: int
                    ) -> tuple[Tensor, Tensor]:
    """((b, L) float sizes at the kept original positions (0 elsewhere), (b, L) long source
    map: each original position's representative's original position, itself at padding)."""
    b = index.shape[0]
    size = mask.float() if tokens.size is None else tokens.size.float() * mask
    sizes = torch.zeros(b, length + 1, dtype=torch.float32, device=index.device)
    sizes.scatter_(1, index.masked_fill(~mask, length), size)
    pos = torch.arange(length, device=index.device).expand(b, length)
    src = tokens.src
    rep = torch.gather(index, 1, src.clamp_min(0))
    return sizes[:, :length], torch.where(src >= 0, rep, pos)


def _kept_positions(index: Tensor, mask: Tensor, length: int) -> Tensor:
    """(b, L) bool: the original positions of the real slots of ``index`` (b, K), i.e. the
    tokens the last layer computed. One scatter, no read-back: padding slots (whose index
    points at position 0) write into a spare column L, cut off after."""
    b = index.shape[0]
    out = torch.zeros(b, length + 1, dtype=torch.bool, device=index.device)
    out.scatter_(1, index.masked_fill(~mask, length), True)
    return out[:, :length]


def _width(run: Pass, keep: Tensor, rho: float) -> int | None:
    """The gather's width K' (None: the batch's largest kept count, read back on the CPU
    path). Sync-free (:func:`sync_free`): ⌊ρ·K⌋ from the shape for a fixed-ratio method; a
    threshold method's largest count, read back once (eager) or as a data-dependent size
    (traced); an export always the data-dependent size (exactly the eager tokens)."""
    if run.exporting or (run.static and getattr(run.method, "variable_budget", False)):
        return traced_width(keep)
    if not run.sync_free:
        return None
    if getattr(run.method, "variable_budget", False):
        return max(int(keep.sum(1).max()), 1)  # the documented one sync of a threshold layer
    return fixed_width(keep.shape[1], rho, run.floor)


def _grouped(state, run: Pass, start: int, groups: list[Tensor],
             hidden: Tensor, mask: Tensor, index: Tensor,
             full: Tensor | None, protect: Tensor | None = None,
             tokens: Tokens | None = None
             ) -> tuple[Tensor, Tensor | None, Tensor, tuple | None]:
    """Layers ``start``, … on each group of rows, cut to the group's longest row (pad slots sit
    at the end of a gathered row), then the groups' outputs back in the rows' places.

    ``output="scatter"``: the (b, L, d) final states, row by row as one batch would give them.
    ``output="short"``: (b, K', d) with K' the longest final row over all groups (as one batch
    gives); slots past a group's own width are zeros (they are padding, mask False).
    """
    call = run.call
    tokens = tokens or Tokens()
    t0 = time.perf_counter()

    def group(rows: Tensor, k: int) -> tuple:  # rows (g,) indices into the b rows
        nonlocal t0
        h, m = hidden[rows, :k], mask[rows, :k]  # (g, k, d), (g, k)
        sub = tokens.rows(rows, k)
        m4 = _layer_mask(state, run, h, m, sub)
        sub_full = None if full is None else full[rows]  # (g, L, d)
        call.gather_time_s += time.perf_counter() - t0
        prot = None if protect is None else protect[rows, :k]
        out = run_layers(state, run, start, h, m, m4, index[rows, :k], sub_full,
                         gathered=True, protect=prot, tokens=sub)
        t0 = time.perf_counter()
        return out

    parts = run_row_groups(groups, mask, group)
    kept = mask.new_zeros(hidden.shape[0], run.length)
    for rows, (_, _, k, _) in parts:
        kept[rows] = k
    merged = None
    if run.merge:
        sizes = torch.zeros(hidden.shape[0], run.length, device=mask.device)
        source = torch.zeros(hidden.shape[0], run.length, dtype=torch.long, device=mask.device)
        for rows, (_, _, _, (sz, sc)) in parts:
            sizes[rows], source[rows] = sz, sc
        merged = (sizes, source)
    if full is not None:
        out = torch.empty_like(full)  # the groups cover every row once
        for rows, (o, _, _, _) in parts:
            out[rows] = o
        call.gather_time_s += time.perf_counter() - t0
        return out, None, kept, merged
    b, d = hidden.shape[0], hidden.shape[-1]
    width = max(o.shape[1] for _, (o, _, _, _) in parts)
    out = hidden.new_zeros(b, width, d)
    out_mask = mask.new_zeros(b, width)
    for rows, (o, m, _, _) in parts:
        out[rows, : o.shape[1]] = o
        out_mask[rows, : m.shape[1]] = m
    call.gather_time_s += time.perf_counter() - t0
    return out, out_mask, kept, merged


def bidirectional_mask(state, hidden: Tensor, mask: Tensor, skip: bool = True):
    """The layers' attention mask for a gathered batch, from the stock helper: the format the
    model's attention implementation expects (None, bool or float). ``skip=False`` always
    builds the mask: the helper's "no padding, no mask" shortcut reads the mask back from
    the device (``mask.all()``), which the sync-free path must not do."""
    from attnprune.compat import create_bidirectional_mask

    extra = {} if skip else {"allow_is_bidirectional_skip": False}
    return create_bidirectional_mask(config=state.config, inputs_embeds=hidden,
                                     attention_mask=None if mask is None else mask.long(),
                                     **extra)


def _additive(mask: Tensor, soft: Tensor | None, dtype) -> Tensor:
    """(B, L) additive key bias: log m̃ on real keys (0 when no soft mask), dtype-min on padding."""
    lo = torch.finfo(dtype).min
    if soft is None:
        return torch.where(mask, torch.zeros((), dtype=dtype, device=mask.device),
                           torch.full((), lo, dtype=dtype, device=mask.device))
    # clamp: log 0 = −inf would give NaN gradients; e^-30 is already "removed". In float32:
    # e^-30 underflows to 0 in fp16 (smallest subnormal 6e-8), so the log is taken in fp32
    # and the result (−30) fits every dtype.
    return torch.where(mask, soft.float().clamp_min(math.exp(-30)).log().to(dtype),
                       torch.full((), lo, dtype=dtype, device=mask.device))
