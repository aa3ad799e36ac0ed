"""Job: a model, a cluster, a training spec and a fully resolved layout, with what follows from them.

Built only by `cost_models.rules.resolve`, which checks every rule first, so everything here may
assume a legal layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from cost_models.enums import Framework, Recompute, Schedule, Zero
from cost_models.hardware import Cluster
from cost_models.layout import Layout
from cost_models.model_spec import ModelSpec
from cost_models.pipeline_split import virtual_stage_layers
from cost_models.training import TrainingSpec


@dataclass(frozen=True)
class Job:
    model: ModelSpec
    cluster: Cluster
    training: TrainingSpec
    layout: Layout  # every optional field filled in
    # ... and training.global_batch_size too
    # per-job results of the cost models that depend on nothing but the job (see states.local_layer_params)
    memo: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    @property
    def gpus(self) -> int:
        return self.cluster.num_gpus

    @property
    def dp(self) -> int:
        assert self.layout.dp is not None
        return self.layout.dp

    @property
    def etp(self) -> int:
        assert self.layout.etp is not None
        return self.layout.etp

    @property
    def zero(self) -> Zero:
        assert self.layout.zero is not None
        return self.layout.zero

    @property
    def sp(self) -> bool:
        return bool(self.layout.sp)

    @property
    def schedule(self) -> Schedule:
        assert self.layout.schedule is not None
        return self.layout.schedule

    @property
    def unordered_queues(self) -> bool:
        """Megatron with fully sharded data parallelism (zero 2/3: Megatron-FSDP or torch FSDP2) and
        tp or cp > 1 on a GPU before Blackwell. FSDP runs with CUDA_DEVICE_MAX_CONNECTIONS unset, while
        Megatron's tensor-parallel layers rely on it being 1 to launch each backward collective ahead of
        the GEMM it should hide behind ("necessary for a speedup but not for correctness",
        Megatron-LM@d98e8a64 megatron/core/tensor_parallel/layers.py L842-849); arguments.py
        L1451-1465 warns against combining them for that reason."""
        lay = self.layout
        return (self.training.framework is Framework.MEGATRON and self.zero >= Zero.GRADIENTS
                and (lay.tp > 1 or lay.cp > 1) and self.cluster.gpu.before_blackwell)

    @property
    def edp(self) -> int:
        """Expert data-parallel size: ranks holding the same experts (Megatron parallel_state.py)."""
        lay = self.layout
        return self.gpus // (self.etp * lay.ep * lay.pp)

    @property
    def dense_shard_group(self) -> int:
        """Ranks over which dense-parameter states are sharded: dp x cp (Megatron's dp-cp group,
        torchtitan's fsdp mesh = dp_shard x cp), or the HSDP shard group within it."""
        assert self.layout.dp_shard is not None
        return self.layout.dp_shard * self.layout.cp

    @property
    def expert_shard_group(self) -> int:
        """Ranks over which expert-parameter states are sharded (expert-DP), scaled like the dense one
        when HSDP shards only within a group."""
        assert self.layout.dp_shard is not None
        return max(1, self.edp * self.layout.dp_shard // self.dp)

    @property
    def local_batch_size(self) -> int:
        """Sequences per data-parallel rank per step."""
        assert self.training.global_batch_size is not None
        return self.training.global_batch_size // self.dp

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per pipeline per step (= gradient-accumulation steps without PP)."""
        return self.local_batch_size // self.layout.mbs

    @property
    def seq_per_rank(self) -> int:
        """Sequence length held by one context-parallel rank."""
        return self.training.seq_len // self.layout.cp

    @cached_property
    def stage_chunks(self) -> tuple[tuple[tuple[int, ...], ...], ...]:
        """Decoder-layer ids of each model chunk of each pipeline rank: [rank][chunk] -> layer ids.

        Megatron's order: virtual stage v of rank r is global segment v·pp + r, each holding the
        decoder layers cost_models.pipeline_split gives it (even, uneven ends, embedding and loss
        counted as layers, or an explicit layout).
        """
        lay = self.layout
        sizes = virtual_stage_layers(self.model.num_layers, lay.pp, lay.vpp, first=lay.pp_first_stage_layers,
                                     last=lay.pp_last_stage_layers, embedding=lay.account_for_embedding,
                                     loss=lay.account_for_loss, layout=lay.pp_layout)
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        return tuple(
            tuple(tuple(range(starts[v * lay.pp + r], starts[v * lay.pp + r] + sizes[v * lay.pp + r])) for v in range(lay.vpp))
            for r in range(lay.pp)
        )

    def recompute_mode(self, position_in_chunk: int) -> Recompute:
        """The recompute mode of the layer at this position of its model chunk: full recompute of
        only the first recompute_layers layers (Megatron --recompute-method block) leaves the rest
        without recomputation."""
        lay = self.layout
        if lay.recompute is Recompute.FULL and lay.recompute_layers is not None:
            return Recompute.FULL if position_in_chunk < lay.recompute_layers else Recompute.NONE
        return lay.recompute

    def stage_layer_ids(self, rank: int) -> tuple[int, ...]:
        return tuple(i for chunk in self.stage_chunks[rank] for i in chunk)

    def rank_signature(self, rank: int) -> tuple:
        """What a pipeline rank's costs depend on besides the job: whether it is the first and/or the
        last rank, and each chunk's layers as (layer kind, recompute mode). Ranks with equal signatures
        (the middle ranks of most pipelines) cost the same per micro-batch."""
        key = ("rank_signature", rank)
        if key not in self.memo:
            kind = self.model.layer_kind
            chunks = tuple(tuple((kind(i), self.recompute_mode(n)) for n, i in enumerate(c)) for c in self.stage_chunks[rank])
            self.memo[key] = (rank == 0, rank == self.layout.pp - 1, chunks)
        return self.memo[key]
