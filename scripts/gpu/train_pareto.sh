#!/usr/bin/env bash
# The training phase of `attnprune pareto` on a GPU machine that has PyTorch and transformers
# but no network and no attnprune install. From the repository root:
#   bash scripts/gpu/train_pareto.sh "0 1 2" configs/pareto_shakespeare.yaml configs/pareto_tweets.yaml
# runs, seed by seed, each config's training phase into its own folder
# /tmp/res/<config>-seed<N> and packs each finished one as $OUT/<config>-seed<N>.tgz (runs and
# predictions; no weights). A run cut off by the deadline (DEADLINE_S, default 570 s from the
# start) is not packed. Inputs carried beside the repository: .carry/minilm (MiniLM-L6 with
# fp16 weights, to fit the 64 MiB transfer; widened back to fp32 here) and .carry/data (the
# shared data files). Unpack the folders where the CPU timing runs, merge them with
# `python scripts/merge_results.py DEST SRC...`, then `attnprune pareto --out DEST --phase time`.
set -uo pipefail
SEEDS=$1; shift
START=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export ATTNPRUNE_DATA=$PWD/.carry/data TOKENIZERS_PARALLELISM=false
python3 - <<'PY'
import shutil, torch
from pathlib import Path
from safetensors.torch import load_file, save_file
src, dst = Path(".carry/minilm"), Path("/tmp/minilm")
shutil.copytree(src, dst, dirs_exist_ok=True)
save_file({k: v.float().contiguous() for k, v in load_file(src / "model.safetensors").items()},
          dst / "model.safetensors", metadata={"format": "pt"})
print("model widened to fp32; cuda:", torch.cuda.is_available(), flush=True)
PY
for seed in $SEEDS; do
  for cfg in "$@"; do
    name=$(basename "$cfg" .yaml)-seed$seed
    left=$(( ${DEADLINE_S:-570} - ($(date +%s) - START) ))
    if (( left < 30 )); then echo "$name: no time left"; continue; fi
    t0=$(date +%s)
    timeout $left python3 -m attnprune.cli pareto --config "$cfg" --model /tmp/minilm \
      --seeds "$seed" --phase train --progress false --out "/tmp/res/$name" --exact-out \
      > "/tmp/res-$name.log" 2>&1
    rc=$?
    echo "$name: exit $rc in $(( $(date +%s) - t0 )) s"; grep -E "accuracy|Error|error" "/tmp/res-$name.log" | tail -30
    if (( rc == 0 )); then tar -czf "$OUT/$name.tgz" -C "/tmp/res/$name" --exclude=models .; fi
  done
done
