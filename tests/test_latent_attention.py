"""Multi-head latent attention, multi-token prediction and squared ReLU in the cost model: GEMM shapes
against the parameter count (checked against transformers in test_params.py), per-rank placement,
and where the MTP modules go. Hand-worked arithmetic in the comments."""

from __future__ import annotations

import pytest

from cost_models.flops import attention_gemms, core_attention, layer_gemms, model_flops_per_token, mtp_gemms
from cost_models.model_spec import LayerKind
from cost_models.params import mla_params, model_params, mtp_params
from cost_models.states import local_layer_params, rank_params
from cost_models.step_time import time_estimate
from planner import presets
from tests.helpers import make_job

V3 = presets.models()["deepseek-v3"]
TRAINING = {"seq_len": 4096, "global_batch_size": 64}


def test_mla_gemms_run_every_projection_once_per_token():
    """Without tp each projection is one GEMM over the t tokens, so the forward FLOPs of the
    projections are 2·t·(their weight elements): the MLA parameters less the two latent norms."""
    job = make_job(V3, gpus=64, ep=64, training=TRAINING)
    t = 4096
    a = V3.mla
    weights = mla_params(V3).total - a.q_lora_rank - a.kv_lora_rank
    assert sum(g.flop for g in attention_gemms(job)) == 2 * t * weights


def test_mla_under_tp_splits_heads_and_keeps_the_down_projections_whole():
    """tp 8 with sequence parallel: the replicated down projections read t/8 tokens each rank
    (h x (q_lora + kv_lora + rope) = 7168 x 2112), the up and output projections 1/8 of the heads on
    all t tokens."""
    job = make_job(V3, gpus=64, tp=8, ep=8, training=TRAINING)
    by = {g.name: g for g in attention_gemms(job)}
    t, h, n = 4096, 7168, 128 // 8
    assert (by["q_down"].m, by["q_down"].n, by["q_down"].k) == (t // 8, 1536, h)
    assert (by["kv_down"].m, by["kv_down"].n, by["kv_down"].k) == (t // 8, 512 + 64, h)
    assert (by["qkv"].m, by["qkv"].n, by["qkv"].k) == (t, n * 192, 1536)
    assert (by["kv_up"].m, by["kv_up"].n, by["kv_up"].k) == (t, n * (128 + 128), 512)
    assert (by["out_proj"].m, by["out_proj"].n, by["out_proj"].k) == (t, h, n * 128)
    # the rank's attention parameters: replicated down projections and norms, split up/out projections
    full, per_rank = mla_params(V3), local_layer_params(job, 0).dense
    replicated = full.value("q/q_a") + full.value("q/q_a_norm") + full.value("kv_a") + full.value("kv_a_norm")
    split = full.value("q/q_b") + full.value("kv_b") + full.value("out_weight")
    norms, mlp = 2 * h, 3 * h * 18432 // 8
    assert per_rank == replicated + split // 8 + norms + mlp


def test_core_attention_counts_query_key_and_value_widths_apart():
    """QKᵀ over d_qk = 192 and PV over d_v = 128: 2·q·k·192 + 2·q·k·128 = 4·q·k·160 per head."""
    job = make_job(V3, gpus=64, ep=64, training=TRAINING)
    a = core_attention(job)
    assert a.head_dim == 160
    assert a.flop == pytest.approx(2 * 128 * 4096 * 4096 * (192 + 128) * a.causal_fraction)


def test_mtp_modules_run_on_the_last_stage():
    """pp 2 (layers 30/31): the last rank holds the MTP layer (an MoE layer, like layer 60), its
    three norms and the h x 2h projection, and runs the output layer twice per micro-batch."""
    job = make_job(V3, gpus=128, pp=2, ep=64, zero=1, recompute="full", pp_first_stage_layers=30, training=TRAINING)
    h = 7168
    last = rank_params(job, 1)
    without = job.model.model_copy(update={"mtp_layers": 0})
    base = rank_params(make_job(without, gpus=128, pp=2, ep=64, zero=1, recompute="full", pp_first_stage_layers=30, training=TRAINING), 1)
    moe_layer = local_layer_params(job, 60)
    assert last.value("layers") - base.value("layers") == moe_layer.dense + 3 * h + 2 * h * h
    assert last.value("experts") - base.value("experts") == moe_layer.expert
    assert rank_params(job, 0).total == rank_params(make_job(without, gpus=128, pp=2, ep=64, zero=1, recompute="full",
                                                            pp_first_stage_layers=30, training=TRAINING), 0).total
    (eh,) = mtp_gemms(job)
    assert (eh.m, eh.n, eh.k) == (4096, h, 2 * h)
    est, est0 = time_estimate(job), time_estimate(make_job(without, gpus=128, pp=2, ep=64, zero=1, recompute="full",
                                                            pp_first_stage_layers=30, training=TRAINING))
    assert est.stages[0].microbatch_s == est0.stages[0].microbatch_s
    assert est.stages[1].microbatch_s > est0.stages[1].microbatch_s


def test_the_mtp_merge_runs_at_the_layers_precision():
    """Megatron runs eh_proj inside the MTP layer's fp8 context (multi_token_prediction.py
    L1387-1397): under fp8 the merge is an fp8 GEMM with Transformer Engine's quantisation, the same
    precision the layers' linear GEMMs get, and cheaper than the bf16 merge on an H800."""
    from cost_models.calibration import DEFAULT
    from cost_models.step_time import mtp_merge_seconds

    def merge(precision: str) -> tuple[float, float]:
        job = make_job(V3, gpus=128, cluster="h800-deepseek", pp=2, ep=64, zero=1, pp_first_stage_layers=30,
                       training={**TRAINING, "precision": precision})
        return mtp_merge_seconds(job, DEFAULT)

    fp8, bf16 = merge("fp8"), merge("bf16")
    assert fp8[0] < bf16[0] and fp8[1] < bf16[1]


def test_kernel_split_of_the_compute_counts_the_mtp_modules():
    """validate's per-class split (compute_by_kernel) recounts the critical stage apart from
    stage_time: with pp 1 that stage runs the MTP layer, its merge projection and a second output
    layer and loss, and both must reach the same compute (to rounding)."""
    from cost_models.step_time import compute_by_kernel

    est = time_estimate(make_job(V3, gpus=64, ep=64, recompute="full", training=TRAINING))
    assert compute_by_kernel(est).total == pytest.approx(float(est.breakdown.value("compute")), rel=1e-12)


def test_model_flops_count_the_mtp_module():
    """6·(its active parameters + one more output layer) + 12·H·Q·T for its layer, per token."""
    h, v, s = 7168, 129280, 4096
    without = V3.model_copy(update={"mtp_layers": 0})
    extra = model_flops_per_token(V3, s) - model_flops_per_token(without, s)
    assert extra == 6 * (mtp_params(V3, active=True).total + v * h) + 12 * 128 * 160 * s


def test_torchtitan_selective_keeps_every_other_mla_matmul_output():
    """torchtitan's per-op policy over wq_a, wq_b, wkv_a, wkv_b, wo, w1, w3, w2 keeps the outputs of
    the 1st, 3rd, 5th and 7th: wq_a, wkv_a, wo and w3, the up projection of any gated MLP (GeGLU as
    SwiGLU); a two-matrix MLP (w1, w2) keeps w2's instead."""
    from cost_models.activations import layer_activations
    from cost_models.enums import Recompute
    from cost_models.model_spec import ModelSpec

    mla = dict(name="mla-tiny", num_layers=2, hidden_size=256, ffn_hidden_size=688, num_attention_heads=8,
               vocab_size=1000, mla=dict(q_lora_rank=96, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=48))
    t, f, h = 256, 688, 256

    def kept(mlp: str) -> dict[str, int]:
        job = make_job(ModelSpec(**mla, mlp=mlp), gpus=1, recompute="selective",
                       training=dict(framework="torchtitan", seq_len=t, global_batch_size=1))
        return {n: p for n, p in layer_activations(job, 0, Recompute.SELECTIVE) if n.startswith("w")}
    gated = {"wq_a_output": t * 96 * 2, "wkv_a_output": t * (64 + 16) * 2, "wo_output": t * h * 2, "w3_output": t * f * 2}
    assert kept("swiglu") == kept("geglu") == gated
    assert kept("gelu") == {**{k: v for k, v in gated.items() if k != "w3_output"}, "w2_output": t * h * 2}


def test_squared_relu_mlp_has_two_matrices():
    """Nemotron-4 340B: fc1 h->f and fc2 f->h (no gate), so the MLP's forward FLOPs per token are
    2·2·h·f; its parameters 2·h·f (no biases)."""
    m = presets.models()["nemotron-4-340b"]
    job = make_job(m, gpus=8, tp=8, training=TRAINING)
    mlp = [g for g in layer_gemms(job, LayerKind()) if g.name.startswith("mlp_")]
    h, f = 18432, 73728
    assert sum(g.flop for g in mlp) == 2 * 4096 * 2 * h * f // 8
    assert model_params(m).value("dense_layers/mlp") == 96 * 2 * h * f


def test_deepseek_yarn_is_read_with_its_magnitude_corrections():
    """DeepSeek-V3's config.json rope_scaling (type yarn, factor 40, mscale = mscale_all_dim = 1) is
    kept. Hand-worked: get_mscale(40, 1) = 0.1·ln 40 + 1 = 1.368888; cos/sin factor 1.368888 /
    1.368888 = 1; softmax scale x 1.368888² = 1.873854. GPT-OSS gives neither key: cos/sin factor
    get_mscale(32) = 0.1·ln 32 + 1 = 1.346574, softmax unscaled. Tolerance: the six digits written."""
    import json
    from pathlib import Path

    from planner.hf import model_from_hf

    path = Path(__file__).parent / "data" / "hf" / "DeepSeek-V3" / "config.json"
    rs = model_from_hf(json.loads(path.read_text()), name="ds", source="fixture").rope_scaling
    assert (rs.kind, rs.factor, rs.original_max_position_embeddings, rs.mscale, rs.mscale_all_dim) == ("yarn", 40.0, 4096, 1.0, 1.0)
    assert rs == presets.models()["deepseek-v3"].rope_scaling
    assert rs.concentration == 1.0 and rs.softmax_factor == pytest.approx(1.873854, abs=1e-6)
    oss = presets.models()["gpt-oss-20b"].rope_scaling
    assert oss.concentration == pytest.approx(1.346574, abs=1e-6) and oss.softmax_factor == 1.0
