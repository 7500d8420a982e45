"""Where to prune under a FLOPs budget: a greedy search of the per-layer keep ratios.

One cut at a fixed ratio spends the budget in one place. PoWER-BERT learns a retention per
layer; ToP learns where under a FLOPs constraint. This is the training-free form of that
choice, written by hand (no library searches token-pruning schedules): on a fine-tuned full
model and a few validation batches,

    r = (1, 1, …, 1)                                  cumulative keep ratio after each layer
    while FLOPs(r) > budget · FLOPs(full):
        for each layer l: r⁽ˡ⁾ = r with r_l lowered to the next level of ``levels`` (and every
                          later r_j capped at it, so r stays non-increasing)
        take the r⁽ˡ⁾ with the least ΔKL / ΔFLOPs    (KL of the full model's predictions to
                                                     the pruned model's, mean over examples)

FLOPs are counted (``measure.count_flops``: the pruned tokens have left the tensor), not
estimated. The result is an explicit schedule (``patch(..., schedule=[...])``; a ``schedule:``
list in an ``attnprune pareto`` prune entry), so its cost is fixed and timeable like any other.

    from attnprune.train.schedule_search import search_schedule
    found = search_schedule(model, batches, flops_budget=0.35)
    found["schedule"]   # e.g. [1.0, 0.5, 0.35, 0.35, 0.25]
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from attnprune.measure import count_flops

__all__ = ["LEVELS", "search_schedule"]

LEVELS = (1.0, 0.75, 0.5, 0.35, 0.25, 0.15, 0.1)


def _n_layers(model: nn.Module) -> int:
    n = getattr(model.config, "num_hidden_layers", None) or getattr(model.config, "n_layers", None)
    if not isinstance(n, int) or n < 2:
        raise ValueError("search_schedule needs an encoder with ≥ 2 layers (config.num_hidden_layers)")
    return n


def _best(tried: list[tuple], cur_flops: float, cur_kl: float) -> tuple | None:
    """The step with the least ΔKL / ΔFLOPs among ``tried`` ((schedule, flops, kl, layer),
    FLOPs relative), first wins ties; None when none saves FLOPs."""
    best, best_score = None, None
    for step in tried:
        _, f, k, _ = step
        saved = cur_flops - f
        if saved <= 1e-12:
            continue
        score = (k - cur_kl) / saved
        if best_score is None or score < best_score - 1e-12:
            best, best_score = step, score
    return best


def search_schedule(model: nn.Module, batches: Sequence[dict], flops_budget: float, *,
                    method: str = "attention_mass", options: dict | None = None,
                    levels: Sequence[float] = LEVELS, progress=None) -> dict:
    """Greedy per-layer keep ratios of ``method`` on ``model`` (a fine-tuned encoder classifier;
    left unchanged: the search runs on a copy on the batches' device, with any patch of the
    model removed, so the reference is the full model) with at most ``flops_budget`` × its FLOPs on
    ``batches`` (dicts of input_ids / attention_mask / token_type_ids). Returns {"schedule"
    (the cumulative ratios after layers 1 … n−1), "flops" (relative), "kl", "history" (one
    dict per step: schedule, flops, kl, and the layer lowered)}. ``progress`` (a callable)
    gets one line per step."""
    from attnprune import api

    if not 0 < flops_budget <= 1:
        raise ValueError(f"flops_budget must be in (0, 1], got {flops_budget}")
    lv = sorted({float(x) for x in levels}, reverse=True)
    if not lv or lv[0] != 1.0 or lv[-1] <= 0 or lv[-1] > 1:
        raise ValueError(f"levels must start at 1.0 and lie in (0, 1], got {list(levels)}")
    if not batches:
        raise ValueError("batches: give at least one validation batch")
    n = _n_layers(model)
    keys = ("input_ids", "attention_mask", "token_type_ids")
    inputs = [{k: v for k, v in b.items() if k in keys} for b in batches]
    # a copy on the batches' device: the model given stays where it is, as it is; a patched
    # model's copy is unpatched (a pruned reference makes every candidate save nothing)
    work = copy.deepcopy(model)
    if api.patch_state(work) is not None:
        api.unpatch(work)
    work = work.to(inputs[0]["input_ids"].device).eval()

    def run(schedule):
        if schedule is not None:
            api.patch(work, method, schedule=list(schedule), **(options or {}))
        logits, flops = [], 0
        try:
            with torch.no_grad():  # one forward per batch: counted, and its logits kept
                for x in inputs:
                    flops += count_flops(lambda x=x: logits.append(work(**x).logits.float()))
        finally:
            if schedule is not None:
                api.unpatch(work)
        return logits, flops

    ref, ref_flops = run(None)
    ref_logp = [F.log_softmax(z, -1) for z in ref]

    def kl(logits) -> float:
        total = sum(F.kl_div(F.log_softmax(z, -1), p, log_target=True, reduction="sum")
                    for z, p in zip(logits, ref_logp))
        return float(total) / sum(z.shape[0] for z in ref)

    r = [1.0] * (n - 1)
    cur_kl, cur_flops = 0.0, 1.0
    history = [{"schedule": list(r), "flops": 1.0, "kl": 0.0, "lowered": None}]
    while cur_flops > flops_budget + 1e-9:
        tried = []
        for layer in range(n - 1):
            lower = [x for x in lv if x < r[layer] - 1e-12]
            if not lower:
                continue
            cand = r[:layer] + [min(v, lower[0]) for v in r[layer:]]
            logits, fl = run(cand)
            tried.append((cand, fl / ref_flops, kl(logits), layer))
        best = _best(tried, cur_flops, cur_kl)
        if best is None:  # every layer at the lowest level: the budget is out of reach
            break
        r, cur_flops, cur_kl, layer = best
        history.append({"schedule": list(r), "flops": cur_flops, "kl": cur_kl,
                        "lowered": layer + 1})
        if progress is not None:
            progress(f"lowered after layer {layer + 1}: {r} FLOPs {cur_flops:.3f} KL {cur_kl:.4f}")
    return {"schedule": r, "flops": cur_flops, "kl": cur_kl, "history": history,
            "reached": cur_flops <= flops_budget + 1e-9, "flops_budget": flops_budget,
            "method": method, "options": dict(options or {})}
