"""scripts/kvpress_side_by_side.py: merging the two sides' JSON, --model-dir configs and pooling
seeds (runs without kvpress installed)."""

import json

import pytest
from conftest import load_script


@pytest.fixture(scope="module")
def script():
    return load_script("kvpress_side_by_side")


def _row(variant, side, right, ttft, kept=1.0, cache=1.0):
    n = len(right)
    return {"length": 8, "variant": variant, "side": side, "kept": kept, "method": variant.split()[0],
            "right": right, "ttft_cpu_ms": ttft, "ttft_wall_ms": [2 * t for t in ttft],
            "decode_cpu_ms": [0.5] * n, "decode_wall_ms": [1.0] * n,
            "cache_kept": [cache] * n, "prompt_kept": [kept] * n}


def _sides():
    base = [True, True, True, False]
    ours = {"side": "attnprune", "env": {"transformers": "5.24"}, "rows": [
        _row("unpruned", "attnprune", base, [4.0, 4.0, 4.0, 4.0]),
        _row("fastv 0.5", "attnprune", [True, False, True, True], [2.0, 2.0, 3.0, 3.0], 0.5, 0.75)]}
    kvp = {"side": "kvpress", "env": {"transformers": "5.2.0", "kvpress": "0.5.5"}, "question": "after",
           "rows": [_row("unpruned", "kvpress", base, [5.0] * 4),
                    _row("snapkv 0.5", "kvpress", [False, False, True, False], [5.0, 5.0, 6.0, 6.0], 0.5, 0.5),
                    {"length": 8, "variant": "knorm 0.5", "side": "kvpress", "kept": 0.5, "method": "knorm",
                     "error": "RuntimeError: boom"}]}
    return [ours, kvp]


def test_merge_pairs_each_side_with_its_own_unpruned(script):
    s = script.merge(_sides())
    rows = {(r["side"], r["variant"]): r for r in s["rows"]}
    fv = rows["attnprune", "fastv 0.5"]
    assert fv["accuracy"] == 0.75 and fv["diff_vs_unpruned"] == 0.0
    assert (fv["lost"], fv["gained"]) == (1, 1) and fv["mcnemar_p"] == pytest.approx(1.0)
    assert fv["ttft_ratio_cpu"] == pytest.approx(2.5 / 4.0) and fv["ttft_ratio_wall"] == pytest.approx(2.5 / 4.0)
    assert fv["cache_kept"] == 0.75 and fv["decode_cpu_ms"] == 0.5
    snap = rows["kvpress", "snapkv 0.5"]
    assert snap["accuracy"] == 0.25 and (snap["lost"], snap["gained"]) == (2, 0)
    assert snap["mcnemar_p"] == pytest.approx(0.5)  # exact: 2 discordant, both lost
    assert snap["ttft_ratio_cpu"] == pytest.approx(5.5 / 5.0)
    lo, hi = snap["ci95"]
    assert lo < 0.25 < hi
    assert rows["kvpress", "knorm 0.5"]["error"] == "RuntimeError: boom"
    assert rows["attnprune", "unpruned"]["mcnemar_p"] is None
    assert s["unpruned_agree"] == {"8": True}
    assert s["kvpress_question"] == "after"
    assert s["env"]["kvpress"]["kvpress"] == "0.5.5"
    order = [(r["side"], r["variant"]) for r in s["rows"]]
    assert order[0] == ("attnprune", "unpruned") and order[2] == ("kvpress", "unpruned")


def test_merge_flags_disagreeing_unpruned_sides(script):
    sides = _sides()
    sides[1]["rows"][0]["right"] = [True] * 4
    assert script.merge(sides)["unpruned_agree"] == {"8": False}


def test_merge_dir_writes_summary_and_table(script, tmp_path, capsys):
    ours, kvp = _sides()
    (tmp_path / "ours.json").write_text(json.dumps(ours))
    (tmp_path / "kvpress.json").write_text(json.dumps(kvp))
    assert script.main(["merge", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "table.md").read_text().splitlines()
    assert len(table) == 2 + 5  # header, rule, 5 rows
    assert "| 8 | attnprune | fastv 0.5 | 0.50 (0.75) | 0.750 [" in table[3]
    assert "| 8 | kvpress | knorm 0.5 | — | RuntimeError: boom |" in "\n".join(table)
    assert json.loads((tmp_path / "summary.json").read_text())["rows"][0]["variant"] == "unpruned"
    assert "fastv 0.5" in capsys.readouterr().out


# --model-dir configs and pooling seeds
def test_model_config_from_json_and_yaml(script, tmp_path):
    raw = {"width": 128, "layers": 6, "max_len": 2048, "eval_lengths": [512, 2048], "device": "cuda",
           "not_a_field": 1}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    cfg = script.model_config(tmp_path)
    assert (cfg.width, cfg.layers, cfg.max_len, cfg.eval_lengths) == (128, 6, 2048, (512, 2048))
    (tmp_path / "config.json").unlink()
    (tmp_path / "config.yaml").write_text("width: 64\nlayers: 2\n")
    cfg = script.model_config(tmp_path)
    assert (cfg.width, cfg.layers) == (64, 2)
    assert script.model_config(None).width == 96  # the default recipe


def _pool_row(variant, side, right, ttft, L=8, kept=1.0):
    n = len(right)
    return {"length": L, "variant": variant, "side": side, "kept": kept, "method": variant.split()[0],
            "right": right, "ttft_cpu_ms": ttft, "ttft_wall_ms": ttft, "decode_cpu_ms": [0.5] * n,
            "decode_wall_ms": [0.5] * n, "cache_kept": [kept] * n, "prompt_kept": [kept] * n}


def _pool_run(path, base, pruned, L=8):
    path.mkdir(parents=True)
    side = {"side": "kvpress", "env": {"kvpress": "0.5.5"}, "question": "after", "rows": [
        _pool_row("unpruned", "kvpress", base, [4.0] * len(base), L),
        _pool_row("snapkv 0.5", "kvpress", pruned, [2.0] * len(base), L, 0.5),
        {"length": L, "variant": "knorm 0.5", "side": "kvpress", "kept": 0.5, "method": "knorm",
         "error": "RuntimeError: boom"}]}
    (path / "kvpress.json").write_text(json.dumps(side))


def test_pool_pairs_prompts_and_pools_seeds(script, tmp_path):
    _pool_run(tmp_path / "s0", [True] * 4, [True, False, True, True])
    _pool_run(tmp_path / "s1", [True, True, True, False], [True, True, True, False])
    _pool_run(tmp_path / "s1_long", [True, True], [False, False], L=16)  # another length, another run
    out = tmp_path / "pool"
    out.mkdir()
    s = script.pool_dir(out, [tmp_path / "s0", tmp_path / "s1", tmp_path / "s1_long"], "python x.py pool")
    rows = {(r["length"], r["variant"]): r for r in s["rows"]}
    snap = rows[(8, "snapkv 0.5")]
    assert snap["n"] == 8 and snap["seeds"] == 2
    assert snap["accuracy"] == pytest.approx(6 / 8) and snap["unpruned_accuracy"] == pytest.approx(7 / 8)
    assert snap["diff_vs_unpruned"] == pytest.approx(-1 / 8) and snap["lost"] == 1
    lo, hi = snap["diff_ci95"]
    assert -0.5 <= lo <= -1 / 8 <= hi <= 0.0  # prompt 1 (lost by s0) drawn 0 … 4 times
    assert snap["ttft_ratio_cpu_median"] == pytest.approx(0.5)
    assert rows[(16, "snapkv 0.5")]["seeds"] == 1 and rows[(16, "snapkv 0.5")]["diff_ci95"] == [-1.0, -1.0]
    assert "error" in rows[(8, "knorm 0.5")]
    table = (out / "table.md").read_text()
    assert table.startswith("**Source** (`kvpress-2k`): `") and "python x.py pool" in table
    assert "-12.5 pp" in table
    assert json.loads((out / "summary.json").read_text())["command"] == "python x.py pool"
