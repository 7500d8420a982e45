"""Text for causal-LM training: token streams with a fixed train / validation split.

    shakespeare_char   ../shared/data/shakespeare.txt, character level, first 90 % train,
                       last 10 % validation (nanoGPT's split)
    text:PATH          any text file, character level; ``tokenizer="bpe"`` trains a byte-level
                       BPE tokenizer on the file with HF ``tokenizers`` instead
    wikitext-2, wikitext-103, enwik8, text8, tiny_shakespeare
                       online, through HF ``datasets`` (their own train / validation splits;
                       wikitext with the GPT-2 BPE tokenizer, the others character level)

Random training windows and fixed validation windows are drawn by :func:`batch` and
:func:`eval_windows`. Written by hand only where no library does it: the character
vocabulary (a sorted set of characters) and window sampling.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from attnprune.research.data.base import shared_data_dir

__all__ = ["LMData", "batch", "eval_windows", "load_lm_text", "shared_data_dir"]

ONLINE = {
    # name: (datasets path, config, text column, tokenization)
    "wikitext-2": ("Salesforce/wikitext", "wikitext-2-raw-v1", "text", "gpt2"),
    "wikitext-103": ("Salesforce/wikitext", "wikitext-103-raw-v1", "text", "gpt2"),
    "enwik8": ("LTCB/enwik8", None, "text", "char"),
    "text8": ("afmck/text8", None, "text", "char"),
    "tiny_shakespeare": ("karpathy/tiny_shakespeare", None, "text", "char"),
}


@dataclass
class LMData:
    """Token streams and the means to read them back."""

    name: str
    train: Tensor  # (N_train,) long
    val: Tensor  # (N_val,) long
    vocab_size: int
    itos: list[str] | None = None  # character vocabulary, or None
    tokenizer: object | None = field(default=None, repr=False)  # a tokenizers/transformers one

    def decode(self, ids) -> str:
        """Token ids → text."""
        ids = [int(i) for i in ids]
        if self.itos is not None:
            return "".join(self.itos[i] for i in ids)
        return self.tokenizer.decode(ids)

    def encode(self, text: str) -> list[int]:
        """Text → token ids (unknown characters raise ValueError naming them)."""
        if self.itos is not None:
            stoi = {c: i for i, c in enumerate(self.itos)}
            missing = sorted({c for c in text if c not in stoi})
            if missing:
                raise ValueError(f"prompt: characters not in the vocabulary: {missing!r}")
            return [stoi[c] for c in text]
        enc = self.tokenizer.encode(text)
        return list(getattr(enc, "ids", enc))


def _char_level(name: str, text: str) -> LMData:
    itos = sorted(set(text))
    stoi = {c: i for i, c in enumerate(itos)}
    ids = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    n = int(0.9 * len(ids))  # fixed 90/10 split: first 90 % train
    return LMData(name, ids[:n], ids[n:], len(itos), itos=itos)


def _bpe(name: str, path: Path, vocab_size: int) -> LMData:
    from tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer()
    tok.train([str(path)], vocab_size=vocab_size, min_frequency=2, show_progress=False)
    ids = torch.tensor(tok.encode(path.read_text(encoding="utf-8")).ids, dtype=torch.long)
    n = int(0.9 * len(ids))
    return LMData(name, ids[:n], ids[n:], tok.get_vocab_size(), tokenizer=tok)


def _online(name: str) -> LMData:
    from datasets import load_dataset

    path, config, column, kind = ONLINE[name]
    ds = load_dataset(path, config)
    split_val = "validation" if "validation" in ds else "test"
    train_text = "\n".join(ds["train"][column])
    val_text = "\n".join(ds[split_val][column])
    if kind == "gpt2":
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained("gpt2")
        enc = lambda t: torch.tensor(tok(t)["input_ids"], dtype=torch.long)
        return LMData(name, enc(train_text), enc(val_text), len(tok), tokenizer=tok)
    itos = sorted(set(train_text) | set(val_text))
    stoi = {c: i for i, c in enumerate(itos)}
    enc = lambda t: torch.tensor([stoi[c] for c in t], dtype=torch.long)
    return LMData(name, enc(train_text), enc(val_text), len(itos), itos=itos)


def load_lm_text(name: str, tokenizer: str = "char", bpe_vocab: int = 2048) -> LMData:
    """Load the corpus ``name`` (see the module docstring). Errors name the field ``data``."""
    if name == "shakespeare_char":
        path = shared_data_dir() / "shakespeare.txt"
        if not path.is_file():
            raise ValueError(f"data: {path} not found (set ATTNPRUNE_DATA to the shared data folder)")
        return _char_level(name, path.read_text(encoding="utf-8"))
    if name.startswith("text:"):
        path = Path(name[5:]).expanduser()
        if not path.is_file():
            raise ValueError(f"data: text file not found: {path}")
        if tokenizer == "bpe":
            return _bpe(name, path, bpe_vocab)
        if tokenizer != "char":
            raise ValueError(f"tokenizer: must be 'char' or 'bpe', got {tokenizer!r}")
        return _char_level(name, path.read_text(encoding="utf-8"))
    if name in ONLINE:
        return _online(name)
    raise ValueError(f"data: unknown corpus {name!r}; known: shakespeare_char, text:PATH, "
                     f"{', '.join(ONLINE)}")


def batch(ids: Tensor, batch_size: int, context: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Random windows (x, y): x = ids[i : i+T], y = ids[i+1 : i+T+1], each (B, T)."""
    if len(ids) <= context + 1:
        raise ValueError(f"context: {context} is longer than the corpus split ({len(ids)} tokens)")
    start = torch.randint(0, len(ids) - context - 1, (batch_size,), generator=generator)
    x = torch.stack([ids[s : s + context] for s in start.tolist()])
    y = torch.stack([ids[s + 1 : s + context + 1] for s in start.tolist()])
    return x, y


def eval_windows(ids: Tensor, n_windows: int, context: int) -> tuple[Tensor, Tensor]:
    """``n_windows`` evenly spaced fixed windows (x, y) of a split: the same every call."""
    if len(ids) <= context + 1:
        raise ValueError(f"context: {context} is longer than the corpus split ({len(ids)} tokens)")
    last = len(ids) - context - 1
    starts = torch.linspace(0, last, n_windows).long().tolist()
    x = torch.stack([ids[s : s + context] for s in starts])
    y = torch.stack([ids[s + 1 : s + context + 1] for s in starts])
    return x, y
