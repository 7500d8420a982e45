"""Check that the README and the docs pages can be trusted as written (issue 23 item 9, issue 26).

    python scripts/check_docs.py [--root DIR]

Walks ``README.md`` and ``docs/*.md`` and reports, one line each, with file and line:

1. **Tables name their source.** The paragraph just above every Markdown table starts with
   ``**Source** (`id`):`` and says one of:
   - a results folder ``docs/results/<name>`` that exists in the repo (not empty), and the
     command that wrote it (an inline-code ``attnprune …`` / ``python …`` / ``make …``);
   - ``checked by `tests/<file>.py``` (every cell is asserted by that committed test);
   - ``not committed``: the run's files are gone; the caption gives the command that
     reproduces it, and ``id`` must be listed in ``KNOWN_EXCEPTIONS`` below with the reason;
   - ``not a measurement`` (a list of commands, options or facts, no measured number);
   - ``summary of the linked pages``: every row links to a docs page holding its source.
2. **Links resolve.** Every relative link and image exists (``#anchors`` into Markdown files
   are checked against their headings, as GitHub writes them). ``PENDING_PAGES`` lists pages
   that other work is writing; a link to one of them is reported as pending until it exists.
3. **Quoted commands parse.** Every ``attnprune <command> --opt value …`` in a code block or
   inline code names a real command (``attnprune.cli.COMMANDS``) and only options that
   command's parser accepts (its config dataclass, i.e. what ``attnprune <command> --help``
   lists; ``compare`` uses argparse), with values of the right type and ``--config`` files
   that exist. Placeholders (``DIR``, ``<run>``, ``…``) are not type-checked. ``python -m
   attnprune.X`` and ``python scripts/X.py`` must exist and know each ``--opt`` they are given.

Exit status 0 when nothing is wrong; the problems are printed otherwise.
``tests/test_docs.py`` runs this in CI.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import importlib.util
import io
import re
import shlex
import sys
import typing
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Tables whose source is gone: written to the gitignored ``results/`` (or only printed) on machines
# that were reset, and not re-run because the rerun is long or, for timings, would measure other
# ratios on a loaded machine. Each caption says "not committed" and gives the command that
# reproduces it. Nothing else is skipped: a table not listed here must name a docs/results/
# folder, a test, or say that it holds no measurement.
_GONE = "results folder not committed (results/ is gitignored) and not on this machine"
_TIMING = "a rerun on the shared machine measures other time ratios"
KNOWN_EXCEPTIONS: dict[str, str] = {
    "pareto-long": f"{_GONE}: results/pareto_cpu; rerun: hours of training (23 points, 2-3 seeds)",
    "pareto-long-compose": f"{_GONE}: results/pareto_cpu (the same run)",
    "pareto-tweets": f"{_GONE}: results/pareto_tweets_cpu; rerun: hours of training",
    "pareto-tweets-compose": f"{_GONE}: results/pareto_tweets_cpu (the same run)",
    "encoder-speed": f"{_GONE}: bench encoder output; {_TIMING}",
    "encoder-tweets": f"{_GONE}: runs/full, runs/cand; rerun: fine-tunes on 15,831 tweets",
    "encoder-tweets-no-retrain": f"{_GONE}: needs the full model of encoder-tweets",
    "encoder-tweets-short-finetunes": f"{_GONE}: needs the full model of encoder-tweets",
    "encoder-ltp-bucketing": f"{_GONE}: a one-off re-measurement of the LTP models, not kept",
    "attention-speed": f"{_GONE}: bench attention output; {_TIMING}",
    "flex": f"{_GONE}: bench flex output (session 8); {_TIMING}",
    "sparse-ffn": f"{_GONE}: results/bench_sparse_ffn; {_TIMING}",
    "table3-l1": f"{_GONE}: the table3_cost_cpu sweep; rerun: 8 fine-tunes",
    "table3-group": f"{_GONE}: results/table3_group; rerun: 18 fine-tunes",
    "table4": f"{_GONE}: results/table4; rerun: 12 fine-tunes",
    "budget": f"{_GONE}: results/budget; rerun: 3 fine-tunes on 2,548 passages",
    "budget-gini": f"{_GONE}: results/budget (the same run)",
    "cost-vs-shallow": f"{_GONE}: finetune --layers / --int8 runs, latency from a one-off script",
    "gpt2-ltp": f"{_GONE}: the GPT-2 lm runs; rerun: 1500-step fine-tunes",
    "gpt2-dtr-sweep": f"{_GONE}: the lm --sweep keep_target folder",
    "gpt2-dtr-distilled": f"{_GONE}: the lm sweep of session 7; rerun: 3 × 1800 steps",
    "gpt2-hybrid": f"{_GONE}: the lm sweep of session 7",
    "gpt2-int8": f"{_GONE}: printed by scripts/lm_vs_shallow.py; needs the sweeps above",
    "lm-length": f"{_GONE}: bench lm --lengths folders, 3 seeds × 3 methods",
    "llama-ltp": f"{_GONE}: the lm --arch llama sweep of session 7",
    "llama-int8": f"{_GONE}: printed by scripts/lm_vs_shallow.py; needs the sweep",
    "llama-ltp-steps": f"{_GONE}: the seed-0 LTP recipe runs of sessions 4-6",
    "llama-ltp-session6": f"{_GONE}: session 6's machine was reset",
    "llama-ltp-session7": f"{_GONE}: the lm --arch llama sweep of session 7",
    "gpu-before": "measured on the lent H100 by the session that filed the GPU issue (the old "
                  "code); the GPU machine is lent to some sessions only",
    "intensity": f"{_GONE}: results/intensity_cpu; rerun: 15 runs of about 6 min",
    "onnx-speed": f"{_GONE}: printed by scripts/bench_onnx.py; {_TIMING}",
    "batch1": f"{_GONE}: printed by scripts/bench_batch1.py; {_TIMING}",
}

# Pages another piece of work is writing now: a link to one of them is reported as pending
# (not as broken) until the page exists; then it is checked like every other link.
PENDING_PAGES: dict[str, str] = {
    "docs/gpu.md": "GPU latency of pruned models: being written by the lead (being fixed)",
    "docs/prefill.md": "causal-LM prefill: being written by another engineer",
}

CAPTION = re.compile(r"^\*\*Source\*\* \(`([A-Za-z0-9_.-]+)`\):(.*)$")
TABLE_SEP = re.compile(r"^\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"`([^`]+)`")
COMMAND_START = ("attnprune ", "python", "make ", "PYTHONPATH=", "HF_HUB_OFFLINE=", "nice ",
                 "accelerate ", "torchrun ", "bash ")
WRAPPERS = {"nice", "time", "env", "-n"}  # words that may come before the command itself
OPT = re.compile(r"^--[a-z][a-z0-9_-]*$")
PLACEHOLDER_WORD = re.compile(r"^[A-Z][A-Z0-9]*$")


@dataclasses.dataclass
class Problem:
    path: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.text}"


@dataclasses.dataclass
class Table:
    path: Path
    line: int  # 1-based line of the header row
    rows: list[str]
    caption_id: str | None
    caption: str


# ---------------------------------------------------------------------------------------------
# Markdown structure
# ---------------------------------------------------------------------------------------------
def doc_files(root: Path) -> list[Path]:
    """README.md and every docs/*.md page (the results folders' own READMEs are data)."""
    files = [root / "README.md"] if (root / "README.md").is_file() else []
    return files + sorted((root / "docs").glob("*.md"))


def _fenced(lines: list[str]) -> list[bool]:
    """True for the lines inside (or opening / closing) a ``` fence."""
    out, inside = [], False
    for ln in lines:
        if ln.lstrip().startswith("```"):
            out.append(True)
            inside = not inside
        else:
            out.append(inside)
    return out


def tables(path: Path) -> list[Table]:
    """Every Markdown table of ``path`` (outside code fences) with its caption paragraph."""
    lines = path.read_text(encoding="utf-8").splitlines()
    fenced = _fenced(lines)
    found: list[Table] = []
    i = 0
    while i < len(lines) - 1:
        head = lines[i].strip()
        if (not fenced[i] and head.startswith("|") and TABLE_SEP.match(lines[i + 1].strip())):
            j = i + 2
            while j < len(lines) and lines[j].strip().startswith("|"):
                j += 1
            # the paragraph just above: skip blank lines, then read up to the previous blank
            k = i - 1
            while k >= 0 and not lines[k].strip():
                k -= 1
            end = k
            while k >= 0 and lines[k].strip() and not lines[k].lstrip().startswith(("#", "|")):
                k -= 1
            para = " ".join(s.strip() for s in lines[k + 1:end + 1])
            m = CAPTION.match(para)
            found.append(Table(path, i + 1, [s.strip() for s in lines[i:j]],
                               m.group(1) if m else None, m.group(2).strip() if m else para))
            i = j
        else:
            i += 1
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces → hyphens."""
    text = re.sub(r"`|\*\*|\*|_(?=\W)|(?<=\W)_", "", heading.strip()).lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    keep = "".join(ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in "LNM")
    return keep.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    fenced = _fenced(lines)
    seen: dict[str, int] = {}
    out = set()
    for ln, f in zip(lines, fenced):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", ln)
        if m and not f:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


# ---------------------------------------------------------------------------------------------
# 1. tables
# ---------------------------------------------------------------------------------------------
def _has_command(text: str) -> bool:
    return any(span.strip().startswith(COMMAND_START) for span in CODE_SPAN.findall(text))


def check_tables(root: Path, files: list[Path], known: dict[str, str]) -> tuple[list[Problem], list[str]]:
    problems: list[Problem] = []
    used: dict[str, str] = {}
    exceptions_used: list[str] = []
    for path in files:
        rel = str(path.relative_to(root))
        for t in tables(path):
            where = (rel, t.line)
            if t.caption_id is None:
                problems.append(Problem(*where, "table without a source caption: put just above "
                                        "it a paragraph '**Source** (`id`): ' + one of: the "
                                        "docs/results/<folder> and the `command` that wrote it; "
                                        "'not committed; reproduce with `command`' (and id in "
                                        "KNOWN_EXCEPTIONS); 'checked by `tests/<file>.py`'; "
                                        "'not a measurement'"))
                continue
            if t.caption_id in used:
                problems.append(Problem(*where, f"table id {t.caption_id!r} is used twice "
                                        f"(also {used[t.caption_id]})"))
            used[t.caption_id] = f"{rel}:{t.line}"
            cap = t.caption
            folders = sorted(set(re.findall(r"docs/results/([A-Za-z0-9_.-]+)", cap)))
            if "not a measurement" in cap:
                continue
            if "summary of the linked pages" in cap:
                for row in t.rows[2:]:
                    if not re.search(r"\]\([^)]*\.md[^)]*\)", row):
                        problems.append(Problem(*where, f"summary table {t.caption_id!r}: a row "
                                                f"without a link to its page: {row[:60]}"))
                continue
            if "not committed" in cap:
                if t.caption_id not in known:
                    problems.append(Problem(*where, f"table {t.caption_id!r} says its source is "
                                            "not committed but is not in KNOWN_EXCEPTIONS"))
                else:
                    exceptions_used.append(t.caption_id)
                if not _has_command(cap):
                    problems.append(Problem(*where, f"table {t.caption_id!r}: the caption must "
                                            "give the command that reproduces it"))
                continue
            tests = re.findall(r"checked by `(tests/[^`]+\.py)", cap)
            if tests:
                for tf in tests:
                    if not (root / tf).is_file():
                        problems.append(Problem(*where, f"table {t.caption_id!r}: {tf} does not "
                                                "exist"))
                continue
            if not folders:
                problems.append(Problem(*where, f"table {t.caption_id!r}: the caption names no "
                                        "docs/results/<folder>, test, or known exception"))
                continue
            for name in folders:
                d = root / "docs" / "results" / name
                if not d.is_dir() or not any(d.iterdir()):
                    problems.append(Problem(*where, f"table {t.caption_id!r}: results folder "
                                            f"docs/results/{name} is missing or empty"))
            if not _has_command(cap):
                problems.append(Problem(*where, f"table {t.caption_id!r}: the caption names no "
                                        "command (inline code: attnprune …, python …)"))
    for tid in sorted(set(known) - set(exceptions_used)):
        problems.append(Problem("scripts/check_docs.py", 0, f"KNOWN_EXCEPTIONS lists {tid!r}, "
                                "which no table uses: remove it"))
    return problems, exceptions_used


# ---------------------------------------------------------------------------------------------
# 2. links
# ---------------------------------------------------------------------------------------------
def check_links(root: Path, files: list[Path]) -> tuple[list[Problem], list[str]]:
    problems: list[Problem] = []
    pending: list[str] = []
    cache: dict[Path, set[str]] = {}
    for path in files:
        rel = str(path.relative_to(root))
        lines = path.read_text(encoding="utf-8").splitlines()
        fenced = _fenced(lines)
        for n, (ln, f) in enumerate(zip(lines, fenced), 1):
            if f:
                continue
            for target in LINK.findall(CODE_SPAN.sub("", ln)):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                    continue
                file_part, _, anchor = target.partition("#")
                dest = path if not file_part else (path.parent / file_part).resolve()
                try:
                    dest_rel = str(dest.relative_to(root.resolve()))
                except ValueError:
                    dest_rel = str(dest)
                if not dest.exists():
                    if dest_rel in PENDING_PAGES:
                        pending.append(f"{rel}:{n}: {dest_rel} ({PENDING_PAGES[dest_rel]})")
                    else:
                        problems.append(Problem(rel, n, f"broken link: {target}"))
                    continue
                if anchor and dest.suffix == ".md" and dest.is_file():
                    if dest not in cache:
                        cache[dest] = anchors(dest)
                    if anchor not in cache[dest]:
                        problems.append(Problem(rel, n, f"no heading for anchor #{anchor} in "
                                                f"{dest_rel}"))
    return problems, list(dict.fromkeys(pending))


# ---------------------------------------------------------------------------------------------
# 3. commands
# ---------------------------------------------------------------------------------------------
# command words → the config dataclass its parser fills (``parse_command_line`` / ``load_config``
# rejects any other key), plus the options the command reads itself.
CONFIGS: dict[tuple[str, ...], tuple[str, set[str]]] = {
    ("reproduce", "synthetic"): ("attnprune.research.synthetic.config:SyntheticConfig", {"quick"}),
    ("reproduce", "attention"): ("attnprune.research.experiments.attention_sweeps:SweepConfig", set()),
    ("reproduce", "budget"): ("attnprune.research.experiments.token_budget:BudgetConfig", set()),
    ("reproduce", "intensity"): ("attnprune.research.experiments.intensity_runs:IntensityRunsConfig", set()),
    ("finetune",): ("attnprune.research.finetune:FinetuneConfig", set()),
    ("pareto",): ("attnprune.research.pareto:ParetoConfig", set()),
    ("lm",): ("attnprune.research.lm:LMConfig", set()),
    ("bench", "encoder"): ("attnprune.bench.encoder:BenchEncoderConfig", set()),
    ("bench", "attention"): ("attnprune.bench.attention:BenchAttentionConfig", set()),
    ("bench", "lm"): ("attnprune.bench.lm:BenchLMConfig", set()),
    ("bench", "flex"): ("attnprune.bench.flex:BenchFlexConfig", set()),
    ("bench", "sparse-ffn"): ("attnprune.bench.sparse_ffn:BenchConfig", set()),
}
COMMON = {"config", "out", "exact_out", "help"}  # read by parse_command_line itself
POSITIONAL_ONLY = {("report",), ("methods",)}


def _load(spec: str):
    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)


def _config_of(words: tuple[str, ...]) -> tuple[str, set[str]] | None:
    """``module:ConfigClass`` of a CLI command whose module parses with ``parse_command_line``."""
    from attnprune.cli import COMMANDS

    module = COMMANDS[words][0].split(":")[0]
    found = importlib.util.find_spec(module)
    if found is None or found.origin is None:
        return None
    m = re.search(r"(?:parse_command_line|run_command)\(\s*argv\s*,\s*(\w+)",
                  Path(found.origin).read_text(encoding="utf-8"))
    return (f"{module}:{m.group(1)}", set()) if m else None


def _argparse_options(words: tuple[str, ...]) -> set[str]:
    """Options of a command that parses with argparse: what its own ``--help`` prints."""
    from attnprune.cli import COMMANDS

    module, func = COMMANDS[words][0].split(":")
    fn = getattr(importlib.import_module(module), func)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.suppress(SystemExit):
        fn(["--help"])
    return {o[2:].replace("-", "_") for o in re.findall(r"--[a-z][a-z0-9-]*", buf.getvalue())}


def is_placeholder(value: str) -> bool:
    """``DIR``, ``runs/full/<run folder>``, ``B/NAME-sN``, ``…``: not a real value."""
    if any(s in value for s in ("<", ">", "…", "...", "{seed}")):
        return True
    parts = re.split(r"[/=,:]", value)
    return any(PLACEHOLDER_WORD.match(p.split("-")[0] or "-") for p in parts if p)


def _is_str_field(tp) -> bool:
    args = typing.get_args(tp)
    return tp in (str, Path) or (bool(args) and all(a in (str, Path, type(None)) for a in args))


def command_lines(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every command candidate: code-block lines (``\\`` continuations
    joined, ``$`` prompts and comments dropped) and inline code spans."""
    lines = path.read_text(encoding="utf-8").splitlines()
    fenced = _fenced(lines)
    out: list[tuple[int, str]] = []
    i = 0
    para: list[tuple[int, str]] = []

    def flush():
        if para:
            text = " ".join(s for _, s in para)
            for m in CODE_SPAN.finditer(text):
                out.append((para[0][0], m.group(1).replace("\\|", "|")))
            para.clear()

    while i < len(lines):
        ln = lines[i]
        code = fenced[i] and not ln.lstrip().startswith("```")
        indented = (not fenced[i] and ln.startswith("    ") and not ln.lstrip().startswith(("-", "*", "|"))
                    and (i == 0 or not lines[i - 1].strip() or lines[i - 1].startswith("    ")))
        if code or indented:
            flush()
            start, text = i + 1, ln.strip()
            while text.endswith("\\") and i + 1 < len(lines):
                i += 1
                text = text[:-1] + " " + lines[i].strip()
            text = re.sub(r"^\$\s+", "", text)
            if text and not text.startswith("#"):
                out.append((start, text.split(" # ")[0]))
        elif not ln.strip() or ln.lstrip().startswith("```"):
            flush()
        else:
            para.append((i + 1, ln.strip()))
        i += 1
    flush()
    return out


def _split_words(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


def _clean(tok: str) -> str:
    if tok == "[]":  # an empty list is a value (--layers [])
        return tok
    return tok.strip("[]") if tok not in ("[", "]") else ""


def check_command(root: Path, text: str, parsers: dict) -> list[str]:
    """Problems with one quoted command line (empty when it parses or is no command)."""
    from attnprune.cli import COMMANDS

    words = [w for w in (_clean(t) for t in _split_words(text)) if w]
    errors: list[str] = []
    for seg in _segments(words):
        errors += _check_segment(root, seg, COMMANDS, parsers)
    return errors


def _segments(words: list[str]) -> list[list[str]]:
    out, cur = [], []
    for w in words:
        if w in ("&&", ";", "||", "|"):
            out.append(cur)
            cur = []
        else:
            cur.append(w)
    return out + [cur]


def _check_segment(root: Path, words: list[str], commands: dict, parsers: dict) -> list[str]:
    if not words:
        return []
    # python -m attnprune.X … / python scripts/X.py …
    for i, w in enumerate(words[:-1]):
        if w.startswith("python") and words[i + 1] == "-m" and i + 2 < len(words):
            mod = words[i + 2]
            if mod == "attnprune":
                return _check_attnprune(root, words[i + 3:], commands, parsers)
            if mod.startswith("attnprune."):
                return _check_module(root, mod, words[i + 3:], commands, parsers)
            return []
        if w.startswith("python") and words[i + 1].endswith(".py"):
            return _check_script(root, words[i + 1], words[i + 2:])
    for i, w in enumerate(words):
        if w == "attnprune" and (i == 0 or words[i - 1] == "-m" or all(
                "=" in p or p in WRAPPERS or p.lstrip("-").isdigit() for p in words[:i])):
            return _check_attnprune(root, words[i + 1:], commands, parsers)
        if w != "attnprune" and i == 0:
            break
    return []


def _check_attnprune(root: Path, rest: list[str], commands: dict, parsers: dict) -> list[str]:
    if not rest or rest[0].startswith(("<", "-")):
        return []  # the generic usage line, or `attnprune --help`
    firsts = {w[0] for w in commands}
    if rest[0] not in firsts:
        return [f"unknown command: attnprune {rest[0]}"]
    errors = []
    for words in sorted(commands, key=len, reverse=True):
        n = len(words)
        head = rest[:n]
        if head[0] != words[0]:
            continue
        if n == 2:
            if len(head) < 2:
                continue
            alts = head[1].split("|")
            if words[1] not in alts:
                continue
            for alt in alts:
                key = (words[0], alt)
                if key not in commands:
                    errors.append(f"unknown command: attnprune {' '.join(key)}")
                else:
                    errors += _check_options(root, key, rest[n:], parsers)
            return errors
        return _check_options(root, words, rest[n:], parsers)
    return [f"unknown command: attnprune {' '.join(rest[:2])}"]


def _check_module(root: Path, mod: str, rest: list[str], commands: dict, parsers: dict) -> list[str]:
    for words, (target, _) in commands.items():
        if target.split(":")[0] == mod:
            return _check_options(root, words, rest, parsers)
    if importlib.util.find_spec(mod) is None:
        return [f"no module {mod}"]
    src = Path(importlib.util.find_spec(mod).origin).read_text(encoding="utf-8")
    m = re.search(r"(?:parse_command_line|run_command)\(\s*argv\s*,\s*(\w+)", src)
    if m:  # a command module not (yet) in the CLI table: its config dataclass is its parser
        return _check_options(root, ("-m", mod), rest, parsers, spec=(f"{mod}:{m.group(1)}", set()))
    return [f"{mod} does not know {o}" for o in _opts(rest) if f'"{o}"' not in src]


def _check_script(root: Path, script: str, rest: list[str]) -> list[str]:
    path = root / script
    if not path.is_file():
        return [f"no script {script}"]
    src = path.read_text(encoding="utf-8")
    return [f"{script} does not know {o}" for o in _opts(rest) if f'"{o}"' not in src]


def _opts(rest: list[str]) -> list[str]:
    return [w.split("=")[0] for w in rest if OPT.match(w.split("=")[0])]


def _pairs(rest: list[str]) -> list[tuple[str, str | bool]]:
    """``--key value`` / ``--key=value`` / ``--flag`` pairs, positionals and ``…`` dropped."""
    out, i = [], 0
    while i < len(rest):
        w = rest[i]
        key = w.split("=", 1)[0]
        if not OPT.match(key):
            i += 1
            continue
        if "=" in w:
            out.append((key[2:].replace("-", "_"), w.split("=", 1)[1]))
            i += 1
        elif i + 1 < len(rest) and not rest[i + 1].startswith("--"):
            out.append((key[2:].replace("-", "_"), rest[i + 1]))
            i += 2
        else:
            out.append((key[2:].replace("-", "_"), True))
            i += 1
    return out


def _check_options(root: Path, words: tuple[str, ...], rest: list[str], parsers: dict,
                   spec: tuple[str, set[str]] | None = None) -> list[str]:
    from attnprune.runs.config import ConfigError, load_config, read_yaml

    name = ("python " if words[0] == "-m" else "attnprune ") + " ".join(words)
    pairs = _pairs(rest)
    if words in POSITIONAL_ONLY:
        return [f"{name}: takes no option --{k}" for k, _ in pairs if k != "help"]
    if spec is None and words not in CONFIGS:
        spec = _config_of(words)  # a command added to the CLI table since CONFIGS was written
    if spec is None and words not in CONFIGS:  # argparse commands (compare): what --help lists
        if words not in parsers:
            parsers[words] = _argparse_options(words)
        return [f"{name}: unknown option --{k.replace('_', '-')}" for k, _ in pairs
                if k not in parsers[words] | {"help"}]
    spec, extra = spec or CONFIGS[words]
    if spec not in parsers:
        parsers[spec] = _load(spec)
    cls = parsers[spec]
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    errors = [f"{name}: unknown option --{k.replace('_', '-')} (its --help lists the options)"
              for k, _ in pairs if k not in fields | COMMON | extra]
    if errors:
        return errors
    values: dict = {}
    if words == ("lm",):
        from attnprune.research.lm import PRESETS

        preset = next((v for k, v in pairs if k == "preset"), "cpu-small")
        values.update(PRESETS.get(preset, {}) if isinstance(preset, str) else {})
    cfg_file = next((v for k, v in pairs if k == "config"), None)
    if isinstance(cfg_file, str) and not is_placeholder(cfg_file):
        if not (root / cfg_file).is_file():
            return [f"{name}: --config {cfg_file} does not exist"]
        values.update(read_yaml(root / cfg_file))
    from attnprune.runs.config import coerce_value

    alternatives, errors = [], []
    for k, v in pairs:
        if k in COMMON or k in extra:
            continue
        alts = v.split("|") if isinstance(v, str) and "|" in v and v[:1] not in "{[" else [v]
        for a in alts:
            if isinstance(a, str) and is_placeholder(a):
                continue
            try:
                coerce_value(k, hints[k], a)  # the option's type, as the parser converts it
            except ConfigError as e:
                errors.append(f"{name}: {e}")
        if len(alts) > 1:
            alternatives.append((k, alts))
        elif not (isinstance(v, str) and is_placeholder(v)) or _is_str_field(hints[k]):
            values[k] = v  # a placeholder path still says the option was given
    if errors:
        return errors
    # then the config's own checks (ranges, method names), on the concrete values given; an
    # example path that does not exist here (``--data csv:nli.csv``) is not an error of the docs
    try:
        load_config(cls, None, values)
        for k, alts in alternatives:
            for a in alts:
                if not is_placeholder(a):
                    load_config(cls, None, {**values, k: a})
    except ConfigError as e:
        msg = str(e)
        field = msg.split(":", 1)[0].strip()
        if field in values and not is_placeholder(str(values[field])) and not re.search(r"not found|does not exist|no such|no model\."
                                             r"safetensors|give the results folder", msg):
            return [f"{name}: {msg}"]
    return []


def check_commands(root: Path, files: list[Path]) -> list[Problem]:
    problems: list[Problem] = []
    parsers: dict = {}
    for path in files:
        rel = str(path.relative_to(root))
        for n, text in command_lines(path):
            for err in check_command(root, text, parsers):
                problems.append(Problem(rel, n, f"{err}  [{text[:90]}]"))
    return problems


def check(root: Path = ROOT, verbose: bool = False,
          known: dict[str, str] | None = None) -> list[Problem]:
    """Every problem of the docs under ``root`` (empty: all good); ``known``: the tables whose
    source is not committed (default ``KNOWN_EXCEPTIONS``)."""
    root = Path(root)
    known = KNOWN_EXCEPTIONS if known is None else known
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    files = doc_files(root)
    p_tables, exceptions = check_tables(root, files, known)
    p_links, pending = check_links(root, files)
    problems = p_tables + p_links + check_commands(root, files)
    if verbose:
        n_tables = sum(len(tables(f)) for f in files)
        print(f"{len(files)} pages, {n_tables} tables ({len(exceptions)} with their source not "
              f"committed, listed in KNOWN_EXCEPTIONS)")
        for tid in exceptions:
            print(f"  exception {tid}: {known[tid]}")
        for line in pending:
            print(f"  pending link {line}")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=ROOT, help="repository root (default: this one)")
    a = ap.parse_args(argv)
    problems = check(a.root, verbose=True)
    for p in problems:
        print(p)
    print(f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
