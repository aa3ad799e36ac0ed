"""Predicted vs measured throughput (tokens/s/GPU) on every published run with a complete layout.

The runs, their layouts and the conversion of each source's figure to tokens/s/GPU come from
benchmarks/published.py (which also lists what it leaves out, and why). `--fit` refits the
efficiency constants of cost_models.calibration on these runs: every constant is shared by all
runs (nothing depends on a run, a model or a source), and the objective weighs each source
equally: the mean over sources of the mean |log(predicted / measured)|. `--holdout` refits once
per source without it and scores that source, which says how well the constants carry to a
source they were not fitted on.

Run: python benchmarks/time_accuracy.py [--fit] [--holdout] [--write docs/accuracy.md]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.memory_accuracy import write_section  # noqa: E402
from benchmarks.published import PublishedRun, load  # noqa: E402
from cost_models.calibration import DEFAULT, PER_ARCHITECTURE, Calibration  # noqa: E402
from cost_models.enums import AttentionKernel, Framework  # noqa: E402
from cost_models.job import Job  # noqa: E402
from cost_models.step_time import time_estimate  # noqa: E402

# Ranges the fit may explore (physical bounds: an efficiency is a fraction of a peak).
BOUNDS = {
    "gemm_efficiency": (0.3, 0.95),
    "fp8_gemm_efficiency": (0.2, 0.95),
    "fp8_rowwise_gemm_ratio": (0.3, 1.0),
    "attention_efficiency": (0.15, 0.9),
    "te_attention_efficiency": (0.15, 0.9),
    "gemm_half_dim": (1.0, 1024.0),
    "hbm_efficiency": (0.5, 0.95),
    "tp_overlap_fraction": (0.05, 1.0),
    "moe_layer_overhead_s": (1e-5, 0.05),
}


@dataclass(frozen=True)
class Row:
    run: PublishedRun
    predicted: float
    bottleneck: str
    mfu: float

    @property
    def error(self) -> float:
        return self.predicted / self.run.measured_tokens_per_s_per_gpu - 1


def evaluate(cases: list[tuple[PublishedRun, Job]], cal: Calibration) -> list[Row]:
    rows = []
    for run, job in cases:
        t = time_estimate(job, calibration=cal)
        rows.append(Row(run, t.tokens_per_s_per_gpu, t.bottleneck, t.mfu))
    return rows


def objective(rows: list[Row]) -> float:
    by_group: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        by_group[r.run.group].append(abs(math.log(r.predicted / r.run.measured_tokens_per_s_per_gpu)))
    return statistics.mean(statistics.mean(v) for v in by_group.values())


def coordinates(cases: list[tuple[PublishedRun, Job]]) -> tuple[str, ...]:
    """What the fit varies: each scalar constant, and each per-architecture constant for every
    architecture the runs use it on (fp8 only where runs are fp8)."""
    def archs(precisions: set[str]) -> list[str]:
        return sorted({j.cluster.gpu.architecture for _, j in cases if j.training.precision.value in precisions})

    # flash runs split by whose kernel they use (compute.attention_efficiency): Transformer Engine's
    # on the architectures it is calibrated for, flash-attn/SDPA otherwise
    te_archs = set(DEFAULT.te_attention_efficiency)

    def uses_te(j: Job) -> bool:
        return j.training.framework is Framework.MEGATRON and j.cluster.gpu.architecture in te_archs

    flash = [j for _, j in cases if j.training.attention is AttentionKernel.FLASH]
    used = {"gemm_efficiency": archs({"bf16", "fp16"}), "fp8_gemm_efficiency": archs({"fp8"}),
            "attention_efficiency": sorted({j.cluster.gpu.architecture for j in flash if not uses_te(j)}),
            "te_attention_efficiency": sorted({j.cluster.gpu.architecture for j in flash if uses_te(j)})}
    out = []
    for name in Calibration.fitted_fields():
        if name == "hbm_efficiency":
            continue  # sourced, not fitted
        if name in PER_ARCHITECTURE:
            out += [f"{name}__{a}" for a in used[name]]
        else:
            out.append(name)
    return tuple(out)


def _value(cal: Calibration, key: str) -> float:
    name, _, arch = key.partition("__")
    return cal.efficiency(name, arch) if arch else getattr(cal, name)


def fit(cases: list[tuple[PublishedRun, Job]], start: Calibration, fields: tuple[str, ...], rounds: int = 3) -> Calibration:
    """Coordinate descent: golden-section search on each constant in turn (log scale), a few rounds."""
    cal = start
    phi = (math.sqrt(5) - 1) / 2
    for _ in range(rounds):
        for name in fields:
            lo, hi = (math.log(b) for b in BOUNDS[name.partition("__")[0]])

            def f(x: float, name: str = name) -> float:
                return objective(evaluate(cases, cal.with_values(**{name: math.exp(x)})))

            a, b = lo, hi
            c, d = b - phi * (b - a), a + phi * (b - a)
            fc, fd = f(c), f(d)
            for _ in range(14):
                if fc < fd:
                    b, d, fd = d, c, fc
                    c = b - phi * (b - a)
                    fc = f(c)
                else:
                    a, c, fc = c, d, fd
                    d = a + phi * (b - a)
                    fd = f(d)
            best = (c + d) / 2
            if f(best) < objective(evaluate(cases, cal)):
                cal = cal.with_values(**{name: math.exp(best)})
    return cal


def _stats(errors: list[float]) -> tuple[float, float, float]:
    e = sorted(abs(x) for x in errors)
    p90 = e[min(len(e) - 1, math.ceil(0.9 * len(e)) - 1)]
    return statistics.median(e), p90, e[-1]


def _layout(job: Job) -> str:
    lay = job.layout
    parts = [f"tp{lay.tp}", f"pp{lay.pp}" + (f"v{lay.vpp}" if lay.vpp > 1 else ""), f"dp{job.dp}"]
    if lay.cp > 1:
        parts.append(f"cp{lay.cp}")
    if lay.ep > 1:
        parts.append(f"ep{lay.ep}")
    parts.append(f"z{int(job.zero)}")
    parts.append(f"mbs{lay.mbs}")
    parts.append({"none": "", "selective": "sel", "full": "full"}[lay.recompute.value])
    return " ".join(p for p in parts if p)


def table(rows: list[Row], jobs: dict[str, Job]) -> str:
    lines = [
        "| run | GPUs | precision | layout | measured | predicted | error | bottleneck |",
        "|---|---:|---|---|---:|---:|---:|---|",
    ]
    for r in rows:
        job = jobs[r.run.id]
        lines.append(
            f"| {r.run.id} | {job.gpus} {job.cluster.gpu.name} | {job.training.precision.value} | {_layout(job)} | "
            f"{r.run.measured_tokens_per_s_per_gpu:,.0f} | {r.predicted:,.0f} | {r.error:+.1%} | {r.bottleneck} |"
        )
    return "\n".join(lines)


def summary(rows: list[Row], holdout: dict[str, float] | None = None) -> str:
    groups: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        groups[r.run.group].append(r.error)
    head = "| source | runs | median abs error | p90 | max | mean signed |" + (" median, fitted without it |" if holdout else "")
    lines = [head, "|---|---:|---:|---:|---:|---:|" + ("---:|" if holdout else "")]
    for g, errs in [*groups.items(), ("all", [r.error for r in rows])]:
        med, p90, mx = _stats(errs)
        extra = f" {holdout[g]:.1%} |" if holdout and g in holdout else (" |" if holdout else "")
        lines.append(f"| {g} | {len(errs)} | {med:.1%} | {p90:.1%} | {mx:.1%} | {statistics.mean(errs):+.1%} |{extra}")
    return "\n".join(lines)


def calibration_table(cal: Calibration) -> str:
    lines = ["| constant | value |", "|---|---:|"]
    for name in Calibration.fitted_fields():
        value = getattr(cal, name)
        if name in PER_ARCHITECTURE:
            lines += [f"| {name} ({arch}) | {v:.3g} |" for arch, v in value.items()]
        else:
            lines.append(f"| {name} | {value:.3g} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="refit the efficiency constants and score with them")
    parser.add_argument("--holdout", action="store_true", help="also refit without each source and score it")
    parser.add_argument("--write", type=Path, help="also write the tables into this markdown file")
    args = parser.parse_args()
    runs, skipped = load()
    cases = [(r, r.job()) for r in runs]
    jobs = {r.id: j for r, j in cases}
    fields = coordinates(cases)
    cal = DEFAULT
    started = time.perf_counter()
    if args.fit:
        cal = fit(cases, DEFAULT, fields)
        # architectures without runs take the newest measured generation's value (hopper)
        cal = cal.with_values(**{f"{n}__default": cal.efficiency(n, "hopper") for n in PER_ARCHITECTURE if n != "te_attention_efficiency"})
        print("fitted:", {k: round(_value(cal, k), 4) for k in fields}, f"({time.perf_counter() - started:.0f} s)")
    holdout = None
    if args.holdout:
        holdout = {}
        for g in sorted({r.group for r in runs}):
            train = [c for c in cases if c[0].group != g]
            test = [c for c in cases if c[0].group == g]
            held = fit(train, cal, fields, rounds=1)
            holdout[g] = _stats([r.error for r in evaluate(test, held)])[0]
    rows = evaluate(cases, cal)
    text = "\n\n".join([summary(rows, holdout), calibration_table(cal), table(rows, jobs)])
    print(text)
    print(f"\nobjective {objective(rows):.4f}; {len(rows)} runs, {len(skipped)} entries left out")
    if args.write:
        left_out = "\n".join(f"- {i}: {why}" for i, why in skipped)
        intro = (
            "Produced by `python benchmarks/time_accuracy.py --write docs/accuracy.md`" + (" --fit" if args.fit else "")
            + ". Measured = each source's throughput\nas tokens/s/GPU (benchmarks/published.py converts TFLOP/s and step "
            "times with the source's own FLOP count);\npredicted = `planner estimate` of the same layout with the "
            "constants below. Errors are predicted/measured − 1.\n\n"
        )
        write_section(args.write, text + "\n\nLeft out, and why:\n\n" + left_out, SECTION, intro)
    return 0


SECTION = "## Throughput vs published runs"

if __name__ == "__main__":
    sys.exit(main())
