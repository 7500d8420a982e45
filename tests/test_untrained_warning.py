"""Issue 25 item 4: a decoder patched with a learned causal method (ltp, dtr, hybrid) that is
untrained keeps every token; it says so (once, at its first eval forward) instead of silently."""

from __future__ import annotations

import warnings

import pytest
import test_hf_causal
import test_hf_llama  # tests/ is on sys.path
import torch

import attnprune
from attnprune.hosts.hf_causal import UntrainedMethodWarning, _untrained_check

MODELS = {"llama": lambda: test_hf_llama.tiny("llama"), "gpt2": test_hf_causal.tiny}


def _forward(model):
    model(torch.randint(0, model.config.vocab_size, (2, 16)))


def _caught(fn) -> list:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [w for w in caught if issubclass(w.category, UntrainedMethodWarning)]


@pytest.mark.parametrize("family", list(MODELS))
@pytest.mark.parametrize("method", ["ltp", "ltp_causal", "dtr", "hybrid"])
def test_untrained_method_warns_once_naming_what_it_needs(family, method):
    model = attnprune.patch(MODELS[family](), method, keep_ratio=0.5)
    with pytest.warns(UntrainedMethodWarning, match=r"attnprune lm.*attnprune\.prefill\.generate"):
        _forward(model)
    assert attnprune.patch_state(model).stats["kept_per_layer"] == [1.0] * 4  # what it warns about
    assert not _caught(lambda: _forward(model))  # once


@pytest.mark.parametrize("method", ["ltp", "dtr", "hybrid"])
def test_no_warning_when_trained_loaded_off_or_training(method):
    # trained (or trained weights loaded after the patch, as from_pretrained does)
    model = attnprune.patch(MODELS["llama"](), method, keep_ratio=0.5)
    test_hf_causal.force_pruning(model)
    assert not _caught(lambda: _forward(model))
    # pruning off
    model = attnprune.patch(MODELS["llama"](), method, keep_ratio=1.0)
    assert not _caught(lambda: _forward(model))
    # training forwards do not count; the first eval forward does
    model = attnprune.patch(MODELS["llama"]().train(), method, keep_ratio=0.5)
    assert not _caught(lambda: _forward(model))
    model.eval()
    assert len(_caught(lambda: _forward(model))) == 1


def test_unpatch_removes_the_check():
    model = attnprune.patch(MODELS["gpt2"](), "ltp", keep_ratio=0.5)
    def checks():
        return [h for h in model._forward_hooks.values() if getattr(h, "func", None) is _untrained_check]

    assert len(checks()) == 1
    attnprune.unpatch(model)
    assert not checks() and not model._forward_hooks
