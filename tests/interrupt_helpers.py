"""What the Ctrl-C tests share: run an ``attnprune`` command in its own process group and
interrupt it at a point chosen by the command itself, never by a clock.

The command runs through a small start-up script (``_BOOT``) that wraps
``ResultsDir.save_run``: when the command has saved its ``after``-th run, and its worker
processes (if any) have set Ctrl-C aside (``SigIgn`` in ``/proc``, :func:`_worker_init` of
the synthetic track), the wrapper either

* ``"raise"``: does what a terminal's Ctrl-C does, there and then: SIGINT to each worker,
  then to itself with ``signal.raise_signal`` (delivered to this thread before the call
  returns, so the KeyboardInterrupt is raised at this very point), or
* ``"ready"``: writes a readiness file and goes on with the next run; the test then sends
  the process group one real SIGINT. The file is written only from inside the loop of runs,
  and the runs left take minutes, so the signal lands inside it whatever the machine's load.

Then the test checks that nothing of the command is left running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_BOOT = r"""
import json, multiprocessing, os, signal, sys, time
from pathlib import Path

from attnprune.runs import results as _results

argv, after, mode, ready = json.loads(sys.argv[1])
_save, _saved = _results.ResultsDir.save_run, []


def _ignores_ctrl_c(pid):
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:  # gone: nothing to wait for
        return True
    mask = next(ln for ln in status.splitlines() if ln.startswith("SigIgn:")).split()[1]
    return bool(int(mask, 16) & (1 << (signal.SIGINT - 1)))


def save_run(self, key, record):
    out = _save(self, key, record)
    _saved.append(key)
    if len(_saved) == after:
        workers = multiprocessing.active_children()
        while not all(_ignores_ctrl_c(p.pid) for p in workers):  # a condition, not a clock
            time.sleep(0.01)
        if mode == "raise":
            for p in workers:
                os.kill(p.pid, signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
            raise AssertionError("SIGINT raised no KeyboardInterrupt")
        tmp = Path(ready + ".tmp")
        tmp.write_text(str(os.getpid()))
        os.replace(tmp, ready)
    return out


_results.ResultsDir.save_run = save_run
sys.argv = ["attnprune", *argv]
from attnprune.cli import main

sys.exit(main())
"""


def group_alive(pgid: int) -> bool:
    """Whether a live process (zombies aside: a container's PID 1 may not reap them) is in
    the process group ``pgid``."""
    import psutil

    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return False


def assert_group_gone(pgid: int, timeout: float = 60.0) -> None:
    """Wait up to ``timeout`` s for the group to empty (multiprocessing's resource tracker
    ends on EOF, a moment after its parent); fail listing what is left."""
    deadline = time.monotonic() + timeout
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not group_alive(pgid), subprocess.run(
        ["ps", "-o", "pid,ppid,pgid,cmd", "-g", str(pgid)], capture_output=True, text=True,
        check=False).stdout


def _default_sigint() -> None:
    """In the child, before Python starts: SIGINT back to its default. A shell starts
    background jobs (``make test &``, a CI runner's ``cmd &``) with SIGINT ignored, children
    inherit that, and Python then never turns SIGINT into KeyboardInterrupt: the command would
    run to its end and the test would measure the shell, not the command."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(argv: list[str], after: int, mode: str, ready: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, "-c", _BOOT, json.dumps([argv, after, mode, str(ready)])], cwd=REPO,
        env=env, start_new_session=True, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_default_sigint)  # noqa: PLW1509 (test process, no threads forked here)


def ctrl_c(argv: list[str], *, after: int, ready: Path, real: bool,
           timeout: float = 600.0) -> tuple[int, str, str, int]:
    """Run ``attnprune *argv`` in a new session and Ctrl-C it once its ``after``-th run is
    saved (and its workers are up): ``real=False``, the command interrupts itself there;
    ``real=True``, it writes ``ready`` there and this process sends its process group one
    SIGINT. Returns (exit code, stdout, stderr, the group id)."""
    p = _start(argv, after, "ready" if real else "raise", ready)
    try:
        if real:
            deadline = time.monotonic() + timeout
            while not ready.is_file():  # polled for a file, not timed: no race
                assert p.poll() is None and time.monotonic() < deadline, p.communicate()
                time.sleep(0.05)
            os.killpg(p.pid, signal.SIGINT)  # the new session's group: the command and its workers
        stdout, stderr = p.communicate(timeout=timeout)
        return p.returncode, stdout, stderr, p.pid
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)


def assert_stopped_cleanly(rc: int, stdout: str, stderr: str) -> None:
    """Exit 130, one line saying so, no traceback."""
    assert rc == 130, stderr[-3000:]
    assert "Traceback" not in stderr + stdout, stderr[-3000:]
    lines = [ln for ln in stderr.splitlines() if "interrupted" in ln]
    assert len(lines) == 1 and "finished runs are saved" in lines[0], stderr[-3000:]
