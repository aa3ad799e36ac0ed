"""Step-time accuracy on published runs, judged out of sample.

Headline, leave-one-source-out: for each source family (benchmarks/published.py `family`), the
mechanism constants (cost_models.calibration.MECHANISMS) are refitted from their priors on the other
families only and that family is predicted with them; a constant no run outside the family informs
keeps its prior. In-sample comes second: fitted on every family.

Fit: a grid search. Each constant takes GRID_STEPS points on either side of its prior, up to its
bounds (evenly in log where the lower bound is positive), and every run is predicted once at every
point of the product grid; every fit below is then a lookup in that table. The objective is the
mean over families of the mean |log(predicted / measured)| (each source weighs the same, however
many rows it has). A constant is fitted only where at least MIN_RUNS runs from at least MIN_FAMILIES
families inform it, i.e. move by more than INFORMS when it goes from one bound to the other (the
runs that do are its fit set); otherwise it stays at its prior. A constant the runs leave unpinned
(calibration.Prior.unpinned: its fits scatter over the grid at equal scores) stays at its prior in
every fit. Every other number in the time
model is a kernel or collective measurement (presets/kernels, presets/gpus.toml,
cost_models/comm.py) and is not fitted here.

The residual table shows, per term of the step, how each run's error would close if that term alone
were wrong: the factor the term would need, for the terms that hold at least 5% of the step.

Run: python benchmarks/time_accuracy.py [--write docs/accuracy.md]
The all-source fit is what cost_models.calibration.DEFAULT carries (tests/test_accuracy.py checks
that they agree).
"""

from __future__ import annotations

import itertools
import math
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.memory_accuracy import write_block, write_option, write_section  # noqa: E402
from benchmarks.published import PublishedRun, family, load  # noqa: E402
from cost_models.calibration import DEFAULT, MECHANISMS, Calibration, Prior  # noqa: E402
from cost_models.job import Job  # noqa: E402
from cost_models.step_time import TimeEstimate, time_estimate  # noqa: E402
from planner.render import split_tag  # noqa: E402

MIN_RUNS = 5
MIN_FAMILIES = 2
INFORMS = 0.005  # a run informs a constant if its prediction moves by more than 0.5% across the bounds
GRID_STEPS = 4  # grid points on each side of a prior

Case = tuple[PublishedRun, Job]


@dataclass(frozen=True)
class Row:
    run: PublishedRun
    predicted: float
    estimate: TimeEstimate

    @property
    def family(self) -> str:
        return family(self.run.group)

    @property
    def error(self) -> float:
        return self.predicted / self.run.measured_tokens_per_s_per_gpu - 1


def evaluate(cases: list[Case], cal: Calibration) -> list[Row]:
    rows = []
    for run, job in cases:
        t = time_estimate(job, calibration=cal)
        rows.append(Row(run, t.tokens_per_s_per_gpu, t))
    return rows


def priors() -> Calibration:
    return DEFAULT.with_values(**{n: p.value for n, p in MECHANISMS.items()})


def axis(name: str, *, free: bool = False) -> tuple[float, ...]:
    """The grid of one constant: its prior and GRID_STEPS points towards each bound; the prior
    alone for a constant the runs do not pin (Prior.unpinned), unless `free`."""
    p = MECHANISMS[name]
    if p.unpinned and not free:
        return (p.value,)
    log = p.low > 0
    f, inv = (math.log, math.exp) if log else ((lambda x: x), (lambda x: x))
    lo, mid, hi = f(p.low), f(p.value), f(p.high)
    below = [inv(lo + (mid - lo) * i / GRID_STEPS) for i in range(GRID_STEPS)]
    above = [inv(mid + (hi - mid) * i / GRID_STEPS) for i in range(1, GRID_STEPS + 1)]
    return (*below, p.value, *above)


@dataclass(frozen=True)
class Grid:
    """Every run predicted at every point of the constants' product grid."""

    cases: list[Case]
    names: tuple[str, ...]
    points: tuple[tuple[float, ...], ...]
    predicted: dict[tuple[float, ...], tuple[float, ...]]  # point -> tokens/s/GPU per case

    @classmethod
    def build(cls, cases: list[Case]) -> Grid:
        names = tuple(MECHANISMS)
        points = tuple(itertools.product(*(axis(n) for n in names)))
        predicted = {pt: tuple(r.predicted for r in evaluate(cases, calibration_at(names, pt))) for pt in points}
        return cls(cases, names, points, predicted)

    @property
    def every(self) -> list[int]:
        return list(range(len(self.cases)))

    def prior_point(self) -> tuple[float, ...]:
        return tuple(MECHANISMS[n].value for n in self.names)

    def fit_set(self, keep: list[int], name: str) -> list[int]:
        """The runs (indices into cases) whose prediction the constant moves across its bounds,
        the other constants at their priors."""
        i, prior = self.names.index(name), self.prior_point()
        ax = axis(name)
        low = self.predicted[prior[:i] + (ax[0],) + prior[i + 1:]]
        high = self.predicted[prior[:i] + (ax[-1],) + prior[i + 1:]]
        return [k for k in keep if abs(high[k] / low[k] - 1) > INFORMS]

    def fittable(self, keep: list[int], name: str) -> bool:
        informed = self.fit_set(keep, name)
        return len(informed) >= MIN_RUNS and len({family(self.cases[k][0].group) for k in informed}) >= MIN_FAMILIES

    def objective(self, keep: list[int], point: tuple[float, ...]) -> float:
        by: dict[str, list[float]] = defaultdict(list)
        pred = self.predicted[point]
        for k in keep:
            run = self.cases[k][0]
            by[family(run.group)].append(abs(math.log(pred[k] / run.measured_tokens_per_s_per_gpu)))
        return statistics.mean(statistics.mean(v) for v in by.values())

    def fit(self, keep: list[int]) -> Calibration:
        """The grid point that fits the kept runs best, constants without a fit set at their prior."""
        free = {n for n in self.names if self.fittable(keep, n)}
        prior = self.prior_point()
        allowed = [pt for pt in self.points if all(v == prior[i] for i, v in enumerate(pt) if self.names[i] not in free)]
        best = min(allowed, key=lambda pt: self.objective(keep, pt))
        return calibration_at(self.names, best)


def calibration_at(names: tuple[str, ...], point: tuple[float, ...]) -> Calibration:
    return DEFAULT.with_values(**dict(zip(names, point)))


def without(grid: Grid, fam: str) -> list[int]:
    """The cases (indices into grid.cases) of every family but one."""
    return [k for k, (r, _) in enumerate(grid.cases) if family(r.group) != fam]


def fit_without(grid: Grid, fam: str) -> tuple[Calibration, list[int]]:
    """The constants fitted on every family but one, and the cases (indices into grid.cases) they were fitted on."""
    keep = without(grid, fam)
    return grid.fit(keep), keep


def leave_one_source_out(grid: Grid) -> tuple[list[Row], dict[str, Calibration]]:
    """Each family predicted by constants fitted on the others, from the priors."""
    rows: list[Row] = []
    fitted: dict[str, Calibration] = {}
    cases = grid.cases
    for fam in sorted({family(r.group) for r, _ in cases}):
        test = [c for c in cases if family(c[0].group) == fam]
        cal, _ = fit_without(grid, fam)
        fitted[fam] = cal
        rows += evaluate(test, cal)
    return rows, fitted


@dataclass(frozen=True)
class FreeScan:
    """An unpinned constant fitted anyway along its own axis, the others at the all-source fit: what
    Prior.unpinned claims, printed so that it can be checked."""

    fitted: float  # the best point on every source
    objective_fitted: float
    objective_prior: float
    left_out: tuple[float, ...]  # the best point with each family left out


def free_scan(grid: Grid, cal: Calibration, name: str) -> FreeScan:
    """Constant `name` fitted alone over its whole axis (even where Prior.unpinned holds it), the other
    constants at `cal`: on every source and with each family left out."""
    points = axis(name, free=True)
    predicted = {v: tuple(r.predicted for r in evaluate(grid.cases, cal.with_values(**{name: v}))) for v in points}
    scan = Grid(grid.cases, (name,), tuple((v,) for v in points), {(v,): p for v, p in predicted.items()})

    def best(keep: list[int]) -> float:
        return min(points, key=lambda v: scan.objective(keep, (v,)))

    families = sorted({family(r.group) for r, _ in grid.cases})
    left_out = tuple(best(without(grid, fam)) for fam in families)
    fitted = best(grid.every)
    prior = MECHANISMS[name].value
    return FreeScan(fitted, scan.objective(grid.every, (fitted,)), scan.objective(grid.every, (prior,)), left_out)


def stats(errors: list[float]) -> tuple[float, float, float]:
    e = sorted(abs(x) for x in errors)
    p90 = e[min(len(e) - 1, math.ceil(0.9 * len(e)) - 1)]
    return statistics.median(e), p90, e[-1]


def summary(rows: list[Row]) -> str:
    groups: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        groups[r.family].append(r.error)
    lines = ["| source | runs | median abs error | p90 | max | mean signed |", "|---|---:|---:|---:|---:|---:|"]
    for g, errs in [*sorted(groups.items()), ("all", [r.error for r in rows])]:
        med, p90, mx = stats(errs)
        lines.append(f"| {g} | {len(errs)} | {med:.1%} | {p90:.1%} | {mx:.1%} | {statistics.mean(errs):+.1%} |")
    return "\n".join(lines)


def _unpinned(prior: Prior, scan: FreeScan | None) -> str:
    if scan is None:
        return f"prior, not fitted ({prior.unpinned})"
    return (f"prior, not fitted ({prior.unpinned}: fitted alone on its own grid it lands at {scan.fitted:.3g}, "
            f"mean abs log error {scan.objective_fitted:.4f} against {scan.objective_prior:.4f} at the prior; "
            f"with one source left out at {min(scan.left_out):.3g} to {max(scan.left_out):.3g})")


def constants_table(grid: Grid, cal: Calibration, loso: dict[str, Calibration],
                    scans: dict[str, FreeScan] | None = None) -> str:
    lines = ["| constant | prior | fitted (all sources) | range over leave-one-out fits | fit set (runs per source) | prior's source |",
             "|---|---:|---:|---|---|---|"]
    for name, prior in MECHANISMS.items():
        per: dict[str, int] = defaultdict(int)
        for k in grid.fit_set(grid.every, name):
            per[family(grid.cases[k][0].group)] += 1
        values = [getattr(c, name) for c in loso.values()]
        spread = f"{min(values):.3g} to {max(values):.3g}" if values else "-"
        sets = ", ".join(f"{k} {v}" for k, v in sorted(per.items())) or "none"
        shown = (f"{getattr(cal, name):.3g}" if grid.fittable(grid.every, name)
                 else _unpinned(prior, (scans or {}).get(name)) if prior.unpinned else "prior (too few runs or sources inform it)")
        lines.append(f"| {name} | {prior.value:.3g} | {shown} | {spread} | {sets} | {prior.source} |")
    return "\n".join(lines)


def model_doc_constants(grid: Grid, cal: Calibration, loso: dict[str, Calibration]) -> str:
    """The fitted-constants table of docs/performance-model.md: each constant's prior, bounds, all-source
    fit and where that fit sits in its bounds."""
    lines = ["| constant | prior | bounds | fitted on every source | leave-one-source-out fits | what it is | prior's source |",
             "|---|---:|---|---:|---|---|---|"]
    notes = []
    for name, prior in MECHANISMS.items():
        values = [getattr(c, name) for c in loso.values()]
        spread = f"{min(values):.3g} to {max(values):.3g}" if values else "-"
        if prior.unpinned:
            shown = f"not fitted ({prior.value:.3g})"
            notes.append(f"- `{name}` stays at its prior in every fit: {prior.unpinned}.")
        elif not grid.fittable(grid.every, name):
            shown = f"not fitted ({prior.value:.3g})"
            notes.append(f"- `{name}` stays at its prior: too few runs or sources inform it.")
        else:
            fit = getattr(cal, name)
            shown = f"{fit:.3g}"
            where = ("at its lower bound" if math.isclose(fit, prior.low, abs_tol=1e-9) else
                     "at its upper bound" if math.isclose(fit, prior.high, abs_tol=1e-9) else "inside its bounds")
            at_bound = sum(1 for v in values if math.isclose(v, prior.low, abs_tol=1e-9) or math.isclose(v, prior.high, abs_tol=1e-9))
            notes.append(f"- `{name}` fits at {fit:.3g} on every source, {where}; "
                         f"{at_bound} of its {len(values)} leave-one-source-out fits sit on a bound.")
        lines.append(f"| `{name}` | {prior.value:.3g} | {prior.low:.3g}–{prior.high:.3g} | {shown} | {spread} | {prior.what} | {prior.source} |")
    return "\n".join(lines) + "\n\n" + "\n".join(notes)


def _layout(job: Job) -> str:
    lay = job.layout
    parts = [f"tp{lay.tp}", f"pp{lay.pp}" + (f"v{lay.vpp}" if lay.vpp > 1 else "") + split_tag(lay), f"dp{job.dp}"]
    if lay.cp > 1:
        parts.append(f"cp{lay.cp}")
    if lay.ep > 1:
        parts.append(f"ep{lay.ep}")
    parts += [f"z{int(job.zero)}", f"mbs{lay.mbs}", {"none": "", "selective": "sel", "full": "full"}[lay.recompute.value]]
    return " ".join(p for p in parts if p)


def run_table(loso: list[Row], inside: list[Row]) -> str:
    by_id = {r.run.id: r for r in inside}
    lines = ["| run | source | GPUs | precision | layout | measured | predicted (left out) | error | in-sample error |",
             "|---|---|---:|---|---|---:|---:|---:|---:|"]
    for r in sorted(loso, key=lambda r: (r.family, r.run.id)):
        job = r.estimate.job
        lines.append(
            f"| {r.run.id} | {r.family} | {job.gpus} {job.cluster.gpu.name} | {job.training.precision.value} | {_layout(job)} | "
            f"{r.run.measured_tokens_per_s_per_gpu:,.0f} | {r.predicted:,.0f} | {r.error:+.1%} | {by_id[r.run.id].error:+.1%} |"
        )
    return "\n".join(lines)


def terms(t: TimeEstimate) -> dict[str, float]:
    """Each leaf of the step breakdown as a share of the step."""
    out: dict[str, float] = {}

    def walk(b, prefix: str = "") -> None:  # type: ignore[no-untyped-def]
        for k, v in b:
            if hasattr(v, "total"):
                walk(v, prefix + k + "/")
            elif float(v) > 0:
                out[prefix + k] = float(v) / t.step_s

    walk(t.breakdown)
    return out


def residual_table(rows: list[Row]) -> str:
    """Per source: the terms that hold at least 5% of the step on average, and the factor each would
    need (alone) to close the median error: for a term of share s and a throughput error e, the term
    must be k = 1 + ((1 + e) − 1)/s times longer. A factor far from 1 (or below 0) rules the term out
    as the single cause; a plausible one names a suspect."""
    by: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        by[r.family].append(r)
    lines = ["| source | median error | terms (share of step → factor that alone closes the median error) |", "|---|---:|---|"]
    for fam, rs in sorted(by.items()):
        med = statistics.median(r.error for r in rs)
        shares: dict[str, list[float]] = defaultdict(list)
        for r in rs:
            for k, v in terms(r.estimate).items():
                shares[k].append(v)
        mean_share = {k: sum(v) / len(rs) for k, v in shares.items()}
        cells = []
        for k, s in sorted(mean_share.items(), key=lambda kv: -kv[1]):
            if s < 0.05:
                continue
            factor = 1 + med / s  # step must grow by med·step; the term alone grows by that much
            cells.append(f"{k} {s:.0%} → ×{factor:.2f}")
        lines.append(f"| {fam} | {med:+.1%} | {'; '.join(cells)} |")
    return "\n".join(lines)


SECTION = "## Step time out of sample"


def main() -> int:
    path = write_option(__doc__.splitlines()[0])
    started = time.perf_counter()
    runs, skipped = load()
    cases = [(r, r.job()) for r in runs]
    grid = Grid.build(cases)
    cal = grid.fit(grid.every)
    print("fitted on every source:", {n: round(getattr(cal, n), 4) for n in MECHANISMS},
          "DEFAULT:", {n: round(getattr(DEFAULT, n), 4) for n in MECHANISMS})
    loso_rows, loso_fits = leave_one_source_out(grid)
    inside = evaluate(cases, cal)
    unfitted = evaluate(cases, priors())
    parts = [
        "Leave-one-source-out (each source predicted by constants fitted on the others):\n\n" + summary(loso_rows),
        "No constant fitted (every mechanism at its sourced prior, so every source is out of sample):\n\n" + summary(unfitted),
        "In sample (constants fitted on every source):\n\n" + summary(inside),
        "Constants fitted on end-to-end runs, with their fit sets:\n\n"
        + constants_table(grid, cal, loso_fits, {n: free_scan(grid, cal, n) for n, p in MECHANISMS.items() if p.unpinned}),
        "Which term would have to move, per source (leave-one-source-out errors):\n\n" + residual_table(loso_rows),
        run_table(loso_rows, inside),
    ]
    text = "\n\n".join(parts)
    print(text)
    print(f"\n{len(runs)} runs from {len({family(r.group) for r in runs})} sources, {len(skipped)} entries left out; {time.perf_counter() - started:.0f} s")
    if path:
        left_out = "\n".join(f"- {i}: {why}" for i, why in skipped)
        intro = (
            "Produced by `python benchmarks/time_accuracy.py --write docs/accuracy.md`. Measured = each source's\n"
            "throughput as tokens/s/GPU (benchmarks/published.py converts TFLOP/s, MFU and step times with the\n"
            "source's own FLOP count); predicted = `planner estimate` of the same layout. Errors are\n"
            "predicted/measured − 1. A source is a family of runs measured by one team on one code base\n"
            "(benchmarks/published.py `family`).\n\n"
        )
        write_section(path, text + "\n\nLeft out, and why:\n\n" + left_out, SECTION, intro)
        write_block(path.parent / "performance-model.md", "fitted-constants", model_doc_constants(grid, cal, loso_fits))
    return 0


if __name__ == "__main__":
    sys.exit(main())
