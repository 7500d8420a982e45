"""The attention leaf (:mod:`attnprune.attention`): the attention math that methods and hosts
share, in one place. Each function against a plain reference, and the leaf's imports."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
import torch

from attnprune import attention


def _probs(B=2, H=3, L=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(B, H, L, L, generator=g), -1)


def test_the_leaf_imports_only_selection_and_compat():
    tree = ast.parse(Path(attention.__file__).read_text())
    mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    mods |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    ours = {m for m in mods if m and m.startswith("attnprune")}
    assert ours <= {"attnprune.selection", "attnprune.compat"}


def test_attention_received_is_the_mean_over_heads_and_real_queries():
    A = _probs()
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    got = attention.attention_received(A, mask)
    for b in range(2):
        n = int(mask[b].sum())
        want = A[b, :, :n, :].sum((0, 1)) / (A.shape[1] * n)
        torch.testing.assert_close(got[b], want)
    torch.testing.assert_close(attention.attention_received(A, mask, "cls"), A[:, :, 0].mean(1))


@pytest.mark.parametrize("rows", ["all", "first", "received"])
@pytest.mark.parametrize("sync_free", [False, True])
def test_scorer_attention_matches_the_dense_softmax(rows, sync_free):
    g = torch.Generator().manual_seed(1)
    B, L, H, dh = 3, 9, 2, 4
    q, k = torch.randn(B, L, H * dh, generator=g), torch.randn(B, L, H * dh, generator=g)
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[1, 6:] = False
    add = torch.where(mask, 0.0, torch.finfo(torch.float32).min)
    qh = q.view(B, L, H, dh).transpose(1, 2) * dh ** -0.5
    kh = k.view(B, L, H, dh).transpose(1, 2)
    A = torch.softmax(qh @ kh.transpose(-1, -2) + add[:, None, None, :], -1)  # (B, H, L, L)
    got = attention.scorer_attention(q, k, add, mask, H, rows, sync_free=sync_free)
    if rows == "all":
        want = A
    elif rows == "first":
        want = A[:, :, :1]
    else:
        w = mask.float() / mask.sum(1, keepdim=True)
        want = torch.einsum("bhij,bi->bhj", A, w)[:, :, None]
        # the per-head rows averaged over heads are attention_received
        torch.testing.assert_close(got[:, :, 0].mean(1), attention.attention_received(A, mask))
    torch.testing.assert_close(got, want)


def test_received_blocks_equal_one_piece_at_any_block_size():
    g = torch.Generator().manual_seed(2)
    B, H, R, L = 3, 2, 5, 6
    logits = torch.randn(B * H, R, L, generator=g)
    w = torch.rand(B, R, generator=g)

    def scores(lo, hi, r0=0, r1=None):
        x = logits.view(B, H, R, L)[lo:hi, :, r0:r1]
        return x.reshape(-1, x.shape[2], L)

    want = torch.einsum("bhij,bi->bhj", torch.softmax(logits.view(B, H, R, L), -1), w)[:, :, None]
    for budget, row_budget in [(1 << 22, 1 << 19), (H * R * L, H * R * L), (7, 13), (1, 1)]:
        got = attention.received_blocks(scores, w, B, H, R, L, budget, row_budget)
        torch.testing.assert_close(got, want)


def test_row_entropy_and_the_normalised_mean():
    p = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]])
    torch.testing.assert_close(attention.row_entropy_bits(p), torch.tensor([1.0, 2.0]))
    scores = torch.tensor([[0.0, 0.0, float("-inf"), float("-inf")], [1.0, 1.0, 1.0, 1.0]])
    # each row uniform over its finite entries: H / log n = 1
    torch.testing.assert_close(attention.mean_normalised_entropy(scores), torch.tensor(1.0))


def test_topk_row_mask_keeps_the_k_largest_finite_scores_and_ties():
    s = torch.tensor([[[[3.0, 1.0, 2.0, float("-inf")], [1.0, 1.0, 0.0, 5.0]]]])
    keep = attention.topk_row_mask(s, 0.5)  # k = ceil(0.5 · n): 2 of 3, 2 of 4
    assert keep.tolist() == [[[[True, False, True, False], [True, True, False, True]]]]
    # the tie at the threshold (1.0, 1.0) keeps both: 3 entries where k = 2
    assert attention.topk_row_mask(s, 0.0).sum().item() == 3 + 4


def test_masked_scores_and_fused_attention_agree_with_the_dense_path():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, 5, 4, generator=g) for _ in range(3))
    allowed = attention.allowed_keys(None, True, 5, 5, q.device)
    s = attention.masked_scores(q, k, 0.5, allowed)
    dense = attention.softmax_rows(s) @ v
    fused = attention.fused_attention(q, k, v, None, is_causal=True, scaling=0.5, dropout=0.0,
                                      training=False)
    torch.testing.assert_close(fused, dense.transpose(1, 2))
    assert math.isinf(s[0, 0, 0, 1].item())  # the causal triangle is −∞


def test_methods_and_hosts_read_the_leaf():
    """The names moved from the methods are the leaf's own objects there (one place)."""
    from attnprune.methods import attention_mass, cost, crisp

    assert attention_mass.attention_received is attention.attention_received
    assert cost.row_entropy_bits is attention.row_entropy_bits
    assert crisp.topk_row_mask is attention.topk_row_mask
