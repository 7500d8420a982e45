"""Attention / FFN statistics and figures of ``attnprune.research.analysis``."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_attention_methods import batch, sharpen, tiny  # tests/ is on sys.path

import attnprune
from attnprune.hosts.hf_attention import ffn_modules
from attnprune.research.analysis import (
    attention_statistics,
    plot_accuracy_vs,
    plot_entropy_heatmap,
    row_gini,
)


def test_row_gini_matches_pairwise_definition():
    g = torch.Generator().manual_seed(1)
    p = torch.rand(4, 9, generator=g)
    allowed = torch.rand(4, 9, generator=g) > 0.3
    allowed[:, 0] = True
    got = row_gini(p, allowed)
    for r in range(4):
        w = p[r][allowed[r]].double()
        n = w.numel()
        want = (w[:, None] - w[None, :]).abs().sum() / (2 * n * w.sum())
        assert got[r].item() == pytest.approx(want.item(), abs=1e-6)
    one_hot = torch.tensor([[0.0, 1.0, 0.0, 0.0]])
    assert row_gini(one_hot, torch.ones_like(one_hot, dtype=torch.bool)).item() == pytest.approx(0.75)


def _uniform_attention(model):
    """Zero the query projections: every score equal, attention uniform over allowed keys."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("query.weight", "query.bias")):
                p.zero_()


def test_stock_uniform_attention_statistics_bert():
    model = tiny("bert")
    _uniform_attention(model)
    ids, mask = batch()
    stats = attention_statistics(model, [{"input_ids": ids, "attention_mask": mask}])
    n = mask.sum(1).float()
    want = float((n * torch.log2(n)).sum() / n.sum())  # query-weighted mean of log2(n_real)
    ent = np.asarray(stats["entropy_bits"])
    assert ent.shape == (2, 4)
    assert np.allclose(ent, want, atol=1e-4)
    assert np.allclose(stats["gini"], 0.0, atol=1e-5)
    assert np.allclose(stats["sparsity"], 0.0)
    assert model.config._attn_implementation == "sdpa"  # switched to eager and back


def test_causal_entropy_and_ffn_sparsity_gpt2():
    model = tiny("gpt2")
    with torch.no_grad():  # zero Q (first third of c_attn): uniform causal rows
        model.transformer.h[0].attn.c_attn.weight[:, :32].zero_()
        model.transformer.h[0].attn.c_attn.bias[:32].zero_()
    ids = torch.randint(0, 100, (2, 8))
    pre = []
    hook = ffn_modules(model)[1].register_forward_hook(lambda m, i, o: pre.append(o))
    stats = attention_statistics(model, [{"input_ids": ids}])
    hook.remove()
    want = np.mean([math.log2(i + 1) for i in range(8)])
    assert np.allclose(stats["entropy_bits"][0], want, atol=1e-4)
    assert stats["ffn_sparsity"][1] == pytest.approx(float((pre[0] <= 0).float().mean()), abs=1e-6)


def test_crisp_realised_sparsity_and_lower_entropy():
    model = tiny("bert")
    sharpen(model)
    ids, mask = batch()
    data = [{"input_ids": ids, "attention_mask": mask, "labels": torch.zeros(3)}]
    dense = attention_statistics(model, data)
    attnprune.patch(model, "crisp", sparsity=0.8)
    sparse = attention_statistics(model, data)
    n = mask.sum(1)
    kept = sum(int(k) * max(1, math.ceil(0.2 * int(k))) for k in n)
    want = 1 - kept / sum(int(k) ** 2 for k in n)
    assert sparse["sparsity_mean"] == pytest.approx(want, abs=1e-6)
    assert sparse["entropy_bits_mean"] < dense["entropy_bits_mean"]
    assert sparse["gini_mean"] > dense["gini_mean"]
    assert not attnprune.patch_state(model).need_weights  # restored after the analysis


def test_figures_render():
    fig = plot_entropy_heatmap(np.random.rand(6, 12))
    assert fig.axes
    fig2 = plot_accuracy_vs([0, 1e-5, 1e-3, 0, 1e-5, 1e-3], [0.8, 0.81, 0.7, 0.79, 0.8, 0.75],
                            [[0.78, 0.82]] * 6, xlabel="λ", log_x=True,
                            groups=["both"] * 3 + ["ffn"] * 3, dense=(0.8, (0.78, 0.82)))
    assert fig2.axes[0].get_xscale() == "symlog"
