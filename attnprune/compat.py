"""Private torch and transformers names the library uses, in one place, with the versions they
were checked against: when one moves, this file is the one to change.

Checked: torch 2.11 (CUDA 13.0) and 2.13 (CPU); transformers 5.17 and 5.24.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

if TYPE_CHECKING:  # the lazy names below, for readers and type checkers
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import (
        AttentionMaskInterface,
        create_bidirectional_mask,
        create_causal_mask,
        sdpa_mask,
    )
    from transformers.modeling_outputs import (
        BaseModelOutput,
        BaseModelOutputWithPast,
        BaseModelOutputWithPastAndCrossAttentions,
    )
    from transformers.models.deberta_v2.modeling_deberta_v2 import (
        make_log_bucket_position as deberta_make_log_bucket_position,
    )
    from transformers.models.modernbert.modeling_modernbert import (
        apply_rotary_pos_emb as modernbert_apply_rotary_pos_emb,
    )
    from transformers.trainer_pt_utils import LengthGroupedSampler
    from transformers.utils import ModelOutput

# transformers names that live in its submodules (not its public top level), imported on
# first use (``import attnprune`` stays light): name → (module, attribute). Each was checked
# in transformers 5.17 and 5.24; when a release moves one, change its row here.
_TRANSFORMERS = {
    "AttentionMaskInterface": ("transformers.masking_utils", "AttentionMaskInterface"),
    "create_bidirectional_mask": ("transformers.masking_utils", "create_bidirectional_mask"),
    "create_causal_mask": ("transformers.masking_utils", "create_causal_mask"),
    "sdpa_mask": ("transformers.masking_utils", "sdpa_mask"),
    "sdpa_attention_forward": ("transformers.integrations.sdpa_attention",
                               "sdpa_attention_forward"),
    "ModelOutput": ("transformers.utils", "ModelOutput"),
    "BaseModelOutput": ("transformers.modeling_outputs", "BaseModelOutput"),
    "BaseModelOutputWithPast": ("transformers.modeling_outputs", "BaseModelOutputWithPast"),
    "BaseModelOutputWithPastAndCrossAttentions": (
        "transformers.modeling_outputs", "BaseModelOutputWithPastAndCrossAttentions"),
    "LengthGroupedSampler": ("transformers.trainer_pt_utils", "LengthGroupedSampler"),
    "deberta_make_log_bucket_position": (
        "transformers.models.deberta_v2.modeling_deberta_v2", "make_log_bucket_position"),
    "modernbert_apply_rotary_pos_emb": (
        "transformers.models.modernbert.modeling_modernbert", "apply_rotary_pos_emb"),
}

__all__ = [
    "AttentionMaskInterface",
    "BaseModelOutput",
    "BaseModelOutputWithPast",
    "BaseModelOutputWithPastAndCrossAttentions",
    "LengthGroupedSampler",
    "ModelOutput",
    "attn_implementation",
    "auto_model_class_names",
    "children_dict",
    "config_output_attentions",
    "cpu_flash_attention_ops",
    "cpu_has_bf16",
    "create_bidirectional_mask",
    "create_causal_mask",
    "deberta_make_log_bucket_position",
    "dynamo_config_patch",
    "dynamo_config_value",
    "exporting",
    "fix_transformers_exporting",
    "hook_dicts",
    "model_from_config",
    "modernbert_apply_rotary_pos_emb",
    "sdpa_attention_forward",
    "sdpa_logsumexp",
    "sdpa_mask",
    "set_config_output_attentions",
    "size_hint",
    "tensor_version",
]


def __getattr__(name: str):
    """The transformers names of ``_TRANSFORMERS``, imported when first asked for."""
    if name not in _TRANSFORMERS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    module, attr = _TRANSFORMERS[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value  # later lookups skip this function
    return value


def exporting() -> bool:
    """torch.export (and ONNX's dynamo exporter) is tracing: ``torch.compiler._is_exporting_flag``
    itself, which dynamo reads as it is. ``torch.compiler.is_exporting()`` is answered True inside
    any compiled function by dynamo up to torch 2.11 (pytorch#176347)."""
    flag = getattr(torch.compiler, "_is_exporting_flag", None)
    return bool(flag) if flag is not None else torch.compiler.is_exporting()


def fix_transformers_exporting():
    """Make transformers' mask builders drop the mask of an unpadded batch under
    ``torch.compile`` as they do in eager, and keep it under torch.export; returns a function
    that puts the original back. Idempotent. Same answer as before outside a compile.

    - transformers 5.24 asks ``torch.compiler.is_exporting()``
      (``masking_utils.is_torchdynamo_exporting``), which dynamo answers True inside any compile
      up to torch 2.11: it is replaced by :func:`exporting`.
    - transformers 5.17 asks ``masking_utils.is_tracing(padding_mask)``, which is True inside
      any compile on every torch (``is_torchdynamo_compiling()``): with no mask tensor to read
      (``padding_mask`` None) it is replaced by :func:`exporting` under a compile; given a
      tensor, or outside a compile, the original answers.

    Without it the compiled graph hands SDPA an expanded (B, 1, T, T) bool mask whose last
    stride is 0, which no fused CUDA kernel accepts (the math path, in fp32: 2.2× slower than
    eager on an H200, issue 46). With it the mask of an unpadded batch is None, as in eager.
    Both checked in ``tests/test_compiled_sdpa_mask.py`` (``make test-transformers-5.17`` runs
    it under 5.17)."""
    global _is_tracing_original
    try:
        from transformers import masking_utils
    except ImportError:  # pragma: no cover (transformers is a dependency)
        return lambda: None
    if hasattr(masking_utils, "is_torchdynamo_exporting"):  # transformers 5.24
        name, new = "is_torchdynamo_exporting", _transformers_exporting
    elif hasattr(masking_utils, "is_tracing"):  # transformers 5.17
        name, new = "is_tracing", _transformers_is_tracing
    else:  # pragma: no cover (a release that moved both: nothing to fix that we know of)
        return lambda: None
    old = getattr(masking_utils, name)
    if old is new:
        return lambda: None
    if new is _transformers_is_tracing:
        _is_tracing_original = old
    setattr(masking_utils, name, new)

    def undo():
        setattr(masking_utils, name, old)
    return undo


def _transformers_exporting() -> bool:
    return exporting()


_is_tracing_original = None  # transformers 5.17's masking_utils.is_tracing, once replaced


def _transformers_is_tracing(tensor=None) -> bool:
    if tensor is None and torch.compiler.is_compiling():
        return exporting()
    return _is_tracing_original(tensor)


def sdpa_logsumexp(q: Tensor, k: Tensor, bias: Tensor) -> Tensor:
    """log Σ_j exp(q_i · k_j + bias_ij) per head and query row: (B, H, Lq) in float32, from
    the fused attention kernels (which compute it for their backward) — the (Lq × Lk) scores
    never exist in memory. ``q`` (B, H, Lq, d) already scaled, ``k`` (B, H, Lk, d), ``bias``
    broadcastable to (B, H, Lq, Lk) additive (no row may be all −∞).

    Public ``F.scaled_dot_product_attention`` returns only the output, so this calls the aten
    kernels behind it: ``_scaled_dot_product_flash_attention_for_cpu`` (returns (out, lse))
    on the CPU, ``_scaled_dot_product_efficient_attention`` (takes a bias; returns (out, lse,
    seed, offset), lse padded to a multiple of 32 rows) on CUDA."""
    bias = bias.to(q.dtype)
    if q.device.type == "cuda":
        lse = torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, k, bias.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2]), True,
            scale=1.0)[1]
        return lse[..., : q.shape[2]]
    # the value's output is dropped: k has the right rows and costs no copy
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, k, attn_mask=bias, scale=1.0)[1]


# ----------------------------------------------------------------------------- transformers
def attn_implementation(config) -> str | None:
    """The attention back-end a config selects (transformers 5.x keeps it in the private
    ``config._attn_implementation``; ``set_attn_implementation`` writes it)."""
    return getattr(config, "_attn_implementation", None)


def config_output_attentions(config) -> bool:
    """The ``output_attentions`` a config stores (transformers 5.x keeps it in the private
    ``config._output_attentions``, which its property reads and ``to_dict`` renames)."""
    return config._output_attentions


def set_config_output_attentions(config, value: bool) -> None:
    """Store ``output_attentions`` on a config without transformers' setter, which refuses
    any back-end but "eager" (into the private ``config._output_attentions``)."""
    config._output_attentions = value


def auto_model_class_names(table: str) -> dict:
    """One of the Auto classes' model-type → class-name tables by its name (e.g.
    ``"MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"``; {} when this release has none), from the private
    ``transformers.models.auto.modeling_auto``."""
    from transformers.models.auto import modeling_auto

    return getattr(modeling_auto, table, {})


# ----------------------------------------------------------------------------- torch.nn
def hook_dicts(module: nn.Module) -> tuple[dict, dict]:
    """``module``'s forward hooks and forward pre-hooks, as the dicts torch keeps them in (the
    private ``_forward_hooks`` / ``_forward_pre_hooks``: a hook whose handle is gone, e.g. one a
    module swap re-registered, can only be found there)."""
    return module._forward_hooks, module._forward_pre_hooks


def children_dict(module: nn.Module) -> dict:
    """``module``'s direct submodules by name (the private ``_modules``: ``named_children``
    skips duplicates and ``None`` entries, and removing one needs the dict itself)."""
    return module._modules


def keeping_inductor_config(load):
    """``load()`` (an import of a package that sets ``torch._inductor.config`` values when first
    imported: torchao 0.14 turns on coordinate-descent tuning, int-mm fusion and a post-grad
    pass), then every inductor setting put back as it was: a library call must not change how
    the user's later ``torch.compile`` calls run. Checked against torch 2.13 and torchao 0.14.1
    (``tests/test_int8.py::test_torchao_backend``, under the config-leak fixture)."""
    import torch._inductor.config as inductor_config

    before = inductor_config.get_config_copy()
    try:
        return load()
    finally:
        for key, value in before.items():
            if getattr(inductor_config, key, value) is not value:
                setattr(inductor_config, key, value)


def tensor_version(t: Tensor) -> int:
    """``t``'s in-place version counter (the private ``_version``: it goes up on every in-place
    write, so a cache keyed on it sees a weight updated in place)."""
    return t._version


def model_from_config(cls, config, **kwargs):
    """A model built from ``config`` with random weights: an auto class's ``from_config``, a
    model class's private ``_from_config`` (the one that applies ``attn_implementation`` and the
    dtype as ``from_pretrained`` does; checked in transformers 5.17 and 5.24)."""
    build = getattr(cls, "from_config", None) or cls._from_config
    return build(config, **kwargs)


def cpu_has_bf16() -> bool:
    """This CPU has native bf16 kernels (oneDNN's private probe
    ``torch.ops.mkldnn._is_mkldnn_bf16_supported``; checked in torch 2.11 and 2.13)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def cpu_flash_attention_ops() -> tuple:
    """The CPU flash-attention forward and backward aten ops (private ``aten._scaled_dot_product
    _flash_attention_for_cpu[_backward]``), each None where this torch lacks it: torch 2.13's
    FLOP counter does not count them (REFERENCE_VALUES.md)."""
    aten = torch.ops.aten
    return (getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None),
            getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None))


def size_hint(condition: bool) -> None:
    """Tell torch.export's tracer a fact about an unbacked size (``torch._check``; a no-op
    check in eager mode). Checked in torch 2.11 and 2.13."""
    torch._check(condition)


def dynamo_config_patch(**changes):
    """``torch._dynamo.config.patch(**changes)``: a context manager and decorator that sets
    dynamo options for its block only. ``changes`` may name the current value through
    :func:`dynamo_config_value`."""
    import torch._dynamo

    return torch._dynamo.config.patch(**changes)


def dynamo_config_value(name: str):
    """The current value of ``torch._dynamo.config.<name>``."""
    import torch._dynamo

    return getattr(torch._dynamo.config, name)


def hf_initialized(t: Tensor) -> bool:
    """transformers' loader marks a tensor it filled from a checkpoint (the private
    ``_is_hf_initialized``; checked in transformers 5.17 and 5.24)."""
    return bool(getattr(t, "_is_hf_initialized", False))


def own_buffer(module: nn.Module, name: str) -> Tensor | None:
    """``module``'s buffer ``name`` as torch keeps it (the private ``_buffers`` dict), or None;
    safe inside ``__setattr__`` before ``nn.Module.__init__`` made the dict."""
    return module.__dict__.get("_buffers", {}).get(name)
