"""The synthetic generator (§3.1–3.2): rates, set membership, determinism, IDF weights."""

import numpy as np
import pytest

from attnprune.research.synthetic.data import DataSpec, idf_weights, make_dataset


@pytest.fixture(scope="module")
def data():
    return make_dataset(42)


def _within(rate, p, n, sigmas=4.0):
    return abs(rate - p) <= sigmas * np.sqrt(p * (1 - p) / n)


def test_shapes_and_splits(data):
    assert data.train.tokens.shape == (3000, 64) and data.val.tokens.shape == (800, 64)
    assert data.embeddings.shape == (500, 64) and data.embeddings.dtype == np.float32
    assert data.train.tokens.min() >= 0 and data.train.tokens.max() < 500
    assert set(np.unique(data.train.labels)) == {0, 1}


def test_signal_rate_count_and_membership(data):
    for split in (data.train, data.val):
        has = split.signal.any(1)
        assert _within(has.mean(), 0.6, len(split))
        counts = split.signal.sum(1)[has]
        assert counts.min() == 1 and counts.max() == 3
        # every signal position holds a token of the example's own class set
        rows, cols = np.nonzero(split.signal)
        own = data.signal_sets[split.labels[rows]]
        assert (own == split.tokens[rows, cols][:, None]).any(1).all()


def test_flip_rate_and_membership(data):
    for split in (data.train, data.val):
        has = split.flip.any(1)
        assert _within(has.mean(), 0.15, len(split))
        assert split.flip.sum(1).max() == 1
        assert not (split.flip & split.signal).any()  # a flip never overwrites a signal
        rows, cols = np.nonzero(split.flip)
        other = data.signal_sets[1 - split.labels[rows]]
        assert (other == split.tokens[rows, cols][:, None]).any(1).all()


def test_background_never_holds_signal_tokens(data):
    t = data.train
    in_sets = np.isin(t.tokens, data.signal_sets)
    assert np.array_equal(in_sets, t.signal | t.flip)


def test_sets_disjoint(data):
    assert len(np.intersect1d(data.signal_sets[0], data.signal_sets[1])) == 0


def test_deterministic_per_seed():
    a, b, c = make_dataset(7, DataSpec(n_train=50, n_val=20)), make_dataset(
        7, DataSpec(n_train=50, n_val=20)), make_dataset(8, DataSpec(n_train=50, n_val=20))
    for x, y in ((a.train, b.train), (a.val, b.val)):
        assert np.array_equal(x.tokens, y.tokens) and np.array_equal(x.signal, y.signal)
    assert np.array_equal(a.embeddings, b.embeddings)
    assert not np.array_equal(a.train.tokens, c.train.tokens)


@pytest.mark.parametrize("noise", [0.05, 0.45])
def test_noise_knob_sets_the_flip_rate(noise):
    d = make_dataset(1, DataSpec(n_train=4000, n_val=10, noise=noise))
    assert _within(d.train.flip.any(1).mean(), noise, 4000)


def test_embedding_scale(data):
    # E ~ N(0, 1/d): rows have norm ≈ 1
    assert abs(np.linalg.norm(data.embeddings, axis=1).mean() - 1.0) < 0.05


def test_idf_weights_range_and_signal_emphasis():
    d = make_dataset(3, DataSpec(idf=True))
    assert d.weights.min() == pytest.approx(0.5) and d.weights.max() == pytest.approx(1.5)
    # signal ids occur in fewer sequences than background ids, so they weigh more
    assert d.weights[d.signal_sets].mean() > d.weights.mean() + 0.2
    assert np.all(make_dataset(3).weights == 1.0)  # idf off: no scaling
    every_doc = np.tile(np.arange(3), (5, 1))  # each id in every sequence: constant IDF
    assert np.all(idf_weights(every_doc, 3) == 1.0)


def test_length_one_and_bad_specs():
    d = make_dataset(0, DataSpec(length=1, n_train=100, n_val=10, p_signal=1.0, noise=1.0))
    assert d.train.tokens.shape == (100, 1)
    assert d.train.signal.all() and not d.train.flip.any()  # no free slot left for a flip
    with pytest.raises(ValueError, match="length"):
        DataSpec(length=0)
    with pytest.raises(ValueError, match="p_signal"):
        DataSpec(p_signal=1.5)
    with pytest.raises(ValueError, match="vocab"):
        DataSpec(vocab=20)
