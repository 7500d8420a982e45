"""The public API (contract): ``patch``, ``unpatch``, ``aux_loss``, ``list_methods``."""

from __future__ import annotations

from torch import nn

from . import registry
from .hosts import PatchState, find_host

_ATTR = "_attnprune"


def patch(model: nn.Module, method: str, **options) -> nn.Module:
    """Patch ``model`` in place with ``method`` and return it.

    ``options`` are the method's and the host's keywords (e.g. ``keep_ratio=0.5,
    after_layer=1`` for token methods, ``sparsity=0.8`` for crisp). A model already patched
    is unpatched first. Bad options raise ValueError naming the field, before the model is
    touched.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    spec = registry.get(method)
    host = find_host(model, spec.kind)
    if getattr(model, _ATTR, None) is not None:
        unpatch(model)
    state = host.patch(model, spec, **options)
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
    """The :class:`PatchState` of a patched model, or None."""
    return getattr(model, _ATTR, None)


def aux_loss(model: nn.Module):
    """Sum of the auxiliary losses (budget, sparsity, policy, cost) of the model's last
    forward, or None when the method has none. Add it to the task loss when training."""
    state = patch_state(model)
    return None if state is None else state.aux_loss()


def list_methods(kind: str | None = None) -> list[str]:
    """Registered method names; ``kind`` ∈ {"token", "attention", "loss"} filters."""
    return registry.list_methods(kind)
