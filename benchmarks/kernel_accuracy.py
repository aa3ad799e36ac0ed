"""Kernel and collective prices against published measurements no constant was set from
(benchmarks/data/kernel_measurements.yaml): GEMMs, fused attention, memory-bound ops, NCCL bus
bandwidth.

Run: python benchmarks/kernel_accuracy.py [--write docs/accuracy.md]
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))

from cost_models import kernels as K  # noqa: E402
from cost_models.comm import Collective, bus_factor, collective_time, placement  # noqa: E402
from cost_models.compute import COMPULSORY, Impl, attention_seconds, op_seconds  # noqa: E402
from cost_models.enums import AttentionBackend, Precision  # noqa: E402
from memory_accuracy import table_command  # noqa: E402
from planner import presets  # noqa: E402

DATA = Path(__file__).parent / "data" / "kernel_measurements.yaml"
MEASURED = Path(__file__).parent / "data" / "measured"
# this project's own runs of benchmarks/gpu_kernels.py: (file, the GPU of presets/gpus.toml it ran on)
OWN_RUNS = (("h100-kernels-2026-11-27.json", "H100-SXM"), ("h200-kernels-2026-11-27.json", "H200"))
# (operand bytes, bytes the epilogue moves per output element, precision) of each measured variant:
# bf16 out; fp32 out read and written back (beta = 1, Megatron's gradient accumulation fusion);
# fp32 out written only; fp8 operands with bf16 out
VARIANTS = {"wgrad_bf16": (2, 2, Precision.BF16), "wgrad_bf16_acc32": (2, 8, Precision.BF16),
            "wgrad_bf16_out32": (2, 4, Precision.BF16), "fwd_bf16": (2, 2, Precision.BF16), "fp8": (1, 2, Precision.FP8)}
SECTION = "## Kernels and collectives against published measurements"
OPERAND_BYTES = {"fp8": 1, "fp16": 2, "bf16": 2}


@dataclass(frozen=True)
class Check:
    kind: str  # gemm | attention | collective
    what: str
    unit: str
    measured: float
    predicted: float
    source: str

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1


def _gemm(row: dict) -> Check:
    gpu = presets.clusters()[row["cluster"]].gpu
    m, n, k = row["m"], row["n"], row["k"]
    s = K.gemm_seconds(m, n, k, 1, gpu, Precision(row["dtype"]), operand_bytes=OPERAND_BYTES[row["dtype"]])
    return Check("gemm", f"{gpu.name} {row['dtype']} {m}x{n}x{k}", "TFLOP/s", row["tflops"], 2 * m * n * k / s / 1e12, row["source"])


def attention_fwd_bwd_seconds(gpu, backend: AttentionBackend, *, batch: int, heads: int, head_dim: int, seq: int, causal: bool) -> float:
    """One forward and one backward call, priced as cost_models.compute prices a layer's attention,
    at the burst clock an isolated benchmark runs at (kernels.isolated_scale)."""
    shape = dict(causal=causal, head_dim=head_dim, q_len=seq, k_len=seq, batch_heads=batch * heads)
    return sum(attention_seconds(gpu, backend, p, **shape, rate_scale=K.isolated_scale(gpu)) for p in K.Pass)


def attention_flop(row: dict) -> float:
    """Forward FLOPs of an attention benchmark row in the FlashAttention benchmark's convention
    (4·b·s²·h·d, halved when causal), as benchmarks/gpu_kernels.py counts them; backward is 2.5×."""
    return 4 * row["batch"] * row["heads"] * row["seq"] ** 2 * row["head_dim"] * (0.5 if row["causal"] else 1.0)


def _attention(row: dict) -> Check:
    gpu = presets.clusters()[row["cluster"]].gpu
    shape = {k: row[k] for k in ("batch", "heads", "head_dim", "seq", "causal")}
    s = attention_fwd_bwd_seconds(gpu, AttentionBackend(row["backend"]), **shape)
    flop = 3.5 * attention_flop(row)  # forward and backward
    what = f"{gpu.name} {row['backend']} b{row['batch']} h{row['heads']} d{row['head_dim']} s{row['seq']}{' causal' if row['causal'] else ''}"
    return Check("attention", what, "TFLOP/s fwd+bwd", flop / (row["ms"] * 1e-3) / 1e12, flop / s / 1e12, row["source"])


def _memory_bound(row: dict) -> Check:
    gpu = presets.clusters()[row["cluster"]].gpu
    elements = row["rows"] * row["hidden"]
    s = op_seconds(gpu, row["op"], Impl(row["impl"]), elements, backward=False)
    what = f"{gpu.name} {row['op']} {row['impl']} forward {row['rows']}x{row['hidden']}"
    # as a rate, like the other kinds (error > 0: predicted faster): the op's compulsory bytes per second
    moved = elements * COMPULSORY[row["op"]][0]
    return Check("memory-bound", what, "GB/s of compulsory bytes", moved / (row["ms"] * 1e-3) / 1e9, moved / s / 1e9, row["source"])


def _collective(row: dict) -> Check:
    cluster = presets.clusters()[row["cluster"]]
    op, n, size = Collective(row["op"]), row["gpus"], row["size_bytes"]
    t = collective_time(op, size, placement(cluster, n, 1), cluster)
    busbw_gb_per_s = bus_factor(op, n) * size / t / 1e9
    return Check("collective", f"{cluster.name} {op.value} {n} GPUs {size / 2**30:g} GiB", "busbw GB/s", row["busbw_gb_per_s"],
                 busbw_gb_per_s, row["source"])


def checks() -> list[Check]:
    data = yaml.safe_load(DATA.read_text())
    return ([_gemm(r) for r in data["gemm"]] + [_attention(r) for r in data["attention"]]
            + [_memory_bound(r) for r in data["memory_bound"]] + [_collective(r) for r in data["collective"]])


def table(rows: list[Check]) -> str:
    lines = ["| kind | case | unit | measured | predicted | error | source |", "|---|---|---|---:|---:|---:|---|"]
    for c in rows:
        lines.append(f"| {c.kind} | {c.what} | {c.unit} | {c.measured:,.1f} | {c.predicted:,.1f} | {c.error:+.1%} | {c.source} |")
    lines += ["", "| kind | checks | median abs error | max abs error |", "|---|---:|---:|---:|"]
    for kind in ("gemm", "attention", "memory-bound", "collective"):
        errs = [abs(c.error) for c in rows if c.kind == kind]
        lines.append(f"| {kind} | {len(errs)} | {statistics.median(errs):.1%} | {max(errs):.1%} |")
    return "\n".join(lines)


INTRO = (
    "Produced by `python benchmarks/kernel_accuracy.py --write docs/accuracy.md`. Every row is a published\n"
    "measurement that no constant of the model was set from (benchmarks/data/kernel_measurements.yaml);\n"
    "the anchors are listed where they are used (presets/gpus.toml, presets/kernels/*.toml,\n"
    "cost_models/comm.py).\n\n"
)


def own_gemm_rows() -> list[dict]:
    """This project's GEMM timings with the model's rate at the same shape on the GPU that ran them.
    The bf16 ceiling of these GPUs is anchored on the `wgrad_bf16` rows at 16384 tokens (and the
    burn-in cube), so those rows are marked as anchors; every other row is held out."""
    rows = []
    for name, gpu_name in OWN_RUNS:
        data = json.loads((MEASURED / name).read_text())
        gpu = presets.gpus()[gpu_name]
        for r in data["gemm"]:
            if "tflops" not in r:
                continue
            operand, out, precision = VARIANTS[r["variant"]]
            s = K.gemm_seconds(r["m"], r["n"], r["k"], 1, gpu, precision, operand_bytes=operand, out_bytes=out)
            tokens = r["m"] if r["variant"] == "fwd_bf16" else r["k"]
            rows.append({"gpu": gpu_name, "variant": r["variant"], "shape": r["shape"], "tokens": tokens,
                         "measured": r["tflops"], "predicted": 2 * r["m"] * r["n"] * r["k"] / s / 1e12,
                         "anchor": r["variant"] == "wgrad_bf16" and r["k"] == 16384})
    return rows


def own_gemm_table(rows: list[dict]) -> str:
    """Per GPU and variant: the rate at each token count relative to the same shape's rate at 16384
    tokens (median over the shapes), measured and modelled, and the held-out rows' absolute error."""
    tokens = sorted({r["tokens"] for r in rows})
    head = " | ".join(f"{t}" for t in tokens)
    lines = [f"| GPU | GEMM | {head} | held-out rows | median abs error | max abs error |",
             "|---|---|" + "---:|" * (len(tokens) + 3)]
    for gpu in dict.fromkeys(r["gpu"] for r in rows):
        for variant in VARIANTS:
            mine = [r for r in rows if r["gpu"] == gpu and r["variant"] == variant]
            top = {r["shape"]: r for r in mine if r["tokens"] == tokens[-1]}
            cells = []
            for t in tokens:
                at = [r for r in mine if r["tokens"] == t]
                meas = statistics.median(r["measured"] / top[r["shape"]]["measured"] for r in at)
                pred = statistics.median(r["predicted"] / top[r["shape"]]["predicted"] for r in at)
                cells.append(f"{meas:.2f} / {pred:.2f}")
            held = [abs(r["predicted"] / r["measured"] - 1) for r in mine if not r["anchor"]]
            lines.append(f"| {gpu} | {variant} | " + " | ".join(cells)
                         + f" | {len(held)} | {statistics.median(held):.1%} | {max(held):.1%} |")
    return "\n".join(lines)


OWN_INTRO = """
### GEMMs measured on this project's GPUs

`python benchmarks/gpu_kernels.py` on one H100 80GB HBM3 and one H200 (700 W, torch 2.11.0+cu130,
2026-11-27; benchmarks/data/measured/): seven weight-gradient shapes of published layouts (output
4608x12288 to 12288x12288) at 512 to 16384 tokens, after a burn-in at the power limit. Each cell is
the rate at that token count over the same shape's rate at 16384 tokens, median over the shapes,
measured / model: the fall-off with short K that decides the micro-batch size. `wgrad_bf16_acc32` is
Megatron's gradient accumulation fusion (bf16 inputs accumulated into the fp32 main gradient,
cublasGemmEx with beta = 1); `fwd_bf16` varies the rows (tokens) instead of K. The error columns
compare absolute rates on the rows no constant was set from (the bf16 ceiling is anchored on the
`wgrad_bf16` rows at 16384 tokens).

"""


# the families each measured torch SDPA backend is compared with: SDPA's flash backend against the
# flash-attn package's FlashAttention-2 curves and its own (sdpa_flash), its cuDNN backend against cuDNN
SDPA_FAMILIES = {"flash": (AttentionBackend.FA2, AttentionBackend.SDPA_FLASH), "cudnn": (AttentionBackend.CUDNN,)}


def own_attention_rows() -> list[dict]:
    """This project's torch SDPA timings (forward, and backward as fwd+bwd less fwd) against each
    family SDPA_FAMILIES compares the backend with, priced at the burst clock the benchmark ran at
    (the board stayed at 1905-1965 MHz through it: kernels.py, Clock). Sequence lengths beyond the
    curves' grid (32k) are left out: the curves end at 16k."""
    rows = []
    for name, gpu_name in OWN_RUNS:
        data = json.loads((MEASURED / name).read_text())
        gpu = presets.gpus()[gpu_name]
        seq_lens = K.table_for(gpu).seq_lens
        for r in data["attention"]:
            if "fwd_tflops" not in r or r["seq"] > seq_lens[-1]:
                continue
            flop = attention_flop(r)
            shape = dict(causal=r["causal"], head_dim=r["head_dim"], q_len=r["seq"], k_len=r["seq"],
                         batch_heads=r["batch"] * r["heads"], rate_scale=K.isolated_scale(gpu))
            for family in SDPA_FAMILIES[r["backend"]]:
                for p, measured, work in ((K.Pass.FORWARD, r["fwd_tflops"], flop), (K.Pass.BACKWARD, r["bwd_tflops"], 2.5 * flop)):
                    s = attention_seconds(gpu, family, p, **shape)
                    rows.append({"gpu": gpu_name, "backend": r["backend"], "family": family.value, "pass": p.value,
                                 "head_dim": r["head_dim"], "causal": r["causal"], "gqa": r["kv_heads"] != r["heads"],
                                 "seq": r["seq"], "measured": measured, "predicted": work / s / 1e12})
    return rows


def own_attention_table(rows: list[dict]) -> str:
    """Per GPU, SDPA backend, family priced, head dim, mask and pass: model / measured − 1 at each
    sequence length (batch x seqlen = 16k tokens, heads x head_dim = 2048; GQA rows 32 query and 8
    key/value heads), and the median over the row."""
    seqs = sorted({r["seq"] for r in rows})
    lines = ["| GPU | SDPA backend | priced as | head dim | mask | pass | " + " | ".join(str(s) for s in seqs) + " | median |",
             "|---|---|---|---:|---|---|" + "---:|" * (len(seqs) + 1)]
    keys = dict.fromkeys((r["gpu"], r["backend"], r["family"], r["head_dim"], r["causal"], r["gqa"], r["pass"]) for r in rows)
    for gpu, backend, family, d, causal, gqa, p in keys:
        at = {r["seq"]: r["predicted"] / r["measured"] - 1 for r in rows
              if (r["gpu"], r["backend"], r["family"], r["head_dim"], r["causal"], r["gqa"], r["pass"]) == (gpu, backend, family, d, causal, gqa, p)}
        mask = ("causal" if causal else "full") + (" GQA 32/8" if gqa else "")
        cells = [f"{at[s]:+.1%}" if s in at else "" for s in seqs]
        lines.append(f"| {gpu} | {backend} | {family} | {d} | {mask} | {p} | " + " | ".join(cells)
                     + f" | {statistics.median(at.values()):+.1%} |")
    return "\n".join(lines)


OWN_ATTENTION_INTRO = """

### Attention measured on this project's GPUs

The same runs of `python benchmarks/gpu_kernels.py` timed torch's `F.scaled_dot_product_attention`
(bf16, `sdpa_kernel` restricted to one backend) at the FlashAttention benchmark's shapes: SDPA's flash
backend and its cuDNN backend, forward alone and forward + backward, backward being the difference.
Each cell is the model's TFLOP/s over the measured one, minus one (positive: the model is faster),
priced with the family named, at the burst clock the benchmark ran at.

"""


def report() -> str:
    return (table(checks()) + "\n" + OWN_INTRO + own_gemm_table(own_gemm_rows())
            + OWN_ATTENTION_INTRO + own_attention_table(own_attention_rows()))


def main() -> int:
    return table_command(__doc__.splitlines()[0], report, SECTION, INTRO)


if __name__ == "__main__":
    sys.exit(main())
