"""``attnprune.save_pretrained`` / ``from_pretrained``: every registered method, on a tiny BERT
classifier and (where the method runs there) a tiny GPT-2 LM, with its tensors moved away from
their initial values, saved, then loaded in a fresh Python process (one process for all cases,
``torch.load`` forbidden there) that compares logits, aux losses and the method's tensors.
Also stacks, a stock model, the errors, and the folder ``attnprune finetune`` writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import attnprune
from attnprune.deploy import hub

ROOT = Path(__file__).resolve().parents[1]
TOKEN_OPTIONS = {"bert": {"keep_ratio": 0.5, "after_layer": 1}, "gpt2": {"keep_ratio": 0.5}}
ATTENTION_OPTIONS = {"crisp": {"sparsity": 0.6}, "cost": {"lam": 1e-2}}
METHODS = attnprune.list_methods()
# (case name, family, [(method, options), ...]): every method alone on both models, plus
# stacks, crisp's adaptive schedule (its state is a buffer) and a stock model
CASES = [(f"{fam}-{m}", fam, [(m, None)]) for fam in ("bert", "gpt2") for m in METHODS] + [
    ("bert-crisp-adaptive", "bert", [("crisp", {"sparsity": 0.5, "schedule": "adaptive"})]),
    ("bert-stack-ltp+crisp", "bert", [("ltp", None), ("crisp", None)]),
    ("bert-stack-attention_mass+cost", "bert", [("attention_mass", None), ("cost", None)]),
    ("gpt2-stack-ltp+intensity", "gpt2", [("ltp", None), ("intensity", None)]),
    ("bert-stock", "bert", []),
]


def bert():
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=64, num_labels=3,
                     initializer_range=0.2)  # peaked attention: pruning shows in the logits
    return BertForSequenceClassification(cfg).eval()


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=50, n_embd=32, n_layer=4, n_head=4, n_positions=64, initializer_range=0.2,
                     bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg).eval()


def inputs(fam: str) -> dict:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 50, (3, 16), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 11:] = 0  # one padded row
    return {"input_ids": ids, "attention_mask": mask}


def options(fam: str, method: str, given: dict | None) -> dict:
    if given is not None:
        return given
    if attnprune.methods.registry.get(method).kind == "token":
        return dict(TOKEN_OPTIONS[fam])
    return dict(ATTENTION_OPTIONS.get(method, {}))


@torch.no_grad()
def perturb(module: torch.nn.Module) -> None:
    """Move every tensor of the method away from its initial value (so a load that ignored
    them would give other outputs / other tensors)."""
    g = torch.Generator().manual_seed(7)
    for name, p in module.named_parameters():
        step = torch.randn(p.shape, generator=g)
        # thresholds (LTP θ, causal LTP τ) go up, so that they drop tokens at inference
        p.add_(step.abs() if name.rsplit(".", 1)[-1] in ("theta", "tau") else step)
    for name, b in module.named_buffers():
        if b.dtype == torch.bool:
            b.fill_(True)
        elif b.is_floating_point():
            b.copy_(torch.rand(b.shape, generator=g) * 0.8 + 0.1)  # e.g. crisp's entropy EMA


@torch.no_grad()
def run(model, x: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
    torch.manual_seed(0)  # the random method draws from the global generator
    logits = model(**x).logits
    return logits, attnprune.aux_loss(model)


def states(model) -> list:
    s = attnprune.patch_state(model)
    return [] if s is None else list(getattr(s, "states", [s]))


CHECK = r'''
import json, sys, torch
def _no_pickle(*a, **k):
    raise AssertionError("torch.load called")
torch.load = _no_pickle
import attnprune
from safetensors.torch import load_file
out = {}
for case in json.loads(sys.argv[1]):
    exp = load_file(case["dir"] + "/expected.safetensors")
    model = attnprune.from_pretrained(case["dir"] + "/model")
    x = {"input_ids": exp["input_ids"], "attention_mask": exp["attention_mask"]}
    with torch.no_grad():
        torch.manual_seed(0)
        logits = model(**x).logits
    aux = attnprune.aux_loss(model)
    st = attnprune.patch_state(model)
    sts = [] if st is None else list(getattr(st, "states", [st]))
    tdiff = 0.0
    for i, s in enumerate(sts):
        for k, v in s.modules.state_dict().items():
            tdiff = max(tdiff, float((v.double() - exp[f"state.{i}.{k}"].double()).abs().max()))
    out[case["name"]] = {
        "logits": float((logits - exp["logits"]).abs().max()),
        "aux": None if aux is None else float((aux - exp["aux"]).abs()),
        "tensors": tdiff, "methods": [s.method for s in sts], "type": type(model).__name__,
        "n_tensors": sum(len(s.modules.state_dict()) for s in sts)}
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Build, patch, perturb and save every case; load them all in one fresh process."""
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("hub")
    built, unsupported, cases = {}, {}, []
    for name, fam, recipe in CASES:
        torch.manual_seed(0)
        model = bert() if fam == "bert" else gpt2()
        x = inputs(fam)
        try:
            for i, (m, opts) in enumerate(recipe):
                attnprune.patch(model, m, stack=i > 0, **options(fam, m, opts))
        except ValueError as e:  # the method does not run on this model (e.g. not causal)
            unsupported[name] = str(e)
            continue
        model.eval()  # the methods too (from_pretrained returns an eval model)
        before, _ = run(model, x)
        for s in states(model):
            perturb(s.modules)
        logits, aux = run(model, x)
        exp = {"logits": logits, **x}
        if aux is not None:
            exp["aux"] = aux
        for i, s in enumerate(states(model)):
            for k, v in s.modules.state_dict().items():
                exp[f"state.{i}.{k}"] = v.detach().clone().contiguous()
        d = root / name
        attnprune.save_pretrained(model, d / "model")
        save_file(exp, str(d / "expected.safetensors"))
        built[name] = {"changed": float((before - logits).abs().max()),
                       "n_tensors": sum(len(s.modules.state_dict()) for s in states(model))}
        cases.append({"name": name, "dir": str(d)})
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", CHECK, json.dumps(cases)], env=env, check=False,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"root": root, "built": built, "loaded": loaded, "unsupported": unsupported}


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_saved_model_reloads_identically_in_a_fresh_process(saved, name):
    if name in saved["unsupported"]:
        assert name.startswith("gpt2-"), saved["unsupported"][name]  # BERT runs every method
        pytest.skip(f"not for this model: {saved['unsupported'][name][:120]}")
    got = saved["loaded"][name]
    assert got["logits"] <= 1e-6
    assert got["aux"] is None or got["aux"] <= 1e-6
    assert got["tensors"] == 0.0
    assert got["n_tensors"] == saved["built"][name]["n_tensors"]
    recipe = json.loads((saved["root"] / name / "model" / hub.RECIPE).read_text())
    assert len(got["methods"]) == len(recipe["patches"])
    assert got["type"] == ("BertForSequenceClassification" if name.startswith("bert")
                           else "GPT2LMHeadModel")


def test_every_method_runs_somewhere_and_perturbing_matters(saved):
    """The cases are not vacuous: every method was saved at least on BERT, the causal token
    methods and the attention methods on GPT-2 too, and where a method has tensors that act at
    inference, moving them changed the logits (so ignoring them on load would fail)."""
    built = saved["built"]
    assert all(f"bert-{m}" in built for m in METHODS)
    for m in ("ltp", "dtr", "crisp", "intensity", "cost"):
        assert f"gpt2-{m}" in built, saved["unsupported"].get(f"gpt2-{m}")
    with_tensors = [n for n, b in built.items() if b["n_tensors"]
                    and n not in ("bert-crisp", "gpt2-crisp")]  # uniform crisp: an unused EMA
    assert {"bert-ltp", "bert-entropy", "bert-dtr", "gpt2-ltp", "gpt2-dtr",
            "bert-crisp-adaptive", "bert-stack-ltp+crisp"} <= set(with_tensors)
    for name in with_tensors:
        assert built[name]["changed"] > 1e-3, name  # ≫ the 1e-6 the reload is held to


def test_folder_is_a_plain_hf_folder_plus_recipe(saved):
    d = saved["root"] / "bert-stack-ltp+crisp" / "model"
    names = {p.name for p in d.iterdir()}
    assert {"config.json", "model.safetensors", hub.RECIPE, hub.WEIGHTS} <= names
    from safetensors.torch import load_file
    from transformers import AutoModelForSequenceClassification

    assert not any(k.startswith("attnprune") for k in load_file(str(d / "model.safetensors")))
    stock = AutoModelForSequenceClassification.from_pretrained(d)  # any HF tool reads it
    assert attnprune.patch_state(stock) is None
    r = json.loads((d / hub.RECIPE).read_text())
    # not compacted: written as format 1, which older readers still read
    assert r["format_version"] == 1 and r["attnprune_version"] == attnprune.__version__
    assert r["auto_class"] == "AutoModelForSequenceClassification"
    assert [p["method"] for p in r["patches"]] == ["ltp", "crisp"]
    assert r["patches"][0]["options"] == TOKEN_OPTIONS["bert"]
    assert r["patches"][0]["schedule"] == {"keep_ratios": [0.5, 0.5, 0.5]}
    g = json.loads((saved["root"] / "gpt2-ltp" / "model" / hub.RECIPE).read_text())
    assert g["auto_class"] == "AutoModelForCausalLM"
    assert g["patches"][0]["resolved_method"] == "ltp_causal"
    stock_recipe = json.loads((saved["root"] / "bert-stock" / "model" / hub.RECIPE).read_text())
    assert stock_recipe["patches"] == []
    assert not (saved["root"] / "bert-stock" / "model" / hub.WEIGHTS).exists()


def test_load_errors_are_clear(saved, tmp_path):
    plain = tmp_path / "plain"
    bert().save_pretrained(plain)
    with pytest.raises(ValueError, match="plain Hugging Face folder"):
        attnprune.from_pretrained(plain)
    with pytest.raises(ValueError, match="not a folder"):
        attnprune.from_pretrained(tmp_path / "missing")
    src = saved["root"] / "bert-ltp" / "model"
    for field, value, match in [("format_version", hub.FORMAT_VERSION + 1, "upgrade attnprune"),
                                ("method", "nope", "unknown method 'nope'")]:
        d = tmp_path / field
        d.mkdir()
        for f in src.iterdir():
            (d / f.name).write_bytes(f.read_bytes())
        r = json.loads((d / hub.RECIPE).read_text())
        if field == "method":
            r["patches"][0]["method"] = value
        else:
            r[field] = value
        (d / hub.RECIPE).write_text(json.dumps(r))
        with pytest.raises(ValueError, match=match):
            attnprune.from_pretrained(d)
    # an older version whose tensors no longer fit: the error says which versions
    d = tmp_path / "version"
    d.mkdir()
    for f in src.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    r = json.loads((d / hub.RECIPE).read_text())
    r["attnprune_version"] = "0.0.1"
    r["patches"][0]["options"]["after_layer"] = 2  # schedule now differs from the saved one
    (d / hub.RECIPE).write_text(json.dumps(r))
    with pytest.raises(ValueError, match=r"schedule.*saved by attnprune 0\.0\.1"):
        attnprune.from_pretrained(d)


def test_save_refuses_bad_options_and_foreign_folders(tmp_path):
    model = attnprune.patch(bert(), "crisp", sparsity=0.5)
    attnprune.patch_state(model).options["sparsity"] = object()  # e.g. a tensor-valued option
    with pytest.raises(ValueError, match="sparsity"):
        attnprune.save_pretrained(model, tmp_path / "m")
    assert not (tmp_path / "m").exists() and not list(tmp_path.glob(".m.tmp*"))
    results = tmp_path / "results"
    results.mkdir()
    (results / "summary.json").write_text("{}")
    with pytest.raises(ValueError, match="refusing to replace"):
        attnprune.save_pretrained(attnprune.patch(bert(), "crisp"), results)
    assert (results / "summary.json").is_file()
    # an existing saved folder is replaced whole
    attnprune.save_pretrained(attnprune.patch(bert(), "ltp"), tmp_path / "m")
    attnprune.save_pretrained(bert(), tmp_path / "m")
    assert json.loads((tmp_path / "m" / hub.RECIPE).read_text())["patches"] == []
    assert not (tmp_path / "m" / hub.WEIGHTS).exists()


def test_save_refuses_an_int8_model(tmp_path):
    q = attnprune.quantize_int8(attnprune.patch(bert(), "crisp"))
    with pytest.raises(ValueError, match="int8"):
        attnprune.save_pretrained(q, tmp_path / "q")


def test_patch_records_options_without_aliasing():
    sched = [1.0, 0.5]
    model = attnprune.patch(bert(), "attention_mass", keep_ratio=sched)
    sched.append(0.25)  # the caller's list changes later: the record does not
    assert attnprune.patch_state(model).options == {"keep_ratio": [1.0, 0.5]}
    assert attnprune.patch_state(model).requested == "attention_mass"


@pytest.mark.slow
def test_finetune_results_folder_loads_in_one_line(tmp_path):
    """``attnprune finetune`` saves each trained model with ``save_pretrained``: the folder
    loads with ``from_pretrained`` and reproduces the run's saved test scores; its
    ``model.safetensors`` still feeds ``load_weights`` (``--init-from``)."""
    import csv

    import numpy as np
    from transformers import (
        AutoTokenizer,
        BertConfig,
        BertForSequenceClassification,
        BertTokenizerFast,
    )

    from attnprune.research.data.text import load_text_data
    from attnprune.research.finetune import evaluate, main
    from attnprune.research.finetune.loaders import make_loader as _loader
    from attnprune.research.finetune.model_io import load_weights

    words = {0: ["awful", "bad"], 1: ["table", "door"], 2: ["great", "good"]}
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "it"] + [w for ws in words.values() for w in ws]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    torch.manual_seed(0)
    base = BertForSequenceClassification(BertConfig(
        vocab_size=len(vocab), hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=64, num_labels=3))
    base.save_pretrained(tmp_path / "base")
    BertTokenizerFast(vocab_file=str(tmp_path / "vocab.txt")).save_pretrained(tmp_path / "base")
    rng = np.random.default_rng(0)
    with (tmp_path / "data.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        for i in range(60):
            filler = " ".join(rng.choice(["the", "it"], size=rng.integers(2, 8)))
            w.writerow([f"{filler} {rng.choice(words[i % 3])} {filler}", i % 3])
    out = tmp_path / "out"
    n = torch.get_num_threads()
    try:
        assert main(["--model", str(tmp_path / "base"), "--data", f"csv:{tmp_path / 'data.csv'}",
                     "--method", "ltp", "--keep-ratio", "0.5", "--epochs", "1", "--lr", "1e-3",
                     "--batch-size", "8", "--eval-batch-size", "4", "--timing-batches", "1",
                     "--timing-repeats", "1", "--progress", "false", "--threads", "1",
                     "--out", str(out), "--exact-out"]) == 0
    finally:
        torch.set_num_threads(n)
    (folder,) = (out / "models").iterdir()
    model = attnprune.from_pretrained(folder)  # the one line
    assert attnprune.patch_state(model).method == "ltp"
    tok = AutoTokenizer.from_pretrained(folder)  # the tokenizer was saved with it
    cfg = json.loads((out / "summary.json").read_text())  # noqa: F841 (the run finished)
    data = load_text_data(f"csv:{tmp_path / 'data.csv'}", "text", "label")
    import yaml

    run_cfg = yaml.safe_load((out / "config.yaml").read_text())
    loader = _loader(data.test, tok, 4, run_cfg["max_length"], False, 0, run_cfg["max_test"])
    probs = evaluate(model, loader, progress=False)["probs"]
    (pred,) = (out / "predictions").glob("ltp*__seed0.npz")
    assert np.abs(probs - np.load(pred)["scores"]).max() <= 1e-6
    fresh = BertForSequenceClassification.from_pretrained(tmp_path / "base")
    load_weights(fresh, folder / "model.safetensors")  # old loader, new folder

