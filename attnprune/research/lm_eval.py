"""Measuring a causal LM of ``attnprune lm``: perplexity and kept ratio over windows
(:func:`evaluate`), sampling (:func:`generate`), FLOPs, wall time and generation throughput
pruned vs full (:func:`measure_costs`), and perplexity against the sequence length."""

from __future__ import annotations

import math
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from attnprune import api
from attnprune.hosts.hf_causal import cache_kwargs
from attnprune.measure import count_flops, effective_flops, time_fn
from attnprune.research.data.lm_text import LMData, eval_windows
from attnprune.research.lm_config import LMConfig
from attnprune.research.lm_model import context_window, device_of, method_module

__all__ = ["evaluate", "generate", "layer_flops", "length_sweep", "measure_costs",
           "paired_timing", "random_policy_control", "set_enabled"]

@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 16,
             sampled_method: bool = False) -> dict:
    """Mean next-token loss, perplexity and per-layer kept ratio over fixed windows (eval mode;
    ``sampled_method``: the token method alone in training mode, e.g. a policy that samples)."""
    was = model.training
    model.eval()
    m = method_module(model)
    if sampled_method and m is not None:
        m.train()
    total, n, kept, n_kept = 0.0, 0, None, 0
    per_window = []
    for i in range(0, len(x), batch_size):
        dev = device_of(model)
        xb, yb = x[i : i + batch_size].to(dev), y[i : i + batch_size].to(dev)
        logits = model(xb).logits
        ce = F.cross_entropy(logits.flatten(0, 1).float(), yb.flatten(), reduction="none").view(yb.shape)
        per_window.append(ce.mean(1))
        total += float(ce.sum())
        n += ce.numel()
        st = api.patch_state(model)
        k = (st.stats or {}).get("kept_per_layer") if st is not None else None
        if k is not None:
            kept = [a + b * ce.numel() for a, b in zip(kept or [0.0] * len(k), k)]
            n_kept += ce.numel()
    model.train(was)
    loss = total / n
    out = {"loss": loss, "perplexity": math.exp(loss), "per_window": torch.cat(per_window).tolist()}
    out["kept_per_layer"] = [v / n_kept for v in kept] if kept is not None else None
    return out


@torch.no_grad()
def random_policy_control(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                          kept: list[float] | None, seeds: int = 3) -> dict | None:
    """Perplexity of the same model with its policy's decisions replaced by random drops at
    the same per-layer kept ratios ``kept`` (a copy of the model; methods with
    ``match_rates_``, i.e. DTR). If the learned policy only learned how many tokens to keep,
    the two perplexities agree; per-token decisions make the learned one lower."""
    import copy

    m = method_module(model)
    if kept is None or not hasattr(m, "match_rates_"):
        return None
    ctrl = copy.deepcopy(model)  # a copy of a patched model runs its own method
    method_module(ctrl).match_rates_(kept)
    evs = []
    for s in range(seeds):
        torch.manual_seed(s)  # Bernoulli drops
        evs.append(evaluate(ctrl, x, y, sampled_method=True))
    loss = float(np.mean([e["loss"] for e in evs]))
    return {"perplexity": math.exp(loss), "val_loss": loss, "seeds": seeds,
            "per_seed_perplexity": [e["perplexity"] for e in evs],
            "kept_per_layer": np.mean([e["kept_per_layer"] for e in evs], 0).tolist()}


@torch.no_grad()
def generate(model: nn.Module, prompt: torch.Tensor, n_new: int, temperature: float = 0.8,
             use_cache: bool = True, generator: torch.Generator | None = None) -> torch.Tensor:
    """Sample ``n_new`` tokens after ``prompt`` (1, T0); temperature 0 = greedy.

    Written by hand because HF ``generate`` stops at the context length: when the window is full,
    generation restarts from its last half (prefill), in both the cached and the uncached
    mode, so the two see exactly the same contexts and must produce the same tokens.
    """
    from transformers import DynamicCache

    model.eval()
    window = context_window(model.config)
    ids = prompt.clone()
    start = max(0, ids.shape[1] - window)  # the current window begins here
    cache, fed = None, 0  # cached mode: tokens of the window already in the cache
    for _ in range(n_new):
        if ids.shape[1] - start >= window:  # window full: restart from its last half
            start = ids.shape[1] - window // 2
            cache, fed = None, 0
        if use_cache:
            if cache is None:
                cache, fed = DynamicCache(config=model.config), 0
            logits = model(ids[:, start + fed :], **cache_kwargs(cache), use_cache=True).logits
            fed = ids.shape[1] - start
        else:
            logits = model(ids[:, start:], use_cache=False).logits
        last = logits[:, -1].float()
        if temperature == 0:
            nxt = last.argmax(-1, keepdim=True)
        else:
            probs = torch.softmax(last / temperature, -1)
            if generator is not None and generator.device != probs.device:
                probs = probs.cpu()  # a CPU generator (the seeds' stream) draws on the CPU
            nxt = torch.multinomial(probs, 1, generator=generator).to(ids.device)
        ids = torch.cat([ids, nxt], 1)
    return ids[:, prompt.shape[1] :]


def layer_flops(per_module: dict, n_layer: int) -> list[int]:
    out = []
    for l in range(n_layer):
        # GPT-2's blocks are transformer.h.<l>, the Llama family's model.layers.<l>
        keys = [k for k in per_module if k.endswith((f"transformer.h.{l}", f"model.layers.{l}"))]
        out.append(per_module[keys[0]] if keys else 0)
    return out


def set_enabled(model: nn.Module, on: bool) -> None:
    st = api.patch_state(model)
    if st is not None and hasattr(st, "enabled"):
        # keep_ratio 1.0 (causal host) means pruning stays off whatever we ask
        st.enabled = on and getattr(st, "keep_ratio", None) != 1.0


def paired_timing(model: nn.Module, fn, repeats: int, rounds: int = 3, warmup: int = 1):
    """Wall time of ``fn`` with pruning off and on, alternated over ``rounds`` rounds of
    :func:`time_fn` so a burst of load from other processes hits both; returns the two
    Timings whose median / MAD are over all repeats of all rounds."""
    import statistics

    from attnprune.measure import Timing

    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(rounds):
        for on in (False, True):
            set_enabled(model, on)
            times[on] += list(time_fn(fn, repeats=repeats, warmup=warmup).times_s)
    set_enabled(model, True)
    out = []
    for on in (False, True):
        t = times[on]
        med = statistics.median(t)
        mad = statistics.median(abs(v - med) for v in t)
        out.append(Timing(med, mad, len(t), warmup * rounds, torch.get_num_threads(), tuple(t)))
    return out[0], out[1]


def measure_costs(model: nn.Module, x: torch.Tensor, cfg: LMConfig, kept: list[float] | None,
                  data: LMData) -> dict:
    """FLOPs (measured and effective), wall time and generation throughput, pruned vs full."""
    model.eval()
    token_method = hasattr(api.patch_state(model), "enabled")  # our causal host
    x = x.to(device_of(model))
    fwd = lambda: model(x)
    res: dict = {}
    with torch.no_grad():
        set_enabled(model, False)
        full_total, full_per = count_flops(fwd, by_module=True)
        set_enabled(model, True)
        pr_total = count_flops(fwd)
        t_full, t_pr = paired_timing(model, fwd, cfg.bench_repeats)
    per_layer = layer_flops(full_per, model.config.num_hidden_layers)
    layers_sum = sum(per_layer)
    if kept is not None and token_method:
        eff_layers = effective_flops(per_layer, kept)
        eff_total = effective_flops(per_layer, kept, total=full_total)
    else:
        eff_layers = layers_sum
        eff_total = full_total - layers_sum + eff_layers  # embeddings/ln_f/head are never pruned
    res["flops"] = {"measured": pr_total, "full": full_total, "relative": pr_total / full_total,
                    "effective": eff_total, "proxy_relative": eff_total / full_total,
                    "effective_layers_relative": eff_layers / max(1, layers_sum),
                    "per_layer_full": per_layer, "batch_shape": list(x.shape)}
    res["time"] = {"median_s": t_pr.median_s, "mad_s": t_pr.mad_s, "relative": t_pr.median_s / t_full.median_s,
                   "full_median_s": t_full.median_s, "full_mad_s": t_full.mad_s, "threads": t_pr.threads}
    if cfg.gen_tokens:
        prompt = data.val[: min(16, cfg.context // 2)][None].to(x.device)
        out = {}
        for label, on in (("full", False), ("pruned", True)):
            set_enabled(model, on)
            g = torch.Generator().manual_seed(cfg.seed)
            t0 = time.perf_counter()
            generate(model, prompt, cfg.gen_tokens, cfg.temperature, True, g)
            out[label] = cfg.gen_tokens / (time.perf_counter() - t0)
        set_enabled(model, True)
        n_check = min(100, cfg.gen_tokens)
        a = generate(model, prompt, n_check, 0.0, use_cache=True)
        b = generate(model, prompt, n_check, 0.0, use_cache=False)
        res["tokens_per_s"] = out["pruned"]
        res["generation"] = {"tokens_per_s": out["pruned"], "full_tokens_per_s": out["full"],
                             "relative": out["pruned"] / out["full"], "new_tokens": cfg.gen_tokens,
                             "temperature": cfg.temperature, "kv_cache": True,
                             "cache_consistent_greedy_tokens": n_check,
                             "cache_consistent": bool(torch.equal(a, b)),
                             "sample": data.decode(generate(model, prompt, min(200, cfg.gen_tokens),
                                                            cfg.temperature, True,
                                                            torch.Generator().manual_seed(cfg.seed))[0])}
    return res


def length_sweep(model: nn.Module, data: LMData, cfg: LMConfig) -> list[dict]:
    """Perplexity, kept ratio and measured / effective FLOPs at several sequence lengths."""
    rows = []
    for T in cfg.lengths:
        x, y = eval_windows(data.val, cfg.eval_windows, T)
        ev = evaluate(model, x, y)
        xb = x[: min(8, len(x))].to(device_of(model))
        with torch.no_grad():
            set_enabled(model, False)
            full, per = count_flops(model, xb, by_module=True)
            set_enabled(model, True)
            pr = count_flops(model, xb)
        per_layer = layer_flops(per, model.config.num_hidden_layers)
        kept = ev["kept_per_layer"] or [1.0] * len(per_layer)
        eff = effective_flops(per_layer, kept, total=full)
        rows.append({"length": T, "perplexity": ev["perplexity"], "loss": ev["loss"],
                     "kept_ratio": sum(kept) / len(kept), "flops_full": full, "flops_measured": pr,
                     "flops_effective": eff})
    return rows
