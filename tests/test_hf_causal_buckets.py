"""Row bucketing in the causal host: same outputs as one padded batch, fewer FLOPs, and only at
inference without a KV cache (training and cached forwards unchanged)."""

from __future__ import annotations

import pytest
import torch
from conftest import record_calls
from test_hf_causal import METHODS, force_pruning, tiny  # tests/ is on sys.path
from transformers import DynamicCache

import attnprune
from attnprune.hosts import hf_causal
from attnprune.measure import count_flops
from attnprune.selection import row_groups

KEEP_IDS = 20  # decisive(): token ids < 20 are kept at every decision layer, the rest dropped


@pytest.fixture
def cpu_small_cost(monkeypatch):
    """The group cost of the cpu-small GPT-2's width (c = 32): at the tiny test width
    (d = 32) the measured model (selection.group_overhead_slots) keeps one group."""
    monkeypatch.setattr(hf_causal, "GROUP_OVERHEAD_TOKENS", 32)


def decisive(model) -> None:
    """Make LTP keep exactly the tokens with id < KEEP_IDS: their embeddings get +10·v, the
    others −10·v (v a zero-mean unit direction, so LN(h) ≈ ±v/std(v)), and I = σ(5·v·LN(h))."""
    g = torch.Generator().manual_seed(0)
    v = torch.randn(model.config.n_embd, generator=g)
    v = (v - v.mean()) / (v - v.mean()).norm()
    m = model.transformer.attnprune_method
    with torch.no_grad():
        wte = model.transformer.wte.weight
        sign = torch.where(torch.arange(wte.shape[0]) < KEEP_IDS, 1.0, -1.0)
        wte.add_(10 * sign[:, None] * v)
        m.w.copy_(5 * v.expand_as(m.w))
        m.b.zero_()
        m.tau.fill_(0.5)


def rows_keeping(shares, L: int = 40, seed: int = 1) -> torch.Tensor:
    """(B, L) ids whose row b has about shares[b]·L kept tokens under decisive()."""
    g = torch.Generator().manual_seed(seed)
    p = torch.tensor(shares, dtype=torch.float)[:, None]
    kept = torch.rand(len(shares), L, generator=g) < p
    return torch.where(kept, torch.randint(0, KEEP_IDS, kept.shape, generator=g),
                       torch.randint(KEEP_IDS, 40, kept.shape, generator=g))


def decisive_ltp(**kw):
    model = tiny()
    attnprune.patch(model, "ltp", **kw)
    decisive(model)
    return model


def batch_sizes(model, fn):
    """Run fn(); return the batch size of every block call, in order."""
    return record_calls(model.transformer.h, fn, lambda i, a: a[0].shape[0])


def on_and_off(model, fn):
    """fn() with bucketing on, then off; each result with the batch sizes blocks saw."""
    state = attnprune.patch_state(model)
    out = {}
    for on in (True, False):
        state.bucket_rows = on
        res = {}
        res["sizes"] = batch_sizes(model, lambda r=res: r.__setitem__("out", fn()))
        res["kept"] = list(state.stats["kept_per_layer"])
        out[on] = res
    state.bucket_rows = True
    return out[True], out[False]


# -- the grouping rule ---------------------------------------------------------------------
def test_row_groups_rule():
    counts = torch.tensor([44, 38, 59, 42, 44, 41, 47, 43])  # kept counts seen on a real run
    groups = row_groups(counts, overhead=32)
    assert [counts[g].tolist() for g in groups] == [[44, 38, 42, 44, 41, 43], [59, 47]]
    assert sorted(torch.cat(groups).tolist()) == list(range(8))  # a partition of the rows
    # c = 0: only padding counts, one group per distinct count; a huge c: one group.
    assert [counts[g].unique().numel() for g in row_groups(counts, overhead=0)] == [1] * 7
    assert len(row_groups(counts, overhead=1e9)) == 1
    assert len(row_groups(torch.tensor([5, 5, 5]), overhead=0)) == 1  # ties: fewer groups
    assert len(row_groups(torch.tensor([7]), overhead=0)) == 1


def _best_cost(counts: list[int], c: float) -> float:
    """Brute force: the cheapest split of the sorted counts into runs (slots + c per group)."""
    u = sorted(counts)
    best = [0.0] + [float("inf")] * len(u)
    for j in range(1, len(u) + 1):
        for i in range(j):
            best[j] = min(best[j], best[i] + (j - i) * u[j - 1] + c)
    return best[-1]


@pytest.mark.parametrize("seed", range(40))
def test_row_groups_is_optimal(seed):
    # including the shortcut that skips the search when all padding is worth ≤ one group
    g = torch.Generator().manual_seed(seed)
    b = int(torch.randint(1, 9, (1,), generator=g))
    counts = torch.randint(0, 30, (b,), generator=g)
    c = float(torch.randint(0, 60, (1,), generator=g))
    groups = row_groups(counts, overhead=c)
    assert sorted(torch.cat(groups).tolist()) == list(range(b))
    cost = sum(len(r) * int(counts[r].max()) + c for r in groups)
    assert cost == pytest.approx(_best_cost(counts.tolist(), c))


# -- same outputs ----------------------------------------------------------------------------
@pytest.mark.parametrize("padded", [False, True])
def test_bucketed_equals_unbucketed_with_very_different_counts(padded, cpu_small_cost):
    model = decisive_ltp()
    x = rows_keeping([1.0, 0.1, 0.5, 0.0, 0.75])  # row 3 loses every token at layer 1
    mask = torch.ones_like(x)
    if padded:
        mask[0, 12:] = 0
        mask[2, 30:] = 0
    on, off = on_and_off(model, lambda: model(x, attention_mask=mask).logits)
    assert len(on["sizes"]) > len(off["sizes"]) and min(on["sizes"]) < x.shape[0]  # it split
    assert set(off["sizes"]) == {x.shape[0]}
    assert (on["out"] - off["out"]).abs().max() < 1e-5
    assert on["kept"] == off["kept"] and min(on["kept"]) < 0.7


def short_rows(B: int = 6, L: int = 44):
    """Random ids with rows 1 and 4 right-padded: kept counts differ widely after a gather."""
    x = torch.randint(0, 40, (B, L))
    mask = torch.ones_like(x)
    mask[1, 8:] = 0
    mask[4, 20:] = 0
    return x, mask


@pytest.mark.parametrize("method", METHODS)
def test_later_decisions_inside_groups(method, monkeypatch):
    """Random decisive scorers prune again at later layers, inside each group (a small group
    overhead c = 2 makes groups of one to three rows)."""
    monkeypatch.setattr(hf_causal, "GROUP_OVERHEAD_TOKENS", 2)
    model = tiny()
    attnprune.patch(model, method)
    force_pruning(model)
    x, mask = short_rows()
    on, off = on_and_off(model, lambda: model(x, attention_mask=mask).logits)
    assert min(on["sizes"]) < x.shape[0]
    assert (on["out"] - off["out"]).abs().max() < 1e-5
    assert on["kept"] == pytest.approx(off["kept"], abs=1e-12)


def test_groups_split_again_at_later_gathers(monkeypatch):
    monkeypatch.setattr(hf_causal, "GROUP_OVERHEAD_TOKENS", 2)
    model = tiny()
    attnprune.patch(model, "ltp")
    force_pruning(model)
    x, mask = short_rows()
    calls = [0] * 4
    hooks = [b.register_forward_pre_hook(lambda mod, a, i=i: calls.__setitem__(i, calls[i] + 1))
             for i, b in enumerate(model.transformer.h)]
    model(x, attention_mask=mask)
    for h in hooks:
        h.remove()
    assert calls[0] == 1 and 1 < calls[1] < calls[3]  # a group of block 1 split at block 2 or 3


def test_equal_counts_run_as_one_batch():
    model = decisive_ltp()
    x = rows_keeping([0.5]).expand(4, -1)  # identical rows keep the same count
    on, off = on_and_off(model, lambda: model(x).logits)
    assert on["sizes"] == off["sizes"] == [4] * 4
    assert torch.equal(on["out"], off["out"])


# -- fewer FLOPs -----------------------------------------------------------------------------
def test_bucketing_counts_fewer_flops(cpu_small_cost):
    model = decisive_ltp()
    state = attnprune.patch_state(model)
    x = rows_keeping([1.0, 0.1, 0.5, 0.2])
    same = rows_keeping([0.5]).expand(4, -1)
    flops = {}
    for on in (True, False):
        state.bucket_rows = on
        flops[on] = (count_flops(lambda: model(x)), count_flops(lambda: model(same)))
    assert flops[True][0] < 0.95 * flops[False][0]
    assert flops[True][1] == flops[False][1]


# -- paths that must not change ----------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_training_is_unaffected(method):
    model = tiny()
    attnprune.patch(model, method, **({"stage": 1} if method == "hybrid" else {}))
    force_pruning(model)
    model.train()
    x = torch.randint(0, 40, (4, 30))
    mask = torch.ones_like(x)
    mask[1, 6:] = 0

    def fn():
        torch.manual_seed(3)  # DTR samples its actions in training
        out = model(x, attention_mask=mask, labels=x)
        return out.loss + attnprune.aux_loss(model)

    on, off = on_and_off(model, fn)
    assert on["sizes"] == off["sizes"] and set(on["sizes"]) == {4}
    assert torch.equal(on["out"], off["out"]) and on["kept"] == off["kept"]


@pytest.mark.parametrize("method", METHODS)
def test_kv_cache_path_is_unaffected(method):
    model = tiny()
    attnprune.patch(model, method)
    force_pruning(model)
    x = torch.randint(0, 40, (4, 30))
    mask = torch.ones_like(x)
    mask[2, 25:] = 0

    def fn():
        cache = DynamicCache(config=model.config)
        parts = [model(x[:, :12], attention_mask=mask[:, :12], past_key_values=cache,
                       use_cache=True).logits]
        for t in range(12, 30):
            parts.append(model(x[:, t : t + 1], attention_mask=mask[:, : t + 1],
                               past_key_values=cache, use_cache=True).logits)
        return torch.cat(parts, 1)

    on, off = on_and_off(model, fn)
    assert set(on["sizes"]) == {4} and on["sizes"] == off["sizes"]
    assert torch.equal(on["out"], off["out"])
    # use_cache=True without a cache object is the cached path too.
    on, off = on_and_off(model, lambda: model(x, attention_mask=mask, use_cache=True).logits)
    assert set(on["sizes"]) == {4} and torch.equal(on["out"], off["out"])


# -- the option ----------------------------------------------------------------------------------
def test_option_turns_bucketing_off(cpu_small_cost):
    x = rows_keeping([1.0, 0.1, 0.5, 0.2])
    on = decisive_ltp()
    off = decisive_ltp(bucket_rows=False)
    assert attnprune.patch_state(on).bucket_rows and not attnprune.patch_state(off).bucket_rows
    assert min(batch_sizes(on, lambda: on(x))) < 4
    assert set(batch_sizes(off, lambda: off(x))) == {4}


@pytest.mark.parametrize("bad", ["yes", 1, 0, None, 0.5])
def test_bad_bucket_rows_names_the_field(bad):
    model = tiny()
    with pytest.raises(ValueError, match="bucket_rows"):
        attnprune.patch(model, "ltp", bucket_rows=bad)
    assert attnprune.patch_state(model) is None  # refused before the model was touched


def test_default_group_cost_is_the_measured_model(monkeypatch):
    """Without an override the host asks selection.group_overhead_slots(d, block="gpt2"): a
    zero cost splits the rows, a huge one keeps one group."""
    from attnprune import selection

    model = tiny()
    attnprune.patch(model, "ltp")
    force_pruning(model)
    x, mask = short_rows()
    sizes = {}
    for c in (0.0, 1e9):
        monkeypatch.setitem(selection.GROUP_OVERHEAD_MODEL, "gpt2", (c, 1.5))
        sizes[c] = batch_sizes(model, lambda: model(x, attention_mask=mask))
    assert min(sizes[0.0]) < x.shape[0] and min(sizes[1e9]) == x.shape[0]
