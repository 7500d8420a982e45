"""The one per-call state and the one patch mechanism every host uses (attnprune.hosts)."""

import copy
import pickle
import threading

import pytest
import torch
from torch import nn

from attnprune.hosts import (
    CallData,
    Calls,
    PatchState,
    bracket_calls,
    replace_forward,
    restore_forward,
)


class _Data(CallData):
    def __init__(self) -> None:
        super().__init__()
        self.seen = None


def _fill(state, data, module, args, kwargs):
    data.seen = args[0].shape[0]


def _forward(state, original, x):
    data = state.calls.current()
    data.stats = {"rows": data.seen}
    if x.shape[0] == 3:
        raise RuntimeError("planted")
    return original(x) * 2


def _patched():
    model = nn.Linear(2, 2)
    state = PatchState("test")
    state.calls = Calls(_Data)
    bracket_calls(model, state, state.calls, _fill)
    replace_forward(model, _forward, state)
    return model, state


def test_a_call_leaves_its_data_for_its_caller_and_nothing_running():
    model, state = _patched()
    model(torch.ones(4, 2))
    assert not state.calls.running()
    assert state.calls.last().stats == {"rows": 4}


def test_a_forward_that_raises_ends_its_call():
    model, state = _patched()
    with pytest.raises(RuntimeError, match="planted"):
        model(torch.ones(3, 2))
    assert not state.calls.running()
    model(torch.ones(5, 2))
    assert state.calls.last().stats == {"rows": 5}


def test_threads_read_their_own_calls():
    model, state = _patched()
    seen = {}
    barrier = threading.Barrier(2)

    def work(n):
        barrier.wait()
        model(torch.ones(n, 2))
        seen[n] = state.calls.last().stats["rows"]

    threads = [threading.Thread(target=work, args=(n,)) for n in (6, 7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {6: 6, 7: 7}


def test_copies_and_pickles_are_independent_and_restore_removes_the_forward():
    model, state = _patched()
    model(torch.ones(2, 2))
    twin = copy.deepcopy(model)
    twin_state = twin.forward.args[0]
    assert twin_state is not state and twin_state.calls.last() is None
    twin(torch.ones(8, 2))
    assert state.calls.last().stats == {"rows": 2}
    assert twin_state.calls.last().stats == {"rows": 8}
    back = pickle.loads(pickle.dumps(model))
    x = torch.ones(1, 2)
    torch.testing.assert_close(back(x), model(x))
    expected = nn.Linear.forward(model, x)
    restore_forward(model)
    torch.testing.assert_close(model(x), expected)


def test_data_read_outside_a_bracketed_forward_is_not_a_running_call():
    """A submodule run on its own reads a loose call; it never stays on the stack, where it
    would look like a running call and take the place of the next forward's."""
    model, state = _patched()
    loose = state.calls.current()  # what a hook on a submodule called alone would read
    assert not state.calls.running()
    model(torch.ones(4, 2))
    assert state.calls.current() is not loose and not state.calls.running()
    assert state.calls.last().stats == {"rows": 4}
