"""Private torch and transformers names the library uses, in one place, with the versions they
were checked against: when one moves, this file is the one to change.

Checked: torch 2.11 (CUDA 13.0) and 2.13 (CPU); transformers 5.17 and 5.24.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["attn_implementation", "children_dict", "hook_dicts", "sdpa_logsumexp"]


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
