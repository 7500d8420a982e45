#!/usr/bin/env bash
# Train the passkey model of issue 25 (attnprune/research/experiments/passkey.py) at prompts up to 2,048
# tokens: seeds 0 1 2 as 3 concurrent processes on one GPU, each saving into OUTDIR/seed<N>/
# model.safetensors, config.json, config.yaml, train.json (loss log, steps done, quick unpruned
# accuracy at 512 / 1,024 / 2,048 tokens on the GPU) and log.txt; then one summary line per seed.
#
# Invocation (from the repository root, no attnprune install, no network needed; ~3 min wall):
#   bash scripts/gpu/train_passkey.sh results/passkey_gpu
# Expected wall time: ~160-175 s (training stops itself at PASSKEY_BUDGET=130 s per seed,
# + imports/CUDA start + the checks); every process is killed at 185 s, so the script ends
# in ≤ 200 s whatever happens (a killed seed keeps the checkpoint written at 50 % / 80 %).
# CPU dry run (proves the plumbing, learns nothing):
#   PASSKEY_STEPS=20 PASSKEY_BATCH_TOKENS=2048 PASSKEY_MAX_LEN=256 PASSKEY_CHECK_LENGTHS=256 \
#     PASSKEY_BUDGET=60 DEVICE=cpu bash scripts/gpu/train_passkey.sh /tmp/pk_dry
#
# Recipe: Llama width 128, 6 layers, 4 heads (2 KV), FFN 384, vocabulary 64, 2 digits;
# prompt lengths uniform in [32, top], top growing 32 → 2,048 over the first half of the
# schedule; ~64k prompt tokens per step (batch = max(16, 65536 // length)); AdamW lr 2e-3,
# 5 % warm-up, cosine; bf16 autocast; the schedule runs on min(steps, time budget).
set -u
OUT=${1:?usage: bash scripts/gpu/train_passkey.sh OUTDIR}
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export OMP_NUM_THREADS=4 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
DEVICE=${DEVICE:-cuda}
STEPS=${PASSKEY_STEPS:-6000}
BUDGET=${PASSKEY_BUDGET:-130}
MAX_LEN=${PASSKEY_MAX_LEN:-2048}
KILL_S=${PASSKEY_KILL_S:-185}
BATCH_TOKENS=${PASSKEY_BATCH_TOKENS:-65536}
CHECK_LENGTHS=${PASSKEY_CHECK_LENGTHS:-512,1024,$MAX_LEN}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv 2>/dev/null | tee "$OUT/gpu.txt" || true
start=$(date +%s)
for seed in 0 1 2; do
  mkdir -p "$OUT/seed$seed"
  timeout -k 5 "$KILL_S" python -u -m attnprune.research.experiments.passkey \
    --train-only true --device "$DEVICE" --threads 4 --seed "$seed" \
    --digits 2 --vocab 64 --width 128 --layers 6 --heads 4 --kv-heads 2 --ffn 384 \
    --min-len 32 --max-len "$MAX_LEN" --steps "$STEPS" --batch 16 --batch-tokens "$BATCH_TOKENS" \
    --lr 0.002 --budget-s "$BUDGET" --eval-lengths "$CHECK_LENGTHS" --check-n 256 \
    --out "$OUT/seed$seed" --exact-out > "$OUT/seed$seed/log.txt" 2>&1 &
done
wait
echo "wall $(( $(date +%s) - start )) s"
for seed in 0 1 2; do
  python - "$OUT/seed$seed" <<'EOF'
import json, sys, pathlib
d = pathlib.Path(sys.argv[1])
try:
    t = json.loads((d / "train.json").read_text())
    check = " ".join(f"acc@{k} {v:.3f}" for k, v in t["check"].items())
    print(f"{d.name}: steps {t['steps_done']} train {t['train_s']:.0f}s final loss {t['final_loss']:.4f} {check}")
except Exception as e:  # killed or failed: say what is there
    have = "model.safetensors" if (d / "model.safetensors").is_file() else "no model"
    tail = (d / "log.txt").read_text().strip().splitlines()[-3:] if (d / "log.txt").is_file() else []
    print(f"{d.name}: NO train.json ({type(e).__name__}); {have}; log tail: {' | '.join(tail)}")
EOF
done
