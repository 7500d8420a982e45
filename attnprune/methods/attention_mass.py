"""Attention-mass selection: keep the tokens that receive the most attention.

Score of token j = attention it receives, averaged over heads and over the real queries i:
    a_j = (1 / (H·n)) Σ_h Σ_i A_h[i, j]                        (variant "mean")
or the attention the first token (CLS) pays to it:
    a_j = (1 / H) Σ_h A_h[0, j]                                 (variant "cls")
Baseline of the entropy paper (§5) and the LTP importance of ``token_pruning_bert_to_gpt2.txt``.
"""

from __future__ import annotations

from attnprune.attention import attention_received
from attnprune.methods.base import Selection, TokenMethod
from attnprune.methods.registry import register
from attnprune.selection import topk_keep

__all__ = ["AttentionMass", "attention_received"]  # the score: attnprune.attention


@register("attention_mass", kind="token", paper="entropy_guided_token_pruning.txt §5")
class AttentionMass(TokenMethod):
    """Keep the ⌊ρ·n⌋ tokens that receive the most attention (mean over heads and queries, or CLS)."""

    needs_attention = True

    def __init__(self, variant: str = "mean") -> None:
        super().__init__()
        if variant not in ("mean", "cls"):
            raise ValueError(f"variant must be 'mean' or 'cls', got {variant!r}")
        self.variant = variant

    @property
    def attention_rows(self) -> str:
        """What of A the score reads, so hosts compute only that: "first" (the CLS row,
        (B, H, 1, L)) or "received" (per head, the mean over real queries, (B, H, 1, L)).
        Hosts that ignore it pass the full (B, H, L, L); both give the same scores."""
        return "first" if self.variant == "cls" else "received"

    def forward(self, hidden, mask, attn=None, keep_ratio=0.5, layer=0, labels=None, protect=None):
        if attn is None:
            raise ValueError("attention_mass needs the attention probabilities of the previous layer")
        if self.variant == "mean" and attn.shape[-2] == 1:  # host gave the received rows
            scores = attn.detach()[:, :, 0, :].mean(dim=1)  # (same value if L = 1)
        else:
            scores = attention_received(attn.detach(), mask, self.variant)
        return Selection(topk_keep(scores, mask, keep_ratio=keep_ratio, protect=protect), scores=scores)
