"""Cost of NCCL collectives, and which links a process group uses.

One function prices every collective: time = factor(n)·bytes / (plateau bus bandwidth × the share
of it a message of that size reaches), never less than NCCL's own latency for the collective.
`bytes` is the full buffer (all-reduce: the tensor; all-gather/reduce-scatter: the gathered tensor;
all-to-all: what one rank sends to all; send/recv: the message); factor(n) is the nccl-tests
bus-bandwidth factor of the collective (2(n−1)/n for all-reduce, (n−1)/n for all-gather,
reduce-scatter and all-to-all, 1 for send/recv: NVIDIA/nccl-tests doc/PERFORMANCE.md), so the bus
bandwidths below are the plateaus nccl-tests reports.

Bus bandwidth (measured plateaus):
- NVLink: NCCL's per-link bandwidth times the links per GPU (src/graph/topo.h: SM80 20.0, SM90 20.6,
  SM100 40.1 GB/s per link; 12 links on A100, 18 on H100 and Blackwell), which is what nccl-tests
  measures on one node: A100 232 of the modelled 240 GB/s, H100 370 of 370.8, B200 700 of 721.8
  (NVIDIA GTC24 S62129 and GTC25 S72583 slides; shared/reference/collectives.md §1.1). As a fraction
  of the raw per-direction NVLink rate: NVLINK_BUSBW_FRACTION.
- NIC: per GPU, NIC_BUSBW_FRACTION of the line rate: "24GB/s per 200G NIC", "46-48GB/s per NIC" at
  NDR 400G (NCCL maintainers, nccl-tests issues 119 and 290).
- A ring over several nodes runs its NVLink and network hops at once (NCCL pipelines every ring
  step through all of them), and with k group members per node, k NICs carry the node's share:
  busbw = min(NVLink busbw, k·NIC busbw / oversubscription). DGX H100 over 8x400G measures 370-380
  and DGX A100 over 8x200G 192, both as this gives (GTC24/25 slides).
- All-to-all: inside a node at the measured NVLink all-to-all plateau (A100 210, H100 320, B200 640
  GB/s); across nodes each rank's cross-node share goes through its own NIC at
  CROSS_NODE_ALL_TO_ALL_FRACTION of the NIC rate (DGX H100 8x400G: 48 GB/s busbw at 32 GPUs, DGX A100
  8x200G: 24, against the 62.7 and 31.3 that the NIC model alone gives; GTC25 slide).

Size: the share of the plateau a message reaches is read off published nccl-tests all-reduce
curves, one for a single NVLink domain and one per node count across nodes (DOMAIN_CURVE,
NODES_CURVES), and applied to every collective of that span by its buffer size. Latency floor:
NCCL's own latency model (src/graph/tuning.cc at v2.30.7-1, nccl_latency): a base latency and a hop
latency on NVLink and on the network per (algorithm, protocol), one table for every path (the
cluster presets carry its Ring/Simple hop latencies of their links, 3.4 µs NVLink and 14 µs network
on NVIDIA clusters, and scale the rest); the fastest protocol and algorithm (ring; tree for
all-reduce across nodes) taken. An all-reduce across nodes below the cross-node curves' first size
(1 MiB) costs no more than NCCL's tree LL, that table's Tree/LL start-up at the measured/modelled
ratio of 16-GPU nccl-tests runs (small_all_reduce_seconds).

Measured clusters: where a cluster preset carries bus bandwidths measured on that cluster across
nodes (ClusterSpec.measured_busbw: a collective over N whole nodes at one message size), a group
spanning N nodes is capped at them: the measurement carried to the group's message size along the
size curve above (share(size)/share(measured size) at that node count), read in log2 between the
measured node counts and flat beyond them. The measurement is read as a bound set by the span (the
network hops through N nodes, the same for any members per node), not by each node's NICs: the
per-NIC bound min(NVLink, k·NIC) still applies beside it, so a group with few members per node stays
NIC-bound where that is lower.

Placement: a group of n ranks whose consecutive members are `stride` ranks apart (the rank order
puts tp fastest, then cp, ep, dp, pp: Megatron `tp-cp-ep-dp-pp`, torchtitan's mesh
`pp, dp_replicate, dp_shard, cp, tp`, launch_formats.md §1.4, §2) has k = min(n, domain/stride)
members in each scale-up domain (NVLink/NVSwitch). A group spanning more GPUs than a network tier
holds pays that tier's oversubscription. In a domain wired as a switchless mesh the k members reach
only the links among themselves (domain_link_share).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache

from cost_models.enums import Fabric, ScaleupTopology
from cost_models.hardware import ClusterSpec
from cost_models.interp import log2_interp
from cost_models.kernels import PRICE_CACHE
from cost_models.units import GB, MiB, US


class Algorithm(StrEnum):
    """The NCCL algorithms the latency model prices (NCCL_ALGO_TREE, NCCL_ALGO_RING)."""

    TREE = "tree"
    RING = "ring"


class Protocol(StrEnum):
    """NCCL's protocols (NCCL_PROTO_LL, NCCL_PROTO_LL128, NCCL_PROTO_SIMPLE)."""

    LL = "ll"
    LL128 = "ll128"
    SIMPLE = "simple"


class Collective(StrEnum):
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    SEND_RECV = "send_recv"


def bus_factor(op: Collective, n: int) -> float:
    """nccl-tests' bus bandwidth factor: busbw = algbw · factor (doc/PERFORMANCE.md)."""
    if op is Collective.ALL_REDUCE:
        return 2 * (n - 1) / n
    if op is Collective.SEND_RECV:
        return 1.0
    return (n - 1) / n


# NVLink bus bandwidth over the raw per-direction NVLink rate, per GPU generation: NCCL's topo.h
# per-link model (links x GB/s) over links x 25 (A100, H100) or 50 (Blackwell) GB/s raw.
# AMD CDNA3 (MI300X, 7 xGMI links x 64 GB/s, full mesh): measured instead, RCCL all-reduce bus bandwidth
# on 8 MI300X of an Azure ND MI300X v5 VM, 313.9-316.8 GB/s from 1 GB to 8 GB messages (RCCL 2.22.3,
# rccl-tests in place; samuel-bohman/AI-benchmarking-guide@3de0c294 Azure_Results/ND_MI300X_v5_results.md
# "RCCL Bandwidth"), 316.8 at 8 GB over 448 GB/s.
NCCL_NVLINK_BUSBW_FRACTION = {"ampere": 12 * 20.0 / 300, "hopper": 18 * 20.6 / 450, "blackwell": 18 * 40.1 / 900}
NVLINK_BUSBW_FRACTION = {**NCCL_NVLINK_BUSBW_FRACTION, "cdna3": 316.8 / 448}
# Measured NVLink all-to-all plateau over the raw rate (GTC25 S72583: A100 210, H100 320, B200 640 GB/s).
NVLINK_ALL_TO_ALL_FRACTION = {"ampere": 210 / 300, "hopper": 320 / 450, "blackwell": 640 / 900}
# A generation without measurements (Ada PCIe, a user's GPU; AMD Infinity Fabric's all-to-all and
# copy-engine rates) takes the lowest of NCCL's NVLink model.
DEFAULT_NVLINK_FRACTION = min(NCCL_NVLINK_BUSBW_FRACTION.values())
DEFAULT_NVLINK_ALL_TO_ALL_FRACTION = min(NVLINK_ALL_TO_ALL_FRACTION.values())
# A peer-to-peer copy on the copy engine (cudaMemcpyAsync between two GPUs of one NVLink domain,
# no NCCL protocol and no SMs) over the raw per-direction NVLink rate: p2pBandwidthLatencyTest
# unidirectional, A100 ~274 of 300, H100 ~376 of 450, GB200 ~746 of 900 GB/s (stas00/ml-engineering
# @744d01e "Real network throughput"; H100 371-376 also in NVIDIA/nccl issue 1264;
# shared/reference/collectives.md §4).
COPY_ENGINE_P2P_FRACTION = {"ampere": 274 / 300, "hopper": 376 / 450, "blackwell": 746 / 900}
DEFAULT_COPY_ENGINE_P2P_FRACTION = min(COPY_ENGINE_P2P_FRACTION.values())
# NIC bus bandwidth over line rate: 24 of 25 GB/s (200G), 46-48 of 50 GB/s (400G): 0.94 of both.
NIC_BUSBW_FRACTION = 0.94
# Cross-node all-to-all over the per-NIC model: 48/62.7 (DGX H100) and 24/31.3 (DGX A100), GTC25.
CROSS_NODE_ALL_TO_ALL_FRACTION = 0.77

# NCCL's latency model (NVIDIA/nccl@73cf1122 = v2.30.7-1, src/graph/tuning.cc, the default tuner
# constants ncclTunerConstantsDefaults), by (algorithm, protocol); shared/reference/collectives.md §2.2, 2.3.
# Each row as tuning.cc writes it, (LL, LL128, Simple) in µs for Tree and for Ring.


def _by_algorithm_protocol(*, tree: tuple[float, float, float], ring: tuple[float, float, float]) -> dict[tuple[Algorithm, Protocol], float]:
    return {(a, p): us * US for a, row in ((Algorithm.TREE, tree), (Algorithm.RING, ring)) for p, us in zip(Protocol, row, strict=True)}


# start-up of a collective, baseLatencies[algo][proto] (:151)
BASE_LATENCY_S = _by_algorithm_protocol(tree=(6.8, 14.0, 8.4), ring=(6.6, 14.0, 8.4))
# one hop over NVLink, hwLatencies[NCCL_HW_NVLINK][algo][proto] (:159)
HOP_LATENCY_NVLINK_S = _by_algorithm_protocol(tree=(0.6, 1.25, 4.0), ring=(0.6, 1.9, 3.4))
# one hop over the network, hwLatencies[NCCL_HW_NET][algo][proto] (:171)
HOP_LATENCY_NET_S = _by_algorithm_protocol(tree=(5.0, 8.5, 14.0), ring=(2.7, 4.0, 14.0))
# A ring across nodes launches every step through the host's network proxy: each NVLink step costs
# at least the network post overhead, three times that for Simple (getNetOverhead :225-233,
# :404-410): 1 µs on Intel x86 and non-x86 hosts, 2 µs on AMD x86; the lower, the host not being
# part of a cluster preset (as for llMaxBw below).
NET_POST_OVERHEAD_S = 1.0 * US
SIMPLE_NET_POST_OVERHEADS = 3

# Bus bandwidth against message size, as a share of the plateau, from published nccl-tests
# all-reduce curves (shared/reference/collectives.md §1.2, §1.6). The share folds in everything that
# keeps a mid-size collective off its plateau in NCCL (too few bytes per channel and pipeline step,
# protocol and algorithm switches), so it is read off measurements, not derived.
# - One NVLink domain: Azure/AI-benchmarking-guide@8fd0c6e1 Azure_Results ND_A100_v4, ND_H100_v5,
#   ND_H200_v5 "NCCL Bandwidth" (8 GPUs, all-reduce), each divided by its 8 GiB value; the median
#   of the three at each size (A100 and H100 halve their plateau at the same ~16 MiB).
# - Across nodes: NVIDIA's NCCL_ALGO=NVLSTree all-reduce scan on H100 at 32, 256, 1024 and 8192
#   GPUs (GTC24 S62129 slide 35, read off the figure as reproduced in stas00/ml-engineering@744d01e
#   network/images/nccl-all-reduce-scan-nvlstree.png, ±10 GB/s), each divided by its 16 GiB value.
# Between the listed sizes and node counts the share is interpolated in log2; below the smallest
# size the latency floor (NCCL's own latency model, collective_time) takes over.
DOMAIN_CURVE = {  # message bytes -> share
    1024: 0.00015, 32 * 1024: 0.0044, 256 * 1024: 0.031, MiB: 0.110, 4 * MiB: 0.288, 16 * MiB: 0.490,
    64 * MiB: 0.755, 256 * MiB: 0.900, 1024 * MiB: 0.974, 4096 * MiB: 0.995, 8192 * MiB: 1.0,
}
NODES_SIZES_BYTES = (MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB, 1024 * MiB, 16384 * MiB)
NODES_CURVES = {  # nodes of 8 GPUs -> share at NODES_SIZES_BYTES
    4: (0.040, 0.144, 0.336, 0.613, 0.835, 0.933, 1.0),
    32: (0.016, 0.059, 0.181, 0.453, 0.733, 0.915, 1.0),
    128: (0.0135, 0.049, 0.135, 0.338, 0.689, 0.897, 1.0),
    1024: (0.0082, 0.033, 0.087, 0.286, 0.613, 0.837, 1.0),
}


# A small all-reduce across nodes, below the smallest size the cross-node curves were read at
# (NODES_SIZES_BYTES[0]): there the curves carry no measurement, and reading them down (a share
# proportional to the size) prices any message like a 1 MiB one, which grows with the node count as
# the 1 MiB share falls. NCCL runs it as its cost model picks (NVIDIA/nccl@73cf1122 = v2.30.7-1,
# src/enqueue.cc:2028-2041 topoGetAlgoInfo takes the least ncclTopoGetAlgoTime): with tens of bytes, tree LL,
# whose start-up grows with log2 of the nodes where a ring's grows with the nodes. Its time there
# (src/graph/tuning.cc, v2.30.7-1):
#   latency = base + 2·((ppn − 1)·intra + log2i(nNodes)·inter)          :416 (nccl_latency, Tree/LL:
#             base 6.8 µs, intra 0.6 µs NVLink, inter 5.0 µs network, :151, :159, :171)
#   busBw = min(nChannels·bw / 3.8, llMaxBw), times 0.5 for a tree         :332, :378-381
#   llMaxBw across nodes by host CPU: Intel 39.0 GB/s at 2 nodes, 20.4 beyond; AMD 22.5, 19.0
#             (:179-180, row by CPU vendor and column by node count :267-272); the lower taken, the
#             host not being part of a cluster preset
#   time = latency + bytes / (bw · treeCorrectionFactor[LL][log2i(bytes/64)])   :624, :639-653
# NCCL's latency constants price a 2-node, 8-GPU-a-node all-reduce at 6.8 + 2·(7·0.6 + 5.0) = 25.2 µs
# (its log prints 25.214764 µs, tree LL, for a 128-byte all-reduce on 8-GPU H100 nodes, NVIDIA/nccl
# issue 1453). Measured, the wall time of that collective: nccl-tests all_reduce_perf times an 8-byte
# all-reduce over 16 GPUs at 47.60 µs over NDR InfiniBand (2 x 8 H20,
# 16 ConnectX-7, NCCL 2.21.5, NVIDIA/nccl issue 1244) and 69.12 µs over EFA (2 x p5.48xlarge, NCCL
# 2.27.7, aws-samples/awsome-distributed-training@0162aacd micro-benchmarks/nccl-tests/README.md
# "Results"). The model's start-up is taken at the measured/modelled ratio of the cluster's fabric,
# the same at every node count (no measurement of a tiny all-reduce beyond 2 nodes was found); a
# fabric without a measurement takes the larger ratio. The bytes run at the LL bandwidth as modelled.
LL_MAX_BUSBW_BYTES_PER_S = {2: min(39.0, 22.5) * GB, 3: min(20.4, 19.0) * GB}  # nodes 2, 3 and more
TREE_LL_BUSBW_DIVISOR = 3.8
TREE_BUS_TO_ALG = 0.5
# treeCorrectionFactor, LL row: sizes 64 B·2^i, i = 0..13 (below 1 MiB, the only sizes priced here;
# the row goes on .5, .6, .7, .8, .9, 1.0 ... to i = 23)
TREE_LL_CORRECTION = (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4)
# the measured 8-byte all-reduce over 2 nodes of 8 GPUs (sources above), per fabric
SMALL_ALL_REDUCE_16_GPUS_S = {Fabric.INFINIBAND: 47.60 * US, Fabric.EFA: 69.12 * US}


# SMs an NCCL collective occupies while it runs (one thread block per channel): the ring channel
# count NCCL's graph search settles on, derived from src/graph/search.cc and topo.h at v2.30.7-1 for
# one NVSwitch node (A100 24, H100 24, B200 32; 24 on H100 matches the "24 coll channels" of
# nccl issue 1259's log) and 16 with 8 NICs over InfiniBand (2 per NIC). A compute kernel running
# beside it has the other SMs (no GEMM block fits on an SM an NCCL block holds).
NCCL_CHANNELS_NVLINK = {"ampere": 24, "hopper": 24, "blackwell": 32}
NCCL_CHANNELS_NET = 16
# A generation without its own count takes the fewest (as the NVLink fractions above do).
DEFAULT_NCCL_CHANNELS = min(NCCL_CHANNELS_NVLINK.values())
# The most of a GPU's SMs a collective is taken to hold: NCCL's own counts come to at most 32 of 148
# (0.22); the cap keeps the contention s/(1 − s) of a scaled share finite (step_time._share).
MAX_SM_SHARE = 0.5


@dataclass(frozen=True)
class Placement:
    n: int  # ranks in the group
    per_domain: int  # members inside one scale-up domain
    span_gpus: int  # GPUs from the group's first to its last member, + 1 domain

    @property
    def domains(self) -> int:
        """The scale-up domains (nodes) the group touches: an uneven group counts its last, part-filled one."""
        return -(-self.n // self.per_domain)


def placement(cluster: ClusterSpec, n: int, stride: int) -> Placement:
    domain = cluster.scaleup_domain_gpus
    k = max(1, min(n, domain // stride)) if stride < domain else 1
    return Placement(n=n, per_domain=k, span_gpus=n * stride)


def _arch(cluster: ClusterSpec) -> str:
    return cluster.gpu.architecture


def nvlink_busbw(cluster: ClusterSpec) -> float:
    fraction = NVLINK_BUSBW_FRACTION.get(_arch(cluster), DEFAULT_NVLINK_FRACTION)
    return cluster.scaleup_bandwidth_bytes_per_s * fraction


def nvlink_all_to_all_busbw(cluster: ClusterSpec) -> float:
    fraction = NVLINK_ALL_TO_ALL_FRACTION.get(_arch(cluster), DEFAULT_NVLINK_ALL_TO_ALL_FRACTION)
    return cluster.scaleup_bandwidth_bytes_per_s * fraction


def domain_link_share(cluster: ClusterSpec, k: int) -> float:
    """Share of a GPU's scale-up links that a group with k members in one domain runs over.

    Behind a switch (NVSwitch) every link reaches every peer: 1. In a switchless full mesh
    (ClusterSpec.scaleup_topology "mesh": a 4-GPU HGX board, an MI300X platform) each GPU's links are
    split evenly over direct links to its domain − 1 peers, and NCCL prices a direct GPU-to-GPU
    NVLink path at its link count times the per-link rate (NVIDIA/nccl@5067397c
    src/graph/topo.cc:832-843 ncclTopoAddNvLinks; through a switch all of a GPU's links go to the
    one NVS node, :846-857), so a group reaches the links to its k − 1 fellow members: (k − 1)/(domain − 1)
    of them. A pair on a 4-GPU board runs over 6 of the 18 NVLinks; the whole board, over all 18,
    its rings using the three peers' links at once."""
    d = cluster.scaleup_domain_gpus
    if cluster.scaleup_topology is ScaleupTopology.SWITCH or d <= 1:
        return 1.0
    return min(1.0, max(1, k - 1) / (d - 1))


def oversubscription(cluster: ClusterSpec, span_gpus: int) -> float:
    """The oversubscription of the highest network tier a group spanning `span_gpus` GPUs crosses
    (ClusterSpec.network_tiers), 1 within the lowest."""
    return max((t.oversubscription for t in cluster.network_tiers if span_gpus > t.gpus), default=1.0)


def nic_busbw(cluster: ClusterSpec, span_gpus: int) -> float:
    return cluster.nic_bandwidth_bytes_per_s * NIC_BUSBW_FRACTION / oversubscription(cluster, span_gpus)


def nccl_latency(op: Collective, where: Placement, algorithm: Algorithm, protocol: Protocol,
                 *, nvlink_scale: float = 1.0, net_scale: float = 1.0) -> float:
    """NCCL's modelled start-up of one collective over where.n ranks, where.per_domain of them in each
    scale-up domain (NVIDIA/nccl v2.30.7-1 src/graph/tuning.cc:384-417): the (algorithm, protocol) base latency
    plus a hop latency per step, its NVLink and network hop latencies (HOP_LATENCY_*) times the
    given scales.
    - Ring: 2(n−1) steps for an all-reduce, n−1 otherwise (:289-291), 2(nodes−1) resp. nodes−1 of
      them over the network (:411-412); across nodes an NVLink step costs at least the host's network
      post overhead (:404-410), and with one rank a node a network step is priced as Tree's (:386-388).
    - Tree (all-reduce): up and down the chain in each node and the log2i(nodes) levels between
      nodes (:416; log2i rounds down, src/include/utils.h:56).
    A send/recv is one ring step (NCCL's point-to-point has no tuning model of its own); an
    all-to-all a ring's n−1 steps."""
    n, k, nodes = where.n, where.per_domain, where.domains
    base = BASE_LATENCY_S[algorithm, protocol]
    nvl = HOP_LATENCY_NVLINK_S[algorithm, protocol] * nvlink_scale
    one_a_node = k == 1 and nodes > 1 and op is not Collective.SEND_RECV
    net = HOP_LATENCY_NET_S[Algorithm.TREE if one_a_node else algorithm, protocol] * net_scale
    if algorithm is Algorithm.TREE:
        assert op is Collective.ALL_REDUCE, op  # NCCL runs only all-reduces as a tree (tuning.cc:294-298)
        levels = nodes.bit_length() - 1  # log2i
        return base + 2 * ((k - 1) * nvl + levels * net)
    if op is Collective.SEND_RECV:
        return base + (nvl if nodes == 1 else net)
    if nodes > 1:
        overhead = NET_POST_OVERHEAD_S * (SIMPLE_NET_POST_OVERHEADS if protocol is Protocol.SIMPLE else 1)
        nvl = max(nvl, overhead)
    per = 2 if op is Collective.ALL_REDUCE else 1
    net_steps = per * (nodes - 1)
    return base + (per * (n - 1) - net_steps) * nvl + net_steps * net


def _latency(op: Collective, where: Placement, cluster: ClusterSpec, algorithm: Algorithm, protocol: Protocol) -> float:
    """nccl_latency on the cluster's links: the preset carries NCCL's Ring/Simple hop latency of its
    scale-up link and of its network (tuning.cc's for NVLink and InfiniBand, RCCL's for xGMI, NCCL's
    PCI row for a PCIe node), and every (algorithm, protocol) hop latency is scaled by the preset's
    over NCCL's NVLink resp. network Ring/Simple one."""
    ring_simple = (Algorithm.RING, Protocol.SIMPLE)
    return nccl_latency(op, where, algorithm, protocol,
                        nvlink_scale=cluster.scaleup_latency_s / HOP_LATENCY_NVLINK_S[ring_simple],
                        net_scale=cluster.nic_latency_s / HOP_LATENCY_NET_S[ring_simple])


def _share_curve(xs: tuple[float, ...], ys: tuple[float, ...], size_bytes: float) -> float:
    """A size curve read in log2; below its first point proportional to the size (a latency-bound
    collective takes the same time at any size, so its share of the plateau falls with size)."""
    return log2_interp(xs, ys, size_bytes) if size_bytes >= xs[0] else ys[0] * size_bytes / xs[0]


def size_share(size_bytes: float, nodes: int) -> float:
    """Share of the plateau bus bandwidth a collective of `size_bytes` reaches over `nodes` nodes
    (DOMAIN_CURVE, NODES_CURVES; node counts between the measured ones interpolated in log2)."""

    def at(count: int) -> float:
        if count == 1:
            return _share_curve(tuple(DOMAIN_CURVE), tuple(DOMAIN_CURVE.values()), size_bytes)
        return _share_curve(NODES_SIZES_BYTES, NODES_CURVES[count], size_bytes)

    counts = (1, *NODES_CURVES)
    nodes = max(1, min(nodes, counts[-1]))
    hi = next(c for c in counts if c >= nodes)
    if hi == nodes:
        return at(hi)
    lo = counts[counts.index(hi) - 1]
    return log2_interp((lo, hi), (at(lo), at(hi)), nodes)


def measured_busbw(op: Collective, size_bytes: float, nodes: int, cluster: ClusterSpec) -> float | None:
    """The cluster's own cross-node measurement of `op` (module docstring, measured clusters) at
    `nodes` nodes and `size_bytes`, or None where its preset has none for the collective."""
    if nodes < 2:
        return None
    points = sorted((p.nodes, p.size_bytes, p.busbw_bytes_per_s) for p in cluster.measured_busbw if p.collective == op.value)
    if not points:
        return None
    counts = [count for count, _, _ in points]
    x = max(nodes, counts[0])
    # carry along the size curve only the points log2_interp reads (a hot path): beyond the last
    # count that one; else the count below x and the one at or above it, with the next one so that
    # x on a measured count takes log2_interp's inner branch as over the whole list
    hi = bisect.bisect_left(counts, x, 1)
    near = points[hi - 1:hi + 2] if x < counts[-1] else points[-1:]
    carried = [busbw * size_share(size_bytes, count) / size_share(size, count) for count, size, busbw in near]
    return log2_interp([count for count, _, _ in near], carried, x)


def bus_bandwidth(op: Collective, where: Placement, cluster: ClusterSpec, *, flat: bool = False) -> float:
    """Plateau bus bandwidth of the collective on this placement (module docstring)."""
    n, k = where.n, where.per_domain
    if k >= n:  # one scale-up domain
        busbw = nvlink_all_to_all_busbw(cluster) if op is Collective.ALL_TO_ALL else nvlink_busbw(cluster)
        return busbw * domain_link_share(cluster, n)
    nic = nic_busbw(cluster, where.span_gpus)
    if flat or k == 1:
        return nic
    return min(nvlink_busbw(cluster) * domain_link_share(cluster, k), k * nic)


# A search prices the same few hundred collectives thousands of times (Mixtral-8x22B at 256 H100s:
# 12,220 prices of 250 collectives); the price is a pure function of its arguments (typed: an int
# and an equal float of bytes are kept apart, each priced as it was).
@lru_cache(maxsize=PRICE_CACHE, typed=True)
def collective_time(op: Collective, size_bytes: float, where: Placement, cluster: ClusterSpec, *, flat: bool = False) -> float:
    """Seconds for one collective of a group placed as `where` (see the module docstring): the
    bytes over the plateau bus bandwidth times its size share, never less than NCCL's latency, nor,
    for a reduce-scatter or all-gather across domains, than its ring's (ring_fill_seconds).

    `flat`: every rank's own NIC carries the whole ring's traffic (DeepSpeed ZeRO-3's gathers, see
    step_time), instead of k NICs sharing it."""
    n, k = where.n, where.per_domain
    if n <= 1 or size_bytes <= 0:
        return 0.0
    nodes = where.domains
    share = size_share(size_bytes, nodes)
    # NCCL's start-up per (algorithm, protocol); the Simple ring's is also ring_fill_seconds' latency.
    # A tree only for an all-reduce across domains: inside one, NCCL's tree is a chain whose start-up
    # is never below the ring's (LL: the same 0.6 µs a step on a 0.2 µs higher base, tuning.cc:151, :159)
    algorithms = (Algorithm.RING, Algorithm.TREE) if op is Collective.ALL_REDUCE and k < n else (Algorithm.RING,)
    latency = {(a, p): _latency(op, where, cluster, a, p) for a in algorithms for p in Protocol}
    floor = min(latency.values())
    if op is Collective.ALL_TO_ALL and k < n:
        # (k−1)/n of what a rank sends stays on NVLink, (n−k)/n leaves through its NIC, at once
        inside = (k - 1) / n * size_bytes / (nvlink_all_to_all_busbw(cluster) * domain_link_share(cluster, k))
        across = (n - k) / n * size_bytes / (nic_busbw(cluster, where.span_gpus) * CROSS_NODE_ALL_TO_ALL_FRACTION)
        return max(floor, max(inside, across) / share)
    moved = bus_factor(op, n) * size_bytes
    plateau_bytes_per_s = bus_bandwidth(op, where, cluster, flat=flat)
    busbw = plateau_bytes_per_s * share
    measured = measured_busbw(op, size_bytes, nodes, cluster) if k < n else None
    time = max(floor, moved / (busbw if measured is None else min(busbw, measured)),
               ring_fill_seconds(op, moved, plateau_bytes_per_s, where, latency_s=latency[Algorithm.RING, Protocol.SIMPLE]))
    if op is Collective.ALL_REDUCE and k < n and size_bytes < NODES_SIZES_BYTES[0]:
        # below the cross-node curves, no dearer than NCCL's tree LL (small_all_reduce_seconds)
        return min(time, small_all_reduce_seconds(size_bytes, where, cluster,
                                                  start_up_s=latency[Algorithm.TREE, Protocol.LL]))
    return time


# NCCL's own model of the measured case, 2 nodes of 8 GPUs: 25.2 µs (comment above
# SMALL_ALL_REDUCE_16_GPUS_S)
TREE_LL_16_GPUS_S = nccl_latency(Collective.ALL_REDUCE, Placement(16, 8, 16), Algorithm.TREE, Protocol.LL)


def small_all_reduce_seconds(size_bytes: float, where: Placement, cluster: ClusterSpec, *, start_up_s: float) -> float:
    """A small all-reduce (below NODES_SIZES_BYTES[0], 1 MiB: collective_time's only call) across
    nodes as NCCL's tree LL runs it (comment above SMALL_ALL_REDUCE_16_GPUS_S): `start_up_s`, its
    Tree/LL start-up as collective_time's latency floor prices it (_latency), at the measured/modelled
    ratio of the cluster's fabric, plus the bytes at the LL protocol's tree bandwidth."""
    nodes = where.domains
    measured = SMALL_ALL_REDUCE_16_GPUS_S.get(cluster.fabric, max(SMALL_ALL_REDUCE_16_GPUS_S.values()))
    ratio = measured / TREE_LL_16_GPUS_S
    ll_busbw = min(bus_bandwidth(Collective.ALL_REDUCE, where, cluster) / TREE_LL_BUSBW_DIVISOR,
                   LL_MAX_BUSBW_BYTES_PER_S[min(nodes, 3)])
    level = int(size_bytes) // 64
    correction = TREE_LL_CORRECTION[level.bit_length() - 1] if level else 1.0  # collective_time: below 1 MiB
    return ratio * start_up_s + size_bytes / (TREE_BUS_TO_ALG * ll_busbw * correction)


def ring_fill_seconds(op: Collective, moved_bytes: float, plateau_bytes_per_s: float, where: Placement,
                      *, latency_s: float) -> float:
    """A ring reduce-scatter or all-gather across scale-up domains, as NCCL prices it: the ring's
    latency, per-step latencies over its n − 1 steps (_latency, Simple), plus the bytes at the plateau
    bus bandwidth (NVIDIA/nccl v2.30.7-1 src/graph/tuning.cc:411-412 ring latency, :653 ncclTopoGetAlgoTime
    time = lat + bytes / bw). The size curves above are read off all-reduces, which cross nodes by
    tree (log2 of the nodes in steps), so they miss the ring's n − 1 steps; a group with two or more
    members in each domain has no other algorithm for these two collectives (tuning.cc:295-297 leaves
    them PAT, ring, NVLS and CollNet; PAT needs one GPU per node, :220; NVLS across nodes and CollNet
    need CollNet (SHARP) enabled, :503-506), so its time is at least this. 0 for other collectives,
    within one domain, and for one member per domain. `latency_s`: that ring latency
    (_latency(op, where, cluster, Algorithm.RING, Protocol.SIMPLE), which collective_time has)."""
    n, k = where.n, where.per_domain
    if op not in (Collective.REDUCE_SCATTER, Collective.ALL_GATHER) or k >= n or k < 2:
        return 0.0
    return latency_s + moved_bytes / plateau_bytes_per_s


def nccl_sm_share(cluster: ClusterSpec, where: Placement, sms: int) -> float:
    """Share of the GPU's SMs an NCCL collective of this placement occupies."""
    if where.n <= 1:
        return 0.0
    channels = NCCL_CHANNELS_NVLINK.get(_arch(cluster), DEFAULT_NCCL_CHANNELS) if where.per_domain >= where.n else NCCL_CHANNELS_NET
    return min(MAX_SM_SHARE, channels / sms)


def send_recv_time(size_bytes: float, *, stride: int, cluster: ClusterSpec) -> float:
    """Point-to-point between two ranks `stride` apart (pipeline neighbours, ring attention)."""
    if size_bytes <= 0:
        return 0.0
    same_domain = stride < cluster.scaleup_domain_gpus
    where = Placement(n=2, per_domain=2 if same_domain else 1, span_gpus=2 * stride)
    return collective_time(Collective.SEND_RECV, size_bytes, where, cluster)


def copy_engine_p2p_time(size_bytes: float, cluster: ClusterSpec, *, launch_s: float) -> float:
    """One copy-engine write of `size_bytes` to a GPU of the same NVLink domain (Transformer Engine
    userbuffers' ring exchange): the bytes at the measured P2P copy rate (COPY_ENGINE_P2P_FRACTION of
    the per-direction NVLink rate, of the links to that one peer in a switchless mesh), plus the
    start-up of the copy and of the one-thread kernel that raises the receiver's flag (`launch_s` each)."""
    if size_bytes <= 0:
        return 0.0
    fraction = COPY_ENGINE_P2P_FRACTION.get(_arch(cluster), DEFAULT_COPY_ENGINE_P2P_FRACTION)
    link_bytes_per_s = cluster.scaleup_bandwidth_bytes_per_s * domain_link_share(cluster, 2)
    return size_bytes / (link_bytes_per_s * fraction) + 2 * launch_s
