"""PNG charts of a sweep and of a memory breakdown (matplotlib, from the `plots` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cost_models.errors import SpecError
from cost_models.units import GiB


def _pyplot():  # type: ignore[no-untyped-def]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SpecError("--png needs matplotlib: pip install 'llm-parallelism-planner[plots]'") from None
    return plt


def check_png(path: Path) -> None:
    """The --png file name (planner.writing.check_file) and matplotlib, before any work is done."""
    from planner.writing import check_file

    check_file(Path(path), what="--png", suffix=".png")
    _pyplot()


def _save(fig: Any, path: Path) -> None:
    """Rendered in memory, then written through a temporary sibling: no half-written PNG."""
    import io

    from planner.writing import write_file

    check_png(path)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    write_file(Path(path), buffer.getvalue(), what="--png")


def sweep_png(rows: list[Any], path: Path, *, title: str) -> None:
    """Tokens/s/GPU and MFU of the best plan per GPU count, and the strong-scaling efficiency."""
    plt = _pyplot()
    fits = [r for r in rows if r.report is not None]
    if not fits:
        raise SpecError("--png: no GPU count of the sweep has a layout, nothing to plot")
    gpus = [r.gpus for r in fits]
    total = [r.report.time.tokens_per_s for r in fits]
    per_gpu = [r.report.time.tokens_per_s_per_gpu for r in fits]
    eff = [100 * r.efficiency for r in fits]
    # MFU is tokens/s/GPU times one constant of the model (its FLOPs per token over the GPU's peak)
    ratio = fits[0].report.time.mfu / per_gpu[0]
    fig, (top, middle, bottom) = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    top.plot(gpus, total, "o-", color="tab:blue", label="best plan")
    top.plot(gpus, [total[0] * g / gpus[0] for g in gpus], "--", color="grey", linewidth=0.8, label="linear from the first")
    top.set_ylabel("tokens/s")
    top.set_yscale("log")
    top.legend(fontsize=8)
    top.set_title(title)
    middle.plot(gpus, per_gpu, "o-", color="tab:purple")
    middle.set_ylabel("tokens/s per GPU")
    middle.secondary_yaxis("right", functions=(lambda y: 100 * ratio * y, lambda m: m / (100 * ratio))).set_ylabel("MFU %")
    for r, y in zip(fits, per_gpu):
        job = r.report.job
        lay = job.layout
        pp = f"pp{lay.pp}" + (f"v{lay.vpp}" if lay.vpp > 1 else "")
        middle.annotate(f"tp{lay.tp} {pp} cp{lay.cp} z{int(job.zero)}", (r.gpus, y), textcoords="offset points",
                        xytext=(0, 6), ha="center", fontsize=7)
    middle.margins(y=0.25)  # room for the labels above the points
    bottom.plot(gpus, eff, "o-", color="tab:green")
    bottom.axhline(100, color="grey", linewidth=0.8)
    bottom.set_ylabel(f"scaling efficiency % (vs {gpus[0]} GPUs)")
    bottom.set_xlabel("GPUs")
    bottom.set_xscale("log", base=2)
    bottom.set_xticks(gpus, [str(g) for g in gpus])
    bottom.set_xlim(gpus[0] / 1.5, gpus[-1] * 1.5)  # room for the first and last labels
    _save(fig, path)
    plt.close(fig)


def memory_png(report: Any, path: Path) -> None:
    """Stacked bars of each pipeline stage's memory by component, against usable and total HBM."""
    plt = _pyplot()
    est = report.estimate
    comps = ["model_states", "activations", "transient", "buffers", "overhead"]
    stages = est.stages
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(stages) + 4), 5))
    bottom = [0.0] * len(stages)
    xs = list(range(len(stages)))
    for name in comps:
        vals = [float(s.breakdown.value(name)) / GiB for s in stages]
        ax.bar(xs, vals, bottom=bottom, label=name.replace("_", " "))
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.axhline(est.usable_bytes / GiB, color="red", linestyle="--", linewidth=1, label="usable")
    ax.axhline(est.capacity_bytes / GiB, color="black", linewidth=1, label="HBM")
    from planner.render import short_layout

    ax.set_xticks(xs, [str(s.rank) for s in stages])
    ax.set_xlabel("pipeline rank")
    ax.set_ylabel("GiB per GPU")
    job = report.job
    ax.set_title(f"{job.model.name} on {job.gpus} GPUs: {short_layout(job)}")
    ax.legend(fontsize=8, bbox_to_anchor=(1.01, 1), loc="upper left")
    _save(fig, path)
    plt.close(fig)
