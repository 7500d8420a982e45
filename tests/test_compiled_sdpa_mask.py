"""The compiled full model runs a fused SDPA kernel on an unpadded batch (issue 46, item 1).

transformers 5.24 asks ``torch.compiler.is_exporting()`` before dropping the all-ones / absent
mask of an unpadded batch; torch 2.11's dynamo answers True inside any compile (``fake_exporting``
in conftest reproduces it here). transformers 5.17 (the GPU image's) asks
``is_tracing(padding_mask)`` instead, True inside any compile on every torch. Either way the
compiled graph handed SDPA an expanded (B, 1, T, T) bool mask with a stride-0 last dimension,
which no fused CUDA kernel takes (the math path, in fp32, on the H200). These tests read the
compiled graph's SDPA calls and fail on such a mask; ``compat.fix_transformers_exporting``
(applied by ``attnprune.compile`` and ``bench gpu --compile``) makes the mask None, as in eager.
``make test-transformers-5.17`` runs them under 5.17 too.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import BertConfig, BertModel

from attnprune import compat

SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
         "intermediate_size": 64, "vocab_size": 100, "attn_implementation": "sdpa"}


class _Recorder:
    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward


def sdpa_masks(gm) -> list:
    """The ``attn_mask`` of every SDPA call in a dynamo graph: None or its fake tensor."""
    out = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in (
                F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention):
            mask = node.kwargs.get("attn_mask", node.args[3] if len(node.args) > 3 else None)
            out.append(None if mask is None else mask.meta.get("example_value"))
    return out


def bad_masks(masks) -> list[str]:
    """The masks no fused CUDA kernel takes: expanded (a stride 0) or last stride ≠ 1."""
    bad = []
    for m in masks:
        if m is not None and (0 in m.stride() or m.stride()[-1] != 1):
            bad.append(f"shape {tuple(m.shape)} stride {m.stride()}")
    return bad


def _compiled_masks(with_mask: bool):
    torch.manual_seed(0)
    model = BertModel(BertConfig(**SMALL)).eval()
    ids = torch.randint(5, 100, (2, 16))
    kw = {"attention_mask": torch.ones_like(ids)} if with_mask else {}
    rec = _Recorder()
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            torch.compile(model, backend=rec, fullgraph=True, dynamic=False)(input_ids=ids, **kw)
    finally:
        torch._dynamo.reset()
    assert len(rec.graphs) == 1
    masks = sdpa_masks(rec.graphs[0])
    assert len(masks) == SMALL["num_hidden_layers"]
    return masks


@pytest.fixture
def fixed():
    undo = compat.fix_transformers_exporting()
    yield
    undo()


@pytest.mark.parametrize("with_mask", [False, True], ids=["no-mask", "all-ones-mask"])
def test_unpadded_batch_gets_no_expanded_mask(with_mask, fixed):
    assert bad_masks(_compiled_masks(with_mask)) == []


@pytest.mark.parametrize("with_mask", [False, True], ids=["no-mask", "all-ones-mask"])
def test_unpadded_batch_gets_no_expanded_mask_under_torch211(with_mask, fixed, fake_exporting):
    masks = _compiled_masks(with_mask)
    assert bad_masks(masks) == []
    if not with_mask:
        assert masks == [None] * len(masks)  # no bias to read at all: flash attention


def test_the_check_catches_torch211s_expanded_mask(fake_exporting, monkeypatch):
    """Without the fix, under the fake: the mask transformers builds is expanded (on 5.17 with
    or without the fake)."""
    from transformers import masking_utils
    from transformers.utils import import_utils

    # the original, whatever an attnprune.compile earlier in the session left there
    name = ("is_torchdynamo_exporting" if hasattr(masking_utils, "is_torchdynamo_exporting")
            else "is_tracing")  # transformers 5.17
    monkeypatch.setattr(masking_utils, name, getattr(import_utils, name))
    assert bad_masks(_compiled_masks(False)), "expected the stride-0 mask of torch 2.11"
