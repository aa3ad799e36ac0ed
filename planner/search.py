"""Layout search: OR-Tools CP-SAT over the space of planner.space, with exact re-scoring.

The exact cost model (cost_models.memory / step_time) is too rich to state as integer constraints
(per-stage maxima, prefetch overlap, bucketed tails), so CP-SAT works on a bound of it, tabulated
from the exact model's own per-layer numbers (Space):

    step ≥ LB = m·M + (Σ_r S_r − M)/vpp + m·F + G,   M = max_r S_r
    S_r = Σ over rank r's layers of one layer pass (compute + exposed tp/cp/ep) of that layer's kind,
          + head and loss on the last rank
    G   = cv · E[max of N normals] · m · min_r C_r, C_r the compute part of S_r (the straggler term)
    F   = the FSDP gathers and reduce-scatters one micro-batch exposes at pp = 1, at least (fsdp_ns)
    peak ≥ CUDA context + NCCL + states of rank 0's dense and expert parameters under the sharding
           + its in-flight micro-batches' activations, each at its lightest chunk's (+ fragmentation)
           + at pp = 1 its buffers (and likewise a second rank's: rank 1, or in a memory split the
           rank of most in-flight layers after rank 0; RankKinds.second)

Each S_r drops only non-negative terms of the exact stage time T_r, and the exact step is
m·T_max + (Σ T_r − T_max)/vpp + dp tail + optimizer + straggler, which is increasing in every T_r
and whose straggler term scales the critical rank's compute (at least the least C_r), so LB never
exceeds it (likewise for memory; tests/test_search.py checks both on every layout of small spaces).

Search: enumerate with CP-SAT every layout whose LB lies in a band (BandModel: the degrees, the
framework's sharding rules, the memory bound with products and a division, the step bound as an
element of the (cell, sharding) table), score each exactly, and widen the band to the k-th best
exact step time. When no layout is left below that, no unseen layout can enter the top k (its LB,
hence its step, is larger): the top k is proven.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cost_models.activations import head_activations, loss_workspace
from cost_models.calibration import DEFAULT, Calibration
from cost_models.compute import head_pass_time
from cost_models.enums import Framework, Recompute, Schedule, Zero
from cost_models.errors import LayoutError, SpecError
from cost_models.job import Job
from cost_models.layout import Layout
from cost_models.memory import (
    CUDA_CONTEXT_BYTES, DEFAULT_HEADROOM, FRAGMENTATION, GATHERED_GRAD_BYTES, GATHERED_WEIGHT_BYTES, NCCL_BYTES_PER_GROUP,
    MemoryEstimate, gathers_whole_stage, inflight_counts, layer_costs, memory_estimate, process_groups, stage_buffers,
)
from cost_models.model_spec import ModelSpec
from cost_models.rules import PROBLEM_RULES, fill_defaults, problem_violations, resolve
from cost_models.states import embedding_params_local, local_layer_params, state_parts
from cost_models.step_time import (
    TimeEstimate,
    chunk_sync_overrun,
    dense_share,
    dp_tail,
    expected_max_normal,
    fsdp_gathers,
    fsdp_layer_comm,
    fsdp_per_microbatch,
    interleaved_grad_sync_chunks,
    layer_passes,
    time_estimate,
)
from planner.space import (
    Problem, Shard, Sharding, Stages, accumulation_ok, degrees_ok, expert_grid_ok, held_per_chunk, layout_key, layout_of,
    schedule_ok, shardings, shards, sharding_ok, stages,
)

NS = 1e9  # the integer time unit of the CP-SAT model: nanoseconds
# Cells per CP-SAT band model: enumerating one model costs about (cells)² (its element tables are
# scanned at every solution; measured on Llama-3.1-8B at 4,096 GPUs: 20 cells 0.05 s, 100 cells
# 0.54 s, 400 cells 6.6 s), so a band is enumerated in models of this many cells.
BAND_CELLS = 64
MODES = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)


@dataclass(frozen=True)
class Plan:
    job: Job
    memory: MemoryEstimate
    time: TimeEstimate

    @property
    def key(self) -> tuple:
        return (self.time.step_s, layout_key(self.job.layout), self.memory.peak_bytes)


# Step times closer than this fraction are ties. The kernel and collective prices the model adds up
# are quoted to two to four significant figures (presets/kernels: memory fractions such as 0.29;
# presets/gpus.toml: 253.7 TFLOP/s), so no difference under 0.1% carries information; 0.1% is the
# floor that ties only predictions equal in all but rounding, not the model's accuracy (docs/accuracy.md).
TIE_RESOLUTION = 1e-3


def axes_in_use(layout: Layout) -> int:
    """Parallel axes a layout uses beyond data parallelism: tp, pp, vpp, cp, ep above 1."""
    return sum(x > 1 for x in (layout.tp, layout.pp, layout.vpp, layout.cp, layout.ep))


def ranked(plans: list[Plan]) -> list[Plan]:
    """Plans by step time, where a step within TIE_RESOLUTION of a group's fastest ties with it; a
    tie goes to more memory slack (lower peak over capacity), then fewer parallel axes."""
    rest = sorted(plans, key=lambda p: p.key)
    # sorted by step first, so each group is the run from its fastest up to the tie's edge; the steps
    # are read once (each read sums a breakdown), not once per group
    steps = [p.time.step_s for p in rest]
    out: list[Plan] = []
    start = 0
    while start < len(rest):
        end = bisect.bisect_right(steps, steps[start] * (1 + TIE_RESOLUTION), lo=start)
        out += sorted(rest[start:end], key=lambda p: (p.memory.peak_bytes / p.memory.capacity_bytes, axes_in_use(p.job.layout), p.key))
        start = end
    return out


def ties(a: Plan, b: Plan) -> bool:
    fast, slow = sorted((a.time.step_s, b.time.step_s))
    return slow <= fast * (1 + TIE_RESOLUTION)


# Layout fields another field derives (dp from the degrees, schedule from vpp, sp and etp from tp,
# dp_shard = dp unless HSDP): two layouts that differ in one chosen field differ in these as well.
DERIVED_FIELDS = frozenset({"dp", "dp_shard", "schedule", "sp", "etp"})


def folded(plans: list[Plan]) -> list[tuple[Plan, dict[str, list[Any]]]]:
    """Ranked plans with equivalents folded: a plan that ties (TIE_RESOLUTION) with a row shown
    before it and differs from that row's layout in one chosen field becomes a value of that row's
    fold, {field: [the row's value, the folded values...]}, instead of a row of its own."""
    rows: list[tuple[Plan, dict[str, list[Any]]]] = []
    for plan in plans:
        mine = {k: v for k, v in plan.job.layout.model_dump().items() if k not in DERIVED_FIELDS}
        for shown, folds in rows:
            theirs = {k: v for k, v in shown.job.layout.model_dump().items() if k not in DERIVED_FIELDS}
            diff = [k for k in mine if mine[k] != theirs[k]]
            if len(diff) == 1 and ties(shown, plan) and (not folds or diff[0] in folds):
                folds.setdefault(diff[0], [theirs[diff[0]]]).append(mine[diff[0]])
                break
        else:
            rows.append((plan, {}))
    return rows


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
    timed_out: bool = False  # stopped by the time limit before the top k was proven


def evaluate(problem: Problem, layout: Layout, *, headroom: float = DEFAULT_HEADROOM, calibration: Calibration = DEFAULT,
             waive: frozenset[str] = frozenset()) -> Plan | Rejected:
    """The exact model on one layout, as `planner estimate` runs it. `waive`: rules not checked,
    the caller having checked them (problem_waiver)."""
    try:
        job = resolve(problem.model, problem.cluster, problem.training, layout, waive)
    except SpecError as e:
        return Rejected(layout, str(e).removeprefix("layout: "))
    from planner.launch.build import launch_refusal

    # Only refusals of the layout: what the launch refuses of the model or the training settings
    # (a precision, a torchtitan version's recipe) holds for every layout and is said by launch.
    refused = launch_refusal(job, problem.launch)
    if isinstance(refused, LayoutError):
        return Rejected(layout, f"launch refuses it: {str(refused).removeprefix('layout: ')}")
    mem = memory_estimate(job, headroom=headroom)
    if not mem.fits:
        gib = 1024**3
        return Rejected(layout, f"needs {mem.required_bytes / gib:.1f} GiB > {mem.usable_bytes / gib:.1f} GiB usable")
    return Plan(job=job, memory=mem, time=time_estimate(job, calibration=calibration))


def problem_waiver(problem: Problem) -> frozenset[str]:
    """The rules every layout of the problem may skip: PROBLEM_RULES read only the model, the
    cluster and the training spec, so where the problem passes them once every layout does (and
    where it breaks one, each layout is checked in full, to be refused as before)."""
    return frozenset() if problem_violations(problem.model, problem.cluster, problem.training) else PROBLEM_RULES


def cp_model():  # type: ignore[no-untyped-def]
    """`ortools.sat.python.cp_model`, imported without pandas when pandas is not loaded yet.

    cp_model imports pandas for its `*_series` helpers and names pd.Index/pd.Series in annotations
    at import time; pandas costs about 0.9 s of a 2-core machine's start-up, which `planner plan`
    cannot afford. The module is imported with two placeholder classes standing in for those
    names, then its `pd` is pointed at a proxy that imports the real pandas on first use."""
    if "ortools.sat.python.cp_model" in sys.modules or "pandas" in sys.modules:
        from ortools.sat.python import cp_model as module

        return module

    class Pandas(types.ModuleType):
        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            import pandas

            return getattr(pandas, name)

    stub = types.ModuleType("pandas")
    stub.Index = type("Index", (), {})  # type: ignore[attr-defined]
    stub.Series = type("Series", (), {})  # type: ignore[attr-defined]
    sys.modules["pandas"] = stub
    try:
        from ortools.sat.python import cp_model as module
    finally:
        del sys.modules["pandas"]
    module.pd = Pandas("pandas")  # type: ignore[attr-defined]
    return module


@functools.cache
def _model_class():  # type: ignore[no-untyped-def]
    cp = cp_model()

    class Model(cp.CpModel):  # type: ignore[name-defined,misc]
        """A CpModel without the camel-case aliases (AddElement, NewIntVar, ...) that ortools'
        constructor wraps every add_/new_/clear_ method in, on every instance (ortools 9.15
        cp_model.py CpModel.__init__ -> _add_pre_pep8_methods): about 0.5 ms a model on the CI machine,
        and a search builds some hundred small models. The planner calls the snake-case names only;
        the model itself is the same."""

        def _add_pre_pep8_methods(self) -> None:
            pass

    return Model


def new_model():  # type: ignore[no-untyped-def]
    """An empty CP-SAT model (cp_model().CpModel without the per-instance camel-case aliases)."""
    return _model_class()()


# --- tables of the bound --------------------------------------------------------------------------


def shape_job(problem: Problem, shard: Shard, sharding: Sharding | None = None, stages: Stages | None = None) -> Job | None:
    """The job of a Shard (with a Sharding, and a pipeline split with its virtual stages; else pp = 1)
    whose per-layer and per-rank costs the bound tables read; None where the HSDP group does not tile dp."""
    pp = stages.pp if stages is not None else 1
    dp = problem.gpus // (shard.tp * shard.cp * pp)
    extra: dict = {}
    if sharding is not None:
        if sharding.dp_shard is not None and (sharding.dp_shard >= dp or dp % sharding.dp_shard):
            return None
        extra.update(zero=sharding.zero, dp_shard=sharding.dp_shard)
    if stages is not None:
        extra.update(pp=stages.pp, vpp=stages.vpp, pp_first_stage_layers=stages.first, pp_last_stage_layers=stages.last,
                     pp_layout=stages.pp_layout, account_for_embedding=stages.embedding, account_for_loss=stages.loss)
    lay = Layout(tp=shard.tp, sp=shard.sp, cp=shard.cp, ep=shard.ep, etp=shard.etp, mbs=shard.mbs, **extra)
    return fill_defaults(problem.model, problem.cluster, problem.training, lay)


@dataclass(frozen=True)
class ShardTable:
    """What one layer costs on one GPU under a Shard, per recompute mode: per layer kind (kind_*),
    and the least or most over kinds where a bound term needs one number for every layer."""

    forward_ns: int  # the forward compute of a layer (the most over kinds: what hides a gather)
    backward_ns: tuple[int, int, int]  # backward compute with recompute (the most over kinds) per mode
    forward_min_ns: int  # ... the least over kinds (what a hidden gather slows at least)
    backward_min_ns: tuple[int, int, int]
    head_ns: int  # output layer forward + backward and the loss, on the last rank
    embedding_params: int
    # per layer kind (in the order of ModelSpec.layer_kinds), what the bound sums over each rank's layers
    kind_pass_ns: tuple[tuple[int, int, int], ...]  # one layer pass (fwd + bwd + recompute, exposed tp/cp/ep) per mode
    kind_compute_ns: tuple[tuple[int, int, int], ...]  # its compute alone (what the straggler term scales) per mode
    kind_kept_bytes: tuple[tuple[int, int, int], ...]  # activations kept per micro-batch per mode
    kind_dense_params: tuple[int, ...]  # non-expert parameters of one layer on one GPU
    kind_expert_params: tuple[int, ...]  # expert parameters of one layer on one GPU


def shard_table(problem: Problem, shard: Shard, cal: Calibration, *, priced: bool = True, memo: dict | None = None,
                unpriced: ShardTable | None = None) -> ShardTable:
    """The Shard's table; without `priced`, only its memory numbers (activations and parameters),
    its times 0. A layer without MoE does no expert-parallel work, so its passes depend on the
    Shard's tp, sp, cp and mbs alone: `memo` keeps them for the Shards that differ in ep or etp.
    `unpriced`: the Shard's table without `priced`, whose memory numbers are taken as they are."""
    job = shape_job(problem, shard)
    assert job is not None
    kinds = problem.model.layer_kinds
    fields = ("embedding_params", "kind_kept_bytes", "kind_dense_params", "kind_expert_params")
    if unpriced is not None:
        memory = {name: getattr(unpriced, name) for name in fields}
    else:
        costs = layer_costs(job, MODES)
        memory = dict(
            embedding_params=embedding_params_local(job),
            kind_kept_bytes=tuple(tuple(costs[kind, m].kept_bytes for m in MODES) for kind in kinds),
            kind_dense_params=tuple(local_layer_params(job, i).dense for i in kinds.values()),
            kind_expert_params=tuple(local_layer_params(job, i).expert for i in kinds.values()),
        )
    if not priced:
        zero3 = ((0, 0, 0),) * len(kinds)
        return ShardTable(0, (0, 0, 0), 0, (0, 0, 0), 0, kind_pass_ns=zero3, kind_compute_ns=zero3, **memory)
    memo = {} if memo is None else memo

    def kind_passes(kind):  # type: ignore[no-untyped-def]
        if kind.moe:
            return layer_passes(job, kind, modes=MODES, cal=cal)
        key = (kind, shard.tp, shard.sp, shard.cp, shard.mbs)
        if key not in memo:
            memo[key] = layer_passes(job, kind, modes=MODES, cal=cal)
        return memo[key]

    per_kind = [kind_passes(kind) for kind in kinds]
    passes = {mode: [p[i] for p in per_kind] for i, mode in enumerate(MODES)}
    head = head_pass_time(job, cal) * NS
    return ShardTable(
        forward_ns=int(-(-max(p.forward_s for p in passes[Recompute.NONE]) * NS // 1)),
        backward_ns=tuple(int(-(-max(p.compute.total - p.forward_s for p in passes[m]) * NS // 1)) for m in MODES),  # type: ignore[arg-type]
        forward_min_ns=int(min(p.forward_s for p in passes[Recompute.NONE]) * NS),
        backward_min_ns=tuple(int(min(p.compute.total - p.forward_s for p in passes[m]) * NS) for m in MODES),  # type: ignore[arg-type]
        head_ns=int(head),
        kind_pass_ns=tuple(tuple(int((passes[m][k].compute.total + passes[m][k].comm.total) * NS) for m in MODES)
                           for k in range(len(kinds))),
        kind_compute_ns=tuple(tuple(int(passes[m][k].compute.total * NS) for m in MODES) for k in range(len(kinds))),
        **memory,
    )


def fsdp_ns(problem: Problem, shard: Shard, sharding: Sharding, table: ShardTable, cal: Calibration) -> tuple[int, Any]:
    """Exposed parameter gathers and gradient reduce-scatters of one micro-batch when FSDP works per
    micro-batch (step_time.fsdp_per_microbatch; the backward gathers only where fsdp_gathers has them)
    at pp = 1, where the only rank runs the layers in model order, and the compute they slow while
    hidden, at least. step_time._fsdp_exposure exposes g_0 + g_{L−1} + r_0
    and hides layer i's gather g_i behind layer i−1's forward f_{i−1}, and g_{j−1} + r_j behind
    layer j's backward b_j; with each (g, r) of the layer's own kind and every compute between the
    least and the most over kinds (f, b under the layer's recompute mode) it exposes at least

        g_0 + g_{L−1} + r_0 + Σ_{i≥1} max(0, g_i − f_max) + Σ_{j≥1} max(0, g_{j−1} + r_j − b_max),

    and charges at least k·min(g_i, f_min) per forward layer and k·min(g_{j−1} + r_j, b_min) per
    backward one as contention, k = s/(1 − s) with s the share of SMs the collective holds (not for
    DeepSpeed, whose prefetch limit hides less: its g(1 − c) + max(0, g·c − f) is at least max(0, g − f)).

    Returns (the fixed part: the first terms and the forward sum; an array [mode, j] of the
    backward terms summed over layers 1..j−1 for j = 0..L, as if those layers ran under that
    recompute mode, so that a split at the first R recomputed layers reads two prefix sums); zeros
    where there is no FSDP."""
    import numpy as np

    n = problem.model.num_layers
    job = shape_job(problem, shard, sharding)
    if job is None or not fsdp_per_microbatch(job) or job.dense_shard_group == 1:
        return (0, np.zeros((len(MODES), n + 1), dtype=np.int64))
    by_kind = {kind: fsdp_layer_comm(job, i) for kind, i in problem.model.layer_kinds.items()}
    g = [by_kind[kind][0] * NS for kind in problem.model.kinds_by_layer]
    r = [by_kind[kind][1] * NS for kind in problem.model.kinds_by_layer]
    fg, bg = fsdp_gathers(job)  # no backward gather where FSDP does not reshard after forward (zero 2)
    s = 0.0 if job.training.framework is Framework.DEEPSPEED else dense_share(job, cal)
    k = s / (1 - s)
    fixed = fg * g[0] + bg * g[-1] + r[0] + sum(max(0.0, fg * x - table.forward_ns) + k * min(fg * x, table.forward_min_ns)
                                                for x in g[1:])
    # layer j's backward term, j = 1..n−1, summed in layer order (cumsum adds one after another, as a loop would)
    x = bg * np.array(g[:-1]) + np.array(r[1:])
    cum = np.zeros((len(MODES), n + 1), dtype=np.int64)
    for mi, (b, bmin) in enumerate(zip(table.backward_ns, table.backward_min_ns)):
        cum[mi, 2:] = np.cumsum(np.maximum(0.0, x - b) + k * np.minimum(x, float(bmin))).astype(np.int64)
    return (int(fixed), cum)


def pp1_head_bytes(problem: Problem, shard: Shard) -> int:
    """The output layer's activations and the loss's working set on the only pipeline rank (at pp = 1
    it is also the last): one micro-batch's, which depend on the Shard alone (head_activations and
    loss_workspace read the layer shapes, the precision and the loss, not the Sharding)."""
    job = shape_job(problem, shard)
    assert job is not None
    return int(head_activations(job).total) + loss_workspace(job)


def pp1_buffers(problem: Problem, shard: Shard, sharding: Sharding, head: int) -> int:
    """Unsharded copies, buckets and caches of the only pipeline rank, its output layer's activations
    and the loss's working set,
    with their share of the allocator's fragmentation: at pp = 1 they depend on the Shard and the
    Sharding alone. `head`: the Shard's pp1_head_bytes, priced once per Shard by the caller."""
    job = shape_job(problem, shard, sharding)
    if job is None:
        return 0
    b = stage_buffers(job, 0)
    dynamic = b.value("unsharded_params") + b.value("unsharded_grads") + head
    return int(b.total) + head + max(0, int(FRAGMENTATION * dynamic) - 1)


@dataclass(frozen=True)
class RankKinds:
    """Each pipeline rank's layers of a Stages by layer kind (the order of ModelSpec.layer_kinds),
    split into those that run under the recompute mode and those that do not, with ranks of equal
    counts merged: what the bound sums each Shard's per-kind numbers over."""

    recomputed: tuple[tuple[int, ...], ...]  # [row][kind] layers under the recompute mode; row 0 is rank 0's
    plain: tuple[tuple[int, ...], ...]  # [row][kind] layers without recompute
    weights: tuple[int, ...]  # how many ranks each row stands for
    last: tuple[bool, ...]  # whether the row is the last rank's (it adds the output layer and loss)
    layers0: tuple[int, ...]  # rank 0's layers per kind
    layers1: tuple[int, ...]  # the second bounded rank's (zeros at pp = 1)
    chunks0: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]  # rank 0's chunks: (recomputed, plain) per kind
    chunks1: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]  # the second bounded rank's (none at pp = 1)
    second: int  # which rank that is: 1, or where every rank's layers are given, the one of most activations


@functools.lru_cache(maxsize=8)
def _kinds_before(model: ModelSpec) -> tuple[tuple[int, ...], ...]:
    """[kind][i]: the model's layers of each kind (ModelSpec.layer_kinds order) among its first i, so
    that a run of layers counts by kind as the difference of two entries."""
    index = {kind: k for k, kind in enumerate(model.layer_kinds)}
    kind_of = [index[kind] for kind in model.kinds_by_layer]
    return tuple(tuple(itertools.accumulate((kind == k for kind in kind_of), initial=0)) for k in range(len(index)))


def rank_kinds(problem: Problem, st: Stages, memo: dict | None = None) -> RankKinds:
    """Job.stage_chunks and Job.recompute_mode for a Stages, counted per layer kind. `memo` (one per
    model) keeps the counts of layer runs, which the Stages of one split under each recompute plan
    ask for again."""
    model = problem.model
    K = len(model.layer_kinds)
    sizes = st.sizes(model.num_layers)
    before = _kinds_before(model)
    memo = {} if memo is None else memo

    def count(a: int, b: int) -> tuple[int, ...]:
        if (a, b) not in memo:
            memo[a, b] = tuple(before[k][b] - before[k][a] for k in range(K))
        return memo[a, b]

    # the first `cut` layers of a chunk run under the recompute mode (Job.recompute_mode)
    if st.recompute is Recompute.NONE:
        cuts = [0] * len(sizes)
    elif st.recompute is Recompute.FULL and st.recompute_layers is not None:
        cuts = [min(st.recompute_layers, size) for size in sizes]
    else:
        cuts = list(sizes)
    starts = list(itertools.accumulate(sizes[:-1], initial=0))
    chunks = [(count(a, a + cut), count(a + cut, a + size)) for a, cut, size in zip(starts, cuts, sizes)]
    # rank r's chunks are the virtual stages v·pp + r
    ranks = [chunks[r::st.pp] for r in range(st.pp)]
    second = 1
    if st.layers is not None:
        # a memory split moves layers towards the later ranks, and its peak with them: bound the rank
        # after rank 0 with the most layers' activations in flight (layers × held_per_chunk), then
        # the most layers (their states); under full recompute, where little is kept, the most layers
        held = held_per_chunk(st.pp, st.vpp) if st.recompute is not Recompute.FULL else [1] * st.pp
        second = max(range(1, st.pp), key=lambda r: (st.layers[r] * held[r], st.layers[r], -r))
    rows: dict[tuple, int] = {}
    sums: list[tuple[tuple[int, ...], tuple[int, ...]]] = []  # each rank's (recomputed, plain) per kind
    for r, own in enumerate(ranks):
        rec = tuple(map(sum, zip(*(c[0] for c in own))))
        plain = tuple(map(sum, zip(*(c[1] for c in own))))
        sums.append((rec, plain))
        key = (rec, plain, r == st.pp - 1)
        rows[key] = rows.get(key, 0) + 1

    def layers(r: int) -> tuple[int, ...]:
        if r >= st.pp:
            return (0,) * K
        rec, plain = sums[r]
        return tuple(x + y for x, y in zip(rec, plain))

    return RankKinds(
        recomputed=tuple(k[0] for k in rows), plain=tuple(k[1] for k in rows), weights=tuple(rows.values()),
        last=tuple(k[2] for k in rows), layers0=layers(0), layers1=layers(second),
        chunks0=tuple(ranks[0]), chunks1=tuple(ranks[second]) if st.pp > 1 else (), second=second,
    )


def state_coefficients(problem: Problem, sh: Sharding) -> tuple[int, int]:
    """(replicated, sharded) bytes per parameter under a Sharding, less the optimizer's fp32 gradient
    copy: it is alive only in the step, when no activation is (cost_models.memory.step_peak), so a
    bound that adds activations leaves it out."""
    tr = problem.training
    parts = state_parts(tr.framework, tr.precision, tr.optimizer, sh.zero, tr.fp8_param_gather, tr.grad_reduce_in_bf16,
                        tr.bf16_params)
    kept = [v for name, v in parts.items() if name != "fp32_gradients"]
    return sum(n for n, s in kept if not s), sum(n for n, s in kept if s)


def extreme_rows(counts, used, *, largest: bool):  # type: ignore[no-untyped-def]
    """Per Stages (counts: (T, U, F) of non-negative counts; used: (T, U)), the used rows that no
    other used row covers (largest: has at least every count; else: at most every count; rank_kinds
    leaves no two used rows equal): (indices (T, U'), which of them are used (T, U')). A sum of the counts with
    non-negative weights is largest (least) over all used rows where it is over these."""
    import numpy as np

    a, b = counts[:, :, None, :], counts[:, None, :, :]  # row u, row v
    covers = (b >= a).all(axis=3) if largest else (b <= a).all(axis=3)  # [t, u, v]: v covers u
    equal = (a == b).all(axis=3)
    beaten = (covers & ~equal & used[:, None, :]).any(axis=2)
    keep = used & ~beaten
    width = max(1, int(keep.sum(axis=1).max()))
    order = np.argsort(~keep, axis=1, kind="stable")[:, :width]
    return order, np.take_along_axis(keep, order, axis=1)


class Space:
    """The bound over every layout of the space, as arrays: cells are the (Shard, Stages) pairs
    whose degrees divide the GPUs and the batch; each cell takes each legal Sharding.

        step ≥ lb[cell, sharding] = m·M + (Σ_r S_r − M)/vpp + m·F,   M = max_r S_r
        peak ≥ mem[cell, sharding] = the larger of rank 0's and the second rank's (RankKinds.second) memory bounds

    (S_r and the memory bound: see the module docstring; F, the FSDP exposure at pp = 1: fsdp_ns.)
    The degrees here are planner.space.degrees_ok and sharding_ok over whole arrays."""

    def __init__(self, problem: Problem, *, cal: Calibration, usable: int | None = None) -> None:
        import numpy as np

        self.problem = problem
        self.cal = cal
        self.shards = list(shards(problem))
        self.stages = list(stages(problem))
        self.shardings = shardings(problem)
        S, T, Z = len(self.shards), len(self.stages), len(self.shardings)
        n, gbs = problem.gpus, problem.global_batch
        i64 = np.int64

        def col(rows, name):
            return np.array([getattr(r, name) for r in rows], dtype=i64)

        sh_tp, sh_cp, sh_mbs = col(self.shards, "tp"), col(self.shards, "cp"), col(self.shards, "mbs")
        st_pp, st_vpp = col(self.stages, "pp"), col(self.stages, "vpp")
        # the degrees of every (shard, stages): dp = gpus / (tp·cp·pp), m = gbs / (mbs·dp)
        model_par = (sh_tp * sh_cp)[:, None] * st_pp[None, :]
        ok = n % model_par == 0
        dp = np.where(ok, n // np.where(ok, model_par, 1), 0)
        if "dp" in problem.fixed:
            ok &= dp == problem.fixed["dp"]
        per_step = sh_mbs[:, None] * np.maximum(dp, 1)
        ok &= gbs % per_step == 0
        ok &= schedule_ok(problem, st_pp[None, :], st_vpp[None, :], gbs // per_step)
        ok &= accumulation_ok(problem, st_pp[None, :], gbs // per_step)
        ok &= expert_grid_ok(problem, sh_tp[:, None], col(self.shards, "ep")[:, None], col(self.shards, "etp")[:, None], st_pp[None, :])
        si, ti = np.nonzero(ok)
        self.cell_shard, self.cell_stages = si, ti
        self.dp = dp[si, ti]
        self.microbatches = gbs // (sh_mbs[si] * self.dp)
        C = len(si)

        # per-shard tables, only for shards that take part in some cell: first what the memory bound
        # reads (activations and parameters), then, for the Shards with a cell under `usable`, the
        # layer passes the step bound reads
        used = sorted(set(si.tolist()))
        self.tables = {s: shard_table(problem, self.shards[s], cal, priced=False) for s in used}
        K = len(problem.model.layer_kinds)
        blank = ShardTable(0, (0, 0, 0), 0, (0, 0, 0), 0, 0, ((0, 0, 0),) * K, ((0, 0, 0),) * K, ((0, 0, 0),) * K,
                           (0,) * K, (0,) * K)

        def tabs() -> list[ShardTable]:
            return [self.tables.get(s, blank) for s in range(S)]

        def per_kind(name: str, width: int):  # type: ignore[no-untyped-def]
            return np.array([getattr(t, name) for t in tabs()], dtype=i64).reshape((S, K, 3) if width == 3 else (S, K))

        eparams = col(tabs(), "embedding_params")
        k_kept = per_kind("kind_kept_bytes", 3)
        k_dense, k_expert = per_kind("kind_dense_params", 1), per_kind("kind_expert_params", 1)
        mode = np.array([MODES.index(p.recompute) for p in self.stages], dtype=i64)  # of the recomputed layers

        # per layer kind: each rank's layers of each kind (rows of equal ranks merged, padded to the
        # most rows of any Stages)
        runs: dict = {}  # rank_kinds' counts of layer runs, shared by the Stages
        rks = [rank_kinds(problem, p, runs) for p in self.stages]
        U = max(len(r.weights) for r in rks)
        # a rank's lightest chunk is the least over its distinct chunks (a rank's chunks mostly repeat
        # one or two layer counts: 63 chunks, 2 distinct, at pp 2 vpp 63), so only those are tabulated
        distinct = [tuple(tuple(dict.fromkeys(chunks)) for chunks in (r.chunks0, r.chunks1)) for r in rks]
        V = max(max(len(c0), len(c1)) for c0, c1 in distinct)
        row_rec = np.zeros((T, U, K), dtype=i64)
        row_plain = np.zeros((T, U, K), dtype=i64)
        row_w = np.zeros((T, U), dtype=i64)
        row_last = np.zeros((T, U), dtype=i64)
        ch_rec = np.zeros((2, T, V, K), dtype=i64)
        ch_plain = np.zeros((2, T, V, K), dtype=i64)
        ch_used = np.zeros((2, T, V), dtype=bool)
        for t, r in enumerate(rks):
            u = len(r.weights)
            row_rec[t, :u], row_plain[t, :u] = r.recomputed, r.plain
            row_w[t, :u], row_last[t, :u] = r.weights, r.last
            for rank, chunks in enumerate(distinct[t]):
                for v, (cr, cpl) in enumerate(chunks):
                    ch_rec[rank, t, v], ch_plain[rank, t, v], ch_used[rank, t, v] = cr, cpl, True
        # rank 0's layers under the recompute mode and without it, over all its chunks: its row is the
        # first of each Stages' rows (rank_kinds adds the ranks in order)
        rec0, plain0 = row_rec[:, 0].sum(axis=1), row_plain[:, 0].sum(axis=1)
        layers0 = np.array([r.layers0 for r in rks], dtype=i64).reshape(T, K)
        layers1 = np.array([r.layers1 for r in rks], dtype=i64).reshape(T, K)
        m = self.microbatches

        # rank 0's dense and expert parameters, summed over its layers by kind
        self.params0 = eparams[si] + (layers0[ti] * k_dense[si]).sum(axis=1)
        self.experts0 = (layers0[ti] * k_expert[si]).sum(axis=1)
        edp = n // (col(self.shards, "etp")[si] * col(self.shards, "ep")[si] * st_pp[ti])
        # rank 0 (and the second bounded rank) holds in-flight micro-batches of each of its chunks
        second = np.array([r.second for r in rks], dtype=i64)

        code = (st_pp[ti] << 40) + (st_vpp[ti] << 32) + m  # (pp, vpp, m) as one key
        keys, where = np.unique(code, return_inverse=True)
        ranks_up = int(st_pp.max()) + 1

        def held(rank):  # type: ignore[no-untyped-def]
            """Σ over its chunks of the in-flight micro-batches of each cell's rank `rank` (an array)."""
            pairs, at = np.unique(where.reshape(-1) * ranks_up + rank, return_inverse=True)  # (pp, vpp, m) and rank
            per_pair = []
            for pair in pairs.tolist():
                k, r = int(keys[pair // ranks_up]), pair % ranks_up
                pp, v, mb = k >> 40, k >> 32 & 0xFF, k & 0xFFFFFFFF
                per_pair.append(sum(inflight_counts(pp, v, mb, r, Schedule.INTERLEAVED if v > 1 else Schedule.ONE_F_ONE_B))
                                if r < pp else 0)
            return np.array(per_pair, dtype=i64)[at.reshape(-1)]

        kept_mode = np.take_along_axis(k_kept[si], mode[ti][:, None, None], axis=2)[:, :, 0]  # (C, K)

        def least_chunk(rank: int):  # type: ignore[no-untyped-def]
            """The activations of a rank's lightest chunk for one micro-batch: Σ_chunks in-flight ×
            chunk ≥ (Σ in-flight) × the lightest."""
            per_chunk = (np.einsum("cvk,ck->cv", ch_rec[rank][ti], kept_mode)
                         + np.einsum("cvk,ck->cv", ch_plain[rank][ti], k_kept[si, :, 0]))
            return np.where(ch_used[rank][ti], per_chunk, np.iinfo(i64).max).min(axis=1, initial=np.iinfo(i64).max)

        self.acts0 = held(np.zeros(C, dtype=i64)) * least_chunk(0)
        shard_col = {name: col(self.shards, name)[si] for name in ("ep", "etp")}
        groups = NCCL_BYTES_PER_GROUP * process_groups(sh_tp[si], st_pp[ti], sh_cp[si], self.dp, shard_col["ep"], shard_col["etp"])
        self.overhead = overhead = CUDA_CONTEXT_BYTES + groups + np.maximum(0, (self.acts0 * FRAGMENTATION).astype(i64) - 1)
        # the second rank (pp > 1; rank 1 but in memory splits): no embedding (nor, if it is the last, the
        # output layer and loss counted), its own layers and in-flight micro-batches
        acts1 = np.where(st_pp[ti] > 1, held(second[ti]) * np.where(st_pp[ti] > 1, least_chunk(1), 0), 0)
        params1 = (layers1[ti] * k_dense[si]).sum(axis=1)
        experts1 = (layers1[ti] * k_expert[si]).sum(axis=1)
        fixed1 = CUDA_CONTEXT_BYTES + groups + np.maximum(0, (acts1 * FRAGMENTATION).astype(i64) - 1) + acts1

        # every (cell, sharding): the framework's rules and the memory bound
        self.coef = [state_coefficients(problem, z) for z in self.shardings]
        self.legal = np.zeros((C, Z), dtype=bool)
        self.mem = np.zeros((C, Z), dtype=i64)
        self.pair_bytes = np.zeros((C, Z), dtype=i64)  # the part of rank 0's memory bound that depends on both
        self.mem1 = np.zeros((C, Z), dtype=i64)  # the second rank's memory bound
        pp_c = st_pp[ti]
        cp_c = sh_cp[si]
        one_stage = pp_c == 1
        pp1 = set(si[one_stage].tolist())
        # the only rank's output layer and loss: per Shard, the same under every Sharding
        heads1 = {s: pp1_head_bytes(problem, self.shards[s]) for s in sorted(pp1)}
        # each cell's Shard degrees as arrays, for the framework's sharding rules
        degrees = types.SimpleNamespace(tp=sh_tp[si], cp=cp_c, ep=shard_col["ep"], etp=shard_col["etp"])
        shard_ranks: dict[int | None, tuple[Any, Any]] = {}  # per HSDP group: the dense and expert states' shard ranks
        for zi, z in enumerate(self.shardings):
            self.legal[:, zi] = sharding_ok(problem, pp_c, z, self.dp, degrees)  # type: ignore[arg-type]
            if z.dp_shard not in shard_ranks:
                group = self.dp if z.dp_shard is None else np.full(C, z.dp_shard, dtype=i64)
                shard_ranks[z.dp_shard] = (group * cp_c, np.maximum(1, edp * group // np.maximum(self.dp, 1)))
            dense_ranks, expert_group = shard_ranks[z.dp_shard]
            rep, shd = self.coef[zi]
            buffers = np.array([pp1_buffers(problem, self.shards[s], z, heads1[s]) if s in pp1 else 0 for s in range(S)], dtype=i64)
            # FSDP2 that keeps a pipeline stage gathered (memory.gathers_whole_stage, torchtitan only): its
            # 16-bit weights and fp32 unsharded gradients beyond the states, per local parameter
            # (memory.stage_buffers). The sharded gradients the first backward leaves out of the states
            # come back as scatter_stream_grads' reserved blocks, since torchtitan's states hold no fp32
            # gradient copy that would make the optimizer step its own peak (states.convention,
            # memory.step_peak; tests/test_search.py holds the bound below every exact peak).
            whole = ~one_stage & gathers_whole_stage(problem.training.framework, z.zero, pipelined=True)

            def gathered(dense, experts):  # type: ignore[no-untyped-def]
                return np.where(whole, (GATHERED_WEIGHT_BYTES + GATHERED_GRAD_BYTES) * (dense + experts), 0)

            self.pair_bytes[:, zi] = (self.experts0 * rep + (self.experts0 * shd) // expert_group
                                      + np.where(one_stage, buffers[si], 0) + gathered(self.params0, self.experts0))
            self.mem[:, zi] = overhead + self.params0 * rep + (self.params0 * shd) // dense_ranks + self.acts0 + self.pair_bytes[:, zi]
            mem1 = np.where(one_stage, 0, fixed1 + (params1 + experts1) * rep + (params1 * shd) // dense_ranks
                            + (experts1 * shd) // expert_group + gathered(params1, experts1))
            self.mem1[:, zi] = mem1
            self.mem[:, zi] = np.maximum(self.mem[:, zi], mem1)

        # the layer passes, of the Shards that have a cell within `usable` (all of them without it);
        # the others' cells keep a step bound of 0, which bounds every step
        fitting = self.legal if usable is None else self.legal & (self.mem <= usable)
        priced = sorted(set(si[fitting.any(axis=1)].tolist()))
        memo: dict = {}
        for s in priced:
            self.tables[s] = shard_table(problem, self.shards[s], cal, memo=memo, unpriced=self.tables[s])
        self.priced = np.isin(si, priced)
        k_pass, k_comp = per_kind("kind_pass_ns", 3), per_kind("kind_compute_ns", 3)
        head = col(tabs(), "head_ns")

        # S_r of a row is Σ_k (recomputed layers · pass under the mode + plain layers · pass without
        # recompute) + the head on the last rank, every term ≥ 0: a row with no fewer layers of each
        # kind (and the head where the other has it) than another has no smaller sum. So the largest
        # S_r is the largest over the rows no other row covers, the least over those that cover no
        # other, and Σ_r S_r is the same sum over the layer counts weighted by ranks.
        assert (k_pass >= 0).all() and (k_comp >= 0).all() and (head >= 0).all()
        counts = np.concatenate([row_rec, row_plain, row_last[:, :, None]], axis=2)  # (T, U, 2K + 1)
        top_rows, top_used = extreme_rows(counts, row_w > 0, largest=True)
        least_rows, least_used = extreme_rows(counts, row_w > 0, largest=False)
        w_rec, w_plain = (row_w[:, :, None] * row_rec).sum(axis=1), (row_w[:, :, None] * row_plain).sum(axis=1)  # (T, K)
        w_last = (row_w * row_last).sum(axis=1)

        def rank_sums(table, rows):  # type: ignore[no-untyped-def]
            """(cell, row): S_r of the rows `rows` (T, U') picks, with a per-kind table under each
            layer's mode, and the head on the last rank."""
            in_mode = np.take_along_axis(table[si], mode[ti][:, None, None], axis=2)[:, :, 0]  # (C, K)
            rec = np.take_along_axis(row_rec, rows[:, :, None], axis=1)[ti]
            plain = np.take_along_axis(row_plain, rows[:, :, None], axis=1)[ti]
            last = np.take_along_axis(row_last, rows, axis=1)[ti]
            return (np.einsum("cuk,ck->cu", rec, in_mode) + np.einsum("cuk,ck->cu", plain, table[si, :, 0])
                    + last * head[si][:, None])

        # the step bound of every cell (cell_bound, vectorised): S_r summed over each rank's layers by kind
        top = np.where(top_used[ti], rank_sums(k_pass, top_rows), 0).max(axis=1)
        in_mode = np.take_along_axis(k_pass[si], mode[ti][:, None, None], axis=2)[:, :, 0]
        total = (w_rec[ti] * in_mode).sum(axis=1) + (w_plain[ti] * k_pass[si, :, 0]).sum(axis=1) + w_last[ti] * head[si]
        self.cell_lb = m * top + (total - top) // st_vpp[ti]
        # the straggler term: gpu_speed_cv · E[max of N normals] of the step's compute, which is at
        # least m times the least compute any rank's layers (and the last rank's head) take
        least = np.where(least_used[ti], rank_sums(k_comp, least_rows), np.iinfo(i64).max).min(axis=1)
        self.cell_lb += np.floor(cal.gpu_speed_cv * expected_max_normal(problem.gpus) * m * least).astype(i64)
        # rank 0's backward compute of one micro-batch, at most: what its gradient traffic can hide behind
        bwd = np.array([t.backward_ns for t in tabs()], dtype=i64).reshape(S, 3)
        self.window0 = (rec0[ti] * bwd[si, mode[ti]] + plain0[ti] * bwd[si, 0]
                        + np.where(st_pp[ti] == 1, head[si], 0))

        # the FSDP term of every (cell, sharding) at pp = 1
        self.lb = np.repeat(self.cell_lb[:, None], Z, axis=1)
        priced_pp1 = set(priced) & pp1
        for zi, z in enumerate(self.shardings):
            if z.zero >= Zero.GRADIENTS:  # fsdp_ns: zeros where FSDP does not work per micro-batch
                L = problem.model.num_layers
                f = [fsdp_ns(problem, self.shards[s], z, self.tables[s], cal) if s in priced_pp1
                     else (0, np.zeros((3, L + 1), dtype=i64)) for s in range(S)]
                fixed = np.array([x[0] for x in f], dtype=i64)
                cum = np.array([x[1] for x in f], dtype=i64).reshape(S, 3, L + 1)
                # the only rank's first R layers run under the recompute mode, the rest without
                R = np.minimum(rec0[ti], L)
                exposed = (fixed[si] + cum[si, mode[ti], R] + cum[si, 0, L] - cum[si, 0, R])
                self.lb[:, zi] += np.where(one_stage, m * exposed, 0)

        self.refined = np.zeros((C, Z), dtype=bool)
        self._tails: dict[tuple, tuple[float, float, Any]] = {}

    def __len__(self) -> int:
        return len(self.cell_shard)

    def refine(self, cells, shardings) -> None:  # type: ignore[no-untyped-def]
        """Add the data-parallel tail to the step bound of these (cell, sharding) pairs, once:

            dp tail ≥ rank 0's exposed traffic = max(its gradient traffic − its backward, its last bucket)

        (step_time.TimeEstimate.dp_tail_s at r = 0), with the backward counted at most (window0);
        under the interleaved schedule's per-chunk reductions, what outlasts rank 0's backward with
        each chunk backward counted at most (window0 / vpp; step_time.StageTime.dp_late_s). The
        traffic depends on neither mbs nor recompute, so it is computed once per parallel shape and
        sharding (step_time.dp_tail on a job of that shape)."""
        p = self.problem
        for c, zi in zip(cells.tolist(), shardings.tolist()):
            if not self.priced[c]:  # no layer passes, so no backward to hide behind: left at its bound
                continue
            shard, st = self.shards[self.cell_shard[c]], self.stages[self.cell_stages[c]]
            dp = int(self.dp[c])
            key = (shard.tp, shard.cp, shard.ep, shard.etp, st.split, zi, dp)
            if key not in self._tails:
                job = shape_job(p, shard, self.shardings[zi], st)
                assert job is not None  # the pair is legal
                self._tails[key] = (*dp_tail(job, 0, self.cal), interleaved_grad_sync_chunks(job, 0))
            comm, bucket, chunks = self._tails[key]
            if chunks is None:
                exposed = max(comm - self.window0[c] / NS, bucket)
            else:
                per_chunk, gather = chunks
                chunk_backward = self.window0[c] / NS / st.vpp
                exposed = gather + sum(chunk_sync_overrun(list(s), last_group=st.pp, rank=0, chunk_backward_s=chunk_backward)
                                       for s in per_chunk)
            self.lb[c, zi] += max(0, int(exposed * NS) - 1)
            self.refined[c, zi] = True

    def layout(self, cell: int, sharding: int) -> Layout:
        return layout_of(self.shards[self.cell_shard[cell]], self.stages[self.cell_stages[cell]],
                         self.shardings[sharding], int(self.dp[cell]))


class BandModel:
    """CP-SAT model of the layouts whose step bound lies in (lo, hi]: the cell and sharding indices,
    the degrees they imply, the framework's sharding rules as allowed pairs, the rank-0 memory bound
    stated with products and a division, and the step bound as an element of the (cell, sharding)
    table."""

    def __init__(self, space: Space, cells: list[int], lo: int, hi: int, usable: int) -> None:
        self.space, self.cells = space, cells
        m = self.m = new_model()
        B, Z, n = len(cells), len(space.shardings), space.problem.gpus
        self.c = m.new_int_var(0, B - 1, "cell")
        self.z = m.new_int_var(0, Z - 1, "sharding")

        def element(index, values: list[int], name: str):
            v = m.new_int_var(min(values), max(values), name)
            m.add_element(index, values, v)
            return v

        def product(a, b, hi: int, name: str, lo: int = 0):
            v = m.new_int_var(lo, max(lo, hi), name)
            m.add_multiplication_equality(v, [a, b])
            return v

        s = space
        dp = element(self.c, [int(s.dp[c]) for c in cells], "dp")
        m.add_allowed_assignments([self.c, self.z], [(b, zi) for b, c in enumerate(cells) for zi in range(Z) if s.legal[c, zi]])
        shard_size = element(self.z, [z.dp_shard or 0 for z in s.shardings], "hsdp_group")
        full = m.new_bool_var("shard_over_dp")
        m.add(shard_size == 0).only_enforce_if(full)
        m.add(shard_size >= 1).only_enforce_if(~full)
        group = m.new_int_var(1, n, "dp_shard")
        m.add(group == dp).only_enforce_if(full)
        m.add(group == shard_size).only_enforce_if(~full)

        # the step bound: lo < lb[cell, sharding] <= hi
        pair = m.new_int_var(0, B * Z - 1, "pair")
        m.add(pair == self.c * Z + self.z)
        self.lb = element(pair, [int(s.lb[c, zi]) for c in cells for zi in range(Z)], "lb")
        m.add(self.lb > lo)
        m.add(self.lb <= hi)

        # the memory bound of rank 0: states of its parameters under the sharding, plus activations
        params = [int(s.params0[c]) for c in cells]
        params0 = element(self.c, params, "params0")
        acts0 = element(self.c, [int(s.acts0[c] + s.overhead[c]) for c in cells], "activations_and_overhead0")
        experts = element(pair, [int(s.pair_bytes[c, zi]) for c in cells for zi in range(Z)], "expert_states_and_buffers0")
        cp = element(self.c, [s.shards[s.cell_shard[c]].cp for c in cells], "cp")
        rep = element(self.z, [k[0] for k in s.coef], "replicated_bytes")
        shd = element(self.z, [k[1] for k in s.coef], "sharded_bytes")
        states_rep = product(params0, rep, 32 * max(params), "states_replicated")
        sharded_total = product(params0, shd, 32 * max(params), "states_sharded_total")
        shard_ranks = product(group, cp, n, "shard_ranks", lo=1)
        states_shd = m.new_int_var(0, 32 * max(params), "states_sharded")
        m.add_division_equality(states_shd, sharded_total, shard_ranks)
        m.add(states_rep + states_shd + experts + acts0 <= usable)
        # and the second rank's, tabulated per (cell, sharding)
        m.add(element(pair, [int(s.mem1[c, zi]) for c in cells for zi in range(Z)], "memory1") <= usable)

    def enumerate(self, seconds: float) -> tuple[list[tuple[int, int, int]], bool]:
        """Every (cell, sharding, bound) of the band that passes the memory bound, and whether the
        enumeration finished."""
        cp = cp_model()
        model = self

        class Collect(cp.CpSolverSolutionCallback):
            def __init__(self) -> None:
                super().__init__()
                self.found: list[tuple[int, int, int]] = []

            def on_solution_callback(self) -> None:
                self.found.append((model.cells[self.value(model.c)], self.value(model.z), self.value(model.lb)))

        solver = _solver(seconds)
        solver.parameters.enumerate_all_solutions = True
        # branch on the two indices only: once they are fixed every other variable is a table
        # lookup or a product of constants, so each (cell, sharding) costs one leaf
        self.m.add_decision_strategy([self.c, self.z], cp.CHOOSE_FIRST, cp.SELECT_MIN_VALUE)
        solver.parameters.search_branching = cp.FIXED_SEARCH
        cb = Collect()
        status = solver.solve(self.m, cb)
        return sorted(cb.found), status in (cp.OPTIMAL, cp.INFEASIBLE)


def _solver(seconds: float, workers: int = 1):
    solver = cp_model().CpSolver()
    solver.parameters.max_time_in_seconds = max(0.05, seconds)
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = 0
    return solver


def search(
    problem: Problem, *, top: int = 10, headroom: float = DEFAULT_HEADROOM, calibration: Calibration = DEFAULT,
    time_limit_s: float = 30.0, progress: Callable[[str], None] | None = None,
) -> SearchResult:
    """Top `top` layouts by the exact model: bands of the bound, lowest first, until the k-th best
    exact step time lies below every layout not yet scored."""
    import numpy as np

    start = time.perf_counter()
    usable = int(problem.cluster.gpu.hbm_bytes * (1 - headroom))
    space = Space(problem, cal=calibration, usable=usable)
    feasible = space.legal & (space.mem <= usable)
    bounds = np.sort(space.lb[feasible])
    waive = problem_waiver(problem)
    plans: list[Plan] = []
    rejected: list[Rejected] = []
    scored = 0
    optimal = complete = timed_out = False
    if not len(bounds):
        optimal = True  # no layout passes the bounds, so none fits: an empty top k is proven
    # the first band holds the `top` smallest bounds: the k-th best step is at least the k-th bound
    lo, hi = -1, (int(bounds[min(top, len(bounds)) - 1]) if len(bounds) else -1)
    while len(bounds):
        # tighten the bound of the band's layouts with their dp tail; those it lifts above hi wait
        fresh = np.nonzero(feasible & ~space.refined & (space.lb > lo) & (space.lb <= hi))
        if len(fresh[0]):
            space.refine(*fresh)
            bounds = np.sort(space.lb[feasible])
        cells = np.nonzero((feasible & (space.lb > lo) & (space.lb <= hi)).any(axis=1))[0].tolist()
        found: list[tuple[int, int, int]] = []
        complete = True
        for at in range(0, len(cells), BAND_CELLS):  # small models: an enumeration's cost grows with its tables
            left = time_limit_s - (time.perf_counter() - start)
            if left <= 0:
                complete = False
                break
            part, done = BandModel(space, cells[at:at + BAND_CELLS], lo, hi, usable).enumerate(left)
            found += part
            if not done:
                complete = False
                break
        for cell, zi, _ in sorted(found, key=lambda f: (f[2], f[0], f[1])):
            if time.perf_counter() - start > time_limit_s:
                complete = False
                break
            scored += 1
            out = evaluate(problem, space.layout(cell, zi), headroom=headroom, calibration=calibration, waive=waive)
            (plans if isinstance(out, Plan) else rejected).append(out)  # type: ignore[arg-type]
        if progress is not None:
            progress(f"{scored} layouts scored, bound ≤ {hi / NS:.3g} s, best {plans and min(p.time.step_s for p in plans) or 0:.3g} s")
        if cells and not complete:
            timed_out = True
            break
        plans.sort(key=lambda p: p.key)
        above = bounds[bounds > hi]
        # proven once no unscored layout's bound reaches the k-th best step (strictly: one whose
        # bound equals it could still tie and win the tie-break), or every layout has been scored
        if not len(above) or (len(plans) >= top and plans[top - 1].time.step_s * NS < above[0]):
            optimal = True
            break
        # next: the next max(k, scored) bounds, so that each band at most doubles the layouts scored,
        # and never past the k-th best step found (a layout whose bound lies above it cannot enter the
        # top k). A band straight to the k-th best step would score every layout below a k-th best
        # that later bands improve on: a layout whose bound is far below its step (a deep pipeline
        # whose stages differ) can set the k-th best high after the first band.
        nxt = int(above[min(max(top, scored), len(above)) - 1])
        if len(plans) >= top:
            nxt = min(nxt, int(plans[top - 1].time.step_s * NS))  # at least above[0]: not proven above
        lo, hi = hi, nxt
    plans = ranked(plans)
    return SearchResult(plans[:top], time.perf_counter() - start, scored, optimal, "cp-sat", rejected,
                        float(bounds[0]) / NS if len(bounds) else None, timed_out)


def brute_force(problem: Problem, *, top: int = 10, headroom: float = DEFAULT_HEADROOM, calibration: Calibration = DEFAULT) -> SearchResult:
    """The reference: every layout of the same space, scored exactly."""
    start = time.perf_counter()
    plans: list[Plan] = []
    rejected: list[Rejected] = []
    scored = 0
    shs = shardings(problem)
    waive = problem_waiver(problem)
    for shard in shards(problem):
        for st in stages(problem):
            dp = degrees_ok(problem, shard, st)
            if dp is None:
                continue
            for sh in shs:
                if not sharding_ok(problem, st.pp, sh, dp, shard):
                    continue
                scored += 1
                out = evaluate(problem, layout_of(shard, st, sh, dp), headroom=headroom, calibration=calibration, waive=waive)
                (plans if isinstance(out, Plan) else rejected).append(out)  # type: ignore[arg-type]
    plans = ranked(plans)
    return SearchResult(plans[:top], time.perf_counter() - start, scored, True, "brute-force", rejected)
