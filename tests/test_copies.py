"""A copy of a patched model (``copy.deepcopy``, which torch.ao quantization calls) is an
independent model: it runs its own layers, its own patch state, and unpatches alone."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    DebertaV2Config,
    DebertaV2ForSequenceClassification,
    DistilBertConfig,
    DistilBertForSequenceClassification,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MPNetConfig,
    MPNetForSequenceClassification,
    RobertaConfig,
    RobertaForSequenceClassification,
)

import attnprune
from attnprune.research.synthetic.host import TinyConfig, TinyEncoder

KW = {"hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4,
      "intermediate_size": 64, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
V, B, L = 100, 3, 12


def _ids():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, V, (B, L), generator=g)
    am = torch.ones(B, L, dtype=torch.long)
    am[1, 8:] = 0
    return ids, am


def _hf_out(model):
    ids, am = _ids()
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=am).logits


def _tiny_out(model):
    ids, am = _ids()
    with torch.no_grad():
        return model(ids, am.bool()).logits


def _encoder_kept(state):
    return state.stats["kept_ratio"]


def _causal_kept(state):
    return sum(state.stats["kept_per_layer"]) / len(state.stats["kept_per_layer"])


def _tiny_kept(state):
    _, am = _ids()
    return float(state.stats["kept"].sum()) / float(am.sum())


def _gpt2():
    cfg = GPT2Config(vocab_size=V, n_positions=48, n_embd=32, n_layer=3, n_head=4,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                     eos_token_id=0)
    m = GPT2LMHeadModel(cfg).eval()
    attnprune.patch(m, "ltp", keep_ratio=0.5)
    lt = m.transformer.attnprune_method
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():  # decisive random scorer, τ at the sigmoid's middle: about half kept
        lt.w.copy_(torch.randn(lt.w.shape, generator=g) * 2.0)
        lt.b.zero_()
        lt.tau.fill_(0.5)
    return m


def _encoder(cls, cfg_cls, **extra):
    def build():
        m = cls(cfg_cls(vocab_size=V, num_labels=2, **extra)).eval()
        return attnprune.patch(m, "attention_mass", keep_ratio=0.5, after_layer=1)
    return build


def _bert_attention():
    m = BertForSequenceClassification(BertConfig(vocab_size=V, num_labels=2, **KW)).eval()
    return attnprune.patch(m, "crisp", sparsity=0.8)


def _llama():
    from test_hf_causal import force_pruning  # tests/ is on sys.path

    torch.manual_seed(0)
    m = LlamaForCausalLM(LlamaConfig(
        vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=48,
        pad_token_id=0, bos_token_id=0, eos_token_id=0)).eval()
    attnprune.patch(m, "ltp", keep_ratio=0.5)
    force_pruning(m)
    return m


def _own_forward_attention(cls, cfg_cls, **extra):
    # MPNet and DeBERTa-v2: an adapter replaces each attention module's forward
    def build():
        torch.manual_seed(0)
        m = cls(cfg_cls(vocab_size=V, num_labels=2, initializer_range=0.2, **KW,
                        **extra)).eval()
        return attnprune.patch(m, "crisp", sparsity=0.8)
    return build


def _tiny():
    m = TinyEncoder(TinyConfig(vocab=V, d_model=16)).eval()
    return attnprune.patch(m, "attention_mass", keep_ratio=0.5)


# name → (build a patched model, its transformer layers, outputs, kept share of the last
# forward from the patch state, or None where the method drops no tokens)
CASES = {
    "bert": (_encoder(BertForSequenceClassification, BertConfig, **KW),
             lambda m: m.bert.encoder.layer, _hf_out, _encoder_kept),
    "distilbert": (_encoder(DistilBertForSequenceClassification, DistilBertConfig, dim=32,
                            n_layers=3, n_heads=4, hidden_dim=64, dropout=0.0,
                            attention_dropout=0.0),
                   lambda m: m.distilbert.transformer.layer, _hf_out, _encoder_kept),
    "roberta": (_encoder(RobertaForSequenceClassification, RobertaConfig, pad_token_id=1, **KW),
                lambda m: m.roberta.encoder.layer, _hf_out, _encoder_kept),
    "gpt2": (_gpt2, lambda m: m.transformer.h, _hf_out, _causal_kept),
    "bert_attention": (_bert_attention, lambda m: m.bert.encoder.layer, _hf_out, None),
    "tiny": (_tiny, lambda m: [m.attn1, m.attn2], _tiny_out, _tiny_kept),
    "llama": (_llama, lambda m: m.model.layers, _hf_out, _causal_kept),
    "mpnet_attention": (_own_forward_attention(MPNetForSequenceClassification, MPNetConfig),
                        lambda m: m.mpnet.encoder.layer, _hf_out, None),
    "deberta_attention": (_own_forward_attention(
        DebertaV2ForSequenceClassification, DebertaV2Config, relative_attention=True,
        pos_att_type=["p2c", "c2p"], position_buckets=8, max_relative_positions=16),
        lambda m: m.deberta.encoder.layer, _hf_out, None),
}


def _zero(layers) -> None:
    with torch.no_grad():
        for layer in layers:
            for p in layer.parameters():
                p.zero_()


@pytest.mark.parametrize("case", list(CASES))
def test_copy_runs_its_own_layers(case):
    build, layers, out, _ = CASES[case]
    model = build()
    ref = out(model)
    clone = copy.deepcopy(model)
    assert torch.allclose(out(clone), ref, atol=1e-6)
    _zero(layers(clone))
    assert not torch.allclose(out(clone), ref, atol=1e-4)  # the copy runs its zeroed layers
    assert torch.equal(out(model), ref)  # and the original's are untouched


@pytest.mark.parametrize("case", list(CASES))
def test_copy_has_its_own_patch_state(case):
    build, _, out, kept = CASES[case]
    model = build()
    clone = copy.deepcopy(model)
    mine, theirs = attnprune.patch_state(model), attnprune.patch_state(clone)
    assert theirs is not None and theirs is not mine
    mine.stats = {"sentinel": True}
    out(clone)
    assert mine.stats == {"sentinel": True}  # the copy's forward writes into its own state
    if kept is not None:
        assert kept(theirs) < 1.0  # the copy prunes
    unpatched = copy.deepcopy(model)
    attnprune.unpatch(unpatched)
    assert not torch.allclose(out(clone), out(unpatched), atol=1e-6)  # the method acts


@pytest.mark.parametrize("case", list(CASES))
def test_unpatching_a_copy_leaves_the_original_patched(case):
    build, _, out, kept = CASES[case]
    model = build()
    ref = out(model)
    stock = copy.deepcopy(model)
    attnprune.unpatch(stock)
    full = out(stock)
    clone = copy.deepcopy(model)
    attnprune.unpatch(clone)
    assert attnprune.patch_state(clone) is None
    assert torch.allclose(out(clone), full, atol=1e-6)
    assert attnprune.patch_state(model) is not None
    assert torch.equal(out(model), ref)
    if kept is not None:
        assert kept(attnprune.patch_state(model)) < 1.0


def _dynamic_linears(model) -> list[nn.Module]:
    from torch.ao.nn.quantized.dynamic import Linear as QLinear

    return [m for m in model.modules() if isinstance(m, QLinear)]


def _quantize_dynamic(model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's deprecation notices
        return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)


# Not "tiny": its reference attention reads the Linear weights directly (F.linear on W_Q/√d),
# which quantized modules do not have, patched or not. Not "gpt2": its blocks hold Conv1D,
# not nn.Linear (quantize_int8 converts them; see test_int8.py).
@pytest.mark.parametrize("case", ["bert", "distilbert", "roberta", "bert_attention"])
def test_deepcopy_of_a_quantized_patched_model_runs_its_quantized_linears(case):
    build, layers, out, kept = CASES[case]
    model = build()
    ref = out(model)
    q = _quantize_dynamic(model)
    clone = copy.deepcopy(q)
    mods = [m for m in _dynamic_linears(clone)
            if any(m is x for layer in layers(clone) for x in layer.modules())]
    assert mods
    theirs = _dynamic_linears(q)
    calls = {"clone": 0, "q": 0}

    def count(key):
        def hook(module, args, output):
            calls[key] += 1
        return hook

    hooks = [m.register_forward_hook(count("clone")) for m in mods]
    hooks += [m.register_forward_hook(count("q")) for m in theirs]
    got = out(clone)
    for h in hooks:
        h.remove()
    assert calls["clone"] >= len(mods) and calls["q"] == 0
    assert torch.isfinite(got).all()
    assert (got - ref).abs().max() < 0.1 * ref.abs().max() + 0.05  # int8 error, loose
    if kept is not None:
        assert kept(attnprune.patch_state(clone)) < 1.0
    assert torch.equal(out(model), ref)  # the fp32 original is unchanged
