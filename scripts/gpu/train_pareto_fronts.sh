#!/usr/bin/env bash
# The pareto fronts' training on a lent GPU (issues 22-25; once scripts/gpu_session.sh): its
# bench steps 1 and 1b are superseded by scripts/gpu/job.sh (PART=bench), which is what a GPU
# call should run for speed; this script stays for the training phase the README's fronts
# came from (docs/long_text_benchmark.md). In order:
#   1. `attnprune bench gpu` alone on the GPU (issue 22's targets: bf16, MiniLM and BERT-base
#      shapes, B 1/32, T 128/512/2048, the Llama-1B-shaped prefill), cut off at BENCH_S (90 s);
#   1b. (COMPILED=true) the bench again through torch.compile(mode="reduce-overhead"), CUDA
#      graphs, alone, cut off at COMPILED_S (150 s): B 1/32, T 512/2048, encoders;
#   2. then, concurrently (the GPU is shared; the timings are over):
#      - the training phase of configs/pareto_docstring_domain_gpu.yaml (issue 24), one process
#        per seed (0, 1, 2), each with 4 CPU threads for its int8 scoring;
#      - the README recipe's fronts on Shakespeare and tweets (configs/pareto_{shakespeare,
#        tweets}_cpu.yaml), all seeds in one process each, at low CPU priority (nice);
#      - scripts/gpu/train_passkey.sh (issue 25: the passkey models up to 2k tokens), when present;
#      - the CUDA tests (tests/test_sync_free.py, test_dtypes.py, test_measure.py -k cuda);
#   3. packs $OUT/{bench,pareto,logs}.tgz and passkey-seed{0,1,2}.tgz (runs and predictions, no pareto weights).
# Everything stops by DEADLINE_S (default 560 s from the start); a pareto run cut off keeps the
# (point, seed) runs it finished (each is written atomically; the folders resume).
# Inputs carried (ignored by git through .git/info/exclude): .carry/minilm (MiniLM-L6 with fp16
# weights, widened back to fp32 here), .carry/cache/docstring_domain (the corpus, gzipped) and
# .carry/data/*.gz (the shared data files, gzipped: shakespeare.txt, tweets_sentiment.csv).
#   run(command="bash scripts/gpu/train_pareto_fronts.sh", carry=[".carry"], timeout_s=595)
# Dry run on the CPU (tiny shapes and splits):
#   DEVICE=cpu QUICK=true PARETO_ARGS="--max-train 48 --max-test 32 --full-epochs 1" \
#     DEADLINE_S=400 OUT=/tmp/gs_out bash scripts/gpu/train_pareto_fronts.sh
# Afterwards, here: unpack pareto.tgz, `python scripts/merge_results.py DEST seed folders`, then
# `attnprune pareto --out DEST --exact-out --phase time --threads 1` and `--phase summary`.
set -uo pipefail
START=$(date +%s)
DEADLINE=${DEADLINE_S:-560}
OUT=${OUT:-/tmp/gpu_session}
DEVICE=${DEVICE:-cuda}
QUICK=${QUICK:-false}
BENCH_S=${BENCH_S:-90}
PARETO_ARGS=${PARETO_ARGS:-}
PARETO_CONFIG=${PARETO_CONFIG:-configs/pareto_docstring_domain_gpu.yaml}
COMPANIONS=${COMPANIONS:-true}  # false: the whole CPU to the main front's int8 scoring
PASSKEY=${PASSKEY:-true}  # false: no passkey training
COMPILED=${COMPILED:-true}  # the bench again through torch.compile(mode="reduce-overhead")
COMPILED_S=${COMPILED_S:-150}
W=${WORK:-/tmp/gs}
mkdir -p "$OUT" "$W"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 MPLBACKEND=Agg
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export ATTNPRUNE_CACHE=$W/cache
# a plain `python` for scripts that call it (the image's is python3)
mkdir -p "$W/bin" && ln -sf "$(command -v python3)" "$W/bin/python" && export PATH=$W/bin:$PATH
left() { echo $(( DEADLINE - ($(date +%s) - START) )); }

{
  nvidia-smi 2>&1 | head -15
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
} 2>&1 | tee "$W/versions.log"

# inputs
mkdir -p "$ATTNPRUNE_CACHE/docstring_domain"
gunzip -c .carry/cache/docstring_domain/docstring_domain.jsonl.gz > "$ATTNPRUNE_CACHE/docstring_domain/docstring_domain.jsonl"
cp .carry/cache/docstring_domain/manifest.json "$ATTNPRUNE_CACHE/docstring_domain/"
export ATTNPRUNE_DATA=$W/data  # the shared data files, for the companion fronts
mkdir -p "$ATTNPRUNE_DATA"
for f in .carry/data/*.gz; do [[ -f $f ]] && gunzip -c "$f" > "$ATTNPRUNE_DATA/$(basename "$f" .gz)"; done
python3 - "$W/minilm" <<'PY'
import shutil, sys
from pathlib import Path
from safetensors.torch import load_file, save_file
src, dst = Path(".carry/minilm"), Path(sys.argv[1])
shutil.copytree(src, dst, dirs_exist_ok=True)
save_file({k: v.float().contiguous() for k, v in load_file(src / "model.safetensors").items()},
          dst / "model.safetensors", metadata={"format": "pt"})
print("MiniLM widened to fp32", flush=True)
PY

echo "== 1. bench gpu, alone ($(left) s left)"
timeout "$BENCH_S" python3 -m attnprune.bench.gpu --device "$DEVICE" --dtype bf16 \
  --quick "$QUICK" --out "$W/bench" --exact-out > "$W/bench.log" 2>&1
echo "bench exit $? ($(left) s left)"; tail -40 "$W/bench.log"

if [[ $COMPILED == true ]]; then  # CUDA graphs: the launch-bound shapes' remedy, alone too
  echo "== 1b. bench gpu, compiled (reduce-overhead), alone ($(left) s left)"
  timeout "$COMPILED_S" python3 -m attnprune.bench.gpu --device "$DEVICE" --dtype bf16 \
    --quick "$QUICK" --compile true --compile-mode reduce-overhead --decoders "[]" \
    --batch-sizes "[1,32]" --lengths "[512,2048]" --out "$W/bench/compiled" --exact-out \
    > "$W/bench_compiled.log" 2>&1
  echo "compiled bench exit $? ($(left) s left)"; grep "^|" "$W/bench_compiled.log" | tail -8
fi

echo "== 2. training, concurrently ($(left) s left)"
pids=()
pareto_seed() {  # seed → a background train-phase process of $PARETO_CONFIG
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=4 timeout "$(( $(left) - 25 ))" python3 -m attnprune.cli pareto \
    --config "$PARETO_CONFIG" --model "$W/minilm" --seeds "$1" \
    --phase train --threads 4 --progress false $PARETO_ARGS \
    --out "$W/pareto-seed$1" --exact-out > "$W/pareto-seed$1.log" 2>&1 &
  pids+=($!)
}
pareto_seed 0
# searched schedules (schedule: search) are searched once, on seed 0's full model: the other
# seeds start when seed 0's search.json holds them all, from a copy of it
n_search=$(grep -cE "^ *- .*schedule: search" "$PARETO_CONFIG" || true)
if (( n_search > 0 )); then
  until python3 -c "import json,sys; sys.exit(len(json.load(open('$W/pareto-seed0/search.json'))) < $n_search)" 2>/dev/null \
      || (( $(left) < 60 )) || ! kill -0 "${pids[0]}" 2>/dev/null; do sleep 5; done
  echo "searched schedules ready ($(left) s left)"
  for seed in 1 2; do
    mkdir -p "$W/pareto-seed$seed" && cp "$W/pareto-seed0/search.json" "$W/pareto-seed$seed/" 2>/dev/null
  done
fi
pareto_seed 1
pareto_seed 2
# the same comparison on the small tasks (the README recipe's configs), at low CPU priority:
# whatever the docstring_domain front leaves of the machine
for cfg in shakespeare tweets; do
  [[ $COMPANIONS == true ]] || break
  [[ -f $ATTNPRUNE_DATA/$( [[ $cfg == tweets ]] && echo tweets_sentiment.csv || echo shakespeare.txt) ]] || continue
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=2 timeout "$(( $(left) - 25 ))" nice -n 10 python3 -m attnprune.cli pareto \
    --config "configs/pareto_${cfg}_cpu.yaml" --model "$W/minilm" --phase train --threads 2 \
    --progress false $PARETO_ARGS --out "$W/pareto-$cfg" --exact-out > "$W/pareto-$cfg.log" 2>&1 &
  pids+=($!)
done
if [[ $PASSKEY == true && -f scripts/gpu/train_passkey.sh ]]; then
  PASSKEY_BUDGET=${PASSKEY_BUDGET:-240} PASSKEY_KILL_S=${PASSKEY_KILL_S:-290} DEVICE=$DEVICE timeout "$(( $(left) - 25 ))" \
    bash scripts/gpu/train_passkey.sh "$W/passkey" > "$W/passkey.log" 2>&1 &
  pids+=($!)
fi
if [[ $DEVICE == cuda ]]; then
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_sync_free.py \
    tests/test_dtypes.py tests/test_measure.py -k "cuda or timers" > "$W/cuda_tests.log" 2>&1
  echo "CUDA tests exit $?: $(tail -1 "$W/cuda_tests.log")"
fi
for p in "${pids[@]}"; do wait "$p"; echo "job $p exit $?"; done
for cfg in shakespeare tweets; do
  echo "pareto $cfg: $(grep -c ': accuracy' "$W/pareto-$cfg.log" 2>/dev/null) runs"
done
for seed in 0 1 2; do
  echo "pareto seed $seed: $(grep -c ': accuracy' "$W/pareto-seed$seed.log") runs"
  grep -E ': accuracy|Error' "$W/pareto-seed$seed.log" | tail -30
done
tail -8 "$W/passkey.log" 2>/dev/null

echo "== 3. pack ($(left) s left)"
tar -czf "$OUT/pareto.tgz" -C "$W" --exclude=models pareto-seed0 pareto-seed1 pareto-seed2 2>/dev/null
tar -czf "$OUT/pareto_small.tgz" -C "$W" --exclude=models pareto-shakespeare pareto-tweets 2>/dev/null
tar -czf "$OUT/bench.tgz" -C "$W" bench 2>/dev/null
for seed in 0 1 2; do  # one file per seed: each file that comes back is at most 16 MiB
  [[ -d $W/passkey/seed$seed ]] && tar -czf "$OUT/passkey-seed$seed.tgz" -C "$W" "passkey/seed$seed"
done
(cd "$W" && tar -czf "$OUT/logs.tgz" ./*.log)
ls -la "$OUT"
echo "done in $(( $(date +%s) - START )) s"
