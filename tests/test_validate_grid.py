"""The layout grid: every layout the frameworks' rules admit on at most 8 ranks, over the axes
`plan` chooses (framework; model family: dense llama, GPT-2 style, MoE; ep and etp; tp with and
without sp; pp with vpp and uneven ends; dp with each sharding, ZeRO 0-3 and HSDP; cp; recompute
none, selective, full and full on the first k layers), either trains like one process or is
refused by validate with one of its stated reasons (slices.REFUSALS).

How the set is chosen. Every combination of the axis values below is resolved by
cost_models.rules in its own framework (the rules every plan satisfies; the search's own bounds,
such as at least 1024 tokens per cp rank or HSDP groups of 8 or more, are performance heuristics
and are left out so that cp and HSDP appear at this scale). Each legal combination is then
resolved by validate (slices.native_job): it runs, or validate refuses it. The runs are chosen to
cover every pair of axis values that some runnable combination holds (pairwise coverage), by
greedy set cover in order of the world size a pair needs: first the pairs only 8 ranks can hold
(HSDP's 4 data-parallel ranks with tp or pp), with 8-rank runs, then those 4 ranks can hold, with
4-rank runs, then the rest with runs of the launches already needed, preferring a combination
whose emitted job (run description) is already chosen, since Megatron and DeepSpeed plans run as
PyTorch-native jobs and several plans emit the same job. Pairs that only refused combinations
hold are covered by refused combinations (checked without running), and each refusal rule is hit
at least once. All runs of one world size go in one torchrun launch.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from cost_models.errors import SpecError
from cost_models.hardware import Cluster
from cost_models.layout import Layout
from cost_models.model_spec import ModelSpec
from cost_models.rules import resolve
from cost_models.training import TrainingSpec
from planner import presets
from planner.validate.runner import emit, launch
from planner.validate.slices import REFUSALS, job_doc, native_job, run_doc
from tests.test_validate_parallel import LR, TINY, TINY_GPT, TINY_HYBRID, TINY_MOE, _check

CLUSTER = presets.clusters()["dgx-h100"]
MODELS = {"llama": TINY, "gpt": TINY_GPT, "moe": TINY_MOE}
TRAINING = {"seq_len": 32, "global_batch_size": 8}
MAX_RANKS = 8
# one optimizer step per plan: the loss, the gradients and the weights after the update are compared
# (test_validate_parallel.py runs two steps for the layouts it names); a second step would double
# the grid's time on CI's 2 cores
STEPS, WARMUP = 1, 0
# axis -> value -> layout fields (framework and model are not layout fields)
AXES: dict[str, dict[str, dict]] = {
    "framework": {"megatron": {}, "torchtitan": {}, "deepspeed": {}},
    "model": {"llama": {}, "gpt": {}, "moe": {}},
    "experts": {"ep1": {}, "ep2": {"ep": 2}, "ep2_etp2": {"ep": 2, "etp": 2}},
    "tp": {"tp1": {}, "tp2_sp": {"tp": 2, "sp": True}, "tp2": {"tp": 2, "sp": False}},
    "pp": {"pp1": {}, "pp2": {"pp": 2}, "pp2_vpp2": {"pp": 2, "vpp": 2},
           "pp2_uneven": {"pp": 2, "pp_first_stage_layers": 1, "pp_last_stage_layers": 3}},
    "cp": {"cp1": {}, "cp2": {"cp": 2}},
    "dp": {"dp1": {"dp": 1}, "zero0": {"dp": 2, "zero": 0}, "zero1": {"dp": 2, "zero": 1}, "zero2": {"dp": 2, "zero": 2},
           "zero3": {"dp": 2, "zero": 3}, "hsdp": {"dp": 4, "dp_shard": 2, "zero": 3}},
    "recompute": {"none": {}, "selective": {"recompute": "selective"}, "full": {"recompute": "full"},
                  "full_1": {"recompute": "full", "recompute_layers": 1}},
}
NAMES = tuple(AXES)
# refusal rules no axis above reaches: one case each, (model, training, layout)
BEYOND_AXES = {
    "fp8": ("llama", {"framework": "torchtitan", "precision": "fp8"}, {}),
    "compile": ("llama", {"framework": "torchtitan", "compile": True}, {}),
    "alibi": ("alibi", {"framework": "megatron"}, {}),
    "mtp": ("mtp", {"framework": "megatron"}, {}),
    "mla_tp_cp": ("mla", {"framework": "torchtitan"}, {"tp": 2}),
    "tp_sinks": ("sinks", {"framework": "megatron"}, {"tp": 2}),
    "mamba_tp": ("hybrid", {"framework": "megatron"}, {"tp": 2}),
    "mamba_cp": ("hybrid", {"framework": "megatron"}, {"cp": 2}),
    "hybrid_selective": ("hybrid", {"framework": "megatron"}, {"recompute": "selective"}),
    "tp_replicated_vocab": ("llama", {"framework": "torchtitan", "tp_replicated_vocab": True}, {"tp": 2}),
}


def _layout(combo: tuple[str, ...]) -> dict:
    lay: dict = {}
    for axis, value in zip(NAMES[2:], combo[2:]):
        lay.update(AXES[axis][value])
    return lay


def _world(lay: dict) -> int:
    return lay.get("tp", 1) * lay.get("pp", 1) * lay.get("cp", 1) * lay["dp"]


@functools.cache
def grid() -> dict[tuple[str, ...], tuple[int, object]]:
    """Legal combination -> (ranks, the job validate runs, or the SpecError it refuses with)."""
    out = {}
    for combo in itertools.product(*(list(AXES[a]) for a in NAMES)):
        lay = _layout(combo)
        ranks = _world(lay)
        if ranks > MAX_RANKS:
            continue
        model, training = MODELS[combo[1]], {"framework": combo[0], **TRAINING}
        try:
            resolve(model, Cluster(spec=CLUSTER, num_gpus=ranks), TrainingSpec(**training), Layout(**lay))
        except (SpecError, ValidationError):
            continue  # not a plan: its framework's rules reject it
        try:
            out[combo] = (ranks, native_job(model, CLUSTER, ranks, training, lay)[0])
        except SpecError as e:
            out[combo] = (ranks, e)
    return out


@functools.cache
def _pairs(combo: tuple[str, ...]) -> frozenset[tuple]:
    return frozenset((NAMES[i], combo[i], NAMES[j], combo[j]) for i, j in itertools.combinations(range(len(combo)), 2))


@functools.cache
def _key(combo: tuple[str, ...]) -> str:
    """The emitted job's run description: two plans with the same one run the same job."""
    return json.dumps(run_doc(grid()[combo][1], name="x", steps=STEPS, warmup=WARMUP), sort_keys=True)


@functools.cache
def chosen() -> tuple[tuple[tuple[str, ...], ...], tuple[tuple[str, ...], ...]]:
    """(runnable combinations to run, refused combinations to check), as the docstring says. A
    run covers the pairs of every plan that emits its job."""
    g = grid()
    refused = [c for c, (_, job) in g.items() if isinstance(job, SpecError)]
    jobs: dict[str, tuple[int, set, tuple[str, ...]]] = {}  # run description -> (ranks, pairs, first plan)
    for c, (ranks, job) in g.items():
        if not isinstance(job, SpecError):
            jobs.setdefault(_key(c), (ranks, set(), c))[1].update(_pairs(c))
    need: dict[tuple, int] = {}  # pair -> fewest ranks of a runnable plan holding it
    for ranks, pairs, _ in jobs.values():
        for p in pairs:
            need[p] = min(need.get(p, MAX_RANKS + 1), ranks)
    uncovered = set(need)
    picked: list[tuple[str, ...]] = []
    for world in sorted(set(need.values()), reverse=True):
        todo = {p for p in uncovered if need[p] == world}
        # pairs one rank can hold go into the 2-rank launch where a 2-rank job holds them (one launch less)
        sizes = [2, 1] if world == 1 and any(g[c][0] == 2 for c in picked) else [world]
        while todo:
            for size in sizes:
                _, pairs, first = max((v for v in jobs.values() if v[0] == size),
                                      key=lambda v: (len(v[1] & todo), len(v[1] & uncovered)))
                if pairs & todo:
                    break
            picked.append(first)
            uncovered -= pairs
            todo -= pairs
    only_refused = set().union(*(_pairs(c) for c in refused)) - set(need)
    checks: list[tuple[str, ...]] = []
    rules = {refusal_name(g[c][1]) for c in refused}
    while only_refused or rules:
        best = max(refused, key=lambda c: (len(_pairs(c) & only_refused), refusal_name(g[c][1]) in rules))
        checks.append(best)
        only_refused -= _pairs(best)
        rules.discard(refusal_name(g[best][1]))
    return tuple(picked), tuple(checks)


def refusal_name(error: SpecError) -> str | None:
    text = str(error)
    return next((r.name for r in REFUSALS if text == f"validate cannot run this layout yet: {r.reason}"), None)


def test_the_chosen_runs_cover_every_pair_of_axis_values():
    """Every pair of axis values some runnable plan holds is held by a plan whose emitted job runs,
    and every pair that only refused plans hold by a refused plan that is checked."""
    g = grid()
    runs, checks = chosen()
    runnable = [c for c, (_, job) in g.items() if not isinstance(job, SpecError)]
    refused = [c for c, (_, job) in g.items() if isinstance(job, SpecError)]
    want_run = set().union(*(_pairs(c) for c in runnable))
    ran = {_key(c) for c in runs}
    assert want_run <= set().union(*(_pairs(c) for c in runnable if _key(c) in ran))
    want_refused = set().union(*(_pairs(c) for c in refused)) - want_run
    assert want_refused <= set().union(*(_pairs(c) for c in checks))
    # every axis value occurs in a legal plan (the grid is not empty along any axis)
    for i, axis in enumerate(NAMES):
        assert {c[i] for c in g} == set(AXES[axis]), axis


def test_refused_plans_are_refused_with_a_stated_reason():
    """Each refused plan of the grid (and the rules no axis reaches) is refused with one of
    REFUSALS' reasons, as one line; every rule is met by some plan."""
    g = grid()
    _, checks = chosen()
    met = set()
    for c in checks:
        error = g[c][1]
        name = refusal_name(error)
        assert name is not None, (c, str(error))
        assert "\n" not in str(error)
        met.add(name)
    beyond = {
        "alibi": ModelSpec.model_validate({**TINY.model_dump(), "name": "tiny-alibi", "position_embedding": "alibi"}),
        "mtp": ModelSpec.model_validate({**TINY.model_dump(), "name": "tiny-mtp", "mtp_layers": 1}),
        "mla": ModelSpec.model_validate({**TINY.model_dump(), "name": "tiny-mla", "num_kv_heads": None, "mla": {
            "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16}}),
        "sinks": ModelSpec.model_validate({**TINY.model_dump(), "name": "tiny-sinks", "attention_sinks": True}),
        "hybrid": TINY_HYBRID,
    }
    for name, (model, training, lay) in BEYOND_AXES.items():
        spec = beyond.get(model) or MODELS[model]
        with pytest.raises(SpecError) as e:
            native_job(spec, CLUSTER, lay.get("tp", 1) * lay.get("cp", 1), {**TRAINING, **training}, lay)
        assert refusal_name(e.value) == name, str(e.value)
        met.add(name)
    assert met == {r.name for r in REFUSALS}


def test_an_nvfp4_plan_is_refused_by_the_native_jobs_rules():
    # the emitted job is a torchtitan one, whose quantisation converters train float8 and MXFP8 only:
    # the rules refuse precision fp4 in one line before any worker slice is made
    with pytest.raises(SpecError, match="precision fp4 is Transformer Engine's NVFP4 recipe") as e:
        native_job(TINY, presets.clusters()["dgx-b200"], 1, {**TRAINING, "framework": "megatron", "precision": "fp4"}, {})
    assert "\n" not in str(e.value) and refusal_name(e.value) is None


DOC = Path(__file__).resolve().parents[1] / "docs" / "validate.md"


def test_docs_list_the_refusals_the_code_makes():
    """docs/validate.md lists REFUSALS, each as "- <reason>" between its markers, in order."""
    text = DOC.read_text()
    block = re.search(r"<!-- refusals -->\n(.*?)<!-- /refusals -->", text, re.S)
    assert block is not None, "docs/validate.md lacks the <!-- refusals --> block"
    listed = [ln[2:] for ln in block.group(1).splitlines() if ln.startswith("- ")]
    assert listed == [f"**{r.name}**: {r.reason}" for r in REFUSALS]


def _runs_of(world: int) -> dict[str, tuple[tuple[str, ...], object]]:
    """One run per distinct emitted job of this world size, named after its first plan."""
    g = grid()
    runs, _ = chosen()
    out: dict[str, tuple] = {}
    seen = set()
    for c in runs:
        if g[c][0] != world or _key(c) in seen:
            continue
        seen.add(_key(c))
        out["-".join(c)] = (c, g[c][1])
    return out


def _launch(tmp_path_factory, world: int):
    runs = _runs_of(world)
    out = tmp_path_factory.mktemp(f"grid{world}")
    docs = [run_doc(job, name=name, steps=STEPS, warmup=WARMUP, fp32=True, check=True, lr=LR, profile=False)
            for name, (_, job) in runs.items()]
    emit(out, job_doc(docs, backend="gloo", device="cpu", step_timeout_s=120))
    result = launch(out, world, timeout_s=600, step_timeout_s=120)
    assert result.ok, result.cause
    return (out, {d["name"]: d for d in docs}, result), {name: job for name, (_, job) in runs.items()}


WORLDS = (1, 2, 4, 8)


@pytest.fixture(scope="module", params=WORLDS, ids=[f"{w}_ranks" for w in WORLDS])
def batch(request, tmp_path_factory):
    if not _runs_of(request.param):
        pytest.skip(f"no run of {request.param} ranks is needed to cover the grid")
    return _launch(tmp_path_factory, request.param)


def test_every_chosen_plan_trains_like_one_process(batch):
    """The loss, the gradients and the weights after the one optimizer step (STEPS) equal a
    one-process reference, and every rank holds exactly the state bytes the memory model predicts
    (tests/test_validate_parallel.py's check, with its tolerances)."""
    run_batch, jobs = batch
    for name in jobs:
        _check(run_batch, name, jobs)
