"""Causal token pruning for rotary decoder families (Llama, Mistral, Qwen2/3, Gemma/Gemma2, Phi-3).

``attnprune.patch(lm, "ltp" | "dtr" | "hybrid", **options)`` on a ``*ForCausalLM`` (or the bare
``*Model``) of a family marked ``rotary`` in :data:`attnprune.hosts.families.FAMILIES`
replaces the inner model's ``forward`` by :func:`rotary_forward`
(:func:`attnprune.hosts.replace_forward`; the class stays the stock one), which runs the
block loop of :func:`attnprune.hosts.hf_causal.block_loop`: the same decisions, gathers,
KV-cache handling, row bucketing, relaxed training masks and per-call state as the GPT-2 host
(read its module docstring for the convention and the notation).
Layers, attention, final norm and LM head stay the stock HF modules.

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
past_key_values=…, use_cache=…, position_embeddings=(cos, sin))``), so the family table (``hosts/families.py``: ``rotary``,
``window``, ``layer_use_cache``, ``rotary_refused``) holds only the facts that differ;
``docs/families.md`` lists the rest.

Sliding windows (Mistral, Gemma2, Qwen2/3 with ``use_sliding_window``): HF masks a window by
query − key index, which after a gather is no longer the distance in positions. While every
position of the sequence is inside the window (max position < W) the window masks nothing and
the plain causal mask is exact; beyond it the host raises ValueError naming
``sliding_window`` rather than attend outside the window silently.

``position_ids`` are never passed to the layers nor to ``create_causal_mask``: gathered ids are
not consecutive and would look like packed sequences (``HF_NOTES.md``). With ``use_cache``
unset the host builds no cache (the GPT-2 host's convention; HF would default it to the
config's ``use_cache``): training and scoring need none, ``generate`` asks for one.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnprune.compat import BaseModelOutputWithPast
from attnprune.hosts import register_host
from attnprune.hosts.families import FAMILIES, Family, rotary_families
from attnprune.hosts.hf_causal import (
    CAUSAL_ALIASES,
    BlockPass,
    CausalPatchState,
    block_loop,
    cache_kwargs,
    one_cache,
    patch_causal,
    positions,
)
from attnprune.selection import group_overhead_slots

__all__ = ["family_of", "rotary_forward", "rotary_inner", "sliding_window"]


def rotary_inner(model: nn.Module) -> nn.Module | None:
    """The bare decoder (``*Model``) of a ``*ForCausalLM`` or the model itself, if it has the
    rotary-decoder shape (embed_tokens, layers, norm, rotary_emb)."""
    base = getattr(model, "base_model", model)
    if all(hasattr(base, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return base
    return None


def family_of(model: nn.Module) -> Family:
    """The table entry of ``model`` (``hosts.families.FAMILIES``, a row with ``rotary``);
    ValueError saying why a family is refused."""
    inner = rotary_inner(model)
    mt = getattr(getattr(inner, "config", None), "model_type", None)
    fam = FAMILIES.get(mt)
    if inner is None or fam is None or not fam.rotary:
        why = ((fam.rotary_refused if fam is not None else None)
               or "its layer call and how positions enter were not checked")
        raise ValueError(f"model: {type(model).__name__} (model_type {mt!r}) is not in the causal "
                         f"decoder table: {why}; supported: {', '.join(rotary_families())}")
    return fam


def sliding_window(config, family: Family) -> int | None:
    """The window W some layer uses, or None when no layer slides."""
    w = getattr(config, "sliding_window", None)
    if family.window == "layer_types":
        return w if "sliding_attention" in (getattr(config, "layer_types", None) or ()) else None
    return w if family.window == "sliding_window" else None


# A fixed cost of one more group of rows in token slots (see selection.row_groups); None: the
# measured model, selection.group_overhead_slots(d, block="rotary") (tests set their own).
ROTARY_GROUP_OVERHEAD_TOKENS: float | None = None


def _rotary_call(run: BlockPass, l: int, block: nn.Module, h: Tensor, index: Tensor, mask) -> Tensor:
    # Kept tokens keep their original positions: gather (cos, sin) with the alive index.
    cos, sin = run.rows["cos"], run.rows["sin"]  # (b, L, d_head)
    # Tokens leave only at decision layers (before their block): until the first one the
    # index is the identity and the chunk's (cos, sin) are already in order.
    if run.layers and l >= min(run.layers):
        idx = index[..., None].expand(-1, -1, cos.shape[-1])  # (b, K, d_head)
        cos, sin = torch.gather(cos, 1, idx), torch.gather(sin, 1, idx)
    kw = {"use_cache": run.use_cache} if FAMILIES[run.config.model_type].layer_use_cache else {}
    return block(h, attention_mask=mask, position_embeddings=(cos, sin),
                 **cache_kwargs(run.cache), **kw)


def rotary_forward(state: CausalPatchState, original, input_ids=None, attention_mask=None,
                   position_ids=None, past_key_values=None, inputs_embeds=None, use_cache=None,
                   cache=None, **kwargs):
    """The family's ``*Model.forward`` with pruning, installed by
    :func:`attnprune.hosts.replace_forward` (``original``, the stock forward, is not called):
    same inputs and outputs (2D masks only); the cache comes as ``cache`` (transformers ≥
    5.24) or ``past_key_values`` (before)."""
    m = state.inner
    past_key_values = one_cache(cache, past_key_values)
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("input_ids: give exactly one of input_ids or inputs_embeds")
    if isinstance(attention_mask, dict):
        raise ValueError("attention_mask: the pruning host builds its own per-layer masks; "  # noqa: TRY004 (patch() contract: ValueError)
                         "give the 2D (B, L) padding mask")
    if inputs_embeds is None:
        inputs_embeds = m.embed_tokens(input_ids)  # Gemma's scaling lives in this module
    B = inputs_embeds.shape[0]
    past_key_values, position_ids = positions(m.config, inputs_embeds, past_key_values,
                                              use_cache, position_ids)
    w = sliding_window(m.config, FAMILIES[m.config.model_type])
    if w is not None and int(position_ids.max()) >= w:
        raise ValueError(
            f"sliding_window: position {int(position_ids.max())} is outside the window "
            f"({w}); after pruning, window distances are not index distances, and the host "
            f"only runs sequences that fit in the window")
    cos, sin = m.rotary_emb(inputs_embeds, position_ids)  # (1 or B, L, d_head)
    rows = {"cos": cos.expand(B, -1, -1), "sin": sin.expand(B, -1, -1)}
    overhead = (ROTARY_GROUP_OVERHEAD_TOKENS if ROTARY_GROUP_OVERHEAD_TOKENS is not None
                else group_overhead_slots(inputs_embeds.shape[-1], block="rotary"))
    full = block_loop(state, m, inputs_embeds, attention_mask, past_key_values, use_cache, {},
                      rows, m.layers, _rotary_call, overhead)
    return BaseModelOutputWithPast(last_hidden_state=m.norm(full),
                                   **cache_kwargs(past_key_values if use_cache else None))


def _matches(model: nn.Module) -> bool:
    # Every rotary decoder of this shape comes here, so that refused ones hear why.
    return rotary_inner(model) is not None and type(model).__module__.startswith("transformers.")


@register_host("hf_llama", kinds=("token",), matches=_matches, aliases=CAUSAL_ALIASES)
def patch(model: nn.Module, spec, keep_ratio: float | None = None, layers=None,
          enabled: bool = True, bucket_rows: bool = True, **options) -> CausalPatchState:
    """Patch a Llama-family decoder with a causal token method.

    Same options as the GPT-2 host (:func:`attnprune.hosts.hf_causal.patch`): ``keep_ratio``
    (1.0 = pruning off, stock outputs), ``layers`` (decision layers ≥ 1), ``enabled``,
    ``bucket_rows``; other ``options`` go to the method.
    """
    family_of(model)  # ValueError for a refused family
    inner = rotary_inner(model)
    c = inner.config
    context = {"d_model": c.hidden_size, "n_layers": c.num_hidden_layers,
               "n_heads": c.num_attention_heads}
    return patch_causal(model, inner, spec, rotary_forward, f"{c.model_type} models",
                        context, keep_ratio, layers, enabled, bucket_rows, options)
