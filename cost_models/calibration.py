"""The efficiency constants of the time model: the only numbers in it that are fitted, not derived.

Kernel efficiencies are kept per GPU architecture (GPUSpec.architecture: "ampere", "hopper",
"blackwell", ...), because tensor-core kernels and sustained clocks differ by generation (e.g.
FlashAttention-2 reaches 50-73% of A100's peak but about 35% of H100's: Dao 2023, FlashAttention-2,
Sec. 4.1; Shah et al. 2024, FlashAttention-3, Sec. 1); "default" serves architectures without
measurements and is set to the newest measured generation's value (hopper). Nothing here depends on a model, a run or a framework.

Defaults are fitted on the published runs (`python benchmarks/time_accuracy.py --fit`, method and
values in docs/performance-model.md). `planner validate --calibrate FILE` refits them on measured
runs and `--calibration FILE` loads such a file: a JSON object with any of the fields below, the
per-architecture ones as {"architecture": value} objects.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from cost_models.errors import SpecError

PER_ARCHITECTURE = ("gemm_efficiency", "fp8_gemm_efficiency", "attention_efficiency", "te_attention_efficiency")
DEFAULT_ARCH = "default"


def _arch(**values: float) -> Any:
    return field(default_factory=lambda: dict(values))


@dataclass(frozen=True)
class Calibration:
    # Fraction of the dense 16-bit tensor-core peak a large GEMM sustains.
    gemm_efficiency: Mapping[str, float] = _arch(default=0.5422, ampere=0.7612, hopper=0.5422)
    # Fraction of the dense fp8 peak a large fp8 GEMM sustains (scaling and casts included).
    fp8_gemm_efficiency: Mapping[str, float] = _arch(default=0.8008, hopper=0.8008, blackwell=0.4730)
    # Fraction of the tensorwise fp8 GEMM rate that row-scaled fp8 GEMMs reach (torchao rowwise:
    # CUTLASS GEMMs that apply a scale per row and per column in the epilogue).
    fp8_rowwise_gemm_ratio: float = 0.4511
    # Fraction of the 16-bit peak the fused attention kernel sustains (forward and backward).
    attention_efficiency: Mapping[str, float] = _arch(default=0.1935, ampere=0.2072, hopper=0.1935)
    # The same for Transformer Engine's fused attention (Megatron), which runs cuDNN's fused
    # flash-attention kernels on Hopper and Blackwell (TE DotProductAttention backend selection);
    # an architecture missing here is priced with attention_efficiency (TE picks flash-attn there).
    te_attention_efficiency: Mapping[str, float] = _arch(hopper=0.2940, blackwell=0.4044)
    # Hockney's n½ for GEMMs: the smallest GEMM dimension at which half of gemm_efficiency is
    # reached (Hockney & Jesshope, "Parallel Computers 2", 1988: r(n) = r∞·n/(n + n½)).
    gemm_half_dim: float = 64.53
    # Fraction of the HBM peak that elementwise kernels (norms, activations, optimizer) reach;
    # STREAM-like copies reach ~90% of peak on A100/H100 (NVIDIA "CUDA C++ Best Practices Guide",
    # effective bandwidth; babelstream results in the H100 tuning guide). Not fitted.
    hbm_efficiency: float = 0.85
    # Fraction of tensor-parallel communication that overlap (tp_comm_overlap) can hide behind the
    # GEMMs of the same pass: the GEMMs are cut into chunks and the first chunk's transfer and the
    # slower chunked GEMMs stay on the critical path (Wang et al. 2023, "Overlap communication with
    # dependent computation via decomposition"; torchtitan async TP).
    tp_overlap_fraction: float = 0.0501
    # Seconds per MoE layer per micro-batch, forward and backward, that routing costs beyond its
    # FLOPs and bytes: the dispatcher synchronises the host on token counts before each all-to-all,
    # so kernel launches of the permutation, sort and grouped-GEMM setup are not hidden
    # (Megatron-LM MoE docs recommend CUDA graphs and fused permutation for this reason).
    moe_layer_overhead_s: float = 6.60e-3
    source: str = "defaults fitted on benchmarks/data/published_runs.yaml"

    def efficiency(self, name: str, architecture: str) -> float:
        table = getattr(self, name)
        return table[architecture] if architecture in table else table[DEFAULT_ARCH]

    def to_json(self) -> dict[str, Any]:
        return {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in asdict(self).items()}

    def with_values(self, **values: float) -> Calibration:
        """Replace constants; per-architecture ones as `gemm_efficiency__hopper=0.7`."""
        scalars: dict[str, Any] = {}
        for key, value in values.items():
            name, _, arch = key.partition("__")
            if arch:
                table = dict(scalars.get(name, getattr(self, name)))
                table[arch] = value
                scalars[name] = table
            else:
                scalars[name] = value
        return replace(self, **scalars)

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
    values: dict[str, float] = {}
    for name in Calibration.fitted_fields():
        if name not in data:
            continue
        given = data[name]
        if name in PER_ARCHITECTURE:
            if not isinstance(given, dict):
                raise SpecError(f"calibration file {path}: {name} must be an object of architecture -> fraction")
            items = given.items()
        else:
            items = [("", given)]
        for arch, value in items:
            key = f"{name}__{arch}" if arch else name
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise SpecError(f"calibration file {path}: {key.replace('__', '.')}({value!r}) must be a positive number")
            values[key] = float(value)
    cal = DEFAULT.with_values(**values)
    return replace(cal, source=str(data.get("source", path)))
