"""Predicted peak memory vs the published torchtitan measurements (benchmarks/data/published_runs.yaml).

torchtitan logs `max_reserved_gib`: the caching allocator's reserved peak, max over ranks and steps.
That excludes the CUDA context and NCCL's buffers, so the prediction compared is the model's peak
minus those two lines. The model's compile term is the fused loss of
torchtitan's --compile (2025 on); rows compiled at the Dec 2024 commit (blocks only) are predicted
as eager jobs. The table names every row's techniques.

Run: python benchmarks/memory_accuracy.py [--write docs/accuracy.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from cost_models.memory import memory_estimate
from cost_models.rules import resolve
from cost_models.units import GiB
from planner import presets

sys.path.insert(0, str(Path(__file__).parent))
from published import (  # the torchtitan row -> job mapping, shared with the time benchmark
    DATA,
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="also write the table into this markdown file")
    args = parser.parse_args()
    text = table(rows())
    print(text)
    if args.write:
        intro = (
            "Produced by `python benchmarks/memory_accuracy.py --write docs/accuracy.md`. Measured = torchtitan's\n"
            "logged `max_reserved_gib` (max over ranks); predicted = the model's peak stage minus the CUDA-context\n"
            "and NCCL lines, which the caching allocator does not see. The compile term is torchtitan's compiled\n"
            "loss (2025 on); rows compiled at the Dec 2024 commit, which compiled the blocks only, are predicted\n"
            "as eager jobs.\n\n"
        )
        write_section(args.write, text, SECTION, intro)
    return 0


SECTION = "## Peak memory vs published torchtitan runs"


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
