"""Measure how fast a GEMM runs on this machine's GPU when memory-bound work shares the step with it.

    python benchmarks/gpu_power.py --out power.json

A training step alternates GEMMs, which hold the board at its power limit, with memory-bound kernels
that draw far less. Whether the GEMMs of a step run at the power-limited (sustained) rate or faster
depends on how much of the step they fill. This script runs, for 15 s per setting, a repeating
pattern of one 8192^3 bf16 GEMM followed by n device-to-device copies of 1 GiB, with n chosen so that
the GEMM fills from all to about a fifth of the time, and reports the GEMM's own rate (CUDA events
around each GEMM, median over the last 10 s), the copies' bandwidth, and the board's power and SM
clock (NVML, sampled every 0.5 s). Settings run from the lightest GEMM share to the heaviest, each
after the previous one, so the board's temperature only rises.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from gpu_kernels import nvml_state


def run_setting(copies: int, seconds: float, a, b, src, dst) -> dict:
    gemm_ms, copy_ms, states = [], [], []
    start = time.time()
    last = 0.0
    while time.time() - start < seconds:
        e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        e0.record()
        a @ b
        e1.record()
        for _ in range(copies):
            dst.copy_(src)
        e2.record()
        e2.synchronize()
        if time.time() - start > seconds - 10:
            gemm_ms.append(e0.elapsed_time(e1))
            if copies:
                copy_ms.append(e1.elapsed_time(e2) / copies)
        if time.time() - last > 0.5:
            states.append(nvml_state())
            last = time.time()
    g = statistics.median(gemm_ms)
    c = statistics.median(copy_ms) if copy_ms else 0.0
    late = [st for st in states[len(states) // 3:] if "nvml" not in st]  # NVML missing: no readings
    mean = {k: statistics.mean(st[k] for st in late) for k in late[0]} if late else {}
    return {"copies_per_gemm": copies, "gemm_ms": g, "gemm_tflops": 2 * 8192**3 / (g * 1e-3) / 1e12,
            "copy_ms": c, "copy_tb_per_s": (2 * src.numel() * src.element_size() / (c * 1e-3) / 1e12) if c else None,
            "gemm_share": g / (g + copies * c), **{f"mean_{k}": v for k, v in mean.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu_power.json")
    ap.add_argument("--seconds", type=float, default=15.0)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_power: no CUDA GPU here", file=sys.stderr)
        return 2
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    src = torch.randn(2**29, device="cuda", dtype=torch.bfloat16)  # 1 GiB
    dst = torch.empty_like(src)
    for _ in range(20):
        a @ b
        dst.copy_(src)
    torch.cuda.synchronize()
    rows = []
    for copies in (8, 4, 2, 1, 0):  # GEMM share about 0.2, 0.35, 0.5, 0.7, 1
        rows.append(run_setting(copies, args.seconds, a, b, src, dst))
        print(json.dumps(rows[-1]), flush=True)
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
           "command": " ".join(["python"] + sys.argv), "rows": rows}
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=1)
    print(f"{'gemm share':>10} {'GEMM TFLOP/s':>12} {'copy TB/s':>9} {'power W':>8} {'SM MHz':>7}")
    for r in rows:
        print(f"{r['gemm_share']:10.2f} {r['gemm_tflops']:12.1f} {r['copy_tb_per_s'] or 0:9.2f} "
              f"{r.get('mean_power_w', 0):8.0f} {r.get('mean_sm_clock_mhz', 0):7.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
