"""Batch-1 latency of attention_mass pruning on MiniLM: wall-time ratio against FLOPs ratio.

    HF_HUB_OFFLINE=1 python scripts/bench_batch1.py [--lengths 128,512] [--ratios 0.3,0.5]
        [--after 1,2] [--repeats 40] [--threads 1]

MiniLM-L6 (``attnprune.research.finetune.load_model("minilm", 2)``, random head: speed only), one row
of random token ids (no padding, the usual batch-1 serving case) of each length L, patched
with ``attention_mass`` (ρ after layer l, default options). For each (L, ρ, l) it prints the
measured FLOPs ratio pruned / full (FlopCounterMode with the CPU SDPA fix), the wall-time
ratio pruned / full timed round-robin in this one process (the same model with the patch
switched off, ``state.enabled = False``, is the full side; medians of
:func:`attnprune.measure.time_interleaved`), and wall / FLOPs: 1.0 means the pruned forward
saves exactly its share of arithmetic; above 1 is the patch's fixed overhead (scorer, top-k,
gather, Python per layer) and batch-1 matmuls bound by reading the weights. ``cpu``: the same
ratio in process CPU time (``time.process_time``, same interleaving), which leaves out time
spent waiting for a core on a loaded machine. ``floor``: Σ over layers of a stock layer's CPU
time at the width it runs at, over 6 × its time at L — the ratio a pruned forward with no
overhead at all would reach (a batch-1 layer costs a + b·n, not b·n: the weights are read
whatever n is). The load average is printed before and after.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

import attnprune
from attnprune.measure import count_flops, time_interleaved


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="128,512")
    ap.add_argument("--ratios", default="0.3,0.5")
    ap.add_argument("--after", default="1,2")
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from attnprune.research.finetune import load_model

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, _ = load_model("minilm", 2)
    model.eval()
    print(f"MiniLM-L6, batch 1, attention_mass, {args.threads} thread(s), {args.repeats} "
          f"interleaved rounds, medians; load average {os.getloadavg()}")
    print(f"{'L':>4} {'ρ':>4} {'after':>5} {'FLOPs':>6} {'wall':>6} {'wall/FLOPs':>10} "
          f"{'cpu':>6} {'cpu/FLOPs':>9} {'floor':>6} {'full ms':>8} {'pruned ms':>9} "
          f"{'patch µs':>8}")
    g = torch.Generator().manual_seed(0)
    layer_ms = {}  # kept length → CPU ms of one stock layer (the floor column)
    for L in map(int, args.lengths.split(",")):
        ids = torch.randint(1000, 20000, (1, L), generator=g)
        x = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        for rho in map(float, args.ratios.split(",")):
            for after in map(int, args.after.split(",")):
                attnprune.patch(model, "attention_mass", keep_ratio=rho, after_layer=after)
                state = attnprune.patch_state(model)

                def pruned(x=x):
                    with torch.no_grad():
                        model(**x)

                def full(state=state, pruned=pruned):
                    state.enabled = False
                    try:
                        pruned()
                    finally:
                        state.enabled = True

                with torch.no_grad():
                    fp = count_flops(lambda x=x: model(**x))
                    state.enabled = False
                    ff = count_flops(lambda x=x: model(**x))
                    state.enabled = True
                    model(**x)
                own = state.stats["select_time_s"] + state.stats["gather_time_s"]
                widths = [int(k) for k in state.stats["kept_per_layer"]]
                fns = {"full": full, "pruned": pruned}
                t = time_interleaved(fns, repeats=args.repeats, warmup=3)
                c = time_interleaved(fns, repeats=args.repeats, warmup=1,
                                     clock=time.process_time)
                tf, tp = t["full"].median_s, t["pruned"].median_s
                cf, cp = c["full"].median_s, c["pruned"].median_s
                floor = (sum(_layer_ms(model, n, layer_ms) for n in widths)
                         / (len(widths) * _layer_ms(model, L, layer_ms)))
                print(f"{L:>4} {rho:4.1f} {after:>5} {fp / ff:6.3f} {tp / tf:6.3f} "
                      f"{tp / tf / (fp / ff):10.2f} {cp / cf:6.3f} {cp / cf / (fp / ff):9.2f} "
                      f"{floor:6.3f} {tf * 1e3:8.2f} {tp * 1e3:9.2f} {own * 1e6:8.0f}",
                      flush=True)
                attnprune.unpatch(model)
    print(f"load average at the end {os.getloadavg()}")
    return 0


def _layer_ms(model, n: int, cache: dict, repeats: int = 15) -> float:
    """Median CPU ms of one stock encoder layer on one row of n tokens (cached): the cost a
    pruned layer of width n cannot go below, whatever the patch does around it."""
    if n not in cache:
        layer = model.base_model.encoder.layer[-1]
        h = torch.randn(1, n, model.config.hidden_size)
        with torch.no_grad():
            t = time_interleaved({"layer": lambda: layer(h, None)}, repeats=repeats, warmup=2,
                                 clock=time.process_time)
        cache[n] = t["layer"].median_s * 1e3
    return cache[n]


if __name__ == "__main__":
    raise SystemExit(main())
