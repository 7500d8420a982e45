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

Structured variant (``ffn_penalty="group"``, not in the paper; issue 13). The element-wise L1
makes each token's activation sparse, but tokens switch off *different* units, so no unit is
off for every token and a dense kernel saves nothing. The group lasso (Yuan & Lin 2006) puts
one L2 norm on each unit's column a_u = ReLU(z_u) over the N real tokens of the batch:

    R_group = Σ_u ‖a_u‖₂ / √N = Σ_u RMS_t(a_tu)                           (per layer)

Its gradient a_u / ‖a_u‖₂ shrinks a unit's activations on all tokens together and is largest
for units that are already weak, so whole units go to zero for every token; those units can be
cut out of the weights (:mod:`attnprune.deploy.compact_ffn`) and the savings are real. Normalisation:
dividing by √N makes the term the sum over units of each unit's root-mean-square activation,
independent of batch size and sequence length, and equal to the L1 term (mean over tokens of
Σ_u a_tu) when every token has the same activations, so λ keeps the paper's range. (Dividing by
N instead would shrink the term as 1/√N with the batch.) A unit that is 0 on every token has
‖a_u‖₂ = 0, where the norm is not differentiable: its subgradient 0 is used (the norm is
computed as √(Σ a² + ε²) − ε with ε tiny, so a dead unit gets exactly zero gradient).

Scale: both terms are sums over heads / units (not means), as in eq. 2, so λ has the paper's
range (1e-6 … 1e-2). ``location`` selects both terms ("both"), attention only, or FFN only
(the paper's ablation); λ = 0 leaves the model's outputs and gradients stock.

Savings: the penalty only makes activations sparse; dense kernels still multiply the zeros.
:mod:`attnprune.deploy.sparse_ffn` turns FFN units that are off in a whole block of tokens into
skipped work (counted FLOPs and wall time) at inference.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor, nn

from attnprune.attention import (
    allowed_keys,
    fused_attention,
    masked_scores,
    row_entropy_bits,
    score_bias,
    softmax_rows,
)
from attnprune.methods.base import LossMethod
from attnprune.methods.registry import register

LOCATIONS = ("both", "attention", "ffn")
FFN_PENALTIES = ("l1", "group")
_GROUP_EPS = 1e-12  # smooths ‖a_u‖₂ at 0 (see the module docstring); far below any activation


def masked_mean(x: Tensor, token_mask: Tensor | None, dims: tuple[int, ...]) -> Tensor:
    """Mean of ``x`` over ``dims`` counting only real tokens (``token_mask`` broadcastable)."""
    if token_mask is None:
        return x.mean(dim=dims)
    w = token_mask.to(x.dtype)
    return (x * w).sum(dim=dims) / w.sum(dim=dims).clamp_min(1.0)


@register("cost", kind="loss", paper="compute_cost_incentive_ocr_zh.txt")
class CostIncentive(LossMethod):
    """Computational-cost incentive: λ·(α·attention entropy + β·FFN term) in the loss; the FFN
    term is ‖ReLU(W1x+b1)‖₁ (``ffn_penalty="l1"``, eq. 2) or the group lasso over units
    (``"group"``)."""

    needs_hidden = False
    neutral_options: ClassVar[dict] = {"lam": 0.0}
    example_options: ClassVar[dict] = {"lam": 1e-2}

    def __init__(self, lam: float = 1e-4, alpha: float = 1.0, beta: float = 1.0,
                 location: str = "both", ffn_penalty: str = "l1") -> None:
        super().__init__()
        for name, v in {"lam": lam, "alpha": alpha, "beta": beta}.items():
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{name}: must be a finite number >= 0, got {v!r}")
        if location not in LOCATIONS:
            raise ValueError(f"location: must be one of {LOCATIONS}, got {location!r}")
        if ffn_penalty not in FFN_PENALTIES:
            raise ValueError(f"ffn_penalty: must be one of {FFN_PENALTIES}, got {ffn_penalty!r}")
        self.lam, self.alpha, self.beta, self.location = float(lam), float(alpha), float(beta), location
        self.ffn_penalty = ffn_penalty

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
        """λ·β·(FFN penalty) of one layer. ``l1``: ‖ReLU(W1x + b1)‖₁ over units, mean over real
        tokens; ``group``: Σ_u ‖ReLU(z_u)‖₂ / √N over the N real tokens (:func:`group_lasso`)."""
        a = torch.relu(pre_activation)  # (B, T, U)
        tm = token_mask if token_mask is not None and token_mask.shape == a.shape[:-1] else None
        if self.ffn_penalty == "group":
            return self.lam * self.beta * group_lasso(a, tm)
        return self.lam * self.beta * masked_mean(a.sum(-1), tm, dims=(0, 1))


def group_lasso(a: Tensor, token_mask: Tensor | None) -> Tensor:
    """Σ_u ‖a_u‖₂ / √N: ``a`` (B, T, U) activations, ``token_mask`` (B, T) real tokens (None:
    all); the column of unit u is its activation on the N real tokens. 0 when N = 0."""
    a = a.float()
    if token_mask is not None:
        w = token_mask.to(a.dtype)[..., None]  # (B, T, 1)
        a = a * w
        n = w.sum()
    else:
        n = torch.tensor(float(a.shape[0] * a.shape[1]), device=a.device)
    sq = (a * a).sum(dim=(0, 1))  # (U,)
    norms = torch.sqrt(sq + _GROUP_EPS**2) - _GROUP_EPS  # (U,) = ‖a_u‖₂, gradient 0 at a_u = 0
    return norms.sum() / n.clamp_min(1.0).sqrt()
