"""Calibration (Guo et al. 2017): reliability diagram, expected calibration error, temperature."""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
from scipy import optimize, special

from attnprune.runs.stats.base import ReliabilityDiagram, as_1d, check_finite, check_same_length


# --------------------------------------------------------------------------- calibration
def _top_label(probs: Any, y_true: Any) -> tuple[np.ndarray, np.ndarray]:
    """Confidence (max prob) and correctness of the top label.

    ``probs`` is (n, C), or (n,) = P(positive) for binary, read as (1 − p, p).
    """
    p = np.asarray(probs, dtype=float)
    y = as_1d("y_true", y_true)
    if p.ndim == 1:
        p = np.stack([1 - p, p], axis=1)
    if p.ndim != 2:
        raise ValueError(f"probs must be (n,) or (n, C), got shape {p.shape}")
    check_same_length(probs=p, y_true=y)
    check_finite("probs", p)
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
    y = as_1d("y_true", y_true).astype(int)
    if z.ndim == 1:
        z = np.stack([np.zeros_like(z), z], axis=1)
    if z.ndim != 2:
        raise ValueError(f"logits must be (n,) or (n, C), got shape {z.shape}")
    n = check_same_length(logits=z, y_true=y)
    check_finite("logits", z)
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
