"""Measure the cost of one more row group (the c of ``attnprune.selection.row_groups``) on this CPU.

    python scripts/group_overhead.py                  # table + fitted constants (a few minutes)
    python scripts/group_overhead.py --quick          # fewer widths and repeats

For each host family's block (BERT encoder layer, GPT-2 block, Llama rotary block, the synthetic
track's single-head attention) at several widths d and 1 / 2 torch threads, it times one group's
call: slice b rows × K slots out of a batch, run the block with a padded mask, write the rows
back. A least-squares fit t = a + s·(b·K) (weighted by 1/t, so the small calls count) gives the
fixed cost a and the per-slot cost s; c = a / s slots is what one more group costs. The script
then fits the one model of :func:`attnprune.selection.group_overhead_slots`,

    c(d, threads, block) = threads · C · (128 / d)^p

(a fixed per-call cost that a second thread does not shrink over a per-slot cost that grows with
d and that it halves) and prints C and p per block next to the library's
``GROUP_OVERHEAD_MODEL`` and the model's c on each row. Timings are minima over interleaved repeats (other processes only add time).
Each timing runs in its own process with its own thread count (a library never sets them).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

POINTS = [(1, 8), (1, 16), (2, 16), (4, 16), (4, 32), (8, 32), (8, 64), (16, 64)]  # (b, K)
KINDS = ("encoder", "gpt2", "rotary", "attention")


def build(kind: str, d: int):
    """(call(h, m4) → out, mask kind) for one block of ``kind`` at width d, eval mode."""

    heads = max(1, d // 64)
    if kind == "encoder":
        from transformers import BertConfig
        from transformers.models.bert.modeling_bert import BertLayer

        cfg = BertConfig(hidden_size=d, num_attention_heads=heads, intermediate_size=4 * d,
                         attn_implementation="sdpa")
        cfg._attn_implementation = "sdpa"
        block = BertLayer(cfg).eval()
        return lambda h, m4, pe: block(h, attention_mask=m4)
    if kind == "gpt2":
        from transformers import GPT2Config
        from transformers.models.gpt2.modeling_gpt2 import GPT2Block

        cfg = GPT2Config(n_embd=d, n_head=heads)
        cfg._attn_implementation = "sdpa"
        block = GPT2Block(cfg).eval()
        return lambda h, m4, pe: block(h, attention_mask=m4)
    if kind == "rotary":
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer

        cfg = LlamaConfig(hidden_size=d, num_attention_heads=heads, num_key_value_heads=heads,
                          intermediate_size=int(8 * d / 3) // 8 * 8)
        cfg._attn_implementation = "sdpa"
        block = LlamaDecoderLayer(cfg, 0).eval()
        return lambda h, m4, pe: block(h, attention_mask=m4, position_embeddings=pe)
    if kind == "attention":
        from attnprune.research.synthetic.host import SingleHeadAttention

        block = SingleHeadAttention(d).eval()
        return lambda h, m4, pe: block(h, m4)[0]
    raise ValueError(kind)


def time_kind(kind: str, d: int, repeats: int) -> list[dict]:
    """Fastest time (µs) of one group call at every (b, K) of POINTS: the minimum over repeats,
    since on a shared machine other processes only ever add time."""
    import torch

    torch.manual_seed(0)
    call = build(kind, d)
    B, L = 32, 64
    hidden = torch.randn(B, L, d)
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[:, -2:] = False  # some padding, so every host really masks
    head = max(1, d // 64)
    out = torch.empty_like(hidden)
    times: dict = {p: [] for p in POINTS}
    with torch.inference_mode():
        for _ in range(repeats + 2):  # interleaved: slow spells hit every point alike
            for b, k in POINTS:
                rows = torch.arange(0, B, B // b)[:b]
                t0 = time.perf_counter()
                h, m = hidden[rows, :k], mask[rows, :k]
                if kind == "attention":
                    m4 = m
                else:
                    m4 = torch.zeros(b, 1, 1, k).masked_fill(~m[:, None, None, :], -1e9)
                pe = None
                if kind == "rotary":
                    dh = d // head
                    pe = (torch.ones(b, k, dh), torch.zeros(b, k, dh))
                out[rows, :k] = call(h, m4, pe)
                times[(b, k)].append(time.perf_counter() - t0)
    return [{"b": b, "K": k, "slots": b * k, "us": 1e6 * min(ts[2:])}
            for (b, k), ts in times.items()]


def fit(rows: list[dict]) -> tuple[float, float]:
    """(a, s) of t = a + s·slots, least squares weighted by 1/t (relative errors)."""
    import numpy as np

    n = np.array([r["slots"] for r in rows], float)
    t = np.array([r["us"] for r in rows], float)
    w = 1.0 / t
    A = np.stack([np.ones_like(n), n], 1) * w[:, None]
    (a, s), *_ = np.linalg.lstsq(A, t * w, rcond=None)
    return float(a), float(s)


def child(kind: str, d: int, threads: int, repeats: int) -> None:
    import torch

    torch.set_num_threads(threads)  # this process only: the measurement's own setting
    print(json.dumps(time_kind(kind, d, repeats)))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="two widths, 5 repeats")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--blocks", nargs="+", default=list(KINDS), choices=KINDS)
    p.add_argument("--child", nargs=4, metavar=("KIND", "D", "THREADS", "REPEATS"),
                   help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        k, d, t, r = args.child
        return child(k, int(d), int(t), int(r))
    import numpy as np

    from attnprune.selection import GROUP_OVERHEAD_MODEL, group_overhead_slots

    widths = (64, 256) if args.quick else (64, 128, 256, 384)
    repeats = 5 if args.quick else args.repeats
    print(f"{'block':>9} {'d':>4} {'thr':>3} {'a µs':>8} {'s µs/slot':>9} {'c=a/s':>7} "
          f"{'model c':>7}")
    fitted = []
    for kind in args.blocks:
        for d in widths:
            for threads in args.threads:
                res = subprocess.run([sys.executable, __file__, "--child", kind, str(d),
                                      str(threads), str(repeats)],
                                     capture_output=True, text=True, check=True)
                a, s = fit(json.loads(res.stdout.strip().splitlines()[-1]))
                c = a / s
                fitted.append((kind, d, threads, c))
                print(f"{kind:>9} {d:>4} {threads:>3} {a:>8.0f} {s:>9.3f} {c:>7.1f} "
                      f"{group_overhead_slots(d, threads, kind):>7.1f}", flush=True)
    # per block: log(c / threads) = log C − p·log(d / 128), least squares over its c > 0 rows
    for kind in args.blocks:
        ok = [(d, t, c) for k, d, t, c in fitted if k == kind and c > 0]
        if len(ok) < 2:
            continue
        x = np.array([-np.log(d / 128.0) for d, _, _ in ok])
        y = np.array([np.log(c / t) for _, t, c in ok])
        p_, logc = np.polyfit(x, y, 1)
        print(f"fit {kind:>9}: c = threads · {np.exp(logc):.0f} · (128/d)^{p_:.2f}   "
              f"library: {GROUP_OVERHEAD_MODEL[kind]}")

if __name__ == "__main__":
    main()
