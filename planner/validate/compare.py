"""Predicted vs measured, term by term, for the slice that ran.

Measured step time is, per timed step, the slowest rank's wall time of that step (ranks meet in
collectives every step, so the slowest sets the pace); its median and spread are over the timed
steps. The time split comes from the profiler trace of one rank, the critical one (the largest
compute time, which under a pipeline is the stage the cost model calls critical), as
worker.analyze_trace reads it: on GPUs from the device's kernels (compute kernels, the optimizer's
kernels, NCCL kernels by process group), on CPU from the main thread's operators less the time
inside communication calls and the optimizer. Compute is split into GEMM, attention and
elementwise (memory-bound) time, each beside the cost model's price of the same kernels;
communication per kind is its collectives' time not hidden behind compute (exposed); what is left
of the step ("idle") is pipeline bubble, waits for other ranks and host time between kernels."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from cost_models.memory import allocator_counters, memory_estimate
from cost_models.step_time import COMM_KINDS, TimeEstimate, compute_by_kernel
from planner.validate.slices import Slice

STATE_PARTS = ("weights", "gradients", "optimizer_states")
# memory model state lines the emitted job never allocates (torchtitan keeps fp32 parameters that
# the optimizer updates in place: no master copy, no separate fp32 gradient)
ABSENT_PARTS = ("fp32_gradients", "master_weights")


@dataclass(frozen=True)
class Row:
    term: str
    unit: str  # "s", "bytes", "tokens/s", "fraction"
    predicted: float | None
    measured: float | None
    note: str = ""

    @property
    def error(self) -> float | None:
        """(predicted - measured) / measured: how far the prediction is from what ran."""
        if self.predicted is None or self.measured is None or self.measured == 0:
            return None
        return (self.predicted - self.measured) / self.measured

    def to_json(self) -> dict[str, Any]:
        return {"term": self.term, "unit": self.unit, "predicted": self.predicted, "measured": self.measured,
                "error": self.error, "note": self.note}


@dataclass(frozen=True)
class Measured:
    steps_s: list[float]  # per timed step, the slowest rank; the steps without the profiler where there are any
    critical_rank: int
    split: dict[str, Any]  # medians over the profiled steps of the critical rank
    split_steps: list[dict[str, Any]]  # the critical rank's per-step split
    state_bytes: dict[int, dict[str, int]]  # rank -> measured state bytes
    stage_of_rank: dict[int, int]  # rank -> pipeline rank
    peak: dict[int, dict[str, Any]]
    world: int
    optimizer: dict[str, Any]  # the critical rank's optimizer: class and implementation (worker.make_optimizer)
    device: dict[str, Any]  # the device the critical rank ran on (worker.device_info)
    # per profiled step, the slowest rank, where steps_s were timed without the profiler (else empty:
    # steps_s are the profiled steps)
    profiled_steps_s: list[float] = field(default_factory=list)

    @property
    def step_s(self) -> float:
        return statistics.median(self.steps_s)

    @property
    def profiled_step_s(self) -> float | None:
        """The median of the profiled steps, where steps_s were timed without the profiler (else None)."""
        return statistics.median(self.profiled_steps_s) if self.profiled_steps_s else None

    @property
    def unprofiled(self) -> bool:
        """Whether steps_s were timed without the profiler (and the split from other, profiled steps)."""
        return bool(self.profiled_steps_s)

    @property
    def idle_s(self) -> float | None:
        """The step's time outside kernels: the profiled split's, or, with steps timed without the
        profiler, that step less the kernel time (compute, optimizer, exposed communication) of the
        profiled steps, whose host-side recording slows only the host."""
        if not self.split:
            return None
        if not self.unprofiled:
            return self.split["other_s"]
        busy = self.split["step_s"] - self.split["other_s"]
        return max(0.0, self.step_s - busy)

    def to_json(self) -> dict[str, Any]:
        s = sorted(self.steps_s)
        return {
            "step_s": {"median": self.step_s, "min": s[0], "max": s[-1], "steps": self.steps_s,
                       "profiler": "off" if self.unprofiled else "on"},
            "profiled_step_s": ({"median": self.profiled_step_s, "steps": self.profiled_steps_s}
                                if self.profiled_steps_s else None),
            "critical_rank": self.critical_rank,
            "split": self.split,
            "split_steps": self.split_steps,
            "state_bytes": {str(r): v for r, v in self.state_bytes.items()},
            "stage_of_rank": {str(r): v for r, v in self.stage_of_rank.items()},
            "peak_memory": {str(r): v for r, v in self.peak.items()},
            "ranks": self.world,
            "optimizer": self.optimizer,
            "device": self.device,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Measured:
        """The inverse of to_json: a validate.json's `measured`. Reports written before it kept
        stage_of_rank hold one rank, on pipeline rank 0."""
        stages = doc.get("stage_of_rank") or ({"0": 0} if doc["ranks"] == 1 else None)
        if stages is None:
            raise ValueError("a report of several ranks without stage_of_rank")
        return cls(steps_s=doc["step_s"]["steps"], critical_rank=doc["critical_rank"], split=doc["split"],
                   split_steps=doc["split_steps"], state_bytes={int(r): v for r, v in doc["state_bytes"].items()},
                   stage_of_rank={int(r): v for r, v in stages.items()},
                   peak={int(r): v for r, v in doc["peak_memory"].items()}, world=doc["ranks"],
                   optimizer=doc["optimizer"], device=doc["device"],
                   profiled_steps_s=(doc.get("profiled_step_s") or {}).get("steps", []))


def _median_split(steps: list[dict[str, Any]]) -> dict[str, Any]:
    if not steps:
        return {}
    med = {k: statistics.median(s[k] for s in steps) for k in ("step_s", "compute_s", "optimizer_s", "other_s")}
    med["comm"] = {
        kind: {part: statistics.median(s["comm"][kind][part] for s in steps) for part in ("busy_s", "exposed_s")}
        for kind in steps[0]["comm"]
    }
    if "classes" in steps[0]:
        med["classes"] = {k: statistics.median(s["classes"][k] for s in steps) for k in steps[0]["classes"]}
    return med


def measure(results: list[dict[str, Any]]) -> Measured:
    """Combine the ranks' result files of one run."""
    by_rank = {r["rank"]: r for r in results}
    def slowest(key: str) -> list[float]:
        n = min(len(r.get(key) or []) for r in results)
        return [max(r[key][k] for r in results) for k in range(n)]

    profiled, unprofiled = slowest("step_times_s"), slowest("unprofiled_step_times_s")
    splits = {r["rank"]: (r.get("split") or {}).get("steps", []) for r in results}
    med = {rank: _median_split(s) for rank, s in splits.items()}
    critical = max(sorted(by_rank), key=lambda rank: med[rank].get("compute_s", 0.0))
    return Measured(
        steps_s=unprofiled or profiled,
        critical_rank=critical,
        split=med[critical],
        split_steps=splits[critical],
        state_bytes={rank: r["state_bytes"] for rank, r in sorted(by_rank.items())},
        stage_of_rank={rank: r["coord"]["pp"] for rank, r in by_rank.items()},
        peak={rank: r.get("peak_memory") or {} for rank, r in sorted(by_rank.items())},
        world=len(results),
        optimizer=by_rank[critical]["optimizer"],
        device=by_rank[critical]["device"],
        profiled_steps_s=profiled if unprofiled else [],
    )


@dataclass(frozen=True)
class StateCheck:
    ok: bool
    mismatches: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "mismatches": self.mismatches}


def check_states(slice_: Slice, measured: Measured) -> StateCheck:
    """Parameter, gradient and optimizer bytes of every rank against the memory model's model
    states for its pipeline stage, exactly."""
    est = memory_estimate(slice_.job)
    bad = []
    for rank, got in measured.state_bytes.items():
        stage = est.stages[measured.stage_of_rank[rank]].breakdown
        for part in STATE_PARTS:
            want = int(stage.value(f"model_states/{part}"))
            if got.get(part) != want:
                bad.append(f"rank {rank} {part}: measured {got.get(part)} B, predicted {want} B")
        for part in ABSENT_PARTS:
            if stage.value(f"model_states/{part}"):
                bad.append(f"rank {rank} {part}: predicted {int(stage.value(f'model_states/{part}'))} B, the job keeps none")
    return StateCheck(ok=not bad, mismatches=bad)


# kernel class (worker.kernel_class, step_time.compute_by_kernel) -> its row in the table
KERNEL_ROWS = {
    "gemm": "GEMM",
    "attention": "attention",
    "elementwise": "elementwise (memory-bound)",
}


def kernel_rows(time: TimeEstimate, split: dict[str, Any], *, device: str) -> list[Row]:
    """The compute row split by kernel class, each beside the cost model's term for the same
    kernels (step_time.compute_by_kernel). Contention, predicted slowdown of kernels that share the
    GPU with communication kernels, has no kernels of its own: measured inside the classes."""
    classes = split.get("classes")
    if not classes:
        return []
    pred = compute_by_kernel(time)
    source = "device kernels" if device == "cuda" else "CPU operators"
    out = [Row(f"compute: {label}", "s", float(pred.value(k)), classes[f"{k}_s"], source) for k, label in KERNEL_ROWS.items()]
    contention = float(pred.value("contention"))
    if contention > 0:
        out.append(Row("compute: contention", "s", contention, None, "no kernels of its own: slower kernels in the classes above"))
    return out


def rows(slice_: Slice, time: TimeEstimate, measured: Measured, *, device: str, dtype: str) -> list[Row]:
    job = slice_.job
    br = time.breakdown
    sp = measured.split
    steps = (f"median of {len(measured.steps_s)} steps, {min(measured.steps_s) * 1e3:.1f}-{max(measured.steps_s) * 1e3:.1f} ms")
    if measured.unprofiled:
        steps += (f", without the profiler ({measured.profiled_step_s * 1e3:.1f} ms with it, "
                  "the steps the split below is read from)")
    out = [Row("step time", "s", time.step_s, measured.step_s, steps)]
    if sp:
        out.append(Row("compute", "s", float(br.value("compute")), sp["compute_s"], f"rank {measured.critical_rank}"))
        out += kernel_rows(time, sp, device=device)
        for kind in COMM_KINDS:
            pred = float(br.value(kind))
            got = sp["comm"].get(kind, {}).get("exposed_s")
            if kind in slice_.not_measured:
                out.append(Row(f"{kind} exposed", "s", None, None, f"the plan's {kind} collectives are not in this slice"))
            elif pred > 0 or (got or 0) > 0:
                busy = sp["comm"].get(kind, {}).get("busy_s", 0.0)
                out.append(Row(f"{kind} exposed", "s", pred, got, f"busy {busy * 1e3:.1f} ms"))
        lost = sp["comm"].get("unattributed", {})
        if lost.get("busy_s", 0.0) > 0:
            out.append(Row("unattributed comm exposed", "s", None, lost["exposed_s"],
                           f"busy {lost['busy_s'] * 1e3:.1f} ms of NCCL kernels whose process group the trace does not name"))
        idle_note = "measured: bubble, waits and host time between operators"
        if measured.unprofiled:
            idle_note += "; the step without the profiler less the profiled steps' kernel time"
        out.append(Row("bubble / idle", "s", time.bubble_s, measured.idle_s, idle_note))
        out.append(Row("optimizer", "s", float(br.value("optimizer")), sp["optimizer_s"]))
    step = measured.step_s
    tokens_per_s_gpu = time.tokens_per_step / step / job.gpus
    out.append(Row("tokens/s/GPU", "tokens/s", time.tokens_per_s_per_gpu, tokens_per_s_gpu))
    out.append(Row("MFU", "fraction", time.mfu, time.model_flop_per_step / step / job.gpus / time.peak_flop_per_s,
                   f"of {job.cluster.gpu.name}'s {time.peak_flop_per_s / 1e12:.0f} TFLOP/s"))
    est = memory_estimate(job)
    rank = measured.critical_rank
    stage = est.stages[measured.stage_of_rank[rank]].breakdown
    got = measured.state_bytes[rank]
    for part in STATE_PARTS:
        out.append(Row(f"memory {part}", "bytes", float(stage.value(f"model_states/{part}")), float(got[part]), f"rank {rank}"))
    dynamic = float(stage.value("activations") + stage.value("transient") + stage.value("buffers/unsharded_params")
                    + stage.value("buffers/unsharded_grads"))
    peak = measured.peak.get(rank, {})
    if device == "cuda" and peak.get("max_allocated_bytes") is not None:
        reserved, alloc = allocator_counters(stage)
        out.append(Row("memory peak allocated", "bytes", float(alloc), float(peak["max_allocated_bytes"]), "torch.cuda.max_memory_allocated"))
        out.append(Row("memory peak reserved", "bytes", float(reserved), float(peak["max_reserved_bytes"]), "torch.cuda.max_memory_reserved"))
    elif peak.get("profiler_peak_bytes") is not None:
        fp32 = f"; ran in {dtype}, predicted for {job.training.precision}" if dtype == "float32" else ""
        out.append(Row("memory peak in step", "bytes", dynamic, float(peak["profiler_peak_bytes"]),
                       f"activations + transient + gathered buffers; measured: profiler's tensor peak{fp32}"))
    return out
