"""The attention host's per-call data: threads calling one patched model at once each get
their own forward (mask, layer, hidden states, losses), and ``output_attentions=True``
returns the probabilities each layer used."""

from __future__ import annotations

import pickle
import threading

import pytest
import torch
from test_attention_families import ARCHS, NEUTRAL, ON, V, build  # tests/ is on sys.path

import attnprune

# per thread: (batch, length, padded from); four shapes, so a mixed-up mask or hidden state
# either fails on its shape or gives other numbers
SHAPES = [(1, 7, None), (3, 12, 8), (2, 16, 5), (4, 9, 6)]
ROUNDS = 25


def _inputs(b, t, pad_from, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, V, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.long)
    if pad_from is not None and b > 1:
        mask[1:, pad_from:] = 0
    return ids, mask


def _run(model, x):
    ids, mask = x
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask).logits
    aux = attnprune.aux_loss(model)
    return out, (None if aux is None else aux.detach())


# crisp with a different sparsity per layer (the layer number matters), intensity (reads the
# hidden states of its layer), cost (real-token means from the 2-D mask, losses per call)
CASES = [("bert", "crisp", {"sparsity": [0.2, 0.7]}), ("bert", "intensity", {}),
         ("bert", "cost", {"lam": 1e-2}), ("albert", "intensity", {}),
         ("deberta-v2", "intensity", {}), ("llama", "cost", {"lam": 1e-2})]


@pytest.mark.parametrize(("arch", "method", "opts"), CASES)
def test_threads_with_mixed_shapes_equal_sequential_calls(arch, method, opts):
    model = build(arch)
    attnprune.patch(model, method, **opts)
    xs = [_inputs(*s, seed=i) for i, s in enumerate(SHAPES)]
    expected = [_run(model, x) for x in xs]  # one call at a time
    errors: list[str] = []
    start = threading.Barrier(len(xs))

    def worker(i):
        start.wait()
        for r in range(ROUNDS):
            try:
                out, aux = _run(model, xs[i])
            except Exception as e:  # noqa: BLE001 (report, and let the other threads finish)
                errors.append(f"thread {i} round {r}: {type(e).__name__}: {e}")
                return
            ref_out, ref_aux = expected[i]
            if not torch.allclose(out, ref_out, atol=1e-6):
                errors.append(f"thread {i} round {r}: logits differ by "
                              f"{(out - ref_out).abs().max():.2e}")
            if (aux is None) != (ref_aux is None) or (
                    aux is not None and not torch.allclose(aux, ref_aux, atol=1e-6)):
                errors.append(f"thread {i} round {r}: aux loss {aux} vs {ref_aux}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:5]


def _attentions(model, ids, mask):
    return model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions


@pytest.mark.parametrize("method", list(NEUTRAL))
@pytest.mark.parametrize("arch", list(ARCHS))
def test_output_attentions_at_the_neutral_setting_equal_eager_stock(arch, method):
    """Compared at real query rows (DeBERTa's eager softmax zeroes padded query rows)."""
    ids, mask = _inputs(3, 12, 8, seed=1)
    stock = build(arch)
    stock.set_attn_implementation("eager")
    with torch.no_grad():
        ref = _attentions(stock, ids, mask)
        model = build(arch)
        attnprune.patch(model, method, **NEUTRAL[method])
        got = _attentions(model, ids, mask)
        attnprune.patch_state(model).enabled = False  # the stock path of the same patch
        off = _attentions(model, ids, mask)
    real = mask.bool()[:, None, :, None]  # (B, 1, Tq, 1)
    assert len(ref) == len(got) == len(off) == model.config.num_hidden_layers
    for g, o, r in zip(got, off, ref):
        assert g is not None and g.shape == r.shape
        assert ((g - r) * real).abs().max() <= 1e-5
        assert ((o - r) * real).abs().max() <= 1e-5


@pytest.mark.parametrize("arch", ["bert", "gpt2", "llama", "albert", "mpnet", "deberta-v2"])
def test_output_attentions_are_the_probabilities_the_method_used(arch):
    """crisp at sparsity 0.5 keeps ⌈0.5·n⌉ keys per row: the returned rows have that many
    non-zeros (the stock rows have none zero) and sum to 1."""
    ids, mask = _inputs(3, 12, None, seed=2)
    model = build(arch)
    attnprune.patch(model, "crisp", **ON["crisp"])
    with torch.no_grad():
        got = _attentions(model, ids, mask)
    causal = arch in ("gpt2", "llama")
    for probs in got:
        assert torch.allclose(probs.sum(-1), torch.ones(()), atol=1e-5)
        nonzero = (probs > 0).sum(-1)  # (B, H, Tq)
        n = torch.arange(1, 13) if causal else torch.full((12,), 12)  # keys each query sees
        assert torch.equal(nonzero, (n.float() * 0.5).ceil().long().expand_as(nonzero))


@pytest.mark.parametrize("arch", ["gpt2", "bert", "llama", "albert", "mpnet", "deberta-v2"])
def test_config_output_attentions_works_like_the_argument(arch):
    """``config.output_attentions = True`` raised transformers' "set it to 'eager'" (its
    setter knows only eager to return weights; the argument never meets that check): it now
    returns the same probabilities as the argument, in copies too, and unpatch gives the
    config its stock class back (whose setter refuses again on a non-eager back-end)."""
    ids, mask = _inputs(3, 12, 8, seed=3)
    model, by_argument = build(arch), build(arch)
    attnprune.patch(model, "crisp", **ON["crisp"])
    attnprune.patch(by_argument, "crisp", **ON["crisp"])
    stock_cls = type(build(arch).config)
    model.config.output_attentions = True
    # pickled before any forward: transformers' output-capturing hooks, installed by the
    # first forward asked for attentions (either way), are closures that do not pickle
    twin = pickle.loads(pickle.dumps(model))
    with torch.no_grad():
        ref = _attentions(by_argument, ids, mask)
        for m in (model, twin):
            got = m(input_ids=ids, attention_mask=mask).attentions
            assert got is not None and len(got) == len(ref)
            assert all(torch.equal(g, r) for g, r in zip(got, ref))
    assert twin.config.output_attentions and twin.config == model.config
    model.config.output_attentions = False
    attnprune.unpatch(model)
    assert type(model.config) is stock_cls
    if model.config._attn_implementation != "eager":
        with pytest.raises(ValueError, match="output_attentions"):
            model.config.output_attentions = True


def test_saved_config_of_a_model_asked_for_attentions_loads(tmp_path):
    """The flag describes the patched model's forward, not the stock base that
    ``save_pretrained`` writes (on "sdpa", transformers refuses to load it): it is left out."""
    model = build("gpt2")
    attnprune.patch(model, "crisp", **ON["crisp"])
    model.config.output_attentions = True
    attnprune.save_pretrained(model, tmp_path)
    loaded = attnprune.from_pretrained(tmp_path)
    ids, _ = _inputs(2, 10, None, seed=4)
    assert not loaded.config.output_attentions
    loaded.config.output_attentions = True  # patched again: the flag may be set again
    with torch.no_grad():
        a, b = loaded(input_ids=ids), model(input_ids=ids)
    assert torch.equal(a.logits, b.logits)
    assert all(torch.equal(x, y) for x, y in zip(a.attentions, b.attentions, strict=True))


@pytest.mark.parametrize(("arch", "method", "opts"), [("bert", "cost", {"lam": 1e-2}),
                                                      ("albert", "intensity", {})])
def test_a_nested_forward_leaves_the_outer_call_intact(arch, method, opts):
    """A hook inside the model's forward (after its first attention module) runs the same
    model on another batch: the outer call keeps its layer count, hidden states and losses."""
    model = build(arch)
    attnprune.patch(model, method, **opts)
    outer_x, inner_x = _inputs(3, 12, 8, seed=3), _inputs(2, 7, None, seed=4)
    ref, ref_inner = _run(model, outer_x), _run(model, inner_x)
    seen = {}

    def teacher(*_):
        if "inner" not in seen:  # once: the inner forward runs this hook too
            seen["inner"] = True
            seen["inner"] = _run(model, inner_x)

    first = next(m for m in model.modules() if "_attnprune_attention" in m.__dict__)
    first.register_forward_hook(teacher)
    out, aux = _run(model, outer_x)
    assert torch.allclose(out, ref[0], atol=1e-6)
    assert (aux is None) == (ref[1] is None) == (method != "cost")
    assert aux is None or torch.allclose(aux, ref[1], atol=1e-6)
    assert torch.allclose(seen["inner"][0], ref_inner[0], atol=1e-6)
