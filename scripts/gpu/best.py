"""Best against best (issue 46, item 1): each point of `bench gpu` at its best over the graph
modes it was timed in, with the mode that gave it, and its ratio to the full model's best of
the same cell; the per-mode times beside it.

    python scripts/gpu/best.py OUT.md MODE=summary.json [MODE=summary.json ...]

e.g. ``eager=bench/grid/summary.json cudagraphs=bench/cudagraphs/summary.json
inductor-cudagraphs=bench/compiled/summary.json`` (``cudagraphs``: each point captured without
inductor, ``bench gpu --cudagraphs true``; a summary that is missing is left out). A
point timed in one mode only is compared as it is (its mode is shown); a cell whose full model
was not timed has no ratios.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def best_rows(by_mode: dict[str, list[dict]]) -> list[dict]:
    cells: dict[tuple, dict] = {}
    for mode, rows in by_mode.items():
        for r in rows:
            if r.get("ms") is None:
                continue
            key = (r["model"], r["B"], r["T"])
            cells.setdefault(key, {}).setdefault(r["point"], {})[mode] = r["ms"]
    out = []
    for (model, B, T), points in cells.items():
        full = min(points["full"].values()) if "full" in points else None
        for point, times in points.items():
            mode, ms = min(times.items(), key=lambda kv: kv[1])
            out.append({"model": model, "B": B, "T": T, "point": point, "best_ms": ms,
                        "best_mode": mode, "relative": None if full is None else ms / full,
                        "modes": times})
    return out


def table(rows: list[dict], modes: list[str]) -> str:
    head = ["model", "B × T", "point", "best", "mode", "× best full", *modes]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        rel = "—" if r["relative"] is None else f"{r['relative']:.2f}×"
        per = [f"{r['modes'][m]:.2f} ms" if m in r["modes"] else "—" for m in modes]
        lines.append(f"| {r['model']} | {r['B']} × {r['T']} | {r['point']} | "
                     f"{r['best_ms']:.2f} ms | {r['best_mode']} | {rel} | " + " | ".join(per) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out, pairs = Path(argv[0]), [a.split("=", 1) for a in argv[1:]]
    by_mode = {}
    for mode, path in pairs:
        if Path(path).is_file():
            by_mode[mode] = json.loads(Path(path).read_text()).get("rows", [])
    rows = best_rows(by_mode)
    out.write_text(table(rows, list(by_mode)))
    print(f"{out}: {len(rows)} points over {', '.join(by_mode) or 'no mode'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
