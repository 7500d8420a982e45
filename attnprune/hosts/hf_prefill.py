"""Wiring of training-free prefill pruning (:mod:`attnprune.prefill`) into the rotary decoder
families the causal host serves (``rotary`` in :data:`attnprune.hosts.families.FAMILIES`:
Llama, Mistral, Qwen2/3, Gemma/Gemma2, Phi-3) and GPT-2.

:class:`RotaryDecoder` (and :class:`GPT2Decoder`) is a thin view of a ``*ForCausalLM`` that
exposes the calls prefill pruning makes, so that :mod:`attnprune.prefill` never touches an HF class: embed ids, rotate
positions, run a range of layers on a (B, K, d) batch with a 2D key-validity mask and a
cache, compute one layer's rotated q (last w tokens) and k (all tokens) for scoring, and the
LM head of the last token. The model is not modified (no class swap, no hook, no config
change): everything a call needs lives in the call.

Notation: B batch, L prompt slots (left padded), K kept slots, d width, H query heads, H_kv
key/value heads (GQA: H = g·H_kv), d_h head width, w scoring window.

Facts this relies on (transformers 5.24; see ``HF_NOTES.md`` "Causal models"):
    * a decoder layer is called ``layer(h, attention_mask=mask4d, position_embeddings=(cos, sin),
      cache=…, use_cache=…)`` and returns the new states (the same call the pruning host makes);
    * the layer's attention computes q = RoPE(norm_q(W_q · LN(h))), k likewise, scores
      q·kᵀ · ``attn.scaling`` (Gemma2: soft-capped by ``attn.attn_logit_softcapping``); the
      module's own ``apply_rotary_pos_emb`` rotates (Phi-3's partial rotary included);
    * ``create_causal_mask(config, h, mask2d, cache, position_ids=None, layer_idx=l)`` sizes the
      mask from layer l's cache, so layers whose caches hold different lengths (FastV: full
      below the cut, pruned above) get their own masks; ``position_ids`` are not passed (kept
      positions are not consecutive and would look like packed sequences).

Sliding windows: while every slot of the sequence (prompt slots + new tokens) is inside the
window the window masks nothing and the plain causal mask is exact; beyond it
:meth:`RotaryDecoder.check_window` raises ValueError naming ``sliding_window`` (as the pruning
host does).

Written by hand: neither transformers nor kvpress run the layers above a cut on fewer tokens
than below it with one cache (kvpress compresses the cache after a full prefill).
"""

from __future__ import annotations

import sys

import torch
from torch import Tensor, nn
from transformers import DynamicCache

from attnprune.compat import create_causal_mask
from attnprune.hosts.hf_causal import cache_kwargs, gpt2_inner
from attnprune.hosts.hf_llama import family_of, rotary_inner, sliding_window

__all__ = ["GPT2Decoder", "RotaryDecoder", "decoder_for"]


class _Decoder:
    """What every family shares: the cache, the mask of a group of layers, the LM head."""

    inner: nn.Module
    config: object
    n_layers: int
    window: int | None = None

    def _layers(self) -> nn.ModuleList:
        raise NotImplementedError

    def _call(self, layer: nn.Module, h: Tensor, mask, rope, cache) -> Tensor:
        raise NotImplementedError

    def _norm(self, h: Tensor) -> Tensor:
        raise NotImplementedError

    def check_window(self, slots: int) -> None:
        """ValueError if a sequence of ``slots`` slots could reach outside a sliding window."""
        if self.window is not None and slots > self.window:
            raise ValueError(
                f"sliding_window: {slots} slots (prompt + new tokens) exceed the window "
                f"({self.window}); after pruning, window distances are not index distances, "
                f"and prefill pruning only runs sequences that fit in the window")

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.config)

    def run(self, start: int, stop: int, h: Tensor, rope, keys: Tensor | None,
            cache: DynamicCache | None) -> Tensor:
        """Layers ``start`` … ``stop − 1`` on ``h`` (B, K, d); ``keys`` (B, past + K) bool marks
        valid keys (the cached ones, then these K), None = all valid (the caller knows: no
        padding, SDPA's is_causal path). Every layer of the range holds the same cached length,
        so one mask serves them all. Reads nothing back from the device."""
        if start >= stop:
            return h
        # allow_is_causal_skip=False: with a padding mask HF would test it on the host
        # (``fast_all``), a device sync per call; the caller passes None when there is none
        mask = create_causal_mask(self.config, h, keys, cache, position_ids=None, layer_idx=start,
                                  allow_is_causal_skip=keys is None)
        for layer in self._layers()[start:stop]:
            h = self._call(layer, h, mask, rope, cache)
        return h

    def logits(self, h_last: Tensor) -> Tensor:
        """(B, d) final states of the last token → (B, V) float logits (Gemma2's final soft-cap
        applied, as its LM forward does)."""
        logits = self.lm_head(self._norm(h_last)).float()
        cap = getattr(self.config, "final_logit_softcapping", None)
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits


def _lm_head(model: nn.Module, inner: nn.Module) -> nn.Module:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None or inner is model:
        raise ValueError(f"model: prefill pruning generates tokens and needs the LM head: give the "
                         f"*ForCausalLM / *LMHeadModel, not the bare {type(model).__name__}")
    return head


class RotaryDecoder(_Decoder):
    """The calls of prefill pruning on a ``*ForCausalLM`` of a rotary family (ValueError for
    other models, naming why)."""

    def __init__(self, model: nn.Module) -> None:
        self.family = family_of(model)  # ValueError for refused families
        self.inner = rotary_inner(model)
        self.lm_head = _lm_head(model, self.inner)
        self.config = self.inner.config
        self.n_layers = len(self.inner.layers)
        self.window = sliding_window(self.config, self.family)

    def _layers(self) -> nn.ModuleList:
        return self.inner.layers

    def _call(self, layer, h, mask, rope, cache):
        kw = {"use_cache": cache is not None} if self.family.layer_use_cache else {}
        return layer(h, attention_mask=mask, position_embeddings=rope, **cache_kwargs(cache), **kw)

    def _norm(self, h):
        return self.inner.norm(h)

    def embed(self, ids: Tensor, positions: Tensor) -> Tensor:
        """(B, K) ids → (B, K, d) (Gemma's √d scaling lives in its embedding module; positions
        enter through :meth:`rope`)."""
        return self.inner.embed_tokens(ids)

    def rope(self, h: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """(cos, sin), each (B, K, d_rot), of the tokens' original positions (B, K)."""
        return self.inner.rotary_emb(h, positions)

    def qk(self, l: int, h: Tensor, rope: tuple[Tensor, Tensor], w: int):
        """Layer l's rotated queries of the last ``w`` slots, (B, H, w, d_h), and keys of every
        slot, (B, H_kv, L, d_h), from its input ``h`` (B, L, d), computed as its attention does;
        returns (q, k, scaling, softcap or None)."""
        layer = self.inner.layers[l]
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        B, L, _ = x.shape
        d_h = attn.head_dim
        if hasattr(attn, "qkv_proj"):  # Phi-3: one fused projection, [q | k | v]
            n_q = self.config.num_attention_heads * d_h
            n_kv = self.config.num_key_value_heads * d_h
            qkv = attn.qkv_proj(x)  # (B, L, (H + 2·H_kv)·d_h); v is computed and dropped
            q, k = qkv[:, L - w:, :n_q], qkv[..., n_q: n_q + n_kv]
        else:
            q, k = attn.q_proj(x[:, L - w:]), attn.k_proj(x)
        q, k = q.view(B, w, -1, d_h), k.view(B, L, -1, d_h)
        if hasattr(attn, "q_norm"):  # Qwen3: RMSNorm per head before the rotation
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, H, w, d_h), (B, H_kv, L, d_h)
        rotate = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        cos, sin = rope
        q, _ = rotate(q, q, cos[:, L - w:], sin[:, L - w:])
        k, _ = rotate(k, k, cos, sin)
        return q, k, float(attn.scaling), getattr(attn, "attn_logit_softcapping", None)


class GPT2Decoder(_Decoder):
    """The calls of prefill pruning on a ``GPT2LMHeadModel``: absolute positions are added once,
    at the input (``wpe``), so a kept token carries its original position with its state."""

    def __init__(self, model: nn.Module) -> None:
        self.inner = gpt2_inner(model)
        self.lm_head = _lm_head(model, self.inner)
        self.config = self.inner.config
        self.n_layers = len(self.inner.h)
        self.window = self.config.n_positions  # positions past the table do not exist

    def _layers(self) -> nn.ModuleList:
        return self.inner.h

    def _call(self, layer, h, mask, rope, cache):
        return layer(h, cache, mask, use_cache=cache is not None)

    def _norm(self, h):
        return self.inner.ln_f(h)

    def check_window(self, slots: int) -> None:
        if slots > self.window:
            raise ValueError(f"n_positions: {slots} slots (prompt + new tokens) exceed the "
                             f"model's {self.window} positions")

    def embed(self, ids: Tensor, positions: Tensor) -> Tensor:
        return self.inner.drop(self.inner.wte(ids) + self.inner.wpe(positions))

    def rope(self, h: Tensor, positions: Tensor) -> None:
        return None

    def qk(self, l: int, h: Tensor, rope, w: int):
        """Block l's queries of the last ``w`` slots (B, H, w, d_h) and keys (B, H, L, d_h)
        from the fused ``c_attn`` on ``ln_1(h)``; (q, k, scaling, None)."""
        block = self.inner.h[l]
        attn = block.attn
        B, L, d = h.shape
        q, k, _ = attn.c_attn(block.ln_1(h)).split(d, dim=2)
        q = q[:, L - w:].view(B, w, -1, attn.head_dim).transpose(1, 2)
        k = k.view(B, L, -1, attn.head_dim).transpose(1, 2)
        return q, k, float(attn.scaling), None


def decoder_for(model: nn.Module) -> _Decoder:
    """The family view of ``model``: GPT-2 or a rotary decoder (ValueError naming why not)."""
    if gpt2_inner(model) is not None:
        return GPT2Decoder(model)
    return RotaryDecoder(model)
