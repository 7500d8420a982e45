"""The long-task training recipe (scripts/train_long_tasks.py): the extra questions a training
prompt carries are right, and only answer bytes carry loss."""

from __future__ import annotations

import argparse
import random
import re

import pytest
import torch
from conftest import load_script

from attnprune.research.data import long_tasks as lt


@pytest.fixture(scope="module")
def tl():
    return load_script("train_long_tasks")


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


def _bpe(tl, *extra):
    a = tl.parse(["--out", "unused", "--tasks", "multikey,vartrack", "--text-share", "0",
                  "--tokenizer", "bpe:512", *extra])
    if "--digits-per-token" in extra:
        with pytest.raises(ValueError, match="ask for more tokens"):
            tl.build_tokenizer(a)
        return a, None
    return a, tl.build_tokenizer(a)


def test_the_bpe_tokenizer_is_deterministic_lossless_and_splits_numbers_into_digits(tl):
    a, tok = _bpe(tl)
    assert tl.build_tokenizer(a).get_vocab() == tok.get_vocab()  # the same text, the same merges
    assert len(tok) == 512 and tok.pad_token_id == 0
    for task in ("multikey", "vartrack", "multivalue"):
        ex = lt.example(task, 400, 7, split="test", seed=5, tokenizer=tok)
        for text in (ex.head, ex.tail, ex.target):
            assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
        pieces = [tok.decode([i]) for i in tok.encode(ex.target, add_special_tokens=False)]
        assert "".join(pieces) == ex.target and all(len(p.strip()) <= 1 for p in pieces if p.strip().isdigit())
        assert 0.95 * 400 <= len(tok.encode(ex.head + ex.tail, add_special_tokens=False)) <= 400 + 2
    with pytest.raises(SystemExit):
        tl.parse(["--out", "unused", "--tokenizer", "bpe:12"])


def test_a_bpe_row_counts_tokens_and_supervises_the_answer_tokens_only(tl):
    a, tok = _bpe(tl, "--questions", "3")
    ids, labels = tl.Rows(a, tok).task(150, "multikey")
    first = next(j for j, y in enumerate(labels) if y != -100)
    assert 140 <= first <= 150 + 40  # the prompt is ~150 tokens (+ its question), not 150 bytes
    answered = tok.decode([y for y in labels if y != -100])
    assert [ln for ln in answered.split("\n") if ln] and all(
        re.fullmatch(r" \d{5}", ln) for ln in answered.split("\n") if ln)
    assert tok.decode(ids).count(lt.CUE) == 3


def test_a_bpe_run_saves_a_tokenizer_the_evaluation_loads(tl, tmp_path):
    from attnprune.research.experiments import long_tasks as ev

    rc = tl.main(["--out", str(tmp_path), "--device", "cpu", "--threads", "1", "--tokenizer", "bpe:300",
                  "--tasks", "multikey", "--text-share", "0", "--length", "160", "--min-length", "128",
                  "--layers", "1", "--width", "32", "--heads", "2", "--kv-heads", "1", "--ffn", "64",
                  "--batch", "2", "--steps", "2", "--eval-n", "2"])
    assert rc == 0
    tok = ev.load_tokenizer(str(tmp_path / "model"))
    assert len(tok) == 300 and tok.decode(tok.encode(" 51234\n", add_special_tokens=False)) == " 51234\n"
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(tmp_path / "model").config.vocab_size == 300


def test_numbers_in_chunks_of_three_digits_are_one_token_per_chunk(tl):
    a, tok = _bpe(tl, "--digits-per-token", "3")  # 512 tokens cannot hold 2 × 1,110 chunks
    a.tokenizer = "bpe:4096"
    tok = tl.build_tokenizer(a)
    rng = random.Random(0)
    for _ in range(300):
        x = f" {rng.randrange(10_000, 100_000)}"  # the suite's 5-digit values: " ddd" + "dd"
        pieces = [tok.decode([i]) for i in tok.encode(x, add_special_tokens=False)]
        assert pieces == [x[:4], x[4:]], pieces
    ex = lt.example("vartrack", 300, 1, split="test", tokenizer=tok)
    assert tok.decode(tok.encode(ex.prompt + ex.target, add_special_tokens=False)) == ex.prompt + ex.target


def test_syllable_tokens_make_each_key_its_three_syllables(tl):
    a, _ = _bpe(tl)
    a.syllable_tokens = True
    with pytest.raises(ValueError, match="ask for more tokens"):  # 512: too few for 2 × 70 syllables
        tl.build_tokenizer(a)
    a.tokenizer = "bpe:1024"
    tok = tl.build_tokenizer(a)
    for i in range(5):
        ex = lt.example("multikey", 300, i, split="test", seed=2, tokenizer=tok)
        key = ex.question.rsplit(" ", 1)[1][:-1]
        pieces = [tok.decode([t]) for t in tok.encode(f" {key}", add_special_tokens=False)]
        assert pieces == [" " + key[:2], key[2:4], key[4:]], pieces
        assert tok.decode(tok.encode(ex.prompt, add_special_tokens=False)) == ex.prompt


def test_syllable_is_makes_the_needle_and_the_answer_prefix_end_in_the_same_token(tl):
    a, _ = _bpe(tl)
    a.tokenizer, a.syllable_tokens, a.syllable_is = "bpe:1280", True, True
    tok = tl.build_tokenizer(a)
    for i in range(5):
        ex = lt.example("multikey", 300, i, split="test", seed=2, tokenizer=tok)
        key = ex.question.rsplit(" ", 1)[1][:-1]
        ids = tok.encode(ex.prompt, add_special_tokens=False)
        assert tok.decode(ids) == ex.prompt  # lossless
        last = ids[-1]  # the answer prefix "… for KEY is" ends in "<last syllable> is"
        assert tok.decode([last]) == key[4:] + " is"
        needle = tok.encode(f"The magic number for {key} is {ex.answers[0]}.", add_special_tokens=False)
        at = needle.index(last)
        assert tok.decode(needle[:at + 1]).endswith(f"{key} is")
        assert tok.decode([needle[at + 1]]) == " " + ex.answers[0][0]
        # elsewhere " is" stays its own token
        assert " is" in [tok.decode([t]) for t in tok.encode("The grass is green.", add_special_tokens=False)]
    with pytest.raises(SystemExit):
        tl.parse(["--out", "unused", "--tokenizer", "bpe:1280", "--syllable-is"])  # needs --syllable-tokens


def test_init_goes_on_from_a_saved_run_with_its_tokenizer_and_curriculum(tl, tmp_path):
    import json

    import torch
    from safetensors.torch import load_file

    tiny = ["--device", "cpu", "--threads", "1", "--tasks", "multikey", "--text-share", "0",
            "--length", "200", "--min-length", "128", "--batch", "2", "--steps", "2", "--eval-n", "1"]
    first, second = tmp_path / "first", tmp_path / "second"
    assert tl.main(["--out", str(first), "--tokenizer", "bpe:300", "--layers", "1", "--width", "32",
                    "--heads", "2", "--kv-heads", "1", "--ffn", "64", *tiny]) == 0
    # the first run's curriculum "reached" 160 (as if it had grown): the second starts there
    log = json.loads((first / "train.json").read_text())
    log["log"][-1]["tops_reached"] = {"multikey": 160}
    (first / "train.json").write_text(json.dumps(log))
    assert tl.main(["--out", str(second), "--init", str(first), *tiny]) == 0
    rec = json.loads((second / "train.json").read_text())
    assert rec["args"]["round"] == 1 and rec["args"]["width"] == 32 and rec["args"]["tokenizer"] == "bpe:300"
    assert rec["log"][0]["top"] == 160
    a = load_file(first / "model" / "model.safetensors")
    b = load_file(second / "model" / "model.safetensors")
    assert a.keys() == b.keys() and any(not torch.equal(a[k], b[k]) for k in a)  # trained on
    assert (second / "model" / "tokenizer.json").read_text() == (first / "model" / "tokenizer.json").read_text()
    r0 = tl.Rows(tl.parse(["--out", "x", *tiny])).task(150, "multikey")
    r1 = tl.Rows(tl.parse(["--out", "x", "--init", str(first), *tiny])).task(150, "multikey")
    assert r0 != r1  # a later round draws other examples
    with pytest.raises(SystemExit):
        tl.parse(["--out", "x", "--init", str(tmp_path / "nothing")])
    # --steps 0: the saved model evaluated at --length, unchanged
    only = tmp_path / "only"
    assert tl.main(["--out", str(only), "--init", str(first), *tiny[:-6], "--batch", "2", "--steps", "0",
                    "--eval-n", "2"]) == 0
    c = load_file(only / "model" / "model.safetensors")
    assert all(torch.equal(a[k], c[k]) for k in a)
    rec = json.loads((only / "train.json").read_text())
    assert rec["log"][-1]["steps_done"] == 0 and set(rec["validation_accuracy"]["multikey"]) >= {"full", "last 25 %"}
    with pytest.raises(SystemExit):
        tl.parse(["--out", "x", "--steps", "0"])  # nothing to evaluate
    # --min-length: the --init run's (128), at most --length; without --init 384, at most --length
    assert tl.parse(["--out", "x", "--init", str(first)]).min_length == 128
    assert tl.parse(["--out", "x", "--init", str(first), "--length", "100", "--steps", "0"]).min_length == 100
    assert tl.parse(["--out", "x", "--init", str(first), "--min-length", "64"]).min_length == 64
    assert tl.parse(["--out", "x"]).min_length == 384 and tl.parse(["--out", "x", "--length", "200"]).min_length == 200


def test_hard_rows_are_what_the_quick_check_asks(tl):
    a = tl.parse(["--out", "unused", "--tasks", "multikey", "--questions", "1", "--text-share", "0",
                  "--min-length", "128", "--batch", "8", "--hard-share", "1"])
    ids, _, mask = tl.Rows(a).batch({"multikey": 400})
    full = lt.OPTIONS["multikey"]["keys"]
    check = tl.fitted_example("multikey", 400, 0, a.seed, "validation").head.count("The magic number")
    for row, m in zip(ids, mask):
        text = bytes(row[m.bool()].tolist()).decode()
        assert text.count("The magic number") - 1 == check <= full  # the question's prefix aside
    a.hard_share = 0.0  # drawn small: most rows hold fewer needles
    ids, _, mask = tl.Rows(a).batch({"multikey": 400})
    counts = [bytes(r[m.bool()].tolist()).decode().count("The magic number") - 1 for r, m in zip(ids, mask)]
    assert min(counts) < check
    with pytest.raises(SystemExit):
        tl.parse(["--out", "unused", "--hard-share", "1.5"])


def test_the_prompt_loss_adds_the_other_tokens_mean_and_is_the_models_loss_at_zero(tl):
    a = tl.parse(["--out", "unused", "--tasks", "multikey", "--questions", "3", "--text-share", "0",
                  "--batch", "3", "--min-length", "200", "--width", "32", "--heads", "2", "--ffn", "64",
                  "--layers", "1", "--prompt-loss", "0.5"])
    ids, labels, mask = tl.Rows(a).batch({"multikey": 320})
    assert (mask == 0).any()  # right padding: its positions count nowhere
    model = tl.build_model(a).eval()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
        stock = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        assert torch.allclose(tl.weighted_loss(logits, ids, labels, mask, 0.0), stock, atol=1e-5)
        # worked out row by row: the answers' mean plus 0.5 × every other real token's mean
        logp = torch.log_softmax(logits.double(), -1)
        ans, other = [], []
        for r in range(ids.shape[0]):
            for j in range(1, int(mask[r].sum())):
                (ans if labels[r, j] != -100 else other).append(-logp[r, j - 1, ids[r, j]])
        want = torch.stack(ans).mean() + 0.5 * torch.stack(other).mean()
        assert torch.allclose(tl.weighted_loss(logits, ids, labels, mask, 0.5).double(), want, atol=1e-5)
    with pytest.raises(SystemExit):
        tl.parse(["--out", "unused", "--prompt-loss", "-1"])


def test_repeat_rows_supervise_the_second_copy_with_the_token_that_followed_the_first_time(tl):
    a = tl.parse(["--out", "unused", "--tasks", "multikey", "--text-share", "0", "--repeat-share", "0.5",
                  "--batch", "40", "--min-length", "200"])
    rows = tl.Rows(a)
    ids, labels = rows.repeat(101)
    n = 50
    assert len(ids) == len(labels) == 2 * n and ids[:n] == ids[n:] and 0 not in ids
    assert labels[:n + 1] == [-100] * (n + 1)
    for j in range(n + 1, 2 * n):  # the label is what followed the same position's token the first time
        assert labels[j] == ids[j - n]
    ids, labels, mask = tl.Rows(a).batch({"multikey": 320})
    halves = [r for r in range(ids.shape[0])
              if (k := int(mask[r].sum())) % 2 == 0 and torch.equal(ids[r, :k // 2], ids[r, k // 2:k])]
    assert 8 <= len(halves) <= 32  # about half the rows (40 rows, share 0.5)
    with pytest.raises(SystemExit):
        tl.parse(["--out", "unused", "--repeat-share", "0.6", "--text-share", "0.5"])


def test_a_steps_rows_are_a_function_of_the_seed_the_step_and_the_tops(tl):
    a = tl.parse(["--out", "unused", "--tasks", "multikey", "--text-share", "0", "--min-length", "128",
                  "--batch", "8", "--repeat-share", "0.5"])
    tops = {"multikey": 200}
    first, other = tl.Rows(a), tl.Rows(a)
    other.batch(tops)  # a running stream drawn from first does not matter
    assert first.rows_at(4, tops) == other.rows_at(4, tops)
    assert first.rows_at(4, tops) != first.rows_at(5, tops)

    def repeats(rows):  # the rows that are a random sequence written twice: all the step's draws
        return [x for x, _ in rows if x[:len(x) // 2] == x[len(x) // 2:]]
    assert repeats(first.rows_at(4, tops)) and repeats(first.rows_at(5, tops))
    assert not set(map(tuple, repeats(first.rows_at(4, tops)))) & set(map(tuple, repeats(first.rows_at(5, tops))))
    assert first.rows_at(4, tops) != first.rows_at(4, {"multikey": 300})
    b = argparse.Namespace(**{**vars(a), "seed": 1})
    assert tl.Rows(b).rows_at(4, tops) != first.rows_at(4, tops)


@pytest.mark.parametrize("workers", [1, 3])
def test_prefetched_batches_are_each_steps_rows_at_the_tops_asked_ahead(tl, workers):
    """Step t's rows are rows_at(t, the tops at step t − 2·N + 1), whichever worker made them."""
    a = tl.parse(["--out", "unused", "--tasks", "multikey", "--text-share", "0", "--min-length", "128",
                  "--batch", "2", "--data-workers", str(workers)])
    tops_at = [{"multikey": 160}] * 4 + [{"multikey": 200}] * 8  # the curriculum grows at step 4
    ref, depth = tl.Rows(a), 2 * workers
    with tl.Prefetch(a, None, workers) as ahead:
        for t, tops in enumerate(tops_at):
            got = ahead.batch(t, tops)
            want = tl.collate(ref.rows_at(t, tops_at[max(0, t - depth + 1)]))
            assert all(torch.equal(g, w) for g, w in zip(got, want)), t
        with pytest.raises(ValueError, match="step: batches are asked for in order"):
            ahead.batch(20, tops_at[0])
        procs = ahead.procs
    assert not any(p.is_alive() for p in procs)  # closed: the workers are gone


def test_a_run_with_data_workers_trains_and_leaves_no_process(tl, tmp_path):
    import multiprocessing

    rc = tl.main(["--out", str(tmp_path), "--device", "cpu", "--threads", "1", "--tasks", "multikey",
                  "--text-share", "0", "--length", "160", "--min-length", "128", "--layers", "1", "--width", "32",
                  "--heads", "2", "--kv-heads", "1", "--ffn", "64", "--batch", "2", "--steps", "3", "--eval-n", "2",
                  "--data-workers", "2"])
    assert rc == 0 and not multiprocessing.active_children()
    import json

    log = json.loads((tmp_path / "train.json").read_text())["log"]
    assert any(e.get("steps_done") == 3 for e in log)
    with pytest.raises(SystemExit):
        tl.parse(["--out", "unused", "--data-workers", "-1"])


def test_the_row_encoder_gives_the_tokenizers_ids_and_the_same_rows(tl):
    a = tl.parse(["--out", "unused", "--tasks", "multikey,vartrack,freqwords", "--text-share", "0.2",
                  "--tokenizer", "bpe:4096", "--syllable-tokens", "--syllable-is", "--digits-per-token", "3",
                  "--min-length", "64", "--batch", "6", "--repeat-share", "0.2", "--questions", "3"])
    tok = tl.build_tokenizer(a)
    enc = tl.RowEncoder(tok)
    ex = tl.fitted_example("multikey", 300, 0, 0, tokenizer=tok)
    for text in (ex.head, ex.tail, ex.head, ex.head[:-9], ex.head + " 51234\n", " 51234\n",
                 "The magic number for bagudi is"):
        assert enc.encode(text) == tok.encode(text, add_special_tokens=False)
    tops = {"multikey": 200, "vartrack": 300, "freqwords": 300}
    fast, plain = tl.Rows(a, tok), tl.Rows(a, tok)
    plain.enc = tok  # the tokenizer itself, through its Python wrapper
    assert isinstance(fast.enc, tl.RowEncoder)
    assert fast.rows_at(2, tops) == plain.rows_at(2, tops)


def test_spread_positions_span_the_long_prompt_and_repeat_by_key(tl):
    mask = torch.zeros(64, 50, dtype=torch.long)
    for i in range(64):
        mask[i, :20 + i % 30] = 1
    assert tl.spread_positions(mask, 1024, 0.0, "k") is None  # the model's own positions
    pos = tl.spread_positions(mask, 1024, 0.5, "k")
    assert torch.equal(pos, tl.spread_positions(mask, 1024, 0.5, "k"))  # seeded by the key
    assert not torch.equal(pos, tl.spread_positions(mask, 1024, 0.5, "other"))
    spread = 0
    for i in range(64):
        real = int(mask[i].sum())
        p = pos[i, :real]
        assert bool((p[1:] > p[:-1]).all()) and 0 <= int(p[0]) and int(p[-1]) < 1024  # ordered, in range
        if torch.equal(p, torch.arange(real)):
            continue
        spread += 1
        assert int(p[-1] - p[0]) >= 2 * real  # a 20–50-token row spans far more than its length
    assert 16 <= spread <= 48  # about half the rows
    assert torch.equal(tl.spread_positions(mask, 30, 1.0, "k")[40], torch.arange(50))  # not shorter than --length: as is
    with pytest.raises(SystemExit):
        tl.parse(["--out", "unused", "--spread-share", "1.5"])


def test_training_with_spread_positions_runs_and_differs(tl, tmp_path):
    from safetensors.torch import load_file

    tiny = ["--device", "cpu", "--threads", "1", "--tasks", "multikey", "--text-share", "0", "--length", "200",
            "--min-length", "128", "--batch", "2", "--steps", "2", "--eval-n", "1", "--layers", "1", "--width", "32",
            "--heads", "2", "--kv-heads", "1", "--ffn", "64"]
    assert tl.main(["--out", str(tmp_path / "a"), *tiny]) == 0
    assert tl.main(["--out", str(tmp_path / "b"), "--spread-share", "1", *tiny]) == 0
    a, b = (load_file(tmp_path / d / "model" / "model.safetensors") for d in "ab")
    assert any(not torch.equal(a[k], b[k]) for k in a)  # the positions reached the model
