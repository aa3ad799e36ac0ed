"""FLOPs per trained token as each published source counts them, to turn a published TFLOP/s or MFU
into tokens/s/GPU (benchmarks/published.py). One function per convention, its source in the docstring;
published_runs.md ("Conventions each source uses") says which source uses which.
"""

from __future__ import annotations

from cost_models.enums import MLPKind
from cost_models.model_spec import ModelSpec
from cost_models.units import TFLOP


def narayanan_flop_per_token(*, num_layers: int, hidden_size: int, vocab_size: int, seq_len: int) -> float:
    """Narayanan et al. 2021 (arXiv:2104.04473) eq. (3), F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) per
    iteration, divided by the B·s tokens of the iteration. Counts the recompute forward (4 forward
    GEMM passes), GEMMs only."""
    l, h, s, v = num_layers, hidden_size, seq_len, vocab_size
    return 96 * l * h**2 * (1 + s / (6 * h) + v / (16 * l * h))


def korthikanti_model_flop_per_token(*, num_layers: int, hidden_size: int, vocab_size: int, seq_len: int) -> float:
    """Korthikanti et al. 2022 (arXiv:2205.05198) Appendix A model FLOPs, 72·B·L·s·h²·(1 + s/(6h) +
    v/(12·h·L)) per iteration, divided by B·s: no recompute counted (their MFU)."""
    l, h, s, v = num_layers, hidden_size, seq_len, vocab_size
    return 72 * l * h**2 * (1 + s / (6 * h) + v / (12 * h * l))


def megatron_core_flop_per_token(model: ModelSpec, *, seq_len: int, vocab_size: int, causal: bool) -> float:
    """Megatron's model FLOPs per token: 12·L·h²·[(1 + g/a + s/h·c)·(q/h)] for attention + 12·L·h·f·k·(3/2
    if SwiGLU) for the MLP (routed experts on MoE layers) + 6·h·V for the logits, with V the padded
    vocabulary. Megatron-LM training.py num_floating_point_operations counts the full s² attention
    (c = 1); Megatron-Bridge v0.2.0 src/megatron/bridge/training/utils/flop_utils.py transformer_flops,
    which the Bridge performance tables print as "Model TFLOP/s/GPU", counts half of it for the causal
    mask (c = 1/2)."""
    l, h, a, g, q = model.num_layers, model.hidden_size, model.num_attention_heads, model.kv_heads, model.q_width
    gated = 1.5 if model.mlp is MLPKind.SWIGLU else 1.0
    c = 0.5 if causal else 1.0
    attention = 12 * l * h * q * (1 + g / a + seq_len / h * c)
    mlp_width = model.num_dense_layers * model.ffn_hidden_size
    if model.moe:
        moe = model.moe
        mlp_width += model.num_moe_layers * (moe.expert_ffn_hidden_size * moe.top_k + moe.num_shared_experts * moe.shared_width)
    return attention + 12 * h * mlp_width * gated + 6 * h * vocab_size


def palm_flop_per_token(*, n_params: int, num_layers: int, q_width: int, seq_len: int) -> float:
    """PaLM (Chowdhery et al. 2022, arXiv:2204.02311) Appendix B: 6·N + 12·L·H·Q·T model FLOPs per token,
    H·Q the attention width and T the sequence length; Llama 3 (arXiv:2407.21783) reports MFU by it."""
    return 6 * n_params + 12 * num_layers * q_width * seq_len


def mpt_flop_per_token(*, n_params: int, num_layers: int, hidden_size: int, seq_len: int) -> float:
    """llm-foundry scripts/train/benchmarking/README.md "MFU": (3·flops_per_seq + 3·attn_flops_per_seq) /
    seq_len with flops_per_seq = 2·N·seq_len and attn_flops_per_seq = L·2·2·d·seq_len², i.e.
    6·N + 12·L·d·s per token (the PaLM count with the attention width d)."""
    return 6 * n_params + 12 * num_layers * hidden_size * seq_len


def tokens_from_flops(tflops_per_gpu: float, flop_per_token: float) -> float:
    return tflops_per_gpu * TFLOP / flop_per_token
