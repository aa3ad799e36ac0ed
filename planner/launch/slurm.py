"""torchrun and Slurm: one torchrun per node with a c10d rendezvous on the first node
(shared/reference/launch_formats.md §4; torchtitan's multinode_trainer.slurm, §2.5).

Every train.sh starts the same way: its rendezvous variables (which job.sbatch exports on each
node, and which default to a one-node run on this machine), then `torchrun` with them. torchrun
numbers ranks contiguously per node (rank = node_rank·nproc_per_node + local_rank), which is what
the planner's placement of tp/cp/dp/pp groups on nodes assumes (launch_formats.md §4, §5).
"""

from __future__ import annotations

from cost_models.enums import Fabric
from cost_models.job import Job
from planner.launch.shell import Raw, Word, assign, slug, slurm_value
from planner.launch.target import Target


def layout_summary(job: Job) -> str:
    """One line of numbers and enum values (never user text): safe in a comment."""
    lay = job.layout
    parts = [
        f"tp {lay.tp}" + (" (sp)" if job.sp else ""),
        f"pp {lay.pp}" + (f" (first {lay.pp_first_stage_layers})" if lay.pp_first_stage_layers else "")
        + (f" (last {lay.pp_last_stage_layers})" if lay.pp_last_stage_layers else ""),
        f"vpp {lay.vpp}",
        f"dp {job.dp} (zero {int(job.zero)}" + (f", shard groups of {lay.dp_shard})" if lay.dp_shard != job.dp else ")"),
        f"cp {lay.cp}",
        *([f"ep {lay.ep}", f"etp {job.etp}"] if job.model.moe is not None else []),
        f"mbs {lay.mbs}",
        f"{job.num_microbatches} micro-batch" + ("es" if job.num_microbatches != 1 else ""),
        f"recompute {lay.recompute}" + (f" (first {lay.recompute_layers} layers per chunk)" if lay.recompute_layers else ""),
    ]
    return ", ".join(parts)


def script_head(target: Target, title: str, fill_in: list[str], *, run_name: bool = True) -> list[str]:
    """The start of every train.sh: what wrote it, the layout, the user's variables, the rendezvous."""
    job = target.job
    lines = [
        "#!/usr/bin/env bash",
        f"# {title}",
        f"# {job.gpus} GPUs ({target.nnodes} node(s) x {target.nproc_per_node}): {layout_summary(job)}",
        "# plan.json holds the layout, the specs and the prediction.",
        "set -euo pipefail",
        'LAUNCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        "",
        "# Fill in (or export before running):",
        *fill_in,
        "",
    ]
    if run_name:
        lines += [assign("RUN_NAME", target.run_name), ""]
    return [*lines, *rendezvous_lines(target), ""]


def rendezvous_lines(target: Target) -> list[str]:
    """Shell lines that set NNODES, NPROC_PER_NODE, MASTER_ADDR, MASTER_PORT and RDZV_ID."""
    opts = target.options
    if opts.hosts:
        master = f'MASTER_ADDR="${{MASTER_ADDR:-{_quoted_default(opts.hosts[0])}}}"'
    elif target.multi_node:
        master = 'MASTER_ADDR="${MASTER_ADDR:?set MASTER_ADDR to the first node (job.sbatch does this)}"'
    else:
        master = 'MASTER_ADDR="${MASTER_ADDR:-localhost}"'
    return [
        "# Rendezvous: job.sbatch exports these on every node; a one-node run needs none of them.",
        assign("NNODES", target.nnodes),
        assign("NPROC_PER_NODE", target.nproc_per_node),
        master,
        f'MASTER_PORT="${{MASTER_PORT:-{int(opts.port)}}}"',
        'RDZV_ID="${RDZV_ID:-planner}"',
    ]


def _quoted_default(host: str) -> str:
    # Inside "${VAR:-default}" the default is expanded as in double quotes; a host name from
    # --nodes-file is checked to hold nothing that such expansion could act on.
    return slurm_value("--nodes-file host", host)


# Sources of the variables train.sh exports or names (each may be overridden from the environment):
# - NCCL user guide, "Environment Variables" (https://docs.nvidia.com/deeplearning/nccl/user-guide/
#   docs/env.html, NCCL 2.27): NCCL_DEBUG (Debugging; WARN prints warnings and errors, the value of the
#   page's own nccl.conf example), NCCL_SOCKET_IFNAME (System configuration; unset, NCCL picks an
#   interface itself, skipping lo and docker*, favouring ib*), NCCL_IB_HCA (which RDMA adapters and
#   ports), NCCL_IB_DISABLE (only set to 1 does NCCL leave its IB/RoCE transport for IP sockets),
#   NCCL_IB_GID_INDEX (default -1: the GID with RoCE v2 support on an Ethernet link layer) and
#   NCCL_BUFFSIZE (the buffer each pair of ranks communicates through).
# - AWS EFA: torchtitan's multinode_trainer.slurm (pytorch/torchtitan@030cd95d, "optimized for AWS with
#   EFA", L8-10), which exports FI_PROVIDER="efa" (L34), NCCL_DEBUG=WARN (L40), LD_LIBRARY_PATH=
#   /opt/amazon/efa/lib:… (L46, the EFA installer's libfabric), NCCL_BUFFSIZE=2097152 (L53; L9-10: adjust
#   it under memory pressure) and FI_EFA_SET_CUDA_SYNC_MEMOPS=0 (L55). FI_PROVIDER lists the libfabric
#   providers to use (libfabric man/fabric.7.md L272-277, ofiwg/libfabric@af8ddbe9).
#   FI_EFA_SET_CUDA_SYNC_MEMOPS (default 1: the EFA
#   provider set CU_POINTER_ATTRIBUTE_SYNC_MEMOPS on every registered CUDA buffer) exists from libfabric
#   v1.17.0 (commit 91b7634c) to v1.19; v1.20.0 removed it (commit bc6c52c1) and only logs that it is
#   deprecated when set (prov/efa/src/efa_env.c info_deprecated_env_vars, L79 at af8ddbe9), so it is
#   kept for older EFA installs and harmless on newer ones.


def environment_lines(target: Target) -> list[str]:
    """NCCL settings every launch exports, and those the cluster's fabric needs (sources above).
    NCCL finds the InfiniBand / RoCE adapters and the bootstrap interface itself; NCCL_SOCKET_IFNAME
    and NCCL_IB_HCA, set before running, pin them."""
    lines = [
        "# NCCL: warnings and errors in the log; NCCL_SOCKET_IFNAME / NCCL_IB_HCA, if set, pin the interfaces.",
        'export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"',
    ]
    fabric = target.job.cluster.spec.fabric
    if fabric is Fabric.INFINIBAND:
        lines.append("# Fabric: InfiniBand. NCCL uses its IB transport unasked; NCCL_IB_HCA selects adapters if needed.")
    elif fabric is Fabric.ROCE:
        lines.append("# Fabric: RoCE. NCCL's IB transport picks each port's RoCE v2 GID (NCCL_IB_GID_INDEX=-1); "
                     "set NCCL_IB_GID_INDEX if your GID table needs another.")
    elif fabric is Fabric.EFA:
        lines += [
            "# Fabric: AWS EFA, through the aws-ofi-nccl plugin (torchtitan's multinode_trainer.slurm settings;",
            "# FI_EFA_SET_CUDA_SYNC_MEMOPS matters to libfabric before 1.20 only).",
            'export FI_PROVIDER="${FI_PROVIDER:-efa}"',
            'export FI_EFA_SET_CUDA_SYNC_MEMOPS="${FI_EFA_SET_CUDA_SYNC_MEMOPS:-0}"',
            'export NCCL_BUFFSIZE="${NCCL_BUFFSIZE:-2097152}"',
            'export LD_LIBRARY_PATH="/opt/amazon/efa/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"',
        ]
    return [*lines, ""]


def torchrun_head() -> list[Word]:
    """`torchrun` with the rendezvous variables (torch/distributed/run.py flags, launch_formats.md §4)."""
    return [
        "torchrun",
        "--nnodes", Raw('"$NNODES"'),
        "--nproc-per-node", Raw('"$NPROC_PER_NODE"'),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", Raw('"$MASTER_ADDR:$MASTER_PORT"'),
        "--rdzv-id", Raw('"$RDZV_ID"'),
    ]


def job_sbatch(target: Target, script: str = "train.sh") -> str:
    """One Slurm task per node, each running train.sh (which runs torchrun for that node's GPUs)."""
    opts = target.options
    name = slurm_value("--job-name", opts.job_name) if opts.job_name else slug(target.run_name)
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --nodes={target.nnodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={target.nproc_per_node}",
        "#SBATCH --exclusive",
    ]
    for flag, value in (("partition", opts.partition), ("account", opts.account), ("time", opts.time)):
        if value is not None:
            lines.append(f"#SBATCH --{flag}={slurm_value('--' + flag, value)}")
    if opts.hosts:
        lines.append(f"#SBATCH --nodelist={','.join(slurm_value('--nodes-file host', h) for h in opts.hosts)}")
    lines += [
        f"# {layout_summary(target.job)}",
        "# Submit from this directory: sbatch job.sbatch",
        "set -euo pipefail",
        'cd "${SLURM_SUBMIT_DIR:?run with sbatch from the launch directory}"',
        "",
        "# The first node hosts the c10d rendezvous (torchtitan multinode_trainer.slurm).",
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "MASTER_ADDR=$(srun --nodes=1 --ntasks=1 -w \"$head_node\" hostname --ip-address | awk '{print $1}')",
        "export MASTER_ADDR",
        f"export MASTER_PORT={int(opts.port)}",
        'export RDZV_ID="$SLURM_JOB_ID"',
        "",
        "# One torchrun per node.",
        f"srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash ./{script}",
        "",
    ]
    return "\n".join(lines)
