"""Parameter counts: exact against published totals, against Hugging Face transformers' own modules
built on the meta device from the same config.json, against our torch modules, and against
Narayanan et al. 2021 eq. (2)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from cost_models.model_spec import ModelSpec
from planner import presets
from planner.loaders import load_model

DATA = Path(__file__).parent / "data"
HF_DIRS = sorted(p for p in (DATA / "hf").iterdir() if (p / "config.json").is_file())
KNOWN = tomllib.loads((DATA / "known_param_counts.toml").read_text())


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_published_totals_exact(name):
    entry = KNOWN[name]
    # Some published totals count saved non-parameter buffers (Llama 2's rotary inv_freq); the data
    # file states how many elements those are.
    expected = entry["params"] - entry.get("non_parameter_elements", 0)
    if name in presets.models():
        assert presets.models()[name].params_total == expected
    if "fixture" in entry:
        assert load_model(str(DATA / "hf" / entry["fixture"])).params_total == expected


def test_issue_examples_exact():
    assert presets.models()["llama-3.1-70b"].params_total == 70_553_706_496
    assert presets.models()["llama-3.1-405b"].params_total == 405_853_388_800
    assert presets.models()["mixtral-8x7b"].params_total == 46_702_792_704


torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _hf_model(path: Path):
    cfg = transformers.AutoConfig.from_pretrained(str(path))
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(cfg)


def _expert_params_per_layer(model) -> list[int]:
    """Parameters of all routed experts in each MoE layer of a transformers model."""
    out = []
    for name, module in model.named_modules():
        if name.endswith(".experts"):
            out.append(sum(p.numel() for p in module.parameters()))
    return out


@pytest.mark.parametrize("path", HF_DIRS, ids=[p.name for p in HF_DIRS])
def test_hf_config_matches_transformers_modules(path):
    spec = load_model(str(path))
    model = _hf_model(path)
    assert spec.params_total == sum(p.numel() for p in model.parameters())
    if spec.moe:
        # active = total minus the (E - k)/E share of every MoE layer's routed experts
        m = spec.moe
        inactive = sum(n * (m.num_experts - m.top_k) // m.num_experts for n in _expert_params_per_layer(model))
        assert spec.params_active == spec.params_total - inactive


# At least six architectures, dense and MoE, tied and untied, learned and rotary positions.
OUR_MODULES = [
    "gpt2", "megatron-gpt-1.7b", "llama-3.1-8b", "qwen2.5-7b", "mistral-7b", "mixtral-8x7b",
    "qwen1.5-moe-a2.7b", "qwen3-30b-a3b", "gemma-3-1b", "gpt-oss-20b", "deepseek-v2-lite", "minitron-4b",
]


@pytest.mark.parametrize("name", OUR_MODULES)
def test_torch_modules_match_spec(name):
    from planner.torch_model import Transformer

    spec = presets.models()[name]
    with torch.device("meta"):
        model = Transformer(spec, max_seq=16)
    assert sum(p.numel() for p in model.parameters()) == spec.params_total


@pytest.mark.parametrize("path", [p for p in HF_DIRS if p.name in ("bloom-560m", "pythia-1.4b")], ids=lambda p: p.name)
def test_torch_modules_match_hf_only_architectures(path):
    from planner.torch_model import Transformer

    spec = load_model(str(path))
    with torch.device("meta"):
        model = Transformer(spec, max_seq=16)
    assert sum(p.numel() for p in model.parameters()) == spec.params_total


@pytest.mark.parametrize("name", [n for n in presets.models() if n.startswith("megatron-gpt")])
def test_narayanan_eq2(name):
    # Narayanan et al. 2021 eq. (2): P = 12·l·h²·(1 + 13/(12h) + (V + s)/(12·l·h)), which leaves out
    # the final LayerNorm (2h); with s = max positions (2048) and V = 51200.
    spec: ModelSpec = presets.models()[name]
    l, h, v, s = spec.num_layers, spec.hidden_size, spec.vocab_size, spec.max_position_embeddings
    assert spec.params_total == 12 * l * h * h + 13 * l * h + (v + s) * h + 2 * h


def test_a_copied_spec_derives_its_numbers_again():
    """Cached properties (parameter count, layer kinds) follow the copy's fields, not the original's."""
    from planner import presets

    m = presets.models()["mixtral-8x7b"]
    assert m.params_total and m.moe_layer_ids  # cache them on the original
    two = m.model_copy(update={"num_layers": 2})
    assert two.moe_layer_ids == (0, 1)
    assert two.params_total < m.params_total
    assert two.params_total == ModelSpec.model_validate({**m.model_dump(), "num_layers": 2}).params_total


def test_mtp_module_counted_apart():
    """DeepSeek-V3's MTP module is not in transformers' model (params_total equals its count, above);
    mtp_params counts it as DeepSeek's checkpoint holds it under model.layers.61: a decoder layer like
    the last one (transformers' DeepseekV3DecoderLayer built with layer_idx 61, an MoE layer), enorm,
    hnorm and shared_head.norm (RMSNorm h) and eh_proj (2h -> h, no bias); embedding and output
    layer shared (DeepSeek's README_WEIGHTS.md)."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer

    from cost_models.params import mtp_params

    spec = load_model(str(DATA / "hf" / "DeepSeek-V3"))
    cfg = transformers.AutoConfig.from_pretrained(str(DATA / "hf" / "DeepSeek-V3"))
    with torch.device("meta"):
        layer = DeepseekV3DecoderLayer(cfg, layer_idx=cfg.num_hidden_layers)
    h = cfg.hidden_size
    expected = sum(p.numel() for p in layer.parameters()) + 3 * h + 2 * h * h
    assert spec.mtp_layers == 1
    assert mtp_params(spec).total == expected
    # DeepSeek's README_WEIGHTS.md: 671B main model, 11.5B unique MTP parameters besides the shared embedding
    # and head; the checkpoint's "685B" adds both and a second copy of embedding and head (0.93B each).
    assert spec.params_total // 10**9 == 671 and 11.5e9 < mtp_params(spec).total < 11.7e9


@pytest.mark.parametrize("name", ["nemotron-h-8b", "nemotron-h-56b", "nemotron-3-nano-30b-a3b"])
def test_nemotron_h_presets_match_transformers(name):
    # 8B: 8,100,852,736, 56B: 56,324,350,464 and Nemotron 3 Nano: 31,577,937,344 parameters, each layer
    # kind counted by transformers' NemotronHForCausalLM (v5.23.0; v5.24.0 for the MoE layers) on the
    # meta device.
    from planner.launch.hf_config import hf_config

    spec = presets.models()[name]
    with torch.device("meta"):  # the config.json DeepSpeed's launch writes for the preset
        model = transformers.NemotronHForCausalLM(transformers.AutoConfig.for_model(**hf_config(spec)))
    assert spec.params_total == sum(p.numel() for p in model.parameters())
    mixer = next(m for m in model.modules() if type(m).__name__ == "NemotronHMamba2Mixer")
    from cost_models.params import mamba_params

    assert mamba_params(spec).total == sum(p.numel() for p in mixer.parameters())
