# The long-context training recipe of scripts/gpu/job.sh PART=long (sourced; bash arrays).
# tests/test_gpu_job.py reads it the same way and checks that --min-length fits every task of
# TASKS with this tokenizer (at 64, the GPU run of 2026-11-28 failed on freqwords and
# multivalue with the BPE recipe). QUICK=true gives the dry run's tiny models.
TASKS=${TASKS:-multikey,multivalue,vartrack,freqwords}
LENGTH=${LENGTH:-2048}
# split on purpose when used: options of the --tokenizer flag
TOKENIZER=${TOKENIZER:-bpe:4096 --syllable-tokens --syllable-is --digits-per-token 3}
LR=${LR:-1e-3}
SHAPE=(--layers 4 --width 128 --heads 4 --kv-heads 2 --ffn 384)
SHALLOW=(--layers 2 --width 128 --heads 4 --kv-heads 2 --ffn 384)
RECIPE=(--min-length 160 --batch 32 --batch-tokens 16384 --questions 8 --recall-share 0.3
        --grow-at 0.9 --check-steps 200 --lr "$LR" --text-share 0.1 --eval-n 32
        --prompt-loss 0.3 --repeat-share 0.3)
if [[ ${QUICK:-false} == true ]]; then
  LENGTH=256
  SHAPE=(--layers 2 --width 32 --heads 2 --kv-heads 1 --ffn 64)
  SHALLOW=(--layers 1 --width 32 --heads 2 --kv-heads 1 --ffn 64)
  RECIPE=(--min-length 160 --batch 4 --questions 4 --recall-share 0.3 --grow-at 0.9
          --check-steps 5 --lr 2e-3 --text-share 0.1 --eval-n 2 --prompt-loss 0.3
          --repeat-share 0.3)
fi
