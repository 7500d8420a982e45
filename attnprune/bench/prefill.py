"""``python -m attnprune.bench.prefill``: time to first token with training-free prefill pruning.

A randomly initialised Llama-shaped decoder (defaults: width 256, 8 layers, 4 heads of 64,
2 key/value heads, FFN 704, vocabulary 1000; SDPA) prefills random prompts of each length in
``lengths``; every variant is timed until the logits of the first new token:

    stock             the unpatched model: ``model(ids, use_cache=True, logits_to_keep=1)``
    fastv ρ           :func:`attnprune.prefill.prefill`, FastV cut at ``fastv_layer``
    gemfilter ρ       the same, GemFilter (layers < ``gemfilter_layer`` score, then all rerun)
    fastv 1.0         the pruning loop keeping everything: its own overhead

Timing: :func:`attnprune.measure.time_interleaved` (variants round-robin, warm-up discarded,
median and MAD of ``repeats`` rounds), ``clock`` "wall" (time to first token) or "cpu" (this
process's CPU time: on a shared, oversubscribed machine it leaves out the waits for a core;
meaningful with one thread). ``× stock`` is the stock median over the variant's median.
FLOPs with :func:`attnprune.measure.count_flops` (one run each; causal attention counted
whole), relative to stock. ``kept`` is the share of prompt tokens the pruned layers hold.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..config import parse_command_line, to_dict
from ..measure import count_flops, env_info, time_interleaved
from ..prefill import PrefillConfig, prefill
from ..results import ResultsDir


@dataclass(frozen=True)
class BenchPrefillConfig:
    """Options of the prefill benchmark."""

    lengths: tuple[int, ...] = (512, 1024, 2048)
    keeps: tuple[float, ...] = (0.25, 0.5, 0.75)
    methods: tuple[str, ...] = ("fastv", "gemfilter")
    fastv_layer: int = 2
    gemfilter_layer: int = 2
    window: int = 16
    sinks: int = 4
    batch: int = 1
    width: int = 256
    layers: int = 8
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 704
    vocab: int = 1000
    repeats: int = 7
    warmup: int = 1
    clock: str = "wall"
    threads: int = 1  # 0 = leave torch's default
    flops: bool = True
    seed: int = 0

    def __post_init__(self):
        for name in ("batch", "width", "layers", "heads", "kv_heads", "ffn", "vocab", "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.width % self.heads or self.heads % self.kv_heads:
            raise ValueError(f"heads: width {self.width} / heads {self.heads} / kv_heads "
                             f"{self.kv_heads} must divide evenly")
        if self.clock not in ("wall", "cpu"):
            raise ValueError(f"clock: 'wall' or 'cpu', got {self.clock!r}")
        if not self.lengths or min(self.lengths) < 1:
            raise ValueError(f"lengths: prompt lengths >= 1, got {self.lengths}")
        for m in self.methods:
            PrefillConfig(method=m)  # names the field if a method is unknown
        for k in self.keeps:
            PrefillConfig(keep=float(k))


def build_model(cfg: BenchPrefillConfig):
    """The randomly initialised Llama-shaped LM (eval, SDPA)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(cfg.seed)
    conf = LlamaConfig(vocab_size=cfg.vocab, hidden_size=cfg.width, intermediate_size=cfg.ffn,
                       num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads,
                       num_key_value_heads=cfg.kv_heads, max_position_embeddings=max(cfg.lengths) + 64,
                       attn_implementation="sdpa")
    return LlamaForCausalLM(conf).eval()


def variants(cfg: BenchPrefillConfig) -> dict[str, dict | None]:
    """Label → prefill options (None: the stock model)."""
    out: dict[str, dict | None] = {"stock": None}
    for m in cfg.methods:
        layer = cfg.fastv_layer if m == "fastv" else cfg.gemfilter_layer
        for k in cfg.keeps:
            out[f"{m} {k:g}"] = {"method": m, "keep": float(k), "layer": layer,
                                 "window": cfg.window, "sinks": cfg.sinks}
    out["fastv 1"] = {"method": "fastv", "keep": 1.0, "layer": cfg.fastv_layer,
                      "window": cfg.window, "sinks": cfg.sinks}
    return out


def bench_length(model, cfg: BenchPrefillConfig, L: int) -> list[dict]:
    """One row per variant at prompt length L."""
    ids = torch.randint(0, cfg.vocab, (cfg.batch, L), generator=torch.Generator().manual_seed(cfg.seed + L))
    mask = torch.ones_like(ids)
    fns, kept = {}, {}
    for label, opts in variants(cfg).items():
        if opts is None:
            def fn():
                with torch.inference_mode():
                    return model(ids, attention_mask=mask, use_cache=True, logits_to_keep=1).logits
        else:
            def fn(opts=opts):
                return prefill(model, ids, mask, **opts).logits
            kept[label] = float(prefill(model, ids, mask, **opts).kept.float().mean())
        fns[label] = fn
    clock = time.perf_counter if cfg.clock == "wall" else time.process_time
    timings = time_interleaved(fns, repeats=cfg.repeats, warmup=cfg.warmup, clock=clock)
    flops = {label: count_flops(fn) for label, fn in fns.items()} if cfg.flops else {}
    ref = timings["stock"].median_s
    rows = []
    for label, t in timings.items():
        rows.append({"length": L, "variant": label, "kept": kept.get(label, 1.0),
                     "median_ms": t.median_s * 1e3, "mad_ms": t.mad_s * 1e3,
                     "speedup": ref / t.median_s,
                     "flops_relative": flops[label] / flops["stock"] if flops else None,
                     "times_ms": [x * 1e3 for x in t.times_s]})
    return rows


def run(cfg: BenchPrefillConfig, progress=print) -> dict:
    """Every length and variant; the summary dict."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    model = build_model(cfg)
    rows = []
    for L in cfg.lengths:
        rows += bench_length(model, cfg, L)
        progress(format_table({"rows": [r for r in rows if r["length"] == L]}, header=L == cfg.lengths[0]))
    return {"command": "bench prefill", "env": {**env_info(), "clock": cfg.clock},
            "config": to_dict(cfg), "rows": rows}


def format_table(summary: dict, header: bool = True) -> str:
    """Plain-text table: one line per (length, variant)."""
    lines = [(f"{'L':>5} {'variant':<14} {'kept':>5} {'median ms':>10} {'MAD ms':>7} "
             f"{'× stock':>7} {'FLOPs rel':>9}")] if header else []
    for r in summary["rows"]:
        fl = "" if r["flops_relative"] is None else f"{r['flops_relative']:.3f}"
        lines.append(f"{r['length']:>5} {r['variant']:<14} {r['kept']:>5.2f} {r['median_ms']:>10.1f} "
                     f"{r['mad_ms']:>7.1f} {r['speedup']:>7.2f} {fl:>9}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """CLI entry: ``python -m attnprune.bench.prefill [--key value ...] --out DIR``."""
    cl = parse_command_line(argv, BenchPrefillConfig, default_out="results")
    out = ResultsDir.start(cl.out, "bench-prefill", cl.exact_out, cl.config)
    summary = run(cl.config)
    out.write_json("summary.json", summary)
    out.write_text("table.txt", format_table(summary) + "\n")
    print(f"threads={summary['env']['threads']} clock={cl.config.clock}; results: {out.path}")
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
