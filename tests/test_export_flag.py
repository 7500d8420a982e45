"""No export path inside torch.compile, on any supported torch (issue 46, item 2).

Up to torch 2.11 dynamo answers a traced ``torch.compiler.is_exporting()`` with True inside any
compiled function (pytorch#176347). The encoder host branched on it, so under plain
``torch.compile`` on the GPU image it took the export path (``_traced_width``, an ``.item()``):
a pruned tiny BERT compiled into 6 graphs instead of 1. ``tests/conftest.py``'s
``fake_exporting`` reproduces the bug on this torch; these tests check

- that the fake does fake (so the rest cannot pass by a no-op simulation);
- ``hf_encoder_paths.exporting()`` is False inside torch.compile, with and without the fake, and
  True under torch.export (strict and non-strict), so ONNX keeps the exact widths;
- a pruned model (drop and merge) compiles into one graph under the fake, on the meta device.
  On the old ``_exporting`` (``torch.compiler.is_exporting() or torch.jit.is_tracing()``) this
  fails with "Tensor.item() cannot be called on meta tensors".
"""

from __future__ import annotations

import pytest
import torch

import attnprune
from attnprune.hosts import hf_encoder_paths

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _compiled(fn, *args):
    torch._dynamo.reset()
    try:
        return torch.compile(fn, backend="eager", fullgraph=True)(*args)
    finally:
        torch._dynamo.reset()


def _branch_on(check):
    def f(x):
        return x + 1 if check() else x
    return f


def test_the_fake_makes_is_exporting_true_inside_compile(fake_exporting):
    x = torch.zeros(2)
    assert not torch.compiler.is_exporting()  # eager: the real answer
    assert _compiled(_branch_on(lambda: torch.compiler.is_exporting()), x).eq(1).all()


@pytest.mark.parametrize("fake", [False, True], ids=["real", "torch211-fake"])
def test_exporting_is_false_inside_compile(fake, request):
    if fake:
        request.getfixturevalue("fake_exporting")
    x = torch.zeros(2)
    assert not hf_encoder_paths.exporting()
    assert _compiled(_branch_on(hf_encoder_paths.exporting), x).eq(0).all()


class _Branches(torch.nn.Module):
    def forward(self, x):
        return x * 2 if hf_encoder_paths.exporting() else x * 3


@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])
@pytest.mark.parametrize("fake", [False, True], ids=["real", "torch211-fake"])
def test_exporting_is_true_under_torch_export(strict, fake, request):
    if fake:
        request.getfixturevalue("fake_exporting")
    x = torch.ones(2, 3)
    program = torch.export.export(_Branches(), (x,), strict=strict)
    assert program.module()(x).eq(2).all()  # the export branch was traced
    assert not hf_encoder_paths.exporting()  # and off again after


class _Recorder:
    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward


@pytest.mark.parametrize("method, options", [
    ("attention_mass", {"keep_ratio": 0.25}),
    ("entropy", {"keep_ratio": 0.5}),
    ("tome", {"keep_ratio": 0.5, "schedule": "linear"}),
    ("attention_mass", {"keep_ratio": 0.25, "reduce": "merge"}),
])
def test_pruned_model_compiles_into_one_graph_under_the_fake(method, options, fake_exporting):
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                     intermediate_size=64, vocab_size=100, num_labels=3,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    with torch.device("meta"):
        model = BertForSequenceClassification(cfg).eval()
    attnprune.patch(model, method, after_layer=1, **options)
    ids = torch.randint(5, 100, (4, 24)).to("meta")
    mask = torch.ones(4, 24, dtype=torch.long).to("meta")
    rec = _Recorder()
    torch._dynamo.reset()
    try:
        torch.compile(model, backend=rec, fullgraph=True, dynamic=False)(
            input_ids=ids, attention_mask=mask)
    finally:
        torch._dynamo.reset()
    assert len(rec.graphs) == 1
