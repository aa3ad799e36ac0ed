"""`planner launch` as library functions: the files that run one plan on a framework.

`run_launch` resolves the layout (the flags given, or plan #K of the search), `build_launch` turns
it into files in memory (plan.json, README.md, the framework's train.sh and configs, job.sbatch for
several nodes), and `write_launch` puts them into the output directory all at once: into a fresh
directory beside it, renamed into place, so an error never leaves half a launch behind.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cost_models.enums import Framework
from cost_models.errors import LayoutError, SpecError
from cost_models.job import Job
from planner import __version__
from planner.launch import deepspeed, kubernetes, megatron, slurm, torchtitan
from planner.launch.options import LaunchOptions, MegatronFsdp, TitanVersion
from planner.launch.target import File, Target
from planner.runners import EstimateReport

__all__ = [
    "File", "LaunchFiles", "LaunchOptions", "MegatronFsdp", "TitanVersion", "build_launch", "read_nodes_file",
    "run_launch", "write_launch",
]

GiB = 1024**3


@dataclass(frozen=True)
class LaunchFiles:
    """Every file of a launch directory, by name, with the plan it was made from."""

    files: dict[str, File]
    report: EstimateReport
    rank: int | None  # the plan's rank in the search, None for a layout given by flags
    unproven: str = ""  # why the search's rank is not proven (it stopped at its time limit), "" where it is


def _targets(target: Target) -> str:
    fw = target.job.training.framework
    if fw is Framework.MEGATRON:
        return megatron.VERSION
    if fw is Framework.DEEPSPEED:
        return deepspeed.VERSION
    return f"torchtitan {target.options.torchtitan_version}.x"


def checkpoint_steps(report: EstimateReport) -> tuple[int, float]:
    """Steps between checkpoints, and the minutes they stand for: Daly's optimum interval
    (cost_models/reliability.py, the "checkpoint every" of `planner estimate`) over the predicted
    step time, rounded to the nearest step and at least 1."""
    interval_s = report.reliability.interval_s
    return max(1, round(interval_s / report.time.step_s)), interval_s / 60


def check_hf_source(job: Job) -> None:
    """Refuse a model read from a Hugging Face config.json that sets what the spec does not carry,
    where the launch would train another model: GPT-NeoX's parallel residual (default true in
    transformers' GPTNeoXConfig) for Megatron, whose layers add attention and MLP one after the
    other. DeepSpeed's config.json is a gpt_neox config, whose default keeps the parallel residual.
    (Sliding windows are the spec's own: planner/hf.py reads them, the emitters carry them.)"""
    from planner.files import read_mapping
    from planner.hf import is_hf_config

    m = job.model
    path = Path(m.source)
    try:
        data = read_mapping(path) if m.source.endswith(".json") and path.is_file() else None
    except (SpecError, OSError):
        data = None
    if not data or not is_hf_config(data):
        return
    if (data.get("model_type") == "gpt_neox" and data.get("use_parallel_residual", True)
            and job.training.framework is Framework.MEGATRON):
        raise SpecError(
            f"model {m.name!r}: config.json sets use_parallel_residual (attention and MLP from the same input); "
            "Megatron's GPT layers add them one after the other; use --framework deepspeed"
        )


def launch_refusal(job: Job, options: LaunchOptions = LaunchOptions()) -> SpecError | None:
    """Why `planner launch` would refuse this job with these options, or None: the framework
    emitter's own check, so that `plan` never ranks a layout its launch then refuses. A LayoutError
    refuses the layout; any other SpecError refuses the model or the training settings, whatever
    the layout."""
    target = Target(job, options)
    check = {Framework.MEGATRON: megatron.check, Framework.TORCHTITAN: torchtitan.check,
             Framework.DEEPSPEED: deepspeed.check}[job.training.framework]
    try:
        check(target)
    except SpecError as e:
        return e
    return None


def settings_refusal(model: Any, cluster: Any, training: Any, options: LaunchOptions = LaunchOptions()) -> SpecError | None:
    """What `planner launch` refuses of the model or the training settings, whatever the layout
    (launch_refusal of the plain layout, where it is not a LayoutError), or None: said before a
    search rather than after it. A problem the rules refuse (rules.problem_violations) is left to the
    search, which says it in its own words."""
    from cost_models.rules import fill_defaults, problem_violations
    from cost_models.layout import Layout

    try:
        if problem_violations(model, cluster, training):
            return None
        refused = launch_refusal(fill_defaults(model, cluster, training, Layout()), options)
    except SpecError:
        return None
    return None if refused is None or isinstance(refused, LayoutError) else refused


def single_axes(job: Job, options: LaunchOptions = LaunchOptions()) -> dict[str, str]:
    """The layout axes `planner launch` with these options runs only at 1 for this model and training,
    each with its refusal ({} the degree): the search keeps them at 1 (planner.space.Problem)."""
    target = Target(job, options)
    emitter = {Framework.MEGATRON: None, Framework.TORCHTITAN: torchtitan, Framework.DEEPSPEED: deepspeed}[job.training.framework]
    return {} if emitter is None else emitter.single_axes(target)


def build_launch(report: EstimateReport, options: LaunchOptions = LaunchOptions(), *, rank: int | None = None,
                 unproven: str = "") -> LaunchFiles:
    """All files in memory; raises SpecError for a plan the framework cannot run or express. `unproven`:
    why plan #rank is not proven to be that (LaunchFiles.unproven), said in README.md."""
    check_hf_source(report.job)
    steps, minutes = checkpoint_steps(report)
    target = Target(report.job, options, save_interval=steps, checkpoint_minutes=minutes)
    fw = report.job.training.framework
    if fw is Framework.MEGATRON:
        files = {"train.sh": File(megatron.train_sh(target), executable=True)}
    elif fw is Framework.TORCHTITAN:
        files = torchtitan.files(target)
    else:
        files = deepspeed.files(target)
    if target.multi_node or options.slurm:
        files["job.sbatch"] = File(slurm.job_sbatch(target), executable=True)
        files["job.yaml"] = File(kubernetes.job_yaml(target))
    from planner.text import finite_json

    doc = finite_json(plan_document(target, report, rank, sorted(files) + ["README.md", "plan.json"]))
    files["plan.json"] = File(json.dumps(doc, indent=2, allow_nan=False) + "\n")
    files["README.md"] = File(readme(target, report, rank, files, unproven))
    return LaunchFiles(files=dict(sorted(files.items())), report=report, rank=rank, unproven=unproven)


def plan_document(target: Target, report: EstimateReport, rank: int | None, names: list[str]) -> dict[str, Any]:
    """plan.json: the resolved layout, the specs and the full prediction (`planner estimate --json`)."""
    job = target.job
    return {
        "planner": __version__,
        "framework": str(job.training.framework),
        "target": _targets(target),
        "rank": rank,
        "files": sorted(names),
        "nodes": target.nnodes,
        "gpus_per_node": target.nproc_per_node,
        "layout": report.to_json()["layout"],
        "specs": {
            "model": job.model.model_dump(mode="json"),
            "cluster": job.cluster.spec.model_dump(mode="json"),
            "gpus": job.gpus,
            "training": job.training.model_dump(mode="json"),
        },
        "prediction": report.to_json(),
    }


_CHECKPOINT = ("CHECKPOINT_DIR", "a directory every node can write: checkpoints are saved there every SAVE_INTERVAL steps "
                                 "and the run resumes from the latest one")
_SAVE = ("SAVE_INTERVAL", "optional; defaults to the plan's checkpoint interval in steps (see Checkpoints)")
_FILL = {
    Framework.MEGATRON: [
        ("MEGATRON_LM", "a Megatron-LM checkout (main; the flags are core 0.19 spellings)"),
        ("TOKENIZER_MODEL", "a Hugging Face tokenizer name or directory"),
        ("DATA_PATH", "the prefix(es) of Megatron's preprocessed .bin/.idx data, optionally weighted (\"0.7 a 0.3 b\")"),
        _CHECKPOINT,
        _SAVE,
        ("SPLIT, TRAIN_ITERS, LR, MIN_LR, LR_WARMUP_ITERS, EVAL_INTERVAL",
         "optional; schedule and optimizer settings are not part of the plan"),
    ],
    Framework.TORCHTITAN: [
        ("HF_ASSETS_PATH", "the model's Hugging Face assets (tokenizer) directory"),
        _CHECKPOINT,
        _SAVE,
        ("DATASET, STEPS", "optional: a dataset torchtitan registers (default c4) and the number of steps"),
    ],
    Framework.DEEPSPEED: [
        ("TOKENIZER_MODEL", "the Hugging Face tokenizer the data was made with (train.py checks it fits the vocabulary)"),
        ("DATA_PATH", "a flat binary file of token ids, numpy dtype DATA_DTYPE (default uint32)"),
        _CHECKPOINT,
        _SAVE,
        ("TRAIN_ITERS, LR", "optional; schedule and optimizer settings are not part of the plan"),
    ],
}

_ABOUT = {
    "train.sh": "runs torchrun for this node's GPUs; extra arguments are passed on to the trainer",
    "job.sbatch": "Slurm batch script: one task per node, each running train.sh, with the c10d rendezvous on the first node",
    "job.yaml": "Kubernetes: a Kubeflow PyTorchJob (kubeflow.org/v1), one pod per node running train.sh from a ConfigMap of this directory",
    "plan.json": "the resolved layout, the specs and the full prediction (`planner estimate --json`)",
    "ds_config.json": "DeepSpeed configuration: ZeRO stage, batch triplet, precision, buckets",
    "config.json": "the model as a Hugging Face config.json (read back by the planner's importer to the planned model, field for field)",
    "train.py": "the DeepSpeed training script: builds the model of config.json, turns on the plan's recompute, trains on DATA_PATH and checkpoints "
                "(`./train.sh --mock-data --train-iters 2`, with TOKENIZER_MODEL and DATA_PATH set to anything, is a smoke test on random tokens)",
    "torchtitan.toml": "torchtitan 0.2.x job configuration, passed as --job.config_file",
    f"{torchtitan.PLAN_MODULE}.py": "torchtitan 0.3.x config function for what no flag reaches (--module torchtitan_plan --config plan_config)",
}


def readme(target: Target, report: EstimateReport, rank: int | None, files: dict[str, File], unproven: str = "") -> str:
    job, doc = target.job, report.to_json()
    fw = job.training.framework
    t, thr, mem = doc["time"], doc["throughput"], doc["memory"]
    name = " ".join(job.model.name.split())  # one line, whatever the spec file says
    origin = f"plan #{rank} of `planner plan`" if rank is not None else "the layout given on the command line"
    lines = [
        f"# Launch: {name} on {job.gpus}x {job.cluster.gpu.name} ({fw})",
        "",
        f"Written by `planner launch` from {origin}, for {_targets(target)}." + (f" Not proven: {unproven}." if unproven else ""),
        "",
        "## Layout",
        "",
        slurm.layout_summary(job) + f"; global batch {job.training.global_batch_size} sequences of {job.training.seq_len} tokens, "
        f"{job.training.precision}; {target.nnodes} node(s) of {target.nproc_per_node} GPUs.",
        "",
        "## What the plan predicts",
        "",
        f"- step time {t['step_s']:.3f} s (critical pipeline rank {t['critical_stage']}), bottleneck: {doc['bottleneck']}",
        f"- {thr['tokens_per_s']:,.0f} tokens/s, {thr['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU, "
        f"{thr['model_tflops_per_gpu']:.0f} model TFLOP/s per GPU, MFU {thr['mfu']:.1%}, HFU {thr['hfu']:.1%}",
        f"- peak memory {mem['peak_bytes'] / GiB:.2f} GiB per GPU (pipeline rank {mem['peak_stage']}) of "
        f"{mem['capacity_bytes'] / GiB:.2f} GiB: {'fits' if mem['fits'] else 'does NOT fit'} "
        f"(usable {mem['usable_bytes'] / GiB:.2f} GiB at {mem['headroom']:.0%} headroom)",
        "",
        "## Files",
        "",
    ]
    lines += [f"- `{f}`: {_ABOUT[f]}" for f in sorted([*files, "README.md"]) if f in _ABOUT]
    lines += ["", "## Fill in", "", "Set these in the environment (or edit them at the top of train.sh); "
              "train.sh stops with a message naming any required one left unset:", ""]
    lines += [f"- `{var}`: {what}" for var, what in _FILL[fw]]
    lines += ["", "## Checkpoints", "",
              f"Every {target.save_interval} steps (`SAVE_INTERVAL`): the plan's checkpoint interval, Daly's optimum for "
              f"this job's failure rate and checkpoint write time ({target.checkpoint_minutes or 0:.1f} min), over its "
              f"predicted step time ({t['step_s']:.3f} s). The run resumes from the latest checkpoint in `CHECKPOINT_DIR`."]
    lines += ["", "## What the framework builds", "", *model_notes(target)]
    lines += ["", "## Run", ""]
    if "job.sbatch" in files:
        lines.append("From this directory: `sbatch job.sbatch`.")
        lines.append(f"On Kubernetes with the Kubeflow Training Operator: `kubectl create configmap {kubernetes.name(target)}-launch "
                     "--from-file=.`, set the image and the empty env values in job.yaml, then `kubectl apply -f job.yaml`.")
    if target.multi_node:
        lines.append(
            f"Without Slurm, run `./train.sh` on each of the {target.nnodes} nodes with `MASTER_ADDR` set to the "
            "first node's address (and the same `MASTER_PORT`, `RDZV_ID`)."
        )
    else:
        lines.append("On the node: `./train.sh` (with the variables above set).")
    return "\n".join(lines) + "\n"


def model_notes(target: Target) -> list[str]:
    """How the planned model reaches the framework, in the README."""
    job, fw = target.job, target.job.training.framework
    m = job.model
    rope = (f"rotary base {m.rope_theta:g}" + (f", Llama-3.1 rope scaling x{m.rope_scaling.factor:g}" if m.rope_scaling else "")
            if m.position_embedding == "rope" else f"{m.position_embedding} positions")
    moe = ""
    if m.moe is not None:
        moe = (f"; router top-{m.moe.top_k} of {m.moe.num_experts} ({m.moe.router_score}), load-balancing coefficient "
               f"{m.moe.aux_loss_coef:g}")
    facts = f"{rope}, {m.norm} epsilon {m.norm_eps:g}" + (", qk-norm" if m.qk_norm else "") + moe
    if fw is Framework.MEGATRON:
        return [f"train.sh's MODEL_ARGS carry the model: {facts}; recompute and sharding flags are in PARALLEL_ARGS."]
    if fw is Framework.DEEPSPEED:
        how = ("`model.gradient_checkpointing_enable()` (full recompute)" if job.layout.recompute == "full"
               else "no activation checkpointing (the plan's recompute is " + str(job.layout.recompute) + ")")
        return [f"train.py builds `AutoModelForCausalLM.from_config(config.json)` ({facts}) and calls {how}."]
    entry = torchtitan.titan_model(target)
    if target.options.torchtitan_model is not None:
        return [f"torchtitan's registry entry `{target.options.torchtitan_model}` as named by --torchtitan-model; "
                f"the planned model is {facts} and was not compared with it."]
    if entry.generated:
        return [f"no torchtitan flavour equals the planned model ({facts}): torchtitan_plan.py generates its model config "
                f"with torchtitan's llama3 builders, inside `{entry.config}()`'s trainer settings."]
    out = [f"torchtitan's built-in flavour `{entry.module}` `{entry.flavor}`, which equals the planned model "
           f"({facts}): the planner's preset `{entry.preset}` of the same fields."]
    if m.moe is not None:
        out.append(f"Except load balancing: torchtitan balances the experts {torchtitan.TITAN_BALANCING}, not with the "
                   f"auxiliary loss of coefficient {m.moe.aux_loss_coef:g} that the model's Hugging Face config names.")
    return out


# --- writing ------------------------------------------------------------------------------------


def write_launch(launch: LaunchFiles, out: Path, *, force: bool = False) -> list[Path]:
    """Write every file into `out`, all or nothing (planner.writing.write_dir). A non-empty `out`
    needs force (it is replaced)."""
    from planner.writing import write_dir

    out = Path(out)
    write_dir(out, {name: (f.text.encode("utf-8"), 0o755 if f.executable else 0o644) for name, f in launch.files.items()},
              force=force)
    return [out / name for name in launch.files]


# A host name or address: letters, digits, '.', '-', '_' and ':' (IPv6), not starting with '-'
# (train.sh and srun would read it as an option).
_HOST = re.compile(r"[A-Za-z0-9_.:\[\]][A-Za-z0-9_.:\[\]-]*")
MAX_HOSTS = 1 << 16


def read_nodes_file(path: Path) -> tuple[str, ...]:
    """Host names, one a line; blank lines and # comments skipped; each host once."""
    from planner.files import read_text, shown

    hosts: dict[str, int] = {}  # host -> its line
    where = f"--nodes-file {shown(path)}"
    for number, line in enumerate(read_text(Path(path)).splitlines(), 1):
        host = line.split("#", 1)[0].strip()
        if not host:
            continue
        host = host.split()[0]
        if not _HOST.fullmatch(host) or len(host) > 253:
            raise SpecError(f"{where}: line {number}: {shown(host)!r} is not a host name (letters, digits, '.', '-', '_', ':'; "
                            "not starting with '-'; at most 253 characters)")
        if host in hosts:
            raise SpecError(f"{where}: line {number}: host {host!r} is listed already on line {hosts[host]}; "
                            "each node runs one train.sh, list it once")
        hosts[host] = number
        if len(hosts) > MAX_HOSTS:
            raise SpecError(f"{where}: more than {MAX_HOSTS:,} hosts")
    if not hosts:
        raise SpecError(f"{where}: lists no hosts")
    return tuple(hosts)


# --- the runner ---------------------------------------------------------------------------------


def run_launch(
    model: str,
    cluster: str,
    gpus: int,
    *,
    training: dict[str, Any],
    layout: dict[str, Any],
    rank: int | None = None,
    fixes: list[str] | None = None,
    options: LaunchOptions = LaunchOptions(),
    headroom: float | None = None,
    calibration: Any = None,
    flags: bool = False,
    time_limit_s: float | None = None,
) -> LaunchFiles:
    """Layout flags given: exactly that layout. None given: the search's plan #rank (default 1),
    with the axes in `fixes` pinned as `planner plan --fix` pins them, within `time_limit_s` (None: the
    search's default). `flags`: as for planner.runners.build_job."""
    from cost_models.calibration import DEFAULT
    from planner.runners import SEARCH_TIME_LIMIT_S, load_specs, run_estimate, run_plan

    cal = calibration or DEFAULT
    given = sorted(k for k, v in layout.items() if v is not None)
    if given:
        if rank is not None or fixes or time_limit_s is not None:
            what = "--rank" if rank is not None else "--fix" if fixes else "--time-limit"
            raise SpecError(f"{what} steers the search; it does not combine with layout flags ({', '.join(given)})")
        report = run_estimate(model, cluster, gpus, training=training, layout=layout, headroom=headroom, calibration=cal,
                              flags=flags)
        return build_launch(report, options)
    k = 1 if rank is None else rank
    if k < 1:
        raise SpecError(f"--rank({k}) must be at least 1")
    refused = settings_refusal(*load_specs(model, cluster, gpus, training), options)
    if refused is not None:
        raise SpecError(f"no plan of the search can be launched: {refused}")
    found = run_plan(model, cluster, gpus, training=training, fixes=fixes or [], top=k, headroom=headroom, calibration=cal,
                     launch=options, time_limit_s=time_limit_s)
    plans = found.plans
    if len(plans) < k:
        raise SpecError(f"--rank({k}): the search found only {len(plans)} layout(s) that fit; use --rank 1 to {len(plans)}")
    r = found.result
    unproven = "" if r.optimal else (
        f"the search stopped at its {time_limit_s or SEARCH_TIME_LIMIT_S:g} s time limit after scoring {r.candidates} "
        f"layouts, so a faster one may exist; raise --time-limit or pin axes with --fix")
    try:
        return build_launch(plans[k - 1], options, rank=k, unproven=unproven)
    except LayoutError as e:
        raise SpecError(f"plan #{k} of the search cannot be launched: {e}; steer the search with --fix "
                        f"(e.g. --fix pp=1) or pick another --rank") from None
    except SpecError as e:  # the model or the training settings (launch_refusal): no layout helps
        raise SpecError(f"no plan of the search can be launched: {e}") from None
