"""RMSNorm as torch's fused F.rms_norm kernel (TrainingSpec.fused_rms_norm: nn.RMSNorm with the
weight in the input's dtype, pytorch/pytorch@3de78edb aten/src/ATen/native/layer_norm.cpp
rms_norm_symint) against the eager chain of 6 kernels."""

from __future__ import annotations

import pytest

from cost_models import kernels as K
from cost_models.calibration import DEFAULT as CAL
from cost_models.compute import Impl, _impl, _op_seconds
from planner import presets
from planner.validate.slices import native_job
from tests.helpers import LLAMA_TINY, make_job


def _job(**training):
    return make_job(LLAMA_TINY, gpus=1, mbs=2, cluster="dgx-h100",
                    training=dict(seq_len=1024, global_batch_size=2, framework="torchtitan", **training))


def test_the_fused_kernel_moves_the_compulsory_bytes_at_its_measured_rate():
    """2048 tokens x 256 hidden = 524,288 elements. Fused forward: read x, write y, 4 bytes each,
    2,097,152 bytes at norm.torch.fwd 0.56 of H100's HBM, one kernel; backward 6 bytes each
    (3,145,728) at 0.24. The chain: 36 bytes each forward in 6 kernels, twice that backward, at the
    stream fraction. The measured fractions are benchmarks/data/measured/h100-kernels-2026-11-27.json's
    F.rms_norm (1.90 TB/s forward, 0.84 backward alone, of 3.35)."""
    fused, chain = _job(fused_rms_norm=True), _job()
    gpu = fused.cluster.gpu
    bw = gpu.hbm_bandwidth_bytes_per_s
    launch = K.table_for(gpu).launch_s
    assert _impl(fused, "norm") is Impl.TORCH and _impl(chain, "norm") is Impl.EAGER
    assert _op_seconds(fused, "norm", 524_288, False, CAL) == pytest.approx(2_097_152 / (bw * 0.56) + launch, rel=1e-12)
    assert _op_seconds(fused, "norm", 524_288, True, CAL) == pytest.approx(3_145_728 / (bw * 0.24) + launch, rel=1e-12)
    stream = K.table_for(gpu).stream_fraction
    assert _op_seconds(chain, "norm", 524_288, False, CAL) == pytest.approx(
        524_288 * 36 / (bw * stream) + 6 * launch, rel=1e-12)


def test_validate_prices_its_fsdp2_worker_with_the_fused_norm():
    """The worker's Norm calls F.rms_norm on FSDP2's 16-bit parameters (zero > 0); under DDP (zero
    0) the weight stays fp32 and the flag stays off."""
    model, cluster = presets.models()["llama-3.1-8b"], presets.clusters()["dgx-h100"]
    job, _ = native_job(model, cluster, 8, {"seq_len": 4096, "framework": "torchtitan"}, {"tp": 2, "zero": 3})
    assert job.training.fused_rms_norm
    job, _ = native_job(model, cluster, 8, {"seq_len": 4096, "framework": "torchtitan"}, {"zero": 0})
    assert not job.training.fused_rms_norm
