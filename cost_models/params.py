"""Exact parameter counts, per component, from a ModelSpec.

Each count is the number of elements of the weight and bias tensors a standard implementation
(Hugging Face transformers, Megatron-LM) creates for that component; tests compare the totals with
`sum(p.numel())` of real torch modules built on the meta device.
"""

from __future__ import annotations

from cost_models.breakdown import Breakdown
from cost_models.enums import MixerKind, NormKind, PositionKind
from cost_models.model_spec import LayerKind, ModelSpec


def norm_params(spec: ModelSpec, width: int) -> int:
    """LayerNorm has weight and bias, RMSNorm weight only."""
    return 2 * width if spec.norm is NormKind.LAYERNORM else width


def attention_params(spec: ModelSpec) -> Breakdown:
    if spec.mla is not None:
        return mla_params(spec)
    h, q, kv = spec.hidden_size, spec.q_width, spec.kv_width
    return Breakdown.of(
        "params",
        qkv_weight=h * (q + 2 * kv),
        qkv_bias=(q + 2 * kv) if spec.qkv_bias else 0,
        out_weight=q * h,
        out_bias=h if spec.out_bias else 0,
        qk_norm=2 * norm_params(spec, spec.head_size) if spec.qk_norm else 0,
        sinks=spec.num_attention_heads if spec.attention_sinks else 0,  # GptOssAttention.sinks, one logit per head
    )


def mla_params(spec: ModelSpec, tp: int = 1) -> Breakdown:
    """Multi-head latent attention as transformers' DeepseekV3Attention (and DeepseekV2Attention)
    builds it: q_a_proj h->q_lora (bias per attention_bias), q_a_layernorm, q_b_proj
    q_lora->heads·(nope+rope) without bias, or one q_proj h->heads·(nope+rope) when q_lora_rank is
    None; kv_a_proj_with_mqa h->kv_lora+rope (bias per attention_bias), kv_a_layernorm,
    kv_b_proj kv_lora->heads·(nope+v) without bias; o_proj heads·v->h (bias per attention_bias).
    megatron-core's MLASelfAttention has the same matrices and norms (linear_q_down_proj,
    q_layernorm, linear_q_up_proj, linear_kv_down_proj, kv_layernorm, linear_kv_up_proj,
    linear_proj; Megatron-LM@d98e8a64 multi_latent_attention.py L508-632). On one of `tp` ranks:
    the down projections and latent norms replicated (TELinear "duplicated"), the up projections
    and the output projection split over heads, the output bias replicated."""
    a = spec.mla
    assert a is not None
    h, n = spec.hidden_size, spec.num_attention_heads // tp
    q_out = n * a.qk_head_dim
    if a.q_lora_rank is None:
        q = Breakdown.of("params", q_proj=h * q_out)
    else:
        r = a.q_lora_rank
        q = Breakdown.of("params", q_a=h * r + (r if spec.qkv_bias else 0), q_a_norm=norm_params(spec, r), q_b=r * q_out)
    kv_a = a.kv_lora_rank + a.qk_rope_head_dim
    return Breakdown.of(
        "params",
        q=q,
        kv_a=h * kv_a + (kv_a if spec.qkv_bias else 0),
        kv_a_norm=norm_params(spec, a.kv_lora_rank),
        kv_b=a.kv_lora_rank * n * (a.qk_nope_head_dim + a.v_head_dim),
        out_weight=n * a.v_head_dim * h,
        out_bias=h if spec.out_bias else 0,
    )


def mamba_params(spec: ModelSpec, tp: int = 1) -> Breakdown:
    """One Mamba-2 mixer (transformers NemotronHMamba2Mixer.__init__, v5.23.0; Megatron MambaMixer):
    in_proj h -> [z, x, B, C, dt], the depthwise conv1d over [x, B, C] (conv_kernel taps per channel),
    dt_bias, A_log and D per head, the gated RMSNorm's weight over the inner width, out_proj inner -> h.
    On one of `tp` ranks: all of them split over tp with the heads and groups, out_proj over its
    input, a bias on out_proj replicated (Megatron MambaMixer marks them tensor_model_parallel,
    mamba_mixer.py at d98e8a64)."""
    mb = spec.mamba
    assert mb is not None
    h = spec.hidden_size
    width, conv, inner = mb.in_proj_width // tp, mb.conv_dim // tp, mb.inner // tp
    return Breakdown.of(
        "params",
        in_proj=h * width + (width if mb.proj_bias else 0),
        conv1d=conv * mb.conv_kernel + (conv if mb.conv_bias else 0),
        per_head=3 * mb.num_heads // tp,  # dt_bias, A_log, D
        norm=inner,
        out_proj=inner * h + (h if mb.proj_bias else 0),
    )


def mlp_params(spec: ModelSpec, ffn: int) -> int:
    """GELU and squared ReLU: h->f, f->h. SwiGLU: gate and up h->f, down f->h. Biases on every matrix if mlp_bias."""
    h = spec.hidden_size
    if spec.mlp.gated:
        return 3 * h * ffn + ((2 * ffn + h) if spec.mlp_bias else 0)
    return 2 * h * ffn + ((ffn + h) if spec.mlp_bias else 0)


def moe_params(spec: ModelSpec, *, active: bool = False) -> Breakdown:
    """One MoE layer's MLP part: router, routed experts (top_k of them if active), shared experts."""
    m = spec.moe
    assert m is not None
    n_routed = m.top_k if active else m.num_experts
    return Breakdown.of(
        "params",
        router=spec.hidden_size * m.num_experts,  # Linear(h, E, bias=False) in Mixtral/Qwen/Megatron
        router_bias=m.num_experts if m.router_bias else 0,  # GptOssTopKRouter.bias
        experts=n_routed * mlp_params(spec, m.expert_ffn_hidden_size),
        shared_experts=m.num_shared_experts * mlp_params(spec, m.shared_width),
        shared_gate=spec.hidden_size if m.shared_expert_gate else 0,
    )


def layer_params(spec: ModelSpec, kind: LayerKind, *, active: bool = False) -> Breakdown:
    """One decoder layer of a kind: a norm before each block (and after it with sandwich norms:
    Gemma2DecoderLayer's input, post_attention, pre_feedforward and post_feedforward layernorms),
    the mixer (attention or Mamba-2; none in an MLP-only layer), and a dense MLP or an MoE block
    (none in a hybrid model's mixer layers). Sliding-window, chunked and NoPE layers have the same
    parameters as full-attention ones."""
    norms = kind.norms * (2 if spec.sandwich_norms else 1)
    parts: dict[str, int | Breakdown] = {"norms": norms * norm_params(spec, spec.hidden_size)}
    if kind.mixer is MixerKind.ATTENTION:
        parts["attention"] = attention_params(spec)
    elif kind.mixer is MixerKind.MAMBA:
        parts["mamba"] = mamba_params(spec)
    if kind.mlp:
        parts["mlp"] = moe_params(spec, active=active) if kind.moe else mlp_params(spec, spec.ffn_hidden_size)
    return Breakdown.of("params", **parts)


def embedding_params(spec: ModelSpec) -> Breakdown:
    h = spec.hidden_size
    return Breakdown.of(
        "params",
        word=spec.vocab_size * h,
        position=spec.max_position_embeddings * h if spec.position_embedding is PositionKind.LEARNED else 0,
        norm=norm_params(spec, h) if spec.embedding_norm else 0,
    )


def head_params(spec: ModelSpec) -> Breakdown:
    """Final norm and the output layer (absent when tied to the word embedding)."""
    return Breakdown.of(
        "params",
        final_norm=norm_params(spec, spec.hidden_size),
        output=0 if spec.tie_embeddings else spec.vocab_size * spec.hidden_size,
    )


def mtp_params(spec: ModelSpec, *, active: bool = False) -> Breakdown:
    """The multi-token prediction modules, apart from the model's count: per module the two input
    norms (of the next token's embedding and of the hidden state), the h x 2h projection without bias
    (eh_proj), one decoder layer of the last layer's kind and a final norm; the embedding and the
    output layer are the model's own (DeepSeek-V3 Sec. 2.2, Fig. 3; megatron-core
    MultiTokenPredictionLayer enorm, hnorm, eh_proj, transformer_layer, final_layernorm,
    Megatron-LM@d98e8a64 megatron/core/transformer/multi_token_prediction.py)."""
    h = spec.hidden_size
    kind = spec.layer_kind(spec.num_layers - 1)
    one = Breakdown.of(
        "params", norms=3 * norm_params(spec, h), eh_proj=2 * h * h, layer=layer_params(spec, kind, active=active)
    )
    return one.scaled(spec.mtp_layers)


def model_params(spec: ModelSpec, *, active: bool = False) -> Breakdown:
    """All parameters; `active=True` counts only top_k routed experts per MoE layer."""
    parts: dict[str, Breakdown] = {"embedding": embedding_params(spec)}
    for kind, n in spec.layer_kind_counts.items():
        parts[f"{kind.label}_layers"] = layer_params(spec, kind, active=active).scaled(n)
    parts["head"] = head_params(spec)
    return Breakdown.of("params", **parts)
