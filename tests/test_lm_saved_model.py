"""``attnprune lm`` saves its trained model as a patched-model folder that
``attnprune.from_pretrained`` loads back, in a fresh process, with identical logits."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from test_lm import TINY, _kv, corpus  # noqa: F401 (fixture)

import attnprune
from attnprune.research.lm import LMConfig, build_model, load_weights, run_lm
from attnprune.runs.config import load_config


@pytest.mark.parametrize("method", ["none", "ltp"])
def test_lm_run_saves_a_loadable_patched_model(corpus, tmp_path, method):  # noqa: F811
    opts = {} if method == "none" else {"method": method, "method_options": "{keep_ratio: 0.5}"}
    cfg = load_config(LMConfig, None, {**_kv(TINY), "data": f"text:{corpus}", "steps": 2,
                                       "eval_every": 2, "gen_tokens": 0, "lengths": [], **opts})
    run = run_lm(cfg, tmp_path / "run", exact=True)
    folder = run / "model"
    assert (folder / "attnprune.json").is_file() and (folder / "config.json").is_file()
    # the reference: the model rebuilt by hand from the run's config and its weights file
    from attnprune.research.data.lm_text import load_lm_text

    ref = build_model(cfg, load_lm_text(cfg.data, cfg.tokenizer).vocab_size)
    if method != "none":
        attnprune.patch(ref, method, **cfg.options)
    load_weights(ref, run / "model.safetensors")  # tied embeddings: stored once
    ref.eval()
    x = torch.randint(0, ref.config.vocab_size, (2, 16))
    with torch.no_grad():
        want = ref(input_ids=x).logits
    script = ("import json, sys, torch, attnprune; m = attnprune.from_pretrained(sys.argv[1]).eval(); "
              "x = torch.tensor(json.loads(sys.argv[2])); "
              "print(json.dumps(m(input_ids=x).logits.detach().double().tolist()))")
    out = subprocess.run([sys.executable, "-c", script, str(folder), json.dumps(x.tolist())],
                         capture_output=True, text=True, check=True)
    got = torch.tensor(json.loads(out.stdout.strip().splitlines()[-1]), dtype=torch.float64)
    torch.testing.assert_close(got, want.double(), rtol=0, atol=1e-6)
    from attnprune.deploy.hub import read_recipe

    assert (read_recipe(folder)["patches"] != []) == (method != "none")
