"""Dynamic int8 (``attnprune.quantize_int8``, and the plain torch.ao call) composed with
patched models: still pruned, quantized Linears called, outputs close to fp32."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import require_module  # tests/ is on sys.path
from torch import nn
from torch.ao.nn.quantized.dynamic import Linear as QLinear
from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel

import attnprune
from attnprune.deploy import quantize_int8

V, B, L = 100, 4, 16
TOKEN_METHODS = attnprune.list_methods("token")


def bert():
    # initializer_range 0.1, not HF's 0.02: at 0.02 the logits are ≈ 0.04 and pruning moves
    # them by 3e-4, under int8's own error, so no bound on the error tells a pruned int8 model
    # from an unpruned (or all-zero) one; at 0.1, |logits| ≈ 0.6–0.9, int8 error ≤ 0.04 and
    # pruning half the tokens moves them by 0.09–0.44.
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=V, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                     intermediate_size=128, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, num_labels=2, initializer_range=0.1)
    return BertForSequenceClassification(cfg).eval()


def int8_close(got, ref) -> None:
    """int8 logits within 10 % of the fp32 logits' largest magnitude (no absolute slack: zeros
    or a scrambled model are off by about that magnitude)."""
    scale = ref.abs().max()
    assert scale > 0.3, "the model's logits are too small to tell int8 errors from wrong outputs"
    assert torch.isfinite(got).all()
    assert (got - ref).abs().max() <= 0.1 * scale


def gpt2():
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=V, n_positions=48, n_embd=32, n_layer=3, n_head=4,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                     eos_token_id=0)
    return GPT2LMHeadModel(cfg).eval()


def inputs():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, V, (B, L), generator=g)
    am = torch.ones(B, L, dtype=torch.long)
    am[1, 10:] = 0
    return ids, am


def run(model):
    ids, am = inputs()
    torch.manual_seed(3)  # random draws the same tokens in every call (int8 or not)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=am).logits


def force_pruning(model) -> None:
    """Learned thresholds and policies keep every token at their init: θ = 1 (keep tokens
    receiving more than a uniform share of attention) and random policies make them prune."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in attnprune.patch_state(model).modules.named_parameters():
            p.copy_(torch.ones_like(p) if name.endswith("theta")
                    else torch.randn(p.shape, generator=g))


def count_quantized_calls(model, fn) -> tuple[int, int]:
    """(quantized Linear modules in ``model``, their calls during ``fn()``)."""
    mods = [m for m in model.modules() if isinstance(m, QLinear)]
    calls = []
    hooks = [m.register_forward_hook(lambda mod, a, o: calls.append(mod)) for m in mods]
    try:
        fn()
    finally:
        for h in hooks:
            h.remove()
    return len(mods), len(calls)


def kept_ratio(model) -> float:
    return attnprune.patch_state(model).stats["kept_ratio"]


@pytest.mark.parametrize("method", TOKEN_METHODS)
def test_int8_composes_with_every_token_method(method):
    model = attnprune.patch(bert(), method, keep_ratio=0.5, after_layer=1)
    if method in ("dtr", "hybrid", "ltp", "ltp_causal"):
        force_pruning(model)
    ref = run(model)
    fp32_kept = kept_ratio(model)
    q = quantize_int8(model)
    n_mods, n_calls = count_quantized_calls(q, lambda: run(q))
    got = run(q)
    assert torch.isfinite(got).all()
    # The method's own layers stay fp32; every other Linear is quantized and called.
    assert not any(isinstance(m, QLinear) for m in q.attnprune_method.modules())
    assert n_mods >= 3 * 6 and n_calls >= n_mods - 1  # the pooler may be the one not called
    assert fp32_kept < 1.0 and kept_ratio(q) < 1.0  # every method prunes, fp32 and int8
    int8_close(got, ref)
    # and the int8 model prunes as the fp32 one does: its logits are much nearer the fp32
    # pruned model's than the int8 unpruned model's (an int8 copy that lost the patch fails)
    err = (got - ref).abs().max()
    assert (got - run(quantize_int8(bert()))).abs().max() > 2 * err
    assert attnprune.patch_state(q) is not attnprune.patch_state(model)


def test_quantize_leaves_the_original_fp32_and_independent():
    model = attnprune.patch(bert(), "attention_mass", keep_ratio=0.5, after_layer=1)
    ref = run(model)
    q = quantize_int8(model)
    assert not any(isinstance(m, QLinear) for m in model.modules())
    assert all(p.dtype == torch.float32 for p in model.parameters())
    with torch.no_grad():
        for p in q.bert.encoder.parameters():
            p.zero_()  # only the fp32 parameters left in q: LayerNorms, embeddings stay apart
    run(q)
    assert torch.equal(run(model), ref)
    attnprune.unpatch(q)
    assert attnprune.patch_state(model) is not None
    assert torch.equal(run(model), ref)


def test_inplace_quantizes_the_model_itself():
    model = attnprune.patch(bert(), "attention_mass", keep_ratio=0.5, after_layer=1)
    q = quantize_int8(model, inplace=True)
    assert q is model
    n_mods, n_calls = count_quantized_calls(q, lambda: run(q))
    assert n_mods > 0 and n_calls > 0 and kept_ratio(q) < 1.0


def test_quantized_patched_gpt2_prunes_and_quantizes_its_blocks():
    model = gpt2()
    attnprune.patch(model, "ltp", keep_ratio=0.5)
    lt = model.transformer.attnprune_method
    with torch.no_grad():  # a decisive random scorer so that about half the tokens go
        lt.w.copy_(torch.randn(lt.w.shape, generator=torch.Generator().manual_seed(2)) * 2.0)
        lt.b.zero_()
        lt.tau.fill_(0.5)
    ref = run(model)
    q = quantize_int8(model)
    # Conv1D (c_attn, c_proj, c_fc) became Linear, then int8: 4 per block, and the LM head.
    n_mods, n_calls = count_quantized_calls(q, lambda: run(q))
    assert n_mods == 4 * 3 + 1 and n_calls >= n_mods
    got = run(q)
    assert torch.isfinite(got).all()
    assert (got - ref).abs().max() <= 0.1 * ref.abs().max() + 0.05
    kept = attnprune.patch_state(q).stats["kept_per_layer"]
    assert min(kept) < 1.0
    assert type(model.transformer.h[0].attn.c_attn).__name__ == "Conv1D"  # original untouched


def test_plain_quantize_dynamic_on_a_patched_model():
    """The call users make: a deep copy, pruned and quantized."""
    for build, opts in ((bert, {"keep_ratio": 0.5, "after_layer": 1}),):
        model = attnprune.patch(build(), "attention_mass", **opts)
        ref = run(model)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            q = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
        n_mods, n_calls = count_quantized_calls(q, lambda q=q: run(q))
        assert n_mods > 0 and n_calls >= n_mods - 1
        assert kept_ratio(q) < 1.0
        int8_close(run(q), ref)
        attnprune.unpatch(q)  # hooks moved to the quantized modules go too
        assert not any(m._forward_hooks for m in q.modules() if isinstance(m, QLinear))


def test_bad_arguments():
    with pytest.raises(ValueError, match="backend"):
        quantize_int8(bert(), backend="fp8")
    with pytest.raises(ValueError, match="no nn.Linear"):
        quantize_int8(nn.Sequential(nn.Conv2d(1, 1, 1), nn.ReLU()))


def test_no_deprecation_warning_escapes():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quantize_int8(bert())
    assert not [w for w in caught if issubclass(w.category, DeprecationWarning)]


def test_torchao_backend():
    from attnprune.compat import keeping_inductor_config

    # in the dev extras: under CI a missing torchao fails; torchao's first import sets inductor
    # options, which the library puts back (quantize_int8) and so does this import
    keeping_inductor_config(lambda: require_module("torchao"))
    model = attnprune.patch(bert(), "attention_mass", keep_ratio=0.5, after_layer=1)
    ref = run(model)
    q = quantize_int8(model, backend="torchao")
    got = run(q)
    assert kept_ratio(q) < 1.0
    int8_close(got, ref)
    w = q.bert.encoder.layer[0].attention.self.query.weight
    assert type(w.data) is not torch.Tensor  # a torchao int8 tensor subclass
    assert type(model.bert.encoder.layer[0].attention.self.query.weight.data) is torch.Tensor
