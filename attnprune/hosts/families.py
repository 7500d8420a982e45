"""The model-family table: one row of facts per ``config.model_type``, read by every host.

Each host reads the facts of its kind from the same row (:data:`FAMILIES`); a model type not
listed gets the defaults of :class:`Family` (the attention host's generic path, no token host).

* attention and loss methods (``hf_attention``): where the self-attention modules and the FFN's
  first layer are, whether the scores come through HF's attention interface or an adapter,
  whether layers share one module (``attention``, ``ffn``, ``ffn_first_half``, ``scores``,
  ``depth``, ``refused``);
* token methods on encoders (``hf_encoder``): which anatomy of ``hf_encoder_families`` runs the
  layer loop, and which classifiers read only CLS (``token``, ``token_refused``, ``cls_head``);
* token methods on rotary decoders (``hf_llama``, and prefill pruning through ``hf_prefill``):
  whether the host serves the family, where the config says which layers slide, whether the
  layer takes ``use_cache`` (``rotary``, ``window``, ``layer_use_cache``, ``rotary_refused``).

Pure data (no torch, no transformers, nothing of attnprune): a host imports it, never another
host, for the facts. Rows hold module-level functions and tuples only, so a patch state that
keeps its row (``hf_attention``) still pickles.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["FAMILIES", "FFN_SUFFIXES", "Family", "family", "rotary_families"]

# FFN first layers (W1 of eq. 2 in the cost paper), by module-name suffix, for a model whose
# family is not in FAMILIES
FFN_SUFFIXES = ("intermediate.dense", "ffn.lin1", "mlp.c_fc", "mlp.fc1", "mlp.up_proj")


@dataclass(frozen=True)
class Family:
    """Facts about one model family (``config.model_type``) that the hosts read.

    The attention host (``hf_attention``) reads:
    ``attention``: class names of the self-attention modules; empty = found generically (a
    module with ``scaling``, ``is_causal`` and ``config``: BERT, GPT-2, Llama, … all have them).
    ``ffn``: module-name suffixes of the FFN's first layer (W1x + b1 of the cost paper).
    ``ffn_first_half``: that layer is a fused [activated | linear] projection (Phi-3's
    ``gate_up_proj``, ModernBERT's ``Wi``): the pre-activation is its first half.
    ``scores``: ``"interface"`` = the module calls HF's attention interface with
    (q, k, v, mask, scaling, softcap…); otherwise the name of an adapter in
    ``hf_attention.ADAPTERS`` that replaces the module's forward for families computing scores
    in their own forward.
    ``depth``: for families whose layers share one module (ALBERT), the number of times the
    shared attention runs per forward; each run is its own layer for the method.
    ``refused``: why the family cannot be patched (a ValueError says it).

    The encoder token host (``hf_encoder``) reads:
    ``token``: the name of the encoder's anatomy in ``hf_encoder_families.ANATOMIES`` (where the
    layers live, what a layer call takes, the position terms a gathered token must keep);
    None = not an encoder that host serves (decoders have their own token hosts).
    ``token_refused``: why token methods cannot run on the family (a ValueError says it).
    ``cls_head``: ``*ForSequenceClassification`` class names whose head reads only
    ``hidden[:, 0]`` (CLS, kept at position 0 by every gather), so the token host may return
    the short gathered batch (``output="auto"``).

    The rotary decoder token host (``hf_llama``) and prefill pruning (``hf_prefill``) read:
    ``rotary``: the family is served (its layer call and how positions enter were checked,
    ``docs/families.md``).
    ``window``: where the config says which layers use a sliding window: "" none,
    "sliding_window" (every layer, when the field is not None: Mistral, Phi-3),
    "layer_types" (the layers marked ``sliding_attention``: Qwen2/3, Gemma2).
    ``layer_use_cache``: the decoder layer's ``forward`` takes ``use_cache`` (Gemma2's does
    not: its cache writes depend on ``past_key_values`` alone).
    ``rotary_refused``: why a family of the same outer shape is not served (a ValueError says
    it).
    """

    attention: tuple[str, ...] = ()
    ffn: tuple[str, ...] = FFN_SUFFIXES
    ffn_first_half: bool = False
    scores: str = "interface"
    depth: Callable[[object], int] | None = None
    refused: str | None = None
    token: str | None = None
    token_refused: str | None = None
    cls_head: tuple[str, ...] = ()
    rotary: bool = False
    window: str = ""
    layer_use_cache: bool = True
    rotary_refused: str | None = None


_BERT_FFN = ("intermediate.dense",)


def _albert_depth(config) -> int:
    """ALBERT's attention runs per forward (a module-level function, not a lambda: the family
    table is reached from patched models, which must pickle)."""
    return config.num_hidden_layers * config.inner_group_num


# SwiGLU / GeGLU decoders: act(gate_proj x) ⊙ up_proj x. The activation (and so the sparsity the
# cost paper's ReLU(W1x + b1) term asks for) is on gate_proj; up_proj is linear, sign-symmetric.
_GATED_FFN = ("mlp.gate_proj",)
FAMILIES: dict[str, Family] = {
    "bert": Family(ffn=_BERT_FFN, token="bert", cls_head=("BertForSequenceClassification",)),
    "roberta": Family(ffn=_BERT_FFN, token="bert",
                      cls_head=("RobertaForSequenceClassification",)),
    "xlm-roberta": Family(ffn=_BERT_FFN, token="bert",
                          cls_head=("XLMRobertaForSequenceClassification",)),
    "camembert": Family(ffn=_BERT_FFN, token="bert",
                        cls_head=("CamembertForSequenceClassification",)),
    # ELECTRA projects its embeddings to the hidden width before the encoder (outside the loop)
    "electra": Family(ffn=_BERT_FFN, token="bert",
                      cls_head=("ElectraForSequenceClassification",)),
    "distilbert": Family(ffn=("ffn.lin1",), token="distilbert",
                         cls_head=("DistilBertForSequenceClassification",)),
    "gpt2": Family(ffn=("mlp.c_fc",)),
    "llama": Family(ffn=_GATED_FFN, rotary=True),
    "mistral": Family(ffn=_GATED_FFN, rotary=True, window="sliding_window"),
    "qwen2": Family(ffn=_GATED_FFN, rotary=True, window="layer_types"),
    "qwen3": Family(ffn=_GATED_FFN, rotary=True, window="layer_types"),
    "gemma": Family(ffn=_GATED_FFN, rotary=True),
    "gemma2": Family(ffn=_GATED_FFN, rotary=True, window="layer_types", layer_use_cache=False),
    "phi3": Family(ffn=("mlp.gate_up_proj",), ffn_first_half=True, rotary=True,
                   window="sliding_window"),
    # one AlbertLayer per (group, inner index), run num_hidden_layers times in turn
    "albert": Family(ffn=("ffn",), depth=_albert_depth,
                     token="albert", cls_head=("AlbertForSequenceClassification",)),
    "mpnet": Family(attention=("MPNetSelfAttention",), ffn=_BERT_FFN, scores="mpnet",
                    token="mpnet", cls_head=("MPNetForSequenceClassification",)),
    "deberta-v2": Family(attention=("DisentangledSelfAttention",), ffn=_BERT_FFN,
                         scores="deberta", token="deberta",
                         cls_head=("DebertaV2ForSequenceClassification",)),
    # no ``scaling`` attribute (it passes head_dim**-0.5 to the interface), hence the name;
    # no cls_head: its classifier pools by config (``classifier_pooling`` "mean" reads every
    # position)
    "modernbert": Family(attention=("ModernBertAttention",), ffn=("mlp.Wi",),
                         ffn_first_half=True, token="modernbert"),
    "deberta": Family(refused=(
        "DeBERTa v1 computes its scores inside its own forward (a fused in_proj, its own "
        "c2p/p2c terms, optional talking-head mixing of the scores across heads) and no "
        "adapter is written for it; DeBERTa-v2/v3 (model_type 'deberta-v2') is supported"),
        token_refused=(
        "DeBERTa v1's relative positions are built inside its encoder for consecutive tokens "
        "and no anatomy is written for it (hf_encoder_families), so gathered tokens would lose "
        "their original relative positions; DeBERTa-v2/v3 (model_type 'deberta-v2') is "
        "supported")),
    # Rotary decoders with the same outer shape whose differences the token host does not
    # handle (yet); the attention host serves them with the generic defaults.
    "gemma3_text": Family(rotary_refused=(
        "its rotary embedding differs per layer type (a local base for sliding layers, a global "
        "one for full layers), one (cos, sin) per type is not wired")),
    "gemma3": Family(rotary_refused=(
        "a multimodal wrapper around gemma3_text, whose rotary embedding differs per layer type "
        "(not wired)")),
    "mixtral": Family(rotary_refused=(
        "mixture-of-experts layers: per-expert work and the router's auxiliary loss under "
        "pruning were not checked")),
    "qwen2_moe": Family(rotary_refused="mixture-of-experts layers (not checked)"),
    "qwen3_moe": Family(rotary_refused="mixture-of-experts layers (not checked)"),
}


def family(model) -> Family:
    """The facts of ``model``'s family (the generic defaults for a model type not listed)."""
    cfg = getattr(model, "config", None)
    return FAMILIES.get(getattr(cfg, "model_type", None), Family())


def rotary_families() -> list[str]:
    """The model types the rotary decoder token host serves, in table order."""
    return [k for k, f in FAMILIES.items() if f.rotary]
