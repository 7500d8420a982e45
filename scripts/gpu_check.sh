#!/usr/bin/env bash
# The GPU check of the "pruning that pays on a GPU" issue, in one call on the device machine
# (no network; its image has torch, transformers, pytest, accelerate, matplotlib; attnprune
# runs from this tree through PYTHONPATH). From the repository root:
#   bash scripts/gpu_check.sh            # results under $OUT (default /tmp/gpu_check)
# Steps, each cut off by a deadline (DEADLINE_S, default 470 s from the start, so the call
# fits 8 minutes with the machine's start-up):
#   1. versions and nvidia-smi;
#   2. the CUDA tests: the sync-free forward under torch.cuda.set_sync_debug_mode("error"),
#      every method x family forward and training step in bf16 on CUDA, the CUDA timers;
#   3. `attnprune bench gpu` (bf16, MiniLM and BERT-base shapes, B 1/32, T 128/512/2048, the
#      Llama-1B-shaped prefill) -> $OUT/bench/summary.json, bench_gpu.png, the table in the log;
#   4. the same bench compiled (torch.compile), if time is left.
# Optional wheels (e.g. torchao for the int8 point) travel in .whl/ and are installed first.
# Dry run on a CPU machine: DEVICE=cpu QUICK=true bash scripts/gpu_check.sh
set -uo pipefail
START=$(date +%s)
DEADLINE=${DEADLINE_S:-470}
OUT=${OUT:-/tmp/gpu_check}
DEVICE=${DEVICE:-cuda}
QUICK=${QUICK:-false}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 MPLBACKEND=Agg
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
left() { echo $(( DEADLINE - ($(date +%s) - START) )); }
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
{
  nvidia-smi 2>&1 | head -15
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
} 2>&1 | tee "$OUT/versions.txt"

echo "== CUDA tests ($(left) s left)"
timeout "$(( $(left) * 2 / 5 ))" python3 -m pytest -q -p no:cacheprovider -x \
  tests/test_sync_free.py tests/test_dtypes.py tests/test_measure.py -k "cuda or timers" 2>&1 \
  | tee "$OUT/cuda_tests.log" | tail -25

echo "== bench gpu ($(left) s left)"
timeout "$(( $(left) - 20 ))" python3 -m attnprune.bench.gpu --device "$DEVICE" --dtype bf16 \
  --quick "$QUICK" --out "$OUT/bench" --exact-out 2>&1 | tee "$OUT/bench.log" | tail -30

if (( $(left) > 120 )); then
  echo "== bench gpu, compiled ($(left) s left)"
  timeout "$(( $(left) - 10 ))" python3 -m attnprune.bench.gpu --device "$DEVICE" --dtype bf16 \
    --quick "$QUICK" --compile true --decoders "[]" --batch-sizes "[32]" --lengths "[512]" \
    --out "$OUT/bench_compiled" --exact-out 2>&1 | tee "$OUT/bench_compiled.log" | tail -12
fi
echo "done in $(( $(date +%s) - START )) s"
