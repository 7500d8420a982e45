"""Learned Token Pruning (LTP): a learned threshold θ_l per layer on the attention received.

Paper: "LTP" section of ``token_pruning_bert_to_gpt2.txt`` (after Kim et al., KDD 2022).
Importance of token j after layer l (the paper's s⁽ˡ⁾(x_j), eq. in "LTP Implementation"):

    I_j = (1 / (H·n)) Σ_h Σ_i A⁽ʰ'ˡ⁾[i, j]          mean attention received (real queries i)

Training (soft, so gradients reach θ_l and the model):

    m̃_j = σ((Ĩ_j − θ_l) / T)                        soft mask, T = ``temperature``
    L_total = L_task + λ · L_sparsity                  λ = ``sparsity_weight``

Inference (hard, real savings): keep j iff Ĩ_j ≥ θ_l; the kept count varies per example.

Choices the paper leaves open, made here:
* Ĩ_j = n · I_j, the importance relative to a uniform share (mean 1 over the real tokens of a
  row), so one θ_l serves short and long sequences alike; the raw I_j shrinks as 1/n.
* L_sparsity = mean over pruning layers of (m̄_l − ρ_l)², m̄_l the mean soft mask of the layer
  over real tokens, ρ_l the host's step keep ratio: the user's ``keep_ratio`` sets the
  target, which makes a ρ sweep possible (the paper's plain penalty on m̄ has no target).
  ``target=False`` uses the paper's plain λ·m̄_l.
* θ_l starts at ``init_threshold`` for every layer (the paper's (l+1)/L · τ_final ramp is for
  raw, length-dependent I). With ``calibrate=True`` (default), the first training forward of
  each layer instead sets θ_l to the (1 − ρ_l) quantile of Ĩ over that batch's real tokens, so
  training starts at the target keep ratio (under DDP over the real tokens of every process's
  batch, so all processes hold one θ). Measured on MiniLM / tweets (README): from the fixed 0.5
  start, 125 steps with λ = 1 left every ρ ∈ {0.3, 0.5, 0.75} at a kept ratio of 0.71;
  the penalty's gradient, 2λ(m̄ − ρ)·∂m̄/∂θ, is too small to move θ that far in a short
  fine-tune. The flag ``calibrated`` (a buffer, saved with the weights) records which layers
  are done; a checkpoint with a learned θ but no flag loads as calibrated.
* The hard decision also keeps at least one token per row (CLS is protected by the host).
"""

from __future__ import annotations

import torch
from torch import nn

from attnprune.attention import attention_received
from attnprune.methods.base import Selection, TokenMethod
from attnprune.methods.registry import register
from attnprune.selection import threshold_keep


def _all_ranks(vals: torch.Tensor) -> torch.Tensor:
    """``vals`` (n,) of this process joined with those of every other process of an
    initialised ``torch.distributed`` group (as is; alone, or no group: unchanged).

    Why gather rather than average each rank's θ or broadcast rank 0's: under DDP each process
    sees 1/N of the global batch, and the (1 − ρ) quantile of the union is exactly what one
    process with the global batch calibrates (DDP's promise: N processes = one process with
    N× the batch). Broadcasting rank 0's would use 1/N of the data; a mean of per-rank
    quantiles is not a quantile of anything. Every rank calls this on the same (first training)
    forward of the same layer, since ``calibrated`` starts equal everywhere, so the collectives
    match; a rank without real tokens still takes part (with 0 values)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return vals
    sizes = [torch.zeros(1, dtype=torch.long, device=vals.device)
             for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, torch.tensor([vals.numel()], device=vals.device))
    # all_gather needs equal shapes: pad to the longest with NaN, then drop the padding
    n_max = int(max(int(n) for n in sizes))
    padded = torch.full((n_max,), float("nan"), dtype=vals.dtype, device=vals.device)
    padded[: vals.numel()] = vals
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded)
    return torch.cat([p[: int(n)] for p, n in zip(parts, sizes, strict=True)])


@register("ltp", kind="token", paper="token_pruning_bert_to_gpt2.txt, LTP (learned thresholds)")
class LearnedTokenPruning(TokenMethod):
    """Learned per-layer thresholds θ_l on attention received: soft σ((I − θ_l)/T) in training,
    hard I ≥ θ_l at inference."""

    needs_attention = True
    variable_budget = True  # thresholds decide the kept count, not ⌊ρ·n⌋
    attention_rows = "received"  # the host may pass R_h[j] = mean_i A_h[i, j] (B, H, 1, L)

    def __init__(self, n_layers: int = 12, init_threshold: float = 0.5, temperature: float = 0.1,
                 sparsity_weight: float = 1.0, target: bool = True, calibrate: bool = True) -> None:
        super().__init__()
        if n_layers < 1:
            raise ValueError(f"n_layers must be ≥ 1, got {n_layers}")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if sparsity_weight < 0:
            raise ValueError(f"sparsity_weight must be ≥ 0, got {sparsity_weight}")
        self.theta = nn.Parameter(torch.full((n_layers,), float(init_threshold)))  # θ_l
        self.temperature = float(temperature)
        self.sparsity_weight = float(sparsity_weight)
        self.target = bool(target)
        self.calibrate = bool(calibrate)
        self.register_buffer("calibrated", torch.zeros(n_layers, dtype=torch.bool))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # Checkpoints from before the flag existed hold a learned θ: treat it as calibrated.
        if prefix + "theta" in state_dict and prefix + "calibrated" not in state_dict:
            state_dict[prefix + "calibrated"] = torch.ones_like(self.calibrated)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @torch.no_grad()
    def _calibrate(self, imp, mask, keep_ratio: float, layer: int) -> None:
        """θ_l ← the (1 − ρ) quantile of Ĩ over the real tokens (once per layer); under
        ``torch.distributed``, over the real tokens of every process's batch."""
        vals = _all_ranks(imp[mask.bool()].float())
        if vals.numel() == 0:
            return
        self.theta[layer] = torch.quantile(vals, 1.0 - float(keep_ratio)).to(self.theta.dtype)
        self.calibrated[layer] = True

    def importance(self, attn, mask):
        """Ĩ (B, L) = n · mean attention received (1 = a uniform share). ``attn`` is either the
        probabilities (B, H, L, L) or, from hosts honouring ``attention_rows = "received"``,
        the per-head received attention averaged over real queries (B, H, 1, L)."""
        n = mask.sum(dim=1, keepdim=True).clamp_min(1).to(attn.dtype)
        if attn.shape[-2] == 1:  # already averaged over the queries (same value if L = 1)
            return attn[:, :, 0, :].mean(dim=1) * n
        return attention_received(attn, mask, "mean") * n

    def forward(self, hidden, mask, attn=None, keep_ratio=0.5, layer=0, labels=None, protect=None):
        if attn is None:
            raise ValueError("ltp needs the attention probabilities of the previous layer")
        imp = self.importance(attn.detach(), mask)
        if self.training and self.calibrate and not bool(self.calibrated[layer]):
            self._calibrate(imp, mask, keep_ratio, layer)
        theta = self.theta[layer]
        keep = threshold_keep(imp, theta.detach(), mask, protect=protect)
        soft, aux = None, None
        if self.training:
            soft = torch.sigmoid((imp - theta) / self.temperature) * mask.to(imp.dtype)
            m = mask.to(imp.dtype)
            mean_gate = (soft * m).sum() / m.sum().clamp_min(1)
            penalty = (mean_gate - keep_ratio) ** 2 if self.target else mean_gate
            aux = self.sparsity_weight * penalty
        return Selection(keep, soft=soft, scores=imp, aux_loss=aux, info={"theta": theta.detach()})
