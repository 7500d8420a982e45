#!/usr/bin/env bash
# Issue 30 on a lent GPU in one call (about 8 minutes): the compiled-vs-compiled headline
# (torch.compile mode="reduce-overhead", CUDA graphs, the full model compiled the same way),
# the pruned point with both scorers (scorer_kernel matmul: L×L probabilities in blocks; sdpa:
# two fused attention passes from the rows' log-sum-exps), half the layers; then the eager
# bench beside it and the CUDA tests of the new code. Each step has its own time limit.
#   run(command="bash scripts/gpu_issue30.sh", timeout_s=595)
# Dry run on the CPU (tiny shapes, no compile):
#   DEVICE=cpu QUICK=true COMPILE=false OUT=/tmp/g30 bash scripts/gpu_issue30.sh
set -uo pipefail
OUT=${OUT:-${OUT_DIR:-/tmp/gpu30}}
DEVICE=${DEVICE:-cuda}
QUICK=${QUICK:-false}
COMPILE=${COMPILE:-true}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 MPLBACKEND=Agg
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
COMMON=(--device "$DEVICE" --dtype bf16 --quick "$QUICK" --keep-ratios "[0.25]"
        --scorer-kernels "[matmul,sdpa]" --decoders "[]")
if [[ $COMPILE == true ]]; then
  echo "== compiled, reduce-overhead (CUDA graphs)"
  timeout "${COMPILED_S:-300}" python3 -m attnprune.bench.gpu "${COMMON[@]}" --compile true \
    --compile-mode reduce-overhead --batch-sizes "[1,32,128]" --lengths "[512]" \
    --max-tokens 65536 --out "$OUT/compiled" --exact-out 2>&1 | tail -30
fi
echo "== eager"
timeout "${EAGER_S:-120}" python3 -m attnprune.bench.gpu "${COMMON[@]}" \
  --batch-sizes "[1,32,128]" --lengths "[128,512,2048]" --max-tokens 262144 \
  --out "$OUT/eager" --exact-out 2>&1 | tail -30
echo "== CUDA tests of the new code"
timeout "${TESTS_S:-120}" python3 -m pytest -q -p no:cacheprovider tests/test_fused_scorer.py \
  tests/test_compiled.py 2>&1 | tail -5
