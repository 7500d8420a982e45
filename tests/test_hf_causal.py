"""The causal host on tiny random GPT-2s: parity, real skipping, no leakage, KV cache, grads."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel

import attnprune
from attnprune.hosts.hf_causal import causal_methods
from attnprune.measure import count_flops
from attnprune.research.lm import generate

METHODS = causal_methods()  # the registry's causal token methods (ltp_causal, dtr, hybrid)


def tiny(n_layer: int = 4, seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=40, n_positions=48, n_embd=32, n_layer=n_layer, n_head=4,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg).eval()


def force_pruning(model, seed: int = 1) -> None:
    """Random, decisive scorers so that about half the tokens are dropped at each decision
    (any patched causal LM: GPT-2 here, the Llama family in test_hf_llama)."""
    g = torch.Generator().manual_seed(seed)
    m = model.base_model.attnprune_method
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("w") and p.dim() == 2:  # LTP scorer
                p.copy_(torch.randn(p.shape, generator=g) * 2.0)
            if name.endswith("w2.weight"):  # DTR policy output
                p.copy_(torch.randn(p.shape, generator=g) * 3.0)
            if name.endswith("w2.bias"):
                p.zero_()
    # Centre each DTR policy on its median logit so that it keeps about half the tokens.
    policies = [mod for mod in m.modules() if type(mod).__name__ == "Policy"]
    state = attnprune.patch_state(model)
    enabled, state.enabled = state.enabled, True
    for pol in policies:
        logits = []
        hook = pol.w2.register_forward_hook(lambda mod, a, out, acc=logits: acc.append(out.detach()))
        was = m.training
        m.eval()
        with torch.no_grad():
            model(torch.randint(0, model.config.vocab_size, (4, 32), generator=g))
        m.train(was)
        hook.remove()
        with torch.no_grad():
            pol.w2.bias.fill_(-float(torch.cat([z.flatten() for z in logits]).median()))
    state.enabled = enabled


def patched(method: str, n_layer: int = 4, **kw):
    model = tiny(n_layer)
    attnprune.patch(model, method, **kw)
    force_pruning(model)
    return model



# -- checks shared with test_hf_llama (any patched causal LM, V = its vocabulary) -------------
def check_dropped_tokens_skip_later_blocks(model, blocks) -> None:
    V = model.config.vocab_size
    x = torch.randint(0, V, (2, 32))
    seen = {}
    hooks = [b.register_forward_pre_hook(lambda mod, a, i=i: seen.__setitem__(i, a[0].shape[1]))
             for i, b in enumerate(blocks)]
    pruned = count_flops(lambda: model(x))
    kept = attnprune.patch_state(model).stats["kept_per_layer"]
    for h in hooks:
        h.remove()
    assert seen[0] == 32 and min(seen.values()) < 32  # shorter tensors reach later blocks
    assert kept[0] == 1.0 and min(kept) < 0.9
    attnprune.patch_state(model).enabled = False
    full = count_flops(lambda: model(x))
    assert pruned < 0.95 * full


def check_no_leakage_from_the_future(model) -> None:
    V = model.config.vocab_size
    x = torch.randint(0, V, (3, 30))
    for t in (5, 17, 28):
        a = model(x).logits
        y = x.clone()
        y[:, t + 1] = (y[:, t + 1] + 7) % V
        b = model(y).logits
        assert (a[:, : t + 1] - b[:, : t + 1]).abs().max() < 1e-5, f"leak at t={t}"
        assert (a[:, t + 1 :] - b[:, t + 1 :]).abs().max() > 0  # the change is visible later


def check_kv_cache_matches_full_recompute(model, n_layers: int = 4) -> None:
    x = torch.randint(0, model.config.vocab_size, (3, 26))
    full = model(x).logits
    assert min(attnprune.patch_state(model).stats["kept_per_layer"]) < 1.0
    cache = DynamicCache(config=model.config)
    parts = [model(x[:, :10], past_key_values=cache, use_cache=True).logits]
    for t in range(10, 26):
        parts.append(model(x[:, t : t + 1], past_key_values=cache, use_cache=True).logits)
    assert (torch.cat(parts, 1) - full).abs().max() < 1e-4
    lengths = [cache.get_seq_length(l) for l in range(n_layers)]
    assert lengths[0] == 26 and min(lengths) < 26  # pruned blocks cached fewer keys


def check_gradients_reach_thresholds(model) -> None:
    model.train()
    x = torch.randint(0, model.config.vocab_size, (2, 20))
    out = model(x, labels=x)
    aux = attnprune.aux_loss(model)
    assert aux is not None
    (out.loss + aux).backward()
    m = model.base_model.attnprune_method
    assert m.tau.grad is not None and m.tau.grad.abs().sum() > 0
    assert m.w.grad.abs().sum() > 0


def check_gradients_reach_the_policy(model, method: str) -> None:
    model.train()
    x = torch.randint(0, model.config.vocab_size, (4, 20))
    out = model(x, labels=x)
    aux = attnprune.aux_loss(model)
    assert aux is not None and torch.isfinite(aux)
    (out.loss + aux).backward()
    m = model.base_model.attnprune_method
    dtr = m.dtr if method == "hybrid" else m
    grads = [p.grad for p in dtr.parameters()]
    assert all(g is not None for g in grads) and sum(g.abs().sum() for g in grads) > 0


def check_padding_mask_matches_unpadded_rows(model) -> None:
    x = torch.randint(0, model.config.vocab_size, (2, 20))
    mask = torch.ones(2, 20, dtype=torch.long)
    mask[1, 15:] = 0  # right padding of row 1
    a = model(x, attention_mask=mask).logits
    b = model(x[1:, :15]).logits
    assert (a[1, :15] - b[0]).abs().max() < 1e-5


@pytest.mark.parametrize("method", METHODS)
def test_pruning_off_equals_stock(method):
    model = tiny()
    x = torch.randint(0, 40, (2, 24))
    ref = model(x).logits
    attnprune.patch(model, method, keep_ratio=1.0)
    force_pruning(model)  # decisive scorers, but pruning is off
    assert (model(x).logits - ref).abs().max() < 1e-5
    attnprune.unpatch(model)
    assert type(model.transformer).__name__ == "GPT2Model"
    assert "attnprune_method" not in dict(model.named_modules())
    assert (model(x).logits - ref).abs().max() == 0


def test_keeping_every_token_equals_stock():
    model = tiny()
    x = torch.randint(0, 40, (2, 24))
    ref = model(x).logits
    attnprune.patch(model, "ltp")  # fresh LTP keeps everything (I starts above τ)
    out = model(x).logits
    assert attnprune.patch_state(model).stats["kept_per_layer"] == [1.0] * 4
    assert (out - ref).abs().max() < 1e-5


@pytest.mark.parametrize("method", METHODS)
def test_dropped_tokens_skip_later_layers(method):
    model = patched(method)
    check_dropped_tokens_skip_later_blocks(model, model.transformer.h)


# DTR samples its actions in training (a stochastic policy); in hybrid stage 2 it is frozen.
@pytest.mark.parametrize("method,training", [(m, False) for m in METHODS]
                         + [("ltp_causal", True), ("hybrid", True)])
def test_no_leakage_from_the_future(method, training):
    model = patched(method)
    model.train(training)
    check_no_leakage_from_the_future(model)


@pytest.mark.parametrize("method", METHODS)
def test_kv_cache_matches_full_recompute(method):
    check_kv_cache_matches_full_recompute(patched(method))


@pytest.mark.parametrize("method", METHODS)
def test_generation_same_with_and_without_cache(method):
    model = patched(method)
    prompt = torch.randint(0, 40, (1, 8))
    a = generate(model, prompt, 44, temperature=0.0, use_cache=True)  # slides past n_positions=48
    b = generate(model, prompt, 44, temperature=0.0, use_cache=False)
    assert torch.equal(a, b)


def test_gradients_reach_thresholds():
    check_gradients_reach_thresholds(patched("ltp"))


@pytest.mark.parametrize("method", ["dtr", "hybrid"])
def test_gradients_reach_the_policy(method):
    check_gradients_reach_the_policy(patched(method, **({"stage": 1} if method == "hybrid" else {})), method)


def test_non_causal_methods_are_refused():
    with pytest.raises(ValueError, match="not causal"):
        attnprune.patch(tiny(), "attention_mass", keep_ratio=0.5)


@pytest.mark.parametrize("bad", [{"layers": [0]}, {"layers": [4]}, {"keep_ratio": 1.5},
                                 {"temperature": 0}, {"nonsense": 1}])
def test_bad_options_name_the_field(bad):
    key = next(iter(bad))
    with pytest.raises(ValueError, match=key):
        attnprune.patch(tiny(), "ltp", **bad)


def test_padding_mask_matches_unpadded_rows():
    check_padding_mask_matches_unpadded_rows(patched("ltp"))


def test_reinforce_raises_the_log_prob_of_better_samples():
    from attnprune.methods.dtr import DTR

    dtr = DTR(d_model=8, n_layers=4, sparsity_weight=0.5, samples=2).train()
    logp = torch.zeros(2, 3, requires_grad=True)  # two samples of one sequence, 3 positions
    keep = torch.ones(2, 3, dtype=torch.bool)
    actions = [{"log_prob": logp, "keep": keep, "alive": keep, "layer": 1,
                "index": torch.arange(3).expand(2, 3)}]
    dtr.reinforce_loss(actions, torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]])).backward()
    assert (logp.grad[0] < 0).all() and (logp.grad[1] > 0).all()  # lower loss: raised
    logp.grad = None
    fewer = [{**actions[0], "keep": torch.tensor([[False, True, True], [True, True, True]])}]
    dtr.reinforce_loss(fewer, torch.ones(2, 3)).backward()
    assert logp.grad[0, 0] < 0 < logp.grad[1, 0]  # same loss: dropping token 0 is rewarded
    assert logp.grad[0, 2] == 0 == logp.grad[1, 2]  # ...and credited to positions ≤ 0 only


def test_pure_soft_mask_also_passes_gradients():
    model = tiny()
    attnprune.patch(model, "ltp", straight_through=False)
    force_pruning(model)
    model.train()
    x = torch.randint(0, 40, (2, 20))
    out = model(x, labels=x)
    (out.loss + attnprune.aux_loss(model)).backward()
    assert model.transformer.attnprune_method.tau.grad.abs().sum() > 0


def test_ltp_per_layer_budgets():
    """keep_ratios sets each decision layer's budget ρ_l in the sparsity penalty; the host's
    ρ = 1 still switches pruning off; bad budgets are refused naming the option."""
    from attnprune.methods.ltp_causal import LTPCausal

    h, mask = torch.randn(2, 10, 8), torch.ones(2, 10, dtype=torch.bool)
    per = LTPCausal(d_model=8, n_layers=4, layers=[2, 3], keep_ratios=[0.9, 0.1]).train()
    one = LTPCausal(d_model=8, n_layers=4, layers=[2, 3]).train()
    for layer, rho in ((2, 0.9), (3, 0.1)):
        got = per(h, mask, keep_ratio=0.5, layer=layer).aux_loss
        want = one(h, mask, keep_ratio=rho, layer=layer).aux_loss
        assert float(got) == pytest.approx(float(want))
    # every token starts kept (m̃ ≈ 0.95): the strict late budget is the larger penalty
    assert float(per(h, mask, layer=2).aux_loss) < float(per(h, mask, layer=3).aux_loss)
    assert per(h, mask, keep_ratio=1.0, layer=3).aux_loss is None
    for bad in ([0.5], [0.5, 0.0], [0.5, 1.5], 0.5):
        with pytest.raises(ValueError, match="keep_ratios"):
            LTPCausal(d_model=8, n_layers=4, layers=[2, 3], keep_ratios=bad)
