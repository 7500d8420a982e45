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

import math
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from attnprune import api

__all__ = ["distill_embeddings", "embedding_cosine", "main", "read_corpus"]

LOSSES = ("cosine", "mse")


def _is_st(model) -> bool:
    return any(c.__name__ == "SentenceTransformer" and c.__module__.startswith(
        "sentence_transformers.") for c in type(model).__mro__)


def _check_texts(texts, field: str = "texts") -> list[str]:
    if isinstance(texts, (str, bytes)) or not isinstance(texts, Sequence):
        raise TypeError(f"{field}: a list of strings, got {type(texts).__name__}")
    if len(texts) == 0:
        raise ValueError(f"{field}: empty; give at least one text")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"{field}[{i}]: a string, got {type(t).__name__}")
        if not t.strip():
            raise ValueError(f"{field}[{i}]: empty text")
    return list(texts)


def _vocab(model) -> dict:
    tok = getattr(model, "tokenizer", None)
    get = getattr(tok, "get_vocab", None)
    return get() if callable(get) else {}


def _dimension(model) -> int | None:
    # renamed in sentence-transformers 6 (get_sentence_embedding_dimension warns there)
    get = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    return get()


def _depth(model) -> int | None:
    """Layers of a SentenceTransformer's encoder (None if it has no HF config)."""
    from attnprune.train.baselines import _count_field

    config = getattr(getattr(model[0], "auto_model", None), "config", None)
    return None if config is None else getattr(config, _count_field(config))


def _check_models(student, teacher) -> None:
    for name, m in (("student", student), ("teacher", teacher)):
        if not _is_st(m):
            raise TypeError(f"{name}: a sentence-transformers SentenceTransformer, got "
                            f"{type(m).__name__}")
    if student is teacher:
        raise ValueError("teacher: the student itself; give a separate stock model (e.g. "
                         "copy.deepcopy of the model before patching)")
    if api.patch_state(student) is None and _depth(student) >= _depth(teacher):
        raise ValueError("student: neither patched nor shallower than the teacher; "
                         "attnprune.patch(student, method, ...) first, or keep its first "
                         "layers (attnprune.train.baselines.keep_first_layers)")
    if api.patch_state(teacher) is not None:
        raise ValueError("teacher: patched by attnprune; the teacher is the stock model")
    s_vocab, t_vocab = _vocab(student), _vocab(teacher)
    if not s_vocab or s_vocab != t_vocab:
        raise ValueError("teacher: its tokenizer differs from the student's (vocabulary); "
                         "the teacher is the stock model the student was patched from")
    s_dim, t_dim = _dimension(student), _dimension(teacher)
    if s_dim != t_dim:
        raise ValueError(f"teacher: embedding dimension {t_dim}, the student's is {s_dim}")


def _check_numbers(epochs, batch_size, lr, loss, contrastive_weight, temperature, max_length,
                   weight_decay, warmup_ratio, max_grad_norm) -> None:
    for name, v in (("epochs", epochs), ("batch_size", batch_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an integer ≥ 1, got {v!r}")
    for name, v in (("lr", lr), ("temperature", temperature)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be a number > 0, got {v!r}")
    for name, v in (("contrastive_weight", contrastive_weight), ("weight_decay", weight_decay),
                    ("max_grad_norm", max_grad_norm)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise ValueError(f"{name} must be a number ≥ 0, got {v!r}")
    if not (isinstance(warmup_ratio, (int, float)) and 0 <= warmup_ratio < 1):
        raise ValueError(f"warmup_ratio must be in [0, 1), got {warmup_ratio!r}")
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {', '.join(LOSSES)}, got {loss!r}")
    if contrastive_weight > 0 and batch_size < 2:
        raise ValueError("batch_size must be ≥ 2 with contrastive_weight > 0 (the other texts "
                         "of the batch are the negatives)")
    if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int)
                                   or max_length < 2):
        raise ValueError(f"max_length must be an integer ≥ 2 or None, got {max_length!r}")


class _Length:
    """Sets ``max_seq_length`` on models for a block and restores it (the caller's setting)."""

    def __init__(self, models, max_length: int | None) -> None:
        self.models, self.max_length, self.saved = models, max_length, []

    def __enter__(self):
        if self.max_length is not None:
            for m in self.models:
                self.saved.append((m, m.max_seq_length))
                m.max_seq_length = self.max_length
        return self

    def __exit__(self, *exc) -> None:
        for m, v in self.saved:
            m.max_seq_length = v


def _features(model, texts: list[str], device) -> dict:
    # preprocess: sentence-transformers 6's name for tokenize (which warns there)
    prep = getattr(model, "preprocess", None) or model.tokenize
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in prep(texts).items()}


def _embed(model, texts: list[str], batch_size: int, device) -> torch.Tensor:
    """(N, d) float32 sentence embeddings, eval mode, no gradients, in the texts' order."""
    out = []
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            for i in range(0, len(texts), batch_size):
                feats = _features(model, texts[i:i + batch_size], device)
                out.append(model(feats)["sentence_embedding"].float().cpu())
    finally:
        model.train(was)
    return torch.cat(out)


def embedding_cosine(model, reference: torch.Tensor, texts: list[str], *, batch_size: int = 32,
                     max_length: int | None = None) -> torch.Tensor:
    """Per-text cosine of ``model``'s embeddings of ``texts`` to ``reference`` (N, d)."""
    texts = _check_texts(texts)
    with _Length([model], max_length):
        emb = _embed(model, texts, batch_size, model.device)
    return F.cosine_similarity(emb, reference.float().cpu(), dim=-1)


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 or "LayerNorm" in n or "layer_norm" in n else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def _batch_loss(s: torch.Tensor, t: torch.Tensor, loss: str, contrastive_weight: float,
                temperature: float) -> tuple[torch.Tensor, dict]:
    s = s.float()
    if loss == "cosine":
        main = (1 - F.cosine_similarity(s, t, dim=-1)).mean()
    else:
        main = F.mse_loss(s, t)
    logs = {"distill": float(main.detach())}
    total = main
    if contrastive_weight > 0:
        logits = F.normalize(s, dim=-1) @ F.normalize(t, dim=-1).T / temperature
        nce = F.cross_entropy(logits, torch.arange(len(s), device=s.device))
        total = total + contrastive_weight * nce
        logs["contrastive"] = float(nce.detach())
    return total, logs


def distill_embeddings(
    student: nn.Module,
    teacher: nn.Module,
    texts: Sequence[str],
    *,
    epochs: int = 1,
    batch_size: int = 32,
    lr: float = 2e-5,
    loss: str = "cosine",
    contrastive_weight: float = 0.0,
    temperature: float = 0.05,
    max_length: int | None = None,
    weight_decay: float = 0.01,
    warmup_ratio: float = 0.1,
    max_grad_norm: float = 1.0,
    seed: int = 0,
    progress: bool = True,
) -> list[dict]:
    """Distill the stock ``teacher``'s sentence embeddings of ``texts`` into ``student`` (a
    SentenceTransformer patched with ``attnprune.patch``); no labels. Returns one dict per
    epoch (mean ``loss``, ``distill``, ``contrastive``, ``aux``); the student ends in eval
    mode.

    loss: "cosine" (1 − cos) or "mse" against the teacher's embedding of the same text;
    contrastive_weight w > 0 adds w·InfoNCE of each student embedding against the teacher
    embeddings of its batch (temperature). max_length: tokens per text for both models
    (None: the student's max_seq_length). The same seed gives the same student: the batch
    order comes from a generator of its own, dropout from a forked RNG (the caller's RNG
    state is left as it was).
    """
    from tqdm.auto import tqdm
    from transformers import get_linear_schedule_with_warmup

    _check_models(student, teacher)
    texts = _check_texts(texts)
    _check_numbers(epochs, batch_size, lr, loss, contrastive_weight, temperature, max_length,
                   weight_decay, warmup_ratio, max_grad_norm)
    if max_length is None:
        max_length = int(student.max_seq_length)
    device = student.device
    cuda = [device] if device.type == "cuda" else []
    history = []
    with _Length([student, teacher], max_length), torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        # the teacher's embeddings, once per text (the targets of every epoch)
        target = _embed(teacher, texts, batch_size, teacher.device).to(device)
        opt = torch.optim.AdamW(_param_groups(student, weight_decay), lr=lr)
        per_epoch = math.ceil(len(texts) / batch_size)
        steps = epochs * per_epoch
        sched = get_linear_schedule_with_warmup(opt, int(warmup_ratio * steps), steps)
        order = torch.Generator().manual_seed(seed)
        student.train()
        try:
            for epoch in range(1, epochs + 1):
                perm = torch.randperm(len(texts), generator=order).tolist()
                sums: dict[str, float] = {}
                bar = tqdm(range(per_epoch), desc=f"distill epoch {epoch}/{epochs}",
                           leave=False, disable=not progress)
                for step in bar:
                    idx = perm[step * batch_size:(step + 1) * batch_size]
                    if contrastive_weight > 0 and len(idx) < 2:
                        continue  # a last batch of one text has no negatives
                    feats = _features(student, [texts[i] for i in idx], device)
                    emb = student(feats)["sentence_embedding"]
                    total, logs = _batch_loss(emb, target[idx], loss, contrastive_weight,
                                              temperature)
                    aux = api.aux_loss(student)
                    if aux is not None:
                        total = total + aux
                        logs["aux"] = float(aux.detach())
                    logs["loss"] = float(total.detach())
                    opt.zero_grad(set_to_none=True)
                    total.backward()
                    if max_grad_norm:
                        torch.nn.utils.clip_grad_norm_(student.parameters(), max_grad_norm)
                    opt.step()
                    sched.step()
                    for k, v in logs.items():
                        sums[k] = sums.get(k, 0.0) + v
                    sums["steps"] = sums.get("steps", 0.0) + 1
                    bar.set_postfix(loss=f"{sums['loss'] / sums['steps']:.4f}")
                n = max(sums.pop("steps", 0.0), 1.0)
                history.append({"epoch": epoch, **{k: v / n for k, v in sums.items()}})
        finally:
            student.eval()
    return history


# ----------------------------------------------------------------------------- command line
def read_corpus(path: str | Path, field: str = "corpus") -> list[str]:
    """One text per line of a UTF-8 file; a blank line or bytes that are not UTF-8 are a
    ValueError naming the line."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{field}: {p} is not a file")
    texts = []
    for n, raw in enumerate(p.read_bytes().splitlines(), 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{field}: {p} line {n} is not UTF-8") from None
        if not line.strip():
            raise ValueError(f"{field}: {p} line {n} is blank; one text per line, no blank "
                             f"lines (remove them, e.g. grep -v '^[[:space:]]*$')")
        texts.append(line)
    if not texts:
        raise ValueError(f"{field}: {p} holds no text")
    return texts


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
        _check_numbers(args.epochs, args.batch_size, args.lr, args.loss,
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

            if _depth(teacher) is not None and args.layers >= _depth(teacher):
                raise ValueError(f"layers must be below the model's {_depth(teacher)} layers, "
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
        with _Length([teacher], length):
            reference = _embed(teacher, held, args.batch_size, teacher.device)
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
