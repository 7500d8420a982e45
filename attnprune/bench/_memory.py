"""Benchmark-private memory helpers: a fixed glibc mmap threshold, and running a measurement in
a process of its own so that the setting never reaches the caller's process.

Why not in :mod:`attnprune.measure`: ``mallopt`` changes malloc for the whole process for good
(3,000 × 256 KB allocations took 32 ms before it and 719 ms after, in one process), which a
library must not do to its caller. A benchmark calls :func:`in_child`, and the child, which
exists only for the measurement, calls :func:`return_freed_memory`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["in_child", "return_freed_memory"]


def return_freed_memory(threshold: int = 1 << 16) -> bool:
    """Make glibc's malloc hand every block of ≥ ``threshold`` bytes back to the OS when freed,
    for the rest of the process, so that :func:`attnprune.measure.peak_memory` reads each
    call's own growth. Call it only in a process that exists for the measurement
    (:func:`in_child`).

    By default glibc raises its mmap threshold (up to 32 MB) after large blocks are freed; later
    blocks then come from the heap, which keeps freed memory, and a second call of the same
    function can read 0 MB (10 × 4 MB tensors: 39.8 MB, then 0.0, then 4.0 MB; with this, 39.9,
    40.1, 40.0, measured). Setting ``M_MMAP_THRESHOLD`` with ``mallopt`` fixes the threshold,
    which also stops that raising. Written by hand: no library here exposes mallopt.
    Returns False where the C library is not glibc (then nothing changes)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(-3, int(threshold)))  # -3: M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        return False


def in_child(target: str, payload: dict, timeout: float | None = None) -> dict:
    """Run ``target`` ("module:function", taking and returning a JSON-able dict) on
    ``payload`` in a fresh Python process and return its result. The child imports this
    process's copy of attnprune; its output is shown only if it fails (RuntimeError)."""
    module, func = target.split(":")
    root = str(Path(__file__).resolve().parents[2])  # the folder that holds attnprune/
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    code = ("import json, sys, importlib\n"
            f"fn = getattr(importlib.import_module({module!r}), {func!r})\n"
            "out = fn(json.loads(open(sys.argv[1]).read()))\n"
            "open(sys.argv[2], 'w').write(json.dumps(out))\n")
    with tempfile.TemporaryDirectory(prefix="attnprune-child-") as d:
        src, dst = Path(d) / "in.json", Path(d) / "out.json"
        src.write_text(json.dumps(payload))
        proc = subprocess.run([sys.executable, "-c", code, str(src), str(dst)], env=env,
                              capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0 or not dst.is_file():
            raise RuntimeError(f"{target} failed in its own process (exit {proc.returncode}):\n"
                               f"{(proc.stdout + proc.stderr)[-4000:]}")
        return json.loads(dst.read_text())
