"""Computational-cost incentive (``compute_cost_incentive_ocr_zh.txt`` §3.2–3.3, eq. 2, 5, 6).

Notation (the paper's): A_h^(l) the attention matrix of head h in layer l, x the FFN input,
W1, b1 the FFN's first layer, α, β, λ weights.

    C_comp     = α · Σ_l Σ_h attn_term(A_h^(l)) + β · Σ_l ‖ReLU(W1 x + b1)‖₁      (eq. 2)
    L_total    = L_task + λ · C_comp                                               (eq. 5)
    H(A_h)     = −Σ_i w_i log₂ w_i                                                 (eq. 6)

Choice of the attention term. Eq. 2 writes ‖A_h^(l)‖₁, but every row of a softmax attention
matrix sums to 1, so ‖A‖₁ = number of rows whatever the model does: it is constant and has zero
gradient. We penalise instead the Shannon entropy (bits, eq. 6, the paper's own measure of how
concentrated attention is) of every attention row: per head, the mean over the real query
tokens of the batch, summed over heads and layers. Low entropy = mass on few keys = what the
paper's "sparser attention" means. The rows' probabilities are computed in the attention
function (eager: QKᵀ, mask, softmax), so this term costs the SDPA fusion while training.

FFN term. W1 x + b1 is captured with a forward hook on the FFN's first linear layer (BERT
``intermediate.dense``, DistilBERT ``ffn.lin1``, GPT-2 ``mlp.c_fc``): no model code copied.
Gated FFNs (Llama-family act(gate x) ⊙ up x, Phi-3's and ModernBERT's fused projections) are
penalised on the activated projection (``gate_proj``, the fused layer's first half): that is
where the activation, and so the sparsity, lives; the host's family table says which.
The penalty is ‖ReLU(W1x + b1)‖₁ of the pre-activation as in eq. 2, even when the network's
own activation is GELU (BERT, DistilBERT, GPT-2): GELU(z) ≈ ReLU(z) for z ≫ 0 and ≈ 0 for
z ≪ 0, so pushing pre-activations below 0 is what makes GELU outputs (near-)zero and the FFN
activation sparse. Per layer: L1 over the units, mean over the real tokens of the batch.

Scale: both terms are sums over heads / units (not means), as in eq. 2, so λ has the paper's
range (1e-6 … 1e-2). ``location`` selects both terms ("both"), attention only, or FFN only
(the paper's ablation); λ = 0 leaves the model's outputs and gradients stock.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..registry import register
from .crisp import allowed_keys, fused_attention, masked_scores, score_bias, softmax_rows

LOCATIONS = ("both", "attention", "ffn")


def row_entropy_bits(probs: Tensor) -> Tensor:
    """Shannon entropy in bits of each attention row: (..., Tk) → (...). 0·log 0 = 0."""
    logp = torch.log2(probs.clamp_min(1e-30))
    return -(probs * logp).sum(-1)


def masked_mean(x: Tensor, token_mask: Tensor | None, dims: tuple[int, ...]) -> Tensor:
    """Mean of ``x`` over ``dims`` counting only real tokens (``token_mask`` broadcastable)."""
    if token_mask is None:
        return x.mean(dim=dims)
    w = token_mask.to(x.dtype)
    return (x * w).sum(dim=dims) / w.sum(dim=dims).clamp_min(1.0)


@register("cost", kind="loss", paper="compute_cost_incentive_ocr_zh.txt")
class CostIncentive(nn.Module):
    """Computational-cost incentive: λ·(α·attention entropy + β·‖ReLU(W1x+b1)‖₁) in the loss."""

    needs_hidden = False

    def __init__(self, lam: float = 1e-4, alpha: float = 1.0, beta: float = 1.0,
                 location: str = "both") -> None:
        super().__init__()
        for name, v in {"lam": lam, "alpha": alpha, "beta": beta}.items():
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{name}: must be a finite number >= 0, got {v!r}")
        if location not in LOCATIONS:
            raise ValueError(f"location: must be one of {LOCATIONS}, got {location!r}")
        self.lam, self.alpha, self.beta, self.location = float(lam), float(alpha), float(beta), location

    @property
    def attention_on(self) -> bool:
        """Whether the attention term contributes (needs the probabilities)."""
        return self.location in ("both", "attention") and self.lam * self.alpha > 0

    @property
    def ffn_on(self) -> bool:
        """Whether the FFN term contributes (needs the FFN hooks)."""
        return self.location in ("both", "ffn") and self.lam * self.beta > 0

    def attend(
        self,
        module: nn.Module,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None,
        *,
        dropout: float,
        scaling: float,
        layer: int,
        aux: list | None = None,
        token_mask: Tensor | None = None,
        need_weights: bool = False,
        softcap: float | None = None,
        bias: Tensor | None = None,
        **_,
    ) -> tuple[Tensor, Tensor | None]:
        """Stock attention; when the attention term is on, also appends λ·α·Σ_h H̄_h to ``aux``.
        The entropy is that of the family's real attention rows (softcap and position terms
        included); with GQA every query head counts as a head of eq. 2."""
        tq, tk = query.shape[-2], key.shape[-2]
        is_causal = bool(getattr(module, "is_causal", False))
        if not (self.attention_on or need_weights):
            out = fused_attention(query, key, value, mask, is_causal=is_causal, scaling=scaling,
                                  dropout=dropout, training=module.training, softcap=softcap,
                                  bias=bias)
            return out, None
        allowed = allowed_keys(mask, is_causal, tq, tk, query.device)
        probs = softmax_rows(masked_scores(query, key, scaling, allowed, softcap=softcap,
                                           bias=score_bias(mask, tk, bias)))
        if self.attention_on and aux is not None:
            h = row_entropy_bits(probs.float())  # (B, H, Tq)
            tm = None if token_mask is None else token_mask[:, None, -tq:]
            per_head = masked_mean(h, tm, dims=(0, 2)) if tm is not None else h.mean(dim=(0, 2))
            aux.append(self.lam * self.alpha * per_head.sum())
        dropped = torch.nn.functional.dropout(probs.to(value.dtype), p=dropout,
                                              training=module.training)
        return torch.matmul(dropped, value).transpose(1, 2).contiguous(), probs

    def ffn_term(self, pre_activation: Tensor, token_mask: Tensor | None) -> Tensor:
        """λ·β·‖ReLU(W1x + b1)‖₁ of one layer: L1 over units, mean over real tokens."""
        l1 = torch.relu(pre_activation).sum(-1)  # (B, T)
        tm = token_mask if token_mask is not None and token_mask.shape == l1.shape else None
        return self.lam * self.beta * masked_mean(l1, tm, dims=(0, 1))
