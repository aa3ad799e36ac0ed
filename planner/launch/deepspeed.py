"""DeepSpeed: ds_config.json (ZeRO stage, batch triplet, precision, buckets, AutoTP), the model's
Hugging Face config.json, train.py (ds_script.py: builds that model, turns on the plan's recompute,
trains and checkpoints it) and train.sh running train.py under torchrun.

Keys are those of DeepSpeed 0.19 (deepspeed/runtime/config.py, zero/config.py; §3 of
shared/reference/launch_formats.md). ds_config.json can carry ZeRO, the batch and AutoTP; a pipeline
(deepspeed.pipe.PipelineModule(num_stages=…)) and expert parallelism (deepspeed.moe.layer.MoE(ep_size=…))
are built by the training script, so those plans are refused here rather than half-emitted.
"""

from __future__ import annotations

import json

from cost_models.enums import Precision, Recompute, Zero
from cost_models.errors import LayoutError, SpecError
from planner.launch.ds_script import TRAIN_PY
from planner.launch.hf_config import hf_config
from planner.launch.shell import Raw, command
from planner.launch.slurm import environment_lines, script_head, torchrun_head
from planner.launch.target import CHECKPOINT_DIR_LINE, File, Target, check_single_axes, save_interval_lines

VERSION = "DeepSpeed 0.19 (checked against 0.19.8)"

# zero/config.py defaults (§3), written out so the file says what runs.
BUCKET_BYTES = 500_000_000  # reduce_bucket_size, allgather_bucket_size (elements, despite the name)
STAGE3 = {
    "stage3_prefetch_bucket_size": 50_000_000,
    "stage3_param_persistence_threshold": 100_000,
    "stage3_max_live_parameters": 1_000_000_000,
    "stage3_max_reuse_distance": 1_000_000_000,
    "stage3_gather_16bit_weights_on_model_save": True,
}


# Axes ds_config.json cannot carry above 1, with why ({} is the degree asked for).
SINGLE_AXES = {
    "pp": ("DeepSpeed's pipeline (pp={}) is built in the training script "
           "(deepspeed.pipe.PipelineModule(num_stages=…)), which ds_config.json cannot carry; use pp 1 or megatron"),
    "ep": ("DeepSpeed's expert parallel (ep={}) is set in the model code "
           "(deepspeed.moe.layer.MoE(ep_size=…)), which ds_config.json cannot carry; use ep 1 or megatron"),
}


def single_axes(target: Target) -> dict[str, str]:
    """The layout axes this launch runs only at 1, each with its refusal ({} the degree)."""
    return SINGLE_AXES


def check(target: Target) -> None:
    job = target.job
    lay = job.layout
    check_single_axes(target, single_axes(target))
    if lay.tp > 1 and job.zero is Zero.PARAMETERS:
        raise LayoutError(f"layout: DeepSpeed AutoTP training (tp={lay.tp}) runs with ZeRO 0, 1 or 2, not 3")
    if lay.dp_shard != job.dp:
        raise LayoutError(
            f"layout: DeepSpeed 0.19 shards over all of dp({job.dp}); sharding within groups of {lay.dp_shard} "
            "(MiCS) was removed (runtime/config.py _reject_removed_config_keys); drop --dp-shard"
        )
    if job.training.precision.low:
        raise SpecError(f"training: ds_config.json has no {job.training.precision} GEMM setting (it comes from Transformer "
                        "Engine in the model); use --dtype bf16")
    if job.training.tp_comm_overlap:
        raise SpecError("training: DeepSpeed AutoTP has no tp communication overlap; drop --tp-comm-overlap")


def ds_config(target: Target) -> dict[str, object]:
    check(target)
    job = target.job
    lay, tr = job.layout, job.training
    zero: dict[str, object] = {
        "stage": int(job.zero),  # ZeroStageEnum (zero/config.py L81-88)
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": BUCKET_BYTES,
        "allgather_bucket_size": BUCKET_BYTES,
    }
    if job.zero is Zero.PARAMETERS:
        zero |= STAGE3
    config: dict[str, object] = {
        # train_batch_size = micro-batch · accumulation · dp world size (runtime/config.py L925-985)
        "train_batch_size": tr.global_batch_size,
        "train_micro_batch_size_per_gpu": lay.mbs,
        "gradient_accumulation_steps": job.num_microbatches,
        "gradient_clipping": 1.0,
        "steps_per_print": 10,
    }
    if tr.precision is Precision.FP16:
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                          "hysteresis": 2, "min_loss_scale": 1}
    else:
        config["bf16"] = {"enabled": True}
    config["zero_optimization"] = zero
    if lay.tp > 1:
        config["tensor_parallel"] = {"autotp_size": lay.tp}  # AutoTP training (runtime/tensor_parallel/config.py)
    # Recompute is train.py's: model.gradient_checkpointing_enable() (--recompute full in train.sh).
    return config


# torch.distributed's timeout for the process group, minutes (the 10 of Megatron's default,
# DistributedInitConfig.distributed_timeout_minutes; torch's own NCCL default is also 10 minutes,
# torch/distributed/constants.py default_pg_nccl_timeout).
TIMEOUT_MINUTES = 10


def recompute_flag(target: Target) -> str:
    """train.py's --recompute: full turns on gradient checkpointing of every decoder layer; selective
    (core attention only) needs nothing, as the Hugging Face models run attention through PyTorch's
    fused scaled_dot_product_attention, which keeps no s x s scores to recompute."""
    return "full" if target.job.layout.recompute is Recompute.FULL else "none"


def fill_in(target: Target) -> list[str]:
    return [
        'TOKENIZER_MODEL="${TOKENIZER_MODEL:?set TOKENIZER_MODEL to the Hugging Face tokenizer (name or directory) the data was made with}"',
        'DATA_PATH="${DATA_PATH:?set DATA_PATH to a flat binary file of token ids (numpy dtype DATA_DTYPE)}"',
        CHECKPOINT_DIR_LINE,
        'DATA_DTYPE="${DATA_DTYPE:-uint32}"',
        "# Schedule and optimizer settings are not part of the plan; these are common defaults.",
        'TRAIN_ITERS="${TRAIN_ITERS:-1000}"',
        'LR="${LR:-3e-4}"',
        *save_interval_lines(target),
    ]


def files(target: Target) -> dict[str, File]:
    config = ds_config(target)
    model = hf_config(target.job.model)
    tr = target.job.training
    lines = [
        *script_head(target, f"DeepSpeed launch written by planner launch, for {VERSION}; DeepSpeed runs under torchrun.",
                     fill_in(target), run_name=False),
        *environment_lines(target),
        command([*torchrun_head(), Raw('"$LAUNCH_DIR/train.py"')], [
            ("--deepspeed",),
            ("--deepspeed_config", Raw('"$LAUNCH_DIR/ds_config.json"')),
            ("--model-config", Raw('"$LAUNCH_DIR/config.json"')),
            ("--tokenizer", Raw('"$TOKENIZER_MODEL"')),
            ("--data-path", Raw('"$DATA_PATH"')),
            ("--data-dtype", Raw('"$DATA_DTYPE"')),
            ("--checkpoint-dir", Raw('"$CHECKPOINT_DIR"')),
            ("--save-interval", Raw('"$SAVE_INTERVAL"')),
            ("--train-iters", Raw('"$TRAIN_ITERS"')),
            ("--lr", Raw('"$LR"')),
            ("--seq-length", tr.seq_len),
            ("--recompute", recompute_flag(target)),
            ("--timeout-minutes", TIMEOUT_MINUTES),
            (Raw('"$@"'),),
        ]),
        "",
    ]
    return {
        "ds_config.json": File(json.dumps(config, indent=2) + "\n"),
        "config.json": File(json.dumps(model, indent=2) + "\n"),
        "train.py": File(TRAIN_PY),
        "train.sh": File("\n".join(lines), executable=True),
    }
