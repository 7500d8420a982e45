"""attnprune embed-distill: label-free distillation of a token-pruned sentence embedder.

A training-free token pruner costs embedding quality (MiniLM-L6 at keep 0.35: cosine to the
stock embeddings well below 1). Distillation wins part of it back without labels: the student
(the pruned SentenceTransformer) learns to give the embeddings the teacher (the stock model)
gives, on unlabeled texts of the target domain:

    loss = mean(1 − cos(s_i, t_i))   (or MSE(s_i, t_i))
         + w · InfoNCE(s, t)         each student embedding against the teacher embeddings of
                                     the batch, its own text's the positive (temperature τ)
         + the method's auxiliary losses (attnprune.aux_loss)

The teacher is frozen; its embeddings are computed once per text, before training, without
gradients. The model weights and the method's parameters (if it has any) are trained with
AdamW, linear warm-up and decay, gradient clipping, in the model's own dtype.

Command:

    attnprune embed-distill --model PATH_OR_NAME --corpus texts.txt --out DIR
        [--method attention_mass --keep-ratio 0.35 --after-layer 1 --epochs 1 ...]

The corpus holds one text per line (UTF-8); a blank line is an error naming its line number
(a blank line usually means a broken export, and skipping it would shift every count). The
distilled model is written to DIR with attnprune.save_pretrained: it loads back with
attnprune.from_pretrained(DIR), or SentenceTransformer(DIR, trust_remote_code=True) with
attnprune installed. A plain SentenceTransformer(DIR) stops with sentence-transformers' error
about the module class rather than loading the weights unpruned.
"""

from __future__ import annotations

import sys
from pathlib import Path

from attnprune.train.embed_distill import (
    LOSSES,
    check_settings,
    distill_embeddings,
    embed_texts,
    embedding_cosine,
    encoder_depth,
    read_corpus,
)

__all__ = ["main"]


def _parser():
    import argparse

    class Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
        pass

    ap = argparse.ArgumentParser(prog="attnprune embed-distill", description=__doc__,
                                 formatter_class=Formatter)
    ap.add_argument("--model", required=True,
                    help="SentenceTransformer folder or name (the stock model: teacher and "
                         "the student's start)")
    ap.add_argument("--corpus", required=True, help="UTF-8 text file, one text per line")
    ap.add_argument("--out", required=True, help="folder the distilled model is written to")
    ap.add_argument("--method", default="attention_mass", help="token method (attnprune methods)")
    ap.add_argument("--keep-ratio", type=float, default=0.35, help="fraction of tokens kept")
    ap.add_argument("--after-layer", type=int, default=1, help="layer after which tokens drop")
    ap.add_argument("--schedule", default=None,
                    help="single (default), geometric or linear: where the reduction happens "
                         "(attnprune.hosts.hf_encoder.parse_schedule)")
    ap.add_argument("--reduce", choices=("drop", "merge"), default=None,
                    help="drop the unkept tokens or merge them into the kept ones (default: "
                         "the method's: merge for tome, drop for the others)")
    ap.add_argument("--min-tokens", type=int, default=None,
                    help="texts with fewer tokens are not reduced (default: 16 when merging, "
                         "0 when dropping)")
    ap.add_argument("--layers", type=int, default=None,
                    help="the depth baseline instead of pruning: the student keeps the "
                         "teacher's first N layers, unpruned (saved with sentence-transformers' "
                         "own save: it loads with a plain SentenceTransformer(DIR))")
    ap.add_argument("--epochs", type=int, default=1, help="passes over the corpus")
    ap.add_argument("--batch-size", type=int, default=32, help="texts per step")
    ap.add_argument("--lr", type=float, default=2e-5, help="AdamW learning rate")
    ap.add_argument("--loss", choices=LOSSES, default="cosine",
                    help="distance to the teacher's embedding")
    ap.add_argument("--contrastive-weight", type=float, default=0.0,
                    help="weight of in-batch InfoNCE against the teacher's embeddings")
    ap.add_argument("--temperature", type=float, default=0.05, help="InfoNCE temperature")
    ap.add_argument("--max-length", type=int, default=None,
                    help="tokens per text (default: the model's max_seq_length)")
    ap.add_argument("--seed", type=int, default=0, help="batch order and dropout")
    ap.add_argument("--eval-corpus", default=None,
                    help="held-out texts (one per line): print the mean cosine to the stock "
                         "embeddings before and after distillation")
    ap.add_argument("--device", default=None, help="cpu, cuda, ... (default: what "
                                                   "sentence-transformers picks)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    return ap


def main(argv: list[str]) -> int:
    """Entry point: ``attnprune embed-distill --model M --corpus FILE --out DIR [...]``."""
    import copy

    args = _parser().parse_args(argv)
    name = "attnprune embed-distill"
    try:  # every input checked before the model is loaded or anything trained
        from attnprune.deploy.hub import check_target

        texts = read_corpus(args.corpus)
        held = read_corpus(args.eval_corpus, "eval-corpus") if args.eval_corpus else None
        check_target(Path(args.out))
        if not 0 < args.keep_ratio <= 1:
            raise ValueError(f"keep-ratio must be in (0, 1], got {args.keep_ratio}")
        check_settings(args.epochs, args.batch_size, args.lr, args.loss,
                       args.contrastive_weight, args.temperature, args.max_length, 0.01, 0.1, 1.0)
        from attnprune.methods import registry

        if registry.get(args.method).kind != "token":
            raise ValueError(f"method: {args.method!r} is an attention-level method; "
                             f"embed-distill distils token pruning")
    except (ValueError, TypeError) as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        return 2
    from sentence_transformers import SentenceTransformer

    import attnprune

    kw = {"device": args.device} if args.device else {}
    teacher = SentenceTransformer(args.model, **kw)
    student = copy.deepcopy(teacher)
    try:
        if args.layers is not None:
            from attnprune.train.baselines import keep_first_layers

            if encoder_depth(teacher) is not None and args.layers >= encoder_depth(teacher):
                raise ValueError(f"layers must be below the model's {encoder_depth(teacher)} layers, "
                                 f"got {args.layers}")
            keep_first_layers(student[0].auto_model, args.layers)
        else:
            extra = {k: v for k, v in (("schedule", args.schedule), ("reduce", args.reduce),
                                       ("min_tokens", args.min_tokens)) if v is not None}
            attnprune.patch(student, args.method, keep_ratio=args.keep_ratio,
                            after_layer=args.after_layer, **extra)
    except ValueError as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        return 2
    length = args.max_length
    reference = before = None
    if held is not None:
        reference = embed_texts(teacher, held, batch_size=args.batch_size, max_length=length)
        before = embedding_cosine(student, reference, held, batch_size=args.batch_size,
                                  max_length=length)
    history = distill_embeddings(
        student, teacher, texts, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
        loss=args.loss, contrastive_weight=args.contrastive_weight,
        temperature=args.temperature, max_length=length, seed=args.seed,
        progress=not args.no_progress)
    for h in history:
        print("epoch {epoch}: ".format(**h) + "  ".join(
            f"{k} {v:.4f}" for k, v in h.items() if k != "epoch"))
    if held is not None:
        after = embedding_cosine(student, reference, held, batch_size=args.batch_size,
                                 max_length=length)
        print(f"{len(held)} held-out texts, mean cosine to the stock embeddings: zero-shot "
              f"{before.mean():.4f}, distilled {after.mean():.4f}")
    if attnprune.patch_state(student) is None:  # the depth baseline: a stock, shallower model
        student.save(args.out)
    else:
        attnprune.save_pretrained(student, args.out)
    print(f"saved: {args.out}")
    return 0



if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
