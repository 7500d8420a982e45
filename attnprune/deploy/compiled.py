"""``attnprune.compile``: a model compiled for a few fixed input shapes (buckets).

``torch.compile`` specialises a graph on its input shapes; CUDA graphs (``mode="reduce-overhead"``)
replay one recorded graph per shape. A server sees every batch size and length, so each new
shape would compile and record again. Here each batch is padded up to the smallest bucket that
holds it (``lengths`` for the tokens, ``batch_sizes`` for the rows), the model runs at that
shape, and the outputs are cut back to the caller's: a handful of graphs serve every input.

    fast = attnprune.compile(model, lengths=(128, 256, 512), batch_sizes=(1, 8, 32))
    out = fast(input_ids=ids, attention_mask=mask)     # same outputs as model(...), cut to (B, T)

Padding is what the model already ignores: padded tokens get ``attention_mask`` 0 (the
pruning methods count real tokens only, so padding changes no keep decision), padded rows copy
the first row (a real input whose outputs are dropped). Compare a pruned model with the full
one compiled by this same function (the same buckets): the padding is then the same on both
sides. Inference only: a batch with ``labels`` is refused (the loss would count padded rows).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

__all__ = ["BucketedModel", "compile"]

# per-token outputs of two dimensions (B, T) that are cut in both; every (B, T, ...) output of
# three or more dimensions is cut in both too, every other output only in its rows
_TOKEN_2D = ("mask", "kept")


def _buckets(name: str, values: Sequence[int]) -> tuple[int, ...]:
    try:
        out = tuple(sorted({int(v) for v in values}))
    except (TypeError, ValueError):
        raise TypeError(f"{name}: give positive integers, got {values!r}") from None
    if not out or out[0] < 1:
        raise ValueError(f"{name}: give positive integers, got {values!r}")
    return out


class BucketedModel:
    """The callable :func:`compile` returns; ``model`` is the module it wraps (patched or not)
    and ``compiled`` the ``torch.compile`` of it."""

    def __init__(self, model: nn.Module, compiled, lengths: tuple[int, ...],
                 batch_sizes: tuple[int, ...], pad_token_id: int, clone: bool) -> None:
        self.model = model
        self.compiled = compiled
        self.lengths = lengths
        self.batch_sizes = batch_sizes
        self.pad_token_id = pad_token_id
        self.clone = clone  # CUDA graphs reuse their output buffers: hand out copies

    def shape_for(self, batch: int, length: int) -> tuple[int, int]:
        """The bucket (rows, tokens) a batch of ``batch`` × ``length`` runs at."""
        if length > self.lengths[-1]:
            raise ValueError(f"input length {length} is above the largest of lengths="
                             f"{self.lengths}: add a larger bucket or truncate the inputs")
        rows = self.batch_sizes[min(bisect.bisect_left(self.batch_sizes, batch),
                                    len(self.batch_sizes) - 1)]
        return rows, self.lengths[bisect.bisect_left(self.lengths, length)]

    def __call__(self, input_ids: Tensor | None = None, **inputs):
        if "labels" in inputs:
            raise ValueError("labels: attnprune.compile serves inference; the loss would count "
                             "the padded rows (call the model itself to train)")
        if input_ids is not None:
            inputs["input_ids"] = input_ids
        per_token = {k: v for k, v in inputs.items() if isinstance(v, Tensor) and v.dim() == 2}
        if not per_token:
            raise ValueError("inputs: give input_ids (or inputs_embeds is not bucketed: call "
                             "the model itself)")
        shapes = {tuple(v.shape) for v in per_token.values()}
        if len(shapes) > 1:
            raise ValueError(f"inputs: every (batch, length) input must have one shape, got "
                             f"{ {k: tuple(v.shape) for k, v in per_token.items()} }")
        batch, length = shapes.pop()
        top = self.batch_sizes[-1]
        if batch > top:  # larger batches run in chunks of the largest bucket
            parts = [self(**{k: v[i:i + top] if k in per_token else v for k, v in inputs.items()})
                     for i in range(0, batch, top)]
            return _cat(parts)
        rows, tokens = self.shape_for(batch, length)
        padded = {k: (_pad(v, rows, tokens, self._fill(k)) if k in per_token else v)
                  for k, v in inputs.items()}
        with torch.no_grad():  # inference: no autograd graph compiled or recorded around it
            out = self.compiled(**padded)
        return _cut(out, rows, tokens, batch, length, self.clone)

    def _fill(self, name: str) -> int:
        return self.pad_token_id if name == "input_ids" else 0


def _pad(x: Tensor, rows: int, tokens: int, fill: int) -> Tensor:
    """(B, T) → (rows, tokens): new tokens ``fill``, new rows copies of row 0."""
    b, t = x.shape
    if tokens > t:
        x = torch.cat([x, x.new_full((b, tokens - t), fill)], dim=1)
    if rows > b:
        x = torch.cat([x, x[:1].expand(rows - b, -1)], dim=0)
    return x


def _cut_one(name: str, t, rows: int, tokens: int, batch: int, length: int, clone: bool):
    if not isinstance(t, Tensor) or t.dim() == 0 or t.shape[0] != rows:
        return t
    t = t[:batch]
    if t.dim() >= 2 and t.shape[1] == tokens and (t.dim() >= 3 or name.endswith(_TOKEN_2D)):
        t = t[:, :length]
    return t.clone() if clone else t


def _cut(out, rows: int, tokens: int, batch: int, length: int, clone: bool):
    if isinstance(out, Tensor):
        return _cut_one("", out, rows, tokens, batch, length, clone)
    if isinstance(out, Mapping):  # ModelOutput is an OrderedDict: rebuild the same class
        return type(out)(**{k: _cut_one(k, v, rows, tokens, batch, length, clone)
                            for k, v in out.items()})
    if isinstance(out, tuple):
        return type(out)(_cut_one("", v, rows, tokens, batch, length, clone) for v in out)
    return out


def _cat(parts: list):
    first = parts[0]
    if isinstance(first, Tensor):
        return torch.cat(parts)
    if isinstance(first, Mapping):
        return type(first)(**{k: (torch.cat([p[k] for p in parts])
                                  if isinstance(v, Tensor) and v.dim() > 0 else v)
                              for k, v in first.items()})
    return type(first)(torch.cat(list(vs)) if isinstance(vs[0], Tensor) else vs[0]
                       for vs in zip(*parts, strict=True))


def compile(model: nn.Module, lengths: Sequence[int] = (128, 256, 512),
            batch_sizes: Sequence[int] = (1, 8, 32, 128), pad_token_id: int | None = None,
            **compile_options) -> BucketedModel:
    """``model`` (patched or not) compiled for the buckets ``lengths`` × ``batch_sizes``.

    ``compile_options`` go to ``torch.compile``; the defaults are ``fullgraph=True`` (a graph
    break would fall back to Python between kernels), ``dynamic=False`` (one graph per bucket,
    as CUDA graphs need) and ``mode="reduce-overhead"`` (CUDA graphs) for a model on a CUDA
    device, torch's default mode elsewhere. ``pad_token_id``: the id padded tokens get (default:
    the model config's, else 0; the attention mask hides them either way)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    lengths = _buckets("lengths", lengths)
    batch_sizes = _buckets("batch_sizes", batch_sizes)
    if pad_token_id is None:
        pad_token_id = getattr(getattr(model, "config", None), "pad_token_id", None) or 0
    param = next(model.parameters(), None)
    on_cuda = param is not None and param.device.type == "cuda"
    options = {"fullgraph": True, "dynamic": False}
    if on_cuda and "backend" not in compile_options:
        options["mode"] = "reduce-overhead"
    options.update(compile_options)
    graphs = options.get("mode") in ("reduce-overhead", "max-autotune")
    from attnprune.hosts.compat import fix_transformers_exporting

    fix_transformers_exporting()  # torch 2.11: no expanded mask for unpadded rows (issue 46)
    return BucketedModel(model, torch.compile(model, **options), lengths, batch_sizes,
                         int(pad_token_id), clone=on_cuda and graphs)
