"""DeepEP's normal (high-throughput) dispatch and combine kernels: where a token goes, what the
transfer costs, and the buffers DeepEP allocates (MoEDispatch.DEEPEP).

Mechanism (deepseek-ai/DeepEP@b57e5e2 README.md:5, "kernels optimized for asymmetric-domain bandwidth
forwarding, such as forwarding data from NVLink domain to RDMA domain"; tests/test_internode.py at
3b1045db counts `num_rdma_token_sent` per (token, destination node) and `recv_x` per (token,
destination rank)): DeepEP sends a token once to each rank that holds one of its experts, never once
per expert, and across nodes once per destination node over RDMA, to the GPU of that node with the
sender's local index, which forwards it over NVLink to the node's destination ranks. Its buffers
take the group's ranks 8 to an NVLink node (NUM_MAX_NVL_PEERS, csrc/kernels/configs.cuh:3,
deep_ep.cpp Buffer::Buffer rdma_rank = rank / 8). The combine runs the same path backwards, summing
on the forwarder before the RDMA hop, so it moves the same bytes. Both frameworks hand DeepEP 16-bit
activations, never fp8: Megatron passes the layer's hidden states to Buffer.dispatch as they are
(Megatron-LM@d98e8a64 megatron/core/transformer/moe/fused_a2a.py:72-131), torchtitan too
(pytorch/torchtitan@v0.2.2 torchtitan/distributed/deepep/deepep.py:93-111, 393-446).

Per rank and pass, with t tokens, R the expected destination ranks and N the expected destination
nodes of one token (destinations), k ranks per node and n nodes in the group:

    NVLink bytes = t · R · (k − 1)/k · h · 2    (the 1/k a rank forwards to itself stays in HBM)
    RDMA bytes   = t · N · (n − 1)/n · h · 2    (the own node's share never reaches the NIC)
    time         = max(NVLink bytes / (NVLINK_FRACTION · NVLink rate),
                       RDMA bytes / (RDMA_FRACTION · NIC rate / oversubscription))

the two links pipelined through DeepEP's chunked buffers, so the slower one sets the pace (the
README's "bottleneck bandwidth"). No size curve and no latency floor: the fractions are read at the
README's 4096 tokens x 7168 hidden, and short messages are priced at that rate.
"""

from __future__ import annotations

import math

from cost_models.comm import domain_link_share, oversubscription, placement
from cost_models.enums import Framework
from cost_models.flops import local_tokens
from cost_models.job import Job
from cost_models.units import GB, MiB

ACT_BYTES = 2  # bf16 tokens in both directions (module docstring)

# DeepEP takes a group's ranks 8 to an NVLink node, at most 20 nodes (deepseek-ai/DeepEP@b57e5e2
# csrc/kernels/configs.cuh:3-4 NUM_MAX_NVL_PEERS, NUM_MAX_RDMA_PEERS; deep_ep.cpp Buffer::Buffer
# asserts num_ranks < 8 or num_ranks % 8 == 0, and num_ranks <= 8 x 20).
NVL_PEERS = 8
RDMA_PEERS = 20

# Link efficiencies of the normal kernels, from DeepEP's published bottleneck bandwidths on H800 with
# one CX7 400 Gb/s NIC per GPU (deepseek-ai/DeepEP@3b1045db README.md "Normal kernels" table, the
# figures after the 2025-04-22 optimization; shared/reference/collectives.md §3.1). The tests count
# the bytes a rank's own node or own rank receives as well (test_internode.py, test_intranode.py at
# 3b1045db: num_rdma_token_sent and recv_x include them), which never cross the link, so each figure
# is scaled to the bytes that do before it is divided by the link's rate:
# - NVLink, intranode EP 8: dispatch 153, combine 158 GB/s; by symmetry 7/8 of a rank's received
#   tokens come from the 7 others. Over H800's 200 GB/s per direction (8 NVLink 4 links; DeepSeek's
#   "400 GB/s" bidirectional, 160 GB/s its own measured maximum, deepseek-ai/DeepSeek-V3 issue 28,
#   collectives.md §3.4): (153 + 158)/2 x 7/8 / 200 = 0.680. AWS measured 331.8 and 321.9 GB/s
#   (bf16 dispatch, combine; 24 SMs) on p5en H200 at 450 GB/s: 0.645 and 0.626 the same way
#   (aws-samples/awsome-distributed-training@fd3d76d4 micro-benchmarks/expert-parallelism/
#   deepep-benchmark/README.md; collectives.md §3.4).
# - RDMA, internode EP 32 (4 nodes; top-4 groups of 4 nodes: a token's own node is 1/4 of the nodes
#   it reaches) dispatch 58, combine 57 GB/s, and EP 64 (8 nodes; top-4 of 8 groups: its own node is
#   among them half the time, 1/8 of them on average) dispatch 51, combine 50 GB/s; over the CX7's
#   50 GB/s: (58·3/4 + 57·3/4 + 51·7/8 + 50·7/8) / 4 / 50 = 0.873. EP 16 is left out: there the NVLink
#   forward is the slower link (this module gives 47 GB/s of RDMA-counted traffic bound by NVLink,
#   against the published 43).
H800_NVLINK_BYTES_PER_S = 200 * GB
CX7_BYTES_PER_S = 50 * GB
NVLINK_FRACTION = (153 + 158) / 2 * GB * 7 / 8 / H800_NVLINK_BYTES_PER_S
RDMA_FRACTION = (58 * 3 / 4 + 57 * 3 / 4 + 51 * 7 / 8 + 50 * 7 / 8) / 4 * GB / CX7_BYTES_PER_S

# Buffer sizing (deepseek-ai/DeepEP@b57e5e2): the SMs the normal kernels run on, Buffer.num_sms = 20
# (deep_ep/buffer.py:30), which neither framework changes (Megatron-LM@d98e8a64
# megatron/core/transformer/moe/token_dispatcher.py:1287-1292 sets 20; torchtitan v0.2.2 never calls
# set_num_sms); two SMs per channel (csrc/config.hpp get_*_buffer_size_hint, num_sms / 2).
NUM_SMS = 20
# Buffer.get_dispatch_config / get_combine_config (deep_ep/buffer.py:245-288): group size ->
# (nvl chunked recv tokens, rdma chunked send tokens, rdma chunked recv tokens); the group sizes
# listed are the only ones DeepEP accepts (assert num_ranks in config_map).
DISPATCH_CONFIG = {2: (256, 6, 128), 4: (256, 6, 128), 8: (256, 6, 128), 16: (288, 20, 128), 24: (288, 8, 128),
                   32: (288, 8, 128), 48: (288, 8, 128), 64: (288, 8, 128), 96: (480, 12, 128),
                   128: (560, 12, 128), 144: (720, 12, 128), 160: (720, 12, 128)}
COMBINE_CONFIG = {2: (256, 6, 128), 4: (256, 6, 128), 8: (256, 6, 128), 16: (288, 12, 128), 24: (288, 8, 128),
                  32: (288, 8, 128), 48: (288, 8, 128), 64: (288, 8, 128), 96: (480, 8, 128),
                  128: (560, 8, 128), 144: (720, 8, 128), 160: (720, 8, 128)}
GROUP_SIZES = tuple(DISPATCH_CONFIG)
# per buffered token, besides its hidden bytes (csrc/config.hpp get_*_buffer_size_hint):
# SourceMeta (two ints, csrc/kernels/internode.cu:17-18), kNumMaxTopK = 128 topk_idx_t (int64 unless
# built with TOPK_IDX_BITS=32, configs.cuh:63-70) and 128 float weights, kNumMaxScales = 128 floats
TOKEN_META_BYTES = 2 * 4 + 128 * 8 + 128 * 4 + 128 * 4
# cudaMalloc'd beside the buffers: the 32 MiB workspace (deep_ep.cpp Buffer::Buffer,
# NUM_WORKSPACE_BYTES, configs.cuh:5)
WORKSPACE_BYTES = 32 * MiB


def group_size(job: Job) -> int:
    """Ranks of the DeepEP group: Megatron's flex dispatcher runs over the expert-tp x ep group
    (Megatron-LM@d98e8a64 token_dispatcher.py:1835-1843, tp_ep_group), torchtitan's over ep."""
    return job.layout.ep * job.etp


def _touched(experts: int, top_k: int, unit: int, groups: int | None, group_top_k: int | None) -> float:
    """Probability that a block of `unit` consecutive experts holds at least one of a token's top_k
    under uniform routing; with group-limited routing (experts in `groups` equal groups, a token's
    top_k chosen within its best `group_top_k` groups, uniform inside them) where blocks and groups
    nest one in the other; a block that straddles groups is priced as uniform routing."""
    if groups is None or group_top_k is None or groups <= 1:
        return 1 - math.comb(experts - unit, top_k) / math.comb(experts, top_k)
    size = experts // groups
    pool = group_top_k * size  # the experts a token may choose from
    if unit <= size and size % unit == 0:  # the block lies in one group, chosen group_top_k/groups of the time
        return group_top_k / groups * (1 - math.comb(pool - unit, top_k) / math.comb(pool, top_k))
    if unit % size == 0:  # the block holds `inside` whole groups, i of them chosen (hypergeometric)
        inside = unit // size
        miss = sum(math.comb(inside, i) * math.comb(groups - inside, group_top_k - i) / math.comb(groups, group_top_k)
                   * math.comb(pool - i * size, top_k) / math.comb(pool, top_k)
                   for i in range(0, min(inside, group_top_k) + 1))
        return 1 - miss
    return 1 - math.comb(experts - unit, top_k) / math.comb(experts, top_k)


def destinations(job: Job) -> tuple[float, float]:
    """(ranks, nodes) of the DeepEP group one token is expected to reach: the ep ranks and the nodes
    holding at least one of its experts (experts laid out in order over the ep ranks, ep ranks over
    nodes 8 at a time), each ep rank's etp replicas all receiving it (Megatron's flex dispatcher
    copies the routing map over expert-tp, token_dispatcher.py:1893-1919)."""
    moe = job.model.moe
    assert moe is not None
    e, ep = moe.num_experts, job.layout.ep
    groups, group_k = moe.router_groups, moe.router_group_top_k
    ranks = ep * _touched(e, moe.top_k, e // ep, groups, group_k) * job.etp
    _, nodes = _node_split(job)
    return ranks, nodes * _touched(e, moe.top_k, e // nodes, groups, group_k)


def _node_split(job: Job) -> tuple[int, int]:
    """(ranks per node, nodes) of the DeepEP group: its ranks taken 8 at a time (NVL_PEERS)."""
    n = group_size(job)
    per_node = min(n, NVL_PEERS)
    return per_node, n // per_node


def pass_seconds(job: Job) -> float:
    """One pass of an MoE layer's DeepEP exchange: dispatch and combine, each at the pace of its
    slower link (module docstring), the busiest rank's bytes (TrainingSpec.moe_load_factor, as
    step_time._ep_comm applies it)."""
    if group_size(job) == 1:
        return 0.0
    cl = job.cluster.spec
    ranks, nodes = destinations(job)
    per_node, n_nodes = _node_split(job)
    token = local_tokens(job) * job.model.hidden_size * ACT_BYTES * job.training.moe_load_factor
    nvl_bytes = token * ranks * (per_node - 1) / per_node
    nvl_rate = NVLINK_FRACTION * cl.scaleup_bandwidth_bytes_per_s * domain_link_share(cl, per_node)
    seconds = nvl_bytes / nvl_rate
    if n_nodes > 1:
        over = oversubscription(cl, placement(cl, group_size(job), 1).span_gpus)
        rdma_bytes = token * nodes * (n_nodes - 1) / n_nodes
        seconds = max(seconds, rdma_bytes / (RDMA_FRACTION * cl.nic_bandwidth_bytes_per_s / over))
    return 2 * seconds


def _align_up(a: int, b: int) -> int:
    return -(-a // b) * b


def buffer_bytes(job: Job) -> int:
    """Device bytes DeepEP's Buffer takes outside torch's caching allocator: the NVLink buffer
    (cudaMalloc'd and shared by IPC handle), the RDMA buffer (NVSHMEM's symmetric heap) and the
    workspace (deep_ep.cpp Buffer::Buffer at b57e5e2), sized as both frameworks ask: the larger of
    the dispatch and combine configs' size hints for the group and 16-bit tokens of width h
    (Megatron-LM@d98e8a64 fused_a2a.py:24-69 get_buffer; torchtitan v0.2.2 deepep.py:288-317, the
    same code). 0 for a group of one (no DeepEP) or of a size DeepEP rejects (the deepep rule says so)."""
    n = group_size(job)
    if n == 1 or n not in DISPATCH_CONFIG:
        return 0
    hidden = job.model.hidden_size * ACT_BYTES
    channels = NUM_SMS // 2
    nvl_ranks, rdma_ranks = min(n, NVL_PEERS), max(n // NVL_PEERS, 1)
    nvl = rdma = 0
    for config in (DISPATCH_CONFIG[n], COMBINE_CONFIG[n]):
        nvl_recv, rdma_send, rdma_recv = config
        rdma_recv = _align_up(rdma_recv, rdma_send)  # Config's constructor rounds it up (config.hpp)
        nvl = max(nvl, _align_up(channels * nvl_ranks * (2 * rdma_ranks + 3) * 4
                                 + channels * nvl_ranks * nvl_recv * (hidden + TOKEN_META_BYTES), 128))
        if n > NVL_PEERS:  # intranode groups ask for no RDMA buffer ("legacy mode")
            rdma = max(rdma, _align_up(channels * rdma_ranks * (NVL_PEERS * 2 + 2) * 2 * 4
                                       + channels * rdma_ranks * rdma_recv * (hidden + TOKEN_META_BYTES + 16) * 2, 128))
    return nvl + rdma + WORKSPACE_BYTES


def framework_ships(framework: Framework) -> bool:
    """Megatron-LM (flex token dispatcher, DeepEP backend) and torchtitan (expert_parallel_comm_backend
    "deepep", v0.2.2 torchtitan/config/job_config.py:474-483) ship DeepEP; DeepSpeed does not."""
    return framework in (Framework.MEGATRON, Framework.TORCHTITAN)
