"""The settings of ``attnprune reproduce attention`` (:class:`SweepConfig`), the runs they make
(:func:`settings`) and the labels of the models evaluated after training; shared by the runs
(:mod:`.attention_sweeps`) and the tables (:mod:`.attention_sweeps_tables`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from attnprune.runs.config import check_training_fields

__all__ = ["DENSE", "PRUNE", "SWEEPS", "SweepConfig", "prune_label", "settings",
           "sparse_proxy_relative"]

DENSE = "dense"
SWEEPS = ("crisp", "cost", "all")  # "all": both sweeps against one dense run, one Holm family


@dataclass(frozen=True)
class SweepConfig:
    """Settings of an attention sweep (every field is a ``--key value`` option)."""

    sweep: str = "crisp"  # crisp | cost
    model: str = "minilm"
    data: str = "tweets"
    sparsities: tuple[float, ...] = (0.0, 0.4, 0.6, 0.8, 0.9)
    schedules: tuple[str, ...] = ("uniform", "adaptive")
    lams: tuple[float, ...] = (0.0, 1e-5, 1e-4, 1e-3, 1e-2)
    locations: tuple[str, ...] = ("both", "attention", "ffn")
    alpha: float = 1.0  # α of C_comp
    beta: float = 1.0  # β of C_comp
    epochs: int = 1
    lr: float = 5e-5
    batch_size: int = 16
    eval_batch_size: int = 64
    max_length: int = 64
    max_train: int | None = None
    max_eval: int | None = None
    seeds: tuple[int, ...] = (0,)
    timing_batches: int = 2
    timing_repeats: int = 5
    analysis_batches: int = 4
    # realised savings (sparse_ffn.py): after training, every setting is also evaluated with
    # its FFN second projections run sparsely at each threshold τ (empty: off)
    sparse_ffn_thresholds: tuple[float, ...] = ()
    sparse_ffn_mode: str = "relu"  # relu: a ≤ τ counts as zero (τ = 0: z ≤ 0); magnitude: |a| ≤ τ
    sparse_ffn_blocks: tuple[int, ...] = (256,)  # token rows per block (union of active units)
    sparse_ffn_max_active: float = 0.5  # blocks more active than this run dense (break-even)
    # structured savings: the FFN term of cost ("l1": the paper's eq. 2; "group": group lasso
    # over units) and compaction of dead units after training (compact_ffn.py; empty: off)
    ffn_penalty: str = "l1"
    compact_thresholds: tuple[float, ...] = ()
    compact_criterion: str = "relu"  # relu: dead when z <= τ on every token; magnitude: |a| <= τ
    compact_fold: bool = True  # fold the dead units' mean contribution into the output bias
    compact_batches: int = 8  # calibration batches (eval_batch_size rows) from the train set
    # training speed: batches of similar length (transformers' LengthGroupedSampler) and
    # autocast through accelerate ("no" | "bf16" | "auto": bf16 on a CUDA GPU); evaluation
    # always runs in fp32
    group_by_length: bool = False
    mixed_precision: str = "no"
    # pruning after training (issue 13: does a crisp-trained model prune better?): the dense
    # and every crisp model are also evaluated with attention_mass token pruning at each keep
    # ratio, after layer ``prune_after_layer``, without retraining (crisp stays on underneath)
    prune_after: tuple[float, ...] = ()
    prune_after_layer: int = 2
    threads: int | None = None
    progress: bool = True
    tabulate_only: bool = False  # no training: tables from the runs already in --out

    def __post_init__(self) -> None:
        if self.sweep not in SWEEPS:
            raise ValueError(f"sweep: must be one of {SWEEPS}, got {self.sweep!r}")
        for s in self.sparsities:
            if not 0.0 <= s < 1.0:
                raise ValueError(f"sparsities: every value must be in [0, 1), got {s}")
        for s in self.schedules:
            if s not in ("uniform", "adaptive"):
                raise ValueError(f"schedules: 'uniform' or 'adaptive', got {s!r}")
        for v in self.lams:
            if v < 0:
                raise ValueError(f"lams: every value must be >= 0, got {v}")
        for loc in self.locations:
            if loc not in ("both", "attention", "ffn"):
                raise ValueError(f"locations: 'both', 'attention' or 'ffn', got {loc!r}")
        for name in ("epochs", "batch_size", "eval_batch_size", "max_length", "timing_batches",
                     "timing_repeats", "analysis_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        for t in self.sparse_ffn_thresholds:
            if not t >= 0:
                raise ValueError(f"sparse_ffn_thresholds: every value must be >= 0, got {t}")
        if self.sparse_ffn_mode not in ("relu", "magnitude"):
            raise ValueError(f"sparse_ffn_mode: 'relu' or 'magnitude', got "
                             f"{self.sparse_ffn_mode!r}")
        if any(b < 1 for b in self.sparse_ffn_blocks) or not self.sparse_ffn_blocks:
            raise ValueError(f"sparse_ffn_blocks: integers >= 1, got {self.sparse_ffn_blocks}")
        if not 0.0 <= self.sparse_ffn_max_active <= 1.0:
            raise ValueError(f"sparse_ffn_max_active: must be in [0, 1], got "
                             f"{self.sparse_ffn_max_active}")
        if self.ffn_penalty not in ("l1", "group"):
            raise ValueError(f"ffn_penalty: 'l1' or 'group', got {self.ffn_penalty!r}")
        for t in self.compact_thresholds:
            if not (isinstance(t, (int, float)) and math.isfinite(t)):
                raise ValueError(f"compact_thresholds: finite numbers, got {t!r}")
            if self.compact_criterion == "magnitude" and t < 0:
                raise ValueError(f"compact_thresholds: must be >= 0 with compact_criterion "
                                 f"'magnitude', got {t}")
        if len(set(self.compact_thresholds)) != len(self.compact_thresholds):
            raise ValueError(f"compact_thresholds: repeated value in {self.compact_thresholds}")
        if self.compact_criterion not in ("relu", "magnitude"):
            raise ValueError(f"compact_criterion: 'relu' or 'magnitude', got "
                             f"{self.compact_criterion!r}")
        if not isinstance(self.compact_fold, bool):
            raise ValueError(f"compact_fold: true or false, got {self.compact_fold!r}")  # noqa: TRY004 (config errors are ValueErrors)
        if not (isinstance(self.compact_batches, int) and self.compact_batches >= 1):
            raise ValueError(f"compact_batches: an integer >= 1, got {self.compact_batches!r}")
        if not isinstance(self.group_by_length, bool):
            raise ValueError(f"group_by_length: true or false, got {self.group_by_length!r}")  # noqa: TRY004 (config errors are ValueErrors)
        for r in self.prune_after:
            if not (isinstance(r, (int, float)) and 0.0 < r < 1.0):
                raise ValueError(f"prune_after: keep ratios in (0, 1), got {r!r}")
        if len(set(self.prune_after)) != len(self.prune_after):
            raise ValueError(f"prune_after: repeated value in {self.prune_after}")
        if not (isinstance(self.prune_after_layer, int) and self.prune_after_layer >= 1):
            raise ValueError(f"prune_after_layer: an integer >= 1, got {self.prune_after_layer!r}")
        check_training_fields(self)


def settings(cfg: SweepConfig) -> list[tuple[str, str | None, dict, dict]]:
    """(label, method, patch options, table keys) of every run; the dense run first."""
    runs = [(DENSE, None, {}, {"sparsity": 0.0, "lam": 0.0, "schedule": "-", "location": "-"})]
    if cfg.sweep in ("crisp", "all"):
        for sched in cfg.schedules:
            for s in cfg.sparsities:
                if s > 0:
                    runs.append((f"crisp-s{s:g}-{sched}", "crisp",
                                 {"sparsity": s, "schedule": sched},
                                 {"sparsity": s, "schedule": sched, "lam": 0.0, "location": "-"}))
    if cfg.sweep in ("cost", "all"):
        for loc in cfg.locations:
            for lam in cfg.lams:
                if lam > 0:
                    group = cfg.ffn_penalty == "group"
                    runs.append((f"cost-lam{lam:g}-{loc}" + ("-group" if group else ""), "cost",
                                 {"lam": lam, "alpha": cfg.alpha, "beta": cfg.beta,
                                  "location": loc, **({"ffn_penalty": "group"} if group else {})},
                                 {"sparsity": 0.0, "schedule": "-", "lam": lam, "location": loc}))
    return runs


def sparse_proxy_relative(model_cfg, attn_sparsity: float, ffn_sparsity: float | None,
                          length: float) -> float:
    """Analytic FLOPs share reachable by skipping masked attention pairs and zero FFN units
    (per token: projections 8d², QKᵀ+AV 4Ld, FFN 2·d·d_ff each matmul); a proxy."""
    d = model_cfg.hidden_size
    dff = model_cfg.intermediate_size
    dense = 8 * d * d + 4 * length * d + 4 * d * dff
    sparse = (8 * d * d + 4 * length * d * (1 - attn_sparsity) + 2 * d * dff
              + 2 * d * dff * (1 - (ffn_sparsity or 0.0)))
    return sparse / dense


PRUNE = "-prune"  # label suffix of a model evaluated with token pruning after training


def prune_label(label: str, keep_ratio: float) -> str:
    """Label of ``label``'s model evaluated with attention_mass pruning at ``keep_ratio``."""
    return f"{label}{PRUNE}{keep_ratio:g}"
