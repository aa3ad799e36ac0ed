"""Transformer Engine's delayed-scaling amax all-reduce that the compute stream waits for
(TrainingSpec.te_amax_reduction): the count per micro-batch, the price of one reduction worked by hand
from the collective curves and NCCL's tree LL model, the step it adds, which MLPerf GPT-3 and Llama 3.1
submissions run it, and the refusals."""

from __future__ import annotations

import math

import pytest

from benchmarks.published import MAPPINGS, entries
from cost_models.comm import Collective, collective_time, placement
from cost_models.enums import AmaxGroup
from cost_models.errors import SpecError
from cost_models.job import Job
from cost_models.rules import resolve
from cost_models.step_time import te_amax_reduction_seconds, time_estimate
from planner.launch.megatron import train_sh
from planner.launch.target import Target
from tests.helpers import make_job

# DGX H100: NVLink bus bandwidth 18 links x 20.6 GB/s (NCCL topo.h, cost_models.comm), against
# 8 GPUs x 400 Gb/s NICs x 0.94 = 376 GB/s; the lower one carries a multi-node ring
BUSBW = 18 * 20.6e9
# one amax all-reduce over the 4 tp ranks of one NVLink domain: the single-domain curve starts at 1 KiB
# with a share of 0.00015, and a smaller message takes what 1 KiB takes: 2·3/4 KiB at 0.00015 x
# 370.8 GB/s = 27.6 µs
NVLINK_4_RANKS_S = 2 * 3 / 4 * 1024 / (BUSBW * 0.00015)


def mlperf_job(run_id: str, **training) -> Job:
    entry = next(e for e in entries() if e["id"] == run_id)
    model, cluster, spec, layout, _ = MAPPINGS[entry["group"]](entry)
    return resolve(model, cluster, spec.model_copy(update=training), layout)


def _tree_ll_across_nodes_s(nodes: int, ll_cap_bytes_per_s: float) -> float:
    """One amax all-reduce over whole DGX H100 nodes, by hand: NCCL's tree LL latency (nccl v2.30.7-1
    tuning.cc:416, log2 of the node count rounded down as NCCL's log2i does) 6.8 + 2·(7·0.6 +
    log2(nodes)·5.0) µs, at the InfiniBand ratio 47.60 / 25.2 of the measured 16-GPU point, plus 4
    bytes at half the LL cap (llMaxBw's lower host row: 22.5 GB/s at 2 nodes, 19.0 beyond; the
    citation at cost_models.comm.LL_MAX_BUSBW_BYTES_PER_S)."""
    latency_s = (6.8 + 2 * (7 * 0.6 + math.floor(math.log2(nodes)) * 5.0)) * 1e-6 * 47.60 / 25.2
    return latency_s + 4 / (0.5 * ll_cap_bytes_per_s)


def test_v30_64_nodes_waits_for_3072_reductions_of_85_us():
    # mlperf-v3.0-nvidia-gpt3-dgxh100-64x8: tp 4, pp 8, vpp 12, dp 16, global batch 2048 at micro-batch
    # 1, so 2048 / 16 = 128 micro-batches a rank, each running 12 model chunks forward and backward:
    # 2 x 12 = 24 reductions per micro-batch, 3072 per step. The group is tp x dp = 64 ranks, 8 whole
    # nodes. An amax message (tens of bytes) sits below the 1 MiB where the cross-node curve starts,
    # so it takes NCCL's tree LL (nccl v2.30.7-1 tuning.cc:416): 6.8 + 2·(7·0.6 + log2(8)·5.0) = 45.2 µs,
    # at the InfiniBand ratio of the measured 16-GPU 47.60 µs over the modelled 25.2 µs: 85.38 µs,
    # plus 4 bytes at half the 19.0 GB/s LL cap (0.4 ns).
    job = mlperf_job("mlperf-v3.0-nvidia-gpt3-dgxh100-64x8")
    assert job.training.te_amax_reduction is AmaxGroup.TP_DP
    assert (job.num_microbatches, job.layout.vpp, job.layout.tp * job.dp) == (128, 12, 64)
    one = _tree_ll_across_nodes_s(8, 19.0e9)
    assert one == pytest.approx(85.38e-6, abs=0.01e-6)
    assert te_amax_reduction_seconds(job) == pytest.approx(24 * one, rel=1e-6)
    # the step: 128 micro-batches of the critical rank, and in the pipeline's fill and drain the
    # other 7 ranks' share of theirs, 1/vpp of a micro-batch each: (128·24 + 7·24/12)·85.4 µs = 0.263 s
    off = mlperf_job("mlperf-v3.0-nvidia-gpt3-dgxh100-64x8", te_amax_reduction=AmaxGroup.NONE)
    with_amax, without = time_estimate(job), time_estimate(off)
    added = (128 * 24 + 7 * 2) * one
    assert with_amax.step_s - without.step_s == pytest.approx(added, rel=1e-5)
    assert float(with_amax.breakdown.value("dp") - without.breakdown.value("dp")) == pytest.approx(128 * 24 * one, rel=1e-5)


def test_v40_reduces_over_tp_inside_the_node():
    # mlperf-v4.0-nvidia-gpt3-dgxh100-1344x8: TE v1.6rc1 under Megatron core 0.7 reduces over the 4
    # tp ranks of one NVLink domain; 96 layers over pp 6 x vpp 8, 16 reductions per micro-batch. The
    # single-domain curve starts at 1 KiB with a share of 0.00015, and a smaller message takes what
    # 1 KiB takes: 2·3/4 KiB at 0.00015 x 370.8 GB/s = 27.6 µs.
    job = mlperf_job("mlperf-v4.0-nvidia-gpt3-dgxh100-1344x8")
    assert job.training.te_amax_reduction is AmaxGroup.TP
    one = NVLINK_4_RANKS_S
    assert te_amax_reduction_seconds(job) == pytest.approx(2 * 8 * one, rel=1e-9)


def test_message_size_below_the_curves_hardly_moves_the_price():
    # One fp32 amax (4 B) stands for a chunk's 48 bytes per dense layer: both lie below the smallest
    # size either curve resolves, where a collective costs its latency; across nodes the 92 bytes more
    # at NCCL's LL tree bandwidth (half of 19.0 GB/s) add 10 ns to about 120 µs, under 1e-4 of it.
    job = mlperf_job("mlperf-v3.0-coreweave-gpt3-hgxh100-448x8")
    cl = job.cluster.spec
    for n in (4, 448):
        where = placement(cl, n, 1)
        assert collective_time(Collective.ALL_REDUCE, 4, where, cl) == pytest.approx(
            collective_time(Collective.ALL_REDUCE, 96, where, cl), rel=1e-4)


def test_mlperf_gpt3_rows_wait_for_what_their_te_reduces():
    # What each GPT-3 submission's Transformer Engine makes a micro-batch wait for, through the mapping
    # and the estimate (cited at MLPERF_TE_AMAX_REDUCTION): v3.0 (TE release_v0.8 defaults) reduces over
    # tp x dp, 2·vpp times a micro-batch, every one crossing nodes, so each costs NCCL's tree LL over
    # the group's nodes; v4.0 (TE v1.6rc1 under Megatron core 0.7) over the 4 tp ranks of one node,
    # 27.6 µs each (the 1 KiB point of the NVLink curve, test_v40_reduces_over_tp_inside_the_node);
    # v4.1 (Megatron 24.09-alpha.rc0's block autocast over tp x cp, synchronous in TE 1.9 on) over the
    # same tp ranks, cp being 1; v3.1 (NVTE_DP_AMAX_REDUCE_INTERVAL=0, NVTE_ASYNC_AMAX_REDUCTION=1:
    # waited for a chunk later) nothing. The rows' tp x dp spans 8 to 56 nodes, so the v3.0 price takes three
    # tree depths (85.4, 104.3, 123.2 µs); every v3.0 reduction costs more than any v4.0 one.
    per_reduction: dict[str, dict[str, float]] = {}
    for e in entries():
        if not (e["id"].startswith("mlperf-") and "-gpt3-" in e["id"]):
            continue
        job = mlperf_job(e["id"])
        lay, version = job.layout, e["id"][:12]
        one = te_amax_reduction_seconds(job) / (2 * lay.vpp)
        if version == "mlperf-v3.0-":
            nodes = lay.tp * job.dp // job.cluster.spec.gpus_per_node
            assert one == pytest.approx(_tree_ll_across_nodes_s(nodes, 19.0e9), rel=1e-6), e["id"]  # 8 to 56 nodes
        elif version in ("mlperf-v4.0-", "mlperf-v4.1-"):
            assert lay.tp * lay.cp <= job.cluster.spec.gpus_per_node and lay.cp == 1
            if job.cluster.gpu.name == "H100-SXM":
                assert one == pytest.approx(NVLINK_4_RANKS_S, rel=1e-9), e["id"]
            else:  # v4.1's B200 rows: NVLink 5's faster bus, a shorter wait
                assert 0 < one < NVLINK_4_RANKS_S, e["id"]
        else:
            assert one == 0.0, e["id"]
        per_reduction.setdefault(version, {})[e["id"]] = one
    assert set(per_reduction) == {"mlperf-v3.0-", "mlperf-v3.1-", "mlperf-v4.0-", "mlperf-v4.1-"}
    assert min(per_reduction["mlperf-v3.0-"].values()) > max(per_reduction["mlperf-v4.0-"].values()) > 0
    # the deeper the tree, the longer the wait: CoreWeave's 96, 192 and 448 nodes (tp x dp over 12, 24
    # and 56 nodes: depths 3, 4 and 5)
    coreweave = [per_reduction["mlperf-v3.0-"][f"mlperf-v3.0-coreweave-gpt3-hgxh100-{n}x8"] for n in (96, 192, 448)]
    assert [round(x * 1e6, 1) for x in coreweave] == [85.4, 104.3, 123.2]


def test_v50_llama405b_waits_over_tp_x_cp_across_two_nodes():
    # mlperf-v5.0-nvidia-llama405b-hgxh100-64x8: NeMo's tp_only_amax_red (conf/custom.yaml:113) makes
    # Megatron core 0.11's group tp x cp = 8 x 2 = 16 ranks, two whole nodes. Global batch 1152 over dp 4
    # at micro-batch 1: 288 micro-batches a rank, each running vpp 8 chunks forward and backward, 16
    # reductions. Two nodes of 8 are the measured case of comm.SMALL_ALL_REDUCE_16_GPUS_S: NCCL's tree
    # LL start-up 6.8 + 2·(7·0.6 + log2(2)·5.0) = 25.2 µs is the modelled one, so the ratio leaves the
    # measured 47.60 µs; plus 4 bytes at half of the 2-node LL cap of 22.5 GB/s (0.36 ns).
    job = mlperf_job("mlperf-v5.0-nvidia-llama405b-hgxh100-64x8")
    assert job.training.te_amax_reduction is AmaxGroup.TP_CP
    assert (job.num_microbatches, job.layout.vpp, job.layout.tp, job.layout.cp) == (288, 8, 8, 2)
    one = 47.60e-6 + 4 / (0.5 * 22.5e9)
    assert te_amax_reduction_seconds(job) == pytest.approx(16 * one, rel=1e-6)
    # the step: 288·16 on the critical rank plus the other 7 ranks' fill and drain share, 16/8 each:
    # (4608 + 14) x 47.60 µs = 0.2200 s, booked as context-parallel time
    off = mlperf_job("mlperf-v5.0-nvidia-llama405b-hgxh100-64x8", te_amax_reduction=AmaxGroup.NONE)
    with_amax, without = time_estimate(job), time_estimate(off)
    assert with_amax.step_s - without.step_s == pytest.approx((288 * 16 + 7 * 2) * one, rel=1e-5)
    assert float(with_amax.breakdown.value("cp") - without.breakdown.value("cp")) == pytest.approx(288 * 16 * one, rel=1e-5)


def test_tp_x_cp_at_cp_1_is_the_tp_group():
    # mlperf-v4.1-nvidia-gpt3-dgxh100-64x8: tp 4, cp 1, so the tp x cp group is the 4 tp ranks of one
    # NVLink domain, priced as v4.0's tp group is: 1 KiB at 0.00015 of the bus bandwidth, 27.6 µs;
    # 96 layers over pp 8 x vpp 6, 12 reductions per micro-batch
    job = mlperf_job("mlperf-v4.1-nvidia-gpt3-dgxh100-64x8")
    assert job.training.te_amax_reduction is AmaxGroup.TP_CP and job.layout.cp == 1
    one = NVLINK_4_RANKS_S
    assert te_amax_reduction_seconds(job) == pytest.approx(2 * 6 * one, rel=1e-9)
    assert te_amax_reduction_seconds(job) == te_amax_reduction_seconds(
        mlperf_job("mlperf-v4.1-nvidia-gpt3-dgxh100-64x8", te_amax_reduction=AmaxGroup.TP))


def test_mlperf_llama_rows_by_the_code_they_run():
    # The rows that wait for no amax reduction: v5.0 GB200 (NVIDIA's and IBM/CoreWeave's), the whole
    # step in one CUDA graph; v5.1 NVIDIA, Oracle and University of Florida, current scaling or NVFP4.
    # (The tp x cp rows are MLPERF_TE_AMAX_REDUCTION's own; one is priced by
    # test_v50_llama405b_waits_over_tp_x_cp_across_two_nodes.) v5.1 Cisco: core_v0.13.1 with
    # tp_only_amax_red (tp x cp), where tp 1 and cp 1 leave a group of one that TE does not reduce over.
    none = ("mlperf-v5.0-nvidia-llama405b-gb200-", "mlperf-v5.0-ibm-coreweave-", "mlperf-v5.1-nvidia-",
            "mlperf-v5.1-oracle-", "mlperf-v5.1-uf-")
    seen = set()
    for e in entries():
        prefix = next((p for p in none if e["id"].startswith(p)), None)
        if prefix is None:
            continue
        assert MAPPINGS[e["group"]](e)[2].te_amax_reduction is AmaxGroup.NONE, e["id"]
        seen.add(prefix)
    assert seen == set(none)
    assert te_amax_reduction_seconds(mlperf_job("mlperf-v5.1-cisco-llama8b-h100-8x8")) == 0.0


def test_default_prices_nothing():
    job = make_job("llama-3.1-8b", gpus=16, tp=2, pp=2, training={"precision": "fp8", "fp8_recipe": "delayed"})
    assert te_amax_reduction_seconds(job) == 0.0


@pytest.mark.parametrize("training, needle", [
    ({"precision": "bf16"}, "precision=bf16"),
    ({"precision": "fp8", "fp8_recipe": "tensorwise"}, "fp8_recipe=tensorwise"),
])
def test_refused_outside_te_delayed_scaling(training, needle):
    with pytest.raises(SpecError) as err:
        make_job("llama-3.1-8b", gpus=8, tp=2, training={**training, "te_amax_reduction": "tp"})
    message = str(err.value)
    assert "te_amax_reduction" in message and needle in message and "fp8_recipe delayed" in message
    assert "\n" not in message


def test_megatron_lm_launch_refuses_tp_only():
    # Megatron-LM's pretrain_gpt.py has no flag for TransformerConfig.tp_only_amax_red
    # (Megatron-LM@d98e8a64 megatron/training/arguments.py:2307, 2335): its delayed scaling reduces over
    # tp x cp x dp, which te_amax_reduction tp_dp describes
    training = {"precision": "fp8", "fp8_recipe": "delayed", "global_batch_size": 16}
    job = make_job("llama-3.1-8b", gpus=16, tp=2, pp=2, training={**training, "te_amax_reduction": "tp"})
    with pytest.raises(SpecError, match="te_amax_reduction tp is TransformerConfig.tp_only_amax_red") as err:
        train_sh(Target(job=job))
    assert "\n" not in str(err.value)
    tp_cp = make_job("llama-3.1-8b", gpus=16, tp=2, pp=2, training={**training, "te_amax_reduction": "tp_cp"})
    with pytest.raises(SpecError, match="te_amax_reduction tp_cp is TransformerConfig.tp_only_amax_red"):
        train_sh(Target(job=tp_cp))
    ok = make_job("llama-3.1-8b", gpus=16, tp=2, pp=2, training={**training, "te_amax_reduction": "tp_dp"})
    assert "--fp8-recipe delayed" in train_sh(Target(job=ok))
