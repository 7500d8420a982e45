"""``attnprune bench attention``: speed of attention-level methods against the dense model.

A GPT-2-style causal forward (``GPT2Model``, randomly initialised; defaults B = 8, T = 256,
width 384, 6 heads, 6 layers: the modulation paper's model) timed in one process:

    dense             stock SDPA
    intensity_sdpa    intensity modulation through SDPA by scaling Q (target ≥ 0.95× tokens/s)
    intensity_eager   the same modulation computed literally (scores, ⊙ I, softmax)
    crisp             top-k attention at ``crisp_sparsity`` (eager: it needs the scores)

Timing: ``attnprune.measure.time_fn`` (warm-up discarded, median and MAD); the variants are
timed in ``rounds`` short interleaved rounds and each ratio is the median over rounds of the
ratio measured within a round (its interquartile range beside it), so the drifting load of a
shared machine hits both sides of a ratio alike. FLOPs
with ``count_flops`` (the predictor's small MLP is included; the counter does not halve causal
attention). The transformer body is timed without the LM head, whose cost depends only on the
vocabulary and would dilute every ratio.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from attnprune.api import patch, unpatch
from attnprune.measure import count_flops, env_info, time_fn
from attnprune.runs.command import run_command, save_table
from attnprune.runs.config import to_dict

TARGET_RATIO = 0.95  # issue 4: modulation through SDPA keeps ≥ 95 % of the dense tokens/s


@dataclass(frozen=True)
class BenchAttentionConfig:
    """Options of ``attnprune bench attention``."""

    batch: int = 8
    seq_len: int = 256
    width: int = 384
    heads: int = 6
    layers: int = 6
    preset: str = "multihead"
    crisp_sparsity: float = 0.8
    repeats: int = 3
    warmup: int = 1
    rounds: int = 15  # many short interleaved rounds: a shared machine's load drifts by seconds
    threads: int = 0  # 0 = leave torch's default
    seed: int = 0

    def __post_init__(self):
        for name in ("batch", "seq_len", "width", "heads", "layers", "repeats", "rounds"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.width % self.heads:
            raise ValueError(f"width: {self.width} is not divisible by heads={self.heads}")
        if not 0.0 <= self.crisp_sparsity < 1.0:
            raise ValueError(f"crisp_sparsity: must be in [0, 1), got {self.crisp_sparsity}")
        if self.warmup < 0 or self.threads < 0:
            raise ValueError("warmup, threads: must be >= 0")


VARIANTS = {
    "dense": None,
    "intensity_sdpa": ("intensity", {"path": "sdpa"}),
    "intensity_eager": ("intensity", {"path": "eager"}),
    "crisp": ("crisp", {}),
}


def build_model(cfg: BenchAttentionConfig):
    """The randomly initialised GPT-2-style body (eval mode, SDPA)."""
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(cfg.seed)
    config = GPT2Config(vocab_size=256, n_positions=max(cfg.seq_len, 256), n_embd=cfg.width,
                        n_layer=cfg.layers, n_head=cfg.heads, attn_implementation="sdpa")
    return GPT2Model(config).eval()


def _apply(model, variant: str, cfg: BenchAttentionConfig) -> None:
    unpatch(model)
    spec = VARIANTS[variant]
    if spec is None:
        return
    method, opts = spec
    if method == "intensity":
        opts = dict(opts, preset=cfg.preset)
    else:
        opts = dict(opts, sparsity=cfg.crisp_sparsity)
    patch(model, method, **opts)
    model.eval()


def run(cfg: BenchAttentionConfig) -> dict:
    """Time and count every variant; return the summary dict (methods + ratios)."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    model = build_model(cfg)
    ids = torch.randint(0, 256, (cfg.batch, cfg.seq_len))
    tokens = cfg.batch * cfg.seq_len

    def forward():
        with torch.inference_mode():
            return model(input_ids=ids).last_hidden_state

    flops, timings = {}, {v: [] for v in VARIANTS}
    for v in VARIANTS:
        _apply(model, v, cfg)
        flops[v] = count_flops(forward)
    for _ in tqdm(range(cfg.rounds), desc="rounds", leave=False):
        for v in VARIANTS:
            _apply(model, v, cfg)
            timings[v].append(time_fn(forward, repeats=cfg.repeats, warmup=cfg.warmup))
    unpatch(model)

    methods = {}
    for v in VARIANTS:
        ratios = [timings["dense"][r].median_s / timings[v][r].median_s for r in range(cfg.rounds)]
        med = statistics.median(t.median_s for t in timings[v])
        methods[v] = {
            "time": {"median_s": med,
                     "mad_s": statistics.median(t.mad_s for t in timings[v]),
                     "relative": 1.0 / statistics.median(ratios),
                     "per_round_median_s": [t.median_s for t in timings[v]]},
            "tokens_per_s": tokens / med,
            "tokens_per_s_ratio": statistics.median(ratios),
            "tokens_per_s_ratio_per_round": ratios,
            "tokens_per_s_ratio_iqr": [float(q) for q in np.quantile(ratios, [0.25, 0.75])],
            "flops": {"measured": flops[v], "relative": flops[v] / flops["dense"]},
        }
    ratio = methods["intensity_sdpa"]["tokens_per_s_ratio"]
    return {
        "command": "bench attention",
        "env": env_info(),
        "config": to_dict(cfg),
        "methods": methods,
        "comparisons": [],
        "target": {"intensity_sdpa_tokens_per_s_ratio": ratio, "threshold": TARGET_RATIO,
                   "met": bool(ratio >= TARGET_RATIO)},
    }


def format_table(summary: dict) -> str:
    """Plain-text table of the summary."""
    rows = [(f"{'variant':<16} {'median ms':>10} {'MAD ms':>8} {'tokens/s':>10} "
            f"{'× dense tok/s':>13} {'IQR over rounds':>16} {'FLOPs rel':>9}")]
    for v, m in summary["methods"].items():
        rows.append(f"{v:<16} {m['time']['median_s'] * 1e3:>10.2f} {m['time']['mad_s'] * 1e3:>8.2f} "
                    f"{m['tokens_per_s']:>10.0f} {m['tokens_per_s_ratio']:>13.3f} "
                    f"{'[{:.3f}, {:.3f}]'.format(*m['tokens_per_s_ratio_iqr']):>16} "
                    f"{m['flops']['relative']:>9.4f}")
    t = summary["target"]
    rows.append(f"intensity through SDPA: {t['intensity_sdpa_tokens_per_s_ratio']:.3f}× dense "
                f"tokens/s (target ≥ {t['threshold']}: {'met' if t['met'] else 'MISSED'}); "
                f"threads={summary['env']['threads']}")
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    """CLI entry: ``attnprune bench attention [--key value ...] --out DIR``."""
    return run_command(argv, BenchAttentionConfig, "bench-attention",
                       lambda cfg, out: save_table(out, run(cfg), format_table, "table.txt"))