"""Prices of the GPT-OSS and Llama 4 attention and MLP details: the clamped SwiGLU, attention sinks,
Llama 4's q/k L2 norm and NoPE temperature scaling. Each term hand-worked on a small shape, and its
direction on the full model."""

from __future__ import annotations

import pytest

from cost_models import kernels as K
from cost_models.activations import layer_activations
from cost_models.calibration import Calibration
from cost_models.compute import attention_backend, elementwise_seconds, mixer_kernels
from cost_models.enums import AttentionBackend, Recompute
from cost_models.errors import SpecError
from cost_models.model_spec import LayerKind
from cost_models.step_time import time_estimate
from planner import presets
from tests.helpers import LLAMA_TINY, make_job

CAL = Calibration()
CLAMPED = LLAMA_TINY.model_copy(update={"name": "clamped-tiny", "swiglu_limit": 7.0})


def _elementwise(spec, framework, backward=False, **training):
    job = make_job(spec, gpus=1, mbs=2, training=dict(seq_len=1024, global_batch_size=2, framework=framework, **training))
    return job, elementwise_seconds(job, LayerKind(), backward=backward, cal=CAL)


@pytest.mark.parametrize("framework, backward, moved, launches", [
    # eager (DeepSpeed + transformers GptOssExperts): 22 bytes and 5 kernels more per ffn element
    # forward, twice that backward
    ("deepspeed", False, 22, 5), ("deepspeed", True, 44, 10),
    # Megatron: two torch clamps and a cat ahead of the fused kernel (16 bytes, 3 kernels); backward
    # the clamps' gradients (12 bytes, 2 kernels)
    ("megatron", False, 16, 3), ("megatron", True, 12, 2),
])
def test_clamped_swiglu_moves_its_clamps_bytes(framework, backward, moved, launches):
    """LLAMA_TINY's MLP is 688 wide: tokens 2·1024 = 2048, ffn elements 2048·688 = 1,409,024 on one
    GPU. The clamped model's memory-bound time exceeds plain SwiGLU's by those elements times the
    bytes above at the stream fraction of HBM bandwidth, plus the kernels' start-up."""
    job, clamped = _elementwise(CLAMPED, framework, backward)
    _, plain = _elementwise(LLAMA_TINY, framework, backward)
    gpu = job.cluster.gpu
    elements = 2 * 1024 * 688
    expected = elements * moved / (gpu.hbm_bandwidth_bytes_per_s * K.table_for(gpu).stream_fraction) + launches * K.table_for(gpu).launch_s
    assert clamped - plain == pytest.approx(expected, rel=1e-9)  # float sums of the same terms


def test_compiled_clamps_fuse_into_the_activation():
    """torch.compile fuses the clamps into one kernel with SwiGLU's compulsory bytes: no difference."""
    _, clamped = _elementwise(CLAMPED, "torchtitan", compile=True)
    _, plain = _elementwise(LLAMA_TINY, "torchtitan", compile=True)
    assert clamped == plain


@pytest.mark.parametrize("framework, widths", [("megatron", 2), ("deepspeed", 3)])
def test_clamped_swiglu_keeps_its_clamps_inputs(framework, widths):
    """Saved for backward beyond SwiGLU: Megatron's clamps keep fc1's two halves (2 widths), the
    eager chain the clamps' inputs, the sigmoid, up + 1 (3 more than eager SwiGLU): 2048 tokens x
    688 x widths x 2 bytes (5,636,096 bytes for 2 widths)."""
    job = make_job(CLAMPED, gpus=1, mbs=2, training=dict(seq_len=1024, global_batch_size=2, framework=framework))
    plain = make_job(LLAMA_TINY, gpus=1, mbs=2, training=dict(seq_len=1024, global_batch_size=2, framework=framework))
    extra = layer_activations(job, 0, Recompute.NONE).total - layer_activations(plain, 0, Recompute.NONE).total
    assert extra == 2048 * 688 * widths * 2


@pytest.mark.parametrize("framework", ["megatron", "deepspeed"])
def test_gpt_oss_is_slower_than_with_plain_swiglu(framework):
    """gpt-oss-20b on 8 GPUs (ep 8): the clamps' bytes make its step slower than the same model with
    an unclamped SwiGLU, and by less than 10%: the clamps move at most 66 bytes per expert ffn
    element over forward and backward (eager) where the experts' GEMMs do 6·h = 17,280 FLOPs."""
    oss = presets.models()["gpt-oss-20b"]
    plain = oss.model_copy(update={"swiglu_limit": None})
    steps = []
    for spec in (oss, plain):
        job = make_job(spec, gpus=8, ep=8, mbs=1, zero=1, training=dict(seq_len=4096, global_batch_size=64, framework=framework,
                                                                           attention="eager" if framework == "deepspeed" else "flash"))
        steps.append(time_estimate(job).step_s)
    assert steps[1] < steps[0] < steps[1] * 1.10


SINKS = LLAMA_TINY.model_copy(update={"name": "sinks-tiny", "attention_sinks": True})


def _attention(spec, framework, attention, **layout):
    job = make_job(spec, gpus=1, mbs=2, **layout,
                   training=dict(seq_len=1024, global_batch_size=2, framework=framework, attention=attention))
    return job, mixer_kernels(job, LayerKind(), CAL)


def test_eager_sinks_move_the_scores_five_more_times():
    """Eager attention with sinks (transformers' GptOss eager_attention_forward): the cat with the
    sink column (read + write) and the row-max subtraction (max read, subtract read + write) are 5
    more passes over the 16-bit scores, forward and backward. LLAMA_TINY: 2 sequences x 8 heads x
    1024² = 16,777,216 scores, x 2 bytes x 5 = 167,772,160 bytes at the stream fraction."""
    job, sinks = _attention(SINKS, "deepspeed", "eager")
    _, plain = _attention(LLAMA_TINY, "deepspeed", "eager")
    gpu = job.cluster.gpu
    expected = 167_772_160 / (gpu.hbm_bandwidth_bytes_per_s * K.table_for(gpu).stream_fraction)
    assert sinks.forward_s - plain.forward_s == pytest.approx(expected, rel=1e-9)
    assert sinks.backward_s - plain.backward_s == pytest.approx(expected, rel=1e-9)


def test_fused_sinks_add_their_gradient_reduction_to_the_backward():
    """cuDNN takes the sink logits in its kernels (Megatron, Transformer Engine FusedAttention): the
    forward is unchanged; the backward reads the fp32 log-sum-exp and rowsum(dO·O) once more per row
    for d sink: 2 x 8 heads x 1024 rows x 8 bytes = 131,072 bytes."""
    job, sinks = _attention(SINKS, "megatron", "flash")
    _, plain = _attention(LLAMA_TINY, "megatron", "flash")
    assert attention_backend(job) is AttentionBackend.CUDNN
    gpu = job.cluster.gpu
    assert sinks.forward_s == plain.forward_s
    expected = 131_072 / (gpu.hbm_bandwidth_bytes_per_s * K.table_for(gpu).stream_fraction)
    assert sinks.backward_s - plain.backward_s == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("framework, per_row", [("deepspeed", 2 + 8), ("megatron", 2)])
def test_eager_sinks_keep_their_column(framework, per_row):
    """Eager softmax over s + 1 columns keeps one 16-bit column more per row; transformers' row-max
    subtraction keeps an int64 index per row: 2 x 8 heads x 1024 rows x per_row bytes."""
    def saved(spec):
        job = make_job(spec, gpus=1, mbs=2, training=dict(seq_len=1024, global_batch_size=2, framework=framework, attention="eager"))
        return layer_activations(job, 0, Recompute.NONE).total
    assert saved(SINKS) - saved(LLAMA_TINY) == 2 * 8 * 1024 * per_row


@pytest.mark.parametrize("layout, training, message", [
    (dict(), dict(attention_backend="fa3"), "Transformer Engine disables FlashAttention for softmax_type learnable"),
    (dict(cp=2), dict(), "FusedAttention takes them only with cp_comm_type a2a"),
])
def test_megatron_sinks_refuse_flash_attention_and_the_p2p_ring(layout, training, message):
    with pytest.raises(SpecError, match=message):
        make_job(SINKS, gpus=2, mbs=1, **layout, training=dict(seq_len=1024, global_batch_size=4, framework="megatron", **training))


def _layer_elementwise(spec, framework, kind, backward=False):
    job = make_job(spec, gpus=1, mbs=2, training=dict(seq_len=1024, global_batch_size=2, framework=framework))
    return job, elementwise_seconds(job, kind, backward=backward, cal=CAL)


@pytest.mark.parametrize("framework, backward, moved, launches", [
    # eager Llama4TextL2Norm: 32 bytes in 5 kernels, backward twice that
    ("deepspeed", False, 32, 5), ("deepspeed", True, 64, 10),
    # Megatron's jit-fused L2Norm: a norm's compulsory bytes (4 forward, 6 backward) in one kernel
    ("megatron", False, 4, 1), ("megatron", True, 6, 1),
])
def test_llama4_qk_l2_norm_on_rotary_layers(framework, backward, moved, launches):
    """q and k of a rotary layer: (q 256 + k 2 x 32) x 2048 tokens = 655,360 elements."""
    l2 = LLAMA_TINY.model_copy(update={"name": "l2-tiny", "qk_l2_norm": True})
    job, with_norm = _layer_elementwise(l2, framework, LayerKind(), backward)
    _, plain = _layer_elementwise(LLAMA_TINY, framework, LayerKind(), backward)
    gpu = job.cluster.gpu
    expected = 655_360 * moved / (gpu.hbm_bandwidth_bytes_per_s * K.table_for(gpu).stream_fraction) + launches * K.table_for(gpu).launch_s
    assert with_norm - plain == pytest.approx(expected, rel=1e-9)
    # a NoPE layer has none
    assert _layer_elementwise(l2, framework, LayerKind(rope=False), backward)[1] == _layer_elementwise(
        LLAMA_TINY, framework, LayerKind(rope=False), backward)[1]


def test_llama4_temperature_scales_the_nope_layers_queries():
    """Eager: q·scales in fp32 and the cast back, 12 bytes in 2 kernels per query element, 256 x
    2048 = 524,288 elements on a NoPE layer; nothing on a rotary layer."""
    tuned = LLAMA_TINY.model_copy(update={"name": "temp-tiny", "attn_temperature_tuning": True})
    job, with_scale = _layer_elementwise(tuned, "deepspeed", LayerKind(rope=False))
    _, plain = _layer_elementwise(LLAMA_TINY, "deepspeed", LayerKind(rope=False))
    gpu = job.cluster.gpu
    expected = 524_288 * 12 / (gpu.hbm_bandwidth_bytes_per_s * K.table_for(gpu).stream_fraction) + 2 * K.table_for(gpu).launch_s
    assert with_scale - plain == pytest.approx(expected, rel=1e-9)
    assert _layer_elementwise(tuned, "deepspeed", LayerKind())[1] == _layer_elementwise(LLAMA_TINY, "deepspeed", LayerKind())[1]


def test_llama4_qk_l2_norm_keeps_a_norms_input():
    """DeepSpeed (eager, 6 bytes per element kept: the fp32 upcast and the 16-bit output) on rows of
    q and k heads: 2048 tokens x (8 + 2) heads = 20,480 rows of 32: 20,480 x 32 x 6 + 20,480 x 4
    (fp32 rstd) = 4,014,080 bytes on a rotary layer."""
    l2 = LLAMA_TINY.model_copy(update={"name": "l2-tiny", "qk_l2_norm": True})

    def saved(spec):
        job = make_job(spec, gpus=1, mbs=2, training=dict(seq_len=1024, global_batch_size=2, framework="deepspeed"))
        return layer_activations(job, 0, Recompute.NONE).total
    assert saved(l2) - saved(LLAMA_TINY) == 4_014_080


def test_llama4_scout_is_slower_with_its_attention_details():
    """llama-4-scout-17b-16e (DeepSpeed, eager ops): its L2 norms and NoPE query scaling make the
    step slower than the same model without them."""
    scout = presets.models()["llama-4-scout-17b-16e"]
    bare = scout.model_copy(update={"qk_l2_norm": False, "attn_temperature_tuning": False})
    steps = []
    for spec in (scout, bare):
        job = make_job(spec, gpus=16, ep=16, etp=1, mbs=1, zero=3,
                       training=dict(seq_len=8192, global_batch_size=64, framework="deepspeed"))
        steps.append(time_estimate(job).step_s)
    assert steps[0] > steps[1]


def test_swiglu_limit_needs_a_swiglu_mlp():
    with pytest.raises(ValueError, match="swiglu_limit clamps a SwiGLU MLP; mlp is gelu"):
        LLAMA_TINY.model_validate({**LLAMA_TINY.model_dump(), "mlp": "gelu", "swiglu_limit": 7.0})


def test_validate_worker_runs_gpt_oss_clamped_experts_as_transformers():
    """validate's worker trains GPT-OSS's clamped SwiGLU: its Experts (gate in w1, up in w3) give
    transformers' GptOssExperts output (interleaved gate/up columns) with the same weights, inputs
    large enough that the clamps at ±7 bite. fp32; 1e-5 for sums in another order."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from planner.validate import worker
    from planner.validate.slices import model_doc

    spec = presets.models()["gpt-oss-20b"]
    m = model_doc(spec)
    assert (m["swiglu_limit"], m["swiglu_alpha"]) == (7.0, 1.702)
    cfg = transformers.GptOssConfig(hidden_size=16, intermediate_size=8, num_local_experts=2, num_experts_per_tok=1,
                                    swiglu_limit=m["swiglu_limit"], swiglu_alpha=m["swiglu_alpha"])
    hf = transformers.models.gpt_oss.modeling_gpt_oss.GptOssExperts(cfg)
    ours = worker.Experts(2, 16, 8, "swiglu", True, worker._clamp(m))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
        ours.w1.copy_(hf.gate_up_proj[..., ::2])
        ours.w3.copy_(hf.gate_up_proj[..., 1::2])
        ours.b1.copy_(hf.gate_up_proj_bias[..., ::2])
        ours.b3.copy_(hf.gate_up_proj_bias[..., 1::2])
        ours.w2.copy_(hf.down_proj)
        ours.b2.copy_(hf.down_proj_bias)
    x = 3 * torch.randn(6, 16, generator=gen)
    route = torch.tensor([0, 0, 0, 1, 1, 1])[:, None]
    want = hf(x, route, torch.ones(6, 1))
    got = ours(x, [3, 3])
    pre = x @ hf.gate_up_proj[0]
    assert (pre.abs() > 7).any()  # the clamps act
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
