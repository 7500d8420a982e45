"""The paired percentile bootstrap (§9.9): one shared index matrix per chunk for every model
compared, accuracy as one gather, AUC by resample weights, MCC and correlations by rows."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy import stats as sps

from attnprune.runs.stats.base import (
    BootstrapCI,
    Metric,
    PairedBootstrapCI,
    SeedLike,
    as_1d,
    binary_labels,
    check_finite,
    check_same_length,
    z_critical,
)

# --------------------------------------------------------------------------- bootstrap (§9.9)
_CHUNK_ELEMENTS = 2_000_000  # index-matrix elements per chunk: ~8 MB of int32, bounded memory


def _resample_chunks(rng: np.random.Generator, n: int, n_resamples: int):
    """Yield (k, n) int32 index matrices, B rows in total (int32 draws twice as fast)."""
    rows = max(1, _CHUNK_ELEMENTS // n)
    done = 0
    while done < n_resamples:
        k = min(rows, n_resamples - done)
        yield rng.integers(0, n, size=(k, n), dtype=np.int32 if n < 2**31 else np.int64)
        done += k


def _auc_by_weights(y: np.ndarray, s: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """Return f(idx) -> AUC of each resample row, ties counted ½, NaN for a one-class row.

    A resample is a weight (multiplicity) per original example, so sorting the scores once
    suffices: with G distinct scores, W⁺ and W⁻ (k, G) are the resampled positive / negative
    counts per score, and AUC = Σ_g W⁺_g (W⁻ below g + ½ W⁻_g) / (m n₀) — no per-row sort.
    """
    _, g = np.unique(s, return_inverse=True)  # g: rank group of each example, (n,)
    n_groups = int(g.max()) + 1

    def rows(idx: np.ndarray) -> np.ndarray:
        k = idx.shape[0]
        flat = (np.arange(k)[:, None] * n_groups + g[idx]).ravel()  # (k·n,)
        pos = y[idx].ravel()
        w_pos = np.bincount(flat[pos], minlength=k * n_groups).reshape(k, n_groups)
        w_neg = np.bincount(flat[~pos], minlength=k * n_groups).reshape(k, n_groups)
        below = np.cumsum(w_neg, axis=1) - w_neg
        num = (w_pos * (below + 0.5 * w_neg)).sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            return num / (w_pos.sum(axis=1) * w_neg.sum(axis=1))

    return rows


def _row_metric(metric: Metric, y: np.ndarray, x: np.ndarray, vectorized: bool
                ) -> tuple[float, Callable[[np.ndarray], np.ndarray]]:
    """Point estimate and f(idx (k, n)) -> (k,) metric values on the resampled rows."""
    n = y.shape[0]
    if callable(metric):
        if vectorized:
            est = float(np.asarray(metric(y[None], x[None])).reshape(-1)[0])
            return est, lambda idx: metric(y[idx], x[idx])
        return float(metric(y, x)), lambda idx: np.array([metric(y[r], x[r]) for r in idx])
    if metric == "accuracy":
        correct = np.asarray(y == x, dtype=np.int8)  # gather 1 byte per element: fastest
        return float(correct.mean()), lambda idx: correct[idx].sum(axis=1, dtype=np.int64) / n
    if metric == "auc":
        yb = binary_labels(y)
        s = np.asarray(x, dtype=float)
        if s.ndim != 1:
            raise ValueError(f"AUC needs a 1-D score vector, got shape {s.shape}")
        check_finite("scores", s)
        f = _auc_by_weights(yb, s)
        return float(f(np.arange(n)[None])[0]), f
    if metric == "mcc":
        return _mcc_rows(y, x)
    if metric in ("pearson", "spearman"):
        return _correlation_rows(metric, y, x)
    raise ValueError(f"unknown metric {metric!r}: use 'accuracy', 'auc', 'mcc', 'pearson', "
                     "'spearman' or a callable")


def _mcc_rows(y: np.ndarray, x: np.ndarray) -> tuple[float, Callable[[np.ndarray], np.ndarray]]:
    """Matthews correlation (multiclass: Gorodkin's R_K, as sklearn) of each resample row.

    Point estimate from ``sklearn.metrics.matthews_corrcoef``; the rows use the same formula on
    one confusion matrix per row (one bincount over the chunk, no per-row Python loop):
    MCC = (c·s − Σ_k p_k t_k) / √((s² − Σ p_k²)(s² − Σ t_k²)), c correct, s total, p_k / t_k
    predicted / true counts of class k; 0 where the denominator is 0 (sklearn's convention).
    Tests cross-check the rows against sklearn.
    """
    from sklearn.metrics import matthews_corrcoef

    classes, codes = np.unique(np.concatenate([y, x]), return_inverse=True)
    C = len(classes)
    yc, xc = codes[: y.size], codes[y.size :]
    cell = (yc * C + xc).astype(np.int64)  # (n,) confusion-matrix cell of each example

    def rows(idx: np.ndarray) -> np.ndarray:
        k = idx.shape[0]
        flat = (np.arange(k)[:, None] * (C * C) + cell[idx]).ravel()
        cm = np.bincount(flat, minlength=k * C * C).reshape(k, C, C).astype(float)
        t, p = cm.sum(2), cm.sum(1)  # (k, C) true / predicted counts
        c = np.trace(cm, axis1=1, axis2=2)
        total = t.sum(1)
        num = c * total - (p * t).sum(1)
        den = np.sqrt((total**2 - (p**2).sum(1)) * (total**2 - (t**2).sum(1)))
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)

    return float(matthews_corrcoef(y, x)), rows


def _correlation_rows(metric: str, y: np.ndarray, x: np.ndarray
                      ) -> tuple[float, Callable[[np.ndarray], np.ndarray]]:
    """Pearson r, or Spearman ρ (Pearson of mid-ranks, as scipy), of each resample row.

    Point estimate from ``scipy.stats.pearsonr`` / ``spearmanr``; the rows from
    ``pearsonr(..., axis=1)`` on the (k, n) resampled pairs (ranked first with
    ``rankdata(axis=1)`` for Spearman: ties of repeated examples get mid-ranks, like
    ``spearmanr``). A resample whose predictions (or labels) are all equal has no correlation:
    NaN, dropped by :func:`valid_columns`. A constant input overall raises ValueError.
    """
    yf, xf = np.asarray(y, dtype=float), np.asarray(x, dtype=float)
    if yf.ndim != 1 or xf.ndim != 1:
        raise ValueError(f"{metric} needs 1-D labels and predictions, got shapes {yf.shape} "
                         f"and {xf.shape}")
    check_finite("y_true", yf)
    check_finite("predictions", xf)
    for name, a in (("y_true", yf), ("predictions", xf)):
        if np.ptp(a) == 0:
            raise ValueError(f"{metric} correlation is undefined: {name} is constant "
                             f"(all {a[0]:g})")
    if yf.size < 3:
        raise ValueError(f"{metric} correlation needs at least 3 examples, got {yf.size}")
    est = sps.pearsonr(yf, xf) if metric == "pearson" else sps.spearmanr(yf, xf)
    spearman = metric == "spearman"

    def rows(idx: np.ndarray) -> np.ndarray:
        a, b = yf[idx], xf[idx]  # (k, n)
        if spearman:
            a, b = sps.rankdata(a, axis=1), sps.rankdata(b, axis=1)
        const = (np.ptp(a, axis=1) == 0) | (np.ptp(b, axis=1) == 0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # constant rows: NaN, counted by valid_columns
            r = np.asarray(sps.pearsonr(a, b, axis=1).statistic, dtype=float)
        return np.where(const, np.nan, r)

    return float(est.statistic), rows


def bootstrap_distributions(
    y_true: np.ndarray,
    xs: list[np.ndarray],
    metric: Metric,
    n_resamples: int,
    seed: SeedLike,
    vectorized: bool,
) -> tuple[list[float], np.ndarray]:
    """Point estimates and a (len(xs), B) matrix of resampled metric values.

    One (k, n) index matrix per chunk is shared by every array in ``xs`` (paired resampling)
    and the metric is applied to whole chunks at once for "accuracy" and "auc".
    """
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be ≥ 1, got {n_resamples}")
    n = check_same_length(y_true=y_true, **{f"y_{i}": x for i, x in enumerate(xs)})
    rng = np.random.default_rng(seed)
    fs = [_row_metric(metric, y_true, x, vectorized) for x in xs]
    out = np.empty((len(xs), n_resamples))
    done = 0
    for idx in _resample_chunks(rng, n, n_resamples):
        k = idx.shape[0]
        for j, (_, f) in enumerate(fs):
            out[j, done : done + k] = f(idx)
        done += k
    return [e for e, _ in fs], out


def valid_columns(dist: np.ndarray, metric: Metric) -> np.ndarray:
    """Drop resamples where the metric is undefined (AUC on a one-class resample)."""
    ok = np.isfinite(dist).all(axis=0)
    if ok.mean() < 0.5:
        raise ValueError(
            f"metric {metric!r} was undefined on {int((~ok).sum())} of {dist.shape[1]} "
            "bootstrap resamples (e.g. AUC with one class in the resample); too few examples"
        )
    return dist[:, ok]


def _resampled(y_true: Any, xs: list[Any], metric: Metric, n_resamples: int, alpha: float,
               seed: SeedLike, vectorized: bool) -> tuple[list[float], np.ndarray]:
    """Point estimates and the resampled values where ``metric`` is defined, for the models'
    predictions ``xs`` on the same resamples (both bootstrap CIs start here)."""
    z_critical(alpha)
    y = as_1d("y_true", y_true)
    ests, dist = bootstrap_distributions(y, [np.asarray(x) for x in xs], metric, n_resamples,
                                         seed, vectorized)
    return ests, valid_columns(dist, metric)


def bootstrap_ci(y_true: Any, y_x: Any, metric: Metric = "accuracy", *, n_resamples: int = 10_000,
                 alpha: float = 0.05, seed: SeedLike = 0, vectorized: bool = False) -> BootstrapCI:
    """Percentile bootstrap CI of ``metric(y_true, y_x)`` for one model (§9.9).

    ``metric`` is ``"accuracy"`` (``y_x`` = predicted labels), ``"auc"`` (``y_x`` = scores) or
    a callable ``f(y_true, y_x) -> float``; with ``vectorized=True`` the callable takes (k, n)
    row-stacked resamples and returns (k,).  Resamples on which the metric is undefined (AUC
    with one class) are dropped; ``n_resamples`` in the result counts the ones kept.
    ``seed`` is an int or a ``np.random.Generator`` (default 0: reproducible).
    """
    (est,), dist = _resampled(y_true, [y_x], metric, n_resamples, alpha, seed, vectorized)
    dist = dist[0]
    lo, hi = np.quantile(dist, [alpha / 2, 1 - alpha / 2])
    return BootstrapCI(est, float(lo), float(hi), float(dist.std(ddof=1)) if dist.size > 1
                       else 0.0, int(dist.size))


def paired_from_dist(est_a: float, est_b: float, dist: np.ndarray, alpha: float,
                      ) -> PairedBootstrapCI:
    d = dist[0] - dist[1]
    delta = est_a - est_b
    lo, hi = np.quantile(d, [alpha / 2, 1 - alpha / 2])
    # §9.4: two-sided p from the bootstrap null (the resampled Δ⁽ᵇ⁾ centred on Δ).
    extreme = np.count_nonzero(np.abs(d - delta) >= abs(delta) - 1e-12)
    p = (1 + extreme) / (1 + d.size)
    return PairedBootstrapCI(delta, float(lo), float(hi),
                             float(d.std(ddof=1)) if d.size > 1 else 0.0,
                             float(min(p, 1.0)), est_a, est_b, int(d.size))


def paired_bootstrap_ci(y_true: Any, y_a: Any, y_b: Any, metric: Metric = "accuracy", *,
                        n_resamples: int = 10_000, alpha: float = 0.05, seed: SeedLike = 0,
                        vectorized: bool = False) -> PairedBootstrapCI:
    """Percentile CI of Δ = metric(A) − metric(B) on the same examples, same resamples (§9.9).

    Arguments as in :func:`bootstrap_ci`; ``y_a`` / ``y_b`` are predictions or scores of the two
    models.  Swapping A and B negates ``estimate`` and the CI and leaves ``pvalue`` unchanged.
    """
    (ea, eb), dist = _resampled(y_true, [y_a, y_b], metric, n_resamples, alpha, seed,
                                vectorized)
    return paired_from_dist(ea, eb, dist, alpha)
