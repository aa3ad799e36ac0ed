"""Time of the math on one GPU: GEMMs and attention by tensor-core throughput, elementwise work by
HBM bandwidth.

A GEMM runs at peak x gemm_efficiency x d/(d + n½), d its smallest dimension (small or skinny
GEMMs fill fewer tiles and waves; Hockney's half-performance length), and never faster than
moving its operands through HBM (roofline, Williams et al. 2009). fp8 GEMMs use the fp8 peak and
their own efficiency; where the framework casts operands to fp8 in kernels of their own
(torchao), those casts are priced as elementwise traffic. Attention kernels run at attention_efficiency of the 16-bit peak (flash) or
as two batched GEMMs plus the softmax's memory traffic (eager).

Elementwise kernels (norms, residual adds, rotary embedding, activation functions, dropout,
softmax, loss, optimizer) are priced by the bytes they read and write over hbm_efficiency x HBM
bandwidth; the counts are per token and listed with each function.
"""

from __future__ import annotations

from dataclasses import dataclass

from cost_models.calibration import Calibration
from cost_models.enums import AttentionKernel, Fp8Recipe, Framework, MLPKind, NormKind, OptimizerKind, PositionKind, Precision
from cost_models.flops import Attention, Gemm, core_attention, expert_tokens_per_gpu, head_gemm, layer_gemms, tokens
from cost_models.hardware import GPUSpec
from cost_models.job import Job
from cost_models.states import padded_vocab

ACT_BYTES = 2  # bf16/fp16 activations and GEMM operands (fp8 operands: 1)


def _peak(gpu: GPUSpec, precision: Precision) -> float:
    p = gpu.peak_flop_per_s
    if precision is Precision.FP8 and p.fp8:
        return p.fp8
    return p.fp16 if precision is Precision.FP16 else p.bf16


def gemm_time(
    g: Gemm, gpu: GPUSpec, precision: Precision, cal: Calibration, recipe: Fp8Recipe = Fp8Recipe.TENSORWISE
) -> float:
    fp8 = precision is Precision.FP8 and gpu.peak_flop_per_s.fp8 is not None
    eff = cal.efficiency("fp8_gemm_efficiency" if fp8 else "gemm_efficiency", gpu.architecture)
    if fp8 and recipe is Fp8Recipe.ROWWISE:
        eff *= cal.fp8_rowwise_gemm_ratio
    d = min(g.m, g.n, g.k)
    rate = _peak(gpu, precision) * eff * d / (d + cal.gemm_half_dim)
    operand = 1 if fp8 else ACT_BYTES
    moved = g.count * (operand * (g.m * g.k + g.k * g.n) + ACT_BYTES * g.m * g.n)
    return max(g.flop / rate, moved / (gpu.hbm_bandwidth_bytes_per_s * cal.hbm_efficiency))


def attention_efficiency(job: Job, cal: Calibration) -> float:
    """Fraction of the 16-bit peak the fused attention kernel reaches: Transformer Engine's (Megatron)
    where it is calibrated for the architecture, else the flash-attention kernels' (PyTorch SDPA in
    torchtitan, flash-attn in other stacks)."""
    arch = job.cluster.gpu.architecture
    if job.training.framework is Framework.MEGATRON and arch in cal.te_attention_efficiency:
        return cal.te_attention_efficiency[arch]
    return cal.efficiency("attention_efficiency", arch)


def attention_time(a: Attention, job: Job, cal: Calibration) -> float:
    """Forward core attention. Flash: one fused kernel. Eager: QKᵀ and PV as batched GEMMs, plus the
    scores' trips through HBM (scale+mask+softmax reads and writes them; dropout reads them, writes
    them and a 1-byte mask; PV reads them)."""
    gpu, precision = job.cluster.gpu, job.training.precision
    if job.training.attention is AttentionKernel.FLASH:
        return a.flop / (_peak(gpu, Precision.BF16) * attention_efficiency(job, cal))
    scores = Gemm("scores", a.q_len, a.k_len, a.head_dim, a.batch_heads)
    context = Gemm("context", a.q_len, a.head_dim, a.k_len, a.batch_heads)
    elements = a.batch_heads * a.q_len * a.k_len
    passes = 2 + (2 + 2.5 if job.model.attention_dropout > 0 else 0)  # r/w softmax, r/w + mask dropout
    traffic = elements * ACT_BYTES * passes
    return (
        gemm_time(scores, gpu, precision, cal)
        + gemm_time(context, gpu, precision, cal)
        + traffic / (gpu.hbm_bandwidth_bytes_per_s * cal.hbm_efficiency)
    )


@dataclass(frozen=True)
class ElementwiseBytes:
    """Bytes one elementwise op moves per element of its output, in 16-bit activations.

    Fused kernels (Transformer Engine / apex in Megatron, torch.compile'd code) read their input
    once and write once. Eager PyTorch code runs each arithmetic op as its own kernel:
    RMSNorm as x.float() (r2 w4), pow (r4 w4), mean (r4), x·rsqrt (r4 w4), .type_as (r4 w2),
    ·weight (r2 w2) = 36 (torchtitan's and Hugging Face's RMSNorm); rotary embedding as .float(),
    view_as_complex·freqs, view_as_real, .type_as = 20; SwiGLU as silu(gate) (r2 w2) then ·up
    (r4 w2) = 10 per ffn element. torch.nn.LayerNorm and GELU are single native kernels either way.
    """

    rmsnorm: int
    layernorm: int
    rope: int
    swiglu: int
    gelu: int
    residual_add: int  # reads two, writes one
    dropout: int  # reads, writes, and writes a 1-byte mask


FUSED = ElementwiseBytes(rmsnorm=4, layernorm=4, rope=4, swiglu=6, gelu=4, residual_add=6, dropout=5)
EAGER = ElementwiseBytes(rmsnorm=36, layernorm=4, rope=20, swiglu=10, gelu=4, residual_add=6, dropout=5)


def elementwise_convention(job: Job) -> ElementwiseBytes:
    fw = job.training.framework
    if fw is Framework.MEGATRON or job.training.compile:
        return FUSED
    return EAGER


def elementwise_bytes_per_layer(job: Job, *, moe: bool) -> float:
    """Bytes elementwise kernels move in one layer's forward for one micro-batch on one GPU.

    Residual stream (width h, split over tp with sequence parallel): two norms, two residual adds,
    dropout on the two branch outputs when dropout > 0. Per tp rank: rotary embedding of q and k,
    the MLP activation (per ffn element), and for MoE the dispatch permutation and the weighted
    combine of every routed token copy (read and write, twice: 8 bytes per element of width h).
    """
    m, lay = job.model, job.layout
    c = elementwise_convention(job)
    t = tokens(job)
    residual_tokens = t / (lay.tp if job.sp else 1)
    h = m.hidden_size
    norm = c.rmsnorm if m.norm is NormKind.RMSNORM else c.layernorm
    residual = (2 * norm + 2 * c.residual_add + (2 * c.dropout if m.hidden_dropout > 0 else 0)) * h * residual_tokens
    rope = c.rope * (m.q_width + m.kv_width) / lay.tp * t if m.position_embedding is PositionKind.ROPE else 0.0
    act = c.swiglu if m.mlp is MLPKind.SWIGLU else c.gelu
    if moe:
        assert m.moe is not None
        routed = expert_tokens_per_gpu(job)
        mlp = act * m.moe.expert_ffn_hidden_size / job.etp * routed + 8 * h * routed
        if m.moe.num_shared_experts:
            mlp += act * m.moe.num_shared_experts * m.moe.shared_width / lay.tp * t
    else:
        mlp = act * m.ffn_hidden_size / lay.tp * t
    return residual + rope + mlp


# Cross-entropy on fp32 logits, per logit over forward and backward: read the 16-bit logits (2),
# write and re-read the fp32 softmax (4 + 4), write the fp32 gradient (4) and its 16-bit copy (2).
LOSS_BYTES_PER_LOGIT = 16


def loss_time(job: Job, cal: Calibration) -> float:
    vocab = -(-padded_vocab(job) // job.layout.tp)
    moved = tokens(job) * vocab * LOSS_BYTES_PER_LOGIT
    return moved / (job.cluster.gpu.hbm_bandwidth_bytes_per_s * cal.hbm_efficiency)


def elementwise_time(job: Job, *, moe: bool, cal: Calibration) -> float:
    return elementwise_bytes_per_layer(job, moe=moe) / (job.cluster.gpu.hbm_bandwidth_bytes_per_s * cal.hbm_efficiency)


# A dynamically scaled cast to fp8 reads its 16-bit input twice (the amax reduction, then the
# scaled cast: the scale depends on the whole tensor or row, so the two cannot share a pass) and
# writes 1 byte per element.
FP8_CAST_BYTES = 5


def fp8_casts_separate(job: Job) -> bool:
    """Whether fp8 casts run as kernels of their own. torchao (torchtitan) casts each operand of
    each of the three GEMMs of a linear, forward and backward (torchao "Quantized Training" docs:
    to_fp8 of input and weight; of grad_output and weight; of input.t and grad_output).
    Transformer Engine (Megatron, DeepSpeed) emits fp8 from the kernel that produces the
    activation (LayerNormLinear, fused bias-activation) and casts weights once per step, so its
    casts are not counted."""
    tr = job.training
    return tr.precision is Precision.FP8 and tr.framework is Framework.TORCHTITAN and job.cluster.gpu.peak_flop_per_s.fp8 is not None


def fp8_cast_bytes(job: Job, *, moe: bool) -> tuple[float, float]:
    """Bytes the fp8 casts of one layer move for one micro-batch, (forward, backward). A GEMM
    (m x k)·(k x n) casts input and weight forward (mk + kn), and grad_output twice, weight and
    input backward (2mn + kn + mk)."""
    if not fp8_casts_separate(job):
        return 0.0, 0.0
    gemms = layer_gemms(job, moe=moe)
    fwd = sum(g.count * (g.m * g.k + g.k * g.n) for g in gemms)
    bwd = sum(g.count * (2 * g.m * g.n + g.k * g.n + g.m * g.k) for g in gemms)
    return FP8_CAST_BYTES * fwd, FP8_CAST_BYTES * bwd


@dataclass(frozen=True)
class LayerTime:
    """Forward seconds of one decoder layer for one micro-batch on one GPU, by kind of work;
    fp8_cast_backward is the backward's casts, which do not scale with the forward's bytes."""

    gemm: float
    attention: float
    elementwise: float
    fp8_cast: float = 0.0
    fp8_cast_backward: float = 0.0

    @property
    def total(self) -> float:
        return self.gemm + self.attention + self.elementwise + self.fp8_cast


def layer_time(job: Job, *, moe: bool, cal: Calibration) -> LayerTime:
    gpu, precision, recipe = job.cluster.gpu, job.training.precision, job.training.fp8_recipe
    hbm = gpu.hbm_bandwidth_bytes_per_s * cal.hbm_efficiency
    cast_fwd, cast_bwd = fp8_cast_bytes(job, moe=moe)
    return LayerTime(
        gemm=sum(gemm_time(g, gpu, precision, cal, recipe) for g in layer_gemms(job, moe=moe)),
        attention=attention_time(core_attention(job), job, cal),
        elementwise=elementwise_time(job, moe=moe, cal=cal),
        fp8_cast=cast_fwd / hbm,
        fp8_cast_backward=cast_bwd / hbm,
    )


def head_time(job: Job, cal: Calibration) -> float:
    """Output layer GEMM forward (in the model's compute precision: Megatron/TE keep the output
    layer in 16 bits, so does torchtitan's float8 conversion)."""
    return gemm_time(head_gemm(job), job.cluster.gpu, Precision.BF16, cal)


# Optimizer step, bytes per parameter a rank updates. AdamW (torch fused/multi-tensor and Megatron
# FusedAdam): read fp32 param, grad, exp_avg, exp_avg_sq (16), write param, exp_avg, exp_avg_sq
# (12), write the 16-bit working copy (2); gradient-norm clipping reads the grads twice (8).
# SGD with momentum: read param, grad, momentum (12), write param, momentum (8), copy (2), clip (8).
OPTIMIZER_BYTES_PER_PARAM = {OptimizerKind.ADAMW: 38, OptimizerKind.ADAM: 38, OptimizerKind.SGD: 30}


def optimizer_time(job: Job, params: float, cal: Calibration) -> float:
    moved = params * OPTIMIZER_BYTES_PER_PARAM[job.training.optimizer]
    return moved / (job.cluster.gpu.hbm_bandwidth_bytes_per_s * cal.hbm_efficiency)
