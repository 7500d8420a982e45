"""Random token selection: the control every pruning method must beat.

Keeps k = ⌊ρ·n⌋ real tokens chosen uniformly at random (draws from torch's global generator,
so a caller that seeds torch gets the same choice).
"""

from __future__ import annotations

import torch

from attnprune.methods.base import Selection, TokenMethod
from attnprune.methods.registry import register
from attnprune.selection import topk_keep


@register("random", kind="token", paper="entropy_guided_token_pruning.txt §5 (control)")
class RandomSelection(TokenMethod):
    """Keep a uniformly random subset of ⌊ρ·n⌋ tokens (control)."""

    def __init__(self) -> None:
        super().__init__()

    def forward(self, hidden, mask, attn=None, keep_ratio=0.5, layer=0, labels=None, protect=None):
        scores = torch.rand(mask.shape, device=hidden.device)
        return Selection(topk_keep(scores, mask, keep_ratio=keep_ratio, protect=protect), scores=scores)
