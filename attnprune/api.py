"""The public API (contract): ``patch`` (``stack=True`` to combine), ``unpatch``, ``aux_loss``,
``list_methods``; saving and loading are in :mod:`attnprune.deploy.hub`."""

from __future__ import annotations

import copy
import inspect
import warnings
from functools import partial

import torch
from torch import nn

from attnprune.compat import hook_dicts
from attnprune.hosts import MODEL_STATE_ATTR, Host, PatchState, find_host
from attnprune.hosts.stack import PatchStack, check_stackable
from attnprune.methods import registry

_ATTR = MODEL_STATE_ATTR


def patch(model: nn.Module, method: str, *, stack: bool = False, **options) -> nn.Module:
    """Patch ``model`` in place with ``method`` and return it.

    ``options`` are the method's and the host's keywords (e.g. ``keep_ratio=0.5,
    after_layer=1`` for token methods, ``sparsity=0.8`` for crisp); they are kept on the patch
    state (``state.options``) so that :func:`attnprune.save_pretrained` can record them. A model
    already patched is unpatched first, unless ``stack=True``: then ``method`` joins the
    existing patch (one token method plus one attention or loss method, kinds must differ;
    :mod:`attnprune.hosts.stack`), and :func:`patch_state` returns the :class:`~attnprune.hosts.stack.PatchStack`.
    A sentence-transformers ``SentenceTransformer`` is patched through its encoder, and its
    pooling then averages the tokens the encoder computed
    (:mod:`attnprune.deploy.sentence_transformers`).
    Bad options raise ValueError naming the field, before the model is touched.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(stack, bool):
        raise ValueError(f"stack must be True or False, got {stack!r}")  # noqa: TRY004 (patch() contract: ValueError)
    spec = registry.get(method)
    if _from_sentence_transformers(model):  # its encoder, and its pooling over kept tokens
        from attnprune.deploy.sentence_transformers import patch_sentence_transformer

        if stack:
            raise ValueError("stack: a SentenceTransformer takes one method; to combine a token "
                             "and an attention method, patch its encoder (model[0].auto_model) "
                             "with stack=True and pool over its kept_mask yourself")
        host_patch = patch_sentence_transformer
    else:
        host_patch = find_host(model, spec.kind).patch
    _check_options(model, spec, options)
    current: PatchState | None = getattr(model, _ATTR, None)
    below: list[PatchState] = []
    if stack and current is not None:
        below = list(current.states) if isinstance(current, PatchStack) else [current]
        check_stackable(below, method, spec.kind)
    elif current is not None:
        unpatch(model)
    try:  # the host may consume its dict; the caller may mutate theirs
        kept = copy.deepcopy(options)
    except Exception:  # noqa: BLE001 (any uncopyable option; save_pretrained refuses it by name)
        kept = dict(options)
    state = host_patch(model, spec, **options)
    state.requested, state.options, state.kind = method, kept, spec.kind
    _watch_untrained(model, state)
    if below:
        for s in [*below, state]:
            if hasattr(s, "derive_token_mask"):  # the attention host (see attnprune.hosts.stack)
                s.derive_token_mask = True
        state = PatchStack([*below, state])
    object.__setattr__(model, _ATTR, state)
    return model


# Options a host takes out of ``**options`` itself, before the rest go to the method.
_HOST_POPPED = {"hf_attention": ("ffn_modules",)}
_ST_OPTIONS = ("reduce_queries",)  # attnprune.deploy.sentence_transformers's own


def _check_options(model: nn.Module, spec: registry.MethodSpec, options: dict) -> None:
    """Every keyword is the method's, its host's or ``patch``'s own: an unknown one (a typo,
    ``keep_ration``) raises ValueError naming it, the close names and every accepted one,
    before anything is touched (before a patched model is unpatched)."""
    groups: list[tuple[str, tuple[str, ...]]] = []
    if _from_sentence_transformers(model):
        first = next(iter(model.children()), None)
        encoder = getattr(first, "auto_model", None)
        if not isinstance(encoder, nn.Module):
            return  # patch_sentence_transformer says what is wrong with the model
        groups.append(("sentence-transformers", _ST_OPTIONS))
        model = encoder
    try:
        host = find_host(model, spec.kind)
    except ValueError:
        return  # the host's own check says why
    name = spec.name
    if host.name in ("hf_causal", "hf_llama"):  # "ltp" means ltp_causal there
        from attnprune.hosts.hf_causal import _ALIASES

        name = _ALIASES.get(name, name)
    groups.insert(0, (f"the {host.name} host", _host_options(host)))
    groups.append(("patch", ("stack",)))
    registry.check_options(name, options, groups)


def _host_options(host: Host) -> tuple[str, ...]:
    """The keywords a host's patch function names (after ``model`` and ``spec``), and those it
    takes out of its ``**options``."""
    params = list(inspect.signature(host.patch).parameters.values())[2:]
    named = [p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                   inspect.Parameter.KEYWORD_ONLY)]
    return (*named, *_HOST_POPPED.get(host.name, ()))


def _from_sentence_transformers(model: nn.Module) -> bool:
    """A sentence-transformers model (SentenceTransformer, ...), told by its class's module
    so that sentence-transformers is never imported here."""
    return any(c.__module__.startswith("sentence_transformers.") for c in type(model).__mro__)


class UntrainedMethodWarning(UserWarning):
    """A learned token method kept every token because its decisions are untrained."""


def _watch_untrained(model: nn.Module, state) -> None:
    """The causal hosts' methods (ltp, dtr, hybrid on GPT-2 and Llama-family decoders) learn
    their decisions and, freshly built, keep every token whatever ``keep_ratio`` says. Check
    once, at the first eval forward, not here: a loader (``from_pretrained``,
    ``bench lm``) patches first and puts the trained weights in after. The hook is a partial
    over ``state``, so the host's unpatch removes it (``remove_state_hooks``)."""
    if getattr(state, "method_module", None) is not None and getattr(state, "enabled", False):
        model.register_forward_hook(partial(_untrained_check, state))


def _untrained_check(state, module: nn.Module, args, output) -> None:
    if module.training:  # training is what makes the decisions; wait for an eval forward
        return
    hooks = hook_dicts(module)[0]
    for key in [k for k, h in hooks.items()  # once: remove this hook
                if isinstance(h, partial) and h.func is _untrained_check and h.args[0] is state]:
        del hooks[key]
    kept = state.stats.get("kept_per_layer") or [0.0]
    if not state.enabled or min(kept) < 1.0 or not _decides_blindly(state, module):
        return
    target = "" if state.keep_ratio is None else f", so keep_ratio={state.keep_ratio} is only its training target"
    warnings.warn(
        f"{state.requested!r} kept every token: {state.method} learns which tokens to drop and "
        f"its decisions are untrained (the same for every input){target}. Train it first (`attnprune lm "
        f"--method {state.requested}`, or your loop adding attnprune.aux_loss(model)) or load "
        f"trained weights; to prune long prompts without training use "
        f"attnprune.prefill.generate(model, input_ids, attention_mask, keep=...)",
        UntrainedMethodWarning, stacklevel=2)


@torch.no_grad()
def _decides_blindly(state, model: nn.Module) -> bool:
    """True if the method keeps every token of random inputs at every decision layer with
    scores that do not depend on the input (a fresh LTP's w = 0, a fresh DTR policy's W2 = 0)."""
    method = state.method_module
    p = next(method.parameters(), None)
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if p is None or embeddings is None:
        return False
    d = embeddings.embedding_dim
    x = torch.randn(2, 32, d, generator=torch.Generator().manual_seed(0)).to(p)
    mask = torch.ones(2, 32, dtype=torch.bool, device=p.device)
    for layer in state.layers:
        sel = method(x, mask, keep_ratio=state.keep_ratio, layer=layer)
        if not bool(sel.keep.all()) or sel.scores is None or float(sel.scores.amax() - sel.scores.amin()) > 1e-6:
            return False
    return True


def unpatch(model: nn.Module) -> nn.Module:
    """Restore stock behaviour (a no-op on an unpatched model)."""
    state: PatchState | None = getattr(model, _ATTR, None)
    if state is not None:
        state.unpatch(model)
        object.__setattr__(model, _ATTR, None)
    return model


def patch_state(model: nn.Module) -> PatchState | None:
    """The :class:`PatchState` of a patched model, or None; for a stacked model the
    :class:`~attnprune.hosts.stack.PatchStack` (its ``states`` in order, ``state(kind)`` for one)."""
    return getattr(model, _ATTR, None)


def aux_loss(model: nn.Module):
    """Sum of the auxiliary losses (budget, sparsity, policy, cost) of the model's last
    forward, or None when the method has none. Add it to the task loss when training."""
    state = patch_state(model)
    return None if state is None else state.aux_loss()


def list_methods(kind: str | None = None) -> list[str]:
    """Registered method names; ``kind`` ∈ {"token", "attention", "loss"} filters."""
    return registry.list_methods(kind)
