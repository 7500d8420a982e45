"""The new user's Ctrl-C (issue 48, item 5): one line, exit 130, that gives the exact
``--out`` that resumes (the ``--out`` first given would start a new timestamped folder), also
while worker processes start up (a spawned worker caught importing torch printed a 20-line
traceback)."""

from __future__ import annotations

import dataclasses
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnprune import cli
from attnprune.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class _FakeConfig:
    steps: int = 3


def _fake_command(argv: list[str]) -> int:
    """A command that opens its results folder as every command does, saves one run, and is
    interrupted (the user's Ctrl-C); rerun in a folder that has that run, it finishes."""
    from attnprune.runs.config import parse_command_line
    from attnprune.runs.results import ResultsDir

    cl = parse_command_line(argv, _FakeConfig)
    out = ResultsDir.start(cl.out, "fake", cl.exact_out, cl.config)
    if not out.run_done("a"):
        out.save_run("a", {"x": 1})
        raise KeyboardInterrupt
    out.save_run("b", {"x": 2})
    return 0


def test_ctrl_c_prints_the_out_that_resumes_and_it_does(tmp_path, capsys, monkeypatch):
    """With the default --out a new timestamped folder is made inside it: the old hint,
    "rerun with the same --out", started over in another one."""
    monkeypatch.setitem(COMMANDS, ("fake",), ("test_new_user_interrupt:_fake_command", "a test command"))
    results = tmp_path / "results"
    assert main(["fake", "--out", str(results), "--steps", "4"]) == 130
    (folder,) = results.iterdir()
    line = capsys.readouterr().err.strip()
    assert line == (f"interrupted: finished runs are saved in {folder}; resume with: "
                    f"attnprune fake --out {folder}")
    argv = shlex.split(line.split("resume with: ", 1)[1])
    assert main(argv[1:]) == 0  # the line as printed
    assert list(results.iterdir()) == [folder]  # no new folder
    assert sorted(p.name for p in (folder / "runs").iterdir()) == ["a.json", "b.json"]
    assert "steps: 4" in (folder / "config.yaml").read_text()  # the folder's options, kept


def test_ctrl_c_before_a_folder_is_made_says_so(monkeypatch, capsys):
    def early(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_fake_early", early, raising=False)
    monkeypatch.setitem(COMMANDS, ("fake",), ("attnprune.cli:_fake_early", "a test command"))
    assert main(["fake"]) == 130
    assert capsys.readouterr().err.strip() == "interrupted before any results were saved"


def _ignores_sigint(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    mask = next(ln for ln in status.splitlines() if ln.startswith("SigIgn:")).split()[1]
    return bool(int(mask, 16) & (1 << (signal.SIGINT - 1)))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_processes_started_by_a_command_ignore_ctrl_c_from_their_start():
    """A spawned worker imports torch for seconds before its own code can set Ctrl-C aside:
    under the command line it ignores SIGINT from exec on (it was a 20-line traceback)."""
    import multiprocessing
    import multiprocessing.process

    from attnprune.runs.results import sticky_ctrl_c

    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    ctx = multiprocessing.get_context("spawn")
    stock = multiprocessing.process.BaseProcess.start
    with sticky_ctrl_c():
        handler = signal.getsignal(signal.SIGINT)
        p = ctx.Process(target=time.sleep, args=(60,))
        p.start()
        try:
            assert _ignores_sigint(p.pid)  # read at once: the child is still starting
            assert signal.getsignal(signal.SIGINT) is handler  # the parent's own is back
        finally:
            p.terminate()
            p.join()
    assert multiprocessing.process.BaseProcess.start is stock
    p = ctx.Process(target=time.sleep, args=(60,))
    p.start()
    try:
        assert not _ignores_sigint(p.pid)  # outside a command nothing changes
    finally:
        p.terminate()
        p.join()


_SYNTHETIC = ["reproduce", "synthetic", "--n-train", "160", "--n-val", "80", "--epochs", "3",
              "--methods", "full,random", "--ablations", "false", "--timing-repeats", "1",
              "--n-resamples", "200"]


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_while_workers_start_is_one_line(tmp_path):
    """``reproduce synthetic`` with 2 spawned workers, Ctrl-C to the whole process group (as
    a terminal sends it) the moment a worker exists, long before it has imported torch: exit
    130, one line, no worker traceback, nothing left running."""
    import psutil
    from interrupt_helpers import _default_sigint, assert_group_gone

    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    argv = [*_SYNTHETIC, "--seeds", ",".join(map(str, range(50))), "--workers", "2",
            "--out", str(tmp_path / "results")]
    p = subprocess.Popen([sys.executable, "-m", "attnprune", *argv], cwd=tmp_path, env=env,
                         start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, preexec_fn=_default_sigint)  # noqa: PLW1509 (no threads here)
    try:
        parent = psutil.Process(p.pid)
        deadline = time.monotonic() + 300
        workers: list = []
        while not workers:  # a condition (a worker exists), not a clock
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()
            workers = [c for c in parent.children()
                       if "spawn_main" in " ".join(c.cmdline()) and "resource_tracker" not in
                       " ".join(c.cmdline())]
            time.sleep(0.01)
        assert _ignores_sigint(workers[0].pid)  # from its start, not once torch is imported
        os.killpg(p.pid, signal.SIGINT)
        stdout, stderr = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr + stdout, stderr[-3000:]
    lines = [ln for ln in stderr.splitlines() if "interrupted" in ln]
    assert len(lines) == 1 and "resume with: attnprune reproduce synthetic --out " in lines[0]
    assert_group_gone(p.pid)


@pytest.mark.slow
def test_ctrl_c_then_the_printed_line_resumes_the_run(tmp_path):
    """A real command with the default kind of --out (a folder of timestamped runs): one
    Ctrl-C after its first saved run; the printed line resumes it in the same folder,
    keeping that run (not trained again)."""
    from interrupt_helpers import assert_stopped_cleanly, ctrl_c

    results = tmp_path / "results"
    argv = [*_SYNTHETIC, "--seeds", "0", "--workers", "0", "--out", str(results)]
    rc, stdout, stderr, _ = ctrl_c(argv, after=1, ready=tmp_path / "ready", real=False)
    assert_stopped_cleanly(rc, stdout, stderr)
    (folder,) = results.iterdir()
    (first,) = (folder / "runs").rglob("*.json")
    before = (first.stat().st_mtime_ns, first.read_bytes())
    line = next(ln for ln in stderr.splitlines() if "interrupted" in ln)
    resume = shlex.split(line.split("resume with: ", 1)[1])
    assert resume[:3] == ["attnprune", "reproduce", "synthetic"]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-m", "attnprune", *resume[1:]], cwd=ROOT, env=env,
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    assert list(results.iterdir()) == [folder]
    assert len(list((folder / "runs").rglob("*.json"))) == 2
    assert (first.stat().st_mtime_ns, first.read_bytes()) == before
    assert (folder / "report.html").is_file()
