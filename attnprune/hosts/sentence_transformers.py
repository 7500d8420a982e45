"""The sentence-transformers host: ``attnprune.patch(SentenceTransformer(...), method, **options)``.

A SentenceTransformer runs its modules in turn on one ``features`` dict: ``Transformer``
(``st[0]``) puts the encoder's ``last_hidden_state`` under ``token_embeddings``; ``Pooling``
averages (or takes the CLS, the max, the last token of) the tokens its ``attention_mask``
marks; ``Dense`` / ``Normalize`` work on the pooled vector. A token-pruned encoder returns
every position (``output="scatter"``), but a dropped token holds the state of the layer that
dropped it, not the last layer's: pooling it with the caller's padding mask averages stale
states in (MiniLM-L6, attention_mass ρ = 0.5 after layer 1: cosine 0.49 to the stock
embeddings; only the kept tokens: 0.86, ``docs/embeddings.md``).

So ``patch`` here patches the inner encoder (``st[0].auto_model``) with the token host, and
each ``Pooling`` module of this instance pools over the tokens the encoder computed: its
``forward`` (an attribute of the instance, a partial over this patch's state, so deep copies
get their own and no class is touched) hands the stock ``Pooling.forward`` a copy of
``features`` whose ``attention_mask`` is the host's kept mask
(:attr:`attnprune.hosts.hf_encoder.HFEncoderState.kept_mask`: the last call on this thread)
and writes back what it pooled. The caller's ``attention_mask`` is left as it was: a second
forward on the same features (the cached losses re-embed them) sees the real padding mask.

* mean / max / weightedmean / mean_sqrt_len_tokens: over the kept tokens (weightedmean keeps
  each token's original position weight; mean_sqrt_len_tokens divides by √(kept count)).
* cls: the host always keeps position 0 (CLS on right-padded rows): the stock embedding's
  token, computed at full depth.
* lasttoken: the host always keeps each row's last real token (its separator).
* ``output="short"`` (the kept tokens only, (B, K, d)): pooled with the mask of the compact
  rows; positions are then compact ones, so ``weightedmean`` and ``include_prompt=False``
  are refused with it.

Merging (``reduce="merge"``, the default of ``tome``): every unkept token is averaged into a
kept one, and with ``output="scatter"`` each position holds its representative's final state
(:attr:`~attnprune.hosts.hf_encoder.HFEncoderState.source`). Pooling then reads the caller's
own mask over every real position: a mean over positions is the mean over the kept tokens
weighted by how many originals each stands for (sizes); CLS and the last token (separators)
are never merged into, so cls / lasttoken pooling read their own states; per-token outputs
(``output_value="token_embeddings"``) are served, each position its representative's state.
Rows with fewer than ``min_tokens`` real tokens are not reduced (default
:data:`~attnprune.hosts.hf_encoder.MERGE_MIN_TOKENS` when merging, 0 when dropping), and
``reduce_queries=False`` runs every ``encode_query`` (``task="query"``) through the stock
encoder: documents reduced, queries whole. ``output="short"`` is refused with merging.

Refused, with the reason: per-token outputs (``encode(output_value="token_embeddings")`` or
``None``: the dropped tokens' states are stale), modules other than Pooling / Dense /
Normalize / LayerNorm / Dropout after the Transformer (they may read tokens), no Pooling,
decoder encoders (``st[0].auto_model`` not served by the ``hf_encoder`` host) and
``stack=True`` (this host declares ``one_method``, which :func:`attnprune.patch` reads). Attention-level methods (kind "attention") drop no token: they patch the
inner model and leave the pooling as it is.

Saving: sentence-transformers' own ``save`` / ``save_pretrained`` would write the stock
encoder and no recipe (the folder would load unpruned, silently another model), so on a
patched instance they raise and point to ``attnprune.save_pretrained(st, folder)``, which
writes a sentence-transformers folder that loads pruned (:mod:`attnprune.deploy.hub`).

``attnprune.unpatch(st)`` restores every module; ``attnprune.patch_state(st)`` is a
:class:`SentenceTransformerState`, which reads and sets the encoder's state (``enabled``,
``stats``, ``kept_mask``, ...).

A host like the others (:func:`attnprune.hosts.register_host`), chosen by
:func:`attnprune.hosts.find_host` for any sentence-transformers model class (told by its
class's module: sentence-transformers is never imported here); it declares its own option
(``reduce_queries``) and takes its encoder's host's options too (``inner``).
"""

from __future__ import annotations

import inspect
from functools import partial

import torch
from torch import Tensor, nn

from attnprune.hosts import (
    MODEL_STATE_ATTR,
    PatchState,
    find_host,
    patch_with,
    register_host,
    replace_forward,
    replace_method,
    restore_method,
    unpatch_model,
)

__all__ = ["SentenceTransformerState", "is_sentence_transformers_model",
           "patch_sentence_transformer"]

# Modules after the Transformer that pool or work on each token alone or on the pooled vector
# (Dense and Normalize on token_embeddings are per position, so pooling after them is right).
_SAFE_AFTER = ("Pooling", "Dense", "Normalize", "LayerNorm", "Dropout")
_PER_TOKEN_HELP = ("run it unpruned (attnprune.patch_state(model).enabled = False, or "
                   "attnprune.unpatch(model))")


def is_sentence_transformers_model(model: nn.Module) -> bool:
    """True for a model class of the sentence-transformers package (without importing it)."""
    return any(c.__module__.startswith("sentence_transformers.") for c in type(model).__mro__)


def encoder_of(model: nn.Module) -> nn.Module | None:
    """The Hugging Face encoder of a SentenceTransformer (``model[0].auto_model``), or None."""
    first = next(iter(model.children()), None)
    encoder = getattr(first, "auto_model", None)
    return encoder if isinstance(encoder, nn.Module) else None


def _st_name(module: nn.Module) -> str | None:
    """The class name of a sentence-transformers module, None for any other class."""
    cls = type(module)
    return cls.__name__ if cls.__module__.startswith("sentence_transformers.") else None


class SentenceTransformerState(PatchState):
    """The patch of a SentenceTransformer: the inner encoder's state (``inner``) plus the
    Pooling modules this patch rewired. Attributes it does not hold itself (``enabled``,
    ``stats``, ``kept_mask``, ``keep_ratio``, ``bucket_rows``, ...) are the inner state's,
    read and set there."""

    _OWN = frozenset({"inner", "transformer", "poolings", "encode_index", "requested",
                      "options", "kind", "reduce_queries"})

    def __init__(self, inner: PatchState, transformer: nn.Module, poolings: list[nn.Module],
                 encode_index: int | None) -> None:
        # PatchState.__init__ is not called: its stats / aux_losses are the inner state's
        d = self.__dict__
        d["inner"], d["transformer"], d["poolings"] = inner, transformer, poolings
        d["encode_index"] = encode_index  # output_value's position in encode(), None: none
        d["requested"], d["options"], d["kind"] = inner.requested, inner.options, inner.kind
        d["reduce_queries"] = True  # False: encode_query runs the stock encoder

    def __getattr__(self, name: str):
        inner = self.__dict__.get("inner")
        if name.startswith("__") or name in self._OWN or inner is None:
            raise AttributeError(name)
        return getattr(inner, name)

    def __setattr__(self, name: str, value) -> None:
        if name in self._OWN:
            self.__dict__[name] = value
        else:
            setattr(self.inner, name, value)

    def aux_loss(self):
        return self.inner.aux_loss()

    def prunes(self) -> bool:
        """Whether forwards drop tokens now (enabled, some cumulative keep ratio below 1)."""
        inner = self.inner
        return bool(getattr(inner, "enabled", False)) and any(
            r < 1.0 for r in getattr(inner, "schedule", ()))

    def merges(self) -> bool:
        """Whether forwards merge the tokens they do not keep (``reduce="merge"``)."""
        return getattr(self.inner, "reduce", "drop") == "merge"

    def pooling_mask(self, features: dict, pooling: nn.Module) -> Tensor | None:
        """The mask ``pooling`` must read for this forward: the kept mask (B, L), or for
        ``output="short"`` the compact rows' mask (B, K); None when the encoder ran stock
        (unpatched since, or no pruned forward on this thread)."""
        inner = getattr(self.transformer.auto_model, MODEL_STATE_ATTR, None)
        kept = getattr(inner, "kept_mask", None)
        tokens = features.get("token_embeddings")
        if kept is None or not isinstance(tokens, Tensor):
            return None
        if getattr(inner, "sizes", None) is not None:
            # merged: every real position holds its representative's state, so the caller's
            # mask over all positions is the size-weighted pooling over the kept tokens
            return None
        given = features.get("attention_mask")
        if getattr(inner, "output", "scatter") == "short":
            _check_short(pooling, features)
            # the compact rows hold each row's kept tokens first, in order, then padding
            width = tokens.shape[1]
            mask = torch.arange(width, device=kept.device)[None, :] < kept.sum(1, keepdim=True)
        else:
            mask = kept
        if tokens.shape[0] != mask.shape[0] or tokens.shape[1] != mask.shape[1]:
            raise RuntimeError(
                f"token_embeddings {tuple(tokens.shape[:2])} do not match the encoder's last "
                f"kept mask {tuple(mask.shape)} on this thread: Pooling must follow the "
                f"Transformer's forward on the same thread")
        return mask.to(given.dtype) if isinstance(given, Tensor) else mask.long()

    def unpatch(self, model: nn.Module) -> None:
        for pool in self.poolings:
            if _is_ours(pool.__dict__.get("forward"), self):
                restore_method(pool, "forward")
        for name in ("encode", "save", "save_pretrained"):
            if _is_ours(model.__dict__.get(name), self):
                restore_method(model, name)
        encoder = self.transformer.auto_model
        if getattr(encoder, MODEL_STATE_ATTR, None) is self.inner:
            unpatch_model(encoder)


def _is_ours(fn, state: SentenceTransformerState) -> bool:
    return isinstance(fn, partial) and bool(fn.args) and fn.args[0] is state


def _check_short(pooling: nn.Module, features: dict | None = None) -> None:
    """ValueError for the pooling settings that read original positions, which the compact
    rows of ``output="short"`` no longer have."""
    modes = pooling.pooling_mode
    modes = (modes,) if isinstance(modes, str) else tuple(modes)
    if "weightedmean" in modes:
        raise ValueError("output='short': Pooling 'weightedmean' weights tokens by their "
                         "position, which the compact rows lose; use output='scatter'")
    if getattr(pooling, "include_prompt", True) is False and (
            features is None or "prompt_length" in features):
        raise ValueError("output='short': Pooling(include_prompt=False) drops the prompt by its "
                         "positions, which the compact rows lose; use output='scatter'")


def _pooling_forward(state: SentenceTransformerState, original, features: dict, **kwargs):
    """A Pooling module's forward, patched: the stock forward on a copy of ``features`` whose
    ``attention_mask`` marks the tokens the pruned encoder computed; what it adds is written
    back into ``features`` (whose own ``attention_mask`` stays the caller's)."""
    if "token_weights_sum" in features:  # WordWeights: its sum of weights would divide
        raise ValueError("token_weights_sum: a token-pruned SentenceTransformer pools over the "
                         "kept tokens; a WordWeights sum over all tokens does not fit it")
    pooling = original.__self__
    mask = state.pooling_mask(features, pooling)
    if mask is None:
        return original(features, **kwargs)
    out = original({**features, "attention_mask": mask}, **kwargs)
    for key, value in out.items():
        if key != "attention_mask":
            features[key] = value
    return features


def _encode(state: SentenceTransformerState, original, *args, **kwargs):
    """``SentenceTransformer.encode``, patched: per-token outputs are refused while tokens are
    dropped (the dropped ones hold stale states)."""
    value = kwargs.get("output_value", "sentence_embedding")
    if state.encode_index is not None and len(args) > state.encode_index:
        value = args[state.encode_index]
    if not state.reduce_queries and kwargs.get("task") == "query":
        from attnprune.hosts.hf_encoder import stock_calls  # lazy: transformers' imports

        with stock_calls():  # documents reduced, queries whole
            return original(*args, **kwargs)
    if value != "sentence_embedding" and state.prunes() and not state.merges():
        raise ValueError(
            f"output_value={value!r}: a token-pruned SentenceTransformer returns sentence "
            f"embeddings only; its dropped tokens hold the states of the layer that dropped "
            f"them, not the last layer's. For token embeddings {_PER_TOKEN_HELP}")
    return original(*args, **kwargs)


def _refuse_save(state: SentenceTransformerState, name: str, original, *args, **kwargs):
    """``SentenceTransformer.save`` / ``save_pretrained``, patched: refused (they would write
    the stock encoder without the recipe, a folder that loads unpruned)."""
    raise ValueError(
        f"{name}: sentence-transformers' {name} writes the encoder without attnprune's patch, a "
        f"folder that would load unpruned; save with attnprune.save_pretrained(model, folder) "
        f"(loads back with attnprune.from_pretrained(folder), or "
        f"SentenceTransformer(folder, trust_remote_code=True) with attnprune installed)")


def _modules(model: nn.Module, kind: str) -> tuple[nn.Module, list[nn.Module]]:
    """(the Transformer module, the Pooling modules), after checking the model's modules."""
    name = type(model).__name__
    if "SentenceTransformer" not in {c.__name__ for c in type(model).__mro__}:
        raise ValueError(f"model: {name} (sentence-transformers) is not served: attnprune "
                         f"patches a SentenceTransformer (sentence embeddings); a "
                         f"{name} reads per-token outputs or its own head")
    children = list(model.children())
    first = children[0] if children else None
    if first is None or not isinstance(getattr(first, "auto_model", None), nn.Module):
        raise ValueError(f"model: its first module must be a sentence-transformers Transformer "
                         f"with a Hugging Face model (auto_model), got "
                         f"{type(first).__name__ if first is not None else 'none'}")
    if kind != "token":
        return first, []
    out_name = getattr(first, "module_output_name", "token_embeddings")
    if out_name != "token_embeddings":
        raise ValueError(f"model: its Transformer writes {out_name!r}, not token embeddings; "
                         f"token pruning serves models that pool token embeddings")
    poolings = []
    for i, m in enumerate(children[1:], 1):
        kind_name = _st_name(m)
        if kind_name not in _SAFE_AFTER:
            raise ValueError(
                f"model: module {i} ({type(m).__name__}) may read token embeddings, whose "
                f"dropped tokens a token-pruned encoder leaves stale; attnprune serves "
                f"{', '.join(_SAFE_AFTER)} after the Transformer ({_PER_TOKEN_HELP})")
        if kind_name == "Pooling":
            poolings.append(m)
    if not poolings:
        raise ValueError(f"model: no Pooling module: its outputs are token embeddings, whose "
                         f"dropped tokens a token-pruned encoder leaves stale ({_PER_TOKEN_HELP})")
    return first, poolings


def _output_value_index(model: nn.Module) -> int | None:
    """The position of ``output_value`` among ``encode``'s arguments (self excluded)."""
    try:
        params = list(inspect.signature(model.encode).parameters.values())
    except (TypeError, ValueError):
        return None
    for i, p in enumerate(params):
        if p.name == "output_value":
            return i if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD else None
    return None


@register_host("sentence_transformers", kinds=("token", "attention", "loss"),
               matches=is_sentence_transformers_model, options=("reduce_queries",),
               inner=encoder_of, label="sentence-transformers",
               one_method="a SentenceTransformer takes one method; to combine a token and an "
                          "attention method, patch its encoder (model[0].auto_model) with "
                          "stack=True and pool over its kept_mask yourself")
def patch_sentence_transformer(model: nn.Module, spec, **options) -> SentenceTransformerState:
    """Patch ``model`` (a SentenceTransformer) with method ``spec``: its encoder through the
    host that serves it, its Pooling modules to pool the tokens the encoder computed (token
    methods). Called by :func:`attnprune.patch`; checks everything before touching the model."""
    transformer, poolings = _modules(model, spec.kind)
    encoder = transformer.auto_model
    host = find_host(encoder, spec.kind)
    if spec.kind == "token" and host.name != "hf_encoder":
        raise ValueError(f"model: its encoder {type(encoder).__name__} is served by the "
                         f"{host.name} host, which has no kept-token mask for pooling; "
                         f"token methods on a SentenceTransformer need a BERT-like encoder")
    reduce_queries = options.pop("reduce_queries", True)
    if not isinstance(reduce_queries, bool):
        raise ValueError(f"reduce_queries must be True or False, got {reduce_queries!r}")  # noqa: TRY004 (patch() contract: ValueError)
    if spec.kind != "token" and not reduce_queries:
        raise ValueError("reduce_queries: only token methods reduce tokens; attention methods "
                         "leave every query whole already")
    merging = spec.kind == "token" and (
        options.get("reduce") or spec.cls.default_reduce) == "merge"
    if merging:
        from attnprune.hosts.hf_encoder import MERGE_MIN_TOKENS  # lazy: transformers' imports

        options.setdefault("min_tokens", MERGE_MIN_TOKENS)
        if options.get("output") == "short":
            raise ValueError("output='short': a merging SentenceTransformer pools every "
                             "position through its representative (the source map), which "
                             "the compact rows lack; use output='scatter' (the default)")
    if spec.kind == "token" and options.get("output") == "short":
        for pooling in poolings:
            _check_short(pooling)
    unpatch_model(encoder)  # patched on its own before: replaced, as patch() does
    inner = patch_with(host, encoder, spec, spec.name, options)
    object.__setattr__(encoder, MODEL_STATE_ATTR, inner)
    state = SentenceTransformerState(inner, transformer, poolings,
                                     _output_value_index(model) if poolings else None)
    state.reduce_queries = reduce_queries
    if not reduce_queries:
        inner.options["reduce_queries"] = False  # recorded by save_pretrained
    for pooling in poolings:  # instance attributes: no class is touched, deep copies follow
        replace_forward(pooling, _pooling_forward, state)
    if poolings:
        replace_method(model, "encode", _encode, state)
    for name in ("save", "save_pretrained"):
        replace_method(model, name, _refuse_save, state, name)
    return state
