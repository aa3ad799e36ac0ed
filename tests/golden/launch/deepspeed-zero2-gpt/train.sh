#!/usr/bin/env bash
# DeepSpeed launch written by planner launch, for DeepSpeed 0.19 (checked against 0.19.8); DeepSpeed runs under torchrun.
# 8 GPUs (1 node(s) x 8): tp 1, pp 1, vpp 1, dp 8 (zero 2), cp 1, mbs 8, 2 micro-batches, recompute none
# plan.json holds the layout, the specs and the prediction.
set -euo pipefail
LAUNCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# Fill in (or export before running):
TOKENIZER_MODEL="${TOKENIZER_MODEL:?set TOKENIZER_MODEL to the Hugging Face tokenizer (name or directory) the data was made with}"
DATA_PATH="${DATA_PATH:?set DATA_PATH to a flat binary file of token ids (numpy dtype DATA_DTYPE)}"
CHECKPOINT_DIR="${CHECKPOINT_DIR:?set CHECKPOINT_DIR to a directory every node can write (checkpoints are saved and resumed there)}"
DATA_DTYPE="${DATA_DTYPE:-uint32}"
# Schedule and optimizer settings are not part of the plan; these are common defaults.
TRAIN_ITERS="${TRAIN_ITERS:-1000}"
LR="${LR:-3e-4}"
# Steps between checkpoints: the plan's Daly interval (150.3 min) over its predicted step time.
SAVE_INTERVAL="${SAVE_INTERVAL:-154583}"

# Rendezvous: job.sbatch exports these on every node; a one-node run needs none of them.
NNODES=1
NPROC_PER_NODE=8
MASTER_ADDR="${MASTER_ADDR:-localhost}"
MASTER_PORT="${MASTER_PORT:-29500}"
RDZV_ID="${RDZV_ID:-planner}"

# NCCL: warnings and errors in the log; NCCL_SOCKET_IFNAME / NCCL_IB_HCA, if set, pin the interfaces.
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
# Fabric: InfiniBand. NCCL uses its IB transport unasked; NCCL_IB_HCA selects adapters if needed.

torchrun --nnodes "$NNODES" --nproc-per-node "$NPROC_PER_NODE" --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" --rdzv-id "$RDZV_ID" "$LAUNCH_DIR/train.py" \
  --deepspeed \
  --deepspeed_config "$LAUNCH_DIR/ds_config.json" \
  --model-config "$LAUNCH_DIR/config.json" \
  --tokenizer "$TOKENIZER_MODEL" \
  --data-path "$DATA_PATH" \
  --data-dtype "$DATA_DTYPE" \
  --checkpoint-dir "$CHECKPOINT_DIR" \
  --save-interval "$SAVE_INTERVAL" \
  --train-iters "$TRAIN_ITERS" \
  --lr "$LR" \
  --seq-length 1024 \
  --recompute none \
  --timeout-minutes 10 \
  "$@"
