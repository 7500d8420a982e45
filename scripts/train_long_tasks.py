"""Train a small byte-level Llama on the long-context suite (issue 33) so that pruning has
something to lose: a mix of the suite's training split and real text, until a deadline.

    python scripts/train_long_tasks.py --out DIR [--device cuda] [--max-minutes 4] [--length 1024]

Each row of a batch is, with probability ``--text-share``, a window of real Python source (the
corpus's training files: ``.py`` files of installed packages, LM loss on every byte), else an
example of a task of the suite's training split (loss on the answer bytes only) at a length
drawn from [``--min-length``, the current top], the top growing from ``--min-length`` to
``--length`` over the first half of the run. AdamW, warm-up then cosine, on the larger of the
step and the time fraction, so the deadline ends the schedule fully decayed (as the passkey
recipe does). bf16 autocast on CUDA. At the end: the model saved with ``save_pretrained`` in
``DIR/model``, its ``model.safetensors``'s SHA-256 printed, and each task's validation
accuracy (greedy, exact match) at ``--length``: unpruned, and with the prompt cut to its last
25 % (the check that the model uses its context); all of it in ``DIR/train.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sys
import time
from pathlib import Path

import torch

from attnprune.research.data import long_tasks as lt
from attnprune.research.experiments import long_tasks as ev
from attnprune.runs.results import atomic_write_text


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--max-minutes", type=float, default=4.0, help="training deadline (evaluation after it)")
    p.add_argument("--length", type=int, default=1024, help="the longest prompt (bytes); evaluated there")
    p.add_argument("--min-length", type=int, default=384)
    p.add_argument("--tasks", default=",".join(lt.TASKS))
    p.add_argument("--text-share", type=float, default=0.25)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--ffn", type=int, default=384)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--steps", type=int, default=20_000, help="the schedule's length if the deadline is not hit first")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-n", type=int, default=64)
    p.add_argument("--threads", type=int, default=0, help="torch threads on the CPU (0: torch's default)")
    p.add_argument("--code-packages", default=",".join(lt.DEFAULT_PACKAGES))
    a = p.parse_args(argv)
    a.tasks = tuple(t for t in a.tasks.split(",") if t)
    a.code_packages = tuple(x for x in a.code_packages.split(",") if x)
    for t in a.tasks:
        if t not in lt.TASKS:
            p.error(f"--tasks: each one of {', '.join(lt.TASKS)}, got {t!r}")
    if not 0.0 <= a.text_share < 1.0:
        p.error(f"--text-share: in [0, 1), got {a.text_share}")
    if not 16 <= a.min_length <= a.length:
        p.error(f"--min-length: in [16, --length], got {a.min_length}")
    if a.max_minutes <= 0 or a.batch < 1 or a.steps < 1 or a.eval_n < 1:
        p.error("--max-minutes, --batch, --steps, --eval-n: must be > 0")
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device: cuda asked for, but torch sees no CUDA device")
    return a


def build_model(a):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(a.seed)
    conf = LlamaConfig(vocab_size=256, hidden_size=a.width, intermediate_size=a.ffn,
                       num_hidden_layers=a.layers, num_attention_heads=a.heads,
                       num_key_value_heads=a.kv_heads, max_position_embeddings=2 * a.length,
                       bos_token_id=None, eos_token_id=None, pad_token_id=0, tie_word_embeddings=True)
    return LlamaForCausalLM(conf)


class Rows:
    """Training rows: (ids, labels) lists, task examples or real-text windows, seeded."""

    def __init__(self, a):
        self.a, self.rng, self.index = a, random.Random(f"train_long_tasks:{a.seed}"), 0
        self.files = lt.code_files("train", a.code_packages) if a.text_share or "code" in a.tasks else []
        self.texts: dict[str, str] = {}

    def text(self, length: int) -> tuple[list[int], list[int]]:
        for _ in range(100):
            _, path = self.files[self.rng.randrange(len(self.files))]
            raw = Path(path).read_bytes()
            if len(raw) > length + 1 and raw.isascii():
                s = self.rng.randrange(len(raw) - length)
                ids = list(raw[s:s + length])
                return ids, ids
        raise RuntimeError("no training file long enough for a real-text window")

    def task(self, length: int) -> tuple[list[int], list[int]]:
        task = self.rng.choice(self.a.tasks)
        self.index += 1
        kw = {"code_packages": self.a.code_packages} if task == "code" else {}
        ex = lt.example(task, length, self.index, split="train", seed=self.a.seed, **kw)
        prompt, target = list(ex.prompt.encode()), list(ex.target.encode())
        return prompt + target, [-100] * len(prompt) + target

    def batch(self, top: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = []
        for _ in range(self.a.batch):
            L = self.rng.randrange(self.a.min_length, top + 1)
            rows.append(self.text(L) if self.rng.random() < self.a.text_share else self.task(L))
        n = max(len(r[0]) for r in rows)  # right padding: no loss, no attention
        ids = torch.zeros(len(rows), n, dtype=torch.long)
        labels = torch.full((len(rows), n), -100, dtype=torch.long)
        mask = torch.zeros(len(rows), n, dtype=torch.long)
        for i, (x, y) in enumerate(rows):
            ids[i, :len(x)], labels[i, :len(y)], mask[i, :len(x)] = torch.tensor(x), torch.tensor(y), 1
        return ids, labels, mask


def train(a, model, device, log):
    rows = Rows(a)
    fused = {"fused": True} if device.type == "cuda" else {}
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01, **fused)
    deadline, warm = a.max_minutes * 60, max(1, a.steps // 50)
    t0, done = time.perf_counter(), 0
    for step in range(a.steps):
        frac = max(step / a.steps, (time.perf_counter() - t0) / deadline)
        if frac >= 1.0 and step:
            break
        # warm-up over the first 2 % of the schedule, by steps or by time, whichever is first
        rise = min(1.0, max((step + 1) / warm, frac / 0.02))
        lr = a.lr * rise * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))
        for g in opt.param_groups:
            g["lr"] = lr
        top = a.min_length + int((a.length - a.min_length) * min(1.0, 2 * frac))
        ids, labels, mask = (t.to(device) for t in rows.batch(top))
        with torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else _null():
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        done += 1
        if step % 25 == 0:
            rec = {"step": step, "loss": round(loss.item(), 4), "lr": lr, "top": top,
                   "elapsed_s": round(time.perf_counter() - t0, 1)}
            log.append(rec)
            print(json.dumps(rec), flush=True)
    log.append({"steps_done": done, "train_s": round(time.perf_counter() - t0, 1)})


def _null():
    import contextlib

    return contextlib.nullcontext()


def evaluate(a, model) -> dict:
    """Each task's validation accuracy at ``--length``: unpruned and the last 25 % only."""
    specs = {"full": {"kind": "full", "keep": 1.0}, "last 25 %": {"kind": "recent", "keep": 0.25}}
    tok, out = lt.ByteTokenizer(), {}
    for task in a.tasks:
        kw = {"code_packages": a.code_packages} if task == "code" else {}
        exs = lt.generate(task, a.eval_n, a.length, split="validation", seed=a.seed, **kw)
        res = ev.evaluate(model, tok, exs, specs)
        out[task] = {k: sum(v["right"]) / len(v["right"]) for k, v in res.items()}
        print(f"{task:<11} unpruned {out[task]['full']:.3f}  last 25 % {out[task]['last 25 %']:.3f}"
              f"  (n {a.eval_n}, {a.length} bytes)", flush=True)
    return out


def main(argv=None) -> int:
    a = parse(sys.argv[1:] if argv is None else argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device("cuda" if a.device == "cuda" or (a.device == "auto" and torch.cuda.is_available())
                          else "cpu")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    model = build_model(a).to(device).train()
    print(f"{sum(p.numel() for p in model.parameters()):,} parameters on {device}", flush=True)
    log: list = []
    train(a, model, device, log)
    model = model.float().cpu().eval()
    model.save_pretrained(out / "model")
    sha = hashlib.sha256((out / "model" / "model.safetensors").read_bytes()).hexdigest()
    print(f"model.safetensors sha256 {sha}", flush=True)
    accuracy = evaluate(a, model)
    atomic_write_text(out / "train.json", json.dumps(
        {"args": vars(a), "sha256": sha, "log": log, "validation_accuracy": accuracy}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
