"""The figure of issue 25: retrieval accuracy and time to first token against the kept fraction,
attnprune's prefill pruning next to kvpress's presses, at each prompt length of a pooled
``scripts/kvpress_side_by_side.py pool`` folder:

    python scripts/plot_kvpress_2k.py docs/results/kvpress_2k

writes ``figure.png`` into that folder (one column per length: accuracy on top, TTFT relative to
the unpruned model of the same side below; error bars: the 95 % CI of the paired difference
from unpruned, added to the unpruned accuracy).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def plot(folder: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = json.loads((folder / "summary.json").read_text())["rows"]
    lengths = sorted({r["length"] for r in rows})
    methods = sorted({r["method"] for r in rows if r["method"] != "unpruned"})
    fig, axes = plt.subplots(2, len(lengths), figsize=(4.2 * len(lengths), 7), squeeze=False,
                             sharey="row")
    for j, L in enumerate(lengths):
        ax_acc, ax_t = axes[0][j], axes[1][j]
        for m in methods:
            pts = sorted((r for r in rows if r["length"] == L and r["method"] == m),
                         key=lambda r: r["kept"])
            if not pts:
                continue
            ours = pts[0]["side"] == "attnprune"
            style = {"marker": "o" if ours else "s", "linestyle": "-" if ours else "--"}
            x = [r["kept"] for r in pts]
            acc = [r["accuracy"] for r in pts]
            err = [[r["diff_vs_unpruned"] - r["diff_ci95"][0] for r in pts],
                   [r["diff_ci95"][1] - r["diff_vs_unpruned"] for r in pts]]
            label = f"{m} ({'attnprune' if ours else 'kvpress'})"
            ax_acc.errorbar(x, acc, yerr=err, capsize=3, label=label, **style)
            ax_t.plot(x, [r["ttft_ratio_cpu_median"] for r in pts], label=label, **style)
        ax_acc.set_title(f"{L}-token prompts")
        ax_t.axhline(1.0, color="grey", lw=0.8)
        ax_t.axhline(0.5, color="grey", lw=0.8, ls=":")
        ax_t.set_xlabel("kept fraction of the prompt")
        for ax in (ax_acc, ax_t):
            ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("passkey retrieval accuracy (3 seeds pooled)")
    axes[1][0].set_ylabel("time to first token / unpruned (CPU, median)")
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.suptitle("prefill pruning (attnprune) vs KV-cache presses (kvpress), tiny passkey Llama")
    fig.tight_layout()
    out = folder / "figure.png"
    fig.savefig(out, dpi=110)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__)
        raise SystemExit(2)
    print(plot(Path(sys.argv[1])))
