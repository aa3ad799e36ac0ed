"""Plan quality: where each published (expert-chosen) layout ranks in `planner plan`'s own list.

For every run of benchmarks/published.py (the runs the time model is calibrated on) the script
poses the problem `planner plan` would get: the run's model, cluster and GPU count, sequence
length, global batch, framework and precision, nothing fixed. It searches the top 5 and scores
the published layout exactly with `planner.search.evaluate` (what `planner estimate` gives), at
the same memory headroom.

- rank = 1 + the listed layouts with a strictly smaller predicted step time. It is exact when
  the published step is no slower than our 5th (or the space holds fewer than 5 layouts), else
  "> 5". A layout the memory model rejects (or a rule forbids) has no rank.
- gain = published step / our #1 step − 1. The time model does not depend on memory, so a
  rejected layout keeps its gain.
- outside the space: which bound of planner.space keeps the published layout out of the search.
- measured: for each row behind our #1 by more than 3%, the published runs (any source, any role)
  that measured our #1's choice on the same model, GPU, sequence and precision, and whether they
  ran faster or slower than the published row (find_evidence).

Judged count: benchmarks/data/software_options.yaml says, per source, which rows are the layout the
source chose (the others are ablation arms or sweep points) and which layout options its software
had at the version it ran. Each chosen row is searched again with only those options
(planner.space.Problem.allowed) and counted as above.

Run: python benchmarks/plan_quality.py [--write docs/accuracy.md] [--only SUBSTRING] [--time-limit S]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.memory_accuracy import write_section  # noqa: E402
from benchmarks.published import PublishedRun, family, load  # noqa: E402
from cost_models.errors import SpecError  # noqa: E402
from cost_models.job import Job  # noqa: E402
from cost_models.layout import Layout  # noqa: E402
from cost_models.memory import DEFAULT_HEADROOM  # noqa: E402
from cost_models.rules import resolve  # noqa: E402
from cost_models.step_time import TimeEstimate, time_estimate  # noqa: E402
from planner.render import split_tag  # noqa: E402
from planner.search import TIE_RESOLUTION, Plan, Rejected, SearchResult, evaluate, search  # noqa: E402
from planner.space import (  # noqa: E402
    HSDP_GROUPS, MAX_MBS, MAX_VPP, MIN_CP_TOKENS, Problem, Sharding, accumulation_ok, cp_values, ep_values, etp_values,
    mbs_values, parse_allowed, sharding_ok, shardings, sp_values, stages, tp_values,
)

TOP = 5
CLOSE = 0.03  # "within 3% of our #1"
SAME = 1e-9  # relative step-time difference below which two scores are the same number
TIME_LIMIT_S = 30.0
SECTION = "## Plan quality vs published layouts"
OPTIONS = Path(__file__).resolve().parent / "data" / "software_options.yaml"
STATEMENTS = Path(__file__).resolve().parent / "data" / "miss_statements.yaml"


class Role(StrEnum):
    CHOSEN = "chosen"  # the layout the source chose: recommended, best found, production or submission
    ABLATION = "ablation"  # the baseline or "without" arm of a comparison the source makes
    SWEEP = "sweep"  # a point of a sweep of one layout knob
    BEST_OF = "best_of"  # (options file only) a sweep whose best measured point is chosen


ROLES = tuple(r.value for r in Role)
BEFORE = "## Notes on the throughput comparison"


# --- what each source chose, and what its software offered (data/software_options.yaml) ---------


@dataclass(frozen=True)
class Judging:
    role: Role  # CHOSEN, ABLATION or SWEEP
    why: str
    source: str
    software: str | None  # the framework version whose options narrow the search; None: all open
    allowed: dict[str, frozenset]  # planner.space.Problem.allowed


def load_options(path: Path = OPTIONS) -> dict[str, dict[str, Any]]:
    """The options file, checked: every group says why its rows are chosen and where from; every row
    rule and options entry has a source; every narrowed axis names its evidence and parses."""
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise SpecError(f"{path.name}: expected a mapping of group -> entry")
    for group, entry in data.items():
        where = f"{path.name} {group}"
        if set(entry) - {"chosen", "rows", "options", "options_open"}:
            raise SpecError(f"{where}: unknown keys {sorted(set(entry) - {'chosen', 'rows', 'options', 'options_open'})}")
        if not (entry.get("chosen") or {}).get("why") or not entry["chosen"].get("source"):
            raise SpecError(f"{where}: chosen needs why and source")
        for rule in entry.get("rows") or []:
            if rule.get("role") not in ROLES or not rule.get("match") or not rule.get("why") or not rule.get("source"):
                raise SpecError(f"{where} rows: each rule needs match, why, source and a role of {', '.join(ROLES)}")
            if rule["role"] == Role.BEST_OF and re.compile(rule.get("key", "")).groups < 1:
                raise SpecError(f"{where} rows: a best_of rule needs a key with one group (the sweep's name)")
        if not entry.get("options") and not entry.get("options_open"):
            raise SpecError(f"{where}: no options and no options_open saying why every axis is open")
        for opt in entry.get("options") or []:
            if not opt.get("match") or not opt.get("software") or not opt.get("source"):
                raise SpecError(f"{where} options: each entry needs match, software and source")
            allowed = opt.get("allowed") or {}
            missing = sorted(set(allowed) - set(opt.get("why") or {}))
            if missing:
                raise SpecError(f"{where} options: no evidence (why) for {', '.join(missing)}")
            parse_allowed(allowed)
    return data


def judge(runs: list[PublishedRun], options: dict[str, dict[str, Any]]) -> dict[str, Judging]:
    """Each run's role (the first row rule whose match is found in its id; chosen if none) and the
    options of its software (the first options entry that matches). In a best_of sweep the run with
    the highest measured tokens/s/GPU is chosen, the rest are sweep points."""
    out: dict[str, Judging] = {}
    for run in runs:
        if run.group not in options:
            raise SpecError(f"{OPTIONS.name}: group {run.group!r} (run {run.id}) has no entry; add one saying which rows it chose")
        entry = options[run.group]
        rule = next((r for r in entry.get("rows") or [] if re.search(r["match"], run.id)), None)
        role, why, source = (Role.CHOSEN, entry["chosen"]["why"], entry["chosen"]["source"]) if rule is None else (
            Role(rule["role"]), rule["why"], rule["source"])
        if role is Role.BEST_OF:
            key = re.search(rule["key"], run.id)
            assert key, f"{run.id}: best_of key {rule['key']} does not match"
            sweep = [r for r in runs if r.group == run.group and (k := re.search(rule["key"], r.id)) and k.group(1) == key.group(1)]
            best = max(sweep, key=lambda r: r.measured_tokens_per_s_per_gpu)
            role = Role.CHOSEN if best is run else Role.SWEEP
            why = f"{why} (best of {len(sweep)}: {best.id})" if len(sweep) > 1 else f"{why} (the only split measured)"
        opt = next((o for o in entry.get("options") or [] if re.search(o["match"], run.id)), None)
        allowed = parse_allowed(opt.get("allowed") or {}) if opt else {}
        out[run.id] = Judging(role, why, source, opt["software"] if opt else None, allowed)
    return out


def rank_of(step_s: float, ranked_s: list[float], top: int = TOP) -> int | None:
    """1 + the ranked layouts strictly faster than step_s, where ranked_s is the proven top `top`
    in order; None when all of them are faster (the rank is then only known to exceed `top`)."""
    faster = sum(1 for s in ranked_s if s < step_s * (1 - SAME))
    return 1 + faster if faster < len(ranked_s) or len(ranked_s) < top else None


def outside_space(problem: Problem, job: Job) -> tuple[tuple[str, str], ...]:
    """(axis, why) for each bound of planner.space the published layout breaks; empty when the
    search can generate it."""
    lay, s, fw = job.layout, problem.training.seq_len, problem.framework.value
    why = []
    if lay.tp not in tp_values(problem):
        domain = problem.cluster.spec.scaleup_domain_gpus
        why.append(("tp", f"tp {lay.tp} spans nodes (domain {domain})" if lay.tp > domain
                    else f"tp {lay.tp} does not divide the {problem.model.num_attention_heads} heads"))
    elif job.sp not in sp_values(problem, lay.tp):
        why.append(("sp", f"sp {'on' if job.sp else 'off'} at tp {lay.tp} is not searched for {fw}"))
    elif job.etp not in etp_values(problem, lay.tp):
        why.append(("etp", f"etp {job.etp} is not searched for {fw}"))
    if lay.cp not in cp_values(problem):
        why.append(("cp", f"cp {lay.cp} leaves {s // lay.cp} tokens per rank (< {MIN_CP_TOKENS})" if s // lay.cp < MIN_CP_TOKENS
                    else f"cp {lay.cp} is not searched for {fw}"))
    if lay.ep not in ep_values(problem):
        why.append(("ep", f"ep {lay.ep} is not searched"))
    if lay.mbs not in mbs_values(problem):
        why.append(("mbs", f"mbs {lay.mbs} is not a divisor of the global batch ≤ {MAX_MBS}"))
    elif not accumulation_ok(problem, lay.pp, job.num_microbatches):
        why.append(("grad_accumulation", f"{job.num_microbatches} micro-batches at pp {lay.pp}: gradient accumulation is not searched"
                    if job.num_microbatches > 1 else f"1 micro-batch at pp {lay.pp}: only gradient accumulation is searched"))
    n, counts = problem.model.num_layers, tuple(stage_counts(job))
    made = {(st.pp, st.vpp, tuple(st.counts(n)), st.recompute, st.recompute_layers) for st in stages(problem)}
    if (lay.pp, lay.vpp, counts, lay.recompute, lay.recompute_layers) not in made:
        splits = sorted({c for pp, vpp, c, _, _ in made if (pp, vpp) == (lay.pp, lay.vpp)})
        if lay.vpp > MAX_VPP:
            why.append(("vpp", f"vpp {lay.vpp} > {MAX_VPP} without an even split"))
        elif not splits:
            why.append(("vpp", f"vpp {lay.vpp} at pp {lay.pp} is not searched"))
        elif counts not in splits:
            why.append(("split", f"stages {ends(counts)} (the search splits pp {lay.pp} vpp {lay.vpp} as "
                                 f"{' or '.join(ends(c) for c in splits)})"))
        else:
            why.append(("recompute", f"recompute {lay.recompute.value} of {lay.recompute_layers} layers is not searched"))
    sh = Sharding(job.zero, lay.dp_shard if lay.dp_shard != job.dp else None)
    if sh not in shardings(problem):
        why.append(("zero", f"HSDP group {lay.dp_shard} not in {HSDP_GROUPS}" if sh.dp_shard
                    else f"zero {int(job.zero)} is not searched for {fw}"))
    elif not sharding_ok(problem, lay.pp, sh, job.dp):
        why.append(("zero", f"zero {int(job.zero)} with pp {lay.pp} is not searched for {fw}"))
    return tuple(why)


def stage_counts(job: Job) -> list[int]:
    return [len(job.stage_layer_ids(r)) for r in range(job.layout.pp)]


def ends(counts: tuple[int, ...]) -> str:
    """Decoder layers per stage as first/middle/last: 15/16/15."""
    return "/".join(map(str, (counts[0], counts[1], counts[-1]))) if len(counts) > 2 else "/".join(map(str, counts))


@dataclass(frozen=True)
class Row:
    run: PublishedRun
    published: Plan | Rejected  # the exact model on the published layout, as `planner estimate`
    published_time: TimeEstimate | None  # its step time even where memory rejects it (None: a rule does)
    outside: tuple[tuple[str, str], ...]  # (axis, why) per search-space bound it breaks
    result: SearchResult

    @property
    def best(self) -> Plan:
        return self.result.plans[0]

    @property
    def rank(self) -> int | None:
        if not isinstance(self.published, Plan):
            return None
        return rank_of(self.published.time.step_s, [p.time.step_s for p in self.result.plans])

    @property
    def listed(self) -> int | None:
        """Where the published layout itself (resolved) is in our list, if it is."""
        if not isinstance(self.published, Plan):
            return None
        for i, p in enumerate(self.result.plans, 1):
            if p.job.layout == self.published.job.layout:
                return i
        return None

    @property
    def gain(self) -> float | None:
        if self.published_time is None or not self.result.plans:
            return None
        return self.published_time.step_s / self.best.time.step_s - 1

    @property
    def good(self) -> bool:
        """Ranked in our top 5, or a layout we accept within 3% of our #1."""
        return isinstance(self.published, Plan) and (self.rank is not None or (self.gain is not None and self.gain <= CLOSE))


def run_row(run: PublishedRun, time_limit_s: float, allowed: dict[str, frozenset] | None = None) -> Row:
    problem = Problem(run.model, run.cluster, run.training, allowed=allowed or {})
    published = evaluate(problem, run.layout, headroom=DEFAULT_HEADROOM)
    try:
        job = resolve(run.model, run.cluster, run.training, run.layout)
    except SpecError:
        job = None
    result = search(problem, top=TOP, headroom=DEFAULT_HEADROOM, time_limit_s=time_limit_s)
    return Row(run, published, time_estimate(job) if job else None, outside_space(problem, job) if job else (), result)


# --- formatting --------------------------------------------------------------------------------


def short(job: Job) -> str:
    """tp8sp pp12v4[15/15] cp2 ep8 dp4 z1 mbs1 full — the shape `planner plan` prints."""
    lay = job.layout
    parts = [f"tp{lay.tp}" + ("sp" if job.sp else "")]
    if lay.pp > 1:
        parts.append(f"pp{lay.pp}" + (f"v{lay.vpp}" if lay.vpp > 1 else "") + split_tag(lay))
    parts += [f"cp{lay.cp}"] if lay.cp > 1 else []
    parts += [f"ep{lay.ep}"] if lay.ep > 1 else []
    parts.append(f"dp{job.dp}")
    parts.append(f"z{int(job.zero)}" + (f"/{lay.dp_shard}" if lay.dp_shard and lay.dp_shard < job.dp else ""))
    parts.append(f"mbs{lay.mbs}")
    rc = {"none": "", "selective": "sel", "full": "full"}[lay.recompute.value]
    parts += [rc + (str(lay.recompute_layers) if lay.recompute_layers else "")] if rc else []
    return " ".join(parts)


AXES = ("tp", "sp", "pp", "vpp", "cp", "ep", "dp", "zero", "mbs", "recompute")


def axis_values(job: Job) -> dict[str, object]:
    """The layout axes `changes` compares, as printed: sp on/off, zero 0-3, recompute with its layer count."""
    lay = job.layout
    rc = lay.recompute.value + (f"({lay.recompute_layers})" if lay.recompute_layers else "")
    return dict(tp=lay.tp, sp="on" if job.sp else "off", pp=lay.pp, vpp=lay.vpp, cp=lay.cp, ep=lay.ep, dp=job.dp,
                zero=int(job.zero), mbs=lay.mbs, recompute=rc)


def changes(ours: Job, theirs: Job) -> list[str]:
    """The axes our #1 sets differently, as 'axis published→ours'."""
    a, b = axis_values(ours), axis_values(theirs)
    return [f"{k} {b[k]}→{a[k]}" for k in AXES if a[k] != b[k]]


def deltas(ours: TimeEstimate, theirs: TimeEstimate, scale: float = 1.0) -> list[tuple[str, float]]:
    """Per term of the step breakdown, `ours` minus `theirs` (here our #1 minus the published layout;
    order_accuracy and nanotron_sweep_time pass the two layouts of a pair), largest first; `scale`
    multiplies `theirs`' terms (a step of other tokens brought to ours)."""
    a, b = ours.breakdown.flat(), theirs.breakdown.flat()
    d = {k: float(a.get(k, 0.0)) - scale * float(b.get(k, 0.0)) for k in a | b}
    return sorted(((k, v) for k, v in d.items() if abs(v) > 5e-4), key=lambda kv: -abs(kv[1]))


def seconds(x: float) -> str:
    return f"{x:+.3g} s".replace("-", "−")


# --- measured runs of our #1's choice ------------------------------------------------------------
#
# A miss is a prediction: our #1 runs more than CLOSE faster than the layout the source chose. Another
# published run may have measured that choice: the same model (its shape), GPU, sequence length and
# precision, with our #1's value on every axis our #1 changes (dp and the GPU count may differ), or,
# failing that, on the axis that saves the most. Measured more than CLOSE faster than the published row
# it supports our #1's direction. Measured more than CLOSE slower, it is evidence against the model unless
# the model too predicts it more than CLOSE slower: then its other differences (more GPUs, other axes)
# are priced to outweigh our #1's choice and it says nothing against it. A run of the same source family
# on the same software, GPU count and other axes differs from the published row in our #1's choice
# alone; other software or another source can differ in kernels, overlap and tuning too.
# benchmarks/order_accuracy.py orders the measured layouts of one problem (one source group, GPU count
# and batch) whatever the planner picks; this starts from our #1's choice and crosses GPU counts,
# batches and sources, saying so per run.


class Verdict(StrEnum):
    SUPPORT = "support"  # measured faster than the published row by more than CLOSE
    AGAINST = "against"  # measured slower by more than CLOSE, not predicted so
    EXPLAINED = "slower as predicted"  # measured and predicted slower by more than CLOSE: its other differences decide
    TIE = "tie"  # within CLOSE
    MIXED = "mixed"  # the strongest runs disagree
    NONE = "none"  # no published run measured our #1's choice


class Source(StrEnum):  # strongest first
    SAME_SOFTWARE = "same source, same software"
    SAME_SOURCE = "same source, other or unstated software"
    OTHER = "other source"


@dataclass(frozen=True)
class Measured:
    """A published run with our #1's choice, against the published row of a miss."""

    run: PublishedRun
    job: Job
    every: bool  # our #1's value on every axis it changes (else on the deciding axis only)
    source: Source
    ratio: float  # its measured tokens/s/GPU over the published row's
    predicted: float  # the same ratio as the time model predicts it
    other: tuple[str, ...]  # the axes where it differs from our #1 besides dp, as 'axis value'
    scale: tuple[str, ...]  # GPUs or global batch, where they differ from the published row's

    @property
    def verdict(self) -> Verdict:
        if self.ratio > 1 + CLOSE:
            return Verdict.SUPPORT
        if self.ratio < 1 - CLOSE:
            return Verdict.AGAINST if self.predicted >= 1 - CLOSE else Verdict.EXPLAINED
        return Verdict.TIE

    @property
    def strength(self) -> tuple[bool, int, bool, int]:
        """Smaller is stronger: every changed axis matched, the fewest other axes, the same GPU count
        and batch, then the source."""
        return not self.every, len(self.other), bool(self.scale), list(Source).index(self.source)


@dataclass(frozen=True)
class Evidence:
    run: PublishedRun  # the published row of the miss
    changed: tuple[str, ...]  # the axes our #1 changes, dp left out, most time saved first
    found: tuple[Measured, ...]  # strongest first

    @property
    def verdict(self) -> Verdict:
        if not self.found:
            return Verdict.NONE
        top = {m.verdict for m in self.found if m.strength == self.found[0].strength}
        if {Verdict.SUPPORT, Verdict.AGAINST} <= top:
            return Verdict.MIXED
        return next(v for v in (Verdict.SUPPORT, Verdict.AGAINST, Verdict.EXPLAINED, Verdict.TIE) if v in top)


def model_shape(run: PublishedRun) -> str:
    """The run's model as its shape alone: every field but its name and source."""
    return run.model.model_dump_json(exclude={"name", "source"})


def same_problem(a: PublishedRun, b: PublishedRun) -> bool:
    """The same model (shape, whatever its name), GPU, sequence length and precision."""
    return (model_shape(a) == model_shape(b)
            and a.cluster.spec.gpu.name == b.cluster.spec.gpu.name
            and a.training.seq_len == b.training.seq_len and a.training.precision == b.training.precision)


def software_of(text: str | None) -> str | None:
    """The software's name and version, the options file's text before its first parenthesis; None
    where the source did not publish it."""
    return None if not text or text.startswith("not published") else text.split(" (")[0]


_UNSPLIT = dict(pp_first_stage_layers=None, pp_last_stage_layers=None, pp_layout=None, schedule=None)


def _one_axis(theirs: Job, ours: Job, axis: str) -> Layout:
    """The published layout with one axis set as our #1 sets it: dp follows tp, pp and cp, and a new
    pipeline shape drops the published split and schedule."""
    a = ours.layout
    update = {"tp": dict(tp=a.tp, dp=None), "sp": dict(sp=ours.sp), "pp": dict(pp=a.pp, dp=None, **_UNSPLIT),
              "vpp": dict(vpp=a.vpp, **_UNSPLIT), "cp": dict(cp=a.cp, dp=None), "ep": dict(ep=a.ep),
              "zero": dict(zero=ours.zero, dp_shard=a.dp_shard), "mbs": dict(mbs=a.mbs),
              "recompute": dict(recompute=a.recompute, recompute_layers=a.recompute_layers)}[axis]
    return Layout(**{**theirs.layout.model_dump(), **update})


def deciding(ours: Job, theirs: Job) -> tuple[str, ...]:
    """The axes our #1 changes but dp (which follows tp, pp and cp), most time saved first: the
    published step minus its step with that one axis set as our #1 sets it. An axis that cannot be
    set alone (the layout does not resolve) goes last."""
    a, b = axis_values(ours), axis_values(theirs)
    axes = [k for k in AXES if k != "dp" and a[k] != b[k]]
    step = time_estimate(theirs).step_s

    def saved(axis: str) -> float:
        try:
            job = resolve(theirs.model, theirs.cluster, theirs.training, _one_axis(theirs, ours, axis))
        except (SpecError, ValueError):
            return float("-inf")
        return step - time_estimate(job).step_s

    return tuple(sorted(axes, key=lambda k: -saved(k)))


def measured(ours: Job, published: PublishedRun, theirs: Job, runs: list[tuple[PublishedRun, Job, str | None]],
             software: str | None) -> Evidence:
    """The published runs (any role) that measured our #1's choice on the published row's problem.
    `runs`: every published run with its job and software; `software`: the published row's."""
    changed = deciding(ours, theirs)
    if not changed:
        return Evidence(published, changed, ())
    mine, rate = axis_values(ours), time_estimate(theirs).tokens_per_s_per_gpu
    found = []
    for run, job, sw in runs:
        if run.id == published.id or not same_problem(run, published):
            continue
        have = axis_values(job)
        every = all(have[k] == mine[k] for k in changed)
        if not every and have[changed[0]] != mine[changed[0]]:
            continue
        src = (Source.OTHER if family(run.group) != family(published.group) else
               Source.SAME_SOFTWARE if software_of(sw) and software_of(sw) == software_of(software) else Source.SAME_SOURCE)
        scale = ((f"{run.cluster.num_gpus} GPUs",) if run.cluster.num_gpus != published.cluster.num_gpus else ()) + (
            (f"batch {run.training.global_batch_size}",) if run.training.global_batch_size != published.training.global_batch_size else ())
        other = tuple(f"{k} {have[k]}" for k in AXES if k != "dp" and have[k] != mine[k])
        ratio = run.measured_tokens_per_s_per_gpu / published.measured_tokens_per_s_per_gpu
        found.append(Measured(run, job, every, src, ratio, time_estimate(job).tokens_per_s_per_gpu / rate, other, scale))
    return Evidence(published, changed, tuple(sorted(found, key=lambda m: (m.strength, len(m.scale), -m.ratio))))


def misses(rows: list[Row]) -> list[Row]:
    """Rows neither in our top 5 nor within CLOSE of our #1 by time."""
    return [r for r in rows if not r.good and r.gain is not None and r.gain > CLOSE and r.result.plans]


def find_evidence(rows: list[Row], runs: list[PublishedRun], judging: dict[str, Judging]) -> dict[str, Evidence]:
    """Per miss (by run id), the measured runs of our #1's choice."""
    pool = []
    for run in runs:
        try:
            pool.append((run, run.job(), judging[run.id].software))
        except SpecError:
            continue
    return {r.run.id: measured(r.best.job, r.run, r.published_time.job, pool, judging[r.run.id].software) for r in misses(rows)}


# --- what the sources say of our #1's choice (data/miss_statements.yaml) -------------------------


@dataclass(frozen=True)
class Statement:
    """A source's own words on a trade-off our #1 can make, with where they were read."""

    groups: tuple[str, ...]  # the published_runs.yaml groups it speaks for
    axes: tuple[str, ...]  # the layout axes (AXES) it is about
    direction: str  # what it says costs time
    quote: str
    location: str
    url: str
    match: str = "."  # a regex the run id must contain

    def speaks_for(self, e: Evidence) -> bool:
        """Whether it is the miss's source speaking about an axis our #1 changes."""
        return (e.run.group in self.groups and re.search(self.match, e.run.id) is not None
                and any(a in e.changed for a in self.axes))


STATEMENT_KEYS = {"groups", "axes", "direction", "quote", "location", "url", "match"}


def load_statements(path: Path = STATEMENTS) -> tuple[Statement, ...]:
    """The statements file, checked: every entry names its groups, the axes of AXES it is about,
    its direction, its quote and where that was read."""
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, list):
        raise SpecError(f"{path.name}: expected a list of statements")
    out = []
    for i, entry in enumerate(data, 1):
        where = f"{path.name} entry {i}"
        if not isinstance(entry, dict) or set(entry) - STATEMENT_KEYS:
            raise SpecError(f"{where}: keys must be among {', '.join(sorted(STATEMENT_KEYS))}")
        missing = [k for k in sorted(STATEMENT_KEYS - {"match"}) if not entry.get(k)]
        if missing:
            raise SpecError(f"{where}: no {', '.join(missing)}; every statement needs groups, axes, direction, quote, location and url")
        bad = sorted(set(entry["axes"]) - set(AXES))
        if bad:
            raise SpecError(f"{where}: axes {', '.join(map(str, bad))} are not layout axes ({', '.join(AXES)})")
        re.compile(entry.get("match", "."))
        out.append(Statement(tuple(entry["groups"]), tuple(entry["axes"]), entry["direction"], " ".join(entry["quote"].split()),
                             entry["location"], entry["url"], entry.get("match", ".")))
    return tuple(out)


def stated(found: dict[str, Evidence], statements: tuple[Statement, ...]) -> dict[str, tuple[Statement, ...]]:
    """Per miss (by run id), the statements of its source on an axis our #1 changes, in the order
    of the axis that saves most."""
    def first(s: Statement, e: Evidence) -> int:
        return min(e.changed.index(a) for a in s.axes if a in e.changed)

    return {run_id: tuple(sorted((s for s in statements if s.speaks_for(e)), key=lambda s: first(s, e)))
            for run_id, e in found.items()}


def statements_report(found: dict[str, Evidence], said: dict[str, tuple[Statement, ...]]) -> str:
    """Each statement once, with the misses it speaks for."""
    order = [s for s in dict.fromkeys(s for ss in said.values() for s in ss)]
    lines = []
    for s in order:
        ids = [i for i in found if s in said[i]]
        lines.append(f"- {', '.join(s.axes)}: “{s.quote}” ({s.location}; {s.url}). Says: {s.direction}. "
                     f"Misses: {', '.join(ids)}.")
    n = sum(1 for v in said.values() if v)
    head = (f"Of {len(found)} misses, {n} carry a statement of their own source on an axis our #1 changes "
            "(benchmarks/data/miss_statements.yaml; the others' sources say nothing found on those axes).")
    return head + ("\n\n" + "\n".join(lines) if lines else "")


def _measured_line(m: Measured, e: Evidence) -> str:
    published = e.run
    match = "" if m.every else f"; our #1's {e.changed[0]} only"
    differs = ", ".join(m.other + m.scale)
    return (f"{m.run.id} ({short(m.job)}) {m.run.measured_tokens_per_s_per_gpu:.0f} against "
            f"{published.measured_tokens_per_s_per_gpu:.0f} tokens/s/GPU ({m.ratio - 1:+.1%}, predicted {m.predicted - 1:+.1%}; "
            f"{m.source}{match}"
            + (f"; differs in {differs}" if differs else "") + ")")


def evidence_counts(found: list[Evidence], every: bool = False) -> str:
    """support a (same source, same software b, ...), against c (...), tie d, mixed e, none f; a
    verdict no miss has is left out unless `every`."""
    parts = []
    for v in Verdict:
        members = [e for e in found if e.verdict is v]
        if not members and not every:
            continue
        by = Counter(e.found[0].source for e in members if e.found)
        split = v in (Verdict.SUPPORT, Verdict.AGAINST) and members
        parts.append(f"{v} {len(members)}" + (" (" + ", ".join(f"{s} {by[s]}" for s in Source if by[s]) + ")" if split else ""))
    return ", ".join(parts)


def evidence_report(found: dict[str, Evidence], rows: list[Row], shown: int = 3,
                    said: dict[str, tuple[Statement, ...]] | None = None) -> str:
    """The summary over the misses, the runs against the model, then every miss with a measured run
    and, with `said` (stated), where its source speaks of our #1's choice."""
    said = said or {}
    if not found:
        return "No misses."
    ev = list(found.values())
    head = (f"Of {len(ev)} misses, published runs that measured our #1's choice (same model, GPU, sequence and "
            f"precision; our #1's value on every axis it changes but dp, else on the axis that saves most): "
            f"{evidence_counts(ev, every=True)}; stated by the source: {sum(1 for e in ev if said.get(e.run.id))}. Support: such a run measured more than {CLOSE:.0%} faster than the published "
            f"row; against: more than {CLOSE:.0%} slower, the model not predicting it {CLOSE:.0%} slower; slower as "
            f"predicted: the model too predicts it more than {CLOSE:.0%} slower, for what else differs (GPU count, other "
            "axes); the strongest runs decide (every changed axis before the deciding one, then the fewest other axes, "
            "the same GPU count and batch, the same source and software). Per miss: the gain of our #1, the axes it changes but dp (most time saved "
            "first), and its strongest measured runs with what else differs.")
    gain = {r.run.id: r.gain for r in rows}
    lines = []
    for v in (Verdict.AGAINST, Verdict.MIXED, Verdict.SUPPORT, Verdict.EXPLAINED, Verdict.TIE):
        for e in (e for e in ev if e.verdict is v):
            runs = "; ".join(_measured_line(m, e) for m in e.found[:shown])
            more = f"; {len(e.found) - shown} more" if len(e.found) > shown else ""
            says = "; ".join(s.location for s in said.get(e.run.id, ()))
            lines.append(f"- {v}: {e.run.id} (our #1 {gain[e.run.id]:+.0%}; changes {', '.join(e.changed)}): {runs}{more}."
                         + (f" Stated: {says}." if says else ""))
    against = [e.run.id for e in ev if e.verdict is Verdict.AGAINST]
    mixed = [e.run.id for e in ev if e.verdict is Verdict.MIXED]
    tail = ((f"\n\nAgainst the model (our #1's choice measured slower than the published row, not predicted so), the "
             f"errors to chase: {', '.join(against)}." if against else "\n\nNo measured run of our #1's choice is against the model.")
            + (f" Measured both ways by equally strong runs: {', '.join(mixed)}." if mixed else ""))
    return head + tail + ("\n\n" + "\n".join(lines) if lines else "")


def note(row: Row) -> str:
    out = []
    if isinstance(row.published, Rejected):
        out.append(f"published rejected: {row.published.reason}")
    if row.outside:
        out.append("outside the space: " + "; ".join(why for _, why in row.outside))
    if row.listed and row.listed != row.rank:
        out.append(f"listed as our #{row.listed} (tie)")
    if not row.good and row.published_time is not None and row.result.plans:
        terms = ", ".join(f"{k} {seconds(v)}" for k, v in deltas(row.best.time, row.published_time)[:2])
        out.append(f"#1 sets {', '.join(changes(row.best.job, row.published_time.job)) or 'the same axes'}" + (f": {terms}" if terms else ""))
    if not row.result.optimal:
        out.append(f"search stopped at {row.result.seconds:.0f} s: top {TOP} not proven, rank against the layouts scored")
    return "; ".join(out)


def table(rows: list[Row]) -> str:
    lines = ["| run | GPUs | framework | published | our #1 | rank | gain of #1 | note |",
             "|---|---:|---|---|---|---:|---:|---|"]
    for r in rows:
        pub = short(r.published_time.job) if r.published_time else "—"
        ours = short(r.best.job) if r.result.plans else "no layout fits"
        rank = "rejected" if isinstance(r.published, Rejected) else (str(r.rank) if r.rank else f"> {TOP}")
        gain = f"{r.gain:+.1%}" if r.gain is not None else "—"
        lines.append(f"| {r.run.id} | {r.run.cluster.num_gpus} | {r.run.training.framework.value} | {pub} | {ours} | "
                     f"{rank} | {gain} | {note(r)} |")
    return "\n".join(lines)


def summary(rows: list[Row], wall_s: float, limit_s: float, searched: int | None = None) -> str:
    """The counts under a table; `searched`: how many of the rows were searched anew in wall_s (the
    others reuse the unconstrained search), when not all of them."""
    n = len(rows)
    ranked = [r for r in rows if r.rank is not None]
    close = [r for r in rows if isinstance(r.published, Plan) and r.rank is None and r.gain is not None and r.gain <= CLOSE]
    rejected = [r for r in rows if isinstance(r.published, Rejected)]
    gains = [r.gain for r in rows if r.gain is not None]
    outside = [r for r in rows if r.outside]
    # with the published layout inside the space and fitting, a proven #1 can never be slower by more
    # than the search's tie resolution (a tie goes to the layout with more memory slack)
    misses = [r.run.id for r in rows if isinstance(r.published, Plan) and not r.outside and r.result.optimal
              and r.gain is not None and r.gain < -TIE_RESOLUTION]
    slow = [r for r in rows if not r.result.optimal]
    lines = [
        f"- In our top {TOP} or within {CLOSE:.0%} of our #1: {sum(r.good for r in rows)}/{n} "
        f"({len(ranked)} in the top {TOP}, {len(close)} more within {CLOSE:.0%}).",
        f"- Published layout rejected by the memory model or a rule: {len(rejected)}/{n}"
        + (f" ({sum(1 for r in rejected if r.gain is not None and r.gain <= CLOSE)} of them within {CLOSE:.0%} of our #1 "
           "by time alone)." if rejected else "."),
        f"- Published layout outside the search space: {len(outside)}/{n}"
        + (" (" + ", ".join(f"{axis} {k}" for axis, k in Counter(a for r in outside for a, _ in r.outside).most_common()) + ")."
           if outside else "."),
        f"- Predicted gain of our #1 over the published layout: median {statistics.median(gains):+.1%}, "
        f"max {max(gains):+.1%}, min {min(gains):+.1%} ({len(gains)} rows with a time estimate).",
        f"- Searches not proven optimal within {limit_s:.0f} s: {len(slow)}"
        + (" (" + ", ".join(r.run.id for r in slow) + ")." if slow else "."),
        f"- Published layouts inside the space that beat a proven #1 by more than the tie resolution "
        f"({TIE_RESOLUTION:.1%}; a search miss): {len(misses)}"
        + (" (" + ", ".join(misses) + ")." if misses else "."),
        f"- Time: {wall_s:.0f} s for {n} rows (search {sum(r.result.seconds for r in rows):.0f} s, "
        f"slowest {max(r.result.seconds for r in rows):.1f} s)." if searched is None else
        f"- Time: {wall_s:.0f} s for the {searched} rows whose options narrow the search; the other {n - searched} "
        "are the unconstrained rows below.",
    ]
    return "\n".join(lines)


# How each term of the step breakdown depends on the layout in cost_models.step_time: the mechanism
# behind a group, said once (the numbers after it are the rows'), with the function that prices it,
# the source that function follows and, where one was published, a measurement of the mechanism's size.
MECHANISM = {
    "compute/recompute": "Recompute re-runs forward work in the backward pass (step_time.layer_pass: "
                         "flops.recomputed_share of the forward's kernels: all of them under full recompute, core "
                         "attention under Megatron's selective, Korthikanti et al. 2022 §5, every other matmul under "
                         "torchtitan's per-op policy); measured, a full "
                         "recompute adds 39% to a 22B layer's time and selective with sequence parallelism 4% "
                         "(Korthikanti et al. 2022 Table 4). The published layout recomputes more, and by the memory "
                         "model our #1 keeps those activations and still fits. ",
    "tp": "Exposed tp collectives grow with tp (step_time.tp_exposure: Megatron's f/g all-reduces, Shoeybi et al. "
          "2019, or with sequence parallelism an all-gather and a reduce-scatter per block, Korthikanti et al. 2022 "
          "§4.2.2; the forward's exposed, in backward the column input's gather and its gradient's reduce-scatter "
          "beside the dgrad and wgrad GEMMs under Transformer Engine, exposed in torchtitan's DTensor plan); measured, 7B on 4 H200 ran at 53.8% MFU with FSDP against 34.7% "
          "at tp 4 (KempnerForge benchmarks/mfu_scaling/mfu_scaling.md:66). Our #1 uses a narrower tp. ",
    "bubble": "The pipeline bubble is (Σ stage times − the slowest)/vpp per step (step_time StepTime.bubble_s), the "
              "textbook (p−1)/(v·m) of the stage time (Narayanan et al. 2021 §2.2; measured in their Figure 11, "
              "per-GPU throughput rising with the batch at a fixed pipeline): few micro-batches per pipeline make it "
              "a large share. ",
    "dp": "ZeRO-3/FSDP gathers each layer's parameters and reduce-scatters its gradients in every pass, and only the "
          "part that outlasts the neighbouring layer's compute is exposed (step_time.fsdp_layer_comm, after torch "
          "FSDP's and DeepSpeed's prefetch); each GPU moves its tp shard, so a wider tp moves fewer bytes per GPU for "
          "the same compute. DDP and ZeRO-1/2 reduce the gradients once per step, bucket by bucket beside the last "
          "micro-batch's backward, what does not fit exposed (step_time.dp_tail). Measured: ZeRO-3 without model parallelism ran GPT-3 175B on 1536 A100 at 44 "
          "teraFLOP/s per GPU against 141 for tp 8 × pp 12 (Narayanan et al. 2021 Table 2). ",
    "compute/contention": "Communication that hides behind compute still holds the SMs its NCCL kernels run on "
                          "(step_time._share: comm.nccl_sm_share, NCCL's channel count from v2.30.7-1 "
                          "src/graph/search.cc over the GPU's SMs, times the calibration's contention scale); the "
                          "layouts overlap different amounts of it. ",
    "compute/sharding": "FSDP2 copies each gathered layer out of its flat buffer and each gradient into the "
                        "reduce-scatter input, every micro-batch (step_time.fsdp_copy_seconds, after torch "
                        "_fully_shard/_fsdp_collectives.py foreach_all_gather_copy_out and foreach_reduce, at the "
                        "measured HBM stream rate). ",
    "compute/gemm": "GEMM time depends on the matmul shapes the layout gives each GPU (compute.gemm_seconds via "
                    "kernels.gemm_seconds: the tensor-core ceiling anchored on the published GEMM timings of "
                    "presets/gpus.toml, tile and wave quantisation after NVIDIA's Matrix Multiplication Background "
                    "guide §3.1-3.2, and the epilogue): a larger micro-batch or a narrower tp gives larger, more "
                    "efficient GEMMs; measured, the best micro-batch for 91B at (t,p) = (8,8) is 2 (Narayanan et "
                    "al. 2021 §5.5, Figure 16). ",
    "compute/elementwise": "Memory-bound kernels (compute.elementwise_seconds: norms, residual adds, rotary, the "
                           "MLP activation per layer pass) are priced as bytes over the measured fraction of HBM "
                           "bandwidth plus a start-up time per launch (kernels.memory_seconds, "
                           "presets/kernels/<arch>.toml); the layouts differ in bytes per GPU (sequence parallelism "
                           "splits the residual stream over tp) and in launches per step (micro-batches). ",
    "optimizer": "The optimizer step reads and writes each parameter's states once (compute.optimizer_time: bytes "
                 "per parameter over HBM bandwidth, kernels.memory_seconds) on the parameters a rank updates; ZeRO-1 "
                 "divides that work over dp (Narayanan et al. 2021 §6 on sharded data parallelism: it \"divides the "
                 "optimizer's computation and memory cost across the data-parallel partitions\"). ",
    "compute/attention": "Flash-attention kernels (compute.attention_kernels: one causal kernel, or with cp a causal "
                         "step and cp − 1 unmasked half blocks merged by log-sum-exp, after TransformerEngine@40c69e75 "
                         "context_parallel.py AttnFuncWithCPAndKVP2P; priced from the attention curves of "
                         "presets/kernels/<arch>.toml) depend on the cp split: a wider cp runs more, smaller blocks "
                         "and more merges. ",
}


def causes(rows: list[Row], found: dict[str, Evidence] | None = None, said: dict[str, tuple[Statement, ...]] | None = None) -> str:
    """The rows outside the top 5 and more than 3% behind our #1, grouped by the term of the step
    breakdown our #1 saves most on (rejected layouts within 3% by time form their own group); with
    `found` (find_evidence), what published runs measured of our #1's choice, per group."""
    groups: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        if r.good or r.published_time is None or not r.result.plans:
            continue
        if isinstance(r.published, Rejected) and (r.gain or 0.0) <= CLOSE:
            groups["rejected"].append(r)
            continue
        saved = min(deltas(r.best.time, r.published_time), key=lambda kv: kv[1], default=("none", 0.0))
        groups[saved[0]].append(r)
    out = []
    for term, members in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        sources = ", ".join(f"{g} {k}" for g, k in Counter(r.run.group for r in members).items())
        ids = f" ({', '.join(r.run.id for r in members)})" if len(members) <= 12 else ""
        if term == "rejected":
            text = (f"**Rejected by the memory model, yet within {CLOSE:.0%} by time: {len(members)} rows ({sources}).** "
                    + "; ".join(f"{r.run.id} {r.published.reason}" for r in members) + ".")
        else:
            shares = [-dict(deltas(r.best.time, r.published_time))[term] / r.published_time.step_s for r in members]
            gains = [r.gain for r in members if r.gain is not None]
            moves: dict[str, Counter] = defaultdict(Counter)
            for r in members:
                for c in changes(r.best.job, r.published_time.job):
                    axis, _, move = c.partition(" ")
                    moves[axis][move] += 1
            top = sorted(moves.items(), key=lambda kv: -sum(kv[1].values()))[:4]
            axes = "; ".join(f"{axis} in {sum(m.values())} ({', '.join(f'{k} ×{v}' for k, v in m.most_common(3))})" for axis, m in top)
            usable = [r.best.memory.peak_bytes / r.best.memory.usable_bytes for r in members]
            text = (f"**Our #1 saves most on {term}: {len(members)} rows ({sources}){ids}.** {MECHANISM.get(term, '')}"
                    f"What our #1 saves on it is "
                    f"{statistics.median(shares):.0%} of the published step (median; {min(shares):.0%} to "
                    f"{max(shares):.0%}); gain of #1 median {statistics.median(gains):+.0%}. Axes our #1 changes: {axes}. "
                    f"Our #1 uses a median {statistics.median(usable):.0%} of the usable memory.")
            if term == "bubble":
                m = Counter(f"pp {r.published_time.job.layout.pp} with {r.published_time.job.num_microbatches}" for r in members)
                text += " Published pipelines and their micro-batches per step: " + ", ".join(f"{k} (×{v})" for k, v in m.items()) + "."
            rejected = [r for r in members if isinstance(r.published, Rejected)]
            if rejected:
                text += f" The memory model also rejects {len(rejected)} of these published layouts."
            ev = [found[r.run.id] for r in members if found and r.run.id in found]
            if ev:
                text += f" Published runs that measured our #1's choice: {evidence_counts(ev)}."
            if said is not None:
                text += (f" The source's own statement on an axis our #1 changes: "
                         f"{sum(1 for r in members if said.get(r.run.id))} of {len(members)}.")
        notes = Counter(a for r in members for a in r.run.assumptions
                        if "not modelled" in a or "modelled as" in a or (term == "compute/recompute" and "recompute" in a))
        if notes:
            text += (" Where benchmarks/published.py had to assume: "
                     + "; ".join(f"“{a}” ({k} row{'s' if k > 1 else ''})" for a, k in sorted(notes.items(), key=lambda kv: -kv[1])) + ".")
        out.append("- " + text)
    return "\n".join(out) if out else f"Every row is in our top {TOP} or within {CLOSE:.0%} of our #1."


def short_allowed(allowed: dict[str, frozenset]) -> str:
    """sp off · recompute none/full · zero 0 · cp 1: the narrowed axes of a Judging."""
    def show(v: object) -> str:
        if v is None:
            return "all"
        if isinstance(v, bool):
            return "on" if v else "off"
        return str(getattr(v, "value", v))

    return " · ".join(f"{axis} {'/'.join(sorted(map(show, vs)))}" for axis, vs in allowed.items()) or "all open"


def excluded(runs: list[PublishedRun], judging: dict[str, Judging]) -> str:
    """The rows left out of the judged count, by group and reason."""
    by: dict[tuple[str, str, str, str], list[str]] = defaultdict(list)
    for run in runs:
        j = judging[run.id]
        if j.role is not Role.CHOSEN:
            by[(run.group, j.role, re.sub(r" \(best of .*\)$", "", j.why), j.source)].append(run.id)
    total = Counter(r.group for r in runs)
    lines = []
    for (group, role, why, source), ids in by.items():
        lines.append(f"- **{group}**, {len(ids)} of {total[group]} rows, {role}: {why} ({source}). Rows: {', '.join(ids)}.")
    return "\n".join(lines) if lines else "None."


def options_table(options: dict[str, dict[str, Any]], runs: list[PublishedRun], judging: dict[str, Judging]) -> str:
    """Per group, the software version and the axes its options narrow, each with its evidence."""
    chosen = Counter(r.group for r in runs if judging[r.id].role is Role.CHOSEN)
    lines = ["| group | chosen rows | software | search narrowed to | evidence |", "|---|---:|---|---|---|"]
    for group in dict.fromkeys(r.group for r in runs):
        entry = options[group]
        for opt in entry.get("options") or []:
            ids = [r.id for r in runs if r.group == group and judging[r.id].role is Role.CHOSEN]
            n = sum(1 for i in ids if next(o for o in entry["options"] if re.search(o["match"], i)) is opt)
            allowed = opt.get("allowed") or {}
            evidence = "; ".join(f"{axis}: {why}" for axis, why in (opt.get("why") or {}).items()) or "—"
            rows_of = "" if opt["match"] == "." else f" (ids matching `{opt['match']}`)"
            lines.append(f"| {group}{rows_of} | {n} | {opt['software']} | "
                         f"{short_allowed(parse_allowed(allowed))} | {evidence} ({opt['source']}) |")
        if not entry.get("options"):
            lines.append(f"| {group} | {chosen[group]} | — | all open | {entry['options_open']} |")
    return "\n".join(lines)


def judged_table(rows: list[Row], judging: dict[str, Judging]) -> str:
    lines = table(rows).splitlines()
    lines[0] = lines[0].replace("| framework |", "| framework | options |")
    lines[1] = "|---|---:|---|---|---|---|---:|---:|---|"
    for i, r in enumerate(rows, 2):
        cells = lines[i].split(" | ")
        cells.insert(3, short_allowed(judging[r.run.id].allowed))
        lines[i] = " | ".join(cells)
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="also write the section into this markdown file")
    parser.add_argument("--only", default="", help="only the runs whose id contains this")
    parser.add_argument("--time-limit", type=float, default=TIME_LIMIT_S, help="seconds per search")
    args = parser.parse_args()
    if args.write and args.only:
        parser.error("--write needs every run; drop --only")
    started = time.perf_counter()
    runs, _ = load()
    options = load_options()
    judging = judge(runs, options)
    every_run = runs
    runs = [r for r in runs if args.only in r.id]
    if not runs:
        parser.error(f"no run id contains {args.only!r}")
    rows = []
    for i, run in enumerate(runs):
        row = run_row(run, args.time_limit)
        rows.append(row)
        print(f"[{i + 1}] {run.id}: {progress(row)}", file=sys.stderr)
    wall = time.perf_counter() - started
    judged = []
    for row in rows:
        j = judging[row.run.id]
        if j.role is not Role.CHOSEN:
            continue
        if j.allowed:
            row = run_row(row.run, args.time_limit, j.allowed)
            print(f"[judged] {row.run.id} ({short_allowed(j.allowed)}): {progress(row)}", file=sys.stderr)
        judged.append(row)
    judged_wall = time.perf_counter() - started - wall
    found_judged, found = find_evidence(judged, every_run, judging), find_evidence(rows, every_run, judging)
    statements = load_statements()
    said_judged, said = stated(found_judged, statements), stated(found, statements)
    measured_head = "Published runs that measured our #1's choice, per miss:\n\n"
    stated_head = "What the sources themselves say of our #1's choice:\n\n"
    grouped = "Rows outside the top 5 and more than 3% behind our #1, grouped by the term of the step breakdown our #1 saves most on:\n\n"
    n_good, n_judged_good = sum(r.good for r in rows), sum(r.good for r in judged)
    lead = (
        f"**Judged: {n_judged_good}/{len(judged)}** of the layouts the sources chose are in our top {TOP} or within "
        f"{CLOSE:.0%} of our #1 when the search has only the options the source's software had. "
        f"**Unconstrained: {n_good}/{len(rows)}** of all published rows, the search free on every axis.\n\n"
        "Method. Two questions are asked of each published run. (1) Unconstrained: `planner plan` on the same problem "
        "(model, GPUs, sequence length, global batch, framework, precision) with nothing fixed; every row counts. "
        "(2) Judged: only rows whose layout the source chose (its recommended, best or production run, per "
        "benchmarks/data/software_options.yaml, which quotes the source) count; ablation arms (a comparison's "
        "baseline) and sweep points (one knob varied at a fixed setting) are left out, and each chosen row is "
        "searched with the layout options its software had at the version the source ran (Problem.allowed; an "
        "option counts as absent only where the framework's source at a commit of that date shows it missing, "
        "otherwise the axis stays open). Rows that differ only in something that is not a layout axis "
        "(torch.compile, Float8, async TP, precision) keep their source's chosen layout and count.\n\n"
    )
    by_group = "| group | judged | unconstrained |\n|---|---:|---:|\n" + "\n".join(
        f"| {g} | {sum(r.good for r in judged if r.run.group == g)}/{sum(1 for r in judged if r.run.group == g)} | "
        f"{sum(r.good for r in rows if r.run.group == g)}/{sum(1 for r in rows if r.run.group == g)} |"
        for g in dict.fromkeys(r.run.group for r in rows))
    text = "\n\n".join([
        lead.rstrip(),
        "In our top 5 or within 3% of our #1, per source group:\n\n" + by_group,
        "### Rows left out of the judged count\n\n" + excluded(runs, judging),
        "### Options each source's software had\n\n" + options_table(options, runs, judging),
        "### Judged: chosen rows, searched with their software's options\n\n" + judged_table(judged, judging),
        summary(judged, judged_wall, args.time_limit, searched=sum(1 for r in judged if judging[r.run.id].allowed)),
        grouped + causes(judged, found_judged, said_judged),
        measured_head + evidence_report(found_judged, judged, said=said_judged),
        stated_head + statements_report(found_judged, said_judged),
        "### Unconstrained: every row, nothing fixed\n\n" + table(rows),
        summary(rows, wall, args.time_limit),
        grouped + causes(rows, found, said),
        measured_head + evidence_report(found, rows, said=said),
        stated_head + statements_report(found, said),
    ])
    print(text)
    if args.write:
        intro = (
            "Produced by `python benchmarks/plan_quality.py --write docs/accuracy.md`. For each published run\n"
            "above, `planner plan` is run on the same problem (headroom "
            f"{DEFAULT_HEADROOM:.0%}; search limit {args.time_limit:.0f} s per run), and the\n"
            "published layout is scored exactly as `planner estimate` scores it. Rank = 1 + our listed layouts\n"
            f"with a strictly smaller predicted step (\"> {TOP}\": slower than our #{TOP}); gain of #1 = published step /\n"
            "our #1 step − 1. Where the published layout is neither in the top 5 nor within 3%, the note names the\n"
            "axes our #1 changes and the two terms of the step breakdown that differ most (our #1 minus published),\n"
            "and the published runs (any source, any role) that measured our #1's choice on the same model, GPU,\n"
            "sequence and precision say whether measurement agrees.\n\n"
        )
        write(args.write, text, intro)
    return 0


def progress(row: Row) -> str:
    rank = "rejected" if isinstance(row.published, Rejected) else row.rank or f"> {TOP}"
    gain = f"{row.gain:+.1%}" if row.gain is not None else "—"
    return f"rank {rank}, gain {gain}, search {row.result.seconds:.1f} s"


def write(path: Path, text: str, intro: str) -> None:
    """Replace the section, or insert it before the throughput notes (at the end if there are none)."""
    old = path.read_text()
    if SECTION not in old and BEFORE in old:
        head, _, rest = old.partition(BEFORE)
        path.write_text(f"{head}{SECTION}\n\n{intro}{text}\n\n{BEFORE}{rest}")
    else:
        write_section(path, text, SECTION, intro)


if __name__ == "__main__":
    sys.exit(main())
