"""Time to train, what it costs, and how often to checkpoint.

A run of N GPUs fails about every MTBF_gpu / N (failures of independent GPUs add up). Writing a
checkpoint of S bytes at an aggregate write bandwidth W stalls training for δ = S / W (W defaults to Llama 3's storage bandwidth per GPU times the GPUs). The interval
τ between checkpoints that minimises the expected time lost is Daly's higher-order estimate of
Young's optimum:

    Young 1974:  τ = sqrt(2·δ·M)
    Daly 2006:   τ = sqrt(2·δ·M)·[1 + (1/3)·sqrt(δ/(2M)) + (1/9)·(δ/(2M))] − δ     for δ < 2M,   else τ = M

(J. W. Young, "A first order approximation to the optimum checkpoint interval", CACM 17(9), 1974;
J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps", FGCS
22(3), 2006, eq. 37.) The fraction of wall time lost is, to first order, the checkpoint writes
plus, per failure, half an interval of lost work and the restart (reading the checkpoint back):

    lost = δ/(τ + δ) + (τ/2 + R)/M,   R = S / W (read at the write bandwidth)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cost_models.job import Job
from cost_models.memory import MemoryEstimate
from cost_models.states import state_parts

HOUR = 3600.0
DAY = 24 * HOUR

# Llama 3 405B pre-training: 419 unexpected interruptions in a 54-day snapshot on 16,384 H100 GPUs
# (Llama Team 2024, "The Llama 3 Herd of Models", Sec. 3.3.4 and Table 5). Taking every interruption
# as one GPU-attributable failure gives a per-GPU MTBF of 54·24·16,384/419 ≈ 50,700 hours.
LLAMA3_SNAPSHOT_DAYS = 54
LLAMA3_GPUS = 16384
LLAMA3_UNEXPECTED_INTERRUPTIONS = 419
DEFAULT_GPU_MTBF_HOURS = LLAMA3_SNAPSHOT_DAYS * 24 * LLAMA3_GPUS / LLAMA3_UNEXPECTED_INTERRUPTIONS
# Meta's Tectonic file system serves Llama 3 checkpoints at a sustained 2 TB/s (peak 7 TB/s)
# (Llama Team 2024, Sec. 3.3.1 "Storage"), for the 16,384 GPUs of the 405B run: the default write
# bandwidth of a cluster is that per-GPU share times its GPUs.
LLAMA3_CKPT_WRITE_GB_PER_S = 2000.0
DEFAULT_CKPT_WRITE_GB_PER_S_PER_GPU = LLAMA3_CKPT_WRITE_GB_PER_S / LLAMA3_GPUS


def default_write_gb_per_s(gpus: int) -> float:
    return DEFAULT_CKPT_WRITE_GB_PER_S_PER_GPU * gpus

CHECKPOINTED = ("weights", "master_weights", "optimizer_states")  # gradients are not saved


def checkpoint_bytes_per_param(job: Job) -> int:
    """Bytes a checkpoint holds per parameter: the weights (16-bit, or fp32 where the framework keeps
    them so), fp32 master weights where kept apart, and the optimizer's moments."""
    tr = job.training
    parts = state_parts(tr.framework, tr.precision, tr.optimizer, job.zero)
    return sum(parts[name][0] for name in CHECKPOINTED)


def young_interval(write_s: float, mtbf_s: float) -> float:
    return math.sqrt(2 * write_s * mtbf_s)


def daly_interval(write_s: float, mtbf_s: float) -> float:
    if write_s >= 2 * mtbf_s:
        return mtbf_s
    x = write_s / (2 * mtbf_s)
    return math.sqrt(2 * write_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - write_s


def lost_fraction(interval_s: float, write_s: float, restart_s: float, mtbf_s: float) -> float:
    """Expected fraction of wall time lost to checkpoint writes, re-done work and restarts."""
    return min(1.0, write_s / (interval_s + write_s) + (interval_s / 2 + restart_s) / mtbf_s)


@dataclass(frozen=True)
class Reliability:
    checkpoint_bytes: int  # the whole model and optimizer state, once
    checkpoint_bytes_per_gpu: int  # the largest share one GPU writes
    write_s: float
    cluster_mtbf_s: float
    interval_s: float  # Daly's optimum
    young_interval_s: float
    lost_fraction: float
    gpu_mtbf_hours: float
    write_gb_per_s: float

    def to_json(self) -> dict[str, Any]:
        return {
            "checkpoint_bytes": self.checkpoint_bytes,
            "checkpoint_bytes_per_gpu": self.checkpoint_bytes_per_gpu,
            "write_s": self.write_s,
            "cluster_mtbf_h": self.cluster_mtbf_s / HOUR,
            "interval_min": self.interval_s / 60,
            "young_interval_min": self.young_interval_s / 60,
            "lost_fraction": self.lost_fraction,
            "assumptions": {"gpu_mtbf_h": self.gpu_mtbf_hours, "write_gb_per_s": self.write_gb_per_s},
        }


def reliability(job: Job, memory: MemoryEstimate, *, gpu_mtbf_hours: float = DEFAULT_GPU_MTBF_HOURS,
                write_gb_per_s: float | None = None) -> Reliability:
    write_gb_per_s = write_gb_per_s or default_write_gb_per_s(job.gpus)
    per_param = checkpoint_bytes_per_param(job)
    total = job.model.params_total * per_param
    per_gpu = max(
        sum(int(s.breakdown.value(f"model_states/{name}")) for name in CHECKPOINTED) for s in memory.stages
    )
    write_s = total / (write_gb_per_s * 1e9)
    mtbf_s = gpu_mtbf_hours * HOUR / job.gpus
    tau = daly_interval(write_s, mtbf_s)
    return Reliability(
        checkpoint_bytes=total,
        checkpoint_bytes_per_gpu=per_gpu,
        write_s=write_s,
        cluster_mtbf_s=mtbf_s,
        interval_s=tau,
        young_interval_s=young_interval(write_s, mtbf_s),
        lost_fraction=lost_fraction(tau, write_s, write_s, mtbf_s),
        gpu_mtbf_hours=gpu_mtbf_hours,
        write_gb_per_s=write_gb_per_s,
    )


@dataclass(frozen=True)
class TrainingCost:
    tokens: float
    days: float  # wall-clock, failures and checkpoints included
    gpu_hours: float
    cost: float | None  # in the currency of gpu_hour_cost

    def to_json(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "days": self.days, "gpu_hours": self.gpu_hours, "cost": self.cost}


def training_cost(tokens: float, tokens_per_s: float, gpus: int, lost: float, gpu_hour_cost: float | None = None) -> TrainingCost:
    """Days and GPU-hours to train `tokens` at a step's throughput, stretched by the time lost."""
    seconds = tokens / tokens_per_s / (1 - lost) if lost < 1 else math.inf
    gpu_hours = seconds * gpus / HOUR
    return TrainingCost(tokens, seconds / DAY, gpu_hours, None if gpu_hour_cost is None else gpu_hours * gpu_hour_cost)
