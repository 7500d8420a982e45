"""The settings of ``attnprune lm`` (:class:`LMConfig`) and its presets (:data:`PRESETS`): the
model, the schedule, the method and its sweep, each checked before any work."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from attnprune.methods import registry

__all__ = ["ARCHS", "PRESETS", "LMConfig"]

PRESETS: dict[str, dict] = {
    # ≈ 0.8 M parameters; 1000 steps take ~6 min on one shared core (≤ 20 min on 2 cores).
    "cpu-small": {"n_layer": 4, "n_head": 4, "n_embd": 128, "context": 128, "dropout": 0.0,
                  "batch_size": 16, "grad_accum": 1, "steps": 1000, "lr": 2e-3, "min_lr": 2e-4,
                  "warmup": 50, "eval_every": 200},
    # The intensity paper's character GPT: 6 layers, 6 heads, width 384, context 256, dropout 0.2.
    "paper": {"n_layer": 6, "n_head": 6, "n_embd": 384, "context": 256, "dropout": 0.2,
              "batch_size": 64, "grad_accum": 1, "steps": 5000, "lr": 1e-3, "min_lr": 1e-4,
              "warmup": 100, "eval_every": 250},
}


ARCHS = ("gpt2", "llama")


@dataclass(frozen=True)
class LMConfig:
    """Settings of ``attnprune lm`` (a preset fills the model and schedule fields)."""

    preset: str = "cpu-small"
    data: str = "shakespeare_char"
    tokenizer: str = "char"  # for text:PATH: char | bpe
    model: str = ""  # hub name / local folder; "" = a model of ``arch`` from the fields below
    arch: str = "gpt2"  # gpt2 | llama: the model built from the fields below
    n_kv_head: int = 0  # llama: key/value heads (grouped-query attention); 0 = n_head // 2
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    context: int = 128
    dropout: float = 0.0
    batch_size: int = 16
    grad_accum: int = 1
    steps: int = 2000
    lr: float = 2e-3
    min_lr: float = 2e-4
    warmup: int = 100
    weight_decay: float = 0.1  # paper: AdamW weight decay 0.1
    beta1: float = 0.9  # paper: β = (0.9, 0.95)
    beta2: float = 0.95
    grad_clip: float = 1.0  # paper: clip at norm 1.0
    eval_every: int = 250
    eval_windows: int = 64
    seed: int = 0
    method: str = "none"
    method_options: str = "{}"  # a YAML mapping, e.g. "{sparsity_weight: 0.5, layers: [2]}"
    init: str = ""  # safetensors weights to start from (the saved baseline)
    # Distillation (ours, as the encoder ``finetune --distill-weight``): the loss becomes
    # (1 − α)·CE + α·T²·KL(teacher_T ‖ model_T) per position, the teacher an unpruned model of
    # the same config: a safetensors file, or in a sweep "control" (each seed's control run).
    distill_from: str = ""
    distill_weight: float = 0.0  # α
    distill_temperature: float = 1.0  # T
    stage2_steps: int = 0
    stage2_lr: float = 3e-4
    gen_tokens: int = 500  # generation throughput: 500 new tokens, temperature 0.8, KV cache
    temperature: float = 0.8
    bench_repeats: int = 5
    lengths: tuple[int, ...] = ()  # sequence lengths for the perplexity / FLOPs sweeps
    threads: int = 0  # torch threads; 0 = leave torch's default
    device: str = "auto"  # "auto": cuda when torch sees a GPU, else cpu; or "cpu", "cuda[:i]"
    # A sweep (see run_sweep): a YAML mapping of method options to lists of values, e.g.
    # "{keep_target: [0.4, 0.6, 0.8]}"; every combination is one run, fine-tuned from ``init``
    # next to an unpruned control, for each of ``seeds`` (default: ``seed``).
    sweep: str = ""
    seeds: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.device not in ("auto", "cpu", "cuda") and not str(self.device).startswith("cuda:"):
            raise ValueError(f"device: 'auto', 'cpu' or 'cuda[:i]', got {self.device!r}")
        if self.preset not in PRESETS and self.preset != "none":
            raise ValueError(f"preset: must be one of {', '.join(PRESETS)} or none, got {self.preset!r}")
        for name in ("n_layer", "n_head", "n_embd", "context", "batch_size", "grad_accum",
                     "eval_every", "eval_windows", "bench_repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        for name in ("steps", "stage2_steps", "warmup", "gen_tokens", "threads"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be ≥ 0, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd: {self.n_embd} is not divisible by n_head {self.n_head}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        for name in ("lr", "min_lr", "stage2_lr", "temperature", "grad_clip"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr ({self.min_lr}) must be ≤ lr ({self.lr})")
        if bad := [n for n in self.lengths if not 2 <= n <= self.context]:
            raise ValueError(f"lengths: each must be in 2..context ({self.context}), got {bad}")
        if self.arch not in ARCHS:
            raise ValueError(f"arch: must be one of {', '.join(ARCHS)}, got {self.arch!r}")
        if self.n_kv_head < 0 or (self.n_kv_head and self.n_head % self.n_kv_head):
            raise ValueError(f"n_kv_head: must divide n_head ({self.n_head}), got {self.n_kv_head}")
        if self.n_kv_head and self.arch != "llama":
            raise ValueError(f"n_kv_head: only the llama arch has key/value head groups, not {self.arch}")
        if self.tokenizer not in ("char", "bpe"):
            raise ValueError(f"tokenizer: must be char or bpe, got {self.tokenizer!r}")
        if self.method != "none":
            registry.get(self.method)  # ValueError naming the unknown method
        opts = yaml.safe_load(self.method_options) if self.method_options.strip() else {}
        if not isinstance(opts, dict):
            raise ValueError(  # noqa: TRY004 (configs raise ValueError naming the field)
                f"method_options: expected a mapping like '{{key: value}}', got {self.method_options!r}")
        if self.init and not Path(self.init).is_file():
            raise ValueError(f"init: checkpoint not found: {self.init}")
        if not 0.0 <= self.distill_weight <= 1.0:
            raise ValueError(f"distill_weight must be in [0, 1], got {self.distill_weight}")
        if self.distill_temperature <= 0:
            raise ValueError(f"distill_temperature must be > 0, got {self.distill_temperature}")
        if self.distill_weight > 0 and not self.distill_from:
            raise ValueError("distill_from: distill_weight > 0 needs a teacher (a safetensors file, "
                             "or 'control' in a sweep)")
        if self.distill_from == "control" and not self.sweep.strip():
            raise ValueError("distill_from: 'control' means each seed's control run of a sweep; "
                             "give --sweep, or a safetensors file")
        if self.distill_from and self.distill_from != "control" and not Path(self.distill_from).is_file():
            raise ValueError(f"distill_from: teacher weights not found: {self.distill_from}")
        if self.sweep.strip():
            grid = yaml.safe_load(self.sweep)
            if not isinstance(grid, dict) or not grid or not all(
                    isinstance(v, list) and v for v in grid.values()):
                raise ValueError(f"sweep: expected a mapping of options to non-empty lists, like "
                                 f"'{{keep_target: [0.4, 0.6]}}', got {self.sweep!r}")
            if self.method == "none":
                raise ValueError("sweep: give the --method whose options it sweeps")
            if not self.init:
                raise ValueError("init: a sweep fine-tunes from a saved baseline (--init BASE/model.safetensors)")

    @property
    def options(self) -> dict:
        """``method_options`` parsed."""
        return dict(yaml.safe_load(self.method_options) or {})

    def sweep_points(self) -> list[dict]:
        """``method_options`` updated with every combination of the ``sweep`` values."""
        import itertools

        grid = yaml.safe_load(self.sweep) if self.sweep.strip() else {}
        keys = list(grid)
        return [{**self.options, **dict(zip(keys, vals))}
                for vals in itertools.product(*(grid[k] for k in keys))]
