"""benchmarks/plan_quality.py: the rank it reports, the search-space bounds it names, and that the
published layout is scored as `planner estimate` scores it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))

from benchmarks.plan_quality import rank_of, run_row  # noqa: E402
from benchmarks.published import load  # noqa: E402
from planner.runners import run_estimate  # noqa: E402
from planner.search import Plan  # noqa: E402

RUN = "torchtitan-2412-8b-8gpu-fsdp"  # 8 GPUs, Llama 3.1 8B: a search of about 0.1 s


@pytest.fixture(scope="module")
def row():  # type: ignore[no-untyped-def]
    run = next(r for r in load()[0] if r.id == RUN)
    return run_row(run, time_limit_s=30.0)


@pytest.mark.parametrize(("step", "rank"), [
    (1.0, 1),  # ties our #1: nothing is strictly faster
    (1.05, 2),
    (1.3, 4),  # ties #4: three faster
    (1.4, 5),
    (1.5, None),  # slower than all five: only "> 5" is known
])
def test_rank_counts_the_strictly_faster_listed_layouts(step: float, rank: int | None) -> None:
    assert rank_of(step, [1.0, 1.1, 1.2, 1.3, 1.4], top=5) == rank


def test_rank_is_exact_when_the_space_holds_fewer_layouts_than_asked() -> None:
    assert rank_of(9.0, [1.0, 2.0], top=5) == 3


def test_published_step_is_what_planner_estimate_gives(row) -> None:  # type: ignore[no-untyped-def]
    run = row.run
    report = run_estimate(run.model.name, run.cluster.spec.name, run.cluster.num_gpus,
                          training=run.training.model_dump(), layout=run.layout.model_dump())
    assert isinstance(row.published, Plan)
    assert row.published.time.step_s == report.time.step_s == row.published_time.step_s


def test_a_proven_top_k_is_never_beaten_by_a_layout_of_its_own_space(row) -> None:  # type: ignore[no-untyped-def]
    assert row.result.optimal and not row.outside
    assert row.best.time.step_s <= row.published.time.step_s
    assert row.gain is not None and row.gain >= 0


def test_outside_space_names_the_bound(row) -> None:  # type: ignore[no-untyped-def]
    from benchmarks.plan_quality import outside_space
    from cost_models.rules import resolve
    from planner.space import Problem

    run = row.run
    problem = Problem(run.model, run.cluster, run.training)
    # seq 8192 over cp 8 leaves 1024 tokens per rank (allowed); mbs 3 does not divide the global batch
    job = resolve(run.model, run.cluster, run.training.model_copy(update=dict(global_batch_size=24)),
                  run.layout.model_copy(update=dict(mbs=3, cp=8, dp=None)))
    assert [axis for axis, _ in outside_space(problem, job)] == ["mbs"]
