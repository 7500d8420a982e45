"""The results folder (contract in DESIGN.md): atomic writes, resume, summary.json.

    out/<command>-<timestamp>/        (or exactly ``out`` with ``exact=True``)
        config.yaml  summary.json  metrics.csv  *.npy  *.png  report.html
        runs/<key>.json               one finished (method, seed) run each: the resume marker
        predictions/<label>__seed<N>.npz   per-example y_true, y_pred, scores (for compare)

Every file is written to a temporary name in the same folder and renamed into place, so an
interrupted run never leaves a half-written file; a rerun with the same folder skips the
runs whose marker exists, and is refused if its options differ from the folder's.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import re
import secrets
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["ResultsDir", "atomic_write_bytes", "atomic_write_text", "jsonable", "last_run_dir",
           "make_run_dir", "sticky_ctrl_c"]

_CTRL_C = False  # a Ctrl-C came while sticky_ctrl_c was on
_LAST_RUN_DIR: Path | None = None  # the results folder make_run_dir made or opened last


def _on_ctrl_c(signum, frame) -> None:
    global _CTRL_C
    _CTRL_C = True
    raise KeyboardInterrupt


@contextlib.contextmanager
def sticky_ctrl_c():
    """While on (a command run as a program): Ctrl-C raises KeyboardInterrupt as usual and is
    also remembered, so that one Python drops still stops the command, at the next finished
    run (:meth:`ResultsDir.save_run`). Python drops it when the handler runs inside a
    finalizer (a ``__del__`` or weakref callback run by the garbage collector): printed as
    "Exception ignored" and gone, the command would run to its end. Left as it is where
    SIGINT is not Python's default (ignored in a background job) or off the main thread."""
    import signal
    import threading

    global _CTRL_C
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    _CTRL_C = False
    signal.signal(signal.SIGINT, _on_ctrl_c)
    try:
        with _children_leave_ctrl_c():
            yield
    finally:
        if signal.getsignal(signal.SIGINT) is _on_ctrl_c:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        _CTRL_C = False


@contextlib.contextmanager
def _children_leave_ctrl_c():
    """While on: a process started with ``multiprocessing`` (a worker pool's, a DataLoader's)
    ignores Ctrl-C from its first instruction, and leaves it to this process.

    A terminal's Ctrl-C reaches every process of the foreground group. A ``spawn`` worker
    imports torch and the command's modules for seconds before its own code can set SIGINT
    aside; one caught there died printing a 20-line KeyboardInterrupt traceback under the
    command's one line. An ignored signal stays ignored across fork and exec, and Python
    leaves an ignored SIGINT alone at start-up, so SIGINT is ignored while each process is
    started. It is blocked first on this thread, so a Ctrl-C in that moment waits (blocked
    signals are kept pending on Linux even while ignored) and lands once the handler is back.
    The parent stops its workers itself (terminate, or a pool's shutdown)."""
    import multiprocessing.process
    import signal
    import threading

    cls = multiprocessing.process.BaseProcess
    stock = cls.start

    def start(self):
        if threading.current_thread() is not threading.main_thread():
            return stock(self)  # signal.signal works on the main thread only
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            return stock(self)
        finally:
            signal.signal(signal.SIGINT, handler)
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    cls.start = start
    try:
        yield
    finally:
        cls.start = stock


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp file in the same folder, fsync, rename).
    The file gets the mode a plain ``open(path, "w")`` would: 0666 minus the umask."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Not tempfile.mkstemp: it creates 0600 whatever the umask. O_EXCL with a random name is
    # its safety; mode 0o666 lets the kernel apply the umask (no process-wide umask read).
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0),
                         0o666)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no free temporary name next to {path}")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def jsonable(x: Any) -> Any:
    """``x`` with numpy and torch scalars and arrays as plain Python, dict keys as strings, and
    NaN/inf as None: what ``json.dumps`` takes."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if hasattr(x, "item") and callable(x.item) and getattr(x, "ndim", 1) == 0:
        return x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None  # JSON has no NaN/inf; None marks "undefined"
    return x


def make_run_dir(out: str | os.PathLike, command: str, exact: bool = False) -> Path:
    """``out/<command>-<YYYYmmdd-HHMMSS>`` (new), or ``out`` itself with ``exact=True``
    (which is how a run is resumed)."""
    global _LAST_RUN_DIR
    out = Path(out)
    if exact:
        out.mkdir(parents=True, exist_ok=True)
        _LAST_RUN_DIR = out
        return out
    slug = re.sub(r"[^a-z0-9]+", "-", command.lower()).strip("-")
    path = out / f"{slug}-{time.strftime('%Y%m%d-%H%M%S')}"
    n = 1
    while path.exists():
        n += 1
        path = out / f"{slug}-{time.strftime('%Y%m%d-%H%M%S')}-{n}"
    path.mkdir(parents=True)
    _LAST_RUN_DIR = path
    return path


def last_run_dir(forget: bool = False) -> Path | None:
    """The results folder :func:`make_run_dir` made (or opened) last in this process: what an
    interrupted command tells its user to pass as ``--out`` to resume (a new timestamped
    folder is made inside the ``--out`` given, so that ``--out`` would start over).
    ``forget=True`` returns it and forgets it (the command line, before each command)."""
    global _LAST_RUN_DIR
    folder = _LAST_RUN_DIR
    if forget:
        _LAST_RUN_DIR = None
    return folder


class ResultsDir:
    """Atomic writers and the resume markers of one results folder.

    ``writer=False``: the writers do nothing (and the folder is not created), for the
    processes other than process 0 of a multi-process run, which compute the same results
    (see :mod:`attnprune.runs.distributed`)."""

    def __init__(self, path: str | os.PathLike, writer: bool = True) -> None:
        self.path = Path(path)
        self.writer = writer
        if writer:
            self.path.mkdir(parents=True, exist_ok=True)

    @classmethod
    def start(cls, out: str | os.PathLike, command: str, exact: bool, config: Any,
              announce: str = "results: {}") -> ResultsDir:
        """Make (or reopen, with ``exact``) the results folder of ``command``, write its
        resolved ``config.yaml`` and say where it is (the line ``announce`` with the folder's
        path for ``{}``): the opening every command shares.

        Reopening a folder that has a ``config.yaml`` resumes it: its finished runs are kept,
        so ``config`` must be the folder's (:meth:`check_resume`, before any work), and its
        config.yaml stays as it is. ``out`` naming a file is a ConfigError naming --out."""
        from attnprune.runs.config import check_out, dump_yaml

        check_out(out)
        resuming = exact and (Path(out) / "config.yaml").is_file()
        if resuming:
            cls.check_resume(out, config)
        results = cls(make_run_dir(out, command, exact))
        if not resuming:
            results.write_text("config.yaml", dump_yaml(config))
        print(announce.format(results.path), flush=True)
        return results

    @staticmethod
    def check_resume(path: str | os.PathLike, config: Any) -> None:
        """Refuse to resume the results folder ``path`` with options other than those in its
        config.yaml (ConfigError naming each differing key, old → new): its finished runs
        would be skipped and the new options written over theirs, mislabelling them."""
        from attnprune.runs.config import ConfigError, config_differences, read_yaml

        diff = config_differences(read_yaml(Path(path) / "config.yaml"), config)
        if diff:
            keys = "; ".join(f"{k}: {old!r} → {new!r}" for k, (old, new) in diff.items())
            raise ConfigError(f"out: {path} holds results of a different config (differing "
                              f"keys: {keys}); rerun with the folder's options (--out alone) "
                              "to resume, or give a new --out")

    # -- writers ---------------------------------------------------------------------------
    def _write_bytes(self, name: str, data: bytes) -> Path:
        """Every writer ends here: one place where a non-writing process skips the write."""
        if not self.writer:
            return self.path / name
        return atomic_write_bytes(self.path / name, data)

    def write_text(self, name: str, text: str) -> Path:
        return self._write_bytes(name, text.encode("utf-8"))

    def write_json(self, name: str, obj: Any) -> Path:
        return self.write_text(name, json.dumps(jsonable(obj), indent=2) + "\n")

    def read_json(self, name: str) -> Any:
        return json.loads((self.path / name).read_text())

    def write_npy(self, name: str, array: np.ndarray) -> Path:
        buf = io.BytesIO()
        np.save(buf, np.asarray(array), allow_pickle=False)
        return self._write_bytes(name, buf.getvalue())

    def write_npz(self, name: str, **arrays: np.ndarray) -> Path:
        buf = io.BytesIO()
        np.savez_compressed(buf, **{k: np.asarray(v) for k, v in arrays.items()})
        return self._write_bytes(name, buf.getvalue())

    def write_csv(self, name: str, rows: list[dict]) -> Path:
        buf = io.StringIO()
        fields: list[str] = []
        for r in rows:
            fields += [k for k in r if k not in fields]
        w = csv.DictWriter(buf, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: jsonable(v) for k, v in r.items()})
        return self.write_text(name, buf.getvalue())

    def save_figure(self, name: str, fig) -> Path:
        """Save a matplotlib figure atomically as PNG and close it."""
        import matplotlib.pyplot as plt

        buf = io.BytesIO()
        if self.writer:
            fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
        plt.close(fig)
        return self._write_bytes(name, buf.getvalue())

    # -- resume ----------------------------------------------------------------------------
    @staticmethod
    def _key(key: str) -> str:
        return re.sub(r"[^A-Za-z0-9_.=-]+", "_", key)

    def exists(self, name: str) -> bool:
        """Whether the folder holds the file ``name`` (e.g. a result kept from an earlier run)."""
        return (self.path / name).is_file()

    def run_done(self, key: str) -> bool:
        return (self.path / "runs" / f"{self._key(key)}.json").is_file()

    def load_run(self, key: str) -> dict:
        return json.loads((self.path / "runs" / f"{self._key(key)}.json").read_text())

    def save_run(self, key: str, record: dict) -> Path:
        """Mark (method, seed) run ``key`` finished with its record (written last, atomically).
        After a Ctrl-C that was dropped (:func:`sticky_ctrl_c`): KeyboardInterrupt, with this
        run saved (not while an exception is being handled: the clean-up after the Ctrl-C
        that did arrive saves its finished runs too)."""
        global _CTRL_C
        path = self.write_json(f"runs/{self._key(key)}.json", record)
        if _CTRL_C and sys.exc_info()[0] is None:
            _CTRL_C = False
            raise KeyboardInterrupt
        return path

    def save_predictions(self, label: str, seed: int, y_true, y_pred, scores=None) -> Path:
        """Per-example labels and predictions: class ids as int64, real-valued ones (the targets
        and outputs of a regression) as float64, so they are not truncated to integers."""
        def arr(x):
            a = np.asarray(x)
            return a.astype(np.float64 if np.issubdtype(a.dtype, np.floating) else np.int64)

        arrays = {"y_true": arr(y_true), "y_pred": arr(y_pred)}
        if scores is not None:
            arrays["scores"] = np.asarray(scores, dtype=np.float64)
        return self.write_npz(f"predictions/{self._key(label)}__seed{int(seed)}.npz", **arrays)
