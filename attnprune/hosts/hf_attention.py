"""Host for attention-level and loss methods on any Hugging Face model with the attention
interface (transformers ≥ 5: BERT, DistilBERT, MiniLM, RoBERTa, GPT-2, …).

How it wires a method in (see ``../shared/HF_NOTES.md``):
- registers an attention function under a unique name twice, in ``AttentionInterface`` and
  in ``AttentionMaskInterface`` (with ``sdpa_mask``, so the function receives boolean masks,
  True = attend, or None), then ``model.set_attn_implementation(name)``; ``unpatch`` restores
  the previous implementation and removes both registrations;
- finds the self-attention modules (modules with ``scaling`` and ``is_causal`` and a config,
  cross-attention excluded) and numbers them in module order: per-layer state is keyed by that
  index, looked up by module identity (DistilBERT has no ``layer_idx``);
- methods that need the layer's hidden state (intensity) get it from a forward pre-hook on the
  attention module; the loss method (cost) gets FFN pre-activations from forward hooks on the
  FFN's first linear layer;
- a forward pre-hook on the model clears ``aux_losses`` and ``stats`` and records the 2-D
  ``attention_mask`` (real tokens) for the losses' means.

``state.enabled = False`` runs the stock attention without penalties on the same weights (the
full reference of ``finetune.evaluate``); ``state.need_weights = True`` makes every layer return
its real attention probabilities (``analysis``).

The method module is added to the model as the submodule ``attnprune_method`` so its
parameters (the intensity predictors) train with the model and are saved with it; ``unpatch``
removes it.

Contract of a method of kind "attention" or "loss" served here: an ``nn.Module`` with
``attend(module, query, key, value, mask, *, dropout, scaling, layer, hidden, aux, token_mask,
need_weights) -> (out (B, Tq, H, d), probs (B, H, Tq, Tk) | None)``; class attribute
``needs_hidden``; optionally ``ffn_on`` and ``ffn_term(pre_activation, token_mask)``.
"""

from __future__ import annotations

import itertools

import torch
from torch import nn

from .. import registry
from . import PatchState, register_host

METHOD_ATTR = "attnprune_method"
# FFN first layers (W1 of eq. 2 in the cost paper), by module-name suffix, per model family
FFN_SUFFIXES = ("intermediate.dense", "ffn.lin1", "mlp.c_fc", "mlp.fc1", "mlp.up_proj")
_counter = itertools.count()


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The model's self-attention modules in order (index = layer number)."""
    mods = []
    for m in model.modules():
        if (hasattr(m, "scaling") and hasattr(m, "is_causal") and hasattr(m, "config")
                and not getattr(m, "is_cross_attention", False)
                and "CrossAttention" not in type(m).__name__):
            mods.append(m)
    return mods


def ffn_modules(model: nn.Module, suffixes: tuple[str, ...] = FFN_SUFFIXES) -> list[nn.Module]:
    """The FFN first-layer modules (W1x + b1) in order, found by name suffix."""
    return [m for name, m in model.named_modules() if name.endswith(suffixes)]


def _matches(model: nn.Module) -> bool:
    from transformers import PreTrainedModel

    return (isinstance(model, PreTrainedModel) and hasattr(model, "set_attn_implementation")
            and bool(attention_modules(model)))


def _context(model: nn.Module, n_layers: int) -> dict:
    cfg = model.config
    d = getattr(cfg, "hidden_size", None) or getattr(cfg, "dim", None) or cfg.n_embd
    heads = (getattr(cfg, "num_attention_heads", None) or getattr(cfg, "n_heads", None)
             or cfg.n_head)
    max_pos = (getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
               or 512)
    return {"d_model": int(d), "n_heads": int(heads), "n_layers": n_layers,
            "max_positions": int(max_pos), "n_classes": getattr(cfg, "num_labels", None)}


class AttentionPatchState(PatchState):
    """State of an attention/loss patch: the registered name, hooks and per-forward data."""

    def __init__(self, method: str, module: nn.Module, impl: str, previous: str,
                 layers: dict[int, int]) -> None:
        super().__init__(method, module)
        self.impl = impl
        self.previous = previous
        self.layer_of = layers  # id(attention module) → layer index
        self.handles: list = []
        self.hidden: dict[int, torch.Tensor] = {}
        self.token_mask: torch.Tensor | None = None
        self.need_weights = False  # set by analysis to receive probabilities
        # False = stock attention and no penalties (the full reference on the same weights and
        # batches, as ``attnprune.finetune.evaluate`` does with every host)
        self.enabled = True

    def attention_fn(self, module, query, key, value, attention_mask, dropout=0.0,
                     scaling=None, **kwargs):
        """The function HF calls in place of its attention (signature of HF_NOTES.md)."""
        layer = self.layer_of.get(id(module))
        if scaling is None:
            scaling = query.shape[-1] ** -0.5
        if layer is None or not self.enabled:  # stock path (unnumbered module, or disabled)
            from transformers.integrations.sdpa_attention import sdpa_attention_forward

            return sdpa_attention_forward(module, query, key, value, attention_mask,
                                          dropout=dropout, scaling=scaling, **kwargs)
        out, probs = self.modules.attend(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
            layer=layer, hidden=self.hidden.get(layer), aux=self.aux_losses,
            token_mask=self.token_mask, need_weights=self.need_weights)
        return out, probs

    def unpatch(self, model: nn.Module) -> None:
        """Remove hooks and registrations, restore the previous attention implementation."""
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface

        for h in self.handles:
            h.remove()
        self.handles.clear()
        model.set_attn_implementation(self.previous)
        # GeneralInterface has no public unregister; drop our entries so no stale closure lives on
        AttentionInterface._global_mapping.pop(self.impl, None)
        AttentionMaskInterface._global_mapping.pop(self.impl, None)
        if METHOD_ATTR in model._modules:
            del model._modules[METHOD_ATTR]
        self.hidden.clear()


@register_host("hf_attention", kinds=("attention", "loss"), matches=_matches)
def patch(model: nn.Module, spec: registry.MethodSpec, **options) -> AttentionPatchState:
    """Patch ``model`` with the attention/loss method ``spec`` (options go to the method)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    attn = attention_modules(model)
    ffn_suffixes = tuple(options.pop("ffn_modules", FFN_SUFFIXES))
    method = registry.create(spec.name, context=_context(model, len(attn)), **options)
    ffn = ffn_modules(model, ffn_suffixes) if getattr(method, "ffn_on", False) else []
    if getattr(method, "ffn_on", False) and len(ffn) != len(attn):
        raise ValueError(
            f"ffn_modules: found {len(ffn)} FFN first layers for {len(attn)} attention layers in "
            f"{type(model).__name__}; pass ffn_modules=(name suffixes,) for this model"
        )
    param = next(model.parameters(), None)
    if param is not None:
        method.to(device=param.device)
    previous = model.config._attn_implementation or "eager"
    impl = f"attnprune_{spec.name}_{next(_counter)}"
    state = AttentionPatchState(spec.name, method, impl, previous,
                                {id(m): i for i, m in enumerate(attn)})
    AttentionInterface.register(impl, state.attention_fn)
    AttentionMaskInterface.register(impl, sdpa_mask)  # both registrations, or masks are None
    model.set_attn_implementation(impl)
    model.add_module(METHOD_ATTR, method)

    def start_forward(_mod, args, kwargs):
        state.aux_losses.clear()
        state.stats.clear()
        state.hidden.clear()
        m = kwargs.get("attention_mask")
        state.token_mask = m.bool() if isinstance(m, torch.Tensor) and m.dim() == 2 else None

    state.handles.append(model.register_forward_pre_hook(start_forward, with_kwargs=True))
    if method.needs_hidden:
        for i, m in enumerate(attn):
            def grab(_mod, args, kwargs, i=i):
                x = args[0] if args else kwargs.get("hidden_states")
                state.hidden[i] = x
            state.handles.append(m.register_forward_pre_hook(grab, with_kwargs=True))
    for lin in ffn:
        def penalise(_mod, _inp, out):
            if not state.enabled:
                return
            tm = state.token_mask
            state.aux_losses.append(method.ffn_term(out, tm))
        state.handles.append(lin.register_forward_hook(penalise))
    return state
