"""Activation memory: the tensors autograd keeps for backward, per layer and micro-batch, on one GPU.

Follows Korthikanti et al. 2022 (Sec. 4, Table 2: 34·s·b·h + 5·a·s²·b bytes per GPT layer with
16-bit activations and 1-byte dropout masks), itemised tensor by tensor so that it extends to GQA,
SwiGLU, flash attention, context parallelism, MoE and each recompute mode. With the Korthikanti
setting (eager attention, dropout, GELU, layer norms, no norm statistics) the items sum to Table 2
exactly; tests check that, and check the items against the bytes torch actually saves.

Notation per GPU and micro-batch: s = seq_len/cp, b = mbs, t = s·b tokens, h = hidden size,
q = a·d query width over tp, kv = K/V width over tp, f = ffn width over tp; "/sp" means divided by
tp when sequence parallel shards the residual stream.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from cost_models import deepep
from cost_models.breakdown import Breakdown
from cost_models.enums import AttentionKernel, Fp8Recipe, Framework, MixerKind, MoEDispatch, NormKind, Precision, Recompute
from cost_models.flops import mamba_local, sac_recomputes
from cost_models.job import Job
from cost_models.states import local_kv_heads, local_vocab

ACT_BYTES = 2  # bf16/fp16 activations
FP32 = 4
# Bytes per element of an NVFP4 operand: e2m1 values two to a byte (NVFP4Quantizer::create_tensor
# allocates convert_shape_for_fp4(shape) uint8, the last dim halved) and one e4m3 scale byte per
# block of 16 (NVFP4_BLOCK_SIZE; rowwise_scale_inv) (TransformerEngine@40c69e75 transformer_engine/
# pytorch/csrc/quantizer.cpp:1185-1202); the per-tensor fp32 amax is 4 bytes a tensor, not counted.
# Each usage is a copy of its own: the column-wise one is the transposed tensor quantised along the
# other axis (quantizer.cpp:1205-1216), never the row-wise one reinterpreted.
NVFP4_BYTES = 0.5 + 1 / 16
FP8_BYTES = 1  # an fp8 (e4m3 / e5m2) element
# Bytes per element of an MXFP8 tensor's one usage: the e4m3/e5m2 values and one e8m0 scale per
# block of 32 along the quantised axis (MXFP8BlockScaling, block size 32), both all-gathered
# (TransformerEngine@40c69e75 transformer_engine/pytorch/distributed.py:1449-1576 _all_gather_mxfp8:
# the scale-inverses unpadded to rows x cols/32 row-wise, rows/32 x cols column-wise, then the data).
MXFP8_BYTES = 1 + 1 / 32


def operand_bytes(precision: Precision, recipe: Fp8Recipe | None = None) -> float:
    """Bytes per element of one usage of a quantised GEMM operand at the precision: FP8_BYTES for
    fp8 (MXFP8_BYTES under the MXFP8 recipe, its scales with it), NVFP4_BYTES for NVFP4, else the
    16-bit ACT_BYTES."""
    if precision is Precision.FP8:
        return MXFP8_BYTES if recipe is Fp8Recipe.MXFP8 else FP8_BYTES
    return NVFP4_BYTES if precision is Precision.FP4 else ACT_BYTES

MASK_BYTES = 1  # dropout masks are bytes (Korthikanti Sec. 4.1)
INDEX_BYTES = 8  # int64 token ids


@dataclass(frozen=True)
class Convention:
    """How a framework's kernels save tensors (each flag names the code it describes)."""

    # f-wide tensors SwiGLU keeps: 3 when a fused kernel saves [gate|up] and the product
    # (Megatron bias_swiglu_impl, megatron/core/fusions/fused_bias_swiglu.py); 4 when eager
    # silu(gate) * up keeps gate, silu(gate), up and the product (torchtitan FeedForward, HF LlamaMLP).
    swiglu_widths: int
    # K/V expanded to every query head before attention (torchtitan and HF repeat_kv) rather than
    # read per group by the kernel (Transformer Engine / flash-attn).
    gqa_expands_kv: bool
    # bytes per element a norm keeps: 2 = fused kernel saving its 16-bit input (TE, apex, torch
    # fused rms_norm); 6 = an fp32 upcast of the input plus the 16-bit normalised output (HF
    # LlamaRMSNorm-style eager code).
    norm_saved_bytes: int
    # With sequence parallel, column-parallel GEMMs keep the all-gathered input (DTensor autograd)
    # instead of the local shard that Megatron re-gathers in backward.
    sp_keeps_gathered_input: bool
    # fp8 linear layers keep fp8 copies of their inputs (Transformer Engine) instead of 16-bit
    # ones (torchao Float8Linear keeps high precision).
    fp8_saves_fp8_inputs: bool
    # selective recompute: Megatron recomputes core attention (--recompute-modules core_attn);
    # torchtitan's per-op SAC saves only matmul (every other one) and attention-kernel outputs.
    selective_per_op: bool
    # loss on fp32 logits: Megatron's vocab-parallel cross entropy turns its fp32 copy into the
    # softmax and the gradient in place; eager torch cross_entropy(logits.float()) keeps the
    # log-softmax output and makes new fp32 tensors for its gradient.
    loss_in_place: bool
    # An MoE layer weights its routed token copies by the router's scores in fp32 and keeps that fp32
    # copy for the scores' gradient: torchtitan's MoE runs `routed_output.to(torch.float32) *
    # top_scores` (torchtitan@decfd3fef^ torchtitan/models/deepseek_v3/model/moe.py:341-343;
    # @8a749c618^ torchtitan/models/moe.py:420-424) or torch.bmm(top_scores, routed_output_unsorted.float())
    # (@d021aa9ca^ torchtitan/models/moe/moe.py:534-542) for DeepSeek-V3's score_before_experts=False;
    # with score_before_experts=True (Llama 4) it scores routed_input.to(torch.float32) before the
    # experts instead (moe.py:411-415 at 8a749c618^) and sums the outputs, the same fp32 bytes.
    moe_combine_fp32: bool = False


CONVENTIONS = {
    Framework.MEGATRON: Convention(3, False, 2, False, True, False, True),
    Framework.TORCHTITAN: Convention(4, True, 2, True, False, True, False, moe_combine_fp32=True),
    Framework.DEEPSPEED: Convention(4, True, 6, True, False, False, False),
}


@dataclass(frozen=True)
class Dims:
    """Per-GPU sizes of one micro-batch (see the module docstring)."""

    b: int
    s: int
    h: int
    tp: int
    sp_div: int  # tp when the residual stream is sequence-parallel, else 1
    heads: int  # query heads on this rank
    q: int
    kv: int
    f: int
    vocab: int  # vocabulary columns on this rank
    lin_bytes: float  # bytes per element of a saved GEMM input
    conv: Convention
    # bytes per element of a norm-fed linear's saved input (qkv, a dense MLP's fc1): lin_bytes, but
    # under NVFP4 with sequence parallelism TE's LayerNormLinear keeps the row-wise usage beside the
    # column-wise one (TransformerEngine@40c69e75 transformer_engine/pytorch/module/
    # layernorm_linear.py:400-414: rowwise is dropped only for MXFP8 / block scaling or without the
    # gather)
    norm_fed_bytes: float

    @property
    def t(self) -> int:
        return self.s * self.b

    @property
    def residual(self) -> int:
        """Elements of the (possibly sequence-parallel) residual stream on this rank."""
        return self.t * self.h // self.sp_div

    @property
    def gemm_input_div(self) -> int:
        return 1 if self.conv.sp_keeps_gathered_input else self.sp_div


def dims(job: Job, conv: Convention | None = None) -> Dims:
    m, lay, tr = job.model, job.layout, job.training
    conv = conv or CONVENTIONS[tr.framework]
    if tr.eager_swiglu:
        conv = replace(conv, swiglu_widths=4)
    tp = lay.tp
    lin = saved_input_bytes(job, conv)
    return Dims(
        b=lay.mbs,
        s=job.seq_per_rank,
        h=m.hidden_size,
        tp=tp,
        sp_div=tp if job.sp else 1,
        heads=m.num_attention_heads // tp,
        q=m.q_width // tp,
        kv=local_kv_heads(job) * m.head_size,
        f=m.ffn_hidden_size // tp,
        # TrainingSpec.tp_replicated_vocab: every rank's logits span the whole vocabulary
        vocab=local_vocab(job),
        lin_bytes=lin,
        conv=conv,
        norm_fed_bytes=lin * (2 if tr.precision is Precision.FP4 and job.sp and tp > 1 else 1),
    )


def saved_input_bytes(job: Job, conv: Convention) -> float:
    """Bytes per element of what a linear saves of its input for the wgrad: the fp8 copy under fp8
    where the framework keeps one (Convention.fp8_saves_fp8_inputs); under NVFP4 the column-wise
    usage alone, its row-wise data dropped after the fprop (TransformerEngine@40c69e75
    transformer_engine/pytorch/module/linear.py:370-385 update_usage(rowwise_usage=False,
    columnwise_usage=True); layernorm_linear.py likewise), NVFP4_BYTES; else the 16-bit input."""
    tr = job.training
    return operand_bytes(tr.precision, tr.fp8_recipe) if conv.fp8_saves_fp8_inputs else ACT_BYTES


def block_output_mask(job: Job) -> bool:
    """Whether each block output keeps a 1-byte dropout mask of the residual stream's size: with
    hidden dropout, and under TrainingSpec.bda_mask_kept without it (TorchScript's dropout formula
    keeps the mask at p = 0)."""
    return job.model.hidden_dropout > 0 or job.training.bda_mask_kept


def _norm(job: Job, d: Dims, tokens: int, width: int) -> Breakdown:
    """A norm over `width` on `tokens` tokens: saved input, plus per-token fp32 statistics
    (rstd; and mean for LayerNorm)."""
    stats = 2 if job.model.norm is NormKind.LAYERNORM else 1
    return Breakdown.of(
        "bytes", input=tokens * width * d.conv.norm_saved_bytes, stats=tokens * stats * FP32
    )


def _mlp_activation(job: Job, d: Dims, tokens: int, width: int) -> Breakdown:
    """Saved tensors between the first and the last MLP matrix, fc2's input included. GELU and
    squared ReLU keep their input (fc1's output) and fc2 its own input."""
    if not job.model.mlp.gated:
        return Breakdown.of("bytes", gelu_input=tokens * width * ACT_BYTES, fc2_input=tokens * width * d.lin_bytes)
    kept = d.conv.swiglu_widths - 1  # all but fc2's input
    items = {"swiglu": tokens * width * kept * ACT_BYTES, "fc2_input": tokens * width * d.lin_bytes}
    clamp = clamp_widths(job)
    if clamp:
        items["clamp"] = tokens * width * clamp * ACT_BYTES
    return Breakdown.of("bytes", **items)


def clamp_widths(job: Job) -> int:
    """f-wide tensors GPT-OSS's clamped SwiGLU (ModelSpec.swiglu_limit) keeps beyond SwiGLU's.
    Eager (transformers GptOssExperts._apply_gate) keeps gate and up (the clamps' inputs), the
    sigmoid's output, the clamped gate, up + 1 and glu where eager SwiGLU keeps gate, silu(gate) and
    up: 3 more. Megatron's torch clamps keep their inputs, both halves of fc1's output, beside the
    clamped [gate|up] its fused kernel keeps (fused_bias_geglu.py L424-431 at d98e8a64): 2 more.
    torch.compile saves fc1's output for its fused kernel, as for SwiGLU: none."""
    if job.model.swiglu_limit is None or (job.training.compile and job.training.framework is not Framework.MEGATRON):
        return 0
    return 2 if job.training.framework is Framework.MEGATRON else 3


def _mla_projection_items(job: Job, d: Dims) -> dict[str, int | Breakdown]:
    """MLA's projections (megatron-core MLASelfAttention, flops.mla_gemms): the down projections
    read the rank's own tokens (replicated weights, no gather) and share that saved input; each
    latent norm keeps its input and statistics; the up projections keep the latents they read
    (gathered under sequence parallel, or the local shard Megatron gathers again)."""
    a = job.model.mla
    assert a is not None
    t, local = d.t, d.t // d.sp_div
    items: dict[str, int | Breakdown] = {"down_input": local * d.h * d.lin_bytes}
    if a.q_lora_rank is not None:
        items["q_latent_norm"] = _norm(job, d, local, a.q_lora_rank)
        items["q_up_input"] = t * a.q_lora_rank // d.gemm_input_div * d.lin_bytes
    elif d.gemm_input_div == 1 and d.sp_div > 1:
        # the one q projection is column-parallel: a convention that keeps the gathered input keeps
        # it beside the local shard the replicated kv down projection saved
        items["q_proj_input"] = t * d.h * d.lin_bytes
    items["kv_latent_norm"] = _norm(job, d, local, a.kv_lora_rank)
    items["kv_up_input"] = t * a.kv_lora_rank // d.gemm_input_div * d.lin_bytes
    return items


def attention_items(job: Job, d: Dims, *, rope: bool = True) -> Breakdown:
    """What an attention block keeps; `rope`: the layer applies the rotary embedding (Llama 4's
    L2 norm of q and k runs on those layers only)."""
    m, tr = job.model, job.training
    t = d.t
    kv_saved = d.q if d.conv.gqa_expands_kv else d.kv
    # widths on this rank of the saved keys, values and attention output: under MLA every head has
    # its own key (nope + the shared rope part, expanded) and value of v_head_dim
    k_width, v_width, o_width = kv_saved, kv_saved, d.q
    items: dict[str, int | Breakdown] = {"norm": _norm(job, d, t // d.sp_div, d.h)}
    if m.mla is not None:
        items.update(_mla_projection_items(job, d))
        k_width, v_width, o_width = d.q, d.heads * m.v_head_size, d.heads * m.v_head_size
    else:
        items["qkv_input"] = t * d.h // d.gemm_input_div * d.norm_fed_bytes
    if m.qk_norm:  # per-head norms over head_dim of q and k
        kv_heads = d.kv // m.head_size
        items["qk_norm"] = _norm(job, d, t * (d.heads + kv_heads), m.head_size)
    if m.qk_l2_norm and rope:
        # Llama 4's weightless L2 norm of q and k on rotary layers (transformers v5.23.0
        # Llama4TextL2Norm; Megatron-LM@d98e8a64 torch_norm.py L76-106 L2Norm): saved as a norm
        kv_heads = d.kv // m.head_size
        items["qk_l2_norm"] = _norm(job, d, t * (d.heads + kv_heads), m.head_size)
    # fp8 attention (TrainingSpec.fp8_attention) keeps the quantised q, k, v for its backward, not
    # the 16-bit ones (TransformerEngine@40c69e75 transformer_engine/pytorch/attention/
    # dot_product_attention/backends.py:1194-1201)
    qkv_bytes = FP8_BYTES if tr.fp8_attention else ACT_BYTES  # fp8_attention runs on flash attention only (rules)
    items["query"] = t * d.q * qkv_bytes
    items["key"] = t * k_width * qkv_bytes
    items["value"] = t * v_width * qkv_bytes
    if tr.qkv_copy_kept and m.mla is None and m.kv_heads == m.num_attention_heads:
        # TrainingSpec.qkv_copy_kept: the k and v parts of the [q|k|v] copy q is a view of
        items["qkv_copy"] = t * (k_width + v_width) * ACT_BYTES
    if tr.attention is AttentionKernel.FLASH:
        # flash-attn saves its output and the fp32 log-sum-exp per row (Dao 2023, Algorithm 2:
        # FlashAttention-2's forward returns O and L). Kernels write O as (b, s, heads, d), so the
        # output projection reads the same storage; only an fp8 linear keeps its own fp8 copy.
        items["attention_output"] = t * o_width * ACT_BYTES
        items["softmax_lse"] = d.b * d.heads * d.s * FP32
        if tr.fp8_attention:
            # the output kept in 16 bits under current scaling (NVTE_DPA_FP8CS_O_in_F16, default 1),
            # in fp8 under delayed scaling (backends.py:1196-1201); cuDNN's fp8 forward returns two fp32
            # statistics per row, M and ZInv (common/fused_attn/fused_attn_fp8.cu:2850-2863)
            items["attention_output"] = t * o_width * (ACT_BYTES if tr.fp8_attention_current else FP8_BYTES)
            items["softmax_lse"] = 2 * d.b * d.heads * d.s * FP32
        items["out_proj_input"] = t * o_width * d.lin_bytes if d.lin_bytes < ACT_BYTES else 0
        if tr.flash_unpad_copies:
            # TrainingSpec.flash_unpad_copies: the kernel's output is the unpadded (tokens, heads, d)
            # tensor; out_proj reads pad_input's new one, so both are kept. Each index_first_axis
            # saves its own int64 row indices (one torch.nonzero per unpad_input call, q, k and v;
            # pad_input's index_put_first_axis saves q's again): Dao-AILab/flash-attention@v2.4.2
            # flash_attn/bert_padding.py L11, 44, 109
            items["out_proj_input"] = t * o_width * d.lin_bytes
            items["unpad_indices"] = 3 * t * INDEX_BYTES
    else:
        scores = d.b * d.heads * d.s * d.s
        items["softmax_output"] = scores * ACT_BYTES
        if m.attention_sinks:
            # the softmax runs over the scores and one sink column (b, heads, s, s + 1), and keeps its
            # output (TransformerEngine@d0067d0d backends.py L682-694 UnfusedDotProductAttention;
            # transformers v5.23.0 modeling_gpt_oss.py eager_attention_forward); transformers also
            # subtracts the row max first, whose backward keeps its int64 index per row
            items["softmax_sink_column"] = d.b * d.heads * d.s * ACT_BYTES
            if job.training.framework is not Framework.MEGATRON:
                items["softmax_row_max_index"] = d.b * d.heads * d.s * INDEX_BYTES
        if m.attention_dropout > 0:
            items["attention_dropout_mask"] = scores * MASK_BYTES
            items["attention_dropout_output"] = scores * ACT_BYTES
        items["out_proj_input"] = t * o_width * d.lin_bytes
    if m.sandwich_norms:  # the norm of the attention output (Gemma's post_attention_layernorm)
        items["post_norm"] = _norm(job, d, t // d.sp_div, d.h)
    if block_output_mask(job):
        items["dropout_mask"] = d.residual * MASK_BYTES
    return Breakdown.of("bytes", **items)


def dense_mlp_items(job: Job, d: Dims) -> Breakdown:
    t = d.t
    items: dict[str, int | Breakdown] = {
        "norm": _norm(job, d, t // d.sp_div, d.h),
        "fc1_input": t * d.h // d.gemm_input_div * d.norm_fed_bytes,
        "activation": _mlp_activation(job, d, t, d.f),
    }
    if job.model.sandwich_norms:  # the norm of the MLP output (post_feedforward_layernorm)
        items["post_norm"] = _norm(job, d, t // d.sp_div, d.h)
    if block_output_mask(job):
        items["dropout_mask"] = d.residual * MASK_BYTES
    return Breakdown.of("bytes", **items)


def expert_tokens(job: Job, d: Dims) -> int:
    """Routed token copies one GPU's experts process per micro-batch, with balanced routing: its
    t/sp tokens times top_k, all-to-all over ep (which preserves the count on average), then
    all-gathered over etp (Megatron MoEAlltoAllTokenDispatcher)."""
    assert job.model.moe is not None
    return d.t // d.sp_div * job.model.moe.top_k * job.etp


def moe_mlp_items(job: Job, d: Dims) -> Breakdown:
    moe = job.model.moe
    assert moe is not None
    local = d.t // d.sp_div
    routed = expert_tokens(job, d)
    items: dict[str, int | Breakdown] = {
        "norm": _norm(job, d, local, d.h),
        "router_input": local * d.h * ACT_BYTES,
        "router_probs": local * moe.num_experts * FP32,  # softmax/top-k in fp32
        "expert_input": routed * d.h * d.lin_bytes,
        "expert_activation": _mlp_activation(job, d, routed, moe.expert_ffn_hidden_size // job.etp),
        # expert outputs weighted by the probs (Convention.moe_combine_fp32: in fp32)
        "combine_input": local * moe.top_k * d.h * (FP32 if d.conv.moe_combine_fp32 else ACT_BYTES),
    }
    if moe.num_shared_experts:
        width = moe.num_shared_experts * moe.shared_width // d.tp
        items["shared_experts"] = _mlp_activation(job, d, d.t, width)
    if job.model.sandwich_norms:
        items["post_norm"] = _norm(job, d, local, d.h)
    if block_output_mask(job):
        items["dropout_mask"] = d.residual * MASK_BYTES
    return Breakdown.of("bytes", **items)


def mamba_items(job: Job, d: Dims) -> Breakdown:
    """A Mamba-2 block as Megatron runs it (Megatron-LM@d98e8a64 megatron/core/ssm/mamba_mixer.py
    ssm_training): the pre-norm, in_proj's input, then mamba_ssm's mamba_split_conv1d_scan_combined
    without its norm and out_proj, which saves only its input zxBCdt (in_proj's output) and
    recomputes the conv and the scan in backward (mamba_ssm/ops/triton/ssd_combined.py
    MambaSplitConv1dScanCombinedFn: save_for_backward(zxbcdt, …, out_x = None, rstd = None, …);
    the other saved tensors are parameters); the RMSNorm gated by z keeps its input and an fp32
    rstd per token and group; out_proj keeps its input. Under context parallelism the kernel's
    zxBCdt is the all-to-alls' output, the whole sequence on the rank's nheads/(tp·cp) heads and
    groups (flops.mamba_local; B and C repeated where cp exceeds the rank's groups), and the
    all-to-alls keep nothing; y comes back to seq/cp before the norm (mamba_context_parallel.py
    pre_conv_ssm, post_conv_ssm at d98e8a64)."""
    mb, sh = job.model.mamba, mamba_local(job)
    assert mb is not None
    t = d.t
    items: dict[str, int | Breakdown] = {
        "norm": _norm(job, d, t // d.sp_div, d.h),
        "in_proj_input": t * d.h // d.gemm_input_div * d.lin_bytes,
        "zxbcdt": d.b * sh.seq * sh.local.in_proj_width * ACT_BYTES,
        "gated_norm": Breakdown.of("bytes", input=t * mb.inner // d.tp * ACT_BYTES, stats=t * mb.num_groups // d.tp * FP32),
        "out_proj_input": t * mb.inner // d.tp * d.lin_bytes,
    }
    if block_output_mask(job):
        items["dropout_mask"] = d.residual * MASK_BYTES
    return Breakdown.of("bytes", **items)


def layer_items(job: Job, layer_id: int, conv: Convention | None = None) -> Breakdown:
    """Everything one layer saves for backward without recomputation (under the framework's
    convention, or the one given): its mixer block (attention or Mamba-2) and its MLP block."""
    d = dims(job, conv)
    kind = job.model.layer_kind(layer_id)
    parts: dict[str, Breakdown] = {}
    if kind.mixer is MixerKind.ATTENTION:
        parts["attention"] = attention_items(job, d, rope=kind.rope)
    elif kind.mixer is MixerKind.MAMBA:
        parts["mamba"] = mamba_items(job, d)
    if kind.mlp:
        parts["mlp"] = moe_mlp_items(job, d) if kind.moe else dense_mlp_items(job, d)
    return Breakdown.of("bytes", **parts)


def _per_op_sac(job: Job, d: Dims, layer_id: int) -> Breakdown:
    """torchtitan's op-level selective checkpointing (pytorch/torchtitan@b5bcd76c
    torchtitan/distributed/activation_checkpoint.py L243-276 SelectiveAC, saved set L31-94): keep
    the layer input, the outputs of the attention kernel and of reduce-scatters, and of the layer's
    matmuls those _sac_kept keeps (wq, wv, w1, w2 of a SwiGLU layer in forward order wq wk wv wo w1
    w3 w2; wq, wv, w1 for GELU); recompute the rest. An MoE layer keeps its router's top-k and,
    under ep, the all-to-alls' outputs (_sac_moe). The attention kernel's output and statistics are
    recomputed instead where its op is outside the saved set (TrainingSpec.sac_recomputes_attention)."""
    assert job.model.hybrid_pattern is None, "torchtitan runs no hybrid model (rules: hybrid_framework)"
    m, t = job.model, d.t
    if m.mla is not None:
        mms, out_width = _sac_mla_matmuls(job, d), d.heads * m.v_head_size
    else:
        mms = [("wq_output", t * d.q, m.qkv_bias), ("wk_output", t * d.kv, m.qkv_bias),
               ("wv_output", t * d.kv, m.qkv_bias), ("wo_output", t * d.h, m.out_bias)]
        out_width = d.q
    kept_attention = not job.training.sac_recomputes_attention
    return Breakdown.of(
        "bytes",
        layer_input=d.residual * ACT_BYTES,
        **_sac_kept(mms + _sac_mlp(job, d, layer_id)),
        attention_output=t * out_width * ACT_BYTES * kept_attention,
        softmax_lse=d.b * d.heads * d.s * FP32 * kept_attention,
        **_sac_moe(job, d, layer_id),
        reduce_scatter_outputs=2 * d.residual * ACT_BYTES if d.tp > 1 else 0,
    )


def _sac_mlp(job: Job, d: Dims, layer_id: int) -> list[tuple[str, int, bool]]:
    """The MLP's linears in forward order, (output name, elements, has a bias): w1, w3 (gated), w2; in
    an MoE layer those of the shared experts only (one MLP of their summed width, torchtitan's
    shared_experts), the routed experts' grouped GEMM being outside the saved set."""
    m = job.model
    if m.is_moe_layer(layer_id):
        assert m.moe is not None
        if not m.moe.num_shared_experts:
            return []
        width = m.moe.num_shared_experts * m.moe.shared_width // d.tp
    else:
        width = d.f
    t = d.t
    out = [("w1_output", t * width, m.mlp_bias)]
    if m.mlp.gated:  # w3, the up projection of a gated MLP (SwiGLU, GeGLU)
        out.append(("w3_output", t * width, m.mlp_bias))
    return out + [("w2_output", t * d.h, m.mlp_bias)]


def _sac_kept(mms: list[tuple[str, int, bool]]) -> dict[str, int]:
    """Bytes of the matmul outputs the policy keeps (flops.sac_recomputes), from (name, elements, bias)
    in forward order: a linear with a bias runs as addmm, kept always and not counted."""
    again = sac_recomputes(["kept" if bias else "mm" for _, _, bias in mms])
    return {name: n * ACT_BYTES for (name, n, _), rerun in zip(mms, again) if not rerun}


def _sac_moe(job: Job, d: Dims, layer_id: int) -> dict[str, int]:
    """What an MoE layer's routing keeps under the policy: topk's values (fp32 scores) and int64
    indices (topk is in the saved set), and the token dispatch's and combine's all-to-all outputs
    under ep (all_to_all_single is). The router's matmul is forced to recompute (its shape is in
    force_recompute_mm_shapes_by_fqns, L196-198) unless a bias makes it an addmm. Nothing under the
    save list before torchtitan@c4e229115, which holds no topk, all_to_all_single or addmm
    (TrainingSpec.sac_recomputes_all_to_all)."""
    m = job.model
    if not m.is_moe_layer(layer_id) or job.training.sac_recomputes_all_to_all:
        return {}
    moe = m.moe
    assert moe is not None
    local = d.t // d.sp_div
    out = {"router_topk": local * moe.top_k * (FP32 + 8)}
    if moe.router_bias:
        out["router_output"] = local * moe.num_experts * ACT_BYTES
    if job.layout.ep > 1:
        out["all_to_all_outputs"] = 2 * expert_tokens(job, d) * d.h * ACT_BYTES
    return out


def _sac_mla_matmuls(job: Job, d: Dims) -> list[tuple[str, int, bool]]:
    """An MLA layer's matmuls in forward order, for the same policy (torchtitan models/deepseek_v3
    Attention: wq_a, wq_b or one wq, wkv_a, wkv_b, wo)."""
    m, t = job.model, d.t
    a = m.mla
    assert a is not None
    mms: list[tuple[str, int, bool]] = []
    if a.q_lora_rank is not None:
        mms.append(("wq_a_output", t * a.q_lora_rank, m.qkv_bias))
    return mms + [("wq_output", t * d.q, False), ("wkv_a_output", t * (a.kv_lora_rank + a.qk_rope_head_dim), m.qkv_bias),
                  ("wkv_b_output", t * d.heads * (a.qk_nope_head_dim + m.v_head_size), False), ("wo_output", t * d.h, m.out_bias)]


def _without(b: Breakdown, names: set[str]) -> Breakdown:
    kept = []
    for name, part in b:
        if name in names:
            continue
        kept.append((name, _without(part, names) if isinstance(part, Breakdown) else part))
    return Breakdown(b.unit, tuple(kept))


def layer_activations(job: Job, layer_id: int, recompute: Recompute, conv: Convention | None = None) -> Breakdown:
    """What one layer keeps between its forward and its backward under a recompute mode."""
    d = dims(job, conv)
    if recompute is Recompute.FULL:
        return Breakdown.of("bytes", layer_input=d.residual * ACT_BYTES)
    if recompute is Recompute.SELECTIVE:
        if d.conv.selective_per_op:
            return _per_op_sac(job, d, layer_id)
        # Megatron core_attn recompute: the attention kernel's internals (scores, softmax,
        # dropout; with flash the log-sum-exp) are recomputed from the saved q, k, v.
        core = {"softmax_output", "attention_dropout_mask", "attention_dropout_output", "softmax_lse",
                "softmax_sink_column", "softmax_row_max_index"}
        return _without(layer_items(job, layer_id, conv), core)
    return layer_items(job, layer_id, conv)


def layer_backward_workspace(job: Job, layer_id: int) -> int:
    """Gradient tensors alive while one layer runs backward: the incoming and outgoing residual
    gradients, the all-gathered GEMM input under sequence parallel (gathered_input_bytes), and the
    gradients of the widest MLP intermediate with those of its inputs (3 f-wide tensors for SwiGLU:
    d(product), d(gate), d(up); 2 for GELU and squared ReLU). A layer without an MLP: for Mamba-2
    the gradient of zxBCdt (as the scan kernel sees it: mamba_items) and of the scan output, and under cp also
    in_proj's output gradient that the reverse all-to-alls assemble while the kernel's is alive
    (mamba_context_parallel.py pre_conv_ssm at d98e8a64); for attention those of q, k, v and of the
    attention output."""
    d = dims(job)
    m = job.model
    kind = m.layer_kind(layer_id)
    # TrainingSpec.tp_gather_buffers: the gathered input lives in a persistent buffer (memory.stage_buffers)
    gathered = d.t * d.h if d.sp_div > 1 and not job.training.tp_gather_buffers else 0
    outer = 2 * d.residual * ACT_BYTES + int(gathered * gathered_input_bytes(job))
    # torch's ring attention runs its backward after the MLP's, whose gradients are freed by then
    ring = ring_attention_backward_bytes(job) if kind.mixer is MixerKind.ATTENTION else 0
    if not kind.mlp:
        if kind.mixer is MixerKind.MAMBA:
            assert m.mamba is not None
            sh = mamba_local(job)
            exchanged = d.t * m.mamba.in_proj_width // d.tp if job.layout.cp > 1 else 0
            grads = d.b * sh.seq * sh.local.in_proj_width + d.t * m.mamba.inner // d.tp + exchanged
            return outer + grads * ACT_BYTES
        width = 2 * d.q + 2 * d.kv
        return outer + max(d.t * width * ACT_BYTES, ring)
    if m.is_moe_layer(layer_id):
        assert m.moe is not None
        tokens, width = expert_tokens(job, d), m.moe.expert_ffn_hidden_size // job.etp
    else:
        tokens, width = d.t, d.f
    wide = 3 if m.mlp.gated else 2
    return outer + max(wide * tokens * width * ACT_BYTES, ring)


def gathered_input_bytes(job: Job) -> float:
    """Bytes per element of the column input a sequence-parallel backward all-gathers for the wgrad:
    16-bit, or where Megatron's Transformer Engine linears gather it quantised over NCCL
    (compute.te_quantized_gathers, without userbuffers, whose gathers land in their own buffers) the
    gathered usage (compute.tp_gather_bytes) and, with per-tensor fp8 on GPUs whose fp8 GEMMs take
    only the TN layout, the transpose the wgrad makes beside it: update_usage(columnwise_usage=True)
    keeps the gathered data and adds the transpose (TransformerEngine@40c69e75 transformer_engine/
    pytorch/module/layernorm_linear.py:805-810, tensor/_internal/float8_tensor_base.py:191-229;
    v0.11 layernorm_linear.py:384-387, tex.fp8_transpose of the gathered ln_out_total), 1 + 1 bytes,
    the 16-bit size; 1 byte where any layout is taken (compute.te_transposes)."""
    from cost_models import compute  # compute imports this module

    if job.training.tp_comm_overlap or not compute.te_quantized_gathers(job):
        return ACT_BYTES
    per = compute.tp_gather_bytes(job)
    per_tensor = not compute.te_nvfp4(job) and job.training.fp8_recipe is not Fp8Recipe.MXFP8
    return per * (1 + compute.te_transposes(job.cluster.gpu)) if per_tensor else per


def moe_combine_bytes(job: Job, layer_id: int, recompute: Recompute) -> int:
    """What torchtitan's MoE layer holds beside its saved tensors at the end of MoE.forward's combine,
    on its standard all-to-all path: at the forward itself, and again where the layer is checkpointed
    (full or op-level selective) and re-runs its forward in backward, then beside the gradients its
    backward has made. 0 where the layer is not an MoE layer, not torchtitan's or not on that path
    (MoEDispatch.ALLTOALL).

    MoE.forward (torchtitan@d021aa9ca^ torchtitan/models/moe/moe.py:466-548) keeps three routed-wide
    16-bit tensors in local variables until it returns, none of them saved for backward: the gathered
    copies `routed_input` (:508; index saves only its indices), the experts' output `routed_output`
    (:517, the combine all-to-all's output, distributed/expert_parallel.py:168-181, or without expert
    parallelism a view of _unpermute's copy, models/moe/utils.py:62-66) and `routed_output_unsorted`
    (:525-533), which it casts to the fp32 copy the bmm keeps (:534-542, moe_mlp_items'
    combine_input); beside them the bmm's fp32 output [t, h], its 16-bit cast and the shared experts'
    output (:522). The checkpoint wrapper re-runs the whole layer (early_stop False by default,
    config/job_config.py:605, distributed/activation_checkpoint.py:140-155) when the bmm's saved
    input is first unpacked, after the incoming 16-bit gradient and its fp32 cast are made
    (ToCopyBackward of .to(x.dtype) saves nothing). Without recomputation the bmm's backward holds
    less, its fp32 gradient of the copies (2 of the 3 routed-wide 16-bit sizes) and the same two
    [t, h] gradients. Where selective checkpointing keeps the all-to-alls' outputs (_sac_moe),
    `routed_output` is the kept one. With score_before_experts (Llama 4; DeepSeek-V3's flavors set
    it False, models/deepseek_v3/__init__.py:147) the same three routed copies are held and, without
    the bmm, fewer [t, h] ones; the DeepSeek-V3 figure is taken for both. torchtitan before e1f7f318a
    (2025-11-21) scored the expert outputs elementwise in fp32 and added them with scatter_add
    instead (torchtitan@8a749c618^ torchtitan/models/moe.py:403-436), a moment of its own that this
    prices as the later code's.

    On the DeepEP path (MoEDispatch.DEEPEP) the layer is DeepEPMoE, whose forward keeps no routed copy
    in a local variable: the experts' call returns the combined [t, h] (torchtitan@d021aa9ca
    torchtitan/models/moe/moe_deepep.py DeepEPMoE.forward). Inside it, combine_tokens scores the
    experts' output (a 16-bit copy, routed-wide, freed once scatter_add_ has summed it into the
    received tokens: its backward keeps only the indices) and hands DeepEP the [received, h] 16-bit
    sum, whose combine writes the [t, h] 16-bit output (distributed/deepep/deepep.py:445-462). At the
    combine the layer holds those two: t·(R + 1)·h 16-bit, R the ranks a token reaches
    (deepep.destinations), and, re-run in backward, the incoming 16-bit gradient beside them (no fp32
    bmm, so no fp32 copy)."""
    m = job.model
    tr = job.training
    if not m.is_moe_layer(layer_id) or tr.framework is not Framework.TORCHTITAN:
        return 0
    moe = m.moe
    assert moe is not None
    d = dims(job)
    local = d.t // d.sp_div
    if tr.moe_dispatch is MoEDispatch.DEEPEP:
        received = round(local * deepep.destinations(job)[0])
        return (received + local + (local if recompute is not Recompute.NONE else 0)) * d.h * ACT_BYTES
    if tr.moe_dispatch is not MoEDispatch.ALLTOALL:
        return 0
    kept_a2a = recompute is Recompute.SELECTIVE and "all_to_all_outputs" in _sac_moe(job, d, layer_id)
    copies = 3 - kept_a2a
    # [t, h]: the bmm's output (fp32), its cast, the shared experts' output; re-run in backward, also the
    # incoming gradient and its fp32 cast
    rows = FP32 + ACT_BYTES + (ACT_BYTES if moe.num_shared_experts else 0)
    if recompute is not Recompute.NONE:
        rows += ACT_BYTES + FP32
    return copies * local * moe.top_k * d.h * ACT_BYTES + local * d.h * rows


def ring_attention_backward_bytes(job: Job) -> int:
    """The working set of torch's ring attention backward under context parallelism (torchtitan with
    cp > 1), one attention layer, beyond the saved q, k, v, output and log-sum-exp.

    torchtitan runs every SDPA call under torch's context_parallel with the K/V exchange method
    "allgather" by default (pytorch/torchtitan@9dec370 torchtitan/config_manager.py:364-377,
    utils.py:171-193 set_rotate_method). The backward, `_templated_ring_attention_backward` in
    torch/distributed/tensor/experimental/_attention.py (pytorch/pytorch@0123248a; the late-2024 copy
    with _RotateMethod.PRE_ALL_GATHER has the same loop), holds through its cp steps:
    - dq's fp32 accumulator, zeros_like(query, dtype=float32) (convert_to_f32 defaults to True);
      dk's and dv's are replaced from step 1 on by the received fp32 buffer below;
    - key.contiguous() and value.contiguous(): copies, since the saved K and V are transposed views
      (torchtitan's Attention.forward transposes to [b, heads, s, d] after repeat_kv, 9dec370
      torchtitan/models/llama/model.py:116-125, 188-209);
    - the K|V of every cp rank: _AllGatherRotater all-gathers torch.cat([key, value]) once and keeps
      the cp-times larger buffer until the loop ends;
    - next_kv = torch.cat([key.flatten(), value.flatten()]) made again at every step;
    - the step's SDPA-backward dq, dk, dv in the 16-bit dtype;
    - dK|dV in fp32 three times over: the buffer received from the previous rank (the step's dK and
      dV are views of it), the torch.cat of the updated ones sent on, and the all-to-all's output
      (the dK/dV rotater is always _RotateMethod.ALL_TO_ALL, ft_c.permute_tensor).
    K and V are expanded to every query head before SDPA where the framework repeats them (GQA), so
    each has q's width then. Nothing under cp 1: torchtitan enters no context_parallel then."""
    if job.training.framework is not Framework.TORCHTITAN or job.layout.cp == 1:
        return 0
    d = dims(job)
    q = d.t * d.q * ACT_BYTES
    kv = d.t * (d.q if d.conv.gqa_expands_kv else d.kv) * ACT_BYTES  # one of K, V
    cp = job.layout.cp
    dq = 2 * q  # fp32
    contiguous = 2 * kv
    gathered = cp * 2 * kv
    step = 2 * kv + q + 2 * kv  # next_kv, and the step's 16-bit dq, dk, dv
    dkv = 3 * 2 * 2 * kv  # fp32 dK|dV received, concatenated, and the all-to-all output
    return dq + contiguous + gathered + step + dkv


def embedding_activations(job: Job) -> Breakdown:
    """First stage, per micro-batch: the token ids the embedding backward reads, and the embedding
    norm and dropout mask where the model has them (Korthikanti's s·b·h·p/t dropout term)."""
    d, m = dims(job), job.model
    return Breakdown.of(
        "bytes",
        token_ids=d.t * INDEX_BYTES,
        norm=_norm(job, d, d.t // d.sp_div, d.h).total if m.embedding_norm else 0,
        dropout_mask=d.residual * MASK_BYTES if m.hidden_dropout > 0 else 0,
    )


def head_activations(job: Job) -> Breakdown:
    """Last stage, per micro-batch: final norm, output layer input and the logits the loss keeps:
    fp32 (Korthikanti: 4·s·b·h/t·(1 + v/h) with sequence parallel), or, with a compiled loss, the
    16-bit logits and a per-row fp32 log-sum-exp from which Inductor's fused cross entropy
    recomputes the softmax in backward."""
    d = dims(job)
    if job.training.loss_on_16bit_logits:
        # the 16-bit logits the training loop still references and log_softmax's 16-bit output,
        # which nll_loss and log_softmax's backward read (TrainingSpec.loss_on_16bit_logits)
        logits = d.t * d.vocab * 2 * ACT_BYTES
    elif job.training.compiles_loss:
        logits = d.t * (d.vocab * ACT_BYTES + FP32)
    else:
        logits = d.t * d.vocab * FP32
    return Breakdown.of(
        "bytes",
        final_norm=_norm(job, d, d.t // d.sp_div, d.h),
        output_input=d.t * d.h // d.gemm_input_div * d.lin_bytes,
        logits=logits,
        # Gemma's final soft-capping c·tanh(x/c): autograd keeps the 16-bit tanh output
        logit_softcap=d.t * d.vocab * ACT_BYTES if job.model.final_logit_softcap else 0,
    )


def loss_workspace(job: Job) -> int:
    """Extra bytes per logit, beyond the saved fp32 logits, while the loss runs on the last stage.

    - Megatron's vocab-parallel cross entropy turns its fp32 copy into the softmax and then the
      gradient in place (megatron/core/tensor_parallel/cross_entropy.py); the 16-bit logits and
      then their 16-bit gradient come on top: 2 bytes.
    - Eager `cross_entropy(logits.float())` (torchtitan without tp, HF models under DeepSpeed): the
      backward makes the fp32 nll gradient and the fp32 log-softmax gradient before the cast: 8 bytes
      (the forward peak, 16-bit logits + fp32 copy, is 6).
    - torch loss_parallel (torchtitan with tp; torch/distributed/tensor/parallel/loss.py): the
      backward `_nll_loss_and_log_softmax_backward` builds zeros_like(x), exp(x) and their product
      in fp32: 12 bytes (the forward `_log_softmax` holds the fp32 input, shifted and exp(shifted)
      with the 16-bit logits: 10).
    - A compiled loss (torchtitan --compile.enable) fuses all of it: 2 bytes for the 16-bit gradient.
    - cross_entropy on the 16-bit logits themselves (TrainingSpec.loss_on_16bit_logits): the forward
      is log_softmax in the input's dtype, then nll_loss (pytorch/pytorch@87dd4af9
      aten/src/ATen/native/LossNLL.cpp cross_entropy_loss); the backward makes nll_loss's gradient,
      zeros_like(log_softmax output), and log_softmax's gradient, both 16-bit and alive together
      beside the saved 4 bytes: 4.
    - nanotron's sharded cross entropy (TrainingSpec.loss_shift_out_of_place) subtracts the row
      maximum from the fp32 logits out of place: the fp32 logits and the shifted fp32 tensor (the
      one kept, exponentiated and normalised in place) are alive together, 4 bytes beside the saved
      4 (huggingface/nanotron@c2528430 src/nanotron/parallel/tensor_parallel/functional.py:40-43,
      73-85). The 16-bit logits are gone by then: the model casts them in a block of its own and
      returns only the fp32 copy (models/llama.py:874-880, 905-911), which the loss holds while it
      runs (llama.py:1013-1021; functional.py:110-115 casts nothing more). Its backward turns the
      saved softmax into the gradient in place and casts it to 16 bits, 2.
    - Megatron's cross entropy before 9634c0e4 (TrainingSpec.loss_shift_beside_fp32_copy) shifts out
      of place while the GPT model holds the 16-bit logits and their fp32 copy: 2 + 4 bytes beside
      the saved 4 at the forward, more than its backward's 2.
    """
    d = dims(job)
    if job.training.loss_shift_out_of_place:
        per_logit = FP32
    elif job.training.loss_shift_beside_fp32_copy:
        per_logit = ACT_BYTES + FP32
    elif job.training.loss_on_16bit_logits:
        per_logit = 2 * ACT_BYTES
    elif d.conv.loss_in_place or job.training.compiles_loss:  # compiled: only the 16-bit gradient is new
        per_logit = 2
    elif job.training.framework is Framework.TORCHTITAN and d.tp > 1:
        per_logit = 12
    else:
        per_logit = 8
    return d.t * d.vocab * per_logit


def loss_cached_bytes(job: Job) -> int:
    """Bytes the caching allocator holds reserved, not allocated, while the loss runs: under
    TrainingSpec.loss_shift_out_of_place, the freed 16-bit logits' block. nanotron's cast allocates
    the fp32 logits while the 16-bit ones are alive, then the loss the shifted fp32 tensor
    (loss_workspace): both twice the freed block's size, neither can be carved from it (the allocator
    serves a request from the smallest cached block that fits, else cudaMalloc; pytorch/pytorch@eb42ad6e
    c10/cuda/CUDACachingAllocator.cpp, the allocator's header comment), so it stays reserved beside
    them: 2 bytes per logit."""
    if not job.training.loss_shift_out_of_place:
        return 0
    d = dims(job)
    return d.t * d.vocab * ACT_BYTES
