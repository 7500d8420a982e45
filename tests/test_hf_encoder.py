"""The hf_encoder host: parity at ρ = 1, real token removal, masks, gradients, FLOPs."""

from __future__ import annotations

import functools

import pytest
import torch
from test_encoder_families import JUST_BELOW_ONE, _keep_every_token  # tests/ is on sys.path
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    BertModel,
    DistilBertConfig,
    DistilBertForSequenceClassification,
    RobertaConfig,
    RobertaForSequenceClassification,
)

import attnprune
from attnprune.measure import count_flops
from attnprune.methods.base import Selection
from attnprune.selection import parse_schedule

TOKEN_METHODS = attnprune.list_methods("token")
KW = {"hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
      "intermediate_size": 64, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


def make(kind: str, attn: str = "sdpa"):
    torch.manual_seed(0)
    if kind == "bert":
        m = BertForSequenceClassification(BertConfig(vocab_size=100, num_labels=3, **KW))
    elif kind == "bert_model":
        m = BertModel(BertConfig(vocab_size=100, **KW))
    elif kind == "distilbert":
        m = DistilBertForSequenceClassification(DistilBertConfig(
            vocab_size=100, dim=32, n_layers=4, n_heads=4, hidden_dim=64, num_labels=3,
            dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0))
    else:
        m = RobertaForSequenceClassification(RobertaConfig(vocab_size=100, num_labels=3,
                                                           pad_token_id=1, **KW))
    m.set_attn_implementation(attn)
    return m.eval()


def batch(B=3, L=12):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 100, (B, L), generator=g)
    am = torch.ones(B, L, dtype=torch.long)
    if B > 1:
        am[1, 8:] = 0  # variable lengths: 12, 8, 4 real tokens
    if B > 2:
        am[2, 4:] = 0
    return ids, am


def out0(o):
    return o.logits if hasattr(o, "logits") else o.last_hidden_state


@pytest.mark.parametrize("kind", ["bert", "bert_model", "distilbert", "roberta"])
@pytest.mark.parametrize("method", TOKEN_METHODS)
@pytest.mark.parametrize("rho", [1.0, JUST_BELOW_ONE], ids=["off", "method-runs"])
def test_keep_ratio_one_reproduces_unpatched(kind, method, rho):
    """ρ = 1: pruning off (the host's own loop); ρ just below 1 (geometric: after every layer)
    the method runs at each layer and keeps every token (checked by a hook on it), so the
    gathers and scatters run with nothing dropped; both equal the unpatched model."""
    model = make(kind)
    ids, am = batch()
    calls: list[int] = []
    with torch.no_grad():
        ref = out0(model(input_ids=ids, attention_mask=am))
        attnprune.patch(model, method, keep_ratio=rho, after_layer=1, schedule="geometric")
        state = attnprune.patch_state(model)
        fixed = not getattr(state.modules, "variable_budget", False)
        state.modules.register_forward_hook(
            functools.partial(_keep_every_token, calls, fixed), with_kwargs=True)
        got = out0(model(input_ids=ids, attention_mask=am))
        attnprune.unpatch(model)
        back = out0(model(input_ids=ids, attention_mask=am))
    assert len(calls) == (0 if rho == 1.0 else 3), "the method ran where it should not, or not"
    assert got.shape == ref.shape
    if got.dim() == 3:  # per-token states: padding leaves at the first gather, keeping its
        got, ref_real = got[am.bool()], ref[am.bool()]  # last state; compare real tokens
    else:
        ref_real = ref
    assert torch.allclose(got, ref_real, atol=1e-5)
    assert torch.equal(back, ref)


@pytest.mark.parametrize("kind", ["bert", "distilbert", "roberta"])
@pytest.mark.parametrize("method", ["random", "attention_mass", "entropy", "ltp"])
def test_pruning_removes_tokens_and_respects_padding(kind, method):
    model = make(kind)
    ids, am = batch()
    opts = {"init_threshold": 1.0} if method == "ltp" else {}
    attnprune.patch(model, method, keep_ratio=0.5, after_layer=1, schedule="geometric", **opts)
    kept = {}
    sel_fn = attnprune.patch_state(model).modules.forward

    def spy(hidden, mask, **kw):
        sel = sel_fn(hidden, mask, **kw)
        kept[kw["layer"]] = (mask.clone(), sel.keep.clone(), hidden.shape)
        return sel

    attnprune.patch_state(model).modules.forward = spy
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=am).logits
    assert logits.shape == (3, 3) and torch.isfinite(logits).all()
    stats = attnprune.patch_state(model).stats
    assert stats["real_tokens"] == 24
    assert stats["kept_per_layer"][0] == 24  # layer 1 sees every real token
    assert all(a >= b for a, b in zip(stats["kept_per_layer"], stats["kept_per_layer"][1:]))
    for mask, keep, shape in kept.values():
        assert not (keep & ~mask).any()  # padding is never kept
        assert keep[:, 0].all()  # CLS always kept
    if method != "ltp":  # top-k: ⌊ρ n⌋ per example, so layer 2 sees 6 + 4 + 2 = 12 tokens
        assert stats["kept_per_layer"][1] == 12
        assert kept[1][2][1] == 6  # the tensor itself is shorter: K = max kept = 6
    assert stats["padded_per_layer"][-1] < stats["padded_per_layer"][0]


def test_batch_of_one_and_output_modes():
    model = make("bert_model")
    ids, am = batch(B=1, L=10)
    attnprune.patch(model, "attention_mass", keep_ratio=0.3, after_layer=2)
    with torch.no_grad():
        full_len = model(input_ids=ids, attention_mask=am).last_hidden_state
    assert full_len.shape == (1, 10, 32)  # scattered back to the stock shape
    attnprune.patch(model, "attention_mass", keep_ratio=0.3, after_layer=2, output="short")
    with torch.no_grad():
        short = model(input_ids=ids, attention_mask=am).last_hidden_state
    assert short.shape == (1, 3, 32)  # ⌊0.3·10⌋ = 3 tokens left after layer 2
    assert torch.allclose(short[:, 0], full_len[:, 0])  # CLS identical in both modes


def test_one_row_path_keeps_separators_as_a_batch_does():
    """Batch 1 without an attention mask takes the host's one-row path (index_select, no
    mask rebuilt); it keeps [CLS] and both [SEP] of a short pair (3 > ⌊0.3·7⌋ = 2) through
    every pruning layer and gives the logits of the same row in a padded batch."""
    model = make("bert")
    attnprune.patch(model, "attention_mass", keep_ratio=0.3, after_layer=1,
                    schedule="geometric")
    ids, am = batch(B=2, L=12)
    ids, am = ids[[1, 0]], am[[1, 0]]  # row 0: 8 real tokens, then padding
    tt = torch.zeros_like(ids)
    tt[0, 4:8] = 1  # [CLS] a a [SEP] | b b b [SEP]
    with torch.no_grad():
        both = model(input_ids=ids, attention_mask=am, token_type_ids=tt).logits
        alone = model(input_ids=ids[:1, :8], token_type_ids=tt[:1, :8]).logits
    kept = attnprune.patch_state(model).stats["kept_per_layer"]
    assert kept[1:] == [3.0, 3.0, 3.0]  # CLS, the segment end, the last token
    assert torch.allclose(alone, both[:1], atol=1e-5)


def test_scorer_attention_equals_eager_attention():
    """What the host hands the scorer equals HF's eager attention of that layer: the CLS row
    ("first"), or per head the mean over real queries of the rows ("received")."""
    model = make("bert", attn="eager")
    ids, am = batch()
    with torch.no_grad():
        eager = model(input_ids=ids, attention_mask=am, output_attentions=True).attentions[1]
    model.set_attn_implementation("sdpa")
    m = am.float()
    received = torch.einsum("bhij,bi->bhj", eager, m / m.sum(1, keepdim=True))[:, :, None]
    for variant, ref in (("mean", received), ("cls", eager[:, :, :1])):
        attnprune.patch(model, "attention_mass", keep_ratio=0.5, after_layer=2, variant=variant)
        state = attnprune.patch_state(model)
        seen = {}
        fwd = state.modules.forward

        def spy(hidden, mask, attn=None, seen=seen, fwd=fwd, **kw):
            seen["attn"] = attn
            return fwd(hidden, mask, attn=attn, **kw)

        state.modules.forward = spy
        with torch.no_grad():
            model(input_ids=ids, attention_mask=am)
        real = am.bool()[:, None, None, :]
        assert seen["attn"].shape == ref.shape
        assert torch.allclose(seen["attn"] * real, ref * real, atol=1e-5)


@pytest.mark.parametrize("method", ["attention_mass", "ltp"])
def test_received_rows_give_the_same_scores_as_full_attention(method):
    """Scoring from the host's reduced (B, H, 1, L) rows = scoring from the full matrix."""
    from attnprune.methods import registry
    torch.manual_seed(0)
    mod = registry.create(method, context={"n_layers": 4})
    am = torch.tensor([[1] * 6, [1] * 4 + [0] * 2]).bool()
    logits = torch.randn(2, 3, 6, 6).masked_fill(~am[:, None, None, :], -1e9)
    attn = logits.softmax(-1)
    w = am.float() / am.float().sum(1, keepdim=True)
    rows = torch.einsum("bhij,bi->bhj", attn, w)[:, :, None]
    h = torch.randn(2, 6, 8)
    a = mod(h, am, attn=attn, keep_ratio=0.5)
    b = mod(h, am, attn=rows, keep_ratio=0.5)
    assert torch.allclose(a.scores, b.scores, atol=1e-6)
    assert torch.equal(a.keep, b.keep)


@pytest.mark.parametrize("kind", ["bert", "bert_model"])
def test_gather_equals_masking_dropped_keys(kind):
    """The hard gathered path = the same layers with dropped tokens masked out as keys; with
    the stock output shape, kept positions hold their states (row 0 keeps all: K = L)."""
    model = make(kind)
    ids, am = batch()
    attnprune.patch(model, "random", keep_ratio=0.5, after_layer=1)
    state = attnprune.patch_state(model)
    keep = torch.zeros(3, 12, dtype=torch.bool)
    keep[0] = True
    keep[1, [0, 2, 4, 6]] = True
    keep[2, [0, 3]] = True

    class Fixed(torch.nn.Module):
        needs_attention = False

        def forward(self, hidden, mask, **kw):
            return Selection(keep=keep.clone(), soft=keep.float())

    state.modules = Fixed()
    with torch.no_grad():
        hard = out0(model(input_ids=ids, attention_mask=am))  # eval: gather
        model.train()  # no dropout in these configs: train differs only by the soft path
        soft = out0(model(input_ids=ids, attention_mask=am))  # log-mask bias on the keys
    if kind == "bert_model":
        hard, soft = hard[keep], soft[keep]  # (n kept, d): the positions that were computed
    assert torch.allclose(hard, soft, atol=1e-5)


@pytest.mark.parametrize("method", ["ltp", "entropy_gumbel"])
def test_gradients_reach_training_masks(method):
    model = make("bert").train()
    ids, am = batch()
    attnprune.patch(model, method, keep_ratio=0.5, after_layer=1, schedule="geometric")
    labels = torch.tensor([0, 1, 2])
    out = model(input_ids=ids, attention_mask=am, labels=labels)
    loss = out.loss + attnprune.aux_loss(model)
    loss.backward()
    state = attnprune.patch_state(model)
    grads = [p.grad for p in state.modules.parameters()]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)
    assert out.logits.shape == (3, 3)


def test_labels_reach_methods_in_training_only():
    model = make("bert")
    ids, am = batch()
    attnprune.patch(model, "entropy", keep_ratio=0.5, after_layer=1)
    labels = torch.tensor([0, 1, 2])
    model.train()
    model(input_ids=ids, attention_mask=am, labels=labels)
    assert attnprune.aux_loss(model) is not None  # the entropy head's CE needs the labels
    model.eval()
    with torch.no_grad():
        model(input_ids=ids, attention_mask=am, labels=labels)
    assert attnprune.aux_loss(model) is None


def test_flops_drop_when_pruning():
    model = make("bert_model")
    ids = torch.randint(5, 100, (4, 64))
    am = torch.ones_like(ids)
    full = count_flops(lambda: model(input_ids=ids, attention_mask=am))
    attnprune.patch(model, "attention_mass", keep_ratio=0.5, after_layer=1)
    with torch.no_grad():
        pruned = count_flops(lambda: model(input_ids=ids, attention_mask=am))
    attnprune.unpatch(model)
    # 1 of 4 layers at 64 tokens, 3 at 32: the layers' share drops to (1 + 3·0.5)/4 ≈ 0.63;
    # embeddings and the scorer keep the ratio a little higher.
    assert 0.55 < pruned / full < 0.75


def test_schedule_parser():
    assert parse_schedule(0.5, 4, after_layer=1) == (0.5, 0.5, 0.5, 0.5)
    assert parse_schedule(0.5, 4, after_layer=2) == (1.0, 0.5, 0.5, 0.5)
    assert parse_schedule(0.5, 4, 1, "geometric") == (0.5, 0.25, 0.125, 0.125)
    assert parse_schedule(None, 4, 1, [0.9, 0.6, 0.3]) == (0.9, 0.6, 0.3, 0.3)
    assert parse_schedule(None, 4, 1, "[0.9, 0.6, 0.3, 0.1]") == (0.9, 0.6, 0.3, 0.3)
    with pytest.raises(ValueError, match="after_layer"):
        parse_schedule(0.5, 4, after_layer=4)
    with pytest.raises(ValueError, match="schedule"):
        parse_schedule(None, 4, 1, [0.5, 0.9, 0.3])
    with pytest.raises(ValueError, match="schedule"):
        parse_schedule(0.5, 4, 1, "cosine")
    with pytest.raises(ValueError, match="keep_ratio"):
        parse_schedule(1.5, 4, 1)


def test_bad_options_fail_before_touching_the_model():
    model = make("bert")
    with pytest.raises(ValueError, match="after_layer"):
        attnprune.patch(model, "random", keep_ratio=0.5, after_layer=9)
    with pytest.raises(ValueError, match="unknown option"):
        attnprune.patch(model, "random", keep_ratio=0.5, bogus=1)
    assert attnprune.patch_state(model) is None
    assert "forward" not in model.bert.encoder.__dict__


def test_sampled_scorer_queries():
    """scorer_queries ≥ L is the exact path; S < L estimates from S query rows (same shapes,
    CLS still kept, close to the exact scores on a random model)."""
    model = make("bert")
    ids, am = batch()
    out = {}
    for S in (0, 64, 6):
        attnprune.patch(model, "attention_mass", keep_ratio=0.5, after_layer=1, scorer_queries=S)
        state = attnprune.patch_state(model)
        fwd = state.modules.forward

        def spy(hidden, mask, S=S, fwd=fwd, **kw):
            sel = fwd(hidden, mask, **kw)
            out[S] = sel
            return sel

        state.modules.forward = spy
        with torch.no_grad():
            model(input_ids=ids, attention_mask=am)
    assert torch.equal(out[0].scores, out[64].scores)
    assert out[6].keep[:, 0].all() and out[6].scores.shape == out[0].scores.shape
    real = am.bool()
    assert torch.corrcoef(torch.stack([out[6].scores[real], out[0].scores[real]]))[0, 1] > 0.5
    with pytest.raises(ValueError, match="scorer_queries"):
        attnprune.patch(model, "attention_mass", scorer_queries=-1)


@pytest.mark.parametrize("kind", ["bert", "distilbert", "roberta", "bert_model"])
def test_auto_output_skips_scatter_only_for_cls_heads(kind):
    """output="auto" (default) is "short" for the sequence classifiers (their heads read only
    position 0 and never return the encoder states) with logits identical to "scatter"; the
    bare encoder keeps the stock (B, L, d) shape."""
    model = make(kind)
    ids, am = batch()
    outs = {}
    for output in ("auto", "scatter", "short"):
        attnprune.patch(model, "attention_mass", keep_ratio=0.5, after_layer=2, output=output)
        with torch.no_grad():
            outs[output] = out0(model(input_ids=ids, attention_mask=am))
        outs[output + "_mode"] = attnprune.patch_state(model).output
    expect = "scatter" if kind == "bert_model" else "short"
    assert outs["auto_mode"] == expect
    assert torch.equal(outs["auto"], outs[expect])
    if kind != "bert_model":
        assert torch.equal(outs["scatter"], outs["short"])  # the head never sees the difference
    else:
        assert outs["auto"].shape == (*ids.shape, 32)
    with pytest.raises(ValueError, match="output"):
        attnprune.patch(model, "attention_mass", output="long")


def _raise_in_embeddings(model, ids):
    """A forward that fails after the model's entry: a hook raising in the embeddings."""
    def boom(*_):
        raise RuntimeError("embeddings failed")

    handle = model.bert.embeddings.register_forward_hook(boom)
    try:
        model(input_ids=ids)
    finally:
        handle.remove()


@pytest.mark.parametrize("failure", ["ids out of the vocabulary", "hook in the embeddings"])
def test_a_failed_forward_leaves_nothing_for_the_next(failure):
    """A forward that raises after the model's entry (its token ids already taken) must not
    hand them to the next call: a call through ``model.bert`` (no entry hook of its own)
    scored separators with the failed call's ids (kept [16, 16, 16, 16], another output,
    where a clean call keeps [16, 4, 4, 4])."""
    model = make("bert")
    attnprune.patch(model, "attention_mass", keep_ratio=0.25, after_layer=1,
                    protect_token_ids=[7])
    state = attnprune.patch_state(model)
    ids = torch.randint(10, 100, (1, 16), generator=torch.Generator().manual_seed(2))
    bad = torch.full((1, 16), 7)  # every token a protected id: a stale read keeps them all

    def clean():
        with torch.no_grad():
            out = model.bert(input_ids=ids).last_hidden_state
        return out, state.stats["kept_per_layer"]

    ref, kept = clean()
    assert kept == [16.0, 4.0, 4.0, 4.0]
    with pytest.raises((IndexError, RuntimeError)), torch.no_grad():
        if failure == "ids out of the vocabulary":
            bad[0, 5] = 1000
            model(input_ids=bad)
        else:
            _raise_in_embeddings(model, bad)
    out, kept_after = clean()
    assert kept_after == kept
    assert torch.equal(out, ref)
