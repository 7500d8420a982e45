"""The summary and tables of ``attnprune reproduce attention`` (:func:`summarize`): per setting
the accuracy with its CI over seeds, sparsity, entropy, FLOPs and time; comparisons against
dense on the same test examples (Holm); ``table.md``, ``table3.md``, ``table3_compact.md``,
``table_prune.md``, ``table_pooled.md``, ``table_entropy.md`` and the figures."""

from __future__ import annotations

import numpy as np

from attnprune.measure import env_info
from attnprune.research.experiments.attention_sweeps_config import (
    DENSE,
    PRUNE,
    SweepConfig,
    prune_label,
    settings,
)
from attnprune.runs import stats
from attnprune.runs.config import to_dict
from attnprune.runs.report import fmt_mean_ci
from attnprune.runs.results import ResultsDir

__all__ = ["compact_summary", "format_compact_table", "format_entropy_table",
           "format_pooled_table", "format_prune_table", "format_table", "format_table3",
           "pooled_comparisons", "prune_summary", "sparse_summary", "summarize"]


def compact_summary(cfg: SweepConfig, records: dict, runs: list) -> dict:
    """Per setting and threshold, the seeds' compacted results: units removed, FLOPs relative
    to the same weights uncompacted and to the λ = 0 model of the same seed, latency relative
    to the same weights uncompacted, accuracy (mean, CI over seeds), MCC, Δ accuracy vs λ = 0
    (per seed, then mean and t-interval over seeds)."""
    out = {}
    mean = lambda xs: float(np.mean(xs))
    for label, _, _, keys in runs:
        recs = [records[(label, s)] for s in cfg.seeds
                if (label, s) in records and records[(label, s)].get("compact")]
        for tau_key in (recs[0]["compact"] if recs else {}):
            pairs = [(r, r["compact"][tau_key]) for r in recs if tau_key in r["compact"]]
            xs = [x for _, x in pairs]
            dense = [records.get((DENSE, r["seed"])) for r, _ in pairs]
            accs = [x["accuracy"] for x in xs]
            cis = [list(stats.wilson_ci(round(x["accuracy"] * x["n"]), x["n"])[:2]) for x in xs]
            deltas = [x["accuracy"] - d["test"]["accuracy"] for x, d in zip(xs, dense) if d]
            rel_dense = [x["flops"]["measured"] / d["test"]["flops"]["full_measured"]
                         for x, d in zip(xs, dense) if d]
            out[xs[0]["label"]] = {
                **keys, "setting": label, "threshold": xs[0]["threshold"],
                "criterion": xs[0]["criterion"], "fold": xs[0]["fold"],
                "seeds": [r["seed"] for r, _ in pairs],
                "removed_fraction": stats.aggregate_seeds([x["removed_fraction"] for x in xs],
                                                          [[x["removed_fraction"]] * 2
                                                           for x in xs]),
                "removed_by_layer": np.mean([[1 - k / u for k, u in zip(x["kept_by_layer"],
                                                                        x["units_by_layer"])]
                                             for x in xs], 0).tolist(),
                "flops_relative": mean([x["flops"]["relative"] for x in xs]),
                "flops_relative_to_lam0": mean(rel_dense) if rel_dense else None,
                "gflops_per_example": mean([x["flops"]["measured"] / x["n"] / 1e9 for x in xs]),
                "time_relative": stats.aggregate_seeds([x["time"]["relative"] for x in xs],
                                                       [[x["time"]["relative"]] * 2 for x in xs]),
                "latency_ms_per_batch": mean([x["time"]["median_s"] / x["time"]["batches"] * 1e3
                                              for x in xs]),
                "accuracy": stats.aggregate_seeds(accs, cis),
                "mcc": mean([x["mcc"] for x in xs]), "mcc_per_seed": [x["mcc"] for x in xs],
                "delta_accuracy_vs_lam0": (stats.aggregate_seeds(deltas, [[d, d] for d in deltas])
                                           if deltas else None),
            }
    return out


def format_compact_table(cfg: SweepConfig, records: dict, compact: dict,
                         comparisons: list[dict]) -> str:
    """Table 3 with compaction: λ = 0 dense, then every (setting, τ) compacted; Δ and the
    per-seed McNemar p (Holm over the sweep) against λ = 0 dense."""
    by_label: dict = {}
    for c in comparisons:
        if c["metric"] == "accuracy":
            by_label.setdefault(c["a"], []).append(c)
    ci = lambda a, f="{:.4f}": f"{f.format(a['mean'])} [{f.format(a['ci95'][0])}, " \
                               f"{f.format(a['ci95'][1])}]"
    n_seeds = len(cfg.seeds)
    one = "; one seed: Wilson CI" if n_seeds == 1 else ""
    head = (f"Seeds: {list(cfg.seeds)} (mean [95% CI over seeds]{one}). "
            f"FFN penalty {cfg.ffn_penalty}; compaction criterion {cfg.compact_criterion}, "
            f"fold {cfg.compact_fold}, {cfg.compact_batches} calibration batches of "
            f"{cfg.eval_batch_size} training rows. FLOPs counted over the test set; latency "
            f"per batch of {cfg.eval_batch_size}, {cfg.timing_repeats} interleaved repeats, "
            f"relative to the same weights uncompacted; {cfg.threads or 'default'} thread(s). "
            f"p Holm: McNemar vs λ = 0 dense per seed, Holm over the sweep; the largest over "
            f"seeds.")
    cols = ("| λ | location | τ | units removed | FLOPs rel (same weights) | FLOPs rel (λ=0) | "
            "latency rel | accuracy | MCC | Δacc vs λ=0 | p Holm (max over seeds) |")
    lines = [head, "", cols, "|" + "---|" * 11]
    dense = [records[(DENSE, s)]["test"] for s in cfg.seeds if (DENSE, s) in records]
    if dense:
        acc = stats.aggregate_seeds([x["accuracy"] for x in dense],
                                    [list(stats.wilson_ci(round(x["accuracy"] * x["n"]),
                                                          x["n"])[:2]) for x in dense])
        lines.append(f"| 0 (dense) | — | — | 0 | 1.000 | 1.000 | 1.000 | {ci(acc)} | "
                     f"{np.mean([x['mcc'] for x in dense]):.3f} | — | — |")
    for sub, m in compact.items():
        cs = by_label.get(sub, [])
        ph = f"{max(c['p_holm'] for c in cs):.2g}" if cs and all(
            c.get("p_holm") is not None for c in cs) else "—"
        d = m["delta_accuracy_vs_lam0"]
        r = m["removed_fraction"]
        lines.append(
            f"| {m['lam']:g} | {m['location']} | {m['threshold']:g} | {r['mean'] * 100:.1f}% "
            f"[{r['ci95'][0] * 100:.1f}, {r['ci95'][1] * 100:.1f}] | {m['flops_relative']:.3f} | "
            f"{m['flops_relative_to_lam0'] if m['flops_relative_to_lam0'] is None else format(m['flops_relative_to_lam0'], '.3f')} | "
            f"{ci(m['time_relative'], '{:.3f}')} | {ci(m['accuracy'])} | {m['mcc']:.3f} | "
            f"{'—' if d is None else ci(d, '{:+.4f}')} | {ph} |")
    return "\n".join(lines) + "\n"


def summarize(cfg: SweepConfig, records: dict, results: ResultsDir) -> dict:
    """summary.json, metrics.csv, table.md and figures from the finished records."""
    from attnprune.research.analysis import plot_accuracy_vs
    from attnprune.runs.compare import load_predictions

    runs = settings(cfg)
    methods, rows = {}, []
    for label, method, _, keys in runs:
        recs = [records[(label, s)] for s in cfg.seeds if (label, s) in records]
        if not recs:
            continue
        accs = [r["test"]["accuracy"] for r in recs]
        cis = [list(stats.wilson_ci(round(r["test"]["accuracy"] * r["test"]["n"]),
                                    r["test"]["n"])[:2]) for r in recs]
        acc = stats.aggregate_seeds(accs, cis)
        aucs = [r["test"]["auc"] for r in recs if r["test"].get("auc") is not None]
        mean = lambda xs: float(np.mean(xs))
        t = [r["test"].get("time", {}) for r in recs]
        methods[label] = {
            **keys, "method": method or DENSE,
            "accuracy": acc,
            "auc": {"mean": mean(aucs), "per_seed": aucs} if aucs else None,
            "attention_sparsity": mean([r["analysis"]["sparsity_mean"] for r in recs]),
            "ffn_sparsity": mean([r["analysis"]["ffn_sparsity_mean"] for r in recs]),
            "entropy_bits": mean([r["analysis"]["entropy_bits_mean"] for r in recs]),
            "gini": mean([r["analysis"]["gini_mean"] for r in recs]),
            "entropy_bits_by_layer": np.mean([r["analysis"]["entropy_bits_by_layer"]
                                              for r in recs], 0).tolist(),
            "flops": {"measured": mean([r["test"]["flops"]["measured"] for r in recs]),
                      "relative": mean([r["test"]["flops"]["relative"] for r in recs]),
                      "sparse_proxy_relative": mean([r["test"]["flops"]["sparse_proxy_relative"]
                                                     for r in recs])},
            "time": {"median_s": mean([x["median_s"] for x in t]),
                     "mad_s": mean([x["mad_s"] for x in t]),
                     "relative": mean([x.get("relative", 1.0) for x in t])},
        }
        for r in recs:
            rows.append({"label": label, "seed": r["seed"], **keys,
                         "accuracy": r["test"]["accuracy"], "auc": r["test"].get("auc"),
                         "attention_sparsity": r["analysis"]["sparsity_mean"],
                         "ffn_sparsity": r["analysis"]["ffn_sparsity_mean"],
                         "entropy_bits": r["analysis"]["entropy_bits_mean"],
                         "gini": r["analysis"]["gini_mean"],
                         "flops_relative": r["test"]["flops"]["relative"],
                         "time_relative": r["test"].get("time", {}).get("relative")})
    preds = load_predictions(results.path / "predictions")  # read once, for every table
    comparisons = _comparisons(cfg, preds)
    sparse = sparse_summary(cfg, records, runs)
    compacted = compact_summary(cfg, records, runs)
    pruned, prune_cmp = prune_summary(cfg, records, preds)
    pooled = pooled_comparisons(cfg, preds)
    summary = {"command": f"attention sweep {cfg.sweep}", "env": env_info(),
               "config": to_dict(cfg), "methods": methods, "comparisons": comparisons,
               "sparse_ffn": sparse, "compact": compacted,
               "pruned": pruned, "prune_comparisons": prune_cmp,
               "pooled_comparisons": pooled,
               "notes": {"dense": "s = 0 and λ = 0 are this run (they reproduce it to 1e-5)",
                         "flops": "measured FLOPs are of dense kernels; sparse_proxy_relative "
                                  "is an analytic bound, not realised"}}
    results.write_json("summary.json", summary)
    if rows:
        results.write_csv("metrics.csv", rows)
    results.write_text("table.md", format_table(cfg, methods, comparisons))
    if methods:
        results.write_text("table_entropy.md", format_entropy_table(methods))
    if pruned:
        results.write_text("table_prune.md", format_prune_table(cfg, pruned, prune_cmp))
    if pooled:
        results.write_text("table_pooled.md", format_pooled_table(pooled))
    if sparse:
        results.write_text("table3.md", format_table3(cfg, records, sparse, comparisons))
    if compacted:
        results.write_text("table3_compact.md",
                           format_compact_table(cfg, records, compacted, comparisons))
    _figures(cfg, methods, results, plot_accuracy_vs)
    return summary


def prune_summary(cfg: SweepConfig, records: dict, preds: dict) -> tuple[dict, list[dict]]:
    """Pruning after training: per (setting, ρ) the seeds' accuracy with attention_mass
    pruning, kept tokens, FLOPs, the drop from the same model unpruned, Δ against the dense
    model pruned at the same ρ, and the difference of the two drops (per seed, then mean and
    t-interval over seeds); and the paired tests of every pruned model against the dense one
    pruned at the same ρ (McNemar per seed, one Holm family of its own)."""
    if not cfg.prune_after:
        return {}, []
    comparisons = []
    for seed in cfg.seeds:
        for rho in cfg.prune_after:
            ref = prune_label(DENSE, rho)
            group = {prune_label(lab, rho): preds[prune_label(lab, rho)][seed]
                     for lab, *_ in settings(cfg) if seed in preds.get(prune_label(lab, rho), {})}
            if ref in group and len(group) > 1:
                for c in stats.compare_predictions(group, reference=ref, adjust=False,
                                                   metrics=("accuracy",)):
                    comparisons.append({**c, "seed": seed, "keep_ratio": rho})
    if comparisons:
        stats.apply_decision_rule(comparisons)
    agg = lambda xs: stats.aggregate_seeds(xs, [[x, x] for x in xs]) if xs else None
    out = {}
    for label, _, _, keys in settings(cfg):
        recs = [records[(label, s)] for s in cfg.seeds
                if (label, s) in records and records[(label, s)].get("pruned")]
        for rho in cfg.prune_after:
            k = f"{rho:g}"
            rs = [r for r in recs if k in r["pruned"]]
            if not rs:
                continue
            dense = {r["seed"]: records.get((DENSE, r["seed"])) for r in rs}
            drop = [r["pruned"][k]["accuracy"] - r["test"]["accuracy"] for r in rs]
            vs = [r["pruned"][k]["accuracy"] - dense[r["seed"]]["pruned"][k]["accuracy"]
                  for r in rs if dense[r["seed"]] and k in dense[r["seed"]].get("pruned", {})]
            dd = [(r["pruned"][k]["accuracy"] - r["test"]["accuracy"])
                  - (dense[r["seed"]]["pruned"][k]["accuracy"] - dense[r["seed"]]["test"]["accuracy"])
                  for r in rs if dense[r["seed"]] and k in dense[r["seed"]].get("pruned", {})]
            xs = [r["pruned"][k] for r in rs]
            out[prune_label(label, rho)] = {
                **keys, "setting": label, "keep_ratio": rho, "after_layer": cfg.prune_after_layer,
                "seeds": [r["seed"] for r in rs],
                "accuracy": stats.aggregate_seeds(
                    [x["accuracy"] for x in xs],
                    [list(stats.wilson_ci(round(x["accuracy"] * x["n"]), x["n"])[:2]) for x in xs]),
                "kept_ratio": float(np.mean([x["kept_ratio"] for x in xs])),
                "flops_relative": float(np.mean([x["flops"]["relative"] for x in xs])),
                "drop_vs_unpruned": agg(drop), "delta_vs_dense_pruned": agg(vs),
                "drop_minus_dense_drop": agg(dd)}
    return out, comparisons


def format_prune_table(cfg: SweepConfig, pruned: dict, comparisons: list[dict]) -> str:
    """Does a crisp-trained model prune better? One row per (setting, ρ)."""
    by: dict = {}
    for c in comparisons:
        by.setdefault(c["a"], []).append(c)
    ci = lambda a: "—" if a is None else fmt_mean_ci(a, "{:+.4f}")
    lines = [(f"Seeds: {list(cfg.seeds)}. attention_mass token pruning after layer "
              f"{cfg.prune_after_layer} at keep ratio ρ, applied after training, no retraining "
              f"(crisp stays on underneath). drop: accuracy pruned minus the same model unpruned; "
              f"Δ vs dense pruned: against the dense model pruned at the same ρ; drop − dense "
              f"drop: the difference of the two drops (per seed, mean [t-interval over seeds]); "
              f"p Holm: McNemar vs dense pruned at the same ρ per seed, in seed order, Holm over "
              f"this table's family. kept tokens: share of real (unpadded) tokens the layers "
              f"see, mean over layers; summary.json also has FLOPs, relative to the same model "
              f"on the same padded batches (so they include the padding that pruning drops)."), "",
             ("| setting | ρ | kept tokens | accuracy pruned [95% CI] | drop vs "
              "unpruned | Δ vs dense pruned | p Holm | drop − dense drop |"), "|" + "---|" * 8]
    for sub, m in pruned.items():
        _, _, ph = _across(by.get(sub, []))
        ref = m["setting"] == DENSE  # the reference: against itself is not a comparison
        lines.append(f"| {m['setting']} | {m['keep_ratio']:g} | {m['kept_ratio']:.3f} | "
                     f"{fmt_mean_ci(m['accuracy'])} | "
                     f"{ci(m['drop_vs_unpruned'])} | {'—' if ref else ci(m['delta_vs_dense_pruned'])} | "
                     f"{ph} | {'—' if ref else ci(m['drop_minus_dense_drop'])} |")
    return "\n".join(lines) + "\n"


def sparse_summary(cfg: SweepConfig, records: dict, runs: list) -> dict:
    """Per setting and threshold, the seeds' sparse-FFN results: accuracy (mean, CI), MCC,
    FLOPs per example (G) and relative to dense, latency per batch (ms) and relative to the same
    weights with a dense FFN (interleaved), token and block sparsity."""
    out = {}
    for label, _, _, keys in runs:
        recs = [records[(label, s)] for s in cfg.seeds
                if (label, s) in records and records[(label, s)].get("sparse_ffn")]
        if not recs:
            continue
        for tau_key in recs[0]["sparse_ffn"]:  # "<τ>-b<block>"
            rs = [r["sparse_ffn"][tau_key] for r in recs if tau_key in r["sparse_ffn"]]
            accs = [x["accuracy"] for x in rs]
            cis = [list(stats.wilson_ci(round(x["accuracy"] * x["n"]), x["n"])[:2]) for x in rs]
            mean = lambda xs: float(np.mean(xs))
            out[rs[0]["label"]] = {
                **keys, "setting": label, "threshold": rs[0]["threshold"],
                "mode": rs[0]["mode"], "block": rs[0]["block"],
                "max_active": rs[0]["max_active"], "seeds": [r["seed"] for r in recs],
                "accuracy": stats.aggregate_seeds(accs, cis),
                "mcc": mean([x["mcc"] for x in rs]),
                "gflops_per_example": mean([x["flops"]["measured"] / x["n"] / 1e9 for x in rs]),
                "flops_relative": mean([x["flops"]["relative"] for x in rs]),
                "latency_ms_per_batch": mean([x["time"]["median_s"] / x["time"]["batches"] * 1e3
                                              for x in rs]),
                "time_relative": mean([x["time"]["relative"] for x in rs]),
                "token_sparsity": mean([x["token_sparsity"] for x in rs]),
                "block_sparsity": mean([x["block_sparsity"] for x in rs]),
            }
    return out


def format_table3(cfg: SweepConfig, records: dict, sparse: dict, comparisons: list[dict]) -> str:
    """The cost paper's Table 3 with our measurements: the dense baseline, then every λ with
    the sparse FFN; paired accuracy tests against dense (λ = 0, dense FFN), Holm-adjusted."""
    acc_cmp = {}
    for c in comparisons:
        if c["metric"] == "accuracy":
            acc_cmp.setdefault(c["a"], []).append(c)
    dense = [records[(DENSE, s)] for s in cfg.seeds if (DENSE, s) in records]
    lines = [(f"Seeds: {list(cfg.seeds)}{' (one seed: no CI over seeds)' if len(cfg.seeds) == 1 else ''}. "
              f"Sparse FFN: mode {cfg.sparse_ffn_mode}, "
              f"max_active {cfg.sparse_ffn_max_active:g}. FLOPs counted (FlopCounterMode) over the "
              f"test set; latency per batch of {cfg.eval_batch_size}, {cfg.timing_repeats} "
              f"interleaved repeats, relative to the same weights with a dense FFN."), "",
             ("| λ | τ | block | GFLOPs / example | FLOPs rel | latency ms / batch | latency rel | "
              "token sparsity | block sparsity (skipped) | accuracy [95% CI] | MCC | "
              "Δacc vs λ=0 dense [95% CI] | p Holm |"), "|" + "---|" * 13]
    if dense:
        t = [r["test"] for r in dense]
        acc = stats.aggregate_seeds([x["accuracy"] for x in t],
                                    [list(stats.wilson_ci(round(x["accuracy"] * x["n"]),
                                                          x["n"])[:2]) for x in t])
        gfl = np.mean([x["flops"]["full_measured"] / x["n"] / 1e9 for x in t])
        lat = np.mean([x["time"]["median_s"] / x["time"]["batches"] * 1e3 for x in t])
        lines.append(f"| 0 (dense FFN) | — | — | {gfl:.3f} | 1.000 | {lat:.1f} | 1.000 | — | 0 | "
                     f"{acc['mean']:.4f} [{acc['ci95'][0]:.4f}, {acc['ci95'][1]:.4f}] | "
                     f"{np.mean([x['mcc'] for x in t]):.3f} | — | — |")
    for sub, m in sparse.items():
        cs = acc_cmp.get(sub, [])
        c = cs[0] if len(cs) == 1 else None  # one seed: its test; several: see summary.json
        delta = f"{c['diff']:+.4f} [{c['ci95'][0]:+.4f}, {c['ci95'][1]:+.4f}]" if c else "—"
        ph = f"{c['p_holm']:.3g}" if c and c.get("p_holm") is not None else "—"
        a = m["accuracy"]
        lines.append(
            f"| {m['lam']:g} | {m['threshold']:g} | {m['block']} | "
            f"{m['gflops_per_example']:.3f} | "
            f"{m['flops_relative']:.3f} | {m['latency_ms_per_batch']:.1f} | "
            f"{m['time_relative']:.3f} | {m['token_sparsity']:.3f} | {m['block_sparsity']:.3f} | "
            f"{a['mean']:.4f} [{a['ci95'][0]:.4f}, {a['ci95'][1]:.4f}] | {m['mcc']:.3f} | "
            f"{delta} | {ph} |")
    return "\n".join(lines) + "\n"


def _comparisons(cfg: SweepConfig, preds: dict) -> list[dict]:
    """Every setting vs dense per seed, one Holm family over the sweep."""
    out = []
    for seed in cfg.seeds:
        group = {lab: by_seed[seed] for lab, by_seed in preds.items()
                 if seed in by_seed and PRUNE not in lab}  # pruning: its own family
        if DENSE in group and len(group) > 1:
            for c in stats.compare_predictions(group, reference=DENSE, adjust=False):
                c["seed"] = seed
                out.append(c)
    if out:
        stats.apply_decision_rule(out)
    return out


def pooled_comparisons(cfg: SweepConfig, preds: dict) -> list[dict]:
    """Accuracy against the reference with every seed's test rows pooled: for each label with
    at least two seeds, the seeds it shares with its reference are concatenated (row i of seed
    s stays paired with row i of the reference's seed s), then one McNemar test (the same as
    summing the per-seed discordant counts) and one paired bootstrap CI. It has √(seeds) more
    power than a single seed's test, but it is a fixed-effect test: it holds the trained
    models fixed and sees only test-set noise, while the t-interval over seeds in table.md also
    carries the training noise. Two Holm families: the sweep against dense, and each pruned
    model against dense pruned at the same ρ."""
    out = []
    for family in ("sweep", "prune"):
        batch = []
        for label, by_seed in preds.items():
            if (PRUNE in label) != (family == "prune") or label.startswith(DENSE):
                continue
            ref = (prune_label(DENSE, float(label.rsplit(PRUNE, 1)[1])) if family == "prune"
                   else DENSE)
            seeds = sorted(set(by_seed) & set(preds.get(ref, {})) & set(cfg.seeds))
            if len(seeds) < 2:
                continue
            group = {lab: {k: np.concatenate([by[sd][k] for sd in seeds])
                           for k in ("y_true", "y_pred")}
                     for lab, by in ((label, by_seed), (ref, preds[ref]))}
            for c in stats.compare_predictions(group, reference=ref, adjust=False,
                                               metrics=("accuracy",)):
                batch.append({**c, "seeds": seeds, "family": family})
        if batch:
            stats.apply_decision_rule(batch)
            out += batch
    return out


def format_pooled_table(pooled: list[dict]) -> str:
    """table_pooled.md: one row per pooled comparison (``pooled_comparisons``)."""
    lines = [("Accuracy with the seeds' test rows pooled (paired row by row within each seed): "
              "Δ [95% paired bootstrap CI], McNemar p, Holm p within each family (the sweep vs "
              "dense; pruned models vs dense pruned at the same ρ). A fixed-effect test: it "
              "holds the trained models fixed (test-set noise only); table.md's t-interval "
              "over seeds also carries training noise."), "",
             "| family | setting | vs | seeds | rows | Δ accuracy [95% CI] | p (McNemar) | p Holm |",
             "|" + "---|" * 8]
    for c in pooled:
        lines.append(f"| {c['family']} | {c['a']} | {c['b']} | "
                     f"{','.join(str(sd) for sd in c['seeds'])} | {c['n']} | "
                     f"{c['diff']:+.4f} [{c['ci95'][0]:+.4f}, {c['ci95'][1]:+.4f}] | "
                     f"{c['p']:.3g} | {c['p_holm']:.3g} |")
    return "\n".join(lines) + "\n"


def _across(cs: list[dict]) -> tuple[str, str, str]:
    """Δ, p and p Holm cells from one label's per-seed comparisons: one seed as it is; several:
    the mean Δ with a t-interval over seeds, and every seed's p in seed order."""
    if not cs:
        return "—", "—", "—"
    if len(cs) == 1:
        c = cs[0]
        ph = f"{c['p_holm']:.3g}" if c.get("p_holm") is not None else "—"
        return f"{c['diff']:+.4f} [{c['ci95'][0]:+.4f}, {c['ci95'][1]:+.4f}]", f"{c['p']:.3g}", ph
    cs = sorted(cs, key=lambda c: c["seed"])
    d = stats.aggregate_seeds([c["diff"] for c in cs])
    ps = ", ".join(f"{c['p']:.2g}" for c in cs)
    phs = ", ".join(f"{c['p_holm']:.2g}" if c.get("p_holm") is not None else "—" for c in cs)
    return fmt_mean_ci(d, "{:+.4f}"), ps, phs


def _significant(cs: list[dict], sign: int) -> bool:
    """Every seed's Holm-adjusted p < 0.05 with Δ of the given sign."""
    return bool(cs) and all(c.get("p_holm") is not None and c["p_holm"] < 0.05
                            and sign * c["diff"] > 0 for c in cs)


def format_table(cfg: SweepConfig, methods: dict, comparisons: list[dict]) -> str:
    """Markdown table in the papers' layout, with 95 % CIs and Holm-adjusted McNemar p; with
    several seeds Δ is the mean with a t-interval over seeds, and p / p Holm list every seed's
    (McNemar per seed, Holm over the whole sweep: all settings × seeds × metrics)."""
    acc_cmp: dict = {}
    auc_cmp: dict = {}
    for c in comparisons:
        {"accuracy": acc_cmp, "auc": auc_cmp}.get(c["metric"], {}).setdefault(c["a"], []).append(c)
    n_seeds = len(cfg.seeds)
    lines = []
    if n_seeds > 1:
        lines += [(f"Seeds: {list(cfg.seeds)}. accuracy and AUC: mean [95% t-interval over "
                   f"seeds]; Δ vs dense: per seed on the same test rows, mean [t-interval over "
                   f"seeds]; p and p Holm: McNemar (accuracy) / DeLong (AUC) per seed, in seed "
                   f"order, Holm over the whole sweep (settings × seeds × metrics)."), ""]
    head = ("| setting | s | schedule | λ | location | accuracy [95% CI] | Δ vs dense [95% CI] | "
            "p (McNemar) | p Holm | AUC | ΔAUC [95% CI] | p Holm (DeLong) | attn sparsity | FFN sparsity | entropy (bits) | Gini | "
            "FLOPs rel (measured) | FLOPs rel (sparse proxy) | latency rel |")
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    for label, m in methods.items():
        delta, p, ph = _across(acc_cmp.get(label, []))
        dauc, _, pauc = _across(auc_cmp.get(label, []))
        auc = f"{m['auc']['mean']:.4f}" if m.get("auc") else "—"
        lines.append(
            f"| {label} | {m['sparsity']:g} | {m['schedule']} | {m['lam']:g} | {m['location']} | "
            f"{fmt_mean_ci(m['accuracy'])} | {delta} | {p} | {ph} | {auc} | {dauc} | {pauc} | "
            f"{m['attention_sparsity']:.3f} | {m['ffn_sparsity']:.3f} | {m['entropy_bits']:.3f} | "
            f"{m['gini']:.3f} | {m['flops']['relative']:.4f} | "
            f"{m['flops']['sparse_proxy_relative']:.3f} | {m['time']['relative']:.3f} |")
    every = " in every seed" if n_seeds > 1 else ""
    lines.append("")
    for name, cmp in (("accuracy", acc_cmp), ("AUC", auc_cmp)):
        better = [lab for lab, cs in cmp.items() if _significant(cs, 1)]
        worse = [lab for lab, cs in cmp.items() if _significant(cs, -1)]
        lines.append(f"Significantly better than dense after Holm{every} ({name}): "
                     f"{', '.join(better) or 'none'}; significantly worse: "
                     f"{', '.join(worse) or 'none'}.")
    return "\n".join(lines) + "\n"


def format_entropy_table(methods: dict) -> str:
    """Attention entropy (bits) per layer of every setting, mean over seeds."""
    n = max((len(m["entropy_bits_by_layer"]) for m in methods.values()), default=0)
    lines = ["| setting | " + " | ".join(f"layer {i + 1}" for i in range(n)) + " | mean |",
             "|" + "---|" * (n + 2)]
    for label, m in methods.items():
        lines.append(f"| {label} | " + " | ".join(f"{v:.3f}" for v in m["entropy_bits_by_layer"])
                     + f" | {m['entropy_bits']:.3f} |")
    return "\n".join(lines) + "\n"


def _figures(cfg: SweepConfig, methods: dict, results: ResultsDir, plot_accuracy_vs) -> None:
    dense = methods.get(DENSE)
    others = [(lab, m) for lab, m in methods.items() if lab != DENSE]
    if not others or dense is None:
        return
    band = (dense["accuracy"]["mean"], tuple(dense["accuracy"]["ci95"]))
    # (method, x key, group key, x label, log x, title, file)
    panels = [("crisp", "sparsity", "schedule", "sparsity s", False,
               "crisp: accuracy vs sparsity", "accuracy_vs_sparsity.png"),
              ("cost", "lam", "location", "λ", True,
               "cost incentive: accuracy vs λ", "accuracy_vs_lambda.png")]
    for method, x, group, xlabel, log_x, title, name in panels:
        rows = [m for _, m in others if m["method"] == method]
        if not rows:
            continue
        fig = plot_accuracy_vs([m[x] for m in rows], [m["accuracy"]["mean"] for m in rows],
                               [m["accuracy"]["ci95"] for m in rows], xlabel=xlabel,
                               groups=[m[group] for m in rows], dense=band, log_x=log_x,
                               title=title)
        results.save_figure(name, fig)
