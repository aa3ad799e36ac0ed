"""Time of the math on one GPU: every kernel of a layer pass, priced by cost_models.kernels.

A layer pass is a list of kernels whose shapes come from the job (flops.py): the GEMMs of the
forward and the dgrad/wgrad GEMMs of the backward at their own shapes; the fused attention kernel
of the framework's family, forward and backward, cut into ring steps under context parallelism;
the memory-bound ops (norms, residual adds, rotary embedding, activation, dropout, MoE permutation)
with their compulsory bytes and the implementation the framework runs (a fused kernel, torch's
native op, or eager PyTorch's chain of elementwise kernels); fp8 casts where the framework runs
them as kernels of their own; the loss; the optimizer step. Which implementation a framework uses is
data (FRAMEWORK_IMPLEMENTATIONS), each choice with its source.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum

from cost_models import kernels as K
from cost_models.activations import CONVENTIONS, MXFP8_BYTES, NVFP4_BYTES, operand_bytes
from cost_models.calibration import Calibration
from cost_models.enums import (
    AttentionBackend,
    AttentionKernel,
    Fp8Recipe,
    Framework,
    MixerKind,
    NormKind,
    OptimizerKind,
    PositionKind,
    Precision,
)
from cost_models.flops import (
    FLASH_BACKWARD_FACTOR, Gemm, attended_pairs, core_attention, expert_tokens_per_gpu, head_gemm, layer_gemms,
    mamba_local, mask_tensor_attention, ssd_gemms, tokens,
)
from cost_models.hardware import GPUSpec
from cost_models.job import Job
from cost_models.mamba_shard import all_to_all_widths
from cost_models.model_spec import LayerKind
from cost_models.states import convention, local_kv_heads, local_vocab

ACT_BYTES = 2  # bf16/fp16 activations and GEMM operands (fp8 operands: 1)
FP32 = 4


# --- which kernels a framework runs ---------------------------------------------------------------


class Impl(StrEnum):
    FUSED = "fused"  # one kernel reading inputs and writing outputs once (TE, apex, Triton, Liger)
    TORCH = "torch"  # torch's native single-kernel op (nn.LayerNorm)
    COMPILE = "compile"  # torch.compile's generated kernels
    MEGATRON = "megatron"  # Megatron's own fused kernels (bias-SwiGLU, vocab-parallel cross entropy)
    # Megatron's vocab-parallel cross entropy without --cross-entropy-loss-fusion, its separate eager
    # kernels (TrainingSpec.cross_entropy_unfused), priced at their measured rate
    MEGATRON_UNFUSED = "megatron.unfused"
    EAGER = "eager"  # eager PyTorch: one kernel per arithmetic op
    # eager PyTorch on strided views of one merged tensor (the halves torch.split or torch.chunk
    # cut from a fused [gate|up] output): priced at the op's measured rate where the generation has
    # one, else as the eager chain
    SPLIT = "split"


def attention_backend(job: Job) -> AttentionBackend:
    """The fused attention family a flash job runs, unless the training spec names one.

    Megatron (Transformer Engine DotProductAttention) prefers cuDNN's FusedAttention over
    flash-attn on sm90 and newer when both support the shapes, and flash-attn on Ampere
    (NVIDIA/TransformerEngine@d0067d0d transformer_engine/pytorch/attention/dot_product_attention/
    utils.py, "Disabling FlashAttention to give FusedAttention preference on Hopper+").
    PyTorch SDPA (torchtitan, DeepSpeed with Hugging Face models) prefers cuDNN on sm90/sm100 once
    its bundled cuDNN is newer than 9.15 (torch >= 2.11, sdp_utils.cpp check_prefer_cudnn_attention,
    after pytorch/pytorch#138522 made cuDNN opt-in for 2.5.1-2.10) and runs FlashAttention-2
    otherwise. A generation without the preferred family's curves takes the first it has.

    Attention sinks (softmax_type learnable) disable FlashAttention in Transformer Engine, leaving
    cuDNN's FusedAttention, which takes the sink logits in its kernels
    (TransformerEngine@d0067d0d .../dot_product_attention/utils.py L1113-1124; the "learnable" row of
    its support table): a Megatron job with sinks runs cuDNN on every generation.

    SDPA's flash backend (AttentionBackend.SDPA_FLASH) is priced from its own timings where a
    generation has them (Hopper); elsewhere by the flash-attn FlashAttention-2 curves, the same
    kernels (presets/kernels/hopper.toml [attention.sdpa_flash]: Ampere); a generation with neither
    (Blackwell) prices it as cuDNN, the family SDPA prefers there."""
    gpu = job.cluster.gpu
    if job.training.fp8_attention:
        # fp8 attention runs on TE's FusedAttention (cuDNN) alone (TransformerEngine@40c69e75
        # .../dot_product_attention/utils.py:456-478: FlashAttention and unfused attention disabled)
        return AttentionBackend.CUDNN
    if job.training.attention_backend is AttentionBackend.SDPA_FLASH:
        for family in (AttentionBackend.SDPA_FLASH, AttentionBackend.FA2, AttentionBackend.CUDNN):
            if K.family_available(gpu, family):
                return family
        return next(iter(K.table_for(gpu).attention))
    if job.training.attention_backend is not None:
        return job.training.attention_backend
    prefer = AttentionBackend.CUDNN if gpu.architecture in ("hopper", "blackwell") else AttentionBackend.FA2
    if job.model.attention_sinks and job.training.framework is Framework.MEGATRON:
        prefer = AttentionBackend.CUDNN
    if K.family_available(gpu, prefer):
        return prefer
    return next(iter(K.table_for(gpu).attention))


def _impl(job: Job, op: str) -> Impl:
    """The implementation of a memory-bound op (norm, act, rope, loss, permute) in the job's framework.

    Megatron with Transformer Engine: fused norms (LayerNormLinear), its own fused bias-SwiGLU
    (megatron/core/fusions/fused_bias_swiglu.py) and vocab-parallel cross entropy (its unfused
    kernels under TrainingSpec.cross_entropy_unfused), TE's fused rope. torch.compile (torchtitan --compile) fuses elementwise chains. Eager torchtitan and DeepSpeed
    run torchtitan's/Hugging Face's RMSNorm, rope and SwiGLU as chains of elementwise kernels
    (EAGER), torch's native nn.LayerNorm, and F.cross_entropy."""
    tr = job.training
    if op == "act" and tr.eager_swiglu and job.model.mlp.gated:
        return Impl.SPLIT  # TrainingSpec.eager_swiglu: nanotron's silu(gate) * up on the fused output's halves
    if tr.framework is Framework.MEGATRON:
        if op == "loss" and tr.cross_entropy_unfused:
            return Impl.MEGATRON_UNFUSED
        return {"act": Impl.MEGATRON, "loss": Impl.MEGATRON, "permute": Impl.TORCH}.get(op, Impl.FUSED)
    if op == "loss":
        return Impl.COMPILE if tr.compiles_loss else Impl.EAGER
    if tr.compile:
        return Impl.COMPILE
    if op == "norm" and (job.model.norm is NormKind.LAYERNORM or tr.fused_rms_norm):
        return Impl.TORCH  # nn.LayerNorm, or F.rms_norm's fused kernel (TrainingSpec.fused_rms_norm)
    return Impl.TORCH if op == "permute" else Impl.EAGER


# --- GEMMs ----------------------------------------------------------------------------------------


def memory_seconds(job: Job, moved_bytes: float, cal: Calibration, *, op: str | None = None, launches: float = 0.0) -> float:
    """A memory-bound kernel of the layer passes (kernels.memory_seconds) under the calibration's
    memory_scale for the GPU's architecture."""
    gpu = job.cluster.gpu
    return K.memory_seconds(moved_bytes, gpu, op=op, launches=launches) / cal.scale("memory_scale", gpu.architecture)


def _gemm_precision(job: Job) -> Precision:
    p, peaks = job.training.precision, job.cluster.gpu.peak_flop_per_s
    if (p is Precision.FP8 and not peaks.fp8) or (p is Precision.FP4 and not peaks.fp4):
        return Precision.BF16
    return p


def gemm_seconds(g: Gemm, gpu: GPUSpec, precision: Precision, cal: Calibration, *, out_bytes: int = ACT_BYTES) -> float:
    operand = operand_bytes(precision)
    t = K.gemm_seconds(g.m, g.n, g.k, g.count, gpu, precision, operand_bytes=operand, out_bytes=out_bytes)
    return t / cal.scale("gemm_scale", gpu.architecture)


def backward_gemms(g: Gemm) -> tuple[Gemm, Gemm]:
    """dX = dY·Wᵀ, an (m x n)·(n x k); dW = Xᵀ·dY, a (k x m)·(m x n)."""
    return Gemm(g.name + ".dgrad", g.m, g.k, g.n, g.count), Gemm(g.name + ".wgrad", g.k, g.n, g.m, g.count)


def main_grad_bytes(job: Job) -> int:
    """Bytes per element of Megatron's main-gradient buffer: the parameters' dtype unless gradients
    are reduced in fp32 (Megatron-LM@d98e8a64 megatron/core/distributed/param_and_grad_buffer.py:924),
    which --bf16 turns on unless --grad-reduce-in-bf16 (megatron/training/arguments.py:1213-1217):
    fp16 for fp16 training, fp32 for bf16 and fp8 (bf16 parameters); the gradient bytes of
    states.convention's Megatron row."""
    tr = job.training
    return convention(Framework.MEGATRON, tr.precision, bf16_grads=tr.grad_reduce_in_bf16).grad_bytes


def wgrad_out_bytes(job: Job) -> int:
    """Bytes per weight-gradient element that a wgrad GEMM's epilogue moves.

    Megatron with gradient accumulation fusion (TrainingSpec.grad_accumulation_fusion) runs each
    wgrad GEMM into the main grad with accumulation, D = Xᵀ·dY + main_grad: the epilogue reads the
    main grad and writes it back, 2·main_grad_bytes. Transformer Engine's linears: out=main_grad,
    out_dtype=main_grad.dtype, accumulate (TransformerEngine@d0067d0d transformer_engine/pytorch/
    module/linear.py:1248-1262), switched on by Megatron-LM@d98e8a64 megatron/core/extensions/
    transformer_engine.py:1293; Megatron's own linears and output layer: apex's
    wgrad_gemm_accum_fp32 / _fp16, cublasGemmEx with beta = 1.0 into the main grad
    (NVIDIA/apex@27017a4a csrc/megatron/fused_weight_gradient_dense_cuda.cu). Transformer Engine
    overwrites instead on the first micro-batch of a step; that one micro-batch is not told apart.
    Every other framework, and Megatron without the fusion, writes a fresh 16-bit gradient."""
    tr = job.training
    if tr.framework is Framework.MEGATRON and tr.grad_accumulation_fusion:
        return 2 * main_grad_bytes(job)
    return ACT_BYTES


def weight_backward_seconds(job: Job, g: Gemm, precision: Precision, cal: Calibration) -> tuple[float, float]:
    """(dgrad, wgrad) seconds of a weight GEMM's backward, the wgrad's epilogue moving
    wgrad_out_bytes."""
    dgrad, wgrad = backward_gemms(g)
    gpu = job.cluster.gpu
    return gemm_seconds(dgrad, gpu, precision, cal), gemm_seconds(wgrad, gpu, precision, cal, out_bytes=wgrad_out_bytes(job))


# --- torchao rowwise float8 linears ---------------------------------------------------------------


def rowwise_linears(job: Job) -> bool:
    """Whether the layer linears are torchao rowwise Float8Linears (torchtitan's float8 converter
    with recipe "rowwise"): priced as their bf16 GEMMs times the measured rowwise ratio
    (linear_factor), casts included, instead of fp8 GEMMs plus separate casts."""
    tr = job.training
    return (tr.precision is Precision.FP8 and tr.framework is Framework.TORCHTITAN and tr.fp8_recipe is Fp8Recipe.ROWWISE
            and _gemm_precision(job) is Precision.FP8)


def titan_linears(job: Job, g: Gemm) -> tuple[Gemm, ...]:
    """The nn.Linear modules one forward GEMM of flops.layer_gemms stands for in torchtitan's Llama:
    wq, wk and wv for "qkv", w1 and w3 for a gated MLP's fc1 (pytorch/torchtitan@820504e2
    torchtitan/models/llama3/model.py L205-210, L297-299); torchao converts and times each alone."""
    m = job.model
    if g.name == "qkv" and m.mla is None:
        q = m.q_width // job.layout.tp
        kv = (g.n - q) // 2
        return (Gemm("wq", g.m, q, g.k, g.count), Gemm("wk", g.m, kv, g.k, g.count), Gemm("wv", g.m, kv, g.k, g.count))
    if g.name.endswith("_fc1") and m.mlp.gated:
        half = g.n // 2
        return (Gemm("w1", g.m, half, g.k, g.count), Gemm("w3", g.m, half, g.k, g.count))
    return (g,)


def _converted(g: Gemm) -> bool:
    """torchtitan's float8 filter: only nn.Linear modules whose weight dims are multiples of 16
    (torchtitan@820504e2 components/quantization/utils.py L16-25); MoE experts are grouped
    parameters, not nn.Linear, and stay in bf16."""
    return g.n % 16 == 0 and g.k % 16 == 0 and not g.name.startswith("experts")


def fused_projections(job: Job) -> bool:
    """Whether q, k, v (and a gated MLP's gate and up) run as one fused GEMM: TrainingSpec.fused_projections,
    by default every framework but torchtitan, whose Llama keeps them as separate modules."""
    tr = job.training
    return tr.fused_projections if tr.fused_projections is not None else tr.framework is not Framework.TORCHTITAN


def linear_modules(job: Job, g: Gemm) -> tuple[Gemm, ...]:
    """The GEMMs a forward GEMM of flops.layer_gemms runs as (fused_projections): separate q, k, v
    and gate, up modules (titan_linears), each its own kernel reading the shared input again, or one
    fused GEMM."""
    return (g,) if fused_projections(job) else titan_linears(job, g)


def module_factor(job: Job, g: Gemm) -> float:
    """What every GEMM of one linear module (forward GEMM `g`) costs over its price at
    _linear_precision: Transformer Engine's quantisation (1 + _te_fp8), or for a rowwise torchao
    module its measured time ratio over bf16 (kernels.rowwise_linear_ratio; 1 if not converted)."""
    if not rowwise_linears(job):
        return 1 + _te_fp8(job)
    return K.rowwise_linear_ratio(job.cluster.gpu, g.m, g.k, g.n) if _converted(g) else 1.0


def linear_pass_seconds(job: Job, g: Gemm, cal: Calibration) -> tuple[float, float, float]:
    """(forward, dgrad, wgrad) seconds of the linear(s) with forward GEMM `g`, module by module."""
    gpu, prec = job.cluster.gpu, _linear_precision(job)
    fwd = dgrad = wgrad = 0.0
    for x in linear_modules(job, g):
        f = module_factor(job, x)
        d, w = weight_backward_seconds(job, x, prec, cal)
        fwd += gemm_seconds(x, gpu, prec, cal) * f
        dgrad += d * f
        wgrad += w * f
    return fwd, dgrad, wgrad


def _linear_precision(job: Job) -> Precision:
    """The precision layer linears are priced at before linear_factor: bf16 for rowwise torchao
    linears (their ratio is over bf16), else the run's GEMM precision."""
    return Precision.BF16 if rowwise_linears(job) else _gemm_precision(job)


def _te_fp8(job: Job) -> float:
    """Transformer Engine's quantisation on top of fp8 GEMMs (Megatron, DeepSpeed with TE): the
    measured autocast overhead of the recipe; Megatron's --fp8-recipe defaults to delayed
    (tensorwise) scaling (megatron/training/arguments.py)."""
    tr = job.training
    if tr.precision is not Precision.FP8 or tr.framework is Framework.TORCHTITAN or _gemm_precision(job) is not Precision.FP8:
        return 0.0
    if te_casts_separate(job):  # priced as the casts it runs (te_cast_seconds)
        return 0.0
    return K.te_fp8_overhead(job.cluster.gpu, tr.fp8_recipe.value)


# --- attention ------------------------------------------------------------------------------------


def _eager_attention_seconds(job: Job, backward: bool, cal: Calibration) -> float:
    """Unfused attention: QKᵀ and PV as batched GEMMs, plus the scores' trips through HBM (scale,
    mask and softmax read and write them; dropout reads them, writes them and a 1-byte mask; PV
    reads them; tanh soft-capping, Gemma's score / c, tanh, · c, reads and writes them once more
    per op, three ops). Backward: two batched GEMMs per forward one, and the same traffic again. A
    window or chunk mask changes nothing here: every score is computed, then masked."""
    a = core_attention(job)
    scores = Gemm("scores", a.q_len, a.k_len, a.head_dim, a.batch_heads)
    context = Gemm("context", a.q_len, a.head_dim, a.k_len, a.batch_heads)
    elements = a.batch_heads * a.q_len * a.k_len
    passes = 2 + (2 + 2.5 if job.model.attention_dropout > 0 else 0) + (2 * 3 if job.model.attn_logit_softcap else 0)
    passes += SINK_EAGER_PASSES if job.model.attention_sinks else 0
    traffic = memory_seconds(job, elements * ACT_BYTES * passes, cal)
    gemms = [scores, context] if not backward else [x for g in (scores, context) for x in backward_gemms(g)]
    return sum(eager_bmm_seconds(job, g, a.head_dim, cal) for g in gemms) + traffic


def eager_bmm_seconds(job: Job, g: Gemm, head_dim: int, cal: Calibration) -> float:
    """One of unfused attention's batched GEMMs: at the generation's measured rate for the head
    dimension (kernels.eager_bmm_rate: QKᵀ-like where it reduces over the head dimension, the
    backward's dP = dO·Vᵀ too; attention-over-values-like otherwise: PV and the other three
    backward GEMMs, each with the head dimension as one side of its output), else the GEMM model."""
    gpu, prec = job.cluster.gpu, _gemm_precision(job)
    if prec is Precision.FP4:  # NVFP4BlockScaling quantises no attention (fp8_dpa False, recipe/__init__.py:421-423)
        prec = Precision.BF16
    reduces = g.name in ("scores", "context.dgrad")  # by name: a sequence as long as the head dim has its k too
    rate = K.eager_bmm_rate(gpu, head_dim, reduces_head_dim=reduces) if not prec.low else None
    if rate is None:
        return gemm_seconds(g, gpu, prec, cal)
    return g.flop / rate / cal.scale("gemm_scale", gpu.architecture) + K.table_for(gpu).launch_s


# Attention sinks in eager attention (transformers v5.23.0 modeling_gpt_oss.py eager_attention_forward):
# torch.cat of the scores and the per-head sink column reads the scores and writes a copy (2
# passes), then the row max is subtracted (the max reads them, the subtraction reads and writes: 3),
# before the softmax the plain path already prices: 5 passes of the scores more; backward the same.
SINK_EAGER_PASSES = 5


def sink_gradient_bytes(job: Job) -> float:
    """Bytes of the sink logits' gradient in a fused backward: d sink_h = −Σ_rows p_sink·D, p_sink =
    exp(sink_h − lse) per row and D = rowsum(dO∘O), which the backward's preprocess computes
    (ATTENTION_BACKWARD_KERNELS): one more read of the fp32 log-sum-exp and D per (batch·head,
    query) row, 8 bytes (cuDNN returns it from its backward kernels: TransformerEngine@d0067d0d
    dot_product_attention/backends.py L1982-1984, d_softmax_offset). The forward's extra work, one
    exponential and add per row, is not priced (heads·q against the s² scores)."""
    if not job.model.attention_sinks:
        return 0.0
    a = core_attention(job)
    return a.batch_heads * a.q_len * 2 * FP32


@dataclass(frozen=True)
class AttentionKernels:
    """One layer's core attention for one micro-batch, kernel by kernel: without context
    parallelism one causal kernel (first_*); under the ring, cp − 1 further steps of step_* each,
    each with its log-sum-exp merge (merge_*)."""

    first_fwd: float
    first_bwd: float
    steps: int = 1  # kernel calls per pass: cp under the ring
    step_fwd: float = 0.0
    step_bwd: float = 0.0
    merge_fwd: float = 0.0
    merge_bwd: float = 0.0

    @property
    def forward_s(self) -> float:
        return self.first_fwd + (self.steps - 1) * (self.step_fwd + self.merge_fwd)

    @property
    def backward_s(self) -> float:
        return self.first_bwd + (self.steps - 1) * (self.step_bwd + self.merge_bwd)


# Kernels of one flash-attention backward: the dO·O row sums, the main dQ/dK/dV kernel and the dQ
# conversion from its fp32 accumulator (flash-attn csrc/flash_attn/src/flash_bwd_launch_template.h,
# run_flash_bwd_seqk_parallel: compute_dot_do_o, flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel,
# convert_dQ; FA3's hopper/flash_bwd_launch_template.h has the same preprocess / main / postprocess).
ATTENTION_BACKWARD_KERNELS = 3


@dataclass(frozen=True)
class Copies:
    """Bytes moved per element of the rank's attention output (o) and per element of one of K and V
    as the op is handed them (k), in `launches` kernels."""

    o: float
    k: float
    launches: int


@dataclass(frozen=True)
class RingCopies:
    """What torch's ring attention (torch.distributed.tensor.experimental._attention, the context
    parallel of torchtitan) moves around its kernels: in each step after the first, and once per
    pass, forward and backward."""

    step_fwd: Copies
    pass_fwd: Copies
    step_bwd: Copies
    pass_bwd: Copies


# Read at pytorch/pytorch@0123248a torch/distributed/tensor/experimental/_attention.py (_SDPAMerger,
# _partial_update, _templated_ring_attention, _templated_ring_attention_backward); the upstream side
# of the merge conflict in ROCm/pytorch@10b22ea5's copy, the late-2024 file that still dispatches
# through _sdpa_handler with a DeviceMesh argument, has the same merger and loops. convert_to_f32 is
# on: the running output and lse are fp32 (_SDPAMerger.step), and the backward accumulates dQ, dK
# and dV in fp32 (accum_dtype). The rotate method is torchtitan's default all-gather (cp_exposure):
# one all-gather of the concatenated K and V per pass; dK/dV go to the next rank after every step
# (ALL_TO_ALL rotater). Load balancing splits each later step's work between two kinds of rank: i <= rank
# computes all local queries against the first half of the visiting K/V, i > rank the second half
# of the queries (partial=True) against all of it; priced as the mean of the two, as the kernels are.
#
# Compiled (torchtitan compiles every block with fullgraph=True, pytorch/torchtitan@9dec370
# torchtitan/parallelisms/parallelize_llama.py apply_compile, so the ring is traced into the block's
# graph and its elementwise ops fused): what is left are the tensors the loop materialises.
# Forward, each later step: the merge out - sigmoid(lse_b - lse)·(out - out_b) reads the fp32
# running output (4) and the step's 16-bit output (2) and writes the fp32 one (4): 10 per o. Once
# per pass: the send buffer torch.cat([key.flatten(), value.flatten()]), read 2 and write 2 per
# element of K and of V (8 per k); the cats of later steps feed no collective under the all-gather
# rotater (_AllGatherRotater.exchange_buffers gathers once) and the compiled graph drops them.
# Backward, each later step: dQ accumulated in fp32, read 4 + 2 and write 4 (10 per o); dK and dV,
# the received fp32 buffer plus the step's 16-bit gradients written into the next send buffer
# torch.cat([grad_key.flatten(), grad_value.flatten()]) in fp32, (4 + 2 + 4) each (20 per k). Once
# per pass: step 0's dK/dV send buffer (20 per k), the K/V all-gather buffer (8 per k), and the last
# received dK/dV cast to 16 bits, read 4 and write 2 each (12 per k): 40 per k.
RING_COPIES_COMPILED = RingCopies(Copies(10, 0, 1), Copies(0, 8, 1), Copies(10, 20, 2), Copies(0, 40, 3))
# Eager, every op its own kernel. Forward, each later step: a rank with the whole output (i <= rank)
# casts the step's output to fp32 (read 2, write 4), then out - out_b (read 4 + 4, write 4),
# sigmoid(...)·(...) (read 4, write 4), out - (...) (read 4 + 4, write 4): 38 per o; a partial rank
# does the same over the second half (19) and _partial_update's torch.cat rewrites the whole fp32
# output (read 4, write 4): 27; the mean, 32.5; and the K/V send buffer is concatenated before every
# step but the last, cp - 1 times (8 per k). Once per pass: the first step's output cast to fp32 and
# the result cast back (6 + 6 per o). Backward, each later step: dQ += in fp32 (10 per o) on a rank
# with the whole gradient, 5 on the half plus a torch.cat of the whole (8) on a partial one: 11.5;
# dK, dV += (10 each) where i > rank, and on the first half plus a torch.cat (5 + 8 each) where
# i <= rank: 23 per k; their fp32 send buffer (read 8, write 8: 16 per k) and the K/V send buffer
# (8 per k). Once per pass: the fp32 zeros of dQ, dK, dV (4 per o, 8 per k), step 0's dQ (10 per o)
# and dK/dV (20 per k) +=, its dK/dV send buffer (16 per k), and the final casts of dQ (read 4,
# write 2: 6 per o) and of dK/dV (12 per k): 20 per o and 56 per k.
RING_COPIES_EAGER = RingCopies(Copies(32.5, 8, 5), Copies(12, 0, 2), Copies(11.5, 47, 6), Copies(20, 56, 9))


def attention_kernels(job: Job, cal: Calibration, kind: LayerKind = LayerKind()) -> AttentionKernels:
    """Flash attention, priced per kernel call.

    Without cp: one causal kernel over the sequence. With cp (Megatron/Transformer Engine p2p and
    torch's ring, both load-balanced: each rank holds chunks i and 2cp−1−i of 2cp): the first step
    is causal over the local L = s/cp tokens; each of the cp − 1 later steps computes an unmasked
    L x L/2 block, either all local queries against the first half of the visiting K/V (key loop
    L/2) or the second half of the queries against all of it (key loop L), half the ranks each
    (TransformerEngine@40c69e75 context_parallel.py AttnFuncWithCPAndKVP2P; torch 2.9
    _templated_ring_attention). Each step after the first merges its output into the running one by
    log-sum-exp in fp32: read the running output and the step's, write the running one; backward
    accumulates dQ and the visiting dK/dV the same way. torch's ring also copies K/V and dK/dV into
    the buffers its collectives send, and eagerly runs its merges op by op (RingCopies).

    A local layer's kernel (`kind.window` or `kind.chunk`) computes only the blocks its mask keeps
    (local_attention_seconds), except where the framework passes the mask as a tensor
    (flops.mask_tensor_attention: one unmasked kernel over all s x s blocks); context parallelism with
    local layers is refused (rules.cp_local_attention). With attention sinks the first backward
    kernel also reduces the sinks' gradient (sink_gradient_bytes); eager attention prices its sink
    passes itself (_eager_attention_seconds)."""
    if job.training.attention is AttentionKernel.EAGER:
        return AttentionKernels(_eager_attention_seconds(job, False, cal), _eager_attention_seconds(job, True, cal))
    kernels = _fused_attention_kernels(job, cal, kind)
    sink = sink_gradient_bytes(job)  # the sink logits' gradient, in the first backward kernel's preprocess
    return dataclasses.replace(kernels, first_bwd=kernels.first_bwd + memory_seconds(job, sink, cal)) if sink else kernels


def _fused_attention_kernels(job: Job, cal: Calibration, kind: LayerKind) -> AttentionKernels:
    """attention_kernels of the fused (flash / cuDNN) kernels, without the sinks' gradient. Under
    TrainingSpec.fp8_attention each cuDNN kernel runs at its 16-bit price over the measured fp8
    speedup at its key length (kernels.fp8_attention_speedup); its casts are fp8_attention_cast_bytes."""
    gpu = job.cluster.gpu
    a = core_attention(job)
    family = attention_backend(job)
    scale = cal.scale("attention_scale", gpu.architecture)
    heads, d, cp, seq = a.batch_heads, a.head_dim, job.layout.cp, a.q_len

    def kernel(p: K.Pass, causal: bool, q: int, k: int) -> float:
        fp8 = K.fp8_attention_speedup(gpu, p, causal=causal, k_len=k) if job.training.fp8_attention else 1.0
        return attention_seconds(gpu, family, p, causal=causal, head_dim=d, q_len=q, k_len=k, batch_heads=heads,
                                 rate_scale=scale * fp8)

    if mask_tensor_attention(job, kind):  # every block of s x s keys, none skipped
        return AttentionKernels(kernel(K.Pass.FORWARD, False, seq, seq), kernel(K.Pass.BACKWARD, False, seq, seq))
    if kind.window is not None or kind.chunk is not None:
        # cp > 1 with local layers is refused (rules.cp_local_attention); the search's bounds may
        # still ask, and get the local kernel over the rank's tokens
        local = dict(head_dim=d, q_len=seq, batch_heads=heads, rate_scale=scale, window=kind.window, chunk=kind.chunk)
        return AttentionKernels(
            local_attention_seconds(gpu, family, K.Pass.FORWARD, **local),
            local_attention_seconds(gpu, family, K.Pass.BACKWARD, **local),
        )
    first_f, first_b = kernel(K.Pass.FORWARD, True, seq, seq), kernel(K.Pass.BACKWARD, True, seq, seq)
    if cp == 1:
        return AttentionKernels(first_f, first_b)
    half = max(1, seq // 2)
    step_f = (kernel(K.Pass.FORWARD, False, seq, half) + kernel(K.Pass.FORWARD, False, half, seq)) / 2
    step_b = (kernel(K.Pass.BACKWARD, False, seq, half) + kernel(K.Pass.BACKWARD, False, half, seq)) / 2
    out = heads * seq * d  # elements of a rank's attention output
    if job.training.framework is Framework.TORCHTITAN:
        # torch's ring: its merges and the copies around its collectives (RingCopies)
        r = RING_COPIES_COMPILED if job.training.compile else RING_COPIES_EAGER
        kv = out * (1 if CONVENTIONS[Framework.TORCHTITAN].gqa_expands_kv else local_kv_heads(job) / (heads // job.layout.mbs))

        def moved(c: Copies) -> float:
            return memory_seconds(job, out * c.o + kv * c.k, cal, launches=c.launches)

        merge_f, merge_b = moved(r.step_fwd), moved(r.step_bwd)
        first_f += moved(r.pass_fwd)
        first_b += moved(r.pass_bwd)
        return AttentionKernels(first_f, first_b, cp, step_f, step_b, merge_f, merge_b)
    # per step, TE's log-sum-exp correction and the output rescale-and-accumulate: two kernels
    # (TransformerEngine@40c69e75 context_parallel.py:101-145, 1613-1660)
    merge_f = memory_seconds(job, out * (ACT_BYTES + 2 * FP32), cal, launches=2)
    merge_b = memory_seconds(job, out * 2 * (ACT_BYTES + 2 * FP32), cal, launches=2)
    return AttentionKernels(first_f, first_b, cp, step_f, step_b, merge_f, merge_b)


def mamba_kernels(job: Job, cal: Calibration) -> AttentionKernels:
    """One Mamba-2 layer's mixer kernels besides in_proj/out_proj, one micro-batch on one GPU, over
    the rank's heads and positions (flops.mamba_local: under cp the whole sequence on nheads/(tp·cp)
    heads):
    - the depthwise causal conv1d with silu over x, B, C (conv channels on the rank): memory-bound,
      reading and writing each element once (forward; backward reads the input and the incoming
      gradient and writes the input gradient, the weight gradient being a reduction over tokens);
    - the SSD scan: its batched products (flops.ssd_gemms) priced as GEMMs, plus the inter-chunk
      states, P x N per head and chunk, written by the chunk-state kernel, read and written by the
      state passing and read by the chunk scan, in the activations' dtype (Megatron's
      mamba_training_ssm_states_dtype default None: "the states follow the activation dtype",
      transformer_config.py at d98e8a64);
    - the RMSNorm gated by silu(z) over the inner width: reads y and z, writes the output;
    - under cp, the copies around the all-to-alls (mamba_reorder_bytes).
    The scan's backward is its products' dgrad and wgrad GEMMs and twice the state traffic. The
    kernels follow mamba_ssm's chunked scan (mamba_ssm/ops/triton/ssd_combined.py
    _mamba_chunk_scan_combined_fwd: chunk cumsum, chunk state, state passing, C·Bᵀ, chunk scan),
    which Megatron's MambaMixer runs through mamba_split_conv1d_scan_combined; the small kernels on
    dt (softplus, the cumsum of dt·A) move per-head scalars and are not priced."""
    mb, lay, sh = job.model.mamba, job.layout, mamba_local(job)
    assert mb is not None
    gpu, prec = job.cluster.gpu, _gemm_precision(job)
    positions = lay.mbs * sh.seq
    conv = positions * sh.local.conv_dim
    inner = positions * sh.local.inner
    chunks = lay.mbs * -(-sh.seq // mb.chunk_size)
    states = chunks * sh.local.num_heads * mb.head_dim * mb.state_size
    gemms = ssd_gemms(job)
    bf16 = Precision.BF16 if prec.low else prec  # the scan runs in 16-bit, not fp8 or fp4
    scan_f = sum(gemm_seconds(g, gpu, bf16, cal) for g in gemms)
    scan_b = sum(gemm_seconds(x, gpu, bf16, cal) for g in gemms for x in backward_gemms(g))
    reorder, copies = mamba_reorder_bytes(job)
    reorder_s = memory_seconds(job, reorder, cal, launches=copies) if copies else 0.0
    fwd = (
        scan_f
        + memory_seconds(job, 4 * states * ACT_BYTES, cal, launches=1)
        + memory_seconds(job, 2 * conv * ACT_BYTES, cal, launches=1)
        + memory_seconds(job, 3 * inner * ACT_BYTES, cal, launches=1)
        + reorder_s
    )
    bwd = (
        scan_b
        + memory_seconds(job, 8 * states * ACT_BYTES, cal, launches=1)
        + memory_seconds(job, 3 * conv * ACT_BYTES, cal, launches=1)
        + memory_seconds(job, 5 * inner * ACT_BYTES, cal, launches=1)
        + reorder_s
    )
    return AttentionKernels(fwd, bwd)


def mamba_reorder_bytes(job: Job) -> tuple[float, int]:
    """(bytes moved, kernels) of the copies Megatron's Mamba context parallel makes around its
    all-to-alls in one forward (Megatron-LM@d98e8a64 mamba_context_parallel.py, tensor_parallel/
    mappings.py L566-621): all_to_all_sp2hp splits and concatenates each of z, x, B, C, dt before
    its all-to-all (a read and a write each); pre_conv_ssm concatenates the five results and
    _undo_attention_load_balancing reorders the sequence chunks (two reads and writes of the
    whole); post_conv_ssm's _redo_attention_load_balancing and all_to_all_hp2sp's concatenation
    copy y twice; einops' repeat of B and C, where a group's state goes to several cp ranks, writes
    them once more. Each copy's gradient in backward is the inverse copy of the same bytes. Nothing
    at cp 1."""
    widths = all_to_all_widths(job.model.mamba, tp=job.layout.tp, cp=job.layout.cp) if job.model.mamba else {}
    if not widths:
        return 0.0, 0
    t = tokens(job)
    pre = t * (widths["z"] + widths["x"] + widths["B"] + widths["C"] + widths["dt"])
    y = t * widths["y"]
    r = mamba_local(job).repeat
    repeat = t * (widths["B"] + widths["C"]) * (1 + 1 / r) if r > 1 else 0.0  # reads 1/r of what it writes
    return ACT_BYTES * (2 * (3 * pre + 2 * y) + repeat), 5 + 2 + 2 + (2 if r > 1 else 0)


def mixer_kernels(job: Job, kind: LayerKind, cal: Calibration) -> AttentionKernels:
    """A layer's token-mixer kernels: attention, the Mamba-2 conv and scan, or none."""
    if kind.mixer is MixerKind.ATTENTION:
        return attention_kernels(job, cal, kind)
    if kind.mixer is MixerKind.MAMBA:
        return mamba_kernels(job, cal)
    return AttentionKernels(0.0, 0.0)


def attention_seconds(
    gpu: GPUSpec, family: AttentionBackend, p: K.Pass, *, causal: bool, head_dim: int, q_len: int, k_len: int,
    batch_heads: int, rate_scale: float = 1.0,
) -> float:
    """One fused attention kernel call, forward or backward (with the backward's helper kernels):
    its FLOPs (FlashAttention convention: 4·heads·q·k·d, halved when causal, backward 2.5x) at the
    family's rate times `rate_scale`, plus each kernel's start-up."""
    flop = 4 * batch_heads * q_len * k_len * head_dim * (0.5 if causal else 1.0)
    rate = K.attention_rate(gpu, family, p, causal=causal, head_dim=head_dim, q_len=q_len, k_len=k_len, batch_heads=batch_heads)
    return _fused_attention_seconds(gpu, p, flop, rate * rate_scale)


def _fused_attention_seconds(gpu: GPUSpec, p: K.Pass, forward_flop: float, rate_flop_per_s: float) -> float:
    """A fused attention kernel of `forward_flop` at a rate: forward one launch; backward
    FLASH_BACKWARD_FACTOR x the FLOPs and its helper kernels' launches."""
    if p is K.Pass.FORWARD:
        return forward_flop / rate_flop_per_s + K.table_for(gpu).launch_s
    return FLASH_BACKWARD_FACTOR * forward_flop / rate_flop_per_s + ATTENTION_BACKWARD_KERNELS * K.table_for(gpu).launch_s


def local_attention_seconds(
    gpu: GPUSpec, family: AttentionBackend, p: K.Pass, *, head_dim: int, q_len: int, batch_heads: int,
    window: int | None, chunk: int | None, rate_scale: float = 1.0,
) -> float:
    """One fused kernel call of a local layer over q_len tokens, forward or backward. Its FLOPs are
    4·heads·d per kept (query, key) pair (flops.attended_pairs). Sliding window w < q_len: each
    query block loops over the ~w keys of its window with no causal saving inside it (flash-attn's
    local attention, n_block_min..n_block_max of flash_fwd_kernel.h), priced at the unmasked
    curve's rate for a key loop of w. Chunks of c: each chunk is a causal attention of c tokens
    (a varlen batch of q_len/c sequences), priced at the causal curve's rate for c. A window or
    chunk of q_len or more is plain causal attention (attention_seconds)."""
    if chunk is not None and chunk < q_len:
        causal, key_loop = True, chunk
    elif window is not None and window < q_len:
        causal, key_loop = False, window
    else:
        return attention_seconds(gpu, family, p, causal=True, head_dim=head_dim, q_len=q_len, k_len=q_len,
                                 batch_heads=batch_heads, rate_scale=rate_scale)
    pairs = attended_pairs(q_len, window=window, chunk=chunk)
    flop = 4 * batch_heads * pairs * head_dim
    rate = K.attention_rate(gpu, family, p, causal=causal, head_dim=head_dim, q_len=q_len, k_len=key_loop, batch_heads=batch_heads)
    return _fused_attention_seconds(gpu, p, flop, rate * rate_scale)


# --- memory-bound ops -----------------------------------------------------------------------------


@dataclass(frozen=True)
class EagerChain:
    """An op eager PyTorch runs as a chain of elementwise kernels: bytes it moves per element of its
    output in its forward, and its kernels. RMSNorm as x.float() (r2 w4), pow (r4 w4), mean (r4),
    x·rsqrt (r4 w4), .type_as (r4 w2), ·weight (r2 w2): 36 bytes in 6 kernels (torchtitan's and
    Hugging Face's RMSNorm); rotary embedding as .float(), view_as_complex·freqs, view_as_real,
    .type_as: 20 bytes in 3 kernels (the views launch none); SwiGLU as silu(gate) (r2 w2) then ·up
    (r4 w2): 10 bytes per ffn element in 2 kernels; GELU one kernel. A fused or native op moves its
    compulsory bytes (COMPULSORY) in one kernel. Backward moves twice the forward's bytes in twice
    the kernels (autograd runs each op's backward, reading saved inputs and the incoming gradient
    and writing one gradient per input)."""

    bytes_per_element: int
    kernels: int


# Llama 4's ops (transformers v5.23.0 modeling_llama4.py): Llama4TextL2Norm is RMSNorm's chain without
# the weight multiply, x.float() (r2 w4), pow (r4 w4), mean (r4), x·rsqrt (r4 w4), .type_as (r4 w2):
# 32 bytes in 5 kernels; the NoPE layers' temperature scaling multiplies the 16-bit queries by fp32
# per-token scales (r2 w4) and casts back (r4 w2): 12 bytes in 2 kernels (Llama4TextAttention.forward).
EAGER = {"norm": EagerChain(36, 6), "rope": EagerChain(20, 3), "swiglu": EagerChain(10, 2), "gelu": EagerChain(4, 1),
         "l2norm": EagerChain(32, 5), "qscale": EagerChain(12, 2)}
# Compulsory bytes per element, (forward, backward): a norm reads x and writes y (bwd: reads x and
# dy, writes dx); SwiGLU reads gate and up and writes the product per ffn element (bwd: reads gate,
# up and dy, writes both gradients); GELU and rope read one and write one (bwd the same plus the
# saved input for GELU); a residual add reads two and writes one (its backward passes the gradient
# on, reading one and writing two); dropout reads, writes and writes a 1-byte mask.
# The L2 norm moves a norm's bytes; the query scaling reads and writes each query element (bwd: the
# gradient, the per-token scales being a few bytes a row).
# Megatron's fused bias-dropout-add (fused_bias_dropout_add) reads the block output and the
# residual and writes the sum and the 1-byte mask in one kernel (the bias is a row); its backward
# runs as the separate ops' (two kernels: grad·mask·scale, and autograd's sum of the residual's two
# gradients), priced as "dropout" and "add".
COMPULSORY = {"norm": (4, 6), "swiglu": (6, 10), "gelu": (4, 6), "rope": (4, 4), "add": (6, 6), "dropout": (5, 5),
              "l2norm": (4, 6), "qscale": (4, 4), "bda": (7, 11)}


def fused_bias_dropout_add(job: Job) -> bool:
    """Whether the block outputs' bias, dropout and residual add run as one kernel: Megatron's
    --bias-dropout-fusion (on by default: Megatron-LM@903f746c megatron/arguments.py L423-425,
    @bbab79f8 L556-558) runs bias_dropout_add under torch.jit.script, whose fuser generates one
    kernel for x + bias, dropout and + residual (@903f746c megatron/model/transformer.py L357-379,
    the layer calling it at L462-480 with grad enabled "to enable fused optimization"; @bbab79f8
    L504-530, 632-645, nvFuser from torch 1.10 at L600-605; Megatron-core's get_bias_dropout_add,
    @d98e8a64 megatron/core/fusions/fused_bias_dropout.py). Other frameworks run dropout and the
    add as two ops."""
    return job.training.framework is Framework.MEGATRON


# GPT-OSS's clamped SwiGLU (ModelSpec.swiglu_limit) beyond SwiGLU's own kernel, per ffn element,
# (bytes, kernels) of the forward and of the backward.
# Eager (transformers v5.23.0 GptOssExperts._apply_gate): gate.clamp (r2 w2), up.clamp (r2 w2),
# gate·alpha (r2 w2), sigmoid (r2 w2), gate·sigmoid (r4 w2), up + 1 (r2 w2), (up + 1)·glu (r4 w2):
# 32 bytes in 7 kernels where eager SwiGLU moves 10 in 2 (EAGER), 22 bytes and 5 kernels more;
# backward twice that (EagerChain's rule).
# Megatron (Megatron-LM@d98e8a64 megatron/core/fusions/fused_bias_geglu.py L424-431,
# weighted_bias_quick_geglu_impl): torch clamps of the two halves of fc1's output (r2 w2 each) and
# their torch.cat (r4 w4) ahead of the fused quick-GEGLU kernel, whose bytes are SwiGLU's: 16 bytes
# in 3 kernels; backward, each clamp's gradient reads its saved input and the incoming gradient and
# writes one (r4 w2, twice), the cat's being views: 12 bytes in 2 kernels. (Transformer Engine's
# op fuser, ScaledClampedQGeGLU, clamps inside its kernel where experts.py L385-455 selects it.)
# torch.compile fuses the clamps into the activation's kernel: nothing beyond SwiGLU's bytes.
CLAMP_EAGER = (22, 5), (44, 10)
CLAMP_MEGATRON = (16, 3), (12, 2)


def clamp_seconds(job: Job, elements: float, *, backward: bool, cal: Calibration) -> float:
    """The clamped SwiGLU's memory-bound work beyond plain SwiGLU's, over `elements` ffn elements
    (0 for an unclamped MLP and where the clamps fuse into the activation's kernel)."""
    if job.model.swiglu_limit is None:
        return 0.0
    impl = _impl(job, "act")
    table = {Impl.EAGER: CLAMP_EAGER, Impl.MEGATRON: CLAMP_MEGATRON}.get(impl)
    if table is None:
        return 0.0
    moved, launches = table[1 if backward else 0]
    return memory_seconds(job, elements * moved, cal, launches=launches)


def op_seconds(gpu: GPUSpec, op: str, impl: Impl, elements: float, *, backward: bool) -> float:
    """One memory-bound op over `elements` output elements (per ffn element for the activation) in
    the given implementation: an eager chain at the streaming fraction of HBM bandwidth, anything
    else on its compulsory bytes at the op's measured fraction (kernels.op_fraction)."""
    passes = 2 if backward else 1
    key = f"{op}.{impl.value}.{'bwd' if backward else 'fwd'}"
    if impl is Impl.SPLIT and key not in K.table_for(gpu).op_fractions:
        impl = Impl.EAGER  # no measurement of the op on this generation: the eager chain's bytes
    if impl is Impl.EAGER and op in EAGER:
        chain = EAGER[op]
        return K.memory_seconds(elements * chain.bytes_per_element * passes, gpu, launches=chain.kernels * passes)
    moved = elements * COMPULSORY[op][1 if backward else 0]
    return K.memory_seconds(moved, gpu, op=key, launches=1)


def _op_seconds(job: Job, op: str, elements: float, backward: bool, cal: Calibration) -> float:
    """op_seconds in the job's framework's implementation, under the calibration's memory_scale."""
    key = {"swiglu": "act", "gelu": "act", "l2norm": "norm", "qscale": "rope"}.get(op, op)
    impl = _impl(job, key) if key in ("norm", "act", "rope") else Impl.FUSED
    if op == "l2norm" and impl is Impl.TORCH:
        impl = Impl.EAGER  # torch has no native L2 norm: the eager chain (Megatron's L2Norm is jit-fused)
    gpu = job.cluster.gpu
    return op_seconds(gpu, op, impl, elements, backward=backward) / cal.scale("memory_scale", gpu.architecture)


def elementwise_seconds(job: Job, kind: LayerKind, *, backward: bool, cal: Calibration) -> float:
    """Memory-bound kernels of one layer pass for one micro-batch on one GPU.

    Residual stream (width h, split over tp with sequence parallel): a norm and a residual add per
    block (two in an attention + MLP layer, one in a hybrid model's layers; twice the norms with
    sandwich norms), dropout on each block's output when dropout > 0. Per tp rank: rotary
    embedding of q and k (not on a NoPE or Mamba layer), the MLP activation per ffn element (a
    gated GELU moves the bytes of SwiGLU; squared ReLU priced as GELU: one read and one write);
    for MoE the permutation of routed token copies and their weighted combine (torch index ops or
    fused kernels: kernels.md §4.5). A Mamba mixer's own memory-bound kernels are in mamba_kernels."""
    m, lay = job.model, job.layout
    t = tokens(job)
    residual_tokens = t / (lay.tp if job.sp else 1)
    h = m.hidden_size
    blocks = kind.norms
    norms = blocks * (2 if m.sandwich_norms else 1)
    total = bias_grad_seconds(job, kind, cal) if backward else 0.0
    total += qkv_bias_seconds(job, kind, backward=backward, cal=cal)
    total += qkv_layout_copy_seconds(job, kind, backward=backward, cal=cal)
    total += local_attention_copy_seconds(job, kind, backward=backward, cal=cal)
    total += flash_unpad_copy_seconds(job, kind, backward=backward, cal=cal)
    total += norms * _op_seconds(job, "norm", h * residual_tokens, backward, cal)
    if m.hidden_dropout > 0 and fused_bias_dropout_add(job) and not backward:
        total += blocks * _op_seconds(job, "bda", h * residual_tokens, backward, cal)
    else:
        total += blocks * _op_seconds(job, "add", h * residual_tokens, backward, cal)
        if m.hidden_dropout > 0:
            total += blocks * _op_seconds(job, "dropout", h * residual_tokens, backward, cal)
    if m.mla is not None and kind.mixer is MixerKind.ATTENTION:
        # the latent norms (q_layernorm, kv_layernorm) on the rank's tokens, and rotary on the rope
        # part of each local query head and of the one shared key
        a = m.mla
        if a.q_lora_rank is not None:
            total += _op_seconds(job, "norm", a.q_lora_rank * residual_tokens, backward, cal)
        total += _op_seconds(job, "norm", a.kv_lora_rank * residual_tokens, backward, cal)
        rope = (m.num_attention_heads // lay.tp + 1) * a.qk_rope_head_dim * t
        total += _op_seconds(job, "rope", rope, backward, cal)
    elif m.position_embedding is PositionKind.ROPE and kind.mixer is MixerKind.ATTENTION and kind.rope:
        total += _op_seconds(job, "rope", (m.q_width + m.kv_width) / lay.tp * t, backward, cal)
    total += qkv_copy_seconds(job, kind, backward=backward, cal=cal)
    if kind.mixer is MixerKind.ATTENTION and m.qk_l2_norm and kind.rope:
        # Llama 4: a weightless L2 norm of each query and key head on the rotary layers
        # (Llama4TextAttention: use_qk_norm and use_rope)
        total += _op_seconds(job, "l2norm", (m.q_width + m.kv_width) / lay.tp * t, backward, cal)
    if kind.mixer is MixerKind.ATTENTION and m.attn_temperature_tuning and not kind.rope:
        # Llama 4's NoPE layers: queries times log1p(floor((pos + 1) / floor_scale))·attn_scale + 1
        total += _op_seconds(job, "qscale", m.q_width / lay.tp * t, backward, cal)
    # a gated GELU moves the bytes of SwiGLU; squared ReLU reads one f-wide input and writes one
    # output, as GELU: priced as the GELU op
    act = "swiglu" if m.mlp.gated else "gelu"
    if backward:
        total += dgrad_sum_seconds(job, kind, cal)
    if not kind.mlp:
        return total
    def activation(elements: float) -> float:
        return _op_seconds(job, act, elements, backward, cal) + clamp_seconds(job, elements, backward=backward, cal=cal)

    if kind.moe:
        assert m.moe is not None
        routed = expert_tokens_per_gpu(job)
        total += activation(m.moe.expert_ffn_hidden_size / job.etp * routed)
        if m.moe.num_shared_experts:
            total += activation(m.moe.num_shared_experts * m.moe.shared_width / lay.tp * t)
        total += permutation_seconds(job, routed, cal)
    else:
        total += activation(m.ffn_hidden_size / lay.tp * t)
    return total


def dgrad_sum_seconds(job: Job, kind: LayerKind, cal: Calibration) -> float:
    """Autograd's sums of the input gradients of separate projections reading one input (wq, wk,
    wv; w1 and w3 of a gated MLP; linear_modules): each further gradient arriving for the same
    tensor is added to the first, old_var + var or old_var.add_(var), one kernel reading two and
    writing one (pytorch/pytorch@4537ef6c torch/csrc/autograd/input_buffer.cpp accumulate, called
    by InputBuffer::add). Over the layer input each tp rank holds whole, h per token."""
    m = job.model
    if fused_projections(job):
        return 0.0
    sums = 2 if kind.mixer is MixerKind.ATTENTION and m.mla is None else 0
    if kind.mlp and not kind.moe and m.mlp.gated:
        sums += 1
    return sums * _op_seconds(job, "add", m.hidden_size * tokens(job), False, cal)


def qkv_copy_bytes(q_width: float, kv_width: float, *, backward: bool) -> tuple[float, int]:
    """16-bit bytes per token and kernels of the copies nanotron's multi-head attention makes around
    its fused qkv projection (TrainingSpec.qkv_copy_kept), over the rank's q and kv widths.
    Forward (huggingface/nanotron@c2528430 src/nanotron/models/llama.py:470-473, 655-657):
    qkv.view.permute.contiguous reads and writes the [q|k|v] output, 4·(q + 2kv); torch.cat of k
    and v, 8kv; that pair's permute.contiguous, 8kv. Backward (autograd of the same lines): the
    k/v split at L660 is a cat of their gradients, 8kv; unpacking q, k, v from the permuted copy
    (unbind) is a stack of theirs, 4·(q + 2kv); the stacked gradient, permuted back, is not a view
    of [seq, batch, q + 2kv]: its reshape copies it, 4·(q + 2kv); contiguous() passes gradients on."""
    if backward:
        return 8 * kv_width + 8 * (q_width + 2 * kv_width), 3
    return 4 * (q_width + 2 * kv_width) + 16 * kv_width, 3


def qkv_copy_seconds(job: Job, kind: LayerKind, *, backward: bool, cal: Calibration) -> float:
    """qkv_copy_bytes over the rank's tokens at the stream fraction of HBM bandwidth, on the
    multi-head attention layers of TrainingSpec.qkv_copy_kept."""
    m, tp = job.model, job.layout.tp
    if not (job.training.qkv_copy_kept and kind.mixer is MixerKind.ATTENTION and m.mla is None
            and m.kv_heads == m.num_attention_heads):
        return 0.0
    per_token, kernels = qkv_copy_bytes(m.q_width / tp, m.kv_width / tp, backward=backward)
    return memory_seconds(job, per_token * tokens(job), cal, launches=kernels)


def bias_grad_seconds(job: Job, kind: LayerKind, cal: Calibration) -> float:
    """The bias gradients that no GEMM epilogue computes, one reduction kernel each per backward,
    reading the 16-bit output gradient once (the reduced bias gradient is a row).

    Megatron adds the biases of linear_proj, linear_fc1 and linear_fc2 outside their GEMMs
    (skip_bias_add=True, Megatron-LM@d98e8a64 megatron/core/transformer/attention.py:420,
    mlp.py:226, 249): fc1's in the fused bias-GELU / bias-SwiGLU or a plain add (mlp.py:262-322),
    proj's and fc2's in bias-dropout-add (megatron/core/fusions/fused_bias_dropout.py:42-46,
    x = x + bias). Their backward hands the bias a gradient of the output's full shape
    (fused_bias_gelu.py:44-47, GeLUFunction.backward returns tmp for both input and bias; the
    broadcast add's gradient likewise), which autograd reduces to the bias's shape with at::sum_to
    (pytorch/pytorch@e1253a95 torch/csrc/autograd/engine.cpp validate_outputs). linear_qkv keeps
    its bias (skip_bias_add=False, attention.py:1699) and Transformer Engine's GEMM adds it and
    reduces its gradient in the cuBLASLt epilogue. Routed experts' biases are not counted.

    torchtitan and DeepSpeed run nn.Linear: its forward adds the bias in the GEMM's epilogue (the
    `_bias` cuBLASLt kernels of the H200 traces of benchmarks/data/measured), and autograd reduces
    the output gradient to every bias's shape with one sum kernel each (the addmm derivative of
    pytorch/pytorch tools/autograd/derivatives.yaml, `self: maybe_multiply(grad, beta.conj())`, summed
    to the bias's size by at::sum_to in validate_outputs as above; 145 bf16 sum kernels a step, 4.4 ms,
    in the 1.7B GPT's H200 trace, h200-validate-trace-summary-2026-11-27c.json): the qkv projection's
    too."""
    m = job.model
    t = tokens(job)
    residual_tokens = t / (job.layout.tp if job.sp else 1)
    widths = []  # elements of each reduced gradient
    if job.training.framework is not Framework.MEGATRON and m.qkv_bias and kind.mixer is MixerKind.ATTENTION:
        widths.append(qkv_elements(job))
    if m.out_bias and kind.mixer is MixerKind.ATTENTION:
        widths.append(m.hidden_size * residual_tokens)
    if m.mlp_bias and kind.mlp and not kind.moe:
        fc1 = m.ffn_hidden_size * (2 if m.mlp.gated else 1)
        widths += [fc1 / job.layout.tp * t, m.hidden_size * residual_tokens]
    return sum(memory_seconds(job, w * ACT_BYTES, cal, launches=1) for w in widths)


def qkv_elements(job: Job, *, kv: bool = True) -> float:
    """Elements of a rank's linear_qkv output: the whole sequence of its tokens (column-parallel)
    over its q, k and v heads, width / tp; over its q heads only where not `kv`."""
    m = job.model
    return tokens(job) * (m.q_width + (2 * m.kv_width if kv else 0)) / job.layout.tp


# Megatron's local linear_qkv bias per output element: forward `output + bias` reads the GEMM's
# 16-bit output and writes the sum (2 + 2; the bias row is read once), backward grad_output.sum(0)
# reads the 16-bit output gradient once (2).
QKV_BIAS_ADD_BYTES = 2 + 2
QKV_BIAS_GRAD_BYTES = 2


def qkv_bias_seconds(job: Job, kind: LayerKind, *, backward: bool, cal: Calibration) -> float:
    """The linear_qkv bias kernels of TrainingSpec.qkv_bias_unfused (Megatron's local linears): an add
    over the projection's output in forward, one reduction of its gradient in backward, each over the
    rank's tokens and its q, k, v heads (the column-parallel output: whole sequence, width / tp)."""
    if not (job.training.qkv_bias_unfused and job.model.qkv_bias and kind.mixer is MixerKind.ATTENTION):
        return 0.0
    moved = qkv_elements(job) * (QKV_BIAS_GRAD_BYTES if backward else QKV_BIAS_ADD_BYTES)
    return memory_seconds(job, moved, cal, launches=1)


# TrainingSpec.qkv_bshd_copies per q, k, v element: forward each copy reads the strided view and
# writes the bshd tensor (2 + 2); backward torch.cat reads the three gradients and writes the fused
# one (2 + 2).
QKV_COPY_BYTES = 2 + 2


def qkv_layout_copy_seconds(job: Job, kind: LayerKind, *, backward: bool, cal: Calibration) -> float:
    """TrainingSpec.qkv_bshd_copies: three copies (q, k, v) in forward, one torch.cat in backward,
    over the rank's tokens and its q, k, v heads."""
    if not (job.training.qkv_bshd_copies and kind.mixer is MixerKind.ATTENTION):
        return 0.0
    return memory_seconds(job, qkv_elements(job) * QKV_COPY_BYTES, cal, launches=1 if backward else 3)


def local_attention_copy_seconds(job: Job, kind: LayerKind, *, backward: bool, cal: Calibration) -> float:
    """TrainingSpec.local_attention_copies, over the rank's tokens and heads, 16-bit elements read
    and written once each (2 + 2 bytes): forward the context's permute copy over the q heads;
    backward the cat of the q, k and v gradients over all three, and the two alpha multiplies over
    the q-head-wide dQ and dK (the expanded keys with grouped queries: their repeat_interleave is
    not counted)."""
    if not (job.training.local_attention_copies and kind.mixer is MixerKind.ATTENTION):
        return 0.0
    q = qkv_elements(job, kv=False)
    if not backward:
        return memory_seconds(job, q * QKV_COPY_BYTES, cal, launches=1)
    return memory_seconds(job, (qkv_elements(job) + 2 * q) * QKV_COPY_BYTES, cal, launches=3)


# TrainingSpec.flash_unpad_copies, read at mosaicml/llm-foundry@5e85bd62d llmfoundry/models/layers/
# attention.py flash_attn_fn (L270-289, 367-369) and Dao-AILab/flash-attention@v2.4.2 (1a2c3e8c)
# flash_attn/bert_padding.py. Each of q, k and v is unpadded by its own unpad_input call (L98-122):
# mask.sum(dim=-1), torch.nonzero(mask.flatten()), seqlens.max().item(), cumsum and F.pad over the
# (batch, seq) mask, then index_first_axis, a torch.gather of the rows of the strided split view
# (L8-19; the index is repeat(indices, "z -> z d"), an expand in einops' torch backend, no copy).
# The output goes back through pad_input (L197-209): index_put_first_axis, torch.zeros over the padded
# rows, then output[indices] = values (L41-53). Backward: the pad's gradient is grad_output[indices]
# (L56-61); each unpad's is torch.zeros and scatter_ (L21-35). The gathered tensors are contiguous, so
# flash_attn_varlen_func's maybe_contiguous copies nothing (flash_attn_interface.py L83-84, 176-178),
# and the rearranges between 'nnz (h d)' and 'nnz h d' are views. Per token, 16-bit elements over
# the rank's q width (q) and k and v widths (kv each): forward the gathers read and write q, k, v,
# 4·(q + 2kv), the pad writes zeros (2q) and reads and writes the output (4q); backward the pad's
# gather 4q, the unpads' zeros and scatters 6·(q + 2kv). The int64 index, one per row, is read from
# cache across a row's elements (8 bytes per token against at least 4·q) and is not counted.
FLASH_UNPAD_GATHER_BYTES = 2 + 2  # a gather reads and writes each element
FLASH_UNPAD_ZEROS_PUT_BYTES = 2 + 2 + 2  # zeros writes it, then index_put / scatter_ read and write it
# One launch per op the code names (three unpad_input calls of sum, nonzero, max, cumsum, pad and
# gather; zeros and index_put in pad_input), and backward one gather and three zeros + scatter_
# pairs. nonzero's count copy and .item() each wait for the GPU (two host syncs per unpad_input call):
# that stall has no measured price here and is not counted.
FLASH_UNPAD_FWD_LAUNCHES = 3 * 6 + 2
FLASH_UNPAD_BWD_LAUNCHES = 1 + 3 * 2


def flash_unpad_bytes(q_width: float, kv_width: float, *, backward: bool) -> float:
    """16-bit bytes per token moved around the flash-attn 2 varlen kernel by llm-foundry's unpad and
    pad (TrainingSpec.flash_unpad_copies), over a rank's q width and the width of each of k and v."""
    qkv = q_width + 2 * kv_width
    if backward:
        return FLASH_UNPAD_GATHER_BYTES * q_width + FLASH_UNPAD_ZEROS_PUT_BYTES * qkv
    return FLASH_UNPAD_GATHER_BYTES * qkv + FLASH_UNPAD_ZEROS_PUT_BYTES * q_width


def flash_unpad_copy_seconds(job: Job, kind: LayerKind, *, backward: bool, cal: Calibration) -> float:
    """TrainingSpec.flash_unpad_copies: flash_unpad_bytes over the rank's tokens at the stream fraction
    of HBM bandwidth, with the unpad and pad kernels' launches, on attention layers."""
    if not (job.training.flash_unpad_copies and kind.mixer is MixerKind.ATTENTION):
        return 0.0
    m, tp = job.model, job.layout.tp
    moved = flash_unpad_bytes(m.q_width / tp, m.kv_width / tp, backward=backward) * tokens(job)
    return memory_seconds(job, moved, cal, launches=FLASH_UNPAD_BWD_LAUNCHES if backward else FLASH_UNPAD_FWD_LAUNCHES)


def permutation_seconds(job: Job, routed: int, cal: Calibration) -> float:
    """Permute (gather each token's top-k copies, 2 bytes read and written per element) and
    unpermute (weighted scatter-add back, the same bytes) of `routed` copies of width h, one pass
    (forward; backward is the transpose: the same kernels swapped)."""
    impl = _impl(job, "permute").value
    moved = 2 * ACT_BYTES * routed * job.model.hidden_size
    # two kernels each: the index computation from the routing map and the copy (gather or scatter-add)
    return memory_seconds(job, moved, cal, op=f"permute.{impl}", launches=2) + memory_seconds(
        job, moved, cal, op=f"unpermute.{impl}", launches=2)


# --- fp8 casts (torchao) --------------------------------------------------------------------------

# A dynamically scaled cast to fp8 reads its 16-bit input twice (the amax reduction, then the
# scaled cast: the scale depends on the whole tensor or row, so the two cannot share a pass) and
# writes 1 byte per element.
FP8_CAST_BYTES = 5


def fp8_casts_separate(job: Job) -> bool:
    """Whether fp8 casts run as kernels of their own. torchao (torchtitan) casts each operand of
    each of the three GEMMs of a linear, forward and backward (torchao "Quantized Training" docs:
    to_fp8 of input and weight; of grad_output and weight; of input.t and grad_output).
    Transformer Engine's casts are priced by te_cast_seconds (Megatron) or _te_fp8 (DeepSpeed)."""
    tr = job.training
    return tr.precision is Precision.FP8 and tr.framework is Framework.TORCHTITAN and job.cluster.gpu.peak_flop_per_s.fp8 is not None


# An fp8 transpose copy reads and writes 1 byte per element: torchao making an operand column-major
# for torch._scaled_mm (preprocess_addmm: a_data.contiguous() for a transposed left operand,
# b_data.t().contiguous().t() for a row-major right one; pytorch/ao@62430408
# torchao/float8/float8_ops.py:329-332), Transformer Engine's transposes by hand (te_cast_bytes)
FP8_TRANSPOSE_BYTES = 2

# The (column-parallel, row-parallel) GEMM pairs of flops.layer_gemms that tp splits, one per block:
# tp gathers the column GEMM's input and reduce-scatters the row GEMM's output (Megatron's
# ColumnParallelLinear / RowParallelLinear; tp_blocks)
TP_PAIRS = (("qkv", "out_proj"), ("in_proj", "mamba_out_proj"), ("shared_fc1", "shared_fc2"), ("mlp_fc1", "mlp_fc2"))
ROW_PARALLEL = frozenset(row for _, row in TP_PAIRS)
COLUMN_PARALLEL = frozenset(col for col, _ in TP_PAIRS)
# The pairs torchtitan's float8 tp plan swaps in Float8ColwiseParallel / Float8RowwiseParallel for:
# the dense Llama block's attention and feed-forward (float8_tp's citation)
FLOAT8_TP_COLUMN = frozenset({"qkv", "mlp_fc1"})
FLOAT8_TP_ROW = frozenset(row for col, row in TP_PAIRS if col in FLOAT8_TP_COLUMN)


def float8_tp(job: Job) -> bool:
    """Whether torchtitan runs its float8 tensor parallelism: with tensorwise float8 linears and
    tp > 1 the block plan swaps in torchao's Float8ColwiseParallel, Float8RowwiseParallel and
    PrepareFloat8ModuleInput (pytorch/torchtitan@820504e2 torchtitan/models/llama3/
    parallelize_llama.py:56-65, 154-197; the same at 9dec370 and 3faaa1a0 torchtitan/parallelisms/
    parallelize_llama.py apply_tp's enable_float8, when tensorwise was the only recipe). They cast
    each block's sequence-sharded input to fp8 before its all-gather, and each row-parallel output's
    gradient on its shard before the backward all-gather, so both gathers move 1 byte per element
    (pytorch/ao@62430408 torchao/float8/float8_tensor_parallel.py:48-72, 137-153, 218-241); rowwise
    recipes keep plain TP with 16-bit gathers."""
    tr = job.training
    return (fp8_casts_separate(job) and not rowwise_linears(job) and tr.fp8_recipe is Fp8Recipe.TENSORWISE
            and job.layout.tp > 1 and job.sp)



def te_quantized_gathers(job: Job) -> bool:
    """Whether Megatron's Transformer Engine linears all-gather their sequence-parallel operands
    quantised: fp8 GEMMs (delayed, tensorwise current or MXFP8 scaling) or NVFP4, tp > 1 with
    sequence parallelism.

    Every Transformer Engine release the mapped runs use does so with per-tensor fp8 scaling, with
    NCCL as with userbuffers; only the reduce-scatters stay in the 16-bit activation dtype:
    - forward, a column-parallel linear's input: the norm writes it in fp8 (or the local input is
      cast) on the rank's own tokens and the fp8 tensor is gathered. release_v0.8 (8e5f00f2)
      transformer_engine/pytorch/module.py:874, 936 (LayerNormLinear), 1716 (Linear); v0.11
      (3f01b4f8) module/layernorm_linear.py:113-124, 146, linear.py:99-127, layernorm_mlp.py:141-142,
      178; 4ee8e8ec layernorm_linear.py:115, 150; v1.6rc1 (9e4091e7) layernorm_linear.py:130, 159;
      v2.2.1 (d0c452cc) layernorm_linear.py:165-175, 212-228; v2.5 (f05f12c9) layernorm_linear.py:250;
      release_v2.8 (40c69e75) layernorm_linear.py:187-193, 247-266, linear.py:175-208;
    - backward, the same input again for the wgrad: the local fp8 shard is saved and gathered once
      more beside the dgrad (v0.11 layernorm_linear.py:308-311, linear.py:301-309, layernorm_mlp.py:475;
      4ee8e8ec layernorm_linear.py:318; 9e4091e7 :422; d0c452cc :599-613; 40c69e75 :400-414, 650-674),
      its fp8 transpose written after the gather on TN-only GPUs (te_transposes);
    - backward, a row-parallel linear's output gradient: cast on the local tokens and gathered in fp8
      before the dgrad (base.py grad_output_preprocess: v0.11 :703-726, 8e5f00f2 module.py:723-741,
      4ee8e8ec base.py:714-732, 9e4091e7 :678-699, d0c452cc :827-874, f05f12c9 :1044-1105, 40c69e75
      :1131-1193).
    From v2.0 a quantised tensor goes through gather_along_first_dim, whose per-tensor fp8 branch
    casts row-wise only and gathers the uint8 data (40c69e75 distributed.py:903-985 _all_gather_fp8,
    1577-1656; d0c452cc :858-935), the MXFP8 branch each usage asked for with its scales
    (MXFP8_BYTES), the NVFP4 branch likewise (NVFP4_BYTES). Under userbuffers the all-gather buffers
    are uint8 alike (memory.ub_gather_bytes)."""
    return job.training.framework is Framework.MEGATRON and job.sp and job.layout.tp > 1 and (
        te_nvfp4(job) or _gemm_precision(job) is Precision.FP8)


def tp_gather_bytes(job: Job) -> float:
    """Bytes per element of the column inputs tp all-gathers (forward, and again in backward for the
    wgrad where the framework re-gathers them): fp8 under torchtitan's float8_tp; under Megatron's
    te_quantized_gathers one usage of the quantised tensor, 1 byte with per-tensor fp8 scaling (the
    row-wise data forward and backward), MXFP8_BYTES (row-wise forward, column-wise backward:
    TransformerEngine@40c69e75 layernorm_linear.py:247-266, 650-660) and NVFP4_BYTES (linear.py:
    196-207, 370-385, layernorm_linear.py:246-265); else 16-bit. The row outputs' gradients are
    tp_grad_gather_bytes."""
    if float8_tp(job):
        return 1
    if not te_quantized_gathers(job):
        return ACT_BYTES
    if te_nvfp4(job):
        return NVFP4_BYTES
    return MXFP8_BYTES if job.training.fp8_recipe is Fp8Recipe.MXFP8 else 1


def tp_grad_gather_bytes(job: Job) -> float:
    """Bytes per element of a row-parallel linear's output gradient that tp all-gathers before its
    dgrad. The row-parallel linear's quantizer asks for both usages (the dgrad's row-wise, the
    wgrad's column-wise: TransformerEngine@40c69e75 transformer_engine/pytorch/module/linear.py:
    564-574; module/base.py:1161-1193 grad_output_preprocess): a per-tensor fp8 gather casts the
    row-wise data alone and writes the transpose after it on TN-only GPUs (distributed.py:925-940,
    966-982), 1 byte; MXFP8 and NVFP4 gather both usages (distributed.py:1528-1571 and 1275-1420),
    2 x MXFP8_BYTES and 2 x NVFP4_BYTES. Else tp_gather_bytes."""
    if te_quantized_gathers(job):
        if te_nvfp4(job):
            return 2 * NVFP4_BYTES
        if job.training.fp8_recipe is Fp8Recipe.MXFP8:
            return 2 * MXFP8_BYTES
    return tp_gather_bytes(job)


def _float8_tp_cast_bytes(g: Gemm, tp: int) -> tuple[float, float]:
    """(forward, backward) bytes one GEMM's fp8 casts and transposes move under float8_tp, the
    GEMM's m rows being the gathered tokens (fp8_cast_bytes)."""
    m, k, n = g.m, g.k, g.n
    weight = FP8_CAST_BYTES * k * n
    if g.name in FLOAT8_TP_COLUMN:
        # input cast once on its sequence shard, gathered in fp8 and saved as fp8 (the wgrad
        # transposes it); the output's gradient cast once at the module boundary
        # (NoopFwToFloat8BwDynamic), used as is by the dgrad and transposed for the wgrad
        fwd = FP8_CAST_BYTES * m * k / tp + weight
        bwd = (FP8_CAST_BYTES + FP8_TRANSPOSE_BYTES) * m * n + FP8_TRANSPOSE_BYTES * m * k + weight
    elif g.name in FLOAT8_TP_ROW:
        # input cast before the module (Float8RowwiseParallel._prepare_input_fn) and saved as fp8;
        # the output's gradient cast on its sequence shard, gathered in fp8, transposed for the wgrad
        fwd = FP8_CAST_BYTES * m * k + weight
        bwd = FP8_CAST_BYTES * m * n / tp + FP8_TRANSPOSE_BYTES * (m * n + m * k) + weight
    else:
        return _linear_cast_bytes(g)
    return fwd * g.count, bwd * g.count


def _linear_cast_bytes(g: Gemm) -> tuple[float, float]:
    """(forward, backward) bytes of a GEMM (m x k)·(k x n) whose Float8Linear casts each operand
    of each of its GEMMs: input and weight forward (mk + kn), grad_output twice, weight and input
    backward (2mn + kn + mk)."""
    m, k, n = g.m, g.k, g.n
    return FP8_CAST_BYTES * (m * k + k * n) * g.count, FP8_CAST_BYTES * (2 * m * n + k * n + m * k) * g.count


def fp8_cast_bytes(job: Job, kind: LayerKind) -> tuple[float, float]:
    """Bytes the fp8 casts of one layer move for one micro-batch, (forward, backward). A GEMM
    (m x k)·(k x n) casts input and weight forward (mk + kn), and grad_output twice, weight and
    input backward (2mn + kn + mk): torchao's Float8Linear saves its 16-bit input and weight and
    casts each operand of each GEMM itself (pytorch/ao@62430408 torchao/float8/float8_linear.py:
    76-114, 126-246). Under float8_tp the tp plan casts the inputs and output gradients at the
    module boundaries instead, where they are shards or saved in fp8 (_float8_tp_cast_bytes).
    The scalar amax all-reduce over tp each DTensor cast waits for is step_time.float8_amax_reductions."""
    if not fp8_casts_separate(job) or rowwise_linears(job):  # rowwise casts are in linear_factor
        return 0.0, 0.0
    gemms = layer_gemms(job, kind)
    in_tp_plan = float8_tp(job)
    parts = [_float8_tp_cast_bytes(g, job.layout.tp) if in_tp_plan else _linear_cast_bytes(g) for g in gemms]
    return sum(f for f, _ in parts), sum(b for _, b in parts)


# --- fp8 casts (Transformer Engine under Megatron) -------------------------------------------------

# A Transformer Engine tensorwise (delayed-scaling) cast reads the 16-bit tensor (2 bytes) and writes
# fp8 (1); where the tensor is also needed along its other axis and the GPU's fp8 GEMMs take only the
# TN layout, the same kernel writes the transposed copy (1 more): TransformerEngine@40c69e75
# transformer_engine/pytorch/csrc/quantizer.cpp:126-137 (Float8Quantizer::create_tensor allocates the
# transpose only for columnwise usage without non-TN support), utils.py:461-468
# (is_non_tn_fp8_gemm_supported: compute capability 10.x, 11.x and 13+ take any layout, Hopper does not).
TE_CAST_BYTES = 3
# The linears whose input Transformer Engine's norm kernel emits already in fp8: Megatron's TE spec
# builds qkv (without MLA) and a dense MLP's fc1 as TELayerNormColumnParallelLinear
# (Megatron-LM@d98e8a64 megatron/core/models/gpt/gpt_layer_specs.py:145, 541-546), whose forward
# passes the input quantizer to the norm (TransformerEngine@40c69e75
# transformer_engine/pytorch/module/layernorm_linear.py:197-218 with_quantized_norm). Under sequence
# parallelism that fp8 output is gathered row-wise only (L186-193) and, on TN-only GPUs, transposed by
# hand in backward for the wgrad (L649-659, "we compute FP8 transposes manually"): one fp8 read and
# one fp8 write per element (FP8_TRANSPOSE_BYTES).
TE_NORM_FED = frozenset({"qkv", "mlp_fc1"})
# Transformer Engine's current-scaling quantize of a 16-bit tensor, Float8CurrentScalingQuantizer::
# quantize_impl (TransformerEngine@40c69e75 transformer_engine/pytorch/csrc/quantizer.cpp:498-531):
# nvte_compute_amax reads the tensor (2 bytes per element), nvte_compute_scale_from_amax turns the
# amax into the scale (one small kernel), then nvte_quantize_v2 casts as a delayed-scaling cast does,
# so each cast runs TE_CURRENT_KERNELS more kernels and reads the input once more. A norm feeding
# the linear (TE_NORM_FED) cannot write fp8 without the scale: with the norm kernels of TE itself
# (NVTE_NORM_FWD_USE_CUDNN unset) it writes the 16-bit output with its amax fused
# (csrc/extensions/normalization.cpp:107-121 FUSED_NORM_AMAX_FP8), one byte more per element than
# its fp8 output, and quantize_with_amax then scales and casts it (quantizer.cpp:533-540): the
# cast (TE_CAST_BYTES) and the scale kernel, no amax pass.
TE_AMAX_BYTES = 2
TE_CURRENT_KERNELS = 2
TE_NORM_WIDE_BYTES = 1
# The row-parallel linears (ROW_PARALLEL; Megatron builds them as TERowParallelLinear,
# gpt_layer_specs.py:147, 531): under sequence parallelism their output gradient arrives as the
# rank's 1/tp of the tokens and is all-gathered; TE casts the local part and gathers it in fp8, then
# writes the transpose of the gathered tensor by hand on TN-only GPUs (TransformerEngine@40c69e75
# module/base.py:1161-1193 grad_output_preprocess, distributed.py:973-980, the transpose after an
# fp8 gather).


def te_casts_separate(job: Job) -> bool:
    """Whether Transformer Engine's quantisation casts are priced as kernels of their own
    (te_cast_seconds): Megatron's TE linears with tensorwise (current) or delayed fp8 scaling and
    fp8 GEMMs, or with NVFP4 (te_nvfp4). Elsewhere (DeepSpeed with TE) its quantisation stays the
    measured autocast overhead on the GEMMs (_te_fp8)."""
    tr = job.training
    return te_nvfp4(job) or (tr.precision is Precision.FP8 and tr.framework is Framework.MEGATRON
                             and tr.fp8_recipe in (Fp8Recipe.TENSORWISE, Fp8Recipe.DELAYED)
                             and _gemm_precision(job) is Precision.FP8)


def te_nvfp4(job: Job) -> bool:
    """Whether Megatron's TE linears run NVFP4 GEMMs (precision fp4 on a GPU with fp4 tensor cores)."""
    return job.training.framework is Framework.MEGATRON and _gemm_precision(job) is Precision.FP4


def te_amax_reduced(job: Job) -> bool:
    """Whether a column-parallel linear's input quantizer and a row-parallel linear's grad_output
    quantizer reduce their amax over the tp group under sequence parallelism: fp8 current scaling
    (te_current_scaling) and NVFP4, whose quantizers TE customises alike (TransformerEngine@40c69e75
    transformer_engine/pytorch/module/linear.py:1663-1683 _customize_quantizers_nvfp4,
    layernorm_linear.py:1771; the all-reduce NVFP4Quantizer::quantize_impl waits for,
    csrc/quantizer.cpp:1523-1543)."""
    return te_current_scaling(job) or te_nvfp4(job)


def te_current_scaling(job: Job) -> bool:
    """Whether Megatron's TE linears quantise with Float8CurrentScaling: --fp8-recipe tensorwise
    (Megatron-LM@d98e8a64 megatron/core/fp8_utils.py:777-780); --fp8-recipe delayed takes its
    scales from earlier steps' amax history instead (DelayedScaling)."""
    return te_casts_separate(job) and job.training.fp8_recipe is Fp8Recipe.TENSORWISE


def te_transposes(gpu: GPUSpec) -> int:
    """1 where a cast also writes the transposed fp8 copy (fp8 GEMMs TN-only: before compute
    capability 10, and 12.x), else 0 (TE_CAST_BYTES)."""
    cc = gpu.compute_capability
    return 0 if (10, 0) <= cc < (12, 0) or cc >= (13, 0) else 1


# Transformer Engine's NVFP4 quantize of a 16-bit tensor, NVFP4Quantizer::quantize_impl
# (TransformerEngine@40c69e75 transformer_engine/pytorch/csrc/quantizer.cpp:1438-1640): without the
# random Hadamard transform, nvte_compute_amax reads the tensor (TE_AMAX_BYTES) and one nvte_quantize_v2
# reads it again and writes every usage asked for, NVFP4_BYTES each (L1497-1521, 1637-1638); the
# global scale is taken from the amax inside the quantize kernel, no kernel of its own. Linears ask
# for both usages of their input (row-wise for the fprop, column-wise for the wgrad: linear.py:178-194,
# 219-226, layernorm_linear.py:186-193), of their weight (row-wise, column-wise for the dgrad: linear.py:237-263)
# and of their output gradient (dgrad and wgrad), and an NVFP4 quantizer gathers column-wise data
# too (supports_only_rowwise_all_gather is False: tensor/quantized_tensor.py:263-265), so the casts run
# on each rank's own tokens under sequence parallelism and gather after (distributed.py:1275-1420
# _all_gather_nvfp4), with no transposes of their own.
NVFP4_CAST_BYTES = ACT_BYTES + 2 * NVFP4_BYTES  # read 16-bit, write the row-wise and column-wise copies
NVFP4_KERNELS = 2  # amax, quantize
# The random Hadamard transform, on by default for the column-wise usage of inputs and output
# gradients, not weights (recipe/__init__.py:411-446, NVTE_NVFP4_DISABLE_RHT unset;
# TrainingSpec.nvfp4_disable_rht): nvte_hadamard_transform_amax reads the tensor for both amaxes,
# the row-wise usage is quantised alone, and the column-wise one by the fused Hadamard-cast kernel,
# which reads the tensor once more (quantizer.cpp:1481-1496, 1545-1635; the 16-bit, 64-row, 128-column
# case the fused kernel takes, L1477-1478): one 16-bit read and one kernel more than without it.
NVFP4_RHT_BYTES = ACT_BYTES
NVFP4_RHT_KERNELS = 1
# A norm feeding the linear (TE_NORM_FED) computes its amax in the same kernel and writes its 16-bit
# output, which quantize_with_amax casts without another amax pass (csrc/extensions/normalization.cpp:
# 121-130 FUSED_NORM_AMAX_NVFP4, quantizer.cpp:1647-1670); with the Hadamard transform the norm runs
# unfused and the cast is a whole one (normalization.cpp:124-126, Impl::UNFUSED). The norm's 16-bit
# output is the one its own price already counts (COMPULSORY "norm").


def nvfp4_cast(job: Job, *, weight: bool = False) -> tuple[float, int]:
    """(bytes per element, kernels) of one NVFP4 quantize of a 16-bit tensor into both usages:
    NVFP4_CAST_BYTES and the amax read, plus the Hadamard transform's read on an input or output
    gradient unless TrainingSpec.nvfp4_disable_rht."""
    rht = not weight and not job.training.nvfp4_disable_rht
    return (NVFP4_CAST_BYTES + TE_AMAX_BYTES + NVFP4_RHT_BYTES * rht, NVFP4_KERNELS + NVFP4_RHT_KERNELS * rht)


def _nvfp4_cast_bytes(job: Job, kind: LayerKind) -> tuple[float, float, int, int]:
    """te_cast_bytes under NVFP4: per linear, its input (on the rank's 1/tp of the tokens under
    sequence parallelism for a column-parallel one, cast from the norm's amax when norm-fed) and its
    output gradient (a row-parallel one's likewise on the local tokens); the weight per step
    (te_weight_cast_bytes)."""
    shards = job.layout.tp if job.sp and job.layout.tp > 1 else 1
    per, kernels = nvfp4_cast(job)
    rht = not job.training.nvfp4_disable_rht
    fwd = bwd = 0.0
    fwd_kernels = bwd_kernels = 0
    for g in layer_gemms(job, kind):
        if g.name == "router":
            continue
        rows = g.m * g.count
        column = g.name in COLUMN_PARALLEL
        norm_fed = g.name in TE_NORM_FED and job.model.mla is None
        if norm_fed and not rht:
            fwd += NVFP4_CAST_BYTES * rows * g.k / shards
            fwd_kernels += 1
        else:
            fwd += per * rows * g.k / (shards if column else 1)
            fwd_kernels += kernels
        bwd += per * rows * g.n / (shards if g.name in ROW_PARALLEL else 1)
        bwd_kernels += kernels
    return fwd, bwd, fwd_kernels, bwd_kernels


def te_cast_bytes(job: Job, kind: LayerKind) -> tuple[float, float, int, int]:
    """(forward bytes, backward bytes, forward kernels, backward kernels) of Transformer Engine's
    fp8 casts in one layer for one micro-batch, for a GEMM (m x k)·(k x n) of layer_gemms:
    - forward, the input (m·k) unless a norm emits it in fp8 (TE_NORM_FED);
    - the weight (k·n) once per step: te_weight_cast_bytes, priced per rank and step
      (step_time.te_weight_cast_seconds), not per micro-batch;
    - backward, the output gradient (m·n), row- and column-wise in one cast (module/linear.py:564-600
      grad_output_preprocess); for a row-parallel linear under sequence parallelism only the local
      m·n/tp is cast and the gathered m·n transposed (ROW_PARALLEL); for a norm-fed linear the fp8
      transpose of its input.
    Under current scaling (te_current_scaling) each cast first reads its input for the amax and
    runs the scale kernel (TE_AMAX_BYTES, TE_CURRENT_KERNELS), and a norm-fed input is written
    in 16 bits by the norm and cast on its own (TE_NORM_WIDE_BYTES + TE_CAST_BYTES, two kernels),
    on the rank's 1/tp of the tokens under sequence parallelism (the norm's, gathered in fp8 after).
    The per-step amax and scale updates of delayed scaling are not priced. The output layer stays
    in 16 bits (head_time), the router is no TE linear. NVFP4: _nvfp4_cast_bytes."""
    if not te_casts_separate(job):
        return 0.0, 0.0, 0, 0
    if te_nvfp4(job):
        return _nvfp4_cast_bytes(job, kind)
    t = te_transposes(job.cluster.gpu)
    cast = TE_CAST_BYTES + t
    current = te_current_scaling(job)
    amax, extra = (TE_AMAX_BYTES, TE_CURRENT_KERNELS) if current else (0, 0)
    shards = job.layout.tp if job.sp and job.layout.tp > 1 else 1  # sequence-parallel token shards
    fwd = bwd = 0.0
    fwd_kernels = bwd_kernels = 0
    for g in layer_gemms(job, kind):
        if g.name == "router":
            continue
        norm_fed = g.name in TE_NORM_FED and job.model.mla is None
        if not norm_fed:
            fwd += (cast + amax) * g.m * g.k * g.count
            fwd_kernels += 1 + extra
        elif current:  # on the rank's own tokens under sequence parallelism, before the gather
            fwd += (TE_NORM_WIDE_BYTES + TE_CAST_BYTES) * g.m * g.k * g.count / shards
            fwd_kernels += TE_CURRENT_KERNELS
        if g.name in ROW_PARALLEL and shards > 1:
            bwd += ((TE_CAST_BYTES + amax) * g.m * g.n * g.count / shards
                    + FP8_TRANSPOSE_BYTES * t * g.m * g.n * g.count)
            bwd_kernels += 1 + t + extra
        else:
            bwd += (cast + amax) * g.m * g.n * g.count
            bwd_kernels += 1 + extra
        if norm_fed and t:
            bwd += FP8_TRANSPOSE_BYTES * g.m * g.k * g.count
            bwd_kernels += 1
    return fwd, bwd, fwd_kernels, bwd_kernels


def te_weight_cast_bytes(job: Job, kind: LayerKind) -> tuple[float, int]:
    """(bytes, kernels) of Transformer Engine's weight casts in one layer per step: each linear's
    weight (k·n) is cast once per step, the later micro-batches reusing the cached fp8 weight, since
    Megatron hands TE is_first_microbatch (Megatron-LM@d98e8a64
    megatron/core/extensions/transformer_engine.py:1336-1345, pipeline_parallel/schedules.py:496-497;
    TransformerEngine@40c69e75 module/layernorm_linear.py:280-296 get_weight_workspace); with fp8
    parameters the weight already is fp8 and only its transpose is written (FP8_TRANSPOSE_BYTES,
    TN-only GPUs). Under NVFP4 the weight's quantize writes both usages after an amax pass, without
    the Hadamard transform (nvfp4_cast with weight=True)."""
    if not te_casts_separate(job):
        return 0.0, 0
    gemms = [g for g in layer_gemms(job, kind) if g.name != "router"]
    if te_nvfp4(job):
        per_element, per_kernels = nvfp4_cast(job, weight=True)
        return sum(per_element * g.k * g.n * g.count for g in gemms), per_kernels * len(gemms)
    t = te_transposes(job.cluster.gpu)
    per_element = FP8_TRANSPOSE_BYTES * t if job.training.fp8_param_gather else TE_CAST_BYTES + t
    kernels = len(gemms) if per_element else 0
    return sum(per_element * g.k * g.n * g.count for g in gemms), kernels


# Transformer Engine's fp8 attention around cuDNN's kernels, per element, as FusedAttnFunc runs it
# (TransformerEngine@40c69e75 = v2.8 transformer_engine/pytorch/attention/dot_product_attention/
# backends.py:1105-1205 forward, 1380-1468 backward; the CP path quantises once per pass the same way,
# context_parallel.py:1209-1215). Megatron hands TE q, k and v as tensors of their own, so
# combine_and_quantize first concatenates them with torch.cat (utils.py:2028-2038: read and write
# 16 bits, FP8_ATTENTION_CAT_BYTES) and quantises the concatenation once, row-wise only
# (get_attention_quantizers, utils.py:1921-1944: no transposes). Current scaling (TE_AMAX_BYTES and
# TE_CURRENT_KERNELS before the cast): cuDNN writes the output in 16 bits, kept so for the backward
# (NVTE_DPA_FP8CS_O_in_F16, default 1: backends.py:139, 1172-1175, 1197-1199), and its dQ, dK, dV in
# 16 bits (backends.py:1413-1416); the backward quantises dO (backends.py:1386-1387). Delayed scaling:
# cuDNN writes an fp8 output, dequantised for the output projection (backends.py:1168-1170: read 1,
# write 2, FP8_DEQUANTIZE_BYTES), and fp8 dQ, dK, dV that combine_and_dequantize concatenates (read
# and write fp8, FP8_TRANSPOSE_BYTES) and dequantises (backends.py:1454-1463, utils.py:2085-2093).
FP8_ATTENTION_CAT_BYTES = 2 + 2
FP8_DEQUANTIZE_BYTES = 1 + 2


def fp8_attention_cast_bytes(job: Job, kind: LayerKind) -> tuple[float, float, int, int]:
    """(forward bytes, backward bytes, forward kernels, backward kernels) of the casts fp8 attention
    adds to one attention layer for one micro-batch, over the rank's q, k, v (qkv_elements) and its
    attention output (the q width): the comment above."""
    if not (job.training.fp8_attention and kind.mixer is MixerKind.ATTENTION):
        return 0.0, 0.0, 0, 0
    qkv, out = qkv_elements(job), qkv_elements(job, kv=False)
    if job.training.fp8_attention_current:
        cast = TE_CAST_BYTES + TE_AMAX_BYTES
        return ((FP8_ATTENTION_CAT_BYTES + cast) * qkv, cast * out, 1 + 1 + TE_CURRENT_KERNELS, 1 + TE_CURRENT_KERNELS)
    fwd = (FP8_ATTENTION_CAT_BYTES + TE_CAST_BYTES) * qkv + FP8_DEQUANTIZE_BYTES * out
    bwd = TE_CAST_BYTES * out + (FP8_TRANSPOSE_BYTES + FP8_DEQUANTIZE_BYTES) * qkv
    return fwd, bwd, 3, 3


def te_cast_seconds(job: Job, kind: LayerKind, cal: Calibration) -> tuple[float, float]:
    """(forward, backward) seconds of te_cast_bytes and fp8_attention_cast_bytes: memory-bound
    kernels at the stream fraction of HBM bandwidth, each paying a launch."""
    fwd, bwd, nf, nb = te_cast_bytes(job, kind)
    af, ab, naf, nab = fp8_attention_cast_bytes(job, kind)
    fwd, bwd, nf, nb = fwd + af, bwd + ab, nf + naf, nb + nab
    if not (fwd or bwd):
        return 0.0, 0.0
    return memory_seconds(job, fwd, cal, launches=nf), memory_seconds(job, bwd, cal, launches=nb)


# --- tensor-parallel blocks ------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """One tensor-parallel block of a layer: a column-parallel GEMM (qkv, fc1) whose input tp
    gathers, a row-parallel GEMM (out projection, fc2) whose output tp reduces; on one GPU for one
    micro-batch, the seconds of each GEMM a tp collective runs beside or is chunked with
    (step_time.tp_exposure; the row GEMM's wgrad has none beside it)."""

    col: Gemm
    row: Gemm
    col_fwd: float
    col_dgrad: float
    col_wgrad: float
    row_fwd: float
    row_dgrad: float
    # width per token of what tp gathers before the column GEMMs (and reduces in backward): the
    # hidden size, or under MLA the query and key/value latents (q_lora_rank + kv_lora_rank + rope;
    # the down projections run on each rank's own tokens, multi_latent_attention.py L636-668)
    gather_width: int = 0


def tp_blocks(job: Job, kind: LayerKind, *, cal: Calibration) -> tuple[Block, ...]:
    """The attention or Mamba block, and the dense MLP or an MoE layer's shared experts (routed
    experts are not split over tp: Megatron gives them their own etp, flops.moe_gemms)."""
    by_name = {g.name: g for g in layer_gemms(job, kind)}
    pairs = [(c, r) for c, r in TP_PAIRS if c in by_name]  # the mixer's block, then the MLP's
    out = []
    m = job.model
    for c, r in pairs:
        col, row = by_name[c], by_name[r]
        fwd, dgrad, wgrad = linear_pass_seconds(job, col, cal)
        width = m.hidden_size
        if c == "qkv" and m.mla is not None:
            # the key/value up projection runs beside the query one on the gathered latents
            kf, kd, kw = linear_pass_seconds(job, by_name["kv_up"], cal)
            fwd, dgrad, wgrad = fwd + kf, dgrad + kd, wgrad + kw
            width = (m.mla.q_lora_rank or m.hidden_size) + m.mla.kv_lora_rank + m.mla.qk_rope_head_dim
        row_fwd, row_dgrad, _ = linear_pass_seconds(job, row, cal)
        out.append(Block(col, row, fwd, dgrad, wgrad, row_fwd, row_dgrad, width))
    return tuple(out)


def chunk_seconds(g: Gemm, rows: int, job: Job, cal: Calibration, *, sm_share: float = 0.0) -> float:
    """A GEMM computed on `rows` of its m rows (a TP overlap step), on the SMs left after
    `sm_share` of them run communication kernels."""
    gpu, prec = job.cluster.gpu, _linear_precision(job)
    return sum(gemm_seconds(Gemm(x.name, max(1, rows), x.n, x.k, x.count), gpu, prec, cal) * module_factor(job, x)
               for x in linear_modules(job, g)) / (1 - sm_share)


# --- one layer -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerTime:
    """Seconds of one decoder layer for one micro-batch on one GPU, by kind of work and pass."""

    gemm: float  # forward GEMMs
    gemm_backward: float  # dgrad and wgrad GEMMs
    attention: float  # forward token-mixer kernels: attention (with cp merges), or Mamba's conv and scan
    attention_backward: float
    elementwise: float  # forward memory-bound ops
    elementwise_backward: float
    fp8_cast: float = 0.0  # forward casts (torchao; Transformer Engine under Megatron)
    fp8_cast_backward: float = 0.0

    @property
    def total(self) -> float:
        """The forward pass."""
        return self.gemm + self.attention + self.elementwise + self.fp8_cast


def linear_seconds(job: Job, gemms: list[Gemm], cal: Calibration) -> tuple[float, float]:
    """(forward, backward) seconds of a block's linear layers at the run's GEMM precision, with
    Transformer Engine's fp8 quantisation where it applies (torchao rowwise linears: bf16 times
    their measured ratio, linear_factor)."""
    passes = [linear_pass_seconds(job, g, cal) for g in gemms]
    return sum(f for f, _, _ in passes), sum(d + w for _, d, w in passes)


def layer_time(job: Job, kind: LayerKind, *, cal: Calibration) -> LayerTime:
    key = ("layer_time", kind, cal.key)
    if key in job.memo:
        return job.memo[key]
    fwd, bwd = linear_seconds(job, layer_gemms(job, kind), cal)
    att = mixer_kernels(job, kind, cal)
    cast_fwd, cast_bwd = fp8_cast_bytes(job, kind)
    te_fwd, te_bwd = te_cast_seconds(job, kind, cal)
    out = LayerTime(
        gemm=fwd,
        gemm_backward=bwd,
        attention=att.forward_s,
        attention_backward=att.backward_s,
        elementwise=elementwise_seconds(job, kind, backward=False, cal=cal),
        elementwise_backward=elementwise_seconds(job, kind, backward=True, cal=cal),
        fp8_cast=memory_seconds(job, cast_fwd, cal) + te_fwd,
        fp8_cast_backward=memory_seconds(job, cast_bwd, cal) + te_bwd,
    )
    job.memo[key] = out
    return out


def head_time(job: Job, cal: Calibration) -> float:
    """Output layer GEMM forward (in 16 bits: Megatron/TE keep the output layer out of fp8, so does
    torchtitan's float8 conversion)."""
    return gemm_seconds(head_gemm(job), job.cluster.gpu, Precision.BF16, cal)


def head_backward_time(job: Job, cal: Calibration) -> float:
    return sum(weight_backward_seconds(job, head_gemm(job), Precision.BF16, cal))


def head_pass_time(job: Job, cal: Calibration) -> float:
    """What the last pipeline stage runs beyond its decoder layers, per micro-batch: the output
    layer forward and backward, and the loss."""
    return head_time(job, cal) + head_backward_time(job, cal) + loss_time(job, cal)


# Cross-entropy on fp32 logits, per logit over forward and backward: read the 16-bit logits (2),
# write and re-read the fp32 softmax (4 + 4), write the fp32 gradient (4) and its 16-bit copy (2).
LOSS_BYTES_PER_LOGIT = 16
# The same on the 16-bit logits themselves (TrainingSpec.loss_on_16bit_logits): cross_entropy runs
# log_softmax in the input's dtype, then nll_loss (pytorch/pytorch@87dd4af9 aten/src/ATen/native/
# LossNLL.cpp cross_entropy_loss): log_softmax reads the logits and writes 16-bit log-probabilities
# (2 + 2); nll_loss's backward writes its zeros_like(log-probabilities) gradient (2); log_softmax's
# backward reads that gradient and its saved output and writes the logits' gradient (2 + 2 + 2).
LOSS_16BIT_BYTES_PER_LOGIT = 12


def loss_time(job: Job, cal: Calibration) -> float:
    """Forward and backward of the loss over the rank's vocabulary shard, at the measured rate of the
    framework's cross-entropy kernels (kernels.md §3.3). Under TrainingSpec.tp_replicated_vocab
    every tp rank takes the loss over the whole vocabulary: the logits are gathered whole
    (ColwiseParallel output_layouts=Replicate(), KempnerInstitute/KempnerForge@601aba9
    kempnerforge/distributed/tensor_parallel.py:157-164) or, on pipeline stages, computed whole."""
    vocab = local_vocab(job)
    op = {Impl.MEGATRON: "loss.megatron", Impl.MEGATRON_UNFUSED: "loss.megatron.unfused",
          Impl.COMPILE: "loss.fused"}.get(_impl(job, "loss"), "loss.eager")
    per_logit = LOSS_16BIT_BYTES_PER_LOGIT if job.training.loss_on_16bit_logits else LOSS_BYTES_PER_LOGIT
    moved = tokens(job) * vocab * per_logit
    # forward log-softmax and nll, their two backward kernels
    loss = memory_seconds(job, moved, cal, op=op, launches=4)
    if job.model.final_logit_softcap:
        # Gemma's logits / c, tanh, · c before the loss (Gemma2ForCausalLM.forward): three eager
        # kernels reading and writing 16-bit logits (4 bytes each), twice that in backward
        loss += memory_seconds(job, tokens(job) * vocab * LOGIT_SOFTCAP_BYTES, cal, launches=9)
    return loss


# Final-logit soft-capping per logit over forward and backward: 3 ops x (2 read + 2 write) forward,
# twice that in backward (each op's gradient reads its saved input and the incoming gradient).
LOGIT_SOFTCAP_BYTES = 3 * 4 * 3


# Optimizer step, bytes per parameter a rank updates. AdamW (torch fused/multi-tensor and Megatron
# FusedAdam): read fp32 param, grad, exp_avg, exp_avg_sq (16), write param, exp_avg, exp_avg_sq
# (12), write the 16-bit working copy (2); gradient-norm clipping reads the grads twice (8).
# SGD with momentum: read param, grad, momentum (12), write param, momentum (8), copy (2), clip (8).
# Composer's DecoupledAdamW loops over the tensors and runs each step of the update as its own op
# over fp32 (mosaicml/composer@v0.16.4 composer/optim/decoupled_weight_decay.py L237-264), bytes read
# and written: exp_avg.mul_ (4, 4) .add_(grad) (8, 4), exp_avg_sq.mul_ (4, 4) .addcmul_(grad, grad)
# (8, grad read once; 4), sqrt (4, 4), / sqrt(bias_correction2) (4, 4), .add_(eps) (4, 4),
# param.addcdiv_(exp_avg, denom) (12, 4): 80, with clipping's 8 as above; no 16-bit copy (FSDP1 casts
# the shard when it gathers it). The param.mul_ of weight decay (L243-246, 8 more) runs only for
# weight_decay != 0, which llm-foundry's MPT yamls leave at 0.0. Its per-tensor launches and the
# .item() that syncs the host before each tensor (L241) are not priced.
OPTIMIZER_BYTES_PER_PARAM = {OptimizerKind.ADAMW: 38, OptimizerKind.ADAM: 38, OptimizerKind.SGD: 30,
                             OptimizerKind.DECOUPLED_ADAMW: 88}
# The same update on bf16 parameters (TrainingSpec.bf16_params): torch's fused AdamW keeps exp_avg and
# exp_avg_sq zeros_like(param), bf16 (pytorch/pytorch@005941eb torch/optim/adam.py, Adam._init_group),
# and the .grad FSDP2 hands it is cast back to the parameter's dtype; the kernel reads param, grad,
# exp_avg, exp_avg_sq (8) and writes param, exp_avg, exp_avg_sq (6), with no 16-bit working copy to
# write; torch.nn.utils.clip_grad_norm_ (foreach _foreach_norm, then _foreach_mul_ by the clamped
# coefficient) reads the bf16 grads twice (4). KempnerInstitute/KempnerForge@01b461a
# kempnerforge/training/optimizer.py:66-73 (AdamW, fused), distributed/utils.py:81-87 (clipping).
# SGD keeps one bf16 momentum: read param, grad, momentum (6), write param, momentum (4), clip (4).
BF16_OPTIMIZER_BYTES_PER_PARAM = {OptimizerKind.ADAMW: 18, OptimizerKind.ADAM: 18, OptimizerKind.SGD: 14}


# Megatron's gradient preparation before the update, per parameter the rank updates
# (Megatron-LM@d98e8a64 megatron/core/optimizer/optimizer.py:741-764 prepare_grads): a 16-bit main
# grad is copied to an fp32 gradient, read 2 and write 4 (_copy_model_grads_to_main_grads,
# main_grad.float(), :1092-1097; distrib_optimizer.py:2792 per shard; an fp32 main grad's .float()
# copies nothing); fp16's grad scaler then unscales and checks the fp32 gradients in place, read 4
# and write 4 (torch._amp_foreach_non_finite_check_and_unscale_, :713-727).
GRAD_COPY_BYTES_PER_PARAM = 2 + 4
UNSCALE_BYTES_PER_PARAM = 4 + 4


def optimizer_time(job: Job, params: float, cal: Calibration) -> float:
    tr = job.training
    table = BF16_OPTIMIZER_BYTES_PER_PARAM if tr.bf16_params else OPTIMIZER_BYTES_PER_PARAM
    per_param = table[tr.optimizer]
    if tr.framework is Framework.MEGATRON:
        per_param += GRAD_COPY_BYTES_PER_PARAM if main_grad_bytes(job) == ACT_BYTES else 0
        per_param += UNSCALE_BYTES_PER_PARAM if tr.precision is Precision.FP16 else 0
    moved = params * per_param
    gpu = job.cluster.gpu
    return K.memory_seconds(moved, gpu) / cal.scale("optimizer_scale", gpu.architecture)
