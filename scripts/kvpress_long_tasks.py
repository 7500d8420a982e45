"""The long-context suite (issue 33) under NVIDIA kvpress's presses, scored like
``attnprune reproduce long-tasks`` so that the two tables sit side by side.

kvpress 0.5.5 pins ``transformers<5.3`` and this project runs 5.24, so the presses run in a
python of their own (a venv, see docs/prefill.md) on token ids that this process writes, and
this process scores their answers. Three steps, the same ``--out``:

    python scripts/kvpress_long_tasks.py prepare --out DIR --model M0,M1,M2 [--tokenizer T] \\
        [--tasks multikey,multivalue,vartrack,freqwords] [--lengths 1024] [--n 64] [--split test]
    /tmp/kvp/bin/python scripts/kvpress_long_tasks.py press --out DIR [--question after|inside] \\
        [--presses snapkv,expected_attention,streamingllm] [--keeps 0.5,0.25]
    python scripts/kvpress_long_tasks.py score --out DIR [--question after|inside]

prepare   the suite's examples (:mod:`attnprune.research.data.long_tasks`, the runner's defaults
          for seed, placement and options) encoded with the tokenizer: DIR/prompts.json holds,
          per (task, length), each example's head, tail and answer length in tokens; the
          tokenizer must be the models' own (``check_tokenizer``).
press     (kvpress's python; imports torch, transformers and kvpress only) for each model
          (one per training seed) and example: unpruned (no press) and each press at
          compression 1 − keep, greedy, as many tokens as the answer has. ``--question after``
          is kvpress's pipeline: the press hooks the prefill of the *head* (the context) and
          the tail (question and cue) decodes through the compressed cache. ``inside``
          compresses head + tail in one prefill and takes the first token from its logits.
          Batch 1, 1 thread, variants interleaved per example after an untimed warm-up.
          DIR/press-QUESTION/seedI.json per model (a finished model is not run again).
score     decodes each answer, checks it with the example's exact-match check and writes
          DIR/press-QUESTION/summary.json and table.md: per (task, length, variant) the
          accuracy pooled over the seeds with its cluster-bootstrap 95 % CI and the paired
          difference against kvpress's unpruned model (``long_tasks.rows_for``), the median
          TTFT ratio to unpruned and decode ms/token; ``unpruned_agree``: the share of
          examples where kvpress's unpruned answer (transformers 5.2) is the one this
          project's stock forward writes (``long_tasks.answer``, keep 1.0), per seed.

Windows and sinks as the runner's defaults: SnapKV's window 16, StreamingLLM's and
ExpectedAttention's 4 sink tokens. The code task is left out (it is scored teacher-forced).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

PRESSES = ("snapkv", "expected_attention", "streamingllm")
WINDOW, SINKS = 16, 4


# -- prepare (this project's python) ---------------------------------------------------------------
def prepare(out: Path, models: list[str], tokenizer: str, tasks: list[str], lengths: list[int], n: int,
            split: str, seed: int = 0) -> dict:
    from attnprune.research.data import long_tasks as lt
    from attnprune.research.experiments import long_tasks as ev
    from attnprune.runs.results import atomic_write_text

    for t in tasks:
        if t not in lt.SYNTHETIC:
            raise ValueError(f"--tasks: each one of {', '.join(lt.SYNTHETIC)} (the code task is scored "
                             f"teacher-forced, not by presses here), got {t!r}")
    if split not in lt.SPLITS:
        raise ValueError(f"--split: one of {', '.join(lt.SPLITS)}, got {split!r}")
    if not models:
        raise ValueError("--model: at least one model folder")
    tok = ev.load_tokenizer(tokenizer)
    ev.check_tokenizer(tokenizer, tok, models)
    measure = None if tokenizer == "bytes" else tok
    sets = []
    for task in tasks:
        for L in lengths:
            exs = [lt.example(task, L, i, split=split, seed=seed, tokenizer=measure) for i in range(n)]
            rows = []
            for ex in exs:
                head, tail, n_target = ev.encode(tok, ex)
                rows.append({"head": head, "tail": tail, "n": n_target})
            sets.append({"task": task, "length": L, "examples": rows})
    prompts = {"models": [str(Path(m).resolve()) if Path(m).exists() else m for m in models],
               "tokenizer": tokenizer, "split": split, "seed": seed, "n": n, "sets": sets}
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "prompts.json", json.dumps(prompts) + "\n")
    return prompts


# -- press (kvpress's python: torch, transformers, kvpress only) ------------------------------------
def make_press(name: str, compression: float):
    if name not in PRESSES:
        raise ValueError(f"--presses: each one of {', '.join(PRESSES)}, got {name!r}")
    import kvpress

    if name == "snapkv":
        return kvpress.SnapKVPress(compression_ratio=compression, window_size=WINDOW)
    if name == "streamingllm":
        return kvpress.StreamingLLMPress(compression_ratio=compression, n_sink=SINKS)
    return kvpress.ExpectedAttentionPress(compression_ratio=compression, n_sink=SINKS)


def answer(model, head: list[int], tail: list[int], n_new: int, question: str, press=None) -> dict:
    """Greedy ids after the (pressed) prefill, with TTFT and the mean decode step (seconds)."""
    import contextlib

    import torch
    from transformers import DynamicCache

    def run(ids: list[int], pos: int):
        x = torch.tensor([ids])
        return model(input_ids=x, past_key_values=cache, use_cache=True,
                     position_ids=torch.arange(pos, pos + len(ids))[None]).logits[0, -1]

    with torch.inference_mode():
        cache, ctx = DynamicCache(), (press(model) if press is not None else contextlib.nullcontext())
        t0 = time.perf_counter()
        if question == "after" and tail:
            with ctx:  # as kvpress's pipeline: the press hooks the context's prefill (model.model)
                model.model(input_ids=torch.tensor([head]), past_key_values=cache, use_cache=True)
            for i, t in enumerate(tail):
                logits = run([t], len(head) + i)
        else:
            with ctx:
                logits = run(head + tail, 0)
        out = [int(logits.argmax())]
        t1 = time.perf_counter()
        pos = len(head) + len(tail)
        for i in range(n_new - 1):
            out.append(int(run([out[-1]], pos + i).argmax()))
        t2 = time.perf_counter()
    return {"ids": out, "ttft_s": t1 - t0, "decode_s": (t2 - t1) / (n_new - 1) if n_new > 1 else None}


def press_side(out: Path, question: str, presses: list[str], keeps: list[float], loader=None) -> None:
    """Every model of DIR/prompts.json through the presses (``loader``: path → model, for tests)."""
    import torch

    torch.set_num_threads(1)
    prompts = json.loads((out / "prompts.json").read_text())
    variants = {"unpruned": None}
    for name in presses:
        for k in keeps:
            if not 0.0 < k < 1.0:
                raise ValueError(f"--keeps: each in (0, 1), got {k}")
            variants[f"{name} {k:g}"] = make_press(name, 1.0 - k)
    folder = out / f"press-{question}"
    folder.mkdir(parents=True, exist_ok=True)
    if loader is None:
        from transformers import AutoModelForCausalLM

        def loader(path):
            return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    for i, path in enumerate(prompts["models"]):
        done = folder / f"seed{i}.json"
        if done.exists():
            continue
        model = loader(path).eval()
        record = {"model": path, "question": question, "env": _versions(), "sets": []}
        for s in prompts["sets"]:
            res = {label: {"ids": [], "ttft_s": [], "decode_s": []} for label in variants}
            first = s["examples"][0] if s["examples"] else None
            for label, press in variants.items():  # the untimed warm-up round
                if first:
                    answer(model, first["head"], first["tail"], first["n"], question, press)
            for ex in s["examples"]:
                for label, press in variants.items():
                    r = answer(model, ex["head"], ex["tail"], ex["n"], question, press)
                    for k in ("ids", "ttft_s", "decode_s"):
                        res[label][k].append(r[k])
            record["sets"].append({"task": s["task"], "length": s["length"], "results": res})
            print(f"seed{i} {s['task']} {s['length']}: done", flush=True)
        tmp = done.with_suffix(".tmp")
        tmp.write_text(json.dumps(record) + "\n")
        os.replace(tmp, done)  # atomic: a killed run leaves no half-written seed


def _versions() -> dict:
    import platform

    import torch
    import transformers

    out = {"python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__}
    try:
        from importlib.metadata import version

        out["kvpress"] = version("kvpress")
    except Exception:  # noqa: BLE001 (not installed: the test process)
        out["kvpress"] = None
    return out


# -- score (this project's python) -----------------------------------------------------------------
def score(out: Path, question: str, n_resamples: int = 10_000) -> dict:
    from attnprune.research.data import long_tasks as lt
    from attnprune.research.experiments import long_tasks as ev
    from attnprune.runs.results import atomic_write_text

    prompts = json.loads((out / "prompts.json").read_text())
    folder = out / f"press-{question}"
    seeds = [json.loads((folder / f"seed{i}.json").read_text()) for i in range(len(prompts["models"]))]
    tok = ev.load_tokenizer(prompts["tokenizer"])
    measure = None if prompts["tokenizer"] == "bytes" else tok
    rows, agree = [], {}
    ours = [ev.load_model(m) for m in prompts["models"]]  # this project's stock answers, keep 1.0
    for j, s in enumerate(prompts["sets"]):
        exs = [lt.example(s["task"], s["length"], i, split=prompts["split"], seed=prompts["seed"], tokenizer=measure)
               for i in range(len(s["examples"]))]
        labels = list(seeds[0]["sets"][j]["results"])
        name = {label: "full" if label == "unpruned" else label for label in labels}  # rows_for's reference
        pooled = {name[label]: {"right": [], "ttft_s": [], "decode_s": []} for label in labels}
        for i, rec in enumerate(seeds):
            res = rec["sets"][j]["results"]
            for label in labels:
                p = pooled[name[label]]
                p["right"].append([bool(ex.check(tok.decode(ids))) for ex, ids in zip(exs, res[label]["ids"])])
                p["ttft_s"].append(res[label]["ttft_s"])
                p["decode_s"].append(res[label]["decode_s"])
            same = [ev.answer(ours[i], e["head"], e["tail"], e["n"], question, keep=1.0) == ids
                    for e, ids in zip(s["examples"], res["unpruned"]["ids"])]
            agree.setdefault(f"{s['task']}:{s['length']}", []).append(sum(same) / max(1, len(same)))
        specs = {name[label]: ({"kind": "full", "keep": 1.0} if label == "unpruned" else
                               {"kind": "press", "press": label.rsplit(" ", 1)[0],
                                "keep": float(label.rsplit(" ", 1)[1])}) for label in labels}
        rows += ev.rows_for(s["task"], s["length"], specs, pooled, n_resamples)
    summary = {"command": "kvpress-long-tasks", "question": question, "prompts": {
        k: prompts[k] for k in ("models", "tokenizer", "split", "seed", "n")},
        "env": [rec["env"] for rec in seeds], "rows": rows, "unpruned_agree": agree,
        "ci_method": "percentile bootstrap over the examples, each example's seeds kept together "
                     f"({n_resamples} resamples), paired against kvpress's unpruned model"}
    for r in rows:
        r["variant"] = "kvpress unpruned" if r["variant"] == "full" else r["variant"]
    table = ev.markdown_table({"rows": rows, "controls": []})
    atomic_write_text(folder / "table.md", table + "\n")
    atomic_write_text(folder / "summary.json", json.dumps(summary, indent=1) + "\n")
    print(table)
    print("kvpress's unpruned answers = this project's stock answers:", agree)
    return summary


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("step", choices=("prepare", "press", "score"))
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--model", default="", help="prepare: model folders, one per seed, comma-separated")
    ap.add_argument("--tokenizer", default="bytes")
    ap.add_argument("--tasks", default="multikey,multivalue,vartrack,freqwords")
    ap.add_argument("--lengths", default="1024")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--split", default="test")
    ap.add_argument("--question", choices=("after", "inside"), default="after")
    ap.add_argument("--presses", default=",".join(PRESSES))
    ap.add_argument("--keeps", default="0.5,0.25")
    ap.add_argument("--n-resamples", type=int, default=10_000)
    a = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if a.step == "prepare":
        try:
            lengths = [int(x) for x in a.lengths.split(",") if x]
        except ValueError:
            ap.error(f"--lengths: comma-separated integers, got {a.lengths!r}")
        if a.n < 1:
            ap.error(f"--n: ≥ 1, got {a.n}")
        prepare(a.out, [m for m in a.model.split(",") if m], a.tokenizer,
                [t for t in a.tasks.split(",") if t], lengths, a.n, a.split)
    elif a.step == "press":
        press_side(a.out, a.question, [p for p in a.presses.split(",") if p],
                   [float(k) for k in a.keeps.split(",") if k])
    else:
        score(a.out, a.question, a.n_resamples)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
