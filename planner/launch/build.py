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
from cost_models.errors import SpecError
from planner import __version__
from planner.launch import deepspeed, megatron, slurm, torchtitan
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


def _targets(target: Target) -> str:
    fw = target.job.training.framework
    if fw is Framework.MEGATRON:
        return megatron.VERSION
    if fw is Framework.DEEPSPEED:
        return deepspeed.VERSION
    return f"torchtitan {target.options.torchtitan_version}.x"


def build_launch(report: EstimateReport, options: LaunchOptions = LaunchOptions(), *, rank: int | None = None) -> LaunchFiles:
    """All files in memory; raises SpecError for a plan the framework cannot run or express."""
    target = Target(report.job, options)
    fw = report.job.training.framework
    if fw is Framework.MEGATRON:
        files = {"train.sh": File(megatron.train_sh(target), executable=True)}
    elif fw is Framework.TORCHTITAN:
        files = torchtitan.files(target)
    else:
        files = deepspeed.files(target)
    if target.multi_node or options.slurm:
        files["job.sbatch"] = File(slurm.job_sbatch(target), executable=True)
    from planner.text import finite_json

    doc = finite_json(plan_document(target, report, rank, sorted(files) + ["README.md", "plan.json"]))
    files["plan.json"] = File(json.dumps(doc, indent=2, allow_nan=False) + "\n")
    files["README.md"] = File(readme(target, report, rank, files))
    return LaunchFiles(files=dict(sorted(files.items())), report=report, rank=rank)


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


_FILL = {
    Framework.MEGATRON: [
        ("MEGATRON_LM", "a Megatron-LM checkout (main; the flags are core 0.19 spellings)"),
        ("TOKENIZER_MODEL", "a Hugging Face tokenizer name or directory"),
        ("DATA_PATH", "the prefix(es) of Megatron's preprocessed .bin/.idx data, optionally weighted (\"0.7 a 0.3 b\")"),
        ("CHECKPOINT_DIR, SPLIT, TRAIN_ITERS, LR, MIN_LR, LR_WARMUP_ITERS, EVAL_INTERVAL, SAVE_INTERVAL",
         "optional; schedule and optimizer settings are not part of the plan"),
    ],
    Framework.TORCHTITAN: [
        ("HF_ASSETS_PATH", "the model's Hugging Face assets (tokenizer) directory"),
        ("DATASET, STEPS", "optional: a dataset torchtitan registers (default c4) and the number of steps"),
    ],
    Framework.DEEPSPEED: [
        ("TRAIN_SCRIPT", "your training script: it builds the model, calls deepspeed.initialize with "
                         "ds_config.json and accepts --deepspeed/--deepspeed_config"),
    ],
}

_ABOUT = {
    "train.sh": "runs torchrun for this node's GPUs; extra arguments are passed on to the trainer",
    "job.sbatch": "Slurm batch script: one task per node, each running train.sh, with the c10d rendezvous on the first node",
    "plan.json": "the resolved layout, the specs and the full prediction (`planner estimate --json`)",
    "ds_config.json": "DeepSpeed configuration: ZeRO stage, batch triplet, precision, buckets",
    "torchtitan.toml": "torchtitan 0.2.x job configuration, passed as --job.config_file",
    f"{torchtitan.PLAN_MODULE}.py": "torchtitan 0.3.x config function for what no flag reaches (--module torchtitan_plan --config plan_config)",
}


def readme(target: Target, report: EstimateReport, rank: int | None, files: dict[str, File]) -> str:
    job, doc = target.job, report.to_json()
    fw = job.training.framework
    t, thr, mem = doc["time"], doc["throughput"], doc["memory"]
    name = " ".join(job.model.name.split())  # one line, whatever the spec file says
    origin = f"plan #{rank} of `planner plan`" if rank is not None else "the layout given on the command line"
    lines = [
        f"# Launch: {name} on {job.gpus}x {job.cluster.gpu.name} ({fw})",
        "",
        f"Written by `planner launch` from {origin}, for {_targets(target)}.",
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
    lines += ["", "## Fill in", "", "Set these in the environment (or edit them at the top of train.sh):", ""]
    lines += [f"- `{var}`: {what}" for var, what in _FILL[fw]]
    lines += ["", "## Run", ""]
    if "job.sbatch" in files:
        lines.append("From this directory: `sbatch job.sbatch`.")
    if target.multi_node:
        lines.append(
            f"Without Slurm, run `./train.sh` on each of the {target.nnodes} nodes with `MASTER_ADDR` set to the "
            "first node's address (and the same `MASTER_PORT`, `RDZV_ID`)."
        )
    else:
        lines.append("On the node: `./train.sh` (with the variables above set).")
    return "\n".join(lines) + "\n"


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
) -> LaunchFiles:
    """Layout flags given: exactly that layout. None given: the search's plan #rank (default 1),
    with the axes in `fixes` pinned as `planner plan --fix` pins them. `flags`: as for
    planner.runners.build_job."""
    from cost_models.calibration import DEFAULT
    from planner.runners import run_estimate, run_plan

    cal = calibration or DEFAULT
    given = sorted(k for k, v in layout.items() if v is not None)
    if given:
        if rank is not None or fixes:
            what = "--rank" if rank is not None else "--fix"
            raise SpecError(f"{what} steers the search; it does not combine with layout flags ({', '.join(given)})")
        report = run_estimate(model, cluster, gpus, training=training, layout=layout, headroom=headroom, calibration=cal,
                              flags=flags)
        return build_launch(report, options)
    k = 1 if rank is None else rank
    if k < 1:
        raise SpecError(f"--rank({k}) must be at least 1")
    found = run_plan(model, cluster, gpus, training=training, fixes=fixes or [], top=k, headroom=headroom, calibration=cal)
    plans = found.plans
    if len(plans) < k:
        raise SpecError(f"--rank({k}): the search found only {len(plans)} layout(s) that fit; use --rank 1 to {len(plans)}")
    try:
        return build_launch(plans[k - 1], options, rank=k)
    except SpecError as e:
        raise SpecError(f"plan #{k} of the search cannot be launched: {e}; steer the search with --fix "
                        f"(e.g. --fix pp=1) or pick another --rank") from None
