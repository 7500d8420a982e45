"""Two patches on one model: a token method and an attention or loss method.

``attnprune.patch(model, "attention_mass", keep_ratio=0.5)`` followed by
``attnprune.patch(model, "crisp", sparsity=0.8, stack=True)`` leaves a :class:`PatchStack` on
the model. Why the two compose without a combined host: the token hosts act *between* layers
(``hf_encoder`` replaces the encoder loop, ``hf_causal`` swaps the GPT-2 block loop) and call
the stock layers, while the attention host acts *inside* them (an attention function chosen
by ``config._attn_implementation`` and hooks on the attention / FFN modules). The layers a
token host calls therefore run the attention method on the tokens that survived, and the masks
the token host builds for its shortened batches come from the stock helpers, which read the
attention implementation, so they have the format the attention function expects.

What had to change for that: the method modules of both patches live on the model under free
names (``attnprune_method``, ``attnprune_method_2``), each unpatch removes only its own; the
attention host reads the real tokens from each call's mask rather than from the model-level
mask (``derive_token_mask``: after a gather they no longer line up); crisp / cost / intensity
add the finite part of a float mask to their scores (the token hosts' soft masks in training).

Limits: one token method and one attention-or-loss method (two token methods would both want
the layer loop; an attention and a loss method both need the attention function). A token
method that scores from attention probabilities (``attention_mass``, ``ltp``) reads the dense
probabilities of the layer's own q, k (the token host recomputes them from captured
projections), not the crisp-sparsified ones. Intensity's positional input counts positions in
the shortened sequence after a gather.
"""

from __future__ import annotations

import torch
from torch import nn

from attnprune.hosts import PatchState

# kinds that may share a model: exactly one from each group
GROUPS = {"token": "token", "attention": "attention/loss", "loss": "attention/loss"}


def check_stackable(existing: list[PatchState], method: str, kind: str) -> None:
    """ValueError (naming ``stack``) unless ``method`` of ``kind`` may join ``existing``."""
    for s in existing:
        if GROUPS[s.kind] == GROUPS[kind]:
            raise ValueError(
                f"stack: the model already has the {s.kind} method {s.method!r}; {method!r} "
                f"({kind}) cannot join it: a stack holds one token method and one attention or "
                f"loss method (the kinds must differ)")


def stack_states(below: list[PatchState], state: PatchState) -> PatchStack:
    """The :class:`PatchStack` of ``below`` plus the new ``state``. The attention host then
    reads the real tokens from each call's mask, not from the model-level mask
    (``derive_token_mask``: after a token host's gather they no longer line up)."""
    for s in [*below, state]:
        if hasattr(s, "derive_token_mask"):  # the attention host
            s.derive_token_mask = True
    return PatchStack([*below, state])


class PatchStack(PatchState):
    """The patch state of a stacked model (``attnprune.patch_state(model)``): its
    ``states`` in the order they were applied, one per method.

    It reads like one state, so code written for a single patch keeps working:
    ``method`` is "token+attention" names joined by "+", ``aux_loss()`` sums every method's
    losses of the last forward, ``stats`` merges the states' statistics (the token method's
    ``kept_ratio`` and per-layer counts), ``enabled = False`` switches every method off (the
    stock model on the same weights); ``unpatch`` undoes the patches in reverse order. Any
    other attribute is read from the first state that has it and written to every state that
    has it (``bucket_rows`` to the token state, ``need_weights`` to the attention state).
    """

    def __init__(self, states: list[PatchState]) -> None:  # no super(): every field is delegated
        object.__setattr__(self, "states", list(states))

    # -- read like one state ----------------------------------------------------------------
    @property
    def method(self) -> str:
        return "+".join(s.method for s in self.states)

    @property
    def kind(self) -> str:
        return "+".join(str(s.kind) for s in self.states)

    @property
    def modules(self) -> nn.ModuleList:
        """The methods' modules (a list view; they stay registered on the model)."""
        return nn.ModuleList([s.modules for s in self.states])

    @property
    def aux_losses(self) -> list[torch.Tensor]:
        return [a for s in self.states for a in s.aux_losses]

    @property
    def stats(self) -> dict:
        merged: dict = {}
        for s in reversed(self.states):  # the first state's keys win
            merged.update(s.stats)
        return merged

    @property
    def enabled(self) -> bool:
        return all(getattr(s, "enabled", True) for s in self.states)

    @enabled.setter
    def enabled(self, value: bool) -> None:
        for s in self.states:
            s.enabled = value

    def state(self, kind: str) -> PatchState | None:
        """The state of the method of ``kind`` ("token", "attention" or "loss"), or None."""
        return next((s for s in self.states if s.kind == kind), None)

    def aux_loss(self) -> torch.Tensor | None:
        losses = [a for a in (s.aux_loss() for s in self.states) if a is not None]
        return torch.stack([a.reshape(()) for a in losses]).sum() if losses else None

    def unpatch(self, model: nn.Module) -> None:
        for s in reversed(self.states):
            s.unpatch(model)

    # -- delegation ----------------------------------------------------------------------
    def __getattr__(self, name: str):
        # Only called when normal lookup fails. ``states`` missing means a half-built object
        # (copy / pickle protocols probe ``__setstate__`` before ``__dict__`` is filled).
        states = self.__dict__.get("states")
        if states is None or name.startswith("__"):
            raise AttributeError(name)
        for s in states:
            if hasattr(s, name):
                return getattr(s, name)
        raise AttributeError(f"no state of the stack {self.method!r} has {name!r}")

    def __setattr__(self, name: str, value) -> None:
        if isinstance(getattr(type(self), name, None), property) or name == "states":
            object.__setattr__(self, name, value)
            return
        owners = [s for s in self.states if hasattr(s, name)]
        if not owners:
            raise AttributeError(f"no state of the stack {self.method!r} has {name!r}")
        for s in owners:
            setattr(s, name, value)
