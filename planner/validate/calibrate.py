"""`planner validate --calibrate FILE`: fit per-GPU corrections of the kernel prices to measured steps.

Starting point: the multipliers in use (none, or a --calibration file). They are refitted for the
GPU architecture of the slice's cluster:

1. optimizer_scale, from the optimizer step: the model prices it as bytes moved over a fraction of
   HBM bandwidth (cost_models.compute.optimizer_time), so the fitted value is the current one times
   predicted/measured;
2. one common factor on gemm_scale, attention_scale and memory_scale (every kernel class of the
   forward and backward passes), found by bisection so that the predicted compute time equals the
   measured one (predicted compute falls monotonically as the factor grows). One factor, not three:
   a step's compute time alone cannot tell the classes apart.

The fit uses the first half of the timed steps; the error before and after is reported on the
second half (held-out steps), so the improvement is not the fit's own residual. The file written is
a complete calibration (every constant, per-architecture tables included) that
`planner.files.load_calibration` reads for `plan`/`estimate --calibration`.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, replace
from datetime import date
from pathlib import Path
from typing import Any

from cost_models.calibration import Calibration
from cost_models.job import Job
from cost_models.step_time import time_estimate

SCALE_RANGE = (1e-7, 1e3)  # bisection bounds on the efficiency factor
BISECTION_STEPS = 80  # halvings of log(range): far below 1e-9 relative error


@dataclass(frozen=True)
class Fit:
    calibration: Calibration
    fit_steps: int
    held_out_steps: int
    before: dict[str, float]  # relative error on held-out steps with the starting constants
    after: dict[str, float]  # ... with the fitted ones
    values: dict[str, float]  # the refitted constants

    def to_json(self) -> dict[str, Any]:
        return {"fit_steps": self.fit_steps, "held_out_steps": self.held_out_steps, "error_before": self.before,
                "error_after": self.after, "fitted": self.values, "source": self.calibration.source}


def _compute_s(job: Job, cal: Calibration) -> float:
    return float(time_estimate(job, calibration=cal).breakdown.value("compute"))


def _scaled(cal: Calibration, arch: str, factor: float, base: Calibration) -> Calibration:
    return cal.with_values(**{
        f"gemm_scale__{arch}": base.scale("gemm_scale", arch) * factor,
        f"attention_scale__{arch}": base.scale("attention_scale", arch) * factor,
        f"memory_scale__{arch}": base.scale("memory_scale", arch) * factor,
    })


def fit(job: Job, split_steps: list[dict[str, Any]], step_times_s: list[float], base: Calibration, *, what: str) -> Fit:
    """Refit on the first half of the profiled steps, judge on the second half."""
    n = len(split_steps)
    half = max(1, n // 2)
    fit_rows, held = split_steps[:half], split_steps[half:] or split_steps[:half]
    times_held = step_times_s[half:] or step_times_s[:half]
    arch = job.cluster.gpu.architecture or "default"
    cal = base
    measured_opt = statistics.median(r["optimizer_s"] for r in fit_rows)
    predicted_opt = float(time_estimate(job, calibration=base).breakdown.value("optimizer"))
    if measured_opt > 0 and predicted_opt > 0:
        cal = cal.with_values(**{f"optimizer_scale__{arch}": base.scale("optimizer_scale", arch) * predicted_opt / measured_opt})
    target = statistics.median(r["compute_s"] for r in fit_rows)
    lo, hi = SCALE_RANGE
    for _ in range(BISECTION_STEPS):
        mid = (lo * hi) ** 0.5
        if _compute_s(job, _scaled(cal, arch, mid, base)) > target:
            lo = mid  # too slow: efficiencies must rise
        else:
            hi = mid
    factor = (lo * hi) ** 0.5
    cal = _scaled(cal, arch, factor, base)
    cal = replace(cal, source=f"planner validate --calibrate on {what} ({date.today().isoformat()}), from: {base.source}")

    def errors(c: Calibration) -> dict[str, float]:
        t = time_estimate(job, calibration=c)
        out = {}
        for name, pred, got in (
            ("step_s", t.step_s, statistics.median(times_held)),
            ("compute_s", float(t.breakdown.value("compute")), statistics.median(r["compute_s"] for r in held)),
            ("optimizer_s", float(t.breakdown.value("optimizer")), statistics.median(r["optimizer_s"] for r in held)),
        ):
            if got > 0:
                out[name] = (pred - got) / got
        return out

    values = {f"{name}.{arch}": cal.scale(name, arch) for name in ("optimizer_scale", "gemm_scale", "attention_scale", "memory_scale")}
    return Fit(calibration=cal, fit_steps=half, held_out_steps=len(held), before=errors(base), after=errors(cal), values=values)


def write(cal: Calibration, path: Path) -> None:
    from planner.writing import write_file

    write_file(path, (json.dumps(cal.to_json(), indent=2) + "\n").encode(), what="--calibrate")
