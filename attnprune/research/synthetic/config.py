"""The settings of ``attnprune reproduce synthetic``: :class:`SyntheticConfig` (every field
checked when it is made) and the ``--quick`` smoke settings."""

from __future__ import annotations

import math
from dataclasses import dataclass

from attnprune.methods import registry
from attnprune.research.synthetic.data import DataSpec
from attnprune.research.synthetic.host import FULL
from attnprune.selection import check_keep_ratio

__all__ = ["ENTROPY_METHODS", "METHODS", "SyntheticConfig", "quick_config"]

METHODS = ("full", "attention_mass", "random", "entropy", "entropy_threshold", "entropy_gumbel")
ENTROPY_METHODS = ("entropy", "entropy_threshold", "entropy_gumbel")


# ----------------------------------------------------------------------------- config
@dataclass(frozen=True)
class SyntheticConfig:
    """Everything ``attnprune reproduce synthetic`` does; defaults are the paper's (App. B)
    and are also written out, with comments, in ``configs/synthetic.yaml``."""

    # data (§3.1–3.2)
    n_train: int = 3000
    n_val: int = 800
    length: int = 64
    vocab: int = 500
    n_signal_tokens: int = 10
    p_signal: float = 0.6
    max_signal: int = 3
    noise: float = 0.15
    d_model: int = 64
    idf: bool = False
    # model and gates (§4)
    methods: tuple[str, ...] = METHODS
    keep_ratio: float = 0.5
    residual: bool = True
    head_weight: float = 1.0
    threshold: float = 0.9
    tau: float = 0.5
    budget_weight: float = 1.0
    # training (§7.1)
    seeds: tuple[int, ...] = (42, 43, 44, 45, 46)
    epochs: int = 12
    batch_size: int = 64
    lr: float = 1e-2
    weight_decay: float = 0.01
    # Training-step precision (see TrainConfig). bf16: the matmuls of the training steps run in
    # bfloat16 (autocast); softmax, gates, losses, optimiser and every evaluation stay float32.
    # "auto" (the default): bf16 where the CPU has native bf16 matmuls (2:19 vs 3:15 for fp32
    # here, same conclusions; README), fp32 elsewhere — emulated bf16 on a CPU without them
    # (e.g. AVX2 only) is slower than fp32, so "bf16" is never a safe default. "fp32" everywhere.
    precision: str = "auto"
    # measurements (§4.5, §9)
    timing_repeats: int = 10
    timing_warmup: int = 2
    timing_batch: int = 128  # rows per measured forward (FLOPs: whole val set in such batches)
    n_bins: int = 10
    n_resamples: int = 10000
    margin: float = 0.01
    # ablations (§8.3)
    ablations: bool = True
    ablation_seeds: tuple[int, ...] = (42, 43)
    ablation_keep_ratios: tuple[float, ...] = (0.3, 0.5, 0.7)
    ablation_noise: tuple[float, ...] = (0.05, 0.15, 0.25, 0.35, 0.45)
    ablation_noise_methods: tuple[str, ...] = ("entropy",)
    ablation_idf_methods: tuple[str, ...] = ("full", "entropy")
    # execution
    workers: int = 2
    threads: int = 1

    def __post_init__(self) -> None:
        check_keep_ratio(self.keep_ratio, "keep_ratio")
        for r in self.ablation_keep_ratios:
            check_keep_ratio(r, "ablation_keep_ratios")
        if self.length < 1:
            raise ValueError(f"length must be ≥ 1, got {self.length}")
        for name in ("n_train", "n_val", "d_model", "epochs", "batch_size", "timing_repeats",
                     "n_bins", "n_resamples", "threads", "n_signal_tokens", "max_signal",
                     "timing_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        for name in ("timing_warmup", "workers"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be ≥ 0, got {getattr(self, name)}")
        for name in ("p_signal", "noise"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {v}")
        for v in self.ablation_noise:
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"ablation_noise must be in [0, 1], got {v}")
        if not self.seeds:
            raise ValueError("seeds must list at least one seed")
        if not self.methods:
            raise ValueError("methods must list at least one method")
        if FULL not in self.methods:
            raise ValueError("methods must include 'full' (every relative number is against it)")
        if len(set(self.methods)) != len(self.methods):
            raise ValueError(f"methods lists a method twice: {list(self.methods)}")
        for field_name in ("methods", "ablation_noise_methods", "ablation_idf_methods"):
            for m in getattr(self, field_name):
                if m != FULL:
                    try:
                        spec = registry.get(m)
                    except ValueError:
                        known = ", ".join([FULL, *registry.list_methods("token")])
                        raise ValueError(f"{field_name}: unknown method {m!r}; known: {known}")
                    if spec.kind != "token":
                        raise ValueError(f"{field_name}: {m!r} is not a token method")
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1] (a share of log C), got {self.threshold}")
        if self.tau <= 0:
            raise ValueError(f"tau must be > 0, got {self.tau}")
        if self.lr <= 0 or not math.isfinite(self.lr):
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.precision not in ("auto", "bf16", "fp32"):
            raise ValueError(f"precision must be 'auto', 'bf16' or 'fp32', got {self.precision!r}")
        for name in ("head_weight", "budget_weight", "weight_decay", "margin"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be ≥ 0, got {getattr(self, name)}")
        DataSpec(**self._data_kwargs())  # vocab vs signal sets etc.

    def _data_kwargs(self) -> dict:
        return {k: getattr(self, k) for k in ("n_train", "n_val", "length", "vocab",
                                              "n_signal_tokens", "p_signal", "max_signal",
                                              "noise", "d_model", "idf")}

    def data_spec(self, **overrides) -> DataSpec:
        return DataSpec(**{**self._data_kwargs(), **overrides})

    def method_options(self, method: str) -> dict:
        """Keywords of each gate from this config (only the ones the method takes)."""
        if method in ENTROPY_METHODS:
            opts = {"head_weight": self.head_weight}
            if method == "entropy_threshold":
                opts["threshold"] = self.threshold
            if method == "entropy_gumbel":
                opts.update(tau=self.tau, budget_weight=self.budget_weight)
            return opts
        return {}


def quick_config(**overrides) -> dict:
    """The ``--quick`` smoke settings (seconds, not minutes); still real training."""
    q = {"n_train": 400, "n_val": 200, "epochs": 2, "seeds": (42, 43), "ablation_seeds": (42,),
         "ablation_keep_ratios": (0.3, 0.5), "ablation_noise": (0.15, 0.45),
         "ablation_noise_methods": ("entropy",), "timing_repeats": 3, "timing_warmup": 1,
         "n_resamples": 500, "workers": 0}
    q.update(overrides)
    return q

