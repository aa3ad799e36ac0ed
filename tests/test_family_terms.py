"""Prices of the GPT-OSS and Llama 4 attention and MLP details: the clamped SwiGLU, attention sinks,
Llama 4's q/k L2 norm and NoPE temperature scaling. Each term hand-worked on a small shape, and its
direction on the full model."""

from __future__ import annotations

import pytest

from cost_models import kernels as K
from cost_models.activations import layer_activations
from cost_models.calibration import Calibration
from cost_models.compute import elementwise_seconds
from cost_models.enums import Recompute
from cost_models.model_spec import LayerKind
from cost_models.step_time import time_estimate
from planner import presets
from tests.helpers import LLAMA_TINY, make_job

CAL = Calibration()
CLAMPED = LLAMA_TINY.model_copy(update={"name": "clamped-tiny", "swiglu_limit": 7.0})


def _elementwise(spec, framework, backward=False, **training):
    job = make_job(spec, gpus=1, mbs=2, training=dict(seq_len=1024, global_batch_size=2, framework=framework, **training))
    return job, elementwise_seconds(job, LayerKind(), backward=backward, cal=CAL)


@pytest.mark.parametrize("framework, backward, moved, launches", [
    # eager (DeepSpeed + transformers GptOssExperts): 22 bytes and 5 kernels more per ffn element
    # forward, twice that backward
    ("deepspeed", False, 22, 5), ("deepspeed", True, 44, 10),
    # Megatron: two torch clamps and a cat ahead of the fused kernel (16 bytes, 3 kernels); backward
    # the clamps' gradients (12 bytes, 2 kernels)
    ("megatron", False, 16, 3), ("megatron", True, 12, 2),
])
def test_clamped_swiglu_moves_its_clamps_bytes(framework, backward, moved, launches):
    """LLAMA_TINY's MLP is 688 wide: tokens 2·1024 = 2048, ffn elements 2048·688 = 1,409,024 on one
    GPU. The clamped model's memory-bound time exceeds plain SwiGLU's by those elements times the
    bytes above at the stream fraction of HBM bandwidth, plus the kernels' start-up."""
    job, clamped = _elementwise(CLAMPED, framework, backward)
    _, plain = _elementwise(LLAMA_TINY, framework, backward)
    gpu = job.cluster.gpu
    elements = 2 * 1024 * 688
    expected = elements * moved / (gpu.hbm_bandwidth_bytes_per_s * K.table_for(gpu).stream_fraction) + launches * K.table_for(gpu).launch_s
    assert clamped - plain == pytest.approx(expected, rel=1e-9)  # float sums of the same terms


def test_compiled_clamps_fuse_into_the_activation():
    """torch.compile fuses the clamps into one kernel with SwiGLU's compulsory bytes: no difference."""
    _, clamped = _elementwise(CLAMPED, "torchtitan", compile=True)
    _, plain = _elementwise(LLAMA_TINY, "torchtitan", compile=True)
    assert clamped == plain


@pytest.mark.parametrize("framework, widths", [("megatron", 2), ("deepspeed", 3)])
def test_clamped_swiglu_keeps_its_clamps_inputs(framework, widths):
    """Saved for backward beyond SwiGLU: Megatron's clamps keep fc1's two halves (2 widths), the
    eager chain the clamps' inputs, the sigmoid, up + 1 (3 more than eager SwiGLU): 2048 tokens x
    688 x widths x 2 bytes (5,636,096 bytes for 2 widths)."""
    job = make_job(CLAMPED, gpus=1, mbs=2, training=dict(seq_len=1024, global_batch_size=2, framework=framework))
    plain = make_job(LLAMA_TINY, gpus=1, mbs=2, training=dict(seq_len=1024, global_batch_size=2, framework=framework))
    extra = layer_activations(job, 0, Recompute.NONE).total - layer_activations(plain, 0, Recompute.NONE).total
    assert extra == 2048 * 688 * widths * 2


@pytest.mark.parametrize("framework", ["megatron", "deepspeed"])
def test_gpt_oss_is_slower_than_with_plain_swiglu(framework):
    """gpt-oss-20b on 8 GPUs (ep 8): the clamps' bytes make its step slower than the same model with
    an unclamped SwiGLU, and by less than 10%: the clamps move at most 66 bytes per expert ffn
    element over forward and backward (eager) where the experts' GEMMs do 6·h = 17,280 FLOPs."""
    oss = presets.models()["gpt-oss-20b"]
    plain = oss.model_copy(update={"swiglu_limit": None})
    steps = []
    for spec in (oss, plain):
        job = make_job(spec, gpus=8, ep=8, mbs=1, zero=1, training=dict(seq_len=4096, global_batch_size=64, framework=framework,
                                                                           attention="eager" if framework == "deepspeed" else "flash"))
        steps.append(time_estimate(job).step_s)
    assert steps[1] < steps[0] < steps[1] * 1.10
