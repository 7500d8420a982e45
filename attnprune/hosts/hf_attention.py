"""Host for attention-level and loss methods on any Hugging Face model with the attention
interface (transformers ≥ 5: BERT, DistilBERT, MiniLM, RoBERTa, GPT-2, …).

How it wires a method in (see ``../shared/HF_NOTES.md``):
- registers one stateless attention function under the name ``IMPL`` twice, in
  ``AttentionInterface`` and in ``AttentionMaskInterface`` (with ``sdpa_mask``, so the function
  receives boolean masks, True = attend, or None), then ``model.set_attn_implementation(IMPL)``;
  ``unpatch`` restores the previous implementation;
- finds the self-attention modules (modules with ``scaling`` and ``is_causal`` and a config,
  cross-attention excluded), numbers them in module order (DistilBERT has no ``layer_idx``) and
  puts the patch state on each (``module._attnprune_attention``): the registered function
  finds the state and the layer number from the module it is called with. A global name bound
  to one state (a closure, a bound method) would be shared by ``copy.deepcopy`` copies of the
  model, which then ran the original's method state; reached through the module, the state is
  copied with the model (hooks are ``functools.partial`` over the state for the same reason);
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

from functools import partial

import torch
from torch import nn

from .. import registry
from . import PatchState, add_method_module, register_host, remove_method_module, remove_state_hooks

METHOD_ATTR = "attnprune_method"
# FFN first layers (W1 of eq. 2 in the cost paper), by module-name suffix, per model family
FFN_SUFFIXES = ("intermediate.dense", "ffn.lin1", "mlp.c_fc", "mlp.fc1", "mlp.up_proj")
# The attention implementation name of every patched model (the function behind it holds no
# state, so one registration serves every model and every copy, and is never removed).
IMPL = "attnprune_attention"
STATE_ATTR = "_attnprune_attention"  # on each numbered attention module: the patch state


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
                 layers: dict[nn.Module, int]) -> None:
        super().__init__(method, module)
        self.impl = impl
        self.previous = previous
        # attention module → layer index (module keys, not ids: a deep copy maps them to the
        # copy's modules)
        self.layer_of = layers
        self.handles: list = []
        self.hidden: dict[int, torch.Tensor] = {}
        self.token_mask: torch.Tensor | None = None
        self.need_weights = False  # set by analysis to receive probabilities
        # False = stock attention and no penalties (the full reference on the same weights and
        # batches, as ``attnprune.finetune.evaluate`` does with every host)
        self.enabled = True
        # True when a token method is stacked on the same model (``patch(..., stack=True)``):
        # layers after a gather see fewer, re-ordered tokens (and row groups fewer rows), so
        # the model-level 2-D mask no longer lines up with them; each call then reads the real
        # tokens from the mask it is given, and the FFN hook of the same layer reuses them.
        self.derive_token_mask = False
        self.layer_token_mask: torch.Tensor | None = None

    def attention_fn(self, module, query, key, value, attention_mask, dropout=0.0,
                     scaling=None, **kwargs):
        """The function HF calls in place of its attention (signature of HF_NOTES.md)."""
        layer = self.layer_of.get(module)
        if scaling is None:
            scaling = query.shape[-1] ** -0.5
        if layer is None or not self.enabled:  # stock path (unnumbered module, or disabled)
            from transformers.integrations.sdpa_attention import sdpa_attention_forward

            return sdpa_attention_forward(module, query, key, value, attention_mask,
                                          dropout=dropout, scaling=scaling, **kwargs)
        token_mask = self.token_mask
        if self.derive_token_mask:
            token_mask = self.layer_token_mask = real_tokens(attention_mask, query.shape[-2])
        out, probs = self.modules.attend(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
            layer=layer, hidden=self.hidden.get(layer), aux=self.aux_losses,
            token_mask=token_mask, need_weights=self.need_weights)
        return out, probs

    def unpatch(self, model: nn.Module) -> None:
        """Remove hooks and the state on the attention modules, restore the previous attention
        implementation (the global registration stays: it holds no state, and copies of the
        model may still use it)."""
        for h in self.handles:
            h.remove()
        self.handles.clear()
        remove_state_hooks(model, self)
        model.set_attn_implementation(self.previous)
        for m in self.layer_of:
            m.__dict__.pop(STATE_ATTR, None)
        remove_method_module(model, self.modules)
        self.hidden.clear()


def real_tokens(mask: torch.Tensor | None, tq: int) -> torch.Tensor | None:
    """(B, Tq) bool: the real (non-padding) tokens among the last ``tq`` keys of an attention
    mask (boolean True = attend, or additive float), or None (no mask: all real).

    A key is real iff some query may attend to it: padding keys are masked in every row, and a
    real key is at least visible to itself (bidirectional and causal masks alike)."""
    if mask is None:
        return None
    allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    return allowed.any(dim=-2)[:, 0, -tq:]  # (B, Tq)


def _attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """The function registered under ``IMPL``: the patch state on ``module`` runs it, or the
    stock SDPA for a module without one (cross-attention, an unpatched copy's leftovers)."""
    state = module.__dict__.get(STATE_ATTR)
    if state is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        if scaling is None:
            scaling = query.shape[-1] ** -0.5
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      dropout=dropout, scaling=scaling, **kwargs)
    return state.attention_fn(module, query, key, value, attention_mask, dropout=dropout,
                              scaling=scaling, **kwargs)


def _register() -> None:
    """Register ``IMPL`` (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(IMPL, _attention)
    AttentionMaskInterface.register(IMPL, sdpa_mask)  # both registrations, or masks are None


def _start_forward(state: AttentionPatchState, _mod, args, kwargs) -> None:
    """Forward pre-hook on the model: clear the last forward's data, record the 2-D mask."""
    state.aux_losses.clear()
    state.stats.clear()
    state.hidden.clear()
    m = kwargs.get("attention_mask")
    state.token_mask = m.bool() if isinstance(m, torch.Tensor) and m.dim() == 2 else None


def _grab_hidden(state: AttentionPatchState, i: int, _mod, args, kwargs) -> None:
    """Forward pre-hook on attention module ``i``: its input hidden states."""
    state.hidden[i] = args[0] if args else kwargs.get("hidden_states")


def _penalise(state: AttentionPatchState, _mod, _inp, out) -> None:
    """Forward hook on an FFN first layer: the cost method's activation term."""
    if state.enabled:
        mask = state.layer_token_mask if state.derive_token_mask else state.token_mask
        state.aux_losses.append(state.modules.ffn_term(out, mask))


@register_host("hf_attention", kinds=("attention", "loss"), matches=_matches)
def patch(model: nn.Module, spec: registry.MethodSpec, **options) -> AttentionPatchState:
    """Patch ``model`` with the attention/loss method ``spec`` (options go to the method)."""
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
    state = AttentionPatchState(spec.name, method, IMPL, previous,
                                {m: i for i, m in enumerate(attn)})
    _register()
    model.set_attn_implementation(IMPL)
    for m in attn:
        m.__dict__[STATE_ATTR] = state  # plain attribute: not a submodule, not saved
    add_method_module(model, method)  # METHOD_ATTR, or a free variant when stacked
    state.handles.append(model.register_forward_pre_hook(partial(_start_forward, state),
                                                         with_kwargs=True))
    if method.needs_hidden:
        for i, m in enumerate(attn):
            state.handles.append(m.register_forward_pre_hook(partial(_grab_hidden, state, i),
                                                             with_kwargs=True))
    for lin in ffn:
        state.handles.append(lin.register_forward_hook(partial(_penalise, state)))
    return state
