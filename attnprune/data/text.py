"""Text classification data: the offline tweets set, CSV/JSONL files, GLUE via HF ``datasets``;
long inputs (Shakespeare genre, IMDB) in :mod:`attnprune.data.long_text`.

Specs accepted by :func:`load_text_data`:

* ``tweets``: ``tweets_sentiment.csv`` (columns ``text,label,confidence``; 19,789 rows, label 1 =
  positive) from the shared data folder: ``$ATTNPRUNE_DATA``, else ``<repo>/../shared/data``.
  ``tweets:PATH`` reads that file instead.
* ``csv:PATH`` / ``jsonl:PATH``: any file with a text column and a label column (names set by
  ``text_column`` / ``label_column``, default ``text`` / ``label``); labels may be integers or
  strings, any number of classes (string labels are numbered in sorted order).
* ``glue/<task>`` (single-sentence tasks ``sst2``, ``cola``): ``datasets.load_dataset("glue",
  task)`` when online. GLUE's test labels are hidden, so its validation split is our test split
  and our validation split is carved from its train split as below.
* ``shakespeare_genre`` (``shakespeare_genre:PATH`` for another copy of ``shakespeare.txt``):
  offline, long inputs (210-word passages, ≥ 256 MiniLM tokens): the First Folio genre
  (comedy / history / tragedy) of a passage of a play, split by whole plays (a fixed table, not
  the split below); see :mod:`attnprune.data.long_text`.
* ``imdb``: ``datasets.load_dataset("imdb")`` when online (25k train / 25k test reviews, 0 =
  neg, 1 = pos); val is 10 % of train, stratified, as for GLUE.

Fixed split (documented contract): rows are split 80 / 10 / 10 into train / val / test,
stratified by label, with ``sklearn.model_selection.train_test_split`` and
``random_state=SPLIT_SEED`` (= 20240), after dropping rows with an empty text. The split does not
depend on the training seed, so every run of a sweep is scored on the same test examples.

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

__all__ = ["SPLIT_SEED", "TextData", "batches", "load_text_data", "shared_data_dir"]

SPLIT_SEED = 20240  # fixed: the documented split of every file-based dataset
TWEETS_FILE = "tweets_sentiment.csv"


@dataclass(frozen=True)
class Split:
    texts: list[str]
    labels: np.ndarray  # (n,) int64 class ids

    def __len__(self) -> int:
        return len(self.texts)


@dataclass(frozen=True)
class TextData:
    """Train / val / test splits, the class names (index = class id) and where they came from."""

    train: Split
    val: Split
    test: Split
    label_names: tuple[str, ...]
    source: str

    @property
    def n_classes(self) -> int:
        return len(self.label_names)


def shared_data_dir() -> Path:
    """``$ATTNPRUNE_DATA`` if set, else ``shared/data`` beside the repository."""
    env = os.environ.get("ATTNPRUNE_DATA")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2].parent / "shared" / "data"


def _read_rows(path: Path, kind: str) -> list[dict]:
    if not path.is_file():
        raise FileNotFoundError(f"data: file not found: {path}")
    if kind == "csv":
        with path.open(newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    rows = []
    with path.open(encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"data: {path} line {i} is not JSON: {e}") from None
    return rows


def _columns(rows: list[dict], path, text_column: str, label_column: str):
    if not rows:
        raise ValueError(f"data: {path} has no rows")
    for col in (text_column, label_column):
        if col not in rows[0]:
            raise ValueError(f"data: {path} has no column {col!r} (columns: "
                             f"{', '.join(map(str, rows[0]))}); set text_column / label_column")
    texts, labels = [], []
    for r in rows:
        t = r.get(text_column)
        if t is None or not str(t).strip():
            continue
        texts.append(str(t))
        labels.append(r.get(label_column))
    return texts, labels


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


def _split(texts: list[str], y: np.ndarray) -> tuple[Split, Split, Split]:
    from sklearn.model_selection import train_test_split

    idx = np.arange(len(texts))
    strat = y if np.bincount(y).min() >= 3 else None  # stratify needs ≥ 2 per class per cut
    tr, rest = train_test_split(idx, test_size=0.2, random_state=SPLIT_SEED, stratify=strat)
    strat_rest = y[rest] if strat is not None and np.bincount(y[rest]).min() >= 2 else None
    va, te = train_test_split(rest, test_size=0.5, random_state=SPLIT_SEED, stratify=strat_rest)

    def pick(ix):
        ix = np.sort(ix)
        return Split([texts[i] for i in ix], y[ix])

    return pick(tr), pick(va), pick(te)


def load_text_data(spec: str, text_column: str = "text", label_column: str = "label") -> TextData:
    """Load ``spec`` (see the module docstring) into fixed train / val / test splits.

    Missing files and columns raise errors naming them; too few rows (< 10) raise ValueError.
    """
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"data: expected a dataset spec such as 'tweets' or 'csv:PATH', got {spec!r}")
    if spec.startswith("glue/"):
        return _load_glue(spec[5:])
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
    texts, raw = _columns(_read_rows(path, kind), path, text_column, label_column)
    if len(texts) < 10:
        raise ValueError(f"data: {path} has {len(texts)} usable rows; need at least 10")
    y, names = _encode_labels(raw)
    if len(names) < 2:
        raise ValueError(f"data: {path} has a single class; classification needs ≥ 2")
    train, val, test = _split(texts, y)
    return TextData(train, val, test, names, str(path))


_GLUE_TEXT = {"sst2": "sentence", "cola": "sentence"}


def _load_glue(task: str) -> TextData:
    if task not in _GLUE_TEXT:
        raise ValueError(f"data: glue/{task} is not supported; single-sentence tasks: "
                         f"{', '.join(sorted(_GLUE_TEXT))}")
    import datasets

    ds = datasets.load_dataset("glue", task)  # needs the hub (or a local cache)
    col = _GLUE_TEXT[task]
    texts = list(ds["train"][col])
    y = np.asarray(ds["train"]["label"], dtype=np.int64)
    from sklearn.model_selection import train_test_split

    tr, va = train_test_split(np.arange(len(texts)), test_size=0.1, random_state=SPLIT_SEED,
                              stratify=y)
    tr, va = np.sort(tr), np.sort(va)
    train = Split([texts[i] for i in tr], y[tr])
    val = Split([texts[i] for i in va], y[va])
    test = Split(list(ds["validation"][col]), np.asarray(ds["validation"]["label"], dtype=np.int64))
    names = tuple(ds["train"].features["label"].names)
    return TextData(train, val, test, names, f"glue/{task}")


def batches(split: Split, tokenizer, batch_size: int, max_length: int = 128,
            shuffle: bool = False, seed: int = 0, limit: int | None = None):
    """Yield tokenised batches ``{"input_ids", "attention_mask", "labels", "index"}`` (torch),
    padded to the longest sequence of the batch; ``index`` holds the rows' split positions."""
    import torch

    order = np.arange(len(split))
    if shuffle:
        order = np.random.default_rng(seed).permutation(len(split))
    if limit is not None:
        order = order[:limit]
    for start in range(0, len(order), batch_size):
        ix = order[start : start + batch_size]
        enc = tokenizer([split.texts[i] for i in ix], padding=True, truncation=True,
                        max_length=max_length, return_tensors="pt")
        yield {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
               "labels": torch.as_tensor(split.labels[ix]), "index": torch.as_tensor(ix)}
