"""Entropy-guided token selection (``entropy_guided_token_pruning.txt`` §4, eq. 2–6).

A light head g (one linear layer d → C) reads X⁽¹⁾ and gives per-token class probabilities
p_i = softmax(g(x_i)). Their entropy

    H_i = −Σ_c p_ic log p_ic                                               (eq. 2)

is low where a token on its own already tells the class: such tokens are kept.

Three gates share the head:
    ``entropy``            hard top-k of −H_i, k = ⌊ρ·n⌋
    ``entropy_threshold``  keep tokens with H_i < t·log C (t relative to the maximum entropy)
    ``entropy_gumbel``     relaxed gate m̃_i = σ((s_i + g_i)/τ), g_i ~ Gumbel(0, 1) in training
                           (eq. 3–4), s_i = α·z_i + β with z_i the row-standardised −H_i and
                           learned α, β; budget loss λ(mean m̃ − ρ)² (eq. 5); hard top-k of s_i
                           at evaluation.

Training the head (the paper leaves this open; our choice): every real token is asked to
predict its sequence's label, L_head = mean_i CE(y, p_i), weighted by ``head_weight``. Tokens
that carry class signal learn confident (low-entropy) predictions; noise tokens, which appear
equally in both classes, stay near uniform. The selection itself is a hard top-k, so the head
gets no gradient through the classifier except in the relaxed gate.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from attnprune.methods.base import Selection, TokenMethod
from attnprune.methods.registry import register
from attnprune.selection import entropy, gumbel_sigmoid, threshold_keep, topk_keep


class _EntropyHead(TokenMethod):
    needs_labels = True

    def __init__(self, d_model: int, n_classes: int = 2, head_weight: float = 1.0) -> None:
        super().__init__()
        if n_classes < 2:
            raise ValueError(f"n_classes must be ≥ 2, got {n_classes}")
        self.head = nn.Linear(d_model, n_classes)
        self.head_weight = float(head_weight)
        self.n_classes = n_classes

    def token_entropy(self, hidden, mask, labels):
        """(probs (B, L, C), H (B, L), head loss or None)."""
        logits = self.head(hidden)  # (B, L, C)
        probs = logits.softmax(-1)
        H = entropy(probs)
        loss = None
        if labels is not None and self.training and self.head_weight > 0:
            ce = F.cross_entropy(
                logits.flatten(0, 1), labels[:, None].expand(mask.shape).flatten(), reduction="none"
            ).view(mask.shape)
            m = mask.to(ce.dtype)
            loss = self.head_weight * (ce * m).sum() / m.sum().clamp_min(1)
        return probs, H, loss


@register("entropy", kind="token", paper="entropy_guided_token_pruning.txt eq. 2")
class EntropyTopK(_EntropyHead):
    """Keep the ⌊ρ·n⌋ tokens whose class-head entropy H_i is lowest (top-k of −H_i)."""

    def forward(self, hidden, mask, attn=None, keep_ratio=0.5, layer=0, labels=None, protect=None):
        probs, H, loss = self.token_entropy(hidden, mask, labels)
        scores = -H
        keep = topk_keep(scores, mask, keep_ratio=keep_ratio, protect=protect)
        return Selection(keep, scores=scores, aux_loss=loss, info={"entropy": H, "probs": probs})


@register("entropy_threshold", kind="token", paper="entropy_guided_token_pruning.txt §4.2, §8.3")
class EntropyThreshold(_EntropyHead):
    """Keep tokens whose entropy is under ``threshold``·log C (the kept count varies per example)."""

    variable_budget = True

    def __init__(self, d_model: int, n_classes: int = 2, head_weight: float = 1.0,
                 threshold: float = 0.9) -> None:
        super().__init__(d_model, n_classes, head_weight)
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1] (a share of log C), got {threshold}")
        self.threshold = float(threshold)

    def forward(self, hidden, mask, attn=None, keep_ratio=0.5, layer=0, labels=None, protect=None):
        probs, H, loss = self.token_entropy(hidden, mask, labels)
        limit = self.threshold * math.log(self.n_classes)
        keep = threshold_keep(-H, -limit, mask, protect=protect)
        return Selection(keep, scores=-H, aux_loss=loss, info={"entropy": H, "probs": probs})


@register("entropy_gumbel", kind="token", paper="entropy_guided_token_pruning.txt eq. 3–5")
class EntropyGumbel(_EntropyHead):
    """Relaxed entropy gate σ((s_i + g_i)/τ) with a budget loss in training; hard top-k at eval."""

    def __init__(self, d_model: int, n_classes: int = 2, head_weight: float = 1.0,
                 tau: float = 0.5, budget_weight: float = 1.0) -> None:
        super().__init__(d_model, n_classes, head_weight)
        if tau <= 0:
            raise ValueError(f"tau must be > 0, got {tau}")
        self.tau = float(tau)
        self.budget_weight = float(budget_weight)  # λ of eq. 5
        self.alpha = nn.Parameter(torch.tensor(2.0))  # scale of the standardised score
        self.beta = nn.Parameter(torch.tensor(0.0))  # bias: the budget loss moves it

    def gate_logits(self, H, mask):
        m = mask.to(H.dtype)
        n = m.sum(1, keepdim=True).clamp_min(1)
        s = -H
        mu = (s * m).sum(1, keepdim=True) / n
        # Clamp the variance before the square root: d√v/dv is infinite at v = 0 (a row whose
        # real tokens all score alike, or a row of padding), which made the gradient NaN.
        sd = (((s - mu) ** 2 * m).sum(1, keepdim=True) / n).clamp_min(1e-12).sqrt()
        return self.alpha * (s - mu) / sd + self.beta

    def forward(self, hidden, mask, attn=None, keep_ratio=0.5, layer=0, labels=None, protect=None):
        probs, H, loss = self.token_entropy(hidden, mask, labels)
        s = self.gate_logits(H, mask)
        keep = topk_keep(s, mask, keep_ratio=keep_ratio, protect=protect)
        soft = None
        if self.training:
            soft = gumbel_sigmoid(s, self.tau, training=True) * mask.to(s.dtype)
            if protect is not None:
                soft = torch.where(protect, torch.ones_like(soft), soft)
            m = mask.to(s.dtype)
            mean_gate = (soft * m).sum() / m.sum().clamp_min(1)
            budget = self.budget_weight * (mean_gate - keep_ratio) ** 2  # eq. 5
            loss = budget if loss is None else loss + budget
        return Selection(keep, soft=soft, scores=s, aux_loss=loss, info={"entropy": H, "probs": probs})
