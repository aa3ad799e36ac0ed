"""planner plan: the CP-SAT search against the brute-force reference on small problems, the bound
it prunes with against the exact model, and the command's output."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cost_models.hardware import Cluster
from cost_models.layout import Layout
from cost_models.model_spec import ModelSpec
from cost_models.training import TrainingSpec
from planner import presets
from planner.cli import app
import planner.search
from planner.search import Plan, Rejected, Space, brute_force, evaluate, extreme_rows, problem_waiver, search
from planner.space import Problem, parse_fixes
from tests.helpers import GPT_TINY, LLAMA_TINY

MOE_TINY = ModelSpec(
    name="moe-tiny", num_layers=4, hidden_size=256, ffn_hidden_size=688, num_attention_heads=8, num_kv_heads=4,
    vocab_size=1000, max_position_embeddings=4096, moe=dict(num_experts=4, top_k=2, expert_ffn_hidden_size=256),
)

# Layers of different cost in one model: MoE every second layer (the others dense), and a hybrid of
# Mamba-2, attention-only and MLP-only layers; the bound sums each rank's layers by kind.
MOE_MIXED_TINY = ModelSpec(
    name="moe-mixed-tiny", num_layers=4, hidden_size=256, ffn_hidden_size=688, num_attention_heads=8, num_kv_heads=4,
    vocab_size=1000, max_position_embeddings=4096, moe=dict(num_experts=4, top_k=2, expert_ffn_hidden_size=256, layer_freq=2),
)
HYBRID_TINY = ModelSpec(
    name="hybrid-tiny", num_layers=6, hidden_size=256, ffn_hidden_size=688, num_attention_heads=8, num_kv_heads=4,
    vocab_size=1000, max_position_embeddings=4096, hybrid_pattern="M*-M-M",
    mamba=dict(num_heads=16, head_dim=32, state_size=16, num_groups=8),
)
# Eight layers over up to four ranks: the memory splits (planner.space._memory_splits) give every
# rank's layers, e.g. 1/1/3/3 and 1/1/2/4 at pp 4, so the bound and brute force see explicit layouts.
LLAMA_TINY_8 = ModelSpec(
    name="llama-tiny-8", num_layers=8, hidden_size=256, ffn_hidden_size=688, num_attention_heads=8, num_kv_heads=2,
    vocab_size=1000, max_position_embeddings=4096,
)
# A hybrid with MoE (E) layers among Mamba and attention ones (Nemotron 3's kinds): ep applies to the
# E layers only, the bound sums their costs apart from the others'.
HYBRID_MOE_TINY = ModelSpec(
    name="hybrid-moe-tiny", num_layers=6, hidden_size=256, ffn_hidden_size=688, num_attention_heads=8, num_kv_heads=4,
    vocab_size=1000, max_position_embeddings=4096, hybrid_pattern="ME*EME",
    mamba=dict(num_heads=16, head_dim=32, state_size=16, num_groups=8),
    moe=dict(num_experts=4, top_k=2, expert_ffn_hidden_size=256, num_shared_experts=1, router_score="sigmoid", expert_bias=True),
)

# Sixteen heads, so that on an NVL72 rack (one NVLink domain of 72 GPUs) tp reaches 16: the Shards
# of the bound tables go past the 8-GPU node's tp of 8.
LLAMA_TINY_16H = ModelSpec(
    name="llama-tiny-16h", num_layers=8, hidden_size=512, ffn_hidden_size=1376, num_attention_heads=16, num_kv_heads=4,
    vocab_size=1000, max_position_embeddings=4096,
)


def problem(model: ModelSpec, gpus: int, *, seq: int = 2048, gbs: int = 16, framework: str = "megatron",
            cluster: str = "dgx-h100", **fixed) -> Problem:
    cl = Cluster(spec=presets.clusters()[cluster], num_gpus=gpus)
    return Problem(model, cl, TrainingSpec(seq_len=seq, global_batch_size=gbs, framework=framework), fixed=fixed)


# Small problems across models, GPU counts, batch sizes and frameworks, chosen so brute force stays
# a few seconds; each runs the full space of planner.space.
CASES = [
    (LLAMA_TINY, 4, 8, "megatron", 2048),
    (LLAMA_TINY, 8, 16, "megatron", 2048),
    (GPT_TINY, 4, 16, "megatron", 1024),
    (LLAMA_TINY, 4, 8, "torchtitan", 2048),
    (LLAMA_TINY, 8, 32, "deepspeed", 2048),
    (MOE_TINY, 4, 8, "megatron", 2048),
    (MOE_MIXED_TINY, 2, 8, "megatron", 2048),
    (HYBRID_TINY, 4, 8, "megatron", 2048),
    (HYBRID_MOE_TINY, 2, 4, "megatron", 1024),
    (LLAMA_TINY_8, 4, 8, "megatron", 2048, dict(tp=1, cp=1, mbs=1)),  # fixed: brute force stays about a second
    # 16 GB200s of an NVL72 rack, tp 1 to 16 (cp and mbs fixed: brute force stays under two seconds)
    (LLAMA_TINY_16H, 16, 16, "megatron", 1024, dict(cp=1, mbs=1, cluster="gb200-nvl72")),
]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0].name}-{c[1]}gpu-gbs{c[2]}-{c[3]}-seq{c[4]}")
def solved(request):
    """The problem, its search, its brute force, and every layout brute force scored with what the
    exact model gave it (planner.search.evaluate, recorded as brute force calls it)."""
    model, gpus, gbs, fw, seq, *fixed = request.param
    p = problem(model, gpus, gbs=gbs, framework=fw, seq=seq, **(fixed[0] if fixed else {}))
    scored: dict[Layout, Plan | Rejected] = {}

    def recorded(problem, layout, **kw):
        scored[layout] = out = evaluate(problem, layout, **kw)
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(planner.search, "evaluate", recorded)
        brute = brute_force(p, top=5)
    return p, search(p, top=5), brute, scored


def test_cpsat_and_brute_force_return_the_same_top_k(solved):
    _, cpsat, brute, _ = solved
    assert cpsat.optimal
    assert brute.plans, "every case has feasible layouts"
    assert [p.key for p in cpsat.plans] == [p.key for p in brute.plans]
    # and it scores fewer layouts than brute force does: the bound prunes
    assert cpsat.candidates < brute.candidates


def test_the_bounds_never_exceed_the_exact_model(solved):
    """Every legal (cell, sharding) of the space: the step bound at most the exact step, the memory
    bound at most the exact peak. All of them, so that a bound term that overshoots anywhere fails."""
    p, _, brute, scored = solved
    from cost_models.calibration import DEFAULT

    space = Space(p, cal=DEFAULT)
    space.refine(*np.nonzero(space.legal))  # with every pair's dp tail term
    checked = rejected = 0
    cps, eps, layouts = set(), set(), set()
    for cell in range(len(space)):
        for zi in range(len(space.shardings)):
            if not space.legal[cell, zi]:
                continue
            layout = space.layout(cell, zi)
            # Brute force's plan where it has one: the step and the peak do not depend on the
            # headroom (MemoryEstimate.peak_bytes is its stages' peak; the headroom sets only
            # usable_bytes and fits). Where it refused the layout, the exact model without headroom.
            out = scored.get(layout)
            if not isinstance(out, Plan):
                out = evaluate(p, layout, headroom=0.0)
            if isinstance(out, Rejected):  # a framework rule the generators leave to cost_models.rules
                # the expert grid is not among them: the space drops those layouts before bounding
                assert "expert grid" not in out.reason and "etp(" not in out.reason, out.reason
                rejected += 1
                continue
            # lb is in whole ns and rounded down; the exact step is a float of seconds
            assert space.lb[cell, zi] <= out.time.step_s * 1e9 + 1, (out.job.layout, space.lb[cell, zi], out.time.step_s)
            assert space.mem[cell, zi] <= out.memory.peak_bytes, (out.job.layout, space.mem[cell, zi])
            checked += 1
            cps.add(out.job.layout.cp)
            eps.add(out.job.layout.ep)
            layouts.add(out.job.layout.pp_layout)
    assert checked + rejected == brute.candidates and checked > 0
    if p.model is HYBRID_TINY:  # Mamba layers under cp: their all-to-alls are in the bound and the exact step alike
        assert cps == {1, 2}
    if p.model is HYBRID_MOE_TINY:  # expert-parallel layouts of the E layers are among those checked
        assert eps == {1, 2}
    if p.model is LLAMA_TINY_8:  # every rank's layers given (the memory splits) among those checked
        assert layouts >= {"Et|t*2|t*3|t*2L", "Et|t|t*2|t*4L"}, layouts


def test_the_dp_tail_bound_of_an_interleaved_layout_is_its_own_schedules():
    # Megatron's interleaved schedule starts each chunk's gradient reduction at that chunk's last
    # backward (step_time.interleaved_grad_sync_chunks), so more of it hides than behind one
    # micro-batch's backward. The bound's dp tail term must be priced on the layout's own virtual
    # stages: priced as 1F1B (comm - backward) it read 0.167 s against the exact 0.079 s here, above
    # the exact step wherever the rest of the bound had less slack (an MLPerf GPT-3 layout on 10,752
    # H100: bound 0.865 s, step 0.763 s, so the search missed its own #1).
    from cost_models.calibration import DEFAULT

    p = problem(presets.models()["gpt3-175b"], 1024, seq=2048, gbs=1536, tp=4, mbs=1, cp=1, pp=8, vpp=4,
                recompute="none", zero=1)
    space = Space(p, cal=DEFAULT)
    cells, shardings = np.nonzero(space.legal)
    assert len(cells)
    checked = 0
    for c, z in zip(cells.tolist(), shardings.tolist()):
        out = evaluate(p, space.layout(c, z), headroom=0.0)
        if not isinstance(out, Plan):
            continue
        before = int(space.lb[c, z])
        space.refine(np.array([c]), np.array([z]))
        added = (int(space.lb[c, z]) - before) / 1e9
        late = out.time.stages[0].dp_late_s
        assert late is not None and late > 0.01, late  # chunks sync on their own, and it costs time
        assert 0 < added <= out.time.dp_tail_s + 1e-9, (out.job.layout.pp_layout, added, out.time.dp_tail_s)
        checked += 1
    assert checked


def test_the_memory_bound_holds_where_the_peak_is_the_optimizer_step():
    # Megatron fp16 on short sequences: the optimizer's fp32 gradient copy outweighs the activations,
    # so many layouts peak in the step (cost_models.memory.step_peak), where no activation is held
    cl = Cluster(spec=presets.clusters()["dgx-h100"], num_gpus=4)
    p = Problem(LLAMA_TINY, cl, TrainingSpec(seq_len=128, global_batch_size=4, precision="fp16"), fixed={})
    from cost_models.calibration import DEFAULT

    space = Space(p, cal=DEFAULT)
    steps = checked = 0
    for cell, zi in zip(*np.nonzero(space.legal)):
        out = evaluate(p, space.layout(cell, zi), headroom=0.0)
        if isinstance(out, Rejected):
            continue
        assert space.mem[cell, zi] <= out.memory.peak_bytes, (out.job.layout, space.mem[cell, zi])
        steps += out.memory.peak_stage.breakdown.value("model_states/fp32_gradients") > 0
        checked += 1
    assert 0 < steps < checked


# Problems whose Stages have rank rows of several layer counts (uneven splits, mixed layer kinds):
# the step bound's rank rows and rank 0's chunks are cut there, not just merged
CUT_PROBLEMS = [
    problem(LLAMA_TINY_16H, 16, gbs=16, seq=1024, cluster="gb200-nvl72"),
    problem(MOE_MIXED_TINY, 4, gbs=16),
    problem(HYBRID_MOE_TINY, 4, gbs=8),
]


def _cut_id(p) -> str:  # type: ignore[no-untyped-def]
    return f"{p.model.name}-{p.gpus}gpu-{p.framework}"


@pytest.mark.parametrize("p", CUT_PROBLEMS, ids=_cut_id)
def test_the_step_bound_arrays_are_the_bound_summed_over_every_rank(p):
    """Space states the step bound over whole arrays, with each Stages' rank rows cut to those
    that can hold the largest and the least S_r and its chunks to the distinct ones. Cell by cell,
    from RankKinds and the Shard tables as they are: S_r of every rank row (Σ over kinds of the
    layers under the recompute mode times that mode's pass, the others times the pass without
    recompute, plus the head on the last rank), LB = m·max S_r + (Σ_r S_r − max S_r) // vpp + the
    straggler term on the least compute; rank 0's lightest chunk over all its chunks; its backward
    window over all its layers. Integers throughout, so equal, not close."""
    from cost_models.calibration import DEFAULT
    from cost_models.memory import inflight_counts
    from cost_models.enums import Schedule
    from cost_models.step_time import expected_max_normal
    from planner.search import MODES, rank_kinds

    space = Space(p, cal=DEFAULT)
    spread = DEFAULT.gpu_speed_cv * expected_max_normal(p.gpus)
    rows = {t: rank_kinds(p, st) for t, st in enumerate(space.stages)}
    checked = 0
    for c in range(len(space)):
        s, t = int(space.cell_shard[c]), int(space.cell_stages[c])
        table, rk, st = space.tables[s], rows[t], space.stages[t]
        mi, m = MODES.index(st.recompute), int(space.microbatches[c])

        def rank_sum(per_kind, rec, plain, last):  # type: ignore[no-untyped-def]
            return (sum(n * per_kind[k][mi] + q * per_kind[k][0] for k, (n, q) in enumerate(zip(rec, plain)))
                    + last * table.head_ns)

        passes = [rank_sum(table.kind_pass_ns, *r) for r in zip(rk.recomputed, rk.plain, rk.last)]
        computes = [rank_sum(table.kind_compute_ns, *r) for r in zip(rk.recomputed, rk.plain, rk.last)]
        top, total = max(passes), sum(w * x for w, x in zip(rk.weights, passes))
        lb = m * top + (total - top) // st.vpp + int(np.floor(spread * m * min(computes)))
        assert space.cell_lb[c] == lb, (c, st, space.cell_lb[c], lb)
        # rank 0: in-flight micro-batches times its lightest chunk's kept activations
        kept = [sum(n * table.kind_kept_bytes[k][mi] + q * table.kind_kept_bytes[k][0] for k, (n, q) in enumerate(zip(*ch)))
                for ch in rk.chunks0]
        schedule = Schedule.INTERLEAVED if st.vpp > 1 else Schedule.ONE_F_ONE_B
        assert space.acts0[c] == sum(inflight_counts(st.pp, st.vpp, m, 0, schedule)) * min(kept)
        window = sum(sum(rec) * table.backward_ns[mi] + sum(plain) * table.backward_ns[0] for rec, plain in rk.chunks0)
        assert space.window0[c] == window + (table.head_ns if st.pp == 1 else 0)
        checked += 1
    assert checked == len(space) > 0
    # the equalities above are over chunks the arrays were built without: in some Stages rank 0
    # repeats a chunk (the rows the cut drops: test_cutting_the_rank_rows_changes_the_speed_not_the_bound)
    assert any(len(set(r.chunks0)) < len(r.chunks0) for r in rows.values())


def _every_used_row(counts, used, *, largest):  # type: ignore[no-untyped-def]
    """extreme_rows without the cut: every used row."""
    order = np.argsort(~used, axis=1, kind="stable")
    return order, np.take_along_axis(used, order, axis=1)


def _one_kept_row_less(counts, used, *, largest):  # type: ignore[no-untyped-def]
    """extreme_rows cut too far: less the first row it keeps, where it keeps more than one."""
    rows, kept = extreme_rows(counts, used, largest=largest)
    kept = kept.copy()
    kept[kept.sum(axis=1) > 1, 0] = False
    return rows, kept


@pytest.mark.parametrize("p", CUT_PROBLEMS, ids=_cut_id)
def test_cutting_the_rank_rows_changes_the_speed_not_the_bound(p, monkeypatch):
    """Space keeps, per Stages, only the rank rows that can hold the largest or the least S_r
    (extreme_rows): the claim is that this saves work and moves no bound. Without the cut every cell's
    step bound is the same integer and the search returns the same plans. Cut one row further (the
    first of those kept, where more than one is), the bound of some cell moves: a row the cut keeps
    holds some cell's largest or least S_r alone, so the first comparison is one a cut dropping a
    row it must keep fails."""
    from cost_models.calibration import DEFAULT
    from planner.search import rank_kinds

    cut = Space(p, cal=DEFAULT)
    # in some Stages the cut drops rank rows (covered by another row for the largest S_r, or covering
    # one for the least), so the arrays compared below were built from fewer rows than every rank's
    dropped = 0
    for stages in cut.stages:
        r = rank_kinds(p, stages)
        counts = np.array([[*rec, *plain, int(last)] for rec, plain, last in zip(r.recomputed, r.plain, r.last)])[None]
        used = np.ones(counts.shape[:2], dtype=bool)
        dropped += any(extreme_rows(counts, used, largest=big)[1].sum() < used.sum() for big in (True, False))
    assert dropped > 0
    plans = [x.key for x in search(p, top=3).plans]
    monkeypatch.setattr(planner.search, "extreme_rows", _every_used_row)
    whole = Space(p, cal=DEFAULT)
    assert np.array_equal(cut.cell_lb, whole.cell_lb)
    assert np.array_equal(cut.lb, whole.lb)
    assert [x.key for x in search(p, top=3).plans] == plans
    monkeypatch.setattr(planner.search, "extreme_rows", _one_kept_row_less)
    too_far = Space(p, cal=DEFAULT)
    assert (too_far.cell_lb != whole.cell_lb).any()


def test_extreme_rows_keeps_each_row_some_weighting_needs():
    """Rows of layer counts (two kinds and the head): A (3, 0, 0), B (0, 3, 0), C (2, 2, 0),
    D (1, 1, 0), E (1, 1, 1). Largest sum: C covers D (no smaller in any count), so D goes; no row
    covers A, B, C or E, and each is the unique largest under some non-negative weights: A at
    (1, 0, 0) (3 against 2), B at (0, 1, 0), C at (1, 1, 0) (4 against 3), E at (0, 0, 1). Least
    sum: D lies under C and E in every count, so they go; nothing lies under A, B or D, each the
    unique least somewhere: A at (0, 1, 0) (0 against 1), B at (1, 0, 0), D at (1, 1, 0) (2 against
    3). A cut that dropped any kept row would move a bound; one that kept a dropped row would not."""
    counts = np.array([[[3, 0, 0], [0, 3, 0], [2, 2, 0], [1, 1, 0], [1, 1, 1], [0, 0, 0]]])
    used = np.array([[True, True, True, True, True, False]])  # the last row is padding
    rows, kept = extreme_rows(counts, used, largest=True)
    top = rows[0][kept[0]]
    assert sorted(top.tolist()) == [0, 1, 2, 4]
    rows, kept = extreme_rows(counts, used, largest=False)
    least = rows[0][kept[0]]
    assert sorted(least.tolist()) == [0, 1, 3]
    # over many non-negative weightings the largest and least sums over the kept rows are those over
    # every used row (the cut moves no bound); 200 draws of a fixed generator, exact integers
    rng = np.random.default_rng(0)
    every = counts[0][used[0]]
    for _ in range(200):
        w = rng.integers(0, 10, size=3)
        assert (counts[0][top] @ w).max() == (every @ w).max()
        assert (counts[0][least] @ w).min() == (every @ w).min()


@st.composite
def small_problems(draw):  # type: ignore[no-untyped-def]
    """Small but varied problems: layer counts that do and do not divide the pipeline, GQA or
    not, dense or MoE, GELU or SwiGLU, every framework, 2 to 8 GPUs on nodes of 4 or 8."""
    heads = draw(st.sampled_from([4, 8]))
    moe = draw(st.booleans())
    gelu = draw(st.booleans())
    model = ModelSpec(
        name="drawn", num_layers=draw(st.sampled_from([2, 3, 4, 5, 6])), hidden_size=heads * 32,
        ffn_hidden_size=heads * 96, num_attention_heads=heads,
        num_kv_heads=draw(st.sampled_from([1, 2, heads])), vocab_size=draw(st.sampled_from([512, 1000])),
        max_position_embeddings=4096, tie_embeddings=gelu,
        **(dict(mlp="gelu", norm="layernorm", position_embedding="learned") if gelu else {}),
        **(dict(moe=dict(num_experts=4, top_k=2, expert_ffn_hidden_size=heads * 32)) if moe else {}),
    )
    gpus = draw(st.sampled_from([2, 4, 8]))
    fw = draw(st.sampled_from(["megatron", "torchtitan", "deepspeed"]))
    return problem(model, gpus, gbs=draw(st.sampled_from([4, 8, 16])), framework=fw,
                   seq=draw(st.sampled_from([1024, 2048])), cluster=draw(st.sampled_from(["dgx-h100", "dgx-a100-40gb", "l40s-pcie-8"])))


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(small_problems())
def test_cpsat_agrees_with_brute_force_on_drawn_problems(p):
    cpsat, brute = search(p, top=3), brute_force(p, top=3)
    assert cpsat.optimal
    assert [x.key for x in cpsat.plans] == [x.key for x in brute.plans]


def test_search_is_deterministic():
    p = problem(LLAMA_TINY, 8, gbs=16)
    a, b = search(p, top=5), search(p, top=5)
    assert [x.key for x in a.plans] == [x.key for x in b.plans]


def test_fixes_pin_the_axis():
    p = problem(LLAMA_TINY, 8, gbs=16, **parse_fixes(["tp=2", "recompute=full"]))
    result = search(p, top=5)
    assert result.plans
    assert all(x.job.layout.tp == 2 and x.job.layout.recompute.value == "full" for x in result.plans)


runner = CliRunner()


def test_plan_json_gives_each_plan_as_estimate_does():
    res = runner.invoke(app, ["plan", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch-size", "64",
                              "--top", "3", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["search"]["solver"] == "cp-sat" and doc["search"]["optimal"] is True
    assert [p["rank"] for p in doc["plans"]] == [1, 2, 3]
    steps = [p["time"]["step_s"] for p in doc["plans"]]
    assert steps == sorted(steps)
    best = doc["plans"][0]["layout"]
    flags = ["--tp", best["tp"], "--pp", best["pp"], "--cp", best["cp"], "--mbs", best["mbs"], "--zero", best["zero"],
             "--recompute", best["recompute"], "--dp-shard", best["dp_shard"]]
    flags += ["--sp"] if best["sp"] else ["--no-sp"]
    est = runner.invoke(app, ["estimate", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch-size", "64",
                              *map(str, flags), "--json"])
    assert est.exit_code == 0, est.output
    e = json.loads(est.output)
    for key in ("layout", "memory", "time", "throughput", "bottleneck", "checkpoint"):
        assert doc["plans"][0][key] == e[key], key


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fix", "tp8"], "expected AXIS=VALUE"),
        (["--fix", "zero=5"], "--fix zero=5: must be 0, 1, 2 or 3"),
        (["--fix", "grad_accumulation=maybe"], "--fix grad_accumulation=maybe: must be true or false"),
        (["--top", "0"], "--top(0) must be at least 1"),
        (["--fix", "tp=3"], "--fix tp=3: tp must divide num_attention_heads(32) and gpus(8)"),
    ],
)
def test_plan_bad_input_is_one_line_and_exit_2(args, message):
    res = runner.invoke(app, ["plan", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "8", "--json", *args])
    assert res.exit_code == 2
    assert message in res.output
    assert "Traceback" not in res.output


def test_no_layout_fits_names_the_closest():
    res = runner.invoke(app, ["plan", "llama-3.1-405b", "--cluster", "dgx-h100", "--gpus", "8", "--json"])
    assert res.exit_code == 2
    assert res.output.startswith("error: no layout of llama-3.1-405b on 8x H100-SXM")


def test_explain_names_why_the_usual_alternatives_lost():
    from planner.render import suspect_lines, suspects
    from planner.runners import run_plan

    report = run_plan("llama-3.1-8b", "dgx-h100", 16, training=dict(seq_len=4096, global_batch_size=64),
                      fixes=["tp=8"], top=3)
    best = report.plans[0]
    lines = dict(line.split(": ", 1) for line in suspect_lines(report))
    assert [name for name, _ in suspects(report.problem, best.job)] == list(lines)
    # tp 16 leaves the 8-GPU NVLink domain of a DGX H100
    assert lines["tp=16"].startswith("crosses the 8-GPU scale-up domain")
    # every other alternative is scored by the exact model: its slowdown is the step-time ratio
    alt = best.job.layout.model_copy(update=dict(tp=4, dp=None, dp_shard=None, etp=None, sp=None))
    out = evaluate(report.problem, alt, headroom=report.headroom)
    if isinstance(out, Rejected):
        assert lines["tp=4"] == out.reason
    else:
        assert lines["tp=4"].startswith(f"{out.time.step_s / best.time.step_s - 1:+.1%} step time")


def test_explain_takes_the_searchs_split_at_a_new_pipeline_depth():
    # Llama-3.1-405B's 126 layers, uneven ends only (the embedding and loss counted as layers, 128
    # units, would carry over to pp 64 and 16 unchanged): #1 runs pp 32 with an uneven end; pp 64 and
    # pp 16 need other ends (the even split is illegal at both), which the search has. Varying pp must
    # try those splits, not drop the ends and report the divisibility rule the search never hit.
    import re

    from planner.render import suspect_lines
    from planner.runners import run_plan

    report = run_plan("llama-3.1-405b", "dgx-h100", 1024, training=dict(seq_len=4096, global_batch_size=1024),
                      fixes=["pp=32", "pp_split=ends"], top=3)
    top = report.plans[0].job.layout
    assert top.pp_first_stage_layers is not None or top.pp_last_stage_layers is not None
    lines = {line.split(" ", 1)[0]: line for line in suspect_lines(report)}
    for name in ("pp=64", "pp=16"):
        line = lines[name]
        assert "the search's split at this depth" in line, line
        outcome = line.rsplit("): ", 1)[1]
        assert not re.search(r"not divisible|does not split", outcome), line


def test_no_layout_says_the_fewest_gpus_that_fit():
    import re

    res = runner.invoke(app, ["plan", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "1", "--seq-len", "8192", "--json"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    found = re.search(r"it fits on (\d+) GPUs", res.output)
    assert found, res.output
    n = int(found.group(1))
    # the search agrees: a layout at n GPUs, none at half of it
    for gpus, fits in ((n, True), (n // 2, False)):
        res = runner.invoke(app, ["plan", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", str(gpus), "--seq-len", "8192",
                                  "--top", "1", "--json"])
        assert (res.exit_code == 0) is fits, (gpus, res.output)


def test_a_search_out_of_time_says_so_and_not_that_nothing_fits():
    from planner import presets
    from planner.runners import _no_plan
    from planner.search import search
    from planner.space import Problem

    problem = Problem(presets.models()["llama-3.1-70b"], Cluster(spec=presets.clusters()["dgx-h100"], num_gpus=64),
                      TrainingSpec(global_batch_size=256))
    result = search(problem, top=3, time_limit_s=0.0)
    assert result.timed_out and not result.optimal and not result.plans
    msg = _no_plan(problem, result)
    assert "ran out of its" in msg and "not a proof that none does" in msg and "memory bound" not in msg
    assert not search(problem, top=3).timed_out


def test_plan_never_ranks_what_its_launch_refuses():
    # DeepSpeed's launch writes no PipelineModule, so pipelines are refused there; plan must not rank them
    from planner import presets
    from planner.launch.build import launch_refusal
    from planner.search import search
    from planner.space import Problem

    problem = Problem(presets.models()["llama-3.1-70b"], Cluster(spec=presets.clusters()["dgx-h100"], num_gpus=64),
                      TrainingSpec(global_batch_size=256, framework="deepspeed"))
    result = search(problem, top=5)
    assert result.plans and all(launch_refusal(p.job) is None for p in result.plans)
    assert all(p.job.layout.pp == 1 for p in result.plans)
    # ...and the space holds pp at 1 for it (planner.launch.build.single_axes): no pipeline is even scored
    assert problem.single_axes.keys() == {"pp", "ep"}
    assert all(r.layout.pp == 1 for r in result.rejected)


def test_a_refused_model_is_not_a_refused_layout():
    # the search skips layouts the launch refuses (LayoutError) and leaves refusals of the model to
    # `launch`: BLOOM's alibi positions have no Megatron flag, whatever the layout
    from cost_models.errors import LayoutError
    from planner.launch.build import launch_refusal
    from tests.helpers import make_job

    pipeline = make_job("llama-3.1-8b", gpus=16, pp=2, training=dict(framework="deepspeed"))
    assert isinstance(launch_refusal(pipeline), LayoutError)
    bloom = make_job(_bloom(), gpus=8)
    refused = launch_refusal(bloom)
    assert refused is not None and not isinstance(refused, LayoutError) and "alibi" in str(refused)


def _bloom():
    from cost_models.model_spec import ModelSpec

    return ModelSpec(name="bloom-tiny", num_layers=2, hidden_size=256, ffn_hidden_size=1024, num_attention_heads=8,
                     vocab_size=1000, mlp="gelu", norm="layernorm", position_embedding="alibi", qkv_bias=True,
                     out_bias=True, mlp_bias=True, embedding_norm=True)


def _fake_plan(step_s: float, peak_fraction: float, **layout):
    from types import SimpleNamespace

    from cost_models.layout import Layout
    from planner.search import Plan

    return Plan(job=SimpleNamespace(layout=Layout(**layout)), time=SimpleNamespace(step_s=step_s),
                memory=SimpleNamespace(peak_bytes=int(peak_fraction * 80e9), capacity_bytes=int(80e9)))


def test_a_large_vocabulary_moves_layers_off_the_last_stage():
    # Llama-3.1-8B's shape with a 262,144-token vocabulary: the output layer (1.07e9 parameters)
    # costs about five decoder layers (2.2e8 each) of work on the last stage, so the fastest split
    # gives that stage fewer layers, and it beats the even split of the same layout by more than
    # the tie resolution (the search decides the per-stage split; an even split is also in its space)
    from cost_models.model_spec import ModelSpec
    from planner import presets
    from planner.search import TIE_RESOLUTION, evaluate, search
    from planner.space import Problem

    spec = ModelSpec(name="bigvocab", num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
                     num_kv_heads=8, vocab_size=262144, max_position_embeddings=8192)
    problem = Problem(spec, Cluster(spec=presets.clusters()["dgx-h100"], num_gpus=64),
                      TrainingSpec(seq_len=8192, global_batch_size=512), fixed=dict(tp=1, cp=1, mbs=1, pp=4))
    best = search(problem, top=10).plans[0]
    lay = best.job.layout
    counts = [len(best.job.stage_layer_ids(r)) for r in range(4)]
    assert counts[-1] < counts[1], counts
    even = evaluate(problem, lay.model_copy(update=dict(pp_first_stage_layers=None, pp_last_stage_layers=None)))
    assert even.time.step_s > best.time.step_s * (1 + TIE_RESOLUTION)


def _split_model(num_layers: int, pp: int, vpp: int, head: float) -> tuple[int, int, int] | None:
    """planner.space._split's problem as a CP-SAT model, the reference the count is checked against:
    f, l, c model chunks on the first, last and each middle stage, f + l + (pp − 2)·c = L / vpp, the
    ends no larger than the middle (pp 2: c stands for l); minimise the slowest stage (the last's
    plus the head), then f."""
    if num_layers % vpp or num_layers // vpp < pp:
        return None
    from planner.search import cp_model, new_model
    from planner.space import UNITS_PER_LAYER, chunk_and_head_units

    cp = cp_model()
    a, h = chunk_and_head_units(vpp, head)
    m = new_model()
    f, l, c = (m.new_int_var(1, num_layers // vpp, n) for n in ("first", "last", "middle"))
    if pp > 2:
        m.add(f + l + (pp - 2) * c == num_layers // vpp)
        m.add(f <= c)
        m.add(l <= c)
    else:
        m.add(f + l == num_layers // vpp)
        m.add(c == l)
    slowest = m.new_int_var(0, num_layers * UNITS_PER_LAYER + h, "slowest")
    m.add_max_equality(slowest, [a * f, a * c, a * l + h])
    m.minimize(slowest * (num_layers + 1) + f)
    solver = cp.CpSolver()
    solver.parameters.num_workers = 1
    if solver.solve(m) != cp.OPTIMAL:
        return None
    return vpp * solver.value(f), vpp * solver.value(l), vpp * solver.value(c)


def test_the_uneven_split_is_counted_as_its_cp_sat_model_solves_it():
    from planner.space import _split

    # 10 layers over pp 3, vpp 1. Without a head: a middle stage of 4 leaves f + l = 6, both at most 4,
    # and the slowest stage is 4 from f = 2 on (l = 4); a middle of 3 cannot hold the rest (f + l = 7
    # > 6), a middle of 5 makes 5 the slowest. So (2, 4, 4). A head of 1.5 layers: at c = 4 the last
    # stage takes l + 1.5 ≤ 4 from l = 2, f = 4: (4, 2, 4), two layers off the last stage.
    assert _split(10, 3, 1, 0.0) == (2, 4, 4)
    assert _split(10, 3, 1, 1.5) == (4, 2, 4)
    # pp 2: f + l = 10, slowest max(f, l + 1.5), least at f = 6 (6 against 5.5): (6, 4, 4)
    assert _split(10, 2, 1, 1.5) == (6, 4, 4)
    # no split: fewer chunks than stages, or chunks that do not divide the layers; at pp 10 with 11
    # layers the middle stages take one each and the ends 3 between them, one more than one each
    assert _split(6, 8, 1, 0.5) is None and _split(10, 2, 3, 0.5) is None and _split(11, 10, 1, 0.5) is None
    # the same optimum as the CP-SAT model on every shape of a grid, whole-chunk heads included. The
    # optimum is unique (two splits of the same slowest stage and first stage would differ in c, and
    # moving a chunk between the ends of one of them gives a better split), so any exact method
    # finds the model's answer
    for layers in [*range(1, 41), 62, 80, 126]:
        for pp in (2, 3, 4, 5, 8):
            for vpp in range(1, 5):
                for head in (0.37, 1.0, 2.718):
                    if pp <= layers:
                        assert _split(layers, pp, vpp, head) == _split_model(layers, pp, vpp, head), (layers, pp, vpp, head)


def test_memory_splits_move_layers_to_the_ranks_with_fewer_micro_batches_in_flight():
    # 8 layers, pp 4, vpp 1, no head: 1F1B ranks hold 4/3/2/1 micro-batches (held_per_chunk), the
    # time-balanced optimum is 2 layers per rank (T0 = 2). Slack 0: only 2/2/2/2 (loads 8/6/4/2).
    # Slack 1 (≤ 3 layers): a largest load of 5 would need x0, x1 ≤ 1, x2 ≤ 2, x3 ≤ 3, 7 < 8 layers,
    # so 6; of 1/1/3/3 (loads 4/3/6/3, sum 16), 1/2/2/3 (17) and 1/2/3/2 (18) the least sum wins.
    # Slack 2 (≤ 4): 1/1/2/4 has loads 4/3/4/4, and 3 would leave rank 0 no layer.
    from planner.space import _memory_splits, held_per_chunk

    assert held_per_chunk(4, 1) == [4, 3, 2, 1]
    assert _memory_splits(8, 4, 1, 0.0) == ((2, 2, 2, 2), (1, 1, 3, 3), (1, 1, 2, 4))
    # whole chunks with vpp 2 (2 layers each), and no split where the chunks do not cover the ranks
    assert all(n % 2 == 0 and n > 0 for counts in _memory_splits(16, 4, 2, 0.0) for n in counts)
    assert _memory_splits(6, 4, 2, 0.0) == ()


def test_a_memory_split_fits_without_recompute_where_even_and_end_splits_cannot(monkeypatch):
    # Llama-3.1-70B in torchtitan on 64 H100s at seq 7680, tp 2 · cp 4 · pp 8 · mbs 1 (dp 1, 128
    # micro-batches). Under 1F1B rank r holds 8 − r micro-batches in flight, so the even split's rank 0
    # keeps 8 × 10 layers' activations and the even and end splits fit only with recompute (above the
    # 75.7 GiB usable). Fewer layers on the first ranks and more on the later ones fit without:
    # the slowest stage grows from 10 to 11 layers (+10%), less than recompute costs.
    import planner.space as space
    from cost_models.enums import Recompute
    from planner.search import TIE_RESOLUTION

    args = ["llama-3.1-70b", "--cluster", "dgx-h100", "--gpus", "64", "--seq-len", "7680", "--global-batch-size", "128",
            "--framework", "torchtitan"]
    fixes = dict(tp=2, cp=4, pp=8, mbs=1)
    res = runner.invoke(app, ["plan", *args, "--top", "1", "--json", *(f for k, v in fixes.items() for f in ("--fix", f"{k}={v}"))])
    assert res.exit_code == 0, res.output
    best = json.loads(res.output)["plans"][0]
    lay = best["layout"]
    assert lay["pp_layout"] is not None and lay["recompute"] == "none" and lay["vpp"] == 1, lay
    from cost_models.pipeline_split import virtual_stage_layers

    counts = virtual_stage_layers(80, 8, 1, layout=lay["pp_layout"])
    # non-decreasing towards the last ranks; the last rank, which also runs the output layer and loss, lighter
    assert counts[:-1] == sorted(counts[:-1]) and counts[0] < counts[-2] and counts[-1] < counts[-2], counts

    # estimate with the printed layout gives the same step and peak
    flags = ["--tp", lay["tp"], "--pp", lay["pp"], "--cp", lay["cp"], "--mbs", lay["mbs"], "--zero", lay["zero"],
             "--dp-shard", lay["dp_shard"], "--recompute", lay["recompute"], "--pp-layout", lay["pp_layout"]]
    est = runner.invoke(app, ["estimate", *args, *map(str, flags), "--json"])
    assert est.exit_code == 0, est.output
    e = json.loads(est.output)
    assert e["time"]["step_s"] == best["time"]["step_s"] and e["memory"]["peak_bytes"] == best["memory"]["peak_bytes"]
    # the table's reader gets the same flag; an alternative pp drops the layout, written for 8 stages
    text = runner.invoke(app, ["plan", *args, "--top", "1", "--explain", *(f for k, v in fixes.items() for f in ("--fix", f"{k}={v}"))],
                         env={"COLUMNS": "200"}).output
    assert f"#1: layers per pipeline rank {'/'.join(map(str, counts))}: --pp-layout '{lay['pp_layout']}'" in text, text
    assert "pp=4 (also pp_layout→-: split evenly): " in text, text

    # without per-rank splits (the even and end splits alone) the same shape fits only with recompute, and slower
    problem = Problem(presets.models()["llama-3.1-70b"], Cluster(spec=presets.clusters()["dgx-h100"], num_gpus=64),
                      TrainingSpec(seq_len=7680, global_batch_size=128, framework="torchtitan"), fixed=fixes)
    even = evaluate(problem, Layout(**{k: v for k, v in lay.items() if k in Layout.model_fields and k != "pp_layout"}))
    assert isinstance(even, Rejected) and "needs" in even.reason, even
    monkeypatch.setattr(space, "explicit_layouts_ok", lambda problem: False)
    old = search(problem, top=1).plans[0]
    assert old.job.layout.recompute is not Recompute.NONE and old.job.layout.pp_layout is None
    assert old.time.step_s > best["time"]["step_s"] * (1 + TIE_RESOLUTION), (old.time.step_s, best["time"]["step_s"])


def test_ties_go_to_memory_slack_then_fewer_axes_and_equivalents_fold():
    from planner.search import TIE_RESOLUTION, folded, ranked

    a = _fake_plan(10.000, 0.99, tp=4, cp=1)  # fastest, by 0.05%, but at 99% of memory
    b = _fake_plan(10.005, 0.63, tp=4, cp=2)  # ties with a (within 0.1%), far more slack; 2 axes
    c = _fake_plan(10.006, 0.63, tp=4, cp=4)  # ties, same slack and axes as b: the step decides
    d = _fake_plan(10.001, 0.63, tp=2, pp=2, cp=2)  # ties, same slack, faster, but 3 axes
    e = _fake_plan(10.000 * (1 + 2 * TIE_RESOLUTION), 0.10, tp=1)  # not a tie: behind, whatever its slack
    assert ranked([e, d, c, b, a]) == [b, c, d, a, e]
    # b, c and a differ only in cp and tie: one row; d differs in tp, pp and cp; e does not tie
    rows = folded([b, c, d, a, e])
    assert [(plan, folds) for plan, folds in rows] == [(b, {"cp": [2, 4, 1]}), (d, {}), (e, {})]


def test_the_problem_rules_are_checked_once_and_still_refuse_as_before():
    # PROBLEM_RULES read no layout: a problem that passes them lets every layout of its search skip
    # them, and the layout rules still refuse as resolve without a waiver does (mbs 3 does not
    # divide a global batch of 8 over dp 4)
    from cost_models.rules import PROBLEM_RULES

    clean = problem(LLAMA_TINY, 4, gbs=8)
    assert problem_waiver(clean) == PROBLEM_RULES
    odd = Layout(mbs=3)
    waived, full = evaluate(clean, odd, waive=PROBLEM_RULES), evaluate(clean, odd)
    assert isinstance(waived, Rejected) and waived.reason == full.reason and "global_batch_size" in waived.reason
    # a problem that breaks one (compile on Megatron) waives nothing: every layout is refused by it
    compiled = Problem(LLAMA_TINY, clean.cluster, clean.training.model_copy(update={"compile": True}))
    assert problem_waiver(compiled) == frozenset()
    result = brute_force(compiled, top=3)
    assert not result.plans and result.rejected
    assert {r.reason for r in result.rejected} == {"compile is modelled for torchtitan jobs only, not megatron [megatron]"}


def test_tp_that_does_not_divide_the_mamba_groups_is_never_priced():
    # Megatron splits Mamba heads and groups over tp (rules.mamba_tp); with 2 groups, tp 4 is not a
    # layout, and pricing it would split the scan into no blocks at all
    m = HYBRID_TINY.model_copy(update={"mamba": HYBRID_TINY.mamba.model_copy(update={"num_groups": 2})})
    result = search(problem(m, 4))
    assert result.optimal and result.plans
    assert {p.job.layout.tp for p in result.plans} <= {1, 2}


def test_pp_split_keeps_the_search_to_one_kind_of_pipeline_split():
    # Megatron-LM before fa8bb5921b (2024-09-05) splits the layers evenly only: with --fix pp_split=even no
    # plan has uneven ends, the embedding or loss counted as layers, or a layout, so Llama-3.1-405B's 126
    # layers on 1,024 GPUs leave pp 1 and 2 (the divisors of 126 that divide 1,024); unconstrained, the
    # search ranks uneven pipelines first.
    from cost_models.errors import SpecError
    from planner.runners import run_plan
    from planner.space import parse_fixes

    free = run_plan("llama-3.1-405b", "dgx-h100", 1024, training=dict(seq_len=4096, global_batch_size=1024), fixes=[], top=3)
    assert any(p.job.layout.pp_first_stage_layers or p.job.layout.pp_last_stage_layers or p.job.layout.account_for_loss
               for p in free.plans)
    even = run_plan("llama-3.1-405b", "dgx-h100", 1024, training=dict(seq_len=4096, global_batch_size=1024),
                    fixes=["pp_split=even"], top=3)
    for p in even.plans:
        lay = p.job.layout
        assert lay.pp in (1, 2) and lay.pp_first_stage_layers is None and lay.pp_last_stage_layers is None
        assert lay.pp_layout is None and not lay.account_for_embedding and not lay.account_for_loss
    with pytest.raises(SpecError, match=r"--fix pp_split=uneven: must be even, ends, account or layout"):
        parse_fixes(["pp_split=uneven"])


def test_without_gradient_accumulation_a_step_without_pipeline_is_one_micro_batch():
    # torchtitan before 8570415c3 (2025-06-05) runs one forward and backward of the local batch per step
    # at pp 1. With mbs 1, 16 sequences over at most 8 data-parallel ranks take at least 2 micro-batches
    # at pp 1, so with grad_accumulation off only pipelines are left (their local batch is split into
    # the pipeline's micro-batches); unconstrained, pp 1 dp 8 with 2 micro-batches is #1.
    free = search(problem(LLAMA_TINY, 8, gbs=16, framework="torchtitan", mbs=1), top=5)
    assert (free.plans[0].job.layout.pp, free.plans[0].job.num_microbatches) == (1, 2)
    p = problem(LLAMA_TINY, 8, gbs=16, framework="torchtitan", **parse_fixes(["mbs=1", "grad_accumulation=false"]))
    cpsat, brute = search(p, top=5), brute_force(p, top=5)
    assert cpsat.optimal and cpsat.plans
    assert [x.key for x in cpsat.plans] == [x.key for x in brute.plans]
    assert all(x.job.layout.pp > 1 for x in cpsat.plans)
    # and the mbs that makes one micro-batch per rank at pp 1 (16 / dp 8 = 2) is searched
    one = search(problem(LLAMA_TINY, 8, gbs=16, framework="torchtitan", tp=1, pp=1, grad_accumulation=False), top=5)
    assert one.plans and all(x.job.layout.mbs == 2 and x.job.num_microbatches == 1 for x in one.plans)


def test_torchtitan_0_3_searches_tensor_parallel_without_sequence_parallel():
    # torchtitan's ParallelismConfig.enable_sequence_parallel (aa68af18e, 2026-03-29, after 0.2.2)
    # turns the norms' sequence sharding off; KempnerForge runs tp that way on every pipeline stage.
    # 0.3 searches it (and its launch writes it); 0.2 has no switch, so sp stays on there.
    from planner.launch.build import launch_refusal
    from planner.launch.options import LaunchOptions
    from planner.space import sp_values

    p = problem(LLAMA_TINY, 4, gbs=8, framework="torchtitan", tp=2, sp=False)
    cpsat, brute = search(p, top=5), brute_force(p, top=5)
    assert cpsat.plans and [x.key for x in cpsat.plans] == [x.key for x in brute.plans]
    assert all(x.job.layout.tp == 2 and not x.job.sp and launch_refusal(x.job) is None for x in cpsat.plans)
    assert sp_values(p, 2) == [False] and sp_values(p, 1) == [False]
    old = Problem(p.model, p.cluster, p.training, fixed=p.fixed, launch=LaunchOptions(torchtitan_version="0.2"))
    assert sp_values(old, 2) == [] and not search(old, top=5).plans
    free = Problem(p.model, p.cluster, p.training, fixed={"tp": 2})
    assert sp_values(free, 2) == [True, False]


def test_torchtitan_searches_its_generated_pipeline_split():
    # torchtitan's split where none is given (generate_split_points, 9dec370): 6 layers in 2·2 stages
    # are 1/2/2/1, rank 0 running stages 0 and 2 (1 + 2 layers), rank 1 stages 1 and 3 (2 + 1)
    from planner.launch.build import launch_refusal
    from planner.space import generated_split, stages

    assert generated_split(126, 8, 2) == (7,) + (8,) * 14 + (7,)  # Llama 3.1 405B at pp 8: ranks 15/16/…/16/15
    assert generated_split(126, 8, 1) == (15,) + (16,) * 6 + (15,) and generated_split(8, 2, 2) is None
    model = LLAMA_TINY_8.model_copy(update=dict(name="llama-tiny-6", num_layers=6))
    p = problem(model, 4, gbs=8, framework="torchtitan", tp=1, cp=1, pp=2, vpp=2, mbs=1)
    made = [st for st in stages(p) if st.chunks is not None]
    assert {(st.chunks, st.layers, st.pp_layout) for st in made} == {((1, 2, 2, 1), (3, 3), "Et|(t*2|)*2,tL")}
    cpsat, brute = search(p, top=20), brute_force(p, top=20)
    assert [x.key for x in cpsat.plans] == [x.key for x in brute.plans]
    ours = [x for x in cpsat.plans if x.job.layout.pp_layout == "Et|(t*2|)*2,tL"]
    assert ours and all(launch_refusal(x.job) is None for x in ours)
    assert [[len(c) for c in chunks] for chunks in ours[0].job.stage_chunks] == [[1, 2], [2, 1]]
    # torchtitan is told it as module lists, stage s = chunk v of rank r at s = v·pp + r
    from planner.launch.torchtitan import split as titan_split
    fqns = titan_split(ours[0].job, "lm_head").fqns
    assert fqns is not None and [[m for m in s if m.startswith("layers.")] for s in fqns] == [
        ["layers.0"], ["layers.1", "layers.2"], ["layers.3", "layers.4"], ["layers.5"]]
    # Megatron has no such default: its space holds no generated split (the same 1/2/2/1 is there as the
    # embedding and loss counted as layers, test_megatron_counts_the_embedding_and_loss_as_layers)
    assert all(st.chunks is None for st in stages(problem(model, 4, gbs=8, tp=1, cp=1, pp=2, vpp=2, mbs=1)))


def test_megatron_counts_the_embedding_and_loss_as_layers():
    # Megatron's --account-for-embedding/loss-in-pipeline-split (transformer_config.py L2370-2413 at
    # d98e8a64): 6 layers + E + L = 8 units over pp 2 · vpp 2 are 2 a virtual stage, the first and the
    # last building one decoder layer fewer: 1/2/2/1, beside the uneven ends 2/4 and 4/2 (each rank's
    # layers in equal chunks: 1/2/1/2, 2/1/2/1); E or L alone leaves 7 units. CP-SAT and brute force
    # rank the same layouts of them.
    from planner.space import account_vpps, stages

    # Llama-3.1-405B at pp 8: 16 units a rank, vpp 16 would leave the first and last stage no layer;
    # E or L alone is 127 units, no multiple of 8; at pp 2, 64 a rank: above MAX_VPP where they divide
    assert account_vpps(126, 8, True, True) == [1, 2, 4, 8] and account_vpps(126, 8, True, False) == []
    assert account_vpps(126, 2, True, True) == [1, 2, 4, 8, 16, 32]
    model = LLAMA_TINY_8.model_copy(update=dict(name="llama-tiny-6", num_layers=6))
    p = problem(model, 4, gbs=8, tp=1, cp=1, pp=2, vpp=2, mbs=1)
    assert {(st.embedding, st.loss, st.sizes(6)) for st in stages(p)} == {
        (True, True, (1, 2, 2, 1)), (False, False, (1, 2, 1, 2)), (False, False, (2, 1, 2, 1))}
    cpsat, brute = search(p, top=20), brute_force(p, top=20)
    assert [x.key for x in cpsat.plans] == [x.key for x in brute.plans]
    ours = [x for x in cpsat.plans if x.job.layout.account_for_embedding and x.job.layout.account_for_loss]
    assert ours and [[len(c) for c in chunks] for chunks in ours[0].job.stage_chunks] == [[1, 2], [2, 1]]
    only = problem(model, 4, gbs=8, tp=1, cp=1, pp=2, vpp=2, mbs=1, pp_split="account")
    assert [x.key for x in search(only, top=5).plans] == [x.key for x in ours[:5]]
    # DeepSpeed and torchtitan never get it (rules.deepspeed_axes; torchtitan places modules by its own split)
    for fw in ("torchtitan", "deepspeed"):
        assert not any(st.embedding or st.loss for st in stages(problem(model, 4, gbs=8, framework=fw, tp=1, cp=1, mbs=1)))


# NVIDIA's MLPerf v5.0 Llama-3.1-405B layout: tp 8, pp 8, vpp 8, cp 2, both account flags
MLPERF_405B = ["llama-3.1-405b", "--cluster", "dgx-h100", "--gpus", "512", "--seq-len", "8192",
               "--fix", "tp=8", "--fix", "pp=8", "--fix", "vpp=8", "--fix", "cp=2"]


def test_405b_at_pp8_vpp8_takes_the_embedding_and_loss_as_layers():
    # At vpp 8 the 126 layers have one split: even needs 64 equal stages (126/64 is not whole); uneven
    # ends and the memory splits put each rank's layers in 8 equal chunks (f + l + 6c = 126 with f, l,
    # c multiples of 8 has no solution, 126 being no multiple of 8); E or L alone is 127 units, no
    # multiple of 64; E and L are 128 = 64 stages of 2 units, the first and the last of 1 layer.
    from planner.space import PP_SPLITS, stages

    res = runner.invoke(app, ["plan", *MLPERF_405B, "--top", "3", "--json"])
    assert res.exit_code == 0, res.output
    plans = json.loads(res.output)["plans"]
    assert plans and all(p["layout"]["account_for_embedding"] and p["layout"]["account_for_loss"] for p in plans)
    # narrowed to the other kinds (Megatron-LM before ef490839e8, 2025-02-03), nothing is left
    fixes = {"tp": 8, "pp": 8, "vpp": 8, "cp": 2}
    old = problem(presets.models()["llama-3.1-405b"], 512, seq=8192, gbs=512, **fixes)
    old = Problem(old.model, old.cluster, old.training, fixed=fixes,
                  allowed={"pp_split": frozenset(k for k in PP_SPLITS if k != "account")})
    assert next(stages(old), None) is None
    res = runner.invoke(app, ["plan", *MLPERF_405B, "--fix", "pp_split=ends"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "no pipeline split of the 126 layers takes it" in res.output and len(res.output.strip().splitlines()) == 1


def test_vpp_above_eight_is_searched_where_the_layers_split_evenly():
    # GPT-3 175B's 96 layers at pp 8 are 12 a rank: vpp 12 (one layer a chunk, NVIDIA's MLPerf GPT-3
    # layout) splits evenly, 9 to 11 do not; Llama-3.1-405B's 126 layers do not divide by 8 at all
    from planner.space import vpp_values

    assert vpp_values(96, 8) == [1, 2, 3, 4, 5, 6, 7, 8, 12]
    assert vpp_values(126, 8) == list(range(1, 9))
    assert vpp_values(80, 4) == [*range(1, 9), 10, 20]
    args = ["gpt3-175b", "--cluster", "dgx-h100", "--gpus", "512", "--seq-len", "2048", "--global-batch-size", "1536",
            "--dtype", "fp8", "--tp-comm-overlap"]
    res = runner.invoke(app, ["plan", *args, "--top", "1", "--json", "--fix", "tp=4", "--fix", "pp=8", "--fix", "vpp=12"])
    assert res.exit_code == 0, res.output
    best = json.loads(res.output)["plans"][0]
    assert (best["layout"]["pp"], best["layout"]["vpp"]) == (8, 12)
    # an uneven vpp above eight stays out: --fix vpp=10 at pp 8 has no split
    res = runner.invoke(app, ["plan", *args, "--fix", "pp=8", "--fix", "vpp=10"])
    assert res.exit_code == 2 and "no pipeline split" in res.output, res.output
