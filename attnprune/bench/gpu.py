"""``attnprune bench gpu``: does token pruning pay where most inference runs (a GPU, bf16)?

For each model shape (random weights: the speed of a forward does not depend on them), batch
size B and length T, one process times, interleaved (``measure.time_interleaved``, which
synchronises the device around every call):

* ``full``           the stock model;
* ``mean@ρ/L1``      attention_mass (mean scorer) keeping ρ of the tokens after layer 1, the
                     README's long-text recipe, at each ρ of ``keep_ratios``;
* ``layers=N``       the first N layers only (N = half the depth by default), the shallower
                     model users try first;
* ``int8``           int8 weights where the device has a kernel for it (CUDA: torchao's
                     int8 weight-only, if torchao is installed; CPU: dynamic int8 of the
                     Linear layers, fp32 models only); "n/a" elsewhere;
* ``prefill``        (decoder shape) the prompt's prefill, full vs FastV prefill pruning
                     (:mod:`attnprune.prefill`, training-free) vs the first N layers.

Inputs are full-length rows without padding (nothing for pruning to claim from padding), the
model is loaded in ``dtype`` and patched afterwards, and the pruned forward takes the
device's path (:func:`attnprune.hosts.hf_encoder.sync_free`: on a GPU, no host reads).
``compile=true`` times every point through ``torch.compile`` as well (the full model too), in
``compile_mode`` ("reduce-overhead": CUDA graphs, for launch-bound shapes).
Prints one markdown table (ms and ratio to full); writes ``summary.json`` and
``bench_gpu.png`` (time relative to full vs T). ``--device cpu --quick true`` is the dry run
of the GPU script (``scripts/gpu_check.sh``) on a machine without a GPU.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import torch

from attnprune import api
from attnprune.measure import env_info, time_interleaved
from attnprune.runs.config import parse_command_line
from attnprune.runs.results import ResultsDir
from attnprune.selection import check_keep_ratio

__all__ = ["BenchGPUConfig", "main", "run"]

# Model shapes (random weights). "minilm": all-MiniLM-L6-v2; "bert-base": BERT-base;
# "llama-1b": a Llama-3.2-1B-like decoder (16 layers, width 2048, GQA 32/8, FFN 8192).
SHAPES = {
    "minilm": {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12,
               "intermediate_size": 1536},
    "bert-base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                  "intermediate_size": 3072},
    "tiny": {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
             "intermediate_size": 128},  # the CPU dry run
}
DECODERS = {
    "llama-1b": {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
                 "num_key_value_heads": 8, "intermediate_size": 8192},
    "llama-tiny": {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "intermediate_size": 128},
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass(frozen=True)
class BenchGPUConfig:
    """Options of ``attnprune bench gpu``."""

    device: str = "auto"  # auto: cuda if available, else cpu
    dtype: str = "bf16"
    models: tuple[str, ...] = ("minilm", "bert-base")
    decoders: tuple[str, ...] = ("llama-1b",)
    batch_sizes: tuple[int, ...] = (1, 32)
    lengths: tuple[int, ...] = (128, 512, 2048)
    decoder_lengths: tuple[int, ...] = (512, 2048)
    decoder_batch: int = 1
    keep_ratios: tuple[float, ...] = (0.25, 0.5)
    # how the pruned points' scorer runs (hf_encoder.SCORER_KERNELS): "matmul" builds the L×L
    # probabilities in blocks, "sdpa" takes them from two fused attention passes (issue 30)
    scorer_kernels: tuple[str, ...] = ("matmul",)
    after_layer: int = 1
    layers: int | None = None  # the shallower model's depth; None: half
    repeats: int = 20
    warmup: int = 3
    compile: bool = False
    # torch.compile's mode: "reduce-overhead" records CUDA graphs, so a forward's many small
    # kernels launch as one replay (what a launch-bound forward needs, measured on an H200)
    compile_mode: str = "default"
    max_tokens: int = 65536  # skip (B, T) with B·T above this (memory of the scorer's A)
    quick: bool = False  # the dry run: tiny shapes, B ∈ {1, 4}, T ∈ {32, 64}

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: one of {', '.join(DTYPES)}, got {self.dtype!r}")
        for m in self.models:
            if m not in SHAPES:
                raise ValueError(f"models: {m!r} is not one of {', '.join(SHAPES)}")
        for m in self.decoders:
            if m not in DECODERS:
                raise ValueError(f"decoders: {m!r} is not one of {', '.join(DECODERS)}")
        for i, r in enumerate(self.keep_ratios):
            check_keep_ratio(r, f"keep_ratios[{i}]")
        for name in ("batch_sizes", "lengths", "decoder_lengths"):
            if not getattr(self, name) or min(getattr(self, name)) < 1:
                raise ValueError(f"{name}: give positive integers, got {getattr(self, name)}")
        for name in ("repeats", "after_layer", "decoder_batch", "max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        from attnprune.hosts.hf_encoder import SCORER_KERNELS

        for k in self.scorer_kernels:
            if k not in SCORER_KERNELS:
                raise ValueError(f"scorer_kernels: each one of {', '.join(SCORER_KERNELS)}, "
                                 f"got {k!r}")
        if self.compile_mode not in COMPILE_MODES:
            raise ValueError(f"compile_mode: one of {', '.join(COMPILE_MODES)}, got "
                             f"{self.compile_mode!r}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device: 'auto', 'cpu' or 'cuda[:i]', got {self.device!r}")


def resolve(cfg: BenchGPUConfig) -> BenchGPUConfig:
    """The configuration actually run (device resolved; ``quick`` shrinks the grid)."""
    dev = cfg.device
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("device: cuda asked for, but torch sees no CUDA device")
    cfg = dataclasses.replace(cfg, device=dev)
    if cfg.quick:
        cfg = dataclasses.replace(cfg, models=("tiny",), decoders=("llama-tiny",),
                                  batch_sizes=(1, 4), lengths=(32, 64), decoder_lengths=(64,),
                                  repeats=3, warmup=1, quick=False)
    return cfg


def _random(config_cls: str, model_cls: str, shape: dict, vocab: int, positions: int, dtype, device):
    """A transformers model of ``shape`` with random weights (seeded), in ``dtype`` on
    ``device``, SDPA attention, eval mode."""
    import transformers

    cfg = getattr(transformers, config_cls)(vocab_size=vocab, max_position_embeddings=positions,
                                            attn_implementation="sdpa", **shape)
    torch.manual_seed(0)
    return getattr(transformers, model_cls)(cfg).to(device=device, dtype=dtype).eval()


def _encoder(shape: str, T: int, dtype, device):
    return _random("BertConfig", "BertModel", SHAPES[shape], 30522, max(512, T), dtype, device)


def _shallow(model, n: int):
    """The first ``n`` layers of an encoder or decoder (a copy)."""
    m = copy.deepcopy(model)
    layers = m.encoder.layer if hasattr(m, "encoder") else m.layers
    del layers[n:]
    m.config.num_hidden_layers = n
    return m


def _int8(model, device: str):
    """An int8 copy where this device has a kernel, else None (and why)."""
    if device == "cpu":
        if next(model.parameters()).dtype != torch.float32:
            return None, "dynamic int8 takes fp32 models"
        from attnprune.deploy import quantize_int8

        return quantize_int8(copy.deepcopy(model)), "dynamic int8 (Linear)"
    try:
        from torchao.quantization import Int8WeightOnlyConfig, quantize_
    except ImportError:
        return None, "torchao not installed"
    m = copy.deepcopy(model)
    quantize_(m, Int8WeightOnlyConfig())
    return m, "torchao int8 weight-only"


def _maybe_compile(fn, cfg: BenchGPUConfig):
    if not cfg.compile:
        return fn
    # every model × shape is its own graph of the one BertModel.forward: past dynamo's default
    # 8 it would fall back to eager and time that instead
    import torch._dynamo

    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    return torch.compile(fn, mode=cfg.compile_mode)


def _encoder_rows(cfg: BenchGPUConfig, shape: str, dtype, flush) -> list[dict]:
    rows = []
    for T in cfg.lengths:
        base = _encoder(shape, T, dtype, cfg.device)
        n = cfg.layers or max(1, base.config.num_hidden_layers // 2)
        models = {"full": base}
        for rho in cfg.keep_ratios:
            for kernel in cfg.scorer_kernels:
                m = copy.deepcopy(base)
                api.patch(m, "attention_mass", keep_ratio=rho, after_layer=cfg.after_layer,
                          scorer_kernel=kernel)
                suffix = "" if kernel == "matmul" else f"/{kernel}"
                models[f"mean@{rho:g}/L{cfg.after_layer}{suffix}"] = m
        models[f"layers={n}"] = _shallow(base, n)
        q, why = _int8(base, cfg.device)
        if q is not None:
            models["int8"] = q
        for B in cfg.batch_sizes:
            if B * T > cfg.max_tokens:
                continue
            g = torch.Generator().manual_seed(B * 7919 + T)
            ids = torch.randint(1000, 30000, (B, T), generator=g).to(cfg.device)
            fns = {}
            for name, m in models.items():
                fwd = _maybe_compile(m, cfg)
                fns[name] = (lambda f=fwd, x=ids: f(input_ids=x))
            with torch.inference_mode():
                times = time_interleaved(fns, repeats=cfg.repeats, warmup=cfg.warmup)
            full = times["full"].median_s
            for name, t in times.items():
                rows.append({"model": shape, "B": B, "T": T, "point": name,
                             "ms": 1e3 * t.median_s, "mad_ms": 1e3 * t.mad_s,
                             "relative": t.median_s / full, "device": t.device})
            if q is None:
                rows.append({"model": shape, "B": B, "T": T, "point": "int8", "ms": None,
                             "relative": None, "note": why})
            print(_line(rows[-len(times) - (q is None):]), flush=True)
            flush(rows)
        del models
        if cfg.device.startswith("cuda"):
            torch.cuda.empty_cache()
    return rows


def _decoder(shape: str, T: int, dtype, device):
    return _random("LlamaConfig", "LlamaForCausalLM", DECODERS[shape], 32000, max(4096, T),
                   dtype, device)


def _decoder_rows(cfg: BenchGPUConfig, shape: str, dtype, flush) -> list[dict]:
    from attnprune.prefill import prefill

    rows = []
    for T in cfg.decoder_lengths:
        lm = _decoder(shape, T, dtype, cfg.device)
        n = cfg.layers or max(1, lm.config.num_hidden_layers // 2)
        shallow = _shallow(lm.model, n)
        B = cfg.decoder_batch
        ids = torch.randint(1000, 30000, (B, T), generator=torch.Generator().manual_seed(T))
        ids = ids.to(cfg.device)
        fns = {"full": lambda m=lm, x=ids: m(input_ids=x, use_cache=True, logits_to_keep=1),
               f"layers={n}": lambda m=shallow, x=ids: m(input_ids=x, use_cache=True)}
        for rho in cfg.keep_ratios:
            fns[f"fastv@{rho:g}"] = (lambda r=rho, m=lm, x=ids: prefill(m, x, keep=r, method="fastv"))
        with torch.inference_mode():
            times = time_interleaved(fns, repeats=cfg.repeats, warmup=cfg.warmup)
        full = times["full"].median_s
        part = []
        for name, t in times.items():
            part.append({"model": shape, "B": B, "T": T, "point": f"prefill {name}",
                         "ms": 1e3 * t.median_s, "mad_ms": 1e3 * t.mad_s,
                         "relative": t.median_s / full, "device": t.device})
        print(_line(part), flush=True)
        rows += part
        flush(rows)
        del lm, shallow, fns
        if cfg.device.startswith("cuda"):
            torch.cuda.empty_cache()
    return rows


def _line(rows: list[dict]) -> str:
    r0 = rows[0]
    cells = [f"{r['point']} {r['ms']:.2f} ms ({r['relative']:.2f}×)" if r["ms"] is not None
             else f"{r['point']} n/a" for r in rows]
    return f"{r0['model']} {r0['B']}×{r0['T']}: " + ", ".join(cells)


def table(rows: list[dict]) -> str:
    """Markdown: one row per (model, B, T), one column per point, 'ms (ratio×)'."""
    points = list(dict.fromkeys(r["point"] for r in rows))
    keys = list(dict.fromkeys((r["model"], r["B"], r["T"]) for r in rows))
    cell = {(r["model"], r["B"], r["T"], r["point"]): r for r in rows}
    out = ["| model | B × T | " + " | ".join(points) + " |",
           "|---|---|" + "---|" * len(points)]
    for m, B, T in keys:
        cs = []
        for p in points:
            r = cell.get((m, B, T, p))
            cs.append("—" if r is None or r["ms"] is None
                      else f"{r['ms']:.2f} ms ({r['relative']:.2f}×)")
        out.append(f"| {m} | {B} × {T} | " + " | ".join(cs) + " |")
    return "\n".join(out)


def _figure(rows: list[dict], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys((r["model"], r["B"]) for r in rows))
    fig, axes = plt.subplots(1, len(groups), figsize=(4 * len(groups), 3.2), squeeze=False)
    for ax, (m, B) in zip(axes[0], groups):
        sub = [r for r in rows if r["model"] == m and r["B"] == B and r["ms"] is not None]
        for p in dict.fromkeys(r["point"] for r in sub):
            pts = sorted((r["T"], r["relative"]) for r in sub if r["point"] == p)
            ax.plot([t for t, _ in pts], [v for _, v in pts], marker="o", label=p)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{m}, B = {B}")
        ax.set_xlabel("T")
        ax.set_ylabel("time / full")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(cfg: BenchGPUConfig, results: ResultsDir) -> dict:
    cfg = resolve(cfg)
    dtype = DTYPES[cfg.dtype]
    rows: list[dict] = []

    def write(new: list[dict]) -> dict:
        """summary.json with every row so far: a run cut off by a deadline keeps them."""
        done = rows + new
        summary = {"command": "bench gpu", "env": env_info(cfg.device, dtype),
                   "config": dataclasses.asdict(cfg), "rows": done, "table": table(done)}
        results.write_json("summary.json", summary)
        return summary

    for shape in cfg.models:
        rows += _encoder_rows(cfg, shape, dtype, write)
    for shape in cfg.decoders:
        rows += _decoder_rows(cfg, shape, dtype, write)
    summary = write([])
    _figure(rows, results.path / "bench_gpu.png")
    return summary


def main(argv: list[str]) -> int:
    """``attnprune bench gpu [--device cuda] [--dtype bf16] [--quick true] --out DIR``."""
    cl = parse_command_line(argv, BenchGPUConfig, default_out="results")
    results = ResultsDir.start(cl.out, "bench-gpu", cl.exact_out, cl.config)
    summary = run(cl.config, results)
    print(summary["table"])
    print(f"device: {summary['env']['device']} {summary['env'].get('gpu', '')}, dtype {cfg_dtype(summary)}")
    return 0


def cfg_dtype(summary: dict) -> str:
    return summary["env"].get("dtype", "?")


if __name__ == "__main__":  # pragma: no cover
    import sys

    sys.exit(main(sys.argv[1:]))
