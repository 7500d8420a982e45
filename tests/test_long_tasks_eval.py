"""The long-task evaluation (attnprune.research.experiments.long_tasks) end to end on a tiny
random byte-level Llama: the fields, the pairing with full, both question modes."""

from __future__ import annotations

import json

import pytest
import torch

from attnprune.research.data import long_tasks as lt
from attnprune.research.experiments import long_tasks as ev


def _tiny_llama(tmp_path_factory, layers: int, seed: int) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    conf = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                       num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024,
                       bos_token_id=None, eos_token_id=None, pad_token_id=0)
    path = tmp_path_factory.mktemp(f"tiny{layers}") / "model"
    LlamaForCausalLM(conf).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return _tiny_llama(tmp_path_factory, layers=3, seed=0)


def test_question_after_the_prefill_decodes_the_tail_as_the_full_prompt_would(model_dir):
    model, tok = ev.load_model(model_dir), lt.ByteTokenizer()
    ex = lt.example("multikey", 400, 0, keys=3)
    head, tail, n = ev.encode(tok, ex)
    assert n == len(ex.target.encode())
    a = ev.answer(model, head, tail, 4, "prompt", keep=1.0)
    b = ev.answer(model, head, tail, 4, "after", keep=1.0)
    ids = torch.tensor([head + tail])
    stock = model.generate(ids, max_new_tokens=4, do_sample=False)[0, ids.shape[1]:].tolist()
    assert a == b == stock


def test_recent_control_keeps_exactly_the_last_tokens():
    opts = ev._prefill_options({"kind": "recent", "keep": 0.25}, 400)
    assert opts == {"keep": 100, "method": "gemfilter", "layer": 0, "window": 100, "sinks": 0}
    from attnprune.prefill import select_kept

    kept = select_kept(torch.rand(1, 400), torch.ones(1, 400, dtype=torch.bool), opts["keep"],
                       opts["sinks"], opts["window"])
    assert kept[0, 300:].all() and not kept[0, :300].any()


@pytest.mark.parametrize("question", ["prompt", "after"])
def test_run_writes_paired_rows(model_dir, tmp_path, question):
    out = tmp_path / "out"
    argv = ["--model", model_dir, "--tasks", "multikey,freqwords", "--lengths", "512", "--n", "3",
            "--keeps", "0.5", "--methods", "fastv,gemfilter", "--fastv_layer", "1",
            "--gemfilter_layer", "2", "--window", "4", "--sinks", "1", "--question", question,
            "--n_resamples", "200", "--threads", "1", "--out", str(out), "--exact-out"]
    assert ev.main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    preds = json.loads((out / "predictions.json").read_text())
    labels = ["full", "fastv 0.5", "gemfilter 0.5", "fastv 0.5 random", "gemfilter 0.5 random",
              "recent 0.5"]
    assert [(r["task"], r["variant"]) for r in summary["rows"]] == [
        (t, v) for t in ("multikey", "freqwords") for v in labels]
    assert summary["config"]["question"] == question
    assert (out / "table.md").is_file()
    for r in summary["rows"]:
        assert r["n"] == 3 and r["length"] == 512 and 0 <= r["accuracy"] <= 1
        assert r["accuracy_ci95"][0] <= r["accuracy"] <= r["accuracy_ci95"][1]
        p = next(p for p in preds if p["task"] == r["task"])["seeds"][0]
        right, full = p[r["variant"]]["right"], p["full"]["right"]
        assert len(p[r["variant"]]["outputs"]) == 3
        assert r["ttft_vs_full"] > 0 and r["decode_ms_per_token"] > 0
        if r["variant"] == "full":
            assert "diff" not in r
            continue
        # paired with full, example by example
        assert r["lost"] == sum(f and not x for x, f in zip(right, full))
        assert r["gained"] == sum(x and not f for x, f in zip(right, full))
        assert r["diff"] == pytest.approx((sum(right) - sum(full)) / 3)
    random_row = next(r for r in summary["rows"] if r["variant"] == "fastv 0.5 random")
    assert random_row["options"]["score"] == "random" and random_row["kind"] == "random"


def test_rows_pair_each_variant_with_full_example_by_example():
    # a random tiny model answers nothing, so the pairing is checked on given right / wrong lists
    specs = {"full": {"kind": "full", "keep": 1.0}, "recent 0.5": {"kind": "recent", "keep": 0.5}}
    res = {"full": {"right": [True, True, True, True, False, False]},
           "recent 0.5": {"right": [False, True, True, True, True, False]}}
    full, recent = ev.rows_for("multikey", 1024, specs, res, n_resamples=500)
    assert full["accuracy"] == 4 / 6 and "diff" not in full
    assert (recent["lost"], recent["gained"]) == (1, 1) and recent["diff"] == 0
    assert recent["diff_ci95"][0] < 0 < recent["diff_ci95"][1]
    assert recent["accuracy_ci95"][0] < 4 / 6 < recent["accuracy_ci95"][1]


def test_config_errors_name_the_option():
    for bad, name in [({"tasks": ("needle",)}, "tasks"), ({"question": "inside"}, "question"),
                      ({"keeps": (1.0,)}, "keeps"), ({"methods": ("snapkv",)}, "methods"),
                      ({"placement": "middle"}, "placement"), ({"split": "dev"}, "split"),
                      ({"lengths": (256,), "tasks": ("multikey",)}, "lengths: length: 256 is too short")]:
        with pytest.raises(ValueError, match=name):
            ev.LongTasksConfig(**bad)


def test_the_cluster_bootstrap_keeps_an_examples_seeds_together():
    one = [[1, 0, 1, 1, 0, 1, 0, 1, 1, 0]]
    # two seeds that agree example by example add no information: the CI must not narrow
    # (resampling (seed, example) pairs independently would narrow it by about √2)
    assert ev.cluster_bootstrap(one * 2, 2000) == ev.cluster_bootstrap(one, 2000)
    assert ev.cluster_bootstrap([[1, 1, 1]], 100) == [1.0, 1.0]


def test_controls_pair_the_scoring_with_random_and_recent_at_its_keep():
    specs = {"full": {"kind": "full", "keep": 1.0},
             "fastv 0.5": {"kind": "attention", "keep": 0.5},
             "fastv 0.5 random": {"kind": "random", "keep": 0.5},
             "recent 0.5": {"kind": "recent", "keep": 0.5}}
    res = {"full": {"right": [[1, 1, 1, 1]]}, "fastv 0.5": {"right": [[1, 1, 1, 0]]},
           "fastv 0.5 random": {"right": [[0, 0, 1, 0]]}, "recent 0.5": {"right": [[1, 1, 1, 1]]}}
    rows = ev.control_rows("multikey", 1024, specs, res, n_resamples=200)
    assert [(r["variant"], r["control"]) for r in rows] == [("fastv 0.5", "fastv 0.5 random"),
                                                           ("fastv 0.5", "recent 0.5")]
    assert (rows[0]["diff"], rows[0]["lost"], rows[0]["gained"]) == (0.5, 0, 2)
    assert (rows[1]["diff"], rows[1]["lost"], rows[1]["gained"]) == (-0.25, 1, 0)


@pytest.fixture(scope="module")
def shallow_dir(tmp_path_factory):
    return _tiny_llama(tmp_path_factory, layers=1, seed=1)


def test_seeds_pool_with_shallow_controls_and_searched_layers_and_resume(model_dir, shallow_dir, tmp_path,
                                                                         monkeypatch):
    out = tmp_path / "out"
    argv = ["--model", f"{model_dir},{model_dir}", "--shallow", f"{shallow_dir},{shallow_dir}",
            "--tasks", "multikey", "--lengths", "400", "--n", "2", "--keeps", "0.5",
            "--search_layers", "true", "--search_n", "1", "--window", "4", "--sinks", "1",
            "--n_resamples", "100", "--threads", "1", "--out", str(out), "--exact-out"]
    assert ev.main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    search = summary["layer_search"]
    # a random model answers nothing: every layer ties, and the earlier (cheaper) one is chosen
    assert search["chosen"] == {"fastv": 1, "gemfilter": 1} and set(search["accuracy"]["fastv"]) == {"1", "2"}
    rows = {r["variant"]: r for r in summary["rows"]}
    assert rows["fastv 0.5"]["options"]["layer"] == 1 and rows["gemfilter 0.5"]["options"]["layer"] == 1
    assert all(r["seeds"] == 2 and r["n"] == 2 for r in rows.values())
    assert rows["shallow"]["kind"] == "shallow" and "diff" in rows["shallow"]
    assert rows["shallow"]["ttft_vs_full"] > 0
    assert {(c["variant"], c["control"]) for c in summary["controls"]} == {
        (m, c) for m in ("fastv 0.5", "gemfilter 0.5") for c in (f"{m} random", "recent 0.5")}
    assert all(c["p_holm"] >= c["mcnemar_p"] for c in summary["controls"])
    assert (out / "long_tasks.png").stat().st_size > 1000
    assert "| p (Holm) |" in (out / "table.md").read_text()
    # an interrupted run resumes from its saved search and seeds: no model is loaded again
    (out / "summary.json").unlink()
    monkeypatch.setattr(ev, "load_model", lambda path: pytest.fail(f"reloaded {path}"))
    assert ev.main(argv) == 0
    assert json.loads((out / "summary.json").read_text())["rows"] == summary["rows"]


def test_shallow_needs_one_folder_per_model_and_search_excludes_fixed_layers():
    with pytest.raises(ValueError, match="shallow"):
        ev.LongTasksConfig(model="a,b", shallow="c")
    with pytest.raises(ValueError, match="search_layers"):
        ev.LongTasksConfig(model="a", search_layers=True, fastv_layer=2)


def _bpe_folder(folder, text: str, size: int = 300) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    bpe.train_from_iterator([text] * 20, trainers.BpeTrainer(
        vocab_size=size, special_tokens=["<pad>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>").save_pretrained(folder)


def test_each_model_must_read_the_ids_of_the_tokenizer_given(model_dir, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    conf = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=1, pad_token_id=0)
    own = tmp_path / "own"
    LlamaForCausalLM(conf).save_pretrained(own)
    _bpe_folder(own, lt.example("multikey", 3000, 0).prompt)
    other = tmp_path / "other"
    _bpe_folder(other, lt.example("vartrack", 3000, 0).prompt)
    tok = ev.load_tokenizer(str(own))
    ev.check_tokenizer(str(own), tok, [str(own)])  # its own: fine
    ev.check_tokenizer("bytes", lt.ByteTokenizer(), [model_dir])
    with pytest.raises(ValueError, match="tokenizer: the model in .* own tokenizer"):
        ev.check_tokenizer("bytes", lt.ByteTokenizer(), [str(own)])  # vocab sizes aside
    with pytest.raises(ValueError, match="tokenizer: .* has 300 ids, the model in .* 256"):
        ev.check_tokenizer(str(own), tok, [str(own), model_dir])
    with pytest.raises(ValueError, match="is not the tokenizer saved with the model"):
        ev.check_tokenizer(str(other), ev.load_tokenizer(str(other)), [str(own)])
    argv = ["--model", str(own), "--tasks", "multikey", "--lengths", "400", "--n", "1",
            "--out", str(tmp_path / "out")]
    with pytest.raises(ValueError, match="tokenizer: the model in"):
        ev.main(argv)  # the default tokenizer, bytes, on a model with its own
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("seed*"))
    # lengths are checked in the given tokenizer's tokens too, before any folder is made
    short = ["--model", str(own), "--tokenizer", str(own), "--tasks", "multikey", "--lengths", "40",
             "--n", "1", "--out", str(tmp_path / "short")]
    with pytest.raises(ValueError, match="lengths: length: 40 is too short for the multikey"):
        ev.main(short)
    assert not (tmp_path / "short").exists()
    with pytest.raises(ValueError, match="tokenizer: cannot load"):
        ev.LongTasksConfig(tokenizer=str(tmp_path / "missing"), tasks=("multikey",))


def test_the_code_task_is_scored_teacher_forced_in_bits_per_byte(model_dir):
    import math

    model, tok = ev.load_model(model_dir), lt.ByteTokenizer()
    exs = [lt.example("code", 300, i, split="test") for i in range(2)]
    specs = {"full": {"kind": "full", "keep": 1.0},
             "fastv 0.5": {"kind": "attention", "keep": 0.5, "method": "fastv", "layer": 1,
                           "window": 4, "sinks": 1, "score": "attention"}}
    res = ev.evaluate(model, tok, exs, specs)
    for ex, bpb, right in zip(exs, res["full"]["bits_per_byte"], res["full"]["right"]):
        head, tail, _ = ev.encode(tok, ex)
        target = list(ex.target.encode())
        ids = torch.tensor([head + tail + target])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0].float(), -1)
        start = len(head) + len(tail) - 1
        rows = logp[start:start + len(target)]
        bits = -sum(float(rows[i, t]) for i, t in enumerate(target)) / math.log(2)
        assert bpb == pytest.approx(bits / len(target), rel=1e-4)  # one byte per token here
        assert right == (rows.argmax(-1).tolist() == target)
    assert all(b > 0 for b in res["fastv 0.5"]["bits_per_byte"])
    rows = ev.rows_for("code", 300, specs, res, n_resamples=100)
    pruned = rows[1]
    d = [a - b for a, b in zip(res["fastv 0.5"]["bits_per_byte"], res["full"]["bits_per_byte"])]
    assert pruned["bits_per_byte_diff"] == pytest.approx(sum(d) / len(d))
    table = ev.markdown_table({"rows": rows, "controls": []})
    assert f"{pruned['bits_per_byte']:.3f}, {pruned['bits_per_byte_diff']:+.3f}" in table
