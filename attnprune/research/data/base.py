"""What every dataset module shares: the split and data types, the fixed split seed, the
shared data folder and even spacing. The dataset modules (``text``, ``long_text``,
``docstring_domain``, ``lm_text``) import this one and not each other's internals, so the
folder has no import circle (``text.load_text_data`` dispatches to ``long_text`` lazily)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SPLIT_SEED = 20240  # fixed: the documented split of every file-based dataset


class DataError(ValueError):
    """A data problem a person can fix; the message names the file, line and column, or the
    option to set."""


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
    return Path(__file__).resolve().parents[4] / "shared" / "data"  # <repo>/../shared/data


def evenly(n: int, k: int) -> list[int]:
    """``k`` evenly spaced indices out of ``range(n)`` (all of them when ``k ≥ n``)."""
    return list(range(n)) if k >= n else [i * n // k for i in range(k)]
