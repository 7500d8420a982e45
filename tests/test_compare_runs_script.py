"""scripts/compare_runs.py: seed-paired differences between two results folders."""

import json
import runpy
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "compare_runs.py"


def _summary(path, acc):
    path.mkdir()
    seeds = [1, 2, 3]
    (path / "summary.json").write_text(json.dumps({
        "config": {"seeds": seeds},
        "methods": {"full": {"accuracy": {"per_seed": acc}, "auc": {"per_seed": [0.8] * 3}}},
    }))


def _run(argv, capsys):
    old = sys.argv
    sys.argv = ["compare_runs.py", *argv]
    try:
        with pytest.raises(SystemExit) as e:
            runpy.run_path(str(SCRIPT), run_name="__main__")
    finally:
        sys.argv = old
    return e.value.code, capsys.readouterr()


def test_differences_over_shared_seeds(tmp_path, capsys):
    _summary(tmp_path / "a", [0.70, 0.72, 0.74])
    _summary(tmp_path / "b", [0.69, 0.71, 0.73])
    code, out = _run([str(tmp_path / "a"), str(tmp_path / "b")], capsys)
    assert code == 0
    assert "accuracy +0.0100 [+0.0100, +0.0100]" in out.out
    assert "auc +0.0000" in out.out


def test_missing_summary_names_the_field(tmp_path, capsys):
    code, out = _run([str(tmp_path), str(tmp_path)], capsys)
    assert code == 2 and "DIR" in out.err
