"""Megatron round trip: the model pretrain_gpt.py would build from the emitted train.sh is the
planned model.

The argv train.sh hands torchrun becomes megatron-core 0.16.1's TransformerConfig exactly as in
tests/test_launch_parsers.py (megatron_config), and GPTModel is built from it the way Megatron-LM's
pretrain_gpt.py builds it (Megatron-LM d98e8a64, gpt_builders.py): the decoder block spec of
get_gpt_decoder_block_spec for MoE models (L41-49), get_gpt_layer_local_spec otherwise (L137-149,
the local, non-Transformer-Engine modules: this environment has no Transformer Engine), and the
GPTModel arguments of L86-104 (vocab_size = --padded-vocab-size, max_sequence_length =
--max-position-embeddings, untied output unless --untie-embeddings-and-output-weights is absent,
position type, rotary percent and base, rope_scaling; no rope scaling factor: that call does not
pass one).

What is built: the whole model on one rank. The emitted layouts have tp = 1 (the vocabulary padding
at tp > 1 has its own case below); the config's parallel sizes are then 1, and
use_cpu_initialization (with perform_initialization off) lets the weights be allocated on the meta
device, where nothing is materialised: neither changes a shape. megatron-core's layers look up their
process groups, so a one-process gloo group (an in-memory store) stands behind parallel_state.

What is compared, for every model preset (Megatron refuses none of them) and the Hugging Face
fixtures it accepts: the parameter count against cost_models' exact count; the rotary inverse
frequencies against those transformers computes from the DeepSpeed config.json of the same spec
(rope base, Llama-3.1 scaling and partial rotary in one array); every norm's kind and epsilon; q/k
norms; and each MoE layer's router (experts, top-k, score function, pre-softmax, aux-loss type and
coefficient, z-loss, capacity factor) and shared experts.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from unittest import mock

import pytest

from launch_cases import Case, after, run_train_sh, write
from planner import presets
from planner.launch.hf_config import hf_config
from planner.launch.megatron import megatron_blocker

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")
transformers = pytest.importorskip("transformers")

from test_launch_parsers import megatron_config  # noqa: E402  (the argv -> TransformerConfig path)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")

HF = Path(__file__).parent / "data" / "hf"
# Every fixture of tests/data/hf round-trips, less those the launch refuses for Megatron (each with the
# words of its refusal, test_megatron_refuses_the_fixtures_it_cannot_say) and the hybrid Mamba ones,
# whose MambaMixer needs the mamba_ssm CUDA package (see MEGATRON_PRESETS below).
MEGATRON_REFUSED = {
    "bloom-560m": "alibi positions have no Megatron flag",
    "pythia-1.4b": "use_parallel_residual",
    "gemma-2-9b": "tanh soft-capping",
    "gemma-3-1b-pt": "a norm on the attention and MLP outputs",
    "Llama-4-Scout-17B-16E-text": "chunked attention has no Megatron flag",
}
HYBRID_FIXTURES = {"Nemotron-H-8B-Base-8K", "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"}
HF_FIXTURES = sorted(p.name for p in HF.iterdir() if p.is_dir() and p.name not in MEGATRON_REFUSED.keys() | HYBRID_FIXTURES)
# Learned position tables limit the sequence; 1024 fits every preset's table.
SEQ_LEN = 1024


@pytest.fixture(scope="module")
def model_parallel():
    import torch.distributed as dist
    from megatron.core import parallel_state

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    yield
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


def _emitted(model: str, tmp_path: Path, tp: int = 1):
    case = Case(f"rt-{Path(model).name}", model, 8, "megatron", {"tp": tp, "zero": 1}, {"seq_len": SEQ_LEN, "global_batch_size": 64})
    launch = case.build()
    argv = after(run_train_sh(write(launch, tmp_path / "launch"), tmp_path), "/opt/Megatron-LM/pretrain_gpt.py")
    return launch.report.job.model, argv


def _build(argv: list[str]):
    """GPTModel as gpt_builders.py builds it, for the whole model on one rank, on the meta device."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.moe import grouped_gemm_util
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher

    parsed, extra = megatron_config(argv)
    # One rank holds everything; allocation on the meta device. The local torch LayerNorm refuses
    # --apply-layernorm-1p (zero-centred gamma: Transformer Engine's and apex's norms apply weight + 1,
    # torch_norm.py L26); the 1p norm has the same weight and bias, so the model is built without it
    # and the parsed config (returned) keeps the flag.
    config = dataclasses.replace(
        parsed, tensor_model_parallel_size=1, sequence_parallel=False, expert_model_parallel_size=1,
        expert_tensor_parallel_size=1, use_cpu_initialization=True, perform_initialization=False,
        layernorm_zero_centered_gamma=False,
    )
    if config.num_moe_experts and config.add_bias_linear:
        # the local GroupedMLP refuses biases (experts.py L82-84 in 0.16.1: "bias not supported in
        # Grouped GEMM yet"); Transformer Engine's TEGroupedMLP, which the run uses, holds them.
        # SequentialMLP holds the same weights and biases, expert by expert.
        config = dataclasses.replace(config, moe_grouped_gemm=False)
    # the dynamic config.yarn_* attributes (argument_utils.py _apply_yarn_config_from_args) are not fields
    for name, value in vars(parsed).items():
        if name.startswith("yarn_"):
            setattr(config, name, value)
    normalization = config.normalization
    if config.num_moe_experts:
        spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization=normalization)
    else:
        spec = get_gpt_layer_local_spec(config.num_moe_experts, config.moe_grouped_gemm, config.qk_layernorm,
                                        config.multi_latent_attention, normalization=normalization)
    if config.multi_latent_attention:
        spec = _parameter_free_core_attention(spec)
    one = lambda flag, default=None: extra[flag][0] if flag in extra else default  # noqa: E731
    # The all-to-all dispatcher (the emitted --moe-token-dispatcher-type) makes one CUDA stream per
    # process when its class attribute is unset (token_dispatcher.py L444-445 in 0.16.1); a placeholder
    # stands in for it on a machine without CUDA. It holds no parameters.
    stream = mock.patch.object(MoEAlltoAllTokenDispatcher, "cuda_dtoh_stream", object())
    # With the local modules the emitted --moe-grouped-gemm selects GroupedMLP, whose constructor
    # asserts that the grouped_gemm kernels (a CUDA package) are installed (experts.py L81); they run
    # only in forward. Its weights, one (h, E·2f) and one (E·f, h) tensor per layer, are allocated
    # as without the check.
    kernels = mock.patch.object(grouped_gemm_util, "assert_grouped_gemm_is_available", lambda: None)
    # MLASelfAttention builds its RotaryEmbedding without use_cpu_initialization (multi_latent_attention.py
    # L129-135 in 0.16.1), which then asks for the current CUDA device to put inv_freq on; a machine
    # without CUDA answers "cpu". The table's values do not depend on the device.
    device = mock.patch.object(torch.cuda, "current_device", lambda: "cpu")
    # multi_latent_attention.py L54-65 sets HAVE_TE when megatron.core.extensions.transformer_engine
    # imports, which it does without Transformer Engine (its classes are then None); L183-186 would call
    # isinstance(x, None). Without Transformer Engine installed, HAVE_TE is what it should say: False.
    from megatron.core.transformer import multi_latent_attention

    no_te = mock.patch.object(multi_latent_attention, "HAVE_TE", False)
    mtp = None
    if config.mtp_num_layers:
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_mtp_block_spec

        # gpt_builders.py: the MTP block takes the decoder's last layer spec
        mtp = get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False)
    with torch.device("meta"), stream, kernels, device, no_te:
        model = GPTModel(
            config=config,
            transformer_layer_spec=spec,
            mtp_block_spec=mtp,
            vocab_size=int(one("--padded-vocab-size")),
            max_sequence_length=int(one("--max-position-embeddings")),
            share_embeddings_and_output_weights="--untie-embeddings-and-output-weights" not in extra,
            position_embedding_type=one("--position-embedding-type", "learned_absolute"),
            rotary_percent=float(one("--rotary-percent", 1.0)),
            rotary_base=int(one("--rotary-base", 10000)),
            rope_scaling="--use-rope-scaling" in extra,
        )
    return model, parsed


def _parameter_free_core_attention(spec):
    """MLA's layer spec with IdentityOp as core attention. The local (non-Transformer-Engine)
    DotProductAttention of megatron-core 0.16.1 takes no k_channels/v_channels, which
    MLASelfAttention passes (its different q/k and v head widths need TE's attention), so Megatron's
    MLA does not build without Transformer Engine; core attention holds no parameters in either, so
    the stand-in changes no count."""
    import copy

    from megatron.core.transformer.identity_op import IdentityOp

    spec = copy.deepcopy(spec)
    layers = getattr(spec, "layer_specs", None) or [spec]
    for layer in layers:
        layer.submodules.self_attention.submodules.core_attention = IdentityOp
    return spec


def _hf_inv_freq(spec):
    """The rotary inverse frequencies transformers computes for the spec's DeepSpeed config.json."""
    cfg = transformers.AutoConfig.for_model(**hf_config(spec.model_copy(update={"mtp_layers": 0})))
    module = sys.modules[transformers.AutoModelForCausalLM._model_mapping[type(cfg)].__module__]
    rotary = next(getattr(module, n) for n in dir(module) if n.endswith("RotaryEmbedding"))
    return rotary(config=cfg).inv_freq


def _megatron_inv_freq(rotary):
    """The inverse frequencies a Megatron rotary module applies: RotaryEmbedding's inv_freq, or
    YarnRotaryEmbedding's blend of the interpolated and extrapolated ones over its correction ramp
    (get_emb in yarn_rotary_pos_embedding.py, 0.16.1), whose inv_freq is the unscaled table."""
    if not hasattr(rotary, "inv_freq_extra"):
        return rotary.inv_freq.cpu()
    from megatron.core.models.common.embeddings import yarn_rotary_pos_embedding as yarn

    low, high = yarn._yarn_find_correction_range(rotary.beta_fast, rotary.beta_slow, rotary.dim, rotary.rotary_base,
                                                 rotary.original_max_position_embeddings, rotary.correction_range_round_to_int)
    mask = 1.0 - yarn._yarn_linear_ramp_mask(low, high, rotary.dim // 2, device="cpu").to(torch.float32)
    return rotary.inv_freq_inter.cpu() * (1 - mask) + rotary.inv_freq_extra.cpu() * mask


def _check_yarn(spec, rotary, attention) -> None:
    """YaRN's two scalars as Megatron builds them equal transformers': the cos/sin factor (the
    rotary module's attention_scaling) and, under MLA, the softmax scale (DeepseekV3Attention.scaling)."""
    from megatron.core.models.common.embeddings import yarn_rotary_pos_embedding as yarn

    rs = spec.rope_scaling
    cfg = transformers.AutoConfig.for_model(**hf_config(spec.model_copy(update={"mtp_layers": 0})))
    module = sys.modules[transformers.AutoModelForCausalLM._model_mapping[type(cfg)].__module__]
    hf_rotary = next(getattr(module, n) for n in dir(module) if n.endswith("RotaryEmbedding"))(config=cfg)
    factor = yarn._yarn_get_concentration_factor(rotary.scaling_factor, rotary.mscale, rotary.mscale_all_dim)
    assert factor == pytest.approx(hf_rotary.attention_scaling, rel=1e-12) == pytest.approx(rs.concentration, rel=1e-12)
    if spec.mla is not None:
        hf_attention = module.DeepseekV3Attention(cfg, 0) if hasattr(module, "DeepseekV3Attention") else module.DeepseekV2Attention(cfg, 0)
        assert attention.softmax_scale == pytest.approx(hf_attention.scaling, rel=1e-12)
        assert attention.softmax_scale == pytest.approx(rs.softmax_factor / spec.head_size**0.5, rel=1e-12)


def _check(spec, model, config) -> None:
    from cost_models.params import mtp_params

    # MTP modules share the embedding and the output layer; their own parameters are counted apart
    assert sum(p.numel() for p in model.parameters()) == spec.params_total + mtp_params(spec).total
    attention = model.decoder.layers[0].self_attention
    if spec.mla is not None:
        # GPTModel builds no rotary table for MLA; the attention's own covers the rope dims only
        assert not hasattr(model, "rotary_pos_emb")
        rotary = attention.rotary_pos_emb
    elif spec.position_embedding == "rope":
        rotary = model.rotary_pos_emb
    if spec.position_embedding == "rope":
        # float32 in both; the Llama-3.1 and YaRN scalings are written differently in the two
        # (smoothing order, the ramp's arithmetic), so equal to float32 rounding.
        torch.testing.assert_close(_megatron_inv_freq(rotary), _hf_inv_freq(spec), rtol=1e-6, atol=0)
        if spec.rope_scaling is not None and spec.rope_scaling.kind == "yarn":
            _check_yarn(spec, rotary, attention)
    else:
        assert not hasattr(model, "rotary_pos_emb")
    kind = {"rmsnorm": torch.nn.RMSNorm, "layernorm": torch.nn.LayerNorm}[spec.norm]
    norms = [m for m in model.modules() if isinstance(m, (torch.nn.RMSNorm, torch.nn.LayerNorm))]
    latent_norms = 0 if spec.mla is None else 1 + (spec.mla.q_lora_rank is not None)
    per_layer = 2 + (2 if spec.qk_norm else 0) + latent_norms
    # + the final norm; each MTP module: its layer's norms, enorm, hnorm and its final norm
    assert len(norms) == (spec.num_layers + spec.mtp_layers) * per_layer + 1 + 3 * spec.mtp_layers
    assert all(type(n) is kind and n.eps == spec.norm_eps for n in norms)
    assert config.layernorm_zero_centered_gamma is spec.zero_centered_norm
    if spec.mla is not None:
        a = spec.mla
        assert isinstance(attention.kv_layernorm, kind) and attention.kv_layernorm.normalized_shape == (a.kv_lora_rank,)
        assert (config.q_lora_rank, config.kv_lora_rank) == (a.q_lora_rank, a.kv_lora_rank)
        assert (config.qk_head_dim, config.qk_pos_emb_head_dim, config.v_head_dim) == (a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim)
    else:
        assert isinstance(attention.q_layernorm, kind) is spec.qk_norm and isinstance(attention.k_layernorm, kind) is spec.qk_norm
    if spec.qk_norm:
        assert attention.q_layernorm.normalized_shape == (spec.head_size,)
    act = "quick_gelu" if spec.swiglu_limit else {"swiglu": "silu", "gelu": "gelu", "squared_relu": "squared_relu"}[spec.mlp]
    assert config.activation_func.__name__ == act
    assert (config.activation_func_clamp_value, config.glu_linear_offset) == ((spec.swiglu_limit, 1.0) if spec.swiglu_limit else (None, 0.0))
    moe_layers = [layer.mlp for layer in model.decoder.layers if hasattr(layer.mlp, "router")]
    assert len(moe_layers) == (0 if spec.moe is None else sum(spec.is_moe_layer(i) for i in range(spec.num_layers)))
    for mlp in moe_layers:
        router, moe = mlp.router, spec.moe
        assert router.weight.shape == (moe.num_experts, spec.hidden_size)
        balancing = "seq_aux_loss" if moe.sequence_aux_loss else "aux_loss"
        assert (router.topk, router.score_function, router.routing_type) == (moe.top_k, moe.router_score, balancing)
        assert router.config.moe_router_pre_softmax is (moe.router_score == "softmax" and not moe.renormalize_top_k)
        assert router.config.moe_aux_loss_coeff == moe.aux_loss_coef > 0
        assert router.config.moe_z_loss_coeff == (moe.z_loss_coef or None)
        assert router.config.moe_expert_capacity_factor == moe.capacity_factor
        assert (mlp.shared_experts is not None) is bool(moe.num_shared_experts)
        assert router.config.moe_router_topk_scaling_factor == (moe.routed_scaling_factor if moe.routed_scaling_factor != 1 else None)
        assert router.enable_expert_bias is moe.expert_bias
        assert (router.config.moe_router_num_groups, router.config.moe_router_group_topk) == (moe.router_groups, moe.router_group_top_k)


# Presets with what no Megatron flag says (soft-capping, chunked attention, …) are refused by the
# launch (planner/launch/megatron.py megatron_blocker; tests/test_launch.py). Hybrid Mamba presets
# run pretrain_hybrid.py, whose MambaMixer needs the mamba_ssm CUDA package (Megatron-LM@d98e8a64
# megatron/core/ssm/mamba_mixer.py L206-209 raises ImportError without it); tests/test_hybrid.py
# checks their emitted flags.
MEGATRON_PRESETS = sorted(n for n, m in presets.models().items() if megatron_blocker(m) is None and m.hybrid_pattern is None)


@pytest.mark.parametrize("name", MEGATRON_PRESETS)
def test_megatron_builds_the_planned_preset(name, tmp_path, model_parallel):
    spec, argv = _emitted(name, tmp_path)
    model, config = _build(argv)
    _check(spec, model, config)


@pytest.mark.parametrize("fixture", HF_FIXTURES)
def test_megatron_builds_the_planned_hf_fixture(fixture, tmp_path, model_parallel):
    spec, argv = _emitted(str(HF / fixture), tmp_path)
    model, config = _build(argv)
    _check(spec, model, config)


@pytest.mark.parametrize("fixture", sorted(MEGATRON_REFUSED))
def test_megatron_refuses_the_fixtures_it_cannot_say(fixture, tmp_path):
    from cost_models.errors import SpecError

    with pytest.raises(SpecError, match=MEGATRON_REFUSED[fixture]):
        _emitted(str(HF / fixture), tmp_path)


def test_megatron_vocabulary_padding_at_tp(tmp_path, model_parallel):
    """gpt2's 50257 tokens (odd) cannot split over tp = 2: Megatron pads to a multiple of 128·2
    (vocab_size_with_padding, build_tokenizer.py L133-146), 50432 rows, and the built model has
    those 175 rows more than the planned one (tied embeddings: once)."""
    spec, argv = _emitted("gpt2", tmp_path, tp=2)
    assert argv[argv.index("--padded-vocab-size") + 1] == "50432"
    model, _ = _build(argv)
    assert sum(p.numel() for p in model.parameters()) == spec.params_total + (50432 - 50257) * spec.hidden_size


def test_megatron_builds_windowed_layers_with_sinks(tmp_path, model_parallel):
    """A spec with a 128-token window on even layers and attention sinks: megatron-core builds one
    learned sink logit per head in every layer (softmax_type learnable) and gives the window to the
    even layers' core attention only (is_layer_window_attention; the local DotProductAttention hands
    it to its FusedScaleMaskSoftmax, dot_product_attention.py L93-109 in 0.16.1), as the spec counts."""
    path = tmp_path / "swa.toml"
    path.write_text("num_layers = 4\nhidden_size = 256\nffn_hidden_size = 512\nnum_attention_heads = 8\nnum_kv_heads = 2\n"
                    "vocab_size = 1024\nmax_position_embeddings = 1024\nsliding_window = 128\nfull_attention_every = 2\n"
                    "attention_sinks = true\n")
    spec, argv = _emitted(str(path), tmp_path)
    # the local DotProductAttention allocates the sink logits on torch.cuda.current_device()
    # (dot_product_attention.py L126-135 in 0.16.1); without CUDA the meta device stands in
    with mock.patch.object(torch.cuda, "current_device", lambda: "meta"):
        model, config = _build(argv)
    assert sum(p.numel() for p in model.parameters()) == spec.params_total
    windows = [layer.self_attention.core_attention.scale_mask_softmax.window_size for layer in model.decoder.layers]
    assert [w is not None for w in windows] == [spec.is_local_layer(i) for i in range(4)] == [True, False, True, False]
    assert windows[0] == (127, 0)
