"""ONNX export of pruned encoders: onnxruntime parity with PyTorch at other shapes than the
trace, protected separators, data-dependent kept counts, refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import require_module  # tests/ is on sys.path
from transformers import BertConfig, BertForSequenceClassification

import attnprune

for _name in ("onnxruntime", "onnxscript", "onnx"):  # dev extras: under CI, missing fails
    require_module(_name)

from attnprune.deploy.onnx import export_onnx, onnx_session, run_onnx
from attnprune.selection import budget

# initializer_range 0.2, not HF's 0.02: with 0.02 the tiny model's logits (|y| ≈ 0.02) move
# by 2e-5 to 2e-4 when tokens are pruned, about the parity tolerance, so an export that did
# not prune would pass; at 0.2 pruning moves them by 0.07 to 0.8, thousands of tolerances.
KW = {"hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
      "intermediate_size": 64, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
      "max_position_embeddings": 64, "initializer_range": 0.2}
ATOL = 1e-4  # onnxruntime vs PyTorch, fp32
PRUNING_MOVES = 100 * ATOL  # the least a pruned row's logits must differ from the full model's
# Other batch sizes and lengths than the trace (2 × 32), with and without padding; L = 10 and
# 20 make ρ·L an integer, where a float32 budget would keep one token too few; L = 2 keeps
# CLS and the last token ([SEP]), more than ⌊ρ·2⌋ = 1.
SHAPES = [(1, 10, False), (3, 20, True), (2, 7, True), (4, 64, True), (1, 2, False)]


def tiny():
    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(vocab_size=100, num_labels=3, **KW)).eval()


def inputs(B, L, pad=True, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 100, (B, L), generator=g)
    am = torch.ones(B, L, dtype=torch.long)
    if pad and B > 1:
        am[1, L // 2:] = 0  # a padded row: fewer real tokens, its own budget ⌊ρ·n⌋
    return {"input_ids": ids, "attention_mask": am}


def pruning(model, method, **opts):
    """``model`` patched with ``method``; the learned-count methods get parameters that prune
    (at initialisation LTP's θ and DTR's policy keep every token: nothing to check)."""
    attnprune.patch(model, method, **opts)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in attnprune.patch_state(model).modules.named_parameters():
            if method in ("ltp", "dtr", "hybrid", "ltp_causal"):
                # θ = 1: keep tokens receiving more than a uniform share of attention
                p.copy_(torch.ones_like(p) if name.endswith("theta")
                        else torch.randn(p.shape, generator=g))
    return model


def check_parity(model, path, shapes=SHAPES, full=None):
    """onnxruntime's logits equal ``model``'s at ``shapes``; with ``full`` (the unpruned
    model), they also differ from its logits wherever the model drops a token: an export that
    did not prune fails."""
    sess = onnx_session(path, threads=1)
    for B, L, pad in shapes:
        x = inputs(B, L, pad, seed=L)
        got = run_onnx(sess, x)["logits"]
        with torch.no_grad():
            ref = model(**x).logits.numpy()
        assert got.shape == ref.shape
        np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)
        assert (got.argmax(-1) == ref.argmax(-1)).all()
        if full is not None and attnprune.patch_state(model).stats["kept_ratio"] < 1:
            with torch.no_grad():
                stock = full(**x).logits.numpy()
            assert np.abs(got - stock).max() > PRUNING_MOVES


@pytest.mark.parametrize(("method", "opts"), [
    ("attention_mass", {"keep_ratio": 0.7, "after_layer": 1}),  # ⌊10·0.7⌋ = 7: float32 trap
    ("entropy", {"keep_ratio": 0.5, "after_layer": 1, "schedule": "geometric"}),
    ("entropy_threshold", {"keep_ratio": 0.5, "after_layer": 1}),  # data-dependent counts
    ("ltp", {"after_layer": 1}),  # learned thresholds: data-dependent counts
    (None, {}),
])
def test_export_matches_pytorch_at_other_shapes(tmp_path, method, opts):
    model = pruning(tiny(), method, **opts) if method else tiny()
    path = export_onnx(model, tmp_path / "m.onnx")  # traced at 2 × 32, verified there
    check_parity(model, path, full=tiny() if method else None)
    if method:
        # the graph really gathers: TopK (the selection) only exists in the pruned file
        import onnx

        assert "TopK" in {n.op_type for n in onnx.load(str(path)).graph.node}
        with torch.no_grad():  # the patch still prunes eagerly after the export
            model(**inputs(2, 20))
        assert attnprune.patch_state(model).stats["kept_ratio"] < 1


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(set(attnprune.list_methods("token"))
                                          - {"attention_mass", "entropy", "entropy_threshold",
                                             "ltp", "random"}))
def test_every_token_method_exports(tmp_path, method):
    model = pruning(tiny(), method, keep_ratio=0.5, after_layer=1)
    with torch.no_grad():
        model(**inputs(3, 20))
    assert attnprune.patch_state(model).stats["kept_ratio"] < 1  # it prunes: a real check
    check_parity(model, export_onnx(model, tmp_path / "m.onnx"), SHAPES[:3], full=tiny())


def test_protected_separators_beyond_the_budget(tmp_path):
    """A short pair keeps [CLS] and both [SEP] (3 tokens) where ⌊ρ·n⌋ = 2: the graph keeps
    them too, at batch 1 (the host's one-row path) and in a padded batch."""
    model, full = tiny(), tiny()
    attnprune.patch(model, "attention_mass", keep_ratio=0.3, after_layer=1)

    def pairs(B, L):
        x = inputs(B, L, pad=True, seed=B)
        tt = torch.zeros(B, L, dtype=torch.long)
        tt[:, L // 3 + 1:] = 1  # [CLS] a … [SEP] | b … [SEP]
        return {**x, "token_type_ids": tt * x["attention_mask"]}

    path = export_onnx(model, tmp_path / "p.onnx", example=pairs(2, 16))
    sess = onnx_session(path, threads=1)
    for B, L in [(1, 7), (3, 7), (2, 40)]:
        x = pairs(B, L)
        with torch.no_grad():
            ref = model(**x).logits.numpy()
        if L == 7:  # 3 protected > ⌊0.3·7⌋ = 2 per full row: the union case is exercised
            k = budget(x["attention_mask"].sum(1), 0.3)
            assert attnprune.patch_state(model).stats["kept_per_layer"][1] > int(k.sum())
        got = run_onnx(sess, x)["logits"]
        np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)
        with torch.no_grad():
            assert np.abs(got - full(**x).logits.numpy()).max() > PRUNING_MOVES
        if B == 1:  # and no attention mask at all: the eager one-row path
            del x["attention_mask"]
            with torch.no_grad():
                alone = model(**x).logits.numpy()
            np.testing.assert_allclose(alone, ref, atol=1e-5, rtol=0)


def test_refusals_and_bad_arguments(tmp_path):
    model = tiny()
    attnprune.patch(model, "crisp", sparsity=0.5)
    with pytest.raises(ValueError, match="attention-level"):
        export_onnx(model, tmp_path / "x.onnx")
    model = tiny()
    attnprune.patch(model, "attention_mass", keep_ratio=0.5, after_layer=1)
    with pytest.raises(ValueError, match="max_length"):
        export_onnx(model, tmp_path / "x.onnx", max_length=1)
    with pytest.raises(ValueError, match="example"):
        export_onnx(model, tmp_path / "x.onnx", example={"input_ids": torch.ones(3)})
    with pytest.raises(ValueError, match="at least 2 tokens"):
        export_onnx(model, tmp_path / "x.onnx", example=inputs(2, 1, pad=False))


@pytest.fixture(scope="module")
def cli_trained(tmp_path_factory):
    """A tiny BERT classifier with a word-level tokenizer, fine-tuned with attention_mass by
    ``attnprune finetune`` (which records the tokenizer's [CLS]/[SEP] ids as
    ``protect_token_ids``); the folder of the saved model."""
    import csv

    from transformers import BertTokenizerFast

    from attnprune.cli import main

    root = tmp_path_factory.mktemp("cli")
    words = ["great", "good", "bad", "awful", "the", "it", "was", "very", "a", "film"]
    (root / "vocab.txt").write_text("\n".join(
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    torch.manual_seed(0)
    BertForSequenceClassification(BertConfig(vocab_size=len(words) + 5, num_labels=2, **KW)
                                   ).save_pretrained(root / "model")  # KW: see PRUNING_MOVES
    BertTokenizerFast(vocab_file=str(root / "vocab.txt")).save_pretrained(root / "model")
    g = torch.Generator().manual_seed(0)
    with (root / "data.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        for i in range(40):
            filler = [words[int(j)] for j in torch.randint(4, 10, (12,), generator=g)]
            w.writerow([" ".join([*filler[:6], words[i % 4], *filler[6:]]), int(i % 4 < 2)])
    n = torch.get_num_threads()
    try:
        assert main(["finetune", "--model", str(root / "model"), "--data",
                     f"csv:{root / 'data.csv'}", "--method", "attention_mass",
                     "--keep-ratio", "0.5", "--after-layer", "1", "--epochs", "1",
                     "--batch-size", "8", "--eval-batch-size", "8", "--timing-batches", "1",
                     "--timing-repeats", "1", "--progress", "false", "--threads", "1",
                     "--out", str(root / "out"), "--exact-out"]) == 0
    finally:
        torch.set_num_threads(n)  # --threads applies globally
    (folder,) = [p for p in (root / "out" / "models").iterdir() if "attention_mass" in p.name]
    return folder


def test_a_model_trained_by_the_cli_exports(tmp_path, cli_trained):
    """Issue 23 item 12: the CLI saves protect_token_ids, which used torch.isin (no ONNX
    function for aten.searchsorted under torch.export)."""
    model = attnprune.from_pretrained(cli_trained)
    assert attnprune.patch_state(model).options["protect_token_ids"] == [2, 3]
    path = export_onnx(model, tmp_path / "cli.onnx")
    sess = onnx_session(path, threads=1)
    stock = attnprune.unpatch(attnprune.from_pretrained(cli_trained))
    for B, L in [(1, 9), (3, 20)]:
        x = inputs(B, L, pad=True, seed=L)
        x["input_ids"] = x["input_ids"] % 15  # the tokenizer's vocabulary
        x["input_ids"][:, 0] = 2  # [CLS] … [SEP] (one inside the row, kept: protected)
        x["input_ids"][:, L // 3] = 3
        with torch.no_grad():
            ref = model(**x).logits.numpy()
            full = stock(**x).logits.numpy()
        got = run_onnx(sess, x)["logits"]
        np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)
        assert np.abs(got - full).max() > PRUNING_MOVES  # the graph prunes
