"""`planner validate`: run a short, profiled torch training job that implements a plan, and compare
what it measures with what the cost model predicts for exactly the part that ran.

- `slices`: the plan as a PyTorch-native job, the largest faithful slice of it that fits the ranks
  at hand, and the `job.json` run description the worker reads;
- `worker`: the emitted training script (torch only), copied into the output directory;
- `runner`: torchrun under timeouts, teardown of the whole process tree, the cause of a failure;
- `compare`: predicted vs measured, term by term, and `validate.json`;
- `calibrate`: kernel-price corrections fitted to the measurements, checked on held-out steps.
"""

from enum import StrEnum


class Backend(StrEnum):
    NCCL = "nccl"  # GPUs
    GLOO = "gloo"  # CPU (or anywhere without NCCL)
