"""Figures of the causal-LM track, like ``token_pruning_bert_to_gpt2.txt`` Figures 1–4.

    training_curves.png            train / val loss and val perplexity vs steps      (Fig. 1)
    effective_flops_vs_layers.png  cumulative effective FLOPs vs number of layers    (Fig. 2)
    flops_vs_length.png            full / effective / measured FLOPs vs length       (Fig. 3)
    perplexity_vs_length.png       perplexity vs sequence length                     (Fig. 4)

Fig. 2 of the paper varies the model depth; we have one trained model per run, so the x axis
is "the first n layers" of it: Σ_{l<n} FLOPs_l · kept_l beside the full Σ_{l<n} FLOPs_l.

:func:`write_figures` draws one run; :func:`compare_runs` (``python -m attnprune.research.lm_figures
RUN… [--reference RUN] --out DIR``) overlays several runs and writes their table (``lm_table.csv`` / ``.md``);
:func:`sweep_figure` and :func:`sweep_markdown` draw and tabulate an ``lm --sweep``
(perplexity change against the control vs measured FLOPs; kept ratio vs the swept option).
Plain matplotlib; every number comes from the runs' ``summary.json`` / ``history.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from attnprune.measure import effective_flops
from attnprune.runs.results import ResultsDir, make_run_dir

__all__ = ["compare_runs", "sweep_figure", "sweep_markdown", "table_rows", "write_figures"]


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _label_entry(summary: dict) -> tuple[str, dict]:
    label = next(k for k in summary["methods"] if k != "baseline")
    return label, summary["methods"][label]


def _curves(ax_loss, ax_ppl, history: list[dict], name: str) -> None:
    steps = [h["step"] for h in history]
    ax_loss.plot(steps, [h["train_loss"] for h in history], "--", label=f"{name} train")
    ax_loss.plot(steps, [h["val_loss"] for h in history], "-", label=f"{name} val")
    ax_ppl.plot(steps, [h["val_perplexity"] for h in history], "-", label=name)


def _depth(ax, entry: dict, name: str, full: bool) -> None:
    per = entry["flops"]["per_layer_full"]
    kept = entry.get("kept_per_layer") or [1.0] * len(per)
    n = list(range(1, len(per) + 1))
    cum_full = [sum(per[:i]) for i in n]
    cum_eff = [effective_flops(per[:i], kept[:i]) for i in n]
    if full:
        ax.plot(n, cum_full, "k-", label="full")
    ax.plot(n, cum_eff, "o-", label=name)


def write_figures(rd: ResultsDir, history: list[dict], summary: dict) -> list[Path]:
    """Draw the four figures of one run into its results folder."""
    plt = _plt()
    label, entry = _label_entry(summary)
    paths = []
    if history:
        fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
        _curves(a, b, history, label)
        a.set(xlabel="step", ylabel="loss (nats / token)", title="loss")
        b.set(xlabel="step", ylabel="perplexity", title="validation perplexity")
        a.legend()
        paths.append(rd.save_figure("training_curves.png", fig))
    if "per_layer_full" in entry.get("flops", {}):
        fig, ax = plt.subplots(figsize=(5, 3.6))
        _depth(ax, entry, label, full=True)
        ax.set(xlabel="number of layers", ylabel="FLOPs (layers only)", title="effective FLOPs vs depth")
        ax.legend()
        paths.append(rd.save_figure("effective_flops_vs_layers.png", fig))
    sweep = summary.get("length_sweep") or []
    if sweep:
        T = [r["length"] for r in sweep]
        fig, ax = plt.subplots(figsize=(5, 3.6))
        ax.plot(T, [r["flops_full"] for r in sweep], "k-", label="full (measured)")
        ax.plot(T, [r["flops_effective"] for r in sweep], "o-", label=f"{label} effective")
        ax.plot(T, [r["flops_measured"] for r in sweep], "x--", label=f"{label} measured")
        ax.set(xlabel="sequence length", ylabel="FLOPs per forward (batch 8)", title="FLOPs vs length")
        ax.legend()
        paths.append(rd.save_figure("flops_vs_length.png", fig))
        fig, ax = plt.subplots(figsize=(5, 3.6))
        ax.plot(T, [r["perplexity"] for r in sweep], "o-", label=label)
        ax.set(xlabel="sequence length", ylabel="validation perplexity", title="perplexity vs length")
        ax.legend()
        paths.append(rd.save_figure("perplexity_vs_length.png", fig))
    return paths


def table_rows(run_dirs: list[Path], reference: Path | None = None) -> list[dict]:
    """One row per run: label, options, perplexity (vs its ``--init`` baseline and, given
    ``reference``, vs that run: e.g. the unpruned model fine-tuned with the same schedule),
    kept ratio per layer, measured and effective FLOPs, wall time, tokens/s."""
    import yaml

    ref_ppl = None
    if reference is not None:
        ref = json.loads((Path(reference) / "summary.json").read_text())
        ref_ppl = _label_entry(ref)[1]["perplexity"]
    rows = []
    for d in run_dirs:
        s = json.loads((Path(d) / "summary.json").read_text())
        cfg = yaml.safe_load((Path(d) / "config.yaml").read_text())
        label, e = _label_entry(s)
        base = s["methods"].get("baseline", {})
        rows.append({
            "run": Path(d).name, "method": label, "options": cfg.get("method_options", ""),
            "perplexity": e["perplexity"], "baseline_perplexity": base.get("perplexity"),
            "perplexity_change_pct": (100 * (e["perplexity"] / base["perplexity"] - 1)) if base else None,
            "reference_perplexity": ref_ppl,
            "perplexity_vs_reference_pct": (100 * (e["perplexity"] / ref_ppl - 1)) if ref_ppl else None,
            "kept_per_layer": [round(k, 3) for k in (e.get("kept_per_layer") or [])],
            "flops_measured_relative": e["flops"]["relative"],
            "flops_effective_relative": e["flops"]["proxy_relative"],
            "time_relative": e["time"]["relative"],
            "tokens_per_s": e.get("tokens_per_s"),
            "gen_relative": (e.get("generation") or {}).get("relative"),
            "cache_consistent": (e.get("generation") or {}).get("cache_consistent"),
        })
    return rows


def _markdown(rows: list[dict]) -> str:
    cols = ["run", "method", "options", "perplexity", "perplexity_change_pct",
            "perplexity_vs_reference_pct", "kept_per_layer",
            "flops_measured_relative", "flops_effective_relative", "time_relative",
            "tokens_per_s", "gen_relative", "cache_consistent"]

    def fmt(v):
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def sweep_markdown(rows: list[dict], swept: list[str]) -> str:
    """The sweep's table: one row per point (means over seeds). "random drops ppl": the same
    model with the policy replaced by random drops at its per-layer kept ratios."""
    head = [*swept, "seeds", "kept ratio", "FLOPs rel. (measured)", "FLOPs rel. (effective)",
            "time rel.", "perplexity", "control ppl", "Δppl vs control", "p (Holm)",
            "random drops ppl"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lo, hi = r["perplexity_change_ci95"]
        cells = [*(str(r[k]) for k in swept), str(r["seeds"]), f"{r['kept_ratio']:.3f}",
                 f"{r['flops_relative']:.3f}", f"{r['flops_effective_relative']:.3f}",
                 f"{r['time_relative']:.2f}", f"{r['perplexity']:.3f}", f"{r['control_perplexity']:.3f}",
                 f"{r['perplexity_change_pct']:+.1f} % [{lo:+.1f}, {hi:+.1f}]", f"{r['p_holm']:.3g}",
                 "—" if r.get("random_policy_perplexity") is None else f"{r['random_policy_perplexity']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def sweep_figure(rd: ResultsDir, rows: list[dict], swept: list[str], method: str) -> Path:
    """``sweep.png``: Δ perplexity vs the control (95 % CI) against measured FLOPs, and the
    measured kept ratio against the first swept option."""
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    x = [r["flops_relative"] for r in rows]
    y = [r["perplexity_change_pct"] for r in rows]
    err = [[v - r["perplexity_change_ci95"][0] for v, r in zip(y, rows)],
           [r["perplexity_change_ci95"][1] - v for v, r in zip(y, rows)]]
    a.errorbar(x, y, yerr=err, fmt="o-", label=method)
    for xi, yi, r in zip(x, y, rows):
        a.annotate(", ".join(str(r[k]) for k in swept), (xi, yi), fontsize=7,
                   textcoords="offset points", xytext=(4, 4))
    a.axhline(0, color="k", lw=0.8, label="control")
    a.set(xlabel="measured FLOPs / full", ylabel="perplexity vs control (%)",
          title="perplexity change vs FLOPs")
    a.legend()
    k = swept[0]
    try:
        xs = [float(r[k]) for r in rows]
    except (TypeError, ValueError):  # a non-numeric option: one tick per point
        xs = list(range(len(rows)))
    b.plot(xs, [r["kept_ratio"] for r in rows], "o-", label="measured")
    if k == "keep_target":
        b.plot(xs, xs, "k:", label="target")
    b.set(xlabel=k, ylabel="kept ratio (all blocks)", title="kept ratio")
    b.legend()
    return rd.save_figure("sweep.png", fig)


def compare_runs(run_dirs: list[Path], out: Path, reference: Path | None = None) -> Path:
    """Overlay the runs' curves and write the comparison table; returns the folder."""
    plt = _plt()
    rd = ResultsDir(out)
    rows = table_rows(run_dirs, reference)
    rd.write_csv("lm_table.csv", rows)
    rd.write_text("lm_table.md", _markdown(rows))
    sums = [(Path(d), json.loads((Path(d) / "summary.json").read_text())) for d in run_dirs]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
    for d, s in sums:
        hist = json.loads((d / "history.json").read_text()) if (d / "history.json").is_file() else []
        if hist:
            _curves(a, b, hist, d.name)
    a.set(xlabel="step", ylabel="loss", title="loss")
    b.set(xlabel="step", ylabel="perplexity", title="validation perplexity")
    a.legend(fontsize=6)
    rd.save_figure("training_curves.png", fig)
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for i, (d, s) in enumerate(sums):
        _depth(ax, _label_entry(s)[1], d.name, full=i == 0)
    ax.set(xlabel="number of layers", ylabel="FLOPs (layers)", title="effective FLOPs vs depth")
    ax.legend(fontsize=6)
    rd.save_figure("effective_flops_vs_layers.png", fig)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
    for d, s in sums:
        sw = s.get("length_sweep") or []
        if sw:
            T = [r["length"] for r in sw]
            a.plot(T, [r["flops_effective"] / r["flops_full"] for r in sw], "o-", label=d.name)
            b.plot(T, [r["perplexity"] for r in sw], "o-", label=d.name)
    a.set(xlabel="sequence length", ylabel="effective / full FLOPs", title="effective FLOPs vs length")
    b.set(xlabel="sequence length", ylabel="perplexity", title="perplexity vs length")
    a.legend(fontsize=6)
    rd.save_figure("length_sweep.png", fig)
    rd.write_json("summary.json", {"command": "lm compare", "runs": rows})
    return rd.path


def main(argv: list[str]) -> int:
    """``python -m attnprune.research.lm_figures RUN_DIR… [--reference RUN_DIR] --out DIR``."""
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    out, reference = Path("results"), None
    dirs = []
    it = iter(argv)
    for a in it:
        if a == "--out":
            out = Path(next(it))
        elif a == "--reference":
            reference = Path(next(it))
        else:
            dirs.append(Path(a))
    missing = [str(d) for d in dirs if not (d / "summary.json").is_file()]
    if missing or not dirs:
        raise SystemExit(f"runs: no summary.json in {', '.join(missing) or '(no folders given)'}")
    path = compare_runs(dirs, make_run_dir(out, "lm-compare"), reference)
    print((path / "lm_table.md").read_text())
    print(f"results: {path}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
