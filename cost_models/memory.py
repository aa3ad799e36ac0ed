"""Peak memory per GPU, for every pipeline stage: model states + activations in flight + the largest
transient + buffers + runtime overhead, each a named line whose parts sum to the stage's peak.

The peak of a stage is taken at the first backward after its warm-up: every micro-batch the
schedule keeps in flight holds its activations, and one backward's working set (the loss on the
last stage, or one layer's recomputation and gradients) comes on top. The optimizer's fp32 copy of
16-bit gradients (the `fp32_gradients` state) lives only from the optimizer step to the next step's
zero_grad, when no activation is held; the stage's peak is the larger of the two moments, and its
breakdown is the one of that moment (`step_peak`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from cost_models import activations as act
from cost_models import deepep
from cost_models.breakdown import Breakdown, Part
from cost_models.enums import Framework, MoEDispatch, Precision, Recompute, Schedule, Zero
from cost_models.errors import SpecError
from cost_models.flops import layer_gemms
from cost_models.job import Job
from cost_models.model_spec import LayerKind
from cost_models.states import local_layer_params, mtp_module_params, rank_layer_params, rank_params, rank_state_bytes
from cost_models.units import MiB

# --- runtime constants (outside the models, each with its source) --------------------------------

# CUDA context, kernel images and cuBLAS workspaces of one training process. A bare context took
# 723 MiB in https://discuss.pytorch.org/t/what-is-the-reason-for-pytorchs-gpu-memory-floor/73021;
# lazy module loading (CUDA >= 11.7) lowers that, cuBLAS/cuDNN workspaces add to it.
CUDA_CONTEXT_BYTES = 768 * MiB

# NCCL buffers per process group a rank communicates in: NCCL_BUFFSIZE defaults to 4 MiB per
# channel per peer and direction (docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html
# #nccl-buffsize); with up to 32 channels on NVLink that is 4 MiB x 32 x 2 = 256 MiB for one ring,
# and LL/LL128 buffers take about as much again.
NCCL_BYTES_PER_GROUP = 512 * MiB

# DeepSpeed ZeRO bucket defaults, elements (deepspeed/runtime/zero/config.py: reduce_bucket_size
# and allgather_bucket_size = 5e8).
DEEPSPEED_BUCKET_ELEMENTS = 500_000_000
# ZeRO-3 prefetches upcoming parameters only up to stage3_prefetch_bucket_size = 5e7 elements, and
# none once stage3_max_live_parameters = 1e9 are gathered (deepspeed/runtime/zero/config.py:215-248
# at v0.19.6, the same defaults since its 2021 docs).
DEEPSPEED_PREFETCH_ELEMENTS = 50_000_000
DEEPSPEED_MAX_LIVE_ELEMENTS = 1_000_000_000

# PyTorch's caching allocator reserves more than it hands out: blocks are rounded (2 MiB for large
# allocations) and freed blocks are reused only by requests that fit. Modelled as a fraction of the
# bytes that come and go during a step (StageMemory.dynamic_bytes: activations, transients, gradients
# made during the step, cached blocks and gathered parameters). The one fitted constant of the memory
# model, from its prior 0.10 (no published measurement converts to it: benchmarks/memory_accuracy.py
# FRAGMENTATION_PRIOR): the all-source fit of benchmarks/memory_accuracy.py on the 125 rows that log a
# reserved peak, 6 source families (torchtitan 20, fp8lm 6, Zero Bubble and Vocabulary Parallelism 55,
# nanotron 26, torchao's torchtitan benchmark 12, torchtitan's DeepSeek-V3 runs 6); 0.10 puts 140 of
# the 146 rows within 10%, 0.11 139 and 0.09 138; its leave-one-source-out fits are 0.10 to 0.11
# (docs/accuracy.md). tests/test_accuracy.py re-runs the fit and checks this value.
FRAGMENTATION = 0.10

DEFAULT_HEADROOM = 0.05  # margin left free for what no line models (allocator spikes, other libraries)

# The overhead lines the caching allocator reserves but torch.cuda.max_memory_allocated does not count.
# Reduce-scatter inputs freed ahead of the GPU (pending_scatter_bytes), reserved until their collective runs.
PENDING = "overhead/pending_collectives"
RESERVED_ONLY = ("overhead/fragmentation", "overhead/cached_blocks", PENDING)
# The lines allocated outside torch's caching allocator, which neither of its counters sees: the CUDA
# context, NCCL's buffers and Transformer Engine's userbuffers (cudaMalloc, tp_userbuffers_bytes).
# DeepEP's NVLink and RDMA buffers and workspace too (cudaMalloc and NVSHMEM, deepep.buffer_bytes).
OUTSIDE_ALLOCATOR = ("overhead/cuda_context", "overhead/nccl", "overhead/deepep_buffers", "buffers/tp_userbuffers")


def _lines_bytes(breakdown: Breakdown, lines: tuple[str, ...]) -> int:
    """Bytes of a stage's breakdown on the given lines (RESERVED_ONLY, OUTSIDE_ALLOCATOR)."""
    return sum(int(breakdown.value(line)) for line in lines)


def allocator_counters(breakdown: Breakdown) -> tuple[int, int]:
    """What torch's caching allocator counts of a stage's peak: (reserved, allocated), i.e.
    torch.cuda.max_memory_reserved's and max_memory_allocated's share. Reserved leaves out the lines
    allocated outside it (OUTSIDE_ALLOCATOR); allocated leaves out the reserved-only lines as well."""
    reserved = int(breakdown.total) - _lines_bytes(breakdown, OUTSIDE_ALLOCATOR)
    return reserved, reserved - _lines_bytes(breakdown, RESERVED_ONLY)


# Operations one CUDA stream queues before the host's next launch on it blocks until the GPU
# catches up: "the buffer size is about 1000 kernels", each of 3 streams taking 1000 (measured on one
# GPU: https://stackoverflow.com/questions/53970187, also forums.developer.nvidia.com/t/68937).
STREAM_LAUNCH_QUEUE = 1000

# Operations one nanotron decoder layer's forward queues on the compute stream at tp > 1 (sequence
# parallel, async linears, multi-head attention), on tp rank 0 (huggingface/nanotron@c2528430):
# 2 RMSNorms, one Triton kernel each (nn/layer_norm.py:27-57); 2 column-parallel linears, each the
# event the NCCL stream waits on, the GEMM of the local shard, the wait for the all-gather and one
# GEMM of the rows after it (parallel/tensor_parallel/functional.py:118-262; no rows before rank
# 0's): 8; the [q|k|v] permute copy, the k/v concatenation and its permute copy (models/llama.py:
# 469-474, 655-660): 3; flash-attn's rotary on q and on kv: 2; CoreAttention's two zeros, two sums,
# two cumsums and the flash-attn kernel (llama.py:274-299): 7; 2 row-parallel linears, each the
# GEMM, the event and the wait for its reduce-scatter (functional.py:453-470,
# distributed_differentiable_primitives.py:92-120): 6; 2 residual adds, silu and the product
# (llama.py:194-201, 717-733): 4. 2 + 8 + 3 + 2 + 7 + 6 + 4 = 32.
NANOTRON_LAYER_LAUNCHES = 32


@dataclass(frozen=True)
class StageMemory:
    rank: int  # pipeline rank
    layers: tuple[int, ...]  # decoder layer ids it holds
    inflight: tuple[int, ...]  # micro-batches in flight per model chunk at the peak
    breakdown: Breakdown  # bytes
    dynamic_bytes: float  # the bytes that come and go during a step, which FRAGMENTATION multiplies

    @property
    def peak_bytes(self) -> int:
        return int(self.breakdown.total)

    @property
    def required_bytes(self) -> int:
        """The peak less its pending reduce-scatter inputs, which the caching allocator frees before a
        device runs out (reclaimed_pending)."""
        return self.peak_bytes - int(self.breakdown.value(PENDING))


@dataclass(frozen=True)
class MemoryEstimate:
    stages: tuple[StageMemory, ...]
    capacity_bytes: int
    headroom: float

    @property
    def peak_stage(self) -> StageMemory:
        return max(self.stages, key=lambda s: (s.peak_bytes, -s.rank))

    @property
    def peak_bytes(self) -> int:
        return self.peak_stage.peak_bytes

    @property
    def usable_bytes(self) -> int:
        return int(self.capacity_bytes * (1 - self.headroom))

    @property
    def required_bytes(self) -> int:
        """The largest stage's StageMemory.required_bytes: what must fit in the usable memory."""
        return max(s.required_bytes for s in self.stages)

    @property
    def fits(self) -> bool:
        return self.required_bytes <= self.usable_bytes


def inflight_microbatches(job: Job, rank: int) -> tuple[int, ...]:
    """Micro-batches whose activations a rank holds per model chunk when its first backward starts.

    1F1B: pp - rank (Megatron get_num_warmup_microbatches; torch Schedule1F1B warm-up), at most m.
    Interleaved: the first backward's moment of interleaved_backward_moments, W + 1 forwards, at most
    m·vpp, with W = (pp - rank - 1)·2 + (vpp - 1)·r warm-up forwards, forward k running chunk
    (k // r) % vpp, and r micro-batches per round (interleaved_round: pp where pp divides m, the
    only case Megatron's interleaved schedule runs with its default microbatch group of pp). Never
    more than m on a chunk. GPipe: all m on every chunk.
    """
    lay = job.layout
    return inflight_counts(lay.pp, lay.vpp, job.num_microbatches, rank, job.schedule)


def inflight_counts(pp: int, v: int, m: int, rank: int, schedule: Schedule) -> tuple[int, ...]:
    """inflight_microbatches from the numbers it depends on."""
    if pp == 1:
        return (1,) * v
    if schedule is Schedule.GPIPE:
        return (m,) * v
    if schedule is Schedule.ONE_F_ONE_B:
        return (min(pp - rank, m),)
    r = interleaved_round(pp, m)
    forwards = min((pp - rank - 1) * 2 + (v - 1) * r + 1, m * v)
    return tuple(sum(1 for k in range(forwards) if (k // r) % v == c) for c in range(v))


def interleaved_round(pp: int, m: int) -> int:
    """Micro-batches per round of torch's ScheduleInterleaved1F1B: m // max(1, m // pp), so pp where
    pp divides m and m itself where m < pp; m must be a multiple of the max(1, m // pp) rounds
    (rules._pipeline_titan). Its warm-up is (vpp - 1)·r + 2·(pp - 1 - rank) forwards, at most m·vpp,
    forward k runs local chunk (k // r) % vpp and backward j chunk vpp - 1 - (j // r) % vpp; in the
    steady state each forward runs before its backward (pytorch/pytorch@cf30153c, torch 2.13.0,
    torch/distributed/pipelining/schedules.py:2872-2888 _get_warmup_ops, :2935-2942 rounds,
    :2981-2993 forward_stage_index and backward_stage_index, :2793-2808 _get_1f1b_rank_ops)."""
    return m // max(1, m // pp)


@dataclass(frozen=True)
class LayerCost:
    """What one decoder layer of a kind (dense or MoE) costs under one recompute mode."""

    kept_bytes: int  # saved between its forward and its backward
    backward_bytes: int  # recomputed activations plus gradient tensors during its backward


def layer_costs(job: Job, modes: tuple[Recompute, ...] | None = None) -> dict[tuple[LayerKind, Recompute], LayerCost]:
    """Every (layer kind, recompute mode) a job's layers can take (or the modes given), computed once:
    a layer's activations depend on nothing else."""
    out = {}
    for kind, layer_id in job.model.layer_kinds.items():
        full = act.layer_items(job, layer_id).total
        workspace = act.layer_backward_workspace(job, layer_id)
        for mode in modes or {job.layout.recompute, Recompute.NONE}:
            kept = act.layer_activations(job, layer_id, mode).total
            # the larger of the backward's gradients and what torchtitan's MoE combine holds beside the
            # layer's saved tensors, in its forward or its forward re-run in backward
            moment = max(workspace, act.moe_combine_bytes(job, layer_id, mode))
            out[kind, mode] = LayerCost(kept_bytes=int(kept), backward_bytes=int(full - kept + moment))
    return out


def _chunk_layer_costs(job: Job, rank: int, chunk: int, costs: dict[tuple[LayerKind, Recompute], LayerCost]) -> list[LayerCost]:
    return [costs[job.model.layer_kind(i), job.recompute_mode(n)] for n, i in enumerate(job.stage_chunks[rank][chunk])]


# the parts of _chunk_activations, each kept per micro-batch in flight
CHUNK_PARTS = ("embedding", "layers", "head", "mtp", "stage_output")


def _chunk_activations(job: Job, rank: int, chunk: int, costs: dict[tuple[LayerKind, Recompute], LayerCost]) -> Breakdown:
    """Activations of one micro-batch through one model chunk of a rank."""
    first = rank == 0 and chunk == 0
    last = rank == job.layout.pp - 1 and chunk == job.layout.vpp - 1
    m = job.model
    mtp = 0
    if last and m.mtp_layers:
        # each MTP module: its decoder layer, the saved 2h-wide eh_proj input, and one more output
        # layer and loss (step_time.stage_time)
        layer = costs[m.layer_kind(m.num_layers - 1), job.recompute_mode(0)].kept_bytes
        d = act.dims(job)
        mtp = m.mtp_layers * (layer + 2 * d.t * d.h * act.ACT_BYTES + act.head_activations(job).total)
    return Breakdown.of(
        "bytes",
        embedding=act.embedding_activations(job).total if first else 0,
        layers=sum(c.kept_bytes for c in _chunk_layer_costs(job, rank, chunk, costs)),
        head=act.head_activations(job).total if last else 0,
        mtp=mtp,
        # torch.distributed.pipelining keeps each micro-batch's stage output in fwd_cache until that
        # micro-batch's backward (pipeline_recv_bytes): the last layer's output, which no layer of
        # this chunk saves
        stage_output=_boundary_bytes(job) if torch_pipelining(job) and not last else 0,
    )


def torch_pipelining(job: Job) -> bool:
    """torchtitan's pipeline runs on torch.distributed.pipelining (PipelineStage and its schedules)."""
    return job.training.framework is Framework.TORCHTITAN and job.layout.pp > 1


def _boundary_bytes(job: Job) -> int:
    """One micro-batch's 16-bit hidden states between two pipeline stages: the residual stream,
    sequence-sharded over tp (torchtitan's block outputs are local Shard(1) tensors,
    RowwiseParallel(output_layouts=Shard(1)) on wo and w2)."""
    return act.dims(job).residual * act.ACT_BYTES


def pipeline_recv_bytes(job: Job, rank: int, inflight: tuple[int, ...]) -> int:
    """torch.distributed.pipelining's receive buffers on one rank: every model chunk but the first
    allocates one activation buffer per micro-batch (PipelineStage._prepare_forward_infra ->
    _create_act_recv_info -> _make_tensor_from_meta), and every chunk but the last one gradient buffer
    per micro-batch (_PipelineStageBase._prepare_backward_infra: `for mb_index in
    range(num_microbatches): self.grad_recv_info[mb_index] = self._create_grad_recv_info(...)`), each
    of the boundary tensor's size and kept from the first step on (pytorch/pytorch@01386103
    torch/distributed/pipelining/stage.py; the same loops over range(num_microbatches) in the earlier
    stage.py whose PipelineStage still required input_args, so also in the Dec 2024 torch between the
    two, which torchtitan 9dec370's PipelineStage(model, stage_idx, num_stages, device, group) runs
    with runtime shape inference). A received activation is the chunk's first layer's input
    (_retrieve_recv_activations hands the buffer itself to the forward), so the buffers of the
    micro-batches in flight are already counted with the layers: only the others are added."""
    if not torch_pipelining(job):
        return 0
    lay, m, a = job.layout, job.num_microbatches, _boundary_bytes(job)
    total = 0
    for chunk, n in enumerate(inflight):
        first = rank == 0 and chunk == 0
        last = rank == lay.pp - 1 and chunk == lay.vpp - 1
        total += 0 if last else m * a  # gradient receive buffers
        total += 0 if first else (m - n) * a  # activation receive buffers beyond those in flight
    return total


def kept_pipeline_outputs(job: Job, rank: int, inflight: tuple[int, ...], done: tuple[int, ...] | None = None) -> int:
    """TrainingSpec.pipeline_keeps_outputs: the outputs of the micro-batches every model chunk of a
    rank has run, kept in output_chunks to the step's end, that no other line counts. Taken at the
    last micro-batch's forward, when 1F1B and interleaved 1F1B still hold the warm-up's in-flight
    count, or after `done` forwards of each chunk: a chunk that sends on keeps one boundary tensor
    per forward run, of which the in-flight ones are its stage_output line; the last chunk keeps
    one 16-bit logits tensor per forward, which the loss's own fp32 copy does not count (a compiled
    loss and TrainingSpec.loss_on_16bit_logits count the in-flight ones)."""
    if not job.training.pipeline_keeps_outputs:
        return 0
    lay, m = job.layout, job.num_microbatches
    done = done or (m,) * len(inflight)
    total = 0
    for chunk, (n, f) in enumerate(zip(inflight, done)):
        if rank == lay.pp - 1 and chunk == lay.vpp - 1:
            d = act.dims(job)
            counted = n if job.training.compiles_loss or job.training.loss_on_16bit_logits else 0
            total += (f - counted) * d.t * d.vocab * act.ACT_BYTES
        else:
            total += (f - n) * _boundary_bytes(job)
    return total


# One backward's start under interleaved 1F1B: forwards run per model chunk, micro-batches in flight
# per chunk, and the chunks that have run a backward (interleaved_backward_moments).
Moment = tuple[tuple[int, ...], tuple[int, ...], frozenset[int]]


def interleaved_backward_moments(pp: int, v: int, m: int, rank: int) -> tuple[Moment, ...]:
    """Each backward of one rank under interleaved 1F1B, at its start: the forwards run per model
    chunk, the micro-batches in flight per chunk, and the chunks that have run a backward (this
    one's included).

    torch's ScheduleInterleaved1F1B (the order inflight_counts also follows): W warm-up forwards,
    then a forward before each backward until all m·v forwards have run, then the remaining
    backwards; micro-batches go in rounds of r (interleaved_round), forward k runs chunk
    (k // r) % v and backward k chunk v - 1 - (k // r) % v, so every rank runs all the backwards of
    its last chunk's first r micro-batches before its first chunk's first backward."""
    total, r = m * v, interleaved_round(pp, m)
    warmup = min((pp - rank - 1) * 2 + (v - 1) * r, total)
    fwd_chunk = [(k // r) % v for k in range(total)]
    bwd_chunk = [v - 1 - (k // r) % v for k in range(total)]
    done, backwards, started = [0] * v, [0] * v, set()
    forwards = 0
    moments = []
    for j in range(total):  # running counts: forwards run and backwards before this one, per chunk
        while forwards < min(warmup + j + 1, total):
            done[fwd_chunk[forwards]] += 1
            forwards += 1
        started.add(bwd_chunk[j])
        moments.append((tuple(done), tuple(d - b for d, b in zip(done, backwards)), frozenset(started)))
        backwards[bwd_chunk[j]] += 1
    return tuple(moments)


def _chunk_params(job: Job, rank: int, chunk: int) -> int:
    """Parameters on this rank of one model chunk: its decoder layers, and the embedding on the
    first chunk of the first rank or, on the last chunk of the last rank, the output layer and the
    multi-token prediction modules, which rank_params counts with the last stage's layers
    (step_time.stage_time runs them after its last decoder layer): the chunks sum to rank_params."""
    lay, params = job.layout, rank_params(job, rank)
    total = sum(local_layer_params(job, i).total for i in job.stage_chunks[rank][chunk])
    if rank == 0 and chunk == 0:
        total += int(params.value("embedding"))
    if rank == lay.pp - 1 and chunk == lay.vpp - 1:
        total += int(params.value("head")) + mtp_module_params(job).total * job.model.mtp_layers
    return total


def grads_by_chunk(job: Job) -> bool:
    """Whether a rank's unsharded gradients come into being chunk by chunk: torchtitan's FSDP2
    keeping its stages gathered under an interleaved pipeline (stage_buffers). torch pipelining
    turns FSDP's gradient sync off until each stage's last backward (set_requires_gradient_sync
    (False) in _PipelineStageBase.backward_maybe_with_nosync, torch/distributed/pipelining/
    stage.py), and FSDP2 makes a layer's fp32 accumulated gradient in that layer's first
    post-backward, casting the bf16 .grad the backward left (FSDPParamGroup.post_backward ->
    FSDPParam.to_accumulated_grad_if_needed, pytorch/pytorch@65881d15 torch/distributed/
    _composable/fsdp/_fsdp_param.py): a chunk has none before its first backward."""
    return torch_pipelining(job) and _keeps_all_unsharded(job) and job.layout.vpp > 1


@functools.lru_cache(maxsize=256)
def _peak_candidates(pp: int, v: int, m: int, rank: int) -> tuple[Moment, ...]:
    """The moments of interleaved_backward_moments that can hold the most: of those with the same
    micro-batches in flight per chunk, the last. Forwards run and chunks begun only grow from one
    backward to the next, and what a moment holds grows with both (kept outputs per forward run,
    gradients per chunk begun), so the last of each such group holds at least as much as the
    others; a schedule has few distinct in-flight patterns, against m·v moments. Cached here, the
    one caller of interleaved_backward_moments outside the tests, so only the candidates are kept."""
    last: dict[tuple[int, ...], int] = {}
    moments = interleaved_backward_moments(pp, v, m, rank)
    for j, (_, inflight, _) in enumerate(moments):
        last[inflight] = j
    return tuple(moments[j] for j in sorted(last.values()))


def _interleaved_peak(job: Job, rank: int, chunks: list[Breakdown], states: Breakdown) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """Under grads_by_chunk: the backward start holding the most activations, kept outputs and fp32
    unsharded gradients together (interleaved_backward_moments), as (forwards run per chunk,
    micro-batches in flight per chunk, the unsharded_grads line then). The first backward holds
    the most micro-batches but only its own chunk's gradients; the first chunk's first backward
    holds every chunk's gradients and the first chunk's micro-batches only. As in stage_buffers,
    the sharded gradients (`states`, the rank's model states) do not exist until the step's last
    backward."""
    lay = job.layout
    grads = [4 * _chunk_params(job, rank, c) for c in range(lay.vpp)]
    sharded = int(states.value("gradients"))
    best, out = -1, None
    for done, inflight, started in _peak_candidates(lay.pp, lay.vpp, job.num_microbatches, rank):
        alive = max(0, sum(grads[c] for c in started) - sharded)
        held = (sum(int(c.total) * n for c, n in zip(chunks, inflight))
                + kept_pipeline_outputs(job, rank, inflight, done) + alive)
        if held > best:
            best, out = held, (done, inflight, alive)
    assert out is not None
    return out


def _transient(job: Job, rank: int, costs: dict[tuple[LayerKind, Recompute], LayerCost],
               buffers: Breakdown) -> tuple[Breakdown, Breakdown, int]:
    """The backward moment with the most bytes allocated, the buffers alive then, and the bytes the
    caching allocator keeps reserved beside them for the stage's other moment.

    The loss on the last stage runs before any decoder layer's backward, so without the buffers
    only that backward holds (`loss_absent_buffers`); one layer's backward has its recomputed
    activations and gradient tensors with every buffer. The allocated peak is the larger moment.
    The reserved one keeps both: the loss's blocks, freed, stay cached while the layers run, and
    the layers' buffers cannot be carved from them where FSDP2 allocates them on its own streams
    (the flat all-gather output on its all-gather copy-in stream, pytorch/pytorch@010ae4a8
    torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py foreach_all_gather), since a freed
    block is reallocated only on the stream that allocated it (pytorch/pytorch@eb42ad6e
    c10/cuda/CUDACachingAllocator.cpp, the allocator's header comment). Those kept bytes (all the
    absent buffers, the default-stream gradients among them) are the third value, reserved but not
    allocated: the stage's peak stays the loss with every buffer, as the 20 torchtitan rows of
    docs/accuracy.md (reserved peaks) bear out."""
    best = max(
        (c.backward_bytes for chunk in range(job.layout.vpp) for c in _chunk_layer_costs(job, rank, chunk, costs)),
        default=0,
    )
    last = rank == job.layout.pp - 1
    loss = act.loss_workspace(job) if last else 0
    freed = act.loss_cached_bytes(job) if last else 0  # reserved beside the loss, not allocated
    absent = loss_absent_buffers(job, rank)
    only = loss_only_buffers(job, rank) if last else 0  # gathered at the loss alone
    if loss + only > best + absent.total:
        gone = dict(absent.parts, unsharded_params=absent.value("unsharded_params") - only)
        without = Breakdown.of("bytes", **{name: v - gone.get(name, 0) for name, v in buffers})
        return Breakdown.of("bytes", loss_backward=loss), without, int(absent.total) + freed
    return Breakdown.of("bytes", layer_backward=best), buffers, max(0, loss + freed - best)


def _largest_modules(job: Job, rank: int) -> tuple[int, int]:
    """The two largest weights (elements on this rank) among the stage's GEMM weights, embedding
    and output layer."""
    params = rank_params(job, rank)
    sizes = [int(params.value("embedding")), int(params.value("head"))]
    for kind in {job.model.layer_kind(i) for i in job.stage_layer_ids(rank)}:
        sizes += [g.n * g.k for g in layer_gemms(job, kind)]
    first, after = sorted(sizes + [0, 0], reverse=True)[:2]
    return first, after


def _largest_layers(job: Job, rank: int) -> tuple[int, int]:
    """The parameters on this rank of the stage's two largest decoder layers (0 where it has fewer)."""
    # two layers of each kind at most can be the two largest
    first, after = sorted([p.total for p, n in rank_layer_params(job, rank) for _ in range(min(n, 2))] + [0, 0], reverse=True)[:2]
    return first, after


def scatter_stream_grads(job: Job, states: Breakdown) -> int:
    """Bytes the caching allocator keeps reserved, not allocated, at the first backward of a stage
    whose FSDP2 gradients sync only after the last micro-batch (torchtitan's gathered stages under a
    pipeline, stage_buffers): the step's sharded gradients, which stage_buffers leaves out of that
    moment, as free blocks of the reduce-scatter stream. FSDP2 allocates each reduce-scatter's output
    on its reduce-scatter stream and makes the sharded gradients views of it (torch 2.13.0,
    pytorch/pytorch@cf30153c torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:611-613 in
    foreach_reduce, 704-708, 754; "The RS output is allocated in the RS stream and used in the default
    stream (for optimizer)", 763-766; the same at pytorch/pytorch@010ae4a8). The previous step made them
    there; the optimizer's zero_grad frees them before this step's forwards, and a freed block is
    reallocated only on the stream that allocated it (pytorch/pytorch@eb42ad6e
    c10/cuda/CUDACachingAllocator.cpp, the header comment; with torchtitan's expandable_segments:True,
    run_train.sh, each expandable segment belongs to one stream: torch 2.13.0
    c10/cuda/CUDACachingAllocator.h:118-135, StreamSegmentSize), so the forwards and backwards on the
    compute stream cannot use them and the reserved counter keeps them beside the backward's peak. Every other
    FSDP job's peak counts the sharded gradients already (model_states)."""
    if not (_keeps_all_unsharded(job) and job.layout.pp > 1):
        return 0
    return int(states.value("gradients"))


def _keeps_all_unsharded(job: Job) -> bool:
    """FSDP2 that keeps every parameter of the stage gathered: zero 2 (no resharding after forward),
    and zero 3 under torch's pipelining (stage_buffers). There it holds whatever
    TrainingSpec.fsdp_reshard_after_forward says: the stage turns resharding after backward off for
    every micro-batch's backward and back on only for the reduce-scatter after the last one (torch
    2.13.0 torch/distributed/pipelining/stage.py:846-847, 1176-1177), so from the first backward on,
    in the steady state that holds the most micro-batches' activations, every layer stays gathered."""
    return gathers_whole_stage(job.training.framework, job.zero, pipelined=job.layout.pp > 1)


# What FSDP2 holds per parameter it gathers: the 16-bit weight (MixedPrecisionPolicy param_dtype), and
# for its unsharded gradient the copy in the fp32 reduce dtype, beside the 16-bit gradient the backward
# made, which the reduce-scatter copies into its fp32 input buffer before freeing it (torch 2.13.0
# torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:597-605 foreach_reduce); a stage kept gathered under a pipeline
# (gathers_whole_stage) accumulates the fp32 one (stage_buffers).
GATHERED_WEIGHT_BYTES = 2
GATHERED_GRAD_BYTES = 4
# one layer's gradient on its way to the reduce-scatter: the 16-bit gradient and its fp32 copy
SCATTERED_GRAD_BYTES = GATHERED_WEIGHT_BYTES + GATHERED_GRAD_BYTES


def gathers_whole_stage(framework: Framework, zero: Zero, *, pipelined: bool) -> bool:
    """_keeps_all_unsharded by its three inputs (pipelined: pp > 1), for the search's memory bound
    (planner.search)."""
    return framework is Framework.TORCHTITAN and (zero is Zero.GRADIENTS or (zero is Zero.PARAMETERS and pipelined))


def _fully_sharded(job: Job) -> bool:
    """FSDP (zero 3) that reshards every decoder layer after its forward and its backward: not
    DeepSpeed's module-wise ZeRO-3, not torchtitan's gathered stages (stage_buffers)."""
    return job.zero is Zero.PARAMETERS and job.training.framework is not Framework.DEEPSPEED and not _keeps_all_unsharded(job)


def _root_reshards(job: Job) -> bool:
    """Whether FSDP2 reshards the root unit (embedding, final norm, output layer) after its forward:
    only when fully_shard is given reshard_after_forward=True explicitly, which torch honours on the
    root since 2.8 (pytorch/pytorch#154704, #155319: left unset, the root stays gathered, its
    post_forward_mesh_info cleared in FSDPState._lazy_init). KempnerForge passes True to the root
    (KempnerInstitute/KempnerForge@01b461a kempnerforge/distributed/parallel.py:110-115, 148-154)
    and runs torch 2.11 (uv.lock)."""
    return job.training.fsdp_reshard_after_forward is True


def _splits_root(job: Job) -> bool:
    """TrainingSpec.splits_fsdp_root (torchtitan's embedding and [norm, output] units), but not with a
    tied output layer: its weight is the embedding's, and FSDP2 gives a parameter to one unit only
    (torch 2.13.0 torch/distributed/fsdp/_fully_shard/_fsdp_init.py _get_managed_states takes the
    parameters of the modules one fully_shard call is given), so the root keeps both, as the validate
    worker shards them (planner/validate/worker.py apply_fsdp)."""
    return job.training.splits_fsdp_root and not job.model.tie_embeddings


def loss_absent_buffers(job: Job, rank: int) -> Breakdown:
    """The part of stage_buffers not alive while the loss runs on the last stage, under fully
    sharded FSDP: the gathered current and prefetched layer, one layer's 16-bit gradient with its
    fp32 reduce-scatter copy and the output layer's 16-bit gradient exist only in the backward
    through the layers and the output layer, which starts after the loss: the layers were
    resharded after their forward, and the backward's first gathers are issued by the pre-backward
    hooks of the root (on the logits' gradient) and of the last layer. torchtitan's own plan keeps
    its last layer gathered after the forward ("FSDP would prefetch it immediately",
    pytorch/torchtitan@e846b694 torchtitan/parallelisms/parallelize_llama.py:333-343; the same in
    torchtitan/distributed/fsdp.py at b5bcd76c): that layer is alive at the loss. The root unit's
    gathered parameters are absent as well where it reshards after its forward (_root_reshards)."""
    if not _fully_sharded(job):
        return Breakdown.of("bytes", unsharded_params=0, unsharded_grads=0)
    params = rank_params(job, rank)
    biggest, second = _largest_layers(job, rank)
    titan_plan = (job.training.framework is Framework.TORCHTITAN and job.training.fsdp_reshard_after_forward is None
                  and not _splits_root(job))
    gathered = second if titan_plan else biggest + second
    root = int(params.value("embedding") + params.value("head")) if _root_reshards(job) else 0
    return Breakdown.of("bytes", unsharded_params=GATHERED_WEIGHT_BYTES * (root + gathered),
                        unsharded_grads=_fsdp_backward_grads(job, params, biggest))


def loss_only_buffers(job: Job, rank: int) -> int:
    """Gathered parameters alive while the loss runs on the last stage but not in the decoder layers'
    backward: where _splits_root holds, the [norm, output] unit's 16-bit weights, kept from
    its forward until its own backward, which reshards them before the layers' backward starts."""
    if not (_splits_root(job) and _fully_sharded(job)):
        return 0
    return GATHERED_WEIGHT_BYTES * int(rank_params(job, rank).value("head"))


def _fsdp_backward_grads(job: Job, params: Breakdown, biggest: int) -> int:
    """Fully sharded FSDP's unsharded gradients in the backward: the output layer's bf16 gradient,
    held until the root's reduce-scatter (not where the output layer is a unit of its own,
    _splits_root, reduce-scattered before the layers' backward), and one layer's
    bf16 gradient with its fp32 reduce-scatter copy."""
    head = 0 if _splits_root(job) else GATHERED_WEIGHT_BYTES * int(params.value("head"))
    return head + SCATTERED_GRAD_BYTES * biggest


def stage_buffers(job: Job, rank: int) -> Breakdown:
    """Unsharded parameter/gradient copies, fp8 weight caches and ZeRO buckets."""
    fw, z, lay = job.training.framework, job.zero, job.layout
    params = rank_params(job, rank)
    stage_params = int(params.total)
    biggest, second = _largest_layers(job, rank)
    root = int(params.value("embedding") + params.value("head"))
    unsharded_params = unsharded_grads = buckets = fp8_cache = 0
    if _keeps_all_unsharded(job):
        # FSDP2 without resharding after forward (zero 2, and torchtitan's default under PP) keeps
        # every bf16 parameter of the stage gathered; under PP the micro-batches' gradients also
        # accumulate unsharded in the fp32 reduce dtype (torch pipelining turns gradient sync off
        # until the last micro-batch, FSDPParam.unsharded_accumulated_grad).
        unsharded_params = GATHERED_WEIGHT_BYTES * stage_params
        unsharded_grads = GATHERED_GRAD_BYTES * stage_params if lay.pp > 1 else SCATTERED_GRAD_BYTES * biggest
        if lay.pp > 1:
            # The sharded gradients do not exist at the peak (the first backward of a step): the
            # optimizer's zero_grad sets them to None before the step's forwards (torchtitan@9dec370
            # train.py:266 `optimizers.zero_grad()`; KempnerForge scripts/train.py:316-318 at
            # 01b461a; set_to_none=True is torch's default), and the reduce-scatter after the last
            # micro-batch's backward makes them layer by layer as the fp32 unsharded ones are freed
            # (as under TrainingSpec.fsdp_sync_last_microbatch below).
            unsharded_grads -= int(rank_state_bytes(job, rank).value("gradients"))
    elif z is Zero.PARAMETERS and fw is Framework.DEEPSPEED:
        # DeepSpeed ZeRO-3 gathers the parameters of the module it runs, not of the whole layer:
        # fetch and release go module by module over each module's own parameters (recurse=False),
        # and it prefetches the next parameters until stage3_prefetch_bucket_size (5e7) elements are
        # under way, none once stage3_max_live_parameters (1e9) are gathered; nothing above the
        # persistence threshold (1e5 parameters) stays gathered, the root included. A weight's 16-bit
        # gradient lives until it is copied into the reduce bucket (counted under zero_buckets)
        # (deepspeedai/DeepSpeed@edaa7221 deepspeed/runtime/zero/partitioned_param_coordinator.py
        # L49-50, L449-475, L494-530; config.py:215-248; stage3.py:730-746). A module's weight is taken
        # as the largest GEMM weight (fused qkv, fused gate and up projections: an upper bound for
        # transformers' separate q/k/v and gate/up modules), or the embedding and output layer.
        # The prefetch takes whole parameters until it reaches its target, so it ends at most one
        # parameter past it; the second-largest weight bounds that parameter.
        first, after = _largest_modules(job, rank)
        target = min(DEEPSPEED_MAX_LIVE_ELEMENTS - first, DEEPSPEED_PREFETCH_ELEMENTS)
        prefetch = 0 if target <= 0 else (after if after >= target else target + after)
        unsharded_params = 2 * (first + prefetch)
        unsharded_grads = 2 * first
    elif z is Zero.PARAMETERS:
        # Fully sharded: the root unit (embedding, final norm, output layer) stays gathered for the
        # step (FSDP2 does not reshard the root after forward), plus the current and the prefetched
        # layer; backward adds its gradients (_fsdp_backward_grads). Where _splits_root holds
        # the root holds none of them in the layers' backward (loss_only_buffers: the output layer at the loss).
        kept_root = 0 if _splits_root(job) else root
        unsharded_params = GATHERED_WEIGHT_BYTES * (kept_root + biggest + second)
        unsharded_grads = _fsdp_backward_grads(job, params, biggest)
        if job.training.fsdp_sync_last_microbatch and job.num_microbatches > 1:
            # TrainingSpec.fsdp_sync_last_microbatch: every parameter's unsharded gradient, in the
            # fp32 reduce dtype, from the first micro-batch's backward on. The sharded 16-bit
            # gradients it replaces do not exist at the peak (the last micro-batch's loss, at the
            # start of its backward): optimizer.zero_grad() sets them to None after each step
            # (KempnerForge scripts/train.py:316-318 at 01b461a; set_to_none=True is torch's
            # default) and the last micro-batch's reduce-scatters make them layer by layer, as the
            # fp32 ones are freed. So the line is the fp32 gradients less the states' gradients.
            grads = rank_state_bytes(job, rank).value("gradients")
            unsharded_grads += 4 * stage_params - int(grads)
    if fw is Framework.DEEPSPEED and z >= Zero.OPTIMIZER:
        buckets = 2 * 2 * min(DEEPSPEED_BUCKET_ELEMENTS, stage_params)  # reduce + all-gather bucket, 16-bit
    if fw is Framework.TORCHTITAN and z is Zero.NONE and job.dp > 1:
        # DDP gradient buckets (fp32 copies, gradient_as_bucket_view=False); one data-parallel rank
        # runs no DDP (torchtitan applies it for dp_replicate > 1; KempnerForge builds no device
        # mesh at world size 1, KempnerInstitute/KempnerForge@01b461a kempnerforge/distributed/
        # setup.py:81-85, and wraps nothing, parallel.py:208-212)
        buckets = 4 * stage_params
    if job.training.ddp_buckets:
        # torch DDP beside the framework's own gradient buffer: its reducer allocates one flat buffer
        # per bucket in the parameters' (16-bit) dtype at construction and keeps it; with
        # gradient_as_bucket_view=False, DDP's default and nanotron's, the gradients are copied into
        # it rather than viewed (pytorch/pytorch@00413201 torch/csrc/distributed/c10d/reducer.cpp,
        # Reducer::initialize_buckets `replica.contents = at::empty(...)` and
        # mark_variable_ready_dense `bucket_view.copy_(grad)`).
        buckets += 2 * stage_params
    precision = job.training.precision
    if fw is Framework.MEGATRON and precision.low:
        # Transformer Engine caches each weight's quantised copy across micro-batches: under fp8 the
        # copy and its transpose, and with fp8 parameters (--fp8-param-gather) the weight is its own
        # fp8 copy and only the transpose is kept (TE Float8Tensor's transpose cache), under MXFP8
        # each usage with its e8m0 scales (activations.MXFP8_BYTES); under NVFP4 the
        # same cache (get_weight_workspace, cache_name "weight") holds the weight's row-wise usage for
        # the fprop and its column-wise one for the dgrad, NVFP4_BYTES per element each
        # (TransformerEngine@40c69e75 transformer_engine/pytorch/module/linear.py:237-263;
        # csrc/quantizer.cpp:1198-1217).
        per = 1 if precision is Precision.FP8 and job.training.fp8_param_gather else 2
        fp8_cache = per * act.operand_bytes(precision, job.training.fp8_recipe) * (params.value("layers") + params.value("experts"))
    return Breakdown.of(
        "bytes",
        unsharded_params=unsharded_params,
        unsharded_grads=unsharded_grads,
        zero_buckets=buckets,
        fp8_weight_cache=fp8_cache,
        tp_gather=tp_gather_buffer_bytes(job),
        tp_userbuffers=tp_userbuffers_bytes(job),
    )


def pending_scatter_bytes(job: Job, rank: int, *, backward_end: bool = False) -> int:
    """TrainingSpec.tp_scatter_inputs_pending: the freed row-parallel outputs the caching allocator
    still holds for the NCCL stream when the host reaches the stage's peak, two whole 16-bit
    [mbs·seq, hidden] outputs per decoder layer whose reduce-scatter the GPU has not run yet.

    How far the host runs ahead of the GPU is bounded twice. nanotron's pipeline syncs the host at
    every point-to-point send and receive (huggingface/nanotron@c2528430 src/nanotron/parallel/
    pipeline_parallel/p2p.py:229 asserts on a CUDA tensor's element, :266 compares one); a stage
    sends each warm-up forward's output at once and a steady-state forward's at the start of its
    next backward (engine.py:248-269, pipeline_parallel/functional.py:31-40, state.py:124-142), so
    a stage's forward is pending only back to its own first layer. Nothing else syncs in a step
    before train_step_logs' torch.cuda.synchronize (trainer.py:597-598), and the host stops only
    when the stream's launch queue is full, the GPU then at most STREAM_LAUNCH_QUEUE /
    NANOTRON_LAYER_LAUNCHES layers behind it. The model takes that bound, the host as far ahead as
    the queue lets it: a host slower than the GPU holds fewer.

    At the end of a backward (`backward_end`) the pending blocks are the backward's own: each layer's
    two column-parallel input gradients, whole [mbs·seq, hidden] tensors reduce-scattered and freed
    (parallel/tensor_parallel/functional.py:118-262). With a pipeline the stage's backward starts
    behind a sync (its first node receives the output gradient, p2p.py:229, 266), so they reach back to
    the stage's first layer; without one nothing syncs between the forward and the backward
    (engine.py:276-297, no send or receive at pp 1), and the GPU may still be behind on the forward's
    last layers as well: up to twice the stage's layers, within the same launch-queue bound."""
    if not (job.training.tp_scatter_inputs_pending and job.layout.tp > 1 and job.sp):
        return 0
    layers = len(job.stage_layer_ids(rank)) * (2 if backward_end and job.layout.pp == 1 else 1)
    ahead = min(layers, STREAM_LAUNCH_QUEUE // NANOTRON_LAYER_LAUNCHES)
    d = act.dims(job)
    return 2 * ahead * d.t * d.h * act.ACT_BYTES


def tp_gather_buffer_bytes(job: Job) -> int:
    """TrainingSpec.tp_gather_buffers: nanotron's two persistent 16-bit gather buffers, each the
    whole micro-batch sequence by the hidden size ("allgather" for the column-parallel inputs,
    "allgather2" for the row-parallel output gradients)."""
    if not (job.training.tp_gather_buffers and job.layout.tp > 1 and job.sp):
        return 0
    d = act.dims(job)
    return 2 * d.t * d.h * act.ACT_BYTES


# Transformer Engine's userbuffers (Megatron --tp-comm-overlap): initialize_ub registers one
# communicator per overlapped GEMM of a transformer layer, each with its own buffer of the input
# shape: six for the all-gathers (qkv/fc1 fprop and dgrad, proj/fc2 dgrad) and four for the
# reduce-scatters (proj/fc2 fprop, qkv/fc1 wgrad's bulk dgrad reduce-scatter)
# (TransformerEngine@8e5f00f2, release_v0.8, transformer_engine/pytorch/module.py:152-240;
# @9e4091e7, v1.6rc1, pytorch/module/base.py:64-228, and @f05f12c9, v2.5: the same ten names).
# TransformerEngine 077e26c31 (2025-08-08, in release_v2.8) adds proj_wgrad and fc2_wgrad buffers
# for the MXFP8 wgrad all-gathers; those two are not counted here.
UB_ALL_GATHER_BUFFERS = 6
UB_REDUCE_SCATTER_BUFFERS = 4


def userbuffers(job: Job) -> bool:
    """Megatron --tp-comm-overlap: Transformer Engine's userbuffers run the tp collectives (the rule
    tp_comm_overlap holds it to tp > 1 with sequence parallel)."""
    return job.training.framework is Framework.MEGATRON and job.training.tp_comm_overlap and job.sp


def ub_gather_bytes(job: Job) -> int:
    """Bytes per element of what TE userbuffers all-gather: under fp8 the all-gather buffers hold
    the fp8-cast tensors (initialize_ub's layers_all_gather_overlap, qkv/fc1 fprop and dgrad,
    proj/fc2 dgrad: "AllGather buffers use fp8 when using fp8 recipe", a uint8 userbuffer;
    TransformerEngine@40c69e75 transformer_engine/pytorch/module/base.py:289-299, 344, 414-417, 476-480,
    since TransformerEngine@7d8ef9bf). The reduce-scatters stay in the 16-bit output dtype."""
    fp8 = job.training.precision is Precision.FP8 and job.cluster.gpu.peak_flop_per_s.fp8
    return 1 if fp8 else act.ACT_BYTES


def tp_userbuffers_bytes(job: Job) -> int:
    """TrainingSpec.tp_comm_overlap under Megatron: the userbuffers Transformer Engine allocates once
    for the run, outside torch's caching allocator, and keeps.

    Shape: Megatron and NeMo hand initialize_ub [seq·mbs/cp, hidden], the whole tp group's sequence
    (Megatron-LM@d98e8a64 megatron/training/initialize.py:223-226; NVIDIA/NeMo@0b4c3dbf, the MLPerf
    v3.0 GPT-3 code, nemo/collections/nlp/models/language_modeling/megatron_gpt_model.py:336-339, and
    @4068955b, v4.1, 751-756 with the /cp). Each communicator's buffer is a cudaMalloc of
    numel·element_size of that shape inside register_user_buffer_collective, not a torch allocation
    (TransformerEngine@8e5f00f2 pytorch/csrc/comm_gemm_overlap.h:65-68, 349-353;
    userbuffers/userbuffers-host.cpp:302-309); the torch.empty sample it is sized from is freed on
    return. Dtype: the all-gather buffers are uint8 under an fp8 recipe ("AllGather buffers use fp8
    when using fp8 recipe", module.py:168-171 at 8e5f00f2; base.py:81-83, 152-155 at 9e4091e7), the
    reduce-scatter buffers the 16-bit activation dtype. A reduce-scatter run as a ring exchange
    (TrainingSpec.ub_ring_exchange_rs) holds 2·tp − 1 chunks of seq·mbs/(cp·tp) rows for the received
    partial outputs instead of tp (TransformerEngine@9e4091e7 pytorch/csrc/comm_gemm_overlap.h:572-581;
    common/comm_gemm_overlap/comm_gemm_overlap.cpp:670-681 at 40c69e75)."""
    tr, lay = job.training, job.layout
    if not userbuffers(job):
        return 0
    d = act.dims(job)
    buffer = d.t * d.h  # elements of one [seq·mbs/cp, hidden] buffer
    ring = len(tr.ub_ring_exchange_rs)  # of the two forward reduce-scatters (proj, fc2)
    scatter_elements = (UB_REDUCE_SCATTER_BUFFERS - ring) * buffer + ring * buffer // lay.tp * (2 * lay.tp - 1)
    return UB_ALL_GATHER_BUFFERS * buffer * ub_gather_bytes(job) + scatter_elements * act.ACT_BYTES


def _deepep_buffer_bytes(job: Job) -> int:
    """DeepEP's buffers where its dispatcher runs (deepep.buffer_bytes): one Buffer per process, sized
    for the group and the hidden width, reused by every MoE layer (the frameworks' get_buffer keeps one
    module-level Buffer and only grows it)."""
    if job.training.moe_dispatch is not MoEDispatch.DEEPEP or job.model.moe is None:
        return 0
    return deepep.buffer_bytes(job)


def _process_groups(job: Job) -> int:
    lay = job.layout
    return process_groups(lay.tp, lay.pp, lay.cp, job.dp, lay.ep, job.etp)


def process_groups(tp, pp, cp, dp, ep, etp):  # type: ignore[no-untyped-def]
    """Communicators with more than one rank (ints or numpy arrays): tp, pp, cp, dp, ep, and etp
    where it differs from tp."""
    return (tp > 1) * 1 + (pp > 1) + (cp > 1) + (dp > 1) + (ep > 1) + ((etp != tp) & (etp > 1))


def step_peak(backward_bytes: int | float, step_grads_bytes: int | float) -> bool:
    """Whether a stage's peak is at the optimizer step rather than at its first backward.

    Megatron's mixed-precision optimizers give each fp32 main parameter the fp32 copy of its 16-bit
    gradient in the step (`main_param.grad = model_param.main_grad.float()`, a new tensor when the
    gradient buffer is fp16 or bf16; Megatron-LM@d98e8a64 megatron/core/optimizer/optimizer.py:1092-1100,
    distrib_optimizer.py:2756-2792) and free it with set_to_none in `optimizer.zero_grad()` at the
    start of the next train_step (optimizer.py:1048-1061, distrib_optimizer.py:2568-2590;
    megatron/training/training.py:3039-3044), before any forward. The same code in the late-2023
    Megatron forks of Zero Bubble (sail-sg/zero-bubble-pipeline-parallelism@ed85b11c
    megatron/optimizer/optimizer.py:825-836, 869-875; megatron/training.py:421-428). So the copy
    and the activations (with the backward's working set) are never alive together."""
    return step_grads_bytes > backward_bytes


def stage_memory(job: Job, rank: int, costs: dict[tuple[LayerKind, Recompute], LayerCost] | None = None) -> StageMemory:
    costs = costs or layer_costs(job)
    inflight = inflight_microbatches(job, rank)
    chunks = [_chunk_activations(job, rank, c, costs) for c in range(job.layout.vpp)]
    key = ("stage_fixed", job.rank_signature(rank))  # what does not depend on the in-flight count
    if key not in job.memo:
        job.memo[key] = (*_transient(job, rank, costs, stage_buffers(job, rank)), rank_state_bytes(job, rank))
    transient, buffers, cached, states = job.memo[key]
    done, chunk_grads = None, None
    if grads_by_chunk(job):
        done, inflight, chunk_grads = _interleaved_peak(job, rank, chunks, states)
    activations = Breakdown.of(
        "bytes",
        **{
            name: sum(chunk.value(name) * count for chunk, count in zip(chunks, inflight))
            for name in CHUNK_PARTS
        },
    )
    kept = kept_pipeline_outputs(job, rank, inflight, done)
    if kept:
        activations = Breakdown.of("bytes", **dict(activations), kept_outputs=kept)
    buffers = Breakdown.of("bytes", **dict(buffers), pipeline_recv=pipeline_recv_bytes(job, rank, inflight))
    if chunk_grads is not None:
        buffers = _with_part(buffers, "unsharded_grads", chunk_grads)
    end = _backward_end(job, rank, chunks, inflight) if job.training.grads_kept_through_backward else None
    # the moments with reduce-scatter inputs pending (pending_scatter_bytes): the end of the stage's
    # forward (with the loss on the last stage), every micro-batch in flight, and the end of the
    # backward where the stage's gradients are kept through it, with the backward's own (its
    # column-parallel linears' whole input gradients; a backward layer queues more operations than
    # a forward one, so the forward's bound holds for it too)
    scatter = pending_scatter_bytes(job, rank)
    held = 0
    if scatter:
        last = rank == job.layout.pp - 1
        held = activations.total + (act.loss_workspace(job) if last else 0) + scatter
        if end is not None:
            held = max(held, sum(part.total for part in end) + pending_scatter_bytes(job, rank, backward_end=True))
    if end is not None:
        activations, transient = _larger(end, (activations, transient))
    if _whole_graph_gradients(job):
        activations, transient = _larger(_compiled_backward_end(job, states), (activations, transient))
    step_grads = states.value("fp32_gradients")
    if step_peak(activations.total + transient.total, step_grads):
        activations, transient = activations.scaled(0), transient.scaled(0)
    else:
        states = _with_part(states, "fp32_gradients", 0)
        step_grads = 0
    # reserved, not allocated: what those moments with the pending blocks need beyond the peak
    pending = max(0, int(held - (activations.total + transient.total + step_grads)))
    if job.training.param_buffer_init_copy and job.zero >= Zero.OPTIMIZER:
        trained = transient
        states, activations, transient, buffers, cached = _optimizer_construction(
            states, activations, transient, buffers, cached)
        pending = pending if transient is trained else 0  # the construction is the peak: no forward
    dynamic = (activations.total + transient.total + step_grads + cached
               + buffers.value("unsharded_params") + buffers.value("unsharded_grads"))
    overhead = Breakdown.of(
        "bytes",
        cuda_context=CUDA_CONTEXT_BYTES,
        nccl=NCCL_BYTES_PER_GROUP * _process_groups(job),
        deepep_buffers=_deepep_buffer_bytes(job),
        fragmentation=int(FRAGMENTATION * dynamic),
        # reserved, not allocated: the other backward moment's blocks (_transient), and the sharded
        # gradients' blocks on FSDP2's reduce-scatter stream (scatter_stream_grads)
        cached_blocks=cached + (0 if step_grads else scatter_stream_grads(job, states)),
        # reserved, not allocated: reduce-scatter inputs freed ahead of the GPU (pending_scatter_bytes)
        pending_collectives=pending,
    )
    breakdown = Breakdown.of(
        "bytes",
        model_states=states,
        activations=activations,
        transient=transient,
        buffers=buffers,
        overhead=overhead,
    )
    return StageMemory(rank=rank, layers=job.stage_layer_ids(rank), inflight=inflight, breakdown=breakdown,
                       dynamic_bytes=dynamic)


def _larger(moment: tuple[Breakdown, Breakdown], start: tuple[Breakdown, Breakdown]) -> tuple[Breakdown, Breakdown]:
    """The (activations, transient) pair with more bytes: a later `moment` of the backward, or its `start`
    where they tie."""
    return moment if sum(part.total for part in moment) > sum(part.total for part in start) else start


def _backward_end(job: Job, rank: int, chunks: list[Breakdown], inflight: tuple[int, ...]) -> tuple[Breakdown, Breakdown]:
    """The activations left and the 16-bit gradients at the end of the first backward under
    TrainingSpec.grads_kept_through_backward: the backward has freed its micro-batch's activations
    (all of them without a pipeline, one micro-batch of the last chunk with one) and left a 16-bit
    gradient on every parameter of the stage, freed only after it ends (huggingface/nanotron@c2528430
    src/nanotron/optim/gradient_accumulator.py:204-223). The working set of the stage's first
    layer's backward, which runs when nearly all of them exist, is not added."""
    lay = job.layout
    left = [0] * lay.vpp if lay.pp == 1 else [n - (c == lay.vpp - 1) for c, n in enumerate(inflight)]
    after = Breakdown.of(
        "bytes",
        **{name: sum(chunk.value(name) * count for chunk, count in zip(chunks, left))
           for name in CHUNK_PARTS},
    )
    return after, Breakdown.of("bytes", stage_gradients=2 * int(rank_params(job, rank).total))


def _optimizer_construction(states: Breakdown, activations: Breakdown, transient: Breakdown, buffers: Breakdown,
                            cached: int) -> tuple[Breakdown, Breakdown, Breakdown, Breakdown, int]:
    """The larger of the training peak and the distributed optimizer's construction under
    TrainingSpec.param_buffer_init_copy: the weights, the grad buffer and the fp32 master shards,
    with a transient the size of the grad buffer; no optimizer state (Adam's moments come with the
    first step), no activation, no buffer."""
    grad_buffer = int(states.value("gradients"))
    at_init = Breakdown.of("bytes", **{name: v if name in ("weights", "gradients", "master_weights") else 0
                                       for name, v in states})
    if at_init.total + grad_buffer <= states.total + activations.total + transient.total + buffers.total + cached:
        return states, activations, transient, buffers, cached
    return (at_init, activations.scaled(0), Breakdown.of("bytes", param_buffer_init=grad_buffer),
            buffers.scaled(0), 0)


def _whole_graph_gradients(job: Job) -> bool:
    """TrainingSpec.compile_whole_model where no hook breaks the graph (no FSDP, no DDP, no pipeline)
    and gradients accumulate over micro-batches."""
    lay = job.layout
    return (job.training.compile_whole_model and job.zero is Zero.NONE and job.dp == 1 and lay.pp == 1
            and job.num_microbatches > 1)


def _compiled_backward_end(job: Job, states: Breakdown) -> tuple[Breakdown, Breakdown]:
    """The activations left and the gradients at the end of the one compiled graph's backward
    (TrainingSpec.compile_whole_model): every parameter's new gradient, as large as the .grad it is
    added into, returned together; the saved activations freed by then (AOTAutograd's compiled
    backward releases each after its last use), bar the 16-bit logits the training loop still
    references (TrainingSpec.loss_on_16bit_logits)."""
    d = act.dims(job)
    kept = d.t * d.vocab * act.ACT_BYTES if job.training.loss_on_16bit_logits else 0
    after = Breakdown.of("bytes", embedding=0, layers=0, head=kept)
    return after, Breakdown.of("bytes", compiled_gradients=int(states.value("gradients")))


def check_headroom(headroom: float) -> float:
    """The fraction of HBM kept free: 0 <= headroom < 1 (NaN fails both comparisons)."""
    if not 0 <= headroom < 1:
        raise SpecError(f"headroom({headroom}) must be a fraction in [0, 1), e.g. 0.05 for 5%")
    return headroom


def memory_estimate(job: Job, *, headroom: float = DEFAULT_HEADROOM) -> MemoryEstimate:
    check_headroom(headroom)
    costs = layer_costs(job)
    stages = tuple(stage_memory(job, r, costs) for r in range(job.layout.pp))
    stages = tuple(reclaimed_pending(s, job.cluster.gpu.hbm_bytes) for s in stages)
    return MemoryEstimate(stages=stages, capacity_bytes=job.cluster.gpu.hbm_bytes, headroom=headroom)


def reclaimed_pending(stage: StageMemory, capacity_bytes: int) -> StageMemory:
    """The stage with its pending reduce-scatter inputs (pending_scatter_bytes) held only up to the
    device's capacity: blocks freed with uses recorded on another stream are never what runs a device
    out of memory. When no cached block fits and cudaMalloc fails, the caching allocator frees its
    cached blocks and retries, and release_cached_blocks first waits for every outstanding event so
    that the blocks still held for another stream return to the pool (pytorch/pytorch@eb42ad6e
    c10/cuda/CUDACachingAllocator.cpp, DeviceCachingAllocator::malloc's retries and
    release_cached_blocks' synchronize_and_free_events). So those blocks stay reserved only while
    the rest of the stage leaves room for them, and whether a stage fits never depends on them
    (MemoryEstimate.required_bytes)."""
    pending = int(stage.breakdown.value(PENDING))
    room = max(0, capacity_bytes - stage.required_bytes)
    if pending <= room:
        return stage
    return replace(stage, breakdown=_with_part(stage.breakdown, PENDING, room))


def _with_part(breakdown: Breakdown, path: str, part: Part) -> Breakdown:
    """`breakdown` with the part at `path` (e.g. PENDING) replaced by `part`."""
    head, _, rest = path.partition("/")
    return Breakdown(breakdown.unit, tuple((name, (_with_part(p, rest, part) if rest else part) if name == head else p)
                                           for name, p in breakdown))
