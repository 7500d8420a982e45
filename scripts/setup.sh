#!/usr/bin/env bash
# Set up attnprune on this machine: the CPU build of PyTorch first (a bare `torch` requirement
# with no torch installed would pull several GB of CUDA wheels), then the package and its
# development extras. Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  echo "setup: installing PyTorch 2.13.0 (CPU build)"
  "$PY" -m pip install --quiet "torch==2.13.0"
fi
"$PY" -m pip install --quiet -e ".[dev]"
"$PY" -c "import attnprune, torch, transformers; print(f'setup: attnprune {attnprune.__version__}, torch {torch.__version__}, transformers {transformers.__version__}')"
