"""Passkey retrieval on a tiny Llama trained here: the long-prompt quality test of issue 25.

The task (after Mohtashami & Jaggi 2023, "Landmark attention", §4.2, passkey retrieval), with
a synthetic vocabulary so that it needs no tokenizer and no download:

    BOS  f f f … f  KEY d₁ … d_D  f f … f  QUERY  →  d₁ … d_D

f are filler tokens drawn uniformly, d digits, KEY / QUERY markers; the key sits at a uniform
position of the prompt. A model that answers must attend from QUERY back to the key across
the whole prompt, so a pruning that drops a key token costs the answer: retrieval accuracy
(all D digits right, greedy) against the kept fraction is the quality side of the TTFT table.

Vocabulary: 0 BOS / pad, 1 KEY, 2 QUERY, 3 … 12 the digits, 13 … V−1 filler.

Training (:func:`train`): the LM loss on the answer digits only, prompts of random length in
[``min_len``, ``max_len``] (RoPE does not extrapolate far past the trained lengths: evaluate
at lengths ≤ ``max_len``), AdamW. This is a start: the sizes that reach ≥ 95 % unpruned at
512–2k tokens on a CPU budget are not settled yet.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

BOS, KEY, QUERY, DIGIT0, FILLER0 = 0, 1, 2, 3, 13


@dataclass(frozen=True)
class PasskeyConfig:
    """The task and the tiny model."""

    digits: int = 4
    vocab: int = 64
    width: int = 128
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 344
    min_len: int = 64
    max_len: int = 512
    steps: int = 2000
    batch: int = 16
    lr: float = 2e-3
    seed: int = 0

    def __post_init__(self):
        if self.vocab <= FILLER0 + 1:
            raise ValueError(f"vocab: must leave filler tokens above {FILLER0}, got {self.vocab}")
        if not 0 < self.digits < self.min_len // 2:
            raise ValueError(f"digits: must be in 1..{self.min_len // 2 - 1}, got {self.digits}")


def passkey_batch(n: int, length: int, digits: int, vocab: int,
                  generator: torch.Generator | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(prompts (n, length), answers (n, digits), key slots (n,)): each prompt ends with QUERY;
    the key block KEY d₁ … d_D starts at a uniform slot in 1 … length − D − 2."""
    g = generator
    ids = torch.randint(FILLER0, vocab, (n, length), generator=g)
    ids[:, 0], ids[:, -1] = BOS, QUERY
    answers = torch.randint(0, 10, (n, digits), generator=g) + DIGIT0
    start = torch.randint(1, length - digits - 1, (n,), generator=g)  # KEY slot
    rows = torch.arange(n)
    ids[rows, start] = KEY
    for i in range(digits):
        ids[rows, start + 1 + i] = answers[:, i]
    return ids, answers, start


def build_model(cfg: PasskeyConfig) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(cfg.seed)
    conf = LlamaConfig(vocab_size=cfg.vocab, hidden_size=cfg.width, intermediate_size=cfg.ffn,
                       num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads,
                       num_key_value_heads=cfg.kv_heads, max_position_embeddings=4096,
                       bos_token_id=BOS, eos_token_id=None, pad_token_id=BOS,
                       attn_implementation="sdpa")
    return LlamaForCausalLM(conf)


def train(cfg: PasskeyConfig, progress=print) -> nn.Module:
    """A tiny Llama trained on passkey prompts (loss on the answer digits only)."""
    model = build_model(cfg).train()
    g = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    warm = max(1, cfg.steps // 20)
    for step in range(cfg.steps):
        lr = cfg.lr * min(1.0, (step + 1) / warm) * 0.5 * (1 + math.cos(math.pi * step / cfg.steps))
        for group in opt.param_groups:
            group["lr"] = lr
        L = int(torch.randint(cfg.min_len, cfg.max_len + 1, (1,), generator=g))
        prompts, answers, _ = passkey_batch(cfg.batch, L, cfg.digits, cfg.vocab, g)
        x = torch.cat([prompts, answers], 1)
        labels = torch.full_like(x, -100)
        labels[:, L:] = answers  # HF shifts: position L−1 (QUERY) predicts d₁
        loss = model(x, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if progress and (step % 100 == 0 or step == cfg.steps - 1):
            progress(f"step {step} L {L} loss {loss.item():.4f}")
    return model.eval()


@torch.inference_mode()
def accuracy(model: nn.Module, cfg: PasskeyConfig, length: int, n: int = 64, seed: int = 1,
             batch: int = 16, **prefill_options) -> float:
    """Share of prompts whose D digits are all retrieved (greedy). With ``prefill_options``
    (:class:`attnprune.prefill.PrefillConfig` fields) the prefill is pruned."""
    from ..prefill import generate

    g = torch.Generator().manual_seed(seed)
    right = 0
    for lo in range(0, n, batch):
        prompts, answers, _ = passkey_batch(min(batch, n - lo), length, cfg.digits, cfg.vocab, g)
        opts = prefill_options or {"keep": 1.0}
        out = generate(model, prompts, max_new_tokens=cfg.digits, **opts)
        right += int((out.tokens == answers).all(1).sum())
    return right / n
