"""What each command does, as library functions: parse arguments into specs, resolve the job, run
the cost model, return a result object. The CLI only renders what these return."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from pydantic import ValidationError

from cost_models.calibration import DEFAULT, Calibration
from cost_models.errors import SpecError
from cost_models.hardware import Cluster
from cost_models.job import Job
from cost_models.layout import Layout
from cost_models.memory import DEFAULT_HEADROOM, MemoryEstimate, check_headroom, memory_estimate
from cost_models.rules import expert_axes_given, notes, problem_violations, resolve
from cost_models.step_time import TimeEstimate, time_estimate
from cost_models.training import TrainingSpec
from cost_models.units import TFLOP
from planner.errors import spec_error
from planner.launch.options import LaunchOptions
from planner.loaders import load_cluster, load_model


def load_specs(model: str, cluster: str, gpus: int, training: dict[str, Any]) -> tuple[Any, Cluster, TrainingSpec]:
    """Model, cluster and training specs from MODEL/--cluster/--gpus and the training flags (None = default)."""
    model_spec = load_model(model)
    cluster_spec = load_cluster(cluster)
    try:
        cluster_obj = Cluster(spec=cluster_spec, num_gpus=gpus)
    except ValidationError as e:
        raise spec_error(e, Cluster, "--gpus") from None
    try:
        training_spec = TrainingSpec.model_validate({k: v for k, v in training.items() if v is not None})
    except ValidationError as e:
        raise spec_error(e, TrainingSpec, "training") from None
    return model_spec, cluster_obj, training_spec


def build_job(model: str, cluster: str, gpus: int, *, training: dict[str, Any], layout: dict[str, Any],
              flags: bool = False) -> Job:
    """Specs from MODEL/--cluster/--gpus and the layout and training flags (None = default).
    `flags`: the layout came from the command line, where --ep/--etp on a dense model are refused
    (a resolved layout handed back, as the library allows, carries the etp dense layers take)."""
    model_spec, cluster_obj, training_spec = load_specs(model, cluster, gpus, training)
    lay_fields = {k: v for k, v in layout.items() if v is not None}
    if flags:
        expert_axes_given(model_spec, lay_fields, "--")
    try:
        layout_spec = Layout.model_validate(lay_fields)
    except ValidationError as e:
        raise spec_error(e, Layout, "layout") from None
    return resolve(model_spec, cluster_obj, training_spec, layout_spec)


@dataclass(frozen=True)
class MemoryReport:
    job: Job
    estimate: MemoryEstimate

    def to_json(self) -> dict[str, Any]:
        est, job = self.estimate, self.job
        return {
            "model": {
                "name": job.model.name,
                "params_total": job.model.params_total,
                "params_active": job.model.params_active,
            },
            "memory": {
                "peak_bytes": est.peak_bytes,
                "capacity_bytes": est.capacity_bytes,
                "usable_bytes": est.usable_bytes,
                "required_bytes": est.required_bytes,
                "headroom": est.headroom,
                "fits": est.fits,
                "peak_stage": est.peak_stage.rank,
                "breakdown": est.peak_stage.breakdown.to_json(),
                "per_stage": [
                    {
                        "rank": s.rank,
                        "num_layers": len(s.layers),
                        "layers": [s.layers[0], s.layers[-1]] if s.layers else [],
                        "inflight_microbatches": list(s.inflight),
                        "peak_bytes": s.peak_bytes,
                        "breakdown": s.breakdown.to_json(),
                    }
                    for s in est.stages
                ],
            },
            "layout": {
                **job.layout.to_json(),
                "num_microbatches": job.num_microbatches,  # per pipeline per step
                "gradient_accumulation_steps": job.num_microbatches,  # micro-batches per dp rank per step
                "expert_dp": job.edp,
            },
            "training": job.training.model_dump(mode="json"),
            "cluster": {"name": job.cluster.spec.name, "gpu": job.cluster.gpu.name, "gpus": job.gpus, "nodes": job.cluster.num_nodes},
        }


def run_memory(
    model: str,
    cluster: str,
    gpus: int,
    *,
    training: dict[str, Any],
    layout: dict[str, Any],
    headroom: float | None = None,
    flags: bool = False,
) -> MemoryReport:
    job = build_job(model, cluster, gpus, training=training, layout=layout, flags=flags)
    estimate = memory_estimate(job, headroom=DEFAULT_HEADROOM if headroom is None else headroom)
    return MemoryReport(job=job, estimate=estimate)


@dataclass(frozen=True)
class Outlook:
    """What a run of many steps adds to one step: failures, checkpoints, and time and cost to train."""

    tokens: float | None = None  # train this many tokens (time_to_train)
    gpu_hour_cost: float | None = None
    ckpt_write_gb_per_s: float | None = None  # None: cost_models.reliability's default
    gpu_mtbf_hours: float | None = None

    def check(self) -> None:
        for name, value in (("--tokens", self.tokens), ("--gpu-hour-cost", self.gpu_hour_cost),
                            ("--ckpt-write-gbps", self.ckpt_write_gb_per_s), ("--gpu-mtbf-hours", self.gpu_mtbf_hours)):
            if value is not None and not (value > 0 and value != float("inf")):
                raise SpecError(f"{name}({value}) must be a positive finite number")
            low, high = OUTLOOK_RANGES[name]
            if value is not None and not low <= value <= high:
                raise SpecError(f"{name}({value:g}) must be between {low:g} and {high:g}")
        if self.gpu_hour_cost is not None and self.tokens is None:
            raise SpecError(f"--gpu-hour-cost({self.gpu_hour_cost}) prices the GPU-hours to train --tokens T; "
                            "give --tokens too, e.g. --tokens 15e12")


# The search's time limit unless --time-limit gives another (planner.search.search's default).
SEARCH_TIME_LIMIT_S = 30.0


class NoLayout(SpecError):
    """The search found no layout that fits: an answer about this GPU count, not bad input."""


class SearchTimedOut(SpecError):
    """The search stopped at its time limit before it scored a layout that fits: no answer about this
    GPU count either way, and not bad input."""


# Ranges of the outlook numbers: far beyond any real run on both sides, so that the days, costs and
# checkpoint intervals derived from them stay finite numbers.
OUTLOOK_RANGES = {
    "--tokens": (1.0, 1e18),  # 1e18 tokens: ~70,000x Llama 3's 15T
    "--gpu-hour-cost": (1e-6, 1e6),
    "--ckpt-write-gbps": (1e-3, 1e9),  # 1 MB/s to 1 EB/s
    "--gpu-mtbf-hours": (1e-2, 1e9),  # 36 s to ~100,000 years
}


@dataclass(frozen=True)
class EstimateReport:
    """Memory and time of one layout: what `planner estimate` prints, and each plan of `planner plan`."""

    memory: MemoryReport
    time: TimeEstimate
    outlook: Outlook = Outlook()

    @property
    def job(self) -> Job:
        return self.memory.job

    @property
    def reliability(self):  # type: ignore[no-untyped-def]
        from cost_models.reliability import DEFAULT_GPU_MTBF_HOURS, reliability

        o = self.outlook
        return reliability(self.job, self.memory.estimate, gpu_mtbf_hours=o.gpu_mtbf_hours or DEFAULT_GPU_MTBF_HOURS,
                           write_gb_per_s=o.ckpt_write_gb_per_s)

    @property
    def cost(self):  # type: ignore[no-untyped-def]
        from cost_models.reliability import training_cost

        if self.outlook.tokens is None:
            return None
        return training_cost(self.outlook.tokens, self.time.tokens_per_s, self.job.gpus, self.reliability.lost_fraction,
                             self.outlook.gpu_hour_cost)

    def to_json(self) -> dict[str, Any]:
        t = self.time
        doc = self.memory.to_json()
        doc["time"] = {
            "step_s": t.step_s,
            "breakdown": t.breakdown.to_json(),
            "critical_stage": t.critical.rank,
            "per_stage": [
                {
                    "rank": s.rank,
                    "microbatch_s": s.microbatch_s,
                    "microbatch": s.microbatch.to_json(),
                    "dp_exposed_s": s.dp_exposed_s,
                    "optimizer_s": s.optimizer_s,
                }
                for s in t.stages
            ],
            "calibration": t.calibration.to_json(),
        }
        doc["throughput"] = {
            "tokens_per_step": t.tokens_per_step,
            "tokens_per_s": t.tokens_per_s,
            "tokens_per_s_per_gpu": t.tokens_per_s_per_gpu,
            "model_tflops_per_gpu": t.model_flop_per_s_per_gpu / TFLOP,
            "mfu": t.mfu,
            "hfu": t.hfu,
            "mfu_fp8_peak": t.mfu_fp8,
            "mfu_fp4_peak": t.mfu_fp4,
            "model_flop_per_step": t.model_flop_per_step,
            "hardware_flop_per_step": t.hardware_flop_per_step,
            "peak_tflops_per_gpu": t.peak_flop_per_s / TFLOP,
        }
        doc["bottleneck"] = t.bottleneck
        doc["notes"] = notes(self.job)
        doc["checkpoint"] = self.reliability.to_json()
        if self.cost is not None:
            doc["time_to_train"] = self.cost.to_json()
        return doc


def run_estimate(
    model: str,
    cluster: str,
    gpus: int,
    *,
    training: dict[str, Any],
    layout: dict[str, Any],
    headroom: float | None = None,
    calibration: Calibration = DEFAULT,
    outlook: Outlook = Outlook(),
    flags: bool = False,
) -> EstimateReport:
    outlook.check()
    memory = run_memory(model, cluster, gpus, training=training, layout=layout, headroom=headroom, flags=flags)
    return EstimateReport(memory=memory, time=time_estimate(memory.job, calibration=calibration), outlook=outlook)


@dataclass(frozen=True)
class PlanReport:
    """What `planner plan` found: the ranked plans, each as `planner estimate` reports it, and the search."""

    problem: Any  # planner.space.Problem
    result: Any  # planner.search.SearchResult
    headroom: float = DEFAULT_HEADROOM
    outlook: Outlook = Outlook()

    @cached_property
    def plans(self) -> list[EstimateReport]:
        return [EstimateReport(memory=MemoryReport(job=p.job, estimate=p.memory), time=p.time, outlook=self.outlook)
                for p in self.result.plans]

    def to_json(self, *, timings: bool = False) -> dict[str, Any]:
        """The plans and the search. `timings` adds the search's wall time, the one field that depends on the
        machine rather than the input: without it the same input gives the same document, byte for byte."""
        plans = []
        for rank, report in enumerate(self.plans, 1):
            doc = report.to_json()
            keys = ("layout", "memory", "time", "throughput", "bottleneck", "notes", "checkpoint", "time_to_train")
            plans.append({"rank": rank, **{k: doc[k] for k in keys if k in doc}})
        r = self.result
        search = {"candidates": r.candidates, "optimal": r.optimal, "solver": r.solver, "lower_bound_s": r.lower_bound_s}
        if timings:
            search = {"seconds": r.seconds, **search}
        doc: dict[str, Any] = {"plans": plans, "search": search}
        hint = batch_hint(self.problem.training.global_batch_size, self.problem.gpus)
        if hint:
            doc["batch_hint"] = hint
        return doc


def batch_hint(global_batch: int | None, gpus: int) -> dict[str, Any] | None:
    """When the GPUs do not divide the global batch, data parallelism can only use divisors of the
    batch, and the other GPUs go to tp/pp/cp: the nearest batches the GPU count divides."""
    if not global_batch or global_batch % gpus == 0:
        return None
    below = global_batch // gpus * gpus
    return {"global_batch_size": global_batch, "gpus": gpus, "nearest": [b for b in (below, below + gpus) if b > 0]}


def batch_hint_line(global_batch: int | None, gpus: int) -> str | None:
    hint = batch_hint(global_batch, gpus)
    if hint is None:
        return None
    near = " or ".join(str(b) for b in hint["nearest"])
    return (f"note: global batch {global_batch:,} is not a multiple of the {gpus} GPUs, so data parallelism is held to "
            f"divisors of {global_batch:,} and the other GPUs go to tp/pp/cp; --global-batch-size {near} is a multiple of {gpus}")


def run_plan(
    model: str,
    cluster: str,
    gpus: int,
    *,
    training: dict[str, Any],
    fixes: list[str],
    top: int = 10,
    headroom: float | None = None,
    allow_cross_node_tp: bool = False,
    calibration: Calibration = DEFAULT,
    progress: Any = None,
    hints: bool = True,
    outlook: Outlook = Outlook(),
    launch: LaunchOptions = LaunchOptions(),
    time_limit_s: float | None = None,
) -> PlanReport:
    """The search's report. `launch`: the options `planner launch` will run with, so that no ranked
    layout is one that launch refuses with them (a torchtitan 0.2 model without pipelining, say).
    `time_limit_s` (None: SEARCH_TIME_LIMIT_S): the search stops there with the best plans scored so
    far, not proven optimal."""
    from planner.search import search
    from planner.space import Problem, default_global_batch, parse_fixes

    if top < 1:
        raise SpecError(f"--top({top}) must be at least 1")
    if time_limit_s is None:
        time_limit_s = SEARCH_TIME_LIMIT_S
    if not 0 < time_limit_s < float("inf"):
        raise SpecError(f"--time-limit({time_limit_s:g}) must be a positive finite number of seconds, e.g. {SEARCH_TIME_LIMIT_S:g}")
    outlook.check()
    model_spec, cluster_obj, spec = load_specs(model, cluster, gpus, training)
    if spec.global_batch_size is None:
        spec = spec.model_copy(update=dict(global_batch_size=default_global_batch(spec.seq_len)))
    fixed = parse_fixes(fixes)
    expert_axes_given(model_spec, fixed, "--fix ")
    problem = Problem(model_spec, cluster_obj, spec, fixed=fixed, allow_cross_node_tp=allow_cross_node_tp, launch=launch)
    for axis, why in problem.single_axes.items():
        if fixed.get(axis, 1) != 1:
            raise SpecError(f"--fix {axis}={fixed[axis]}: launch refuses it: {why.format(fixed[axis])}")
    broken = problem_violations(model_spec, cluster_obj, spec)
    if broken:
        raise SpecError(f"no layout of {model_spec.name} can run: {broken[0][1]} [{spec.framework}]")
    off_grid = _fix_off_grid(problem)
    if off_grid:
        raise NoLayout(off_grid)  # about this GPU count and batch: a sweep goes on to the next count
    headroom = check_headroom(DEFAULT_HEADROOM if headroom is None else headroom)
    result = search(problem, top=top, headroom=headroom, calibration=calibration, progress=progress, time_limit_s=time_limit_s)
    if not result.plans:
        if result.timed_out:  # not an answer about this GPU count: nothing was proven
            raise SearchTimedOut(_no_plan(problem, result, time_limit_s))
        hint = _what_fits(problem, headroom, calibration, batch_given=training.get("global_batch_size") is not None) if hints else ""
        raise NoLayout(_no_plan(problem, result, time_limit_s) + hint)
    return PlanReport(problem=problem, result=result, headroom=headroom, outlook=outlook)


def _fix_off_grid(problem: Any) -> str | None:
    """A pinned tp, pp, cp, ep, mbs or dp that no layout of the problem takes, with the rule and the
    values that it does take (planner.space's per-axis generators, the other pins lifted); or pinned
    pipeline axes that leave no pipeline split."""
    from cost_models.enums import Framework, Recompute
    from planner.space import (
        MAX_MBS, MAX_VPP, MIN_CP_TOKENS, cp_values, ep_values, mbs_values, pp_values, recompute_values, shardings, stages,
        tp_values,
    )

    m, g, b, s = problem.model, problem.gpus, problem.global_batch, problem.training.seq_len
    domain = problem.cluster.spec.scaleup_domain_gpus
    rules = {
        "tp": (tp_values, f"tp must divide num_attention_heads({m.num_attention_heads}) and gpus({g})"
               + ("" if m.mamba is None else f", the Mamba heads({m.mamba.num_heads}) and groups({m.mamba.num_groups})")
               + ("" if problem.allow_cross_node_tp else f" and stay within the {domain}-GPU scale-up domain (--allow-cross-node-tp lifts that)")),
        "pp": (pp_values, f"pp must divide gpus({g}) and be at most num_layers({m.num_layers})"),
        "cp": (cp_values, "the search runs DeepSpeed without context parallelism" if problem.framework is Framework.DEEPSPEED
               else f"cp must divide gpus({g}), and seq_len({s}) must split into 2·cp equal chunks with at least "
                    f"{MIN_CP_TOKENS} tokens per rank"),
        "ep": (ep_values, f"ep must divide gpus({g})" + ("" if m.moe is None else f" and num_experts({m.moe.num_experts})")),
        "mbs": (mbs_values, f"mbs must divide global_batch_size({b}) and be at most {MAX_MBS}"),
        "dp": (lambda p: [d for d in range(1, g + 1) if g % d == 0 and b % d == 0],
               f"dp must divide gpus({g}) and global_batch_size({b})"),
        "zero": (lambda p: sorted({sh.zero for sh in shardings(p)}), f"the search shards {problem.framework} layouts at these ZeRO stages only"),
        "recompute": (recompute_values, f"the search recomputes {problem.framework} layouts in these modes only"),
    }
    for axis, (values_of, rule) in rules.items():
        if axis not in problem.fixed:
            continue
        values = values_of(replace(problem, fixed={k: v for k, v in problem.fixed.items() if k != axis}))
        if problem.fixed[axis] not in values:
            text = f"--fix {axis}={problem.fixed[axis]}: {rule}; {axis} in {', '.join(map(str, values))}"
            if axis == "dp" and g % int(problem.fixed[axis]) == 0:  # type: ignore[call-overload]
                from cost_models.rules import nearest_batches

                text += f"; or {nearest_batches(b, int(problem.fixed[axis]))}"  # type: ignore[call-overload]
            return text
    if "recompute_layers" in problem.fixed:  # planner.space.stages: full recompute of the first k layers, Megatron only
        if problem.framework is not Framework.MEGATRON:
            return (f"--fix recompute_layers={problem.fixed['recompute_layers']}: the search offers full recompute of the "
                    f"first layers of each chunk with Megatron only (--recompute-num-layers), not {problem.framework}; drop it")
        if problem.fixed.get("recompute", Recompute.FULL) is not Recompute.FULL:
            return (f"--fix recompute_layers={problem.fixed['recompute_layers']}: applies to full recompute only "
                    f"(--fix recompute={problem.fixed['recompute']}); pin recompute=full or drop recompute_layers")
    pins = {k: v for k, v in problem.fixed.items() if k in ("pp", "vpp", "pp_split", "recompute", "recompute_layers")}
    if pins and next(stages(problem), None) is None:  # the search's pipeline splits (planner.space.stages)
        vpps = ("1" if problem.framework is Framework.DEEPSPEED else f"1 to {MAX_VPP}, or more where the layers split evenly"
                + (" (or, with the embedding and/or loss counted as layers, the units)" if problem.framework is Framework.MEGATRON else ""))
        return (f"--fix {' '.join(f'{k}={v}' for k, v in pins.items())}: no pipeline split of the {m.num_layers} layers "
                f"takes it (vpp in {vpps}, each rank's layers in vpp chunks; recompute_layers below a chunk's layers); "
                f"relax --fix")
    return None


def _what_fits(problem: Any, headroom: float, calibration: Calibration, *, batch_given: bool, budget_s: float = 6.0) -> str:
    """The nearest problems that have a layout: the fewest GPUs (doubling, up to 64x, in whole
    nodes) and the longest sequence (halving, down to 1024 tokens), each found by a top-1 search."""
    import time

    from cost_models.hardware import Cluster
    from cost_models.model_spec import MAX_COUNT
    from planner.search import search
    from planner.space import default_global_batch

    start = time.perf_counter()

    def fits(p: Any) -> bool:
        left = budget_s - (time.perf_counter() - start)
        return left > 0 and bool(search(p, top=1, headroom=headroom, calibration=calibration, time_limit_s=left).plans)

    out = []
    node = problem.cluster.spec.gpus_per_node
    for factor in (2, 4, 8, 16, 32, 64):
        gpus = problem.gpus * factor
        if (gpus % node and node % gpus) or gpus > MAX_COUNT:  # whole nodes, or a part of one; within --gpus' bound
            continue
        if fits(replace(problem, cluster=Cluster(spec=problem.cluster.spec, num_gpus=gpus))):
            out.append(f"it fits on {gpus} GPUs")
            break
    seq = problem.training.seq_len // 2
    while seq >= 1024:
        update: dict[str, Any] = {"seq_len": seq}
        if not batch_given:
            update["global_batch_size"] = default_global_batch(seq)
        if fits(replace(problem, training=problem.training.model_copy(update=update))):
            out.append(f"on {problem.gpus} GPUs with --seq-len {seq}")
            break
        seq //= 2
    return f" ({'; '.join(out)})" if out else ""


def _no_plan(problem: Any, result: Any, time_limit_s: float = SEARCH_TIME_LIMIT_S) -> str:
    """One line: why nothing fits, and the closest thing that was tried."""
    where = f"{problem.model.name} on {problem.gpus}x {problem.cluster.gpu.name}"
    fixed = f" with --fix {' '.join(f'{k}={v}' for k, v in problem.fixed.items())}" if problem.fixed else ""
    if result.timed_out:
        scored = (f"after scoring {result.candidates} layouts, none of which fits" if result.candidates
                  else "before scoring any layout, so none fits so far")
        return (f"the search of {where}{fixed} ran out of its {time_limit_s:g} s time limit {scored}; this is not a "
                f"proof that none does: raise --time-limit or pin axes with --fix")
    memory = [r for r in result.rejected if r.reason.startswith("needs ")]
    if memory:
        closest = min(memory, key=lambda r: float(r.reason.split()[1]))
        lay = closest.layout
        return (f"no layout of {where}{fixed} fits: the closest (tp {lay.tp}, pp {lay.pp}, cp {lay.cp}, zero "
                f"{int(lay.zero or 0)}, mbs {lay.mbs}, recompute {lay.recompute}) {closest.reason}; add GPUs, "
                f"shorten --seq-len or relax --fix")
    if result.rejected:
        return f"no layout of {where}{fixed} is legal: {result.rejected[0].reason}; relax --fix or change --global-batch-size"
    return (f"no layout of {where}{fixed} passes the memory bound (states and activations alone exceed "
            f"{problem.cluster.gpu.hbm_bytes / 2**30:.0f} GiB) or divides --global-batch-size({problem.global_batch}); "
            f"add GPUs, shorten --seq-len, change --global-batch-size or relax --fix{_pins_refused(problem)}")


def _pins_refused(problem: Any) -> str:
    """The framework's rule that refuses the pinned axes with every other axis at its default, if one
    does: the likeliest reason a pinned search has no candidate (a hint; other values may be refused too)."""
    fields = {k: v for k, v in problem.fixed.items() if k in Layout.model_fields}
    if not fields:
        return ""
    try:
        resolve(problem.model, problem.cluster, problem.training, Layout.model_validate(fields))
    except (SpecError, ValidationError) as e:
        return f" (with the other axes at their defaults the pins are refused: {str(e).removeprefix('layout: ')})"
    return ""
