"""Walk the registry: every token method gets the same checks for free (timm style).

Shapes and keep counts, padding never kept, no NaN on edge cases, determinism in eval,
gradients from the auxiliary loss, ρ = 1 keeps every real token.
"""

from fractions import Fraction

import pytest
import torch

import attnprune
from attnprune.methods import registry
from attnprune.methods.base import Selection, protect_first

TOKEN_METHODS = registry.list_methods("token")
CTX = {"d_model": 16, "n_classes": 3, "n_layers": 4, "n_heads": 2}


def _inputs(B=3, L=9, H=2, pad_last=True):
    torch.manual_seed(1)  # the inputs only: it also reseeds the global generator
    hidden = torch.randn(B, L, CTX["d_model"])
    mask = torch.ones(B, L, dtype=torch.bool)
    if pad_last:
        mask[-1, L // 2:] = False
    attn = torch.softmax(torch.randn(B, H, L, L), -1)
    return hidden, mask, attn


def _make(name):
    m = registry.create(name, context=dict(CTX))
    return m


def test_registry_has_the_papers_methods():
    names = attnprune.list_methods()
    for n in ("random", "attention_mass", "entropy", "entropy_threshold", "entropy_gumbel"):
        assert n in names


def test_unknown_method_and_option():
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        registry.get("nope")
    with pytest.raises(ValueError, match="unknown option"):
        registry.create("random", banana=1)


def floor_budget(n: int, rho: float) -> int:
    """k = ⌊ρ·n⌋ in exact arithmetic (ρ read as the decimal it is written as), at least 1."""
    return max(1, int(Fraction(str(rho)) * n))


# Rows of 100, 100 and 50 real tokens: in float64 0.29 · 100 = 28.999999999999996 and
# 0.57 · 100 = 56.99999999999999, where a bare floor keeps one token too few
@pytest.mark.parametrize("name", TOKEN_METHODS)
@pytest.mark.parametrize("rho", [1e-3, 0.29, 0.5, 0.57, 1.0])
def test_keep_counts_and_padding(name, rho):
    m = _make(name).eval()
    hidden, mask, attn = _inputs(L=100)
    sel = m(hidden, mask, attn=attn, keep_ratio=rho, protect=protect_first(mask))
    assert isinstance(sel, Selection)
    assert sel.keep.shape == mask.shape and sel.keep.dtype == torch.bool
    assert not (sel.keep & ~mask).any(), "padding kept"
    assert sel.keep[:, 0].all(), "protected first token dropped"
    n = sel.keep.sum(1)
    assert (n >= 1).all()
    if not getattr(m, "variable_budget", False):  # fixed budgets keep exactly ⌊ρ·n⌋
        want = [floor_budget(int(r), rho) for r in mask.sum(1)]
        assert n.tolist() == want, f"kept {n.tolist()}, ⌊ρ·n⌋ = {want}"
    if sel.scores is not None:
        assert torch.isfinite(sel.scores[mask]).all()


@pytest.mark.parametrize("name", TOKEN_METHODS)
def test_edge_cases_no_nan(name):
    m = _make(name).train()
    # L = 1; all-padding row; all-equal hidden states (tied scores)
    for hidden, mask in [
        (torch.randn(2, 1, 16), torch.ones(2, 1, dtype=torch.bool)),
        (torch.randn(2, 5, 16), torch.tensor([[1, 1, 1, 0, 0], [0, 0, 0, 0, 0]], dtype=torch.bool)),
        (torch.ones(2, 6, 16), torch.ones(2, 6, dtype=torch.bool)),
    ]:
        L = hidden.shape[1]
        attn = torch.full((2, 2, L, L), 1.0 / L)
        sel = m(hidden, mask, attn=attn, keep_ratio=0.5, labels=torch.tensor([0, 2]))
        assert not (sel.keep & ~mask).any()
        assert (sel.keep.sum(1) == 0).tolist() == (mask.sum(1) == 0).tolist()
        if sel.aux_loss is not None:
            assert torch.isfinite(sel.aux_loss)
        if sel.soft is not None:
            assert torch.isfinite(sel.soft).all()


# random is the control that draws from torch's global generator by design (same seed, same
# tokens: checked below); every other method must not draw in eval
DETERMINISTIC = [n for n in TOKEN_METHODS if n != "random"]


@pytest.mark.parametrize("name", DETERMINISTIC)
def test_deterministic_in_eval(name):
    """Two calls without reseeding in between: a method that samples in eval (Gumbel noise,
    a policy's draws, dropout) gives other tokens the second time."""
    m = _make(name).eval()
    hidden, mask, attn = _inputs()
    first = m(hidden, mask, attn=attn, keep_ratio=0.5)
    for _ in range(3):
        again = m(hidden, mask, attn=attn, keep_ratio=0.5)
        assert torch.equal(first.keep, again.keep)
        if first.scores is not None:
            assert torch.equal(first.scores, again.scores)


def test_random_draws_from_the_global_generator():
    m = _make("random").eval()
    hidden, mask, attn = _inputs(L=40)
    torch.manual_seed(5)
    a = m(hidden, mask, attn=attn, keep_ratio=0.5).keep
    b = m(hidden, mask, attn=attn, keep_ratio=0.5).keep
    torch.manual_seed(5)
    c = m(hidden, mask, attn=attn, keep_ratio=0.5).keep
    assert not torch.equal(a, b) and torch.equal(a, c)


@pytest.mark.parametrize("name", TOKEN_METHODS)
def test_aux_loss_reaches_parameters(name):
    m = _make(name).train()
    params = [p for p in m.parameters() if p.requires_grad]
    if not params:
        pytest.skip(f"{name} has no trainable parameters")
    hidden, mask, attn = _inputs()
    sel = m(hidden, mask, attn=attn, keep_ratio=0.5, labels=torch.tensor([0, 1, 2]))
    # A method learns through an aux loss, a soft mask, or (REINFORCE policies) the log-probability
    # of its sampled actions.
    info = sel.info or {}
    loss = sel.aux_loss
    if loss is None and sel.soft is not None:
        loss = sel.soft.sum()
    if loss is None and info.get("log_prob") is not None:
        loss = info["log_prob"].sum()
    assert loss is not None, f"{name} has parameters but no aux loss, soft mask or log-prob"
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in params)


def test_patching_a_non_transformers_model_does_not_import_transformers():
    """The hf_* hosts (≈3 s of transformers imports) load only for transformers models."""
    import subprocess
    import sys

    code = ("import sys, attnprune\n"
            "from attnprune.research.synthetic.host import TinyConfig, TinyEncoder\n"
            "attnprune.patch(TinyEncoder(TinyConfig(vocab=20, d_model=8)), 'entropy')\n"
            "print('transformers' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


def _ltp_inputs(B=4, H=2, L=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    attn = torch.randn(B, H, L, L, generator=g).mul(3).softmax(-1)
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[0, 15:] = False
    return torch.randn(B, L, 8, generator=g), mask, attn


@pytest.mark.parametrize("rho", [0.3, 0.5, 0.75])
def test_ltp_calibrates_theta_to_the_target_on_its_first_training_forward(rho):
    from attnprune.methods.ltp import LearnedTokenPruning

    hidden, mask, attn = _ltp_inputs()
    m = LearnedTokenPruning(n_layers=2).train()
    sel = m(hidden, mask, attn=attn, keep_ratio=rho, layer=1)
    kept = float(sel.keep[mask].float().mean())
    assert bool(m.calibrated[1]) and not bool(m.calibrated[0])
    assert abs(kept - rho) < 0.06, kept  # from init_threshold 0.5 it would not depend on ρ
    theta = m.theta[1].item()
    with torch.no_grad():
        m.theta[1] += 0.3  # a later forward must not recalibrate
    m(hidden, mask, attn=attn, keep_ratio=rho, layer=1)
    assert m.theta[1].item() == pytest.approx(theta + 0.3)


def test_ltp_without_calibration_keeps_init_threshold_and_old_checkpoints_load_calibrated():
    from attnprune.methods.ltp import LearnedTokenPruning

    hidden, mask, attn = _ltp_inputs()
    m = LearnedTokenPruning(n_layers=2, init_threshold=0.7, calibrate=False).train()
    m(hidden, mask, attn=attn, keep_ratio=0.3, layer=0)
    assert m.theta[0].item() == pytest.approx(0.7) and not bool(m.calibrated.any())
    old = {"theta": torch.tensor([1.5, 2.5])}  # saved before the flag existed
    fresh = LearnedTokenPruning(n_layers=2)
    fresh.load_state_dict(old)
    assert bool(fresh.calibrated.all())
    fresh.train()(hidden, mask, attn=attn, keep_ratio=0.3, layer=0)
    assert fresh.theta[0].item() == pytest.approx(1.5)  # learned θ kept


def test_protect_special_finds_the_special_ids():
    """The ids are found by comparison, not ``torch.isin`` (which torch.export lowers to
    aten.searchsorted, with no ONNX function: issue 23 item 12; the export itself is checked by
    test_onnx.py::test_a_model_trained_by_the_cli_exports)."""
    from attnprune.methods.base import protect_special

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 8, (4, 16), generator=g)
    mask = torch.ones(4, 16, dtype=torch.bool)
    mask[2, 10:] = False
    special = [2, 3]
    want = protect_first(mask) | (torch.isin(ids, torch.tensor(special)) & mask)
    want[torch.arange(4), mask.sum(1) - 1] = True  # the last real token of each row
    assert torch.equal(protect_special(mask, ids, special_ids=special), want)
