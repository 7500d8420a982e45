"""scripts/build_retrieval.py checks the installed versions against the committed manifest before
any work (issue 48 item 5): a missing or other-version package gives one line naming it and the
install command, exit 2. The version lookup is faked; nothing is built."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("build_retrieval",
                                               ROOT / "scripts" / "build_retrieval.py")
br = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(br)

MANIFEST = json.loads(br.MANIFEST.read_text())
PINNED = dict(p["version"].split("==") for p in MANIFEST["packages"])
PINNED["tokenizers"] = MANIFEST["tokenizers"]


class Built(Exception):
    """Raised by the faked first step of the build: the check let it through."""


@pytest.fixture
def versions(monkeypatch):
    """Installed versions as the manifest's; the test edits the dict (None: missing)."""
    have = dict(PINNED)

    def version(name):
        v = have.get(name)
        if v is None:
            raise br.md.PackageNotFoundError(name)
        return v

    def build_started(*a, **k):
        raise Built

    monkeypatch.setattr(br.md, "version", version)
    monkeypatch.setattr(br.rt, "site_sources", build_started)
    return have


def test_manifest_versions_pass_and_a_local_build_tag_is_ignored(versions):
    versions["torch"] = "2.13.0+cu128"
    assert br.version_problems() == ([], [])
    with pytest.raises(Built):
        br.main(["--out", "unused"])


def test_missing_bench_packages_name_them_and_the_bench_extra(versions, capsys, tmp_path):
    versions["trio"] = None
    versions["docutils"] = "0.21"
    assert br.main(["--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "trio (missing)" in err and "docutils 0.21, not 0.19" in err
    assert err.rstrip().endswith("run: pip install -e '.[bench]'")
    assert not (tmp_path / "out").exists()


def test_other_packages_get_exact_pins_and_any_version_builds(versions, capsys):
    versions["numpy"] = "2.5.0"
    versions["Flask"] = "3.2.0"
    assert br.main(["--out", "unused"]) == 2
    err = capsys.readouterr().err
    assert err.rstrip().endswith(
        f"run: pip install numpy=={PINNED['numpy']} Flask=={PINNED['Flask']}")
    with pytest.raises(Built):
        br.main(["--out", "unused", "--any-version"])
    versions["libcst"] = None  # a missing package is not built around
    assert br.main(["--out", "unused", "--any-version"]) == 2


def test_the_bench_extra_pins_exactly_the_manifest_versions():
    import tomllib

    bench = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for req in bench["project"]["optional-dependencies"]["bench"]:
        name, version = req.split("==")
        assert PINNED[name] == version, req
