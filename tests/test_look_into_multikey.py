"""scripts/look_into_multikey.py: the spans it reads attention on are the asked needle's value,
the other needles' values and the asked key, and the attention is the last position's."""

from __future__ import annotations

import re

import pytest
from conftest import load_script


@pytest.fixture(scope="module")
def setup():
    tl, look = load_script("train_long_tasks"), load_script("look_into_multikey")
    a = tl.parse(["--out", "unused", "--tasks", "multikey", "--tokenizer", "bpe:1024", "--syllable-tokens",
                  "--width", "32", "--heads", "2", "--kv-heads", "1", "--ffn", "64", "--layers", "2"])
    tok = tl.build_tokenizer(a)
    model = tl.build_model(a, len(tok)).eval()
    model.config._attn_implementation = "eager"
    exs = [tl.fitted_example("multikey", 160, i, 0, "validation", tokenizer=tok) for i in range(4)]
    return look, tok, model, exs


def test_the_spans_are_the_asked_value_the_other_values_and_the_asked_key(setup):
    look, tok, _, exs = setup
    for ex in exs:
        enc = tok(ex.prompt, add_special_tokens=False, return_offsets_mapping=True)
        where = look.spans(ex, enc["offset_mapping"])
        ids = enc["input_ids"]
        assert tok.decode([ids[j] for j in where["asked value"]]).strip() == ex.answers[0]
        assert "".join(tok.decode([ids[j]]) for j in where["other values"]).replace(" ", "") == "".join(ex.distractors)
        key = ex.question.rsplit(" ", 1)[1][:-1]
        assert tok.decode([ids[j] for j in where["asked key"]]).strip() == key
        assert where["asked key"][-1] < where["asked value"][0]  # the key in the asked needle


def test_the_attention_read_is_the_last_positions(setup):
    look, tok, model, exs = setup
    res = look.look(model, tok, exs)
    assert res["n"] == 4 and len(res["attention"]) == 2 and len(res["attention"][0]) == 2
    for heads in res["attention"]:
        for m in heads:
            # a random model's last position spreads its attention: some of it on every span,
            # never more than all of it (the first position's row would put none there)
            assert all(v > 0 for v in m.values()) and sum(m.values()) <= 1 + 1e-6
    assert 0 < res["p_right_first_token"] < 1 and 0 <= res["p_other_first_tokens"] < 1


def test_a_shared_cue_is_a_key_ending_like_another_needles_key():
    """With --syllable-is the token before a value is "<key's last syllable> is": the asked
    needle's cue is shared exactly when another key ends in the same syllable."""
    tl, look = load_script("train_long_tasks"), load_script("look_into_multikey")
    a = tl.parse(["--out", "unused", "--tasks", "multikey", "--tokenizer", "bpe:2048", "--syllable-tokens",
                  "--syllable-is"])
    tok = tl.build_tokenizer(a)
    syllables = sorted(look.lt.SYLLABLES, key=len, reverse=True)

    def last_syllable(word):
        while True:
            s = next(s for s in syllables if word.startswith(s))
            if s == word:
                return s
            word = word[len(s):]

    seen = set()
    for i in range(40):
        ex = tl.fitted_example("multikey", 400, i, 0, "validation", tokenizer=tok)
        enc = tok(ex.prompt, add_special_tokens=False, return_offsets_mapping=True)
        key = ex.question.rsplit(" ", 1)[1][:-1]
        keys = [k for k in re.findall(r"The magic number for (\w+) is", ex.prompt) if k != key]
        want = any(last_syllable(k) == last_syllable(key) for k in keys)
        assert look.shared_cue(ex, enc["input_ids"], enc["offset_mapping"]) == want, i
        seen.add(want)
    assert seen == {True, False}  # both kinds among the prompts


def test_answer_tokens_are_read_teacher_forced_at_the_right_positions(setup):
    """A stand-in model that writes the answer right but its second token, which it takes from
    another needle's value: token 2 wrong and borrowed, every other token right."""
    from types import SimpleNamespace

    import torch

    look, tok, model, exs = setup

    def scripted(ids, output_attentions=True):
        answer = tok.encode(" " + ex.answers[0], add_special_tokens=False)
        other = tok.encode(" " + ex.distractors[0], add_special_tokens=False)
        last = ids.shape[1] - len(answer) - 1
        logits = torch.zeros(1, ids.shape[1], len(tok))
        for t, want in enumerate(answer):
            logits[0, last + t, want] = 1.0
        logits[0, last + 1, answer[1]] = 0.0
        logits[0, last + 1, next(x for x in other[1:] if x != answer[1])] = 1.0
        return SimpleNamespace(logits=logits, attentions=model(ids, output_attentions=True).attentions)

    for ex in exs:
        n = len(tok.encode(" " + ex.answers[0], add_special_tokens=False))
        res = look.look(scripted, tok, [ex])
        assert res["answer_token_right"] == [1.0, 0.0] + [1.0] * (n - 2)
        assert res["wrong_later_tokens"] == {"n": 1, "from_another_value": 1.0}
        assert res["prompts"][0]["right_first_token"]
