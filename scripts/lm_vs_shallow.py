"""A pruned causal LM against a shallower model trained the same way (what users try first).

For each seed: perplexity of the sweep's control, of one sweep point (the pruned model) and of
a shallower unpruned model (``lm --n-layer N``, fine-tuned the control's steps from its own
base), the paired t-test over validation windows between the shallow and the pruned model,
and t-intervals over seeds of each model's change against the control; then counted FLOPs and
interleaved wall time at batch 8 over the validation windows of seed 0's models, 1 thread.

    python scripts/lm_vs_shallow.py --sweep SWEEP --point "keep_ratios=[0.65,0.05]" \\
        --shallow "SHALLOW_s{seed}" --seeds 0,1,2 [--windows 64] [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from attnprune import quantize_int8
from attnprune.bench.lm import load_run
from attnprune.measure import count_flops
from attnprune.research.data.lm_text import eval_windows
from attnprune.research.lm import evaluate


def _ppl(run: Path) -> float:
    methods = json.loads((run / "summary.json").read_text())["methods"]
    return next(iter(methods.values()))["perplexity"]


def _t_interval(x) -> tuple[float, float, float]:
    x = np.asarray(x, float)
    h = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
    return x.mean(), x.mean() - h, x.mean() + h


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", required=True, type=Path)
    ap.add_argument("--point", required=True, help="the sweep point's folder name without -sN")
    ap.add_argument("--shallow", default="", help="the shallow runs' folders, with {seed} "
                    "(leave out to compare with int8 only)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--windows", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--int8", action="store_true", help="also the control in dynamic int8")
    a = ap.parse_args(argv)
    if not a.shallow and not a.int8:
        ap.error("give --shallow, --int8 or both")
    torch.set_num_threads(1)
    seeds = [int(s) for s in a.seeds.split(",")]
    d_shallow, d_pruned, d_int8, d_both = [], [], [], []
    for s in seeds:
        ctl, pr = a.sweep / f"control-s{s}", a.sweep / f"{a.point}-s{s}"
        p = {"control": _ppl(ctl), "pruned": _ppl(pr)}
        lp = np.load(pr / "val_loss_per_window.npy")
        d_pruned.append(100 * (p["pruned"] / p["control"] - 1))
        print(f"seed {s}: perplexity control {p['control']:.3f}, pruned {p['pruned']:.3f}")
        if a.shallow:
            sh = Path(a.shallow.format(seed=s))
            p["shallow"] = _ppl(sh)
            ls = np.load(sh / "val_loss_per_window.npy")
            t = stats.ttest_rel(ls, lp)
            d_shallow.append(100 * (p["shallow"] / p["control"] - 1))
            print(f"seed {s}: perplexity shallow {p['shallow']:.3f}; shallow − pruned "
                  f"{ls.mean() - lp.mean():+.4f} nats per window (paired t over {len(ls)} "
                  f"windows, p = {t.pvalue:.2g})")
        if a.int8:
            model, data, cfg = load_run(ctl)
            x, y = eval_windows(data.val, cfg.eval_windows, cfg.context)
            with torch.no_grad():
                ev = evaluate(quantize_int8(model), x, y)
            li = np.asarray(ev["per_window"])
            ti = stats.ttest_rel(li, lp)
            d_int8.append(100 * (ev["perplexity"] / p["control"] - 1))
            print(f"seed {s}: int8 control perplexity {ev['perplexity']:.3f}; int8 − pruned "
                  f"{li.mean() - lp.mean():+.4f} nats per window (paired t, p = {ti.pvalue:.2g})")
            with torch.no_grad():
                eb = evaluate(quantize_int8(load_run(pr)[0]), x, y)
            lb = np.asarray(eb["per_window"])
            tb = stats.ttest_rel(lb, li)
            d_both.append(100 * (eb["perplexity"] / p["control"] - 1))
            print(f"seed {s}: pruned+int8 perplexity {eb['perplexity']:.3f}; pruned+int8 − int8 "
                  f"{lb.mean() - li.mean():+.4f} nats per window (paired t, p = {tb.pvalue:.2g})")
    named = (([("shallow", d_shallow)] if a.shallow else []) + [("pruned", d_pruned)]
             + ([("int8", d_int8), ("pruned+int8", d_both)] if a.int8 else []))
    for name, d in named:
        m, lo, hi = _t_interval(d)
        print(f"{name:11s} vs control: {m:+.1f} % [{lo:+.1f}, {hi:+.1f}] (t-interval over seeds)")
    if a.shallow:
        m, lo, hi = _t_interval(np.subtract(d_shallow, d_pruned))
        print(f"shallow − pruned: {m:+.1f} pp [{lo:+.1f}, {hi:+.1f}]")
    if a.int8:
        m, lo, hi = _t_interval(np.subtract(d_int8, d_pruned))
        print(f"int8 − pruned: {m:+.1f} pp [{lo:+.1f}, {hi:+.1f}]")
    s0 = seeds[0]
    models = {"full": load_run(a.sweep / f"control-s{s0}")[0],
              "pruned": load_run(a.sweep / f"{a.point}-s{s0}")[0]}
    if a.shallow:
        models["shallow"] = load_run(Path(a.shallow.format(seed=s0)))[0]
    if a.int8:
        models["int8"] = quantize_int8(models["full"])
        models["pruned+int8"] = quantize_int8(models["pruned"])
    _, data, cfg = load_run(a.sweep / f"control-s{s0}")
    x, _ = eval_windows(data.val, a.windows, cfg.context)
    batches = x.split(8)
    fns = {k: (lambda m=m: [m(b) for b in batches]) for k, m in models.items()}
    with torch.no_grad():
        flops = {k: count_flops(f) for k, f in fns.items() if "int8" not in k}
        for f in fns.values():
            f()
        times = {k: [] for k in fns}
        for _ in range(a.rounds):  # interleaved: one round times every model once
            for k, f in fns.items():
                t0 = time.perf_counter()
                f()
                times[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    for k in fns:
        fl = f"{flops[k] / flops['full']:.3f}" if k in flops else "  —  "
        print(f"{k:11s} FLOPs {fl}  time {med[k] / med['full']:.3f} "
              f"({1e3 * med[k]:.1f} ms for {len(x)} windows at batch 8, medians of {a.rounds})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
