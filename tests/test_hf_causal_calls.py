"""The causal hosts' one patch mechanism and per-call state: the inner model keeps its stock
class (a forward replaced by a partial), copies and pickles are independent models, and
threads calling one patched model each read their own losses, actions and statistics."""

from __future__ import annotations

import copy
import io
import json
import pickle
import threading

import pytest
import torch
from test_hf_causal import force_pruning  # tests/ is on sys.path
from test_hf_causal import tiny as tiny_gpt2
from test_hf_llama import tiny as tiny_llama

import attnprune


def _torch_round_trip(model):
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


ROUND_TRIPS = {
    "pickle": lambda m: pickle.loads(pickle.dumps(m)),
    "deepcopy": copy.deepcopy,
    "torch": _torch_round_trip,
}
BUILDERS = {"gpt2": tiny_gpt2, "llama": tiny_llama}


def _ids(B=2, L=24, seed=3):
    return torch.randint(0, 40, (B, L), generator=torch.Generator().manual_seed(seed))


def _logits(model, x):
    with torch.no_grad():
        return model(x).logits


@pytest.mark.parametrize("how", list(ROUND_TRIPS))
@pytest.mark.parametrize("family", list(BUILDERS))
def test_inner_model_keeps_its_stock_class_and_round_trips(family, how):
    model = BUILDERS[family]()
    stock = type(model.base_model)
    attnprune.patch(model, "ltp", keep_ratio=0.5)
    force_pruning(model)
    assert type(model.base_model) is stock  # no generated subclass
    x = _ids()
    ref = _logits(model, x)
    kept = attnprune.patch_state(model).stats["kept_per_layer"]
    loaded = ROUND_TRIPS[how](model)
    assert type(loaded.base_model) is stock
    state, mine = attnprune.patch_state(loaded), attnprune.patch_state(model)
    assert state is not None and state is not mine
    assert torch.equal(_logits(loaded, x), ref)
    assert min(state.stats["kept_per_layer"]) < 1.0  # the loaded model prunes
    _logits(loaded, _ids(B=1, L=9, seed=4))  # another batch on the copy only
    assert mine.stats["kept_per_layer"] == kept  # the original's statistics are its own
    attnprune.unpatch(loaded)
    assert "forward" not in loaded.base_model.__dict__  # the stock forward shows through
    assert not torch.equal(_logits(loaded, x), ref)
    assert torch.equal(_logits(model, x), ref)  # the original is still patched


def _per_thread_results(model, batches, barrier=None):
    """{i: (aux loss, stats, actions' row counts)} of one training forward per batch, each
    in its own thread when ``barrier`` is given (both forwards meet inside the last block,
    after every decision, and again before reading), else one after the other."""
    results = {}

    def work(i, x):
        try:
            out = model(x, labels=x)
        except BaseException:
            if barrier is not None:
                barrier.abort()  # the other thread stops waiting too
            raise
        if barrier is not None:
            barrier.wait()  # both forwards have finished: a shared state now holds the last one's
        state = attnprune.patch_state(model)
        results[i] = (attnprune.aux_loss(model).detach(), state.stats,
                      [a["index"].shape[0] for a in state.actions], out.loss.detach())

    if barrier is None:
        for i, x in enumerate(batches):
            work(i, x)
        return results
    threads = [threading.Thread(target=work, args=(i, x)) for i, x in enumerate(batches)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


@pytest.mark.parametrize("method", ["ltp", "dtr"])
def test_threads_calling_one_model_read_their_own_losses_and_stats(method):
    model = tiny_gpt2()
    attnprune.patch(model, method, keep_ratio=0.5)
    force_pruning(model)
    model.train()
    # different batch sizes: mixed-up actions would show their rows
    batches = [_ids(B=2, L=24, seed=5), _ids(B=3, L=20, seed=6)]
    torch.manual_seed(0)
    alone = _per_thread_results(model, batches)
    barrier = threading.Barrier(2, timeout=120)  # the timeout only stops a hang on failure

    def meet(module, args):
        barrier.wait()  # returns None: the block's inputs stay

    hook = model.transformer.h[-1].register_forward_pre_hook(meet)
    try:
        together = _per_thread_results(model, batches, barrier)
    finally:
        hook.remove()
    assert set(together) == {0, 1}
    for i in (0, 1):
        aux, stats, rows, loss = together[i]
        assert rows == [batches[i].shape[0]] * len(rows)
        assert stats["n_tokens"] == batches[i].numel()
        if method == "ltp":  # deterministic in training: the same numbers as alone
            torch.testing.assert_close(aux, alone[i][0])
            assert stats == alone[i][1]
            torch.testing.assert_close(loss, alone[i][3])
        else:  # DTR samples its actions: the same number of losses and actions as alone
            assert len(rows) == len(alone[i][2]) and torch.isfinite(aux)


def test_bare_inner_model_saves_under_its_stock_name_and_reloads(tmp_path):
    # save_pretrained writes type(model).__name__: with the class kept, the stock name
    model = tiny_gpt2().transformer
    attnprune.patch(model, "ltp", keep_ratio=0.5)
    with torch.no_grad():
        lt = model.attnprune_method
        lt.w.copy_(torch.randn(lt.w.shape, generator=torch.Generator().manual_seed(2)) * 2.0)
        lt.b.zero_()
    x = _ids()
    with torch.no_grad():
        ref = model(x).last_hidden_state
    attnprune.save_pretrained(model, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["architectures"] == ["GPT2Model"]
    loaded = attnprune.from_pretrained(tmp_path / "m")
    assert type(loaded).__name__ == "GPT2Model"
    assert min(attnprune.patch_state(model).stats["kept_per_layer"]) < 1.0  # it prunes
    with torch.no_grad():
        torch.testing.assert_close(loaded(x).last_hidden_state, ref)
