"""Hybrid models with MoE layers (Nemotron 3: E in the pattern): the layer kinds and parameters by
hand, the nemotron_h import against transformers' NemotronHMoE, the cost model's MoE terms on E layers,
and the Megatron launch's MoE flags beside --hybrid-layer-pattern."""

from __future__ import annotations

import json

import pytest

from cost_models.enums import MixerKind
from cost_models.errors import SpecError
from cost_models.model_spec import ModelSpec

# Five layers, one of each kind and a second E: Mamba, MoE, attention, MLP, MoE. The router and
# balancing settings are Nemotron 3 Nano's (sigmoid with a correction bias, renormalised, scaled 2.5,
# per-sequence balancing loss 1e-4), so the spec survives a config.json round trip.
TINY_E = ModelSpec.model_validate(dict(
    name="tiny-nemotron-h-moe", num_layers=5, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4, num_kv_heads=2,
    head_dim=8, vocab_size=64, max_position_embeddings=64, mlp="squared_relu", position_embedding="none",
    hybrid_pattern="ME*-E", mamba=dict(num_heads=8, head_dim=8, state_size=16, num_groups=2, chunk_size=8),
    moe=dict(num_experts=4, top_k=2, expert_ffn_hidden_size=16, num_shared_experts=1, shared_expert_ffn_hidden_size=32,
             router_score="sigmoid", expert_bias=True, routed_scaling_factor=2.5, aux_loss_coef=0.0001,
             sequence_aux_loss=True),
))


def test_e_layers_are_moe_layers_without_a_mixer():
    kinds = [TINY_E.layer_kind(i) for i in range(5)]
    assert [k.mixer for k in kinds] == [MixerKind.MAMBA, MixerKind.NONE, MixerKind.ATTENTION, MixerKind.NONE, MixerKind.NONE]
    assert [k.moe for k in kinds] == [False, True, False, False, True]
    assert TINY_E.moe_layer_ids == (1, 4)
    assert {k.label for k in kinds} == {"mamba", "moe", "attention", "mlp"}
    # per E layer: norm 32, router 32·4, 4 experts 2·32·16 each (relu², no gate), shared 2·32·32 -> 6,304;
    # Mamba 32 + 9176, attention 32 + 3072, MLP 32 + 4096 (tests/test_hybrid.py), embedding and output
    # 2·64·32, final norm 32
    assert TINY_E.params_total == 2 * (32 + 128 + 4 * 1024 + 2048) + 9208 + 3104 + 4128 + 2 * 64 * 32 + 32 == 33_176
    # active: 2 of the 4 experts in each E layer
    assert TINY_E.params_active == 33_176 - 2 * 2 * 1024


def test_moe_section_and_e_layers_go_together():
    base = TINY_E.model_dump()
    for update, words in (({"moe": None}, "MoE layers \\(E\\) and a moe section"),
                          ({"hybrid_pattern": "M**-M"}, "MoE layers \\(E\\) and a moe section"),
                          ({"moe": {**base["moe"], "first_k_dense": 1}}, "the pattern's E layers are the MoE layers")):
        with pytest.raises(ValueError, match=words):
            ModelSpec.model_validate({**base, **update})


def _config(tmp_path, **update):
    from planner.launch.hf_config import hf_config

    cfg = {"model_type": "nemotron_h", "architectures": ["NemotronHForCausalLM"], **hf_config(TINY_E), **update}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def test_nemotron_h_config_with_e_layers_reads_back(tmp_path):
    from planner.loaders import load_model

    spec = load_model(str(_config(tmp_path)))
    assert spec.model_copy(update={"name": TINY_E.name, "source": ""}) == TINY_E.model_copy(update={"source": ""})


@pytest.mark.parametrize("update, words", [
    ({"num_nextn_predict_layers": 1}, "transformers' NemotronHForCausalLM does not build them"),
    ({"moe_latent_size": 16}, "moe_latent_size"),
    ({"mlp_bias": True}, "routed experts have no bias"),
])
def test_nemotron_h_refusals_name_the_key(tmp_path, update, words):
    from planner.loaders import load_model

    with pytest.raises(SpecError, match=words):
        load_model(str(_config(tmp_path, **update)))


def test_preset_is_the_hub_config():
    from pathlib import Path

    from planner import presets
    from planner.loaders import load_model

    fixture = load_model(str(Path(__file__).parent / "data" / "hf" / "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"))
    preset = presets.models()["nemotron-3-nano-30b-a3b"]
    skip = {"name", "source"}
    assert preset.model_dump(exclude=skip) == fixture.model_dump(exclude=skip)
    # 31,577,937,344 parameters as transformers' NemotronHForCausalLM counts them on the meta device
    # (tests/test_params.py); 3,580,073,408 with 6 of 128 experts per E layer: 23 layers x 122 experts
    # x 2·2688·1856 fewer
    assert preset.params_total == 31_577_937_344
    assert preset.params_active == 31_577_937_344 - 23 * 122 * 2 * 2688 * 1856 == 3_580_073_408


def _job(model: ModelSpec = TINY_E, **layout):
    from helpers import make_job

    return make_job(model, gpus=layout.pop("gpus", 1), training={"seq_len": 16, "global_batch_size": layout.pop("gbs", 8)}, **layout)


def test_e_layer_flops_are_the_routed_and_shared_experts():
    # per token: router 2·32·4; 2 routed experts 2·(2·32·16) each; shared 2·(2·32·32); T = 16
    from cost_models.enums import Recompute
    from cost_models.flops import layer_flops

    f = layer_flops(_job(), TINY_E.layer_kind(1), mode=Recompute.NONE)
    assert f.forward_attention == 0
    assert f.forward_gemm == 16 * (2 * 32 * 4 + 2 * 2 * 2 * 32 * 16 + 2 * 2 * 32 * 32)


def test_e_layer_activations_are_the_moe_blocks():
    # Megatron, bf16, one sequence of 16 tokens, ep 2: the pre-norm's input 16·32·2 and rstd 16·4,
    # the router's input 16·32·2 and fp32 scores 16·4·4, 32 routed copies (top-2) in 32·32·2, the
    # experts' relu² input and fc2 input 32·16·2 each, the weighted outputs 16·2·32·2, the shared
    # expert's 16·32·2 twice; nothing of a mixer (E has none)
    from cost_models import activations as act

    items = dict(act.layer_items(_job(gpus=2, ep=2), 1))
    assert set(items) == {"mlp"}
    assert items["mlp"].total == 1024 + 64 + 1024 + 256 + 2048 + 2 * 1024 + 2048 + 2 * 1024 == 10_560


def test_ep_rules_and_the_ep_exchange_reach_e_layers():
    from cost_models.step_time import time_estimate

    with pytest.raises(SpecError, match=r"num_experts\(4\) is not divisible by ep\(8\)"):
        _job(gpus=8, ep=8)
    assert time_estimate(_job()).breakdown.value("ep") == 0
    # the expert all-to-alls are priced per E layer: one E layer in place of two exposes half the time
    one_e = ModelSpec.model_validate({**TINY_E.model_dump(), "hybrid_pattern": "M-*-E"})
    two, one = (time_estimate(_job(model, gpus=2, ep=2)).breakdown.value("ep") for model in (TINY_E, one_e))
    assert two > 0 and two == pytest.approx(2 * one, rel=1e-12)


def test_megatron_launch_carries_the_moe_flags_beside_the_pattern():
    from planner.launch.megatron import train_sh
    from planner.launch.target import Target

    from helpers import make_job

    spec = ModelSpec.model_validate({**TINY_E.model_dump(), "mamba": {**TINY_E.mamba.model_dump(), "chunk_size": 128}})
    job = make_job(spec, gpus=4, training={"seq_len": 16, "global_batch_size": 8}, ep=2, pp=2, pp_first_stage_layers=3)
    text = train_sh(Target(job=job))
    assert '"$MEGATRON_LM/pretrain_hybrid.py"' in text
    for flag in ("--hybrid-layer-pattern 'ME*|-E'", "--num-experts 4", "--moe-router-topk 2", "--moe-ffn-hidden-size 16",
                 "--moe-router-score-function sigmoid", "--moe-router-enable-expert-bias",
                 "--moe-router-topk-scaling-factor 2.5", "--moe-shared-expert-intermediate-size 32",
                 "--moe-router-load-balancing-type seq_aux_loss", "--moe-aux-loss-coeff 0.0001",
                 "--expert-model-parallel-size 2", "--squared-relu"):
        assert flag in text, flag
    # the pattern says which layers are MoE: no per-layer list beside it
    assert "--moe-layer-freq" not in text


torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _hf_moe():
    """transformers' NemotronHMoE for TINY_E (via the config.json the planner writes for it), its
    weights drawn at random and its correction bias non-zero, so the bias decides some choices."""
    from planner.launch.hf_config import hf_config

    cfg = transformers.AutoConfig.for_model(**hf_config(TINY_E))
    torch.manual_seed(0)
    model = transformers.NemotronHForCausalLM(cfg).float()
    moe = model.model.layers[1].mixer
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0.0, 0.3)
        moe.gate.e_score_correction_bias.copy_(torch.tensor([0.3, -0.2, 0.0, 0.1]))
    return model, moe


def test_reference_model_counts_transformers_parameters():
    from planner.torch_model import Transformer

    model, _ = _hf_moe()
    assert sum(p.numel() for p in model.parameters()) == TINY_E.params_total
    assert sum(p.numel() for p in Transformer(TINY_E, max_seq=16).parameters()) == TINY_E.params_total


def test_moe_layers_match_transformers():
    """The reference model's MoE (torch_model) and validate's (worker) against NemotronHMoE with the
    same weights: sigmoid scores, top-2 chosen with the correction bias added (the worker has no bias
    buffer: checked with the bias zeroed), renormalised, times 2.5, plus the shared expert. fp32 sums
    in another order: 1e-5."""
    from planner.torch_model import MoE as RefMoE
    from planner.torch_model import Kernels
    from planner.validate.slices import model_doc
    from planner.validate.worker import MoE as WorkerMoE

    _, hf = _hf_moe()
    hf.eval()
    ours = RefMoE(TINY_E, Kernels()).float()
    with torch.no_grad():
        ours.router.weight.copy_(hf.gate.weight)
        ours.expert_bias.copy_(hf.gate.e_score_correction_bias)
        for e, expert in enumerate(ours.experts):
            expert.fc1.weight.copy_(hf.experts.up_proj[e])
            expert.fc2.weight.copy_(hf.experts.down_proj[e])
        ours.shared[0].fc1.weight.copy_(hf.shared_experts.up_proj.weight)
        ours.shared[0].fc2.weight.copy_(hf.shared_experts.down_proj.weight)
    x = torch.randn(2, 8, 32)
    assert torch.allclose(ours(x), hf(x), atol=1e-5, rtol=1e-5)

    worker = WorkerMoE(model_doc(TINY_E), ep=1).float()
    with torch.no_grad():
        hf.gate.e_score_correction_bias.zero_()
        worker.router.weight.copy_(hf.gate.weight)
        worker.experts.w1.copy_(hf.experts.up_proj.transpose(1, 2))
        worker.experts.w2.copy_(hf.experts.down_proj.transpose(1, 2))
        worker.shared[0].w1.weight.copy_(hf.shared_experts.up_proj.weight)
        worker.shared[0].w2.weight.copy_(hf.shared_experts.down_proj.weight)
    assert torch.allclose(worker(x), hf(x), atol=1e-5, rtol=1e-5)


def test_a_stage_without_e_layers_has_no_moe_section():
    # validate runs one stage's layers as a model of their own: "*-" of "ME*-E" has neither Mamba nor
    # MoE layers, "-E" keeps the moe section unchanged (the pattern says which layer is MoE)
    from planner.validate.slices import _stage_model

    job = _job()
    plain, moe = _stage_model(job, (2, 3)), _stage_model(job, (3, 4))
    assert (plain.hybrid_pattern, plain.mamba, plain.moe) == ("*-", None, None)
    assert (moe.hybrid_pattern, moe.moe, moe.moe_layer_ids) == ("-E", TINY_E.moe, (1,))
