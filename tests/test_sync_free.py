"""The token host's sync-free forward (the GPU path, checkable on the CPU) and its trust
contracts: ``torch.compile(fullgraph=True)`` for every fixed-ratio method, no host reads of
device data (run on the meta device, where any read raises), the same outputs as the CPU
path, several threads on one model, output flags refused, attention back-ends checked,
pickles and copies independent.
"""

from __future__ import annotations

import copy
import io
import json
import pickle
import sys
import threading
import warnings

import pytest
import torch
from test_attention_families import batch as family_batch  # tests/ is on sys.path
from test_attention_families import build
from test_encoder_families import ENCODERS
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    BertModel,
    RobertaConfig,
    RobertaForSequenceClassification,
)

import attnprune
from attnprune.hosts.hf_encoder_paths import LazyStats, fixed_width
from attnprune.methods import registry

# MiniLM-L6's shape (6 layers, width 384, 12 heads, FFN 1536) with a small vocabulary and
# random weights: the model the issue names, without its 90 MB of embeddings.
MINILM = {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12,
          "intermediate_size": 1536, "hidden_dropout_prob": 0.0,
          "attention_probs_dropout_prob": 0.0, "vocab_size": 200}
SMALL = {"hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
         "intermediate_size": 64, "hidden_dropout_prob": 0.0,
         "attention_probs_dropout_prob": 0.0, "vocab_size": 100}


def _encoder_token_methods(fixed: bool) -> list[str]:
    """Registered token methods that patch an encoder, fixed-ratio (top-k) or not."""
    out = []
    for name in registry.list_methods("token"):
        cls = registry.get(name).cls
        if getattr(cls, "causal", False):
            continue  # decoder methods (the causal hosts)
        if bool(getattr(cls, "variable_budget", False)) != (not fixed):
            continue
        out.append(name)
    return out


FIXED = _encoder_token_methods(fixed=True)
VARIABLE = _encoder_token_methods(fixed=False)


def test_method_lists_cover_the_registry():
    assert {"attention_mass", "entropy", "entropy_gumbel", "random"} <= set(FIXED)
    assert {"ltp", "entropy_threshold"} <= set(VARIABLE)


def _bert(cfg=SMALL, cls=BertForSequenceClassification, seed=0):
    torch.manual_seed(seed)
    kw = {"num_labels": 3} if cls is BertForSequenceClassification else {}
    return cls(BertConfig(**cfg, **kw)).eval()


def _batch(B=4, L=24, vocab=100, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (B, L), generator=g)
    am = torch.ones(B, L, dtype=torch.long)
    for b in range(1, B):  # right padding: rows of L, L-5, L-10, …
        am[b, max(L - 5 * b, 3):] = 0
    return ids, am


def _out(o):
    return o.logits if hasattr(o, "logits") else o.last_hidden_state


# ----------------------------------------------------------------------------- compile
@pytest.mark.parametrize("variant", ["mean", "cls"])
def test_compile_fullgraph_attention_mass_on_minilm(variant):
    """MiniLM-shaped BERT, padded batch: no graph break (fullgraph raises on one, and on a
    ``.item()`` / ``bool(tensor)`` read), and the compiled logits equal the eager CPU path's."""
    model = _bert(MINILM)
    attnprune.patch(model, "attention_mass", keep_ratio=0.25, after_layer=1, variant=variant)
    ids, am = _batch(B=4, L=32, vocab=200)
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=am).logits
        got = torch.compile(model, fullgraph=True, backend="aot_eager")(
            input_ids=ids, attention_mask=am).logits
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("method", FIXED)
@pytest.mark.parametrize("cls", [BertForSequenceClassification, BertModel])
def test_compile_fullgraph_every_fixed_ratio_method(method, cls):
    """Every fixed-ratio token method compiles as one graph, scatter and short outputs."""
    torch._dynamo.reset()
    model = _bert(cls=cls)
    attnprune.patch(model, method, keep_ratio=0.5, after_layer=1)
    ids, am = _batch()
    with torch.no_grad():
        ref = _out(model(input_ids=ids, attention_mask=am))
        got = _out(torch.compile(model, fullgraph=True, backend="eager")(
            input_ids=ids, attention_mask=am))
    assert got.shape == ref.shape
    if method != "random":  # compiled code draws other random numbers
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- eager, no reads
@pytest.mark.parametrize("method", FIXED + VARIABLE)
@pytest.mark.parametrize("cls", [BertForSequenceClassification, BertModel])
def test_sync_free_path_equals_the_cpu_path(method, cls):
    """sync_free=True (the default on a GPU) keeps the same tokens as the CPU path (exact
    widths, row groups): the same outputs, the same statistics once read."""
    ids, am = _batch(B=5, L=20)
    outs, stats = [], []
    for free in (False, True):
        model = _bert(cls=cls)
        if method in VARIABLE:  # thresholds that keep different counts per row
            opts = {"threshold": 0.9} if method == "entropy_threshold" else {}
        else:
            opts = {}
        attnprune.patch(model, method, keep_ratio=0.5, after_layer=1, sync_free=free,
                        schedule="geometric", **opts)
        if method == "ltp":  # θ calibrated by a training forward to keep some tokens, not all
            model.train()
            model(input_ids=ids, attention_mask=am)
            model.eval()
        torch.manual_seed(3)
        with torch.no_grad():
            outs.append(_out(model(input_ids=ids, attention_mask=am)))
        st = attnprune.patch_state(model).stats
        stats.append((st["real_tokens"], st["kept_per_layer"]))
        assert isinstance(st, LazyStats) == free
        assert json.loads(json.dumps(dict(st)))["real_tokens"] == st["real_tokens"]
    torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-5)
    assert stats[0] == stats[1]
    assert stats[0][1][-1] < stats[0][0], "nothing was pruned: the comparison says nothing"


def _pairs(kind: str):
    """A padded batch of sentence pairs, short enough that ⌊ρ·K⌋ at ρ = 0.25 (2 for K = 11) is
    below a pair's protected count: BERT's [CLS] a [SEP] b [SEP] (the middle [SEP] ends the
    first token_type_ids segment), RoBERTa's <s> a </s></s> b </s> (ids 0 and 2, no segments)."""
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(5, 100, (3, 11), generator=g)
    am = torch.ones_like(ids)
    am[1, 9:] = 0
    am[2, 7:] = 0
    lengths = am.sum(1).tolist()
    extra = {}
    if kind == "bert":
        tt = torch.zeros_like(ids)
        for b, n in enumerate(lengths):
            mid = n // 2
            ids[b, [0, mid, n - 1]] = torch.tensor([2, 3, 3])
            tt[b, mid + 1:n] = 1
        extra["token_type_ids"] = tt
    else:
        for b, n in enumerate(lengths):
            mid = n // 2
            ids[b, [0, mid, mid + 1, n - 1]] = torch.tensor([0, 2, 2, 2])
        ids[am == 0] = 1
    return {"input_ids": ids, "attention_mask": am, **extra}


@pytest.mark.parametrize("method", ["attention_mass", "entropy"])
@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_sync_free_path_keeps_a_pairs_separators(kind, method):
    """Both paths keep every protected token of a sentence pair when ⌊ρ·K⌋ is below their
    count: the same kept tokens, the same outputs (the sync-free gather was ⌊ρ·K⌋ = 2 wide and
    cut the separators: kept [13, 5, 5, 5] on the CPU against [13, 4, 4, 4])."""
    x = _pairs(kind)
    outs, kept = [], []
    for free in (False, True):
        torch.manual_seed(0)
        if kind == "bert":
            model = BertModel(BertConfig(**SMALL)).eval()
        else:
            model = RobertaForSequenceClassification(RobertaConfig(
                **SMALL, pad_token_id=1, bos_token_id=0, eos_token_id=2)).eval()
        attnprune.patch(model, method, keep_ratio=0.25, after_layer=1, sync_free=free,
                        output="scatter")
        with torch.no_grad():
            outs.append(_out(model(**x)))
        kept.append(attnprune.patch_state(model).stats["kept_per_layer"])
    n_protected = 3 if kind == "bert" else 4
    assert kept[0][1] == 3 * n_protected, kept  # every row keeps just its protected tokens
    assert kept[1] == kept[0]
    torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-5)


def test_sync_free_path_says_when_protected_tokens_do_not_fit():
    """A row with more protected tokens than the fixed width holds (here 6 separators, width
    max(⌊0.25·11⌋, 4) = 4): the sync-free path cannot keep them all without reading the
    device, so reading its stats counts them and warns once; a standard pair does not."""
    torch.manual_seed(0)
    model = attnprune.patch(BertModel(BertConfig(**SMALL)).eval(), "attention_mass",
                            keep_ratio=0.25, after_layer=1, sync_free=True, output="scatter",
                            protect_token_ids=[3])
    x = _pairs("bert")
    with torch.no_grad():
        model(**x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a pair fits: no warning
        assert attnprune.patch_state(model).stats["protected_cut"] == 0
    many = dict(x)
    many["input_ids"] = x["input_ids"].clone()
    many["input_ids"][0, 1:7] = 3  # six more separators in the first row
    with torch.no_grad():
        model(**many)
    with pytest.warns(UserWarning, match="protected token"):
        cut = attnprune.patch_state(model).stats["protected_cut"]
    assert cut > 0
    with torch.no_grad():
        model(**many)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per patch
        assert attnprune.patch_state(model).stats["protected_cut"] == cut


def test_fixed_width_is_the_largest_budget():
    assert fixed_width(64, 0.25) == 16
    assert fixed_width(10, 0.7) == 7  # ⌊0.7·10⌋ with float error guarded
    assert fixed_width(5, 0.1) == 4  # a pair's CLS and separators (RoBERTa: <s> </s></s> </s>)
    assert fixed_width(3, 0.1) == 3
    assert fixed_width(1, 0.5) == 1


def _stock_mask_shortcut_only(monkeypatch):
    """HF's "no padding, no mask" shortcut (``_ignore_bidirectional_mask_sdpa``: it reads
    ``padding_mask.all()``) answers "no" to the stock model's own call before the encoder, which
    the host does not control, and fails the test when the host's code asks it: the sync-free
    path must build its masks without it (``allow_is_bidirectional_skip=False``)."""
    import transformers.masking_utils as mu

    def shortcut(*args, **kwargs):
        frame = sys._getframe(1)
        while frame is not None:
            name = frame.f_globals.get("__name__", "")
            if name.startswith("attnprune."):
                raise AssertionError(f"the host's {name}.{frame.f_code.co_name} asked HF's mask "
                                     "shortcut, which reads the device")
            frame = frame.f_back
        return False

    monkeypatch.setattr(mu, "_ignore_bidirectional_mask_sdpa", shortcut)


def test_mask_shortcut_guard_can_fail(monkeypatch):
    """The guard above sees the host asking the shortcut (the CPU path does, by design)."""
    _stock_mask_shortcut_only(monkeypatch)
    model = _bert(cls=BertModel)
    attnprune.patch(model, "attention_mass", keep_ratio=0.5, after_layer=1, sync_free=False,
                    bucket_rows=False)
    ids, am = _batch()
    with pytest.raises(AssertionError, match="mask shortcut"), torch.no_grad():
        model(input_ids=ids, attention_mask=am)


def _on_meta(method, monkeypatch):
    """A BERT patched with ``method`` on the sync-free path, on the meta device (HF's own mask
    shortcut, ``padding_mask.all()`` in the stock model before the encoder, answers "no"; the
    host asking it fails), and a call running it on a padded batch."""
    _stock_mask_shortcut_only(monkeypatch)
    model = _bert(cls=BertModel)
    attnprune.patch(model, method, keep_ratio=0.5, after_layer=1, sync_free=True,
                    schedule="geometric")
    model.to("meta")
    ids, am = _batch()
    return model, lambda: model(input_ids=ids.to("meta"), attention_mask=am.to("meta"))


@pytest.mark.parametrize("method", FIXED)
def test_sync_free_forward_never_reads_the_device(method, monkeypatch):
    """The sync-free forward on the meta device, where every read of a value raises
    (``.item()``, ``bool()``, ``.tolist()``): it must run to the end. HF's own mask shortcut
    (``padding_mask.all()``, the stock model's, before the encoder) is switched off."""
    model, run = _on_meta(method, monkeypatch)
    with torch.no_grad():
        out = run()
    assert out.last_hidden_state.shape == (4, 24, 32)
    with pytest.raises(Exception, match="meta"):  # the counts stayed on the device
        attnprune.patch_state(model).stats["kept_per_layer"]


@pytest.mark.parametrize("method", ["attention_mass", "entropy"])
@pytest.mark.parametrize("arch", ENCODERS)
def test_every_family_sync_free_forward_never_reads_the_device(arch, method, monkeypatch):
    """The meta-device check for every encoder family (their own forwards, masks and position
    tables): DeBERTa-v2 read its float mask (``.all()``) and DeBERTa-v2 and ModernBERT asked
    HF's mask shortcut, both reads of the device."""
    _stock_mask_shortcut_only(monkeypatch)
    model = build(arch)
    attnprune.patch(model, method, keep_ratio=0.5, after_layer=1, sync_free=True,
                    output="scatter")
    model.to("meta")
    ids, am = family_batch()
    with torch.no_grad():
        out = model.base_model(input_ids=ids.to("meta"), attention_mask=am.to("meta"))
    assert out.last_hidden_state.shape == (*ids.shape, 32)
    with pytest.raises(Exception, match="meta"):  # it pruned: the counts stayed on the device
        attnprune.patch_state(model).stats["kept_per_layer"]


def _refuse_python_data_on_a_device(monkeypatch):
    """``torch.tensor`` / ``torch.as_tensor`` of Python data onto a device other than the CPU
    raise: on CUDA that is a host-to-device copy, which waits for the device (the meta device
    runs it silently; an H200 under ``set_sync_debug_mode("error")`` did not)."""
    def guard(fn):
        def wrapped(data, *args, **kwargs):
            dev = kwargs.get("device")
            if dev is not None and torch.device(dev).type != "cpu" and not isinstance(
                    data, torch.Tensor):
                raise AssertionError(f"Python data {data!r} copied to {dev}")
            return fn(data, *args, **kwargs)
        return wrapped

    monkeypatch.setattr(torch, "tensor", guard(torch.tensor))
    monkeypatch.setattr(torch, "as_tensor", guard(torch.as_tensor))


@pytest.mark.parametrize("method", ["attention_mass", "entropy", "random"])
def test_sync_free_forward_copies_nothing_to_the_device(method, monkeypatch):
    """After a warm-up (per-device tables are built once), the sync-free forward sends no
    Python number to the device: k = ⌊ρ·n⌋ takes ρ as a CPU scalar. Failed on the H200 before
    (selection.budget made ρ on the device) — checked here on the meta device."""
    _, run = _on_meta(method, monkeypatch)
    with torch.no_grad():
        run()  # warm-up
        _refuse_python_data_on_a_device(monkeypatch)
        out = run()
    assert out.last_hidden_state.shape == (4, 24, 32)


def test_python_data_guard_can_fail(monkeypatch):
    _refuse_python_data_on_a_device(monkeypatch)
    with pytest.raises(AssertionError, match="copied to meta"):
        torch.tensor(0.5, device="meta")
    torch.tensor(0.5)  # the CPU is fine


def test_meta_check_catches_a_read():
    """The meta-device check above can fail: the CPU path reads counts back."""
    model = _bert(cls=BertModel)
    attnprune.patch(model, "attention_mass", keep_ratio=0.5, after_layer=1, sync_free=False)
    model.to("meta")
    ids, _ = _batch()
    with pytest.raises(Exception, match="meta"), torch.no_grad():
        model(input_ids=ids.to("meta"))


# ----------------------------------------------------------------------------- threads
def _concurrent(calls, ref, rounds: int, n_threads: int = 4):
    """Run ``calls`` from ``n_threads`` threads, each going round the list ``rounds`` times
    from its own start; returns ((thread, call) pairs whose output differs from ``ref``,
    the errors raised)."""
    wrong, errors = [], []

    def work(t):
        try:
            with torch.no_grad():
                for r in range(rounds):
                    j = (t + r) % len(calls)
                    if not torch.allclose(calls[j](), ref[j], atol=1e-5):
                        wrong.append((t, j))
        except Exception as e:  # noqa: BLE001 - returned to the test, which asserts on it
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return wrong, errors


def test_threads_share_one_patched_model():
    """4 threads × batches of different shapes through one patched BERT equal the same calls
    made one after another (per-call data lives on the calling thread)."""
    torch.set_num_threads(1)
    model = _bert()
    attnprune.patch(model, "attention_mass", keep_ratio=0.4, after_layer=1)
    shapes = [(1, 9), (3, 24), (2, 16), (5, 12)]
    batches = [_batch(B, L, seed=i) for i, (B, L) in enumerate(shapes)]
    with torch.no_grad():
        ref = [model(input_ids=i, attention_mask=a).logits for i, a in batches]
    calls = [lambda b=b: model(input_ids=b[0], attention_mask=b[1]).logits for b in batches]
    wrong, errors = _concurrent(calls, ref, rounds=30)
    assert not errors, errors
    assert not wrong, f"calls scored with another call's data: {wrong}"


# ----------------------------------------------------------------------------- flags, back-ends
@pytest.mark.parametrize("flag", ["output_hidden_states", "output_attentions"])
def test_output_flags_are_refused_when_pruning(flag):
    model = _bert(cls=BertModel)
    ids, am = _batch()
    attnprune.patch(model, "attention_mass", keep_ratio=0.5, after_layer=1)
    with pytest.raises(ValueError, match=flag):
        model(input_ids=ids, attention_mask=am, **{flag: True})
    attnprune.unpatch(model)
    attnprune.patch(model, "attention_mass", keep_ratio=1.0, after_layer=1)  # nothing pruned
    out = model(input_ids=ids, attention_mask=am, **{flag: True})
    assert out[flag.removeprefix("output_")] is not None


def test_unsupported_attention_backends_are_refused():
    model = _bert()
    model.config._attn_implementation = "flash_attention_2"  # no kernel here: set by hand
    with pytest.raises(ValueError, match="attn_implementation.*sdpa.*eager"):
        attnprune.patch(model, "attention_mass", keep_ratio=0.5)
    model.config._attn_implementation = "sdpa"
    attnprune.patch(model, "attention_mass", keep_ratio=0.5)
    model.config._attn_implementation = "flex_attention"  # switched after patching
    with pytest.raises(ValueError, match="flex_attention"):
        model(input_ids=_batch()[0])


# ----------------------------------------------------------------------------- pickles, copies
def test_patched_encoder_pickles_and_copies_independently():
    model = _bert()
    attnprune.patch(model, "entropy", keep_ratio=0.5, after_layer=1)
    ids, am = _batch()
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=am).logits
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    for other in (loaded, pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        with torch.no_grad():
            torch.testing.assert_close(other(input_ids=ids, attention_mask=am).logits, ref)
        with torch.no_grad():  # its own layers: changing the copy leaves the original alone
            other.bert.encoder.layer[2].output.dense.weight.normal_()
            assert not torch.allclose(other(input_ids=ids, attention_mask=am).logits, ref)
            torch.testing.assert_close(model(input_ids=ids, attention_mask=am).logits, ref)


# ----------------------------------------------------------------------------- CUDA only
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (scripts/gpu/job.sh)")


@cuda
@pytest.mark.parametrize("method", FIXED)
def test_cuda_pruned_forward_never_synchronises(method):
    """On CUDA in bf16, the pruned forward (after a warm-up) runs under
    torch.cuda.set_sync_debug_mode("error"): any host read of device data raises."""
    model = _bert(MINILM, cls=BertModel).to("cuda", torch.bfloat16)
    attnprune.patch(model, method, keep_ratio=0.25, after_layer=1)
    ids = torch.randint(5, 200, (8, 128), device="cuda")
    with torch.no_grad():
        model(input_ids=ids)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = model(input_ids=ids)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert out.last_hidden_state.shape == (8, 128, 384)
    assert attnprune.patch_state(model).stats["kept_per_layer"][-1] == 8 * 32


# ----------------------------------------------------------------------------- causal hosts
def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=40, n_positions=48, n_embd=32, n_layer=4,
                                      n_head=4, bos_token_id=0, eos_token_id=0)).eval()


@pytest.mark.parametrize("flag", ["output_hidden_states", "output_attentions"])
def test_causal_output_flags_are_refused_when_pruning(flag):
    """GPT-2 returned None for both; now a clear error while pruning, stock outputs when the
    patch prunes nothing (keep_ratio 1)."""
    ids = torch.randint(0, 40, (2, 10))
    model = _gpt2()
    attnprune.patch(model, "ltp", keep_ratio=0.5)
    with pytest.raises(ValueError, match=flag):
        model(ids, **{flag: True})
    attnprune.unpatch(model)
    attnprune.patch(model, "ltp", keep_ratio=1.0)
    model(ids, **{flag: False})  # asking for nothing is fine


def test_causal_hosts_check_the_attention_backend():
    model = _gpt2()
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="attn_implementation"):
        attnprune.patch(model, "ltp", keep_ratio=0.5)
    model.config._attn_implementation = "sdpa"
    attnprune.patch(model, "ltp", keep_ratio=0.5)
    model.config._attn_implementation = "flex_attention"
    with pytest.raises(ValueError, match="flex_attention"):
        model(torch.randint(0, 40, (1, 6)))


def test_causal_method_follows_a_bf16_model():
    """Loaded in bf16, patched afterwards: the method's weights are bf16 too (was: fp32, and
    "mat1 and mat2 must have the same dtype" on every causal method)."""
    model = _gpt2().to(torch.bfloat16)
    attnprune.patch(model, "ltp", keep_ratio=0.5)
    assert {p.dtype for p in attnprune.patch_state(model).modules.parameters()} == {torch.bfloat16}
    with torch.no_grad():
        assert model(torch.randint(0, 40, (2, 10))).logits.dtype == torch.bfloat16


def test_threads_share_one_patched_decoder():
    """The causal host keeps a call's data in the call (``_Pass``): 4 threads × prompts of
    different shapes through one pruned GPT-2 equal the same calls made one by one."""
    from test_hf_causal import force_pruning  # tests/ is on sys.path

    torch.set_num_threads(1)
    model = _gpt2()
    attnprune.patch(model, "ltp", keep_ratio=0.5)
    force_pruning(model)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 40, (b, t), generator=g) for b, t in [(1, 7), (3, 20), (2, 12), (4, 16)]]
    with torch.no_grad():
        ref = [model(p).logits for p in prompts]
    assert min(attnprune.patch_state(model).stats["kept_per_layer"]) < 1.0  # it prunes
    wrong, errors = _concurrent([lambda p=p: model(p).logits for p in prompts], ref, rounds=25)
    assert not errors and not wrong, (errors, wrong)
