"""Token merging by bipartite soft matching (ToMe: Bolya et al., "Token Merging: Your ViT but
Faster", ICLR 2023), for text encoders: training-free, a fixed count per layer.

At a reducing layer the real tokens that may merge (not CLS, separators or padding) are split
alternately into two sets, A (even slots) and B (odd slots). Each A token finds its most
similar B token by cosine of the layer's keys averaged over heads (``keys``; the hidden
states when a host gives none); the r = n − ⌊ρ·n⌋ A tokens with the most similar match are
merged into it, the rest stay:

    s_a = max_b cos(k̄_a, k̄_b),   merged = the r A tokens of largest s_a,   a → argmax_b

The host averages each merged token into its match weighted by sizes (how many originals a
token stands for) and later layers add log size to a merged token's attention logits
(proportional attention): ``hosts/hf_encoder.py``, ``reduce="merge"``, this method's default.

Bipartite matching merges at most |A| ≈ half the mergeable tokens per layer. A step that asks
for more (ρ below about 0.5 in one layer) also merges the B tokens most similar to an A token,
each into its most similar kept token (the host's rule), so the kept count is always the
budget ⌊ρ·n⌋ (protected tokens beyond it are kept too), as for every fixed-ratio method: the
shapes stay static, and the sync-free path needs no read-back. ToMe itself spreads the
reduction over layers (r per layer): ``schedule="linear"`` does that here.

Written by hand: ToMe's reference code (facebookresearch/ToMe) patches timm ViTs; this is the
same matching on the host's (B, L) masks, with protected tokens and padding.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnprune.methods.base import Selection, TokenMethod
from attnprune.methods.registry import register
from attnprune.selection import key_metric, topk_keep


def bipartite_match(metric: Tensor, mask: Tensor, protect: Tensor | None = None
                    ) -> tuple[Tensor, Tensor]:
    """ToMe's matching on (B, L, d) unit vectors: (priority (B, L), match (B, L) long).

    A = even slots, B = odd slots, among real unprotected tokens. ``priority`` orders the
    tokens to merge away: an A token 2 + its best cosine to B (in [1, 3]), a B token its best
    cosine to A − 2 (in [−3, −1]), so every A token goes before any B token; −inf for tokens
    that never merge (protected, padding, no partner). ``match`` is each token's most similar
    token of the other set (itself where it has none)."""
    B, L, _ = metric.shape
    real = mask.bool()
    free = real if protect is None else real & ~protect.bool()
    slot = torch.arange(L, device=metric.device)
    parity = slot % 2  # 0: set A, 1: set B (ints: inductor cannot compare two index booleans)
    even = (parity == 0)[None, :]  # (1, L)
    sim = metric @ metric.transpose(1, 2)  # (B, L, L) cosine
    other = (parity[:, None] != parity[None, :])[None]  # (1, L, L): pairs across the two sets
    # a destination must be a real token that stays (not protected: CLS and separators keep
    # their own states); B tokens are destinations of A and vice versa
    allowed = other & free[:, None, :]
    lo = torch.finfo(sim.dtype).min
    sim = sim.masked_fill(~allowed, lo)
    best, match = sim.max(-1)  # (B, L)
    has = best > lo / 2
    priority = torch.where(even, best + 2.0, best - 2.0)
    priority = torch.where(free & has, priority, torch.full_like(priority, float("-inf")))
    match = torch.where(free & has, match, slot.expand(B, L))
    return priority, match


@register("tome", kind="token", paper="Bolya et al., ICLR 2023 (ToMe), issue 45")
class TokenMerging(TokenMethod):
    """Merge each layer's most redundant tokens into their bipartite match (ToMe), training-free."""

    needs_keys = True
    default_reduce = "merge"

    def __init__(self, n_heads: int | None = None) -> None:
        super().__init__()
        if n_heads is not None and (isinstance(n_heads, bool) or not isinstance(n_heads, int)
                                    or n_heads < 1):
            raise ValueError(f"n_heads must be a positive integer, got {n_heads!r}")
        self.n_heads = n_heads

    def forward(self, hidden, mask, attn=None, keep_ratio=0.5, layer=0, labels=None,
                protect=None, keys=None):
        metric = key_metric(hidden.detach() if keys is None else keys.detach(),
                            None if keys is None else self.n_heads)
        priority, match = bipartite_match(metric, mask, protect)
        # keep the ⌊ρ·n⌋ tokens of lowest merge priority (protected ones always)
        keep = topk_keep(-priority.nan_to_num(neginf=-1e30), mask, keep_ratio=keep_ratio,
                         protect=protect)
        return Selection(keep, scores=-priority.clamp_min(-1e4), merge_into=match)
