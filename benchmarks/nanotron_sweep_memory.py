"""nanotron's whole Ultra-Scale Playbook sweep against the memory model: a held-out check of the rules
the 26 nanotron_ultrascale rows of published_runs.yaml were read with.

The 26 rows are the best cell of each model size and node count. The playbook's interactive sweep
figure prints every configuration the sweep ran at those sizes and node counts, crashed ones as nan
(vinjn/nanotron-ultrascale-playbook@e3bcfc5c assets/data/benchmarks/benchmarks_interactive.html, the
hover text of each point: Nodes, MBS, GradAcc, GBS, DP, PP, TP, ZeRO, MFU, tok/s/gpu, tok/s, GPU
memory; the subplots 1B/3B/8B/80B are the 1.34/3.57/8.86/80.0B models of nanotron's README figure,
huggingface/nanotron@c2528430 docs/benchmark_summary.svg, whose cells are these points). The
memory is the same counter as the 26 rows' (benchmarks/memory_accuracy.py SOURCES), so every other
point is a configuration the rules were not read from. A configuration the figure prints twice with
different numbers (another run of it) is kept twice.

Each point is predicted as its published row of the same model size is (benchmarks/published.py
_nanotron; sequence parallel at tp > 1, nanotron's REDUCE_SCATTER mode), with the layout, micro-batch
and ZeRO stage of the point. With --replay the points with a pipeline are also replayed through
benchmarks/nanotron_allocator_replay.py (no capacity), which the cost model does not use.

Run: python benchmarks/nanotron_sweep_memory.py [--replay] [--write docs/accuracy.md] [--extract benchmarks_interactive.html]
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import re
from collections import Counter
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from cost_models.memory import memory_estimate
from cost_models.units import GiB

sys.path.insert(0, str(Path(__file__).parent))
from memory_accuracy import Metric, allocator_bytes, measured_gib, write_section  # noqa: E402
from nanotron_allocator_replay import replay_run  # noqa: E402
from published import PublishedRun, Skip, _nanotron_cluster, _run, entries  # noqa: E402

SWEEP = Path(__file__).parent / "data" / "nanotron_usp_sweep.csv"
SECTION = "## nanotron's sweep against the memory model"
GLOBAL_BATCH = 256  # every point's GBS (sequences) in the figure
# The figure's subplot axes and the published row whose model and hardware each size shares.
SUBPLOTS = {"x": "1.34", "x2": "3.57", "x3": "8.86", "x4": "80.0"}
MODEL_ROWS = {"1.34": "nanotron-usp-1p34b-1nodes-dp4-tp1-pp2-mbs4", "3.57": "nanotron-usp-3p57b-1nodes-dp4-tp1-pp2-mbs2",
              "8.86": "nanotron-usp-8p86b-1nodes-dp2-tp1-pp4-mbs1", "80.0": "nanotron-usp-80p0b-4nodes-dp1-tp8-pp4-mbs1"}
SIZES = {float(size): size for size in MODEL_ROWS}
FIELDS = ("params_b", "nodes", "dp", "tp", "pp", "mbs", "grad_acc", "zero", "mfu_pct", "tok_s_per_gpu", "memory_gib")


@dataclass(frozen=True)
class Point:
    params_b: str
    nodes: int
    dp: int
    tp: int
    pp: int
    mbs: int
    grad_acc: int
    zero: int
    memory_gib: float | None  # None: the run crashed (nan in the figure)
    tok_s_per_gpu: float | None = None  # the figure's tok/s/gpu; None where it prints nan
    mfu_pct: float | None = None

    @property
    def group(self) -> str:
        return f"ZeRO-{self.zero} {'pp > 1' if self.pp > 1 else 'pp = 1'} {'tp > 1' if self.tp > 1 else 'tp = 1'}"


def extract(html: str) -> list[dict[str, str]]:
    """Every distinct point of the interactive figure's hover texts."""
    start = html.index("[", html.index("Plotly.newPlot("))
    traces, _ = json.JSONDecoder().raw_decode(html[start:])
    out: dict[tuple[str, ...], dict[str, str]] = {}
    for trace in traces:
        for text in trace.get("text") or []:
            plain = text.replace("<br>", "|").replace("<b>", "").replace("</b>", "").replace("\t", "")
            f = dict(re.findall(r"(\w[\w/ ]*?):\s*([^|]+)", plain))
            assert int(f["GBS"]) == GLOBAL_BATCH, f
            row = {"params_b": SUBPLOTS[trace["xaxis"]], "nodes": f["Nodes"], "dp": f["DP"], "tp": f["TP"], "pp": f["PP"],
                   "mbs": f["MBS"], "grad_acc": f["GradAcc"], "zero": f["ZeRO"], "mfu_pct": f["MFU"].rstrip("%").strip(),
                   "tok_s_per_gpu": f["tok/s/gpu"].replace(",", "").strip(), "memory_gib": f["GPU memory"].split()[0]}
            out[tuple(row.values())] = row
    return sorted(out.values(), key=lambda r: tuple(float(r[k]) if r[k] != "nan" else -1.0 for k in FIELDS))


def points(path: Path = SWEEP) -> list[Point]:
    with path.open() as f:
        return [Point(r["params_b"], int(r["nodes"]), int(r["dp"]), int(r["tp"]), int(r["pp"]), int(r["mbs"]),
                      int(r["grad_acc"]), int(r["zero"]), *(None if r[k] == "nan" else float(r[k]) for k in ("memory_gib", "tok_s_per_gpu", "mfu_pct")))
                for r in csv.DictReader(f)]


def job(p: Point, rows: dict[str, dict]):  # type: ignore[no-untyped-def]
    """The point's job: its size's published row with the point's layout."""
    entry = copy.deepcopy(rows[MODEL_ROWS[p.params_b]])
    entry["id"] = f"sweep-{p.params_b}b-{p.nodes}n-dp{p.dp}-tp{p.tp}-pp{p.pp}-mbs{p.mbs}-zero{p.zero}"
    entry["layout"].update(dp=p.dp, tp=p.tp, pp=p.pp, micro_batch=p.mbs, global_batch=GLOBAL_BATCH, sp=p.tp > 1,
                           zero="ZeRO-1" if p.zero else "none")
    entry["hardware"]["gpu_count"] = p.dp * p.tp * p.pp
    return _run(entry)


def build(p: Point, rows: dict[str, dict]) -> tuple[PublishedRun | None, str]:
    """(the point's run, "") or (None, why the mapping cannot build it: a layout nanotron or the model rejects)."""
    try:
        return job(p, rows), ""
    except (AssertionError, Skip) as err:
        return None, str(err)


@dataclass
class Evaluation:
    cost: dict[str, list[float]] = field(default_factory=dict)  # Point.group -> cost-model errors
    replay: dict[str, list[float]] = field(default_factory=dict)  # Point.group -> replay errors (pp > 1)
    fits: Counter[tuple[bool, bool]] = field(default_factory=Counter)  # (ran, predicted to fit) -> points
    unbuilt: list[str] = field(default_factory=list)  # why each point with a memory was not predicted


def evaluate(pts: list[Point], rows: dict[str, dict], *, replay: bool = False) -> Evaluation:
    """Every point predicted: its rank 0's reserved error by group, and whether the model has it fit."""
    ev = Evaluation()
    for p in pts:
        run, why = build(p, rows)
        if run is None:
            if p.memory_gib is not None:
                ev.unbuilt.append(why)
            continue
        est = memory_estimate(run.job())
        ev.fits[p.memory_gib is not None, est.fits] += 1
        if p.memory_gib is None:
            continue
        ev.cost.setdefault(p.group, []).append(allocator_bytes(est, Metric.RESERVED)[0] / GiB / p.memory_gib - 1)
        if replay and p.pp > 1:
            ev.replay.setdefault(p.group, []).append(replay_run(run).reserved / GiB / p.memory_gib - 1)
    return ev


def summary(name: str, errors: list[float]) -> str:
    if not errors:
        return f"| {name} | 0 | | | |"
    mags = sorted(abs(e) for e in errors)
    return (f"| {name} | {len(errors)} | {statistics.median(errors):+.1%} | {statistics.median(mags):.1%} | "
            f"{sum(e <= 0.10 for e in mags)}/{len(mags)} |")


def error_table(points: str, predictor: str, errors: dict[str, list[float]]) -> str:
    """The errors of each group (Point.group) and of all, one summary row each."""
    return (f"| {points} | n | {predictor} median error | median |error| | within 10% |\n|---|---:|---:|---:|---:|\n"
            + "\n".join([summary(g, errors[g]) for g in sorted(errors)]
                        + [summary("all", [e for es in errors.values() for e in es])]))


def repeats(pts: list[Point]) -> list[tuple[Point, list[float]]]:
    """Every configuration the sweep measured more than once (the same size, nodes, layout, micro-batch,
    accumulation and ZeRO stage): its first point and its memory readings, in the figure's order."""
    readings: dict[tuple, list[Point]] = {}
    for p in pts:
        if p.memory_gib is not None:
            readings.setdefault((p.params_b, p.nodes, p.dp, p.tp, p.pp, p.mbs, p.grad_acc, p.zero), []).append(p)
    return [(same[0], [q.memory_gib for q in same if q.memory_gib is not None]) for same in readings.values() if len(same) > 1]


def spread(readings: list[float]) -> float:
    """How far apart one configuration's readings are: the largest over the smallest, less 1."""
    return max(readings) / min(readings) - 1


def repeat_table(pts: list[Point]) -> str:
    """The source's own repeatability: how far apart the readings of a configuration run more than once are."""
    reps = repeats(pts)
    if not reps:
        return "No configuration was measured more than once."
    spreads = [spread(r) for _, r in reps]
    lines = [f"Repeat readings: {len(reps)} configurations were measured more than once on the same cluster; their readings "
             f"lie {statistics.median(spreads):.1%} apart at the median (largest / smallest − 1) and {max(spreads):.1%} at most, "
             f"{sum(s > 0.10 for s in spreads)} of {len(reps)} more than 10% apart. A prediction cannot be within 10% of "
             f"both readings of a pair more than {1.10 / 0.90 - 1:.0%} apart (1.1 / 0.9), and no model of the configuration "
             "alone tells such readings apart.",
             "", "| model | nodes | dp | tp | pp | mbs | ZeRO | readings GiB | spread |", "|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    for p, r in sorted(reps, key=lambda pr: -spread(pr[1])):
        lines.append(f"| {p.params_b}B | {p.nodes} | {p.dp} | {p.tp} | {p.pp} | {p.mbs} | {p.zero} | "
                     f"{', '.join(f'{m:.1f}' for m in r)} | {spread(r):.1%} |")
    return "\n".join(lines)


def published_cells(pts: list[Point], rows: dict[str, dict]) -> list[str]:
    """The published rows whose layout and memory the sweep does not print (an empty list: all agree)."""
    by_key: dict[tuple, list[float]] = {}
    for p in pts:
        if p.memory_gib is not None:
            by_key.setdefault((p.params_b, p.nodes, p.dp, p.tp, p.pp, p.mbs, p.zero), []).append(p.memory_gib)
    bad = []
    for rid, e in rows.items():
        if e.get("group") != "nanotron_ultrascale":
            continue
        lay, cluster = e["layout"], _nanotron_cluster(e)
        # the figure prints the memory to 0.1 GiB, so a published cell matches a point within half of that
        key = (SIZES[float(e["model"]["params_b"])], cluster.num_gpus // cluster.spec.gpus_per_node, lay["dp"], lay["tp"],
               lay["pp"], lay["micro_batch"], int("ZeRO-1" in (lay.get("zero") or "")))
        if not any(abs(m - measured_gib(e)) <= 0.05 + 1e-9 for m in by_key.get(key, [])):
            bad.append(rid)
    return bad


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replay", action="store_true", help="also replay the pipeline points through the allocator model")
    parser.add_argument("--write", type=Path, help="also write the tables into this markdown file")
    parser.add_argument("--extract", type=Path, help="rewrite the csv from the playbook's benchmarks_interactive.html")
    args = parser.parse_args()
    if args.write and args.replay:
        parser.error("--write: the section holds the cost model's table only; run it without --replay")
    if args.extract:
        extracted = extract(args.extract.read_text())
        with SWEEP.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS)
            writer.writeheader()
            writer.writerows(extracted)
        print(f"{len(extracted)} points written to {SWEEP}")
    pts = points()
    rows = {e["id"]: e for e in entries()}
    ran = [p for p in pts if p.memory_gib is not None]
    ev = evaluate(pts, rows, replay=args.replay)
    cost, rep, fits, unbuilt = ev.cost, ev.replay, ev.fits, ev.unbuilt
    lines = [f"{len(pts)} points, {len(ran)} with a memory; published cells not found in the sweep: "
             f"{published_cells(pts, rows) or 'none'}.",
             f"{len(unbuilt)} points with a memory not predicted" + "".join(
                 f"; {n}: {why}" for why, n in Counter(unbuilt).most_common()) + ".",
             f"Fit (every stage's peak, less its pending reduce-scatter inputs, within the usable memory): ran {fits[True, True]} predicted to fit, "
             f"{fits[True, False]} not; crashed (nan; any cause) {fits[False, False]} predicted not to fit, "
             f"{fits[False, True]} to fit.",
             "Error = predicted / measured − 1 (reserved GiB of global rank 0):",
             error_table("points", "cost model", cost),
             repeat_table(pts)]
    if args.replay:
        lines.append(error_table("pipeline points", "allocator replay", rep))
    text = "\n\n".join(lines)
    print(text)
    if args.write:
        intro = ("Produced by `python benchmarks/nanotron_sweep_memory.py --write docs/accuracy.md`. Every configuration\n"
                 "of nanotron's Ultra-Scale Playbook sweep (benchmarks/data/nanotron_usp_sweep.csv) against the memory\n"
                 "model, predicted as its published row of the same model size is; the 26 published rows are the best\n"
                 "cell of each (model, nodes), every other point is held out. A crashed point's cause is not given.\n\n")
        write_section(args.write, text, SECTION, intro)
    return 0


if __name__ == "__main__":
    sys.exit(main())
