"""scripts/README.md lists every script, one line each, and nothing that is gone; no script is
named after an issue number (issue 47, item 7)."""

from __future__ import annotations

import re
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def test_scripts_readme_lists_every_script_and_nothing_else():
    files = {p.relative_to(SCRIPTS).as_posix() for p in SCRIPTS.rglob("*")
             if p.is_file() and p.suffix in {".py", ".sh"} and "__pycache__" not in p.parts}
    text = (SCRIPTS / "README.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`((?:gpu/)?[\w.]+\.(?:py|sh))`", text))
    assert files - named == set(), f"not in scripts/README.md: {sorted(files - named)}"
    assert named - files == set(), f"listed but gone: {sorted(named - files)}"


def test_no_script_is_named_after_an_issue():
    bad = [p.name for p in SCRIPTS.rglob("*") if re.search(r"issue\d|_\d{2}\.(py|sh)$", p.name)]
    assert bad == []
