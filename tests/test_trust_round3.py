"""Issue 48 ("Trust, round three"), item 3: crisp's state through transformers' missing-weights
loader (the planted-bug tests of item 4 live beside their modules' tests: test_measure.py,
test_prefill.py)."""

from __future__ import annotations

import copy
import re

import pytest
import torch
from transformers import (
    MistralConfig,
    MistralForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    set_seed,
)

import attnprune

SMALL = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}


def _crisp_class(base):
    """``base`` whose ``__init__`` patches the model with adaptive crisp, so that transformers'
    loader builds the patched model itself (on the meta device) and fills what is missing."""

    class Patched(base):
        def __init__(self, config):
            super().__init__(config)
            attnprune.patch(self, "crisp", sparsity=0.5, schedule="adaptive")

    Patched.__name__ = Patched.__qualname__ = f"Crisp{base.__name__}"
    return Patched


@pytest.mark.parametrize("config_cls, base", [(Qwen2Config, Qwen2ForCausalLM),
                                              (MistralConfig, MistralForCausalLM)],
                         ids=["qwen2", "mistral"])
def test_crisp_state_is_initialised_when_transformers_fills_missing_weights(config_cls, base):
    """transformers' ``test_can_init_all_missing_weights``, patched: a seeded
    ``_initialize_weights``, the model built from its config against
    ``from_pretrained(None, config=..., state_dict={})`` (every key missing: moved off the meta
    device with ``torch.empty_like``, then left to ``_init_weights``, which knows only
    transformers' module types). Nothing may stay on meta, the keys match, every value is equal
    (buffers too, which transformers' version skips as possibly random), and crisp's
    ``entropy_ema`` holds its documented start, 0.5 in every layer (it was uninitialised memory,
    which ``schedule="adaptive"`` then read)."""
    config = config_cls(**SMALL)
    cls = _crisp_class(base)
    original = PreTrainedModel._initialize_weights

    def seeded(self, module, *args, **kwargs):
        set_seed(0)
        original(self, module, *args, **kwargs)

    PreTrainedModel._initialize_weights = seeded
    try:
        from_config = cls(copy.deepcopy(config))
        from_pretrained = cls.from_pretrained(None, config=config, state_dict={})
    finally:
        PreTrainedModel._initialize_weights = original
    on_meta = [k for k, v in [*from_pretrained.named_parameters(), *from_pretrained.named_buffers()]
               if v.device.type == "meta"]
    assert on_meta == []
    a, b = from_config.state_dict(), from_pretrained.state_dict()
    assert list(a) == list(b)
    different = [k for k in a if not re.search(r"\.parametrizations\..*?\.original[01]", k)
                 and not torch.equal(a[k], b[k])]
    assert different == []
    assert from_pretrained.attnprune_method.entropy_ema.tolist() == [0.5, 0.5]
    assert from_pretrained.attnprune_method.layer_sparsity() == pytest.approx([0.5, 0.5])


def test_crisp_checkpoint_values_still_win_over_the_initial_value(tmp_path):
    """The same loader with the EMA in the checkpoint keeps the trained values (they arrive
    marked as loaded), and so does ``load_state_dict(assign=True)`` onto a meta-device model."""
    config = Qwen2Config(**SMALL)
    cls = _crisp_class(Qwen2ForCausalLM)
    trained = cls(config).state_dict()
    trained["attnprune_method.entropy_ema"] = torch.tensor([0.2, 0.7])
    loaded = cls.from_pretrained(None, config=config, state_dict=trained)
    assert loaded.attnprune_method.entropy_ema.tolist() == pytest.approx([0.2, 0.7])
    with torch.device("meta"):
        meta = cls(config)
    assert meta.attnprune_method.entropy_ema.is_meta
    meta.load_state_dict(trained, assign=True)
    assert meta.attnprune_method.entropy_ema.tolist() == pytest.approx([0.2, 0.7])
