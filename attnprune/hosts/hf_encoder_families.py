"""Encoder anatomies for the token host (``hf_encoder``): what differs between families.

The token host runs one loop for every encoder: call layer l on the tokens still present,
score, gather the kept ones (ascending original order), go on. What a family adds is read
from the family table (``hosts/families.py``: ``FAMILIES[model_type].token``), the name of an
:class:`Anatomy` here (:data:`ANATOMIES` holds the code of each anatomy, keyed by that name;
the facts of a family, its anatomy's name included, are the table's):

* where the layer loop lives (``encoder``) and its layers in run order (``layers``: ALBERT's
  shared layers are listed once per depth), and the query/key linears the scorer hooks (``qk``);
* ``forward``: what the family's encoder does around the loop (ALBERT's embedding projection,
  ModernBERT's embeddings, RoPE tables, masks and final norm, DeBERTa's output layout);
* ``call``: the layer call, with the position terms of the tokens still present. A gathered
  token keeps its original position: ``index`` (b, K) holds each slot's original position,
  and relative terms are built from index_i − index_j, never from the compact slot numbers;
* ``scores``: the family's own terms in the attention scores, so the scorer's A⁽ˡ⁾ is the
  softmax the layer computed (MPNet's relative bias, DeBERTa's c2p + p2c and √(d·f) scaling,
  ModernBERT's RoPE and local window).

Notation: B batch, b rows of a row group, L length, K tokens still present, H heads, dh head
width, W ModernBERT's half window (``config.sliding_window``).

Per-forward tables that depend only on the tokens present (position bias, relative position
buckets, masks, RoPE cos/sin) are built once per gather and reused by the later layers
(:func:`_cached`, keyed by the identity of ``index`` and the mask); the family's ``forward``
starts a new cache every forward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnprune.compat import attn_implementation

__all__ = ["ANATOMIES", "Anatomy"]


@dataclass(frozen=True)
class Anatomy:
    """One encoder family as the token host sees it (functions, no state: copies of a patched
    model share them safely).

    ``encoder(base) → module`` whose ``forward`` the host replaces; ``layers(base, encoder) →
    [layer per depth]``; ``qk(layer) → (query linear, key linear)`` (the same module twice for
    a fused projection); ``forward(state, inner, original, *args, **kw)`` wraps the pruned loop
    ``inner(state, original, hidden, mask4d)`` (None: the encoder's arguments go straight in);
    ``call(state, i, hidden, mask4d, index) → hidden`` (None: ``layer(hidden, mask4d, **kw)``);
    ``scores(state, i, q, k) → (q, k, extra)`` with ``extra`` (B|1, 1|H, K, K) added to
    q·kᵀ·dh^-½ (None: no terms); ``check(model)`` raises ValueError for configurations the
    anatomy cannot serve.
    """

    encoder: Callable[[nn.Module], nn.Module]
    layers: Callable[[nn.Module, nn.Module], list]
    qk: Callable[[nn.Module], tuple[nn.Module, nn.Module]]
    forward: Callable | None = None
    call: Callable | None = None
    scores: Callable | None = None
    check: Callable[[nn.Module], None] | None = None


def _cached(state, key: str, ident: tuple, make: Callable):
    """``make()`` once per ``ident`` (tensors compared by identity) within one forward."""
    cache = state.calls.current().family_cache
    hit = cache.get(key)
    if hit is not None and len(hit[0]) == len(ident) and all(a is b for a, b in zip(hit[0], ident)):
        return hit[1]
    value = make()
    cache[key] = (ident, value)
    return value


def _shared(index: Tensor) -> Tensor:
    """(1, K) when every row holds the same positions (before any gather ``index`` is
    ``arange(L)`` expanded over the batch: stride 0), else ``index`` itself. Tables built from
    it stay (1, …) like the stock model's, and broadcast over the batch."""
    return index[:1] if index.stride(0) == 0 else index


def _key_mask(mask4d, b: int, k: int, device) -> Tensor:
    """(b, K) bool real keys of the mask the host hands a layer (None, bool, or additive)."""
    if mask4d is None:
        return torch.ones(b, k, dtype=torch.bool, device=device)
    row = mask4d[:, 0, 0, :] if mask4d.dim() == 4 else mask4d
    if row.dtype == torch.bool:
        return row
    return row > torch.finfo(row.dtype).min / 2


# ----------------------------------------------------------------------------- BERT, DistilBERT
def _bert_qk(layer):
    return layer.attention.self.query, layer.attention.self.key


BERT = Anatomy(encoder=lambda base: base.encoder, layers=lambda base, enc: list(enc.layer),
               qk=_bert_qk)
DISTILBERT = Anatomy(encoder=lambda base: base.transformer, layers=lambda base, enc: list(enc.layer),
                     qk=lambda lay: (lay.attention.q_lin, lay.attention.k_lin))


# ----------------------------------------------------------------------------- ALBERT
def _albert_layers(base, enc) -> list:
    """One entry per depth: group g(i) = ⌊i / (n / groups)⌋ (AlbertTransformer's own rule), each
    group's ``inner_group_num`` layers in turn. Shared weights appear several times; the host
    numbers the depths, so schedules and per-layer method settings are per depth."""
    c = base.config
    n, groups = c.num_hidden_layers, c.num_hidden_groups
    return [lay for i in range(n)
            for lay in enc.albert_layer_groups[int(i / (n / groups))].albert_layers]


def _albert_forward(state, inner, original, hidden_states, attention_mask=None, **kwargs):
    """AlbertTransformer projects the embeddings (``embedding_size`` → ``hidden_size``) before
    its layers: done here, so the loop (and the states it scatters into) has width d."""
    if state.enabled:
        hidden_states = state.encoder.embedding_hidden_mapping_in(hidden_states)
    return inner(state, original, hidden_states, attention_mask, **kwargs)


ALBERT = Anatomy(encoder=lambda base: base.encoder, layers=_albert_layers,
                 qk=lambda lay: (lay.attention.query, lay.attention.key),
                 forward=_albert_forward)


# ----------------------------------------------------------------------------- MPNet
def _mpnet_forward(state, inner, original, hidden_states, attention_mask=None, **kwargs):
    """MPNetEncoder: the output flags (``output_attentions``, ``return_dict``, …) are dropped:
    the host calls the layers itself and returns the last states only."""
    if not state.enabled:
        return inner(state, original, hidden_states, attention_mask, **kwargs)
    state.calls.current().family_cache = {}
    return inner(state, original, hidden_states, attention_mask)


def _mpnet_bias(state, index: Tensor) -> Tensor:
    """MPNet's relative position bias (b|1, H, K, K) for the tokens at original positions
    ``index``: bucket(index_j − index_i) (memory − context, MPNetEncoder's sign), with the
    bucket arguments of the stock ``compute_position_bias`` call (its defaults)."""
    enc = state.encoder
    pos = _shared(index)
    rel = pos[:, None, :] - pos[:, :, None]  # (b|1, K, K)
    bucket = enc.relative_position_bucket(rel)
    return enc.relative_attention_bias(bucket).permute(0, 3, 1, 2)  # (b|1, H, K, K)


def _mpnet_call(state, i, hidden, mask4d, index):
    state.calls.current().family_index = index
    bias = _cached(state, "bias", (index,), lambda: _mpnet_bias(state, index))
    return state.layers[i](hidden, mask4d, bias)[0]


def _mpnet_scores(state, i, q, k):
    index = state.calls.current().family_index
    return q, k, _cached(state, "bias", (index,), lambda: _mpnet_bias(state, index))


MPNET = Anatomy(encoder=lambda base: base.encoder, layers=lambda base, enc: list(enc.layer),
                qk=lambda lay: (lay.attention.attn.q, lay.attention.attn.k),
                forward=_mpnet_forward, call=_mpnet_call, scores=_mpnet_scores)


# ----------------------------------------------------------------------------- DeBERTa-v2/v3
def _deberta_check(model) -> None:
    if getattr(model.base_model, "z_steps", 0) > 1:
        raise ValueError("model: DeBERTa-v2 with z_steps > 1 (enhanced mask decoder steps) re-runs "
                         "its last layer on every layer's states, which the token host does not "
                         "keep")


def _deberta_forward(state, inner, original, hidden_states, attention_mask,
                     output_hidden_states=True, output_attentions=False, query_states=None,
                     relative_pos=None, return_dict=True):
    """DebertaV2Encoder: takes the 2-D mask; DebertaV2Model reads the last entry of the
    ``hidden_states`` it returns (not ``last_hidden_state``), so the output holds the final
    states there too (per-layer states are not collected)."""
    if not state.enabled:
        return inner(state, original, hidden_states, attention_mask,
                     output_hidden_states=output_hidden_states,
                     output_attentions=output_attentions, query_states=query_states,
                     relative_pos=relative_pos, return_dict=return_dict)
    if query_states is not None or relative_pos is not None or attention_mask.dim() != 2:
        raise ValueError("attention_mask: the token host serves DeBERTa-v2 with a 2-D padding "
                         "mask and no query_states / relative_pos of the caller")
    from attnprune.compat import BaseModelOutput

    state.calls.current().family_cache = {}
    mask4d = state.mask4d(hidden_states, attention_mask)
    h = inner(state, original, hidden_states, mask4d).last_hidden_state
    return BaseModelOutput(last_hidden_state=h, hidden_states=(h,))


def _deberta_tables(state, hidden, mask4d, index):
    """(attention mask (b, 1, K, K), relative positions, padding mask (b, K), soft key bias or
    None) for the tokens at original positions ``index``.

    Relative positions are index_i − index_j, log-bucketed as DebertaV2Encoder's own
    ``build_relative_position``. Before any gather they are the stock (1, K, K); after one they
    differ per row, and ``disentangled_attention_bias`` (which indexes a (B·H, K, ·) layout)
    takes them as (1, b·H, K, K). The soft bias: ``mask4d`` itself when it is the host's
    additive log-mask (training, ``soft_mode="bias"``: the call's ``soft_bias``), not a hard 0 / −∞
    mask; told by identity, never by reading its values (the sync-free path reads nothing)."""
    from attnprune.compat import deberta_make_log_bucket_position as make_log_bucket_position

    enc = state.encoder
    b, k = hidden.shape[:2]
    soft = mask4d if mask4d is not None and mask4d is state.calls.current().soft_bias else None
    real = _key_mask(mask4d, b, k, hidden.device).long()  # (b, K)
    att = enc.get_attention_mask(real)  # (b, 1, K, K): the stock outer product
    rel = None
    if enc.relative_attention:
        pos = _shared(index)
        rel = pos[:, :, None] - pos[:, None, :]  # (b|1, K, K): query − key
        if enc.position_buckets > 0 and enc.max_relative_positions > 0:
            rel = make_log_bucket_position(rel, enc.position_buckets, enc.max_relative_positions)
        rel = rel.long()
        if rel.shape[0] > 1:
            h = state.n_heads
            rel = rel[:, None].expand(rel.shape[0], h, k, k).reshape(1, -1, k, k)
    return att, rel, real, soft


def _deberta_soft_layer(layer, hidden, att, rel, rel_emb, soft):
    """DebertaV2Layer with the host's soft log-mask bias on the keys. DeBERTa masks its scores
    with a boolean (``masked_fill``), where an additive bias cannot enter, so this path takes
    the scores from :func:`hf_attention.deberta_terms` (the module's own projections and
    c2p/p2c) and adds the bias; the rest is the layer's own modules, in its order."""
    from attnprune.attention import fused_attention
    from attnprune.hosts.hf_attention import deberta_terms

    sa = layer.attention.self
    if "forward" in sa.__dict__:  # an attention method stacked through hf_attention's adapter
        raise ValueError("soft_mode: with an attention method stacked on DeBERTa-v2, the soft "
                         "log-mask bias of soft_mode='bias' cannot reach its attention; patch "
                         "the token method with soft_mode='multiply'")
    q, k, v, terms, scaling = deberta_terms(sa, hidden, None, rel, rel_emb)
    bias = soft if terms is None else terms + soft  # (b, 1|H, K, K)
    ctx = fused_attention(q, k, v, att.bool(), is_causal=False, scaling=scaling,
                          dropout=sa.dropout.p, training=sa.training, bias=bias)
    a = layer.attention.output(ctx.flatten(2), hidden)
    return layer.output(layer.intermediate(a), a)


def _deberta_call(state, i, hidden, mask4d, index):
    enc = state.encoder
    state.calls.current().family_index = index
    att, rel, real, soft = _cached(state, "tables", (index, mask4d),
                                   lambda: _deberta_tables(state, hidden, mask4d, index))
    rel_emb = _cached(state, "rel_embeddings", (), enc.get_rel_embedding)
    if soft is not None:
        out = _deberta_soft_layer(state.layers[i], hidden, att, rel, rel_emb, soft)
    else:
        out = state.layers[i](hidden, att, relative_pos=rel, rel_embeddings=rel_emb)[0]
    if i == 0 and enc.conv is not None:  # the encoder's convolution after its first layer
        out = enc.conv(hidden, out, real)
    return out


def _deberta_scores(state, i, q, k):
    """S = q·kᵀ/√(dh·f) + c2p + p2c, f = 1 + number of position terms: q is returned scaled by
    f^-½ (the host applies dh^-½) and the position terms come from the module's own
    ``disentangled_attention_bias`` on the tables the layer used."""
    att_mod = state.layers[i].attention.self
    tables = state.calls.current().family_cache["tables"][1]
    factor = 1 + sum(t in att_mod.pos_att_type for t in ("c2p", "p2c"))
    extra = None
    if att_mod.relative_attention:
        h = att_mod.num_attention_heads
        q3, k3 = att_mod.transpose_for_scores(q, h), att_mod.transpose_for_scores(k, h)
        rel_emb = _cached(state, "rel_embeddings", (), state.encoder.get_rel_embedding)
        bias = att_mod.disentangled_attention_bias(q3, k3, tables[1], rel_emb, factor)
        extra = bias.view(q.shape[0], h, *bias.shape[1:])  # (B, H, K, K)
    return q * factor ** -0.5, k, extra


DEBERTA = Anatomy(encoder=lambda base: base.encoder, layers=lambda base, enc: list(enc.layer),
                  qk=lambda lay: (lay.attention.self.query_proj, lay.attention.self.key_proj),
                  forward=_deberta_forward, call=_deberta_call, scores=_deberta_scores,
                  check=_deberta_check)


# ----------------------------------------------------------------------------- ModernBERT
def _modernbert_forward(state, inner, original, input_ids=None, attention_mask=None,
                        position_ids=None, inputs_embeds=None, **kwargs):
    """ModernBertModel runs its layers in its own forward (no encoder module): embeddings,
    the pruned loop on padded rows (HF's SDPA path; no unpadding), final norm. The RoPE
    positions are the original ones: ``position_ids`` (one row shared by the batch) or
    0 … L−1."""
    if not state.enabled:
        return original(input_ids=input_ids, attention_mask=attention_mask,
                        position_ids=position_ids, inputs_embeds=inputs_embeds, **kwargs)
    if isinstance(attention_mask, dict):
        raise ValueError("attention_mask: the token host builds ModernBERT's masks itself; pass "  # noqa: TRY004 (patch() contract: ValueError)
                         "the 2-D padding mask")
    if position_ids is not None and position_ids.shape[0] > 1 and not bool(
            (position_ids == position_ids[:1]).all()):
        raise ValueError("position_ids: the token host serves ModernBERT with one row of "
                         "positions shared by the batch (rows of a batch are regrouped "
                         "between layers)")
    from attnprune.compat import BaseModelOutput

    base = state.encoder
    hidden = base.embeddings(input_ids=input_ids, inputs_embeds=inputs_embeds)
    call = state.calls.current()
    call.family_cache = {}
    call.family_positions = None if position_ids is None else position_ids[0]
    mask4d = state.mask4d(hidden, attention_mask)
    h = inner(state, original, hidden, mask4d).last_hidden_state
    return BaseModelOutput(last_hidden_state=base.final_norm(h))


def _modernbert_rope(state, hidden, index, layer_type):
    """(cos, sin) (b|1, K, dh) at the tokens' original positions."""
    pos = _shared(index)
    positions = state.calls.current().family_positions
    if positions is not None:
        pos = positions[pos]
    return state.encoder.rotary_emb(hidden, pos, layer_type)


def _modernbert_window(state, index) -> Tensor:
    """(b|1, 1, K, K) bool: |index_i − index_j| ≤ W, the local layers' window on original
    positions (HF's ``sliding_window_bidirectional_overlay`` on the uncut sequence). Padding
    slots point at position 0 (``gather_tokens``), so their rows see CLS and stay finite."""
    pos = _shared(index)
    return ((pos[:, :, None] - pos[:, None, :]).abs() <= state.config.sliding_window)[:, None]


def _modernbert_local_mask(state, mask4d, index, dtype):
    """The local layers' mask: the global one (None, bool, or additive) and the window, in the
    format of the model's attention implementation (additive for eager)."""
    window = _modernbert_window(state, index)
    if mask4d is not None and mask4d.is_floating_point():
        return torch.where(window, mask4d, torch.finfo(mask4d.dtype).min)
    allowed = window if mask4d is None else window & mask4d
    if attn_implementation(state.config) == "eager":
        return torch.where(allowed, 0.0, torch.finfo(dtype).min).to(dtype)
    return allowed


def _modernbert_call(state, i, hidden, mask4d, index):
    layer = state.layers[i]
    kind = layer.attention_type
    state.calls.current().family_index = index
    rope = _cached(state, "rope:" + kind, (index,),
                   lambda: _modernbert_rope(state, hidden, index, kind))
    if kind == "sliding_attention":
        mask4d = _cached(state, "local", (index, mask4d),
                         lambda: _modernbert_local_mask(state, mask4d, index, hidden.dtype))
    return layer(hidden, attention_mask=mask4d, position_embeddings=rope)


def _modernbert_scores(state, i, q, k):
    """Split the fused Wqkv output, rotate q and k at the original positions; local layers add
    the window (−∞ outside, as the layer's mask)."""
    from attnprune.compat import modernbert_apply_rotary_pos_emb as apply_rotary_pos_emb

    layer = state.layers[i]
    call = state.calls.current()
    index = call.family_index
    b, n, _ = q.shape
    qkv = q.view(b, n, 3, state.n_heads, -1)  # (B, K, 3, H, dh): Wqkv's layout
    cos, sin = call.family_cache["rope:" + layer.attention_type][1]
    qr, kr = apply_rotary_pos_emb(qkv[:, :, 0], qkv[:, :, 1], cos, sin, unsqueeze_dim=2)
    extra = None
    if layer.attention_type == "sliding_attention":
        window = _modernbert_window(state, index)
        extra = torch.where(window, 0.0, torch.finfo(q.dtype).min).to(q.dtype)
    return qr.flatten(2), kr.flatten(2), extra


MODERNBERT = Anatomy(encoder=lambda base: base, layers=lambda base, enc: list(base.layers),
                     qk=lambda lay: (lay.attn.Wqkv, lay.attn.Wqkv),
                     forward=_modernbert_forward, call=_modernbert_call,
                     scores=_modernbert_scores)


ANATOMIES: dict[str, Anatomy] = {"bert": BERT, "distilbert": DISTILBERT, "albert": ALBERT,
                                 "mpnet": MPNET, "deberta": DEBERTA, "modernbert": MODERNBERT}
