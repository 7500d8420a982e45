"""One proportion's interval, effect size, power and sample size (§9.2, 9.5, 9.8), and the
mean over seeds (§9.1)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import stats as sps

from attnprune.runs.stats.base import CI, check_finite, z_critical


# --------------------------------------------------------------------------- proportions
def wilson_ci(successes: int, n: int, alpha: float = 0.05) -> CI:
    """Wilson score interval for a proportion, eq. (8) (statsmodels ``method='wilson'``)."""
    from statsmodels.stats.proportion import proportion_confint

    if n <= 0:
        raise ValueError(f"Wilson interval needs n ≥ 1 trials, got n = {n}")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in [0, n = {n}], got {successes}")
    z_critical(alpha)
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
    return float((z_critical(alpha) + zb) ** 2 * (p1 * (1 - p1) + p2 * (1 - p2)) / (p1 - p2) ** 2)


def sample_size_cohens_h(h: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """Per-group n for effect size h (arcsine scale): n = 2 ((z₁₋α/₂ + z₁₋β) / h)².

    Same as R ``pwr.2p.test`` and statsmodels ``NormalIndPower().solve_power`` (ratio 1) up to
    the far tail those include.
    """
    if h == 0:
        raise ValueError("h = 0: a zero effect cannot be detected (n is infinite)")
    return float(2 * ((z_critical(alpha) + sps.norm.ppf(power)) / h) ** 2)


def power_cohens_h(h: float, n_per_group: float, alpha: float = 0.05) -> float:
    """Two-sided power for effect size h with n per group (= statsmodels ``NormalIndPower``)."""
    if n_per_group <= 0:
        raise ValueError(f"n_per_group must be > 0, got {n_per_group}")
    z, shift = z_critical(alpha), abs(h) * math.sqrt(n_per_group / 2)
    return float(sps.norm.cdf(shift - z) + sps.norm.cdf(-shift - z))


def sample_size_ci_halfwidth(p: float, half_width: float, alpha: float = 0.05) -> float:
    """n so that the normal CI of a proportion p has the given half-width: z² p(1−p) / w²."""
    if half_width <= 0:
        raise ValueError(f"half_width must be > 0, got {half_width}")
    if not 0 <= p <= 1:
        raise ValueError(f"p must be in [0, 1], got {p}")
    return float(z_critical(alpha) ** 2 * p * (1 - p) / half_width**2)


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
    check_finite("per_seed", v)
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
