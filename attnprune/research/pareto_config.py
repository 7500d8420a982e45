"""The settings of ``attnprune pareto`` (:class:`ParetoConfig`) and the points of its front
(:meth:`ParetoConfig.points`): full, layer-drop and pruned points, each checked before any work."""

from __future__ import annotations

from dataclasses import dataclass

from attnprune.selection import check_keep_ratio

__all__ = ["FULL", "INT8", "PHASES", "ParetoConfig"]

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
        from attnprune.research.finetune.config import check_data_files

        check_data_files(self)  # the files exist; not --data beside --train-file

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
