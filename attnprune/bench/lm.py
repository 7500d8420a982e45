"""``attnprune bench lm``: speed and FLOPs of causal-LM token pruning, full vs pruned, one process.

    attnprune bench lm --run runs/lm-…  [--lengths 64,128] [--batch-size 8] [--windows 64]
                       [--bucket-rows false] --out bench/

Loads a finished ``attnprune lm`` run (its ``config.yaml`` and ``model.safetensors``), and for
each sequence length times the forward pass with pruning on and off on the same batches of
validation text (``windows`` evenly spaced windows in batches of ``batch_size``; default one
batch) (:func:`attnprune.measure.time_fn`: warm-up discarded, median and MAD), counts
FLOPs of both (:func:`attnprune.measure.count_flops`), and measures generation throughput
(tokens/s, ``gen_tokens`` new tokens, temperature 0.8, KV cache on). Prints the table and
writes ``summary.json`` / ``bench.csv``. Ratios are measured in one process; wall times on a
shared machine are noisy, FLOPs are not.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from attnprune import api
from attnprune.measure import count_flops, effective_flops, env_info
from attnprune.research.data.lm_text import eval_windows, load_lm_text
from attnprune.research.lm_config import LMConfig
from attnprune.research.lm_eval import evaluate, generate, layer_flops, paired_timing, set_enabled
from attnprune.research.lm_model import build_model, load_weights
from attnprune.runs.config import parse_command_line
from attnprune.runs.results import ResultsDir, make_run_dir

__all__ = ["BenchLMConfig", "bench_lm", "main"]


@dataclass(frozen=True)
class BenchLMConfig:
    """Settings of ``attnprune bench lm``."""

    run: str = ""  # results folder of ``attnprune lm`` (config.yaml + model.safetensors)
    lengths: tuple[int, ...] = ()  # default: the run's context
    batch_size: int = 8
    windows: int = 0  # validation windows measured, in batches of batch_size (0 = one batch)
    bucket_rows: bool = True  # the causal host's row bucketing at inference (False: pad to max)
    repeats: int = 10
    warmup: int = 2
    gen_tokens: int = 500
    temperature: float = 0.8
    threads: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.run:
            raise ValueError("run: give the results folder of an `attnprune lm` run (--run DIR)")
        p = Path(self.run)
        for f in ("config.yaml", "model.safetensors"):
            if not (p / f).is_file():
                raise ValueError(f"run: {p / f} not found (is it a finished `attnprune lm` run?)")
        for name in ("batch_size", "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        if self.warmup < 0 or self.gen_tokens < 0 or self.threads < 0 or self.windows < 0:
            raise ValueError("warmup, gen_tokens, threads and windows must be ≥ 0")
        if self.temperature < 0:
            raise ValueError(f"temperature must be ≥ 0, got {self.temperature}")


def load_run(run: str | Path):
    """(model, data, LMConfig) of a finished ``attnprune lm`` run, patched with its method."""
    raw = yaml.safe_load((Path(run) / "config.yaml").read_text())
    raw["init"] = ""  # the run's own weights are loaded below
    raw["lengths"] = tuple(raw.get("lengths") or ())
    cfg = LMConfig(**raw)
    data = load_lm_text(cfg.data, cfg.tokenizer)
    model = build_model(cfg, data.vocab_size)
    if cfg.method != "none":
        api.patch(model, cfg.method, **cfg.options)
    load_weights(model, Path(run) / "model.safetensors")
    model.eval()
    return model, data, cfg


def bench_lm(cfg: BenchLMConfig, out: Path, exact: bool = False) -> Path:
    """Run the benchmark; returns the results folder."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    model, data, lm_cfg = load_run(cfg.run)
    st = api.patch_state(model)
    if st is not None and hasattr(st, "bucket_rows"):
        st.bucket_rows = cfg.bucket_rows
    rd = ResultsDir(make_run_dir(out, "bench lm", exact))
    rd.write_text("config.yaml", yaml.safe_dump({**cfg.__dict__, "lengths": list(cfg.lengths)}))
    rows = []
    for T in cfg.lengths or (lm_cfg.context,):
        x, y = eval_windows(data.val, cfg.windows or cfg.batch_size, T)
        ev = evaluate(model, x, y, batch_size=cfg.batch_size)  # kept per layer on these batches
        set_enabled(model, False)
        ppl_full = evaluate(model, x, y, batch_size=cfg.batch_size)["perplexity"]
        set_enabled(model, True)
        batches = x.split(cfg.batch_size)

        def fwd(batches=batches):
            for xb in batches:
                model(xb)

        with torch.no_grad():
            set_enabled(model, False)
            f_full, per = count_flops(fwd, by_module=True)
            set_enabled(model, True)
            f_pr = count_flops(fwd)
            t_full, t_pr = paired_timing(model, fwd, cfg.repeats, rounds=3, warmup=cfg.warmup)
        per_layer = layer_flops(per, model.config.num_hidden_layers)  # GPT-2 and Llama configs
        kept = ev["kept_per_layer"] or [1.0] * len(per_layer)
        eff = effective_flops(per_layer, kept, total=f_full)
        rows.append({"length": T, "batch": cfg.batch_size, "windows": len(x),
                     "bucket_rows": cfg.bucket_rows, "kept_per_layer": kept,
                     "flops_full": f_full, "flops_pruned": f_pr, "flops_relative": f_pr / f_full,
                     "flops_effective_relative": eff / f_full,
                     "time_full_s": t_full.median_s, "time_full_mad_s": t_full.mad_s,
                     "time_pruned_s": t_pr.median_s, "time_pruned_mad_s": t_pr.mad_s,
                     "time_relative": t_pr.median_s / t_full.median_s,
                     "perplexity_full": ppl_full, "perplexity_pruned": ev["perplexity"]})
    gen = {}
    if cfg.gen_tokens:
        prompt = data.val[:16][None]
        for label, on in (("full", False), ("pruned", True)):
            set_enabled(model, on)
            t0 = time.perf_counter()
            generate(model, prompt, cfg.gen_tokens, cfg.temperature, True,
                     torch.Generator().manual_seed(cfg.seed))
            gen[label] = cfg.gen_tokens / (time.perf_counter() - t0)
        set_enabled(model, True)
        gen["relative"] = gen["pruned"] / gen["full"]
    label = lm_cfg.method if lm_cfg.method != "none" else "full"
    rd.write_csv("bench.csv", rows)
    rd.write_json("summary.json", {"command": "bench lm", "env": env_info(), "run": str(cfg.run),
                                   "methods": {label: {"rows": rows, "generation_tokens_per_s": gen}}})
    print(f"{'T':>5} {'FLOPs rel':>10} {'eff rel':>8} {'time full ms':>13} {'time pruned ms':>15} "
          f"{'time rel':>9} {'time/FLOPs':>11} {'ppl full':>9} {'ppl pruned':>11}")
    for r in rows:
        print(f"{r['length']:>5} {r['flops_relative']:>10.3f} {r['flops_effective_relative']:>8.3f} "
              f"{1e3 * r['time_full_s']:>13.2f} {1e3 * r['time_pruned_s']:>15.2f} {r['time_relative']:>9.3f} "
              f"{r['time_relative'] / r['flops_relative']:>11.3f} {r['perplexity_full']:>9.3f} "
              f"{r['perplexity_pruned']:>11.3f}")
    if gen:
        print(f"generation ({cfg.gen_tokens} tokens, T={cfg.temperature}, KV cache): full "
              f"{gen['full']:.1f} tok/s, pruned {gen['pruned']:.1f} tok/s (×{gen['relative']:.2f})")
    print(f"results: {rd.path}")
    return rd.path


def main(argv: list[str]) -> int:
    """``attnprune bench lm --run DIR [--key value …] --out DIR``."""
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    cl = parse_command_line(argv, BenchLMConfig, default_out="results")
    bench_lm(cl.config, cl.out, cl.exact_out)
    return 0
