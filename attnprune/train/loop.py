"""One fine-tuning loop for sequence classification and regression, on HF ``accelerate``.

    classification:  loss = (1 − α)·CE(y, z) + α·τ²·KL(softmax(z_T/τ) ‖ softmax(z/τ)) + aux
    regression:      loss = (1 − α)·MSE(y, z) + α·MSE(z_T, z) + aux          (α = distill_weight)

z are the (patched) model's logits, z_T a frozen teacher's (e.g. the full fine-tuned model,
Hinton et al. 2015 distillation; off by default). A model with one output (HF's
``num_labels=1``) is a regression: its target is a real number, so the task loss is the squared
error (HF's own choice for that head) and distillation matches the teacher's output directly
(there is no distribution to soften: τ is unused). ``aux = attnprune.aux_loss(model)`` the
method's auxiliary losses of that forward (entropy-head CE, Gumbel budget, LTP sparsity,
attention/cost penalties, and with ``rank_distill`` w > 0 the ranking distillation of
:mod:`attnprune.train.rank_distill`: w·KL of the teacher's token importance against the scorer's, at
the first cut), so any registered method — token, attention or loss kind — trains
with the same loop. AdamW with linear warm-up and linear decay
(``transformers.get_linear_schedule_with_warmup``), gradient accumulation and gradient
clipping through ``accelerate`` (``accelerate launch`` runs it on several GPUs or nodes).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["fit"]


def _loss(model: nn.Module, batch: dict, teacher: nn.Module | None, alpha: float,
          tau: float, rank: float = 0.0) -> tuple[torch.Tensor, dict]:
    from contextlib import nullcontext

    from accelerate.utils import extract_model_from_parallel

    from attnprune import api

    # token_type_ids: the segment of each token of a sentence pair (BERT adds its embedding)
    inputs = {k: v for k, v in batch.items()
              if k in ("input_ids", "attention_mask", "token_type_ids")}
    t_out, ctx = None, nullcontext()
    if teacher is not None and (alpha > 0 or rank > 0):
        with torch.no_grad():  # first: ranking distillation hands its target to the forward
            t_out = teacher(**inputs, output_attentions=True) if rank > 0 else teacher(**inputs)
    if rank > 0:
        from attnprune.train.rank_distill import first_cut, rank_target, teacher_importance

        bare = extract_model_from_parallel(model)
        mask = inputs.get("attention_mask")
        if mask is None:
            mask = torch.ones_like(inputs["input_ids"])
        target = teacher_importance(t_out.attentions, mask, first_cut(bare) + 1)
        ctx = rank_target(bare, target, rank)
    with ctx:
        out = model(**inputs, labels=batch["labels"])
    regression = out.logits.shape[-1] == 1
    if regression:
        task = F.mse_loss(out.logits.squeeze(-1).float(), batch["labels"].float())
    else:
        task = F.cross_entropy(out.logits, batch["labels"])
    loss = task
    logs = {"task": float(task.detach())}
    if teacher is not None and alpha > 0:
        zt = t_out.logits
        if regression:
            kd = F.mse_loss(out.logits.float(), zt.float())
        else:
            kd = F.kl_div(F.log_softmax(out.logits / tau, -1), F.log_softmax(zt / tau, -1),
                          reduction="batchmean", log_target=True) * tau**2
        loss = (1 - alpha) * task + alpha * kd
        logs["distill"] = float(kd.detach())
    # the patch state sits on the model itself, not on a DDP (or other) wrapper around it,
    # where it would read as "no auxiliary loss"
    aux = api.aux_loss(extract_model_from_parallel(model))
    if aux is not None:
        loss = loss + aux
        logs["aux"] = float(aux.detach())
    return loss, logs


def fit(
    model: nn.Module,
    train_loader: Iterable,
    *,
    epochs: int = 1,
    lr: float = 5e-5,
    weight_decay: float = 0.01,
    warmup_ratio: float = 0.1,
    grad_accum: int = 1,
    max_grad_norm: float = 1.0,
    teacher: nn.Module | None = None,
    distill_weight: float = 0.0,
    distill_temperature: float = 2.0,
    rank_distill: float = 0.0,
    on_epoch_end: Callable[[int, nn.Module], dict] | None = None,
    progress: bool = True,
    desc: str = "train",
    mixed_precision: str = "no",
) -> list[dict]:
    """Fine-tune ``model`` on ``train_loader`` (a DataLoader of dicts with input_ids,
    attention_mask, labels and, for sentence pairs, token_type_ids; float labels and one model
    output for a regression); returns one log dict per epoch (mean losses, plus whatever
    ``on_epoch_end(epoch, model)`` returns, e.g. validation metrics).

    Bias and LayerNorm weights get no weight decay (the BERT recipe). The method's modules,
    registered on the model by ``attnprune.patch``, are trained with it. ``mixed_precision``
    ("no", "bf16", or "auto" = bf16 on a CUDA GPU, fp32 on CPU) goes to ``accelerate``.
    """
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs
    from tqdm.auto import tqdm
    from transformers import get_linear_schedule_with_warmup

    for name, v in (("epochs", epochs), ("grad_accum", grad_accum)):
        if int(v) < 1:
            raise ValueError(f"{name} must be ≥ 1, got {v}")
    if not 0 <= distill_weight <= 1:
        raise ValueError(f"distill_weight must be in [0, 1], got {distill_weight}")
    if not rank_distill >= 0:
        raise ValueError(f"rank_distill must be ≥ 0, got {rank_distill}")
    if rank_distill > 0 and teacher is None:
        raise ValueError("rank_distill needs a teacher (the full model whose token importance "
                         "the scorer learns)")
    if rank_distill > 0:  # a model it cannot distil into (a method reading no attention, …)
        from attnprune.train.rank_distill import first_cut

        first_cut(model)
    if mixed_precision not in ("no", "bf16", "auto"):
        raise ValueError(f"mixed_precision must be 'no', 'bf16' or 'auto', got {mixed_precision!r}")
    if mixed_precision == "auto":
        mixed_precision = "bf16" if torch.cuda.is_available() else "no"
    # several processes (DDP): some methods hold parameters that this loop does not train
    # (DTR's policy learns by REINFORCE in the causal host only), which DDP refuses unless told
    # to look for unused parameters; their gradients stay None, as in one process
    ddp = DistributedDataParallelKwargs(find_unused_parameters=True)
    acc = Accelerator(gradient_accumulation_steps=grad_accum, cpu=not torch.cuda.is_available(),
                      mixed_precision=mixed_precision, kwargs_handlers=[ddp])
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 or "LayerNorm" in n or "layer_norm" in n else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr)
    steps = epochs * math.ceil(len(train_loader) / grad_accum)
    sched = get_linear_schedule_with_warmup(opt, int(warmup_ratio * steps), steps)
    model, opt, train_loader, sched = acc.prepare(model, opt, train_loader, sched)
    if teacher is not None:
        if rank_distill > 0:  # its attention probabilities: SDPA does not return them
            teacher.set_attn_implementation("eager")
        teacher = acc.prepare_model(teacher, evaluation_mode=True)
        teacher.eval()
    history = []
    for epoch in range(1, epochs + 1):
        model.train()
        sums: dict[str, float] = {}
        n = 0
        bar = tqdm(train_loader, desc=f"{desc} epoch {epoch}/{epochs}", leave=False,
                   disable=not progress or not acc.is_main_process)
        for batch in bar:
            with acc.accumulate(model):
                loss, logs = _loss(model, batch, teacher, distill_weight, distill_temperature,
                                   rank_distill)
                acc.backward(loss)
                if acc.sync_gradients and max_grad_norm:
                    acc.clip_grad_norm_(model.parameters(), max_grad_norm)
                opt.step()
                sched.step()
                opt.zero_grad()
            n += 1
            for k, v in logs.items():
                sums[k] = sums.get(k, 0.0) + v
            bar.set_postfix(loss=f"{sums['task'] / n:.4f}")
        if acc.num_processes > 1:
            # each process saw its own batches: log the mean over all of them, the same number
            # on every process (the union of the loss terms, in case one was off somewhere)
            from accelerate.utils import gather_object

            keys = sorted(set(gather_object(list(sums))))
            tot = acc.reduce(torch.tensor([sums.get(k, 0.0) for k in keys] + [n],
                                          dtype=torch.float64, device=acc.device), reduction="sum")
            sums, n = dict(zip(keys, tot[:-1].tolist())), int(tot[-1])
        record = {"epoch": epoch, **{f"train_{k}": v / max(n, 1) for k, v in sums.items()}}
        if on_epoch_end is not None:
            model.eval()
            record.update(on_epoch_end(epoch, acc.unwrap_model(model)) or {})
        history.append(record)
    # drop accelerate's autocast wrapper of model.forward (mixed precision): evaluation, copies
    # and int8 quantization after training see the plain model
    acc.unwrap_model(model, keep_fp32_wrapper=False)
    return history
