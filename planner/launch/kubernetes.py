"""Kubernetes: job.yaml, a Kubeflow Training Operator `PyTorchJob` (kubeflow.org/v1) that runs the
same train.sh as job.sbatch, one pod per node.

What the operator does with it (kubeflow/training-operator at commit
ee1162919408cbca4a899f2916cfcd0ecd562881, the last before the v1 sources moved out):
pkg/controller.v1/pytorch/envvar.go sets MASTER_ADDR (the Master pod's service) and MASTER_PORT
(the container port named `pytorchjob-port`) in every pod of a job with a Master replica, and
PET_NNODES to the number of replicas; pkg/apis/kubeflow.org/v1/pytorch_types.go names the container
it manages `pytorch` and the port `pytorchjob-port`. train.sh's torchrun then meets on
MASTER_ADDR:MASTER_PORT with the c10d rendezvous, as under Slurm.

The launch directory reaches the pods as a ConfigMap mounted at /launch
(`kubectl create configmap NAME-launch --from-file=.` in the launch directory); the required
variables are listed empty, so train.sh stops naming any not filled in.
"""

from __future__ import annotations

import json

from cost_models.enums import Fabric, Framework
from planner.launch.shell import slug
from planner.launch.target import Target

API_VERSION = "kubeflow.org/v1"
CONTAINER = "pytorch"  # PyTorchJobDefaultContainerName
PORT_NAME = "pytorchjob-port"  # PyTorchJobDefaultPortName
MOUNT = "/launch"
IMAGE = "REPLACE-WITH-YOUR-TRAINING-IMAGE"

REQUIRED = {
    Framework.MEGATRON: ("MEGATRON_LM", "TOKENIZER_MODEL", "DATA_PATH", "CHECKPOINT_DIR"),
    Framework.TORCHTITAN: ("HF_ASSETS_PATH", "CHECKPOINT_DIR"),
    Framework.DEEPSPEED: ("TOKENIZER_MODEL", "DATA_PATH", "CHECKPOINT_DIR"),
}


def name(target: Target) -> str:
    """A DNS-1123 name (lower case, digits, '-'), as Kubernetes object names must be."""
    base = target.options.job_name or target.run_name
    out = "".join(c if c.isalnum() else "-" for c in slug(base).lower()).strip("-")[:40].strip("-")
    return out or "planner"


def _devices(target: Target) -> dict[str, int]:
    """Device-plugin resources per pod: the node's GPUs (NVIDIA device plugin), and for EFA the
    node's EFA devices (aws-efa-k8s-device-plugin's vpc.amazonaws.com/efa). InfiniBand and RoCE
    device plugins name their resources per deployment (an RDMA shared-device or SR-IOV resource
    name of the cluster's choosing), so none is requested for them."""
    out = {"nvidia.com/gpu": target.nproc_per_node}
    spec = target.job.cluster.spec
    if spec.fabric is Fabric.EFA:
        assert spec.efa_devices_per_node is not None
        out["vpc.amazonaws.com/efa"] = spec.efa_devices_per_node
    return out


def _replica(target: Target, job_name: str, replicas: int) -> dict:
    # The pod's environment: train.sh's required variables (its `${VAR:?…}` lines, empty here to be
    # filled in) and RDZV_ID, torchrun's --rdzv-id (launch_formats.md §4), the same in every pod of
    # the job. MASTER_ADDR / MASTER_PORT come from the operator (module docstring); the NCCL and
    # fabric variables from train.sh itself (slurm.py environment_lines, with their sources).
    env = [{"name": var, "value": ""} for var in REQUIRED[target.job.training.framework]]
    env.append({"name": "RDZV_ID", "value": job_name})
    container = {
        "name": CONTAINER,
        "image": IMAGE,
        "command": ["bash", f"{MOUNT}/train.sh"],
        "env": env,
        "ports": [{"name": PORT_NAME, "containerPort": int(target.options.port)}],
        "resources": {"limits": _devices(target)},
        "volumeMounts": [{"name": "launch", "mountPath": MOUNT}, {"name": "dshm", "mountPath": "/dev/shm"}],
    }
    return {
        "replicas": replicas,
        "restartPolicy": "OnFailure",
        "template": {
            "spec": {
                "containers": [container],
                "volumes": [
                    {"name": "launch", "configMap": {"name": f"{job_name}-launch", "defaultMode": 0o755}},
                    # /dev/shm as memory without the container runtime's 64 MiB cap (Docker's default
                    # --shm-size 64m, docs.docker.com "docker container run"; Kubernetes "Volumes",
                    # emptyDir medium Memory): NCCL's SHM transport between ranks of a pod and torch's
                    # data-loader workers allocate there.
                    {"name": "dshm", "emptyDir": {"medium": "Memory"}},
                ],
            }
        },
    }


def manifest(target: Target) -> dict:
    job_name = name(target)
    specs = {"Master": _replica(target, job_name, 1)}
    if target.nnodes > 1:
        specs["Worker"] = _replica(target, job_name, target.nnodes - 1)
    return {
        "apiVersion": API_VERSION,
        "kind": "PyTorchJob",
        "metadata": {"name": job_name},
        "spec": {
            "nprocPerNode": str(target.nproc_per_node),
            "runPolicy": {"cleanPodPolicy": "None", "backoffLimit": 3},
            "pytorchReplicaSpecs": specs,
        },
    }


def job_yaml(target: Target) -> str:
    """YAML text; JSON is YAML, and json.dumps quotes every string, so no value can change the structure."""
    head = [
        f"# Kubeflow PyTorchJob ({API_VERSION}) written by planner launch: {target.nnodes} pod(s) of {target.nproc_per_node} GPUs,",
        "# each running train.sh from the ConfigMap NAME-launch. Before `kubectl apply -f job.yaml`:",
        "#   kubectl create configmap " + name(target) + "-launch --from-file=.   (in this directory)",
        "# and set the image and the empty env values below (train.sh names any left empty).",
    ]
    return "\n".join(head) + "\n" + json.dumps(manifest(target), indent=2) + "\n"
