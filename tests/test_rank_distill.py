"""Ranking distillation (attnprune.train.rank_distill): the teacher's target is a distribution over
the real tokens built from the layers after the cut, the patched encoder adds the KL at its
first cut and only there, its gradient reaches the scoring layer's query/key weights, training
moves the scorer toward the teacher, and the config refuses what it cannot do."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils.data import DataLoader
from transformers import BertConfig, BertForSequenceClassification

import attnprune
from attnprune.train import fit
from attnprune.train.rank_distill import first_cut, rank_target, ranking_loss, teacher_importance

KW = {"hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 64,
      "max_position_embeddings": 64, "vocab_size": 60}


def _bert(layers=4, seed=0):
    torch.manual_seed(seed)
    return BertForSequenceClassification(BertConfig(num_hidden_layers=layers, **KW)).eval()


def _batch(B=3, L=20, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 60, (B, L), generator=g)
    mask = torch.ones(B, L, dtype=torch.long)
    mask[1, 14:] = 0  # a padded row
    ids[mask == 0] = 0
    return ids, mask


def test_teacher_importance_is_a_distribution_from_the_later_layers():
    teacher = _bert()
    teacher.set_attn_implementation("eager")
    ids, mask = _batch()
    out = teacher(input_ids=ids, attention_mask=mask, output_attentions=True)
    t = teacher_importance(out.attentions, mask, start=2)
    assert t.shape == ids.shape
    torch.testing.assert_close(t.sum(1), torch.ones(3))
    assert (t[1, 14:] == 0).all()  # padding gets nothing
    # from layers 2 and 3 only: the mean of their received attention
    m = mask.float()
    rec = [torch.einsum("bhij,bi->bj", a, m) / (a.shape[1] * m.sum(1)[:, None])
           for a in out.attentions[2:]]
    want = (rec[0] + rec[1]) * m
    torch.testing.assert_close(t, want / want.sum(1, keepdim=True))
    assert not torch.allclose(t, teacher_importance(out.attentions, mask, start=0))
    with pytest.raises(ValueError, match="start"):
        teacher_importance(out.attentions, mask, start=4)


def test_ranking_loss_is_zero_at_the_target_and_positive_elsewhere():
    _, mask = _batch()
    t = torch.rand(3, 20) * mask
    t = t / t.sum(1, keepdim=True)
    assert ranking_loss(t, t, mask).abs() < 1e-6
    # mass on padding is renormalised away: the same loss
    s = t.clone()
    s[1, 14:] = 5.0
    assert ranking_loss(s, t, mask).abs() < 1e-6
    assert ranking_loss(torch.rand(3, 20), t, mask) > 1e-3
    with pytest.raises(ValueError, match="same shape"):
        ranking_loss(t[:, :5], t, mask)


def test_the_host_adds_the_loss_at_the_first_cut_with_a_gradient_to_the_scoring_layer():
    model = _bert()
    attnprune.patch(model, "attention_mass", keep_ratio=0.5, after_layer=2)
    assert first_cut(model) == 1  # after layer 2 (1-based): layer index 1 scores
    ids, mask = _batch()
    t = torch.rand(3, 20) * mask
    t = t / t.sum(1, keepdim=True)
    model.train()
    with rank_target(model, t, 0.7):
        out = model(input_ids=ids, attention_mask=mask)
    aux = attnprune.aux_loss(model)
    assert aux is not None and aux > 0
    (out.logits.sum() * 0 + aux).backward()
    q1 = model.bert.encoder.layer[1].attention.self.query.weight.grad
    q3 = model.bert.encoder.layer[3].attention.self.query.weight.grad
    assert q1 is not None and q1.abs().sum() > 0  # the scoring layer learns from it
    assert q3 is None or q3.abs().sum() == 0  # a later layer does not
    # the target is used once: the next forward without the block adds nothing
    model(input_ids=ids, attention_mask=mask)
    assert attnprune.aux_loss(model) is None
    # eval mode: no loss (the scorer is not trained there)
    model.eval()
    with rank_target(model, t, 0.7):
        model(input_ids=ids, attention_mask=mask)
    assert attnprune.aux_loss(model) is None


def test_rank_target_refuses_a_model_that_does_not_prune():
    with pytest.raises(ValueError, match="patched with a token method"), \
            rank_target(_bert(), torch.ones(1, 4), 1.0):
        pass
    m = _bert()
    attnprune.patch(m, "attention_mass", keep_ratio=0.5)
    with pytest.raises(ValueError, match="> 0"), rank_target(m, torch.ones(1, 4), 0.0):
        pass


def test_training_with_rank_distillation_moves_the_scorer_toward_the_teacher():
    teacher = _bert(seed=3)
    ids, mask = _batch(B=8, L=20, seed=4)
    rows = [{"input_ids": ids[i], "attention_mask": mask[i], "labels": torch.tensor(i % 2)}
            for i in range(8)]
    loader = DataLoader(rows, batch_size=4)

    def kl_after(weight):
        student = copy.deepcopy(teacher)
        # a student whose first layer differs from the teacher's: its ranking must move
        torch.manual_seed(9)
        for p in student.bert.encoder.layer[0].parameters():
            p.data.add_(torch.randn_like(p) * 0.5)
        attnprune.patch(student, "attention_mass", keep_ratio=0.5, after_layer=1)
        fit(student, loader, epochs=6, lr=3e-3, teacher=copy.deepcopy(teacher),
            distill_weight=0.5, rank_distill=weight, progress=False, warmup_ratio=0.0)
        t_eager = copy.deepcopy(teacher)
        t_eager.set_attn_implementation("eager")
        target = teacher_importance(t_eager(input_ids=ids, attention_mask=mask,
                                            output_attentions=True).attentions, mask, 1)
        student.train()
        with torch.no_grad(), rank_target(student, target, 1.0):
            student(input_ids=ids, attention_mask=mask)
        return float(attnprune.aux_loss(student))

    assert kl_after(2.0) < 0.8 * kl_after(0.0)


def test_fit_and_pareto_refuse_what_they_cannot_do():
    from attnprune.research.pareto import ParetoConfig

    with pytest.raises(ValueError, match="needs a teacher"):
        fit(_bert(), [], rank_distill=1.0, progress=False)
    with pytest.raises(ValueError, match=r"prune\[0\].rank_distill: must be a number"):
        ParetoConfig(prune=({"method": "attention_mass", "rank_distill": -1},))
    with pytest.raises(ValueError, match=r"prune\[0\].rank_distill: needs a method that scores"):
        ParetoConfig(prune=({"method": "random", "rank_distill": 1.0},))
    cfg = ParetoConfig(prune=({"method": "attention_mass", "keep_ratio": [0.25],
                               "rank_distill": 0.5, "options": {"variant": "mean"}},))
    point = cfg.points()[-1]
    assert point["label"] == "attention_mass:mean@0.25/L1/rank0.5"
    assert point["rank_distill"] == 0.5


def test_ranking_loss_is_kl_of_the_target_to_the_student():
    """KL(t ‖ s) = Σ t log(t / s), the direction of the docstring (the teacher's mass where the
    student puts little costs most), checked against torch's own kl_div; the reverse
    direction gives another number here."""
    t = torch.tensor([[0.7, 0.2, 0.1, 0.0]])
    s = torch.tensor([[0.02, 0.38, 0.6, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    want = torch.nn.functional.kl_div(s[:, :3].log(), t[:, :3], reduction="sum")
    reverse = torch.nn.functional.kl_div(t[:, :3].log(), s[:, :3], reduction="sum")
    assert abs(float(want) - float(reverse)) > 0.1
    torch.testing.assert_close(ranking_loss(s, t, mask), want)


def test_rank_target_adds_its_loss_to_the_next_forward_only():
    model = _bert()
    attnprune.patch(model, "attention_mass", keep_ratio=0.5, after_layer=1)
    ids, mask = _batch()
    t = torch.rand(3, 20) * mask
    t = t / t.sum(1, keepdim=True)
    model.train()
    with rank_target(model, t, 1.0):
        model(input_ids=ids, attention_mask=mask)
        assert attnprune.aux_loss(model) is not None
        model(input_ids=ids, attention_mask=mask)  # a second forward in the block: no target
        assert attnprune.aux_loss(model) is None


@pytest.mark.parametrize("method", ["entropy", "random"])
def test_methods_that_read_no_attention_are_refused(method):
    """Their scorer has no attention for the loss to act on: the host never added it, and
    training ran without the distillation, silently."""
    model = _bert()
    attnprune.patch(model, method, keep_ratio=0.5, after_layer=1)
    with pytest.raises(ValueError, match="scores by attention"), \
            rank_target(model, torch.ones(3, 20), 1.0):
        pass
    with pytest.raises(ValueError, match="scores by attention"):
        fit(model, [], teacher=_bert(seed=3), rank_distill=1.0, progress=False)


def test_fit_takes_the_teacher_target_from_the_layers_after_the_cut(monkeypatch):
    """after_layer=2: the scorer reads layer index 1, so the target is the attention received
    in the teacher's layers 2 and 3 (not 1), averaged as teacher_importance's docstring says."""
    import attnprune.train.rank_distill as rd

    teacher = _bert(seed=3)
    student = copy.deepcopy(teacher)
    attnprune.patch(student, "attention_mass", keep_ratio=0.5, after_layer=2)
    ids, mask = _batch(B=4, seed=4)
    rows = [{"input_ids": ids[i], "attention_mask": mask[i], "labels": torch.tensor(i % 2)}
            for i in range(4)]
    seen = []
    real_rank_target = rd.rank_target

    def spy(model, target, weight):
        seen.append(target)
        return real_rank_target(model, target, weight)

    monkeypatch.setattr(rd, "rank_target", spy)
    fit(student, DataLoader(rows, batch_size=4), teacher=copy.deepcopy(teacher),
        rank_distill=1.0, progress=False, lr=0.0)
    eager = copy.deepcopy(teacher)
    eager.set_attn_implementation("eager")
    with torch.no_grad():
        att = eager(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    m = mask.float()
    want = sum(torch.einsum("bhij,bi->bj", a, m) / (a.shape[1] * m.sum(1)[:, None])
               for a in att[2:]) * m
    assert len(seen) == 1
    torch.testing.assert_close(seen[0], want / want.sum(1, keepdim=True))
