"""Training-free prefill pruning for decoders (Llama family, GPT-2): a shorter time to first
token on long prompts.

Two ways of spending a long prompt's prefill on fewer tokens, with no training:

* **FastV** (Chen et al. 2024, "An image is worth 1/2 tokens after layer 2", §4.2): layers
  0 … K−1 run on every prompt token; the tokens' scores at layer K choose the ones that layers
  K … N−1 run on. Layers below the cut keep the full KV cache, layers above it the pruned one.
* **GemFilter** (Shi et al. 2024, "Discovering the gems in early layers", Alg. 1): layers
  0 … K−1 run (no cache) only to score at layer K; then every layer runs again on the kept
  tokens, so the whole cache is pruned.

Both score a prompt token by the attention the last w prompt tokens give it at layer K (the
observation window of SnapKV, Li et al. 2024, §4; GemFilter's w = 1), from layer K's own
rotated q and k (computed for that layer only; SDPA everywhere else), and always keep the
first ``sinks`` tokens (attention sinks, StreamingLLM, Xiao et al. 2024) and the window.
Kept tokens keep their original positions (RoPE), dropped ones leave the tensor, and the
generated tokens decode with the pruned cache.

Notation: B batch, L prompt slots (rows left padded), n real tokens of a row, N layers, K the
scoring / cut layer (``layer``), H query heads, H_kv key/value heads, g = H / H_kv, w window,
ρ keep ratio (``keep`` as a float), k kept tokens per row.

    A^h_ij = softmax_j(s · q^h_i · k^h_jᵀ), i over the last w slots, j ≤ i real   (layer K)
    I_j    = (1 / (H · w_real)) Σ_h Σ_i A^h_ij                                     (score)
    keep   = sinks ∪ window ∪ top-k of I,  k = ⌊ρ · n⌋ (or ``keep`` tokens), protected
             tokens counting toward k (all kept if they outnumber it)

Why a function and not ``attnprune.patch``: the patch contract is a model whose ``forward``
keeps the stock signature, makes causal per-token decisions (a decode step decides as a full
recompute would) and equals the stock model at ``keep_ratio=1``. Prefill pruning is a one-off,
non-causal decision about a *prompt* (the last tokens rank the earlier ones) made before
decoding, which a forward cannot tell from a training window; and HF ``generate`` builds one
attention mask from layer 0's cache, which is wrong for layers whose caches were cut (FastV with
padding). So this module owns the generation loop: :func:`generate` (greedy), or
:func:`prefill` then :func:`decode` for a loop of one's own. The HF wiring lives in
:mod:`attnprune.hosts.hf_prefill` (a view per family); the model is never modified.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from attnprune.selection import topk_keep

__all__ = ["Generation", "PrefillConfig", "Prefilled", "decode", "generate", "kept_index",
           "prefill", "select_kept", "window_scores"]

METHODS = ("fastv", "gemfilter")


@dataclass(frozen=True)
class PrefillConfig:
    """Options of prefill pruning (ValueError naming the field when one is wrong).

    ``keep``: a float ρ ∈ (0, 1] keeps k = ⌊ρ · n⌋ tokens of each row (1.0 = keep all); an int
    ≥ 1 keeps that many (a budget). ``method``: "fastv" or "gemfilter". ``layer``: K, the
    layer whose q/k score the tokens (FastV: the first layer that runs on the kept tokens;
    GemFilter: layers below it run once to score). Default: FastV's K = 2 of 32 (N / 16, at
    least 1); GemFilter's layer 13 of 32 for Llama-3.1-8B (≈ 0.4 N). ``window``: the last w
    tokens, which score and are always kept. ``sinks``: the first tokens, always kept.
    ``score``: "attention" (I_j), or "random" (uniform scores, seeded: the control that tells
    the scoring from the mere budget, sinks and window).
    """

    keep: float | int = 0.5
    method: str = "fastv"
    layer: int | None = None
    window: int = 16
    sinks: int = 4
    score: str = "attention"

    def __post_init__(self) -> None:
        k = self.keep
        if isinstance(k, bool) or not isinstance(k, (int, float)):
            raise ValueError(f"keep: a ratio in (0, 1] or a token budget ≥ 1, got {k!r}")  # noqa: TRY004 (options contract: ValueError naming the field)
        if isinstance(k, float) and not 0.0 < k <= 1.0:
            raise ValueError(f"keep: a float is a ratio in (0, 1], got {k!r} (an int is a budget)")
        if isinstance(k, int) and k < 1:
            raise ValueError(f"keep: an int is a token budget ≥ 1, got {k!r}")
        if self.score not in ("attention", "random"):
            raise ValueError(f"score: 'attention' or 'random', got {self.score!r}")
        if self.method not in METHODS:
            raise ValueError(f"method: one of {', '.join(METHODS)}, got {self.method!r}")
        if self.layer is not None and (isinstance(self.layer, bool) or not isinstance(self.layer, int)
                                       or self.layer < 0):
            raise ValueError(f"layer: a layer index ≥ 0, got {self.layer!r}")
        for name in ("window", "sinks"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (1 if name == "window" else 0):
                raise ValueError(f"{name}: an int ≥ {1 if name == 'window' else 0}, got {v!r}")

    def cut(self, n_layers: int) -> int:
        """K for a model of ``n_layers`` layers (ValueError if out of range)."""
        if self.layer is None:
            return max(1, n_layers // 16) if self.method == "fastv" else max(1, round(0.4 * n_layers))
        if not self.layer < n_layers:
            raise ValueError(f"layer: must be in 0..{n_layers - 1} for this model, got {self.layer}")
        return self.layer


# -- scoring and selection (pure tensor functions) ------------------------------------------------
def window_scores(q: Tensor, k: Tensor, keys: Tensor, scaling: float,
                  softcap: float | None = None) -> Tensor:
    """I_j (B, L): attention received by each slot from the last w slots, averaged over the H
    heads and the real queries of the window (0 on padding).

    ``q`` (B, H, w, d_h) rotated queries of the last w slots; ``k`` (B, H_kv, L, d_h) rotated
    keys (GQA: query head h reads key head h // g, as HF's ``repeat_kv``); ``keys`` (B, L) bool
    real slots (rows left padded, so the window's slots are the last ones).
    """
    B, H, w, d_h = q.shape
    H_kv, L = k.shape[1], k.shape[2]
    g = H // H_kv
    s = (q.reshape(B, H_kv, g * w, d_h) @ k.transpose(-1, -2)).float() * scaling  # (B, H_kv, g·w, L)
    if softcap is not None:  # Gemma2 caps the logits before the mask
        s = torch.tanh(s / softcap) * softcap
    i = torch.arange(L - w, L, device=q.device)  # the window's slots
    allowed = (torch.arange(L, device=q.device)[None] <= i[:, None])[None] & keys[:, None, :]  # (B, w, L)
    allowed = allowed[:, None, None].expand(B, 1, g, w, L).reshape(B, 1, g * w, L)
    p = torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1)
    real_q = keys[:, L - w:]  # (B, w): a short row's window starts in its padding
    p = torch.where(real_q.repeat(1, g)[:, None, :, None], p, 0.0)  # pad queries: NaN → 0
    n_q = (H * real_q.sum(1)).clamp_min(1).to(p.dtype)  # H · w_real
    return p.sum(dim=(1, 2)) / n_q[:, None]


def select_kept(scores: Tensor, real: Tensor, keep: float, sinks: int, window: int) -> Tensor:
    """(B, L) bool: each row's first ``sinks`` and last ``window`` real tokens, then the
    highest-scoring ones up to k (ratio: ⌊ρ · n⌋; int: ``keep``); ties go to the earlier token."""
    pos = real.long().cumsum(1) - 1  # (B, L) rank of a real token in its row
    n = real.sum(1, keepdim=True)
    protect = real & ((pos < sinks) | (pos >= n - window))
    if isinstance(keep, float):
        return topk_keep(scores, real, keep_ratio=keep, protect=protect)
    return topk_keep(scores, real, k=keep, protect=protect)


def kept_index(keep: Tensor) -> tuple[Tensor, Tensor]:
    """(index (B, K), mask (B, K)): the slots of the kept tokens in ascending order, right
    aligned (rows with fewer kept tokens padded on the left, as the prompt was), K = the
    largest kept count. Pad slots hold dropped slots' indices; ``mask`` is False there."""
    B, L = keep.shape
    K = max(int(keep.sum(1).max()), 1) if B else 1
    slot = torch.arange(L, device=keep.device).expand(B, L)
    index = torch.sort(torch.where(keep, slot + L, slot), dim=1).indices[:, L - K:]  # (B, K)
    return index, torch.gather(keep, 1, index)


def _take(t: Tensor, index: Tensor) -> Tensor:
    """t (B, L, ...) at ``index`` (B, K) along dim 1."""
    return torch.gather(t, 1, index.view(*index.shape, *([1] * (t.dim() - 2))).expand(
        *index.shape, *t.shape[2:]))


# -- prefill and decode ------------------------------------------------------------------------------
@dataclass
class Prefilled:
    """A pruned prefill, ready to decode: per-call state (the model is untouched).

    ``logits`` (B, V) predict the first new token; ``kept`` (B, L) marks the prompt tokens in
    the pruned layers' cache (every real token below a FastV cut); ``scores`` (B, L) are I_j;
    ``groups`` the layer ranges that share one cached length, ``keys`` their (B, cached) key
    validity and ``padded`` whether those hold padding (decided once, at the prefill, so that
    a decode step reads nothing back from the device); ``positions`` (B,) the position of the
    next token; ``slots`` the sequence's length so far (prompt slots + decoded tokens), which
    a sliding window bounds.
    """

    logits: Tensor
    kept: Tensor
    scores: Tensor
    cache: object
    groups: list[tuple[int, int]]
    keys: list[Tensor]
    padded: list[bool]
    positions: Tensor
    slots: int
    decoder: object = field(repr=False)


@torch.inference_mode()
def prefill(model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None = None,
            config: PrefillConfig | None = None, max_new_tokens: int = 0, **options) -> Prefilled:
    """Run the prompt (B, L) (left padded; ``attention_mask`` 1 = real) with pruning.

    ``options`` are :class:`PrefillConfig`'s fields (or give ``config``); ``max_new_tokens``
    only checks up front that the generation will fit a sliding window (:func:`decode` checks
    each step anyway). The prefill reads a few values back from the device (the kept counts
    set the pruned cache's length); the decode steps read none.
    """
    from attnprune.hosts.hf_prefill import decoder_for

    cfg = config if config is not None else PrefillConfig(**options)
    dec = decoder_for(model)
    L = input_ids.shape[1]
    real = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    if attention_mask is not None and bool((real[:, 1:] < real[:, :-1]).any()):
        raise ValueError("attention_mask: rows must be left padded (padding before the prompt)")
    dec.check_window(L + max_new_tokens)
    padded = attention_mask is not None and not bool(real.all())
    K, N = cfg.cut(dec.n_layers), dec.n_layers
    positions = (real.long().cumsum(1) - 1).clamp_min(0)  # (B, L) as HF generate numbers them
    cache = dec.new_cache()
    h = dec.embed(input_ids, positions)  # (B, L, d)
    rope = dec.rope(h, positions)  # rotary families' (cos, sin); None for GPT-2
    h = dec.run(0, K, h, rope, real if padded else None, cache if cfg.method == "fastv" else None)
    w = min(cfg.window, L)
    q, k, scaling, softcap = dec.qk(K, h, rope, w)
    scores = window_scores(q, k, real, scaling, softcap)  # (B, L)
    if cfg.score == "random":  # the control: same budget, sinks and window, random choice
        scores = torch.rand(real.shape, generator=torch.Generator().manual_seed(0)).to(scores) * real
    kept = select_kept(scores, real, cfg.keep, cfg.sinks, cfg.window)
    index, kmask = kept_index(kept)  # (B, K'), right aligned
    kpadded = not bool(kmask.all())  # rows kept different counts
    rope_k = None if rope is None else (_take(rope[0], index), _take(rope[1], index))
    if cfg.method == "fastv":
        h = dec.run(K, N, _take(h, index), rope_k, kmask if kpadded else None, cache)
        groups, keys, pads = [(0, K), (K, N)], [real, kmask], [padded, kpadded]
    else:  # GemFilter: every layer again, on the kept tokens only
        kept_ids, kept_pos = torch.gather(input_ids, 1, index), torch.gather(positions, 1, index)
        h = dec.run(0, N, dec.embed(kept_ids, kept_pos), rope_k, kmask if kpadded else None, cache)
        groups, keys, pads = [(0, N)], [kmask], [kpadded]
    return Prefilled(logits=dec.logits(h[:, -1]), kept=kept, scores=scores, cache=cache,
                     groups=groups, keys=keys, padded=pads, positions=positions[:, -1] + 1,
                     slots=L, decoder=dec)


@torch.inference_mode()
def decode(state: Prefilled, ids: Tensor) -> Tensor:
    """One decode step: the next tokens ``ids`` (B, 1) through the pruned cache; returns their
    logits (B, V) and advances ``state`` (cache, key masks, positions). ValueError naming
    ``sliding_window`` (GPT-2: ``n_positions``) when the sequence would outgrow the model's
    window, before anything changes. Reads nothing back from the device."""
    dec = state.decoder
    dec.check_window(state.slots + 1)
    pos = state.positions[:, None]  # (B, 1)
    h = dec.embed(ids, pos)  # (B, 1, d)
    rope = dec.rope(h, pos)
    for i, (start, stop) in enumerate(state.groups):
        state.keys[i] = torch.cat([state.keys[i], torch.ones_like(ids, dtype=torch.bool)], dim=1)
        h = dec.run(start, stop, h, rope, state.keys[i] if state.padded[i] else None, state.cache)
    state.positions = state.positions + 1
    state.slots += 1
    return dec.logits(h[:, -1])


@dataclass
class Generation:
    """``tokens`` (B, T) greedy new tokens, ``logits`` (B, T, V) their float logits, ``kept``
    (B, L) the prompt tokens the pruned layers kept, ``scores`` (B, L) their scores I_j."""

    tokens: Tensor
    logits: Tensor
    kept: Tensor
    scores: Tensor


@torch.inference_mode()
def generate(model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None = None,
             max_new_tokens: int = 16, **options) -> Generation:
    """Greedy generation after a pruned prefill (``options``: :class:`PrefillConfig`'s fields).

    ``keep=1.0`` gives the stock model's greedy tokens (HF ``generate`` with the same left
    padding). Every row generates ``max_new_tokens`` tokens (no end-of-sequence stop).
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: an int ≥ 1, got {max_new_tokens!r}")
    state = prefill(model, input_ids, attention_mask, max_new_tokens=max_new_tokens, **options)
    logits, tokens = [state.logits], [state.logits.argmax(-1, keepdim=True)]
    for _ in range(max_new_tokens - 1):
        logits.append(decode(state, tokens[-1]))
        tokens.append(logits[-1].argmax(-1, keepdim=True))
    return Generation(torch.cat(tokens, 1), torch.stack(logits, 1), state.kept, state.scores)
