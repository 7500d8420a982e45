"""ONNX export of a token-pruned (or stock) HF encoder: ``export_onnx(model, path)``.

The pruned model goes through ``torch.onnx.export(..., dynamo=True)`` (torch.export, then
onnxscript's translation), with dynamic batch and sequence axes: the exported graph gathers
the kept tokens into a shorter tensor exactly as the PyTorch host does, so onnxruntime spends
the same reduced work. Named after ``torch.onnx.export`` (and Optimum's ``export_onnx``):
a model, a file path, example inputs.

What makes a pruned forward exportable is that every tensor shape is a function of the input
shapes, never of the values. While traced, the host (:mod:`attnprune.hosts.hf_encoder`, see
``_tracing``) sizes each gather by K = ⌊ρ·K_prev⌋, the largest kept count any row can have
(a row with fewer real tokens is padded and masked, as in the eager padded batch), and skips
what reads counts back from the data (statistics, row bucketing, ``.item()``).
That holds for methods whose kept count is k = ⌊ρ·n⌋ at inference:

* ``attention_mass``, ``entropy``: exported; the same kept tokens and logits as PyTorch.
* ``entropy_gumbel``: its Gumbel noise and soft gate exist in training only; at inference it
  is a hard top-k of the gate logits, so the eval model exports.
* ``random``: exports (``torch.rand`` becomes ONNX ``RandomUniformLike``) with the same
  shapes and kept counts, but onnxruntime draws other random numbers than torch: the kept
  tokens, hence the logits, differ. Parity cannot be checked; it is a control, not a model
  to deploy.

Refused with a ValueError (:data:`NOT_EXPORTABLE` says why): methods whose kept count depends
on the values (LTP's learned thresholds, ``entropy_threshold``, DTR's policy, ``hybrid``),
so K would be a data-dependent size that no shape formula bounds without keeping every
token; and the attention-level methods (``crisp``, ``intensity``), which run as custom
attention functions and have not been checked here.

One translation is added: ``torch.sort(..., stable=True)`` (top-k ties broken by position,
:func:`attnprune.selection.topk_keep`) has no ONNX function in torch 2.13's table; ONNX
``TopK`` over the whole axis is the same thing (its spec breaks ties by the lower index, the
order of a stable sort).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

__all__ = ["EXPORTABLE", "NOT_EXPORTABLE", "export_onnx", "onnx_session", "run_onnx"]

# Token methods whose inference-time kept count is ⌊ρ·n⌋ (shapes follow the input shape).
EXPORTABLE = ("attention_mass", "entropy", "entropy_gumbel", "random")
NOT_EXPORTABLE = {
    "ltp": "learned thresholds keep a data-dependent number of tokens",
    "entropy_threshold": "an entropy threshold keeps a data-dependent number of tokens",
    "dtr": "the policy keeps tokens with π ≥ 0.5: a data-dependent number",
    "hybrid": "DTR's policy and LTP's thresholds keep a data-dependent number of tokens",
    "ltp_causal": "a causal-LM method with learned thresholds (data-dependent counts)",
}


def _sort_stable(self, *, stable=None, dim: int = -1, descending: bool = False):
    """ONNX for ``aten.sort.stable``: TopK with k = the axis length, ties to the lower index."""
    from onnxscript import opset18 as op

    n = op.Gather(op.Shape(self), op.Constant(value_ints=[dim]), axis=0)  # (1,) int64
    values, indices = op.TopK(self, n, axis=dim, largest=descending, sorted=True)
    return values, indices


def _check_exportable(model: nn.Module, max_length: int) -> None:
    """ValueError unless ``model`` is stock or patched by hf_encoder with a fixed-budget method."""
    from ..api import patch_state
    from ..hosts.hf_encoder import HFEncoderState, _static_budget
    from ..selection import budget

    state = patch_state(model)
    if state is None:
        return
    name = state.method
    if name in NOT_EXPORTABLE:
        raise ValueError(f"method: {name!r} cannot be exported to ONNX: "
                         f"{NOT_EXPORTABLE[name]}, so the pruned length is not a function of "
                         f"the input length. Exportable: {', '.join(EXPORTABLE)}")
    if name not in EXPORTABLE or not isinstance(state, HFEncoderState):
        raise ValueError(f"method: export_onnx supports the token methods "
                         f"{', '.join(EXPORTABLE)} on BERT-like encoders (hf_encoder host), "
                         f"got {name!r} ({type(state).__name__})")
    # The graph sizes each gather by integer arithmetic (_static_budget); it must equal the
    # eager budget ⌊ρ·n⌋ at every length the graph will see, else a kept token is cut.
    prev = 1.0
    for r in state.schedule[:-1]:
        if r < prev - 1e-12:
            rho = r / prev
            for n in range(1, max_length + 1):
                if _static_budget(n, rho) != int(budget(n, rho)):
                    raise ValueError(f"keep_ratio: step ρ = {rho!r} has no exact fraction "
                                     f"p/q with q ≤ 65536 (⌊{n}·ρ⌋ differs); use a ratio "
                                     f"such as 0.3 or 0.5")
        prev = r


def _shortest(model: nn.Module, length: int) -> int:
    """The traced length of the last pruned layer for an input ``length`` tokens wide."""
    from ..api import patch_state
    from ..hosts.hf_encoder import _static_budget

    state = patch_state(model)
    prev, k = 1.0, length
    for r in getattr(state, "schedule", (1.0,))[:-1]:
        if r < prev - 1e-12:
            k = _static_budget(k, r / prev)
        prev = r
    return k


def export_onnx(model: nn.Module, path: str | os.PathLike, example: dict | None = None, *,
                max_length: int | None = None, dynamic: bool = True,
                verify: bool = True, atol: float = 1e-4) -> Path:
    """Export ``model`` (stock, or patched with a fixed-budget token method) to ONNX at ``path``.

    ``example``: keyword inputs of the model used to trace (default: 2 rows × 32 random
    token ids with an all-ones ``attention_mask``); their names become the graph's inputs and
    the model output's fields (``logits``, or ``last_hidden_state`` …) its outputs.
    ``dynamic``: batch and sequence axes free (sequence 2 … ``max_length``, default the
    model's ``max_position_embeddings``). ``verify``: run the file in onnxruntime on
    ``example`` and raise if any output differs from PyTorch by more than ``atol`` (skipped
    for ``random``, whose draws differ by design). The model is exported in eval mode and
    returned to its mode. Needs ``pip install attnprune[deploy]`` (onnx, onnxscript,
    onnxruntime). Returns the path.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    cfg = getattr(model, "config", None)
    if max_length is None:
        max_length = int(getattr(cfg, "max_position_embeddings", 512))
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
        raise ValueError(f"max_length must be an integer ≥ 2, got {max_length!r}")
    _check_exportable(model, max_length)
    if example is None:
        length = min(32, max_length)
        while _shortest(model, length) < 2 and length < max_length:
            length = min(2 * length, max_length)
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
    length = next(iter(example.values())).shape[1]
    if _shortest(model, length) < 2:
        # Traced at K = 1, the stock layers take size-1 branches (HF's SDPA is_causal test
        # on q_length > 1) and the graph would hold only for that case.
        raise ValueError(f"example: length {length} leaves a single token after pruning; "
                         f"trace with a longer example (the graph then takes any length)")
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
        torch.onnx.export(model, (), str(path), kwargs=example, dynamo=True,
                          dynamic_shapes=shapes, input_names=names, output_names=outputs,
                          custom_translation_table={torch.ops.aten.sort.stable: _sort_stable},
                          verbose=False)
    finally:
        model.train(was_training)
    from ..api import patch_state

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
