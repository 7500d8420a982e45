"""Statistics users can trust: confidence intervals, paired tests, effect sizes, calibration.

Implements §9 of ``papers/entropy_guided_token_pruning.txt``:

======  ==========================================  =========================================
§       what                                        here
======  ==========================================  =========================================
9.1     multi-seed aggregation (mean, 95 % CI)      :func:`aggregate_seeds`
9.2     Wilson score interval, eq. (8)              :func:`wilson_ci`
9.3     AUC CI: bootstrap or DeLong, eq. (9)        :func:`bootstrap_ci`, :func:`delong_auc`
9.4     paired tests: McNemar eq. (10), DeLong,     :func:`mcnemar`, :func:`delong_test`,
        paired bootstrap                            :func:`paired_bootstrap_ci`
9.5     Cohen's h, eq. (11)                         :func:`cohens_h`
9.6     Holm–Bonferroni                             :func:`holm`
9.7     non-inferiority and equivalence             :func:`noninferiority`, :func:`equivalence_tost`
9.8     power and sample size, eq. (12)             :func:`sample_size_two_proportions`,
                                                    :func:`sample_size_cohens_h`,
                                                    :func:`power_cohens_h`,
                                                    :func:`sample_size_ci_halfwidth`
9.9     paired percentile bootstrap (vectorised)    :func:`bootstrap_ci`, :func:`paired_bootstrap_ci`
9.10    decision rule (Holm p < α and |Δ| ≥ min)    :func:`compare_predictions`,
                                                    :func:`apply_decision_rule`
======  ==========================================  =========================================

plus the GLUE task metrics (CoLA, STS-B; ``compute_cost_incentive_ocr_zh.txt`` reports MNLI-m
accuracy, CoLA Matthews correlation and STS-B Pearson / Spearman): ``"mcc"``, ``"pearson"``,
``"spearman"`` are metric names of :func:`bootstrap_ci`, :func:`paired_bootstrap_ci` and
:func:`compare_predictions` (paired bootstrap, :data:`TASK_METRICS`).

plus calibration (Guo et al. 2017, "On Calibration of Modern Neural Networks"):
:func:`expected_calibration_error`, :func:`reliability_diagram`, :func:`fit_temperature`.

Notation
--------
``n``            number of examples; ``m`` positives and ``n₀`` negatives for AUC
``y``            true labels ``y_true``; ``ŷ`` predicted labels ``y_pred``; ``s`` scores
``p̂``            a proportion (accuracy); ``Δ = m_A − m_B`` a paired difference of a metric
``b``, ``c``     McNemar discordant counts: ``b`` = A right and B wrong, ``c`` = A wrong, B right
``B``            bootstrap resamples (``n_resamples``); ``α`` level (``alpha``); ``z = z₁₋α/₂``
``h``            Cohen's h = 2 asin √p₁ − 2 asin √p₂
``V10, V01``     DeLong placement values of positives / negatives (Sun & Xu 2014)
``δ``            non-inferiority / equivalence margin (``margin``)
``T``            softmax temperature

Written by hand: DeLong's AUC variance and paired test (:func:`delong_auc`, :func:`delong_test`;
no well-kept Python library has them); the paired bootstrap (one shared index matrix for both
models, accuracy as one int8 gather, AUC by resample weights without re-sorting — scipy's
``stats.bootstrap`` would do the pairing but not these shortcuts, and defaults to BCa); Holm
(statsmodels' ``multipletests`` calls ``gc.collect()`` on every call); the §9.10 comparison
records.  Everything else wraps scipy / statsmodels with their defaults made explicit
(statsmodels ``mcnemar`` defaults to exact, ``multipletests`` to Holm–Šidák,
``proportion_confint`` to the normal interval); tests cross-check each hand-written piece
against the library or a brute-force version.  statsmodels is imported inside the functions
that use it, so ``import attnprune.runs.stats`` stays cheap.

Degenerate inputs raise ``ValueError`` naming the problem (empty input, length mismatch, one
class only for AUC) instead of returning NaN.  Documented exceptions: empty bins in
:func:`reliability_diagram` hold NaN confidence / accuracy (with count 0).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
from scipy import optimize, special
from scipy import stats as sps

__all__ = [
    "CI",
    "DEFAULT_MIN_EFFECT",
    "TASK_METRICS",
    "AUCResult",
    "BootstrapCI",
    "DeLongTest",
    "Equivalence",
    "NonInferiority",
    "PairedBootstrapCI",
    "ReliabilityDiagram",
    "TestResult",
    "aggregate_seeds",
    "apply_decision_rule",
    "bootstrap_ci",
    "cohens_h",
    "compare_predictions",
    "delong_auc",
    "delong_test",
    "discordant_counts",
    "equivalence_tost",
    "expected_calibration_error",
    "fit_temperature",
    "holm",
    "mcnemar",
    "noninferiority",
    "paired_bootstrap_ci",
    "power_cohens_h",
    "reliability_diagram",
    "sample_size_ci_halfwidth",
    "sample_size_cohens_h",
    "sample_size_two_proportions",
    "wilson_ci",
]

# §9.10: "effect size exceeds a pre-declared minimum (e.g. |ΔAUC| ≥ 0.002 or |ΔAcc| ≥ 0.005)".
# MCC and correlations (our choice, the paper names none) live on [−1, 1], twice the range of
# accuracy: for a balanced binary task with symmetric errors MCC = 2·acc − 1, so ΔMCC = 0.01
# is the paper's ΔAcc = 0.005; Pearson / Spearman take the same 0.01 on the same scale.
DEFAULT_MIN_EFFECT: Mapping[str, float] = {"accuracy": 0.005, "auc": 0.002, "mcc": 0.01,
                                           "pearson": 0.01, "spearman": 0.01}

# The metrics :func:`compare_predictions` compares, by task. Classification: accuracy (McNemar),
# AUC (DeLong, binary only), MCC (paired bootstrap); regression: Pearson and Spearman (paired
# bootstrap). Callers choose (``metrics=``); the default stays accuracy + AUC.
TASK_METRICS: Mapping[str, tuple[str, ...]] = {"classification": ("accuracy", "auc", "mcc"),
                                               "regression": ("pearson", "spearman")}

# Wikipedia "McNemar's test": when b + c < 25 the χ² approximation is poor; use the exact test.
MCNEMAR_EXACT_BELOW = 25

SeedLike = int | np.random.Generator | None
Metric = str | Callable[..., Any]


# --------------------------------------------------------------------------- result types
class CI(NamedTuple):
    low: float
    high: float


class BootstrapCI(NamedTuple):
    """Percentile bootstrap CI of one metric: point estimate, (low, high), bootstrap SE."""

    estimate: float
    low: float
    high: float
    se: float
    n_resamples: int


class PairedBootstrapCI(NamedTuple):
    """Percentile bootstrap CI of Δ = m_A − m_B on the same examples.

    ``pvalue`` is the two-sided bootstrap p-value of §9.4: the share of centred resamples
    ``|Δ⁽ᵇ⁾ − Δ| ≥ |Δ|``, as ``(1 + count) / (1 + B)`` so it is never exactly 0.
    """

    estimate: float
    low: float
    high: float
    se: float
    pvalue: float
    estimate_a: float
    estimate_b: float
    n_resamples: int


class TestResult(NamedTuple):
    statistic: float
    pvalue: float
    method: str


class AUCResult(NamedTuple):
    """AUC with DeLong variance and the normal CI of eq. (9), clipped to [0, 1]."""

    auc: float
    variance: float
    se: float
    low: float
    high: float


class DeLongTest(NamedTuple):
    """DeLong paired test of Δ = AUC_A − AUC_B; CI is Δ ± z·SE clipped to [−1, 1]."""

    auc_a: float
    auc_b: float
    diff: float
    variance: float
    se: float
    z: float
    pvalue: float
    low: float
    high: float


class NonInferiority(NamedTuple):
    """Non-inferiority of the pruned model (§9.7): Δ = m_full − m_pruned, claim if high < δ."""

    diff: float
    low: float
    high: float
    margin: float
    noninferior: bool


class Equivalence(NamedTuple):
    """TOST: equivalent if both one-sided tests reject, i.e. ``pvalue`` < α."""

    diff: float
    pvalue: float
    low: float
    high: float
    margin: float
    equivalent: bool


class ReliabilityDiagram(NamedTuple):
    """Per-bin data of a reliability diagram; bins are (lo, hi] (bin 0 also holds 0)."""

    edges: np.ndarray  # (n_bins + 1,)
    confidence: np.ndarray  # (n_bins,) mean confidence, NaN where count == 0
    accuracy: np.ndarray  # (n_bins,) accuracy, NaN where count == 0
    count: np.ndarray  # (n_bins,) int


# --------------------------------------------------------------------------- validation
def _as_1d(name: str, x: Any, *, allow_empty: bool = False) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim == 0:
        raise ValueError(f"{name} must be a 1-D array, got a scalar")
    if a.shape[0] == 0 and not allow_empty:
        raise ValueError(f"{name} is empty (n = 0): no statistic is defined")
    return a


def _check_same_length(**arrays: np.ndarray) -> int:
    items = list(arrays.items())
    n0_name, n0 = items[0][0], len(items[0][1])
    for name, a in items[1:]:
        if len(a) != n0:
            raise ValueError(f"length mismatch: {n0_name} has {n0} elements but {name} has {len(a)}")
    if n0 == 0:
        raise ValueError(f"{n0_name} is empty (n = 0): no statistic is defined")
    return n0


def _check_finite(name: str, a: np.ndarray) -> None:
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} contains NaN or infinite values")


def _binary_labels(y_true: Any) -> np.ndarray:
    y = np.asarray(y_true)
    labels = np.unique(y)
    if not np.isin(labels, [0, 1]).all():
        raise ValueError(f"AUC needs binary labels 0/1, got labels {labels.tolist()}")
    if len(labels) < 2:
        raise ValueError(
            f"AUC is undefined: y_true has one class only (all {labels.tolist()}); "
            "it needs at least one positive and one negative example"
        )
    return y.astype(bool)


def _z(alpha: float) -> float:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    return float(sps.norm.ppf(1 - alpha / 2))


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
        yb = _binary_labels(y)
        s = np.asarray(x, dtype=float)
        if s.ndim != 1:
            raise ValueError(f"AUC needs a 1-D score vector, got shape {s.shape}")
        _check_finite("scores", s)
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
    NaN, dropped by :func:`_valid_columns`. A constant input overall raises ValueError.
    """
    yf, xf = np.asarray(y, dtype=float), np.asarray(x, dtype=float)
    if yf.ndim != 1 or xf.ndim != 1:
        raise ValueError(f"{metric} needs 1-D labels and predictions, got shapes {yf.shape} "
                         f"and {xf.shape}")
    _check_finite("y_true", yf)
    _check_finite("predictions", xf)
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
            warnings.simplefilter("ignore")  # constant rows: NaN, counted by _valid_columns
            r = np.asarray(sps.pearsonr(a, b, axis=1).statistic, dtype=float)
        return np.where(const, np.nan, r)

    return float(est.statistic), rows


def _bootstrap_distributions(
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
    n = _check_same_length(y_true=y_true, **{f"y_{i}": x for i, x in enumerate(xs)})
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


def _valid_columns(dist: np.ndarray, metric: Metric) -> np.ndarray:
    """Drop resamples where the metric is undefined (AUC on a one-class resample)."""
    ok = np.isfinite(dist).all(axis=0)
    if ok.mean() < 0.5:
        raise ValueError(
            f"metric {metric!r} was undefined on {int((~ok).sum())} of {dist.shape[1]} "
            "bootstrap resamples (e.g. AUC with one class in the resample); too few examples"
        )
    return dist[:, ok]


def bootstrap_ci(
    y_true: Any,
    y_x: Any,
    metric: Metric = "accuracy",
    *,
    n_resamples: int = 10_000,
    alpha: float = 0.05,
    seed: SeedLike = 0,
    vectorized: bool = False,
) -> BootstrapCI:
    """Percentile bootstrap CI of ``metric(y_true, y_x)`` for one model (§9.9).

    ``metric`` is ``"accuracy"`` (``y_x`` = predicted labels), ``"auc"`` (``y_x`` = scores) or
    a callable ``f(y_true, y_x) -> float``; with ``vectorized=True`` the callable takes (k, n)
    row-stacked resamples and returns (k,).  Resamples on which the metric is undefined (AUC
    with one class) are dropped; ``n_resamples`` in the result counts the ones kept.
    ``seed`` is an int or a ``np.random.Generator`` (default 0: reproducible).
    """
    _z(alpha)
    y = _as_1d("y_true", y_true)
    x = np.asarray(y_x)
    (est,), dist = _bootstrap_distributions(y, [x], metric, n_resamples, seed, vectorized)
    dist = _valid_columns(dist, metric)[0]
    lo, hi = np.quantile(dist, [alpha / 2, 1 - alpha / 2])
    return BootstrapCI(est, float(lo), float(hi), float(dist.std(ddof=1)) if dist.size > 1
                       else 0.0, int(dist.size))


def _paired_from_dist(est_a: float, est_b: float, dist: np.ndarray, alpha: float,
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


def paired_bootstrap_ci(
    y_true: Any,
    y_a: Any,
    y_b: Any,
    metric: Metric = "accuracy",
    *,
    n_resamples: int = 10_000,
    alpha: float = 0.05,
    seed: SeedLike = 0,
    vectorized: bool = False,
) -> PairedBootstrapCI:
    """Percentile CI of Δ = metric(A) − metric(B) on the same examples, same resamples (§9.9).

    Arguments as in :func:`bootstrap_ci`; ``y_a`` / ``y_b`` are predictions or scores of the two
    models.  Swapping A and B negates ``estimate`` and the CI and leaves ``pvalue`` unchanged.
    """
    _z(alpha)
    y = _as_1d("y_true", y_true)
    (ea, eb), dist = _bootstrap_distributions(
        y, [np.asarray(y_a), np.asarray(y_b)], metric, n_resamples, seed, vectorized
    )
    return _paired_from_dist(ea, eb, _valid_columns(dist, metric), alpha)


# --------------------------------------------------------------------------- proportions
def wilson_ci(successes: int, n: int, alpha: float = 0.05) -> CI:
    """Wilson score interval for a proportion, eq. (8) (statsmodels ``method='wilson'``)."""
    from statsmodels.stats.proportion import proportion_confint

    if n <= 0:
        raise ValueError(f"Wilson interval needs n ≥ 1 trials, got n = {n}")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in [0, n = {n}], got {successes}")
    _z(alpha)
    lo, hi = proportion_confint(successes, n, alpha=alpha, method="wilson")
    # at 0/n and n/n the bounds are exactly 0 and 1; the formula leaves rounding (±1e-18)
    lo = 0.0 if successes == 0 else float(np.clip(lo, 0, 1))
    hi = 1.0 if successes == n else float(np.clip(hi, 0, 1))
    return CI(lo, hi)


def cohens_h(p1: float, p2: float) -> float:
    """Cohen's h = 2 asin √p₁ − 2 asin √p₂, eq. (11); |h| 0.2/0.5/0.8 = small/medium/large."""
    for name, p in (("p1", p1), ("p2", p2)):
        if not 0 <= p <= 1:
            raise ValueError(f"{name} must be a proportion in [0, 1], got {p}")
    return float(2 * math.asin(math.sqrt(p1)) - 2 * math.asin(math.sqrt(p2)))


def discordant_counts(y_true: Any, y_pred_a: Any, y_pred_b: Any) -> tuple[int, int]:
    """McNemar's (b, c): b = #(A right, B wrong), c = #(A wrong, B right)."""
    y, a, b = np.asarray(y_true), np.asarray(y_pred_a), np.asarray(y_pred_b)
    _check_same_length(y_true=y, y_pred_a=a, y_pred_b=b)
    ra, rb = a == y, b == y
    return int(np.count_nonzero(ra & ~rb)), int(np.count_nonzero(~ra & rb))


def mcnemar(b: int, c: int, method: str = "auto") -> TestResult:
    """McNemar test of equal error rates from the discordant counts b, c (§9.4).

    ``method``:
      - ``"corrected"``: χ² = (|b − c| − 1)² / (b + c), eq. (10); the numerator is floored at 0
        (so b = c gives χ² = 0, p = 1; R and statsmodels give 1/(b+c) there).
      - ``"uncorrected"``: χ² = (b − c)² / (b + c).
      - ``"exact"``: two-sided binomial test of b ~ Bin(b + c, ½); statistic = min(b, c).
      - ``"auto"`` (default): exact when b + c < 25, else corrected.
    b + c = 0 (the models never disagree) returns statistic 0 and p = 1.0 for every method.
    """
    if method not in ("auto", "corrected", "uncorrected", "exact"):
        raise ValueError(f"unknown McNemar method {method!r}")
    if b < 0 or c < 0 or int(b) != b or int(c) != c:
        raise ValueError(f"McNemar counts must be non-negative integers, got b={b}, c={c}")
    b, c = int(b), int(c)
    if method == "auto":
        method = "exact" if b + c < MCNEMAR_EXACT_BELOW else "corrected"
    if b + c == 0:
        return TestResult(0.0, 1.0, method)
    if method == "exact":
        p = sps.binomtest(min(b, c), b + c, 0.5).pvalue
        return TestResult(float(min(b, c)), float(min(p, 1.0)), method)
    num = max(abs(b - c) - 1, 0) if method == "corrected" else abs(b - c)
    chi2 = num**2 / (b + c)
    return TestResult(float(chi2), float(sps.chi2.sf(chi2, 1)), method)


# --------------------------------------------------------------------------- DeLong (by hand)
def _delong_placements(y: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sun & Xu (2014) placement values for k score vectors at once, with mid-ranks.

    scores: (k, n).  Returns V10 (k, m): for each positive, the share of negatives it beats
    (ties ½); V01 (k, n₀): for each negative, the share of positives that beat it.  From
    mid-ranks: V10 = (T_Z − T_X)/n₀ and V01 = 1 − (T_Z − T_Y)/m, where T_X, T_Y, T_Z rank the
    positives, the negatives and all scores (eq. 5–6 of Sun & Xu, IEEE SPL 21:1389).
    """
    pos, neg = scores[:, y], scores[:, ~y]  # (k, m), (k, n0)
    m, n0 = pos.shape[1], neg.shape[1]
    tx = sps.rankdata(pos, axis=1)
    ty = sps.rankdata(neg, axis=1)
    tz = sps.rankdata(np.concatenate([pos, neg], axis=1), axis=1)
    v10 = (tz[:, :m] - tx) / n0
    v01 = 1.0 - (tz[:, m:] - ty) / m
    return v10, v01


def _delong_cov(y_true: Any, *score_vectors: Any) -> tuple[np.ndarray, np.ndarray]:
    """AUCs (k,) and their DeLong covariance matrix (k, k)."""
    y = _binary_labels(_as_1d("y_true", y_true))
    vs = [np.asarray(v, dtype=float) for v in score_vectors]
    names = ["scores"] if len(vs) == 1 else [f"scores_{chr(97 + i)}" for i in range(len(vs))]
    _check_same_length(y_true=y, **dict(zip(names, vs, strict=True)))
    s = np.vstack(vs)  # (k, n)
    _check_finite("scores", s)
    m, n0 = int(y.sum()), int((~y).sum())
    if m < 2 or n0 < 2:
        raise ValueError(
            f"DeLong variance needs at least 2 positives and 2 negatives, got {m} and {n0}"
        )
    v10, v01 = _delong_placements(y, s)
    auc = v10.mean(axis=1)
    cov = np.atleast_2d(np.cov(v10)) / m + np.atleast_2d(np.cov(v01)) / n0  # ddof = 1
    return auc, cov


def delong_auc(y_true: Any, scores: Any, alpha: float = 0.05) -> AUCResult:
    """AUC, its DeLong variance and the normal CI of eq. (9). Written by hand (no library).

    Uses the fast algorithm of Sun & Xu (2014) with mid-ranks, so tied scores count ½.
    Needs ≥ 2 positives and ≥ 2 negatives (the variance uses ddof = 1); one class only raises
    ``ValueError``.  All scores identical: AUC = 0.5 with variance 0 (every placement value
    is ½), i.e. a zero-width CI — finite, but a sign that the scores carry no information.
    """
    z = _z(alpha)
    auc, cov = _delong_cov(y_true, scores)
    a, var = float(auc[0]), max(float(cov[0, 0]), 0.0)
    se = math.sqrt(var)
    return AUCResult(a, var, se, max(a - z * se, 0.0), min(a + z * se, 1.0))


def _delong_from_cov(auc: np.ndarray, cov: np.ndarray, alpha: float) -> DeLongTest | None:
    """Paired DeLong test from AUCs (2,) and covariance (2, 2); None if Var(Δ) = 0 but Δ ≠ 0."""
    zc = _z(alpha)
    diff = float(auc[0] - auc[1])
    var = max(float(cov[0, 0] + cov[1, 1] - 2 * cov[0, 1]), 0.0)
    # placement values are multiples of 1/(m·n₀): a variance below ~1e-15 is rounding noise
    if var < 1e-15:
        if abs(diff) > 1e-12:
            return None
        return DeLongTest(float(auc[0]), float(auc[1]), diff, 0.0, 0.0, 0.0, 1.0, diff, diff)
    se = math.sqrt(var)
    z = diff / se
    return DeLongTest(float(auc[0]), float(auc[1]), diff, var, se, z,
                      float(2 * sps.norm.sf(abs(z))),
                      max(diff - zc * se, -1.0), min(diff + zc * se, 1.0))


def delong_test(y_true: Any, scores_a: Any, scores_b: Any, alpha: float = 0.05) -> DeLongTest:
    """DeLong paired test of two correlated AUCs on the same examples (§9.4). Hand-written.

    Var(Δ) = Var_A + Var_B − 2 Cov_AB from the placement covariance; z = Δ / SE;
    p = 2(1 − Φ(|z|)).  If Var(Δ) = 0 and Δ = 0 (e.g. identical scores) the result is z = 0,
    p = 1.  If Var(Δ) = 0 but Δ ≠ 0 the normal approximation is undefined and ``ValueError``
    is raised (use :func:`paired_bootstrap_ci` with ``metric="auc"``).
    """
    auc, cov = _delong_cov(y_true, scores_a, scores_b)
    t = _delong_from_cov(auc, cov, alpha)
    if t is None:
        raise ValueError(
            f"DeLong variance of the AUC difference is 0 while ΔAUC = {auc[0] - auc[1]:.6g}: "
            "the normal approximation is undefined; use paired_bootstrap_ci(metric='auc')"
        )
    return t


# --------------------------------------------------------------------------- multiplicity
def holm(pvalues: Any) -> np.ndarray:
    """Holm–Bonferroni step-down adjusted p-values (§9.6), in the input order.

    p̃₍ⱼ₎ = max_{i ≤ j} min(1, (K − i + 1) p₍ᵢ₎) over the sorted p-values.  Written out (5 lines)
    rather than calling statsmodels ``multipletests(method='holm')`` — which gives the same
    values (tested) but runs ``gc.collect()`` on every call (~50 ms in a large process); note
    its default method ``'hs'`` is Holm–Šidák.  Adjusted values are ≥ the raw ones, ≤ 1 and
    monotone in the raw order.  Empty in, empty out.
    """
    p = np.asarray(pvalues, dtype=float).reshape(-1)
    if p.size == 0:
        return p
    bad = ~((p >= 0) & (p <= 1))
    if bad.any():
        raise ValueError(f"p-values must be in [0, 1], got {p[bad].tolist()}")
    order = np.argsort(p, kind="stable")
    k = p.size
    adjusted = np.minimum(1.0, np.maximum.accumulate((k - np.arange(k)) * p[order]))
    out = np.empty_like(p)
    out[order] = adjusted
    return out


# --------------------------------------------------------------------------- NI / equivalence
def noninferiority(
    y_true: Any,
    y_full: Any,
    y_pruned: Any,
    *,
    margin: float = 0.01,
    metric: Metric = "accuracy",
    alpha: float = 0.05,
    n_resamples: int = 10_000,
    seed: SeedLike = 0,
) -> NonInferiority:
    """Non-inferiority of a pruned model to the full one within δ = ``margin`` (§9.7).

    Δ = m_full − m_pruned with a paired percentile bootstrap (1 − α) CI; non-inferior iff the
    upper bound < δ.  Following the paper, the two-sided (1 − α) CI is used, i.e. a one-sided
    test at α/2 (the conservative CONSORT convention).
    """
    if margin <= 0:
        raise ValueError(f"margin must be > 0, got {margin}")
    r = paired_bootstrap_ci(y_true, y_full, y_pruned, metric, n_resamples=n_resamples,
                            alpha=alpha, seed=seed)
    return NonInferiority(r.estimate, r.low, r.high, margin, bool(r.high < margin))


def equivalence_tost(values_a: Any, values_b: Any, *, margin: float = 0.01,
                     alpha: float = 0.05) -> Equivalence:
    """Two one-sided tests (TOST) that the paired mean difference lies within (−δ, δ) (§9.7).

    For accuracy pass the per-example correctness (``y_pred == y_true``) of the two models.
    Wraps ``statsmodels.stats.weightstats.ttost_paired``; (low, high) is the matching (1 − 2α)
    t-interval of the difference (equivalent iff it lies inside (−δ, δ)).  If all paired
    differences are equal the difference is known exactly: p = 0 if inside, 1 otherwise.
    """
    from statsmodels.stats.weightstats import ttost_paired

    a, b = np.asarray(values_a, dtype=float), np.asarray(values_b, dtype=float)
    n = _check_same_length(values_a=a, values_b=b)
    if margin <= 0:
        raise ValueError(f"margin must be > 0, got {margin}")
    d = a - b
    diff = float(d.mean())
    if n < 2 or np.ptp(d) == 0:
        inside = -margin < diff < margin
        return Equivalence(diff, 0.0 if inside else 1.0, diff, diff, margin, inside)
    p = float(ttost_paired(a, b, -margin, margin)[0])
    half = sps.t.ppf(1 - alpha, n - 1) * d.std(ddof=1) / math.sqrt(n)
    return Equivalence(diff, p, diff - half, diff + half, margin, p < alpha)


# --------------------------------------------------------------------------- power (§9.8)
def sample_size_two_proportions(p1: float, p2: float, alpha: float = 0.05,
                                power: float = 0.8) -> float:
    """Per-group n to detect p₁ − p₂ (two-sided α, unpaired), eq. (12); round up yourself.

    n = (z₁₋α/₂ + z₁₋β)² (p₁(1−p₁) + p₂(1−p₂)) / Δ².  Paired designs (McNemar) need fewer.
    """
    if p1 == p2:
        raise ValueError("p1 == p2: a zero difference cannot be detected (n is infinite)")
    cohens_h(p1, p2)  # validates the range
    zb = float(sps.norm.ppf(power))
    return float((_z(alpha) + zb) ** 2 * (p1 * (1 - p1) + p2 * (1 - p2)) / (p1 - p2) ** 2)


def sample_size_cohens_h(h: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """Per-group n for effect size h (arcsine scale): n = 2 ((z₁₋α/₂ + z₁₋β) / h)².

    Same as R ``pwr.2p.test`` and statsmodels ``NormalIndPower().solve_power`` (ratio 1) up to
    the far tail those include.
    """
    if h == 0:
        raise ValueError("h = 0: a zero effect cannot be detected (n is infinite)")
    return float(2 * ((_z(alpha) + sps.norm.ppf(power)) / h) ** 2)


def power_cohens_h(h: float, n_per_group: float, alpha: float = 0.05) -> float:
    """Two-sided power for effect size h with n per group (= statsmodels ``NormalIndPower``)."""
    if n_per_group <= 0:
        raise ValueError(f"n_per_group must be > 0, got {n_per_group}")
    z, shift = _z(alpha), abs(h) * math.sqrt(n_per_group / 2)
    return float(sps.norm.cdf(shift - z) + sps.norm.cdf(-shift - z))


def sample_size_ci_halfwidth(p: float, half_width: float, alpha: float = 0.05) -> float:
    """n so that the normal CI of a proportion p has the given half-width: z² p(1−p) / w²."""
    if half_width <= 0:
        raise ValueError(f"half_width must be > 0, got {half_width}")
    if not 0 <= p <= 1:
        raise ValueError(f"p must be in [0, 1], got {p}")
    return float(_z(alpha) ** 2 * p * (1 - p) / half_width**2)


# --------------------------------------------------------------------------- seeds (§9.1)
def aggregate_seeds(per_seed: Any, per_seed_ci: Any = None, confidence: float = 0.95,
                    bounds: tuple[float, float] | None = None) -> dict[str, Any]:
    """Mean over seeds with a t-interval across seeds, in the results-contract shape.

    Returns ``{"mean", "ci95": [lo, hi], "per_seed": [...]}`` plus ``"per_seed_ci95"`` when
    per-seed (example-level) CIs are given.  With one seed there is no between-seed spread: its
    per-seed CI is used as ``ci95`` if given, otherwise ``ValueError``.

    ``bounds``: the metric's range, e.g. ``(0, 1)`` for accuracy or AUC, ``(-1, 1)`` for MCC.
    The interval is cut to it: with 2 seeds the t quantile is 12.7 (1 df) and an accuracy
    interval reads [0.037, 1.118]; the cut interval still holds the true mean whenever the
    uncut one does (the mean lies in the range), so its coverage is unchanged, and it stays as
    wide as the seeds warrant inside the range (a bootstrap over 2 seeds would claim less).
    """
    v = np.asarray(per_seed, dtype=float).reshape(-1)
    if v.size == 0:
        raise ValueError("no seeds (n = 0) to aggregate")
    _check_finite("per_seed", v)
    out: dict[str, Any] = {"mean": float(v.mean())}
    cis = None
    if per_seed_ci is not None:
        cis = np.asarray(per_seed_ci, dtype=float).reshape(-1, 2)
        if len(cis) != v.size:
            raise ValueError(f"length mismatch: per_seed has {v.size} values but per_seed_ci "
                             f"has {len(cis)} intervals")
    if v.size == 1:
        if cis is None:
            raise ValueError("one seed: no across-seed CI; pass per_seed_ci or run ≥ 2 seeds")
        lo, hi = cis[0]
    else:
        half = sps.t.ppf(0.5 + confidence / 2, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size)
        lo, hi = v.mean() - half, v.mean() + half
    if bounds is not None:
        lo, hi = max(lo, bounds[0]), min(hi, bounds[1])
    out["ci95"] = [float(lo), float(hi)]
    out["per_seed"] = v.tolist()
    if cis is not None:
        out["per_seed_ci95"] = cis.tolist()
    return out


# --------------------------------------------------------------------------- calibration
def _top_label(probs: Any, y_true: Any) -> tuple[np.ndarray, np.ndarray]:
    """Confidence (max prob) and correctness of the top label.

    ``probs`` is (n, C), or (n,) = P(positive) for binary, read as (1 − p, p).
    """
    p = np.asarray(probs, dtype=float)
    y = _as_1d("y_true", y_true)
    if p.ndim == 1:
        p = np.stack([1 - p, p], axis=1)
    if p.ndim != 2:
        raise ValueError(f"probs must be (n,) or (n, C), got shape {p.shape}")
    _check_same_length(probs=p, y_true=y)
    _check_finite("probs", p)
    if p.min() < 0 or p.max() > 1:
        raise ValueError("probs must lie in [0, 1]")
    return p.max(axis=1), p.argmax(axis=1) == y


def reliability_diagram(probs: Any, y_true: Any, n_bins: int = 10) -> ReliabilityDiagram:
    """Per-bin mean confidence, accuracy and count; equal-width bins, (lo, hi] as in Guo et al.

    A confidence exactly on an edge goes to the lower bin (0.3 ∈ (0.2, 0.3]); 0 goes to bin 0.
    Empty bins have NaN confidence and accuracy, and count 0 (plotting skips them).
    """
    if n_bins < 1:
        raise ValueError(f"n_bins must be ≥ 1, got {n_bins}")
    conf, correct = _top_label(probs, y_true)
    edges = np.linspace(0.0, 1.0, n_bins + 1)  # same edges as Guo et al.'s reference code
    # side="left": edges[i-1] < conf <= edges[i]  →  bin i - 1
    b = np.clip(np.searchsorted(edges, conf, side="left") - 1, 0, n_bins - 1)
    count = np.bincount(b, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        c = np.bincount(b, weights=conf, minlength=n_bins) / count
        a = np.bincount(b, weights=correct, minlength=n_bins) / count
    return ReliabilityDiagram(edges, c, a, count)


def expected_calibration_error(probs: Any, y_true: Any, n_bins: int = 10) -> float:
    """ECE = Σ_b (|B_b| / n) |acc(B_b) − conf(B_b)| over equal-width (lo, hi] bins, top label.

    ``probs``: (n, C) class probabilities, or (n,) P(positive) for binary (top label of
    (1 − p, p); torchmetrics' binary task instead bins p against y).
    """
    r = reliability_diagram(probs, y_true, n_bins)
    ok = r.count > 0
    return float(np.sum(r.count[ok] * np.abs(r.accuracy[ok] - r.confidence[ok])) / r.count.sum())


def fit_temperature(logits: Any, y_true: Any, bounds: tuple[float, float] = (1e-2, 1e2)
                    ) -> float:
    """Temperature T minimising the NLL of softmax(logits / T) (Guo et al. 2017).

    ``logits``: (n, C), or (n,) binary logits (read as (0, z)).  Minimises over log T with
    ``scipy.optimize.minimize_scalar`` (bounded) inside ``bounds``; a warning is raised when
    the optimum sits on a bound (e.g. perfectly separated data, where T → 0).
    """
    z = np.asarray(logits, dtype=float)
    y = _as_1d("y_true", y_true).astype(int)
    if z.ndim == 1:
        z = np.stack([np.zeros_like(z), z], axis=1)
    if z.ndim != 2:
        raise ValueError(f"logits must be (n,) or (n, C), got shape {z.shape}")
    n = _check_same_length(logits=z, y_true=y)
    _check_finite("logits", z)
    if y.min() < 0 or y.max() >= z.shape[1]:
        raise ValueError(f"labels must be in [0, {z.shape[1] - 1}], got {y.min()}..{y.max()}")
    z_true = z[np.arange(n), y]

    def nll(log_t: float) -> float:
        inv_t = math.exp(-log_t)
        return float(np.mean(special.logsumexp(z * inv_t, axis=1) - z_true * inv_t))

    lo, hi = math.log(bounds[0]), math.log(bounds[1])
    res = optimize.minimize_scalar(nll, bounds=(lo, hi), method="bounded",
                                   options={"xatol": 1e-10})
    if min(res.x - lo, hi - res.x) < 1e-6:
        warnings.warn(f"temperature hit the search bound {math.exp(res.x):.3g}; the NLL keeps "
                      "decreasing beyond it", RuntimeWarning, stacklevel=2)
    return float(math.exp(res.x))


# --------------------------------------------------------------------------- decision rule
def _by_metric(value: float | Mapping[str, float], metric: str, default: Mapping[str, float]
               ) -> float:
    if isinstance(value, Mapping):
        return float(value.get(metric, default[metric]))
    return float(value)


def apply_decision_rule(
    comparisons: list[dict[str, Any]],
    alpha: float = 0.05,
    min_effect: float | Mapping[str, float] | None = None,
) -> list[dict[str, Any]]:
    """Holm over the whole family, then the claim of §9.10, filled in place (and returned).

    ``p_holm`` = Holm-adjusted ``p``.  ``claim`` is ``"improvement"`` (A better than B) or
    ``"degradation"`` if ``p_holm < alpha`` and ``|diff| ≥`` the metric's minimum effect
    (default |ΔAcc| ≥ 0.005, |ΔAUC| ≥ 0.002), else ``"none"``.
    """
    min_effect = DEFAULT_MIN_EFFECT if min_effect is None else min_effect
    adj = holm([c["p"] for c in comparisons])
    for c, ph in zip(comparisons, adj, strict=True):
        c["p_holm"] = float(ph)
        need = _by_metric(min_effect, c["metric"], DEFAULT_MIN_EFFECT)
        if ph < alpha and abs(c["diff"]) >= need:
            c["claim"] = "improvement" if c["diff"] > 0 else "degradation"
        else:
            c["claim"] = "none"
    return comparisons


def _positive_scores(scores: np.ndarray) -> np.ndarray | None:
    """P(positive) from (n,) or (n, 2) scores; None for multiclass (AUC not compared)."""
    s = np.asarray(scores, dtype=float)
    if s.ndim == 1:
        return s
    if s.ndim == 2 and s.shape[1] == 2:
        return s[:, 1]
    return None


def compare_predictions(
    preds: Mapping[str, Mapping[str, Any]],
    reference: str = "full",
    *,
    alpha: float = 0.05,
    margin: float | Mapping[str, float] = 0.01,
    min_effect: float | Mapping[str, float] | None = None,
    n_resamples: int = 10_000,
    seed: SeedLike = 0,
    adjust: bool = True,
    metrics: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """Compare every model against ``reference`` on the same examples (§9.4–9.10).

    ``preds``: label → ``{"y_true", "y_pred", "scores" (optional)}``; ``scores`` is (n,)
    P(positive) or (n, C) probabilities.  ``margin``: δ for every metric, or {metric: δ}
    (missing metrics: 0.01).  ``min_effect``: like ``margin``, default
    :data:`DEFAULT_MIN_EFFECT`.  ``seed`` seeds the bootstrap (int or Generator).  For each label ≠ reference, A = label, B = reference,
    diff = m_A − m_B (positive: A better), one dict in the DESIGN.md ``comparisons`` format:

    - accuracy: ``test="mcnemar"`` (``test_variant`` exact if b + c < 25, else χ² corrected),
      ``ci95`` from the paired percentile bootstrap, ``effect.cohens_h`` = h(acc_A, acc_B);
    - AUC (binary problems with scores for both): ``test="delong"``, ``ci95`` = DeLong normal
      CI (falls back to ``test="bootstrap"`` when the DeLong variance is 0 with Δ ≠ 0);
      ``effect.cohens_h`` is None.

    Extra keys: ``value_a``, ``value_b``, ``n``, ``margin``, ``noninferior`` (the (1 − α) CI's
    lower bound of diff > −δ, i.e. upper bound of m_B − m_A < δ, §9.7), ``p_holm`` and
    ``claim`` (:func:`apply_decision_rule`, Holm over the whole returned family; with
    ``adjust=False`` they are left out so a caller can pool several calls first).
    ``ci95`` is the 95 % interval whatever ``alpha``; ``noninferior`` uses the (1 − α) one.

    ``metrics``: which of accuracy, auc, mcc, pearson, spearman to compare, in that order per
    label (default ``("accuracy", "auc")``; :data:`TASK_METRICS` lists them by task). MCC
    (on ``y_pred`` classes) and Pearson / Spearman (on ``y_pred`` real-valued predictions of
    a regression) have no classical paired test: ``test="bootstrap"``, ``ci95`` and ``p`` from
    the paired percentile bootstrap (:func:`paired_bootstrap_ci`); the correlations add
    ``effect.cohens_q`` = atanh r_A − atanh r_B (Cohen's q: 0.1 / 0.3 / 0.5 small / medium /
    large). A correlation undefined for a model (constant predictions) raises ValueError.
    """
    metrics = ("accuracy", "auc") if metrics is None else tuple(metrics)
    known = ("accuracy", "auc", "mcc", "pearson", "spearman")
    for m in metrics:
        if m not in known:
            raise ValueError(f"metrics: unknown metric {m!r}; choose from {', '.join(known)}")
    if reference not in preds:
        raise ValueError(f"reference {reference!r} not among the labels {sorted(preds)}")
    ref = preds[reference]
    y = _as_1d(f"{reference}.y_true", ref["y_true"])
    rng = np.random.default_rng(seed)
    out: list[dict[str, Any]] = []
    for label, p in preds.items():
        if label == reference:
            continue
        ya = _as_1d(f"{label}.y_true", p["y_true"])
        _check_same_length(**{f"{reference}.y_true": y, f"{label}.y_true": ya})
        if not np.array_equal(ya, y):
            raise ValueError(f"{label!r} and {reference!r} were scored on different examples "
                             "(y_true differs); paired comparisons need the same examples")
        pa, pb = np.asarray(p["y_pred"]), np.asarray(ref["y_pred"])
        for m in metrics:
            if m == "accuracy":
                out.append(_compare_accuracy(label, reference, y, pa, pb, alpha, margin,
                                             n_resamples, rng))
            elif m == "auc":
                if p.get("scores") is None or ref.get("scores") is None:
                    continue
                sa, sb = _positive_scores(p["scores"]), _positive_scores(ref["scores"])
                if sa is not None and sb is not None:
                    out.append(_compare_auc(label, reference, y, sa, sb, alpha, margin,
                                            n_resamples, rng))
            else:
                out.append(_compare_bootstrap(m, label, reference, y, pa, pb, alpha, margin,
                                              n_resamples, rng))
    if adjust:
        apply_decision_rule(out, alpha, min_effect)
    return out


def _quantiles(d: np.ndarray, alpha: float) -> list[float]:
    return [float(q) for q in np.quantile(d, [alpha / 2, 1 - alpha / 2])]


def _compare_accuracy(a, b, y, pa, pb, alpha, margin, n_resamples, rng) -> dict[str, Any]:
    (ea, eb), dist = _bootstrap_distributions(y, [pa, pb], "accuracy", n_resamples, rng, True)
    d = dist[0] - dist[1]
    nb, nc = discordant_counts(y, pa, pb)
    t = mcnemar(nb, nc, "auto")
    delta = _by_metric(margin, "accuracy", {"accuracy": 0.01})
    return {
        "a": a, "b": b, "metric": "accuracy", "diff": ea - eb,
        "ci95": _quantiles(d, 0.05), "test": "mcnemar", "test_variant": t.method,
        "p": t.pvalue, "effect": {"cohens_h": cohens_h(ea, eb), "delta": ea - eb},
        "value_a": ea, "value_b": eb, "n": int(y.size), "margin": delta,
        "noninferior": bool(_quantiles(d, alpha)[0] > -delta),
    }


def _compare_auc(a, b, y, sa, sb, alpha, margin, n_resamples, rng) -> dict[str, Any]:
    delta = _by_metric(margin, "auc", {"auc": 0.01})
    auc, cov = _delong_cov(y, sa, sb)
    t = _delong_from_cov(auc, cov, 0.05)
    if t is not None:
        lower = max(t.diff - _z(alpha) * t.se, -1.0)
        res = {"diff": t.diff, "ci95": [t.low, t.high], "test": "delong", "p": t.pvalue}
    else:  # DeLong undefined (Var(Δ) = 0, Δ ≠ 0): paired bootstrap of ΔAUC, §9.4's alternative
        (ea, eb), dist = _bootstrap_distributions(y, [sa, sb], "auc", n_resamples, rng, True)
        dist = _valid_columns(dist, "auc")
        r = _paired_from_dist(ea, eb, dist, 0.05)
        lower = _quantiles(dist[0] - dist[1], alpha)[0]
        res = {"diff": r.estimate, "ci95": [r.low, r.high], "test": "bootstrap", "p": r.pvalue}
    return {
        "a": a, "b": b, "metric": "auc", "diff": res["diff"], "ci95": res["ci95"],
        "test": res["test"], "p": res["p"],
        "effect": {"cohens_h": None, "delta": res["diff"]},
        "value_a": float(auc[0]), "value_b": float(auc[1]), "n": int(y.size),
        "margin": delta, "noninferior": bool(lower > -delta),
    }


def _compare_bootstrap(metric, a, b, y, xa, xb, alpha, margin, n_resamples, rng
                       ) -> dict[str, Any]:
    """Paired percentile bootstrap of Δ = metric(A) − metric(B) (MCC, Pearson, Spearman)."""
    (ea, eb), dist = _bootstrap_distributions(y, [xa, xb], metric, n_resamples, rng, True)
    dist = _valid_columns(dist, metric)
    r = _paired_from_dist(ea, eb, dist, 0.05)
    delta = _by_metric(margin, metric, {metric: 0.01})
    effect: dict[str, Any] = {"cohens_h": None, "delta": r.estimate}
    if metric in ("pearson", "spearman"):
        # atanh(±1) is infinite: a perfect correlation gets the largest finite q
        clip = np.nextafter(1.0, 0.0)
        effect["cohens_q"] = float(np.arctanh(np.clip(ea, -clip, clip))
                                   - np.arctanh(np.clip(eb, -clip, clip)))
    return {
        "a": a, "b": b, "metric": metric, "diff": r.estimate, "ci95": [r.low, r.high],
        "test": "bootstrap", "p": r.pvalue, "effect": effect,
        "value_a": ea, "value_b": eb, "n": int(y.size), "margin": delta,
        "noninferior": bool(_quantiles(dist[0] - dist[1], alpha)[0] > -delta),
    }
