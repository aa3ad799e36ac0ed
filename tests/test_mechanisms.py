"""The step-time mechanisms beyond single kernels, each on a hand-worked case: context parallelism,
MoE expert parallelism, scale (stragglers, reductions over many ranks), tensor-parallel overlap
and pipeline p2p; and the rule that layouts differing in cp or ep never tie unless their work is
equal."""

from __future__ import annotations

import itertools

import pytest

from cost_models.calibration import DEFAULT
from cost_models.comm import Collective, collective_time, placement, send_recv_time
from cost_models.compute import attention_kernels, chunk_seconds, tp_blocks
from cost_models.enums import MoEDispatch, Recompute
from cost_models.model_spec import LayerKind
from cost_models.step_time import (
    _ep_comm,
    _kv_bytes,
    Exposure,
    _ring_exchange,
    cp_exposure,
    ep_exposure,
    expected_max_normal,
    float8_amax_reductions,
    float8_amax_seconds,
    layer_pass,
    pp_boundary_seconds,
    pp_hop_seconds,
    pp_overlapped_hop_seconds,
    pp_sync_relaunch_seconds,
    sac_regather,
    tied_embedding_grad_seconds,
    time_estimate,
    tp_exposure,
)
from planner import presets
from tests.helpers import make_job

H100 = presets.clusters()["dgx-h100"]
MS = 1e-3


# --- context parallelism -------------------------------------------------------------------------


def test_cp_ring_sends_the_local_k_and_v_once_per_step():
    # Llama-3.1-8B, 8 KV heads of 128, seq 8192 over cp 2, one sequence: each rank holds 4096
    # tokens of K and V in bf16 = 2 x 4096 x 8 x 128 x 2 bytes
    job = make_job("llama-3.1-8b", gpus=2, cp=2, training=dict(seq_len=8192))
    assert _kv_bytes(job) == 2 * 4096 * 8 * 128 * 2 == 16_777_216
    # Transformer Engine p2p, cp 2: one forward transfer, posted before the first (causal) step
    # and hidden behind it; what outlasts the kernel is exposed
    att = attention_kernels(job, DEFAULT)
    hop = send_recv_time(_kv_bytes(job), stride=1, cluster=H100)
    fwd, bwd = cp_exposure(job, DEFAULT)
    assert fwd.exposed == pytest.approx(max(0.0, hop - att.first_fwd))
    # backward: the K/V of the first step, then the dK/dV of the last (no step between them at cp 2)
    assert bwd.exposed == pytest.approx(max(0.0, hop - att.first_bwd) + max(0.0, hop - att.step_bwd))


def test_cp_across_nodes_exposes_the_ring_at_short_sequences():
    # cp 16 over two nodes at 8k tokens: each step's 512-token chunks of attention take far less
    # than a 2 MiB K/V transfer over the NIC, so most of every transfer is exposed
    job = make_job("llama-3.1-8b", gpus=16, cp=16, training=dict(seq_len=8192))
    att = attention_kernels(job, DEFAULT)
    hop_nic = send_recv_time(_kv_bytes(job), stride=8, cluster=H100)
    assert att.step_fwd < hop_nic
    fwd, _ = cp_exposure(job, DEFAULT)
    assert fwd.exposed >= 14 * (hop_nic - att.step_fwd)


@pytest.mark.parametrize("seq", [8192, 32768, 131072])
def test_cp_is_never_free(seq):
    # every ring step after the first merges its output by log-sum-exp, and the ring's transfers
    # cost either exposed time or the SMs they hold while hidden
    for cp in (2, 4, 8):
        job = make_job("llama-3.1-8b", gpus=8, cp=cp, training=dict(seq_len=seq))
        att = attention_kernels(job, DEFAULT)
        assert att.steps == cp and att.merge_fwd > 0 and att.merge_bwd > 0
        fwd, bwd = cp_exposure(job, DEFAULT)
        assert fwd.exposed + bwd.exposed + fwd.contention + bwd.contention > 0


def test_short_cp_chunks_run_attention_at_a_lower_rate():
    # 8k tokens over cp 8: 1k-token chunks, whose kernels run well below the 8k kernel's rate
    # (FA2's H100 curve), so the 8 ranks together spend more than one rank would
    one = attention_kernels(make_job("llama-3.1-8b", gpus=8, training=dict(seq_len=8192)), DEFAULT)
    split = attention_kernels(make_job("llama-3.1-8b", gpus=8, cp=8, training=dict(seq_len=8192)), DEFAULT)
    assert 8 * (split.forward_s + split.backward_s) > 1.2 * (one.forward_s + one.backward_s)


def test_torchtitan_cp_gathers_k_and_v_once_and_passes_fp32_gradients():
    # torch's context parallel (rotate method allgather): one all-gather of every rank's K/V,
    # hidden only behind the first step; dK/dV travel in fp32 at every backward step
    job = make_job("llama-3.1-8b", gpus=8, cp=8, training=dict(seq_len=65536, framework="torchtitan"))
    group = placement(H100, 8, 1)
    gather = collective_time(Collective.ALL_GATHER, 8 * _kv_bytes(job), group, H100)
    att = attention_kernels(job, DEFAULT)
    fwd, _ = cp_exposure(job, DEFAULT)
    assert fwd.exposed == pytest.approx(max(0.0, gather - att.first_fwd))


def test_torchtitan_cp_rotates_k_and_v_expanded_to_every_query_head():
    # torchtitan's Llama repeats K/V to the 32 query heads before SDPA, so torch's ring moves
    # 2 x 8192 tokens x 32 heads x 128 x 2 bytes per rank at seq 65536 over cp 8; Transformer
    # Engine's ring moves the 8 grouped K/V heads, a quarter of that
    titan = make_job("llama-3.1-8b", gpus=8, cp=8, training=dict(seq_len=65536, framework="torchtitan"))
    megatron = make_job("llama-3.1-8b", gpus=8, cp=8, training=dict(seq_len=65536))
    assert _kv_bytes(titan) == 2 * 8192 * 32 * 128 * 2 == 134_217_728
    assert _kv_bytes(megatron) == 2 * 8192 * 8 * 128 * 2 == _kv_bytes(titan) / 4


def test_torchtitan_cp_waits_for_the_last_fp32_dkv_after_the_loop():
    # Llama-3.1-405B at tp 8 (16 query heads per rank), cp 8 across eight nodes: the backward's
    # all-gather hides behind the first step only; each step's fp32 dK/dV (2 x 2 x 32768 x 16 x 128
    # x 2 bytes = 512 MiB) behind the next step's kernel, and the eighth, sent after the last
    # step, is waited for with no kernel left: exposed whole
    job = make_job("llama-3.1-405b", gpus=64, tp=8, cp=8, mbs=1, zero=3,
                   training=dict(seq_len=262144, framework="torchtitan"))
    assert _kv_bytes(job) == 2 * 32768 * 16 * 128 * 2
    gather = collective_time(Collective.ALL_GATHER, 8 * _kv_bytes(job), placement(H100, 8, 8), H100)
    dkv = send_recv_time(2 * _kv_bytes(job), stride=8, cluster=H100)
    att = attention_kernels(job, DEFAULT)
    _, bwd = cp_exposure(job, DEFAULT)
    hidden = max(0.0, gather - att.first_bwd) + 7 * max(0.0, dkv - att.step_bwd)
    assert bwd.exposed == pytest.approx(hidden + dkv)
    assert dkv > 5 * MS  # 512 MiB through one NIC: the exposed tail is not a rounding error


# --- MoE expert parallelism ----------------------------------------------------------------------


def test_ep_dispatch_and_combine_move_the_routed_token_copies():
    # Mixtral-8x7B, ep 8 in one node, 4096 tokens, top-2, hidden 4096, bf16: each all-to-all moves
    # 4096 x 2 x 4096 x 2 bytes from every rank; dispatch and combine per pass
    job = make_job("mixtral-8x7b", gpus=8, ep=8, mbs=1, training=dict(seq_len=4096))
    size = 4096 * 2 * 4096 * 2
    one = collective_time(Collective.ALL_TO_ALL, size, placement(H100, 8, 1), H100)
    assert _ep_comm(job) == pytest.approx(2 * one)


def test_ep_across_nodes_runs_at_the_nic_all_to_all_rate():
    # Qwen3-30B-A3B (128 experts, top-8): ep 16 over two nodes sends half of each rank's copies
    # through its NIC at 0.77 x 47 GB/s, far slower than ep 8 inside a node on NVLink (320 GB/s)
    def ep(gpus: int, n: int) -> float:
        return _ep_comm(make_job("qwen3-30b-a3b", gpus=gpus, ep=n, mbs=1, training=dict(seq_len=4096)))

    assert ep(16, 16) > 3 * ep(8, 8)


def test_expert_load_imbalance_scales_the_busiest_ranks_exchange():
    even = make_job("qwen3-30b-a3b", gpus=16, ep=16, mbs=1, training=dict(seq_len=4096))
    skewed = make_job("qwen3-30b-a3b", gpus=16, ep=16, mbs=1, training=dict(seq_len=4096, moe_load_factor=1.5))
    # linear in the bytes: 1.5x, less the size curve's share rising a little with the larger message
    assert _ep_comm(skewed) / _ep_comm(even) == pytest.approx(1.5, rel=0.08)


def test_megatrons_overlapped_1f1b_all_to_all_hides_behind_the_other_micro_batch():
    plain = make_job("qwen3-30b-a3b", gpus=16, ep=16, mbs=1, training=dict(seq_len=4096))
    overlap = make_job("qwen3-30b-a3b", gpus=16, ep=16, mbs=1, training=dict(seq_len=4096, moe_dispatch="overlap"))
    assert overlap.training.moe_dispatch is MoEDispatch.OVERLAP_1F1B
    compute = 20 * MS
    a2a = 3 * _ep_comm(plain)
    assert ep_exposure(plain, 3, compute, DEFAULT).exposed == pytest.approx(a2a)
    hidden = ep_exposure(overlap, 3, compute, DEFAULT)
    assert hidden.exposed == pytest.approx(max(0.0, a2a - compute))
    assert hidden.contention > 0


def test_torchtitan_selective_before_c4e229115_runs_the_all_to_alls_again():
    """TrainingSpec.sac_recomputes_all_to_all: the recomputed forward of a selectively checkpointed
    MoE layer dispatches and combines again, so the layer runs its all-to-alls in three passes
    (forward, recomputation, backward) instead of two."""
    def ep_seconds(**switch) -> float:
        tt = dict(seq_len=4096, framework="torchtitan", **switch)
        job = make_job("qwen3-30b-a3b", gpus=8, ep=8, mbs=1, recompute="selective", training=tt)
        return layer_pass(job, LayerKind(moe=True), mode=Recompute.SELECTIVE, cal=DEFAULT).comm.value("ep")

    saved = ep_seconds()
    assert saved > 0
    assert ep_seconds(sac_recomputes_all_to_all=True) == pytest.approx(1.5 * saved)


# --- scale ----------------------------------------------------------------------------------------


def test_the_slowest_gpu_sets_the_pace():
    # Blom's approximation of the expected maximum of N standard normals: 1.42 for 8 (exact 1.4236)
    assert expected_max_normal(8) == pytest.approx(1.4236, abs=0.02)
    assert expected_max_normal(1024) == pytest.approx(3.196, abs=0.05)  # exact 3.1966
    t1 = time_estimate(make_job("llama-3.1-8b", gpus=1, training=dict(global_batch_size=8)))
    assert t1.breakdown.value("straggler") == 0
    # GPU speeds spread by cv (prior 0.0175 from ml-engineering's 5%+ on one 8-GPU node; DEFAULT
    # the fitted value): 8 GPUs wait cv x 1.42 of the compute
    cv = DEFAULT.gpu_speed_cv
    t8 = time_estimate(make_job("llama-3.1-8b", gpus=8, training=dict(global_batch_size=64)))
    compute = float(t8.breakdown.value("compute"))
    assert t8.breakdown.value("straggler") == pytest.approx(cv * expected_max_normal(8) * compute)
    # and more GPUs wait longer: 8192 GPUs 3.8 deviations
    shares = []
    for gpus in (8, 64, 1024, 8192):
        t = time_estimate(make_job("llama-3.1-8b", gpus=gpus, training=dict(global_batch_size=gpus * 8)))
        shares.append(t.breakdown.value("straggler") / t.breakdown.value("compute"))
    assert shares == sorted(shares)
    assert shares[-1] == pytest.approx(cv * expected_max_normal(8192))


def test_the_bubble_waits_on_each_stages_slowest_gpu():
    # pp 2 on 16 GPUs: the critical stage's m micro-batches run at the slowest of all 16 GPUs
    # (Blom 1.77), the bubble is the other stage's compute, run at its own slowest of 8 (Blom
    # 1.434: (8 - 0.375) / 8.25 = 0.92424, Φ⁻¹ = 1.434).
    cv = DEFAULT.gpu_speed_cv
    t = time_estimate(make_job("llama-3.1-8b", gpus=16, pp=2, training=dict(global_batch_size=64)))
    other = next(s for s in t.stages if s.rank != t.critical.rank)
    bubble_compute = float(other.microbatch.value("compute"))
    assert t.bubble_straggler_s == pytest.approx(cv * 1.434 * bubble_compute, rel=1e-3)  # Blom to 4 digits
    compute = float(t.breakdown.value("compute"))
    assert t.breakdown.value("straggler") == pytest.approx(cv * expected_max_normal(16) * compute + t.bubble_straggler_s)
    # without a pipeline there is no bubble to wait in
    assert time_estimate(make_job("llama-3.1-8b", gpus=16, training=dict(global_batch_size=64))).bubble_straggler_s == 0


def test_parameter_gather_beside_the_forward_contends_and_exposes_what_outlasts_it():
    # a rank whose gradient reduction (4 s, 1 s of it the last bucket) runs beside a 10 s backward,
    # and whose parameter gather (3 s) runs beside a 2 s forward, with the collectives holding 20%
    # of the SMs: 1 s of gather left after the forward; hidden 3 s + 2 s, each costing 0.2/0.8
    from cost_models.step_time import StageTime

    s = StageTime(rank=0, microbatch=None, flop=0.0, recompute_flop=0.0, dp_comm_s=4.0, dp_window_s=10.0,
                  dp_bucket_s=1.0, dp_share=0.2, optimizer_s=0.0, gather_s=3.0, forward_s=2.0)
    assert s.gather_exposed_s == pytest.approx(1.0)
    assert s.dp_contention_s == pytest.approx((3.0 + 2.0) * 0.25)


def test_distributed_optimizer_gathers_all_but_the_first_bucket_beside_the_forward():
    # Megatron ZeRO-1 with overlapped gathers: every bucket (of 40M parameters or more at dp 16) but
    # the first the forward needs, the 128256 x 4096 embedding's, gathers beside the forward, each its
    # own all-gather, in fp8 under --fp8-param-gather; nothing for zero 0, for the synchronous gather
    # (no --overlap-param-gather) or for torchtitan's FSDP
    from cost_models.step_time import _dense_group, hidden_param_gather, megatron_buckets

    base = dict(precision="fp8")
    job = make_job("llama-3.1-8b", gpus=16, zero=1, training=base)
    fp8 = make_job("llama-3.1-8b", gpus=16, zero=1, training={**base, "fp8_param_gather": True})
    (buckets,) = megatron_buckets(job, 0)
    assert buckets[-1] == 128256 * 4096
    ag = sum(collective_time(Collective.ALL_GATHER, b * 2, _dense_group(job), H100) for b in buckets[:-1])
    assert hidden_param_gather(job, 0) == pytest.approx(ag)
    assert hidden_param_gather(fp8, 0) < 0.6 * hidden_param_gather(job, 0)  # half the bytes
    assert hidden_param_gather(make_job("llama-3.1-8b", gpus=16, zero=0), 0) == 0.0
    assert hidden_param_gather(make_job("llama-3.1-8b", gpus=16, zero=1, training=dict(overlap_grad_reduce=False)), 0) == 0.0
    assert hidden_param_gather(make_job("llama-3.1-8b", gpus=16, zero=3, training=dict(framework="torchtitan")), 0) == 0.0


def test_interleaved_ranks_gather_behind_pp_micro_batches_of_forward():
    # interleaved 1F1B runs pp micro-batches through chunk j before chunk j+1 starts, so each
    # chunk's gather has min(m, pp) micro-batches of forward before it; plain 1F1B has one
    from cost_models.step_time import gather_window_microbatches

    inter = make_job("llama-3.1-70b", gpus=64, tp=8, pp=4, vpp=2, zero=1, training=dict(global_batch_size=32))
    plain = make_job("llama-3.1-70b", gpus=64, tp=8, pp=4, zero=1, training=dict(global_batch_size=32))
    flat = make_job("llama-3.1-70b", gpus=64, tp=8, zero=1, training=dict(global_batch_size=32))
    assert inter.num_microbatches == 16
    assert [gather_window_microbatches(j) for j in (inter, plain, flat)] == [4, 1, 1]
    # the window is those micro-batches' forward through the rank's 20 layers (both schedules give
    # each rank 20 identical layers): 4 forwards against 1
    for a, b in zip(time_estimate(inter).stages, time_estimate(plain).stages):
        assert a.forward_s == pytest.approx(4 * b.forward_s) and b.forward_s > 0


# --- tensor-parallel overlap and pipeline p2p -----------------------------------------------------


def test_chunked_all_gather_gemm_hides_each_transfer_behind_the_previous_chunk():
    # Megatron --tp-comm-overlap (TE userbuffers ring exchange), tp 8: the column GEMM runs in 8
    # chunks of tokens/8 rows; chunk i+1 moves while chunk i multiplies, the last has nothing to hide
    job = make_job("llama-3.1-70b", gpus=8, tp=8, training=dict(tp_comm_overlap=True))
    b = tp_blocks(job, LayerKind(), cal=DEFAULT)[0]
    rows = 8192
    g = chunk_seconds(b.col, rows // 8, job, DEFAULT)
    for transfer in (0.1 * g, 2 * g):
        e = _ring_exchange(job, b.col, rows, b.col_fwd, transfer, DEFAULT)
        assert e.exposed == pytest.approx(max(0.0, g + 7 * max(g, transfer) - b.col_fwd))


def test_torchtitan_selective_checkpointing_gathers_each_blocks_input_again():
    # Llama-3.1-8B, tp 8, 8192 tokens: per-op SAC saves the reduce-scatters but not the all-gathers,
    # so the backward's recomputation gathers the attention and the MLP input again, 8192 x 4096 x
    # 2 bytes = 64 MiB each, exposed under plain DTensor TP
    plain = make_job("llama-3.1-8b", gpus=8, tp=8, mbs=1, zero=3, recompute="selective",
                     training=dict(seq_len=8192, framework="torchtitan"))
    blocks = tp_blocks(plain, LayerKind(), cal=DEFAULT)
    gather = collective_time(Collective.ALL_GATHER, 8192 * 4096 * 2, placement(H100, 8, 1), H100)
    assert sac_regather(plain, blocks, DEFAULT).exposed == pytest.approx(2 * gather)
    # the layer pass adds it under selective recompute only, and only for torchtitan (Megatron's
    # selective recompute repeats core attention alone)
    def tp_comm(mode: Recompute) -> float:
        return layer_pass(plain, LayerKind(), mode=mode, cal=DEFAULT).comm.value("tp")

    assert tp_comm(Recompute.SELECTIVE) - tp_comm(Recompute.NONE) == pytest.approx(2 * gather)
    megatron = make_job("llama-3.1-8b", gpus=8, tp=8, mbs=1, sp=True, training=dict(seq_len=8192))
    assert sac_regather(megatron, blocks, DEFAULT) == Exposure()
    # async TP at 12 x 8192 tokens pipelines each gather with the recomputed projection that reads
    # it: w3 (1792 columns per rank) hides most of the MLP's, wk (128 columns) none of the attention's
    big = collective_time(Collective.ALL_GATHER, 12 * 8192 * 4096 * 2, placement(H100, 8, 1), H100)
    overlapped = make_job("llama-3.1-8b", gpus=8, tp=8, mbs=12, zero=3, recompute="selective",
                          training=dict(seq_len=8192, framework="torchtitan", tp_comm_overlap=True, compile=True))
    attn, mlp = (sac_regather(overlapped, (b,), DEFAULT).exposed for b in tp_blocks(overlapped, LayerKind(), cal=DEFAULT))
    assert attn > 0.9 * big and mlp < 0.5 * big


def test_torchtitan_selective_checkpointing_reruns_every_second_matmul_and_the_elementwise_ops():
    from cost_models.compute import layer_time
    from cost_models.flops import recomputed_share
    from cost_models.model_spec import MoESpec

    tt = dict(seq_len=8192, framework="torchtitan")
    llama = presets.models()["llama-3.1-8b"]
    # Llama-3.1-8B, tp 8: per rank wq 4096x512, wk and wv 4096x128, wo 512x4096, w1 and w3 4096x1792,
    # w2 1792x4096; the policy reruns the 2nd, 4th and 6th matmul: wk, wo, w3
    job = make_job(llama, gpus=8, tp=8, mbs=1, recompute="selective", training=tt)
    assert recomputed_share(job, Recompute.SELECTIVE) == pytest.approx(((128 + 512 + 1792) / (512 + 128 + 128 + 512 + 3 * 1792), 0.0))
    # q, k, v with biases are addmms, kept and not counted: wo, w1, w3, w2 count, w1 and w2 rerun
    biased = make_job(llama.model_copy(update={"qkv_bias": True}), gpus=8, tp=8, mbs=1, recompute="selective", training=tt)
    assert recomputed_share(biased, Recompute.SELECTIVE)[0] == pytest.approx((1792 + 1792) / (512 + 128 + 128 + 512 + 3 * 1792))
    # every linear with a bias (GPT-2 style): nothing reruns
    gpt = make_job(llama.model_copy(update={"qkv_bias": True, "out_bias": True, "mlp_bias": True}), gpus=8, tp=8, mbs=1,
                   recompute="selective", training=tt)
    assert recomputed_share(gpt, Recompute.SELECTIVE) == (0.0, 0.0)
    # an MoE layer (8 experts of 1792, top 2, no tp): wk, wo, the router (forced) and the routed experts
    # (a grouped GEMM, not saved) rerun; per token 4096 x (4096 wq, 1024 wk, 1024 wv, 8 router),
    # 4096 x 4096 wo, 2 x 3 x 4096 x 1792 experts
    moe = llama.model_copy(update={"moe": MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=1792)})
    mjob = make_job(moe, gpus=8, ep=8, mbs=1, recompute="selective", training=tt)
    kind = mjob.model.layer_kind(0)
    total = 4096 * (4096 + 1024 + 1024 + 8 + 4096 + 2 * 3 * 1792)
    assert recomputed_share(mjob, Recompute.SELECTIVE, kind)[0] == pytest.approx(4096 * (1024 + 4096 + 8 + 2 * 3 * 1792) / total)
    # eager, the recomputed forward runs all its memory-bound ops again; compiled, only the casts of
    # the recomputed fp8 matmuls; Megatron's selective recompute (core attention) none of them
    for training in (tt, dict(tt, compile=True, precision="fp8"), dict(seq_len=8192)):
        j = make_job(llama, gpus=8, tp=8, mbs=1, recompute="selective", training=training)
        lt = layer_time(j, LayerKind(), cal=DEFAULT)
        gemm, attention = recomputed_share(j, Recompute.SELECTIVE)
        again = layer_pass(j, LayerKind(), mode=Recompute.SELECTIVE, cal=DEFAULT).compute.value("recompute")
        memory = lt.elementwise + lt.fp8_cast if training is tt else gemm * lt.fp8_cast
        assert again == pytest.approx(gemm * lt.gemm + attention * lt.attention + memory), training


def test_torch_async_tp_fuses_only_gathers_read_by_matmuls_and_scatters_of_one_matmul():
    # Llama-3.1-8B, tp 8, 8192 tokens, torchtitan async TP. Backward: the row outputs' gradient
    # gather feeds the dgrad matmul (fused, a ring exchange); the column inputs' gradient is the sum
    # of the wq, wk, wv (w1, w3) dgrads, so its reduce-scatter is not one matmul's output and runs
    # exposed: 8192 x 4096 x 2 bytes = 64 MiB per block
    tt = dict(seq_len=8192, framework="torchtitan", tp_comm_overlap=True, compile=True)
    bf16 = make_job("llama-3.1-8b", gpus=8, tp=8, mbs=1, training=tt)
    size = 8192 * 4096 * 2
    where = placement(H100, 8, 1)
    rs = collective_time(Collective.REDUCE_SCATTER, size, where, H100)
    ag = collective_time(Collective.ALL_GATHER, size, where, H100)
    chunk = send_recv_time(size / 8, stride=1, cluster=H100)
    blocks = tp_blocks(bf16, LayerKind(), cal=DEFAULT)
    row = sum((_ring_exchange(bf16, b.row, 8192, b.row_dgrad, chunk, DEFAULT) for b in blocks), Exposure())
    assert tp_exposure(bf16, blocks, backward=True, cal=DEFAULT).exposed == pytest.approx(row.exposed + 2 * rs)
    # rowwise float8: the gathered 16-bit tensors feed the Float8Linears' casts, not matmuls, so
    # neither gather fuses (forward: only the row GEMM's reduce-scatter is pipelined)
    rowwise = make_job("llama-3.1-8b", gpus=8, tp=8, mbs=1, training={**tt, "precision": "fp8", "fp8_recipe": "rowwise"})
    rblocks = tp_blocks(rowwise, LayerKind(), cal=DEFAULT)
    assert tp_exposure(rowwise, rblocks, backward=True, cal=DEFAULT).exposed == pytest.approx(2 * ag + 2 * rs)
    fwd = tp_exposure(rowwise, rblocks, backward=False, cal=DEFAULT).exposed
    assert 2 * ag <= fwd < 2 * ag + 2 * rs
    # tensorwise float8 (torchtitan's float8 TP) gathers 1-byte elements: its forward gathers fuse,
    # and plain TP moves them at half the 16-bit bytes
    plain = make_job("llama-3.1-8b", gpus=8, tp=8, mbs=1, training={**tt, "precision": "fp8", "tp_comm_overlap": False})
    half = collective_time(Collective.ALL_GATHER, size / 2, where, H100)
    assert tp_exposure(plain, tp_blocks(plain, LayerKind(), cal=DEFAULT), backward=False, cal=DEFAULT).exposed == (
        pytest.approx(2 * half + 2 * rs))


def test_torchtitan_float8_tp_waits_for_one_amax_all_reduce_per_dtensor_cast(monkeypatch):
    # Llama-3.1-8B, tp 8, torchtitan float8 tensorwise TP: every tensorwise cast of a DTensor reduces
    # its amax over tp. Forward, per block: the block input (PrepareFloat8ModuleInput), the row
    # module's input and each module's weight; attention wq, wk, wv, wo -> 2 + 4, MLP w1, w3, w2
    # -> 2 + 3: 11. Backward, each module output's gradient: 4 + 3 = 7
    tt = dict(seq_len=8192, framework="torchtitan", compile=True, precision="fp8")
    job = make_job("llama-3.1-8b", gpus=8, tp=8, mbs=1, training=tt)
    blocks = tp_blocks(job, LayerKind(), cal=DEFAULT)
    assert float8_amax_reductions(job, blocks) == (11, 7)
    one = collective_time(Collective.ALL_REDUCE, 2, placement(H100, 8, 1), H100)
    assert float8_amax_seconds(job, blocks) == pytest.approx((11 * one, 7 * one))
    assert 5e-6 < one < 1e-4  # latency-bound: microseconds, whatever the scalar's bytes
    # exposed in the layer's tp term: once per forward pass (twice under full recompute)
    base = layer_pass(job, LayerKind(), mode=Recompute.FULL, cal=DEFAULT).comm["tp"]
    monkeypatch.setattr("cost_models.step_time.float8_amax_seconds", lambda job, blocks: (0.0, 0.0))
    without = layer_pass(job, LayerKind(), mode=Recompute.FULL, cal=DEFAULT).comm["tp"]
    assert base - without == pytest.approx((2 * 11 + 7) * one)
    # eager, each module's weight is cast again for its dgrad: 7 more in the backward
    eager = make_job("llama-3.1-8b", gpus=8, tp=8, mbs=1, training={**tt, "compile": False})
    assert float8_amax_reductions(eager, tp_blocks(eager, LayerKind(), cal=DEFAULT)) == (11, 14)
    # rowwise recipes keep plain TP (casts inside the Float8Linears on local tensors), bf16 has no
    # casts, and one GPU has no DTensor
    rowwise = make_job("llama-3.1-8b", gpus=8, tp=8, mbs=1, training={**tt, "fp8_recipe": "rowwise"})
    bf16 = make_job("llama-3.1-8b", gpus=8, tp=8, mbs=1, training={**tt, "precision": "bf16"})
    one_gpu = make_job("llama-3.1-8b", gpus=1, mbs=1, training=tt)
    for other in (rowwise, bf16, one_gpu):
        assert float8_amax_reductions(other, tp_blocks(other, LayerKind(), cal=DEFAULT)) == (0, 0)


def test_ring_exchange_chunks_on_three_streams_run_as_one_gemm_of_three_chunks():
    # TE's ring exchange rotates its chunk GEMMs over 3 streams, each waiting only for its own
    # chunk: after the first chunk, each step costs a third of a GEMM of 3 chunks' rows
    job = make_job("llama-3.1-70b", gpus=8, tp=8, training=dict(tp_comm_overlap=True))
    b = tp_blocks(job, LayerKind(), cal=DEFAULT)[0]
    rows = 8192
    g = chunk_seconds(b.col, rows // 8, job, DEFAULT)
    g3 = chunk_seconds(b.col, 3 * (rows // 8), job, DEFAULT)
    assert g3 < 3 * g  # a lone 1024-row chunk leaves SMs idle
    e = _ring_exchange(job, b.col, rows, b.col_fwd, 0.0, DEFAULT, streams=3)
    assert e.exposed == pytest.approx(max(0.0, g + 7 * g3 / 3 - b.col_fwd))
    # tp 2: one step after the first, nothing to run beside it
    two = make_job("llama-3.1-70b", gpus=2, tp=2, training=dict(tp_comm_overlap=True))
    b2 = tp_blocks(two, LayerKind(), cal=DEFAULT)[0]
    half = chunk_seconds(b2.col, rows // 2, two, DEFAULT)
    assert _ring_exchange(two, b2.col, rows, b2.col_fwd, 0.0, DEFAULT, streams=3).exposed == pytest.approx(
        max(0.0, 2 * half - b2.col_fwd))


def test_copy_engine_write_runs_at_the_measured_p2p_rate():
    # H100: 376 of the 450 GB/s per direction (p2pBandwidthLatencyTest); a 16 MiB chunk:
    # 16,777,216 / 376e9 = 44.62 us, plus the copy's and the flag kernel's start-up, 2 x 2.4 us
    from cost_models.comm import copy_engine_p2p_time

    assert copy_engine_p2p_time(16 * 2**20, H100, launch_s=2.4e-6) == pytest.approx(44.62e-6 + 4.8e-6, rel=1e-3)
    b200 = presets.clusters()["dgx-b200"]  # 746 of 900 GB/s: 22.49 us + 4.8
    assert copy_engine_p2p_time(16 * 2**20, b200, launch_s=2.4e-6) == pytest.approx(22.49e-6 + 4.8e-6, rel=1e-3)


def test_userbuffers_gather_fp8_over_the_copy_engine():
    # Megatron fp8 with --tp-comm-overlap: the ring chunks are the fp8-cast input, 1 byte per
    # element, t·h/tp bytes each on the copy engine; the bulk all-gather beside the dgrad too.
    # The forward of a block is then exactly the ring exchange with that transfer (3 streams) plus
    # the pipelined reduce-scatter of the 16-bit output.
    from cost_models.comm import copy_engine_p2p_time
    from cost_models.flops import tokens
    from cost_models.step_time import UB_STREAMS, _pipelined_rs, _tp_coll, tp_exposure, ub_gather_bytes

    job = make_job("llama-3.1-70b", gpus=8, tp=8, training=dict(tp_comm_overlap=True, precision="fp8"))
    bf16 = make_job("llama-3.1-70b", gpus=8, tp=8, training=dict(tp_comm_overlap=True))
    assert (ub_gather_bytes(job), ub_gather_bytes(bf16)) == (1, 2)
    t, h = tokens(job), job.model.hidden_size
    assert (t, h) == (4096, 8192)  # 4096 x 8192 fp8 = 32 MiB; a chunk is 4 MiB
    chunk = copy_engine_p2p_time(t * h / 8, H100, launch_s=2.4e-6)
    assert chunk == pytest.approx(4 * 2**20 / 376e9 + 4.8e-6)
    b = tp_blocks(job, LayerKind(), cal=DEFAULT)[0]
    rs = _tp_coll(job, Collective.REDUCE_SCATTER, t * h * 2)
    expected = _ring_exchange(job, b.col, t, b.col_fwd, chunk, DEFAULT, streams=UB_STREAMS).exposed + _pipelined_rs(
        job, b.row, t, b.row_fwd, rs, DEFAULT).exposed
    assert tp_exposure(job, (b,), backward=False, cal=DEFAULT).exposed == pytest.approx(expected)


def test_megatron_fp8_gathers_the_sequence_parallel_shards_in_fp8_over_nccl():
    # Megatron fp8 (Transformer Engine) at tp 8 with sequence parallelism, no userbuffers: each block
    # casts its input on the rank's 512 of the 4096 tokens and all-gathers the fp8 tensor
    # (TransformerEngine@40c69e75 module/layernorm_linear.py:247-266, distributed.py:925-972). A gathered
    # 4096 x 8192 input is 33,554,432 elements, 32 MiB in fp8 (4 MiB from each rank) where the 16-bit
    # input would be 64 MiB; the row output's reduce-scatter stays 16-bit, 64 MiB. Without overlap the
    # forward of the two blocks exposes exactly 2 x (AG 32 MiB + RS 64 MiB).
    from cost_models.compute import tp_gather_bytes, tp_grad_gather_bytes
    from cost_models.flops import tokens
    from cost_models.step_time import _hidden, _share, _tp_coll, _tp_group

    job = make_job("llama-3.1-70b", gpus=8, tp=8, training=dict(precision="fp8"))
    assert job.sp and not job.training.tp_comm_overlap
    t, h = tokens(job), job.model.hidden_size
    assert t * h == 33_554_432
    assert (tp_gather_bytes(job), tp_grad_gather_bytes(job)) == (1, 1)
    blocks = tp_blocks(job, LayerKind(), cal=DEFAULT)
    ag, rs = _tp_coll(job, Collective.ALL_GATHER, 32 * 2**20), _tp_coll(job, Collective.REDUCE_SCATTER, 64 * 2**20)
    assert tp_exposure(job, blocks, backward=False, cal=DEFAULT).exposed == pytest.approx(len(blocks) * (ag + rs))
    # backward: the row output's gradient, cast on the shard and gathered in fp8 before the row dgrad
    # (base.py:1161-1193), exposed; the column input's saved fp8 shard gathered again beside the
    # column dgrad (layernorm_linear.py:650-674) and its 16-bit input gradient reduce-scattered beside
    # the wgrad: both gathers 32 MiB
    share = _share(job, _tp_group(job), DEFAULT, "tp")
    backward = sum(ag + (_hidden(ag, b.col_dgrad, share) + _hidden(rs, b.col_wgrad, share)).exposed for b in blocks)
    assert tp_exposure(job, blocks, backward=True, cal=DEFAULT).exposed == pytest.approx(backward)


def test_transformer_engine_gather_bytes_follow_the_recipe_not_the_release():
    # Every Transformer Engine release the mapped runs use (release_v0.8 to release_v2.8) gathers the
    # per-tensor fp8 shards (delayed or current scaling) as 1-byte data, through NCCL as through
    # userbuffers' uint8 buffers: the two paths price the same bytes. MXFP8 gathers one usage with
    # its e8m0 scale per 32 elements forward (1 + 1/32 = 1.03125 bytes), both usages of an output
    # gradient (2.0625; distributed.py:1528-1571); NVFP4 0.5625 and 1.125. 16-bit jobs, and fp8 jobs
    # without sequence parallelism (whose tp all-reduces the 16-bit outputs), stay at 16 bits.
    from cost_models.compute import te_quantized_gathers, tp_gather_bytes, tp_grad_gather_bytes
    from cost_models.step_time import ub_gather_bytes

    def job(cluster: str = "dgx-h100", sp: bool | None = None, **training):
        return make_job("llama-3.1-8b", gpus=8, tp=4, sp=sp, cluster=cluster, training=training)

    for recipe in ("delayed", "tensorwise"):
        nccl = job(precision="fp8", fp8_recipe=recipe)
        ub = job(precision="fp8", fp8_recipe=recipe, tp_comm_overlap=True)
        assert (tp_gather_bytes(nccl), tp_grad_gather_bytes(nccl)) == (1, 1) == (ub_gather_bytes(ub), ub_gather_bytes(ub))
    mx = job("dgx-b200", precision="fp8", fp8_recipe="mxfp8")
    assert (tp_gather_bytes(mx), tp_grad_gather_bytes(mx)) == (1.03125, 2.0625)
    fp4 = job("dgx-b200", precision="fp4")
    assert (tp_gather_bytes(fp4), tp_grad_gather_bytes(fp4)) == (0.5625, 1.125)
    for sixteen in (job(), job(precision="fp8", sp=False)):
        assert not te_quantized_gathers(sixteen)
        assert (tp_gather_bytes(sixteen), tp_grad_gather_bytes(sixteen)) == (2, 2)


def test_megatron_fsdp_with_tp_before_blackwell_exposes_the_backward_tp_collectives():
    # Megatron's tp layers hide the backward all-gather / reduce-scatter behind the dgrad / wgrad
    # GEMMs only when CUDA_DEVICE_MAX_CONNECTIONS=1 orders the launches (Megatron-LM@d98e8a64
    # core/tensor_parallel/layers.py L842-849); FSDP runs with it unset, so under zero 3 the two
    # column-GEMM collectives of each block are exposed too: 2·ag + rs per block instead of ag.
    from cost_models.rules import notes
    from cost_models.step_time import _tp_coll, tp_exposure
    from cost_models.comm import Collective
    from cost_models.flops import tokens

    def backward(zero: int, cluster: str = "dgx-h100"):
        job = make_job("llama-3.1-8b", gpus=16, cluster=cluster, tp=2, zero=zero)
        blocks = tp_blocks(job, LayerKind(), cal=DEFAULT)
        return job, blocks, tp_exposure(job, blocks, backward=True, cal=DEFAULT).exposed

    fsdp, blocks, exposed = backward(3)
    size = tokens(fsdp) * fsdp.model.hidden_size * 2
    ag, rs = _tp_coll(fsdp, Collective.ALL_GATHER, size), _tp_coll(fsdp, Collective.REDUCE_SCATTER, size)
    assert exposed == pytest.approx(len(blocks) * (2 * ag + rs))
    dist_opt, _, ordered = backward(1)
    assert ordered < exposed and not notes(dist_opt)
    assert "CUDA_DEVICE_MAX_CONNECTIONS" in notes(fsdp)[0]
    # from Blackwell on, Megatron lifts the one-queue requirement (arguments.py L1451-1453)
    blackwell, _, _ = backward(3, "dgx-b200")
    assert not blackwell.unordered_queues and not notes(blackwell)


def test_the_one_queue_rule_follows_the_compute_capability_not_the_architecture_name():
    # Megatron tests get_device_arch_version() < 10 (arguments.py L1453-1454): a later generation
    # whose name the presets do not know, given its compute capability, is past the rule, and a part
    # named "blackwell" that reports 9.0 keeps it.
    from cost_models.hardware import Cluster, ClusterSpec
    from cost_models.layout import Layout
    from cost_models.rules import resolve
    from cost_models.training import TrainingSpec

    base = presets.clusters()["dgx-h100"]

    def queues(**gpu: object) -> bool:
        spec = ClusterSpec.model_validate(
            {**base.model_dump(), "gpu": {**base.gpu.model_dump(), **gpu}})
        cl = Cluster(spec=spec, num_gpus=16)
        job = resolve(presets.models()["llama-3.1-8b"], cl, TrainingSpec(), Layout(tp=2, zero=3))
        return job.unordered_queues

    assert queues() and queues(compute_capability=(9, 0))
    assert not queues(architecture="rubin", compute_capability=(12, 0))
    assert queues(architecture="blackwell", compute_capability=(9, 0))


def test_interleaved_megatron_overlaps_pipeline_transfers_and_others_wait_for_them():
    plain = make_job("llama-3.1-70b", gpus=32, tp=8, pp=4, training=dict(global_batch_size=64))
    inter = make_job("llama-3.1-70b", gpus=32, tp=8, pp=4, vpp=5, training=dict(global_batch_size=64))
    tp_plain, tp_inter = time_estimate(plain), time_estimate(inter)
    hop = pp_hop_seconds(plain)
    m = plain.num_microbatches
    # 1F1B without vpp: every transfer waited on, two per micro-batch on a middle stage, each
    # followed by the host's re-launch after torch.cuda.synchronize() (H100: 2.4 us)
    assert tp_plain.stages[1].microbatch.value("pp") == pytest.approx(2 * hop + 2 * 2.4e-6)
    # interleaved: transfers run beside the other chunks; only the warm-up and flush block
    assert tp_inter.breakdown.value("pp") < 0.2 * m * 10 * hop
    assert tp_inter.breakdown.value("pp") >= 2 * 3 * hop


def test_a_pipeline_inside_one_node_leaves_it_over_the_network_where_it_crosses_into_the_next():
    # Llama-3.1-8B, tp 1, pp 16, dp 1 on two DGX H100s: pipeline rank r is GPU r, so ranks 7 and 8
    # sit on different nodes and every other pair shares an NVLink domain. One boundary carries
    # 4096 tokens x 4096 x 2 bytes = 32 MiB.
    job = make_job("llama-3.1-8b", gpus=16, pp=16, training=dict(global_batch_size=32))
    size = 4096 * 4096 * 2
    nvlink = send_recv_time(size, stride=1, cluster=H100)
    network = send_recv_time(size, stride=8, cluster=H100)
    assert network > 5 * nvlink  # one 400 Gb/s NIC against NVLink
    assert pp_boundary_seconds(job, 3) == (nvlink, nvlink)
    assert pp_boundary_seconds(job, 7) == (nvlink, network)
    assert pp_boundary_seconds(job, 8) == (network, nvlink)
    # every exchange waited on (1F1B): rank 7's two transfers per micro-batch are one of each, the
    # first and last rank have one neighbour; each exchange adds one re-launch (H100: 2.4 us)
    est = time_estimate(job)
    launch = 2.4e-6
    assert est.stages[7].microbatch.value("pp") == pytest.approx(nvlink + network + 2 * launch)
    assert est.stages[3].microbatch.value("pp") == pytest.approx(2 * nvlink + 2 * launch)
    assert est.stages[0].microbatch.value("pp") == pytest.approx(nvlink + launch)
    assert est.stages[15].microbatch.value("pp") == pytest.approx(nvlink + launch)
    # ranks of equal layers but different neighbours do not share a cached stage
    assert est.stages[7].microbatch_s - est.stages[6].microbatch_s == pytest.approx(network - nvlink)
    # tp 2: rank r holds GPUs 2r and 2r+1, so ranks 3 (GPUs 6, 7) and 4 (GPUs 8, 9) cross
    tp2 = make_job("llama-3.1-8b", gpus=16, tp=2, pp=8, training=dict(global_batch_size=32))
    assert [pp_boundary_seconds(tp2, r)[1] > pp_boundary_seconds(tp2, 2)[1] for r in range(7)] == [
        False, False, False, True, False, False, False]
    # tp 8: every neighbour is a node away, as pp_hop_seconds has it (sequence parallel sends 1/8)
    tp8 = make_job("llama-3.1-8b", gpus=16, tp=8, pp=2, training=dict(global_batch_size=32))
    across = send_recv_time(size / 8, stride=8, cluster=H100)
    assert pp_boundary_seconds(tp8, 0) == pp_boundary_seconds(tp8, 1) == (across, across) == (pp_hop_seconds(tp8),) * 2


def test_an_interleaved_pipeline_spanning_several_domains_runs_at_its_network_hop():
    # Llama-3.1-8B, tp 4, cp 2, pp 8, vpp 2 on GB200 NVL72 (72-GPU NVLink domains), seq 4096: a
    # boundary carries 4096/2 tokens / tp 4 (sequence parallel) x 4096 x 2 bytes = 4 MiB.
    gb200 = presets.clusters()["gb200-nvl72"]
    size = 4096 // 2 // 4 * 4096 * 2
    nvlink = send_recv_time(size, stride=1, cluster=gb200)
    network = send_recv_time(size, stride=72, cluster=gb200)
    assert network > 5 * nvlink
    # 256 GPUs, dp 4: pipeline neighbours are 4*2*4 = 32 GPUs apart, below the domain's 72, but a
    # pipeline spans 8 x 32 = 256 GPUs and at most 72 // 32 = 2 of its ranks share a domain, so
    # some boundary crosses into the next rack and the overlapped exchanges run at that pace
    wide = make_job("llama-3.1-8b", gpus=256, cluster="gb200-nvl72", tp=4, cp=2, pp=8, vpp=2, training=dict(global_batch_size=64))
    assert pp_hop_seconds(wide) == pytest.approx(nvlink)
    assert pp_overlapped_hop_seconds(wide) == pytest.approx(network)
    # 64 GPUs, dp 1: the whole pipeline (8 x 8 GPUs) sits in one domain, every hop on NVLink
    inside = make_job("llama-3.1-8b", gpus=64, cluster="gb200-nvl72", tp=4, cp=2, pp=8, vpp=2, training=dict(global_batch_size=64))
    assert pp_overlapped_hop_seconds(inside) == pytest.approx(nvlink)


def test_megatron_1f1b_waits_for_the_gpu_after_every_exchange():
    # Megatron without --overlap-p2p-comm (no vpp) synchronises after each batched exchange: the
    # next pass's first kernel starts one kernel start-up after the host launches it, 2.6 us on an
    # A100 and 2.4 us on an H100 (gpu-small-kernels fits, presets/kernels/*.toml launch_s)
    a100 = make_job("llama-3.1-8b", gpus=8, pp=4, cluster="dgx-a100-80gb", training=dict(global_batch_size=16))
    h100 = make_job("llama-3.1-8b", gpus=8, pp=4, training=dict(global_batch_size=16))
    assert pp_sync_relaunch_seconds(a100) == 2.6e-6
    assert pp_sync_relaunch_seconds(h100) == 2.4e-6
    # none with the interleaved schedule's overlapped p2p, under torch's pipelining, or without a pipeline
    assert pp_sync_relaunch_seconds(make_job("llama-3.1-8b", gpus=8, pp=4, vpp=2, training=dict(global_batch_size=16))) == 0.0
    titan = make_job("llama-3.1-8b", gpus=8, pp=4, training=dict(global_batch_size=16, framework="torchtitan"))
    assert pp_sync_relaunch_seconds(titan) == 0.0
    assert time_estimate(titan).stages[1].microbatch.value("pp") == pytest.approx(2 * pp_hop_seconds(titan))
    assert pp_sync_relaunch_seconds(make_job("llama-3.1-8b", gpus=8, training=dict(global_batch_size=16))) == 0.0


def test_tied_embeddings_all_reduce_their_gradient_between_the_first_and_last_stage():
    llama = presets.models()["llama-3.1-8b"]
    tied = llama.model_copy(update=dict(tie_embeddings=True))
    # tp 1, pp 4, dp 2 on one DGX H100: the word embedding 128,256 x 4,096 = 525,336,576 params (the
    # vocabulary already a multiple of 128), fp32 main grads: 2,101,346,304 bytes (2004 MiB). Ranks 0
    # and 6 share the NVLink domain: bus factor 2(2-1)/2 = 1 at 18 x 20.6 = 370.8 GB/s; size share
    # between 1 GiB (0.974) and 4 GiB (0.995), log2 weight log2(2004/1024)/2 = 0.4843 -> 0.9842:
    # 2.1013e9 / (370.8e9 x 0.9842) = 5.758 ms (hand-rounded shares: rel 1e-3)
    inside = make_job(tied, gpus=8, pp=4)
    assert tied_embedding_grad_seconds(inside) == pytest.approx(5.758 * MS, rel=1e-3)
    # tp 2, pp 4, dp 2 on two nodes: 64,128 x 4,096 x 4 = 1,050,673,152 bytes (1002 MiB); ranks 0 and
    # 12 on different nodes, one NIC each at 400 Gb/s x 0.94 = 47 GB/s; share at 2 nodes, halfway in
    # log2 between one node (0.900 -> 0.974 from 256 MiB to 1 GiB, weight log2(1002/256)/2 = 0.9845:
    # 0.9728) and 4 nodes (0.835 -> 0.933: 0.9315) = 0.9522: 1.0507e9 / (47e9 x 0.9522) = 23.48 ms
    across = make_job(tied, gpus=16, tp=2, pp=4)
    assert tied_embedding_grad_seconds(across) == pytest.approx(23.48 * MS, rel=1e-3)
    # exposed in the step's pp part: the untied model differs by exactly this term (both keep two
    # copies, so compute, memory and the optimizer are the same)
    with_tie, without = time_estimate(inside), time_estimate(make_job(llama, gpus=8, pp=4))
    assert with_tie.breakdown.value("pp") - without.breakdown.value("pp") == pytest.approx(5.758 * MS, rel=1e-3)
    assert with_tie.step_s - without.step_s == pytest.approx(5.758 * MS, rel=1e-3)
    # the same two ranks with a virtual pipeline; none without a pipeline, without a tie, or under
    # torchtitan (which refuses a tie with pp); Megatron's MTP keeps a copy on the last stage untied
    assert tied_embedding_grad_seconds(make_job(tied, gpus=8, pp=4, vpp=2)) == tied_embedding_grad_seconds(inside)
    assert tied_embedding_grad_seconds(make_job(tied, gpus=8, tp=2)) == 0.0
    assert tied_embedding_grad_seconds(make_job(llama, gpus=8, pp=4)) == 0.0
    assert tied_embedding_grad_seconds(make_job(tied, gpus=8, pp=4, training=dict(framework="torchtitan"))) == 0.0
    mtp = llama.model_copy(update=dict(mtp_layers=1))
    assert tied_embedding_grad_seconds(make_job(mtp, gpus=8, pp=4)) == tied_embedding_grad_seconds(inside)


# --- no ties between layouts that differ in cp or ep ----------------------------------------------


def test_layouts_that_differ_in_cp_or_ep_never_tie_to_the_millisecond():
    steps = {cp: time_estimate(make_job("llama-3.1-70b", gpus=64, tp=8, cp=cp, zero=1, training=dict(seq_len=32768, global_batch_size=64))).step_s
             for cp in (1, 2, 4, 8)}
    for a, b in itertools.combinations(steps, 2):
        assert abs(steps[a] - steps[b]) > MS, steps
    moe = {ep: time_estimate(make_job("mixtral-8x22b", gpus=128, tp=2, pp=4, ep=ep, zero=1, training=dict(seq_len=4096, global_batch_size=256))).step_s
           for ep in (1, 2, 4, 8)}
    for a, b in itertools.combinations(moe, 2):
        assert abs(moe[a] - moe[b]) > MS, moe


def test_ring_exchange_reduce_scatter_adds_the_reduction_of_the_tp_partials():
    # TE's ring-exchange reduce-scatter (CommOverlapP2PBase::split_overlap_rs): 8 chunk GEMMs of
    # 8192/8 = 1024 rows on three streams, each partial output (1024 x 8192 bf16 = 16,777,216 bytes)
    # sent to its rank on the copy engine beside the next chunk, then reduce_bf16 reads the 8
    # partials and writes one: 9 x 16,777,216 = 150,994,944 bytes on the main stream
    from cost_models.compute import memory_seconds
    from cost_models.step_time import UB_STREAMS, _ring_exchange_rs, tp_exposure, ub_ring_chunk_seconds

    base = dict(tp_comm_overlap=True, seq_len=8192)
    job = make_job("llama-3.1-70b", gpus=8, tp=8, training=base)
    attn, mlp = tp_blocks(job, LayerKind(), cal=DEFAULT)
    assert (mlp.row.name, mlp.row.n) == ("mlp_fc2", 8192)
    partial = ub_ring_chunk_seconds(job, 16_777_216)
    ring = _ring_exchange(job, mlp.row, 8192, mlp.row_fwd, partial, DEFAULT, streams=UB_STREAMS)
    e = _ring_exchange_rs(job, mlp.row, 8192, mlp.row_fwd, partial, DEFAULT)
    assert e.exposed == pytest.approx(ring.exposed + memory_seconds(job, 150_994_944, DEFAULT, launches=1))
    # the forward prices fc2 that way only where the job names it, and proj too where named
    fwd = {k: tp_exposure(make_job("llama-3.1-70b", gpus=8, tp=8, training={**base, "ub_ring_exchange_rs": k}),
                          (attn, mlp), backward=False, cal=DEFAULT).exposed
           for k in (frozenset(), frozenset({"fc2"}), frozenset({"proj", "fc2"}))}
    assert len(set(fwd.values())) == 3
    default_fc2 = tp_exposure(job, (mlp,), backward=False, cal=DEFAULT).exposed
    named = make_job("llama-3.1-70b", gpus=8, tp=8, training={**base, "ub_ring_exchange_rs": {"fc2"}})
    assert fwd[frozenset({"fc2"})] - fwd[frozenset()] == pytest.approx(
        tp_exposure(named, (mlp,), backward=False, cal=DEFAULT).exposed - default_fc2)


def test_interleaved_chunks_reduce_from_their_last_backward_one_after_another():
    # three chunks whose reductions take 0.5, 1.5 and 4 s, the last group 2 micro-batches, 1 s per
    # chunk backward. Rank 1 launches chunk 2 at 2·2 − 1 = 3 s before its end (done at +1), chunk 1
    # at 2·1 − 1 = 1 s before, but the communicator is busy until +1, so done at +2.5; chunk 0
    # after the end, done at +3. Rank 0: chunk 2 launched at −4 (done at 0), chunk 1 at −2 (done at
    # +1.5), chunk 0 at 0 (+2). With 10 s chunk backwards only chunk 0's 0.5 s is left.
    from cost_models.step_time import chunk_sync_overrun

    seconds = [0.5, 1.5, 4.0]
    assert chunk_sync_overrun(seconds, last_group=2, rank=1, chunk_backward_s=1.0) == pytest.approx(3.0)
    assert chunk_sync_overrun(seconds, last_group=2, rank=0, chunk_backward_s=1.0) == pytest.approx(2.0)
    assert chunk_sync_overrun(seconds, last_group=2, rank=0, chunk_backward_s=10.0) == pytest.approx(0.5)
    assert chunk_sync_overrun([0.0, 0.0], last_group=2, rank=0, chunk_backward_s=1.0) == 0.0


def test_interleaved_megatron_leaves_only_the_first_chunks_reduction_after_the_backward():
    # Llama-3.1-70B, tp8 pp4 vpp2 on 64 H100 (dp 2), ZeRO-1: chunk 1 of each rank is reduced behind
    # the last group's pp = 4 chunk-0 backwards (10 layers each, far longer than one 10-layer
    # reduce-scatter), so what outlasts rank 0's backward is chunk 0's reduce-scatters (fp32
    # gradients, Megatron's default under bf16) and the first forward bucket's bf16 gather; rank r's backward ends r chunk backwards before rank 0's.
    # Without interleaving the old rule stands (dp_late_s None).
    from cost_models.step_time import _dense_group, megatron_buckets

    job = make_job("llama-3.1-70b", gpus=64, tp=8, pp=4, vpp=2, zero=1, training=dict(global_batch_size=32))
    plain = make_job("llama-3.1-70b", gpus=64, tp=8, pp=4, zero=1, training=dict(global_batch_size=32))
    where = _dense_group(job)
    chunk0, _ = megatron_buckets(job, 0)
    rs = sum(collective_time(Collective.REDUCE_SCATTER, b * 4, where, H100) for b in chunk0)
    ag = collective_time(Collective.ALL_GATHER, chunk0[-1] * 2, where, H100)
    stages = time_estimate(job).stages
    assert stages[0].dp_late_s == pytest.approx(rs + ag)
    assert stages[0].dp_late_s < stages[0].dp_comm_s
    assert stages[2].drain_s == pytest.approx(2 * stages[2].dp_window_s / 2)
    assert all(s.dp_late_s is None and s.drain_s == s.rank * s.dp_window_s for s in time_estimate(plain).stages)
