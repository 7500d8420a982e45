"""``attnprune compare DIR [DIR ...]``: paired statistics between methods from saved predictions.

Predictions convention (**contract**; every command that evaluates a model writes it):

    <results folder>/predictions/<label>__seed<N>.npz

one file per (method label, seed), saved with ``np.savez`` and holding

- ``y_true`` (n,) int — the true labels, identical for every label at a given seed, in the
  same example order (paired tests need the same examples);
- ``y_pred`` (n,) int — the predicted labels;
- ``scores`` (optional) float — (n,) P(positive) for binary tasks, or (n, C) probabilities.

``<label>`` is the method label used in ``summary.json`` (e.g. ``full``, ``entropy-0.5``) and may
contain any character a file name allows except that the last ``__seed`` starts the seed.
A DIR may also be the ``predictions`` folder itself.

For every seed, each method is compared with the reference (``full`` unless ``--reference``)
on that seed's examples with :func:`attnprune.runs.stats.compare_predictions` — accuracy (McNemar +
paired bootstrap CI) and, for binary tasks with scores, AUC (DeLong).  Holm's correction runs
over the whole family (all methods × seeds × metrics), then the decision rule (Holm-adjusted
p below alpha and the difference at least the minimum effect) sets ``claim``.  With ≥ 2 seeds, the per-seed differences are also summarised (mean and t-interval
across seeds).  Predictions found in several DIRs are pooled; the same (label, seed) twice
with different contents is an error.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

from attnprune.runs import stats
from attnprune.runs.results import atomic_write_text

__all__ = ["compare_dirs", "format_table", "load_predictions", "main"]

_FILE = re.compile(r"^(?P<label>.+)__seed(?P<seed>-?\d+)\.npz$")

Predictions = dict[str, dict[int, dict[str, np.ndarray]]]  # label -> seed -> arrays


def load_predictions(directory: str | os.PathLike) -> Predictions:
    """Read ``<dir>/predictions/<label>__seed<N>.npz`` into ``{label: {seed: arrays}}``."""
    d = Path(directory)
    folder = d / "predictions" if (d / "predictions").is_dir() else d
    out: Predictions = {}
    for path in sorted(folder.glob("*.npz")):
        m = _FILE.match(path.name)
        if m is None:
            continue
        with np.load(path, allow_pickle=False) as z:
            missing = {"y_true", "y_pred"} - set(z.files)
            if missing:
                raise ValueError(f"{path}: missing arrays {sorted(missing)}")
            arrays = {k: z[k] for k in ("y_true", "y_pred", "scores") if k in z.files}
        if len(arrays["y_true"]) != len(arrays["y_pred"]):
            raise ValueError(f"{path}: y_true has {len(arrays['y_true'])} elements but y_pred "
                             f"has {len(arrays['y_pred'])}")
        out.setdefault(m["label"], {})[int(m["seed"])] = arrays
    if not out:
        raise FileNotFoundError(f"no <label>__seed<N>.npz prediction files in {folder}")
    return out


def _pool(dirs: list[str]) -> Predictions:
    pooled: Predictions = {}
    where: dict[tuple[str, int], str] = {}
    for d in dirs:
        for label, seeds in load_predictions(d).items():
            for seed, arrays in seeds.items():
                old = pooled.setdefault(label, {}).get(seed)
                if old is not None:
                    same = old.keys() == arrays.keys() and all(
                        np.array_equal(old[k], arrays[k]) for k in old)
                    if not same:
                        raise ValueError(f"label {label!r} seed {seed} is in {where[label, seed]} "
                                         f"and {d} with different predictions; rename one")
                    continue
                pooled[label][seed] = arrays
                where[label, seed] = d
    return pooled


def compare_dirs(
    dirs: list[str],
    reference: str = "full",
    *,
    alpha: float = 0.05,
    margin: float = 0.01,
    n_resamples: int = 10_000,
    seed: int = 0,
) -> dict[str, Any]:
    """Per-seed comparisons against ``reference`` (Holm over all) and across-seed summaries."""
    preds = _pool(dirs)
    if reference not in preds:
        raise ValueError(f"reference {reference!r} not found; labels: {sorted(preds)}")
    comparisons: list[dict[str, Any]] = []
    skipped: list[str] = []
    for s in sorted(preds[reference]):
        group = {lab: seeds[s] for lab, seeds in preds.items() if s in seeds}
        if len(group) < 2:
            continue
        # one child generator per seed: results do not depend on which other seeds exist
        rng = np.random.default_rng([seed, s & 0xFFFFFFFF])
        for c in stats.compare_predictions(group, reference, alpha=alpha, margin=margin,
                                           n_resamples=n_resamples, seed=rng, adjust=False):
            comparisons.append({**c, "seed": s})
    for lab, seeds in preds.items():
        missing = sorted(set(seeds) - set(preds[reference]))
        if lab != reference and missing:
            skipped.append(f"{lab}: seeds {missing} have no {reference!r} run")
    if not comparisons:
        raise ValueError(f"nothing to compare: no label shares a seed with {reference!r}")
    stats.apply_decision_rule(comparisons, alpha)
    return {"reference": reference, "alpha": alpha, "n_resamples": n_resamples,
            "comparisons": comparisons, "across_seeds": _across_seeds(comparisons),
            "skipped": skipped}


def _across_seeds(comparisons: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for c in comparisons:
        groups.setdefault((c["a"], c["b"], c["metric"]), []).append(c)
    out = []
    for (a, b, metric), cs in groups.items():
        if len(cs) < 2:
            continue
        agg = stats.aggregate_seeds([c["diff"] for c in cs])
        out.append({"a": a, "b": b, "metric": metric, "diff": agg,
                    "seeds": [c["seed"] for c in cs]})
    return out


def _num(x: float | None, digits: int = 4) -> str:
    return "-" if x is None else f"{x:+.{digits}f}"


def _ci(ci: list[float]) -> str:
    return f"[{ci[0]:+.4f}, {ci[1]:+.4f}]"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def format_table(result: dict[str, Any]) -> str:
    """Plain-text, column-aligned tables of the comparisons and the across-seed summaries."""
    header = ["a", "b", "seed", "metric", "value a", "value b", "diff", "ci95", "test", "p",
              "p_holm", "h", "noninf", "claim"]
    rows = [[c["a"], c["b"], str(c["seed"]), c["metric"], f"{c['value_a']:.4f}",
             f"{c['value_b']:.4f}", _num(c["diff"]), _ci(c["ci95"]),
             f"mcnemar-{c['test_variant']}" if c["test"] == "mcnemar" else c["test"],
             f"{c['p']:.3g}", f"{c['p_holm']:.3g}", _num(c["effect"]["cohens_h"], 3),
             "yes" if c["noninferior"] else "no", c["claim"]] for c in result["comparisons"]]
    text = [_table(header, rows)]
    if result["across_seeds"]:
        h2 = ["a", "b", "metric", "seeds", "mean diff", "ci95 across seeds (t)"]
        r2 = [[s["a"], s["b"], s["metric"], str(len(s["seeds"])), _num(s["diff"]["mean"]),
               _ci(s["diff"]["ci95"])] for s in result["across_seeds"]]
        text += ["", _table(h2, r2)]
    note = (f"diff = a − b; Holm over all {len(rows)} comparisons; claim needs p_holm < "
            f"{result['alpha']} and |diff| ≥ the minimum effect {dict(stats.DEFAULT_MIN_EFFECT)}")
    text += ["", note]
    text += [f"skipped: {s}" for s in result["skipped"]]
    return "\n".join(text)


def main(argv: list[str]) -> int:
    """Entry point: ``attnprune compare DIR [DIR ...] [--reference L] [--json FILE]``."""
    from attnprune.runs.config import plain

    # every option's default in --help; the docstring as plain text, its line breaks kept
    class Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
        pass

    ap = argparse.ArgumentParser(prog="attnprune compare", description=plain(__doc__),
                                 formatter_class=Formatter)
    ap.add_argument("dirs", nargs="+", metavar="DIR", help="results folders")
    ap.add_argument("--reference", default="full", help="label compared against")
    ap.add_argument("--alpha", type=float, default=0.05, help="significance level")
    ap.add_argument("--margin", type=float, default=0.01, help="non-inferiority margin δ")
    ap.add_argument("--n-resamples", type=int, default=10_000, help="bootstrap resamples")
    ap.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args(argv)
    try:
        result = compare_dirs(args.dirs, args.reference, alpha=args.alpha, margin=args.margin,
                              n_resamples=args.n_resamples, seed=args.seed)
    except (ValueError, FileNotFoundError) as e:
        print(f"attnprune compare: error: {e}", file=sys.stderr)
        return 1
    print(format_table(result))
    if args.json:
        atomic_write_text(args.json, json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
