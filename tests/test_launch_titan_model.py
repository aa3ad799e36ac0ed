"""torchtitan round trip: the flavour an emitted 0.3.x command names builds the planned model.

train.sh's command (`--module M --config C`, or torchtitan_plan.py's function, plus overrides) is parsed by torchtitan 0.3.0's own
ConfigManager in a subprocess (tests/launch_titan_parse.py, as tests/test_launch_parsers.py does),
and the model of the parsed config is built on the meta device as torchtitan's trainer builds it.
Its parameter count equals the planner's, its rope (theta, Llama-3.1 scaling, rotary dims) and
norms (RMSNorm epsilon, q/k norms) are the spec's, and its router (experts, top-k, softmax,
top-k renormalisation) is the spec's; its load balancing is torchtitan's auxiliary-loss-free one,
which launch's README says.

Models no flavour equals get a model config generated with torchtitan's llama3 builders when its
modules can hold them (Llama 2 7B/13B/70B, Mistral 7B), and are refused otherwise. Every HF fixture
of tests/data/hf is launched too: those torchtitan can hold build their model, the others are refused.

The flavour table itself: every llama3 / qwen3 flavour of torchtitan 0.3.0 with a planner preset of
the same name is built, and is in planner/launch/torchtitan.py's TITAN_MODELS exactly when it
equals the preset in those fields (qwen3 235B-A22B does not: rope theta 5,000,000 against the
1,000,000 of Qwen3-235B-A22B's config.json).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launch_cases import Case, after, run_train_sh, write
from planner import presets
from planner.launch.torchtitan import TITAN_MODELS, _shape, generation_blocker, without_idle_window
from planner.loaders import load_model

HERE = Path(__file__).parent
# torchtitan 0.3.0 flavours and the planner presets of the same models (torchtitan/models/llama3/
# __init__.py llama3_configs, qwen3/__init__.py qwen3_configs).
FLAVOURS = {
    "llama-3.1-8b": ("llama3", "8B"), "llama-3.1-70b": ("llama3", "70B"), "llama-3.1-405b": ("llama3", "405B"),
    "qwen3-30b-a3b": ("qwen3", "30B-A3B"), "qwen3-235b-a22b": ("qwen3", "235B-A22B"),
}


HF = HERE / "data" / "hf"
SEQ_LEN = 4096  # Case's default, the launch's


def _titan_kind(spec) -> str | None:
    """How a 0.3 launch trains the model: a TITAN_MODELS preset of its shape, "generated" (llama3
    builders), or None (refused)."""
    known = presets.models()
    same = [e.preset for e in TITAN_MODELS if _shape(known[e.preset]) == _shape(spec)]
    if same:
        return same[0]
    return "generated" if generation_blocker(without_idle_window(spec, SEQ_LEN)) is None else None


# Presets no flavour equals whose llama3 model config torchtitan_plan.py generates (0.3): Llama 2, Mistral 7B.
GENERATED = sorted(n for n, m in presets.models().items() if _titan_kind(m) == "generated")
# Every HF fixture torchtitan trains; the others are refused (test_fixtures_torchtitan_cannot_hold_are_refused).
FIXTURES = {p.name: _titan_kind(load_model(str(p))) for p in sorted(HF.iterdir()) if p.is_dir()}


def _run(jobs: list[dict]) -> list[dict]:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    result = subprocess.run([sys.executable, str(HERE / "launch_titan_parse.py")], input=json.dumps(jobs),
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return [r["built"] for r in json.loads(result.stdout)]


def _equal(spec, built: dict) -> list[str]:
    """The fields where torchtitan's model differs from the spec (empty when it is the model)."""
    diff = []
    if built["params"] != spec.params_total:
        diff.append(f"params {built['params']} != {spec.params_total}")
    rs = spec.rope_scaling
    rope = [spec.rope_theta, "llama" if rs else "none", rs.factor if rs else None, rs.low_freq_factor if rs else None,
            rs.high_freq_factor if rs else None, rs.original_max_position_embeddings if rs else None,
            int(spec.head_size * spec.rotary_fraction)]
    got = built["ropes"]
    if len(got) != 1 or [got[0][0], got[0][1], *(got[0][2:6] if rs else [None] * 4), got[0][6]] != rope:
        diff.append(f"rope {got} != {rope}")
    if built["norms"] != [["RMSNorm", spec.norm_eps]]:
        diff.append(f"norms {built['norms']} != RMSNorm eps {spec.norm_eps}")
    if built["qk_norm"] is not spec.qk_norm:
        diff.append(f"qk_norm {built['qk_norm']}")
    if spec.moe:
        moe = spec.moe
        router = [[moe.num_experts, moe.top_k, str(moe.router_score), moe.renormalize_top_k]]
        if [r[:4] for r in built["routers"]] != router or built["moe_layers"] != spec.num_layers - spec.num_dense_layers:
            diff.append(f"routers {built['routers']} over {built['moe_layers']} layers != {router}")
    return diff


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One torchtitan subprocess for the module: the emitted commands of TITAN_MODELS' 0.3 entries,
    then every flavour of FLAVOURS from the registry."""
    pytest.importorskip("torchtitan.config")
    tmp = tmp_path_factory.mktemp("titan")
    entries = [e for e in TITAN_MODELS if e.config]
    jobs, launches, extras, generated = [], [], [], []
    for entry in entries:
        launch = Case(f"rt-{entry.preset}", entry.preset, 8, "torchtitan", {"tp": 1, "zero": 3}).build()
        directory = write(launch, tmp / entry.preset)
        argv = after(run_train_sh(directory, tmp), "torchtitan.train")
        if entry.config_extras:
            # llama3_405b() builds a Float8LinearConverter, which imports torchao (not installed
            # here); its model is checked as the flavour below, torchtitan_plan.py by its text.
            extras.append((entry, argv, launch))
            continue
        jobs.append({"dir": str(directory), "args": argv, "layers": launch.report.job.model.num_layers, "build": True})
        launches.append((entry, argv, launch))
    # the generated presets, then every fixture torchtitan trains but Llama-3.1-405B (llama3_405b()'s
    # float8 import, as above; test_fixtures_launch_as_their_preset checks its plan function)
    fixtures = [f for f, kind in FIXTURES.items() if kind is not None and kind != "llama-3.1-405b"]
    for model in GENERATED + [str(HF / f) for f in fixtures]:
        name = Path(model).name
        launch = Case(f"rt-{name}", model, 8, "torchtitan", {"tp": 1, "zero": 3}).build()
        directory = write(launch, tmp / name)
        argv = after(run_train_sh(directory, tmp), "torchtitan.train")
        jobs.append({"dir": str(directory), "args": argv, "layers": launch.report.job.model.num_layers, "build": True})
        generated.append((model, argv, launch))
    out = _run(jobs + [{"flavour": list(f)} for f in FLAVOURS.values()])
    n = len(launches)
    return (list(zip(launches, out[:n])), dict(zip(FLAVOURS, out[len(jobs):])), extras,
            list(zip(generated, out[n:len(jobs)])))


def test_emitted_command_builds_the_planned_model(built):
    emitted, _, _, _ = built
    assert len(emitted) == 3
    for (entry, argv, launch), model in emitted:
        spec = presets.models()[entry.preset]
        assert (argv[argv.index("--module") + 1], argv[argv.index("--config") + 1]) == (entry.module, entry.config)
        assert _equal(spec, model) == [], entry.preset
        if spec.moe:
            # torchtitan's balancing is not the model's auxiliary loss; README.md says so.
            assert all(r[4] == 1e-3 for r in model["routers"])
            assert "auxiliary-loss-free" in launch.files["README.md"].text


def test_405b_plan_function_drops_the_registry_float8_and_compile(built):
    """llama3_405b() adds float8 and compile with async tp (config_registry.py L295-310); a bf16
    plan without compile gets the plain flavour and compile off."""
    _, flavours, extras, _ = built
    [(entry, argv, launch)] = extras
    assert (argv[argv.index("--module") + 1], argv[argv.index("--config") + 1]) == ("torchtitan_plan", "plan_config")
    plan = launch.files["torchtitan_plan.py"].text
    assert f"config = {entry.config}()" in plan and f"config.model_spec = model_registry({entry.flavor!r})" in plan
    assert "config.compile.enable = False" in plan and "config.compile.enable_async_tensor_parallel = False" in plan
    assert _equal(presets.models()[entry.preset], flavours[entry.preset]) == []


def test_titan_models_lists_exactly_the_flavours_that_equal_their_preset(built):
    _, flavours, _, _ = built
    known = presets.models()
    listed = {e.preset for e in TITAN_MODELS}
    verdicts = {name: _equal(known[name], model) for name, model in flavours.items()}
    assert {name for name, diff in verdicts.items() if not diff} == listed, verdicts
    assert verdicts["qwen3-235b-a22b"] == ["rope [[5000000.0, 'none', 8.0, 1.0, 4.0, 8192, 128]] != [1000000.0, 'none', None, None, None, None, 128]"]


def test_generated_model_config_builds_the_planned_model(built):
    """Llama 2 7B/13B/70B (rope theta 10000, no scaling, 32000 tokens) and mistral-7b (GQA, 32768 tokens):
    torchtitan_plan.py's generated config, parsed and built by torchtitan, is the planned model."""
    *_, generated = built
    assert GENERATED == ["llama-2-13b", "llama-2-70b", "llama-2-7b", "mistral-7b"]
    for (preset, argv, launch), model in generated[:len(GENERATED)]:
        assert (argv[argv.index("--module") + 1], argv[argv.index("--config") + 1]) == ("torchtitan_plan", "plan_config")
        assert "generates its model config" in launch.files["README.md"].text
        assert _equal(presets.models()[preset], model) == [], preset


def test_fixtures_launch_as_their_preset(built):
    """Each HF fixture torchtitan trains: its emitted command names the flavour of its preset (or a
    generated config) and torchtitan builds the fixture's model from it."""
    *_, generated = built
    assert {f: k for f, k in FIXTURES.items() if k} == {
        "Llama-3.1-405B": "llama-3.1-405b", "Llama-3.1-70B": "llama-3.1-70b", "Llama-3.1-8B": "llama-3.1-8b",
        "Mistral-7B-v0.1": "generated", "Qwen3-30B-A3B": "qwen3-30b-a3b"}
    entries = {e.preset: e for e in TITAN_MODELS}
    for (path, argv, launch), model in generated[len(GENERATED):]:
        kind = FIXTURES[Path(path).name]
        selected = (argv[argv.index("--module") + 1], argv[argv.index("--config") + 1])
        plain = (entries[kind].module, entries[kind].config) if kind in entries else None
        assert selected == (plain or ("torchtitan_plan", "plan_config")), path
        assert _equal(launch.report.job.model, model) == [], path
    big = Case("rt-405", str(HF / "Llama-3.1-405B"), 64, "torchtitan", {"tp": 8, "zero": 3}).build()
    assert "config = llama3_405b()" in big.files["torchtitan_plan.py"].text


def test_fixtures_torchtitan_cannot_hold_are_refused():
    from cost_models.errors import SpecError

    for fixture in (f for f, kind in FIXTURES.items() if kind is None):
        with pytest.raises(SpecError, match="torchtitan"):
            Case("x", str(HF / fixture), 8, "torchtitan", {"tp": 1, "zero": 3}).build()


def test_models_the_llama3_builders_cannot_hold_are_refused():
    from cost_models.errors import SpecError

    for preset, why in (("qwen2.5-7b", "linear biases"), ("mixtral-8x7b", "mixture of experts"), ("gpt2", "learned positions")):
        with pytest.raises(SpecError, match=f"{why}.*--framework megatron or deepspeed"):
            Case("x", preset, 8, "torchtitan", {"tp": 1, "zero": 3}, {"seq_len": 1024}).build()
