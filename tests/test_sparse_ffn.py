"""Sparse FFN execution (attnprune/deploy/sparse_ffn.py): parity, exact skipping, counted FLOPs."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    DistilBertConfig,
    DistilBertForSequenceClassification,
    GPT2Config,
    GPT2LMHeadModel,
)

import attnprune
from attnprune.deploy import sparse_ffn
from attnprune.deploy.sparse_ffn import SparseFFNOutput, block_reference, block_sparse_linear
from attnprune.measure import count_flops

V = 100


def small_model(family: str, act: str = "gelu"):
    """2 layers, width 32, d_ff 64, random weights, eval mode, FFN activation ``act``."""
    if family == "bert":
        return BertForSequenceClassification(BertConfig(
            vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=64, hidden_act=act)).eval()
    if family == "distilbert":
        return DistilBertForSequenceClassification(DistilBertConfig(
            vocab_size=V, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
            max_position_embeddings=64, activation=act)).eval()
    return GPT2LMHeadModel(GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_inner=64,
                                      n_positions=64, activation_function=act)).eval()


def inputs(b: int = 3, t: int = 11) -> dict:
    ids = torch.randint(0, V, (b, t))
    mask = torch.ones(b, t, dtype=torch.long)
    mask[1, 7:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def dead_units(rows: int, d_ff: int, share: float) -> torch.Tensor:
    """Positive activations with the first ⌊share·d_ff⌋ units exactly 0 in every row."""
    a = torch.rand(rows, d_ff) + 0.1
    a[:, : int(share * d_ff)] = 0
    return a


@pytest.mark.parametrize("family", ["bert", "distilbert", "gpt2"])
def test_threshold_zero_without_zeros_is_the_dense_model(family):
    model = small_model(family)
    x = inputs()
    with torch.no_grad():
        ref = model(**x).logits
        sparse_ffn.apply(model, threshold=0.0, mode="magnitude", block=4)
        out = model(**x).logits
    assert len([m for m in model.modules() if isinstance(m, SparseFFNOutput)]) == 2
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    sparse_ffn.remove(model)
    assert not any(isinstance(m, SparseFFNOutput) for m in model.modules())


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_relu_ffn_is_exact_and_skips(family):
    """With a ReLU FFN the zeros are real: outputs equal dense, yet work is skipped."""
    model = small_model(family, act="relu")
    x = inputs(b=2, t=4)
    with torch.no_grad():
        ref = model(**x).logits
        sparse_ffn.apply(model, threshold=0.0, mode="relu", block=1, max_active=1.0,
                         count_zeros=True)
        out = model(**x).logits
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    st = sparse_ffn.stats(model)
    assert 0.2 < st["token_sparsity"] < 0.8  # random init: about half the units are off
    assert st["block_sparsity"] == pytest.approx(st["token_sparsity"])  # block 1 = per token


def test_skipped_units_are_never_multiplied():
    """Weights of units that are zero in every row of a block may be NaN: they are not read."""
    a = dead_units(10, 16, 0.5)
    w_t = torch.randn(16, 5)
    clean = a @ w_t
    w_t[:8] = float("nan")  # the dead units' rows of W2ᵀ
    y, used, zeros = block_sparse_linear(a, w_t, None, block=4, count_zeros=True)
    torch.testing.assert_close(y, clean)
    assert used == 10 * 8 and zeros == 10 * 8


def test_unit_alive_in_one_row_of_a_block_is_computed():
    a = dead_units(8, 6, 0.5)
    a[5, 1] = 2.0  # unit 1 alive in block 1 (rows 4–7) only
    w_t = torch.randn(6, 3)
    y, used, _ = block_sparse_linear(a, w_t, torch.zeros(3), block=4)
    torch.testing.assert_close(y, a @ w_t)
    assert used == 4 * 3 + 4 * 4


@pytest.mark.parametrize("mode,threshold", [("relu", 0.0), ("relu", 0.3), ("magnitude", 0.3)])
@pytest.mark.parametrize("block", [1, 3, 64])
def test_matches_the_block_reference(mode, threshold, block):
    a = torch.randn(7, 20)  # 7 rows: a ragged last block for block 3
    a[:, :6] = -0.01  # six units off everywhere (both modes at τ = 0.3; relu at τ = 0)
    lin = nn.Linear(20, 5)
    ref = lin(block_reference(a, block, threshold, mode)).detach()
    y, used, _ = block_sparse_linear(a, lin.weight.t().contiguous(), lin.bias, block, threshold,
                                     mode)
    torch.testing.assert_close(y, ref, atol=1e-6, rtol=0)
    assert used <= 7 * 14  # the six dead units were skipped in every block


def test_block_reference_keeps_values_of_active_units():
    a = torch.tensor([[-0.25, 0.5, -0.5], [-0.125, -0.25, -0.5]])
    # unit 0 off everywhere, unit 1 on in row 0 (its −0.25 in row 1 is kept), unit 2 off
    assert block_reference(a, 2, 0.0, "relu").tolist() == [[0.0, 0.5, 0.0], [0.0, -0.25, 0.0]]
    assert block_reference(a, 1, 0.0, "relu").tolist() == [[0.0, 0.5, 0.0], [0.0, 0.0, 0.0]]
    assert block_reference(a, 2, 0.375, "magnitude").tolist() == [[0.0, 0.5, -0.5],
                                                                  [0.0, -0.25, -0.5]]


def test_counted_flops_fall_with_sparsity():
    lin = nn.Linear(64, 16)
    wrap = SparseFFNOutput(lin, 0.0, "relu", block=8, max_active=1.0)
    dense = count_flops(lin, dead_units(32, 64, 0.0))
    ratios = []
    with torch.no_grad():
        for share in (0.0, 0.25, 0.5, 0.75, 0.9):
            ratios.append(count_flops(wrap, dead_units(32, 64, share)) / dense)
    assert ratios == pytest.approx([1.0, 0.75, 0.5, 0.25, 1 - int(0.9 * 64) / 64], abs=1e-9)


def test_max_active_falls_back_to_dense():
    lin = nn.Linear(64, 16)
    a = dead_units(16, 64, 0.25)  # 75 % active
    with torch.no_grad():
        dense = count_flops(lin, a)
        assert count_flops(SparseFFNOutput(lin, max_active=0.7), a) == dense
        assert count_flops(SparseFFNOutput(lin, max_active=0.8), a) == pytest.approx(0.75 * dense)
        torch.testing.assert_close(SparseFFNOutput(lin, max_active=0.7)(a), lin(a))


def test_model_flops_fall_and_stats_match():
    """A ReLU BERT whose FFN units are all dead: the second projections cost nothing."""
    model = small_model("bert", act="relu")
    x = inputs()
    with torch.no_grad():
        for layer in model.bert.encoder.layer:
            layer.intermediate.dense.bias.fill_(-1e4)  # z ≪ 0 everywhere
        full = count_flops(lambda: model(**x))
        sparse_ffn.apply(model, block=4, max_active=1.0)
        sparse = count_flops(lambda: model(**x))
    ffn2 = 2 * 2 * 33 * 64 * 32  # 2 layers × 2 FLOPs × B·T rows × d_ff × d
    assert full - sparse == ffn2
    assert sparse_ffn.stats(model)["block_sparsity"] == 1.0
    assert sparse_ffn.stats(model)["token_sparsity"] is None  # not counted unless asked


def test_training_runs_dense_with_gradients():
    model = small_model("bert").train()
    sparse_ffn.apply(model, threshold=0.1)
    out = model(**inputs()).logits
    out.sum().backward()
    w = model.bert.encoder.layer[0].output.dense.linear.weight
    assert w.grad is not None and w.grad.abs().sum() > 0


def test_weight_updates_after_apply_are_seen():
    lin = nn.Linear(8, 4)
    wrap = SparseFFNOutput(lin, max_active=1.0)
    a = dead_units(4, 8, 0.5)
    with torch.no_grad():
        wrap(a)
        lin.weight.mul_(2.0)  # in place: the cached W2ᵀ must be rebuilt
        torch.testing.assert_close(wrap(a), lin(a))


def test_composes_with_the_cost_patch():
    model = small_model("bert")
    x = inputs()
    attnprune.patch(model, "cost", lam=1e-3)
    sparse_ffn.apply(model, threshold=0.0, mode="magnitude")
    model.train()
    model(**x)
    assert attnprune.aux_loss(model) is not None


@pytest.mark.parametrize("kwargs,field", [({"mode": "topk"}, "mode"),
                                          ({"threshold": -1.0}, "threshold"),
                                          ({"block": 0}, "block"),
                                          ({"max_active": 1.5}, "max_active")])
def test_bad_options_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        sparse_ffn.apply(small_model("bert"), **kwargs)


def test_no_ffn_is_an_error():
    with pytest.raises(ValueError, match="no FFN"):
        sparse_ffn.apply(nn.Sequential(nn.Linear(4, 4)))


def test_bench_runs_and_reports_the_skip():
    from attnprune.bench import sparse_ffn as bench_sparse_ffn

    cfg = bench_sparse_ffn.BenchConfig(d_model=16, d_ff=64, rows=32, blocks=(8, 32),
                                       sparsities=(0.0, 0.5), patterns=("units", "tokens"), repeats=1)
    rows = bench_sparse_ffn.bench(cfg)
    assert len(rows) == 2 * 2 * 2
    units = {(r["block"], r["sparsity"]): r for r in rows if r["pattern"] == "units"}
    assert units[(8, 0.5)]["flops_ratio"] == pytest.approx(0.5)
    assert units[(8, 0.5)]["block_sparsity"] == pytest.approx(0.5)
    assert "| units | 8 |" in bench_sparse_ffn.format_bench(rows, cfg)


def test_bench_command_writes_results(tmp_path, capsys):
    from attnprune.cli import main

    rc = main(["bench", "sparse-ffn", "--d_model", "16", "--d_ff", "32", "--rows", "16",
               "--blocks", "[8]", "--sparsities", "[0.5]", "--patterns", "[units]",
               "--repeats", "1", "--out", str(tmp_path), "--exact-out"])
    assert rc == 0
    assert "| units | 8 | 0.50 | 0.500 | 0.500 |" in capsys.readouterr().out
    assert (tmp_path / "summary.json").is_file() and (tmp_path / "table.md").is_file()


def test_package_exposes_sparse_ffn():
    assert attnprune.deploy.sparse_ffn.apply is sparse_ffn.apply


@pytest.mark.parametrize("n,block", [(1, 4), (5, 4), (64, 64), (130, 64), (200, 4096), (70, 48),
                                     (129, 128)])
@pytest.mark.parametrize("mode", ["relu", "magnitude"])
def test_active_units_is_any_over_the_block(n, block, mode):
    from attnprune.deploy.sparse_ffn import active_units

    a = torch.randn(n, 9)
    on = (a > 0.5) if mode == "relu" else (a.abs() > 0.5)
    want = torch.stack([on[r:r + block].any(0) for r in range(0, n, block)])
    assert torch.equal(active_units(a, block, 0.5, mode), want)
