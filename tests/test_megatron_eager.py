"""Megatron's fused bias-dropout-add: the bytes its kernels move (Megatron-LM@903f746c and
@bbab79f8, the code of Narayanan et al. 2021 and Korthikanti et al. 2022)."""

from __future__ import annotations

import pytest

from cost_models import compute
from cost_models import kernels as K
from cost_models.calibration import DEFAULT as CAL
from cost_models.compute import elementwise_seconds
from cost_models.model_spec import LayerKind
from tests.helpers import GPT_TINY, make_job


def _job(framework: str):
    return make_job(GPT_TINY, gpus=1, mbs=2, cluster="dgx-a100-80gb",
                    training=dict(seq_len=1024, global_batch_size=2, framework=framework, attention="eager", precision="fp16"))


def _stream(job, moved: float, launches: int) -> float:
    gpu = job.cluster.gpu
    return moved / (gpu.hbm_bandwidth_bytes_per_s * K.table_for(gpu).stream_fraction) + launches * K.table_for(gpu).launch_s


def test_megatron_fuses_bias_dropout_and_residual_add_in_the_forward(monkeypatch):
    """Per block, the fused kernel reads the output and the residual and writes the sum and a 1-byte
    mask (7 bytes an element) where dropout (5) and the add (6) move 11 in two kernels. GPT_TINY at
    mbs 2 x 1024: 2 blocks x 4 bytes x 256 hidden x 2048 tokens = 4,194,304 bytes and 2 kernels
    fewer forward; the backward is unchanged."""
    job = _job("megatron")
    fused_f = elementwise_seconds(job, LayerKind(), backward=False, cal=CAL)
    fused_b = elementwise_seconds(job, LayerKind(), backward=True, cal=CAL)
    monkeypatch.setattr(compute, "fused_bias_dropout_add", lambda job: False)
    job = _job("megatron")  # a fresh job: no memoised prices
    assert elementwise_seconds(job, LayerKind(), backward=False, cal=CAL) - fused_f == pytest.approx(_stream(job, 4_194_304, 2), rel=1e-9)
    assert elementwise_seconds(job, LayerKind(), backward=True, cal=CAL) == pytest.approx(fused_b, rel=1e-12)


def test_other_frameworks_run_dropout_and_the_add_apart():
    """DeepSpeed (Megatron's layers under DeepSpeed's engine, or Hugging Face's): the unfused pair."""
    assert not compute.fused_bias_dropout_add(_job("deepspeed"))
