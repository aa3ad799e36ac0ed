"""The efficiency constants of the time model: the only numbers in it that are fitted, not derived.

Defaults are fitted on the published runs (`benchmarks/time_accuracy.py --fit`, method and values in
docs/performance-model.md); `planner validate --calibrate FILE` refits them on measured runs and
`--calibration FILE` loads such a file. A file holds a JSON object with any of the fields below.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from cost_models.errors import SpecError


@dataclass(frozen=True)
class Calibration:
    # Fraction of the dense 16-bit tensor-core peak a large GEMM sustains.
    gemm_efficiency: float = 0.80
    # Fraction of the dense fp8 peak a large fp8 GEMM sustains (scaling and casts included).
    fp8_gemm_efficiency: float = 0.60
    # Fraction of the 16-bit peak the fused attention kernel sustains (forward and backward).
    attention_efficiency: float = 0.55
    # Hockney's n½ for GEMMs: the smallest GEMM dimension at which half of gemm_efficiency is
    # reached (Hockney & Jesshope, "Parallel Computers 2", 1988: r(n) = r∞·n/(n + n½)).
    gemm_half_dim: float = 96.0
    # Fraction of the HBM peak that elementwise kernels (norms, activations, optimizer) reach;
    # STREAM-like copies reach ~90% of peak on A100/H100 (NVIDIA "CUDA C++ Best Practices Guide",
    # effective bandwidth; babelstream results in the H100 tuning guide).
    hbm_efficiency: float = 0.85
    source: str = "defaults fitted on benchmarks/data/published_runs.yaml"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def with_values(self, **values: float) -> Calibration:
        return replace(self, **values)

    @classmethod
    def fitted_fields(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls) if f.name != "source")


DEFAULT = Calibration()


def load_calibration(path: Path) -> Calibration:
    """Read a calibration file; unknown keys and non-positive values are user errors."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SpecError(f"calibration file {path}: cannot read JSON ({e})") from None
    if not isinstance(data, dict):
        raise SpecError(f"calibration file {path}: expected a JSON object with {', '.join(Calibration.fitted_fields())}")
    allowed = set(Calibration.fitted_fields()) | {"source"}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise SpecError(f"calibration file {path}: unknown field(s) {unknown}; allowed: {sorted(allowed)}")
    for name in Calibration.fitted_fields():
        if name in data and not (isinstance(data[name], (int, float)) and data[name] > 0):
            raise SpecError(f"calibration file {path}: {name}({data[name]!r}) must be a positive number")
    return replace(DEFAULT, **data)
