"""planner sweep: GPU-count parsing, the best plan per count, and strong-scaling efficiency."""

from __future__ import annotations

import json

import pytest

from cost_models.errors import SpecError
from planner.runners import run_plan
from planner.sweep import SweepRow, parse_gpus, run_sweep, scaling_limit


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
        before, after = r.grew_shares
        share = {name: float(r.report.time.breakdown.value(name)) / r.report.time.step_s for name, _ in r.report.time.breakdown}
        share0 = {name: float(base.report.time.breakdown.value(name)) / base.report.time.step_s
                  for name, _ in base.report.time.breakdown}
        assert (before, after) == pytest.approx((share0.get(r.grew, 0.0), share[r.grew]))
        assert after - before == pytest.approx(max(v - share0.get(k, 0.0) for k, v in share.items()))

def test_scaling_limit_is_the_first_count_under_the_threshold():
    def row(gpus, eff, grew=None, shares=None):
        return SweepRow(gpus, object(), None, eff, grew, shares)

    rows = [SweepRow(8, None, "no layout"), row(16, 1.0), row(32, 0.97, "dp", (0.01, 0.05)),
            row(64, 0.85, "bubble", (0.02, 0.2)), row(128, 0.95, "dp", (0.01, 0.03))]
    b = scaling_limit(rows)
    assert (b.last_good, b.row.gpus) == (32, 64)
    assert b.line() == ("scaling stays at or above 90% through 32 GPUs and falls to 85% at 64: "
                        "bubble grows from 2.0% to 20.0% of the step")
    assert b.to_json()["breaks_at_gpus"] == 64 and b.to_json()["term_share_to"] == 0.2
    assert scaling_limit(rows, threshold=0.8).row is None
    assert scaling_limit(rows, threshold=0.8).line() == "scaling stays at or above 80% through 128 GPUs"
    assert scaling_limit(rows[:1]).line() == "no GPU count of the sweep has a layout"


def _png_size(path):  # type: ignore[no-untyped-def]
    """(width, height) from a PNG's IHDR chunk."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_sweep_and_memory_draw_pngs(tmp_path):
    from typer.testing import CliRunner

    from planner.cli import app

    runner = CliRunner()
    res = runner.invoke(app, ["sweep", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "8..32", "--global-batch-size", "256",
                              "--png", str(tmp_path / "sweep.png")])
    assert res.exit_code == 0, res.output
    w, h = _png_size(tmp_path / "sweep.png")
    assert w > 400 and h > 400
    res = runner.invoke(app, ["memory", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "8", "--tp", "2", "--pp", "4",
                              "--png", str(tmp_path / "mem.png")])
    assert res.exit_code == 0, res.output
    assert _png_size(tmp_path / "mem.png")[0] > 400
    res = runner.invoke(app, ["memory", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "8", "--png", str(tmp_path / "m.jpg")])
    assert res.exit_code == 2 and "expected a file name ending in .png" in res.output
    assert not (tmp_path / "m.jpg").exists()


def test_png_without_matplotlib_is_one_line(tmp_path, monkeypatch):
    import sys

    from typer.testing import CliRunner

    from planner.cli import app

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as when the extra is missing
    res = CliRunner().invoke(app, ["memory", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "8", "--png", str(tmp_path / "m.png")])
    assert res.exit_code == 2
    assert "pip install 'llm-parallelism-planner[plots]'" in res.output and "Traceback" not in res.output


def test_sweep_tokens_give_each_count_its_time_to_train():
    import json

    from typer.testing import CliRunner

    from planner.cli import app

    common = ["llama-3.1-8b", "--cluster", "dgx-h100", "--global-batch-size", "256", "--tokens", "1e12", "--json"]
    res = CliRunner().invoke(app, ["sweep", *common, "--gpus", "8,16"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)["sweep"]
    for row in rows:
        plan = json.loads(CliRunner().invoke(app, ["plan", *common, "--gpus", str(row["gpus"]), "--top", "1"]).output)
        assert row["time_to_train"] == plan["plans"][0]["time_to_train"]
        assert row["checkpoint"] == plan["plans"][0]["checkpoint"]


def test_sweep_json_is_the_same_twice():
    from typer.testing import CliRunner

    from planner.cli import app

    argv = ["sweep", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "8..32", "--seq-len", "4096",
            "--global-batch-size", "256", "--json"]
    first, second = (CliRunner().invoke(app, argv) for _ in range(2))
    assert first.exit_code == 0 and first.stdout == second.stdout
    doc = json.loads(first.stdout)
    assert [r["gpus"] for r in doc["sweep"]] == [8, 16, 32] and doc["scaling_limit"]["threshold"] == 0.9


def test_a_count_whose_search_times_out_is_no_answer_and_the_sweep_goes_on(monkeypatch):
    # A search stopped by its time limit is not a proof: with nothing scored that fits, the count is "no
    # answer" (fits null, timed_out), never "no layout fits"; with a layout scored, it is that layout,
    # not proven. Either way the sweep goes on to the next count.
    import dataclasses

    import planner.search as search

    real = search.search

    def stopped(problem, **kw):
        result = real(problem, **kw)
        if problem.gpus == 8:
            return dataclasses.replace(result, plans=[], optimal=False, timed_out=True)
        if problem.gpus == 16:
            return dataclasses.replace(result, optimal=False, timed_out=True)
        return result

    monkeypatch.setattr(search, "search", stopped)
    rows = run_sweep("llama-3.1-8b", "dgx-h100", [8, 16, 32], training={}, fixes=[])
    assert [r.gpus for r in rows] == [8, 16, 32]
    none, unproven, proven = (r.to_json() for r in rows)
    assert none["fits"] is None and none["timed_out"] and "not a proof that none does" in none["reason"]
    assert unproven["fits"] and unproven["proven"] is False
    assert proven["fits"] and proven["proven"] is True


def test_a_sweep_whose_every_search_times_out_says_no_answer_per_count():
    from typer.testing import CliRunner

    from planner.cli import app

    res = CliRunner().invoke(app, ["sweep", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "8,16", "--time-limit", "1e-6"])
    assert res.exit_code == 0, res.output
    assert res.output.count("search timed out: no answer") == 2 and "no layout fits" not in res.output
    assert "no GPU count of the sweep has a layout found within the search's time limit" in res.output
