"""The time model term by term: FLOP counts on hand-worked cases (arithmetic in comments), the step's
assembly, and properties that must hold for any layout. Kernels, collectives and the mechanisms
between them: tests/test_kernels.py, test_comm.py, test_mechanisms.py."""

from __future__ import annotations

import math

import pytest

from cost_models.calibration import DEFAULT, MECHANISMS
from cost_models.enums import Recompute
from cost_models.model_spec import LayerKind
from cost_models.flops import causal_fraction, layer_flops, model_flops_per_token
from cost_models.job import Job
from cost_models.states import rank_params
from cost_models.step_time import time_estimate
from planner import presets
from tests.helpers import GPT_TINY, LLAMA_TINY, make_job

# --- FLOPs --------------------------------------------------------------------------------------


def test_gpt_layer_flops_are_narayanan_eq3_per_layer():
    # One GPT layer forward (MHA, f = 4h, eager attention computes the full s x s scores):
    # 24·b·s·h² (qkv 6bsh², out 2bsh², mlp 16bsh²) + 4·b·s²·h (scores and context).
    job = make_job(GPT_TINY, gpus=1, mbs=2, training=dict(seq_len=512, attention="eager"))
    b, s, h = 2, 512, 256
    f = layer_flops(job, LayerKind(moe=False), mode=Recompute.NONE)
    assert f.forward == 24 * b * s * h * h + 4 * b * s * s * h
    # Full recompute repeats the forward: 4 forwards' worth, Narayanan eq. 3's 96·B·s·l·h²(1 + s/6h)
    full = layer_flops(job, LayerKind(moe=False), mode=Recompute.FULL)
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
    f = layer_flops(job, LayerKind(moe=False), mode=Recompute.NONE)
    assert f.forward_gemm == gemm
    assert f.forward_attention == pytest.approx(attention)
    # backward: 2x the GEMMs, 2.5x flash attention
    assert f.backward == pytest.approx(2 * gemm + 2.5 * attention)


def test_tp_divides_a_layers_gemm_flops():
    one = layer_flops(make_job(LLAMA_TINY, gpus=1), LayerKind(moe=False), mode=Recompute.NONE)
    two = layer_flops(make_job(LLAMA_TINY, gpus=2, tp=2), LayerKind(moe=False), mode=Recompute.NONE)
    assert two.forward_gemm * 2 == one.forward_gemm


def test_moe_layer_flops_count_top_k_experts_and_the_router():
    model = presets.models()["mixtral-8x7b"]
    job = make_job(model, gpus=8, ep=8, mbs=1, training=dict(seq_len=4096))
    t, h, f = 4096, 4096, 14336
    # router t·h·8 experts; each token through 2 experts of 3 h x f matrices (SwiGLU)
    expected_mlp = 2 * t * h * 8 + 2 * 3 * 2 * t * h * f
    dense = layer_flops(job, LayerKind(moe=True), mode=Recompute.NONE).forward_gemm
    attention_part = 2 * t * h * (4096 + 2 * 1024) + 2 * t * 4096 * h
    assert dense - attention_part == expected_mlp


def test_palm_model_flops_per_token():
    # llama-3.1-8b: 6·(N − input embedding) + 12·L·H·Q·T
    m = presets.models()["llama-3.1-8b"]
    n = m.params_total - m.vocab_size * m.hidden_size
    assert model_flops_per_token(m, 8192) == 6 * n + 12 * 32 * 4096 * 8192


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
    # the same kernels: overlap changes what is exposed and what contends, not the kernels
    for part in ("gemm", "attention", "elementwise"):
        assert overlapped.breakdown.value(f"compute/{part}") == pytest.approx(plain.breakdown.value(f"compute/{part}"))


def test_dp_gradients_hide_behind_backward_except_the_last_bucket():
    # 8B on 64 GPUs, dp 64 over 8 nodes, 16 micro-batches: the window (one micro-batch's backward)
    # is long next to the all-reduce only if the reduction is small; check the rule either way
    job = make_job("llama-3.1-8b", gpus=64, zero=0, training=dict(global_batch_size=1024))
    t = time_estimate(job)
    s = t.stages[0]
    assert s.dp_exposed_s == pytest.approx(max(s.dp_comm_s - s.dp_window_s, s.dp_bucket_s))
    assert 0 < s.dp_bucket_s < s.dp_comm_s
    assert t.breakdown.value("dp") == pytest.approx(s.dp_exposed_s)


def test_a_communicators_cta_cap_bounds_the_sms_its_overlapped_collectives_hold():
    # 8B on 64 H100s (132 SMs), dp 64 over 8 nodes: the gradient reduce-scatter crosses nodes, where
    # NCCL runs 16 channels (comm.NCCL_CHANNELS_NET), one SM each: 16/132 of the SMs, x the fitted
    # contention scale. Megatron's per-group max_ctas of 8 halves that to 8/132; a cap above NCCL's
    # own count changes nothing, and the cap on another group leaves dp alone.
    from cost_models.step_time import dense_share
    from cost_models.training import NcclCtas

    def share(caps):
        job = make_job("llama-3.1-8b", gpus=64, training=dict(global_batch_size=1024, nccl_max_ctas=caps))
        return dense_share(job, DEFAULT)

    scale = DEFAULT.contention_scale
    assert share(None) == pytest.approx(16 / 132 * scale)
    assert share(NcclCtas(dp=8)) == pytest.approx(8 / 132 * scale)
    assert share(NcclCtas(dp=32)) == pytest.approx(16 / 132 * scale)
    assert share(NcclCtas(tp=1, cp=1, pp=1)) == pytest.approx(16 / 132 * scale)
    # less contention, the same kernels and the same collective times: the step can only get shorter
    plain = time_estimate(make_job("llama-3.1-8b", gpus=64, training=dict(global_batch_size=1024)))
    capped = time_estimate(make_job("llama-3.1-8b", gpus=64, training=dict(global_batch_size=1024, nccl_max_ctas=NcclCtas(dp=8))))
    assert 0 < capped.breakdown.value("compute/contention") < plain.breakdown.value("compute/contention")
    assert capped.breakdown.value("dp") == pytest.approx(plain.breakdown.value("dp"))


def test_aligned_param_gathers_run_in_series_with_the_forward_unless_interleaved():
    # Megatron DDP's align_param_gather leaves each bucket's gather to its module's pre-hook when no
    # interleaved schedule dispatches the chunk ahead: the gathers beside the first forward become
    # exposed (and hold no SMs beside compute); under interleaving nothing changes
    def est(**kw):
        layout = kw.pop("layout", {})
        return time_estimate(make_job("llama-3.1-8b", gpus=64, zero=1, training=dict(global_batch_size=64, **kw), **layout))

    plain, aligned = est(), est(align_param_gather=True)
    s, a = plain.stages[0], aligned.stages[0]
    assert a.gather_s == pytest.approx(s.gather_s) and s.gather_s > 0
    assert s.gather_exposed_s == pytest.approx(max(0.0, s.gather_s - s.forward_s))
    assert a.gather_exposed_s == pytest.approx(a.gather_s)
    assert aligned.breakdown.value("dp") - plain.breakdown.value("dp") == pytest.approx(a.gather_s - s.gather_exposed_s)
    lay = dict(pp=2, vpp=2, tp=2)
    assert est(layout=dict(lay), align_param_gather=True).step_s == pytest.approx(est(layout=dict(lay)).step_s)


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
    slow = time_estimate(job, calibration=DEFAULT.with_values(gemm_scale__hopper=0.5))
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
    assert fp8_cast_bytes(job, LayerKind()) == (4_392_960, 7_301_120)
    # Transformer Engine emits fp8 from the producing kernels: nothing extra for Megatron
    megatron = make_job(LLAMA_TINY, gpus=1, training={**fp8, "framework": "megatron"})
    assert fp8_cast_bytes(megatron, LayerKind()) == (0, 0)
    # and the casts show in the step: the same job in bf16 has none
    bf16 = make_job(LLAMA_TINY, gpus=1, training={**fp8, "precision": "bf16"})
    assert fp8_cast_bytes(bf16, LayerKind()) == (0, 0)


def test_megatron_te_casts_by_hand():
    # LLAMA_TINY, 128 tokens, tp 1, 4 micro-batches, Megatron fp8 on H100 (fp8 GEMMs TN-only: a cast
    # reads 2, writes 1 and the transpose 1 = 4 bytes per element). GEMMs (m x k)·(k x n):
    #   qkv 128x256·256x384, out 128x256·256x256, fc1 128x256·256x1376, fc2 128x688·688x256
    # forward, per micro-batch: the inputs of out and fc2 (qkv's and fc1's come in fp8 from the norm)
    #   (32,768 + 88,064) x 4 = 483,328 in 2 kernels
    # backward: every output gradient (m·n) cast and transposed, and the fp8 transposes of qkv's and
    # fc1's gathered inputs (1 read + 1 write):
    #   (49,152 + 32,768 + 176,128 + 32,768) x 4 = 1,163,264; 2 x 32,768 x 2 = 131,072
    #   -> 1,294,336 in 6 kernels
    # weights, once per step: (98,304 + 65,536 + 352,256 + 176,128) x 4 = 2,768,896 in 4 kernels
    from cost_models.compute import layer_time, memory_seconds, te_cast_bytes, te_cast_seconds, te_weight_cast_bytes
    from cost_models.step_time import te_weight_cast_seconds

    fp8 = dict(seq_len=128, precision="fp8", framework="megatron", global_batch_size=4, fp8_recipe="delayed")
    job = make_job(LLAMA_TINY, gpus=1, training=fp8)
    assert te_cast_bytes(job, LayerKind()) == (483_328, 1_294_336, 2, 6)
    assert te_weight_cast_bytes(job, LayerKind()) == (2_768_896, 4)
    # a step of 4 micro-batches carries each layer's weight casts once: a quarter per micro-batch
    layers = LLAMA_TINY.num_layers
    per_step = te_weight_cast_seconds(job, 0, DEFAULT) * job.num_microbatches
    assert per_step == pytest.approx(memory_seconds(job, layers * 2_768_896, DEFAULT, launches=4 * layers))
    # fp8 parameters: the weight is fp8 already, only its transpose is written (2 bytes)
    params = make_job(LLAMA_TINY, gpus=1, training={**fp8, "fp8_param_gather": True}, zero=1)
    assert te_weight_cast_bytes(params, LayerKind()) == (692_224 * 2, 4)
    # B200 takes fp8 GEMMs in any layout: 3 bytes per cast element, no transposes
    #   forward 120,832 x 3 = 362,496; backward 290,816 x 3 = 872,448 in 4 kernels; weights 692,224 x 3
    b200 = make_job(LLAMA_TINY, gpus=1, cluster="dgx-b200", training=fp8)
    assert te_cast_bytes(b200, LayerKind()) == (362_496, 872_448, 2, 4)
    assert te_weight_cast_bytes(b200, LayerKind()) == (2_076_672, 4)
    # the casts are the layer's fp8_cast; the GEMMs carry no autocast factor any more
    lt = layer_time(job, LayerKind(), cal=DEFAULT)
    assert (lt.fp8_cast, lt.fp8_cast_backward) == te_cast_seconds(job, LayerKind(), DEFAULT)
    bf16 = make_job(LLAMA_TINY, gpus=1, training={**fp8, "precision": "bf16", "fp8_recipe": "tensorwise"})
    assert te_cast_bytes(bf16, LayerKind()) == (0.0, 0.0, 0, 0)
    assert te_weight_cast_bytes(bf16, LayerKind()) == (0.0, 0)
    # tp 2 with sequence parallelism: qkv 128x256·256x192, out 128x128·128x256, fc1 128x256·256x688,
    # fc2 128x344·344x256. Forward (16,384 + 44,032) x 4 = 241,664. Backward: qkv's and fc1's
    # gradients (24,576 + 88,064) x 4 = 450,560; out's and fc2's arrive as 64 of the 128 tokens: cast
    # 3 x 16,384 each, then the gathered 128 x 256 transposed (2 x 32,768 each): 98,304 + 131,072;
    # the norm-fed inputs' transposes 131,072 -> 811,008 in 2 + 2 x 2 + 2 kernels
    tp2 = make_job(LLAMA_TINY, gpus=2, tp=2, sp=True, training=fp8)
    assert te_cast_bytes(tp2, LayerKind()) == (241_664, 811_008, 2, 8)
    # each rank casts its half of the weights: (49,152 + 32,768 + 176,128 + 88,064) x 4
    assert te_weight_cast_bytes(tp2, LayerKind()) == (1_384_448, 4)


def test_megatron_current_scaling_reads_each_cast_input_for_its_amax():
    # The same GEMMs as test_megatron_te_casts_by_hand under --fp8-recipe tensorwise (TE current
    # scaling) on H100 (cast 3 bytes + transpose 1): every cast first reads its 16-bit input for the
    # amax (2 bytes) and runs the amax and scale kernels (2 more); a norm-fed input is written in
    # 16 bits by the norm (1 byte more than fp8) and cast on its own (3), with the scale kernel.
    # tp 1, forward: out's and fc2's inputs (32,768 + 88,064) x 6 = 724,992 in 2 x 3 kernels;
    #   qkv's and fc1's norm outputs 2 x 32,768 x 4 = 262,144 in 2 x 2 -> 987,136 in 10
    # backward: the output gradients (49,152 + 32,768 + 176,128 + 32,768) x 6 = 1,744,896 in 4 x 3,
    #   the norm-fed inputs' transposes 131,072 in 2 -> 1,875,968 in 14
    from cost_models.comm import Collective, collective_time, placement
    from cost_models.compute import te_cast_bytes, te_current_scaling, tp_blocks
    from cost_models.step_time import float8_amax_reductions, float8_amax_seconds

    fp8 = dict(seq_len=128, precision="fp8", framework="megatron", global_batch_size=4)
    job = make_job(LLAMA_TINY, gpus=1, training=fp8)
    assert te_current_scaling(job)
    assert te_cast_bytes(job, LayerKind()) == (987_136, 1_875_968, 10, 14)
    # tp 2 with sequence parallelism: forward (16,384 + 44,032) x 6 = 362,496 in 6; the norms' outputs
    # are the rank's 64 tokens: 2 x 16,384 x 4 = 131,072 in 4 -> 493,568 in 10. Backward: qkv's and
    # fc1's gradients (24,576 + 88,064) x 6 = 675,840 in 6; out's and fc2's local halves 2 x 16,384 x 5
    # = 163,840, their gathered transposes 131,072, in 2 x 4; the norm-fed transposes 131,072 in 2
    # -> 1,101,824 in 16
    tp2 = make_job(LLAMA_TINY, gpus=2, tp=2, sp=True, training=fp8)
    assert te_cast_bytes(tp2, LayerKind()) == (493_568, 1_101_824, 10, 16)
    # and the sequence-parallel quantizers reduce their amax over tp: the column inputs forward, the
    # row outputs' gradients backward, one each per block (qkv/out, fc1/fc2), each a scalar all-reduce
    blocks = tp_blocks(tp2, LayerKind(), cal=DEFAULT)
    assert float8_amax_reductions(tp2, blocks) == (2, 2)
    one = collective_time(Collective.ALL_REDUCE, 2, placement(tp2.cluster.spec, 2, 1), tp2.cluster.spec)
    assert float8_amax_seconds(tp2, blocks) == pytest.approx((2 * one, 2 * one))
    # delayed scaling takes last step's scales: no amax pass, no reduction
    delayed = make_job(LLAMA_TINY, gpus=2, tp=2, sp=True, training={**fp8, "fp8_recipe": "delayed"})
    assert not te_current_scaling(delayed)
    assert float8_amax_reductions(delayed, tp_blocks(delayed, LayerKind(), cal=DEFAULT)) == (0, 0)


def test_te_cast_pricing_reproduces_the_measured_autocast_overhead():
    # Transformer Engine's GEMM profiling (docs/examples/gemm_profiling/gemm_profiling.rst @1609c890)
    # times each of a layer's 12 GEMMs (hidden 4096, ffn 16384, 15,872 tokens; fprop, dgrad, wgrad
    # shapes) as a te.Linear forward under autocast with bf16 weights: every call casts both operands
    # row- and column-wise (benchmarks/gemm/benchmark_gemm.py benchmark_fp8_delayed). The delayed-
    # scaling autocast total over the pure fp8 GEMMs (current scaling, pre-quantized) is
    # H200 NVL 18.978 - 16.785 = 2.193 ms, B300 7.802 - 6.812 = 0.990 ms. The same casts priced
    # as te_cast_bytes prices a cast (H200 SXM and B200 stand for them: the same 4.8 and 8 TB/s HBM)
    # give 2.357 ms (+7.5%) and 1.166 ms (+18%). Tolerances: 10% on H200, whose CUDA-event times also
    # hold launch gaps and amax bookkeeping; 20% on B300, whose own table puts delayed scaling
    # "pre-quantized" (still autocast) 0.32 ms above its autocast run, the spread of that difference.
    from cost_models import kernels as K
    from cost_models.compute import TE_CAST_BYTES, te_transposes

    m, h, f = 15872, 4096, 16384
    fprop = [(m, h, 3 * h), (m, h, h), (m, h, f), (m, f, h)]  # (rows, k, n)
    shapes = fprop + [(r, n, k) for r, k, n in fprop] + [(k, r, n) for r, k, n in fprop]
    elements = sum(r * k + k * n for r, k, n in shapes)  # input and weight of every call
    for gpu, measured, rel in ((presets.gpus()["H200"], 2.193e-3, 0.10), (presets.gpus()["B200"], 0.990e-3, 0.20)):
        priced = K.memory_seconds((TE_CAST_BYTES + te_transposes(gpu)) * elements, gpu, launches=2 * len(shapes))
        assert priced == pytest.approx(measured, rel=rel), gpu.name


def test_megatron_nvfp4_casts_by_hand():
    # The GEMMs of test_megatron_te_casts_by_hand (LLAMA_TINY, 128 tokens) under NVFP4 on B200. An
    # NVFP4 copy is e2m1 (0.5 byte) plus an e4m3 scale per 16 elements: 0.5625 bytes; a quantize
    # into both usages reads 16 bits (2) and writes two copies (1.125) = 3.125, after an amax read
    # (2): 5.125 bytes in 2 kernels (TransformerEngine@40c69e75 csrc/quantizer.cpp:1438-1640).
    # Without the Hadamard transform (the MLPerf configs' NVTE_NVFP4_DISABLE_RHT=1), tp 1:
    # forward: qkv's and fc1's inputs come from the norm with their amax, quantize only:
    #   2 x 32,768 x 3.125 = 204,800 in 2 kernels; out's and fc2's (32,768 + 88,064) x 5.125 = 619,264
    #   in 4 -> 824,064 in 6
    # backward: every output gradient (49,152 + 32,768 + 176,128 + 32,768) x 5.125 = 1,490,432 in 8
    # weights once per step: (98,304 + 65,536 + 352,256 + 176,128) x 5.125 = 3,547,648 in 8
    from cost_models.compute import (te_amax_reduced, te_cast_bytes, te_nvfp4, te_weight_cast_bytes, tp_blocks,
                                     tp_gather_bytes, tp_grad_gather_bytes)
    from cost_models.step_time import float8_amax_reductions

    fp4 = dict(seq_len=128, precision="fp4", framework="megatron", global_batch_size=4)
    plain = dict(fp4, nvfp4_disable_rht=True)
    job = make_job(LLAMA_TINY, gpus=1, cluster="dgx-b200", training=plain)
    assert te_nvfp4(job)
    assert te_cast_bytes(job, LayerKind()) == (824_064, 1_490_432, 6, 8)
    assert te_weight_cast_bytes(job, LayerKind()) == (3_547_648, 8)
    # the recipe's default Hadamard transform on inputs and gradients: one more 16-bit read and
    # kernel each (7.125 bytes in 3), and the norm-fed inputs cast whole after an unfused norm:
    # forward (3 x 32,768 + 88,064) x 7.125 = 1,327,872 in 12; backward 290,816 x 7.125 = 2,072,064
    # in 12; weights take no transform
    rht = make_job(LLAMA_TINY, gpus=1, cluster="dgx-b200", training=fp4)
    assert te_cast_bytes(rht, LayerKind()) == (1_327_872, 2_072_064, 12, 12)
    assert te_weight_cast_bytes(rht, LayerKind()) == (3_547_648, 8)
    # tp 2 with sequence parallelism: column inputs cast on the rank's 64 tokens and row outputs'
    # gradients likewise, then gathered quantised (no transposes). qkv 128x256·256x192, out
    # 128x128·128x256, fc1 128x256·256x688, fc2 128x344·344x256:
    # forward 2 x 16,384 x 3.125 + (16,384 + 44,032) x 5.125 = 102,400 + 309,632 = 412,032 in 6
    # backward (24,576 + 88,064) x 5.125 + 2 x 16,384 x 5.125 = 577,280 + 167,936 = 745,216 in 8
    tp2 = make_job(LLAMA_TINY, gpus=2, tp=2, sp=True, cluster="dgx-b200", training=plain)
    assert te_cast_bytes(tp2, LayerKind()) == (412_032, 745_216, 6, 8)
    assert te_weight_cast_bytes(tp2, LayerKind()) == (346_112 * 5.125, 8)
    # the gathers carry one usage of a column input (0.5625 bytes) and both of a gradient (1.125),
    # and the sequence-parallel quantizers reduce their amax over tp as current scaling does
    assert (tp_gather_bytes(tp2), tp_grad_gather_bytes(tp2)) == (0.5625, 1.125)
    assert te_amax_reduced(tp2)
    assert float8_amax_reductions(tp2, tp_blocks(tp2, LayerKind(), cal=DEFAULT)) == (2, 2)


def test_nvfp4_cast_pricing_reproduces_the_measured_autocast_overhead():
    # Transformer Engine's GEMM profiling on B300 (docs/examples/gemm_profiling/gemm_profiling.rst
    # @1609c890; shapes as in test_te_cast_pricing_reproduces_the_measured_autocast_overhead): NVFP4
    # autocast 6.453 ms per layer against 3.764 ms pre-quantized, 2.689 ms of quantisation. Each call
    # is a te.Linear forward under the default NVFP4BlockScaling (benchmarks/gemm/benchmark_gemm.py
    # L711-740 at d0067d0d) on an input that needs no gradient: the input cast into both usages with
    # the Hadamard transform (7.125 bytes, 3 kernels), the weight row-wise only (amax 2 + read 2 +
    # write 0.5625, 2 kernels; linear.py:237-247 asks column-wise usage only when the input needs a
    # gradient). Priced at B200's 8 TB/s (B300's too): 2.400 ms, -11%. Tolerance 20%, as for the
    # fp8 casts on the same table (its "pre-quantized" NVFP4 runs tex.generic_gemm, not te.Linear,
    # and stochastic rounding and 2D weight scaling are on in the benchmark).
    from cost_models import kernels as K
    from cost_models.compute import NVFP4_BYTES, nvfp4_cast

    m, h, f = 15872, 4096, 16384
    fprop = [(m, h, 3 * h), (m, h, h), (m, h, f), (m, f, h)]  # (rows, k, n)
    shapes = fprop + [(r, n, k) for r, k, n in fprop] + [(k, r, n) for r, k, n in fprop]
    inputs, weights = sum(r * k for r, k, _ in shapes), sum(k * n for _, k, n in shapes)
    gpu = presets.gpus()["B200"]
    job = make_job(LLAMA_TINY, gpus=1, cluster="dgx-b200", training=dict(precision="fp4"))
    per_input, input_kernels = nvfp4_cast(job)
    assert (per_input, input_kernels) == (7.125, 3)
    weight_bytes = 2 + 2 + NVFP4_BYTES
    priced = K.memory_seconds(per_input * inputs + weight_bytes * weights, gpu, launches=(input_kernels + 2) * len(shapes))
    assert priced == pytest.approx(6.453e-3 - 3.764e-3, rel=0.20)


def test_nvfp4_gemms_run_at_the_measured_b200_rate():
    # torchao's bench_matmul --recipe nvfp4 on B200 (pytorch/ao PR 2427): 6144^3 in 8.44e-05 s and
    # 8192^3 in 2.05e-04 s, the preset's two fp4 anchors; the ceiling is their geometric mean after
    # the tile, wave and epilogue factors, so each is reproduced to within their spread (8%).
    # GB200 has no fp4 timings: its ceiling is B200's scaled by the datasheet fp4 peaks (10,000 /
    # 9,000).
    from cost_models import kernels as K
    from cost_models.compute import NVFP4_BYTES
    from cost_models.enums import Precision

    gpus = presets.gpus()
    b200, gb200 = gpus["B200"], gpus["GB200"]
    for n, measured in ((6144, 8.44e-05), (8192, 2.05e-04)):
        t = K.gemm_seconds(n, n, n, 1, b200, Precision.FP4, operand_bytes=NVFP4_BYTES)
        assert t == pytest.approx(measured, rel=0.08), n
    assert K.tensor_core_ceiling(gb200, Precision.FP4) == pytest.approx(K.tensor_core_ceiling(b200, Precision.FP4) * 10 / 9)
    # fp4 about twice fp8 per second on the same GPU (datasheet 2x; measured ceilings 2.2x on GB200)
    assert 1.8 < K.tensor_core_ceiling(gb200, Precision.FP4) / K.tensor_core_ceiling(gb200, Precision.FP8) < 2.4


def test_torchtitan_float8_tp_casts_at_the_module_boundaries_on_shards():
    # LLAMA_TINY, 128 tokens, tp 2, sequence parallel, tensorwise: torchtitan's Float8ColwiseParallel,
    # Float8RowwiseParallel and PrepareFloat8ModuleInput. m = 128 gathered rows; 5 bytes a cast
    # element, 2 an fp8 transpose copy. Per GEMM (m x k)·(k x n), n and row k split over tp:
    #   qkv 128x256·256x192   fwd 5·128·256/2 + 5·256·192 = 81,920 + 245,760 = 327,680
    #                         bwd 7·128·192 + 2·128·256 + 245,760 = 172,032 + 65,536 + 245,760 = 483,328
    #   out 128x128·128x256   fwd 5·128·128 + 5·128·256 = 81,920 + 163,840 = 245,760
    #                         bwd 5·128·256/2 + 2·(128·256 + 128·128) + 163,840 = 81,920 + 98,304 + 163,840 = 344,064
    #   fc1 128x256·256x688   fwd 81,920 + 5·256·688 = 81,920 + 880,640 = 962,560
    #                         bwd 7·128·688 + 65,536 + 880,640 = 616,448 + 65,536 + 880,640 = 1,562,624
    #   fc2 128x344·344x256   fwd 5·128·344 + 5·344·256 = 220,160 + 440,320 = 660,480
    #                         bwd 81,920 + 2·(128·256 + 128·344) + 440,320 = 81,920 + 153,600 + 440,320 = 675,840
    # forward 2,196,480, backward 3,065,856
    from cost_models.compute import float8_tp, fp8_cast_bytes, tp_gather_bytes

    tt = dict(seq_len=128, precision="fp8", framework="torchtitan")
    job = make_job(LLAMA_TINY, gpus=2, tp=2, training=tt)
    assert job.sp and float8_tp(job) and tp_gather_bytes(job) == 1
    assert fp8_cast_bytes(job, LayerKind()) == (2_196_480, 3_065_856)
    # the same GEMMs cast inside each Float8Linear (plain TP) move more: forward 5·(mk + kn) summed
    # = 5·(32,768 + 49,152 + 16,384 + 32,768 + 32,768 + 176,128 + 44,032 + 88,064) = 2,360,320
    assert fp8_cast_bytes(job, LayerKind())[0] < 2_360_320
    # rowwise recipes keep plain TP: 16-bit gathers, casts inside the measured linear ratio
    rowwise = make_job(LLAMA_TINY, gpus=2, tp=2, training={**tt, "fp8_recipe": "rowwise"})
    assert not float8_tp(rowwise) and tp_gather_bytes(rowwise) == 2
    # one GPU: no tp plan, the Float8Linear casts of test_torchao_fp8_casts_move_five_bytes_per_operand_element
    assert not float8_tp(make_job(LLAMA_TINY, gpus=1, training=tt))


def test_rowwise_float8_at_tp8_prices_each_torchtitan_linear_from_the_measured_grid():
    # Llama 3.1 8B, tp 8, 8192 tokens: torchtitan's wq (N 512), wk and wv (N 128) all read the
    # grid's edge N = 1024 at M 8192, K 4096; w1 and w3 (N 14336/8 = 1792 each) the grid at their
    # own shape. The casts are inside the ratio.
    from cost_models import kernels as K
    from cost_models.compute import fp8_cast_bytes, layer_time, linear_modules, module_factor
    from cost_models.flops import layer_gemms

    tt = dict(seq_len=8192, precision="fp8", framework="torchtitan")
    rowwise = make_job("llama-3.1-8b", gpus=8, tp=8, training={**tt, "fp8_recipe": "rowwise"})
    gpu = rowwise.cluster.gpu
    g = {x.name: x for x in layer_gemms(rowwise, LayerKind())}
    qkv = linear_modules(rowwise, g["qkv"])
    assert [(x.name, x.n) for x in qkv] == [("wq", 512), ("wk", 128), ("wv", 128)]
    edge = K.rowwise_linear_ratio(gpu, 8192, 4096, 1024)
    assert [module_factor(rowwise, x) for x in qkv] == [edge] * 3
    w1, w3 = linear_modules(rowwise, g["mlp_fc1"])
    assert module_factor(rowwise, w1) == module_factor(rowwise, w3) == K.rowwise_linear_ratio(gpu, 8192, 4096, 1792)
    assert fp8_cast_bytes(rowwise, LayerKind()) == (0, 0)
    # at these shapes rowwise linears are slower than bf16 and tensorwise ones faster, the order
    # torchtitan measured at tp 8 (asyncTP_llama3_h100_2025-06: 3,708 / 4,378 / 5,078 tokens/s)
    def linears(job):
        lt = layer_time(job, LayerKind(), cal=DEFAULT)
        return lt.gemm + lt.gemm_backward + lt.fp8_cast + lt.fp8_cast_backward

    bf16 = make_job("llama-3.1-8b", gpus=8, tp=8, training={**tt, "precision": "bf16"})
    tensorwise = make_job("llama-3.1-8b", gpus=8, tp=8, training=tt)
    assert linears(tensorwise) < linears(bf16) < linears(rowwise)


def test_torchtitan_runs_q_k_v_as_three_gemms_and_the_narrow_ones_are_memory_bound():
    # torchtitan's Llama: wq, wk, wv and w1, w3 are modules of their own; Megatron fuses them, and
    # so does MPT's Wqkv (fused_projections). At tp 8 with 12 x 8192 tokens, wk is
    # (98304 x 4096)·(4096 x 128) on H100 SXM: it moves 2·(98304·4096 + 4096·128) + 2·98304·128 =
    # 831,520,768 B, at 0.90 x 3.35 TB/s 0.2758 ms, plus a 2.4 µs start: 0.2782 ms; its 1.031e11
    # FLOP would take 0.149 ms at 755 TFLOP/s x 0.919 (6 waves of 128x128 tiles 0.9697, K
    # 4096/(4096 + 225.4)). Reading the input again for k and v makes the three cost more than one.
    from cost_models.compute import gemm_seconds, linear_modules
    from cost_models.enums import Precision
    from cost_models.flops import layer_gemms

    tt = dict(seq_len=8192, framework="torchtitan")
    job = make_job("llama-3.1-8b", gpus=8, tp=8, mbs=12, training=tt)
    gpu = job.cluster.gpu
    qkv = next(x for x in layer_gemms(job, LayerKind()) if x.name == "qkv")
    wq, wk, wv = linear_modules(job, qkv)
    assert (wk.m, wk.n, wk.k) == (98304, 128, 4096)
    assert gemm_seconds(wk, gpu, Precision.BF16, DEFAULT) == pytest.approx(0.2782e-3, rel=2e-3)
    separate = sum(gemm_seconds(x, gpu, Precision.BF16, DEFAULT) for x in (wq, wk, wv))
    assert separate > 1.2 * gemm_seconds(qkv, gpu, Precision.BF16, DEFAULT)
    fused = make_job("llama-3.1-8b", gpus=8, tp=8, mbs=12, training={**tt, "fused_projections": True})
    assert linear_modules(fused, qkv) == (qkv,)
    assert linear_modules(make_job("llama-3.1-8b", gpus=8, tp=8, mbs=12), qkv) == (qkv,)  # Megatron


@pytest.mark.parametrize("recompute, precision", [("none", "bf16"), ("selective", "bf16"), ("full", "fp8")])
def test_hfu_is_mfu_plus_the_recomputed_work_and_never_below_it(recompute, precision):
    # HFU in MFU's convention: MFU x executed / (executed - recomputed). Full recompute repeats the
    # forward, a third of a layer's fwd+bwd FLOPs, so HFU/MFU ~ 4/3 on the layers (less with the
    # output layer and loss, which are not recomputed)
    job = make_job("llama-3.1-8b", gpus=8, recompute=recompute, training=dict(seq_len=8192, precision=precision))
    t = time_estimate(job)
    assert t.hfu >= t.mfu
    if recompute == "none":
        assert t.hfu == t.mfu
    if recompute == "full":
        assert 1.2 < t.hfu / t.mfu <= 4 / 3
        # fp8: MFU also against the fp8 peak, which is twice H100's dense 16-bit one
        assert t.mfu_fp8 == pytest.approx(t.mfu / 2, rel=1e-3)
    else:
        assert t.mfu_fp8 is None
    assert t.mfu_fp4 is None


def test_fp4_mfu_against_the_fp4_peak():
    # NVFP4 on GB200: MFU against the dense 16-bit peak (2,500 TFLOP/s) as for every precision, and
    # against the dense fp4 peak (10,000 TFLOP/s, presets/gpus.toml GB200), a quarter of it
    job = make_job("llama-3.1-8b", cluster="gb200-nvl72", gpus=8, training=dict(seq_len=8192, precision="fp4"))
    t = time_estimate(job)
    assert t.mfu_fp8 is None
    assert t.mfu_fp4 == pytest.approx(t.mfu / 4, rel=1e-9)


# --- FSDP2 under torch's pipelining ------------------------------------------------------------


def test_fsdp_under_torch_pipelining_gathers_once_per_microbatch_plus_one():
    # pp 4, 8 micro-batches (gbs 16, mbs 1, dp 2 on 8 GPUs). 1F1B rank 0 runs F0..F3 before B0:
    # those 4 forwards gather, F4..F7 follow a backward and find the parameters gathered; B0..B4
    # follow a forward and gather, B5..B7 follow a backward and do not: 4 + 5 = m + 1 = 9 per step.
    # Rank 3 (last) alternates from the start: F0 gathers, all 8 backwards gather.
    from cost_models.step_time import pipelined_gathers

    job = make_job(LLAMA_TINY, gpus=8, pp=4, training=dict(framework="torchtitan", global_batch_size=16))
    assert job.num_microbatches == 8
    assert pipelined_gathers(job, 0) == (4 / 8, 5 / 8)
    assert pipelined_gathers(job, 3) == (1 / 8, 8 / 8)
    # GPipe: every forward gathers (each reshards after), then the first backward only
    gpipe = make_job(LLAMA_TINY, gpus=8, pp=4, schedule="gpipe", training=dict(framework="torchtitan", global_batch_size=16))
    assert pipelined_gathers(gpipe, 2) == (1.0, 1 / 8)


def test_fsdp_reduce_scatter_under_torch_pipelining_waits_for_the_last_backward():
    # torch's pipelining turns gradient sync off for every micro-batch and reduce-scatters all the
    # stage's layers after the last backward: that reduce-scatter is exposed whole. torchtitan's
    # default under pp gathers once (all but one layer's gather hides); reshard_after_forward=True
    # (KempnerForge) gathers per micro-batch instead, so none of the end-of-step traffic is a gather.
    from cost_models.comm import Collective, collective_time
    from cost_models.step_time import _dense_group, dp_tail

    tt = dict(framework="torchtitan", global_batch_size=32)
    once = make_job("llama-3.1-8b", gpus=16, pp=2, training=tt)
    every = make_job("llama-3.1-8b", gpus=16, pp=2, training={**tt, "fsdp_reshard_after_forward": True})
    assert once.zero.name == "PARAMETERS" and once.dp == 8
    params = rank_params(once, 0)
    dense = float(params.total)
    rs = collective_time(Collective.REDUCE_SCATTER, dense * 4, _dense_group(once), once.cluster.spec)  # fp32 grads
    ag = collective_time(Collective.ALL_GATHER, dense * 2, _dense_group(once), once.cluster.spec)
    layers = len(once.stage_layer_ids(0))
    assert dp_tail(once, 0, DEFAULT) == pytest.approx((ag + rs, ag / layers + rs))
    assert dp_tail(every, 0, DEFAULT) == pytest.approx((rs, rs))
    # per micro-batch gathers add to the stage time, the end-of-step reduce-scatter does not repeat
    t_once, t_every = time_estimate(once), time_estimate(every)
    assert t_every.critical.microbatch.value("dp") > t_once.critical.microbatch.value("dp") == 0


def test_fsdp2_under_torch_pipelining_accumulates_unsharded_gradients_every_micro_batch():
    # LLAMA_TINY, torchtitan FSDP2, pp 2 dp 4 on 8 GPUs, gbs 16 at mbs 1: 4 micro-batches. Rank 0
    # holds 2 layers x 692,736 + the embedding 1000 x 256 = 1,641,472 parameters, 18 tensors (9 per
    # block). fp32 reduce dtype: the first micro-batch casts (2 + 4 bytes), the three later ones add
    # (4 + 2 + 4): 36 bytes per parameter a step, 9 per micro-batch, 18 kernels per micro-batch.
    # bf16 reduce dtype: autograd adds in place from the second on (2 + 2 + 2): 18 bytes a step,
    # 4.5 per micro-batch, 3 x 18 / 4 = 13.5 kernels.
    from cost_models import kernels as K
    from cost_models.step_time import pipelined_grad_accumulation_seconds

    tt = dict(framework="torchtitan", global_batch_size=16)
    job = make_job(LLAMA_TINY, gpus=8, pp=2, training=tt)
    assert job.num_microbatches == 4 and rank_params(job, 0).total == 1_641_472
    gpu = job.cluster.gpu
    assert pipelined_grad_accumulation_seconds(job, 0, DEFAULT) == pytest.approx(K.memory_seconds(1_641_472 * 9, gpu, launches=18))
    bf16 = make_job(LLAMA_TINY, gpus=8, pp=2, training={**tt, "fsdp_reduce_in_bf16": True})
    assert pipelined_grad_accumulation_seconds(bf16, 0, DEFAULT) == pytest.approx(K.memory_seconds(1_641_472 * 4.5, gpu, launches=13.5))
    # without a pipeline FSDP reduce-scatters every micro-batch: nothing accumulates unsharded
    flat = make_job(LLAMA_TINY, gpus=8, training=dict(framework="torchtitan", global_batch_size=64))
    assert flat.num_microbatches > 1 and pipelined_grad_accumulation_seconds(flat, 0, DEFAULT) == 0
    # and it is part of the stage's elementwise work
    t = time_estimate(job)
    assert t.stages[0].microbatch.value("compute/elementwise") > time_estimate(bf16).stages[0].microbatch.value("compute/elementwise")


def test_the_pipeline_fill_waits_for_every_later_stages_first_layer_gather():
    # torchtitan's default under pp keeps each stage gathered through the step and gathers it again
    # in its first forward, whose first layer's gather waits for the stage's input. pp 2: rank 1
    # (layers 2 and 3, 692,736 parameters each, the final norm 256 and the 1000 x 256 output layer)
    # gathers its 1,641,728 16-bit parameters over dp 4; one layer's share of it (1/2) is exposed on top of
    # rank 0's, the other half slows rank 1's first forward by the dp share s: s / (1 - s) of it.
    # With reshard_after_forward=True every micro-batch gathers (stage time) instead.
    from cost_models.comm import Collective, collective_time
    from cost_models.step_time import _dense_group, dense_share

    tt = dict(framework="torchtitan", global_batch_size=16)
    job = make_job(LLAMA_TINY, gpus=8, pp=2, training=tt)
    assert rank_params(job, 1).total == 1_641_728 and len(job.stage_layer_ids(1)) == 2
    gather = collective_time(Collective.ALL_GATHER, 1_641_728 * 2, _dense_group(job), job.cluster.spec)
    share = dense_share(job, DEFAULT)
    t = time_estimate(job)
    assert t.fill_gathers == pytest.approx((gather / 2, gather / 2 * share / (1 - share)))
    every = make_job(LLAMA_TINY, gpus=8, pp=2, training={**tt, "fsdp_reshard_after_forward": True})
    assert time_estimate(every).fill_gathers == (0.0, 0.0)


def test_fsdp2_copies_under_torch_pipelining_follow_its_gathers_and_one_reduce_per_step():
    # reshard_after_forward=True under pp 2, 4 micro-batches: m + 1 = 5 gathers a step (1.25 per
    # micro-batch, either rank), each copied in from the fp32 shard of a group of 4 ((4 + 2 + 2 + 2) / 4
    # bytes, 2 kernels) and copied out (2 + 2 bytes, 1 kernel); one reduce-scatter a step copies the
    # fp32 accumulated gradient in (4 + 4), 2 bytes per micro-batch: 1.25 x 6.5 + 2 = 10.125 bytes per
    # parameter and 1.25 x 3 + 0.25 = 4 kernels per micro-batch.
    from cost_models import kernels as K
    from cost_models.step_time import fsdp_copy_seconds

    job = make_job(LLAMA_TINY, gpus=8, pp=2, training=dict(framework="torchtitan", global_batch_size=16,
                                                            fsdp_reshard_after_forward=True))
    expected = K.memory_seconds(692_736 * 10.125, job.cluster.gpu, launches=4)
    assert fsdp_copy_seconds(job, 0, DEFAULT, 0) == pytest.approx(expected)
    assert fsdp_copy_seconds(job, 3, DEFAULT, 1) == pytest.approx(expected)


# --- Megatron's gradient path without fusion or overlap -------------------------------------------


def test_unfused_gradient_accumulation_adds_a_ten_byte_pass_per_parameter_and_microbatch():
    # --no-gradient-accumulation-fusion: main_grad.add_(param.grad) per parameter per micro-batch,
    # bf16 grad read (2) + fp32 main grad read and write (4 + 4) = 10 bytes. LLAMA_TINY at tp 1 on
    # one GPU: 4 layers x (qkv 256x384 98,304 + out 256x256 65,536 + fc1 256x1376 352,256 + fc2
    # 688x256 176,128 + 2 norms 512) = 4 x 692,736 = 2,770,944; embedding and head over the vocabulary
    # padded to 1024 (Megatron's default --make-vocab-size-divisible-by, a multiple of 128) 262,144 each;
    # final norm 256: 3,295,488 parameters -> 32,954,880 bytes per micro-batch.
    from cost_models import kernels as K
    from cost_models.step_time import unfused_grad_accumulation_seconds

    fused = make_job(LLAMA_TINY, gpus=1, training=dict(seq_len=128, vocab_divisible_by=128))
    unfused = make_job(LLAMA_TINY, gpus=1, training=dict(seq_len=128, grad_accumulation_fusion=False, vocab_divisible_by=128))
    assert int(rank_params(unfused, 0).total) == 3_295_488
    expected = K.memory_seconds(32_954_880, unfused.cluster.gpu)
    assert unfused_grad_accumulation_seconds(unfused, 0, DEFAULT) == pytest.approx(expected)
    assert unfused_grad_accumulation_seconds(fused, 0, DEFAULT) == 0
    # a memory-bound kernel like the layers' own: validate --calibrate's memory_scale for the GPU's
    # architecture divides it (a GPU measured at 80% of the tabulated bandwidth takes 1/0.8 as long)
    slow = DEFAULT.with_values(**{f"memory_scale__{unfused.cluster.gpu.architecture}": 0.8})
    assert unfused_grad_accumulation_seconds(unfused, 0, slow) == pytest.approx(expected / 0.8)
    gap = time_estimate(unfused).breakdown.value("compute/elementwise") - time_estimate(fused).breakdown.value("compute/elementwise")
    # the fused path adds the word embedding's dense gradient (262,144) to the main grad too
    # (embedding_grad_seconds): the gap is the other 3,033,344 parameters' 30,333,440 bytes
    assert gap == pytest.approx(K.memory_seconds(30_333_440, unfused.cluster.gpu) * unfused.num_microbatches)


def test_megatron_embedding_gradient_is_a_dense_table_zeroed_and_added_to_the_main_grad_per_microbatch():
    # F.embedding's backward zeroes a dense vocab x h gradient (16-bit write, 2 bytes) and, with
    # gradient accumulation fusion, DDP's hook adds it to the main grad (read 2 + main grad read and
    # write 2 x 4 in bf16, 2 x 2 in fp16). GPT_TINY on one GPU: word table over the vocabulary padded
    # to 1024 (Megatron's default --make-vocab-size-divisible-by 128; 256 x 1024 = 262,144) + learned
    # positions 1024 x 256 = 262,144: 524,288 elements.
    from cost_models import kernels as K
    from cost_models.step_time import embedding_grad_seconds

    bf16 = make_job(GPT_TINY, gpus=1, training=dict(seq_len=128, vocab_divisible_by=128))
    gpu = bf16.cluster.gpu
    assert embedding_grad_seconds(bf16, 0, DEFAULT) == pytest.approx(K.memory_seconds(524_288 * 12, gpu))
    fp16 = make_job(GPT_TINY, gpus=1, training=dict(seq_len=128, precision="fp16", vocab_divisible_by=128))
    assert embedding_grad_seconds(fp16, 0, DEFAULT) == pytest.approx(K.memory_seconds(524_288 * 8, gpu))
    # without the fusion the add is unfused_grad_accumulation_seconds' (every parameter): the zeroing only
    unfused = make_job(GPT_TINY, gpus=1, training=dict(seq_len=128, vocab_divisible_by=128, grad_accumulation_fusion=False))
    assert embedding_grad_seconds(unfused, 0, DEFAULT) == pytest.approx(K.memory_seconds(524_288 * 2, gpu))
    # tp 2 halves the word table only (256 x 512 + 262,144 = 393,216); LLaMA's rotary adds no table
    tp2 = make_job(GPT_TINY, gpus=2, tp=2, training=dict(seq_len=128, vocab_divisible_by=128))
    assert embedding_grad_seconds(tp2, 0, DEFAULT) == pytest.approx(K.memory_seconds(393_216 * 12, gpu))
    llama = make_job(LLAMA_TINY, gpus=1, training=dict(seq_len=128, vocab_divisible_by=128))
    assert embedding_grad_seconds(llama, 0, DEFAULT) == pytest.approx(K.memory_seconds(262_144 * 12, gpu))
    # a LayerNorm after the embedding (states.embedding_params_local) adds its weight and bias, 2 x 256
    normed = make_job(GPT_TINY.model_copy(update=dict(embedding_norm=True)), gpus=1, training=dict(seq_len=128, vocab_divisible_by=128))
    assert embedding_grad_seconds(normed, 0, DEFAULT) == pytest.approx(K.memory_seconds(524_800 * 12, gpu))
    # only the first pipeline rank holds the embeddings; other frameworks are not priced here
    pp2 = make_job(GPT_TINY, gpus=2, pp=2, training=dict(seq_len=128, vocab_divisible_by=128))
    assert embedding_grad_seconds(pp2, 1, DEFAULT) == 0 < embedding_grad_seconds(pp2, 0, DEFAULT)
    titan = make_job(GPT_TINY, gpus=1, training=dict(seq_len=128, framework="torchtitan"))
    assert embedding_grad_seconds(titan, 0, DEFAULT) == 0
    # in the first stage's elementwise compute once per micro-batch (the two stages' layers are alike)
    s0, s1 = (s.microbatch.value("compute/elementwise") for s in time_estimate(pp2).stages)
    assert s0 - s1 == pytest.approx(embedding_grad_seconds(pp2, 0, DEFAULT))


def test_megatron_wgrad_gemms_accumulate_into_the_main_grad_in_their_epilogue():
    # gradient accumulation fusion: the wgrad GEMM adds into the main grad (beta = 1), reading and
    # writing it: fp32 main grads for bf16 (4 + 4 bytes), fp16 ones for fp16 (2 + 2); torchtitan and
    # --no-gradient-accumulation-fusion write a fresh bf16 gradient (2). Only the wgrad GEMMs change:
    # LLAMA_TINY's qkv at 128 tokens on one H100, dW = (256 x 128)·(128 x 384)
    from cost_models import kernels as K
    from cost_models.compute import head_backward_time, main_grad_bytes, weight_backward_seconds, wgrad_out_bytes
    from cost_models.enums import Precision
    from cost_models.flops import Gemm

    cases = {
        "bf16": (dict(seq_len=128), 8),
        "fp16": (dict(seq_len=128, precision="fp16"), 4),
        "unfused": (dict(seq_len=128, grad_accumulation_fusion=False), 2),
        "torchtitan": (dict(seq_len=128, framework="torchtitan"), 2),
    }
    qkv = Gemm("qkv", 128, 384, 256)
    for name, (training, out_bytes) in cases.items():
        job = make_job(LLAMA_TINY, gpus=1, training=training)
        assert wgrad_out_bytes(job) == out_bytes, name
        prec = Precision.FP16 if name == "fp16" else Precision.BF16
        dgrad, wgrad = weight_backward_seconds(job, qkv, prec, DEFAULT)
        assert dgrad == pytest.approx(K.gemm_seconds(128, 256, 384, 1, job.cluster.gpu, prec, operand_bytes=2)), name
        assert wgrad == pytest.approx(K.gemm_seconds(256, 384, 128, 1, job.cluster.gpu, prec, operand_bytes=2,
                                                     out_bytes=out_bytes)), name
    bf16 = make_job(LLAMA_TINY, gpus=1, training=dict(seq_len=128))
    assert main_grad_bytes(bf16) == 4
    # the output layer (ColumnParallelLinear) accumulates the same way: its backward is slower fused
    unfused = make_job(LLAMA_TINY, gpus=1, training=dict(seq_len=128, grad_accumulation_fusion=False))
    assert head_backward_time(bf16, DEFAULT) > head_backward_time(unfused, DEFAULT)


def test_megatron_without_overlap_grad_reduce_exposes_the_whole_reduction():
    # Megatron's --overlap-grad-reduce and --overlap-param-gather default off: the distributed
    # optimizer's reduce-scatter and gather run after the backward and the optimizer step, one bucket
    # (training.py resolve_ddp_bucket_size: None without overlap), and the step gathers it
    # (distrib_optimizer.py step_with_ready_grads); overlapped, the buckets of max(40M, 1M x dp 16) =
    # 40M parameters each reduce on their own and only the first forward bucket, the 128256 x 4096
    # embedding's (a bucket by itself: the layer-0 tensors before it already filled one), gathers in
    # front of the forward
    from cost_models.comm import Collective, collective_time
    from cost_models.states import dense_params
    from cost_models.step_time import _dense_group, dp_tail, megatron_buckets

    base = dict(global_batch_size=64)
    on = make_job("llama-3.1-8b", gpus=16, zero=1, training=base)
    off = make_job("llama-3.1-8b", gpus=16, zero=1, training={**base, "overlap_grad_reduce": False})
    total_on, first_on = dp_tail(on, 0, DEFAULT)
    total_off, first_off = dp_tail(off, 0, DEFAULT)
    assert first_on < total_on
    assert first_off == pytest.approx(total_off)
    params = dense_params(rank_params(off, 0))
    assert params == 8_030_261_248  # Llama 3.1 8B, untied 128256 x 4096 embedding and output layer
    assert megatron_buckets(off, 0) == ((params,),)
    buckets = megatron_buckets(on, 0)[0]
    embedding = 128256 * 4096
    assert buckets[-1] == embedding and len(buckets) == 98  # output layer, last norm + fc2, 3 per layer, embedding
    where, cl = _dense_group(off), off.cluster.spec

    def rs(n):
        return collective_time(Collective.REDUCE_SCATTER, n * 4, where, cl)  # fp32 main grads (--bf16)

    def ag(n):
        return collective_time(Collective.ALL_GATHER, n * 2, where, cl)  # bf16 weights

    assert total_on == pytest.approx(sum(rs(b) for b in buckets) + ag(embedding))
    assert first_on == pytest.approx(rs(embedding) + ag(embedding))
    assert total_off == pytest.approx(rs(params) + ag(params))
    assert ag(params) > 10 * ag(embedding)  # 16 GB against 1.05 GB
    assert time_estimate(off).breakdown.value("dp") == pytest.approx(total_off)


def test_nanotron_zero1_all_reduces_fp32_gradients_and_gathers_parameters_exposed():
    # nanotron's ZeRO-1 (zero1_blocking_sync): the whole fp32 gradient buffer all-reduced after the
    # backward, then the bf16 parameters all-gathered after the optimizer, nothing overlapped.
    # llama-3.1-8b, tp8 x dp2 on 2 DGX H100 nodes: P = 1,004,802,048 parameters per rank; the dp pair
    # sits in different nodes (stride 8), one 400 Gb/s NIC each at 0.94 -> 47 GB/s bus bandwidth.
    # All-reduce: 2(n-1)/n · 4P = 4.02 GB moved -> 85.5 ms; all-gather: (n-1)/n · 2P = 1.00 GB -> 21.4 ms;
    # 106.9 ms at the plateau. Messages of 2-4 GB reach 0.93-1.0 of it (comm.size_share), hence the range.
    from cost_models.step_time import dp_tail

    base = dict(global_batch_size=2, vocab_divisible_by=128)  # Megatron's default padding: 129,024 rows
    nanotron = make_job("llama-3.1-8b", gpus=16, tp=8, zero=1, training={**base, "zero1_blocking_sync": True})
    megatron = make_job("llama-3.1-8b", gpus=16, tp=8, zero=1, training=base)
    p = 1_004_802_048
    assert rank_params(nanotron, 0).total == p
    plateau = (2 * 1 / 2 * 4 * p + 1 / 2 * 2 * p) / (400e9 / 8 * 0.94)
    total, exposed = dp_tail(nanotron, 0, DEFAULT)
    assert total == exposed
    assert plateau <= total <= plateau / 0.93
    assert time_estimate(nanotron).breakdown.value("dp") == pytest.approx(total)
    # Megatron's distributed optimizer reduce-scatters (half the all-reduce's bytes) behind the backward
    # and gathers all but the first bucket beside the next forward; this one micro-batch's forward is
    # shorter than that gather, so the rest of it is exposed too, still well under nanotron's. The
    # forward's length depends on the SM contention the gather causes: priced at its sourced prior
    # (MECHANISMS), not at the end-to-end fit
    prior = DEFAULT.with_values(contention_scale=MECHANISMS["contention_scale"].value)
    est = time_estimate(megatron, calibration=prior)
    (stage,) = est.stages
    assert dp_tail(megatron, 0, prior)[0] < total / 2 and stage.gather_exposed_s > 0
    assert est.breakdown.value("dp") == pytest.approx(stage.dp_exposed_s + stage.gather_exposed_s)
    assert est.breakdown.value("dp") < total / 4  # the embedding's 71M-parameter bucket in front of the forward


def test_nanotron_zero1_gather_copies_one_slice_per_parameter_tensor_and_dp_rank():
    # nanotron's Llama keeps a decoder layer in 6 tensors; LLAMA_TINY's 4 layers over pp 2: rank 0 has
    # 2 layers and the embedding (13 tensors), rank 1 2 layers, the final norm and the output layer (14).
    # Tied on one rank, the output layer is the embedding's tensor: 6·4 + 1 + 2 − 1 = 26.
    from cost_models.step_time import nanotron_param_tensors, zero1_blocking_sync_seconds, zero1_gather_copy_seconds

    job = make_job(LLAMA_TINY, gpus=4, pp=2, zero=1, training=dict(global_batch_size=16, zero1_blocking_sync=True,
                                                                    vocab_divisible_by=128))  # 1000 rows -> 1024
    assert job.dp == 2 and [nanotron_param_tensors(job, r) for r in range(2)] == [13, 14]
    tied = make_job(LLAMA_TINY.model_copy(update=dict(tie_embeddings=True)), gpus=2, zero=1,
                    training=dict(global_batch_size=2, zero1_blocking_sync=True))
    assert nanotron_param_tensors(tied, 0) == 26
    # rank 0: 1,647,616 parameters; 13 copies per dp rank plus a flatten and torch's copy-out per dp
    # rank = 30 device operations at H100's 2.4 us launch cost (presets/kernels/hopper.toml) = 72 us,
    # and three passes reading and writing the bf16 parameters, 12 bytes each, at 0.90 of 3.35 TB/s = 6.6 us
    p = rank_params(job, 0).total
    assert p == 1_647_616
    copies = zero1_gather_copy_seconds(job, 0, p, DEFAULT)
    assert copies == pytest.approx(30 * 2.4e-6 + 12 * p / (0.90 * 3.35e12))
    # memory-bound kernels like the layers': a GPU measured at half the tabulated bandwidth takes twice as long
    slow = DEFAULT.with_values(**{f"memory_scale__{job.cluster.gpu.architecture}": 0.5})
    assert zero1_gather_copy_seconds(job, 0, p, slow) == pytest.approx(2 * copies)
    from cost_models.step_time import _dense_group, dp_tail
    assert dp_tail(job, 0, DEFAULT)[0] == pytest.approx(zero1_blocking_sync_seconds(p, _dense_group(job), job.cluster.spec) + copies)


def test_nanotron_ddp_all_reduces_fp32_buckets_of_25_mib_of_bf16_gradients():
    # nanotron at ZeRO-0 under torch DDP (ddp_buckets): a bucket holds 25 MiB of bf16 gradients,
    # 13,107,200 parameters, and its fp32 accumulation buffer (4 bytes each) is all-reduced on its own.
    # llama-3.1-8b tp8 x dp2 on 2 nodes, rank 0: decoder layers 872,677,376 = 66 full buckets + 7,602,176;
    # the output layer (66,064,384) and the embedding (66,060,288) are buckets of their own, the
    # embedding's last. One 400 Gb/s NIC per rank at 0.94 = 47 GB/s; an all-reduce over 2 ranks moves
    # its buffer once, each message at the share of the plateau its size reaches (comm.size_share).
    from cost_models.comm import size_share
    from cost_models.step_time import dp_tail

    nanotron = make_job("llama-3.1-8b", gpus=16, tp=8, training=dict(global_batch_size=2, ddp_buckets=True,
                                                                      grad_accumulation_fusion=False,
                                                                      vocab_divisible_by=128))  # 129,024 rows
    p = rank_params(nanotron, 0)
    assert (p.value("layers"), p.value("head"), p.value("embedding")) == (872_677_376, 66_064_384, 66_060_288)

    def ar(params):
        return 4 * params / 47e9 / size_share(4 * params, 2)

    total, tail = dp_tail(nanotron, 0, DEFAULT)
    assert tail == pytest.approx(ar(66_060_288))  # 6.5 ms
    assert total == pytest.approx(66 * ar(13_107_200) + ar(7_602_176) + ar(66_064_384) + ar(66_060_288))  # 130 ms
    # Megatron's DDP all-reduces its own buckets of max(40M, 1M x dp) parameters, walking the tensors
    # backwards (a layer: fc2 7,340,032, fc1 14,680,064, its norm 4,096, qkv 3,145,728, its norm 4,096,
    # proj 2,097,152 = 27,271,168): the output layer's 66,060,288 alone, the final norm + layer 31 +
    # layer 30's fc2 and fc1 (49,295,360), then two layers' worth (54,542,336) 15 times, then layer 0's
    # attention tensors with the embedding (5,251,072 + 66,060,288); one all-reduce of the whole 4 GB
    # buffer would reach 0.98 of the plateau (87 ms), these smaller messages less of it
    from cost_models.step_time import megatron_buckets

    megatron = make_job("llama-3.1-8b", gpus=16, tp=8, training=dict(global_batch_size=2, vocab_divisible_by=128))
    buckets = (66_060_288, 49_295_360, *[54_542_336] * 15, 71_311_360)
    assert megatron_buckets(megatron, 0) == (buckets,) and sum(buckets) == p.total
    assert dp_tail(megatron, 0, DEFAULT) == pytest.approx((sum(ar(b) for b in buckets), ar(71_311_360)))
    assert dp_tail(megatron, 0, DEFAULT)[0] > ar(p.total)


def test_a_dtensor_plan_with_one_colwise_module_per_projection_gathers_per_projection():
    # KempnerForge shards q, k, v, gate and up as separate ColwiseParallel modules: in forward the
    # sequence-sharded input is gathered 3 times before attention and 2 times before the SwiGLU MLP
    # (torchtitan: once each), so 3 more all-gathers of the t x h input per layer; in backward 3 more
    # reduce-scatters of its gradient. Without sequence parallelism the backward all-reduces the
    # column input's gradient per projection instead, and the forward is unchanged.
    from cost_models.comm import Collective
    from cost_models.compute import tp_blocks, tokens
    from cost_models.step_time import _tp_coll, tp_exposure

    tt = dict(seq_len=512, framework="torchtitan")
    once = make_job(LLAMA_TINY, gpus=2, tp=2, training=tt)
    each = make_job(LLAMA_TINY, gpus=2, tp=2, training={**tt, "tp_gather_per_projection": True})
    assert once.sp and each.sp
    size = tokens(once) * LLAMA_TINY.hidden_size * 2
    ag, rs = _tp_coll(once, Collective.ALL_GATHER, size), _tp_coll(once, Collective.REDUCE_SCATTER, size)
    blocks = tp_blocks(once, LayerKind(), cal=DEFAULT)

    def exposed(job, backward):
        return tp_exposure(job, blocks, backward=backward, cal=DEFAULT).exposed

    assert exposed(each, False) - exposed(once, False) == pytest.approx(3 * ag)
    assert exposed(each, True) - exposed(once, True) == pytest.approx(3 * rs)
    # no sequence parallelism: forward all-reduces after the row GEMMs only, backward per projection
    no_sp = make_job(LLAMA_TINY, gpus=2, tp=2, sp=False, training={**tt, "tp_gather_per_projection": True})
    ar = _tp_coll(no_sp, Collective.ALL_REDUCE, size)
    assert exposed(no_sp, False) == pytest.approx(2 * ar)
    assert exposed(no_sp, True) == pytest.approx((3 + 2) * ar)


def test_validates_kernel_split_counts_the_unfused_gradient_accumulation():
    # compute_by_kernel recounts the critical stage apart from stage_time: the main_grad add pass is
    # a memory-bound kernel, so both totals still agree without gradient accumulation fusion
    from cost_models.step_time import compute_by_kernel

    job = make_job(LLAMA_TINY, gpus=1, training=dict(seq_len=128, grad_accumulation_fusion=False))
    est = time_estimate(job)
    assert float(compute_by_kernel(est).total) == pytest.approx(float(est.breakdown.value("compute")))


def test_fsdp2_copies_are_priced_by_their_bytes_and_follow_memory_scale():
    # torchtitan FSDP2 around one LLAMA_TINY layer (692,736 parameters, as above, unsharded on the
    # GPU), shard group 8: two all-gathers, each copying in its fp32 shard (cast to bf16, 4 + 2 bytes,
    # then into the all-gather input, 2 + 2: 10/8 bytes per parameter, 2 kernels) and copying out
    # (read 2 + write 2, 1 kernel), and the gradient copy into the fp32 reduce-scatter input (read 2 +
    # write 4, 1 kernel): 2 x 5.25 + 6 = 16.5 bytes per parameter, 7 kernels.
    from cost_models import kernels as K
    from cost_models.step_time import fsdp_copy_seconds

    job = make_job(LLAMA_TINY, gpus=8, zero=3, training=dict(seq_len=128, framework="torchtitan"))
    expected = K.memory_seconds(692_736 * 16.5, job.cluster.gpu, launches=7)
    assert fsdp_copy_seconds(job, 0, DEFAULT) == pytest.approx(expected)
    # memory_scale divides the whole kernel time, launches included, as for the layers' (compute.memory_seconds)
    slow = DEFAULT.with_values(**{f"memory_scale__{job.cluster.gpu.architecture}": 0.5})
    assert fsdp_copy_seconds(job, 0, slow) == pytest.approx(2 * expected)
    assert fsdp_copy_seconds(make_job(LLAMA_TINY, gpus=8, zero=1, training=dict(seq_len=128)), 0, DEFAULT) == 0


def test_fsdp2_copies_run_on_a_shard_group_of_one():
    # FSDP2 on one rank (a one-rank share under validate: the H200 traces of benchmarks/data/measured
    # show its copies every step) copies the whole fp32 parameter in: 2 x (10 + 4) + 6 = 34 bytes per
    # parameter, 7 kernels; they are the compute breakdown's sharding part, layer by layer, with no
    # collective priced beside them.
    from cost_models import kernels as K
    from cost_models.step_time import fsdp_copy_seconds

    job = make_job(LLAMA_TINY, gpus=1, zero=3, training=dict(seq_len=128, framework="torchtitan"))
    one_layer = K.memory_seconds(692_736 * 34, job.cluster.gpu, launches=7)
    assert fsdp_copy_seconds(job, 0, DEFAULT) == pytest.approx(one_layer)
    # every layer of LLAMA_TINY is the same 692,736 parameters, copied once per micro-batch
    est = time_estimate(job)
    assert float(est.breakdown.value("compute/sharding")) == pytest.approx(
        job.model.num_layers * job.num_microbatches * one_layer)
    assert float(est.breakdown.value("dp")) == 0


def test_fsdp2_copy_in_reads_each_shard_of_its_own_group():
    # Mixtral-8x7B under torchtitan on 16 GPUs, ep 8, zero 3: dense parameters sharded over all 16
    # ranks, the experts over the 2 expert-data-parallel ranks. Per layer and micro-batch two gathers,
    # each copying in 10 bytes per shard element (10/16 per dense parameter, 10/2 per expert one) and
    # copying out 2 + 2 per parameter, and one gradient copy-in of 2 + 4: 7 kernels.
    from cost_models import kernels as K
    from cost_models.states import local_layer_params
    from cost_models.step_time import fsdp_copy_seconds

    job = make_job(presets.models()["mixtral-8x7b"], gpus=16, ep=8, zero=3,
                   training=dict(seq_len=4096, framework="torchtitan"))
    assert (job.dense_shard_group, job.expert_shard_group) == (16, 2)
    p = local_layer_params(job, 0)
    d, e = p.dense, p.expert
    moved = (d + e) * (2 * 4 + 6) + 2 * 10 * (d / 16 + e / 2)
    assert fsdp_copy_seconds(job, 0, DEFAULT) == pytest.approx(K.memory_seconds(moved, job.cluster.gpu, launches=7))


def test_fsdp2_zero2_gathers_every_micro_batch_once_and_reduces_every_micro_batch():
    # zero 2 under FSDP2 (reshard_after_forward=False): each micro-batch gathers a layer before its
    # forward only, the backward reshards it and reduce-scatters its gradients. One copy-in from the
    # shard of 8 (10/8 bytes, 2 kernels), one copy-out (2 + 2 bytes) and the gradient copy (2 + 4):
    # 11.25 bytes per parameter, 4 kernels, where zero 3 pays 16.5.
    from cost_models import kernels as K
    from cost_models.step_time import fsdp_copy_seconds, fsdp_gathers, fsdp_per_microbatch

    def job(zero: int, mbs: int = 1):
        return make_job(LLAMA_TINY, gpus=8, zero=zero, mbs=mbs,
                        training=dict(seq_len=128, global_batch_size=32, framework="torchtitan"))

    two = job(2)
    assert fsdp_per_microbatch(two) and fsdp_gathers(two) == (1.0, 0.0) and fsdp_gathers(job(3)) == (1.0, 1.0)
    assert fsdp_copy_seconds(two, 0, DEFAULT) == pytest.approx(K.memory_seconds(692_736 * 11.25, two.cluster.gpu, launches=4))
    # its collectives run once per micro-batch: with the same tokens in 4x the micro-batches the
    # data-parallel time grows (the per-micro-batch gathers and reduce-scatters of 4 micro-batches
    # against 1, less what hides behind 4x smaller passes); a once-per-step tail would not
    one, four = time_estimate(job(2, mbs=4)), time_estimate(job(2, mbs=1))  # 1 and 4 micro-batches per step
    assert four.job.num_microbatches == 4 * one.job.num_microbatches
    dp = lambda e: float(e.breakdown.value("dp")) + float(e.breakdown.value("compute/contention"))  # noqa: E731
    assert dp(four) > 2 * dp(one)
    # and it never costs more than zero 3, which also gathers before every backward
    assert time_estimate(two).step_s < time_estimate(job(3)).step_s


def test_megatron_buckets_follow_ddp_bucket_size_tensor_by_tensor():
    # GPT_TINY (LayerNorm, biases everywhere, tied embedding, h 256, ffn 1024, vocab 1000 -> 1024),
    # tp1: a Transformer Engine layer registers linear_proj (65,536 + bias 256), linear_qkv's norm
    # (256 + 256) and weight (768 x 256 = 196,608 + bias 768), linear_fc1's norm (256 + 256) and weight
    # (1024 x 256 = 262,144 + bias 1,024), linear_fc2 (262,144 + bias 256): 12 tensors, 789,760
    # parameters. --ddp-bucket-size 1 closes a bucket at every tensor: 2 (final norm) + 4 x 12 + 2
    # (position and word embeddings, 1024 x 256 each) = 52 buckets, the backward's first the final
    # norm's bias, its last the word embedding.
    from cost_models.step_time import megatron_buckets, megatron_layer_tensors
    from tests.helpers import GPT_TINY

    job = make_job(GPT_TINY, gpus=2, zero=1, training=dict(seq_len=512, global_batch_size=8, ddp_bucket_size=1,
                                                           vocab_divisible_by=128))  # Megatron's default padding
    layer = (65_536, 256, 256, 256, 196_608, 768, 256, 256, 262_144, 1_024, 262_144, 256)
    assert megatron_layer_tensors(job, 0) == layer and sum(layer) == 789_760
    (buckets,) = megatron_buckets(job, 0)
    assert buckets == (256, 256, *tuple(reversed(layer)) * 4, 262_144, 262_144)
    # buckets of 800,000: the final norm (512) and layer 3 (789,760) stay under it until layer 2's
    # fc2 weight closes the first (512 + 789,760 + 256 + 262,144 = 1,052,672); layer 2's rest
    # (527,360) with layer 1's fc2 and fc1 closes the second at 1,052,928; layer 1's rest (264,192)
    # with layer 0 up to its qkv weight the third at 987,648; layer 0's qkv norm and linear_proj
    # (66,304) and both embeddings (524,288) are the last, 590,592
    big = make_job(GPT_TINY, gpus=2, zero=1, training=dict(seq_len=512, global_batch_size=8, ddp_bucket_size=800_000, vocab_divisible_by=128))
    assert megatron_buckets(big, 0) == ((1_052_672, 1_052_928, 987_648, 590_592),)


def test_per_parameter_buckets_pay_nccl_latency_per_tensor():
    # Cisco's MLPerf llama31_8b leaves NeMo's bucket_size at 64 elements (custom.yaml:157): every
    # parameter tensor is its own bucket, 32 x 6 + 3 = 195 reduce-scatters and gathers per step on
    # Llama 3.1 8B tp1, 65 of them RMSNorm weights of 4,096 elements, each costing NCCL's latency
    # floor as a 1-element collective would
    from cost_models.comm import Collective, collective_time
    from cost_models.step_time import _dense_group, dp_tail, megatron_buckets

    base = dict(global_batch_size=64, grad_reduce_in_bf16=True)
    per_tensor = make_job("llama-3.1-8b", gpus=16, zero=1, training={**base, "ddp_bucket_size": 64})
    default = make_job("llama-3.1-8b", gpus=16, zero=1, training=base)
    (buckets,) = megatron_buckets(per_tensor, 0)
    assert len(buckets) == 195 and buckets.count(4096) == 65
    where, cl = _dense_group(per_tensor), per_tensor.cluster.spec
    norm = collective_time(Collective.REDUCE_SCATTER, 4096 * 2, where, cl)
    # latency, not bytes: a 256 times larger message (1M elements) costs not even three times as much
    assert collective_time(Collective.REDUCE_SCATTER, 2**20 * 2, where, cl) < 3 * norm
    # the 65 norms alone add 65 such collectives to the reduce-scatters the default's 98 buckets pay
    total, tail = dp_tail(per_tensor, 0, DEFAULT)
    assert total - dp_tail(default, 0, DEFAULT)[0] > 65 * norm
    assert tail == dp_tail(default, 0, DEFAULT)[1]  # the embedding's bucket is the last either way


def test_megatron_buckets_off_past_the_first_pipeline_rank_and_chunk():
    # Megatron turns bucketing off on pipeline ranks above 0 and on model chunks after the first
    # (distributed_data_parallel.py:160-171, training.py:2505-2514): one bucket per chunk, whose
    # reduction starts only when the chunk's backward has ended
    from cost_models.states import dense_params
    from cost_models.step_time import megatron_bucket_size, megatron_buckets

    job = make_job("llama-3.1-8b", gpus=16, pp=2, vpp=2, zero=1, training=dict(global_batch_size=64))
    assert megatron_bucket_size(job) == 40_000_000  # max(40M, 1M x dp 8)
    first, later = megatron_buckets(job, 0)
    assert len(first) > 1 and len(later) == 1
    assert [len(c) for c in megatron_buckets(job, 1)] == [1, 1]
    assert sum(sum(c) for c in megatron_buckets(job, 1)) == dense_params(rank_params(job, 1))
    # the default bucket counts the context-parallel ranks: dp 128 x cp 2 -> 256M
    cp = make_job("llama-3.1-8b", gpus=256, cp=2, zero=1, training=dict(global_batch_size=128))
    assert megatron_bucket_size(cp) == 256_000_000


def test_bf16_parameters_step_adamw_on_bf16_states_by_hand():
    # TrainingSpec.bf16_params (KempnerForge): fused AdamW reads param, grad, exp_avg, exp_avg_sq in
    # bf16 (8 bytes) and writes param and both states (6), clipping reads the grads twice (4): 18 bytes
    # a parameter where fp32 parameters and states move 38. 1e9 parameters on H100 SXM at 0.90 of
    # 3.35 TB/s (presets/kernels/hopper.toml stream_fraction): 18e9 / 3.015e12 = 5.970 ms.
    # rel 1e-9: the same arithmetic in another order
    from cost_models.compute import optimizer_time
    from cost_models.errors import SpecError

    def job(bf16, optimizer="adamw"):
        return make_job(LLAMA_TINY, gpus=1, training=dict(framework="torchtitan", optimizer=optimizer, seq_len=16,
                                                          global_batch_size=1, bf16_params=bf16))

    assert optimizer_time(job(True), 1e9, DEFAULT) == pytest.approx(18e9 / (0.90 * 3.35e12), rel=1e-9)
    assert optimizer_time(job(False), 1e9, DEFAULT) == pytest.approx(38e9 / (0.90 * 3.35e12), rel=1e-9)
    # SGD's one bf16 momentum: read 6, write 4, clip 4
    assert optimizer_time(job(True, "sgd"), 1e9, DEFAULT) == pytest.approx(14e9 / (0.90 * 3.35e12), rel=1e-9)
    # Composer's fp32 per-op DecoupledAdamW has no bf16 form
    with pytest.raises(SpecError, match="bf16_params describes torch's AdamW or SGD"):
        job(True, "decoupled_adamw")


def test_loss_on_16bit_logits_moves_12_bytes_a_logit_by_hand():
    # eager cross_entropy on bf16 logits: log_softmax reads 2 and writes 2, nll_loss's backward writes
    # its 2-byte zeros, log_softmax's backward reads 2 + 2 and writes 2: 12 bytes a logit where the
    # fp32 path moves 16. 16 tokens x 1000 logits = 192,000 bytes at "loss.eager" (0.25 of H100's
    # 3.35 TB/s), 4 launches of 2.4 us. rel 1e-9: float rounding
    from cost_models.compute import loss_time

    def job(bf16):
        return make_job(LLAMA_TINY, gpus=1, training=dict(framework="torchtitan", seq_len=16, global_batch_size=1,
                                                          loss_on_16bit_logits=bf16))

    assert loss_time(job(True), DEFAULT) == pytest.approx(192_000 / (0.25 * 3.35e12) + 4 * 2.4e-6, rel=1e-9)
    assert loss_time(job(False), DEFAULT) == pytest.approx(256_000 / (0.25 * 3.35e12) + 4 * 2.4e-6, rel=1e-9)


def test_compiled_full_recompute_leaves_out_the_mlp_output_gemm_by_hand():
    # torch.compile around a fully checkpointed block (torchtitan, KempnerForge): the partitioner's
    # backward graph holds only the forward nodes some gradient needs, and none needs fc2's output.
    # LLAMA_TINY at tp 2 with sequence parallelism, 2 x 64 tokens a micro-batch: the recomputed
    # GEMMs are the forward's less fc2 (a 128 x 256 x 344 GEMM on each rank), and the recomputed
    # pass runs every forward collective but fc2's reduce-scatter of 128 x 256 x 2 = 65,536 bytes.
    from cost_models.comm import Collective, collective_time, placement
    from cost_models.compute import layer_time, linear_pass_seconds
    from cost_models.flops import layer_gemms
    from cost_models.step_time import layer_pass, pruned_block_output, recompute_kernels

    def job(compile, framework="torchtitan"):
        return make_job(LLAMA_TINY, gpus=2, tp=2, mbs=2, recompute="full",
                        training=dict(framework=framework, seq_len=64, global_batch_size=2, compile=compile))

    kind = LayerKind()
    j = job(True)
    fc2 = next(g for g in layer_gemms(j, kind) if g.name == "mlp_fc2")
    assert (fc2.m, fc2.n, fc2.k) == (128, 256, 344)
    assert pruned_block_output(j, kind, Recompute.FULL, DEFAULT).row == fc2
    lt = layer_time(j, kind, cal=DEFAULT)
    # rel 1e-12: one subtraction
    assert recompute_kernels(j, kind, lt, Recompute.FULL, DEFAULT)[0] == pytest.approx(
        lt.gemm - linear_pass_seconds(j, fc2, DEFAULT)[0], rel=1e-12)
    # eager checkpointing (torchtitan or Megatron) runs fc2 again, selective recompute no GEMM of it
    assert pruned_block_output(job(False), kind, Recompute.FULL, DEFAULT) is None
    assert pruned_block_output(job(False, "megatron"), kind, Recompute.FULL, DEFAULT) is None
    assert pruned_block_output(j, kind, Recompute.SELECTIVE, DEFAULT) is None
    # the tp term: one reduce-scatter over the pair less; rel 1e-9: float rounding of the same sums
    rs = collective_time(Collective.REDUCE_SCATTER, 65_536, placement(j.cluster.spec, 2, 1), j.cluster.spec)
    eager_tp = layer_pass(job(False), kind, mode=Recompute.FULL, cal=DEFAULT).comm.value("tp")
    compiled_tp = layer_pass(j, kind, mode=Recompute.FULL, cal=DEFAULT).comm.value("tp")
    assert eager_tp - compiled_tp == pytest.approx(rs, rel=1e-9) and rs > 0
    # and its FLOPs leave the executed count
    eager_flop = layer_pass(job(False), kind, mode=Recompute.FULL, cal=DEFAULT).recompute_flop
    assert eager_flop - layer_pass(j, kind, mode=Recompute.FULL, cal=DEFAULT).recompute_flop == fc2.flop


def test_a_layer_pass_prices_its_tp_blocks_once(monkeypatch):
    # a compiled full recomputation (the pruned fc2 above): layer_pass prices the layer's tp blocks
    # once and hands them, with the block pruned_block_output finds in them, to the recomputed
    # kernels, whose sum is its recompute term as recompute_kernels gives it (rel 1e-12: the same sums)
    import cost_models.step_time as st

    j = make_job(LLAMA_TINY, gpus=2, tp=2, mbs=2, recompute="full",
                 training=dict(framework="torchtitan", seq_len=64, global_batch_size=2, compile=True))
    kind, real, calls = LayerKind(), st.tp_blocks, []
    expected = sum(st.recompute_kernels(j, kind, st.layer_time(j, kind, cal=DEFAULT), Recompute.FULL, DEFAULT))
    monkeypatch.setattr(st, "tp_blocks", lambda *a, **k: calls.append(1) or real(*a, **k))
    p = st.layer_pass(j, kind, mode=Recompute.FULL, cal=DEFAULT)
    assert len(calls) == 1
    assert p.compute.value("recompute") == pytest.approx(expected, rel=1e-12) and expected > 0


def test_replicated_vocabulary_prices_the_whole_vocabulary_on_every_tp_rank_by_hand():
    # TrainingSpec.tp_replicated_vocab (KempnerForge's tp plan), LLAMA_TINY unpadded (torchtitan):
    # V = 1000, h = 256, 16-token micro-batches (mbs 1, seq 16).
    from cost_models.comm import Collective, collective_time, placement
    from cost_models.compute import loss_time, memory_seconds
    from cost_models.flops import head_gemm
    from cost_models.step_time import logits_gather_seconds

    def job(tp, pp=1, rep=True):
        return make_job(LLAMA_TINY, gpus=tp * pp, tp=tp, pp=pp,
                        training=dict(framework="torchtitan", seq_len=16, global_batch_size=8, tp_replicated_vocab=rep))

    # output layer: column-parallel without a pipeline (1000/2 = 500 columns), whole on a pipeline
    # stage (1000), where Megatron-style vocab-parallel splits it (500)
    assert (head_gemm(job(2)).n, head_gemm(job(2, pp=2)).n, head_gemm(job(2, pp=2, rep=False)).n) == (500, 1000, 500)
    assert head_gemm(job(2, pp=2)).flop == 2 * 16 * 1000 * 256
    # the loss over all 1000 logits per token on each of the 2 tp ranks: the one-GPU loss, and its
    # bytes (16·1000·16 = 256,000) twice the vocab-parallel rank's (16·500·16) at one launch cost
    one, rep, split = loss_time(job(1), DEFAULT), loss_time(job(2), DEFAULT), loss_time(job(2, rep=False), DEFAULT)
    assert rep == one
    # eager F.cross_entropy (torchtitan uncompiled); the 4 launches cancel. rel 1e-9: float rounding
    extra = memory_seconds(job(2), 16 * 500 * 16, DEFAULT, op="loss.eager")
    assert rep - split == pytest.approx(extra, rel=1e-9) and extra > 0
    # the logits gathered whole without a pipeline: t·V·2 = 16·1000·2 = 32,000 bytes over tp 2;
    # nothing on pipeline stages, nor without the flag
    j = job(2)
    assert logits_gather_seconds(j) == collective_time(Collective.ALL_GATHER, 32_000, placement(j.cluster.spec, 2, 1), j.cluster.spec)
    assert logits_gather_seconds(j) > 0
    assert logits_gather_seconds(job(2, pp=2)) == logits_gather_seconds(job(2, rep=False)) == 0.0


def test_apex_distributed_adam_buckets_one_layer_on_every_pipeline_rank():
    # NeMo 1's Apex DistributedFusedAdam (TrainingSpec.apex_distributed_adam): one bucket per
    # transformer layer on every rank and chunk, reduced together however bucket_cap_mb cuts it,
    # the parameters outside the layers in the first forward layer's bucket (megatron_gpt_model.py:
    # 547-580). GPT_TINY tp1 pp2: a layer is 789,760 parameters (test above); rank 0 holds layers 0-1
    # and the word and position embeddings (262,144 each), rank 1 layers 2-3, the final LayerNorm (512)
    # and the tied output weight (262,144). Megatron's DDP gives rank 1 a single bucket.
    from cost_models.step_time import megatron_buckets
    from tests.helpers import GPT_TINY

    def job(vpp: int, apex: bool):
        return make_job(GPT_TINY, gpus=4, pp=2, vpp=vpp, zero=1,
                        training=dict(seq_len=512, global_batch_size=8, apex_distributed_adam=apex,
                                      vocab_divisible_by=128))  # 1000 rows -> 1024, Megatron's default padding

    layer = 789_760
    assert megatron_buckets(job(1, True), 0) == ((layer, layer + 524_288),)
    assert megatron_buckets(job(1, True), 1) == ((layer, layer + 512 + 262_144),)
    assert megatron_buckets(job(1, False), 1) == ((2 * layer + 512 + 262_144,),)
    # vpp 2, one layer a chunk: rank 1 runs layers 1 and 3; the output layer, registered in its last
    # chunk, joins the bucket of its first chunk's layer, the first whose parameters are gathered
    assert megatron_buckets(job(2, True), 1) == ((layer + 512 + 262_144,), (layer,))
    assert megatron_buckets(job(2, False), 1) == ((layer,), (layer + 512 + 262_144,))


def test_apex_distributed_adam_reduces_embedding_gradients_in_fp32():
    # NeMo's with_fp32_embedding_grads (default True): under Apex DistributedFusedAdam the word and
    # position embeddings (rank 0) and the tied output weight (last rank) reduce-scatter 4 bytes a
    # gradient, with the first forward layer's bucket they are tied to; that bucket's reduction and
    # gather are what cannot hide. GPT_TINY pp2 dp2, bf16 gradients elsewhere.
    from cost_models.comm import Collective, collective_time
    from cost_models.step_time import _dense_group, megatron_bucket_seconds
    from tests.helpers import GPT_TINY

    # Buckets of 1 MiB of bf16 gradients (apex_bucket_cap_mb=1) over dp 2: 524,288 elements, so a
    # layer's 789,760 parameters fill two whole buckets, the embeddings' 524,288 fp32 gradients one
    # bucket of their own dtype (apex_bucket_elements, bucket_collective_seconds).
    job = make_job(GPT_TINY, gpus=4, pp=2, zero=1, training=dict(seq_len=512, global_batch_size=8, apex_bucket_cap_mb=1,
                                                                 apex_distributed_adam=True, grad_reduce_in_bf16=True,
                                                                 vocab_divisible_by=128))  # 1000 rows -> 1024
    where, cl = _dense_group(job), job.cluster.spec
    bucket = 524_288

    def rs(n_bytes: int) -> float:
        return collective_time(Collective.REDUCE_SCATTER, n_bytes, where, cl)

    # the first forward layer's group gathers 789,760 + 524,288 = 1,314,048 bf16 parameters: 3 buckets
    ag = collective_time(Collective.ALL_GATHER, 3 * bucket * 2, where, cl)
    total, tail = megatron_bucket_seconds(job, 0, "dense", where)
    assert tail == pytest.approx(rs(2 * bucket * 2 + bucket * 4) + ag, rel=1e-12)
    assert total == pytest.approx(rs(2 * bucket * 2) + tail, rel=1e-12)
    # rank 1: its layer-2 group holds the final LayerNorm (512, bf16: 790,272 in 2 buckets) and the
    # output weight (262,144 fp32: 1 bucket); 1,052,416 parameters gather in 3 buckets
    _, tail1 = megatron_bucket_seconds(job, 1, "dense", where)
    ag1 = collective_time(Collective.ALL_GATHER, 3 * bucket * 2, where, cl)
    assert tail1 == pytest.approx(rs(2 * bucket * 2 + bucket * 4) + ag1, rel=1e-12)


def test_apex_distributed_adam_gathers_whole_buckets_without_overlap():
    # Without overlapped gathers (overlap_grad_reduce=False) Apex's blocking param_sync all-gathers
    # every bucket at once, each its whole padded buffer, as the overlapped gathers do bucket by
    # bucket. GPT_TINY pp2 dp2, buckets of 1 MiB of bf16 (524,288 elements): rank 0's two layer
    # groups, 789,760 and 789,760 + 524,288 embedding parameters, fill 2 + 3 = 5 buckets, so the
    # gather moves 5·524,288·2 = 5,242,880 bytes, not the parameters' 2,103,808·2 = 4,207,616.
    from cost_models.comm import Collective, collective_time
    from cost_models.step_time import _dense_group, bucket_message_bytes, megatron_bucket_seconds
    from tests.helpers import GPT_TINY

    def job(overlap: bool):
        return make_job(GPT_TINY, gpus=4, pp=2, zero=1,
                        training=dict(seq_len=512, global_batch_size=8, apex_bucket_cap_mb=1, apex_distributed_adam=True,
                                      grad_reduce_in_bf16=True, overlap_grad_reduce=overlap))

    bucket = 524_288
    j = job(False)
    where, cl = _dense_group(j), j.cluster.spec
    # the first forward layer's group reduce-scatters 2 bf16 buckets and the embeddings' fp32 one
    rs_last = collective_time(Collective.REDUCE_SCATTER, 2 * bucket * 2 + bucket * 4, where, cl)
    ag = collective_time(Collective.ALL_GATHER, 5 * bucket * 2, where, cl)
    _, tail = megatron_bucket_seconds(j, 0, "dense", where)
    assert tail == pytest.approx(rs_last + ag, rel=1e-12)
    # the overlapped path gathers the same 5 buckets, 2 and 3 a group
    assert [bucket_message_bytes(job(True), n, 2, 2) for n in (789_760, 789_760 + 524_288)] == [2 * bucket * 2, 3 * bucket * 2]


def test_apex_distributed_adam_communicates_whole_buckets():
    # Apex DistributedFusedAdam: a bucket is bucket_cap_mb MiB of bf16 gradients cut into dp shards
    # rounded down to 64 elements (128 bytes), times dp (distributed_fused_adam.py:518-525); every
    # bucket is reduced whole, however little of it its layer fills. 100 MiB = 52,428,800 bf16
    # elements: over dp 2, 26,214,400 a shard (a multiple of 64); over dp 3, 17,476,266 -> 17,476,224,
    # so 52,428,672.
    from cost_models.comm import Collective, collective_time
    from cost_models.step_time import _dense_group, apex_bucket_elements, bucket_collective_seconds
    from tests.helpers import GPT_TINY

    def job(apex: bool, **training):
        return make_job(GPT_TINY, gpus=2, zero=1, training=dict(seq_len=512, global_batch_size=6, apex_distributed_adam=apex,
                                                                   grad_reduce_in_bf16=True, **training))

    assert apex_bucket_elements(job(True), 2) == 52_428_800
    assert apex_bucket_elements(job(True), 3) == 52_428_672
    assert apex_bucket_elements(job(True, apex_bucket_cap_mb=200), 2) == 104_857_600
    # GPT_TINY's layer (789,760 parameters) is one 100 MiB bucket; Megatron's DDP reduces its bytes
    apex, ddp = job(True), job(False)
    where, cl = _dense_group(apex), apex.cluster.spec
    assert bucket_collective_seconds(apex, Collective.REDUCE_SCATTER, 789_760, 2, where) == \
        collective_time(Collective.REDUCE_SCATTER, 52_428_800 * 2, where, cl)
    assert bucket_collective_seconds(ddp, Collective.REDUCE_SCATTER, 789_760, 2, where) == \
        collective_time(Collective.REDUCE_SCATTER, 789_760 * 2, where, cl)
    # 52,428,801 parameters need a second bucket
    assert bucket_collective_seconds(apex, Collective.ALL_GATHER, 52_428_801, 2, where) == \
        collective_time(Collective.ALL_GATHER, 2 * 52_428_800 * 2, where, cl)


def test_bias_gradients_are_reduced_in_one_kernel_each_where_no_epilogue_does():
    from cost_models.compute import bias_grad_seconds, elementwise_seconds

    def job(framework="megatron", **bias):
        model = GPT_TINY.model_copy(update=bias)
        return make_job(model, gpus=1, cluster="dgx-a100-80gb", training=dict(framework=framework, seq_len=512, global_batch_size=1))

    # 512 tokens; proj's and fc2's gradients are 512 x 256, fc1's 512 x 1024: 512·1536 = 786,432
    # 16-bit elements read once, 1,572,864 bytes at A100's stream fraction (0.86 of 2.039 TB/s),
    # plus three 2.6 µs launches = 0.897 + 7.8 µs. rel 1e-3: the hand arithmetic's rounding
    kind = LayerKind()
    assert bias_grad_seconds(job(), kind, DEFAULT) == pytest.approx(1_572_864 / (2.039e12 * 0.86) + 3 * 2.6e-6, rel=1e-3)
    # the backward's memory-bound kernels carry exactly that; the forward adds the biases in its
    # fused kernels and gains nothing; no biases, nothing to reduce
    without = job(out_bias=False, mlp_bias=False)
    assert elementwise_seconds(job(), kind, backward=True, cal=DEFAULT) - elementwise_seconds(without, kind, backward=True, cal=DEFAULT) \
        == pytest.approx(bias_grad_seconds(job(), kind, DEFAULT), rel=1e-9)
    assert elementwise_seconds(job(), kind, backward=False, cal=DEFAULT) == elementwise_seconds(without, kind, backward=False, cal=DEFAULT)
    assert bias_grad_seconds(without, kind, DEFAULT) == 0.0
    # torchtitan's nn.Linear also reduces the qkv projection's: 512 x 768 more elements, 512·2304 =
    # 1,179,648 read once (2,359,296 bytes) and four launches; its forward bias sits in the GEMM's
    # epilogue (nothing added in forward either)
    titan_without = job("torchtitan", qkv_bias=False, out_bias=False, mlp_bias=False)
    assert bias_grad_seconds(job("torchtitan"), kind, DEFAULT) == pytest.approx(
        2_359_296 / (2.039e12 * 0.86) + 4 * 2.6e-6, rel=1e-3)
    assert bias_grad_seconds(titan_without, kind, DEFAULT) == 0.0
    assert elementwise_seconds(job("torchtitan"), kind, backward=False, cal=DEFAULT) == \
        elementwise_seconds(titan_without, kind, backward=False, cal=DEFAULT)


def _elementwise_added(on: Job, off: Job, kind: LayerKind) -> tuple[float, float]:
    """What a switch adds to a layer's memory-bound kernels, (forward, backward): `on` minus `off`."""
    from cost_models.compute import elementwise_seconds

    return tuple(elementwise_seconds(on, kind, backward=b, cal=DEFAULT) - elementwise_seconds(off, kind, backward=b, cal=DEFAULT)
                 for b in (False, True))


def test_megatron_local_qkv_bias_is_an_add_forward_and_a_reduction_backward():
    from cost_models.compute import qkv_bias_seconds

    def job(unfused=True, tp=1, **model):
        spec = GPT_TINY.model_copy(update=model)
        return make_job(spec, gpus=tp, tp=tp, cluster="dgx-a100-80gb",
                        training=dict(seq_len=512, global_batch_size=1, qkv_bias_unfused=unfused))

    # 512 tokens x (q 256 + k 256 + v 256) = 393,216 16-bit outputs. Forward reads and writes each
    # (4 bytes): 1,572,864 bytes at A100's stream fraction (0.86 of 2.039 TB/s) = 0.897 µs, plus one
    # 2.6 µs launch; backward reads the gradient once (2 bytes): 0.448 µs + 2.6 µs. rel 1e-3: the
    # hand arithmetic's rounding
    kind = LayerKind()
    fwd = qkv_bias_seconds(job(), kind, backward=False, cal=DEFAULT)
    bwd = qkv_bias_seconds(job(), kind, backward=True, cal=DEFAULT)
    assert fwd == pytest.approx(1_572_864 / (2.039e12 * 0.86) + 2.6e-6, rel=1e-3)
    assert bwd == pytest.approx(786_432 / (2.039e12 * 0.86) + 2.6e-6, rel=1e-3)
    # tp 2: each rank holds half the heads, half the elements (the launch stays whole)
    assert qkv_bias_seconds(job(tp=2), kind, backward=False, cal=DEFAULT) == pytest.approx(786_432 / (2.039e12 * 0.86) + 2.6e-6, rel=1e-3)
    # the layer's memory-bound kernels carry exactly that, in both passes; off by default (Transformer
    # Engine's epilogue) and without a qkv bias
    assert _elementwise_added(job(), job(False), kind) == pytest.approx((fwd, bwd), rel=1e-9)
    assert qkv_bias_seconds(job(False), kind, backward=False, cal=DEFAULT) == 0.0


def test_megatron_core_copies_q_k_v_to_bshd_forward_and_joins_their_gradients_backward():
    from cost_models.compute import qkv_layout_copy_seconds

    def job(copies=True, tp=1):
        return make_job(GPT_TINY, gpus=tp, tp=tp, cluster="dgx-a100-80gb",
                        training=dict(seq_len=512, global_batch_size=1, qkv_bshd_copies=copies))

    # 512 tokens x (q 256 + k 256 + v 256) = 393,216 16-bit elements, each read and written once per
    # pass (4 bytes): 1,572,864 bytes at A100's stream fraction (0.86 of 2.039 TB/s) = 0.897 µs;
    # forward three copy kernels (3 x 2.6 µs), backward one torch.cat (2.6 µs). rel 1e-3: the hand
    # arithmetic's rounding
    kind = LayerKind()
    fwd = qkv_layout_copy_seconds(job(), kind, backward=False, cal=DEFAULT)
    bwd = qkv_layout_copy_seconds(job(), kind, backward=True, cal=DEFAULT)
    assert fwd == pytest.approx(1_572_864 / (2.039e12 * 0.86) + 3 * 2.6e-6, rel=1e-3)
    assert bwd == pytest.approx(1_572_864 / (2.039e12 * 0.86) + 2.6e-6, rel=1e-3)
    # tp 2: half the heads per rank
    assert qkv_layout_copy_seconds(job(tp=2), kind, backward=True, cal=DEFAULT) == pytest.approx(786_432 / (2.039e12 * 0.86) + 2.6e-6, rel=1e-3)
    assert _elementwise_added(job(), job(False), kind) == pytest.approx((fwd, bwd), rel=1e-9)
    assert qkv_layout_copy_seconds(job(False), kind, backward=False, cal=DEFAULT) == 0.0


def test_megatron_optimizer_copies_16_bit_main_grads_to_fp32_and_unscales_fp16_ones():
    from cost_models.compute import optimizer_time

    def job(precision, framework="megatron", **training):
        return make_job(GPT_TINY, gpus=1, cluster="dgx-a100-80gb",
                        training=dict(framework=framework, precision=precision, seq_len=512, global_batch_size=1, **training))

    t = {name: optimizer_time(j, 1e9, DEFAULT) for name, j in (
        ("bf16", job("bf16")), ("fp16", job("fp16")), ("bf16_grads", job("bf16", grad_reduce_in_bf16=True)),
        ("titan_fp16", job("fp16", "torchtitan")))}
    # AdamW moves 38 bytes a parameter; fp16 adds the fp16 -> fp32 gradient copy (2 + 4) and the
    # in-place unscale (4 + 4): 52; bf16 main grads (--grad-reduce-in-bf16) the copy only: 44.
    # Exact ratios: the same bytes-over-bandwidth price with no launches
    assert t["fp16"] / t["bf16"] == pytest.approx(52 / 38, rel=1e-12)
    assert t["bf16_grads"] / t["bf16"] == pytest.approx(44 / 38, rel=1e-12)
    assert t["titan_fp16"] == t["bf16"]


def test_composers_decoupled_adamw_moves_each_update_op_through_memory():
    from cost_models.compute import optimizer_time

    def job(optimizer):
        return make_job(GPT_TINY, gpus=1, cluster="dgx-a100-80gb",
                        training=dict(framework="torchtitan", optimizer=optimizer, seq_len=512, global_batch_size=1))

    # Composer's per-op update reads 48 and writes 32 bytes a parameter (exp_avg mul_ 4+4, add_ 8+4;
    # exp_avg_sq mul_ 4+4, addcmul_ 8+4; sqrt 4+4; divide 4+4; add eps 4+4; addcdiv_ 12+4) and
    # clipping 8 more: 88 where torch's fused AdamW moves 38. 1e9 parameters on A100-80GB at 0.86 of
    # 2.039 TB/s (presets/kernels/ampere.toml stream_fraction): 88e9 / 1.7535e12 = 50.18 ms.
    # rel 1e-9: the same arithmetic in another order
    assert optimizer_time(job("decoupled_adamw"), 1e9, DEFAULT) == pytest.approx(88e9 / (0.86 * 2.039e12), rel=1e-9)
    assert optimizer_time(job("decoupled_adamw"), 1e9, DEFAULT) / optimizer_time(job("adamw"), 1e9, DEFAULT) \
        == pytest.approx(88 / 38, rel=1e-12)


def test_megatron_unfused_cross_entropy_runs_at_the_unfused_kernels_measured_rate():
    from cost_models.compute import loss_time

    def job(unfused):
        return make_job(GPT_TINY, gpus=1, cluster="dgx-a100-80gb",
                        training=dict(seq_len=512, global_batch_size=1, cross_entropy_unfused=unfused, vocab_divisible_by=128))

    # 512 tokens x 1024 logits (1000 padded to a multiple of 128, Megatron's default) x 16 bytes = 8,388,608 bytes: at
    # Megatron's unfused cross entropy's 0.25 of A100's 2.039 TB/s 16.457 µs, at the fused kernels'
    # 0.29 14.187 µs, each with 4 launches of 2.6 µs. rel 1e-4: the hand arithmetic's rounding
    assert loss_time(job(True), DEFAULT) == pytest.approx(16.457e-6 + 4 * 2.6e-6, rel=1e-4)
    assert loss_time(job(False), DEFAULT) == pytest.approx(14.187e-6 + 4 * 2.6e-6, rel=1e-4)


def test_megatron_local_attention_copies_the_context_forward_and_joins_and_scales_gradients_backward():
    from cost_models.compute import local_attention_copy_seconds

    def job(on=True, tp=1):
        return make_job(GPT_TINY, gpus=tp, tp=tp, cluster="dgx-a100-80gb",
                        training=dict(seq_len=512, global_batch_size=1, attention="eager", local_attention_copies=on))

    # 512 tokens x 256 q channels = 131,072 16-bit elements, each read and written once (4 bytes).
    # Forward the context's permute copy: 524,288 bytes at A100's stream fraction (0.86 of 2.039
    # TB/s) = 0.299 µs, plus one 2.6 µs launch. Backward the cat of dq, dk, dv (393,216 elements)
    # and the alpha multiplies of dq and dk (2 x 131,072): 2,621,440 bytes = 1.495 µs, plus three
    # launches. rel 1e-3: the hand arithmetic's rounding
    kind = LayerKind()
    fwd = local_attention_copy_seconds(job(), kind, backward=False, cal=DEFAULT)
    bwd = local_attention_copy_seconds(job(), kind, backward=True, cal=DEFAULT)
    assert fwd == pytest.approx(0.299e-6 + 2.6e-6, rel=1e-3)
    assert bwd == pytest.approx(1.495e-6 + 3 * 2.6e-6, rel=1e-3)
    # tp 2: half the heads per rank (the launches stay whole)
    assert local_attention_copy_seconds(job(tp=2), kind, backward=True, cal=DEFAULT) == pytest.approx(0.7474e-6 + 3 * 2.6e-6, rel=1e-3)
    # the layer's memory-bound kernels carry exactly that; nothing without the switch
    assert _elementwise_added(job(), job(False), kind) == pytest.approx((fwd, bwd), rel=1e-9)
    assert local_attention_copy_seconds(job(False), kind, backward=True, cal=DEFAULT) == 0.0


def test_torchs_ring_prices_its_merges_and_send_buffers_by_hand():
    # Llama 3.1 8B, torchtitan, cp 2 at 65,536 tokens on H100 SXM: a rank's attention output is
    # 32 heads x 32,768 tokens x 128 = 134,217,728 elements, and torchtitan hands SDPA K and V
    # expanded to the 32 query heads, each as large (RingCopies, k = o). Compiled, a later forward step
    # merges 10 bytes per element in one kernel: 1.342e9 B at 0.90 of 3.35 TB/s = 0.4452 ms + 2.4 us;
    # the backward's dQ (10 per o) and dK/dV send buffer (20 per k), 30 x o, in two kernels: 1.3355 ms
    # + 4.8 us. Eager, the forward's four fp32 ops (38, or 27 on a partial rank, mean 32.5) and the
    # K/V send buffer before the step (8): 40.5 x o = 1.8030 ms + 5 launches. Megatron (TE) merges in
    # 10 and 20 bytes, two kernels each. rel 1e-9: float rounding
    from cost_models.compute import attention_kernels

    o, bw, launch = 32 * 32768 * 128, 0.90 * 3.35e12, 2.4e-6

    def kernels(framework, compile):
        return attention_kernels(make_job("llama-3.1-8b", gpus=2, cp=2, training=dict(
            framework=framework, compile=compile, seq_len=65536, global_batch_size=1)), DEFAULT)

    compiled, eager = kernels("torchtitan", True), kernels("torchtitan", False)
    assert compiled.merge_fwd == pytest.approx(10 * o / bw + launch, rel=1e-9)
    assert compiled.merge_bwd == pytest.approx(30 * o / bw + 2 * launch, rel=1e-9)
    assert eager.merge_fwd == pytest.approx(40.5 * o / bw + 5 * launch, rel=1e-9)
    # once per pass, compiled: the K/V all-gather buffer (8 per k) in forward; step 0's dK/dV send
    # buffer, the K/V buffer again and dK/dV's final cast (20 + 8 + 12) in backward, on top of the
    # first step's causal kernel, which cp 1 runs alone at 32,768 tokens
    alone = attention_kernels(make_job("llama-3.1-8b", gpus=1, training=dict(
        framework="torchtitan", compile=True, seq_len=32768, global_batch_size=1)), DEFAULT)
    assert compiled.first_fwd - alone.first_fwd == pytest.approx(8 * o / bw + launch, rel=1e-6)
    assert compiled.first_bwd - alone.first_bwd == pytest.approx(40 * o / bw + 3 * launch, rel=1e-6)
    megatron = kernels("megatron", False)
    assert megatron.merge_fwd == pytest.approx(10 * o / bw + 2 * launch, rel=1e-9)
    assert megatron.merge_bwd == pytest.approx(20 * o / bw + 2 * launch, rel=1e-9)


def test_llm_foundry_flash_path_unpads_q_k_v_and_pads_the_output_around_the_varlen_kernel():
    from cost_models.compute import flash_unpad_copy_seconds

    def job(on=True, **model):
        spec = GPT_TINY.model_copy(update=model)
        return make_job(spec, gpus=1, cluster="dgx-a100-80gb", training=dict(
            seq_len=512, global_batch_size=1, framework="torchtitan", attention="flash", flash_unpad_copies=on))

    # 512 tokens, q, k and v 256 wide each. Forward: three gathers read and write q, k, v
    # (4 x 768 bytes per token), the pad's zeros and index put over the output (6 x 256): 4,608
    # bytes per token, 2,359,296 in all, at A100's stream fraction (0.86 of 2.039 TB/s) = 1.3454 µs,
    # plus 20 launches of 2.6 µs (sum, nonzero, max, cumsum, pad and gather for each of q, k, v;
    # zeros and index put). Backward: the output gradient's gather (4 x 256) and zeros + scatter_
    # for each of dq, dk, dv (6 x 768): 5,632 bytes per token, 2,883,584 in all = 1.6444 µs, plus
    # 7 launches. rel 1e-3: the hand arithmetic's rounding
    kind = LayerKind()
    fwd = flash_unpad_copy_seconds(job(), kind, backward=False, cal=DEFAULT)
    bwd = flash_unpad_copy_seconds(job(), kind, backward=True, cal=DEFAULT)
    assert fwd == pytest.approx(1.3454e-6 + 20 * 2.6e-6, rel=1e-3)
    assert bwd == pytest.approx(1.6444e-6 + 7 * 2.6e-6, rel=1e-3)
    # two key/value heads of 32: k and v 64 wide each, 4 x 384 + 6 x 256 = 3,072 bytes per token
    # forward, 1,572,864 in all = 0.89697 µs
    gqa = flash_unpad_copy_seconds(job(num_kv_heads=2), kind, backward=False, cal=DEFAULT)
    assert gqa == pytest.approx(0.89697e-6 + 20 * 2.6e-6, rel=1e-3)
    # the layer's memory-bound kernels carry exactly that; nothing without the switch
    assert _elementwise_added(job(), job(False), kind) == pytest.approx((fwd, bwd), rel=1e-9)
    assert flash_unpad_copy_seconds(job(False), kind, backward=False, cal=DEFAULT) == 0.0
