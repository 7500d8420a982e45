"""The causal LM of ``attnprune lm``: built from the config or loaded from the hub
(:func:`build_model`), its context and method module, and its weights in safetensors."""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch
from torch import nn

from attnprune.compat import children_dict
from attnprune.research.lm_config import LMConfig

__all__ = ["build_model", "context_window", "device_of", "load_weights", "method_module",
           "save_weights"]

def build_model(cfg: LMConfig, vocab_size: int) -> nn.Module:
    """A causal LM from the hub (``cfg.model``) or from the config fields (random init)."""
    from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

    if cfg.model:
        return AutoModelForCausalLM.from_pretrained(cfg.model)
    if cfg.arch == "llama":
        return _build_llama(cfg, vocab_size)
    conf = GPT2Config(vocab_size=vocab_size, n_positions=cfg.context, n_embd=cfg.n_embd,
                      n_layer=cfg.n_layer, n_head=cfg.n_head, resid_pdrop=cfg.dropout,
                      embd_pdrop=cfg.dropout, attn_pdrop=cfg.dropout, bos_token_id=0,
                      eos_token_id=0)
    return GPT2LMHeadModel(conf)


def _build_llama(cfg: LMConfig, vocab_size: int) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    d = cfg.n_embd
    # SwiGLU has three d×ff matrices where GPT-2's MLP has two d×4d: ff = 8d/3 matches the
    # parameters (LLaMA paper, §2), rounded up to a multiple of 8.
    ff = math.ceil(8 * d / 3 / 8) * 8
    conf = LlamaConfig(vocab_size=vocab_size, hidden_size=d, intermediate_size=ff,
                       num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head,
                       num_key_value_heads=cfg.n_kv_head or max(1, cfg.n_head // 2),
                       max_position_embeddings=cfg.context, attention_dropout=cfg.dropout,
                       tie_word_embeddings=True,  # as GPT-2: the head is the embedding
                       bos_token_id=0, eos_token_id=0, pad_token_id=None)
    return LlamaForCausalLM(conf)


def context_window(config) -> int:
    """Longest sequence the model was built for (GPT-2 ``n_positions``, others
    ``max_position_embeddings``)."""
    n = getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)
    if not n:
        raise ValueError(f"model: {type(config).__name__} states no context length")
    return int(n)


def method_module(model: nn.Module) -> nn.Module | None:
    """The token method's module on a patched causal model (GPT-2 or Llama family), or None."""
    t = getattr(model, "base_model", None)
    return None if t is None else children_dict(t).get("attnprune_method")


def save_weights(model: nn.Module, path: Path) -> None:
    """Model weights (method included) to safetensors, atomically (tied weights handled)."""
    from safetensors.torch import save_model

    tmp = path.with_name(f".{path.name}.tmp")
    save_model(model, str(tmp))
    os.replace(tmp, path)


def load_weights(model: nn.Module, path: str | Path, strict: bool = False) -> list[str]:
    """Load safetensors weights; returns the model keys the file did not have."""
    from safetensors.torch import load_file

    state = load_file(str(path))
    own = model.state_dict()
    bad = [k for k, v in state.items() if k in own and own[k].shape != v.shape]
    if bad:
        raise ValueError(f"init: {path} does not fit the model (shape mismatch at {bad[0]})")
    missing, unexpected = model.load_state_dict(state, strict=False)
    if strict and unexpected:
        raise ValueError(f"init: {path} has keys the model lacks: {unexpected[:3]}")
    return [k for k in missing if k != "lm_head.weight"]  # lm_head is tied to wte


def device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device
