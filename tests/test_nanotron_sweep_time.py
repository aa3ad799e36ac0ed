"""nanotron's whole Ultra-Scale Playbook sweep as the planner's question: on one problem, does the time
model's pick among the configurations that ran and fit land on one the sweep measured as good as the best?"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))
from benchmarks.nanotron_sweep_memory import points  # noqa: E402
from benchmarks.nanotron_sweep_time import Problem, disagreeing, predict, problems  # noqa: E402
from benchmarks.published import entries  # noqa: E402
from cost_models.calibration import DEFAULT  # noqa: E402

# plan_quality.CLOSE: within 3% the planner counts two layouts as tied
TIED = 0.03


def _problem(size: str, nodes: int) -> tuple[Problem, list]:
    pts = [p for p in points() if (p.params_b, p.nodes) == (size, nodes)]
    timed, unbuilt = predict(pts, {e["id"]: e for e in entries()}, DEFAULT)
    (problem,) = problems(timed)
    return problem, [p for p, _ in unbuilt]


def test_the_pick_for_3p57b_on_16_nodes_is_measured_as_good_as_the_best_and_so_is_the_next_one():
    # 3.57B on 16 nodes (128 H100): 147 configurations ran, each once, and the memory model fits all 147
    # (benchmarks/data/nanotron_usp_sweep.csv: 176 points, 29 of them nan). As measured
    # (tok/s/GPU): dp32 tp4 pp1 mbs8 ZeRO-0 13,337 (the published cell), then dp32 tp4 mbs4 z0 12,072 and
    # dp64 tp2 mbs2 z0 12,028, then dp32 tp4 mbs8 z1 11,171. The best is 10.5% above the next, so only
    # the best is within the 3% tie band: any other pick fails the first assert.
    p, unbuilt = _problem("3.57", 16)
    # every configuration is priced, the 14 pipelines of 16 and 32 stages whose output layer nanotron
    # places before the last rank included (published.nanotron_block_ranks)
    assert not unbuilt and len(p.configs) == 147
    assert p.best.config == (32, 4, 1, 8, 0) and p.best.measured == 13337
    assert p.regret >= -TIED, (p.chosen.config, p.chosen.measured)
    # Held out: without the published cell, the pick among the rest must be one of the two measured
    # within 3% of the best of the rest (12,072 and 12,028; the next, 11,171, is 7.5% below), neither of
    # which any source row was read from.
    rest = [t for t in p.candidates if t is not p.best]
    best_rest = max(t.measured for t in rest)
    assert rest[0].measured >= (1 - TIED) * best_rest, (rest[0].config, rest[0].measured, best_rest)


def test_the_list_of_disagreeing_points_names_only_what_is_there():
    # 3.57B on 16 nodes without its runs below 1% MFU: 121 points, every one predicted, none below 1%
    # and 50 below 10% (the csv's mfu_pct column); none is measured twice or at another global batch
    pts = [p for p in points() if (p.params_b, p.nodes) == ("3.57", 16) and (p.mfu_pct or 0) >= 1]
    timed, unbuilt = predict(pts, {e["id"]: e for e in entries()}, DEFAULT)
    assert disagreeing(timed, unbuilt) == ("- 0 of 121 predicted points ran below 1% MFU (the figure's own MFU); "
                                           "below 10% MFU: 50")
