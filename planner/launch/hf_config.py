"""ModelSpec -> Hugging Face `config.json`: the model a DeepSpeed launch builds with
`AutoModelForCausalLM.from_config`.

The architecture is the one of planner/hf.py's readers whose modules the spec describes; the keys
are transformers' (4.x spellings, which 5.x still reads: rope_theta and rope_scaling are converted
to rope_parameters by RotaryEmbeddingConfigMixin.convert_rope_params_to_dict, transformers v5.23.0
modeling_rope_utils.py). The emitted file is read back by planner/hf.py's reader of its type, and
must give the spec again, field for field: a spec no supported architecture represents is refused.
"""

from __future__ import annotations

from typing import Any

from cost_models.enums import MLPKind, NormKind, PositionKind, RouterScore
from cost_models.errors import SpecError
from cost_models.model_spec import ModelSpec

ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "gpt2": "GPT2LMHeadModel",
    "gpt_neox": "GPTNeoXForCausalLM",
    "bloom": "BloomForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "nemotron": "NemotronForCausalLM",
    "nemotron_h": "NemotronHForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
    "llama4_text": "Llama4ForCausalLM",
}


def model_type(m: ModelSpec) -> str:
    """The transformers architecture whose modules are the spec's (checked by the read-back)."""
    if m.hybrid_pattern is not None:
        return "nemotron_h"
    if m.sandwich_norms or m.attn_logit_softcap or m.final_logit_softcap or m.mlp is MLPKind.GEGLU:
        return "gemma3_text" if m.qk_norm else "gemma2"
    if m.attention_sinks and m.moe is not None:
        return "gpt_oss"
    if m.attention_chunk_size is not None or m.nope_full_layers:
        return "llama4_text"
    if m.mla is not None:
        return "deepseek_v3" if m.moe is not None and m.moe.router_score is RouterScore.SIGMOID else "deepseek_v2"
    if m.mlp is MLPKind.SQUARED_RELU:
        return "nemotron"
    if m.position_embedding is PositionKind.ALIBI:
        return "bloom"
    if m.position_embedding is PositionKind.LEARNED:
        return "gpt2"
    if m.mlp is MLPKind.GELU or m.norm is NormKind.LAYERNORM:
        return "gpt_neox"
    if m.moe is not None:
        if m.moe.num_shared_experts:
            return "qwen2_moe"
        return "qwen3_moe" if m.qk_norm else "mixtral"
    if m.qk_norm:
        return "qwen3"
    if m.qkv_bias and not m.out_bias:
        return "qwen2"
    return "mistral" if m.sliding_window is not None else "llama"


def _window(m: ModelSpec, kind: str) -> dict[str, Any]:
    """The sliding window in the keys of the Mistral and Qwen configs (planner/hf.py reads them
    back): every layer for Mistral, Mixtral and Qwen3-MoE; for Qwen2/Qwen3/Qwen2-MoE the switch
    use_sliding_window and the layers as layer_types."""
    if m.sliding_window is None:
        return {"sliding_window": None} if kind in ("mistral", "mixtral") else {}
    out: dict[str, Any] = {"sliding_window": m.sliding_window}
    if kind.startswith("qwen"):
        out["use_sliding_window"] = True
        if kind != "qwen3_moe":
            out["layer_types"] = _layer_types(m, "sliding_attention")
    return out


def _rope(m: ModelSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"rope_theta": m.rope_theta}
    rs = m.rope_scaling
    if rs is not None:
        # the scaling's own fields under transformers' key names (rope_type for kind)
        out["rope_scaling"] = {"rope_type": rs.kind, **rs.model_dump(exclude={"kind"}, exclude_none=True)}
    return out


def _layer_types(m: ModelSpec, local: str) -> list[str]:
    return [local if m.is_local_layer(i) else "full_attention" for i in range(m.num_layers)]


def _local_family(m: ModelSpec, kind: str) -> dict[str, Any]:
    """Gemma2Config / Gemma3TextConfig / GptOssConfig / Llama4TextConfig keys beyond _llama_like's."""
    if kind in ("gemma2", "gemma3_text"):
        out: dict[str, Any] = {
            "hidden_activation": "gelu_pytorch_tanh",
            "sliding_window": m.sliding_window,
            "layer_types": _layer_types(m, "sliding_attention"),
            "attn_logit_softcapping": m.attn_logit_softcap,
            "final_logit_softcapping": m.final_logit_softcap,
            "query_pre_attn_scalar": m.query_pre_attn_scalar,
            "head_dim": m.head_size,
        }
        if kind == "gemma3_text":
            out["rope_local_base_freq"] = m.rope_local_theta
        return out
    if kind == "gpt_oss":
        moe = m.moe
        assert moe is not None
        return {
            "sliding_window": m.sliding_window,
            "layer_types": _layer_types(m, "sliding_attention"),
            "num_local_experts": moe.num_experts,
            "num_experts_per_tok": moe.top_k,
            "router_aux_loss_coef": moe.aux_loss_coef,
            "output_router_logits": True,
            "head_dim": m.head_size,
            "swiglu_limit": m.swiglu_limit,
            "swiglu_alpha": m.swiglu_alpha,
        }
    moe = m.moe
    out = {
        "intermediate_size_mlp": m.ffn_hidden_size,
        "attention_chunk_size": m.attention_chunk_size,
        "no_rope_layers": [int(m.layer_kind(i).rope) for i in range(m.num_layers)],
        "use_qk_norm": m.qk_l2_norm,
        "attn_temperature_tuning": m.attn_temperature_tuning,
        "floor_scale": m.attn_temperature_floor_scale,
        "attn_scale": m.attn_temperature_scale,
        "head_dim": m.head_size,
    }
    if moe is not None:
        out |= {
            "intermediate_size": moe.expert_ffn_hidden_size,
            "num_local_experts": moe.num_experts,
            "num_experts_per_tok": moe.top_k,
            "interleave_moe_layer_step": moe.layer_freq,
            "moe_layers": list(m.moe_layer_ids),
            "router_aux_loss_coef": moe.aux_loss_coef,
            "output_router_logits": True,
        }
    return out


def _llama_like(m: ModelSpec) -> dict[str, Any]:
    out: dict[str, Any] = {
        "hidden_size": m.hidden_size,
        "intermediate_size": m.ffn_hidden_size,
        "num_hidden_layers": m.num_layers,
        "num_attention_heads": m.num_attention_heads,
        "num_key_value_heads": m.kv_heads,
        "vocab_size": m.vocab_size,
        "max_position_embeddings": m.max_position_embeddings,
        "tie_word_embeddings": m.tie_embeddings,
        "hidden_act": "silu",
        "rms_norm_eps": m.norm_eps,
        "attention_bias": m.qkv_bias,
        "attention_dropout": m.attention_dropout,
        **_rope(m),
    }
    if m.head_dim is not None:
        out["head_dim"] = m.head_dim
    return out


def _moe(m: ModelSpec, kind: str) -> dict[str, Any]:
    moe = m.moe
    assert moe is not None
    # output_router_logits: the HF MoE models add router_aux_loss_coef x the load-balancing loss to
    # the loss only when it is true (e.g. MixtralForCausalLM.forward in transformers v5.23.0).
    out: dict[str, Any] = {"num_experts_per_tok": moe.top_k, "router_aux_loss_coef": moe.aux_loss_coef, "output_router_logits": True}
    if kind == "mixtral":
        return out | {"num_local_experts": moe.num_experts}
    out |= {
        "num_experts": moe.num_experts,
        "moe_intermediate_size": moe.expert_ffn_hidden_size,
        "norm_topk_prob": moe.renormalize_top_k,
        "decoder_sparse_step": moe.layer_freq,
        "mlp_only_layers": list(moe.dense_layers),
    }
    if kind == "qwen2_moe":
        out["shared_expert_intermediate_size"] = moe.num_shared_experts * moe.shared_width
    return out


def _deepseek(m: ModelSpec, kind: str) -> dict[str, Any]:
    """DeepseekV3Config / DeepseekV2Config keys (planner/hf.py _deepseek reads them back). A dense
    spec is written with first_k_dense_replace = num_layers."""
    a, moe = m.mla, m.moe
    assert a is not None
    out: dict[str, Any] = {
        "q_lora_rank": a.q_lora_rank, "kv_lora_rank": a.kv_lora_rank, "qk_nope_head_dim": a.qk_nope_head_dim,
        "qk_rope_head_dim": a.qk_rope_head_dim, "v_head_dim": a.v_head_dim,
    }
    if kind == "deepseek_v3":
        out["num_nextn_predict_layers"] = m.mtp_layers
    if moe is None:
        return out | {"first_k_dense_replace": m.num_layers}
    grouped = moe.router_groups is not None
    out |= {
        "n_routed_experts": moe.num_experts, "num_experts_per_tok": moe.top_k, "moe_intermediate_size": moe.expert_ffn_hidden_size,
        "n_shared_experts": moe.num_shared_experts, "first_k_dense_replace": moe.first_k_dense,
        "n_group": moe.router_groups or 1, "topk_group": moe.router_group_top_k or 1,
        "routed_scaling_factor": moe.routed_scaling_factor, "norm_topk_prob": moe.renormalize_top_k, "aux_loss_alpha": moe.aux_loss_coef,
        "seq_aux": moe.sequence_aux_loss,
    }
    if kind == "deepseek_v2":
        out["topk_method"] = "group_limited_greedy" if grouped else "greedy"
    return out


def _nemotron(m: ModelSpec) -> dict[str, Any]:
    """NemotronConfig keys (planner/hf.py _nemotron reads them back)."""
    body = _llama_like(m)
    del body["rms_norm_eps"]
    return body | {"hidden_act": "relu2", "norm_eps": m.norm_eps, "partial_rotary_factor": m.rotary_fraction, "mlp_bias": m.mlp_bias}


def _gelu(m: ModelSpec, kind: str) -> dict[str, Any]:
    common = {"vocab_size": m.vocab_size, "tie_word_embeddings": m.tie_embeddings}
    if kind == "gpt2":
        return common | {
            "n_embd": m.hidden_size, "n_layer": m.num_layers, "n_head": m.num_attention_heads, "n_inner": m.ffn_hidden_size,
            "n_positions": m.max_position_embeddings, "layer_norm_epsilon": m.norm_eps,
            "resid_pdrop": m.hidden_dropout, "embd_pdrop": m.hidden_dropout, "attn_pdrop": m.attention_dropout,
        }
    if kind == "bloom":
        return common | {
            "hidden_size": m.hidden_size, "n_layer": m.num_layers, "n_head": m.num_attention_heads, "seq_length": m.max_position_embeddings,
            "layer_norm_epsilon": m.norm_eps, "hidden_dropout": m.hidden_dropout, "attention_dropout": m.attention_dropout,
        }
    return common | {
        "hidden_size": m.hidden_size, "num_hidden_layers": m.num_layers, "num_attention_heads": m.num_attention_heads,
        "intermediate_size": m.ffn_hidden_size, "max_position_embeddings": m.max_position_embeddings,
        "layer_norm_eps": m.norm_eps, "rotary_pct": m.rotary_fraction, "rotary_emb_base": m.rope_theta,
        "attention_bias": m.qkv_bias, "hidden_dropout": m.hidden_dropout, "attention_dropout": m.attention_dropout,
    }


def _nemotron_h(m: ModelSpec) -> dict[str, Any]:
    """NemotronHConfig keys (transformers v5.23.0), the pattern as hybrid_override_pattern."""
    mb = m.mamba
    out: dict[str, Any] = {
        "hybrid_override_pattern": m.hybrid_pattern, "hidden_size": m.hidden_size, "intermediate_size": m.ffn_hidden_size,
        "num_attention_heads": m.num_attention_heads, "num_key_value_heads": m.kv_heads, "head_dim": m.head_size,
        "vocab_size": m.vocab_size, "max_position_embeddings": m.max_position_embeddings,
        "tie_word_embeddings": m.tie_embeddings, "mlp_hidden_act": "relu2", "mlp_bias": m.mlp_bias,
        "layer_norm_epsilon": m.norm_eps, "attention_dropout": m.attention_dropout, "hidden_dropout": m.hidden_dropout,
    }
    if mb is not None:
        out |= {
            "mamba_num_heads": mb.num_heads, "mamba_head_dim": mb.head_dim, "ssm_state_size": mb.state_size,
            "n_groups": mb.num_groups, "conv_kernel": mb.conv_kernel, "chunk_size": mb.chunk_size,
            "use_conv_bias": mb.conv_bias, "use_bias": mb.proj_bias,
        }
    moe = m.moe
    if moe is not None:
        out |= {
            "n_routed_experts": moe.num_experts, "num_experts_per_tok": moe.top_k,
            "moe_intermediate_size": moe.expert_ffn_hidden_size,
            "moe_shared_expert_intermediate_size": moe.shared_width, "n_shared_experts": moe.num_shared_experts,
            "n_group": moe.router_groups or 1, "topk_group": moe.router_group_top_k or 1,
            "norm_topk_prob": moe.renormalize_top_k, "routed_scaling_factor": moe.routed_scaling_factor,
        }
    return out


def _same(a: ModelSpec, b: ModelSpec) -> list[str]:
    skip = {"name", "source", "num_kv_heads"}
    da, db = a.model_dump(exclude=skip), b.model_dump(exclude=skip)
    out = [k for k in da if da[k] != db[k]]
    return out + (["num_kv_heads"] if a.kv_heads != b.kv_heads else [])


def hf_config(m: ModelSpec) -> dict[str, Any]:
    """config.json for the spec; SpecError when the read-back differs (no architecture fits)."""
    from planner.hf import model_from_hf

    kind = model_type(m)
    if m.mtp_layers:
        raise SpecError(
            f"model {m.name!r}: transformers' DeepseekV3ForCausalLM builds no multi-token prediction module, so "
            f"DeepSpeed's training script would train without its {m.mtp_layers} MTP layer(s); use --framework megatron "
            "(Megatron-LM --mtp-num-layers), or a spec with mtp_layers = 0"
        )
    if kind == "nemotron_h":
        body = _nemotron_h(m)
    elif kind == "nemotron":
        body = _nemotron(m)
    elif kind in ("gpt2", "gpt_neox", "bloom"):
        body = _gelu(m, kind)
    else:
        body = _llama_like(m)
    if kind == "llama":
        body["mlp_bias"] = m.mlp_bias
    if kind in ("mistral", "mixtral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):
        body |= _window(m, kind)
    if kind in ("gemma2", "gemma3_text", "gpt_oss", "llama4_text"):
        body = {k: v for k, v in body.items() if k != "hidden_act"} | _local_family(m, kind)
    elif kind.startswith("deepseek"):
        body |= _deepseek(m, kind)
    elif m.moe is not None and kind != "nemotron_h":  # NemotronHConfig's MoE keys are _nemotron_h's
        body |= _moe(m, kind)
    config = {"architectures": [ARCHITECTURES[kind]], "model_type": kind, **body}
    try:
        back = model_from_hf(config, name=m.name, source=m.source)
    except (SpecError, ValueError) as e:
        raise SpecError(f"model {m.name!r}: no Hugging Face architecture represents it ({e})") from None
    differ = _same(m, back)
    if differ:
        raise SpecError(
            f"model {m.name!r}: the nearest Hugging Face architecture ({kind}) differs in {', '.join(differ)}; "
            f"DeepSpeed's training script builds the model from config.json (supported: {', '.join(ARCHITECTURES)})"
        )
    return config
