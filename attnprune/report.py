"""One self-contained HTML report per results folder (``attnprune report DIR``).

Reads what every command writes (DESIGN.md contract): ``summary.json`` (its ``methods`` table
and ``comparisons``), ``config.yaml`` and every ``*.png`` in the folder, and writes
``report.html`` with the figures embedded as base64, so the file can be mailed or attached.
Commands call :func:`build` at their end; the command rebuilds it after a partial run.
"""

from __future__ import annotations

import base64
import html
import json
import sys
from pathlib import Path
from typing import Any

from .results import atomic_write_text

__all__ = ["build", "main"]

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.6em}h2{font-size:1.25em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.88em;margin:.6em 0}
th,td{border:1px solid #ccc;padding:.25em .55em;text-align:right}
th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}
figure{display:inline-block;margin:.5em;vertical-align:top}
figure img{max-width:520px;border:1px solid #eee}figcaption{font-size:.85em;color:#555}
pre{background:#f7f7f7;padding:.8em;overflow:auto;font-size:.85em}
.yes{color:#0a0}.no{color:#a00}
"""


def _fmt(x: Any, digits: int = 4) -> str:
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        if x != 0 and (abs(x) < 1e-3 or abs(x) >= 1e6):
            return f"{x:.3g}"
        return f"{x:.{digits}f}"
    return html.escape(str(x))


def _metric_cell(v: Any) -> str:
    """A {mean, ci95} dict → 'mean [lo, hi]'; a plain number → the number."""
    if isinstance(v, dict) and "mean" in v:
        ci = v.get("ci95") or [None, None]
        return f"{_fmt(v['mean'])} [{_fmt(ci[0])}, {_fmt(ci[1])}]"
    if isinstance(v, dict):
        for key in ("relative", "median_s", "measured"):
            if key in v:
                return _fmt(v[key])
        return html.escape(json.dumps(v)[:60])
    return _fmt(v)


def _methods_table(methods: dict[str, dict]) -> str:
    cols: list[str] = []
    for rec in methods.values():
        for k in rec:
            if k not in cols:
                cols.append(k)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in ["method", *cols])
    rows = []
    for name, rec in methods.items():
        cells = "".join(f"<td>{_metric_cell(rec.get(c))}</td>" for c in cols)
        rows.append(f"<tr><td>{html.escape(name)}</td>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _comparisons_table(comps: list[dict]) -> str:
    cols = ["a", "b", "metric", "diff", "ci95", "test", "p", "p_holm", "effect", "noninferior", "claim"]
    cols = [c for c in cols if any(c in r for r in comps)]
    head = "".join(f"<th>{c}</th>" for c in cols)
    rows = []
    for r in comps:
        cells = []
        for c in cols:
            v = r.get(c)
            if c == "ci95" and isinstance(v, (list, tuple)):
                cells.append(f"<td>[{_fmt(v[0])}, {_fmt(v[1])}]</td>")
            elif c == "effect" and isinstance(v, dict):
                cells.append("<td>" + ", ".join(f"{k} {_fmt(x)}" for k, x in v.items()) + "</td>")
            else:
                cells.append(f"<td>{_fmt(v)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def build(run_dir: str | Path) -> Path:
    """Write ``run_dir/report.html`` from the folder's summary, config and figures."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"report: {run_dir} is not a folder")
    summary: dict = {}
    if (run_dir / "summary.json").is_file():
        summary = json.loads((run_dir / "summary.json").read_text())
    parts = [f"<h1>attnprune report — {html.escape(str(summary.get('command', run_dir.name)))}</h1>"]
    env = summary.get("env")
    if env:
        parts.append("<p>" + " · ".join(f"{html.escape(k)}: {_fmt(v)}" for k, v in env.items()) + "</p>")
    if summary.get("notes"):
        notes = summary["notes"]
        notes = notes if isinstance(notes, list) else [notes]
        parts.append("<ul>" + "".join(f"<li>{html.escape(str(n))}</li>" for n in notes) + "</ul>")
    if summary.get("methods"):
        parts.append("<h2>Methods (mean [95 % CI] over seeds; relative = against the full model, same run)</h2>")
        parts.append(_methods_table(summary["methods"]))
    if summary.get("comparisons"):
        parts.append("<h2>Paired comparisons (Holm-corrected)</h2>")
        parts.append(_comparisons_table(summary["comparisons"]))
    for key, value in summary.items():
        if key in ("command", "env", "methods", "comparisons", "notes"):
            continue
        parts.append(f"<h2>{html.escape(key)}</h2><pre>{html.escape(json.dumps(value, indent=2)[:20000])}</pre>")
    figures = sorted(run_dir.glob("*.png"))
    if figures:
        parts.append("<h2>Figures</h2>")
        for png in figures:
            data = base64.b64encode(png.read_bytes()).decode("ascii")
            parts.append(
                f'<figure><img alt="{html.escape(png.name)}" src="data:image/png;base64,{data}">'
                f"<figcaption>{html.escape(png.name)}</figcaption></figure>"
            )
    if (run_dir / "config.yaml").is_file():
        parts.append("<h2>Configuration</h2><pre>" + html.escape((run_dir / "config.yaml").read_text()) + "</pre>")
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>attnprune report</title>"
        f"<style>{_CSS}</style></head><body>{''.join(parts)}</body></html>\n"
    )
    return atomic_write_text(run_dir / "report.html", page)


def main(argv: list[str]) -> int:
    """``attnprune report DIR [DIR ...]``."""
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: attnprune report DIR [DIR ...]   (re)build DIR/report.html")
        return 0 if argv else 2
    for d in argv:
        try:
            path = build(d)
        except ValueError as e:
            print(f"attnprune report: error: {e}", file=sys.stderr)
            return 2
        print(path)
    return 0
