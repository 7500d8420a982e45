"""Retrieval metrics from embeddings: exact cosine search, per-query nDCG@10, recall@1 and
recall@10 (arrays, so two models compare query by query), their bootstrap CIs and paired tests
(:mod:`attnprune.runs.stats`).

Each query has one relevant passage (``positives[i]``, an index into the passages), so with
its rank ``r`` (1 = first): nDCG@k = 1 / log2(r + 1) if r ≤ k else 0 (the ideal DCG is 1),
recall@k = [r ≤ k]. Ties in score rank the lower passage index first (a stable sort's order).

Query and passage embeddings are separate arguments: "patched queries against a stock-built
index" is ``evaluate(patched_query_emb, stock_passage_emb, positives)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from attnprune.runs import stats

__all__ = ["METRICS", "compare", "evaluate", "metrics_from_ranks", "positive_ranks", "summarize"]

METRICS = ("ndcg@10", "recall@1", "recall@10")


def _as_2d(name: str, x: Any) -> torch.Tensor:
    t = torch.as_tensor(np.asarray(x), dtype=torch.float32)
    if t.ndim != 2 or t.shape[0] == 0:
        raise ValueError(f"{name} must be a non-empty (n, dim) array, got shape "
                         f"{tuple(t.shape)}")
    if not torch.isfinite(t).all():
        raise ValueError(f"{name} has NaN or infinite values")
    return t


def positive_ranks(query_emb: Any, passage_emb: Any, positives: Sequence[int], *,
                   chunk: int = 1024) -> np.ndarray:
    """The 1-based rank of each query's positive passage under cosine similarity, exact (all
    passages scored; queries in chunks of ``chunk`` so memory stays ``chunk × passages``)."""
    q = torch.nn.functional.normalize(_as_2d("query_emb", query_emb), dim=1)
    p = torch.nn.functional.normalize(_as_2d("passage_emb", passage_emb), dim=1)
    if q.shape[1] != p.shape[1]:
        raise ValueError(f"query_emb and passage_emb differ in dimension: {q.shape[1]} vs "
                         f"{p.shape[1]}")
    pos = torch.as_tensor(np.asarray(positives), dtype=torch.long)
    if pos.ndim != 1 or pos.shape[0] != q.shape[0]:
        raise ValueError(f"positives must hold one passage index per query ({q.shape[0]}), "
                         f"got shape {tuple(pos.shape)}")
    if pos.numel() and (pos.min() < 0 or pos.max() >= p.shape[0]):
        raise ValueError(f"positives must be passage indices in [0, {p.shape[0]}), got "
                         f"{int(pos.min())}..{int(pos.max())}")
    if chunk < 1:
        raise ValueError(f"chunk must be ≥ 1, got {chunk}")
    cols = torch.arange(p.shape[0])
    ranks = torch.empty(q.shape[0], dtype=torch.long)
    for s in range(0, q.shape[0], chunk):
        sim = q[s : s + chunk] @ p.T  # (c, passages)
        pi = pos[s : s + chunk]
        sp = sim.gather(1, pi[:, None])
        before = (sim > sp) | ((sim == sp) & (cols[None] < pi[:, None]))
        ranks[s : s + chunk] = 1 + before.sum(1)
    return ranks.numpy()


def metrics_from_ranks(ranks: Any) -> dict[str, np.ndarray]:
    """Per-query nDCG@10, recall@1, recall@10 (float64 arrays) from 1-based positive ranks."""
    r = np.asarray(ranks)
    if r.ndim != 1 or r.size == 0 or (r < 1).any():
        raise ValueError("ranks must be a non-empty 1-D array of ranks ≥ 1")
    return {"ndcg@10": np.where(r <= 10, 1.0 / np.log2(r + 1.0), 0.0),
            "recall@1": (r <= 1).astype(np.float64),
            "recall@10": (r <= 10).astype(np.float64)}


def evaluate(query_emb: Any, passage_emb: Any, positives: Sequence[int], *,
             chunk: int = 1024) -> dict[str, np.ndarray]:
    """Per-query metrics (:data:`METRICS`) and ``"rank"`` of queries ``query_emb`` searched in
    passages ``passage_emb`` (the two may come from different models)."""
    ranks = positive_ranks(query_emb, passage_emb, positives, chunk=chunk)
    return {**metrics_from_ranks(ranks), "rank": ranks}


def _mean_rows(_y: np.ndarray, x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).mean(axis=-1)


def summarize(per_query: Mapping[str, Any], *, n_resamples: int = 10_000, alpha: float = 0.05,
              seed: int = 0) -> dict[str, dict[str, float]]:
    """Mean and percentile-bootstrap CI (queries resampled) of each metric in ``per_query``."""
    out = {}
    for m in METRICS:
        x = np.asarray(per_query[m], dtype=np.float64)
        ci = stats.bootstrap_ci(np.zeros(x.size), x, _mean_rows, n_resamples=n_resamples,
                                alpha=alpha, seed=seed, vectorized=True)
        out[m] = {"mean": ci.estimate, "low": ci.low, "high": ci.high, "se": ci.se,
                  "n": int(x.size)}
    return out


def compare(per_query_a: Mapping[str, Any], per_query_b: Mapping[str, Any], *,
            n_resamples: int = 10_000, alpha: float = 0.05, seed: int = 0
            ) -> dict[str, dict[str, float]]:
    """Paired bootstrap of Δ = A − B for each metric, on the same queries and resamples."""
    out = {}
    for m in METRICS:
        a = np.asarray(per_query_a[m], dtype=np.float64)
        b = np.asarray(per_query_b[m], dtype=np.float64)
        if a.shape != b.shape:
            raise ValueError(f"{m}: A and B must score the same queries, got {a.shape} and "
                             f"{b.shape}")
        r = stats.paired_bootstrap_ci(np.zeros(a.size), a, b, _mean_rows,
                                      n_resamples=n_resamples, alpha=alpha, seed=seed,
                                      vectorized=True)
        out[m] = {"delta": r.estimate, "low": r.low, "high": r.high, "pvalue": r.pvalue,
                  "a": r.estimate_a, "b": r.estimate_b}
    return out
