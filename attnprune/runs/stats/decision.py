"""The §9.10 decision rule and the comparison records every command writes
(:func:`compare_predictions`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from attnprune.runs.stats.base import (
    DEFAULT_MIN_EFFECT,
    SeedLike,
    as_1d,
    check_same_length,
    z_critical,
)
from attnprune.runs.stats.bootstrap import bootstrap_distributions, paired_from_dist, valid_columns
from attnprune.runs.stats.intervals import cohens_h
from attnprune.runs.stats.paired import (
    delong_cov,
    delong_from_cov,
    discordant_counts,
    holm,
    mcnemar,
)


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
    y = as_1d(f"{reference}.y_true", ref["y_true"])
    rng = np.random.default_rng(seed)
    out: list[dict[str, Any]] = []
    for label, p in preds.items():
        if label == reference:
            continue
        ya = as_1d(f"{label}.y_true", p["y_true"])
        check_same_length(**{f"{reference}.y_true": y, f"{label}.y_true": ya})
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
    (ea, eb), dist = bootstrap_distributions(y, [pa, pb], "accuracy", n_resamples, rng, True)
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
    auc, cov = delong_cov(y, sa, sb)
    t = delong_from_cov(auc, cov, 0.05)
    if t is not None:
        lower = max(t.diff - z_critical(alpha) * t.se, -1.0)
        res = {"diff": t.diff, "ci95": [t.low, t.high], "test": "delong", "p": t.pvalue}
    else:  # DeLong undefined (Var(Δ) = 0, Δ ≠ 0): paired bootstrap of ΔAUC, §9.4's alternative
        (ea, eb), dist = bootstrap_distributions(y, [sa, sb], "auc", n_resamples, rng, True)
        dist = valid_columns(dist, "auc")
        r = paired_from_dist(ea, eb, dist, 0.05)
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
    (ea, eb), dist = bootstrap_distributions(y, [xa, xb], metric, n_resamples, rng, True)
    dist = valid_columns(dist, metric)
    r = paired_from_dist(ea, eb, dist, 0.05)
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
