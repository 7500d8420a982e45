"""Attention and FFN statistics of any HF model, stock or patched, plus their figures.

Measures, per layer l and head h, over the real tokens of the batches given:

    entropy     H = −Σ_j a_ij log₂ a_ij of every attention row, mean over queries (bits;
                eq. 6 of ``compute_cost_incentive_ocr_zh.txt``)
    gini        G = Σ_j Σ_k |a_ij − a_ik| / (2 n Σ_j a_ij) of every row over its n allowed keys
                (eq. 4 of the same paper), mean over queries
    sparsity    share of allowed (query, key) pairs whose probability is exactly 0 (crisp's
                realised sparsity; 0 for a dense softmax)
    ffn_sparsity  per layer, share of FFN units with W1x + b1 ≤ 0, i.e. zero after a ReLU (for
                GELU FFNs: units GELU maps to ≤ 0, at most 0.17 in magnitude)

Collected with the hooks transformers provides: ``output_attentions=True`` returns whatever
weights the attention function returns. A stock model is switched to ``"eager"`` for the
analysis and back (SDPA returns no weights); a model patched by ``hosts.hf_attention`` is asked
for its real (modulated / sparsified) probabilities. FFN pre-activations come from forward hooks
on the FFN's first linear layer. Written by hand: no library computes these from HF outputs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import numpy as np
import torch
from torch import Tensor, nn

from attnprune.api import patch_state
from attnprune.attention import row_entropy_bits
from attnprune.compat import attn_implementation
from attnprune.hosts.hf_attention import AttentionPatchState, attention_modules, ffn_modules


def row_gini(probs: Tensor, allowed: Tensor) -> Tensor:
    """Gini coefficient of each row of ``probs`` over its allowed entries: (..., n) → (...).

    Sorted form G = Σ_i (2i − n − 1) w_(i) / (n Σ w), i = 1..n ascending, equal to the
    pairwise definition; rows with n ≤ 1 or zero mass give 0."""
    w = torch.where(allowed, probs, torch.full_like(probs, -1.0))  # disallowed sort first
    w, _ = torch.sort(w, dim=-1)
    n_bad = (~allowed).sum(-1, keepdim=True)
    n = allowed.sum(-1, keepdim=True).to(probs.dtype)
    rank = torch.arange(1, probs.shape[-1] + 1, device=probs.device) - n_bad  # rank among allowed
    w = w.clamp_min(0.0)
    num = ((2 * rank - n - 1) * w).sum(-1, keepdim=True)
    den = n * w.sum(-1, keepdim=True)
    g = torch.where(den > 0, num / den.clamp_min(1e-30), torch.zeros_like(num))
    return g.squeeze(-1)


@contextlib.contextmanager
def attention_weights_on(model: nn.Module):
    """Make ``output_attentions=True`` return real probabilities, then restore the model."""
    state = patch_state(model)
    if isinstance(state, AttentionPatchState):
        state.need_weights = True
        try:
            yield
        finally:
            state.need_weights = False
        return
    previous = attn_implementation(model.config)
    switch = state is None and previous not in (None, "eager")
    if switch:
        model.set_attn_implementation("eager")
    try:
        yield
    finally:
        if switch:
            model.set_attn_implementation(previous)


class _Acc:
    """Running sums of the statistics (per layer and head)."""

    def __init__(self) -> None:
        self.sums: dict[str, np.ndarray] = {}

    def add(self, name: str, value: np.ndarray) -> None:
        self.sums[name] = self.sums.get(name, 0) + value


@torch.no_grad()
def attention_statistics(model: nn.Module, batches: Iterable[dict],
                         max_batches: int | None = None) -> dict:
    """Entropy (bits), Gini, realised sparsity per layer × head and FFN sparsity per layer.

    ``batches`` yield model keyword dicts (``input_ids``, ``attention_mask``, …; labels are
    dropped). Returns lists (JSON-ready): ``entropy_bits``, ``gini``, ``sparsity`` as
    [layer][head], ``ffn_sparsity`` as [layer], and layer/overall means."""
    was_training = model.training
    model.eval()
    attn_mods = attention_modules(model)
    causal = bool(attn_mods and getattr(attn_mods[0], "is_causal", False))
    ffn = ffn_modules(model)
    acc = _Acc()
    current: dict = {}
    ffn_stats: list[list[float]] = [[0.0, 0.0] for _ in ffn]

    def ffn_hook(i):
        def hook(_m, _inp, out):
            tm = current.get("mask")
            zero = (out <= 0).float().mean(-1)  # (B, T) share of non-positive units
            if tm is not None and tm.shape == zero.shape:
                ffn_stats[i][0] += float((zero * tm).sum())
                ffn_stats[i][1] += float(tm.sum())
            else:
                ffn_stats[i][0] += float(zero.sum())
                ffn_stats[i][1] += zero.numel()
        return hook

    handles = [m.register_forward_hook(ffn_hook(i)) for i, m in enumerate(ffn)]
    try:
        with attention_weights_on(model):
            for b, batch in enumerate(batches):
                if max_batches is not None and b >= max_batches:
                    break
                batch = {k: v for k, v in batch.items() if k not in ("labels", "label")}
                ids = batch["input_ids"]
                m2 = batch.get("attention_mask")
                m2 = torch.ones_like(ids, dtype=torch.bool) if m2 is None else m2.bool()
                current["mask"] = m2.float()
                out = model(**batch, output_attentions=True)
                if not out.attentions or any(a is None for a in out.attentions):
                    raise RuntimeError("model: the attention function returned no weights")
                _accumulate(acc, out.attentions, m2, causal)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    s = acc.sums
    q = np.maximum(s["queries"], 1)
    ent, gini = s["entropy"] / q, s["gini"] / q
    sparsity = s["zeros"] / np.maximum(s["pairs"], 1)
    ffn_sp = [a / max(n, 1) for a, n in ffn_stats]
    return {
        "entropy_bits": ent.tolist(), "gini": gini.tolist(), "sparsity": sparsity.tolist(),
        "ffn_sparsity": ffn_sp,
        "entropy_bits_mean": float(ent.mean()), "gini_mean": float(gini.mean()),
        "sparsity_mean": float(sparsity.mean()),
        "ffn_sparsity_mean": float(np.mean(ffn_sp)) if ffn_sp else None,
        "entropy_bits_by_layer": ent.mean(1).tolist(), "sparsity_by_layer": sparsity.mean(1).tolist(),
    }


def _accumulate(acc: _Acc, attentions, m2: Tensor, causal: bool) -> None:
    """Add one batch's per-layer, per-head sums (real query rows, allowed key pairs only)."""
    t = m2.shape[1]
    allowed = m2[:, None, None, :]  # (B, 1, 1, Tk): real keys
    if causal:
        allowed = allowed & torch.ones(t, t, dtype=torch.bool, device=m2.device).tril()[None, None]
    qmask = m2[:, None, :].float()  # (B, 1, Tq)
    ent, gin, zer, pairs, queries = [], [], [], [], []
    for p in attentions:  # (B, H, T, T)
        p = p.float()
        al = allowed.expand_as(p)
        ent.append(((row_entropy_bits(p) * qmask).sum((0, 2))).numpy())
        gin.append(((row_gini(p, al) * qmask).sum((0, 2))).numpy())
        zero = ((p == 0) & al).float().sum(-1)  # (B, H, Tq)
        zer.append((zero * qmask).sum((0, 2)).numpy())
        pairs.append((al.float().sum(-1) * qmask).sum((0, 2)).numpy())
        queries.append(np.full(p.shape[1], float(qmask.sum())))
    for name, v in {"entropy": ent, "gini": gin, "zeros": zer, "pairs": pairs, "queries": queries}.items():
        acc.add(name, np.stack(v))


# -- figures ---------------------------------------------------------------------------------

def plot_entropy_heatmap(entropy_bits, title: str = "attention entropy (bits)"):
    """Heat map of entropy by layer (rows) and head (columns); returns the figure."""
    import matplotlib.pyplot as plt

    e = np.asarray(entropy_bits)
    fig, ax = plt.subplots(figsize=(1 + 0.5 * e.shape[1], 1 + 0.45 * e.shape[0]))
    im = ax.imshow(e, cmap="viridis", aspect="auto")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(e.shape[1]))
    ax.set_yticks(range(e.shape[0]))
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label="bits")
    fig.tight_layout()
    return fig


def plot_accuracy_vs(x, accuracy, ci95=None, *, xlabel: str, groups=None, dense=None,
                     log_x: bool = False, title: str = ""):
    """Accuracy (with 95 % CI bars) against a setting (sparsity, λ); one line per group.

    ``dense`` (mean, (lo, hi)) draws the dense model's accuracy and CI as a band. With
    ``log_x`` a symmetric-log axis keeps λ = 0 visible."""
    import matplotlib.pyplot as plt

    x, acc = np.asarray(x, dtype=float), np.asarray(accuracy, dtype=float)
    groups = np.asarray(groups if groups is not None else [""] * len(x))
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for g in dict.fromkeys(groups.tolist()):
        sel = groups == g
        order = np.argsort(x[sel])
        xs, ys = x[sel][order], acc[sel][order]
        if ci95 is not None:
            c = np.asarray(ci95, dtype=float)[sel][order]
            err = np.abs(np.stack([ys - c[:, 0], c[:, 1] - ys]))
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=g or None)
        else:
            ax.plot(xs, ys, marker="o", label=g or None)
    if dense is not None:
        mean, (lo, hi) = dense
        ax.axhline(mean, color="k", lw=1, ls="--", label="dense")
        ax.axhspan(lo, hi, color="k", alpha=0.08)
    if log_x:
        positive = x[x > 0]
        ax.set_xscale("symlog", linthresh=float(positive.min()) if positive.size else 1e-6)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("accuracy")
    if title:
        ax.set_title(title)
    if len(set(groups.tolist())) > 1 or dense is not None:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
