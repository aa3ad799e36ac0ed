"""Speed of `planner plan`: search seconds (table building, CP-SAT bands, exact re-scoring) and the
end-to-end wall time of the command, for the cases docs/performance.md reports.

Run: python benchmarks/plan_speed.py [--write docs/performance.md]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

CASES = [
    ("llama-3.1-405b", 16384, 8192, 2048),
    ("llama-3.1-70b", 64, 8192, 128),
    ("mixtral-8x22b", 256, 4096, 1024),
]


def run(model: str, gpus: int, seq: int, gbs: int) -> dict:
    cmd = [sys.executable, "-m", "planner.cli", "plan", model, "--cluster", "dgx-h100", "--gpus", str(gpus),
           "--seq-len", str(seq), "--global-batch-size", str(gbs), "--json"]
    start = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    doc = json.loads(out.stdout)
    best = doc["plans"][0]
    return {"wall_s": wall, **doc["search"], "best": best["layout"], "step_s": best["time"]["step_s"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", type=Path, help="write the table into this markdown file")
    args = parser.parse_args()
    lines = ["| model | GPUs | seq | global batch | search s | end-to-end s | layouts scored | proven | best layout |",
             "|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for model, gpus, seq, gbs in CASES:
        r = run(model, gpus, seq, gbs)
        b = r["best"]
        layout = f"tp{b['tp']} pp{b['pp']} vpp{b['vpp']} dp{b['dp']} cp{b['cp']} ep{b['ep']} z{b['zero']} mbs{b['mbs']} {b['recompute']}"
        lines.append(f"| {model} | {gpus} | {seq} | {gbs} | {r['seconds']:.2f} | {r['wall_s']:.2f} | {r['candidates']} | "
                     f"{'yes' if r['optimal'] else 'no'} | {layout} |")
        print(lines[-1], flush=True)
    text = "\n".join(lines)
    if args.write:
        machine = f"{platform.processor() or platform.machine()}, Python {platform.python_version()}"
        args.write.write_text(
            "# Speed of `planner plan`\n\n"
            "Produced by `python benchmarks/plan_speed.py --write docs/performance.md` on " + machine + ", "
            "the 2-core CPU machine the project's CI uses. *search s* is the search itself (bound tables, "
            "CP-SAT bands, exact re-scoring of every layout whose bound lies below the k-th best); "
            "*end-to-end s* is the whole `planner plan … --json` process, imports included. Default top 10; "
            "framework megatron; bf16.\n\n" + text + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
