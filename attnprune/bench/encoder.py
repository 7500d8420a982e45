"""``attnprune bench encoder``: the full encoder vs each token method, side by side in one process.

For every batch size B and length L, the stock model and each (method, ρ) run on the same
batch of real text (no padding: dropping padding is not a saving). Per configuration:

* FLOPs measured by ``count_flops`` (FlopCounterMode + the CPU SDPA fix) and their ratio;
* wall time by ``time_fn``: the full and the pruned forward alternate, one call each per round,
  so both see the same load on a shared machine; time ratio = median pruned / median full of
  those rounds (``pairwise_ratio``: the median of the per-round ratios); ``full_drift`` = the
  full model's median in the last configuration / the first;
* scorer overhead = time spent in the scorer (attention rows + the method's scoring and
  top-k, timed inside the host) / median pruned forward time;
* peak memory (``measure.peak_memory``, a rough CPU figure);
* the kept ratio the host reports.

LTP is untrained here; its thresholds θ_l are set to the (1 − ρ) quantile of the importance Ĩ
on the bench batch, so it prunes about as much as the top-k methods (it keeps a variable
number per example). A figure shows time and FLOPs vs length at ρ = 0.5 (or the middle ρ).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import torch

from attnprune import api
from attnprune.measure import count_flops, env_info, peak_memory, time_fn
from attnprune.runs.command import run_command
from attnprune.runs.results import ResultsDir
from attnprune.selection import check_keep_ratio

__all__ = ["BenchEncoderConfig", "bench_config", "main"]


@dataclass(frozen=True)
class BenchEncoderConfig:
    """Settings of ``attnprune bench encoder``."""

    model: str = "minilm"
    methods: tuple[str, ...] = ("random", "attention_mass", "entropy", "ltp")
    keep_ratios: tuple[float, ...] = (0.3, 0.5, 0.75)
    batch_sizes: tuple[int, ...] = (1, 32)
    lengths: tuple[int, ...] = (64, 128, 512)
    after_layer: int = 1
    schedule: str = "single"
    repeats: int = 5  # at least; more when one forward is shorter than min_time_s / repeats
    min_time_s: float = 2.0
    warmup: int = 0  # the FLOPs-counting forward before the timed repeats already warms up
    threads: int | None = None
    scorer_queries: int = 0  # > 0: attention received estimated from that many query rows
    quick: bool = False  # B ∈ {1, 8}, L ∈ {64, 128}, ρ = 0.5, 3 repeats: a smoke run

    def __post_init__(self) -> None:
        from attnprune.methods import registry
        for m in self.methods:
            if registry.get(m).kind != "token":
                raise ValueError(f"methods: {m!r} is not a token method")
        for i, r in enumerate(self.keep_ratios):
            check_keep_ratio(r, f"keep_ratios[{i}]")
        for name in ("batch_sizes", "lengths"):
            if not getattr(self, name) or min(getattr(self, name)) < 1:
                raise ValueError(f"{name}: give positive integers, got {getattr(self, name)}")
        if max(self.lengths) > 512:
            raise ValueError(f"lengths: BERT-family position tables stop at 512, got {max(self.lengths)}")
        for name in ("repeats", "after_layer"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        if self.min_time_s < 0:
            raise ValueError(f"min_time_s must be ≥ 0, got {self.min_time_s}")
        if self.warmup < 0:
            raise ValueError(f"warmup must be ≥ 0, got {self.warmup}")


def bench_config(cfg: BenchEncoderConfig) -> BenchEncoderConfig:
    """The configuration actually run (``quick`` shrinks the grid)."""
    if not cfg.quick:
        return cfg
    return dataclasses.replace(cfg, batch_sizes=(1, 8), lengths=(64, 128), keep_ratios=(0.5,),
                               repeats=3, quick=False)


def _text_ids(tokenizer, B: int, L: int, vocab: int) -> torch.Tensor:
    """(B, L) token ids of real text: windows of Shakespeare (shared data), CLS first, no
    padding; random ids if the file is missing."""
    from attnprune.research.data.text import shared_data_dir

    path = shared_data_dir() / "shakespeare.txt"
    need = B * (L - 1)
    if tokenizer is not None and path.is_file():
        text = path.read_text(encoding="utf-8", errors="replace")[: need * 8]
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) >= need:
            body = torch.tensor(ids[:need]).view(B, L - 1)
            cls = torch.full((B, 1), tokenizer.cls_token_id or 0)
            return torch.cat([cls, body], 1)
    g = torch.Generator().manual_seed(0)
    return torch.randint(1000, vocab, (B, L), generator=g)


def _load(model: str):
    from transformers import AutoModel, AutoTokenizer

    from attnprune.research.finetune import resolve_model_path

    path = resolve_model_path(model)
    m = AutoModel.from_pretrained(path).eval()
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError):
        tok = None
    return m, tok


def _calibrate_ltp(model, inputs, rho: float, after_layer: int, schedule: str,
                   scorer_queries: int = 0) -> float:
    """θ = (1 − ρ)-quantile of the importance Ĩ at the first pruning layer on this batch."""
    api.patch(model, "ltp", keep_ratio=rho, after_layer=after_layer, schedule=schedule,
              init_threshold=-1e9, scorer_queries=scorer_queries)
    state = api.patch_state(model)
    seen = []
    fwd = state.modules.forward

    def spy(hidden, mask, attn=None, **kw):
        seen.append(state.modules.importance(attn, mask)[mask])
        return fwd(hidden, mask, attn=attn, **kw)

    state.modules.forward = spy
    with torch.no_grad():
        model(**inputs)
    api.unpatch(model)
    return float(torch.quantile(seen[0].float(), 1 - rho))


def _interleaved(fn_full, fn_pruned, reps: int) -> tuple[list[float], list[float]]:
    """Time the full and the pruned forward alternately (one ``time_fn`` call each per round):
    on a shared machine both see the same load, so their ratio is not skewed by drift."""
    tf, tp = [], []
    for _ in range(reps):
        tf.append(time_fn(fn_full, repeats=1, warmup=0).median_s)
        tp.append(time_fn(fn_pruned, repeats=1, warmup=0).median_s)
    return tf, tp


def bench_one(model, tokenizer, cfg: BenchEncoderConfig, B: int, L: int) -> list[dict]:
    """All methods × ρ on one (B, L) batch; each timed interleaved with the full model."""
    ids = _text_ids(tokenizer, B, L, model.config.vocab_size)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    def fwd():
        with torch.no_grad():
            return model(**inputs)

    api.unpatch(model)
    counted = {}
    full_mem = peak_memory(lambda: counted.update(n=count_flops(fwd)))
    full_flops = counted["n"]
    # Cheap configurations (batch 1) get more repeats, so each median covers ≥ min_time_s of
    # forwards and one preemption on a shared machine cannot decide it.
    probe = time_fn(fwd, repeats=1, warmup=0).median_s
    reps = int(min(200, max(cfg.repeats, math.ceil(cfg.min_time_s / max(probe, 1e-6)))))
    rows = []
    for method in cfg.methods:
        for rho in cfg.keep_ratios:
            opts = {}
            if method == "ltp":
                opts["init_threshold"] = _calibrate_ltp(model, inputs, rho, cfg.after_layer,
                                                        cfg.schedule, cfg.scorer_queries)
            api.patch(model, method, keep_ratio=rho, after_layer=cfg.after_layer,
                      schedule=cfg.schedule, scorer_queries=cfg.scorer_queries, **opts)
            state = api.patch_state(model)
            # One forward counts FLOPs and peak memory (and warms up); then the timed rounds.
            counted = {}
            mem = peak_memory(lambda counted=counted: counted.update(n=count_flops(fwd)))
            flops = counted["n"]
            kept = state.stats["kept_ratio"]
            sel_times = []

            def pruned(state=state, sel_times=sel_times):
                fwd()
                sel_times.append(state.stats["select_time_s"])

            def full(state=state):
                state.enabled = False  # the stock encoder loop, same weights and batch
                try:
                    fwd()
                finally:
                    state.enabled = True

            for _ in range(cfg.warmup):
                full()
                pruned()
            sel_times.clear()
            tf, tp = _interleaved(full, pruned, reps)
            med_p, med_f = float(np.median(tp)), float(np.median(tf))
            rows.append({"method": method, "keep_ratio": rho, "batch": B, "length": L,
                         "kept_ratio": kept, "flops": flops,
                         "median_s": med_p, "mad_s": float(np.median(np.abs(np.array(tp) - med_p))),
                         "full_median_s": med_f,
                         "full_mad_s": float(np.median(np.abs(np.array(tf) - med_f))),
                         "time_ratio": med_p / med_f,
                         "pairwise_ratio": float(np.median(np.array(tp) / np.array(tf))),
                         "select_s": float(np.median(sel_times)),
                         "scorer_overhead": float(np.median(sel_times)) / med_p,
                         "peak_bytes": mem, "threads": torch.get_num_threads(), "repeats": reps})
            api.unpatch(model)
    for r in rows:
        r["flops_ratio"] = r["flops"] / full_flops
        r["time_over_flops"] = r["time_ratio"] / r["flops_ratio"]
        r["full_drift"] = rows[-1]["full_median_s"] / rows[0]["full_median_s"]
        r["full_flops"] = full_flops
        r["memory_ratio"] = r["peak_bytes"] / full_mem if full_mem else None
    return rows


def _figure(rows: list[dict], cfg: BenchEncoderConfig, results: ResultsDir) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    B = max(cfg.batch_sizes)
    rho = sorted(cfg.keep_ratios)[len(cfg.keep_ratios) // 2]
    sub = [r for r in rows if r["batch"] == B]
    if not sub:
        return
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    Ls = sorted({r["length"] for r in sub})
    full = {r["length"]: r for r in sub}
    a1.plot(Ls, [full[L]["full_median_s"] for L in Ls], "k-o", label="full")
    a2.plot(Ls, [full[L]["full_flops"] / 1e9 for L in Ls], "k-o", label="full")
    for m in cfg.methods:
        pts = sorted((r["length"], r) for r in sub if r["method"] == m and r["keep_ratio"] == rho)
        if pts:
            a1.plot([p[0] for p in pts], [p[1]["median_s"] for p in pts], "-o", label=f"{m} ρ={rho}")
            a2.plot([p[0] for p in pts], [p[1]["flops"] / 1e9 for p in pts], "-o", label=f"{m} ρ={rho}")
    for ax, yl in ((a1, "median forward time (s)"), (a2, "measured GFLOPs")):
        ax.set_xlabel("sequence length L")
        ax.set_ylabel(yl)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{cfg.model}, batch {B}, pruning after layer {cfg.after_layer}")
    results.save_figure("time_flops_vs_length.png", fig)


def run(cfg: BenchEncoderConfig, results: ResultsDir) -> dict:
    """Every (B, L) configuration (finished ones are skipped on rerun); summary + figure."""
    from tqdm.auto import tqdm

    cfg = bench_config(cfg)
    model, tok = _load(cfg.model)
    grid = [(B, L) for B in cfg.batch_sizes for L in cfg.lengths]
    for B, L in tqdm(grid, desc="bench encoder"):
        key = f"B{B}_L{L}"
        if results.run_done(key):
            continue
        results.save_run(key, {"rows": bench_one(model, tok, cfg, B, L)})
    rows = [r for B, L in grid for r in results.load_run(f"B{B}_L{L}")["rows"]]
    methods = {}
    for r in rows:
        label = f"{r['method']}@{r['keep_ratio']:g} B{r['batch']} L{r['length']}"
        methods[label] = {
            "kept_ratio": r["kept_ratio"],
            "flops": {"measured": r["flops"], "relative": r["flops_ratio"]},
            "time": {"median_s": r["median_s"], "mad_s": r["mad_s"], "relative": r["time_ratio"]},
            "time_over_flops": r["time_over_flops"], "scorer_overhead": r["scorer_overhead"],
            "peak_bytes": r["peak_bytes"],
        }
    summary = {"command": "bench encoder", "env": env_info(), "model": cfg.model,
               "after_layer": cfg.after_layer, "methods": methods, "comparisons": []}
    results.write_json("summary.json", summary)
    results.write_csv("metrics.csv", rows)
    _figure(rows, cfg, results)
    return summary


def main(argv: list[str]) -> int:
    """``attnprune bench encoder [--quick] [--key value ...] --out DIR``."""

    def threads(cfg: BenchEncoderConfig) -> None:
        if cfg.threads:
            torch.set_num_threads(cfg.threads)

    def body(cfg: BenchEncoderConfig, results: ResultsDir, _: None) -> str:
        run(cfg, results)
        return "\n".join(line for _, line in summary_rows(results.read_json("summary.json")))

    return run_command(argv, BenchEncoderConfig, "bench-encoder", body, prepare=threads,
                       end_with_folder=False)


def summary_rows(summary: dict):
    """(label, printable line) for every row of a bench summary."""
    for label, e in summary["methods"].items():
        yield label, (f"{label:<32} kept {e['kept_ratio']:.3f}  FLOPs {e['flops']['relative']:.3f}  "
                      f"time {e['time']['relative']:.3f}  time/FLOPs {e['time_over_flops']:.3f}  "
                      f"scorer {100 * e['scorer_overhead']:.1f} %")


if __name__ == "__main__":  # pragma: no cover
    import sys

    sys.exit(main(sys.argv[1:]))
