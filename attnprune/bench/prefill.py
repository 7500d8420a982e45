"""``python -m attnprune.bench.prefill``: time to first token with training-free prefill pruning.

A randomly initialised Llama-shaped decoder (defaults: width 256, 8 layers, 4 heads of 64,
2 key/value heads, FFN 704, vocabulary 1000; SDPA) prefills random prompts of each length in
``lengths``; every variant is timed until the logits of the first new token:

    stock             the unpatched model: ``model(ids, use_cache=True, logits_to_keep=1)``
    fastv ρ           :func:`attnprune.prefill.prefill`, FastV cut at ``fastv_layer``
    gemfilter ρ       the same, GemFilter (layers < ``gemfilter_layer`` score, then all rerun)
    fastv 1.0         the pruning loop keeping everything: its own overhead
    layers=N          the stock model cut to its first ``baseline_layers`` layers (default
                      half): the shallower model a user tries first
    int8              the stock model after dynamic int8 quantization of its Linear layers
                      (:func:`attnprune.deploy.quantize_int8`, CPU)
    fastv ρ+int8      FastV at the smallest keep ratio on that int8 model (both at once)

Prompts: with ``ragged`` and ``batch`` > 1, the rows have lengths spread evenly over [L/2, L],
left padded (as a batch of real prompts arrives); otherwise every row fills L. Per variant, and
with the same interleaving: ``decode_ms`` the mean time of each of ``decode_tokens`` greedy
decode steps after the prefill (through the pruned cache for pruned variants), and
``peak_mb`` the peak growth of resident memory during one prefill
(:func:`attnprune.measure.peak_memory`, after every timing, in a process of its own that runs
under a fixed glibc mmap threshold, :func:`attnprune.bench._memory.return_freed_memory`, so that
memory an earlier variant freed does not hide a later one's, while the calling process's
malloc stays as it was; ``decode_tokens 0`` / ``memory false`` disable each).

Timing: :func:`attnprune.measure.time_interleaved` (variants round-robin, warm-up discarded,
median and MAD of ``repeats`` rounds), ``clock`` "wall" (time to first token) or "cpu" (this
process's CPU time: on a shared, oversubscribed machine it leaves out the waits for a core;
meaningful with one thread). ``× stock`` is the stock median over the variant's median.
FLOPs with :func:`attnprune.measure.count_flops` (one run each; causal attention counted
whole), relative to stock. ``kept`` is the share of prompt tokens the pruned layers hold.

On a GPU (``device cuda``, ``dtype bf16``; ``int8 false``, the dynamic int8 being a CPU
kernel): ``timer events`` times each call with CUDA events, the decode steps are synchronised
too, and ``peak_mb`` is the growth of CUDA memory allocated during one prefill
(``torch.cuda.max_memory_allocated``, in this process). ``deadline_s`` bounds the run: a length
starts only if the time left exceeds the longest length so far; the rest are noted as skipped.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from attnprune.bench._memory import in_child, return_freed_memory
from attnprune.measure import (
    count_flops,
    env_info,
    peak_memory,
    synchronize,
    time_interleaved,
)
from attnprune.prefill import PrefillConfig, prefill
from attnprune.runs.command import run_command, save_table
from attnprune.runs.config import to_dict


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
    baseline_layers: int | None = None  # None: half the layers
    int8: bool = True
    decode_tokens: int = 8
    memory: bool = True
    ragged: bool = False
    device: str = "cpu"  # "cpu" or "cuda[:i]"
    dtype: str = "fp32"  # fp32, bf16, fp16
    timer: str = "clock"  # "events": CUDA events on a GPU (``clock`` elsewhere)
    deadline_s: float = 0.0  # the whole run's wall-clock budget; 0: none

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
        if self.baseline_layers is not None and not 1 <= self.baseline_layers < self.layers:
            raise ValueError(f"baseline_layers: in [1, {self.layers - 1}], got "
                             f"{self.baseline_layers}")
        if self.decode_tokens < 0:
            raise ValueError(f"decode_tokens: must be >= 0, got {self.decode_tokens}")
        if self.device != "cpu" and self.device != "cuda" and not self.device.startswith("cuda:"):
            raise ValueError(f"device: 'cpu' or 'cuda[:i]', got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.timer not in ("clock", "events"):
            raise ValueError(f"timer: 'clock' or 'events', got {self.timer!r}")
        if self.int8 and self.device != "cpu":
            raise ValueError("int8: dynamic int8 runs on the CPU only; pass --int8 false "
                             f"with device {self.device}")
        if not self.deadline_s >= 0:
            raise ValueError(f"deadline_s: seconds >= 0 (0: no deadline), got {self.deadline_s}")


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_now = time.monotonic  # the deadline's clock (a test replaces it)


def build_model(cfg: BenchPrefillConfig):
    """The randomly initialised Llama-shaped LM (eval, SDPA), made on ``cfg.device`` (a large
    one initialises there, not on the CPU first) in ``cfg.dtype``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device: {cfg.device} asked for, but torch sees no CUDA device")
    torch.manual_seed(cfg.seed)
    conf = LlamaConfig(vocab_size=cfg.vocab, hidden_size=cfg.width, intermediate_size=cfg.ffn,
                       num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads,
                       num_key_value_heads=cfg.kv_heads, max_position_embeddings=max(cfg.lengths) + 64,
                       attn_implementation="sdpa")
    with torch.device(cfg.device):
        model = LlamaForCausalLM(conf)
    return model.to(DTYPES[cfg.dtype]).eval()


def _accelerator(cfg: BenchPrefillConfig) -> str | None:
    return "cuda" if cfg.device.startswith("cuda") else None


def baselines(model, cfg: BenchPrefillConfig) -> dict:
    """Label → the models users try instead: the first N layers, int8."""
    import copy

    out = {}
    n = cfg.baseline_layers or max(1, cfg.layers // 2)
    shallow = copy.deepcopy(model)
    shallow.model.layers = shallow.model.layers[:n]
    shallow.config.num_hidden_layers = n
    out[f"layers={n}"] = shallow
    if cfg.int8:
        from attnprune.deploy import quantize_int8

        out["int8"] = quantize_int8(model)
    return out


def prompts(cfg: BenchPrefillConfig, L: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L) ids and mask: full rows, or with ``ragged`` rows of lengths spread over
    [L/2, L], left padded."""
    g = torch.Generator().manual_seed(cfg.seed + L)
    ids = torch.randint(1, cfg.vocab, (cfg.batch, L), generator=g)
    mask = torch.ones_like(ids)
    if cfg.ragged and cfg.batch > 1:
        for b, n in enumerate(torch.linspace(L // 2, L, cfg.batch).round().long().tolist()):
            mask[b, : L - n] = 0
            ids[b, : L - n] = 0
    return ids, mask


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


def _stock_decode(model, ids, mask, steps: int):
    """Prefill (untimed) → a callable running ``steps`` greedy decode steps on the HF cache."""
    from attnprune.hosts.hf_causal import cache_kwargs, output_cache

    with torch.inference_mode():
        out = model(ids, attention_mask=mask, use_cache=True, logits_to_keep=1)
    cache, nxt, m = output_cache(out), out.logits[:, -1].argmax(-1, keepdim=True), mask

    def run():
        nonlocal cache, nxt, m
        with torch.inference_mode():
            for _ in range(steps):
                m = torch.cat([m, torch.ones_like(nxt)], 1)
                o = model(nxt, attention_mask=m, use_cache=True, **cache_kwargs(cache))
                cache, nxt = output_cache(o), o.logits[:, -1].argmax(-1, keepdim=True)
    return run


def _pruned_decode(model, ids, mask, opts, steps: int):
    """Pruned prefill (untimed) → a callable running ``steps`` decode steps on its cache."""
    from attnprune.prefill import decode

    state = prefill(model, ids, mask, max_new_tokens=steps, **opts)
    nxt = state.logits.argmax(-1, keepdim=True)

    def run():
        nonlocal nxt
        for _ in range(steps):
            nxt = decode(state, nxt).argmax(-1, keepdim=True)
    return run


def _prefill_fns(model, cfg: BenchPrefillConfig, others: dict | None, ids, mask):
    """Label → a callable running that variant's prefill on (ids, mask), and label →
    (model, prefill options or None for a stock forward)."""
    models = {"stock": model, **(others or {})}
    fns, plans = {}, {}
    for label, m in models.items():
        def fn(m=m):
            with torch.inference_mode():
                return m(ids, attention_mask=mask, use_cache=True, logits_to_keep=1).logits
        fns[label], plans[label] = fn, (m, None)
    opts_all = variants(cfg)
    if "int8" in models and cfg.keeps:
        low = min(cfg.keeps)
        opts_all[f"fastv {low:g}+int8"] = {**opts_all[f"fastv {low:g}"], "_model": "int8"} \
            if f"fastv {low:g}" in opts_all else None
    for label, opts in opts_all.items():
        if opts is None:
            continue
        m = models[opts.get("_model", "stock")]
        opts = {k: v for k, v in opts.items() if k != "_model"}

        def fn(m=m, opts=opts):
            return prefill(m, ids, mask, **opts).logits
        fns[label], plans[label] = fn, (m, opts)
    return fns, plans


def bench_length(model, cfg: BenchPrefillConfig, L: int, others: dict | None = None) -> list[dict]:
    """One row per variant at prompt length L (``others``: :func:`baselines`' models)."""
    ids, mask = (t.to(cfg.device) for t in prompts(cfg, L))
    fns, plans = _prefill_fns(model, cfg, others, ids, mask)
    kept = {label: float(prefill(m, ids, mask, **opts).kept[mask.bool()].float().mean())
            for label, (m, opts) in plans.items() if opts is not None}
    clock = time.perf_counter if cfg.clock == "wall" else time.process_time
    timings = time_interleaved(fns, repeats=cfg.repeats, warmup=cfg.warmup, clock=clock,
                               cuda_events=cfg.timer == "events")
    dev = _accelerator(cfg)
    flops = ({label: count_flops(fn) for label, fn in fns.items() if "int8" not in label}
             if cfg.flops else {})
    dec = {}
    if cfg.decode_tokens:  # interleaved like the prefill: one round = every variant once
        per = {label: [] for label in fns}
        for r in range(cfg.warmup + cfg.repeats):
            for label, (m, opts) in plans.items():
                run = (_stock_decode(m, ids, mask, cfg.decode_tokens) if opts is None
                       else _pruned_decode(m, ids, mask, opts, cfg.decode_tokens))
                synchronize(dev)
                t0 = clock()
                run()
                synchronize(dev)
                if r >= cfg.warmup:
                    per[label].append((clock() - t0) / cfg.decode_tokens)
        dec = {label: sorted(v)[len(v) // 2] * 1e3 for label, v in per.items()}
    peaks = _cuda_peaks(fns) if cfg.memory and dev == "cuda" else {}
    ref = timings["stock"].median_s
    rows = []
    for label, t in timings.items():
        rows.append({"length": L, "variant": label, "kept": kept.get(label, 1.0),
                     "median_ms": t.median_s * 1e3, "mad_ms": t.mad_s * 1e3,
                     "speedup": ref / t.median_s,
                     "flops_relative": (flops[label] / flops["stock"]) if label in flops else None,
                     "decode_ms": dec.get(label), "peak_mb": peaks.get(label),
                     "times_ms": [x * 1e3 for x in t.times_s], "timer": t.device})
    return rows


def _cuda_peaks(fns: dict) -> dict[str, float]:
    """Label → MB of CUDA memory allocated at the peak of one call above what was allocated
    before it (the model and the prompts)."""
    out = {}
    for label, fn in fns.items():
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        out[label] = (torch.cuda.max_memory_allocated() - before) / 2**20
    return out


def _fill_peaks(rows: list[dict], cfg: BenchPrefillConfig) -> None:
    """``peak_mb`` of every row, one prefill each, measured in a child process
    (:func:`_peaks`) that rebuilds the same model and prompts from ``cfg``: its fixed mmap
    threshold (every block goes back to the OS when freed, so each variant's own growth shows)
    slows allocation down for good, and stays in the child."""
    wanted: dict[int, list[str]] = {}
    for r in rows:
        wanted.setdefault(r["length"], []).append(r["variant"])
    payload = {"config": to_dict(cfg), "wanted": {str(L): v for L, v in wanted.items()}}
    peaks = in_child("attnprune.bench.prefill:_peaks", payload)["peaks"]
    for r in rows:
        r["peak_mb"] = peaks[str(r["length"])][r["variant"]]


def _peaks(payload: dict) -> dict:
    """In the child process of :func:`_fill_peaks`: {"peaks": {length: {variant: peak MB}},
    "fixed": whether the mmap threshold was fixed (glibc)}. Every prefill runs once first (as
    the timings ran them before), then the threshold is fixed and each is measured once."""
    d = payload["config"]
    cfg = BenchPrefillConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    model = build_model(cfg)
    others = baselines(model, cfg)
    fns = {}
    for L, labels in payload["wanted"].items():
        ids, mask = prompts(cfg, int(L))
        every = _prefill_fns(model, cfg, others, ids, mask)[0]
        fns[L] = {label: every[label] for label in labels}
    for by_label in fns.values():
        for fn in by_label.values():
            fn()
    fixed = return_freed_memory()
    return {"fixed": fixed, "peaks": {L: {label: peak_memory(fn) / 2**20 for label, fn in
                                          by_label.items()} for L, by_label in fns.items()}}


def run(cfg: BenchPrefillConfig, progress=print, save=None) -> dict:
    """Every length and variant; the summary dict (also handed to ``save`` after each length,
    so that a run stopped from outside keeps the lengths it finished)."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    end = _now() + cfg.deadline_s if cfg.deadline_s else None
    model = build_model(cfg)
    others = baselines(model, cfg)
    rows, longest = [], 0.0
    for L in cfg.lengths:
        left = None if end is None else end - _now()
        if left is not None and left < 1.2 * longest + 1.0:
            rows.append({"length": L, "variant": "stock", "median_ms": None,
                         "note": f"skipped: deadline ({left:.0f} s left, a length took "
                                 f"{longest:.0f} s)"})
            progress(format_table({"rows": rows[-1:]}, header=False))
            continue
        t0 = _now()
        rows += bench_length(model, cfg, L, others)
        longest = max(longest, _now() - t0)
        progress(format_table({"rows": [r for r in rows if r["length"] == L]}, header=L == cfg.lengths[0]))
        if save is not None:
            save(_summary(cfg, rows))
    timed = [r for r in rows if r["median_ms"] is not None]
    if cfg.memory and cfg.device == "cpu":  # after every timing, in a process of its own
        _fill_peaks(timed, cfg)
    if cfg.memory:
        progress("peak MB: " + ", ".join(f"{r['length']} {r['variant']} {r['peak_mb']:.1f}"
                                         for r in timed))
    return _summary(cfg, rows)


def _summary(cfg: BenchPrefillConfig, rows: list[dict]) -> dict:
    timed = [r for r in rows if r["median_ms"] is not None]
    env = env_info(cfg.device, DTYPES[cfg.dtype])
    return {"command": "bench prefill", "env": {**env, "clock": cfg.clock,
                                                 "timer": timed[0]["timer"] if timed else None},
            "config": to_dict(cfg), "rows": list(rows)}


def format_table(summary: dict, header: bool = True) -> str:
    """Plain-text table: one line per (length, variant)."""
    lines = [(f"{'L':>5} {'variant':<16} {'kept':>5} {'median ms':>10} {'MAD ms':>7} "
             f"{'× stock':>7} {'FLOPs rel':>9} {'decode ms':>9} {'peak MB':>8}")] if header else []
    for r in summary["rows"]:
        if r.get("median_ms") is None:
            lines.append(f"{r['length']:>5} {r['variant']:<16} {r.get('note', '')}")
            continue
        fl = "" if r["flops_relative"] is None else f"{r['flops_relative']:.3f}"
        dm = "" if r.get("decode_ms") is None else f"{r['decode_ms']:.2f}"
        pm = "" if r.get("peak_mb") is None else f"{r['peak_mb']:.1f}"
        lines.append(f"{r['length']:>5} {r['variant']:<16} {r['kept']:>5.2f} {r['median_ms']:>10.1f} "
                     f"{r['mad_ms']:>7.1f} {r['speedup']:>7.2f} {fl:>9} {dm:>9} {pm:>8}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """CLI entry: ``python -m attnprune.bench.prefill [--key value ...] --out DIR``."""

    def body(cfg, out) -> str:
        summary = run(cfg, save=lambda s: save_table(out, s, format_table, "table.txt"))
        save_table(out, summary, format_table, "table.txt")
        return f"threads={summary['env']['threads']} clock={cfg.clock}"

    return run_command(argv, BenchPrefillConfig, "bench-prefill", body)


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
