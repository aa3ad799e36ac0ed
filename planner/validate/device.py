"""The GPU a validate run ran on against the plan's: the slice is priced on the GPU that ran when a
GPU preset knows it (by the name the device reports, GPUSpec.device_names), and a note says which
GPU ran and which was planned."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from cost_models.errors import SpecError
from cost_models.hardware import Cluster, GPUSpec
from cost_models.rules import resolve
from planner.validate.slices import NATIVE_WAIVED, Slice


@dataclass(frozen=True)
class DeviceMatch:
    slice: Slice  # the slice to compare with: its job on the GPU that ran, or as planned
    note: str | None  # one line when the GPU that ran is not the plan's


def names(gpu: GPUSpec, name: str) -> bool:
    """Whether the preset's device_names hold `name` (as torch.cuda.get_device_name reports it)."""
    want = name.strip().lower()
    return any(n.lower() == want for n in gpu.device_names)


def preset_named(name: str, gpus: dict[str, GPUSpec]) -> GPUSpec | None:
    """The GPU preset whose device_names hold `name`."""
    return next((g for g in gpus.values() if names(g, name)), None)


def on_gpu(slice_: Slice, gpu: GPUSpec) -> Slice:
    """The slice's job on another GPU in the same node: the cluster's GPU replaced, the rules resolved again."""
    job = slice_.job
    spec = job.cluster.spec.model_copy(update={"gpu": gpu})
    moved = resolve(job.model, Cluster(spec=spec, num_gpus=job.gpus), job.training, job.layout, NATIVE_WAIVED)
    return replace(slice_, job=moved)


def match_device(slice_: Slice, device: dict[str, Any] | None, gpus: dict[str, GPUSpec]) -> DeviceMatch:
    """`device` as the worker records it (worker.device_info). A CPU run, or a GPU the plan's preset
    names, keeps the slice; a GPU another preset names moves the prediction to it; an unknown GPU
    keeps the plan's with a note that the times are not comparable."""
    if not device or device.get("type") != "cuda" or not device.get("name"):
        return DeviceMatch(slice_, None)
    name, planned = device["name"], slice_.job.cluster.gpu
    if names(planned, name):
        return DeviceMatch(slice_, None)
    found = preset_named(name, gpus)
    if found is None:
        known = ", ".join(f"{g.name} ({n})" for g in gpus.values() for n in g.device_names)
        return DeviceMatch(slice_, f"ran on {name}, which no GPU preset names (device_names: {known}); predicted for the "
                                   f"plan's {planned.name}: the times are not comparable")
    try:
        moved = on_gpu(slice_, found)
    except SpecError as e:
        return DeviceMatch(slice_, f"ran on {name} (GPU preset {found.name}), not the plan's {planned.name}, on which the "
                                   f"slice is no valid job ({e}); predicted for the {planned.name}: the times are not comparable")
    return DeviceMatch(moved, f"ran on {name} (GPU preset {found.name}), not the plan's {planned.name}: predicted for the {found.name}")
