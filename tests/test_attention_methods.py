"""Attention-level (crisp, intensity) and loss (cost) methods on tiny local HF models."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    DistilBertConfig,
    DistilBertForSequenceClassification,
    GPT2Config,
    GPT2LMHeadModel,
)

import attnprune
from attnprune.attention import allowed_keys, row_entropy_bits, topk_row_mask
from attnprune.hosts.hf_attention import attention_modules, ffn_modules
from attnprune.methods import registry
from attnprune.methods.crisp import parse_sparsity

V, T = 100, 12


def tiny(family: str):
    """A 2-layer, 32-wide, 4-head model of ``family`` with random weights, in eval mode."""
    if family == "bert":
        cfg = BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, max_position_embeddings=64)
        return BertForSequenceClassification(cfg).eval()
    if family == "distilbert":
        cfg = DistilBertConfig(vocab_size=V, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                               max_position_embeddings=64)
        return DistilBertForSequenceClassification(cfg).eval()
    cfg = GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                     bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg).eval()


def batch():
    ids = torch.randint(0, V, (3, T))
    mask = torch.ones(3, T, dtype=torch.long)
    mask[1, 8:] = 0
    mask[2, 5:] = 0
    return ids, mask


def sharpen(model, factor: float = 8.0) -> None:
    """Scale the query weights so random-init scores are far from flat (methods then matter)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("query.weight", "q_lin.weight", "c_attn.weight")):
                p.mul_(factor)


def logits(model, ids, mask):
    """Last hidden states at real tokens, and the logits: classification heads of random
    tiny models are nearly flat, so the hidden states show differences the logits hide."""
    out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    real = mask.bool()  # padded positions carry no meaning
    lg = out.logits[real] if out.logits.dim() == 3 else out.logits
    return torch.cat([out.hidden_states[-1][real].flatten(), lg.flatten()])


FAMILIES = ["bert", "distilbert", "gpt2"]
NEUTRAL = [*((m, registry.get(m).cls.neutral_options)
             for m in registry.list_methods("attention") + registry.list_methods("loss")),
           ("crisp", {"sparsity": 0.0, "schedule": "adaptive"})]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("method,opts", NEUTRAL)
def test_neutral_setting_reproduces_stock(family, method, opts):
    model = tiny(family)
    sharpen(model)
    ids, mask = batch()
    ref = logits(model, ids, mask)
    attnprune.patch(model, method, **opts)
    assert model.config._attn_implementation.startswith("attnprune_")
    out = logits(model, ids, mask)
    assert (out - ref).abs().max().item() <= 1e-5
    attnprune.unpatch(model)
    assert model.config._attn_implementation == "sdpa"
    assert not hasattr(model, "attnprune_method")
    assert torch.equal(logits(model, ids, mask), ref)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("preset", ["basic", "conservative", "position", "multihead"])
def test_intensity_sdpa_equals_eager_reference(family, preset):
    model = tiny(family)
    sharpen(model)
    ids, mask = batch()
    attnprune.patch(model, "intensity", preset=preset)
    weights = {k: v.clone() for k, v in model.attnprune_method.state_dict().items()}
    with torch.no_grad():  # give the predictor non-trivial outputs
        for p in model.attnprune_method.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    fused = logits(model, ids, mask)
    state = {k: v.clone() for k, v in model.attnprune_method.state_dict().items()}
    attnprune.patch(model, "intensity", preset=preset, path="eager")
    model.attnprune_method.load_state_dict(state)
    eager = logits(model, ids, mask)
    assert (fused - eager).abs().max().item() <= 1e-5
    # the modulation really acts (not a silent no-op)
    attnprune.unpatch(model)
    assert (fused - logits(model, ids, mask)).abs().max().item() > 1e-4
    assert weights  # predictor exists for non-fixed presets


def test_intensity_range_and_presets():
    model = tiny("gpt2")
    attnprune.patch(model, "intensity", preset="basic")
    m = model.attnprune_method
    assert m.predictors[0].pos is None and m.predictors[0].head.out_features == 1
    x = torch.randn(2, T, 32) * 10
    i = m.intensity(x, 0, T, T, 2, x.device)
    assert i.min() >= 0.1 and i.max() <= 1.0
    attnprune.patch(model, "intensity")  # multihead: eq. 2-7
    p = model.attnprune_method.predictors[1]
    assert p.pos is not None and p.head.out_features == 4 and p.fc1.out_features == 8
    with pytest.raises(ValueError, match="preset"):
        attnprune.patch(model, "intensity", preset="nope")
    with pytest.raises(ValueError, match="lo, hi"):
        attnprune.patch(model, "intensity", lo=0.9, hi=0.5)


def test_intensity_predictor_trains():
    model = tiny("bert").train()
    ids, mask = batch()
    attnprune.patch(model, "intensity")
    names = [n for n, _ in model.named_parameters()]
    assert any(n.startswith("attnprune_method.predictors.0") for n in names)
    loss = model(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 1, 0])).loss
    loss.backward()
    g = model.attnprune_method.predictors[0].fc1.weight.grad
    assert g is not None and g.abs().sum() > 0


def _capture_probs(model, ids, mask):
    """Attention probabilities per layer from the patched model (need_weights)."""
    state = attnprune.patch_state(model)
    state.need_weights = True
    out = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    state.need_weights = False
    return out.attentions


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_crisp_keeps_top_share_and_respects_masks(family):
    model = tiny(family)
    sharpen(model)
    ids, mask = batch()
    s = 0.6
    attnprune.patch(model, "crisp", sparsity=s)
    probs = _capture_probs(model, ids, mask)
    assert len(probs) == 2
    for p in probs:  # (B, H, T, T)
        for b in range(3):
            n_real = int(mask[b].sum())
            assert p[b, :, :, n_real:].abs().sum() == 0  # padding keys never attended
            for q in range(n_real):
                n = q + 1 if family == "gpt2" else n_real
                kept = (p[b, :, q, :] > 0).sum(-1)
                assert torch.all(kept == max(1, math.ceil((1 - s) * n)))  # no ties in floats
                if family == "gpt2":
                    assert p[b, :, q, q + 1:].abs().sum() == 0  # causal triangle kept


def test_topk_gradient_flows_only_through_kept_entries():
    scores = torch.randn(2, 3, 5, 7, requires_grad=True)
    keep = topk_row_mask(scores, 0.5)
    probs = torch.softmax(scores.masked_fill(~keep, float("-inf")), -1)
    (probs * torch.randn_like(probs)).sum().backward()
    assert torch.all(scores.grad[~keep] == 0)
    assert scores.grad[keep].abs().sum() > 0
    assert torch.all(keep.sum(-1) == 4)  # ⌈0.5·7⌉


def test_allowed_keys_rebuilds_causal_triangle_and_reads_float_masks():
    tri = allowed_keys(None, True, 3, 5, torch.device("cpu"))[0, 0]
    assert tri.tolist() == [[True] * 3 + [False] * 2, [True] * 4 + [False], [True] * 5]
    assert allowed_keys(None, False, 3, 5, torch.device("cpu")) is None
    add = torch.tensor([0.0, torch.finfo(torch.float32).min])[None, None, None]
    assert allowed_keys(add, False, 1, 2, torch.device("cpu")).tolist() == [[[[True, False]]]]


def test_crisp_decoding_with_cache_matches_full_recompute():
    model = tiny("gpt2")
    sharpen(model)
    attnprune.patch(model, "crisp", sparsity=0.5)
    ids = torch.randint(0, V, (2, 9))
    full = model(input_ids=ids).logits[:, -1]
    pre = model(input_ids=ids[:, :-1], use_cache=True)
    step = model(input_ids=ids[:, -1:], past_key_values=pre.past_key_values).logits[:, -1]
    assert (full - step).abs().max().item() <= 1e-5


def test_crisp_schedules_and_errors():
    assert parse_sparsity(0.4, 3) == [0.4, 0.4, 0.4]
    assert parse_sparsity([0.1, 0.2], 2) == [0.1, 0.2]
    with pytest.raises(ValueError, match="sparsity"):
        parse_sparsity([0.1], 2)
    with pytest.raises(ValueError, match="sparsity"):
        parse_sparsity(1.0, 2)
    model = tiny("distilbert")
    with pytest.raises(ValueError, match="schedule"):
        attnprune.patch(model, "crisp", schedule="magic")
    with pytest.raises(ValueError, match="unknown option"):
        attnprune.patch(model, "crisp", sparsty=0.5)
    assert model.config._attn_implementation == "sdpa"  # nothing touched on bad input
    attnprune.patch(model, "crisp", sparsity=[0.0, 0.9])
    assert model.attnprune_method.layer_sparsity() == [0.0, 0.9]


def test_crisp_adaptive_allocates_by_entropy_and_keeps_mean():
    model = tiny("bert").train()
    sharpen(model)
    ids, mask = batch()
    attnprune.patch(model, "crisp", sparsity=0.6, schedule="adaptive", momentum=0.0)
    m = model.attnprune_method
    assert m.layer_sparsity() == pytest.approx([0.6, 0.6])  # starts uniform
    model(input_ids=ids, attention_mask=mask)
    s = m.layer_sparsity()
    assert sum(s) / 2 == pytest.approx(0.6, abs=1e-6)
    ema = m.entropy_ema.tolist()
    assert (s[0] > s[1]) == (ema[0] < ema[1])  # the peaked layer is pruned more
    before = m.entropy_ema.clone()
    model.eval()
    model(input_ids=ids, attention_mask=mask)
    assert torch.equal(before, m.entropy_ema)  # frozen in evaluation


def test_crisp_adaptive_state_is_initialised_when_a_meta_model_is_materialised():
    """Built on the meta device and patched there, then ``to_empty`` + ``init_weights`` (what
    low_cpu_mem_usage / init_empty_weights loading does): the entropy EMA starts where a fresh
    patch's does (it was uninitialised memory), and a checkpoint loaded afterwards still wins."""
    fresh = tiny("gpt2")
    attnprune.patch(fresh, "crisp", sparsity=0.5, schedule="adaptive")
    with torch.device("meta"):
        model = GPT2LMHeadModel(fresh.config)
    attnprune.patch(model, "crisp", sparsity=0.5, schedule="adaptive")
    assert model.attnprune_method.entropy_ema.is_meta
    model.to_empty(device="cpu")
    model.init_weights()
    assert torch.equal(model.attnprune_method.entropy_ema, fresh.attnprune_method.entropy_ema)
    assert model.attnprune_method.layer_sparsity() == fresh.attnprune_method.layer_sparsity()
    trained = fresh.state_dict()
    trained["attnprune_method.entropy_ema"] = torch.tensor([0.2, 0.7])
    model.load_state_dict(trained)
    assert model.attnprune_method.entropy_ema.tolist() == pytest.approx([0.2, 0.7])


def test_cost_penalty_terms_locations_and_gradient():
    model = tiny("bert").train()
    ids, mask = batch()
    attnprune.patch(model, "cost", lam=1e-3, alpha=1.0, beta=0.0, location="both")
    out = model(input_ids=ids, attention_mask=mask, output_attentions=False)
    aux = attnprune.aux_loss(model)
    # attention term by hand: entropy (bits) of every real query row, mean, summed over heads
    state = attnprune.patch_state(model)
    state.need_weights = True
    probs = model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    expect = 0.0
    for p in probs:
        h = row_entropy_bits(p)  # (B, H, T)
        w = mask.bool()[:, None, :].float()
        expect += ((h * w).sum((0, 2)) / w.sum((0, 2))).sum()
    assert aux.item() == pytest.approx(1e-3 * float(expect.detach()), rel=1e-5)
    (out.logits.sum() + aux).backward()
    assert model.bert.encoder.layer[0].attention.self.query.weight.grad.abs().sum() > 0

    attnprune.patch(model, "cost", lam=1e-3, location="ffn")
    model(input_ids=ids, attention_mask=mask)
    assert len(attnprune.patch_state(model).aux_losses) == 2  # one FFN term per layer
    pre = []
    hook = ffn_modules(model)[0].register_forward_hook(lambda m, i, o: pre.append(o))
    model(input_ids=ids, attention_mask=mask)
    hook.remove()
    l1 = torch.relu(pre[0]).sum(-1)[mask.bool()].mean()
    assert attnprune.patch_state(model).aux_losses[0].item() == pytest.approx(1e-3 * l1.item(),
                                                                              rel=1e-5)
    attnprune.patch(model, "cost", lam=1e-3, location="attention")
    model(input_ids=ids, attention_mask=mask)
    assert len(attnprune.patch_state(model).aux_losses) == 2  # one attention term per layer
    attnprune.patch(model, "cost", lam=0.0)
    model(input_ids=ids, attention_mask=mask)
    assert attnprune.aux_loss(model) is None
    with pytest.raises(ValueError, match="location"):
        attnprune.patch(model, "cost", location="everywhere")
    with pytest.raises(ValueError, match="lam"):
        attnprune.patch(model, "cost", lam=-1.0)


@pytest.mark.parametrize("family", FAMILIES)
def test_host_finds_layers_and_ffns(family):
    model = tiny(family)
    assert len(attention_modules(model)) == 2
    assert len(ffn_modules(model)) == 2
    attnprune.patch(model, "cost", lam=1e-4)
    model(input_ids=batch()[0])
    assert len(attnprune.patch_state(model).aux_losses) == 4  # 2 attention + 2 FFN terms
    assert attnprune.aux_loss(model).item() > 0
