"""The layout space `planner plan` searches: legal values per axis, and the named predicates that
tie axes together. The CP-SAT model (planner.search) and the brute-force reference enumerate the
same space from these generators.

A layout is four choices and one derived degree:
- a Shard: what one layer's work per GPU depends on (tp, sp, cp, ep, etp, mbs);
- a Stages: the pipeline (pp, vpp, the first/last stage sizes, every rank's, or the embedding and loss
  counted as layers) with a recompute plan (Recompute);
- a Sharding: how data-parallel ranks split model states (zero, dp_shard);
- dp = gpus / (tp·cp·pp), and m = global batch / (mbs·dp) micro-batches.
Every candidate is finally checked by cost_models.rules (the frameworks' own rules), so a
generator may be looser than the rules but never stricter than what the search promises.

Bounds of the search, beyond the frameworks' rules:
- cp keeps at least MIN_CP_TOKENS tokens per rank (ring attention below that is all latency);
- mbs divides the global batch and is at most MAX_MBS;
- a pipeline depth takes, per vpp, the even split where the layers divide, the uneven split of
  `_split` (ends no heavier than the middle, counted; what
  --decoder-first/last-pipeline-num-layers are used for), and up to three memory splits of the
  CP-SAT model in `_memory_splits` (every rank's layers, fewer where more micro-batches are in
  flight; --pipeline-model-parallel-layout, where the framework can launch it);
- Megatron also takes the embedding, the loss, or both counted as pipeline layers
  (--account-for-embedding/loss-in-pipeline-split) at every vpp where the units split evenly
  (account_vpps), each virtual stage keeping at least one decoder layer;
- torchtitan also takes the split it generates where none is given (generated_split), whose
  chunks on one rank may differ;
- vpp is at most MAX_VPP, or above it where the layers (or with the account flags, the units)
  split evenly into pp·vpp chunks (the even and the account splits only: NVIDIA's MLPerf GPT-3
  175B runs 96 layers at pp 8 · vpp 12, one layer a chunk, mlcommons training_results_v3.0
  NVIDIA/benchmarks/gpt3/implementations/pytorch/config_common.sh INTERLEAVED_PIPELINE=12);
- HSDP shard groups are powers of two from 8 to 256 data-parallel ranks.

A Problem may pin an axis (`fixed`, what `plan --fix` sets) or narrow it to a set of values
(`allowed`: e.g. sp off and recompute none or full, the options an older framework version had).
One such axis is no field of the layout: grad_accumulation off keeps one micro-batch per
data-parallel rank at pp 1 (accumulation_ok).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from functools import cached_property

from cost_models.enums import Framework, Recompute, Schedule, Zero
from cost_models.errors import SpecError
from cost_models.hardware import Cluster
from cost_models.pipeline_split import format_pp_layout, format_stage_layers, stage_layer_counts, virtual_stage_layers
from cost_models.layout import Layout
from cost_models.memory import inflight_counts
from cost_models.mamba_shard import cp_error as mamba_cp_error
from cost_models.model_spec import ModelSpec
from cost_models.training import TrainingSpec
from planner.launch.options import LaunchOptions, TitanVersion, titan02_keeps_mixed_precision

MIN_CP_TOKENS = 1024
MAX_MBS = 16
MAX_VPP = 8
HSDP_GROUPS = (8, 16, 32, 64, 128, 256)
# Llama 3 pre-training started at 4M tokens per step (Llama Team 2024, Sec. 3.4.1); GPT-3 175B used 3.2M.
DEFAULT_TOKENS_PER_STEP = 4 * 1024 * 1024

FIXABLE = ("tp", "sp", "pp", "vpp", "cp", "ep", "etp", "mbs", "dp", "zero", "dp_shard", "recompute", "recompute_layers",
           "pp_split", "grad_accumulation")
# The kinds of pipeline split (splits): the same layers on every rank; Megatron's uneven ends
# (--decoder-first/last-pipeline-num-layers, first in Megatron-LM fa8bb5921b, 2024-09-05); every
# rank's own count (--pipeline-model-parallel-layout, first in 77732c3628, 2025-06-13); the embedding
# and/or the loss counted as layers of an even split (--account-for-embedding-in-pipeline-split,
# --account-for-loss-in-pipeline-split, first in Megatron-LM ef490839e8, 2025-02-03).
PP_SPLITS = ("even", "ends", "account", "layout")


@dataclass(frozen=True)
class Shard:
    tp: int
    sp: bool
    cp: int
    ep: int
    etp: int
    mbs: int


@dataclass(frozen=True)
class Stages:
    pp: int
    vpp: int
    first: int | None  # decoder layers on the first stage when it differs from the middle ones
    last: int | None
    recompute: Recompute
    recompute_layers: int | None  # full recompute of the first k layers of each model chunk
    # every rank's decoder layers, where neither the even split nor uneven ends say them (first and
    # last None): Megatron's --pipeline-model-parallel-layout, written by pp_layout
    layers: tuple[int, ...] | None = None
    # every virtual stage's decoder layers (order v·pp + r), where one rank's chunks differ
    # (torchtitan's generated split, generated_split); layers then holds their sums per rank
    chunks: tuple[int, ...] | None = None
    # Megatron's --account-for-embedding/loss-in-pipeline-split: the embedding (loss) counts as a
    # layer of the first (last) virtual stage of an even split (cost_models.pipeline_split)
    embedding: bool = False
    loss: bool = False

    def counts(self, num_layers: int) -> list[int]:
        if self.layers is not None:
            return list(self.layers)
        if self.embedding or self.loss:
            return list(rank_layers(self.sizes(num_layers), self.pp))
        return stage_layer_counts(num_layers, self.pp, self.first, self.last)

    @property
    def split(self) -> Stages:
        """The pipeline split alone, without the recompute plan."""
        return replace(self, recompute=Recompute.NONE, recompute_layers=None)

    def sizes(self, num_layers: int) -> tuple[int, ...]:
        """Every virtual stage's decoder layers, in Megatron's order v·pp + r."""
        return tuple(virtual_stage_layers(num_layers, self.pp, self.vpp, first=self.first, last=self.last,
                                          embedding=self.embedding, loss=self.loss, layout=self.pp_layout))

    @property
    def pp_layout(self) -> str | None:
        return None if self.layers is None else split_pp_layout(self.chunks or self.layers, self.pp, self.vpp)

    def recomputed(self, count: int) -> int:
        """Layers of a rank holding `count` decoder layers that run under the recompute mode."""
        if self.recompute is Recompute.NONE:
            return 0
        if self.recompute_layers is None:
            return count
        return self.vpp * min(self.recompute_layers, count // self.vpp)


@dataclass(frozen=True)
class Sharding:
    zero: Zero
    dp_shard: int | None  # None: shard over all of dp


@dataclass(frozen=True)
class Problem:
    model: ModelSpec
    cluster: Cluster
    training: TrainingSpec  # global_batch_size set
    fixed: dict[str, object] = field(default_factory=dict)
    allow_cross_node_tp: bool = False
    allowed: dict[str, frozenset] = field(default_factory=dict)  # axis -> the values the search may use (parse_allowed)
    # the launch's options (torchtitan version and model entry, Megatron's FSDP): the search ranks only
    # layouts `planner launch` with these options writes
    launch: LaunchOptions = LaunchOptions()

    @property
    def gpus(self) -> int:
        return self.cluster.num_gpus

    @cached_property
    def single_axes(self) -> dict[str, str]:
        """Axes the launch with these options runs only at 1 (planner.launch.build.single_axes), with
        the refusal: the space holds them at 1 instead of scoring layouts the launch would refuse."""
        from cost_models.rules import fill_defaults
        from planner.launch.build import single_axes

        return single_axes(fill_defaults(self.model, self.cluster, self.training, Layout()), self.launch)

    @property
    def framework(self) -> Framework:
        return self.training.framework

    @property
    def global_batch(self) -> int:
        assert self.training.global_batch_size is not None
        return self.training.global_batch_size


def default_global_batch(seq_len: int) -> int:
    return max(1, DEFAULT_TOKENS_PER_STEP // seq_len)


def parse_fixes(items: list[str]) -> dict[str, object]:
    """`--fix tp=8 --fix recompute=full` -> {"tp": 8, "recompute": Recompute.FULL}."""
    out: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in FIXABLE:
            raise SpecError(f"--fix {item!r}: expected AXIS=VALUE with AXIS one of {', '.join(FIXABLE)}")
        value = value.strip()
        if key in out:
            raise SpecError(f"--fix {key} is given twice ({key}={out[key]} and {key}={value}); pin each axis once")
        try:
            if key == "recompute":
                out[key] = Recompute(value)
            elif key in ("sp", "grad_accumulation"):
                if value.lower() not in ("true", "false", "1", "0", "on", "off"):
                    raise ValueError
                out[key] = value.lower() in ("true", "1", "on")
            elif key == "zero":
                out[key] = Zero(int(value))
            elif key == "pp_split":
                if value not in PP_SPLITS:
                    raise ValueError
                out[key] = value
            else:
                n = int(value)
                if n < 1:
                    raise ValueError
                out[key] = n
        except ValueError:
            allowed = {"recompute": "none, selective or full", "sp": "true or false", "grad_accumulation": "true or false",
                       "zero": "0, 1, 2 or 3",
                       "pp_split": ", ".join(PP_SPLITS[:-1]) + " or " + PP_SPLITS[-1]}
            raise SpecError(f"--fix {key}={value}: must be {allowed.get(key, 'a positive integer')}") from None
    return out


ALLOWABLE = tuple(a for a in FIXABLE if a != "dp")  # dp follows from the others


def parse_allowed(axes: dict[str, list]) -> dict[str, frozenset]:
    """{"sp": [False], "recompute": ["none", "full"], "recompute_layers": [None]} -> the typed value
    sets of Problem.allowed. None (only for recompute_layers and dp_shard) means "every layer" and
    "shard over all of dp"; every other value is read as `--fix AXIS=VALUE` reads it."""
    out: dict[str, frozenset] = {}
    for axis, values in axes.items():
        if axis not in ALLOWABLE:
            raise SpecError(f"allowed axis {axis!r}: expected one of {', '.join(ALLOWABLE)}")
        if not values:
            raise SpecError(f"allowed {axis}: give at least one value")
        parsed = set()
        for v in values:
            if v is None:
                if axis not in ("recompute_layers", "dp_shard"):
                    raise SpecError(f"allowed {axis}: null is only meaningful for recompute_layers and dp_shard")
                parsed.add(None)
            else:
                parsed.add(parse_fixes([f"{axis}={str(v).lower() if isinstance(v, bool) else v}"])[axis])
        out[axis] = frozenset(parsed)
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _fixed(problem: Problem, axis: str, values: list) -> list:
    if axis in problem.single_axes:
        values = [v for v in values if v == 1]
    if axis in problem.allowed:
        values = [v for v in values if v in problem.allowed[axis]]
    if axis in problem.fixed:
        return [v for v in values if v == problem.fixed[axis]]
    return values


# --- per-axis generators -------------------------------------------------------------------------


def tp_values(problem: Problem) -> list[int]:
    """Divisors of the head count (and of the Mamba heads and groups, which Megatron's mixer splits
    over tp: rules.mamba_tp) that fit the scale-up domain (unless cross-node tp is allowed)."""
    m, cl = problem.model, problem.cluster.spec
    limit = problem.gpus if problem.allow_cross_node_tp else min(problem.gpus, cl.scaleup_domain_gpus)
    out = [t for t in _divisors(m.num_attention_heads) if t <= limit and problem.gpus % t == 0]
    if m.mamba is not None:
        out = [t for t in out if m.mamba.num_heads % t == 0 and m.mamba.num_groups % t == 0]
    return _fixed(problem, "tp", out)


def sp_values(problem: Problem, tp: int) -> list[bool]:
    if tp == 1:
        # nothing to shard the sequence over: off, whatever a software allows with tp > 1 (`allowed`
        # sp [true] is tensor parallelism that always runs sequence parallel), unless fixed on
        return [] if problem.fixed.get("sp") is True else [False]
    if problem.framework is Framework.DEEPSPEED:
        out = [False]
    elif problem.framework is Framework.TORCHTITAN:
        # torchtitan's tensor parallel plan shards the norms' sequence; ParallelismConfig's
        # enable_sequence_parallel (default True) turns that off since pytorch/torchtitan aa68af18e
        # (2026-03-29, torchtitan/config/configs.py L132-133), after 0.2.2 (2026-02-20), so only the
        # 0.3 launch writes sp off (--parallelism.no_enable_sequence_parallel, planner.launch.torchtitan)
        out = [True, False] if problem.launch.torchtitan_version is TitanVersion.V03 else [True]
    else:
        out = [True, False]
    return _fixed(problem, "sp", out)


def cp_values(problem: Problem) -> list[int]:
    if problem.framework is Framework.DEEPSPEED:
        return _fixed(problem, "cp", [1])
    s = problem.training.seq_len
    out = [c for c in _divisors(problem.gpus) if s % (2 * c) == 0 and s // c >= MIN_CP_TOKENS or c == 1]
    return _fixed(problem, "cp", out)


def ep_values(problem: Problem) -> list[int]:
    moe = problem.model.moe
    out = [1] if moe is None else [e for e in _divisors(moe.num_experts) if problem.gpus % e == 0]
    return _fixed(problem, "ep", out)


def etp_values(problem: Problem, tp: int) -> list[int]:
    if problem.model.moe is None:
        out = [tp if problem.framework is Framework.MEGATRON else 1]  # unused without experts
    elif problem.framework is Framework.DEEPSPEED:
        out = [1]
    else:
        out = sorted({1, tp})
    return _fixed(problem, "etp", out) if problem.model.moe is not None else out


def mbs_values(problem: Problem) -> list[int]:
    out = [b for b in range(1, MAX_MBS + 1) if problem.global_batch % b == 0]
    return _fixed(problem, "mbs", out)


def pp_values(problem: Problem) -> list[int]:
    """Pipeline depths: divisors of the GPUs, at most one layer a stage."""
    return _fixed(problem, "pp", [p for p in _divisors(problem.gpus) if p <= problem.model.num_layers])


def recompute_values(problem: Problem) -> list[Recompute]:
    """The recompute modes searched: none and full only for DeepSpeed."""
    modes = [Recompute.NONE, Recompute.FULL] + ([] if problem.framework is Framework.DEEPSPEED else [Recompute.SELECTIVE])
    return _fixed(problem, "recompute", modes)


def shards(problem: Problem) -> Iterator[Shard]:
    s = problem.training.seq_len
    for tp in tp_values(problem):
        for cp in cp_values(problem):
            if problem.gpus % (tp * cp):
                continue
            if problem.model.mamba is not None and mamba_cp_error(problem.model.mamba, tp, cp):  # rules.mamba_cp
                continue
            for sp in sp_values(problem, tp):
                if sp and (s // cp) % tp:
                    continue
                for ep in ep_values(problem):
                    for etp in etp_values(problem, tp):
                        for mbs in mbs_values(problem):
                            yield Shard(tp=tp, sp=sp, cp=cp, ep=ep, etp=etp, mbs=mbs)


# The pipeline-split models count stage time in integers, UNITS_PER_LAYER to a decoder layer pass: the
# head (head_in_layers, the output layer and loss in layer passes) is resolved to 1/1000 of a layer pass.
UNITS_PER_LAYER = 1000


def chunk_and_head_units(vpp: int, head: float) -> tuple[int, int]:
    """(a model chunk's time, the head's) in units: a chunk of the splits counts vpp decoder layer passes."""
    return UNITS_PER_LAYER * vpp, round(head * UNITS_PER_LAYER)


def head_in_layers(problem: Problem) -> float:
    """The output layer and loss (forward + backward) in decoder-layer passes, on one GPU of the
    model's plain layout (tp 1, mbs 1): what the last pipeline stage carries beyond its layers.
    Both scale alike with tp, cp and mbs, so the ratio holds across layouts to first order."""
    from cost_models.calibration import DEFAULT
    from cost_models.compute import head_pass_time
    from cost_models.rules import fill_defaults
    from cost_models.step_time import layer_pass

    job = fill_defaults(problem.model, problem.cluster, problem.training, Layout())
    kind = problem.model.layer_kind(problem.model.num_layers - 1)
    layer = layer_pass(job, kind, mode=Recompute.NONE, cal=DEFAULT)
    head = head_pass_time(job, DEFAULT)
    return head / (layer.compute.total + layer.comm.total)


def _split(num_layers: int, pp: int, vpp: int, head: float) -> tuple[int, int, int] | None:
    """The uneven pipeline split: f decoder layers on the first stage, l on the
    last and c on each middle one, f + l + (pp−2)·c = L, each a multiple of vpp (equal model
    chunks); the ends no heavier than the middle. Stage time is counted in layer passes, the last
    stage's plus `head`. Minimise the slowest stage (the step grows with it: m·T_max, and the
    bubble's ΣT is the same for every split), then the first stage's layers (it holds the most
    in-flight micro-batches, so memory peaks there). (f, l, c), or None when no split exists.

    Solved by counting rather than by a CP-SAT model of the same problem (a model costs about 2 ms
    to build and solve, the count some microseconds): for each c the best f is the least one that
    brings the last stage down to the middle's time, so the optimum is the best of one candidate
    per c. tests/test_search.py checks it against that model."""
    if num_layers % vpp or num_layers // vpp < pp:
        return None
    n = num_layers // vpp
    a, h = chunk_and_head_units(vpp, head)
    best: tuple[int, int, int, int] | None = None  # (objective, f, l, c)
    for c in range(1, n + 1):
        if pp == 2:  # c is l: the first stage and the last make the whole split
            if c >= n:
                break
            f = n - c
        else:
            rest = n - (pp - 2) * c  # f + l
            lo, hi = max(1, rest - c), min(c, rest - 1)
            if lo > hi:
                continue
            # the last stage, a·l + h, is no slower than a middle one once f ≥ rest − c + ceil(h / a);
            # below that each layer more on the first stage saves a chunk of the slowest stage
            f = min(max(lo, rest - c - (-h // a)), hi)
        l = n - f - (pp - 2) * c if pp > 2 else c
        objective = max(a * f, a * c, a * l + h) * (num_layers + 1) + f
        if best is None or objective < best[0]:
            best = (objective, f, l, c)
    if best is None:
        return None
    _, f, l, c = best
    return vpp * f, vpp * l, vpp * c


# How much slower than the time-balanced optimum the slowest stage of a memory split may be, in
# model chunks (vpp layer passes each): each step of slack lets the split move a chunk more off the
# ranks that hold the most micro-batches in flight.
MEMORY_SPLIT_SLACK = (0, 1, 2)


def held_per_chunk(pp: int, vpp: int) -> list[int]:
    """Each pipeline rank's in-flight micro-batches summed over its model chunks
    (cost_models.memory.inflight_counts), at m = 2·pp micro-batches, which caps neither schedule's
    warm-up (1F1B: pp − r ≤ 2·pp; interleaved: 2(pp − r − 1) + (vpp − 1)·pp + 1 < 2·pp·vpp). A rank of
    x layers per chunk keeps x times this many layers' activations, so it weighs the split's memory."""
    sched = Schedule.INTERLEAVED if vpp > 1 else Schedule.ONE_F_ONE_B
    return [sum(inflight_counts(pp, vpp, 2 * pp, r, sched)) for r in range(pp)]


@functools.lru_cache(maxsize=1024)  # plan's searches at other GPU counts and sweeps ask again
def _memory_splits(num_layers: int, pp: int, vpp: int, head: float) -> tuple[tuple[int, ...], ...]:
    """Every rank's decoder layers, decided under each rank's memory, as a CP-SAT model: x_r model
    chunks of vpp layers on rank r (x_r ≥ 1, Σ x_r = L/vpp), rank r's time vpp·x_r layer passes
    (the last rank's plus `head`), its activations x_r·held_r (held_per_chunk: rank 0 holds the most
    micro-batches in flight, so the time-balanced split peaks there). For each slack δ of
    MEMORY_SPLIT_SLACK: the split whose slowest stage is at most T0 + δ chunks (T0 the smallest
    slowest stage of any split) that minimises the largest activation load, then the slowest stage,
    then the sum of the loads. The layers per rank of each, in slack order; none where L/vpp < pp."""
    chunks, rem = divmod(num_layers, vpp)
    if rem or chunks < pp:
        return ()
    if chunks == pp:
        return ((vpp,) * pp,)  # one chunk per rank: the even split, the only one
    from planner.search import cp_model, new_model

    cp = cp_model()
    a, h = chunk_and_head_units(vpp, head)
    held = held_per_chunk(pp, vpp)
    top_time = a * chunks + h
    top_load = max(held) * chunks  # also bounds Σ_r held_r·x_r, as Σ x_r = chunks
    # T0: with c chunks on the last rank the others' slowest holds at least ceil((chunks − c)/(pp − 1))
    # chunks, and an even share of them reaches it
    t0 = min(max(a * -(-(chunks - c) // (pp - 1)), a * c + h) for c in range(1, chunks - pp + 2))
    out: list[tuple[int, ...]] = []
    for slack in MEMORY_SPLIT_SLACK:
        m = new_model()
        cap = t0 + slack * a
        # each rank's chunks within the cap on its time (a domain, which CP-SAT searches faster than a
        # constraint: 64 ranks 10 ms a model against 16 ms), and leaving the others one each
        x = [m.new_int_var(1, min(chunks - pp + 1, (cap - (h if r == pp - 1 else 0)) // a), f"chunks_{r}")
             for r in range(pp)]
        m.add(sum(x) == chunks)
        # ranks before the last in non-decreasing order: swapping two of them into it keeps every
        # time and lowers the loads (held falls with the rank), so an optimum in this order exists
        for r in range(pp - 2):
            m.add(x[r] <= x[r + 1])
        slowest = m.new_int_var(0, top_time, "slowest")
        m.add_max_equality(slowest, [a * x[r] + (h if r == pp - 1 else 0) for r in range(pp)])
        m.add(slowest <= cap)
        load = m.new_int_var(0, top_load, "load")
        m.add_max_equality(load, [held[r] * x[r] for r in range(pp)])
        m.minimize((load * (top_time + 1) + slowest) * (top_load + 1) + sum(held[r] * x[r] for r in range(pp)))
        solver = cp.CpSolver()
        solver.parameters.num_workers = 1
        # presolve and the LP relaxation cost more than this small model's search (measured, 80
        # layers over 8 ranks: 41 ms with presolve, 4 ms without; seven shapes of 405B and 70B up
        # to pp 64: 100 ms with the default LP relaxation, 50 ms without)
        solver.parameters.cp_model_presolve = False
        solver.parameters.linearization_level = 0
        if solver.solve(m) != cp.OPTIMAL:
            continue
        counts = tuple(vpp * solver.value(v) for v in x)
        if counts not in out:
            out.append(counts)
    return tuple(out)


def generated_split(num_layers: int, pp: int, vpp: int) -> tuple[int, ...] | None:
    """torchtitan's pipeline split where none is given (generate_split_points, pytorch/torchtitan
    9dec370 torchtitan/parallelisms/pipelining_utils.py L18-56: vpp 1 for single-stage schedules, 2
    for looped ones): S = pp·vpp stages, the first L // S decoder layers, each middle one a layer
    more while the remainder L % S lasts, the last what is left; stage s on rank s mod pp (the
    "loop" style, pipeline_llama.py L103-110). Every virtual stage's layers in order v·pp + r, or
    None where the stages are equal (the even split) or more than the layers."""
    stages = pp * vpp
    if stages > num_layers or num_layers % stages == 0:
        return None
    base, extra = divmod(num_layers, stages)
    out = [base]
    for _ in range(stages - 2):
        out.append(base + (extra > 0))
        extra -= extra > 0
    out.append(num_layers - sum(out))
    return tuple(out)


def rank_layers(per_stage: tuple[int, ...], pp: int) -> tuple[int, ...]:
    """Every pipeline rank's decoder layers from every virtual stage's (order v·pp + r)."""
    return tuple(sum(per_stage[r::pp]) for r in range(pp))


def explicit_layouts_ok(problem: Problem) -> bool:
    """Whether every rank's layers may be given (--pp-layout): Megatron's layout flag and torchtitan's
    module_fqns_per_model_part say any split (planner.launch.torchtitan.split), DeepSpeed's
    PipelineModule does not (cost_models.rules, deepspeed_axes), and with MTP layers Megatron's
    layout must place them, which the planner's launch refuses (planner.launch.megatron.check).
    The search scores every layout through that launch check as well (search.evaluate)."""
    return problem.framework is not Framework.DEEPSPEED and not problem.model.mtp_layers


# (vpp, first, last, every rank's layers, (embedding, loss) counted as layers): pp counts, or pp·vpp
# (every virtual stage's, generated_split) where one rank's chunks differ
Split = tuple[int, int | None, int | None, tuple[int, ...] | None, tuple[bool, bool]]
NOT_COUNTED = (False, False)
# Megatron's account-for flags, (embedding, loss): either alone or both
ACCOUNTS = ((True, False), (False, True), (True, True))


def split_pp_layout(layers: tuple[int, ...], pp: int, vpp: int) -> str:
    """The --pipeline-model-parallel-layout of a Split's layers: every rank's (pp of them, equal
    chunks per rank) or every virtual stage's (pp·vpp of them)."""
    return format_pp_layout(layers, vpp) if len(layers) == pp else format_stage_layers(layers)


def split_kind(first: int | None, last: int | None, layers: object | None, accounted: bool = False) -> str:
    """Which of PP_SPLITS a split is: every rank's own count (a layout), the embedding and/or loss
    counted as layers (account), uneven ends, or even."""
    if layers is not None:
        return "layout"
    if accounted:
        return "account"
    return "even" if first is None and last is None else "ends"


def _uneven_ends(counts: tuple[int, ...]) -> tuple[int | None, int | None] | None:
    """(first, last) of per-rank layer counts whose middle ranks (pp > 2) hold equal counts, each None
    where that end holds as many as a middle rank; None where the middle ranks differ."""
    if len(set(counts[1:-1])) != 1:
        return None
    mid = counts[1]
    return (None if counts[0] == mid else counts[0]), (None if counts[-1] == mid else counts[-1])


def vpp_values(num_layers: int, pp: int) -> list[int]:
    """The virtual stages a pipeline depth is searched with: 1 to MAX_VPP, and each larger vpp whose
    pp·vpp chunks split the layers evenly."""
    even = num_layers // pp if num_layers % pp == 0 else 0
    return [*range(1, MAX_VPP + 1), *(v for v in range(MAX_VPP + 1, even + 1) if even % v == 0)]


def account_vpps(num_layers: int, pp: int, embedding: bool, loss: bool) -> list[int]:
    """The vpp at which Megatron splits the decoder layers with the embedding and/or the loss counted
    as layers at depth pp: the units (layers + 1 for each) divide by pp and each rank's by vpp
    (Megatron-LM@d98e8a64 megatron/core/transformer/transformer_config.py L2370-2413;
    transformer_block.py L147-203, get_num_layers_to_build, then builds one decoder layer fewer on the
    first and the last virtual stage). Any such vpp, above MAX_VPP too (the units split evenly, as
    vpp_values takes an even split above it), where every virtual stage keeps a decoder layer: Megatron
    accepts a stage of the embedding or the loss alone (the asserts allow 0 layers), which the search
    leaves out (units / (pp·vpp) ≥ 2)."""
    units = num_layers + int(embedding) + int(loss)
    if units % pp:
        return []
    per_rank = units // pp
    return [v for v in range(1, per_rank // 2 + 1) if per_rank % v == 0 and per_rank // v >= 2]


def account_ok(problem: Problem) -> bool:
    """Whether the embedding and loss may be counted as pipeline layers: Megatron's flags only
    (DeepSpeed's PipelineModule has no such split, cost_models.rules deepspeed_axes; torchtitan places
    modules by its own split), and not beside --hybrid-layer-pattern, whose `|` segments give every
    stage (Megatron-LM@d98e8a64 megatron/training/arguments.py L829-838 refuses both flags with it)."""
    return problem.framework is Framework.MEGATRON and problem.model.hybrid_pattern is None


def splits(problem: Problem, pp: int, head: float) -> list[Split]:
    """(vpp, first, last, layers, (embedding, loss)) of a pipeline depth: per vpp, the even split
    where the layers divide; the uneven split (_split) as Megatron's
    --decoder-first/last-pipeline-num-layers, None where an end holds as many layers as a middle
    stage; the memory splits (_memory_splits) whose per-rank counts neither of those has, as
    first/last where the middle ranks are equal, else as every rank's layers (layers; first and last
    None); and for Megatron (account_ok) the embedding, the loss or both counted as layers at each vpp
    of account_vpps, where no split before has the same per-rank counts (the embedding sits on the
    first rank and the output layer and loss on the last either way, so the counts decide the price).
    Only the kinds (PP_SPLITS) the problem allows or fixes (pp_split) are offered."""
    n, fw = problem.model.num_layers, problem.framework
    if pp == 1:
        return [(1, None, None, None, NOT_COUNTED)]
    vpps = [1] if fw is Framework.DEEPSPEED else vpp_values(n, pp)
    out: dict[tuple[int, tuple[int, ...]], Split] = {}  # (vpp, per-rank counts) -> the split

    def add(vpp: int, first: int | None, last: int | None, layers: tuple[int, ...] | None = None,
            account: tuple[bool, bool] = NOT_COUNTED) -> None:
        if not _fixed(problem, "pp_split", [split_kind(first, last, layers, any(account))]):
            return
        if any(account):
            counts = rank_layers(tuple(virtual_stage_layers(n, pp, vpp, embedding=account[0], loss=account[1])), pp)
        else:
            counts = layers if layers is not None else tuple(stage_layer_counts(n, pp, first, last))
        out.setdefault((vpp, counts), (vpp, first, last, layers, account))

    for vpp in _fixed(problem, "vpp", vpps):
        if n % pp == 0 and (n // pp) % vpp == 0:
            add(vpp, None, None)
        if vpp > MAX_VPP:
            continue
        best = _split(n, pp, vpp, head)
        if best is None:
            continue
        first, last, middle = best
        if pp == 2:
            add(vpp, None if first == last else first, None)
        else:
            add(vpp, None if first == middle else first, None if last == middle else last)
        if not explicit_layouts_ok(problem):
            continue
        for counts in _memory_splits(n, pp, vpp, head):
            if pp == 2:
                add(vpp, counts[0], None)
            elif (ends := _uneven_ends(counts)) is not None:
                add(vpp, *ends)
            else:
                add(vpp, None, None, counts)
    if fw is Framework.TORCHTITAN and explicit_layouts_ok(problem):
        for vpp in _fixed(problem, "vpp", [1, 2]):
            chunks = generated_split(n, pp, vpp)
            if chunks is None:
                continue
            per_rank = rank_layers(chunks, pp)
            if vpp == 1 and pp > 2 and (ends := _uneven_ends(per_rank)) is not None:
                add(vpp, *ends)
            else:
                add(vpp, None, None, per_rank if vpp == 1 else chunks)
    if account_ok(problem):
        for account in ACCOUNTS:
            for vpp in _fixed(problem, "vpp", account_vpps(n, pp, *account)):
                add(vpp, None, None, None, account)
    return sorted(out.values(), key=lambda s: (s[0], s[1] or 0, s[2] or 0, s[3] or (), s[4]))


def stages(problem: Problem) -> Iterator[Stages]:
    """Pipeline splits with their recompute plans."""
    n, fw = problem.model.num_layers, problem.framework
    pps, modes = pp_values(problem), recompute_values(problem)
    head = head_in_layers(problem) if any(p > 1 for p in pps) else 0.0
    for pp in pps:
        for vpp, first, last, layers, (embedding, loss) in splits(problem, pp, head):
            if vpp not in _fixed(problem, "vpp", [vpp]):
                continue
            chunks = None
            if layers is not None and len(layers) != pp:  # every virtual stage's (generated_split)
                chunks, layers = layers, rank_layers(layers, pp)
            split = Stages(pp=pp, vpp=vpp, first=first, last=last, recompute=Recompute.NONE, recompute_layers=None,
                           layers=layers, chunks=chunks, embedding=embedding, loss=loss)
            for mode in modes:
                ks: list[int | None] = [None]
                if mode is Recompute.FULL and fw is Framework.MEGATRON:
                    # below the fewest layers of a model chunk, a depth k recomputes k layers of every chunk
                    ks += list(range(1, min(split.sizes(n))))
                for k in _fixed(problem, "recompute_layers", ks):
                    yield replace(split, recompute=mode, recompute_layers=k)


def shardings(problem: Problem) -> list[Sharding]:
    fw = problem.framework
    if fw is Framework.MEGATRON:
        zeros = [Zero.NONE, Zero.OPTIMIZER, Zero.PARAMETERS]
    elif fw is Framework.TORCHTITAN:
        zeros = [Zero.NONE, Zero.GRADIENTS, Zero.PARAMETERS]
    else:
        zeros = list(Zero)
    zeros = _fixed(problem, "zero", zeros)
    out = [Sharding(z, None) for z in zeros]
    if fw is Framework.TORCHTITAN:
        out += [Sharding(z, g) for z in zeros if z >= Zero.GRADIENTS for g in HSDP_GROUPS]
    if "dp_shard" in problem.allowed:  # None: full sharding; a number: that HSDP group
        out = [s for s in out if s.dp_shard in problem.allowed["dp_shard"]]
    if "dp_shard" in problem.fixed:
        out = [Sharding(s.zero, problem.fixed["dp_shard"]) for s in out if s.dp_shard is None]  # type: ignore[arg-type]
    return out


# --- predicates across axes (the CP-SAT model states the same ones as constraints) ---------------


def degrees_ok(problem: Problem, shard: Shard, st: Stages) -> int | None:
    """dp, if tp·cp·pp divides the GPUs and dp the global batch in whole micro-batches; else None."""
    model_par = shard.tp * shard.cp * st.pp
    if problem.gpus % model_par:
        return None
    dp = problem.gpus // model_par
    if "dp" in problem.fixed and dp != problem.fixed["dp"]:
        return None
    if problem.global_batch % (shard.mbs * dp):
        return None
    if not schedule_ok(problem, st.pp, st.vpp, problem.global_batch // (shard.mbs * dp)):
        return None
    if not accumulation_ok(problem, st.pp, problem.global_batch // (shard.mbs * dp)):
        return None
    if not expert_grid_ok(problem, shard.tp, shard.ep, shard.etp, st.pp):
        return None
    return dp


def expert_grid_ok(problem: Problem, tp, ep, etp, pp):  # type: ignore[no-untyped-def]
    """The frameworks' expert grids (cost_models.rules, expert_grid): Megatron and DeepSpeed need
    etp·ep·pp to divide the GPUs, torchtitan etp of 1 or tp; ints or numpy arrays, like sharding_ok."""
    if problem.framework is Framework.TORCHTITAN:
        return (etp == 1) | (etp == tp)
    return problem.gpus % (etp * ep * pp) == 0


def schedule_ok(problem: Problem, pp, vpp, microbatches):  # type: ignore[no-untyped-def]
    """Megatron's interleaved schedule takes micro-batches in groups of pp (cost_models.rules,
    schedule); ints or numpy arrays, like sharding_ok."""
    if problem.framework is not Framework.MEGATRON:
        return pp == pp
    return (vpp == 1) | (microbatches % pp == 0)


def accumulation_ok(problem: Problem, pp, microbatches):  # type: ignore[no-untyped-def]
    """Whether a layout's micro-batches per step are ones the framework can form with the allowed or
    fixed grad_accumulation. Without a pipeline, more than one micro-batch per data-parallel rank is
    gradient accumulation: with it off (torchtitan before 8570415c3, 2025-06-05: train.py L257-260
    and L300-308 at 9dec370 run one forward and backward of the local batch per step) only
    mbs = global batch / dp is left; fixed on, only layouts that accumulate. A pipeline splits the
    local batch into micro-batches whatever the option (torchtitan at 9dec370:
    --experimental.pipeline_parallel_microbatches, any count, pipelining_utils.py L79-81; the
    schedule's own limits are cost_models.rules'), so pp > 1 is never narrowed. Ints or numpy
    arrays, like sharding_ok."""
    ok = pp == pp
    values = _fixed(problem, "grad_accumulation", [True, False])
    if True not in values:
        ok = ok & ((pp > 1) | (microbatches == 1))
    if False not in values:
        ok = ok & ((pp > 1) | (microbatches > 1))
    return ok


def sharding_ok(problem: Problem, pp, sh: Sharding, dp, shard: Shard | None = None):  # type: ignore[no-untyped-def]
    """Whether a Sharding is legal at pipeline depth pp with dp data-parallel ranks (and, given, the
    Shard's tp, cp, ep and etp, or arrays of them). Written with `&` so that pp, dp and the Shard's
    degrees may be ints or numpy arrays (planner.search tests every cell at once). The rules are
    cost_models.rules' _zero_megatron, _zero_deepspeed, _zero_titan and torchtitan's expert mesh, and for a
    torchtitan 0.2 launch planner.launch.options.titan02_keeps_mixed_precision."""
    fw = problem.framework
    if sh.dp_shard is not None and sh.zero is Zero.NONE:
        return pp != pp  # False, or all False
    ok = pp == pp
    if sh.dp_shard is not None:
        ok = ok & (sh.dp_shard < dp) & (dp % sh.dp_shard == 0)
    if sh.zero is Zero.PARAMETERS and fw is Framework.MEGATRON:
        ok = ok & (pp == 1)
    if sh.zero >= Zero.GRADIENTS and fw is Framework.DEEPSPEED:
        ok = ok & (pp == 1)
    if fw is Framework.TORCHTITAN and shard is not None:
        tp, cp, ep, etp = shard.tp, shard.cp, shard.ep, shard.etp
        if sh.zero is Zero.NONE:  # torchtitan's DDP alone (rules._zero_titan)
            ok = ok & (tp == 1) & (pp == 1) & (cp == 1) & (ep == 1)
        elif problem.launch.torchtitan_version is TitanVersion.V02:
            ok = ok & titan02_keeps_mixed_precision(tp=tp, pp=pp, cp=cp, ep=ep, dp=dp, dp_shard=sh.dp_shard or dp)
        # the ranks torchtitan carves ep (x etp) out of (rules, torchtitan's expert mesh)
        ok = ok & ((sh.dp_shard or dp) * cp * tp % (ep * etp) == 0)
    return ok


def layout_of(shard: Shard, st: Stages, sh: Sharding, dp: int) -> Layout:
    return Layout(
        tp=shard.tp, sp=shard.sp, cp=shard.cp, ep=shard.ep, etp=shard.etp, mbs=shard.mbs, dp=dp,
        pp=st.pp, vpp=st.vpp, pp_first_stage_layers=st.first, pp_last_stage_layers=st.last, pp_layout=st.pp_layout,
        account_for_embedding=st.embedding, account_for_loss=st.loss, recompute=st.recompute, recompute_layers=st.recompute_layers,
        schedule=Schedule.INTERLEAVED if st.vpp > 1 else Schedule.ONE_F_ONE_B,
        zero=sh.zero, dp_shard=sh.dp_shard or dp,
    )


def layout_key(lay: Layout) -> tuple:
    """The documented tie-break between layouts of equal predicted step time (then the lower peak
    memory): fewer
    model-parallel degrees first (tp, pp, vpp, cp, ep, etp), then the larger micro-batch, less
    recomputation, lower ZeRO stage, larger shard group, sequence parallel on."""
    order = {Recompute.NONE: 0, Recompute.SELECTIVE: 1, Recompute.FULL: 2}
    return (
        lay.tp, lay.pp, lay.vpp, lay.cp, lay.ep, lay.etp or 0, -lay.mbs, order[lay.recompute],
        -(lay.recompute_layers or 10**6), int(lay.zero or 0), -(lay.dp_shard or 0), not lay.sp,
        lay.pp_first_stage_layers or 0, lay.pp_last_stage_layers or 0, lay.pp_layout or "", lay.account_for_embedding,
        lay.account_for_loss,
    )
