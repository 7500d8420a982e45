"""The public API (contract): ``patch`` (``stack=True`` to combine), ``unpatch``, ``aux_loss``,
``list_methods``; saving and loading are in :mod:`attnprune.deploy.hub`.

It knows no host nor client: each host declares what ``patch`` must know of it
(:func:`attnprune.hosts.register_host`), and :func:`attnprune.hosts.find_host` picks it."""

from __future__ import annotations

from torch import nn

from attnprune.hosts import (
    MODEL_STATE_ATTR,
    PatchState,
    UntrainedMethodWarning,
    find_host,
    patch_with,
    unpatch_model,
)
from attnprune.hosts.stack import PatchStack, check_stackable, stack_states
from attnprune.methods import registry

__all__ = ["UntrainedMethodWarning", "aux_loss", "list_methods", "patch", "patch_state", "unpatch"]


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
    (:mod:`attnprune.hosts.sentence_transformers`).
    Bad options raise ValueError naming the field, before the model is touched.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(stack, bool):
        raise ValueError(f"stack must be True or False, got {stack!r}")  # noqa: TRY004 (patch() contract: ValueError)
    spec = registry.get(method)
    host = find_host(model, spec.kind)
    if stack and host.one_method:
        raise ValueError(f"stack: {host.one_method}")
    # Every keyword is the method's, its host's or patch's own: an unknown one (a typo,
    # ``keep_ration``) raises naming it, the close names and every accepted one, before
    # anything is touched (before a patched model is unpatched).
    accepted = host.accepted(model, spec)
    if accepted is not None:
        registry.check_options(accepted[0], options, [*accepted[1], ("patch", ("stack",))])
    current: PatchState | None = getattr(model, MODEL_STATE_ATTR, None)
    below: list[PatchState] = []
    if stack and current is not None:
        below = list(current.states) if isinstance(current, PatchStack) else [current]
        check_stackable(below, method, spec.kind)
    elif current is not None:
        unpatch(model)
    state = patch_with(host, model, spec, method, options)
    if below:
        state = stack_states(below, state)
    object.__setattr__(model, MODEL_STATE_ATTR, state)
    return model


def unpatch(model: nn.Module) -> nn.Module:
    """Restore stock behaviour (a no-op on an unpatched model)."""
    unpatch_model(model)
    return model


def patch_state(model: nn.Module) -> PatchState | None:
    """The :class:`PatchState` of a patched model, or None; for a stacked model the
    :class:`~attnprune.hosts.stack.PatchStack` (its ``states`` in order, ``state(kind)`` for one)."""
    return getattr(model, MODEL_STATE_ATTR, None)


def aux_loss(model: nn.Module):
    """Sum of the auxiliary losses (budget, sparsity, policy, cost) of the model's last
    forward, or None when the method has none. Add it to the task loss when training."""
    state = patch_state(model)
    return None if state is None else state.aux_loss()


def list_methods(kind: str | None = None) -> list[str]:
    """Registered method names; ``kind`` ∈ {"token", "attention", "loss"} filters."""
    return registry.list_methods(kind)
