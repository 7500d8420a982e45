"""The token-budget experiment (cost paper Tables 1-2): validation, pieces and tables."""

from __future__ import annotations

import pytest
import torch

from attnprune.research.experiments.token_budget import (
    FULL,
    BudgetConfig,
    attention_by_layer,
    check_equal_lengths,
    format_table1,
    format_table2,
)
from attnprune.runs.config import ConfigError, parse_command_line


@pytest.mark.parametrize("key,value", [("budgets", "[256]"), ("budgets", "[0]"),
                                       ("budgets", "[64, 64]"), ("budgets", "[]"),
                                       ("max_length", "0"), ("mixed_precision", "fp8"),
                                       ("lr", "0")])
def test_budget_config_rejects_bad_options(key, value):
    with pytest.raises((ValueError, ConfigError), match=key):
        parse_command_line([f"--{key}", value], BudgetConfig)


def test_unequal_lengths_stop_with_the_row():
    mask = torch.ones(4, 8, dtype=torch.long)
    mask[2, 6:] = 0
    loader = [{"attention_mask": mask[:2]}, {"attention_mask": mask[2:]}]
    check_equal_lengths(loader[:1], 8)
    with pytest.raises(ValueError, match="test row 2 has 6 tokens"):
        check_equal_lengths(loader, 8)


def test_attention_by_layer_sees_the_pruned_layers_k_keys():
    from transformers import BertConfig, BertForSequenceClassification

    import attnprune

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
        intermediate_size=64)).eval()
    batches = [{"input_ids": torch.randint(1, 50, (2, 16)),
                "attention_mask": torch.ones(2, 16, dtype=torch.long)}]
    impl = model.config._attn_implementation
    full = attention_by_layer(model, batches, 1)
    assert model.config._attn_implementation == impl  # eager only while measuring
    assert full["keys_by_layer"] == [16, 16, 16]
    attnprune.patch(model, "attention_mass", keep_ratio=0.25, after_layer=1)
    pruned = attention_by_layer(model, batches, 1)
    assert pruned["keys_by_layer"] == [16, 4, 4]
    assert all(h <= 2.0 + 1e-5 for h in pruned["entropy_bits_by_layer"][1:])  # ≤ log2 4
    assert all(0.0 <= g <= 1.0 for g in pruned["gini_by_layer"])


def test_tables_from_rows():
    cfg = BudgetConfig(budgets=(64,), max_length=128)
    acc = {"mean": 0.7, "ci95": [0.6, 0.8]}
    base = {"gflops_per_example": 1.0, "time_relative": 1.0, "keys_pruned_layers": 128,
            "entropy_pruned_layers": 4.0, "gini_pruned_layers": 0.7, "entropy_all": 4.2,
            "gini_all": 0.69}
    rows = [{"label": FULL, "k": 128, "keep_ratio": 1.0, "accuracy": acc, "flops_relative": 1.0,
             **base},
            {"label": "k64", "k": 64, "keep_ratio": 0.5, "accuracy": acc,
             "delta": {"mean": -0.01, "ci95": [-0.02, 0.0]}, "p_holm": [0.04, 0.5],
             "flops_relative": 0.55, **base, "keys_pruned_layers": 64, "time_relative": None}]
    t1 = format_table1(cfg, rows, [0, 1])
    assert "| full (128) | 1 |" in t1 and "| 64 | 0.5 |" in t1 and "0.04, 0.5" in t1
    assert "-0.0100 [" in t1 and "| 0.550 | — |" in t1
    t2 = format_table2(cfg, rows, [0, 1])
    assert "| 64 | 64 | 6.00 | 4.000 |" in t2
