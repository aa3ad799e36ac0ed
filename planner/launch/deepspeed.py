"""DeepSpeed: ds_config.json (ZeRO stage, batch triplet, precision, buckets, AutoTP) and train.sh
running the user's training script under torchrun with `--deepspeed --deepspeed_config`.

Keys are those of DeepSpeed 0.19 (deepspeed/runtime/config.py, zero/config.py; §3 of
shared/reference/launch_formats.md). ds_config.json can carry ZeRO, the batch and AutoTP; a pipeline
(deepspeed.pipe.PipelineModule(num_stages=…)) and expert parallelism (deepspeed.moe.layer.MoE(ep_size=…))
are built by the training script, so those plans are refused here rather than half-emitted.
"""

from __future__ import annotations

import json

from cost_models.enums import Precision, Recompute, Zero
from cost_models.errors import SpecError
from planner.launch.shell import Raw, command
from planner.launch.slurm import script_head, torchrun_head
from planner.launch.target import File, Target

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


def check(target: Target) -> None:
    job = target.job
    lay = job.layout
    if lay.pp > 1:
        raise SpecError(
            f"layout: DeepSpeed's pipeline (pp={lay.pp}) is built in the training script "
            "(deepspeed.pipe.PipelineModule(num_stages=…)), which ds_config.json cannot carry; use pp 1 or megatron"
        )
    if lay.ep > 1:
        raise SpecError(
            f"layout: DeepSpeed's expert parallel (ep={lay.ep}) is set in the model code "
            "(deepspeed.moe.layer.MoE(ep_size=…)), which ds_config.json cannot carry; use ep 1 or megatron"
        )
    if lay.tp > 1 and job.zero is Zero.PARAMETERS:
        raise SpecError(f"layout: DeepSpeed AutoTP training (tp={lay.tp}) runs with ZeRO 0, 1 or 2, not 3")
    if lay.dp_shard != job.dp:
        raise SpecError(
            f"layout: DeepSpeed 0.19 shards over all of dp({job.dp}); sharding within groups of {lay.dp_shard} "
            "(MiCS) was removed (runtime/config.py _reject_removed_config_keys); drop --dp-shard"
        )
    if job.training.precision is Precision.FP8:
        raise SpecError("training: ds_config.json has no fp8 GEMM setting (it comes from Transformer Engine in the model); use --dtype bf16")
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
    if lay.recompute is Recompute.FULL:
        # Read by deepspeed.checkpointing.checkpoint, which the script wraps each layer in.
        config["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False,
                                              "cpu_checkpointing": False}
    return config


FILL_IN = [
    "# A training script that calls deepspeed.initialize(…, config=args.deepspeed_config) and",
    "# accepts DeepSpeed's --deepspeed/--deepspeed_config (deepspeed.add_config_arguments).",
    'TRAIN_SCRIPT="${TRAIN_SCRIPT:?set TRAIN_SCRIPT to your training script}"',
]


def files(target: Target) -> dict[str, File]:
    config = ds_config(target)
    lines = [
        *script_head(target, f"DeepSpeed launch written by planner launch, for {VERSION}; DeepSpeed runs under torchrun.",
                     FILL_IN, run_name=False),
        command([*torchrun_head(), Raw('"$TRAIN_SCRIPT"')], [
            ("--deepspeed",),
            ("--deepspeed_config", Raw('"$LAUNCH_DIR/ds_config.json"')),
            (Raw('"$@"'),),
        ]),
        "",
    ]
    return {
        "ds_config.json": File(json.dumps(config, indent=2) + "\n"),
        "train.sh": File("\n".join(lines), executable=True),
    }
