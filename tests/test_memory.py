"""Memory assembly: schedule in-flight counts by hand, breakdown invariants, fit and monotonicity."""

from __future__ import annotations

import dataclasses

import pytest

from cost_models.activations import layer_backward_workspace, loss_workspace
from cost_models.enums import Schedule
from cost_models.memory import FRAGMENTATION, inflight_microbatches, memory_estimate, pending_scatter_bytes, reclaimed_pending
from cost_models.states import rank_params
from cost_models.units import GiB
from helpers import GPT_TINY, LLAMA_TINY, make_job

L70 = "llama-3.1-70b"


def _job(**kw):
    kw.setdefault("gpus", 32)
    kw.setdefault("tp", 8)
    training = kw.pop("training", {})
    training.setdefault("seq_len", 4096)
    return make_job(L70, training=training, **kw)


def test_1f1b_inflight_is_pp_minus_rank():
    job = _job(pp=4, training=dict(global_batch_size=16))  # dp=1, m=16
    assert [inflight_microbatches(job, r) for r in range(4)] == [(4,), (3,), (2,), (1,)]


def test_1f1b_inflight_capped_by_microbatches():
    job = _job(pp=4, training=dict(global_batch_size=2))
    assert [inflight_microbatches(job, r) for r in range(4)] == [(2,), (2,), (2,), (1,)]


def test_interleaved_inflight_by_hand():
    # pp=4, vpp=2, m=16. Rank 0 warm-up = (4-0-1)·2 + (2-1)·4 = 10 forwards, +1 = 11 in flight;
    # forward k runs chunk (k//4) % 2: k=0-3 -> 0, 4-7 -> 1, 8-10 -> 0  => 7 on chunk 0, 4 on chunk 1.
    # Rank 3: (0)·2 + 4 = 4, +1 = 5: k=0-3 -> chunk 0, k=4 -> chunk 1.
    job = _job(pp=4, vpp=2, training=dict(global_batch_size=16))
    assert inflight_microbatches(job, 0) == (7, 4)
    assert inflight_microbatches(job, 3) == (4, 1)


def test_interleaved_inflight_when_pp_does_not_divide_microbatches_by_hand():
    # torch's ScheduleInterleaved1F1B takes max(1, m // pp) rounds of r = m // rounds micro-batches;
    # warm-up (vpp-1)·r + 2·(pp-1-rank) forwards, at most m·vpp, then one more before the first
    # backward; forward k runs chunk (k // r) % vpp. pp 4, vpp 2, m 6: one round of r = 6. Rank 0
    # warms up with min(6 + 6, 12) = 12 forwards, all of them: 6 on each chunk (rounds of pp would
    # put k = 0-3 and 8-10 on chunk 0, 7 micro-batches of 6). Rank 3: 6 + 0 warm-up, 7 forwards,
    # k = 0-5 on chunk 0 and k = 6 on chunk 1.
    from cost_models.memory import inflight_counts, interleaved_backward_moments

    def counts(pp, v, m, rank):
        return inflight_counts(pp, v, m, rank, Schedule.INTERLEAVED)

    assert counts(4, 2, 6, 0) == (6, 6)
    assert counts(4, 2, 6, 3) == (6, 1)
    job = _job(pp=4, vpp=2, training=dict(global_batch_size=6, framework="torchtitan"))
    assert inflight_microbatches(job, 0) == (6, 6)
    # pp 4, vpp 2, m 10: two rounds of r = 5. Rank 0: 5 + 6 = 11 warm-up, 12 forwards: k = 0-4 and
    # 10-11 on chunk 0, 5-9 on chunk 1: (7, 5). Rank 3: 5 warm-up, 6 forwards: (5, 1).
    assert counts(4, 2, 10, 0) == (7, 5)
    assert counts(4, 2, 10, 3) == (5, 1)
    # the same as the first backward's moment of the full schedule, and never above m, on every
    # micro-batch count torch accepts (m a multiple of its rounds)
    for pp, v, m in [(p, v, m) for p in (2, 3, 4) for v in (2, 3) for m in range(1, 13) if m % max(1, m // p) == 0]:
        for rank in range(pp):
            assert counts(pp, v, m, rank) == interleaved_backward_moments(pp, v, m, rank)[0][1]
            assert max(counts(pp, v, m, rank)) <= m


def test_gpipe_keeps_every_microbatch():
    job = _job(pp=4, schedule="gpipe", training=dict(global_batch_size=8))
    assert all(inflight_microbatches(job, r) == (8,) for r in range(4))


def test_breakdown_parts_sum_and_peak_is_max_stage():
    est = memory_estimate(_job(pp=4, recompute="full", training=dict(global_batch_size=16)))
    for stage in est.stages:
        flat = stage.breakdown.flat()
        assert sum(flat.values()) == stage.peak_bytes
    assert est.peak_bytes == max(s.peak_bytes for s in est.stages)
    assert len(est.stages) == 4 and sum(len(s.layers) for s in est.stages) == 80


def test_first_stage_holds_most_activations_under_1f1b():
    est = memory_estimate(_job(pp=4, training=dict(global_batch_size=16)))
    acts = [s.breakdown.value("activations/layers") for s in est.stages]
    assert acts == sorted(acts, reverse=True) and acts[0] == 4 * acts[3]


def test_recompute_and_zero_lower_memory():
    base = memory_estimate(_job(training=dict(global_batch_size=4))).peak_bytes
    assert memory_estimate(_job(recompute="selective", training=dict(global_batch_size=4))).peak_bytes < base
    assert memory_estimate(_job(recompute="full", training=dict(global_batch_size=4))).peak_bytes < base
    z0, z1 = (memory_estimate(_job(zero=z, training=dict(global_batch_size=4))) for z in (0, 1))
    assert z1.peak_stage.breakdown.value("model_states") < z0.peak_stage.breakdown.value("model_states")


def test_recompute_first_k_layers_lies_between():
    full = memory_estimate(_job(recompute="full", training=dict(global_batch_size=4))).peak_stage.breakdown.value("activations")
    part = memory_estimate(_job(recompute="full", recompute_layers=40, training=dict(global_batch_size=4))).peak_stage.breakdown.value("activations")
    none = memory_estimate(_job(training=dict(global_batch_size=4))).peak_stage.breakdown.value("activations")
    assert full < part < none


def test_fits_against_capacity_and_headroom():
    job = _job(recompute="full", training=dict(global_batch_size=4))
    est = memory_estimate(job, headroom=0.05)
    assert est.capacity_bytes == job.cluster.gpu.hbm_bytes
    assert est.usable_bytes == int(est.capacity_bytes * 0.95)
    assert est.fits == (est.peak_bytes <= est.usable_bytes)
    # 70B on a single node without sharding cannot fit: 18 bytes/param / 8 ranks > 80 GiB
    big = memory_estimate(make_job(L70, gpus=8, tp=8, training=dict(seq_len=4096, global_batch_size=8)))
    assert not big.fits and big.peak_bytes > 140 * GiB


def test_context_parallel_divides_activations():
    one = memory_estimate(_job(gpus=8, training=dict(global_batch_size=1, seq_len=32768), recompute="full")).peak_stage
    two = memory_estimate(_job(gpus=16, cp=2, training=dict(global_batch_size=1, seq_len=32768), recompute="full")).peak_stage
    assert two.breakdown.value("activations/layers") * 2 == pytest.approx(one.breakdown.value("activations/layers"))


def test_fp8_parameters_keep_one_byte_weights_and_only_the_transpose():
    # Megatron --fp8-param-gather: a uint8 parameter buffer (1 byte per weight, not 2) and, the
    # weight being its own fp8 copy, Transformer Engine keeps only its transpose (1 byte, not 2)
    base = dict(seq_len=2048, global_batch_size=64, precision="fp8")
    plain = memory_estimate(make_job("llama-3.1-70b", gpus=64, tp=8, pp=4, zero=1, training=base)).stages[1].breakdown
    fp8p = memory_estimate(make_job("llama-3.1-70b", gpus=64, tp=8, pp=4, zero=1, training={**base, "fp8_param_gather": True})).stages[1].breakdown
    assert fp8p.value("model_states/weights") == pytest.approx(plain.value("model_states/weights") / 2, rel=1e-6)
    assert fp8p.value("buffers/fp8_weight_cache") == pytest.approx(plain.value("buffers/fp8_weight_cache") / 2, rel=1e-6)


def test_nvfp4_keeps_quantised_weights_and_inputs():
    # Megatron with precision fp4 (TE NVFP4, 0.5625 bytes per element and usage): each weight's
    # cached NVFP4 copy holds both usages, 1.125 bytes per parameter (fp8: 2); a linear keeps the
    # column-wise usage of its input for the wgrad (0.5625), except TE's LayerNormLinear under
    # sequence parallelism, which keeps both (layernorm_linear.py:400-414). LLAMA_TINY, 128 tokens,
    # tp 2 with sequence parallelism: qkv's and fc1's inputs 64 x 256 x 1.125 = 18,432 bytes each,
    # fc2's 128 x 344 x 0.5625 = 24,768, and out's own copy of the attention output 128 x 128 x 0.5625
    # = 9,216 beside the 16-bit one flash attention saves.
    from cost_models.activations import layer_activations
    from cost_models.enums import Recompute as R
    from tests.helpers import LLAMA_TINY

    fp4 = dict(seq_len=128, precision="fp4", global_batch_size=2)
    job = make_job(LLAMA_TINY, gpus=2, tp=2, sp=True, cluster="dgx-b200", training=fp4)
    acts = layer_activations(job, 0, R.NONE)
    assert acts.value("attention/qkv_input") == 18_432
    assert acts.value("mlp/fc1_input") == 18_432
    assert acts.value("mlp/activation/fc2_input") == 24_768
    assert acts.value("attention/out_proj_input") == 9_216
    fp8 = make_job(LLAMA_TINY, gpus=2, tp=2, sp=True, cluster="dgx-b200", training={**fp4, "precision": "fp8"})
    cache4 = memory_estimate(job).stages[0].breakdown.value("buffers/fp8_weight_cache")
    cache8 = memory_estimate(fp8).stages[0].breakdown.value("buffers/fp8_weight_cache")
    assert cache4 == pytest.approx(cache8 * 1.125 / 2)


def test_mxfp8_keeps_each_usage_with_its_scales():
    # Megatron under TE's MXFP8 recipe: a quantised usage carries one e8m0 scale byte per 32 values
    # (1 + 1/32 bytes per element), in the cached weight copies and in the input fc2 saves for its wgrad
    from cost_models.activations import layer_activations
    from cost_models.enums import Recompute as R
    from tests.helpers import LLAMA_TINY

    fp8 = dict(seq_len=128, precision="fp8", global_batch_size=2)
    delayed = make_job(LLAMA_TINY, gpus=2, tp=2, sp=True, cluster="dgx-b200", training={**fp8, "fp8_recipe": "delayed"})
    mx = make_job(LLAMA_TINY, gpus=2, tp=2, sp=True, cluster="dgx-b200", training={**fp8, "fp8_recipe": "mxfp8"})
    cache = [memory_estimate(j).stages[0].breakdown.value("buffers/fp8_weight_cache") for j in (delayed, mx)]
    assert cache[1] == pytest.approx(cache[0] * (1 + 1 / 32))
    fc2 = [layer_activations(j, 0, R.NONE).value("mlp/activation/fc2_input") for j in (delayed, mx)]
    assert fc2 == [128 * 344, pytest.approx(128 * 344 * (1 + 1 / 32))]


def test_bf16_gradient_buffer_halves_the_gradients_and_the_reduction():
    # Megatron --grad-reduce-in-bf16: the grad buffer is bf16 (2 bytes per parameter, not the fp32
    # main grads), and the data-parallel reduce-scatter moves half the bytes
    from cost_models.calibration import DEFAULT
    from cost_models.step_time import dp_tail

    base = dict(seq_len=2048, global_batch_size=64)
    jobs = [make_job("llama-3.1-70b", gpus=64, tp=8, pp=4, zero=1, training={**base, "grad_reduce_in_bf16": b}) for b in (False, True)]
    fp32, bf16 = (memory_estimate(j).stages[1].breakdown for j in jobs)
    assert bf16.value("model_states/gradients") == pytest.approx(fp32.value("model_states/gradients") / 2, rel=1e-6)
    assert bf16.value("model_states/weights") == fp32.value("model_states/weights")
    assert dp_tail(jobs[1], 1, DEFAULT)[0] < dp_tail(jobs[0], 1, DEFAULT)[0]


@pytest.mark.parametrize("training, layout, needle", [
    (dict(framework="torchtitan", grad_reduce_in_bf16=True), dict(), "grad_reduce_in_bf16 is Megatron's --grad-reduce-in-bf16"),
    (dict(precision="bf16", fp8_param_gather=True), dict(zero=1), "fp8_param_gather is Megatron's --fp8-param-gather with precision fp8"),
    (dict(precision="fp8", fp8_param_gather=True), dict(zero=0), "needs the distributed optimizer"),
    (dict(framework="torchtitan", moe_dispatch="overlap"), dict(), "moe_dispatch overlap is Megatron's"),
])
def test_framework_features_are_refused_where_the_framework_lacks_them(training, layout, needle):
    from cost_models.errors import SpecError

    with pytest.raises(SpecError, match=needle):
        make_job("llama-3.1-8b", gpus=8, training=training, **layout)


def test_deepspeed_zero3_gathers_module_by_module_and_prefetches_until_the_live_limit():
    # DeepSpeed ZeRO-3 gathers the module it runs (partitioned_param_coordinator.py fetches a
    # module's own parameters) and prefetches the next until 5e7 elements are under way, none once
    # 1e9 are gathered; a module's 16-bit gradient lives until it is bucketed. The largest module is
    # the output layer (vocab x hidden, with the final norm counted beside it), not a whole layer.
    from cost_models.memory import stage_buffers

    def buffers(model: str) -> tuple[float, float]:
        job = make_job(model, gpus=64, zero=3, training=dict(framework="deepspeed", seq_len=4096, global_batch_size=64))
        b = stage_buffers(job, 0)
        return b.value("unsharded_params"), b.value("unsharded_grads")

    # 8B: output layer 128256 x 4096 (+ norm 4096), then the embedding, 128256 x 4096: under 1e9
    # together, so the embedding is prefetched whole (the prefetch takes whole parameters)
    head, embedding = 128256 * 4096 + 4096, 128256 * 4096
    assert buffers("llama-3.1-8b") == (2 * (head + embedding), 2 * head)
    # 70B: the output layer alone (128256 x 8192 + 8192) is above the 1e9 live limit: no prefetch;
    # a whole 70B layer (856M) would have been far smaller than what the module limit allows
    head = 128256 * 8192 + 8192
    assert buffers("llama-3.1-70b") == (2 * head, 2 * head)


def test_megatron_fp16_gradient_copy_lives_in_the_step_only():
    # Megatron fp16, dp = 1, no ZeRO: the states of n parameters are fp16 weights 2n, an fp16
    # gradient buffer 2n, fp32 master weights 4n and Adam's moments 8n, alive all step (16n); the
    # optimizer's fp32 gradient copy (4n) exists only between its step and the next zero_grad, when
    # no activation is held. llama-tiny on one GPU: vocabulary padded to 1024 (embedding and output
    # 1024·256 each), 4 layers of 2 norms 2·256 + qkv 256·(256 + 2·64) + out 256·256 + SwiGLU
    # 3·256·688 = 692,736, final norm 256: n = 3,295,488.
    # (Megatron's default --make-vocab-size-divisible-by 128, set as vocab_divisible_by)
    long = make_job(LLAMA_TINY, gpus=1, training=dict(precision="fp16", seq_len=256, global_batch_size=8, vocab_divisible_by=128),
                    mbs=8)
    n = int(rank_params(long, 0).total)
    assert n == 3_295_488
    stage = memory_estimate(long).stages[0].breakdown
    # 8 sequences of 256 tokens hold more activation bytes than 4n: the peak is the backward's
    assert stage.value("activations") > 4 * n
    assert stage.value("model_states") == 16 * n
    assert stage.value("model_states/fp32_gradients") == 0
    # one 16-token sequence holds far less than 4n: the peak is the step's, with the copy and
    # without activations
    short = make_job(LLAMA_TINY, gpus=1, training=dict(precision="fp16", seq_len=16, global_batch_size=1, vocab_divisible_by=128),
                     mbs=1)
    stage = memory_estimate(short).stages[0].breakdown
    assert stage.value("model_states") == 20 * n
    assert stage.value("activations") == 0 and stage.value("transient") == 0
    assert stage.value("overhead/fragmentation") == int(FRAGMENTATION * 4 * n)


def test_bf16_trained_megatron_has_no_step_copy():
    # with fp32 gradient buffers (Megatron's bf16 default) the step's .float() is the buffer itself
    job = make_job(LLAMA_TINY, gpus=1, training=dict(seq_len=16, global_batch_size=1), mbs=1)
    assert memory_estimate(job).stages[0].breakdown.value("model_states/fp32_gradients") == 0


# nanotron's switches (TrainingSpec.grads_kept_through_backward, ddp_buckets, loss_shift_out_of_place).
# LLAMA_TINY by hand: a layer is q, o 256·256 + k, v 256·64 + w1, w2, w3 3·256·688 + 2 norms of 256
# = 692,736 parameters; the vocabulary pads to 1024 (tp 1, Megatron's default --make-vocab-size-divisible-by
# 128, set as vocab_divisible_by): embedding and output layer 262,144 each, final norm 256; 4 layers:
# 3,295,488 in all.
NANOTRON = dict(grad_accumulation_fusion=False, vocab_divisible_by=128)


def test_gradients_kept_through_backward_end_the_first_backward_by_hand():
    # pp 2, 4 micro-batches of 16 tokens: rank 0 (embedding, layers 0-1) holds 2 micro-batches when
    # its first backward starts. At its end one is left and every parameter of the stage has its
    # bf16 .grad: 2·(262,144 + 2·692,736) = 3,295,232 bytes, far above the tiny activations.
    training = dict(seq_len=16, global_batch_size=4, **NANOTRON)
    plain = memory_estimate(make_job(LLAMA_TINY, gpus=2, pp=2, training=training)).stages[0].breakdown
    kept = memory_estimate(make_job(LLAMA_TINY, gpus=2, pp=2, training={**training, "grads_kept_through_backward": True}))
    b = kept.stages[0].breakdown
    assert b.value("transient/stage_gradients") == 3_295_232
    assert b.value("activations/layers") * 2 == plain.value("activations/layers")
    assert b.value("transient") == 3_295_232  # no layer working set on top


def test_gradients_kept_through_backward_leave_an_activation_bound_peak_alone():
    # 8B, pp 1, 8k tokens: the micro-batch's activations (GiBs) dwarf 2 bytes per parameter of a
    # tp 8 shard (~2 GB), so the peak stays at the backward's start
    job = dict(gpus=8, tp=8, training=dict(seq_len=8192, global_batch_size=1, **NANOTRON))
    plain = memory_estimate(make_job("llama-3.1-8b", **job))
    job["training"] = {**job["training"], "grads_kept_through_backward": True}
    kept = memory_estimate(make_job("llama-3.1-8b", **job))
    assert kept.peak_bytes == plain.peak_bytes


def test_ddp_buckets_and_out_of_place_loss_shift_by_hand():
    # dp 2, ZeRO 0: DDP's bf16 buckets hold every parameter, 2·3,295,488 = 6,590,976 bytes; the loss
    # of 128 tokens over 1024 logits allocates 4 bytes per logit beside the shifted fp32 tensor it
    # keeps (the fp32 logits): 524,288, where Megatron's in-place loss adds 2; the freed 16-bit
    # logits' block, too small for either fp32 tensor, stays reserved: 2 bytes per logit, 262,144.
    # A layer's backward, (2·128·256 + 3·128·688)·2 = 659,456 bytes, is the larger moment; the
    # loss's blocks beyond it stay cached: 524,288 + 262,144 - 659,456 = 126,976
    training = dict(seq_len=128, global_batch_size=2, vocab_divisible_by=128)
    job = make_job(LLAMA_TINY, gpus=2, training={**training, "ddp_buckets": True, "loss_shift_out_of_place": True})
    b = memory_estimate(job).stages[0].breakdown
    assert b.value("buffers/zero_buckets") == 6_590_976
    assert loss_workspace(job) == 524_288
    assert b.value("transient/layer_backward") == 659_456
    assert b.value("overhead/cached_blocks") == 126_976
    megatron = make_job(LLAMA_TINY, gpus=2, training=training)
    assert memory_estimate(megatron).stages[0].breakdown.value("buffers/zero_buckets") == 0
    assert loss_workspace(megatron) == 262_144


def test_tp_gather_buffers_by_hand():
    # tp 2 with sequence parallel, 128 tokens: nanotron's "allgather" and "allgather2" buffers, each
    # 128 tokens · 256 hidden · 2 bytes = 65,536, kept for the run: 131,072 bytes of buffers. The
    # layer backward's gathered input is the buffer itself, so its working set drops by one
    # 65,536-byte gather; without sequence parallel there is no buffer.
    training = dict(seq_len=128, global_batch_size=1, **NANOTRON)
    plain = make_job(LLAMA_TINY, gpus=2, tp=2, sp=True, training=training)
    kept = make_job(LLAMA_TINY, gpus=2, tp=2, sp=True, training={**training, "tp_gather_buffers": True})
    b = memory_estimate(kept).stages[0].breakdown
    assert b.value("buffers/tp_gather") == 131_072
    assert memory_estimate(plain).stages[0].breakdown.value("buffers/tp_gather") == 0
    assert layer_backward_workspace(plain, 0) - layer_backward_workspace(kept, 0) == 65_536
    no_sp = make_job(LLAMA_TINY, gpus=2, tp=2, sp=False, training={**training, "tp_gather_buffers": True})
    assert memory_estimate(no_sp).stages[0].breakdown.value("buffers/tp_gather") == 0


def test_megatron_fp8_backward_gather_by_hand():
    # Megatron fp8 (Transformer Engine), tp 2 with sequence parallel, 128 tokens x 256 hidden: the
    # backward gathers the column input's saved fp8 shards, 32,768 bytes. On Hopper (fp8 GEMMs
    # TN-only) the wgrad writes the transpose beside it, 32,768 more: the 16-bit size, 65,536. On
    # B200 (any layout) the gathered fp8 tensor alone: 32,768 bytes less than the 16-bit job's. MXFP8
    # gathers the column-wise data and its scales, 32,768 x 1.03125 = 33,792; NVFP4 the column-wise
    # usage, 32,768 x 0.5625 = 18,432. Under userbuffers the gather lands in the communicator's own
    # buffer and the workspace keeps today's 16-bit count.
    from cost_models.activations import gathered_input_bytes

    def job(cluster: str, **training):
        return make_job(LLAMA_TINY, gpus=2, tp=2, sp=True, cluster=cluster,
                        training=dict(seq_len=128, global_batch_size=1, **training))

    assert gathered_input_bytes(job("dgx-h100", precision="fp8", fp8_recipe="delayed")) == 2
    bf16, fp8 = job("dgx-b200"), job("dgx-b200", precision="fp8")
    assert layer_backward_workspace(bf16, 0) - layer_backward_workspace(fp8, 0) == 32_768
    mx, fp4 = job("dgx-b200", precision="fp8", fp8_recipe="mxfp8"), job("dgx-b200", precision="fp4")
    assert layer_backward_workspace(bf16, 0) - layer_backward_workspace(mx, 0) == 65_536 - 33_792
    assert layer_backward_workspace(bf16, 0) - layer_backward_workspace(fp4, 0) == 65_536 - 18_432
    assert gathered_input_bytes(job("dgx-b200", precision="fp8", tp_comm_overlap=True)) == 2


def test_pending_reduce_scatter_inputs_by_hand():
    # nanotron's row-parallel outputs freed ahead of the GPU: two whole 16-bit [128 tokens, 256]
    # outputs per layer, 65,536 bytes each. 4 layers, all within the launch queue's 1000 // 32 = 31:
    # 2 · 4 · 65,536 = 524,288 bytes pending. Without a pipeline the forward ends in the loss
    # (workspace 131,072), so that moment holds 131,072 + 524,288 = 655,360 beyond the activations,
    # 260,096 more than the peak's layer backward working set (395,264): reserved, not allocated.
    training = dict(seq_len=128, global_batch_size=1, tp_scatter_inputs_pending=True, **NANOTRON)
    job = make_job(LLAMA_TINY, gpus=2, tp=2, sp=True, training=training)
    assert pending_scatter_bytes(job, 0) == 524_288
    b = memory_estimate(job).stages[0].breakdown
    assert loss_workspace(job) == 131_072 and b.value("transient/layer_backward") == 395_264
    assert b.value("overhead/pending_collectives") == 260_096
    # 40 layers: the host stops 31 layers ahead of the GPU, 2 · 31 · 65,536 = 4,063,232
    deep = make_job(LLAMA_TINY.model_copy(update={"num_layers": 40}), gpus=2, tp=2, sp=True, training=training)
    assert pending_scatter_bytes(deep, 0) == 4_063_232
    # nothing is reduce-scattered at tp 1 or without sequence parallel, nor without the switch
    assert pending_scatter_bytes(make_job(LLAMA_TINY, gpus=1, training=training), 0) == 0
    assert pending_scatter_bytes(make_job(LLAMA_TINY, gpus=2, tp=2, sp=False, training=training), 0) == 0
    plain = make_job(LLAMA_TINY, gpus=2, tp=2, sp=True, training=dict(seq_len=128, global_batch_size=1, **NANOTRON))
    assert memory_estimate(plain).stages[0].breakdown.value("overhead/pending_collectives") == 0


def test_pending_reduce_scatter_inputs_reclaimed_before_out_of_memory():
    # the job of test_pending_reduce_scatter_inputs_by_hand: 260,096 bytes pending beyond the rest
    # of its peak. The allocator waits for them before a cudaMalloc would fail, so they are held only
    # up to the device's capacity: 100,000 bytes of room keep 100,000 of them; a stage already over
    # the capacity on its own keeps none; room for all changes nothing.
    training = dict(seq_len=128, global_batch_size=1, tp_scatter_inputs_pending=True, **NANOTRON)
    stage = memory_estimate(make_job(LLAMA_TINY, gpus=2, tp=2, sp=True, training=training)).stages[0]
    assert stage.breakdown.value("overhead/pending_collectives") == 260_096
    rest = stage.peak_bytes - 260_096
    capped = reclaimed_pending(stage, rest + 100_000)
    assert capped.breakdown.value("overhead/pending_collectives") == 100_000
    assert capped.peak_bytes == rest + 100_000
    assert capped.breakdown.value("activations") == stage.breakdown.value("activations")
    assert capped.dynamic_bytes == stage.dynamic_bytes > 0  # what the fragmentation fraction multiplies
    over = reclaimed_pending(stage, rest - 1)
    assert over.breakdown.value("overhead/pending_collectives") == 0 and over.peak_bytes == rest
    assert reclaimed_pending(stage, rest + 260_096) is stage


def test_pending_reduce_scatter_inputs_never_decide_the_fit_nor_move_with_headroom():
    # The same job on a device 100,000 bytes larger than the rest of its peak: the pending inputs
    # (260,096 bytes) fill the capacity beyond the rest, since the allocator frees them before failing,
    # whatever the headroom. The fit is judged without them: it fits with no headroom, and at 5% the
    # rest alone is above the usable memory.
    training = dict(seq_len=128, global_batch_size=1, tp_scatter_inputs_pending=True, **NANOTRON)
    job = make_job(LLAMA_TINY, gpus=2, tp=2, sp=True, training=training)
    rest = memory_estimate(job).stages[0].peak_bytes - 260_096
    small = job.cluster.spec.gpu.model_copy(update={"hbm_bytes": rest + 100_000})
    spec = job.cluster.spec.model_copy(update={"gpu": small})
    tight = dataclasses.replace(job, cluster=job.cluster.model_copy(update={"spec": spec}))
    at0, at5 = memory_estimate(tight, headroom=0.0), memory_estimate(tight)
    assert at0.required_bytes == at5.required_bytes == rest
    assert at0.peak_bytes == at5.peak_bytes == rest + 100_000
    assert at0.fits and not at5.fits


def test_pending_reduce_scatter_inputs_synced_per_stage_by_hand():
    # pp 2: each stage's 2 layers pend 2 · 2 · 65,536 = 262,144 bytes, since nanotron's pipeline
    # syncs the host at every send and receive. Rank 0 ends its forward with 2 micro-batches in
    # flight and 262,144 pending, below its first backward's 395,264 on the same micro-batches;
    # the last stage's loss (131,072) with them holds 393,216, below it too: no line on either.
    training = dict(seq_len=128, global_batch_size=4, tp_scatter_inputs_pending=True, **NANOTRON)
    job = make_job(LLAMA_TINY, gpus=4, tp=2, pp=2, sp=True, training=training)
    est = memory_estimate(job)
    assert [pending_scatter_bytes(job, r) for r in range(2)] == [262_144, 262_144]
    assert [s.breakdown.value("transient/layer_backward") for s in est.stages] == [395_264, 395_264]
    assert [s.breakdown.value("overhead/pending_collectives") for s in est.stages] == [0, 0]


def test_pending_reduce_scatter_inputs_at_the_backward_end_by_hand():
    # 16 tokens at tp 2, nanotron's gradients kept through the backward: its end, with every 16-bit
    # gradient of the stage (2 bytes · 1,648,896 parameters on the rank = 3,297,792), is the peak;
    # without a pipeline nothing syncs the host between the forward and the backward, so the GPU may
    # still owe the forward's 4 layers and the backward's 4 (8, within the queue's 31): 2 · 8 layers ·
    # 16 tokens · 256 · 2 bytes = 131,072 are held beside it
    training = dict(seq_len=16, global_batch_size=1, tp_scatter_inputs_pending=True, grads_kept_through_backward=True,
                    **NANOTRON)
    job = make_job(LLAMA_TINY, gpus=2, tp=2, sp=True, training=training)
    b = memory_estimate(job).stages[0].breakdown
    assert rank_params(job, 0).total == 1_648_896
    assert b.value("transient/stage_gradients") == 3_297_792
    assert b.value("overhead/pending_collectives") == 131_072
    assert pending_scatter_bytes(job, 0) == 65_536 and pending_scatter_bytes(job, 0, backward_end=True) == 131_072
    # with a pipeline the stage's backward starts behind the receive's sync: its own 2 layers only
    piped = make_job(LLAMA_TINY, gpus=4, tp=2, pp=2, sp=True, training={**training, "global_batch_size": 2})
    assert pending_scatter_bytes(piped, 0, backward_end=True) == pending_scatter_bytes(piped, 0) == 32_768


def test_eager_swiglu_keeps_one_more_ffn_wide_tensor_by_hand():
    # nanotron's silu(gate) * up on views of [gate|up] keeps [gate|up], silu(gate) and the product,
    # Megatron's fused kernel [gate|up] and the product: one more 16-bit f-wide tensor per layer,
    # 4 layers · 16 tokens · 688 · 2 bytes = 88,064 bytes on the one stage
    training = dict(seq_len=16, global_batch_size=1)
    fused = memory_estimate(make_job(LLAMA_TINY, gpus=1, training=training)).stages[0].breakdown
    eager = memory_estimate(make_job(LLAMA_TINY, gpus=1, training={**training, "eager_swiglu": True})).stages[0].breakdown
    assert eager.value("activations/layers") - fused.value("activations/layers") == 88_064


# KempnerForge's FSDP2 stack (TrainingSpec.bf16_params, fsdp_sync_last_microbatch, tp_replicated_vocab,
# loss_on_16bit_logits), framework torchtitan. LLAMA_TINY unpadded (torchtitan): embedding and output
# layer 1000·256 = 256,000 each, final norm 256, 4 layers of 692,736: n = 3,283,200 parameters.
TITAN = dict(framework="torchtitan")
# torchtitan before 83e69410 (and KempnerForge): the root unit holds the embedding, final norm and output layer
TITAN_ROOT = dict(TITAN, fsdp_split_root=False)


def test_bf16_params_halve_weights_gradients_and_adam_states_by_hand():
    # dp 2, fully sharded: bf16 weights and gradients 2·n/2 = 3,283,200 bytes each and AdamW's two
    # bf16 states 2·2·n/2 = 6,566,400, where FSDP2's fp32 parameters take twice as much
    def states(bf16):
        job = make_job(LLAMA_TINY, gpus=2, zero=3, training=dict(TITAN, seq_len=16, global_batch_size=2, bf16_params=bf16))
        return memory_estimate(job).stages[0].breakdown["model_states"]

    bf16, fp32 = states(True), states(False)
    assert (bf16.value("weights"), bf16.value("gradients"), bf16.value("optimizer_states")) == (3_283_200, 3_283_200, 6_566_400)
    assert bf16.value("master_weights") == 0
    assert fp32.value("weights") == 2 * bf16.value("weights")


def test_gradient_sync_on_the_last_micro_batch_keeps_fp32_unsharded_gradients_by_hand():
    # dp 2, 16-token micro-batches. Without accumulation FSDP2 holds the output layer's bf16 gradient
    # and one layer's with its fp32 copy: 2·256,256 + 6·692,736 = 4,668,928 bytes. With 4 micro-
    # batches synced on the last only, every parameter's fp32 unsharded gradient (4n = 13,132,800)
    # replaces the sharded fp32 gradients (4n/2 = 6,566,400, absent until the last reduce-scatter)
    def grads(batch, sync):
        job = make_job(LLAMA_TINY, gpus=2, zero=3, training=dict(TITAN_ROOT, seq_len=16, global_batch_size=batch,
                                                                  fsdp_sync_last_microbatch=sync))
        return memory_estimate(job).stages[0].breakdown.value("buffers/unsharded_grads")

    assert grads(8, False) == grads(2, True) == 4_668_928  # one micro-batch: nothing accumulates
    assert grads(8, True) == 4_668_928 + 13_132_800 - 6_566_400


def test_replicated_vocabulary_keeps_the_whole_embedding_on_every_tp_rank_by_hand():
    # tp 2: the embedding unsplit (256,000), the output layer column-parallel (128,000 + the norm's
    # 256) without a pipeline and whole (256,256) on the last pipeline stage
    job = make_job(LLAMA_TINY, gpus=2, tp=2, training=dict(TITAN, seq_len=16, global_batch_size=1, tp_replicated_vocab=True))
    assert (rank_params(job, 0).value("embedding"), rank_params(job, 0).value("head")) == (256_000, 128_256)
    job = make_job(LLAMA_TINY, gpus=4, tp=2, pp=2, training=dict(TITAN, seq_len=16, global_batch_size=8, tp_replicated_vocab=True))
    assert (rank_params(job, 0).value("embedding"), rank_params(job, 1).value("head")) == (256_000, 256_256)


def test_loss_on_16bit_logits_by_hand_and_refused_when_compiled():
    from cost_models.activations import head_activations
    from cost_models.errors import SpecError

    # 128 tokens x 1000 logits: the caller's 16-bit logits and log_softmax's 16-bit output kept
    # (4 bytes each), nll_loss's and log_softmax's 16-bit gradients on top (4 more)
    job = make_job(LLAMA_TINY, gpus=1, training=dict(TITAN, seq_len=128, global_batch_size=1, loss_on_16bit_logits=True))
    assert head_activations(job).value("logits") == loss_workspace(job) == 512_000
    with pytest.raises(SpecError, match="needs compile_loss=False"):
        make_job(LLAMA_TINY, gpus=1, training=dict(TITAN, compile=True, loss_on_16bit_logits=True))
    with pytest.raises(SpecError, match="bf16_params describes an FSDP2/DTensor plan"):
        make_job(LLAMA_TINY, gpus=1, training=dict(bf16_params=True))


def test_fsdp_loss_runs_without_the_layer_buffers_which_stay_reserved_by_hand():
    # dp 2, one 4096-token sequence, eager fp32 loss: 8 bytes per logit, 32,768,000, above one
    # layer's backward ((2·4096·256 + 3·4096·688)·2 = 21,102,592: two residual gradients and SwiGLU's
    # three f-wide ones, activations.layer_backward_workspace) plus the buffers only
    # that backward holds: the prefetched layer (torchtitan keeps its last one gathered) 2·692,736,
    # the output layer's bf16 gradient 2·256,256 and a layer's with its fp32 copy 6·692,736:
    # 6,054,400. At the loss the root (embedding, norm, output layer) and the last layer are the
    # gathered ones, 2·(512,256 + 692,736); the rest is reserved, not allocated, so the peak is
    # unchanged.
    job = make_job(LLAMA_TINY, gpus=2, zero=3, training=dict(TITAN_ROOT, seq_len=4096, global_batch_size=2))
    b = memory_estimate(job).stages[0].breakdown
    assert b.value("transient/loss_backward") == 32_768_000
    assert (b.value("buffers/unsharded_params"), b.value("buffers/unsharded_grads")) == (2_409_984, 0)
    assert b.value("overhead/cached_blocks") == 6_054_400
    assert b.value("buffers") + b.value("overhead/cached_blocks") == 2 * (512_256 + 2 * 692_736) + 4_668_928
    # KempnerForge hands fully_shard reshard_after_forward=True for every unit, the root as well
    # (torch >= 2.8 honours it on the root): nothing is gathered at the loss
    job = make_job(LLAMA_TINY, gpus=2, zero=3, training=dict(TITAN_ROOT, seq_len=4096, global_batch_size=2,
                                                              fsdp_reshard_after_forward=True))
    b = memory_estimate(job).stages[0].breakdown
    assert b.value("buffers/unsharded_params") == 0
    assert b.value("overhead/cached_blocks") == 2 * (512_256 + 2 * 692_736) + 4_668_928


def test_torchtitan_job_splits_the_root_as_the_launched_torchtitan_does_by_hand():
    # The same job on torchtitan as `planner launch` writes it (v0.2.2: the embedding and [norm,
    # output] units of their own, every layer resharded after its forward): at the loss only
    # [norm, output] is gathered, 2·256,256 = 512,512; the layers' backward then holds the current and
    # the prefetched layer, 2·2·692,736, and one layer's bf16 gradient with its fp32 copy, 6·692,736,
    # but not the output layer's gradient, reduce-scattered by its own unit before the layers' backward:
    # 6,927,360 reserved at the loss.
    def stage(**training):
        job = make_job(LLAMA_TINY, gpus=2, zero=3, training=dict(TITAN, seq_len=4096, global_batch_size=2, **training))
        return memory_estimate(job).stages[0].breakdown

    split = stage()
    assert (split.value("buffers/unsharded_params"), split.value("buffers/unsharded_grads")) == (512_512, 0)
    assert split.value("overhead/cached_blocks") == 2 * 2 * 692_736 + 6 * 692_736 == 6_927_360
    assert split.total < stage(fsdp_split_root=False).total
    # a tied output layer is the embedding's parameter, which FSDP2 gives one unit: the root keeps both
    # (256,000 + the norm's 256) and, as before the split, the last layer stays gathered at the loss
    tied = make_job(LLAMA_TINY.model_copy(update=dict(tie_embeddings=True)), gpus=2, zero=3,
                    training=dict(TITAN, seq_len=4096, global_batch_size=2))
    assert memory_estimate(tied).stages[0].breakdown.value("buffers/unsharded_params") == 2 * (256_256 + 692_736)


def test_whole_model_compile_returns_every_gradient_at_once_by_hand():
    # one GPU, no FSDP: the compiled model's backward hands back all n gradients together (bf16:
    # 2n = 6,566,400 bytes) beside the accumulated .grad, with only the caller's bf16 logits
    # (16 tokens x 1000 x 2 = 32,000) left of the activations; one micro-batch accumulates nothing
    def stage(batch):
        training = dict(TITAN, seq_len=16, global_batch_size=batch, compile=True, compile_loss=False, bf16_params=True,
                        loss_on_16bit_logits=True, compile_whole_model=True)
        return memory_estimate(make_job(LLAMA_TINY, gpus=1, zero=0, training=training)).stages[0].breakdown

    end = stage(4)
    assert end.value("transient/compiled_gradients") == 6_566_400 == end.value("model_states/gradients")
    assert end.value("activations") == end.value("activations/head") == 32_000
    # one micro-batch: the peak stays at the backward's start, one layer's working set, not the gradients
    start = stage(1)["transient"]
    assert [name for name, _ in start] == ["layer_backward"] and start.total < 1_000_000


def test_distributed_optimizer_construction_transient_by_hand():
    # Megatron, dp 8, distributed optimizer, n = 3,295,488 (vocabulary padded to 1024): at
    # construction the bf16 weights 2n, the fp32 grad buffer 4n and the fp32 master shards 4n/8, and
    # torch.tensor(storage) allocates the grad buffer's 4n again before pointing at it:
    # 6,590,976 + 2·13,181,952 + 1,647,744 = 34,602,624 bytes, above training's states
    # (2n + 4n + 12n/8 = 24,716,160) plus 16 tokens' activations
    training = dict(seq_len=16, global_batch_size=8, vocab_divisible_by=128)
    plain = memory_estimate(make_job(LLAMA_TINY, gpus=8, zero=1, training=training)).stages[0].breakdown
    init = memory_estimate(make_job(LLAMA_TINY, gpus=8, zero=1, training={**training, "param_buffer_init_copy": True})).stages[0].breakdown
    assert plain.value("model_states") == 24_716_160
    assert init.value("transient/param_buffer_init") == 13_181_952
    assert init.value("model_states") + init.value("transient") == 34_602_624
    assert init.value("model_states/optimizer_states") == 0 and init.value("activations") == 0
    # without the distributed optimizer there is no parameter buffer: nothing changes
    zero0 = [memory_estimate(make_job(LLAMA_TINY, gpus=8, zero=0, training={**training, "param_buffer_init_copy": b}))
             for b in (False, True)]
    assert zero0[0].peak_bytes == zero0[1].peak_bytes
    from cost_models.errors import SpecError

    with pytest.raises(SpecError, match="param_buffer_init_copy describes Megatron's distributed optimizer"):
        make_job(LLAMA_TINY, gpus=8, zero=3, training={**training, "framework": "torchtitan", "param_buffer_init_copy": True})


def test_nanotron_mha_keeps_the_whole_qkv_copy_by_hand():
    # multi-head attention (8 heads of 32 = 256 wide, k and v as wide as q): q stays a view of the
    # [q|k|v] copy, so its k and v parts, 16 tokens x 2 x 256 x 2 bytes = 16,384 per layer, are kept
    # beside Megatron's q, k, v: 65,536 over 4 layers; grouped-query attention copies q apart
    mha = LLAMA_TINY.model_copy(update={"num_kv_heads": 8})
    training = dict(seq_len=16, global_batch_size=1)

    def layers(model, kept):
        job = make_job(model, gpus=1, training={**training, "qkv_copy_kept": kept})
        return memory_estimate(job).stages[0].breakdown.value("activations/layers")

    assert layers(mha, True) - layers(mha, False) == 65_536
    assert layers(LLAMA_TINY, True) == layers(LLAMA_TINY, False)


def test_torch_pipelining_receive_buffers_and_stage_outputs_by_hand():
    # torchtitan, pp 2, dp 2, full recompute, 1024-token micro-batches, 4 of them (global batch 8 over
    # dp 2): one boundary tensor is 1024·256·2 = 524,288 bytes. Rank 0 (1F1B, 2 in flight) keeps its 2
    # stage outputs until their backward and 4 gradient receive buffers; rank 1 (the last, 1 in flight)
    # 4 activation receive buffers, one of which is its first layer's input, counted with the layers.
    a = 1024 * 256 * 2
    job = make_job(LLAMA_TINY, gpus=4, pp=2, zero=3, recompute="full",
                   training=dict(TITAN, seq_len=1024, global_batch_size=8))
    first, last = (s.breakdown for s in memory_estimate(job).stages)
    assert first.value("activations/stage_output") == 2 * a and first.value("buffers/pipeline_recv") == 4 * a
    assert last.value("activations/stage_output") == 0 and last.value("buffers/pipeline_recv") == 3 * a
    # Megatron's pipeline sends and frees per micro-batch: neither line
    meg = memory_estimate(make_job(LLAMA_TINY, gpus=4, pp=2, recompute="full",
                                   training=dict(seq_len=1024, global_batch_size=8))).stages[0].breakdown
    assert meg.value("activations/stage_output") == meg.value("buffers/pipeline_recv") == 0


def test_fsdp_under_torch_pipelining_has_no_sharded_gradients_at_the_peak_by_hand():
    # torchtitan's FSDP2 under PP keeps every gradient unsharded in fp32 (4 bytes a parameter) from
    # the first micro-batch's backward on; the sharded fp32 gradients (4n/dp) were set to None by
    # zero_grad and come only with the last reduce-scatter, so the line is 4n - 4n/2 with dp 2.
    job = make_job(LLAMA_TINY, gpus=4, pp=2, zero=3, recompute="full",
                   training=dict(TITAN, seq_len=1024, global_batch_size=8))
    for rank, stage in enumerate(memory_estimate(job).stages):
        n = rank_params(job, rank).total
        assert stage.breakdown.value("model_states/gradients") == 4 * n / 2
        assert stage.breakdown.value("buffers/unsharded_grads") == 4 * n - 4 * n / 2


def test_fsdp_under_torch_pipelining_keeps_the_sharded_gradients_blocks_reserved_by_hand():
    # The same job: the previous step's sharded gradients (4n/2 bytes, made on FSDP2's reduce-scatter
    # stream, freed by zero_grad) stay reserved beside the compute stream's peak, not allocated:
    # cached_blocks is those 4n/2 bytes (the stages cache nothing else: no loss blocks beside the
    # layers' on this job), and the allocated counter does not see them. Without a pipeline (FSDP2
    # syncs every backward) the peak counts them already (model_states).
    from cost_models.memory import allocator_counters, scatter_stream_grads

    job = make_job(LLAMA_TINY, gpus=4, pp=2, zero=3, recompute="full",
                   training=dict(TITAN, seq_len=1024, global_batch_size=8))
    for rank, stage in enumerate(memory_estimate(job).stages):
        n = rank_params(job, rank).total
        b = stage.breakdown
        assert scatter_stream_grads(job, b["model_states"]) == 4 * n / 2
        reserved, allocated = allocator_counters(b)
        assert reserved - allocated == b.value("overhead/fragmentation") + b.value("overhead/cached_blocks")
        assert b.value("overhead/cached_blocks") == 4 * n / 2
    flat = make_job(LLAMA_TINY, gpus=2, zero=3, recompute="full", training=dict(TITAN, seq_len=1024, global_batch_size=8))
    assert scatter_stream_grads(flat, memory_estimate(flat).stages[0].breakdown["model_states"]) == 0


def test_interleaved_backward_moments_by_hand():
    # pp 2, vpp 2, 4 micro-batches. Forward k runs chunk (k // 2) % 2: 0 0 1 1 0 0 1 1; backward k
    # chunk 1 - (k // 2) % 2: 1 1 0 0 1 1 0 0. Rank 0 warms up with (2-0-1)·2 + 2 = 4 forwards and
    # runs one more before each backward: before backward j it has run min(5 + j, 8) forwards.
    from cost_models.memory import interleaved_backward_moments

    moments = interleaved_backward_moments(2, 2, 4, 0)
    assert [(done, inflight) for done, inflight, _ in moments[:4]] == [
        ((3, 2), (3, 2)), ((4, 2), (4, 1)), ((4, 3), (4, 1)), ((4, 4), (3, 2))]
    # chunk 1 runs the first two backwards alone; chunk 0's first is backward 2
    assert [sorted(started) for _, _, started in moments[:3]] == [[1], [1], [0, 1]]
    # rank 1 warms up with 2 forwards (both on chunk 0): 2 and 1 in flight at its first backward
    assert interleaved_backward_moments(2, 2, 4, 1)[0][:2] == ((2, 1), (2, 1))


def test_interleaved_fsdp_gradients_come_chunk_by_chunk_by_hand():
    # torchtitan's FSDP2 under an interleaved pipeline makes each chunk's fp32 unsharded gradients at
    # that chunk's first backward. LLAMA_TINY, pp 2, vpp 2, dp 2, full recompute: one layer
    # (692,736 parameters) per chunk; rank 0's chunk 0 adds the embedding (256,000), rank 1's chunk 1
    # the output layer and final norm (256,256). The sharded gradients (4n/2) do not exist at the peak.
    training = dict(TITAN, global_batch_size=8)
    # seq 16, 4 micro-batches: one micro-batch through rank 0's chunk 0 keeps its layer's input
    # (16·256·2 = 8,192), its stage output (8,192) and the embedding's token ids (16·8 = 128): 16,512;
    # through chunk 1 16,384. Backward 0: 3·16,512 + 2·16,384 = 82,304 with chunk 1's gradients,
    # 4·692,736 = 2,770,944, below the sharded 4·1,641,472/2 = 3,282,944 (line 0); backward 2: 4·16,512 +
    # 16,384 = 82,432 with every gradient, the line 4·1,641,472 - 3,282,944 = 3,282,944: the peak
    job = make_job(LLAMA_TINY, gpus=4, pp=2, vpp=2, zero=3, recompute="full", training=dict(training, seq_len=16))
    first = memory_estimate(job).stages[0]
    assert first.inflight == (4, 1)
    assert first.breakdown.value("buffers/unsharded_grads") == 3_282_944
    assert first.breakdown.value("activations") == 82_432
    # seq 4096, 2 micro-batches (global batch 4): rank 1's chunk 1 holds the output layer's
    # activations (20,594,688 bytes beside its layer's 2,097,152), so its first backward, 2 micro-batches
    # of chunk 0 and 1 of chunk 1 with chunk 1's gradients only, 4·948,992 - 3,283,456 = 512,512, is
    # above chunk 0's first backward (2 of chunk 0 with every gradient)
    job = make_job(LLAMA_TINY, gpus=4, pp=2, vpp=2, zero=3, recompute="full",
                   training=dict(training, seq_len=4096, global_batch_size=4))
    last = memory_estimate(job).stages[1]
    assert last.inflight == (2, 1)
    assert last.breakdown.value("buffers/unsharded_grads") == 4 * 948_992 - 3_283_456


def test_interleaved_fsdp_gradients_of_the_last_chunk_count_the_mtp_modules_by_hand():
    # DeepSeek-V3 (h 7168, MTP depth 1) under torchtitan's FSDP2, pp 2, vpp 2 (15, 15, 15 and 16
    # decoder layers), ep 16, dp 16, 4 micro-batches. The MTP module sits on the last chunk of the last
    # rank: one decoder layer of layer 60's kind, the h x 2h eh_proj (2·7168² = 102,760,448) and three
    # RMSNorms (3·7168 = 21,504). With it the chunks sum to the rank's parameters, and rank 1's peak,
    # the first chunk's first backward with every chunk's fp32 gradients, holds 4 bytes of each less
    # the sharded gradients: 4·31,033,946,112 - 92,315,655,168 (without the module, 4·1,040,421,888
    # bytes less).
    from cost_models.memory import _chunk_params
    from cost_models.states import local_layer_params

    job = make_job("deepseek-v3", gpus=32, pp=2, ep=16, zero=3, recompute="full", pp_layout="Et*15|t*15|t*15|t*16L",
                   training=dict(TITAN, seq_len=4096, global_batch_size=64))
    decoder = sum(local_layer_params(job, i).total for i in job.stage_chunks[1][1])
    head = int(rank_params(job, 1).value("head"))
    assert _chunk_params(job, 1, 1) - decoder - head == local_layer_params(job, 60).total + 102_760_448 + 21_504
    for rank in range(2):
        assert _chunk_params(job, rank, 0) + _chunk_params(job, rank, 1) == rank_params(job, rank).total
    stage = memory_estimate(job).stages[1]
    assert rank_params(job, 1).total == 31_033_946_112
    assert stage.breakdown.value("model_states/gradients") == 92_315_655_168
    assert stage.breakdown.value("buffers/unsharded_grads") == 4 * 31_033_946_112 - 92_315_655_168


def test_the_last_stage_keeps_each_in_flight_micro_batchs_mtp_activations():
    # An MTP module on the last pipeline stage runs, per micro-batch, one more decoder layer, the 2h-wide
    # eh_proj input and one more output layer and loss; their activations stay alive until that
    # micro-batch's backward, like the layers'. LLAMA_TINY (4 layers, h 256, vocab 1000) at pp 2, tp 1,
    # mbs 1, seq 128, no recompute, with and without one MTP module: the last stage's kept activations
    # differ by its in-flight count (1 under 1F1B) times one layer's kept bytes + 2·128·256·2 + the
    # output layer's activations.
    from cost_models import activations as act
    from cost_models.memory import inflight_microbatches, layer_costs, stage_memory

    plain = make_job(LLAMA_TINY, gpus=2, pp=2, training=dict(seq_len=128, global_batch_size=8))
    mtp = make_job(LLAMA_TINY.model_copy(update=dict(mtp_layers=1)), gpus=2, pp=2, training=dict(seq_len=128, global_batch_size=8))
    assert inflight_microbatches(mtp, 1) == (1,)
    layer = layer_costs(mtp)[mtp.model.layer_kind(3), mtp.recompute_mode(0)].kept_bytes
    expected = layer + 2 * 128 * 256 * 2 + int(act.head_activations(mtp).total)
    gap = stage_memory(mtp, 1).breakdown.value("activations") - stage_memory(plain, 1).breakdown.value("activations")
    assert gap == expected
    assert stage_memory(mtp, 0).breakdown.value("activations") == stage_memory(plain, 0).breakdown.value("activations")


def test_torch_ring_attention_backward_grows_with_cp_by_hand():
    # LLAMA_TINY (h 256, 8 heads of 32, 2 KV heads, ffn 688) under torchtitan with cp 4 at seq 4096,
    # mbs 1: 1024 tokens per rank. q is 1024·256·2 = S = 524,288 bytes, and so are K and V once
    # repeat_kv has expanded them to the 8 query heads. The ring backward holds dq in fp32 (2S), the
    # contiguous K and V (2S), the all-gathered K|V of all 4 ranks (8S), next_kv (2S), the step's dq,
    # dk, dv (3S) and three fp32 dK|dV buffers (12S): 29S. Beside it the residual gradients in and out
    # (2S): 31S, above the MLP's moment, 2·1024·256·2 + 3·1024·688·2 = 5,275,648 bytes, which is
    # what cp 1 (the same 1024 tokens) and Megatron under cp 4 keep.
    s = 1024 * 256 * 2
    mlp = 2 * 1024 * 256 * 2 + 3 * 1024 * 688 * 2
    ring = make_job(LLAMA_TINY, gpus=4, cp=4, recompute="full", training=dict(TITAN, seq_len=4096))
    assert layer_backward_workspace(ring, 0) == 31 * s
    no_cp = make_job(LLAMA_TINY, gpus=4, recompute="full", training=dict(TITAN, seq_len=1024))
    megatron = make_job(LLAMA_TINY, gpus=4, cp=4, recompute="full", training=dict(seq_len=4096))
    assert layer_backward_workspace(no_cp, 0) == layer_backward_workspace(megatron, 0) == mlp


def test_pipeline_kept_outputs_by_hand():
    # torch.distributed.pipelining before pytorch/pytorch#153383 keeps every micro-batch's stage output
    # to the step's end. LLAMA_TINY under torchtitan, pp 2, dp 2, 4 micro-batches of 1024 tokens: rank 0
    # (1F1B, 2 in flight, already its stage_output line) keeps 2 more boundary tensors of
    # 1024·256·2 = 524,288 bytes; the last rank keeps the 16-bit logits of all 4 micro-batches,
    # 4·1024·1000·2 bytes, beside its loss's fp32 copy. Without the switch neither line; with pp 1 the
    # switch is refused.
    from cost_models.errors import SpecError

    training = dict(TITAN, seq_len=1024, global_batch_size=8)
    kept = make_job(LLAMA_TINY, gpus=4, pp=2, zero=3, recompute="full", training=dict(training, pipeline_keeps_outputs=True))
    first, last = (s.breakdown for s in memory_estimate(kept).stages)
    assert first.value("activations/kept_outputs") == 2 * 1024 * 256 * 2
    assert last.value("activations/kept_outputs") == 4 * 1024 * 1000 * 2
    plain = make_job(LLAMA_TINY, gpus=4, pp=2, zero=3, recompute="full", training=training)
    assert all("kept_outputs" not in dict(s.breakdown["activations"]) for s in memory_estimate(plain).stages)
    with pytest.raises(SpecError, match="pipeline_keeps_outputs describes torch.distributed.pipelining"):
        make_job(LLAMA_TINY, gpus=4, zero=3, training=dict(training, pipeline_keeps_outputs=True))


def test_scripted_bias_dropout_add_mask_at_zero_dropout_by_hand():
    # TrainingSpec.bda_mask_kept: GPT_TINY without dropout, Megatron, tp 2 with sequence parallel,
    # mbs 2 at seq 64: t = 128 tokens, the residual stream 128·256/2 = 16,384 elements per rank; each
    # block output keeps a 1-byte mask of it, 2 blocks a layer: 32,768 bytes per layer, x 4 layers =
    # 131,072 bytes more activations on the one stage. Without the flag nothing is kept at p = 0.
    no_dropout = GPT_TINY.model_copy(update={"hidden_dropout": 0.0, "attention_dropout": 0.0})
    training = dict(seq_len=64, global_batch_size=8, attention="flash")

    def layers(kept: bool) -> float:
        job = make_job(no_dropout, gpus=2, tp=2, sp=True, mbs=2, training={**training, "bda_mask_kept": kept})
        return memory_estimate(job).stages[0].breakdown.value("activations/layers")

    assert layers(True) - layers(False) == 131_072
    from cost_models.activations import layer_items

    job = make_job(no_dropout, gpus=2, tp=2, sp=True, mbs=2, training={**training, "bda_mask_kept": True})
    items = layer_items(job, 0)
    assert items.value("attention/dropout_mask") == items.value("mlp/dropout_mask") == 16_384
    # with dropout the mask is there already: the flag adds nothing
    dropout = [memory_estimate(make_job(GPT_TINY, gpus=2, tp=2, sp=True, mbs=2,
                                        training={**training, "bda_mask_kept": b})).peak_bytes for b in (False, True)]
    assert dropout[0] == dropout[1]
    from cost_models.errors import SpecError

    with pytest.raises(SpecError, match="bda_mask_kept describes Megatron's TorchScript bias-dropout-add"):
        make_job(no_dropout, gpus=2, tp=2, training={**training, "framework": "torchtitan", "bda_mask_kept": True})


def test_megatron_2023_loss_shift_beside_its_fp32_copy_by_hand():
    # TrainingSpec.loss_shift_beside_fp32_copy (Megatron-LM@0609f27f cross_entropy.py:24): GPT_TINY at
    # tp 2, mbs 2, seq 64: t = 128 tokens, the vocabulary padded to 1024 (a multiple of 128·tp), 512
    # columns per rank, 65,536 logits. Beside the saved fp32 softmax the loss's forward holds the
    # 16-bit logits (2 bytes) and their fp32 copy (4): 65,536 x 6 = 393,216 bytes, where the in-place
    # cross entropy has the 16-bit ones only, 65,536 x 2 = 131,072. (Megatron's default padding,
    # --make-vocab-size-divisible-by 128, set as vocab_divisible_by.)
    training = dict(seq_len=64, global_batch_size=8, vocab_divisible_by=128)

    def workspace(shift: bool) -> int:
        return loss_workspace(make_job(GPT_TINY, gpus=2, tp=2, sp=True, mbs=2,
                                       training={**training, "loss_shift_beside_fp32_copy": shift}))

    assert (workspace(False), workspace(True)) == (131_072, 393_216)
    from cost_models.errors import SpecError

    with pytest.raises(SpecError, match="loss_shift_beside_fp32_copy describes Megatron's vocab-parallel cross entropy"):
        make_job(GPT_TINY, gpus=2, tp=2, training={**training, "framework": "torchtitan", "loss_shift_beside_fp32_copy": True})


def test_tp_userbuffers_by_hand():
    # Megatron --tp-comm-overlap at tp 4 with sequence parallel, 128 tokens of hidden 256: Transformer
    # Engine's ten userbuffers, each [128, 256] = 32,768 elements. fp8: six all-gather buffers of
    # uint8 (196,608 bytes) and four bf16 reduce-scatter buffers (262,144 bytes) = 458,752 bytes.
    training = dict(seq_len=128, global_batch_size=4, framework="megatron", tp_comm_overlap=True)
    fp8 = make_job(LLAMA_TINY, gpus=4, tp=4, sp=True, training={**training, "precision": "fp8"})
    assert memory_estimate(fp8).stages[0].breakdown.value("buffers/tp_userbuffers") == 458_752
    # bf16: all ten in bf16, 10 · 32,768 · 2
    bf16 = make_job(LLAMA_TINY, gpus=4, tp=4, sp=True, training=training)
    assert memory_estimate(bf16).stages[0].breakdown.value("buffers/tp_userbuffers") == 655_360
    # fc2's forward reduce-scatter as a ring exchange: its buffer holds 2·4 − 1 = 7 chunks of 32 rows,
    # 7 · 8,192 · 2 = 114,688 bytes instead of 65,536
    ring = make_job(LLAMA_TINY, gpus=4, tp=4, sp=True,
                    training={**training, "precision": "fp8", "ub_ring_exchange_rs": ["fc2"]})
    assert memory_estimate(ring).stages[0].breakdown.value("buffers/tp_userbuffers") == 458_752 - 65_536 + 114_688
    # context parallel 2: each rank's buffers hold its 64 tokens, half as many bytes
    cp = make_job(LLAMA_TINY, gpus=8, tp=4, cp=2, sp=True, training={**training, "precision": "fp8"})
    assert memory_estimate(cp).stages[0].breakdown.value("buffers/tp_userbuffers") == 458_752 // 2
    # no overlap, no buffers; torchtitan's async TP is not Transformer Engine's
    plain = make_job(LLAMA_TINY, gpus=4, tp=4, sp=True, training={**training, "tp_comm_overlap": False})
    assert memory_estimate(plain).stages[0].breakdown.value("buffers/tp_userbuffers") == 0
    titan = make_job(LLAMA_TINY, gpus=2, tp=2, sp=True, training={**training, "framework": "torchtitan"})
    assert memory_estimate(titan).stages[0].breakdown.value("buffers/tp_userbuffers") == 0


def test_allocator_counters_leave_out_what_the_allocator_does_not_hold():
    # A torchtitan pipeline (FSDP2 gathers, pipelining's receive buffers): allocated = model states +
    # activations + transient + every buffer; reserved adds fragmentation, cached blocks and pending
    # reduce-scatter inputs; neither counts the CUDA context or NCCL's buffers
    from cost_models.memory import allocator_counters

    job = make_job(LLAMA_TINY, gpus=8, pp=2, training=dict(framework="torchtitan", seq_len=256, global_batch_size=16))
    b = memory_estimate(job).stages[0].breakdown
    assert b.value("buffers/pipeline_recv") > 0
    allocated = b.value("model_states") + b.value("activations") + b.value("transient") + b.value("buffers")
    reserved = allocated + b.value("overhead/fragmentation") + b.value("overhead/cached_blocks") + b.value("overhead/pending_collectives")
    assert allocator_counters(b) == (reserved, allocated)
    assert b.total - reserved == b.value("overhead/cuda_context") + b.value("overhead/nccl")


def test_llm_foundry_flash_path_keeps_the_padded_output_beside_the_kernels_and_the_unpad_indices():
    # 16 tokens, q 256 wide: out_proj keeps pad_input's output, 16 x 256 x 2 = 8,192 bytes, beside
    # the kernel's own unpadded one, and the three unpads keep 16 int64 row indices each, 384 bytes:
    # 8,576 per layer, 34,304 over 4 layers. Full recompute keeps neither
    def layers(on, recompute="none"):
        job = make_job(LLAMA_TINY, gpus=1, recompute=recompute, training=dict(
            TITAN, seq_len=16, global_batch_size=1, attention="flash", flash_unpad_copies=on))
        return memory_estimate(job).stages[0].breakdown.value("activations/layers")

    assert layers(True) - layers(False) == 34_304
    assert layers(True, "full") == layers(False, "full")
