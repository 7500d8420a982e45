"""Passkey retrieval: attnprune's prefill pruning next to NVIDIA kvpress presses (issue 25, item 3).

kvpress 0.5.5 pins ``transformers<5.3`` and this project runs 5.24, while ``attnprune.prefill``
needs transformers ≥ 5.3 (``create_causal_mask(layer_idx=…)``). So the two sides run in two
processes, on the same saved prompts and the same saved weights, and their JSON is merged:

    python scripts/kvpress_side_by_side.py all --out DIR [--kvpress-python /tmp/kvp/bin/python]

runs, in order (each step can also be run alone, with the same ``--out``):

    prepare   the passkey model (loaded from ``--cache``/model.safetensors, else trained with
              attnprune.research.experiments.passkey's default recipe and saved there) and the prompts
              (the same prompts as ``passkey.evaluate``'s seed 1): DIR/model.safetensors, DIR/prompts.pt
    ours      (this python) unpruned (the stock HF model), FastV and GemFilter at each keep → DIR/ours.json
    kvpress   (``--kvpress-python``) unpruned and each press at compression 1 − keep → DIR/kvpress.json
    merge     DIR/summary.json and DIR/table.md (each row keeps its per-prompt ``right``)

``--model-dir M`` (e.g. results/passkey_gpu/seed0, a ``passkey --train-only`` folder) takes the
weights from M/model.safetensors and the model config from M/config.json (else M/config.yaml)
instead of ``--cache``; the config travels in DIR/prepare.json, which both sides build from.
``--lengths 512,1024,2048`` sets the prompt lengths. Several such folders (one per seed) pool
into one table with

    python scripts/kvpress_side_by_side.py pool --out POOLED --runs DIR0,DIR1,DIR2 [--command "..."]

POOLED/summary.json and POOLED/table.md: per (side, variant) and length, the accuracy over all
(seed, prompt), its paired difference from the same side's unpruned with a 95 % bootstrap CI
(the prompts resampled, all seeds of a prompt kept together: the seeds share the prompts), the
median over (seed, prompt) of TTFT / the same prompt's unpruned TTFT (CPU clock) and the
median decode ms/token (CPU clock).

Batch 1, greedy, 1 thread. Each prompt runs every variant of its side in turn (interleaved, so
a change of load hits all variants alike); the first prompt is a warm-up and is run twice.
TTFT: from the prompt to the logits of the first answer token. Decode: the mean time of the
following steps (``--decode-tokens`` tokens in all; accuracy reads the first ``digits``).

kvpress is used as its pipeline uses it (``KVPressTextGenerationPipeline``): the press hooks the
prefill of the *context* (here the prompt without its final QUERY token), which
``model.model`` runs under the press; then the question (QUERY) runs on the compressed cache
at its original position, and the answer decodes greedily. So every answer token reads the
compressed cache. ``--kvpress-question inside`` instead compresses the whole prompt and takes
the first token from the full prefill's logits (only later tokens read the compressed cache).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

KEEPS = (0.25, 0.5, 0.75)
PRESSES = ("snapkv", "streamingllm", "knorm", "expected_attention")
# ours: the same options as docs/results/passkey_cpu (K = 1, window 4, 1 sink)
OURS = {"layer": 1, "window": 4, "sinks": 1}


def _versions() -> dict:
    import platform

    import torch
    import transformers

    out = {"python": platform.python_version(), "executable": sys.executable,
           "torch": torch.__version__, "transformers": transformers.__version__,
           "threads": torch.get_num_threads()}
    from importlib.metadata import PackageNotFoundError, version

    for name in ("kvpress", "peft"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


# -- prepare --------------------------------------------------------------------------------------
def model_config(model_dir: Path | None):
    """The PasskeyConfig of a ``passkey --train-only`` folder (config.json, else config.yaml);
    the default config without one."""
    from attnprune.research.experiments import passkey as pk

    if model_dir is None:
        return pk.PasskeyConfig()
    if (model_dir / "config.json").exists():
        raw = json.loads((model_dir / "config.json").read_text())
    else:
        import yaml

        raw = yaml.safe_load((model_dir / "config.yaml").read_text())
    return _config_from(raw)


def _config_from(raw: dict):
    from attnprune.research.experiments import passkey as pk

    fields = pk.PasskeyConfig.__dataclass_fields__
    return pk.PasskeyConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k in fields})


def prepare(out: Path, cache: Path, lengths: list[int], n: int, model_dir: Path | None = None) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    from attnprune.research.experiments import passkey as pk

    torch.set_num_threads(1)
    cfg = model_config(model_dir)
    weights = (model_dir if model_dir is not None else cache) / "model.safetensors"
    if model_dir is not None:
        print(f"model: {weights} (config from {model_dir})")
        state = load_file(str(weights))
    elif weights.exists():
        print(f"model: {weights} (cached)")
        state = load_file(str(weights))
    else:
        print(f"model: training the default passkey recipe ({cfg.steps} steps) into {weights}")
        cache.mkdir(parents=True, exist_ok=True)
        model = pk.train(cfg)
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        save_file(state, str(weights))
    save_file(state, str(out / "model.safetensors"))
    import hashlib

    digest = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    (out / "prepare.json").write_text(json.dumps({
        "model_sha256": digest, "model_dir": None if model_dir is None else str(model_dir),
        "cached": (cache / "model.safetensors").exists(), "lengths": lengths, "n": n,
        "prompt_seed": 1, "passkey_config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}}, indent=1))
    prompts = {}
    for L in lengths:  # as passkey.evaluate(seed=1, batch=16): the same prompts as docs/results/passkey_cpu
        g = torch.Generator().manual_seed(1)
        parts = [pk.passkey_batch(min(16, n - lo), L, cfg.digits, cfg.vocab, g) for lo in range(0, n, 16)]
        prompts[L] = {"ids": torch.cat([p[0] for p in parts]), "answers": torch.cat([p[1] for p in parts]),
                      "start": torch.cat([p[2] for p in parts])}
    torch.save(prompts, out / "prompts.pt")


def _load(out: Path):
    import torch
    from safetensors.torch import load_file

    from attnprune.research.experiments import passkey as pk

    torch.set_num_threads(1)
    prep = out / "prepare.json"
    cfg = _config_from(json.loads(prep.read_text())["passkey_config"]) if prep.exists() else pk.PasskeyConfig()
    model = pk.build_model(cfg)
    model.load_state_dict(load_file(str(out / "model.safetensors")))
    return model.eval(), cfg, torch.load(out / "prompts.pt", weights_only=True)


class _Clock:
    """Wall and CPU seconds since start."""

    def __init__(self):
        self.w, self.c = time.perf_counter(), time.process_time()

    def lap(self) -> tuple[float, float]:
        w, c = time.perf_counter(), time.process_time()
        out = (w - self.w, c - self.c)
        self.w, self.c = w, c
        return out


def _cache_len(cache) -> list[int]:
    return [int(layer.keys.shape[-2]) for layer in cache.layers]


def _record(rec: dict, tokens: list[int], answer, ttft, steps, cache_lens, L: int, digits: int,
            prompt_kept: float) -> None:
    rec["right"].append(bool(tokens[:digits] == answer))
    rec["ttft_wall_ms"].append(round(ttft[0] * 1e3, 4))
    rec["ttft_cpu_ms"].append(round(ttft[1] * 1e3, 4))
    rec["decode_wall_ms"].append(round(1e3 * sum(s[0] for s in steps) / max(1, len(steps)), 4))
    rec["decode_cpu_ms"].append(round(1e3 * sum(s[1] for s in steps) / max(1, len(steps)), 4))
    rec["cache_kept"].append(round(sum(cache_lens) / (len(cache_lens) * L), 4))
    rec["prompt_kept"].append(round(prompt_kept, 4))


def _empty() -> dict:
    return {k: [] for k in ("right", "ttft_wall_ms", "ttft_cpu_ms", "decode_wall_ms", "decode_cpu_ms",
                            "cache_kept", "prompt_kept")}


def _run_side(variants: dict, prompts: dict, side: str, extra: dict, T: int) -> dict:
    """variants: label → fn(ids (1, L), T) → (tokens, ttft, steps, cache_lens, prompt_kept)."""
    rows = {}
    for L, p in prompts.items():
        n = p["ids"].shape[0]
        recs = {label: _empty() for label in variants}
        for j, i in enumerate([0] + list(range(n))):  # prompt 0 twice: the first pass is the warm-up
            warm = j == 0
            for label, fn in variants.items():
                try:
                    tokens, ttft, steps, lens, pk = fn(p["ids"][i:i + 1], T)
                except Exception as e:  # noqa: BLE001 (a press that does not run is a row with its error)
                    recs[label] = {"error": f"{type(e).__name__}: {e}"}
                    variants = {k: v for k, v in variants.items() if k != label}
                    print(f"L {L} {label}: {recs[label]['error']}")
                    break
                if not warm:
                    _record(recs[label], tokens, p["answers"][i].tolist(), ttft, steps, lens, L,
                            p["answers"].shape[1], pk)
            if warm:
                for label in variants:
                    recs[label] = _empty()
        for label, r in recs.items():
            rows[f"{L}|{label}"] = {"length": L, "variant": label, "side": side, **extra.get(label, {}), **r}
            if "right" in r:
                print(f"L {L} {label:<26} acc {sum(r['right']) / len(r['right']):.3f} "
                      f"ttft {sorted(r['ttft_cpu_ms'])[len(r['ttft_cpu_ms']) // 2]:.2f} ms")
        for label, e in extra.items():  # variants that could not even be built
            if "error" in e and f"{L}|{label}" not in rows:
                rows[f"{L}|{label}"] = {"length": L, "variant": label, "side": side, **e}
    return {"side": side, "env": _versions(), "rows": list(rows.values())}


def _greedy_tail(step, first_logits, T: int, clock: _Clock) -> tuple[list[int], list]:
    tokens, steps = [int(first_logits.argmax(-1))], []
    for _ in range(T - 1):
        logits = step(tokens[-1])
        tokens.append(int(logits.argmax(-1)))
        steps.append(clock.lap())
    return tokens, steps


# -- our side ---------------------------------------------------------------------------------------
def stock_variant(model):
    """The unpruned reference: the stock HF model, full prefill, DynamicCache."""
    import torch
    from transformers import DynamicCache

    def fn(ids, T):
        with torch.inference_mode():
            clock = _Clock()
            cache = DynamicCache()
            logits = model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[0, -1]
            ttft = clock.lap()
            lens = _cache_len(cache)
            L = ids.shape[1]

            def step(tok, pos=[L]):  # noqa: B006 (the running position)
                out = model(torch.tensor([[tok]]), past_key_values=cache, position_ids=torch.tensor([[pos[0]]]),
                            use_cache=True).logits[0, -1]
                pos[0] += 1
                return out
            tokens, steps = _greedy_tail(step, logits, T, clock)
        return tokens, ttft, steps, lens, 1.0
    return fn


def ours(out: Path, decode_tokens: int) -> None:
    import torch

    from attnprune.prefill import decode, prefill

    model, cfg, prompts = _load(out)
    T = max(cfg.digits, decode_tokens)
    variants, extra = {"unpruned": stock_variant(model)}, {"unpruned": {"kept": 1.0, "method": "unpruned"}}
    for m in ("fastv", "gemfilter"):
        for k in KEEPS:
            opts = {"keep": k, "method": m, **OURS}

            def fn(ids, T, opts=opts):
                clock = _Clock()
                state = prefill(model, ids, max_new_tokens=T, **opts)
                ttft = clock.lap()
                lens = _cache_len(state.cache)
                tokens, steps = _greedy_tail(lambda t: decode(state, torch.tensor([[t]]))[0], state.logits[0], T, clock)
                return tokens, ttft, steps, lens, float(state.kept.float().mean())
            variants[f"{m} {k:g}"] = fn
            extra[f"{m} {k:g}"] = {"kept": k, "method": m, "options": opts}
    res = _run_side(variants, prompts, "attnprune", extra, T)
    (out / "ours.json").write_text(json.dumps(res))


# -- kvpress side -----------------------------------------------------------------------------------
def make_press(name: str, compression: float):
    """The presses, with sinks and window as our side's (1 sink, window 4)."""
    import kvpress

    if name == "snapkv":
        return kvpress.SnapKVPress(compression_ratio=compression, window_size=OURS["window"])
    if name == "streamingllm":
        return kvpress.StreamingLLMPress(compression_ratio=compression, n_sink=OURS["sinks"])
    if name == "knorm":
        return kvpress.KnormPress(compression_ratio=compression)
    if name == "expected_attention":
        return kvpress.ExpectedAttentionPress(compression_ratio=compression, n_sink=OURS["sinks"])
    raise ValueError(f"press: one of {', '.join(PRESSES)}, got {name!r}")


def kvpress_side(out: Path, decode_tokens: int, question: str, presses: list[str]) -> None:
    import contextlib

    import torch
    from transformers import DynamicCache

    model, cfg, prompts = _load(out)
    T = max(cfg.digits, decode_tokens)

    def variant(press):
        def fn(ids, T):
            L = ids.shape[1]
            with torch.inference_mode():
                clock = _Clock()
                cache = DynamicCache()
                ctx = press(model) if press is not None else contextlib.nullcontext()
                if question == "after":  # the pipeline: compress the context, then the question
                    with ctx:
                        model.model(input_ids=ids[:, :-1], past_key_values=cache)
                    lens = _cache_len(cache)
                    logits = model(ids[:, -1:], past_key_values=cache, position_ids=torch.tensor([[L - 1]]),
                                   logits_to_keep=1).logits[0, -1]
                    lens = [n + 1 for n in lens]  # the question token is kept
                else:  # the whole prompt compressed; its first token from the full prefill
                    with ctx:
                        logits = model(ids, past_key_values=cache, logits_to_keep=1).logits[0, -1]
                    lens = _cache_len(cache)
                ttft = clock.lap()

                def step(tok, pos=[L]):  # noqa: B006 (the running position)
                    o = model(torch.tensor([[tok]]), past_key_values=cache,
                              position_ids=torch.tensor([[pos[0]]])).logits[0, -1]
                    pos[0] += 1
                    return o
                tokens, steps = _greedy_tail(step, logits, T, clock)
            return tokens, ttft, steps, lens, sum(lens) / (len(lens) * L)
        return fn

    variants, extra = {"unpruned": variant(None)}, {"unpruned": {"kept": 1.0, "method": "unpruned"}}
    for name in presses:
        for k in KEEPS:
            label = f"{name} {k:g}"
            try:
                press = make_press(name, 1.0 - k)
            except Exception as e:  # noqa: BLE001
                extra[label] = {"kept": k, "method": name, "error": f"{type(e).__name__}: {e}"}
                continue
            variants[label] = variant(press)
            extra[label] = {"kept": k, "method": name, "compression_ratio": 1.0 - k, "press": repr(press)}
    res = _run_side(variants, prompts, "kvpress", extra, T)
    res["question"] = question
    (out / "kvpress.json").write_text(json.dumps(res))


# -- merge ------------------------------------------------------------------------------------------
def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def merge(sides: list[dict]) -> dict:
    """One row per (length, side, variant): accuracy with its Wilson 95 % interval, the exact
    McNemar test against the unpruned model on the same prompts (ours: our side's; kvpress: the
    kvpress side's, which must give the same answers), TTFT (CPU and wall medians) and its
    ratio to the same side's unpruned, decode ms/token (medians) and the cache kept."""
    from attnprune.runs.stats import mcnemar, wilson_ci

    rows = []
    for side in sides:
        base = {r["length"]: r for r in side["rows"] if r["variant"] == "unpruned"}
        for r in side["rows"]:
            row = {k: r[k] for k in ("length", "variant", "side", "kept", "method") if k in r}
            if "right" not in r or not r["right"]:
                rows.append({**row, "error": r.get("error", "no prompts")})
                continue
            b0, n = base[r["length"]], len(r["right"])
            ci = wilson_ci(sum(r["right"]), n)
            lost = sum(a and not c for a, c in zip(b0["right"], r["right"]))
            gained = sum(c and not a for a, c in zip(b0["right"], r["right"]))
            row.update({
                "n": n, "accuracy": sum(r["right"]) / n, "ci95": [ci.low, ci.high],
                "diff_vs_unpruned": (sum(r["right"]) - sum(b0["right"])) / n,
                "lost": lost, "gained": gained,
                "mcnemar_p": None if r["variant"] == "unpruned" else mcnemar(lost, gained).pvalue,
                "ttft_cpu_ms": _median(r["ttft_cpu_ms"]), "ttft_wall_ms": _median(r["ttft_wall_ms"]),
                "ttft_ratio_cpu": _median(r["ttft_cpu_ms"]) / _median(b0["ttft_cpu_ms"]),
                "ttft_ratio_wall": _median(r["ttft_wall_ms"]) / _median(b0["ttft_wall_ms"]),
                "decode_cpu_ms": _median(r["decode_cpu_ms"]), "decode_wall_ms": _median(r["decode_wall_ms"]),
                "cache_kept": sum(r["cache_kept"]) / n, "prompt_kept": sum(r["prompt_kept"]) / n,
                "right": [bool(x) for x in r["right"]]})
            rows.append(row)
    rows.sort(key=lambda r: (r["length"], r["side"] != "attnprune", r["variant"] != "unpruned",
                             r.get("method", ""), r.get("kept", 1.0)))
    # the two sides' unpruned models must agree prompt by prompt (same weights, same prompts)
    agree = {}
    for L in sorted({r["length"] for s in sides for r in s["rows"]}):
        rights = [r["right"] for s in sides for r in s["rows"] if r["length"] == L and r["variant"] == "unpruned"]
        agree[str(L)] = len(rights) == len(sides) and all(x == rights[0] for x in rights)
    return {"rows": rows, "unpruned_agree": agree, "env": {s["side"]: s["env"] for s in sides},
            "kvpress_question": next((s.get("question") for s in sides if s["side"] == "kvpress"), None)}


def _p(p) -> str:
    return "—" if p is None else f"{p:.2g}"


def format_table(summary: dict) -> str:
    lines = [("| prompt | side | variant | kept (cache) | accuracy [95 % CI] | Δ vs unpruned | McNemar p "
              "| TTFT ms | TTFT / unpruned | decode ms/token |"),
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in summary["rows"]:
        if "error" in r:
            lines.append(f"| {r['length']} | {r['side']} | {r['variant']} | — | {r['error'][:60]} "
                         "| — | — | — | — | — |")
            continue
        d = "—" if r["variant"] == "unpruned" else f"{100 * r['diff_vs_unpruned']:+.1f} pp"
        lines.append(
            f"| {r['length']} | {r['side']} | {r['variant']} | {r['kept']:.2f} ({r['cache_kept']:.2f}) "
            f"| {r['accuracy']:.3f} [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}] | {d} | {_p(r['mcnemar_p'])} "
            f"| {r['ttft_cpu_ms']:.2f} | {r['ttft_ratio_cpu']:.2f} | {r['decode_cpu_ms']:.2f} |")
    return "\n".join(lines)


def merge_dir(out: Path) -> dict:
    sides = [json.loads((out / f).read_text()) for f in ("ours.json", "kvpress.json") if (out / f).exists()]
    summary = merge(sides)
    if (out / "prepare.json").exists():
        summary["prepare"] = json.loads((out / "prepare.json").read_text())
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "table.md").write_text(format_table(summary) + "\n")
    print(format_table(summary))
    print("unpruned answers agree across sides:", summary["unpruned_agree"])
    return summary


# -- pool (several seeds) ---------------------------------------------------------------------------
def _cluster_bootstrap(d, n_resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """95 % percentile CI of the mean of d (seeds × prompts): the prompts are resampled, each
    with all its seeds (the seeds share the prompts)."""
    import numpy as np

    d = np.asarray(d, dtype=float)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, d.shape[1], size=(n_resamples, d.shape[1]))
    means = d[:, idx].mean(axis=(0, 2))
    lo, hi = np.quantile(means, [0.025, 0.975])
    return float(lo), float(hi)


def pool(runs: list[Path], n_resamples: int = 10_000) -> dict:
    """One row per (length, side, variant) over the runs (one per seed, same prompts)."""
    import numpy as np

    sides = {}  # side → [run's side json]
    for run in runs:
        for f in ("ours.json", "kvpress.json"):
            if (run / f).exists():
                s = json.loads((run / f).read_text())
                sides.setdefault(s["side"], []).append(s)
    rows, env = [], {}
    for side, per_run in sides.items():
        env[side] = per_run[0]["env"]
        # a run may hold only some lengths (e.g. seed0 at 2048 in one run, at 512/1024 in another)
        by = [{(r["length"], r["variant"]): r for r in s["rows"]} for s in per_run]
        for key in sorted({k for b in by for k in b}):
            L, variant = key
            have = [b for b in by if key in b]
            meta = have[0][key]
            row = {k: meta[k] for k in ("length", "variant", "side", "kept", "method") if k in meta}
            recs = [b[key] for b in have]
            errs = [r.get("error", "no prompts") for r in recs if not r.get("right")]
            if errs:
                rows.append({**row, "error": errs[0], "runs_ok": len(recs) - len(errs)})
                continue
            base = [b[(L, "unpruned")] for b in have]
            if len({len(r["right"]) for r in recs + base}) != 1:
                raise ValueError(f"{side} {key}: the runs differ in their number of prompts")
            right = np.array([r["right"] for r in recs], dtype=float)
            right0 = np.array([r["right"] for r in base], dtype=float)
            d = right - right0
            lo, hi = (0.0, 0.0) if variant == "unpruned" else _cluster_bootstrap(d, n_resamples)
            ratio = [t / t0 for r, r0 in zip(recs, base) for t, t0 in zip(r["ttft_cpu_ms"], r0["ttft_cpu_ms"])]
            ratio_w = [t / t0 for r, r0 in zip(recs, base) for t, t0 in zip(r["ttft_wall_ms"], r0["ttft_wall_ms"])]
            row.update({
                "seeds": len(recs), "n_per_seed": right.shape[1], "n": int(right.size),
                "accuracy": float(right.mean()), "accuracy_per_seed": right.mean(axis=1).tolist(),
                "unpruned_accuracy": float(right0.mean()),
                "diff_vs_unpruned": float(d.mean()), "diff_ci95": [lo, hi],
                "lost": int((d < 0).sum()), "gained": int((d > 0).sum()),
                "ttft_ratio_cpu_median": _median(ratio), "ttft_ratio_wall_median": _median(ratio_w),
                "ttft_cpu_ms_median": _median([t for r in recs for t in r["ttft_cpu_ms"]]),
                "decode_cpu_ms_median": _median([t for r in recs for t in r["decode_cpu_ms"]]),
                "decode_wall_ms_median": _median([t for r in recs for t in r["decode_wall_ms"]]),
                "cache_kept": float(np.mean([x for r in recs for x in r["cache_kept"]]))})
            rows.append(row)
    rows.sort(key=lambda r: (r["length"], r["side"] != "attnprune", r["variant"] != "unpruned",
                             r.get("method", ""), r.get("kept", 1.0)))
    question = {json.loads((run / "kvpress.json").read_text()).get("question") for run in runs
                if (run / "kvpress.json").exists()}
    return {"runs": [str(r) for r in runs], "rows": rows, "env": env, "kvpress_question": sorted(question),
            "bootstrap": {"resamples": n_resamples, "unit": "prompt (all seeds of a prompt together)",
                          "interval": "percentile 95 %"},
            "ttft_ratio": "median over (seed, prompt) of TTFT / the same prompt's unpruned TTFT on the same side "
                          "(CPU clock, variants interleaved per prompt)"}


def format_pooled(summary: dict) -> str:
    head = ("| prompt | side | variant | kept (cache) | accuracy | Δ vs unpruned [95 % CI] | "
            "TTFT / unpruned | decode ms/token |")
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in summary["rows"]:
        if "error" in r:
            lines.append(f"| {r['length']} | {r['side']} | {r['variant']} | — | {r['error'][:60]} | — | — | — |")
            continue
        d = ("—" if r["variant"] == "unpruned" else
             f"{100 * r['diff_vs_unpruned']:+.1f} pp [{100 * r['diff_ci95'][0]:+.1f}, {100 * r['diff_ci95'][1]:+.1f}]")
        lines.append(f"| {r['length']} | {r['side']} | {r['variant']} | {r['kept']:.2f} ({r['cache_kept']:.2f}) "
                     f"| {r['accuracy']:.3f} | {d} | {r['ttft_ratio_cpu_median']:.2f} | {r['decode_cpu_ms_median']:.2f} |")
    return "\n".join(lines)


def pool_dir(out: Path, runs: list[Path], command: str | None) -> dict:
    summary = pool(runs)
    summary["command"] = command
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    table = format_pooled(summary)
    head = (f"**Source** (`kvpress-2k`): `{out}`, written by `{command}`\n\n" if command else "")
    (out / "table.md").write_text(head + table + "\n")
    print(head + table)
    return summary


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("step", choices=("all", "prepare", "ours", "kvpress", "merge", "pool"))
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--cache", type=Path, default=Path("/tmp/attnprune_passkey_cache"),
                    help="folder of model.safetensors (trained there if missing)")
    ap.add_argument("--model-dir", type=Path, default=None,
                    help="a passkey --train-only folder: model.safetensors + config.json/yaml (instead of --cache)")
    ap.add_argument("--runs", default="", help="pool: the run folders (one per seed), comma-separated")
    ap.add_argument("--command", default=None, help="pool: the command(s) to name in table.md's caption")
    ap.add_argument("--kvpress-python", default="/tmp/kvp/bin/python")
    ap.add_argument("--lengths", default="96,192")
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--decode-tokens", type=int, default=8)
    ap.add_argument("--kvpress-question", choices=("after", "inside"), default="after")
    ap.add_argument("--presses", default=",".join(PRESSES))
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    common = ["--out", str(a.out), "--decode-tokens", str(a.decode_tokens)]
    if a.step == "pool":
        pool_dir(a.out, [Path(x) for x in a.runs.split(",") if x], a.command)
    elif a.step == "prepare":
        prepare(a.out, a.cache, [int(x) for x in a.lengths.split(",")], a.n, a.model_dir)
    elif a.step == "ours":
        ours(a.out, a.decode_tokens)
    elif a.step == "kvpress":
        kvpress_side(a.out, a.decode_tokens, a.kvpress_question, a.presses.split(","))
    elif a.step == "merge":
        merge_dir(a.out)
    else:
        me = [__file__]
        prepare(a.out, a.cache, [int(x) for x in a.lengths.split(",")], a.n, a.model_dir)
        subprocess.run([sys.executable, *me, "ours", *common], check=True)
        subprocess.run([a.kvpress_python, *me, "kvpress", *common, "--kvpress-question", a.kvpress_question,
                        "--presses", a.presses], check=True)
        merge_dir(a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
