"""report.html for a newcomer: a one-line verdict from the summary's own numbers, no spread
that two seeds cannot support ("50.41 ± 630.10"), and a page that fits its width."""

from __future__ import annotations

import copy
import json
import re

import pytest
from test_report import SUMMARIES, Page

from attnprune.runs.report import build, verdict


def comp(a, diff, lo, hi):
    return {"a": a, "b": "full", "metric": "accuracy", "diff": diff, "ci95": [lo, hi],
            "test": "mcnemar", "p": 0.5, "p_holm": 1.0, "margin": 0.01, "seeds": "pooled"}


def agg(per):
    m = sum(per) / len(per)
    return {"mean": m, "ci95": [m - 0.01, m + 0.01], "per_seed": per}


# A finetune / synthetic-like summary: two pruned methods against full, pooled comparisons.
HAND = {"command": "finetune", "methods": {
    "full": {"accuracy": agg([0.90, 0.91, 0.92]), "flops": {"relative": 1.0},
             "time": {"relative": 1.0}},
    "entropy": {"accuracy": agg([0.89, 0.90, 0.91]), "flops": {"relative": 0.6},
                "time": {"relative": 0.7}},
    "random": {"accuracy": agg([0.85, 0.86, 0.87]), "flops": {"relative": 0.4},
               "time": {"relative": 0.5}}},
    "comparisons": [comp("entropy", -0.004, -0.009, 0.001), comp("random", -0.05, -0.07, -0.03)]}


def line_of(folder) -> str:
    text = (folder / "report.html").read_text()
    m = re.search(r'<p class="verdict" id="verdict">(.*?)</p>', text)
    assert m, "no verdict line"
    assert text.index('id="verdict"') < text.index("<img") if "<img" in text else True
    return re.sub(r"<[^>]+>", "", m.group(1))


def write(tmp_path, name, summary):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps(summary))
    build(folder)
    return folder


def test_verdict_is_derived_from_the_summary(tmp_path):
    line = line_of(write(tmp_path, "a", HAND))
    # entropy is within the 1 pp margin (CI lower bound −0.9 pp); random is not
    assert "entropy is the pruned method at the lowest FLOPs within the 1 pp margin" in line
    assert "-0.40 [-0.90, +0.10] pp" in line and "0.6× the FLOPs" in line
    assert "0.7× the time" in line

    # change one number: random's Δ moves inside the margin, at lower FLOPs, and takes the line
    moved = copy.deepcopy(HAND)
    moved["comparisons"][1] = comp("random", -0.002, -0.008, 0.004)
    line2 = line_of(write(tmp_path, "b", moved))
    assert line2 != line
    assert line2.startswith("Verdict: random is") and "-0.20 [-0.80, +0.40] pp" in line2
    assert "0.4× the FLOPs" in line2

    # neither within the margin: the closest to full, said so
    none = copy.deepcopy(HAND)
    none["comparisons"][0] = comp("entropy", -0.02, -0.035, -0.011)
    line3 = line_of(write(tmp_path, "c", none))
    assert "entropy is the pruned method closest to full" in line3
    assert "no pruned method is within the 1 pp non-inferiority margin" in line3


def test_verdict_per_seed_comparisons_with_two_seeds_give_no_interval():
    s = copy.deepcopy(HAND)
    s["comparisons"] = [{**comp("entropy", d, d - 0.03, d + 0.03), "seed": k}
                        for k, d in enumerate((-0.01, 0.02))]
    line = verdict(s)
    assert "+0.50 pp (seeds -1.00, +2.00; n = 2, no interval)" in line
    assert "no claim of non-inferiority" in line


def test_pareto_verdict_names_the_point_and_the_bar():
    s = copy.deepcopy(SUMMARIES["pareto"])
    line = verdict(s)
    assert line.startswith("best pruned point attention_mass@0.5/L1: accuracy Δ vs full -0.12")
    assert "meets the bar: yes" in line and "fair time (batch 32)" in line
    s["points"]["attention_mass@0.5/L1"]["verdict"] = {"meets_bar": False, "enough_seeds": False}
    assert "meets the bar: no (enough seeds: no)" in verdict(s)


def test_verdict_falls_back_to_command_and_date(tmp_path):
    line = line_of(write(tmp_path, "lm", {"command": "passkey", "rows": [{"x": 1}]}))
    assert re.fullmatch(r"Verdict: passkey run of \d{4}-\d\d-\d\d \d\d:\d\d UTC; no comparison "
                        r"against the full model in this folder\.", line), line


PLUS_MINUS = re.compile(r"(-?\d+(?:\.\d+)?)\s*±\s*(\d+(?:\.\d+)?)")


def test_two_seeds_show_their_values_not_a_spread(tmp_path):
    """2 seeds: "50.41 ± 630.10" and [0.037, 1.118] are impossible to read honestly; the page
    shows the two values and n = 2, nothing wider than the metric's range."""
    two = {"command": "finetune", "methods": {
        "full": {"accuracy": {"mean": 0.5775, "ci95": [0.03749, 1.118], "per_seed": [0.535, 0.62]},
                 "time_s": {"mean": 50.41, "ci95": [-579.69, 680.51], "per_seed": [10.8, 90.02]}},
        "entropy": {"accuracy": {"mean": 0.55, "ci95": [-0.0853, 1.185], "per_seed": [0.6, 0.5]},
                    "time_s": {"mean": 30.0, "ci95": [-100.0, 160.0], "per_seed": [25.0, 35.0]}}}}
    text = " ".join(Page(build(write(tmp_path, "two", two)).read_text()).text)
    assert not PLUS_MINUS.search(text)
    for bad in ("630", "680.5", "-579", "1.118", "1.185", "-0.0853", "[-100"):
        assert bad not in text, bad
    assert "50.41 (10.8, 90.0; n = 2)" in text and "0.5500 (0.600, 0.500; n = 2)" in text
    assert "With 2 seeds" in text
    # 3 seeds keep mean [95 % CI]
    three = copy.deepcopy(two)
    three["methods"]["full"]["time_s"] = {"mean": 50.0, "ci95": [40.0, 60.0],
                                          "per_seed": [45.0, 50.0, 55.0]}
    text3 = " ".join(Page(build(write(tmp_path, "three", three)).read_text()).text)
    assert "50 [40, 60]" in text3


def test_synthetic_text_table_has_no_spread_from_two_seeds():
    from attnprune.research.synthetic.summary import format_ci

    two = {"mean": 0.5775, "ci95": [0.03749, 1.118], "per_seed": [0.62, 0.535]}
    assert format_ci(two) == "0.620/0.535" and "±" not in format_ci(two)
    assert format_ci({"mean": 0.5, "ci95": [0.45, 0.55], "per_seed": [0.45, 0.5, 0.55]}) == "0.500 ± 0.050"


def test_page_fits_the_width(tmp_path):
    wide = {"command": "reproduce synthetic", "methods": {
        m: {f"metric_{i}": agg([0.5, 0.6, 0.7]) for i in range(20)} for m in ("full", "entropy")}}
    html = build(write(tmp_path, "wide", wide)).read_text()
    css = html[html.index("<style>"):html.index("</style>")]
    assert re.search(r"body\{[^}]*max-width:1100px", css)
    assert re.search(r"table\{[^}]*max-width:100%", css)
    assert re.search(r"table\.wide\{width:100%;table-layout:auto;font-size:\.72em", css)
    assert re.search(r"figure img\{[^}]*width:100%", css)
    assert ".scroll{overflow-x:auto}" not in css  # no sideways scrolling
    page = Page(html)
    # 20 metrics × 2 methods: turned, one row per metric, methods as columns
    assert page.headers[0] == ["metric", "full", "entropy"]
    assert "metric_19" in page.text


def test_wide_comparison_tables_are_compact(tmp_path):
    folder = write(tmp_path, "cmp", SUMMARIES["synthetic"])
    html = (folder / "report.html").read_text()
    assert '<table class="wide"><tr><th class="l">a</th>' in html
    # per-seed repeats and the configuration are folded: one click away, not page height
    assert '<details><summary><h2 class="fold">comparisons per seed</h2></summary>' in html
    assert '<details><summary><h2 class="fold">configuration</h2></summary>' not in html  # none


@pytest.mark.parametrize("n,dots", [(2, True), (3, False)])
def test_synthetic_bar_figure_two_seeds_dots_else_clipped_bars(n, dots):
    import matplotlib.pyplot as plt

    from attnprune.research.synthetic.figures import _bar

    per = [0.55, 0.6, 0.65][:n]
    m = sum(per) / n
    summary = {"methods": {lab: {"accuracy": {"mean": m, "ci95": [m - 0.9, m + 0.9],
                                              "per_seed": per}} for lab in ("full", "entropy")}}
    fig = _bar(summary, ["full", "entropy"], "accuracy", "accuracy", "acc (95 % CI over seeds)")
    ax = fig.axes[0]
    lo, hi = ax.get_ylim()
    assert 0.0 <= lo and hi <= 1.0
    texts = [t.get_text() for t in ax.texts]
    if dots:
        assert "n = 2 seeds" in ax.get_title() and not ax.collections
    else:
        assert "error bars clipped to the axis" in texts
        segs = [s for c in ax.collections for s in c.get_segments()]
        assert segs and all(lo - 1e-9 <= y <= hi + 1e-9 for s in segs for _, y in s)
    plt.close(fig)


def test_headers_wrap_at_words_not_letter_by_letter(tmp_path):
    """overflow-wrap: anywhere (or word-break: break-all) lets an automatic-layout column
    shrink to one letter, and the headers wrapped a letter a line; break-word breaks inside a
    word only when the word alone is wider than its column."""
    html = build(write(tmp_path, "hdr", SUMMARIES["synthetic"])).read_text()
    css = html[html.index("<style>"):html.index("</style>")]
    assert "anywhere" not in css and "break-all" not in css
    assert re.search(r"th,td\{[^}]*overflow-wrap:break-word", css)
