"""The synthetic experiment of the entropy paper (§7, §8.3, App. C), trained and measured for real.

:func:`run_experiment` does, into one results folder (contract in ``DESIGN.md``):

1. **Main grid** — methods {full, attention_mass, random, entropy, entropy_threshold,
   entropy_gumbel} × seeds {42..46}, each trained by :func:`attnprune.research.synthetic.train.train_model`
   on the data of its seed (all methods of a seed see the same data, so comparisons are paired).
2. **Per run** — accuracy, AUC, kept tokens, oracle overlap (share of the true signal positions
   the gate kept; also of the flipped distractors), calibration of the classifier and of the
   entropy head (ECE, reliability bins, temperature fitted on the first half of the validation
   set and ECE after it on the second half), and how well the gate's scores rank the signal
   positions (ROC-AUC of scores vs "is a signal token").
3. **Efficiency** (in this process, after training, full and pruned timed back to back) — FLOPs
   proxy 2(L² + (ρL)²)d (eq. 7), the paper's latency proxy ℓ0 + α·L_eff² (§5), measured FLOPs
   (:func:`attnprune.measure.count_flops`), measured wall time
   (:func:`attnprune.measure.time_interleaved`)
   and the share of it spent in the gate.
4. **Ablations** (§8.3) — ρ ∈ {0.3, 0.5, 0.7}, top-k vs threshold, IDF on/off, noise stress
   (flip rate 0.05 → 0.45), on ``ablation_seeds`` (fewer seeds to fit the time budget; the
   output says so).
5. **Statistics** — mean and 95 % t-interval over seeds (:func:`attnprune.runs.stats.aggregate_seeds`),
   paired comparisons against ``full`` (:func:`attnprune.runs.stats.compare_predictions`: McNemar,
   DeLong, paired bootstrap, Holm, non-inferiority with margin 0.01), pooled over seeds and per
   seed.

Runs are spread over ``workers`` processes (one torch thread each: the model is so small that
two processes use two cores far better than two threads in one). Each finished run writes its
checkpoint (safetensors), predictions and its ``runs/<key>.json`` marker, so an interrupted
experiment resumes where it stopped.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from sklearn.metrics import roc_auc_score, roc_curve

from attnprune.measure import count_flops, env_info, time_interleaved
from attnprune.research.synthetic.config import SyntheticConfig
from attnprune.research.synthetic.data import DataSpec, make_dataset
from attnprune.research.synthetic.host import FULL, TinyConfig, TinyEncoder
from attnprune.research.synthetic.summary import (
    ablation_summary,
    comparisons_against,
    csv_row,
    format_table,
    method_summary,
    paired_comparisons,
    pool_reliability,
)
from attnprune.research.synthetic.train import TrainConfig, evaluate, train_model
from attnprune.runs import stats
from attnprune.runs.results import ResultsDir, atomic_write_bytes, jsonable
from attnprune.selection import gather_tokens

__all__ = ["RunSpec", "flops_proxy", "latency_proxy", "plan_runs", "run_experiment", "run_one"]


# ----------------------------------------------------------------------------- proxies (App. C)
def flops_proxy(length: float, d: int, keep_ratio: float) -> float:
    """Two-layer attention FLOPs proxy 2(L² + (ρL)²)d (eq. 7)."""
    return 2.0 * (length**2 + (keep_ratio * length) ** 2) * d


def latency_proxy(length: float, base: float = 2.0, alpha: float = 0.02) -> float:
    """The paper's analytic latency model ℓ = ℓ0 + α·L² (§5, App. C), in proxy units.

    The paper applies it to the length of layer 2 only (83.92 at L = 64, 22.48 at L = 32,
    −73.21 %), so it ignores layer 1, which pruning leaves untouched; we report it as defined
    and next to the measured wall time.
    """
    return base + alpha * length**2


# ----------------------------------------------------------------------------- one run
@dataclass(frozen=True)
class RunSpec:
    """One training run: ``label`` names it in tables; ``key`` is its resume marker."""

    key: str
    label: str
    group: str  # "main" or the ablation name
    method: str
    seed: int
    keep_ratio: float
    noise: float
    idf: bool


@lru_cache(maxsize=8)
def _dataset(seed: int, spec: DataSpec):
    return make_dataset(seed, spec)


def build_model(cfg: SyntheticConfig, run: RunSpec, data) -> TinyEncoder:
    """The run's model, its initial weights drawn from torch seeded with the run's seed."""
    torch.manual_seed(run.seed)
    tcfg = TinyConfig(vocab=cfg.vocab, d_model=cfg.d_model, n_classes=2, method=run.method,
                      keep_ratio=run.keep_ratio, residual=cfg.residual,
                      method_options=cfg.method_options(run.method))
    return TinyEncoder(tcfg, data.embeddings, data.weights)


def _calibration(probs: np.ndarray, y: np.ndarray, n_bins: int) -> dict:
    """ECE and reliability bins on all rows; temperature fitted on the first half of the rows,
    ECE before/after it on the second half (so the fit is not scored on its own data)."""
    rel = stats.reliability_diagram(probs, y, n_bins)
    half = len(y) // 2
    logits = np.log(np.clip(probs, 1e-12, 1.0))  # softmax(log p) = p: logits up to a constant
    out = {
        "ece": stats.expected_calibration_error(probs, y, n_bins),
        "reliability": {"confidence": rel.confidence, "accuracy": rel.accuracy,
                        "count": rel.count},
    }
    if half >= 2 and len(np.unique(y[:half])) == 2:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # T on a bound: reported as is
            T = stats.fit_temperature(logits[:half], y[:half])
        z = logits[half:] / T
        p_t = np.exp(z - z.max(1, keepdims=True))
        p_t /= p_t.sum(1, keepdims=True)
        out.update(temperature=T,
                   ece_heldout=stats.expected_calibration_error(probs[half:], y[half:], n_bins),
                   ece_heldout_temp=stats.expected_calibration_error(p_t, y[half:], n_bins))
    return out


def _signal_auc(scores: np.ndarray, signal: np.ndarray) -> float:
    """How well the gate's scores rank the true signal positions (ROC-AUC over all tokens)."""
    s, t = scores.reshape(-1), signal.reshape(-1)
    if t.all() or not t.any():
        return float("nan")
    return float(roc_auc_score(t, s))


def run_one(cfg: SyntheticConfig, run: RunSpec) -> tuple[dict, dict[str, np.ndarray], dict]:
    """Train and evaluate one run → (record, float32 state dict, predictions)."""
    t0, c0 = time.perf_counter(), time.process_time()
    data = _dataset(run.seed, cfg.data_spec(noise=run.noise, idf=run.idf))
    tr, va = data.train, data.val
    T = torch.as_tensor
    model = build_model(cfg, run, data)
    tcfg = TrainConfig(cfg.epochs, cfg.batch_size, cfg.lr, cfg.weight_decay, cfg.precision)
    history = train_model(model, T(tr.tokens), T(tr.labels), T(va.tokens), T(va.labels),
                          tcfg, run.seed)
    torch.manual_seed(run.seed + 10_000)  # the random gate's draw at evaluation
    final, out = evaluate(model, T(va.tokens), T(va.labels))
    probs = out.logits.float().softmax(-1).numpy().astype(np.float64)  # (N, 2)
    y = va.labels
    keep = out.keep.numpy()  # (N, L)
    record = {
        **asdict(run),
        "accuracy": final["accuracy"], "auc": final["auc"], "val_loss": final["loss"],
        "kept": float(keep.sum(1).mean()), "kept_ratio": float(keep.sum(1).mean() / cfg.length),
        # share of true signal positions (tokens of S_y) that reached Attention-2
        "oracle_overlap": float(keep[va.signal].mean()) if va.signal.any() else float("nan"),
        "flip_kept": float(keep[va.flip].mean()) if va.flip.any() else float("nan"),
        "history": history,
        "classifier": _calibration(probs, y, cfg.n_bins),
    }
    if out.scores is not None:
        record["signal_auc"] = _signal_auc(out.scores.float().numpy(), va.signal)
    if out.gate_probs is not None:  # the entropy head: every token predicts the sequence label
        gp = out.gate_probs.float().numpy().reshape(-1, 2).astype(np.float64)
        gy = np.repeat(y, cfg.length)
        record["gate"] = _calibration(gp, gy, cfg.n_bins)
        sig = va.signal.reshape(-1)
        if sig.any():  # the head on the signal tokens alone: is it confident where it matters?
            record["gate"]["ece_signal_tokens"] = stats.expected_calibration_error(
                gp[sig], gy[sig], cfg.n_bins)
    record["seconds"] = time.perf_counter() - t0
    record["cpu_seconds"] = time.process_time() - c0  # CPU of this run (one thread per process)
    state = {k: v.detach().float().numpy().copy() for k, v in model.state_dict().items()}
    preds = {"y_true": y, "y_pred": probs.argmax(1), "scores": probs[:, 1]}
    return record, state, preds


def _worker_init(threads: int, parent: int | None = None) -> None:
    """A training worker: ``threads`` torch threads; Ctrl-C left to the parent; dies with it.

    A terminal's Ctrl-C reaches every process of the foreground group. A worker that took it
    as KeyboardInterrupt would fail its current run and go on with the next one (the pool
    keeps feeding it) while the parent waits for them all: the parent alone decides, and
    stops the workers itself (:func:`_run_pool`). If the parent dies without that (killed),
    Linux's parent-death signal ends the worker instead of leaving it running as an orphan."""
    import signal
    import sys

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if parent is not None and sys.platform.startswith("linux"):
        import ctypes
        import os

        PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the prctl: nothing would signal
            os._exit(1)
    torch.set_num_threads(threads)


def _run_to_file(cfg: SyntheticConfig, run: RunSpec, scratch: str) -> str:
    """In a worker: :func:`run_one`, its outputs written to one safetensors file in the
    private folder ``scratch`` (state as ``state.*``, predictions as ``preds.*``, the record as
    JSON metadata); returns the file's path.

    The pool's reply is then a few hundred bytes, one pipe write that the kernel makes atomic
    (≤ ``PIPE_BUF``). A state dict sent through the pipe takes many writes: a worker terminated
    after a Ctrl-C while sending one left half a message in the pipe, the pool's manager thread
    waited forever for the rest, and the interpreter's exit (which joins that thread) hung."""
    from safetensors.numpy import save

    record, state, preds = run_one(cfg, run)
    arrays = {**{f"state.{k}": np.ascontiguousarray(v) for k, v in state.items()},
              **{f"preds.{k}": np.ascontiguousarray(v) for k, v in preds.items()}}
    path = Path(scratch) / f"{os.getpid()}-{time.monotonic_ns()}.safetensors"
    atomic_write_bytes(path, save(arrays, metadata={"record": json.dumps(jsonable(record))}))
    return str(path)


def _read_run_file(path: str) -> tuple[dict, dict[str, np.ndarray], dict]:
    """What :func:`_run_to_file` wrote → (record, state, predictions); the file is removed."""
    from safetensors import safe_open

    with safe_open(path, framework="np") as f:
        record = json.loads(f.metadata()["record"])
        arrays = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (not a dict)
    os.unlink(path)
    state = {k.removeprefix("state."): v for k, v in arrays.items() if k.startswith("state.")}
    preds = {k.removeprefix("preds."): v for k, v in arrays.items() if k.startswith("preds.")}
    return record, state, preds


def _run_pool(cfg: SyntheticConfig, todo: list[RunSpec], done: Callable[..., None]) -> None:
    """Every run of ``todo`` in ``cfg.workers`` spawned processes, ``done(run, record, state,
    preds)`` called in this process as each finishes (in any order).

    On any exception here (KeyboardInterrupt: one Ctrl-C) the runs that finished are still
    handed to ``done`` (so saved), the queued ones cancelled and the workers terminated before
    the exception goes on: ``ProcessPoolExecutor``'s own exit would wait for every queued run.
    Workers hand their outputs over in a file (:func:`_run_to_file`), so terminating one never
    cuts a message in the pipe."""
    import shutil
    import tempfile

    ctx = multiprocessing.get_context("spawn")  # fork after torch has started threads is unsafe
    before = set(multiprocessing.active_children())
    scratch = tempfile.mkdtemp(prefix="attnprune-synthetic-")
    pool = ProcessPoolExecutor(min(cfg.workers, len(todo)), mp_context=ctx,
                               initializer=_worker_init, initargs=(cfg.threads, os.getpid()))
    futures = {}
    handed = set()
    try:
        futures = {pool.submit(_run_to_file, cfg, r, scratch): r for r in todo}
        for fut in as_completed(futures):
            handed.add(fut)
            done(futures[fut], *_read_run_file(fut.result()))
    except BaseException:
        # the pool cancels its queued runs itself (a future cancelled here would make its
        # manager thread fail when the terminated workers break the pool, CPython 3.11)
        pool.shutdown(wait=False, cancel_futures=True)
        workers = [p for p in multiprocessing.active_children() if p not in before]
        for fut, run in futures.items():  # finished meanwhile: saved too
            if fut not in handed and fut.done() and not fut.cancelled() and fut.exception() is None:
                done(run, *_read_run_file(fut.result()))
        for p in workers:
            p.terminate()
        for p in workers:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(scratch, ignore_errors=True)


# ----------------------------------------------------------------------------- the plan
def plan_runs(cfg: SyntheticConfig) -> list[RunSpec]:
    """Every run of the experiment, main grid first; ablation runs that coincide with a main
    run (same method, seed, ρ, noise, IDF) are not repeated."""
    runs: dict[tuple, RunSpec] = {}

    def add(group: str, label: str, method: str, seed: int, keep_ratio: float | None = None,
            noise: float | None = None, idf: bool | None = None) -> None:
        rho = cfg.keep_ratio if keep_ratio is None else keep_ratio
        noise = cfg.noise if noise is None else noise
        idf = cfg.idf if idf is None else idf
        if method == FULL:
            rho = 1.0
        ident = (method, seed, rho, noise, idf)
        if ident in runs:
            return
        key = f"{group}/{label}/seed{seed}"
        runs[ident] = RunSpec(key, label, group, method, seed, rho, noise, idf)

    for seed in cfg.seeds:
        for m in cfg.methods:
            add("main", m, m, seed)
    if cfg.ablations:
        for seed in cfg.ablation_seeds:
            for rho in cfg.ablation_keep_ratios:
                add("keep_ratio", f"entropy@rho={rho:g}", "entropy", seed, keep_ratio=rho)
            for m in cfg.ablation_idf_methods:
                add("idf", f"{m}{'-idf' if cfg.idf else '+idf'}", m, seed, idf=not cfg.idf)
            for noise in cfg.ablation_noise:
                for m in cfg.ablation_noise_methods:
                    add("noise", f"{m}@noise={noise:g}", m, seed, noise=noise)
    return list(runs.values())


# ----------------------------------------------------------------------------- efficiency
def measure_efficiency(cfg: SyntheticConfig, results: ResultsDir, runs: list[RunSpec],
                       progress: Callable[[str], None] | None = None) -> dict:
    """FLOPs and wall time of each main method's trained model (first seed), full and pruned
    measured in this process.

    FLOPs are counted over the whole validation set in batches of ``timing_batch`` rows (the
    evaluation batch), so a variable-budget gate pays for the padding of each batch; wall time
    is the median of ``timing_repeats`` forwards of the first such batch, every model and gate
    timed round-robin (:func:`attnprune.measure.time_interleaved`).
    """
    seed = cfg.seeds[0]
    data = _dataset(seed, cfg.data_spec())
    tokens = torch.as_tensor(data.val.tokens)
    batches = tokens.split(cfg.timing_batch)
    first = batches[0]
    L, d = cfg.length, cfg.d_model
    out: dict = {"seed": seed, "batch": int(first.shape[0]), "rows": int(tokens.shape[0]),
                 "length": L, "d_model": d, "env": env_info(), "methods": {}}
    from safetensors.torch import load_file

    models, calls = {}, {}
    for run in [r for r in runs if r.group == "main" and r.seed == seed]:
        if progress:
            progress(f"counting {run.label}")
        model = build_model(cfg, run, data)
        model.load_state_dict(load_file(str(results.path / _ckpt_name(run.key))))
        model.eval()
        models[run.label] = model
        torch.manual_seed(0)
        counts: list[torch.Tensor] = []  # kept tokens per row, from the counted forwards
        with torch.no_grad():
            flops = sum(count_flops(lambda b=b, m=model, c=counts: c.append(m(b).keep.sum(1)))
                        for b in batches)
        kept = float(torch.cat(counts).float().mean())
        calls[run.label] = lambda m=model: m(first)
        if model.gate is not None:  # the gate's share: scoring + top-k + gather on X⁽¹⁾
            mask = torch.ones(first.shape, dtype=torch.bool)
            with torch.no_grad():
                x1, a1 = model.attn1(model.embeddings[first], mask)

            def gate_call(m=model, x1=x1, a1=a1, mask=mask):
                sel = m.gate(x1, mask, attn=a1[:, None], keep_ratio=m.cfg.keep_ratio)
                return gather_tokens(x1, sel.keep)

            calls["gate:" + run.label] = gate_call
        rho = kept / L
        out["methods"][run.label] = {
            "kept": kept, "kept_ratio": rho,
            "flops_measured": flops,
            "flops_proxy": flops_proxy(L, d, rho),
            "latency_proxy": latency_proxy(kept),
        }
    if progress:
        progress("timing")
    # All models and gates timed round-robin, so load from elsewhere hits them alike.
    with torch.no_grad():
        timings = time_interleaved(calls, cfg.timing_repeats, cfg.timing_warmup)
    for label, m in out["methods"].items():
        timing, gate_t = timings[label], timings.get("gate:" + label)
        m.update({
            "time": timing.as_dict(),
            "gate_time": None if gate_t is None else gate_t.as_dict(),
            "gate_share": None if gate_t is None else gate_t.median_s / timing.median_s,
        })
    full = out["methods"][FULL]
    for m in out["methods"].values():
        m["flops_relative"] = m["flops_measured"] / full["flops_measured"]
        m["flops_proxy_relative"] = m["flops_proxy"] / full["flops_proxy"]
        m["flops_proxy_savings"] = 1.0 - m["flops_proxy_relative"]
        m["latency_proxy_relative"] = m["latency_proxy"] / full["latency_proxy"]
        m["latency_proxy_change_pct"] = 100.0 * (m["latency_proxy_relative"] - 1.0)
        m["time_relative"] = m["time"]["median_s"] / full["time"]["median_s"]
    return out


# ----------------------------------------------------------------------------- driver
def _ckpt_name(key: str) -> str:
    return f"checkpoints/{ResultsDir._key(key)}.safetensors"


def _save_run(results: ResultsDir, run: RunSpec, record: dict, state: dict, preds: dict) -> None:
    from safetensors.numpy import save

    atomic_write_bytes(results.path / _ckpt_name(run.key), save(state))
    results.save_predictions(run.label, run.seed, preds["y_true"], preds["y_pred"],
                             preds["scores"])
    results.save_run(run.key, record)  # last: the marker that the run is complete


def run_experiment(cfg: SyntheticConfig, results: ResultsDir,
                   progress_bar: bool = True, log: Callable[[str], None] = print) -> dict:
    """Run (or resume) the whole experiment into ``results``; returns ``summary.json``'s dict."""
    from tqdm.auto import tqdm

    runs = plan_runs(cfg)
    todo = [r for r in runs if not results.run_done(r.key)]
    if len(todo) < len(runs):
        log(f"resuming: {len(runs) - len(todo)} of {len(runs)} runs already finished")
    t_train = time.perf_counter()
    bar = tqdm(total=len(runs), initial=len(runs) - len(todo), desc="training runs",
               unit="run", disable=not progress_bar, dynamic_ncols=True)
    try:
        if cfg.workers > 0 and len(todo) > 1:
            def done(run, *out):
                _save_run(results, run, *out)
                bar.set_postfix_str(run.key)
                bar.update()

            _run_pool(cfg, todo, done)
        else:
            for run in todo:
                bar.set_postfix_str(run.key)
                _save_run(results, run, *run_one(cfg, run))
                bar.update()
    finally:
        bar.close()  # before an interrupt's message, not after it at exit
    train_seconds = time.perf_counter() - t_train
    records = [results.load_run(r.key) for r in runs]

    log(f"measuring FLOPs and wall time of the {len(cfg.methods)} main models (seed "
        f"{cfg.seeds[0]}, batches of {cfg.timing_batch})")
    eff = measure_efficiency(cfg, results, runs)
    results.write_json("efficiency.json", eff)
    log("paired comparisons, figures and report")

    main = [r for r in records if r["group"] == "main"]
    labels = [m for m in cfg.methods]
    methods = {m: method_summary([r for r in main if r["label"] == m], eff["methods"].get(m))
               for m in labels}
    comps, comps_seed, pooled = paired_comparisons(results, cfg, labels)
    summary = {
        "command": "reproduce synthetic",
        "env": env_info(),
        "config": {"seeds": list(cfg.seeds), "keep_ratio": cfg.keep_ratio, "noise": cfg.noise,
                   "idf": cfg.idf, "epochs": cfg.epochs, "length": cfg.length,
                   "d_model": cfg.d_model, "workers": cfg.workers, "threads": cfg.threads,
                   "precision": cfg.precision,
                   # what "auto" resolved to on this machine (the table's title shows it)
                   "precision_used": "bf16" if TrainConfig(precision=cfg.precision).use_bf16()
                   else "fp32"},
        "methods": methods,
        "comparisons": comps,
        "comparisons_per_seed": comps_seed,
        # same budget, different scorer: is the entropy gate better than attention mass?
        "comparisons_vs_attention_mass": comparisons_against(pooled, "attention_mass", cfg),
        "efficiency": {m: {k: v for k, v in e.items() if k not in ("time", "gate_time")}
                       for m, e in eff["methods"].items()},
        "ablations": ablation_summary(cfg, records) if cfg.ablations else None,
        "train_seconds": train_seconds,
        "reliability": {m: {"classifier": pool_reliability([r for r in main if r["label"] == m],
                                                            "classifier"),
                            "gate": pool_reliability([r for r in main if r["label"] == m],
                                                      "gate")}
                        for m in labels},
    }
    # Pooled ROC arrays (fpr; tpr) of every main method, as the paper's "ROC arrays".
    for m in labels:
        y = np.concatenate([np.load(results.path / "predictions" /
                                    f"{results._key(m)}__seed{s}.npz")["y_true"]
                            for s in cfg.seeds])
        sc = np.concatenate([np.load(results.path / "predictions" /
                                     f"{results._key(m)}__seed{s}.npz")["scores"]
                             for s in cfg.seeds])
        if len(np.unique(y)) == 2:
            fpr, tpr, _ = roc_curve(y, sc)
            results.write_npy(f"roc_{results._key(m)}.npy", np.stack([fpr, tpr]))
    results.write_csv("metrics.csv", [csv_row(r) for r in records])
    results.write_json("summary.json", summary)
    from attnprune.research.synthetic.figures import make_figures

    make_figures(results, summary, records)
    results.write_text("table.txt", format_table(summary) + "\n")
    return summary
