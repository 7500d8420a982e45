"""The attention math, in one place: what the methods score and the hosts compute.

A leaf (it imports torch, :mod:`attnprune.selection` and :mod:`attnprune.compat` only):
methods and hosts both import it, and it knows neither.

Notation: B batch, H heads, Tq / Tk (or L) query and key lengths, A_h[i, j] the attention
probabilities of head h, m_i the real-query mask, n = Σ_i m_i.

* **Attention received** (token methods, the token host's scorer): per key, the attention it
  receives averaged over heads and real queries, a_j = (1 / (H·n)) Σ_h Σ_i m_i A_h[i, j]
  (:func:`attention_received`), or per head, R_h[j] = (1/n) Σ_i m_i A_h[i, j], computed from
  the queries and keys without holding A at once (:func:`scorer_attention`: in blocks,
  :func:`received_blocks`, or by two fused passes, :func:`received_fused`).
* **Attention entropy** (the cost incentive, crisp's adaptive schedule): the Shannon entropy
  of each attention row, in bits (:func:`row_entropy_bits`), and the mean normalised entropy
  H / log n of a layer's rows (:func:`mean_normalised_entropy`).
* **Scores and rows** (attention methods and the attention host): the pre-softmax scores
  with a family's own terms and the mask (:func:`masked_scores`, :func:`score_terms`,
  :func:`score_bias`, :func:`allowed_keys`), the softmax of rows that may be empty
  (:func:`softmax_rows`), attention through SDPA where it can express the scores
  (:func:`fused_attention`), and crisp's per-row top-k of the scores (:func:`topk_row_mask`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attnprune.compat import sdpa_logsumexp

__all__ = [
    "SCORER_BLOCK",
    "SCORER_KERNELS",
    "allowed_keys",
    "attention_received",
    "fused_attention",
    "masked_scores",
    "mean_normalised_entropy",
    "received_blocks",
    "received_fused",
    "row_entropy_bits",
    "score_bias",
    "score_terms",
    "scorer_attention",
    "softmax_rows",
    "topk_row_mask",
]

SCORER_KERNELS = ("matmul", "sdpa")  # how the exact "received" scorer runs (patch_hf_encoder)
# The most attention probabilities the scorer holds at once on the sync-free path (and in a
# compiled graph of concrete shapes): 2^24, 64 MB in float32, so its logits and probabilities
# stay within 256 MB of the full forward's peak at any length (issue 46: at B 8 × T 2,048 ×
# 12 heads the one-piece scorer held 1.5 GB); 24 blocks there, each large enough for a GPU.
SCORER_BLOCK = 1 << 24


# ----------------------------------------------------------------------------- attention received
def attention_received(attn: Tensor, mask: Tensor, variant: str = "mean") -> Tensor:
    """(B, H, L, L) attention probabilities → (B, L) importance per key token."""
    if variant == "cls":
        return attn[:, :, 0, :].mean(dim=1)
    # Only real queries vote; einsum sums without materialising attn·mask (B, H, L, L).
    received = torch.einsum("bhij,bi->bj", attn, mask.to(attn.dtype))
    n = mask.sum(dim=1).clamp_min(1).to(attn.dtype)
    return received / (attn.shape[1] * n[:, None])


def scorer_attention(q: Tensor, k: Tensor, keymask_add: Tensor, mask: Tensor, n_heads: int,
                     rows: str = "all", *, extra: Tensor | None = None, queries: int = 0,
                     kernel: str = "matmul", training: bool = False, static: bool = False,
                     sync_free: bool = False) -> Tensor:
    """Attention probabilities of one layer from its q, k projections (B, L, H·dh), in the
    form a token method declares (``attention_rows``):

    * "first": the CLS row, (B, H, 1, L);
    * "received": per head, the attention each key receives averaged over the real
      queries, R_h[j] = (1/n) Σ_i m_i A_h[i, j], as (B, H, 1, L) — computed in batch
      chunks, so the (B, H, L, L) matrix never exists at once (at B = 32, L = 512 it is
      400 MB, and writing it cost 15–27 % of the pruned forward, measured);
    * "all": every row, (B, H, L, L).

    ``keymask_add`` (B, L) is the additive key bias (padding, soft masks), ``mask`` (B, L) the
    real tokens, ``extra`` the family's own score terms (B|1, 1|H, L, L): relative bias,
    window, …. ``queries`` S > 0 estimates "received" from S evenly spaced real query rows;
    ``kernel`` "sdpa" computes the exact "received" by :func:`received_fused` at inference.
    ``static`` (traced) and ``sync_free`` (never read the device) choose the blocking."""
    B, L, _ = k.shape
    H = n_heads
    dh = k.shape[-1] // H
    w = None
    if rows == "first":
        q = q[:, :1]
        extra = None if extra is None else extra[:, :, :1]
    elif rows == "received" and 0 < queries < L:
        # Estimate the mean over queries from S evenly spaced real query rows per example
        # (CLS and the last real token included): S·L scores instead of L·L.
        S = queries
        n = mask.sum(1, keepdim=True).clamp_min(1)  # (B, 1)
        pos = torch.linspace(0, 1, S, device=q.device)[None, :] * (n - 1).to(q.dtype)
        idx = pos.round().long()  # (B, S), duplicates when n < S keep the weights exact-ish
        q = torch.gather(q, 1, idx[..., None].expand(B, S, q.shape[-1]))
        if extra is not None:
            extra = torch.gather(extra.expand(B, -1, L, L), 2,
                                 idx[:, None, :, None].expand(B, extra.shape[1], S, L))
        w = torch.full((B, S), 1.0 / S, dtype=q.dtype, device=q.device)
    R = q.shape[1]
    # One batched matmul with the key bias as its input term (baddbmm), scaling the smaller
    # q: about half the time of (q·kᵀ)·scale + bias as separate passes (measured, L=128).
    qq = (q * dh ** -0.5).view(B, R, H, dh).transpose(1, 2)  # (B, H, R, dh)
    kk = k.view(B, L, H, dh).permute(0, 2, 3, 1)  # (B, H, dh, L)
    bias = keymask_add.to(q.dtype)[:, None, None, :]  # (B, 1, 1, L)
    if extra is not None:  # (B, 1|H, R, L); clamped: −∞ + −∞ rows would give NaN
        bias = (bias + extra).clamp_min(torch.finfo(q.dtype).min)

    def scores(lo: int, hi: int, r0: int = 0, r1: int | None = None) -> Tensor:
        b = hi - lo  # rows lo:hi of the batch, query rows r0:r1 → (b·H, r, L) logits
        qs = qq[lo:hi] if r1 is None else qq[lo:hi, :, r0:r1]
        bs = bias[lo:hi] if r1 is None or bias.shape[2] == 1 else bias[lo:hi, :, r0:r1]
        return torch.baddbmm(bs.expand(b, H, -1, L).reshape(b * H, -1, L),
                             qs.reshape(b * H, qs.shape[2], dh),
                             kk[lo:hi].reshape(b * H, dh, L))

    if rows != "received":
        return torch.softmax(scores(0, B), -1).view(B, H, R, L)
    if w is None:  # exact: every real query, weight m_i / n
        w = mask.to(q.dtype) / mask.sum(1, keepdim=True).clamp_min(1).to(q.dtype)
    if kernel == "sdpa" and extra is None and not training:
        return received_fused(qq, k.view(B, L, H, dh).transpose(1, 2), bias, w)
    if static and not (B * H * R * L > SCORER_BLOCK
                       and all(isinstance(v, int) for v in (B, R, L))):
        # one piece: range() over a symbolic size would fix it; concrete shapes (a
        # bucketed compile) above the block go in blocks below, like the eager path
        return torch.einsum("bhij,bi->bhj", torch.softmax(scores(0, B), -1).view(
            B, H, R, L), w)[:, :, None, :]
    if sync_free or static:  # few large launches (a GPU), each ≤ the block
        return received_blocks(scores, w, B, H, R, L, budget=SCORER_BLOCK,
                               row_budget=SCORER_BLOCK)
    return received_blocks(scores, w, B, H, R, L)


def received_blocks(scores, w: Tensor, B: int, H: int, R: int, L: int,
                    budget: int = 1 << 22, row_budget: int = 1 << 19) -> Tensor:
    """Σ_i w_i softmax(scores)_ij per head, (B, H, 1, L), in pieces: ≤ ``budget``
    probabilities over batch rows; a row above ``row_budget`` goes one row at a time in
    blocks of query rows of at most ``row_budget``. ``scores(lo, hi, r0, r1)`` gives the
    (b·H, r, L) logits of batch rows lo:hi, query rows r0:r1. The CPU defaults (4 M, 0.5 M:
    L ≳ 200 goes row by row) keep the blocks in cache from the matmul through the softmax to
    the weighted sum (B = 1, L = 512, 1 thread: 11.3 → 7.3 ms CPU, measured); a GPU wants
    the opposite, few large launches (each launch costs microseconds, as much as the work)."""
    per_row = H * R * L
    step = 1 if per_row > row_budget else max(1, budget // max(per_row, 1))
    block = R if per_row <= row_budget else max(1, row_budget // (H * L))
    parts = []
    for lo in range(0, B, step):
        hi = min(lo + step, B)
        b = hi - lo
        acc = w.new_zeros(b * H, 1, L, dtype=torch.float32)  # bf16 sums of blocks drift
        for r0 in range(0, R, block):
            p = torch.softmax(scores(lo, hi, r0, r0 + block), -1)  # (b·H, r, L)
            wr = w[lo:hi, None, r0:r0 + block].expand(b, H, -1).reshape(b * H, 1, -1)
            # Out of place, in one dtype: CUDA autocast runs softmax in fp32 and bmm in
            # bf16, and an in-place baddbmm_ into the accumulator then raised "Bad
            # in-place call: input tensor dtype BFloat16 and output tensor dtype float".
            acc = acc + torch.bmm(wr.to(p.dtype), p).to(acc.dtype)
        parts.append(acc.view(b, H, 1, L).to(w.dtype))
    return torch.cat(parts)


def received_fused(q: Tensor, k: Tensor, bias: Tensor, w: Tensor) -> Tensor:
    """R_h[j] = Σ_i w_i softmax_j(q_i·k_j + b_j) in two fused attention passes, without the
    (L × L) probabilities (``scorer_kernel="sdpa"``): the first gives each query's log-sum-exp
    ℓ_i; then R_h[j] = Σ_i exp(k_j·q_i + log w_i − ℓ_i) is the normaliser of attention with the
    roles swapped (keys ask, queries answer, bias log w_i − ℓ_i), whose log the second pass
    returns. ``q`` (B, H, L, dh) scaled, ``k`` (B, H, L, dh), ``bias`` (B, 1, 1, L) additive,
    ``w`` (B, L) query weights; returns (B, H, 1, L) in float32."""
    lse = sdpa_logsumexp(q, k, bias)  # (B, H, L) float32
    floor = torch.finfo(q.dtype).min  # w_i = 0 (padding): weight ≈ e^−∞, never a NaN row
    wf = w.float()[:, None, :]
    # contiguous: the broadcast leaves its last stride at H, and the CPU kernel then copies the
    # bias out to (B, H, L, L) (1.5 GB at B 8 × T 2,048 × 12 heads, measured)
    swapped = torch.where(wf > 0, wf.clamp_min(1e-38).log() - lse, floor).contiguous()[:, :, None, :]
    # the second pass in float32: its bias (log w_i − ℓ_i ≈ −log L − ℓ_i) rounded to bf16
    # moved weights by ~4 % and changed 1–2 % of the kept tokens (measured, MiniLM shape)
    return sdpa_logsumexp(k.float(), q.float(), swapped).exp()[:, :, None, :]


# ----------------------------------------------------------------------------- attention entropy
def row_entropy_bits(probs: Tensor) -> Tensor:
    """Shannon entropy in bits of each attention row: (..., Tk) → (...). 0·log 0 = 0."""
    logp = torch.log2(probs.clamp_min(1e-30))
    return -(probs * logp).sum(-1)


def mean_normalised_entropy(scores: Tensor) -> Tensor:
    """Ĥ = mean over rows of H/log n: the entropy (nats) of each row's softmax over its
    pre-softmax ``scores`` (..., Tk), divided by the log of its n finite entries (n ≥ 2);
    a scalar. No gradient."""
    with torch.no_grad():
        p = torch.softmax(scores.float(), dim=-1)
        h = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)
        n = torch.isfinite(scores).sum(-1).clamp(min=2).float()
        return (h / torch.log(n)).mean()


# ----------------------------------------------------------------------------- scores and rows
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
