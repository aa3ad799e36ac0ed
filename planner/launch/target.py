"""What every emitter reads: the resolved job, the launch options, and the node geometry."""

from __future__ import annotations

from dataclasses import dataclass, field

from cost_models.errors import LayoutError, SpecError
from cost_models.job import Job
from planner.launch.options import LaunchOptions, MegatronFsdp, TitanVersion

__all__ = ["File", "LaunchOptions", "MegatronFsdp", "Target", "TitanVersion"]


@dataclass(frozen=True)
class File:
    text: str
    executable: bool = False


# Steps between checkpoints when no plan gives them (a Target built without an estimate).
DEFAULT_SAVE_INTERVAL = 1000


# The checkpoint directory every framework's script requires (the variable stops it, named, when unset).
CHECKPOINT_DIR_LINE = 'CHECKPOINT_DIR="${CHECKPOINT_DIR:?set CHECKPOINT_DIR to a directory every node can write (checkpoints are saved and resumed there)}"'


@dataclass(frozen=True)
class Target:
    job: Job
    options: LaunchOptions = field(default_factory=LaunchOptions)
    # Steps between checkpoints: the plan's Daly interval over its step time (build.checkpoint_steps).
    save_interval: int = DEFAULT_SAVE_INTERVAL
    checkpoint_minutes: float | None = None  # the Daly interval it came from

    def __post_init__(self) -> None:
        hosts = self.options.hosts
        if hosts and len(hosts) != self.nnodes:
            raise SpecError(
                f"--nodes-file lists {len(hosts)} hosts but the plan runs on {self.nnodes} node(s) "
                f"of {self.nproc_per_node} GPUs; list exactly {self.nnodes}"
            )
        if not 0 < self.options.port < 65536:
            raise SpecError(f"--port({self.options.port}) must be between 1 and 65535")

    @property
    def nproc_per_node(self) -> int:
        return min(self.job.gpus, self.job.cluster.spec.gpus_per_node)

    @property
    def nnodes(self) -> int:
        # Cluster validation makes gpus a multiple of gpus_per_node or a divisor of it.
        return self.job.gpus // self.nproc_per_node

    @property
    def multi_node(self) -> bool:
        return self.nnodes > 1

    @property
    def run_name(self) -> str:
        return self.job.model.name


def check_single_axes(target: Target, axes: dict[str, str]) -> None:
    """Refuses a layout that runs one of `axes` (an emitter's single_axes: axis -> refusal, {} the
    degree) above 1."""
    lay = target.job.layout
    for axis, why in axes.items():
        if getattr(lay, axis) > 1:
            raise LayoutError("layout: " + why.format(getattr(lay, axis)))


def save_interval_lines(target: Target) -> list[str]:
    """SAVE_INTERVAL: the plan's checkpoint interval in steps (Daly's optimum over the step time)."""
    minutes = f"{target.checkpoint_minutes:.1f} min" if target.checkpoint_minutes is not None else "no plan"
    return [f"# Steps between checkpoints: the plan's Daly interval ({minutes}) over its predicted step time.",
            f'SAVE_INTERVAL="${{SAVE_INTERVAL:-{int(target.save_interval)}}}"']
