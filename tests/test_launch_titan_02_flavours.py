"""torchtitan 0.2.x: the registry flavour torchtitan.toml names is the planned model.

0.2.2 builds its models from a flavour's TransformerModelArgs / Qwen3ModelArgs only (no generation),
and neither 0.2.2 (not installed) nor 0.3.0's registry (builder functions) can be imported to check
them. tests/data/torchtitan_022_flavours.toml holds each flavour's values as read at v0.2.2, with
their source lines and the rules 0.2.2's model.py applies to them; this module applies those rules
(the FFN width, head width, biases, norms, tying, rope scaling, MoE modules) to get the model's
shape and parameter count, and compares them with the planner's preset.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from cost_models.errors import LayoutError, SpecError
from launch_cases import V02, Case
from planner import presets
from planner.launch.torchtitan import NO_PIPELINING_02, TITAN_MODELS

TABLE = tomllib.loads((Path(__file__).parent / "data" / "torchtitan_022_flavours.toml").read_text())


def _llama3_ffn(dim: int, multiple_of: int, ffn_dim_multiplier: float | None) -> int:
    """llama3/model/model.py L332-336 (v0.2.2) with hidden_dim = 4·dim (L378)."""
    hidden = int(2 * (4 * dim) / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def model_of(flavour: dict) -> dict:
    """The model 0.2.2 builds from a flavour: its shape and parameter count (the table's rules)."""
    family = TABLE[flavour["module"]]
    a = family["default_args"] | flavour["args"]
    dim, layers, heads = a["dim"], a["n_layers"], a["n_heads"]
    kv = a.get("n_kv_heads") or heads
    out = {"layers": layers, "hidden": dim, "heads": heads, "kv_heads": kv, "vocab": a["vocab_size"],
           "rope_theta": float(a["rope_theta"]), "norm_eps": a["norm_eps"]}
    if flavour["module"] == "llama3":
        head = dim // heads
        ffn = _llama3_ffn(dim, a["multiple_of"], a.get("ffn_dim_multiplier"))
        out |= {"head_dim": head, "ffn": ffn, "qk_norm": False, "tied": False, "rope_scaling": a["rope_scaling"], "moe": None}
        mlp = 3 * dim * ffn
        qk = 0
    else:
        head = a["head_dim"]
        out |= {"head_dim": head, "qk_norm": a["qk_norm"], "tied": a["enable_weight_tying"], "rope_scaling": None}
        qk = 2 * head if a["qk_norm"] else 0
        if a["moe_enabled"]:
            m = family["default_moe"] | flavour["moe"]
            inter, experts = a["moe_inter_dim"], m["num_experts"]
            out |= {"ffn": None, "moe": {"experts": experts, "top_k": m["top_k"], "inter": inter,
                                         "score": m["score_func"], "renormalize": m["route_norm"],
                                         "scale": m["route_scale"], "shared": m["num_shared_experts"],
                                         "gate_bias": m["gate_bias"], "balance": m["load_balance_coeff"]}}
            mlp = (3 * experts * inter * dim + dim * experts + (experts if m["gate_bias"] else 0)
                   + 3 * dim * inter * m["num_shared_experts"])
        else:
            out |= {"ffn": a["hidden_dim"], "moe": None}
            mlp = 3 * dim * a["hidden_dim"]
    attention = dim * heads * head + 2 * dim * kv * head + heads * head * dim + qk
    per_layer = attention + mlp + 2 * dim  # attention_norm, ffn_norm
    embedding = a["vocab_size"] * dim
    out["params"] = embedding + layers * per_layer + dim + (0 if out["tied"] else embedding)
    return out


def preset_model(name: str) -> dict:
    """The same fields of the planner's preset."""
    s = presets.models()[name]
    rs = s.rope_scaling
    out = {"layers": s.num_layers, "hidden": s.hidden_size, "heads": s.num_attention_heads, "kv_heads": s.kv_heads,
           "vocab": s.vocab_size, "rope_theta": s.rope_theta, "norm_eps": s.norm_eps, "head_dim": s.head_size,
           "qk_norm": s.qk_norm, "tied": s.tie_embeddings,
           "rope_scaling": None if rs is None else {"factor": rs.factor, "low_freq_factor": rs.low_freq_factor,
                                                    "high_freq_factor": rs.high_freq_factor,
                                                    "original_max_position_embeddings": rs.original_max_position_embeddings},
           "params": s.params_total}
    if s.moe is None:
        out |= {"ffn": s.ffn_hidden_size, "moe": None}
    else:
        m = s.moe
        assert s.num_dense_layers == 0, name  # a 0.2.2 qwen3 MoE flavour has an MoE in every layer
        # torchtitan balances with a routing bias at rate 1e-3, not the model's auxiliary loss (TITAN_BALANCING)
        out |= {"ffn": None, "moe": {"experts": m.num_experts, "top_k": m.top_k, "inter": m.expert_ffn_hidden_size,
                                     "score": str(m.router_score), "renormalize": m.renormalize_top_k,
                                     "scale": m.routed_scaling_factor, "shared": m.num_shared_experts,
                                     "gate_bias": m.router_bias, "balance": 1e-3}}
    return out


def _diff(flavour: dict) -> dict:
    mine, theirs = model_of(flavour), preset_model(flavour["preset"])
    return {k: (mine[k], theirs[k]) for k in mine if mine[k] != theirs[k]}


FLAVOURS = {f["preset"]: f for f in TABLE["flavour"]}


def test_the_ffn_rule_gives_llama_3_1s_widths():
    """Hand-worked: 8B int(2·16384/3) = 10922, int(1.3·10922) = 14198, up to a multiple of 1024: 14336;
    70B 21845 → 28398 → 28672 (4096); 405B 43690 → int(1.2·43690) = 52428 → 53248 (4096)."""
    widths = {p: model_of(f)["ffn"] for p, f in FLAVOURS.items() if f["module"] == "llama3"}
    assert widths == {"llama-3.1-8b": 14336, "llama-3.1-70b": 28672, "llama-3.1-405b": 53248}


def test_each_named_flavour_is_its_preset():
    """Every 0.2 flavour TITAN_MODELS names builds the preset: shape, rope, eps, router, and the
    parameter count by the planner (8,030,261,248 for 8B; exact, both are integer sums)."""
    for entry in TITAN_MODELS:
        flavour = FLAVOURS[entry.preset]
        assert (flavour["module"], flavour["flavor"]) == (entry.module, entry.flavor)
        assert _diff(flavour) == {}, entry.preset
    assert model_of(FLAVOURS["llama-3.1-8b"])["params"] == 8_030_261_248
    assert model_of(FLAVOURS["qwen3-30b-a3b"])["params"] == presets.models()["qwen3-30b-a3b"].params_total


def test_a_flavour_that_differs_from_its_preset_is_not_named():
    """qwen3 235B-A22B has rope theta 5,000,000 in 0.2.2 (Qwen3-235B-A22B: 1,000,000): not in TITAN_MODELS,
    and a 0.2 launch of the preset is refused rather than naming it."""
    assert _diff(FLAVOURS["qwen3-235b-a22b"]) == {"rope_theta": (5_000_000.0, 1_000_000.0)}
    assert {e.preset for e in TITAN_MODELS} == {p for p, f in FLAVOURS.items() if not _diff(f)}
    with pytest.raises(SpecError, match="0.2 takes a flavour only"):
        Case("x", "qwen3-235b-a22b", 64, "torchtitan", {"tp": 1, "ep": 8, "zero": 3}, {}, V02).build()


@pytest.mark.parametrize("preset", [e.preset for e in TITAN_MODELS])
def test_the_02_toml_names_the_flavour(preset):
    flavour = FLAVOURS[preset]
    layout = {"tp": 1, "ep": 8, "zero": 3} if flavour.get("moe") else {"tp": 8, "zero": 3}
    gpus = 16 if preset != "llama-3.1-405b" else 64
    launch = Case("x", preset, gpus, "torchtitan", layout, {}, V02).build()
    doc = tomllib.loads(launch.files["torchtitan.toml"].text)
    assert doc["model"] == {"name": flavour["module"], "flavor": flavour["flavor"]}


def test_a_pipeline_is_refused_where_0_2_2_has_no_pipelining():
    """qwen3's 0.2.2 TrainSpec has pipelining_fn None and the trainer raises with pp > 1 (table header)."""
    # the launch's list is the table's: the modules whose 0.2.2 TrainSpec has no pipelining_fn
    assert NO_PIPELINING_02 == {m for m in ("llama3", "qwen3") if not TABLE[m]["pipelining"]} == {"qwen3"}
    with pytest.raises(LayoutError, match=r"torchtitan 0.2.*qwen3.*pipelin.*--pp 1.*--torchtitan-version 0.3"):
        Case("x", "qwen3-30b-a3b", 16, "torchtitan", {"tp": 1, "pp": 2, "ep": 8, "zero": 3}, {}, V02).build()
