"""A patched model pickles: ``torch.save`` / ``torch.load(weights_only=False)`` and
``pickle`` give back a model with the same outputs, still patched, with its own patch state.

Every family of the causal rotary host (``hf_llama``: the stock class, whose forward is a
partial over the patch state) and of the attention host (ALBERT's depth rule in the
family table, MPNet's and DeBERTa's score adapters on the attention modules)."""

from __future__ import annotations

import io
import pickle

import pytest
import torch
from test_attention_families import ARCHS, ON, batch, build, outputs  # tests/ is on sys.path
from test_hf_causal import force_pruning
from test_hf_llama import DECODERS, V, tiny

import attnprune


def _torch_round_trip(model):
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def _pickle_round_trip(model):
    return pickle.loads(pickle.dumps(model))


ROUND_TRIPS = {"torch": _torch_round_trip, "pickle": _pickle_round_trip}


def _causal_out(model):
    x = torch.randint(0, V, (2, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        return model(x).logits


CAUSAL = [(f, "ltp") for f in DECODERS] + [("llama", "dtr"), ("llama", "hybrid")]


@pytest.mark.parametrize("how", list(ROUND_TRIPS))
@pytest.mark.parametrize(("family", "method"), CAUSAL)
def test_causal_rotary_patch_round_trips(family, method, how):
    model = tiny(family)
    attnprune.patch(model, method, keep_ratio=0.5)
    force_pruning(model)
    ref = _causal_out(model)
    loaded = ROUND_TRIPS[how](model)
    assert type(loaded.base_model) is type(model.base_model)  # the stock class
    state = attnprune.patch_state(loaded)
    assert state is not None and state is not attnprune.patch_state(model)
    assert torch.equal(_causal_out(loaded), ref)
    assert min(state.stats["kept_per_layer"]) < 1.0  # the loaded model prunes
    stock = type(tiny(family).base_model)
    attnprune.unpatch(loaded)
    assert type(loaded.base_model) is stock
    assert not torch.equal(_causal_out(loaded), ref)


# crisp on every family; the methods with parameters and hooks (intensity: hidden states and
# predictors; cost: FFN hooks and losses) on the families with adapters and shared layers
ATTENTION = ([(a, "crisp") for a in ARCHS]
             + [(a, m) for a in ("bert", "albert", "mpnet", "deberta-v2", "llama")
                for m in ("intensity", "cost")])


@pytest.mark.parametrize("how", list(ROUND_TRIPS))
@pytest.mark.parametrize(("arch", "method"), ATTENTION)
def test_attention_patch_round_trips(arch, method, how):
    # Round trip before any call with output_hidden_states (which ``outputs`` reads): HF then
    # installs a local-function hook, and a stock model no longer pickles either.
    ids, mask = batch()
    with torch.no_grad():
        stock = outputs(build(arch), ids, mask)  # seeded: the same weights as ``model``
    model = build(arch)
    attnprune.patch(model, method, **ON[method])
    loaded = ROUND_TRIPS[how](model)
    state = attnprune.patch_state(loaded)
    assert state is not None and state is not attnprune.patch_state(model)
    with torch.no_grad():
        ref = outputs(model, ids, mask)
        ref_aux = attnprune.aux_loss(model)
        assert torch.equal(outputs(loaded, ids, mask), ref)
        aux = attnprune.aux_loss(loaded)
    assert (aux is None) == (ref_aux is None)
    if aux is not None:
        assert torch.equal(aux, ref_aux)
    if method != "cost":  # cost changes the loss, not the outputs
        assert not torch.allclose(ref, stock, atol=1e-5)  # the method acts, and still does
    attnprune.unpatch(loaded)
    with torch.no_grad():
        assert torch.allclose(outputs(loaded, ids, mask), stock, atol=1e-5)
