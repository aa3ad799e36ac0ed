"""The model a launch trains is the model that was planned: the emitted files, read back by the
framework's own configuration code, give the same architecture.

- DeepSpeed: config.json is read by transformers' AutoConfig and the model built on the meta
  device from it; its parameter count equals the planner's, and its rope / norm / router settings
  equal the spec's and, for the Hugging Face fixtures, the original config.json's.
- DeepSpeed recompute: train.py turns gradient checkpointing on exactly when the plan recomputes.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from launch_cases import BY_NAME
from planner import presets
from cost_models.errors import SpecError
from planner.launch.hf_config import hf_config
from planner.loaders import load_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

HF_DIRS = sorted(p for p in (Path(__file__).parent / "data" / "hf").iterdir() if p.is_dir())
PRESETS = sorted(presets.models())


def _settings(cfg) -> dict:
    """The rope / norm / router settings of a transformers config, as its modules read them."""
    rope = dict(getattr(cfg, "rope_parameters", None) or {})
    rope = dict(rope.get("full_attention", rope))  # Gemma 3: one rope per layer type; the full layers' carries the scaling
    out = {
        "rope_theta": rope.get("rope_theta", getattr(cfg, "rope_theta", None)),
        "rope_type": rope.get("rope_type"),
        "factor": rope.get("factor"),
        "partial_rotary_factor": rope.get("partial_rotary_factor"),
        "eps": next((getattr(cfg, k) for k in ("rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps", "norm_eps") if hasattr(cfg, k)), None),
    }
    for key in ("num_experts_per_tok", "router_aux_loss_coef", "norm_topk_prob", "num_local_experts", "num_experts"):
        if hasattr(cfg, key):
            out[key] = getattr(cfg, key)
    return out


def _build(config: dict):
    cfg = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    return cfg, sum(p.numel() for p in model.parameters())


def _without_mtp(spec):
    """transformers builds no MTP module: a spec with MTP layers is refused for DeepSpeed, the same
    spec without them is emitted."""
    if not spec.mtp_layers:
        return spec
    with pytest.raises(SpecError, match="builds no multi-token prediction module"):
        hf_config(spec)
    return spec.model_copy(update={"mtp_layers": 0})


@pytest.mark.parametrize("name", PRESETS)
def test_deepspeed_config_json_builds_the_planned_model(name):
    spec = _without_mtp(presets.models()[name])
    cfg, params = _build(hf_config(spec))
    assert params == spec.params_total
    s = _settings(cfg)
    if spec.position_embedding == "rope":
        assert s["rope_theta"] == spec.rope_theta
        assert s["rope_type"] in ((spec.rope_scaling.kind,) if spec.rope_scaling else ("default", None))
        assert s["factor"] == (spec.rope_scaling.factor if spec.rope_scaling else None)
    assert s["eps"] == spec.norm_eps
    if spec.moe and spec.mla is None and spec.hybrid_pattern is None:
        assert s["num_experts_per_tok"] == spec.moe.top_k and s["router_aux_loss_coef"] == spec.moe.aux_loss_coef > 0
        assert cfg.output_router_logits  # the HF MoE models add the balancing loss only then
    elif spec.moe:  # transformers' DeepSeek and NemotronH models route (scaled) but add no balancing loss
        assert s["num_experts_per_tok"] == spec.moe.top_k and cfg.routed_scaling_factor == spec.moe.routed_scaling_factor


@pytest.mark.parametrize("path", HF_DIRS, ids=[p.name for p in HF_DIRS])
def test_hf_fixture_round_trips_with_its_settings(path):
    """Fixture -> spec -> emitted config.json: the same settings as the fixture, the same parameters."""
    original = transformers.AutoConfig.from_pretrained(str(path))
    spec = _without_mtp(load_model(str(path)))
    cfg, params = _build(hf_config(spec))
    assert params == spec.params_total
    ours, theirs = _settings(cfg), _settings(original)
    if spec.mla is not None:  # the fixtures' YaRN scaling is not kept (planner/hf.py _deepseek)
        for key in ("rope_type", "factor"):
            ours.pop(key), theirs.pop(key)
    if spec.position_embedding == "none":  # rotary keys a config may carry that no module reads (Nemotron 3's rope_theta)
        for key in ("rope_theta", "rope_type", "factor", "partial_rotary_factor"):
            ours.pop(key), theirs.pop(key)
    assert ours == theirs


def _recompute_calls(tree: ast.Module) -> list[ast.If]:
    """`if args.recompute == "full":` blocks that call model.gradient_checkpointing_enable()."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "args.recompute" in ast.unparse(node.test) and "'full'" in ast.unparse(node.test):
            calls = [c for c in ast.walk(node) if isinstance(c, ast.Call) and ast.unparse(c.func) == "model.gradient_checkpointing_enable"]
            if calls:
                found.append(node)
    return found


@pytest.mark.parametrize("name, recompute", [("deepspeed-zero3-full", "full"), ("deepspeed-zero2-gpt", "none")])
def test_deepspeed_recompute_is_switched_on(name, recompute):
    files = BY_NAME[name].build().files
    tree = ast.parse(files["train.py"].text)
    assert len(_recompute_calls(tree)) == 1
    # the model built from config.json is the one checkpointed, before deepspeed.initialize takes it
    text = files["train.py"].text
    assert text.index("from_config(config") < text.index("gradient_checkpointing_enable") < text.index("deepspeed.initialize(")
    assert f"  --recompute {recompute} \\" in files["train.sh"].text.splitlines()
    assert "activation_checkpointing" not in json.loads(files["ds_config.json"].text)  # nothing that switches nothing on
