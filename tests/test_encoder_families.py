"""Token methods walked over the registry × the encoder families of ``hosts.families.FAMILIES``.

Tiny random models (the configs of ``test_attention_families``: 2 layers, width 32, 4 heads,
T = 12 with two right-padded rows): BERT, RoBERTa, DistilBERT, XLM-R, CamemBERT, ELECTRA,
ALBERT (shared layers, embedding projection), MPNet (relative position bias), DeBERTa-v2
(disentangled relative attention, log buckets), ModernBERT (RoPE, a local layer with window
4 < T after the pruning layer). For every family × token method: parity at ρ = 1, fewer
counted FLOPs at ρ = 0.5, padding never kept nor counted, gradients reach the method's
parameters. Per family: gathered tokens keep their original positions (a gather across holes
in the mask equals the stock model with those holes; dropping real tokens equals masking them
as keys in the layers after the pruning layer), copies run their own layers, and a refused
family says why.
"""

from __future__ import annotations

import copy
import dataclasses
import functools

import pytest
import torch
import transformers as tf
from test_attention_families import ARCHS, V, batch, build  # tests/ is on sys.path

import attnprune
from attnprune.hosts.families import FAMILIES
from attnprune.measure import count_flops
from attnprune.methods.base import Selection

PARITY = 1e-5  # DESIGN.md: keep_ratio = 1 reproduces the unpatched model to 1e-5
ENCODERS = [a for a in ARCHS if FAMILIES[a].token]
TOKEN_METHODS = attnprune.list_methods("token")


def _no_dropout(model):
    """Train mode without randomness: the soft and hard paths then differ only by design."""
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model


def _outputs(model, ids, mask) -> torch.Tensor:
    """The logits and the encoder's last states at real tokens (through the same patch)."""
    logits = model(input_ids=ids, attention_mask=mask).logits
    hidden = model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
    return torch.cat([logits.flatten(), hidden[mask.bool()].flatten()])


# ρ = 1 − 1e-11: below 1, so the host calls the method after layer 1 (at ρ = 1 pruning is off
# and the method never runs), yet ⌊ρ·n⌋ = n for these lengths (selection.budget's 1e-9
# epsilon: n · 1e-11 < 1e-9), so a fixed-budget method keeps every token itself
JUST_BELOW_ONE = 1.0 - 1e-11


def _keep_every_token(calls: list, fixed_budget: bool, _mod, args, kwargs, out: Selection):
    """Forward hook on the method: counts its calls; a fixed budget must have kept every real
    token at ρ = JUST_BELOW_ONE; a learned count (thresholds, policies: ρ is not their budget)
    gets every real token added to its choice, so the host runs the method, then its gather
    and scatter with nothing dropped."""
    mask = (args[1] if len(args) > 1 else kwargs["mask"]).bool()
    calls.append(int(mask.sum()))
    if fixed_budget:
        assert torch.equal(out.keep, mask), "ρ·n rounds to n: the method must keep every token"
        return None
    return dataclasses.replace(out, keep=out.keep | mask)


def token_parity(arch: str, method: str, keep_ratio: float = 1.0) -> float:
    """Max |patched − unpatched| over logits and real tokens' last states at ``keep_ratio``
    1 (pruning off) or JUST_BELOW_ONE (the method runs and keeps every token; checked)
    (also printed by ``scripts/family_table.py``)."""
    model = build(arch)
    ids, mask = batch()
    calls: list[int] = []
    with torch.no_grad():
        ref = _outputs(model, ids, mask)
        attnprune.patch(model, method, keep_ratio=keep_ratio, after_layer=1, output="scatter")
        state = attnprune.patch_state(model)
        fixed = not getattr(state.modules, "variable_budget", False)
        state.modules.register_forward_hook(
            functools.partial(_keep_every_token, calls, fixed), with_kwargs=True)
        got = _outputs(model, ids, mask)
        attnprune.unpatch(model)
        back = _outputs(model, ids, mask)
    assert torch.equal(back, ref), "unpatch did not restore the stock model"
    if keep_ratio < 1.0:  # the method ran on every real token of both forwards in _outputs
        assert calls == [int(mask.sum())] * 2, calls
        assert state.stats["kept_ratio"] == 1.0
    return float((got - ref).abs().max())


class Fixed(torch.nn.Module):
    """A token method keeping a given (B, L) set; ``soft`` = the same set, for training."""

    needs_attention = False

    def __init__(self, keep: torch.Tensor) -> None:
        super().__init__()
        self.keep = keep

    def forward(self, hidden, mask, **kw):
        keep = self.keep[:, : mask.shape[1]] & mask
        return Selection(keep=keep, soft=keep.float())


def _with_fixed(model, keep, **options):
    attnprune.patch(model, "random", keep_ratio=0.5, after_layer=1, output="scatter", **options)
    attnprune.patch_state(model).modules = Fixed(keep)
    return model


def holes_gap(arch: str, **overrides) -> float:
    """Max |Δ| at real tokens between the stock model with holes in its mask and the patched one
    gathering the real tokens after layer 1 (every real token kept): the gathered sequence is
    shorter, so a family that numbered positions by slot would move every token after a hole."""
    ids, _ = batch()
    mask = torch.ones_like(ids)
    mask[:, [2, 3, 6]] = 0  # holes in every row: after the gather, tokens 4… sit 2–3 slots left
    mask[1, 9:] = 0
    model = build(arch, **overrides)
    base = model.base_model
    with torch.no_grad():
        ref = base(input_ids=ids, attention_mask=mask).last_hidden_state
        _with_fixed(model, mask.bool())
        got = base(input_ids=ids, attention_mask=mask).last_hidden_state
    padded = attnprune.patch_state(model).stats["padded_per_layer"]
    assert padded[1] < padded[0], "no gather happened"
    real = mask.bool()
    return float((got[real] - ref[real]).abs().max())


DROP = torch.zeros(3, 12, dtype=torch.bool)  # real tokens kept after layer 1 in batch()
DROP[0, [0, 1, 4, 5, 9, 11]] = True
DROP[1, [0, 3, 4, 7]] = True
DROP[2, [0, 2, 4]] = True


def drop_gap(arch: str, **overrides) -> float:
    """Max |Δ| at kept tokens between dropping the others after layer 1 (gather, eval) and
    keeping them with log-mask bias −30 on their keys in the later layers (the soft path,
    training mode without dropout: full length, stock positions)."""
    model = _no_dropout(build(arch, **overrides))
    ids, mask = batch()
    _with_fixed(model, DROP)
    base = model.base_model
    with torch.no_grad():
        hard = base(input_ids=ids, attention_mask=mask).last_hidden_state
        model.train()
        soft = base(input_ids=ids, attention_mask=mask).last_hidden_state
    return float((hard[DROP] - soft[DROP]).abs().max())


@pytest.mark.parametrize("method", TOKEN_METHODS)
@pytest.mark.parametrize("arch", ENCODERS)
def test_keep_ratio_one_reproduces_unpatched(arch, method):
    assert token_parity(arch, method) <= PARITY  # pruning off: the host's own loop
    assert token_parity(arch, method, JUST_BELOW_ONE) <= PARITY  # the method runs, keeps all


@pytest.mark.parametrize("arch", ENCODERS)
def test_gathered_tokens_keep_their_original_positions(arch):
    assert holes_gap(arch) <= PARITY


@pytest.mark.parametrize("arch", ENCODERS)
def test_gather_equals_masking_dropped_keys(arch):
    """Dropping real tokens = masking them as keys in the later layers (DeBERTa-v2: its soft
    path, the bias added to the module's own scores, against its stock layers)."""
    assert drop_gap(arch) <= PARITY


@pytest.mark.parametrize("arch", ENCODERS)
def test_pruning_differs_from_consecutive_positions(arch):
    """The position test above can fail: with the original positions replaced by the compact
    slots (0 … K−1), the families with position terms in their layers move (> 1e-3)."""
    if FAMILIES[arch].token not in ("mpnet", "deberta", "modernbert"):
        pytest.skip("absolute positions enter at the embeddings only")
    model = build(arch)
    ids, _ = batch()
    mask = torch.ones_like(ids)
    mask[:, [2, 3, 6]] = 0
    _with_fixed(model, mask.bool())
    state = attnprune.patch_state(model)
    call = state.anatomy.call

    def slots(s, i, h, m, index):  # a gathered index replaced by the slot numbers 0 … K−1
        return call(s, i, h, m, torch.arange(index.shape[1]).expand_as(index)
                    if index.stride(0) else index)

    with torch.no_grad():
        ok = model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
        state.anatomy = dataclasses.replace(state.anatomy, call=slots)
        moved = model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
    real = mask.bool()
    assert (ok[real] - moved[real]).abs().max() > 1e-3


def force_decisions(model, ids, mask) -> None:
    """Decisive random scorers for the methods that keep every token until trained (the
    causal LTP's importance starts above its threshold, DTR's policy at π = 0.9): random
    weights, then the causal LTP's thresholds τ_l at the median importance of ``ids``, so
    that about half the tokens fall below τ_l / π = 0.5."""
    g = torch.Generator().manual_seed(1)
    method = attnprune.patch_state(model).modules
    with torch.no_grad():
        for name, p in method.named_parameters():
            if name.endswith("w") and p.dim() == 2:  # causal LTP scorer (zeros at init)
                p.copy_(torch.randn(p.shape, generator=g) * 2.0)
            if name.endswith("w2.weight"):  # DTR policy output (zeros at init)
                p.copy_(torch.randn(p.shape, generator=g) * 3.0)
            if name.endswith("w2.bias"):
                p.zero_()
        for ltp in [m for m in method.modules() if type(m).__name__ == "LTPCausal"]:
            seen = []
            hook = ltp.register_forward_hook(lambda mod, a, kw, out, acc=seen: acc.append(
                out.scores[kw["mask"] if "mask" in kw else a[1]]), with_kwargs=True)
            model(input_ids=ids, attention_mask=mask)
            hook.remove()
            ltp.tau.fill_(float(torch.cat(seen).median()))


LONG = torch.randint(3, V, (2, 32), generator=torch.Generator().manual_seed(2))


@functools.cache
def full_flops(arch: str) -> int:
    """Counted FLOPs of the unpatched model on ``LONG``. Counted with autograd on:
    FlopCounterMode's module tracker fails on a module whose input is a leaf parameter under
    no_grad (DeBERTa's ``pos_dropout(rel_embeddings.weight)``)."""
    model = build(arch)
    return count_flops(lambda: model(input_ids=LONG, attention_mask=torch.ones_like(LONG)))


@pytest.mark.parametrize("method", TOKEN_METHODS)
@pytest.mark.parametrize("arch", ENCODERS)
def test_fewer_flops_and_padding_never_kept(arch, method):
    model = build(arch)
    ids, mask = batch()
    long_ids, long_mask = LONG, torch.ones_like(LONG)
    full = full_flops(arch)
    opts = {"init_threshold": 1.0} if method == "ltp" else {}  # LTP: a threshold that drops
    attnprune.patch(model, method, keep_ratio=0.5, after_layer=1, **opts)
    force_decisions(model, long_ids, long_mask)
    state = attnprune.patch_state(model)
    seen = []
    select = state.modules.forward

    def spy(hidden, m, **kw):
        sel = select(hidden, m, **kw)
        seen.append((m.clone(), sel.keep.clone()))
        return sel

    state.modules.forward = spy
    pruned = count_flops(lambda: model(input_ids=long_ids, attention_mask=long_mask))
    with torch.no_grad():
        seen.clear()
        logits = model(input_ids=ids, attention_mask=mask).logits
    # top-k keeps ⌊ρ·n⌋ in layer 2 of 2; thresholds and policies (the causal methods too)
    # drop what they drop
    m = state.modules
    bound = full if getattr(m, "variable_budget", False) or getattr(m, "causal", False) else 0.95 * full
    assert pruned < bound, f"{arch}/{method}: {pruned} vs {full} FLOPs"
    assert torch.isfinite(logits).all()
    stats = state.stats
    assert stats["real_tokens"] == int(mask.sum())
    assert stats["kept_per_layer"][0] == int(mask.sum())  # padding is not counted as kept
    assert stats["kept_per_layer"][1] < stats["kept_per_layer"][0]
    assert 0 < stats["kept_ratio"] < 1
    for m, keep in seen:
        assert not (keep & ~m).any(), "padding kept"


def _grad_options(arch: str, method: str) -> dict:
    opts = {}
    if method == "ltp":
        opts["init_threshold"] = 0.01  # the soft gate's slope is not flat at the scores
    return opts


def _trained_by_loss(method: str) -> list[str]:
    """Names of the method's parameters that the task loss and ``aux_loss`` train. DTR's
    policies (also Hybrid's, frozen in its stage 2) learn by REINFORCE from per-sequence LM
    losses, which only the causal host computes (``hf_causal``); on an encoder they get no
    gradient, by construction."""
    mod = attnprune.methods.registry.create(method, context={"d_model": 32, "n_layers": 2,
                                                     "n_heads": 4, "n_classes": 2})
    return [n for n, _ in mod.named_parameters() if "policies" not in n]


@pytest.mark.parametrize("method", [m for m in TOKEN_METHODS if _trained_by_loss(m)])
@pytest.mark.parametrize("arch", ENCODERS)
def test_gradients_reach_method_parameters(arch, method):
    model = _no_dropout(build(arch)).train()
    ids, mask = batch()
    attnprune.patch(model, method, keep_ratio=0.5, after_layer=1, **_grad_options(arch, method))
    out = model(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 1, 0]))
    aux = attnprune.aux_loss(model)
    (out.loss + (aux if aux is not None else 0)).backward()
    params = dict(attnprune.patch_state(model).modules.named_parameters())
    grads = [params[n].grad for n in _trained_by_loss(method)]
    assert all(g is not None and torch.isfinite(g).all() for g in grads), arch
    assert any(g.abs().sum() > 0 for g in grads)


def test_deberta_soft_bias_with_a_stacked_attention_method_is_refused_with_the_reason():
    """The stacked attention adapter masks DeBERTa's scores with a boolean again: the soft
    bias could not reach them, and the error says what works instead."""
    model = _no_dropout(build("deberta-v2"))
    ids, mask = batch()
    attnprune.patch(model, "ltp", keep_ratio=0.5, after_layer=1)
    attnprune.patch(model, "crisp", sparsity=0.0, stack=True)
    model.train()
    with pytest.raises(ValueError, match="soft_mode='multiply'"):
        model(input_ids=ids, attention_mask=mask)


def test_refused_family_says_why():
    cfg = tf.DebertaConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=4, intermediate_size=64,
                           relative_attention=True)
    model = tf.DebertaForSequenceClassification(cfg).eval()
    with pytest.raises(ValueError, match="not supported by token methods: DeBERTa v1"):
        attnprune.patch(model, "attention_mass", keep_ratio=0.5)
    assert not hasattr(model, "_attnprune")


@pytest.mark.parametrize(("arch", "flags"), [
    ("bert", {"is_decoder": True}), ("roberta", {"is_decoder": True}),
    ("electra", {"is_decoder": True, "add_cross_attention": True})])
def test_encoder_family_built_as_a_decoder_is_refused_naming_the_flag(arch, flags):
    """The class the host serves as an encoder, configured as a decoder: the refusal names
    the config flag that makes the difference and what to do (it said only "no host")."""
    model = build(arch, **flags)
    with pytest.raises(ValueError, match=r"is_decoder=True") as err:
        attnprune.patch(model, "attention_mass", keep_ratio=0.5)
    msg = str(err.value)
    assert "is_decoder=False" in msg and "attention method" in msg
    if flags.get("add_cross_attention"):
        assert "add_cross_attention=True" in msg
    assert not hasattr(model, "_attnprune")
    attnprune.patch(model, "crisp", sparsity=0.5)  # the advice holds


@pytest.mark.parametrize("arch", ["albert", "mpnet", "deberta-v2", "modernbert"])
def test_copies_run_their_own_layers(arch):
    model = build(arch)
    ids, mask = batch()
    attnprune.patch(model, "attention_mass", keep_ratio=0.5, after_layer=1)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        a = model(input_ids=ids, attention_mask=mask).logits
        for p in twin.parameters():
            p.add_(0.05)
        b = twin(input_ids=ids, attention_mask=mask).logits
        a2 = model(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(a, a2) and not torch.allclose(a, b)


def test_albert_depths_are_layers():
    """ALBERT's one shared layer runs at every depth: the schedule has one value per depth."""
    model = build("albert", num_hidden_layers=3)
    ids, mask = batch()
    attnprune.patch(model, "attention_mass", schedule=[1.0, 0.5], after_layer=1)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    stats = attnprune.patch_state(model).stats
    assert len(stats["kept_per_layer"]) == 3
    assert stats["kept_per_layer"][2] < stats["kept_per_layer"][1] == stats["kept_per_layer"][0]


@pytest.mark.parametrize("arch", ["albert", "mpnet", "deberta-v2", "modernbert"])
def test_attention_method_stacks_on_the_gathered_tokens(arch):
    """crisp through the attention host's adapters reads the position terms the token host
    hands the layers (gathered bias, per-row relative positions, local masks): at sparsity 0
    the stack equals the token method alone; at 0.5 it acts."""
    model = build(arch)
    ids, mask = batch()
    attnprune.patch(model, "attention_mass", keep_ratio=0.5, after_layer=1)
    with torch.no_grad():
        alone = model(input_ids=ids, attention_mask=mask).logits
        attnprune.patch(model, "crisp", sparsity=0.0, stack=True)
        neutral = model(input_ids=ids, attention_mask=mask).logits
        on = attnprune.patch(build(arch), "attention_mass", keep_ratio=0.5, after_layer=1)
        attnprune.patch(on, "crisp", sparsity=0.5, stack=True)
        acted = on(input_ids=ids, attention_mask=mask).logits
    assert attnprune.patch_state(model).stats["kept_ratio"] < 1
    assert (neutral - alone).abs().max() <= PARITY
    assert (acted - alone).abs().max() > 1e-4


@pytest.mark.parametrize("arch", ["albert", "mpnet", "deberta-v2", "modernbert"])
def test_row_groups_keep_the_outputs(arch, monkeypatch):
    """Rows regrouped by kept count after the gather (each group cut to its own width) get
    their own position tables, and the same states as one padded batch."""
    from attnprune.hosts import hf_encoder, hf_encoder_loop

    monkeypatch.setattr(hf_encoder, "GROUP_OVERHEAD_TOKENS", 0.0)  # split at every count
    groups = []
    grouped = hf_encoder_loop._grouped

    def spy(state, run, start, row_groups, *rest, **kw):
        groups.append(len(row_groups))
        return grouped(state, run, start, row_groups, *rest, **kw)

    monkeypatch.setattr(hf_encoder_loop, "_grouped", spy)
    model = build(arch)
    ids, mask = batch()
    _with_fixed(model, DROP)
    state = attnprune.patch_state(model)
    out = {}
    with torch.no_grad():
        for on in (True, False):
            state.bucket_rows = on
            out[on] = model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert groups == [3]  # three rows, three kept counts (6, 4, 3): three groups
    assert torch.allclose(out[True][DROP], out[False][DROP], atol=1e-5)


@pytest.mark.parametrize("arch", ["deberta-v2", "modernbert"])
def test_saved_and_reloaded_model_prunes_the_same(arch, tmp_path):
    """``save_pretrained`` / ``from_pretrained`` replay the patch on the new families."""
    model = build(arch)
    ids, mask = batch()
    attnprune.patch(model, "ltp", keep_ratio=0.5, after_layer=1, init_threshold=1.0)
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask).logits
    attnprune.save_pretrained(model, tmp_path / "m")
    loaded = attnprune.from_pretrained(tmp_path / "m").eval()
    with torch.no_grad():
        got = loaded(input_ids=ids, attention_mask=mask).logits
    assert attnprune.patch_state(loaded).stats["kept_ratio"] < 1
    assert torch.allclose(got, ref, atol=1e-6)


# DeBERTa-v3's settings (shared position projections, normalised relative embeddings) and
# v2-xlarge's convolution; ALBERT with several groups of several inner layers (8 depths)
VARIANTS = [("deberta-v2", {"share_att_key": True, "norm_rel_ebd": "layer_norm"}),
            ("deberta-v2", {"conv_kernel_size": 3}),
            ("albert", {"num_hidden_layers": 4, "num_hidden_groups": 2, "inner_group_num": 2})]


@pytest.mark.parametrize("arch,overrides", VARIANTS)
def test_variants_keep_parity_and_positions(arch, overrides):
    model = build(arch, **overrides)
    ids, mask = batch()
    with torch.no_grad():
        ref = _outputs(model, ids, mask)
        attnprune.patch(model, "attention_mass", keep_ratio=1.0, after_layer=1, output="scatter")
        got = _outputs(model, ids, mask)  # the host calls every depth itself, in its order
    assert (got - ref).abs().max() <= PARITY
    assert holes_gap(arch, **overrides) <= PARITY
    assert drop_gap(arch, **overrides) <= PARITY


@pytest.mark.parametrize("arch", ENCODERS)
def test_auto_output_gives_the_scatter_logits(arch):
    """``output="auto"`` returns the short batch only to the heads listed in ``cls_head``
    (they read CLS alone): the same logits as the stock-shaped output."""
    ids, mask = batch()
    out = {}
    for mode in ("auto", "scatter"):
        model = attnprune.patch(build(arch), "attention_mass", keep_ratio=0.5, after_layer=1,
                                output=mode)
        with torch.no_grad():
            out[mode] = model(input_ids=ids, attention_mask=mask).logits
        out[mode + "_state"] = attnprune.patch_state(model).output
    assert out["auto_state"] == ("short" if FAMILIES[arch].cls_head else "scatter")
    assert torch.equal(out["auto"], out["scatter"])


class Spy(torch.nn.Module):
    """Records the attention probabilities (every row) the host hands the method; keeps
    ``DROP`` at the first pruning layer and every token after."""

    needs_attention = True
    attention_rows = "all"

    def __init__(self) -> None:
        super().__init__()
        self.attn = {}

    def forward(self, hidden, mask, attn=None, layer=0, **kw):
        self.attn[layer] = attn
        keep = DROP[:, : mask.shape[1]] & mask if layer == 0 else mask
        return Selection(keep=keep, soft=keep.float())


@pytest.mark.parametrize("arch", ENCODERS)
def test_scorer_sees_the_layers_softmax(arch):
    """The scorer's A⁽ˡ⁾ is the softmax the layer computes, position terms included: equal to
    the stock eager attentions at layer 1 (real query rows; DeBERTa masks padding rows too)."""
    model = build(arch)
    ids, mask = batch()
    if model.config._attn_implementation != "eager":
        model.set_attn_implementation("eager")
    with torch.no_grad():
        stock = model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions[0]
    attnprune.patch(model, "attention_mass", keep_ratio=0.5, after_layer=1)
    spy = attnprune.patch_state(model).modules = Spy()
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    real = mask.bool()
    got = spy.attn[0].permute(0, 2, 1, 3)[real]  # (real queries, H, L)
    assert torch.allclose(got, stock.permute(0, 2, 1, 3)[real], atol=1e-5)


@pytest.mark.parametrize("arch", ENCODERS)
def test_scorer_after_a_gather_keeps_positions(arch):
    """At the second pruning layer the tokens have been gathered: the scorer's probabilities
    among the kept tokens equal those of the soft path (full length, stock positions, dropped
    keys masked with bias −30)."""
    extra = {"layer_types": ["full_attention", "sliding_attention", "full_attention"]} \
        if arch == "modernbert" else {}  # the second pruning layer local (window 4)
    model = _no_dropout(build(arch, num_hidden_layers=3, **extra))
    ids, mask = batch()
    attnprune.patch(model, "attention_mass", schedule=[0.5, 0.25], after_layer=1)
    spy = attnprune.patch_state(model).modules = Spy()
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
        hard = spy.attn[1]  # (B, H, K, K), the kept tokens in ascending order
        model.train()
        model(input_ids=ids, attention_mask=mask)
        soft = spy.attn[1]  # (B, H, L, L)
    for b in range(3):
        pos = DROP[b].nonzero().squeeze(1)
        k = len(pos)
        expect = soft[b][:, pos][:, :, pos]
        assert torch.allclose(hard[b, :, :k, :k], expect, atol=1e-5), (arch, b)
