"""Hugging Face `config.json` -> ModelSpec, offline, for the architectures whose module structure we
mirror exactly (parameter counts are checked against transformers' own modules in tests).

Each reader names the config keys and defaults of the transformers class it follows. Defaults of
keys a config.json may omit are those of transformers v5.23.0 (the `test` extra's version),
src/transformers/models/<type>/configuration_<type>.py and modeling_rope_utils.py
(RotaryEmbeddingConfigMixin.default_theta = 10000.0): rms_norm_eps 1e-6 (Llama, Mistral, Qwen2,
Qwen2-MoE, Qwen3, Qwen3-MoE) or 1e-5 (Mixtral); rope_theta 10000 except Mixtral's 1e6 (its
default_theta); router_aux_loss_coef 0.001 and norm_topk_prob false (Qwen2-MoE, Qwen3-MoE);
layer_norm_epsilon / layer_norm_eps 1e-5 (GPT-2, BLOOM, GPT-NeoX); GPT-NeoX rotary_pct 0.25 and
rotary_emb_base 10000; NemotronHConfig (nemotron_h) as its reader says. The Mixtral defaults read the same at commit
ad467bd7633c63ba3ae55da29ff08a30a47cc008 (MixtralConfig.__init__).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cost_models.enums import MLPKind, NormKind, PositionKind, RouterScore
from cost_models.errors import SpecError
from cost_models.model_spec import ModelSpec


def _whole(key: str, value: Any) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"config.json: {key} = {value!r} must be a whole number")
    return value


def _get(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    """A size (a whole number) under the first of `keys` present."""
    for k in keys:
        if cfg.get(k) is not None:
            return _whole(k, cfg[k])
    if default is None:
        raise SpecError(f"config.json: missing {' or '.join(keys)} (model_type {cfg.get('model_type')!r})")
    return default


def _opt(cfg: dict[str, Any], key: str, default: Any) -> Any:
    """An optional key of the type of `default` (bool, int or float); absent or null gives `default`."""
    value = cfg.get(key)
    if value is None:
        return default
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise SpecError(f"config.json: {key} = {value!r} must be true or false")
        return value
    if isinstance(default, int):
        return _whole(key, value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"config.json: {key} = {value!r} must be a number")
    return float(value)


def _rope(cfg: dict[str, Any], *, theta: float) -> dict[str, Any]:
    """rope_theta and rope_scaling, from the keys of transformers 4.x (rope_theta, rope_scaling) or
    5.x (rope_parameters holding rope_type, rope_theta and the scaling keys)."""
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or params
    if not isinstance(params, dict) or not isinstance(scaling, dict):
        raise SpecError("config.json: rope_parameters / rope_scaling must be objects")
    out: dict[str, Any] = {"rope_theta": _opt(cfg, "rope_theta", None) or _opt(params, "rope_theta", theta)}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "llama3":
        out["rope_scaling"] = dict(
            factor=_opt(scaling, "factor", 8.0),
            low_freq_factor=_opt(scaling, "low_freq_factor", 1.0),
            high_freq_factor=_opt(scaling, "high_freq_factor", 4.0),
            original_max_position_embeddings=_get(scaling, "original_max_position_embeddings"),
        )
    elif kind == "yarn":
        # _compute_yarn_parameters: factor and original_max_position_embeddings required, beta_fast
        # 32 and beta_slow 1 by default, truncate true unless given (GPT-OSS gives false)
        out["rope_scaling"] = dict(
            kind="yarn",
            factor=_opt(scaling, "factor", 0.0) or _get(scaling, "factor"),
            original_max_position_embeddings=_get(scaling, "original_max_position_embeddings"),
            beta_fast=_opt(scaling, "beta_fast", 32.0),
            beta_slow=_opt(scaling, "beta_slow", 1.0),
            truncate=_opt(scaling, "truncate", True),
            # DeepSeek's magnitude corrections (DeepseekV3Attention, _compute_yarn_parameters)
            mscale=_opt(scaling, "mscale", 0.0) if scaling.get("mscale") is not None else None,
            mscale_all_dim=_opt(scaling, "mscale_all_dim", 0.0) if scaling.get("mscale_all_dim") is not None else None,
        )
    elif kind == "linear":
        out["rope_scaling"] = dict(kind="linear", factor=_opt(scaling, "factor", 0.0) or _get(scaling, "factor"))
    elif kind != "default":
        raise SpecError(f"config.json: rope scaling type {kind!r} is not supported (supported: llama3, yarn, linear, or none)")
    return out


def _llama_like(cfg: dict[str, Any], *, eps: float = 1e-6, theta: float = 10000.0, **extra: Any) -> dict[str, Any]:
    """LlamaConfig / MistralConfig / Qwen2Config: RMSNorm, SwiGLU, rotary (GPT-OSS and Llama 4 text too,
    with the fields they set apart given in `extra`)."""
    heads = _get(cfg, "num_attention_heads")
    out = dict(
        num_layers=_get(cfg, "num_hidden_layers"),
        hidden_size=_get(cfg, "hidden_size"),
        ffn_hidden_size=_get(cfg, "intermediate_size"),
        num_attention_heads=heads,
        num_kv_heads=_opt(cfg, "num_key_value_heads", 0) or heads,
        head_dim=_opt(cfg, "head_dim", 0) or None,
        vocab_size=_get(cfg, "vocab_size"),
        max_position_embeddings=_get(cfg, "max_position_embeddings", default=4096),
        tie_embeddings=_opt(cfg, "tie_word_embeddings", False),
        mlp=MLPKind.SWIGLU,
        norm=NormKind.RMSNORM,
        position_embedding=PositionKind.ROPE,
        qkv_bias=_opt(cfg, "attention_bias", False),
        out_bias=_opt(cfg, "attention_bias", False),
        mlp_bias=_opt(cfg, "mlp_bias", False),
        attention_dropout=_opt(cfg, "attention_dropout", 0.0),
        norm_eps=_opt(cfg, "rms_norm_eps", eps),
        **_rope(cfg, theta=theta),
    )
    out.update(extra)
    return out


def _llama(cfg: dict[str, Any]) -> dict[str, Any]:
    return _llama_like(cfg)


# Sliding windows of the Mistral and Qwen families, as transformers v5.24.0 applies them (the lines
# below are of that version's models/<type>/configuration_<type>.py and modeling_<type>.py): a layer
# whose mask is create_sliding_window_causal_mask attends its last sliding_window tokens.


def _window(cfg: dict[str, Any], default: int | None) -> int | None:
    """config.sliding_window: absent gives the class default, null none."""
    if "sliding_window" not in cfg:
        return default
    return None if cfg["sliding_window"] is None else _opt(cfg, "sliding_window", 0) or None


def _windows(cfg: dict[str, Any], window: int | None, local: list[bool]) -> dict[str, Any]:
    """sliding_window and full_attention_every for a window on the layers flagged local."""
    if window is None or not any(local):
        return {}
    full = [i for i, flag in enumerate(local) if not flag]
    every = full[0] + 1 if full else None
    if every is not None and local != [(i + 1) % every != 0 for i in range(len(local))]:
        raise SpecError(
            f"config.json: a sliding window on {sum(local)} of {len(local)} layers, first full layer {full[0]} (model_type "
            f"{cfg.get('model_type')!r}); the spec holds a window on every layer or on all but every N-th; "
            "use a config whose window layers follow that (e.g. max_window_layers 0), or use_sliding_window false"
        )
    return {"sliding_window": window, "full_attention_every": every}


def _switched_window(cfg: dict[str, Any], layers: int, default_local: Callable[[int, int], bool]) -> dict[str, Any]:
    """Qwen2Config / Qwen3Config / Qwen2MoeConfig: sliding_window (default 4096) counts only when
    use_sliding_window (default false); then the layers listed "sliding_attention" in layer_types,
    or by default those default_local(i, max_window_layers) says (max_window_layers default 28)
    (qwen2 configuration L73-76, L83-93; qwen3 L76-79, L86-96; qwen2_moe L91-93, L112-119; the
    models read config.layer_types per layer, e.g. modeling_qwen2.py L173, L185)."""
    if not _opt(cfg, "use_sliding_window", False):
        return {}
    if cfg.get("layer_types") is not None:
        every = _layer_types(cfg, layers, "sliding_attention", 1)
        local = [every is None or (i + 1) % every != 0 for i in range(layers)]
    else:
        bound = _opt(cfg, "max_window_layers", 28)
        local = [default_local(i, bound) for i in range(layers)]
    return _windows(cfg, _window(cfg, 4096), local)


def _mistral(cfg: dict[str, Any]) -> dict[str, Any]:
    # MistralConfig: sliding_window 4096 unless given (null: none), on every layer (layer_types are
    # ignored, with a warning): configuration_mistral.py L79, L87-90; modeling_mistral.py L173, L355.
    # MistralMLP and MistralAttention have no biases, whatever the config says (L41-43, L134-137).
    layers = _get(cfg, "num_hidden_layers")
    return _llama_like(cfg, qkv_bias=False, out_bias=False, mlp_bias=False,
                       **_windows(cfg, _window(cfg, 4096), [True] * layers))


def _qwen2(cfg: dict[str, Any]) -> dict[str, Any]:
    # Qwen2Attention: q/k/v with bias, o_proj without (transformers models/qwen2/modeling_qwen2.py);
    # the window on layers max_window_layers and up
    window = _switched_window(cfg, _get(cfg, "num_hidden_layers"), lambda i, bound: i >= bound)
    return _llama_like(cfg, qkv_bias=True, out_bias=False, mlp_bias=False, **window)


def _mixtral(cfg: dict[str, Any]) -> dict[str, Any]:
    # MixtralSparseMoeBlock: gate Linear(h, E, bias=False), experts w1/w2/w3 of intermediate_size
    # (softmax over all experts, top-k, renormalised: MixtralSparseMoeBlock / MixtralTopKRouter).
    # MixtralConfig sliding_window: none unless given, then on every layer (configuration_mixtral.py
    # L82, modeling_mixtral.py L322, L444).
    ffn = _get(cfg, "intermediate_size")
    moe = dict(num_experts=_get(cfg, "num_local_experts"), top_k=_get(cfg, "num_experts_per_tok"), expert_ffn_hidden_size=ffn,
               aux_loss_coef=_opt(cfg, "router_aux_loss_coef", 0.001))
    layers = _get(cfg, "num_hidden_layers")
    return _llama_like(cfg, eps=1e-5, theta=1e6, moe=moe, **_windows(cfg, _window(cfg, None), [True] * layers))


def _qwen_moe_layers(cfg: dict[str, Any]) -> dict[str, Any]:
    """Qwen2-MoE / Qwen3-MoE: which layers are MoE, and the router (softmax over all experts, top-k,
    renormalised only when norm_topk_prob)."""
    return dict(
        layer_freq=_opt(cfg, "decoder_sparse_step", 1) or 1,
        dense_layers=cfg.get("mlp_only_layers") or (),
        renormalize_top_k=_opt(cfg, "norm_topk_prob", False),
        aux_loss_coef=_opt(cfg, "router_aux_loss_coef", 0.001),
    )


def _qwen2_moe(cfg: dict[str, Any]) -> dict[str, Any]:
    # Qwen2MoeSparseMoeBlock: router, experts of moe_intermediate_size, one shared expert of
    # shared_expert_intermediate_size scaled by sigmoid(Linear(h, 1))
    shared = _opt(cfg, "shared_expert_intermediate_size", 0)
    moe = dict(
        num_experts=_get(cfg, "num_experts"),
        top_k=_get(cfg, "num_experts_per_tok"),
        expert_ffn_hidden_size=_get(cfg, "moe_intermediate_size"),
        num_shared_experts=1 if shared else 0,
        shared_expert_ffn_hidden_size=shared or None,
        shared_expert_gate=bool(shared),
        **_qwen_moe_layers(cfg),
    )
    # the window on even-numbered layers (i + 1 odd) below max_window_layers
    window = _switched_window(cfg, _get(cfg, "num_hidden_layers"), lambda i, bound: (i + 1) % 2 == 1 and i < bound)
    return _llama_like(cfg, qkv_bias=True, out_bias=False, moe=moe, **window)


def _qwen3_moe(cfg: dict[str, Any]) -> dict[str, Any]:
    # Qwen3MoeAttention: q_norm/k_norm RMSNorm(head_dim); bias per attention_bias
    moe = dict(
        num_experts=_get(cfg, "num_experts"),
        top_k=_get(cfg, "num_experts_per_tok"),
        expert_ffn_hidden_size=_get(cfg, "moe_intermediate_size"),
        **_qwen_moe_layers(cfg),
    )
    # Qwen3MoeConfig: sliding_window (default 4096) only when use_sliding_window, then on every layer
    # (configuration_qwen3_moe.py L94-95, L110; modeling_qwen3_moe.py L149, L473)
    layers = _get(cfg, "num_hidden_layers")
    window = _windows(cfg, _window(cfg, 4096), [True] * layers) if _opt(cfg, "use_sliding_window", False) else {}
    return _llama_like(cfg, qk_norm=True, moe=moe, **window)


def _qwen3(cfg: dict[str, Any]) -> dict[str, Any]:
    # the window on layers max_window_layers and up, as Qwen2's
    return _llama_like(cfg, qk_norm=True, **_switched_window(cfg, _get(cfg, "num_hidden_layers"), lambda i, bound: i >= bound))


def _deepseek(cfg: dict[str, Any], *, v3: bool) -> dict[str, Any]:
    """DeepseekV3Config / DeepseekV2Config: multi-head latent attention, dense MLPs in the first
    first_k_dense_replace layers, then MoE layers of n_routed_experts (moe_intermediate_size wide)
    and one shared MLP of n_shared_experts·moe_intermediate_size (DeepseekV3MoE / DeepseekV2Moe;
    counted as n_shared_experts experts of moe_intermediate_size, the same matrices' elements).
    Routers: V3 sigmoid scores with a score-correction bias buffer, group-limited top-k (n_group,
    topk_group), renormalised per norm_topk_prob, times routed_scaling_factor
    (DeepseekV3TopkRouter); V2 softmax scores, group-limited only for topk_method
    "group_limited_greedy" (DeepseekV2TopkRouter). The q/kv down projections and o_proj carry
    attention_bias. Defaults (v5.23.0): V3 intermediate_size 18432, q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim
    128, qk_rope_head_dim 64, v_head_dim 128, n_routed_experts 256, n_shared_experts 1,
    moe_intermediate_size 2048, num_experts_per_tok 8, n_group 8, topk_group 4,
    first_k_dense_replace 3, routed_scaling_factor 2.5, norm_topk_prob true, num_mtp_layers
    (num_nextn_predict_layers) 1, max_position_embeddings 4096; V2 intermediate_size 11008, the same MLA sizes,
    n_routed_experts 64, n_shared_experts 2, moe_intermediate_size 1407, first_k_dense_replace 0,
    routed_scaling_factor 1.0, norm_topk_prob false, topk_method "greedy", max_position_embeddings
    2048; both rms_norm_eps 1e-6, rope_theta 10000. DeepSeek's aux_loss_alpha and seq_aux (not
    transformers keys) are read as the balancing loss's weight and its per-sequence form. YaRN rope
    scaling (rope_scaling type "yarn", with DeepSeek's mscale and mscale_all_dim) is kept: it
    changes the rotary frequencies and the softmax scale of the model a launch builds."""

    def opt_size(key: str, default: int | None) -> int | None:
        return _opt(cfg, key, 0) or None if key in cfg else default

    q_lora = opt_size("q_lora_rank", 1536)
    mla = dict(
        q_lora_rank=q_lora,
        kv_lora_rank=_get(cfg, "kv_lora_rank", default=512),
        qk_nope_head_dim=_get(cfg, "qk_nope_head_dim", default=128),
        qk_rope_head_dim=_get(cfg, "qk_rope_head_dim", default=64),
        v_head_dim=_get(cfg, "v_head_dim", default=128),
    )
    experts = _get(cfg, "n_routed_experts", default=256 if v3 else 64)
    groups, group_top_k = opt_size("n_group", 8 if v3 else None), opt_size("topk_group", 4 if v3 else None)
    if not v3 and cfg.get("topk_method", "greedy") != "group_limited_greedy":
        groups = group_top_k = None
    moe = dict(
        num_experts=experts,
        top_k=_get(cfg, "num_experts_per_tok", default=8) if v3 else _get(cfg, "num_experts_per_tok"),
        expert_ffn_hidden_size=_get(cfg, "moe_intermediate_size", default=2048 if v3 else 1407),
        num_shared_experts=_opt(cfg, "n_shared_experts", 1 if v3 else 2),
        first_k_dense=_opt(cfg, "first_k_dense_replace", 3 if v3 else 0),
        router_score=RouterScore.SIGMOID if v3 else RouterScore.SOFTMAX,
        renormalize_top_k=_opt(cfg, "norm_topk_prob", v3),
        routed_scaling_factor=_opt(cfg, "routed_scaling_factor", 2.5 if v3 else 1.0),
        expert_bias=v3,
        router_groups=groups if groups and groups > 1 else None,
        router_group_top_k=group_top_k if groups and groups > 1 else None,
        aux_loss_coef=_opt(cfg, "aux_loss_alpha", 0.001),
        # DeepSeek's seq_aux (DeepSeek-V2's remote configuration_deepseek.py defaults it to true; V3's
        # config.json has no key and its report, Sec. 2.1.2, balances per sequence)
        sequence_aux_loss=_opt(cfg, "seq_aux", True),
    )
    # the config _llama_like reads: intermediate_size defaulted (the class default, above)
    base = dict(cfg)
    if base.get("intermediate_size") is None:
        base["intermediate_size"] = 18432 if v3 else 11008
    return _llama_like(
        base,
        num_kv_heads=None,
        head_dim=None,
        max_position_embeddings=_get(cfg, "max_position_embeddings", default=4096 if v3 else 2048),
        mlp_bias=False if v3 else _opt(cfg, "mlp_bias", False),
        mla=mla,
        moe=moe,
        mtp_layers=_opt(cfg, "num_nextn_predict_layers", _opt(cfg, "num_mtp_layers", 1)) if v3 else 0,
    )


def _deepseek_v3(cfg: dict[str, Any]) -> dict[str, Any]:
    return _deepseek(cfg, v3=True)


def _deepseek_v2(cfg: dict[str, Any]) -> dict[str, Any]:
    return _deepseek(cfg, v3=False)


def _nemotron(cfg: dict[str, Any]) -> dict[str, Any]:
    """NemotronConfig / NemotronModel: LayerNorm1P (NemotronLayerNorm1P, an nn.LayerNorm with weight
    and bias applied as weight + 1), squared-ReLU MLP up_proj/down_proj without gate (NemotronMLP,
    hidden_act "relu2"), rotary over partial_rotary_factor of each head, q/k/v/o biases per
    attention_bias, MLP biases per mlp_bias, untied output layer. Defaults (v5.23.0): norm_eps
    1e-5, partial_rotary_factor 0.5, rope_theta 10000, max_position_embeddings 4096, head_dim
    hidden_size / num_attention_heads, num_key_value_heads = num_attention_heads."""
    act = cfg.get("hidden_act", "relu2")
    if act != "relu2":
        raise SpecError(f"config.json: nemotron hidden_act {act!r} is not supported (supported: relu2)")
    params = cfg.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise SpecError("config.json: rope_parameters must be an object")
    bias = _opt(cfg, "attention_bias", False)
    out = _llama_like(cfg, eps=1e-5)
    out.update(
        mlp=MLPKind.SQUARED_RELU,
        norm=NormKind.LAYERNORM,
        zero_centered_norm=True,
        norm_eps=_opt(cfg, "norm_eps", 1e-5),
        rotary_fraction=_opt(cfg, "partial_rotary_factor", None) or _opt(params, "partial_rotary_factor", 0.5),
        qkv_bias=bias,
        out_bias=bias,
    )
    return out


def _gelu_layernorm(cfg: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """GPT-2 / GPT-NeoX / BLOOM family: GELU MLP with biases, LayerNorm with bias. Their configs name
    the shape keys differently (GPT2Config n_layer/n_embd/n_head, BloomConfig n_layer/n_embed/n_head,
    GPTNeoXConfig num_hidden_layers/hidden_size/num_attention_heads), so each key is looked up under
    all its names; `fields` are what the architecture adds or overrides."""
    h = _get(cfg, "hidden_size", "n_embd", "n_embed")
    base = dict(
        num_layers=_get(cfg, "num_hidden_layers", "n_layer"),
        hidden_size=h,
        ffn_hidden_size=_opt(cfg, "intermediate_size", 0) or _opt(cfg, "n_inner", 0) or 4 * h,
        num_attention_heads=_get(cfg, "num_attention_heads", "n_head"),
        vocab_size=_get(cfg, "vocab_size"),
        mlp=MLPKind.GELU,
        norm=NormKind.LAYERNORM,
        qkv_bias=True,
        out_bias=True,
        mlp_bias=True,
        hidden_dropout=_opt(cfg, "hidden_dropout", 0.0),
        attention_dropout=_opt(cfg, "attention_dropout", 0.0),
        norm_eps=_opt(cfg, "layer_norm_epsilon", None) or _opt(cfg, "layer_norm_eps", 1e-5),
    )
    return {**base, **fields}


def _gpt2(cfg: dict[str, Any]) -> dict[str, Any]:
    # GPT2Model: wte, wpe (n_positions), Conv1D c_attn/c_proj/c_fc (n_inner or 4h) with biases, tied head
    return _gelu_layernorm(
        cfg,
        max_position_embeddings=_get(cfg, "n_positions", "max_position_embeddings"),
        tie_embeddings=_opt(cfg, "tie_word_embeddings", True),
        position_embedding=PositionKind.LEARNED,
        hidden_dropout=_opt(cfg, "resid_pdrop", 0.0),
        attention_dropout=_opt(cfg, "attn_pdrop", 0.0),
    )


def _gpt_neox(cfg: dict[str, Any]) -> dict[str, Any]:
    # GPTNeoXModel: embed_in, fused query_key_value and dense with attention_bias (default True),
    # dense_h_to_4h/4h_to_h (intermediate_size) with bias, untied embed_out
    bias = _opt(cfg, "attention_bias", True)
    params = cfg.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise SpecError("config.json: rope_parameters must be an object")
    return _gelu_layernorm(
        cfg,
        rope_theta=_opt(cfg, "rotary_emb_base", None) or _opt(params, "rope_theta", 10000.0),
        rotary_fraction=_opt(cfg, "rotary_pct", None) or _opt(params, "partial_rotary_factor", 0.25),
        max_position_embeddings=_get(cfg, "max_position_embeddings", default=2048),
        tie_embeddings=_opt(cfg, "tie_word_embeddings", False),
        position_embedding=PositionKind.ROPE,
        qkv_bias=bias,
        out_bias=bias,
    )


def _bloom(cfg: dict[str, Any]) -> dict[str, Any]:
    # BloomModel: word_embeddings + word_embeddings_layernorm, ALiBi, fused query_key_value,
    # 4h MLP (BloomMLP ignores any width key), tied lm_head
    return _gelu_layernorm(
        cfg,
        ffn_hidden_size=4 * _get(cfg, "hidden_size", "n_embed"),
        max_position_embeddings=_opt(cfg, "seq_length", 2048),
        tie_embeddings=_opt(cfg, "tie_word_embeddings", True),
        position_embedding=PositionKind.ALIBI,
        embedding_norm=True,
    )


# NemotronHConfig's layer types (layers_block_type) as pattern characters (its _list_to_pattern).
_NEMOTRON_H_TYPES = {"linear_attention": "M", "full_attention": "*", "mlp": "-", "moe": "E"}


def _nemotron_h(cfg: dict[str, Any]) -> dict[str, Any]:
    """NemotronHConfig / NemotronHForCausalLM (transformers v5.23.0, models/nemotron_h): every block is
    one RMSNorm and one mixer, by pattern character: M NemotronHMamba2Mixer, * NemotronHAttention
    (q/k/v/o without bias whatever attention_bias says, no rotary embedding), - NemotronHMLP
    (up_proj, relu2, down_proj; bias per mlp_bias). The pattern is layers_block_type, or
    hybrid_override_pattern in older configs. Defaults: head_dim 128, num_key_value_heads 8,
    intermediate_size 21504, mamba_num_heads 128, mamba_head_dim 64, ssm_state_size 128, n_groups 8
    (or mamba_n_groups), conv_kernel 4 (or mamba_d_conv), chunk_size 128 (or mamba_chunk_size),
    use_conv_bias true (or mamba_conv_bias), use_bias false (in_proj/out_proj), layer_norm_epsilon
    1e-5, tie_word_embeddings false, vocab_size 131072. The Mamba inner width is
    mamba_num_heads·mamba_head_dim (`expand` is not read by the mixer).

    E ("moe") layers are NemotronHMoE (v5.24.0 modeling_nemotron_h.py L653-797): n_routed_experts
    NemotronHExperts of up_proj and down_proj without bias (relu2, moe_intermediate_size wide), a
    NemotronHTopkRouter (weight E x h, no bias; sigmoid scores, an e_score_correction_bias buffer
    added for choosing, group-limited over n_group groups keeping topk_group, renormalised per
    norm_topk_prob, times routed_scaling_factor) and one shared NemotronHMLP of
    moe_shared_expert_intermediate_size (n_shared_experts is not read: one is built). Defaults:
    n_routed_experts 8, num_experts_per_tok 2, moe_intermediate_size 7688,
    moe_shared_expert_intermediate_size 7688, n_group 1, topk_group 1, norm_topk_prob true,
    routed_scaling_factor 1.0, moe_latent_size null. The config names no balancing loss; its weight
    and form are Megatron-Bridge's for nemotron_h (moe_aux_loss_coeff 0.0001, "seq_aux_loss",
    NVIDIA-NeMo/Megatron-Bridge@067f987df03b8355b03192d88d70f1709fedf51a
    src/megatron/bridge/models/nemotronh/nemotron_h_bridge.py L310-313)."""
    types = cfg.get("layers_block_type") or cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or any(t not in _NEMOTRON_H_TYPES for t in types):
            raise SpecError(f"config.json: layers_block_type must be a list of {', '.join(_NEMOTRON_H_TYPES)}")
        pattern = "".join(_NEMOTRON_H_TYPES[t] for t in types)
    else:
        pattern = cfg.get("hybrid_override_pattern")
        if not isinstance(pattern, str) or not pattern:
            raise SpecError("config.json: nemotron_h needs layers_block_type or hybrid_override_pattern")
    bad = sorted(set(pattern) - set(_NEMOTRON_H_TYPES.values()))
    if bad:
        raise SpecError(f"config.json: hybrid_override_pattern characters {bad} are not layer kinds; allowed: M, *, -, E")
    if _opt(cfg, "num_nextn_predict_layers", 0):
        # NemotronHForCausalLM builds no MTP modules: it drops their weights on load
        # (NemotronHPreTrainedModel._keys_to_ignore_on_load_unexpected = [r"mtp.*"], v5.24.0
        # modeling_nemotron_h.py L1013), so their parameters cannot be checked against it
        raise SpecError(
            "config.json: nemotron_h multi-token prediction layers (num_nextn_predict_layers > 0) are not supported: "
            "transformers' NemotronHForCausalLM does not build them; set num_nextn_predict_layers to 0"
        )
    heads = _opt(cfg, "num_attention_heads", 32)

    mamba = dict(
        num_heads=_opt(cfg, "mamba_num_heads", 128),
        head_dim=_opt(cfg, "mamba_head_dim", 64),
        state_size=_opt(cfg, "ssm_state_size", 128),
        # NemotronHConfig.__init__: a mamba_* key, where given, wins over its plain name
        num_groups=_get(cfg, "mamba_n_groups", "n_groups", default=8),
        conv_kernel=_get(cfg, "mamba_d_conv", "conv_kernel", default=4),
        chunk_size=_get(cfg, "mamba_chunk_size", "chunk_size", default=128),
        conv_bias=_opt(cfg, "mamba_conv_bias" if cfg.get("mamba_conv_bias") is not None else "use_conv_bias", True),
        proj_bias=_opt(cfg, "use_bias", False),
    )
    act = cfg.get("mlp_hidden_act", "relu2")
    if act != "relu2":
        raise SpecError(f"config.json: nemotron_h mlp_hidden_act {act!r} is not supported (supported: relu2)")
    moe = _nemotron_h_moe(cfg) if "E" in pattern else None
    return dict(
        num_layers=len(pattern),
        hidden_size=_opt(cfg, "hidden_size", 4096),
        ffn_hidden_size=_opt(cfg, "intermediate_size", 21504),
        num_attention_heads=heads,
        num_kv_heads=_opt(cfg, "num_key_value_heads", 8),
        head_dim=_opt(cfg, "head_dim", 128),
        vocab_size=_opt(cfg, "vocab_size", 131072),
        max_position_embeddings=_opt(cfg, "max_position_embeddings", 4096),
        tie_embeddings=_opt(cfg, "tie_word_embeddings", False),
        mlp=MLPKind.SQUARED_RELU,
        norm=NormKind.RMSNORM,
        position_embedding=PositionKind.NONE,
        mlp_bias=_opt(cfg, "mlp_bias", False),
        attention_dropout=_opt(cfg, "attention_dropout", 0.0),
        hidden_dropout=_opt(cfg, "hidden_dropout", 0.0),
        norm_eps=_opt(cfg, "layer_norm_epsilon", 1e-5),
        hybrid_pattern=pattern,
        mamba=mamba if "M" in pattern else None,
        moe=moe,
    )


def _nemotron_h_moe(cfg: dict[str, Any]) -> dict[str, Any]:
    """The MoE section of a nemotron_h config with E layers (see _nemotron_h)."""
    if cfg.get("moe_latent_size") is not None:
        raise SpecError("config.json: nemotron_h moe_latent_size (a latent projection around the experts) is not supported; "
                        "set it to null")
    if _opt(cfg, "mlp_bias", False):
        # NemotronHExperts has no biases while the shared NemotronHMLP takes mlp_bias: one
        # mlp_bias cannot say both
        raise SpecError("config.json: nemotron_h mlp_bias true with MoE layers is not supported (the routed experts "
                        "have no bias, the shared expert would); set mlp_bias to false")
    groups, group_top_k = _get(cfg, "n_group", default=1), _get(cfg, "topk_group", default=1)
    return dict(
        num_experts=_get(cfg, "n_routed_experts", "num_local_experts", default=8),
        top_k=_get(cfg, "num_experts_per_tok", default=2),
        expert_ffn_hidden_size=_get(cfg, "moe_intermediate_size", default=7688),
        num_shared_experts=1,
        shared_expert_ffn_hidden_size=_get(cfg, "moe_shared_expert_intermediate_size", default=7688),
        router_score=RouterScore.SIGMOID,
        renormalize_top_k=_opt(cfg, "norm_topk_prob", True),
        routed_scaling_factor=_opt(cfg, "routed_scaling_factor", 1.0),
        expert_bias=True,
        router_groups=groups if groups > 1 else None,
        router_group_top_k=group_top_k if groups > 1 else None,
        aux_loss_coef=0.0001,
        sequence_aux_loss=True,
    )


def _nullable(cfg: dict[str, Any], key: str, default: float | None) -> float | None:
    """A number that null switches off: absent gives `default`, null gives None (Gemma's soft-caps)."""
    if key not in cfg:
        return default
    return None if cfg[key] is None else _opt(cfg, key, 0.0)


def _period(cfg: dict[str, Any], flags: list[bool], what: str) -> int | None:
    """The N of "layer i is full iff (i + 1) % N == 0" that a per-layer list of local (True) / full
    (False) flags follows; None when every layer is local. Other patterns are refused."""
    full = [i for i, local in enumerate(flags) if not local]
    if not full:
        return None
    n = full[0] + 1
    if flags != [(i + 1) % n != 0 for i in range(len(flags))]:
        raise SpecError(
            f"config.json: {what} is not one full layer after every {n - 1} local ones (model_type "
            f"{cfg.get('model_type')!r}); write a model spec file with sliding_window and full_attention_every"
        )
    return n


def _layer_types(cfg: dict[str, Any], layers: int, local: str, default_every: int) -> int | None:
    """full_attention_every from config.layer_types ("sliding_attention" / "chunked_attention" /
    "full_attention" per layer), else the class default pattern `default_every`."""
    types = cfg.get("layer_types")
    if types is None:
        return default_every
    if not isinstance(types, list) or len(types) != layers or set(types) - {local, "full_attention"}:
        raise SpecError(f"config.json: layer_types must list {layers} entries of {local!r} or 'full_attention'")
    return _period(cfg, [t == local for t in types], "layer_types")


def _gelu_tanh(cfg: dict[str, Any]) -> MLPKind:
    act = cfg.get("hidden_activation") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):  # GemmaMLP: act_fn(gate) * up
        raise SpecError(f"config.json: hidden_activation {act!r} is not supported (supported: gelu_pytorch_tanh)")
    return MLPKind.GEGLU


def _gemma_common(cfg: dict[str, Any], *, defaults: dict[str, Any]) -> dict[str, Any]:
    """Gemma2Config / Gemma3TextConfig: four RMSNorms per layer scaling by (1 + weight), gated
    GELU-tanh MLP without biases, embedding scaled by sqrt(hidden_size), tied output layer,
    q/k/v/o biases per attention_bias, scores scaled by query_pre_attn_scalar^-1/2 (default 256);
    _llama_like's fields with Gemma's own as overrides."""
    if cfg.get("use_bidirectional_attention"):
        raise SpecError("config.json: use_bidirectional_attention is an encoder setting; only causal decoders are planned")
    return _llama_like(
        cfg,
        num_kv_heads=_opt(cfg, "num_key_value_heads", 0) or 4,  # class default 4
        head_dim=_opt(cfg, "head_dim", 0) or 256,  # class default 256
        max_position_embeddings=_get(cfg, "max_position_embeddings", default=defaults["max_position_embeddings"]),
        tie_embeddings=_opt(cfg, "tie_word_embeddings", True),
        mlp=_gelu_tanh(cfg),
        mlp_bias=False,
        sliding_window=_opt(cfg, "sliding_window", 4096),
        attn_logit_softcap=_nullable(cfg, "attn_logit_softcapping", defaults["attn_logit_softcapping"]),
        final_logit_softcap=_nullable(cfg, "final_logit_softcapping", defaults["final_logit_softcapping"]),
        query_pre_attn_scalar=_opt(cfg, "query_pre_attn_scalar", 256),
        sandwich_norms=True,
        zero_centered_norm=True,
        scale_embedding=True,
    )


def _gemma2(cfg: dict[str, Any]) -> dict[str, Any]:
    # Gemma2Config (transformers v5.23.0): layer_types default sliding on even layers ((i + 1) % 2),
    # sliding_window 4096, attn_logit_softcapping 50, final_logit_softcapping 30, max positions 8192,
    # rope_theta 10000 (_llama_like's)
    out = _gemma_common(cfg, defaults=dict(max_position_embeddings=8192, attn_logit_softcapping=50.0, final_logit_softcapping=30.0))
    out["full_attention_every"] = _layer_types(cfg, out["num_layers"], "sliding_attention", 2)
    return out


def _gemma3_text(cfg: dict[str, Any]) -> dict[str, Any]:
    # Gemma3TextConfig: q_norm/k_norm Gemma3RMSNorm(head_dim); layer_types default from
    # sliding_window_pattern (default 6: five sliding, one full); no soft-capping by default; rotary
    # bases per layer type: rope_parameters {"full_attention": …, "sliding_attention": …} (5.x) or
    # rope_theta (global, default 1e6), rope_local_base_freq (default 1e4) and rope_scaling on the
    # full layers (4.x; convert_rope_params_to_dict)
    out = _gemma_common(cfg, defaults=dict(max_position_embeddings=131072, attn_logit_softcapping=None, final_logit_softcapping=None))
    every = _opt(cfg, "sliding_window_pattern", 6)
    out["full_attention_every"] = _layer_types(cfg, out["num_layers"], "sliding_attention", every)
    params = cfg.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise SpecError("config.json: rope_parameters must be an object")
    if "full_attention" in params or "sliding_attention" in params:
        full, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
        if not isinstance(full, dict) or not isinstance(local, dict):
            raise SpecError("config.json: rope_parameters.full_attention / sliding_attention must be objects")
        if local.get("rope_type", "default") != "default":
            raise SpecError("config.json: rope scaling on sliding layers is not supported (only on full layers)")
        rope = _rope({"rope_parameters": full}, theta=1e6)
        local_theta = _opt(local, "rope_theta", 1e4)
    else:
        rope = _rope(cfg, theta=1e6)
        local_theta = _opt(cfg, "rope_local_base_freq", 1e4)
    return {**out, "rope_scaling": None, **rope, "rope_local_theta": local_theta, "qk_norm": True}


def _gpt_oss(cfg: dict[str, Any]) -> dict[str, Any]:
    # GptOssConfig (v5.23.0): head_dim 64, num_key_value_heads 8, attention_bias true, sliding_window
    # 128 on even layers (layer_types default (i + 1) % 2), rms_norm_eps 1e-5, untied, rope_theta
    # 150000 (default_theta) with yarn scaling (factor 32, beta_fast 32, beta_slow 1, truncate false,
    # original 4096) when none is given; router_aux_loss_coef 0.001. Modules (modeling_gpt_oss.py):
    # GptOssAttention q/k/v/o with bias and `sinks` (one logit per head); GptOssTopKRouter weight
    # (E, h) and bias (E), softmax over the top-k logits (= renormalised top-k); GptOssExperts
    # gate_up_proj (E, h, 2f) + bias (E, 2f), down_proj (E, f, h) + bias (E, h). Its gate is
    # clamp(max=7)·sigmoid(1.702·gate) and up is clamped to ±7, out = glu·(up + 1) (swiglu_limit,
    # swiglu_alpha; GptOssExperts._apply_gate): the matrices of SwiGLU.
    cfg = {"rope_parameters": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                               "original_max_position_embeddings": 4096}} | cfg
    layers, bias = _get(cfg, "num_hidden_layers"), _opt(cfg, "attention_bias", True)
    moe = dict(
        num_experts=_get(cfg, "num_local_experts"),
        top_k=_opt(cfg, "num_experts_per_tok", 4),
        expert_ffn_hidden_size=_get(cfg, "intermediate_size"),
        router_bias=True,
        aux_loss_coef=_opt(cfg, "router_aux_loss_coef", 0.001),
    )
    return _llama_like(
        cfg, eps=1e-5, theta=150000.0,
        head_dim=_opt(cfg, "head_dim", 0) or 64,
        max_position_embeddings=_get(cfg, "max_position_embeddings", default=131072),
        qkv_bias=bias,
        out_bias=bias,
        mlp_bias=True,
        sliding_window=_opt(cfg, "sliding_window", 128),
        full_attention_every=_layer_types(cfg, layers, "sliding_attention", 2),
        attention_sinks=True,
        swiglu_limit=_opt(cfg, "swiglu_limit", 7.0),
        swiglu_alpha=_opt(cfg, "swiglu_alpha", 1.702),
        moe=moe,
    )


def _llama4_text(cfg: dict[str, Any]) -> dict[str, Any]:
    # Llama4TextConfig (v5.23.0): intermediate_size (experts and the shared expert) and
    # intermediate_size_mlp (dense layers); moe_layers default range(step - 1, L, step) for
    # interleave_moe_layer_step (default 1); no_rope_layers (1 = rotary) default from
    # no_rope_layer_interval 4; rotary layers attend in chunks of attention_chunk_size (default 8192);
    # use_qk_norm (default true) is Llama4TextL2Norm without weights on rotary layers;
    # attn_temperature_tuning default true; num_experts_per_tok 1, num_local_experts 16; head_dim
    # 128; num_key_value_heads 8; rms_norm_eps 1e-5; rope_theta 500000 (default_theta).
    # Llama4TextMoe: Llama4Router Linear(h, E, bias=False), sigmoid of the top-k logits (no
    # renormalisation), experts gate_up_proj (E, h, 2f) and down_proj (E, f, h), a shared
    # Llama4TextMLP of intermediate_size.
    layers = _get(cfg, "num_hidden_layers")
    step = _opt(cfg, "interleave_moe_layer_step", 1) or 1
    moe_ids = cfg.get("moe_layers")
    default_moe = list(range(step - 1, layers, step))
    if moe_ids is None or list(moe_ids) == default_moe:
        placement = dict(layer_freq=step)
    else:
        if not isinstance(moe_ids, list) or any(not isinstance(i, int) or not 0 <= i < layers for i in moe_ids):
            raise SpecError(f"config.json: moe_layers must list layer ids below num_hidden_layers ({layers})")
        placement = dict(dense_layers=tuple(i for i in range(layers) if i not in moe_ids))
    ffn = _get(cfg, "intermediate_size")
    moe = dict(
        num_experts=_opt(cfg, "num_local_experts", 16),
        top_k=_opt(cfg, "num_experts_per_tok", 1),
        expert_ffn_hidden_size=ffn,
        num_shared_experts=1,
        router_score=RouterScore.SIGMOID,
        renormalize_top_k=False,
        aux_loss_coef=_opt(cfg, "router_aux_loss_coef", 0.001),
        **placement,
    )
    interval = _opt(cfg, "no_rope_layer_interval", 4)
    rope_flags = cfg.get("no_rope_layers") or [(i + 1) % interval != 0 for i in range(layers)]
    if not isinstance(rope_flags, list) or len(rope_flags) != layers:
        raise SpecError(f"config.json: no_rope_layers must list {layers} entries of 0 or 1")
    types = cfg.get("layer_types")
    if types is not None and types != ["chunked_attention" if r else "full_attention" for r in rope_flags]:
        raise SpecError("config.json: layer_types must be chunked_attention on the rotary layers (no_rope_layers) and full_attention elsewhere")
    chunk = _opt(cfg, "attention_chunk_size", 8192)
    every = _period(cfg, [bool(r) for r in rope_flags], "no_rope_layers")
    return _llama_like(
        cfg, eps=1e-5, theta=500000.0,
        ffn_hidden_size=_get(cfg, "intermediate_size_mlp"),
        head_dim=_opt(cfg, "head_dim", 0) or 128,
        max_position_embeddings=_get(cfg, "max_position_embeddings", default=131072),
        attention_chunk_size=chunk,
        full_attention_every=every,
        nope_full_layers=every is not None,
        qk_l2_norm=_opt(cfg, "use_qk_norm", True),
        attn_temperature_tuning=bool(cfg.get("attn_temperature_tuning", True)),
        attn_temperature_floor_scale=_opt(cfg, "floor_scale", 8192),
        attn_temperature_scale=_opt(cfg, "attn_scale", 0.1),
        moe=moe,
    )


READERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "llama": _llama,
    "mistral": _mistral,
    "mixtral": _mixtral,
    "qwen2": _qwen2,
    "qwen2_moe": _qwen2_moe,
    "qwen3": _qwen3,
    "qwen3_moe": _qwen3_moe,
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "bloom": _bloom,
    "deepseek_v2": _deepseek_v2,
    "deepseek_v3": _deepseek_v3,
    "nemotron": _nemotron,
    "nemotron_h": _nemotron_h,
    "gemma2": _gemma2,
    "gemma3_text": _gemma3_text,
    "gpt_oss": _gpt_oss,
    "llama4_text": _llama4_text,
}


def is_hf_config(data: dict[str, Any]) -> bool:
    return "model_type" in data or "architectures" in data


def model_from_hf(data: dict[str, Any], *, name: str, source: str) -> ModelSpec:
    kind = data.get("model_type")
    if not isinstance(kind, str) or kind not in READERS:
        what = "has no model_type" if kind is None else f"model_type {kind!r} is not supported"
        raise SpecError(f"config.json: {what}; supported: {', '.join(sorted(READERS))} (or write a model spec file)")
    fields = READERS[kind](data)
    return ModelSpec.model_validate({"name": name, "source": source, **fields})
