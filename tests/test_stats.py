"""attnprune.runs.stats: reference values (shared/REFERENCE_VALUES.md), library cross-checks,
degenerate inputs and the comparisons contract of DESIGN.md."""

import json
import math

import numpy as np
import pytest
from scipy import stats as sps
from scipy.special import logsumexp
from sklearn.metrics import roc_auc_score
from statsmodels.stats.contingency_tables import mcnemar as sm_mcnemar
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import NormalIndPower
from statsmodels.stats.proportion import samplesize_confint_proportion
from statsmodels.stats.weightstats import ttost_paired

from attnprune.runs import stats as S

TOL = {"rel": 1e-6, "abs": 1e-9}


# --------------------------------------------------------------------------- reference values
@pytest.mark.parametrize(
    "method, stat, p",
    [("corrected", 16.8177966, 4.1146e-05), ("uncorrected", 17.3559, 3.0993e-05),
     ("exact", 86, 3.716e-05)],
)
def test_mcnemar_reference(method, stat, p):
    table = np.array([[794, 86], [150, 570]])
    r = S.mcnemar(table[0, 1], table[1, 0], method)
    assert r.statistic == pytest.approx(stat, rel=1e-5)
    assert r.pvalue == pytest.approx(p, rel=2e-4)  # reference p is given to 4-5 digits
    assert r.method == method


def test_mcnemar_auto_switches_at_25():
    assert S.mcnemar(86, 150).method == "corrected"
    assert S.mcnemar(10, 14).method == "exact"  # b + c = 24
    assert S.mcnemar(10, 15).method == "corrected"


@pytest.mark.parametrize(
    "k, n, lo, hi",
    [(81, 263, 0.255289, 0.366210), (15, 148, 0.062386, 0.160487), (0, 20, 0.0, 0.161125),
     (1, 29, 0.006113, 0.171755)],
)
def test_wilson_newcombe(k, n, lo, hi):
    ci = S.wilson_ci(k, n)
    assert ci.low == pytest.approx(lo, abs=1e-6)
    assert ci.high == pytest.approx(hi, abs=1e-6)


def test_wilson_matches_eq8_by_hand():
    k, n, z = 37, 90, sps.norm.ppf(0.975)
    p = k / n
    mid, half = p + z**2 / (2 * n), z * math.sqrt(p * (1 - p) / n + z**2 / (4 * n**2))
    ci = S.wilson_ci(k, n)
    assert ci.low == pytest.approx((mid - half) / (1 + z**2 / n), **TOL)
    assert ci.high == pytest.approx((mid + half) / (1 + z**2 / n), **TOL)


def test_holm_reference():
    np.testing.assert_allclose(S.holm([0.01, 0.02, 0.03, 0.04, 0.05]),
                               [0.05, 0.08, 0.09, 0.09, 0.09], rtol=1e-12)


def test_cohens_h_reference():
    assert S.cohens_h(0.65, 0.45) == pytest.approx(0.404860, abs=1e-6)


def test_power_and_sample_sizes_reference():
    assert S.sample_size_cohens_h(0.5) == pytest.approx(62.79, abs=5e-3)
    assert S.power_cohens_h(0.2, 200) == pytest.approx(0.5160, abs=5e-5)
    assert S.sample_size_ci_halfwidth(0.5, 0.03) == pytest.approx(1067.07, abs=5e-3)


def _hanley_mcneil():
    ratings = np.arange(1, 6)
    neg = np.repeat(ratings, [33, 6, 6, 11, 2])
    pos = np.repeat(ratings, [3, 2, 2, 11, 33])
    return np.r_[np.zeros(neg.size, int), np.ones(pos.size, int)], np.r_[neg, pos].astype(float)


def test_delong_hanley_mcneil():
    y, s = _hanley_mcneil()
    r = S.delong_auc(y, s)
    assert r.auc == pytest.approx(0.893171, abs=1e-6)
    assert r.se == pytest.approx(0.030724, abs=1e-6)
    assert r.variance == pytest.approx(r.se**2, **TOL)
    assert r.low == pytest.approx(r.auc - sps.norm.ppf(0.975) * r.se, **TOL)
    # the arrays are right: Hanley & McNeil's own SE formula gives the paper's 0.032487
    a, m, n = r.auc, int(y.sum()), int((1 - y).sum())
    q1, q2 = a / (2 - a), 2 * a**2 / (1 + a)
    hm = math.sqrt((a * (1 - a) + (m - 1) * (q1 - a**2) + (n - 1) * (q2 - a**2)) / (m * n))
    assert hm == pytest.approx(0.032487, abs=1e-6)


def test_delong_tiny():
    r = S.delong_auc([1, 1, 0, 0], [0.9, 0.4, 0.6, 0.1])
    assert r.auc == pytest.approx(0.75, **TOL)
    assert r.variance == pytest.approx(0.125, **TOL)


ECE_PROBS = [[.25, .42, .33], [.15, .68, .17], [.03, .05, .92], [.62, .28, .10],
             [.33, .31, .36], [.10, .15, .75]]
ECE_Y = [1, 0, 2, 0, 1, 2]


def test_ece_reference():
    assert S.expected_calibration_error(ECE_PROBS, ECE_Y) == pytest.approx(0.261667, abs=1e-6)


def test_temperature_closed_form():
    logits = np.tile([2.0, 0.0, 0.0], (100, 1))
    y = np.r_[np.zeros(80), np.ones(10), np.full(10, 2)].astype(int)
    t = S.fit_temperature(logits, y)
    assert t == pytest.approx(2 / math.log(8), abs=1e-6)
    assert 1 / t == pytest.approx(1.0397208, abs=1e-6)  # sklearn's β


# --------------------------------------------------------------------------- library cross-checks
def test_mcnemar_matches_statsmodels_on_random_tables():
    rng = np.random.default_rng(0)
    for _ in range(20):
        b, c = (int(v) for v in rng.integers(0, 60, 2))
        if b == c:  # statsmodels does not floor (|b−c|−1) at 0; documented difference
            continue
        t = [[5, b], [c, 7]]
        for method, kw in [("corrected", {"exact": False, "correction": True}),
                           ("uncorrected", {"exact": False, "correction": False}),
                           ("exact", {"exact": True})]:
            ref = sm_mcnemar(t, **kw)
            r = S.mcnemar(b, c, method)
            assert r.statistic == pytest.approx(ref.statistic, **TOL)
            assert r.pvalue == pytest.approx(min(ref.pvalue, 1.0), **TOL)


def test_discordant_counts():
    y = np.array([1, 0, 1, 0, 1])
    a = np.array([1, 0, 0, 1, 1])  # right, right, wrong, wrong, right
    b = np.array([0, 0, 1, 1, 0])  # wrong, right, right, wrong, wrong
    assert S.discordant_counts(y, a, b) == (2, 1)


def test_holm_matches_statsmodels_and_step_down_by_hand():
    p = np.random.default_rng(1).random(12) ** 3
    adj = S.holm(p)
    np.testing.assert_allclose(adj, multipletests(p, method="holm")[1])
    order = np.argsort(p)
    k = p.size
    by_hand = np.maximum.accumulate([min(1, (k - i) * p[j]) for i, j in enumerate(order)])
    np.testing.assert_allclose(adj[order], by_hand)


def test_power_and_sample_size_match_normalindpower():
    pw = NormalIndPower()
    for h, n in [(0.2, 200), (0.35, 50), (-0.5, 80)]:
        assert S.power_cohens_h(h, n) == pytest.approx(pw.power(abs(h), n, 0.05), **TOL)
    for h in (0.3, 0.5, 0.8):
        assert S.sample_size_cohens_h(h) == pytest.approx(
            pw.solve_power(h, alpha=0.05, power=0.8), rel=1e-4)


def test_eq12_matches_normalindpower_and_hand_value():
    p1, p2 = 0.65, 0.45
    n = S.sample_size_two_proportions(p1, p2)
    z = sps.norm.ppf(0.975) + sps.norm.ppf(0.8)
    assert n == pytest.approx(z**2 * (p1 * (1 - p1) + p2 * (1 - p2)) / 0.2**2, **TOL)
    # eq. 12 is the normal test with effect size Δ / √((p1q1 + p2q2)/2)
    es = (p1 - p2) / math.sqrt((p1 * (1 - p1) + p2 * (1 - p2)) / 2)
    assert n == pytest.approx(NormalIndPower().solve_power(es, alpha=0.05, power=0.8), rel=1e-4)


def test_ci_halfwidth_matches_statsmodels():
    for p, w in [(0.5, 0.03), (0.9, 0.01), (0.2, 0.05)]:
        assert S.sample_size_ci_halfwidth(p, w) == pytest.approx(
            samplesize_confint_proportion(p, w, alpha=0.05), **TOL)


def test_auc_matches_sklearn_with_ties():
    rng = np.random.default_rng(2)
    for _ in range(10):
        y = rng.integers(0, 2, 200)
        y[:2] = [0, 1]
        s = np.round(rng.normal(size=200) + y, 1)  # rounding makes ties
        ref = roc_auc_score(y, s)
        assert S.delong_auc(y, s).auc == pytest.approx(ref, **TOL)
        assert S.bootstrap_ci(y, s, "auc", n_resamples=5).estimate == pytest.approx(ref, **TOL)


def test_bootstrap_auc_rows_match_sklearn_per_resample():
    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, 60).astype(bool)
    s = np.round(rng.random(60) + y, 1)
    idx = rng.integers(0, 60, (8, 60))
    f = S.bootstrap._auc_by_weights(y, s)
    np.testing.assert_allclose(f(idx), [roc_auc_score(y[i], s[i]) for i in idx])


def _brute_placements(y, s):
    pos, neg = s[y == 1], s[y == 0]
    psi = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])  # (m, n0)
    return psi.mean(axis=1), psi.mean(axis=0)


def test_delong_variance_vs_brute_force_placements_with_ties():
    rng = np.random.default_rng(4)
    for _ in range(25):
        n = int(rng.integers(6, 40))
        y = rng.integers(0, 2, n)
        y[:4] = [0, 0, 1, 1]
        sa = rng.integers(0, 5, n).astype(float) + y  # few distinct values: many ties
        sb = rng.integers(0, 4, n).astype(float) + 0.5 * y
        m, n0 = y.sum(), (1 - y).sum()
        va10, va01 = _brute_placements(y, sa)
        vb10, vb01 = _brute_placements(y, sb)
        var_a = va10.var(ddof=1) / m + va01.var(ddof=1) / n0
        r = S.delong_auc(y, sa)
        assert r.auc == pytest.approx(va10.mean(), **TOL)
        assert r.variance == pytest.approx(var_a, **TOL)
        cov = np.cov(va10, vb10)[0, 1] / m + np.cov(va01, vb01)[0, 1] / n0
        var_b = vb10.var(ddof=1) / m + vb01.var(ddof=1) / n0
        var_d = var_a + var_b - 2 * cov
        try:
            t = S.delong_test(y, sa, sb)
        except ValueError:
            assert var_d < 1e-12
            continue
        assert t.variance == pytest.approx(var_d, rel=1e-6, abs=1e-12)
        if var_d > 0:
            z = (va10.mean() - vb10.mean()) / math.sqrt(var_d)
            assert t.pvalue == pytest.approx(2 * sps.norm.sf(abs(z)), rel=1e-6, abs=1e-12)


def test_bootstrap_matches_scipy_percentile():
    rng = np.random.default_rng(5)
    y = rng.integers(0, 2, 400)
    a = np.where(rng.random(400) < 0.85, y, 1 - y)
    b = np.where(rng.random(400) < 0.80, y, 1 - y)
    ca, cb = (a == y).astype(float), (b == y).astype(float)
    one = S.bootstrap_ci(y, a, n_resamples=4000, seed=11)
    ref = sps.bootstrap((ca,), np.mean, method="percentile", n_resamples=4000, rng=12)
    assert one.estimate == pytest.approx(ca.mean())
    assert one.low == pytest.approx(ref.confidence_interval.low, abs=0.01)
    assert one.high == pytest.approx(ref.confidence_interval.high, abs=0.01)
    pair = S.paired_bootstrap_ci(y, a, b, n_resamples=4000, seed=11)
    ref = sps.bootstrap((ca, cb), lambda u, v, axis=-1: u.mean(axis) - v.mean(axis),
                        paired=True, method="percentile", n_resamples=4000, rng=12)
    assert pair.estimate == pytest.approx(ca.mean() - cb.mean())
    assert pair.low == pytest.approx(ref.confidence_interval.low, abs=0.01)
    assert pair.high == pytest.approx(ref.confidence_interval.high, abs=0.01)
    assert pair.se == pytest.approx(ref.standard_error, rel=0.1)


def test_bootstrap_generic_callables_agree_with_builtin():
    rng = np.random.default_rng(6)
    y = rng.integers(0, 3, 150)
    x = np.where(rng.random(150) < 0.7, y, (y + 1) % 3)
    builtin = S.bootstrap_ci(y, x, "accuracy", n_resamples=300, seed=3)
    loop = S.bootstrap_ci(y, x, lambda t, p: float(np.mean(t == p)), n_resamples=300, seed=3)
    vec = S.bootstrap_ci(y, x, lambda t, p: (t == p).mean(axis=-1), n_resamples=300, seed=3,
                         vectorized=True)
    for r in (loop, vec):
        assert r.estimate == pytest.approx(builtin.estimate)
        assert (r.low, r.high) == pytest.approx((builtin.low, builtin.high))


def test_bootstrap_seed_reproducible_and_generator_accepted():
    y = np.arange(100) % 2
    x = (np.arange(100) % 3 == 0).astype(int)
    r1 = S.bootstrap_ci(y, x, n_resamples=500, seed=7)
    r2 = S.bootstrap_ci(y, x, n_resamples=500, seed=np.random.default_rng(7))
    assert r1 == r2


def test_equivalence_tost_matches_statsmodels():
    rng = np.random.default_rng(8)
    a, b = rng.integers(0, 2, 500).astype(float), rng.integers(0, 2, 500).astype(float)
    r = S.equivalence_tost(a, b, margin=0.05)
    assert r.pvalue == pytest.approx(ttost_paired(a, b, -0.05, 0.05)[0], **TOL)
    assert r.equivalent == (r.pvalue < 0.05) == (-0.05 < r.low and r.high < 0.05)


def test_equivalence_identical_models():
    c = np.ones(50)
    r = S.equivalence_tost(c, c, margin=0.01)
    assert (r.diff, r.pvalue, r.equivalent) == (0.0, 0.0, True)


def test_noninferiority():
    rng = np.random.default_rng(9)
    y = rng.integers(0, 2, 2000)
    full = np.where(rng.random(2000) < 0.9, y, 1 - y)
    assert S.noninferiority(y, full, full, margin=0.01, n_resamples=500).noninferior
    worse = np.where(rng.random(2000) < 0.5, full, 1 - y)  # much worse
    r = S.noninferiority(y, full, worse, margin=0.01, n_resamples=500)
    assert r.diff > 0.1 and r.high > r.low > 0.01 and not r.noninferior


def test_aggregate_seeds_contract_and_t_interval():
    v = [0.81, 0.83, 0.80, 0.84, 0.82]
    ci = [[0.78, 0.84]] * 5
    out = S.aggregate_seeds(v, ci)
    lo, hi = sps.t.interval(0.95, 4, loc=np.mean(v), scale=sps.sem(v))
    assert out["mean"] == pytest.approx(np.mean(v))
    assert out["ci95"] == pytest.approx([lo, hi])
    assert out["per_seed"] == v and out["per_seed_ci95"] == ci
    json.dumps(out)
    assert S.aggregate_seeds([0.7], [[0.6, 0.8]])["ci95"] == [0.6, 0.8]
    with pytest.raises(ValueError, match="one seed"):
        S.aggregate_seeds([0.7])


def test_reliability_diagram_and_edge_convention():
    r = S.reliability_diagram(ECE_PROBS, ECE_Y)
    assert r.count.sum() == 6 and r.count[6] == 2  # .62 and .68 in (0.6, 0.7]
    assert r.confidence[6] == pytest.approx(0.65) and r.accuracy[6] == pytest.approx(0.5)
    assert np.isnan(r.accuracy[0]) and r.count[0] == 0
    # a confidence exactly on an edge belongs to the lower bin: (lo, hi]
    p = np.array([[0.3, 0.3, 0.4], [0.7, 0.2, 0.1]])
    r = S.reliability_diagram(p, [2, 0])
    assert r.count[3] == 1 and r.count[6] == 1  # 0.4 ∈ (0.3, 0.4], 0.7 ∈ (0.6, 0.7]


def test_ece_binary_vector_equals_two_column():
    rng = np.random.default_rng(10)
    p = rng.random(300)
    y = (rng.random(300) < p).astype(int)
    assert S.expected_calibration_error(p, y) == pytest.approx(
        S.expected_calibration_error(np.c_[1 - p, p], y))


def test_temperature_minimises_nll_and_binary_logits():
    rng = np.random.default_rng(11)
    logits = rng.normal(size=(400, 4)) * 3
    y = np.where(rng.random(400) < 0.6, logits.argmax(1), rng.integers(0, 4, 400))
    t = S.fit_temperature(logits, y)

    def nll(tt):
        z = logits / tt
        return np.mean(logsumexp(z, axis=1) - z[np.arange(400), y])

    assert nll(t) <= min(nll(t * 1.01), nll(t / 1.01))
    z1 = rng.normal(size=300) * 4
    y1 = (rng.random(300) < 1 / (1 + np.exp(-z1 / 2))).astype(int)  # true T = 2
    assert S.fit_temperature(z1, y1) == pytest.approx(
        S.fit_temperature(np.c_[np.zeros(300), z1], y1))
    assert 1.2 < S.fit_temperature(z1, y1) < 3.5


# --------------------------------------------------------------------------- degenerate inputs
def test_one_class_auc_raises_clearly():
    with pytest.raises(ValueError, match="one class"):
        S.delong_auc([1, 1, 1], [0.2, 0.3, 0.4])
    with pytest.raises(ValueError, match="one class"):
        S.bootstrap_ci([0, 0, 0], [0.2, 0.3, 0.4], "auc")
    with pytest.raises(ValueError, match="at least 2 positives"):
        S.delong_auc([1, 0, 0], [0.2, 0.3, 0.4])


def test_no_discordant_pairs_gives_p_one():
    for method in ("auto", "corrected", "uncorrected", "exact"):
        r = S.mcnemar(0, 0, method)
        assert r.pvalue == 1.0 and r.statistic == 0.0
    assert S.mcnemar(7, 7, "corrected").pvalue == 1.0  # |b − c| − 1 floored at 0


def test_empty_inputs_raise():
    with pytest.raises(ValueError, match="n = 0"):
        S.wilson_ci(0, 0)
    with pytest.raises(ValueError, match="n = 0"):
        S.bootstrap_ci([], [])
    with pytest.raises(ValueError, match="n = 0"):
        S.paired_bootstrap_ci([], [], [])
    with pytest.raises(ValueError, match="n = 0"):
        S.delong_auc([], [])
    with pytest.raises(ValueError, match="n = 0"):
        S.expected_calibration_error(np.zeros((0, 3)), [])
    with pytest.raises(ValueError, match="n = 0"):
        S.aggregate_seeds([])
    with pytest.raises(ValueError, match="n = 0"):
        S.discordant_counts([], [], [])
    with pytest.raises(ValueError, match="n = 0"):
        S.compare_predictions({"full": {"y_true": [], "y_pred": []},
                               "x": {"y_true": [], "y_pred": []}})


def test_identical_scores_auc_half_with_zero_variance():
    y = np.array([0, 1, 0, 1, 1, 0])
    r = S.delong_auc(y, np.full(6, 0.3))
    assert (r.auc, r.variance, r.low, r.high) == (0.5, 0.0, 0.5, 0.5)
    t = S.delong_test(y, np.full(6, 0.3), np.full(6, 0.7))
    assert (t.diff, t.z, t.pvalue) == (0.0, 0.0, 1.0)
    # Var(Δ) = 0 with Δ ≠ 0: DeLong undefined, said so
    with pytest.raises(ValueError, match="variance of the AUC difference is 0"):
        S.delong_test(y, y.astype(float), np.full(6, 0.3))


@pytest.mark.parametrize("call", [
    lambda: S.bootstrap_ci([0, 1, 1, 0, 1], [0, 1, 1, 0]),
    lambda: S.paired_bootstrap_ci([0, 1, 1, 0, 1], [0, 1, 1, 0, 1], [0, 1, 1, 0]),
    lambda: S.delong_auc([0, 1, 1, 0, 1], [0.1, 0.2, 0.3, 0.4]),
    lambda: S.delong_test([0, 1, 1, 0, 1], [.1, .2, .3, .4, .5], [.1, .2, .3, .4]),
    lambda: S.discordant_counts([0, 1, 1, 0, 1], [0, 1, 1, 0, 1], [0, 1, 1, 0]),
    lambda: S.expected_calibration_error(np.full((5, 2), 0.5), [0, 1, 1, 0]),
    lambda: S.fit_temperature(np.zeros((5, 2)), [0, 1, 1, 0]),
    lambda: S.equivalence_tost([0, 1, 1, 0, 1], [0, 1, 1, 0]),
])
def test_length_mismatch_names_both_lengths(call):
    with pytest.raises(ValueError, match=r"has 5 elements but .* has 4"):
        call()


def test_nan_scores_rejected():
    with pytest.raises(ValueError, match="NaN"):
        S.delong_auc([0, 1, 0, 1], [0.1, np.nan, 0.2, 0.3])


# --------------------------------------------------------------------------- decision rule
def _three_models(n=600, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    noise = rng.normal(size=n)
    full_s = 1 / (1 + np.exp(-(2.5 * (2 * y - 1) + noise)))
    bad_s = 1 / (1 + np.exp(-(0.5 * (2 * y - 1) + rng.normal(size=n))))
    full = (full_s > 0.5).astype(int)
    return y, {
        "full": {"y_true": y, "y_pred": full, "scores": full_s},
        "same": {"y_true": y, "y_pred": full.copy(), "scores": full_s.copy()},
        "bad": {"y_true": y, "y_pred": (bad_s > 0.5).astype(int), "scores": bad_s},
    }


CONTRACT_KEYS = {"a", "b", "metric", "diff", "ci95", "test", "p", "p_holm", "effect",
                 "noninferior", "claim"}


def test_compare_predictions_contract_and_decisions():
    _, preds = _three_models()
    out = S.compare_predictions(preds, n_resamples=500)
    assert [(c["a"], c["metric"]) for c in out] == [
        ("same", "accuracy"), ("same", "auc"), ("bad", "accuracy"), ("bad", "auc")]
    for c in out:
        assert CONTRACT_KEYS <= set(c) and c["b"] == "full"
        assert isinstance(c["ci95"], list) and len(c["ci95"]) == 2
        assert "cohens_h" in c["effect"]
        assert 0 <= c["p"] <= c["p_holm"] <= 1
    json.dumps(out)  # plain Python types only
    np.testing.assert_allclose([c["p_holm"] for c in out], S.holm([c["p"] for c in out]))
    same_acc, same_auc, bad_acc, bad_auc = out
    assert (same_acc["test"], same_auc["test"]) == ("mcnemar", "delong")
    assert same_acc["p"] == 1.0 and same_acc["diff"] == 0 and same_acc["claim"] == "none"
    assert same_acc["noninferior"] and same_auc["noninferior"]
    assert bad_acc["claim"] == bad_auc["claim"] == "degradation"
    assert not bad_acc["noninferior"]
    assert bad_acc["effect"]["cohens_h"] == pytest.approx(
        S.cohens_h(bad_acc["value_a"], bad_acc["value_b"]))
    assert bad_auc["effect"]["cohens_h"] is None


def test_compare_predictions_claim_needs_minimum_effect():
    _, preds = _three_models()
    big = S.compare_predictions(preds, n_resamples=200, min_effect={"accuracy": 0.99,
                                                                    "auc": 0.99})
    assert all(c["claim"] == "none" for c in big)


def test_compare_predictions_improvement_and_errors():
    _, preds = _three_models()
    out = S.compare_predictions(preds, reference="bad", n_resamples=200)
    assert {c["claim"] for c in out} == {"improvement"}
    with pytest.raises(ValueError, match="reference 'nope'"):
        S.compare_predictions(preds, reference="nope")
    preds["same"]["y_true"] = 1 - preds["same"]["y_true"]
    with pytest.raises(ValueError, match="different examples"):
        S.compare_predictions(preds)


def test_compare_predictions_multiclass_has_accuracy_only():
    rng = np.random.default_rng(1)
    y = rng.integers(0, 3, 100)
    probs = rng.dirichlet(np.ones(3), 100)
    preds = {lab: {"y_true": y, "y_pred": probs.argmax(1), "scores": probs}
             for lab in ("full", "x")}
    out = S.compare_predictions(preds, n_resamples=100)
    assert [c["metric"] for c in out] == ["accuracy"]


def test_compare_auc_falls_back_to_bootstrap_when_delong_undefined():
    y = np.array([0, 1] * 20)
    preds = {"full": {"y_true": y, "y_pred": y, "scores": y.astype(float)},
             "flat": {"y_true": y, "y_pred": np.zeros(40, int), "scores": np.full(40, 0.5)}}
    auc = S.compare_predictions(preds, n_resamples=300)[1]
    assert auc["test"] == "bootstrap" and auc["diff"] == pytest.approx(-0.5)
    assert auc["ci95"] == pytest.approx([-0.5, -0.5]) and auc["p"] < 0.01
