"""Text classification and regression data, single sentences or sentence pairs: the offline
tweets set, CSV/JSONL files, GLUE via HF ``datasets``; long inputs (Shakespeare genre, IMDB) in
:mod:`attnprune.data.long_text`.

Specs accepted by :func:`load_text_data`:

* ``tweets``: ``tweets_sentiment.csv`` (columns ``text,label,confidence``; 19,789 rows, label 1 =
  positive) from the shared data folder: ``$ATTNPRUNE_DATA``, else ``<repo>/../shared/data``.
  ``tweets:PATH`` reads that file instead.
* ``csv:PATH`` / ``jsonl:PATH``: any file with a text column and a label column (names set by
  ``text_column`` / ``label_column``, default ``text`` / ``label``); labels may be integers or
  strings, any number of classes (string labels are numbered in sorted order).
  ``text_pair_column`` names a second text column: each example is a sentence pair
  (premise / hypothesis), tokenised as a pair (``tokenizer(a, b)``).
  Float labels make a regression task (``task="auto"``: inferred when a label has a fractional
  part, e.g. ``3.8``; ``task="regression"`` forces it): labels are float32, one model output.
  With a regression, every label must be a finite number: otherwise ValueError naming the file
  line and the column.
* ``glue/<task>`` when online (``datasets.load_dataset("glue", task)``): single sentences
  ``sst2``, ``cola``; pairs ``mnli`` (its ``validation_matched`` is the test split), ``qnli``,
  ``rte``, ``mrpc``, ``qqp``; regression pairs ``stsb`` (similarity 0–5). GLUE's test labels
  are hidden, so its validation split is our test split and our validation split is carved
  from its train split as below.
* ``shakespeare_genre`` (``shakespeare_genre:PATH`` for another copy of ``shakespeare.txt``):
  offline, long inputs (210-word passages, ≥ 256 MiniLM tokens): the First Folio genre
  (comedy / history / tragedy) of a passage of a play, split by whole plays (a fixed table, not
  the split below); see :mod:`attnprune.data.long_text`.
* ``imdb``: ``datasets.load_dataset("imdb")`` when online (25k train / 25k test reviews, 0 =
  neg, 1 = pos); val is 10 % of train, stratified, as for GLUE.

Fixed split (documented contract): rows are split 80 / 10 / 10 into train / val / test,
stratified by label (regression: not stratified), with ``sklearn.model_selection.train_test_split``
and ``random_state=SPLIT_SEED`` (= 20240), after dropping rows with an empty text (or an empty
pair text). The split does not depend on the training seed, so every run of a sweep is scored
on the same test examples.

Tokenisation uses the model's own tokenizer (:func:`batches`), with dynamic padding to the
longest sequence of each batch; the same batches go to the full and the pruned model.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["SPLIT_SEED", "TASKS", "TextData", "batches", "load_text_data", "shared_data_dir",
           "tokenize"]

SPLIT_SEED = 20240  # fixed: the documented split of every file-based dataset
TWEETS_FILE = "tweets_sentiment.csv"
TASKS = ("auto", "classification", "regression")


@dataclass(frozen=True)
class Split:
    texts: list[str]
    labels: np.ndarray  # (n,) int64 class ids, or float32 targets of a regression
    pairs: list[str] | None = None  # the second text of each example (sentence-pair tasks)

    def __len__(self) -> int:
        return len(self.texts)


@dataclass(frozen=True)
class TextData:
    """Train / val / test splits, the class names (index = class id; empty for a regression),
    the task and where they came from."""

    train: Split
    val: Split
    test: Split
    label_names: tuple[str, ...]
    source: str
    task: str = "classification"  # or "regression"

    @property
    def n_classes(self) -> int:
        return len(self.label_names)

    @property
    def num_labels(self) -> int:
        """Outputs of the model head: one per class, or 1 for a regression (HF's convention:
        ``num_labels=1`` is a regression head)."""
        return 1 if self.task == "regression" else self.n_classes


def shared_data_dir() -> Path:
    """``$ATTNPRUNE_DATA`` if set, else ``shared/data`` beside the repository."""
    env = os.environ.get("ATTNPRUNE_DATA")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2].parent / "shared" / "data"


def _read_rows(path: Path, kind: str) -> list[tuple[int, dict]]:
    """(file line, row) pairs: the line where each row ends, so errors can point at it."""
    if not path.is_file():
        raise FileNotFoundError(f"data: file not found: {path}")
    if kind == "csv":
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            return [(reader.line_num, r) for r in reader]
    rows = []
    with path.open(encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if line.strip():
                try:
                    r = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"data: {path} line {i} is not JSON: {e}") from None
                if not isinstance(r, dict):
                    raise ValueError(f"data: {path} line {i} is not a JSON object")
                rows.append((i, r))
    return rows


def _columns(rows: list[tuple[int, dict]], path, text_column: str, label_column: str,
             text_pair_column: str | None = None):
    """(texts, pair texts or None, raw labels, file lines) of the rows with non-empty texts."""
    if not rows:
        raise ValueError(f"data: {path} has no rows")
    first = rows[0][1]
    for col, field in ((text_column, "text_column"), (label_column, "label_column"),
                       (text_pair_column, "text_pair_column")):
        if col is not None and col not in first:
            raise ValueError(f"data: {path} has no column {col!r} (columns: "
                             f"{', '.join(map(str, first))}); set {field}")
    texts, pairs, labels, lines = [], [], [], []
    for line, r in rows:
        t = r.get(text_column)
        t2 = r.get(text_pair_column) if text_pair_column is not None else None
        if t is None or not str(t).strip():
            continue
        if text_pair_column is not None and (t2 is None or not str(t2).strip()):
            continue
        texts.append(str(t))
        pairs.append(str(t2))
        labels.append(r.get(label_column))
        lines.append(line)
    return texts, (pairs if text_pair_column is not None else None), labels, lines


def _float_or_none(v) -> float | None:
    try:
        f = float(str(v).strip())
    except (TypeError, ValueError):
        return None
    return f if np.isfinite(f) else None


def _infer_task(labels: list) -> str:
    """"regression" when a label is a number with a fractional part (e.g. 3.8): class ids are
    integers and class names are not all numbers; else "classification"."""
    for v in labels:
        f = _float_or_none(v)
        if f is not None and not f.is_integer():
            return "regression"
    return "classification"


def _regression_labels(labels: list, lines: list[int], path, label_column: str) -> np.ndarray:
    """Float32 targets; the first non-number names its file line and column."""
    out = np.empty(len(labels), dtype=np.float32)
    for i, (v, line) in enumerate(zip(labels, lines, strict=True)):
        f = _float_or_none(v)
        if f is None:
            raise ValueError(f"data: {path} line {line}, column {label_column!r}: label {v!r} is "
                             "not a finite number (task regression: every label must be one)")
        out[i] = f
    return out


def _encode_labels(labels: list) -> tuple[np.ndarray, tuple[str, ...]]:
    """Integers stay (classes 0..C−1 must all be ints); strings are numbered in sorted order."""
    try:
        ints = [int(str(v).strip()) for v in labels]
        if min(ints) < 0:
            raise ValueError
        names = tuple(str(i) for i in range(max(ints) + 1))
        return np.asarray(ints, dtype=np.int64), names
    except (TypeError, ValueError):
        names = tuple(sorted({str(v) for v in labels}))
        index = {n: i for i, n in enumerate(names)}
        return np.asarray([index[str(v)] for v in labels], dtype=np.int64), names


def _pick(texts: list[str], pairs: list[str] | None, y: np.ndarray, ix) -> Split:
    ix = np.sort(ix)
    return Split([texts[i] for i in ix], y[ix], None if pairs is None else [pairs[i] for i in ix])


def _split(texts: list[str], y: np.ndarray, pairs: list[str] | None = None
           ) -> tuple[Split, Split, Split]:
    from sklearn.model_selection import train_test_split

    idx = np.arange(len(texts))
    classes = not np.issubdtype(y.dtype, np.floating)  # a regression is not stratified
    strat = y if classes and np.bincount(y).min() >= 3 else None  # ≥ 2 per class per cut
    tr, rest = train_test_split(idx, test_size=0.2, random_state=SPLIT_SEED, stratify=strat)
    strat_rest = y[rest] if strat is not None and np.bincount(y[rest]).min() >= 2 else None
    va, te = train_test_split(rest, test_size=0.5, random_state=SPLIT_SEED, stratify=strat_rest)
    return _pick(texts, pairs, y, tr), _pick(texts, pairs, y, va), _pick(texts, pairs, y, te)


def _check_task(task: str) -> None:
    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")


def load_text_data(spec: str, text_column: str = "text", label_column: str = "label",
                   text_pair_column: str | None = None, task: str = "auto") -> TextData:
    """Load ``spec`` (see the module docstring) into fixed train / val / test splits.

    ``text_pair_column``: a second text column (sentence pairs; files only: GLUE tasks know
    their columns). ``task``: "auto" (regression when a label has a fractional part),
    "classification" or "regression". Missing files and columns raise errors naming them;
    too few rows (< 10) raise ValueError.
    """
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"data: expected a dataset spec such as 'tweets' or 'csv:PATH', got {spec!r}")
    _check_task(task)
    if spec.startswith("glue/"):
        return _load_glue(spec[5:], task)
    if spec in ("imdb", "shakespeare_genre") or spec.startswith("shakespeare_genre:"):
        from .long_text import load_long_text  # imports this module: load it on first use

        return load_long_text(spec)
    if spec == "tweets" or spec.startswith("tweets:"):
        path = Path(spec[7:]) if ":" in spec else shared_data_dir() / TWEETS_FILE
        kind, text_column, label_column = "csv", "text", "label"
    elif spec.startswith(("csv:", "jsonl:")):
        kind, rest = spec.split(":", 1)
        path = Path(rest)
    else:
        raise ValueError(f"data: unknown dataset {spec!r}; use 'tweets', 'csv:PATH', 'jsonl:PATH', "
                         "'glue/<task>', 'shakespeare_genre', 'shakespeare_genre:PATH' or 'imdb'")
    texts, pairs, raw, lines = _columns(_read_rows(path, kind), path, text_column, label_column,
                                        text_pair_column)
    if len(texts) < 10:
        raise ValueError(f"data: {path} has {len(texts)} usable rows; need at least 10")
    if task == "auto":
        task = _infer_task(raw)
    if task == "regression":
        y, names = _regression_labels(raw, lines, path, label_column), ()
        if np.ptp(y) == 0:
            raise ValueError(f"data: {path} column {label_column!r}: every label is {y[0]:g}; "
                             "a regression needs varying targets")
    else:
        y, names = _encode_labels(raw)
        if len(names) < 2:
            raise ValueError(f"data: {path} has a single class; classification needs ≥ 2")
    train, val, test = _split(texts, y, pairs)
    return TextData(train, val, test, names, str(path), task)


# task → (text column, pair column or None, test split, regression?): GLUE's own column names
# (https://huggingface.co/datasets/nyu-mll/glue); MNLI has two validation splits, matched
# (same genres as train) is the one papers report as MNLI-m.
_GLUE = {
    "sst2": ("sentence", None, "validation", False),
    "cola": ("sentence", None, "validation", False),
    "mnli": ("premise", "hypothesis", "validation_matched", False),
    "qnli": ("question", "sentence", "validation", False),
    "rte": ("sentence1", "sentence2", "validation", False),
    "mrpc": ("sentence1", "sentence2", "validation", False),
    "qqp": ("question1", "question2", "validation", False),
    "stsb": ("sentence1", "sentence2", "validation", True),
}


def _load_glue(name: str, task: str = "auto") -> TextData:
    if name not in _GLUE:
        raise ValueError(f"data: glue/{name} is not supported; tasks: {', '.join(sorted(_GLUE))}")
    col, pair_col, test_split, regression = _GLUE[name]
    kind = "regression" if regression else "classification"
    if task not in ("auto", kind):
        raise ValueError(f"task: glue/{name} is a {kind} task, got task={task!r}")
    import datasets

    ds = datasets.load_dataset("glue", name)  # needs the hub (or a local cache)
    dtype = np.float32 if regression else np.int64

    def columns(split):
        texts = list(ds[split][col])
        pairs = list(ds[split][pair_col]) if pair_col else None
        return texts, pairs, np.asarray(ds[split]["label"], dtype=dtype)

    texts, pairs, y = columns("train")
    from sklearn.model_selection import train_test_split

    tr, va = train_test_split(np.arange(len(texts)), test_size=0.1, random_state=SPLIT_SEED,
                              stratify=None if regression else y)
    t_texts, t_pairs, t_y = columns(test_split)
    names = () if regression else tuple(ds["train"].features["label"].names)
    return TextData(_pick(texts, pairs, y, tr), _pick(texts, pairs, y, va),
                    Split(t_texts, t_y, t_pairs), names, f"glue/{name}", kind)


def tokenize(tokenizer, split: Split, rows, max_length: int) -> dict:
    """Tokenise rows ``rows`` of ``split``, padded to the batch's longest: single texts, or
    sentence pairs as the model was pre-trained on them (``[CLS] a [SEP] b [SEP]``, segment ids
    in ``token_type_ids``; truncation ``longest_first`` trims the longer text token by token, so
    both keep their start). Returns ``input_ids``, ``attention_mask`` and ``token_type_ids`` when
    the tokenizer makes them (BERT does; RoBERTa / DistilBERT do not)."""
    texts = [split.texts[i] for i in rows]
    pairs = None if split.pairs is None else [split.pairs[i] for i in rows]
    enc = tokenizer(texts, pairs, padding=True, truncation="longest_first",
                    max_length=max_length, return_tensors="pt")
    return {k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc}


def batches(split: Split, tokenizer, batch_size: int, max_length: int = 128,
            shuffle: bool = False, seed: int = 0, limit: int | None = None):
    """Yield tokenised batches ``{"input_ids", "attention_mask", ["token_type_ids"], "labels",
    "index"}`` (torch), padded to the longest sequence of the batch (:func:`tokenize`);
    ``index`` holds the rows' split positions."""
    import torch

    order = np.arange(len(split))
    if shuffle:
        order = np.random.default_rng(seed).permutation(len(split))
    if limit is not None:
        order = order[:limit]
    for start in range(0, len(order), batch_size):
        ix = order[start : start + batch_size]
        yield {**tokenize(tokenizer, split, ix, max_length),
               "labels": torch.as_tensor(split.labels[ix]), "index": torch.as_tensor(ix)}
