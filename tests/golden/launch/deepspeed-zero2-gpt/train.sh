#!/usr/bin/env bash
# DeepSpeed launch written by planner launch, for DeepSpeed 0.19 (checked against 0.19.8); DeepSpeed runs under torchrun.
# 8 GPUs (1 node(s) x 8): tp 1, pp 1, vpp 1, dp 8 (zero 2), cp 1, mbs 8, 2 micro-batches, recompute none
# plan.json holds the layout, the specs and the prediction.
set -euo pipefail
LAUNCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# Fill in (or export before running):
# A training script that calls deepspeed.initialize(…, config=args.deepspeed_config) and
# accepts DeepSpeed's --deepspeed/--deepspeed_config (deepspeed.add_config_arguments).
TRAIN_SCRIPT="${TRAIN_SCRIPT:?set TRAIN_SCRIPT to your training script}"

# Rendezvous: job.sbatch exports these on every node; a one-node run needs none of them.
NNODES=1
NPROC_PER_NODE=8
MASTER_ADDR="${MASTER_ADDR:-localhost}"
MASTER_PORT="${MASTER_PORT:-29500}"
RDZV_ID="${RDZV_ID:-planner}"

torchrun --nnodes "$NNODES" --nproc-per-node "$NPROC_PER_NODE" --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" --rdzv-id "$RDZV_ID" "$TRAIN_SCRIPT" \
  --deepspeed \
  --deepspeed_config "$LAUNCH_DIR/ds_config.json" \
  "$@"
