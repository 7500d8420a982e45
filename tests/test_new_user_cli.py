"""The new user's path at the command line (issue 48, item 5): no arguments is a usage error
(exit 2); a mistyped command or option names the close one (difflib); an error names the
option as typed (``--keep-ratio``, not ``keep_ratio[0]``); an ``--out`` that cannot be written
is one line, exit 2, before any work."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Literal

import pytest

from attnprune.cli import main
from attnprune.runs.config import ConfigError, UnknownKeyError, check_out, load_config

ROOT = Path(__file__).resolve().parents[1]


def _err_line(capsys) -> str:
    """The one line a refused command printed on stderr (nothing on stdout)."""
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    return lines[0]


# ---------------------------------------------------------------------------- usage and typos
def test_no_arguments_is_a_usage_error(capsys):
    assert main([]) == 2  # was 0
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("usage: attnprune <command>")
    assert main(["--help"]) == 0  # asked for: exit 0, on stdout
    assert capsys.readouterr().out.startswith("usage: attnprune <command>")


@pytest.mark.parametrize("argv, close", [
    (["finetun"], "'finetune'"),
    (["bench", "encodr"], "'bench encoder'"),
    (["reproduce", "synth"], "'reproduce synthetic'"),
])
def test_a_mistyped_command_names_the_close_one(argv, close, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"unknown command {' '.join(argv)!r}; did you mean {close}?" in err


@pytest.mark.parametrize("typed", [["--keep-ration", "0.5"], ["--keep_ration=0.5"]])
def test_a_mistyped_option_names_the_close_one(typed, capsys):
    """The option as typed and the close one, not a list of 36 keys without it."""
    assert main(["finetune", "--data", "x.csv", *typed]) == 2
    flag = typed[0].split("=")[0]
    assert _err_line(capsys) == (
        f"attnprune finetune: error: {flag}: unknown option; did you mean --keep-ratio or "
        "--warmup-ratio? ('attnprune finetune --help' lists them all)")


@pytest.mark.parametrize("value, message", [
    ("abc", "--keep-ratio: expected a number, got 'abc'"),
    ("1.5", "--keep-ratio: must be in (0, 1], got 1.5"),
    ("0.5,1.5", "--keep-ratio (value 2 of 2): must be in (0, 1], got 1.5"),
])
def test_errors_name_the_option_as_typed(value, message, capsys):
    """finetune's keep_ratio is a tuple: its errors used to say keep_ratio[0]."""
    assert main(["finetune", "--data", "x.csv", "--keep-ratio", value]) == 2
    line = _err_line(capsys)
    assert line == f"attnprune finetune: error: {message}" and "keep_ratio" not in line


def test_a_config_file_error_keeps_the_key_written_there(tmp_path, capsys):
    f = tmp_path / "c.yaml"
    f.write_text("keep_ratio: [abc]\nkeep_ration: 0.5\n")
    assert main(["finetune", "--data", "x.csv", "--config", str(f)]) == 2
    line = _err_line(capsys)
    assert "keep_ration: unknown key for FinetuneConfig; did you mean keep_ratio" in line
    f.write_text("keep_ratio: [abc]\n")
    assert main(["finetune", "--data", "x.csv", "--config", str(f)]) == 2
    assert "error: keep_ratio[0]: expected a number, got 'abc'" in _err_line(capsys)


def test_unknown_key_and_choice_suggest_the_close_name():
    @dataclasses.dataclass(frozen=True)
    class C:
        keep_ratio: float = 0.5
        clock: Literal["process", "wall"] = "process"

    with pytest.raises(UnknownKeyError, match="did you mean keep_ratio") as e:
        load_config(C, None, {"keep_ration": 0.5})
    import pickle

    again = pickle.loads(pickle.dumps(e.value))  # a multi-process run sends it on
    assert str(again) == str(e.value) and again.suggestions == ["keep_ratio"]
    with pytest.raises(ConfigError, match=r"did you mean 'wall'\?"):
        load_config(C, None, {"clock": "wal"})


# ---------------------------------------------------------------------------- --out not writable
def _unwritable(tmp_path: Path) -> Path:
    """A folder path nothing can be created in: a read-only folder (root writes there
    anyway, so for root a path in sysfs, which refuses every mkdir)."""
    if os.geteuid() != 0:
        ro = tmp_path / "read-only"
        ro.mkdir()
        ro.chmod(0o555)
        return ro / "results"
    if not Path("/sys").is_dir():
        pytest.skip("root without /sys: no folder refuses a mkdir")
    probe = Path("/sys/attnprune-write-probe")
    try:
        probe.mkdir()
    except OSError:
        return probe / "results"
    probe.rmdir()
    pytest.skip("root may write in /sys here")


def test_an_unwritable_out_is_one_line_exit_2_before_any_work(tmp_path, capsys):
    """Was a 21-line PermissionError traceback, exit 1 (from the first write)."""
    out = _unwritable(tmp_path)
    assert main(["bench", "sparse-ffn", "--out", str(out)]) == 2
    line = _err_line(capsys)
    assert line.startswith(f"attnprune bench sparse-ffn: error: out: --out {out}: cannot write in ")
    assert line.endswith("give a folder you can write to") and not out.exists()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-m", "attnprune", "bench", "sparse-ffn", "--out", str(out)],
                       capture_output=True, text=True, env=env, check=False, cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert r.stderr.strip().splitlines() == [line], r.stderr


def test_check_out_tries_the_write_and_leaves_nothing(tmp_path, monkeypatch):
    import tempfile

    assert check_out(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert list(tmp_path.iterdir()) == []  # the probe is made in the nearest parent, then removed

    def refuse(**kw):
        raise PermissionError(13, "Permission denied", kw.get("dir"))

    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    with pytest.raises(ConfigError, match=r"^out: --out .*: cannot write in .* \(Permission denied\)"):
        check_out(tmp_path / "x")
