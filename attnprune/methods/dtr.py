"""Dynamic Token Reduction (``token_pruning_bert_to_gpt2.txt``, "DTR"; TR-BERT, Ye et al. 2021).

At each chosen layer l a policy reads the state of every alive token and gives the
probability of keeping it:

    π(a = keep | h) = σ(W2 · GELU(W1 · h))                      (policy network)
    a_t ~ Bernoulli(π) in training;  keep iff π ≥ 0.5 at inference
    R   = −L_LM − λ · kept / T                                  (reward, per sequence)
    L_policy = −E[(R − R̄) · Σ_t log π(a_t | h_t)]               (REINFORCE, R̄ = batch mean)
    L_total  = L_LM + α · L_policy,  α = 0.1 (paper)             (backbone frozen in this stage)

kept / T is the share of (token, layer) decisions that kept the token, over this sequence's
decisions. A token dropped at one layer stays dropped (the host never scores it again).
π depends on h_t only, hence on tokens ≤ t: the decision is causal and a cached decode step
makes the same one as a full recompute.

Choices the paper leaves open (ours): hidden width of the policy d/2; the last bias starts at
logit(0.9) so the policy keeps most tokens at first (REINFORCE then learns what to drop);
λ defaults to the paper's 1e-4, which keeps nearly everything on a character model, so the
budget sweeps set it explicitly.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..registry import register
from .base import Selection, TokenMethod
from .ltp_causal import parse_layers


def default_dtr_layers(n_layers: int) -> list[int]:
    """Layers 4 and 8 of the paper's 12, scaled to the depth: round(L/3), round(2L/3) (≥ 1)."""
    return sorted({max(1, min(n_layers - 1, round(n_layers * k / 12))) for k in (4, 8)})


class Policy(nn.Module):
    """π(keep | h) = σ(W2 · GELU(W1 · h)), one per decision layer."""

    def __init__(self, d_model: int, hidden: int, init_keep: float) -> None:
        super().__init__()
        self.w1 = nn.Linear(d_model, hidden)
        self.act = nn.GELU()
        self.w2 = nn.Linear(hidden, 1)
        nn.init.zeros_(self.w2.weight)  # start from a constant policy π = init_keep
        nn.init.constant_(self.w2.bias, math.log(init_keep / (1 - init_keep)))

    def forward(self, h: Tensor) -> Tensor:
        return torch.sigmoid(self.w2(self.act(self.w1(h)))).squeeze(-1)  # (B, K)


@register("dtr", kind="token", paper="token_pruning_bert_to_gpt2.txt (DTR: policy, reward, REINFORCE)")
class DTR(TokenMethod):
    """REINFORCE token-keep policy at chosen layers (Bernoulli in training, π ≥ 0.5 at eval)."""

    causal = True

    def __init__(self, d_model: int, n_layers: int, layers=None, hidden: int | None = None,
                 sparsity_weight: float = 1e-4, alpha: float = 0.1, init_keep: float = 0.9) -> None:
        super().__init__()
        self.layers = parse_layers(layers, n_layers, default_dtr_layers(n_layers))
        if sparsity_weight < 0:
            raise ValueError(f"sparsity_weight must be ≥ 0, got {sparsity_weight}")
        if alpha < 0:
            raise ValueError(f"alpha must be ≥ 0, got {alpha}")
        if not 0.0 < init_keep < 1.0:
            raise ValueError(f"init_keep must be in (0, 1), got {init_keep}")
        self.sparsity_weight = float(sparsity_weight)  # λ (paper 1e-4)
        self.alpha = float(alpha)  # α = 0.1 (paper)
        width = hidden or max(8, d_model // 2)
        self.policies = nn.ModuleDict({str(l): Policy(d_model, width, init_keep) for l in self.layers})

    def forward(self, hidden, mask, attn=None, keep_ratio=None, layer=0, labels=None, protect=None):
        """Selection for the tokens entering block ``layer``; actions' log-probs in ``info``."""
        # Outside a host, a layer without a policy uses the first decision layer's policy.
        key = str(layer) if str(layer) in self.policies else str(self.layers[0])
        p = self.policies[key](hidden)  # (B, K)
        if keep_ratio is not None and keep_ratio >= 1.0:  # ρ = 1: pruning off
            return Selection(mask.clone(), scores=p)
        prot = torch.zeros_like(mask) if protect is None else protect & mask
        if not self.training:
            return Selection(((p >= 0.5) & mask) | prot, scores=p)
        a = (torch.bernoulli(p.detach()).bool() & mask) | prot
        eps = 1e-6  # keeps log finite when π saturates
        logp = torch.where(a, (p + eps).log(), (1 - p + eps).log()) * mask.to(p.dtype)
        info = {"log_prob": logp.sum(1), "kept": a.sum(1).to(p.dtype), "n": mask.sum(1).to(p.dtype)}
        return Selection(a, scores=p, info=info)

    def reinforce_loss(self, actions: list[dict], lm_seq: Tensor) -> Tensor:
        """α · L_policy from the last forward's actions and per-sequence LM losses (B,)."""
        logp = torch.stack([a["log_prob"] for a in actions]).sum(0)  # Σ_t log π(a_t), (B,)
        kept = torch.stack([a["kept"] for a in actions]).sum(0)
        n = torch.stack([a["n"] for a in actions]).sum(0).clamp_min(1)
        reward = -lm_seq - self.sparsity_weight * kept / n  # R (B,)
        adv = (reward - reward.mean()).detach()  # batch-mean baseline
        return self.alpha * -(adv * logp).mean()
