"""`planner validate` as a library function: resolve the plan, choose the slice, emit and run the
job, measure, compare, optionally calibrate; the CLI only renders the report this returns."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cost_models.calibration import DEFAULT, Calibration
from cost_models.errors import SpecError
from cost_models.memory import DEFAULT_HEADROOM, memory_estimate
from cost_models.step_time import time_estimate
from planner import presets
from planner.runners import EstimateReport, MemoryReport
from planner.validate import calibrate as cal_mod
from planner.validate.compare import Measured, Row, StateCheck, check_states, measure, rows
from planner.validate.device import match_device
from planner.validate.runner import LaunchResult, emit, launch
from planner.validate.slices import Slice, choose_slice, job_doc, native_job, read_plan, run_doc

RUN_NAME = "validate"
DEFAULT_STEP_TIMEOUT_S = 300.0
DEFAULT_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class Options:
    steps: int = 10
    warmup: int = 3
    nproc: int | None = None
    backend: str | None = None  # "nccl" or "gloo"; None: nccl when CUDA is available
    fp32: bool = False
    timeout_s: float = DEFAULT_TIMEOUT_S
    step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S
    calibrate: Path | None = None
    calibration: Calibration = DEFAULT
    debug: dict[str, Any] | None = None  # fault injection (tests)
    force: bool = False  # write into a non-empty --out that an earlier validate did not write

    def check(self, out_dir: Path) -> None:
        """The run's own settings, before anything is loaded or written."""
        if self.steps < 1:
            raise SpecError(f"--steps({self.steps}) must be at least 1")
        if self.warmup < 0:
            raise SpecError(f"--warmup({self.warmup}) must be 0 or more")
        for name, seconds in (("--timeout", self.timeout_s), ("--step-timeout", self.step_timeout_s)):
            if not 0 < seconds < float("inf"):
                raise SpecError(f"{name}({seconds}) must be a positive number of seconds")
        check_out(out_dir, force=self.force)
        if self.calibrate is not None:
            from planner.writing import check_file

            check_file(self.calibrate, what="--calibrate", suffix=".json")


# validate writes this file first into its --out; a directory holding it is one validate may rewrite.
MARKER_FILE = ".planner-validate"


def check_out(out_dir: Path, *, force: bool) -> None:
    """--out: a new or empty directory, one an earlier validate wrote (it holds MARKER_FILE), or with
    --force any directory; validate replaces only the files it writes itself."""
    from planner.files import shown
    from planner.writing import check_dir

    check_dir(out_dir, force=True)
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / MARKER_FILE).is_file() and not force:
        raise SpecError(f"--out {shown(out_dir)}: directory is not empty and holds no earlier validate run; "
                        "pass --force to write into it (validate replaces its own files only), or pick another directory")


@dataclass(frozen=True)
class ValidateReport:
    slice: Slice
    notes: list[str]
    out_dir: Path
    backend: str
    device: str
    dtype: str
    launch: LaunchResult
    prediction: EstimateReport
    measured: Measured | None
    rows: list[Row]
    states: StateCheck | None
    fit: cal_mod.Fit | None
    calibration_file: Path | None

    @property
    def ok(self) -> bool:
        return self.launch.ok

    def to_json(self) -> dict[str, Any]:
        plan, job = self.slice.plan, self.slice.job
        return {
            "status": "ok" if self.ok else "failed",
            "cause": self.launch.cause,
            "plan": {"model": plan.model.name, "gpus": plan.gpus, "cluster": plan.cluster.spec.name,
                     "layout": plan.layout.to_json(), "training": plan.training.model_dump(mode="json")},
            "notes": self.notes,
            "slice": {"kind": self.slice.kind, "description": self.slice.description, "ranks": self.slice.ranks,
                      "not_measured": list(self.slice.not_measured), "model": job.model.model_dump(mode="json"),
                      "layout": job.layout.to_json(), "training": job.training.model_dump(mode="json")},
            "run": {"backend": self.backend, "device": self.device, "dtype": self.dtype, "output_dir": str(self.out_dir),
                    "command": self.launch.command, "wall_s": self.launch.wall_s, "returncode": self.launch.returncode,
                    "steps_done_per_rank": self.launch.steps_done, "killed_after_teardown": self.launch.killed,
                    "worker": "worker.py", "job": "job.json", "traces": f"{RUN_NAME}/trace_rank*.json",
                    "gpu": {"planned": plan.cluster.gpu.name, "predicted_for": job.cluster.gpu.name,
                            "ran_on": self.measured.device.get("name") if self.measured else None}},
            "prediction": self.prediction.to_json(),
            "measured": self.measured.to_json() if self.measured else None,
            "comparison": [r.to_json() for r in self.rows],
            "states_exact": self.states.to_json() if self.states else None,
            "calibration": ({**self.fit.to_json(), "file": str(self.calibration_file)} if self.fit else None),
        }


FAULT_ENV = "PLANNER_VALIDATE_FAULT"


def fault_injection() -> dict[str, Any] | None:
    """A fault to inject into the job, from the environment (tests of the failure path), e.g.
    PLANNER_VALIDATE_FAULT='{"rank": 1, "step": 1, "mode": "raise"}' (modes: raise, hang, oom, kill)."""
    raw = os.environ.get(FAULT_ENV)
    if not raw:
        return None
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as e:
        raise SpecError(f"{FAULT_ENV}: not JSON ({e.msg})") from None
    if not isinstance(doc, dict) or doc.get("mode") not in ("raise", "hang", "oom", "kill") or not isinstance(doc.get("rank"), int):
        raise SpecError(f"{FAULT_ENV}: expected {{\"rank\": R, \"step\": S, \"mode\": \"raise\"|\"hang\"|\"oom\"|\"kill\"}}")
    return doc


def _device(backend: str | None, nproc: int | None, plan_gpus: int) -> tuple[str, str, int]:
    import torch

    cuda = torch.cuda.is_available()
    backend = backend or ("nccl" if cuda else "gloo")
    if backend not in ("nccl", "gloo"):
        raise SpecError(f"--backend({backend}) must be nccl or gloo")
    if backend == "nccl" and not cuda:
        raise SpecError("--backend nccl needs CUDA GPUs and none is visible; use --backend gloo (CPU)")
    device = "cuda" if backend == "nccl" else "cpu"
    available = torch.cuda.device_count() if device == "cuda" else (os.cpu_count() or 1)
    if nproc is None:
        nproc = min(plan_gpus, available)
    if nproc < 1:
        raise SpecError(f"--nproc-per-node({nproc}) must be at least 1")
    if device == "cuda" and nproc > available:
        raise SpecError(f"--nproc-per-node({nproc}) exceeds the {available} visible GPUs")
    return backend, device, nproc


def _partial(out_dir: Path, nproc: int) -> list[list[float]]:
    """Step times each rank finished before a failure, from its progress file."""
    from planner.validate.runner import _progress

    return [[e["seconds"] for e in rows if e.get("phase") == "end"] for rows in _progress(out_dir, nproc)]


@dataclass(frozen=True)
class Predicted:
    """The cost model's prediction for the slice that ran, its rows against the measurements, and the
    notes the comparison adds (the GPU the prediction moved to, a host-bound step)."""

    slice: Slice
    estimate: EstimateReport
    rows: list[Row]
    notes: list[str]


def predict(slice_: Slice, measured: Measured | None, *, device: str, dtype: str,
            calibration: Calibration = DEFAULT) -> Predicted:
    """What follows the measurement in `planner validate`, also run on stored reports
    (benchmarks/gpu_validate.py): the prediction moves to the GPU that ran where a preset names it
    (planner/validate/device.py), is priced, and is compared term by term. Without a measurement (a
    failed run) the slice keeps its GPU and there are no rows."""
    notes: list[str] = []
    if measured is not None:
        matched = match_device(slice_, measured.device, presets.gpus())
        slice_ = matched.slice
        if matched.note:
            notes.append(matched.note)
    job = slice_.job
    estimate = EstimateReport(
        memory=MemoryReport(job=job, estimate=memory_estimate(job, headroom=DEFAULT_HEADROOM)),
        time=time_estimate(job, calibration=calibration),
    )
    table: list[Row] = []
    if measured is not None:
        table = rows(slice_, estimate.time, measured, device=device, dtype=dtype)
        host = host_bound_note(measured, estimate.time.bubble_s) if device == "cuda" else None
        if host:
            notes.append(host)
    return Predicted(slice_, estimate, table, notes)


def run_validate(
    target: str,
    *,
    cluster: str | None,
    gpus: int | None,
    training: dict[str, Any],
    layout: dict[str, Any],
    out_dir: Path,
    options: Options = Options(),
    on_progress: Callable[[int, int], None] | None = None,
) -> ValidateReport:
    options.check(out_dir)
    path = Path(target)
    if path.is_dir() and (path / "plan.json").is_file():
        model, cluster_spec, n_gpus, tr, lay = read_plan(path)
        tr = {**tr, **{k: v for k, v in training.items() if v is not None}}
        lay = {**lay, **{k: v for k, v in layout.items() if v is not None}}
    else:
        from planner.loaders import load_cluster, load_model

        if cluster is None or gpus is None:
            raise SpecError(f"{target}: give a PLAN_DIR holding plan.json, or MODEL with --cluster and --gpus")
        model, cluster_spec, n_gpus, tr, lay = load_model(target), load_cluster(cluster), gpus, training, layout
    from cost_models.rules import expert_axes_given

    expert_axes_given(model, {k: v for k, v in layout.items() if v is not None}, "--")
    plan, notes = native_job(model, cluster_spec, n_gpus, tr, lay)
    backend, device, nproc = _device(options.backend, options.nproc, plan.gpus)
    slice_ = choose_slice(plan, nproc)
    # on a GPU the timed steps run without the profiler, then as many again with it for the split
    run = run_doc(slice_.job, name=RUN_NAME, steps=options.steps, warmup=options.warmup, fp32=options.fp32,
                  unprofiled_steps=options.steps if device == "cuda" else 0)
    doc = job_doc([run], backend=backend, device=device, step_timeout_s=options.step_timeout_s, debug=options.debug)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MARKER_FILE).write_text("planner validate writes this directory (job.json, worker.py, launch.log, validate.json, ...)\n")
    emit(out_dir, doc)
    result = launch(out_dir, slice_.ranks, timeout_s=options.timeout_s, step_timeout_s=options.step_timeout_s,
                    on_progress=on_progress)
    measured = states = fit = None
    if result.ok:
        measured = measure(result.results[RUN_NAME])
    predicted = predict(slice_, measured, device=device, dtype=run["dtype"], calibration=options.calibration)
    slice_, prediction, table, notes = predicted.slice, predicted.estimate, predicted.rows, [*notes, *predicted.notes]
    job = slice_.job
    if measured is not None:
        states = check_states(slice_, measured)
        if options.calibrate is not None:
            what = f"{job.model.name}, {slice_.ranks} ranks, {device}"
            fit = cal_mod.fit(job, measured.split_steps, measured.steps_s, options.calibration, what=what)
            cal_mod.write(fit.calibration, options.calibrate)  # checked before the run (Options.check)
    report = ValidateReport(
        slice=slice_, notes=notes, out_dir=out_dir, backend=backend, device=device, dtype=run["dtype"], launch=result,
        prediction=prediction, measured=measured, rows=table, states=states, fit=fit,
        calibration_file=options.calibrate if fit else None,
    )
    doc_out = report.to_json()
    if not result.ok:
        doc_out["partial"] = {"step_times_s_per_rank": _partial(out_dir, slice_.ranks),
                              "results": {k: v for k, v in result.results.items()}}
    from planner.text import finite_json

    (out_dir / "validate.json").write_text(json.dumps(finite_json(doc_out), indent=1, default=str, allow_nan=False) + "\n")
    return report


# The share of a step the GPU may stand idle beyond the predicted bubble before validate names it: a
# chosen threshold, not a measured quantity. Measured.idle_s is the unprofiled steps' median less the
# GPU's busy time in the profiled steps, so the step-to-step spread of the unprofiled steps reaches it.
# On the two stored runs whose GPU never waits for the host (benchmarks/data/measured/
# h100-validate-gpt1.7b-full-2026-11-27c.json and h200-validate-gpt1.7b-full-2026-11-27c.json) the five
# unprofiled steps span 1.7% and 8.7% of their median (228.1-231.9 ms, 210.1-228.4 ms) and idle_s reads
# 0; a tenth lies above that spread. The host-bound one-rank 8B shares stored beside them
# (*-validate-llama8b-*-2026-11-27c.json, five runs) stand idle 30-63% of their step beyond a zero
# bubble, three times the threshold and more.
HOST_BOUND_SHARE = 0.1


def host_bound_note(measured: Measured, predicted_bubble_s: float) -> str | None:
    """A note where the GPU stood idle for more of the step than the predicted pipeline bubble, by more
    than HOST_BOUND_SHARE of the step: time the host took to launch the kernels (or waits for other
    ranks), which the cost model does not price."""
    idle = measured.idle_s
    if idle is None or idle - predicted_bubble_s <= HOST_BOUND_SHARE * measured.step_s:
        return None
    return (f"the GPU stood idle {idle * 1e3:.0f} ms of each {measured.step_s * 1e3:.0f} ms step beyond the predicted "
            f"bubble ({predicted_bubble_s * 1e3:.0f} ms): the host launching kernels one by one, or waits for other "
            "ranks; the cost model prices no host time, so a step this host-bound reads faster than measured")


# --- rendering -------------------------------------------------------------------------------------


class ProgressBar:
    """A bar of training steps done (the slowest rank's) on stderr, shown from the first step on,
    so that errors found before the job starts print alone."""

    def __init__(self, console: Any):
        self.console, self.bar, self.task = console, None, None

    def update(self, done: int, total: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        if self.bar is None:
            self.bar = Progress(TextColumn("training steps"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                console=self.console, transient=True)
            self.bar.start()
            self.task = self.bar.add_task("steps", total=total)
        self.bar.update(self.task, completed=done, total=total)

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.stop()


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if unit == "s":
        return f"{value * 1e3:,.2f} ms"
    if unit == "bytes":
        from planner.validate.runner import fmt_bytes

        return fmt_bytes(value) if value >= 2**20 else f"{int(value):,} B"
    if unit == "fraction":
        return f"{value * 100:.3g}%"
    return f"{value:,.1f}"


def render(report: ValidateReport, console: Any) -> None:
    from rich.table import Table

    s = report.slice
    console.print(f"{s.plan.model.name} on {s.plan.gpus}x {s.plan.cluster.gpu.name}: ran {s.description}")
    for note in report.notes:
        console.print(f"note: {note}")
    console.print(f"{report.backend} on {report.device}, {report.dtype}; job and traces in {report.out_dir}")
    if not report.ok:
        return
    table = Table(title="Predicted vs measured", box=None, title_justify="left")
    for col, just in (("term", "left"), ("predicted", "right"), ("measured", "right"), ("error", "right"), ("", "left")):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for r in report.rows:
        err = "—" if r.error is None else f"{r.error * 100:+.1f}%"
        table.add_row(r.term, _fmt(r.predicted, r.unit), _fmt(r.measured, r.unit), err, r.note)
    console.print(table)
    if report.states is not None:
        if report.states.ok:
            console.print(f"parameter, gradient and optimizer bytes equal the memory model on all {report.slice.ranks} ranks")
        else:
            console.print(f"state bytes differ from the memory model: {'; '.join(report.states.mismatches[:4])}")
    if report.device == "cpu":
        console.print("CPU run: times are the CPU's, compared with the cluster's GPU model; --calibrate fits the constants to them")
    if report.fit is not None:
        f = report.fit
        parts = [f"{k} {f.before[k] * 100:+.1f}% -> {f.after[k] * 100:+.1f}%" for k in f.before if k in f.after]
        held = f"{f.held_out_steps} held-out steps" if f.fit_steps and f.held_out_steps and len(report.measured.split_steps) > 1 else "the fitted steps (too few to hold some out)"
        console.print(f"calibration written to {report.calibration_file}; error on {held}: {', '.join(parts)}")
