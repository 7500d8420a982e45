"""Synthetic token sequences with class signals and distractors (entropy paper §3.1–§3.2, App. B).

Generator (``entropy_guided_token_pruning.txt`` §3.1), all drawn from one seeded NumPy
``Generator``, so a seed fixes the data:

* vocabulary ``V`` (500); two disjoint **signal sets** S_0, S_1 of ``n_signal_tokens`` (10) ids
  each, drawn at random from the vocabulary; the other V − 20 ids are background tokens;
* label y ~ Bernoulli(½); every position starts as a uniform background token;
* with probability ``p_signal`` (0.6) the example carries 1–3 (uniform) tokens of S_y at
  distinct random positions — the **true signal positions** returned with the data;
* with probability ``noise`` (0.15) one token of the *other* set S_{1−y} is written at a further
  free position: a **flip** (a distractor when S_y is present, a contradiction when it is
  not). The paper says "noise ≈ 0.15, including flips into the other class's signal range";
  background tokens are already pure noise, so the flip rate is the one knob, and it is the
  one the noise stress test (§8.3) sweeps.

The Bayes accuracy is well below 1 (40 % of examples carry no signal, 15 % carry a flip), about
0.75 at the defaults, which leaves room between methods.

Preprocessing (§3.2): a fixed random embedding table E ~ N(0, σ²) with σ = 1/√d (we read the
paper's "N(0, 1/√d)" as the standard deviation, so rows have norm ≈ 1), d = 64, and the
optional static IDF-like scaling X̃_i = w_i X_i with w ∈ [0.5, 1.5]: the smoothed IDF
log((1 + N)/(1 + df_t)) + 1 of the *training* split, mapped linearly onto [0.5, 1.5]. Rare
tokens (signal ids appear in ~6 % of sequences, background ids in ~12 %) get larger weights.

Notation: N examples, L sequence length, V vocabulary, d width, y label, S_c signal set of c.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["DataSpec", "Split", "SyntheticData", "idf_weights", "make_dataset", "random_embeddings"]


@dataclass(frozen=True)
class DataSpec:
    """Generator settings; defaults are the paper's (§3.1, App. B)."""

    n_train: int = 3000
    n_val: int = 800
    length: int = 64  # L
    vocab: int = 500  # V
    n_signal_tokens: int = 10  # |S_0| = |S_1|
    p_signal: float = 0.6
    max_signal: int = 3  # 1..max_signal signal tokens when present
    noise: float = 0.15  # flip rate: P(one token of the other class's set)
    d_model: int = 64  # d of the random embeddings
    idf: bool = False  # static IDF-like scaling w ∈ [0.5, 1.5]

    def __post_init__(self) -> None:
        for name in ("n_train", "n_val", "length", "n_signal_tokens", "max_signal", "d_model"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        if self.vocab < 2 * self.n_signal_tokens + 1:
            raise ValueError(
                f"vocab must be > 2·n_signal_tokens = {2 * self.n_signal_tokens} "
                f"(room for background tokens), got {self.vocab}"
            )
        for name in ("p_signal", "noise"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0 or math.isnan(v):
                raise ValueError(f"{name} must be in [0, 1], got {v}")


@dataclass(frozen=True)
class Split:
    """One split. ``signal`` marks the true signal positions (tokens of S_y), ``flip`` the
    tokens of the other class's set."""

    tokens: np.ndarray  # (N, L) int64
    labels: np.ndarray  # (N,) int64
    signal: np.ndarray  # (N, L) bool
    flip: np.ndarray  # (N, L) bool

    def __len__(self) -> int:
        return len(self.labels)


@dataclass(frozen=True)
class SyntheticData:
    """Both splits plus the preprocessing: embedding table and per-token weights."""

    spec: DataSpec
    seed: int
    train: Split
    val: Split
    signal_sets: np.ndarray  # (2, n_signal_tokens) int64: S_0, S_1
    embeddings: np.ndarray  # (V, d) float32, E ~ N(0, 1/d)
    weights: np.ndarray  # (V,) float32: IDF-like w ∈ [0.5, 1.5], or all ones when idf is off


def _make_split(rng: np.random.Generator, n: int, spec: DataSpec, sets: np.ndarray,
                background: np.ndarray) -> Split:
    L = spec.length
    y = rng.integers(0, 2, size=n)
    tokens = background[rng.integers(0, len(background), size=(n, L))]
    # A random permutation of positions per row (argsort of uniforms): the first slots take
    # the signal tokens, the next one the flip, so they never overwrite each other.
    order = np.argsort(rng.random((n, L)), axis=1)
    has_signal = rng.random(n) < spec.p_signal
    n_sig = np.where(has_signal, rng.integers(1, spec.max_signal + 1, size=n), 0)
    n_sig = np.minimum(n_sig, L)
    has_flip = (rng.random(n) < spec.noise) & (n_sig < L)  # no free slot left: no flip
    rows = np.arange(n)
    signal = np.zeros((n, L), dtype=bool)
    for j in range(min(spec.max_signal, L)):  # ≤ 3 iterations, vectorised over examples
        sel = n_sig > j
        pos = order[sel, j]
        tokens[rows[sel], pos] = sets[y[sel], rng.integers(0, sets.shape[1], size=sel.sum())]
        signal[rows[sel], pos] = True
    flip = np.zeros((n, L), dtype=bool)
    fpos = order[rows, np.minimum(n_sig, L - 1)]
    f_rows = rows[has_flip]
    tokens[f_rows, fpos[has_flip]] = sets[1 - y[has_flip],
                                          rng.integers(0, sets.shape[1], size=len(f_rows))]
    flip[f_rows, fpos[has_flip]] = True
    return Split(tokens.astype(np.int64), y.astype(np.int64), signal, flip)


def random_embeddings(rng: np.random.Generator, vocab: int, d: int) -> np.ndarray:
    """E ∈ R^{V×d}, E ~ N(0, σ²) with σ = 1/√d (§3.2), float32."""
    return (rng.standard_normal((vocab, d)) / math.sqrt(d)).astype(np.float32)


def idf_weights(tokens: np.ndarray, vocab: int) -> np.ndarray:
    """Static IDF-like weights w ∈ [0.5, 1.5] from document frequencies of ``tokens`` (N, L).

    Smoothed IDF log((1 + N)/(1 + df)) + 1 (scikit-learn's ``smooth_idf`` formula), mapped
    linearly onto [0.5, 1.5]; a constant IDF maps to 1.
    """
    n = len(tokens)
    present = np.zeros((n, vocab), dtype=bool)
    present[np.arange(n)[:, None], tokens] = True
    df = present.sum(axis=0)
    idf = np.log((1.0 + n) / (1.0 + df)) + 1.0
    span = idf.max() - idf.min()
    if span <= 0:
        return np.ones(vocab, dtype=np.float32)
    return (0.5 + (idf - idf.min()) / span).astype(np.float32)


def make_dataset(seed: int, spec: DataSpec | None = None) -> SyntheticData:
    """Generate train and validation splits plus embeddings, deterministically from ``seed``."""
    spec = spec or DataSpec()
    rng = np.random.default_rng(seed)
    perm = rng.permutation(spec.vocab)
    m = spec.n_signal_tokens
    sets = np.stack([perm[:m], perm[m:2 * m]]).astype(np.int64)
    background = np.sort(perm[2 * m:])
    train = _make_split(rng, spec.n_train, spec, sets, background)
    val = _make_split(rng, spec.n_val, spec, sets, background)
    emb = random_embeddings(rng, spec.vocab, spec.d_model)
    if spec.idf:
        w = idf_weights(train.tokens, spec.vocab)
    else:
        w = np.ones(spec.vocab, dtype=np.float32)
    return SyntheticData(spec, int(seed), train, val, sets, emb, w)
