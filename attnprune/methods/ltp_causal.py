"""Learned Token Pruning for causal LMs (``token_pruning_bert_to_gpt2.txt``, "LTP"; Kim et al.).

The paper scores token j at layer l by the attention it receives, I_j = (1/T) Σ_i A_ij, keeps
it if I_j ≥ τ_l, learns one threshold per layer initialised τ_l⁽⁰⁾ = (l + 1)/L · τ_final, uses
the soft mask m_j = σ((I_j − τ_l)/T_temp) in training and the hard mask at inference, protects
the last tokens of the sequence, and adds a sparsity penalty λ·m̄_l to the LM loss.

In a causal LM that score leaks: Σ_i runs over queries i > j, i.e. the future. The only query
that can see token j when the decision about j must be made (before block l processes j) is
j itself, so any attention-received score collapses to A_jj. We therefore learn the causal
importance from the token's own state (the "learned per-token score" option of issue 5):

    I_j⁽ˡ⁾ = σ(w_l · LN(h_j⁽ˡ⁾) + b_l)        (h_j⁽ˡ⁾: input of block l, LN without affine)
    m̃_j   = σ((I_j − τ_l) / T_temp)            training (soft; τ_l learned)
    m_j    = [I_j ≥ τ_l]                        inference (hard)
    L_sparsity = λ · Σ_l max(0, m̄_l − ρ_l) / |layers|,  m̄_l = mean of m̃ over alive real tokens
                                                  (ρ_l = ``keep_ratios[l]``, else the host's ρ)

I_j depends on h_j⁽ˡ⁾ only, which in a causal model depends on tokens ≤ j: the decision is
causal and the same in a cached decode step as in a full recompute (the leakage test checks
it). With ρ unset the penalty is the paper's linear λ·m̄_l; a budget ρ stops it at that share.

Scale choices (ours, not the paper's): I ∈ (0, 1) rather than ~1/T, so τ_final defaults to
0.5 instead of 0.01, and b_l starts at logit(τ_l + 3·T_temp) so m̃ ≈ σ(3) ≈ 0.95: every token is
kept at first and the soft mask is not saturated (its gradient reaches τ_l and w_l).
``straight_through=True`` (default, our deviation from the paper's pure soft mask): the forward
pass uses the hard mask m_j and the backward pass the gradient of m̃_j. With the pure soft mask
(``straight_through=False``) the model learns to live on intermediate m̃ (a soft-dropped token
still updates and is still attended a little): on ``shakespeare_char`` / ``cpu-small`` the
training loss stayed at the baseline's 1.93 while the hard-mask validation loss was 2.23.
``protect_last`` (the paper's stabiliser) applies in training only: at inference a "last N"
rule would make a token's fate depend on how many tokens follow it, which breaks causality.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnprune.methods.base import Selection, TokenMethod
from attnprune.methods.registry import register


def parse_layers(layers, n_layers: int, default: list[int], name: str = "layers") -> tuple[int, ...]:
    """Decision layers from an int, a list, or None (→ ``default``); each in 1..n_layers−1."""
    if layers is None:
        layers = default
    if isinstance(layers, int):
        layers = [layers]
    try:
        out = tuple(sorted({int(x) for x in layers}))
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a list of layer indices, got {layers!r}") from None
    bad = [x for x in out if not 1 <= x < n_layers]
    if bad or not out:
        raise ValueError(f"{name}: decision layers must be in 1..{n_layers - 1}, got {list(layers)}")
    return out


def protect_last(mask: Tensor, n: int) -> Tensor:
    """(B, K) bool marking the last ``n`` real tokens of each row."""
    if n <= 0:
        return torch.zeros_like(mask, dtype=torch.bool)
    from_end = mask.flip(1).long().cumsum(1).flip(1)  # 1 for the last real token, 2 before it…
    return mask & (from_end <= n)


@register("ltp_causal", kind="token", paper="token_pruning_bert_to_gpt2.txt (LTP, τ_l init, soft mask)")
class LTPCausal(TokenMethod):
    """Learned per-layer thresholds on a causal learned importance; soft in training, hard at eval."""

    variable_budget = True  # the kept count is decided per token (policy / thresholds), not ⌊ρ·n⌋

    causal = True

    def __init__(self, d_model: int, n_layers: int, layers=None, tau_final: float = 0.5,
                 temperature: float = 0.05, sparsity_weight: float = 1.0,
                 protect_last: int = 4, straight_through: bool = True,
                 keep_ratios=None) -> None:
        super().__init__()
        self.layers = parse_layers(layers, n_layers, list(range(1, n_layers)))
        # Per-decision-layer budgets ρ_l (ours): one value per entry of ``layers``, in place of
        # the host's single ρ. Dropping a token before an early block costs every later block's
        # context, before the last block only that block's, so a budget may be mild early and
        # strict late for the same FLOPs.
        self.keep_ratios = None
        if keep_ratios is not None:
            if not isinstance(keep_ratios, (list, tuple)) or len(keep_ratios) != len(self.layers):
                raise ValueError(f"keep_ratios: give one budget per decision layer {list(self.layers)}, "
                                 f"got {keep_ratios!r}")
            for r in keep_ratios:
                if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0.0 < r <= 1.0:
                    raise ValueError(f"keep_ratios: every budget must be in (0, 1], got {r!r}")
            self.keep_ratios = tuple(float(r) for r in keep_ratios)
        self.straight_through = bool(straight_through)
        if not 0.0 < tau_final < 1.0:
            raise ValueError(f"tau_final must be in (0, 1), got {tau_final}")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if sparsity_weight < 0:
            raise ValueError(f"sparsity_weight must be ≥ 0, got {sparsity_weight}")
        if protect_last < 0:
            raise ValueError(f"protect_last must be ≥ 0, got {protect_last}")
        self.temperature = float(temperature)
        self.sparsity_weight = float(sparsity_weight)  # λ
        self.protect_last = int(protect_last)
        n = len(self.layers)
        self.slot = {l: i for i, l in enumerate(self.layers)}
        # τ_l⁽⁰⁾ = (l + 1)/L · τ_final (paper), one learned threshold per decision layer.
        tau0 = torch.tensor([(l + 1) / n_layers * tau_final for l in self.layers])
        self.tau = nn.Parameter(tau0)
        self.w = nn.Parameter(torch.zeros(n, d_model))
        start = (tau0 + 3 * temperature).clamp(max=0.99)
        self.b = nn.Parameter(torch.log(start / (1 - start)))  # logit: I starts at τ_l + 3T

    def _slot(self, layer: int) -> int:
        # Outside a host (standalone use, the registry's generic checks) a layer that is not a
        # decision layer scores with the first decision layer's parameters.
        return self.slot.get(layer, 0)

    def importance(self, hidden: Tensor, layer: int) -> Tensor:
        """I_j = σ(w_l · LN(h_j) + b_l), (B, K) in (0, 1); uses token j's own state only.

        LN without affine, computed without a normalised copy of h (a memory-bound pass that
        cost ~3× the rest on CPU): w·LN(h) = (w·h − μ Σw) / √(E[h²] − μ² + ε), μ and E[h²]
        from a matrix-vector product and a vector norm (ε = 1e-5, as ``F.layer_norm``).
        """
        i = self._slot(layer)
        w = self.w[i]
        d = hidden.shape[-1]
        # one product gives w·h and μ = h·(1/d): (…, 2)
        wm = torch.stack([w, w.new_full((d,), 1.0 / d)], dim=1)
        wh, mu = (hidden @ wm).unbind(-1)
        var = (torch.linalg.vector_norm(hidden, dim=-1).square() / d - mu * mu).clamp_min(0)
        return torch.sigmoid((wh - mu * w.sum()) * torch.rsqrt(var + 1e-5) + self.b[i])

    def forward(self, hidden, mask, attn=None, keep_ratio=None, layer=0, labels=None, protect=None):
        """Selection for the tokens entering block ``layer`` (see module docstring)."""
        imp = self.importance(hidden, layer)
        tau = self.tau[self._slot(layer)]
        if keep_ratio is not None and keep_ratio >= 1.0:  # the host's ρ = 1 switches pruning off
            return Selection(mask.clone(), scores=imp)
        if self.keep_ratios is not None:
            keep_ratio = self.keep_ratios[self._slot(layer)]
        if keep_ratio is not None and keep_ratio >= 1.0:  # ρ = 1: pruning off
            return Selection(mask.clone(), scores=imp)
        if not self.training:
            keep = (imp >= tau) & mask
            if protect is not None:  # hosts pass it only where it is causal
                keep = keep | (protect & mask)
            return Selection(keep, scores=imp)
        soft = torch.sigmoid((imp - tau) / self.temperature)
        # Hosts pass ``protect`` by original position; alone, protect the row's last real tokens.
        prot = protect_last(mask, self.protect_last) if protect is None else protect & mask
        soft = torch.where(prot, torch.ones_like(soft), soft)
        m = mask.to(soft.dtype)
        mean_soft = (soft * m).sum() / m.sum().clamp_min(1)  # m̄_l
        excess = mean_soft if keep_ratio is None else F.relu(mean_soft - keep_ratio)
        aux = self.sparsity_weight * excess / len(self.layers)
        if self.straight_through:
            # Forward with the hard mask the model will meet at inference, backward through m̃.
            hard = ((imp >= tau) | prot).to(soft.dtype)
            soft = hard + soft - soft.detach()
        return Selection(mask.clone(), soft=soft, scores=imp, aux_loss=aux)


