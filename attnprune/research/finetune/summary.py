"""The summary of ``attnprune finetune``'s finished runs (:func:`summarize`: means and CIs per
label, comparisons against ``full``, metrics.csv), its figures, and a figure across several
results folders (:func:`sweep_figure`)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np

from attnprune.measure import env_info
from attnprune.research.finetune.config import FinetuneConfig
from attnprune.research.finetune.model_io import FULL
from attnprune.runs.config import to_dict
from attnprune.runs.results import ResultsDir

__all__ = ["CI_METRICS", "HEADLINE", "RANGES", "figure_points", "summarize", "sweep_figure"]


# per task: the metrics with a mean and 95 % CI per method (bootstrap over test examples per
# seed, t-interval across seeds), and the headline one (the figure, the printed line)
CI_METRICS = {"classification": ("accuracy", "auc", "mcc"), "regression": ("pearson", "spearman")}
# each metric's range: its interval is cut to it (stats.aggregate_seeds' bounds; 2 seeds gave
# accuracy intervals such as [0.037, 1.118])
RANGES = {"accuracy": (0.0, 1.0), "auc": (0.0, 1.0), "mcc": (-1.0, 1.0), "pearson": (-1.0, 1.0),
          "spearman": (-1.0, 1.0)}
HEADLINE = {"classification": "accuracy", "regression": "pearson"}


def _task(results: ResultsDir) -> str:
    """The run's task, as loaded (data.json; older folders: classification)."""
    try:
        return results.read_json("data.json").get("task", "classification")
    except FileNotFoundError:
        return "classification"


def summarize(cfg: FinetuneConfig, results: ResultsDir) -> dict:
    """summary.json (DESIGN.md contract), metrics.csv and the accuracy-vs-FLOPs figure from the
    finished runs and saved predictions of ``results``.

    Classification: accuracy, AUC and MCC with 95 % CIs, macro F1; comparisons McNemar
    (accuracy), DeLong (AUC, binary) and a paired bootstrap (MCC). Regression: Pearson and
    Spearman with 95 % CIs, MSE; comparisons by paired bootstrap of Δr and Δρ. Holm over every
    comparison of a seed."""
    from attnprune.runs import stats
    task = _task(results)
    records = [json.loads(p.read_text()) for p in sorted((results.path / "runs").glob("*.json"))]
    rows, methods = [], {}
    by_label: dict[str, list[dict]] = {}
    for r in records:
        entries = [(r["label"], r["test"])]
        if "no_retrain" in r:
            entries.append((f"{r['label']}/no-retrain", r["no_retrain"]))
        if "int8" in r:
            entries.append((f"{r['label']}+int8", r["int8"]))
        if "reference" in r and r["reference"].get("what") is None:
            entries.append((FULL, {**r["reference"], "flops": {"relative": 1.0},
                                   "fair": {"flops_relative": 1.0, "time_relative": 1.0}}))
        for label, t in entries:
            by_label.setdefault(label, []).append({**t, "seed": r["seed"]})
            rows.append({"label": label, "seed": r["seed"],
                         **{m: t.get(m) for m in (*CI_METRICS[task], "f1_macro", "mse")
                            if m in t},
                         "kept_ratio": t.get("kept_ratio"),
                         "flops_relative": (t.get("flops") or {}).get("relative"),
                         "flops_proxy_relative": (t.get("flops") or {}).get("proxy_relative"),
                         "time_relative": (t.get("time") or {}).get("relative"),
                         "flops_relative_fair": (t.get("fair") or {}).get("flops_relative"),
                         "time_relative_fair": (t.get("fair") or {}).get("time_relative")})
    preds = _load_preds(results)
    for label, ts in by_label.items():
        seeds = sorted({t["seed"] for t in ts})
        ts = [next(t for t in ts if t["seed"] == s) for s in seeds]  # one per seed
        entry: dict = {"n_seeds": len(seeds)}
        for metric in CI_METRICS[task]:
            vals = [t.get(metric) for t in ts]
            if any(v is None for v in vals):
                continue
            cis = []
            for s in seeds:
                p = preds.get((label, s))
                x = None if p is None else (_pos(p.get("scores")) if metric == "auc"
                                            else p["y_pred"])
                try:
                    b = stats.bootstrap_ci(p["y_true"], x, metric, n_resamples=2000)
                    cis.append([b.low, b.high])
                except (TypeError, ValueError):  # no predictions, or undefined on the resamples
                    cis.append([float("nan")] * 2)
            try:
                entry[metric] = stats.aggregate_seeds(vals, cis, bounds=RANGES[metric])
            except ValueError:
                entry[metric] = {"mean": float(np.mean(vals)), "per_seed": vals}
        for metric in ("f1_macro", "mse"):
            if any(metric in t for t in ts):
                entry[metric] = _mean([t.get(metric) for t in ts])
        entry["kept_ratio"] = float(np.mean([t.get("kept_ratio", 1.0) for t in ts]))
        fl = [t.get("flops") or {} for t in ts]
        entry["flops"] = {k: _mean([f.get(k) for f in fl])
                          for k in ("measured", "relative", "proxy_relative")}
        tm = [t.get("time") for t in ts if t.get("time")]
        if tm:
            entry["time"] = {k: _mean([t.get(k) for t in tm]) for k in ("median_s", "mad_s", "relative")}
        # "relative": padded file-order test batches (the full model computes the padding a
        # pruned model's row bucketing drops); "relative_fair": length-sorted batches, no
        # padding for either (_fair), the saving of pruning alone
        fair = [t["fair"] for t in ts if t.get("fair")]
        if fair:
            entry["flops"]["relative_fair"] = _mean([f.get("flops_relative") for f in fair])
            entry.setdefault("time", {})["relative_fair"] = _mean([f.get("time_relative")
                                                                   for f in fair])
        methods[label] = entry
    comparisons, skipped = _comparisons(cfg.seeds, preds, task)
    summary = {"command": "finetune", "env": env_info(), "config": to_dict(cfg), "task": task,
               "methods": methods, "comparisons": comparisons}
    if skipped:
        summary["comparisons_skipped"] = skipped
    warnings = _one_class_warnings(preds, results) if task == "classification" else []
    if warnings:
        summary["warnings"] = warnings
    results.write_json("summary.json", summary)
    if rows:
        results.write_csv("metrics.csv", rows)
        _figure(methods, results, HEADLINE[task])
    return summary


def _one_class_warnings(preds: dict, results: ResultsDir) -> list[str]:
    """A line per (label, seed) whose test predictions are one class while the test rows hold
    several: the model learned only the majority class (MCC 0), whatever its accuracy says."""
    try:
        names = results.read_json("data.json").get("classes") or []
    except FileNotFoundError:
        names = []
    out = []
    for (label, seed), p in sorted(preds.items()):
        y, pred = np.asarray(p["y_true"]), np.asarray(p["y_pred"])
        if pred.size and len(np.unique(y)) > 1 and len(np.unique(pred)) == 1:
            c = int(pred[0])
            name = names[c] if c < len(names) else str(c)
            out.append(f"{label} (seed {seed}) predicts one class, {name!r}, for every test row "
                       f"(MCC 0; its score {float((pred == y).mean()):.4f} is that class's "
                       "share): it learned only the majority class; train longer (--epochs), on "
                       "more rows, or with another --lr")
    return out


def _comparisons(seeds, preds: dict, task: str) -> tuple[list[dict], list[str]]:
    """Every label against ``full`` on each seed's test examples, Holm over the seed's family.

    The metrics are :data:`attnprune.runs.stats.TASK_METRICS` of the task. A label whose metric is
    undefined (a regression model that predicts one constant) cannot be compared: it is left
    out with the reason, and the others are still compared."""
    from attnprune.runs import stats
    comparisons, skipped = [], []
    for s in seeds:
        group = {lab: p for (lab, seed), p in preds.items() if seed == s}
        if FULL not in group or len(group) < 2:
            continue
        rng = np.random.default_rng(s)  # one stream per seed, labels in order (as before)
        family = []
        for lab, p in group.items():
            if lab == FULL:
                continue
            try:
                family += stats.compare_predictions({FULL: group[FULL], lab: p}, reference=FULL,
                                                    n_resamples=5000, seed=rng, adjust=False,
                                                    metrics=stats.TASK_METRICS[task])
            except ValueError as e:
                skipped.append(f"{lab} vs {FULL} (seed {s}): {e}")
        stats.apply_decision_rule(family)
        comparisons += [{**c, "seed": s} for c in family]
    return comparisons, skipped


def _mean(vals):
    vals = [v for v in vals if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return float(np.mean(vals)) if vals else None


def _pos(scores):
    if scores is None:
        return None
    s = np.asarray(scores)
    return s[:, 1] if s.ndim == 2 and s.shape[1] == 2 else None


def _load_preds(results: ResultsDir) -> dict:
    out = {}
    for f in sorted((results.path / "predictions").glob("*.npz")):
        stem, _, seed = f.stem.rpartition("__seed")
        with np.load(f, allow_pickle=False) as z:
            out[(stem, int(seed))] = {k: z[k] for k in z.files}
    # labels were made file-safe by ResultsDir; map them back to the run labels
    return {(_unsafe(k, results), s): v for (k, s), v in out.items()}


def _unsafe(stem: str, results: ResultsDir) -> str:
    for p in (results.path / "runs").glob("*.json"):
        r = json.loads(p.read_text())
        for lab in (r["label"], f"{r['label']}/no-retrain", f"{r['label']}+int8", FULL):
            if results._key(lab) == stem:
                return lab
    return stem


def figure_points(methods: dict, metric: str = "accuracy") -> list[dict]:
    """The points of :func:`_figure`: per label, the relative FLOPs it is drawn at — the fair
    ratio (length-sorted batches, no padding) where recorded, as the report's verdict quotes
    it; else the padded one, marked ``fair: False`` (full is 1 in both) — and the metric's
    mean and CI."""
    out = []
    for label, e in sorted(methods.items()):
        fl = e.get("flops") or {}
        fair = fl.get("relative_fair")
        rel = fair if fair is not None else fl.get("relative")
        acc = e.get(metric, {})
        if rel is None or "mean" not in acc:
            continue
        out.append({"label": label, "flops_relative": rel,
                    "fair": fair is not None or label == FULL, "mean": acc["mean"],
                    "ci95": acc.get("ci95")})
    return out


def _figure(methods: dict, results: ResultsDir, metric: str = "accuracy") -> None:
    """``<metric>_vs_flops.png``: the headline metric (accuracy, or Pearson r of a regression)
    with its 95 % CI against measured relative FLOPs (fair, :func:`figure_points`), one point
    per label."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for p in figure_points(methods, metric):
        ci = p["ci95"]
        yerr = None if not ci or None in ci else [[p["mean"] - ci[0]], [ci[1] - p["mean"]]]
        label = p["label"] if p["fair"] else f"{p['label']} (padded batches)"
        ax.errorbar(p["flops_relative"], p["mean"], yerr=yerr, fmt="o", capsize=3, label=label,
                    mfc=None if p["fair"] else "none")
    ax.set_xlabel("measured FLOPs relative to the full model (length-sorted batches, no padding)")
    ax.set_ylabel(f"test {metric} (95 % CI)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, loc="lower right")
    results.save_figure(f"{metric}_vs_flops.png", fig)


def sweep_figure(folders: list[str | os.PathLike], out: str | os.PathLike) -> Path:
    """One accuracy-vs-measured-FLOPs figure (95 % CIs) from several finetune results folders
    (e.g. one per method of a ρ sweep), written atomically to the folder ``out`` as
    ``sweep_accuracy_vs_flops.png`` with the points in ``sweep.json``. Points come from each
    folder's summary.json; labels sharing a method are joined by a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points: dict[str, dict] = {}
    for f in folders:
        s = json.loads((Path(f) / "summary.json").read_text())
        trained = s.get("config", {}).get("epochs", 1) > 0
        for label, e in s["methods"].items():
            rel = (e.get("flops") or {}).get("relative")
            if rel is None or "mean" not in e.get("accuracy", {}):
                continue
            if label == FULL:
                group = FULL
            else:
                retrained = trained and "no-retrain" not in label
                opts = s.get("config", {}).get("method_options") or {}
                variant = f"[{opts['variant']}]" if "variant" in opts else ""
                head, _, tail = label.partition("@")  # "method", "ρ/L2[/schedule][/no-retrain]"
                where = tail.split("/", 1)[1].replace("/no-retrain", "") if "/" in tail else ""
                group = f"{head}{variant} {where} " + ("fine-tuned" if retrained else "no retrain")
            points[label if label not in points or label == FULL else f"{label} ({f})"] = {
                "group": group, "flops_relative": rel, **e["accuracy"]}
    fig, ax = plt.subplots(figsize=(7, 4.5))
    groups: dict[str, list] = {}
    for label, p in points.items():
        groups.setdefault(p["group"], []).append((p["flops_relative"], p["mean"], p.get("ci95"),
                                                  label))
    for key, pts in sorted(groups.items()):
        pts.sort()
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        err = [[y - (c[0] if c else y) for _, y, c, _ in pts], [(c[1] if c else y) - y for _, y, c, _ in pts]]
        ax.errorbar(xs, ys, yerr=err, fmt="-o" if len(pts) > 1 else "s", capsize=3, label=key)
    ax.set_xlabel("measured FLOPs relative to the full model (same test batches)")
    ax.set_ylabel("test accuracy (95 % bootstrap CI)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    res = ResultsDir(out)
    res.write_json("sweep.json", points)
    return res.save_figure("sweep_accuracy_vs_flops.png", fig)
