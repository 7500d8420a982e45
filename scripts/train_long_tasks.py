"""Train a small Llama on the long-context suite (issue 33) so that pruning has something to
lose: a mix of the suite's training split and real text, until a deadline.

    python scripts/train_long_tasks.py --out DIR [--device cuda] [--max-minutes 4] [--length 1024]
        [--tokenizer bytes | bpe:N [--syllable-tokens] [--digits-per-token K]]

Tokens: bytes (ids 0 … 255), or a byte-level BPE learned here (:func:`build_tokenizer`) and saved
beside the weights, so ``attnprune reproduce long-tasks --tokenizer DIR/model`` reads the same
ids; lengths (``--length``, ``--min-length``) are in these tokens. ``--init DIR`` goes on
training a model this script saved (CPU training over several sessions): its tokenizer and
shape, each task's curriculum from the length it reached, new training examples (a new round).

Each row of a batch is, with probability ``--text-share``, a window of real Python source (the
corpus's training files: ``.py`` files of installed packages, LM loss on every byte), else an
example of a task of the suite's training split (loss on the answer bytes only) at a length
drawn from [``--min-length``, the current top]. At lengths too short for a task's default
options its counts (keys, values, chains, hops, words) are scaled down until the example fits
(:func:`fitted_example`). A needle-task prompt carries ``--questions`` questions after its
context (the example's own and others about the same context, :func:`extra_questions`), a
``--recall-share`` of the extra ones as a restated needle whose value is to be copied
(:func:`recall_lines`): one forward pass then supervises several retrievals. ``--prompt-loss W``
adds W times the mean loss on every other token of a task row (:func:`weighted_loss`);
``--repeat-share`` of the rows are a random token sequence written twice (:meth:`Rows.repeat`),
the data on which induction heads form; ``--syllable-is`` makes "KEY is" end in one token
that names the key's last syllable, so a needle's value is found by such a head.
``--spread-share`` gives a share of rows randomized positions (:func:`spread_positions`): a
short row's position ids spread over [0, ``--length``), so it shows the distances of a long one.

Making rows (generating the examples, encoding them) costs a CPU core 0.06–0.1 s per 10 k
tokens, more than a GPU's step of these tiny models. ``--data-workers N`` makes the batches
ahead in N processes (:class:`Prefetch`); each step's rows are then seeded by the step
(:meth:`Rows.rows_at`), so they are the same for any N, and a curriculum growth reaches the
rows 2·N − 1 steps late (the batches already asked for keep the old tops).

The top length grows from ``--min-length`` to ``--length`` either with time (over the first
half of the run) or, with ``--grow-at A``, by mastery: each task has its own top, which grows
by 25 % each time the task's quick check there (16 validation examples, greedy) reaches
accuracy A, so a task not yet learned does not hold the others back. AdamW, warm-up, then
cosine to the deadline (by mastery: the peak rate holds until every task's top is
``--length``, or until 75 % of the run, whichever comes first). The
deadline is wall time, checks included. bf16 autocast on CUDA. At the end: the model saved
with ``save_pretrained`` in ``DIR/model``, its ``model.safetensors``'s SHA-256 printed, and
each task's validation accuracy (greedy, exact match) at ``--length``: unpruned, and with the
prompt cut to its last 25 % (the check that the model uses its context); all of it in
``DIR/train.json``.
"""

from __future__ import annotations

import argparse
import collections
import functools
import hashlib
import json
import math
import multiprocessing
import queue
import random
import re
import sys
import time
from pathlib import Path

import torch

from attnprune.research.data import long_tasks as lt
from attnprune.research.experiments import long_tasks as ev
from attnprune.runs.results import atomic_write_text


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--max-minutes", type=float, default=4.0, help="training deadline (evaluation after it)")
    p.add_argument("--length", type=int, default=1024, help="the longest prompt (bytes); evaluated there")
    p.add_argument("--min-length", type=int, default=None,
                   help="the shortest prompt drawn, and where the curriculum starts (default: the --init run's, "
                        "else 384; at most --length)")
    p.add_argument("--tasks", default=",".join(lt.TASKS))
    p.add_argument("--text-share", type=float, default=0.25)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--ffn", type=int, default=384)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--batch-tokens", type=int, default=0,
                   help="> 0: a step holds max(--batch, this // the step's top length) rows")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--steps", type=int, default=20_000,
                   help="the schedule's length if the deadline is not hit first (0 with --init: "
                        "evaluate the saved model at --length, unchanged)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-n", type=int, default=64)
    p.add_argument("--questions", type=int, default=1,
                   help="needle tasks: questions asked per training prompt (the first is the example's)")
    p.add_argument("--recall-share", type=float, default=0.0,
                   help="share of the extra questions asked as a restated needle (induction warm-up)")
    p.add_argument("--grow-at", type=float, default=0.0,
                   help="> 0: a curriculum by mastery: the top length starts at --min-length and grows "
                        "25 %% each time every task's quick check there reaches this accuracy; the "
                        "learning rate stays at its peak until the top is --length, then decays to the "
                        "deadline (0: the top grows with time over the first half of the run)")
    p.add_argument("--check-steps", type=int, default=50, help="--grow-at: steps between quick checks")
    p.add_argument("--eval-every", type=float, default=0.0,
                   help="minutes between quick validation checks during training (0: none)")
    p.add_argument("--threads", type=int, default=0, help="torch threads on the CPU (0: torch's default)")
    p.add_argument("--code-packages", default=",".join(lt.DEFAULT_PACKAGES))
    p.add_argument("--tokenizer", default="bytes",
                   help="'bytes' (ids 0 … 255) or 'bpe:N': a byte-level BPE of N tokens trained on the "
                        "training split, saved with the model; lengths are in its tokens")
    p.add_argument("--digits-per-token", type=int, default=1, choices=[1, 2, 3],
                   help="bpe: a number is split into chunks of up to this many digits, each one token")
    p.add_argument("--syllable-tokens", action="store_true",
                   help="bpe: split lowercase text into consonant-vowel syllables first (the suite's "
                        "keys are three of them), so a key ends in one of 70 syllable tokens")
    p.add_argument("--syllable-is", action="store_true",
                   help="with --syllable-tokens: a syllable followed by ' is' is one token, so a needle's "
                        "'KEY is' ends in a token that names the key's last syllable, which a plain "
                        "induction head (match the previous token, copy the next) can look up")
    p.add_argument("--prompt-loss", type=float, default=0.0,
                   help="weight of the language-model loss on every other token of a task row (prompt, "
                        "questions, cues), added to the answer tokens' mean loss (0: answers only)")
    p.add_argument("--repeat-share", type=float, default=0.0,
                   help="share of rows that are a random token sequence written twice, with loss on the "
                        "second copy: the classic data on which induction heads form (a warm-up for "
                        "copying from the context)")
    p.add_argument("--hard-share", type=float, default=0.0,
                   help="share of task rows at the task's current top length with its full counts "
                        "(as the quick checks ask; the others: a length in [--min-length, top] and "
                        "counts drawn small)")
    p.add_argument("--spread-share", type=float, default=0.0,
                   help="share of rows whose position ids are a sorted random subset of [0, --length) "
                        "instead of 0, 1, 2, … (randomized positions, Ruoss et al. 2023): short rows then "
                        "show the model the distances of --length-token prompts")
    p.add_argument("--data-workers", type=int, default=0,
                   help="> 0: the training batches are made ahead in this many processes (a GPU's steps "
                        "outrun one core making rows); each step's rows are then seeded by its step")
    p.add_argument("--init", default="",
                   help="a folder this script wrote (DIR/model, DIR/train.json): go on training that "
                        "model, with its tokenizer, each task from the length its curriculum reached "
                        "(the shape options and --tokenizer are then taken from it)")
    a = p.parse_args(argv)
    a.tasks = tuple(t for t in a.tasks.split(",") if t)
    a.start_tops, a.round, prev = {}, 0, None
    if a.init:
        try:
            prev = json.loads((Path(a.init) / "train.json").read_text())
        except (OSError, ValueError) as e:
            p.error(f"--init: {a.init} needs the train.json and model/ this script writes ({e})")
        for k in ("tokenizer", "syllable_tokens", "syllable_is", "digits_per_token", "layers", "width", "heads",
                  "kv_heads", "ffn"):
            setattr(a, k, prev["args"].get(k, getattr(a, k)))
    if a.min_length is None:
        a.min_length = min(a.length, (prev["args"].get("min_length") if prev else None) or 384)
    if prev:
        reached = next((e["tops_reached"] for e in reversed(prev["log"]) if "tops_reached" in e), {})
        a.start_tops = {t: min(a.length, max(a.min_length, int(v))) for t, v in reached.items()}
        a.round = prev["args"].get("round", 0) + 1  # new training examples, not the first run's again
    a.code_packages = tuple(x for x in a.code_packages.split(",") if x)
    for t in a.tasks:
        if t not in lt.TASKS:
            p.error(f"--tasks: each one of {', '.join(lt.TASKS)}, got {t!r}")
    if not 0.0 <= a.spread_share <= 1.0:
        p.error(f"--spread-share: in [0, 1], got {a.spread_share}")
    if not 0.0 <= a.hard_share <= 1.0:
        p.error(f"--hard-share: in [0, 1], got {a.hard_share}")
    if a.prompt_loss < 0:
        p.error(f"--prompt-loss: ≥ 0, got {a.prompt_loss}")
    if not 0.0 <= a.repeat_share < 1.0 or a.repeat_share + a.text_share >= 1.0:
        p.error(f"--repeat-share: in [0, 1) and below 1 - --text-share, got {a.repeat_share}")
    if not 0.0 <= a.text_share < 1.0:
        p.error(f"--text-share: in [0, 1), got {a.text_share}")
    if a.syllable_is and not a.syllable_tokens:
        p.error("--syllable-is: needs --syllable-tokens")
    if not 16 <= a.min_length <= a.length:
        p.error(f"--min-length: in [16, --length], got {a.min_length}")
    if a.batch_tokens < 0:
        p.error(f"--batch-tokens: ≥ 0, got {a.batch_tokens}")
    if a.data_workers < 0:
        p.error(f"--data-workers: ≥ 0, got {a.data_workers}")
    if a.data_workers and "fork" not in multiprocessing.get_all_start_methods():
        p.error("--data-workers: needs the fork start method (Linux); use 0 here")
    if not 0.0 <= a.grow_at <= 1.0 or a.check_steps < 1:
        p.error(f"--grow-at: in [0, 1] and --check-steps ≥ 1, got {a.grow_at} and {a.check_steps}")
    if a.max_minutes <= 0 or a.batch < 1 or a.steps < 0 or a.eval_n < 1 or a.questions < 1:
        p.error("--max-minutes, --batch, --eval-n, --questions: must be > 0; --steps ≥ 0")
    if a.steps == 0 and not a.init:
        p.error("--steps 0 (evaluate only): needs --init, the model to evaluate")
    if a.tokenizer != "bytes":
        m = re.fullmatch(r"bpe:(\d+)", a.tokenizer)
        if not m or not 300 <= int(m.group(1)) <= 65_536:
            p.error(f"--tokenizer: 'bytes' or 'bpe:N' with N in [300, 65536], got {a.tokenizer!r}")
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device: cuda asked for, but torch sees no CUDA device")
    return a


def build_tokenizer(a):
    """``--tokenizer``: the byte tokenizer, or a byte-level BPE (``tokenizers``' trainer) of N
    tokens learned from training-split text only: each synthetic task's prompts, questions and
    answers at 2,048 bytes and 200 windows of the code corpus's training files, the same for
    every seed and task mix (seeds share one tokenizer). Numbers are split first into chunks of
    up to ``--digits-per-token`` digits (1: digit by digit, as Llama's tokenizer does; a space
    before a number stays with its first chunk); with chunks > 1 every chunk is put in the
    training text so that each is one token. ``<pad>`` is id 0. Deterministic: the same text
    in the same order."""
    if a.tokenizer == "bytes":
        return lt.ByteTokenizer()
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng, texts = random.Random("train_long_tasks:bpe"), []
    for task in lt.SYNTHETIC:
        for i in range(40):
            ex = lt.example(task, 2048, 10_000_000 + i, split="train", seed=0)
            texts += [ex.head, ex.tail, ex.target] + [q + t for q, t in extra_questions(ex, rng, 8)]
    files = lt.code_files("train", lt.DEFAULT_PACKAGES)
    for _ in range(200):
        raw = Path(files[rng.randrange(len(files))][1]).read_text("utf-8", errors="replace")
        s = rng.randrange(max(1, len(raw) - 4096))
        texts.append(raw[s:s + 4096])
    # pieces that must each be one token, with a space before and without, put in the text 50
    # times: every chunk of up to --digits-per-token digits (when > 1) and, with
    # --syllable-tokens, every syllable
    pieces = ([f"{i:0{k}d}" for k in range(1, a.digits_per_token + 1) for i in range(10 ** k)]
              if a.digits_per_token > 1 else [])
    pieces += list(lt.SYLLABLES) if a.syllable_tokens else []
    pieces += [f"{s} is" for s in lt.SYLLABLES] if a.syllable_is else []
    texts += ["\n".join(pieces)] * 50 + ["".join(f" {c}" for c in pieces)] * 50 if pieces else []
    n = int(a.tokenizer.split(":")[1])
    bpe = Tokenizer(models.BPE())
    chunk = pre_tokenizers.Split(Regex(rf" ?[0-9]{{1,{a.digits_per_token}}}"), "isolated")
    splits = [chunk]
    if a.syllable_tokens:
        is_ = "(?: is(?![a-z]))?" if a.syllable_is else ""
        splits.append(pre_tokenizers.Split(Regex(f" ?[{lt.CONSONANTS}][{lt.VOWELS}]{is_}"), "isolated"))
    if a.syllable_is:  # ByteLevel's own word split (GPT-2's) would cut "lo is" again: the same split,
        # done here with "syllable is" kept whole
        splits.append(pre_tokenizers.Split(Regex(
            f" ?[{lt.CONSONANTS}][{lt.VOWELS}] is(?![a-z])|'s|'t|'re|'ve|'m|'ll|'d| ?\\p{{L}}+| ?\\p{{N}}+"
            "| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"), "isolated"))
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=not a.syllable_is)])
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=n, special_tokens=["<pad>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    vocab = bpe.get_vocab()
    # a one-syllable key never occurs: "syllable is" need not be a token after a space
    need = [c.replace(" ", "Ġ") for c in pieces] + ["Ġ" + c for c in pieces if not c.endswith(" is")]
    short = sum(c not in vocab for c in need)
    if short:
        raise ValueError(f"--tokenizer: {n} tokens leave {short} of the {len(need)} digit chunks and "
                         f"syllables (with a space before and without) in pieces; ask for more tokens")
    return PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>")


def _measure(a, tok):
    """The suite generator's ``tokenizer``: None for bytes (lengths in bytes), else ``tok``."""
    return None if a.tokenizer == "bytes" else tok


def _encode(tok, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False)) if text else []


class RowEncoder:
    """A BPE tokenizer's ``encode`` for making rows: the Rust tokenizer called directly (the
    same ids as ``tok.encode(text, add_special_tokens=False)``, without the Python wrapper), the
    ids of the last 4,096 texts kept: a prompt encoded while the generator fitted it to its
    length is not encoded again for its row, nor a noise sentence for each example."""

    def __init__(self, tok):
        self.backend, self.kept = tok.backend_tokenizer, collections.OrderedDict()

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if add_special_tokens:
            raise ValueError("add_special_tokens: rows carry none")
        ids = self.kept.get(text)
        if ids is None:
            ids = self.backend.encode(text, add_special_tokens=False).ids
            self.kept[text] = ids
            if len(self.kept) > 4096:
                self.kept.popitem(last=False)
        return ids


def build_model(a, vocab_size: int = 256):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(a.seed)
    conf = LlamaConfig(vocab_size=vocab_size, hidden_size=a.width, intermediate_size=a.ffn,
                       num_hidden_layers=a.layers, num_attention_heads=a.heads,
                       num_key_value_heads=a.kv_heads, max_position_embeddings=2 * a.length,
                       bos_token_id=None, eos_token_id=None, pad_token_id=0, tie_word_embeddings=True)
    return LlamaForCausalLM(conf)


_NEEDLE = re.compile(r"The magic number for (\w+) is (\d+)\.")
_ASSIGN = re.compile(r"VAR (\w+) = (\w+)\.")


def extra_questions(ex, rng: random.Random, k: int) -> list[tuple[str, str]]:
    """Up to ``k`` more (tail, target) pairs about the same context, read back from the
    needles, each tail a question with its cue as the generator writes them (training only:
    each forward pass then supervises several retrievals). Multi-key: other keys; multi-value:
    every key, its values in order; variable tracking: any variable of any chain (1 to
    ``hops`` hops back)."""
    if k < 1 or ex.task not in ("multikey", "multivalue", "vartrack"):
        return []
    pairs = []
    if ex.task in ("multikey", "multivalue"):
        found: dict[str, list[str]] = {}
        for key, v in _NEEDLE.findall(ex.head):
            found.setdefault(key, []).append(v)
        for key, vs in found.items():
            q = (f"What is the magic number for {key}?" if ex.task == "multikey"
                 else f"What are all the magic numbers for {key}?")
            pairs.append((q, " " + " ".join(vs) + "\n"))
    else:
        value = dict(_ASSIGN.findall(ex.head))
        for var in value:
            v = var
            while v in value:
                v = value[v]
            pairs.append((f"What is the value of VAR {var}?", f" {v}\n"))
    pairs = [(f"\n{q}\n{lt.CUE}{lt.answer_prefix(ex.task, q)}", t) for q, t in pairs if q != ex.question]
    rng.shuffle(pairs)
    return pairs[:k]


def fitted_example(task: str, length: int, index: int, seed: int, split: str = "train",
                   scale: float = 1.0, **kw) -> lt.LongExample:
    """The training example of ``task`` at ``length`` with the task's default options, or, where
    they do not fit (short curriculum lengths), with its counts (keys, values, chains, hops,
    words) scaled down until they do: short prompts hold fewer needles, so the retrieval is
    learned first on short, dense prompts and then stretched. ``scale`` < 1 starts from
    that share of the default counts (training draws it as u², u uniform, so one-needle prompts,
    where copying is learned, stay in every batch)."""
    counts = {k: v for k, v in lt.OPTIONS[task].items() if k in ("keys", "values", "chains", "hops", "words")}
    while True:
        opts = {k: max(lt._LOWER[k], round(v * scale)) for k, v in counts.items()}
        if task == "freqwords":
            opts["words"] = max(opts["words"], lt.OPTIONS[task]["top"] + 1)
        try:
            return lt.example(task, length, index, split=split, seed=seed, **kw, **opts)
        except ValueError as e:
            if "too short" not in str(e) or scale < 1e-3:  # the smallest counts do not fit either
                raise
            scale *= 0.8


def recall_lines(ex) -> list[tuple[str, str]]:
    """The context's needles split before their value ("The magic number for KEY is", " V."):
    a needle restated after the context, whose value an induction head copies (training only:
    ``--recall-share`` of the extra questions take this easier form)."""
    if ex.task in ("multikey", "multivalue"):
        return [(f"The magic number for {k} is", f" {v}.") for k, v in _NEEDLE.findall(ex.head)]
    if ex.task == "vartrack":
        return [(f"VAR {k} =", f" {v}.") for k, v in _ASSIGN.findall(ex.head)]
    return []


class Rows:
    """Training rows: (ids, labels) lists, task examples or real-text windows, seeded."""

    def __init__(self, a, tok=None):
        self.rng = random.Random(f"train_long_tasks:{a.seed}" + (f":round{a.round}" if a.round else ""))
        self.a, self.index = a, a.round * 10_000_000
        self.tok = tok or lt.ByteTokenizer()
        self.enc = RowEncoder(self.tok) if hasattr(self.tok, "backend_tokenizer") else self.tok
        self.files = lt.code_files("train", a.code_packages) if a.text_share or "code" in a.tasks else []
        self.texts: dict[str, str] = {}

    def text(self, length: int) -> tuple[list[int], list[int]]:
        for _ in range(100):
            _, path = self.files[self.rng.randrange(len(self.files))]
            raw = Path(path).read_bytes()
            if len(raw) > length + 1 and raw.isascii():
                s = self.rng.randrange(len(raw) - length)
                if self.a.tokenizer == "bytes":
                    ids = list(raw[s:s + length])
                else:  # a BPE token is at most a few bytes: 16 bytes a token is plenty
                    ids = _encode(self.enc, raw[s:s + 16 * length].decode())[:length]
                    if len(ids) < length:
                        continue
                return ids, ids
        raise RuntimeError("no training file long enough for a real-text window")

    def repeat(self, length: int) -> tuple[list[int], list[int]]:
        """A random sequence of ⌊length/2⌋ token ids (never 0, the padding) written twice; loss on
        the second copy after its first token (which nothing predicts): every label is a copy
        of the token that followed the current one the first time."""
        n = length // 2
        x = [self.rng.randrange(1, len(self.tok) if self.a.tokenizer != "bytes" else 256) for _ in range(n)]
        return x + x, [-100] * (n + 1) + x[1:]

    def task(self, length: int, task: str, scale: float | None = None) -> tuple[list[int], list[int]]:
        self.index += 1
        kw = {"code_packages": self.a.code_packages} if task == "code" else {}
        scale = self.rng.random() ** 2 if scale is None else scale
        ex = fitted_example(task, length, self.index, self.a.seed, scale=scale,
                            tokenizer=_measure(self.a, self.enc), **kw)
        enc = functools.partial(_encode, self.enc)
        ids = enc(ex.head)
        labels = [-100] * len(ids)
        extra = extra_questions(ex, self.rng, self.a.questions - 1)
        recall = recall_lines(ex)
        for j, (tail_text, target) in enumerate([(ex.tail, ex.target)] + extra):
            if j and recall and self.rng.random() < self.a.recall_share:  # a needle restated
                prefix, target = recall[self.rng.randrange(len(recall))]
                tail_text = "\n" + prefix
            tail, answer = enc(tail_text), enc(target)
            ids += tail + answer
            labels += [-100] * len(tail) + answer
        return ids, labels

    def batch(self, tops: dict[str, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A batch at the tasks' current top lengths (``tops``: task → top; real text at the
        longest of them), drawn from this object's running random stream."""
        return collate(self.rows(tops))

    def rows_at(self, step: int, tops: dict[str, int]) -> list[tuple[list[int], list[int]]]:
        """Step ``step``'s rows at ``tops``, a function of (seed, round, step, tops) only: what
        :class:`Prefetch`'s workers make, whichever worker makes it."""
        self.rng = random.Random(f"train_long_tasks:{self.a.seed}:round{self.a.round}:step{step}")
        self.index = (self.a.round * 1_000_000 + step) * 1_000_000  # example indices of this step
        return self.rows(tops)

    def rows(self, tops: dict[str, int]) -> list[tuple[list[int], list[int]]]:
        rows, top = [], max(tops.values())
        for _ in range(max(self.a.batch, self.a.batch_tokens // top)):
            u = self.rng.random()
            if u < self.a.repeat_share:
                rows.append(self.repeat(self.rng.randrange(self.a.min_length, top + 1)))
            elif u < self.a.repeat_share + self.a.text_share:
                rows.append(self.text(self.rng.randrange(self.a.min_length, top + 1)))
            else:
                task = self.rng.choice(self.a.tasks)
                if self.rng.random() < self.a.hard_share:  # as the quick check asks: the top, all counts
                    rows.append(self.task(tops[task], task, scale=1.0))
                else:
                    rows.append(self.task(self.rng.randrange(self.a.min_length, tops[task] + 1), task))
        return rows


def collate(rows: list[tuple[list[int], list[int]]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, labels, attention mask), right-padded with id 0 (no loss, no attention)."""
    n = max(len(r[0]) for r in rows)
    ids = torch.zeros(len(rows), n, dtype=torch.long)
    labels = torch.full((len(rows), n), -100, dtype=torch.long)
    mask = torch.zeros(len(rows), n, dtype=torch.long)
    for i, (x, y) in enumerate(rows):
        ids[i, :len(x)], labels[i, :len(y)], mask[i, :len(x)] = torch.tensor(x), torch.tensor(y), 1
    return ids, labels, mask


def _work(rows: Rows, inbox, outbox) -> None:
    """A :class:`Prefetch` worker: make the rows of each (step, tops) asked, in order, until None."""
    torch.set_num_threads(1)
    for step, tops in iter(inbox.get, None):
        try:
            outbox.put(("rows", rows.rows_at(step, tops)))
        except Exception as e:  # noqa: BLE001 - handed to the trainer, which raises it
            outbox.put(("error", f"step {step}: {type(e).__name__}: {e}"))
    outbox.cancel_join_thread()  # rows made ahead and never asked for: exit without flushing them


class Prefetch:
    """``--data-workers``: batches made ahead in N forked worker processes (they inherit the
    tokenizer and the corpus list; nothing but (step, tops) and token lists crosses a queue).
    Step ``s`` goes to worker ``s mod N`` and its rows are :meth:`Rows.rows_at` ``(s, tops)``
    with the tops known when ``s`` was asked for, 2·N − 1 steps ahead, so the stream depends on
    the seed and the curriculum, not on which worker was quicker. The tensors are made here.
    Close it (or use it in a ``with``) to stop the workers."""

    def __init__(self, a, tok, workers: int):
        ctx = multiprocessing.get_context("fork")
        self.inbox = [ctx.Queue() for _ in range(workers)]
        self.outbox = [ctx.Queue() for _ in range(workers)]
        self.procs = [ctx.Process(target=_work, args=(Rows(a, tok), i, o), daemon=True)
                      for i, o in zip(self.inbox, self.outbox)]
        for proc in self.procs:
            proc.start()
        self.depth, self.asked, self.next = 2 * len(self.procs), 0, 0

    def batch(self, step: int, tops: dict[str, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if step != self.next:
            raise ValueError(f"step: batches are asked for in order, expected {self.next}, got {step}")
        n = len(self.procs)
        while self.asked < step + self.depth:
            self.inbox[self.asked % n].put((self.asked, dict(tops)))
            self.asked += 1
        self.next += 1
        while True:
            try:
                kind, got = self.outbox[step % n].get(timeout=5)
                break
            except queue.Empty:
                if not self.procs[step % n].is_alive():
                    raise RuntimeError(f"--data-workers: worker {step % n} died "
                                       f"(exit code {self.procs[step % n].exitcode})") from None
        if kind == "error":
            raise RuntimeError(f"--data-workers: a worker failed at {got}")
        return collate(got)

    def close(self) -> None:
        for box in self.inbox:
            box.put(None)
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
                proc.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def train(a, model, tok, device, log):
    if a.data_workers:
        with Prefetch(a, tok, a.data_workers) as ahead:
            return _train(a, model, tok, device, log, ahead.batch)
    rows = Rows(a, tok)
    return _train(a, model, tok, device, log, lambda step, tops: rows.batch(tops))


def _train(a, model, tok, device, log, batch):
    fused = {"fused": True} if device.type == "cuda" else {}
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01, **fused)
    deadline, warm = a.max_minutes * 60, max(1, a.steps // 50)
    t0, done = time.perf_counter(), 0
    last_eval = t0
    # --grow-at: each task's own top length, and the fraction of the run when the curriculum
    # ended (every task at --length, or 75 % of the run: the learning rate decays after it)
    tops, reached = {t: a.start_tops.get(t, a.min_length) for t in a.tasks}, None
    for step in range(a.steps):
        frac = max(step / a.steps, (time.perf_counter() - t0) / deadline)
        if frac >= 1.0 and step:
            break
        # warm-up over the first 2 % of the schedule, by steps or by time, whichever is first
        rise = min(1.0, max((step + 1) / warm, frac / 0.02))
        if a.grow_at:  # peak until the curriculum is done, then cosine to the deadline
            if reached is None and frac >= 0.75:
                reached = frac
            decay = 0.0 if reached is None else (frac - reached) / max(1e-9, 1.0 - reached)
        else:
            decay = frac
            tops = {t: lo + int((a.length - lo) * min(1.0, 2 * frac))
                    for t, lo in ((t, a.start_tops.get(t, a.min_length)) for t in a.tasks)}
        lr = a.lr * rise * 0.5 * (1 + math.cos(math.pi * min(decay, 1.0)))
        for g in opt.param_groups:
            g["lr"] = lr
        ids, labels, mask = batch(step, tops)
        pos = spread_positions(mask, a.length, a.spread_share, f"{a.seed}:round{a.round}:step{step}")
        ids, labels, mask, pos = (None if t is None else t.to(device) for t in (ids, labels, mask, pos))
        with torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else _null():
            if a.prompt_loss:
                loss = weighted_loss(model(input_ids=ids, attention_mask=mask, position_ids=pos).logits, ids,
                                     labels, mask, a.prompt_loss)
            else:
                loss = model(input_ids=ids, attention_mask=mask, position_ids=pos, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        done += 1
        if a.grow_at and reached is None and (step + 1) % a.check_steps == 0:
            model.eval()
            quick = evaluate(a, model, tok, lengths=tops, n=16, truncated=False, quiet=True)
            model.train()
            log.append({"step": step, "quick_eval": quick, "lengths": dict(tops)})
            grown = {t: min(a.length, int(tops[t] * 1.25)) for t, v in quick.items()
                     if v["full"] >= a.grow_at and tops[t] < a.length}
            tops.update(grown)
            if grown:
                log[-1]["grown_to"] = grown
            if all(v == a.length for v in tops.values()):
                reached = frac
            print(json.dumps(log[-1]), flush=True)
        elif a.eval_every and time.perf_counter() - last_eval >= a.eval_every * 60:
            last_eval = time.perf_counter()
            model.eval()
            quick = evaluate(a, model, tok, lengths=tops, n=16, truncated=False, quiet=True)
            model.train()
            log.append({"step": step, "quick_eval": quick, "lengths": dict(tops)})
            print(json.dumps(log[-1]), flush=True)
        if step % 25 == 0:
            rec = {"step": step, "loss": round(loss.item(), 4), "lr": lr, "top": max(tops.values()),
                   "elapsed_s": round(time.perf_counter() - t0, 1)}
            log.append(rec)
            print(json.dumps(rec), flush=True)
    log.append({"steps_done": done, "train_s": round(time.perf_counter() - t0, 1), "tops_reached": tops,
                "curriculum_done_at": reached})


def spread_positions(mask: torch.Tensor, length: int, share: float, key: str) -> torch.Tensor | None:
    """``--spread-share``: position ids (B, n) where each row, with probability ``share``, takes a
    sorted random subset of [0, ``length``) for its real tokens (``mask``) instead of 0 … n − 1,
    so that a short row spans the distances of a ``length``-token prompt (rotary positions see
    only differences). Seeded by ``key`` (seed, round, step): the same for any --data-workers.
    None when ``share`` is 0 (the model's own 0 … n − 1)."""
    if not share:
        return None
    gen = torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little"))
    b, n = mask.shape
    pos = torch.arange(n).repeat(b, 1)
    for i, real in enumerate(mask.sum(1).tolist()):
        if torch.rand((), generator=gen) < share and real < length:
            pos[i, :real] = torch.randperm(length, generator=gen)[:real].sort().values
    return pos


def weighted_loss(logits, ids, labels, mask, w: float) -> torch.Tensor:
    """``--prompt-loss``: the mean next-token loss on the answer tokens (``labels`` ≠ -100) plus
    ``w`` times the mean on every other real token (``mask``; real-text rows, whose labels are
    their ids, count as answers), so the heads that read a prompt (previous-token, induction)
    get a gradient from every position, not only from the few answer tokens."""
    logits, target = logits[:, :-1].float(), ids[:, 1:]
    answer = labels[:, 1:] != -100
    other = mask[:, 1:].bool() & ~answer
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, reduction="none")
    loss = (nll * answer).sum() / answer.sum().clamp(min=1)
    return loss + w * (nll * other).sum() / other.sum().clamp(min=1)


def _null():
    import contextlib

    return contextlib.nullcontext()


def evaluate(a, model, tok, lengths: dict[str, int] | None = None, n: int | None = None,
             truncated: bool = True, quiet: bool = False) -> dict:
    """Each task's validation accuracy (greedy, exact match) at its length in ``lengths``
    (default: ``--length`` for all): unpruned and, with ``truncated``, the last 25 % only."""
    lengths, n = lengths or dict.fromkeys(a.tasks, a.length), n or a.eval_n
    specs = {"full": {"kind": "full", "keep": 1.0}}
    if truncated:
        specs["last 25 %"] = {"kind": "recent", "keep": 0.25}
    out = {}
    for task, length in lengths.items():
        kw = {"code_packages": a.code_packages} if task == "code" else {}
        exs = [fitted_example(task, length, i, a.seed, "validation", tokenizer=_measure(a, tok), **kw)
               for i in range(n)]
        res = ev.evaluate(model, tok, exs, specs)
        out[task] = {k: sum(v["right"]) / len(v["right"]) for k, v in res.items()}
        if task in ("multikey", "vartrack"):  # answered a distractor (another needle's value)
            out[task]["distractor"] = sum(
                o.split("\n", 1)[0].split() in [[d] for d in ex.distractors]
                for o, ex in zip(res["full"]["outputs"], exs)) / len(exs)
        wrong = [f"{' '.join(ex.answers)} -> {o.split(chr(10), 1)[0].strip()}"
                 for o, r, ex in zip(res["full"]["outputs"], res["full"]["right"], exs) if not r]
        if quiet and wrong:  # the quick checks log two wrong answers (what the model confuses)
            out[task]["wrong"] = wrong[:2]
        if not quiet:
            print(f"{task:<11} " + "  ".join(f"{k} {v:.3f}" for k, v in out[task].items())
                  + f"  (n {n}, {length} {'bytes' if a.tokenizer == 'bytes' else 'tokens'})", flush=True)
    return out


def main(argv=None) -> int:
    a = parse(sys.argv[1:] if argv is None else argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device("cuda" if a.device == "cuda" or (a.device == "auto" and torch.cuda.is_available())
                          else "cpu")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.init:  # the saved model and the tokenizer saved with it
        from transformers import AutoModelForCausalLM

        tok = ev.load_tokenizer("bytes" if a.tokenizer == "bytes" else str(Path(a.init) / "model"))
        model = AutoModelForCausalLM.from_pretrained(Path(a.init) / "model").float().to(device).train()
        print(f"from {a.init}: tops {a.start_tops}", flush=True)
    else:
        tok = build_tokenizer(a)
        model = build_model(a, len(tok) if a.tokenizer != "bytes" else 256).to(device).train()
    print(f"{sum(p.numel() for p in model.parameters()):,} parameters on {device}", flush=True)
    log: list = []
    train(a, model, tok, device, log)
    model = model.float().cpu().eval()
    model.save_pretrained(out / "model")
    if a.tokenizer != "bytes":
        tok.save_pretrained(out / "model")
    sha = hashlib.sha256((out / "model" / "model.safetensors").read_bytes()).hexdigest()
    print(f"model.safetensors sha256 {sha}", flush=True)
    accuracy = evaluate(a, model, tok)
    atomic_write_text(out / "train.json", json.dumps(
        {"args": vars(a), "sha256": sha, "log": log, "validation_accuracy": accuracy}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
