"""One ``attnprune finetune`` run per (seed, ρ): load and check the data (:func:`prepare`),
load, patch, fine-tune and score the model, with the full reference and the fair timing
(:func:`run`)."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
import yaml

from attnprune import api
from attnprune.measure import count_flops
from attnprune.research.finetune.config import FinetuneConfig, check_method_task
from attnprune.research.finetune.loaders import make_loader, timing_batches
from attnprune.research.finetune.model_io import (
    FULL,
    find_weights,
    load_model,
    load_weights,
    model_config,
    n_layers_of,
)
from attnprune.research.finetune.scoring import evaluate, time_against_full
from attnprune.research.finetune.summary import summarize
from attnprune.runs import distributed
from attnprune.runs.results import ResultsDir

__all__ = ["check_depth", "prepare", "run"]


def _fair(model, split, tokenizer, cfg: FinetuneConfig, full_model=None) -> dict | None:
    """FLOPs and wall time of ``model`` relative to the full model on ``timing_batches``
    batches of the scored test rows sorted by length (:func:`timing_batches`' ``fair``), so
    that neither pays for padding. The test score's own ratios (``flops.relative``,
    ``time.relative``) are on the padded file-order batches, where a pruned model's row
    bucketing also drops the padding the full model computes, and so reads as pruning.
    The full model is ``full_model`` or ``model`` with its patch disabled; None when there is
    neither (nothing to compare)."""
    state = api.patch_state(model)
    if full_model is None and (state is None or not state.enabled):
        return None
    model.eval()
    dev = next(model.parameters()).device
    n = len(split) if cfg.max_test is None else min(len(split), cfg.max_test)
    batches = [{k: v.to(dev) for k, v in b.items()}
               for b in timing_batches(split, tokenizer, np.arange(n), cfg.eval_batch_size,
                                       cfg.max_length, cfg.timing_batches)["fair"]]

    def full_fwd(inp):
        if full_model is not None:
            return full_model(**inp)
        state.enabled = False
        try:
            return model(**inp)
        finally:
            state.enabled = True

    if full_model is not None:
        full_model.to(dev).eval()
    with torch.no_grad():
        flops = sum(count_flops(lambda inp=inp: model(**inp)) for inp in batches)
        flops_full = sum(count_flops(lambda inp=inp: full_fwd(inp)) for inp in batches)
    t = time_against_full(model, state, batches, cfg.timing_repeats, full_model)
    return {"what": "length-sorted test batches: no padding for either model",
            "batches": len(batches),
            "tokens": int(sum(int(b["attention_mask"].sum()) for b in batches)),
            "slots": int(sum(b["input_ids"].numel() for b in batches)),
            "flops": flops, "full_flops": flops_full,
            "flops_relative": flops / flops_full if flops_full else None,
            "time_relative": t["relative"], "median_s": t["median_s"],
            "full_median_s": t.get("full_median_s")}


# ----------------------------------------------------------------------------- one run
def _patch(model, cfg: FinetuneConfig, rho: float, tokenizer=None):
    if cfg.method == FULL:
        return model
    from attnprune.methods import registry
    if registry.get(cfg.method).kind != "token":
        # attention / loss methods (crisp, intensity, cost): only their own options
        return api.patch(model, cfg.method, **cfg.method_options)
    schedule = cfg.schedule
    if schedule.strip().startswith("["):
        schedule = yaml.safe_load(schedule)
    opts = dict(cfg.method_options)
    if tokenizer is not None and "protect_token_ids" not in opts:
        # the tokenizer's separators, kept like CLS: models without segment ids (DistilBERT,
        # RoBERTa) mark a pair's middle separator only by its id
        ids = {getattr(tokenizer, k, None) for k in ("sep_token_id", "cls_token_id",
                                                     "eos_token_id", "bos_token_id")}
        opts["protect_token_ids"] = sorted(i for i in ids if isinstance(i, int))
    return api.patch(model, cfg.method, keep_ratio=rho, after_layer=cfg.after_layer,
                     schedule=schedule, **opts)


def _label(cfg: FinetuneConfig, rho: float) -> str:
    depth = "" if cfg.layers is None else f"layers={cfg.layers}"
    if cfg.method == FULL:
        return depth or FULL
    return f"{depth}+{_method_label(cfg, rho)}" if depth else _method_label(cfg, rho)


def _method_label(cfg: FinetuneConfig, rho: float) -> str:
    from attnprune.methods import registry
    if registry.get(cfg.method).kind != "token":
        opts = ",".join(f"{k}={v}" for k, v in sorted(cfg.method_options.items()))
        return f"{cfg.method}[{opts}]" if opts else cfg.method
    sched = "" if cfg.schedule == "single" else f"/{cfg.schedule}"
    return f"{cfg.method}@{rho:g}/L{cfg.after_layer}{sched}"


def prepare(cfg: FinetuneConfig):
    """The data of ``cfg``, loaded and checked with the model's config before any results
    folder is made (:func:`main` calls it first): every problem is a ConfigError of one line
    naming the file, line and column, or the option to set. Returns the ``TextData``."""
    from attnprune.research.data.text import load_text_data
    from attnprune.runs.config import ConfigError

    try:
        data = load_text_data(cfg.data, cfg.text_column, cfg.label_column, cfg.text_pair_column,
                              cfg.task, cfg.train_file, cfg.validation_file, cfg.test_file)
        check_method_task(cfg.method, data.task)  # task "auto" is known only now
        check_depth(cfg, model_config(cfg.model))
    except (ValueError, FileNotFoundError) as e:
        raise ConfigError(str(e)) from None
    return data


def check_depth(cfg: FinetuneConfig, config) -> None:
    """``--layers`` and ``--after-layer`` fit the model's depth (read from its config, before
    the weights load): a token method prunes after layer ``after_layer`` ∈ [1, depth − 1]."""
    n = n_layers_of(config)
    if n is None:
        return
    if cfg.layers is not None and cfg.layers > n:
        raise ValueError(f"layers: {cfg.layers} is more than the {n} layers of {cfg.model}; "
                         f"set --layers 1..{n}")
    depth = cfg.layers or n
    from attnprune.methods import registry
    if cfg.method != FULL and registry.get(cfg.method).kind == "token" and not (
            1 <= cfg.after_layer <= depth - 1):
        raise ValueError(f"after_layer: {cfg.after_layer} is not below the {depth} layers of "
                         f"{cfg.model}" + (f" (--layers {cfg.layers})" if cfg.layers else "")
                         + (f"; set --after-layer 1..{depth - 1}" if depth > 1
                            else "; a 1-layer model has no layer to prune after"))


def run(cfg: FinetuneConfig, results: ResultsDir, data=None) -> dict:
    """Every (seed, ρ) run of ``cfg`` into ``results`` (finished runs are skipped); writes
    summary.json, metrics.csv, predictions and figures. Returns the summary. ``data``: the
    result of :func:`prepare` (loaded here when not given)."""
    from attnprune.train import fit

    if data is None:
        data = prepare(cfg)
    if not results.writer:
        # another process of a multi-process run: same training, but process 0 saves the model
        cfg = dataclasses.replace(cfg, save_model=False)
    results.write_json("data.json", {"source": data.source, "classes": list(data.label_names),
                                     "task": data.task, "pairs": data.train.pairs is not None,
                                     "sizes": {"train": len(data.train), "val": len(data.val),
                                               "test": len(data.test)}})
    from attnprune.methods import registry
    token = cfg.method != FULL and registry.get(cfg.method).kind == "token"
    rhos = cfg.keep_ratio if token else (1.0,)
    for seed in cfg.seeds:
        for rho in rhos:
            label = _label(cfg, rho)
            key = f"{label}__seed{seed}"
            if results.run_done(key):
                if distributed.is_main():
                    print(f"skip {key}: finished earlier")
                continue
            torch.manual_seed(seed)
            model, tok = load_model(cfg.model, data.num_labels, data.label_names)
            teacher = None
            if cfg.init_from is not None:
                load_weights(model, find_weights(cfg.init_from, seed))
                if cfg.distill_weight > 0:
                    teacher, _ = load_model(cfg.model, data.num_labels)
                    load_weights(teacher, find_weights(cfg.init_from, seed))
                    teacher.eval()
            if cfg.layers is not None:
                from attnprune.train.baselines import keep_first_layers

                keep_first_layers(model, cfg.layers)
            _patch(model, cfg, rho, tok)
            test = make_loader(data.test, tok, cfg.eval_batch_size, cfg.max_length, False, 0, cfg.max_test)
            val = make_loader(data.val, tok, cfg.eval_batch_size, cfg.max_length, False, 0, cfg.max_val)
            record: dict = {"label": label, "seed": seed, "keep_ratio": rho, "method": cfg.method}
            full_flops = None
            if cfg.init_from is not None and (cfg.method != FULL or cfg.layers is not None):
                # The full reference: the --init-from model, unpatched, on the same test batches
                # (scored once per seed; its FLOPs count is the denominator of every ratio).
                ref = _reference(model, test, cfg, results, seed)
                record["reference"] = ref
                full_flops = ref["flops"]["measured"]
                if cfg.eval_no_retrain and cfg.epochs > 0:
                    ev = evaluate(model, test, full_flops=full_flops, progress=cfg.progress,
                                  desc=f"{label} no-retrain")
                    results.save_predictions(f"{label}/no-retrain", seed, ev["y_true"],
                                             ev["y_pred"], ev["probs"])
                    record["no_retrain"] = _scalars(ev)
            train = make_loader(data.train, tok, cfg.batch_size, cfg.max_length, True, seed, cfg.max_train)

            def on_epoch_end(epoch, m, val=val):
                ev = evaluate(m, val, reference=False, progress=cfg.progress, desc=f"val {epoch}")
                return {f"val_{k}": v for k, v in _scalars(ev).items() if not isinstance(v, dict)}

            history = []
            if cfg.epochs > 0:
                history = fit(model, train, epochs=cfg.epochs, lr=cfg.lr,
                              weight_decay=cfg.weight_decay, warmup_ratio=cfg.warmup_ratio,
                              grad_accum=cfg.grad_accum, teacher=teacher,
                              distill_weight=cfg.distill_weight,
                              distill_temperature=cfg.distill_temperature,
                              on_epoch_end=on_epoch_end, progress=cfg.progress, desc=label)
            full_model = None
            if cfg.layers is not None and cfg.init_from is not None:
                full_model, _ = load_model(cfg.model, data.num_labels)
                load_weights(full_model, find_weights(cfg.init_from, seed))
            ev = evaluate(model, test, reference=full_flops is None, full_flops=full_flops,
                          timing_batches=cfg.timing_batches,
                          timing_repeats=cfg.timing_repeats, progress=cfg.progress, desc=f"{label} test",
                          full_model=full_model)
            results.save_predictions(label, seed, ev["y_true"], ev["y_pred"], ev["probs"])
            # beside the padded ratios: the fair reference (length-sorted batches), measured by
            # process 0 alone while the others wait
            fair = distributed.on_main(_fair, model, data.test, tok, cfg, full_model)
            if fair is not None:
                ev["fair"] = fair
            if cfg.int8:
                from attnprune.deploy import quantize_int8

                q = quantize_int8(model.cpu().eval(), inplace=False)
                evq = evaluate(q, test, full_flops=None, timing_batches=cfg.timing_batches,
                               timing_repeats=cfg.timing_repeats, progress=cfg.progress,
                               desc=f"{label}+int8 test", full_model=full_model or model,
                               count=False)
                results.save_predictions(f"{label}+int8", seed, evq["y_true"], evq["y_pred"],
                                         evq["probs"])
                record["int8"] = _scalars(evq)
            if cfg.init_from is None and cfg.method != FULL:
                # No trained full model: the reference is these weights with pruning disabled.
                state = api.patch_state(model)
                state.enabled = False
                try:
                    ref = evaluate(model, test, progress=cfg.progress, desc="same weights, no pruning")
                finally:
                    state.enabled = True
                results.save_predictions(FULL, seed, ref["y_true"], ref["y_pred"], ref["probs"])
                record["reference"] = {**_scalars(ref), "what": "same weights, pruning disabled"}
            record.update(test=_scalars(ev), history=history)
            if cfg.save_model and cfg.epochs > 0:
                from attnprune.deploy.hub import save_pretrained

                save_pretrained(model, results.path / "models" / results._key(key), tokenizer=tok)
            results.save_run(key, record)
    # from the saved runs and predictions: process 0's to read, and its summary for everyone
    return distributed.on_main(summarize, cfg, results)


def _reference(model, loader, cfg, results: ResultsDir, seed: int) -> dict:
    """Test scores of the --init-from weights with the patch disabled (= the full model),
    computed once per seed and kept in ``reference__seed<N>.json`` + predictions."""
    name = f"reference__seed{seed}.json"
    if results.exists(name):
        return results.read_json(name)
    if cfg.layers is not None:  # the truncated model is not the full one: load the full weights
        model, _ = load_model(cfg.model, int(model.config.num_labels))
        load_weights(model, find_weights(cfg.init_from, seed))
    state = api.patch_state(model)
    if state is not None:
        state.enabled = False
    try:
        ev = evaluate(model, loader, reference=True, progress=cfg.progress, desc="full reference")
    finally:
        if state is not None:
            state.enabled = True
    results.save_predictions(FULL, seed, ev["y_true"], ev["y_pred"], ev["probs"])
    ref = _scalars(ev)
    results.write_json(name, ref)
    return ref


def _scalars(ev: dict) -> dict:
    return {k: v for k, v in ev.items() if k not in ("y_true", "y_pred", "probs")}
