"""Autograd's sums of the input gradients of separate projections reading one input (torchtitan's
wq, wk, wv and w1, w3): one add kernel per further gradient, reading two and writing one
(pytorch/pytorch@4537ef6c torch/csrc/autograd/input_buffer.cpp accumulate)."""

from __future__ import annotations

import pytest

from cost_models import kernels as K
from cost_models.calibration import DEFAULT as CAL
from cost_models.compute import dgrad_sum_seconds, elementwise_seconds
from cost_models.model_spec import LayerKind
from tests.helpers import GPT_TINY, LLAMA_TINY, make_job


def _job(model, framework: str, **training):
    return make_job(model, gpus=2, tp=2, sp=True, mbs=2, cluster="dgx-h100",
                    training=dict(seq_len=1024, global_batch_size=2, framework=framework, **training))


def _stream(job, moved: float, launches: int) -> float:
    gpu = job.cluster.gpu
    return moved / (gpu.hbm_bandwidth_bytes_per_s * K.table_for(gpu).stream_fraction) + launches * K.table_for(gpu).launch_s


def test_torchtitan_sums_three_gradients_of_a_llama_layers_inputs():
    """LLAMA_TINY under torchtitan at tp 2 with sequence parallelism, mbs 2 x 1024: the q, k, v
    gradients of the gathered norm output (2 adds) and the gate, up ones (1 add), each over the whole
    2048 tokens x 256 hidden on every tp rank (the sum comes before the reduce-scatter): 3 kernels x
    6 bytes x 524,288 elements = 9,437,184 bytes. Only the backward pays them."""
    job = _job(LLAMA_TINY, "torchtitan")
    assert dgrad_sum_seconds(job, LayerKind(), CAL) == pytest.approx(_stream(job, 9_437_184, 3), rel=1e-12)


def test_gelu_mlp_sums_only_the_attention_inputs():
    """GPT_TINY (one fc1, no gate) under torchtitan: the two q, k, v sums, 2 x 6 x 524,288 bytes."""
    job = _job(GPT_TINY, "torchtitan")
    assert dgrad_sum_seconds(job, LayerKind(), CAL) == pytest.approx(_stream(job, 6_291_456, 2), rel=1e-12)


def test_fused_projections_sum_nothing():
    """One fused qkv and one fused gate-up GEMM (Megatron by default, or fused_projections) write a
    single input gradient each: nothing to add."""
    assert dgrad_sum_seconds(_job(LLAMA_TINY, "megatron"), LayerKind(), CAL) == 0.0
    assert dgrad_sum_seconds(_job(LLAMA_TINY, "torchtitan", fused_projections=True), LayerKind(), CAL) == 0.0


def test_the_backward_carries_them():
    job = _job(LLAMA_TINY, "torchtitan")
    fused = _job(LLAMA_TINY, "torchtitan", fused_projections=True)
    extra = _stream(job, 9_437_184, 3)
    assert (elementwise_seconds(job, LayerKind(), backward=True, cal=CAL)
            - elementwise_seconds(fused, LayerKind(), backward=True, cal=CAL)) == pytest.approx(extra, rel=1e-9)
    assert elementwise_seconds(job, LayerKind(), backward=False, cal=CAL) == pytest.approx(
        elementwise_seconds(fused, LayerKind(), backward=False, cal=CAL), rel=1e-12)
