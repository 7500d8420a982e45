"""The short SUMMARY.txt of a GPU job's part (scripts/gpu/job.sh), from its work folder.

    python scripts/gpu/summary.py WORK PART TARBALL PACK_RC SECONDS > OUT/SUMMARY.txt
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _timed(row: dict) -> bool:
    return row.get("ms") is not None or row.get("median_ms") is not None or bool(row.get("profile"))


def summary(w: Path, part: str, tarball: Path, pack_rc: str, took: str) -> str:
    out = [f"PART={part}: {took} s; tarball {tarball.name}: "
           + (f"{tarball.stat().st_size / 2**20:.2f} MiB" if tarball.is_file() else "MISSING")
           + f" (pack rc {pack_rc})"]
    versions = w / "versions.log"
    out.append(versions.read_text().splitlines()[0] if versions.is_file() else "no versions.log")
    out.append("steps:")
    steps = w / "STEPS.txt"
    out += ["  " + ln for ln in (steps.read_text().splitlines() if steps.is_file() else [])]
    for name in ("grid", "cudagraphs", "compiled", "prefill", "profile"):
        f = w / name / "summary.json"
        if f.is_file():
            rows = json.loads(f.read_text()).get("rows", [])
            failed = [r for r in rows if str(r.get("note", "")).startswith("failed")]
            out.append(f"{name}: {sum(map(_timed, rows))} of {len(rows)} rows timed"
                       + (f", {len(failed)} failed (see {name}/table.md)" if failed else ""))
        elif (w / f"{name}.log").is_file():
            out.append(f"{name}: no summary.json (see {name}.log)")
    for name in ("tests_cuda", "tests_compile"):
        f = w / f"{name}.log"
        if f.is_file():
            lines = [ln for ln in f.read_text().splitlines() if ln.strip()]
            out.append(f"{name}: {lines[-1] if lines else 'empty log'}")
            out += ["  " + ln[:160] for ln in lines if ln.startswith(("FAILED", "ERROR"))][:12]
    for d in sorted(p for p in w.iterdir() if (p / "train.json").is_file()):
        t = json.loads((d / "train.json").read_text())
        last = (t.get("log") or [{}])[-1]
        acc = t.get("validation_accuracy") or {}
        full = ", ".join(f"{task} {v.get('full', float('nan')):.3f}" for task, v in acc.items())
        out.append(f"{d.name}: {last.get('steps_done')} steps in {last.get('train_s')} s; "
                   f"validation accuracy (full prompt): {full or 'none'}")
    pack = w / "pack.log"
    out.append(f"packing: {pack.read_text().strip() if pack.is_file() else '?'}")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    w, part, tarball, pack_rc, took = sys.argv[1:6]
    sys.stdout.write(summary(Path(w), part, Path(tarball), pack_rc, took))
