"""The batches of ``attnprune finetune``: a DataLoader tokenising a split on the fly
(:func:`make_loader`) and the batches FLOPs and time are measured on (:func:`timing_batches`)."""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["make_loader", "timing_batches"]


def make_loader(split, tokenizer, batch_size: int, max_length: int, shuffle: bool, seed: int,
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
