"""``attnprune lm``: train / fine-tune / evaluate a causal LM with a method: GPT-2 or a decoder
of the Llama family (Llama, Mistral, Qwen2, Qwen3, Gemma, Gemma2, Phi-3).

    attnprune lm --preset cpu-small --out runs/                          # unpruned baseline
    attnprune lm --preset cpu-small --init runs/lm-…/model.safetensors \\
                 --method dtr --method-options "{sparsity_weight: 0.5}" --out runs/

Offline default: a GPT-2 built from a config and trained from scratch; ``--arch llama`` builds
a Llama of the same depth, width, heads and context instead (RMSNorm, SwiGLU MLP of ⌈8d/3⌉
rounded to 8 so its parameters match GPT-2's 4d MLP, rotary positions, grouped-query
attention with ``n_kv_head`` key/value heads, default n_head/2); ``--model NAME`` loads a hub
checkpoint of any of these families when online. Training follows
``token_pruning_bert_to_gpt2.txt``: AdamW β = (0.9, 0.95), weight decay 0.1, cosine schedule
with warmup, gradient clipping 1.0, gradient accumulation, evaluation every ``eval_every`` steps. Pruning methods are fine-tuned from a
saved baseline (``--init``), in the paper's stages:

    none, ltp, attention methods   one stage: everything trains (LTP jointly, as the paper)
    dtr                            stage 1: the policy on the frozen backbone (REINFORCE);
                                   stage 2 (``stage2_steps`` > 0): the backbone, policy frozen
    hybrid                         stage 1: DTR policy, frozen backbone; stage 2: LTP and the
                                   backbone, policy frozen

A sweep of a method's options (:func:`run_sweep`) trains, for each seed, the unpruned control
for as many steps as the method's stages together and one run per point, all from ``--init``:

    attnprune lm --preset cpu-small --init BASE/model.safetensors --method dtr \
                 --steps 300 --stage2-steps 300 --sweep "{keep_target: [0.4, 0.6, 0.8]}" \
                 --seeds 0,1,2 --out runs/dtr-sweep --exact-out

While a REINFORCE policy trains (DTR, hybrid stage 1) every sequence of a batch is fed
``samples`` times in a row (the method's option, default 4: its leave-one-out baseline).

Checkpoints (safetensors: model, optimizer moments, RNG state; JSON for the rest) are written
at every evaluation; a killed run resumes from the last one when rerun with the same ``--out``.
Results: ``summary.json`` (perplexity, kept ratio per layer, measured and
effective FLOPs, wall time, generation tokens/s, all relative to the unpruned model measured
in the same process), ``history.json``, ``metrics.csv``, figures from :mod:`attnprune.research.lm_figures`.
The trained model is saved twice: ``model.safetensors`` (the weights ``--init`` reads) and
``model/`` (:func:`attnprune.save_pretrained`: the patched model back in one line with
``attnprune.from_pretrained("…/model")``, no pickles).
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from torch import nn
from tqdm.auto import tqdm

from attnprune import api
from attnprune.measure import env_info
from attnprune.research.data.lm_text import LMData, batch, eval_windows, load_lm_text
from attnprune.research.lm_config import ARCHS, PRESETS, LMConfig
from attnprune.research.lm_eval import (
    evaluate,
    generate,
    length_sweep,
    measure_costs,
    random_policy_control,
)
from attnprune.research.lm_model import (
    build_model,
    context_window,
    device_of,
    load_weights,
    method_module,
    save_weights,
)
from attnprune.runs.config import ConfigError, parse_command_line
from attnprune.runs.results import ResultsDir

__all__ = ["ARCHS", "PRESETS", "LMConfig", "build_model", "context_window", "evaluate", "generate",
           "load_teacher", "load_weights", "lr_at", "main", "make_optimizer", "method_module",
           "resolve_device", "run_lm", "run_sweep", "save_weights", "stages"]

# the command's config, defined in lm_config (``attnprune lm --help`` lists its fields)
CONFIG = "attnprune.research.lm_config:LMConfig"


# ----------------------------------------------------------------------------- training stages
def stages(cfg: LMConfig) -> list[dict]:
    """The training stages of ``cfg.method`` (see the module docstring)."""
    if cfg.method in ("dtr", "hybrid"):
        out = [{"name": "policy", "train": "method", "steps": cfg.steps, "lr": cfg.lr,
                "method_stage": 1}]
        n2 = cfg.stage2_steps if cfg.method == "dtr" else (cfg.stage2_steps or cfg.steps)
        if n2:
            out.append({"name": "backbone", "train": "backbone", "steps": n2,
                        "lr": cfg.stage2_lr, "method_stage": 2})
        return out
    return [{"name": "train", "train": "all", "steps": cfg.steps, "lr": cfg.lr, "method_stage": 0}]


def _set_stage(model: nn.Module, stage: dict) -> list[nn.Parameter]:
    """Freeze what the stage does not train; return the trainable parameters."""
    m = method_module(model)
    method_ids = {id(p) for p in m.parameters()} if m is not None else set()
    if m is not None and hasattr(m, "stage") and stage["method_stage"]:
        m.stage = stage["method_stage"]
    frozen_policy = set()
    if m is not None and stage["train"] == "backbone":
        # Hybrid stage 2 trains LTP with the backbone; DTR's policy stays frozen.
        keep = getattr(m, "ltp", None)
        trainable_method = {id(p) for p in keep.parameters()} if keep is not None else set()
        frozen_policy = method_ids - trainable_method
    params = []
    for p in model.parameters():
        if stage["train"] == "all":
            on = True
        elif stage["train"] == "method":
            on = id(p) in method_ids
        else:
            on = id(p) not in frozen_policy
        p.requires_grad_(on)
        if on:
            params.append(p)
    return params


def _train_mode(model: nn.Module, stage: dict) -> None:
    model.train()
    m = method_module(model)
    if m is not None and stage["train"] == "backbone" and not hasattr(m, "stage"):
        m.eval()  # DTR stage 2: the frozen policy decides deterministically (π ≥ 0.5)


def make_optimizer(params, cfg: LMConfig, lr: float) -> torch.optim.AdamW:
    """AdamW β = (0.9, 0.95); weight decay on matrices only (nanoGPT), not biases / LN / τ."""
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(cfg.beta1, cfg.beta2))


def lr_at(step: int, total: int, lr: float, min_lr: float, warmup: int) -> float:
    """Linear warmup, then cosine decay from ``lr`` to ``min_lr``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return min_lr + 0.5 * (1 + math.cos(math.pi * min(1.0, frac))) * (lr - min_lr)


# ----------------------------------------------------------------------------- checkpoints
def _save_checkpoint(folder: Path, model, opt, meta: dict, gen: torch.Generator) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_weights(model, folder / "model.safetensors")
    tensors = {"rng": gen.get_state()}
    for i, st in opt.state_dict()["state"].items():
        for k, v in st.items():
            tensors[f"{i}.{k}"] = torch.as_tensor(v).clone()
    tmp = folder / ".optim.safetensors.tmp"
    save_file(tensors, str(tmp))
    os.replace(tmp, folder / "optim.safetensors")
    ResultsDir(folder).write_json("meta.json", meta)  # written last: marks the checkpoint whole


def _load_checkpoint(folder: Path, model, opt, gen: torch.Generator) -> dict:
    from safetensors.torch import load_file

    load_weights(model, folder / "model.safetensors")
    tensors = load_file(str(folder / "optim.safetensors"))
    gen.set_state(tensors.pop("rng"))
    sd = opt.state_dict()
    state: dict = {}
    for key, v in tensors.items():
        i, k = key.split(".", 1)
        state.setdefault(int(i), {})[k] = v
    sd["state"] = state
    opt.load_state_dict(sd)
    return json.loads((folder / "meta.json").read_text())


# ----------------------------------------------------------------------------- training
def _distilled(ce: torch.Tensor, logits: torch.Tensor, teacher: nn.Module, x: torch.Tensor,
               cfg: LMConfig) -> torch.Tensor:
    """(1 − α)·CE + α·T²·KL(softmax(t/T) ‖ softmax(s/T)), the KL averaged over positions."""
    T, a = cfg.distill_temperature, cfg.distill_weight
    with torch.no_grad():
        t = teacher(x, use_cache=False).logits
    kl = F.kl_div(F.log_softmax(logits / T, -1).flatten(0, 1), F.log_softmax(t / T, -1).flatten(0, 1),
                  log_target=True, reduction="batchmean")
    return (1 - a) * ce + a * T * T * kl


def load_teacher(cfg: LMConfig, vocab_size: int, path: str | Path) -> nn.Module:
    """The frozen unpruned teacher of ``distill_from``: a model of ``cfg``'s config."""
    teacher = build_model(cfg, vocab_size)
    load_weights(teacher, path)
    teacher.eval().requires_grad_(False)
    return teacher


def train(model, data: LMData, cfg: LMConfig, rd: ResultsDir, history: list[dict],
          teacher: nn.Module | None = None) -> list[dict]:
    """Run (or resume) every stage; checkpoints and history at each evaluation. With a
    ``teacher``, the backbone's LM loss is distilled (:func:`_distilled`)."""
    ck = rd.path / "checkpoint"
    vx, vy = eval_windows(data.val, cfg.eval_windows, cfg.context)
    meta = json.loads((ck / "meta.json").read_text()) if (ck / "meta.json").is_file() else None
    all_stages = stages(cfg)
    offset = 0
    for si, stage in enumerate(all_stages):
        params = _set_stage(model, stage)
        opt = make_optimizer(params, cfg, stage["lr"])
        gen = torch.Generator().manual_seed(cfg.seed * 1000 + si)
        step = 0
        if meta is not None:
            if meta["stage"] > si or (meta["stage"] == si and meta["done"]):
                offset += stage["steps"]
                continue
            if meta["stage"] == si:
                meta = _load_checkpoint(ck, model, opt, gen)
                step, history = meta["step"], meta["history"]
        bar = tqdm(range(step, stage["steps"]), desc=f"{cfg.method}:{stage['name']}",
                   initial=step, total=stage["steps"], disable=None, file=sys.stderr)
        _train_mode(model, stage)
        m = method_module(model)
        # A REINFORCE policy compares K sampled masks of the same sequence (DTR's leave-one-out
        # baseline): each sequence is fed K times in a row while the policy trains.
        k = int(getattr(m, "samples", 1)) if stage["train"] == "method" else 1
        for step in bar:
            lr = lr_at(step, stage["steps"], stage["lr"], min(cfg.min_lr, stage["lr"]), cfg.warmup)
            for g in opt.param_groups:
                g["lr"] = lr
            tot_loss = 0.0
            for _ in range(cfg.grad_accum):
                x, _ = batch(data.train, cfg.batch_size, cfg.context, gen)
                x = x.to(device_of(model))
                if k > 1:
                    x = x.repeat_interleave(k, 0)
                # labels=x: HF shifts inside; the hook sees them for the policy's reward.
                out = model(x, labels=x, use_cache=False)
                loss = out.loss
                aux = api.aux_loss(model)
                total = loss if teacher is None else _distilled(loss, out.logits, teacher, x, cfg)
                total = total if aux is None else total + aux
                (total / cfg.grad_accum).backward()
                tot_loss += float(loss.detach()) / cfg.grad_accum
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            done = step + 1
            if done % cfg.eval_every == 0 or done == stage["steps"]:
                ev = evaluate(model, vx, vy)
                _train_mode(model, stage)
                history.append({"step": offset + done, "stage": stage["name"], "train_loss": tot_loss,
                                "val_loss": ev["loss"], "val_perplexity": ev["perplexity"],
                                "kept_per_layer": ev["kept_per_layer"], "lr": lr,
                                **(m.train_stats() if hasattr(m, "train_stats") else {})})
                bar.set_postfix(val=f"{ev['loss']:.3f}", train=f"{tot_loss:.3f}")
                rd.write_json("history.json", history)
                _save_checkpoint(ck, model, opt, {"stage": si, "step": done, "done": done == stage["steps"],
                                                  "history": history}, gen)
        offset += stage["steps"]
    model.eval()
    return history


def resolve_device(device: str) -> torch.device:
    """``device`` of the config: "auto" is CUDA when torch sees a GPU (training, evaluation
    and timing run there; batches are drawn on the CPU and moved), else the CPU."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("device: cuda asked for, but torch sees no CUDA device")
    return torch.device(device)


def run_lm(cfg: LMConfig, out: Path, exact: bool = False) -> Path:
    """The whole ``attnprune lm`` run; returns the results folder."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    data = load_lm_text(cfg.data, cfg.tokenizer)  # errors name ``data`` before any work
    rd = ResultsDir.start(out, "lm", exact, cfg)
    path = rd.path
    if rd.run_done("lm"):
        print(f"already finished: {path}")
        return path
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, data.vocab_size)
    if cfg.init:
        load_weights(model, cfg.init)
    device = resolve_device(cfg.device)
    model.to(device)  # before the patch: the method follows the model's device
    label = "full" if cfg.method == "none" else cfg.method
    baseline_eval = None
    vx, vy = eval_windows(data.val, cfg.eval_windows, cfg.context)
    if cfg.init:  # the unpruned model we start from, measured here for the comparison
        baseline_eval = evaluate(model, vx, vy)
    if cfg.method != "none":
        api.patch(model, cfg.method, **cfg.options)
    history = rd.read_json("history.json") if (rd.path / "history.json").is_file() else []
    teacher = None
    if cfg.distill_weight > 0:
        teacher = load_teacher(cfg, data.vocab_size, cfg.distill_from).to(device)
    history = train(model, data, cfg, rd, history, teacher)
    del teacher
    save_weights(model, rd.path / "model.safetensors")  # what ``--init`` reads
    from attnprune.deploy.hub import save_pretrained

    save_pretrained(model, rd.path / "model")  # the patched model: attnprune.from_pretrained
    ev = evaluate(model, vx, vy)
    x_bench = vx[: min(8, len(vx))]
    costs = measure_costs(model, x_bench, cfg, ev["kept_per_layer"], data)
    sweep = length_sweep(model, data, cfg) if cfg.lengths else []
    kept = ev["kept_per_layer"]
    entry = {"perplexity": ev["perplexity"], "val_loss": ev["loss"],
             "kept_ratio": None if kept is None else sum(kept) / len(kept),
             "kept_per_layer": kept, **costs}
    if (rnd := random_policy_control(model, vx, vy, kept)) is not None:
        entry["random_policy_control"] = rnd
    methods = {label: entry}
    comparisons = []
    if baseline_eval is not None:
        methods["baseline"] = {"perplexity": baseline_eval["perplexity"], "val_loss": baseline_eval["loss"]}
        entry["perplexity_relative"] = ev["perplexity"] / baseline_eval["perplexity"]
        comparisons.append(_paired_loss(label, ev["per_window"], "baseline", baseline_eval["per_window"]))
    summary = {"command": "lm", "env": env_info(device), "data": cfg.data, "methods": methods,
               "comparisons": comparisons, "length_sweep": sweep,
               "n_parameters": sum(p.numel() for p in model.parameters())}
    rd.write_json("summary.json", summary)
    rd.write_npy("val_loss_per_window.npy", np.asarray(ev["per_window"]))  # for paired tests
    rd.write_csv("metrics.csv", [{"method": label, "seed": cfg.seed, "perplexity": ev["perplexity"],
                                  "val_loss": ev["loss"], "kept_ratio": entry["kept_ratio"],
                                  "flops_relative": costs["flops"]["relative"],
                                  "flops_effective_relative": costs["flops"]["proxy_relative"],
                                  "time_relative": costs["time"]["relative"],
                                  "tokens_per_s": costs.get("tokens_per_s")}])
    from attnprune.research import lm_figures
    lm_figures.write_figures(rd, history, summary)
    rd.save_run("lm", {"perplexity": ev["perplexity"]})
    print(json.dumps({label: {k: entry[k] for k in ("perplexity", "kept_ratio")},
                      "flops_relative": costs["flops"]["relative"],
                      "time_relative": costs["time"]["relative"]}, indent=1))
    print(f"results: {path}")
    return path


# ----------------------------------------------------------------------------- sweeps
def control_schedule(cfg: LMConfig) -> tuple[int, float]:
    """Steps and learning rate of the unpruned control beside a sweep: as many steps as all
    of the method's stages together, at the backbone's learning rate (stage 2's where the
    method has a stage that trains the backbone after the policy, else ``lr``)."""
    st = stages(cfg)
    backbone = [s for s in st if s["train"] != "method"]
    return sum(s["steps"] for s in st), (backbone[-1]["lr"] if backbone else cfg.lr)


def _slug(opts: dict, swept: list[str]) -> str:
    return "-".join(f"{k}={opts[k]}" for k in swept).replace("/", "_").replace(" ", "")


def run_sweep(cfg: LMConfig, out: Path, exact: bool = False) -> Path:
    """A sweep of ``cfg.method``'s options (``cfg.sweep``), fine-tuned from ``cfg.init``.

    For each seed: the unpruned control (:func:`control_schedule`) and one run per point,
    each a plain ``lm`` run in its own subfolder (``control-s0``, ``keep_target=0.4-s0``,
    …). A rerun with the same ``--out`` skips the finished runs and resumes the killed one
    from its last checkpoint; so does a later sweep into the same folder with other points
    or more seeds (the tables then cover the points and seeds it names). Writes ``sweep.json`` (every run and every point),
    ``sweep_table.md`` / ``.csv`` (one row per point: kept ratio, measured / effective FLOPs
    and wall time relative to the full model, perplexity, its change against the control of
    the same seed: per seed a paired bootstrap over validation windows; over ≥ 2 seeds the
    mean with a t-interval and a paired t-test on the loss, Holm-adjusted over the points)
    and ``sweep.png``.
    """
    from dataclasses import replace

    from scipy import stats as sps

    from attnprune.research import lm_figures
    from attnprune.runs.stats import aggregate_seeds, holm

    rd = ResultsDir.start(out, "lm-sweep", exact, cfg)
    seeds = cfg.seeds or (cfg.seed,)
    points = cfg.sweep_points()
    swept = list(yaml.safe_load(cfg.sweep))
    steps, lr = control_schedule(cfg)
    single = replace(cfg, sweep="", seeds=(), distill_from="", distill_weight=0.0)
    runs = []
    for seed in seeds:
        ctrl = run_lm(replace(single, seed=seed, method="none", method_options="{}", steps=steps,
                              lr=lr, min_lr=min(cfg.min_lr, lr), stage2_steps=0),
                      rd.path / f"control-s{seed}", exact=True)
        teacher = str(ctrl / "model.safetensors") if cfg.distill_from == "control" else cfg.distill_from
        c_sum = json.loads((ctrl / "summary.json").read_text())
        c_loss = np.load(ctrl / "val_loss_per_window.npy")
        c_ppl = c_sum["methods"]["full"]["perplexity"]
        for i, opts in enumerate(points):
            opt_text = yaml.safe_dump(opts, default_flow_style=True).strip()
            run = run_lm(replace(single, seed=seed, method_options=opt_text, distill_from=teacher,
                                 distill_weight=cfg.distill_weight),
                         rd.path / f"{_slug(opts, swept)}-s{seed}", exact=True)
            e = json.loads((run / "summary.json").read_text())["methods"][cfg.method]
            cmp = _paired_loss(cfg.method, np.load(run / "val_loss_per_window.npy"), "control", c_loss)
            runs.append({"point": i, "seed": seed, "run": run.name, "control": ctrl.name,
                         **{k: opts[k] for k in swept}, "kept_ratio": e["kept_ratio"],
                         "kept_per_layer": e["kept_per_layer"], "flops_relative": e["flops"]["relative"],
                         "flops_effective_relative": e["flops"]["proxy_relative"],
                         "time_relative": e["time"]["relative"], "perplexity": e["perplexity"],
                         "control_perplexity": c_ppl,
                         "perplexity_change_pct": 100 * (e["perplexity"] / c_ppl - 1),
                         "random_policy_perplexity": (e.get("random_policy_control") or {}).get("perplexity"),
                         "loss_diff": cmp["diff"], "loss_diff_ci95": cmp["ci95"], "p_bootstrap": cmp["p"]})
    rows = []
    for i, opts in enumerate(points):
        rs = [r for r in runs if r["point"] == i]
        mean = {k: float(np.mean([r[k] for r in rs])) for k in
                ("kept_ratio", "flops_relative", "flops_effective_relative", "time_relative",
                 "perplexity", "control_perplexity", "perplexity_change_pct")}
        d = [r["loss_diff"] for r in rs]
        if len(rs) > 1:  # between seeds: t-interval of Δppl %, paired t-test of the loss
            ci = aggregate_seeds([r["perplexity_change_pct"] for r in rs])["ci95"]
            p = float(sps.ttest_1samp(d, 0.0).pvalue)
            test = f"paired t-test over {len(rs)} seeds"
        else:  # one seed: the paired bootstrap over windows
            lo, hi = rs[0]["loss_diff_ci95"]
            ci = [100 * (math.exp(lo) - 1), 100 * (math.exp(hi) - 1)]
            p, test = rs[0]["p_bootstrap"], "paired bootstrap over windows"
        rnd = [r["random_policy_perplexity"] for r in rs if r["random_policy_perplexity"] is not None]
        mean["random_policy_perplexity"] = float(np.mean(rnd)) if rnd else None
        rows.append({"point": i, **{k: opts[k] for k in swept}, "seeds": len(rs), **mean,
                     "perplexity_change_ci95": ci, "p": p, "test": test})
    for r, ph in zip(rows, holm([r["p"] for r in rows])):
        r["p_holm"] = float(ph)
    rd.write_json("sweep.json", {"command": "lm sweep", "method": cfg.method, "swept": swept,
                                 "seeds": list(seeds), "init": cfg.init,
                                 "control": {"steps": steps, "lr": lr}, "points": rows, "runs": runs,
                                 "env": env_info()})
    rd.write_csv("sweep_table.csv", rows)
    rd.write_text("sweep_table.md", lm_figures.sweep_markdown(rows, swept))
    lm_figures.sweep_figure(rd, rows, swept, cfg.method)
    print(lm_figures.sweep_markdown(rows, swept))
    print(f"results: {rd.path}")
    return rd.path


def _paired_loss(label: str, per_window, ref: str, ref_per_window) -> dict:
    """Paired bootstrap CI of the mean validation loss, ``label`` − ``ref``, over the same
    windows (a window is the resampling unit: tokens inside one are not independent)."""
    from attnprune.runs.stats import paired_bootstrap_ci

    a, b = np.asarray(per_window), np.asarray(ref_per_window)
    r = paired_bootstrap_ci(np.zeros(len(a)), a, b, metric=lambda y, x: x.mean(axis=-1),
                            vectorized=True, n_resamples=5000, seed=0)
    return {"a": label, "b": ref, "metric": "val_loss", "diff": r.estimate,
            "ci95": [r.low, r.high], "test": "paired bootstrap over windows", "p": r.pvalue,
            "effect": {"perplexity_ratio": math.exp(r.estimate)}}


def main(argv: list[str]) -> int:
    """``attnprune lm [--preset cpu-small|paper] [--key value …] --out DIR``."""
    if "--help" in argv or "-h" in argv:  # this module's docstring (the config's is lm_config's)
        from attnprune.runs.config import print_help

        print_help(__doc__, LMConfig)
        return 0
    preset = "cpu-small"
    for i, a in enumerate(argv):  # the preset may sit in the config file or on the line
        if a == "--config" and i + 1 < len(argv):
            from attnprune.runs.config import read_yaml

            preset = str(read_yaml(argv[i + 1]).get("preset", preset))
    for i, a in enumerate(argv):
        if a == "--preset" and i + 1 < len(argv):
            preset = argv[i + 1]
        elif a.startswith("--preset="):
            preset = a.split("=", 1)[1]
    if preset not in PRESETS and preset != "none":
        raise ConfigError(f"preset: must be one of {', '.join(PRESETS)} or none, got {preset!r}")
    cl = parse_command_line(argv, LMConfig, default_out="results", defaults=PRESETS.get(preset, {}))
    (run_sweep if cl.config.sweep.strip() else run_lm)(cl.config, cl.out, cl.exact_out)
    return 0
