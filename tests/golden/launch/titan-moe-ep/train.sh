#!/usr/bin/env bash
# torchtitan 0.3.x launch written by planner launch.
# 16 GPUs (2 node(s) x 8): tp 1, pp 1, vpp 1, dp 16 (zero 2), cp 1, ep 8, etp 1, mbs 1, 1 micro-batch, recompute full
# plan.json holds the layout, the specs and the prediction.
set -euo pipefail
LAUNCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# Fill in (or export before running):
HF_ASSETS_PATH="${HF_ASSETS_PATH:?set HF_ASSETS_PATH to the Hugging Face assets (tokenizer) directory of the model}"
CHECKPOINT_DIR="${CHECKPOINT_DIR:?set CHECKPOINT_DIR to a directory every node can write (checkpoints are saved and resumed there)}"
# A dataset name torchtitan registers (c4, c4_test, ...); add --dataloader.dataset_path / --training.dataset_path after the script name for a local copy.
DATASET="${DATASET:-c4}"
STEPS="${STEPS:-1000}"
# Steps between checkpoints: the plan's Daly interval (1088.0 min) over its predicted step time.
SAVE_INTERVAL="${SAVE_INTERVAL:-74521}"

RUN_NAME=qwen3-30b-a3b

# Rendezvous: job.sbatch exports these on every node; a one-node run needs none of them.
NNODES=2
NPROC_PER_NODE=8
MASTER_ADDR="${MASTER_ADDR:?set MASTER_ADDR to the first node (job.sbatch does this)}"
MASTER_PORT="${MASTER_PORT:-29500}"
RDZV_ID="${RDZV_ID:-planner}"

# NCCL: warnings and errors in the log; NCCL_SOCKET_IFNAME / NCCL_IB_HCA, if set, pin the interfaces.
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
# Fabric: InfiniBand. NCCL uses its IB transport unasked; NCCL_IB_HCA selects adapters if needed.

export PYTORCH_ALLOC_CONF="expandable_segments:True"  # as torchtitan run_train.sh (§2.5)

torchrun --nnodes "$NNODES" --nproc-per-node "$NPROC_PER_NODE" --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" --rdzv-id "$RDZV_ID" -m torchtitan.train \
  --module qwen3 \
  --config qwen3_30b_a3b \
  --hf_assets_path "$HF_ASSETS_PATH" \
  --dataloader.dataset "$DATASET" \
  --training.steps "$STEPS" \
  --dump_folder "./outputs/$RUN_NAME" \
  --checkpoint.enable \
  --checkpoint.folder "$CHECKPOINT_DIR" \
  --checkpoint.interval "$SAVE_INTERVAL" \
  --comm.init_timeout_seconds 600 \
  --comm.train_timeout_seconds 600 \
  --parallelism.data_parallel_replicate_degree 1 \
  --parallelism.data_parallel_shard_degree 16 \
  --parallelism.fsdp_reshard_after_forward never \
  --parallelism.tensor_parallel_degree 1 \
  --parallelism.context_parallel_degree 1 \
  --parallelism.expert_parallel_degree 8 \
  --training.local_batch_size 1 \
  --training.global_batch_size 16 \
  --training.seq_len 4096 \
  --training.mixed_precision_param bfloat16 \
  --training.disable_cuda_graphs \
  "$@" \
  activation-checkpoint:full
