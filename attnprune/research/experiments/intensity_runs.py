"""The intensity paper's Runs 0–4 on ``shakespeare_char`` (``attention_intensity_modulation.txt``
§5–6, Table 1 and Figure 1).

    attnprune reproduce intensity --config configs/intensity_runs_cpu.yaml --out results/intensity
    attnprune reproduce intensity --config configs/intensity_runs_paper.yaml --out results/…  # paper scale

=====  ==============  ============================================================  =========
run    label           what (§5.1; presets of :mod:`attnprune.methods.intensity`)    range
=====  ==============  ============================================================  =========
0      run0-baseline   the GPT-2 of the ``lm`` preset, unpatched                     —
1      run1-basic      2-layer MLP predictor on content only                         [0.1, 1]
2      run2-conserv.   as run 1                                                      [0.5, 1]
3      run3-position   + positional embedding (weight 0.1) and residual, one factor  [0.2, 1]
4      run4-multihead  as run 3 with a factor per head (eq. 2–7 as written)          [0.2, 1]
=====  ==============  ============================================================  =========

Each (run, seed) is one ``attnprune lm`` run (:func:`attnprune.research.lm.run_lm`) trained from scratch
in ``lm/<label>__seed<s>/``: the same seed gives every run the same backbone initialisation
(the predictors are built after it) and the same batches, so runs are paired by seed. A killed
run resumes from its last evaluation checkpoint (``lm``'s own resume), and a rerun with the
same ``--out`` skips every finished (run, seed) (``runs/<label>__seed<s>.json``).

Statistics (``summary.json``): final validation loss per run, mean and 95 % t-interval over
seeds (:func:`attnprune.runs.stats.aggregate_seeds`); the paired difference run − run 0 per seed, its
mean with a t-interval, a paired t-test over seeds and Holm over the comparisons of runs 1–4
(:func:`attnprune.runs.stats.holm`). Validation loss curves: the same mean and interval at every
evaluation step.

Speed (``speed.json``, measured once all runs have finished, in this one process): the models of
one seed (``speed_seed``) are loaded and timed round-robin with
:func:`attnprune.measure.time_interleaved` — generation of ``gen_tokens`` tokens at temperature
0.8 with the KV cache (the paper's measure, §5.2) and a forward of ``speed_batch`` validation
windows — giving tokens/s (median) and its ratio to run 0; FLOPs of that forward are counted with
:func:`attnprune.measure.count_flops`. Intensity runs through the fused SDPA kernel (query
rows scaled, see the method's docstring), so the paper's 31 % slowdown of run 1 (manual
attention) is not expected here; the predictor MLP is the only extra cost.

Writes ``config.yaml``, ``summary.json``, ``metrics.csv`` (one row per run × seed),
``curves.csv``, ``table.md``, ``speed.json``, ``intensity_runs.png``.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml

from attnprune import api
from attnprune.measure import count_flops, env_info, time_interleaved
from attnprune.runs import stats
from attnprune.runs.command import run_command
from attnprune.runs.config import ConfigError, load_config, to_dict
from attnprune.runs.results import ResultsDir

# run number → (label, intensity preset or None for the baseline, what it is)
RUNS: dict[int, tuple[str, str | None, str]] = {
    0: ("run0-baseline", None, "baseline transformer"),
    1: ("run1-basic", "basic", "basic intensity, content MLP, [0.1, 1]"),
    2: ("run2-conservative", "conservative", "conservative range [0.5, 1]"),
    3: ("run3-position", "position", "position-aware + residual, [0.2, 1]"),
    4: ("run4-multihead", "multihead", "multi-head, per-head factors, [0.2, 1]"),
}
BASELINE = 0
# lm fields this experiment sets itself per run; lm_options may not override them
MANAGED = ("seed", "method", "method_options", "init", "stage2_steps", "gen_tokens", "lengths",
           "bench_repeats")


@dataclass(frozen=True)
class IntensityRunsConfig:
    """Settings of ``attnprune reproduce intensity`` (every field is a ``--key value`` option)."""

    preset: str = "cpu-small"  # the ``lm`` preset: model size and schedule
    data: str = "shakespeare_char"
    runs: tuple[int, ...] = (0, 1, 2, 3, 4)
    seeds: tuple[int, ...] = (0, 1, 2)  # the paper: 3 seeds on shakespeare_char (§5.2)
    steps: int = 0  # 0 = the preset's
    eval_every: int = 0  # 0 = the preset's
    eval_windows: int = 128  # fixed validation windows of ``context`` tokens per evaluation
    lm_options: str = "{}"  # further ``lm`` fields as a YAML mapping, e.g. "{dropout: 0.2}"
    gen_tokens: int = 500  # the paper's speed measure: 500 generated tokens, temperature 0.8
    temperature: float = 0.8
    speed_seed: int | None = None  # whose models are timed; None = the first seed
    speed_batch: int = 8  # validation windows per timed forward
    speed_repeats: int = 5
    threads: int = 0  # torch threads; 0 = leave torch's default

    def __post_init__(self) -> None:
        if not self.runs or BASELINE not in self.runs:
            raise ValueError(f"runs: must include run {BASELINE} (the baseline), got {list(self.runs)}")
        if bad := [r for r in self.runs if r not in RUNS]:
            raise ValueError(f"runs: unknown run(s) {bad}; known: {sorted(RUNS)}")
        if len(set(self.runs)) != len(self.runs) or len(set(self.seeds)) != len(self.seeds):
            raise ValueError("runs, seeds: each value once")
        if len(self.seeds) < 2:
            raise ValueError(f"seeds: the paired test over seeds needs ≥ 2 seeds, got {list(self.seeds)}")
        if self.speed_seed is not None and self.speed_seed not in self.seeds:
            raise ValueError(f"speed_seed: must be one of seeds {list(self.seeds)}, got {self.speed_seed}")
        for name in ("steps", "eval_every", "gen_tokens", "threads"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be ≥ 0, got {getattr(self, name)}")
        for name in ("eval_windows", "speed_batch", "speed_repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be ≥ 1, got {getattr(self, name)}")
        if self.temperature <= 0:
            raise ValueError(f"temperature: must be > 0, got {self.temperature}")
        opts = yaml.safe_load(self.lm_options) if self.lm_options.strip() else {}
        if not isinstance(opts, dict):
            raise ValueError(f"lm_options: expected a mapping like '{{dropout: 0.2}}', got {self.lm_options!r}")  # noqa: TRY004
        if clash := sorted(set(opts) & set(MANAGED)):
            raise ValueError(f"lm_options: {clash[0]} is set by the experiment itself")
        try:
            self.lm_config(self.runs[-1], self.seeds[0])  # the lm fields checked before any work
        except ConfigError as e:
            raise ValueError(f"lm_options: {e}") from None

    def lm_config(self, run: int, seed: int):
        """The :class:`attnprune.research.lm.LMConfig` of one (run, seed)."""
        from attnprune.research.lm import PRESETS, LMConfig

        _, preset, _ = RUNS[run]
        values = {**PRESETS.get(self.preset, {}), "preset": self.preset, "data": self.data,
                  "eval_windows": self.eval_windows, "threads": self.threads,
                  **(yaml.safe_load(self.lm_options) or {}),
                  "seed": seed, "gen_tokens": 0, "bench_repeats": 1,
                  "method": "none" if preset is None else "intensity",
                  "method_options": "{}" if preset is None else f"{{preset: {preset}}}"}
        for name in ("steps", "eval_every"):
            if getattr(self, name):
                values[name] = getattr(self, name)
        return load_config(LMConfig, None, values)


def _key(run: int, seed: int) -> str:
    return f"{RUNS[run][0]}__seed{seed}"


def train_one(cfg: IntensityRunsConfig, run: int, seed: int, results: ResultsDir) -> dict:
    """Train (or resume) one (run, seed) with ``attnprune lm``; returns its record (also saved)."""
    import json

    from attnprune.research.lm import run_lm

    t0 = time.perf_counter()
    folder = run_lm(cfg.lm_config(run, seed), results.path / "lm" / _key(run, seed), exact=True)
    seconds = time.perf_counter() - t0
    summary = json.loads((folder / "summary.json").read_text())
    history = json.loads((folder / "history.json").read_text())
    label, preset, what = RUNS[run]
    entry = next(iter(summary["methods"].values()))
    record = {"run": run, "label": label, "seed": seed, "preset": preset, "what": what,
              "val_loss": entry["val_loss"], "perplexity": entry["perplexity"],
              "n_parameters": summary["n_parameters"], "train_seconds": seconds,
              "folder": str(folder.relative_to(results.path)),
              "curve": {"step": [h["step"] for h in history],
                        "val_loss": [h["val_loss"] for h in history],
                        "train_loss": [h["train_loss"] for h in history]}}
    results.save_run(_key(run, seed), record)
    return record


# ----------------------------------------------------------------------------- statistics
def paired_comparisons(cfg: IntensityRunsConfig, records: dict) -> list[dict]:
    """Final validation loss, run − run 0, paired over the seeds both finished; one Holm family
    over runs 1–4 (a comparison with fewer than 2 common seeds has no p and no place in it)."""
    from scipy import stats as sps

    out = []
    base = RUNS[BASELINE][0]
    for run in cfg.runs:
        if run == BASELINE:
            continue
        seeds = [s for s in cfg.seeds if (run, s) in records and (BASELINE, s) in records]
        if not seeds:
            continue
        a = np.array([records[(run, s)]["val_loss"] for s in seeds])
        b = np.array([records[(BASELINE, s)]["val_loss"] for s in seeds])
        d = a - b
        c = {"a": RUNS[run][0], "b": base, "metric": "val_loss", "seeds": seeds,
             "diff": float(d.mean()), "ci95": None, "diff_per_seed": d.tolist(),
             "relative": float(d.mean() / b.mean()), "test": "paired t over seeds",
             "p": None, "p_holm": None}
        if len(seeds) >= 2:
            c["ci95"] = stats.aggregate_seeds(d)["ci95"]
            p = float(sps.ttest_rel(a, b).pvalue)
            c["p"] = p if np.isfinite(p) else None  # identical differences: t undefined
        out.append(c)
    tested = [c for c in out if c["p"] is not None]
    for c, ph in zip(tested, stats.holm([c["p"] for c in tested]), strict=True):
        c["p_holm"] = float(ph)
    return out


def curve_bands(records: dict, run: int, seeds: list[int]) -> dict | None:
    """Mean and 95 % t-interval of the validation loss at each evaluation step over ``seeds``
    (the steps all of them reached), and the same for the paired difference to run 0."""
    recs = [records[(run, s)] for s in seeds if (run, s) in records]
    if len(recs) < 2:
        return None
    n = min(len(r["curve"]["step"]) for r in recs)
    steps = recs[0]["curve"]["step"][:n]
    loss = np.array([r["curve"]["val_loss"][:n] for r in recs])  # (seeds, steps)
    aggs = [stats.aggregate_seeds(loss[:, j]) for j in range(n)]
    out = {"step": steps, "mean": [a["mean"] for a in aggs],
           "lo": [a["ci95"][0] for a in aggs], "hi": [a["ci95"][1] for a in aggs]}
    both = [s for s in seeds if (run, s) in records and (BASELINE, s) in records]
    if run != BASELINE and len(both) >= 2:
        m = min(n, *(len(records[(BASELINE, s)]["curve"]["step"]) for s in both))
        d = np.array([np.subtract(records[(run, s)]["curve"]["val_loss"][:m],
                                  records[(BASELINE, s)]["curve"]["val_loss"][:m]) for s in both])
        dag = [stats.aggregate_seeds(d[:, j]) for j in range(m)]
        out["diff"] = {"step": steps[:m], "mean": [a["mean"] for a in dag],
                       "lo": [a["ci95"][0] for a in dag], "hi": [a["ci95"][1] for a in dag]}
    return out


# ----------------------------------------------------------------------------- speed
def _load_model(cfg: IntensityRunsConfig, run: int, seed: int, folder: Path, vocab_size: int):
    from attnprune.research.lm import build_model, load_weights

    lc = cfg.lm_config(run, seed)
    torch.manual_seed(seed)
    model = build_model(lc, vocab_size)
    if lc.method != "none":
        api.patch(model, lc.method, **lc.options)
    load_weights(model, folder / "model.safetensors", strict=True)  # the tied wte comes back
    return model.eval()  # through lm_head, which the file holds


def measure_speed(cfg: IntensityRunsConfig, records: dict, results: ResultsDir) -> dict:
    """Tokens/s (generation and forward) and FLOPs of one seed's models, timed round-robin in
    this process; ratios against run 0."""
    from attnprune.research.data.lm_text import eval_windows, load_lm_text
    from attnprune.research.lm import generate

    seed = cfg.seeds[0] if cfg.speed_seed is None else cfg.speed_seed
    data = load_lm_text(cfg.data, cfg.lm_config(BASELINE, seed).tokenizer)
    lc = cfg.lm_config(BASELINE, seed)
    x, _ = eval_windows(data.val, cfg.speed_batch, lc.context)
    prompt = data.val[: min(16, lc.context // 2)][None]
    models = {RUNS[r][0]: _load_model(cfg, r, seed, results.path / records[(r, seed)]["folder"],
                                      data.vocab_size) for r in cfg.runs}
    out: dict = {"seed": seed, "threads": torch.get_num_threads(), "gen_tokens": cfg.gen_tokens,
                 "temperature": cfg.temperature, "forward_batch": list(x.shape),
                 "repeats": cfg.speed_repeats, "runs": {}}
    with torch.no_grad():
        flops = {lab: count_flops(lambda m=m: m(x)) for lab, m in models.items()}
        fwd = time_interleaved({lab: (lambda m=m: m(x)) for lab, m in models.items()},
                               repeats=cfg.speed_repeats, warmup=1)
        gen = {}
        if cfg.gen_tokens:
            gen = time_interleaved(
                {lab: (lambda m=m: generate(m, prompt, cfg.gen_tokens, cfg.temperature, True,
                                            torch.Generator().manual_seed(seed)))
                 for lab, m in models.items()}, repeats=cfg.speed_repeats, warmup=1)
    base = RUNS[BASELINE][0]
    n_fwd = x.numel()
    for lab in models:
        row = {"flops": flops[lab], "flops_relative": flops[lab] / flops[base],
               "forward_tokens_per_s": n_fwd / fwd[lab].median_s,
               "forward_relative": fwd[base].median_s / fwd[lab].median_s,
               "forward_median_s": fwd[lab].median_s, "forward_mad_s": fwd[lab].mad_s}
        if gen:
            row.update({"gen_tokens_per_s": cfg.gen_tokens / gen[lab].median_s,
                        "gen_relative": gen[base].median_s / gen[lab].median_s,
                        "gen_median_s": gen[lab].median_s, "gen_mad_s": gen[lab].mad_s})
        out["runs"][lab] = row
    results.write_json("speed.json", out)
    return out


# ----------------------------------------------------------------------------- summary
def summarize_methods(cfg: IntensityRunsConfig, records: dict, speed: dict | None = None) -> dict:
    """Per run: final validation loss (mean, 95 % t-interval over seeds), parameters, speed."""
    methods = {}
    for run in cfg.runs:
        label, preset, what = RUNS[run]
        recs = [records[(run, s)] for s in cfg.seeds if (run, s) in records]
        if not recs:
            continue
        losses = [r["val_loss"] for r in recs]
        entry = {"run": run, "preset": preset, "what": what,
                 "seeds": [r["seed"] for r in recs],
                 "val_loss": (stats.aggregate_seeds(losses) if len(recs) >= 2
                              else {"mean": losses[0], "ci95": None, "per_seed": losses}),
                 "perplexity_per_seed": [r["perplexity"] for r in recs],
                 "n_parameters": recs[0]["n_parameters"]}
        if speed and label in speed["runs"]:
            entry.update(speed["runs"][label])
            entry["tokens_per_s"] = entry.get("gen_tokens_per_s", entry["forward_tokens_per_s"])
        methods[label] = entry
    return methods


def summarize(cfg: IntensityRunsConfig, records: dict, results: ResultsDir,
              speed: dict | None = None) -> dict:
    """summary.json, metrics.csv, curves.csv, table.md and the figure from finished records."""
    methods = summarize_methods(cfg, records, speed)
    rows, curve_rows, bands = [], [], {}
    for (run, seed), r in sorted(records.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        label = RUNS[run][0]
        rows.append({"run": run, "label": label, "seed": seed, "val_loss": r["val_loss"],
                     "perplexity": r["perplexity"], "train_seconds": r["train_seconds"]})
        curve_rows += [{"run": run, "label": label, "seed": seed, "step": st, "val_loss": v}
                       for st, v in zip(r["curve"]["step"], r["curve"]["val_loss"])]
    for run in cfg.runs:
        if (b := curve_bands(records, run, list(cfg.seeds))) is not None:
            bands[RUNS[run][0]] = b
    comparisons = paired_comparisons(cfg, records)
    summary = {"command": "reproduce intensity", "env": env_info(), "config": to_dict(cfg),
               "methods": methods, "comparisons": comparisons, "curves": bands,
               "speed": speed,
               "notes": {"pairing": "same seed = same backbone init and batches",
                         "test": "paired t-test over seeds, Holm over runs 1–4 vs run 0"}}
    results.write_json("summary.json", summary)
    if rows:
        results.write_csv("metrics.csv", rows)
        results.write_csv("curves.csv", curve_rows)
    results.write_text("table.md", format_table(methods, comparisons, speed))
    if bands:
        results.save_figure("intensity_runs.png", figure(bands, methods))
    return summary


def _f(x, fmt: str) -> str:
    return "—" if x is None else format(x, fmt)


def format_table(methods: dict, comparisons: list[dict], speed: dict | None) -> str:
    """Markdown: final validation loss mean [95 % CI], Δ vs run 0 with paired p and Holm p,
    tokens/s and FLOPs relative to run 0."""
    cmp = {c["a"]: c for c in comparisons}
    head = ("| run | what | seeds | val loss [95% CI] | Δ vs run 0 [95% CI] | Δ % | p (paired t) | "
            "p Holm | gen tokens/s | gen rel | fwd tokens/s | fwd rel | FLOPs rel |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for label, m in methods.items():
        v = m["val_loss"]
        ci = f"[{v['ci95'][0]:.4f}, {v['ci95'][1]:.4f}]" if v["ci95"] else ""
        c = cmp.get(label)
        if c is None:
            delta, rel, p, ph = "—", "—", "—", "—"
        else:
            dci = f" [{c['ci95'][0]:+.4f}, {c['ci95'][1]:+.4f}]" if c["ci95"] else ""
            delta = f"{c['diff']:+.4f}{dci}"
            rel = f"{100 * c['relative']:+.2f}"
            p, ph = _f(c["p"], ".3g"), _f(c["p_holm"], ".3g")
        lines.append(
            f"| {m['run']} | {m['what']} | {len(m['seeds'])} | {v['mean']:.4f} {ci} | {delta} | "
            f"{rel} | {p} | {ph} | {_f(m.get('gen_tokens_per_s'), '.1f')} | "
            f"{_f(m.get('gen_relative'), '.3f')} | {_f(m.get('forward_tokens_per_s'), '.0f')} | "
            f"{_f(m.get('forward_relative'), '.3f')} | {_f(m.get('flops_relative'), '.4f')} |")
    better = [a for a, c in cmp.items() if c["p_holm"] is not None and c["p_holm"] < 0.05
              and c["diff"] < 0]
    worse = [a for a, c in cmp.items() if c["p_holm"] is not None and c["p_holm"] < 0.05
             and c["diff"] > 0]
    lines += ["", (f"Lower validation loss than run 0 after Holm (p < 0.05): "
                   f"{', '.join(better) or 'none'}; higher: {', '.join(worse) or 'none'}.")]
    if speed:
        lines.append(f"Speed: seed {speed['seed']}'s models, {speed['threads']} thread(s), "
                     f"timed round-robin (median of {speed['repeats']}); gen = "
                     f"{speed['gen_tokens']} tokens at T = {speed['temperature']} with KV cache; "
                     f"fwd = a forward of {speed['forward_batch'][0]}×{speed['forward_batch'][1]} tokens; "
                     "rel = run 0 time / run time.")
    return "\n".join(lines) + "\n"


def figure(bands: dict, methods: dict):
    """Validation loss vs step (mean, 95 % band over seeds) and the paired difference to run 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, axd) = plt.subplots(1, 2, figsize=(12, 4.5))
    for label, b in bands.items():
        n = len(methods[label]["seeds"])
        (line,) = ax.plot(b["step"], b["mean"], label=f"{label} (n={n})")
        ax.fill_between(b["step"], b["lo"], b["hi"], color=line.get_color(), alpha=0.2)
        if "diff" in b:
            d = b["diff"]
            axd.plot(d["step"], d["mean"], color=line.get_color(), label=label)
            axd.fill_between(d["step"], d["lo"], d["hi"], color=line.get_color(), alpha=0.2)
    ax.set(xlabel="step", ylabel="validation loss (nats/char)",
           title="validation loss, mean ± 95 % CI over seeds")
    lo = min(min(b["lo"]) for b in bands.values())
    late = max(b["hi"][len(b["hi"]) // 3] for b in bands.values())  # zoom past the first third
    ax.set_ylim(lo - 0.02, late + 0.02)
    axd.axhline(0.0, color="k", lw=0.8)
    axd.set(xlabel="step", ylabel="Δ validation loss vs run 0",
            title="paired difference to run 0 (per seed), mean ± 95 % CI")
    ax.legend(fontsize=8)
    if axd.get_legend_handles_labels()[0]:  # a partial summary may hold run 0 alone
        axd.legend(fontsize=8)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------- driver
def run(cfg: IntensityRunsConfig, results: ResultsDir) -> dict:
    """Every (run, seed), seed by seed (finished ones skipped), then the speed and the summary."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    records = {}
    for seed in cfg.seeds:  # seed-major: a stopped experiment leaves whole seeds
        for r in cfg.runs:
            key = _key(r, seed)
            if results.run_done(key):
                records[(r, seed)] = results.load_run(key)
                print(f"skip {key}: finished earlier")
                continue
            records[(r, seed)] = train_one(cfg, r, seed, results)
            summarize(cfg, records, results)  # partial results readable while the runs go on
    speed = results.read_json("speed.json") if results.exists("speed.json") else None
    seed = cfg.seeds[0] if cfg.speed_seed is None else cfg.speed_seed
    if (speed is None or speed.get("seed") != seed
            or set(speed["runs"]) != {RUNS[r][0] for r in cfg.runs}):
        speed = measure_speed(cfg, records, results)
    return summarize(cfg, records, results, speed)


def main(argv: list[str]) -> int:
    """CLI entry: ``[--config FILE] [--key value ...] --out DIR``."""

    def body(cfg, out) -> str:
        run(cfg, out)
        return (out.path / "table.md").read_text()

    return run_command(argv, IntensityRunsConfig, "intensity-runs", body)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
