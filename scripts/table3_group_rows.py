"""Print the README table of the structured-sparsity Table 3 (group penalty + compaction) from a
cost sweep's ``summary.json``: one row per compacted setting, means over seeds with 95 % CIs.

    python scripts/table3_group_rows.py /work/runs/table3_group/summary.json
"""

from __future__ import annotations

import json
import sys


def ci(a: dict, fmt: str = "{:.3f}", scale: float = 1.0) -> str:
    """``mean [lo, hi]`` of an aggregate_seeds record."""
    lo, hi = a["ci95"]
    return (f"{fmt.format(a['mean'] * scale)} [{fmt.format(lo * scale)}, "
            f"{fmt.format(hi * scale)}]")


def rows(summary: dict) -> list[str]:
    """Markdown rows: λ = 0 dense, then every compacted setting in the sweep's order."""
    by_label: dict = {}
    for c in summary.get("comparisons", []):
        if c["metric"] == "accuracy":
            by_label.setdefault(c["a"], []).append(c)
    out = [("| λ | units removed % | FLOPs rel | latency rel | accuracy | MCC | Δacc (pp) | "
           "p Holm (max over seeds) |"), "|---|---|---|---|---|---|---|---|"]
    dense = summary["methods"].get("dense")
    if dense:
        out.append(f"| 0, uncompacted | 0 | 1.000 | 1.000 | {ci(dense['accuracy'])} | — | — | — |")
    for label, m in summary.get("compact", {}).items():
        cs = by_label.get(label, [])
        p = max(c["p_holm"] for c in cs) if cs else None
        d = m["delta_accuracy_vs_lam0"]
        out.append(f"| {m['lam']:g} | {ci(m['removed_fraction'], '{:.1f}', 100)} | "
                   f"{m['flops_relative_to_lam0']:.3f} | {ci(m['time_relative'])} | "
                   f"{ci(m['accuracy'])} | {m['mcc']:.3f} | "
                   f"{'—' if d is None else ci(d, '{:+.1f}', 100)} | "
                   f"{'—' if p is None else format(p, '.2g')} |")
    return out


def main(argv: list[str]) -> int:
    """CLI: the path of ``summary.json``."""
    if len(argv) != 1:
        print(__doc__)
        return 2
    with open(argv[0]) as f:
        print("\n".join(rows(json.load(f))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
