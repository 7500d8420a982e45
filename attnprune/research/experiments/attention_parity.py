"""Print the parity figures of issue 4 on tiny local BERT, DistilBERT and GPT-2 models.

    python -m attnprune.research.experiments.attention_parity

For each model (2 layers, width 32, 4 heads, random weights with the query projection scaled
×8 so attention is far from flat; 3 sequences of 12 tokens, two of them padded): the largest
absolute difference of the last hidden states (real tokens) and logits between the stock model
and the model patched with a neutral setting (crisp s = 0, intensity fixed at 1, cost λ = 0),
and between the intensity SDPA path and its eager reference (random predictor, all presets).
The tests assert the same quantities ≤ 1e-5; this command shows the numbers.
"""

from __future__ import annotations

import sys

import torch

from attnprune import api

V, T = 100, 12


def _tiny(family: str):
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        DistilBertConfig,
        DistilBertForSequenceClassification,
        GPT2Config,
        GPT2LMHeadModel,
    )

    if family == "bert":
        m = BertForSequenceClassification(BertConfig(
            vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=64))
    elif family == "distilbert":
        m = DistilBertForSequenceClassification(DistilBertConfig(
            vocab_size=V, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
            max_position_embeddings=64))
    else:
        m = GPT2LMHeadModel(GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4,
                                       n_positions=64, bos_token_id=0, eos_token_id=0))
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith(("query.weight", "q_lin.weight", "c_attn.weight")):
                p.mul_(8.0)  # sharper attention, so a wrong mask or scale would show
    return m.eval()


def _outputs(model, ids, mask):
    out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    real = mask.bool()
    lg = out.logits[real] if out.logits.dim() == 3 else out.logits
    return torch.cat([out.hidden_states[-1][real].flatten(), lg.flatten()])


@torch.no_grad()
def parity() -> list[tuple[str, str, float]]:
    """(model, setting, max |difference|) rows."""
    torch.manual_seed(0)
    ids = torch.randint(0, V, (3, T))
    mask = torch.ones(3, T, dtype=torch.long)
    mask[1, 8:] = 0
    mask[2, 5:] = 0
    rows = []
    for family in ("bert", "distilbert", "gpt2"):
        model = _tiny(family)
        ref = _outputs(model, ids, mask)
        for method, opts in (("crisp", {"sparsity": 0.0}), ("intensity", {"fixed": 1.0}),
                             ("cost", {"lam": 0.0})):
            api.patch(model, method, **opts)
            rows.append((family, f"{method} {opts} vs stock",
                         float((_outputs(model, ids, mask) - ref).abs().max())))
            api.unpatch(model)
        for preset in ("basic", "conservative", "position", "multihead"):
            api.patch(model, "intensity", preset=preset)
            for p in model.attnprune_method.parameters():
                p.add_(torch.randn_like(p) * 0.5)
            state = {k: v.clone() for k, v in model.attnprune_method.state_dict().items()}
            fused = _outputs(model, ids, mask)
            api.patch(model, "intensity", preset=preset, path="eager")
            model.attnprune_method.load_state_dict(state)
            eager = _outputs(model, ids, mask)
            api.unpatch(model)
            stock = _outputs(model, ids, mask)
            rows.append((family, (f"intensity {preset}: SDPA vs eager (effect vs stock "
                                 f"{float((fused - stock).abs().max()):.3g})"),
                         float((fused - eager).abs().max())))
    return rows


def main(argv: list[str] | None = None) -> int:
    """Print the parity table."""
    for family, setting, diff in parity():
        print(f"{family:<11} {setting:<62} {diff:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
