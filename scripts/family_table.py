"""Print the architecture × method-kind table of ``docs/families.md``, measured.

Every cell runs the registered methods of its kind on the tiny random model the tests use
(``tests/test_attention_families.py``: 2 layers, width 32, 4 heads, T = 12, two right-padded
rows; decoders from ``tests/test_hf_llama.py`` / ``tests/test_hf_causal.py``) and prints:

* works: the max |patched − unpatched| over every method of the kind at its neutral setting
  (token: keep_ratio = 1; attention/loss: sparsity 0, fixed 1, λ 0), over the logits and the
  real tokens' last states (decoders: the logits); for encoder token cells also "gather", the
  max |Δ| at real tokens when the tokens after holes in the mask are gathered after layer 1
  (original positions kept, see ``tests/test_encoder_families.py::holes_gap``), and "drop",
  dropped real tokens against the same tokens masked as keys in the later layers (``drop_gap``),
  and the counted FLOPs of attention_mass at ρ = 0.5 after layer 1 of 2 relative to the full
  model (2 × 32 tokens);
* refused: the first line of the ValueError ``attnprune.patch`` raises (the why).

Usage (CPU, about two minutes at one thread):
    PYTHONPATH=$PWD python scripts/family_table.py --threads 1
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import transformers as tf
from test_attention_families import ARCHS, DECODERS, METHODS, build, parity
from test_encoder_families import (
    ENCODERS,
    LONG,
    TOKEN_METHODS,
    drop_gap,
    full_flops,
    holes_gap,
    token_parity,
)

import attnprune
from attnprune.measure import count_flops

LABELS = {"mistral": "mistral (sliding window)", "gemma2": "gemma2 (softcap, alternating sliding)",
          "phi3": "phi3 (fused qkv)", "albert": "albert (shared layers, per depth)",
          "mpnet": "mpnet (relative bias)", "deberta-v2": "deberta-v2 (disentangled)",
          "modernbert": "modernbert (RoPE, local/global)", "deberta": "deberta (v1)"}


def _refusal(model, method: str, **options) -> str | None:
    """The first sentence of the ValueError ``patch`` raises, or None when it patches."""
    try:
        attnprune.patch(model, method, **options)
    except ValueError as e:
        return str(e).split(": ", 1)[-1]
    attnprune.unpatch(model)
    return None


def _decoder_token_cell(arch: str) -> str:
    """Causal token methods (the causal hosts): logits at keep_ratio = 1 with decisive scorers;
    the non-causal ones are refused."""
    import test_hf_causal
    import test_hf_llama

    def tiny():
        return test_hf_causal.tiny() if arch == "gpt2" else test_hf_llama.tiny(arch)

    x = torch.randint(0, 40, (2, 24), generator=torch.Generator().manual_seed(0))
    worst, works, refused = 0.0, [], {}
    for method in TOKEN_METHODS:
        model = tiny()
        why = _refusal(model, method, keep_ratio=1.0)
        if why is not None:
            refused[method] = why
            continue
        with torch.no_grad():
            ref = model(x).logits
            attnprune.patch(model, method, keep_ratio=1.0)
            test_hf_causal.force_pruning(model)  # decisive scorers, but pruning is off
            worst = max(worst, float((model(x).logits - ref).abs().max()))
        works.append(method)
    # one reason for all: the messages differ only by the method's name at their start
    reasons = sorted({re.sub(r"^'[^']+' ", "", why) for why in refused.values()})
    return (f"works ({', '.join(works)}): {worst:.1e}; refused ({', '.join(sorted(refused))}): "
            + " / ".join(reasons))


def _flops_ratio(arch: str) -> float:
    """Counted FLOPs of attention_mass ρ = 0.5 after layer 1 of 2 over the full model's
    (``LONG``: 2 rows × 32 tokens, no padding)."""
    model = attnprune.patch(build(arch), "attention_mass", keep_ratio=0.5, after_layer=1)
    pruned = count_flops(lambda: model(input_ids=LONG, attention_mask=torch.ones_like(LONG)))
    return pruned / full_flops(arch)


def _encoder_token_cell(arch: str) -> str:
    worst = max(token_parity(arch, m) for m in TOKEN_METHODS)
    return (f"works (all {len(TOKEN_METHODS)}): {worst:.1e}, gather {holes_gap(arch):.1e}, "
            f"drop {drop_gap(arch):.1e}; FLOPs at ρ = 0.5: {_flops_ratio(arch):.3f}")


def _attention_cell(arch: str) -> str:
    return f"works ({', '.join(METHODS)}): {max(parity(arch, m) for m in METHODS):.1e}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, transformers {tf.__version__}, {args.threads} thread(s), "
          f"fp32 CPU; parity bound 1e-5")
    print()
    print("| architecture | token | attention / loss |")
    print("|---|---|---|")
    for arch in ARCHS:
        if arch in ENCODERS:
            token = _encoder_token_cell(arch)
        elif arch in DECODERS:
            token = _decoder_token_cell(arch)
        else:
            token = "?"
        print(f"| {LABELS.get(arch, arch)} | {token} | {_attention_cell(arch)} |")
    v1 = tf.DebertaForSequenceClassification(tf.DebertaConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, relative_attention=True)).eval()
    token = _refusal(v1, "attention_mass", keep_ratio=0.5)
    attention = _refusal(v1, "crisp", sparsity=0.5)
    print(f"| {LABELS['deberta']} | refused: {token} | refused: {attention} |")


if __name__ == "__main__":
    main()
