#!/usr/bin/env bash
# The training phase of `attnprune pareto` on a GPU machine that has PyTorch and transformers
# but no network and no attnprune install: run from the repository root with
#   bash scripts/gpu_pareto.sh SEEDS CONFIG [CONFIG ...]     (e.g. 0 configs/pareto_shakespeare.yaml)
# Inputs, carried beside the repository (see the README): .carry/minilm (MiniLM-L6 with fp16
# weights, to fit the 64 MiB transfer; widened back to fp32 here) and .carry/data (the shared
# data files). Each config's results folder is packed as $OUT/<config>-seed<SEEDS>.tgz, so the
# timing phase (on the CPU you deploy on) and the summary can run where the folder lands.
set -uo pipefail
SEEDS=$1; shift
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
print("model widened to fp32; cuda:", torch.cuda.is_available())
PY
for cfg in "$@"; do
  name=$(basename "$cfg" .yaml)
  out=/tmp/res/$name-seed${SEEDS//,/_}
  timeout ${PARETO_TIMEOUT:-540} python3 -m attnprune.cli pareto --config "$cfg" --model /tmp/minilm \
    --seeds "$SEEDS" --phase train --progress false --out "$out" --exact-out
  echo "$cfg: exit $?"
  tar -czf "$OUT/$name-seed${SEEDS//,/_}.tgz" -C "$out" --exclude=models .
done
