"""GPU, node, network and cluster specs (SI units; files may use suffixed human units)."""

from __future__ import annotations

from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from cost_models.enums import Fabric, ScaleupTopology
from cost_models.errors import SpecError
from cost_models.model_spec import Count, Name, Spec
from cost_models.units import to_si


# Physical ranges of the hardware numbers, wide enough for any real device and narrow enough that
# every time the model derives from them stays finite (zero, 1e-300 or 1e300 broke the search).
# Rates: 1 GFLOP/s (a CPU core) to 1 EFLOP/s (over 200x a B200's dense fp8, 4.5 PFLOP/s in presets/gpus.toml).
FlopRate = Annotated[float, Field(ge=1e9, le=1e18)]
# Bandwidths: 1 Gbit/s (the slowest Ethernet a cluster is built of) to 1 PB/s (over 100x a B200's 8 TB/s HBM3e).
MIN_BANDWIDTH_BYTES_PER_S = 1e9 / 8
Bandwidth = Annotated[float, Field(ge=MIN_BANDWIDTH_BYTES_PER_S, le=1e15)]
# Latencies: the presets' per-hop constants are 2.1-14 us (NCCL/RCCL hwLatencies, presets/clusters.toml;
# RCCL's slowest NET entry is 320 us); 1 ms is 3x that.
Latency = Annotated[float, Field(ge=0, le=1e-3)]
# Memory: up to 16 TiB per device (2^44 bytes; the largest GPU preset, GB300, holds 278 GiB).
HbmBytes = Annotated[int, Field(gt=0, le=2**44)]


class _SIFromHuman(Spec):
    """Accepts `hbm_gib`-style keys and converts them with `cost_models.units.to_si`."""

    @model_validator(mode="before")
    @classmethod
    def _units(cls, data: Any) -> Any:
        return to_si(data) if isinstance(data, dict) else data

    @cached_property
    def hash_key(self) -> int:
        """The hash of every field, taken once. The kernel and collective prices cache on the GPU and
        cluster specs (cost_models.kernels, comm.collective_time) in the search's inner loops, where
        pydantic's own hash of a frozen model walks every field and nested spec again on each call."""
        return hash(tuple(getattr(self, name) for name in type(self).model_fields))

    def __hash__(self) -> int:
        return self.hash_key


class PeakFlops(_SIFromHuman):
    """Dense (no structured sparsity) tensor-core peaks per operand type, FLOP/s."""

    fp32: FlopRate
    tf32: FlopRate | None = None
    bf16: FlopRate
    fp16: FlopRate
    fp8: FlopRate | None = None
    fp4: FlopRate | None = None


class MatmulMeasurement(_SIFromHuman):
    """One published GEMM timing on this GPU: operand type, (M, N, K), FLOP/s, how long the GEMM
    ran before it was timed, and who measured it.

    `regime` "burst": timed within a fraction of a second of starting (the SM clock still at or
    near boost); "sustained": timed after the GPU has run the GEMM long enough to sit at its power
    limit, the clock a training step runs at. `shape` None: the best of a shape search (MAMF,
    MSMF), which lands on a shape the library's kernel tiles without loss, so the rate is taken as
    the ceiling itself (the shape it found, where published, is in `by`)."""

    dtype: Literal["bf16", "fp16", "fp8", "fp4"]
    shape: tuple[Count, Count, Count] | None = None
    rate_flop_per_s: FlopRate
    regime: Literal["burst", "sustained"] = "burst"
    by: str = ""


class GPUSpec(_SIFromHuman):
    name: Name
    vendor: str = ""
    # GPU generation ("ampere", "hopper", "blackwell", ...): picks the kernel table
    # (presets/kernels/<architecture>.toml) and the per-architecture corrections of a calibration file
    architecture: str = ""
    # CUDA compute capability (major, minor), as torch.cuda.get_device_capability reports it; frameworks
    # branch on its major version (Megatron-LM's get_device_arch_version: 8 Ampere, 9 Hopper, 10 Blackwell)
    compute_capability: tuple[int, int]
    hbm_bytes: HbmBytes  # capacity a framework can allocate from (see presets for what each counts)
    hbm_bandwidth_bytes_per_s: Bandwidth
    peak_flop_per_s: PeakFlops
    # streaming multiprocessors (NVIDIA) or compute units (AMD): how many GEMM tiles or attention
    # blocks run at once, which sets tile and wave quantisation (cost_models.kernels)
    sm_count: Count | None = None
    # published GEMM timings (cost_models.kernels anchors every GEMM on them); a GPU without them
    # takes its generation's reference GPU's ratio of tensor-core ceiling to datasheet peak
    matmul: tuple[MatmulMeasurement, ...] = ()
    # the names the device reports for this GPU (torch.cuda.get_device_name, NVML's product name as
    # nvidia-smi prints it): how planner validate knows which preset a run's GPU is
    device_names: tuple[Annotated[str, Field(min_length=1, max_length=256)], ...] = ()
    source: str = ""

    @property
    def before_blackwell(self) -> bool:
        """Compute capability major below 10, Megatron-LM's test for the CUDA_DEVICE_MAX_CONNECTIONS=1
        requirement of tp and cp (Megatron-LM@d98e8a64 arguments.py L1453-1454, get_device_arch_version
        in training/utils/common_utils.py L527-529)."""
        return self.compute_capability[0] < 10


class NetworkTier(_SIFromHuman):
    """One level of the scale-out fabric: groups of `gpus` GPUs below it, and its oversubscription."""

    name: Annotated[str, Field(max_length=1024)] = ""
    gpus: Count
    oversubscription: Annotated[float, Field(ge=1.0, le=1024.0)] = 1.0


class MeasuredBusbw(_SIFromHuman):
    """One bus bandwidth measured on the cluster itself: a collective over `nodes` whole scale-up
    domains (every GPU of each a member; a node where the node is its own NVLink domain, a 72-GPU
    rack on GB200 NVL72: cost_models.comm counts a group's span in domains), at one message size
    (busbw as nccl-tests defines it)."""

    collective: Literal["all_reduce", "all_gather", "reduce_scatter"]
    nodes: Annotated[int, Field(ge=2)]
    size_bytes: Annotated[int, Field(gt=0)]
    busbw_bytes_per_s: Bandwidth


class ClusterSpec(_SIFromHuman):
    """A node type and its network: what a `--cluster` preset or file describes."""

    name: Name
    gpu: GPUSpec
    gpus_per_node: Count
    scaleup_domain_gpus: Count  # GPUs sharing one NVLink/NVSwitch (or Infinity Fabric) domain
    scaleup_bandwidth_bytes_per_s: Bandwidth  # per GPU per direction (PCIe's where there is no NVLink-class fabric)
    # Switched (NVSwitch: any group reaches every link of its GPUs) or a switchless full mesh, where a
    # group reaches only the links to its own members (cost_models.comm.domain_link_share).
    scaleup_topology: ScaleupTopology = ScaleupTopology.SWITCH
    scaleup_latency_s: Latency
    nic_bandwidth_bytes_per_s: Bandwidth  # scale-out, per GPU per direction
    nic_latency_s: Latency
    network_tiers: tuple[NetworkTier, ...] = ()
    # decides the launch's NCCL/libfabric environment and a small cross-node all-reduce's measured
    # start-up (cost_models.comm.SMALL_ALL_REDUCE_16_GPUS_S)
    fabric: Fabric = Fabric.UNSPECIFIED
    # EFA devices per node, as the Kubernetes device plugin counts them (vpc.amazonaws.com/efa);
    # required with fabric "efa" for job.yaml's resource request.
    efa_devices_per_node: Count | None = None
    # the cluster's own collective measurements across nodes, where published (cost_models.comm
    # caps a cross-node collective at them)
    measured_busbw: tuple[MeasuredBusbw, ...] = ()
    source: str = ""

    @model_validator(mode="after")
    def _check(self) -> ClusterSpec:
        if (self.fabric is Fabric.EFA) is not (self.efa_devices_per_node is not None):
            raise ValueError("efa_devices_per_node is given with fabric \"efa\" and only then (the vpc.amazonaws.com/efa count per node)")
        points = [(p.collective, p.nodes) for p in self.measured_busbw]
        if len(points) != len(set(points)):
            raise ValueError("measured_busbw gives one point per collective and node count")
        big, small = sorted((self.scaleup_domain_gpus, self.gpus_per_node), reverse=True)
        if big % small:
            raise ValueError(
                f"scaleup_domain_gpus({self.scaleup_domain_gpus}) and gpus_per_node({self.gpus_per_node}) "
                "must divide one another"
            )
        return self


class Cluster(Spec):
    """A cluster spec with a GPU count: whole nodes, or a part of one node."""

    spec: ClusterSpec
    num_gpus: Count

    @model_validator(mode="after")
    def _check(self) -> Cluster:
        n, g = self.num_gpus, self.spec.gpus_per_node
        if n > g and n % g:
            raise SpecError(
                f"gpus({n}) is not a multiple of gpus_per_node({g}) of {self.spec.name}; "
                f"use {n // g * g} or {(n // g + 1) * g}"
            )
        if n < g and g % n:
            divisors = [d for d in range(1, g + 1) if g % d == 0]
            raise SpecError(f"gpus({n}) is part of one {g}-GPU node of {self.spec.name}: use one of {divisors}")
        return self

    @property
    def gpu(self) -> GPUSpec:
        return self.spec.gpu

    @property
    def num_nodes(self) -> int:
        return max(1, self.num_gpus // self.spec.gpus_per_node)
