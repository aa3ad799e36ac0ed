"""nanotron's rank-0 allocations replayed through the real CUDA caching allocator of this machine's torch.

    python benchmarks/gpu_allocator_replay.py --out allocator.json

benchmarks/nanotron_allocator_replay.py replays, tensor by tensor, what rank 0 of a nanotron pipeline
allocates and frees, through a model of PyTorch's caching allocator. This script sends the same
requests to the allocator itself: each request above 1 MiB is a torch.empty of that many bytes on the
GPU, each free drops the tensor (requests of at most 1 MiB are left out, as the model leaves them out),
and the reserved counter is read after the replayed iterations. The rows are the published nanotron
pipeline rows of benchmarks/memory_accuracy.py. What differs from the published runs: no NCCL
communicator or CUDA context of the training job holds device memory beside the allocator, and the
device is this one (its free memory is the capacity; a request that does not fit makes the allocator
release its cached segments and retry, as it would there, and a second failure is an out-of-memory);
`--capacity-gib` caps it below the device's memory, and bounds the modelled replay the same way.
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from gpu_kernels import device_info  # noqa: E402
from nanotron_allocator_replay import SMALL_BYTES, pipeline_runs, replay_run  # noqa: E402

from cost_models.units import GiB  # noqa: E402


class Handle:
    """One replayed tensor; `release` drops it whatever references to the handle remain."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor


class TorchAllocator:
    """The requests of nanotron_allocator_replay.replay, made on the GPU. Every tensor stays alive until
    its release, also one whose handle the replay drops (the persistent weights and buffers)."""

    def __init__(self) -> None:
        self.live: set[Handle] = set()

    def malloc(self, nbytes: int) -> Handle | None:
        if nbytes <= SMALL_BYTES:
            return None
        h = Handle(torch.empty(nbytes, dtype=torch.uint8, device="cuda"))
        self.live.add(h)
        return h

    def release(self, h: Handle | None) -> None:
        if h is not None:
            h.tensor = None
            self.live.discard(h)


def replay_on_gpu(run, iterations: int) -> dict:  # type: ignore[no-untyped-def]
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.reset_accumulated_memory_stats()
    out: dict = {}
    allocator = TorchAllocator()
    try:
        replay_run(run, iterations=iterations, allocator=allocator)
    except torch.OutOfMemoryError as exc:
        out["out_of_memory"] = str(exc).splitlines()[0]
    stats = torch.cuda.memory_stats()
    allocator.live.clear()
    out.update(reserved_bytes=torch.cuda.memory_reserved(), max_reserved_bytes=stats["reserved_bytes.all.peak"],
               max_allocated_bytes=stats["allocated_bytes.all.peak"], alloc_retries=stats["num_alloc_retries"],
               segments=stats["segment.all.current"])
    gc.collect()
    torch.cuda.empty_cache()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--capacity-gib", type=float, default=None,
                        help="cap what the allocator may reserve (torch.cuda.set_per_process_memory_fraction), "
                             "and the modelled allocator's capacity")
    args = parser.parse_args()
    # the same cap on both replays: the GPU's allocator and the model of it (its retry after a failed
    # cudaMalloc, nanotron_allocator_replay.CachingAllocator)
    cap = None if args.capacity_gib is None else int(args.capacity_gib * GiB)
    if cap is not None:
        torch.cuda.set_per_process_memory_fraction(cap / torch.cuda.get_device_properties(0).total_memory)
    results = []
    print("| run | measured GiB | modelled replay GiB | GPU replay reserved GiB | peak reserved | retries | error |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for run, predicted in pipeline_runs():
        try:
            model = replay_run(run, iterations=args.iterations, capacity_bytes=cap)
            modelled = {"modelled_reserved_bytes": model.reserved, "modelled_peak_allocated_bytes": model.peak_allocated}
            modelled_gib = f"{model.reserved / GiB:.1f}"
        except MemoryError:
            modelled, modelled_gib = {"modelled_out_of_memory": True}, "out of memory"
        got = replay_on_gpu(run, args.iterations)
        measured = predicted.measured_gib
        results.append({"run": run.id, "measured_gib": measured, **modelled, **got})
        err = "" if "out_of_memory" in got else f"{got['reserved_bytes'] / GiB / measured - 1:+.1%}"
        oom = " (out of memory)" if "out_of_memory" in got else ""
        print(f"| {run.id} | {measured:.1f} | {modelled_gib} | {got['reserved_bytes'] / GiB:.1f}{oom} | "
              f"{got['max_reserved_bytes'] / GiB:.1f} | {got['alloc_retries']} | {err} |", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"device": device_info(), "command": " ".join(sys.argv), "iterations": args.iterations,
                                        "capacity_gib": args.capacity_gib, "rows": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
