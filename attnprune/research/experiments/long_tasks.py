"""Prefill pruning on the long-context task suite (issue 33): does the pruned prompt keep what
the answer needs?

A causal LM (an HF folder) answers the examples of :mod:`attnprune.research.data.long_tasks`
greedily through :mod:`attnprune.prefill`, in these variants, on the same examples:

    full                 keep 1.0 (the stock model's greedy tokens)
    fastv K / gemfilter K   keep ρ of the prompt by layer K's window attention (``keeps``)
    … random             the same budget, sinks and window, random scores (``random_control``)
    recent K             only the last ⌊ρ · n⌋ tokens (``recent_control``: GemFilter with
                         that window, no sinks, scored at layer 0, so every layer runs on them)

``question``: "prompt" prefills ``head + tail`` (the question is inside the compressed prompt
and, after the context, in the scoring window); "after" prefills the ``head`` alone and
decodes the ``tail`` through the pruned cache (the question comes after compression, as in
kvpress's question-agnostic mode). The answer is greedy, as many tokens as the target has,
and scored by the example's exact-match check. Per (task, length, variant): accuracy with its
percentile-bootstrap 95 % CI, and the paired difference against full (bootstrap CI over the
examples, lost / gained, exact McNemar). Written atomically into the results folder:
``summary.json``, ``predictions.json`` (each example's output and right / wrong per variant)
and ``table.md``.

    python -m attnprune.research.experiments.long_tasks --model DIR --tasks multikey,vartrack \\
        --lengths 1024 --n 64 --out results
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from attnprune.research.data import long_tasks as lt

VARIANT_KINDS = ("full", "attention", "random", "recent")


@dataclass(frozen=True)
class LongTasksConfig:
    """The model, the examples and the pruning grid. ``model``: an HF causal-LM folder;
    ``tokenizer``: "bytes" (byte-level models: ids 0 … 255) or an HF tokenizer folder;
    ``fastv_layer`` / ``gemfilter_layer``: K (none: :class:`attnprune.prefill.PrefillConfig`'s
    defaults); ``max_new_tokens`` 0: each example's target length in tokens."""

    model: str = ""
    tokenizer: str = "bytes"
    tasks: tuple[str, ...] = lt.TASKS
    lengths: tuple[int, ...] = (1024,)
    n: int = 64
    split: str = "validation"
    seed: int = 0
    placement: str = "after"
    question: str = "prompt"
    methods: tuple[str, ...] = ("fastv", "gemfilter")
    keeps: tuple[float, ...] = (0.5, 0.25)
    fastv_layer: int | None = None
    gemfilter_layer: int | None = None
    window: int = 16
    sinks: int = 4
    random_control: bool = True
    recent_control: bool = True
    max_new_tokens: int = 0
    code_packages: tuple[str, ...] = lt.DEFAULT_PACKAGES
    threads: int = 1
    n_resamples: int = 10_000

    def __post_init__(self):
        for t in self.tasks:
            if t not in lt.TASKS:
                raise ValueError(f"tasks: each one of {', '.join(lt.TASKS)}, got {t!r}")
        if self.split not in lt.SPLITS:
            raise ValueError(f"split: one of {', '.join(lt.SPLITS)}, got {self.split!r}")
        if self.placement not in lt.PLACEMENTS:
            raise ValueError(f"placement: one of {', '.join(lt.PLACEMENTS)}, got {self.placement!r}")
        if self.question not in ("prompt", "after"):
            raise ValueError(f"question: 'prompt' or 'after', got {self.question!r}")
        for m in self.methods:
            if m not in ("fastv", "gemfilter"):
                raise ValueError(f"methods: each 'fastv' or 'gemfilter', got {m!r}")
        for k in self.keeps:
            if not 0.0 < k < 1.0:
                raise ValueError(f"keeps: each a ratio in (0, 1), got {k!r}")
        for L in self.lengths:
            if L < 16:
                raise ValueError(f"lengths: each ≥ 16 tokens, got {L}")
        if self.n < 1 or self.max_new_tokens < 0 or self.threads < 0 or self.n_resamples < 1:
            raise ValueError("n / max_new_tokens / threads / n_resamples: n ≥ 1, the others ≥ 0 "
                             f"(n_resamples ≥ 1), got {self.n} / {self.max_new_tokens} / "
                             f"{self.threads} / {self.n_resamples}")


def load_tokenizer(name: str):
    """"bytes": :class:`attnprune.research.data.long_tasks.ByteTokenizer`; else an HF
    tokenizer folder."""
    if name == "bytes":
        return lt.ByteTokenizer()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name)


def variants(cfg: LongTasksConfig) -> dict[str, dict]:
    """label → (kind, prefill options; for "recent" the ratio, resolved per prompt)."""
    out = {"full": {"kind": "full", "keep": 1.0}}
    layers = {"fastv": cfg.fastv_layer, "gemfilter": cfg.gemfilter_layer}
    for score in ("attention", "random") if cfg.random_control else ("attention",):
        for m in cfg.methods:
            for k in cfg.keeps:
                label = f"{m} {k:g}" + (" random" if score == "random" else "")
                out[label] = {"kind": score, "keep": float(k), "method": m, "layer": layers[m],
                              "window": cfg.window, "sinks": cfg.sinks, "score": score}
    if cfg.recent_control:
        for k in cfg.keeps:
            out[f"recent {k:g}"] = {"kind": "recent", "keep": float(k)}
    return out


def _prefill_options(spec: dict, n_prefilled: int) -> dict:
    opts = {k: v for k, v in spec.items() if k != "kind"}
    if spec["kind"] == "recent":  # the last k tokens: the window is the whole budget
        k = max(1, int(spec["keep"] * n_prefilled))
        return {"keep": k, "method": "gemfilter", "layer": 0, "window": k, "sinks": 0}
    if opts.get("layer") is None:
        opts.pop("layer", None)
    return opts


@torch.inference_mode()
def answer(model: nn.Module, head: list[int], tail: list[int], max_new_tokens: int,
           question: str = "prompt", **options) -> list[int]:
    """Greedy tokens after a pruned prefill: of ``head + tail`` (``question`` "prompt"), or of
    ``head`` with ``tail`` then decoded through the pruned cache ("after"). ``options``:
    :class:`attnprune.prefill.PrefillConfig`'s fields."""
    from attnprune.prefill import decode, prefill

    if question == "prompt" or not tail:
        state = prefill(model, torch.tensor([head + tail]), max_new_tokens=max_new_tokens, **options)
        logits = state.logits
    else:
        state = prefill(model, torch.tensor([head]), max_new_tokens=len(tail) + max_new_tokens, **options)
        for t in tail:
            logits = decode(state, torch.tensor([[t]]))
    out: list[int] = []
    for i in range(max_new_tokens):
        out.append(int(logits[0].argmax()))
        if i < max_new_tokens - 1:
            logits = decode(state, torch.tensor([[out[-1]]]))
    return out


def encode(tokenizer, ex: lt.LongExample) -> tuple[list[int], list[int], int]:
    """(head ids, tail ids, target length in tokens), head and tail encoded apart (as the
    generator measured them)."""
    enc = lambda s: list(tokenizer.encode(s, add_special_tokens=False)) if s else []
    return enc(ex.head), enc(ex.tail), len(enc(ex.target))


def evaluate(model: nn.Module, tokenizer, examples: list[lt.LongExample], specs: dict[str, dict],
             question: str = "prompt", max_new_tokens: int = 0, progress=None) -> dict[str, dict]:
    """label → {"right": per-example bools, "outputs": texts}: every variant on the same
    examples."""
    res = {label: {"right": [], "outputs": []} for label in specs}
    for i, ex in enumerate(examples):
        head, tail, n_target = encode(tokenizer, ex)
        n_new = max_new_tokens or n_target
        n_prefilled = len(head) + (len(tail) if question == "prompt" else 0)
        for label, spec in specs.items():
            ids = answer(model, head, tail, n_new, question, **_prefill_options(spec, n_prefilled))
            text = tokenizer.decode(ids)
            res[label]["outputs"].append(text)
            res[label]["right"].append(bool(ex.check(text)))
        if progress and (i + 1) % 16 == 0:
            progress(f"  {i + 1}/{len(examples)} " + " ".join(
                f"{k}:{sum(v['right']) / len(v['right']):.2f}" for k, v in res.items()))
    return res


def rows_for(task: str, length: int, specs: dict[str, dict], res: dict[str, dict],
             n_resamples: int = 10_000) -> list[dict]:
    """One row per variant: accuracy with its bootstrap 95 % CI, and the paired difference
    against "full" (:func:`attnprune.research.experiments.passkey.pooled_difference`)."""
    import numpy as np

    from attnprune.research.experiments.passkey import pooled_difference
    from attnprune.runs.stats import bootstrap_ci

    full = res["full"]["right"]
    rows = []
    for label, spec in specs.items():
        right = res[label]["right"]
        n = len(right)
        acc = sum(right) / n
        if 0 < sum(right) < n:
            ci = bootstrap_ci(np.ones(n, dtype=int), np.asarray(right, dtype=int),
                              n_resamples=n_resamples, seed=0)
            low, high = float(ci.low), float(ci.high)
        else:  # every resample is the same
            low = high = acc
        row = {"task": task, "length": length, "variant": label, "kind": spec["kind"],
               "options": {k: v for k, v in spec.items() if k != "kind"}, "n": n,
               "accuracy": acc, "accuracy_ci95": [low, high]}
        if label != "full":
            d = pooled_difference(right, full, n_resamples=n_resamples)
            row.update({"diff": d["diff"], "diff_ci95": d["ci95"], "lost": d["lost"],
                        "gained": d["gained"], "mcnemar_p": d["mcnemar_p"]})
        rows.append(row)
    return rows


def load_model(path: str) -> nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa").float().eval()


def run(cfg: LongTasksConfig, out, progress=print) -> dict:
    """Every task × length × variant on ``cfg.n`` examples; writes the results folder
    (``threads`` > 0: torch's thread count for the run, restored after it)."""
    if not cfg.model:
        raise ValueError("model: give an HF causal-LM folder (--model DIR)")
    threads = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        return _run(cfg, out, progress)
    finally:
        torch.set_num_threads(threads)


def _run(cfg: LongTasksConfig, out, progress) -> dict:
    from attnprune.measure import env_info

    tok = load_tokenizer(cfg.tokenizer)
    sets = {(task, L): lt.generate(task, cfg.n, L, split=cfg.split, seed=cfg.seed,
                                   placement=cfg.placement,
                                   tokenizer=None if cfg.tokenizer == "bytes" else tok,
                                   **({"code_packages": cfg.code_packages} if task == "code" else {}))
            for task in cfg.tasks for L in cfg.lengths}  # bad lengths fail before the model loads
    model = load_model(cfg.model)
    specs = variants(cfg)
    rows, predictions = [], []
    for (task, L), exs in sets.items():
        if progress:
            progress(f"{task} L {L}: {len(exs)} examples, {len(specs)} variants")
        res = evaluate(model, tok, exs, specs, cfg.question, cfg.max_new_tokens, progress)
        rows += rows_for(task, L, specs, res, cfg.n_resamples)
        predictions.append({"task": task, "length": L, "answers": [list(e.answers) for e in exs],
                            "meta": [e.meta for e in exs], **{f"{k}": v for k, v in res.items()}})
        if progress:
            for r in rows[-len(specs):]:
                progress(f"  {r['variant']:<20} {r['accuracy']:.3f}"
                         + (f" Δ {r['diff']:+.3f} [{r['diff_ci95'][0]:+.3f}, {r['diff_ci95'][1]:+.3f}]"
                            if "diff" in r else ""))
    summary = {"command": "long-tasks", "env": env_info("cpu"), "config": asdict(cfg),
               "ci_method": "percentile bootstrap over the examples (attnprune.runs.stats, "
               f"{cfg.n_resamples} resamples); paired for Δ vs full; exact McNemar", "rows": rows}
    out.write_json("predictions.json", predictions)
    out.write_text("table.md", markdown_table(summary) + "\n")
    out.write_json("summary.json", summary)  # last: its presence marks a finished run
    return summary


def markdown_table(summary: dict) -> str:
    """The rows as a markdown table (accuracy [CI], Δ vs full [CI], lost / gained)."""
    lines = ["| task | length | variant | accuracy [95 % CI] | Δ vs full [95 % CI] | lost / gained |",
             "|---|---|---|---|---|---|"]
    for r in summary["rows"]:
        acc = f"{r['accuracy']:.3f} [{r['accuracy_ci95'][0]:.3f}, {r['accuracy_ci95'][1]:.3f}]"
        if "diff" in r:
            d = f"{r['diff']:+.3f} [{r['diff_ci95'][0]:+.3f}, {r['diff_ci95'][1]:+.3f}]"
            lg = f"{r['lost']} / {r['gained']}"
        else:
            d = lg = "—"
        lines.append(f"| {r['task']} | {r['length']} | {r['variant']} | {acc} | {d} | {lg} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """``python -m attnprune.research.experiments.long_tasks --model DIR [--key value ...] --out DIR``."""
    from attnprune.runs.command import run_command

    return run_command(argv, LongTasksConfig, "long-tasks", lambda cfg, out: (run(cfg, out), None)[1])


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
