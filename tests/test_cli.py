"""cli.py: dispatch, help, unknown commands, config errors before work."""

import attnprune
from attnprune.cli import COMMANDS, main


def test_help_and_methods(capsys):
    assert main([]) == 0
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
