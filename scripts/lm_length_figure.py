"""The token-pruning paper's length figures (FLOPs and perplexity vs sequence length) from
``attnprune bench lm --lengths …`` results, one group of seeds per method.

    attnprune bench lm --run SWEEP/keep_target=0.6-s0 --lengths 32,64,128 --windows 64 \\
        --batch-size 8 --gen-tokens 0 --threads 1 --repeats 3 --out B/dtr-s0 --exact-out
    attnprune bench lm --run SWEEP/control-s0 … --out B/control-s0     # the unpruned controls
    python scripts/lm_length_figure.py --out FIGDIR \
        "DTR=B/dtr-s0,B/dtr-s1,B/dtr-s2|B/control-s0,B/control-s1,B/control-s2" "hybrid=…"

Per method and length: mean and 95 % t-interval over the seeds of the measured and effective
FLOPs, the wall time (pruned / the same weights with pruning off, interleaved) and the
perplexity change of the pruned model against its seed's unpruned control (the folders after
``|``, in the same seed order; without them, against the same weights with pruning off, which
flatters nothing but also means little when the weights were trained to be pruned). Writes ``length_figures.png`` and
``length_table.md`` into FIGDIR and prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from attnprune.runs.results import ResultsDir

KEYS = (("flops_relative", "measured FLOPs"), ("flops_effective_relative", "effective FLOPs"),
        ("time_relative", "wall time"), ("ppl_change", "perplexity change (%)"),
        ("perplexity_pruned", "perplexity"))


def _load(bench_dir: Path) -> list[dict]:
    summary = json.loads((bench_dir / "summary.json").read_text())
    return next(iter(summary["methods"].values()))["rows"]


def _rows(bench_dir: Path, control: Path | None) -> list[dict]:
    rows = _load(bench_dir)
    ref = {r["length"]: r["perplexity_full"] for r in (_load(control) if control else rows)}
    for r in rows:
        if r["length"] not in ref:
            raise SystemExit(f"{control}: no length {r['length']} (bench it with the same --lengths)")
        r["ppl_change"] = 100 * (r["perplexity_pruned"] / ref[r["length"]] - 1)
    return rows


def _mean_ci(x) -> tuple[float, float]:
    x = np.asarray(x, float)
    if len(x) < 2:
        return float(x.mean()), float("nan")
    return float(x.mean()), float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("groups", nargs="+",
                    help="LABEL=DIR,DIR,…[|CONTROL,CONTROL,…] (one bench lm folder per seed)")
    ap.add_argument("--out", required=True, type=Path)
    a = ap.parse_args(argv)
    table = {}  # label → length → key → (mean, half-width)
    for g in a.groups:
        if "=" not in g:
            raise SystemExit(f"groups: expected LABEL=DIR,DIR,…, got {g!r}")
        label, dirs = g.split("=", 1)
        dirs, _, ctl = dirs.partition("|")
        runs, ctls = dirs.split(","), (ctl.split(",") if ctl else [])
        if ctls and len(ctls) != len(runs):
            raise SystemExit(f"{label}: {len(runs)} runs but {len(ctls)} controls")
        per_seed = [_rows(Path(d), Path(c) if c else None) for d, c in zip(runs, ctls or [""] * len(runs))]
        lengths = sorted({r["length"] for rows in per_seed for r in rows})
        table[label] = {T: {k: _mean_ci([r[k] for rows in per_seed for r in rows if r["length"] == T])
                            for k, _ in KEYS} for T in lengths}
        table[label]["n"] = len(per_seed)
    lines = ["| method | seeds | length | " + " | ".join(n for _, n in KEYS) + " |",
             "|---|---|---|" + "---|" * len(KEYS)]
    for label, by_t in table.items():
        for T, v in by_t.items():
            if T == "n":
                continue
            cells = [f"{m:+.1f} ± {h:.1f}" if k == "ppl_change" else f"{m:.3f} ± {h:.3f}"
                     for k, _ in KEYS for m, h in [v[k]]]
            lines.append(f"| {label} | {by_t['n']} | {T} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for label, by_t in table.items():
        T = [t for t in by_t if t != "n"]
        for ax, key in zip(axes, ("flops_relative", "time_relative", "ppl_change")):
            m = np.array([by_t[t][key][0] for t in T])
            h = np.nan_to_num(np.array([by_t[t][key][1] for t in T]))
            ax.plot(T, m, "o-", label=label)
            ax.fill_between(T, m - h, m + h, alpha=0.2)
        axes[0].plot(T, [by_t[t]["flops_effective_relative"][0] for t in T], "x:", color="grey")
    axes[0].set(xlabel="sequence length", ylabel="pruned / full", title="measured FLOPs (x: effective)")
    axes[1].set(xlabel="sequence length", ylabel="pruned / full", title="wall time, batch 8, 1 thread")
    axes[2].set(xlabel="sequence length", ylabel="%", title="perplexity change vs the control")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    rd = ResultsDir(a.out)  # atomic writes
    rd.save_figure("length_figures.png", fig)
    rd.write_text("length_table.md", text)
    print(f"figure: {a.out / 'length_figures.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
