"""Scoring a model on a loader (:func:`evaluate`: metrics, kept ratio, counted FLOPs) and its
wall time against the full model (:func:`time_against_full`)."""

from __future__ import annotations

import itertools

import numpy as np
import torch

from attnprune import api
from attnprune.measure import count_flops, time_fn, time_interleaved
from attnprune.runs import distributed

__all__ = ["evaluate", "time_against_full"]


def _proxy_flops(cfg, batch_shape: tuple[int, int], padded_per_layer: list[float] | None) -> float:
    """Analytic forward FLOPs of the encoder layers: per layer and token 2·(4d² + 2·d·d_ff)
    for the linears plus 4·K·d for QKᵀ and AV (K the padded length the layer sees)."""
    d = getattr(cfg, "hidden_size", None) or cfg.dim
    dff = getattr(cfg, "intermediate_size", None) or cfg.hidden_dim
    n_layers = getattr(cfg, "num_hidden_layers", None) or cfg.n_layers
    B, L = batch_shape
    ks = [p / B for p in padded_per_layer] if padded_per_layer else [L] * n_layers
    return float(sum(B * k * (2 * (4 * d * d + 2 * d * dff) + 4 * k * d) for k in ks))


def evaluate(model, loader, *, reference: bool = False, full_flops: int | None = None,
             timing_batches: int = 0, timing_repeats: int = 5, progress: bool = True,
             desc: str = "eval", full_model=None, count: bool = True) -> dict:
    """Score ``model`` on ``loader`` batch by batch, counting FLOPs of each forward.

    Relative FLOPs are against ``full_flops`` (the full model's count measured on the same
    batches, e.g. by an earlier call with the patch disabled) or, with ``reference=True``, the
    full forward is counted here too. ``full_model``: the reference for relative wall time when
    it is another model (a layer-dropped or int8 ``model``), timed interleaved with it;
    ``count=False`` skips FLOPs counting (int8 kernels are not counted). Returns metrics and
    arrays ``y_true``, ``y_pred``, ``probs`` (rows in the order of the loader's dataset). A
    model with one output (``num_labels=1``) is a regression: ``y_pred`` is its output,
    ``probs`` None, metrics :func:`_regression_metrics` instead of
    :func:`_classification_metrics`.

    Under a launcher with N processes every process must call it: each scores every N-th
    batch (:func:`attnprune.runs.distributed.shard_batches`) and all get the gathered result, every
    row once; wall time is measured by process 0 alone. Inputs go to the model's device.
    """
    from tqdm.auto import tqdm

    state = api.patch_state(model)
    model.eval()
    dev = next(model.parameters()).device if any(True for _ in model.parameters()) else "cpu"
    pos, ys, probs, flops, flops_full, proxy, proxy_full = [], [], [], 0, 0, 0.0, 0.0
    kept_tok, real_tok = 0.0, 0
    out = {}
    with torch.no_grad():
        # several processes: each scores its share of the batches, gathered below
        for rows, batch in tqdm(distributed.shard_batches(loader), desc=desc, leave=False,
                                disable=not progress or not distributed.is_main()):
            inputs = {k: batch[k].to(dev) for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}

            def fwd(inp=inputs):
                out["logits"] = model(**inp).logits

            if count:
                flops += count_flops(fwd)
            else:
                fwd()
            pos.append(np.asarray(rows))
            z = out["logits"].float().cpu()
            probs.append(z[:, 0].numpy() if z.shape[-1] == 1 else z.softmax(-1).numpy())
            ys.append(batch["labels"].numpy())
            shape = tuple(batch["input_ids"].shape)
            st = state.stats if state is not None and state.enabled else {}
            proxy += _proxy_flops(model.config, shape, st.get("padded_per_layer"))
            proxy_full += _proxy_flops(model.config, shape, None)
            real = int(batch["attention_mask"].sum())
            real_tok += real
            kept_tok += st.get("kept_ratio", 1.0) * real
            if reference and state is not None and state.enabled:
                was = state.enabled
                state.enabled = False
                try:
                    flops_full += count_flops(lambda inp=inputs: model(**inp))
                finally:
                    state.enabled = was  # a disabled patch (the full reference) stays disabled
    timing = None
    if timing_batches and distributed.is_main():
        # wall time in process 0 alone, on the loader's first batches (as in one process),
        # while the others wait in the gather below and leave the machine to it
        batches = [{k: b[k].to(dev) for k in ("input_ids", "attention_mask", "token_type_ids") if k in b}
                   for b in itertools.islice(loader, timing_batches)]
        if full_model is not None:
            full_model.to(dev)  # the reference runs where the model runs (a GPU after training)
        timing = time_against_full(model, state, batches, timing_repeats, full_model) if batches else None
    parts = distributed.gather((pos, ys, probs, flops, flops_full, proxy, proxy_full, kept_tok,
                                real_tok, timing))
    pos, ys, probs = ([a for part in parts for a in part[i]] for i in range(3))
    flops, flops_full, proxy, proxy_full, kept_tok, real_tok = (
        sum(part[i] for part in parts) for i in range(3, 9))
    timing = parts[0][9]
    order = np.argsort(np.concatenate(pos), kind="stable")  # the loader's rows, each once
    y = np.concatenate(ys)[order]
    p = np.concatenate(probs)[order]
    if p.ndim == 1:  # one output: a regression (float64: the saved predictions' precision)
        y, pred, p = y.astype(np.float64), p.astype(np.float64), None
        res = _regression_metrics(y, pred)
    else:
        pred = p.argmax(1)
        res = _classification_metrics(y, pred, p)
    res.update({
        "kept_ratio": kept_tok / max(real_tok, 1),
        "flops": {"measured": flops, "proxy": proxy,
                  "proxy_relative": proxy / proxy_full if proxy_full else None},
        "n": int(y.size),
    })
    if reference and (state is None or not state.enabled):  # the model is the full model
        flops_full = flops
    if full_flops is not None:
        flops_full = full_flops
    if reference or full_flops is not None:
        res["flops"]["full_measured"] = flops_full
        res["flops"]["relative"] = flops / flops_full if flops_full else None
    if timing is not None:
        res["time"] = timing
    return {**res, "y_true": y, "y_pred": pred, "probs": p}


def _classification_metrics(y: np.ndarray, pred: np.ndarray, probs: np.ndarray) -> dict:
    """Accuracy, macro F1, Matthews correlation (sklearn; GLUE's CoLA metric, and the one
    that stays honest on unbalanced classes: 0 for a constant predictor) and AUC (one-vs-rest
    when multiclass; None when the scored examples hold one class)."""
    from sklearn.metrics import f1_score, matthews_corrcoef, roc_auc_score

    res = {"accuracy": float((pred == y).mean()),
           "f1_macro": float(f1_score(y, pred, average="macro")),
           "mcc": float(matthews_corrcoef(y, pred))}
    try:
        res["auc"] = float(roc_auc_score(y, probs[:, 1]) if probs.shape[1] == 2
                           else roc_auc_score(y, probs, multi_class="ovr"))
    except ValueError:  # one class present
        res["auc"] = None
    return res


def _regression_metrics(y: np.ndarray, pred: np.ndarray) -> dict:
    """Pearson and Spearman correlation (scipy; GLUE's STS-B metrics) and the mean squared
    error. A correlation is None where it is undefined: constant predictions or labels (a
    collapsed model, or a validation set of equal targets)."""
    from scipy import stats as sps

    res = {"mse": float(np.mean((pred - y) ** 2))}
    ok = y.size >= 2 and np.ptp(y) > 0 and np.ptp(pred) > 0
    res["pearson"] = float(sps.pearsonr(y, pred).statistic) if ok else None
    res["spearman"] = float(sps.spearmanr(y, pred).statistic) if ok else None
    return res


def time_against_full(model, state, batches, repeats: int, full_model=None) -> dict:
    """Median wall time of the batches, pruned and full, in this process, timed round-robin
    (:func:`time_interleaved`: timing one after the other put the two in different stretches
    of a noisy machine; a user's 2-thread tweet run read 0.80). The full model is ``model``
    with its patch disabled, or ``full_model`` when given (a layer-dropped or int8 model)."""

    def run(m=model):
        with torch.no_grad():
            for inp in batches:
                m(**inp)

    if full_model is not None:
        full_model.eval()

        def full():
            run(full_model)
    elif state is None or not state.enabled:
        t = time_fn(run, repeats=repeats, warmup=1)
        return {"median_s": t.median_s, "mad_s": t.mad_s, "threads": t.threads,
                "batches": len(batches), "relative": 1.0}
    else:
        def full():
            state.enabled = False
            try:
                run()
            finally:
                state.enabled = True

    ts = time_interleaved({"pruned": run, "full": full}, repeats=repeats, warmup=1)
    t, tf = ts["pruned"], ts["full"]
    return {"median_s": t.median_s, "mad_s": t.mad_s, "threads": t.threads,
            "batches": len(batches), "full_median_s": tf.median_s, "full_mad_s": tf.mad_s,
            "relative": t.median_s / tf.median_s}
