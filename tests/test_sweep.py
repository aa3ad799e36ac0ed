"""planner sweep: GPU-count parsing, the best plan per count, and strong-scaling efficiency."""

from __future__ import annotations

import pytest

from cost_models.errors import SpecError
from planner.runners import run_plan
from planner.sweep import parse_gpus, run_sweep


def test_parse_gpus():
    assert parse_gpus("64..512") == [64, 128, 256, 512]
    assert parse_gpus("48..200") == [48, 64, 128, 200]
    assert parse_gpus("256, 64,128") == [64, 128, 256]
    for bad in ("0..8", "16..8", "a..b", "", "8,-8"):
        with pytest.raises(SpecError, match="--gpus"):
            parse_gpus(bad)


def test_sweep_rows_are_plan_number_one_with_scaling_efficiency():
    training = dict(seq_len=4096, global_batch_size=256)
    rows = run_sweep("llama-3.1-8b", "dgx-h100", [1, 8, 16, 32], training=training, fixes=[])
    assert rows[0].report is None and "no layout" in rows[0].reason  # 8B does not fit on one H100
    fitting = [r for r in rows if r.report is not None]
    assert [r.gpus for r in fitting] == [8, 16, 32]
    for r in fitting:
        best = run_plan("llama-3.1-8b", "dgx-h100", r.gpus, training=training, fixes=[], top=1).plans[0]
        assert r.report.time.step_s == best.time.step_s
    base = fitting[0]
    assert base.efficiency == 1.0 and base.grew is None
    for r in fitting[1:]:
        expected = r.report.time.tokens_per_s / (base.report.time.tokens_per_s * r.gpus / base.gpus)
        assert r.efficiency == pytest.approx(expected)
        assert r.grew in dict(r.report.time.breakdown.parts)
        doc = r.to_json()
        assert doc["fits"] and doc["scaling_efficiency"] == r.efficiency and doc["layout"]["tp"] == r.report.job.layout.tp
