"""The encoder host's per-call state: a forward run inside another forward of the same patched
model (a teacher pass in a hook) and forwards on several threads each keep their own kept mask,
statistics and inputs."""

from __future__ import annotations

import threading

import pytest
import torch
from test_hf_encoder import batch, make  # tests/ is on sys.path

import attnprune

SEP = 7  # a separator id in the middle of the outer batch: kept only if its ids reach the loop
OPTS = {"keep_ratio": 0.5, "after_layer": 1, "protect_token_ids": [SEP]}


def _with_separator(x):
    ids, am = x
    ids = ids.clone()
    ids[:, 2] = SEP
    return ids, am


def _counts(stats) -> dict:
    """The statistics without the timers."""
    return {k: v for k, v in dict(stats).items() if not k.endswith("_time_s")}


def _alone(model, ids, am):
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=am)
    state = attnprune.patch_state(model)
    return out.last_hidden_state, out.kept_mask, _counts(state.stats)


@pytest.mark.parametrize("where", ["embeddings", "encoder", "layer"])
def test_a_nested_forward_leaves_the_outer_call_intact(where):
    """A hook inside the model's forward (before the encoder, on the encoder's entry, after
    the pruning layer) runs the same model on another batch: the outer call keeps its inputs
    (its separators stay protected), its kept mask and its statistics."""
    model = make("bert_model")
    attnprune.patch(model, "attention_mass", **OPTS)
    outer_x, inner_x = _with_separator(batch(3, 12)), batch(2, 7)
    ref = _alone(model, *outer_x)
    ref_inner = _alone(model, *inner_x)
    seen = {}

    def teacher(*_):
        if "inner" not in seen:  # once: the inner forward runs this hook too
            seen["inner"] = True
            seen["inner"] = _alone(model, *inner_x)

    module = {"embeddings": model.embeddings, "encoder": model.encoder,
              "layer": model.encoder.layer[2]}[where]
    if where == "encoder":
        module.register_forward_pre_hook(teacher)
    else:
        module.register_forward_hook(teacher)
    hidden, kept, stats = _alone(model, *outer_x)
    assert bool(ref[1][:, 2].all())  # the separator is kept
    assert torch.equal(kept, ref[1]) and torch.equal(attnprune.patch_state(model).kept_mask, ref[1])
    assert stats == ref[2]
    assert torch.allclose(hidden, ref[0], atol=1e-6)
    inner = seen["inner"]
    assert torch.equal(inner[1], ref_inner[1]) and inner[2] == ref_inner[2]


def test_threads_read_their_own_kept_mask_and_stats():
    """Two threads run one patched model on batches of different shapes, both forwards done
    before either reads: each reads its own call's kept mask and statistics."""
    model = make("bert_model")
    attnprune.patch(model, "attention_mass", **OPTS)
    xs = {"a": batch(1, 9), "b": batch(3, 12)}
    ref = {k: _alone(model, *x) for k, x in xs.items()}
    both_ran = threading.Barrier(2)
    seen, errors = {}, []

    def work(name):
        try:
            ids, am = xs[name]
            with torch.no_grad():
                out = model(input_ids=ids, attention_mask=am)
            both_ran.wait(timeout=600)
            state = attnprune.patch_state(model)
            seen[name] = (out.kept_mask, state.kept_mask, _counts(state.stats))
        except Exception as e:  # noqa: BLE001 (reported by the test)
            errors.append(repr(e))
            both_ran.abort()

    threads = [threading.Thread(target=work, args=(n,)) for n in xs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for name, (out_kept, state_kept, stats) in seen.items():
        assert torch.equal(out_kept, ref[name][1]) and torch.equal(state_kept, ref[name][1])
        assert stats == ref[name][2], name


def test_a_rank_loss_waits_for_its_threads_next_forward_only():
    """``set_rank_loss`` gives the calling thread's next training forward the loss (kept on the
    thread's calls, :class:`attnprune.hosts.Calls`): not another thread's forward, not the one
    after; a loss set during a forward waits for the next one, and an encoder-only call in
    between does not take it."""
    model = make("bert_model")
    attnprune.patch(model, "attention_mass", **OPTS)
    state = attnprune.patch_state(model)
    model.train()
    ids, am = batch(3, 12)
    taken = []

    def loss(student, mask):
        taken.append(threading.get_ident())
        return student.sum() * 0

    def forward():
        model(input_ids=ids, attention_mask=am)
        return len(state.aux_losses)

    state.set_rank_loss(loss)
    other = threading.Thread(target=forward)
    other.start()
    other.join()
    assert taken == []  # another thread's forward: not its loss
    model.encoder(model.embeddings(ids))  # the encoder alone: a call of its own, no rank loss
    assert taken == []
    assert forward() == 1 and taken == [threading.get_ident()]
    assert forward() == 0 and len(taken) == 1  # the next forward only

    handle = model.embeddings.register_forward_hook(lambda *a: state.set_rank_loss(loss))
    forward()  # set during this forward: waits for the next one
    handle.remove()
    assert len(taken) == 1
    assert forward() == 1 and len(taken) == 2
    state.set_rank_loss(loss)
    state.set_rank_loss(None)  # withdrawn
    assert forward() == 0 and len(taken) == 2
