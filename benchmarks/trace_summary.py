"""Every device kernel and every CUDA runtime call of `planner validate` profiler traces, by name.

    python benchmarks/trace_summary.py OUT.json TRACE.json [TRACE.json ...]

For each Chrome trace the worker wrote (PLAN_DIR/validate/trace_rank0.json), the device's kernels,
copies and memsets (trace categories kernel, gpu_memcpy, gpu_memset) and the host's CUDA runtime
calls (category cuda_runtime, e.g. cudaLaunchKernel) of the profiled steps, each as [name, calls,
total microseconds], most time first, and the number of profiled steps: what the GPU ran and how many
launches the host made for it.
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path


def summarize(path: Path) -> dict:
    # the worker names the device categories and its step annotations; imported here, not at the top,
    # as the worker imports torch, which a module reading this one (gpu_validate: launches_per_step) need not have
    from planner.validate.worker import GPU_CATEGORIES, is_step

    events = json.loads(path.read_text()).get("traceEvents", [])
    steps = sum(1 for e in events if e.get("ph") == "X" and is_step(str(e.get("name", "")))
                and e.get("cat") == "user_annotation")
    by: dict[str, dict[str, list[float]]] = {"device": defaultdict(lambda: [0, 0.0]), "runtime": defaultdict(lambda: [0, 0.0])}
    for e in events:
        if e.get("ph") != "X":
            continue
        kind = "device" if e.get("cat") in GPU_CATEGORIES else "runtime" if e.get("cat") == "cuda_runtime" else None
        if kind is None:
            continue
        slot = by[kind][e["name"]]
        slot[0] += 1
        slot[1] += float(e.get("dur", 0.0))
    table = {k: sorted(([n, c, round(us, 3)] for n, (c, us) in v.items()), key=lambda r: -r[2]) for k, v in by.items()}
    return {"steps": steps, **table}


def launches_per_step(summary: dict) -> float:
    """The host's kernel launches (runtime calls named *Launch*, e.g. cudaLaunchKernel) a profiled step,
    from one trace's summary."""
    return sum(r[1] for r in summary["runtime"] if "Launch" in r[0]) / max(summary["steps"], 1)


def main() -> int:
    out, traces = Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]]
    doc = {str(p): summarize(p) for p in traces}
    out.write_text(json.dumps(doc, indent=1) + "\n")
    for p, d in doc.items():
        dev = sum(r[1] for r in d["device"])
        print(f"{p}: {d['steps']} profiled steps, {dev / max(d['steps'], 1):.0f} device operations and "
              f"{launches_per_step(d):.0f} kernel launches a step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
