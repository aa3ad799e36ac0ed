"""MoEDispatch.DEEPEP: the rule of the frameworks that ship DeepEP, and the price of its normal
kernels (cost_models.deepep), each on a hand-worked case."""

from __future__ import annotations

import math

import pytest

from cost_models import deepep
from cost_models.calibration import DEFAULT
from cost_models.enums import MoEDispatch
from cost_models.errors import SpecError
from cost_models.step_time import _ep_comm, _etp_comm, ep_exposure
from cost_models.units import GB
from helpers import make_job
from planner import presets

MIXTRAL = presets.models()["mixtral-8x7b"]  # h 4096, 8 experts, top 2
DEEPSEEK = presets.models()["deepseek-v3"]  # h 7168, 256 experts, top 8 of the best 4 of 8 groups


def _moe(model, **moe):
    return model.model_copy(update=dict(moe=model.moe.model_copy(update=moe)))


def _deepep(model, gpus, cluster="dgx-h100", **layout):
    return make_job(model, gpus=gpus, cluster=cluster, mbs=layout.pop("mbs", 1),
                    training=dict(seq_len=layout.pop("seq_len", 4096), moe_dispatch="deepep"), **layout)


def test_intranode_dispatch_and_combine_move_each_token_once_per_destination_rank():
    job = _deepep(MIXTRAL, 8, ep=8)
    # 8 experts on 8 ranks, top 2: a token reaches 8·(1 − C(7,2)/C(8,2)) = 8·(1 − 21/28) = 2 ranks,
    # 7/8 of them another rank's: 4096 tokens · 2 · 7/8 · 4096 h · 2 B = 58,720,256 B over NVLink at
    # 0.6803125 · 450 GB/s = 306.14 GB/s = 191.81 µs, dispatch and combine alike: 383.62 µs
    assert deepep.destinations(job) == pytest.approx((2.0, 1.0))
    assert deepep.NVLINK_FRACTION == pytest.approx(0.6803125)
    assert deepep.pass_seconds(job) == pytest.approx(2 * 58_720_256 / (0.6803125 * 450 * GB), rel=1e-12)
    assert deepep.pass_seconds(job) == pytest.approx(383.62e-6, rel=1e-4)


def test_internode_sends_a_token_once_per_destination_node_over_rdma():
    job = _deepep(_moe(MIXTRAL, num_experts=16, top_k=4), 16, ep=16)
    # 16 experts on 16 ranks over 2 nodes, top 4: ranks 16·(1 − C(15,4)/C(16,4)) = 16·(1 − 1365/1820) = 4;
    # nodes 2·(1 − C(8,4)/C(16,4)) = 2·(1 − 70/1820) = 25/13. A token of 4096·2 = 8192 B:
    # NVLink 4096 · 4 · 7/8 · 8192 = 117,440,512 B at 306.14 GB/s = 383.6 µs;
    # RDMA 4096 · 25/13 · 1/2 · 8192 = 32,263,877 B at 0.873125 · 50 GB/s = 43.656 GB/s = 739.0 µs, the slower:
    # dispatch and combine 1478.1 µs
    ranks, nodes = deepep.destinations(job)
    assert (ranks, nodes) == pytest.approx((4.0, 25 / 13))
    assert deepep.RDMA_FRACTION == pytest.approx(0.873125)
    rdma = 4096 * 25 / 13 / 2 * 8192 / (0.873125 * 50 * GB)
    assert rdma == pytest.approx(739.04e-6, rel=1e-4)
    assert deepep.pass_seconds(job) == pytest.approx(2 * rdma, rel=1e-12)


def test_group_limited_routing_reaches_fewer_nodes():
    job = _deepep(DEEPSEEK, 64, ep=64)
    # 8 nodes of 32 experts, one router group each; a token picks 4 groups, then 8 of their 128 experts:
    # a node is reached when its group is picked (1/2) and one of the 8 falls in it:
    # 8 · 1/2 · (1 − C(96,8)/C(128,8)) = 4 · (1 − 0.09277) = 3.629 nodes, not the 8·(1 − C(224,8)/C(256,8)) = 5.25 of uniform routing
    miss = math.prod((96 - i) / (128 - i) for i in range(8))
    assert miss == pytest.approx(0.09277, rel=1e-3)
    assert deepep.destinations(job)[1] == pytest.approx(4 * (1 - miss), rel=1e-12)
    uniform = _deepep(_moe(DEEPSEEK, router_groups=None, router_group_top_k=None), 64, ep=64)
    assert deepep.destinations(uniform)[1] == pytest.approx(8 * (1 - math.prod((224 - i) / (256 - i) for i in range(8))), rel=1e-12)


def test_the_held_out_readme_row_is_reproduced():
    """DeepEP's README gives 43 GB/s (RDMA-counted) at EP 16 on H800 + CX7, a row the efficiencies
    were not read from: there the NVLink forward is the slower link. 4096 tokens of 7168, top 8 of
    256 experts, the best 2 of 2 node groups (tests/test_internode.py at 3b1045db). Within 15%: the
    fractions are means over the other rows, which themselves spread ±2%, and the routing within the
    chosen groups is taken as uniform."""
    model = _moe(DEEPSEEK, router_groups=2, router_group_top_k=2)
    job = _deepep(model, 16, cluster="h800-deepseek", ep=16)
    _, nodes = deepep.destinations(job)
    counted = 4096 * nodes * 7168 * 2  # num_rdma_token_sent · hidden · 2, the test's numerator
    assert counted / (deepep.pass_seconds(job) / 2) == pytest.approx(43 * GB, rel=0.15)


def test_deepep_beats_the_plain_all_to_all_where_it_deduplicates():
    # top 4 of 16 experts over 2 nodes: the plain all-to-all sends 4 copies, half of them across
    # nodes; DeepEP 25/13 node copies, half of them across: well under half the time
    model = _moe(MIXTRAL, num_experts=16, top_k=4)
    dedup = _deepep(model, 16, ep=16)
    plain = make_job(model, gpus=16, ep=16, mbs=1, training=dict(seq_len=4096))
    assert deepep.pass_seconds(dedup) < 0.5 * _ep_comm(plain)
    # top 1: every token reaches one rank either way, the same bytes; only the links' measured rates
    # differ (DeepEP 0.68, NCCL's all-to-all 320/450 = 0.71 of NVLink, at a 268 MB message 0.93 of
    # that plateau), so within 10%
    single = _moe(MIXTRAL, top_k=1)
    one = _deepep(single, 8, ep=8, mbs=4, seq_len=8192)
    plain = make_job(single, gpus=8, ep=8, mbs=4, training=dict(seq_len=8192))
    assert deepep.destinations(one)[0] == pytest.approx(1.0)
    assert deepep.pass_seconds(one) / _ep_comm(plain) == pytest.approx(1.0, abs=0.1)


def test_deepep_runs_on_the_compute_stream_and_replaces_the_etp_gather():
    job = make_job(_moe(MIXTRAL, num_experts=16, top_k=4), gpus=16, ep=8, tp=2, etp=2, mbs=1,
                   training=dict(seq_len=4096, moe_dispatch="deepep"))
    assert job.training.moe_dispatch is MoEDispatch.DEEPEP
    # Megatron's flex dispatcher: one group of etp·ep = 16 ranks, each token to both etp replicas
    assert deepep.group_size(job) == 16
    assert deepep.destinations(job)[0] == pytest.approx(2 * 8 * (1 - math.comb(14, 4) / math.comb(16, 4)))
    assert _etp_comm(job) == 0.0
    assert ep_exposure(job, 3, 1.0, DEFAULT).exposed == pytest.approx(3 * deepep.pass_seconds(job))
    assert ep_exposure(job, 3, 1.0, DEFAULT).contention == 0.0


def test_buffers_follow_the_size_hints():
    # EP 8 (intranode): 10 channels, 8 NVLink ranks, 256 tokens each of 14,336 + 2,056 B, plus
    # 10·8·(2·1 + 3) ints of counters: 335,709,760 B, rounded up to 128 B: 335,709,824; no RDMA buffer;
    # and the 32 MiB workspace
    job = _deepep(DEEPSEEK, 8, ep=8)
    assert deepep.buffer_bytes(job) == 335_709_824 + 32 * 2**20
    # EP 64: NVLink 10·8·288 tokens and RDMA 10·8 nodes·128 tokens, twice, of 14,336 + 2,056 + 16 B
    big = _deepep(DEEPSEEK, 64, ep=64)
    nvl = 10 * 8 * (2 * 8 + 3) * 4 + 10 * 8 * 288 * (14336 + 2056)
    rdma = 10 * 8 * (8 * 2 + 2) * 2 * 4 + 10 * 8 * 128 * (14336 + 2056 + 16) * 2
    assert deepep.buffer_bytes(big) == -(-nvl // 128) * 128 + -(-rdma // 128) * 128 + 32 * 2**20


@pytest.mark.parametrize("framework, layout, needle", [
    ("deepspeed", dict(ep=8), "moe_dispatch deepep is Megatron's flex token dispatcher"),
    ("torchtitan", dict(ep=1), "needs ep > 1 in torchtitan"),
    ("torchtitan", dict(ep=4, tp=2, etp=2), "runs with etp 1 in torchtitan"),
    ("megatron", dict(ep=1, tp=1), "needs etp·ep > 1"),
])
def test_the_frameworks_rules(framework, layout, needle):
    with pytest.raises(SpecError, match=needle):
        make_job("mixtral-8x7b", gpus=8, mbs=1, training=dict(framework=framework, moe_dispatch="deepep"), **layout)


def test_deepep_group_sizes_and_nodes():
    # 12 ranks: DeepEP has no config for them (Buffer.get_dispatch_config)
    with pytest.raises(SpecError, match=r"no config for a group of ep\(12\)·etp\(1\) = 12 ranks"):
        make_job(_moe(MIXTRAL, num_experts=12), gpus=24, cluster="dgx-h100", mbs=1, ep=12,
                 training=dict(moe_dispatch="deepep"))
    # a 4-GPU NVLink domain cannot hold DeepEP's 8-rank NVLink node
    with pytest.raises(SpecError, match="8 to an NVLink domain"):
        make_job(MIXTRAL, gpus=8, cluster="kempner-h200", mbs=1, ep=8, training=dict(moe_dispatch="deepep"))
    # both frameworks that ship it take a legal layout
    assert make_job(MIXTRAL, gpus=8, mbs=1, ep=8, training=dict(framework="torchtitan", moe_dispatch="deepep"))


def test_torchtitans_deepep_combine_holds_the_received_tokens_not_three_routed_copies():
    """DeepEPMoE at torchtitan@d021aa9ca: at the combine, the [received, h] sum DeepEP is handed and
    the [t, h] output it writes, both 16-bit (activations.moe_combine_bytes). ep 8 of Mixtral's 8
    experts, top 2: a token reaches 2 ranks, so 4096 tokens come with 8192 received: (8192 + 4096)
    · 4096 · 2 = 100,663,296 B in the forward; re-run under full recompute also the incoming 16-bit
    gradient, + 33,554,432. The all-to-all path holds 3 · 4096 · 2 · 4096 · 2 routed bytes and more."""
    from cost_models.activations import moe_combine_bytes
    from cost_models.enums import Recompute

    def job(dispatch):
        return make_job(MIXTRAL, gpus=8, ep=8, mbs=1, recompute="full",
                        training=dict(framework="torchtitan", seq_len=4096, moe_dispatch=dispatch))

    assert moe_combine_bytes(job("deepep"), 0, Recompute.NONE) == 100_663_296
    assert moe_combine_bytes(job("deepep"), 0, Recompute.FULL) == 100_663_296 + 33_554_432
    assert moe_combine_bytes(job("alltoall"), 0, Recompute.NONE) > 3 * 4096 * 2 * 4096 * 2


def test_deepeps_buffers_are_a_line_outside_the_allocator():
    from cost_models.memory import allocator_counters, memory_estimate

    def stage(dispatch):
        job = make_job(MIXTRAL, gpus=8, ep=8, mbs=1, training=dict(framework="torchtitan", seq_len=4096, moe_dispatch=dispatch))
        return job, memory_estimate(job).stages[0]

    job, deep = stage("deepep")
    _, plain = stage("alltoall")
    assert deep.breakdown.value("overhead/deepep_buffers") == deepep.buffer_bytes(job) > 0
    assert plain.breakdown.value("overhead/deepep_buffers") == 0
    # the reserved counter does not see them
    reserved, _ = allocator_counters(deep.breakdown)
    assert reserved == deep.breakdown.total - sum(deep.breakdown.value(k) for k in
                                                  ("overhead/cuda_context", "overhead/nccl", "overhead/deepep_buffers"))
