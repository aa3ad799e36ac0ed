"""Predicted peak memory vs every published run that measured it (benchmarks/data/published_runs.yaml),
source by source, and whether the model calls any published layout that ran out of memory.

Each source measured a different number, read from its code (`SOURCES`): the caching allocator's
reserved peak (torch.cuda.max_memory_reserved) or its allocated peak (max_memory_allocated), the
maximum over ranks or one rank's. Neither sees the CUDA context or NCCL's buffers, so the prediction
compared is the model's stage peak minus those two lines, and for an allocated peak also minus the
allocator's lines, reserved but not allocated: fragmentation and the other backward moment's cached
blocks. A row is predicted from the same job benchmarks/published.py builds
for the step-time comparison; rows it cannot build are listed with the reason.

The memory model's one fitted constant, the caching allocator's overhead per byte that comes and goes
during a step (cost_models.memory.FRAGMENTATION), is fitted here and judged out of sample
(`fit_fragmentation`): on a grid, over the rows whose prediction it moves (the reserved counters), to
the most rows within 10% (the memory target is every measured row within 10%), ties to the smaller
mean over source families of the mean |log(predicted / measured)| (benchmarks/time_accuracy.py's
objective). Leave-one-source-out:
each source family predicted with the fraction fitted on the others only, or the prior where fewer than
MIN_RUNS rows of MIN_FAMILIES families remain.

Every published run of benchmarks/published.py ran on its GPUs, so the model must not call its
layout out of memory: `fit_rows` lists each one's predicted peak against the GPU's capacity and
against the usable memory the planner allows by default (capacity less DEFAULT_HEADROOM).

Run: python benchmarks/memory_accuracy.py [--write docs/accuracy.md]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from pathlib import Path

from cost_models.memory import DEFAULT_HEADROOM, MemoryEstimate, allocator_counters, memory_estimate
from cost_models.units import GiB

sys.path.insert(0, str(Path(__file__).parent))
from published import Loaded, PublishedRun, entries, family, load_all  # the row -> job mapping, shared with the time benchmark


class Metric(StrEnum):
    RESERVED = "max reserved"  # torch.cuda.max_memory_reserved: blocks the caching allocator holds
    ALLOCATED = "max allocated"  # torch.cuda.max_memory_allocated: live tensors only


class Ranks(StrEnum):
    MAX = "max over ranks"
    FIRST = "global rank 0"  # pipeline rank 0
    GIVEN = "one global rank"  # Measure.rank, on its pipeline rank (pipeline_rank)


@dataclass(frozen=True)
class Measure:
    metric: Metric
    ranks: Ranks
    source: str  # where the source's code takes the number
    rank: int = 0  # the global rank that logs, for Ranks.GIVEN

    @property
    def compared(self) -> str:
        return f"global rank {self.rank}" if self.ranks is Ranks.GIVEN else str(self.ranks)

    def pipeline_rank(self, num_gpus: int, pp: int) -> int | None:
        """The pipeline rank whose stage peak is compared; None for the largest. Global rank r is on
        pipeline rank r // (num_gpus / pp): pipeline parallelism is the outermost dimension of
        torchtitan's device mesh, [pp, dp_replicate, dp_shard, cp, tp] in row-major order
        (torchtitan@8a749c618^ torchtitan/distributed/parallel_dims.py:147-158, init_device_mesh),
        and each pipeline rank's stages are stage_ids_this_rank's (pipeline_parallel.py:107-124, 277,
        343: pp_rank + s * pp for a looped schedule), the stages the memory model gives that rank."""
        if self.ranks is Ranks.MAX:
            return None
        return 0 if self.ranks is Ranks.FIRST else self.rank // (num_gpus // pp)


KEMPNERFORGE = ("the step log's peak_gb = torch.cuda.max_memory_allocated / 1024^3 "
                "(KempnerInstitute/KempnerForge@5666d0d kempnerforge/metrics/memory.py:31-33, tracker.py:128-140), "
                "logged by rank 0 only (metrics/logger.py:66-97, rank_zero_only)")

# torchtitan's DeepSeek-V3 PR descriptions (published.DSV3_CODE): the step line's "memory:" is
# max_reserved_gib, torch.cuda.memory_stats()["reserved_bytes.all.peak"], its peak reset after every
# logged step (torchtitan/components/metrics.py at each run's commit), printed by the ranks in LOG_RANK,
# 0 unless set (run_train.sh:14, torchrun --local-ranks-filter)
TORCHTITAN_PR = ("the step line's max_reserved_gib (reserved_bytes.all.peak since the last logged step; torchtitan@{commit} "
                 "torchtitan/components/metrics.py:{lines}) of the LOG_RANK rank (run_train.sh, default 0)")

SOURCES = {
    "torchtitan": Measure(Metric.RESERVED, Ranks.MAX, (
        "torchtitan's logged max_reserved_gib (torch.cuda.max_memory_reserved), the docs' peak the maximum "
        "over ranks (benchmarks/data/published_runs.md)")),
    "torchao_torchtitan_bench": Measure(Metric.RESERVED, Ranks.FIRST, (
        "torchtitan's logged 'memory', torch.cuda.memory_stats' reserved_bytes.all.peak in GiB "
        "(torchtitan/components/metrics.py:58-65, 384 at 54ef42221; :63-70, 412 at 6fc499f6f), the peak reset "
        "after each log, which comes at step 1 and every log_freq = 10 steps (llama3_8b.toml; metrics.py:338-339, "
        "394 and :353-354, 422); printed by rank 0 alone (run_train.sh LOG_RANK=0, torchrun --local-ranks-filter); "
        "parse_torchtitan_logs.py takes the maximum over the printed steps (pytorch/ao@8c81863ba "
        "benchmarks/float8/training/parse_torchtitan_logs.py:21-38)")),
    "fp8lm": Measure(Metric.RESERVED, Ranks.MAX, (
        "FP8-LM Table 5 'GPU Mem. (GB)': no source names the counter. The paper does not; the authors' GPT "
        "scripts run Megatron-LM@0609f27f (Azure/MS-AMP-Examples@d836034 third_party/Megatron-LM), whose one "
        "memory log is report_memory (megatron/utils.py:81-95: allocated, max allocated, reserved and max "
        "reserved in MB of 1024^2 bytes, from data-parallel rank 0 of every tp and pp rank), printed once, "
        "after the first logged iteration (megatron/training.py:667-670; the scripts log every iteration); "
        "their patch (gpt3/Megatron-LM.patch) logs throughput and TFLOPs, no memory. The same team's README "
        "memory figure (Swin-1.0B, ViT-1.2B) moved from nvidia-smi to torch.cuda.max_memory_allocated "
        "(Azure/MS-AMP@64cbcc1), which says nothing of Table 5. The reserved counter is compared. GB are 2^30 "
        "bytes: both counters those scripts or nvidia-smi print are in MiB, and the table's own "
        "'Weight-related Comm. Volume (GB)' of the bf16 rows is the distributed optimizer's bf16 all-gather "
        "and fp32 reduce-scatter per step in units of 2^30 bytes, not 10^9 (tests/test_accuracy.py)")),
    "zerobubble": Measure(Metric.RESERVED, Ranks.MAX, (
        "'Memory (GB)': sail-sg/zero-bubble-pipeline-parallelism@ed85b11c prints only Megatron's "
        "report_memory (megatron/utils.py:109-122: max allocated and max reserved, MiB, data-parallel rank "
        "0 of every stage); which the table took is not stated, the reserved one compared")),
    "vocabpar": Measure(Metric.RESERVED, Ranks.MAX, (
        "sail-sg/VocabularyParallelism@6191c3bf artifact/quick_exp.sh:61 and show_result_full_exp.py:60 "
        "parse report_memory's 'max reserved' of every pipeline stage; Table 5 takes the maximum")),
    "nanotron_ultrascale": Measure(Metric.RESERVED, Ranks.FIRST, (
        "nanotron's bench CSV, written by world rank 0 only (huggingface/nanotron@c2528430 "
        "src/nanotron/helpers.py:609-610 'Mem Alloc'/'Mem Res', :674-675); the figure does not say which "
        "column, and only the reserved one fits: the CSV is written at iteration 3 after the step "
        "(trainer.py:455-466, 665-666), and log_memory resets the peak counters right after the "
        "forward-backward (trainer.py:497-498, logging.py:250-259), so 'Mem Alloc' is the peak of the "
        "gradient sync and optimizer step alone, at most rank 0's model states with ZeRO-1's parameter "
        "all-gather buffers or DDP's buckets, below the figure on all 26 rows (tests/test_accuracy.py), while "
        "the reserved one still counts every block the caching allocator holds, the forward-backward's included")),
    "tt_pr1504": Measure(Metric.RESERVED, Ranks.FIRST, TORCHTITAN_PR.format(commit="decfd3fef^", lines="70, 412, 422")),
    "tt_pr1610": Measure(Metric.RESERVED, Ranks.FIRST, TORCHTITAN_PR.format(commit="d0cdb1433^", lines="70, 414, 424")),
    "tt_pr1616": Measure(Metric.RESERVED, Ranks.GIVEN, TORCHTITAN_PR.format(commit="8a749c618^", lines="70, 414, 424")
                         + "; this run set LOG_RANK=6, on pipeline rank 3 (stages 3 and 7)", rank=6),
    "tt_pr2107": Measure(Metric.RESERVED, Ranks.FIRST, TORCHTITAN_PR.format(commit="d021aa9ca^", lines="77, 452, 462") + (
        "; DeepEP's NVLink and RDMA buffers are cudaMalloc/cuMem and NVSHMEM allocations outside the caching "
        "allocator, which the counter does not see (deepseek-ai/DeepEP@b57e5e2, the last commit before the PR, which "
        "pins none: csrc/deep_ep.cpp:51-76, 182, 368; csrc/kernels/runtime.cu:75-77), its received tokens torch "
        "tensors (deep_ep.cpp:656)")),
    "kempnerforge_mfu_scaling": Measure(Metric.ALLOCATED, Ranks.FIRST, KEMPNERFORGE),
    "kempnerforge_config_validation": Measure(Metric.ALLOCATED, Ranks.FIRST, KEMPNERFORGE),
}


@dataclass(frozen=True)
class Row:
    id: str
    group: str
    measured_gib: float
    predicted_gib: float
    peak_rank: int  # the pipeline rank compared

    @property
    def error(self) -> float:
        return (self.predicted_gib - self.measured_gib) / self.measured_gib


def allocator_bytes(est: MemoryEstimate, metric: Metric) -> list[int]:
    """What the caching allocator counts on each stage: the peak less the lines allocated outside it
    (memory.OUTSIDE_ALLOCATOR: the CUDA context, NCCL's buffers, DeepEP's buffers, Transformer Engine's
    userbuffers), and for the allocated peak less the fragmentation and cached-blocks lines as well."""
    return [allocator_counters(s.breakdown)[metric is Metric.ALLOCATED] for s in est.stages]


def compared_stage(per_stage: list[int], rank: int | None) -> int:
    """The pipeline rank whose peak is compared: `rank`, or where it is None (Measure.pipeline_rank) the largest."""
    return max(range(len(per_stage)), key=per_stage.__getitem__) if rank is None else rank


def predict(run, measured_gib: float) -> Row:  # type: ignore[no-untyped-def]
    how = SOURCES[run.group]
    per_stage = allocator_bytes(memory_estimate(run.job()), how.metric)
    rank = compared_stage(per_stage, how.pipeline_rank(run.cluster.num_gpus, run.layout.pp))
    return Row(run.id, run.group, measured_gib, per_stage[rank] / GiB, rank)


def measured_gib(entry: dict) -> float | None:
    return (entry.get("measured") or {}).get("memory_gib")


@cache
def _loaded() -> Loaded:
    """Every entry mapped once (published.load_all) for all of this file's tables; read, never changed."""
    return load_all()


def memory_runs() -> list[PublishedRun]:
    """Every run whose memory is compared: the timed runs, and the runs whose step time the model cannot
    price (published.memory_only) where this file knows the source's counter (SOURCES)."""
    loaded = _loaded()
    return loaded.runs + [run for run, _ in loaded.untimed if run.group in SOURCES]


def rows(group: str | None = None) -> list[Row]:
    """Every published run with a measured memory (of one group, if given), predicted."""
    memory = {e["id"]: measured_gib(e) for e in entries()}
    return [predict(r, memory[r.id]) for r in memory_runs() if memory.get(r.id) and (group is None or r.group == group)]


def unpredicted() -> list[tuple[str, str, str]]:
    """(group, id, reason) of every row that measured memory but whose memory is not predicted."""
    compared = {run.id for run in memory_runs()}
    why = dict(_loaded().skipped)
    return [(e["group"], e["id"], why[e["id"]]) for e in entries() if measured_gib(e) and e["id"] in why and e["id"] not in compared]


@dataclass(frozen=True)
class SourceSummary:
    group: str
    rows: int
    median: float
    p90: float
    within_10: int
    over: int

    @classmethod
    def of(cls, group: str, results: list[Row]) -> SourceSummary:
        errs = sorted(abs(r.error) for r in results)
        p90 = errs[min(len(errs) - 1, int(0.9 * len(errs)))]  # nearest rank at or above the 90th percentile
        return cls(group, len(results), statistics.median(errs), p90, sum(e <= 0.10 for e in errs), sum(r.error > 0 for r in results))


def summaries(results: list[Row]) -> list[SourceSummary]:
    groups = sorted({r.group for r in results}, key=lambda g: list(SOURCES).index(g))
    return [SourceSummary.of(g, [r for r in results if r.group == g]) for g in groups]


def table(results: list[Row], fragmentation: str = "") -> str:
    """The per-source summary, then `fragmentation` (fragmentation_table), then each run."""
    lines = ["| source | rows | compared | median |error| | p90 | within 10% | over / under |",
             "|---|---:|---|---:|---:|---:|---|"]
    for s in summaries(results):
        how = SOURCES[s.group]
        lines.append(f"| {s.group} | {s.rows} | {how.metric}, {how.compared} | {s.median:.1%} | {s.p90:.1%} | "
                     f"{s.within_10}/{s.rows} | {s.over} / {s.rows - s.over} |")
    errs = [abs(r.error) for r in results]
    untimed = {run.id for run, _ in _loaded().untimed}
    alone = [abs(r.error) for r in results if r.id in untimed]
    lines += ["", f"{len(results)} rows; median |error| {statistics.median(errs):.1%}, max {max(errs):.1%}, "
              f"within 10%: {sum(e <= 0.10 for e in errs)}/{len(errs)}. Of them {len(alone)} are rows whose step time is "
              f"not compared (published.memory_only: a power limit, an unstated GPU variant, an unmeasured GPU's or "
              f"attention kernel's curve), {sum(e <= 0.10 for e in alone)} of them within 10%.", ""]
    if fragmentation:
        lines += [fragmentation, ""]
    lines += ["What each source measured:", ""]
    lines += [f"- {g}: {SOURCES[g].source}." for g in dict.fromkeys(r.group for r in results)]
    lines += ["", "| source | run | measured GiB | predicted GiB | error |", "|---|---|---:|---:|---:|"]
    for r in sorted(results, key=lambda r: list(SOURCES).index(r.group)):
        lines.append(f"| {r.group} | {r.id} | {r.measured_gib:.1f} | {r.predicted_gib:.1f} | {r.error:+.1%} |")
    missing = unpredicted()
    if missing:
        lines += ["", f"{len(missing)} rows measured memory but are not predicted (no job is built for them):", ""]
        lines += [f"- {g} {i}: {reason}" for g, i, reason in missing]
    return "\n".join(lines)


# --- the fragmentation fraction, fitted and judged out of sample ------------------------------------

# Its prior: 0.10 of the bytes that come and go during a step, and no published measurement converts
# to it. GMLake (Guo et al., ASPLOS'24, arXiv 2401.08156; intelligent-machine-learning/glake
# GMLake/README.md "Training Performence Evaluation") and STWeaver (Huang et al., arXiv 2507.16274)
# measure PyTorch's caching allocator's fragmentation as 1 - peak active / peak reserved of the whole
# pool: up to 30% (GMLake's README: DeepSpeed ZeRO-3 fine-tuning with LoRA, recomputation and offload
# on A100-80GB; its abstract: 15%, up to 33%, less fragmentation than PyTorch's over eight LLMs) and
# up to 43% (STWeaver: virtual pipeline and recomputation), the baseline's per-run values only as
# figure bars. Per dynamic byte a fraction f of the pool is f / (1 - f) x active / dynamic, and
# neither paper gives its runs' dynamic share of the active peak. So the prior stays at 0.10, the
# value the model carried before this fit (then fitted on torchtitan's 20 rows alone), not a
# measurement. The grid, none to 0.30, is a chosen range, not a converted one: 0.30 is GMLake's largest
# whole-pool figure, which per dynamic byte is at least 0.30 / 0.70 = 0.43 by the conversion above.
FRAGMENTATION_PRIOR = 0.10
FRAGMENTATION_GRID = tuple(i / 100 for i in range(31))
# no constant is fitted on fewer than 5 runs or on a single source (as benchmarks/time_accuracy.py)
MIN_RUNS = 5
MIN_FAMILIES = 2
INFORMS = 0.005  # a row informs the fraction if its prediction moves by more than 0.5% across the grid


@dataclass(frozen=True)
class Case:
    """One measured row, to be predicted at any fragmentation fraction: per stage, what the allocator
    counts less the fragmentation line, and the bytes the fraction multiplies (none where the source
    logs the allocated peak, which leaves the line out)."""

    id: str
    family: str
    measured_gib: float
    rank: int | None  # the pipeline rank compared, None for the largest (Measure.pipeline_rank)
    stages: tuple[tuple[int, float], ...]  # (counted bytes less the fragmentation line, dynamic bytes)

    def predicted_gib(self, fraction: float) -> float:
        per = [fixed + int(fraction * dynamic) for fixed, dynamic in self.stages]
        return per[compared_stage(per, self.rank)] / GiB

    def error(self, fraction: float) -> float:
        return self.predicted_gib(fraction) / self.measured_gib - 1

    @property
    def informs(self) -> bool:
        low, high = (self.predicted_gib(f) for f in (FRAGMENTATION_GRID[0], FRAGMENTATION_GRID[-1]))
        return high / low - 1 > INFORMS


def cases() -> list[Case]:
    """Every published run with a measured memory, as a Case (the same prediction as `predict`)."""
    memory = {e["id"]: measured_gib(e) for e in entries()}
    out = []
    for run in memory_runs():
        if not memory.get(run.id):
            continue
        how = SOURCES[run.group]
        est = memory_estimate(run.job())
        reserved = how.metric is Metric.RESERVED
        stages = tuple(
            (counted - int(s.breakdown.value("overhead/fragmentation")), s.dynamic_bytes) if reserved else (counted, 0)
            for s, counted in zip(est.stages, allocator_bytes(est, how.metric)))
        out.append(Case(run.id, family(run.group), memory[run.id], how.pipeline_rank(run.cluster.num_gpus, run.layout.pp), stages))
    return out


def objective(cs: list[Case], fraction: float) -> tuple[int, float]:
    """Smaller is better: fewer rows outside 10%, then the mean over families of the mean |log(predicted /
    measured)|, each family weighing the same however many rows it has."""
    by: dict[str, list[float]] = defaultdict(list)
    for c in cs:
        by[c.family].append(abs(math.log(c.predicted_gib(fraction) / c.measured_gib)))
    outside = sum(abs(c.error(fraction)) > 0.10 for c in cs)
    return outside, statistics.mean(statistics.mean(v) for v in by.values())


def fit_set(cs: list[Case]) -> list[Case]:
    return [c for c in cs if c.informs]


def fittable(cs: list[Case]) -> bool:
    informed = fit_set(cs)
    return len(informed) >= MIN_RUNS and len({c.family for c in informed}) >= MIN_FAMILIES


def fit_fragmentation(cs: list[Case]) -> float:
    """The grid fraction that fits the rows it moves best; the prior where too few rows or families inform it."""
    if not fittable(cs):
        return FRAGMENTATION_PRIOR
    informed = fit_set(cs)
    return min(FRAGMENTATION_GRID, key=lambda f: objective(informed, f))


@dataclass(frozen=True)
class LeftOut:
    family: str
    fraction: float  # fitted on the other families
    cases: tuple[Case, ...]  # the family's informed rows


def leave_one_source_out(cs: list[Case]) -> list[LeftOut]:
    """Each family whose rows inform the fraction, predicted with the fraction fitted on the others only."""
    informed = fit_set(cs)
    families = sorted({c.family for c in informed})
    return [LeftOut(fam, fit_fragmentation([c for c in cs if c.family != fam]),
                    tuple(c for c in informed if c.family == fam)) for fam in families]


def fragmentation_table(cs: list[Case]) -> str:
    fitted = fit_fragmentation(cs)
    informed = fit_set(cs)
    sizes: dict[str, int] = defaultdict(int)
    for c in informed:
        sizes[c.family] += 1
    loso = leave_one_source_out(cs)
    lines = [
        f"Fragmentation (cost_models.memory.FRAGMENTATION, reserved per byte that comes and goes during a step): "
        f"prior {FRAGMENTATION_PRIOR:.2f}, fitted on all sources {fitted:.2f} (grid {FRAGMENTATION_GRID[0]:.2f} to "
        f"{FRAGMENTATION_GRID[-1]:.2f}; most rows within 10%, then the mean over families of the mean |log error|). "
        f"Fit set: {len(informed)} rows, " + ", ".join(f"{k} {v}" for k, v in sorted(sizes.items()))
        + f"; the other {len(cs) - len(informed)} rows log the allocated peak, which leaves the line out.",
        "",
        "Leave-one-source-out: each family predicted with the fraction fitted on the other families only.",
        "",
        "| left out | rows | fitted on the others | median |error| | within 10% | in-sample median |error| | in-sample within 10% |",
        "|---|---:|---:|---:|---:|---:|---:|"]

    def stats(rows: list[Case], fractions: list[float]) -> tuple[float, int]:
        errs = [abs(c.error(f)) for c, f in zip(rows, fractions)]
        return statistics.median(errs), sum(e <= 0.10 for e in errs)

    every: list[Case] = []
    every_f: list[float] = []
    for out in loso:
        group = list(out.cases)
        med, within = stats(group, [out.fraction] * len(group))
        in_med, in_within = stats(group, [fitted] * len(group))
        lines.append(f"| {out.family} | {len(group)} | {out.fraction:.2f} | {med:.1%} | {within}/{len(group)} | "
                     f"{in_med:.1%} | {in_within}/{len(group)} |")
        every += group
        every_f += [out.fraction] * len(group)
    med, within = stats(every, every_f)
    in_med, in_within = stats(every, [fitted] * len(every))
    lines.append(f"| all | {len(every)} | | {med:.1%} | {within}/{len(every)} | {in_med:.1%} | {in_within}/{len(every)} |")
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
    for run in memory_runs():
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
    path = write_option(__doc__.splitlines()[0])
    text = table(rows(), fragmentation_table(cases()))
    fits = fit_table(fit_rows())
    print(text + "\n\n" + fits)
    if path:
        intro = (
            "Produced by `python benchmarks/memory_accuracy.py --write docs/accuracy.md`. Measured = what each\n"
            "source's code logs (below); predicted = the model's stage peak minus the CUDA-context, NCCL and\n"
            "Transformer Engine userbuffer lines, which the caching allocator does not see, and minus the fragmentation and cached-blocks lines (reserved,\n"
            "not allocated) where the source logs the allocated peak; the stage is the largest one, or pipeline\n"
            "rank 0 where only global rank 0 logs.\n\n"
        )
        write_section(path, text, SECTION, intro)
        write_section(path, fits, FIT_SECTION, (
            "Produced by `python benchmarks/memory_accuracy.py --write docs/accuracy.md`. Every layout of the\n"
            "step-time table ran as published, so none should be predicted above its GPU's memory.\n\n"))
    return 0


SECTION = "## Peak memory vs published runs"
FIT_SECTION = "## Published layouts that ran, against the memory model"


def table_command(description: str, make_text, section: str, intro: str) -> int:  # type: ignore[no-untyped-def]
    """The command of a benchmark that prints one table and, with --write FILE, puts it into FILE as
    `section` under `intro`."""
    path = write_option(description)
    text = make_text()
    print(text)
    if path:
        write_section(path, text, section, intro)
    return 0


def write_option(description: str) -> Path | None:
    """The one option of a benchmark that prints its tables: --write FILE, or None without it."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--write", type=Path, help="also write the tables into this markdown file")
    return parser.parse_args().write


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


def write_block(path: Path, name: str, text: str) -> None:
    """Replace the text between a page's `<!-- NAME -->` and `<!-- /NAME -->` markers, which a
    hand-written page keeps around the part a script writes; a page without them is an error."""
    start, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    old = path.read_text()
    if start not in old or end not in old:
        raise SystemExit(f"{path}: no '{start}' ... '{end}' block to write")
    head, _, rest = old.partition(start)
    path.write_text(f"{head}{start}\n{text}\n{end}{rest.partition(end)[2]}")


if __name__ == "__main__":
    sys.exit(main())
