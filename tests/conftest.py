"""Shared test set-up: offline, headless, deterministic."""

import os

os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def require_shared_file(path) -> None:
    """Skip when a ``../shared/data`` file is missing on a developer machine; under CI
    (``CI`` set, where ``../shared`` sits beside the clone) a missing file fails the test."""
    if path.is_file():
        return
    if os.environ.get("CI"):
        pytest.fail(f"shared data file missing under CI: {path}")
    pytest.skip(f"shared data file not present: {path}")


def require_module(name: str):
    """``pytest.importorskip`` on a developer machine; under CI (``CI`` set), where the dev
    extras are installed, a missing module fails the test instead of skipping it."""
    if os.environ.get("CI"):
        try:
            return __import__(name)
        except ImportError as e:
            pytest.fail(f"{name} missing under CI (pip install -e '.[dev]'): {e}")
    return pytest.importorskip(name)


def record_calls(modules, fn, record):
    """Run ``fn()`` with a forward pre-hook on each of ``modules`` that appends
    ``record(i, args)`` for every call of module i; returns the list."""
    seen = []
    hooks = [m.register_forward_pre_hook(lambda mod, a, i=i: seen.append(record(i, a)))
             for i, m in enumerate(modules)]
    try:
        fn()
    finally:
        for h in hooks:
            h.remove()
    return seen


def load_script(name: str):
    """``scripts/NAME.py`` as a module (the scripts are not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
