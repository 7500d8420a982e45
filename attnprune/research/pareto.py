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
over the whole family of p-values. ``vs_layer_drops_le``: Δ and CI against every layer-drop
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
import math
from dataclasses import dataclass

import numpy as np
import torch

from attnprune import api
from attnprune.measure import count_flops, env_info, time_interleaved
from attnprune.runs.config import ConfigError, parse_command_line, to_dict
from attnprune.runs.results import ResultsDir, atomic_write_text
from attnprune.selection import check_keep_ratio

__all__ = ["ParetoConfig", "main", "run", "summarize"]

FULL = "full"
INT8 = "+int8"
PHASES = ("all", "train", "time", "summary")


@dataclass(frozen=True)
class ParetoConfig:
    """Settings of ``attnprune pareto`` (every field is a ``--key value`` option)."""

    model: str = "minilm"
    data: str = "shakespeare_genre"
    text_column: str = "text"
    label_column: str = "label"
    train_file: str | None = None  # your own splits instead of --data, as in attnprune finetune
    validation_file: str | None = None  # none: 10 % of --train-file
    test_file: str | None = None  # none: --validation-file is scored, val = 10 % of train
    max_length: int = 256
    seeds: tuple[int, ...] = (0, 1, 2)
    full_epochs: int = 3
    epochs: int = 2  # layer-drop and pruned points, from the full model of the same seed
    lr: float = 5e-5
    full_lr: float | None = None  # default: lr
    batch_size: int = 16
    eval_batch_size: int = 32
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    distill_weight: float = 0.5
    distill_temperature: float = 2.0
    mixed_precision: str = "auto"  # training: bf16 autocast on a CUDA GPU, fp32 on CPU
    max_train: int | None = None
    max_test: int | None = None
    layer_drop: tuple[int, ...] = (1, 2, 3, 4, 5)
    # token-pruning points: {method, keep_ratio (a number or a list = a sweep), after_layer,
    # schedule, options}; every ρ is one point
    prune: tuple[dict, ...] = (
        {"method": "attention_mass", "keep_ratio": [0.2, 0.3, 0.5], "after_layer": 1,
         "options": {"variant": "cls"}},
    )
    int8: bool = True
    phase: str = "all"
    timing_batch_sizes: tuple[int, ...] = (32, 1)
    timing_batches: int = 2  # batches per batch size, evenly spaced over the test split
    timing_repeats: int = 5
    threads: int | None = None
    margin: float = 0.01  # non-inferiority margin δ on accuracy (1 pp)
    latency_bar: float = 0.5  # the verdict's bound on fair batch-32 latency relative to full
    # the verdict's least number of seeds: the CI of Δ vs full is over test examples only, so
    # with one seed nothing measures training variance (and 2 seeds give 1 df): below this a
    # point is reported but never "meets bar"
    min_seeds: int = 3
    progress: bool = True

    def __post_init__(self) -> None:
        from attnprune.methods import registry
        if self.phase not in PHASES:
            raise ValueError(f"phase must be one of {', '.join(PHASES)}, got {self.phase!r}")
        if not self.seeds:
            raise ValueError("seeds: give at least one seed")
        for name in ("full_epochs", "epochs", "batch_size", "eval_batch_size", "max_length",
                     "timing_batches", "timing_repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        for name in ("max_train", "max_test", "threads"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"{name} must be ≥ 1, got {v}")
        if self.min_seeds < 2:
            raise ValueError(f"min_seeds must be ≥ 2 (one seed says nothing of training "
                             f"variance), got {self.min_seeds}")
        for name in ("lr", "full_lr"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise ValueError(f"{name} must be > 0, got {v}")
        if not 0 <= self.distill_weight <= 1:
            raise ValueError(f"distill_weight must be in [0, 1], got {self.distill_weight}")
        for i, n in enumerate(self.layer_drop):
            if n < 1:
                raise ValueError(f"layer_drop[{i}] must be ≥ 1, got {n}")
        if not self.timing_batch_sizes or min(self.timing_batch_sizes) < 1:
            raise ValueError(f"timing_batch_sizes: give sizes ≥ 1, got {self.timing_batch_sizes}")
        for i, p in enumerate(self.prune):
            if not isinstance(p, dict):
                raise ValueError(f"prune[{i}]: expected a mapping with 'method', got {p!r}")  # noqa: TRY004 (config contract: ValueError naming the field)
            unknown = set(p) - {"method", "keep_ratio", "after_layer", "schedule", "options",
                                "layers", "rank_distill", "flops_budget", "search_examples"}
            if unknown:
                raise ValueError(f"prune[{i}].{min(unknown)}: unknown key (known: method, "
                                 "keep_ratio, after_layer, schedule, options, layers, "
                                 "rank_distill, flops_budget, search_examples)")
            if p.get("schedule") == "search":
                b = p.get("flops_budget")
                if isinstance(b, bool) or not isinstance(b, (int, float)) or not 0 < b <= 1:
                    raise ValueError(f"prune[{i}].flops_budget: schedule 'search' needs a FLOPs "
                                     f"budget in (0, 1] (relative to full), got {b!r}")
                if p.get("layers") is not None:
                    raise ValueError(f"prune[{i}].layers: schedule 'search' searches the full "
                                     "depth; give it without layers")
                ex = p.get("search_examples", 64)
                if isinstance(ex, bool) or not isinstance(ex, int) or ex < 1:
                    raise ValueError(f"prune[{i}].search_examples: must be an integer ≥ 1, "
                                     f"got {ex!r}")
            elif "flops_budget" in p or "search_examples" in p:
                key = "flops_budget" if "flops_budget" in p else "search_examples"
                raise ValueError(f"prune[{i}].{key}: only with schedule: search")
            rank = p.get("rank_distill", 0)
            if isinstance(rank, bool) or not isinstance(rank, (int, float)) or not rank >= 0:
                raise ValueError(f"prune[{i}].rank_distill: must be a number ≥ 0, got {rank!r}")

            depth = p.get("layers")
            if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int)
                                      or depth < 1):
                raise ValueError(f"prune[{i}].layers: must be an integer ≥ 1, got {depth!r}")
            if depth is not None and int(p.get("after_layer", 1)) >= depth:
                raise ValueError(f"prune[{i}].after_layer: must be below layers ({depth}) so "
                                 f"some layer runs on the kept tokens, got {p.get('after_layer', 1)}")
            if "method" not in p:
                raise ValueError(f"prune[{i}].method: missing")
            spec = registry.get(p["method"])  # ValueError naming an unknown method
            if spec.kind != "token":
                raise ValueError(f"prune[{i}].method: {p['method']!r} is a {spec.kind} method; "
                                 "the front compares token methods")
            if rank and not getattr(spec.cls, "needs_attention", False):
                raise ValueError(f"prune[{i}].rank_distill: needs a method that scores by "
                                 f"attention (attention_mass), got {p['method']!r}")
            if getattr(spec.cls, "variable_budget", False):
                # the time phase runs every point with untrained weights (the pretrained
                # encoder): right for top-k methods, whose kept count is ⌊ρ·n⌋ whatever the
                # weights, wrong for thresholds and policies, whose kept count (and so their
                # time and FLOPs) is what training decides; the trained pruned weights are not
                # kept, so they cannot be timed with them either
                raise ValueError(f"prune[{i}].method: {p['method']!r} decides its kept count "
                                 "from trained weights (variable budget), but pareto times "
                                 "every point with untrained weights; use a top-k method "
                                 "here, and measure this one with attnprune finetune")
            rhos = p.get("keep_ratio", 0.5)
            for j, r in enumerate(rhos if isinstance(rhos, (list, tuple)) else [rhos]):
                check_keep_ratio(r, f"prune[{i}].keep_ratio[{j}]")
            if not isinstance(p.get("options", {}), dict):
                raise ValueError(f"prune[{i}].options: expected a mapping")  # noqa: TRY004 (config contract: ValueError naming the field)
        from attnprune.research.finetune import _check_data_files

        _check_data_files(self)  # the files exist; not --data beside --train-file

    def points(self) -> list[dict]:
        """Every trained point: {label, kind: full | layers | prune, ...}; int8 variants are
        derived from these."""
        pts = [{"label": FULL, "kind": "full"}]
        pts += [{"label": f"layers={n}", "kind": "layers", "layers": n} for n in self.layer_drop]
        for p in self.prune:
            rhos = p.get("keep_ratio", 0.5)
            rhos = list(rhos) if isinstance(rhos, (list, tuple)) else [rhos]
            if isinstance(p.get("schedule"), (list, tuple)) or p.get("schedule") == "search":
                rhos = rhos[:1]  # the schedule fixes every layer's ratio: one point
            # the options are part of the name: two scorers at one ρ are two points
            opts = ",".join(f"{v}" if k == "variant" else f"{k}={v}"
                            for k, v in sorted(p.get("options", {}).items()))
            name = p["method"] + (f":{opts}" if opts else "")
            for rho in rhos:
                after = int(p.get("after_layer", 1))
                sched = p.get("schedule", "single")
                if isinstance(sched, (list, tuple)):  # per-layer cumulative keep ratios
                    label = f"{name}@[{','.join(f'{r:g}' for r in sched)}]"
                elif sched == "search":  # per-layer ratios searched under a FLOPs budget
                    label = f"{name}@search{float(p['flops_budget']):g}"
                else:
                    suffix = "" if sched in (None, "single") else f"/{sched}"
                    label = f"{name}@{rho:g}/L{after}{suffix}"
                depth = p.get("layers")
                if depth is not None:
                    label += f"/depth{depth}"
                rank = float(p.get("rank_distill", 0) or 0)
                if rank:
                    label += f"/rank{rank:g}"
                search = ({"flops_budget": float(p["flops_budget"]),
                           "search_examples": int(p.get("search_examples", 64))}
                          if sched == "search" else {})
                pts.append({"label": label, "kind": "prune",
                            "method": p["method"], "keep_ratio": float(rho), "after_layer": after,
                            "schedule": sched, "options": dict(p.get("options", {})),
                            "layers": depth, **({"rank_distill": rank} if rank else {}),
                            **search})
        return pts


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
    from attnprune.research.finetune import _loader as ft_loader

    if order is None:
        return ft_loader(split, tokenizer, batch_size, max_length, shuffle, seed, limit)
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
    from attnprune.research.finetune import load_model, load_weights, save_weights
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
    from attnprune.research.finetune import timing_batches

    return timing_batches(split, tok, _test_rows(split, cfg.max_test), batch_size,
                          cfg.max_length, cfg.timing_batches)


def time_phase(cfg: ParetoConfig, results: ResultsDir, data) -> dict:
    """FLOPs and interleaved wall time of every point (fp32 and int8), per batch size and
    ordering, relative to ``full`` measured in the same rounds."""
    from tqdm.auto import tqdm

    from attnprune.research.finetune import load_model

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


# ----------------------------------------------------------------------------- phase 3
def _paired(preds: dict, a: str, b: str, seeds: list[int], n_resamples: int = 10_000,
            rng_seed: int = 0) -> dict | None:
    """Δ accuracy a − b over the seeds both have: bootstrap CI over examples of the
    seed-averaged correctness difference, t-interval over per-seed differences, and the
    McNemar test on discordant pairs summed over seeds (Mantel–Haenszel for matched pairs)."""
    from scipy import stats as sps

    from attnprune.runs.stats import mcnemar

    common = [s for s in seeds if (a, s) in preds and (b, s) in preds]
    if not common:
        return None
    y = preds[(a, common[0])]["y_true"]
    ca = np.stack([preds[(a, s)]["y_pred"] == y for s in common]).astype(float)
    cb = np.stack([preds[(b, s)]["y_pred"] == y for s in common]).astype(float)
    d = (ca - cb).mean(0)  # (n,) per-example, seed-averaged
    rng = np.random.default_rng(rng_seed)
    idx = rng.integers(0, d.size, size=(n_resamples, d.size))
    boot = d[idx].mean(1)
    per_seed = (ca - cb).mean(1)
    out = {"a": a, "b": b, "diff": float(d.mean()), "ci95": [float(q) for q in np.quantile(boot, [0.025, 0.975])],
           "per_seed": per_seed.tolist(), "seeds": common,
           "mcnemar": None}
    if len(common) > 1:
        half = sps.t.ppf(0.975, len(common) - 1) * per_seed.std(ddof=1) / math.sqrt(len(common))
        out["seed_t_ci95"] = [float(per_seed.mean() - half), float(per_seed.mean() + half)]
    nb = int(((ca == 1) & (cb == 0)).sum())
    nc = int(((ca == 0) & (cb == 1)).sum())
    t = mcnemar(nb, nc, "auto")
    out.update(p=float(t.pvalue), discordant=[nb, nc], test=f"mcnemar ({t.method}), "
               "discordant pairs summed over seeds")
    return out


def summarize(cfg: ParetoConfig, results: ResultsDir) -> dict:
    """summary.json, pareto.csv / .md / .png from the runs, predictions and timing.json."""
    from attnprune.runs.stats import aggregate_seeds, holm

    preds = {}
    for f in sorted((results.path / "predictions").glob("*.npz")):
        stem, _, seed = f.stem.rpartition("__seed")
        with np.load(f, allow_pickle=False) as z:
            preds[(stem, int(seed))] = {k: z[k] for k in z.files}
    key = ResultsDir._key
    labels = []
    for p in cfg.points():
        labels.append(p["label"])
        if cfg.int8:
            labels.append(p["label"] + INT8)
    timing = results.read_json("timing.json") if (results.path / "timing.json").is_file() else None
    points: dict = {}
    for label in labels:
        seeds = [s for s in cfg.seeds if (key(label), s) in preds]
        if not seeds:
            continue
        accs = [float((preds[(key(label), s)]["y_pred"] == preds[(key(label), s)]["y_true"]).mean())
                for s in seeds]
        e: dict = {"n_seeds": len(seeds), "seeds": seeds, "int8": label.endswith(INT8),
                   "family": _family(label)}
        e["accuracy"] = ({"mean": accs[0], "per_seed": accs, "ci95": None} if len(accs) == 1
                         else aggregate_seeds(accs))
        if timing is not None:
            for bs, per in timing["batch_sizes"].items():
                for order, rows in per.items():
                    if label in rows:
                        e.setdefault("time", {}).setdefault(bs, {})[order] = rows[label]["time_relative"]
                        if order == "fair":
                            e.setdefault("flops_relative", {})[bs] = rows[label]["flops_relative"]
                            e.setdefault("kept_ratio", rows[label]["kept_ratio"])
        points[label] = e
    kp = {(lab, s): preds[(key(lab), s)] for lab in points for s in points[lab]["seeds"]}
    comparisons = []
    big = str(max(cfg.timing_batch_sizes))
    for label, e in points.items():
        if label == FULL:
            continue
        c = _paired(kp, label, FULL, cfg.seeds)
        if c is not None:  # one dict: Holm's p below reaches the point's record too
            c["against"] = "full"
            comparisons.append(c)
            e["vs_full"] = c
        lat = _lat(e, big)
        if e["family"] != "layer-drop" and lat is not None:
            near = _nearest_layer_drop(points, lat, e["int8"], big)
            if near is not None:
                c = _paired(kp, label, near, cfg.seeds)
                if c is not None:
                    c["against"] = "nearest-latency layer-drop"
                    comparisons.append(c)
                    e["vs_layer_drop"] = c
            below = _layer_drops_at_or_below(points, lat, big)
            if below:  # the fastest competitor that is no slower: the one the front must beat
                c = _paired(kp, label, below[0], cfg.seeds)
                if c is not None:
                    c["against"] = "nearest layer-drop at equal or lower latency"
                    comparisons.append(c)
                    e["vs_layer_drop_le"] = c
    ps = [c["p"] for c in comparisons]
    if ps:
        for c, ph in zip(comparisons, holm(ps), strict=True):
            c["p_holm"] = float(ph)
    # the bar
    full_lat = 1.0
    for label, e in points.items():
        if e["family"] in ("full", "layer-drop") or "vs_full" not in e:
            continue
        lat = _lat(e, big)
        if lat is None:
            continue
        slower_ld = _layer_drops_at_or_below(points, lat, big)
        beats = all(e["accuracy"]["mean"] > points[lab]["accuracy"]["mean"] for lab in slower_ld)
        # the issue's stronger form: the pooled paired Δ's CI excludes 0 against every one of
        # them (± int8), not only the means; Δs off the Holm family (a CI rule, not a p rule)
        near = (e.get("vs_layer_drop_le") or {}).get("b")
        vs_all = {lab: (e["vs_layer_drop_le"] if lab == near else _paired(kp, label, lab, cfg.seeds))
                  for lab in slower_ld}
        e["vs_layer_drops_le"] = {lab: None if c is None else
                                  {"diff": c["diff"], "ci95": c["ci95"], "seeds": c["seeds"]}
                                  for lab, c in vs_all.items()}
        e["verdict"] = {
            "enough_seeds": e["n_seeds"] >= cfg.min_seeds,
            "latency_le_bar": lat <= cfg.latency_bar * full_lat,
            "noninferior_to_full": e["vs_full"]["ci95"][0] > -cfg.margin,
            "beats_layer_drop_at_le_latency": beats,
            "beats_layer_drop_ci_at_le_latency": all(c is not None and c["ci95"][0] > 0
                                                      for c in vs_all.values()),
            "layer_drop_points_at_le_latency": slower_ld,
            "min_seeds": cfg.min_seeds,
        }
        e["verdict"]["meets_bar"] = all(v for k, v in e["verdict"].items() if isinstance(v, bool))
    for bs in (timing or {}).get("batch_sizes", {}):
        front = _front(points, bs)
        for label, e in points.items():
            if _lat(e, bs) is not None:
                e.setdefault("on_front", {})[bs] = label in front
    composition = _composition(points, big)
    summary = {"command": "pareto", "env": env_info(), "config": to_dict(cfg),
               "points": points, "comparisons": comparisons, "composition": composition,
               "timing": None if timing is None else {k: v for k, v in timing.items()
                                                       if k != "batch_sizes"}}
    results.write_json("summary.json", summary)
    rows = _table_rows(points, cfg)
    if rows:
        results.write_csv("pareto.csv", rows)
        results.write_text("pareto.md", _markdown(rows, composition))
        if timing is not None:
            _figure(points, cfg, results)
    return summary


def _family(label: str) -> str:
    base = label.removesuffix(INT8)
    if base == FULL:
        return "full"
    if base.startswith("layers="):
        return "layer-drop"
    depth = base.rpartition("/depth")[2] if "/depth" in base else None
    return base.split("@")[0] + (f" ({depth} layers)" if depth else "")


def _lat(e: dict, bs: str, order: str = "fair") -> float | None:
    return ((e.get("time") or {}).get(bs) or {}).get(order)


def _nearest_layer_drop(points: dict, lat: float, int8: bool, bs: str) -> str | None:
    cands = [(abs(_lat(o, bs) - lat), lab) for lab, o in points.items()
             if o["family"] == "layer-drop" and o["int8"] == int8 and _lat(o, bs) is not None]
    return min(cands)[1] if cands else None


def _layer_drops_at_or_below(points: dict, lat: float, bs: str) -> list[str]:
    """The layer-drop points (± int8) whose fair latency at batch ``bs`` is at most ``lat``,
    slowest first (ties: the more accurate first): ``[0]`` is the nearest one at equal or lower
    latency, the competitor a pruned point at ``lat`` has to beat."""
    cands = [(-_lat(o, bs), -o["accuracy"]["mean"], lab) for lab, o in points.items()
             if o["family"] == "layer-drop" and _lat(o, bs) is not None and _lat(o, bs) <= lat]
    return [lab for *_, lab in sorted(cands)]


def _front(points: dict, bs: str) -> set[str]:
    """The accuracy–latency front at batch ``bs``: the points no other point dominates (fair
    latency ≤ and mean accuracy ≥, one of them strictly)."""
    xy = {lab: (_lat(e, bs), e["accuracy"]["mean"]) for lab, e in points.items()
          if _lat(e, bs) is not None}
    return {a for a, (ta, ya) in xy.items()
            if not any(tb <= ta and yb >= ya and (tb < ta or yb > ya) for tb, yb in xy.values())}


def _composition(points: dict, bs: str) -> list[dict]:
    """Speed-ups (1 / relative fair time) of pruned, int8 and pruned + int8, and the product
    of the first two, per pruned point."""
    out = []
    q = points.get(FULL + INT8)
    if q is None or _lat(q, bs) is None:
        return out
    for label, e in points.items():
        if e["int8"] or e["family"] in ("full",) or label + INT8 not in points:
            continue
        tp, tq, tpq = _lat(e, bs), _lat(q, bs), _lat(points[label + INT8], bs)
        if None in (tp, tpq):
            continue
        out.append({"point": label, "batch_size": int(bs), "speedup_method": 1 / tp,
                    "speedup_int8": 1 / tq, "speedup_both": 1 / tpq,
                    "product": 1 / (tp * tq), "both_faster_than_each": tpq < min(tp, tq)})
    return out


def _fmt_ci(c) -> str:
    return "—" if not c else f"[{100 * c[0]:+.2f}, {100 * c[1]:+.2f}]"


def _table_rows(points: dict, cfg: ParetoConfig) -> list[dict]:
    rows = []
    bss = [str(b) for b in cfg.timing_batch_sizes]
    for label, e in sorted(points.items(), key=lambda kv: _lat(kv[1], bss[0]) or 9):
        acc = e["accuracy"]
        vf, vl = e.get("vs_full") or {}, e.get("vs_layer_drop") or {}
        vle = e.get("vs_layer_drop_le") or {}
        row = {"point": label, "seeds": e["n_seeds"], "accuracy": acc["mean"],
               "accuracy_ci95": acc.get("ci95"),
               "delta_vs_full_pp": None if not vf else 100 * vf["diff"],
               "delta_vs_full_ci95_pp": None if not vf else [100 * x for x in vf["ci95"]],
               "p_holm_vs_full": vf.get("p_holm"),
               "nearest_layer_drop": vl.get("b"),
               "delta_vs_layer_drop_pp": None if not vl else 100 * vl["diff"],
               "delta_vs_layer_drop_ci95_pp": None if not vl else [100 * x for x in vl["ci95"]],
               "p_holm_vs_layer_drop": vl.get("p_holm"),
               "layer_drop_le": vle.get("b"),
               "delta_vs_layer_drop_le_pp": None if not vle else 100 * vle["diff"],
               "delta_vs_layer_drop_le_ci95_pp": None if not vle else [100 * x for x in vle["ci95"]],
               "p_holm_vs_layer_drop_le": vle.get("p_holm"),
               "flops_relative": (e.get("flops_relative") or {}).get(bss[0])}
        for bs in bss:
            row[f"time_b{bs}_fair"] = _lat(e, bs, "fair")
            row[f"time_b{bs}_padded"] = _lat(e, bs, "padded")
        for bs in bss:
            row[f"front_b{bs}"] = (e.get("on_front") or {}).get(bs)
        row["meets_bar"] = (e.get("verdict") or {}).get("meets_bar")
        row["enough_seeds"] = (e.get("verdict") or {}).get("enough_seeds")
        rows.append(row)
    return rows


def _markdown(rows: list[dict], composition: list[dict]) -> str:
    def f(x, d=3):
        return "—" if x is None else f"{x:.{d}f}"

    bss = [k[len("time_b"):-len("_fair")] for k in rows[0] if k.startswith("time_b") and k.endswith("_fair")]
    head = ["point", "seeds", "accuracy [95 % CI]", "Δ vs full, pp [95 % CI]", "p_holm",
            "Δ vs layer-drop at ≤ latency, pp [95 % CI]", "p_holm", "FLOPs"]
    head += [f"time b{b} fair (padded)" for b in bss] + ["front", "meets bar"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        ci = r["accuracy_ci95"]
        acc = f"{r['accuracy']:.4f}" + (f" [{ci[0]:.4f}, {ci[1]:.4f}]" if ci else " (1 seed)")
        dv = "—" if r["delta_vs_full_pp"] is None else (
            f"{r['delta_vs_full_pp']:+.2f} [{r['delta_vs_full_ci95_pp'][0]:+.2f}, "
            f"{r['delta_vs_full_ci95_pp'][1]:+.2f}]")
        # the nearest layer-drop point (± int8) at equal or lower fair latency (largest batch)
        dl = "—" if r["delta_vs_layer_drop_le_pp"] is None else (
            f"{r['delta_vs_layer_drop_le_pp']:+.2f} [{r['delta_vs_layer_drop_le_ci95_pp'][0]:+.2f}, "
            f"{r['delta_vs_layer_drop_le_ci95_pp'][1]:+.2f}] vs {r['layer_drop_le']}")
        cells = [r["point"], str(r["seeds"]), acc, dv,
                 "—" if r["p_holm_vs_full"] is None else f"{r['p_holm_vs_full']:.2g}", dl,
                 "—" if r["p_holm_vs_layer_drop_le"] is None else f"{r['p_holm_vs_layer_drop_le']:.2g}",
                 f(r["flops_relative"])]
        cells += [f"{f(r[f'time_b{b}_fair'], 2)} ({f(r[f'time_b{b}_padded'], 2)})" for b in bss]
        cells.append(", ".join(f"b{b}" for b in bss if r.get(f"front_b{b}")))
        bar = {True: "yes", False: "no", None: ""}[r["meets_bar"]]
        cells.append(bar + (" (too few seeds)" if r.get("enough_seeds") is False else ""))
        lines.append("| " + " | ".join(cells) + " |")
    if composition:
        lines += ["", "| point | batch | speed-up method | int8 | both | product | both faster than each |",
                  "|---|---|---|---|---|---|---|"]
        for c in composition:
            lines.append(f"| {c['point']} | {c['batch_size']} | {c['speedup_method']:.2f}× | "
                         f"{c['speedup_int8']:.2f}× | {c['speedup_both']:.2f}× | {c['product']:.2f}× | "
                         f"{'yes' if c['both_faster_than_each'] else 'no'} |")
    return "\n".join(lines) + "\n"


def _figure(points: dict, cfg: ParetoConfig, results: ResultsDir) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bss = [str(b) for b in cfg.timing_batch_sizes]
    fig, axes = plt.subplots(1, len(bss), figsize=(6.5 * len(bss), 4.5), squeeze=False)
    colors = {}
    for ax, bs in zip(axes[0], bss, strict=True):
        groups: dict = {}
        for label, e in points.items():
            lat = _lat(e, bs)
            if lat is None:
                continue
            groups.setdefault((e["family"], e["int8"]), []).append((lat, e["accuracy"], label))
        for (fam, q), pts in sorted(groups.items()):
            pts.sort(key=lambda t: t[0])
            color = colors.setdefault(fam, f"C{len(colors)}")
            xs = [p[0] for p in pts]
            ys = [100 * p[1]["mean"] for p in pts]
            err = [[100 * (p[1]["mean"] - p[1]["ci95"][0]) if p[1].get("ci95") else 0 for p in pts],
                   [100 * (p[1]["ci95"][1] - p[1]["mean"]) if p[1].get("ci95") else 0 for p in pts]]
            ax.errorbar(xs, ys, yerr=err, fmt="--" if q else "-", marker="s" if q else "o",
                        mfc="none" if q else color, color=color, capsize=3,
                        label=f"{fam}{' + int8' if q else ''}")
            for x, y, p in zip(xs, ys, pts, strict=True):
                if fam == "layer-drop":
                    ax.annotate(p[2].removesuffix(INT8).removeprefix("layers="), (x, y),
                                fontsize=7, xytext=(3, -9), textcoords="offset points")
        front = sorted((_lat(points[lab], bs), 100 * points[lab]["accuracy"]["mean"], lab)
                       for lab in _front(points, bs))
        if front:  # the non-dominated points: ringed, joined by the front's staircase
            fx, fy = [t[0] for t in front], [t[1] for t in front]
            ax.step(fx, fy, where="post", color="k", lw=0.8, alpha=0.5, zorder=1)
            ax.scatter(fx, fy, s=140, facecolors="none", edgecolors="k", linewidths=1.0,
                       zorder=3, label="front (non-dominated)")
        ax.axvline(cfg.latency_bar, color="grey", lw=0.8, ls=":")
        ax.set_xlabel(f"wall time relative to full, batch {bs}, length-sorted (fair)")
        ax.set_ylabel("test accuracy, % (mean, 95 % CI over seeds)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"{cfg.data}: accuracy vs measured CPU latency ({cfg.model})", fontsize=10)
    results.save_figure("pareto.png", fig)


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
    from attnprune.runs.config import ConfigError
    from attnprune.runs.distributed import launched

    if launched():
        # every process would time on the same machine at once, and each point reads the full
        # model's weights that another process may still be writing: refuse before any work
        raise ConfigError("pareto runs in one process: start it without torchrun / "
                          "accelerate launch (finetune is the multi-process command)")

    # resuming a results folder: its saved config is the base (parse_command_line), and an
    # option given that differs from it is refused (ResultsDir.start), --phase aside
    cl = parse_command_line(argv, ParetoConfig)
    cfg = cl.config
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    data = load_data(cfg)  # data problems stop here, before the results folder
    results = ResultsDir.start(cl.out, "pareto", cl.exact_out, cfg)
    run(cfg, results, data)
    if (results.path / "pareto.md").is_file():
        print((results.path / "pareto.md").read_text())
    return 0


def load_summary(folder) -> dict:
    return json.loads((ResultsDir(folder).path / "summary.json").read_text())

