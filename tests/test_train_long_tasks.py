"""The long-task training recipe (scripts/train_long_tasks.py): the extra questions a training
prompt carries are right, and only answer bytes carry loss."""

from __future__ import annotations

import importlib.util
import random
import re
from pathlib import Path

import pytest

from attnprune.research.data import long_tasks as lt

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "train_long_tasks.py"


@pytest.fixture(scope="module")
def tl():
    spec = importlib.util.spec_from_file_location("train_long_tasks", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _truth(ex: lt.LongExample, tail: str) -> str:
    """The answer of the question in ``tail`` about ``ex``'s context, worked out from the
    needles."""
    question = tail.strip().split("\n")[0]
    if ex.task == "vartrack":
        var = question.rsplit(" ", 1)[1][:-1]
        table = dict(re.findall(r"VAR (\w+) = (\w+)\.", ex.head))
        while var in table:
            var = table[var]
        return f" {var}\n"
    key = question.rsplit(" ", 1)[1][:-1]
    return " " + " ".join(re.findall(rf"The magic number for {key} is (\d+)\.", ex.head)) + "\n"


@pytest.mark.parametrize("task", ["multikey", "multivalue", "vartrack"])
def test_extra_questions_are_answered_right_and_differ_from_the_examples(tl, task):
    for i in range(5):
        ex = lt.example(task, 1024, i, split="train", seed=3)
        assert _truth(ex, ex.tail) == ex.target  # the checker agrees with the generator
        pairs = tl.extra_questions(ex, random.Random(i), 50)
        assert pairs and ex.tail not in [t for t, _ in pairs]
        assert len({t for t, _ in pairs}) == len(pairs)
        for tail, target in pairs:
            assert target == _truth(ex, tail), tail
            # the generator's format: the question, the cue and its answer prefix for that key
            q = tail.strip().split("\n")[0]
            assert tail == f"\n{q}\n{lt.CUE}{lt.answer_prefix(task, q)}"
        if task == "vartrack":  # every other chain's last variable resolves to a distractor
            assert set(ex.distractors) <= {t.strip() for _, t in pairs}
    assert tl.extra_questions(lt.example("freqwords", 1024, 0), random.Random(0), 5) == []


def test_a_training_row_puts_loss_on_the_answers_only(tl):
    a = tl.parse(["--out", "unused", "--tasks", "multikey", "--questions", "4", "--text-share", "0"])
    ids, labels = tl.Rows(a).task(700, "multikey")
    assert len(ids) == len(labels)
    text = bytes(ids).decode()
    answered = bytes(x for x in labels if x != -100).decode()
    assert answered.count("\n") == 4 and text.count(lt.CUE) == 4
    for line in answered.splitlines():
        assert re.fullmatch(r" \d{5}", line)
    # each supervised span follows a cue and its answer prefix ("… for KEY is")
    for j, y in enumerate(labels):
        if y != -100 and labels[j - 1] == -100:
            assert re.search(r"Answer: The magic number for \w+ is$", text[:j])


def test_recalled_needles_are_the_contexts_split_before_their_value(tl):
    a = tl.parse(["--out", "unused", "--tasks", "multikey", "--questions", "8", "--recall-share", "1",
                  "--text-share", "0"])
    ids, _ = tl.Rows(a).task(700, "multikey")
    text = bytes(ids).decode()
    head, _, after = text.partition(lt.CUE)
    restated = [line for line in after.split("\n") if line.startswith("The magic number")]
    assert restated and all(line in head.split("\n") for line in restated)


def test_each_task_trains_at_its_own_top_length(tl):
    a = tl.parse(["--out", "unused", "--tasks", "multikey,vartrack", "--questions", "1", "--text-share", "0", "--min-length", "128",
                  "--batch", "64"])
    rows = tl.Rows(a)
    ids, _, mask = rows.batch({"multikey": 200, "vartrack": 600})
    lengths = {"multikey": [], "vartrack": []}
    for row, m in zip(ids, mask):
        text = bytes(row[m.bool()].tolist()).decode()
        lengths["vartrack" if "VAR " in text else "multikey"].append(len(text))
    # a row's prompt is at most its task's top (its answer follows the prompt)
    assert lengths["multikey"] and max(lengths["multikey"]) <= 200 + 10
    assert lengths["vartrack"] and max(lengths["vartrack"]) > 300
