"""report.html: structure (figures first, tables, comparisons), number formatting, one page per
run, every command's summary shape, a real finetune folder, and a browser screenshot."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest
from test_finetune import args as finetune_args
from test_finetune import one_thread, tiny  # noqa: F401 (fixtures)

from attnprune.cli import main as cli_main
from attnprune.runs.report import build, fmt
from attnprune.runs.results import ResultsDir

LONG = 0.12345678901234567  # a 17-digit float, as json.dumps writes them


class Page(HTMLParser):
    """Text (outside <style>), tables with their header cells, images, in document order."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.order: list[str] = []  # "img" / "table" in document order
        self.text: list[str] = []
        self.headers: list[list[str]] = []  # per table: its <th> texts
        self.images: list[str] = []
        self._in: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self._in.append(tag)
        if tag == "table":
            self.order.append("table")
            self.headers.append([])
        if tag == "img":
            self.order.append("img")
            self.images.append(dict(attrs).get("src", ""))

    def handle_endtag(self, tag):
        while self._in and self._in.pop() != tag:
            pass

    def handle_data(self, data):
        if "style" in self._in:
            return
        self.text.append(data)
        if "th" in self._in and self.headers:
            self.headers[-1].append(data.strip())


def long_numbers(text: str) -> list[str]:
    """Decimal numbers with more than 6 significant digits."""
    out = []
    for n in re.findall(r"\d*\.\d+(?:e[+-]?\d+)?", text):
        digits = re.sub(r"e.*", "", n).replace(".", "").lstrip("0")
        if len(digits) > 6:
            out.append(n)
    return out


def figure(path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1], [LONG, 1])
    fig.savefig(path)
    plt.close(fig)


def ci(mean):
    return {"mean": mean, "ci95": [mean - LONG / 10, mean + LONG / 10], "per_seed": [mean] * 3}


COMP = {"a": "entropy", "b": "full", "metric": "accuracy", "diff": -LONG / 100,
        "ci95": [-LONG / 10, LONG / 50], "test": "mcnemar", "p": 0.0123456789,
        "p_holm": 0.0246913578, "effect": {"cohens_h": -LONG, "delta": -LONG / 100},
        "noninferior": False, "seed": 0}

# One summary shape per command (keys as finetune.py, lm.py, pareto.py, synthetic/run.py and
# experiments/attention_sweeps.py write them).
SUMMARIES = {
    "finetune": {"command": "finetune", "env": {"torch": "2.13.0", "threads": 1},
                 "config": {"lr": 1e-3}, "comparisons": [COMP],
                 "methods": {"full": {"accuracy": ci(0.9), "kept_ratio": 1.0,
                                      "flops": {"measured": 1835040.0, "relative": 1.0}},
                             "entropy": {"accuracy": ci(0.85 + LONG / 1000), "kept_ratio": LONG,
                                         "flops": {"measured": 1234567.0, "relative": LONG},
                                         "time": {"median_s": 0.000988319000043702,
                                                  "mad_s": 0.0, "relative": 0.7 + LONG / 1e4}}}},
    "lm": {"command": "lm", "env": {}, "data": "char:shakespeare", "n_parameters": 40068,
           "methods": {"ltp": {"perplexity": 20.674811436991387, "kept_per_layer": [1.0, LONG, LONG],
                               "flops": {"per_layer_full": [7340032, 7340032]}},
                       "baseline": {"perplexity": 21.936563103594683}},
           "comparisons": [{**COMP, "metric": "val_loss", "effect": {"perplexity_ratio": LONG}}],
           "length_sweep": [{"length": 64, "time_relative": LONG}, {"length": 128, "time_relative": 1 - LONG}]},
    "pareto": {"command": "pareto", "env": {},
               "points": {"full": {"family": "full", "int8": False, "accuracy": ci(0.8),
                                   "time": {"32": {"fair": 1.0, "padded": 1.0}}},
                          "attention_mass@0.5/L1": {
                              "family": "attention_mass", "int8": False, "accuracy": ci(0.78),
                              "time": {"32": {"fair": LONG, "padded": 2 * LONG}},
                              "vs_full": {k: v for k, v in COMP.items() if k != "metric"},
                              "verdict": {"meets_bar": True, "layer_drop_points_at_le_latency": ["layers=1"]}}},
               "comparisons": [{**{k: v for k, v in COMP.items() if k != "metric"}, "against": "full"}],
               "composition": [{"point": "layers=1", "speedup_method": 1 / LONG, "both_faster_than_each": True}],
               "timing": {"threads": 2, "env": {"torch": "2.13.0"}}},
    "synthetic": {"command": "reproduce synthetic", "env": {},
                  "methods": {"full": {"accuracy": ci(0.7), "ece": LONG}},
                  "comparisons": [COMP], "comparisons_per_seed": [COMP, {**COMP, "seed": 1}],
                  "ablations": {"note": "ablations use seeds [42]",
                                "keep_ratio": [{"method": "entropy", "keep_ratio": 0.3, "accuracy": LONG}]},
                  "reliability": {"full": {"classifier": {"confidence": [float("nan")] * 9 + [LONG],
                                                          "count": [0] * 9 + [160]}}},
                  "train_seconds": 9.86312345678},
    "attention": {"command": "attention sweep crisp", "env": {},
                  "notes": {"dense": "s = 0 is this run", "flops": "dense kernels"},
                  "methods": {"dense": {"sparsity": 0.0, "accuracy": ci(0.9), "gini": LONG}},
                  "comparisons": [COMP]},
}


@pytest.fixture
def folders(tmp_path):
    out = {}
    for name, summary in SUMMARIES.items():
        rd = ResultsDir(tmp_path / name)
        rd.write_json("summary.json", summary)
        figure(rd.path / "curve.png")
        out[name] = rd.path
    return out


@pytest.mark.parametrize("name", list(SUMMARIES))
def test_every_command_summary_reads_as_tables(folders, name):
    html = build(folders[name]).read_text()
    page = Page(html)
    text = " ".join(page.text)
    assert not long_numbers(text), long_numbers(text)[:5]
    assert "<pre" not in html  # no raw JSON dumps
    assert len(page.images) == 1 and page.images[0].startswith("data:image/png;base64,")
    assert base64.b64decode(page.images[0].split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    assert page.order[0] == "img" and "table" in page.order  # figures first, then tables
    comp = [h for h in page.headers if h[:2] == ["a", "b"]]
    assert comp, "comparisons table"
    want = ["a", "b", "diff (a − b)", "95 % CI", "test", "p", "p (Holm)"]
    assert [h for h in comp[0] if h in want] == want
    if name != "pareto":
        assert comp[0][2] == "metric"


def test_numbers_are_rounded_and_comparisons_are_cells(folders):
    page = Page(build(folders["finetune"]).read_text())
    cells = page.text
    assert "0.1235" in cells  # kept_ratio, 4 significant digits
    assert "0.9000 [0.8877, 0.9123]" in cells  # mean [95 % CI]
    assert "1.835 M" in cells  # FLOP count
    assert "9.883e-04" in cells  # small value in scientific notation
    assert "0.0123" in cells and "0.0247" in cells  # p and p (Holm), 3 significant digits
    assert "[-0.01235, 0.002469]" in cells
    assert "entropy" in cells and "mcnemar" in cells


@pytest.mark.parametrize("x,text", [(None, "–"), (True, "yes"), (0.5, "0.5000"), (0.0, "0"),
                                    (1234.5678, "1235"), (12, "12"), (3.0, "3"),
                                    (2.5e-5, "2.500e-05"), (91_800_000_000, "91.80 G"),
                                    (float("nan"), "nan"), ("x<y", "x<y")])
def test_fmt(x, text):
    assert fmt(x) == text


def test_folder_of_runs_gets_one_page_each_and_an_index(folders, tmp_path, capsys):
    assert cli_main(["report", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip().endswith("index.html")
    index = (tmp_path / "index.html").read_text()
    for name, path in folders.items():
        assert (path / "report.html").is_file()
        assert f'href="{name}/report.html"' in index
    assert cli_main(["report", str(tmp_path / "missing")]) == 2


@pytest.fixture(scope="module")
def finetune_run(tiny, tmp_path_factory):  # noqa: F811
    """A real results folder: a tiny full model, then attention-mass pruning started from it."""
    import torch

    from attnprune.research.finetune import main

    threads = torch.get_num_threads()
    root = tmp_path_factory.mktemp("ft")
    assert main(finetune_args(tiny, root / "full", "--method", "full", "--epochs", "1")) == 0
    assert main(finetune_args(tiny, root / "pruned", "--method", "attention_mass",
                              "--keep-ratio", "0.5", "--init-from", str(root / "full"),
                              "--epochs", "1")) == 0
    torch.set_num_threads(threads)
    return root / "pruned"


def test_report_of_a_real_finetune_folder(finetune_run, capsys):
    assert cli_main(["report", str(finetune_run)]) == 0
    page = Page((finetune_run / "report.html").read_text())
    text = " ".join(page.text)
    assert not long_numbers(text)
    assert page.order[0] == "img" and len(page.images) == len(list(finetune_run.glob("*.png"))) >= 1
    summary = json.loads((finetune_run / "summary.json").read_text())
    assert summary["comparisons"]
    for label in summary["methods"]:
        assert label in page.text
    assert any(h[:3] == ["a", "b", "metric"] for h in page.headers)


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium is not installed")
def test_screenshot_in_a_browser(finetune_run, tmp_path):
    """The page renders in a real browser: a tall, non-blank screenshot."""
    from PIL import Image

    build(finetune_run)
    shot = tmp_path / "shot.png"
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--screenshot={shot}", "--window-size=1280,1600",
                    (finetune_run / "report.html").as_uri()],
                   check=True, capture_output=True, timeout=120)
    img = Image.open(shot).convert("L")
    assert img.size == (1280, 1600)
    top, tables = img.crop((0, 0, 1280, 500)), img.crop((0, 500, 1280, 1100))
    for part in (top, tables):  # figure at the top, tables below: both have ink
        lo, hi = part.getextrema()
        assert hi - lo > 100 and sum(1 for p in part.getdata() if p < 128) > 1000


def test_accuracy_intervals_stay_inside_their_range(tmp_path):
    """2 seeds (the --quick runs): a t-interval on 1 df left [0, 1] ("0.5775 [0.03749, 1.118]");
    the summary's interval is cut to the range, and the page cuts intervals of older folders."""
    from attnprune.runs import stats
    t = stats.aggregate_seeds([0.535, 0.62])  # no range: the t-interval as it was
    assert t["ci95"][1] > 1
    cut = stats.aggregate_seeds([0.535, 0.62], bounds=(0.0, 1.0))
    assert cut["ci95"] == [pytest.approx(t["ci95"][0]), 1.0] and cut["mean"] == t["mean"]
    folder = tmp_path / "quick"
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps({"command": "reproduce synthetic", "methods": {
        "full": {"accuracy": {"mean": 0.5775, "ci95": [0.03749, 1.118], "per_seed": [0.535, 0.62]},
                 "mcc": {"mean": 0.2, "ci95": [-1.6, 2.0]},
                 "val_loss": {"mean": 0.5, "ci95": [-0.2, 1.2]},  # not bounded: shown as is
                 "test_accuracy": {"mean": 57.75, "ci95": [3.749, 111.8]}}}}))  # a percent
    cells = Page(build(folder).read_text()).text
    # 2 seeds: the two values, no interval; no per-seed values: the interval, cut
    assert "0.5775 (0.535, 0.620; n = 2)" in cells and "1.118" not in " ".join(cells)
    assert "0.2000 [-1, 1]" in cells
    assert "0.5000 [-0.2000, 1.200]" in cells
    assert "57.75 [3.749, 100]" in cells
