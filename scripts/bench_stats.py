"""Time the paired percentile bootstrap: B = 10,000 resamples of n = 800 examples.

    python scripts/bench_stats.py [--n 800] [--resamples 10000] [--repeats 7]

Prints the median and MAD (attnprune.measure.time_fn: warm-up discarded, thread count
recorded) for accuracy — the target is < 1 s on the 2-core CI machine — and, for reference,
for AUC.  Data are random labels and two models' predictions / scores, fixed seed.
"""

from __future__ import annotations

import argparse

import numpy as np

from attnprune.measure import time_fn
from attnprune.runs.stats import paired_bootstrap_ci


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=800)
    ap.add_argument("--resamples", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)

    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, args.n)
    pred_a = np.where(rng.random(args.n) < 0.90, y, 1 - y)
    pred_b = np.where(rng.random(args.n) < 0.88, y, 1 - y)
    score_a = rng.normal(size=args.n) + 2.0 * y
    score_b = rng.normal(size=args.n) + 1.5 * y

    for metric, a, b in [("accuracy", pred_a, pred_b), ("auc", score_a, score_b)]:
        t = time_fn(lambda a=a, b=b, metric=metric: paired_bootstrap_ci(
            y, a, b, metric, n_resamples=args.resamples, seed=1), repeats=args.repeats)
        print(f"paired bootstrap, {metric:8s} B={args.resamples} n={args.n}: "
              f"median {t.median_s:.3f} s (MAD {t.mad_s:.3f} s, {t.repeats} repeats, "
              f"{t.threads} threads)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
