"""Runs a DeepSpeed train.py (argv[1], with its arguments after it) and counts what it did, for
tests/test_launch_deepspeed_run.py: the forward calls of every decoder layer, split into those made
inside DeepSpeedEngine.backward (activation recompute) and outside it, the optimizer steps, and the
ZeRO stage the engine reports, and the built model's type and sliding window. Writes them as JSON to $COUNTS_OUT when the script ends.

A layer's forward is counted by a pre-hook on its MLP, which the forward calls: transformers
checkpoints the layer's `forward`, not its `__call__`, so hooks on the layer itself stay outside the
checkpoint and fire once (transformers v5 modeling_layers.py GradientCheckpointingLayer.__init_subclass__),
while the MLP inside is called again when the backward recomputes the layer. A pre-hook, not a forward
hook: torch's non-reentrant checkpoint stops the recompute once the last saved tensor is rebuilt
(torch.utils.checkpoint set_checkpoint_early_stop, on by default), inside the MLP, before its forward
hook would run."""

import atexit
import json
import os
import runpy
import sys

import deepspeed
import transformers
from deepspeed.runtime.engine import DeepSpeedEngine

counts = {"forward": 0, "forward_in_backward": 0, "layers": 0, "steps": 0, "zero_stage": None, "model_type": None,
          "sliding_window": None}
in_backward = [False]


def count(module, args):
    counts["forward_in_backward" if in_backward[0] else "forward"] += 1


build = transformers.AutoModelForCausalLM.from_config


def from_config(*args, **kwargs):
    model = build(*args, **kwargs)
    layers = model.model.layers  # the decoder layers of the Hugging Face causal LMs
    counts["layers"] = len(layers)
    counts["model_type"] = model.config.model_type
    counts["sliding_window"] = getattr(model.config, "sliding_window", None)  # what the attention masks read
    for layer in layers:
        layer.mlp.register_forward_pre_hook(count)
    return model


backward = DeepSpeedEngine.backward


def counted_backward(self, *args, **kwargs):
    in_backward[0] = True
    try:
        return backward(self, *args, **kwargs)
    finally:
        in_backward[0] = False


initialize = deepspeed.initialize


def counted_initialize(*args, **kwargs):
    out = initialize(*args, **kwargs)
    counts["zero_stage"] = out[0].zero_optimization_stage()
    step = out[0].step

    def counted_step(*a, **k):
        result = step(*a, **k)
        counts["steps"] = out[0].global_steps  # optimizer steps taken (at accumulation boundaries)
        return result

    out[0].step = counted_step
    return out


transformers.AutoModelForCausalLM.from_config = from_config
# DeepSpeed's CPU accelerator compiles its shared-memory all-reduce (deepspeed_shm_comm, a C++ build of
# a minute) when the process group starts; one rank never uses it. Marked incompatible, it is skipped
# (deepspeed/comm/torch.py build_shm_op, DeepSpeed v0.19.8), and the test needs no compiler.
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
DeepSpeedEngine.backward = counted_backward
deepspeed.initialize = counted_initialize


@atexit.register
def write():
    with open(os.environ["COUNTS_OUT"], "w") as f:
        json.dump(counts, f)


sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
