"""The training layer: the one training loop (``fit``), label-free distillation of
pruned sentence embeddings (``distill_embeddings``), ranking distillation, the schedule
search under a FLOPs budget and the layer-drop baselines. It imports the library below it
(``attnprune.api``, ``hosts``, ``methods``, ``measure``) and nothing above it."""

from attnprune.train.embed_distill import distill_embeddings
from attnprune.train.loop import fit

__all__ = ["distill_embeddings", "fit"]
