"""What every part of :mod:`attnprune.runs.stats` shares: the result types, the default
minimum effects and task metrics, and the checks of the inputs (empty, length, finite, α)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np
from scipy import stats as sps

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
def as_1d(name: str, x: Any, *, allow_empty: bool = False) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim == 0:
        raise ValueError(f"{name} must be a 1-D array, got a scalar")
    if a.shape[0] == 0 and not allow_empty:
        raise ValueError(f"{name} is empty (n = 0): no statistic is defined")
    return a


def check_same_length(**arrays: np.ndarray) -> int:
    items = list(arrays.items())
    n0_name, n0 = items[0][0], len(items[0][1])
    for name, a in items[1:]:
        if len(a) != n0:
            raise ValueError(f"length mismatch: {n0_name} has {n0} elements but {name} has {len(a)}")
    if n0 == 0:
        raise ValueError(f"{n0_name} is empty (n = 0): no statistic is defined")
    return n0


def check_finite(name: str, a: np.ndarray) -> None:
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} contains NaN or infinite values")


def binary_labels(y_true: Any) -> np.ndarray:
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


def z_critical(alpha: float) -> float:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    return float(sps.norm.ppf(1 - alpha / 2))
