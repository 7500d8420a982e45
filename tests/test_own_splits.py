"""``attnprune finetune`` on your own data (issue 26 items 3–4): train / validation / test files
end to end, a plain CSV path, errors of one line before any results folder, class names in
the saved model, the majority-class warning, ``--help`` with defaults."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from test_finetune import WORDS, tiny  # noqa: F401 (the module-scoped tiny model + CSV)

from attnprune.cli import main as cli_main

NAMES = {0: "neg", 1: "neutral", 2: "pos"}  # string classes: the saved model must say them


def write(path, rows, text_col="text", label_col="label"):
    """rows: (text, label) pairs as CSV or JSONL, by the path's extension."""
    if path.suffix == ".csv":
        with path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow([text_col, label_col])
            w.writerows(rows)
    else:
        path.write_text("".join(json.dumps({text_col: t, label_col: y}) + "\n" for t, y in rows))
    return path


def rows(n, start=0, seed=0):
    """n texts whose word tells the class, every text unique (its number)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(start, start + n):
        y = i % 3
        out.append((f"the {rng.choice(WORDS[y])} was very {rng.choice(WORDS[y])} {i}", NAMES[y]))
    return out


@pytest.fixture
def splits(tmp_path):
    return {"train": write(tmp_path / "train.csv", rows(60)),
            "validation": write(tmp_path / "validation.jsonl", rows(9, 100)),
            "test": write(tmp_path / "test.csv", rows(12, 200))}


@pytest.fixture
def one_thread():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def common(tiny, out, *extra):  # noqa: F811
    return ["finetune", "--model", str(tiny / "model"), "--epochs", "1", "--lr", "1e-3",
            "--batch-size", "8", "--eval-batch-size", "8", "--timing-batches", "1",
            "--timing-repeats", "1", "--progress", "false", "--threads", "1",
            "--out", str(out), "--exact-out", *extra]


def test_own_splits_end_to_end_with_class_names(tiny, splits, tmp_path, one_thread):  # noqa: F811
    out = tmp_path / "run"
    assert cli_main(common(tiny, out, "--method", "full", "--train-file", str(splits["train"]),
                           "--validation-file", str(splits["validation"]),
                           "--test-file", str(splits["test"]))) == 0
    data = json.loads((out / "data.json").read_text())
    assert data["sizes"] == {"train": 60, "val": 9, "test": 12}
    assert data["classes"] == ["neg", "neutral", "pos"]
    assert "train=" in data["source"] and "test.csv" in data["source"]
    preds = np.load(out / "predictions" / "full__seed0.npz")
    assert len(preds["y_true"]) == 12  # the test file's rows, scored
    # the saved model carries the CSV's class names: a pipeline says them, not LABEL_0
    from transformers import pipeline

    saved = out / "models" / "full__seed0"
    cfg = json.loads((saved / "config.json").read_text())
    assert cfg["id2label"] == {"0": "neg", "1": "neutral", "2": "pos"}
    clf = pipeline("text-classification", model=str(saved), tokenizer=str(saved))
    assert clf("the great was very good")[0]["label"] in {"neg", "neutral", "pos"}


def test_plain_csv_path_majority_warning_and_bounded_interval(tiny, tmp_path, capsys,  # noqa: F811
                                                              one_thread):
    """``--data reviews.csv`` without a prefix; a model that predicts one class is named; with
    2 seeds the accuracy interval (t on 1 df) stays inside [0, 1]."""
    from safetensors.torch import load_file, save_file

    # most rows 'neg': a model saying 'neg' always scores 0.75 on the test split, 'pos' 0.125
    reviews = write(tmp_path / "reviews.csv", [(t, "neg" if i % 2 else y)
                                               for i, (t, y) in enumerate(rows(80))])
    inits = tmp_path / "inits" / "models"
    state = load_file(str(tiny / "model" / "model.safetensors"))
    for seed, bias in ((0, [50.0, -50.0, -50.0]), (1, [-50.0, -50.0, 50.0])):
        (inits / f"full__seed{seed}").mkdir(parents=True)
        save_file({**state, "classifier.bias": torch.tensor(bias)},
                  str(inits / f"full__seed{seed}" / "model.safetensors"))
    out = tmp_path / "run"
    assert cli_main(common(tiny, out, "--data", str(reviews), "--method", "full", "--seeds", "0,1",
                           "--epochs", "0", "--init-from", str(inits.parent))) == 0
    s = json.loads((out / "summary.json").read_text())
    assert len(s["warnings"]) == 2
    assert s["warnings"][0].startswith("full (seed 0) predicts one class, 'neg', for every test "
                                       "row (MCC 0; its score 0.7500 is that class's share)")
    assert s["warnings"][1].startswith("full (seed 1) predicts one class, 'pos'")
    printed = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("warning:")]
    assert printed == [f"warning: {w}" for w in s["warnings"]]
    acc = s["methods"]["full"]["accuracy"]
    assert acc["per_seed"][0] != acc["per_seed"][1]
    assert 0 <= acc["ci95"][0] <= acc["mean"] <= acc["ci95"][1] <= 1, acc


def _latin(p):
    p.write_bytes(b"text,label\n" + b"".join(f"row {i},{i % 2}\n".encode() for i in range(12))
                  + b"caf\xe9 au lait,1\n")
    return p


BAD = {
    "missing label column": (
        lambda d: ["--data", str(write(d / "reviews.csv", rows(30), label_col="sentiment"))],
        (r"reviews.csv has no column 'label' \(columns: text, sentiment\); set label_column "
        r"\(--label-column\)")),
    "empty csv": (lambda d: ["--data", str(_touch(d / "empty.csv"))], r"empty.csv is empty"),
    "one class": (lambda d: ["--data", str(write(d / "one.csv", [(f"t {i}", "pos")
                                                                  for i in range(30)]))],
                  r"one.csv column 'label': a single class \('pos' on every row\)"),
    "not utf-8": (lambda d: ["--data", str(_latin(d / "latin.csv"))],
                  r"latin.csv line 14, character 4: byte 0xe9 is not UTF-8"),
    "overlapping splits": (
        lambda d: ["--train-file", str(write(d / "train.csv", rows(30))),
                   "--test-file", str(write(d / "test.jsonl", rows(3, 100) + rows(30)[7:8]))],
        r"the same text is in .*train.csv line 9 and .*test.jsonl line 4: 'the "),
    "missing column in a split": (
        lambda d: ["--train-file", str(write(d / "train.csv", rows(30))),
                   "--validation-file", str(write(d / "dev.csv", rows(3, 100), text_col="sentence")),
                   "--test-file", str(write(d / "test.csv", rows(3, 200)))],
        (r"dev.csv has no column 'text' \(columns: sentence, label\); set text_column "
        r"\(--text-column\)")),
    "after-layer beyond the model": (
        lambda d: ["--data", str(write(d / "ok.csv", rows(30))), "--method", "attention_mass",
                   "--after-layer", "10"],
        r"after_layer: 10 is not below the 3 layers of .*; set --after-layer 1\.\.2"),
    "layers beyond the model": (
        lambda d: ["--data", str(write(d / "ok.csv", rows(30))), "--layers", "5"],
        r"layers: 5 is more than the 3 layers of .*; set --layers 1\.\.3"),
    "typo of a local path": (
        lambda d: ["--data", str(write(d / "ok.csv", rows(30))), "--model", str(d / "modls" / "x")],
        r"model: no model folder .*modls/x' \(a local path that does not exist"),
    "unknown hub name offline": (
        lambda d: ["--data", str(write(d / "ok.csv", rows(30))),
                   "--model", "no-such-org/no-such-model-26"],
        (r"model: 'no-such-org/no-such-model-26' not found locally, and the hub is unreachable "
        r"\(offline\)")),
    "data and train file": (
        lambda d: ["--data", "csv:x.csv", "--train-file", str(write(d / "t.csv", rows(30))),
                   "--test-file", str(write(d / "u.csv", rows(3, 100)))],
        r"data: give --data csv:x.csv or --train-file, not both"),
}


def _touch(p):
    p.write_text("")
    return p


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_before_any_folder(case, tiny, tmp_path, capsys, monkeypatch):  # noqa: F811
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the hub case: no network in tests
    make, message = BAD[case]
    out = tmp_path / "results"
    # no --exact-out: a new timestamped folder would be made inside out
    argv = [a for a in common(tiny, out, *make(tmp_path)) if a != "--exact-out"]
    if case.startswith(("typo", "unknown")):
        i = argv.index("--model")
        del argv[i:i + 2]  # the case's own --model (the last one) wins; drop the tiny one
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("attnprune finetune: error: ")
    import re

    assert re.search(message, err), err
    assert not out.exists()  # nothing was made


def test_unknown_hub_name_online_reads_as_a_typo(monkeypatch):
    """With the hub reachable, a name it does not know is a misspelling, not being offline."""
    from attnprune.research.finetune import model_io as finetune
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(finetune, "_hub_reachable", lambda timeout=3.0: True)

    def not_there(path, **kw):
        raise OSError(f"{path} is not a local folder and is not a valid model identifier")

    monkeypatch.setattr("transformers.AutoConfig.from_pretrained", not_there)
    with pytest.raises(ValueError, match=r"'bert-base-uncazed' is neither a local folder nor a "
                                         r"model on the hub \(check the spelling\)"):
        finetune.model_config("bert-base-uncazed")


@pytest.mark.parametrize("command, option, default", [
    ("finetune", "--train-file", "(default none)"),
    ("finetune", "--after-layer", "(default 1)"),
    ("finetune", "--keep-ratio", "(default 0.5)"),
    ("pareto", "--seeds", "(default 0,1,2)"),
    ("pareto", "--train-file", "(default none)"),
])
def test_help_lists_options_with_defaults(command, option, default, capsys):
    assert cli_main([command, "--help"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(ln.split()[:1] == [option] and default in ln for ln in lines), option


def test_pareto_reads_the_same_data_options_before_its_folder(tmp_path, capsys):
    """pareto shares the data loader: a plain path, the split files, and its errors stop
    before any folder is made."""
    bad = write(tmp_path / "reviews.csv", rows(30), label_col="sentiment")
    out = tmp_path / "results"
    assert cli_main(["pareto", "--data", str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"attnprune pareto: error: data: {bad} has no column 'label' (columns: text, "
                   "sentiment); set label_column (--label-column)")
    tr = write(tmp_path / "train.csv", rows(30))
    te = write(tmp_path / "test.csv", rows(30)[:2])
    assert cli_main(["pareto", "--train-file", str(tr), "--test-file", str(te),
                     "--out", str(out)]) == 2
    assert "the same text is in" in capsys.readouterr().err
    assert not out.exists()
