"""Activation memory: the itemised model against Korthikanti et al. 2022 Table 2, and against the
bytes torch actually saves for backward (saved_tensors_hooks, each storage counted once), on CPU.

Attention implementations compared: for the GPT-style block, explicit (eager) attention with
softmax and a 1-byte dropout mask, as Korthikanti et al. assume; for the Llama-style block, torch's
scaled_dot_product_attention, which on CPU runs `_scaled_dot_product_flash_attention_for_cpu`
(saves q, k, v, output and the fp32 log-sum-exp).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cost_models.activations import CONVENTIONS, layer_activations, layer_items  # noqa: E402
from cost_models.enums import Framework, MLPKind, Recompute  # noqa: E402
from helpers import GPT_TINY, LLAMA_TINY, make_job  # noqa: E402
from planner.torch_model import Kernels, saved_activation_bytes  # noqa: E402

def _without_stats(b) -> float:
    return sum(v for k, v in b.flat().items() if not k.endswith("/stats"))


# --- Korthikanti et al. 2022, Table 2: exact, for a GPT layer (eager attention, dropout, GELU) ---

S, B, H, A = 2048, 4, 2048, 16
KORTHIKANTI = dict(
    name="gpt-k", num_layers=8, hidden_size=H, ffn_hidden_size=4 * H, num_attention_heads=A,
    vocab_size=51200, max_position_embeddings=S, mlp="gelu", norm="layernorm",
    position_embedding="learned", qkv_bias=True, out_bias=True, mlp_bias=True,
    hidden_dropout=0.1, attention_dropout=0.1,
)


def _korthikanti_job(tp: int, sp: bool, recompute: str):
    from cost_models.model_spec import ModelSpec

    return make_job(
        ModelSpec(**KORTHIKANTI), gpus=tp, tp=tp, sp=sp, mbs=B, recompute=recompute,
        training=dict(seq_len=S, global_batch_size=B, attention="eager"),
    )


@pytest.mark.parametrize(
    "tp, sp, recompute, per_layer",
    [
        # Table 2 rows, bytes per layer; s·b·h(34 + 5as/h) etc.
        (1, False, "none", S * B * H * (34 + 5 * A * S / H)),
        (8, False, "none", S * B * H * (10 + 24 / 8 + 5 * A * S / (H * 8))),
        (8, True, "none", S * B * H * (34 / 8 + 5 * A * S / (H * 8))),
        (8, False, "selective", S * B * H * (10 + 24 / 8)),
        (8, True, "selective", S * B * H * 34 / 8),
        (1, False, "full", S * B * H * 2),
    ],
)
def test_korthikanti_table2_exact(tp, sp, recompute, per_layer):
    job = _korthikanti_job(tp, sp, recompute)
    got = _without_stats(layer_activations(job, 0, Recompute(recompute)))
    assert got == pytest.approx(per_layer, rel=1e-12)


# --- measured saved tensors on CPU ----------------------------------------------------------------


def _predicted(spec, framework, conv, *, b, s, recompute, attention):
    job = make_job(spec, gpus=1, mbs=b, training=dict(seq_len=s, global_batch_size=b, framework=framework, attention=attention))
    mode = Recompute.FULL if recompute else Recompute.NONE
    return layer_activations(job, 0, mode, conv).total


# Tolerance 5%: the statistics of the norms are the only items whose dtype the CPU kernels choose
# differently from the CUDA ones (4 bytes per token), a fraction of a percent at these sizes.
TOL = 0.05


LLAMA_KERNELS = {
    # torchtitan: eager SwiGLU, K/V repeated to every head, fused RMSNorm
    "torchtitan": Kernels(attention="flash", fused_norm=True, fused_swiglu=False, gqa_expand=True),
    # Megatron: fused SwiGLU keeping [gate|up], grouped-query attention without repeating K/V
    "megatron": Kernels(attention="flash", fused_norm=True, fused_swiglu=True, gqa_expand=False),
}


@pytest.mark.parametrize("framework", sorted(LLAMA_KERNELS))
@pytest.mark.parametrize("recompute", [False, True], ids=["no-recompute", "full-recompute"])
def test_llama_block_saved_bytes(framework, recompute):
    b, s = 2, 256
    measured = saved_activation_bytes(LLAMA_TINY, LLAMA_KERNELS[framework], b=b, s=s, recompute=recompute)
    predicted = _predicted(LLAMA_TINY, framework, CONVENTIONS[Framework(framework)], b=b, s=s, recompute=recompute, attention="flash")
    assert predicted == pytest.approx(measured, rel=TOL)


def test_sandwich_norm_geglu_block_saved_bytes():
    # Gemma's layer shape on torchtitan's kernels: four fused RMSNorms and a gated GELU-tanh MLP
    # (the post norms' saved inputs and statistics, and the gate/up/product of the GeGLU)
    spec = LLAMA_TINY.model_copy(update={"mlp": MLPKind.GEGLU, "sandwich_norms": True})
    b, s = 2, 256
    measured = saved_activation_bytes(spec, LLAMA_KERNELS["torchtitan"], b=b, s=s, recompute=False)
    predicted = _predicted(spec, "torchtitan", CONVENTIONS[Framework.TORCHTITAN], b=b, s=s, recompute=False, attention="flash")
    assert predicted == pytest.approx(measured, rel=TOL)


@pytest.mark.parametrize("recompute", [False, True], ids=["no-recompute", "full-recompute"])
def test_gpt_block_saved_bytes(recompute):
    # Korthikanti's setting: eager attention with dropout, GELU, LayerNorm, 1-byte dropout masks.
    b, s = 2, 256
    kernels = Kernels(attention="eager", fused_norm=True, byte_dropout_mask=True)
    measured = saved_activation_bytes(GPT_TINY, kernels, b=b, s=s, recompute=recompute)
    predicted = _predicted(GPT_TINY, "megatron", CONVENTIONS[Framework.MEGATRON], b=b, s=s, recompute=recompute, attention="eager")
    assert predicted == pytest.approx(measured, rel=TOL)


# Multi-head latent attention (DeepSeek-V2/V3 shapes, scaled down; d_qk = nope + rope equals d_v so
# that torch's CPU flash kernel runs: with unequal widths SDPA falls back to its math path) and a
# squared-ReLU LayerNorm1P model (Nemotron-4), under Megatron's kernels.
MLA_TINY = dict(
    name="mla-tiny", num_layers=2, hidden_size=256, ffn_hidden_size=688, num_attention_heads=8, vocab_size=1000,
    max_position_embeddings=4096, mla=dict(q_lora_rank=96, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16,
                                            v_head_dim=48),
)
NEMOTRON_TINY = dict(
    name="nemotron-tiny", num_layers=2, hidden_size=256, ffn_hidden_size=1024, num_attention_heads=8, num_kv_heads=2,
    vocab_size=1000, mlp="squared_relu", norm="layernorm", zero_centered_norm=True, rotary_fraction=0.5,
)


@pytest.mark.parametrize("fields", [MLA_TINY, {**MLA_TINY, "mla": {**MLA_TINY["mla"], "q_lora_rank": None}}, NEMOTRON_TINY],
                         ids=["mla", "mla-no-q-lora", "squared-relu"])
def test_new_family_block_saved_bytes(fields):
    """Without recomputation (under full recomputation a layer keeps its input, whatever its family)."""
    from cost_models.model_spec import ModelSpec

    spec = ModelSpec(**fields)
    b, s = 2, 256
    measured = saved_activation_bytes(spec, LLAMA_KERNELS["megatron"], b=b, s=s, recompute=False)
    predicted = _predicted(spec, "megatron", CONVENTIONS[Framework.MEGATRON], b=b, s=s, recompute=False, attention="flash")
    assert predicted == pytest.approx(measured, rel=TOL)


def test_items_are_what_recompute_drops():
    job = make_job("llama-3.1-8b", training=dict(seq_len=8192, global_batch_size=8))
    none = layer_activations(job, 0, Recompute.NONE).total
    selective = layer_activations(job, 0, Recompute.SELECTIVE).total
    full = layer_activations(job, 0, Recompute.FULL).total
    assert full < selective < none
    assert none == layer_items(job, 0).total
    # full recompute keeps only the layer input: t·h·2 bytes
    assert full == 8192 * 4096 * 2


def test_a_cast_keeps_nothing_of_its_16bit_input():
    # TrainingSpec.loss_shift_out_of_place: nanotron's output layer and its fp32 cast run in blocks of
    # their own, the forward returning only the fp32 logits (huggingface/nanotron@c2528430
    # models/llama.py:874-880, 905-911). The cast's backward needs no saved tensor and the matmul saves
    # its inputs, not its output, so once the block returns nothing holds the 16-bit logits: the loss
    # then runs beside the fp32 logits (4 bytes per logit) and not the 16-bit ones as well.
    import weakref

    hidden = torch.randn(16, 32, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(64, 32, dtype=torch.bfloat16, requires_grad=True)
    seen = []

    def head():
        logits = hidden @ weight.t()
        seen.append(weakref.ref(logits))
        return logits.float()

    fp32 = head()
    assert fp32.dtype == torch.float32 and seen[0]() is None
    fp32.sum().backward()  # the graph is intact without them
    assert weight.grad is not None


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_scripted_bias_dropout_add_keeps_a_mask_at_zero_dropout():
    # TrainingSpec.bda_mask_kept: Megatron's and Transformer Engine's bias_dropout_add_fused_train is a
    # torch.jit.script function run with the profiling executor and autodiff subgraph inlining off
    # (Megatron-LM@0609f27f megatron/initialize.py:262-283; TransformerEngine@v0.11 jit.py:23-36). Its
    # differentiable graph keeps a bool mask the input's size for backward even at p = 0, where eager
    # dropout returns its input and keeps nothing.
    def bda(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor, prob: float) -> torch.Tensor:
        return residual + torch.nn.functional.dropout(x + bias, p=prob, training=True)

    def saved(fn) -> list[tuple[tuple[int, ...], torch.dtype]]:
        out: list[tuple[tuple[int, ...], torch.dtype]] = []

        def pack(t):
            out.append((tuple(t.shape), t.dtype))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn(x, bias, residual, 0.0)
        return out

    x, residual = (torch.randn(16, 2, 32, requires_grad=True) for _ in range(2))
    bias = torch.randn(32, requires_grad=True)
    old_executor = torch._C._jit_set_profiling_executor(True)
    old_mode = torch._C._jit_set_profiling_mode(True)
    torch._C._debug_set_autodiff_subgraph_inlining(False)
    try:
        scripted = torch.jit.script(bda)
        for _ in range(3):  # profile, then specialise into a differentiable graph
            scripted(x, bias, residual, 0.0).sum().backward()
        assert saved(scripted) == [((16, 2, 32), torch.bool)]
    finally:
        torch._C._debug_set_autodiff_subgraph_inlining(True)
        torch._C._jit_set_profiling_mode(old_mode)
        torch._C._jit_set_profiling_executor(old_executor)
    assert saved(bda) == []


def test_torchtitan_selective_keeps_the_matmuls_its_policy_keeps():
    """torchtitan's per-op policy counts aten.mm in forward order and keeps the odd ones; a linear
    with a bias is an addmm, kept and not counted. llama-tiny (h 256, 8 heads of 32, 2 kv heads,
    ffn 688), 128 tokens, bf16: wq, wv, w1, w2 kept; with q/k/v biases wq, wk, wv, then wo (1st
    mm), w3 (3rd). An MoE layer keeps no routed expert's output: its top-k (fp32 values and int64
    indices) and, under ep, the two all-to-alls' outputs."""
    from cost_models.model_spec import MoESpec

    t, h, f, q, kv = 128, 256, 688, 256, 64
    def kept(spec, gpus: int = 1, **layout) -> dict[str, int]:
        tt = dict(framework="torchtitan", seq_len=t, global_batch_size=gpus)
        job = make_job(spec, gpus=gpus, recompute="selective", training=tt, **layout)
        return {n: p for n, p in layer_activations(job, 0, Recompute.SELECTIVE) if n.startswith(("w", "router", "all_to"))}

    assert kept(LLAMA_TINY) == {"wq_output": t * q * 2, "wv_output": t * kv * 2, "w1_output": t * f * 2, "w2_output": t * h * 2}
    biased = LLAMA_TINY.model_copy(update={"qkv_bias": True})
    assert kept(biased) == {"wq_output": t * q * 2, "wk_output": t * kv * 2, "wv_output": t * kv * 2,
                            "wo_output": t * h * 2, "w3_output": t * f * 2}
    moe = LLAMA_TINY.model_copy(update={"moe": MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=128)})
    topk = t * 2 * (4 + 8)
    assert kept(moe) == {"wq_output": t * q * 2, "wv_output": t * kv * 2, "router_topk": topk}
    assert kept(moe, gpus=2, ep=2) == {"wq_output": t * q * 2, "wv_output": t * kv * 2, "router_topk": topk,
                                       "all_to_all_outputs": 2 * t * 2 * h * 2}


def test_torchtitan_selective_before_c4e229115_keeps_no_routing_output():
    """Before torchtitan@c4e229115 the per-op save list held no topk and no all_to_all_single
    (TrainingSpec.sac_recomputes_all_to_all): the same MoE layer under ep 2 keeps wq's and wv's
    outputs only, the top-k (128 x 2 x 12 bytes) and the two all-to-alls' outputs (2 x 256 routed
    copies x 256 x 2 bytes, 256 KiB) recomputed in backward."""
    from cost_models.model_spec import MoESpec

    t, q, kv = 128, 256, 64
    moe = LLAMA_TINY.model_copy(update={"moe": MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=128)})

    def kept(**switch) -> dict[str, int]:
        tt = dict(framework="torchtitan", seq_len=t, global_batch_size=2, **switch)
        job = make_job(moe, gpus=2, ep=2, recompute="selective", training=tt)
        return {n: p for n, p in layer_activations(job, 0, Recompute.SELECTIVE)}

    new, old = kept(), kept(sac_recomputes_all_to_all=True)
    assert new["all_to_all_outputs"] == 2 * 256 * 256 * 2 and new["router_topk"] == t * 2 * 12
    assert {n: new[n] - old[n] for n in old} == {n: 0 for n in old}
    assert set(new) - set(old) == {"router_topk", "all_to_all_outputs"}
    assert old["wq_output"] == t * q * 2 and old["wv_output"] == t * kv * 2


def test_torchtitan_moe_keeps_its_scored_token_copies_in_fp32():
    """torchtitan's MoE multiplies each routed token copy by its score in fp32 and keeps that fp32
    copy (Convention.moe_combine_fp32): 128 tokens, top 2, h 256 keep 128 x 2 x 256 x 4 = 262,144
    bytes where Megatron's 16-bit combine keeps half."""
    from cost_models.model_spec import MoESpec

    moe = LLAMA_TINY.model_copy(update={"moe": MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=128)})

    def combine(framework: str) -> int:
        job = make_job(moe, gpus=1, training=dict(framework=framework, seq_len=128, global_batch_size=1))
        return layer_items(job, 0).value("mlp/combine_input")

    assert combine("torchtitan") == 128 * 2 * 256 * 4
    assert combine("megatron") == 128 * 2 * 256 * 2


def test_torchtitan_moe_combine_holds_three_routed_copies():
    """torchtitan's MoE.forward holds routed_input, routed_output and routed_output_unsorted (16-bit,
    t·k rows each) beside the layer's saved tensors at its end, with the bmm's fp32 [t, h] output and
    its cast and the shared experts' output; re-run in backward under checkpointing, also the incoming
    gradient and its fp32 cast (activations.moe_combine_bytes). By hand, 128 tokens, top 2, h 256:
    3 x 128·2·256·2 = 393,216 routed bytes; 128·256·(4 + 2 + 2) = 262,144 in the forward (655,360)
    and 128·256·(4 + 2 + 2 + 2 + 4) = 458,752 re-run (851,968); without shared experts 128·256·12 =
    393,216 of the second. Under op-level selective checkpointing that keeps the all-to-alls' outputs
    (ep 2), routed_output is the kept combine output: two copies, 262,144 + 458,752. A dense layer or
    Megatron: nothing. The layer's backward takes the larger of this and its gradient workspace,
    2·128·256·2 + 3·256·128·2 = 327,680 here."""
    from cost_models.activations import layer_backward_workspace, moe_combine_bytes
    from cost_models.memory import layer_costs
    from cost_models.model_spec import MoESpec

    routed = MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=128)
    shared = MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=128, num_shared_experts=1,
                     shared_expert_ffn_hidden_size=128, first_k_dense=1)
    moe = LLAMA_TINY.model_copy(update={"moe": shared})

    def job(framework="torchtitan", model=moe, recompute="full", ep=1):
        return make_job(model, gpus=ep, ep=ep, recompute=recompute,
                        training=dict(framework=framework, seq_len=128, global_batch_size=ep))

    full = job()
    assert moe_combine_bytes(full, 1, Recompute.FULL) == 851_968
    assert moe_combine_bytes(full, 1, Recompute.NONE) == 655_360
    assert moe_combine_bytes(job(model=LLAMA_TINY.model_copy(update={"moe": routed})), 0, Recompute.FULL) == 393_216 + 393_216
    assert moe_combine_bytes(job(recompute="selective", ep=2), 1, Recompute.SELECTIVE) == 262_144 + 458_752
    assert moe_combine_bytes(full, 0, Recompute.FULL) == 0  # the dense first layer
    assert moe_combine_bytes(job(framework="megatron"), 1, Recompute.FULL) == 0
    assert layer_backward_workspace(full, 1) == 327_680
    costs = layer_costs(full)
    kind = moe.layer_kind(1)
    assert costs[kind, Recompute.FULL].backward_bytes == layer_items(full, 1).total - costs[kind, Recompute.FULL].kept_bytes + 851_968
    assert costs[kind, Recompute.NONE].backward_bytes == 655_360
