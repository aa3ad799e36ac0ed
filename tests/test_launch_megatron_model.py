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
# Fixtures whose architecture Megatron's flags can say (bloom has alibi and an embedding norm, refused).
HF_FIXTURES = ["Llama-3.1-8B", "Mistral-7B-v0.1", "Mixtral-8x7B-v0.1", "Qwen1.5-MoE-A2.7B", "Qwen2.5-7B", "Qwen3-30B-A3B", "gpt2"]
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

    config, extra = megatron_config(argv)
    # One rank holds everything; allocation on the meta device.
    config = dataclasses.replace(
        config, tensor_model_parallel_size=1, sequence_parallel=False, expert_model_parallel_size=1,
        expert_tensor_parallel_size=1, use_cpu_initialization=True, perform_initialization=False,
    )
    normalization = config.normalization
    if config.num_moe_experts:
        spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization=normalization)
    else:
        spec = get_gpt_layer_local_spec(config.num_moe_experts, config.moe_grouped_gemm, config.qk_layernorm,
                                        config.multi_latent_attention, normalization=normalization)
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
    with torch.device("meta"), stream, kernels:
        model = GPTModel(
            config=config,
            transformer_layer_spec=spec,
            vocab_size=int(one("--padded-vocab-size")),
            max_sequence_length=int(one("--max-position-embeddings")),
            share_embeddings_and_output_weights="--untie-embeddings-and-output-weights" not in extra,
            position_embedding_type=one("--position-embedding-type", "learned_absolute"),
            rotary_percent=float(one("--rotary-percent", 1.0)),
            rotary_base=int(one("--rotary-base", 10000)),
            rope_scaling="--use-rope-scaling" in extra,
        )
    return model, config


def _hf_inv_freq(spec):
    """The rotary inverse frequencies transformers computes for the spec's DeepSpeed config.json."""
    cfg = transformers.AutoConfig.for_model(**hf_config(spec))
    module = sys.modules[transformers.AutoModelForCausalLM._model_mapping[type(cfg)].__module__]
    rotary = next(getattr(module, n) for n in dir(module) if n.endswith("RotaryEmbedding"))
    return rotary(config=cfg).inv_freq


def _check(spec, model, config) -> None:
    assert sum(p.numel() for p in model.parameters()) == spec.params_total
    if spec.position_embedding == "rope":
        # float32 in both; the Llama-3.1 scaling is written differently in the two (smoothing order),
        # so equal to float32 rounding.
        torch.testing.assert_close(model.rotary_pos_emb.inv_freq.cpu(), _hf_inv_freq(spec), rtol=1e-6, atol=0)
    else:
        assert not hasattr(model, "rotary_pos_emb")
    kind = {"rmsnorm": torch.nn.RMSNorm, "layernorm": torch.nn.LayerNorm}[spec.norm]
    norms = [m for m in model.modules() if isinstance(m, (torch.nn.RMSNorm, torch.nn.LayerNorm))]
    per_layer = 2 + (2 if spec.qk_norm else 0)
    assert len(norms) == spec.num_layers * per_layer + 1  # + the final norm
    assert all(type(n) is kind and n.eps == spec.norm_eps for n in norms)
    attention = model.decoder.layers[0].self_attention
    assert isinstance(attention.q_layernorm, kind) is spec.qk_norm and isinstance(attention.k_layernorm, kind) is spec.qk_norm
    if spec.qk_norm:
        assert attention.q_layernorm.normalized_shape == (spec.head_size,)
    moe_layers = [layer.mlp for layer in model.decoder.layers if hasattr(layer.mlp, "router")]
    assert len(moe_layers) == (0 if spec.moe is None else sum(spec.is_moe_layer(i) for i in range(spec.num_layers)))
    for mlp in moe_layers:
        router, moe = mlp.router, spec.moe
        assert router.weight.shape == (moe.num_experts, spec.hidden_size)
        assert (router.topk, router.score_function, router.routing_type) == (moe.top_k, moe.router_score, "aux_loss")
        assert router.config.moe_router_pre_softmax is (moe.router_score == "softmax" and not moe.renormalize_top_k)
        assert router.config.moe_aux_loss_coeff == moe.aux_loss_coef > 0
        assert router.config.moe_z_loss_coeff == (moe.z_loss_coef or None)
        assert router.config.moe_expert_capacity_factor == moe.capacity_factor
        assert (mlp.shared_experts is not None) is bool(moe.num_shared_experts)


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
