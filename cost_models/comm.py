"""α-β cost of collectives, and which link a process group uses.

One function prices every collective: time = base + α·steps(n) + factor(n)·bytes / bandwidth,
where `bytes` is the full buffer (all-reduce: the tensor; all-gather/reduce-scatter: the gathered
tensor; all-to-all: what one rank sends to all; send/recv: the message) and the algorithm's
latency steps and bandwidth factor are data (ALGORITHMS). Textbook forms (Thakur, Rabenseifner &
Gropp 2005, "Optimization of Collective Communication Operations in MPICH", Sec. 4; Chan et al.
2007):

- ring all-reduce: 2(n−1) steps, each rank sends and receives 2(n−1)/n of the buffer;
- ring all-gather / reduce-scatter: n−1 steps, (n−1)/n of the buffer;
- tree all-reduce (NCCL's double binary tree, reduce then broadcast, pipelined): 2·⌈log2 n⌉ steps,
  the whole buffer twice through each link;
- pairwise all-to-all: n−1 exchanges, (n−1)/n of what a rank sends leaves it;
- send/recv: one step, the message once.

Placement: a group of n ranks whose consecutive members are `stride` ranks apart (the rank order
puts tp fastest, then cp, ep, dp, pp: Megatron `tp-cp-ep-dp-pp`, torchtitan's mesh
`pp, dp_replicate, dp_shard, cp, tp`, launch_formats.md §1.4, §2) has k = min(n, domain/stride)
members in each scale-up domain (NVLink/NVSwitch). If all n are in one domain the collective runs
on the scale-up link. Otherwise it runs hierarchically (NCCL's rings and trees cross nodes this
way): a stage inside each domain on the scale-up link, and a stage across the n/k domains on the
NICs, where the k members of a domain each drive their own NIC with 1/k of the data. Every GPU has
one NIC (all cluster presets are rail-optimised, one NIC per GPU), and groups of the same kind
run at the same time on every GPU, so k NICs per domain is also the group's fair share. A group
that spans more GPUs than a network tier holds pays that tier's oversubscription.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Callable

from cost_models.hardware import ClusterSpec
from cost_models.units import US

# NCCL's fixed per-collective launch latency (baseLatencies, Ring/Simple, 8.4 µs;
# https://github.com/NVIDIA/nccl/blob/master/src/graph/tuning.cc, the same table the cluster
# presets take their per-step latencies from).
COLLECTIVE_BASE_LATENCY_S = 8.4 * US

# Achieved fraction of the link's per-direction bandwidth at large messages ("bus bandwidth" in
# nccl-tests terms). NVLink: p2pBandwidthLatencyTest measures about 380 of 450 GB/s on H100 SXM
# (https://github.com/NVIDIA/nccl/issues/1264) = 0.84; InfiniBand NDR/HDR: nccl-tests across nodes
# reach 45-48 of 50 GB/s per NIC (NVIDIA DGX SuperPOD H100 RA, "Multi-node NCCL" acceptance
# tables quote ~ 370-390 GB/s bus bandwidth for 8 NICs) = 0.92.
SCALEUP_EFFICIENCY = 0.84
SCALEOUT_EFFICIENCY = 0.92


class Collective(StrEnum):
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    SEND_RECV = "send_recv"


class Algorithm(StrEnum):
    RING = "ring"
    TREE = "tree"
    PAIRWISE = "pairwise"
    DIRECT = "direct"


def _log2(n: int) -> int:
    return max(1, math.ceil(math.log2(n)))


# (collective, algorithm) -> (latency steps(n), bandwidth factor(n))
ALGORITHMS: dict[tuple[Collective, Algorithm], tuple[Callable[[int], float], Callable[[int], float]]] = {
    (Collective.ALL_REDUCE, Algorithm.RING): (lambda n: 2 * (n - 1), lambda n: 2 * (n - 1) / n),
    (Collective.ALL_REDUCE, Algorithm.TREE): (lambda n: 2 * _log2(n), lambda n: 2.0),
    (Collective.ALL_GATHER, Algorithm.RING): (lambda n: n - 1, lambda n: (n - 1) / n),
    (Collective.REDUCE_SCATTER, Algorithm.RING): (lambda n: n - 1, lambda n: (n - 1) / n),
    (Collective.ALL_TO_ALL, Algorithm.PAIRWISE): (lambda n: n - 1, lambda n: (n - 1) / n),
    (Collective.SEND_RECV, Algorithm.DIRECT): (lambda n: 1, lambda n: 1.0),
}


@dataclass(frozen=True)
class Link:
    bandwidth_bytes_per_s: float  # achieved, per GPU per direction
    latency_s: float  # per step


def alpha_beta(op: Collective, algorithm: Algorithm, n: int, size_bytes: float, link: Link) -> float:
    """α·steps + factor·bytes/bandwidth of one algorithm on one link level (no base latency)."""
    if n <= 1 or size_bytes <= 0:
        return 0.0
    steps, factor = ALGORITHMS[op, algorithm]
    return link.latency_s * steps(n) + factor(n) * size_bytes / link.bandwidth_bytes_per_s


def _flat(op: Collective, n: int, size_bytes: float, link: Link) -> float:
    """Fastest algorithm the table has for this collective on one level (NCCL's tuner chooses by
    the same kind of model, src/graph/tuning.cc)."""
    return min(alpha_beta(op, alg, n, size_bytes, link) for (o, alg) in ALGORITHMS if o is op)


@dataclass(frozen=True)
class Placement:
    n: int  # ranks in the group
    per_domain: int  # members inside one scale-up domain
    span_gpus: int  # GPUs from the group's first to its last member, + 1 domain


def placement(cluster: ClusterSpec, n: int, stride: int) -> Placement:
    domain = cluster.scaleup_domain_gpus
    k = max(1, min(n, domain // stride)) if stride < domain else 1
    return Placement(n=n, per_domain=k, span_gpus=n * stride)


def scaleup_link(cluster: ClusterSpec) -> Link:
    return Link(cluster.scaleup_bandwidth_bytes_per_s * SCALEUP_EFFICIENCY, cluster.scaleup_latency_s)


def scaleout_link(cluster: ClusterSpec, span_gpus: int) -> Link:
    over = max((t.oversubscription for t in cluster.network_tiers if span_gpus > t.gpus), default=1.0)
    return Link(cluster.nic_bandwidth_bytes_per_s * SCALEOUT_EFFICIENCY / over, cluster.nic_latency_s)


def collective_time(op: Collective, size_bytes: float, where: Placement, cluster: ClusterSpec, *, flat: bool = False) -> float:
    """Seconds for one collective of a group placed as `where` (see the module docstring).

    `flat`: one ring over all n ranks at one NIC's bandwidth per rank, the whole buffer crossing
    every rank's NIC, instead of the hierarchical split (used for DeepSpeed ZeRO-3, see step_time).
    """
    n, k = where.n, where.per_domain
    if n <= 1 or size_bytes <= 0:
        return 0.0
    up = scaleup_link(cluster)
    if k == n:
        return COLLECTIVE_BASE_LATENCY_S + _flat(op, n, size_bytes, up)
    nodes = n // k
    out = scaleout_link(cluster, where.span_gpus)
    if flat:
        return COLLECTIVE_BASE_LATENCY_S + _flat(op, n, size_bytes, out)
    if op is Collective.ALL_TO_ALL:
        # each rank sends (n−1)/n of its buffer: (k−1)/n of it stays inside the domain, (n−k)/n
        # leaves through its own NIC; both run at once, the slower sets the time
        inside = (k - 1) / n * size_bytes / up.bandwidth_bytes_per_s + up.latency_s * (k - 1)
        across = (n - k) / n * size_bytes / out.bandwidth_bytes_per_s + out.latency_s * (nodes - 1)
        return COLLECTIVE_BASE_LATENCY_S + max(inside, across)
    if op is Collective.SEND_RECV:
        return COLLECTIVE_BASE_LATENCY_S + alpha_beta(op, Algorithm.DIRECT, 2, size_bytes, out)
    # hierarchical: reduce-scatter/all-gather inside the domain, then the cross-domain stage on
    # 1/k of the buffer per NIC (for all-reduce: RS inside, AR across, AG inside)
    across = _flat(op, nodes, size_bytes / k, out)
    if op is Collective.ALL_REDUCE:
        inside = _flat(Collective.REDUCE_SCATTER, k, size_bytes, up) + _flat(Collective.ALL_GATHER, k, size_bytes, up)
    else:
        inside = _flat(op, k, size_bytes, up)
    return COLLECTIVE_BASE_LATENCY_S + inside + across


def send_recv_time(size_bytes: float, *, stride: int, cluster: ClusterSpec) -> float:
    """Point-to-point between two ranks `stride` apart (pipeline neighbours)."""
    if size_bytes <= 0:
        return 0.0
    same_domain = stride < cluster.scaleup_domain_gpus
    link = scaleup_link(cluster) if same_domain else scaleout_link(cluster, 2 * stride)
    return COLLECTIVE_BASE_LATENCY_S + alpha_beta(Collective.SEND_RECV, Algorithm.DIRECT, 2, size_bytes, link)
