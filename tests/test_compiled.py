"""The GPU path that CUDA graphs capture, checked on the CPU (issue 30, item 1):

- the compiled pruned forward holds no CPU tensor when the model sits on another device (a CPU
  tensor in a graph keeps inductor's cudagraph trees from recording it): traced on the meta
  device, every node of the graph is on the meta device;
- ``attnprune.compile`` pads each batch to a bucket, so 20 batches of varied size compile a
  graph per bucket used and no more, and its outputs equal the model's own.
"""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification, BertModel

import attnprune
from attnprune import selection

SMALL = {"hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
         "intermediate_size": 64, "hidden_dropout_prob": 0.0,
         "attention_probs_dropout_prob": 0.0, "vocab_size": 100}


def _bert(cls=BertForSequenceClassification, device="cpu"):
    torch.manual_seed(0)
    kw = {"num_labels": 3} if cls is BertForSequenceClassification else {}
    with torch.device(device):
        return cls(BertConfig(**SMALL, **kw)).eval()


def _batch(B, L, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 100, (B, L), generator=g)
    mask = torch.ones(B, L, dtype=torch.long)
    for b in range(1, B):
        mask[b, max(L - 3 * b, 2):] = 0
    return ids.to(device), mask.to(device)


class GraphRecorder:
    """A ``torch.compile`` backend that keeps every graph it is given and runs it as is."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward


def compiled_graphs(model, **inputs) -> list:
    """The graphs ``torch.compile(model, fullgraph=True, dynamic=False)`` makes for one call on
    ``inputs`` (recorded, run as they are; dynamo reset before and after)."""
    rec = GraphRecorder()
    torch._dynamo.reset()
    try:
        torch.compile(model, backend=rec, fullgraph=True, dynamic=False)(**inputs)
    finally:
        torch._dynamo.reset()
    return rec.graphs


def _devices(gm) -> set[str]:
    out = set()
    for node in gm.graph.nodes:
        v = node.meta.get("example_value")
        for t in (v if isinstance(v, (tuple, list)) else (v,)):
            if isinstance(t, torch.Tensor):
                out.add(t.device.type)
    return out


@pytest.mark.parametrize("method, options", [
    ("attention_mass", {"keep_ratio": 0.25}),
    ("attention_mass", {"keep_ratio": 0.35, "variant": "cls"}),
    ("entropy", {"keep_ratio": 0.5}),
])
def test_compiled_pruned_graph_holds_no_cpu_tensor(method, options):
    """On 7de3402 ``selection.budget`` made ρ a 0-dim CPU float64 tensor inside the forward:
    the graph of a model on another device had a CPU node."""
    model = attnprune.patch(_bert(device="meta"), method, after_layer=1, **options)
    ids, mask = _batch(4, 24, device="meta")
    graphs = compiled_graphs(model, input_ids=ids, attention_mask=mask)
    assert len(graphs) == 1
    assert _devices(graphs[0]) == {"meta"}


def test_budget_makes_no_tensor_and_keeps_exact_ratios():
    n = torch.tensor([10, 64, 0, 3, 1000, 7])
    assert selection.budget(n, 0.7).tolist() == [7, 44, 0, 2, 700, 4]
    assert selection.budget(n, 0.35).tolist() == [3, 22, 0, 1, 350, 2]
    assert selection.budget(n, 1.0).tolist() == n.tolist()
    assert int(selection.budget(9, 1 / 3)) == 3
    with torch.device("meta"):  # nothing made on another device: meta in, meta out
        assert selection.budget(torch.tensor([10, 5]), 0.7).device.type == "meta"


@pytest.mark.parametrize("patched", [False, True])
def test_compile_buckets_keep_the_graph_count_flat_and_outputs_equal(patched):
    model = _bert()
    if patched:
        attnprune.patch(model, "attention_mass", keep_ratio=0.5, after_layer=1)
    rec = GraphRecorder()
    torch._dynamo.reset()
    try:
        fast = attnprune.compile(model, lengths=(16, 32), batch_sizes=(2, 8), backend=rec)
        g = torch.Generator().manual_seed(3)
        shapes = [(int(torch.randint(1, 9, (1,), generator=g)),
                   int(torch.randint(3, 33, (1,), generator=g))) for _ in range(20)]
        for i, (b, t) in enumerate(shapes):
            ids, mask = _batch(b, t, seed=i)
            got = fast(input_ids=ids, attention_mask=mask).logits
            with torch.no_grad():
                want = model(input_ids=ids, attention_mask=mask).logits
            assert got.shape == (b, 3)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
        used = {fast.shape_for(b, t) for b, t in shapes}
        assert len(rec.graphs) == len(used) <= 4
        before = len(rec.graphs)
        for i, (b, t) in enumerate(shapes):  # the same shapes again: nothing new compiles
            ids, mask = _batch(b, t, seed=i)
            fast(input_ids=ids, attention_mask=mask)
        assert len(rec.graphs) == before
    finally:
        torch._dynamo.reset()


def test_compile_cuts_per_token_outputs_and_chunks_large_batches():
    model = _bert(cls=BertModel)
    torch._dynamo.reset()
    try:
        fast = attnprune.compile(model, lengths=(16,), batch_sizes=(1, 2), backend="eager")
        ids, mask = _batch(5, 11)
        out = fast(input_ids=ids, attention_mask=mask)
        with torch.no_grad():
            want = model(input_ids=ids, attention_mask=mask)
    finally:
        torch._dynamo.reset()
    assert out.last_hidden_state.shape == (5, 11, 32)
    assert out.pooler_output.shape == (5, 32)
    torch.testing.assert_close(out.last_hidden_state, want.last_hidden_state, atol=1e-5,
                               rtol=1e-4)


def test_compile_refuses_what_it_cannot_serve():
    model = _bert()
    fast = attnprune.compile(model, lengths=(8,), backend="eager")
    ids, mask = _batch(2, 12)
    with pytest.raises(ValueError, match="lengths"):
        fast(input_ids=ids, attention_mask=mask)
    with pytest.raises(ValueError, match="labels"):
        fast(input_ids=ids[:, :8], attention_mask=mask[:, :8], labels=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="batch_sizes"):
        attnprune.compile(model, batch_sizes=(0, 4))
    with pytest.raises(TypeError, match="model"):
        attnprune.compile("bert")
