"""CUDA graphs without inductor (issue 46, item 3): ``attnprune.compile(...,
backend="cudagraphs")`` and its :class:`~attnprune.deploy.compiled.CUDAGraphRunner`.

On the CPU the runner takes a stand-in graph (``EagerGraph``: replay reruns the forward on the
static inputs and writes into the same output tensors, as a CUDA graph's replay does), wrapped
here to count captures and replays. That checks everything around the graph: one capture per
bucket, inputs copied into the static buffers, outputs cloned out (a later replay must not
change what a caller holds), outputs equal to eager for the full, pruned (sync-free path) and
half-depth models, and the refusals. The ``cuda`` tests capture for real (skipped here).
"""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification, BertModel

import attnprune
from attnprune.deploy.compiled import (
    BucketedModel,
    CUDAGraphRunner,
    EagerGraph,
    capture_problem,
)

SMALL = {"hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
         "intermediate_size": 64, "hidden_dropout_prob": 0.0,
         "attention_probs_dropout_prob": 0.0, "vocab_size": 100}
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


class RecordingGraph(EagerGraph):
    """The CPU stand-in, counting what the runner asks of it."""

    log: ClassVar[list[str]] = []

    def capture(self, fn, warmup):
        RecordingGraph.log.append(f"capture warmup={warmup}")
        return super().capture(fn, warmup)

    def replay(self):
        RecordingGraph.log.append("replay")
        super().replay()


@pytest.fixture
def log():
    RecordingGraph.log = []
    return RecordingGraph.log


def _bert(cls=BertModel, device="cpu", dtype=torch.float32):
    torch.manual_seed(0)
    kw = {"num_labels": 3} if cls is BertForSequenceClassification else {}
    return cls(BertConfig(**SMALL, **kw)).eval().to(device=device, dtype=dtype)


def _half(model):
    """The first half of the layers (the shallower model users try first)."""
    del model.encoder.layer[len(model.encoder.layer) // 2:]
    model.config.num_hidden_layers = len(model.encoder.layer)
    return model


def _variant(name, device="cpu", dtype=torch.float32):
    model = _bert(device=device, dtype=dtype)
    if name == "pruned":  # the GPU's path, on the CPU too
        attnprune.patch(model, "attention_mass", keep_ratio=0.5, after_layer=1, sync_free=True)
    elif name == "half":
        _half(model)
    return model


def _batch(B, L, seed=0, device="cpu", pad=True):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 100, (B, L), generator=g)
    mask = torch.ones(B, L, dtype=torch.long)
    if pad:
        for b in range(1, B):
            mask[b, max(L - 3 * b, 2):] = 0
    return ids.to(device), mask.to(device)


def _eager(model, **inputs):
    with torch.no_grad():
        return model(**inputs)


# ----------------------------------------------------------------------------- the runner
def test_one_capture_per_signature_inputs_copied_in_outputs_cloned_out(log):
    model = _variant("pruned")
    run = CUDAGraphRunner(model, warmup=2, graph=RecordingGraph)
    ids1, m1 = _batch(3, 16, seed=1)
    ids2, m2 = _batch(3, 16, seed=2)
    first = run(input_ids=ids1, attention_mask=m1)
    assert log == ["capture warmup=2", "replay"]
    static = next(iter(run.graphs.values()))
    # static buffers: the caller's tensors are copied, never kept
    assert static.inputs["input_ids"] is not ids1
    assert static.inputs["input_ids"].data_ptr() != ids1.data_ptr()
    held = first.last_hidden_state.clone()
    second = run(input_ids=ids2, attention_mask=m2)
    assert log == ["capture warmup=2", "replay", "replay"]  # same shape: no new capture
    # the second call's inputs reached the graph: its outputs are the eager ones of ids2
    torch.testing.assert_close(second.last_hidden_state,
                               _eager(model, input_ids=ids2, attention_mask=m2).last_hidden_state)
    # and what the first caller holds is theirs: the replay did not overwrite it
    torch.testing.assert_close(first.last_hidden_state, held, rtol=0, atol=0)
    torch.testing.assert_close(first.last_hidden_state,
                               _eager(model, input_ids=ids1, attention_mask=m1).last_hidden_state)
    assert first.last_hidden_state.data_ptr() != static.outputs.last_hidden_state.data_ptr()
    # changing the caller's input afterwards changes nothing either
    ids1.fill_(7)
    torch.testing.assert_close(first.last_hidden_state, held, rtol=0, atol=0)
    # a new shape, a new flag, no mask: each its own graph
    run(input_ids=ids1[:, :8], attention_mask=m1[:, :8])
    run(input_ids=ids2, attention_mask=m2, return_dict=True)
    run(input_ids=ids2)
    assert len(run.graphs) == 4 and log.count("capture warmup=2") == 4


def test_without_clone_the_outputs_are_the_graphs_own(log):
    run = CUDAGraphRunner(_variant("full"), graph=RecordingGraph, clone=False)
    ids1, m1 = _batch(2, 12, seed=1)
    ids2, m2 = _batch(2, 12, seed=2)
    a = run(input_ids=ids1, attention_mask=m1).last_hidden_state
    held = a.clone()
    b = run(input_ids=ids2, attention_mask=m2).last_hidden_state
    assert a is b and not torch.equal(a, held)  # the replay wrote over the first result


# ----------------------------------------------------------------------------- the buckets
@pytest.mark.parametrize("name", ["full", "pruned", "half"])
def test_buckets_capture_once_each_and_equal_eager(name, log):
    """Twelve batches of varied size through ``lengths=(16, 32)`` × ``batch_sizes=(2, 8)``: one
    capture per bucket used, one replay per batch, the model's own outputs."""
    model = _variant(name)
    fast = BucketedModel(model, CUDAGraphRunner(model, graph=RecordingGraph), (16, 32), (2, 8),
                         0, clone=False)
    g = torch.Generator().manual_seed(3)
    shapes = [(int(torch.randint(1, 9, (1,), generator=g)),
               int(torch.randint(3, 33, (1,), generator=g))) for _ in range(12)]
    for i, (b, t) in enumerate(shapes):
        ids, mask = _batch(b, t, seed=i)
        got = fast(input_ids=ids, attention_mask=mask).last_hidden_state
        want = _eager(model, input_ids=ids, attention_mask=mask).last_hidden_state
        assert got.shape == (b, t, 32)
        # the kept tokens' states (a pruned model's dropped tokens carry their last layer's)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    used = {fast.shape_for(b, t) for b, t in shapes}
    assert len(fast.compiled.graphs) == len(used) <= 4
    assert log.count("capture warmup=3") == len(used) and log.count("replay") == len(shapes)


def test_padding_without_a_mask_is_masked():
    """A batch shorter than its bucket and no attention_mask: the padding is masked (before,
    ``compile`` padded the ids and let the model attend to the pad tokens)."""
    model = _variant("full")
    ids, _ = _batch(2, 11, pad=False)
    want = _eager(model, input_ids=ids).last_hidden_state
    runner = CUDAGraphRunner(model, graph=EagerGraph)
    fast = BucketedModel(model, runner, (16,), (2,), 0, clone=False)
    torch.testing.assert_close(fast(input_ids=ids).last_hidden_state, want, atol=1e-5,
                               rtol=1e-4)
    assert "attention_mask" in {k[0] for k in next(iter(runner.graphs))}
    torch._dynamo.reset()
    try:
        compiled = attnprune.compile(model, lengths=(16,), batch_sizes=(2,), backend="eager")
        torch.testing.assert_close(compiled(input_ids=ids).last_hidden_state, want, atol=1e-5,
                                   rtol=1e-4)
    finally:
        torch._dynamo.reset()


def test_an_unpadded_batch_without_a_mask_gets_none():
    """Full-length rows and no mask (the bench's inputs): the graph gets no mask either, so the
    full model keeps its unmasked (flash) attention."""
    runner = CUDAGraphRunner(_variant("full"), graph=EagerGraph)
    fast = BucketedModel(runner.model, runner, (16,), (2,), 0, clone=False)
    ids, _ = _batch(2, 16, pad=False)
    fast(input_ids=ids)
    assert {k[0] for k in next(iter(runner.graphs))} == {"input_ids"}


# ----------------------------------------------------------------------------- refusals
def test_models_that_cannot_be_captured_are_refused_with_the_cause():
    assert capture_problem(_variant("full")) is None
    assert capture_problem(_variant("pruned")) is None
    m = attnprune.patch(_bert(), "attention_mass", keep_ratio=0.5, sync_free=False)
    with pytest.raises(ValueError, match="sync_free=False"):
        CUDAGraphRunner(m, graph=EagerGraph)
    m = attnprune.patch(_bert(), "ltp", keep_ratio=0.5)
    with pytest.raises(ValueError, match="'ltp' decides its kept count.*variable_budget"):
        CUDAGraphRunner(m, graph=EagerGraph)
    with pytest.raises(ValueError, match="warmup"):
        CUDAGraphRunner(_bert(), warmup=0)


def test_a_capture_that_meets_a_host_sync_names_it():
    class Syncing(EagerGraph):
        def capture(self, fn, warmup):
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    run = CUDAGraphRunner(_variant("full"), graph=Syncing)
    ids, mask = _batch(2, 8)
    with pytest.raises(RuntimeError, match="reads the device back.*sync-free path"):
        run(input_ids=ids, attention_mask=mask)
    assert run.graphs == {}


def test_a_forward_whose_shapes_follow_the_data_fails_on_the_stand_in():
    class Positives(torch.nn.Module):
        def forward(self, x):
            return x[x > 0]

    run = CUDAGraphRunner(Positives(), graph=EagerGraph)
    run(x=torch.tensor([1.0, -1.0, 2.0]))
    with pytest.raises(RuntimeError, match="changed shape"):
        run(x=torch.tensor([1.0, 3.0, 2.0]))


def test_compile_cudagraphs_checks_its_options_and_device():
    model = _bert()
    with pytest.raises(ValueError, match="cudagraphs.*CUDA device.*cpu"):
        attnprune.compile(model, backend="cudagraphs")
    with pytest.raises(ValueError, match="mode: torch.compile options"):
        attnprune.compile(model, backend="cudagraphs", mode="reduce-overhead")
    with pytest.raises(ValueError, match="warmup"):
        attnprune.compile(model, warmup=2)
    with pytest.raises(ValueError, match="CUDA device"):  # the default graph needs CUDA inputs
        CUDAGraphRunner(model)(input_ids=torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="past: a captured forward takes tensors"):
        CUDAGraphRunner(model, graph=EagerGraph)(input_ids=torch.zeros(1, 4, dtype=torch.long),
                                                 past=[1])


# ----------------------------------------------------------------------------- on a GPU
@CUDA
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["full", "pruned", "half"])
def test_cuda_capture_equals_eager_and_keeps_results(name, dtype):
    model = _variant(name, device="cuda", dtype=dtype)
    if name == "pruned":  # the GPU's default path: sync-free without asking
        attnprune.patch(model, "attention_mass", keep_ratio=0.5, after_layer=1)
    fast = attnprune.compile(model, lengths=(16, 32), batch_sizes=(2, 4), backend="cudagraphs")
    tol = {"atol": 1e-5, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    held = []
    for i, (b, t) in enumerate([(2, 16), (3, 20), (2, 16), (4, 32), (1, 5)]):
        ids, mask = _batch(b, t, seed=i, device="cuda")
        got = fast(input_ids=ids, attention_mask=mask).last_hidden_state
        want = _eager(model, input_ids=ids, attention_mask=mask).last_hidden_state
        torch.testing.assert_close(got, want, **tol)
        held.append((got, got.clone()))
    for got, copy in held:  # no later replay wrote over an earlier result
        torch.testing.assert_close(got, copy, rtol=0, atol=0)
    assert len(fast.compiled.graphs) == 3


@CUDA
def test_cuda_capture_of_a_host_sync_names_the_cause():
    class Reads(torch.nn.Module):
        def forward(self, x):
            return x * int(x.sum().item())

    run = CUDAGraphRunner(Reads())
    with pytest.raises(RuntimeError, match="reads the device back"):
        run(x=torch.ones(4, device="cuda"))
