"""Predicted peak memory vs the published torchtitan measurements (benchmarks/data/published_runs.yaml),
and whether the model calls any published layout that ran out of memory.

torchtitan logs `max_reserved_gib`: the caching allocator's reserved peak, max over ranks and steps.
That excludes the CUDA context and NCCL's buffers, so the prediction compared is the model's peak
minus those two lines. The model's compile term is the fused loss of
torchtitan's --compile (2025 on); rows compiled at the Dec 2024 commit (blocks only) are predicted
as eager jobs. The table names every row's techniques.

Every published run of benchmarks/published.py ran on its GPUs, so the model must not call its
layout out of memory: `fit_rows` lists each one's predicted peak against the GPU's capacity and
against the usable memory the planner allows by default (capacity less DEFAULT_HEADROOM).

Run: python benchmarks/memory_accuracy.py [--write docs/accuracy.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from cost_models.memory import DEFAULT_HEADROOM, memory_estimate
from cost_models.rules import resolve
from cost_models.units import GiB
from planner import presets

sys.path.insert(0, str(Path(__file__).parent))
from published import (  # the torchtitan row -> job mapping, shared with the time benchmark
    DATA,
    load,
    TORCHTITAN_MODELS,
    torchtitan_cluster,
    torchtitan_layout,
    torchtitan_training,
)


@dataclass(frozen=True)
class Row:
    id: str
    techniques: str
    measured_gib: float
    predicted_gib: float
    peak_rank: int

    @property
    def error(self) -> float:
        return (self.predicted_gib - self.measured_gib) / self.measured_gib


def predict(row: dict) -> Row:
    model = presets.models()[TORCHTITAN_MODELS[row["model"]["name"]]]
    # The compile rule (the Dec 2024 commit compiled the blocks only) lives in published.torchtitan_training.
    job = resolve(model, torchtitan_cluster(row), torchtitan_training(row), torchtitan_layout(row, model.num_layers))
    est = memory_estimate(job)
    allocator = [s.peak_bytes - s.breakdown.value("overhead/cuda_context") - s.breakdown.value("overhead/nccl") for s in est.stages]
    peak = max(range(len(allocator)), key=allocator.__getitem__)
    return Row(row["id"], row["layout"].get("techniques") or "", row["measured"]["memory_gib"], allocator[peak] / GiB, peak)


def rows() -> list[Row]:
    data = yaml.safe_load(DATA.read_text())
    wanted = [e for e in data if e.get("group") == "torchtitan" and (e.get("measured") or {}).get("memory_gib")]
    return [predict(e) for e in wanted]


def table(results: list[Row]) -> str:
    lines = [
        "| run | techniques | measured GiB | predicted GiB | error |",
        "|---|---|---:|---:|---:|",
    ]
    for r in results:
        lines.append(f"| {r.id} | {r.techniques} | {r.measured_gib:.1f} | {r.predicted_gib:.1f} | {r.error:+.1%} |")
    errs = [abs(r.error) for r in results]
    lines.append("")
    lines.append(
        f"{len(results)} runs; median |error| {statistics.median(errs):.1%}, max {max(errs):.1%}, "
        f"within 10%: {sum(e <= 0.10 for e in errs)}/{len(errs)}."
    )
    return "\n".join(lines)


@dataclass(frozen=True)
class Fit:
    id: str
    predicted_gib: float
    capacity_gib: float

    @property
    def over_capacity(self) -> bool:
        return self.predicted_gib > self.capacity_gib

    @property
    def over_usable(self) -> bool:
        return self.predicted_gib > self.capacity_gib * (1 - DEFAULT_HEADROOM)


def fit_rows() -> list[Fit]:
    """Every published run that ran: its predicted peak (largest stage) and its GPU's capacity."""
    out = []
    for run in load()[0]:
        est = memory_estimate(run.job())
        out.append(Fit(run.id, max(s.peak_bytes for s in est.stages) / GiB, est.capacity_bytes / GiB))
    return out


def fit_table(fits: list[Fit]) -> str:
    flagged = [f for f in fits if f.over_usable]
    lines = [f"{len(fits)} published layouts that ran: {sum(f.over_capacity for f in fits)} predicted above their GPU's "
             f"capacity, {len(flagged)} above the usable memory (capacity less the default {DEFAULT_HEADROOM:.0%} headroom).", ""]
    if flagged:
        lines += ["| run | predicted GiB | capacity GiB | above |", "|---|---:|---:|---|"]
        for f in sorted(flagged, key=lambda f: -f.predicted_gib / f.capacity_gib):
            lines.append(f"| {f.id} | {f.predicted_gib:.1f} | {f.capacity_gib:.1f} | {'capacity' if f.over_capacity else 'usable'} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="also write the table into this markdown file")
    args = parser.parse_args()
    text = table(rows())
    fits = fit_table(fit_rows())
    print(text + "\n\n" + fits)
    if args.write:
        intro = (
            "Produced by `python benchmarks/memory_accuracy.py --write docs/accuracy.md`. Measured = torchtitan's\n"
            "logged `max_reserved_gib` (max over ranks); predicted = the model's peak stage minus the CUDA-context\n"
            "and NCCL lines, which the caching allocator does not see. The compile term is torchtitan's compiled\n"
            "loss (2025 on); rows compiled at the Dec 2024 commit, which compiled the blocks only, are predicted\n"
            "as eager jobs.\n\n"
        )
        write_section(args.write, text, SECTION, intro)
        write_section(args.write, fits, FIT_SECTION, (
            "Produced by `python benchmarks/memory_accuracy.py --write docs/accuracy.md`. Every layout of the\n"
            "step-time table ran as published, so none should be predicted above its GPU's memory.\n\n"))
    return 0


SECTION = "## Peak memory vs published torchtitan runs"
FIT_SECTION = "## Published layouts that ran, against the memory model"


def table_command(description: str, make_text, section: str, intro: str) -> int:  # type: ignore[no-untyped-def]
    """The command of a benchmark that prints one table and, with --write FILE, puts it into FILE as
    `section` under `intro`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--write", type=Path, help="also write the table into this markdown file")
    args = parser.parse_args()
    text = make_text()
    print(text)
    if args.write:
        write_section(args.write, text, section, intro)
    return 0


def write_section(path: Path, text: str, section: str, intro: str) -> None:
    """Replace (or append) one script's section of a markdown page, leaving the other sections."""
    body = f"{section}\n\n{intro}{text}\n"
    old = path.read_text() if path.exists() else "# Accuracy\n"
    if section in old:
        head, _, rest = old.partition(section)
        tail = rest.split("\n## ", 1)
        path.write_text(head + body + ("\n## " + tail[1] if len(tail) > 1 else ""))
    else:
        path.write_text(old.rstrip() + "\n\n" + body)


if __name__ == "__main__":
    sys.exit(main())
