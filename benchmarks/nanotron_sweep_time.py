"""nanotron's whole Ultra-Scale Playbook sweep against the time model: a held-out check of step time
and of the order the planner ranks layouts in.

The sweep (benchmarks/data/nanotron_usp_sweep.csv, read and mapped by benchmarks/nanotron_sweep_memory.py)
prints the tok/s/gpu of every configuration that ran at 1.34B, 3.57B, 8.86B and 80B on 1 to 64 nodes of
H100s; the 26 nanotron_ultrascale rows of published_runs.yaml are the best cell of each (model, nodes).
Each point is predicted as its published row is, with the point's layout, micro-batch and ZeRO stage.

What is held out: the time model's mechanism constants (cost_models.calibration.MECHANISMS) are fitted
on the published runs, the 26 nanotron rows among them; this script refits them without the nanotron
rows (benchmarks/time_accuracy.py's grid and objective) and predicts with that fit. Every other
number is a kernel or collective measurement (presets/kernels, presets/gpus.toml, the hf-science-p5
cluster's collective measurements), none read off the sweep.

1. Step time: error = predicted / measured tok/s/GPU − 1 (benchmarks/time_accuracy.py's convention:
   above 0 the model predicts the run too fast), on every point that ran, by group. No point is
   dropped; the points that cannot be predicted and those whose own figures disagree (a global batch
   other than 256 sequences, the same configuration measured several times) are listed.
2. The planner's question, per (model, nodes) problem, among the configurations that ran and that
   the memory model says fit (cost_models.memory.memory_estimate at DEFAULT_HEADROOM, the margin
   `planner plan` keeps): where the measured best sits in the model's order, the regret of taking the
   model's predicted best (its measured tok/s/GPU over the measured best's, − 1), and the order of
   every pair measured more than 3% apart (benchmarks/order_accuracy.py's Pair and tau; the band is
   plan_quality.CLOSE). A configuration measured more than once counts once, at its fastest run.
3. Leads: the terms of the step by group, and pairs of configurations that differ in one knob, with
   the measured and predicted ratio and the terms that differ.

Run: python benchmarks/nanotron_sweep_time.py [--write docs/accuracy.md]
"""

from __future__ import annotations

import itertools
import math
import statistics
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.memory_accuracy import write_option, write_section  # noqa: E402
from benchmarks.order_accuracy import RESOLUTION, Pair, tau  # noqa: E402
from benchmarks.plan_quality import deltas, seconds  # noqa: E402
from benchmarks.nanotron_sweep_memory import GLOBAL_BATCH, Point, build, points  # noqa: E402
from benchmarks.published import entries, load  # noqa: E402
from benchmarks.time_accuracy import Grid, Row, fit_without, stats, terms  # noqa: E402
from cost_models.calibration import DEFAULT, MECHANISMS, Calibration  # noqa: E402
from cost_models.memory import DEFAULT_HEADROOM, memory_estimate  # noqa: E402
from cost_models.step_time import time_estimate  # noqa: E402

SECTION = "## nanotron's sweep: step time and the planner's order"
NANOTRON = "nanotron_ultrascale"
CLEAR = 0.10  # a second summary band of the regret: within 10% of the measured best


@dataclass(frozen=True)
class Timed:
    """A point that ran, predicted: `row.run.measured_tokens_per_s_per_gpu` is the point's own tok/s/GPU."""

    point: Point
    row: Row
    fits: bool  # memory_estimate at DEFAULT_HEADROOM

    @property
    def error(self) -> float:
        return self.row.error

    @property
    def measured(self) -> float:
        return self.row.run.measured_tokens_per_s_per_gpu

    @property
    def predicted(self) -> float:
        return self.row.predicted

    @property
    def problem(self) -> tuple[str, int]:
        return self.point.params_b, self.point.nodes

    @property
    def config(self) -> tuple[int, int, int, int, int]:
        p = self.point
        return p.dp, p.tp, p.pp, p.mbs, p.zero


def held_out_calibration() -> tuple[Calibration, str]:
    """The mechanism constants refitted on every published source but nanotron's, and how they stand."""
    runs, _ = load()
    cases = [(r, r.job()) for r in runs]
    grid = Grid.build(cases)
    cal, keep = fit_without(grid, NANOTRON)
    said = []
    for name, prior in MECHANISMS.items():
        value = getattr(cal, name)
        if prior.unpinned:
            how = f"held at its prior ({prior.unpinned})"
        elif not grid.fittable(keep, name):
            how = "at its prior (too few runs or sources inform it)"
        else:
            at = " (its upper bound)" if value == prior.high else " (its lower bound)" if value == prior.low else ""
            how = f"fitted on {len(keep)} runs of the other sources{at}"
        said.append(f"{name} = {value:.4g}, {how}; the all-source fit (cost_models.calibration.DEFAULT, with the "
                    f"26 nanotron rows) has {getattr(DEFAULT, name):.4g}")
    return cal, "; ".join(said)


def predict(pts: list[Point], rows: dict[str, dict], cal: Calibration) -> tuple[list[Timed], list[tuple[Point, str]]]:
    """Every point that ran, predicted; (point, why) for those the mapping cannot build."""
    timed, unbuilt = [], []
    for p in pts:
        if p.tok_s_per_gpu is None:
            continue
        run, why = build(p, rows)
        if run is None:
            unbuilt.append((p, why))
            continue
        j = run.job()
        t = time_estimate(j, calibration=cal)
        run = replace(run, measured_tokens_per_s_per_gpu=p.tok_s_per_gpu, measured_from="the sweep figure's tok/s/gpu")
        timed.append(Timed(p, Row(run, t.tokens_per_s_per_gpu, t), memory_estimate(j, headroom=DEFAULT_HEADROOM).fits))
    return timed, unbuilt


# --- 1. step time ---------------------------------------------------------------------------------

MFU_BANDS = ((1.0, "MFU < 1%"), (10.0, "MFU 1-10%"), (20.0, "MFU 10-20%"), (math.inf, "MFU >= 20%"))


def _mfu_band(p: Point) -> tuple[float, str]:
    """The figure's own MFU (its column, in percent), in bands."""
    return next((top, name) for top, name in MFU_BANDS if (p.mfu_pct or 0.0) < top)


# Where the "measured memory" groups split the figure's reserved GiB: a chosen band below the H100's
# 79.6 GiB (presets/gpus.toml), not a measured threshold.
NEAR_CAPACITY_GIB = 70


def _below(p: Point) -> bool:
    """The point's reserved GiB is below NEAR_CAPACITY_GIB (one with no memory in the figure counts as below)."""
    return (p.memory_gib or 0) < NEAR_CAPACITY_GIB


# Each group: (sort key, label) of a point.
GROUPS = {
    "model": lambda p: (float(p.params_b), f"{p.params_b}B"),
    "nodes": lambda p: (p.nodes, f"{p.nodes} nodes"),
    "ZeRO stage": lambda p: (p.zero, f"ZeRO-{p.zero}"),
    "pipeline": lambda p: (p.pp > 1, "pp > 1" if p.pp > 1 else "pp = 1"),
    "tensor parallel": lambda p: (1, "tp = 1") if p.tp == 1 else (2, "tp 2-8 (within a node)") if p.tp <= 8 else (3, "tp 16-32 (across nodes)"),
    "micro-batch": lambda p: (p.mbs, f"mbs {p.mbs}"),
    "ZeRO, pp, tp": lambda p: (p.group, p.group),
    "measured MFU": _mfu_band,
    # the figure's reserved GiB of rank 0, near the H100's 79.6 GiB (presets/gpus.toml) or not: near capacity
    # torch's caching allocator frees its cache and retries a failed cudaMalloc (torch.cuda.memory_stats
    # num_alloc_retries counts them), which the time model does not price
    "measured memory": lambda p: (0, f"reserved < {NEAR_CAPACITY_GIB} GiB") if _below(p) else (1, f"reserved >= {NEAR_CAPACITY_GIB} GiB"),
    "measured memory, tp = 1": lambda p: (2, f"tp = 1, reserved {'<' if _below(p) else '>='} {NEAR_CAPACITY_GIB} GiB") if p.tp == 1
    else (3, "tp > 1"),
}


def error_line(name: str, errors: list[float]) -> str:
    med, p90, mx = stats(errors)
    return (f"| {name} | {len(errors)} | {statistics.median(errors):+.1%} | {med:.1%} | {p90:.1%} | {mx:.0%} | "
            f"{sum(abs(e) <= 0.10 for e in errors)}/{len(errors)} |")


def error_table(timed: list[Timed]) -> str:
    lines = ["| points | n | median error | median abs error | p90 | max | within 10% |", "|---|---:|---:|---:|---:|---:|---:|",
             error_line("all", [t.error for t in timed])]
    for axis, key in GROUPS.items():
        by: dict[tuple, list[float]] = defaultdict(list)
        for t in timed:
            by[key(t.point)].append(t.error)
        lines += [error_line(f"{axis}: {g[1]}", es) for g, es in sorted(by.items())]
    return "\n".join(lines)


def disagreeing(timed: list[Timed], unbuilt: list[tuple[Point, str]]) -> str:
    """The points whose own figures disagree, and those not predicted: listed, not left out."""
    out = []
    if unbuilt:
        why = Counter(w for _, w in unbuilt)
        out.append(f"- {len(unbuilt)} points that ran are not predicted: " + "; ".join(f"{n}: {w}" for w, n in why.most_common())
                   + " (" + ", ".join(sorted({f"{p.params_b}B pp{p.pp}" for p, _ in unbuilt})) + ")")
    odd = [t for t in timed if t.point.dp * t.point.mbs * t.point.grad_acc != GLOBAL_BATCH]
    if odd:
        out.append(f"- {len(odd)} points whose dp·mbs·grad_acc is not the figure's global batch of {GLOBAL_BATCH} sequences "
                   f"(predicted at {GLOBAL_BATCH}; errors median {statistics.median(t.error for t in odd):+.0%}): "
                   + ", ".join(f"{_name(t)} ga{t.point.grad_acc} {t.measured:,.0f} tok/s ({t.error:+.0%})" for t in odd))
    by: dict[tuple, list[Timed]] = defaultdict(list)
    for t in timed:
        by[(t.problem, t.config)].append(t)
    repeats = [ts for ts in by.values() if len(ts) > 1]
    if repeats:
        spread = sorted(max(t.measured for t in ts) / min(t.measured for t in ts) - 1 for ts in repeats)
        out.append(f"- {len(repeats)} configurations measured more than once: the fastest over the slowest run − 1 is "
                   f"{statistics.median(spread):.0%} at the median ({spread[0]:.0%} to {spread[-1]:.0%}): "
                   + ", ".join(f"{_name(ts[0])} " + "/".join(f"{t.measured:,.0f}" for t in ts) for ts in repeats))
    low = [t for t in timed if (t.point.mfu_pct or 0) < 1]
    out.append(f"- {len(low)} of {len(timed)} predicted points ran below 1% MFU (the figure's own MFU); "
               + (f"median error {statistics.median(t.error for t in low):+.0%}; " if low else "")
               + f"below 10% MFU: {sum((t.point.mfu_pct or 0) < 10 for t in timed)}")
    return "\n".join(out)


def _name(t: Timed) -> str:
    return f"{t.point.params_b}B {t.point.nodes}n {_layout(t)}"


def _layout(t: Timed) -> str:
    p = t.point
    return f"dp{p.dp} tp{p.tp} pp{p.pp} mbs{p.mbs} z{p.zero}"


# --- 2. the planner's question --------------------------------------------------------------------

@dataclass(frozen=True)
class Problem:
    params_b: str
    nodes: int
    configs: list[Timed]  # one per configuration (its fastest run), every one that ran and was predicted
    candidates: list[Timed]  # those the memory model says fit, fastest predicted first

    @property
    def best(self) -> Timed:
        """The measured best among the candidates."""
        return max(self.candidates, key=lambda t: t.measured)

    @property
    def chosen(self) -> Timed:
        """The model's predicted best among the candidates."""
        return self.candidates[0]

    @property
    def rank(self) -> int:
        return self.candidates.index(self.best) + 1

    @property
    def regret(self) -> float:
        return self.chosen.measured / self.best.measured - 1

    @property
    def best_overall(self) -> Timed:
        return max(self.configs, key=lambda t: t.measured)

    def pairs(self) -> list[Pair]:
        out = []
        for a, b in itertools.combinations(self.candidates, 2):
            fast, slow = (a, b) if a.measured >= b.measured else (b, a)
            out.append(Pair(fast.row, slow.row, fast.row, slow.row, "global"))
        return out


def problems(timed: list[Timed]) -> list[Problem]:
    by: dict[tuple[str, int], dict[tuple, Timed]] = defaultdict(dict)
    for t in timed:
        seen = by[t.problem].get(t.config)
        if seen is None or t.measured > seen.measured:
            by[t.problem][t.config] = t
    out = []
    for (size, nodes), configs in sorted(by.items(), key=lambda kv: (float(kv[0][0]), kv[0][1])):
        ts = sorted(configs.values(), key=lambda t: (-t.predicted, t.config))
        cands = [t for t in ts if t.fits]
        if cands:
            out.append(Problem(size, nodes, ts, cands))
    return out


def problem_table(ps: list[Problem]) -> str:
    lines = ["| model | nodes | ran | fit (memory model) | measured best (tok/s/GPU) | its rank in the model's order | "
             f"model's pick, measured (predicted) | regret | pairs > {RESOLUTION:.0%} apart ordered right | tau |",
             "|---|---:|---:|---:|---|---:|---|---:|---:|---:|"]
    for p in ps:
        judged = [x for x in p.pairs() if x.judged]
        note = "" if p.best_overall is p.best else f"; fastest that ran, {_layout(p.best_overall)} {p.best_overall.measured:,.0f}, predicted not to fit"
        lines.append(f"| {p.params_b}B | {p.nodes} | {len(p.configs)} | {len(p.candidates)} | {_layout(p.best)} {p.best.measured:,.0f}{note} | "
                     f"{p.rank} | {_layout(p.chosen)} {p.chosen.measured:,.0f} ({p.chosen.predicted:,.0f}) | {p.regret:+.1%} | "
                     f"{sum(x.right() for x in judged)}/{len(judged)} | {tau(judged) if judged else float('nan'):+.2f} |")
    return "\n".join(lines)


def regret_summary(ps: list[Problem]) -> str:
    regrets = sorted(p.regret for p in ps)
    return (f"regret of the model's pick median {statistics.median(regrets):+.1%}; within {RESOLUTION:.0%} of the measured best "
            f"in {sum(r >= -RESOLUTION for r in regrets)}/{len(ps)}, within {CLEAR:.0%} in {sum(r >= -CLEAR for r in regrets)}/{len(ps)}")


def planner_summary(ps: list[Problem], unbuilt: list[tuple[Point, str]], timed: list[Timed]) -> str:
    judged = [x for p in ps for x in p.pairs() if x.judged]
    ranks = sorted(p.rank for p in ps)
    faster = [p for p in ps if any((u.params_b, u.nodes) == (p.params_b, p.nodes) and (u.tok_s_per_gpu or 0) > p.best.measured
                                   for u, _ in unbuilt)]
    # the same question with the runs the figure prints below 1% MFU counted as crashed: a bound on how much
    # of the regret comes from runs that ran far below their own repeats or neighbours
    sane = problems([t for t in timed if (t.point.mfu_pct or 0) >= MFU_BANDS[0][0]])
    return (f"{len(ps)} problems (model, nodes): {regret_summary(ps)}; the measured best is the model's #1 in "
            f"{ranks.count(1)}/{len(ps)}, in its top 5 in {sum(r <= 5 for r in ranks)}/{len(ps)} (median rank {statistics.median(ranks):g}). "
            f"Pairs measured more than {RESOLUTION:.0%} apart: {sum(x.right() for x in judged)}/{len(judged)} ordered as "
            f"measured, tau {tau(judged):+.2f}. In {sum(p.best_overall is not p.best for p in ps)} problems the fastest "
            f"configuration that ran is one the memory model says does not fit; in {len(faster)} one the mapping cannot build "
            f"ran faster than the measured best here. Counting the runs below 1% MFU as crashed (not a verdict: "
            f"they ran): {regret_summary(sane)}.")


def worst(ps: list[Problem], n: int = 8) -> str:
    lines = ["| model | nodes | regret | model's pick: measured, predicted, error | measured best: measured, predicted, error | "
             "terms most apart (pick − best, per step) |", "|---|---:|---:|---|---|---|"]
    for p in sorted(ps, key=lambda p: p.regret)[:n]:
        c, b = p.chosen, p.best
        d = ", ".join(f"{k} {seconds(v)}" for k, v in deltas(c.row.estimate, b.row.estimate)[:3]) or "none"
        lines.append(f"| {p.params_b}B | {p.nodes} | {p.regret:+.1%} | {_layout(c)}: {c.measured:,.0f}, {c.predicted:,.0f}, {c.error:+.0%} | "
                     f"{_layout(b)}: {b.measured:,.0f}, {b.predicted:,.0f}, {b.error:+.0%} | {d} |")
    return "\n".join(lines)


# --- 3. leads -------------------------------------------------------------------------------------

def term_table(timed: list[Timed]) -> str:
    """Per ZeRO/pp/tp group: the median error and the terms holding >= 5% of the step on average, each
    with the factor it would need alone to close the median error (time_accuracy.residual_table's rule)."""
    by: dict[str, list[Timed]] = defaultdict(list)
    for t in timed:
        by[t.point.group].append(t)
    lines = ["| points | n | median error | terms (share of step → factor that alone closes the median error) |", "|---|---:|---:|---|"]
    for g, ts in sorted(by.items()):
        med = statistics.median(t.error for t in ts)
        shares: dict[str, float] = defaultdict(float)
        for t in ts:
            for k, v in terms(t.row.estimate).items():
                shares[k] += v / len(ts)
        cells = [f"{k} {s:.0%} → ×{1 + med / s:.2f}" for k, s in sorted(shares.items(), key=lambda kv: -kv[1]) if s >= 0.05]
        lines.append(f"| {g} | {len(ts)} | {med:+.1%} | {'; '.join(cells)} |")
    return "\n".join(lines)


# (pp > 1, mbs, on 64 nodes): the 64-node runs apart, they are slower at every tp (the nodes rows above)
SLOT_COLUMNS = ((False, 1, False), (False, 4, False), (True, 1, False), (True, 4, False), (True, 16, False), (True, 1, True))
BIGGEST = 64


def slot_ms(t: Timed) -> tuple[float, float]:
    """Measured and predicted time per layer and micro-batch slot, in ms: the step over the (m + pp − 1)
    micro-batch slots of the 1F1B critical path times the decoder layers of the largest stage (nanotron's
    split is uneven: 1.34B over pp 8 holds [3, 3, 2, 3, 2, 3, 0, 0]); the measured step is the global
    batch's tokens over tok/s/GPU × GPUs."""
    j = t.row.estimate.job
    layers = max(len(j.stage_layer_ids(r)) for r in range(j.layout.pp))
    slots = (j.num_microbatches + j.layout.pp - 1) * layers
    measured_s = j.training.global_batch_size * j.training.seq_len / (t.measured * j.gpus)
    return measured_s / slots * 1e3, t.row.estimate.step_s / slots * 1e3


def slot_table(timed: list[Timed]) -> str:
    """Time per layer and micro-batch slot by tp, with and without a pipeline: where the measured time
    stays flat as the micro-batch grows while the predicted time grows with it, the step is held by a
    floor per layer and micro-batch that the model does not have."""
    by: dict[tuple[int, bool, int, bool], list[tuple[float, float]]] = defaultdict(list)
    for t in timed:
        by[(t.point.tp, t.point.pp > 1, t.point.mbs, t.point.nodes == BIGGEST)].append(slot_ms(t))
    head = " | ".join(f"{'pp > 1' if pp else 'pp = 1'}, mbs {mbs}, {f'{BIGGEST} nodes' if big else f'1-{BIGGEST // 2} nodes'}"
                      for pp, mbs, big in SLOT_COLUMNS)
    lines = [f"| tp | {head} |", "|---:|" + "---:|" * len(SLOT_COLUMNS)]
    for tp in sorted({k[0] for k in by}):
        cells = []
        for col in SLOT_COLUMNS:
            xs = by.get((tp, *col), [])
            cells.append(f"{statistics.median(m for m, _ in xs):.1f} ({statistics.median(q for _, q in xs):.1f}), {len(xs)}" if xs else "—")
        lines.append(f"| {tp} | {' | '.join(cells)} |")
    return "\n".join(lines)


KNOBS = {
    "ZeRO-0 → ZeRO-1": lambda a, b: a[:4] == b[:4] and (a[4], b[4]) == (0, 1),
    "mbs × 2": lambda a, b: (a[0], a[1], a[2], a[4]) == (b[0], b[1], b[2], b[4]) and b[3] == 2 * a[3],
    "tp × 2, dp ÷ 2": lambda a, b: (a[2], a[3], a[4]) == (b[2], b[3], b[4]) and b[1] == 2 * a[1] and a[0] == 2 * b[0],
    "pp × 2, dp ÷ 2": lambda a, b: (a[1], a[3], a[4]) == (b[1], b[3], b[4]) and b[2] == 2 * a[2] and a[0] == 2 * b[0],
    "pp × 2, tp ÷ 2": lambda a, b: (a[0], a[3], a[4]) == (b[0], b[3], b[4]) and b[2] == 2 * a[2] and a[1] == 2 * b[1],
}


def knob_table(ps: list[Problem]) -> str:
    """Pairs of configurations of one problem that differ in one knob (every configuration that ran and
    was predicted, fit or not): how the measured and the predicted throughput move when it turns, and
    the terms the model moves most (after − before, per step; a step carries the same tokens)."""
    lines = ["| knob | pairs | measured after / before, median | predicted, median | predicted / measured ratio, median | "
             f"direction right (pairs > {RESOLUTION:.0%} apart) | terms the model moves most (median, after − before) |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for knob, same in KNOBS.items():
        found = [(a, b) for p in ps for a in p.configs for b in p.configs if same(a.config, b.config)]
        if not found:
            continue
        meas = [b.measured / a.measured for a, b in found]
        pred = [b.predicted / a.predicted for a, b in found]
        apart = [(m, q) for m, q in zip(meas, pred) if abs(math.log(m)) > math.log(1 + RESOLUTION)]
        moved: dict[str, list[float]] = defaultdict(list)
        for a, b in found:
            for k, v in deltas(b.row.estimate, a.row.estimate):
                moved[k].append(v)
        top = sorted(((k, statistics.median(v + [0.0] * (len(found) - len(v)))) for k, v in moved.items()), key=lambda kv: -abs(kv[1]))[:3]
        lines.append(f"| {knob} | {len(found)} | {statistics.median(meas):.2f} | {statistics.median(pred):.2f} | "
                     f"{statistics.median(q / m for m, q in zip(meas, pred)):.2f} | "
                     f"{sum((m > 1) == (q > 1) for m, q in apart)}/{len(apart)} | {', '.join(f'{k} {seconds(v)}' for k, v in top)} |")
    return "\n".join(lines)


# What the playbook says of its own sweep (vinjn/nanotron-ultrascale-playbook@e3bcfc5c index.html, "Benchmarking
# thousands of configurations" and "Lessons learned on benchmarking"), paraphrased.
PROVENANCE = ("The sweep's authors report that which of tensor and pipeline parallelism ran faster depended on the "
              "state of nanotron's code as they benchmarked (tensor parallelism until they optimised the pipeline code, "
              "pipeline parallelism after), that they had to improve "
              "pipeline performance across nodes and saw runs take hours instead of minutes, and that layouts close to "
              "the memory limit ran slowly (the 80B model on 4 nodes). The figure does not say which code or which "
              "state of the cluster each point ran with.")


def report(timed: list[Timed], unbuilt: list[tuple[Point, str]], ps: list[Problem], held: str) -> str:
    med, p90, _ = stats([t.error for t in timed])
    return "\n\n".join([
        f"Constants: {held}.",
        PROVENANCE,
        f"Step time on {len(timed)} of the {len(timed) + len(unbuilt)} points that ran: median |error| {med:.1%}, p90 {p90:.1%} "
        "(error = predicted / measured tok/s/GPU − 1):\n\n" + error_table(timed),
        "Points whose figures disagree, and points not predicted (all kept above but the last):\n\n" + disagreeing(timed, unbuilt),
        "The planner's question, per problem: among the configurations that ran and that the memory model says fit "
        f"(memory_estimate at the planner's default headroom of {DEFAULT_HEADROOM:.0%}), the measured best's rank in the "
        "model's order, the regret of the model's pick (its measured tok/s/GPU over the measured best's − 1), and the "
        f"order of pairs measured more than {RESOLUTION:.0%} apart.\n\n" + planner_summary(ps, unbuilt, timed) + "\n\n" + problem_table(ps),
        "Worst problems:\n\n" + worst(ps),
        "Where the error sits, by ZeRO stage, pipeline and tensor parallelism:\n\n" + term_table(timed),
        "One knob turned (pairs of configurations of one problem):\n\n" + knob_table(ps),
        "Time per decoder layer of the largest stage and micro-batch slot, ms, measured (predicted), points; "
        "median over every model size:\n\n" + slot_table(timed),
    ])


def main() -> int:
    path = write_option(__doc__.splitlines()[0])
    started = time.perf_counter()
    cal, held = held_out_calibration()
    timed, unbuilt = predict(points(), {e["id"]: e for e in entries()}, cal)
    text = report(timed, unbuilt, problems(timed), held)
    print(text)
    print(f"\n{time.perf_counter() - started:.0f} s")
    if path:
        intro = (
            "Produced by `python benchmarks/nanotron_sweep_time.py --write docs/accuracy.md`. Every configuration of\n"
            "nanotron's Ultra-Scale Playbook sweep that ran (benchmarks/data/nanotron_usp_sweep.csv), predicted with\n"
            "the mechanism constants refitted without the 26 nanotron rows; the 26 rows are the best cell of each\n"
            "(model, nodes), every other point is held out.\n\n"
        )
        write_section(path, text, SECTION, intro)
    return 0


if __name__ == "__main__":
    sys.exit(main())
