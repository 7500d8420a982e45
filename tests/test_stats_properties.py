"""Property tests of attnprune.runs.stats (hypothesis; small example counts to stay fast)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnprune.runs import stats as S

FAST = settings(max_examples=40, deadline=None)


@st.composite
def paired_predictions(draw, min_n=4, max_n=60):
    """y_true and two models' predicted labels on the same binary examples."""
    n = draw(st.integers(min_n, max_n))
    seed = draw(st.integers(0, 2**32 - 1))
    acc_a, acc_b = draw(st.floats(0, 1)), draw(st.floats(0, 1))
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    a = np.where(rng.random(n) < acc_a, y, 1 - y)
    b = np.where(rng.random(n) < acc_b, y, 1 - y)
    return y, a, b


@st.composite
def scored(draw, min_n=8, max_n=60):
    """Binary labels (≥ 2 of each class) and two tie-prone score vectors."""
    n = draw(st.integers(min_n, max_n))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    y = rng.integers(0, 2, n)
    y[:4] = [0, 0, 1, 1]
    levels = draw(st.integers(2, 10))  # few levels → many ties
    sa = rng.integers(0, levels, n) + draw(st.floats(0, 3)) * y
    sb = rng.integers(0, levels, n) + draw(st.floats(0, 3)) * y
    return y, sa.astype(float), sb.astype(float)


# --------------------------------------------------------------------------- intervals
@FAST
@given(st.integers(1, 500), st.floats(0, 1))
def test_wilson_contains_estimate_and_narrows_with_n(n, frac):
    k = round(frac * n)
    ci = S.wilson_ci(k, n)
    assert 0 <= ci.low <= k / n <= ci.high <= 1
    big = S.wilson_ci(4 * k, 4 * n)  # same proportion, 4× the data
    assert big.high - big.low <= ci.high - ci.low


@FAST
@given(paired_predictions())
def test_bootstrap_ci_contains_estimate_and_narrows_with_n(data):
    y, a, _ = data
    r = S.bootstrap_ci(y, a, n_resamples=400, seed=0)
    assert r.low <= r.estimate <= r.high
    big = S.bootstrap_ci(np.tile(y, 4), np.tile(a, 4), n_resamples=400, seed=0)
    assert big.estimate == r.estimate
    assert big.high - big.low <= r.high - r.low + 1e-12


@FAST
@given(scored())
def test_delong_ci_contains_auc_and_narrows_with_n(data):
    y, s, _ = data
    r = S.delong_auc(y, s)
    assert 0 <= r.low <= r.auc <= r.high <= 1 and r.variance >= 0
    big = S.delong_auc(np.tile(y, 4), np.tile(s, 4))
    assert big.auc == pytest.approx(r.auc, abs=1e-12)
    assert big.variance <= r.variance + 1e-15


@FAST
@given(st.lists(st.floats(0, 1), min_size=2, max_size=10))
def test_seed_aggregate_contains_mean(values):
    out = S.aggregate_seeds(values)
    assert out["ci95"][0] <= out["mean"] + 1e-12 and out["mean"] <= out["ci95"][1] + 1e-12


# --------------------------------------------------------------------------- p-values
@FAST
@given(st.integers(0, 300), st.integers(0, 300),
       st.sampled_from(["auto", "corrected", "uncorrected", "exact"]))
def test_mcnemar_p_in_unit_interval_and_symmetric(b, c, method):
    r = S.mcnemar(b, c, method)
    assert 0 <= r.pvalue <= 1 and r.statistic >= 0
    assert S.mcnemar(c, b, method) == r


@FAST
@given(paired_predictions())
def test_paired_bootstrap_p_in_unit_interval(data):
    y, a, b = data
    r = S.paired_bootstrap_ci(y, a, b, n_resamples=300, seed=1)
    assert 0 < r.pvalue <= 1
    assert r.low <= r.estimate <= r.high


@FAST
@given(st.lists(st.floats(0, 1), min_size=1, max_size=30))
def test_holm_monotone_never_below_raw(p):
    p = np.array(p)
    adj = S.holm(p)
    assert np.all(adj >= p - 1e-15) and np.all(adj <= 1)
    order = np.argsort(p, kind="stable")
    assert np.all(np.diff(adj[order]) >= -1e-15)


# --------------------------------------------------------------------------- swapping A and B
@FAST
@given(paired_predictions())
def test_swapping_models_flips_signs_only_bootstrap(data):
    y, a, b = data
    ab = S.paired_bootstrap_ci(y, a, b, n_resamples=300, seed=5)
    ba = S.paired_bootstrap_ci(y, b, a, n_resamples=300, seed=5)
    assert ba.estimate == -ab.estimate
    np.testing.assert_allclose([ba.low, ba.high], [-ab.high, -ab.low], atol=1e-12)
    np.testing.assert_allclose(ba.se, ab.se, rtol=1e-9, atol=1e-15)
    assert ba.pvalue == ab.pvalue
    assert (ba.estimate_a, ba.estimate_b) == (ab.estimate_b, ab.estimate_a)


@FAST
@given(scored())
def test_swapping_models_flips_signs_only_delong(data):
    y, sa, sb = data
    try:
        ab = S.delong_test(y, sa, sb)
    except ValueError:  # Var(Δ) = 0 with Δ ≠ 0: undefined, and must be so both ways
        try:
            S.delong_test(y, sb, sa)
        except ValueError:
            return
        raise AssertionError("DeLong undefined one way but not the other") from None
    ba = S.delong_test(y, sb, sa)
    assert (ba.auc_a, ba.auc_b) == (ab.auc_b, ab.auc_a)
    assert ba.diff == -ab.diff and ba.z == -ab.z
    np.testing.assert_allclose([ba.variance, ba.pvalue], [ab.variance, ab.pvalue], rtol=1e-9)
    np.testing.assert_allclose([ba.low, ba.high], [-ab.high, -ab.low], atol=1e-12)
    assert 0 <= ab.pvalue <= 1


@FAST
@given(st.floats(0, 1), st.floats(0, 1))
def test_cohens_h_antisymmetric(p1, p2):
    assert S.cohens_h(p1, p2) == -S.cohens_h(p2, p1)


@settings(max_examples=15, deadline=None)
@given(paired_predictions(min_n=10))
def test_swapping_in_compare_predictions(data):
    y, a, b = data
    pa = {"A": {"y_true": y, "y_pred": a}, "B": {"y_true": y, "y_pred": b}}
    (ab,) = S.compare_predictions(pa, reference="B", n_resamples=200, seed=2)
    (ba,) = S.compare_predictions(pa, reference="A", n_resamples=200, seed=2)
    assert (ba["a"], ba["b"]) == (ab["b"], ab["a"])
    assert ba["diff"] == -ab["diff"]
    np.testing.assert_allclose(ba["ci95"], [-ab["ci95"][1], -ab["ci95"][0]], atol=1e-12)
    assert ba["effect"]["cohens_h"] == -ab["effect"]["cohens_h"]
    assert (ba["p"], ba["p_holm"], ba["test_variant"]) == (ab["p"], ab["p_holm"],
                                                           ab["test_variant"])
    flip = {"improvement": "degradation", "degradation": "improvement", "none": "none"}
    assert ba["claim"] == flip[ab["claim"]]
