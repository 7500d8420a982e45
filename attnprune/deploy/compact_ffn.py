"""Cut dead FFN units out of the weights: structured sparsity turned into real savings (issue 13).

Notation: x the FFN input (d), z = W1 x + b1 the pre-activation (U units), a = act(z), the
output W2 a + b2. A unit u is *dead* over calibration data when it contributes (almost) nothing
on any real token of it:

    criterion "relu":       max_t z_tu ≤ τ       (τ = 0: the unit never turns on; with the group
                                                  penalty on ReLU(z) this is what training reaches)
    criterion "magnitude":  max_t |a_tu| ≤ τ

:func:`compact` returns a copy of the model whose first projection keeps only the live rows
(units) and whose second projection keeps only their columns: both matmuls shrink, so counted
FLOPs (:func:`attnprune.measure.count_flops`) and wall time fall with no kernel of ours. A dead
GELU unit is not exactly 0 (GELU(z) ∈ [−0.17, 0] for z ≤ 0), so its contribution W2[:, u]·a_u
is dropped; ``fold=True`` adds its mean over the calibration tokens to b2 (the error left is its
spread around that mean). A ReLU unit with z ≤ 0 on every token is exactly 0: removing it
changes nothing on those tokens. Units live on tokens the calibration never saw are the risk:
calibrate on training batches, measure on test data.

Hosts: BERT family (``intermediate.dense`` / ``output.dense`` of each layer: BERT, RoBERTa,
MiniLM, ELECTRA, ...), DistilBERT (``ffn.lin1`` / ``ffn.lin2``), GPT-2 (``mlp.c_fc`` /
``mlp.c_proj``, Conv1D with weights stored (in, out)). :func:`ffn_sizes` reads the kept sizes
back from the modules, which is what :mod:`attnprune.deploy.hub` records (``ffn_compact``) and
:func:`resize` rebuilds before loading weights.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable
from dataclasses import dataclass
from operator import attrgetter

import torch
from torch import Tensor, nn

__all__ = ["CRITERIA", "FFNPair", "compact", "ffn_pairs", "ffn_sizes", "resize", "unit_activity"]

CRITERIA = ("relu", "magnitude")
_INPUT_KEYS = ("input_ids", "attention_mask", "token_type_ids")


@dataclass(frozen=True)
class FFNPair:
    """One FFN: its parent module's name, the first / second projection and the activation."""

    name: str  # the module holding both projections, e.g. "bert.encoder.layer.0"
    first_attr: str  # dotted path from the holder, e.g. "intermediate.dense"
    second_attr: str
    act_attr: str  # dotted path of the activation module / function
    conv1d: bool  # GPT-2's Conv1D: weight (in, out) instead of nn.Linear's (out, in)


def _get(root: nn.Module, dotted: str):
    return attrgetter(dotted)(root)  # the activation may be a plain function, not a submodule


def ffn_pairs(model: nn.Module) -> list[FFNPair]:
    """The model's FFNs in forward order; ValueError when none is recognised."""
    out = []
    for name, m in model.named_modules():
        inter, outp = getattr(m, "intermediate", None), getattr(m, "output", None)
        if (inter is not None and isinstance(getattr(inter, "dense", None), nn.Linear)
                and isinstance(getattr(outp, "dense", None), nn.Linear)
                and hasattr(inter, "intermediate_act_fn")):
            out.append(FFNPair(name, "intermediate.dense", "output.dense",
                               "intermediate.intermediate_act_fn", False))
        elif isinstance(getattr(m, "lin1", None), nn.Linear) and isinstance(
                getattr(m, "lin2", None), nn.Linear) and hasattr(m, "activation"):
            out.append(FFNPair(name, "lin1", "lin2", "activation", False))
        elif hasattr(m, "c_fc") and hasattr(m, "c_proj") and hasattr(m, "act") and type(
                m.c_fc).__name__ == "Conv1D":
            out.append(FFNPair(name, "c_fc", "c_proj", "act", True))
    if not out:
        raise ValueError(f"model: found no FFN to compact in {type(model).__name__} (BERT family "
                         f"intermediate/output, DistilBERT lin1/lin2, GPT-2 c_fc/c_proj)")
    return out


def _units(model: nn.Module, p: FFNPair) -> int:
    w = _get(model, f"{p.name}.{p.first_attr}" if p.name else p.first_attr).weight
    return int(w.shape[1] if p.conv1d else w.shape[0])


def _path(p: FFNPair, attr: str) -> str:
    return f"{p.name}.{attr}" if p.name else attr


def ffn_sizes(model: nn.Module) -> dict[str, int]:
    """Units per FFN, by holder name (what a compacted model's hub recipe records)."""
    return {p.name: _units(model, p) for p in ffn_pairs(model)}


@torch.no_grad()
def unit_activity(model: nn.Module, batches: Iterable[dict]) -> dict[str, dict[str, Tensor]]:
    """Per FFN and unit, over the real tokens of ``batches`` (dicts of model inputs, an
    ``attention_mask`` marking real tokens): ``max_z`` (max pre-activation), ``max_abs_a``
    (max |act(z)|), ``mean_a`` (mean act(z)) and ``tokens`` (N). Runs the model in eval mode
    (restored afterwards); float64 sums."""
    pairs = ffn_pairs(model)
    stats = {p.name: None for p in pairs}
    current: dict[str, Tensor | None] = {"mask": None}

    def hook(p: FFNPair):
        act = _get(model, _path(p, p.act_attr))

        def fn(_mod, _inp, z: Tensor) -> None:
            a = act(z)
            z2, a2 = z.reshape(-1, z.shape[-1]), a.reshape(-1, a.shape[-1])  # (B·T, U)
            mask = current["mask"]
            if mask is not None and mask.numel() == z2.shape[0]:
                keep = mask.reshape(-1).bool()
                z2, a2 = z2[keep], a2[keep]
            s = stats[p.name]
            new = {"max_z": z2.max(0).values.double(), "max_abs_a": a2.abs().max(0).values.double(),
                   "sum_a": a2.double().sum(0), "tokens": z2.shape[0]}
            if s is None or s["tokens"] == 0:
                stats[p.name] = new
            elif new["tokens"]:
                s["max_z"] = torch.maximum(s["max_z"], new["max_z"])
                s["max_abs_a"] = torch.maximum(s["max_abs_a"], new["max_abs_a"])
                s["sum_a"] += new["sum_a"]
                s["tokens"] += new["tokens"]

        return fn

    handles = [_get(model, _path(p, p.first_attr)).register_forward_hook(hook(p)) for p in pairs]
    was = model.training
    model.eval()
    dev = next(model.parameters()).device
    try:
        for b in batches:
            inp = {k: b[k].to(dev) for k in _INPUT_KEYS if k in b}
            current["mask"] = inp.get("attention_mask")
            model(**inp)
    finally:
        for h in handles:
            h.remove()
        model.train(was)
    out = {}
    for p in pairs:
        s = stats[p.name]
        if s is None or s["tokens"] == 0:
            raise ValueError("batches: no real token reached the FFNs (empty calibration data)")
        out[p.name] = {"max_z": s["max_z"], "max_abs_a": s["max_abs_a"],
                       "mean_a": s["sum_a"] / s["tokens"], "tokens": s["tokens"]}
    return out


def _slice(first: nn.Module, second: nn.Module, keep: Tensor, conv1d: bool) -> None:
    """Keep units ``keep`` (sorted indices) of one FFN, in place, as new parameters."""
    if conv1d:  # Conv1D: weight (in, out), bias (out,)
        first.weight = nn.Parameter(first.weight.data[:, keep].clone())
        first.bias = nn.Parameter(first.bias.data[keep].clone())
        first.nf = len(keep)
        second.weight = nn.Parameter(second.weight.data[keep, :].clone())
    else:
        first.weight = nn.Parameter(first.weight.data[keep, :].clone())
        if first.bias is not None:
            first.bias = nn.Parameter(first.bias.data[keep].clone())
        first.out_features = len(keep)
        second.weight = nn.Parameter(second.weight.data[:, keep].clone())
        second.in_features = len(keep)


def compact(model: nn.Module, batches: Iterable[dict], *, threshold: float = 0.0,
            criterion: str = "relu", fold: bool = True, min_units: int = 1
            ) -> tuple[nn.Module, dict]:
    """A copy of ``model`` with the FFN units dead over ``batches`` removed; ``model`` is left
    untouched. Returns ``(compacted, report)``; ``report`` has per FFN the kept unit indices
    and sizes and overall ``removed_fraction``.

    ``criterion``/``threshold``: see the module docstring. ``fold``: add the removed units'
    mean contribution W2[:, dead]·mean_t a_t[dead] to the second projection's bias (needs a
    bias). ``min_units``: at least this many units (the largest max_z) stay in every FFN, so a
    layer never has an empty matmul.
    """
    if criterion not in CRITERIA:
        raise ValueError(f"criterion: must be one of {CRITERIA}, got {criterion!r}")
    if not (isinstance(threshold, (int, float)) and math.isfinite(threshold)):
        raise ValueError(f"threshold: must be a finite number, got {threshold!r}")
    if criterion == "magnitude" and threshold < 0:
        raise ValueError(f"threshold: must be >= 0 with criterion 'magnitude', got {threshold}")
    if not (isinstance(min_units, int) and min_units >= 1):
        raise ValueError(f"min_units: must be an integer >= 1, got {min_units!r}")
    activity = unit_activity(model, batches)
    out = copy.deepcopy(model)
    report: dict = {"criterion": criterion, "threshold": float(threshold), "fold": bool(fold),
                    "layers": {}}
    total = removed = 0
    for p in ffn_pairs(out):
        s = activity[p.name]
        score = s["max_z"] if criterion == "relu" else s["max_abs_a"]
        dead = score <= threshold
        units = dead.numel()
        if int((~dead).sum()) < min_units:  # keep the most active few
            top = torch.topk(s["max_z"], min(min_units, units)).indices
            dead[top] = False
        keep = torch.nonzero(~dead).flatten()
        first, second = _get(out, _path(p, p.first_attr)), _get(out, _path(p, p.second_attr))
        if fold and bool(dead.any()):
            if second.bias is None:
                raise ValueError(f"fold: {_path(p, p.second_attr)} has no bias to fold into")
            w2 = second.weight.data.double()  # Linear (d, U); Conv1D (U, d)
            mean = s["mean_a"].to(w2.device)
            contrib = (w2[dead] * mean[dead, None]).sum(0) if p.conv1d else w2[:, dead] @ mean[dead]
            second.bias.data += contrib.to(second.bias.dtype)
        _slice(first, second, keep.to(first.weight.device), p.conv1d)
        report["layers"][p.name] = {"units": units, "kept": len(keep),
                                    "kept_units": keep.tolist()}
        total += units
        removed += units - len(keep)
    report["removed_fraction"] = removed / total if total else 0.0
    return out, report


def resize(model: nn.Module, sizes: dict[str, int]) -> None:
    """Give the FFNs named in ``sizes`` that many units, in place (fresh weights of the new
    shapes, to be overwritten by a state dict): how :mod:`attnprune.deploy.hub` rebuilds a compacted
    model before loading its weights. ValueError for an unknown FFN or a bad size."""
    pairs = {p.name: p for p in ffn_pairs(model)}
    unknown = sorted(set(sizes) - set(pairs))
    if unknown:
        raise ValueError(f"ffn_compact: no FFN named {unknown[0]!r} in {type(model).__name__}")
    for name, n in sizes.items():
        p = pairs[name]
        units = _units(model, p)
        if not (isinstance(n, int) and 1 <= n <= units):
            raise ValueError(f"ffn_compact: {name} needs 1..{units} units, got {n!r}")
        if n != units:
            _slice(_get(model, _path(p, p.first_attr)), _get(model, _path(p, p.second_attr)),
                   torch.arange(n), p.conv1d)
