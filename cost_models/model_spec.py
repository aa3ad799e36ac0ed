"""ModelSpec: the shape of a decoder-only transformer, dense or mixture-of-experts, or a hybrid of
Mamba-2, attention, MLP and MoE layers (Nemotron-H, Nemotron 3).

Counts only (no units); parameter counts are derived in `cost_models.params`.
"""

from __future__ import annotations

import math
from collections import Counter
from functools import cache, cached_property
from typing import Annotated, Literal, NamedTuple

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag, model_validator

from cost_models.enums import MixerKind, MLPKind, NormKind, PositionKind, RouterScore
from cost_models.errors import unsafe


def _not_bool(value: object) -> object:
    """pydantic reads true as 1; a count given as true/false is a mistake in the file."""
    if isinstance(value, bool):
        raise ValueError(f"expected a whole number > 0, got {str(value).lower()}")
    return value


# 2**24 (16,777,216) is above every real size (vocabularies ~256k, contexts ~10M tokens, clusters
# ~100k GPUs) and keeps loops over layers and divisors of a count short.
MAX_COUNT = 2**24
# Bounds of a model that keep the search's integer programme within int64 and its per-layer tables short.
MAX_LAYERS = 4096
MAX_PARAMS = 2**45
Count = Annotated[int, Field(gt=0, le=MAX_COUNT), BeforeValidator(_not_bool)]

MAX_NAME_CHARS = 1024


def _plain_name(value: str) -> str:
    """A name is printed in tables and written into scripts and configs: no control characters
    (NUL, escape sequences, newlines), lone surrogates (not encodable) or bidirectional overrides."""
    for i, ch in enumerate(value):
        if unsafe(ch):
            raise ValueError(f"character {ascii(ch)} at position {i} is not allowed in a name (control "
                             "characters, lone surrogates and bidirectional overrides are refused)")
    return value


Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS), AfterValidator(_plain_name)]
Fraction = Annotated[float, Field(ge=0.0, lt=1.0)]
Positive = Annotated[float, Field(gt=0.0)]


class Spec(BaseModel):
    """Base for every spec: immutable, unknown keys rejected, no NaN/inf."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, ignored_types=(cached_property,))

    def model_copy(self, *, update=None, deep: bool = False):  # type: ignore[no-untyped-def,override]
        """pydantic's copy, without the cached properties of the original: they were derived from
        the fields the update may change (a copy with fewer layers must not keep the original's
        layer kinds or parameter count)."""
        copy = super().model_copy(update=update, deep=deep)
        for name in _cached_names(type(self)):
            copy.__dict__.pop(name, None)
        return copy


@cache
def _cached_names(cls: type) -> tuple[str, ...]:
    """The cached properties of a Spec class (model_copy runs in the search's hot path)."""
    return tuple(name for klass in cls.__mro__ for name, attr in vars(klass).items() if isinstance(attr, cached_property))


# Load-balancing loss coefficient when a model gives none: the default of router_aux_loss_coef in
# transformers' MixtralConfig, Qwen2MoeConfig and Qwen3MoeConfig (0.001; transformers v5.23.0,
# src/transformers/models/{mixtral,qwen2_moe,qwen3_moe}/configuration_*.py; MixtralConfig also at
# commit ad467bd7633c63ba3ae55da29ff08a30a47cc008). megatron-core's own default is 0, no balancing
# (Megatron-LM@d98e8a64 megatron/core/transformer/transformer_config.py moe_aux_loss_coeff).
DEFAULT_AUX_LOSS_COEF = 0.001


class MoESpec(Spec):
    num_experts: Count
    top_k: Count
    expert_ffn_hidden_size: Count
    # Router: scores over all experts (softmax or sigmoid), the top_k kept; renormalize_top_k
    # rescales the kept scores to sum to 1 (Mixtral always; Qwen-MoE per norm_topk_prob).
    router_score: RouterScore = RouterScore.SOFTMAX
    renormalize_top_k: bool = True
    router_bias: bool = False  # a bias on the router Linear (GPT-OSS GptOssTopKRouter.bias)
    # Group-limited routing: experts in router_groups groups, tokens routed within the best
    # router_group_top_k groups (DeepSeek-V2/V3); None = all experts eligible.
    router_groups: Count | None = None
    router_group_top_k: Count | None = None
    aux_loss_coef: Annotated[float, Field(ge=0.0)] = DEFAULT_AUX_LOSS_COEF  # load-balancing loss weight
    # The balancing loss over each sequence's tokens rather than the whole micro-batch (DeepSeek's
    # seq_aux; DeepSeek-V3 report Sec. 2.1.2 "complementary sequence-wise auxiliary loss").
    sequence_aux_loss: bool = False
    z_loss_coef: Annotated[float, Field(ge=0.0)] = 0.0  # router z-loss weight (0: none)
    capacity_factor: Positive | None = None  # None: dropless (every routed token is computed)
    num_shared_experts: Annotated[int, Field(ge=0, le=2**20)] = 0
    # Width of each shared expert's MLP; defaults to the routed experts' width.
    shared_expert_ffn_hidden_size: Count | None = None
    # Qwen2-MoE scales the shared expert by sigmoid(Linear(h, 1)).
    shared_expert_gate: bool = False
    # Layer i (0-based) is MoE iff i >= first_k_dense, (i + 1) % layer_freq == 0 and i is not in
    # dense_layers (the Hugging Face Qwen-MoE convention: decoder_sparse_step, mlp_only_layers).
    first_k_dense: Annotated[int, Field(ge=0)] = 0
    layer_freq: Count = 1
    dense_layers: tuple[Annotated[int, Field(ge=0)], ...] = ()
    # The kept scores are multiplied by this (DeepSeek-V2/V3 routed_scaling_factor; 1 = unscaled).
    routed_scaling_factor: Positive = 1.0
    # A per-expert bias added to the scores for choosing experts only, updated from the load
    # (DeepSeek-V3's auxiliary-loss-free balancing, arXiv 2412.19437 Sec. 2.1.2). A buffer, not a
    # parameter: transformers' DeepseekV3TopkRouter.e_score_correction_bias is an nn.Buffer and
    # megatron-core's TopKRouter.expert_bias a registered buffer.
    expert_bias: bool = False

    @model_validator(mode="after")
    def _check(self) -> MoESpec:
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k({self.top_k}) must be <= num_experts({self.num_experts})")
        if (self.router_groups is None) != (self.router_group_top_k is None):
            raise ValueError("router_groups and router_group_top_k are given together or not at all")
        if self.router_groups is not None and (self.num_experts % self.router_groups or self.router_group_top_k > self.router_groups):
            raise ValueError(
                f"router_groups({self.router_groups}) must divide num_experts({self.num_experts}) and be >= "
                f"router_group_top_k({self.router_group_top_k})"
            )
        return self

    @property
    def shared_width(self) -> int:
        return self.shared_expert_ffn_hidden_size or self.expert_ffn_hidden_size


class MLASpec(Spec):
    """Multi-head latent attention (DeepSeek-V2/V3, arXiv 2405.04434 Sec. 2.1): queries through an
    optional low-rank bottleneck (h -> q_lora_rank -> heads x (nope + rope); None: one h -> heads x
    (nope + rope) projection, as DeepSeek-V2-Lite), keys and values from one shared latent
    (h -> kv_lora_rank + rope, then kv_lora_rank -> heads x (nope + v)), the rope part of the key
    shared by all heads. Field names are transformers' DeepseekV3Config keys."""

    q_lora_rank: Count | None = None
    kv_lora_rank: Count
    qk_nope_head_dim: Count
    qk_rope_head_dim: Count
    v_head_dim: Count

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


class RopeScaling(Spec):
    """Llama 3.1's frequency-dependent rotary scaling (transformers modeling_rope_utils.py
    _compute_llama3_parameters, rope_type "llama3"): wavelengths above original/low_freq_factor are
    divided by factor, those below original/high_freq_factor kept, the band between interpolated."""

    kind: Literal["llama3"] = "llama3"
    factor: Positive
    low_freq_factor: Positive
    high_freq_factor: Positive
    original_max_position_embeddings: Count


class MambaSpec(Spec):
    """A Mamba-2 mixer (Dao & Gu 2024, "Transformers are SSMs", arXiv 2405.21060, Sec. 7), as
    transformers' NemotronHMamba2Mixer and Megatron's MambaMixer build it: in_proj h -> [z, x, B, C,
    dt] (2·inner + 2·groups·state + heads), a depthwise causal conv1d of conv_kernel taps over [x, B,
    C], the chunked SSD scan with per-head A_log, dt_bias and D, an RMSNorm gated by silu(z) over
    groups of inner/groups channels, and out_proj inner -> h."""

    num_heads: Count  # mamba_num_heads
    head_dim: Count  # mamba_head_dim; inner width = num_heads·head_dim
    state_size: Count  # ssm_state_size (d_state, N)
    num_groups: Count = 8  # n_groups: B and C are shared by the heads of a group
    conv_kernel: Count = 4
    chunk_size: Count = 128  # the SSD scan's chunk length (Q)
    conv_bias: bool = True  # use_conv_bias
    proj_bias: bool = False  # use_bias: biases on in_proj and out_proj

    @model_validator(mode="after")
    def _check(self) -> MambaSpec:
        if self.num_heads % self.num_groups:
            raise ValueError(f"mamba num_heads({self.num_heads}) must be a multiple of num_groups({self.num_groups})")
        return self

    @property
    def inner(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the causal conv1d: x, B and C."""
        return self.inner + 2 * self.num_groups * self.state_size

    @property
    def in_proj_width(self) -> int:
        """in_proj's outputs: z, x, B, C and dt."""
        return self.inner + self.conv_dim + self.num_heads



def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction 0.1·mscale·ln(factor) + 1 (1 for factor <= 1): transformers
    v5.23.0 modeling_rope_utils.py _compute_yarn_parameters get_mscale, and Megatron-LM@d98e8a64
    megatron/core/models/common/embeddings/yarn_rotary_pos_embedding.py _yarn_get_mscale."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


class YarnScaling(Spec):
    """YaRN rotary scaling (transformers modeling_rope_utils.py _compute_yarn_parameters, rope_type
    "yarn"; GPT-OSS, DeepSeek-V2/V3): frequencies interpolated by factor between the beta_fast and
    beta_slow rotations, cos and sin multiplied by `concentration`; DeepSeek's attention also
    multiplies its softmax scale by `softmax_factor` (mscale_all_dim). Scalars folded into the rotary
    table and the softmax scale: no parameters and no kernel time; a launch carries it."""

    kind: Literal["yarn"] = "yarn"
    factor: Positive
    original_max_position_embeddings: Count
    beta_fast: Positive = 32.0  # _compute_yarn_parameters defaults
    beta_slow: Positive = 1.0
    truncate: bool = True
    # DeepSeek's keys (config.json rope_scaling mscale, mscale_all_dim); None: absent
    mscale: Annotated[float, Field(ge=0.0)] | None = None
    mscale_all_dim: Annotated[float, Field(ge=0.0)] | None = None

    @property
    def concentration(self) -> float:
        """The factor on cos and sin (transformers' attention_factor): get_mscale(factor, mscale) /
        get_mscale(factor, mscale_all_dim) when both are given and non-zero, else get_mscale(factor)
        (_compute_yarn_parameters, v5.23.0)."""
        if self.mscale and self.mscale_all_dim:
            return yarn_mscale(self.factor, self.mscale) / yarn_mscale(self.factor, self.mscale_all_dim)
        return yarn_mscale(self.factor)

    @property
    def softmax_factor(self) -> float:
        """What DeepSeek's attention multiplies its softmax scale by: get_mscale(factor,
        mscale_all_dim)² when mscale_all_dim is non-zero, else 1 (transformers v5.23.0
        DeepseekV3Attention.__init__; Megatron-LM@d98e8a64 multi_latent_attention.py L177-178)."""
        return yarn_mscale(self.factor, self.mscale_all_dim) ** 2 if self.mscale_all_dim else 1.0


class LinearScaling(Spec):
    """Position interpolation (transformers _compute_linear_scaling_rope_parameters, rope_type
    "linear"; Gemma 3's global layers): positions divided by factor."""

    kind: Literal["linear"] = "linear"
    factor: Positive


def _rope_kind(value: object) -> str | None:
    """The scaling's kind; a table without one is Llama 3.1's (the only kind before yarn and linear)."""
    return value.get("kind", "llama3") if isinstance(value, dict) else getattr(value, "kind", None)


AnyRopeScaling = Annotated[
    Annotated[RopeScaling, Tag("llama3")] | Annotated[YarnScaling, Tag("yarn")] | Annotated[LinearScaling, Tag("linear")],
    Discriminator(_rope_kind),
]


class LayerKind(NamedTuple):
    """What one decoder layer's parameters and costs depend on besides the job. Layers of one kind
    cost the same, so every price is computed once per kind (and per recompute mode)."""

    moe: bool = False  # an MoE block in place of the dense MLP
    mixer: MixerKind = MixerKind.ATTENTION  # the token mixer (none in an MLP-only layer)
    mlp: bool = True  # whether the layer has an MLP (or MoE) block after its mixer
    window: int | None = None  # sliding-window attention: each query attends its last `window` tokens
    chunk: int | None = None  # chunked attention: causal within consecutive chunks of `chunk` tokens
    rope: bool = True  # rotary embedding applied (Llama 4's full-attention layers have none)

    @property
    def label(self) -> str:
        """A name for the kind in breakdowns, one per kind: `dense_layers`, `moe_layers`,
        `moe_swa_layers`; a hybrid model's `mamba_layers`, `attention_layers`, `mlp_layers`, `moe_layers`."""
        if self.mixer is MixerKind.ATTENTION and self.mlp:
            parts = ["moe" if self.moe else "dense"]
        else:
            parts = [self.mixer.value] if self.mixer is not MixerKind.NONE else []
            parts += [("moe" if self.moe else "mlp")] if self.mlp else []
        parts += ["swa"] * (self.window is not None) + ["chunked"] * (self.chunk is not None) + ["nope"] * (not self.rope)
        return "_".join(parts)

    @property
    def norms(self) -> int:
        """Pre-norms of the layer: one before the mixer, one before the MLP."""
        return (self.mixer is not MixerKind.NONE) + self.mlp


# Characters of a hybrid layer pattern (transformers NemotronHConfig._pattern_to_list; Megatron's
# --hybrid-layer-pattern symbols, Megatron-LM@d98e8a64
# megatron/core/models/hybrid/hybrid_layer_allocation.py Symbols L14-26): M Mamba-2, * attention,
# - MLP, E MoE (transformers NemotronHMoE: routed experts, router and a shared expert, one norm
# before it). Megatron's other symbols (G, D, L) are not read.
HYBRID_CHARS = {"M": "Mamba-2", "*": "attention", "-": "MLP", "E": "MoE"}
# and the kind of layer each stands for
_HYBRID_KINDS = {
    "M": LayerKind(mixer=MixerKind.MAMBA, mlp=False),
    "*": LayerKind(mixer=MixerKind.ATTENTION, mlp=False),
    "-": LayerKind(mixer=MixerKind.NONE, mlp=True),
    "E": LayerKind(moe=True, mixer=MixerKind.NONE, mlp=True),
}


class ModelSpec(Spec):
    name: Name = "custom"
    num_layers: Count
    hidden_size: Count
    ffn_hidden_size: Count
    num_attention_heads: Count
    num_kv_heads: Count | None = None  # None: multi-head attention (kv heads = heads)
    head_dim: Count | None = None  # None: hidden_size / num_attention_heads
    vocab_size: Count
    max_position_embeddings: Count = 4096
    tie_embeddings: bool = False
    mlp: MLPKind = MLPKind.SWIGLU
    norm: NormKind = NormKind.RMSNORM
    position_embedding: PositionKind = PositionKind.ROPE
    # Rotary base and scaling. 10000 is the default of transformers' LlamaConfig (RotaryEmbeddingConfigMixin
    # default_theta, transformers v5.23.0 modeling_rope_utils.py) and of Megatron's --rotary-base (ARG L2418).
    rope_theta: Positive = 10000.0
    rope_scaling: AnyRopeScaling | None = None
    rotary_fraction: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0  # share of head_dim rotated (GPT-NeoX rotary_pct)
    # Norm epsilon. 1e-5 is megatron-core's layernorm_epsilon default (transformer_config.py L201) and
    # the default of GPT2Config / BloomConfig / GPTNeoXConfig; Llama-family configs give theirs.
    norm_eps: Positive = 1e-5
    qkv_bias: bool = False  # bias on the q, k, v projections
    out_bias: bool = False  # bias on the attention output projection
    mlp_bias: bool = False  # biases on the MLP (and expert) matrices
    qk_norm: bool = False  # per-head norm of q and k over head_dim (Qwen3)
    embedding_norm: bool = False  # norm right after the token embedding (BLOOM)
    hidden_dropout: Fraction = 0.0
    attention_dropout: Fraction = 0.0
    # Local attention. A layer is local unless full_attention_every is set and (i + 1) % it == 0
    # (Megatron's --window-attn-skip-freq N, transformer/utils.py is_layer_window_attention; the
    # default layer_types of transformers' Gemma2Config, Gemma3TextConfig (sliding_window_pattern)
    # and GptOssConfig, and Llama4TextConfig's no_rope_layer_interval). A local layer attends a
    # sliding window of sliding_window tokens, itself included (transformers masking_utils
    # sliding_window_overlay: kv_idx > q_idx - sliding_window), or causally within chunks of
    # attention_chunk_size tokens (chunked_overlay). Neither set: every layer attends in full.
    sliding_window: Count | None = None
    attention_chunk_size: Count | None = None
    full_attention_every: Count | None = None
    nope_full_layers: bool = False  # full-attention layers skip the rotary embedding (Llama 4 no_rope_layers)
    rope_local_theta: Positive | None = None  # rotary base of the local layers when it differs (Gemma 3)
    # Gemma: tanh soft-capping c·tanh(x/c) of the attention scores and of the output logits.
    attn_logit_softcap: Positive | None = None
    final_logit_softcap: Positive | None = None
    query_pre_attn_scalar: Count | None = None  # scores scaled by its -1/2 power instead of head_dim's (Gemma)
    attention_sinks: bool = False  # a learned logit per head joins every softmax (GPT-OSS sinks)
    # GPT-OSS's clamped SwiGLU (transformers GptOssExperts._apply_gate): gate clamped above at
    # swiglu_limit, up to ±swiglu_limit, out = gate·sigmoid(swiglu_alpha·gate)·(up + 1) (GptOssConfig
    # swiglu_limit 7.0, swiglu_alpha 1.702: transformers v5.24.0 configuration_gpt_oss.py L68-69,
    # modeling_gpt_oss.py L79-89). None: silu(gate)·up. The same matrices as SwiGLU.
    swiglu_limit: Positive | None = None
    swiglu_alpha: Positive = 1.702
    sandwich_norms: bool = False  # also a norm on the attention and MLP outputs: four per layer (Gemma 2/3)
    # The norm's weight is stored as an offset from 1, scaling by (1 + weight): Gemma's RMSNorm,
    # Nemotron's LayerNorm1P (transformers NemotronLayerNorm1P; Megatron --apply-layernorm-1p,
    # layernorm_zero_centered_gamma). The same parameters as the norm without it.
    zero_centered_norm: bool = False
    scale_embedding: bool = False  # embedding output multiplied by sqrt(hidden_size) (Gemma)
    qk_l2_norm: bool = False  # weightless L2 norm of q and k on rotary layers (Llama 4 use_qk_norm)
    attn_temperature_tuning: bool = False  # Llama 4's position-dependent query scale on NoPE layers
    # its constants: queries times log1p(floor((position + 1) / floor_scale))·attn_scale + 1
    # (transformers v5.23.0 Llama4TextAttention; Llama4TextConfig floor_scale 8192, attn_scale 0.1)
    attn_temperature_floor_scale: Count = 8192
    attn_temperature_scale: Positive = 0.1
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    # Multi-token prediction modules after the last layer (DeepSeek-V3 Sec. 2.2, depth 1): each an
    # embedding/hidden merge (two norms and an h x 2h projection), one decoder layer of the last
    # layer's kind and a final norm, sharing the embedding and output layer. They train with the
    # model but are not part of its parameter count (transformers' DeepseekV3ForCausalLM does not
    # build them): params.mtp_params counts them apart.
    mtp_layers: Annotated[int, Field(ge=0, le=64)] = 0
    # Hybrid models (Nemotron-H): one character per layer (HYBRID_CHARS); each layer holds one norm
    # and one block. None: every layer is attention followed by an MLP.
    hybrid_pattern: Annotated[str, Field(min_length=1, max_length=MAX_LAYERS)] | None = None
    mamba: MambaSpec | None = None
    source: str = ""

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.mla is not None:
            qk = self.mla.qk_head_dim
            if self.head_dim not in (None, qk) or self.num_kv_heads not in (None, self.num_attention_heads):
                raise ValueError(
                    f"with mla, head_dim({self.head_dim}) is qk_nope_head_dim + qk_rope_head_dim ({qk}) and "
                    f"num_kv_heads({self.num_kv_heads}) is num_attention_heads({self.num_attention_heads}); leave both out"
                )
        if self.num_attention_heads % self.kv_heads:
            raise ValueError(
                f"num_attention_heads({self.num_attention_heads}) must be a multiple of "
                f"num_kv_heads({self.kv_heads})"
            )
        if self.head_dim is None and self.mla is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size({self.hidden_size}) is not divisible by num_attention_heads"
                f"({self.num_attention_heads}); give head_dim explicitly"
            )
        local = (self.sliding_window, self.attention_chunk_size)
        if None not in local:
            raise ValueError("sliding_window and attention_chunk_size: a model's local layers use one of them, not both")
        if local == (None, None) and (self.full_attention_every is not None or self.nope_full_layers):
            raise ValueError("full_attention_every / nope_full_layers need local layers: give sliding_window or attention_chunk_size")
        if self.nope_full_layers and self.position_embedding is not PositionKind.ROPE:
            raise ValueError("nope_full_layers needs rotary positions (position_embedding = rope)")
        if self.swiglu_limit is not None and self.mlp is not MLPKind.SWIGLU:
            raise ValueError(f"swiglu_limit clamps a SwiGLU MLP; mlp is {self.mlp.value} (give mlp = swiglu or drop swiglu_limit)")
        if self.num_layers > MAX_LAYERS:
            raise ValueError(f"num_layers({self.num_layers}) exceeds {MAX_LAYERS}, far above any real model (~100-200)")
        if self.hybrid_pattern is not None:
            bad_chars = sorted(set(self.hybrid_pattern) - set(HYBRID_CHARS))
            if bad_chars:
                raise ValueError(
                    f"hybrid_pattern: characters {bad_chars} are not layer kinds; allowed: "
                    + ", ".join(f"{c} ({what})" for c, what in HYBRID_CHARS.items())
                )
            if len(self.hybrid_pattern) != self.num_layers:
                raise ValueError(f"hybrid_pattern has {len(self.hybrid_pattern)} layers, num_layers is {self.num_layers}; they must be equal")
            if ("M" in self.hybrid_pattern) != (self.mamba is not None):
                raise ValueError("hybrid_pattern: Mamba layers (M) and a mamba section are given together or not at all")
            if ("E" in self.hybrid_pattern) != (self.moe is not None):
                raise ValueError("hybrid_pattern: MoE layers (E) and a moe section are given together or not at all")
            if self.moe is not None and (self.moe.first_k_dense or self.moe.layer_freq != 1 or self.moe.dense_layers):
                raise ValueError(
                    "moe: in a hybrid model the pattern's E layers are the MoE layers; leave out first_k_dense, "
                    "layer_freq and dense_layers"
                )
            if self.sliding_window is not None or self.attention_chunk_size is not None:
                raise ValueError("hybrid_pattern: local attention (sliding_window, attention_chunk_size) in a hybrid model is not supported")
        elif self.mamba is not None:
            raise ValueError("mamba: a Mamba-2 mixer needs a hybrid_pattern saying which layers hold it (M)")
        if self.moe is not None:
            bad = [i for i in self.moe.dense_layers if i >= self.num_layers]
            if bad or self.moe.first_k_dense > self.num_layers:
                raise ValueError(f"moe: dense layers {bad or self.moe.first_k_dense} beyond num_layers({self.num_layers})")
        # Every layer counted as dense and MoE at once: an upper bound that leaves the cached
        # properties unset (model_copy would carry them over to a changed copy).
        h, moe = self.hidden_size, self.moe
        layer = 4 * h * self.q_width + 3 * h * self.ffn_hidden_size
        if moe is not None:
            layer += 3 * h * (moe.num_experts * moe.expert_ffn_hidden_size + moe.num_shared_experts * moe.shared_width)
        if self.mamba is not None:
            mb = self.mamba
            layer += h * (mb.in_proj_width + mb.inner) + mb.conv_dim * (mb.conv_kernel + 1)
        params = self.num_layers * layer + 2 * self.vocab_size * h
        if params > MAX_PARAMS:
            raise ValueError(
                f"about {params:,} parameters exceed {MAX_PARAMS:,} (2^45), far above any real model (~1e12); "
                "check hidden_size, ffn_hidden_size, vocab_size and num_layers"
            )
        return self

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_attention_heads

    @property
    def head_size(self) -> int:
        """Query/key width of one head (under MLA: nope + rope)."""
        if self.mla is not None:
            return self.mla.qk_head_dim
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def v_head_size(self) -> int:
        """Value width of one head (MLA's v_head_dim; else the head size)."""
        return self.mla.v_head_dim if self.mla is not None else self.head_size

    @property
    def attention_head_size(self) -> float:
        """The mean of the query/key and value head widths: core attention's FLOPs are
        2·q·k·d_qk + 2·q·k·d_v per head = 4·q·k·this."""
        return (self.head_size + self.v_head_size) / 2

    @property
    def q_width(self) -> int:
        """Width of all query heads together (= hidden_size unless head_dim is set apart)."""
        return self.num_attention_heads * self.head_size

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_size

    def is_moe_layer(self, i: int) -> bool:
        m = self.moe
        if self.hybrid_pattern is not None:
            return self.hybrid_pattern[i] == "E"
        return m is not None and i >= m.first_k_dense and (i + 1) % m.layer_freq == 0 and i not in m.dense_layers

    @cached_property
    def moe_layer_ids(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.num_layers) if self.is_moe_layer(i))

    def is_local_layer(self, i: int) -> bool:
        """Sliding-window or chunked attention on layer i (see sliding_window)."""
        if self.sliding_window is None and self.attention_chunk_size is None:
            return False
        return self.full_attention_every is None or (i + 1) % self.full_attention_every != 0

    def layer_kind(self, i: int) -> LayerKind:
        return self.kinds_by_layer[i]

    @cached_property
    def kinds_by_layer(self) -> tuple[LayerKind, ...]:
        """Each decoder layer's kind, in order (the cost model asks for them per layer and job)."""
        return tuple(self._layer_kind(i) for i in range(self.num_layers))

    def _layer_kind(self, i: int) -> LayerKind:
        if self.hybrid_pattern is not None:
            return _HYBRID_KINDS[self.hybrid_pattern[i]]
        local = self.is_local_layer(i)
        return LayerKind(
            moe=self.is_moe_layer(i),
            window=self.sliding_window if local else None,
            chunk=self.attention_chunk_size if local else None,
            rope=local or not self.nope_full_layers,
        )

    @cached_property
    def layer_kinds(self) -> dict[LayerKind, int]:
        """One layer id per kind of decoder layer, the first of each, in layer order."""
        out: dict[LayerKind, int] = {}
        for i, kind in enumerate(self.kinds_by_layer):
            out.setdefault(kind, i)
        return out

    @cached_property
    def layer_kind_counts(self) -> dict[LayerKind, int]:
        """How many decoder layers are of each kind (in the order of layer_kinds)."""
        return dict(Counter(self.kinds_by_layer))

    @property
    def num_moe_layers(self) -> int:
        return len(self.moe_layer_ids)

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    @cached_property
    def params_total(self) -> int:
        from cost_models.params import model_params

        return model_params(self).total

    @cached_property
    def params_active(self) -> int:
        from cost_models.params import model_params

        return model_params(self, active=True).total
