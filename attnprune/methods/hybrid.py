"""Hybrid DTR + LTP (``token_pruning_bert_to_gpt2.txt``, "Hybrid").

The paper puts DTR at layers 4 and 8 and LTP on the last three layers (9, 10, 11) of a
12-layer GPT-2, trained in two stages: (1) the DTR policy on the frozen backbone; (2) LTP and
the backbone with the policy frozen, loss L_LM + λ_sparse · (1/3) Σ_l m̄_l.

Depth scaling (ours): DTR at round(4L/12) and round(8L/12), LTP at the last three decision
layers max(1, L−3) … L−1 (for L = 12: 4, 8 and 9, 10, 11, the paper's). On shallow models the
sets may overlap; at a shared layer a token survives only if both keep it.
``stage=1`` runs DTR alone (LTP keeps everything); ``stage=2`` runs both, with the policy
deterministic (π ≥ 0.5) whatever the mode, as it is frozen in that stage.

The DTR part is :class:`attnprune.methods.dtr.DTR` with its per-position returns,
leave-one-out baseline over ``dtr_samples`` samples per sequence and, with
``dtr_keep_target`` set, a budget on its kept share (``dtr_sparsity_weight`` is then the
multiplier's start); ``dtr_discount``, ``dtr_budget_lr`` and ``dtr_budget_gain`` go to it too.
``keep_ratio`` (the patch's budget) is LTP's target, applied in stage 2 on top of DTR's.
"""

from __future__ import annotations

from torch import nn

from attnprune.methods.base import Selection, TokenMethod
from attnprune.methods.dtr import DTR, default_dtr_layers
from attnprune.methods.ltp_causal import LTPCausal, parse_layers
from attnprune.methods.registry import register


@register("hybrid", kind="token", paper="token_pruning_bert_to_gpt2.txt (Hybrid: DTR 4, 8 + LTP 9–11)")
class Hybrid(TokenMethod):
    """DTR at about a third and two thirds of the depth, LTP on the last three layers."""

    variable_budget = True  # the kept count is decided per token (policy / thresholds), not ⌊ρ·n⌋

    causal = True

    def __init__(self, d_model: int, n_layers: int, stage: int = 2, dtr_layers=None,
                 ltp_layers=None, dtr_sparsity_weight: float = 1e-4,
                 ltp_sparsity_weight: float = 1.0, temperature: float = 0.05,
                 tau_final: float = 0.5, protect_last: int = 4,
                 straight_through: bool = True, dtr_keep_target: float | None = None,
                 dtr_samples: int = 4, dtr_discount: float = 0.9, dtr_budget_lr: float = 0.05,
                 dtr_budget_gain: float = 2.0) -> None:
        super().__init__()
        if stage not in (1, 2):
            raise ValueError(f"stage must be 1 (DTR policy) or 2 (LTP + backbone), got {stage}")
        self.stage = int(stage)
        d_l = parse_layers(dtr_layers, n_layers, default_dtr_layers(n_layers), "dtr_layers")
        default_ltp = list(range(max(1, n_layers - 3), n_layers))
        l_l = parse_layers(ltp_layers, n_layers, default_ltp, "ltp_layers")
        self.dtr = DTR(d_model, n_layers, layers=d_l, sparsity_weight=dtr_sparsity_weight,
                       keep_target=dtr_keep_target, samples=dtr_samples, discount=dtr_discount,
                       budget_lr=dtr_budget_lr, budget_gain=dtr_budget_gain)
        self.ltp = LTPCausal(d_model, n_layers, layers=l_l, tau_final=tau_final,
                             temperature=temperature, sparsity_weight=ltp_sparsity_weight,
                             protect_last=protect_last, straight_through=straight_through)
        self.layers = tuple(sorted(set(d_l) | set(l_l)))
        self.protect_last = self.ltp.protect_last

    def train(self, mode: bool = True) -> nn.Module:
        """In stage 2 the frozen policy stays deterministic (eval) in training too."""
        super().train(mode)
        if self.stage == 2:
            self.dtr.eval()
        return self

    def forward(self, hidden, mask, attn=None, keep_ratio=None, layer=0, labels=None, protect=None):
        """Combine the DTR and LTP decisions of ``layer`` (a token must pass both)."""
        if layer not in self.layers:  # standalone use: act as at the first decision layer
            layer = self.layers[0]
        keep, soft, aux, info, scores = mask.clone(), None, None, None, None
        if layer in self.dtr.layers:
            s = self.dtr(hidden, mask, keep_ratio=keep_ratio, layer=layer)
            keep, info, scores = keep & s.keep, s.info, s.scores
        if self.stage == 2 and layer in self.ltp.layers:
            s = self.ltp(hidden, mask, keep_ratio=keep_ratio, layer=layer, protect=protect)
            keep, soft, aux = keep & s.keep, s.soft, s.aux_loss
            scores = s.scores if scores is None else scores
        if protect is not None and not self.training:  # hosts pass it only where causal
            keep = keep | (protect & mask)
        if soft is not None:  # DTR drops hard; LTP's soft weight only on the survivors
            soft = soft * keep.to(soft.dtype)
        return Selection(keep, soft=soft, scores=scores, aux_loss=aux, info=info)

    @property
    def samples(self) -> int:
        """Rows per sequence the training loop feeds while the policy learns (stage 1)."""
        return self.dtr.samples if self.stage == 1 else 1

    def reinforce_loss(self, actions, token_loss, valid=None):
        """The DTR policy's REINFORCE loss (stage 1)."""
        return self.dtr.reinforce_loss(actions, token_loss, valid)

    def train_stats(self) -> dict:
        """The DTR policy's λ and last sampled kept share."""
        return self.dtr.train_stats()
