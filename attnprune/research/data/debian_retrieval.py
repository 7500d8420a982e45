"""A second passage-retrieval benchmark, of another domain than the docstrings of
:mod:`attnprune.research.data.retrieval` (issue 45): Debian package descriptions from the apt
lists. A package's short description is the query, its long description the one relevant
passage.

Source: the ``*_Packages`` files of an apt lists folder (plain or compressed: ``.lz4``, ``.gz``,
``.xz``, ``.bz2``, ``.lzma``, ``.zst``), files in sorted name order, stanzas in file order. Since
Debian 7 the Packages files carry only the short description and a ``Description-md5``; the
long one is in ``*_i18n_Translation-en`` files of the same folder, joined on (package,
``Description-md5``). A Packages stanza that has its long description inline (older archives,
``dpkg`` status files) uses it. Only English (``Translation-en``); other translations are not
read. Each (package, short, long description) is read once (several architectures or suites in
one folder repeat packages). Each package gives:

- the query: the short description (the ``Description`` field's first line),
  whitespace-normalised; kept under the rules of ``retrieval``: at least ``QUERY_MIN_WORDS``
  words, at most ``QUERY_MAX_TOKENS`` tokens, not code-like;
- the passage: the long description (the continuation lines without their leading space;
  `` .`` is an empty line, i.e. a paragraph break). Over ``MAX_TOKENS`` tokens it is cut at the
  last sentence end that fits (else the last line end), then whitespace-normalised; under
  ``MIN_TOKENS`` it is dropped (nothing extends it).

Groups and split: a package's group is its source package (the ``Source`` field without a
version, ``foo (1.2)`` → ``foo``; the package name when absent), so the ``-dev`` / ``-doc`` /
``-dbg`` binaries of one source fall into one split. A group's split comes from the sha256 of
its name (:func:`split_of`: the first 8 bytes mod 100, below 60 ``distill``, below 80 ``val``,
else ``test``): nothing random, and a group's split does not depend on the other groups.
Copies as in ``retrieval``: a passage whose text (lower-cased letters only) is in two splits is
dropped from every split; inside a split the first copy is kept, with its query (the other
copies' queries go with them). A query whose text (lower-cased letters only) is in its split
twice is ambiguous: dropped (its passage stays, as a distractor).

Files: those of ``retrieval`` (``distill.jsonl``, ``{val,test}_corpus.jsonl``,
``{val,test}_queries.jsonl``, ``manifest.json``, written by
:func:`attnprune.research.data.retrieval.write_benchmark`), so ``retrieval:DIR`` loads the
folder (:func:`attnprune.research.data.retrieval.load_spec`). The manifest adds the apt list
files read (name, sha256, the release of each ``InRelease``), the split rule and counts. Built by
``python scripts/build_debian_retrieval.py --out DIR [--lists DIR]``; the same lists give
byte-identical files.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import lzma
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnprune.research.data.base import DataError

# the rules and helpers of the docstring benchmark, shared so both sets are built alike
from attnprune.research.data.retrieval import (
    CODE_LIKE,
    MAX_TOKENS,
    MIN_TOKENS,
    QUERY_MAX_TOKENS,
    QUERY_MIN_WORDS,
    SPLITS,
    cut_to_tokens,
    dedup_key,
    token_counts,
)

__all__ = ["DEFAULT_LISTS", "SPLIT_PERCENT", "Package", "build", "describe_lists",
           "find_lists", "packages", "parse_deb822", "read_list", "source_name",
           "split_description", "split_of"]

DEFAULT_LISTS = Path("/var/lib/apt/lists")
# cumulative percent bounds of the hash split: [0, 60) distill, [60, 80) val, [80, 100) test
SPLIT_PERCENT = (("distill", 60), ("val", 80), ("test", 100))
_COMPRESSED = ("", ".lz4", ".gz", ".xz", ".bz2", ".lzma", ".zst")
_PACKAGES = re.compile(r"_Packages(\.\w+)?$")
_TRANSLATION = re.compile(r"_Translation-en(\.\w+)?$")
_FETCH_HINT = ("apt-get update -o Dir::State::Lists=DIR -c CONF, CONF holding "
               "'#clear Acquire::Languages; Acquire::Languages { \"en\"; };'")


# ----------------------------------------------------------------------------- reading
def _decompress_command(path: Path, tool: str) -> bytes:
    if shutil.which(tool) is None:
        raise DataError(f"data: {path}: needs the python package {tool!r} or the {tool!r} "
                        f"command to decompress (pip install {tool}, or apt-get install {tool})")
    r = subprocess.run([tool, "-dc", str(path)], check=False, capture_output=True)
    if r.returncode:
        err = r.stderr.decode(errors="replace").strip().splitlines()
        raise DataError(f"data: {path}: {tool} -dc failed: {err[-1] if err else r.returncode}")
    return r.stdout


def read_list(path: Path | str) -> str:
    """The text of one apt list file, decompressed by its suffix."""
    path = Path(path)
    raw = path.read_bytes()
    suffix = path.suffix if path.suffix in _COMPRESSED else ""
    if suffix == ".lz4":
        try:
            import lz4.frame
        except ImportError:
            data = _decompress_command(path, "lz4")
        else:
            data = lz4.frame.decompress(raw)
    elif suffix == ".zst":
        try:
            import zstandard
        except ImportError:
            data = _decompress_command(path, "zstd")
        else:
            data = zstandard.ZstdDecompressor().decompressobj().decompress(raw)
    else:
        data = {".gz": gzip.decompress, ".xz": lzma.decompress, ".lzma": lzma.decompress,
                ".bz2": bz2.decompress}.get(suffix, lambda b: b)(raw)
    return data.decode("utf-8", errors="replace")


def parse_deb822(text: str) -> Iterator[dict[str, str]]:
    """The stanzas of a deb822 text (Packages, Translation, status files): field names
    lower-cased; a field's value is its first line, then its continuation lines (those starting
    with a space or tab) each on its own line, kept as written (leading space included).
    Stanzas are separated by blank lines; ``#`` comment lines are skipped."""
    stanza: dict[str, str] = {}
    last = ""
    for line in text.split("\n"):  # not splitlines(): it also splits at \x0c, \u2028, ...
        line = line.removesuffix("\r")
        if not line.strip():
            if stanza:
                yield stanza
            stanza, last = {}, ""
        elif line[0] in " \t":
            if last:
                stanza[last] += "\n" + line
        elif line.startswith("#"):
            continue
        else:
            name, sep, value = line.partition(":")
            if not sep:  # not a field: ignore the line rather than guess
                last = ""
                continue
            last = name.strip().lower()
            stanza[last] = value.strip()
    if stanza:
        yield stanza


def split_description(value: str) -> tuple[str, str]:
    """(short description, long description) of a ``Description`` field value: the first line
    whitespace-normalised; the continuation lines without their first space, `` .`` an empty
    line (paragraph break), other lines kept as lines (for cutting at line ends)."""
    first, _, rest = value.partition("\n")
    lines = []
    for line in rest.split("\n"):
        body = line[1:] if line[:1] in (" ", "\t") else line
        lines.append("" if body.strip() == "." else body.rstrip())
    return " ".join(first.split()), "\n".join(lines).strip()


def source_name(stanza: dict[str, str]) -> str:
    """The source package of a Packages stanza: ``Source`` without its version
    (``foo (1.2)`` → ``foo``), else the package name."""
    src = stanza.get("source", "").split()
    return src[0] if src else stanza.get("package", "").strip()


def split_of(group: str) -> str:
    """The split of a group (source package): the first 8 bytes of the sha256 of its name, mod
    100, against :data:`SPLIT_PERCENT`."""
    h = int.from_bytes(hashlib.sha256(group.encode()).digest()[:8], "big") % 100
    return next(s for s, bound in SPLIT_PERCENT if h < bound)


def _pick(paths: Iterable[Path], pattern: re.Pattern) -> list[Path]:
    """Matching files, one per base name (plain preferred, then the order of
    ``_COMPRESSED``), sorted by name."""
    best: dict[str, tuple[int, Path]] = {}
    for p in paths:
        m = pattern.search(p.name)
        ext = m.group(1) or "" if m else ""
        if not m or ext not in _COMPRESSED or not p.is_file():
            continue
        base, rank = p.name[: len(p.name) - len(ext)], _COMPRESSED.index(ext)
        if base not in best or rank < best[base][0]:
            best[base] = (rank, p)
    return [best[b][1] for b in sorted(best)]


def find_lists(folder: Path | str) -> tuple[list[Path], list[Path]]:
    """(Packages files, Translation-en files) of an apt lists folder. No Packages file (or no
    folder) raises FileNotFoundError naming the path."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"data: {folder} is not a folder (give an apt lists folder, "
                                f"e.g. {DEFAULT_LISTS})")
    files = sorted(folder.iterdir())
    pk, tr = _pick(files, _PACKAGES), _pick(files, _TRANSLATION)
    if not pk:
        raise FileNotFoundError(f"data: no *_Packages files (plain or {', '.join(_COMPRESSED[1:])})"
                                f" in {folder}")
    return pk, tr


@dataclass(frozen=True)
class Package:
    """One binary package's description: its name, source package (the group), short and
    long description."""

    name: str
    group: str
    short: str
    long: str


def packages(folder: Path | str, stats: dict | None = None) -> list[Package]:
    """Every package of the folder's Packages files with a long description (inline or from
    Translation-en), each (name, short, long) once, in file order. ``stats`` receives counts.
    Packages files without any long description and no Translation-en raise DataError."""
    pk_files, tr_files = find_lists(folder)
    longs: dict[tuple[str, str], str] = {}
    for p in tr_files:
        for st in parse_deb822(read_list(p)):
            d = st.get("description-en", "")
            if "package" in st and "description-md5" in st and "\n" in d:
                longs.setdefault((st["package"].strip(), st["description-md5"].strip()), d)
    out: list[Package] = []
    seen: set[tuple[str, str, str]] = set()
    n = Counter()
    for p in pk_files:
        for st in parse_deb822(read_list(p)):
            name = st.get("package", "").strip()
            if not name or "description" not in st:
                continue
            n["stanzas"] += 1
            d = st["description"]
            if "\n" not in d:
                d = longs.get((name, st.get("description-md5", "").strip()), d)
            short, long = split_description(d)
            if not long:
                n["no_long_description"] += 1
                continue
            if (name, short, long) in seen:
                n["repeated"] += 1
                continue
            seen.add((name, short, long))
            out.append(Package(name, source_name(st), short, long))
    if n["stanzas"] and not out:
        raise DataError(f"data: no long descriptions in {Path(folder)}: its Packages files "
                        "carry only short ones and it has no *_Translation-en file; fetch "
                        f"it with {_FETCH_HINT}")
    if stats is not None:
        stats.update(stanzas=n["stanzas"], no_long_description=n["no_long_description"],
                     repeated=n["repeated"], packages=len(out))
    return out


# ----------------------------------------------------------------------------- building
def build(pkgs: Sequence[Package], tok: Any, *, min_tokens: int = MIN_TOKENS,
          max_tokens: int = MAX_TOKENS, split: Any = split_of, families: bool = False,
          stats: dict | None = None) -> dict[str, list[dict]]:
    """The benchmark's rows by file name (``retrieval.FILES``). ``tok``: a fast HF tokenizer
    (the MiniLM one for the real build); ``split``: group name → split. ``families``: copies
    are passages with the same first paragraph (lower-cased letters only), not only the same
    text: of a family of binaries whose descriptions differ only after a shared paragraph
    (``This package contains the X plugin``), one passage stays. ``stats`` receives counts per
    split (groups, packages, passages, queries) and of each drop rule."""
    where = {p.group: split(p.group) for p in pkgs}
    for g, s in where.items():
        if s not in SPLITS:
            raise ValueError(f"group {g!r}: split must be one of {SPLITS}, got {s!r}")
    # 1. passages cut and bounded, queries checked
    n_long = token_counts(tok, [p.long for p in pkgs])
    cut = cut_to_tokens(tok, [p.long for p in pkgs], n_long, max_tokens)
    texts = [" ".join(t.split()) for t in cut]
    n_tok = token_counts(tok, texts)
    ok = [bool(t) and min_tokens <= n <= max_tokens for t, n in zip(texts, n_tok, strict=True)]
    q_tok = token_counts(tok, [p.short for p in pkgs])
    q_ok = [len(p.short.split()) >= QUERY_MIN_WORDS and n <= QUERY_MAX_TOKENS
            and not CODE_LIKE.search(p.short) for p, n in zip(pkgs, q_tok, strict=True)]
    # 2. copies: dropped everywhere when in two splits, else the first kept
    keys = [dedup_key(p.long.split("\n\n", 1)[0]) if families else dedup_key(t)
            for p, t in zip(pkgs, texts, strict=True)]
    splits_of: dict[str, set[str]] = {}
    for p, k, good in zip(pkgs, keys, ok, strict=True):
        if good:
            splits_of.setdefault(k, set()).add(where[p.group])
    seen: set[str] = set()
    drop = Counter(dict.fromkeys(("passage_length", "passage_in_two_splits",
                                  "passage_copy_in_split", "query_rules", "query_ambiguous"), 0))
    kept: dict[str, list[tuple[Package, str, str]]] = {s: [] for s in SPLITS}
    for p, t, k, good, qg in zip(pkgs, texts, keys, ok, q_ok, strict=True):
        if not good:
            drop["passage_length"] += 1
        elif len(splits_of[k]) > 1:
            drop["passage_in_two_splits"] += 1
        elif k in seen:
            drop["passage_copy_in_split"] += 1
        else:
            seen.add(k)
            drop["query_rules"] += not qg
            kept[where[p.group]].append((p, p.short if qg else "", t))
    # 3. rows, ids in order
    rows: dict[str, list[dict]] = {}
    per: dict[str, dict] = {}
    for s in SPLITS:
        items = kept[s]
        ids = [f"{s}-p{i:06d}" for i in range(len(items))]
        corpus = [{"id": pid, "group": p.group, "text": t}
                  for pid, (p, _, t) in zip(ids, items, strict=True)]
        per[s] = {"groups_read": sum(v == s for v in where.values()),
                  "packages_read": sum(where[p.group] == s for p in pkgs),
                  "passages": len(corpus), "groups": len({p.group for p, _, _ in items})}
        if s == "distill":
            rows["distill.jsonl"] = corpus
            continue
        qcount = Counter(dedup_key(q) for _, q, _ in items if q)
        qs = [(p.group, q, pid) for pid, (p, q, _) in zip(ids, items, strict=True)
              if q and qcount[dedup_key(q)] == 1]
        drop["query_ambiguous"] += sum(1 for _, q, _ in items if q and qcount[dedup_key(q)] > 1)
        per[s]["queries"] = len(qs)
        rows[f"{s}_corpus.jsonl"] = corpus
        rows[f"{s}_queries.jsonl"] = [
            {"id": f"{s}-q{i:06d}", "group": g, "text": q, "positive": pid}
            for i, (g, q, pid) in enumerate(qs)]
    if stats is not None:
        stats.update(splits=per, dropped=dict(sorted(drop.items())))
    return rows


def describe_lists(folder: Path | str) -> dict:
    """The manifest's record of the lists read: each Packages / Translation-en file's name and
    sha256, and each ``InRelease`` / ``Release`` file's name, sha256 and release fields (no
    local path: the manifest is the same anywhere)."""
    pk, tr = find_lists(folder)

    def sha(p: Path) -> str:
        return hashlib.sha256(p.read_bytes()).hexdigest()

    releases = []
    for p in sorted(Path(folder).iterdir()):
        if p.is_file() and re.search(r"_(In)?Release$", p.name):
            text = p.read_text(encoding="utf-8", errors="replace")
            head = text.split("\n\n", 1)[1] if text.startswith("-----BEGIN PGP") else text
            st = next(parse_deb822(head), {})
            releases.append({"file": p.name, "sha256": sha(p),
                             **{k: st[k].split("\n")[0] for k in
                                ("origin", "suite", "version", "codename", "date") if k in st}})
    return {"packages_files": [{"file": p.name, "sha256": sha(p)} for p in pk],
            "translation_files": [{"file": p.name, "sha256": sha(p)} for p in tr],
            "releases": releases}
