"""Hugging Face `config.json` -> ModelSpec, offline, for the architectures whose module structure we
mirror exactly (parameter counts are checked against transformers' own modules in tests).

Each reader names the config keys and defaults of the transformers class it follows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cost_models.enums import MLPKind, NormKind, PositionKind
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


def _llama_like(cfg: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """LlamaConfig / MistralConfig / Qwen2Config: RMSNorm, SwiGLU, rotary."""
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
    )
    out.update(extra)
    return out


def _llama(cfg: dict[str, Any]) -> dict[str, Any]:
    return _llama_like(cfg)


def _qwen2(cfg: dict[str, Any]) -> dict[str, Any]:
    # Qwen2Attention: q/k/v with bias, o_proj without (transformers models/qwen2/modeling_qwen2.py)
    return _llama_like(cfg, qkv_bias=True, out_bias=False, mlp_bias=False)


def _mixtral(cfg: dict[str, Any]) -> dict[str, Any]:
    # MixtralSparseMoeBlock: gate Linear(h, E, bias=False), experts w1/w2/w3 of intermediate_size
    ffn = _get(cfg, "intermediate_size")
    moe = dict(num_experts=_get(cfg, "num_local_experts"), top_k=_get(cfg, "num_experts_per_tok"), expert_ffn_hidden_size=ffn)
    return _llama_like(cfg, moe=moe)


def _qwen_moe_layers(cfg: dict[str, Any]) -> dict[str, Any]:
    return dict(
        layer_freq=_opt(cfg, "decoder_sparse_step", 1) or 1,
        dense_layers=cfg.get("mlp_only_layers") or (),
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
    return _llama_like(cfg, qkv_bias=True, out_bias=False, moe=moe)


def _qwen3_moe(cfg: dict[str, Any]) -> dict[str, Any]:
    # Qwen3MoeAttention: q_norm/k_norm RMSNorm(head_dim); bias per attention_bias
    moe = dict(
        num_experts=_get(cfg, "num_experts"),
        top_k=_get(cfg, "num_experts_per_tok"),
        expert_ffn_hidden_size=_get(cfg, "moe_intermediate_size"),
        **_qwen_moe_layers(cfg),
    )
    return _llama_like(cfg, qk_norm=True, moe=moe)


def _qwen3(cfg: dict[str, Any]) -> dict[str, Any]:
    return _llama_like(cfg, qk_norm=True)


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
    return _gelu_layernorm(
        cfg,
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


READERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "llama": _llama,
    "mistral": _llama,
    "mixtral": _mixtral,
    "qwen2": _qwen2,
    "qwen2_moe": _qwen2_moe,
    "qwen3": _qwen3,
    "qwen3_moe": _qwen3_moe,
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "bloom": _bloom,
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
