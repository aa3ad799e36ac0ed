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


def titan02_keeps_mixed_precision(*, tp, pp, cp, ep, dp, dp_shard):  # type: ignore[no-untyped-def]
    """Whether torchtitan 0.2 runs an FSDP2 layout (zero 2 or 3) as planned: in bf16, under fully_shard.
    0.2 applies fully_shard only when its dp_shard or cp degree is above 1 (ParallelDims.fsdp_enabled,
    pytorch/torchtitan@v0.2.2 torchtitan/distributed/parallel_dims.py L334-335; llama3/infra/
    parallelize.py L125), or for an MoE model when ep is (deepseek_v3/infra/parallelize.py L162).
    Without it, tp or pp train in fp32 (maybe_enable_amp turns mixed precision off, distributed/utils.py
    L243-256), and data parallelism alone runs DDP (parallelize.py L148-151), which raises beside any
    other axis; one GPU alone runs under torch.autocast (L257-263). From pytorch/torchtitan@d92336fe
    (2026-06-08), an ancestor of 0.3.0rc1 (@1fdf90d3, llama3/parallelize.py L69-80), fully_shard is
    applied at every shard degree, for its MixedPrecisionPolicy. Ints or numpy arrays
    (planner.space.sharding_ok tests every cell at once)."""
    return (dp_shard > 1) | (cp > 1) | (ep > 1) | ((tp == 1) & (pp == 1) & (dp == 1))


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
