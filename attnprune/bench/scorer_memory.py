"""The attention scorer's memory against the full forward's (issue 46, item 4).

The "received" scorer (attention_mass and its kin) needs every query's softmax over the keys of
its layer: B · H · T² probabilities, 1.5 GB at B 8 × T 2,048 × 12 heads in float32. On the
sync-free path it works in blocks of at most ``attnprune.attention.SCORER_BLOCK`` probabilities
(``scorer_kernel="matmul"``), or from two fused attention passes that never hold them
(``"sdpa"``). This measures, each in a fresh process with glibc's mmap threshold fixed
(:mod:`attnprune.bench._memory`), the peak growth of resident memory during one forward of a
randomly initialised BERT encoder: the full model, then the model patched with
attention_mass ρ 0.25 after layer 1 on the sync-free path, per scorer kernel::

    python -m attnprune.bench.scorer_memory --batch 8 --length 2048 --hidden 768

prints one line per configuration: MB at the peak, and MB above the full forward's peak.
"""

from __future__ import annotations

import argparse

from attnprune.bench._memory import in_child

__all__ = ["measure", "scorer_memory"]


def measure(payload: dict) -> dict:
    """In the child process: {"full": MB, kernel: MB, ...} for ``payload`` = {batch, length,
    hidden, heads, layers, kernels, threads}. Row 1 of the batch is half padding, so the masks
    are real ones."""
    import torch
    from transformers import BertConfig, BertModel

    import attnprune
    from attnprune.bench._memory import return_freed_memory
    from attnprune.measure import peak_memory

    return_freed_memory()
    torch.set_num_threads(int(payload.get("threads", 1)))
    B, T = int(payload["batch"]), int(payload["length"])
    hidden, heads = int(payload["hidden"]), int(payload["heads"])
    cfg = BertConfig(hidden_size=hidden, num_attention_heads=heads, intermediate_size=4 * hidden,
                     num_hidden_layers=int(payload["layers"]), max_position_embeddings=T,
                     vocab_size=1000)
    torch.manual_seed(0)
    model = BertModel(cfg).eval()
    ids = torch.randint(5, 1000, (B, T))
    mask = torch.ones(B, T, dtype=torch.long)
    if B > 1:
        mask[1, T // 2:] = 0
    out: dict[str, float] = {}
    with torch.inference_mode():
        out["full"] = peak_memory(lambda: model(input_ids=ids, attention_mask=mask)) / 2**20
        for kernel in payload["kernels"]:
            pruned = attnprune.patch(model, "attention_mass", keep_ratio=0.25, after_layer=1,
                                     sync_free=True, scorer_kernel=kernel)
            out[kernel] = peak_memory(lambda p=pruned: p(input_ids=ids, attention_mask=mask)) / 2**20
            attnprune.unpatch(pruned)
    return out


def scorer_memory(batch: int = 8, length: int = 2048, hidden: int = 768, heads: int = 12,
                  layers: int = 2, kernels: tuple[str, ...] = ("matmul", "sdpa"),
                  threads: int = 1) -> dict[str, float]:
    """Peak MB of one forward per configuration, measured in a process of its own
    (:func:`measure`)."""
    return in_child("attnprune.bench.scorer_memory:measure", {
        "batch": batch, "length": length, "hidden": hidden, "heads": heads, "layers": layers,
        "kernels": list(kernels), "threads": threads})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m attnprune.bench.scorer_memory",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    mb = scorer_memory(args.batch, args.length, args.hidden, args.heads, args.layers,
                       threads=args.threads)
    print(f"B {args.batch} × T {args.length}, {args.heads} heads, width {args.hidden}, "
          f"{args.layers} layers; peak growth of resident memory in one forward (MB)")
    for name, v in mb.items():
        extra = "" if name == "full" else f"   {v - mb['full']:+8.1f} vs full"
        label = "full" if name == "full" else f"attention_mass 0.25/L1, scorer {name}"
        print(f"{label:<40} {v:8.1f}{extra}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
