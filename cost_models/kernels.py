"""Kernel prices on one GPU, from published kernel measurements (presets/kernels/<architecture>.toml
and the measured matmul rates of presets/gpus.toml). No job knowledge lives here.

GEMM. A GEMM of (m x k)·(k x n) runs at the GPU's tensor-core ceiling times two derived factors:
- tile and wave quantisation (NVIDIA "Matrix Multiplication Background User's Guide", Sec. 3.1 and
  3.2): the output is cut into CTA tiles of the generation's sizes, the tiles run `sm_count` at a
  time, and the padded tiles and the idle SMs of the last wave do no useful work; the kernel library
  picks the tile that wastes least;
- the epilogue: each output tile's store is not hidden behind its main loop, so a tile spends the
  time of k0 = out_bytes·R/(2·B) extra steps of its k loop (R the SM's share of the matmul rate, B its
  share of HBM bandwidth: a tile of a·b outputs runs 2·a·b FLOPs per step of k and writes
  out_bytes·a·b once), giving k/(k + k0). On H100 this is 237 steps for bf16 and 419 for fp8; the
  fp8 value reproduces DeepGEMM's measured fall-off with K and cuBLASLt's rise from 4096^3 to
  16384^3 on H100 and H200 (Azure's tables; a free fit of k0 to the H100 rows gives 400), and
  A100 cuBLAS loses more than its k0 gives (tests/test_kernels.py). A GEMM that
  accumulates into its output (D = A·B + C, beta = 1) reads each output tile in the same epilogue
  before it writes it back: out_bytes counts both, twice the output's element size.
The ceiling is anchored on the GPU's published GEMM timings: each timing divided by these two
factors at its shape, geometric mean over the timings (presets/gpus.toml `matmul`). The epilogue
factor at a measured shape uses that measurement's own rate. A GEMM is never faster than moving its
operands through HBM (roofline, Williams et al. 2009), and every GEMM kernel pays the generation's
start-up time of a kernel (the memory-bound section's launch_s).

Clock. A GEMM that fills every SM for long draws the board's power limit, and the SM clock settles
below the boost clock a short benchmark sees (ml-engineering's MSMF vs MAMF: H200 bf16 755 vs 834;
NVIDIA rates A100 HPL at the 1305 MHz it sustains at its power limit, not the 1410 MHz boost). A
training step is such a long run, so every compute-bound kernel is priced at the sustained ceiling:
from timings taken at the power limit ("sustained": Azure's cuBLASLt tables after 10,000 warm-up
GEMMs; this project's own timings at the power limit, benchmarks/gpu_kernels.py) where the GPU has
them, else the burst ceiling times the sustained/burst ratio the GPU (or its generation's reference
GPU) shows in an operand type timed both ways. Fused attention does not draw the power limit: on this
project's H100 and H200 the boards drew 413-451 W at SM clocks of 1905-1965 MHz (boost 1980) through
the attention benchmark, against 688-701 W and 1335-1545 MHz through the GEMMs before it
(benchmarks/data/measured/*-kernels-2026-11-27.json, `states`). In a training step attention runs
between GEMMs that hold the board at that limit, so the attention curves, burst benchmarks on the
reference GPU, are scaled to the sustained clock as the GEMMs are. The published runs agree: priced
at the burst clock instead, their leave-one-source-out median error is 3.7% against 3.6% and
MLPerf's 6.2% against 4.3% (benchmarks/time_accuracy.py). An isolated kernel benchmark is compared
at its own, burst, clock (isolated_scale).

Attention. Fused kernels are priced from the kernel family's published TFLOP/s curves (forward
and backward, causal or not, by head dimension and by the length of the key loop), interpolated in
log2 of the length; the curves were measured at 16k tokens per batch, and a job's kernel with
fewer thread blocks than SMs times a whole number of waves is scaled by its own wave fill against
the benchmark's. Other GPUs of the generation run at the curves times their matmul rate over the
reference GPU's.

Memory-bound kernels. Bytes over a measured fraction of HBM bandwidth, plus a per-kernel start-up
cost for every launch.
"""

from __future__ import annotations

import bisect
import math
import tomllib
from dataclasses import dataclass
from enum import StrEnum
from functools import cache, lru_cache
from importlib import resources

from cost_models.enums import AttentionBackend as AttentionFamily, Precision
from cost_models.hardware import GPUSpec
from cost_models.interp import log2_interp
from cost_models.units import TFLOP

# Tiles of an architecture without a kernel table (the 128x256 / 256x128 / 128x128 family every
# NVIDIA generation since Ampere uses, see presets/kernels/*.toml).
DEFAULT_TILES = ((128, 256), (256, 128), (128, 128))
# SMs assumed for a GPU spec that gives none (an H100 SXM5's 132).
DEFAULT_SMS = 132
# Attention query block of the flash kernels: each thread block handles 128 query rows (FA2/FA3
# kBlockM = 128 for head dims up to 128; cuDNN's sm90 kernel names show 128-row tiles too:
# cudnn_generated_fort_native_sdpa_sm90_knob_7_64x128x128).
ATTENTION_BLOCK_ROWS = 128
# Below the shortest benchmarked length, a curve keeps its slope in log2(length) down to this
# fraction of its first value (no published curve starts below 512 tokens).
ATTENTION_FLOOR = 0.25


class Pass(StrEnum):
    FORWARD = "fwd"
    BACKWARD = "bwd"


@dataclass(frozen=True)
class Curves:
    """One family's TFLOP/s by (pass, causal, head_dim) over KernelTable.seq_lens, in FLOP/s."""

    by_key: dict[tuple[Pass, bool, int], tuple[float, ...]]
    source: str

    def head_dims(self, p: Pass, causal: bool) -> list[int]:
        return sorted(d for (q, c, d) in self.by_key if q is p and c is causal)


@dataclass(frozen=True)
class RowwiseGrid:
    """Measured speedup of a compiled torchao rowwise Float8Linear block over bf16, by the linear's
    forward (M, K, N): speedup[i][j][l] at ms[i], ks[j], ns[l]."""

    ms: tuple[int, ...]
    ks: tuple[int, ...]
    ns: tuple[int, ...]
    speedup: tuple[tuple[tuple[float, ...], ...], ...]
    source: str


def _rowwise_grid(raw: dict | None) -> RowwiseGrid | None:
    if raw is None:
        return None
    by_m = sorted((int(key.removeprefix("m")), rows) for key, rows in raw["speedup"].items())
    ks, ns = tuple(raw["k"]), tuple(raw["n"])
    assert all(len(rows) == len(ks) and all(len(r) == len(ns) for r in rows) for _, rows in by_m)
    return RowwiseGrid(tuple(m for m, _ in by_m), ks, ns, tuple(tuple(tuple(r) for r in rows) for _, rows in by_m), raw["source"])


@dataclass(frozen=True)
class EagerBmm:
    """Measured rates of unfused attention's batched GEMMs by head dimension, in FLOP/s: "scores"
    reduces over the head dimension (QKᵀ), "context" has it as its output width (attention over
    values)."""

    head_dims: tuple[int, ...]
    scores: tuple[float, ...]
    context: tuple[float, ...]
    source: str


def _eager_bmm(raw: dict | None) -> EagerBmm | None:
    if raw is None:
        return None
    dims = tuple(raw["head_dims"])
    assert len(raw["scores"]) == len(dims) == len(raw["context"]) and list(dims) == sorted(dims)
    return EagerBmm(dims, tuple(v * TFLOP for v in raw["scores"]), tuple(v * TFLOP for v in raw["context"]), raw["source"])


@dataclass(frozen=True)
class Fp8Attention:
    """cuDNN's fp8 fused attention against its 16-bit kernels timed at the same shapes on one GPU:
    the speedup (fp8 over 16-bit TFLOP/s) by (pass, causal) over seq_lens, per measured GPU;
    `default` is the GPU whose speedups the generation's other GPUs read."""

    seq_lens: tuple[int, ...]
    speedups: dict[str, dict[tuple[Pass, bool], tuple[float, ...]]]
    default: str
    source: str


def _fp8_attention(raw: dict | None) -> Fp8Attention | None:
    """The [attention_fp8] table's TFLOP/s curves (dtype, pass, mask) read as fp8 over bf16 speedups."""
    if raw is None:
        return None
    seq_lens = tuple(raw["seq_lens"])
    speedups: dict[str, dict[tuple[Pass, bool], tuple[float, ...]]] = {}
    for gpu, body in raw.items():
        if not isinstance(body, dict):
            continue
        curves = {(dtype, Pass(p), mask == "causal"): tuple(values)
                  for dtype, passes in body.items() for p, masks in passes.items() for mask, values in masks.items()}
        assert all(len(v) == len(seq_lens) for v in curves.values()) and len(curves) == 8, gpu
        speedups[gpu] = {(p, causal): tuple(f / b for f, b in zip(curves["fp8", p, causal], curves["bf16", p, causal]))
                         for p, causal in {(p, causal) for _, p, causal in curves}}
    assert raw["default"] in speedups
    return Fp8Attention(seq_lens, speedups, raw["default"], raw["source"])


@dataclass(frozen=True)
class KernelTable:
    architecture: str
    reference_gpu: str
    tiles: tuple[tuple[int, int], ...]
    seq_lens: tuple[int, ...]
    bench_tokens: int
    bench_hidden: int
    attention: dict[AttentionFamily, Curves]
    stream_fraction: float
    op_fractions: dict[str, float]  # "norm.fused.fwd" -> fraction of HBM peak on compulsory bytes
    launch_s: float
    te_fp8_overhead: dict[str, float]  # Transformer Engine autocast time over pure fp8 GEMM time − 1, by recipe
    rowwise: RowwiseGrid | None = None  # torchao rowwise Float8Linear speedups, where measured
    eager_bmm: EagerBmm | None = None  # unfused attention's batched GEMMs by head dimension, where measured
    # the generation whose reference GPU's sustained/burst ratio stands in where no GPU of this one
    # has a GEMM timed both ways (the table says why); None: this generation's reference GPU
    sustained_ratio_from: str | None = None
    # what the table's own stand-ins mean for a prediction, said beside every plan on this generation
    # (rules.NOTES kernel_caveat); None where every entry is a measurement of the generation
    caveat: str | None = None
    fp8_attention: Fp8Attention | None = None  # cuDNN fp8 attention against 16-bit, where measured


def _read(architecture: str) -> dict | None:
    try:
        text = resources.files("presets").joinpath("kernels", f"{architecture}.toml").read_text(encoding="utf-8")
    except OSError:  # no table for this generation
        return None
    return tomllib.loads(text)


def _split_passes(raw: dict[str, dict[str, list[float]]], partner: Curves | None) -> dict[tuple[Pass, bool, int], tuple[float, ...]]:
    """Forward and backward curves. A family published only as forward+backward (TFLOP/s over
    3.5x the forward FLOPs) is split with `partner`'s forward share at the same point: from
    3.5/R_fb = 1/R_f + 2.5/R_b, R_f = R_fb·(R_f'/R_fb') and R_b = 2.5/(3.5/R_fb − 1/R_f)."""
    out: dict[tuple[Pass, bool, int], tuple[float, ...]] = {}
    for name, p in (("fwd", Pass.FORWARD), ("bwd", Pass.BACKWARD)):
        for mask, by_dim in raw.get(name, {}).items():
            for dim, values in by_dim.items():
                out[p, mask == "causal", int(dim)] = tuple(v * TFLOP for v in values)
    _fill_masks(out)
    for mask, by_dim in raw.get("fwd_bwd", {}).items():
        causal = mask == "causal"
        for dim, values in by_dim.items():
            d = int(dim)
            fb = [v * TFLOP for v in values]
            fwd = out.get((Pass.FORWARD, causal, d))
            if fwd is None:
                assert partner is not None, "a fwd_bwd-only curve needs a partner family with both"
                pf, pb = partner.by_key[Pass.FORWARD, causal, d], partner.by_key[Pass.BACKWARD, causal, d]
                partner_fb = [3.5 / (1 / f + 2.5 / b) for f, b in zip(pf, pb)]
                fwd = tuple(x * f / y for x, f, y in zip(fb, pf, partner_fb))
                out[Pass.FORWARD, causal, d] = fwd
            if (Pass.BACKWARD, causal, d) not in out:
                out[Pass.BACKWARD, causal, d] = tuple(2.5 / (3.5 / x - 1 / f) for x, f in zip(fb, fwd))
    return out


def _fill_masks(out: dict[tuple[Pass, bool, int], tuple[float, ...]]) -> None:
    """A backward curve published for one mask only (cuDNN's and FA3's backward figures) gives the
    other mask's backward by the forward curves' ratio at each point."""
    for (p, causal, d), values in list(out.items()):
        other = (p, not causal, d)
        if p is Pass.BACKWARD and other not in out:
            fwd_this, fwd_other = out.get((Pass.FORWARD, causal, d)), out.get((Pass.FORWARD, not causal, d))
            if fwd_this and fwd_other:
                out[other] = tuple(v * b / a for v, a, b in zip(values, fwd_this, fwd_other))


@cache
def kernel_table(architecture: str) -> KernelTable | None:
    """The generation's kernel table, or None for a generation without published measurements."""
    data = _read(architecture)
    if data is None:
        return None
    att = data["attention"]
    families: dict[AttentionFamily, Curves] = {}
    raw_families = {k: v for k, v in att.items() if isinstance(v, dict)}
    # families derived from another table (scale_from = "hopper.fa3") last, and FA2 first: the
    # others may be split with its curves
    for name, raw in sorted(raw_families.items(), key=lambda kv: ("scale_from" in kv[1], kv[0] != "fa2")):
        family = AttentionFamily(name)
        if "scale_from" in raw:
            arch, base = raw["scale_from"].split(".")
            other = kernel_table(arch)
            assert other is not None
            src = other.attention[AttentionFamily(base)]
            families[family] = Curves({k: tuple(v * raw["scale"] for v in vals) for k, vals in src.by_key.items()}, raw["source"])
            continue
        partner = _partner_for_split(architecture, family, families)
        families[family] = Curves(_split_passes(raw, partner), raw["source"])
    mb = data["memory_bound"]
    op_fractions = dict(mb.get("ops", {}))
    if "ops_from" in mb:  # the other table's fractions at the same share of its streaming rate
        base = kernel_table(mb["ops_from"])
        op_fractions = {op: f * mb["stream_fraction"] / base.stream_fraction for op, f in base.op_fractions.items()}
    return KernelTable(
        architecture=architecture,
        reference_gpu=data["reference_gpu"],
        tiles=tuple(tuple(t) for t in data["gemm"]["tiles"]),
        seq_lens=tuple(att["seq_lens"]),
        bench_tokens=att["bench_tokens"],
        bench_hidden=att["bench_hidden"],
        attention=families,
        stream_fraction=mb["stream_fraction"],
        op_fractions=op_fractions,
        launch_s=mb["launch_s"],
        te_fp8_overhead={k: v for k, v in data.get("fp8", {}).items() if k != "source"},
        rowwise=_rowwise_grid(data.get("torchao_rowwise")),
        eager_bmm=_eager_bmm(data["gemm"].get("eager_attention")),
        sustained_ratio_from=data["gemm"].get("sustained_ratio_from"),
        fp8_attention=_fp8_attention(data.get("attention_fp8")),
        caveat=data.get("caveat"),
    )


def _partner_for_split(architecture: str, family: AttentionFamily, done: dict[AttentionFamily, Curves]) -> Curves | None:
    """Where a forward+backward-only curve takes its forward share from: the same family on
    Hopper, or on Hopper itself FA2, whose curves are published both ways (the tables say so)."""
    if architecture == "hopper":
        return done.get(AttentionFamily.FA2) if family is not AttentionFamily.FA2 else None
    hopper = kernel_table("hopper")
    return hopper.attention.get(family) if hopper else None


# --- which table a GPU uses, and how it scales -----------------------------------------------------


# The generation whose tables price a GPU with no table of its own (Ada, a user's GPU with no
# architecture): Hopper's, scaled by the GPU's matmul rate like any other GPU.
FALLBACK_ARCHITECTURE = "hopper"


def table_for(gpu: GPUSpec) -> KernelTable:
    table = kernel_table(gpu.architecture) if gpu.architecture else None
    if table is None:
        table = kernel_table(FALLBACK_ARCHITECTURE)
    assert table is not None
    return table


def _dtype_key(precision: Precision) -> str:
    return {Precision.FP8: "fp8", Precision.FP4: "fp4", Precision.FP16: "fp16"}.get(precision, "bf16")


def _datasheet_peak(gpu: GPUSpec, key: str) -> float:
    p = gpu.peak_flop_per_s
    # fp4 only reaches here on a GPU with an fp4 peak (compute._gemm_precision prices NVFP4 on one
    # without it in 16-bit), so none stands in for it
    peak = {"fp4": p.fp4, "fp8": p.fp8 or p.bf16, "fp16": p.fp16, "bf16": p.bf16}[key]
    assert peak is not None, f"{gpu.name} has no {key} peak"
    return peak


def _measured(gpu: GPUSpec, key: str, regime: str) -> list[tuple[float, tuple[int, int, int] | None]]:
    """The GPU's published GEMM timings for the operand type in one regime; 16-bit types share one
    rate (fp16 and bf16 run the same tensor-core rate on every NVIDIA generation since Ampere:
    datasheets list one FP16/BF16 figure)."""
    wanted = ("bf16", "fp16") if key in ("bf16", "fp16") else (key,)
    return [(m.rate_flop_per_s, m.shape) for m in gpu.matmul if m.dtype in wanted and m.regime == regime]


def sm_count(gpu: GPUSpec) -> int:
    return gpu.sm_count or DEFAULT_SMS


@cache
def _reference(architecture: str) -> GPUSpec | None:
    """The reference GPU spec of a table (from presets/gpus.toml)."""
    table = kernel_table(architecture)
    if table is None:
        return None
    data = tomllib.loads(resources.files("presets").joinpath("gpus.toml").read_text(encoding="utf-8"))
    body = data.get(table.reference_gpu)
    return GPUSpec.model_validate({"name": table.reference_gpu, **body}) if body else None


def tensor_core_ceiling(gpu: GPUSpec, precision: Precision) -> float:
    """FLOP/s of a GEMM with no quantisation loss on this GPU at its sustained (power-limited)
    clock, the clock of a training step (module docstring)."""
    return _ceiling(gpu, _dtype_key(precision), "sustained")


def burst_ceiling(gpu: GPUSpec, precision: Precision) -> float:
    """The same at the boost clock of a short benchmark."""
    return _ceiling(gpu, _dtype_key(precision), "burst")


def _anchored(gpu: GPUSpec, key: str, regime: str) -> float | None:
    """Geometric mean over the regime's timings of rate / (the model's efficiency at the shape)."""
    found = _measured(gpu, key, regime)
    if not found:
        return None
    logs = [math.log(rate / (_shape_efficiency(*shape, 1, gpu, key, ceiling=rate) if shape else 1.0)) for rate, shape in found]
    return math.exp(sum(logs) / len(logs))


@cache
def sustained_ratio(gpu: GPUSpec) -> float:
    """Sustained over burst ceiling: the geometric mean over the operand types this GPU has timings
    of in both regimes, else its generation's reference GPU's (or, where the table names one, the
    reference GPU's of the generation standing in: sustained_ratio_from)."""
    logs = []
    for key in ("bf16", "fp8"):
        a, b = _anchored(gpu, key, "sustained"), _anchored(gpu, key, "burst")
        if a and b:
            logs.append(math.log(a / b))
    if logs:
        return math.exp(sum(logs) / len(logs))
    table = table_for(gpu)
    ref = _reference(table.sustained_ratio_from or table.architecture)
    assert ref is not None and ref.name != gpu.name, f"{gpu.name}: no GEMM timings in both regimes"
    return sustained_ratio(ref)


@cache
def _ceiling(gpu: GPUSpec, key: str, regime: str) -> float:
    direct = _anchored(gpu, key, regime)
    if direct:
        return direct
    other = "burst" if regime == "sustained" else "sustained"
    found = _anchored(gpu, key, other)
    if found:
        ratio = sustained_ratio(gpu)
        return found * ratio if regime == "sustained" else found / ratio
    ref = _reference(table_for(gpu).architecture)
    assert ref is not None and ref.name != gpu.name, f"no measured {key} matmul rate for the reference GPU"
    return _datasheet_peak(gpu, key) * _ceiling(ref, key, regime) / _datasheet_peak(ref, key)


def compute_scale(gpu: GPUSpec) -> float:
    """How fast this GPU runs compute-bound kernels in a training step relative to its table's
    reference GPU in the benchmarks the tables come from: its sustained 16-bit tensor-core ceiling
    over the reference GPU's burst one (clock, SM count and power limit all show in it)."""
    ref = _reference(table_for(gpu).architecture)
    assert ref is not None
    return tensor_core_ceiling(gpu, Precision.BF16) / burst_ceiling(ref, Precision.BF16)


def isolated_scale(gpu: GPUSpec) -> float:
    """How much faster a compute-bound kernel runs timed alone, at the burst clock, than inside a
    training step at the sustained one (module docstring, Clock): what a price for a training step
    is multiplied by to compare with an isolated kernel benchmark."""
    return burst_ceiling(gpu, Precision.BF16) / tensor_core_ceiling(gpu, Precision.BF16)


# --- GEMM ---------------------------------------------------------------------------------------


def _wave_fill(blocks: int, sms: int) -> float:
    """Share of SM time doing work when `blocks` equal blocks run `sms` at a time."""
    waves = -(-blocks // sms)
    return blocks / (waves * sms)


def epilogue_steps(gpu: GPUSpec, key: str, ceiling: float, out_bytes: int = 2) -> float:
    """k0 of the module docstring: the k-loop steps one output tile's epilogue costs, for
    `out_bytes` moved per output element (its store, plus the load of an accumulated output)."""
    return out_bytes * ceiling / (2 * gpu.hbm_bandwidth_bytes_per_s)


def _shape_efficiency(m: int, n: int, k: int, count: int, gpu: GPUSpec, key: str, *, ceiling: float,
                      out_bytes: int = 2) -> float:
    """Tile/wave fill times k/(k + k0) for `count` independent (m x k)·(k x n) products run as one
    batched or grouped kernel (their tiles share the waves); k0 for `out_bytes` per output element."""
    sms = sm_count(gpu)
    tiles = table_for(gpu).tiles if gpu.architecture else DEFAULT_TILES
    best = 0.0
    for tm, tn in tiles:
        bm, bn = -(-m // tm), -(-n // tn)
        fill = (m * n) / (bm * tm * bn * tn)
        best = max(best, fill * _wave_fill(count * bm * bn, sms))
    k0 = epilogue_steps(gpu, key, ceiling, out_bytes)
    return best * k / (k + k0)


def gemm_efficiency(m: int, n: int, k: int, count: int, gpu: GPUSpec, precision: Precision, out_bytes: int = 2) -> float:
    """Fraction of the tensor-core ceiling a GEMM reaches (module docstring), its epilogue moving
    `out_bytes` per output element."""
    key = _dtype_key(precision)
    return _shape_efficiency(m, n, k, count, gpu, key, ceiling=tensor_core_ceiling(gpu, precision), out_bytes=out_bytes)


# The search prices one layer under many Shards and recompute modes, and each pass asks for the
# same GEMM and attention shapes again (Llama-3.1-405B at 512 GB200 GPUs: 7,266 GEMM prices of 744
# shapes, 2,424 attention rates of 220): both are pure functions of their arguments, so they are
# kept, like the ceilings above, for as many shapes as a search meets (typed: an int and an equal
# float are kept apart, each priced as it was).
PRICE_CACHE = 1 << 16


@lru_cache(maxsize=PRICE_CACHE, typed=True)
def gemm_seconds(m: int, n: int, k: int, count: int, gpu: GPUSpec, precision: Precision, *, operand_bytes: float, out_bytes: int = 2) -> float:
    """Seconds of the GEMM; `out_bytes` per output element moved by its epilogue (the element size,
    twice it for a GEMM accumulating into its output)."""
    flop = 2 * m * n * k * count
    rate = tensor_core_ceiling(gpu, precision) * gemm_efficiency(m, n, k, count, gpu, precision, out_bytes)
    moved = count * (operand_bytes * (m * k + k * n) + out_bytes * m * n)
    table = table_for(gpu)
    stream = gpu.hbm_bandwidth_bytes_per_s * table.stream_fraction
    return max(flop / rate, moved / stream) + table.launch_s


def eager_bmm_rate(gpu: GPUSpec, head_dim: int, *, reduces_head_dim: bool) -> float | None:
    """FLOP/s of one of unfused attention's batched GEMMs in a training step, from the generation's
    measured curve by head dimension (linear between the measured head dims), at the GPU's
    sustained compute over the reference GPU's benchmark (compute_scale, as the attention curves);
    None where the generation has no curve or the head dimension lies outside it (the GEMM model
    prices it then)."""
    curves = table_for(gpu).eager_bmm
    if curves is None or not curves.head_dims[0] <= head_dim <= curves.head_dims[-1]:
        return None
    ys = curves.scores if reduces_head_dim else curves.context
    dims = curves.head_dims
    i = bisect.bisect_right(dims, head_dim) - 1  # the last measured head dim <= head_dim
    rate = ys[i] if dims[i] == head_dim else ys[i] + (ys[i + 1] - ys[i]) * (head_dim - dims[i]) / (dims[i + 1] - dims[i])
    return rate * compute_scale(gpu)


# --- attention ----------------------------------------------------------------------------------


def _interp(xs: tuple[int, ...], ys: tuple[float, ...], x: float) -> float:
    """Linear in log2(x) between the points; flat beyond the last, and below the first along the
    first segment's slope, floored at ATTENTION_FLOOR of the first value."""
    if x >= xs[0]:
        return log2_interp(xs, ys, x)
    slope = (ys[1] - ys[0]) / math.log2(xs[1] / xs[0])
    return max(ys[0] + slope * math.log2(max(x, 1.0) / xs[0]), ATTENTION_FLOOR * ys[0])


def _curve_rate(curves: Curves, seq_lens: tuple[int, ...], p: Pass, causal: bool, head_dim: int, k_len: float) -> float:
    dims = curves.head_dims(p, causal)
    assert dims, f"no {p} {'causal' if causal else 'full'} curve"
    if head_dim <= dims[0] or len(dims) == 1:
        return _interp(seq_lens, curves.by_key[p, causal, dims[0]], k_len)
    if head_dim >= dims[-1]:
        return _interp(seq_lens, curves.by_key[p, causal, dims[-1]], k_len)
    lo = max(d for d in dims if d <= head_dim)
    hi = min(d for d in dims if d >= head_dim)
    a = _interp(seq_lens, curves.by_key[p, causal, lo], k_len)
    if hi == lo:
        return a
    b = _interp(seq_lens, curves.by_key[p, causal, hi], k_len)
    return a + (b - a) * (head_dim - lo) / (hi - lo)


def family_available(gpu: GPUSpec, family: AttentionFamily) -> bool:
    return family in table_for(gpu).attention


@lru_cache(maxsize=PRICE_CACHE, typed=True)
def attention_rate(
    gpu: GPUSpec, family: AttentionFamily, p: Pass, *, causal: bool, head_dim: int, q_len: int, k_len: int, batch_heads: int
) -> float:
    """FLOP/s (benchmark convention) of one fused attention kernel call.

    `k_len` is the length of the key loop each query block runs (the curves' sequence length);
    `q_len · batch_heads` sets the thread blocks, whose wave fill is compared with the benchmark's
    (batch·seqlen = bench_tokens, heads = bench_hidden/head_dim)."""
    table = table_for(gpu)
    curves = table.attention[family]
    rate = _curve_rate(curves, table.seq_lens, p, causal, head_dim, k_len)
    sms = sm_count(gpu)
    seq = min(max(k_len, table.seq_lens[0]), table.seq_lens[-1])
    bench_blocks = max(1, table.bench_tokens // seq) * max(1, table.bench_hidden // head_dim) * -(-seq // ATTENTION_BLOCK_ROWS)
    blocks = max(1, batch_heads) * -(-q_len // ATTENTION_BLOCK_ROWS)
    waves = _wave_fill(blocks, sms) / _wave_fill(bench_blocks, sms)
    return rate * compute_scale(gpu) * waves


def fp8_attention_available(gpu: GPUSpec) -> bool:
    """Whether the GPU's generation has a measurement of cuDNN's fp8 attention (presets/kernels
    [attention_fp8])."""
    return table_for(gpu).fp8_attention is not None


def fp8_attention_speedup(gpu: GPUSpec, p: Pass, *, causal: bool, k_len: float) -> float:
    """How much faster cuDNN's fp8 fused attention kernel runs than its 16-bit one at a key length:
    the measured 16-bit over fp8 time (the ratio of their TFLOP/s at one shape), linear in log2 of
    the length between the measured lengths and flat beyond both ends. The GPU's own curves where
    measured, else its generation's `default` GPU's; head dim 128's for every head dim (the one
    measured)."""
    fp8 = table_for(gpu).fp8_attention
    assert fp8 is not None, f"{gpu.name}: no fp8 attention measurement for its generation"
    speedups = fp8.speedups.get(gpu.name, fp8.speedups[fp8.default])
    return log2_interp(fp8.seq_lens, speedups[p, causal], _clamped(fp8.seq_lens, k_len))


# --- memory-bound kernels -------------------------------------------------------------------------


def op_fraction(gpu: GPUSpec, key: str | None) -> float:
    """Measured fraction of HBM peak of one op ("norm.fused.fwd"), else the stream fraction."""
    table = table_for(gpu)
    return table.op_fractions.get(key, table.stream_fraction) if key else table.stream_fraction


def memory_seconds(moved_bytes: float, gpu: GPUSpec, *, op: str | None = None, launches: float = 0.0) -> float:
    """Bytes over the op's measured fraction (default: the stream fraction) of HBM bandwidth, plus
    the start-up cost of `launches` kernels."""
    return moved_bytes / (gpu.hbm_bandwidth_bytes_per_s * op_fraction(gpu, op)) + launches * table_for(gpu).launch_s


def te_fp8_overhead(gpu: GPUSpec, recipe: str) -> float:
    """Transformer Engine's quantisation time on top of its fp8 GEMMs (autocast / pre-quantized − 1)."""
    return table_for(gpu).te_fp8_overhead.get(recipe, 0.0)


# --- torchao rowwise float8 linears ---------------------------------------------------------------

# Compulsory bytes per element of the benchmark block's memory-bound ops, forward + backward, 16-bit:
# LayerNorm (no affine) reads x and writes y (4), its backward reads x and dy and writes dx (6), over
# M·K; the sigmoid the same over M·N (forward 4, backward reads y and dy, writes dx: 6).
ROWWISE_BLOCK_BYTES = 4 + 6
# Kernels of those ops: LayerNorm and sigmoid, forward and backward.
ROWWISE_BLOCK_KERNELS = 4


def _clamped(xs: tuple[int, ...], x: float) -> float:
    """x inside the measured range: no extrapolation beyond a table's edge in either direction."""
    return min(max(x, xs[0]), xs[-1])


def _grid_speedup(grid: RowwiseGrid, m: float, k: float, n: float) -> float:
    """The block speedup at (m, k, n) inside the grid: linear in log2 along n, then k, then m."""
    def along_k(rows: tuple[tuple[float, ...], ...]) -> float:
        return log2_interp(grid.ks, [log2_interp(grid.ns, r, n) for r in rows], k)

    return log2_interp(grid.ms, [along_k(rows) for rows in grid.speedup], m)


def _rowwise_table(gpu: GPUSpec) -> KernelTable:
    """The table whose rowwise grid prices this GPU: its own generation's, else the fallback
    generation's (Hopper, where torchao measured it)."""
    own = table_for(gpu)
    if own.rowwise is not None:
        return own
    fallback = kernel_table(FALLBACK_ARCHITECTURE)
    assert fallback is not None and fallback.rowwise is not None, "no torchao rowwise grid"
    return fallback


@cache
def _rowwise_ratio_at(architecture: str, m: int, k: int, n: int) -> float:
    table = kernel_table(architecture)
    assert table is not None and table.rowwise is not None
    ref = _reference(architecture)
    assert ref is not None
    s = _grid_speedup(table.rowwise, m, k, n)
    gemms = ((m, n, k), (m, k, n), (k, n, m))  # forward, dgrad, wgrad
    bf16 = sum(gemm_seconds(a, b, c, 1, ref, Precision.BF16, operand_bytes=2) for a, b, c in gemms)
    other = memory_seconds(ROWWISE_BLOCK_BYTES * m * (k + n), ref, launches=ROWWISE_BLOCK_KERNELS)
    o = other / bf16
    return (1 + o) / s - o


def rowwise_linear_ratio(gpu: GPUSpec, m: int, k: int, n: int) -> float:
    """Time of a torchao rowwise Float8Linear (its three fp8 GEMMs and every cast, forward +
    backward, compiled) over the same linear's three bf16 GEMMs, for forward shape (m x k)·(k x n).

    From the measured block speedup s (presets `torchao_rowwise`): s = (o + 1)/(o + r), with o the
    block's LayerNorm and sigmoid time over its bf16 GEMM time, both priced here on the grid's
    reference GPU, so r = (1 + o)/s − o. A shape outside the grid is read at its nearest edge: the
    grid's largest M already shows the speedup flat in M, and no value is extrapolated below
    its smallest K or N (those linears only get slower)."""
    table = _rowwise_table(gpu)
    grid = table.rowwise
    assert grid is not None
    return _rowwise_ratio_at(table.architecture, round(_clamped(grid.ms, m)), round(_clamped(grid.ks, k)), round(_clamped(grid.ns, n)))
