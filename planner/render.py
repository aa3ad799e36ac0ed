"""Rich tables for the terminal; the JSON documents come from the result objects themselves."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from cost_models.units import BILLION, BITS_PER_BYTE, GB, MS, GiB, TB, TFLOP


def fill_bar(used: float, capacity: float, width: int = 24) -> Text:
    frac = used / capacity if capacity else 0.0
    filled = min(width, round(frac * width))
    color = "green" if frac <= 0.85 else "yellow" if frac <= 1.0 else "red"
    return Text("█" * filled + "░" * (width - filled), style=color) + Text(f" {frac:.0%}")


def _gib(n: float) -> str:
    return f"{n / GiB:,.2f}"


def print_json(doc: dict[str, Any]) -> None:
    """Strict JSON: a non-finite number is null with a `KEY_note` saying what it was."""
    from planner.text import finite_json

    print(json.dumps(finite_json(doc), indent=2, sort_keys=False, allow_nan=False))


def layout_line(job: Any) -> str:
    lay = job.layout
    sp = " (sp)" if job.sp else ""
    zero = {0: "ddp", 1: "zero-1", 2: "zero-2", 3: "zero-3"}[int(job.zero)]
    shard = f", shard {lay.dp_shard}" if lay.dp_shard != job.dp else ""
    rc = lay.recompute.value + (f" ({lay.recompute_layers} layers/chunk)" if lay.recompute_layers else "")
    parts = [
        f"tp {lay.tp}{sp}",
        f"pp {lay.pp}" + (f"×vpp {lay.vpp}" if lay.vpp > 1 else "") + split_note(job),
        f"dp {job.dp} ({zero}{shard})",
        f"cp {lay.cp}",
    ]
    if job.model.moe:
        parts.append(f"ep {lay.ep} etp {job.etp}")
    parts += [f"mbs {lay.mbs}", f"recompute {rc}", f"{job.schedule.value}", f"{job.num_microbatches} micro-batches"]
    return " · ".join(parts)


def render_memory(report: Any, console: Console) -> None:
    job, est = report.job, report.estimate
    tr = job.training
    console.print(
        f"[bold]{job.model.name}[/] ({job.model.params_total / BILLION:,.2f} B params"
        + (f", {job.model.params_active / BILLION:,.2f} B active" if job.model.moe else "")
        + f") on {job.gpus}× {job.cluster.gpu.name} ({job.cluster.spec.name}, {job.cluster.num_nodes} nodes)"
    )
    console.print(
        f"{tr.framework.value} · {tr.precision.value} · {tr.optimizer.value} · seq {tr.seq_len} · "
        f"global batch {tr.global_batch_size} · {tr.attention.value} attention"
    )
    console.print(layout_line(job))
    peak = est.peak_stage
    table = Table(title=f"Memory per GPU, pipeline rank {peak.rank} (the peak)", title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("component")
    table.add_column("GiB", justify="right")
    table.add_column("share", justify="right")
    total = peak.breakdown.total
    for key, value in peak.breakdown.without_zeros().flat().items():
        table.add_row(key, _gib(value), f"{value / total:6.1%}")
    table.add_section()
    table.add_row("[bold]peak[/]", f"[bold]{_gib(total)}[/]", "")
    console.print(table)
    if len(est.stages) > 1:
        stages = Table(
            title="Per pipeline stage, GiB (live = micro-batches in flight per chunk)",
            title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1),
        )
        for col in ("rank", "layers", "live", "states", "activ", "trans", "buffers", "peak"):
            stages.add_column(col, justify="right", min_width=len(col), no_wrap=True)
        stages.add_column("of HBM", no_wrap=True)
        for s in est.stages:
            b = s.breakdown
            stages.add_row(
                str(s.rank),
                str(len(s.layers)),
                "+".join(map(str, s.inflight)),
                *(f"{b.value(k) / GiB:,.1f}" for k in ("model_states", "activations", "transient", "buffers")),
                f"{s.peak_bytes / GiB:,.1f}",
                fill_bar(s.peak_bytes, est.capacity_bytes, 8),
            )
        console.print(stages)
    verdict = "[green]fits[/]" if est.fits else "[red]does not fit[/]"
    console.print(
        Text("HBM ")
        + fill_bar(est.peak_bytes, est.capacity_bytes)
        + Text.from_markup(
            f"  peak {_gib(est.peak_bytes)} of {_gib(est.capacity_bytes)} GiB "
            f"(usable {_gib(est.usable_bytes)} at {est.headroom:.0%} headroom): {verdict}"
        )
    )
    if est.required_bytes < est.peak_bytes:
        console.print(
            f"  the fit is judged on {_gib(est.required_bytes)} GiB: the caching allocator frees the pending "
            "reduce-scatter inputs in the peak before the device runs out"
        )


def presets_json(models: dict, gpus: dict, clusters: dict) -> dict[str, Any]:
    return {
        "models": {
            n: {**m.model_dump(mode="json"), "params_total": m.params_total, "params_active": m.params_active}
            for n, m in models.items()
        },
        "gpus": {n: g.model_dump(mode="json") for n, g in gpus.items()},
        "clusters": {n: c.model_dump(mode="json") for n, c in clusters.items()},
    }


def render_presets(models: dict, gpus: dict, clusters: dict, console: Console) -> None:
    t = Table(
        title="Models (L layers; params in billions; E/k experts and top-k)",
        title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1),
    )
    for col in ("name", "L", "hidden", "heads/kv", "ffn", "vocab", "params", "active", "E/k"):
        t.add_column(col, justify="left" if col == "name" else "right", no_wrap=True, min_width=len(col))
    for name, m in models.items():
        moe = f"{m.moe.num_experts}/{m.moe.top_k}" if m.moe else ""
        t.add_row(
            name, str(m.num_layers), str(m.hidden_size), f"{m.num_attention_heads}/{m.kv_heads}",
            str(m.ffn_hidden_size), str(m.vocab_size), f"{m.params_total / BILLION:,.2f}",
            f"{m.params_active / BILLION:,.2f}", moe,
        )
    console.print(t)
    g = Table(title="GPUs (dense peaks)", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("name", "HBM GiB", "HBM TB/s", "bf16 TFLOP/s", "fp8 TFLOP/s"):
        g.add_column(col, justify="left" if col == "name" else "right")
    for name, gpu in gpus.items():
        fp8 = gpu.peak_flop_per_s.fp8
        g.add_row(
            name, f"{gpu.hbm_bytes / GiB:,.1f}", f"{gpu.hbm_bandwidth_bytes_per_s / TB:,.2f}",
            f"{gpu.peak_flop_per_s.bf16 / TFLOP:,.0f}", f"{fp8 / TFLOP:,.0f}" if fp8 else "-",
        )
    console.print(g)
    c = Table(title="Clusters (node types); bandwidths per GPU per direction", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("name", "gpu", "GPUs/node", "NVLink domain", "scale-up GB/s", "NIC Gb/s"):
        c.add_column(col, justify="left" if col in ("name", "gpu") else "right")
    for name, cl in clusters.items():
        c.add_row(
            name, cl.gpu.name, str(cl.gpus_per_node), str(cl.scaleup_domain_gpus),
            f"{cl.scaleup_bandwidth_bytes_per_s / GB:,.0f}", f"{cl.nic_bandwidth_bytes_per_s * BITS_PER_BYTE / GB:,.0f}",
        )
    console.print(c)


def _ms(seconds: float) -> str:
    return f"{seconds / MS:,.1f}"


def render_estimate(report: Any, console: Console) -> None:
    """Memory (as `planner memory` prints it), then the step-time breakdown and throughput."""
    render_memory(report.memory, console)
    t = report.time
    step = t.step_s
    table = Table(
        title=f"Step time (critical rank {t.critical.rank}, {report.job.num_microbatches} micro-batches)",
        title_justify="left", box=box.SIMPLE_HEAD, min_width=60,
    )
    table.add_column("part")
    table.add_column("ms", justify="right")
    table.add_column("share", justify="right")
    for key, value in t.breakdown.flat().items():
        if value:
            table.add_row(key, _ms(value), f"{value / step:6.1%}")
    table.add_section()
    table.add_row("[bold]step[/]", f"[bold]{_ms(step)}[/]", "")
    console.print(table)
    console.print(
        f"{t.tokens_per_s:,.0f} tokens/s · [bold]{t.tokens_per_s_per_gpu:,.0f} tokens/s/GPU[/] · "
        f"{t.model_flop_per_s_per_gpu / TFLOP:,.0f} model TFLOP/s/GPU · MFU [bold]{t.mfu:.1%}[/] · "
        f"HFU {t.hfu:.1%} (of {t.peak_flop_per_s / TFLOP:,.0f} TFLOP/s dense 16-bit"
        + (f"; MFU {t.mfu_fp8:.1%} of the {t.job.cluster.gpu.peak_flop_per_s.fp8 / TFLOP:,.0f} TFLOP/s fp8 peak"
           if t.mfu_fp8 is not None else "")
        + (f"; MFU {t.mfu_fp4:.1%} of the {t.job.cluster.gpu.peak_flop_per_s.fp4 / TFLOP:,.0f} TFLOP/s fp4 peak"
           if t.mfu_fp4 is not None else "")
        + f") · bottleneck: [bold]{t.bottleneck}[/]"
    )
    for line in outlook_lines(report) + note_lines(report.job):
        console.print(line)


def note_lines(job: Any) -> list[str]:
    """The framework's warnings about the layout (cost_models.rules.NOTES)."""
    from cost_models.rules import notes

    return [f"note: {n}" for n in notes(job)]


def outlook_lines(report: Any) -> list[str]:
    """Checkpointing and failures, and time and cost to train when --tokens is given."""
    r = report.reliability
    out = [
        f"checkpoint {r.checkpoint_bytes / TB:,.2f} TB ({r.checkpoint_bytes_per_gpu / GB:,.1f} GB from the busiest GPU), "
        f"{r.write_s:,.1f} s to write at {r.write_gb_per_s:,.0f} GB/s · cluster MTBF {r.cluster_mtbf_s / 3600:,.1f} h "
        f"(per GPU {r.gpu_mtbf_hours:,.0f} h) · checkpoint every {r.interval_s / 60:,.1f} min (Daly) · "
        f"{r.lost_fraction:.1%} of time lost to checkpoints and failures"
    ]
    c = report.cost
    if c is not None:
        money = f" · cost {c.cost:,.0f}" if c.cost is not None else ""
        out.append(f"{c.tokens:,.3g} tokens: {c.days:,.1f} days · {c.gpu_hours:,.0f} GPU-hours{money}")
    return out


def split_note(job: Any) -> str:
    """How the pipeline's decoder layers are split, when not evenly: per rank, and what made it so."""
    lay = job.layout
    if lay.pp == 1:
        return ""
    counted = _counted_as_layers(lay)
    how = ("layout " + lay.pp_layout if lay.pp_layout is not None else
           " and ".join(counted) + " counted as layers" if counted else "")
    if not how and lay.pp_first_stage_layers is None and lay.pp_last_stage_layers is None:
        return ""
    counts = [len(job.stage_layer_ids(r)) for r in range(lay.pp)]
    shown = "/".join(map(str, counts)) if len(counts) <= 4 else f"{counts[0]}/{counts[1]}/…/{counts[-1]}"
    return f" (layers {shown}" + (f"; {how})" if how else ")")


def split_tag(lay: Any) -> str:
    """How a pipeline split departs from even, in a few characters: [first/last] decoder layers of
    the end stages, [E+L] for the embedding and/or loss counted as layers, [layout] for an explicit one."""
    if lay.pp_first_stage_layers is not None or lay.pp_last_stage_layers is not None:
        return f"[{lay.pp_first_stage_layers or '-'}/{lay.pp_last_stage_layers or '-'}]"
    if lay.pp_layout is not None:
        return "[layout]"
    counted = "+".join(x[0].upper() for x in _counted_as_layers(lay))
    return f"[{counted}]" if counted else ""


def _counted_as_layers(lay: Any) -> list[str]:
    """What Megatron's account-for flags count as pipeline layers: the embedding and/or the loss."""
    return [x for x, on in (("embedding", lay.account_for_embedding), ("loss", lay.account_for_loss)) if on]


def short_layout(job: Any) -> str:
    lay = job.layout
    zero = {0: "ddp", 1: "z1", 2: "z2", 3: "z3"}[int(job.zero)]
    shard = f"/{lay.dp_shard}" if lay.dp_shard != job.dp else ""
    parts = [f"tp{lay.tp}" + ("sp" if job.sp else ""), f"pp{lay.pp}" + (f"v{lay.vpp}" if lay.vpp > 1 else "") + split_tag(lay)]
    parts.append(f"dp{job.dp} {zero}{shard}")
    if lay.cp > 1:
        parts.append(f"cp{lay.cp}")
    if job.model.moe:
        parts.append(f"ep{lay.ep} etp{job.etp}")
    rc = {"none": "", "selective": "sel", "full": "full"}[lay.recompute.value]
    if lay.recompute_layers:
        rc += f"{lay.recompute_layers}"
    parts.append(f"mbs{lay.mbs}" + (f" {rc}" if rc else ""))
    return " ".join(parts)


def render_plan(report: Any, console: Console, *, explain: bool = False) -> None:
    p, r = report.problem, report.result
    tr = p.training
    console.print(
        f"[bold]{p.model.name}[/] on {p.gpus}× {p.cluster.gpu.name} ({p.cluster.spec.name}) · {tr.framework.value} · "
        f"{tr.precision.value} · seq {tr.seq_len} · global batch {tr.global_batch_size}"
        + (f" · fixed {', '.join(f'{k}={v}' for k, v in p.fixed.items())}" if p.fixed else "")
    )
    table = Table(box=box.SIMPLE_HEAD, title_justify="left")
    for name, justify in (("#", "right"), ("layout", "left"), ("memory/GPU", "left"), ("step s", "right"),
                          ("tok/s/GPU", "right"), ("MFU", "right"), ("bottleneck", "left")):
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    from planner.search import folded

    ranks = {id(p): i for i, p in enumerate(r.plans, 1)}
    for found, folds in folded(r.plans):
        plan = report.plans[ranks[id(found)] - 1]
        mem, t = plan.memory.estimate, plan.time
        bar = fill_bar(mem.peak_bytes, mem.capacity_bytes, width=10) + Text(f" {_gib(mem.peak_bytes)} GiB")
        same = "".join(f"\n{k} {'/'.join(_fold_value(v) for v in vs)} equal" for k, vs in folds.items())
        table.add_row(str(ranks[id(found)]), Text(short_layout(plan.job) + same), bar, f"{t.step_s:,.3f}",
                      f"{t.tokens_per_s_per_gpu:,.0f}", f"{t.mfu:.1%}", t.bottleneck)
    _print_table(console, table)
    # a searched per-rank split ([layout]): the flag that gives it to estimate and launch
    splits: dict[str, list[int]] = {}
    for found, _ in folded(r.plans):
        if found.job.layout.pp_layout is not None:
            splits.setdefault(found.job.layout.pp_layout, []).append(ranks[id(found)])
    for text, at in splits.items():
        job = r.plans[at[0] - 1].job
        counts = "/".join(str(len(job.stage_layer_ids(k))) for k in range(job.layout.pp))
        console.print(Text(f"{', '.join(f'#{i}' for i in at)}: layers per pipeline rank {counts}: --pp-layout '{text}'"))
    proof = "optimal (top-k proven)" if r.optimal else "best found within the time limit (not proven)"
    console.print(f"search: {r.seconds:.2f} s · {r.candidates} layouts scored exactly · {proof} · {r.solver}")
    from planner.runners import batch_hint_line

    hint = batch_hint_line(tr.global_batch_size, p.gpus)
    if hint:
        console.print(hint)
    if report.plans:
        for line in outlook_lines(report.plans[0]) + note_lines(report.plans[0].job):
            console.print(f"#1: {line}")
    if explain:
        for line in explain_lines(report):
            console.print(line)


def _fold_value(v: Any) -> str:
    return {True: "on", False: "off", None: "-"}.get(v, str(v)) if isinstance(v, (bool, type(None))) else str(v)


def _term_diffs(a: Any, b: Any, scale: float) -> str:
    """The terms of step-time breakdown b that differ from a's, largest first."""
    fa, fb = a.breakdown.flat(), b.breakdown.flat()
    diffs = sorted(((fb.get(k, 0.0) - fa.get(k, 0.0), k) for k in set(fa) | set(fb) if k != "total"),
                   key=lambda d: -abs(d[0]))
    return ", ".join(f"{k} {d / MS:+,.1f} ms" for d, k in diffs[:3] if abs(d) > 1e-4 * scale)


def explain_lines(report: Any) -> list[str]:
    """Why #1 beats #2 (the terms that differ most), why the usual alternatives to #1 lost, and
    what kept other layouts out."""
    out = []
    plans = report.plans
    if len(plans) >= 2:
        from planner.search import TIE_RESOLUTION, axes_in_use, ties

        a, b = plans[0].time, plans[1].time
        terms = _term_diffs(a, b, b.step_s)
        gap = b.step_s / a.step_s - 1
        if ties(plans[0], plans[1]):
            ma, mb = (p.memory.estimate.peak_bytes / p.memory.estimate.capacity_bytes for p in plans[:2])
            na, nb = (axes_in_use(p.job.layout) for p in plans[:2])
            why = (f"more memory slack ({ma:.0%} of HBM against {mb:.0%})" if ma != mb
                   else f"fewer parallel axes ({na} against {nb})" if na != nb else "the shorter step")
            out.append(f"#1 and #2 tie ({gap:+.2%} of step time, within the model's {TIE_RESOLUTION:.1%} resolution); "
                       f"#1 ranks first for {why} ({short_layout(plans[1].job)}: {terms or 'equal terms'})")
        else:
            out.append(f"#1 beats #2 by {gap:.2%} of step time ({short_layout(plans[1].job)}: {terms or 'equal terms'})")
    if plans:
        out += suspect_lines(report)
    reasons: dict[str, int] = {}
    for rej in report.result.rejected:
        key = "did not fit in memory" if rej.reason.startswith("needs ") else rej.reason
        reasons[key] = reasons.get(key, 0) + 1
    for reason, count in sorted(reasons.items(), key=lambda kv: -kv[1])[:6]:
        out.append(f"{count} scored layout(s) rejected: {reason}")
    return out


def suspects(problem: Any, job: Any) -> list[tuple[str, dict[str, Any]]]:
    """The usual alternatives to a layout, one axis at a time: tp, pp, cp and mbs halved and
    doubled, the other sharding stages, and the other recompute modes, with dp rebalanced so that
    the degrees still multiply to the GPU count."""
    from cost_models.enums import Framework, Recompute, Zero

    lay = job.layout
    out: list[tuple[str, dict[str, Any]]] = []
    for axis in ("tp", "pp", "cp", "mbs"):
        now = getattr(lay, axis)
        for v in (now * 2, now // 2):
            if v >= 1 and v != now:
                out.append((f"{axis}={v}", {axis: v}))
    zeros = {Framework.MEGATRON: (0, 1, 3), Framework.TORCHTITAN: (0, 2, 3), Framework.DEEPSPEED: (0, 1, 2, 3)}
    for z in zeros[problem.framework]:
        if z != int(lay.zero or 0):
            out.append((f"zero={z}", {"zero": Zero(z)}))
    for mode in Recompute:
        if mode is not lay.recompute:
            out.append((f"recompute={mode.value}", {"recompute": mode}))
    return out


# What a change of pp, cp or recompute can force on the rest of the pipeline split, tried in this
# order: each is reset only if the split is still illegal without it.
FORCED_RESETS = (
    {"vpp": 1}, {"pp_first_stage_layers": None, "pp_last_stage_layers": None},
    {"account_for_embedding": False, "account_for_loss": False}, {"pp_layout": None}, {"recompute_layers": None},
)


SPLIT_FIELDS = ("vpp", "pp_first_stage_layers", "pp_last_stage_layers", "account_for_embedding", "account_for_loss", "pp_layout")


def _search_splits(report: Any, pp: int, vpp: int) -> list[dict[str, Any]]:
    """The pipeline splits the search uses at depth pp, as Layout fields, in the order a change of pp
    tries them: those of the ranked plans at that depth; then planner.space.splits' time-balanced
    ones (even, uneven ends, or the embedding and/or loss counted as layers), #1's vpp first; then its
    memory splits (every rank's layers), which trade the slowest stage for memory and are the search's
    choice only where memory binds."""
    from planner.space import head_in_layers, split_pp_layout, splits

    out = [{k: getattr(p.job.layout, k) for k in SPLIT_FIELDS} for p in report.plans if p.job.layout.pp == pp]
    if pp > 1 and pp <= report.problem.model.num_layers:
        head = head_in_layers(report.problem)
        found = sorted(splits(report.problem, pp, head), key=lambda s: (s[3] is not None, s[0] != vpp))
        out += [dict(vpp=v, pp_first_stage_layers=first, pp_last_stage_layers=last, account_for_embedding=embedding,
                     account_for_loss=loss, pp_layout=None if layers is None else split_pp_layout(layers, pp, v))
                for v, first, last, layers, (embedding, loss) in found]
    return out


def _forced_changes(problem: Any, before: dict[str, Any], base: dict[str, Any],
                    splits: Sequence[dict[str, Any]] = ()) -> tuple[dict[str, Any], str]:
    """Keep every other field of #1; where the changed axis makes its pipeline split or recompute
    depth illegal, take the first legal split of `splits` (_search_splits: what the search uses at
    the new depth), else reset the fields that must go, fewest first; say which and why."""
    from cost_models.errors import SpecError
    from cost_models.layout import Layout
    from cost_models.rules import fill_defaults, violations

    def broken(fields: dict[str, Any]) -> str | None:
        try:
            job = fill_defaults(problem.model, problem.cluster, problem.training, Layout(**fields))
        except (SpecError, ValueError):
            return None  # not a split problem: evaluate reports it
        return next((msg for rule, msg in violations(job) if rule in ("pipeline_split", "recompute_layers")), None)

    why = broken(base)
    if why is None:
        return base, ""

    def said(fields: dict[str, Any]) -> list[str]:
        return [f"{k} {_fold_value(before.get(k))}→{_fold_value(v)}" for k, v in fields.items() if before.get(k) != v]

    for split in splits:
        if broken({**base, **split}) is None:
            return {**base, **split}, f"also {', '.join(said(split))}, the search's split at this depth: {why.split('; ')[0]}"
    changed: list[str] = []
    for reset in FORCED_RESETS:
        if all(base.get(k) == v for k, v in reset.items()):
            continue
        base = {**base, **reset}
        changed += said(reset)
        if broken(base) is None:
            break
    return base, f"also {', '.join(changed)}: {why.split('; ')[0]}" if changed else ""


def suspect_lines(report: Any) -> list[str]:
    """One line per usual alternative to #1: its rank, or by how much it is slower and which terms
    grow, or the rule or the memory it breaks."""
    from cost_models.layout import Layout
    from planner.search import Plan, evaluate

    problem, best = report.problem, report.plans[0]
    job = best.job
    lay = job.layout
    ranked = {p.job.layout: i for i, p in enumerate(report.plans, 1)}
    domain = problem.cluster.spec.scaleup_domain_gpus
    out = []
    for name, change in suspects(problem, job):
        base = lay.model_dump()
        base.update(dp=None, dp_shard=None, schedule=None, **change)
        if "tp" in change:
            base.update(etp=None, sp=None)
        layout_dropped = "pp" in change and lay.pp_layout is not None
        if layout_dropped:  # a layout lists the stages of its own pp; at another pp they would be read as chunks
            base.update(pp_layout=None)
        splits = _search_splits(report, change["pp"], lay.vpp) if "pp" in change else []
        base, forced = _forced_changes(problem, lay.model_dump(), base, splits)
        if forced:
            name += f" ({forced})"
        elif layout_dropped:
            name += " (also pp_layout→-: split evenly)"
        if change.get("tp", 0) > domain and not problem.allow_cross_node_tp:
            out.append(f"{name}: crosses the {domain}-GPU scale-up domain (--allow-cross-node-tp to consider it)")
            continue
        try:
            alt = Layout(**base)
        except ValueError as e:
            out.append(f"{name}: {str(e).splitlines()[0]}")
            continue
        result = evaluate(problem, alt, headroom=report.headroom, calibration=best.time.calibration)
        if not isinstance(result, Plan):
            out.append(f"{name}: {result.reason}")
            continue
        rank = ranked.get(result.job.layout)
        slower = result.time.step_s / best.time.step_s - 1
        where = f"#{rank} here" if rank else f"{slower:+.1%} step time"
        terms = _term_diffs(best.time, result.time, result.time.step_s)
        out.append(f"{name}: {where}" + (f" ({terms})" if terms else ""))
    return out


def _print_table(console: Console, table: Table, keep: str = "layout") -> None:
    """Print `table` with column `keep` on one line per row where every other column still fits beside it at
    its narrowest (its longest word); on narrower terminals rich wraps every column as usual, rather than
    dropping the columns that no longer fit."""
    from rich.measure import Measurement

    def width(column: Any, end: str) -> int:  # with the cell padding (0, 1)
        return 2 + max(getattr(Measurement.get(console, console.options, c), end) for c in [column.header, *column.cells])

    kept = [c for c in table.columns if c.header == keep]
    others = sum(width(c, "minimum") for c in table.columns if c.header != keep)
    if kept and others + width(kept[0], "maximum") <= console.width:
        kept[0].no_wrap = True
    console.print(table)


def render_sweep(rows: list[Any], console: Console) -> None:
    """The sweep as a table with a bar of tokens/s/GPU per count (the terminal chart)."""
    table = Table(box=box.SIMPLE_HEAD)
    bar_width = 20 if console.width >= 140 else 12 if console.width >= 100 else 8  # the chart's columns
    for name, justify in (("GPUs", "right"), ("layout", "left"), ("tokens/s", "right"), ("tok/s/GPU", "right"),
                          ("", "left"), ("MFU", "right"), ("scaling", "right"), ("share grown most", "left")):
        # a bar is never cut short (it would misdraw), a layout folds rather than lose its end
        table.add_column(name, justify=justify, no_wrap=not name, overflow="fold")  # type: ignore[arg-type]
    costs = any(r.report is not None and r.report.cost is not None for r in rows)
    if costs:
        for name in ("days", "GPU-hours", "cost"):
            table.add_column(name, justify="right")
    best = max((r.report.time.tokens_per_s_per_gpu for r in rows if r.report is not None), default=0.0)
    for r in rows:
        if r.report is None:
            what = "[yellow]search timed out: no answer[/]" if r.timed_out else "[red]no layout fits[/]"
            table.add_row(str(r.gpus), what, *[""] * (len(table.columns) - 2))
            continue
        t = r.report.time
        bar = Text("█" * max(1, round(bar_width * t.tokens_per_s_per_gpu / best)), style="cyan")
        extra = []
        if costs:
            c = r.report.cost
            extra = [f"{c.days:,.1f}", f"{c.gpu_hours:,.0f}", "" if c.cost is None else f"{c.cost:,.0f}"]
        layout = short_layout(r.report.job) + (" (not proven: timed out)" if r.timed_out else "")
        table.add_row(str(r.gpus), Text(layout), f"{t.tokens_per_s:,.0f}", f"{t.tokens_per_s_per_gpu:,.0f}",
                      bar, f"{t.mfu:.1%}", f"{r.efficiency:.0%}", r.grew or "", *extra)
    _print_table(console, table)
    console.print("scaling: tokens/s relative to the smallest count that fits, times the GPU ratio (strong scaling at a "
                  "fixed global batch); share grown most: the step term whose share grew most since that count")
    from planner.sweep import scaling_limit

    console.print(scaling_limit(rows).line())
