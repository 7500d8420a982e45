"""``attnprune finetune``: config errors before work, and a tiny end-to-end run (3 classes)."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch

from attnprune.research.finetune import FinetuneConfig, main
from attnprune.runs.config import ConfigError, parse_command_line

WORDS = {0: ["awful", "bad", "sad"], 1: ["table", "chair", "door"], 2: ["great", "happy", "good"]}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A 3-layer BERT classifier with a word-level vocabulary, saved like a hub checkpoint,
    and a 3-class CSV whose words tell the class."""
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    root = tmp_path_factory.mktemp("tiny")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "it", "was", "very"]
    vocab += [w for ws in WORDS.values() for w in ws]
    (root / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok = BertTokenizerFast(vocab_file=str(root / "vocab.txt"))
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=len(vocab), hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=64, num_labels=3))
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    rng = np.random.default_rng(0)
    with (root / "data.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        for i in range(90):
            y = i % 3
            filler = " ".join(rng.choice(["the", "it", "was", "very"], size=rng.integers(2, 8)))
            w.writerow([f"{filler} {rng.choice(WORDS[y])} {filler}", y])
    return root


@pytest.fixture
def one_thread():
    """main() applies --threads globally; restore the count for the other tests."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def args(tiny, out, *extra):
    return ["--model", str(tiny / "model"), "--data", f"csv:{tiny / 'data.csv'}",
            "--epochs", "2", "--lr", "1e-3", "--batch-size", "8", "--eval-batch-size", "4",
            "--timing-batches", "1", "--timing-repeats", "1", "--progress", "false",
            "--threads", "1", "--out", str(out), "--exact-out", *extra]


@pytest.mark.slow
def test_finetune_full_then_pruned_from_it(tiny, tmp_path, capsys, one_thread):
    full = tmp_path / "full"
    assert main(args(tiny, full, "--method", "full")) == 0
    assert (full / "models" / "full__seed0" / "model.safetensors").is_file()
    run = json.loads((full / "runs" / "full__seed0.json").read_text())
    losses = [h["train_task"] for h in run["history"]]
    assert len(losses) == 2 and losses[-1] < losses[0]  # the loop trains

    pruned = tmp_path / "pruned"
    assert main(args(tiny, pruned, "--method", "ltp", "--keep-ratio", "0.5",
                     "--schedule", "geometric", "--init-from", str(full), "--epochs", "1",
                     "--distill-weight", "0.5", "--method-options", '{"temperature": 0.2, "init_threshold": 1.0}')) == 0
    s = json.loads((pruned / "summary.json").read_text())
    label = "ltp@0.5/L1/geometric"
    assert {"full", label, f"{label}/no-retrain"} <= set(s["methods"])
    m = s["methods"][label]
    assert 0 < m["flops"]["relative"] <= 1.0 and m["flops"]["measured"] > 0
    assert m["time"]["relative"] > 0 and 0 < m["kept_ratio"] <= 1.0
    lo, hi = m["accuracy"]["ci95"]
    assert lo <= m["accuracy"]["mean"] <= hi
    # the reference is the --init-from model, unpruned on every batch (several test batches):
    # same accuracy and FLOPs as the full run's test score
    assert s["methods"]["full"]["kept_ratio"] == 1.0
    ref = json.loads((pruned / "reference__seed0.json").read_text())
    full_test = json.loads((full / "runs" / "full__seed0.json").read_text())["test"]
    assert ref["flops"]["measured"] == full_test["flops"]["measured"]
    assert s["methods"]["full"]["accuracy"]["mean"] == pytest.approx(
        json.loads((full / "summary.json").read_text())["methods"]["full"]["accuracy"]["mean"])
    comps = [c for c in s["comparisons"] if c["metric"] == "accuracy"]
    assert {c["a"] for c in comps} == {label, f"{label}/no-retrain"}
    assert all(c["b"] == "full" and 0 <= c["p"] <= 1 for c in comps)
    preds = sorted(p.name for p in (pruned / "predictions").glob("*.npz"))
    assert len(preds) == 3
    assert (pruned / "accuracy_vs_flops.png").is_file()

    # Resume: a rerun into the same folder skips the finished run.
    capsys.readouterr()
    assert main(args(tiny, pruned, "--method", "ltp", "--keep-ratio", "0.5",
                     "--schedule", "geometric", "--init-from", str(full), "--epochs", "1",
                     "--distill-weight", "0.5", "--method-options", '{"temperature": 0.2, "init_threshold": 1.0}')) == 0
    assert "skip" in capsys.readouterr().out


@pytest.mark.slow
def test_finetune_layer_drop_and_int8(tiny, tmp_path, one_thread):
    full = tmp_path / "full"
    assert main(args(tiny, full, "--method", "full", "--epochs", "1")) == 0
    out = tmp_path / "l2"
    assert main(args(tiny, out, "--layers", "2", "--init-from", str(full), "--epochs", "1",
                     "--distill-weight", "0.5", "--int8", "true")) == 0
    s = json.loads((out / "summary.json").read_text())
    assert {"full", "layers=2", "layers=2+int8"} <= set(s["methods"])
    m = s["methods"]["layers=2"]
    # two of three layers: fewer FLOPs than the full (3-layer) reference on the same batches
    assert 0.5 < m["flops"]["relative"] < 0.9
    assert m["time"]["relative"] > 0 and s["methods"]["layers=2+int8"]["time"]["relative"] > 0
    from safetensors.torch import load_file

    keys = load_file(str(out / "models" / "layers=2__seed0" / "model.safetensors"))
    assert not any(".layer.2." in k for k in keys) and any(".layer.1." in k for k in keys)


@pytest.mark.parametrize("argv, field", [
    (["--keep-ratio", "1.5"], "keep_ratio"),
    (["--method", "nope"], "method"),
    (["--init-from", "/does/not/exist"], "init_from"),
    (["--method-options", "[1, 2]"], "method_options"),
    (["--epochs", "0"], "epochs"),
    (["--distill-weight", "0.5"], "distill_weight"),
    (["--bogus", "1"], "bogus"),
    (["--layers", "0"], "layers"),
    (["--data", "csv:/does/not/exist.csv"], "data"),
])
def test_bad_config_names_the_field(argv, field):
    with pytest.raises(ConfigError, match=field):
        parse_command_line(argv, FinetuneConfig)


def test_keep_ratio_list_and_method_options_parse():
    cfg = parse_command_line(["--keep-ratio", "0.3,0.5", "--method", "attention_mass",
                              "--method-options", '{"variant": "cls"}'], FinetuneConfig).config
    assert cfg.keep_ratio == (0.3, 0.5) and cfg.method_options == {"variant": "cls"}


def test_bench_encoder_command_smoke(tiny, tmp_path, one_thread):
    """`attnprune bench encoder` on the tiny model: one row per method × ρ, FLOPs measured."""
    from attnprune.bench.encoder import main as bench_main

    out = tmp_path / "bench"
    assert bench_main(["--model", str(tiny / "model"), "--batch-sizes", "2", "--lengths", "32",
                       "--keep-ratios", "0.5", "--repeats", "1", "--min-time-s", "0",
                       "--threads", "1", "--out", str(out), "--exact-out"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert len(s["methods"]) == 4  # random, attention_mass, entropy, ltp
    for e in s["methods"].values():
        assert 0.3 < e["flops"]["relative"] < 0.95  # pruning after layer 1 of 3 at ρ = 0.5
        assert e["time"]["median_s"] > 0 and e["scorer_overhead"] >= 0
    assert (out / "time_flops_vs_length.png").is_file()


@pytest.mark.parametrize("method, options", [
    ("crisp", '{"sparsity": 0.5}'),
    ("cost", '{"lam": 0.001}'),
])
def test_finetune_attention_and_loss_methods(tiny, tmp_path, one_thread, method, options):
    """Attention-level (crisp) and loss (cost) methods train through the same command, and
    their penalty reaches the loss: the run records a comparison against the full model."""
    full, out = tmp_path / "full", tmp_path / method
    assert main(args(tiny, full, "--method", "full", "--epochs", "1")) == 0
    assert main(args(tiny, out, "--method", method, "--epochs", "1", "--init-from", str(full),
                     "--method-options", options)) == 0
    s = json.loads((out / "summary.json").read_text())
    labels = set(s["methods"])
    assert "full" in labels and any(lbl.startswith(method) for lbl in labels)
    assert any(c["metric"] == "accuracy" and c["a"].startswith(method) for c in s["comparisons"])


@pytest.mark.slow
def test_finetune_reports_fair_reference_beside_padded(tiny, tmp_path, capsys, one_thread):
    """FLOPs and time against the full model on length-sorted batches (no padding for either)
    beside the padded file-order ratios, where the pruned model's row bucketing drops padding
    that the full model computes and so reads as pruning (pareto's fair reference)."""
    # short and long rows mixed in file order: padded batches are about half padding
    data = tmp_path / "mixed.csv"
    rng = np.random.default_rng(1)
    with data.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["text", "label"])
        for i in range(90):
            y = i % 3
            filler = " ".join(rng.choice(["the", "it", "was", "very"], size=2 if i % 2 else 40))
            w.writerow([f"{rng.choice(WORDS[y])} {filler}", y])
    out = tmp_path / "fair"
    assert main(args(tiny, out, "--method", "attention_mass", "--keep-ratio", "0.5",
                     "--epochs", "1", "--timing-batches", "2", "--timing-repeats", "3",
                     "--data", f"csv:{data}")) == 0
    s = json.loads((out / "summary.json").read_text())
    m = s["methods"]["attention_mass@0.5/L1"]
    padded, fair = m["flops"]["relative"], m["flops"]["relative_fair"]
    assert 0 < padded < 1 and 0 < fair < 1
    assert fair > padded  # the padded ratio credited padding removal to pruning
    assert m["time"]["relative_fair"] > 0 and m["time"]["relative"] > 0
    (run,) = (out / "runs").glob("*.json")
    rec = json.loads(run.read_text())["test"]
    f = rec["fair"]
    assert f["batches"] == 2 and f["flops_relative"] == pytest.approx(f["flops"] / f["full_flops"])
    assert "(fair " in capsys.readouterr().out
    row = next(r for r in csv.DictReader((out / "metrics.csv").open())
               if r["label"] == "attention_mass@0.5/L1")
    assert float(row["flops_relative_fair"]) == pytest.approx(fair)
    # the report: written by the command; its figure draws the fair ratio its verdict quotes
    from attnprune.research.finetune import figure_points
    from attnprune.runs.report import verdict

    assert (out / "report.html").is_file() and (out / "accuracy_vs_flops.png").is_file()
    point = next(p for p in figure_points(s["methods"]) if p["label"] == "attention_mass@0.5/L1")
    assert point["fair"] and point["flops_relative"] == pytest.approx(fair)
    assert f"at {fair:.3g}× the FLOPs" in verdict(s)


def test_figure_points_mark_a_padded_ratio():
    """A method without a fair ratio is drawn at its padded one, marked so; full is 1 in both."""
    from attnprune.research.finetune import figure_points

    acc = {"mean": 0.8, "ci95": [0.7, 0.9]}
    pts = {p["label"]: p for p in figure_points({
        "full": {"flops": {"relative": 1.0}, "accuracy": acc},
        "a@0.5": {"flops": {"relative": 0.4, "relative_fair": 0.7}, "accuracy": acc},
        "b@0.5": {"flops": {"relative": 0.5}, "accuracy": acc}})}
    assert (pts["full"]["flops_relative"], pts["full"]["fair"]) == (1.0, True)
    assert (pts["a@0.5"]["flops_relative"], pts["a@0.5"]["fair"]) == (0.7, True)
    assert (pts["b@0.5"]["flops_relative"], pts["b@0.5"]["fair"]) == (0.5, False)


@pytest.mark.slow
def test_one_ctrl_c_stops_finetune_cleanly(tiny, tmp_path):
    """One Ctrl-C (SIGINT, as a terminal sends it) right after the first seed's run is saved,
    delivered there by the command itself (no race with a clock): exit 130 with one line and
    no traceback, that run saved whole and no other started, nothing left running."""
    from interrupt_helpers import assert_group_gone, assert_stopped_cleanly, ctrl_c

    out = tmp_path / "ft"
    rc, stdout, stderr, pgid = ctrl_c(
        ["finetune", *args(tiny, out, "--seeds", ",".join(str(s) for s in range(50)))],
        after=1, ready=tmp_path / "ready", real=False)
    assert_stopped_cleanly(rc, stdout, stderr)
    runs = sorted(out.glob("runs/*.json"))
    assert len(runs) == 1
    for r in runs:  # each marker written after its model and predictions
        seed = json.loads(r.read_text())["seed"]
        assert (out / "models" / f"full__seed{seed}" / "model.safetensors").is_file()
        assert (out / "predictions" / f"full__seed{seed}.npz").is_file()
    assert_group_gone(pgid)
