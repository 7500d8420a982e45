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
and scored by the example's exact-match check; the ``code`` task is teacher-forced instead
(which defined name comes next is often a guess, so exact match alone is unfair): its rows add
the identifier's bits per byte and their paired difference against full (cluster-bootstrap
CI), and "right" there means every identifier token was the model's top choice. Per (task, length, variant): accuracy with its
percentile-bootstrap 95 % CI, and the paired difference against full (bootstrap CI over the
examples, lost / gained, exact McNemar). Written atomically into the results folder:
``summary.json``, ``predictions.json`` (each example's output and right / wrong per variant)
and ``table.md``.

Seeds: ``model`` may name several folders, comma-separated (one model per training seed); all
run the same examples, and each row pools them: accuracy over every (seed, example), its CI and
the paired differences by a bootstrap that resamples the examples and keeps a prompt's seeds
together (a cluster bootstrap), lost / gained and the exact McNemar p over the pooled pairs.
``shallow``: as many folders, models with fewer layers trained by the same recipe (seed for
seed): their unpruned answers are the variant "shallow", paired with the deep model's.
``controls``: each attention-scored variant against the random-score and the recent-only
variant at its keep, Δ with its cluster-bootstrap CI, McNemar p, Holm-adjusted over the run.
``search_layers``: each method's cut layer K is chosen first on the *validation* split
(``search_n`` examples per task, every keep, pooled over the seeds; ties go to the earlier,
cheaper layer) and then fixed for the split evaluated. Timings (batch 1, CPU clock): time to
first token (the prefill, and for ``question`` "after" the decoded question, to the first
answer token's logits) and decode ms/token, per example; rows hold the median of each
variant's TTFT over the same example's unpruned TTFT, and the median decode ms/token.
Finished seeds are saved under ``runs/`` and reused when the folder is resumed.

    python -m attnprune.research.experiments.long_tasks --model DIR --tasks multikey,vartrack \\
        --lengths 1024 --n 64 --out results
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from attnprune.research.data import long_tasks as lt


@dataclass(frozen=True)
class LongTasksConfig:
    """The model, the examples and the pruning grid. ``model``: an HF causal-LM folder;
    ``tokenizer``: "bytes" (byte-level models: ids 0 … 255) or an HF tokenizer folder;
    ``fastv_layer`` / ``gemfilter_layer``: K (none: :class:`attnprune.prefill.PrefillConfig`'s
    defaults); ``max_new_tokens`` 0: each example's target length in tokens."""

    model: str = ""
    shallow: str = ""
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
    search_layers: bool = False
    search_n: int = 32

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
        if self.shallow and len(self.shallow.split(",")) != len(self.model.split(",")):
            raise ValueError(f"shallow: one folder per model, comma-separated ({len(self.model.split(','))} "
                             f"models), got {len(self.shallow.split(','))}")
        if self.search_layers and (self.fastv_layer is not None or self.gemfilter_layer is not None):
            raise ValueError("search_layers: the cut layers are searched, so give neither fastv_layer "
                             "nor gemfilter_layer")
        # a length too short for a task fails here, before any work (in the tokenizer's tokens)
        synthetic = [t for t in self.tasks if t in lt.SYNTHETIC]
        tok = None
        if synthetic and self.tokenizer != "bytes":
            try:
                tok = load_tokenizer(self.tokenizer)
            except (OSError, ValueError) as e:
                raise ValueError(f"tokenizer: cannot load {self.tokenizer!r}: {e}") from None
        for task in synthetic:
            for L in self.lengths:
                try:
                    lt.example(task, L, 0, split=self.split, seed=self.seed, placement=self.placement,
                               tokenizer=tok)
                except ValueError as e:
                    raise ValueError(f"lengths: {e}") from None
        if self.search_n < 1:
            raise ValueError(f"search_n: ≥ 1, got {self.search_n}")
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


def check_tokenizer(name: str, tok, folders: list[str]) -> None:
    """Every model reads the ids of ``tok``: its vocabulary size matches, and a model folder
    saved with its own tokenizer (``tokenizer.json``) has this one (a ValueError naming
    ``tokenizer`` otherwise, before any example runs)."""
    from transformers import AutoConfig

    size = 256 if name == "bytes" else len(tok)
    for folder in folders:
        if (Path(folder) / "tokenizer.json").exists():
            if name == "bytes":
                raise ValueError(f"tokenizer: the model in {folder} was saved with its own tokenizer; "
                                 f"pass tokenizer={folder}")
            if load_tokenizer(folder).get_vocab() != tok.get_vocab():
                raise ValueError(f"tokenizer: {name} is not the tokenizer saved with the model in {folder}")
        n = AutoConfig.from_pretrained(folder).vocab_size
        if n != size:
            raise ValueError(f"tokenizer: {name!r} has {size} ids, the model in {folder} {n}")


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
           question: str = "prompt", timings: dict | None = None, target: list[int] | None = None,
           **options) -> list[int]:
    """Greedy tokens after a pruned prefill: of ``head + tail`` (``question`` "prompt"), or of
    ``head`` with ``tail`` then decoded through the pruned cache ("after"). ``options``:
    :class:`attnprune.prefill.PrefillConfig`'s fields; ``keep`` 1.0 runs the stock forward and
    its DynamicCache (no scoring pass), so the unpruned TTFT is what a user of the model pays.
    ``timings``: filled with "ttft_s" (to the first answer token's logits) and "decode_s"
    (the mean of the later steps; None for a one-token answer). ``target``: teacher forcing:
    the decode steps read ``target``'s tokens instead of the model's, the tokens returned are
    the model's top choices at each step, and ``timings["bits"]`` the target's −log₂ p."""
    # the prompt's tensors are built on the model's device (on a GPU a CPU tensor crashed the
    # first in-training check: issue 46; tests/test_gpu_job.py runs this with a meta model)
    device = next(model.parameters()).device

    def tensor(ids: list[int]) -> torch.Tensor:
        return torch.tensor([ids], device=device)

    if options.get("keep") == 1.0:
        from transformers import DynamicCache

        from attnprune.hosts.hf_causal import cache_kwargs

        cache = DynamicCache()

        def step(ids: list[int]) -> torch.Tensor:
            return model(input_ids=tensor(ids), use_cache=True, **cache_kwargs(cache)).logits[0, -1]

        def start(ids: list[int], n_new: int) -> torch.Tensor:
            return step(ids)
    else:
        from attnprune.prefill import decode, prefill

        state = None

        def step(ids: list[int]) -> torch.Tensor:
            return decode(state, tensor(ids))[0]

        def start(ids: list[int], n_new: int) -> torch.Tensor:
            nonlocal state
            state = prefill(model, tensor(ids), max_new_tokens=n_new, **options)
            return state.logits[0]
    return _greedy(start, step, head, tail, max_new_tokens, question, timings, target)


def _greedy(start, step, head: list[int], tail: list[int], max_new_tokens: int, question: str,
            timings: dict | None, target: list[int] | None = None) -> list[int]:
    """The timed greedy (or, with ``target``, teacher-forced) loop of :func:`answer`:
    ``start(ids, n_new)`` prefills and returns the last logits, ``step(ids)`` decodes one token
    through the cache."""
    import time

    t0 = time.perf_counter()
    if question == "prompt" or not tail:
        logits = start(head + tail, max_new_tokens)
    else:
        logits = start(head, len(tail) + max_new_tokens)
        for t in tail:
            logits = step([t])
    out: list[int] = [int(logits.argmax())]
    t1 = time.perf_counter()
    if target is not None:
        if len(target) != max_new_tokens:
            raise ValueError(f"target: {len(target)} tokens, max_new_tokens {max_new_tokens}")
        nats = -float(torch.log_softmax(logits.float(), -1)[target[0]])
        for i in range(1, max_new_tokens):
            logits = step([target[i - 1]])
            nats -= float(torch.log_softmax(logits.float(), -1)[target[i]])
            out.append(int(logits.argmax()))
        if timings is not None:
            timings["bits"] = nats / math.log(2)
    else:
        for _ in range(max_new_tokens - 1):
            out.append(int(step([out[-1]]).argmax()))
    if timings is not None:
        timings["ttft_s"] = t1 - t0
        timings["decode_s"] = (time.perf_counter() - t1) / (max_new_tokens - 1) if max_new_tokens > 1 else None
    return out


def encode(tokenizer, ex: lt.LongExample) -> tuple[list[int], list[int], int]:
    """(head ids, tail ids, target length in tokens), head and tail encoded apart (as the
    generator measured them)."""
    enc = lambda s: list(tokenizer.encode(s, add_special_tokens=False)) if s else []
    return enc(ex.head), enc(ex.tail), len(enc(ex.target))


def evaluate(model: nn.Module, tokenizer, examples: list[lt.LongExample], specs: dict[str, dict],
             question: str = "prompt", max_new_tokens: int = 0, progress=None) -> dict[str, dict]:
    """label → {"right": per-example bools, "outputs": texts, "ttft_s", "decode_s": per-example
    times}: every variant on the same examples, one after the other per example (interleaved,
    so a change of load hits all variants alike), after an untimed warm-up round.

    The code task is scored teacher-forced (its exact match is a guess when several defined
    names fit): "bits_per_byte", the identifier's −log₂ p over its UTF-8 bytes, and "right"
    when every one of its tokens is the model's top choice (what greedy decoding would write)."""
    res = {label: {"right": [], "outputs": [], "ttft_s": [], "decode_s": []} for label in specs}
    if any(ex.task == "code" for ex in examples):
        for r in res.values():
            r["bits_per_byte"] = []
    if examples:  # a warm-up round on the first example, untimed (first-call costs)
        head, tail, n_target = encode(tokenizer, examples[0])
        n_prefilled = len(head) + (len(tail) if question == "prompt" else 0)
        for spec in specs.values():
            answer(model, head, tail, max_new_tokens or n_target, question,
                   **_prefill_options(spec, n_prefilled))
    for i, ex in enumerate(examples):
        head, tail, n_target = encode(tokenizer, ex)
        n_new = max_new_tokens or n_target
        n_prefilled = len(head) + (len(tail) if question == "prompt" else 0)
        target = list(tokenizer.encode(ex.target, add_special_tokens=False)) if ex.task == "code" else None
        for label, spec in specs.items():
            t: dict = {}
            ids = answer(model, head, tail, len(target) if target else n_new, question, timings=t,
                         target=target, **_prefill_options(spec, n_prefilled))
            text = tokenizer.decode(ids)
            r = res[label]
            r["outputs"].append(text)
            r["right"].append(ids == target if target else bool(ex.check(text)))
            if "bits_per_byte" in r:
                r["bits_per_byte"].append(t["bits"] / len(ex.target.encode()) if target else None)
            r["ttft_s"].append(t["ttft_s"])
            r["decode_s"].append(t["decode_s"])
        if progress and (i + 1) % 16 == 0:
            progress(f"  {i + 1}/{len(examples)} " + " ".join(
                f"{k}:{sum(v['right']) / len(v['right']):.2f}" for k, v in res.items()))
    return res


def _per_seed(right):
    """(seeds, examples) 0/1 array from one list of bools or a list of them (one per seed)."""
    import numpy as np

    a = np.asarray(right, dtype=float)
    return a[None, :] if a.ndim == 1 else a


def cluster_bootstrap(x, n_resamples: int = 10_000, seed: int = 0) -> list[float]:
    """Percentile 95 % CI of the mean of ``x`` (seeds × examples), resampling the examples
    (columns) and keeping each example's seeds together. Written here: scipy's bootstrap
    resamples independent observations, not clusters."""
    import numpy as np

    per = np.asarray(x, dtype=float).mean(0)
    if np.all(per == per[0]):  # every resample is the same
        return [float(per[0]), float(per[0])]
    rng = np.random.default_rng(seed)
    means = np.empty(n_resamples)
    for s in range(0, n_resamples, 1000):  # in chunks: bounded memory at any example count
        idx = rng.integers(0, len(per), (min(1000, n_resamples - s), len(per)))
        means[s:s + len(idx)] = per[idx].mean(1)
    low, high = np.percentile(means, [2.5, 97.5])
    return [float(low), float(high)]


def paired(a, b, n_resamples: int = 10_000) -> dict:
    """A − B over paired (seed, example) outcomes: Δ, its cluster-bootstrap 95 % CI, the
    pooled discordant counts (lost: B right and A wrong) and the exact McNemar p."""
    from attnprune.runs.stats import mcnemar

    a, b = _per_seed(a), _per_seed(b)
    if a.shape != b.shape:
        raise ValueError(f"paired: the two variants ran different examples ({a.shape} vs {b.shape})")
    lost, gained = int(((b == 1) & (a == 0)).sum()), int(((b == 0) & (a == 1)).sum())
    return {"diff": float(a.mean() - b.mean()), "diff_ci95": cluster_bootstrap(a - b, n_resamples),
            "lost": lost, "gained": gained,
            "mcnemar_p": mcnemar(lost, gained).pvalue if lost + gained else 1.0}


def _median_ratio(num, den) -> float | None:
    import numpy as np

    pairs = [(x, y) for xs, ys in zip(num, den) for x, y in zip(xs, ys) if x is not None and y]
    return float(np.median([x / y for x, y in pairs])) if pairs else None


def _median_ms(values) -> float | None:
    import numpy as np

    v = [x for xs in values for x in xs if x is not None]
    return float(np.median(v) * 1e3) if v else None


def rows_for(task: str, length: int, specs: dict[str, dict], res: dict[str, dict],
             n_resamples: int = 10_000) -> list[dict]:
    """One row per variant: accuracy with its 95 % CI and the paired difference against
    "full", pooled over the seeds (``res[label]["right"]``: one list of bools, or one per
    seed; :func:`cluster_bootstrap`, :func:`paired`); the median TTFT ratio to the same
    example's unpruned TTFT and the median decode ms/token where ``res`` has timings."""
    full = _per_seed(res["full"]["right"])
    rows = []
    for label, spec in specs.items():
        right = _per_seed(res[label]["right"])
        row = {"task": task, "length": length, "variant": label, "kind": spec["kind"],
               "options": {k: v for k, v in spec.items() if k != "kind"}, "n": right.shape[1],
               "seeds": right.shape[0], "accuracy": float(right.mean()),
               "accuracy_ci95": cluster_bootstrap(right, n_resamples)}
        if label != "full":
            row.update(paired(right, full, n_resamples))
        if res[label].get("bits_per_byte") is not None:  # the code task: teacher-forced bits per byte
            bpb = _per_seed(res[label]["bits_per_byte"])
            row["bits_per_byte"] = float(bpb.mean())
            if label != "full":
                d = bpb - _per_seed(res["full"]["bits_per_byte"])
                row["bits_per_byte_diff"] = float(d.mean())
                row["bits_per_byte_diff_ci95"] = cluster_bootstrap(d, n_resamples)
        if "ttft_s" in res[label]:
            seeds = lambda v: v if v and isinstance(v[0], list) else [v]
            row["ttft_vs_full"] = _median_ratio(seeds(res[label]["ttft_s"]), seeds(res["full"]["ttft_s"]))
            row["decode_ms_per_token"] = _median_ms(seeds(res[label]["decode_s"]))
        rows.append(row)
    return rows


def control_rows(task: str, length: int, specs: dict[str, dict], res: dict[str, dict],
                 n_resamples: int = 10_000) -> list[dict]:
    """Each attention-scored variant against its controls at the same keep: the random-score
    variant (same method, layer, sinks and window) and the recent-only one (Δ > 0: the
    scoring kept what the control lost)."""
    out = []
    for label, spec in specs.items():
        if spec["kind"] != "attention":
            continue
        for control in (f"{label} random", f"recent {spec['keep']:g}"):
            if control in specs:
                out.append({"task": task, "length": length, "variant": label, "control": control,
                            **paired(res[label]["right"], res[control]["right"], n_resamples)})
    return out


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


def _examples(cfg: LongTasksConfig, tok, split: str, n: int) -> dict[tuple[str, int], list]:
    return {(task, L): lt.generate(task, n, L, split=split, seed=cfg.seed, placement=cfg.placement,
                                   tokenizer=None if cfg.tokenizer == "bytes" else tok,
                                   **({"code_packages": cfg.code_packages} if task == "code" else {}))
            for task in cfg.tasks for L in cfg.lengths}


def search_layers(cfg: LongTasksConfig, models: list[str], tok, progress) -> dict:
    """Each method's cut layer, chosen on the validation split: the layer K in 1 … L − 1 with
    the highest accuracy pooled over the models, tasks, lengths and keeps (ties: the earlier
    K). Returns {"chosen": {method: K}, "accuracy": {method: {K: accuracy}}, "n": …}."""
    sets = _examples(cfg, tok, "validation", cfg.search_n)
    hits: dict[str, dict[int, list[float]]] = {m: {} for m in cfg.methods}
    for path in models:
        model = load_model(path)
        n_layers = model.config.num_hidden_layers
        for exs in sets.values():
            specs = {f"{m} {k:g} K{K}": {"kind": "attention", "keep": float(k), "method": m, "layer": K,
                                          "window": cfg.window, "sinks": cfg.sinks, "score": "attention"}
                     for m in cfg.methods for k in cfg.keeps for K in range(1, n_layers)}
            res = evaluate(model, tok, exs, specs, cfg.question, cfg.max_new_tokens)
            for label, spec in specs.items():
                hits[spec["method"]].setdefault(spec["layer"], []).extend(res[label]["right"])
        if progress:
            progress(f"layer search: {path} done")
    acc = {m: {K: sum(v) / len(v) for K, v in sorted(by.items())} for m, by in hits.items()}
    chosen = {m: max(by, key=lambda K: (by[K], -K)) for m, by in acc.items()}
    if progress:
        progress("layer search (validation): " + "; ".join(
            f"{m} K={chosen[m]} (" + ", ".join(f"{K}: {a:.3f}" for K, a in by.items()) + ")"
            for m, by in acc.items()))
    return {"chosen": chosen, "accuracy": acc, "n": cfg.search_n, "split": "validation"}


def _run(cfg: LongTasksConfig, out, progress) -> dict:
    from dataclasses import replace

    from attnprune.measure import env_info
    from attnprune.runs.stats import holm

    tok = load_tokenizer(cfg.tokenizer)
    sets = _examples(cfg, tok, cfg.split, cfg.n)  # bad lengths fail before a model loads
    models = [m for m in cfg.model.split(",") if m]
    shallow = [m for m in cfg.shallow.split(",") if m]
    check_tokenizer(cfg.tokenizer, tok, models + shallow)
    search = None
    if cfg.search_layers:
        search = out.load_run("layer_search") if out.run_done("layer_search") else None
        if search is None:
            search = search_layers(cfg, models, tok, progress)
            out.save_run("layer_search", search)
        specs = variants(replace(cfg, search_layers=False, fastv_layer=search["chosen"].get("fastv"),
                                 gemfilter_layer=search["chosen"].get("gemfilter")))
    else:
        specs = variants(cfg)
    per_seed = []
    for i, path in enumerate(models):
        key = f"seed{i}"
        if out.run_done(key):
            per_seed.append(out.load_run(key))
            continue
        model = load_model(path)
        record = {"model": path, "results": {}}
        for (task, L), exs in sets.items():
            if progress:
                progress(f"{path}: {task} L {L}: {len(exs)} examples, {len(specs)} variants")
            res = evaluate(model, tok, exs, specs, cfg.question, cfg.max_new_tokens, progress)
            if shallow:
                res["shallow"] = evaluate(load_model(shallow[i]), tok, exs, {"shallow": specs["full"]},
                                          cfg.question, cfg.max_new_tokens)["shallow"]
            record["results"][f"{task}:{L}"] = res
        out.save_run(key, record)
        per_seed.append(record)
    all_specs = dict(specs, **({"shallow": {"kind": "shallow", "keep": 1.0}} if shallow else {}))
    rows, controls, predictions = [], [], []
    for (task, L), exs in sets.items():
        fields = ("right", "ttft_s", "decode_s") + (("bits_per_byte",) if task == "code" else ())
        pooled = {label: {f: [r["results"][f"{task}:{L}"][label][f] for r in per_seed]
                          for f in fields} for label in all_specs}
        rows += rows_for(task, L, all_specs, pooled, cfg.n_resamples)
        controls += control_rows(task, L, all_specs, pooled, cfg.n_resamples)
        predictions.append({"task": task, "length": L, "answers": [list(e.answers) for e in exs],
                            "meta": [e.meta for e in exs],
                            "seeds": [{label: {f: r["results"][f"{task}:{L}"][label][f]
                                               for f in ("right", "outputs", "bits_per_byte")
                                               if f in r["results"][f"{task}:{L}"][label]}
                                       for label in all_specs} for r in per_seed]})
        if progress:
            for r in rows[-len(all_specs):]:
                progress(f"  {task:<10} {r['variant']:<20} {r['accuracy']:.3f}"
                         + (f" Δ {r['diff']:+.3f} [{r['diff_ci95'][0]:+.3f}, {r['diff_ci95'][1]:+.3f}]"
                            if "diff" in r else ""))
    if controls:
        for c, p in zip(controls, holm([c["mcnemar_p"] for c in controls])):
            c["p_holm"] = float(p)
    summary = {"command": "long-tasks", "env": env_info("cpu"), "config": asdict(cfg),
               "models": models, "shallow": shallow, "layer_search": search,
               "ci_method": "percentile bootstrap over the examples, each example's seeds kept together "
               f"({cfg.n_resamples} resamples), paired for Δ; exact McNemar over the pooled "
               "(seed, example) pairs; Holm over the control comparisons", "rows": rows,
               "controls": controls}
    out.write_json("predictions.json", predictions)
    out.write_text("table.md", markdown_table(summary) + "\n")
    figure(summary, out)
    out.write_json("summary.json", summary)  # last: its presence marks a finished run
    return summary


def figure(summary: dict, out) -> None:
    """One panel per task: accuracy (pooled, 95 % CI) against the prompt kept, a line per
    scoring (FastV, GemFilter, their random controls, recent-only), full and shallow as
    horizontal references; at the first length. ``long_tasks.png``."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    rows = summary["rows"]
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    L = rows[0]["length"]
    fig, axes = plt.subplots(1, len(tasks), figsize=(3.2 * len(tasks), 3.0), squeeze=False, sharey=True)
    for ax, task in zip(axes[0], tasks):
        mine = [r for r in rows if r["task"] == task and r["length"] == L]
        lines: dict[str, list] = {}
        for r in mine:
            if r["kind"] in ("full", "shallow"):
                ax.axhline(r["accuracy"], ls="--" if r["kind"] == "full" else ":", color="k" if
                           r["kind"] == "full" else "grey", label=r["variant"])
                continue
            name = r["variant"].replace(f" {r['options']['keep']:g}", "")
            lines.setdefault(name, []).append(r)
        for name, rs in lines.items():
            rs = sorted(rs, key=lambda r: r["options"]["keep"])
            x = [r["options"]["keep"] for r in rs]
            y = [r["accuracy"] for r in rs]
            err = [[r["accuracy"] - r["accuracy_ci95"][0] for r in rs],
                   [r["accuracy_ci95"][1] - r["accuracy"] for r in rs]]
            ax.errorbar(x, y, yerr=err, marker="o", capsize=2, label=name)
        ax.set_title(f"{task} ({L} tokens)")
        ax.set_xlabel("prompt kept")
        ax.set_ylim(-0.05, 1.05)
    axes[0][0].set_ylabel("exact match")
    axes[0][-1].legend(fontsize=7, loc="lower right")
    out.save_figure("long_tasks.png", fig)


def markdown_table(summary: dict) -> str:
    """The rows as a markdown table (accuracy [CI], Δ vs full [CI], lost / gained, TTFT and
    decode), then the comparisons with the controls."""
    lines = [("| task | length | variant | accuracy [95 % CI] | Δ vs full [95 % CI] | lost / gained "
              "| bits/byte, Δ vs full [95 % CI] | TTFT / full | decode ms/token |"),
             "|---|---|---|---|---|---|---|---|---|"]
    for r in summary["rows"]:
        acc = f"{r['accuracy']:.3f} [{r['accuracy_ci95'][0]:.3f}, {r['accuracy_ci95'][1]:.3f}]"
        if "diff" in r:
            d = f"{r['diff']:+.3f} [{r['diff_ci95'][0]:+.3f}, {r['diff_ci95'][1]:+.3f}]"
            lg = f"{r['lost']} / {r['gained']}"
        else:
            d = lg = "—"
        t = f"{r['ttft_vs_full']:.2f}" if r.get("ttft_vs_full") is not None else "—"
        dm = f"{r['decode_ms_per_token']:.2f}" if r.get("decode_ms_per_token") is not None else "—"
        bits = "—"
        if "bits_per_byte" in r:
            bits = f"{r['bits_per_byte']:.3f}"
            if "bits_per_byte_diff" in r:
                lo, hi = r["bits_per_byte_diff_ci95"]
                bits += f", {r['bits_per_byte_diff']:+.3f} [{lo:+.3f}, {hi:+.3f}]"
        lines.append(f"| {r['task']} | {r['length']} | {r['variant']} | {acc} | {d} | {lg} | {bits} | {t} | {dm} |")
    if summary.get("controls"):
        lines += ["", ("| task | length | variant | control | Δ vs control [95 % CI] | lost / gained "
                       "| p (Holm) |"), "|---|---|---|---|---|---|---|"]
        for c in summary["controls"]:
            sig = " *" if c["diff_ci95"][0] > 0 or c["diff_ci95"][1] < 0 else ""
            lines.append(f"| {c['task']} | {c['length']} | {c['variant']} | {c['control']} | "
                         f"{c['diff']:+.3f} [{c['diff_ci95'][0]:+.3f}, {c['diff_ci95'][1]:+.3f}]{sig} | "
                         f"{c['lost']} / {c['gained']} | {c.get('p_holm', c['mcnemar_p']):.3g} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """``python -m attnprune.research.experiments.long_tasks --model DIR [--key value ...] --out DIR``."""
    from attnprune.runs.command import run_command

    return run_command(argv, LongTasksConfig, "long-tasks", lambda cfg, out: (run(cfg, out), None)[1])


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
