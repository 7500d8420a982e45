#!/usr/bin/env bash
# Issue 30 on a lent GPU in one call (≤ 8 minutes, model builds and compilation included),
# in order of value, each step bounded by what is left of TOTAL_S:
#   1. grid      the compiled headline (torch.compile mode="reduce-overhead", CUDA graphs; the
#                full model compiled the same way is the reference): full, attention_mass mean
#                ρ 0.25 / 0.5 after layer 1 (scorer_kernel matmul and sdpa), half the layers,
#                int8 (torchao, where installed; else a note); BERT-base (random weights) and
#                the packaged MiniLM-L6; cells B × T from B ∈ {1, 8, 32, 128}, T ∈ {128, 512,
#                2048}, the targets' shapes first; CUDA-event medians; the bench skips the
#                cells its deadline cannot hold, with a note
#   2. prefill   decoder time to first token at 2k / 8k / 16k / 32k tokens (Llama-style, 8
#                layers, width 1024, GQA 16/4, bf16): full vs FastV / GemFilter keep 0.25 / 0.5
#                vs half the layers, decode ms/token over 32 tokens after each prefill
#   3. profile   torch.profiler, top 15 ops by CUDA time, full vs pruned at 32 × 512 and
#                1 × 512 (BERT-base): eager, then compiled
#   4. eager     the grid's first cells eager, beside the compiled ones
#   5. tests     the CUDA tests of the new code
# Every step writes its folder under $OUT (summary.json written atomically after each cell,
# table.md / table.txt, profile.txt, <step>.log) and STEPS.txt says each step's exit code
# and seconds. On the device machine:
#   run(command="bash scripts/gpu_issue30.sh", timeout_s=540)
# Dry run on the CPU (tiny shapes, fp32, no compile; every output file):
#   DEVICE=cpu QUICK=true COMPILE=false OUT=/tmp/g30 bash scripts/gpu_issue30.sh
set -uo pipefail
OUT=${OUT:-${OUT_DIR:-/tmp/gpu30}}
DEVICE=${DEVICE:-cuda}
QUICK=${QUICK:-false}
COMPILE=${COMPILE:-true}
if [[ $DEVICE == cpu ]]; then DTYPE=${DTYPE:-fp32}; else DTYPE=${DTYPE:-bf16}; fi
if [[ $QUICK == true ]]; then  # the dry run (≤ 10 min on a loaded 2-core CPU): one cell where
  # a step needs only its files, tests collected, not run; more time for the CPU's slow steps
  EAGER_CELLS=[32x512] PROF_REPEATS=1 TEST_ARGS=(--collect-only)
  TOTAL_S=${TOTAL_S:-540} GRID_S=${GRID_S:-200} PREFILL_S=${PREFILL_S:-80}
  PROFILE_S=${PROFILE_S:-60} EAGER_S=${EAGER_S:-60}
else
  EAGER_CELLS=[32x512,1x512,128x512,8x2048,32x128,1x128] PROF_REPEATS=3 TEST_ARGS=()
fi
TOTAL_S=${TOTAL_S:-470}           # the whole script; each step gets min(its own, what is left)
GRID_S=${GRID_S:-240} PREFILL_S=${PREFILL_S:-90} PROFILE_S=${PROFILE_S:-25}
PROFILE_COMPILED_S=${PROFILE_COMPILED_S:-45} EAGER_S=${EAGER_S:-40} TESTS_S=${TESTS_S:-60}
KEEPS=${KEEPS:-[0.25,0.5]} SCORERS=${SCORERS:-[matmul,sdpa]} MODELS=${MODELS:-[bert-base,minilm-l6]}
CELLS=${CELLS:-[32x512,1x512,128x512,8x2048,32x128,1x128,8x512,128x128,32x2048,8x128,1x2048,128x2048]}
START=$SECONDS
mkdir -p "$OUT"
: > "$OUT/STEPS.txt"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 MPLBACKEND=Agg
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

# seconds for a step: its own budget, or what is left of TOTAL_S less a reserve for the rest
budget() {
  local want=$1 reserve=${2:-0} left=$((TOTAL_S - (SECONDS - START) - ${2:-0}))
  (( left < want )) && want=$left
  (( want < 10 )) && want=0
  echo "$want"
}

# step NAME SECONDS CMD...: run CMD under a timeout into $OUT/NAME.log (tail shown), or skip
step() {
  local name=$1 secs=$2 t0=$SECONDS rc
  shift 2
  if (( secs == 0 )); then
    echo "== $name: skipped, no time left of TOTAL_S=$TOTAL_S" | tee -a "$OUT/STEPS.txt"
    return
  fi
  echo "== $name (≤ ${secs} s, $((SECONDS - START)) s in)"
  rm -rf "${OUT:?}/$name"  # a folder from an earlier run holds another config
  timeout --kill-after=10 "$secs" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  tail -n "${TAIL:-40}" "$OUT/$name.log"
  echo "$name rc=$rc ${secs}s-limit took=$((SECONDS - t0))s" | tee -a "$OUT/STEPS.txt"
}

python3 - <<'PY' 2>&1 | tee "$OUT/versions.log"
import importlib.util, torch, transformers
print("torch", torch.__version__, "transformers", transformers.__version__,
      "cuda", torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else "")
print("torch.compile", hasattr(torch, "compile"), "triton", importlib.util.find_spec("triton") is not None,
      "torchao", importlib.util.find_spec("torchao") is not None)
PY
if [[ $COMPILE == true ]] && ! python3 -c "import torch; torch.compile; import torch._dynamo" 2>/dev/null; then
  echo "torch.compile not importable here: COMPILE=false" | tee -a "$OUT/STEPS.txt"; COMPILE=false
fi
if [[ $COMPILE == true && $DEVICE == cuda* ]] && ! python3 -c "import triton" 2>/dev/null; then
  echo "triton not importable (inductor needs it on CUDA): COMPILE=false" | tee -a "$OUT/STEPS.txt"
  COMPILE=false
fi

GPU=(python3 -m attnprune.bench.gpu --device "$DEVICE" --dtype "$DTYPE" --quick "$QUICK"
     --decoders "[]" --timer events --exact-out)

# 1. the compiled headline grid (eager when COMPILE=false); the bench stops starting cells
#    15 s before its step's limit, so its summary.json holds every cell it finished
s=$(budget "$GRID_S" 60)
step grid "$s" "${GPU[@]}" --compile "$COMPILE" --compile-mode reduce-overhead \
  --models "$MODELS" --keep-ratios "$KEEPS" --scorer-kernels "$SCORERS" --cells "$CELLS" \
  --max-tokens 262144 --repeats 30 --warmup 3 --deadline-s $(( s > 25 ? s - 15 : s )) \
  --out "$OUT/grid"

# 2. decoder prefill at long prompts
if [[ $QUICK == true ]]; then
  PF=(--lengths "[32,64]" --width 64 --layers 4 --heads 4 --kv-heads 2 --ffn 128 --vocab 1000
      --decode-tokens 2 --repeats 2 --warmup 1 --fastv-layer 1 --gemfilter-layer 2
      --window 4 --sinks 1 --memory false)
else
  PF=(--lengths "[2048,8192,16384,32768]" --width 1024 --layers 8 --heads 16 --kv-heads 4
      --ffn 4096 --vocab 32000 --decode-tokens 32 --repeats 10 --warmup 2 --fastv-layer 2
      --gemfilter-layer 3 --memory true)
fi
s=$(budget "$PREFILL_S" 40)
step prefill "$s" python3 -m attnprune.bench.prefill --device "$DEVICE" --dtype "$DTYPE" \
  --methods "[fastv,gemfilter]" --keeps "[0.25,0.5]" --int8 false --flops false --threads 0 \
  --timer events --deadline-s $(( s > 25 ? s - 15 : s )) "${PF[@]}" --out "$OUT/prefill" \
  --exact-out

# 3. where the time goes: eager, then compiled (CUDA graphs)
PROF=(--profile true --models "[bert-base]" --keep-ratios "[0.25]" --scorer-kernels "[matmul,sdpa]"
      --cells "[32x512,1x512]" --profile-rows 15 --profile-repeats "$PROF_REPEATS" --warmup 3)
s=$(budget "$PROFILE_S" 30)
step profile_eager "$s" "${GPU[@]}" "${PROF[@]}" --deadline-s $(( s > 20 ? s - 10 : s )) \
  --out "$OUT/profile_eager"
if [[ $COMPILE == true ]]; then
  s=$(budget "$PROFILE_COMPILED_S" 30)
  step profile_compiled "$s" "${GPU[@]}" "${PROF[@]}" --compile true \
    --compile-mode reduce-overhead --deadline-s $(( s > 25 ? s - 15 : s )) \
    --out "$OUT/profile_compiled"
fi

# 4. eager beside the compiled grid, its first cells
s=$(budget "$EAGER_S" 20)
step eager "$s" "${GPU[@]}" --compile false --models "$MODELS" --keep-ratios "$KEEPS" \
  --scorer-kernels "$SCORERS" --cells "$EAGER_CELLS" --max-tokens 262144 --repeats 20 --warmup 3 \
  --deadline-s $(( s > 20 ? s - 10 : s )) --out "$OUT/eager"

# 5. the CUDA tests of the new code (on the CPU here: they skip what needs CUDA)
s=$(budget "$TESTS_S")
step tests "$s" python3 -m pytest -q -p no:cacheprovider "${TEST_ARGS[@]}" \
  tests/test_fused_scorer.py tests/test_compiled.py tests/test_sync_free.py \
  -k "cuda or fused or compile"

echo "== done in $((SECONDS - START)) s"
cat "$OUT/STEPS.txt"
