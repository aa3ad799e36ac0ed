"""Sliding-window, chunked and NoPE layers (Gemma 2/3, GPT-OSS, Llama 4): which layers are local, the
attention FLOPs a window or chunk mask keeps, the kernel time that follows, the elementwise terms
(sandwich norms, rotary on rotary layers only, final-logit soft-capping) and the cp refusal."""

from __future__ import annotations

import pytest

from cost_models.calibration import Calibration
from cost_models.compute import attention_kernels, elementwise_seconds, loss_time
from cost_models.errors import SpecError
from cost_models.flops import attended_pairs, core_attention
from cost_models.model_spec import LayerKind, ModelSpec
from planner import presets
from tests.helpers import LLAMA_TINY, make_job

CAL = Calibration()


@pytest.mark.parametrize("s, window, chunk", [(10, 3, None), (10, 10, None), (10, 20, None), (10, None, 4), (12, None, 4), (7, 1, None)])
def test_attended_pairs_count_the_mask_entry_by_entry(s, window, chunk):
    def kept(i: int, j: int) -> bool:
        if j > i:
            return False
        if window is not None and j <= i - window:  # transformers sliding_window_overlay
            return False
        return chunk is None or i // chunk == j // chunk  # chunked_overlay
    assert attended_pairs(s, window=window, chunk=chunk) == sum(kept(i, j) for i in range(s) for j in range(s))


def test_layer_kinds_follow_the_published_patterns():
    m = presets.models()
    # Gemma 2 and GPT-OSS: sliding on even layers (0-based), full on odd ones
    for name, w in (("gemma-2-9b", 4096), ("gpt-oss-20b", 128)):
        kinds = [m[name].layer_kind(i) for i in range(4)]
        assert [k.window for k in kinds] == [w, None, w, None]
    # Gemma 3: layers 5, 11, 17, 23 of 26 full (sliding_window_pattern 6)
    g3 = m["gemma-3-1b"]
    assert [i for i in range(g3.num_layers) if g3.layer_kind(i).window is None] == [5, 11, 17, 23]
    # Llama 4 Maverick: every fourth layer full attention without rope, the rest chunked with rope;
    # MoE on odd layers (interleave_moe_layer_step 2)
    mav = m["llama-4-maverick-17b-128e"]
    assert [mav.layer_kind(i) for i in range(4)] == [
        LayerKind(moe=False, chunk=8192), LayerKind(moe=True, chunk=8192), LayerKind(moe=False, chunk=8192),
        LayerKind(moe=True, rope=False),
    ]
    # full layers (3, 7, …) are all MoE layers: three kinds
    assert {k.label: n for k, n in mav.layer_kind_counts.items()} == {"dense_chunked": 24, "moe_chunked": 12, "moe_nope": 12}


def test_window_caps_attention_flops_and_kernel_time():
    # seq 8192, window 4096: kept pairs 4096·4097/2 + 4096·4096 = 25,174,016 of 8192² → 0.375...
    job = make_job("gemma-2-9b", gpus=8, tp=8, mbs=1, training=dict(seq_len=8192))
    local, full = job.model.layer_kind(0), job.model.layer_kind(1)
    a_local, a_full = core_attention(job, local), core_attention(job, full)
    assert a_local.causal_fraction == pytest.approx((4096 * 4097 / 2 + 4096 * 4096) / 8192**2)
    assert a_full.causal_fraction == pytest.approx(8193 / (2 * 8192))
    assert a_local.flop < a_full.flop
    k_local, k_full = attention_kernels(job, CAL, local), attention_kernels(job, CAL, full)
    assert k_local.forward_s < k_full.forward_s and k_local.backward_s < k_full.backward_s
    # A window as long as the sequence is plain causal attention.
    long = make_job("gemma-2-9b", gpus=8, tp=8, mbs=1, training=dict(seq_len=4096))
    assert attention_kernels(long, CAL, long.model.layer_kind(0)).forward_s == pytest.approx(
        attention_kernels(long, CAL, long.model.layer_kind(1)).forward_s)


def test_chunked_attention_costs_scale_with_the_chunk_not_the_sequence():
    # Chunks of 8192: doubling the sequence doubles a chunked layer's attention, quadruples-ish a full one.
    def kernel_s(seq: int, i: int) -> float:
        job = make_job("llama-4-scout-17b-16e", gpus=8, tp=8, ep=8, etp=1, mbs=1, training=dict(seq_len=seq))
        return attention_kernels(job, CAL, job.model.layer_kind(i)).forward_s
    chunked = kernel_s(32768, 0) / kernel_s(16384, 0)
    full = kernel_s(32768, 3) / kernel_s(16384, 3)
    assert chunked == pytest.approx(2.0, rel=0.05)  # launch overhead and wave fill only
    assert full > 3.5


def test_elementwise_terms_of_sandwich_norms_nope_and_softcap():
    base = LLAMA_TINY.model_copy(update=dict(attention_chunk_size=64, full_attention_every=2, nope_full_layers=True))
    job = make_job(base, training=dict(seq_len=256))
    rope, nope = base.layer_kind(0), base.layer_kind(1)
    assert elementwise_seconds(job, nope, backward=False, cal=CAL) < elementwise_seconds(job, rope, backward=False, cal=CAL)
    sandwich = make_job(base.model_copy(update=dict(sandwich_norms=True)), training=dict(seq_len=256))
    assert elementwise_seconds(sandwich, rope, backward=False, cal=CAL) > elementwise_seconds(job, rope, backward=False, cal=CAL)
    capped = make_job(base.model_copy(update=dict(final_logit_softcap=30.0)), training=dict(seq_len=256))
    assert loss_time(capped, CAL) > loss_time(job, CAL)


def test_context_parallel_with_local_layers_is_refused_in_one_line():
    with pytest.raises(SpecError, match=r"context parallel \(cp=2\) with sliding-window \(128\).*use cp 1"):
        make_job("gpt-oss-20b", gpus=16, tp=8, cp=2, ep=2, etp=1, training=dict(seq_len=8192))


def test_local_attention_fields_are_checked():
    with pytest.raises(ValueError, match="not both"):
        ModelSpec.model_validate({**LLAMA_TINY.model_dump(), "sliding_window": 8, "attention_chunk_size": 8})
    with pytest.raises(ValueError, match="need local layers"):
        ModelSpec.model_validate({**LLAMA_TINY.model_dump(), "full_attention_every": 2})


def test_validate_worker_masks_keep_the_counted_pairs():
    """The emitted worker's masks are the ones the FLOP count assumes, entry for entry in count."""
    pytest.importorskip("torch")
    from planner.validate.worker import local_mask

    for s, window, chunk in [(32, 8, None), (32, None, 8), (30, None, 8), (32, None, None), (32, 40, None)]:
        assert int(local_mask(s, window, chunk, "cpu").sum()) == attended_pairs(s, window=window, chunk=chunk)


def _read(cfg: dict) -> ModelSpec:
    from planner.hf import model_from_hf

    return model_from_hf(cfg, name="t", source="test")


BASE = dict(num_hidden_layers=4, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, vocab_size=100)


def test_readers_take_the_class_defaults_and_refuse_other_layer_patterns():
    # Gemma2Config defaults: window 4096 on even layers, soft-caps 50 / 30, tied, (1 + w) sandwich norms
    g2 = _read({**BASE, "model_type": "gemma2"})
    assert (g2.sliding_window, g2.full_attention_every, g2.attn_logit_softcap, g2.final_logit_softcap) == (4096, 2, 50.0, 30.0)
    assert g2.tie_embeddings and g2.sandwich_norms and g2.zero_centered_norm and g2.mlp == "geglu"
    assert _read({**BASE, "model_type": "gemma2", "attn_logit_softcapping": None}).attn_logit_softcap is None  # null switches it off
    with pytest.raises(SpecError, match="layer_types is not one full layer after every 1 local ones"):
        _read({**BASE, "model_type": "gemma2", "layer_types": ["sliding_attention", "full_attention", "full_attention", "sliding_attention"]})
    # Gemma 3, transformers 5.x spelling: one rope per layer type
    g3 = _read({**BASE, "model_type": "gemma3_text", "rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}})
    assert (g3.rope_theta, g3.rope_scaling.kind, g3.rope_local_theta, g3.full_attention_every, g3.qk_norm) == (1e6, "linear", 1e4, 6, True)
    # GPT-OSS: yarn x32 from 4096 when the config gives no rope
    oss = _read({**BASE, "model_type": "gpt_oss", "num_local_experts": 4})
    assert (oss.rope_scaling.kind, oss.rope_scaling.factor, oss.rope_theta, oss.sliding_window) == ("yarn", 32.0, 150000.0, 128)
    assert oss.moe.router_bias and oss.attention_sinks and oss.mlp_bias
    # Llama 4: MoE on the listed layers, the others dense with intermediate_size_mlp; rope on 3 of 4
    l4 = _read({**BASE, "model_type": "llama4_text", "intermediate_size_mlp": 256, "moe_layers": [0, 3]})
    assert l4.moe_layer_ids == (0, 3) and l4.ffn_hidden_size == 256
    assert [l4.layer_kind(i).rope for i in range(4)] == [True, True, True, False]


def test_deepspeed_hf_models_run_local_masks_as_tensors_and_gemma2_eagerly():
    # Gemma 3 under DeepSpeed: transformers hands SDPA the sliding mask as a tensor, so every score
    # is computed (no causal or window skip); Megatron's kernel skips the blocks outside the window.
    def local(framework: str):
        job = make_job("gemma-3-1b", gpus=8, tp=1, zero=1, training=dict(framework=framework, seq_len=8192))
        return core_attention(job, job.model.layer_kind(0)), attention_kernels(job, CAL, job.model.layer_kind(0))
    (ds_flops, ds_kernels), (mg_flops, mg_kernels) = local("deepspeed"), local("megatron")
    assert ds_flops.causal_fraction == 1.0 and mg_flops.causal_fraction < 0.07  # 512-token window of 8192: ~6%
    assert ds_kernels.forward_s > 5 * mg_kernels.forward_s
    # Gemma 2's soft-capped scores have no SDPA path in transformers: DeepSpeed's model runs eager
    with pytest.raises(SpecError, match="soft-capped scores: transformers' Gemma2 and GptOss models have no SDPA path.*--attention eager"):
        make_job("gemma-2-2b", gpus=8, tp=1, zero=1, training=dict(framework="deepspeed", seq_len=4096))


def test_deepspeed_config_refuses_what_no_hf_class_holds():
    from planner.launch.hf_config import hf_config

    # sinks without experts: GPT-OSS is the only class with sinks, and it is all-MoE
    dense_sinks = ModelSpec.model_validate({**LLAMA_TINY.model_dump(), "sliding_window": 64, "attention_sinks": True})
    with pytest.raises(SpecError, match=r"nearest Hugging Face architecture \(mistral\) differs in attention_sinks"):
        hf_config(dense_sinks)


def _hf_windows(cfg: dict) -> list[int | None]:
    """Each layer's window as transformers builds the model: config.sliding_window on the layers
    config.layer_types calls sliding (all layers where the class keeps no layer_types: Mistral,
    Mixtral, Qwen3-MoE; MistralAttention / MixtralAttention / Qwen3MoeAttention pass
    config.sliding_window to every layer, Qwen2Attention its layer type's)."""
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoConfig.for_model(**cfg)
    types = getattr(hf, "layer_types", None) if cfg["model_type"] not in ("mistral", "mixtral") else None
    return [hf.sliding_window or None if types is None or types[i] == "sliding_attention" else None
            for i in range(hf.num_hidden_layers)]


@pytest.mark.parametrize("cfg, windows", [
    ({"model_type": "mistral"}, [4096] * 4),  # MistralConfig's default window
    ({"model_type": "mistral", "sliding_window": None}, [None] * 4),
    ({"model_type": "mistral", "sliding_window": 64, "layer_types": ["full_attention"] * 4}, [64] * 4),  # ignored by Mistral
    ({"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2}, [None] * 4),  # MixtralConfig: none
    ({"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 64}, [64] * 4),
    ({"model_type": "qwen2", "sliding_window": 64}, [None] * 4),  # use_sliding_window false by default
    ({"model_type": "qwen2", "sliding_window": 64, "use_sliding_window": True, "max_window_layers": 0}, [64] * 4),
    ({"model_type": "qwen2", "sliding_window": 64, "use_sliding_window": True}, [None] * 4),  # max_window_layers 28 > 4 layers
    ({"model_type": "qwen2", "sliding_window": 64, "use_sliding_window": True,
      "layer_types": ["sliding_attention", "full_attention"] * 2}, [64, None, 64, None]),
    ({"model_type": "qwen3", "use_sliding_window": True, "max_window_layers": 0}, [4096] * 4),
    ({"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
      "sliding_window": 64, "use_sliding_window": True}, [64] * 4),
    ({"model_type": "qwen2_moe", "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
      "sliding_window": 64, "use_sliding_window": True}, [64, None, 64, None]),  # even layers below max_window_layers 28
], ids=["mistral-default", "mistral-null", "mistral-layer-types-ignored", "mixtral-default", "mixtral-64", "qwen2-switch-off",
        "qwen2-all", "qwen2-max-window-layers", "qwen2-layer-types", "qwen3-all", "qwen3-moe", "qwen2-moe-default-pattern"])
def test_mistral_and_qwen_readers_carry_the_window_transformers_applies(cfg, windows):
    spec = _read({**BASE, **cfg})
    ours = [spec.layer_kind(i).window for i in range(spec.num_layers)]
    assert ours == windows
    assert _hf_windows({**BASE, **cfg}) == windows


def test_window_layers_the_spec_cannot_hold_are_refused_in_one_line():
    # Qwen2: the window on layers 2 and 3 (i >= max_window_layers), full attention on 0 and 1
    cfg = {**BASE, "model_type": "qwen2", "sliding_window": 64, "use_sliding_window": True, "max_window_layers": 2}
    assert _hf_windows(cfg) == [None, None, 64, 64]
    with pytest.raises(SpecError, match=r"^config.json: a sliding window on 2 of 4 layers, first full layer 0 "
                                        r"\(model_type 'qwen2'\);.*max_window_layers 0\), or use_sliding_window false$"):
        _read(cfg)


def test_mistral_7b_window_reaches_the_cost_and_the_hugging_face_config():
    from planner.launch.hf_config import hf_config

    m = presets.models()["mistral-7b"]
    assert [m.layer_kind(i).window for i in range(m.num_layers)] == [4096] * 32
    # seq 8192, window 4096: Megatron's kernel keeps 4096·4097/2 + 4096·4096 of 8192² pairs (0.3750…)
    job = make_job("mistral-7b", gpus=8, tp=1, zero=1, training=dict(seq_len=8192))
    assert core_attention(job, job.model.layer_kind(0)).causal_fraction == pytest.approx((4096 * 4097 / 2 + 4096 * 4096) / 8192**2)
    # DeepSpeed's Hugging Face Mistral: SDPA gets the window as a mask tensor and computes every score
    ds = make_job("mistral-7b", gpus=8, tp=1, zero=1, training=dict(framework="deepspeed", seq_len=8192))
    assert core_attention(ds, ds.model.layer_kind(0)).causal_fraction == 1.0
    cfg = hf_config(m)
    assert (cfg["model_type"], cfg["architectures"], cfg["sliding_window"]) == ("mistral", ["MistralForCausalLM"], 4096)
    assert _hf_windows(cfg) == [4096] * 32
    # a Qwen2-shaped spec with one full layer in four: use_sliding_window and layer_types
    qwen = ModelSpec.model_validate({**presets.models()["qwen2.5-7b"].model_dump(), "sliding_window": 1024, "full_attention_every": 4})
    cfg = hf_config(qwen)
    assert cfg["model_type"] == "qwen2" and _hf_windows(cfg) == [None if (i + 1) % 4 == 0 else 1024 for i in range(28)]


def test_model_flops_count_a_local_layers_window_not_the_sequence():
    """MFU's model FLOPs (PaLM's 6·N + 12·H·Q·T per attention layer) take min(T, window) for a
    sliding-window layer and min(T, chunk) for a chunked one: Mistral-7B at 32k tokens is counted
    against its 4096-token window on all 32 layers, Gemma-2-2B against 4096 on its 13 local layers
    and the full 32768 on the other 13."""
    from cost_models.flops import model_flops_per_token

    mistral = presets.models()["mistral-7b"]
    n = mistral.params_active - mistral.vocab_size * mistral.hidden_size  # the input table is a lookup
    hq = mistral.num_attention_heads * mistral.attention_head_size
    assert model_flops_per_token(mistral, 32768) == 6 * n + 12 * 32 * hq * 4096
    assert model_flops_per_token(mistral, 2048) == 6 * n + 12 * 32 * hq * 2048  # shorter than the window
    gemma = presets.models()["gemma-2-2b"]
    gn = gemma.params_active - gemma.vocab_size * gemma.hidden_size * (0 if gemma.tie_embeddings else 1)
    ghq = gemma.num_attention_heads * gemma.attention_head_size
    assert model_flops_per_token(gemma, 32768) == 6 * gn + 12 * ghq * (13 * 4096 + 13 * 32768)
