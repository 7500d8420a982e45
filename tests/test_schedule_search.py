"""The budgeted schedule search (attnprune.train.schedule_search): it reaches its FLOPs budget and no
more than one step past it, returns a non-increasing schedule that patch() accepts, leaves the
model unchanged, picks the cheaper-in-KL layer, and refuses bad input."""

from __future__ import annotations

import itertools

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

import attnprune
from attnprune.measure import count_flops
from attnprune.train.schedule_search import search_schedule

LEVELS = (1.0, 0.5, 0.25)  # a coarse grid: few steps, a fast test
KW = {"hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 64,
      "max_position_embeddings": 80, "vocab_size": 60}


def _bert(layers=4):
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(num_hidden_layers=layers, num_labels=3,
                                                     **KW)).eval()
    with torch.no_grad():  # confident predictions, so that pruning moves them measurably
        model.classifier.weight.mul_(200)
    return model


def _batches(n=1, B=4, L=32):
    g = torch.Generator().manual_seed(1)
    return [{"input_ids": torch.randint(5, 60, (B, L), generator=g),
             "attention_mask": torch.ones(B, L, dtype=torch.long)} for _ in range(n)]


@pytest.mark.parametrize("budget", [0.8, 0.5])
def test_search_reaches_its_flops_budget(budget):
    model, batches = _bert(), _batches()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    found = search_schedule(model, batches, budget, levels=LEVELS)
    r = found["schedule"]
    assert found["reached"] and found["flops"] <= budget + 1e-9
    assert len(r) == 3 and all(a >= b for a, b in itertools.pairwise(r))
    # one step before the last was still above the budget: it stops as soon as it is reached
    assert found["history"][-2]["flops"] > budget
    # the FLOPs it reports are the patched model's, counted
    full = sum(count_flops(lambda b=b: model(**b)) for b in batches)
    attnprune.patch(model, "attention_mass", schedule=r)
    pruned = sum(count_flops(lambda b=b: model(**b)) for b in batches)
    attnprune.unpatch(model)
    assert pruned / full == pytest.approx(found["flops"], rel=1e-6)
    # the model it was given is unchanged and unpatched
    assert attnprune.patch_state(model) is None
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])


def test_budget_one_prunes_nothing_and_kl_grows_along_the_path():
    found = search_schedule(_bert(), _batches(), 1.0, levels=LEVELS)
    assert found["schedule"] == [1.0, 1.0, 1.0] and found["kl"] == 0.0
    path = search_schedule(_bert(), _batches(), 0.4, levels=LEVELS)["history"]
    assert [h["flops"] for h in path] == sorted((h["flops"] for h in path), reverse=True)
    assert path[-1]["kl"] > 0


def test_search_prefers_the_layer_whose_cut_costs_less():
    """A model whose last layers do nothing (zeroed output weights: the residual carries the
    states) loses nothing when they see fewer tokens: the search cuts there first."""
    model = _bert(layers=4)
    with torch.no_grad():
        for layer in model.bert.encoder.layer[2:]:
            layer.attention.output.dense.weight.zero_()
            layer.attention.output.dense.bias.zero_()
            layer.output.dense.weight.zero_()
            layer.output.dense.bias.zero_()
    found = search_schedule(model, _batches(), 0.9, levels=LEVELS)
    assert found["history"][1]["lowered"] == 2  # after layer 2: layers 3-4 are inert
    assert found["schedule"][0] == 1.0


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="flops_budget"):
        search_schedule(_bert(), _batches(), 0.0)
    with pytest.raises(ValueError, match="levels"):
        search_schedule(_bert(), _batches(), 0.5, levels=[0.5, 0.25])
    with pytest.raises(ValueError, match="batches"):
        search_schedule(_bert(), [], 0.5)


def test_a_patched_model_is_searched_against_its_full_model():
    """The reference is the unpatched model: searching a patched one gives the unpatched
    model's result (it gave [1.0, 1.0, 1.0], FLOPs 1.0: a pruned reference makes every
    candidate save nothing), and the caller's patch stays as it was."""
    want = search_schedule(_bert(), _batches(), 0.5, levels=LEVELS)
    model = _bert()
    attnprune.patch(model, "attention_mass", keep_ratio=0.5, after_layer=1)
    state = attnprune.patch_state(model)
    found = search_schedule(model, _batches(), 0.5, levels=LEVELS)
    assert found["reached"] and found["schedule"] == want["schedule"] != [1.0, 1.0, 1.0]
    assert found["flops"] == pytest.approx(want["flops"], rel=1e-9)
    assert found["kl"] == pytest.approx(want["kl"], rel=1e-6)
    assert attnprune.patch_state(model) is state and state.schedule[0] == 0.5


def test_the_callers_model_never_runs():
    """The search runs on a copy: the model given is never called, and keeps its mode."""
    model = _bert().train()
    ran = []
    model.register_forward_pre_hook(lambda mod, args: ran.append(mod is model))
    search_schedule(model, _batches(), 0.8, levels=LEVELS)
    assert ran and not any(ran), "the search ran the caller's model"  # copies ran (the hook)
    assert model.training


def test_each_step_takes_the_least_kl_per_flop_saved():
    """ΔKL / ΔFLOPs, not ΔKL alone: the cut after layer 1 costs more KL (0.2) but saves ten
    times the FLOPs of the cut after layer 3 (0.05 KL): 0.4 per FLOP against 1.0."""
    from attnprune.train.schedule_search import _best

    early = ([0.5, 0.5, 0.5], 0.5, 0.2, 0)
    late = ([1.0, 1.0, 0.5], 0.95, 0.05, 2)
    assert _best([late, early], cur_flops=1.0, cur_kl=0.0) is early
    assert _best([early, late], cur_flops=1.0, cur_kl=0.0) is early
    saves_nothing = ([1.0, 1.0, 0.5], 1.0, 0.0, 2)
    assert _best([saves_nothing], cur_flops=1.0, cur_kl=0.0) is None
