"""NCCL collectives (cost_models.comm): published nccl-tests plateaus no constant was set from
(benchmarks/data/kernel_measurements.yaml), the size curves, NCCL's latency floor and placement."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))

import kernel_accuracy  # noqa: E402

from cost_models import comm  # noqa: E402
from cost_models.comm import Collective, bus_factor, collective_time, placement, size_share  # noqa: E402
from cost_models.enums import ScaleupTopology  # noqa: E402
from cost_models.hardware import NetworkTier  # noqa: E402
from planner import presets  # noqa: E402

CLUSTERS = presets.clusters()
H100 = CLUSTERS["dgx-h100"]
GiB, MiB = 2**30, 2**20


def busbw_bytes_per_s(op: Collective, size: float, n: int, cluster=H100, stride: int = 1) -> float:
    return bus_factor(op, n) * size / collective_time(op, size, placement(cluster, n, stride), cluster)


def test_plateaus_match_the_published_bus_bandwidths():
    # NVIDIA's GTC slides, nccl-tests #309 and AWS p6-b200 at >= 1 GiB: within 5% (the slides give
    # the plateau to the nearest ~5-10 GB/s; A100's 240 GB/s NCCL constant against the 232 measured)
    plateau = [c for c in kernel_accuracy.checks() if c.kind == "collective" and float(c.what.split()[-2]) >= 1]
    assert len(plateau) == 12
    assert all(abs(c.error) <= 0.05 for c in plateau), [(c.what, round(c.error, 3)) for c in plateau]


def test_a_multi_node_ring_runs_at_its_slowest_link_pipelined():
    # 4 nodes of 8: NVLink (370.8) and 8 NICs at 47 GB/s each (376) run at once: the NVLink side
    # decides on DGX H100; on DGX A100 the 8x200G NICs (8 x 23.5 = 188) are slower than NVLink (240)
    big = 16 * GiB  # the end of the measured curves: on the plateau
    assert busbw_bytes_per_s(Collective.ALL_GATHER, big, 32) == pytest.approx(370.8e9, rel=0.01)
    a100 = CLUSTERS["dgx-a100-80gb"]
    assert busbw_bytes_per_s(Collective.ALL_GATHER, big, 32, a100) == pytest.approx(8 * 25e9 * 0.94, rel=0.01)


def test_mid_size_collectives_run_below_the_plateau_and_more_so_across_more_nodes():
    # 64 MiB: 0.755 of the plateau in one node (Azure 8-GPU curves), 0.61 at 32 GPUs and 0.29 at
    # 8192 (NVIDIA's NVLSTree scan); node counts between them fall in between
    shares = [size_share(64 * MiB, nodes) for nodes in (1, 2, 4, 8, 32, 128, 1024, 4096)]
    assert shares == sorted(shares, reverse=True)
    sizes = [busbw_bytes_per_s(Collective.ALL_REDUCE, s, 256, stride=1) for s in (MiB, 16 * MiB, 256 * MiB, 4 * GiB)]
    assert sizes == sorted(sizes)


def test_gradient_reduction_over_thousands_of_ranks_slows_at_mid_sizes():
    # the same 64 MiB bucket all-reduced over 32 and 8192 GPUs: the scan's 230 vs 105 GB/s
    t32 = collective_time(Collective.ALL_REDUCE, 64 * MiB, placement(H100, 32, 1), H100)
    t8k = collective_time(Collective.ALL_REDUCE, 64 * MiB, placement(H100, 8192, 1), H100)
    assert t8k / t32 == pytest.approx((0.613 / 0.286) * (2 * 8191 / 8192) / (2 * 31 / 32), rel=0.01)


def test_small_messages_pay_nccls_latency():
    # an 8-byte all-reduce in one node: the LL protocol's 6.6 µs base plus 14 steps of 0.6 µs
    # (NCCL tuning.cc hwLatencies, NVLink), or the size curve's floor, whichever is longer
    t = collective_time(Collective.ALL_REDUCE, 8, placement(H100, 8, 1), H100)
    assert t >= 6.6e-6 + 14 * 0.6e-6
    # 32 KiB on 8 A100s: nccl-tests 43.83 µs (ml-engineering, a run the curves were not read from);
    # within 25% (the curve is the median of three Azure curves that scatter by as much)
    a100 = CLUSTERS["dgx-a100-80gb"]
    assert collective_time(Collective.ALL_REDUCE, 32 * 1024, placement(a100, 8, 1), a100) == pytest.approx(43.83e-6, rel=0.25)


# NCCL v2.30.7-1 tuning.cc tree LL: base 6.8 µs (:151), 0.6 µs a NVLink step (:159), 5.0 µs a network
# level (:171), start-up 6.8 + 2·((ppn − 1)·0.6 + log2i(nodes)·5.0) (:416); 25.2 µs at 2 nodes of 8.
# Measured 8-byte all-reduce over 2 x 8 GPUs: 47.60 µs over InfiniBand (nccl issue 1244), 69.12 µs
# over EFA (awsome-distributed-training 2 x p5); the ratio to 25.2 scales the model.
IB_RATIO, EFA_RATIO = 47.60 / 25.2, 69.12 / 25.2


# (2 nodes is the calibration point itself, 47.60 µs by construction, so not a case)
@pytest.mark.parametrize(("nodes", "levels", "ll_cap"), [(8, 3, 19.0e9), (56, 5, 19.0e9)])
def test_a_tiny_all_reduce_across_nodes_costs_nccls_tree_ll(nodes, levels, ll_cap):
    # 4 bytes over `nodes` whole DGX H100 nodes (InfiniBand): 8 nodes
    # (6.8 + 2·(4.2 + 3·5.0)) x 1.889 = 85.38 µs, 56 nodes (log2i 5) 65.2 x 1.889 = 123.16 µs; the
    # bytes at half the LL cap (22.5 GB/s at 2 nodes, 19.0 beyond: the lower host row, :179-180) add
    # under 1 ns. Reading the 1 MiB curve point flat gave 55, 174 and 376 µs.
    t = collective_time(Collective.ALL_REDUCE, 4, placement(H100, 8 * nodes, 1), H100)
    hand = (6.8e-6 + 2 * (7 * 0.6e-6 + levels * 5.0e-6)) * IB_RATIO + 4 / (0.5 * ll_cap)
    assert t == pytest.approx(hand, rel=1e-6)
    assert t == pytest.approx({8: 85.38e-6, 56: 123.16e-6}[nodes], abs=0.01e-6)


def test_a_tiny_all_reduce_over_16_gpus_stays_in_the_measured_band():
    # the 8-byte all-reduces measured over 2 nodes of 8 H100-class GPUs took 47.60 (InfiniBand) to
    # 69.12 µs (EFA); the EFA preset prices its own inside that band (its size curve's 54.8 µs, below
    # its tree LL cap of 69.12); the InfiniBand one is the calibration point, 47.60 by construction
    efa = CLUSTERS["hf-science-p5"]
    t = collective_time(Collective.ALL_REDUCE, 8, placement(efa, 16, 1), efa)
    assert 47.60e-6 * (1 - 1e-6) <= t <= 69.12e-6
    assert collective_time(Collective.ALL_REDUCE, 8, placement(efa, 64, 1), efa) == pytest.approx(
        45.2e-6 * EFA_RATIO, rel=1e-4)  # 8 nodes at EFA's ratio: 123.98 µs


def test_nccls_tree_ll_model_of_16_gpus_is_its_logged_time():
    # NCCL's tree LL start-up over 2 nodes of 8: 6.8 + 2·(7·0.6 + log2i(2)·5.0) = 25.2 µs
    # (tuning.cc:151, :159, :171, :416); its log (nccl issue 1453, 8-GPU H100 nodes) prints 25.214764 µs
    # for a 128-byte all-reduce, the latency plus 128 bytes at the LL tree bandwidth (a few GB/s:
    # under 0.02 µs), so the two agree to 0.02 µs
    assert comm.TREE_LL_16_GPUS_S == pytest.approx(25.2e-6, rel=1e-9)  # NCCL's log: 25.214764 µs


@pytest.mark.parametrize(("algorithm", "protocol", "micro_s"), [
    # 4 nodes of 8 (log2i 2 levels), base + 2·(7·intra + 2·inter), tuning.cc:151, :159, :171, :416
    (comm.Algorithm.TREE, comm.Protocol.LL, 6.8 + 2 * (7 * 0.6 + 2 * 5.0)),  # 35.2
    (comm.Algorithm.TREE, comm.Protocol.LL128, 14.0 + 2 * (7 * 1.25 + 2 * 8.5)),  # 65.5
    (comm.Algorithm.TREE, comm.Protocol.SIMPLE, 8.4 + 2 * (7 * 4.0 + 2 * 14.0)),  # 120.4
    # a ring of 32: 62 steps, 2·3 = 6 of them over the network (:411-412); an NVLink step across
    # nodes costs at least the host's 1 µs post overhead, 3 µs for Simple (:404-410)
    (comm.Algorithm.RING, comm.Protocol.LL, 6.6 + 56 * 1.0 + 6 * 2.7),  # 78.8
    (comm.Algorithm.RING, comm.Protocol.LL128, 14.0 + 56 * 1.9 + 6 * 4.0),  # 144.4
    (comm.Algorithm.RING, comm.Protocol.SIMPLE, 8.4 + 56 * 3.4 + 6 * 14.0),  # 282.8
])
def test_the_latency_floor_and_the_tree_ll_price_read_one_table(algorithm, protocol, micro_s):
    # an all-reduce over 4 DGX H100 nodes (the preset carries NCCL's own Ring/Simple hop latencies,
    # so nothing is scaled): each (algorithm, protocol) start-up from tuning.cc's tables
    where = placement(H100, 32, 1)
    assert comm._latency(Collective.ALL_REDUCE, where, H100, algorithm, protocol) == pytest.approx(micro_s * 1e-6, rel=1e-9)


def test_a_small_all_reduce_across_nodes_is_the_floors_tree_ll_at_the_measured_ratio():
    # over 4 DGX H100 nodes the floor's Tree/LL start-up is 35.2 µs (above); the small all-reduce takes
    # it at 47.60/25.2 (InfiniBand), and 8 bytes add 8 / (0.5 · 19 GB/s), under 1 ns
    where = placement(H100, 32, 1)
    assert comm.small_all_reduce_seconds(8, where, H100, start_up_s=35.2e-6) == pytest.approx(
        35.2e-6 * IB_RATIO + 8 / (0.5 * 19e9), rel=1e-9)


def test_a_ring_with_one_rank_a_node_pays_trees_network_hop():
    # ppn 1: NCCL prices a ring's network steps at Tree's network latency (tuning.cc:386-388): an LL
    # all-reduce over 4 ranks on 4 nodes, 6.6 + 6 x 5.0 = 36.6 µs (Ring's own 2.7 would give 22.8);
    # Simple is 14 µs for both: 8.4 + 6 x 14 = 92.4 µs
    where = placement(H100, 4, 8)
    assert where.per_domain == 1
    ring = comm.Algorithm.RING
    assert comm._latency(Collective.ALL_REDUCE, where, H100, ring, comm.Protocol.LL) == pytest.approx(36.6e-6, rel=1e-9)
    assert comm._latency(Collective.ALL_REDUCE, where, H100, ring, comm.Protocol.SIMPLE) == pytest.approx(92.4e-6, rel=1e-9)


def test_an_uneven_group_counts_every_domain_it_touches():
    # 3 ranks 4 apart on 8-GPU nodes: 2 in the first node, 1 in the second; the ring crosses the
    # network twice (2·(2 − 1) steps of 4): LL 6.6 + 2 x 1.0 + 2 x 2.7 = 14.0 µs
    where = placement(H100, 3, 4)
    assert (where.n, where.per_domain) == (3, 2)
    assert comm._latency(Collective.ALL_REDUCE, where, H100, comm.Algorithm.RING, comm.Protocol.LL) == pytest.approx(
        14.0e-6, rel=1e-9)


def test_from_1_mib_up_the_cross_node_curve_prices_the_all_reduce():
    # 1 MiB over 8 nodes: the all-reduce scan's share at 1 MiB, 0.040 at 4 nodes and 0.016 at 32,
    # read in log2 at 8: 0.032; 2·63/64 MiB at 0.032 x 370.8 GB/s = 174.0 µs, above the tree LL's
    # 85.4 µs + 1 MiB at 0.5 x 19 GB/s, which is not applied at this size
    t = collective_time(Collective.ALL_REDUCE, MiB, placement(H100, 64, 1), H100)
    assert t == pytest.approx(2 * 63 / 64 * MiB / (0.032 * 18 * 20.6e9), rel=1e-3)


def test_a_ring_reduce_scatter_across_many_nodes_pays_its_steps():
    # 100 MiB reduce-scattered over 336 ranks, 2 a node (stride 4: GPT-3's data-parallel group at tp
    # 4): 168 nodes, a ring of 335 steps, 167 of them over the network. NCCL's ring latency (Simple)
    # 8.4 + 168 x 3.4 + 167 x 14 = 2917.6 us, plus 335/336 x 104,857,600 bytes at the plateau of two
    # NICs a node (2 x 50 GB/s x 0.94 = 94 GB/s): 1112.2 us; 4029.8 us in all, longer than the size
    # curve's 2.6 ms (an all-reduce curve: its tree crosses the nodes in log2 steps)
    where = placement(H100, 336, 4)
    assert (where.n, where.per_domain) == (336, 2)
    size = 100 * MiB
    ring = 8.4e-6 + 168 * 3.4e-6 + 167 * 14e-6 + 335 / 336 * size / 94e9
    assert collective_time(Collective.REDUCE_SCATTER, size, where, H100) == pytest.approx(ring, rel=1e-9)
    assert collective_time(Collective.ALL_GATHER, size, where, H100) == pytest.approx(ring, rel=1e-9)
    # that latency is NCCL's Simple ring's; ring_fill_seconds adds the bytes it is given at the plateau it
    # is given to the latency it is given
    latency = 8.4e-6 + 168 * 3.4e-6 + 167 * 14e-6
    ring_latency = comm._latency(Collective.REDUCE_SCATTER, where, H100, comm.Algorithm.RING, comm.Protocol.SIMPLE)
    assert ring_latency == pytest.approx(latency, rel=1e-9)
    assert comm.ring_fill_seconds(Collective.REDUCE_SCATTER, size, 94e9, where, latency_s=ring_latency) == pytest.approx(
        latency + size / 94e9, rel=1e-9)
    assert comm.ring_fill_seconds(Collective.REDUCE_SCATTER, size, 94e9, where, latency_s=1e-3) == pytest.approx(
        1e-3 + size / 94e9, rel=1e-9)
    # not for an all-reduce (tree across nodes), one member a node (PAT), or inside one node
    for op, w in ((Collective.ALL_REDUCE, where), (Collective.REDUCE_SCATTER, placement(H100, 336, 8)),
                  (Collective.REDUCE_SCATTER, placement(H100, 8, 1))):
        assert comm.ring_fill_seconds(op, size, 94e9, w, latency_s=ring_latency) == 0.0


def test_cross_node_all_to_all_goes_through_the_nics_at_the_measured_fraction():
    # 0.77 of the NIC model, from the DGX H100 row (48 of 62.7 GB/s); the DGX A100 row (24 GB/s)
    # is the check, in kernel_accuracy's table
    [a2a] = [c for c in kernel_accuracy.checks() if "all_to_all" in c.what]
    assert abs(a2a.error) <= 0.05
    assert comm.CROSS_NODE_ALL_TO_ALL_FRACTION == pytest.approx(48 / 62.7, rel=0.01)


def test_placement_counts_the_members_each_domain_holds():
    assert placement(H100, 8, 1).per_domain == 8  # tp 8: one node
    assert placement(H100, 16, 8).per_domain == 1  # dp over 16 nodes, one member per node
    assert placement(H100, 32, 2).per_domain == 4  # tp 2 inside: 4 members per node


def test_an_oversubscribed_tier_slows_groups_that_cross_it():
    slim = H100.model_copy(update={"network_tiers": (NetworkTier(name="leaf", gpus=64, oversubscription=2.0),)})
    # 16 nodes, one member each (stride 8): the NICs carry the ring, at half rate beyond the leaf
    inside = busbw_bytes_per_s(Collective.ALL_GATHER, 8 * GiB, 8, slim, stride=8)
    across = busbw_bytes_per_s(Collective.ALL_GATHER, 8 * GiB, 16, slim, stride=8)
    assert across / inside == pytest.approx(0.5 * size_share(8 * GiB, 16) / size_share(8 * GiB, 8), rel=0.01)


def test_a_switchless_mesh_gives_a_group_only_the_links_among_its_members():
    # 4 H200 SXM without an NVSwitch: 18 NVLinks per GPU, 6 to each peer. NCCL prices a direct path
    # at links x 20.6 GB/s (topo.h SM90, topo.cc ncclTopoAddNvLinks): a pair 6 x 20.6 = 123.6 GB/s,
    # the whole board 18 x 20.6 = 370.8 (as behind a switch); on the plateau (8 GiB: share 1.0)
    kempner, hgx = CLUSTERS["kempner-h200"], CLUSTERS["hgx-h200"]
    big = 8 * GiB
    assert busbw_bytes_per_s(Collective.ALL_REDUCE, big, 2, kempner) == pytest.approx(6 * 20.6e9, rel=1e-3)
    assert busbw_bytes_per_s(Collective.ALL_REDUCE, big, 4, kempner) == pytest.approx(18 * 20.6e9, rel=1e-3)
    assert busbw_bytes_per_s(Collective.ALL_REDUCE, big, 2, hgx) == pytest.approx(18 * 20.6e9, rel=1e-3)
    # dp 2 over tp 2 (stride 2): GPUs 0 and 2, again one pair's 6 links
    assert busbw_bytes_per_s(Collective.ALL_GATHER, big, 2, kempner, stride=2) == pytest.approx(6 * 20.6e9, rel=1e-3)
    # a pair per node across two nodes (stride 2) with 800 Gb/s NICs: the pair's NVLink (123.6)
    # against 2 NICs (2 x 0.94 x 100 = 188): the pair's links decide, where a switch would leave the NICs
    fast = {"nic_bandwidth_bytes_per_s": 100e9}
    across = busbw_bytes_per_s(Collective.ALL_GATHER, 16 * GiB, 4, kempner.model_copy(update=fast), stride=2)
    assert across == pytest.approx(6 * 20.6e9, rel=1e-3)
    switched = kempner.model_copy(update={**fast, "scaleup_topology": ScaleupTopology.SWITCH})
    assert busbw_bytes_per_s(Collective.ALL_GATHER, 16 * GiB, 4, switched, stride=2) == pytest.approx(188e9, rel=1e-3)
    # the copy engine writes to one peer over that peer's 6 links: 3x the switch's time, less the launches
    one, three = (comm.copy_engine_p2p_time(GiB, c, launch_s=0.0) for c in (hgx, kempner))
    assert three / one == pytest.approx(3.0, rel=1e-9)


def test_an_mi300x_pair_runs_over_its_one_xgmi_link():
    # 7 links of 64 GB/s per direction, one to each peer (the preset's AMD sources): a pair reaches
    # 1/7 of the 8-GPU ring's bus bandwidth, four GPUs 3/7, all eight the whole
    mi300x = CLUSTERS["mi300x-8"]
    whole = busbw_bytes_per_s(Collective.ALL_REDUCE, 8 * GiB, 8, mi300x)
    assert busbw_bytes_per_s(Collective.ALL_REDUCE, 8 * GiB, 2, mi300x) / whole == pytest.approx(1 / 7, rel=1e-9)
    assert busbw_bytes_per_s(Collective.ALL_REDUCE, 8 * GiB, 4, mi300x) / whole == pytest.approx(3 / 7, rel=1e-9)


# Hugging Face's science cluster (AWS p5, EFA): the Ultra-Scale Playbook's medians at 256 MB over
# whole nodes of 8 (presets/clusters.toml hf-science-p5)
P5 = CLUSTERS["hf-science-p5"]


@pytest.mark.parametrize(("op", "nodes", "gb_per_s"), [
    (Collective.ALL_REDUCE, 4, 160.1), (Collective.ALL_REDUCE, 16, 84.7), (Collective.ALL_REDUCE, 64, 32.9),
    (Collective.ALL_GATHER, 8, 69.0), (Collective.ALL_GATHER, 64, 11.0), (Collective.REDUCE_SCATTER, 32, 27.9)])
def test_a_measured_cluster_reproduces_its_own_collectives(op, nodes, gb_per_s):
    # a 256 MiB collective over every GPU of `nodes` nodes runs at the playbook's median; all of them
    # below the per-NIC model (8 x 47 GB/s, 370.8 on NVLink, times the size share), which would give
    # 309.6 at 4 nodes and 263.6 at 64; the 64-node all-gather takes 511/512 x 256 MiB / 11.0 GB/s = 24.36 ms
    assert busbw_bytes_per_s(op, 256 * MiB, 8 * nodes, P5) == pytest.approx(gb_per_s * 1e9, rel=1e-9)
    if (op, nodes) == (Collective.ALL_GATHER, 64):
        assert collective_time(op, 256 * MiB, placement(P5, 512, 1), P5) == pytest.approx(24.357e-3, rel=1e-4)


def test_a_measured_cluster_reads_between_its_node_counts_and_carries_the_size_curve():
    # 48 nodes: log2 between 32 (64.9) and 64 (32.9): 64.9 - log2(1.5) x 32.0 = 46.18 GB/s
    assert busbw_bytes_per_s(Collective.ALL_REDUCE, 256 * MiB, 384, P5) == pytest.approx(46.18e9, rel=1e-3)
    # 1 GiB at 32 nodes: the measurement times the 32-node curve's 1 GiB over 256 MiB share,
    # 64.9 x 0.915 / 0.733 = 81.0 GB/s (still under the NIC model's 370.8 x 0.915)
    assert busbw_bytes_per_s(Collective.ALL_REDUCE, GiB, 256, P5) == pytest.approx(64.9e9 * 0.915 / 0.733, rel=1e-3)


def test_a_measured_cluster_keeps_the_nic_bound_where_it_is_lower():
    # 2 nodes: the measured all-reduce (361.7) is above the model's 370.8 x share(256 MiB, 2 nodes) = 321.7,
    # so the model stands, as on DGX H100 whose links are the same
    assert busbw_bytes_per_s(Collective.ALL_REDUCE, 256 * MiB, 16, P5) == pytest.approx(busbw_bytes_per_s(Collective.ALL_REDUCE, 256 * MiB, 16), rel=1e-9)
    # one rank per node over 32 nodes: one NIC, 47 GB/s x 0.733, under the 64.9 measured
    one_per_node = busbw_bytes_per_s(Collective.ALL_REDUCE, 256 * MiB, 32, P5, stride=8)
    assert one_per_node == pytest.approx(50e9 * 0.94 * 0.733, rel=1e-3)
    # inside one node the NVLink model prices it (the 1-node points are not in the preset)
    assert busbw_bytes_per_s(Collective.ALL_GATHER, 256 * MiB, 8, P5) == pytest.approx(busbw_bytes_per_s(Collective.ALL_GATHER, 256 * MiB, 8), rel=1e-9)
    # and a cluster without measurements has none
    assert comm.measured_busbw(Collective.ALL_REDUCE, 256 * MiB, 32, H100) is None


def test_gb200_racks_reproduce_coreweaves_all_reduce_across_racks():
    # CoreWeave's GB200 NVL72 (presets/clusters.toml gb200-nvl72): 8 GiB over 20 whole racks (1440
    # GPUs, 72 per NVLink domain, so comm counts 20 domains) at the measured 381.48 GB/s, i.e.
    # 2 x 1439/1440 x 8589934592 B / 381.48 GB/s = 45.004 ms, the README's own "45004" us
    gb200 = CLUSTERS["gb200-nvl72"]
    t = collective_time(Collective.ALL_REDUCE, 8 * GiB, placement(gb200, 1440, 1), gb200)
    assert t == pytest.approx(45.004e-3, rel=1e-4)
    # 2 racks: the measured 793.06 GB/s lies above the NVLink-bound model (18 x 40.1 = 721.8 GB/s
    # times the size share), which stands
    assert busbw_bytes_per_s(Collective.ALL_REDUCE, 8 * GiB, 144, gb200) < 721.8e9
    # the points are all-reduce only: a reduce-scatter across racks keeps the per-NIC model
    assert comm.measured_busbw(Collective.REDUCE_SCATTER, 8 * GiB, 20, gb200) is None


def test_measured_points_are_one_per_collective_and_node_count():
    body = P5.model_dump()
    body["measured_busbw"] = [*body["measured_busbw"], body["measured_busbw"][0]]
    with pytest.raises(ValueError, match="one point per collective and node count"):
        type(P5).model_validate(body)
    body["measured_busbw"] = [{**P5.measured_busbw[0].model_dump(), "nodes": 1}]
    with pytest.raises(ValueError, match="nodes"):
        type(P5).model_validate(body)
