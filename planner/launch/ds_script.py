"""train.py of a DeepSpeed launch: a Hugging Face causal LM built from the launch's config.json,
trained by a DeepSpeed engine on a file of token ids (or, with --mock-data, on random ones: a smoke
test of the launch without a tokenizer or data). The text is fixed; train.sh passes the plan's values
as flags.

What it calls, with the DeepSpeed 0.19 / transformers sources it follows:
- deepspeed.init_distributed with the accelerator's backend, timeout=… : nccl on CUDA, gloo on the
  CPU accelerator without oneCCL (DeepSpeed v0.19.8 accelerator/cuda_accelerator.py L34,
  cpu_accelerator.py L30-34; comm/comm.py L904-906 picks the same when dist_backend is None), and the
  accelerator's set_device (a no-op on the CPU accelerator, cpu_accelerator.py L61-62), so the script
  also runs on a CPU-only host;
- for ZeRO-3, the model's transformers module imported before zero.Init: inside it, which replaces
  torch.Tensor.__new__, the torch._dynamo import that transformers' masking_utils makes raises
  "Signature mismatch" (seen with DeepSpeed 0.19.8, torch 2.13, transformers 5.24);
- deepspeed.zero.Init around from_config for ZeRO-3, so each rank only ever holds its shard
  (deepspeed/runtime/zero/partition_parameters.py Init);
- model.gradient_checkpointing_enable() for full recompute: every decoder layer is re-run in the
  backward (transformers modeling_utils.py PreTrainedModel.gradient_checkpointing_enable);
- deepspeed.initialize(model=…, optimizer=…, config=…); engine.backward / engine.step per
  micro-batch (the engine steps the optimizer at each gradient_accumulation_steps boundary);
- engine.save_checkpoint / engine.load_checkpoint with the `latest` tag file (runtime/engine.py).
"""

TRAIN_PY = '''\
"""Hugging Face model + DeepSpeed training loop written by planner launch.

Builds the model of config.json (beside this file), trains it on DATA_PATH, a flat file of token ids
(numpy dtype --data-dtype, e.g. the uint32 output of a tokenizer run over the corpus), and saves a
DeepSpeed checkpoint every --save-interval steps into --checkpoint-dir, resuming from the latest one.
--mock-data trains on random token ids instead (no tokenizer or data read; the loss means nothing): a
smoke test of the launch, e.g. `./train.sh --mock-data --train-iters 2` with TOKENIZER_MODEL and
DATA_PATH set to anything.
"""

import argparse
import datetime
import json
import os
import time

import deepspeed
import numpy as np
import torch
from deepspeed.accelerator import get_accelerator
from transformers import MODEL_FOR_CAUSAL_LM_MAPPING, AutoConfig, AutoModelForCausalLM, AutoTokenizer

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--model-config", required=True, help="Hugging Face config.json of the model")
parser.add_argument("--tokenizer", help="tokenizer the data was made with (checked against the vocabulary)")
parser.add_argument("--data-path", help="flat binary file of token ids")
parser.add_argument("--mock-data", action="store_true", help="random token ids instead of --data-path (a smoke test)")
parser.add_argument("--data-dtype", default="uint32")
parser.add_argument("--checkpoint-dir", required=True)
parser.add_argument("--save-interval", type=int, required=True, help="optimizer steps between checkpoints")
parser.add_argument("--train-iters", type=int, required=True, help="optimizer steps")
parser.add_argument("--seq-length", type=int, required=True)
parser.add_argument("--lr", type=float, default=3e-4)
parser.add_argument("--weight-decay", type=float, default=0.1)
parser.add_argument("--recompute", choices=["none", "full"], default="none")
parser.add_argument("--timeout-minutes", type=int, default=10)
parser.add_argument("--log-interval", type=int, default=10)
parser.add_argument("--seed", type=int, default=1234)
parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
parser = deepspeed.add_config_arguments(parser)
args = parser.parse_args()
if not args.mock_data and (args.tokenizer is None or args.data_path is None):
    parser.error("--tokenizer and --data-path are required (or --mock-data for random token ids)")

accelerator = get_accelerator()  # CUDA on GPUs (nccl), the CPU accelerator (gloo) elsewhere
deepspeed.init_distributed(dist_backend=accelerator.communication_backend_name(),
                           timeout=datetime.timedelta(minutes=args.timeout_minutes))
accelerator.set_device(args.local_rank)
rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
with open(args.deepspeed_config) as f:
    ds_config = json.load(f)
tp = ds_config.get("tensor_parallel", {}).get("autotp_size", 1)
dp_rank = rank // tp  # the ranks of one tensor-parallel group read the same batch

config = AutoConfig.from_pretrained(args.model_config)
vocab = config.vocab_size if args.mock_data else len(AutoTokenizer.from_pretrained(args.tokenizer))
if vocab > config.vocab_size:
    raise SystemExit(f"tokenizer {args.tokenizer} has {vocab} tokens, more than the model's vocab_size {config.vocab_size}")
dtype = torch.bfloat16 if ds_config.get("bf16", {}).get("enabled") else torch.float16
if ds_config["zero_optimization"]["stage"] == 3:
    # Import the model's module first: imported inside zero.Init, which replaces torch.Tensor.__new__,
    # the torch._dynamo it imports (through transformers' masking_utils) fails ("Signature mismatch").
    MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    with deepspeed.zero.Init(config_dict_or_path=ds_config):
        model = AutoModelForCausalLM.from_config(config, torch_dtype=dtype)
else:
    model = AutoModelForCausalLM.from_config(config, torch_dtype=dtype)
if args.recompute == "full":
    # The plan's full recompute: each decoder layer's activations are recomputed in the backward.
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False

optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay, betas=(0.9, 0.95))
engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)

step = 0
if os.path.exists(os.path.join(args.checkpoint_dir, "latest")):
    _, state = engine.load_checkpoint(args.checkpoint_dir)
    step = (state or {}).get("step", 0)

mbs, accumulation = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
if rank == 0:
    print(f"DeepSpeed engine: ZeRO stage {engine.zero_optimization_stage()}, {dtype}, micro-batch {mbs} x "
          f"{accumulation} accumulation x {world // tp} data-parallel ranks, recompute {args.recompute}", flush=True)
if not args.mock_data:
    tokens = np.memmap(args.data_path, dtype=args.data_dtype, mode="r")
    if len(tokens) <= args.seq_length:
        raise SystemExit(f"{args.data_path}: {len(tokens)} tokens, fewer than one sequence of {args.seq_length}")


def batch(step, micro):
    """mbs windows of seq_length tokens, the same on every run for (step, micro, dp rank)."""
    rng = np.random.default_rng([args.seed, step, micro, dp_rank])
    if args.mock_data:
        return torch.from_numpy(rng.integers(0, vocab, size=(mbs, args.seq_length))).to(engine.device)
    starts = rng.integers(0, len(tokens) - args.seq_length, size=mbs)
    rows = np.stack([tokens[s:s + args.seq_length] for s in starts]).astype(np.int64)
    return torch.from_numpy(rows).to(engine.device)


engine.train()
start = time.perf_counter()
while step < args.train_iters:
    for micro in range(accumulation):
        ids = batch(step, micro)
        loss = engine(input_ids=ids, labels=ids).loss  # the model shifts the labels (next-token loss)
        engine.backward(loss)
        engine.step()
    step += 1
    if rank == 0 and step % args.log_interval == 0:
        seconds = (time.perf_counter() - start) / args.log_interval
        print(f"step {step} loss {loss.item():.4f} {seconds:.3f} s/step "
              f"{mbs * accumulation * world // tp * args.seq_length / seconds:,.0f} tokens/s", flush=True)
        start = time.perf_counter()
    if step % args.save_interval == 0 or step == args.train_iters:
        engine.save_checkpoint(args.checkpoint_dir, tag=f"step{step}", client_state={"step": step})
'''
