"""Hugging Face integrations: ``transformers.Trainer`` training of a patched model.

Pipelines need nothing from here: a patched model keeps its class, its ``forward`` signature
and its outputs, so ``pipeline("text-classification", model=m, tokenizer=tok)`` and
``pipeline("text-generation", ...)`` (HF ``generate`` with a KV cache and left-padded batches)
run it as they are; ``tests/test_integrations.py`` checks that batched and single inputs give
the same scores and that generation with a cache matches a full recompute.

Training needs one thing the Trainer cannot know: the method's auxiliary loss (budget,
sparsity, policy or cost penalty, :func:`attnprune.aux_loss`) of the forward that produced
the task loss. :class:`PruningTrainer` adds it, and optionally distils from a frozen teacher
(Hinton et al. 2015; the same objective as ``attnprune.train``):

    loss = (1 − α)·L_task + α·τ²·KL(softmax(z_T/τ) ‖ softmax(z/τ)) + w_aux·aux

A subclass and not a ``TrainerCallback``: callbacks see neither the batch nor the loss tensor
(``on_step_end`` comes after ``backward``), so a callback could not put the aux term into the
gradient. Overriding ``compute_loss`` is the hook the Trainer documents for this.

Everything else is the Trainer's own: it moves the model to its device, wraps it (accelerate,
DDP), calls ``train()`` / ``eval()`` (the method module is a submodule and follows), and saves
checkpoints as safetensors; the method's parameters are registered on the model
(``attnprune_method.*``), so they are saved, resumed and loaded with it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Trainer

from attnprune.api import aux_loss

__all__ = ["PruningTrainer", "distillation_loss"]


def distillation_loss(student: torch.Tensor, teacher: torch.Tensor, temperature: float,
                      mask: torch.Tensor | None = None) -> torch.Tensor:
    """τ²·KL(softmax(teacher/τ) ‖ softmax(student/τ)), averaged over examples (logits (B, C))
    or over the real positions of ``mask`` (logits (B, T, V), mask (B, T)).

    The τ² factor keeps the gradient's scale independent of τ (Hinton et al. 2015, §2).
    """
    if student.shape != teacher.shape:
        raise ValueError(f"teacher: its logits have shape {tuple(teacher.shape)}, the model's "
                         f"{tuple(student.shape)}; distillation needs the same label space")
    log_p = F.log_softmax(student.float() / temperature, -1)
    log_q = F.log_softmax(teacher.float() / temperature, -1)
    kl = (log_q.exp() * (log_q - log_p)).sum(-1)  # (B,) or (B, T)
    if kl.ndim > 1 and mask is not None:
        w = mask.to(kl.dtype)
        return (kl * w).sum() / w.sum().clamp_min(1) * temperature**2
    return kl.mean() * temperature**2


class PruningTrainer(Trainer):
    """``transformers.Trainer`` whose training loss adds the method's auxiliary loss and,
    with a ``teacher``, a distillation term.

    ``teacher``: a frozen model with the same outputs (e.g. the unpatched fine-tuned model);
    ``distill_weight`` α ∈ [0, 1] and ``distill_temperature`` τ > 0 apply only with a teacher;
    ``aux_weight`` w ≥ 0 scales :func:`attnprune.aux_loss`. Evaluation losses are the task
    loss alone, so ``eval_loss`` compares with an unpatched model's. Logs gain ``aux_loss``
    and ``distill_loss`` (means over the steps since the last log).
    """

    def __init__(self, *args, teacher: nn.Module | None = None, distill_weight: float = 0.5,
                 distill_temperature: float = 2.0, aux_weight: float = 1.0, **kwargs):
        if not 0.0 <= float(distill_weight) <= 1.0:
            raise ValueError(f"distill_weight must be in [0, 1], got {distill_weight}")
        if not float(distill_temperature) > 0:
            raise ValueError(f"distill_temperature must be > 0, got {distill_temperature}")
        if not float(aux_weight) >= 0:
            raise ValueError(f"aux_weight must be ≥ 0, got {aux_weight}")
        if teacher is not None and not isinstance(teacher, nn.Module):
            raise ValueError(f"teacher must be a torch.nn.Module, got {type(teacher).__name__}")
        super().__init__(*args, **kwargs)
        self.distill_weight = float(distill_weight)
        self.distill_temperature = float(distill_temperature)
        self.aux_weight = float(aux_weight)
        self.teacher = teacher
        if teacher is not None:
            teacher.requires_grad_(False)
            teacher.eval().to(self.args.device)
        self._parts: dict[str, list[float]] = {}

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The Trainer's task loss, plus distillation and the method's aux loss in training."""
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True,
                                             num_items_in_batch=num_items_in_batch)
        if model.training:
            # The Trainer divides a per-batch mean by the accumulation steps after this call,
            # unless the task loss is already normalised over the accumulated batch; our
            # terms are per-batch means, so they take that division here in that case.
            scaled = self.loss_is_scaled_for_ga
            if scaled is None:
                scaled = ((self.model_accepts_loss_kwargs and num_items_in_batch is not None)
                          or self.compute_loss_func is not None)
            ga = getattr(self, "current_gradient_accumulation_steps", None) or \
                self.args.gradient_accumulation_steps
            per_batch = 1.0 / ga if scaled else 1.0
            if self.teacher is not None and self.distill_weight > 0:
                kd = self._distill(outputs, inputs)
                loss = (1 - self.distill_weight) * loss + self.distill_weight * per_batch * kd
                self._parts.setdefault("distill_loss", []).append(float(kd.detach()))
            aux = aux_loss(self.accelerator.unwrap_model(model))
            if aux is not None and self.aux_weight > 0:
                loss = loss + self.aux_weight * per_batch * aux
                self._parts.setdefault("aux_loss", []).append(float(aux.detach()))
        return (loss, outputs) if return_outputs else loss

    def _distill(self, outputs, inputs) -> torch.Tensor:
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs[1]
        feed = {k: v for k, v in inputs.items() if k not in ("labels", "num_items_in_batch")}
        with torch.no_grad():
            t = self.teacher(**feed)
        t_logits = t["logits"] if isinstance(t, dict) else t[0]
        return distillation_loss(logits, t_logits, self.distill_temperature,
                                 inputs.get("attention_mask"))

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        """Add the mean aux / distillation terms since the last log to the training logs."""
        if "loss" in logs:
            for name, values in self._parts.items():
                if values:
                    logs[name] = round(sum(values) / len(values), 6)
            self._parts = {}
        super().log(logs, *args, **kwargs)
