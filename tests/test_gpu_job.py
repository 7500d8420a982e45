"""The GPU job (scripts/gpu/job.sh, issue 46, item 5): what can be proved before a GPU runs it.

- Device placement: each step's model code runs with the model on the ``meta`` device, and a
  pre-hook on every module fails on any input tensor that is not on the model's device (the
  GPU run of 2026-11-28 crashed at the first in-training check: ``long_tasks.answer`` built
  ``torch.tensor([ids])`` on the CPU for a CUDA model; planted back, this test fails).
- A lint: in the functions the job runs on a model's inputs, no ``torch.tensor(...)`` or
  ``torch.arange(...)`` without ``device=``.
- The long-context recipe's ``--min-length`` fits every task with its tokenizer (64 did not:
  freqwords and multivalue with the BPE recipe).
- The job's files: every script it runs exists, ``bash -n`` accepts it, and the packer keeps a
  model folder to weights + tokenizer and its tarball within the limit.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import shlex
import subprocess
import tarfile
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import load_script

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "scripts" / "gpu" / "job.sh"
RECIPE = REPO / "scripts" / "gpu" / "long_recipe.sh"


# ----------------------------------------------------------------------------- placement
class OffDevice:
    """Forward pre-hooks on every module of ``model`` that record each tensor input not on
    the model's device (by module name)."""

    def __init__(self, model):
        self.device = next(model.parameters()).device
        self.calls, self.bad = 0, []
        self.handles = [m.register_forward_pre_hook(self._hook(name), with_kwargs=True)
                        for name, m in model.named_modules()]

    def _hook(self, name):
        def hook(mod, args, kwargs):
            self.calls += 1
            for i, v in [*enumerate(args), *kwargs.items()]:
                if isinstance(v, torch.Tensor) and v.device != self.device:
                    self.bad.append(f"{name or 'model'}: input {i} on {v.device}")
        return hook

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()


def _run_on_meta(model, fn):
    """Run ``fn()`` (which calls the model) with every input checked; a failure of the meta
    device itself (reading a value back) after the inputs were checked is expected."""
    with OffDevice(model) as watch:
        try:
            fn()
        except Exception as e:
            if watch.calls == 0:  # failed before the model saw anything: that is the finding
                raise AssertionError(f"no model call reached: {type(e).__name__}: {e}") from e
    assert watch.calls > 0
    assert not watch.bad, f"inputs built off the model's device: {watch.bad[:5]}"


def _meta_llama(vocab=256):
    from transformers import LlamaConfig, LlamaForCausalLM

    conf = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                       attn_implementation="sdpa", tie_word_embeddings=True)
    with torch.device("meta"):
        return LlamaForCausalLM(conf).eval()


@pytest.mark.parametrize("keep", [1.0, 0.5], ids=["stock-cache", "pruned-prefill"])
def test_long_tasks_answer_builds_its_prompt_on_the_model_device(keep):
    from attnprune.research.experiments import long_tasks

    model = _meta_llama()
    _run_on_meta(model, lambda: long_tasks.answer(model, list(range(5, 40)), [7, 8], 2,
                                                  keep=keep))


def test_the_in_training_check_builds_its_inputs_on_the_model_device():
    """scripts/train_long_tasks.py's quick check (evaluate → evaluation.evaluate → answer),
    the step that crashed on the GPU."""
    tl = load_script("train_long_tasks")
    a = tl.parse(["--out", "/tmp/unused", "--tokenizer", "bytes", "--tasks", "multikey",
                  "--length", "256", "--min-length", "160", "--eval-n", "1"])
    tok = tl.build_tokenizer(a)
    model = _meta_llama(256)
    _run_on_meta(model, lambda: tl.evaluate(a, model, tok, n=1, quiet=True))


def test_the_encoder_grid_builds_its_inputs_on_the_model_device():
    from attnprune.bench import gpu

    cfg = gpu.resolve(gpu.BenchGPUConfig(device="cpu", dtype="fp32", quick=True, decoders=(),
                                         merge_points=("tome@0.5", "merge@0.25")))
    object.__setattr__(cfg, "device", "meta")  # past the option check: the grid on meta
    pts = gpu._points(dataclasses.replace(cfg, device="cpu"), "tiny", torch.float32, 64)
    pts["models"].pop("int8", None)  # dynamic int8 has no meta kernels
    pts["int8_ok"] = False
    assert {"full", "mean@0.25/L1", "tome@0.5/L1", "mean@0.25/L1/merge"} <= set(pts["models"])
    for m in pts["models"].values():
        m.to("meta")
    for name, m in pts["models"].items():
        with OffDevice(m) as watch:
            gpu._encoder_cell(cfg, "tiny", {**pts, "models": {name: m}}, 2, 32)
        assert watch.calls > 0, name
        assert not watch.bad, (name, watch.bad[:5])


def test_the_prefill_bench_builds_its_inputs_on_the_model_device():
    from attnprune.bench import prefill as bp

    src = inspect.getsource(bp.bench_length)
    # the prompts are made on the CPU (a seeded generator) and moved in one place
    assert "prompts(cfg, L)" in src and ".to(cfg.device)" in src


# ----------------------------------------------------------------------------- lint
# (file, functions) the job runs on a model's inputs
LINTED = [
    ("attnprune/research/experiments/long_tasks.py", ("answer", "_greedy", "evaluate")),
    ("attnprune/bench/gpu.py", ("_encoder_cell", "_first_calls", "_decoder_rows")),
    ("attnprune/bench/prefill.py", ("bench_length",)),
    ("attnprune/prefill.py", ("prefill", "decode")),
]


def _undevice_calls(source: str, functions) -> list[str]:
    """``torch.tensor(...)`` / ``torch.arange(...)`` calls without ``device=`` inside the named
    functions of ``source`` (nested functions included)."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.FunctionDef) and node.name in functions):
            continue
        for call in ast.walk(node):
            if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and isinstance(call.func.value, ast.Name) and call.func.value.id == "torch"
                    and call.func.attr in ("tensor", "arange")
                    and not any(k.arg == "device" for k in call.keywords)):
                bad.append(f"{node.name}:{call.lineno}: torch.{call.func.attr}(...) without device=")
    return bad


@pytest.mark.parametrize("path, functions", LINTED, ids=[p for p, _ in LINTED])
def test_model_inputs_are_made_with_a_device(path, functions):
    source = (REPO / path).read_text()
    found = {n.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)}
    missing = [f for f in functions if f not in found]
    assert not missing, f"{path}: the linted functions {missing} are gone; update LINTED"
    assert _undevice_calls(source, functions) == []


def test_the_lint_catches_a_tensor_without_device():
    planted = textwrap.dedent("""
        def answer(model, ids):
            def step(x):
                return model(input_ids=torch.tensor([x]))
            return step(ids), torch.arange(4, device=model.device)
    """)
    assert _undevice_calls(planted, ("answer",)) == [
        "answer:4: torch.tensor(...) without device="]


# ----------------------------------------------------------------------------- long recipe
def _recipe(quick: bool) -> dict:
    """The recipe's variables as job.sh sources them."""
    out = subprocess.run(
        ["bash", "-c", (f'QUICK={str(quick).lower()}; source "{RECIPE}"; '
                        'printf "%s\\n" "$TASKS" "$LENGTH" "$TOKENIZER"; printf "%s\\n" "${RECIPE[@]}"')],
        capture_output=True, text=True, check=True).stdout.splitlines()
    tasks, length, tokenizer, recipe = out[0], int(out[1]), out[2], out[3:]
    return {"tasks": tasks.split(","), "length": length, "tokenizer": shlex.split(tokenizer),
            "min_length": int(recipe[recipe.index("--min-length") + 1])}


def _misfits(r: dict, min_length: int) -> list[str]:
    tl = load_script("train_long_tasks")
    a = tl.parse(["--out", "/tmp/unused", "--tokenizer", *r["tokenizer"], "--tasks",
                  ",".join(r["tasks"]), "--length", str(r["length"]), "--min-length",
                  str(min_length)])
    tok = tl.build_tokenizer(a)
    bad = []
    for task in r["tasks"]:
        for i in range(6):
            for scale in (0.0, 1.0):  # the smallest counts and the defaults (scaled to fit)
                try:
                    tl.fitted_example(task, min_length, i, 0, scale=scale,
                                      tokenizer=tl._measure(a, tok))
                except ValueError as e:
                    bad.append(f"{task}[{i}] scale {scale}: {e}")
                    break
    return bad


@pytest.mark.parametrize("quick", [False, True], ids=["gpu", "dry-run"])
def test_long_recipe_min_length_fits_every_task(quick):
    r = _recipe(quick)
    assert _misfits(r, r["min_length"]) == []


def test_min_length_64_did_not_fit():
    """The value of the GPU run that failed: the check above would have caught it."""
    bad = _misfits(_recipe(False), 64)
    assert any(b.startswith("freqwords") for b in bad)
    assert any(b.startswith("multivalue") for b in bad)


# ----------------------------------------------------------------------------- the job's files
def test_job_scripts_parse_and_name_what_exists():
    for f in (JOB, RECIPE):
        subprocess.run(["bash", "-n", str(f)], check=True)
    text = JOB.read_text()
    for path in ("scripts/gpu/pack.py", "scripts/gpu/summary.py", "scripts/gpu/best.py",
                 "scripts/gpu/long_recipe.sh",
                 "scripts/train_long_tasks.py"):
        assert path in text and (REPO / path).is_file(), path
    for test in ("tests/test_export_flag.py", "tests/test_compiled.py", "tests/test_sync_free.py",
                 "tests/test_merge.py", "tests/test_dtypes.py", "tests/test_measure.py",
                 "tests/test_fused_scorer.py", "tests/test_cudagraphs.py"):
        assert test in text and (REPO / test).is_file(), test
    old = [p.name for p in (REPO / "scripts").glob("gpu_*.sh")]
    assert old == [], f"issue-numbered GPU scripts are back: {old}"


def test_pack_keeps_weights_and_tokenizer_and_fits_the_limit(tmp_path):
    from safetensors.torch import save_file

    pack = load_script("gpu/pack")
    work = tmp_path / "long"
    for name in ("seed0", "seed1"):
        m = work / name / "model"
        m.mkdir(parents=True)
        save_file({"w": torch.randn(256, 1024)}, str(m / "model.safetensors"))  # 1 MiB
        (m / "config.json").write_text("{}")
        (m / "tokenizer.json").write_text("{}")
        (m / "optimizer.pt").write_bytes(b"x" * 1000)
        (work / name / "train.json").write_text("{}")
    (work / "STEPS.txt").write_text("ok\n")
    dest = tmp_path / "out" / "long.tar.gz"
    assert pack.main([str(work), str(dest), "--limit-mib", "4"]) == 0
    with tarfile.open(dest) as t:
        names = t.getnames()
    assert "long/seed0/model/model.safetensors" in names and "long/seed0/model/tokenizer.json" in names
    assert not any(n.endswith("optimizer.pt") for n in names)
    # too large for 0.6 MiB: bf16 first (2 × 0.5 MiB before gzip), still too large: the last
    # model left out
    assert pack.main([str(work), str(dest), "--limit-mib", "0.6"]) == 0
    with tarfile.open(dest) as t:
        names = t.getnames()
        notes = t.extractfile("long/PACKING.txt").read().decode()
    assert dest.stat().st_size <= 0.6 * 2**20
    assert "bf16" in notes and "left out the model seed1/model" in notes
    assert "long/seed0/model/model.safetensors" in names
    assert "long/seed1/model/model.safetensors" not in names


def test_summary_counts_every_bench_and_names_failures(tmp_path):
    import json

    summary = load_script("gpu/summary")
    w = tmp_path / "bench"
    for name, rows in {"grid": [{"ms": 1.0}, {"ms": None, "note": "failed: X"}],
                       "prefill": [{"median_ms": 2.0}, {"median_ms": None, "note": "skipped"}]}.items():
        (w / name).mkdir(parents=True)
        (w / name / "summary.json").write_text(json.dumps({"rows": rows}))
    (w / "STEPS.txt").write_text("grid rc=0\n")
    (w / "tests_cuda.log").write_text("FAILED tests/x.py::test_a - boom\n1 failed, 3 passed\n")
    text = summary.summary(w, "bench", tmp_path / "bench.tar.gz", "0", "12")
    assert "tarball bench.tar.gz: MISSING" in text
    assert "grid: 1 of 2 rows timed, 1 failed" in text and "prefill: 1 of 2 rows timed" in text
    assert "tests_cuda: 1 failed, 3 passed" in text and "  FAILED tests/x.py::test_a" in text


def test_merge_points_are_parsed_and_bad_ones_named():
    from attnprune.bench import gpu

    assert gpu.parse_merge_point("tome@0.25") == ("tome", 0.25)
    assert gpu.merge_patch("merge", 0.25, 1) == (
        "mean@0.25/L1/merge", "attention_mass",
        {"keep_ratio": 0.25, "after_layer": 1, "reduce": "merge"})
    for bad in ("tome", "drop@0.5", "tome@1.5"):
        with pytest.raises(ValueError, match="merge_points"):
            gpu.BenchGPUConfig(merge_points=(bad,))


def test_best_against_best_takes_each_points_best_mode():
    best = load_script("gpu/best")
    rows = best.best_rows({
        "eager": [{"model": "m", "B": 1, "T": 8, "point": "full", "ms": 10.0},
                  {"model": "m", "B": 1, "T": 8, "point": "pruned", "ms": 6.0},
                  {"model": "m", "B": 1, "T": 8, "point": "half", "ms": None}],
        "graphs": [{"model": "m", "B": 1, "T": 8, "point": "full", "ms": 4.0},
                   {"model": "m", "B": 1, "T": 8, "point": "pruned", "ms": 3.0}]})
    got = {r["point"]: (r["best_mode"], r["best_ms"], r["relative"]) for r in rows}
    # the pruned point against the full model's best (graphs: 4 ms), not its eager 10 ms
    assert got == {"full": ("graphs", 4.0, 1.0), "pruned": ("graphs", 3.0, 0.75)}
    assert "| m | 1 × 8 | pruned | 3.00 ms | graphs | 0.75× | 6.00 ms | 3.00 ms |" in best.table(
        rows, ["eager", "graphs"])
