"""``attnprune pareto``: does token pruning earn a place on the accuracy–latency front against
what users try first — a shallower model and int8?

    attnprune pareto --config configs/pareto_shakespeare.yaml --out results/pareto

One results folder holds every point of the front, each scored on the same test examples:

* ``full``: the encoder fine-tuned on the task (``full_epochs``), one per seed;
* ``layers=N`` for N in ``layer_drop``: the first N layers of that seed's full model
  (:func:`attnprune.train.baselines.keep_first_layers`), fine-tuned ``epochs`` more with
  distillation from it (the strongest simple layer-dropping recipe);
* ``<method>[:<options>]@ρ/L<l>`` for each entry of ``prune`` (``attention_mass:cls@0.35/L1``):
  the full model patched with the token method (``attnprune.patch``), fine-tuned the same
  way (pruning-aware, distilled); with ``layers: N`` in the entry (label ``…/depthN``), the
  first N layers of the full model are kept and then pruned: token pruning composed with
  layer-dropping, the way it composes with int8; with ``rank_distill: w`` (label ``…/rankw``)
  the fine-tuning adds ranking distillation (:mod:`attnprune.train.rank_distill`: the full model's
  token importance as the target of the scorer at the first cut, weight w); with ``schedule:
  search`` and ``flops_budget: b`` (label ``…@searchb``) the per-layer keep ratios are searched
  under that FLOPs budget (:mod:`attnprune.train.schedule_search`: greedy, the least KL to the full
  model's predictions per FLOP saved) once per folder, on the first seed's full model and
  ``search_examples`` (64) validation passages, kept in ``search.json`` and used by every
  seed and by the time phase;
* ``… +int8`` for every one of these (``int8: true``): the trained model after dynamic int8
  quantization of its Linear layers (:func:`attnprune.deploy.quantize_int8`), scored on CPU.

Phases (``phase``; ``all`` runs them in order, each resumes):

1. ``train``: every (point, seed) run; a finished run (``runs/<label>__seed<N>.json`` and its
   predictions) is never redone, so a killed run resumes where it stopped. Runs on the GPU
   when there is one (``accelerate``); int8 points are scored on CPU.
2. ``time``: measured FLOPs and wall time of every point, in one process, interleaved
   (``measure.time_interleaved``), at each ``timing_batch_sizes`` on test examples:
   *fair* — batches of length-sorted examples, so no model pays for padding (the reference a
   user gets by sorting inputs; a pruned model's row bucketing cannot claim it) — and
   *padded* — batches in file order, each padded to its longest row. Top-k methods keep a
   fixed count per row, so their time does not depend on the trained weights: every point is
   timed with the pretrained encoder's weights and the point's structure (depth, patch,
   int8). Written to ``timing.json`` (the timing is one unit: a kill redoes it).
3. ``summary``: ``summary.json``, ``pareto.csv``, ``pareto.md`` and ``pareto.png``.

Statistics (``summary.json["points"][label]``): accuracy mean and 95 % t-interval over seeds;
Δ accuracy against ``full`` (``vs_full``), against the nearest-latency layer-drop point with the
same quantization (``vs_layer_drop``: the layer-drop point whose fair batch-32 latency is
closest, faster or slower) and against the nearest layer-drop point (± int8) at equal or lower
latency (``vs_layer_drop_le``: the slowest layer-drop point no slower than the point, the
competitor it has to beat; the table's column), each as (a) a paired bootstrap CI over test
examples of the seed-averaged correctness difference (primary: rows paired within each seed,
the same examples resampled for every seed), (b) the t-interval of the per-seed differences
(training variance, 2 df at 3 seeds: wide), and a p-value from the McNemar test on discordant
pairs summed over seeds (the Mantel–Haenszel test for matched pairs stratified by seed); Holm
over the whole family of p-values. ``vs_drop``: for a point with ``options: {reduce: merge}``,
the same Δ against the point that differs from it only by dropping (same quantization), in the
Holm family, with ``noninferior`` (lower CI bound > −``margin``). ``vs_layer_drops_le``: Δ and CI against every layer-drop
point at equal or lower latency. ``on_front``: per timed batch size, whether no other point
has fair latency ≤ and mean accuracy ≥ (one strictly): the front, ringed in the figure.
``verdict`` marks the points that meet the issue's bar, all of:
at least ``min_seeds`` (3) seeds (fewer: reported, never "meets bar"), fair latency ≤
``latency_bar`` (0.5) × full, lower CI bound of Δ vs full > −``margin`` (1 pp), and more accurate
than every layer-drop point (± int8) whose latency is at most its own: in mean accuracy
(``beats_layer_drop_at_le_latency``) and by a paired Δ whose CI excludes 0
(``beats_layer_drop_ci_at_le_latency``).

Only top-k token methods can be points (their kept count is ⌊ρ·n⌋): methods whose kept count
depends on the trained weights (``variable_budget``: LTP, entropy_threshold, ...) are refused
before any work, since the time phase uses untrained weights.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import torch

from attnprune import api
from attnprune.measure import count_flops, env_info, time_interleaved
from attnprune.research.pareto_config import FULL, INT8, PHASES, ParetoConfig
from attnprune.research.pareto_summary import summarize
from attnprune.runs.command import run_command
from attnprune.runs.config import ConfigError
from attnprune.runs.results import ResultsDir, atomic_write_text

__all__ = ["FULL", "INT8", "PHASES", "ParetoConfig", "main", "run", "summarize"]

# the command's config, defined in pareto_config (``attnprune pareto --help`` lists its fields)
CONFIG = "attnprune.research.pareto_config:ParetoConfig"


# ----------------------------------------------------------------------------- building
def shape(model, point: dict):
    """Give ``model`` (in place) the point's structure: its first ``layers`` layers (layer-drop
    points, and pruned points with a depth), then the token method's patch."""
    from attnprune.train.baselines import keep_first_layers

    if point.get("layers") is not None and point["kind"] in ("layers", "prune"):
        keep_first_layers(model, point["layers"])
    if point["kind"] == "prune":
        api.patch(model, point["method"], keep_ratio=point["keep_ratio"],
                  after_layer=point["after_layer"], schedule=point["schedule"],
                  **point["options"])
    return model


SEARCH_FILE = "search.json"


def searched(results: ResultsDir, cfg: ParetoConfig, point: dict, full_model=None,
             data=None, tok=None) -> dict:
    """``point`` with its searched schedule (``schedule: search``; other points unchanged).
    The search (:func:`attnprune.train.schedule_search.search_schedule`) runs once per folder, on the
    first full model that reaches it (the first seed's) and the first ``search_examples``
    validation passages, and is kept in ``search.json``: every seed and the time phase use
    that one schedule, so the point has one cost. Without ``full_model`` (the time phase) a
    missing search is an error."""
    if point.get("schedule") != "search":
        return point
    path = results.path / SEARCH_FILE
    found = json.loads(path.read_text()) if path.is_file() else {}
    if point["label"] not in found:
        if full_model is None:
            raise ConfigError(f"{point['label']}: its schedule is searched on a trained full "
                              f"model: run the train phase first (it writes {SEARCH_FILE})")
        from attnprune.train.schedule_search import search_schedule

        rows = np.arange(min(point["search_examples"], len(data.val)))
        batches = list(_loader(data.val, tok, cfg.eval_batch_size, cfg.max_length, order=rows))
        device = "cuda" if torch.cuda.is_available() else "cpu"  # as the training runs
        batches = [{k: v.to(device) for k, v in b.items() if k != "labels"} for b in batches]
        res = search_schedule(full_model, batches, point["flops_budget"],
                              method=point["method"], options=point["options"],
                              progress=print if cfg.progress else None)
        res["searched_on"] = {"examples": int(rows.size), "split": "val"}
        found[point["label"]] = res
        atomic_write_text(path, json.dumps(found, indent=2))
        print(f"{point['label']}: searched schedule {res['schedule']} "
              f"(FLOPs {res['flops']:.3f}, KL {res['kl']:.4f})")
    return {**point, "schedule": list(found[point["label"]]["schedule"])}


def build(base, point: dict, *, int8: bool = False):
    """A copy of ``base`` (a loaded model) given the point's structure: truncated, patched,
    and with ``int8`` quantized (on CPU). The copy is independent of ``base``."""
    m = shape(copy.deepcopy(base), point)
    if int8:
        from attnprune.deploy import quantize_int8

        m = quantize_int8(m.cpu().float().eval(), inplace=True)
    return m.eval()


def _loader(split, tokenizer, batch_size, max_length, *, shuffle=False, seed=0, limit=None,
            order=None):
    from attnprune.research.finetune.loaders import make_loader

    if order is None:
        return make_loader(split, tokenizer, batch_size, max_length, shuffle, seed, limit)
    from torch.utils.data import DataLoader

    def collate(rows):
        enc = tokenizer([split.texts[i] for i in rows], padding=True, truncation=True,
                        max_length=max_length, return_tensors="pt")
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                "labels": torch.as_tensor(split.labels[rows])}

    return DataLoader(list(order), batch_size=batch_size, shuffle=False, collate_fn=collate)


@torch.inference_mode()
def predict(model, loader, *, progress: bool = False, desc: str = "eval") -> dict:
    """Class probabilities of ``model`` on every batch of ``loader`` (on the model's device)."""
    from tqdm.auto import tqdm

    dev = next(model.parameters()).device if any(True for _ in model.parameters()) else "cpu"
    model.eval()
    ys, probs = [], []
    for batch in tqdm(loader, desc=desc, disable=not progress, leave=False):
        out = model(input_ids=batch["input_ids"].to(dev),
                    attention_mask=batch["attention_mask"].to(dev))
        probs.append(out.logits.float().softmax(-1).cpu().numpy())
        ys.append(batch["labels"].numpy())
    p = np.concatenate(probs)
    y = np.concatenate(ys)
    return {"y_true": y, "y_pred": p.argmax(1), "probs": p, "accuracy": float((p.argmax(1) == y).mean())}


# ----------------------------------------------------------------------------- phase 1
def train_phase(cfg: ParetoConfig, results: ResultsDir, data) -> None:
    """Every (point, seed) run not yet finished: train, score on test, int8 variant."""
    from attnprune.research.finetune.model_io import load_model, load_weights, save_weights
    from attnprune.train import fit

    points = cfg.points()
    for seed in cfg.seeds:
        todo = [p for p in points if not _done(results, p["label"], seed, cfg.int8)]
        if not todo:
            continue
        full_dir = results.path / "models" / f"{FULL}__seed{seed}"
        full_pt = points[0]
        # the full model first: every other point starts from it (trained again, and its
        # record replaced, only when its weights are missing, e.g. a folder merged from
        # another machine)
        for point in [full_pt] + [p for p in todo if p["kind"] != "full"]:
            label = point["label"]
            key = f"{label}__seed{seed}"
            torch.manual_seed(seed)
            model, tok = load_model(cfg.model, data.n_classes)
            test = _loader(data.test, tok, cfg.eval_batch_size, cfg.max_length,
                           order=_test_rows(data.test, cfg.max_test))
            train = _loader(data.train, tok, cfg.batch_size, cfg.max_length, shuffle=True,
                            seed=seed, limit=cfg.max_train)
            teacher, record, history = None, None, []
            if point["kind"] == "full":
                if (full_dir / "model.safetensors").is_file():
                    load_weights(model, full_dir / "model.safetensors")
                    record = results.load_run(key) if results.run_done(key) else None
                else:
                    history = fit(model, train, epochs=cfg.full_epochs, lr=cfg.full_lr or cfg.lr,
                                  weight_decay=cfg.weight_decay, warmup_ratio=cfg.warmup_ratio,
                                  progress=cfg.progress, desc=f"{label} s{seed}",
                                  mixed_precision=cfg.mixed_precision)
                    save_weights(model, full_dir)
            else:
                load_weights(model, full_dir / "model.safetensors")
                teacher = copy.deepcopy(model).eval()
                point = searched(results, cfg, point, model, data, tok)
                shape(model, point)
                if results.run_done(key):
                    record = results.load_run(key)
                else:
                    history = fit(model, train, epochs=cfg.epochs, lr=cfg.lr,
                                  weight_decay=cfg.weight_decay, warmup_ratio=cfg.warmup_ratio,
                                  teacher=teacher, distill_weight=cfg.distill_weight,
                                  distill_temperature=cfg.distill_temperature,
                                  rank_distill=point.get("rank_distill", 0.0),
                                  progress=cfg.progress, desc=f"{label} s{seed}",
                                  mixed_precision=cfg.mixed_precision)
            if record is None:
                ev = predict(model, test, progress=cfg.progress, desc=f"{label} s{seed} test")
                results.save_predictions(label, seed, ev["y_true"], ev["y_pred"], ev["probs"])
                state = api.patch_state(model)
                record = {"label": label, "seed": seed, "point": point, "accuracy": ev["accuracy"],
                          "n": int(ev["y_true"].size), "history": history,
                          "device": str(next(model.parameters()).device),
                          "kept_ratio": (state.stats.get("kept_ratio") if state else 1.0)}
                results.save_run(key, record)
                print(f"{key}: accuracy {ev['accuracy']:.4f}")
            if cfg.int8 and not results.run_done(key + INT8):
                q = build(model.cpu(), {"kind": "as is"}, int8=True)  # keeps depth and patch
                ev = predict(q, test, progress=cfg.progress, desc=f"{label}{INT8} s{seed} test")
                results.save_predictions(label + INT8, seed, ev["y_true"], ev["y_pred"], ev["probs"])
                results.save_run(key + INT8, {"label": label + INT8, "seed": seed,
                                              "point": {**point, "int8": True},
                                              "accuracy": ev["accuracy"], "n": int(ev["y_true"].size),
                                              "device": "cpu"})
                print(f"{key}{INT8}: accuracy {ev['accuracy']:.4f}")


def _test_rows(split, limit: int | None) -> np.ndarray:
    """The scored test rows: all, or ``limit`` evenly spaced ones (test files are often grouped
    by class or source, so the first rows would not be a fair sample)."""
    n = len(split)
    if limit is None or limit >= n:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, limit).round().astype(int))


def _done(results: ResultsDir, label: str, seed: int, int8: bool) -> bool:
    key = f"{label}__seed{seed}"
    return results.run_done(key) and (not int8 or results.run_done(key + INT8))


# ----------------------------------------------------------------------------- phase 2
def _timing_batches(split, tok, cfg: ParetoConfig, batch_size: int) -> dict[str, list[dict]]:
    """``fair``: batches of length-sorted test examples (no padding to speak of), and
    ``padded``: batches in file order; ``timing_batches`` of each, evenly spaced
    (:func:`attnprune.research.finetune.timing_batches`, which finetune's fair reference shares)."""
    from attnprune.research.finetune.loaders import timing_batches

    return timing_batches(split, tok, _test_rows(split, cfg.max_test), batch_size,
                          cfg.max_length, cfg.timing_batches)


def time_phase(cfg: ParetoConfig, results: ResultsDir, data) -> dict:
    """FLOPs and interleaved wall time of every point (fp32 and int8), per batch size and
    ordering, relative to ``full`` measured in the same rounds."""
    from tqdm.auto import tqdm

    from attnprune.research.finetune.model_io import load_model

    base, tok = load_model(cfg.model, data.n_classes)
    base.eval()
    points = [searched(results, cfg, p) for p in cfg.points()]
    models = {}
    for p in points:
        models[p["label"]] = build(base, p)
        if cfg.int8:
            models[p["label"] + INT8] = build(base, p, int8=True)
    timing: dict = {"threads": torch.get_num_threads(), "weights": "pretrained encoder, new head "
                    "(top-k points keep a fixed count per row: time does not depend on weights)",
                    "batch_sizes": {}}
    for bs in cfg.timing_batch_sizes:
        batches = _timing_batches(data.test, tok, cfg, bs)
        per_bs = {}
        for order, bl in batches.items():
            def runner(m, bl=bl):
                def f():
                    with torch.inference_mode():
                        for inp in bl:
                            m(**inp)
                return f

            flops = {}
            for label, m in tqdm(models.items(), desc=f"FLOPs b{bs} {order}", disable=not cfg.progress,
                                 leave=False):
                if label.endswith(INT8):
                    flops[label] = None  # quantized kernels are not counted by FlopCounterMode
                    continue
                with torch.inference_mode():
                    flops[label] = sum(count_flops(lambda inp=inp, m=m: m(**inp)) for inp in bl)
            kept = {}
            for label, m in models.items():
                st = api.patch_state(m)
                if st is not None:
                    with torch.inference_mode():
                        m(**bl[0])
                    kept[label] = st.stats.get("kept_ratio")
            t = time_interleaved({k: runner(m) for k, m in models.items()},
                                 repeats=cfg.timing_repeats, warmup=1)
            ref_t, ref_f = t[FULL].median_s, flops[FULL]
            per_bs[order] = {
                label: {"median_s": t[label].median_s, "mad_s": t[label].mad_s,
                        "time_relative": t[label].median_s / ref_t,
                        "flops": flops[label],
                        "flops_relative": None if flops[label] is None else flops[label] / ref_f,
                        "kept_ratio": kept.get(label, 1.0),
                        "tokens": int(sum(int(b["attention_mask"].sum()) for b in bl)),
                        "slots": int(sum(b["input_ids"].numel() for b in bl))}
                for label in models}
            print(f"timed batch {bs} ({order}): " + ", ".join(
                f"{k} {v['time_relative']:.2f}" for k, v in per_bs[order].items()))
        timing["batch_sizes"][str(bs)] = per_bs
    timing["env"] = env_info()
    results.write_json("timing.json", timing)
    return timing


# ----------------------------------------------------------------------------- command
def load_data(cfg: ParetoConfig):
    """The data of ``cfg`` (``--data`` or the split files); a problem is a ConfigError of one
    line naming the file, line and column, raised before any results folder is made."""
    from attnprune.research.data.text import load_text_data
    from attnprune.runs.config import ConfigError

    try:
        return load_text_data(cfg.data, cfg.text_column, cfg.label_column,
                              train_file=cfg.train_file, validation_file=cfg.validation_file,
                              test_file=cfg.test_file)
    except (ValueError, FileNotFoundError) as e:
        raise ConfigError(str(e)) from None


def run(cfg: ParetoConfig, results: ResultsDir, data=None) -> dict:
    if data is None:
        data = load_data(cfg)
    results.write_json("data.json", {"source": data.source, "classes": list(data.label_names),
                                     "sizes": {"train": len(data.train), "val": len(data.val),
                                               "test": len(data.test)}})
    if cfg.phase in ("all", "train"):
        train_phase(cfg, results, data)
    if cfg.phase in ("all", "time"):
        time_phase(cfg, results, data)
    return summarize(cfg, results)


def main(argv: list[str]) -> int:
    """``attnprune pareto [--config FILE] [--key value ...] --out DIR``."""
    if "--help" in argv or "-h" in argv:
        from attnprune.runs.config import print_help

        print_help(__doc__, ParetoConfig)
        return 0
    from attnprune.runs.distributed import launched

    if launched():
        # every process would time on the same machine at once, and each point reads the full
        # model's weights that another process may still be writing: refuse before any work
        raise ConfigError("pareto runs in one process: start it without torchrun / "
                          "accelerate launch (finetune is the multi-process command)")

    def prepare(cfg: ParetoConfig):
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        return load_data(cfg)  # data problems stop here, before the results folder

    def body(cfg: ParetoConfig, results: ResultsDir, data) -> str | None:
        run(cfg, results, data)
        table = results.path / "pareto.md"
        return table.read_text() if table.is_file() else None  # the last line: no folder line

    # resuming a results folder: its saved config is the base (parse_command_line), and an
    # option given that differs from it is refused (ResultsDir.start), --phase aside
    return run_command(argv, ParetoConfig, "pareto", body, prepare=prepare, end_with_folder=False)
