"""The settings of ``attnprune finetune`` (:class:`FinetuneConfig`) and their checks before any
work: the data files exist, the method can learn from the task."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from attnprune.research.finetune.model_io import FULL, find_weights
from attnprune.selection import check_keep_ratio

__all__ = ["FinetuneConfig", "check_data_files", "check_method_task"]


@dataclass(frozen=True)
class FinetuneConfig:
    """Settings of ``attnprune finetune`` (every field is a ``--key value`` option)."""

    model: str = "minilm"  # "minilm" (offline MiniLM-L6) or a from_pretrained id / path
    data: str = "tweets"  # tweets | PATH.csv | PATH.jsonl | csv:PATH | jsonl:PATH | glue/<task>
    # your own splits instead of --data (CSV / JSONL, run_glue.py's names)
    train_file: str | None = None  # your training split (CSV / JSONL) instead of --data
    validation_file: str | None = None  # none: 10 % of --train-file
    test_file: str | None = None  # none: --validation-file is scored, val = 10 % of train
    text_column: str = "text"  # the column (CSV) or key (JSONL) of the text
    label_column: str = "label"  # class names or ids; float labels make a regression
    text_pair_column: str | None = None  # a second text column: sentence pairs (csv / jsonl)
    task: str = "auto"  # auto (float labels = regression) | classification | regression
    method: str = FULL  # a registered method name, or "full"
    keep_ratio: tuple[float, ...] = (0.5,)  # ρ; several values = a sweep, one run each
    after_layer: int = 1  # prune after this encoder layer, 1 .. layers − 1
    schedule: str = "single"  # single | geometric | [r_1, r_2, ...] (cumulative per layer)
    method_options: dict = field(default_factory=dict)  # JSON/YAML mapping passed to patch()
    init_from: str | None = None  # folder with a fine-tuned full model (model.safetensors)
    layers: int | None = None  # keep the first N encoder layers (the layer-drop baseline)
    int8: bool = False  # also score a dynamic-int8 copy of each trained model (label "+int8")
    epochs: int = 1  # 0: no training, score the --init-from model pruned as it is
    lr: float = 5e-5
    batch_size: int = 16
    eval_batch_size: int = 32
    grad_accum: int = 1
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    distill_weight: float = 0.0  # α of distillation from the --init-from model (0 = off)
    distill_temperature: float = 2.0
    max_length: int = 128
    max_train: int | None = None  # use only the first N (shuffled) training rows
    max_val: int | None = 1000  # score only the first N val rows after each epoch
    max_test: int | None = None  # score only the first N test rows
    eval_no_retrain: bool = True  # with --init-from: also score the pruned model before training
    seeds: tuple[int, ...] = (0,)
    timing_batches: int = 4
    timing_repeats: int = 5
    threads: int | None = None
    save_model: bool = True
    progress: bool = True

    def __post_init__(self) -> None:
        opts = self.method_options
        if isinstance(opts, str):
            try:
                opts = yaml.safe_load(opts) if opts.strip() else {}
            except yaml.YAMLError as e:
                raise ValueError(f"method_options: not JSON/YAML: {e}") from None
        if not isinstance(opts, dict):
            raise ValueError(f"method_options: expected a mapping, got {opts!r}")  # noqa: TRY004 (the config contract: ValueError naming the field)
        object.__setattr__(self, "method_options", dict(opts))
        if self.method != FULL:
            from attnprune.methods import registry
            registry.get(self.method)  # ValueError naming the unknown method
        from attnprune.research.data.text import TASKS

        if self.task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}, got {self.task!r}")
        if self.task == "regression":
            check_method_task(self.method, "regression")
        if self.text_pair_column is not None and self.text_pair_column == self.text_column:
            raise ValueError(f"text_pair_column: same column as text_column "
                             f"({self.text_column!r}); a pair needs two texts")
        if not self.keep_ratio:
            raise ValueError("keep_ratio: give at least one value")
        for i, r in enumerate(self.keep_ratio):
            check_keep_ratio(r, f"keep_ratio[{i}]")
        if self.epochs < 0:
            raise ValueError(f"epochs must be ≥ 0 (0 = evaluate the --init-from model only), "
                             f"got {self.epochs}")
        for name in ("batch_size", "eval_batch_size", "grad_accum", "max_length",
                     "after_layer", "timing_batches", "timing_repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        for name in ("max_train", "max_val", "max_test", "threads"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"{name} must be ≥ 1, got {v}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if not 0 <= self.distill_weight <= 1:
            raise ValueError(f"distill_weight must be in [0, 1], got {self.distill_weight}")
        if self.distill_weight > 0 and self.init_from is None:
            raise ValueError("distill_weight: distillation needs a teacher; give --init-from")
        if self.distill_temperature <= 0:
            raise ValueError(f"distill_temperature must be > 0, got {self.distill_temperature}")
        if not self.seeds:
            raise ValueError("seeds: give at least one seed")
        if self.init_from is not None:
            try:
                find_weights(self.init_from)  # the folder must hold a model, before any work
            except FileNotFoundError as e:
                raise ValueError(str(e)) from None
        if self.layers is not None and self.layers < 1:
            raise ValueError(f"layers must be ≥ 1, got {self.layers}")
        if self.epochs == 0 and self.init_from is None:
            raise ValueError("epochs: 0 (evaluation only) needs a trained model; give --init-from")
        check_data_files(self)


def check_data_files(cfg) -> None:
    """The data files of ``cfg`` exist (``--data PATH`` or ``csv:PATH``; the split files), and
    ``--data`` is not given beside ``--train-file``: ValueError naming the option."""
    from attnprune.research.data.text import EXTENSIONS

    files = {k: getattr(cfg, k) for k in ("train_file", "validation_file", "test_file")}
    if any(files.values()):
        if cfg.data != type(cfg).__dataclass_fields__["data"].default:  # given, not default
            raise ValueError(f"data: give --data {cfg.data} or --train-file, not both")
        if files["train_file"] is None:
            raise ValueError("train_file: --validation-file / --test-file need --train-file")
        if files["validation_file"] is None and files["test_file"] is None:
            raise ValueError("test_file: with --train-file give --test-file (or "
                             "--validation-file): the split the model is scored on")
        for k, f in files.items():
            if f is not None and not Path(f).is_file():
                raise ValueError(f"{k}: file not found: {f}")
        return
    path = None
    if cfg.data.startswith(("csv:", "jsonl:", "tweets:")):
        path = cfg.data.split(":", 1)[1]
    elif Path(cfg.data).suffix.lower() in EXTENSIONS:
        path = cfg.data
    if path is not None and not Path(path).is_file():
        raise ValueError(f"data: file not found: {path}")


def check_method_task(method: str, task: str) -> None:
    """Methods that train on class labels (the entropy family's token head, ``needs_labels``)
    have nothing to learn from a regression's real-valued targets: refuse before any work."""
    if method == FULL or task != "regression":
        return
    from attnprune.methods import registry
    if getattr(registry.get(method).cls, "needs_labels", False):
        raise ValueError(f"method: {method!r} trains its token scorer on class labels; a "
                         "regression task has none (use attention_mass, random, ltp, dtr, ...)")
