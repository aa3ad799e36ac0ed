#!/usr/bin/env bash
# Megatron-LM launch written by planner launch, for Megatron-LM main (core 0.19 spellings; checked against commit d98e8a64).
# 32 GPUs (4 node(s) x 8): tp 4 (sp), pp 4, vpp 5, dp 2 (zero 1), cp 1, mbs 1, 32 micro-batches, recompute full (first 2 layers per chunk)
# plan.json holds the layout, the specs and the prediction.
set -euo pipefail
LAUNCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# Fill in (or export before running):
MEGATRON_LM="${MEGATRON_LM:?set MEGATRON_LM to a Megatron-LM checkout (main, core 0.19 or later)}"
TOKENIZER_MODEL="${TOKENIZER_MODEL:?set TOKENIZER_MODEL to a Hugging Face tokenizer name or directory}"
# One or more Megatron indexed-dataset prefixes, optionally weighted: "0.7 /data/a_text_document 0.3 /data/b_text_document".
read -r -a DATA_PATH <<< "${DATA_PATH:?set DATA_PATH to the prefix(es) of the preprocessed .bin/.idx data}"
CHECKPOINT_DIR="${CHECKPOINT_DIR:?set CHECKPOINT_DIR to a directory every node can write (checkpoints are saved and resumed there)}"
SPLIT="${SPLIT:-99,1,0}"
# Schedule and optimizer settings are not part of the plan; these are common defaults.
TRAIN_ITERS="${TRAIN_ITERS:-1000}"
LR="${LR:-3e-4}"
MIN_LR="${MIN_LR:-3e-5}"
LR_WARMUP_ITERS="${LR_WARMUP_ITERS:-100}"
EVAL_INTERVAL="${EVAL_INTERVAL:-1000}"
# Steps between checkpoints: the plan's Daly interval (892.1 min) over its predicted step time.
SAVE_INTERVAL="${SAVE_INTERVAL:-8338}"

RUN_NAME=llama-3.1-70b

# Rendezvous: job.sbatch exports these on every node; a one-node run needs none of them.
NNODES=4
NPROC_PER_NODE=8
MASTER_ADDR="${MASTER_ADDR:?set MASTER_ADDR to the first node (job.sbatch does this)}"
MASTER_PORT="${MASTER_PORT:-29500}"
RDZV_ID="${RDZV_ID:-planner}"

# NCCL: warnings and errors in the log; NCCL_SOCKET_IFNAME / NCCL_IB_HCA, if set, pin the interfaces.
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
# Fabric: InfiniBand. NCCL uses its IB transport unasked; NCCL_IB_HCA selects adapters if needed.

# tp or cp > 1 before Blackwell: Megatron asserts one hardware queue (ARG L1453-1478).
export CUDA_DEVICE_MAX_CONNECTIONS=1

MODEL_ARGS=(
  --num-layers 80
  --hidden-size 8192
  --ffn-hidden-size 28672
  --num-attention-heads 64
  --group-query-attention
  --num-query-groups 8
  --seq-length 4096
  --max-position-embeddings 131072
  --position-embedding-type rope
  --rotary-base 500000
  --use-rope-scaling
  --rope-scaling-factor 8.0
  --swiglu
  --normalization RMSNorm
  --norm-epsilon 1e-05
  --untie-embeddings-and-output-weights
  --disable-bias-linear
  --hidden-dropout 0.0
  --attention-dropout 0.0
  --padded-vocab-size 128256
)

PARALLEL_ARGS=(
  --tensor-model-parallel-size 4
  --sequence-parallel
  --pipeline-model-parallel-size 4
  --num-layers-per-virtual-pipeline-stage 4
  --use-distributed-optimizer
  --overlap-grad-reduce
  --overlap-param-gather
  --recompute-granularity full
  --recompute-method block
  --recompute-num-layers 2
)

BATCH_ARGS=(
  --micro-batch-size 1
  --global-batch-size 64
)

PRECISION_ARGS=(
  --bf16
  --fp8-format hybrid
  --fp8-recipe tensorwise
  --optimizer adam
)

DATA_ARGS=(
  --tokenizer-type HuggingFaceTokenizer
  --tokenizer-model "$TOKENIZER_MODEL"
  --data-path "${DATA_PATH[@]}"
  --split "$SPLIT"
  --train-iters "$TRAIN_ITERS"
  --lr "$LR"
  --min-lr "$MIN_LR"
  --lr-decay-style cosine
  --lr-warmup-iters "$LR_WARMUP_ITERS"
  --weight-decay 0.1
  --clip-grad 1.0
  --log-interval 10
  --distributed-timeout-minutes 10
  --eval-interval "$EVAL_INTERVAL"
  --eval-iters 10
  --save "$CHECKPOINT_DIR"
  --load "$CHECKPOINT_DIR"
  --save-interval "$SAVE_INTERVAL"
  --wandb-exp-name "$RUN_NAME"
)

torchrun --nnodes "$NNODES" --nproc-per-node "$NPROC_PER_NODE" --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" --rdzv-id "$RDZV_ID" "$MEGATRON_LM/pretrain_gpt.py" \
  "${MODEL_ARGS[@]}" \
  "${PARALLEL_ARGS[@]}" \
  "${BATCH_ARGS[@]}" \
  "${PRECISION_ARGS[@]}" \
  "${DATA_ARGS[@]}" \
  "$@"
