"""The synthetic track's summary: per-method means and intervals over seeds, the paired
comparisons, the ablation cells, and the Table-2-like text table and CSV rows."""

from __future__ import annotations

import math

import numpy as np

from attnprune.research.synthetic.config import SyntheticConfig
from attnprune.research.synthetic.host import FULL
from attnprune.runs import stats
from attnprune.runs.results import ResultsDir

__all__ = ["UNIT", "ablation_summary", "aggregate", "comparisons_against", "csv_row", "find_run",
           "format_ci", "format_table", "method_summary", "paired_comparisons", "pool_reliability"]


def find_run(records: list[dict], method: str, seed: int, keep_ratio: float, noise: float,
             idf: bool) -> dict | None:
    """The record of ``method`` on ``seed`` at that keep ratio, noise and IDF setting, or None."""
    for r in records:
        if (r["method"], r["seed"], r["noise"], r["idf"]) == (method, seed, noise, idf) and (
                method == FULL or math.isclose(r["keep_ratio"], keep_ratio)):
            return r
    return None


# ----------------------------------------------------------------------------- aggregation
UNIT = (0.0, 1.0)  # the range of proportions, AUC and ECE


def aggregate(values: list[float], bounds: tuple[float, float] | None = None) -> dict:
    """Mean, 95 % t-interval over seeds (cut to ``bounds``, the metric's range: 2 seeds gave
    accuracy intervals like [0.037, 1.118]) and per-seed values; one seed → no interval."""
    v = [x for x in values if x is not None and not (isinstance(x, float) and math.isnan(x))]
    if not v:
        return {"mean": None, "ci95": [None, None], "per_seed": list(values)}
    if len(v) == 1:
        return {"mean": float(v[0]), "ci95": [None, None], "per_seed": list(values)}
    return stats.aggregate_seeds(v, bounds=bounds)


def pool_reliability(recs: list[dict], part: str) -> dict | None:
    bins = [r[part]["reliability"] for r in recs if part in r]
    if not bins:
        return None
    count = np.sum([np.asarray(b["count"], float) for b in bins], axis=0)
    def wmean(key):
        tot = np.sum([np.nan_to_num(np.asarray(b[key], float)) * np.asarray(b["count"], float)
                      for b in bins], axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(count > 0, tot / np.maximum(count, 1), np.nan)
    return {"confidence": wmean("confidence"), "accuracy": wmean("accuracy"), "count": count}


def method_summary(recs: list[dict], eff: dict | None) -> dict:
    def col(path):
        vals = []
        for r in recs:
            x = r
            for p in path.split("."):
                x = x.get(p) if isinstance(x, dict) else None
            vals.append(x)
        return vals

    s = {
        "accuracy": aggregate(col("accuracy"), UNIT),
        "auc": aggregate(col("auc"), UNIT),
        "seeds": [r["seed"] for r in recs],
        "kept_tokens": float(np.mean(col("kept"))),
        "kept_ratio": float(np.mean(col("kept_ratio"))),
        "oracle_overlap": aggregate(col("oracle_overlap"), UNIT),
        "flip_kept": aggregate(col("flip_kept")),
        "ece": aggregate(col("classifier.ece"), UNIT),
        "ece_heldout": aggregate(col("classifier.ece_heldout"), UNIT),
        "ece_heldout_temp": aggregate(col("classifier.ece_heldout_temp"), UNIT),
        "temperature": aggregate(col("classifier.temperature")),
        "val_loss": aggregate(col("val_loss")),
    }
    if any("signal_auc" in r for r in recs):
        s["signal_auc"] = aggregate(col("signal_auc"), UNIT)
    if any("gate" in r for r in recs):
        s["gate_calibration"] = {
            "ece": aggregate(col("gate.ece"), UNIT),
            "ece_heldout": aggregate(col("gate.ece_heldout"), UNIT),
            "ece_heldout_temp": aggregate(col("gate.ece_heldout_temp"), UNIT),
            "temperature": aggregate(col("gate.temperature")),
            "ece_signal_tokens": aggregate(col("gate.ece_signal_tokens"), UNIT),
        }
    if eff is not None:
        s["flops"] = {"measured": eff["flops_measured"], "relative": eff["flops_relative"],
                      "proxy": eff["flops_proxy"], "proxy_relative": eff["flops_proxy_relative"],
                      "proxy_savings": eff["flops_proxy_savings"]}
        s["latency_proxy"] = {"value": eff["latency_proxy"],
                              "relative": eff["latency_proxy_relative"],
                              "change_pct": eff["latency_proxy_change_pct"]}
        s["time"] = {"median_s": eff["time"]["median_s"], "mad_s": eff["time"]["mad_s"],
                     "relative": eff["time_relative"], "gate_share": eff["gate_share"]}
    return s


def paired_comparisons(results: ResultsDir, cfg: SyntheticConfig, main_labels: list[str]
                 ) -> tuple[list[dict], list[dict], dict]:
    """Paired comparisons of each main method against full: pooled over seeds (Holm over the
    family) and per seed (Holm over all per-seed tests together)."""
    def load(label, seed):
        z = np.load(results.path / "predictions" / f"{results._key(label)}__seed{seed}.npz")
        return {k: z[k] for k in z.files}

    per_seed_preds = {s: {m: load(m, s) for m in main_labels} for s in cfg.seeds}
    pooled = {m: {k: np.concatenate([per_seed_preds[s][m][k] for s in cfg.seeds])
                  for k in ("y_true", "y_pred", "scores")} for m in main_labels}
    comps = stats.compare_predictions(pooled, reference=FULL, margin=cfg.margin,
                                      n_resamples=cfg.n_resamples, seed=0)
    for c in comps:
        c["seeds"] = "pooled"
    per_seed: list[dict] = []
    for s in cfg.seeds:
        cs = stats.compare_predictions(per_seed_preds[s], reference=FULL, margin=cfg.margin,
                                       n_resamples=cfg.n_resamples, seed=s, adjust=False)
        for c in cs:
            c["seed"] = s
        per_seed += cs
    if per_seed:
        stats.apply_decision_rule(per_seed)
    return comps, per_seed, pooled


def comparisons_against(pooled: dict, reference: str, cfg: SyntheticConfig) -> list[dict]:
    """Pooled paired comparisons of every pruning method against another ``reference``
    (e.g. entropy vs attention_mass at the same budget); Holm within this family."""
    if reference not in pooled:
        return []
    preds = {m: p for m, p in pooled.items() if m != FULL}
    comps = stats.compare_predictions(preds, reference=reference, margin=cfg.margin,
                                      n_resamples=cfg.n_resamples, seed=1)
    for c in comps:
        c["seeds"] = "pooled"
    return comps


def ablation_summary(cfg: SyntheticConfig, records: list[dict]) -> dict:
    seeds = list(cfg.ablation_seeds)

    def cell(method, keep_ratio=None, noise=None, idf=None):
        rho = cfg.keep_ratio if keep_ratio is None else keep_ratio
        noise = cfg.noise if noise is None else noise
        idf = cfg.idf if idf is None else idf
        recs = [find_run(records, method, s, rho, noise, idf) for s in seeds]
        recs = [r for r in recs if r is not None]
        return {"method": method, "keep_ratio": rho if method != FULL else 1.0, "noise": noise,
                "idf": idf, "seeds": [r["seed"] for r in recs],
                "accuracy": aggregate([r["accuracy"] for r in recs]),
                "auc": aggregate([r["auc"] for r in recs]),
                "oracle_overlap": aggregate([r["oracle_overlap"] for r in recs]),
                "kept_ratio": float(np.mean([r["kept_ratio"] for r in recs])) if recs else None}

    gate_methods = [m for m in ("entropy", "entropy_threshold") if m in cfg.methods]
    return {
        "seeds": seeds,
        "note": f"ablations use seeds {seeds} (the main table uses {list(cfg.seeds)})",
        "keep_ratio": [cell("entropy", keep_ratio=r) for r in cfg.ablation_keep_ratios]
        + [cell(FULL)],
        "gate_type": [cell(m) for m in gate_methods],
        "idf": [cell(m, idf=i) for m in cfg.ablation_idf_methods for i in (False, True)],
        "noise": [cell(m, noise=n) for m in cfg.ablation_noise_methods
                  for n in cfg.ablation_noise],
    }


def format_ci(d: dict | None, digits: int = 3) -> str:
    """mean ± half-width of the 95 % CI over seeds; with 2 seeds the two values ("0.620/0.535"):
    a t-interval on 1 df (t = 12.7) is wider than the metric's range and implies a precision
    two seeds cannot give."""
    if not d or d.get("mean") is None:
        return "—"
    per = d.get("per_seed") or []
    if len(per) == 2 and None not in per:
        return "/".join(f"{x:.{digits}f}" for x in per)
    lo, hi = d["ci95"]
    if lo is None:
        return f"{d['mean']:.{digits}f}"
    return f"{d['mean']:.{digits}f} ± {(hi - lo) / 2:.{digits}f}"


def format_table(summary: dict) -> str:
    """The Table-2-like text table: mean ± half-width of the 95 % CI over seeds."""
    seeds = summary["config"]["seeds"]
    head = (f"{'method':<18} {'accuracy':>15} {'AUC':>15} {'kept':>5} {'FLOPs proxy':>11} "
            f"{'FLOPs meas.':>11} {'latency proxy':>13} {'wall time':>9} {'gate':>5} "
            f"{'signal kept':>15} {'ECE':>15}")
    precision = summary["config"].get("precision_used") or summary["config"].get("precision", "fp32")
    spread = ("the 2 seeds' values a/b, no interval" if len(seeds) == 2
              else "mean ± 95 % CI half-width over seeds")
    title = (f"Synthetic validation (n = {len(seeds)} seeds {seeds}; training precision "
             f"{precision}; {spread}; relative = vs full, same process)")
    lines = [title, head, "-" * len(head)]
    for lab, m in summary["methods"].items():
        fl = m.get("flops", {})
        tm = m.get("time", {})
        lp = m.get("latency_proxy", {})
        share = tm.get("gate_share")
        lines.append(
            f"{lab:<18} {format_ci(m['accuracy']):>15} {format_ci(m['auc']):>15} {m['kept_tokens']:>5.1f} "
            f"{fl.get('proxy_relative', float('nan')):>10.3f}× {fl.get('relative', float('nan')):>10.3f}× "
            f"{lp.get('relative', float('nan')):>12.3f}× {tm.get('relative', float('nan')):>8.2f}× "
            f"{'' if share is None else f'{100 * share:.0f}%':>5} "
            f"{format_ci(m['oracle_overlap']):>15} {format_ci(m['ece']):>15}")
    comps = [c for c in summary.get("comparisons") or [] if c["metric"] == "accuracy"]
    if comps:
        lines.append("")
        lines.append("vs full, pooled over seeds (paired; McNemar p Holm-adjusted; "
                     f"non-inferiority margin {comps[0]['margin']}):")
        for c in summary["comparisons"]:
            lines.append(
                f"  {c['a']:<18} {c['metric']:<8} Δ = {c['diff']:+.4f} "
                f"[{c['ci95'][0]:+.4f}, {c['ci95'][1]:+.4f}]  {c['test']:<9} "
                f"p_holm = {c['p_holm']:.3g}  non-inferior: {'yes' if c['noninferior'] else 'no'}")
    vs_am = [c for c in summary.get("comparisons_vs_attention_mass") or []
             if c["a"].startswith("entropy")]
    if vs_am:
        lines.append("")
        lines.append("vs attention_mass (same budget), pooled over seeds:")
        for c in vs_am:
            lines.append(
                f"  {c['a']:<18} {c['metric']:<8} Δ = {c['diff']:+.4f} "
                f"[{c['ci95'][0]:+.4f}, {c['ci95'][1]:+.4f}]  {c['test']:<9} "
                f"p_holm = {c['p_holm']:.3g}")
    lines.append("")
    lines.append("Calibration (ECE, 10 bins; temperature T fitted on the first half of each "
                 "validation set, ECE on the second half before → after):")
    for lab, m in summary["methods"].items():
        line = (f"  {lab:<18} classifier ECE {format_ci(m['ece'])}  held-out "
                f"{format_ci(m['ece_heldout'])} → {format_ci(m['ece_heldout_temp'])}  T {format_ci(m['temperature'], 2)}")
        g = m.get("gate_calibration")
        if g:
            line += (f" | entropy head ECE {format_ci(g['ece'])} (signal tokens "
                     f"{format_ci(g['ece_signal_tokens'])}) → {format_ci(g['ece_heldout_temp'])} after T "
                     f"{format_ci(g['temperature'], 2)}; signal-ranking AUC {format_ci(m.get('signal_auc'))}")
        lines.append(line)
    ab = summary.get("ablations")
    if ab:
        lines.append("")
        lines.append(f"Ablations ({ab['note']}):")
        for group in ("keep_ratio", "gate_type", "idf", "noise"):
            for c in ab[group]:
                lines.append(
                    f"  {group:<10} {c['method']:<18} ρ={c['keep_ratio']:<4g} "
                    f"noise={c['noise']:<5g} idf={'on ' if c['idf'] else 'off'} "
                    f"acc {format_ci(c['accuracy'])}  AUC {format_ci(c['auc'])}  "
                    f"signal kept {format_ci(c['oracle_overlap'])}  kept {c['kept_ratio'] or 0:.2f}")
    return "\n".join(lines)


def csv_row(r: dict) -> dict:
    row = {k: r[k] for k in ("label", "group", "method", "seed", "keep_ratio", "noise", "idf",
                             "accuracy", "auc", "val_loss", "kept", "kept_ratio",
                             "oracle_overlap", "flip_kept")}
    row["signal_auc"] = r.get("signal_auc")
    row["ece"] = r["classifier"]["ece"]
    row["temperature"] = r["classifier"].get("temperature")
    row["gate_ece"] = r["gate"]["ece"] if "gate" in r else None
    row["seconds"] = r["seconds"]
    row["cpu_seconds"] = r.get("cpu_seconds")
    return row
