"""What the Ctrl-C tests share: run an ``attnprune`` command in its own process group, send
that group one SIGINT (what a terminal's Ctrl-C does) once the command is far enough, and
check that nothing of it is left running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


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


def assert_group_gone(pgid: int, timeout: float = 15.0) -> None:
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


def ctrl_c(argv: list[str], ready: Callable[[], bool], *, settle: float = 0.0,
           timeout: float = 300.0) -> tuple[int, str, str, float, int]:
    """Run ``python -m attnprune *argv`` in a new session, wait until ``ready()``, then
    ``settle`` s, and send its process group one SIGINT. Returns (exit code, stdout, stderr,
    seconds from the SIGINT to the exit, the group id)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.Popen([sys.executable, "-m", "attnprune", *argv], cwd=REPO, env=env,
                         start_new_session=True, text=True, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE,
                         preexec_fn=_default_sigint)  # noqa: PLW1509 (test process, no threads forked here)
    try:
        deadline = time.monotonic() + timeout
        while not ready():
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()
            time.sleep(0.05)
        time.sleep(settle)
        os.killpg(p.pid, signal.SIGINT)  # the new session's group: the command and its workers
        t0 = time.monotonic()
        stdout, stderr = p.communicate(timeout=120)
        return p.returncode, stdout, stderr, time.monotonic() - t0, p.pid
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)


def assert_stopped_cleanly(rc: int, stdout: str, stderr: str) -> None:
    """Exit 130, one line saying so, no traceback."""
    assert rc == 130, stderr[-3000:]
    assert "Traceback" not in stderr + stdout, stderr[-3000:]
    lines = [ln for ln in stderr.splitlines() if "interrupted" in ln]
    assert len(lines) == 1 and "finished runs are saved" in lines[0], stderr[-3000:]
