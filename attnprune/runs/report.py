"""One self-contained HTML page per results folder (``attnprune report DIR``).

Reads what every command writes: ``summary.json``, ``config.yaml`` and
the ``*.png`` figures, and writes ``DIR/report.html`` with the figures embedded as base64, so
the file can be mailed or attached. Commands call :func:`build` at their end; the command
rebuilds it after a partial run. Given a folder that holds several results folders (``--out``
of repeated runs), it writes one page per run and an ``index.html`` linking them.

The page is for reading, not for machines (``summary.json`` is that):

* a one-line verdict under the title, from the summary's own numbers (:func:`verdict`): the
  best pruned point or method, its Δ vs full with its interval, its FLOPs / time ratio and
  whether it meets the bar (pareto) or the non-inferiority margin; else the command and date;
* the page fits its width (1100 px): figures two to a row (a row of panels, full width),
  tables at most the page wide, wide ones (> 10 columns) in a smaller font, and a record
  table with more columns than rows turned (one row per metric); per-seed repeats, the
  reliability bins and the configuration are folded under ``<details>``;
* an aggregate over exactly 2 seeds shows its two values and "n = 2", not an interval: a
  t-interval on 1 df ("50.41 ± 630.10", [0.037, 1.118]) implies a precision 2 seeds lack;
* figures first, since they are what a reader looks at;
* the main table (``methods``; ``points`` of ``pareto``) with one column per metric: nested
  records are flattened (``flops · relative``), ``{mean, ci95}`` shows as ``mean [lo, hi]``,
  per-seed lists are left to ``summary.json``;
* every comparison (any list of records with ``a`` and ``b``) as a table: a, b, metric, diff,
  95 % CI, test, p, Holm-adjusted p, then whatever else the command recorded (seed, effect…);
* every other key of the summary as a table or a short list, never as raw JSON;
* numbers with 4 significant digits (p-values 3), so no 17-digit float reaches the reader;
  integers are written out in full, or with k / M / G above a million (FLOP counts).

Why HTML by hand rather than a template engine or pandas' ``to_html``: the page is a handful
of tables and images, and the formatting rules above are the whole point; neither a Jinja
dependency nor DataFrame styling would remove any of them.
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from attnprune.runs.results import atomic_write_text

__all__ = ["build", "fmt", "main", "verdict"]

# overflow-wrap: break-word, not anywhere: "anywhere" lets a column shrink to its widest
# letter, so an automatic-layout table wrapped its headers one letter a line; break-word
# breaks inside a word only when the word alone is wider than its column.
_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:1.5em auto;max-width:1100px;
padding:0 1em;color:#222;line-height:1.4}
h1{font-size:1.5em;margin-bottom:.2em}h2{font-size:1.2em;margin-top:1.8em;border-bottom:1px solid #ddd}
h3{font-size:1em;margin:1.2em 0 .3em}
.meta{color:#555;font-size:.9em}
p.verdict{font-size:1.05em;background:#f4f7fb;border-left:4px solid #4C72B0;padding:.5em .8em;
margin:.6em 0 1em}
.scroll{max-width:100%}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0;max-width:100%;table-layout:auto}
table.wide{width:100%;table-layout:auto;font-size:.72em}
th,td{border:1px solid #d4d4d4;padding:.2em .5em;text-align:right;overflow-wrap:break-word}
td{white-space:normal}
th{background:#f2f2f2;vertical-align:bottom;max-width:9em;hyphens:auto}
table.wide th,table.wide td{padding:.15em .3em;max-width:none}
td.l,th.l{text-align:left}
td.w{white-space:normal;text-align:left;min-width:8em;max-width:26em}
tr:nth-child(even) td{background:#fafafa}
figure{display:inline-block;margin:.4em;vertical-align:top;width:calc(50% - .8em);max-width:100%}
figure.full{width:calc(100% - .8em)}
figure img{width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:.8em;color:#555;text-align:center}
.yes{color:#070}.no{color:#a00}.sig{font-weight:600}
ul.notes{font-size:.9em}
table.kv td{text-align:left}
details>summary{cursor:pointer}details>summary h2.fold{display:inline-block;border:0}
"""
# Keys kept in summary.json but not shown: per-seed detail and raw arrays.
_HIDDEN = {"per_seed", "per_seed_ci95", "seeds", "batch_shape", "discordant", "test_variant"}
_P_KEYS = {"p", "p_holm", "pvalue", "p_value"}
# The columns of a comparison table, in this order; other keys follow.
_COMPARISON_COLS = ["a", "b", "metric", "diff", "ci95", "test", "p", "p_holm"]
_COLUMN_NAMES = {"ci95": "95 % CI", "p_holm": "p (Holm)", "diff": "diff (a − b)"}


def fmt(x: Any, digits: int = 4) -> str:
    """A value as text for the page: floats with ``digits`` significant digits, big integers
    with k / M / G, None as "–". Trailing zeros are kept (0.9000), so columns line up."""
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x) if abs(x) < 1_000_000 else _si(float(x), digits)
    if isinstance(x, float):
        if math.isnan(x) or math.isinf(x):
            return str(x)
        if x == 0:
            return "0"
        if x.is_integer() and abs(x) < 1_000_000:  # counts stored as floats (FLOPs)
            return str(int(x))
        if abs(x) >= 1_000_000:
            return _si(x, digits)
        if abs(x) < 1e-3:
            return f"{x:.{digits - 1}e}"
        s = f"{x:#.{digits}g}"
        return s.rstrip(".") if "e" not in s else s
    return str(x)


def fmt_mean_ci(a: dict, f: str = "{:.4f}") -> str:
    """``mean [lo, hi]`` of an aggregate (``{"mean", "ci95"}``, e.g. from
    ``stats.aggregate_seeds``), each number through the format string ``f``."""
    return f"{f.format(a['mean'])} [{f.format(a['ci95'][0])}, {f.format(a['ci95'][1])}]"


def _si(x: float, digits: int) -> str:
    for scale, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M")):
        if abs(x) >= scale:
            return f"{fmt(x / scale, digits)} {unit}"
    return fmt(x, digits)


# Metrics that are proportions or correlations: an interval shown for them is cut to their
# range, as stats.aggregate_seeds(bounds=...) cuts it, for folders whose command did not (a
# t-interval over 2 seeds has t = 12.7: "0.5775 [0.03749, 1.118]"). Cutting keeps the
# interval's coverage, since the true value lies in the range. Stored as a percent (a mean
# beyond the range's top, up to 100 times it): the range in percent.
RANGES = {**dict.fromkeys(("accuracy", "acc", "auc", "signal_auc", "f1", "f1_macro", "precision",
                           "recall", "kept_ratio", "oracle_overlap", "flip_kept", "ece",
                           "ece_heldout", "ece_heldout_temp"), (0.0, 1.0)),
          **dict.fromkeys(("mcc", "pearson", "spearman"), (-1.0, 1.0))}


def within_range(key: str, mean: Any, ci: list) -> list:
    """``ci`` cut to the range of the metric named ``key`` (:data:`RANGES`; ``test_accuracy``
    and ``val_acc`` are accuracies too); unchanged for other metrics."""
    name = key.rsplit(" · ", 1)[-1]
    rng = RANGES.get(name) or next((r for m, r in RANGES.items() if name.endswith(f"_{m}")), None)
    if rng is None or not isinstance(mean, (int, float)) or len(ci) != 2 or not all(
            isinstance(c, (int, float)) for c in ci):
        return ci
    if rng[1] < abs(mean) <= 100 * rng[1]:  # a percent
        rng = (100 * rng[0], 100 * rng[1])
    return [max(ci[0], rng[0]), min(ci[1], rng[1])]


def _is_ci(v: Any) -> bool:
    return isinstance(v, dict) and "mean" in v


def _few_seeds(v: dict) -> list | None:
    """The per-seed values of an aggregate over exactly 2 seeds (else None): their t-interval
    has 1 degree of freedom (t = 12.7), so "50.41 ± 630.10" would imply a precision two seeds
    cannot give; the page shows the two values instead. One seed keeps its interval (over
    test examples, meaningful); 3 or more keep mean [95 % CI]."""
    per = v.get("per_seed")
    if (isinstance(per, list) and len(per) == 2
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in per)):
        return per
    return None


def _cell_text(v: Any, key: str = "") -> str:
    """Plain text of one table cell."""
    digits = 3 if key in _P_KEYS else 4
    if _is_ci(v):
        seeds = _few_seeds(v)
        if seeds is not None:  # 2 seeds: a t-interval on 1 df says nothing; show the two
            return f"{fmt(v['mean'])} ({', '.join(fmt(x, 3) for x in seeds)}; n = {len(seeds)})"
        ci = within_range(key, v["mean"], v.get("ci95") or [])
        if len(ci) == 2 and all(isinstance(c, (int, float)) for c in ci):
            return f"{fmt(v['mean'])} [{fmt(ci[0])}, {fmt(ci[1])}]"
        return fmt(v["mean"])
    if isinstance(v, (list, tuple)):
        if key.endswith("ci95") and len(v) == 2:
            return f"[{fmt(v[0])}, {fmt(v[1])}]"
        nums = [x for x in v if isinstance(x, (int, float)) and not isinstance(x, bool)
                and not math.isnan(x)]
        if len(v) > 12 or (len(v) > 4 and len(nums) < len(v) / 2):
            # long arrays (ROC points, reliability bins, mostly empty): their figure shows them
            if not nums:
                return f"{len(v)} items"
            empty = f", {len(v) - len(nums)} empty" if len(nums) < len(v) else ""
            return f"{len(v)} values, {fmt(min(nums))} … {fmt(max(nums))}{empty}"
        return ", ".join(_cell_text(x) for x in v)
    if isinstance(v, dict):
        return "; ".join(f"{k} {_cell_text(x, str(k))}" for k, x in v.items()
                         if k not in _HIDDEN and x is not None)
    return fmt(v, digits)


def _td(v: Any, key: str = "") -> str:
    text = html.escape(_cell_text(v, key))
    if isinstance(v, bool):
        return f'<td class="{"yes" if v else "no"}">{text}</td>'
    if key == "p_holm" and isinstance(v, (int, float)) and v < 0.05:
        return f'<td class="sig">{text}</td>'
    numeric = isinstance(v, (int, float)) or _is_ci(v) or v is None
    if numeric:
        return f"<td>{text}</td>"
    return f'<td class="{"w" if len(text) > 30 else "l"}">{text}</td>'


def _flatten(rec: dict, prefix: str = "") -> dict[str, Any]:
    """One level of columns from a nested record: {mean, ci95} and lists stay whole, other
    dicts become ``outer · inner`` columns; comparison records (with a and b) are skipped,
    they have their own table."""
    out: dict[str, Any] = {}
    for k, v in rec.items():
        if k in _HIDDEN:
            continue
        name = f"{prefix}{k}"
        if isinstance(v, dict) and not _is_ci(v):
            if _is_comparison(v):
                continue
            out.update(_flatten(v, f"{name} · "))
        else:
            out[name] = v
    return out


def _table(rows: list[tuple[str, dict]], first: str) -> str:
    """Rows (label, flat record) → an HTML table; columns in first-seen order, empty ones dropped."""
    cols: list[str] = []
    for _, rec in rows:
        cols += [c for c in rec if c not in cols]
    cols = [c for c in cols if any(rec.get(c) is not None for _, rec in rows)]
    if len(cols) > WIDE_COLUMNS and len(rows) < len(cols):
        # many metrics, few methods: one row per metric, one column per method, so the table
        # fits the page width instead of scrolling sideways
        head = '<th class="l">metric</th>' + "".join(
            f"<th>{html.escape(str(label))}</th>" for label, _ in rows)
        body = "".join(
            f'<tr><td class="l">{html.escape(_COLUMN_NAMES.get(c, c))}</td>'
            + "".join(_td(rec.get(c), c.rsplit(" · ", 1)[-1]) for _, rec in rows) + "</tr>"
            for c in cols)
        return _wrap(head, body, len(rows) + 1)
    head = f'<th class="l">{html.escape(first)}</th>' + "".join(
        f"<th>{html.escape(_COLUMN_NAMES.get(c, c))}</th>" for c in cols)
    body = "".join(
        f'<tr><td class="l">{html.escape(str(label))}</td>'
        + "".join(_td(rec.get(c), c.rsplit(" · ", 1)[-1]) for c in cols) + "</tr>"
        for label, rec in rows)
    return _wrap(head, body, len(cols) + 1)


# Above this many columns a table is "wide": set at the page width (fixed layout, smaller font,
# cells wrap), and a record table with fewer rows than columns is turned (metrics as rows).
WIDE_COLUMNS = 10


def _wrap(head: str, body: str, n_cols: int) -> str:
    cls = ' class="wide"' if n_cols > WIDE_COLUMNS else ""
    return f'<div class="scroll"><table{cls}><tr>{head}</tr>{body}</table></div>'


def _is_comparison(v: Any) -> bool:
    return isinstance(v, dict) and "a" in v and "b" in v


def _comparisons_table(comps: list[dict]) -> str:
    """The comparisons: the fixed columns first, then the other keys the command recorded."""
    flat = [_flatten(c) for c in comps]
    cols = [c for c in _COMPARISON_COLS if any(c in r for r in flat)]
    for r in flat:
        cols += [c for c in r if c not in cols and not c.startswith("effect · delta")]
    cols = [c for c in cols if any(r.get(c) is not None for r in flat)]
    head = "".join(f'<th class="l">{html.escape(_COLUMN_NAMES.get(c, c))}</th>' if c in ("a", "b")
                   else f"<th>{html.escape(_COLUMN_NAMES.get(c, c))}</th>" for c in cols)
    body = "".join("<tr>" + "".join(_td(r.get(c), c) for c in cols) + "</tr>" for r in flat)
    return _wrap(head, body, len(cols))


def _scalars(d: dict, exact: bool = False) -> str:
    """A two-column key / value table; ``exact`` (settings) writes numbers as given, up to 6
    significant digits and without padding zeros (lr 0.001, not 0.001000)."""
    def text(k, v):
        if exact and isinstance(v, float):
            return html.escape(f"{v:.6g}")
        if exact and isinstance(v, (list, tuple)):
            return html.escape(", ".join(f"{x:.6g}" if isinstance(x, float) else _cell_text(x)
                                         for x in v))
        return html.escape(_cell_text(v, str(k)))

    rows = "".join(f'<tr><td>{html.escape(str(k))}</td><td>{text(k, v)}</td></tr>'
                   for k, v in _flatten(d).items())
    return f'<table class="kv">{rows}</table>'


def _section(key: str, value: Any, level: int = 2) -> str:
    """Any other summary entry, shown as a table, a list or a line; never raw JSON."""
    title = f"<h{level}>{html.escape(key.replace('_', ' '))}</h{level}>"
    if value is None or value == [] or value == {}:
        return ""
    if isinstance(value, list) and all(_is_comparison(v) for v in value):
        return title + _comparisons_table(value)
    if isinstance(value, list) and all(isinstance(v, dict) for v in value):
        return title + _table([(str(i + 1), _flatten(v)) for i, v in enumerate(value)], "#")
    if isinstance(value, dict):
        lists = {k: v for k, v in value.items()
                 if isinstance(v, list) and v and all(isinstance(x, dict) for x in v)}
        if lists:  # e.g. ablations (name → runs), comparisons per group: one table each
            rest = {k: v for k, v in value.items() if k not in lists}
            return (title + (_scalars(rest) if rest else "")
                    + "".join(_section(str(k), v, level + 1) for k, v in lists.items()))
        if value and all(isinstance(v, dict) for v in value.values()):
            rows = [(str(k), _flatten(v)) for k, v in value.items()]
            n_cols = len({c for _, r in rows for c in r})
            if n_cols <= 40 or level >= 4:
                return title + _table(rows, "")
            return title + "".join(_section(str(k), v, level + 1) for k, v in value.items())
        return title + _scalars(value)
    if isinstance(value, list):
        return title + f"<p>{html.escape(_cell_text(value))}</p>"
    return title + f"<p>{html.escape(_cell_text(value))}</p>"


def _png_size(png: Path) -> tuple[int, int] | None:
    """(width, height) from a PNG's IHDR chunk, None if the file is not a PNG."""
    with png.open("rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or len(head) < 24:
        return None
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def _figures(run_dir: Path) -> str:
    pngs = sorted(run_dir.glob("*.png")) + sorted(run_dir.glob("figures/*.png"))
    out = []
    for png in pngs:
        data = base64.b64encode(png.read_bytes()).decode("ascii")
        name = html.escape(png.relative_to(run_dir).as_posix())
        size = _png_size(png)
        wide = size is not None and size[0] >= 2 * size[1]  # a row of panels: full width
        out.append(f'<figure{" class=full" if wide else ""}><img alt="{name}" '
                   f'src="data:image/png;base64,{data}">'
                   f"<figcaption>{name}</figcaption></figure>")
    return "".join(out)


def _config(run_dir: Path, summary: dict) -> str:
    text = (run_dir / "config.yaml").read_text() if (run_dir / "config.yaml").is_file() else None
    cfg = summary.get("config")
    if text is not None:
        import yaml

        try:
            cfg = yaml.safe_load(text)
        except yaml.YAMLError:
            return "<h2>configuration</h2><pre>" + html.escape(text) + "</pre>"
    if not isinstance(cfg, dict) or not cfg:
        return ""
    return "<h2>configuration</h2>" + _scalars(cfg, exact=True)


# ----------------------------------------------------------------------------- verdict line
# Metrics where lower is better: "closest to full" flips for them.
_LOWER_BETTER = {"val_loss", "loss", "perplexity", "mse", "ece"}
_MARGIN = 0.01  # non-inferiority margin when a comparison does not record its own (1 pp)


def _delta_text(metric: str, diff: float, ci: list | None, per_seed: list | None) -> str:
    """Δ with its interval, in percentage points for proportions (accuracy, AUC…)."""
    pp = RANGES.get(metric) == (0.0, 1.0)
    def one(x):
        return f"{100 * x:+.2f}" if pp else f"{x:+.4g}"
    unit = " pp" if pp else ""
    if per_seed is not None:
        return (f"{metric} Δ vs full {one(diff)}{unit} (seeds {', '.join(one(x) for x in per_seed)};"
                f" n = {len(per_seed)}, no interval)")
    ci_text = f" [{one(ci[0])}, {one(ci[1])}]" if ci else ""
    return f"{metric} Δ vs full {one(diff)}{ci_text}{unit}"


def _headline(comps: list[dict]) -> str | None:
    metrics = [c.get("metric") for c in comps]
    return next((m for m in ("accuracy", "pearson", "mcc", "auc") if m in metrics),
                next((m for m in metrics if m), None))


def _pooled_delta(cs: list[dict]) -> tuple[float, list | None, list | None]:
    """(Δ, 95 % CI, per-seed Δs) of one method's comparisons vs full: one record (pooled or
    one seed) gives its own; 2 seeds give their two Δs and no interval; 3 or more, a
    t-interval over the seeds' Δs."""
    if len(cs) == 1:
        ci = cs[0].get("ci95")
        return float(cs[0]["diff"]), ci if _numbers(ci) else None, None
    d = [float(c["diff"]) for c in cs]
    mean = sum(d) / len(d)
    if len(d) == 2:
        return mean, None, d
    from scipy import stats as sps

    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1))
    half = float(sps.t.ppf(0.975, len(d) - 1)) * sd / math.sqrt(len(d))
    return mean, [mean - half, mean + half], None


def _numbers(ci: Any) -> bool:
    return (isinstance(ci, (list, tuple)) and len(ci) == 2
            and all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in ci))


def _ratio(rec: dict, key: str) -> float | None:
    """A method's time / FLOPs relative to full (the fair, unpadded one when recorded)."""
    d = rec.get(key)
    if not isinstance(d, dict):
        return None
    x = d.get("relative_fair", d.get("relative"))
    return x if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _ratios_text(flops: float | None, time: float | None, what: str = "time") -> str:
    parts = [f"{flops:.3g}× the FLOPs" if flops is not None else "",
             f"{time:.3g}× the {what}" if time is not None else ""]
    parts = [x for x in parts if x]
    return f" at {' and '.join(parts)} of full" if parts else ""


def _methods_verdict(summary: dict) -> str | None:
    """finetune, the synthetic track and other ``methods`` summaries: among the pruned methods
    within the margin of full (CI lower bound of Δ above −margin), the one at the lowest
    FLOPs; when none is, the one closest to full."""
    methods = summary.get("methods")
    comps = [c for c in summary.get("comparisons") or []
             if isinstance(c, dict) and c.get("b") == "full" and c.get("a") != "full"
             and isinstance(c.get("diff"), (int, float))]
    metric = _headline(comps)
    if not isinstance(methods, dict) or metric is None:
        return None
    by: dict[str, list[dict]] = {}
    for c in comps:
        if c.get("metric", metric) == metric and c["a"] in methods:
            by.setdefault(c["a"], []).append(c)
    if not by:
        return None
    sign = -1.0 if metric in _LOWER_BETTER else 1.0
    bounded = metric in RANGES
    rows = []
    for label, cs in by.items():
        diff, ci, per = _pooled_delta(cs)
        margin = cs[0].get("margin", _MARGIN) if bounded else None
        ok = (bounded and ci is not None and margin is not None and ci[0] > -margin)
        flops = _ratio(methods[label], "flops")
        rows.append({"label": label, "diff": diff, "ci": ci, "per": per, "ok": ok,
                     "margin": margin, "flops": flops, "time": _ratio(methods[label], "time")})
    inf = float("inf")
    within = [r for r in rows if r["ok"]]
    if within:
        best = min(within, key=lambda r: (r["flops"] if r["flops"] is not None else inf,
                                          -sign * r["diff"]))
        head = (f"{best['label']} is the pruned method at the lowest FLOPs within the "
                f"{fmt(100 * best['margin'], 2)} pp margin of full")
    else:
        best = max(rows, key=lambda r: (sign * r["diff"],
                                        -(r["flops"] if r["flops"] is not None else inf)))
        head = f"{best['label']} is the pruned method closest to full"
    text = (f"{head}: {_delta_text(metric, best['diff'], best['ci'], best['per'])}"
            f"{_ratios_text(best['flops'], best['time'])}")
    if bounded and best["margin"] is not None:
        if best["ci"] is None:
            text += "; too few seeds for an interval, so no claim of non-inferiority"
        elif not within:
            text += (f"; no pruned method is within the {fmt(100 * best['margin'], 2)} pp "
                     "non-inferiority margin (the lower end of its CI above −margin)")
    return text + "."


def _pareto_verdict(summary: dict) -> str | None:
    """pareto: the best pruned point (meeting the bar first, then the highest Δ vs full), its
    Δ with CI, its fair time and FLOPs at the largest timed batch, and the bar."""
    points = summary.get("points")
    if not isinstance(points, dict):
        return None
    pruned = [(k, e) for k, e in points.items() if isinstance(e, dict)
              and isinstance(e.get("verdict"), dict)
              and isinstance((e.get("vs_full") or {}).get("diff"), (int, float))]
    if not pruned:
        return None
    label, e = max(pruned, key=lambda kv: (bool(kv[1]["verdict"].get("meets_bar")),
                                           kv[1]["vs_full"]["diff"]))
    vs = e["vs_full"]
    times = e.get("time") or {}
    bs = max(times, key=lambda b: int(b) if str(b).isdigit() else -1) if times else None
    t = (times.get(bs) or {}).get("fair") if bs is not None else None
    f = (e.get("flops_relative") or {}).get(bs) if bs is not None else None
    v = e["verdict"]
    n = e.get("n_seeds")
    ci = vs.get("ci95") if _numbers(vs.get("ci95")) else None
    text = (f"best pruned point {label}: {_delta_text('accuracy', vs['diff'], ci, None)}"
            + (f" (n = {n} seeds)" if n else "")
            + _ratios_text(f if isinstance(f, (int, float)) else None,
                           t if isinstance(t, (int, float)) else None,
                           f"fair time (batch {bs})"))
    if v.get("meets_bar"):
        return text + "; meets the bar: yes."
    failed = [k.replace("_", " ") for k, x in v.items() if x is False and k != "meets_bar"]
    return text + "; meets the bar: no" + (f" ({', '.join(failed)}: no)" if failed else "") + "."


def verdict(summary: dict, when: str = "") -> str:
    """The page's one-line headline, from the summary's own numbers (pareto: the best pruned
    point; methods summaries: see :func:`_methods_verdict`); without a comparison against
    full, the command and the run's date."""
    try:
        line = _pareto_verdict(summary) or _methods_verdict(summary)
    except (KeyError, TypeError, ValueError, IndexError):  # an unexpected shape: no headline
        line = None
    if line:
        return line
    command = summary.get("command", "results")
    return (f"{command} run{f' of {when}' if when else ''}; no comparison against the full "
            "model in this folder.")


def _detail(key: str) -> bool:
    """Sections a reader opens on purpose (per-seed repeats of a table above, raw reliability
    bins): folded, so the page stays short; they are still in the file, one click away."""
    return "per_seed" in key or key in ("reliability", "timing")  # and the configuration


def _folded(part: str) -> str:
    """A section (its <h2> and body) inside <details>, its title the summary line."""
    m = re.match(r"<h2>(.*?)</h2>", part, re.DOTALL)
    if not m:
        return part
    return (f'<details><summary><h2 class="fold">{m.group(1)}</h2></summary>'
            f"{part[m.end():]}</details>")


def page(run_dir: str | Path) -> str:
    """The HTML of one results folder's report."""
    run_dir = Path(run_dir)
    summary: dict = {}
    if (run_dir / "summary.json").is_file():
        summary = json.loads((run_dir / "summary.json").read_text())
    command = str(summary.get("command", "results"))
    when = ""
    if (run_dir / "summary.json").is_file():
        when = datetime.fromtimestamp((run_dir / "summary.json").stat().st_mtime,
                                      UTC).strftime("%Y-%m-%d %H:%M UTC")
    parts = [f"<h1>{html.escape(command)} — {html.escape(run_dir.name)}</h1>",
             (f'<p class="verdict" id="verdict"><b>Verdict:</b> '
              f"{html.escape(verdict(summary, when))}</p>")]
    env = summary.get("env")
    if isinstance(env, dict):
        parts.append('<p class="meta">' + " · ".join(
            f"{html.escape(str(k))} {html.escape(_cell_text(v))}" for k, v in env.items()) + "</p>")
    notes = summary.get("notes")
    if notes:
        items = notes.items() if isinstance(notes, dict) else enumerate(notes if isinstance(notes, list) else [notes])
        parts.append('<ul class="notes">' + "".join(
            f"<li>{'' if isinstance(k, int) else f'<b>{html.escape(str(k))}</b>: '}"
            f"{html.escape(str(n))}</li>" for k, n in items) + "</ul>")
    figures = _figures(run_dir)
    if figures:
        parts.append(figures)
    main_key = next((k for k in ("methods", "points") if isinstance(summary.get(k), dict)), None)
    if main_key:
        few = any(_is_ci(x) and _few_seeds(x) is not None for rec in summary[main_key].values()
                  if isinstance(rec, dict) for x in _flatten(rec).values())
        parts.append(f"<h2>{main_key} (mean [95 % CI] over seeds; relative = against the full "
                     "model, same run)</h2>")
        if few:
            parts.append('<p class="meta">With 2 seeds a cell reads "mean (seed 1, seed 2; '
                         'n = 2)": a 95 % t-interval on 1 degree of freedom reaches 12.7 standard '
                         "errors either side, wider than most metrics' range, so none is "
                         "shown.</p>")
        parts.append(_table([(k, _flatten(v)) for k, v in summary[main_key].items()],
                            "method" if main_key == "methods" else "point"))
    if summary.get("comparisons"):
        parts.append("<h2>comparisons (paired; p (Holm) over the run's family)</h2>")
        parts.append(_comparisons_table(summary["comparisons"]))
    shown = {"command", "env", "notes", "config", "comparisons", main_key}
    for key, value in summary.items():
        if key not in shown:
            part = _section(key, value)
            parts.append(_folded(part) if part and _detail(key) else part)
    config = _config(run_dir, summary)
    parts.append(_folded(config) if config else "")
    title = html.escape(f"attnprune {command} — {run_dir.name}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
            f"<style>{_CSS}</style></head><body>{''.join(parts)}</body></html>\n")


def _runs_below(folder: Path) -> list[Path]:
    """Results folders directly inside ``folder`` (they hold a summary.json)."""
    return sorted(p for p in folder.iterdir() if p.is_dir() and (p / "summary.json").is_file())


def build(run_dir: str | Path) -> Path:
    """Write ``run_dir/report.html`` (one results folder) and return its path.

    A folder without ``summary.json`` whose subfolders are results folders gets one page per
    run and an ``index.html`` linking them (its path is returned)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"report: {run_dir} is not a folder")
    runs = [] if (run_dir / "summary.json").is_file() else _runs_below(run_dir)
    if not runs:
        return atomic_write_text(run_dir / "report.html", page(run_dir))
    items = []
    for r in runs:
        build(r)
        command = json.loads((r / "summary.json").read_text()).get("command", "")
        items.append(f'<li><a href="{html.escape(r.name)}/report.html">{html.escape(r.name)}</a>'
                     f" — {html.escape(str(command))}</li>")
    index = (f"<!doctype html><html><head><meta charset='utf-8'><title>attnprune runs in "
             f"{html.escape(run_dir.name)}</title><style>{_CSS}</style></head><body>"
             f"<h1>runs in {html.escape(run_dir.name)}</h1><ul>{''.join(items)}</ul></body></html>\n")
    return atomic_write_text(run_dir / "index.html", index)


def main(argv: list[str]) -> int:
    """``attnprune report DIR [DIR ...]``."""
    if not argv or "-h" in argv or "--help" in argv:
        from attnprune.runs.config import plain

        print("usage: attnprune report DIR [DIR ...]\n\n(Re)build DIR/report.html (or one page "
              "per run and DIR/index.html for a folder of runs). No options: only folders.\n")
        print(plain(__doc__))
        return 0 if argv else 2
    for d in argv:
        try:
            path = build(d)
        except ValueError as e:
            print(f"attnprune report: error: {e}", file=sys.stderr)
            return 2
        print(path)
    return 0
