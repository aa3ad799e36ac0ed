"""Layout: how one training job is split over GPUs. Short axis names inside (tp pp vpp dp cp ep etp mbs).

A Layout may leave derived fields unset (dp, etp, sp, zero, schedule); `cost_models.rules.resolve`
fills them for a framework and checks every rule, returning a Job.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from cost_models.enums import Recompute, Schedule, Zero
from cost_models.model_spec import Count, Spec


class Layout(Spec):
    tp: Count = 1  # tensor parallel
    pp: Count = 1  # pipeline parallel (physical stages)
    vpp: Count = 1  # virtual pipeline chunks per pipeline rank (interleaved schedule when > 1)
    dp: Count | None = None  # data parallel; None = gpus / (tp·pp·cp)
    cp: Count = 1  # context parallel (sequence split over ranks, K/V exchanged)
    ep: Count = 1  # expert parallel (MoE layers)
    etp: Count | None = None  # expert tensor parallel; None = the framework default
    mbs: Count = 1  # micro-batch size, sequences
    sp: bool | None = None  # sequence parallel (with tp); None = on whenever tp > 1 and the framework has it
    zero: Zero | None = None  # data-parallel sharding; None = the framework's default
    dp_shard: Count | None = None  # HSDP / partial sharding: shard within groups of this many dp ranks
    recompute: Recompute = Recompute.NONE
    recompute_layers: Count | None = None  # with full recompute: only the first k layers of each model chunk
    schedule: Schedule | None = None  # None = interleaved when vpp > 1, else 1F1B
    pp_first_stage_layers: Count | None = None  # uneven split: decoder layers on the first stage
    pp_last_stage_layers: Count | None = None  # ... and on the last stage
    # Megatron --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split: the
    # embedding (loss) counts as one layer of the first (last) virtual stage (cost_models.pipeline_split)
    account_for_embedding: bool = False
    account_for_loss: bool = False
    # Megatron --pipeline-model-parallel-layout, e.g. "Et*3|(tt|)*29|tL"; sets vpp = stages / pp
    pp_layout: Annotated[str, Field(min_length=1, max_length=4096)] | None = None

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

