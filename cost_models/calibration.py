"""The numbers of the time model that are not read off a kernel or collective measurement.

Two kinds:

1. Mechanism constants fitted on published end-to-end runs (MECHANISMS), each a quantity one
   could measure on a cluster, with its prior, its source and its bounds. benchmarks/time_accuracy.py
   fits them (`--fit`) and judges them by leave-one-source-out refits; docs/accuracy.md prints each
   one's value and the runs it was fitted on. DEFAULT carries the all-source fit.
2. Corrections to the kernel prices measured on a user's own GPUs, 1.0 unless a calibration file
   says otherwise. `planner validate --calibrate FILE` measures a slice of a plan on the user's
   machine and writes the multipliers that make the model match it, per GPU architecture
   (GPUSpec.architecture):

- gemm_scale: on the tensor-core rate of every GEMM;
- attention_scale: on the fused attention kernels' rates;
- memory_scale: on the bandwidth of the memory-bound kernels of a layer (norms, activations, loss,
  FSDP2's copies around its collectives, Megatron's unfused gradient accumulation);
- optimizer_scale: on the bandwidth of the optimizer step.

`--calibration FILE` loads such a file for plan/estimate/sweep: a JSON object with any of these
fields as {"architecture": value} objects ("default" applies to every architecture not named).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import Any

from cost_models.errors import SpecError

# The range of a kernel-price correction: a CPU run of validate --calibrate measures rates ~1e-4 of
# a GPU's (a few hundred GFLOP/s against hundreds of TFLOP/s), and no measurement is 1000x faster
# than the published kernel tables; beyond these a factor is a broken file, not a measurement.
SCALE_RANGE = (1e-6, 1e3)

PER_ARCHITECTURE = ("gemm_scale", "attention_scale", "memory_scale", "optimizer_scale")
DEFAULT_ARCH = "default"


def _table() -> Any:
    return field(default_factory=dict)


@dataclass(frozen=True)
class Prior:
    """A mechanism constant's value before any end-to-end fit, the range a fit may explore, and
    where the prior comes from. `unpinned` says why the published runs cannot fit it, where they
    cannot: such a constant stays at its prior in every fit."""

    value: float
    low: float
    high: float
    source: str
    unpinned: str = ""
    what: str = ""  # the mechanism in a few words, for the docs' table


MECHANISMS: dict[str, Prior] = {
    # Compute slowed per second of NCCL traffic hiding behind it, as a multiple of the share of SMs
    # NCCL's channels hold (comm.nccl_sm_share): 1 when a channel's SM is simply lost to the kernel
    # beside it (24 channels of 132 H100 SMs slow it by 22%); more when the collective's HBM traffic
    # slows the kernels beside it too (NVIDIA/nccl#1428: a GEMM 1.76x slower beside an NVLink
    # all-gather on A100). Bounds: arXiv 2507.03114 measured overlapped compute on A100 and H100
    # 18.9% slower on average and at most 40% (about 1x and 2x the SM share).
    # Not fitted: the published runs do not pin it. Fitted, it moved over the grid as mechanisms
    # unrelated to overlap changed a few rows, its leave-one-source-out fits spread over much of the
    # range and neighbouring grid points scored alike, so which one won decided other sources' errors.
    "contention_scale": Prior(1.0, 0.5, 2.0, "1: an NCCL channel holds one SM (src/device/common.h); 2507.03114: 18.9% mean, 40% max slowdown",
                              unpinned="the runs leave it unpinned",
                              what="compute slowdown beside overlapped NCCL traffic, as a multiple of the SMs its channels hold"),
    # Spread of the sustained compute speed across the GPUs of a job (silicon lottery and uneven
    # cooling: each die settles at its own clock under the power limit), as a coefficient of
    # variation. Every GPU waits for the slowest at each synchronisation (step_time.straggler_s).
    # Prior: ml-engineering compute/accelerator/README.md "Not all accelerators are created equal":
    # "5% and higher" spread of matmul TFLOPS between the GPUs of one 8-GPU node; the expected
    # range of 8 normal draws is 2.85 standard deviations, so cv = 0.05 / 2.85 = 0.0175. The fit may
    # go from none to twice that.
    "gpu_speed_cv": Prior(0.0175, 0.0, 0.035, "ml-engineering 'Not all accelerators are created equal': 5%+ spread on one 8-GPU node (cv = 0.05 / 2.85)",
                          what="spread of sustained compute speed across a job's GPUs (coefficient of variation)"),
}


@dataclass(frozen=True)
class Calibration:
    gemm_scale: Mapping[str, float] = _table()
    attention_scale: Mapping[str, float] = _table()
    memory_scale: Mapping[str, float] = _table()
    optimizer_scale: Mapping[str, float] = _table()
    contention_scale: float = MECHANISMS["contention_scale"].value
    gpu_speed_cv: float = MECHANISMS["gpu_speed_cv"].value
    source: str = "published kernel measurements (presets/kernels), no correction"

    @cached_property
    def key(self) -> str:
        """A stable identity for memoising per-job results computed with these constants."""
        return json.dumps(self.to_json(), sort_keys=True)

    def scale(self, name: str, architecture: str) -> float:
        table = getattr(self, name)
        if architecture in table:
            return table[architecture]
        return table.get(DEFAULT_ARCH, 1.0)

    def to_json(self) -> dict[str, Any]:
        return {f.name: (dict(v) if isinstance(v := getattr(self, f.name), Mapping) else v) for f in fields(self)}

    def with_values(self, **values: float) -> Calibration:
        """Replace entries: mechanism constants by name, per-architecture ones as `gemm_scale__hopper=0.9`."""
        changes: dict[str, Any] = {}
        for key, value in values.items():
            name, _, arch = key.partition("__")
            if name in MECHANISMS and not arch:
                changes[name] = value
                continue
            assert name in PER_ARCHITECTURE and arch, key
            table = dict(changes.get(name, getattr(self, name)))
            table[arch] = value
            changes[name] = table
        return replace(self, **changes)

    @classmethod
    def fitted_fields(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls) if f.name != "source")


# The all-source fit of benchmarks/time_accuracy.py (255 published runs, 11 sources; fit sets in
# docs/accuracy.md). tests/test_accuracy.py re-runs the fit and checks these values.
FITTED = {"contention_scale": 1.0, "gpu_speed_cv": 0.0306}
DEFAULT = Calibration(**FITTED, source="published kernel measurements (presets/kernels); mechanism constants fitted by benchmarks/time_accuracy.py")


def calibration_from_dict(data: Any, *, where: str) -> Calibration:
    """A calibration file's contents (read by planner.files.load_calibration); unknown keys and
    factors outside SCALE_RANGE are user errors."""
    if not isinstance(data, dict):
        raise SpecError(f"{where}: expected a JSON object with {', '.join(Calibration.fitted_fields())}")
    allowed = set(Calibration.fitted_fields()) | {"source"}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise SpecError(f"{where}: unknown field(s) {unknown}; allowed: {sorted(allowed)}")
    values: dict[str, float] = {}
    for name in Calibration.fitted_fields():
        if name not in data:
            continue
        given = data[name]
        if name in MECHANISMS:
            prior = MECHANISMS[name]
            if isinstance(given, bool) or not isinstance(given, (int, float)) or not prior.low <= given <= prior.high:
                raise SpecError(f"{where}: {name}({given!r}) must be a number in [{prior.low}, {prior.high}]")
            values[name] = float(given)
            continue
        if not isinstance(given, dict):
            raise SpecError(f"{where}: {name} must be an object of architecture -> factor, e.g. {{\"hopper\": 0.9}}")
        for arch, value in given.items():
            key = f"{name}__{arch}"
            low, high = SCALE_RANGE
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
                raise SpecError(f"{where}: {name}.{arch}({value!r}) must be a number in [{low:g}, {high:g}]")
            values[key] = float(value)
    cal = DEFAULT.with_values(**values)
    source = data.get("source", where)
    if not isinstance(source, str):
        raise SpecError(f"{where}: source({source!r}) must be a string")
    return replace(cal, source=source)
