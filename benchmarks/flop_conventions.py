"""FLOPs per trained token as each published source counts them, to turn a published TFLOP/s or MFU
into tokens/s/GPU (benchmarks/published.py). One function per convention, its source in the docstring;
published_runs.md ("Conventions each source uses") says which source uses which.
"""

from __future__ import annotations

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


def palm_flop_per_token(*, n_params: int, num_layers: int, q_width: int, seq_len: int) -> float:
    """PaLM (Chowdhery et al. 2022, arXiv:2204.02311) Appendix B: 6·N + 12·L·H·Q·T model FLOPs per token,
    H·Q the attention width and T the sequence length; Llama 3 (arXiv:2407.21783) reports MFU by it."""
    return 6 * n_params + 12 * num_layers * q_width * seq_len


def mpt_flop_per_token(*, n_params: int, num_layers: int, hidden_size: int, seq_len: int) -> float:
    """llm-foundry scripts/train/benchmarking/README.md "MFU": (3·flops_per_seq + 3·attn_flops_per_seq) /
    seq_len with flops_per_seq = 2·N·seq_len and attn_flops_per_seq = L·2·2·d·seq_len², i.e.
    6·N + 12·L·d·s per token (the PaLM count with the attention width d)."""
    return 6 * n_params + 12 * num_layers * hidden_size * seq_len


def vocabpar_flop_per_token(*, num_layers: int, hidden_size: int, ffn_hidden_size: int, vocab_size: int, seq_len: int) -> float:
    """Yeung et al. 2024 (Vocabulary Parallelism, arXiv:2411.05288) artifact show_result_full_exp.py: per
    iteration 3·(2·B·s·h·V + L·(8·B·s·h² + 4·B·s²·h + 4·B·s·h·f)), divided by the B·s tokens."""
    l, h, f, v, s = num_layers, hidden_size, ffn_hidden_size, vocab_size, seq_len
    return 3 * (2 * h * v + l * (8 * h * h + 4 * s * h + 4 * h * f))


def nanotron_flop_per_token(model: ModelSpec, *, seq_len: int) -> float:
    """nanotron's llama get_flops (huggingface/nanotron, models/llama.py): forward GEMMs per token of the
    q, k, v and output projections, the full (non-causal) score and value matmuls 4·s·q, the gated MLP
    6·h·f and the LM head 2·h·V, times 3 for forward and backward."""
    h, q, kv, f = model.hidden_size, model.q_width, model.kv_width, model.ffn_hidden_size
    layer = 2 * h * (q + 2 * kv) + 4 * seq_len * q + 2 * q * h + 6 * h * f
    return 3 * (model.num_layers * layer + 2 * h * model.vocab_size)


def nanotron_figure_flop_per_token(model: ModelSpec, *, seq_len: int) -> float:
    """The FLOPs per token behind most cells' MFU in the Ultra-Scale Playbook's sweep figure: nanotron's
    get_flops plus 6·h·V, the input embedding counted as a matmul like the LM head (tied or not).
    Not in nanotron's code; read off the figure itself: its MFU times 989 TFLOP/s over the tok/s/gpu
    the playbook's interactive figure prints for the same cell gives this count (1.34B: 11.27 GFLOP,
    get_flops 9.66; vinjn/nanotron-ultrascale-playbook@e3bcfc5c assets/data/benchmarks/
    benchmarks_interactive.html). A few cells (1.34B and 3.57B without pipeline parallelism) used
    get_flops alone (tests/test_published.py checks each cell against one of the two)."""
    return nanotron_flop_per_token(model, seq_len=seq_len) + 6 * model.hidden_size * model.vocab_size


def tokens_from_flops(tflops_per_gpu: float, flop_per_token: float) -> float:
    return tflops_per_gpu * TFLOP / flop_per_token
