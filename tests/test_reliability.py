"""Checkpoint interval, time lost to failures, and time/cost to train (cost_models.reliability)."""

from __future__ import annotations

import math

import pytest

from cost_models.memory import memory_estimate
from cost_models.reliability import (
    DEFAULT_GPU_MTBF_HOURS,
    checkpoint_bytes_per_param,
    daly_interval,
    lost_fraction,
    reliability,
    training_cost,
    young_interval,
)
from planner.runners import build_job


def job(framework: str = "megatron", **layout):  # type: ignore[no-untyped-def]
    return build_job("llama-3.1-8b", "dgx-h100", 64, training=dict(seq_len=4096, global_batch_size=256, framework=framework),
                     layout=dict(tp=2, **layout))


@pytest.mark.parametrize(("write_s", "mtbf_s"), [(10.0, 3600.0), (60.0, 3 * 3600.0), (300.0, 1800.0)])
def test_daly_interval_minimises_the_time_lost(write_s, mtbf_s):
    """Daly's estimate is the optimum of the first-order loss to within its own error: moving the
    interval 20% either way never loses less than 0.5% of wall time less."""
    tau = daly_interval(write_s, mtbf_s)
    at = lost_fraction(tau, write_s, 0.0, mtbf_s)
    for other in (0.8 * tau, 1.2 * tau):
        assert lost_fraction(other, write_s, 0.0, mtbf_s) >= at - 0.005


def test_daly_tends_to_young_when_writes_are_short_and_is_the_mtbf_when_long():
    assert daly_interval(1.0, 1e6) == pytest.approx(young_interval(1.0, 1e6), rel=1e-3)
    assert daly_interval(5000.0, 2000.0) == 2000.0


def test_checkpoint_bytes_follow_the_framework_states():
    # Megatron bf16 with Adam: bf16 weights, fp32 master weights, two fp32 moments
    assert checkpoint_bytes_per_param(job("megatron", zero=1)) == 2 + 4 + 8
    # torchtitan FSDP2 keeps the fp32 parameters themselves, and the two moments
    assert checkpoint_bytes_per_param(job("torchtitan", zero=3)) == 4 + 8


def test_reliability_of_a_plan():
    j = job(zero=1)
    mem = memory_estimate(j)
    r = reliability(j, mem, gpu_mtbf_hours=DEFAULT_GPU_MTBF_HOURS, write_gb_per_s=100.0)
    assert r.checkpoint_bytes == j.model.params_total * 14
    assert r.write_s == pytest.approx(r.checkpoint_bytes / 100e9)
    assert r.cluster_mtbf_s == pytest.approx(DEFAULT_GPU_MTBF_HOURS * 3600 / 64)
    # one GPU's share: its weights, master weights and moments, less than the whole and more than 1/64 of it
    assert r.checkpoint_bytes / 64 <= r.checkpoint_bytes_per_gpu < r.checkpoint_bytes
    assert 0 < r.lost_fraction < 0.05


def test_training_cost_stretches_by_the_time_lost():
    c = training_cost(1e12, tokens_per_s=1e6, gpus=100, lost=0.2, gpu_hour_cost=2.0)
    seconds = 1e12 / 1e6 / 0.8
    assert c.days == pytest.approx(seconds / 86400)
    assert c.gpu_hours == pytest.approx(seconds * 100 / 3600)
    assert c.cost == pytest.approx(c.gpu_hours * 2.0)
    assert math.isinf(training_cost(1.0, 1.0, 1, 1.0).days)


def test_estimate_reports_time_to_train_and_the_checkpoint_plan():
    import json

    from typer.testing import CliRunner

    from planner.cli import app

    args = ["estimate", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "16", "--tp", "2", "--json",
            "--tokens", "1e12", "--gpu-hour-cost", "2", "--ckpt-write-gbps", "50", "--gpu-mtbf-hours", "10000"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    ck, tt = doc["checkpoint"], doc["time_to_train"]
    assert ck["write_s"] == pytest.approx(ck["checkpoint_bytes"] / 50e9)
    assert ck["cluster_mtbf_h"] == pytest.approx(10000 / 16)
    days = 1e12 / doc["throughput"]["tokens_per_s"] / (1 - ck["lost_fraction"]) / 86400
    assert tt["days"] == pytest.approx(days)
    assert tt["cost"] == pytest.approx(days * 24 * 16 * 2)
    bad = CliRunner().invoke(app, ["estimate", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "16", "--tokens", "0"])
    assert bad.exit_code == 2 and "--tokens(0.0) must be a positive finite number" in bad.output
