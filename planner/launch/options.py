"""Launch options: plain values and enums, importable without the cost model (the CLI's option types)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class TitanVersion(StrEnum):
    """torchtitan release line: 0.3.x takes `--module/--config` and flag overrides, 0.2.x a TOML file."""

    V03 = "0.3"
    V02 = "0.2"


class MegatronFsdp(StrEnum):
    """Which fully sharded data parallel Megatron runs for zero 2/3."""

    MEGATRON = "megatron"  # --use-megatron-fsdp (Megatron-FSDP)
    TORCH = "torch"  # --use-torch-fsdp2 (PyTorch FSDP2)


DEFAULT_PORT = 29500  # the rendezvous port of torchtitan's multinode_trainer.slurm and Megatron's examples


@dataclass(frozen=True)
class LaunchOptions:
    torchtitan_version: TitanVersion = TitanVersion.V03
    torchtitan_model: str | None = None  # "MODULE:CONFIG" (0.3) or "NAME:FLAVOR" (0.2); None = match the model
    megatron_fsdp: MegatronFsdp = MegatronFsdp.MEGATRON
    hosts: tuple[str, ...] = ()  # from --nodes-file: the first one hosts the rendezvous
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    job_name: str | None = None
    port: int = DEFAULT_PORT

    def __post_init__(self) -> None:
        # The emitters compare with `is`: a plain "0.3" from a library caller would read as 0.2.
        object.__setattr__(self, "torchtitan_version", TitanVersion(self.torchtitan_version))
        object.__setattr__(self, "megatron_fsdp", MegatronFsdp(self.megatron_fsdp))

    @property
    def slurm(self) -> bool:
        """Whether any Slurm option was given (job.sbatch is then written even for one node)."""
        return any(v is not None for v in (self.partition, self.account, self.time, self.job_name))
