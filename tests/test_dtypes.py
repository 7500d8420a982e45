"""bf16 and fp16 everywhere: every registered method on every family, the model loaded in
that dtype and patched afterwards (the usual order), one eval forward and one training step
under autocast; and, where the kept tokens do not depend on rounding (a fixed keep set), the
outputs equal the fp32 model's within a tolerance that a wrong mask or position breaks.

bf16 and fp16 run on the CPU, so this matrix runs in CI without a GPU (the GPU script
``scripts/gpu/job.sh`` runs it on CUDA too, where layer_norm refuses mixed dtypes that the
CPU kernels accept).
"""

from __future__ import annotations

import pytest
import torch
from test_attention_families import ARCHS, DECODERS, ON, batch, build  # tests/ is on sys.path
from test_encoder_families import Fixed

import attnprune
from attnprune.methods import registry

DTYPES = [torch.bfloat16, torch.float16]
ENCODERS = [a for a in ARCHS if a not in DECODERS]
TOKEN = [m for m in registry.list_methods("token") if not registry.get(m).cls.causal]
CAUSAL = [m for m in registry.list_methods("token") if registry.get(m).cls.causal]
OTHER = registry.list_methods("attention") + registry.list_methods("loss")
CASES = ([(a, m) for a in ENCODERS for m in TOKEN + OTHER]
         + [(a, m) for a in DECODERS for m in CAUSAL + OTHER])


def _options(arch: str, method: str) -> dict:
    if method in OTHER:
        return dict(ON[method])
    if arch in DECODERS:
        return {"keep_ratio": 0.5}
    opts = {"keep_ratio": 0.5, "after_layer": 1}
    if method == "entropy_threshold":
        opts = {"after_layer": 1, "threshold": 0.9}
    return opts


def _logits(model, ids, mask):
    return model(input_ids=ids, attention_mask=mask).logits


def test_the_matrix_covers_the_registry():
    every = set(registry.list_methods())
    covered = {m for _, m in CASES}
    assert every <= covered, every - covered


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize(("arch", "method"), CASES)
def test_low_precision_forward_and_training_step(arch, method, dtype):
    ids, mask = batch()
    # the causal token host runs sequences inside a sliding window only (hf_llama)
    extra = {"sliding_window": 64} if arch in ("mistral", "gemma2") and method in CAUSAL else {}
    ref = build(arch, **extra)
    model = build(arch, **extra).to(dtype)  # loaded in low precision, patched afterwards
    attnprune.patch(ref, method, **_options(arch, method))
    attnprune.patch(model, method, **_options(arch, method))
    for p in attnprune.patch_state(model).modules.parameters() if attnprune.patch_state(
            model).modules is not None else ():
        assert p.dtype == dtype, "the method's parameters did not follow the model's dtype"
    with torch.no_grad():
        want = _logits(ref, ids, mask)
        got = _logits(model, ids, mask)
    assert got.dtype == dtype and got.shape == want.shape and torch.isfinite(got).all()
    # No value comparison here: tokens whose scores lie within rounding of the cut (a top-k
    # boundary, a threshold) are kept in one dtype and dropped in the other, so the values
    # are compared where the kept set cannot depend on rounding (the fixed-set test below).
    st_ref, st = attnprune.patch_state(ref).stats, attnprune.patch_state(model).stats
    if "kept_per_layer" in st and not getattr(registry.get(method).cls, "variable_budget", False):
        assert st["kept_per_layer"] == st_ref["kept_per_layer"]  # ⌊ρ·n⌋ whatever the dtype

    model.train()
    labels = ids.masked_fill(mask == 0, -100) if arch in DECODERS else torch.zeros(len(ids), dtype=torch.long)
    with torch.autocast("cpu", dtype=dtype):
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        loss = out.loss
        aux = attnprune.aux_loss(model)
        if aux is not None:
            loss = loss + aux
    loss.float().backward()
    assert torch.isfinite(loss.float())
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g.float()).all() for g in grads)


# ----------------------------------------------------------------------------- exact, fixed set
TOL = {torch.bfloat16: 0.05, torch.float16: 0.01}  # relative to max|fp32| at real tokens


def _fixed_states(arch: str, dtype, keep: torch.Tensor) -> torch.Tensor:
    """Last hidden states at real tokens of ``arch`` in ``dtype`` with the tokens ``keep``
    gathered after layer 1 (a selection that does not depend on rounding)."""
    ids, mask = batch()
    model = build(arch).to(dtype)
    attnprune.patch(model, "random", keep_ratio=0.5, after_layer=1, output="scatter")
    attnprune.patch_state(model).modules = Fixed(keep)
    with torch.no_grad():
        h = model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
    return h[mask.bool()].float()


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("arch", ENCODERS)
def test_low_precision_gather_equals_fp32(arch, dtype):
    """A fixed keep set (every other token, CLS and the last real token kept by the host) in
    bf16/fp16 equals fp32 within TOL; the same model keeping the other half of the tokens
    (a wrong mask) is farther than TOL: the tolerance can tell a wrong mask apart."""
    ids, _ = batch()
    L = ids.shape[1]
    keep = (torch.arange(L) % 2 == 0).expand_as(ids).clone()
    want = _fixed_states(arch, torch.float32, keep)
    got = _fixed_states(arch, dtype, keep)
    scale = want.abs().max()
    err = float((got - want).abs().max() / scale)
    wrong = float((_fixed_states(arch, torch.float32, ~keep) - want).abs().max() / scale)
    assert err < TOL[dtype], f"{arch}: {err:.4f} ≥ {TOL[dtype]} against fp32"
    assert wrong > 2 * TOL[dtype], f"{arch}: a wrong mask moved the states by {wrong:.4f} only"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (scripts/gpu/job.sh)")
def test_cuda_bf16_every_method_and_family():
    """The matrix above on CUDA in bf16 (CUDA's layer_norm refuses the mixed dtypes that the
    CPU kernel accepts), forward and a training step under CUDA autocast; all failures at once."""
    failed = []
    for arch, method in CASES:
        try:
            ids, mask = (t.cuda() for t in batch())
            extra = {"sliding_window": 64} if arch in ("mistral", "gemma2") and method in CAUSAL else {}
            model = build(arch, **extra).to("cuda", torch.bfloat16)
            attnprune.patch(model, method, **_options(arch, method))
            with torch.no_grad():
                assert torch.isfinite(_logits(model, ids, mask).float()).all()
            model.train()
            labels = (ids.masked_fill(mask == 0, -100) if arch in DECODERS
                      else torch.zeros(len(ids), dtype=torch.long, device="cuda"))
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(input_ids=ids, attention_mask=mask, labels=labels)
                aux = attnprune.aux_loss(model)
                loss = out.loss if aux is None else out.loss + aux
            loss.float().backward()
            assert torch.isfinite(loss.float())
        except Exception as e:  # noqa: BLE001 - collected and reported together
            failed.append(f"{arch}/{method}: {type(e).__name__}: {str(e)[:160]}")
    assert not failed, "\n".join(failed)
