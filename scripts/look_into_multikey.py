"""Look into a model that scripts/train_long_tasks.py trained: on ``multikey`` validation
prompts, where the prompt's last position (the one that writes the answer's first token) puts
its attention, per layer and head: on the asked needle's value tokens, on the other needles'
value tokens, on the asked key's tokens. And the probability of the first answer token
against the other needles' first tokens. A model that finds the key looks at the asked value;
one that only finds "a needle" splits its attention between them.

Per prompt, too: whether the most probable first token is right, and whether the token just
before the asked value (with ``--syllable-is``: the asked key's last syllable and " is") also
stands before another needle's value. A model that matches only that one token (a plain
induction head) cannot tell such prompts apart from their twins; its right answers on them are
at most about half. Teacher-forced, each answer token's accuracy after the right ones before
it, and how many wrong later tokens (the value's second chunk on) are another needle's.

    python scripts/look_into_multikey.py --model DIR/model --length 80 [--n 32] [--seed 0] [--out F]

Eager attention (the weights are read from ``output_attentions``); CPU, fp32.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from attnprune.research.data import long_tasks as lt
from attnprune.runs.results import atomic_write_text


def _inside(text: str, offsets: list[tuple[int, int]], a: int, b: int) -> list[int]:
    """Positions of the tokens that overlap characters [a, b) of ``text`` (blanks aside)."""
    return [j for j, (s, e) in enumerate(offsets) if s < b and e > a and text[s:e].strip()]


def _value_at(text: str, offsets: list[tuple[int, int]], v: str) -> list[int]:
    """Positions of the tokens of the needle value ``v``."""
    s = text.index(f" is {v}.") + 4
    return _inside(text, offsets, s, s + len(v))


def spans(ex: lt.LongExample, offsets: list[tuple[int, int]]) -> dict[str, list[int]]:
    """Token positions (from the tokenizer's character ``offsets`` of ``ex.prompt``) of the
    asked needle's value, the other needles' values and the asked key in the asked needle."""
    text, key = ex.prompt, ex.question.rsplit(" ", 1)[1][:-1]
    k = text.index(f"for {key} is {ex.answers[0]}.") + 4
    return {"asked value": _value_at(text, offsets, ex.answers[0]),
            "other values": [j for d in ex.distractors for j in _value_at(text, offsets, d)],
            "asked key": _inside(text, offsets, k, k + len(key))}


def shared_cue(ex: lt.LongExample, ids: list[int], offsets: list[tuple[int, int]]) -> bool:
    """Whether the token before the asked needle's value also stands before another needle's."""
    def before(v: str) -> int:
        return ids[_value_at(ex.prompt, offsets, v)[0] - 1]
    return before(ex.answers[0]) in {before(d) for d in ex.distractors}


def look(model, tok, examples) -> dict:
    """Per layer and head, the mean attention of the last position on each span, and the mean
    probability of the right first token and of the other needles' first tokens."""
    mass, p_right, p_other, prompts = [], [], [], []
    for ex in examples:
        enc = tok(ex.prompt, add_special_tokens=False, return_offsets_mapping=True)
        where = spans(ex, enc["offset_mapping"])
        shared = shared_cue(ex, enc["input_ids"], enc["offset_mapping"])
        answer = tok.encode(" " + ex.answers[0], add_special_tokens=False)
        last = len(enc["input_ids"]) - 1  # the prompt's last position (causal: the answer after it changes nothing there)
        with torch.no_grad():
            out = model(torch.tensor([enc["input_ids"] + answer]), output_attentions=True)
        probs = out.logits[0, last].float().softmax(-1)
        theirs_ids = [tok.encode(" " + d, add_special_tokens=False) for d in ex.distractors]
        first = {tok.encode(" " + v, add_special_tokens=False)[0] for v in ex.answers}
        others = {ids[0] for ids in theirs_ids} - first
        p_right.append(sum(probs[i].item() for i in first))
        p_other.append(sum(probs[i].item() for i in others))
        # teacher-forced: each answer token's argmax after the right ones before it, and whether a
        # wrong later token is one of another needle's value tokens
        picked = out.logits[0, last:last + len(answer)].argmax(-1).tolist()
        theirs = {t for ids in theirs_ids for t in ids[1:]}
        prompts.append({"index": ex.meta.get("index"), "right_first_token": int(probs.argmax()) in first,
                        "shared_cue": shared, "answer_tokens_right": [x == y for x, y in zip(picked, answer)],
                        "wrong_later_tokens_from_another_value": [x in theirs for x, y in
                                                                  zip(picked[1:], answer[1:]) if x != y]})
        mass.append([[{name: a[0, h, last, pos].sum().item() for name, pos in where.items()}
                      for h in range(a.shape[1])] for a in out.attentions])
    layers = [[{name: statistics.fmean(m[li][h][name] for m in mass) for name in mass[0][li][h]}
               for h in range(len(mass[0][li]))] for li in range(len(mass[0]))]
    by_cue = {}
    for name, want in (("shared cue", True), ("own cue", False)):
        group = [r["right_first_token"] for r in prompts if r["shared_cue"] == want]
        by_cue[name] = {"n": len(group), "right_first_token": statistics.fmean(group) if group else None}
    width = max(len(r["answer_tokens_right"]) for r in prompts)
    by_token = [statistics.fmean(r["answer_tokens_right"][t] for r in prompts if len(r["answer_tokens_right"]) > t)
                for t in range(width)]
    borrowed = [x for r in prompts for x in r["wrong_later_tokens_from_another_value"]]
    return {"n": len(examples), "answer_token_right": by_token,
            "wrong_later_tokens": {"n": len(borrowed),
                                   "from_another_value": statistics.fmean(borrowed) if borrowed else None},
            "p_right_first_token": statistics.fmean(p_right),
            "p_other_first_tokens": statistics.fmean(p_other), "by_cue": by_cue, "prompts": prompts,
            "attention": layers}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a folder with the model and its tokenizer (DIR/model)")
    p.add_argument("--length", type=int, default=80)
    p.add_argument("--n", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="")
    a = p.parse_args(argv)
    if not (Path(a.model) / "tokenizer.json").is_file():
        p.error(f"--model: {a.model} holds no tokenizer.json (a BPE run of train_long_tasks.py saves one)")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sys.path.insert(0, str(Path(__file__).parent))
    from train_long_tasks import fitted_example

    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, attn_implementation="eager").float().eval()
    examples = [fitted_example("multikey", a.length, i, a.seed, "validation", tokenizer=tok) for i in range(a.n)]
    res = look(model, tok, examples)
    keys = sum(len(ex.distractors) + 1 for ex in examples) / len(examples)
    print(f"multikey at {a.length} tokens, {a.n} validation prompts ({keys:.1f} keys on average)")
    print(f"P(first answer token): right {res['p_right_first_token']:.3f}, "
          f"another needle's {res['p_other_first_tokens']:.3f}")
    for name, g in res["by_cue"].items():
        acc = "—" if g["right_first_token"] is None else f"{g['right_first_token']:.3f}"
        print(f"most probable first token right, prompts whose asked value's previous token is "
              f"{'shared with another needle' if name == 'shared cue' else 'its own'}: {acc} of {g['n']}")
    print("answer token right, teacher-forced: " + ", ".join(
        f"token {t + 1} {v:.3f}" for t, v in enumerate(res["answer_token_right"])))
    w = res["wrong_later_tokens"]
    if w["n"]:
        print(f"wrong later answer tokens: {w['n']}, of which another needle's value token: {w['from_another_value']:.3f}")
    print("layer head  attention of the last position on: asked value  other values  asked key")
    for li, heads in enumerate(res["attention"]):
        for h, m in enumerate(heads):
            print(f"{li:>5} {h:>4}  {m['asked value']:>47.3f}  {m['other values']:>12.3f}  {m['asked key']:>9.3f}")
    if a.out:
        atomic_write_text(Path(a.out), json.dumps({"args": vars(a), **res}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
