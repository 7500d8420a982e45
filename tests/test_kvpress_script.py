"""scripts/kvpress_side_by_side.py: --model-dir configs and pooling seeds (runs without kvpress)."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "kvpress_side_by_side.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("kvpress_side_by_side_pool", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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


def _row(variant, side, right, ttft, L=8, kept=1.0):
    n = len(right)
    return {"length": L, "variant": variant, "side": side, "kept": kept, "method": variant.split()[0],
            "right": right, "ttft_cpu_ms": ttft, "ttft_wall_ms": ttft, "decode_cpu_ms": [0.5] * n,
            "decode_wall_ms": [0.5] * n, "cache_kept": [kept] * n, "prompt_kept": [kept] * n}


def _run(path, base, pruned, L=8):
    path.mkdir(parents=True)
    side = {"side": "kvpress", "env": {"kvpress": "0.5.5"}, "question": "after", "rows": [
        _row("unpruned", "kvpress", base, [4.0] * len(base), L),
        _row("snapkv 0.5", "kvpress", pruned, [2.0] * len(base), L, 0.5),
        {"length": L, "variant": "knorm 0.5", "side": "kvpress", "kept": 0.5, "method": "knorm",
         "error": "RuntimeError: boom"}]}
    (path / "kvpress.json").write_text(json.dumps(side))


def test_pool_pairs_prompts_and_pools_seeds(script, tmp_path):
    _run(tmp_path / "s0", [True] * 4, [True, False, True, True])
    _run(tmp_path / "s1", [True, True, True, False], [True, True, True, False])
    _run(tmp_path / "s1_long", [True, True], [False, False], L=16)  # another length, another run
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
