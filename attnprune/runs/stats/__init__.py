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

Layout, by job (every public name is imported here: ``from attnprune.runs.stats import …``):
``base`` the result types, defaults and input checks; ``bootstrap`` the paired percentile
bootstrap; ``intervals`` one proportion, effect size, power and the mean over seeds; ``paired``
McNemar, DeLong, Holm, non-inferiority and equivalence; ``calibration``; ``decision`` the §9.10
rule and :func:`compare_predictions`.

Degenerate inputs raise ``ValueError`` naming the problem (empty input, length mismatch, one
class only for AUC) instead of returning NaN.  Documented exceptions: empty bins in
:func:`reliability_diagram` hold NaN confidence / accuracy (with count 0).
"""

from __future__ import annotations

from attnprune.runs.stats.base import (
    CI,
    DEFAULT_MIN_EFFECT,
    TASK_METRICS,
    AUCResult,
    BootstrapCI,
    DeLongTest,
    Equivalence,
    NonInferiority,
    PairedBootstrapCI,
    ReliabilityDiagram,
    TestResult,
)
from attnprune.runs.stats.bootstrap import bootstrap_ci, paired_bootstrap_ci
from attnprune.runs.stats.calibration import (
    expected_calibration_error,
    fit_temperature,
    reliability_diagram,
)
from attnprune.runs.stats.decision import apply_decision_rule, compare_predictions
from attnprune.runs.stats.intervals import (
    aggregate_seeds,
    cohens_h,
    power_cohens_h,
    sample_size_ci_halfwidth,
    sample_size_cohens_h,
    sample_size_two_proportions,
    wilson_ci,
)
from attnprune.runs.stats.paired import (
    delong_auc,
    delong_test,
    discordant_counts,
    equivalence_tost,
    holm,
    mcnemar,
    noninferiority,
)

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
