"""Importing attnprune, loading a model and patching it print nothing (issue 31 item 10).

The noise came from transformers, not attnprune: ``transformers.modeling_utils`` imports its
torchao quantizer, which imports torchao whenever torchao ≥ 0.15 is installed; torchao's
PyPI wheels carry CUDA kernels (``_C_mxfp8``, ``_C_cutlass_90a``) that a CPU torch cannot load,
and it prints that, plus two ``_pytree`` deprecation warnings, at every model load. attnprune
imports torchao only inside ``quantize_int8(backend="torchao")``; the ``[dev]`` extra pins
torchao below 0.15, which transformers leaves alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=env, check=False)


def _skip_if_torchao_outside_the_pin():
    try:
        ao = metadata.version("torchao")
    except metadata.PackageNotFoundError:
        return
    if Version(ao) >= Version("0.15") and not os.environ.get("CI"):
        pytest.skip(f"torchao {ao} is installed, outside the [dev] pin (<0.15): transformers "
                    f"imports it at every model load and on a CPU torch it prints "
                    f"(pip install 'torchao>=0.14.1,<0.15')")


def test_dev_extra_pins_torchao_below_what_transformers_imports():
    import tomllib

    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["dev"]
    (ao,) = [r for r in dev if r.startswith("torchao")]
    assert "<0.15" in ao.replace(" ", ""), ao


def test_import_build_and_patch_print_nothing():
    _skip_if_torchao_outside_the_pin()
    out = _run(
        "import attnprune\n"
        "from transformers import BertConfig, BertModel\n"
        "m = BertModel(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,"
        " intermediate_size=64, vocab_size=100))\n"
        "attnprune.patch(m, 'attention_mass', keep_ratio=0.5)\n")
    assert out.returncode == 0, out.stderr
    assert (out.stdout, out.stderr) == ("", "")


def test_lm_help_prints_only_the_help():
    _skip_if_torchao_outside_the_pin()
    out = _run("import sys\nfrom attnprune.cli import main\nsys.exit(main(['lm', '--help']))\n")
    assert out.returncode == 0, out.stderr
    assert out.stderr == "" and "--" in out.stdout
