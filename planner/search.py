"""Layout search: OR-Tools CP-SAT over the space of planner.space, with exact re-scoring.

The exact cost model (cost_models.memory / step_time) is too rich to state as integer constraints
(per-stage maxima, prefetch overlap, bucketed tails), so CP-SAT works on a bound of it:

    step ≥ LB = m·M + (Σ_r S_r − M)/vpp,   M = max_r S_r,
    S_r = Σ over rank r's layers of one layer pass (compute + exposed tp/cp/ep), + head and loss on the last rank
    peak ≥ CUDA context + model states of rank 0 + min(pp, m) micro-batches of its first chunk's activations

Each S_r drops only non-negative terms of the exact stage time T_r, and the exact step is
m·T_max + (Σ T_r − T_max)/vpp + dp tail + optimizer, which is increasing in T_max, so LB never
exceeds it (likewise for memory). The layer-pass and activation numbers are the exact model's own,
tabulated per Shard and recompute mode; CP-SAT links them to the degrees with element constraints
and products, and states the divisibility rules (tp·cp·pp·dp = gpus, mbs·dp·m = global batch).

Search: minimise LB, then enumerate every layout whose LB lies in a band, score each exactly, and
widen the band to the k-th best exact step time. When no layout is left below that, no unseen
layout can enter the top k (its LB, hence its step, is larger): the top k is proven.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from cost_models.calibration import DEFAULT, Calibration
from cost_models.compute import head_time, loss_time
from cost_models.enums import Recompute
from cost_models.errors import SpecError
from cost_models.flops import GEMM_BACKWARD_FACTOR
from cost_models.job import Job
from cost_models.layout import Layout
from cost_models.memory import CUDA_CONTEXT_BYTES, DEFAULT_HEADROOM, MemoryEstimate, layer_costs, memory_estimate
from cost_models.rules import fill_defaults, resolve
from cost_models.states import embedding_params_local, local_layer_params, state_parts
from cost_models.step_time import TimeEstimate, layer_pass, time_estimate
from planner.space import (
    Problem, Shard, Sharding, Stages, degrees_ok, layout_key, layout_of, shardings, shards, sharding_ok, stages,
)

NS = 1e9  # the integer time unit of the CP-SAT model: nanoseconds
MODES = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)


@dataclass(frozen=True)
class Plan:
    job: Job
    memory: MemoryEstimate
    time: TimeEstimate

    @property
    def key(self) -> tuple:
        return (self.time.step_s, self.memory.peak_bytes, layout_key(self.job.layout))


@dataclass(frozen=True)
class Rejected:
    layout: Layout
    reason: str


@dataclass
class SearchResult:
    plans: list[Plan]
    seconds: float
    candidates: int  # layouts scored with the exact model
    optimal: bool  # the top k is proven
    solver: str
    rejected: list[Rejected] = field(default_factory=list)  # scored layouts that broke a rule or did not fit
    lower_bound_s: float | None = None  # the smallest LB over the space (None: no layout passes the bounds)


def evaluate(problem: Problem, layout: Layout, *, headroom: float = DEFAULT_HEADROOM, calibration: Calibration = DEFAULT) -> Plan | Rejected:
    """The exact model on one layout, as `planner estimate` runs it."""
    try:
        job = resolve(problem.model, problem.cluster, problem.training, layout)
    except SpecError as e:
        return Rejected(layout, str(e).removeprefix("layout: "))
    mem = memory_estimate(job, headroom=headroom)
    if not mem.fits:
        gib = 1024**3
        return Rejected(layout, f"needs {mem.peak_bytes / gib:.1f} GiB > {mem.usable_bytes / gib:.1f} GiB usable")
    return Plan(job=job, memory=mem, time=time_estimate(job, calibration=calibration))


# --- tables of the bound --------------------------------------------------------------------------


@dataclass(frozen=True)
class ShardTable:
    pass_ns: tuple[int, int, int]  # one layer pass (fwd + bwd + recompute, exposed comm) per mode
    head_ns: int  # output layer forward + backward and the loss, on the last rank
    kept_bytes: tuple[int, int, int]  # activations one layer keeps per micro-batch, per mode
    layer_params: int  # parameters of one decoder layer on one GPU
    embedding_params: int


def shard_table(problem: Problem, shard: Shard, cal: Calibration) -> ShardTable:
    passes, kept = [], []
    for mode in MODES:
        lay = Layout(tp=shard.tp, sp=shard.sp, cp=shard.cp, ep=shard.ep, etp=shard.etp, mbs=shard.mbs, recompute=mode)
        job = fill_defaults(problem.model, problem.cluster, problem.training, lay)
        kinds = {job.model.is_moe_layer(i) for i in range(job.model.num_layers)}
        lp = [layer_pass(job, moe=moe, mode=mode, cal=cal) for moe in kinds]
        passes.append(int(min(p.compute.total + p.comm.total for p in lp) * NS))
        kept.append(min(c.kept_bytes for (_, m), c in layer_costs(job).items() if m is mode))
        if mode is Recompute.NONE:
            head = int(((1 + GEMM_BACKWARD_FACTOR) * head_time(job, cal) + loss_time(job, cal)) * NS)
            params = min(local_layer_params(job, i).total for i in range(job.model.num_layers))
            emb = embedding_params_local(job)
    return ShardTable(tuple(passes), head, tuple(kept), params, emb)  # type: ignore[arg-type]


@dataclass(frozen=True)
class StagesTable:
    """Layer counts that the bound multiplies by a Shard's per-layer numbers."""

    mode: int  # index into MODES of the recomputed layers
    weights: tuple[int, int, int]  # how many ranks are first, middle, last (pp = 1: the only rank is "last")
    recomputed: tuple[int, int, int]  # recomputed layers on a first, middle, last rank
    plain: tuple[int, int, int]  # layers without recompute on each
    chunk0: tuple[int, int]  # (recomputed, plain) layers in rank 0's first chunk
    first_layers: int  # decoder layers on rank 0


def stages_table(problem: Problem, st: Stages) -> StagesTable:
    counts = st.counts(problem.model.num_layers)
    pp = st.pp
    kinds = [counts[0], counts[pp // 2] if pp > 2 else 0, counts[-1]]
    if pp == 1:
        kinds = [0, 0, counts[0]]
    weights = (0, 0, 1) if pp == 1 else (1, max(0, pp - 2), 1)
    rec = tuple(st.recomputed(c) for c in kinds)
    chunk = counts[0] // st.vpp
    chunk_rec = 0 if st.recompute is Recompute.NONE else min(st.recompute_layers or chunk, chunk)
    return StagesTable(
        mode=MODES.index(st.recompute), weights=weights, recomputed=rec,  # type: ignore[arg-type]
        plain=tuple(c - r for c, r in zip(kinds, rec)),  # type: ignore[arg-type]
        chunk0=(chunk_rec, chunk - chunk_rec), first_layers=counts[0],
    )


def state_coefficients(problem: Problem, sh: Sharding) -> tuple[int, int]:
    """(replicated, sharded) bytes per parameter under a Sharding."""
    tr = problem.training
    parts = state_parts(tr.framework, tr.precision, tr.optimizer, sh.zero).values()
    return sum(n for n, s in parts if not s), sum(n for n, s in parts if s)


# --- the CP-SAT model ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    """A Shard with a Stages whose degrees divide the GPUs and the batch, and its bounds."""

    shard: int
    stages: int
    dp: int
    microbatches: int
    lb_ns: int  # the step-time bound
    params0: int  # parameters on a GPU of pipeline rank 0
    activations0: int  # activation bytes rank 0 holds at its peak, at least


def cell_bound(problem: Problem, sh: ShardTable, pt: StagesTable, pp: int, vpp: int, m: int) -> tuple[int, int, int]:
    """(step-time bound in ns, rank-0 parameters, rank-0 activation bytes) of one cell."""
    per_rank = [pt.recomputed[i] * sh.pass_ns[pt.mode] + pt.plain[i] * sh.pass_ns[0] for i in range(3)]
    per_rank[2] += sh.head_ns
    top = max(per_rank)
    total = pt.weights[0] * per_rank[0] + pt.weights[1] * per_rank[1] + per_rank[2]
    lb = m * top + (total - top) // vpp
    chunk0 = pt.chunk0[0] * sh.kept_bytes[pt.mode] + pt.chunk0[1] * sh.kept_bytes[0]
    return lb, sh.embedding_params + pt.first_layers * sh.layer_params, min(pp, m) * chunk0


class Model:
    """CP-SAT model of the layout space with the step-time and memory bounds."""

    def __init__(self, problem: Problem, *, headroom: float, cal: Calibration) -> None:
        from ortools.sat.python import cp_model

        self.problem = problem
        self.shards = list(shards(problem))
        self.stages = list(stages(problem))
        self.shardings = shardings(problem)
        n, gbs = problem.gpus, problem.global_batch
        tables = {}
        self.cells: list[Cell] = []
        pts = [stages_table(problem, p) for p in self.stages]
        for si, shard in enumerate(self.shards):
            for pi, st in enumerate(self.stages):
                dp = degrees_ok(problem, shard, st)
                if dp is None:
                    continue
                if si not in tables:
                    tables[si] = shard_table(problem, shard, cal)
                mb = gbs // (shard.mbs * dp)
                lb, params0, acts0 = cell_bound(problem, tables[si], pts[pi], st.pp, st.vpp, mb)
                self.cells.append(Cell(si, pi, dp, mb, lb, params0, acts0))
        self.coef = [state_coefficients(problem, z) for z in self.shardings]
        usable = int(problem.cluster.gpu.hbm_bytes * (1 - headroom))

        m = self.m = cp_model.CpModel()
        C, Z = len(self.cells), len(self.shardings)
        self.c = m.new_int_var(0, max(C - 1, 0), "cell")
        self.z = m.new_int_var(0, max(Z - 1, 0), "sharding")
        if not (C and Z):
            m.add_bool_or([])  # no legal degrees: infeasible
            self.lb = m.new_int_var(0, 0, "lb")
            return

        def element(index, values: list[int], name: str):
            v = m.new_int_var(min(values), max(values), name)
            m.add_element(index, values, v)
            return v

        def product(a, b, hi: int, name: str, lo: int = 0):
            v = m.new_int_var(lo, max(lo, hi), name)
            m.add_multiplication_equality(v, [a, b])
            return v

        cells = self.cells
        # degrees: tp·cp·pp·dp = gpus and mbs·dp·m = global batch hold in every cell by construction;
        # the model keeps dp, m and pp to relate shardings and the memory bound to them
        self.dp = element(self.c, [c.dp for c in cells], "dp")
        self.mb = element(self.c, [c.microbatches for c in cells], "microbatches")
        # shardings: the framework's limits per pipeline depth; HSDP groups divide dp and stay below it
        pairs = [(ci, zi) for ci, c in enumerate(cells) for zi, z in enumerate(self.shardings)
                 if sharding_ok(problem, self.stages[c.stages], z, c.dp)]
        m.add_allowed_assignments([self.c, self.z], pairs)
        shard_size = element(self.z, [z.dp_shard or 0 for z in self.shardings], "hsdp_group")
        full = m.new_bool_var("shard_over_dp")
        m.add(shard_size == 0).only_enforce_if(full)
        m.add(shard_size >= 1).only_enforce_if(~full)
        group = m.new_int_var(1, n, "dp_shard")
        m.add(group == self.dp).only_enforce_if(full)
        m.add(group == shard_size).only_enforce_if(~full)

        # the step-time bound: tabulated per cell
        self.lb = element(self.c, [c.lb_ns for c in cells], "lb")

        # the memory bound (rank 0): states of its parameters under the sharding, plus activations
        max_params = max(c.params0 for c in cells)
        params0 = element(self.c, [c.params0 for c in cells], "params0")
        acts0 = element(self.c, [c.activations0 for c in cells], "activations0")
        cp = element(self.c, [self.shards[c.shard].cp for c in cells], "cp")
        rep = element(self.z, [k[0] for k in self.coef], "replicated_bytes")
        shd = element(self.z, [k[1] for k in self.coef], "sharded_bytes")
        states_rep = product(params0, rep, 32 * max_params, "states_replicated")
        sharded_total = product(params0, shd, 32 * max_params, "states_sharded_total")
        shard_ranks = product(group, cp, n, "shard_ranks", lo=1)
        states_shd = m.new_int_var(0, 32 * max_params, "states_sharded")
        m.add_division_equality(states_shd, sharded_total, shard_ranks)
        m.add(CUDA_CONTEXT_BYTES + states_rep + states_shd + acts0 <= usable)

    def decode(self, solver) -> tuple[Shard, Stages, Sharding, int]:
        c = self.cells[solver.value(self.c)]
        return self.shards[c.shard], self.stages[c.stages], self.shardings[solver.value(self.z)], c.dp


def _solver(seconds: float, workers: int = 1):
    from ortools.sat.python import cp_model

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.05, seconds)
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = 0
    return solver


def _enumerate(model: Model, lo: int, hi: int, seconds: float) -> tuple[list[tuple[Shard, Stages, Sharding, int, int]], bool]:
    """Every layout with lo < LB <= hi that passes the memory bound, and whether the enumeration finished."""
    from ortools.sat.python import cp_model

    cells = [i for i, c in enumerate(model.cells) if lo < c.lb_ns <= hi]
    if not cells:
        return [], True

    class Collect(cp_model.CpSolverSolutionCallback):
        def __init__(self) -> None:
            super().__init__()
            self.found: list = []

        def on_solution_callback(self) -> None:
            self.found.append((*model.decode(self), model.cells[self.value(model.c)].lb_ns))

    banded = model.m.clone()
    cell = banded.get_int_var_from_proto_index(model.c.index)
    banded.add_linear_expression_in_domain(cell, cp_model.Domain.from_values(cells))
    solver = _solver(seconds)
    solver.parameters.enumerate_all_solutions = True
    cb = Collect()
    status = solver.solve(banded, cb)
    return cb.found, status in (cp_model.OPTIMAL, cp_model.INFEASIBLE)


def search(
    problem: Problem, *, top: int = 10, headroom: float = DEFAULT_HEADROOM, calibration: Calibration = DEFAULT,
    time_limit_s: float = 30.0,
) -> SearchResult:
    """Top `top` layouts by the exact model: bands of the bound, lowest first, until the k-th best
    exact step time lies below every layout not yet scored."""
    start = time.perf_counter()
    model = Model(problem, headroom=headroom, cal=calibration)
    bounds = sorted(c.lb_ns for c in model.cells)
    plans: list[Plan] = []
    rejected: list[Rejected] = []
    scored = 0
    optimal = False
    lo = -1
    hi = int(bounds[0] * 1.05) + 1 if bounds else -1
    lb0 = None
    while bounds:
        left = time_limit_s - (time.perf_counter() - start)
        if left <= 0:
            break
        found, complete = _enumerate(model, lo, hi, left)
        for shard, st, sh, dp, lb in sorted(found, key=lambda f: f[4]):
            lb0 = lb if lb0 is None else min(lb0, lb)
            scored += 1
            out = evaluate(problem, layout_of(shard, st, sh, dp), headroom=headroom, calibration=calibration)
            (plans if isinstance(out, Plan) else rejected).append(out)  # type: ignore[arg-type]
        if not complete:
            break
        plans.sort(key=lambda p: p.key)
        if len(plans) >= top and plans[top - 1].time.step_s * NS <= hi:
            optimal = True
            break
        above = [b for b in bounds if b > hi]
        if not above:
            optimal = True  # every layout has been scored
            break
        nxt = int(plans[top - 1].time.step_s * NS) if len(plans) >= top else int(above[0] * 1.05) + 1
        lo, hi = hi, max(nxt, above[0])
    plans.sort(key=lambda p: p.key)
    return SearchResult(plans[:top], time.perf_counter() - start, scored, optimal, "cp-sat", rejected,
                        None if lb0 is None else lb0 / NS)


def brute_force(problem: Problem, *, top: int = 10, headroom: float = DEFAULT_HEADROOM, calibration: Calibration = DEFAULT) -> SearchResult:
    """The reference: every layout of the same space, scored exactly."""
    start = time.perf_counter()
    plans: list[Plan] = []
    rejected: list[Rejected] = []
    scored = 0
    shs = shardings(problem)
    for shard in shards(problem):
        for st in stages(problem):
            dp = degrees_ok(problem, shard, st)
            if dp is None:
                continue
            for sh in shs:
                if not sharding_ok(problem, st, sh, dp):
                    continue
                scored += 1
                out = evaluate(problem, layout_of(shard, st, sh, dp), headroom=headroom, calibration=calibration)
                (plans if isinstance(out, Plan) else rejected).append(out)  # type: ignore[arg-type]
    plans.sort(key=lambda p: p.key)
    return SearchResult(plans[:top], time.perf_counter() - start, scored, True, "brute-force", rejected)
