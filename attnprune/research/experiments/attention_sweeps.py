"""Sweeps of the attention-level and loss methods on a fine-tuned encoder (issue 4).

    python -m attnprune.research.experiments.attention_sweeps --config configs/attention_crisp.yaml --out results/
    python -m attnprune.research.experiments.attention_sweeps --config configs/attention_cost.yaml --out results/

``sweep: crisp``  crisp top-k attention, s ∈ ``sparsities`` × ``schedules`` (uniform, adaptive);
``sweep: cost``   cost incentive, λ ∈ ``lams`` × ``locations`` (both / attention / ffn).
Each setting is one fine-tune of ``model`` (MiniLM-L6 offline) on ``data`` (tweets) with the
library's own pieces: ``finetune.load_model``, ``train.fit`` (adds ``attnprune.aux_loss``),
``finetune.evaluate`` (accuracy, AUC, FLOPs counted with ``count_flops`` for the method and for
the same weights with the patch disabled on the same batches, wall time with ``time_fn``), and
``analysis.attention_statistics`` (entropy, Gini, realised attention and FFN sparsity).

s = 0 and λ = 0 are the dense model itself (they reproduce it to 1e-5, tested), so they are the
single ``dense`` run, trained with the same seed, data order and schedule; every other setting
is compared with it on the same test examples by ``stats.compare_predictions`` (McNemar with a
paired bootstrap CI for accuracy, DeLong for AUC; Holm over the whole sweep's family).

FLOPs note: crisp and cost run the dense kernels (masked entries are still computed), so the
counted FLOPs do not fall; ``flops.sparse_proxy_relative`` is the analytic FLOPs a kernel could
reach by skipping masked attention pairs (QKᵀ and AV scale with 1 − attention sparsity) and
zero FFN units (the FFN's second matmul scales with 1 − FFN sparsity) — a proxy, labelled so.
Realised savings (the cost paper's Table 3): with ``sparse_ffn_thresholds`` set, every dense
and cost model is evaluated again after training, unpatched (cost is a loss; inference runs the
stock model) and with :mod:`attnprune.deploy.sparse_ffn` on its FFNs, for every threshold × block:
counted FLOPs, wall time interleaved with the same weights on the dense FFN, token and block
sparsity, and predictions (label ``<setting>-sffn<τ>-b<block>``) that join the paired tests
against dense. ``table3.md`` puts them in the paper's layout.
Structured savings (issue 13): ``ffn_penalty: group`` trains with the group-lasso FFN term
(whole units off for every token, :mod:`attnprune.methods.cost`); with ``compact_thresholds``
set, every dense and cost model is also evaluated after :func:`attnprune.deploy.compact_ffn.compact`
cut out its units dead on ``compact_batches`` training batches, at each threshold: units
removed, counted FLOPs relative to the same weights uncompacted and to λ = 0, latency relative
to the same weights uncompacted (interleaved, one process), accuracy and MCC, and predictions
(label ``<setting>-compact<τ>``) that join the paired tests against dense (same Holm family).
``table3_compact.md`` puts them in one table.

Pruning after crisp (issue 13: does a crisp-trained model prune better?): with
``prune_after`` set, the dense and every crisp model are also scored with ``attention_mass``
token pruning at each keep ratio ρ after layer ``prune_after_layer``, without retraining (crisp
stays on underneath, :func:`attnprune.patch` with ``stack=True``, on a copy); their predictions
(label ``<setting>-prune<ρ>``) form their own Holm family against the dense model pruned at the
same ρ, and ``table_prune.md`` gives each model's drop from its unpruned self and the
difference of the drops. ``group_by_length`` and ``mixed_precision: bf16`` make CPU training
about 3× faster for every setting alike (evaluation stays fp32). With several seeds, ``table.md``
gives Δ as the mean with a t-interval over seeds and every seed's p; ``table_pooled.md`` one
more powerful fixed-effect test per setting with the seeds' test rows pooled
(:func:`pooled_comparisons`); ``table_entropy.md`` the attention entropy per layer.

Writes ``config.yaml``, ``summary.json`` (``methods`` + ``comparisons`` + ``sparse_ffn``),
``metrics.csv``, ``table.md``, ``table3.md`` (with the sparse FFN) (the papers' table layout with CIs and Holm-adjusted p), ``predictions/``,
figures; a rerun with the same ``--out`` skips finished settings (``--tabulate-only true``:
only the tables and figures, from the runs finished so far).
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from attnprune import api
from attnprune.research.experiments.attention_sweeps_config import (
    DENSE,
    SWEEPS,
    SweepConfig,
    prune_label,
    settings,
    sparse_proxy_relative,
)
from attnprune.research.experiments.attention_sweeps_tables import summarize
from attnprune.runs.command import run_command
from attnprune.runs.results import ResultsDir

__all__ = ["DENSE", "SWEEPS", "SweepConfig", "compact_label", "compact_runs", "main",
           "prune_after_runs", "prune_label", "run", "run_one", "settings", "sparse_ffn_runs",
           "sparse_label", "sparse_proxy_relative", "summarize"]

# the command's config, defined in attention_sweeps_config (``--help`` lists its fields)
CONFIG = "attnprune.research.experiments.attention_sweeps_config:SweepConfig"


def run_one(cfg: SweepConfig, seed: int, label: str, method: str | None, options: dict,
            data, results: ResultsDir) -> dict:
    """Fine-tune, evaluate and analyse one setting; returns its record (also saved)."""
    from attnprune.research.analysis import attention_statistics, plot_entropy_heatmap
    from attnprune.research.finetune.loaders import make_loader
    from attnprune.research.finetune.model_io import load_model
    from attnprune.research.finetune.scoring import evaluate
    from attnprune.train import fit

    torch.manual_seed(seed)
    model, tok = load_model(cfg.model, data.n_classes)
    if method is not None:
        api.patch(model, method, **options)
    train = make_loader(data.train, tok, cfg.batch_size, cfg.max_length, True, seed, cfg.max_train,
                    group_by_length=cfg.group_by_length)
    test = make_loader(data.test, tok, cfg.eval_batch_size, cfg.max_length, False, 0, cfg.max_eval)
    history = fit(model, train, epochs=cfg.epochs, lr=cfg.lr, progress=cfg.progress, desc=label,
                  mixed_precision=cfg.mixed_precision)
    ev = evaluate(model, test, reference=True, timing_batches=cfg.timing_batches,
                  timing_repeats=cfg.timing_repeats, progress=cfg.progress, desc=f"{label} test")
    results.save_predictions(label, seed, ev["y_true"], ev["y_pred"], ev["probs"])
    an = attention_statistics(model, iter(test), max_batches=cfg.analysis_batches)
    results.save_figure(f"entropy_{label}__seed{seed}.png",
                        plot_entropy_heatmap(an["entropy_bits"], f"{label}: entropy (bits)"))
    lengths = [float(b["attention_mask"].sum(1).float().mean()) for _, b in zip(range(4), test)]
    scalars = {k: v for k, v in ev.items() if k not in ("y_true", "y_pred", "probs")}
    scalars["flops"]["sparse_proxy_relative"] = sparse_proxy_relative(
        model.config, an["sparsity_mean"], an["ffn_sparsity_mean"], float(np.mean(lengths)))
    state = api.patch_state(model)
    if method == "crisp":
        scalars["layer_sparsity_setting"] = state.modules.layer_sparsity()
    record = {"label": label, "seed": seed, "method": method or DENSE, "options": options,
              "test": scalars, "analysis": an, "history": history}
    if cfg.prune_after and method in (None, "crisp"):
        record["pruned"] = prune_after_runs(cfg, model, test, label, seed, results,
                                            scalars["flops"]["full_measured"])
    if cfg.sparse_ffn_thresholds and method in (None, "cost"):
        # cost is a loss: at inference the trained weights run stock (fused SDPA attention)
        api.unpatch(model)
        record["sparse_ffn"] = sparse_ffn_runs(cfg, model, test, label, seed, results,
                                               scalars["flops"]["full_measured"])
    if cfg.compact_thresholds and method in (None, "cost"):
        if api.patch_state(model) is not None:
            api.unpatch(model)  # cost is a loss: the trained weights run stock
        # calibration: the first batches of the training subset the model was tuned on
        calib = make_loader(data.train, tok, cfg.eval_batch_size, cfg.max_length, True, seed,
                        cfg.max_train)
        record["compact"] = compact_runs(cfg, model, calib, test, label, seed, results,
                                         scalars["flops"]["full_measured"])
    results.save_run(f"{label}__seed{seed}", record)
    return record


def prune_after_runs(cfg: SweepConfig, model, test, label: str, seed: int,
                     results: ResultsDir, dense_flops: int) -> dict:
    """A copy of the trained ``model`` with ``attention_mass`` token pruning (keep ratio ρ
    after layer ``prune_after_layer``, no retraining; stacked on crisp for a crisp model) at
    every ρ of ``prune_after``: task metrics (predictions saved for the paired tests of the
    pruning family), FLOPs over the test set relative to ``dense_flops`` (the same weights
    unpruned on the same batches), kept-token ratio."""
    import copy

    from attnprune.research.finetune.scoring import evaluate

    out = {}
    for rho in cfg.prune_after:
        sub = prune_label(label, rho)
        pruned = copy.deepcopy(model).eval()
        api.patch(pruned, "attention_mass", keep_ratio=rho, after_layer=cfg.prune_after_layer,
                  stack=api.patch_state(pruned) is not None)
        ev = evaluate(pruned, test, full_flops=dense_flops, progress=cfg.progress,
                      desc=f"{sub} test")
        results.save_predictions(sub, seed, ev["y_true"], ev["y_pred"], ev["probs"])
        out[f"{rho:g}"] = {"label": sub, "keep_ratio": rho, "after_layer": cfg.prune_after_layer,
                           **{k: v for k, v in ev.items() if k not in ("y_true", "y_pred",
                                                                        "probs")}}
        del pruned
    return out


def sparse_label(label: str, threshold: float, block: int) -> str:
    """Label of ``label``'s model evaluated with the sparse FFN at ``threshold``, ``block``."""
    return f"{label}-sffn{threshold:g}-b{block}"


def sparse_ffn_runs(cfg: SweepConfig, model, test, label: str, seed: int,
                    results: ResultsDir, dense_flops: int) -> dict:
    """The trained ``model`` evaluated with :mod:`attnprune.deploy.sparse_ffn` at every threshold and
    block size:
    task metrics (predictions saved for the paired tests against dense), FLOPs counted over
    the whole test set (``relative`` to ``dense_flops``, the stock model's count on the same
    batches), token and block sparsity, and wall time interleaved with a copy of the same
    weights running the dense FFN (:func:`finetune.time_against_full`)."""
    import copy
    import itertools

    from attnprune.deploy import sparse_ffn
    from attnprune.research.finetune.scoring import evaluate, time_against_full

    dense = copy.deepcopy(model).eval()  # the same weights, dense FFN: the timing reference
    keys = ("input_ids", "attention_mask", "token_type_ids")
    batches = [{k: b[k] for k in keys if k in b} for b in itertools.islice(test, cfg.timing_batches)]
    out = {}
    try:
        for tau, block in itertools.product(cfg.sparse_ffn_thresholds, cfg.sparse_ffn_blocks):
            opts = {"mode": cfg.sparse_ffn_mode, "block": block,
                    "max_active": cfg.sparse_ffn_max_active}
            sub = sparse_label(label, tau, block)
            sparse_ffn.apply(model, threshold=tau, count_zeros=True, **opts)
            ev = evaluate(model, test, full_flops=dense_flops, progress=cfg.progress,
                          desc=f"{sub} test")
            st = sparse_ffn.stats(model)
            results.save_predictions(sub, seed, ev["y_true"], ev["y_pred"], ev["probs"])
            sparse_ffn.apply(model, threshold=tau, **opts)  # timed without the zero count
            timing = time_against_full(model, None, batches, cfg.timing_repeats, full_model=dense)
            out[f"{tau:g}-b{block}"] = {
                "label": sub, "threshold": tau, **opts,
                **{k: v for k, v in ev.items() if k not in ("y_true", "y_pred", "probs")},
                "token_sparsity": st["token_sparsity"], "block_sparsity": st["block_sparsity"],
                "block_sparsity_by_layer": st["block_sparsity_by_layer"],
                "token_sparsity_by_layer": st["token_sparsity_by_layer"], "time": timing}
    finally:
        sparse_ffn.remove(model)
    return out


def compact_label(label: str, threshold: float) -> str:
    """Label of ``label``'s model evaluated compacted at ``threshold``."""
    return f"{label}-compact{threshold:g}"


def compact_runs(cfg: SweepConfig, model, calib, test, label: str, seed: int,
                 results: ResultsDir, dense_flops: int) -> dict:
    """The trained ``model`` compacted (:func:`compact_ffn.compact`, calibrated on the first
    ``compact_batches`` of ``calib``) at every threshold and evaluated: task metrics
    (predictions saved for the paired tests), FLOPs over the whole test set relative to
    ``dense_flops`` (the uncompacted weights on the same batches), latency interleaved with
    the uncompacted weights, units removed per layer."""
    import itertools

    from attnprune.deploy.compact_ffn import compact
    from attnprune.research.finetune.scoring import evaluate

    keys = ("input_ids", "attention_mask", "token_type_ids")
    batches = [{k: b[k] for k in keys if k in b}
               for b in itertools.islice(calib, cfg.compact_batches)]
    model.eval()
    out = {}
    for tau in cfg.compact_thresholds:
        sub = compact_label(label, tau)
        small, report = compact(model, batches, threshold=tau, criterion=cfg.compact_criterion,
                                fold=cfg.compact_fold)
        ev = evaluate(small, test, full_flops=dense_flops, timing_batches=cfg.timing_batches,
                      timing_repeats=cfg.timing_repeats, full_model=model,
                      progress=cfg.progress, desc=f"{sub} test")
        results.save_predictions(sub, seed, ev["y_true"], ev["y_pred"], ev["probs"])
        out[f"{tau:g}"] = {
            "label": sub, "threshold": tau, "criterion": cfg.compact_criterion,
            "fold": cfg.compact_fold, "calibration_batches": len(batches),
            **{k: v for k, v in ev.items() if k not in ("y_true", "y_pred", "probs")},
            "removed_fraction": report["removed_fraction"],
            "kept_by_layer": [v["kept"] for v in report["layers"].values()],
            "units_by_layer": [v["units"] for v in report["layers"].values()]}
        del small
    return out


def run(cfg: SweepConfig, results: ResultsDir) -> dict:
    """Every (setting, seed) of the sweep (finished ones skipped), then the summary."""
    from attnprune.research.data.text import load_text_data

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    data = None if cfg.tabulate_only else load_text_data(cfg.data)
    records = {}
    for seed in cfg.seeds:
        for label, method, options, _ in settings(cfg):
            key = f"{label}__seed{seed}"
            if results.run_done(key):
                records[(label, seed)] = results.load_run(key)
                print(f"skip {key}: finished earlier")
                continue
            if cfg.tabulate_only:
                print(f"missing {key} (tabulate_only: not trained)")
                continue
            records[(label, seed)] = run_one(cfg, seed, label, method, options, data, results)
            summarize(cfg, records, results)  # partial results readable while the sweep runs
    if not records:
        raise ValueError(f"tabulate_only: no finished run of this sweep in {results.path}")
    return summarize(cfg, records, results)


def main(argv: list[str]) -> int:
    """CLI entry: ``[--config FILE] [--key value ...] --out DIR``."""
    if "--help" in argv or "-h" in argv:  # this module's docstring (the config's is another)
        from attnprune.runs.config import print_help

        print_help(__doc__, SweepConfig)
        return 0
    def body(cfg: SweepConfig, out: ResultsDir) -> str:
        summary = run(cfg, out)
        return f"{(out.path / 'table.md').read_text()}\nresults: {out.path}  ({len(summary['methods'])} settings)"

    return run_command(argv, SweepConfig, lambda cfg: f"attention-{cfg.sweep}", body,
                       end_with_folder=False)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
