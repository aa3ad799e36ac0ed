"""The time model term by term: hand-worked cases (arithmetic in comments), the α-β factors against
the textbook formulas, and properties that must hold for any layout."""

from __future__ import annotations

import math

import pytest

from cost_models import comm
from cost_models.calibration import DEFAULT, Calibration
from cost_models.comm import Collective, collective_time, placement
from cost_models.compute import gemm_time
from cost_models.enums import Fp8Recipe, Precision, Recompute
from cost_models.hardware import NetworkTier
from cost_models.flops import Gemm, causal_fraction, layer_flops, model_flops_per_token
from cost_models.states import rank_params
from cost_models.step_time import time_estimate
from planner import presets
from tests.helpers import GPT_TINY, LLAMA_TINY, make_job

H100 = presets.clusters()["dgx-h100"]
NVLINK_BW = H100.scaleup_bandwidth_bytes_per_s * comm.SCALEUP_EFFICIENCY
NIC_BW = H100.nic_bandwidth_bytes_per_s * comm.SCALEOUT_EFFICIENCY
BASE = comm.COLLECTIVE_BASE_LATENCY_S


# --- α-β ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_all_reduce_inside_a_node_is_the_textbook_formula(n):
    size = 256e6  # large: ring beats tree (its bandwidth term 2(n−1)/n < 2)
    expected = BASE + 2 * (n - 1) * H100.scaleup_latency_s + 2 * (n - 1) / n * size / NVLINK_BW
    assert collective_time(Collective.ALL_REDUCE, size, placement(H100, n, 1), H100) == pytest.approx(expected)


@pytest.mark.parametrize("op", [Collective.ALL_GATHER, Collective.REDUCE_SCATTER, Collective.ALL_TO_ALL])
def test_gather_scatter_and_all_to_all_move_n_minus_1_over_n(op):
    n, size = 8, 64e6
    expected = BASE + (n - 1) * H100.scaleup_latency_s + (n - 1) / n * size / NVLINK_BW
    assert collective_time(op, size, placement(H100, n, 1), H100) == pytest.approx(expected)


def test_small_all_reduce_across_many_nodes_takes_the_tree():
    # 128 ranks, one per node (stride 8): ring pays 2·127 NIC latencies, tree 2·log2(128) = 14
    where = placement(H100, 128, 8)
    assert where.per_domain == 1
    size = 1e3
    ring = 2 * 127 * H100.nic_latency_s + 2 * 127 / 128 * size / NIC_BW
    tree = 2 * 7 * H100.nic_latency_s + 2 * size / NIC_BW
    assert tree < ring
    assert collective_time(Collective.ALL_REDUCE, size, where, H100) == pytest.approx(BASE + tree)


def test_hierarchical_all_reduce_splits_the_buffer_over_the_domain_nics():
    # 32 ranks with stride 2 (tp=2 outside): 4 per node, 8 nodes. Inside: reduce-scatter and
    # all-gather over 4 on NVLink; across: ring all-reduce of 1/4 of the buffer over 8 nodes.
    where = placement(H100, 32, 2)
    assert (where.per_domain, where.n) == (4, 32)
    size = 1e9
    inside = 2 * (3 * H100.scaleup_latency_s + 3 / 4 * size / NVLINK_BW)
    across = 2 * 7 * H100.nic_latency_s + 2 * 7 / 8 * (size / 4) / NIC_BW
    assert collective_time(Collective.ALL_REDUCE, size, where, H100) == pytest.approx(BASE + inside + across)


def test_cross_node_all_to_all_is_limited_by_the_nic_share():
    # 16 ranks, 8 per node: 7/16 of each rank's buffer stays on NVLink, 8/16 goes over its NIC
    where = placement(H100, 16, 1)
    size = 1e9
    across = 8 / 16 * size / NIC_BW + H100.nic_latency_s * 1
    assert collective_time(Collective.ALL_TO_ALL, size, where, H100) == pytest.approx(BASE + across)


def test_oversubscribed_tier_slows_groups_that_cross_it():
    slim = H100.model_copy(update={"network_tiers": (NetworkTier(name="leaf", gpus=64, oversubscription=2.0),)})
    inside_leaf, across_leaf = placement(slim, 8, 8), placement(slim, 16, 8)
    t_in = collective_time(Collective.ALL_GATHER, 1e9, inside_leaf, slim)
    t_out = collective_time(Collective.ALL_GATHER, 1e9, across_leaf, slim)
    # 7/8 vs 15/16 of the buffer, and half the bandwidth once the group leaves the 64-GPU leaf
    assert t_out / t_in == pytest.approx((15 / 16 * 2) / (7 / 8), rel=0.01)


# --- FLOPs --------------------------------------------------------------------------------------


def test_gpt_layer_flops_are_narayanan_eq3_per_layer():
    # One GPT layer forward (MHA, f = 4h, eager attention computes the full s x s scores):
    # 24·b·s·h² (qkv 6bsh², out 2bsh², mlp 16bsh²) + 4·b·s²·h (scores and context).
    job = make_job(GPT_TINY, gpus=1, mbs=2, training=dict(seq_len=512, attention="eager"))
    b, s, h = 2, 512, 256
    f = layer_flops(job, moe=False, mode=Recompute.NONE)
    assert f.forward == 24 * b * s * h * h + 4 * b * s * s * h
    # Full recompute repeats the forward: 4 forwards' worth, Narayanan eq. 3's 96·B·s·l·h²(1 + s/6h)
    full = layer_flops(job, moe=False, mode=Recompute.FULL)
    assert full.total == 96 * b * s * h * h * (1 + s / (6 * h))


def test_causal_flash_attention_computes_half_the_scores_and_eager_all():
    flash = make_job(LLAMA_TINY, gpus=1, training=dict(seq_len=1024))
    eager = make_job(LLAMA_TINY, gpus=1, training=dict(seq_len=1024, attention="eager"))
    assert causal_fraction(flash) == (1024 + 1) / 2048
    assert causal_fraction(eager) == 1.0


def test_gqa_qkv_gemm_and_swiglu_flops():
    # LLAMA_TINY: h 256, 8 heads of 32, 2 kv heads -> qkv width 256 + 2·64 = 384; SwiGLU f 688.
    job = make_job(LLAMA_TINY, gpus=1, mbs=1, training=dict(seq_len=128))
    t, h = 128, 256
    gemm = 2 * t * h * 384 + 2 * t * 256 * h + 3 * 2 * t * h * 688
    attention = 4 * 8 * 128 * 128 * 32 * (129 / 256)
    f = layer_flops(job, moe=False, mode=Recompute.NONE)
    assert f.forward_gemm == gemm
    assert f.forward_attention == pytest.approx(attention)
    # backward: 2x the GEMMs, 2.5x flash attention
    assert f.backward == pytest.approx(2 * gemm + 2.5 * attention)


def test_tp_divides_a_layers_gemm_flops():
    one = layer_flops(make_job(LLAMA_TINY, gpus=1), moe=False, mode=Recompute.NONE)
    two = layer_flops(make_job(LLAMA_TINY, gpus=2, tp=2), moe=False, mode=Recompute.NONE)
    assert two.forward_gemm * 2 == one.forward_gemm


def test_moe_layer_flops_count_top_k_experts_and_the_router():
    model = presets.models()["mixtral-8x7b"]
    job = make_job(model, gpus=8, ep=8, mbs=1, training=dict(seq_len=4096))
    t, h, f = 4096, 4096, 14336
    # router t·h·8 experts; each token through 2 experts of 3 h x f matrices (SwiGLU)
    expected_mlp = 2 * t * h * 8 + 2 * 3 * 2 * t * h * f
    dense = layer_flops(job, moe=True, mode=Recompute.NONE).forward_gemm
    attention_part = 2 * t * h * (4096 + 2 * 1024) + 2 * t * 4096 * h
    assert dense - attention_part == expected_mlp


def test_palm_model_flops_per_token():
    # llama-3.1-8b: 6·(N − input embedding) + 12·L·H·Q·T
    m = presets.models()["llama-3.1-8b"]
    n = m.params_total - m.vocab_size * m.hidden_size
    assert model_flops_per_token(m, 8192) == 6 * n + 12 * 32 * 4096 * 8192


# --- compute efficiency -------------------------------------------------------------------------


def test_gemm_efficiency_follows_the_half_performance_dimension():
    gpu = presets.gpus()["H100-SXM"]
    cal = Calibration(gemm_half_dim=1024.0)
    big = Gemm("big", 8192, 8192, 8192)
    half = Gemm("half", 8192, 1024, 8192)  # smallest dimension at n½: half the large-GEMM rate
    rate_big = big.flop / gemm_time(big, gpu, "bf16", cal)
    rate_half = half.flop / gemm_time(half, gpu, "bf16", cal)
    eff = cal.efficiency("gemm_efficiency", "hopper")
    assert rate_big == pytest.approx(gpu.peak_flop_per_s.bf16 * eff * 8192 / (8192 + 1024))
    assert rate_half == pytest.approx(gpu.peak_flop_per_s.bf16 * eff / 2)


def test_skinny_gemm_is_bound_by_hbm():
    gpu = presets.gpus()["H100-SXM"]
    g = Gemm("gemv", 1, 8192, 8192)  # 2·8192² FLOPs, reads the 8192² weight: memory bound
    t = gemm_time(g, gpu, "bf16", DEFAULT)
    moved = 2 * (8192 + 8192 * 8192) + 2 * 8192
    assert t == pytest.approx(moved / (gpu.hbm_bandwidth_bytes_per_s * DEFAULT.hbm_efficiency))


# --- step assembly ------------------------------------------------------------------------------


def test_breakdown_sums_to_the_step_and_throughput_follows():
    job = make_job("llama-3.1-70b", gpus=64, tp=8, pp=4, recompute="full", zero=1)
    t = time_estimate(job)
    assert t.breakdown.total == pytest.approx(t.step_s)
    assert t.tokens_per_s * t.step_s == pytest.approx(job.training.global_batch_size * job.training.seq_len)
    assert t.tokens_per_s_per_gpu == pytest.approx(t.tokens_per_s / 64)
    assert t.hfu > t.mfu  # full recompute executes a fourth forward


def test_bubble_is_the_fill_and_drain_of_the_pipeline():
    job = make_job("llama-3.1-70b", gpus=64, tp=8, pp=4, zero=1, recompute="full", training=dict(global_batch_size=64))
    t = time_estimate(job)
    times = [s.microbatch_s for s in t.stages]
    assert t.bubble_s == pytest.approx(sum(times) - max(times))
    # equal middle stages: each contributes one micro-batch time of fill/drain
    assert t.stages[1].microbatch_s == pytest.approx(t.stages[2].microbatch_s)
    inter = time_estimate(make_job("llama-3.1-70b", gpus=64, tp=8, pp=4, vpp=2, zero=1, recompute="full", training=dict(global_batch_size=64)))
    assert inter.bubble_s == pytest.approx((sum(s.microbatch_s for s in inter.stages) - inter.critical.microbatch_s) / 2)
    assert inter.bubble_s < t.bubble_s


@pytest.mark.parametrize("gbs", [32, 64, 128, 256])
def test_more_microbatches_never_raise_the_bubble_fraction(gbs):
    def fraction(batch: int) -> float:
        t = time_estimate(make_job("llama-3.1-70b", gpus=64, tp=8, pp=4, zero=1, training=dict(global_batch_size=batch)))
        return t.bubble_s / t.step_s

    assert fraction(2 * gbs) <= fraction(gbs)


@pytest.mark.parametrize("model", ["llama-3.1-8b", "mixtral-8x7b", "gpt3-175b"])
def test_more_tp_never_increases_weights_per_gpu(model):
    counts = []
    for tp in (1, 2, 4, 8):
        job = make_job(model, gpus=8, tp=tp, training=dict(seq_len=2048))
        counts.append(rank_params(job, 0).total)
    assert counts == sorted(counts, reverse=True)


def test_tp_communication_is_exposed_unless_overlapped():
    plain = time_estimate(make_job("llama-3.1-70b", gpus=8, tp=8))
    overlapped = time_estimate(make_job("llama-3.1-70b", gpus=8, tp=8, training=dict(tp_comm_overlap=True)))
    assert plain.breakdown.value("tp") > 0
    assert overlapped.breakdown.value("tp") < plain.breakdown.value("tp")
    assert overlapped.breakdown.value("compute") == pytest.approx(plain.breakdown.value("compute"))


def test_tp_across_nodes_is_slower_than_inside():
    inside = time_estimate(make_job("llama-3.1-70b", gpus=16, tp=8, pp=2, zero=1))
    across = time_estimate(make_job("llama-3.1-70b", gpus=16, tp=16, zero=1))
    per_layer_in = inside.critical.microbatch.value("tp") / 40  # one micro-batch, 40 layers per stage
    per_layer_out = across.critical.microbatch.value("tp") / 80
    # the collectives carry the same t x h activations either way; across nodes the NIC stage adds
    # (1/2)·(1/8) of the buffer at ~46 GB/s to the (7/8) at ~378 GB/s inside: about 1.6x
    assert per_layer_out > 1.5 * per_layer_in


def test_dp_gradients_hide_behind_backward_except_the_last_bucket():
    # 8B on 64 GPUs, dp 64 over 8 nodes, 16 micro-batches: the window (one micro-batch's backward)
    # is long next to the all-reduce only if the reduction is small; check the rule either way
    job = make_job("llama-3.1-8b", gpus=64, zero=0, training=dict(global_batch_size=1024))
    t = time_estimate(job)
    s = t.stages[0]
    assert s.dp_exposed_s == pytest.approx(max(s.dp_comm_s - s.dp_window_s, s.dp_bucket_s))
    assert 0 < s.dp_bucket_s < s.dp_comm_s
    assert t.breakdown.value("dp") == pytest.approx(s.dp_exposed_s)


def test_context_parallel_exchange_is_hidden_behind_attention_at_long_sequences():
    # cp 32 over 4 nodes: K/V chunks grow with s/cp, attention with (s/cp)·s, so a long sequence
    # hides its ring exchange and a short one cannot
    short = time_estimate(make_job("llama-3.1-8b", gpus=32, cp=32, training=dict(seq_len=8192, framework="torchtitan")))
    long = time_estimate(make_job("llama-3.1-8b", gpus=32, cp=32, training=dict(seq_len=131072, framework="torchtitan")))
    share = lambda t: t.breakdown.value("cp") / t.step_s  # noqa: E731
    assert share(short) > 0.1
    assert share(long) < share(short) / 5


def test_expert_parallel_all_to_all_appears_only_for_moe():
    dense = time_estimate(make_job("llama-3.1-8b", gpus=8))
    moe = time_estimate(make_job("mixtral-8x7b", gpus=16, ep=8, pp=2))
    assert dense.breakdown.value("ep") == 0
    assert moe.breakdown.value("ep") > 0


def test_fsdp_traffic_scales_with_microbatches():
    def dp(batch: int) -> float:
        return time_estimate(make_job("llama-3.1-8b", gpus=16, training=dict(framework="torchtitan", global_batch_size=batch))).breakdown.value("dp")

    # every micro-batch gathers and reduce-scatters again (no pipeline): 4x the micro-batches
    # (gbs 64 vs 16 on 16 GPUs, mbs 1) expose 4x the FSDP time
    assert dp(16) > 0
    assert dp(64) == pytest.approx(4 * dp(16))


def test_mfu_uses_the_palm_count_and_the_16_bit_peak():
    job = make_job("llama-3.1-8b", gpus=8, training=dict(seq_len=8192, framework="torchtitan"))
    t = time_estimate(job)
    per_token = model_flops_per_token(job.model, 8192)
    expected = per_token * t.tokens_per_s_per_gpu / presets.gpus()["H100-SXM"].peak_flop_per_s.bf16
    assert t.mfu == pytest.approx(expected)
    assert math.isclose(t.model_flop_per_step, per_token * t.tokens_per_step)


def test_calibration_changes_the_compute_time_proportionally():
    job = make_job("llama-3.1-70b", gpus=8, tp=8)
    half = DEFAULT.efficiency("gemm_efficiency", "hopper") / 2
    slow = time_estimate(job, calibration=DEFAULT.with_values(gemm_efficiency__hopper=half))
    fast = time_estimate(job)
    assert slow.breakdown.value("compute/gemm") > 1.9 * fast.breakdown.value("compute/gemm")


# --- fp8 recipes and kernel families ------------------------------------------------------------


def test_torchao_fp8_casts_move_five_bytes_per_operand_element():
    # LLAMA_TINY, 128 tokens, tp 1: (m x k)·(k x n) per GEMM, forward casts input and weight (mk + kn)
    #   qkv     128x256·256x384:  32,768 +  98,304     (q 256 + k 64 + v 64)
    #   out     128x256·256x256:  32,768 +  65,536
    #   fc1     128x256·256x1376: 32,768 + 352,256     (SwiGLU gate and up, 2 x 688)
    #   fc2     128x688·688x256:  88,064 + 176,128
    #   sum 878,592 elements x 5 bytes (amax read 2, cast read 2, write 1) = 4,392,960
    # backward casts grad_output twice, weight and input (2mn + kn + mk):
    #   qkv 2·49,152 + 98,304 + 32,768 = 229,376; out 2·32,768 + 65,536 + 32,768 = 163,840;
    #   fc1 2·176,128 + 352,256 + 32,768 = 737,280; fc2 2·32,768 + 176,128 + 88,064 = 329,728
    #   = 1,460,224 elements x 5 = 7,301,120
    from cost_models.compute import fp8_cast_bytes

    fp8 = dict(seq_len=128, precision="fp8", framework="torchtitan")
    job = make_job(LLAMA_TINY, gpus=1, training=fp8)
    assert fp8_cast_bytes(job, moe=False) == (4_392_960, 7_301_120)
    # Transformer Engine emits fp8 from the producing kernels: nothing extra for Megatron
    megatron = make_job(LLAMA_TINY, gpus=1, training={**fp8, "framework": "megatron"})
    assert fp8_cast_bytes(megatron, moe=False) == (0, 0)
    # and the casts show in the step: the same job in bf16 has none
    bf16 = make_job(LLAMA_TINY, gpus=1, training={**fp8, "precision": "bf16"})
    assert fp8_cast_bytes(bf16, moe=False) == (0, 0)


def test_rowwise_fp8_gemms_run_at_the_rowwise_ratio():
    gpu = presets.gpus()["H100-SXM"]
    g = Gemm("big", 8192, 8192, 8192)  # compute-bound: the efficiency sets the time
    tensorwise = gemm_time(g, gpu, Precision.FP8, DEFAULT)
    rowwise = gemm_time(g, gpu, Precision.FP8, DEFAULT, Fp8Recipe.ROWWISE)
    assert rowwise == pytest.approx(tensorwise / DEFAULT.fp8_rowwise_gemm_ratio)


def test_megatron_attention_runs_at_transformer_engine_efficiency_where_calibrated():
    from cost_models.compute import attention_time
    from cost_models.flops import core_attention

    def attn(framework: str, cluster: str) -> float:
        job = make_job("llama-3.1-8b", gpus=8, cluster=cluster, training=dict(seq_len=8192, framework=framework))
        return attention_time(core_attention(job), job, DEFAULT)

    # same FLOPs on the same GPU; only the kernel family's efficiency differs
    ratio = DEFAULT.efficiency("attention_efficiency", "hopper") / DEFAULT.te_attention_efficiency["hopper"]
    assert attn("megatron", "dgx-h100") == pytest.approx(ratio * attn("torchtitan", "dgx-h100"))
    # on Ampere Transformer Engine runs flash-attn: the same efficiency for both
    assert attn("megatron", "dgx-a100-80gb") == pytest.approx(attn("torchtitan", "dgx-a100-80gb"))
