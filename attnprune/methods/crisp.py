"""Crisp attention: top-k sparsity of the pre-softmax scores (``crisp_attention.txt``).

Notation (the paper's): S = QKᵀ/√d_k the scores of one head (Tq × Tk), s the sparsity, n the
number of keys a query may see (padding and the causal triangle removed), k = ⌈(1 − s)·n⌉.

    S̃_ij = S_ij        if S_ij is among the k largest of row i      ("Method Summary":
    S̃_ij = −∞          otherwise                                      scores below the s-th
    A = softmax(S̃) V                                                  percentile are set to −∞)

Per head and per query the threshold is the k-th largest allowed score of that row; ties at the
threshold are all kept, so a row may keep slightly more than k. k ≥ 1, so no row is empty, and
s = 0 gives k = n: the stock softmax exactly.

S is the score the model's own softmax sees: the host passes the family's terms (Gemma 2's
logit softcap, MPNet's relative position bias, DeBERTa-v2's disentangled c2p/p2c terms, see
:func:`attnprune.attention.score_terms`), and with grouped-query attention the key heads
repeated per query head, so the top-k is taken per query head. The score and top-k math lives
in :mod:`attnprune.attention` (:func:`~attnprune.attention.topk_row_mask`).

Gradients pass straight through the kept entries: the threshold is computed without gradient
(it is a selection, not a function we differentiate), masked entries get −∞ and so a zero
gradient, and kept entries receive the ordinary softmax gradient. The choice of which entries
survive is therefore not learned directly, only reshaped by how the kept scores move.

Sparsity schedule (one parser, :func:`parse_sparsity`): a number (uniform), a list with one
value per layer, or ``schedule="adaptive"``. The paper leaves the adaptive rule underspecified
("thresholds recalculated per batch, layers self-determine pruning"); the rule used here:

    w_l = 1 − Ĥ_l,   Ĥ_l = mean normalised entropy H/log n of layer l's dense attention rows
    s_l = clip(s · w_l / mean_l w, 0, s_max)

Ĥ_l is an exponential moving average (``momentum``) over training batches, updated in training
mode only (evaluation uses the frozen values, so predictions do not depend on batch order); it
starts at 0.5 for every layer, i.e. uniform. Layers whose attention is already peaked are pruned
more, flat ones less, and the mean sparsity over layers stays s (before clipping). The buffer
``entropy_ema`` (one value per layer) and ``layer_sparsity()`` let the caller see the state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnprune.attention import (
    allowed_keys,
    masked_scores,
    mean_normalised_entropy,
    score_bias,
    softmax_rows,
    topk_row_mask,
)
from attnprune.compat import hf_initialized, own_buffer
from attnprune.methods.base import AttentionMethod
from attnprune.methods.registry import register

S_MAX = 0.99  # never mask a whole row's worth of keys; k ≥ 1 is also enforced per row


def parse_sparsity(sparsity: float | Sequence[float], n_layers: int) -> list[float]:
    """One sparsity per layer from a number (uniform) or a list (one per layer).

    Raises ValueError naming ``sparsity`` for values outside [0, 1) or a list of the wrong
    length."""
    if isinstance(sparsity, (int, float)):
        values = [float(sparsity)] * n_layers
    else:
        values = [float(v) for v in sparsity]
        if len(values) != n_layers:
            raise ValueError(
                f"sparsity: a list needs one value per layer ({n_layers}), got {len(values)}"
            )
    for v in values:
        if not 0.0 <= v < 1.0:
            raise ValueError(f"sparsity: every value must be in [0, 1), got {v}")
    return values


@register("crisp", kind="attention", paper="crisp_attention.txt")
class CrispAttention(AttentionMethod):
    """Crisp attention: keep the top (1 − s) share of each row's pre-softmax scores."""

    needs_hidden = False
    neutral_options: ClassVar[dict] = {"sparsity": 0.0}
    example_options: ClassVar[dict] = {"sparsity": 0.5}

    def __init__(
        self,
        sparsity: float | Sequence[float] = 0.8,
        schedule: str = "uniform",
        n_layers: int = 1,
        momentum: float = 0.9,
    ) -> None:
        super().__init__()
        if schedule not in ("uniform", "adaptive"):
            raise ValueError(f"schedule: must be 'uniform' or 'adaptive', got {schedule!r}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum: must be in [0, 1), got {momentum}")
        if schedule == "adaptive" and not isinstance(sparsity, (int, float)):
            raise ValueError("sparsity: the adaptive schedule takes one target value, not a list")
        self.base = parse_sparsity(sparsity, n_layers)
        self.schedule = schedule
        self.momentum = momentum
        self.register_buffer("entropy_ema", torch.empty(n_layers))
        self.reset_buffers()

    def reset_buffers(self) -> None:
        """Start uniform: equal normalised entropy in every layer."""
        with torch.no_grad():
            self.entropy_ema.fill_(0.5)

    def _apply(self, fn, recurse=True):
        # A module on the meta device holds no values, and materialising it (``to_empty``, as
        # from_pretrained(low_cpu_mem_usage=True) and accelerate's init_empty_weights do) leaves
        # uninitialised memory that HF's init_weights never visits (it knows only its own
        # module types): the adaptive schedule then read garbage. Start again from the initial
        # value whenever the buffer leaves the meta device (a checkpoint's values, loaded
        # afterwards, still win).
        was_meta = self.entropy_ema.is_meta
        out = super()._apply(fn, recurse)
        if was_meta and not self.entropy_ema.is_meta:
            self.reset_buffers()
        return out

    def __setattr__(self, name: str, value) -> None:
        # transformers' loader builds the model on the meta device and gives every missing key
        # (``from_pretrained(None, config=..., state_dict={})``, or a checkpoint saved before the
        # patch) a ``torch.empty_like`` tensor by ``setattr``, then leaves it to ``_init_weights``,
        # which knows only transformers' module types: the EMA was uninitialised memory (issue
        # 48). Such a tensor replacing the meta buffer starts from the initial value; one the
        # loader filled from a checkpoint is marked ``_is_hf_initialized`` and kept, and so is
        # what ``load_state_dict(assign=True)`` assigns.
        fresh = (name == "entropy_ema" and isinstance(value, Tensor) and not value.is_meta
                 and not hf_initialized(value)
                 and not self.__dict__.get("_assigning", False))
        if fresh:
            old = own_buffer(self, "entropy_ema")
            fresh = old is not None and old.is_meta
        super().__setattr__(name, value)
        if fresh:
            self.reset_buffers()

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        self.__dict__["_assigning"] = True  # checkpoint values, assigned or copied, win
        try:
            super()._load_from_state_dict(*args, **kwargs)
        finally:
            self.__dict__["_assigning"] = False

    def layer_sparsity(self) -> list[float]:
        """The sparsity each layer uses now (the adaptive rule's current allocation)."""
        if self.schedule == "uniform":
            return list(self.base)
        w = (1.0 - self.entropy_ema).clamp(min=1e-3)
        s = self.base[0] * w / w.mean()
        return [float(v) for v in s.clamp(0.0, S_MAX)]

    def _update_entropy(self, layer: int, scores: Tensor) -> None:
        """EMA of the layer's mean normalised row entropy of the dense attention (training)."""
        with torch.no_grad():
            h_norm = mean_normalised_entropy(scores)
            m = self.momentum
            self.entropy_ema[layer] = m * self.entropy_ema[layer] + (1 - m) * h_norm

    def attend(
        self,
        module: nn.Module,
        query: Tensor,  # (B, H, Tq, d)
        key: Tensor,  # (B, H, Tk, d)
        value: Tensor,  # (B, H, Tk, d)
        mask: Tensor | None,
        *,
        dropout: float,
        scaling: float,
        layer: int,
        need_weights: bool = False,
        softcap: float | None = None,
        bias: Tensor | None = None,
        **_,
    ) -> tuple[Tensor, Tensor]:
        """Attention with per-row top-k scores; returns (out (B, Tq, H, d), probs). The top-k
        acts on the scores the family's softmax sees (softcap and bias included: MPNet's
        relative bias and DeBERTa's disentangled terms decide which keys count as largest)."""
        tq, tk = query.shape[-2], key.shape[-2]
        allowed = allowed_keys(mask, bool(getattr(module, "is_causal", False)), tq, tk,
                               query.device)
        scores = masked_scores(query, key, scaling, allowed, softcap=softcap,
                               bias=score_bias(mask, tk, bias))
        if self.schedule == "adaptive" and self.training:
            self._update_entropy(layer, scores)
        s = self.layer_sparsity()[layer]
        if s > 0.0:
            keep = topk_row_mask(scores, s)
            scores = scores.masked_fill_(~keep, float("-inf"))
        probs = softmax_rows(scores).to(value.dtype)
        probs = F.dropout(probs, p=dropout, training=module.training)
        out = torch.matmul(probs, value).transpose(1, 2).contiguous()
        return out, probs


def expected_kept_share(sparsity: float, n: int) -> float:
    """k/n kept by crisp on a row of n keys (used by analytic proxies and tests)."""
    return max(1, math.ceil((1.0 - sparsity) * n)) / n
