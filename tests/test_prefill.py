"""Training-free prefill pruning (attnprune.prefill) on tiny random Llama-family decoders:
scores equal the model's own attention, kept positions, keep=1 equals stock generate, batch
with left padding equals rows alone, cached decoding equals recomputation on the kept tokens."""

from __future__ import annotations

import pytest
import test_hf_causal
import test_hf_llama  # tests/ is on sys.path
import torch
from test_hf_llama import DECODERS, V

from attnprune import prefill as P
from attnprune.hosts.hf_prefill import decoder_for

FAMILIES = [*DECODERS, "gpt2"]
METHODS = ["fastv", "gemfilter"]


def tiny(family: str = "llama"):
    """A tiny random LM of the family (vocabulary V = 40 for all, eval mode)."""
    return test_hf_causal.tiny() if family == "gpt2" else test_hf_llama.tiny(family)


def blocks(model):
    return model.base_model.h if hasattr(model.base_model, "h") else model.base_model.layers


def left_padded(lengths, seed: int = 0, L: int | None = None):
    """Random ids (B, L) in 1..V−1, row b left padded to its length; (ids, mask)."""
    g = torch.Generator().manual_seed(seed)
    L = L or max(lengths)
    ids = torch.randint(1, V, (len(lengths), L), generator=g)
    mask = torch.zeros_like(ids)
    for b, n in enumerate(lengths):
        mask[b, L - n:] = 1
    return ids * mask, mask


def stock_generate(model, ids, mask, n):
    """HF greedy generate: (tokens (B, n), logits (B, n, V))."""
    model.generation_config.eos_token_id = None  # every row generates n tokens
    out = model.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False,
                         output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    return out.sequences[:, ids.shape[1]:], torch.stack(out.logits, 1).float()


# -- scoring -------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_window_scores_equal_the_models_own_attention(family):
    """I_j from the scoring layer's rotated q/k (GQA, q/k norms, Phi-3's and GPT-2's fused
    projections, Gemma2's soft-cap) = the eager model's attention probabilities at that layer, averaged
    over heads and the window's real queries, on a left-padded batch."""
    model = tiny(family)
    model.set_attn_implementation("eager")
    ids, mask = left_padded([20, 13])
    pos = (mask.cumsum(1) - 1).clamp_min(0)
    out = model(ids, attention_mask=mask, position_ids=pos, output_attentions=True,
                output_hidden_states=True)
    dec, K, w = decoder_for(model), 2, 5
    h = out.hidden_states[K]  # input of layer K
    q, k, s, cap = dec.qk(K, h, dec.rope(h, pos), w)  # GPT-2: rope None (wpe is in h)
    got = P.window_scores(q, k, mask.bool(), s, cap)
    A = out.attentions[K].float()  # (B, H, L, L)
    for b in range(2):
        rows = A[b, :, -w:][:, mask[b, -w:].bool()]  # real queries of the window
        want = rows.mean(dim=(0, 1)) * mask[b]
        assert torch.allclose(got[b], want, atol=1e-5)


@pytest.mark.parametrize("method", METHODS)
def test_prefill_scores_with_layer_K(method):
    """The scores a prefill ranks by are layer K's attention (K = ``layer``), for both methods."""
    model = tiny("llama")
    model.set_attn_implementation("eager")
    ids, mask = left_padded([20, 13])
    pos = (mask.cumsum(1) - 1).clamp_min(0)
    A = model(ids, attention_mask=mask, position_ids=pos, output_attentions=True).attentions[3]
    st = P.prefill(model, ids, mask, keep=0.5, method=method, layer=3, window=4)
    for b in range(2):
        want = A[b, :, -4:][:, mask[b, -4:].bool()].mean(dim=(0, 1)) * mask[b]
        assert torch.allclose(st.scores[b], want, atol=1e-5)


# -- kept positions -------------------------------------------------------------------------------
@pytest.mark.parametrize("keep", [0.3, 0.5, 5, 9])
def test_sinks_and_window_always_kept_then_top_scores(keep):
    g = torch.Generator().manual_seed(1)
    real = left_padded([30, 22, 9])[1].bool()
    scores = torch.rand(real.shape, generator=g)
    sinks, window = 2, 3
    kept = P.select_kept(scores, real, keep, sinks, window)
    for b in range(3):
        s, r, k = scores[b][real[b]], kept[b][real[b]], kept[b] & ~real[b]
        assert not k.any()  # padding never kept
        n = len(s)
        prot = torch.zeros(n, dtype=torch.bool)
        prot[:sinks], prot[n - window:] = True, True
        assert r[prot].all()
        budget = int(keep * n + 1e-9) if isinstance(keep, float) else keep
        assert int(r.sum()) == max(min(budget, n), int(prot.sum()))
        free_kept, free_dropped = s[r & ~prot], s[~r & ~prot]
        if len(free_kept) and len(free_dropped):
            assert free_kept.min() >= free_dropped.max()  # the rest: the top of the scores


@pytest.mark.parametrize("method", METHODS)
def test_prefill_keeps_the_budget_with_sinks_and_window(method):
    model = tiny("llama")
    ids, mask = left_padded([32, 20])
    st = P.prefill(model, ids, mask, keep=0.25, method=method, layer=2, window=4, sinks=2)
    for b, n in enumerate([32, 20]):
        k = st.kept[b, 32 - n:]
        assert k[:2].all() and k[-4:].all() and int(k.sum()) == max(n // 4, 6)
        assert not st.kept[b, : 32 - n].any()
    # the pruned layers' cache holds the kept tokens only (right aligned), those below the
    # FastV cut every slot
    lengths = [st.cache.get_seq_length(l) for l in range(4)]
    assert lengths == ([32, 32, 8, 8] if method == "fastv" else [8] * 4)


def _kept_by_hand(scores, real, keep, sinks, window):
    """PrefillConfig's rule, written out: each row's first ``sinks`` and last ``window`` real
    tokens, then the highest scores (ties: the earlier token) up to k = ⌊ρ · n⌋ (or the int
    budget), all protected tokens kept if they outnumber k."""
    kept = torch.zeros_like(real)
    for b in range(real.shape[0]):
        slots = real[b].nonzero().flatten().tolist()
        n = len(slots)
        k = int(keep * n + 1e-9) if isinstance(keep, float) else keep
        protected = set(slots[:sinks]) | set(slots[max(n - window, 0):])
        free = sorted((j for j in slots if j not in protected), key=lambda j: (-float(scores[b, j]), j))
        for j in [*protected, *free[:max(min(k, n) - len(protected), 0)]]:
            kept[b, j] = True
    return kept


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("score", ["attention", "random"])
@pytest.mark.parametrize("keep", [0.3, 7])
def test_prefill_keeps_sinks_window_and_the_top_of_its_own_scores(family, method, score, keep):
    """``prefill().kept`` is sinks + window + the top of ``prefill().scores`` (issue 48: a
    prefill that kept the most recent tokens whatever the scores passed every test, the
    selection and the scores being checked apart). Left padded, both score modes, a ratio and
    a budget; and the top of the scores is not the most recent tokens here, so the test tells
    them apart."""
    model = tiny(family)
    ids, mask = left_padded([30, 19], seed=3)
    sinks, window = 2, 3
    st = P.prefill(model, ids, mask, keep=keep, method=method, layer=2, window=window,
                   sinks=sinks, score=score)
    real = mask.bool()
    assert torch.equal(st.kept, _kept_by_hand(st.scores, real, keep, sinks, window))
    recency = (real.long().cumsum(1) * real).float()  # later real tokens score higher
    assert not torch.equal(st.kept, _kept_by_hand(recency, real, keep, sinks, window))


# -- parity ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("method", METHODS)
def test_keep_all_equals_stock_generate(family, method):
    model = tiny(family)
    ids, mask = left_padded([24, 17])
    tokens, logits = stock_generate(model, ids, mask, 5)
    g = P.generate(model, ids, mask, max_new_tokens=5, keep=1.0, method=method, layer=2)
    assert torch.equal(g.tokens, tokens)
    assert (g.logits - logits).abs().max() <= 1e-5
    assert torch.equal(g.kept, mask.bool())


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma2", "phi3", "gpt2"])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("keep", [0.4, 7])
def test_batch_with_left_padding_equals_each_row_alone(family, method, keep):
    model = tiny(family)
    lengths = [30, 21, 12]
    ids, mask = left_padded(lengths)
    opts = {"keep": keep, "method": method, "layer": 2, "window": 3, "sinks": 2}
    g = P.generate(model, ids, mask, max_new_tokens=4, **opts)
    for b, n in enumerate(lengths):
        one = P.generate(model, ids[b:b + 1, 30 - n:], max_new_tokens=4, **opts)
        assert torch.equal(g.kept[b, 30 - n:], one.kept[0])
        assert torch.equal(g.tokens[b], one.tokens[0])
        assert (g.logits[b] - one.logits[0]).abs().max() <= 1e-4


def _recompute_fastv(model, seq, real, kept, K):
    """Last-token logits of the stock model, no cache, on the whole sequence, where layers ≥ K
    see only the kept prompt tokens and the generated ones as keys (a dropped token's own
    state is never read by a kept one, so masking it = removing it)."""
    T = seq.shape[1]
    pos = (real.long().cumsum(1) - 1).clamp_min(0)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    allowed = causal[None] & (kept & real)[:, None, :]
    allowed |= torch.eye(T, dtype=torch.bool)[None]  # dropped / pad queries: finite rows
    mask4d = allowed[:, None]

    def swap(mod, args, kwargs):
        if "attention_mask" in kwargs:
            kwargs["attention_mask"] = mask4d
        else:  # GPT-2 passes (h, cache, mask, …) positionally
            args = (*args[:2], mask4d, *args[3:])
        return args, kwargs

    hooks = [layer.register_forward_pre_hook(swap, with_kwargs=True) for layer in blocks(model)[K:]]
    try:
        return model(seq, attention_mask=real.long(), position_ids=pos).logits[:, -1].float()
    finally:
        for hk in hooks:
            hk.remove()


def _recompute_gemfilter(model, seq, real, kept, L):
    """Last-token logits of the stock model, no cache, on the kept prompt tokens (at their
    original positions) followed by the generated ones."""
    index, kmask = P.kept_index(kept[:, :L])
    ids = torch.cat([torch.gather(seq[:, :L], 1, index), seq[:, L:]], 1)
    m = torch.cat([kmask, real[:, L:]], 1)
    pos_all = (real.long().cumsum(1) - 1).clamp_min(0)
    pos = torch.cat([torch.gather(pos_all[:, :L], 1, index), pos_all[:, L:]], 1)
    return model(ids, attention_mask=m.long(), position_ids=pos).logits[:, -1].float()


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3", "gpt2"])
@pytest.mark.parametrize("method", METHODS)
def test_cached_generation_equals_recomputation_on_kept_tokens(family, method):
    model = tiny(family)
    L, n = 32, 5
    ids, mask = left_padded([32, 19], seed=3)
    g = P.generate(model, ids, mask, max_new_tokens=n, keep=0.3, method=method, layer=2,
                   window=3, sinks=1)
    assert (g.kept.sum(1) < mask.sum(1)).all()  # something was pruned in every row
    for t in range(n):
        seq = torch.cat([ids, g.tokens[:, :t]], 1)
        real = torch.cat([mask.bool(), torch.ones(2, t, dtype=torch.bool)], 1)
        kept = torch.cat([g.kept, torch.ones(2, t, dtype=torch.bool)], 1)
        ref = (_recompute_fastv(model, seq, real, kept, 2) if method == "fastv"
               else _recompute_gemfilter(model, seq, real, kept, L))
        assert (g.logits[:, t] - ref).abs().max() <= 1e-4, t


def test_pruning_changes_the_output_and_the_cut_matters():
    """A guard that the parity tests compare something: pruning changes logits, and FastV
    (full cache below the cut) differs from GemFilter (all layers rerun)."""
    model = tiny("llama")
    ids, mask = left_padded([32])
    a = P.generate(model, ids, mask, max_new_tokens=2, keep=0.3, method="fastv", layer=2)
    b = P.generate(model, ids, mask, max_new_tokens=2, keep=0.3, method="gemfilter", layer=2)
    full = P.generate(model, ids, mask, max_new_tokens=2, keep=1.0)
    assert torch.equal(a.kept, b.kept)
    assert (a.logits - full.logits).abs().max() > 1e-3
    assert (a.logits - b.logits).abs().max() > 1e-3
    opts = {"keep": 0.3, "window": 3, "sinks": 1, "max_new_tokens": 1}
    att = P.generate(model, ids, mask, **opts)
    r = P.generate(model, ids, mask, score="random", **opts)  # the control: same budget
    assert r.kept.sum() == att.kept.sum() == 9 and not torch.equal(r.kept, att.kept)


# -- options and refusals ---------------------------------------------------------------------------
@pytest.mark.parametrize("opts,field", [
    ({"keep": 0.0}, "keep"), ({"keep": 1.5}, "keep"), ({"keep": 0}, "keep"), ({"keep": True}, "keep"),
    ({"method": "snapkv"}, "method"), ({"layer": -1}, "layer"), ({"layer": 4}, "layer"),
    ({"window": 0}, "window"), ({"sinks": -1}, "sinks"), ({"score": "norm"}, "score"),
])
def test_bad_options_name_the_field(opts, field):
    ids, mask = left_padded([8])
    with pytest.raises(ValueError, match=field):
        P.generate(tiny("llama"), ids, mask, max_new_tokens=1, **opts)


def test_refusals():
    model = tiny("llama")
    ids, mask = left_padded([8, 6])
    with pytest.raises(ValueError, match="LM head"):
        P.generate(model.base_model, ids, mask)
    with pytest.raises(ValueError, match="left padded"):
        P.generate(model, ids, mask.flip(1))
    with pytest.raises(ValueError, match="max_new_tokens"):
        P.generate(model, ids, mask, max_new_tokens=0)
    with pytest.raises(ValueError, match="sliding_window"):  # mistral's window is 64 here
        P.generate(tiny("mistral"), *left_padded([60]), max_new_tokens=8)
    with pytest.raises(ValueError, match="n_positions"):  # GPT-2's table has 48 here
        P.generate(tiny("gpt2"), *left_padded([44]), max_new_tokens=8)
    with pytest.raises(ValueError, match="LM head"):
        P.generate(tiny("gpt2").transformer, ids, mask)


# -- sliding windows while decoding ----------------------------------------------------------------
@pytest.mark.parametrize("family,field", [("mistral", "sliding_window"), ("gemma2", "sliding_window"),
                                          ("gpt2", "n_positions")])
def test_decode_refuses_to_leave_the_window(family, field):
    """prefill() checks only ``max_new_tokens`` (default 0): decode() itself refuses the step
    that would make the sequence longer than the window (before, Mistral decoded on with no
    error and Gemma-2 crashed with a shape error), leaving the state as it was; every step up
    to the window's last slot equals the stock model."""
    if family == "gpt2":
        model, L, window = tiny("gpt2"), 42, 48  # GPT-2's table has 48 positions here
    else:
        model, L, window = test_hf_llama.tiny(family, sliding_window=16), 10, 16
    ids, mask = left_padded([L, L - 3], L=L)
    n = window - L + 1  # new tokens; the last one never enters the cache
    tokens, logits = stock_generate(model, ids, mask, n)
    st = P.prefill(model, ids, mask, keep=1.0, layer=1)
    for t in range(n - 1):  # the stock tokens through the cache, up to `window` slots
        got = P.decode(st, tokens[:, t:t + 1])
        assert (got - logits[:, t + 1]).abs().max() <= 1e-5, t
    before = (st.positions.clone(), [k.shape for k in st.keys], st.cache.get_seq_length(0))
    with pytest.raises(ValueError, match=field):
        P.decode(st, tokens[:, -1:])
    assert st.slots == window and torch.equal(st.positions, before[0])
    assert [k.shape for k in st.keys] == before[1] and st.cache.get_seq_length(0) == before[2]
    pruned = P.prefill(model, ids, mask, keep=0.5, layer=1, window=3, sinks=1)
    for t in range(n - 1):
        P.decode(pruned, tokens[:, t:t + 1])
    with pytest.raises(ValueError, match=field):  # a pruned cache is no exception
        P.decode(pruned, tokens[:, -1:])


# -- no device reads while decoding ----------------------------------------------------------------
def _to_meta(model, state):
    """The model and a prefilled state on the meta device, where every read of a value
    (``bool()``, ``.item()``, ``.tolist()``) raises."""
    model.to("meta")
    for layer in state.cache.layers:
        for name, v in list(vars(layer).items()):
            if isinstance(v, torch.Tensor):
                setattr(layer, name, v.to("meta"))
            elif isinstance(v, torch.device):
                setattr(layer, name, torch.device("meta"))
    state.keys = [k.to("meta") for k in state.keys]
    state.positions = state.positions.to("meta")


@pytest.mark.parametrize("family", ["llama", "gemma2", "phi3", "gpt2"])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("lengths", [[20, 13], [20, 20]])
def test_decode_steps_read_nothing_from_the_device(family, method, lengths):
    """A decode step makes no device sync (on a GPU each one would stall the loop): after a
    prefill on the CPU, steps run on the meta device, where any host read raises. Padded and
    unpadded caches (keys passed as a mask / as None). Failed before: ``bool(keys.all())``
    once per cache group per step."""
    model = tiny(family)
    ids, mask = left_padded(lengths, L=20)
    st = P.prefill(model, ids, mask, keep=0.5, method=method, layer=1, window=3, sinks=1)
    _to_meta(model, st)
    nxt = st.logits.argmax(-1, keepdim=True).to("meta")
    for _ in range(2):
        out = P.decode(st, nxt)
    assert out.shape == (2, V) and out.device.type == "meta"
    assert st.padded[-1] == (lengths[0] != lengths[1])
    with pytest.raises(Exception, match="meta"):  # the check has teeth: a read raises here
        bool(st.keys[0].all())


# -- defaults and soft-capping -----------------------------------------------------------------
def test_default_cut_layer():
    """FastV's default cut is K = N / 16, at least 1 (layer 2 of 32), GemFilter's ≈ 0.4 N; a
    prefill with no ``layer`` cuts there (every other test passes ``layer=``)."""
    assert [P.PrefillConfig().cut(n) for n in (4, 16, 32, 40)] == [1, 1, 2, 2]
    assert [P.PrefillConfig(method="gemfilter").cut(n) for n in (4, 32)] == [2, 13]
    model = tiny("llama")
    model.set_attn_implementation("eager")
    ids, mask = left_padded([32, 20])
    st = P.prefill(model, ids, mask, keep=0.25, window=4, sinks=2)  # the default: K = 1 of 4
    assert [st.cache.get_seq_length(l) for l in range(4)] == [32, 8, 8, 8]
    pos = (mask.cumsum(1) - 1).clamp_min(0)
    A = model(ids, attention_mask=mask, position_ids=pos, output_attentions=True).attentions[1]
    for b in range(2):
        want = A[b, :, -4:][:, mask[b, -4:].bool()].mean(dim=(0, 1)) * mask[b]
        assert torch.allclose(st.scores[b], want, atol=1e-5)


def test_window_scores_soft_cap_where_it_matters():
    """Gemma-2's attention soft-cap (its real 50) at a scale where it changes the scores: layer
    K's q/k weights ×100 give logits up to ~66, and I_j still equals the eager model's
    attention. At the tiny model's own scale (|s| < 0.01) the cap is the identity, so
    dropping it went unseen."""
    model = test_hf_llama.tiny("gemma2")
    assert model.config.attn_logit_softcapping == 50.0
    model.set_attn_implementation("eager")
    dec, K, w = decoder_for(model), 2, 5
    with torch.no_grad():
        attn = model.model.layers[K].self_attn
        attn.q_proj.weight.mul_(100.0)
        attn.k_proj.weight.mul_(100.0)
    ids, mask = left_padded([20, 13])
    pos = (mask.cumsum(1) - 1).clamp_min(0)
    out = model(ids, attention_mask=mask, position_ids=pos, output_attentions=True,
                output_hidden_states=True)
    h = out.hidden_states[K]
    q, k, s, cap = dec.qk(K, h, dec.rope(h, pos), w)
    got = P.window_scores(q, k, mask.bool(), s, cap)
    uncapped = P.window_scores(q, k, mask.bool(), s, None)
    assert (got - uncapped).abs().max() > 1e-2  # the cap matters at this scale
    st = P.prefill(model, ids, mask, keep=0.5, layer=K, window=w)
    A = out.attentions[K].float()
    for b in range(2):
        want = A[b, :, -w:][:, mask[b, -w:].bool()].mean(dim=(0, 1)) * mask[b]
        assert torch.allclose(got[b], want, atol=1e-5)
        assert torch.allclose(st.scores[b], want, atol=1e-5)
