"""cli.py: dispatch, help, unknown commands, config errors before work."""

import dataclasses
import importlib

import pytest

import attnprune
from attnprune.cli import COMMANDS, config_class, main
from attnprune.runs.config import _option_text


def test_help_and_methods(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for words in COMMANDS:
        assert " ".join(words) in out
    assert main(["methods"]) == 0
    listed = capsys.readouterr().out
    for name in attnprune.list_methods():
        assert name in listed


def test_unknown_command(capsys):
    assert main(["frobnicate"]) == 2
    assert "unknown command" in capsys.readouterr().err


def test_import_has_no_side_effects():
    import subprocess
    import sys

    code = ("import torch; n = torch.get_num_threads(); import attnprune, os; "
            "assert torch.get_num_threads() == n; print(sorted(os.listdir('.')))")
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        out = subprocess.run([sys.executable, "-c", code], cwd=d, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == "[]"


# ----------------------------------------------------------------------------- --help


def _config_of(words):
    module = importlib.import_module(COMMANDS[words][0].split(":")[0])
    return config_class(module)


@pytest.mark.parametrize("words", list(COMMANDS), ids=" ".join)
def test_every_command_help_lists_its_options_in_plain_text(words, capsys):
    """``attnprune <command> --help``: exit 0; every option of the command's config with its
    default; the run flags where it writes a results folder; no Sphinx markup, no pointer to
    a DESIGN.md the user does not have."""
    assert main([*words, "--help"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    cls = _config_of(words)
    if cls is not None:  # a command that writes a results folder
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            flag = f"--{f.name.replace('_', '-')}"
            assert any(ln.split()[:1] == [flag] and f"(default {_option_text(default)})" in ln
                       for ln in lines), flag
        for flag in ("--out", "--exact-out", "--config"):
            assert any(ln.split()[:1] == [flag] for ln in lines), flag
        assert "(default results)" in next(ln for ln in lines if ln.split()[:1] == ["--out"])
    for bad in ("``", ":func:", ":mod:", ":class:", ":meth:", "DESIGN.md", "§"):
        assert bad not in out, bad
    assert "thin dispatcher" not in out  # the dispatcher's own docstring


def test_help_of_commands_without_a_config(capsys):
    """compare lists its argparse options with their defaults; methods and report say what
    they take."""
    assert main(["compare", "--help"]) == 0
    out = capsys.readouterr().out
    for flag, default in (("--reference", "full"), ("--alpha", "0.05"), ("--margin", "0.01"),
                          ("--n-resamples", "10000"), ("--seed", "0")):
        assert flag in out and f"(default: {default})" in out, flag
    assert main(["methods", "--help"]) == 0
    assert "No options" in capsys.readouterr().out
    assert main(["report", "--help"]) == 0
    assert "usage: attnprune report DIR" in capsys.readouterr().out


@pytest.mark.parametrize("group", ["reproduce", "bench"])
def test_a_command_group_lists_its_subcommands(group, capsys):
    subs = [w[1] for w in COMMANDS if w[0] == group]
    for argv in ([group], [group, "--help"]):
        assert main(argv) == 0
        out = capsys.readouterr().out
        assert "unknown command" not in out
        assert all(s in out for s in subs), argv
    assert main([group, "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'nope'" not in err and f"unknown command '{group} nope'" in err
    assert all(s in err for s in subs)


# ----------------------------------------------------------------------------- --out
@pytest.mark.parametrize("below", [False, True])
def test_out_naming_a_file_is_a_clear_error(tmp_path, capsys, below):
    """``--out`` naming a file (or a path below one): one line naming --out, exit 2, before
    any work (was a NotADirectoryError traceback, exit 1)."""
    f = tmp_path / "taken.txt"
    f.write_text("x")
    out = f / "sub" if below else f
    assert main(["bench", "sparse-ffn", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnprune bench sparse-ffn: error: out: --out ") and "not a folder" in err
    assert "Traceback" not in err and f.read_text() == "x"


def test_results_dir_start_refuses_a_file(tmp_path):
    from attnprune.runs.config import ConfigError
    from attnprune.runs.results import ResultsDir

    f = tmp_path / "taken.txt"
    f.write_text("x")
    for exact in (False, True):
        with pytest.raises(ConfigError, match=r"^out: --out .* is a file, not a folder"):
            ResultsDir.start(f, "x", exact, {"a": 1})


# ----------------------------------------------------------------------------- make test
def test_make_test_is_what_ci_runs():
    """``make test`` sets CI=1 and the offline variables itself (a missing data file fails
    instead of skipping), and .ci/run is that same ``make test`` (then more make targets:
    the reversed order, the faked torch 2.11 export flag), never pytest or an export of its
    own."""
    import shutil
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    ci = [ln.strip() for ln in (repo / ".ci" / "run").read_text().splitlines()
          if ln.strip() and not ln.lstrip().startswith("#")]
    runs = [ln for ln in ci if ln.startswith("make ")]
    assert runs and runs[0].startswith("make test ")
    assert not any("pytest" in ln or ln.startswith("export ") for ln in ci)
    if shutil.which("make") is None:
        pytest.skip("no make")
    dry = subprocess.run(["make", "-n", "test"], cwd=repo, capture_output=True, text=True,
                         check=True).stdout
    line = next(ln for ln in dry.splitlines() if "-m pytest" in ln)
    for var in ("CI=1", "MPLBACKEND=Agg", "HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1",
                "HF_DATASETS_OFFLINE=1"):
        assert var in line.split(), var


def test_gitignore_covers_the_virtual_environment():
    from pathlib import Path

    lines = (Path(__file__).resolve().parents[1] / ".gitignore").read_text().split()
    assert ".venv/" in lines or ".venv" in lines
