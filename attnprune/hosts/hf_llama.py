"""Causal token pruning for rotary decoder families (Llama, Mistral, Qwen2/3, Gemma/Gemma2, Phi-3).

``attnprune.patch(lm, "ltp" | "dtr" | "hybrid", **options)`` on a ``*ForCausalLM`` (or the bare
``*Model``) of a family in :data:`FAMILIES` swaps the inner model's class for a subclass whose
``forward`` runs the block loop of :class:`attnprune.hosts.hf_causal.CausalBlockLoop`: the same
decisions, gathers, KV-cache handling, row bucketing and relaxed training masks as the GPT-2
host (read its module docstring for the convention and the notation). Layers, attention,
final norm and LM head stay the stock HF modules.

What differs from GPT-2 is how positions enter. GPT-2 adds a position embedding once at the
input; these families rotate q and k inside every layer with (cos, sin) of the token's
position. A kept token must keep its original position, so the forward computes
(cos, sin) once for the chunk, (B, L, d_head), and every block call gathers them with the
compact → original index (``index``, (b, K)) of the tokens still alive. Dropped tokens leave
the tensor exactly as in the GPT-2 host, so later layers never compute them, never attend to
them, and never write them to the KV cache; a decode step's position is layer 0's cache length
(layer 0 never prunes), so cached decoding rotates the new token as a recompute would.

The families share one structure in transformers 5.23 (``embed_tokens`` → ``rotary_emb`` →
``layers`` → ``norm``; layer call ``layer(h, attention_mask=…, position_ids=…,
past_key_values=…, use_cache=…, position_embeddings=(cos, sin))``), so the per-family table
below holds only the facts that differ; ``docs/families.md`` lists the rest.

Sliding windows (Mistral, Gemma2, Qwen2/3 with ``use_sliding_window``): HF masks a window by
query − key index, which after a gather is no longer the distance in positions. While every
position of the sequence is inside the window (max position < W) the window masks nothing and
the plain causal mask is exact; beyond it the host raises ValueError naming
``sliding_window`` rather than attend outside the window silently.

``position_ids`` are never passed to the layers nor to ``create_causal_mask``: gathered ids are
not consecutive and would look like packed sequences (``HF_NOTES.md``). With ``use_cache``
unset the host builds no cache (the GPT-2 host's convention; HF would default it to the
config's ``use_cache``): training and scoring need none, ``generate`` asks for one.

The patched class is generated per stock class (``hf_causal.pruned_class``), so pickle cannot
find it by name: :meth:`PrunedDecoder.__reduce_ex__` stores the stock class and generates the
subclass again on load, so ``torch.save`` / ``torch.load`` and ``pickle`` round-trip a patched
model (``tests/test_pickle.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnprune.hosts import register_host
from attnprune.hosts.compat import BaseModelOutputWithPast
from attnprune.hosts.hf_causal import (
    CausalBlockLoop,
    CausalPatchState,
    _one_cache,
    _Pass,
    cache_kwargs,
    patch_causal,
)
from attnprune.selection import group_overhead_slots

__all__ = ["FAMILIES", "REFUSED", "DecoderFamily", "PrunedDecoder", "family_of"]


@dataclass(frozen=True)
class DecoderFamily:
    """Facts of one family that the host reads (the rest is common; see docs/families.md).

    ``window``: where the config says which layers use a sliding window: "" none,
    "sliding_window" (every layer, when the field is not None: Mistral, Phi-3),
    "layer_types" (the layers marked ``sliding_attention``: Qwen2/3, Gemma2).
    ``layer_use_cache``: the decoder layer's ``forward`` takes ``use_cache`` (Gemma2's does
    not: its cache writes depend on ``past_key_values`` alone).
    """

    model_type: str
    window: str = ""
    layer_use_cache: bool = True


FAMILIES: dict[str, DecoderFamily] = {f.model_type: f for f in (
    DecoderFamily("llama"),
    DecoderFamily("mistral", window="sliding_window"),
    DecoderFamily("qwen2", window="layer_types"),
    DecoderFamily("qwen3", window="layer_types"),
    DecoderFamily("gemma"),
    DecoderFamily("gemma2", window="layer_types", layer_use_cache=False),
    DecoderFamily("phi3", window="sliding_window"),
)}

# Families with the same outer shape whose differences the host does not handle (yet).
REFUSED: dict[str, str] = {
    "gemma3_text": "its rotary embedding differs per layer type (a local base for sliding "
                   "layers, a global one for full layers), one (cos, sin) per type is not wired",
    "gemma3": "a multimodal wrapper around gemma3_text, whose rotary embedding differs per "
              "layer type (not wired)",
    "mixtral": "mixture-of-experts layers: per-expert work and the router's auxiliary loss "
               "under pruning were not checked",
    "qwen2_moe": "mixture-of-experts layers (not checked)",
    "qwen3_moe": "mixture-of-experts layers (not checked)",
}


def _inner(model: nn.Module) -> nn.Module | None:
    """The bare decoder (``*Model``) of a ``*ForCausalLM`` or the model itself, if it has the
    rotary-decoder shape (embed_tokens, layers, norm, rotary_emb)."""
    base = getattr(model, "base_model", model)
    if all(hasattr(base, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return base
    return None


def family_of(model: nn.Module) -> DecoderFamily:
    """The table entry of ``model``; ValueError saying why a family is refused."""
    inner = _inner(model)
    mt = getattr(getattr(inner, "config", None), "model_type", None)
    if inner is None or mt not in FAMILIES:
        why = REFUSED.get(mt, "its layer call and how positions enter were not checked")
        raise ValueError(f"model: {type(model).__name__} (model_type {mt!r}) is not in the causal "
                         f"decoder table: {why}; supported: {', '.join(FAMILIES)}")
    return FAMILIES[mt]


def sliding_window(config, family: DecoderFamily) -> int | None:
    """The window W some layer uses, or None when no layer slides."""
    w = getattr(config, "sliding_window", None)
    if family.window == "layer_types":
        return w if "sliding_attention" in (getattr(config, "layer_types", None) or ()) else None
    return w if family.window == "sliding_window" else None


# A fixed cost of one more group of rows in token slots (see selection.row_groups); None: the
# measured model, selection.group_overhead_slots(d, block="rotary") (tests set their own).
ROTARY_GROUP_OVERHEAD_TOKENS: float | None = None


class PrunedDecoder(CausalBlockLoop):
    """Mixed in before a family's ``*Model`` class: its ``forward`` with pruning (pickles
    through :meth:`CausalBlockLoop.__reduce_ex__`)."""

    def _attnprune_blocks(self) -> nn.ModuleList:
        return self.layers

    def _attnprune_group_overhead(self, width: int) -> float:
        if ROTARY_GROUP_OVERHEAD_TOKENS is not None:
            return ROTARY_GROUP_OVERHEAD_TOKENS
        return group_overhead_slots(width, block="rotary")

    def _attnprune_call(self, run: _Pass, l: int, block: nn.Module, h: Tensor, index: Tensor,
                        mask) -> Tensor:
        # Kept tokens keep their original positions: gather (cos, sin) with the alive index.
        cos, sin = run.rows["cos"], run.rows["sin"]  # (b, L, d_head)
        # Tokens leave only at decision layers (before their block): until the first one the
        # index is the identity and the chunk's (cos, sin) are already in order.
        if run.layers and l >= min(run.layers):
            idx = index[..., None].expand(-1, -1, cos.shape[-1])  # (b, K, d_head)
            cos, sin = torch.gather(cos, 1, idx), torch.gather(sin, 1, idx)
        kw = {"use_cache": run.use_cache} if FAMILIES[self.config.model_type].layer_use_cache else {}
        return block(h, attention_mask=mask, position_embeddings=(cos, sin),
                     **cache_kwargs(run.cache), **kw)

    def forward(self, input_ids=None, attention_mask=None, position_ids=None,
                past_key_values=None, inputs_embeds=None, use_cache=None, cache=None, **kwargs):
        """Same inputs and outputs as the family's ``*Model.forward`` (2D masks only); the
        cache comes as ``cache`` (transformers ≥ 5.24) or ``past_key_values`` (before)."""
        past_key_values = _one_cache(cache, past_key_values)
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("input_ids: give exactly one of input_ids or inputs_embeds")
        if isinstance(attention_mask, dict):
            raise ValueError("attention_mask: the pruning host builds its own per-layer masks; "  # noqa: TRY004 (patch() contract: ValueError)
                             "give the 2D (B, L) padding mask")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)  # Gemma's scaling lives in this module
        B = inputs_embeds.shape[0]
        past_key_values, position_ids = self._attnprune_positions(
            inputs_embeds, past_key_values, use_cache, position_ids)
        w = sliding_window(self.config, FAMILIES[self.config.model_type])
        if w is not None and int(position_ids.max()) >= w:
            raise ValueError(
                f"sliding_window: position {int(position_ids.max())} is outside the window "
                f"({w}); after pruning, window distances are not index distances, and the host "
                f"only runs sequences that fit in the window")
        cos, sin = self.rotary_emb(inputs_embeds, position_ids)  # (1 or B, L, d_head)
        rows = {"cos": cos.expand(B, -1, -1), "sin": sin.expand(B, -1, -1)}
        full = self._attnprune_loop(inputs_embeds, attention_mask, past_key_values, use_cache,
                                    {}, rows)
        return BaseModelOutputWithPast(last_hidden_state=self.norm(full),
                                       **cache_kwargs(past_key_values if use_cache else None))


def _matches(model: nn.Module) -> bool:
    # Every rotary decoder of this shape comes here, so that refused ones hear why.
    return _inner(model) is not None and type(model).__module__.startswith("transformers.")


@register_host("hf_llama", kinds=("token",), matches=_matches)
def patch(model: nn.Module, spec, keep_ratio: float | None = None, layers=None,
          enabled: bool = True, bucket_rows: bool = True, **options) -> CausalPatchState:
    """Patch a Llama-family decoder with a causal token method.

    Same options as the GPT-2 host (:func:`attnprune.hosts.hf_causal.patch`): ``keep_ratio``
    (1.0 = pruning off, stock outputs), ``layers`` (decision layers ≥ 1), ``enabled``,
    ``bucket_rows``; other ``options`` go to the method.
    """
    family = family_of(model)
    inner = _inner(model)
    c = inner.config
    context = {"d_model": c.hidden_size, "n_layers": c.num_hidden_layers,
               "n_heads": c.num_attention_heads}
    return patch_causal(model, inner, spec, PrunedDecoder, f"{family.model_type} models",
                        context, keep_ratio, layers, enabled, bucket_rows, options)
