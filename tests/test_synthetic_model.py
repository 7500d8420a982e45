"""The tiny model (§4): NumPy/torch parity, gates' keep counts and edge cases, measured FLOPs."""

import math

import numpy as np
import pytest
import torch

from attnprune.measure import count_flops
from attnprune.research.synthetic.config import METHODS
from attnprune.research.synthetic.host import TinyConfig, TinyEncoder, numpy_forward, numpy_params
from attnprune.selection import budget

GATES = [m for m in METHODS if m != "full"]
TOPK = ("attention_mass", "random", "entropy", "entropy_gumbel")


def _model(method, keep_ratio=0.5, seed=0, vocab=50, d=16, **opts):
    torch.manual_seed(seed)
    return TinyEncoder(TinyConfig(vocab=vocab, d_model=d, method=method, keep_ratio=keep_ratio,
                                  method_options=opts))


def _batch(B=6, L=12, vocab=50, seed=1, pad=True):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (B, L), generator=g)
    mask = torch.ones(B, L, dtype=torch.bool)
    if pad:
        mask[1, 7:] = False  # a padded row
        mask[2, :] = False  # a row that is all padding
    return tokens, mask


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("residual", [True, False])
def test_numpy_parity(method, residual):
    torch.manual_seed(0)
    cfg = TinyConfig(vocab=50, d_model=16, method=method, keep_ratio=0.5, residual=residual,
                     method_options={"threshold": 0.99} if method == "entropy_threshold" else {})
    model = TinyEncoder(cfg).eval()
    tokens, mask = _batch()
    with torch.no_grad():
        out = model(tokens, mask)
    keep = out.keep.numpy() if method == "random" else None  # random draws: pass its choice
    ref, ref_keep = numpy_forward(numpy_params(model), cfg, tokens.numpy(), mask.numpy(), keep)
    real = mask.any(1).numpy()  # all-padding rows have no defined output to compare
    np.testing.assert_allclose(out.logits.double().numpy()[real], ref[real], atol=1e-5, rtol=0)
    assert np.array_equal(out.keep.numpy(), ref_keep)


def test_parity_with_idf_weights_and_trained_like_weights():
    torch.manual_seed(3)
    cfg = TinyConfig(vocab=50, d_model=16, method="entropy", keep_ratio=0.3)
    w = np.linspace(0.5, 1.5, 50).astype(np.float32)
    model = TinyEncoder(cfg, np.random.default_rng(0).normal(0, 0.25, (50, 16)), w).eval()
    for p in model.parameters():  # larger weights than init: sharper softmaxes
        p.data.mul_(3.0)
    tokens, mask = _batch(pad=False)
    with torch.no_grad():
        out = model(tokens, mask)
    ref, _ = numpy_forward(numpy_params(model), cfg, tokens.numpy(), mask.numpy())
    np.testing.assert_allclose(out.logits.double().numpy(), ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("method", GATES)
@pytest.mark.parametrize("keep_ratio", [1e-6, 0.3, 0.5, 1.0])
@pytest.mark.parametrize("training", [False, True])
def test_keep_count_and_finite(method, keep_ratio, training):
    model = _model(method, keep_ratio).train(training)
    tokens, mask = _batch()
    labels = torch.tensor([0, 1, 0, 1, 1, 0])
    out = model(tokens, mask, labels=labels if training else None)
    assert torch.isfinite(out.logits).all()
    kept, n_real = out.keep.sum(1), mask.sum(1)
    assert not (out.keep & ~mask).any()  # padding is never kept
    if method in TOPK:
        assert torch.equal(kept, budget(n_real, keep_ratio) * (n_real > 0))
    else:  # threshold: a variable count, at least one per non-empty row
        assert ((kept >= 1) | (n_real == 0)).all() and (kept <= n_real).all()
    if training:
        _, total = model.loss(out, labels)
        total.backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        assert grads and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("method", METHODS)
def test_length_one(method):
    model = _model(method, 0.5).eval()
    out = model(torch.tensor([[3], [4]]))
    assert out.keep.sum().item() == 2 and torch.isfinite(out.logits).all()


@pytest.mark.parametrize("method", ["attention_mass", "entropy", "entropy_gumbel"])
def test_all_scores_tied_keeps_first_positions(method):
    model = _model(method, 0.5).eval()
    for p in model.parameters():
        p.data.zero_()  # uniform attention, uniform head: every score is equal
    tokens, _ = _batch(pad=False)
    out = model(tokens)
    assert torch.isfinite(out.logits).all()
    expected = torch.zeros_like(out.keep)
    expected[:, :6] = True  # ties are broken by position: the first ⌊0.5·12⌋ tokens
    assert torch.equal(out.keep, expected)


def test_keep_ratio_one_equals_full():
    full = _model("full").eval()
    for method in ("entropy", "attention_mass", "random"):
        gated = _model(method, 1.0).eval()
        gated.load_state_dict(full.state_dict(), strict=False)
        tokens, mask = _batch()
        real = mask.any(1)
        torch.testing.assert_close(gated(tokens, mask).logits[real], full(tokens, mask).logits[real],
                                   atol=1e-6, rtol=0)


def test_pruned_tokens_leave_the_tensor_measured_flops():
    """Measured FLOPs outside the gate equal the hand count, with Attention-2 on k = ρL tokens
    only (the gate's own cost is whatever its scorer does, so it is taken from the counter)."""
    B, L, V, d, C = 4, 16, 50, 16, 2
    tokens = torch.randint(0, V, (B, L))

    def expected(k):
        table = 3 * 2 * V * d * d  # E·W_q, E·W_k, E·W_v (projected once per vocabulary row)
        layer1 = 2 * (2 * B * L * L * d)  # QKᵀ and AV
        layer2 = 3 * 2 * B * k * d * d + 2 * (2 * B * k * k * d)
        return table + layer1 + layer2 + 2 * B * d * C  # + classifier

    def measured(method, rho):
        with torch.no_grad():
            total, per = count_flops(_model(method, rho, vocab=V).eval(), tokens, by_module=True)
        return total - per.get("TinyEncoder.gate", 0), per

    assert measured("full", 1.0)[0] == expected(L)
    flops, per = measured("entropy", 0.5)
    assert flops == expected(L // 2) and per["TinyEncoder.gate"] == 2 * B * L * d * C  # head g
    assert measured("attention_mass", 0.25)[0] == expected(L // 4)
    assert measured("random", 0.25)[0] == expected(L // 4)


def test_bad_model_config():
    with pytest.raises(ValueError, match="keep_ratio"):
        TinyConfig(keep_ratio=0.0)
    with pytest.raises(ValueError, match="method"):
        TinyConfig(method="nope")
    with pytest.raises(ValueError, match="embeddings"):
        TinyEncoder(TinyConfig(vocab=10, d_model=4), np.zeros((9, 4)))
    assert math.isclose(TinyConfig().keep_ratio, 0.5)


def test_public_patch_api_on_the_tiny_model():
    import attnprune

    full = _model("full").eval()
    tokens, mask = _batch(pad=False)
    ref = full(tokens, mask).logits.detach().clone()
    attnprune.patch(full, "entropy", keep_ratio=1.0)  # ρ = 1 reproduces the unpatched model
    torch.testing.assert_close(full(tokens, mask).logits, ref, atol=1e-5, rtol=0)
    attnprune.patch(full, "entropy", keep_ratio=0.5)
    assert full(tokens, mask).keep.sum(1).tolist() == [6] * 6
    full.train()
    full(tokens, mask, labels=torch.zeros(6, dtype=torch.long))
    assert attnprune.aux_loss(full) is not None  # the entropy head's loss, for the training loop
    attnprune.unpatch(full)
    full.eval()
    assert full.gate is None and full.cfg.method == "full"
    torch.testing.assert_close(full(tokens, mask).logits, ref)
    with pytest.raises(ValueError, match="after_layer"):
        attnprune.patch(full, "entropy", after_layer=2)
    with pytest.raises(ValueError, match="keep_ratio"):
        attnprune.patch(full, "entropy", keep_ratio=0)
    assert full.gate is None  # a refused patch leaves the model alone


def _threshold_model(bucket_rows: bool) -> TinyEncoder:
    torch.manual_seed(3)
    cfg = TinyConfig(vocab=40, d_model=16, method="entropy_threshold",
                     method_options={"threshold": 0.95}, bucket_rows=bucket_rows)
    model = TinyEncoder(cfg).eval()
    with torch.no_grad():  # a head whose confidence depends on the token: counts differ by row
        model.gate.head.weight.normal_(0, 3.0)
    return model


def test_row_bucketing_keeps_outputs_and_cuts_flops(monkeypatch):
    from attnprune.research.synthetic import host

    # the old fixed cost: at d = 16 the measured model (group_overhead_slots) asks for ≈ 260
    # slots per thread, one group for this batch on two threads
    monkeypatch.setattr(host, "GROUP_OVERHEAD_TOKENS", 64)
    tokens = torch.randint(0, 40, (24, 32), generator=torch.Generator().manual_seed(0))
    mask = torch.arange(32)[None, :] < torch.linspace(4, 32, 24).long()[:, None]  # 4..32 real
    on, off = _threshold_model(True), _threshold_model(False)
    with torch.no_grad():
        a, b = on(tokens, mask), off(tokens, mask)
        counts = a.keep.sum(1)
        assert counts.max() - counts.min() >= 8  # the test needs rows of different lengths
        torch.testing.assert_close(a.logits, b.logits, atol=1e-5, rtol=1e-5)
        assert torch.equal(a.keep, b.keep)
        assert count_flops(on, tokens, mask) < count_flops(off, tokens, mask)


def test_row_bucketing_is_a_single_group_for_top_k_and_off_in_training():
    torch.manual_seed(0)
    tokens = torch.randint(0, 40, (8, 16))
    model = TinyEncoder(TinyConfig(vocab=40, d_model=16, method="entropy")).eval()
    with torch.no_grad():
        off = TinyEncoder(TinyConfig(vocab=40, d_model=16, method="entropy", bucket_rows=False))
        off.load_state_dict(model.state_dict())
        off.eval()
        assert torch.equal(model(tokens).logits, off(tokens).logits)  # equal counts: one group
    m = _threshold_model(True).train()
    out = m(tokens, labels=torch.zeros(8, dtype=torch.long))
    assert out.logits.requires_grad  # training keeps the one padded batch (no bucketing path)
