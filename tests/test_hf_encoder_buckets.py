"""Row bucketing in the encoder host: same logits as one padded batch, fewer FLOPs, and only at
inference (training, the off switch and equal kept counts run one batch as before)."""

from __future__ import annotations

import pytest
import torch
from conftest import record_calls
from test_hf_encoder import make  # tests/ is on sys.path

import attnprune
from attnprune.hosts import hf_encoder
from attnprune.measure import count_flops

LENGTHS = [40, 5, 26, 3, 34, 12]  # real tokens per row: kept counts differ widely after a gather


def inputs(lengths=LENGTHS, L: int = 40, seed: int = 1):
    """(ids, attention_mask) of len(lengths) rows right-padded to L."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 100, (len(lengths), L), generator=g)
    am = (torch.arange(L)[None] < torch.tensor(lengths)[:, None]).long()
    return ids, am


def patched(kind: str, method: str, **kw):
    """A tiny model patched with ``method``; LTP's θ_l = 1 (a token is kept when it receives
    more than a uniform share of attention), the entropy head's weights ×3 so its entropies
    spread over (0, log C) instead of all sitting near log C (threshold 0.6·log C then keeps
    about half the tokens, a different count per row)."""
    model = make(kind)
    opts = dict(kw)
    if method == "ltp":
        opts.setdefault("init_threshold", 1.0)
    if method == "entropy_threshold":
        opts.setdefault("threshold", 0.6)
    attnprune.patch(model, method, **opts)
    if method == "entropy_threshold":
        with torch.no_grad():
            attnprune.patch_state(model).modules.head.weight.mul_(3)
    return model


def layer_batches(model, fn, which=None):
    """Run fn(); return the (rows, slots) of every encoder layer call, in order (and append
    each call's layer index to ``which``)."""
    calls = record_calls(attnprune.patch_state(model).layers, fn,
                         lambda i, a: (i, tuple(a[0].shape[:2])))
    if which is not None:
        which.extend(i for i, _ in calls)
    return [shape for _, shape in calls]


def on_and_off(model, fn):
    """fn() under no_grad with bucketing on, then off: output, layer calls and stats of each."""
    state = attnprune.patch_state(model)
    out = {}
    for on in (True, False):
        state.bucket_rows = on
        res = {"layers": []}
        with torch.no_grad():
            res["calls"] = layer_batches(model, lambda r=res: r.__setitem__("out", fn()),
                                         res["layers"])
        res["stats"] = dict(state.stats)
        out[on] = res
    state.bucket_rows = True
    return out[True], out[False]


def logits_of(model, ids, am):
    return lambda: model(input_ids=ids, attention_mask=am).logits


# -- same outputs ------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["bert", "distilbert", "roberta"])
@pytest.mark.parametrize("method", ["ltp", "entropy_threshold"])
@pytest.mark.parametrize("schedule", ["single", "geometric"])
def test_bucketed_equals_unbucketed_logits(kind, method, schedule, monkeypatch):
    """Padded rows of very different lengths: the kept counts differ, the rows split into
    groups (c = 2 slots), and the logits match one padded batch; a multi-layer schedule prunes
    again inside the groups."""
    monkeypatch.setattr(hf_encoder, "GROUP_OVERHEAD_TOKENS", 2)
    model = patched(kind, method, keep_ratio=0.5, after_layer=1, schedule=schedule)
    ids, am = inputs()
    on, off = on_and_off(model, logits_of(model, ids, am))
    B = ids.shape[0]
    assert len(on["calls"]) > len(off["calls"]) and min(b for b, _ in on["calls"]) < B  # it split
    assert {b for b, _ in off["calls"]} == {B}
    assert (on["out"] - off["out"]).abs().max() < 1e-5
    assert on["stats"]["kept_per_layer"] == off["stats"]["kept_per_layer"]
    assert on["stats"]["kept_ratio"] < 0.9
    # padded_per_layer = the slots the layer calls actually processed, summed over groups
    n = len(on["stats"]["padded_per_layer"])
    slots = [0] * n
    for layer, (b, k) in zip(on["layers"], on["calls"], strict=True):
        slots[layer] += b * k
    assert on["stats"]["padded_per_layer"] == slots
    assert sum(on["stats"]["padded_per_layer"]) < sum(off["stats"]["padded_per_layer"])
    calls = [on["layers"].count(i) for i in range(n)]  # layer calls: 1, then one per group
    assert calls[0] == 1 and calls[1] > 1


@pytest.mark.parametrize("kind", ["bert", "distilbert", "roberta"])
def test_groups_split_again_at_later_pruning_layers(kind, monkeypatch):
    """Geometric LTP prunes after layers 1, 2 and 3: a group formed after layer 1 is split
    again by a later gather (more calls of layer 4 than of layer 2), logits unchanged."""
    monkeypatch.setattr(hf_encoder, "GROUP_OVERHEAD_TOKENS", 2)
    model = patched(kind, "ltp", keep_ratio=0.5, after_layer=1, schedule="geometric")
    ids, _ = inputs(lengths=[40] * 8, seed=2)
    on, off = on_and_off(model, logits_of(model, ids, None))
    calls = [on["layers"].count(i) for i in range(4)]
    assert calls[0] == 1 and 1 < calls[1] < calls[3]
    assert (on["out"] - off["out"]).abs().max() < 1e-5
    assert on["stats"]["kept_per_layer"] == off["stats"]["kept_per_layer"]
    assert sum(on["stats"]["padded_per_layer"]) < sum(off["stats"]["padded_per_layer"])
    assert on["stats"]["padded_per_layer"][0] == off["stats"]["padded_per_layer"][0]


@pytest.mark.parametrize("kind", ["bert", "distilbert"])
def test_unpadded_rows_with_different_kept_counts(kind, monkeypatch):
    """No attention mask at all: equal lengths, but LTP's thresholds keep different counts."""
    monkeypatch.setattr(hf_encoder, "GROUP_OVERHEAD_TOKENS", 0)  # one group per distinct count
    model = patched(kind, "ltp", keep_ratio=0.5, after_layer=2)
    ids, _ = inputs(lengths=[40] * 6, seed=3)
    seen = {}
    sel_fn = attnprune.patch_state(model).modules.forward

    def spy(hidden, mask, **kw):
        sel = sel_fn(hidden, mask, **kw)
        seen["counts"] = (sel.keep & mask).sum(1)
        return sel

    attnprune.patch_state(model).modules.forward = spy
    on, off = on_and_off(model, logits_of(model, ids, None))
    groups = seen["counts"].unique().numel()
    assert groups > 1  # the thresholds left rows of different lengths
    assert len(on["calls"]) == 2 + groups * 2  # layers 1–2 once, layers 3–4 once per group
    assert (on["out"] - off["out"]).abs().max() < 1e-5


@pytest.mark.parametrize("kind", ["bert", "distilbert"])
@pytest.mark.parametrize("output", ["scatter", "short"])
def test_output_formats(kind, output, monkeypatch):
    """The encoder's own output: ``"scatter"`` the stock (B, L, d) states, equal to one batch
    everywhere; ``"short"`` the same (B, K, d) shape as one batch (K = longest final row) with
    equal states on every slot a group computed (slots past a group's width are zeros)."""
    monkeypatch.setattr(hf_encoder, "GROUP_OVERHEAD_TOKENS", 2)
    ids, am = inputs()
    model = patched(kind, "ltp", keep_ratio=0.5, after_layer=1, schedule="geometric",
                    output=output)
    base = model.base_model
    on, off = on_and_off(model, lambda: base(input_ids=ids, attention_mask=am).last_hidden_state)
    a, b = on["out"], off["out"]
    assert min(n for n, _ in on["calls"]) < ids.shape[0]  # it split
    assert a.shape == b.shape
    if output == "scatter":
        assert a.shape[:2] == ids.shape
        assert (a - b).abs().max() < 1e-5
    else:
        assert a.shape[1] < ids.shape[1]
        computed = a.abs().sum(-1) > 0  # (B, K)
        assert computed[:, 0].all() and not computed.all()
        assert (a - b)[computed].abs().max() < 1e-5  # CLS (read by every stock head) among them


def test_equal_counts_run_as_one_batch():
    """Top-k on equal-length rows keeps ⌊ρ·n⌋ everywhere: one group, the same path exactly."""
    model = patched("bert", "attention_mass", keep_ratio=0.5, after_layer=1, schedule="geometric")
    ids, _ = inputs(lengths=[40] * 4)
    on, off = on_and_off(model, logits_of(model, ids, None))
    assert on["calls"] == off["calls"] and {b for b, _ in on["calls"]} == {4}
    assert torch.equal(on["out"], off["out"])
    assert on["stats"]["padded_per_layer"] == off["stats"]["padded_per_layer"]


def test_batch_of_one_is_not_split():
    model = patched("bert", "ltp", keep_ratio=0.5, after_layer=1, schedule="geometric")
    ids, am = inputs(lengths=[30])
    on, off = on_and_off(model, logits_of(model, ids, am))
    assert on["calls"] == off["calls"] and torch.equal(on["out"], off["out"])


# -- fewer FLOPs ---------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["ltp", "entropy_threshold"])
def test_bucketing_counts_fewer_flops(method, monkeypatch):
    """With MiniLM's group cost (c = 24; at this tiny width the measured model keeps one
    group): fewer counted FLOPs when counts differ, the same count when they are equal."""
    monkeypatch.setattr(hf_encoder, "GROUP_OVERHEAD_TOKENS", 24)
    model = patched("bert", method, keep_ratio=0.5, after_layer=1)
    state = attnprune.patch_state(model)
    ids, am = inputs(lengths=[120, 10, 80, 6, 100, 30], L=120)
    same_ids, _ = inputs(lengths=[40] * 4)
    eq = patched("bert", "attention_mass", keep_ratio=0.5, after_layer=1)
    flops = {}
    with torch.no_grad():
        for on in (True, False):
            state.bucket_rows = on
            attnprune.patch_state(eq).bucket_rows = on
            flops[on] = (count_flops(logits_of(model, ids, am)),
                         count_flops(logits_of(eq, same_ids, None)))
    assert flops[True][0] < flops[False][0]
    assert flops[True][1] == flops[False][1]


# -- paths that must not change --------------------------------------------------------------------
@pytest.mark.parametrize("method", ["ltp", "attention_mass", "entropy_threshold"])
def test_training_is_unaffected(method, monkeypatch):
    """Training keeps one padded batch: soft masks (LTP) and methods that gather in training
    (top-k, thresholds) alike, with rows whose kept counts differ."""
    monkeypatch.setattr(hf_encoder, "GROUP_OVERHEAD_TOKENS", 0)
    model = patched("bert", method, keep_ratio=0.5, after_layer=1, schedule="geometric")
    model.train()
    ids, am = inputs()
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    state = attnprune.patch_state(model)
    out = {}
    for on in (True, False):
        state.bucket_rows = on
        res = {}

        def fn(res=res):
            torch.manual_seed(3)
            o = model(input_ids=ids, attention_mask=am, labels=labels)
            aux = attnprune.aux_loss(model)
            res["loss"] = o.loss + (aux if aux is not None else 0.0)

        res["calls"] = layer_batches(model, fn)
        res["kept"] = list(state.stats["kept_per_layer"])
        out[on] = res
    assert {b for b, _ in out[True]["calls"]} == {6}
    assert out[True]["calls"] == out[False]["calls"]
    assert torch.equal(out[True]["loss"], out[False]["loss"])
    assert out[True]["kept"] == out[False]["kept"]


# -- the option ------------------------------------------------------------------------------------
def test_option_turns_bucketing_off(monkeypatch):
    monkeypatch.setattr(hf_encoder, "GROUP_OVERHEAD_TOKENS", 2)
    ids, am = inputs()
    on = patched("bert", "ltp", keep_ratio=0.5, after_layer=1)
    off = patched("bert", "ltp", keep_ratio=0.5, after_layer=1, bucket_rows=False)
    assert attnprune.patch_state(on).bucket_rows and not attnprune.patch_state(off).bucket_rows
    with torch.no_grad():
        assert min(b for b, _ in layer_batches(on, logits_of(on, ids, am))) < 6
        assert {b for b, _ in layer_batches(off, logits_of(off, ids, am))} == {6}
        attnprune.patch_state(off).bucket_rows = True  # switchable between forwards
        assert min(b for b, _ in layer_batches(off, logits_of(off, ids, am))) < 6


@pytest.mark.parametrize("bad", ["yes", 1, 0, None, 0.5])
def test_bad_bucket_rows_names_the_field(bad):
    model = make("bert")
    with pytest.raises(ValueError, match="bucket_rows"):
        attnprune.patch(model, "ltp", bucket_rows=bad)
    assert attnprune.patch_state(model) is None  # refused before the model was touched
    assert "forward" not in model.bert.encoder.__dict__


def test_group_overhead_scales_with_threads(monkeypatch):
    """c = selection.group_overhead_slots(d, block="encoder"), which grows with the threads (a
    second thread halves the per-slot cost of a layer call but not its fixed cost); a fixed
    GROUP_OVERHEAD_TOKENS overrides the model."""
    from attnprune.selection import group_overhead_slots

    threads = torch.get_num_threads()
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            assert hf_encoder.group_overhead_tokens(384) == group_overhead_slots(384, t, "encoder")
    finally:
        torch.set_num_threads(threads)
    assert group_overhead_slots(384, 2, "encoder") == 2 * group_overhead_slots(384, 1, "encoder")
    monkeypatch.setattr(hf_encoder, "GROUP_OVERHEAD_TOKENS", 5)
    assert hf_encoder.group_overhead_tokens(384) == 5
