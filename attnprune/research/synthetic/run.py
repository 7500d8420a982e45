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
import math
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
from attnprune.methods import registry
from attnprune.research.synthetic.data import DataSpec, make_dataset
from attnprune.research.synthetic.host import FULL, TinyConfig, TinyEncoder
from attnprune.research.synthetic.train import TrainConfig, evaluate, train_model
from attnprune.runs import stats
from attnprune.runs.results import ResultsDir, _jsonable, atomic_write_bytes
from attnprune.selection import check_keep_ratio, gather_tokens

__all__ = ["METHODS", "RunSpec", "SyntheticConfig", "flops_proxy", "latency_proxy",
           "run_experiment", "run_one"]

METHODS = ("full", "attention_mass", "random", "entropy", "entropy_threshold", "entropy_gumbel")
ENTROPY_METHODS = ("entropy", "entropy_threshold", "entropy_gumbel")


# ----------------------------------------------------------------------------- config
@dataclass(frozen=True)
class SyntheticConfig:
    """Everything ``attnprune reproduce synthetic`` does; defaults are the paper's (App. B)
    and are also written out, with comments, in ``configs/synthetic.yaml``."""

    # data (§3.1–3.2)
    n_train: int = 3000
    n_val: int = 800
    length: int = 64
    vocab: int = 500
    n_signal_tokens: int = 10
    p_signal: float = 0.6
    max_signal: int = 3
    noise: float = 0.15
    d_model: int = 64
    idf: bool = False
    # model and gates (§4)
    methods: tuple[str, ...] = METHODS
    keep_ratio: float = 0.5
    residual: bool = True
    head_weight: float = 1.0
    threshold: float = 0.9
    tau: float = 0.5
    budget_weight: float = 1.0
    # training (§7.1)
    seeds: tuple[int, ...] = (42, 43, 44, 45, 46)
    epochs: int = 12
    batch_size: int = 64
    lr: float = 1e-2
    weight_decay: float = 0.01
    # Training-step precision (see TrainConfig). bf16: the matmuls of the training steps run in
    # bfloat16 (autocast); softmax, gates, losses, optimiser and every evaluation stay float32.
    # "auto" (the default): bf16 where the CPU has native bf16 matmuls (2:19 vs 3:15 for fp32
    # here, same conclusions; README), fp32 elsewhere — emulated bf16 on a CPU without them
    # (e.g. AVX2 only) is slower than fp32, so "bf16" is never a safe default. "fp32" everywhere.
    precision: str = "auto"
    # measurements (§4.5, §9)
    timing_repeats: int = 10
    timing_warmup: int = 2
    timing_batch: int = 128  # rows per measured forward (FLOPs: whole val set in such batches)
    n_bins: int = 10
    n_resamples: int = 10000
    margin: float = 0.01
    # ablations (§8.3)
    ablations: bool = True
    ablation_seeds: tuple[int, ...] = (42, 43)
    ablation_keep_ratios: tuple[float, ...] = (0.3, 0.5, 0.7)
    ablation_noise: tuple[float, ...] = (0.05, 0.15, 0.25, 0.35, 0.45)
    ablation_noise_methods: tuple[str, ...] = ("entropy",)
    ablation_idf_methods: tuple[str, ...] = ("full", "entropy")
    # execution
    workers: int = 2
    threads: int = 1

    def __post_init__(self) -> None:
        check_keep_ratio(self.keep_ratio, "keep_ratio")
        for r in self.ablation_keep_ratios:
            check_keep_ratio(r, "ablation_keep_ratios")
        if self.length < 1:
            raise ValueError(f"length must be ≥ 1, got {self.length}")
        for name in ("n_train", "n_val", "d_model", "epochs", "batch_size", "timing_repeats",
                     "n_bins", "n_resamples", "threads", "n_signal_tokens", "max_signal",
                     "timing_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        for name in ("timing_warmup", "workers"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be ≥ 0, got {getattr(self, name)}")
        for name in ("p_signal", "noise"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {v}")
        for v in self.ablation_noise:
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"ablation_noise must be in [0, 1], got {v}")
        if not self.seeds:
            raise ValueError("seeds must list at least one seed")
        if not self.methods:
            raise ValueError("methods must list at least one method")
        if FULL not in self.methods:
            raise ValueError("methods must include 'full' (every relative number is against it)")
        if len(set(self.methods)) != len(self.methods):
            raise ValueError(f"methods lists a method twice: {list(self.methods)}")
        for field_name in ("methods", "ablation_noise_methods", "ablation_idf_methods"):
            for m in getattr(self, field_name):
                if m != FULL:
                    try:
                        spec = registry.get(m)
                    except ValueError:
                        known = ", ".join([FULL, *registry.list_methods("token")])
                        raise ValueError(f"{field_name}: unknown method {m!r}; known: {known}")
                    if spec.kind != "token":
                        raise ValueError(f"{field_name}: {m!r} is not a token method")
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1] (a share of log C), got {self.threshold}")
        if self.tau <= 0:
            raise ValueError(f"tau must be > 0, got {self.tau}")
        if self.lr <= 0 or not math.isfinite(self.lr):
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.precision not in ("auto", "bf16", "fp32"):
            raise ValueError(f"precision must be 'auto', 'bf16' or 'fp32', got {self.precision!r}")
        for name in ("head_weight", "budget_weight", "weight_decay", "margin"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be ≥ 0, got {getattr(self, name)}")
        DataSpec(**self._data_kwargs())  # vocab vs signal sets etc.

    def _data_kwargs(self) -> dict:
        return {k: getattr(self, k) for k in ("n_train", "n_val", "length", "vocab",
                                              "n_signal_tokens", "p_signal", "max_signal",
                                              "noise", "d_model", "idf")}

    def data_spec(self, **overrides) -> DataSpec:
        return DataSpec(**{**self._data_kwargs(), **overrides})

    def method_options(self, method: str) -> dict:
        """Keywords of each gate from this config (only the ones the method takes)."""
        if method in ENTROPY_METHODS:
            opts = {"head_weight": self.head_weight}
            if method == "entropy_threshold":
                opts["threshold"] = self.threshold
            if method == "entropy_gumbel":
                opts.update(tau=self.tau, budget_weight=self.budget_weight)
            return opts
        return {}


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
    atomic_write_bytes(path, save(arrays, metadata={"record": json.dumps(_jsonable(record))}))
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


def _find(records: list[dict], method: str, seed: int, keep_ratio: float, noise: float,
          idf: bool) -> dict | None:
    for r in records:
        if (r["method"], r["seed"], r["noise"], r["idf"]) == (method, seed, noise, idf) and (
                method == FULL or math.isclose(r["keep_ratio"], keep_ratio)):
            return r
    return None


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


# ----------------------------------------------------------------------------- aggregation
UNIT = (0.0, 1.0)  # the range of proportions, AUC and ECE


def _agg(values: list[float], bounds: tuple[float, float] | None = None) -> dict:
    """Mean, 95 % t-interval over seeds (cut to ``bounds``, the metric's range: 2 seeds gave
    accuracy intervals like [0.037, 1.118]) and per-seed values; one seed → no interval."""
    v = [x for x in values if x is not None and not (isinstance(x, float) and math.isnan(x))]
    if not v:
        return {"mean": None, "ci95": [None, None], "per_seed": list(values)}
    if len(v) == 1:
        return {"mean": float(v[0]), "ci95": [None, None], "per_seed": list(values)}
    return stats.aggregate_seeds(v, bounds=bounds)


def _pool_reliability(recs: list[dict], part: str) -> dict | None:
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


def _method_summary(recs: list[dict], eff: dict | None) -> dict:
    def col(path):
        vals = []
        for r in recs:
            x = r
            for p in path.split("."):
                x = x.get(p) if isinstance(x, dict) else None
            vals.append(x)
        return vals

    s = {
        "accuracy": _agg(col("accuracy"), UNIT),
        "auc": _agg(col("auc"), UNIT),
        "seeds": [r["seed"] for r in recs],
        "kept_tokens": float(np.mean(col("kept"))),
        "kept_ratio": float(np.mean(col("kept_ratio"))),
        "oracle_overlap": _agg(col("oracle_overlap"), UNIT),
        "flip_kept": _agg(col("flip_kept")),
        "ece": _agg(col("classifier.ece"), UNIT),
        "ece_heldout": _agg(col("classifier.ece_heldout"), UNIT),
        "ece_heldout_temp": _agg(col("classifier.ece_heldout_temp"), UNIT),
        "temperature": _agg(col("classifier.temperature")),
        "val_loss": _agg(col("val_loss")),
    }
    if any("signal_auc" in r for r in recs):
        s["signal_auc"] = _agg(col("signal_auc"), UNIT)
    if any("gate" in r for r in recs):
        s["gate_calibration"] = {
            "ece": _agg(col("gate.ece"), UNIT),
            "ece_heldout": _agg(col("gate.ece_heldout"), UNIT),
            "ece_heldout_temp": _agg(col("gate.ece_heldout_temp"), UNIT),
            "temperature": _agg(col("gate.temperature")),
            "ece_signal_tokens": _agg(col("gate.ece_signal_tokens"), UNIT),
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


def _comparisons(results: ResultsDir, cfg: SyntheticConfig, main_labels: list[str]
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


def _comparisons_vs(pooled: dict, reference: str, cfg: SyntheticConfig) -> list[dict]:
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


def _ablation_summary(cfg: SyntheticConfig, records: list[dict]) -> dict:
    seeds = list(cfg.ablation_seeds)

    def cell(method, keep_ratio=None, noise=None, idf=None):
        rho = cfg.keep_ratio if keep_ratio is None else keep_ratio
        noise = cfg.noise if noise is None else noise
        idf = cfg.idf if idf is None else idf
        recs = [_find(records, method, s, rho, noise, idf) for s in seeds]
        recs = [r for r in recs if r is not None]
        return {"method": method, "keep_ratio": rho if method != FULL else 1.0, "noise": noise,
                "idf": idf, "seeds": [r["seed"] for r in recs],
                "accuracy": _agg([r["accuracy"] for r in recs]),
                "auc": _agg([r["auc"] for r in recs]),
                "oracle_overlap": _agg([r["oracle_overlap"] for r in recs]),
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
    methods = {m: _method_summary([r for r in main if r["label"] == m], eff["methods"].get(m))
               for m in labels}
    comps, comps_seed, pooled = _comparisons(results, cfg, labels)
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
        "comparisons_vs_attention_mass": _comparisons_vs(pooled, "attention_mass", cfg),
        "efficiency": {m: {k: v for k, v in e.items() if k not in ("time", "gate_time")}
                       for m, e in eff["methods"].items()},
        "ablations": _ablation_summary(cfg, records) if cfg.ablations else None,
        "train_seconds": train_seconds,
        "reliability": {m: {"classifier": _pool_reliability([r for r in main if r["label"] == m],
                                                            "classifier"),
                            "gate": _pool_reliability([r for r in main if r["label"] == m],
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
    results.write_csv("metrics.csv", [_csv_row(r) for r in records])
    results.write_json("summary.json", summary)
    from attnprune.research.synthetic.figures import make_figures

    make_figures(results, summary, records)
    results.write_text("table.txt", format_table(summary) + "\n")
    return summary


def _ci(d: dict | None, digits: int = 3) -> str:
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
            f"{lab:<18} {_ci(m['accuracy']):>15} {_ci(m['auc']):>15} {m['kept_tokens']:>5.1f} "
            f"{fl.get('proxy_relative', float('nan')):>10.3f}× {fl.get('relative', float('nan')):>10.3f}× "
            f"{lp.get('relative', float('nan')):>12.3f}× {tm.get('relative', float('nan')):>8.2f}× "
            f"{'' if share is None else f'{100 * share:.0f}%':>5} "
            f"{_ci(m['oracle_overlap']):>15} {_ci(m['ece']):>15}")
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
        line = (f"  {lab:<18} classifier ECE {_ci(m['ece'])}  held-out "
                f"{_ci(m['ece_heldout'])} → {_ci(m['ece_heldout_temp'])}  T {_ci(m['temperature'], 2)}")
        g = m.get("gate_calibration")
        if g:
            line += (f" | entropy head ECE {_ci(g['ece'])} (signal tokens "
                     f"{_ci(g['ece_signal_tokens'])}) → {_ci(g['ece_heldout_temp'])} after T "
                     f"{_ci(g['temperature'], 2)}; signal-ranking AUC {_ci(m.get('signal_auc'))}")
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
                    f"acc {_ci(c['accuracy'])}  AUC {_ci(c['auc'])}  "
                    f"signal kept {_ci(c['oracle_overlap'])}  kept {c['kept_ratio'] or 0:.2f}")
    return "\n".join(lines)


def _csv_row(r: dict) -> dict:
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


def quick_config(**overrides) -> dict:
    """The ``--quick`` smoke settings (seconds, not minutes); still real training."""
    q = {"n_train": 400, "n_val": 200, "epochs": 2, "seeds": (42, 43), "ablation_seeds": (42,),
         "ablation_keep_ratios": (0.3, 0.5), "ablation_noise": (0.15, 0.45),
         "ablation_noise_methods": ("entropy",), "timing_repeats": 3, "timing_warmup": 1,
         "n_resamples": 500, "workers": 0}
    q.update(overrides)
    return q

