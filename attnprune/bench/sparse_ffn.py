"""``attnprune bench sparse-ffn``: break-even of the sparse FFN second projection
(``attnprune.deploy.sparse_ffn``): sparsity → time and counted FLOPs, per block size."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnprune.deploy.sparse_ffn import SparseFFNOutput


@dataclass(frozen=True)
class BenchConfig:
    """Break-even benchmark of the sparse second projection (``--key value`` options)."""

    d_model: int = 384  # MiniLM-L6
    d_ff: int = 1536
    rows: int = 2048  # B·T = 32 · 64, the tweets batches
    blocks: tuple[int, ...] = (64, 256, 2048)
    sparsities: tuple[float, ...] = (0.0, 0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
    patterns: tuple[str, ...] = ("units", "tokens")
    repeats: int = 15
    threads: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("d_model", "d_ff", "rows", "repeats", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if not self.blocks or min(self.blocks) < 1:
            raise ValueError(f"blocks: give integers >= 1, got {self.blocks}")
        for v in self.sparsities:
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"sparsities: every value must be in [0, 1], got {v}")
        for p in self.patterns:
            if p not in PATTERNS:
                raise ValueError(f"patterns: each one of {PATTERNS}, got {p!r}")


PATTERNS = ("units", "tokens")


def synthetic_activation(rows: int, d_ff: int, sparsity: float, pattern: str,
                         generator: torch.Generator) -> Tensor:
    """(rows, d_ff) GELU-like activations: the share ``sparsity`` in (−0.17, 0] (GELU of a
    z ≤ 0, which ``mode="relu"`` drops), the rest in (0.1, 1.1).

    ``units``: the same units are off in every row (dead neurons: block sparsity = token
    sparsity); ``tokens``: every entry independently (a block of b rows keeps a unit with
    probability 1 − s^b: the worst case for blocks)."""
    a = torch.rand(rows, d_ff, generator=generator) + 0.1
    if pattern == "units":
        off = torch.zeros(rows, d_ff, dtype=torch.bool)
        off[:, torch.randperm(d_ff, generator=generator)[: round(sparsity * d_ff)]] = True
    elif pattern == "tokens":
        off = torch.rand(rows, d_ff, generator=generator) < sparsity
    else:
        raise ValueError(f"patterns: each one of {PATTERNS}, got {pattern!r}")
    return torch.where(off, -0.17 * torch.rand(rows, d_ff, generator=generator), a)


def bench(cfg: BenchConfig) -> list[dict]:
    """Per (pattern, sparsity, block): time ratio (sparse / dense second projection, medians of
    interleaved repeats) and counted FLOPs ratio, with ``max_active = 1`` so that the sparse
    path runs at every sparsity (the curve that picks the break-even ``max_active``). The
    dense reference is the stock ``nn.Linear`` on the same activations (GELU's small negative
    values included: that is what the dense model computes)."""
    from attnprune.measure import count_flops, time_interleaved

    torch.set_num_threads(cfg.threads)
    g = torch.Generator().manual_seed(cfg.seed)
    lin = nn.Linear(cfg.d_ff, cfg.d_model)
    rows = []
    with torch.no_grad():
        for pattern in cfg.patterns:
            for s in cfg.sparsities:
                a = synthetic_activation(cfg.rows, cfg.d_ff, s, pattern, g)
                dense_flops = count_flops(lin, a)
                wraps = {b: SparseFFNOutput(lin, 0.0, "relu", b, 1.0) for b in cfg.blocks}
                # max_active = 0: every block takes the dense path — the price of looking
                falls = {b: SparseFFNOutput(lin, 0.0, "relu", b, 0.0) for b in cfg.blocks}
                fns = {"dense": lambda a=a: lin(a)}
                fns.update({f"block{b}": (lambda w=w, a=a: w(a)) for b, w in wraps.items()})
                fns.update({f"fallback{b}": (lambda w=w, a=a: w(a)) for b, w in falls.items()})
                t = time_interleaved(fns, repeats=cfg.repeats, warmup=2)
                for b, w in wraps.items():
                    w.units_used = w.units_total = 0
                    fl = count_flops(w, a)
                    rows.append({"pattern": pattern, "block": b, "sparsity": s,
                                 "block_sparsity": 1 - w.units_used / w.units_total,
                                 "flops_ratio": fl / dense_flops,
                                 "time_ratio": t[f"block{b}"].median_s / t["dense"].median_s,
                                 "fallback_ratio": (t[f"fallback{b}"].median_s
                                                    / t["dense"].median_s),
                                 "dense_ms": t["dense"].median_s * 1e3})
    return rows


def format_bench(rows: list[dict], cfg: BenchConfig) -> str:
    """Markdown table of :func:`bench` rows."""
    lines = [(f"second FFN projection, N = {cfg.rows} rows, d_ff = {cfg.d_ff} → d = {cfg.d_model}, "
              f"{cfg.threads} thread(s), {cfg.repeats} interleaved repeats (medians)"), "",
             ("time ratio: sparse path on every block; dense-path ratio: every block forced "
              "dense (max_active = 0), the overhead of looking"), "",
             ("| pattern | block | token sparsity | block sparsity | FLOPs ratio | time ratio | "
              "dense-path ratio | dense ms |"), "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['pattern']} | {r['block']} | {r['sparsity']:.2f} | "
                     f"{r['block_sparsity']:.3f} | {r['flops_ratio']:.3f} | "
                     f"{r['time_ratio']:.3f} | {r['fallback_ratio']:.3f} | "
                     f"{r['dense_ms']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    """``attnprune bench sparse-ffn [--key value ...] --out DIR``: print the break-even curve;
    ``summary.json`` and ``table.md`` in the results folder."""
    from attnprune.measure import env_info
    from attnprune.runs.command import run_command, save_table
    from attnprune.runs.config import to_dict

    def body(cfg, out) -> str:
        summary = {"command": "bench sparse-ffn", "env": env_info(), "config": to_dict(cfg),
                   "rows": bench(cfg)}
        return save_table(out, summary, lambda s: format_bench(s["rows"], cfg).rstrip("\n"))

    return run_command(argv, BenchConfig, "bench-sparse-ffn", body)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
