"""The entropy paper's tiny encoder–gate–encoder model (``entropy_guided_token_pruning.txt`` §4).

    tokens → Embedding (fixed random E, optional IDF weights w)        X      (B, L, d)
           → Attention-1, single head, eq. 1                           X⁽¹⁾   (B, L, d)
           → gate: a registered token method (attnprune/methods/)      keep   (B, L)
           → gather the kept tokens (they leave the tensor)            X̂⁽¹⁾   (B, K, d)
           → Attention-2, single head, eq. 1                           X⁽²⁾   (B, K, d)
           → masked mean pool (§4.4)                                   x̄      (B, d)
           → linear classifier o = x̄ W_c + b_c                          logits (B, C)

Notation: B batch, L length, K = kept tokens (⌊ρL⌋ for top-k gates), d width, C classes,
ρ keep ratio (``keep_ratio``), A attention weights, m_i / m̃_i hard / relaxed gate.

Choices the paper leaves open, made here and named in the config:
* ``residual=True``: each attention block returns X + AV (a Transformer block's skip
  connection). Eq. 1 literally gives X' = AV; without the skip every token of X⁽¹⁾ is a mixture of
  the whole sequence and a per-token gate has little to choose between. ``residual=False`` is
  the literal eq. 1.
* The embedding table is the fixed random E of §3.2 (a buffer, not trained).
* Relaxed gates (``entropy_gumbel``) in training: X̂⁽¹⁾ = m̃ ⊙ X⁽¹⁾ at full length and the pool
  weights are m̃ (so the classifier's gradient reaches the gate); at evaluation, the hard keep
  mask and gathering, like every other gate.
* At evaluation, rows of a batch whose kept counts differ (``entropy_threshold``) go through
  Attention-2 in groups of similar length (``bucket_rows``; :func:`attnprune.selection.row_groups`)
  instead of all padded to the longest: the same outputs for fewer FLOPs.
* Softmax masking uses the dtype's most negative finite value instead of −∞, so a row with no
  real key (all padding) gives finite weights instead of NaN; such rows are padding themselves
  and are excluded from the pool.

:func:`numpy_forward` is the NumPy reference of the evaluation forward (float64), written
from the equations; ``tests/test_synthetic_model.py`` checks it against the module to 1e-5.
The module is written by hand because it *is* the paper's model; the attention is a few matmuls
(not SDPA) because the gate needs A⁽¹⁾ and the NumPy reference mirrors it line by line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnprune.hosts import Calls, LastCall, PatchState, bracket_calls, register_host
from attnprune.methods import registry
from attnprune.selection import check_keep_ratio, gather_tokens, group_overhead_slots, row_groups

__all__ = [
    "SingleHeadAttention",
    "TinyConfig",
    "TinyEncoder",
    "TinyOutput",
    "numpy_forward",
    "numpy_params",
]

FULL = "full"  # the method name meaning "no gate"
# A fixed cost of one more group of rows in Attention-2 in token slots (see row_groups); None:
# the measured model, selection.group_overhead_slots(d, block="attention").
GROUP_OVERHEAD_TOKENS: float | None = None


# ----------------------------------------------------------------------------- blocks
class _RowGather(torch.autograd.Function):
    """``table[index]`` whose backward scatters with ``index_add_``: on CPU that is about three
    times faster than the ``index_put_(accumulate=True)`` that autograd uses for ``table[index]``
    (110 vs 384 µs for a (500, 192) table and 4,096 indices, one thread). Written by hand because
    torch has no embedding lookup with that backward; deterministic (CPU ``index_add_`` is serial).
    """

    @staticmethod
    def forward(ctx, table: Tensor, index: Tensor) -> Tensor:
        ctx.save_for_backward(index)
        ctx.rows = table.shape[0]
        return table.index_select(0, index.reshape(-1)).view(*index.shape, table.shape[1])

    @staticmethod
    def backward(ctx, grad: Tensor):
        (index,) = ctx.saved_tensors
        width = grad.shape[-1]
        g = grad.new_zeros(ctx.rows, width).index_add_(0, index.reshape(-1), grad.reshape(-1, width))
        return g, None


class SingleHeadAttention(nn.Module):
    """Q = XW_Q, K = XW_K, V = XW_V, A = softmax(QKᵀ/√d), out = AV (+ X if residual)  (eq. 1).

    1/√d is folded into W_Q (exact when d is a power of 4, as d = 64: the scale is then a power
    of two). The mask is applied only when some key is padding (top-k gates and unpadded batches
    have none).
    """

    def __init__(self, d: int, residual: bool = True) -> None:
        super().__init__()
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, d, bias=False)
        self.v = nn.Linear(d, d, bias=False)
        self.residual = residual
        self.scale = 1.0 / math.sqrt(d)

    def weights(self) -> tuple[Tensor, Tensor, Tensor]:
        """(W_Q/√d, W_K, W_V), so that x Wᵀ gives (Q/√d, K, V)."""
        return self.q.weight * self.scale, self.k.weight, self.v.weight

    def forward(self, x: Tensor, mask: Tensor,
                qkv: tuple[Tensor, Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        """x (B, L, d), mask (B, L) bool (True = real) → (out (B, L, d), A (B, L, L)).

        ``qkv`` = (Q/√d, K, V), each (B, L, d), may be given precomputed (see
        :meth:`TinyEncoder.forward`).
        """
        # Three matmuls rather than one with stacked weights: the stacked one's backward
        # concatenates the three gradients, which costs more than it saves (measured).
        q, k, v = (F.linear(x, w) for w in self.weights()) if qkv is None else qkv
        scores = q @ k.transpose(1, 2)  # (B, L, L)
        if not bool(mask.all()):
            # Padding keys get the most negative finite value (not -inf: an all-padding row
            # stays finite instead of NaN).
            scores = scores.masked_fill(~mask[:, None, :], torch.finfo(scores.dtype).min)
        # float32 softmax even under bf16 autocast (which would keep it in bf16): A⁽¹⁾ feeds the
        # attention_mass gate, and 8 mantissa bits would make its top-k mostly ties.
        attn = scores.softmax(dim=-1, dtype=torch.float32)  # (B, L, L), rows sum to 1
        out = attn @ v  # (B, L, d)
        return (x + out if self.residual else out), attn


# ----------------------------------------------------------------------------- config
@dataclass(frozen=True)
class TinyConfig:
    """The model's settings. ``method`` is a registered token method or ``"full"`` (no gate);
    ``method_options`` are its keywords (e.g. ``{"threshold": 0.9}``)."""

    vocab: int = 500  # V
    d_model: int = 64  # d
    n_classes: int = 2  # C
    method: str = FULL
    keep_ratio: float = 0.5  # ρ
    residual: bool = True
    method_options: dict = field(default_factory=dict)
    # At evaluation, run Attention-2 on groups of rows with similar kept counts instead of
    # padding every row to the batch's longest (variable-budget gates such as
    # entropy_threshold); same outputs, fewer FLOPs. See attnprune.selection.row_groups.
    bucket_rows: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab", "d_model"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        if self.n_classes < 2:
            raise ValueError(f"n_classes must be ≥ 2, got {self.n_classes}")
        check_keep_ratio(self.keep_ratio)
        if self.method != FULL:
            spec = registry.get(self.method)  # ValueError naming the method if unknown
            if spec.kind != "token":
                raise ValueError(f"method: {self.method!r} is a {spec.kind!r} method; the tiny "
                                 "model takes token methods or 'full'")


class TinyOutput(NamedTuple):
    logits: Tensor  # (B, C)
    keep: Tensor  # (B, L) bool: tokens that reached Attention-2 (hard decision)
    aux_loss: Tensor | None  # the gate's auxiliary loss (head CE, budget), training only
    scores: Tensor | None  # (B, L) the gate's importance scores, or None for full
    gate_probs: Tensor | None  # (B, L, C) the entropy head's p_i, or None
    attn1: Tensor  # (B, L, L) A⁽¹⁾


# ----------------------------------------------------------------------------- model
class TinyEncoder(nn.Module):
    """Embedding → Attention-1 → gate → gather → Attention-2 → masked mean pool → linear (§4)."""

    def __init__(self, cfg: TinyConfig, embeddings: Tensor | np.ndarray | None = None,
                 weights: Tensor | np.ndarray | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        if embeddings is None:  # E ~ N(0, 1/d) as in §3.2, from torch's global generator
            embeddings = torch.randn(cfg.vocab, d) / math.sqrt(d)
        emb = torch.as_tensor(np.asarray(embeddings), dtype=torch.float32)
        if emb.shape != (cfg.vocab, d):
            raise ValueError(f"embeddings must be (vocab, d_model) = {(cfg.vocab, d)}, "
                             f"got {tuple(emb.shape)}")
        w = torch.ones(cfg.vocab) if weights is None else torch.as_tensor(np.asarray(weights))
        w = w.to(torch.float32).reshape(cfg.vocab)
        # Fixed preprocessing (§3.2), saved with the model but not trained: the IDF-like
        # weights are folded into the table, X̃_i = w_i E[x_i] = (w ⊙ E)[x_i].
        self.register_buffer("embeddings", emb * w[:, None])  # (V, d)
        self.attn1 = SingleHeadAttention(d, cfg.residual)
        self.attn2 = SingleHeadAttention(d, cfg.residual)
        self.gate = None
        if cfg.method != FULL:
            context = {"d_model": d, "n_classes": cfg.n_classes, "n_layers": 2, "n_heads": 1}
            self.gate = registry.create(cfg.method, context=context, **dict(cfg.method_options))
        self.classifier = nn.Linear(d, cfg.n_classes)

    def forward(self, tokens: Tensor, mask: Tensor | None = None,
                labels: Tensor | None = None) -> TinyOutput:
        """tokens (B, L) int, mask (B, L) bool (None = all real), labels (B,) in training."""
        if mask is None:
            mask = torch.ones(tokens.shape, dtype=torch.bool, device=tokens.device)
        mask = mask.bool()
        x = self.embeddings[tokens]  # (B, L, d): X̃ = w_x E[x] (weights folded in at init)
        # X W = (E W)[x]: the table is fixed and the projections have no bias, so project the
        # V rows once instead of the B·L tokens (exact; ~20 % of a training step's FLOPs at
        # V = 500, B·L = 4096).
        a = self.attn1
        qkv1 = tuple(_RowGather.apply(self.embeddings @ w.T, tokens) for w in a.weights())
        x1, a1 = a(x, mask, qkv=qkv1)  # (B, L, d), (B, L, L)

        aux, scores, probs = None, None, None
        if self.gate is None:
            keep = mask
            h, h_mask, pool_w = x1, mask, mask.to(x1.dtype)  # (B, L, d), (B, L), (B, L)
        else:
            # The gate decides in float32 under bf16 autocast too: its scores rank tokens, and
            # bf16 logits and entropies would turn close scores into ties.
            with torch.autocast(x1.device.type, enabled=False):
                sel = self.gate(x1.float(), mask, attn=a1[:, None],
                                keep_ratio=self.cfg.keep_ratio,
                                labels=labels if self.training else None)
            keep, aux, scores = sel.keep, sel.aux_loss, sel.scores
            probs = None if sel.info is None else sel.info.get("probs")
            if self.training and sel.soft is not None:
                # Relaxed gate (eq. 3–5): scale tokens by m̃ at full length so gradients flow.
                h, h_mask, pool_w = x1 * sel.soft[..., None], mask, sel.soft
            else:
                g = gather_tokens(x1, keep)  # pruned tokens leave the tensor: (B, K, d)
                h, h_mask, pool_w = g.hidden, g.mask, g.mask.to(x1.dtype)

        groups = None
        if self.gate is not None and not self.training and self.cfg.bucket_rows and len(h) > 1:
            c = GROUP_OVERHEAD_TOKENS
            groups = row_groups(h_mask.sum(1), group_overhead_slots(h.shape[-1], block="attention")
                                if c is None else c)
        if groups is not None and len(groups) > 1:
            # Each group of rows, cut to its own longest row, through Attention-2 and the pool.
            pooled = x1.new_empty(len(h), x1.shape[-1])  # (B, d)
            for rows in groups:
                k = max(int(h_mask[rows].sum(1).max()), 1)
                pooled[rows] = self._attend_pool(h[rows, :k], h_mask[rows, :k],
                                                 pool_w[rows, :k])
        else:
            pooled = self._attend_pool(h, h_mask, pool_w)  # (B, d)
        logits = self.classifier(pooled)  # (B, C)
        state = getattr(self, "_attnprune", None)  # set by attnprune.patch (the contract)
        if state is not None:  # this forward's call (TinyPatchState.calls)
            call = state.calls.current()
            call.aux_losses = [] if aux is None else [aux]
            call.stats = {"kept": keep.sum(1).detach()}
        return TinyOutput(logits, keep, aux, scores, probs, a1)

    def _attend_pool(self, h: Tensor, h_mask: Tensor, pool_w: Tensor) -> Tensor:
        """Attention-2 on (b, K, d), then the masked mean pool (§4.4) → (b, d)."""
        x2, _ = self.attn2(h, h_mask)  # (b, K, d)
        pool_w = pool_w * h_mask.to(pool_w.dtype)  # padding never pools
        # The clamp is the paper's ε for rows with nothing kept.
        return (x2 * pool_w[..., None]).sum(1) / pool_w.sum(1, keepdim=True).clamp_min(1e-6)

    def loss(self, out: TinyOutput, labels: Tensor) -> tuple[Tensor, Tensor]:
        """(task loss CE(y, o), total = task + the gate's aux loss), eq. 6."""
        task = F.cross_entropy(out.logits, labels)
        total = task if out.aux_loss is None else task + out.aux_loss
        return task, total


# ----------------------------------------------------------------------------- attnprune.patch
class TinyPatchState(PatchState):
    """What :func:`patch_tiny` changed: the gate, the config and the hooks that bracket each
    forward's call (``aux_losses`` and ``stats`` are the calling thread's last forward's),
    undone by ``unpatch``."""

    aux_losses = LastCall()
    stats = LastCall()

    def __init__(self, method: str, gate: nn.Module, old_gate, old_cfg: TinyConfig) -> None:
        self.calls = Calls()  # before PatchState's __init__, which sets aux_losses and stats
        super().__init__(method, gate)
        self._old = (old_gate, old_cfg)
        self.handles: list = []

    def unpatch(self, model: nn.Module) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()
        model.gate, model.cfg = self._old


@register_host("tiny", kinds=("token",), matches=lambda m: isinstance(m, TinyEncoder))
def patch_tiny(model: TinyEncoder, spec, keep_ratio: float = 0.5, after_layer: int = 1,
               **options) -> TinyPatchState:
    """``attnprune.patch(tiny_model, method, keep_ratio=ρ, **method_options)``: put a gate
    between the two attention layers (the only place the model has, so ``after_layer`` must
    be 1). Options are validated before the model is touched."""
    check_keep_ratio(keep_ratio)
    if after_layer != 1:
        raise ValueError(f"after_layer: the tiny model gates only after layer 1, got {after_layer}")
    cfg = model.cfg
    context = {"d_model": cfg.d_model, "n_classes": cfg.n_classes, "n_layers": 2, "n_heads": 1}
    gate = registry.create(spec.name, context=context, **options)
    state = TinyPatchState(spec.name, gate, model.gate, cfg)
    state.handles = bracket_calls(model, state, state.calls)
    model.gate = gate
    model.cfg = TinyConfig(cfg.vocab, cfg.d_model, cfg.n_classes, spec.name, keep_ratio,
                           cfg.residual, dict(options), bucket_rows=cfg.bucket_rows)
    return state


# ----------------------------------------------------------------------------- NumPy reference
def numpy_params(model: TinyEncoder) -> dict[str, np.ndarray]:
    """The model's weights as float64 NumPy arrays (state-dict names)."""
    return {k: v.detach().cpu().double().numpy() for k, v in model.state_dict().items()}


def _np_attention(x, mask, p, prefix, residual):
    d = x.shape[-1]
    q, k, v = (x @ p[f"{prefix}.{n}.weight"].T for n in ("q", "k", "v"))
    s = q @ k.transpose(0, 2, 1) / math.sqrt(d)
    s = np.where(mask[:, None, :], s, np.finfo(np.float32).min)
    s = s - s.max(-1, keepdims=True)  # stable softmax
    a = np.exp(s)
    a = a / a.sum(-1, keepdims=True)
    out = a @ v
    return (x + out if residual else out), a


def _np_topk(scores, mask, keep_ratio):
    keep = np.zeros_like(mask)
    for b in range(len(scores)):
        n = int(mask[b].sum())
        if n == 0:
            continue
        k = min(max(math.floor(n * keep_ratio + 1e-9), 1), n)
        s = np.where(mask[b], scores[b], -np.inf)
        keep[b, np.argsort(-s, kind="stable")[:k]] = True  # ties: earlier position first
    return keep


def numpy_forward(params: dict[str, np.ndarray], cfg: TinyConfig, tokens: np.ndarray,
                  mask: np.ndarray | None = None, keep: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Evaluation forward in NumPy float64 → (logits (B, C), keep (B, L)).

    Gates computed here: ``full``, ``attention_mass`` (variant mean), ``entropy``,
    ``entropy_threshold``, ``entropy_gumbel`` (hard top-k of its standardised score). For any
    other gate (e.g. ``random``) pass ``keep``.
    """
    p = params
    tokens = np.asarray(tokens)
    mask = np.ones(tokens.shape, bool) if mask is None else np.asarray(mask, bool)
    x = p["embeddings"][tokens]  # (B, L, d); the buffer holds w ⊙ E
    x1, a1 = _np_attention(x, mask, p, "attn1", cfg.residual)
    if keep is None:
        if cfg.method == FULL:
            keep = mask.copy()
        elif cfg.method == "attention_mass":
            n = np.maximum(mask.sum(1), 1)
            received = (a1 * mask[:, :, None]).sum(1) / n[:, None]  # real queries vote
            keep = _np_topk(received, mask, cfg.keep_ratio)
        elif cfg.method.startswith("entropy"):
            z = x1 @ p["gate.head.weight"].T + p["gate.head.bias"]  # (B, L, C)
            z = z - z.max(-1, keepdims=True)
            pr = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
            H = -(pr * np.log(np.maximum(pr, 1e-12))).sum(-1)  # eq. 2
            if cfg.method == "entropy":
                keep = _np_topk(-H, mask, cfg.keep_ratio)
            elif cfg.method == "entropy_threshold":
                t = cfg.method_options.get("threshold", 0.9) * math.log(cfg.n_classes)
                keep = ((H <= t) & mask) | _np_topk(-H, mask, 1e-9)  # ≥ 1 token per row
            elif cfg.method == "entropy_gumbel":
                n = np.maximum(mask.sum(1, keepdims=True), 1)
                mu = (-H * mask).sum(1, keepdims=True) / n
                sd = np.sqrt((((-H - mu) ** 2) * mask).sum(1, keepdims=True) / n)
                s = p["gate.alpha"] * (-H - mu) / np.maximum(sd, 1e-6) + p["gate.beta"]
                keep = _np_topk(s, mask, cfg.keep_ratio)
            else:
                raise ValueError(f"numpy_forward: no reference for gate {cfg.method!r}; pass keep")
        else:
            raise ValueError(f"numpy_forward: no reference for gate {cfg.method!r}; pass keep")
    keep = np.asarray(keep, bool) & mask
    # Gather kept tokens in their original order, padded to the batch maximum K.
    K = max(int(keep.sum(1).max()), 1)
    B, _, d = x1.shape
    h = np.zeros((B, K, d))
    h_mask = np.zeros((B, K), bool)
    for b in range(B):
        idx = np.flatnonzero(keep[b])
        h[b, : len(idx)] = x1[b, idx]
        h_mask[b, : len(idx)] = True
        h[b, len(idx):] = x1[b, 0]  # padding slots hold position 0, as gather_tokens does
    x2, _ = _np_attention(h, h_mask, p, "attn2", cfg.residual)
    w = h_mask.astype(float)
    pooled = (x2 * w[..., None]).sum(1) / np.maximum(w.sum(1, keepdims=True), 1e-6)
    logits = pooled @ p["classifier.weight"].T + p["classifier.bias"]
    return logits, keep
