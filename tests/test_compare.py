"""`attnprune compare`: reads predictions/<label>__seed<N>.npz and writes comparison tables."""

import json

import numpy as np
import pytest

from attnprune.runs import stats
from attnprune.runs.compare import compare_dirs, load_predictions, main

SEEDS = (42, 43)


def _write(folder, label, seed, y, pred, scores=None):
    d = folder / "predictions"
    d.mkdir(parents=True, exist_ok=True)
    arrays = {"y_true": y, "y_pred": pred}
    if scores is not None:
        arrays["scores"] = scores
    np.savez(d / f"{label}__seed{seed}.npz", **arrays)


@pytest.fixture
def results(tmp_path):
    """A results folder with full / entropy-0.5 / random over two seeds, binary with scores."""
    rng = np.random.default_rng(0)
    run = tmp_path / "run"
    for seed in SEEDS:
        y = rng.integers(0, 2, 300)
        for label, acc, sep in [("full", 0.92, 2.0), ("entropy-0.5", 0.9, 1.7),
                                ("random", 0.6, 0.3)]:
            pred = np.where(rng.random(300) < acc, y, 1 - y)
            scores = 1 / (1 + np.exp(-(sep * (2 * y - 1) + rng.normal(size=300))))
            _write(run, label, seed, y, pred, scores)
    (run / "predictions" / "notes.txt").write_text("ignored")
    return run


def test_load_predictions(results):
    p = load_predictions(results)
    assert sorted(p) == ["entropy-0.5", "full", "random"]
    assert sorted(p["full"]) == list(SEEDS)
    assert set(p["full"][42]) == {"y_true", "y_pred", "scores"}
    assert load_predictions(results / "predictions").keys() == p.keys()  # folder itself works


def test_compare_command_table_and_json(results, tmp_path, capsys):
    out = tmp_path / "cmp.json"
    assert main([str(results), "--json", str(out), "--n-resamples", "500"]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    header = lines[0].split()
    assert header[:4] == ["a", "b", "seed", "metric"]
    rows = [ln for ln in lines[2:] if ln.startswith(("entropy", "random"))]
    assert len(rows) == 2 * 2 * 2 + 2 * 2  # methods × seeds × metrics, then across-seed rows
    # aligned: every row of the first table starts its "metric" column at the same offset
    col = lines[0].index("metric")
    assert all(ln[col:].split()[0] in ("accuracy", "auc") for ln in rows[:8])

    res = json.loads(out.read_text())
    comps = res["comparisons"]
    assert len(comps) == 8 and {c["seed"] for c in comps} == set(SEEDS)
    for c in comps:
        assert {"a", "b", "metric", "diff", "ci95", "test", "p", "p_holm", "effect",
                "noninferior", "claim", "seed"} <= set(c)
        assert c["b"] == "full"
    # Holm over the whole family (both seeds, both methods, both metrics)
    np.testing.assert_allclose([c["p_holm"] for c in comps], stats.holm([c["p"] for c in comps]))
    rnd = [c for c in comps if c["a"] == "random"]
    assert all(c["claim"] == "degradation" for c in rnd)
    assert {(s["a"], s["metric"]) for s in res["across_seeds"]} == {
        ("entropy-0.5", "accuracy"), ("entropy-0.5", "auc"), ("random", "accuracy"),
        ("random", "auc")}
    agg = res["across_seeds"][0]["diff"]
    assert set(agg) >= {"mean", "ci95", "per_seed"} and len(agg["per_seed"]) == 2


def test_compare_is_reproducible_and_per_seed_matches_library(results):
    a = compare_dirs([str(results)], n_resamples=300, seed=3)
    b = compare_dirs([str(results)], n_resamples=300, seed=3)
    assert a == b
    p = load_predictions(results)
    group = {lab: seeds[42] for lab, seeds in p.items()}
    lib = stats.compare_predictions(group, n_resamples=300, adjust=False)
    mine = [c for c in a["comparisons"] if c["seed"] == 42]
    assert [c["p"] for c in mine] == [c["p"] for c in lib]
    assert [c["diff"] for c in mine] == [c["diff"] for c in lib]


def test_other_reference_and_pooling_two_dirs(results, tmp_path, capsys):
    other = tmp_path / "other"
    y = load_predictions(results)["full"][42]["y_true"]
    _write(other, "ltp", 42, y, y.copy())  # no scores: accuracy only
    res = compare_dirs([str(results), str(other)], reference="full", n_resamples=200)
    ltp = [c for c in res["comparisons"] if c["a"] == "ltp"]
    assert [c["metric"] for c in ltp] == ["accuracy"] and ltp[0]["diff"] > 0
    assert main([str(results), "--reference", "random", "--n-resamples", "200"]) == 0
    assert "random" in capsys.readouterr().out


def test_identical_duplicates_merge_conflicts_fail(results, tmp_path, capsys):
    p = load_predictions(results)["full"][42]
    same, diff = tmp_path / "same", tmp_path / "diff"
    _write(same, "full", 42, p["y_true"], p["y_pred"], p["scores"])
    _write(diff, "full", 42, p["y_true"], 1 - p["y_pred"], p["scores"])
    assert len(compare_dirs([str(results), str(same)], n_resamples=100)["comparisons"]) == 8
    assert main([str(results), str(diff)]) == 1
    assert "different predictions" in capsys.readouterr().err


def test_errors_are_reported_not_raised(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main([str(empty)]) == 1
    assert "no <label>__seed<N>.npz" in capsys.readouterr().err
    run = tmp_path / "run"
    _write(run, "full", 1, np.array([0, 1, 1]), np.array([0, 1, 1]))
    _write(run, "x", 1, np.array([0, 1, 1]), np.array([0, 1]))
    assert main([str(run)]) == 1
    assert "has 3 elements but y_pred has 2" in capsys.readouterr().err
    run2 = tmp_path / "run2"
    _write(run2, "x", 1, np.array([0, 1]), np.array([0, 1]))
    assert main([str(run2)]) == 1
    assert "reference 'full' not found" in capsys.readouterr().err


def test_seed_without_reference_is_listed_as_skipped(results):
    y = load_predictions(results)["full"][42]["y_true"]
    _write(results, "late", 99, y, y)
    res = compare_dirs([str(results)], n_resamples=100)
    assert any("late" in s and "99" in s for s in res["skipped"])
