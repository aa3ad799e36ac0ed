"""Order of measured layouts: does the time model rank the layouts a source measured on one problem
as they were measured?

Plan quality (benchmarks/plan_quality.py) asks whether a published layout lands near our #1; a miss
there is mostly our #1 being a layout nobody measured. The direct evidence for the planner's ranking
is the set of sources that measured several layouts of the same problem, and this script checks
every such pair with estimates only (no search).

The problem key: the same source group (benchmarks/published.py `group`), the same model, GPU type
and count, sequence length, and every training setting (TrainingSpec: precision, fp8 recipe,
compile, tp comm overlap, bucket sizes, ...) but the framework; and the same batch, either the global
batch in tokens or, where the source held the batch per data-parallel replica fixed and let the
global batch grow with dp (KempnerForge's MFU sweep), the batch per replica. The two rows must differ
in what `planner plan` chooses: the layout (tp, pp, vpp, cp, ep, dp, ZeRO, micro-batch, schedule,
split, recompute), or the framework where a source compared one problem under two (Narayanan et al.
2021 Table 2: ZeRO-3 in DeepSpeed against PTD-P in Megatron-LM at equal GPUs and batch). Rows of one
problem that differ in a training setting are listed apart and not compared.

Resolution: a pair is judged only when its measured throughputs differ by more than RESOLUTION, the
3% within which plan_quality counts a layout as good as our #1 (`CLOSE`): inside that band the planner
treats two layouts as tied, so neither order would count against it. A judged pair is ordered right
when the predicted throughputs differ in the same direction; agreement is Kendall's tau over the
judged pairs, (right − wrong) / judged, a predicted exact tie counting as neither.

Predictions as benchmarks/time_accuracy.py makes them: the headline from leave-one-source-out (both
rows of a pair belong to one source, predicted by constants fitted on the other sources), beside it
the all-source fit.

Run: python benchmarks/order_accuracy.py [--write docs/accuracy.md]
"""

from __future__ import annotations

import itertools
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.memory_accuracy import write_option, write_section  # noqa: E402
from benchmarks.plan_quality import CLOSE, SAME, deltas, model_shape, seconds, short  # noqa: E402
from benchmarks.published import PublishedRun, family, load  # noqa: E402
from benchmarks.time_accuracy import Grid, Row, evaluate, leave_one_source_out  # noqa: E402
from cost_models.job import Job  # noqa: E402

RESOLUTION = CLOSE
SECTION = "## Order of measured layouts"


# The framework, and the vocabulary padding that only Megatron's --make-vocab-size-divisible-by sets
# (TrainingSpec.vocab_divisible_by): a choice of framework, not of the problem.
FRAMEWORK_FIELDS = {"framework", "vocab_divisible_by"}


def problem(run: PublishedRun) -> tuple[str, str, str, int, int, str]:
    """Everything a pair must share but the batch: source group, model, GPU type and count,
    sequence length, and the training settings other than the framework and the batch."""
    t = run.training
    return (*_same_shape(run), t.seq_len, t.model_dump_json(exclude=FRAMEWORK_FIELDS | {"global_batch_size"}))


def _same_shape(run: PublishedRun) -> tuple[str, str, str, int]:
    """Source group, model (its shape, not its name or source), GPU type and count."""
    return run.group, model_shape(run), run.cluster.spec.name, run.cluster.num_gpus


def batch_held(a: Job, b: Job) -> str | None:
    """How two jobs of one problem share their batch: "global" (the same tokens per step),
    "replica" (the same tokens per data-parallel replica, the global batch differing), or None."""
    ta, tb = a.training, b.training
    tokens_a, tokens_b = ta.global_batch_size * ta.seq_len, tb.global_batch_size * tb.seq_len
    if tokens_a == tokens_b:
        return "global"
    if tokens_a * b.dp == tokens_b * a.dp:
        return "replica"
    return None


def planner_choices(job: Job) -> tuple[object, ...]:
    """What `planner plan` chooses for a job, as resolved (defaults filled in)."""
    return (job.layout, job.dp, job.zero, job.sp, job.training.framework)


@dataclass(frozen=True)
class Pair:
    """Two measured layouts of one problem; `fast` is the one measured faster."""

    fast: Row  # leave-one-source-out
    slow: Row
    fast_in: Row  # all-source fit
    slow_in: Row
    batch: str  # batch_held

    @property
    def source(self) -> str:
        return self.fast.family

    @property
    def measured(self) -> float:
        return self.fast.run.measured_tokens_per_s_per_gpu / self.slow.run.measured_tokens_per_s_per_gpu

    def predicted(self, loso: bool = True) -> float:
        a, b = (self.fast, self.slow) if loso else (self.fast_in, self.slow_in)
        return a.predicted / b.predicted

    @property
    def judged(self) -> bool:
        return self.measured > 1 + RESOLUTION

    def right(self, loso: bool = True) -> bool:
        return self.predicted(loso) > 1 + SAME

    def wrong(self, loso: bool = True) -> bool:
        return self.predicted(loso) < 1 - SAME


def pairs(loso: list[Row], inside: list[Row]) -> list[Pair]:
    """Every pair of rows of one problem that differ in what the planner chooses."""
    ins = {r.run.id: r for r in inside}
    by: dict[tuple, list[Row]] = defaultdict(list)
    for r in loso:
        by[problem(r.run)].append(r)
    out = []
    for rows in by.values():
        for a, b in itertools.combinations(rows, 2):
            ja, jb = a.estimate.job, b.estimate.job
            held = batch_held(ja, jb)
            if held is None or planner_choices(ja) == planner_choices(jb):
                continue
            fast, slow = (a, b) if a.run.measured_tokens_per_s_per_gpu >= b.run.measured_tokens_per_s_per_gpu else (b, a)
            out.append(Pair(fast, slow, ins[fast.run.id], ins[slow.run.id], held))
    return sorted(out, key=lambda p: (p.source, p.fast.run.id, p.slow.run.id))


def tau(ps: list[Pair], loso: bool = True) -> float:
    return (sum(p.right(loso) for p in ps) - sum(p.wrong(loso) for p in ps)) / len(ps)


def source_table(ps: list[Pair]) -> str:
    by: dict[str, list[Pair]] = defaultdict(list)
    for p in ps:
        by[p.source].append(p)
    lines = [f"| source | problems | pairs | judged (> {RESOLUTION:.0%} apart) | ordered right, left out | tau, left out | "
             f"ordered right, all sources | tau, all sources | right but predicted within {RESOLUTION:.0%} (left out) | "
             "predicted / measured ratio − 1, median (range), left out |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for src, members in [*sorted(by.items()), ("all", ps)]:
        judged = [p for p in members if p.judged]
        problems = len({problem(p.fast.run) for p in members})
        cells = []
        for loso in (True, False):
            cells += [f"{sum(p.right(loso) for p in judged)}/{len(judged)}", f"{tau(judged, loso):+.2f}" if judged else "—"]
        close = sum(1 for p in judged if p.right() and p.predicted() <= 1 + RESOLUTION)
        # how far the predicted gap is from the measured one: above 0 the model widens it
        off = sorted(p.predicted() / p.measured - 1 for p in judged)
        spread = f"{statistics.median(off):+.1%} ({off[0]:+.1%} to {off[-1]:+.1%})" if off else "—"
        lines.append(f"| {src} | {problems} | {len(members)} | {len(judged)} | {' | '.join(cells)} | {close} | {spread} |")
    return "\n".join(lines)


def _layout(job: Job) -> str:
    text = short(job)
    return text if job.training.framework.value == "megatron" else f"{text} ({job.training.framework.value})"


def pair_table(ps: list[Pair]) -> str:
    lines = ["| faster as measured | slower as measured | layouts (faster; slower) | batch held | measured ratio | "
             "predicted, left out | predicted, all sources | order |", "|---|---|---|---|---:|---:|---:|---|"]
    for p in ps:
        verdict = (f"tie (within {RESOLUTION:.0%})" if not p.judged else "right" if p.right() else "INVERTED" if p.wrong() else "predicted tie")
        lines.append(f"| {p.fast.run.id} | {p.slow.run.id} | {_layout(p.fast.estimate.job)}; {_layout(p.slow.estimate.job)} | "
                     f"{p.batch} | {p.measured:.3f} | {p.predicted():.3f} | {p.predicted(loso=False):.3f} | {verdict} |")
    return "\n".join(lines)


def terms_apart(p: Pair) -> str:
    """The two step terms that differ most, measured-faster minus measured-slower (plan_quality's
    breakdown difference; the slower row's terms scaled to the faster row's tokens per GPU when the
    batches differ): a positive term is one the model charges the measured-faster row more for."""
    fast, slow = p.fast.estimate, p.slow.estimate
    per_gpu = [t.job.training.global_batch_size * t.job.training.seq_len / t.job.gpus for t in (fast, slow)]
    return ", ".join(f"{k} {seconds(v)}" for k, v in deltas(fast, slow, scale=per_gpu[0] / per_gpu[1])[:2]) or "none"


def inverted(ps: list[Pair], loso: bool) -> list[Pair]:
    return [p for p in ps if p.judged and not p.right(loso)]


def close_calls(ps: list[Pair]) -> list[tuple[str, Pair]]:
    """Pairs the model does not clearly order as measured: judged pairs it inverts (left out or
    with the all-source fit) or predicts within the band, and pairs within the band as measured
    that it orders the other way."""
    out = []
    for p in ps:
        if p.judged and (not p.right() or not p.right(loso=False)):
            out.append(("INVERTED", p))
        elif p.judged and p.predicted() <= 1 + RESOLUTION:
            out.append((f"right, predicted within {RESOLUTION:.0%}", p))
        elif not p.judged and p.wrong():
            out.append((f"within {RESOLUTION:.0%} as measured, predicted the other way", p))
    return out


def inversions(ps: list[Pair]) -> str:
    calls = close_calls(ps)
    head = (f"None measured more than {RESOLUTION:.0%} apart is predicted in the other order, left out or with the all-source fit.\n\n"
            if not inverted(ps, True) and not inverted(ps, False) else "")
    if not calls:
        return head.strip()
    lines = ["| faster as measured | slower as measured | measured ratio | predicted, left out | predicted, all sources | "
              "call | terms most apart (faster − slower as measured, per step of the faster row's tokens) |",
             "|---|---|---:|---:|---:|---|---|"]
    lines += [f"| {p.fast.run.id} | {p.slow.run.id} | {p.measured:.3f} | {p.predicted():.3f} | {p.predicted(loso=False):.3f} | "
              f"{kind} | {terms_apart(p)} |" for kind, p in calls]
    return head + "\n".join(lines)


def apart(runs: list[PublishedRun]) -> str:
    """Rows of one group, model, GPU count, sequence and global batch that are not compared: those
    that differ in a training setting (the same problem run with other settings), and those with
    the same settings and layout (the same layout run again, on other software)."""
    by: dict[tuple, list[PublishedRun]] = defaultdict(list)
    for r in runs:
        by[(*_same_shape(r), r.training.seq_len, r.training.global_batch_size)].append(r)
    lines = []
    for rows in by.values():
        dumps = [r.training.model_dump(exclude=FRAMEWORK_FIELDS | {"global_batch_size"}) for r in rows]
        fields = sorted(k for k in dumps[0] if len({repr(d[k]) for d in dumps}) > 1)
        choices: dict[tuple, list[str]] = defaultdict(list)
        for r in rows:
            choices[(problem(r)[-1], planner_choices(r.job()))].append(r.id)
        repeats = [ids for ids in choices.values() if len(ids) > 1]
        if fields:
            lines.append(f"- {rows[0].group}, {rows[0].cluster.num_gpus} GPUs: {', '.join(r.id for r in rows)} "
                         f"(differ in {', '.join(fields)})")
        lines += [f"- {rows[0].group}, {rows[0].cluster.num_gpus} GPUs: {', '.join(ids)} (the same layout and settings)"
                  for ids in repeats]
    return "\n".join(lines) or "None."


def unpaired(ps: list[Pair], runs: list[PublishedRun]) -> str:
    """The sources none of whose rows shares a problem with another layout."""
    paired = {p.source for p in ps}
    rest = sorted({family(r.group) for r in runs} - paired)
    return f"\n\nSources with no two layouts of one problem: {', '.join(rest)}." if rest else ""


def report(ps: list[Pair], runs: list[PublishedRun]) -> str:
    judged = [p for p in ps if p.judged]
    head = (f"{len(ps)} pairs of measured layouts in {len({problem(p.fast.run) for p in ps})} problems; {len(judged)} measured "
            f"more than {RESOLUTION:.0%} apart. Ordered as measured: {sum(p.right() for p in judged)}/{len(judged)} left out "
            f"(tau {tau(judged):+.2f}), {sum(p.right(False) for p in judged)}/{len(judged)} with the all-source fit "
            f"(tau {tau(judged, False):+.2f}). Every pair, whatever its measured gap: {sum(p.right() for p in ps)}/{len(ps)} "
            f"left out (tau {tau(ps):+.2f}).") if judged else f"{len(ps)} pairs of measured layouts; none more than {RESOLUTION:.0%} apart."
    return "\n\n".join([
        head,
        "Per source:\n\n" + source_table(ps) + unpaired(ps, runs),
        f"Pairs the model inverts, or orders within {RESOLUTION:.0%}, or orders against a measured tie:\n\n" + inversions(ps),
        "Every pair:\n\n" + pair_table(ps),
        "Rows of one model, GPU count, sequence and global batch not compared: run with different training settings "
        "(precision, compile, overlap, software versions), or the same layout run again:\n\n" + apart(runs),
    ])


def main() -> int:
    path = write_option(__doc__.splitlines()[0])
    started = time.perf_counter()
    runs, _ = load()
    cases = [(r, r.job()) for r in runs]
    grid = Grid.build(cases)
    loso, _ = leave_one_source_out(grid)
    inside = evaluate(cases, grid.fit(grid.every))
    ps = pairs(loso, inside)
    text = report(ps, runs)
    print(text)
    print(f"\n{len(runs)} runs, {len({family(r.group) for r in runs})} sources; {time.perf_counter() - started:.0f} s")
    if path:
        intro = (
            "Produced by `python benchmarks/order_accuracy.py --write docs/accuracy.md`. Where one source measured\n"
            "several layouts of one problem (same source group, model, GPU type and count, sequence, training settings,\n"
            "and global batch or batch per data-parallel replica; the framework may differ, as ZeRO-3 in DeepSpeed and\n"
            "PTD-P in Megatron-LM do in Narayanan et al. 2021 Table 2), each pair measured more than\n"
            f"{RESOLUTION:.0%} apart (plan quality's tie band) is checked: does the time model predict the same one faster?\n"
            "Ratios are the faster-measured row's tokens/s/GPU over the slower's; left out = leave-one-source-out\n"
            "(as in \"Step time out of sample\").\n\n"
        )
        write_section(path, text, SECTION, intro)
    return 0


if __name__ == "__main__":
    sys.exit(main())
