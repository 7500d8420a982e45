"""The public API (contract): ``patch`` (``stack=True`` to combine), ``unpatch``, ``aux_loss``,
``list_methods``; saving and loading are in :mod:`attnprune.hub`."""

from __future__ import annotations

import copy

from torch import nn

from . import registry
from .hosts import PatchState, find_host
from .stack import PatchStack, check_stackable

_ATTR = "_attnprune"


def patch(model: nn.Module, method: str, *, stack: bool = False, **options) -> nn.Module:
    """Patch ``model`` in place with ``method`` and return it.

    ``options`` are the method's and the host's keywords (e.g. ``keep_ratio=0.5,
    after_layer=1`` for token methods, ``sparsity=0.8`` for crisp); they are kept on the patch
    state (``state.options``) so that :func:`attnprune.save_pretrained` can record them. A model
    already patched is unpatched first, unless ``stack=True``: then ``method`` joins the
    existing patch (one token method plus one attention or loss method, kinds must differ;
    :mod:`attnprune.stack`), and :func:`patch_state` returns the :class:`~attnprune.stack.PatchStack`.
    Bad options raise ValueError naming the field, before the model is touched.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(stack, bool):
        raise ValueError(f"stack must be True or False, got {stack!r}")  # noqa: TRY004 (patch() contract: ValueError)
    spec = registry.get(method)
    host = find_host(model, spec.kind)
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
    state = host.patch(model, spec, **options)
    state.requested, state.options, state.kind = method, kept, spec.kind
    if below:
        for s in [*below, state]:
            if hasattr(s, "derive_token_mask"):  # the attention host (see attnprune.stack)
                s.derive_token_mask = True
        state = PatchStack([*below, state])
    object.__setattr__(model, _ATTR, state)
    return model


def unpatch(model: nn.Module) -> nn.Module:
    """Restore stock behaviour (a no-op on an unpatched model)."""
    state: PatchState | None = getattr(model, _ATTR, None)
    if state is not None:
        state.unpatch(model)
        object.__setattr__(model, _ATTR, None)
    return model


def patch_state(model: nn.Module) -> PatchState | None:
    """The :class:`PatchState` of a patched model, or None; for a stacked model the
    :class:`~attnprune.stack.PatchStack` (its ``states`` in order, ``state(kind)`` for one)."""
    return getattr(model, _ATTR, None)


def aux_loss(model: nn.Module):
    """Sum of the auxiliary losses (budget, sparsity, policy, cost) of the model's last
    forward, or None when the method has none. Add it to the task loss when training."""
    state = patch_state(model)
    return None if state is None else state.aux_loss()


def list_methods(kind: str | None = None) -> list[str]:
    """Registered method names; ``kind`` ∈ {"token", "attention", "loss"} filters."""
    return registry.list_methods(kind)
