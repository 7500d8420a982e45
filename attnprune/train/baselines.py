"""The baselines users try before token pruning: a shallower model (layer-dropping).

``keep_first_layers(model, n)`` keeps the first ``n`` transformer layers of a stock Hugging
Face model and drops the rest, in place: the layer ``ModuleList`` is cut and the config's layer
count updated, so the result *is* an ``n``-layer model of the same class (it saves with
``save_pretrained`` and reloads with ``from_pretrained`` as one). Initialised from a fine-tuned
full model and distilled from it (``attnprune finetune --layers N --init-from FULL
--distill-weight 0.5``), it is the "first N layers" baseline of Sajjad et al. (2023, "On the
effect of dropping layers of pre-trained transformer models": top-layer dropping is the
strongest of their simple strategies) against which every pruning point is compared at equal
latency.

Why by hand: transformers has no "truncate the encoder" call; the cut is a ModuleList slice
plus one config field per family (``num_hidden_layers``, DistilBERT's ``n_layers``, GPT-2's
``n_layer``), found here by shape rather than by a per-class table.
"""

from __future__ import annotations

from torch import nn

__all__ = ["keep_first_layers", "layer_count_field", "layer_list"]

# config fields that hold the layer count, by family (BERT/RoBERTa/Llama…, DistilBERT, GPT-2)
_COUNT_FIELDS = ("num_hidden_layers", "n_layers", "n_layer")


def layer_count_field(config) -> str:
    """The name of the config field that holds the model's layer count (``num_hidden_layers``,
    ``n_layers`` or ``n_layer``); ValueError when it has none."""
    for name in _COUNT_FIELDS:
        if isinstance(getattr(config, name, None), int):
            return name
    raise ValueError(f"model: its config ({type(config).__name__}) has none of "
                     f"{', '.join(_COUNT_FIELDS)}; cannot tell how many layers it has")


def layer_list(model: nn.Module) -> tuple[nn.Module, str]:
    """(parent module, attribute name) of the model's transformer-layer ``ModuleList``: the
    first ModuleList under ``model.base_model`` whose length is the config's layer count."""
    config = model.config
    n = getattr(config, layer_count_field(config))
    base = getattr(model, "base_model", model)
    for parent in base.modules():
        for name, child in parent.named_children():
            if isinstance(child, nn.ModuleList) and len(child) == n:
                return parent, name
    raise ValueError(f"model: found no list of {n} layers in {type(base).__name__}")


def keep_first_layers(model: nn.Module, n: int) -> nn.Module:
    """Keep the first ``n`` layers of ``model`` (in place; returns it). ``n`` must be in
    [1, L] for an L-layer model (``n = L`` leaves it unchanged). A patched model is refused:
    truncate first, then patch (the patch's schedule is per layer)."""
    from attnprune.api import patch_state

    if patch_state(model) is not None:
        raise ValueError("layers: truncate the model before patching it (attnprune.unpatch first)")
    field = layer_count_field(model.config)
    total = getattr(model.config, field)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= total:
        raise ValueError(f"layers must be an integer in [1, {total}] for a {total}-layer "
                         f"model, got {n!r}")
    parent, name = layer_list(model)
    setattr(parent, name, nn.ModuleList(list(getattr(parent, name))[:n]))
    setattr(model.config, field, n)
    # per-layer config lists (e.g. ModernBERT / Gemma2 layer_types) must match the new depth
    types_ = getattr(model.config, "layer_types", None)
    if isinstance(types_, list) and len(types_) == total:
        model.config.layer_types = types_[:n]
    return model
