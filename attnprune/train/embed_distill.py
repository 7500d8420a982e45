"""Label-free distillation of a token-pruned sentence embedder, the training of ``attnprune
embed-distill`` (:mod:`attnprune.research.embed_distill`, whose docstring gives the loss and
the optimiser): the student, a SentenceTransformer patched with ``attnprune.patch``, learns the
embeddings that the frozen stock teacher gives unlabeled texts of the target domain.

:func:`distill_embeddings` trains; :func:`embed_texts` and :func:`embedding_cosine` measure;
:func:`read_corpus` reads one text per line (UTF-8; a blank line is an error naming its line
number); :func:`check_settings` and :func:`encoder_depth` check the inputs before any work.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from attnprune import api

__all__ = ["check_settings", "distill_embeddings", "embed_texts", "embedding_cosine",
           "encoder_depth", "read_corpus"]

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


def encoder_depth(model) -> int | None:
    """Layers of a SentenceTransformer's encoder (None if it has no HF config)."""
    from attnprune.train.baselines import layer_count_field

    config = getattr(getattr(model[0], "auto_model", None), "config", None)
    return None if config is None else getattr(config, layer_count_field(config))


def _check_models(student, teacher) -> None:
    for name, m in (("student", student), ("teacher", teacher)):
        if not _is_st(m):
            raise TypeError(f"{name}: a sentence-transformers SentenceTransformer, got "
                            f"{type(m).__name__}")
    if student is teacher:
        raise ValueError("teacher: the student itself; give a separate stock model (e.g. "
                         "copy.deepcopy of the model before patching)")
    if api.patch_state(student) is None and encoder_depth(student) >= encoder_depth(teacher):
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


def check_settings(epochs, batch_size, lr, loss, contrastive_weight, temperature, max_length,
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


def embed_texts(model, texts: list[str], *, batch_size: int = 32,
                max_length: int | None = None) -> torch.Tensor:
    """(N, d) float32 sentence embeddings of ``texts`` by ``model`` (eval mode, no gradients, in
    the texts' order), at ``max_length`` tokens per text (None: the model's own setting)."""
    with _Length([model], max_length):
        return _embed(model, texts, batch_size, model.device)


def embedding_cosine(model, reference: torch.Tensor, texts: list[str], *, batch_size: int = 32,
                     max_length: int | None = None) -> torch.Tensor:
    """Per-text cosine of ``model``'s embeddings of ``texts`` to ``reference`` (N, d)."""
    texts = _check_texts(texts)
    emb = embed_texts(model, texts, batch_size=batch_size, max_length=max_length)
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
    check_settings(epochs, batch_size, lr, loss, contrastive_weight, temperature, max_length,
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


# ----------------------------------------------------------------------------- the corpus
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
