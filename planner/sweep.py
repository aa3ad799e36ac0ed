"""`planner sweep`: the best plan at each GPU count, and how well it scales.

Strong scaling at a fixed global batch: the efficiency of n GPUs relative to the smallest count
that fits, n0, is

    E(n) = (tokens/s at n) / (tokens/s at n0 · n / n0)

and where it falls, the term of the step breakdown whose share of the step grew most since n0 says
why (a bubble from fewer micro-batches per pipeline, exposed dp traffic, ...).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cost_models.calibration import DEFAULT, Calibration
from cost_models.errors import SpecError


# A sweep plans each count in turn (seconds each); 32 counts cover 1..2^24 GPUs by powers of two
# with room for a few between. The largest count is the spec limit on GPUs (MAX_COUNT).
MAX_SWEEP_COUNTS = 32


def parse_gpus(text: str) -> list[int]:
    """`64..16384` (the powers of two in between, both ends included when they are powers of two),
    or a comma list `64,96,128`; at most MAX_SWEEP_COUNTS counts, each at most MAX_COUNT."""
    from cost_models.model_spec import MAX_COUNT

    text = text.strip()
    form = "expected LO..HI (powers of two between) or a list like 64,128,256 of positive integers"
    if len(text) > 64 * MAX_SWEEP_COUNTS:
        raise SpecError(f"--gpus: {len(text):,} characters; {form}, at most {MAX_SWEEP_COUNTS} counts")
    try:
        if ".." in text:
            lo_s, hi_s = text.split("..", 1)
            lo, hi = int(lo_s), int(hi_s)
            if lo < 1 or hi < lo:
                raise ValueError
            out, n = [], 1  # doubling: log2(hi) steps, hi being at most 64·MAX_SWEEP_COUNTS digits long
            while n <= hi:
                if n >= lo:
                    out.append(n)
                n *= 2
            if lo not in out:
                out.insert(0, lo)
            if hi not in out:
                out.append(hi)
        else:
            out = sorted({int(x) for x in text.split(",") if x.strip()})
            if not out or out[0] < 1:
                raise ValueError
    except ValueError:
        raise SpecError(f"--gpus({text!r}): {form}") from None
    if out[-1] > MAX_COUNT:
        raise SpecError(f"--gpus: {out[-1]:,} GPUs; a cluster spec takes at most {MAX_COUNT:,} (2^24)")
    if len(out) > MAX_SWEEP_COUNTS:
        raise SpecError(f"--gpus: {len(out):,} counts; a sweep takes at most {MAX_SWEEP_COUNTS} (each is a full search)")
    return out


@dataclass(frozen=True)
class SweepRow:
    gpus: int
    report: Any | None  # planner.runners.EstimateReport of the best plan, or None
    reason: str | None  # why nothing fits at this count, or why the search gave no answer
    efficiency: float | None = None  # strong-scaling efficiency vs the smallest count that fits
    grew: str | None = None  # the term whose share of the step grew most since that count
    grew_shares: tuple[float, float] | None = None  # that term's share of the step there, and here
    # the search stopped at its time limit: with no report, no answer (not "nothing fits"); with one,
    # the best layout scored so far, not proven the fastest
    timed_out: bool = False

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"gpus": self.gpus}
        if self.report is None:
            gave = {"fits": None, "timed_out": True} if self.timed_out else {"fits": False}
            return {**doc, **gave, "reason": self.reason}
        t = self.report.time
        return {
            **doc,
            "fits": True,
            "proven": not self.timed_out,
            "layout": self.report.to_json()["layout"],
            "step_s": t.step_s,
            "tokens_per_s": t.tokens_per_s,
            "tokens_per_s_per_gpu": t.tokens_per_s_per_gpu,
            "mfu": t.mfu,
            "bottleneck": t.bottleneck,
            "scaling_efficiency": self.efficiency,
            "share_grown_most": self.grew,
            "checkpoint": self.report.reliability.to_json(),
            **({"time_to_train": self.report.cost.to_json()} if self.report.cost is not None else {}),
        }


def _shares(report: Any) -> dict[str, float]:
    t = report.time
    b = t.breakdown
    return {name: float(b.value(name)) / t.step_s for name, _ in b}


def run_sweep(
    model: str, cluster: str, counts: list[int], *, training: dict[str, Any], fixes: list[str],
    headroom: float | None = None, allow_cross_node_tp: bool = False, calibration: Calibration = DEFAULT,
    progress: Callable[[str], None] | None = None, outlook: Any = None, time_limit_s: float | None = None,
) -> list[SweepRow]:
    from planner.runners import NoLayout, Outlook, SearchTimedOut, run_plan

    rows: list[SweepRow] = []
    base = None
    for n in counts:
        if progress is not None:
            progress(f"searching {n} GPUs")
        try:
            found = run_plan(model, cluster, n, training=training, fixes=fixes, top=1, headroom=headroom,
                             allow_cross_node_tp=allow_cross_node_tp, calibration=calibration, hints=False,
                             outlook=outlook or Outlook(), time_limit_s=time_limit_s)
        except NoLayout as e:  # an infeasible count; any other SpecError is bad input and propagates
            rows.append(SweepRow(n, None, str(e).removeprefix("error: ")))
            continue
        except SearchTimedOut as e:  # no answer at this count; the sweep goes on
            rows.append(SweepRow(n, None, str(e).removeprefix("error: "), timed_out=True))
            continue
        report, unproven = found.plans[0], not found.result.optimal
        if base is None:
            base = (n, report)
        n0, r0 = base
        eff = report.time.tokens_per_s / (r0.time.tokens_per_s * n / n0)
        s0, s1 = _shares(r0), _shares(report)
        grew = max(s1, key=lambda k: s1[k] - s0.get(k, 0.0)) if n != n0 else None
        rows.append(SweepRow(n, report, None, eff, grew, None if grew is None else (s0.get(grew, 0.0), s1[grew]), unproven))
    return rows


# Where "scales well" ends: the efficiency under which a count is said to break down. A reporting
# threshold chosen here, not a model constant: it moves the line, never a number of the model.
SCALING_LIMIT_EFFICIENCY = 0.9


@dataclass(frozen=True)
class ScalingLimit:
    """The first count whose strong-scaling efficiency falls under the threshold, and why."""

    threshold: float
    last_good: int | None  # the largest count before it that stays at or above the threshold
    row: SweepRow | None  # None: every count that fits stays at or above it
    unanswered: bool = False  # some count's search stopped at its time limit with nothing that fits

    def to_json(self) -> dict[str, Any]:
        r = self.row
        return {
            "threshold": self.threshold,
            "scales_through_gpus": self.last_good,
            "breaks_at_gpus": None if r is None else r.gpus,
            "efficiency": None if r is None else r.efficiency,
            "term": None if r is None else r.grew,
            "term_share_from": None if r is None or r.grew_shares is None else r.grew_shares[0],
            "term_share_to": None if r is None or r.grew_shares is None else r.grew_shares[1],
        }

    def line(self) -> str:
        if self.last_good is None:
            return ("no GPU count of the sweep has a layout found within the search's time limit" if self.unanswered
                    else "no GPU count of the sweep has a layout")
        if self.row is None:
            return f"scaling stays at or above {self.threshold:.0%} through {self.last_good:,} GPUs"
        r = self.row
        why = ""
        if r.grew is not None and r.grew_shares is not None:
            a, b = r.grew_shares
            why = f": {r.grew} grows from {a:.1%} to {b:.1%} of the step"
        return (f"scaling stays at or above {self.threshold:.0%} through {self.last_good:,} GPUs and falls to "
                f"{r.efficiency:.0%} at {r.gpus:,}{why}")


def scaling_limit(rows: list[SweepRow], threshold: float = SCALING_LIMIT_EFFICIENCY) -> ScalingLimit:
    fits = [r for r in rows if r.report is not None and r.efficiency is not None]
    last_good = None
    for r in fits:
        if r.efficiency < threshold:  # type: ignore[operator]
            return ScalingLimit(threshold, last_good, r)
        last_good = r.gpus
    return ScalingLimit(threshold, last_good, None, any(r.report is None and r.timed_out for r in rows))
