"""``attnprune bench flex``: can crisp's attention sparsity become wall-clock time on CPU?

The crisp paper leaves it open. A block-sparse kernel, PyTorch's FlexAttention with a
``BlockMask`` (compiled by Inductor; it runs on CPU), skips every (block × block) tile of the
score matrix that the mask empties, and nothing else. So two things decide the answer, and this
bench measures both:

**A. The kernel** (random q, k, v; B × H × L × d, default 1 × 12 × L × 32, MiniLM's heads):
for each length L (default 1024, 2048, 4096) one process times, interleaved
(:func:`attnprune.measure.time_interleaved`, median over ``rounds`` rounds of the within-round
ratio), against dense SDPA (``F.scaled_dot_product_attention``):

    flex_dense        FlexAttention with no mask: the kernel's own cost
    flex_tiles_<d>    FlexAttention with a fixed BlockMask computing a share d of the tiles
                      (the diagonal tiles plus random others): the break-even density
    crisp_eager       crisp as the library runs it: scores, top-k per row, softmax, AV
    crisp_flex        crisp through FlexAttention: the top-k needs the scores, so QKᵀ and the
                      top-k run first, then ``create_block_mask`` from the kept entries, then
                      the kernel (data-dependent masks cannot be known earlier)

**B. The masks crisp makes on real attention**: stock MiniLM-L6 on ``windows`` passages of
512 tokens (its maximum) from ``shakespeare.txt``; per layer and head the top-k mask of
``topk_row_mask`` at each sparsity s (the same entries crisp keeps: softmax is monotone per row)
and the share of tiles it leaves non-empty at each block size, and the kernel time at L = 512
with the real mask of every layer (window 0, all heads), mask given for free (a lower bound
for crisp through FlexAttention).

Everything is timed at ``threads`` threads. Nothing is estimated: the tile shares are counted
from the masks, the times measured.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from attnprune.attention import topk_row_mask
from attnprune.compat import dynamo_config_patch
from attnprune.measure import env_info, time_interleaved
from attnprune.runs.command import run_command, save_table
from attnprune.runs.config import to_dict


@dataclass(frozen=True)
class BenchFlexConfig:
    """Options of ``attnprune bench flex``."""

    lengths: tuple[int, ...] = (1024, 2048, 4096)
    batch: int = 1
    heads: int = 12
    head_dim: int = 32
    block: int = 128  # FlexAttention tile (query and key block size)
    densities: tuple[float, ...] = (0.5, 0.25, 0.1)  # shares of tiles computed (part A)
    sparsities: tuple[float, ...] = (0.8, 0.9)  # crisp s
    model: str = "minilm"  # part B: real attention ("none" skips it)
    windows: int = 4
    real_blocks: tuple[int, ...] = (32, 64, 128)
    repeats: int = 3
    warmup: int = 1
    rounds: int = 5
    threads: int = 1
    seed: int = 0

    def __post_init__(self):
        for name in ("batch", "heads", "head_dim", "block", "windows", "repeats", "rounds",
                     "threads"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: an integer >= 1, got {v!r}")
        if self.warmup < 0:
            raise ValueError(f"warmup: must be >= 0, got {self.warmup}")
        for L in self.lengths:
            if L < self.block or L % self.block:
                raise ValueError(f"lengths: each a multiple of block={self.block}, got {L}")
        for b in self.real_blocks:
            if b < 1 or 512 % b:
                raise ValueError(f"real_blocks: divisors of 512, got {b}")
        for d in self.densities:
            if not 0.0 < d < 1.0:
                raise ValueError(f"densities: shares in (0, 1), got {d}")
        for s in self.sparsities:
            if not 0.0 < s < 1.0:
                raise ValueError(f"sparsities: values in (0, 1), got {s}")
        if self.model not in ("minilm", "none"):
            raise ValueError(f"model: 'minilm' or 'none', got {self.model!r}")


def tile_density(keep: torch.Tensor, block: int) -> torch.Tensor:
    """Share of (block × block) tiles with at least one kept entry, per leading index:
    ``keep`` (..., L, L) bool → (...) float."""
    *lead, lq, lk = keep.shape
    t = keep.reshape(*lead, lq // block, block, lk // block, block).any(-1).any(-2)
    return t.float().mean((-1, -2))


def random_tiles(heads: int, n: int, density: float, gen: torch.Generator) -> torch.Tensor:
    """(heads, n, n) bool tile table: the diagonal plus random others, ≈ ``density`` of all."""
    extra = max(0, round(density * n * n) - n)
    table = torch.eye(n, dtype=torch.bool).expand(heads, n, n).clone()
    for h in range(heads):
        off = (~table[h]).flatten().nonzero().squeeze(1)
        table[h].view(-1)[off[torch.randperm(len(off), generator=gen)[:extra]]] = True
    return table


# every length, mask kind and "no mask" is one more compiled variant of flex_attention; past
# dynamo's default limit of 8 it would fall back to an unfused eager path and time that instead
_COMPILE = {"recompile_limit": 64, "fail_on_recompile_limit_hit": True}


def _flex():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    return torch.compile(flex_attention, dynamic=False), create_block_mask


def _tile_mask(table: torch.Tensor, L: int, block: int, create_block_mask):
    def mask_mod(b, h, q, kv):
        return table[h, q // block, kv // block]

    return create_block_mask(mask_mod, B=None, H=table.shape[0], Q_LEN=L, KV_LEN=L,
                             device="cpu", BLOCK_SIZE=block)


def _entry_mask(keep: torch.Tensor, block: int, create_block_mask):
    """BlockMask of an entry-level mask ``keep`` (B, H, L, L): empty tiles skipped, partial
    tiles masked entry by entry inside the kernel."""
    B, H, L, _ = keep.shape

    def mask_mod(b, h, q, kv):
        return keep[b, h, q, kv]

    return create_block_mask(mask_mod, B=B, H=H, Q_LEN=L, KV_LEN=L, device="cpu",
                             BLOCK_SIZE=block)


def crisp_eager(q, k, v, s: float):
    """Crisp as the library's eager path computes it (scores, top-k, softmax, AV)."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    keep = topk_row_mask(scores, s)
    return scores.masked_fill(~keep, float("-inf")).softmax(-1) @ v


def _ratios(cfg, fns: dict) -> dict:
    """Median over rounds of time(variant) / time(sdpa) within each round, and the medians."""
    per = {name: [] for name in fns}
    ratios = {name: [] for name in fns}
    for _ in range(cfg.rounds):
        t = time_interleaved(fns, repeats=cfg.repeats, warmup=cfg.warmup)
        for name in fns:
            per[name].append(t[name].median_s)
            ratios[name].append(t[name].median_s / t["sdpa"].median_s)
    return {name: {"median_ms": statistics.median(per[name]) * 1e3,
                   "ratio_vs_sdpa": statistics.median(ratios[name]),
                   "ratio_iqr": [float(np.percentile(ratios[name], 25)),
                                 float(np.percentile(ratios[name], 75))]} for name in fns}


@dynamo_config_patch(**_COMPILE)
def kernel_part(cfg: BenchFlexConfig, progress) -> list[dict]:
    """Part A: the kernel at every length (see the module docstring)."""
    flex, create_block_mask = _flex()
    gen = torch.Generator().manual_seed(cfg.seed)
    rows = []
    for L in cfg.lengths:
        q, k, v = (torch.randn(cfg.batch, cfg.heads, L, cfg.head_dim, generator=gen)
                   for _ in range(3))
        n = L // cfg.block
        fns = {"sdpa": lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v),
               "flex_dense": lambda q=q, k=k, v=v: flex(q, k, v)}
        density = {"sdpa": 1.0, "flex_dense": 1.0}
        errs = {}  # flex against the reference it replaces (SDPA; crisp's eager path)
        for d in cfg.densities:
            table = random_tiles(cfg.heads, n, d, gen)
            bm = _tile_mask(table, L, cfg.block, create_block_mask)
            name = f"flex_tiles_{d:g}"
            fns[name] = lambda q=q, k=k, v=v, bm=bm: flex(q, k, v, block_mask=bm)
            density[name] = float(table.float().mean())
        for s in cfg.sparsities:
            fns[f"crisp_eager_s{s:g}"] = lambda q=q, k=k, v=v, s=s: crisp_eager(q, k, v, s)

            def through_flex(q=q, k=k, v=v, s=s):
                scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
                keep = topk_row_mask(scores, s)
                return flex(q, k, v, block_mask=_entry_mask(keep, cfg.block, create_block_mask))

            fns[f"crisp_flex_s{s:g}"] = through_flex
            with torch.no_grad():
                errs[f"crisp_flex_s{s:g}"] = float((through_flex() - crisp_eager(q, k, v, s))
                                                   .abs().max())
            scores = q @ k.transpose(-1, -2)
            density[f"crisp_eager_s{s:g}"] = 1.0
            density[f"crisp_flex_s{s:g}"] = float(
                tile_density(topk_row_mask(scores, s), cfg.block).mean())
        with torch.no_grad():
            errs["flex_dense"] = float((flex(q, k, v) - F.scaled_dot_product_attention(q, k, v))
                                       .abs().max())
            t = _ratios(cfg, fns)
        for name, r in t.items():
            rows.append({"part": "kernel", "length": L, "variant": name,
                         "tile_density": density[name], **r,
                         **({"max_abs_err": errs[name]} if name in errs else {})})
        progress(f"L={L}: " + ", ".join(f"{n} {r['ratio_vs_sdpa']:.2f}" for n, r in t.items()))
    return rows


def real_attention(cfg: BenchFlexConfig) -> torch.Tensor:
    """Stock MiniLM-L6's attention probabilities on ``windows`` 512-token passages of
    shakespeare.txt: (windows, layers, heads, 512, 512)."""
    from attnprune.research.data.text import shared_data_dir
    from attnprune.research.finetune import load_model

    model, tok = load_model(cfg.model, 2)
    model.set_attn_implementation("eager")
    model.eval()
    ids = tok((shared_data_dir() / "shakespeare.txt").read_text(encoding="utf-8"),
              add_special_tokens=False, verbose=False)["input_ids"]
    out = []
    for w in range(cfg.windows):
        start = w * 10 * 510  # passages 5,100 tokens apart
        x = torch.tensor([[tok.cls_token_id, *ids[start:start + 510], tok.sep_token_id]])
        with torch.no_grad():
            att = model(input_ids=x, output_attentions=True).attentions
        out.append(torch.cat(att))  # (layers, heads, 512, 512)
    return torch.stack(out)


@dynamo_config_patch(**_COMPILE)
def real_part(cfg: BenchFlexConfig, progress) -> tuple[list[dict], list[dict]]:
    """Part B: tile densities of crisp's masks on real attention, and the kernel at L = 512
    with those masks (window 0, every layer)."""
    probs = real_attention(cfg)
    _, n_layers, H, L, _ = probs.shape
    dens_rows = []
    keeps = {}
    for s in cfg.sparsities:
        keep = topk_row_mask(probs.log(), s)  # the entries crisp keeps (softmax is monotone)
        keeps[s] = keep
        for b in cfg.real_blocks:
            d = tile_density(keep, b)  # (W, layers, heads)
            dens_rows.append({"part": "real", "sparsity": s, "block": b,
                              "tile_density_mean": float(d.mean()),
                              "tile_density_min": float(d.min()),
                              "tile_density_by_layer": d.mean((0, 2)).tolist(),
                              "entry_density": float(keep.float().mean())})
            progress(f"real masks s={s:g} block {b}: tiles computed {float(d.mean()):.3f}")
    flex, create_block_mask = _flex()
    gen = torch.Generator().manual_seed(cfg.seed)
    q, k, v = (torch.randn(1, H, L, cfg.head_dim, generator=gen) for _ in range(3))
    block = min(cfg.block, L)
    fns = {"sdpa": lambda: F.scaled_dot_product_attention(q, k, v), "flex_dense": lambda: flex(q, k, v)}
    density = {"sdpa": 1.0, "flex_dense": 1.0}
    for s in cfg.sparsities:
        for layer in range(n_layers):
            keep = keeps[s][0, layer].unsqueeze(0)  # (1, H, L, L)
            bm = _entry_mask(keep, block, create_block_mask)
            name = f"crisp_mask_s{s:g}_layer{layer + 1}"
            fns[name] = lambda bm=bm: flex(q, k, v, block_mask=bm)
            density[name] = float(tile_density(keep, block).mean())
    with torch.no_grad():
        t = _ratios(cfg, fns)
    time_rows = [{"part": "real_kernel", "length": L, "variant": name,
                  "tile_density": density[name], **r} for name, r in t.items()]
    return dens_rows, time_rows


def run(cfg: BenchFlexConfig, progress=print) -> dict:
    import warnings

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    with warnings.catch_warnings():  # an unfused fallback would time the wrong kernel: fail
        warnings.filterwarnings("error", message="flex_attention called without torch.compile")
        kernel = kernel_part(cfg, progress)
        dens, real_kernel = ([], []) if cfg.model == "none" else real_part(cfg, progress)
    return {"command": "bench flex", "env": env_info(), "config": to_dict(cfg),
            "kernel": kernel, "real_masks": dens, "real_kernel": real_kernel}


def format_table(summary: dict) -> str:
    cfg = summary["config"]
    lines = [(f"A. Kernel time relative to dense SDPA (B={cfg['batch']}, H={cfg['heads']}, "
              f"d={cfg['head_dim']}, tile {cfg['block']}, {cfg['threads']} thread(s); median "
              f"over {cfg['rounds']} interleaved rounds [IQR])"), "",
             "| L | variant | tiles computed | ms | time / SDPA [IQR] |", "|---|---|---|---|---|"]
    for r in summary["kernel"] + summary["real_kernel"]:
        lines.append(f"| {r['length']} | {r['variant']} | {r['tile_density']:.3f} | "
                     f"{r['median_ms']:.2f} | {r['ratio_vs_sdpa']:.3f} "
                     f"[{r['ratio_iqr'][0]:.3f}, {r['ratio_iqr'][1]:.3f}] |")
    if summary["real_masks"]:
        lines += ["", (f"B. Crisp's masks on stock MiniLM-L6 attention ({cfg['windows']} "
                       f"passages × 512 tokens of shakespeare.txt, all layers and heads)"), "",
                  "| s | tile | entries kept | tiles computed (mean) | min | by layer |",
                  "|---|---|---|---|---|---|"]
        for r in summary["real_masks"]:
            lines.append(f"| {r['sparsity']:g} | {r['block']} | {r['entry_density']:.3f} | "
                         f"{r['tile_density_mean']:.3f} | {r['tile_density_min']:.3f} | "
                         + ", ".join(f"{x:.2f}" for x in r["tile_density_by_layer"]) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """CLI entry: ``attnprune bench flex [--key value ...] --out DIR``."""
    return run_command(argv, BenchFlexConfig, "bench-flex",
                       lambda cfg, out: save_table(out, run(cfg), format_table))