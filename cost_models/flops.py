"""Exact FLOPs of one micro-batch on one GPU, as the list of matrix multiplies the kernels run.

A GEMM of an (m x k) by a (k x n) matrix costs 2·m·n·k FLOPs (one multiply and one add per term).
Per GPU and micro-batch: t = mbs·seq_len/cp tokens; tp splits the heads and the ffn width
(column-parallel n, row-parallel k); with sequence parallel the GEMMs still see all t tokens (the
input is all-gathered first). Backward of a GEMM is two GEMMs of the same size (input and weight
gradients), so 2x its forward; FlashAttention's backward is 2.5x its forward (five matrix
multiplies against two: Dao 2023, FlashAttention-2, Sec. 3.1.2; flash-attn's benchmarks count
`flops_bwd = 2.5 * flops_fwd`).

A Mamba-2 layer's projections are GEMMs like any other (in_proj h -> [z, x, B, C, dt], out_proj
inner -> h, split over tp by heads and groups); its chunked SSD scan is counted as the batched
matrix multiplies of Dao & Gu 2024 ("Transformers are SSMs", arXiv 2405.21060, Sec. 6 and Listing 1):
per chunk of Q tokens, the diagonal block C·Bᵀ (per group, Q x N by N x Q) and its masked product
with X (per head, Q x Q by Q x P), the chunk state Bᵀ·X (per head, N x Q by Q x P) and the output
from the carried state C·h (per head, Q x N by N x P); the recurrence over chunk states is
elementwise. Its backward is counted as twice the forward (the gradients of each product's two
operands), as for a GEMM. Under context parallelism the projections see the rank's t tokens while the
scan runs over the whole sequence on the rank's nheads/(tp·cp) heads (cost_models.mamba_shard).

`model_flops_per_token` is the PaLM convention used for MFU (Chowdhery et al. 2022, Appendix B).
"""

from __future__ import annotations

from dataclasses import dataclass

from cost_models.enums import AttentionKernel, Framework, MixerKind, Recompute
from cost_models.job import Job
from cost_models.mamba_shard import MambaShard, mamba_shard
from cost_models.model_spec import LayerKind, ModelSpec
from cost_models.states import local_kv_heads, output_layer_vocab

FLASH_BACKWARD_FACTOR = 2.5  # see the module docstring
GEMM_BACKWARD_FACTOR = 2  # dX = dY·Wᵀ and dW = Xᵀ·dY


@dataclass(frozen=True)
class Gemm:
    """`count` multiplies of (m x k)·(k x n), forward."""

    name: str
    m: int
    n: int
    k: int
    count: int = 1

    @property
    def flop(self) -> int:
        return 2 * self.m * self.n * self.k * self.count


@dataclass(frozen=True)
class Attention:
    """Core attention (scores and context) of one layer on one GPU, forward."""

    batch_heads: int  # mbs x local query heads
    q_len: int  # queries on this rank (seq_len/cp)
    k_len: int  # keys each query sees in total (seq_len: cp ranks pass K/V around)
    head_dim: float  # (d_qk + d_v) / 2, the head size unless MLA sets them apart
    causal_fraction: float  # share of the q x k score matrix the kernel computes

    @property
    def flop(self) -> float:
        # QKᵀ and PV: 2 GEMMs of 2·q·k·d each per head
        return 4 * self.batch_heads * self.q_len * self.k_len * self.head_dim * self.causal_fraction


def attended_pairs(s: int, *, window: int | None = None, chunk: int | None = None) -> int:
    """(query, key) pairs a causal mask over s tokens keeps. Causal: Σ_i (i + 1) = s(s+1)/2. Sliding
    window of w (each query sees its last w tokens, itself included): Σ_i min(i + 1, w) = w(w+1)/2 +
    (s − w)·w for s > w. Chunks of c (causal within each chunk, chunk i·c..(i+1)·c − 1): n = s // c full
    chunks of c(c+1)/2 and a last one of r = s − n·c tokens."""
    if chunk is not None:
        n, r = divmod(s, chunk)
        return n * chunk * (chunk + 1) // 2 + r * (r + 1) // 2
    if window is not None and window < s:
        return window * (window + 1) // 2 + (s - window) * window
    return s * (s + 1) // 2


def mask_tensor_attention(job: Job, kind: LayerKind) -> bool:
    """A local layer that DeepSpeed's Hugging Face model runs through SDPA with an explicit mask: a
    window or chunk shorter than the sequence makes transformers pass the mask as a tensor (v5.23.0
    masking_utils.py _ignore_causal_mask_sdpa, L267-282: the causal skip needs no local window),
    and SDPA then runs a kernel that reads the mask over every block instead of a flash kernel
    that skips them (integrations/sdpa_attention.py L145-159: is_causal only without a mask)."""
    s = job.training.seq_len
    local = (kind.window is not None and kind.window < s) or (kind.chunk is not None and kind.chunk < s)
    return local and job.training.framework is Framework.DEEPSPEED


def causal_fraction(job: Job, kind: LayerKind = LayerKind()) -> float:
    """Flash kernels skip the blocks the mask removes: above the causal diagonal, (s+1)/(2s) of the
    scores for one sequence, whichever cp rank holds which chunk (Megatron/torch CP balance the
    chunks); outside a sliding window or a chunk too (attended_pairs / s²; flash-attn's local
    attention starts each query block's key loop at the window's first block, flash_fwd_kernel.h
    n_block_min, Dao-AILab/flash-attention@0251105a L90). Eager attention computes every score and
    masks afterwards (Megatron's fused_scale_mask_softmax, transformers' eager_attention_forward
    adding the mask), and so does SDPA given a mask tensor (mask_tensor_attention)."""
    if job.training.attention is AttentionKernel.EAGER or mask_tensor_attention(job, kind):
        return 1.0
    s = job.training.seq_len
    return attended_pairs(s, window=kind.window, chunk=kind.chunk) / (s * s)


def tokens(job: Job) -> int:
    """Tokens of one micro-batch on one GPU (all of them pass through every tp rank's GEMMs)."""
    return job.layout.mbs * job.seq_per_rank


def local_tokens(job: Job) -> int:
    """Tokens of one micro-batch in one rank's residual stream: tokens(job) split over tp under
    sequence parallelism, all of them otherwise."""
    return tokens(job) // (job.layout.tp if job.sp else 1)


def attention_gemms(job: Job) -> tuple[Gemm, ...]:
    m, tp = job.model, job.layout.tp
    t, h = tokens(job), m.hidden_size
    if m.mla is not None:
        return mla_gemms(job)
    q = m.q_width // tp
    kv = local_kv_heads(job) * m.head_size
    return (Gemm("qkv", t, q + 2 * kv, h), Gemm("out_proj", t, h, q))


def mla_gemms(job: Job) -> tuple[Gemm, ...]:
    """Multi-head latent attention as megatron-core's MLASelfAttention runs it
    (Megatron-LM@d98e8a64 multi_latent_attention.py L508-632, gpt_layer_specs.py L106-126): the
    down projections (linear_q_down_proj, linear_kv_down_proj) are replicated over tp
    (TELinear parallel_mode "duplicated") and read the rank's own tokens (t/tp under sequence
    parallel, t otherwise); the up projections are column-parallel over heads on the gathered
    latents; the output projection is row-parallel. The query up projection (or the one query
    projection without q_lora_rank) is named "qkv": it opens the attention's tensor-parallel block."""
    m, lay = job.model, job.layout
    a = m.mla
    assert a is not None
    t, h = tokens(job), m.hidden_size
    local = local_tokens(job)
    heads = m.num_attention_heads // lay.tp
    if a.q_lora_rank is None:
        query: tuple[Gemm, ...] = (Gemm("qkv", t, heads * a.qk_head_dim, h),)
    else:
        query = (Gemm("q_down", local, a.q_lora_rank, h), Gemm("qkv", t, heads * a.qk_head_dim, a.q_lora_rank))
    return query + (
        Gemm("kv_down", local, a.kv_lora_rank + a.qk_rope_head_dim, h),
        Gemm("kv_up", t, heads * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank),
        Gemm("out_proj", t, h, heads * a.v_head_dim),
    )


def core_attention(job: Job, kind: LayerKind = LayerKind()) -> Attention:
    """Per head 2·q·k·d_qk (QKᵀ) + 2·q·k·d_v (PV) FLOPs: with MLA's unequal widths (192 and 128 for
    DeepSeek-V3) head_dim is their mean, which gives the same FLOPs and prices the kernel between
    the two widths."""
    m = job.model
    heads = m.num_attention_heads // job.layout.tp
    return Attention(job.layout.mbs * heads, job.seq_per_rank, job.training.seq_len, m.attention_head_size, causal_fraction(job, kind))


def mlp_gemms(spec: ModelSpec, name: str, m_tokens: int, width: int, count: int = 1) -> tuple[Gemm, ...]:
    """GELU and squared ReLU: fc1 h->f, fc2 f->h. SwiGLU: gate and up as one h->2f GEMM (Megatron
    fuses them; separate GEMMs cost the same FLOPs), down f->h."""
    h = spec.hidden_size
    up = 2 * width if spec.mlp.gated else width
    return (Gemm(f"{name}_fc1", m_tokens, up, h, count), Gemm(f"{name}_fc2", m_tokens, h, width, count))


def expert_tokens_per_gpu(job: Job) -> int:
    """Routed token copies one GPU's experts process per micro-batch with balanced routing: its
    t/tp tokens (sequence parallel) times top_k, preserved by the ep all-to-all, gathered over etp."""
    moe = job.model.moe
    assert moe is not None
    return local_tokens(job) * moe.top_k * job.etp


def moe_gemms(job: Job) -> tuple[Gemm, ...]:
    m, lay = job.model, job.layout
    moe = m.moe
    assert moe is not None
    local = local_tokens(job)
    local_experts = moe.num_experts // lay.ep
    routed = expert_tokens_per_gpu(job)
    # Grouped GEMM: each local expert multiplies its share of the routed tokens.
    per_expert = max(1, routed // local_experts)
    out = [Gemm("router", local, moe.num_experts, m.hidden_size)]
    out += mlp_gemms(m, "experts", per_expert, moe.expert_ffn_hidden_size // job.etp, local_experts)
    if moe.num_shared_experts:
        out += mlp_gemms(m, "shared", tokens(job), moe.num_shared_experts * moe.shared_width // lay.tp)
    return tuple(out)


def mamba_gemms(job: Job) -> tuple[Gemm, ...]:
    """in_proj (column-parallel: z, x, B, C and dt each split over tp) and out_proj (row-parallel
    over the inner width), Megatron MambaMixer (Megatron-LM@d98e8a64 megatron/core/ssm/mamba_mixer.py)."""
    mb, tp = job.model.mamba, job.layout.tp
    assert mb is not None
    t, h = tokens(job), job.model.hidden_size
    return (Gemm("in_proj", t, mb.in_proj_width // tp, h), Gemm("mamba_out_proj", t, h, mb.inner // tp))


def mamba_local(job: Job) -> MambaShard:
    """The heads, groups and sequence one GPU's Mamba conv and scan run over (mamba_shard: the whole
    sequence on nheads/(tp·cp) heads under context parallelism)."""
    assert job.model.mamba is not None
    return mamba_shard(job.model.mamba, tp=job.layout.tp, cp=job.layout.cp, seq_len=job.training.seq_len)


def ssd_gemms(job: Job) -> tuple[Gemm, ...]:
    """The SSD scan of one layer on one GPU as batched GEMMs (module docstring): the rank's heads
    and groups (over tp, and over cp with the whole sequence: mamba_shard), every chunk of the
    micro-batch's sequences."""
    mb, sh = job.model.mamba, mamba_local(job)
    assert mb is not None
    q, n, p = mb.chunk_size, mb.state_size, mb.head_dim
    chunks = job.layout.mbs * -(-sh.seq // q)
    heads, groups = chunks * sh.local.num_heads, chunks * sh.local.num_groups
    return (
        Gemm("ssd_cb", q, q, n, groups),  # C·Bᵀ within a chunk, per group
        Gemm("ssd_diag", q, p, q, heads),  # (L ∘ C·Bᵀ)·X, per head
        Gemm("ssd_state", n, p, q, heads),  # Bᵀ·X: the chunk's state contribution, per head
        Gemm("ssd_out", q, p, n, heads),  # C·h: the output from the state carried in, per head
    )


def layer_gemms(job: Job, kind: LayerKind) -> tuple[Gemm, ...]:
    """The GEMMs of a layer's mixer (attention projections, Mamba in/out projections) and MLP."""
    out: tuple[Gemm, ...] = ()
    if kind.mixer is MixerKind.ATTENTION:
        out += attention_gemms(job)
    elif kind.mixer is MixerKind.MAMBA:
        out += mamba_gemms(job)
    if kind.mlp:
        out += moe_gemms(job) if kind.moe else mlp_gemms(job.model, "mlp", tokens(job), job.model.ffn_hidden_size // job.layout.tp)
    return out


def head_gemm(job: Job) -> Gemm:
    """Output layer: vocabulary split over tp (vocab-parallel), padded as the framework pads it.
    Under TrainingSpec.tp_replicated_vocab the output layer is column-parallel only without a
    pipeline; on pipeline stages every tp rank runs it over the whole vocabulary
    (KempnerInstitute/KempnerForge@601aba9 kempnerforge/distributed/tensor_parallel.py:116-120,
    157-164: no tp plan for output_head when is_pp_stage)."""
    return Gemm("output", tokens(job), output_layer_vocab(job), job.model.hidden_size)


def mtp_gemms(job: Job) -> tuple[Gemm, ...]:
    """Each MTP module's merge of the next token's embedding and the hidden state, an h x 2h
    projection (DeepSeek-V3 Sec. 2.2; megatron-core MultiTokenPredictionLayer.eh_proj, a
    column-parallel linear split over tp). Its decoder layer and output pass are priced as the
    model's own (step_time.stage_time)."""
    m = job.model
    if not m.mtp_layers:
        return ()
    return (Gemm("mtp_eh_proj", tokens(job), m.hidden_size // job.layout.tp, 2 * m.hidden_size, m.mtp_layers),)


@dataclass(frozen=True)
class LayerFlops:
    """One decoder layer, one micro-batch, one GPU."""

    forward_gemm: float
    forward_attention: float
    recompute_gemm: float  # forward work repeated in backward under the layer's recompute mode
    recompute_attention: float
    attention_backward_factor: float  # flash 2.5, eager 2 (two batched GEMMs)

    @property
    def forward(self) -> float:
        return self.forward_gemm + self.forward_attention

    @property
    def backward(self) -> float:
        return GEMM_BACKWARD_FACTOR * self.forward_gemm + self.attention_backward_factor * self.forward_attention

    @property
    def recompute(self) -> float:
        return self.recompute_gemm + self.recompute_attention

    @property
    def total(self) -> float:
        return self.forward + self.backward + self.recompute


def recomputed_share(job: Job, mode: Recompute, kind: LayerKind = LayerKind()) -> tuple[float, float]:
    """(share of GEMM FLOPs, share of token-mixer FLOPs) a layer repeats in backward.

    Full: the whole forward. Selective: Megatron recomputes core attention only (Korthikanti et al.
    2022, Sec. 5; --recompute-granularity selective); torchtitan's per-op policy saves the attention
    kernel's output and every other matmul's (sac_recomputed_gemm); DeepSpeed has no selective mode
    of its own and is counted like Megatron. Megatron's selective default recomputes core attention
    only (--recompute-modules default ["core_attn"], Megatron-LM@d98e8a64 arguments.py), so a Mamba
    or MLP-only layer repeats nothing under it.
    """
    if mode is Recompute.NONE:
        return 0.0, 0.0
    if mode is Recompute.FULL:
        return 1.0, 1.0
    if job.training.framework is Framework.TORCHTITAN:
        gemms = layer_gemms(job, kind)
        total = sum(g.flop for g in gemms)
        # the attention kernel again where its op is outside the saved set (TrainingSpec.sac_recomputes_attention)
        again = job.training.sac_recomputes_attention and kind.mixer is MixerKind.ATTENTION
        return (sac_recomputed_gemm(job, kind) / total if total else 0.0), 1.0 if again else 0.0
    return 0.0, 1.0 if kind.mixer is MixerKind.ATTENTION else 0.0


def sac_matmuls(job: Job, kind: LayerKind) -> tuple[tuple[float, str], ...]:
    """A layer's matmuls in torchtitan's forward order as its per-op selective policy sees them,
    each (forward FLOPs, how): "mm" counted by the policy, "kept" an addmm (a linear with a bias),
    "rerun" recomputed and not counted. The policy (pytorch/torchtitan@b5bcd76c
    torchtitan/distributed/activation_checkpoint.py L243-276 SelectiveAC._get_custom_policy, saved
    set L31-94) counts aten.mm through one block's forward and recomputes the even-numbered ones;
    addmm is in the saved set and not counted; the MoE router's shape is forced to recompute
    (force_recompute_mm_shapes_by_fqns default ["moe.router.gate"], L196-198), unless a bias makes
    it an addmm; the routed experts run as torch._grouped_mm (torchtitan/models/common/moe.py
    L110-120), outside the saved set. torchtitan runs q, k and v (wq wk wv) and a gated MLP's gate
    and up (w1 w3) as separate linears, which layer_gemms fuses; MLA as wq_a, wq_b (or wq), wkv_a,
    wkv_b, wo; the shared experts as one MLP. fp8 linears are counted as their 16-bit selves: their
    torch._scaled_mm is in the saved set at this commit and was recomputed, uncounted, before
    pytorch/torchtitan@114151ad4 (2026-03, the per-model _save_list of aten.mm alone)."""
    m = job.model
    gated = m.mlp.gated

    def linear(bias: bool) -> str:
        return "kept" if bias else "mm"

    out: list[tuple[float, str]] = []
    for g in layer_gemms(job, kind):
        if g.name == "qkv" and m.mla is None:
            q, kv = m.q_width // job.layout.tp, local_kv_heads(job) * m.head_size
            out += [(g.flop * w / (q + 2 * kv), linear(m.qkv_bias)) for w in (q, kv, kv)]
        elif g.name in ("q_down", "kv_down"):
            out.append((g.flop, linear(m.qkv_bias)))
        elif g.name == "out_proj":
            out.append((g.flop, linear(m.out_bias)))
        elif g.name == "router":
            out.append((g.flop, "kept" if m.moe is not None and m.moe.router_bias else "rerun"))
        elif g.name.startswith("experts_"):
            out.append((g.flop, "rerun"))
        elif g.name in ("mlp_fc1", "shared_fc1") and gated:
            out += [(g.flop / 2, linear(m.mlp_bias))] * 2
        elif g.name in ("mlp_fc1", "shared_fc1", "mlp_fc2", "shared_fc2"):
            out.append((g.flop, linear(m.mlp_bias)))
        else:
            out.append((g.flop, "mm"))
    return tuple(out)


def sac_recomputed_gemm(job: Job, kind: LayerKind) -> float:
    """Forward GEMM FLOPs of one layer that torchtitan's per-op selective checkpointing runs again
    in backward (sac_matmuls): every second counted mm, and the uncounted recomputed ones. A SwiGLU
    GQA layer reruns wk, wo and w3: for llama-3.1-8b (h 4096, kv width 1024, ffn 14336)
    (1024 + 4096 + 14336) / (4096 + 2·1024 + 4096 + 3·14336) = 36.5% of its GEMM FLOPs."""
    matmuls = sac_matmuls(job, kind)
    return sum(flop for (flop, _), again in zip(matmuls, sac_recomputes([how for _, how in matmuls])) if again)


def sac_recomputes(hows: list[str]) -> list[bool]:
    """Which of a block's matmuls, in forward order, torchtitan's per-op policy runs again
    (sac_matmuls' "mm", "kept", "rerun"): every second counted mm and every "rerun"; an addmm
    ("kept") is saved and not counted."""
    out, counted = [], 0
    for how in hows:
        if how == "mm":
            counted += 1
        out.append(how == "rerun" or (how == "mm" and counted % 2 == 0))
    return out


def mixer_flops(job: Job, kind: LayerKind) -> float:
    """Forward FLOPs of a layer's token mixer besides its projections: core attention, or the SSD scan."""
    if kind.mixer is MixerKind.ATTENTION:
        return core_attention(job, kind).flop
    if kind.mixer is MixerKind.MAMBA:
        return sum(g.flop for g in ssd_gemms(job))
    return 0.0


def layer_flops(job: Job, kind: LayerKind, *, mode: Recompute) -> LayerFlops:
    gemm = sum(g.flop for g in layer_gemms(job, kind))
    attention = mixer_flops(job, kind)
    share_gemm, share_attn = recomputed_share(job, mode, kind)
    factor = attention_backward_factor(job) if kind.mixer is MixerKind.ATTENTION else GEMM_BACKWARD_FACTOR
    return LayerFlops(gemm, attention, share_gemm * gemm, share_attn * attention, factor)


def attention_backward_factor(job: Job) -> float:
    return FLASH_BACKWARD_FACTOR if job.training.attention is AttentionKernel.FLASH else GEMM_BACKWARD_FACTOR


def model_flops_per_token(spec: ModelSpec, seq_len: int) -> float:
    """PaLM's model FLOPs per token, forward + backward, no recomputation: 6·N + 12·L·H·Q·T
    (Chowdhery et al. 2022, Appendix B), N = parameters that take part in a matmul (active ones for
    MoE: every parameter except the input embedding table, which is a lookup; a tied table counts
    once, as the output layer), L attention layers (a hybrid model's Mamba scan is not counted), H·Q
    the attention width (under MLA heads x the mean of the query/key and value head widths, as
    core_attention counts), T the sequence length, or a sliding-window or chunked layer's window or
    chunk where shorter. Causal masking is not discounted. torchtitan's MFU
    uses the same N (parameters minus the embedding). Multi-token prediction modules train with the
    model: their active parameters and one more pass through the output layer per module join N,
    their decoder layers join L."""
    from cost_models.params import embedding_params, mtp_params

    emb = embedding_params(spec)
    lookup = emb.value("position") + (0 if spec.tie_embeddings else emb.value("word"))
    n = spec.params_active - lookup
    if spec.mtp_layers:
        n += mtp_params(spec, active=True).total + spec.mtp_layers * spec.vocab_size * spec.hidden_size
    # keys each query is counted against: T, or a local layer's window or chunk when shorter (a
    # sliding-window query attends at most w tokens: Jiang et al. 2023, Mistral 7B, Sec. 2; a chunked
    # one those of its chunk), so that MFU counts the attention the model computes
    keys = sum(c * min(seq_len, k.window or seq_len, k.chunk or seq_len)
               for k, c in spec.layer_kind_counts.items() if k.mixer is MixerKind.ATTENTION)
    keys += spec.mtp_layers * seq_len
    return 6 * n + 12 * keys * spec.num_attention_heads * spec.attention_head_size
