"""Host for attention-level and loss methods on Hugging Face models (transformers ≥ 5):
BERT, DistilBERT, RoBERTa, XLM-R, CamemBERT, ELECTRA, ALBERT, MPNet, DeBERTa-v2/v3,
ModernBERT, GPT-2, Llama, Mistral, Qwen2, Qwen3, Gemma, Gemma 2, Phi-3
(``docs/families_attention.md`` has the table of what is tested).

One generic host reads its facts from the family table every host reads
(``hosts/families.py``: ``FAMILIES``, keyed by ``config.model_type``): which modules are the
self-attention, which linear layer is the FFN's W1, whether a fused FFN projection's first
half is the activated one, whether the scores come through HF's attention interface or need an
adapter, and whether layers share one module.
A family not listed gets the generic defaults; one that cannot be served says why.

How it wires a method in (see ``../shared/HF_NOTES.md``):
- interface families: registers one stateless attention function under the name ``IMPL``
  twice, in ``AttentionInterface`` and in ``AttentionMaskInterface`` (with ``sdpa_mask``, so
  the function receives boolean masks, True = attend, or None; sliding windows arrive in that
  mask), then ``model.set_attn_implementation(IMPL)``; ``unpatch`` restores the previous one.
  A back-end chosen after patching (``set_attn_implementation("eager")``) would run the stock
  attention behind the method's back: the model's pre-hook sees it at the next forward, keeps
  it as the one ``unpatch`` restores and sets ``IMPL`` again, so the method keeps running;
- own-forward families (MPNet, DeBERTa-v2: scores, position terms and softmax in one forward):
  an adapter replaces the attention module's forward (instance attribute) and hands q, k, v and
  the position terms (``bias``) to the same state, so the methods see the scores the family's
  softmax sees;
- what the function passes to a method, whatever the family: key/value heads repeated to the
  query heads (grouped-query attention, :func:`repeat_kv_heads`), the family's ``softcap``
  (Gemma 2) and additive ``bias`` (MPNet, DeBERTa), the queries' ``positions`` when the model
  passes position ids;
- finds the self-attention modules (the family's class names, else modules with ``scaling``
  and ``is_causal`` and a config, cross-attention excluded), numbers them in module order
  (DistilBERT has no ``layer_idx``) and puts the patch state on each
  (``module._attnprune_attention``): the registered function finds the state from the module
  it is called with. A global name bound to one state (a closure, a bound method) would be
  shared by ``copy.deepcopy`` copies of the model, which then ran the original's method state;
  reached through the module, the state is copied with the model (hooks and adapters are
  ``functools.partial`` over the state, ``hosts.replace_forward``, for the same reason;
  module-level functions, so a patched model also pickles);
- the data of one forward (layer running now, real tokens, position ids, hidden states, losses)
  is a :class:`PerCall` of the state's ``calls`` (:class:`attnprune.hosts.Calls`), begun at the
  model's entry, per thread and nested: threads calling one patched model at once, and a
  forward run inside another, never see each other's;
- a forward pre-hook on each attention module says which layer runs now and, for methods that
  need it (intensity), records its input hidden state. ALBERT runs one module at every depth:
  the runs are numbered in call order, so per-layer method settings (crisp's sparsity list and
  adaptive schedule, intensity's predictors, cost's terms) are per depth, never shared by
  accident between depths that share weights;
- the loss method (cost) gets FFN pre-activations from forward hooks on the FFN's first layer;
- the call's begin (a forward pre-hook on the model) records the 2-D ``attention_mask`` (real
  tokens) for the losses' means; ``aux_losses`` and ``stats`` read the calling thread's last
  call.

The registration under ``IMPL`` is process-wide: transformers' attention modules look their
function up by name in the global ``ALL_ATTENTION_FUNCTIONS`` and its mask builders check the
global ``AttentionMaskInterface._global_mapping`` (transformers 5.17 and 5.24 alike; an
interface instance's local mapping is never read), so one stateless function is registered
once and finds each model's state from the module it is called with.

``state.enabled = False`` runs the stock attention without penalties on the same weights (the
full reference of ``finetune.evaluate``); ``state.need_weights = True`` makes every layer return
its real attention probabilities (``analysis``), and so does ``output_attentions=True`` for one
call: ``outputs.attentions`` holds the probabilities each layer used (after the method's top-k,
modulation or family terms; (B, H, Tq, Tk), one per attention run). ``config.output_attentions
= True`` does the same: a patched model's config gets a generated subclass whose setter
accepts the flag (transformers' accepts it only with "eager"; :class:`AttentionWeightsConfig`).

The method module is added to the model as the submodule ``attnprune_method`` so its
parameters (the intensity predictors) train with the model and are saved with it; ``unpatch``
removes it.

Contract of a method of kind "attention" or "loss" served here: an ``nn.Module`` with
``attend(module, query, key, value, mask, *, dropout, scaling, layer, hidden, aux, token_mask,
need_weights, softcap, bias, positions) -> (out (B, Tq, H, d), probs (B, H, Tq, Tk) | None)``
(query, key and value with the same H heads); class attribute ``needs_hidden``; optionally
``ffn_on`` and ``ffn_term(pre_activation, token_mask)``.
"""

from __future__ import annotations

import copyreg
from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from attnprune.attention import (
    allowed_keys,
    fused_attention,
    masked_scores,
    score_bias,
    softmax_rows,
)
from attnprune.compat import (
    attn_implementation,
    config_output_attentions,
    set_config_output_attentions,
)
from attnprune.hosts import (
    CallData,
    Calls,
    LastCall,
    PatchState,
    add_method_module,
    bracket_calls,
    register_host,
    remove_method_module,
    remove_state_hooks,
    replace_forward,
    restore_forward,
)
from attnprune.hosts.families import Family, family
from attnprune.methods import registry

# The attention implementation name of every patched model (the function behind it holds no
# state, so one registration serves every model and every copy, and is never removed).
IMPL = "attnprune_attention"
STATE_ATTR = "_attnprune_attention"  # on each numbered attention module: the patch state


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The model's distinct self-attention modules in order (index = layer number, except for
    shared-layer families, where the call order numbers the layers)."""
    names = family(model).attention
    mods = []
    for m in model.modules():
        if names:
            if type(m).__name__ in names:
                mods.append(m)
        elif (hasattr(m, "scaling") and hasattr(m, "is_causal") and hasattr(m, "config")
                and not getattr(m, "is_cross_attention", False)
                and "CrossAttention" not in type(m).__name__):
            mods.append(m)
    return mods


def ffn_modules(model: nn.Module, suffixes: tuple[str, ...] | None = None) -> list[nn.Module]:
    """The FFN first-layer modules (W1x + b1) in order, found by name suffix (the family's by
    default)."""
    suffixes = family(model).ffn if suffixes is None else tuple(suffixes)
    return [m for name, m in model.named_modules() if name.endswith(suffixes)]


def _matches(model: nn.Module) -> bool:
    """Any transformers model: ``patch`` then says why when a family cannot be served."""
    from transformers import PreTrainedModel

    return isinstance(model, PreTrainedModel) and hasattr(model, "set_attn_implementation")


def _context(model: nn.Module, n_layers: int) -> dict:
    cfg = model.config
    d = getattr(cfg, "hidden_size", None) or getattr(cfg, "dim", None) or cfg.n_embd
    heads = (getattr(cfg, "num_attention_heads", None) or getattr(cfg, "n_heads", None)
             or cfg.n_head)
    max_pos = (getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
               or 512)
    return {"d_model": int(d), "n_heads": int(heads), "n_layers": n_layers,
            "max_positions": int(max_pos), "n_classes": getattr(cfg, "num_labels", None)}


def repeat_kv_heads(query: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """Grouped-query attention: key/value heads (B, H_kv, T, d) repeated to the H query heads.

    Query head h reads key/value head h // (H / H_kv), the grouping HF's own GQA kernels use,
    so every method then acts per query head (crisp's top-k, intensity's factor, cost's
    entropy) exactly as on a model with H full heads."""
    h, h_kv = query.shape[1], kv.shape[1]
    if h == h_kv:
        return kv
    if h % h_kv:
        raise ValueError(f"num_key_value_heads: {h_kv} key/value heads do not divide {h} query "
                         f"heads")
    return kv.repeat_interleave(h // h_kv, dim=1)


class PerCall(CallData):
    """The data of one forward (:class:`attnprune.hosts.Calls`): which layer runs, the real
    tokens, the position ids, the hidden states the method reads, whether the caller asked for
    attention weights, and the losses and statistics the forward leaves for its caller.

    Per call and thread: one patched model called from several threads at once (a web
    server's thread pool) gives each call its own, so no request is scored with another's
    mask, layer or hidden states. The hooks hand the data along within one thread: the model's
    pre-hook, the attention modules' pre-hooks and the attention function of one forward run
    in the thread that called the model (on CPU, backward too; a GPU's autograd threads would
    see no running call if a forward were recomputed there, as activation checkpointing does,
    which this host does not support).
    """

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0  # attention runs in this forward (numbers the layers of shared families)
        self.current = 0  # layer number of the attention module running now
        self.hidden: dict[int, torch.Tensor] = {}
        self.token_mask: torch.Tensor | None = None  # (B, T) bool, the model's 2-D mask
        self.positions: torch.Tensor | None = None  # the model's position_ids of this forward
        self.layer_token_mask: torch.Tensor | None = None  # real tokens of this layer (stacked)
        self.output_attentions = False  # the caller asked for the attention weights


class AttentionPatchState(PatchState):
    """State of an attention/loss patch: the registered name, hooks and settings; the data of
    a forward is a :class:`PerCall` of ``calls``, per call and thread.

    ``aux_losses`` and ``stats`` read the calling thread's: a caller sees the losses of its
    own last forward, whatever other threads run meanwhile."""

    aux_losses = LastCall()
    stats = LastCall()

    def __init__(self, method: str, module: nn.Module, impl: str, previous: str | None,
                 layers: dict[nn.Module, int], fam: Family, n_layers: int) -> None:
        self.calls = Calls(PerCall)  # before PatchState's __init__, which sets aux_losses and stats
        super().__init__(method, module)
        self.impl = impl
        self.previous = previous  # None: the attention implementation was not switched
        # attention module → layer index (module keys, not ids: a deep copy maps them to the
        # copy's modules)
        self.layer_of = layers
        self.family = fam
        self.n_layers = n_layers
        self.shared = fam.depth is not None
        self.handles: list = []
        self.need_weights = False  # set by analysis to receive probabilities
        # False = stock attention and no penalties (the full reference on the same weights and
        # batches, as ``attnprune.research.finetune.evaluate`` does with every host)
        self.enabled = True
        # True when a token method is stacked on the same model (``patch(..., stack=True)``):
        # layers after a gather see fewer, re-ordered tokens (and row groups fewer rows), so
        # the model-level 2-D mask no longer lines up with them; each call then reads the real
        # tokens from the mask it is given, and the FFN hook of the same layer reuses them.
        self.derive_token_mask = False

    def attention_fn(self, module, query, key, value, attention_mask, dropout=0.0,
                     scaling=None, bias=None, **kwargs):
        """The function HF calls in place of its attention (signature of HF_NOTES.md); the
        adapters of own-forward families call it too, with their position terms as ``bias``."""
        if kwargs.get("s_aux") is not None:
            raise ValueError("model: attention sinks (s_aux) are not supported by the "
                             "attention methods")
        call = self.calls.current()
        layer = self.layer_of.get(module)
        if layer is not None and self.shared:
            layer = call.current
        if scaling is None:
            scaling = query.shape[-1] ** -0.5
        if bias is None:  # families passing an additive score term through the interface
            bias = kwargs.get("position_bias")  # (T5-style relative bias, MPT's ALiBi)
        key, value = repeat_kv_heads(query, key), repeat_kv_heads(query, value)
        tq = query.shape[-2]
        causal = bool(getattr(module, "is_causal", False))
        if attention_mask is None and causal and 1 < tq < key.shape[-2]:
            # HF skips the mask with more keys than queries only when prefilling an empty
            # static cache: the keys after the queries are empty slots (HF's SDPA path crops
            # them too). The methods read "no mask, causal" as queries = the last Tq keys.
            key, value = key[:, :, :tq], value[:, :, :tq]
            bias = None if bias is None else bias[..., :tq]
        softcap = kwargs.get("softcap")
        # the caller's output_attentions (the model's pre-hook, or this layer's own argument)
        # asks for the probabilities the method used, as need_weights does for analysis
        need_weights = (self.need_weights or call.output_attentions
                        or bool(kwargs.get("output_attentions")))
        if layer is None or not self.enabled:  # stock path (unnumbered module, or disabled)
            if need_weights:  # the stock probabilities, as HF's eager attention returns them
                allowed = allowed_keys(attention_mask, causal, tq, key.shape[-2], query.device)
                probs = softmax_rows(masked_scores(query, key, scaling, allowed, softcap=softcap,
                                                   bias=score_bias(attention_mask, key.shape[-2],
                                                                   bias)))
                probs = probs.to(value.dtype)
                dropped = torch.nn.functional.dropout(probs, p=dropout, training=module.training)
                return torch.matmul(dropped, value).transpose(1, 2).contiguous(), probs
            out = fused_attention(query, key, value, attention_mask, is_causal=causal,
                                  scaling=scaling, dropout=dropout, training=module.training,
                                  softcap=softcap, bias=bias)
            return out, None
        token_mask = call.token_mask
        positions = kwargs.get("position_ids")
        if not isinstance(positions, torch.Tensor):
            positions = call.positions
        if self.derive_token_mask:
            # a stacked token method gathered tokens: the model-level mask and position ids no
            # longer line up with this layer's tokens
            token_mask = call.layer_token_mask = real_tokens(attention_mask, query.shape[-2])
            positions = kwargs.get("position_ids") if isinstance(kwargs.get("position_ids"),
                                                                 torch.Tensor) else None
        out, probs = self.modules.attend(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
            layer=layer, hidden=call.hidden.get(layer), aux=call.aux_losses,
            token_mask=token_mask, need_weights=need_weights, softcap=softcap,
            bias=bias, positions=positions)
        return out, probs

    def unpatch(self, model: nn.Module) -> None:
        """Remove hooks, adapters and the state on the attention modules, restore the previous
        attention implementation (the global registration stays: it holds no state, and copies
        of the model may still use it)."""
        for h in self.handles:
            h.remove()
        self.handles.clear()
        remove_state_hooks(model, self)
        if self.previous is not None and attn_implementation(model.config) == self.impl:
            # else the user chose a back-end after the last forward: theirs stays
            model.set_attn_implementation(self.previous)
        restore_configs(model)
        for m in self.layer_of:
            m.__dict__.pop(STATE_ATTR, None)
            restore_forward(m)  # an adapter's (own-forward families)
        remove_method_module(model, self.modules)


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
        from attnprune.compat import sdpa_attention_forward

        if scaling is None:
            scaling = query.shape[-1] ** -0.5
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      dropout=dropout, scaling=scaling, **kwargs)
    return state.attention_fn(module, query, key, value, attention_mask, dropout=dropout,
                              scaling=scaling, **kwargs)


# Adapters: families whose attention modules compute scores in their own forward instead of
# calling the attention interface. Each replaces the module's forward (``replace_forward``:
# ``partial(adapter, state, module, stock forward)``, removed by ``unpatch``), computes q, k, v
# and the family's score terms with the module's own layers and methods, and hands them to the
# patch state as (query, key, value, mask, bias). The stock forward goes unused: the adapter
# is the whole attention.


def _split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, T, H·d) → (B, H, T, d)."""
    b, t, _ = x.shape
    return x.view(b, t, n_heads, -1).transpose(1, 2)


def _mpnet_forward(state: AttentionPatchState, module, _stock, hidden_states,
                   attention_mask=None, position_bias=None, output_attentions=False, **kwargs):
    """MPNetSelfAttention: S = QKᵀ/√d + relative position bias (B|1, H, T, T) + mask."""
    h = module.num_attention_heads
    q, k, v = (_split_heads(proj(hidden_states), h) for proj in (module.q, module.k, module.v))
    out, probs = state.attention_fn(
        module, q, k, v, attention_mask, dropout=module.dropout.p if module.training else 0.0,
        scaling=module.attention_head_size ** -0.5, bias=position_bias,
        output_attentions=output_attentions)
    o = module.o(out.flatten(2))
    return (o, probs) if output_attentions else (o,)


def deberta_terms(module, hidden_states, query_states=None, relative_pos=None,
                  rel_embeddings=None):
    """DisentangledSelfAttention (DeBERTa-v2/v3): S = QKᵀ/√(d·f) + c2p + p2c, f = 1 + number
    of position terms. Returns q, k, v (B, H, T, d), the c2p + p2c terms (B, H, Tq, Tk) or
    None, and the scaling (d·f)^-½, from the module's own layers and its
    ``disentangled_attention_bias`` (on its (B·H, T, d) layout). Also used by the token host
    (``hf_encoder_families``) for DeBERTa's soft-mask path."""
    h = module.num_attention_heads
    x_q = hidden_states if query_states is None else query_states
    q = module.transpose_for_scores(module.query_proj(x_q), h)  # (B·H, Tq, d)
    k = module.transpose_for_scores(module.key_proj(hidden_states), h)
    v = module.transpose_for_scores(module.value_proj(hidden_states), h)
    factor = 1 + sum(t in module.pos_att_type for t in ("c2p", "p2c"))
    bias = None
    if module.relative_attention:
        bias = module.disentangled_attention_bias(
            q, k, relative_pos, module.pos_dropout(rel_embeddings), factor)  # (B·H, Tq, Tk)
    b = hidden_states.shape[0]

    def four_d(x):
        return x.view(b, h, *x.shape[1:])

    return (four_d(q), four_d(k), four_d(v), None if bias is None else four_d(bias),
            (q.shape[-1] * factor) ** -0.5)


def _deberta_forward(state: AttentionPatchState, module, _stock, hidden_states, attention_mask,
                     output_attentions=False, query_states=None, relative_pos=None,
                     rel_embeddings=None):
    """DisentangledSelfAttention's scores (:func:`deberta_terms`): the c2p/p2c terms enter
    as the bias."""
    q, k, v, bias, scaling = deberta_terms(module, hidden_states, query_states, relative_pos,
                                           rel_embeddings)
    if query_states is not None:  # the intensity predictor reads what the queries come from
        call = state.calls.current()
        call.hidden[call.current] = query_states
    out, probs = state.attention_fn(
        module, q, k, v, attention_mask.bool(),
        dropout=module.dropout.p if module.training else 0.0, scaling=scaling, bias=bias,
        output_attentions=output_attentions)
    return out.flatten(2), (probs if output_attentions else None)


ADAPTERS: dict[str, Callable] = {"mpnet": _mpnet_forward, "deberta": _deberta_forward}


# ``config.output_attentions = True``: transformers' setter (and its ``validate``) refuse any
# back-end but "eager", the only stock one that returns weights, with advice (switch to eager)
# that would switch a patched model's method off. The forward argument never passes that
# check: it goes straight to the layers, whose attention function here returns the
# probabilities the method used. A patched model's configs get a subclass (generated per
# config class, swapped in per instance, swapped back by ``unpatch``) whose setter accepts the
# flag, so the config path works like the argument.


class AttentionWeightsConfig:
    """Mixed in before a patched model's config class: ``output_attentions`` may be set, as
    the attention host returns the probabilities its methods used."""

    _attnprune_stock: type  # the config class it was generated for

    @property
    def output_attentions(self):
        return config_output_attentions(self)

    @output_attentions.setter
    def output_attentions(self, value: bool) -> None:
        set_config_output_attentions(self, value)

    def validate(self) -> None:
        """transformers' checks, but for the weights check on the flag (see above)."""
        probe = self
        if config_output_attentions(self):  # a copy without the flag: never unset the user's
            probe = object.__new__(type(self))
            probe.__dict__.update(self.__dict__)
            set_config_output_attentions(probe, False)
        super(AttentionWeightsConfig, probe).validate()

    def to_dict(self) -> dict:
        """The stock serialisation without a set ``output_attentions``: a saved config (and
        ``attnprune.save_pretrained``'s) describes the stock model on the back-end it is
        loaded with, where transformers refuses the flag unless that is "eager"; set it
        again after loading."""
        d = super().to_dict()
        if d.get("output_attentions"):
            del d["output_attentions"]
        return d

    def __reduce_ex__(self, protocol):
        # a generated class cannot be found by name: pickle, torch.save and deep copies store
        # the stock class and generate the subclass again when loading
        rv = super().__reduce_ex__(protocol)
        if isinstance(rv, tuple) and rv[0] is copyreg.__newobj__ and rv[1] == (type(self),):
            return (_rebuild_config, (self._attnprune_stock,), *rv[2:])
        return rv


def _config_eq(self, other) -> bool:
    # the stock classes' dataclass ``__eq__`` holds a config of another class unequal;
    # compare as ``PretrainedConfig`` does, so a patched config equals its stock twin
    from transformers import PretrainedConfig

    return isinstance(other, PretrainedConfig) and self.__dict__ == other.__dict__


def weights_config_class(stock: type) -> type:
    """A subclass of config class ``stock`` that accepts ``output_attentions`` (same name, so
    transformers' auto classes still find the model class by it). Not cached: each call gives
    a new class, so no table of classes outlives the models."""
    if issubclass(stock, AttentionWeightsConfig):
        return stock
    return type(stock.__name__, (AttentionWeightsConfig, stock),
                {"__qualname__": stock.__qualname__, "_attnprune_stock": stock,
                 "__eq__": _config_eq, "__hash__": stock.__hash__})


def _rebuild_config(stock: type):
    cls = weights_config_class(stock)
    return cls.__new__(cls)


def _configs(model: nn.Module, attn: list[nn.Module]) -> list:
    """The distinct configs of ``model`` and its attention modules (by identity)."""
    from transformers import PretrainedConfig

    found: dict[int, object] = {}
    for owner in (model, *attn):
        cfg = getattr(owner, "config", None)
        if isinstance(cfg, PretrainedConfig):
            found.setdefault(id(cfg), cfg)
    return list(found.values())


def weights_configs(model: nn.Module, attn: list[nn.Module]) -> None:
    """Swap the class of ``model``'s configs for :func:`weights_config_class`'s."""
    for cfg in _configs(model, attn):
        cfg.__class__ = weights_config_class(type(cfg))


def restore_configs(model: nn.Module) -> None:
    """Swap the configs of ``model`` and its modules back to their stock classes."""
    for cfg in _configs(model, list(model.modules())):
        if isinstance(cfg, AttentionWeightsConfig):
            cfg.__class__ = cfg._attnprune_stock


def _register() -> None:
    """Register ``IMPL`` (idempotent)."""
    from transformers import AttentionInterface

    from attnprune.compat import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(IMPL, _attention)
    AttentionMaskInterface.register(IMPL, sdpa_mask)  # both registrations, or masks are None


def _start_forward(state: AttentionPatchState, call: PerCall, mod, args, kwargs) -> None:
    """A forward of the model begins (``bracket_calls``): the 2-D mask, the position ids and
    whether attention weights are asked for, in the new call (the last forward's losses and
    statistics stay with that call: a caller still holding its list keeps it)."""
    if state.previous is not None and attn_implementation(mod.config) != state.impl:
        # ``set_attn_implementation`` after patching switched the method off without a word
        # (the stock back-end ran, patch_state still named the method): the user's choice
        # becomes the back-end ``unpatch`` restores, and the method keeps running
        state.previous = attn_implementation(mod.config)
        mod.set_attn_implementation(state.impl)
    m = kwargs.get("attention_mask")
    call.token_mask = m.bool() if isinstance(m, torch.Tensor) and m.dim() == 2 else None
    # generate() gives left-padded rows position_ids that start at their first real token
    p = kwargs.get("position_ids")
    call.positions = p if isinstance(p, torch.Tensor) else None
    want = kwargs.get("output_attentions")
    if want is None:
        want = getattr(getattr(mod, "config", None), "output_attentions", False)
    call.output_attentions = bool(want)


def _enter_layer(state: AttentionPatchState, i: int, needs_hidden: bool, _mod, args,
                 kwargs) -> None:
    """Forward pre-hook on attention module ``i``: which layer runs now (for a shared module,
    the next one in call order, modulo the depth in case a caller skipped the model's own
    forward) and, for methods that read it, its input hidden states."""
    call = state.calls.current()
    if state.shared:
        call.current = call.calls % state.n_layers
        call.calls += 1
    else:
        call.current = i
    if needs_hidden:
        call.hidden[call.current] = args[0] if args else kwargs.get("hidden_states")


def _penalise(state: AttentionPatchState, _mod, _inp, out) -> None:
    """Forward hook on an FFN first layer: the cost method's activation term."""
    if state.enabled:
        if state.family.ffn_first_half:
            out = out.chunk(2, dim=-1)[0]
        call = state.calls.current()
        mask = call.layer_token_mask if state.derive_token_mask else call.token_mask
        call.aux_losses.append(state.modules.ffn_term(out, mask))


@register_host("hf_attention", kinds=("attention", "loss"), matches=_matches,
               options=("ffn_modules",))  # taken out of **options by the host itself
def patch(model: nn.Module, spec: registry.MethodSpec, **options) -> AttentionPatchState:
    """Patch ``model`` with the attention/loss method ``spec`` (options go to the method).

    Raises ValueError saying why for a family that cannot be served (``FAMILIES[..].refused``,
    or no self-attention module found), before the model is touched."""
    fam = family(model)
    kind = f"{type(model).__name__} ({getattr(model.config, 'model_type', '?')})"
    if fam.refused:
        raise ValueError(f"model: {kind} is not supported by attention methods: {fam.refused}")
    attn = attention_modules(model)
    if not attn:
        raise ValueError(
            f"model: found no self-attention module in {kind} that calls HF's attention "
            f"interface, and its family has no adapter for scores computed in its own forward "
            f"(hosts.families.FAMILIES)")
    n_layers = fam.depth(model.config) if fam.depth is not None else len(attn)
    ffn_suffixes = options.pop("ffn_modules", None)
    method = registry.create(spec.name, context=_context(model, n_layers), **options)
    ffn = ffn_modules(model, ffn_suffixes) if getattr(method, "ffn_on", False) else []
    if getattr(method, "ffn_on", False) and len(ffn) != len(attn):
        raise ValueError(
            f"ffn_modules: found {len(ffn)} FFN first layers for {len(attn)} attention layers in "
            f"{type(model).__name__}; pass ffn_modules=(name suffixes,) for this model"
        )
    param = next(model.parameters(), None)
    if param is not None:  # the model's dtype too: fp32 factors on a bf16 model made CUDA's
        # layer_norm refuse the mixed dtypes (the CPU kernel accepts them, so CPU runs missed it)
        method.to(device=param.device, dtype=param.dtype)
    method.train(model.training)  # follow the model's mode (model.eval() came before the patch)
    adapter = ADAPTERS.get(fam.scores)
    previous = None if adapter else (attn_implementation(model.config) or "eager")
    state = AttentionPatchState(spec.name, method, IMPL, previous,
                                {m: i for i, m in enumerate(attn)}, fam, n_layers)
    if adapter is None:
        _register()
        model.set_attn_implementation(IMPL)
    for m in attn:
        m.__dict__[STATE_ATTR] = state  # plain attribute: not a submodule, not saved
        if adapter is not None:
            replace_forward(m, adapter, state, m)
    weights_configs(model, attn)
    add_method_module(model, method)  # hosts.METHOD_MODULE, or a free variant when stacked
    state.handles += bracket_calls(model, state, state.calls, _start_forward)
    for i, m in enumerate(attn):
        state.handles.append(m.register_forward_pre_hook(
            partial(_enter_layer, state, i, bool(method.needs_hidden)), with_kwargs=True))
    for lin in ffn:
        state.handles.append(lin.register_forward_hook(partial(_penalise, state)))
    return state
