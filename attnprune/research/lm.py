"""``attnprune lm``: train / fine-tune / evaluate a causal LM with a method: GPT-2 or a decoder
of the Llama family (Llama, Mistral, Qwen2, Qwen3, Gemma, Gemma2, Phi-3).

    attnprune lm --preset cpu-small --out runs/                          # unpruned baseline
    attnprune lm --preset cpu-small --init runs/lm-…/model.safetensors \\
                 --method dtr --method-options "{sparsity_weight: 0.5}" --out runs/

Offline default: a GPT-2 built from a config and trained from scratch; ``--arch llama`` builds
a Llama of the same depth, width, heads and context instead (RMSNorm, SwiGLU MLP of ⌈8d/3⌉
rounded to 8 so its parameters match GPT-2's 4d MLP, rotary positions, grouped-query
attention with ``n_kv_head`` key/value heads, default n_head/2); ``--model NAME`` loads a hub
checkpoint of any of these families when online. Training follows
``token_pruning_bert_to_gpt2.txt``: AdamW β = (0.9, 0.95), weight decay 0.1, cosine schedule
with warmup, gradient clipping 1.0, gradient accumulation, evaluation every ``eval_every`` steps. Pruning methods are fine-tuned from a
saved baseline (``--init``), in the paper's stages:

    none, ltp, attention methods   one stage: everything trains (LTP jointly, as the paper)
    dtr                            stage 1: the policy on the frozen backbone (REINFORCE);
                                   stage 2 (``stage2_steps`` > 0): the backbone, policy frozen
    hybrid                         stage 1: DTR policy, frozen backbone; stage 2: LTP and the
                                   backbone, policy frozen

A sweep of a method's options (:func:`run_sweep`) trains, for each seed, the unpruned control
for as many steps as the method's stages together and one run per point, all from ``--init``:

    attnprune lm --preset cpu-small --init BASE/model.safetensors --method dtr \
                 --steps 300 --stage2-steps 300 --sweep "{keep_target: [0.4, 0.6, 0.8]}" \
                 --seeds 0,1,2 --out runs/dtr-sweep --exact-out

While a REINFORCE policy trains (DTR, hybrid stage 1) every sequence of a batch is fed
``samples`` times in a row (the method's option, default 4: its leave-one-out baseline).

Checkpoints (safetensors: model, optimizer moments, RNG state; JSON for the rest) are written
at every evaluation; a killed run resumes from the last one when rerun with the same ``--out``.
Results: ``summary.json`` (perplexity, kept ratio per layer, measured and
effective FLOPs, wall time, generation tokens/s, all relative to the unpruned model measured
in the same process), ``history.json``, ``metrics.csv``, figures from :mod:`attnprune.research.lm_figures`.
The trained model is saved twice: ``model.safetensors`` (the weights ``--init`` reads) and
``model/`` (:func:`attnprune.save_pretrained`: the patched model back in one line with
``attnprune.from_pretrained("…/model")``, no pickles).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from torch import nn
from tqdm.auto import tqdm

from attnprune import api
from attnprune.compat import children_dict
from attnprune.hosts.hf_causal import cache_kwargs
from attnprune.measure import count_flops, effective_flops, env_info, time_fn
from attnprune.methods import registry
from attnprune.research.data.lm_text import LMData, batch, eval_windows, load_lm_text
from attnprune.runs.config import ConfigError, parse_command_line
from attnprune.runs.results import ResultsDir

__all__ = ["PRESETS", "LMConfig", "build_model", "evaluate", "generate", "main", "run_lm"]

PRESETS: dict[str, dict] = {
    # ≈ 0.8 M parameters; 1000 steps take ~6 min on one shared core (≤ 20 min on 2 cores).
    "cpu-small": {"n_layer": 4, "n_head": 4, "n_embd": 128, "context": 128, "dropout": 0.0,
                  "batch_size": 16, "grad_accum": 1, "steps": 1000, "lr": 2e-3, "min_lr": 2e-4,
                  "warmup": 50, "eval_every": 200},
    # The intensity paper's character GPT: 6 layers, 6 heads, width 384, context 256, dropout 0.2.
    "paper": {"n_layer": 6, "n_head": 6, "n_embd": 384, "context": 256, "dropout": 0.2,
              "batch_size": 64, "grad_accum": 1, "steps": 5000, "lr": 1e-3, "min_lr": 1e-4,
              "warmup": 100, "eval_every": 250},
}


ARCHS = ("gpt2", "llama")


@dataclass(frozen=True)
class LMConfig:
    """Settings of ``attnprune lm`` (a preset fills the model and schedule fields)."""

    preset: str = "cpu-small"
    data: str = "shakespeare_char"
    tokenizer: str = "char"  # for text:PATH: char | bpe
    model: str = ""  # hub name / local folder; "" = a model of ``arch`` from the fields below
    arch: str = "gpt2"  # gpt2 | llama: the model built from the fields below
    n_kv_head: int = 0  # llama: key/value heads (grouped-query attention); 0 = n_head // 2
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    context: int = 128
    dropout: float = 0.0
    batch_size: int = 16
    grad_accum: int = 1
    steps: int = 2000
    lr: float = 2e-3
    min_lr: float = 2e-4
    warmup: int = 100
    weight_decay: float = 0.1  # paper: AdamW weight decay 0.1
    beta1: float = 0.9  # paper: β = (0.9, 0.95)
    beta2: float = 0.95
    grad_clip: float = 1.0  # paper: clip at norm 1.0
    eval_every: int = 250
    eval_windows: int = 64
    seed: int = 0
    method: str = "none"
    method_options: str = "{}"  # a YAML mapping, e.g. "{sparsity_weight: 0.5, layers: [2]}"
    init: str = ""  # safetensors weights to start from (the saved baseline)
    # Distillation (ours, as the encoder ``finetune --distill-weight``): the loss becomes
    # (1 − α)·CE + α·T²·KL(teacher_T ‖ model_T) per position, the teacher an unpruned model of
    # the same config: a safetensors file, or in a sweep "control" (each seed's control run).
    distill_from: str = ""
    distill_weight: float = 0.0  # α
    distill_temperature: float = 1.0  # T
    stage2_steps: int = 0
    stage2_lr: float = 3e-4
    gen_tokens: int = 500  # generation throughput: 500 new tokens, temperature 0.8, KV cache
    temperature: float = 0.8
    bench_repeats: int = 5
    lengths: tuple[int, ...] = ()  # sequence lengths for the perplexity / FLOPs sweeps
    threads: int = 0  # torch threads; 0 = leave torch's default
    device: str = "auto"  # "auto": cuda when torch sees a GPU, else cpu; or "cpu", "cuda[:i]"
    # A sweep (see run_sweep): a YAML mapping of method options to lists of values, e.g.
    # "{keep_target: [0.4, 0.6, 0.8]}"; every combination is one run, fine-tuned from ``init``
    # next to an unpruned control, for each of ``seeds`` (default: ``seed``).
    sweep: str = ""
    seeds: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.device not in ("auto", "cpu", "cuda") and not str(self.device).startswith("cuda:"):
            raise ValueError(f"device: 'auto', 'cpu' or 'cuda[:i]', got {self.device!r}")
        if self.preset not in PRESETS and self.preset != "none":
            raise ValueError(f"preset: must be one of {', '.join(PRESETS)} or none, got {self.preset!r}")
        for name in ("n_layer", "n_head", "n_embd", "context", "batch_size", "grad_accum",
                     "eval_every", "eval_windows", "bench_repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        for name in ("steps", "stage2_steps", "warmup", "gen_tokens", "threads"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be ≥ 0, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd: {self.n_embd} is not divisible by n_head {self.n_head}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        for name in ("lr", "min_lr", "stage2_lr", "temperature", "grad_clip"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr ({self.min_lr}) must be ≤ lr ({self.lr})")
        if bad := [n for n in self.lengths if not 2 <= n <= self.context]:
            raise ValueError(f"lengths: each must be in 2..context ({self.context}), got {bad}")
        if self.arch not in ARCHS:
            raise ValueError(f"arch: must be one of {', '.join(ARCHS)}, got {self.arch!r}")
        if self.n_kv_head < 0 or (self.n_kv_head and self.n_head % self.n_kv_head):
            raise ValueError(f"n_kv_head: must divide n_head ({self.n_head}), got {self.n_kv_head}")
        if self.n_kv_head and self.arch != "llama":
            raise ValueError(f"n_kv_head: only the llama arch has key/value head groups, not {self.arch}")
        if self.tokenizer not in ("char", "bpe"):
            raise ValueError(f"tokenizer: must be char or bpe, got {self.tokenizer!r}")
        if self.method != "none":
            registry.get(self.method)  # ValueError naming the unknown method
        opts = yaml.safe_load(self.method_options) if self.method_options.strip() else {}
        if not isinstance(opts, dict):
            raise ValueError(  # noqa: TRY004 (configs raise ValueError naming the field)
                f"method_options: expected a mapping like '{{key: value}}', got {self.method_options!r}")
        if self.init and not Path(self.init).is_file():
            raise ValueError(f"init: checkpoint not found: {self.init}")
        if not 0.0 <= self.distill_weight <= 1.0:
            raise ValueError(f"distill_weight must be in [0, 1], got {self.distill_weight}")
        if self.distill_temperature <= 0:
            raise ValueError(f"distill_temperature must be > 0, got {self.distill_temperature}")
        if self.distill_weight > 0 and not self.distill_from:
            raise ValueError("distill_from: distill_weight > 0 needs a teacher (a safetensors file, "
                             "or 'control' in a sweep)")
        if self.distill_from == "control" and not self.sweep.strip():
            raise ValueError("distill_from: 'control' means each seed's control run of a sweep; "
                             "give --sweep, or a safetensors file")
        if self.distill_from and self.distill_from != "control" and not Path(self.distill_from).is_file():
            raise ValueError(f"distill_from: teacher weights not found: {self.distill_from}")
        if self.sweep.strip():
            grid = yaml.safe_load(self.sweep)
            if not isinstance(grid, dict) or not grid or not all(
                    isinstance(v, list) and v for v in grid.values()):
                raise ValueError(f"sweep: expected a mapping of options to non-empty lists, like "
                                 f"'{{keep_target: [0.4, 0.6]}}', got {self.sweep!r}")
            if self.method == "none":
                raise ValueError("sweep: give the --method whose options it sweeps")
            if not self.init:
                raise ValueError("init: a sweep fine-tunes from a saved baseline (--init BASE/model.safetensors)")

    @property
    def options(self) -> dict:
        """``method_options`` parsed."""
        return dict(yaml.safe_load(self.method_options) or {})

    def sweep_points(self) -> list[dict]:
        """``method_options`` updated with every combination of the ``sweep`` values."""
        import itertools

        grid = yaml.safe_load(self.sweep) if self.sweep.strip() else {}
        keys = list(grid)
        return [{**self.options, **dict(zip(keys, vals))}
                for vals in itertools.product(*(grid[k] for k in keys))]


# ----------------------------------------------------------------------------- model
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


def stages(cfg: LMConfig) -> list[dict]:
    """The training stages of ``cfg.method`` (see the module docstring)."""
    if cfg.method in ("dtr", "hybrid"):
        out = [{"name": "policy", "train": "method", "steps": cfg.steps, "lr": cfg.lr,
                "method_stage": 1}]
        n2 = cfg.stage2_steps if cfg.method == "dtr" else (cfg.stage2_steps or cfg.steps)
        if n2:
            out.append({"name": "backbone", "train": "backbone", "steps": n2,
                        "lr": cfg.stage2_lr, "method_stage": 2})
        return out
    return [{"name": "train", "train": "all", "steps": cfg.steps, "lr": cfg.lr, "method_stage": 0}]


def _set_stage(model: nn.Module, stage: dict) -> list[nn.Parameter]:
    """Freeze what the stage does not train; return the trainable parameters."""
    m = method_module(model)
    method_ids = {id(p) for p in m.parameters()} if m is not None else set()
    if m is not None and hasattr(m, "stage") and stage["method_stage"]:
        m.stage = stage["method_stage"]
    frozen_policy = set()
    if m is not None and stage["train"] == "backbone":
        # Hybrid stage 2 trains LTP with the backbone; DTR's policy stays frozen.
        keep = getattr(m, "ltp", None)
        trainable_method = {id(p) for p in keep.parameters()} if keep is not None else set()
        frozen_policy = method_ids - trainable_method
    params = []
    for p in model.parameters():
        if stage["train"] == "all":
            on = True
        elif stage["train"] == "method":
            on = id(p) in method_ids
        else:
            on = id(p) not in frozen_policy
        p.requires_grad_(on)
        if on:
            params.append(p)
    return params


def _train_mode(model: nn.Module, stage: dict) -> None:
    model.train()
    m = method_module(model)
    if m is not None and stage["train"] == "backbone" and not hasattr(m, "stage"):
        m.eval()  # DTR stage 2: the frozen policy decides deterministically (π ≥ 0.5)


def make_optimizer(params, cfg: LMConfig, lr: float) -> torch.optim.AdamW:
    """AdamW β = (0.9, 0.95); weight decay on matrices only (nanoGPT), not biases / LN / τ."""
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(cfg.beta1, cfg.beta2))


def lr_at(step: int, total: int, lr: float, min_lr: float, warmup: int) -> float:
    """Linear warmup, then cosine decay from ``lr`` to ``min_lr``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return min_lr + 0.5 * (1 + math.cos(math.pi * min(1.0, frac))) * (lr - min_lr)


# ----------------------------------------------------------------------------- checkpoints
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


def _save_checkpoint(folder: Path, model, opt, meta: dict, gen: torch.Generator) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_weights(model, folder / "model.safetensors")
    tensors = {"rng": gen.get_state()}
    for i, st in opt.state_dict()["state"].items():
        for k, v in st.items():
            tensors[f"{i}.{k}"] = torch.as_tensor(v).clone()
    tmp = folder / ".optim.safetensors.tmp"
    save_file(tensors, str(tmp))
    os.replace(tmp, folder / "optim.safetensors")
    ResultsDir(folder).write_json("meta.json", meta)  # written last: marks the checkpoint whole


def _load_checkpoint(folder: Path, model, opt, gen: torch.Generator) -> dict:
    from safetensors.torch import load_file

    load_weights(model, folder / "model.safetensors")
    tensors = load_file(str(folder / "optim.safetensors"))
    gen.set_state(tensors.pop("rng"))
    sd = opt.state_dict()
    state: dict = {}
    for key, v in tensors.items():
        i, k = key.split(".", 1)
        state.setdefault(int(i), {})[k] = v
    sd["state"] = state
    opt.load_state_dict(sd)
    return json.loads((folder / "meta.json").read_text())


# ----------------------------------------------------------------------------- evaluation
@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 16,
             sampled_method: bool = False) -> dict:
    """Mean next-token loss, perplexity and per-layer kept ratio over fixed windows (eval mode;
    ``sampled_method``: the token method alone in training mode, e.g. a policy that samples)."""
    was = model.training
    model.eval()
    m = method_module(model)
    if sampled_method and m is not None:
        m.train()
    total, n, kept, n_kept = 0.0, 0, None, 0
    per_window = []
    for i in range(0, len(x), batch_size):
        dev = _device_of(model)
        xb, yb = x[i : i + batch_size].to(dev), y[i : i + batch_size].to(dev)
        logits = model(xb).logits
        ce = F.cross_entropy(logits.flatten(0, 1).float(), yb.flatten(), reduction="none").view(yb.shape)
        per_window.append(ce.mean(1))
        total += float(ce.sum())
        n += ce.numel()
        st = api.patch_state(model)
        k = (st.stats or {}).get("kept_per_layer") if st is not None else None
        if k is not None:
            kept = [a + b * ce.numel() for a, b in zip(kept or [0.0] * len(k), k)]
            n_kept += ce.numel()
    model.train(was)
    loss = total / n
    out = {"loss": loss, "perplexity": math.exp(loss), "per_window": torch.cat(per_window).tolist()}
    out["kept_per_layer"] = [v / n_kept for v in kept] if kept is not None else None
    return out


@torch.no_grad()
def random_policy_control(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                          kept: list[float] | None, seeds: int = 3) -> dict | None:
    """Perplexity of the same model with its policy's decisions replaced by random drops at
    the same per-layer kept ratios ``kept`` (a copy of the model; methods with
    ``match_rates_``, i.e. DTR). If the learned policy only learned how many tokens to keep,
    the two perplexities agree; per-token decisions make the learned one lower."""
    import copy

    m = method_module(model)
    if kept is None or not hasattr(m, "match_rates_"):
        return None
    ctrl = copy.deepcopy(model)  # a copy of a patched model runs its own method
    method_module(ctrl).match_rates_(kept)
    evs = []
    for s in range(seeds):
        torch.manual_seed(s)  # Bernoulli drops
        evs.append(evaluate(ctrl, x, y, sampled_method=True))
    loss = float(np.mean([e["loss"] for e in evs]))
    return {"perplexity": math.exp(loss), "val_loss": loss, "seeds": seeds,
            "per_seed_perplexity": [e["perplexity"] for e in evs],
            "kept_per_layer": np.mean([e["kept_per_layer"] for e in evs], 0).tolist()}


@torch.no_grad()
def generate(model: nn.Module, prompt: torch.Tensor, n_new: int, temperature: float = 0.8,
             use_cache: bool = True, generator: torch.Generator | None = None) -> torch.Tensor:
    """Sample ``n_new`` tokens after ``prompt`` (1, T0); temperature 0 = greedy.

    Written by hand because HF ``generate`` stops at the context length: when the window is full,
    generation restarts from its last half (prefill), in both the cached and the uncached
    mode, so the two see exactly the same contexts and must produce the same tokens.
    """
    from transformers import DynamicCache

    model.eval()
    window = context_window(model.config)
    ids = prompt.clone()
    start = max(0, ids.shape[1] - window)  # the current window begins here
    cache, fed = None, 0  # cached mode: tokens of the window already in the cache
    for _ in range(n_new):
        if ids.shape[1] - start >= window:  # window full: restart from its last half
            start = ids.shape[1] - window // 2
            cache, fed = None, 0
        if use_cache:
            if cache is None:
                cache, fed = DynamicCache(config=model.config), 0
            logits = model(ids[:, start + fed :], **cache_kwargs(cache), use_cache=True).logits
            fed = ids.shape[1] - start
        else:
            logits = model(ids[:, start:], use_cache=False).logits
        last = logits[:, -1].float()
        if temperature == 0:
            nxt = last.argmax(-1, keepdim=True)
        else:
            probs = torch.softmax(last / temperature, -1)
            if generator is not None and generator.device != probs.device:
                probs = probs.cpu()  # a CPU generator (the seeds' stream) draws on the CPU
            nxt = torch.multinomial(probs, 1, generator=generator).to(ids.device)
        ids = torch.cat([ids, nxt], 1)
    return ids[:, prompt.shape[1] :]


def _layer_flops(per_module: dict, n_layer: int) -> list[int]:
    out = []
    for l in range(n_layer):
        # GPT-2's blocks are transformer.h.<l>, the Llama family's model.layers.<l>
        keys = [k for k in per_module if k.endswith((f"transformer.h.{l}", f"model.layers.{l}"))]
        out.append(per_module[keys[0]] if keys else 0)
    return out


def _set_enabled(model: nn.Module, on: bool) -> None:
    st = api.patch_state(model)
    if st is not None and hasattr(st, "enabled"):
        # keep_ratio 1.0 (causal host) means pruning stays off whatever we ask
        st.enabled = on and getattr(st, "keep_ratio", None) != 1.0


def paired_timing(model: nn.Module, fn, repeats: int, rounds: int = 3, warmup: int = 1):
    """Wall time of ``fn`` with pruning off and on, alternated over ``rounds`` rounds of
    :func:`time_fn` so a burst of load from other processes hits both; returns the two
    Timings whose median / MAD are over all repeats of all rounds."""
    import statistics

    from attnprune.measure import Timing

    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(rounds):
        for on in (False, True):
            _set_enabled(model, on)
            times[on] += list(time_fn(fn, repeats=repeats, warmup=warmup).times_s)
    _set_enabled(model, True)
    out = []
    for on in (False, True):
        t = times[on]
        med = statistics.median(t)
        mad = statistics.median(abs(v - med) for v in t)
        out.append(Timing(med, mad, len(t), warmup * rounds, torch.get_num_threads(), tuple(t)))
    return out[0], out[1]


def measure_costs(model: nn.Module, x: torch.Tensor, cfg: LMConfig, kept: list[float] | None,
                  data: LMData) -> dict:
    """FLOPs (measured and effective), wall time and generation throughput, pruned vs full."""
    model.eval()
    token_method = hasattr(api.patch_state(model), "enabled")  # our causal host
    x = x.to(_device_of(model))
    fwd = lambda: model(x)
    res: dict = {}
    with torch.no_grad():
        _set_enabled(model, False)
        full_total, full_per = count_flops(fwd, by_module=True)
        _set_enabled(model, True)
        pr_total = count_flops(fwd)
        t_full, t_pr = paired_timing(model, fwd, cfg.bench_repeats)
    per_layer = _layer_flops(full_per, model.config.num_hidden_layers)
    layers_sum = sum(per_layer)
    if kept is not None and token_method:
        eff_layers = effective_flops(per_layer, kept)
        eff_total = effective_flops(per_layer, kept, total=full_total)
    else:
        eff_layers = layers_sum
        eff_total = full_total - layers_sum + eff_layers  # embeddings/ln_f/head are never pruned
    res["flops"] = {"measured": pr_total, "full": full_total, "relative": pr_total / full_total,
                    "effective": eff_total, "proxy_relative": eff_total / full_total,
                    "effective_layers_relative": eff_layers / max(1, layers_sum),
                    "per_layer_full": per_layer, "batch_shape": list(x.shape)}
    res["time"] = {"median_s": t_pr.median_s, "mad_s": t_pr.mad_s, "relative": t_pr.median_s / t_full.median_s,
                   "full_median_s": t_full.median_s, "full_mad_s": t_full.mad_s, "threads": t_pr.threads}
    if cfg.gen_tokens:
        prompt = data.val[: min(16, cfg.context // 2)][None].to(x.device)
        out = {}
        for label, on in (("full", False), ("pruned", True)):
            _set_enabled(model, on)
            g = torch.Generator().manual_seed(cfg.seed)
            t0 = time.perf_counter()
            generate(model, prompt, cfg.gen_tokens, cfg.temperature, True, g)
            out[label] = cfg.gen_tokens / (time.perf_counter() - t0)
        _set_enabled(model, True)
        n_check = min(100, cfg.gen_tokens)
        a = generate(model, prompt, n_check, 0.0, use_cache=True)
        b = generate(model, prompt, n_check, 0.0, use_cache=False)
        res["tokens_per_s"] = out["pruned"]
        res["generation"] = {"tokens_per_s": out["pruned"], "full_tokens_per_s": out["full"],
                             "relative": out["pruned"] / out["full"], "new_tokens": cfg.gen_tokens,
                             "temperature": cfg.temperature, "kv_cache": True,
                             "cache_consistent_greedy_tokens": n_check,
                             "cache_consistent": bool(torch.equal(a, b)),
                             "sample": data.decode(generate(model, prompt, min(200, cfg.gen_tokens),
                                                            cfg.temperature, True,
                                                            torch.Generator().manual_seed(cfg.seed))[0])}
    return res


def length_sweep(model: nn.Module, data: LMData, cfg: LMConfig) -> list[dict]:
    """Perplexity, kept ratio and measured / effective FLOPs at several sequence lengths."""
    rows = []
    for T in cfg.lengths:
        x, y = eval_windows(data.val, cfg.eval_windows, T)
        ev = evaluate(model, x, y)
        xb = x[: min(8, len(x))].to(_device_of(model))
        with torch.no_grad():
            _set_enabled(model, False)
            full, per = count_flops(model, xb, by_module=True)
            _set_enabled(model, True)
            pr = count_flops(model, xb)
        per_layer = _layer_flops(per, model.config.num_hidden_layers)
        kept = ev["kept_per_layer"] or [1.0] * len(per_layer)
        eff = effective_flops(per_layer, kept, total=full)
        rows.append({"length": T, "perplexity": ev["perplexity"], "loss": ev["loss"],
                     "kept_ratio": sum(kept) / len(kept), "flops_full": full, "flops_measured": pr,
                     "flops_effective": eff})
    return rows


# ----------------------------------------------------------------------------- training
def _distilled(ce: torch.Tensor, logits: torch.Tensor, teacher: nn.Module, x: torch.Tensor,
               cfg: LMConfig) -> torch.Tensor:
    """(1 − α)·CE + α·T²·KL(softmax(t/T) ‖ softmax(s/T)), the KL averaged over positions."""
    T, a = cfg.distill_temperature, cfg.distill_weight
    with torch.no_grad():
        t = teacher(x, use_cache=False).logits
    kl = F.kl_div(F.log_softmax(logits / T, -1).flatten(0, 1), F.log_softmax(t / T, -1).flatten(0, 1),
                  log_target=True, reduction="batchmean")
    return (1 - a) * ce + a * T * T * kl


def load_teacher(cfg: LMConfig, vocab_size: int, path: str | Path) -> nn.Module:
    """The frozen unpruned teacher of ``distill_from``: a model of ``cfg``'s config."""
    teacher = build_model(cfg, vocab_size)
    load_weights(teacher, path)
    teacher.eval().requires_grad_(False)
    return teacher


def train(model, data: LMData, cfg: LMConfig, rd: ResultsDir, history: list[dict],
          teacher: nn.Module | None = None) -> list[dict]:
    """Run (or resume) every stage; checkpoints and history at each evaluation. With a
    ``teacher``, the backbone's LM loss is distilled (:func:`_distilled`)."""
    ck = rd.path / "checkpoint"
    vx, vy = eval_windows(data.val, cfg.eval_windows, cfg.context)
    meta = json.loads((ck / "meta.json").read_text()) if (ck / "meta.json").is_file() else None
    all_stages = stages(cfg)
    offset = 0
    for si, stage in enumerate(all_stages):
        params = _set_stage(model, stage)
        opt = make_optimizer(params, cfg, stage["lr"])
        gen = torch.Generator().manual_seed(cfg.seed * 1000 + si)
        step = 0
        if meta is not None:
            if meta["stage"] > si or (meta["stage"] == si and meta["done"]):
                offset += stage["steps"]
                continue
            if meta["stage"] == si:
                meta = _load_checkpoint(ck, model, opt, gen)
                step, history = meta["step"], meta["history"]
        bar = tqdm(range(step, stage["steps"]), desc=f"{cfg.method}:{stage['name']}",
                   initial=step, total=stage["steps"], disable=None, file=sys.stderr)
        _train_mode(model, stage)
        m = method_module(model)
        # A REINFORCE policy compares K sampled masks of the same sequence (DTR's leave-one-out
        # baseline): each sequence is fed K times in a row while the policy trains.
        k = int(getattr(m, "samples", 1)) if stage["train"] == "method" else 1
        for step in bar:
            lr = lr_at(step, stage["steps"], stage["lr"], min(cfg.min_lr, stage["lr"]), cfg.warmup)
            for g in opt.param_groups:
                g["lr"] = lr
            tot_loss = 0.0
            for _ in range(cfg.grad_accum):
                x, _ = batch(data.train, cfg.batch_size, cfg.context, gen)
                x = x.to(_device_of(model))
                if k > 1:
                    x = x.repeat_interleave(k, 0)
                # labels=x: HF shifts inside; the hook sees them for the policy's reward.
                out = model(x, labels=x, use_cache=False)
                loss = out.loss
                aux = api.aux_loss(model)
                total = loss if teacher is None else _distilled(loss, out.logits, teacher, x, cfg)
                total = total if aux is None else total + aux
                (total / cfg.grad_accum).backward()
                tot_loss += float(loss.detach()) / cfg.grad_accum
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            done = step + 1
            if done % cfg.eval_every == 0 or done == stage["steps"]:
                ev = evaluate(model, vx, vy)
                _train_mode(model, stage)
                history.append({"step": offset + done, "stage": stage["name"], "train_loss": tot_loss,
                                "val_loss": ev["loss"], "val_perplexity": ev["perplexity"],
                                "kept_per_layer": ev["kept_per_layer"], "lr": lr,
                                **(m.train_stats() if hasattr(m, "train_stats") else {})})
                bar.set_postfix(val=f"{ev['loss']:.3f}", train=f"{tot_loss:.3f}")
                rd.write_json("history.json", history)
                _save_checkpoint(ck, model, opt, {"stage": si, "step": done, "done": done == stage["steps"],
                                                  "history": history}, gen)
        offset += stage["steps"]
    model.eval()
    return history


def resolve_device(device: str) -> torch.device:
    """``device`` of the config: "auto" is CUDA when torch sees a GPU (training, evaluation
    and timing run there; batches are drawn on the CPU and moved), else the CPU."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("device: cuda asked for, but torch sees no CUDA device")
    return torch.device(device)


def _device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def run_lm(cfg: LMConfig, out: Path, exact: bool = False) -> Path:
    """The whole ``attnprune lm`` run; returns the results folder."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    data = load_lm_text(cfg.data, cfg.tokenizer)  # errors name ``data`` before any work
    rd = ResultsDir.start(out, "lm", exact, cfg)
    path = rd.path
    if rd.run_done("lm"):
        print(f"already finished: {path}")
        return path
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, data.vocab_size)
    if cfg.init:
        load_weights(model, cfg.init)
    device = resolve_device(cfg.device)
    model.to(device)  # before the patch: the method follows the model's device
    label = "full" if cfg.method == "none" else cfg.method
    baseline_eval = None
    vx, vy = eval_windows(data.val, cfg.eval_windows, cfg.context)
    if cfg.init:  # the unpruned model we start from, measured here for the comparison
        baseline_eval = evaluate(model, vx, vy)
    if cfg.method != "none":
        api.patch(model, cfg.method, **cfg.options)
    history = rd.read_json("history.json") if (rd.path / "history.json").is_file() else []
    teacher = None
    if cfg.distill_weight > 0:
        teacher = load_teacher(cfg, data.vocab_size, cfg.distill_from).to(device)
    history = train(model, data, cfg, rd, history, teacher)
    del teacher
    save_weights(model, rd.path / "model.safetensors")  # what ``--init`` reads
    from attnprune.deploy.hub import save_pretrained

    save_pretrained(model, rd.path / "model")  # the patched model: attnprune.from_pretrained
    ev = evaluate(model, vx, vy)
    x_bench = vx[: min(8, len(vx))]
    costs = measure_costs(model, x_bench, cfg, ev["kept_per_layer"], data)
    sweep = length_sweep(model, data, cfg) if cfg.lengths else []
    kept = ev["kept_per_layer"]
    entry = {"perplexity": ev["perplexity"], "val_loss": ev["loss"],
             "kept_ratio": None if kept is None else sum(kept) / len(kept),
             "kept_per_layer": kept, **costs}
    if (rnd := random_policy_control(model, vx, vy, kept)) is not None:
        entry["random_policy_control"] = rnd
    methods = {label: entry}
    comparisons = []
    if baseline_eval is not None:
        methods["baseline"] = {"perplexity": baseline_eval["perplexity"], "val_loss": baseline_eval["loss"]}
        entry["perplexity_relative"] = ev["perplexity"] / baseline_eval["perplexity"]
        comparisons.append(_paired_loss(label, ev["per_window"], "baseline", baseline_eval["per_window"]))
    summary = {"command": "lm", "env": env_info(device), "data": cfg.data, "methods": methods,
               "comparisons": comparisons, "length_sweep": sweep,
               "n_parameters": sum(p.numel() for p in model.parameters())}
    rd.write_json("summary.json", summary)
    rd.write_npy("val_loss_per_window.npy", np.asarray(ev["per_window"]))  # for paired tests
    rd.write_csv("metrics.csv", [{"method": label, "seed": cfg.seed, "perplexity": ev["perplexity"],
                                  "val_loss": ev["loss"], "kept_ratio": entry["kept_ratio"],
                                  "flops_relative": costs["flops"]["relative"],
                                  "flops_effective_relative": costs["flops"]["proxy_relative"],
                                  "time_relative": costs["time"]["relative"],
                                  "tokens_per_s": costs.get("tokens_per_s")}])
    from attnprune.research import lm_figures
    lm_figures.write_figures(rd, history, summary)
    rd.save_run("lm", {"perplexity": ev["perplexity"]})
    print(json.dumps({label: {k: entry[k] for k in ("perplexity", "kept_ratio")},
                      "flops_relative": costs["flops"]["relative"],
                      "time_relative": costs["time"]["relative"]}, indent=1))
    print(f"results: {path}")
    return path


# ----------------------------------------------------------------------------- sweeps
def control_schedule(cfg: LMConfig) -> tuple[int, float]:
    """Steps and learning rate of the unpruned control beside a sweep: as many steps as all
    of the method's stages together, at the backbone's learning rate (stage 2's where the
    method has a stage that trains the backbone after the policy, else ``lr``)."""
    st = stages(cfg)
    backbone = [s for s in st if s["train"] != "method"]
    return sum(s["steps"] for s in st), (backbone[-1]["lr"] if backbone else cfg.lr)


def _slug(opts: dict, swept: list[str]) -> str:
    return "-".join(f"{k}={opts[k]}" for k in swept).replace("/", "_").replace(" ", "")


def run_sweep(cfg: LMConfig, out: Path, exact: bool = False) -> Path:
    """A sweep of ``cfg.method``'s options (``cfg.sweep``), fine-tuned from ``cfg.init``.

    For each seed: the unpruned control (:func:`control_schedule`) and one run per point,
    each a plain ``lm`` run in its own subfolder (``control-s0``, ``keep_target=0.4-s0``,
    …). A rerun with the same ``--out`` skips the finished runs and resumes the killed one
    from its last checkpoint; so does a later sweep into the same folder with other points
    or more seeds (the tables then cover the points and seeds it names). Writes ``sweep.json`` (every run and every point),
    ``sweep_table.md`` / ``.csv`` (one row per point: kept ratio, measured / effective FLOPs
    and wall time relative to the full model, perplexity, its change against the control of
    the same seed: per seed a paired bootstrap over validation windows; over ≥ 2 seeds the
    mean with a t-interval and a paired t-test on the loss, Holm-adjusted over the points)
    and ``sweep.png``.
    """
    from dataclasses import replace

    from scipy import stats as sps

    from attnprune.research import lm_figures
    from attnprune.runs.stats import aggregate_seeds, holm

    rd = ResultsDir.start(out, "lm-sweep", exact, cfg)
    seeds = cfg.seeds or (cfg.seed,)
    points = cfg.sweep_points()
    swept = list(yaml.safe_load(cfg.sweep))
    steps, lr = control_schedule(cfg)
    single = replace(cfg, sweep="", seeds=(), distill_from="", distill_weight=0.0)
    runs = []
    for seed in seeds:
        ctrl = run_lm(replace(single, seed=seed, method="none", method_options="{}", steps=steps,
                              lr=lr, min_lr=min(cfg.min_lr, lr), stage2_steps=0),
                      rd.path / f"control-s{seed}", exact=True)
        teacher = str(ctrl / "model.safetensors") if cfg.distill_from == "control" else cfg.distill_from
        c_sum = json.loads((ctrl / "summary.json").read_text())
        c_loss = np.load(ctrl / "val_loss_per_window.npy")
        c_ppl = c_sum["methods"]["full"]["perplexity"]
        for i, opts in enumerate(points):
            opt_text = yaml.safe_dump(opts, default_flow_style=True).strip()
            run = run_lm(replace(single, seed=seed, method_options=opt_text, distill_from=teacher,
                                 distill_weight=cfg.distill_weight),
                         rd.path / f"{_slug(opts, swept)}-s{seed}", exact=True)
            e = json.loads((run / "summary.json").read_text())["methods"][cfg.method]
            cmp = _paired_loss(cfg.method, np.load(run / "val_loss_per_window.npy"), "control", c_loss)
            runs.append({"point": i, "seed": seed, "run": run.name, "control": ctrl.name,
                         **{k: opts[k] for k in swept}, "kept_ratio": e["kept_ratio"],
                         "kept_per_layer": e["kept_per_layer"], "flops_relative": e["flops"]["relative"],
                         "flops_effective_relative": e["flops"]["proxy_relative"],
                         "time_relative": e["time"]["relative"], "perplexity": e["perplexity"],
                         "control_perplexity": c_ppl,
                         "perplexity_change_pct": 100 * (e["perplexity"] / c_ppl - 1),
                         "random_policy_perplexity": (e.get("random_policy_control") or {}).get("perplexity"),
                         "loss_diff": cmp["diff"], "loss_diff_ci95": cmp["ci95"], "p_bootstrap": cmp["p"]})
    rows = []
    for i, opts in enumerate(points):
        rs = [r for r in runs if r["point"] == i]
        mean = {k: float(np.mean([r[k] for r in rs])) for k in
                ("kept_ratio", "flops_relative", "flops_effective_relative", "time_relative",
                 "perplexity", "control_perplexity", "perplexity_change_pct")}
        d = [r["loss_diff"] for r in rs]
        if len(rs) > 1:  # between seeds: t-interval of Δppl %, paired t-test of the loss
            ci = aggregate_seeds([r["perplexity_change_pct"] for r in rs])["ci95"]
            p = float(sps.ttest_1samp(d, 0.0).pvalue)
            test = f"paired t-test over {len(rs)} seeds"
        else:  # one seed: the paired bootstrap over windows
            lo, hi = rs[0]["loss_diff_ci95"]
            ci = [100 * (math.exp(lo) - 1), 100 * (math.exp(hi) - 1)]
            p, test = rs[0]["p_bootstrap"], "paired bootstrap over windows"
        rnd = [r["random_policy_perplexity"] for r in rs if r["random_policy_perplexity"] is not None]
        mean["random_policy_perplexity"] = float(np.mean(rnd)) if rnd else None
        rows.append({"point": i, **{k: opts[k] for k in swept}, "seeds": len(rs), **mean,
                     "perplexity_change_ci95": ci, "p": p, "test": test})
    for r, ph in zip(rows, holm([r["p"] for r in rows])):
        r["p_holm"] = float(ph)
    rd.write_json("sweep.json", {"command": "lm sweep", "method": cfg.method, "swept": swept,
                                 "seeds": list(seeds), "init": cfg.init,
                                 "control": {"steps": steps, "lr": lr}, "points": rows, "runs": runs,
                                 "env": env_info()})
    rd.write_csv("sweep_table.csv", rows)
    rd.write_text("sweep_table.md", lm_figures.sweep_markdown(rows, swept))
    lm_figures.sweep_figure(rd, rows, swept, cfg.method)
    print(lm_figures.sweep_markdown(rows, swept))
    print(f"results: {rd.path}")
    return rd.path


def _paired_loss(label: str, per_window, ref: str, ref_per_window) -> dict:
    """Paired bootstrap CI of the mean validation loss, ``label`` − ``ref``, over the same
    windows (a window is the resampling unit: tokens inside one are not independent)."""
    from attnprune.runs.stats import paired_bootstrap_ci

    a, b = np.asarray(per_window), np.asarray(ref_per_window)
    r = paired_bootstrap_ci(np.zeros(len(a)), a, b, metric=lambda y, x: x.mean(axis=-1),
                            vectorized=True, n_resamples=5000, seed=0)
    return {"a": label, "b": ref, "metric": "val_loss", "diff": r.estimate,
            "ci95": [r.low, r.high], "test": "paired bootstrap over windows", "p": r.pvalue,
            "effect": {"perplexity_ratio": math.exp(r.estimate)}}


def main(argv: list[str]) -> int:
    """``attnprune lm [--preset cpu-small|paper] [--key value …] --out DIR``."""
    if argv and argv[0] in ("-h", "--help"):
        from attnprune.runs.config import print_help

        print_help(__doc__, LMConfig)
        return 0
    preset = "cpu-small"
    for i, a in enumerate(argv):  # the preset may sit in the config file or on the line
        if a == "--config" and i + 1 < len(argv):
            from attnprune.runs.config import read_yaml

            preset = str(read_yaml(argv[i + 1]).get("preset", preset))
    for i, a in enumerate(argv):
        if a == "--preset" and i + 1 < len(argv):
            preset = argv[i + 1]
        elif a.startswith("--preset="):
            preset = a.split("=", 1)[1]
    if preset not in PRESETS and preset != "none":
        raise ConfigError(f"preset: must be one of {', '.join(PRESETS)} or none, got {preset!r}")
    cl = parse_command_line(argv, LMConfig, default_out="results", defaults=PRESETS.get(preset, {}))
    (run_sweep if cl.config.sweep.strip() else run_lm)(cl.config, cl.out, cl.exact_out)
    return 0
