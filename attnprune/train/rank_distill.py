"""Ranking distillation: the full model's token importance as the target of the scorer.

A top-k scorer that reads layer l's attention (``attention_mass``) ranks the tokens by what
layer l attends to, but the tokens it keeps feed layers l+1 … N, and selection is not
differentiable: fine-tuning the pruned model never tells layer l which tokens the later layers
needed. ToP (Li et al., KDD 2023, "Constraint-aware and ranking-distilled token pruning")
distils the full model's final-layer token ranking into the early scorer; here, the simplest
form of that idea, written by hand (no library provides it):

    t_j = (1 / |S|) Σ_{s ∈ S} (1 / H·n) Σ_h Σ_i m_i A⁽ˢ⁾_h[i, j]     (teacher, S = layers l+1 … N)
    s_j = the student's score distribution at the cut (mean over heads of the attention
          received, or of the CLS row for the ``cls`` scorer), renormalised over real tokens
    L_rank = w · KL(t ‖ s), averaged over rows, added to the training loss

at the first pruning layer of the patched encoder, where every token is still present. The
teacher is the frozen full model (the distillation teacher of ``attnprune pareto``), run with
eager attention so it returns its probabilities.

    with rank_target(model, teacher_importance(t_out.attentions, mask, start), weight):
        out = model(**inputs)          # the host adds w·KL to the forward's auxiliary losses
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager

import torch
from torch import Tensor, nn

__all__ = ["first_cut", "rank_target", "ranking_loss", "teacher_importance"]


def teacher_importance(attentions: Sequence[Tensor], mask: Tensor, start: int) -> Tensor:
    """(B, L) target: the attention each token receives in the teacher's layers ``start``,
    ``start + 1``, … (each (B, H, L, L)), averaged over heads, real queries and layers, then
    normalised over the real tokens (a distribution per row; padding gets 0)."""
    if not attentions or any(a is None for a in attentions):
        raise ValueError("rank distillation needs the teacher's attention probabilities "
                         "(output_attentions=True with eager attention)")
    if not 0 <= start < len(attentions):
        raise ValueError(f"start must be in [0, {len(attentions) - 1}], got {start}")
    m = mask.float()
    n = m.sum(1).clamp_min(1)
    total = None
    for a in attentions[start:]:
        r = torch.einsum("bhij,bi->bj", a.float(), m) / (a.shape[1] * n[:, None])
        total = r if total is None else total + r
    t = total * m
    return t / t.sum(1, keepdim=True).clamp_min(1e-12)


def ranking_loss(student: Tensor, target: Tensor, mask: Tensor) -> Tensor:
    """KL(target ‖ student) over the real tokens, the mean over rows. ``student`` (B, L) is
    renormalised over the real tokens (it may carry mass on padding); ``target`` (B, L) is a
    distribution over them (:func:`teacher_importance`)."""
    if student.shape != target.shape:
        raise ValueError(f"student scores {tuple(student.shape)} and target "
                         f"{tuple(target.shape)} must have the same shape")
    m = mask.to(torch.float32)
    s = (student.float() * m).clamp_min(1e-9)
    s = s / s.sum(1, keepdim=True)
    t = target.float() * m
    return (t * (t.clamp_min(1e-12).log() - s.log())).sum(1).mean()


def first_cut(model: nn.Module) -> int:
    """Index (0-based) of the first layer after which the patched encoder prunes: the layer
    whose attention the scorer reads; the teacher's target starts one layer later. Refuses a
    model it cannot distil into (not a patched encoder, a method that reads no attention,
    a schedule that never prunes)."""
    from attnprune import api

    state = api.patch_state(model)
    schedule = getattr(state, "schedule", None)
    if schedule is None or not callable(getattr(state, "set_rank_loss", None)):
        raise ValueError("rank distillation needs an encoder patched with a token method "
                         "(attnprune.patch(model, 'attention_mass', ...))")
    if not getattr(state.modules, "needs_attention", False):
        # the loss is computed from the scorer's attention at the first cut: without one the
        # host never adds it, and training would silently run without the distillation
        raise ValueError(f"rank distillation needs a method that scores by attention "
                         f"(attention_mass, ltp), got {state.method!r}, which reads none")
    for i, r in enumerate(schedule[:-1]):
        if r < 1.0:
            return i
    raise ValueError("rank distillation needs a schedule that prunes (every keep ratio is 1)")


@contextmanager
def rank_target(model: nn.Module, target: Tensor, weight: float):
    """Within the block, the calling thread's next forward of the patched ``model`` (that one
    only) adds ``weight · ranking_loss`` at its first pruning layer to its auxiliary losses
    (``attnprune.aux_loss``). Only in training mode; the target is (B, L) for that forward's
    batch. The method must score by attention (:func:`first_cut` refuses others)."""
    from attnprune import api

    if not weight > 0:
        raise ValueError(f"weight must be > 0, got {weight}")
    first_cut(model)  # the model is a patched encoder that prunes
    weight = float(weight)

    def loss(student: Tensor, mask: Tensor) -> Tensor:
        if student.shape != target.shape:
            raise ValueError(f"rank distillation: the target is {tuple(target.shape)} but the "
                             f"scorer sees {tuple(student.shape)} tokens (one target per "
                             "forward, for its own batch)")
        return weight * ranking_loss(student, target.to(student.device), mask)

    state = api.patch_state(model)
    state.set_rank_loss(loss)
    try:
        yield
    finally:
        state.set_rank_loss(None)
