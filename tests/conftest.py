"""Shared test set-up: offline, headless, deterministic."""

import os
import sys

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


# -- torch's global compile configs: a test that leaves one changed fails there (issue 48) ------
# A leak shows up tests later, in whatever runs after it, and only in that order (a monkeypatched
# ``cache_size_limit`` once failed a bench test on every fresh clone). Each module is checked only
# once something has imported it (importing it here would cost every run ~2 s); a test that
# imports it for the first time is checked against the values a fresh import gives.
_TORCH_CONFIGS = ("torch._dynamo.config", "torch._inductor.config")


def _config_state(mod) -> tuple[dict, set]:
    """(every value, by key; the keys that read as missing): ``get_config_copy`` leaves out
    aliases, which ``delattr`` (``monkeypatch.undo`` of an attribute it added) can hide."""
    return mod.get_config_copy(), {k for k, e in mod._config.items() if e.hide}


def _fresh_values(mod) -> dict:
    """The values a fresh import of ``mod`` reads (environment included, no user override)."""
    from torch.utils._config_module import _UNSET_SENTINEL

    fresh = {}
    for k, e in mod._config.items():
        if e.alias is not None:
            continue
        for v in (e.env_value_force, e.env_value_default, e.default):
            if v is not _UNSET_SENTINEL:
                fresh[k] = v
                break
    return fresh


def _same(a, b) -> bool:
    try:
        return bool(a is b or a == b)
    except Exception:  # noqa: BLE001 (a value whose == raises or is ambiguous counts as changed)
        return False


_LAST_TEST = [None]


@pytest.fixture(autouse=True)
def _ctrl_c_handler_unchanged(request):
    """Every test starts with Python's own SIGINT handler (``signal.default_int_handler``, what
    a foreground process has), and a change is put back with a warning naming where it was
    seen: a test (found after it), or something between tests (a module fixture's set-up or
    teardown: found before the next). A shell that starts pytest in the background (``cmd &``
    in a script, job control off) starts it with SIGINT ignored, which Python keeps: the Ctrl-C
    tests (tests/test_new_user_interrupt.py, test_synthetic_cli's) then failed in such a run
    only. That first state is put back silently."""
    import signal
    import threading
    import warnings

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    want = signal.default_int_handler
    found = signal.getsignal(signal.SIGINT)
    if found is not want:
        signal.signal(signal.SIGINT, want)
        if _LAST_TEST[0] is not None:
            warnings.warn(f"the SIGINT handler was {found!r} before {request.node.nodeid} "
                          f"(after {_LAST_TEST[0]} and its fixtures); put back",
                          RuntimeWarning, stacklevel=1)
    yield
    _LAST_TEST[0] = request.node.nodeid
    now = signal.getsignal(signal.SIGINT)
    if now is not want:
        signal.signal(signal.SIGINT, want)
        warnings.warn(f"{request.node.nodeid} left the SIGINT handler as {now!r}; put back",
                      RuntimeWarning, stacklevel=1)


@pytest.fixture(autouse=True)
def _torch_configs_unchanged(request):
    """Fails (at teardown: an error on the test's id) the test that left a value of
    ``torch._dynamo.config`` / ``torch._inductor.config`` changed, after putting it back."""
    before = {name: _config_state(sys.modules[name]) for name in _TORCH_CONFIGS
              if name in sys.modules}
    yield
    leaks = []
    for name in _TORCH_CONFIGS:
        mod = sys.modules.get(name)
        if mod is None:
            continue
        values, hidden = before.get(name) or (_fresh_values(mod), set())
        now, now_hidden = _config_state(mod)
        for k, v in values.items():
            if k in now and not _same(now[k], v):
                leaks.append(f"{name}.{k} = {now[k]!r} (was {v!r})")
                setattr(mod, k, v)
        for k in sorted(now_hidden - hidden):
            leaks.append(f"{name}.{k} hidden (reads as missing; was readable)")
            mod._config[k].hide = False
    if leaks:
        pytest.fail(f"{request.node.nodeid} left torch's compile config changed (now restored; "
                    "use monkeypatch.setattr or config.patch on the real key, not an alias):\n  "
                    + "\n  ".join(leaks), pytrace=False)


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


# -- reverse file order (issue 48): CI runs the suite a second time with the files reversed, so
# a test that passes only after another file's tests (or breaks a later file) lands red. Within
# a file the order is kept (a file may build on its own module-scoped fixtures).
def pytest_collection_modifyitems(config, items):
    if os.environ.get("ATTNPRUNE_REVERSE_FILES", "") in ("", "0"):
        return
    by_file: dict = {}
    for item in items:
        by_file.setdefault(item.path, []).append(item)
    items[:] = [item for path in reversed(by_file) for item in by_file[path]]


# -- torch 2.11's dynamo fakes ``torch.compiler.is_exporting()`` (issue 46, item 2) ------------
# Up to torch 2.11, dynamo answers a traced ``torch.compiler.is_exporting()`` with a constant
# True inside any compiled function (pytorch#176347; fixed upstream by #176499). The GPU image
# runs 2.11; CI's torch does not have the bug. This reproduces it: dynamo's rule map is resolved
# first (so it holds the real function, and the fake is inlined like any Python function), then
# ``is_exporting`` answers True wherever a compile is running. Code that branches on the
# function takes its export path under plain torch.compile, as on the device.
#
# ``make test-fake-exporting`` (run by .ci/run) runs the compile, export and ONNX tests with the
# fake on for the whole session (ATTNPRUNE_FAKE_EXPORTING=1); the ``fake_exporting`` fixture
# turns it on for one test.
FAKE_EXPORTING_ENV = "ATTNPRUNE_FAKE_EXPORTING"


def install_fake_exporting():
    """Replace ``torch.compiler.is_exporting`` by torch 2.11's behaviour under dynamo; returns
    a function that puts the real one back."""
    from torch._dynamo import trace_rules

    real = torch.compiler.is_exporting
    if getattr(real, "_attnprune_fake", False):
        return lambda: None
    # dynamo's caches keyed by torch's functions (the rule map, the tracing-state functions and
    # their handlers) must hold the real function, else dynamo treats it as an unknown op: one
    # small compile that calls it builds them all (the rule map alone is not enough), and
    # torch._dynamo.reset() clears none of them
    trace_rules.get_torch_obj_rule_map()
    torch.compile(lambda x: x + int(torch.compiler.is_exporting()), backend="eager",
                  fullgraph=True)(torch.zeros(1))

    def fake() -> bool:
        return torch.compiler.is_compiling() or real()

    fake._attnprune_fake = True
    torch.compiler.is_exporting = fake

    def undo():
        torch.compiler.is_exporting = real
    return undo


def fake_exporting_on() -> bool:
    return bool(getattr(torch.compiler.is_exporting, "_attnprune_fake", False))


@pytest.fixture
def fake_exporting():
    """torch 2.11's faked ``is_exporting()`` for one test (see :func:`install_fake_exporting`)."""
    torch._dynamo.reset()
    undo = install_fake_exporting()
    torch._dynamo.reset()
    try:
        yield
    finally:
        torch._dynamo.reset()
        undo()


def pytest_configure(config):
    if os.environ.get(FAKE_EXPORTING_ENV, "") not in ("", "0"):
        install_fake_exporting()


def pytest_report_header(config):
    if fake_exporting_on():
        return "torch.compiler.is_exporting: faked as on torch 2.11 (ATTNPRUNE_FAKE_EXPORTING)"
    return None


# -- the GPU job's bounds (issue 46, scripts/gpu/job.sh): a test that hangs must fail by name,
# and the run must reach pytest's summary before the job's deadline kills it.
# ATTNPRUNE_TEST_TIMEOUT=S fails any test whose call runs past S seconds (SIGALRM, main thread);
# ATTNPRUNE_TEST_DEADLINE_S=S skips the tests that would start S seconds after the session began.
_SESSION_T0 = None


def _env_seconds(name: str) -> float:
    try:
        return float(os.environ.get(name, "") or 0)
    except ValueError:
        return 0.0


def pytest_sessionstart(session):
    global _SESSION_T0
    import time

    _SESSION_T0 = time.monotonic()


def pytest_runtest_setup(item):
    import time

    deadline = _env_seconds("ATTNPRUNE_TEST_DEADLINE_S")
    if deadline and _SESSION_T0 is not None and time.monotonic() - _SESSION_T0 > deadline:
        pytest.skip(f"not started: past the run's deadline ({deadline:g} s, "
                    "ATTNPRUNE_TEST_DEADLINE_S)")


class TestTimeout(Exception):
    """A test ran past ATTNPRUNE_TEST_TIMEOUT."""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    import signal
    import threading

    limit = _env_seconds("ATTNPRUNE_TEST_TIMEOUT")
    if not limit or threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum, frame):
        raise TestTimeout(f"{item.nodeid} ran past {limit:g} s (ATTNPRUNE_TEST_TIMEOUT)")

    old = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
