"""Seed-paired differences between two synthetic results folders (e.g. bf16 vs fp32 training).

    python scripts/compare_runs.py DIR_A DIR_B

For every method in both ``summary.json`` files, the per-seed accuracy and AUC of A minus B,
as mean and 95 % t-interval over the seeds the two runs share (``attnprune.runs.stats``). The
difference is over training runs, so it measures how much the change moved the results
beyond seed-to-seed variation.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from attnprune.runs import stats


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    runs = []
    for d in argv:
        f = Path(d) / "summary.json"
        if not f.is_file():
            print(f"error: DIR: no summary.json in {d}", file=sys.stderr)
            return 2
        runs.append(json.loads(f.read_text()))
    a, b = runs
    seeds_a, seeds_b = a["config"]["seeds"], b["config"]["seeds"]
    shared = [s for s in seeds_a if s in seeds_b]
    if len(shared) < 2:
        print(f"error: seeds: the runs share {len(shared)} seed(s); need ≥ 2", file=sys.stderr)
        return 2
    print(f"A = {argv[0]}\nB = {argv[1]}\nA − B over seeds {shared} (mean, 95 % t-interval)")
    for m in a["methods"]:
        if m not in b["methods"]:
            continue
        cells = []
        for k in ("accuracy", "auc"):
            va = dict(zip(seeds_a, a["methods"][m][k]["per_seed"]))
            vb = dict(zip(seeds_b, b["methods"][m][k]["per_seed"]))
            g = stats.aggregate_seeds([va[s] - vb[s] for s in shared])
            lo, hi = g["ci95"]
            cells.append(f"{k} {g['mean']:+.4f} [{lo:+.4f}, {hi:+.4f}]")
        print(f"  {m:<18} " + "   ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
