"""scripts/kvpress_long_tasks.py without kvpress: the prompts it writes, the press side's
unpruned path and a stand-in press (both must answer as this project's stock forward does),
and the scoring."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
from conftest import load_script


@pytest.fixture(scope="module")
def kl():
    return load_script("kvpress_long_tasks")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    conf = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024,
                       bos_token_id=None, eos_token_id=None, pad_token_id=0,
                       initializer_range=0.5)  # large weights: answers that depend on every position
    path = tmp_path_factory.mktemp("kl") / "model"
    LlamaForCausalLM(conf).save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("question", ["after", "inside"])
def test_the_press_side_answers_as_the_stock_model_and_scores_pooled_seeds(kl, model_dir, tmp_path, monkeypatch,
                                                                          question):
    from attnprune.research.data import long_tasks as lt

    out = tmp_path / "run"
    prompts = kl.prepare(out, [model_dir, model_dir], "bytes", ["multikey", "vartrack"], [700], 3, "test")
    ex = lt.example("multikey", 700, 1, split="test")
    row = prompts["sets"][0]["examples"][1]
    assert bytes(row["head"]).decode() == ex.head and bytes(row["tail"]).decode() == ex.tail
    assert row["n"] == len(ex.target.encode())
    # a stand-in press that compresses nothing: the press path must then answer as unpruned
    monkeypatch.setattr(kl, "make_press", lambda name, c: lambda model: contextlib.nullcontext())
    kl.press_side(out, question, ["same"], [0.5])
    first = (out / f"press-{question}" / "seed0.json").read_text()
    kl.press_side(out, question, ["same"], [0.5])  # finished seeds are not run again
    assert (out / f"press-{question}" / "seed0.json").read_text() == first
    summary = kl.score(out, question, n_resamples=50)
    assert all(v == [1.0, 1.0] for v in summary["unpruned_agree"].values())
    rows = {(r["task"], r["variant"]): r for r in summary["rows"]}
    assert set(rows) == {(t, v) for t in ("multikey", "vartrack") for v in ("kvpress unpruned", "same 0.5")}
    for t in ("multikey", "vartrack"):
        assert rows[(t, "same 0.5")]["diff"] == 0.0 and rows[(t, "same 0.5")]["seeds"] == 2
        assert rows[(t, "same 0.5")]["n"] == 3
    assert "kvpress unpruned" in (out / f"press-{question}" / "table.md").read_text()
    rec = json.loads(first)
    assert rec["question"] == question and len(rec["sets"]) == 2


def test_prepare_names_the_bad_option(kl, model_dir, tmp_path):
    with pytest.raises(ValueError, match="--tasks: .*teacher-forced"):
        kl.prepare(tmp_path, [model_dir], "bytes", ["code"], [300], 1, "test")
    with pytest.raises(ValueError, match="--split"):
        kl.prepare(tmp_path, [model_dir], "bytes", ["multikey"], [300], 1, "dev")
    with pytest.raises(ValueError, match="--presses"):
        kl.make_press("knorm", 0.5)
    assert not (tmp_path / "prompts.json").exists()
