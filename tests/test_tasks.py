"""Task shapes: sentence pairs (separators kept by the pruner), regression (MSE, Pearson /
Spearman), Matthews correlation; their statistics and comparisons; end to end through
``attnprune finetune`` on small local files."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import stats as sps
from sklearn.metrics import matthews_corrcoef

from attnprune import api
from attnprune.methods.base import protect_special
from attnprune.research.data.text import load_text_data, tokenize
from attnprune.research.finetune import FinetuneConfig, main
from attnprune.runs import stats as S
from attnprune.runs.config import ConfigError, parse_command_line

FILLER = ["the", "a", "it", "was", "cat", "dog", "sat", "ran", "there", "here"]
CUES = {0: ["no", "never", "not"], 1: ["maybe", "perhaps", "some"],
        2: ["yes", "indeed", "always"]}
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *FILLER,
         *(w for ws in CUES.values() for w in ws), "good", "bad"]


def _sentence(rng, lo=2, hi=7, extra=()):
    words = list(rng.choice(FILLER, size=rng.integers(lo, hi))) + list(extra)
    rng.shuffle(words)
    return " ".join(words)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A 3-layer word-level BERT encoder with no head (so any ``num_labels`` loads, as MiniLM
    does), a 3-class premise / hypothesis CSV (the hypothesis' cue words tell the class; their
    count too, which a randomly initialised encoder learns in a few steps) and a
    sentence-pair JSONL with float similarity scores."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    root = tmp_path_factory.mktemp("tasks")
    (root / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    tok = BertTokenizerFast(vocab_file=str(root / "vocab.txt"))
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=3,
                         num_attention_heads=2, intermediate_size=32, max_position_embeddings=64,
                         hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                         initializer_range=0.3,
                         )).save_pretrained(root / "model")  # no dropout, larger init: learns in few steps
    tok.save_pretrained(root / "model")
    rng = np.random.default_rng(0)
    with (root / "nli.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["premise", "hypothesis", "label"])
        for i in range(60):
            y = i % 3
            cues = [rng.choice(CUES[y])] * (2 * y + 1)  # the cue and its count tell the class
            w.writerow([_sentence(rng), _sentence(rng, extra=cues), y])
    with (root / "sts.jsonl").open("w") as f:
        for _ in range(60):
            n_good = int(rng.integers(0, 4))
            score = round(n_good + float(rng.uniform(0, 0.9)), 2)  # fractional: a regression
            f.write(json.dumps({"sentence1": _sentence(rng), "score": score,
                                "sentence2": _sentence(rng, extra=["good"] * n_good)}) + "\n")
    return root


# ----------------------------------------------------------------------------- data
def test_pairs_load_aligned_and_tokenise_as_pairs(tiny):
    from transformers import AutoTokenizer

    d = load_text_data(f"csv:{tiny / 'nli.csv'}", "premise", "label", "hypothesis")
    assert d.task == "classification" and d.num_labels == 3
    assert sum(map(len, (d.train, d.val, d.test))) == 60
    for split in (d.train, d.val, d.test):
        assert len(split.pairs) == len(split.texts)
        # the label is told by the cue word of the row's own hypothesis: pairs stay aligned
        assert all(set(h.split()) & set(CUES[y]) for h, y in zip(split.pairs, split.labels))
    tok = AutoTokenizer.from_pretrained(tiny / "model")
    enc = tokenize(tok, d.test, np.arange(len(d.test)), max_length=8)
    sep = tok.sep_token_id
    for ids, tt, m in zip(enc["input_ids"], enc["token_type_ids"], enc["attention_mask"]):
        real = ids[m.bool()]
        assert int((real == sep).sum()) == 2 and real[-1] == sep  # [CLS] a [SEP] b [SEP]
        assert tt[m.bool()].max() == 1 and len(real) <= 8  # longest_first kept both texts


def test_regression_inferred_from_fractional_labels(tiny):
    d = load_text_data(f"jsonl:{tiny / 'sts.jsonl'}", "sentence1", "score", "sentence2")
    assert d.task == "regression" and d.num_labels == 1 and d.label_names == ()
    assert d.train.labels.dtype == np.float32 and d.train.labels.max() > 2
    # integer-valued labels stay classes unless the task says otherwise
    p = tiny / "ints.csv"
    p.write_text("text,label\n" + "".join(f"row {i},{i % 4}\n" for i in range(20)))
    assert load_text_data(f"csv:{p}").task == "classification"
    r = load_text_data(f"csv:{p}", task="regression")
    assert r.task == "regression" and r.test.labels.dtype == np.float32


def test_bad_inputs_name_the_column_or_the_line(tmp_path, tiny):
    with pytest.raises(ValueError, match=r"no column 'hypo'.*text_pair_column"):
        load_text_data(f"csv:{tiny / 'nli.csv'}", "premise", "label", "hypo")
    p = tmp_path / "bad.csv"
    rows = [f"sentence {i},{i * 0.37:.2f}" for i in range(20)]
    rows[6] = "sentence 6,high"  # data row 7 = file line 8 (the header is line 1)
    p.write_text("text,score\n" + "\n".join(rows) + "\n")
    with pytest.raises(ValueError, match=r"line 8, column 'score': label 'high'"):
        load_text_data(f"csv:{p}", label_column="score")  # inferred regression
    with pytest.raises(ValueError, match="line 8, column 'score'"):
        load_text_data(f"csv:{p}", label_column="score", task="regression")
    with pytest.raises(ValueError, match="task must be one of"):
        load_text_data(f"csv:{p}", task="ranking")


@pytest.mark.parametrize("argv, field", [
    (["--task", "ranking"], "task"),
    (["--task", "regression", "--method", "entropy"], "method"),
    (["--text-pair-column", "text"], "text_pair_column"),
])
def test_bad_task_config_names_the_field(argv, field):
    with pytest.raises(ConfigError, match=field):
        parse_command_line(argv, FinetuneConfig)


# ----------------------------------------------------------------------------- separators
def test_protect_special_marks_cls_and_separators():
    # [CLS] a a [SEP] b [SEP] [PAD]  /  [CLS] a [SEP] b b b [SEP]
    ids = torch.tensor([[2, 9, 9, 3, 8, 3, 0], [2, 9, 3, 8, 8, 8, 3]])
    tt = torch.tensor([[0, 0, 0, 0, 1, 1, 0], [0, 0, 0, 1, 1, 1, 1]])
    mask = ids != 0
    want = torch.tensor([[1, 0, 0, 1, 0, 1, 0], [1, 0, 1, 0, 0, 0, 1]], dtype=torch.bool)
    assert torch.equal(protect_special(mask, None, tt), want)  # segment ends + last real token
    assert torch.equal(protect_special(mask, ids, None, (3,)), want)  # by id, no segments
    only_ends = protect_special(mask)  # neither: CLS and the last real token
    assert only_ends[0].nonzero().flatten().tolist() == [0, 5]


def _tiny_pair_model(kind: str):
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        DistilBertConfig,
        DistilBertForSequenceClassification,
    )

    torch.manual_seed(0)
    if kind == "bert":
        return BertForSequenceClassification(BertConfig(
            vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
            intermediate_size=32, max_position_embeddings=64, num_labels=3,
            initializer_range=0.5)).eval()  # large weights: inputs visibly change the logits
    return DistilBertForSequenceClassification(DistilBertConfig(
        vocab_size=len(VOCAB), dim=16, n_layers=3, n_heads=2, hidden_dim=32,
        max_position_embeddings=64, num_labels=3, initializer_range=0.5)).eval()


@pytest.mark.parametrize("kind, method", [("bert", "random"), ("bert", "attention_mass"),
                                          ("distilbert", "random")])
def test_separators_survive_every_gather(tiny, monkeypatch, kind, method):
    """With 20 % of the tokens kept after each layer, every [SEP] of every pair and CLS are
    still present after each gather (random scores would drop most of them otherwise). BERT
    finds them from its segment ids and the last token; DistilBERT, without segment ids, from
    the ids the caller names (finetune passes the tokenizer's)."""
    from transformers import AutoTokenizer

    import attnprune.hosts.hf_encoder_loop as host

    tok = AutoTokenizer.from_pretrained(tiny / "model")
    d = load_text_data(f"csv:{tiny / 'nli.csv'}", "premise", "label", "hypothesis")
    enc = tokenize(tok, d.train, np.arange(24), max_length=32)
    if kind == "distilbert":
        enc.pop("token_type_ids")
    model = _tiny_pair_model(kind)
    opts = {"protect_token_ids": [tok.sep_token_id]} if kind == "distilbert" else {}
    api.patch(model, method, keep_ratio=0.2, after_layer=1, schedule="geometric", **opts)
    kept = []
    real_gather = host.gather_tokens

    def spy(hidden, keep, *extra):
        g, index = real_gather(hidden, keep, *extra)
        kept.append((index, g.mask))  # original positions of the kept tokens
        return g, index

    monkeypatch.setattr(host, "gather_tokens", spy)
    with torch.no_grad():
        model(**enc)
    assert len(kept) == 2  # after layers 1 and 2
    seps = [set(torch.nonzero(row == tok.sep_token_id).flatten().tolist())
            for row in enc["input_ids"]]
    assert all(len(s) == 2 for s in seps)
    for index, mask in kept:
        for b in range(len(seps)):  # row b of the batch (bucketing keeps rows in place here)
            have = set(index[b][mask[b]].tolist())
            assert seps[b] | {0} <= have
        assert mask.sum(1).float().mean() < 0.6 * enc["attention_mask"].sum(1).float().mean()


def test_roberta_pair_separators_kept_from_its_config_ids(monkeypatch):
    """RoBERTa marks a pair as ``<s> a </s></s> b </s>`` with no segment ids: its config's
    ``bos/eos_token_id`` (0 and 2) tell the host which tokens to keep, with no option given."""
    from transformers import RobertaConfig, RobertaForSequenceClassification

    import attnprune.hosts.hf_encoder_loop as host

    torch.manual_seed(0)
    model = RobertaForSequenceClassification(RobertaConfig(
        vocab_size=40, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=80, num_labels=2)).eval()
    rows = []
    g = torch.Generator().manual_seed(1)
    for b in range(16):
        a, c = torch.randint(5, 40, (int(4 + b % 5),), generator=g), torch.randint(5, 40, (7,), generator=g)
        rows.append(torch.cat([torch.tensor([0]), a, torch.tensor([2, 2]), c, torch.tensor([2])]))
    L = max(len(r) for r in rows)
    ids = torch.stack([torch.cat([r, torch.ones(L - len(r), dtype=torch.long)]) for r in rows])
    api.patch(model, "random", keep_ratio=0.25, after_layer=1)
    kept = []
    real_gather = host.gather_tokens
    monkeypatch.setattr(host, "gather_tokens",
                        lambda h, k, *e: kept.append(real_gather(h, k, *e)) or kept[-1])
    with torch.no_grad():
        model(input_ids=ids, attention_mask=(ids != 1).long())
    (g_out, index), = kept
    for b, row in enumerate(ids):
        want = set(torch.nonzero((row == 0) | (row == 2)).flatten().tolist())  # 1 + 3 per row
        assert want <= set(index[b][g_out.mask[b]].tolist())


def test_pair_segments_reach_the_model_pruned_or_not(tiny):
    """token_type_ids change the output (BERT adds their embedding before the first layer), and
    the patched model at ρ = 1 equals the stock one with them: the gathered path keeps the
    segment information its tokens carry."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny / "model")
    d = load_text_data(f"csv:{tiny / 'nli.csv'}", "premise", "label", "hypothesis")
    enc = tokenize(tok, d.test, np.arange(len(d.test)), max_length=32)
    model = _tiny_pair_model("bert")
    with torch.no_grad():
        ref = model(**enc).logits
        no_seg = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits
        assert not torch.allclose(ref, no_seg, atol=1e-2)
        api.patch(model, "attention_mass", keep_ratio=1.0, after_layer=1)
        torch.testing.assert_close(model(**enc).logits, ref, atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------- loss
def test_regression_loss_is_mse_and_distils_to_the_teacher_output():
    from transformers import BertConfig, BertForSequenceClassification

    from attnprune.train.loop import _loss

    cfg = BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=32, num_labels=1)
    torch.manual_seed(0)
    student, teacher = BertForSequenceClassification(cfg).eval(), BertForSequenceClassification(cfg).eval()
    batch = {"input_ids": torch.randint(5, 30, (4, 6)), "attention_mask": torch.ones(4, 6, dtype=torch.long),
             "token_type_ids": torch.zeros(4, 6, dtype=torch.long),
             "labels": torch.tensor([0.5, 1.5, 4.2, 3.0])}
    z = student(input_ids=batch["input_ids"]).logits[:, 0]
    zt = teacher(input_ids=batch["input_ids"]).logits[:, 0]
    loss, logs = _loss(student, batch, None, 0.0, 2.0)
    assert loss.item() == pytest.approx(F.mse_loss(z, batch["labels"]).item(), rel=1e-5)
    loss, logs = _loss(student, batch, teacher, 0.25, 2.0)
    want = 0.75 * F.mse_loss(z, batch["labels"]) + 0.25 * F.mse_loss(z, zt)
    assert loss.item() == pytest.approx(want.item(), rel=1e-5)
    assert logs["distill"] == pytest.approx(F.mse_loss(z, zt).item(), rel=1e-5)


# ----------------------------------------------------------------------------- statistics
def test_resampled_mcc_and_correlations_match_the_libraries():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 80)
    pred = np.where(rng.random(80) < 0.6, y, rng.integers(0, 3, 80))
    idx = rng.integers(0, 80, (40, 80))
    est, rows = S.bootstrap._row_metric("mcc", y, pred, True)
    assert est == pytest.approx(matthews_corrcoef(y, pred))
    np.testing.assert_allclose(rows(idx), [matthews_corrcoef(y[r], pred[r]) for r in idx],
                               atol=1e-12)
    t = rng.normal(size=60)
    x = t + rng.normal(size=60)
    x[:5] = x[5]  # ties: Spearman uses mid-ranks
    idx = rng.integers(0, 60, (40, 60))
    for metric, fn in (("pearson", sps.pearsonr), ("spearman", sps.spearmanr)):
        est, rows = S.bootstrap._row_metric(metric, t, x, True)
        assert est == pytest.approx(fn(t, x).statistic)
        np.testing.assert_allclose(rows(idx), [fn(t[r], x[r]).statistic for r in idx],
                                   atol=1e-12)
    with pytest.raises(ValueError, match="predictions is constant"):
        S.bootstrap_ci(t, np.ones(60), "pearson")


def test_compare_regression_and_mcc_paired_bootstrap_with_holm():
    rng = np.random.default_rng(1)
    y = rng.normal(size=150)
    preds = {"full": {"y_true": y, "y_pred": y + 0.3 * rng.normal(size=150)},
             "same": {"y_true": y, "y_pred": y + 0.3 * rng.normal(size=150)},
             "noisy": {"y_true": y, "y_pred": y + 2.0 * rng.normal(size=150)}}
    out = S.compare_predictions(preds, metrics=S.TASK_METRICS["regression"], n_resamples=1000)
    assert [(c["a"], c["metric"]) for c in out] == [
        ("same", "pearson"), ("same", "spearman"), ("noisy", "pearson"), ("noisy", "spearman")]
    assert {c["test"] for c in out} == {"bootstrap"}
    np.testing.assert_allclose([c["p_holm"] for c in out], S.holm([c["p"] for c in out]))
    noisy = out[2]
    assert noisy["diff"] == pytest.approx(sps.pearsonr(y, preds["noisy"]["y_pred"]).statistic
                                          - sps.pearsonr(y, preds["full"]["y_pred"]).statistic)
    assert noisy["ci95"][1] < 0 and noisy["claim"] == "degradation"
    assert noisy["effect"]["cohens_q"] < 0 and out[0]["claim"] == "none"

    yc = rng.integers(0, 3, 200)
    cls = {"full": {"y_true": yc, "y_pred": np.where(rng.random(200) < 0.9, yc, 0)},
           "worse": {"y_true": yc, "y_pred": np.where(rng.random(200) < 0.4, yc, 0)}}
    out = S.compare_predictions(cls, metrics=S.TASK_METRICS["classification"], n_resamples=1000)
    assert [(c["metric"], c["test"]) for c in out] == [("accuracy", "mcnemar"), ("mcc", "bootstrap")]
    mcc = out[1]
    assert mcc["value_a"] == pytest.approx(matthews_corrcoef(yc, cls["worse"]["y_pred"]))
    assert mcc["ci95"][1] < 0 and mcc["claim"] == "degradation"
    with pytest.raises(ValueError, match="unknown metric 'r2'"):
        S.compare_predictions(preds, metrics=("r2",))


# ----------------------------------------------------------------------------- end to end
def _args(tiny, out, *extra):
    return ["--model", str(tiny / "model"), "--epochs", "6", "--lr", "3e-3", "--batch-size", "8",
            "--eval-batch-size", "8", "--timing-batches", "1", "--timing-repeats", "1",
            "--progress", "false", "--threads", "1", "--method", "attention_mass",
            "--keep-ratio", "0.5", "--after-layer", "1", "--out", str(out), "--exact-out", *extra]


@pytest.fixture
def one_thread():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_finetune_sentence_pairs_three_classes(tiny, tmp_path, one_thread):
    out = tmp_path / "nli"
    assert main(_args(tiny, out, "--data", f"csv:{tiny / 'nli.csv'}", "--text-column", "premise",
                      "--text-pair-column", "hypothesis")) == 0
    s = json.loads((out / "summary.json").read_text())
    data = json.loads((out / "data.json").read_text())
    assert data["task"] == "classification" and data["pairs"] and s["task"] == "classification"
    label = "attention_mass@0.5/L1"
    m = s["methods"][label]
    lo, hi = m["mcc"]["ci95"]
    assert -1 <= lo <= m["mcc"]["mean"] <= hi <= 1 and 0 <= m["accuracy"]["mean"] <= 1
    assert 0 < m["kept_ratio"] < 1
    with np.load(next((out / "predictions").glob("attention_mass*__seed0.npz"))) as z:
        assert m["mcc"]["mean"] == pytest.approx(matthews_corrcoef(z["y_true"], z["y_pred"]))
    # no --init-from: the reference is the same weights unpruned (predictions/full__seed0.npz)
    comps = {c["metric"]: c for c in s["comparisons"] if c["a"] == label and c["b"] == "full"}
    assert {k: c["test"] for k, c in comps.items()} == {"accuracy": "mcnemar", "mcc": "bootstrap"}
    with np.load(out / "predictions" / "full__seed0.npz") as z:
        assert comps["mcc"]["value_b"] == pytest.approx(matthews_corrcoef(z["y_true"], z["y_pred"]))
    np.testing.assert_allclose([c["p_holm"] for c in s["comparisons"]],
                               S.holm([c["p"] for c in s["comparisons"]]))
    assert (out / "accuracy_vs_flops.png").is_file()


def test_finetune_regression_pairs(tiny, tmp_path, one_thread, capsys):
    out = tmp_path / "sts"
    assert main(_args(tiny, out, "--data", f"jsonl:{tiny / 'sts.jsonl'}",
                      "--text-column", "sentence1", "--text-pair-column", "sentence2",
                      "--label-column", "score")) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["task"] == "regression"
    label = "attention_mass@0.5/L1"
    with np.load(next((out / "predictions").glob("attention_mass*__seed0.npz"))) as z:
        y, pred = z["y_true"], z["y_pred"]
    assert y.dtype == np.float64 and not np.allclose(pred, np.round(pred))  # real-valued
    m = s["methods"][label]
    assert m["pearson"]["mean"] == pytest.approx(sps.pearsonr(y, pred).statistic)
    assert m["spearman"]["mean"] == pytest.approx(sps.spearmanr(y, pred).statistic)
    assert m["mse"] == pytest.approx(float(np.mean((pred - y) ** 2)))
    assert "accuracy" not in m and "mcc" not in m
    comps = [c for c in s["comparisons"] if c["a"] == label]
    assert {(c["metric"], c["test"]) for c in comps} == {("pearson", "bootstrap"),
                                                        ("spearman", "bootstrap")}
    assert all("cohens_q" in c["effect"] and 0 <= c["p"] <= c["p_holm"] <= 1 for c in comps)
    assert (out / "pearson_vs_flops.png").is_file()
    assert "pearson" in capsys.readouterr().out


# ----------------------------------------------------------------------------- GLUE (offline)
def _fake_glue(monkeypatch):
    """``datasets.load_dataset("glue", task)`` answered from memory, with GLUE's columns and
    split names (the hub is unreachable here); records which task was asked for."""
    import datasets

    asked = []

    def split(n, cols, label):
        return datasets.Dataset.from_dict(
            {**{c: [f"{c} {i}" for i in range(n)] for c in cols}, "label": label(n)},
            features=datasets.Features({**{c: datasets.Value("string") for c in cols},
                                        "label": datasets.ClassLabel(
                                            names=["entailment", "neutral", "contradiction"])
                                        if label is _classes else datasets.Value("float32")}))

    def load(path, name):
        asked.append((path, name))
        if name == "mnli":
            cols = ["premise", "hypothesis"]
            return datasets.DatasetDict({"train": split(60, cols, _classes),
                                         "validation_matched": split(9, cols, _classes),
                                         "validation_mismatched": split(7, cols, _classes)})
        cols = ["sentence1", "sentence2"]
        return datasets.DatasetDict({"train": split(40, cols, _scores),
                                     "validation": split(8, cols, _scores)})

    monkeypatch.setattr(datasets, "load_dataset", load)
    return asked


def _classes(n):
    return [i % 3 for i in range(n)]


def _scores(n):
    return [round(5 * i / n, 2) for i in range(n)]


def test_glue_pair_tasks_use_their_columns_and_splits(monkeypatch):
    asked = _fake_glue(monkeypatch)
    d = load_text_data("glue/mnli")
    assert asked == [("glue", "mnli")] and d.task == "classification"
    assert d.label_names == ("entailment", "neutral", "contradiction")
    assert len(d.test) == 9  # validation_matched is the test split (MNLI-m)
    assert d.test.texts[3] == "premise 3" and d.test.pairs[3] == "hypothesis 3"
    assert len(d.train) + len(d.val) == 60 and len(d.val) == 6
    assert all(t.split()[1] == p.split()[1] for t, p in zip(d.train.texts, d.train.pairs))
    s = load_text_data("glue/stsb")
    assert s.task == "regression" and s.num_labels == 1 and s.test.labels.dtype == np.float32
    assert s.test.labels[-1] == pytest.approx(4.38)
    with pytest.raises(ValueError, match="task: glue/stsb is a regression task"):
        load_text_data("glue/stsb", task="classification")
    with pytest.raises(ValueError, match="glue/wnli is not supported"):
        load_text_data("glue/wnli")
