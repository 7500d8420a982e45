"""ONNX export of a token-pruned (or stock) HF encoder: ``export_onnx(model, path)``.

The pruned model goes through ``torch.onnx.export(..., dynamo=True)`` (torch.export, then
onnxscript's translation), with dynamic batch and sequence axes: the exported graph gathers
the kept tokens into a shorter tensor exactly as the PyTorch host does, so onnxruntime spends
the same reduced work. Named after ``torch.onnx.export`` (and Optimum's ``export_onnx``):
a model, a file path, example inputs.

How a pruned forward exports: while traced, the encoder host (:mod:`attnprune.hosts.hf_encoder`,
``_tracing``) sizes each gather by the batch's largest kept count read with ``.item()``, which
torch.export records as a data-dependent size (an unbacked SymInt) and ONNX computes in the
graph (ReduceMax → Slice). So the graph keeps exactly what the eager forward keeps, CLS and
separators included (they may outnumber ⌊ρ·n⌋ on short pairs), and the kept count may depend
on the values: every token method of the encoder host exports with the same logits.

* ``attention_mass``, ``entropy``, ``entropy_gumbel`` (a hard top-k of its gate at inference):
  fixed budgets k = ⌊ρ·n⌋ (ρ enters the graph as a float64 constant:
  :func:`attnprune.selection.budget`).
* ``entropy_threshold``, ``ltp`` (learned thresholds), ``dtr`` (π ≥ 0.5), ``hybrid``: the kept
  count depends on the scores; the graph computes it the same way.
* ``random``: exports (``torch.rand`` becomes ``RandomUniformLike``), but onnxruntime draws
  other numbers than torch, so its kept tokens and logits differ: a control, not a model to
  deploy; ``verify`` skips it.

Refused with a ValueError (:func:`_check_exportable` says why): patches of other hosts (the
causal LMs: GPT-2 / Llama, whose serving path is ``generate`` with a KV cache, not one graph
call), the attention-level methods ``crisp`` and ``intensity`` (custom attention functions
whose export has not been checked here) and stacked patches.

One translation is added: ``torch.sort(..., stable=True)`` (top-k ties broken by position,
:func:`attnprune.selection.topk_keep`) has no ONNX function in torch 2.13's table; ONNX
``TopK`` over the whole axis is the same thing (its spec breaks ties by the lower index, the
order of a stable sort).
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

__all__ = ["export_onnx", "onnx_session", "run_onnx"]

_log = logging.getLogger(__name__)

# What torch 2.13's exporter says on every export that is no fault of the model or the export
# (a new user read seven such lines as errors): logged at debug level here, not shown. Any
# other warning goes through as it came.
HARMLESS_WARNINGS = (
    # torch.export's pytree, deprecated inside torch itself
    (FutureWarning, re.compile(r"isinstance\(treespec, LeafSpec\)` is deprecated")),
    # the batch / sequence Dim shared by every input: one name kept, the others' "not used"
    (UserWarning, re.compile(r"The axis name: \S+ will not be used, since it shares the same "
                             r"shape constraints with another axis")),
)
HARMLESS_LOGS = {  # logger: messages (WARNING and below) of torch's exporter
    "torch.onnx._internal.exporter._registration": (
        re.compile(r"torchvision is not installed\. Skipping torchvision::"),),
}
SINGLE_FILE_LIMIT = 2 * 1024**3  # protobuf's limit on one ONNX file; weights beyond it go beside

def _sort_stable(self, *, stable=None, dim: int = -1, descending: bool = False):
    """ONNX for ``aten.sort.stable``: TopK with k = the axis length, ties to the lower index."""
    from onnxscript import opset18 as op

    n = op.Gather(op.Shape(self), op.Constant(value_ints=[dim]), axis=0)  # (1,) int64
    values, indices = op.TopK(self, n, axis=dim, largest=descending, sorted=True)
    return values, indices


class _ToDebug(logging.Filter):
    """Drop a logger's harmless records, logging each at debug level on attnprune's logger."""

    def __init__(self, patterns) -> None:
        super().__init__()
        self.patterns = patterns

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.levelno <= logging.WARNING and any(p.search(message) for p in self.patterns):
            _log.debug("torch.onnx (%s): %s", record.name, message)
            return False
        return True


@contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Inside: torch's exporter's :data:`HARMLESS_WARNINGS` and :data:`HARMLESS_LOGS` go to
    the debug log; every other warning is shown as it would have been (at the end, through
    the caller's filters: ``-W error`` still raises), and errors propagate. Scoped: the
    warnings filters and the loggers are as before on the way out."""
    filters = [(logging.getLogger(name), _ToDebug(patterns))
               for name, patterns in HARMLESS_LOGS.items()]
    for logger, f in filters:
        logger.addFilter(f)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
    finally:
        for logger, f in filters:
            logger.removeFilter(f)
        for w in caught:
            if any(issubclass(w.category, c) and p.search(str(w.message))
                   for c, p in HARMLESS_WARNINGS):
                _log.debug("torch.onnx: %s: %s", w.category.__name__, w.message)
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno,
                                       source=w.source)


def _check_exportable(model: nn.Module) -> None:
    """ValueError unless ``model`` is stock or patched by the encoder host with a token method."""
    from attnprune.api import patch_state
    from attnprune.hosts.hf_encoder import HFEncoderState

    state = patch_state(model)
    if state is None or isinstance(state, HFEncoderState):
        return
    name = getattr(state, "method", None) or type(state).__name__
    raise ValueError(f"method: export_onnx supports stock encoders and token methods on "
                     f"BERT-like encoders (the hf_encoder host); got {name!r} "
                     f"({type(state).__name__}): causal LMs, attention-level methods and "
                     f"stacked patches are not exported")


def export_onnx(model: nn.Module, path: str | os.PathLike, example: dict | None = None, *,
                max_length: int | None = None, dynamic: bool = True,
                verify: bool = True, atol: float = 1e-4, single_file: bool = False) -> Path:
    """Export ``model`` (stock, or patched with a token method of the encoder host) to ONNX at
    ``path``.

    ``example``: keyword inputs of the model used to trace (default: 2 rows × 32 random
    token ids with an all-ones ``attention_mask``); their names become the graph's inputs and
    the model output's fields (``logits``, or ``last_hidden_state`` …) its outputs.
    ``dynamic``: batch and sequence axes free (sequence 2 … ``max_length``, default the
    model's ``max_position_embeddings``). ``verify``: run the file in onnxruntime on
    ``example`` and raise if any output differs from PyTorch by more than ``atol`` (skipped
    for ``random``, whose draws differ by design). The model is exported in eval mode and
    returned to its mode. Needs ``pip install attnprune[deploy]`` (onnx, onnxscript,
    onnxruntime). ``single_file``: the weights inside the ``.onnx`` file (under 2 GiB of
    parameters and buffers, protobuf's limit), not in ``<path>.data`` beside it (the default,
    torch's). torch's exporter's known-harmless warnings (torchvision not installed, merged
    axis names, its own deprecations) go to this module's debug log; other warnings are shown.
    Returns the path.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    cfg = getattr(model, "config", None)
    if max_length is None:
        max_length = int(getattr(cfg, "max_position_embeddings", 512))
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
        raise ValueError(f"max_length must be an integer ≥ 2, got {max_length!r}")
    _check_exportable(model)
    if not isinstance(single_file, bool):
        raise ValueError(f"single_file must be True or False, got {single_file!r}")  # noqa: TRY004 (the API's contract: ValueError)
    if single_file:
        size = sum(t.numel() * t.element_size()
                   for t in (*model.parameters(), *model.buffers()))
        if size >= SINGLE_FILE_LIMIT:
            raise ValueError(f"single_file: the model holds {size / 1024**3:.1f} GiB of weights, "
                             f"over ONNX's 2 GiB for one file; export with single_file=False "
                             f"(the weights go to {Path(path).name}.data beside it)")
    if example is None:
        length = min(32, max_length)
        g = torch.Generator().manual_seed(0)
        vocab = int(getattr(cfg, "vocab_size", 1000))
        ids = torch.randint(min(5, vocab - 1), vocab, (2, length), generator=g)
        example = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if not isinstance(example, dict) or not example:
        raise ValueError("example must be a non-empty dict of input tensors, e.g. "
                         "{'input_ids': ..., 'attention_mask': ...}")
    for k, v in example.items():
        if not isinstance(v, torch.Tensor) or v.dim() != 2:
            raise ValueError(f"example[{k!r}] must be a (batch, length) tensor")
    if next(iter(example.values())).shape[1] < 2:
        raise ValueError("example: trace with at least 2 tokens per row (the graph then "
                         "takes any length from 2 to max_length)")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    names = list(example)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            ref = model(**example)
        outputs = [k for k, v in ref.items() if isinstance(v, torch.Tensor)]
        shapes = None
        if dynamic:
            batch = torch.export.Dim("batch", min=1, max=1 << 16)
            seq = torch.export.Dim("sequence", min=2, max=max_length)
            shapes = {k: {0: batch, 1: seq} for k in names}
        with _quiet_exporter():
            torch.onnx.export(model, (), str(path), kwargs=example, dynamo=True,
                              dynamic_shapes=shapes, input_names=names, output_names=outputs,
                              custom_translation_table={torch.ops.aten.sort.stable: _sort_stable},
                              external_data=not single_file, verbose=False)
    finally:
        model.train(was_training)
    from attnprune.api import patch_state

    state = patch_state(model)
    if verify and not (state is not None and state.method == "random"):
        got = run_onnx(onnx_session(path), example)
        for k in outputs:
            diff = (torch.as_tensor(got[k]) - ref[k]).abs().max().item()
            if not diff <= atol:
                raise RuntimeError(f"export_onnx: onnxruntime's {k} differs from PyTorch's by "
                                   f"{diff:.3g} > atol={atol}")
    return path


def onnx_session(path: str | os.PathLike, threads: int | None = None):
    """An onnxruntime CPU ``InferenceSession`` for ``path`` with ``threads`` intra-op threads
    (default: torch's thread count, so ONNX and PyTorch timings use the same cores)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = int(threads or torch.get_num_threads())
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def run_onnx(session, inputs: dict) -> dict:
    """Run ``session`` on a dict of tensors (or arrays); returns {output name: numpy array}.
    Inputs the graph does not take are dropped (a tokenizer's ``token_type_ids`` when the
    model was exported without them)."""
    wanted = {i.name for i in session.get_inputs()}
    feed = {k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()
            if k in wanted}
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feed), strict=True))
