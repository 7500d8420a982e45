"""Paired tests of two models on the same examples: McNemar (§9.4), DeLong by hand (§9.3-9.4),
Holm (§9.6), non-inferiority and equivalence (§9.7)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import stats as sps

from attnprune.runs.stats.base import (
    MCNEMAR_EXACT_BELOW,
    AUCResult,
    DeLongTest,
    Equivalence,
    Metric,
    NonInferiority,
    SeedLike,
    TestResult,
    as_1d,
    binary_labels,
    check_finite,
    check_same_length,
    z_critical,
)
from attnprune.runs.stats.bootstrap import paired_bootstrap_ci


def discordant_counts(y_true: Any, y_pred_a: Any, y_pred_b: Any) -> tuple[int, int]:
    """McNemar's (b, c): b = #(A right, B wrong), c = #(A wrong, B right)."""
    y, a, b = np.asarray(y_true), np.asarray(y_pred_a), np.asarray(y_pred_b)
    check_same_length(y_true=y, y_pred_a=a, y_pred_b=b)
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


def delong_cov(y_true: Any, *score_vectors: Any) -> tuple[np.ndarray, np.ndarray]:
    """AUCs (k,) and their DeLong covariance matrix (k, k)."""
    y = binary_labels(as_1d("y_true", y_true))
    vs = [np.asarray(v, dtype=float) for v in score_vectors]
    names = ["scores"] if len(vs) == 1 else [f"scores_{chr(97 + i)}" for i in range(len(vs))]
    check_same_length(y_true=y, **dict(zip(names, vs, strict=True)))
    s = np.vstack(vs)  # (k, n)
    check_finite("scores", s)
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
    z = z_critical(alpha)
    auc, cov = delong_cov(y_true, scores)
    a, var = float(auc[0]), max(float(cov[0, 0]), 0.0)
    se = math.sqrt(var)
    return AUCResult(a, var, se, max(a - z * se, 0.0), min(a + z * se, 1.0))


def delong_from_cov(auc: np.ndarray, cov: np.ndarray, alpha: float) -> DeLongTest | None:
    """Paired DeLong test from AUCs (2,) and covariance (2, 2); None if Var(Δ) = 0 but Δ ≠ 0."""
    zc = z_critical(alpha)
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
    auc, cov = delong_cov(y_true, scores_a, scores_b)
    t = delong_from_cov(auc, cov, alpha)
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
    n = check_same_length(values_a=a, values_b=b)
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
