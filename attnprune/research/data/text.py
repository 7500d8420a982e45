"""Text classification and regression data, single sentences or sentence pairs: the offline
tweets set, CSV/JSONL files, GLUE via HF ``datasets``; long inputs (Shakespeare genre, IMDB) in
:mod:`attnprune.research.data.long_text`.

Specs accepted by :func:`load_text_data`:

* ``tweets``: ``tweets_sentiment.csv`` (columns ``text,label,confidence``; 19,789 rows, label 1 =
  positive) from the shared data folder: ``$ATTNPRUNE_DATA``, else ``<repo>/../shared/data``.
  ``tweets:PATH`` reads that file instead.
* ``csv:PATH`` / ``jsonl:PATH``, or a plain ``PATH`` ending in ``.csv`` / ``.jsonl`` / ``.json``
  (JSON lines, as ``run_glue.py`` reads ``.json``; read by its extension): any file with a text
  column and a label column (names set by
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
  the split below); see :mod:`attnprune.research.data.long_text`.
* ``imdb``: ``datasets.load_dataset("imdb")`` when online (25k train / 25k test reviews, 0 =
  neg, 1 = pos); val is 10 % of train, stratified, as for GLUE.

Your own splits (``train_file`` / ``validation_file`` / ``test_file``, named as HF's
``run_glue.py`` names them; CSV or JSONL by extension; the same column options): the files are
the splits, no 80/10/10 cut. Without ``test_file`` the validation file is the test split and
the validation split is 10 % of the train file, stratified (as for ``glue/<task>``, whose test
labels are hidden); without ``validation_file`` it is 10 % of the train file. Class names are
the labels of all files (numbered as below); a class of the validation or test file that the
train file lacks, and a text (or text pair, whitespace collapsed) in two files, are refused with
the file, line and text of each.

Errors a person can act on (:class:`DataError`, a ValueError): every data problem names the
file, the line and the column, or the option to set: a missing column, an empty file, a file of
one class, an empty label, bytes that are not UTF-8 (a UTF-8 byte-order mark is accepted).

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
import io
import json
import os
from pathlib import Path

import numpy as np

from attnprune.research.data.base import SPLIT_SEED, DataError, Split, TextData, shared_data_dir

__all__ = ["SPLIT_SEED", "TASKS", "DataError", "TextData", "batches", "file_kind",
           "load_text_data", "load_text_files", "shared_data_dir", "tokenize"]

TWEETS_FILE = "tweets_sentiment.csv"
TASKS = ("auto", "classification", "regression")
# file extension → reader; ".json" is JSON lines, as run_glue.py and ``datasets`` read it
EXTENSIONS = {".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}
# the option that names each column, for messages that say what to set
_OPTION = {"text_column": "--text-column", "label_column": "--label-column",
           "text_pair_column": "--text-pair-column"}


def file_kind(path: str | os.PathLike) -> str:
    """"csv" or "jsonl" from a file's extension (``.csv``, ``.jsonl``, ``.json``)."""
    kind = EXTENSIONS.get(Path(path).suffix.lower())
    if kind is None:
        raise DataError(f"data: {path}: unknown file type {Path(path).suffix or '(none)'!r}; "
                        "use .csv, .jsonl or .json (JSON lines), or prefix csv: / jsonl:")
    return kind


def _read_text(path: Path) -> str:
    """The file as text; bytes that are not UTF-8 name their line (a BOM is dropped)."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        col = e.start - raw.rfind(b"\n", 0, e.start)
        raise DataError(f"data: {path} line {line}, character {col}: byte 0x{raw[e.start]:02x} is "
                        "not UTF-8; save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
                        ) from None


def _read_rows(path: Path, kind: str) -> list[tuple[int, dict]]:
    """(file line, row) pairs: the line where each row ends, so errors can point at it."""
    if not path.is_file():
        raise FileNotFoundError(f"data: file not found: {path}")
    text = _read_text(path)
    if not text.strip():
        raise DataError(f"data: {path} is empty (no header, no rows)")
    if kind == "csv":
        reader = csv.DictReader(io.StringIO(text, newline=""))
        try:
            rows = [(reader.line_num, r) for r in reader]
        except csv.Error as e:
            raise DataError(f"data: {path} line {reader.line_num}: not CSV: {e}") from None
        if not rows:
            raise DataError(f"data: {path} has a header line ({', '.join(reader.fieldnames or [])})"
                            " but no rows")
        return rows
    rows = []
    for i, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"data: {path} line {i} is not JSON: {e}") from None
            if not isinstance(r, dict):
                raise DataError(f"data: {path} line {i} is not a JSON object")
            rows.append((i, r))
    return rows


def _columns(rows: list[tuple[int, dict]], path, text_column: str, label_column: str,
             text_pair_column: str | None = None):
    """(texts, pair texts or None, raw labels, file lines) of the rows with non-empty texts;
    a row with a text but no label names its line and column."""
    if not rows:
        raise DataError(f"data: {path} has no rows")
    first = rows[0][1]
    for col, field in ((text_column, "text_column"), (label_column, "label_column"),
                       (text_pair_column, "text_pair_column")):
        if col is not None and col not in first:
            raise DataError(f"data: {path} has no column {col!r} (columns: "
                            f"{', '.join(map(str, first))}); set {field} ({_OPTION[field]})")
    texts, pairs, labels, lines = [], [], [], []
    for line, r in rows:
        t = r.get(text_column)
        t2 = r.get(text_pair_column) if text_pair_column is not None else None
        if t is None or not str(t).strip():
            continue
        if text_pair_column is not None and (t2 is None or not str(t2).strip()):
            continue
        y = r.get(label_column)
        if y is None or not str(y).strip():
            raise DataError(f"data: {path} line {line}, column {label_column!r}: the label is "
                            "empty (every row with a text needs one)")
        texts.append(str(t))
        pairs.append(str(t2))
        labels.append(y)
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
                   text_pair_column: str | None = None, task: str = "auto",
                   train_file: str | os.PathLike | None = None,
                   validation_file: str | os.PathLike | None = None,
                   test_file: str | os.PathLike | None = None) -> TextData:
    """Load ``spec`` (see the module docstring) into fixed train / val / test splits, or, with
    ``train_file``, the given files as the splits (:func:`load_text_files`; ``spec`` unused).

    ``text_pair_column``: a second text column (sentence pairs; files only: GLUE tasks know
    their columns). ``task``: "auto" (regression when a label has a fractional part),
    "classification" or "regression". Missing files raise FileNotFoundError; bad contents
    :class:`DataError` naming the file, line and column; too few rows (< 10) DataError.
    """
    if train_file is not None or validation_file is not None or test_file is not None:
        return load_text_files(train_file, validation_file, test_file, text_column,
                               label_column, text_pair_column, task)
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"data: expected a dataset spec such as 'tweets' or 'csv:PATH', got {spec!r}")
    _check_task(task)
    if spec.startswith("glue/"):
        return _load_glue(spec[5:], task)
    if spec in ("imdb", "shakespeare_genre", "docstring_domain") or spec.startswith(
            ("shakespeare_genre:", "docstring_domain:")):
        from attnprune.research.data.long_text import (
            load_long_text,  # imports this module: load it on first use
        )

        return load_long_text(spec)
    if spec == "tweets" or spec.startswith("tweets:"):
        path = Path(spec[7:]) if ":" in spec else shared_data_dir() / TWEETS_FILE
        kind, text_column, label_column = "csv", "text", "label"
    elif spec.startswith(("csv:", "jsonl:")):
        kind, rest = spec.split(":", 1)
        path = Path(rest)
    elif Path(spec).suffix.lower() in EXTENSIONS:  # a plain path: read by its extension
        path, kind = Path(spec), file_kind(spec)
    else:
        raise DataError(f"data: unknown dataset {spec!r}; use 'tweets', a .csv / .jsonl path, "
                         "'csv:PATH', 'jsonl:PATH', 'glue/<task>', 'shakespeare_genre', "
                         "'shakespeare_genre:PATH', 'docstring_domain' (built by "
                         "scripts/build_docstring_domain.py) or 'imdb'")
    texts, pairs, raw, lines = _columns(_read_rows(path, kind), path, text_column, label_column,
                                        text_pair_column)
    if len(texts) < 10:
        raise DataError(f"data: {path} has {len(texts)} usable rows; need at least 10")
    task, y, names = _labels(task, [(path, raw, lines)], label_column)
    train, val, test = _split(texts, y, pairs)
    return TextData(train, val, test, names, str(path), task)


def _labels(task: str, files: list[tuple], label_column: str
            ) -> tuple[str, np.ndarray, tuple[str, ...]]:
    """(task, labels of all ``files`` concatenated, class names) from each file's (path, raw
    labels, lines); the first file is the one that must hold ≥ 2 classes (the training one)."""
    raw = [v for _, r, _ in files for v in r]
    if task == "auto":
        task = _infer_task(raw)
    if task == "regression":
        y = np.concatenate([_regression_labels(r, ln, path, label_column)
                            for path, r, ln in files])
        path0, r0, _ = files[0]
        if np.ptp(y[:len(r0)]) == 0:
            raise DataError(f"data: {path0} column {label_column!r}: every label is {y[0]:g}; "
                            "a regression needs varying targets")
        return task, y, ()
    y, names = _encode_labels(raw)
    path0, r0, _ = files[0]
    if len(set(y[:len(r0)].tolist())) < 2:
        raise DataError(f"data: {path0} column {label_column!r}: a single class "
                        f"({str(r0[0]).strip()!r} on every row); classification needs ≥ 2 "
                        f"(is {_OPTION['label_column']} the right column?)")
    return task, y, names


def _key(text: str, pair: str | None) -> tuple[str, str | None]:
    """A text as the overlap check compares it: whitespace collapsed."""
    return " ".join(text.split()), None if pair is None else " ".join(pair.split())


def _check_disjoint(files: list[tuple]) -> None:
    """Refuse a text (or text pair) that is in two files, naming both files and lines."""
    seen: list[dict] = []
    for path, texts, pairs, lines in files:
        first: dict = {}
        for i, t in enumerate(texts):
            first.setdefault(_key(t, None if pairs is None else pairs[i]), lines[i])
        for (other, o_first) in seen:
            for k, line in first.items():
                if k in o_first:
                    shown = k[0] if len(k[0]) <= 60 else k[0][:57] + "..."
                    raise DataError(
                        f"data: the same text is in {other} line {o_first[k]} and {path} line "
                        f"{line}: {shown!r}; a text in two splits inflates the score (remove it "
                        "from one file)")
        seen.append((path, first))


def load_text_files(train_file: str | os.PathLike, validation_file: str | os.PathLike | None = None,
                    test_file: str | os.PathLike | None = None, text_column: str = "text",
                    label_column: str = "label", text_pair_column: str | None = None,
                    task: str = "auto") -> TextData:
    """Your own splits: CSV / JSONL files (by extension) named as ``run_glue.py`` names them.

    Without ``test_file`` the validation file is the test split and the validation split is 10 %
    of the train file (stratified, ``SPLIT_SEED``), as for GLUE; without ``validation_file`` too.
    Every file is read with the same columns; class names come from all files together. Refused
    with :class:`DataError` naming file, line and column: a missing column or label, a class the
    train file lacks, a text in two files, fewer than 10 training rows."""
    _check_task(task)
    if train_file is None:
        raise DataError("data: validation_file / test_file need a train_file (--train-file)")
    if validation_file is None and test_file is None:
        raise DataError("data: with --train-file give --validation-file or --test-file too (the "
                        "split the model is scored on); or one file as --data PATH, split 80/10/10")
    given = [(n, Path(f)) for n, f in (("train", train_file), ("validation", validation_file),
                                        ("test", test_file)) if f is not None]
    read = {}
    for name, path in given:
        texts, pairs, raw, lines = _columns(_read_rows(path, file_kind(path)), path, text_column,
                                            label_column, text_pair_column)
        if not texts:
            raise DataError(f"data: {path} ({name} file) has no row with a text in column "
                            f"{text_column!r}")
        read[name] = (path, texts, pairs, raw, lines)
    if len(read["train"][1]) < 10:
        raise DataError(f"data: {read['train'][0]} (train file) has {len(read['train'][1])} "
                        "usable rows; need at least 10")
    _check_disjoint([(p, t, pr, ln) for p, t, pr, _, ln in read.values()])
    task, y, names = _labels(task, [(p, r, ln) for p, _, _, r, ln in read.values()],
                             label_column)
    splits, at = {}, 0
    for name, (_path, texts, pairs, _raw, _lines) in read.items():
        splits[name] = Split(texts, y[at:at + len(texts)], pairs)
        at += len(texts)
    if names:  # a class the model never trains on cannot be learned: a typo, usually
        known = set(splits["train"].labels.tolist())
        for name in ("validation", "test"):
            if name in splits:
                path, _, _, raw, lines = read[name]
                for i, c in enumerate(splits[name].labels.tolist()):
                    if c not in known:
                        raise DataError(f"data: {path} line {lines[i]}, column {label_column!r}: "
                                        f"class {str(raw[i]).strip()!r} is not in the train file "
                                        f"{read['train'][0]}")
    train = splits["train"]
    if "test" not in splits:  # the validation file is scored; val is carved from train
        splits["test"] = splits.pop("validation")
    if "validation" not in splits:  # carved from train, as for GLUE
        from sklearn.model_selection import train_test_split

        y_tr = train.labels
        strat = y_tr if names and np.bincount(y_tr).min() >= 2 else None
        tr, va = train_test_split(np.arange(len(train)), test_size=0.1, random_state=SPLIT_SEED,
                                  stratify=strat)
        splits["validation"] = _pick(train.texts, train.pairs, y_tr, va)
        train = _pick(train.texts, train.pairs, y_tr, tr)
    source = "; ".join(f"{n}={p}" for n, p in given)
    return TextData(train, splits["validation"], splits["test"], names, source, task)


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

    try:
        ds = datasets.load_dataset("glue", name)  # needs the hub (or a local cache)
    except Exception as e:  # noqa: BLE001 (offline, no cache, hub errors: one line, not the hub client's traceback)
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise DataError(f"data: glue/{name} needs the hub or a local datasets cache, and "
                        f"neither answered ({type(e).__name__}: {first}); use a file (--data "
                        "PATH.csv) offline") from None
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
