"""``attnprune.patch(..., stack=True)``: a token method and an attention / loss method on one
model (tiny BERT and GPT-2): both act, losses add up, unpatch restores the stock model."""

from __future__ import annotations

import copy

import pytest
import torch

import attnprune
from attnprune.hosts.stack import PatchStack


def bert(**kw):
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=64, initializer_range=0.2, **kw)
    return BertForSequenceClassification(cfg).eval()


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=50, n_embd=32, n_layer=4, n_head=4, n_positions=64,
                     initializer_range=0.2, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg).eval()


def batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 50, (4, 20), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0
    mask[3, 16:] = 0
    return {"input_ids": ids, "attention_mask": mask}


@torch.no_grad()
def logits(model, x):
    return model(**x).logits


@pytest.mark.parametrize("token", ["attention_mass", "ltp"])
def test_token_plus_crisp_on_bert_both_act_and_unpatch_restores(token):
    model, x = bert(), batch()
    stock = logits(model, x)
    attnprune.patch(model, token, keep_ratio=0.5, after_layer=1).eval()  # the method too
    if token == "ltp":
        with torch.no_grad():
            attnprune.patch_state(model).modules.theta.fill_(1.0)  # above-average attention only
    token_only = logits(model, x)
    attnprune.patch(model, "crisp", sparsity=0.8, stack=True).eval()
    both = logits(model, x)
    state = attnprune.patch_state(model)
    assert isinstance(state, PatchStack) and state.method == f"{token}+crisp"
    assert [s.kind for s in state.states] == ["token", "attention"]
    assert state.stats["kept_ratio"] < 1.0  # the token method still drops tokens
    assert (both - token_only).abs().max() > 1e-3  # and crisp still changes the attention
    # crisp alone differs from the stack too: the token method acts on top of crisp
    crisp_only = logits(attnprune.patch(copy.deepcopy(model), "crisp", sparsity=0.8), x)
    assert (both - crisp_only).abs().max() > 1e-3
    # both method modules live on the model, under their own names
    names = [n for n, _ in model.named_children() if n.startswith("attnprune_method")]
    assert names == ["attnprune_method", "attnprune_method_2"]
    attnprune.unpatch(model)
    assert attnprune.patch_state(model) is None
    assert not any(n.startswith("attnprune") for n, _ in model.named_children())
    assert model.config._attn_implementation == "sdpa"
    torch.testing.assert_close(logits(model, x), stock, rtol=0, atol=1e-6)


def test_ltp_plus_crisp_on_gpt2_both_act_and_unpatch_restores():
    model, x = gpt2(), batch()
    stock = logits(model, x)
    attnprune.patch(model, "ltp", keep_ratio=0.5)  # the causal host follows the model's mode
    with torch.no_grad():
        attnprune.patch_state(model).modules.w.normal_(generator=torch.Generator().manual_seed(0))
    token_only = logits(model, x)
    kept_token_only = attnprune.patch_state(model).stats["kept_per_layer"]
    attnprune.patch(model, "crisp", sparsity=0.7, stack=True)
    both = logits(model, x)
    kept = attnprune.patch_state(model).stats["kept_per_layer"]
    assert min(kept) < 1.0 and min(kept_token_only) < 1.0
    assert (both - token_only).abs().max() > 1e-3
    # a cached decode step runs through both patches too
    out = model(**x, use_cache=True)
    nxt = torch.randint(1, 50, (4, 1))
    mask = torch.cat([x["attention_mask"], torch.ones(4, 1, dtype=torch.long)], 1)
    step = model(input_ids=nxt, attention_mask=mask, past_key_values=out.past_key_values)
    assert torch.isfinite(step.logits).all()
    attnprune.unpatch(model)
    torch.testing.assert_close(logits(model, x), stock, rtol=0, atol=1e-6)


def test_aux_loss_sums_both_methods_and_both_train():
    model, x = bert(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0), batch()
    model.train()
    attnprune.patch(model, "ltp", keep_ratio=0.5, after_layer=1)
    attnprune.patch(model, "cost", lam=1e-2, stack=True)
    out = model(**x, labels=torch.tensor([0, 1, 0, 1]))
    state = attnprune.patch_state(model)
    token, loss = state.state("token"), state.state("loss")
    assert token.aux_loss() is not None and loss.aux_loss() is not None
    torch.testing.assert_close(attnprune.aux_loss(model), token.aux_loss() + loss.aux_loss())
    (out.loss + attnprune.aux_loss(model)).backward()
    assert token.modules.theta.grad.abs().sum() > 0  # LTP's soft gate still learns
    # in eval the layers after the gather see fewer tokens: the loss still reads the real ones
    model.eval()
    with torch.no_grad():
        model(**x)
    assert state.stats["kept_ratio"] < 1.0 and torch.isfinite(attnprune.aux_loss(model))


def test_crisp_sees_the_soft_token_mask_in_training():
    """LTP's training mask (log m̃ on the keys) reaches crisp's scores: ltp + crisp at
    sparsity 0 trains exactly like ltp alone (the relaxation is not lost in the stack)."""
    model, x = bert(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0), batch()
    model.train()
    alone = copy.deepcopy(model)
    attnprune.patch(alone, "ltp", keep_ratio=0.5, after_layer=1)
    attnprune.patch(model, "ltp", keep_ratio=0.5, after_layer=1)
    attnprune.patch(model, "crisp", sparsity=0.0, stack=True)
    torch.testing.assert_close(model(**x).logits, alone(**x).logits, rtol=0, atol=1e-5)


def test_stacking_refuses_same_kinds_and_leaves_the_model_as_it_was():
    model, x = bert(), batch()
    attnprune.patch(model, "attention_mass", keep_ratio=0.5)
    before = logits(model, x)
    with pytest.raises(ValueError, match="stack: .*token method 'attention_mass'"):
        attnprune.patch(model, "random", stack=True)
    attnprune.patch(model, "crisp", sparsity=0.5, stack=True)
    with pytest.raises(ValueError, match="stack: .*'cost' \\(loss\\)"):
        attnprune.patch(model, "cost", stack=True)
    with pytest.raises(ValueError, match="stack must be True or False"):
        attnprune.patch(model, "crisp", stack="yes")
    assert attnprune.patch_state(model).method == "attention_mass+crisp"
    # a plain patch replaces the whole stack
    attnprune.patch(model, "attention_mass", keep_ratio=0.5)
    assert not isinstance(attnprune.patch_state(model), PatchStack)
    torch.testing.assert_close(logits(model, x), before, rtol=0, atol=1e-6)


def test_stack_reads_and_writes_like_one_state_and_copies_independently():
    model, x = bert(), batch()
    attnprune.patch(model, "attention_mass", keep_ratio=0.5)
    attnprune.patch(model, "crisp", sparsity=0.8, stack=True)
    state = attnprune.patch_state(model)
    full = copy.deepcopy(model)
    attnprune.unpatch(full)
    state.bucket_rows = False  # the token state's switch
    assert state.state("token").bucket_rows is False
    state.enabled = False  # every method off: the stock model on the same weights
    torch.testing.assert_close(logits(model, x), logits(full, x), rtol=0, atol=1e-6)
    state.enabled = True
    with pytest.raises(AttributeError, match="no state"):
        state.nonexistent = 1
    clone = copy.deepcopy(model)
    cs = attnprune.patch_state(clone)
    assert isinstance(cs, PatchStack) and cs.states[0] is not state.states[0]
    torch.testing.assert_close(logits(clone, x), logits(model, x), rtol=0, atol=0)
    attnprune.unpatch(clone)
    assert attnprune.patch_state(model).method == "attention_mass+crisp"  # the original keeps it


def test_loss_method_follows_the_tokens_after_a_gather_into_row_groups(monkeypatch):
    """After the token host gathers and splits the batch into row groups, the loss method's
    per-call token masks come from each call's own attention mask (the model-level mask has
    other rows and positions: using it fails on shapes)."""
    import attnprune.hosts.hf_encoder as he
    from attnprune.hosts.hf_attention import real_tokens

    monkeypatch.setattr(he, "GROUP_OVERHEAD_TOKENS", 0)  # one group per distinct kept count
    model, x = bert(), batch()
    attnprune.patch(model, "ltp", keep_ratio=0.5, after_layer=1)
    with torch.no_grad():
        attnprune.patch_state(model).modules.theta.fill_(1.0)
    attnprune.patch(model, "cost", lam=1e-2, stack=True).eval()
    with torch.no_grad():
        model(**x)
    state = attnprune.patch_state(model)
    assert state.stats["padded_per_layer"][1] < x["input_ids"].numel()  # gathered
    assert torch.isfinite(attnprune.aux_loss(model))
    # the mask reading itself: padding keys are masked in every row, real keys seen by some
    keys = torch.tensor([[True, True, False], [True, True, True]])
    bidir = keys[:, None, None, :].expand(2, 1, 3, 3)
    assert torch.equal(real_tokens(bidir, 3), keys)
    causal = bidir & torch.ones(3, 3, dtype=torch.bool).tril()
    assert torch.equal(real_tokens(causal, 2), keys[:, 1:])
    additive = torch.where(bidir, 0.0, torch.finfo(torch.float32).min)
    assert torch.equal(real_tokens(additive, 3), keys) and real_tokens(None, 3) is None
