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
:func:`score_terms`), and with grouped-query attention the key heads repeated per query head,
so the top-k is taken per query head.

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

import torch
import torch.nn.functional as F
from torch import Tensor, nn

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


def allowed_keys(
    mask: Tensor | None, is_causal: bool, tq: int, tk: int, device: torch.device
) -> Tensor | None:
    """Boolean (B|1, 1|H, Tq, Tk) mask, True = the query may attend to the key, or None (all).

    Accepts HF's boolean masks (``sdpa_mask``) and additive float masks (``eager_mask``). When
    the mask is None and the module is causal, rebuilds the triangle (HF passes None for plain
    causal prefill and for decode steps); queries are the last Tq positions of the Tk keys."""
    if mask is not None:
        if mask.dtype != torch.bool:
            # additive mask: 0 where allowed, finfo.min (or −inf) where not
            mask = mask > torch.finfo(mask.dtype).min / 2
        return mask[..., -tk:]
    if is_causal and tq > 1:
        q_pos = torch.arange(tk - tq, tk, device=device)[:, None]
        k_pos = torch.arange(tk, device=device)[None, :]
        return (k_pos <= q_pos)[None, None]
    return None


def score_terms(scores: Tensor, allowed: Tensor | None, *, softcap: float | None = None,
                bias: Tensor | None = None) -> Tensor:
    """The family's own terms on scaled scores S (B, H, Tq, Tk), then the mask (−∞).

    ``softcap`` c (Gemma 2): S ← c·tanh(S/c), before the mask as in Gemma 2's attention; it is
    monotone, so top-k picks the same keys, but the softmax differs. ``bias``: additive terms
    that belong to the scores, broadcastable to S (MPNet's relative position bias, DeBERTa-v2's
    disentangled c2p + p2c terms); added after the softcap (no family has both)."""
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    if allowed is not None:
        # in place on a tensor made above: no backward needs the overwritten values
        scores = scores.masked_fill_(~allowed, float("-inf"))
    return scores


def masked_scores(query: Tensor, key: Tensor, scaling: float, allowed: Tensor | None, *,
                  softcap: float | None = None, bias: Tensor | None = None) -> Tensor:
    """S = QKᵀ·scaling with the family's terms (:func:`score_terms`) and disallowed entries at
    −∞; (B, H, Tq, Tk). Query and key have the same number of heads (the host repeats GQA's
    key/value heads)."""
    # in place on the fresh matmul output: neither op's backward needs the overwritten values
    scores = torch.matmul(query, key.transpose(-1, -2)).mul_(scaling)
    return score_terms(scores, allowed, softcap=softcap, bias=bias)


def score_bias(mask: Tensor | None, tk: int, bias: Tensor | None = None) -> Tensor | None:
    """``bias`` (the family's own score terms, or None) plus the finite part of an additive
    float mask.

    HF's own masks are boolean here (``sdpa_mask``) or 0 / finfo.min, which ``allowed_keys``
    covers. A token method stacked on the same model (``attnprune.patch(..., stack=True)``)
    passes, in training, soft masks log m̃_j on the keys (``hf_encoder`` ``soft_mode="bias"``,
    ``hf_causal``'s alive weights); treating them as allowed/not-allowed only would drop the
    relaxation that lets the token gate learn."""
    if mask is None or mask.dtype == torch.bool:
        return bias
    m = mask[..., -tk:]
    soft = torch.where(m > torch.finfo(m.dtype).min / 2, m,
                       torch.zeros((), dtype=m.dtype, device=m.device))
    return soft if bias is None else bias + soft


def softmax_rows(scores: Tensor) -> Tensor:
    """softmax over the last axis; rows with no allowed key (all −∞) give zeros, not NaN."""
    probs = torch.softmax(scores, dim=-1)
    return torch.nan_to_num(probs, nan=0.0)


def fused_attention(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, *,
                    is_causal: bool, scaling: float, dropout: float, training: bool,
                    softcap: float | None = None, bias: Tensor | None = None) -> Tensor:
    """softmax(S)V through ``F.scaled_dot_product_attention`` where it can express S; out
    (B, Tq, H, d). A bias joins the mask as one additive float mask (finfo.min where not
    allowed, as HF's eager paths do, so a row with no allowed key is uniform, not NaN); the
    softcap's tanh has no fused form, so softcapped families take the dense path."""
    tq, tk = query.shape[-2], key.shape[-2]
    p = dropout if training else 0.0
    if softcap:
        allowed = allowed_keys(mask, is_causal, tq, tk, query.device)
        probs = softmax_rows(masked_scores(query, key, scaling, allowed, softcap=softcap,
                                          bias=bias)).to(value.dtype)
        probs = F.dropout(probs, p=p, training=training)
        return torch.matmul(probs, value).transpose(1, 2).contiguous()
    causal = False
    if bias is not None:
        allowed = allowed_keys(mask, is_causal, tq, tk, query.device)
        mask = bias.to(query.dtype)
        if allowed is not None:  # where() broadcasts a (1, H, ·) bias against a (B, 1, ·) mask
            mask = torch.where(allowed, mask, torch.finfo(query.dtype).min)
    else:
        causal = mask is None and is_causal and tq > 1
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=p,
                                         scale=scaling, is_causal=causal)
    return out.transpose(1, 2).contiguous()


def topk_row_mask(scores: Tensor, sparsity: float) -> Tensor:
    """Boolean mask of the entries kept by crisp: per row the k = ⌈(1 − s)·n⌉ largest finite
    scores (n = finite entries of the row), ties at the threshold kept. No gradient."""
    with torch.no_grad():
        finite = torch.isfinite(scores)
        n = finite.sum(-1, keepdim=True)  # (B, H, Tq, 1)
        k = torch.clamp(torch.ceil((1.0 - sparsity) * n.float()).long(), min=1)
        k = torch.minimum(k, torch.clamp(n, min=1))
        k_max = int(k.max())
        top = torch.topk(scores, k_max, dim=-1).values  # sorted descending
        thr = top.gather(-1, k - 1)
        return (scores >= thr) & finite


@register("crisp", kind="attention", paper="crisp_attention.txt")
class CrispAttention(nn.Module):
    """Crisp attention: keep the top (1 − s) share of each row's pre-softmax scores."""

    needs_hidden = False

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
                 and not getattr(value, "_is_hf_initialized", False)
                 and not self.__dict__.get("_assigning", False))
        if fresh:
            old = self.__dict__.get("_buffers", {}).get("entropy_ema")
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
            p = torch.softmax(scores.float(), dim=-1)
            h = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)
            n = torch.isfinite(scores).sum(-1).clamp(min=2).float()
            h_norm = (h / torch.log(n)).mean()
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
