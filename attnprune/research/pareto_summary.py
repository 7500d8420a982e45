"""Phase 3 of ``attnprune pareto``: the summary of the trained and timed points
(:func:`summarize`): accuracy per point with its CI over seeds, paired comparisons against full
and the nearest layer-drop points (Holm), the front and the bar's verdict, and the table and
figure (pareto.csv / .md / .png)."""

from __future__ import annotations

import math

import numpy as np

from attnprune.measure import env_info
from attnprune.research.pareto_config import FULL, INT8, ParetoConfig
from attnprune.runs.config import to_dict
from attnprune.runs.results import ResultsDir

__all__ = ["summarize"]


def _paired(preds: dict, a: str, b: str, seeds: list[int], n_resamples: int = 10_000,
            rng_seed: int = 0) -> dict | None:
    """Δ accuracy a − b over the seeds both have: bootstrap CI over examples of the
    seed-averaged correctness difference, t-interval over per-seed differences, and the
    McNemar test on discordant pairs summed over seeds (Mantel–Haenszel for matched pairs)."""
    from scipy import stats as sps

    from attnprune.runs.stats import mcnemar

    common = [s for s in seeds if (a, s) in preds and (b, s) in preds]
    if not common:
        return None
    y = preds[(a, common[0])]["y_true"]
    ca = np.stack([preds[(a, s)]["y_pred"] == y for s in common]).astype(float)
    cb = np.stack([preds[(b, s)]["y_pred"] == y for s in common]).astype(float)
    d = (ca - cb).mean(0)  # (n,) per-example, seed-averaged
    rng = np.random.default_rng(rng_seed)
    idx = rng.integers(0, d.size, size=(n_resamples, d.size))
    boot = d[idx].mean(1)
    per_seed = (ca - cb).mean(1)
    out = {"a": a, "b": b, "diff": float(d.mean()), "ci95": [float(q) for q in np.quantile(boot, [0.025, 0.975])],
           "per_seed": per_seed.tolist(), "seeds": common,
           "mcnemar": None}
    if len(common) > 1:
        half = sps.t.ppf(0.975, len(common) - 1) * per_seed.std(ddof=1) / math.sqrt(len(common))
        out["seed_t_ci95"] = [float(per_seed.mean() - half), float(per_seed.mean() + half)]
    nb = int(((ca == 1) & (cb == 0)).sum())
    nc = int(((ca == 0) & (cb == 1)).sum())
    t = mcnemar(nb, nc, "auto")
    out.update(p=float(t.pvalue), discordant=[nb, nc], test=f"mcnemar ({t.method}), "
               "discordant pairs summed over seeds")
    return out


def summarize(cfg: ParetoConfig, results: ResultsDir) -> dict:
    """summary.json, pareto.csv / .md / .png from the runs, predictions and timing.json."""
    from attnprune.runs.stats import aggregate_seeds, holm

    preds = {}
    for f in sorted((results.path / "predictions").glob("*.npz")):
        stem, _, seed = f.stem.rpartition("__seed")
        with np.load(f, allow_pickle=False) as z:
            preds[(stem, int(seed))] = {k: z[k] for k in z.files}
    key = ResultsDir._key
    labels = []
    for p in cfg.points():
        labels.append(p["label"])
        if cfg.int8:
            labels.append(p["label"] + INT8)
    timing = results.read_json("timing.json") if (results.path / "timing.json").is_file() else None
    points: dict = {}
    for label in labels:
        seeds = [s for s in cfg.seeds if (key(label), s) in preds]
        if not seeds:
            continue
        accs = [float((preds[(key(label), s)]["y_pred"] == preds[(key(label), s)]["y_true"]).mean())
                for s in seeds]
        e: dict = {"n_seeds": len(seeds), "seeds": seeds, "int8": label.endswith(INT8),
                   "family": _family(label)}
        e["accuracy"] = ({"mean": accs[0], "per_seed": accs, "ci95": None} if len(accs) == 1
                         else aggregate_seeds(accs))
        if timing is not None:
            for bs, per in timing["batch_sizes"].items():
                for order, rows in per.items():
                    if label in rows:
                        e.setdefault("time", {}).setdefault(bs, {})[order] = rows[label]["time_relative"]
                        if order == "fair":
                            e.setdefault("flops_relative", {})[bs] = rows[label]["flops_relative"]
                            e.setdefault("kept_ratio", rows[label]["kept_ratio"])
        points[label] = e
    kp = {(lab, s): preds[(key(lab), s)] for lab in points for s in points[lab]["seeds"]}
    comparisons = []
    big = str(max(cfg.timing_batch_sizes))
    for label, e in points.items():
        if label == FULL:
            continue
        c = _paired(kp, label, FULL, cfg.seeds)
        if c is not None:  # one dict: Holm's p below reaches the point's record too
            c["against"] = "full"
            comparisons.append(c)
            e["vs_full"] = c
        lat = _lat(e, big)
        if e["family"] != "layer-drop" and lat is not None:
            near = _nearest_layer_drop(points, lat, e["int8"], big)
            if near is not None:
                c = _paired(kp, label, near, cfg.seeds)
                if c is not None:
                    c["against"] = "nearest-latency layer-drop"
                    comparisons.append(c)
                    e["vs_layer_drop"] = c
            below = _layer_drops_at_or_below(points, lat, big)
            if below:  # the fastest competitor that is no slower: the one the front must beat
                c = _paired(kp, label, below[0], cfg.seeds)
                if c is not None:
                    c["against"] = "nearest layer-drop at equal or lower latency"
                    comparisons.append(c)
                    e["vs_layer_drop_le"] = c
    twins = _drop_twins(cfg)
    for label, e in points.items():  # a merging point against the same point dropping
        q = INT8 if e["int8"] else ""
        twin = twins.get(label.removesuffix(INT8))
        if twin is None or twin + q not in points:
            continue
        c = _paired(kp, label, twin + q, cfg.seeds)
        if c is not None:
            c["against"] = "the same point dropping"
            c["noninferior"] = c["ci95"][0] > -cfg.margin
            comparisons.append(c)
            e["vs_drop"] = c
    ps = [c["p"] for c in comparisons]
    if ps:
        for c, ph in zip(comparisons, holm(ps), strict=True):
            c["p_holm"] = float(ph)
    # the bar
    full_lat = 1.0
    for label, e in points.items():
        if e["family"] in ("full", "layer-drop") or "vs_full" not in e:
            continue
        lat = _lat(e, big)
        if lat is None:
            continue
        slower_ld = _layer_drops_at_or_below(points, lat, big)
        beats = all(e["accuracy"]["mean"] > points[lab]["accuracy"]["mean"] for lab in slower_ld)
        # the issue's stronger form: the pooled paired Δ's CI excludes 0 against every one of
        # them (± int8), not only the means; Δs off the Holm family (a CI rule, not a p rule)
        near = (e.get("vs_layer_drop_le") or {}).get("b")
        vs_all = {lab: (e["vs_layer_drop_le"] if lab == near else _paired(kp, label, lab, cfg.seeds))
                  for lab in slower_ld}
        e["vs_layer_drops_le"] = {lab: None if c is None else
                                  {"diff": c["diff"], "ci95": c["ci95"], "seeds": c["seeds"]}
                                  for lab, c in vs_all.items()}
        e["verdict"] = {
            "enough_seeds": e["n_seeds"] >= cfg.min_seeds,
            "latency_le_bar": lat <= cfg.latency_bar * full_lat,
            "noninferior_to_full": e["vs_full"]["ci95"][0] > -cfg.margin,
            "beats_layer_drop_at_le_latency": beats,
            "beats_layer_drop_ci_at_le_latency": all(c is not None and c["ci95"][0] > 0
                                                      for c in vs_all.values()),
            "layer_drop_points_at_le_latency": slower_ld,
            "min_seeds": cfg.min_seeds,
        }
        e["verdict"]["meets_bar"] = all(v for k, v in e["verdict"].items() if isinstance(v, bool))
    for bs in (timing or {}).get("batch_sizes", {}):
        front = _front(points, bs)
        for label, e in points.items():
            if _lat(e, bs) is not None:
                e.setdefault("on_front", {})[bs] = label in front
    composition = _composition(points, big)
    summary = {"command": "pareto", "env": env_info(), "config": to_dict(cfg),
               "points": points, "comparisons": comparisons, "composition": composition,
               "timing": None if timing is None else {k: v for k, v in timing.items()
                                                       if k != "batch_sizes"}}
    results.write_json("summary.json", summary)
    rows = _table_rows(points, cfg)
    if rows:
        results.write_csv("pareto.csv", rows)
        results.write_text("pareto.md", _markdown(rows, composition))
        if timing is not None:
            _figure(points, cfg, results)
    return summary


def _drop_twins(cfg: ParetoConfig) -> dict[str, str]:
    """{label of a point with ``options.reduce: merge``: label of the point that differs from it
    only by dropping} for the pairs the config has."""
    def shape(p: dict) -> tuple:  # everything but the reduction
        opts = {k: v for k, v in p["options"].items() if k != "reduce"}
        return (p["method"], p["keep_ratio"], p["after_layer"], str(p["schedule"]),
                p["layers"], p.get("rank_distill"), repr(sorted(opts.items())))

    pts = [p for p in cfg.points() if p["kind"] == "prune"]
    drops = {shape(p): p["label"] for p in pts if p["options"].get("reduce", "drop") == "drop"}
    return {p["label"]: drops[shape(p)] for p in pts
            if p["options"].get("reduce") == "merge" and shape(p) in drops}


def _family(label: str) -> str:
    base = label.removesuffix(INT8)
    if base == FULL:
        return "full"
    if base.startswith("layers="):
        return "layer-drop"
    depth = base.rpartition("/depth")[2] if "/depth" in base else None
    return base.split("@")[0] + (f" ({depth} layers)" if depth else "")


def _lat(e: dict, bs: str, order: str = "fair") -> float | None:
    return ((e.get("time") or {}).get(bs) or {}).get(order)


def _nearest_layer_drop(points: dict, lat: float, int8: bool, bs: str) -> str | None:
    cands = [(abs(_lat(o, bs) - lat), lab) for lab, o in points.items()
             if o["family"] == "layer-drop" and o["int8"] == int8 and _lat(o, bs) is not None]
    return min(cands)[1] if cands else None


def _layer_drops_at_or_below(points: dict, lat: float, bs: str) -> list[str]:
    """The layer-drop points (± int8) whose fair latency at batch ``bs`` is at most ``lat``,
    slowest first (ties: the more accurate first): ``[0]`` is the nearest one at equal or lower
    latency, the competitor a pruned point at ``lat`` has to beat."""
    cands = [(-_lat(o, bs), -o["accuracy"]["mean"], lab) for lab, o in points.items()
             if o["family"] == "layer-drop" and _lat(o, bs) is not None and _lat(o, bs) <= lat]
    return [lab for *_, lab in sorted(cands)]


def _front(points: dict, bs: str) -> set[str]:
    """The accuracy–latency front at batch ``bs``: the points no other point dominates (fair
    latency ≤ and mean accuracy ≥, one of them strictly)."""
    xy = {lab: (_lat(e, bs), e["accuracy"]["mean"]) for lab, e in points.items()
          if _lat(e, bs) is not None}
    return {a for a, (ta, ya) in xy.items()
            if not any(tb <= ta and yb >= ya and (tb < ta or yb > ya) for tb, yb in xy.values())}


def _composition(points: dict, bs: str) -> list[dict]:
    """Speed-ups (1 / relative fair time) of pruned, int8 and pruned + int8, and the product
    of the first two, per pruned point."""
    out = []
    q = points.get(FULL + INT8)
    if q is None or _lat(q, bs) is None:
        return out
    for label, e in points.items():
        if e["int8"] or e["family"] in ("full",) or label + INT8 not in points:
            continue
        tp, tq, tpq = _lat(e, bs), _lat(q, bs), _lat(points[label + INT8], bs)
        if None in (tp, tpq):
            continue
        out.append({"point": label, "batch_size": int(bs), "speedup_method": 1 / tp,
                    "speedup_int8": 1 / tq, "speedup_both": 1 / tpq,
                    "product": 1 / (tp * tq), "both_faster_than_each": tpq < min(tp, tq)})
    return out


def _table_rows(points: dict, cfg: ParetoConfig) -> list[dict]:
    rows = []
    bss = [str(b) for b in cfg.timing_batch_sizes]
    for label, e in sorted(points.items(), key=lambda kv: _lat(kv[1], bss[0]) or 9):
        acc = e["accuracy"]
        vf, vl = e.get("vs_full") or {}, e.get("vs_layer_drop") or {}
        vle = e.get("vs_layer_drop_le") or {}
        row = {"point": label, "seeds": e["n_seeds"], "accuracy": acc["mean"],
               "accuracy_ci95": acc.get("ci95"),
               "delta_vs_full_pp": None if not vf else 100 * vf["diff"],
               "delta_vs_full_ci95_pp": None if not vf else [100 * x for x in vf["ci95"]],
               "p_holm_vs_full": vf.get("p_holm"),
               "nearest_layer_drop": vl.get("b"),
               "delta_vs_layer_drop_pp": None if not vl else 100 * vl["diff"],
               "delta_vs_layer_drop_ci95_pp": None if not vl else [100 * x for x in vl["ci95"]],
               "p_holm_vs_layer_drop": vl.get("p_holm"),
               "layer_drop_le": vle.get("b"),
               "delta_vs_layer_drop_le_pp": None if not vle else 100 * vle["diff"],
               "delta_vs_layer_drop_le_ci95_pp": None if not vle else [100 * x for x in vle["ci95"]],
               "p_holm_vs_layer_drop_le": vle.get("p_holm"),
               "drop_twin": (e.get("vs_drop") or {}).get("b"),
               "delta_vs_drop_pp": None if "vs_drop" not in e else 100 * e["vs_drop"]["diff"],
               "delta_vs_drop_ci95_pp": (None if "vs_drop" not in e
                                         else [100 * x for x in e["vs_drop"]["ci95"]]),
               "p_holm_vs_drop": (e.get("vs_drop") or {}).get("p_holm"),
               "flops_relative": (e.get("flops_relative") or {}).get(bss[0])}
        for bs in bss:
            row[f"time_b{bs}_fair"] = _lat(e, bs, "fair")
            row[f"time_b{bs}_padded"] = _lat(e, bs, "padded")
        for bs in bss:
            row[f"front_b{bs}"] = (e.get("on_front") or {}).get(bs)
        row["meets_bar"] = (e.get("verdict") or {}).get("meets_bar")
        row["enough_seeds"] = (e.get("verdict") or {}).get("enough_seeds")
        rows.append(row)
    return rows


def _markdown(rows: list[dict], composition: list[dict]) -> str:
    def f(x, d=3):
        return "—" if x is None else f"{x:.{d}f}"

    bss = [k[len("time_b"):-len("_fair")] for k in rows[0] if k.startswith("time_b") and k.endswith("_fair")]
    head = ["point", "seeds", "accuracy [95 % CI]", "Δ vs full, pp [95 % CI]", "p_holm",
            "Δ vs layer-drop at ≤ latency, pp [95 % CI]", "p_holm", "FLOPs"]
    twins = any(r["drop_twin"] for r in rows)  # merging points: Δ against dropping, only then
    if twins:
        head += ["Δ vs the same point dropping, pp [95 % CI]", "p_holm"]
    head += [f"time b{b} fair (padded)" for b in bss] + ["front", "meets bar"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        ci = r["accuracy_ci95"]
        acc = f"{r['accuracy']:.4f}" + (f" [{ci[0]:.4f}, {ci[1]:.4f}]" if ci else " (1 seed)")
        dv = "—" if r["delta_vs_full_pp"] is None else (
            f"{r['delta_vs_full_pp']:+.2f} [{r['delta_vs_full_ci95_pp'][0]:+.2f}, "
            f"{r['delta_vs_full_ci95_pp'][1]:+.2f}]")
        # the nearest layer-drop point (± int8) at equal or lower fair latency (largest batch)
        dl = "—" if r["delta_vs_layer_drop_le_pp"] is None else (
            f"{r['delta_vs_layer_drop_le_pp']:+.2f} [{r['delta_vs_layer_drop_le_ci95_pp'][0]:+.2f}, "
            f"{r['delta_vs_layer_drop_le_ci95_pp'][1]:+.2f}] vs {r['layer_drop_le']}")
        cells = [r["point"], str(r["seeds"]), acc, dv,
                 "—" if r["p_holm_vs_full"] is None else f"{r['p_holm_vs_full']:.2g}", dl,
                 "—" if r["p_holm_vs_layer_drop_le"] is None else f"{r['p_holm_vs_layer_drop_le']:.2g}",
                 f(r["flops_relative"])]
        if twins:
            lo, hi = r["delta_vs_drop_ci95_pp"] or (None, None)
            cells += ["—", "—"] if r["drop_twin"] is None else [
                f"{r['delta_vs_drop_pp']:+.2f} [{lo:+.2f}, {hi:+.2f}]",
                "—" if r["p_holm_vs_drop"] is None else f"{r['p_holm_vs_drop']:.2g}"]
        cells += [f"{f(r[f'time_b{b}_fair'], 2)} ({f(r[f'time_b{b}_padded'], 2)})" for b in bss]
        cells.append(", ".join(f"b{b}" for b in bss if r.get(f"front_b{b}")))
        bar = {True: "yes", False: "no", None: ""}[r["meets_bar"]]
        cells.append(bar + (" (too few seeds)" if r.get("enough_seeds") is False else ""))
        lines.append("| " + " | ".join(cells) + " |")
    if composition:
        lines += ["", "| point | batch | speed-up method | int8 | both | product | both faster than each |",
                  "|---|---|---|---|---|---|---|"]
        for c in composition:
            lines.append(f"| {c['point']} | {c['batch_size']} | {c['speedup_method']:.2f}× | "
                         f"{c['speedup_int8']:.2f}× | {c['speedup_both']:.2f}× | {c['product']:.2f}× | "
                         f"{'yes' if c['both_faster_than_each'] else 'no'} |")
    return "\n".join(lines) + "\n"


def _figure(points: dict, cfg: ParetoConfig, results: ResultsDir) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bss = [str(b) for b in cfg.timing_batch_sizes]
    fig, axes = plt.subplots(1, len(bss), figsize=(6.5 * len(bss), 4.5), squeeze=False)
    colors = {}
    for ax, bs in zip(axes[0], bss, strict=True):
        groups: dict = {}
        for label, e in points.items():
            lat = _lat(e, bs)
            if lat is None:
                continue
            groups.setdefault((e["family"], e["int8"]), []).append((lat, e["accuracy"], label))
        for (fam, q), pts in sorted(groups.items()):
            pts.sort(key=lambda t: t[0])
            color = colors.setdefault(fam, f"C{len(colors)}")
            xs = [p[0] for p in pts]
            ys = [100 * p[1]["mean"] for p in pts]
            err = [[100 * (p[1]["mean"] - p[1]["ci95"][0]) if p[1].get("ci95") else 0 for p in pts],
                   [100 * (p[1]["ci95"][1] - p[1]["mean"]) if p[1].get("ci95") else 0 for p in pts]]
            ax.errorbar(xs, ys, yerr=err, fmt="--" if q else "-", marker="s" if q else "o",
                        mfc="none" if q else color, color=color, capsize=3,
                        label=f"{fam}{' + int8' if q else ''}")
            for x, y, p in zip(xs, ys, pts, strict=True):
                if fam == "layer-drop":
                    ax.annotate(p[2].removesuffix(INT8).removeprefix("layers="), (x, y),
                                fontsize=7, xytext=(3, -9), textcoords="offset points")
        front = sorted((_lat(points[lab], bs), 100 * points[lab]["accuracy"]["mean"], lab)
                       for lab in _front(points, bs))
        if front:  # the non-dominated points: ringed, joined by the front's staircase
            fx, fy = [t[0] for t in front], [t[1] for t in front]
            ax.step(fx, fy, where="post", color="k", lw=0.8, alpha=0.5, zorder=1)
            ax.scatter(fx, fy, s=140, facecolors="none", edgecolors="k", linewidths=1.0,
                       zorder=3, label="front (non-dominated)")
        ax.axvline(cfg.latency_bar, color="grey", lw=0.8, ls=":")
        ax.set_xlabel(f"wall time relative to full, batch {bs}, length-sorted (fair)")
        ax.set_ylabel("test accuracy, % (mean, 95 % CI over seeds)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"{cfg.data}: accuracy vs measured CPU latency ({cfg.model})", fontsize=10)
    results.save_figure("pareto.png", fig)
