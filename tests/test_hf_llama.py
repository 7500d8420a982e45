"""The causal host on tiny random Llama-family decoders (every family in the table):
parity, real skipping, original RoPE positions, no leakage, KV cache, gradients, refusals."""

from __future__ import annotations

import pytest
import torch
import transformers as tf
from test_hf_causal import (  # tests/ is on sys.path
    check_dropped_tokens_skip_later_blocks,
    check_gradients_reach_the_policy,
    check_gradients_reach_thresholds,
    check_kv_cache_matches_full_recompute,
    check_no_leakage_from_the_future,
    check_padding_mask_matches_unpadded_rows,
    force_pruning,
)

import attnprune
from attnprune.hosts.families import rotary_families
from attnprune.research.lm import generate

V = 40
# model_type → (config class, LM class, extra config fields). Gemma and Qwen3 set head_dim
# explicitly (their defaults are 256 and 128); Gemma2's window is set beyond the test lengths.
DECODERS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 64}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 8}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 8}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 8, "sliding_window": 64}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {}),
}
FAMILY_NAMES = list(DECODERS)
METHODS = ["ltp", "dtr", "hybrid"]


def test_every_family_in_the_table_is_tested():
    assert set(rotary_families()) == set(DECODERS)


def tiny(family: str = "llama", n_layer: int = 4, seed: int = 0, **extra):
    conf_name, lm_name, fields = DECODERS[family]
    torch.manual_seed(seed)
    conf = getattr(tf, conf_name)(
        vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=n_layer,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=0, bos_token_id=0, eos_token_id=0, **{**fields, **extra})
    return getattr(tf, lm_name)(conf).eval()


def patched(family: str, method: str = "ltp", **kw):
    model = tiny(family)
    attnprune.patch(model, method, **kw)
    force_pruning(model)
    return model


@pytest.mark.parametrize("family", FAMILY_NAMES)
@pytest.mark.parametrize("method", METHODS)
def test_pruning_off_equals_stock(family, method):
    model = tiny(family)
    x = torch.randint(0, V, (2, 24))
    ref = model(x).logits
    stock_cls = type(model.base_model)
    attnprune.patch(model, method, keep_ratio=1.0)
    force_pruning(model)  # decisive scorers, but pruning is off
    assert type(model.base_model) is stock_cls  # the forward is replaced, not the class
    assert "forward" in vars(model.base_model)
    assert (model(x).logits - ref).abs().max() <= 1e-5
    attnprune.unpatch(model)
    assert type(model.base_model) is stock_cls and "forward" not in vars(model.base_model)
    assert "attnprune_method" not in dict(model.named_modules())
    assert (model(x).logits - ref).abs().max() == 0


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_keeping_every_token_equals_stock(family):
    model = tiny(family)
    x = torch.randint(0, V, (2, 24))
    ref = model(x).logits
    attnprune.patch(model, "ltp")  # fresh LTP keeps everything (I starts above τ)
    out = model(x).logits
    assert attnprune.patch_state(model).stats["kept_per_layer"] == [1.0] * 4
    assert (out - ref).abs().max() <= 1e-5


@pytest.mark.parametrize("family", FAMILY_NAMES)
@pytest.mark.parametrize("method", METHODS)
def test_dropped_tokens_skip_later_layers_and_cost_fewer_flops(family, method):
    model = patched(family, method)
    check_dropped_tokens_skip_later_blocks(model, model.base_model.layers)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma2"])
def test_kept_tokens_keep_their_original_rope_positions(family):
    """The (cos, sin) a pruned layer receives are those of the alive tokens' original
    positions: a strictly increasing subsequence of 0..L−1 that is not the prefix 0..K−1."""
    model = patched(family, "ltp", layers=[2])
    got = []

    def grab(mod, args, kwargs):
        got.append(kwargs["position_embeddings"][0][0])  # (K, d_head) of the one row

    model.base_model.layers[3].register_forward_pre_hook(grab, with_kwargs=True)
    table, _ = model.base_model.rotary_emb(torch.zeros(1), torch.arange(32)[None])  # (1, 32, d_head)
    not_prefix = 0
    for seed in range(4):
        model(torch.randint(0, V, (1, 32), generator=torch.Generator().manual_seed(seed)))
    for cos in got:  # one per input whose layer 3 still had tokens
        pos = torch.cdist(cos, table[0]).argmin(1)  # the position each row's rotation belongs to
        assert torch.allclose(cos, table[0, pos])
        assert len(pos) < 32 and bool((pos[1:] > pos[:-1]).all())
        not_prefix += not torch.equal(pos, torch.arange(len(pos)))
    assert not_prefix  # some tokens were rotated at their original, not compact, positions


# DTR samples its actions in training (a stochastic policy); in hybrid stage 2 it is frozen.
@pytest.mark.parametrize("family", FAMILY_NAMES)
@pytest.mark.parametrize("method,training", [(m, False) for m in METHODS] + [("ltp", True)])
def test_no_leakage_from_the_future(family, method, training):
    model = patched(family, method)
    model.train(training)
    check_no_leakage_from_the_future(model)


@pytest.mark.parametrize("family", FAMILY_NAMES)
@pytest.mark.parametrize("method", METHODS)
def test_kv_cache_matches_full_recompute(family, method):
    check_kv_cache_matches_full_recompute(patched(family, method))


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "gemma2"])
def test_generation_same_with_and_without_cache(family):
    model = patched(family, "ltp")
    prompt = torch.randint(0, V, (1, 8))
    a = generate(model, prompt, 60, temperature=0.0, use_cache=True)  # slides past 64
    b = generate(model, prompt, 60, temperature=0.0, use_cache=False)
    assert torch.equal(a, b)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_gradients_reach_thresholds(family):
    check_gradients_reach_thresholds(patched(family, "ltp"))


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
@pytest.mark.parametrize("method", ["dtr", "hybrid"])
def test_gradients_reach_the_policy(family, method):
    model = patched(family, method, **({"stage": 1} if method == "hybrid" else {}))
    check_gradients_reach_the_policy(model, method)


def test_padding_mask_matches_unpadded_rows():
    check_padding_mask_matches_unpadded_rows(patched("llama", "ltp"))


def test_row_bucketing_keeps_outputs(monkeypatch):
    """With a small group cost the rows split into groups (the blocks after the first decision
    see fewer rows than the batch); outputs equal the unbucketed forward."""
    from attnprune.hosts import hf_llama

    monkeypatch.setattr(hf_llama, "ROTARY_GROUP_OVERHEAD_TOKENS", 0.0)
    model = patched("qwen2", "ltp")
    x = torch.randint(0, V, (6, 32))
    state = attnprune.patch_state(model)
    rows = []
    hook = model.model.layers[-1].register_forward_pre_hook(lambda m, a: rows.append(a[0].shape[0]))
    a = model(x).logits
    assert min(rows) < x.shape[0]  # really split
    state.bucket_rows = False
    b = model(x).logits
    assert (a - b).abs().max() < 1e-5
    # the default cost at this width (32) is large: one group
    monkeypatch.setattr(hf_llama, "ROTARY_GROUP_OVERHEAD_TOKENS", None)
    state.bucket_rows, rows[:] = True, []
    model(x)
    hook.remove()
    assert rows == [x.shape[0]]


def test_sequences_beyond_the_sliding_window_are_refused():
    model = tiny("mistral", sliding_window=16)
    attnprune.patch(model, "ltp")
    model(torch.randint(0, V, (1, 16)))  # inside the window: the window masks nothing
    with pytest.raises(ValueError, match="sliding_window"):
        model(torch.randint(0, V, (1, 17)))


def test_refused_families_say_why():
    conf = tf.Gemma3TextConfig(vocab_size=V, hidden_size=32, intermediate_size=64,
                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                               head_dim=8, pad_token_id=0)
    model = tf.Gemma3ForCausalLM(conf)
    with pytest.raises(ValueError, match="gemma3_text.*rotary embedding differs per layer type"):
        attnprune.patch(model, "ltp")
    assert type(model.base_model) is tf.Gemma3TextModel


def test_non_causal_methods_and_bad_layers_are_refused():
    with pytest.raises(ValueError, match="not causal"):
        attnprune.patch(tiny(), "attention_mass", keep_ratio=0.5)
    with pytest.raises(ValueError, match="layers"):
        attnprune.patch(tiny(), "ltp", layers=[4])


# ----------------------------------------------------------------------------- lm --arch llama
def test_lm_arch_option_is_checked():
    from attnprune.research.lm import LMConfig
    from attnprune.runs.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="arch"):
        load_config(LMConfig, None, {"arch": "bert"})
    with pytest.raises(ConfigError, match="n_kv_head"):
        load_config(LMConfig, None, {"arch": "llama", "n_head": 4, "n_kv_head": 3})
    with pytest.raises(ConfigError, match="n_kv_head"):
        load_config(LMConfig, None, {"n_kv_head": 2})  # gpt2 has no key/value groups


def test_lm_builds_a_llama_of_the_preset_size():
    from attnprune.research.lm import LMConfig, build_model, context_window

    model = build_model(LMConfig(arch="llama"), vocab_size=65)
    c = model.config
    assert type(model).__name__ == "LlamaForCausalLM"
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads) == (4, 128, 4)
    assert c.num_key_value_heads == 2 and c.intermediate_size == 344 and context_window(c) == 128
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied


def test_lm_llama_run_with_ltp(tmp_path):
    import json

    from attnprune.research.lm import main

    corpus = tmp_path / "tiny.txt"
    corpus.write_text("To be, or not to be, that is the question:\n" * 60)
    argv = ["--arch", "llama", "--data", f"text:{corpus}", "--n-layer", "3", "--n-embd", "32",
            "--n-head", "2", "--context", "32", "--batch-size", "4", "--eval-windows", "8",
            "--gen-tokens", "10", "--bench-repeats", "1", "--warmup", "1", "--steps", "2",
            "--eval-every", "2", "--method", "ltp", "--method-options", "{keep_ratio: 0.5}",
            "--out", str(tmp_path / "run"), "--exact-out"]
    assert main(argv) == 0
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    e = s["methods"]["ltp"]
    assert len(e["kept_per_layer"]) == 3 and len(e["flops"]["per_layer_full"]) == 3
    assert min(e["flops"]["per_layer_full"]) > 0  # the Llama layers were found by name
    assert e["generation"]["cache_consistent"] is True
