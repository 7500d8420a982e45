"""Causal token pruning for the Hugging Face GPT-2 family that really skips work.

``attnprune.patch(gpt2_lm, "ltp" | "ltp_causal" | "dtr" | "hybrid", **options)`` replaces the
``forward`` of the model's ``GPT2Model`` (the block loop) by :func:`gpt2_forward`, a partial over
the patch state (:func:`attnprune.hosts.replace_forward`, as every host patches): the class stays
``GPT2Model``; blocks, attention, ``ln_f`` and the LM head are the stock HF modules. Pickle,
``torch.save`` and deep copies carry the partial (a module-level function, found by name) and
their own state; ``unpatch`` lets the stock forward show through again.

Per call: what one forward computes and leaves (losses, the policy's actions, statistics) goes
to a :class:`CausalCall` begun at the inner model's entry and ended at its exit
(:class:`attnprune.hosts.Calls`, per thread); ``state.aux_losses`` / ``stats`` / ``actions`` read
the calling thread's last call (:class:`attnprune.hosts.LastCall` attributes of a
:class:`attnprune.hosts.CallState`), so threads sharing one patched model never mix them. What
outlives a call stays with the object it describes: the per-block key masks of a KV cache ride
on that cache (they must follow it across calls, threads and copies).

The host kit (:mod:`attnprune.hosts`) builds the method (``build_method``), prices a group of
rows (``group_overhead``), splits and runs row groups (``split_rows``, ``run_row_groups``) and
registers the method module (``add_method_module``). A learned method that is untrained keeps
every token; a forward hook says so once, at the first eval forward (``UntrainedMethodWarning``).

Notation: B batch, L input length, K tokens still alive (≤ L), d width, l block index
(0-based), a_j ∈ [0, 1] the soft "alive" weight of token j in training, ρ keep ratio.

Convention: a method "at layer l" decides which tokens *enter* block l (l ≥ 1); the kept ratio
of layer l is the share of real tokens that block l processes. Effective FLOPs of the paper
(``token_pruning_bert_to_gpt2.txt``, "effective FLOPs") are Σ_l FLOPs_l · kept_ratio_l.

What happens to a token dropped before block l (``HF_NOTES.md`` "Causal models"):
    * it leaves the tensor (ascending gather keeps a plain causal mask right on the short
      sequence), so blocks l, l+1, … never compute it and later tokens no longer attend to it;
    * its last state is scattered back to its position, goes through ``ln_f`` and the LM head,
      so it still predicts the next token;
    * with a KV cache, it is not appended to the caches of blocks ≥ l, so caches of different
      blocks have different lengths; one mask per block is built with
      ``create_causal_mask(config, h, mask, cache, layer_idx=l)``, with a per-block 2D key
      mask kept on the cache (``cache._attnprune_keys``) only when short rows were padded.
      ``position_ids`` are never passed to the mask (gathered ids would look packed).

Row bucketing (inference without a KV cache, ``bucket_rows=True``): after a gather the b rows
keep K_r tokens each and are padded to max_r K_r. The rows are split into groups of similar K_r
(:func:`attnprune.selection.row_groups`: dynamic programming over the sorted counts,
minimising padded token slots plus a per-group overhead c in slots); each group, cut to its own longest row, runs the rest of
the block loop (its later decisions may prune and split it again: the loop recurses), and its
final states are written back to its rows before ``ln_f``. Padding never attends nor is
attended, so outputs equal the unbucketed forward up to float rounding; only the padded work
goes. Training and cached forwards keep one padded batch (caches and batch losses are per batch).

Causality: the decision for token t at layer l may use only tokens ≤ t, and must not depend
on the sequence length, so a cached decode step decides exactly as a full recompute. Methods
declare it with ``causal = True``; non-causal token methods (top-k over the row, attention
received from future queries) are refused with the reason.

Training: hard decisions (DTR's Bernoulli actions) gather as at inference. Relaxed masks
(LTP's m̃) keep the full length: a token's update by block l is scaled by its cumulative
alive weight a_j, h ← h + a_j·(block(h) − h), and keys are down-weighted by adding log a_j to
the attention scores (a float mask), the relaxation of "skips the remaining layers and is no
longer attended to". REINFORCE rewards need the per-position LM losses, so a forward hook on the
LM-head model turns the actions' log-probabilities into the policy loss when ``labels`` are
given (it lands in ``attnprune.aux_loss(model)``).

The block loop (:func:`block_loop`) and the option checks (:func:`patch_causal`) are shared
with the rotary decoder families (:mod:`attnprune.hosts.hf_llama`): a family's forward embeds
the input, hands the loop its blocks and its block call on the compact tokens (GPT-2 ignores
the original positions; rotary models gather their (cos, sin) with them), and applies its
final norm.

Written by hand: no library prunes tokens inside HF causal models, nor buckets the rows of a
batch whose lengths change between its blocks.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import DynamicCache, GPT2Model

from attnprune.compat import (
    BaseModelOutputWithPastAndCrossAttentions,
    create_causal_mask,
    hook_dicts,
)
from attnprune.hosts import (
    CallData,
    CallState,
    LastCall,
    UntrainedMethodWarning,
    add_method_module,
    bracket_calls,
    build_method,
    check_attn_implementation,
    group_overhead,
    refuse_output_flags,
    register_host,
    remove_method_module,
    remove_state_hooks,
    replace_forward,
    restore_forward,
    run_row_groups,
    split_rows,
)
from attnprune.methods import registry
from attnprune.selection import check_keep_ratio, gather_tokens, scatter_tokens

__all__ = ["CAUSAL_ALIASES", "BlockPass", "CausalCall", "CausalPatchState",
           "UntrainedMethodWarning", "block_loop", "causal_methods", "gpt2_forward", "gpt2_inner",
           "one_cache"]

# Method names the causal hosts read otherwise (declared with register_host): the encoder LTP
# owns the name "ltp"; here it means ltp_causal.
CAUSAL_ALIASES = {"ltp": "ltp_causal"}
_KEYS_ATTR = "_attnprune_keys"  # per-block 2D key-validity masks stored on a KV cache
# A fixed cost of one more group of rows in token slots (see row_groups); None: the measured
# model, selection.group_overhead_slots(d, block="gpt2") (tests set a small one).
GROUP_OVERHEAD_TOKENS: float | None = None

# transformers 5.24 renamed the cache argument of every model, layer and mask function from
# ``past_key_values`` to ``cache`` (the old name is mapped, with a warning, until 5.40): the
# hosts accept both and call the layers with the installed version's name.
CACHE_KW = "cache" if "cache" in inspect.signature(GPT2Model.forward).parameters else "past_key_values"


def cache_kwargs(cache) -> dict:
    """``{name: cache}`` with the installed transformers' name for the cache argument."""
    return {CACHE_KW: cache}


def output_cache(out):
    """The cache a model's output holds, under the installed transformers' field name (the old
    ``past_key_values`` attribute logs a deprecation from 5.24)."""
    return getattr(out, CACHE_KW)


def causal_methods() -> list[str]:
    """Registered token methods whose decisions are causal (usable with this host)."""
    return [n for n in registry.list_methods("token") if registry.get(n).cls.causal]


class CausalCall(CallData):
    """What one forward of a patched causal model leaves for its caller: ``aux_losses``,
    ``stats`` and the policy's ``actions`` (DTR: per-token actions and log-probabilities with
    their original positions), which the LM-head hook turns into the REINFORCE loss."""

    def __init__(self) -> None:
        super().__init__()
        self.actions: list[dict] = []


@dataclass
class BlockPass:
    """What one forward's block loop reads at every level of row bucketing. Built by the
    forward and passed down (row groups get a copy with their rows): it never outlives the
    call, and what the call leaves goes to ``data``, the call's own :class:`CausalCall`."""

    blocks: nn.ModuleList
    # the family's block call on the compact tokens: (run, l, block, h, index (b, K), mask)
    call_block: Callable[..., Tensor]
    overhead: float  # row bucketing's cost of one more group, in token slots (row_groups)
    config: object
    training: bool
    method: nn.Module
    layers: set[int]
    keep_ratio: float | None
    L: int
    cache: DynamicCache | None
    use_cache: bool | None
    block_kwargs: dict
    bucket: bool
    kept: list[float]  # real tokens processed by each block, summed over groups
    data: CausalCall
    # Per-row tensors (B, L, ...) a family's block call reads at original positions (rotary
    # models: position ids, cos, sin); row groups take their rows, blocks gather their tokens.
    rows: dict = field(default_factory=dict)


def gpt2_inner(model: nn.Module) -> GPT2Model | None:
    """The ``GPT2Model`` of a GPT-2 family model (itself, or its ``transformer``), or None."""
    if isinstance(model, GPT2Model):
        return model
    inner = getattr(model, "transformer", None)
    return inner if isinstance(inner, GPT2Model) else None


# ----------------------------------------------------------------------------- the block loop
# Shared by every causal family (GPT-2 here, the rotary decoders of hf_llama): a family's
# forward embeds the chunk, calls :func:`positions` and :func:`block_loop` with its blocks and
# its block call (GPT-2 ignores the original positions; rotary models gather their (cos, sin)
# with them), then applies its final norm.
def positions(config, embeds: Tensor, cache, use_cache, position_ids):
    """(cache, position_ids (1 or B, L)): a new cache if one is asked for and none given;
    default positions continue block 0's cache, whose length is the position because block 0
    never prunes (later blocks cache fewer keys)."""
    if use_cache and cache is None:
        cache = DynamicCache(config=config)
    if position_ids is None:
        past = cache.get_seq_length() if cache is not None else 0
        position_ids = torch.arange(past, past + embeds.shape[1], device=embeds.device)[None]
    return cache, position_ids


def block_loop(state: CausalPatchState, inner: nn.Module, h: Tensor, attention_mask,
               past_key_values, use_cache, block_kwargs: dict, rows: dict,
               blocks: nn.ModuleList, call_block: Callable[..., Tensor], overhead: float) -> Tensor:
    """Every block on ``h`` (B, L, d) with pruning; returns the final states (B, L, d)
    (dropped tokens hold their last state); the running call's data gets the statistics,
    losses and actions."""
    data: CausalCall = state.calls.current()
    B, L, _ = h.shape
    past = past_key_values.get_seq_length() if past_key_values is not None else 0
    # 2D mask of real tokens in this chunk; past keys' validity lives on the cache.
    if attention_mask is not None and attention_mask.ndim != 2:
        raise ValueError("attention_mask: the causal pruning host takes a 2D (B, L) mask")
    real = torch.ones(B, L, dtype=torch.bool, device=h.device)
    if attention_mask is not None:
        real = attention_mask[:, -L:].bool()
    key_masks = _key_masks(len(blocks), past_key_values, attention_mask, B, past)

    n_real = real.sum().clamp_min(1)
    # Row bucketing only where nothing else sees the padded batch: no cache whose per-block
    # key masks and lengths are per batch, no relaxed training masks or batch-level losses.
    bucket = state.bucket_rows and not inner.training and not use_cache and past_key_values is None
    run = BlockPass(blocks=blocks, call_block=call_block, overhead=overhead, config=inner.config,
                training=inner.training, method=state.method_module,
                layers=set(state.layers) if state.enabled else set(),
                keep_ratio=state.keep_ratio, L=L, cache=past_key_values, use_cache=use_cache,
                block_kwargs=block_kwargs, bucket=bucket, kept=[0.0] * len(blocks), data=data,
                rows=rows)
    index = torch.arange(L, device=h.device).expand(B, L)  # compact → original position
    full, key_masks = _blocks(run, 0, h, h, index, real, key_masks, alive=None,
                              covered=bool(real.all()))
    if past_key_values is not None and key_masks is not None:
        setattr(past_key_values, _KEYS_ATTR, key_masks)
    data.stats = {"kept_per_layer": [float(k) / float(n_real) for k in run.kept],
                  "n_tokens": int(n_real)}
    return full


def _blocks(run: BlockPass, start: int, h: Tensor, full: Tensor, index: Tensor, cmask: Tensor,
            key_masks, alive: Tensor | None, decide_from: int = 0, covered: bool = False):
    """Blocks ``start``, ``start + 1``, … on b rows; returns (full, key_masks).

    ``h`` (b, K, d) alive tokens in compact order, ``index`` (b, K) their positions, ``cmask``
    (b, K) alive real slots, ``full`` (b, L, d) the rows' states so far (dropped tokens' last
    states). Decision layers before ``decide_from`` are skipped: a group of rows starts at
    the block whose decision its parent already took. The returned ``full`` holds every
    token's final state. ``covered``: every position of ``full`` is a real slot of ``h``
    (so the write-back need not copy ``full`` first).
    """
    method, L = run.method, run.L
    # (states, positions, which slots) of the tokens that left, written into ``full`` in
    # one scatter at the end (one copy of the (b, L, d) states instead of one per gather)
    pending: list[tuple[Tensor, Tensor, Tensor]] = []
    # Host-side checks read once per pass and after each gather, not per block (each read
    # of a tensor's value is a sync and a few µs; a tiny model's block costs ~250 µs).
    any_alive = bool(cmask.any())
    prefix = run.cache is None and (key_masks is None or _real_prefix(cmask))
    for l in range(start, len(run.blocks)):
        block = run.blocks[l]
        if l in run.layers and l >= decide_from and any_alive:
            # Training-time protection of the chunk's last N positions (LTP) is by original
            # position: "last N alive tokens" would move when a later token is dropped.
            n_prot = method.protect_last if run.training else 0
            protect = (index >= L - n_prot) & cmask if n_prot else None
            sel = method(h, cmask, layer=l, keep_ratio=run.keep_ratio, protect=protect)
            if sel.aux_loss is not None:
                run.data.aux_losses.append(sel.aux_loss)
            if sel.info is not None and "log_prob" in sel.info:
                run.data.actions.append({**sel.info, "index": index})  # + original positions
            if run.training and sel.soft is not None:
                soft = sel.soft * cmask.to(sel.soft.dtype)
                alive = soft if alive is None else alive * soft
            keep = sel.keep & cmask
            # one read for both: does any token leave, and the longest row after the gather
            leaves, k_max = torch.stack([(keep != cmask).any().long(), keep.sum(1).max()]).tolist()
            if leaves:  # some tokens leave: gather the survivors
                pending.append((h, index, cmask & ~keep))  # the leavers' last states
                if alive is None:
                    g = gather_tokens(h, keep, size=max(k_max, 1))
                else:
                    g, alive = gather_tokens(h, keep, alive, size=max(k_max, 1))
                h, cmask = g.hidden, g.mask
                any_alive, prefix = k_max > 0, run.cache is None  # pads now at the ends
                index = torch.gather(index, 1, g.index)
                key_masks = _gathered_keys(len(run.blocks), key_masks, g, run.cache)
                groups = split_rows(cmask, run.overhead) if run.bucket else None
                if groups:
                    full = _write_back(full, pending, covered)
                    return _grouped(run, l, groups, h, full, index, cmask, key_masks), None
        # Kept = processed by this block (in relaxed training: alive weight > 0.5).
        counted = cmask if alive is None else cmask & (alive > 0.5)
        run.kept[l] = run.kept[l] + counted.sum()  # a tensor: read once, at the end
        if not any_alive:  # nothing left to compute (nor to cache) in later blocks
            break
        mask = _block_mask(run.config, h, cmask, key_masks, run.cache, l, alive, prefix)
        out = run.call_block(run, l, block, h, index, mask)
        if alive is not None:  # relaxed skip: a_j = 0 means the token keeps its state
            out = h + alive[..., None] * (out - h)
        h = out
        if key_masks is not None and run.cache is not None:  # without a cache: never read
            key_masks[l] = torch.cat([key_masks[l], cmask], dim=1)
    pending.append((h, index, cmask))
    return _write_back(full, pending, covered), key_masks


def _grouped(run: BlockPass, l: int, groups: list[Tensor], h: Tensor, full: Tensor, index: Tensor,
             cmask: Tensor, key_masks) -> Tensor:
    """Blocks l, l+1, … on each group of rows, cut to the group's longest row (pad slots
    sit at the end of a gathered row); each group's final states go back to its rows."""
    out = torch.empty_like(full)  # (b, L, d); the groups cover every row once

    def group(rows: Tensor, k: int) -> None:  # rows (g,) indices into the b rows
        keys = None if key_masks is None else [m[rows] for m in key_masks]
        sub = replace(run, rows={n: t[rows] for n, t in run.rows.items()})
        out[rows], _ = _blocks(sub, l, h[rows, :k], full[rows], index[rows, :k],
                               cmask[rows, :k], keys, alive=None, decide_from=l + 1)

    run_row_groups(groups, cmask, group)
    return out


# ----------------------------------------------------------------------------- masks
def _key_masks(n_blocks: int, cache, attention_mask, B, past) -> list[Tensor] | None:
    """Per-block 2D key validity (B, past_l) carried on the cache, or None if all valid."""
    stored = getattr(cache, _KEYS_ATTR, None) if cache is not None else None
    padded = attention_mask is not None and not bool(attention_mask.bool().all())
    if stored is None and not padded:
        return None
    if stored is not None:
        return list(stored)
    dev = attention_mask.device
    masks = []
    for l in range(n_blocks):
        n = cache.get_seq_length(l) if cache is not None and past else 0
        # Before pruning every block saw the same past: the user's mask covers it.
        masks.append(attention_mask[:, :n].bool() if n else torch.ones(B, 0, dtype=torch.bool, device=dev))
    return masks


def _gathered_keys(n_blocks: int, key_masks, g, cache):
    """After a gather, short rows are padded at the end: from now on pad slots must never
    be keys, so per-block key masks start (empty = the cached keys, all valid). Without a
    cache they are not needed: a pass without one has only pads at the row ends after a
    gather, which the causal mask alone handles (see :func:`_block_mask`)."""
    if key_masks is not None or cache is None or bool(g.mask.all()):
        return key_masks
    B = g.mask.shape[0]
    return [torch.ones(B, 0, dtype=torch.bool, device=g.mask.device) for _ in range(n_blocks)]


def _block_mask(config, h, cmask, key_masks, cache, l, alive, prefix: bool = False):
    """The attention mask of block l in the format of the model's attention function
    (``prefix``: no cache and every row's real slots come first)."""
    if alive is not None:
        return _soft_mask(h, cmask, alive)
    if key_masks is None or prefix:
        # No padding, or (no cache) only pad slots at the row ends, as after every gather:
        # a real query i attends keys ≤ i, all real, so the causal mask alone is exact for
        # it (pad queries see real keys and are never read back). SDPA then runs its
        # is_causal path instead of a (b, 1, K, K) mask: cheaper on short rows.
        # (the cache goes positionally: its keyword is ``cache`` from transformers 5.24 on)
        return create_causal_mask(config, h, None, cache, position_ids=None, layer_idx=l)
    past_keys = key_masks[l]
    if cache is not None and past_keys.shape[1] != cache.get_seq_length(l):
        n = cache.get_seq_length(l)  # keys cached before any padding appeared are valid
        past_keys = torch.cat([torch.ones(h.shape[0], n - past_keys.shape[1], dtype=torch.bool,
                                          device=h.device), past_keys], dim=1)
        key_masks[l] = past_keys
    mask2d = torch.cat([past_keys, cmask], dim=1)
    return create_causal_mask(config, h, mask2d, cache, position_ids=None, layer_idx=l)


# ----------------------------------------------------------------------------- GPT-2
def _gpt2_call(run: BlockPass, l: int, block: nn.Module, h: Tensor, index: Tensor, mask) -> Tensor:
    # Positions need no remapping: GPT-2 adds wpe once, at the input.
    return block(h, run.cache, mask, use_cache=run.use_cache, **run.block_kwargs)


def gpt2_forward(state: CausalPatchState, original, input_ids=None, past_key_values=None,
                 attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
                 use_cache=None, cache=None, **kwargs):
    """``GPT2Model.forward`` with pruning, installed by :func:`attnprune.hosts.replace_forward`
    (``original``, the stock forward, is not called): same inputs and outputs (no
    cross-attention); the cache comes as ``cache`` (transformers ≥ 5.24) or
    ``past_key_values`` (before)."""
    g = state.inner
    past_key_values = one_cache(cache, past_key_values)
    if kwargs.get("encoder_hidden_states") is not None:
        raise ValueError("encoder_hidden_states: the causal pruning host has no cross-attention")
    if input_ids is not None and inputs_embeds is not None:
        raise ValueError("give input_ids or inputs_embeds, not both")
    if inputs_embeds is None:
        if input_ids is None:
            raise ValueError("input_ids: give input_ids or inputs_embeds")
        inputs_embeds = g.wte(input_ids)
    B = inputs_embeds.shape[0]
    past_key_values, position_ids = positions(g.config, inputs_embeds, past_key_values,
                                              use_cache, position_ids)
    h = inputs_embeds + g.wpe(position_ids)
    if token_type_ids is not None:
        h = h + g.wte(token_type_ids.view(B, -1))
    h = g.drop(h)  # (B, L, d)
    full = block_loop(state, g, h, attention_mask, past_key_values, use_cache,
                      _block_kwargs(kwargs), {}, g.h, _gpt2_call,
                      group_overhead(GROUP_OVERHEAD_TOKENS, h.shape[-1], "gpt2"))
    hidden = g.ln_f(full)
    return BaseModelOutputWithPastAndCrossAttentions(
        last_hidden_state=hidden, **cache_kwargs(past_key_values if use_cache else None))


def one_cache(cache, past_key_values):
    """The cache given under either name (ValueError if both are given)."""
    if cache is not None and past_key_values is not None:
        raise ValueError("cache: give cache or past_key_values, not both")
    return cache if cache is not None else past_key_values


def _write_back(full: Tensor, pending: list, covered: bool = False) -> Tensor:
    """A copy of ``full`` (b, L, d) with every pending (states (b, K_i, d), positions, slots)
    piece written to its positions. The pieces' slots never overlap (each token leaves once);
    when they cover every position (``covered``) ``full`` is not copied first. Pad slots are
    sent to a spare row (as in :func:`attnprune.selection.scatter_tokens`)."""
    if len(pending) == 1 and not covered:
        return scatter_tokens(full, *pending[0])
    B, L = full.shape[:2]
    buf = full.new_empty(B * L + 1, *full.shape[2:])
    if not covered:
        buf[: B * L] = full.reshape(B * L, *full.shape[2:])
    offset = L * torch.arange(B, device=full.device)[:, None]
    for h, index, mask in pending:
        dest = torch.where(mask, index + offset, B * L).reshape(-1)
        buf.index_copy_(0, dest, h.reshape(-1, *h.shape[2:]).to(buf.dtype))
    return buf[: B * L].view(full.shape)


def _real_prefix(cmask: Tensor) -> bool:
    """True if every row's real slots come first (no real slot after a pad slot)."""
    return bool((cmask[:, 1:] <= cmask[:, :-1]).all())


def _block_kwargs(kwargs: dict) -> dict:
    # Only kwargs the blocks understand pass through (no position ids: GPT-2 adds wpe once).
    return {k: v for k, v in kwargs.items() if k in ("output_attentions",)}


def _soft_mask(h: Tensor, cmask: Tensor, alive: Tensor) -> Tensor:
    """Float additive mask (B, 1, K, K): causal, padding keys off, key j weighted by a_j.

    Adding log a_j to a score multiplies that key's unnormalised attention weight by a_j, so a
    soft-dropped token fades out of the softmax smoothly.
    """
    K = h.shape[1]
    causal = torch.ones(K, K, dtype=torch.bool, device=h.device).tril()
    allowed = causal[None, None] & cmask[:, None, None, :]  # (B, 1, K, K)
    # The clamp keeps the value finite (−13.8 ≈ removed) and stops the 1/a gradient at a = 0
    # (a straight-through hard 0); kept tokens (a = 1) get the plain d log a = 1/a gradient.
    bias = torch.log(alive.clamp_min(1e-6)).to(h.dtype)[:, None, None, :]
    neg = torch.finfo(h.dtype).min
    mask = torch.where(allowed, bias, torch.full_like(bias, neg))
    # A padding query with no allowed key would give NaN; let it see itself.
    eye = torch.eye(K, dtype=torch.bool, device=h.device)[None, None]
    return torch.where(eye & ~cmask[:, None, :, None], torch.zeros_like(mask), mask)


class CausalPatchState(CallState):
    """Patch of a causal model (GPT-2, Llama family): the method, its decision layers, and
    each thread's last forward (``aux_losses``, ``stats``, ``actions``: read from
    ``calls.last()``, so threads sharing one patched model never read each other's).

    ``stats["kept_per_layer"]`` is the share of real tokens each block processed in the last
    forward (summed over row groups); ``enabled`` and ``bucket_rows`` may be switched between
    forwards; ``actions`` holds the policy's per-token actions and log-probabilities of the
    last forward (DTR), with their original positions, turned into the REINFORCE loss by the
    LM-head hook when labels are given.
    """

    call_data = CausalCall
    actions = LastCall("The policy's actions of this thread's last forward (DTR).")

    def __init__(self, method: str, module: nn.Module, layers, keep_ratio, enabled: bool,
                 bucket_rows: bool = True):
        super().__init__(method, module)
        self.method_module = module
        self.layers = tuple(layers)
        self.keep_ratio = keep_ratio
        self.enabled = enabled
        self.bucket_rows = bucket_rows
        self.inner: nn.Module | None = None  # the model whose forward is replaced
        self._handles: list = []

    def unpatch(self, model: nn.Module) -> None:
        """Restore the stock forward and remove the method module and the hooks."""
        inner = self.inner
        if inner is not None:
            restore_forward(inner)
            remove_method_module(inner, self.method_module)
        for handle in self._handles:
            handle.remove()
        remove_state_hooks(model, self)

    def policy_loss(self, logits: Tensor, labels: Tensor, attention_mask: Tensor | None = None,
                    actions: list[dict] | None = None) -> Tensor | None:
        """REINFORCE loss (DTR eq.: L_policy) of ``actions``, by default this thread's last
        forward's, or None."""
        actions = self.actions if actions is None else actions
        if not actions:
            return None
        # Per-position LM loss ℓ_t of predicting token t + 1 (shifted, ignore -100): the
        # rewards' first term. The last position predicts nothing in this window: ℓ = 0.
        lg = logits[:, :-1].float()
        y = labels[:, 1:]
        ce = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), y.reshape(-1), reduction="none",
                             ignore_index=-100).view(y.shape)
        valid = y != -100
        B, T = labels.shape
        token_loss = torch.zeros(B, T, dtype=ce.dtype, device=ce.device)
        token_loss[:, :-1] = ce.detach() * valid
        real = torch.ones(B, T, dtype=torch.bool, device=ce.device)
        real[:, :-1] = valid  # positions whose decisions count (the last one: its cost only)
        if attention_mask is not None and attention_mask.shape == labels.shape:
            real &= attention_mask.bool()
        return self.method_module.reinforce_loss(actions, token_loss, real)


def _policy_hook(state: CausalPatchState, module, args, kwargs, output) -> None:
    """Forward hook on the LM-head model: the REINFORCE loss when ``labels`` are given, from
    the actions of the inner forward that just ended on this thread, added to its losses.

    Registered as ``partial(_policy_hook, state)``, not a closure: ``copy.deepcopy`` copies a
    partial's arguments with the model's memo, so a copy's hook feeds the copy's state.
    """
    labels = kwargs.get("labels")
    data = state.calls.last()
    if module.training and labels is not None and data is not None and data.actions:
        loss = state.policy_loss(output.logits, labels, kwargs.get("attention_mask"), data.actions)
        if loss is not None:
            data.aux_losses.append(loss)


def _is_gpt2(model: nn.Module) -> bool:
    return gpt2_inner(model) is not None


@register_host("hf_causal", kinds=("token",), matches=_is_gpt2, aliases=CAUSAL_ALIASES)
def patch(model: nn.Module, spec, keep_ratio: float | None = None, layers=None,
          enabled: bool = True, bucket_rows: bool = True, **options) -> CausalPatchState:
    """Patch a GPT-2 family model with a causal token method.

    ``method="ltp"`` means ``ltp_causal`` here (the name "ltp" belongs to the encoder LTP).
    ``keep_ratio``: the method's budget (LTP's target kept share); ``1.0`` turns pruning off
    (stock outputs). ``layers``: decision layers (each ≥ 1), default the method's own.
    ``enabled=False`` keeps the method's weights on the model but prunes nothing.
    ``bucket_rows`` (default True): at inference without a KV cache, split the batch after a
    gather into groups of rows with similar kept counts
    (:func:`attnprune.selection.row_groups`) so short rows are
    not padded to the longest; same outputs, fewer FLOPs. Other ``options`` go to the method.
    """
    g = gpt2_inner(model)
    c = g.config
    return patch_causal(model, g, spec, gpt2_forward, "GPT-2 models",
                        {"d_model": c.n_embd, "n_layers": c.n_layer, "n_heads": c.n_head},
                        keep_ratio, layers, enabled, bucket_rows, options)


def patch_causal(model: nn.Module, inner: nn.Module, spec, forward: Callable, label: str,
                 context: dict, keep_ratio, layers, enabled, bucket_rows, options: dict
                 ) -> CausalPatchState:
    """What every causal host does once it found the inner model: check the options, build
    the method from ``context`` (d_model, n_layers, n_heads), replace ``inner``'s forward by
    ``forward`` (a module-level ``forward(state, original, *args, **kwargs)`` running
    :func:`block_loop`), bracket its calls and hook the LM head."""
    if not isinstance(bucket_rows, bool):
        raise ValueError(f"bucket_rows must be True or False, got {bucket_rows!r}")  # noqa: TRY004 (patch() contract: ValueError)
    name = CAUSAL_ALIASES.get(spec.name, spec.name)
    spec = registry.get(name)
    if not spec.cls.causal:
        raise ValueError(
            f"method: {spec.name!r} is not causal (its decision for token t uses later tokens or "
            f"the whole row); {label} take: {', '.join(causal_methods())}")
    n_layers = context["n_layers"]
    if keep_ratio is not None:
        keep_ratio = check_keep_ratio(keep_ratio)
    if layers is not None:
        options["layers"] = layers
    # On the model's device and dtype (a bf16 model patched afterwards runs the method in bf16;
    # integer and bool buffers keep theirs), in the model's mode.
    module = build_method(name, context, inner, **options)
    bad = [l for l in module.layers if not 1 <= l < n_layers]
    if bad:
        raise ValueError(f"layers: decision layers must be in 1..{n_layers - 1}, got {bad}")
    check_attn_implementation(inner.config, label)
    on = bool(enabled) and keep_ratio != 1.0
    state = CausalPatchState(name, module, module.layers, keep_ratio, on, bucket_rows)
    state.inner = inner
    add_method_module(inner, module)  # trained and saved with the model
    # Partials over the state, not closures nor a generated class: the class stays the stock
    # one, and deep copies and pickles carry their own state (see replace_forward).
    replace_forward(inner, forward, state)
    state._handles = bracket_calls(inner, state, state.calls, _check_call)
    if inner is not model:
        state._handles.append(
            model.register_forward_hook(partial(_policy_hook, state), with_kwargs=True))
    if on:  # removed by unpatch (remove_state_hooks) or after its one check
        model.register_forward_hook(partial(_untrained_check, state))
    return state


def _check_call(state: CausalPatchState, data: CausalCall, module, args, kwargs) -> None:
    """At the start of every inner forward (the call's begin): refuse what the pruned block
    loop cannot honour (per-layer output flags while pruning; an attention back-end switched
    after patching)."""
    check_attn_implementation(module.config, type(module).__name__)
    if state.enabled and state.layers:
        refuse_output_flags(module.config, kwargs, "causal host")


# ----------------------------------------------------------------------------- untrained watch
# The causal methods (ltp, dtr, hybrid) learn their decisions and, freshly built, keep every
# token whatever ``keep_ratio`` says. Checked once, at the first eval forward, not at patch
# time: a loader (``from_pretrained``, ``bench lm``) patches first and puts the trained weights
# in after. The hook is a partial over the state, so unpatch removes it (remove_state_hooks).
def _untrained_check(state: CausalPatchState, module: nn.Module, args, output) -> None:
    if module.training:  # training is what makes the decisions; wait for an eval forward
        return
    hooks = hook_dicts(module)[0]
    for key in [k for k, h in hooks.items()  # once: remove this hook
                if isinstance(h, partial) and h.func is _untrained_check and h.args[0] is state]:
        del hooks[key]
    kept = state.stats.get("kept_per_layer") or [0.0]
    if not state.enabled or min(kept) < 1.0 or not _decides_blindly(state, module):
        return
    target = "" if state.keep_ratio is None else f", so keep_ratio={state.keep_ratio} is only its training target"
    warnings.warn(
        f"{state.requested!r} kept every token: {state.method} learns which tokens to drop and "
        f"its decisions are untrained (the same for every input){target}. Train it first (`attnprune lm "
        f"--method {state.requested}`, or your loop adding attnprune.aux_loss(model)) or load "
        f"trained weights; to prune long prompts without training use "
        f"attnprune.prefill.generate(model, input_ids, attention_mask, keep=...)",
        UntrainedMethodWarning, stacklevel=2)


@torch.no_grad()
def _decides_blindly(state: CausalPatchState, model: nn.Module) -> bool:
    """True if the method keeps every token of random inputs at every decision layer with
    scores that do not depend on the input (a fresh LTP's w = 0, a fresh DTR policy's W2 = 0)."""
    method = state.method_module
    p = next(method.parameters(), None)
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if p is None or embeddings is None:
        return False
    d = embeddings.embedding_dim
    x = torch.randn(2, 32, d, generator=torch.Generator().manual_seed(0)).to(p)
    mask = torch.ones(2, 32, dtype=torch.bool, device=p.device)
    for layer in state.layers:
        sel = method(x, mask, keep_ratio=state.keep_ratio, layer=layer)
        if not bool(sel.keep.all()) or sel.scores is None or float(sel.scores.amax() - sel.scores.amin()) > 1e-6:
            return False
    return True
