"""Figures of the synthetic track (entropy paper Fig. 1–4 and App. D's file names), matplotlib Agg.

Each function reads the run records and ``summary.json``'s dict and saves one PNG through
:meth:`attnprune.runs.results.ResultsDir.save_figure` (atomic). Curves and bars show the mean over
seeds with the 95 % interval over seeds.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # files only, never a window (safe on CI and over SSH)
import matplotlib.pyplot as plt
import numpy as np

from attnprune.runs.results import ResultsDir

__all__ = ["make_figures"]


def _curves(records: list[dict], label: str, key: str) -> np.ndarray:
    """(seeds, epochs) array of one history column for the main runs of ``label``."""
    rows = [[h[key] for h in r["history"]] for r in records
            if r["group"] == "main" and r["label"] == label]
    return np.asarray(rows, dtype=float)


def _band(ax, x, arr, label, style="-"):
    """Mean curve with a band: ± 1 s.d. over 3 or more seeds; with 2 seeds the band runs
    between the two seeds' curves (their s.d. would be a guess from one difference)."""
    mean = np.nanmean(arr, axis=0)
    line, = ax.plot(x, mean, style, label=label)
    if arr.shape[0] == 2:
        ax.fill_between(x, np.nanmin(arr, axis=0), np.nanmax(arr, axis=0),
                        color=line.get_color(), alpha=0.15)
    elif arr.shape[0] > 2:
        sd = np.nanstd(arr, axis=0, ddof=1)
        ax.fill_between(x, mean - sd, mean + sd, color=line.get_color(), alpha=0.15)
    return line


def _history_figure(records, labels, keys, ylabel, title):
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for lab in labels:
        for key, style in keys:
            arr = _curves(records, lab, key)
            if arr.size:
                x = np.arange(1, arr.shape[1] + 1)
                _band(ax, x, arr, f"{lab} ({key.split('_')[0]})" if len(keys) > 1 else lab,
                      style)
    ax.set_xlabel("epoch")
    ax.set_ylabel(ylabel)
    n = max((_curves(records, lab, keys[0][0]).shape[0] for lab in labels), default=0)
    ax.set_title(title + (" (mean; band: the 2 seeds)" if n == 2
                          else " (mean ± 1 s.d. over seeds)"))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return fig


def _bar(summary, labels, metric, ylabel, title):
    fig, ax = plt.subplots(figsize=(6.4, 4))
    m = summary["methods"]
    if metric == "kept_tokens":
        vals = [m[lab]["kept_tokens"] for lab in labels]
        lo = hi = seeds = []
    else:
        vals = [m[lab][metric]["mean"] for lab in labels]
        lo = [m[lab][metric]["ci95"][0] for lab in labels]
        hi = [m[lab][metric]["ci95"][1] for lab in labels]
        seeds = [m[lab][metric].get("per_seed") or [] for lab in labels]
    ax.bar(range(len(labels)), vals, color="#4C72B0")
    ax.set_xticks(range(len(labels)), labels, rotation=25, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if metric != "kept_tokens":
        lo_all = min(v for v in vals if v is not None)
        ymin, ymax = max(0.0, lo_all - 0.1), min(1.0, max(vals) + 0.05)
        if all(len(s) == 2 for s in seeds):
            # 2 seeds: the two values as dots, no interval (t = 12.7 on 1 df)
            for i, s in enumerate(seeds):
                ax.plot([i, i], s, "o", color="#222", ms=4, zorder=3)
            ymin = max(0.0, min([ymin, *(x - 0.02 for s in seeds for x in s)]))
            ymax = min(1.0, max([ymax, *(x + 0.02 for s in seeds for x in s)]))
            ax.set_title(f"{title.split(' (')[0]} (n = 2 seeds: dots are the seeds)")
        elif None not in lo and None not in hi:
            # error bars clipped to the axis, so one wide interval cannot squash the others
            clo = [max(a, ymin) for a in lo]
            chi = [min(b, ymax) for b in hi]
            ax.errorbar(range(len(labels)), vals,
                        yerr=np.array([[v - a for v, a in zip(vals, clo, strict=True)],
                                       [b - v for v, b in zip(vals, chi, strict=True)]]),
                        fmt="none", ecolor="#222", capsize=4)
            if any(a < ymin for a in lo) or any(b > ymax for b in hi):
                ax.text(0.99, 0.01, "error bars clipped to the axis", transform=ax.transAxes,
                        ha="right", va="bottom", fontsize=7, color="#a00")
        ax.set_ylim(ymin, ymax)
    for i, v in enumerate(vals):
        ax.text(i, v, f"{v:.3f}" if metric != "kept_tokens" else f"{v:.1f}", ha="center",
                va="bottom", fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return fig


def _ablation_figure(ab: dict):
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.8))
    # (a) keep ratio
    ax = axes[0]
    cells = [c for c in ab["keep_ratio"] if c["method"] == "entropy" and c["accuracy"]["mean"]]
    x = [c["keep_ratio"] for c in cells]
    for metric, style in (("accuracy", "o-"), ("auc", "s--")):
        ax.plot(x, [c[metric]["mean"] for c in cells], style, label=f"entropy {metric}")
    full = [c for c in ab["keep_ratio"] if c["method"] == "full"]
    if full and full[0]["accuracy"]["mean"] is not None:
        ax.axhline(full[0]["accuracy"]["mean"], color="gray", ls=":", label="full accuracy")
        ax.axhline(full[0]["auc"]["mean"], color="gray", ls="-.", label="full AUC")
    ax.set_xlabel("keep ratio ρ")
    ax.set_title("keep ratio")
    ax.legend(fontsize=7)
    # (b) gate type
    ax = axes[1]
    gt = [c for c in ab["gate_type"] if c["accuracy"]["mean"] is not None]
    w = 0.35
    for j, metric in enumerate(("accuracy", "auc")):
        ax.bar(np.arange(len(gt)) + (j - 0.5) * w, [c[metric]["mean"] for c in gt], w,
               label=metric)
    ax.set_xticks(range(len(gt)), [f"{c['method']}\nkept {c['kept_ratio']:.2f}" for c in gt],
                  fontsize=7)
    ax.set_ylim(0.4, 1.0)
    ax.set_title("gate type: top-k vs threshold")
    ax.legend(fontsize=7)
    # (c) IDF
    ax = axes[2]
    idf = [c for c in ab["idf"] if c["auc"]["mean"] is not None]
    ax.bar(range(len(idf)), [c["auc"]["mean"] for c in idf], color="#55A868")
    ax.set_xticks(range(len(idf)), [f"{c['method']}\nIDF {'on' if c['idf'] else 'off'}"
                                    for c in idf], fontsize=7)
    ax.set_ylim(0.4, 1.0)
    ax.set_ylabel("AUC")
    ax.set_title("IDF-like scaling")
    # (d) noise stress
    ax = axes[3]
    ax2 = ax.twinx()
    for m in sorted({c["method"] for c in ab["noise"]}):
        cells = [c for c in ab["noise"] if c["method"] == m and c["auc"]["mean"] is not None]
        xs = [c["noise"] for c in cells]
        ax.plot(xs, [c["auc"]["mean"] for c in cells], "o-", label=f"{m} AUC")
        ov = [c["oracle_overlap"]["mean"] for c in cells]
        ax2.plot(xs, ov, "^:", label=f"{m} signal kept")
    ax.set_xlabel("flip rate")
    ax.set_ylabel("AUC")
    ax2.set_ylabel("share of signal positions kept")
    ax.set_title("noise stress")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=6)
    fig.suptitle(ab.get("note", ""), fontsize=8)
    fig.tight_layout()
    return fig


def _roc_figure(results: ResultsDir, labels):
    fig, ax = plt.subplots(figsize=(4.8, 4.5))
    for lab in labels:
        path = results.path / f"roc_{results._key(lab)}.npy"
        if path.is_file():
            fpr, tpr = np.load(path)
            ax.plot(fpr, tpr, lw=2 if lab == "entropy" else 1, label=lab)
    ax.plot([0, 1], [0, 1], "k:", lw=0.8)
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate")
    ax.set_title("ROC, validation pooled over seeds")
    ax.legend(fontsize=8)
    return fig


def _reliability_figure(summary, labels):
    rel = summary["reliability"]
    parts = [("classifier", lab) for lab in labels if rel.get(lab, {}).get("classifier")]
    gates = [("gate", lab) for lab in labels if rel.get(lab, {}).get("gate")]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for ax, items, title in ((axes[0], parts, "classifier"), (axes[1], gates,
                                                             "entropy head (per token)")):
        ax.plot([0, 1], [0, 1], "k:", lw=0.8)
        for part, lab in items:
            r = rel[lab][part]
            c = np.asarray(r["confidence"], float)
            a = np.asarray(r["accuracy"], float)
            ok = np.asarray(r["count"], float) > 0
            ece = summary["methods"][lab]["ece" if part == "classifier" else
                                          "gate_calibration"]
            e = ece["mean"] if part == "classifier" else ece["ece"]["mean"]
            ax.plot(c[ok], a[ok], "o-", ms=3, label=f"{lab} (ECE {e:.3f})")
        ax.set_xlim(0.45, 1.0)
        ax.set_ylim(0.0, 1.0)
        ax.set_xlabel("confidence (top label)")
        ax.set_ylabel("accuracy")
        ax.set_title(f"reliability: {title}")
        ax.legend(fontsize=7)
    return fig


def make_figures(results: ResultsDir, summary: dict, records: list[dict]) -> list[str]:
    """Write the eight figures of the synthetic track; returns their file names."""
    labels = list(summary["methods"])
    figs = {
        "loss_curves.png": _history_figure(records, labels, [("train_loss", "-"),
                                                             ("val_loss", "--")],
                                           "cross-entropy", "training / validation loss"),
        "val_accuracy.png": _history_figure(records, labels, [("val_accuracy", "-")],
                                            "accuracy", "validation accuracy"),
        "val_auc.png": _history_figure(records, labels, [("val_auc", "-")], "ROC-AUC",
                                       "validation AUC"),
        "bar_accuracy.png": _bar(summary, labels, "accuracy", "accuracy",
                                 "final validation accuracy (95 % CI over seeds)"),
        "bar_kept_tokens.png": _bar(summary, labels, "kept_tokens", "tokens kept for layer 2",
                                    "average kept tokens"),
        "roc_entropy.png": _roc_figure(results, labels),
        "reliability.png": _reliability_figure(summary, labels),
    }
    if summary.get("ablations"):
        figs["ablation.png"] = _ablation_figure(summary["ablations"])
    for name, fig in figs.items():
        results.save_figure(name, fig)
    return list(figs)
