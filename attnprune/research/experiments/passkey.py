"""Passkey retrieval on a tiny Llama trained here: the long-prompt quality test of issue 25.

The task (after Mohtashami & Jaggi 2023, "Landmark attention", §4.2, passkey retrieval), with
a synthetic vocabulary so that it needs no tokenizer and no download:

    BOS  f f f … f  KEY d₁ … d_D  f f … f  QUERY  →  d₁ … d_D

f are filler tokens drawn uniformly, d digits, KEY / QUERY markers; the key sits at a uniform
position of the prompt. A model that answers must attend from QUERY back to the key across
the whole prompt, so a pruning that drops a key token costs the answer: retrieval accuracy
(all D digits right, greedy) against the kept fraction is the quality side of the TTFT table.

Vocabulary: 0 BOS / pad, 1 KEY, 2 QUERY, 3 … 12 the digits, 13 … V−1 filler.

Training (:func:`train`): the LM loss on the answer digits only, prompts of random length in
[``min_len``, ``max_len``] (the upper end growing over the first half of training; RoPE does not extrapolate far past the trained lengths: evaluate
at lengths ≤ ``max_len``), AdamW. ``device`` "cuda" trains on a GPU (bf16 autocast, fused AdamW; the weights stay
fp32 and evaluation runs on the CPU); ``batch_tokens`` makes a step hold about that many prompt
tokens (more prompts per step at short lengths); ``budget_s`` bounds the training's wall time:
the schedule (warm-up, cosine, curriculum) runs on the larger of the step and the time
fraction, so a slow device ends early with a fully decayed learning rate rather than being
killed mid-schedule. ``train_only`` saves the weights (``model.safetensors``), ``config.json``
and ``train.json`` (losses, steps done, a quick unpruned check at each evaluation length on
the training device) and skips the evaluation grid: ``scripts/gpu/train_passkey.sh`` trains 3 seeds
at prompts up to 2,048 tokens on one GPU that way.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn

BOS, KEY, QUERY, DIGIT0, FILLER0 = 0, 1, 2, 3, 13


@dataclass(frozen=True)
class PasskeyConfig:
    """The task, the tiny model, its training and the evaluation grid. Defaults: the first
    recipe that learned the task on the 2-core CPU (2 digits, prompts up to 192, 2,500 steps of
    32: about 8 minutes at 1 thread; training loss < 1e-3 by step 600)."""

    digits: int = 2
    vocab: int = 64
    width: int = 96
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 256
    min_len: int = 24
    max_len: int = 192
    steps: int = 2500
    batch: int = 32
    lr: float = 2e-3
    seed: int = 0
    # evaluation: prompts per length, lengths (0 = max_len), the pruning grid
    eval_n: int = 128
    eval_lengths: tuple[int, ...] = (0,)
    keeps: tuple[float, ...] = (0.25, 0.5, 0.75)
    methods: tuple[str, ...] = ("fastv", "gemfilter")
    layer: int = 1
    window: int = 4
    sinks: int = 1
    threads: int = 1
    init: str = ""  # a model.safetensors of an earlier run: evaluate it instead of training
    random_control: bool = True  # also each (method, keep) with random scores
    device: str = "auto"  # training device: auto (cuda if available) | cpu | cuda
    batch_tokens: int = 0  # > 0: a step holds max(batch, batch_tokens // length) prompts
    budget_s: float = 0.0  # > 0: the training schedule also ends after this many seconds
    train_only: bool = False  # train, save weights + config.json + train.json; no eval grid
    check_n: int = 256  # train_only: prompts of the quick unpruned check per eval length
    models: str = ""  # a folder of seed<N>/ (train_only output): evaluate them all (CPU) and pool
    seeds: tuple[int, ...] = ()  # models: only these seed<N>/ (empty: all)
    ttft_repeats: int = 7  # models: interleaved TTFT rounds at the longest eval length (0: none)
    ttft_clock: str = "cpu"  # models: TTFT clock, cpu (process time) | wall

    def __post_init__(self):
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device: auto, cpu or cuda, got {self.device!r}")
        if self.ttft_clock not in ("cpu", "wall"):
            raise ValueError(f"ttft_clock: cpu or wall, got {self.ttft_clock!r}")
        if self.batch_tokens < 0 or self.budget_s < 0 or self.check_n < 0:
            raise ValueError("batch_tokens / budget_s / check_n: must be ≥ 0, got "
                             f"{self.batch_tokens} / {self.budget_s} / {self.check_n}")
        if self.vocab <= FILLER0 + 1:
            raise ValueError(f"vocab: must leave filler tokens above {FILLER0}, got {self.vocab}")
        if not 0 < self.digits < self.min_len // 2:
            raise ValueError(f"digits: must be in 1..{self.min_len // 2 - 1}, got {self.digits}")


def passkey_batch(n: int, length: int, digits: int, vocab: int,
                  generator: torch.Generator | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(prompts (n, length), answers (n, digits), key slots (n,)): each prompt ends with QUERY;
    the key block KEY d₁ … d_D starts at a uniform slot in 1 … length − D − 2."""
    g = generator
    ids = torch.randint(FILLER0, vocab, (n, length), generator=g)
    ids[:, 0], ids[:, -1] = BOS, QUERY
    answers = torch.randint(0, 10, (n, digits), generator=g) + DIGIT0
    start = torch.randint(1, length - digits - 1, (n,), generator=g)  # KEY slot
    rows = torch.arange(n)
    ids[rows, start] = KEY
    for i in range(digits):
        ids[rows, start + 1 + i] = answers[:, i]
    return ids, answers, start


def build_model(cfg: PasskeyConfig) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(cfg.seed)
    conf = LlamaConfig(vocab_size=cfg.vocab, hidden_size=cfg.width, intermediate_size=cfg.ffn,
                       num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads,
                       num_key_value_heads=cfg.kv_heads, max_position_embeddings=4096,
                       bos_token_id=BOS, eos_token_id=None, pad_token_id=BOS,
                       attn_implementation="sdpa")
    return LlamaForCausalLM(conf)


def training_device(cfg: PasskeyConfig) -> torch.device:
    """The device ``cfg.device`` names ("auto": cuda when available; "cuda" without one:
    RuntimeError)."""
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device: cuda asked for, but torch sees no CUDA device")
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(cfg.device)


def _autocast(device: torch.device):
    import contextlib

    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def train(cfg: PasskeyConfig, progress=print, log: list | None = None, checkpoint=None) -> nn.Module:
    """A tiny Llama trained on passkey prompts (loss on the answer digits only), on
    :func:`training_device`; returned on the CPU, fp32, in eval mode. ``log`` (a list) gets a
    dict per logged step; ``checkpoint(model)`` is called once the schedule passes 50 % and
    80 % (a fallback should the process be killed before the end)."""
    device = training_device(cfg)
    model = build_model(cfg).to(device).train()
    g = torch.Generator().manual_seed(cfg.seed)
    fused = {"fused": True} if device.type == "cuda" else {}
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0, **fused)
    warm = max(1, cfg.steps // 20)
    t0, marks = time.perf_counter(), [0.5, 0.8]
    done, loss, L = 0, None, 0
    for step in range(cfg.steps):
        # schedule position: the step fraction, or the time fraction when a budget runs out first
        tf = (time.perf_counter() - t0) / cfg.budget_s if cfg.budget_s else 0.0
        if tf >= 1.0 and step:  # at least one step
            break
        tf = min(tf, 1.0)
        if tf * cfg.steps > step:  # time-driven: the same formulas at a fractional step
            s_, s1 = tf * cfg.steps, tf * cfg.steps + 1
        else:
            s_, s1 = step, step + 1
        lr = cfg.lr * min(1.0, s1 / warm) * 0.5 * (1 + math.cos(math.pi * s_ / cfg.steps))
        for group in opt.param_groups:
            group["lr"] = lr
        # curriculum: the longest prompt grows from min_len to max_len over the first half
        top = cfg.min_len + int((cfg.max_len - cfg.min_len) * min(1.0, 2 * s1 / cfg.steps))
        L = int(torch.randint(cfg.min_len, top + 1, (1,), generator=g))
        n = max(cfg.batch, cfg.batch_tokens // L) if cfg.batch_tokens else cfg.batch
        prompts, answers, _ = passkey_batch(n, L, cfg.digits, cfg.vocab, g)
        x = torch.cat([prompts, answers], 1)
        labels = torch.full_like(x, -100)
        labels[:, L:] = answers  # HF shifts: position L−1 (QUERY) predicts d₁
        x, labels = x.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        with _autocast(device):
            loss = model(x, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        done = step + 1
        if step % 100 == 0 or step == cfg.steps - 1:
            value = loss.item()
            if log is not None:
                log.append({"step": step, "length": L, "batch": n, "loss": value, "lr": lr,
                            "elapsed_s": round(time.perf_counter() - t0, 2)})
            if progress:
                progress(f"step {step} L {L} loss {value:.4f}"
                         + (f" batch {n} lr {lr:.2e} {time.perf_counter() - t0:.1f}s"
                            if cfg.batch_tokens or cfg.budget_s or device.type != "cpu" else ""))
        if checkpoint is not None and marks and max(s1 / cfg.steps, tf) >= marks[0]:
            marks.pop(0)
            checkpoint(model)
    if log is not None:
        if loss is not None and (done - 1) % 100 and done != cfg.steps:  # the last step, if unlogged
            log.append({"step": done - 1, "length": L, "loss": loss.item(),
                        "elapsed_s": round(time.perf_counter() - t0, 2)})
        log.append({"steps_done": done, "elapsed_s": round(time.perf_counter() - t0, 2),
                    "device": str(device)})
    return model.float().cpu().eval()


@torch.inference_mode()
def quick_check(model: nn.Module, cfg: PasskeyConfig, length: int, n: int = 256, batch: int = 64,
                device: str | torch.device = "cpu", seed: int = 1) -> float:
    """Unpruned retrieval accuracy in one teacher-forced forward per batch, on ``device``:
    all D digits are the argmax at the D answer positions (the same as greedy decoding
    retrieving them all: each greedy step then sees the true digits)."""
    model = model.to(device)
    g = torch.Generator().manual_seed(seed)
    right = 0
    for lo in range(0, n, batch):
        prompts, answers, _ = passkey_batch(min(batch, n - lo), length, cfg.digits, cfg.vocab, g)
        x = torch.cat([prompts, answers[:, :-1]], 1).to(device)
        with _autocast(torch.device(device)):
            logits = model(x, logits_to_keep=cfg.digits).logits
        right += int((logits.argmax(-1).cpu() == answers).all(1).sum())
    return right / n if n else float("nan")


@torch.inference_mode()
def evaluate(model: nn.Module, cfg: PasskeyConfig, length: int, n: int = 64, seed: int = 1,
             batch: int = 16, **prefill_options) -> dict:
    """``{"right": per-prompt bool list, "accuracy", "key_kept"}``: whether all D digits were
    retrieved (greedy) and the share of prompts whose D digits the pruned layers all kept. ``prefill_options``: :class:`attnprune.prefill.PrefillConfig` fields
    (none: unpruned). The same ``seed`` gives the same prompts, so variants pair up."""
    from attnprune.prefill import generate

    g = torch.Generator().manual_seed(seed)
    right, key_kept = [], 0
    for lo in range(0, n, batch):
        prompts, answers, start = passkey_batch(min(batch, n - lo), length, cfg.digits, cfg.vocab, g)
        out = generate(model, prompts, max_new_tokens=cfg.digits, **(prefill_options or {"keep": 1.0}))
        right += (out.tokens == answers).all(1).tolist()
        block = start[:, None] + 1 + torch.arange(cfg.digits)  # the digits d₁ … d_D
        key_kept += int(torch.gather(out.kept, 1, block).all(1).sum())
    return {"right": right, "accuracy": sum(right) / n, "key_kept": key_kept / n}


def accuracy(model: nn.Module, cfg: PasskeyConfig, length: int, n: int = 64, seed: int = 1,
             batch: int = 16, **prefill_options) -> float:
    """Share of prompts whose D digits are all retrieved (see :func:`evaluate`)."""
    return evaluate(model, cfg, length, n, seed, batch, **prefill_options)["accuracy"]


def run(cfg: PasskeyConfig, out, progress=print) -> dict:
    """Train the model, evaluate unpruned and every (method, keep) of the grid at each length
    on the same prompts; write ``summary.json`` (accuracy with its Wilson 95 % interval, the
    share of prompts whose key block was kept, the McNemar test against unpruned) and the
    weights (``model.safetensors``) into the results folder ``out``; with ``train_only``,
    :func:`train_and_save` instead."""
    from attnprune.measure import env_info

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if cfg.train_only:
        return train_and_save(cfg, out, progress)
    if cfg.models:
        return evaluate_seeds(cfg, out, progress)
    model = load_model(cfg, cfg.init) if cfg.init else train(cfg, progress)
    save_model(model, out.path / "model.safetensors")
    rows = grid(model, cfg, progress)
    for r in rows:
        del r["right"]
    summary = {"command": "passkey", "env": env_info(), "rows": rows}
    out.write_json("summary.json", summary)
    return summary


def grid(model: nn.Module, cfg: PasskeyConfig, progress=print) -> list[dict]:
    """Unpruned and every (method, keep) of the grid (and the random control) at each length,
    on the same prompts: one row each, with the per-prompt ``right`` list."""
    from attnprune.runs.stats import mcnemar, wilson_ci

    progress = progress or (lambda *_: None)
    rows = []
    for L in [x or cfg.max_len for x in cfg.eval_lengths]:
        full = evaluate(model, cfg, L, cfg.eval_n)
        variants = {"unpruned": (full, {})}
        for score in ("attention", "random") if cfg.random_control else ("attention",):
            for m in cfg.methods:
                for k in cfg.keeps:
                    opts = {"keep": float(k), "method": m, "layer": cfg.layer, "window": cfg.window,
                            "sinks": cfg.sinks, "score": score}
                    label = f"{m} {k:g}" + (" random" if score == "random" else "")
                    variants[label] = (evaluate(model, cfg, L, cfg.eval_n, **opts), opts)
        for label, (r, opts) in variants.items():
            ci = wilson_ci(sum(r["right"]), cfg.eval_n)
            b = sum(a and not c for a, c in zip(full["right"], r["right"]))  # lost by pruning
            c = sum(c and not a for a, c in zip(full["right"], r["right"]))  # gained
            p = mcnemar(b, c).pvalue if label != "unpruned" else None
            rows.append({"length": L, "variant": label, "options": opts, "accuracy": r["accuracy"],
                         "ci95": [ci.low, ci.high], "key_kept": r["key_kept"],
                         "diff_vs_unpruned": r["accuracy"] - full["accuracy"], "mcnemar_p": p,
                         "right": r["right"]})
            progress(f"L {L} {label:<16} accuracy {r['accuracy']:.3f} [{ci.low:.3f}, {ci.high:.3f}] "
                     f"key kept {r['key_kept']:.3f}")
    return rows


def _grid_labels(cfg: PasskeyConfig) -> list[tuple[int, str]]:
    """The (length, variant) pairs :func:`grid` computes, in its order."""
    labels = ["unpruned"] + [f"{m} {k:g}" + r for r in ("", " random")[:1 + cfg.random_control]
                             for m in cfg.methods for k in cfg.keeps]
    return [(x or cfg.max_len, v) for x in cfg.eval_lengths for v in labels]


def ttft(model: nn.Module, cfg: PasskeyConfig, length: int, seed: int = 2) -> list[dict]:
    """Time to first token of one passkey prompt of ``length`` (batch 1), unpruned
    (``model(ids, use_cache=True, logits_to_keep=1)``) and every (method, keep) of the grid:
    :func:`attnprune.measure.time_interleaved` (``ttft_repeats`` rounds, 1 warm-up,
    ``ttft_clock``), median and the ratio unpruned / variant; FLOPs relative to unpruned."""
    from attnprune.measure import count_flops, time_interleaved
    from attnprune.prefill import prefill

    ids = passkey_batch(1, length, cfg.digits, cfg.vocab, torch.Generator().manual_seed(seed))[0]

    def stock():
        with torch.inference_mode():
            return model(ids, use_cache=True, logits_to_keep=1).logits

    fns = {"unpruned": stock}
    for m in cfg.methods:
        for k in cfg.keeps:
            opts = {"keep": float(k), "method": m, "layer": cfg.layer, "window": cfg.window,
                    "sinks": cfg.sinks}
            fns[f"{m} {k:g}"] = lambda opts=opts: prefill(model, ids, **opts).logits
    clock = time.process_time if cfg.ttft_clock == "cpu" else time.perf_counter
    timings = time_interleaved(fns, repeats=cfg.ttft_repeats, warmup=1, clock=clock)
    flops = {label: count_flops(fn) for label, fn in fns.items()}
    ref = timings["unpruned"].median_s
    return [{"length": length, "variant": label, "median_ms": t.median_s * 1e3, "mad_ms": t.mad_s * 1e3,
             "speedup": ref / t.median_s, "flops_relative": flops[label] / flops["unpruned"],
             "times_ms": [x * 1e3 for x in t.times_s]} for label, t in timings.items()]


def pooled_difference(right: list[bool], full: list[bool], n_resamples: int = 10_000) -> dict:
    """Pruned − unpruned retrieval over paired prompts (pooled over seeds): Δ, its paired
    percentile-bootstrap 95 % CI (:func:`attnprune.runs.stats.paired_bootstrap_ci`, 10,000
    resamples of the prompts), the discordant counts, the exact McNemar p, and the exact
    (Clopper–Pearson) one-sided 95 % upper bound on the share of prompts lost (b / n), which
    stays informative when no prompt differs and the bootstrap interval is [0, 0]."""
    import numpy as np
    from scipy.stats import beta

    from attnprune.runs.stats import mcnemar, paired_bootstrap_ci

    a, f = np.asarray(right, dtype=int), np.asarray(full, dtype=int)
    n = len(a)
    b, c = int(((f == 1) & (a == 0)).sum()), int(((f == 0) & (a == 1)).sum())
    if b + c:
        r = paired_bootstrap_ci(np.ones(n, dtype=int), a, f, n_resamples=n_resamples, seed=0)
        low, high = float(r.low), float(r.high)
    else:
        low = high = 0.0
    return {"n": n, "diff": float(a.mean() - f.mean()), "ci95": [low, high], "lost": b, "gained": c,
            "mcnemar_p": mcnemar(b, c).pvalue if b + c else 1.0,
            "lost_upper95": float(beta.ppf(0.95, b + 1, n - b)) if b < n else 1.0}


def evaluate_seeds(cfg: PasskeyConfig, out, progress=print) -> dict:
    """``models``: a folder of ``seed<N>/`` subfolders as ``train_only`` writes them. Each
    model (its shape from its ``config.json``; the evaluation options from ``cfg``) runs the
    grid on the CPU (:func:`grid`, the same prompts for every seed) and the TTFT benchmark at
    the longest evaluation length (:func:`ttft`); ``seed<N>.json`` per seed, and
    ``summary.json`` with each (length, variant) pooled over the seeds
    (:func:`pooled_difference`) and the TTFT ratios (mean and range over the seeds). A
    ``seed<N>.json`` already in ``out`` is reused (its grid; its TTFT if it has one), so the
    seeds' grids can run as separate processes (``seeds``, ``ttft_repeats 0``) and a last run
    over all of them measures TTFT alone on the machine and pools."""
    from pathlib import Path

    from attnprune.measure import env_info

    shape = ("digits", "vocab", "width", "layers", "heads", "kv_heads", "ffn", "min_len", "max_len",
             "seed", "steps", "batch", "batch_tokens", "lr", "budget_s", "device")
    seeds = sorted(Path(cfg.models).glob("seed*/model.safetensors"))
    if cfg.seeds:
        seeds = [p for p in seeds if p.parent.name in {f"seed{n}" for n in cfg.seeds}]
    if not seeds:
        raise FileNotFoundError(f"models: no seed*/model.safetensors under {cfg.models}")
    per_seed = {}
    for path in seeds:
        saved = json.loads((path.parent / "config.json").read_text())
        scfg = PasskeyConfig(**{**asdict(cfg), **{k: saved[k] for k in shape if k in saved}})
        name = path.parent.name
        done = out.read_json(f"{name}.json") if (out.path / f"{name}.json").is_file() else {}
        if done and [(r["length"], r["variant"]) for r in done["rows"]] != _grid_labels(scfg):
            raise ValueError(f"out: {name}.json holds another grid; give a new --out")
        model = load_model(scfg, path)
        if progress:
            progress(f"{name}: {path}" + (" (grid from the earlier run)" if done else ""))
        rows = done["rows"] if done else grid(model, scfg, progress)
        times = done.get("ttft") or []
        if not times and cfg.ttft_repeats:
            times = ttft(model, scfg, max(x or scfg.max_len for x in cfg.eval_lengths))
            if progress:
                for t in times:
                    progress(f"{name} TTFT L {t['length']} {t['variant']:<16} {t['median_ms']:.1f} ms "
                             f"x{t['speedup']:.2f} FLOPs {t['flops_relative']:.3f}")
        train_log = path.parent / "train.json"
        per_seed[name] = {"model": str(path), "config": {k: saved.get(k) for k in shape},
                          "train": json.loads(train_log.read_text()) if train_log.is_file() else None,
                          "rows": rows, "ttft": times}
        out.write_json(f"{name}.json", per_seed[name])
    pooled = []
    first = next(iter(per_seed.values()))
    for r0 in first["rows"]:
        L, label = r0["length"], r0["variant"]
        right, full, accs = [], [], []
        for rec in per_seed.values():
            row = next(r for r in rec["rows"] if r["length"] == L and r["variant"] == label)
            ref = next(r for r in rec["rows"] if r["length"] == L and r["variant"] == "unpruned")
            right += row["right"]
            full += ref["right"]
            accs.append(row["accuracy"])
        d = pooled_difference(right, full)
        pooled.append({"length": L, "variant": label, "options": r0["options"],
                       "accuracy": sum(right) / len(right), "accuracy_per_seed": accs,
                       "key_kept_per_seed": [next(r for r in rec["rows"] if r["length"] == L and
                                                  r["variant"] == label)["key_kept"] for rec in per_seed.values()],
                       **{k: v for k, v in d.items()}})
        if progress:
            progress(f"pooled L {L} {label:<16} accuracy {pooled[-1]['accuracy']:.3f} Δ {d['diff']:+.4f} "
                     f"[{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}] lost {d['lost']} gained {d['gained']}")
    ttft_rows = []
    for t0 in first["ttft"] if all(rec["ttft"] for rec in per_seed.values()) else []:
        sp = [next(t for t in rec["ttft"] if t["variant"] == t0["variant"])["speedup"]
              for rec in per_seed.values()]
        ms = [next(t for t in rec["ttft"] if t["variant"] == t0["variant"])["median_ms"]
              for rec in per_seed.values()]
        ttft_rows.append({"length": t0["length"], "variant": t0["variant"], "speedup_mean": sum(sp) / len(sp),
                          "speedup_per_seed": sp, "median_ms_per_seed": ms,
                          "flops_relative": t0["flops_relative"]})
    summary = {"command": "passkey evaluate_seeds", "env": {**env_info("cpu"), "ttft_clock": cfg.ttft_clock},
               "models": cfg.models, "seeds": list(per_seed), "ci_method":
               "paired percentile bootstrap over the pooled prompts (attnprune.runs.stats.paired_bootstrap_ci, "
               "10,000 resamples); exact McNemar; Clopper-Pearson one-sided 95 % upper bound on the lost share",
               "pooled": pooled, "ttft": ttft_rows}
    out.write_json("summary.json", summary)
    if summary["ttft"]:
        out.save_figure("figure.png", figure(summary))
    out.write_text("table.md", markdown_table(summary) + "\n")
    return summary


def figure(summary: dict):
    """TTFT ratio (unpruned / pruned, at the TTFT length) and pooled retrieval accuracy at
    each evaluation length, against the kept fraction, per method (matplotlib figure)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    methods = sorted({r["options"]["method"] for r in summary["pooled"] if r["options"]})
    colors = dict(zip(methods, ("tab:blue", "tab:orange", "tab:green")))
    for m in methods:
        rows = [t for t in summary["ttft"] if t["variant"].startswith(m + " ")]
        keeps = [float(t["variant"].split()[1]) for t in rows]
        a.plot(keeps, [t["speedup_mean"] for t in rows], "o-", color=colors[m], label=m)
        for k, t in zip(keeps, rows):
            a.plot([k] * len(t["speedup_per_seed"]), t["speedup_per_seed"], ".", color=colors[m], alpha=0.5)
    a.axhline(2.0, color="grey", ls=":", lw=1)
    a.axhline(1.0, color="black", lw=0.8)
    L = summary["ttft"][0]["length"] if summary["ttft"] else "?"
    a.set(xlabel="kept fraction", ylabel="TTFT unpruned / pruned", title=f"time to first token, {L} tokens, CPU 1 thread")
    a.legend()
    lengths = sorted({r["length"] for r in summary["pooled"]})
    styles = dict(zip(lengths, ("o:", "s--", "^-", "v-.")))
    for m in methods:
        for L in lengths:
            rows = [r for r in summary["pooled"] if r["length"] == L and r["options"].get("method") == m
                    and r["options"].get("score", "attention") == "attention"]
            full = next(r for r in summary["pooled"] if r["length"] == L and r["variant"] == "unpruned")
            keeps = [r["options"]["keep"] for r in rows] + [1.0]
            b.plot(keeps, [r["accuracy"] for r in rows] + [full["accuracy"]], styles[L], color=colors[m],
                   label=f"{m} {L}")
    b.set(xlabel="kept fraction", ylabel="retrieval accuracy (3 seeds pooled)", title="passkey retrieval")
    b.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def markdown_table(summary: dict) -> str:
    """The pooled rows (and the TTFT at the TTFT length) as a markdown table."""
    ttft = {t["variant"]: t for t in summary["ttft"]}
    head = ("| prompt | variant | accuracy (pooled) | per seed | Δ vs unpruned [95 % CI] | "
            "lost / gained | lost ≤ (95 %) | McNemar p | TTFT × (per seed) |")
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    tl = summary["ttft"][0]["length"] if summary["ttft"] else None
    for r in summary["pooled"]:
        seeds = " / ".join(f"{x:.3f}" for x in r["accuracy_per_seed"])
        t = ttft.get(r["variant"]) if r["length"] == tl else None
        tt = "" if t is None else (f"{t['speedup_mean']:.2f} (" + " / ".join(f"{x:.2f}" for x in t["speedup_per_seed"]) + ")")
        if r["variant"] == "unpruned":
            lines.append(f"| {r['length']} | unpruned | {r['accuracy']:.3f} | {seeds} | — | — | — | — | {tt} |")
            continue
        lines.append(f"| {r['length']} | {r['variant']} | {r['accuracy']:.3f} | {seeds} | "
                     f"{100 * r['diff']:+.1f} pp [{100 * r['ci95'][0]:+.1f}, {100 * r['ci95'][1]:+.1f}] | "
                     f"{r['lost']} / {r['gained']} | {100 * r['lost_upper95']:.1f} pp | {r['mcnemar_p']:.2g} | {tt} |")
    return "\n".join(lines)


def save_model(model: nn.Module, path) -> None:
    """The weights as ``model.safetensors`` (fp32, CPU), written atomically."""
    import os

    from safetensors.torch import save_file

    tmp = f"{path}.tmp"
    save_file({k: v.detach().float().cpu().contiguous() for k, v in model.state_dict().items()}, tmp)
    os.replace(tmp, path)


def load_model(cfg: PasskeyConfig, path) -> nn.Module:
    """The model of ``cfg`` with the weights of a ``model.safetensors`` (CPU, eval)."""
    from safetensors.torch import load_file

    model = build_model(cfg)
    model.load_state_dict(load_file(str(path)))
    return model.eval()


def train_and_save(cfg: PasskeyConfig, out, progress=print) -> dict:
    """``train_only``: train on :func:`training_device`, write ``model.safetensors``,
    ``config.json`` (the fields of ``cfg``) and ``train.json`` (the loss log, steps done, and
    the quick unpruned check at each evaluation length, on the training device) into ``out``."""
    from attnprune.measure import env_info

    device = training_device(cfg)
    path = out.path / "model.safetensors"
    (out.path / "config.json").write_text(json.dumps(asdict(cfg), indent=2) + "\n")
    log: list = []
    model = train(cfg, progress, log, checkpoint=lambda m: save_model(m, path))
    save_model(model, path)
    check = {}
    for L in [x or cfg.max_len for x in cfg.eval_lengths]:
        check[str(L)] = quick_check(model, cfg, L, cfg.check_n, device=device)
        if progress:
            progress(f"check L {L} unpruned accuracy {check[str(L)]:.3f} (n {cfg.check_n}, {device})")
    model.cpu()
    summary = {"command": "passkey train_only", "env": env_info(device), "log": log,
               "final_loss": next((r["loss"] for r in reversed(log) if "loss" in r), None),
               "steps_done": log[-1]["steps_done"], "train_s": log[-1]["elapsed_s"], "check": check}
    out.write_json("train.json", summary)
    return summary


def main(argv: list[str]) -> int:
    """``python -m attnprune.research.experiments.passkey [--key value ...] --out DIR``."""
    from attnprune.runs.command import run_command

    def body(cfg, out) -> None:
        run(cfg, out)

    return run_command(argv, PasskeyConfig, "passkey", body)


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
