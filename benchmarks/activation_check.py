"""Activation bytes of one decoder layer: the model's itemised prediction against what torch saves
for backward on this machine (planner.torch_model.saved_activation_bytes), for the kernels each
framework uses. Needs torch.

Run: python benchmarks/activation_check.py [--write docs/accuracy.md]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from cost_models.activations import layer_activations  # noqa: E402
from cost_models.enums import Recompute  # noqa: E402
from cost_models.hardware import Cluster  # noqa: E402
from cost_models.layout import Layout  # noqa: E402
from cost_models.model_spec import ModelSpec  # noqa: E402
from cost_models.rules import resolve  # noqa: E402
from cost_models.training import TrainingSpec  # noqa: E402
from memory_accuracy import table_command  # noqa: E402
from planner import presets  # noqa: E402
from planner.torch_model import Kernels, saved_activation_bytes  # noqa: E402

LLAMA = ModelSpec(name="llama-style", num_layers=1, hidden_size=256, ffn_hidden_size=688, num_attention_heads=8, num_kv_heads=2, vocab_size=1000)
GPT = ModelSpec(
    name="gpt-style", num_layers=1, hidden_size=256, ffn_hidden_size=1024, num_attention_heads=8, vocab_size=1000,
    max_position_embeddings=1024, mlp="gelu", norm="layernorm", position_embedding="learned",
    qkv_bias=True, out_bias=True, mlp_bias=True, hidden_dropout=0.1, attention_dropout=0.1,
)
CASES = [
    # name, spec, kernels as the framework runs them, framework, attention
    ("Llama block, torchtitan kernels (SDPA flash, K/V repeated, eager SwiGLU)", LLAMA,
     Kernels(attention="flash", fused_swiglu=False, gqa_expand=True), "torchtitan", "flash"),
    ("Llama block, Megatron kernels (SDPA flash with GQA, fused SwiGLU)", LLAMA,
     Kernels(attention="flash", fused_swiglu=True, gqa_expand=False), "megatron", "flash"),
    ("GPT block, Korthikanti setting (eager attention, dropout, GELU)", GPT,
     Kernels(attention="eager", byte_dropout_mask=True), "megatron", "eager"),
]
B, S = 2, 256


def predicted(spec: ModelSpec, framework: str, attention: str, recompute: bool) -> int:
    cluster = Cluster(spec=presets.clusters()["dgx-h100"], num_gpus=1)
    training = TrainingSpec(seq_len=S, global_batch_size=B, framework=framework, attention=attention)
    job = resolve(spec, cluster, training, Layout(mbs=B))
    return int(layer_activations(job, 0, Recompute.FULL if recompute else Recompute.NONE).total)


def table() -> str:
    lines = ["| layer | recompute | torch saved (bytes) | predicted (bytes) | error |", "|---|---|---:|---:|---:|"]
    for name, spec, kernels, framework, attention in CASES:
        for recompute in (False, True):
            m = saved_activation_bytes(spec, kernels, b=B, s=S, recompute=recompute)
            p = predicted(spec, framework, attention, recompute)
            lines.append(f"| {name} | {'full' if recompute else 'none'} | {m:,} | {p:,} | {(p - m) / m:+.2%} |")
    return "\n".join(lines)


SECTION = "## Activation bytes vs torch's saved tensors"


INTRO = (
    f"Produced by `python benchmarks/activation_check.py --write docs/accuracy.md` (bf16, batch {B},\n"
    f"sequence {S}, CPU). Measured with `torch.autograd.graph.saved_tensors_hooks`, each storage once.\n"
    "On CPU, SDPA runs `_scaled_dot_product_flash_attention_for_cpu`; the reference layer's fused norm,\n"
    "dropout and SwiGLU keep what the frameworks' CUDA kernels keep (planner/torch_model.py).\n\n"
)


def main() -> int:
    return table_command(__doc__.splitlines()[0], table, SECTION, INTRO)


if __name__ == "__main__":
    sys.exit(main())
