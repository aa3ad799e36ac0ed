#!/usr/bin/env bash
# Megatron-LM launch written by planner launch, for Megatron-LM main (core 0.19 spellings; checked against commit d98e8a64).
# 8 GPUs (1 node(s) x 8): tp 2 (sp), pp 1, vpp 1, dp 4 (zero 1), cp 1, mbs 1, 1 micro-batch, recompute none
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
# Steps between checkpoints: the plan's Daly interval (1206.4 min) over its predicted step time.
SAVE_INTERVAL="${SAVE_INTERVAL:-865135}"

RUN_NAME=llama-3.1-8b

# Rendezvous: job.sbatch exports these on every node; a one-node run needs none of them.
NNODES=1
NPROC_PER_NODE=8
MASTER_ADDR="${MASTER_ADDR:-localhost}"
MASTER_PORT="${MASTER_PORT:-29500}"
RDZV_ID="${RDZV_ID:-planner}"

# NCCL: warnings and errors in the log; NCCL_SOCKET_IFNAME / NCCL_IB_HCA, if set, pin the interfaces.
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"

# NVFP4 without the random Hadamard transform (TrainingSpec.nvfp4_disable_rht).
export NVTE_NVFP4_DISABLE_RHT=1

MODEL_ARGS=(
  --num-layers 32
  --hidden-size 4096
  --ffn-hidden-size 14336
  --num-attention-heads 32
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
  --tensor-model-parallel-size 2
  --sequence-parallel
  --pipeline-model-parallel-size 1
  --use-distributed-optimizer
  --overlap-grad-reduce
  --overlap-param-gather
)

BATCH_ARGS=(
  --micro-batch-size 1
  --global-batch-size 4
)

PRECISION_ARGS=(
  --bf16
  --fp4-format e2m1
  --fp4-recipe nvfp4
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
