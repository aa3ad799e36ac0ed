"""Speed of `planner plan`: search seconds (table building, CP-SAT bands, exact re-scoring) and the
end-to-end wall time of the command, for the cases docs/performance.md reports.

Run: python benchmarks/plan_speed.py [--write docs/performance.md]
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

# (model, cluster, GPUs, sequence length, global batch)
CASES = [
    ("llama-3.1-405b", "dgx-h100", 16384, 8192, 2048),
    ("llama-3.1-70b", "dgx-h100", 64, 8192, 128),
    ("mixtral-8x22b", "dgx-h100", 256, 4096, 1024),
    # an NVL72 rack's NVLink domain lets tp reach 64 of the 128 heads: many more Shards than on 8-GPU nodes
    ("llama-3.1-405b", "gb200-nvl72", 512, 8192, 1024),
    # 256 experts, 61 layers: ep up to 256 and Megatron's recompute depth per layer give the most layouts near the top
    ("deepseek-v3", "dgx-h100", 1024, 4096, 1024),
]


NOTES = """What the time goes to, for Llama-3.1-405B on 16,384 GPUs (cProfile; the bound tables also
on 512 GB200 NVL72 GPUs):

- imports: about 0.4 s for ortools' CP-SAT (imported without pandas), 0.2 s for numpy and 0.3 s
  for pydantic and the cost model;
- the bound tables (`planner.search.Space`): per Shard the layer's kernels and collectives, priced
  once for all three recompute modes (`cost_models.step_time.layer_passes`; GEMM, attention and
  collective prices are kept per shape, which a search asks for about ten times each), and numpy
  over every (Shard, Stages, Sharding). On Llama-3.1-405B at 512 GB200 NVL72 GPUs, whose NVLink
  domain takes tp to 64 (260 Shards, 140 on 8-GPU nodes), they take about 0.74 s of CPU (measured
  while other jobs ran): 0.08 s the pipeline splits below, 0.14 s the layer passes, 0.29 s the
  memory bound (each rank's layers by kind, activations and states per Shard, in-flight
  micro-batches, the pp 1 buffers per Sharding), 0.07 s the step bound's rank sums and 0.05 s the
  FSDP term;
- the pipeline splits: per (pp, vpp) the uneven ends, counted (`planner.space._split`, 30 to 120
  µs), and three small CP-SAT models for the memory splits (every rank's layers), about 1 to 5 ms
  the three up to pp 16 and 6 to 14 ms at pp 32 and 64 (measured while other jobs ran);
- the CP-SAT bands;
- exact re-scoring of every layout whose bound lies below the 10th best step: about 10 ms each
  at pp 32.
"""


def run(model: str, cluster: str, gpus: int, seq: int, gbs: int) -> dict:
    cmd = [sys.executable, "-m", "planner.cli", "plan", model, "--cluster", cluster, "--gpus", str(gpus),
           "--seq-len", str(seq), "--global-batch-size", str(gbs), "--json", "--timings"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    doc = json.loads(out.stdout)
    best = doc["plans"][0]
    return {"wall_s": wall, "cpu_s": cpu, **doc["search"], "best": best["layout"], "step_s": best["time"]["step_s"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", type=Path, help="write the table into this markdown file")
    parser.add_argument("--repeat", type=int, default=3, help="runs per case; the fastest is reported")
    args = parser.parse_args()
    lines = ["| model | cluster | GPUs | seq | global batch | search s | end-to-end s | end-to-end CPU s | layouts scored | proven | best layout | step s |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|"]
    for model, cluster, gpus, seq, gbs in CASES:
        runs = [run(model, cluster, gpus, seq, gbs) for _ in range(args.repeat)]
        r = min(runs, key=lambda x: x["wall_s"])
        r["cpu_s"] = min(x["cpu_s"] for x in runs)
        r["seconds"] = min(x["seconds"] for x in runs)
        b = r["best"]
        layout = f"tp{b['tp']} pp{b['pp']} vpp{b['vpp']} dp{b['dp']} cp{b['cp']} ep{b['ep']} z{b['zero']} mbs{b['mbs']} {b['recompute']}{(' k=' + str(b['recompute_layers'])) if b['recompute_layers'] else ''}"
        lines.append(f"| {model} | {cluster} | {gpus} | {seq} | {gbs} | {r['seconds']:.2f} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | "
                     f"{r['candidates']} | {'yes' if r['optimal'] else 'no'} | {layout} | {r['step_s']:.2f} |")
        print(lines[-1], flush=True)
    text = "\n".join(lines)
    if args.write:
        machine = f"{platform.processor() or platform.machine()}, Python {platform.python_version()}"
        args.write.write_text(
            "# Speed of `planner plan`\n\n"
            "Produced by `python benchmarks/plan_speed.py --write docs/performance.md` on " + machine + ", "
            "the 2-core CPU machine the project's CI uses. *search s* is the search itself (bound tables, "
            "CP-SAT bands, exact re-scoring of every layout whose bound lies below the k-th best); "
            "*end-to-end s* is the whole `planner plan … --json` process, imports included, and *end-to-end "
            "CPU s* its user + system CPU time, which other load on the machine inflates less than wall time. "
            f"Each case is run {args.repeat} times and the fastest is reported. Default top 10; framework "
            "megatron; bf16.\n\n" + text + "\n\n" + NOTES
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
