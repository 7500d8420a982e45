"""ONNX export of pruned encoders: onnxruntime parity with PyTorch, dynamic axes, refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

import attnprune

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from attnprune.deploy.onnx import export_onnx, onnx_session, run_onnx

KW = {"hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
      "intermediate_size": 64, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
      "max_position_embeddings": 64}


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


@pytest.mark.parametrize(("method", "opts"), [
    ("attention_mass", {"keep_ratio": 0.7, "after_layer": 1}),  # ⌊10·0.7⌋ = 7: float32 trap
    ("entropy", {"keep_ratio": 0.5, "after_layer": 1, "schedule": "geometric"}),
    (None, {}),
])
def test_export_matches_pytorch_at_other_shapes(tmp_path, method, opts):
    model = tiny()
    if method:
        attnprune.patch(model, method, **opts)
    path = export_onnx(model, tmp_path / "m.onnx")  # traced at 2 × 32, verified there
    sess = onnx_session(path, threads=1)
    # Other batch sizes and lengths than the trace, with and without padding; L = 10 and 20
    # make ρ·L an integer, where a float32 budget would keep one token too few.
    for B, L, pad in [(1, 10, False), (3, 20, True), (2, 7, True), (4, 64, True), (1, 2, False)]:
        x = inputs(B, L, pad, seed=L)
        got = run_onnx(sess, x)["logits"]
        with torch.no_grad():
            ref = model(**x).logits.numpy()
        assert got.shape == ref.shape
        np.testing.assert_allclose(got, ref, atol=1e-4, rtol=0)
    if method:
        # the graph really gathers: TopK (the selection) only exists in the pruned file
        import onnx

        assert "TopK" in {n.op_type for n in onnx.load(str(path)).graph.node}
        with torch.no_grad():  # the patch still prunes eagerly after the export
            model(**inputs(2, 20))
        assert attnprune.patch_state(model).stats["kept_ratio"] < 1


@pytest.mark.parametrize("method", ["ltp", "entropy_threshold", "dtr"])
def test_data_dependent_methods_are_refused(tmp_path, method):
    model = tiny()
    attnprune.patch(model, method, keep_ratio=0.5, after_layer=1)
    with pytest.raises(ValueError, match="cannot be exported"):
        export_onnx(model, tmp_path / "x.onnx")


def test_bad_arguments(tmp_path):
    model = tiny()
    attnprune.patch(model, "attention_mass", keep_ratio=0.5, after_layer=1, schedule="geometric")
    with pytest.raises(ValueError, match="example"):  # 4 → 2 → 1 → 1 traced at K = 1
        export_onnx(model, tmp_path / "x.onnx", example=inputs(2, 4, pad=False))
    with pytest.raises(ValueError, match="max_length"):
        export_onnx(model, tmp_path / "x.onnx", max_length=1)
    with pytest.raises(ValueError, match="example"):
        export_onnx(model, tmp_path / "x.onnx", example={"input_ids": torch.ones(3)})
