"""Step time of a job: per-stage micro-batch time (compute + exposed tp/cp/ep/pp/FSDP communication),
the pipeline schedule around it, the data-parallel gradient tail and the optimizer step.

    step = m · T_max  +  bubble  +  dp tail  +  tied embedding  +  optimizer

T_r is one micro-batch's forward and backward through every model chunk of pipeline rank r,
T_max the slowest rank's. 1F1B and interleaved 1F1B keep every rank busy for m micro-batches
but the pipeline fills and drains around them: the bubble is (Σ_r T_r − T_max)/v, which is the
textbook (p−1)/(v·m) fraction of m·T when stages are equal (Narayanan et al. 2021, Sec. 2.2) and
lets an uneven stage (embedding, LM head) show as both a longer T_max and a longer fill. GPipe has
the same bubble as 1F1B (it differs in memory, not time).

What overlaps, per kind of communication, as the frameworks implement it (each function cites the
code it follows; the framework notes of docs/performance-model.md list the commits):
- tp: forward collectives are exposed; in backward Transformer Engine and Megatron overlap the
  input all-gather with the dgrad GEMM and the input-gradient reduce-scatter (all-reduce without
  sequence parallel) with the wgrad GEMM; torchtitan's DTensor plan overlaps nothing. With
  Megatron --tp-comm-overlap (TE userbuffers) or torchtitan async TP the GEMMs are cut into chunks
  and each chunk's transfer hides behind its neighbour's GEMM (tp_exposure);
- cp: each ring step's K/V transfer hides behind the previous step's attention kernel (TE p2p);
  torch's context parallel all-gathers K/V once, hidden only behind the first step; a Mamba-2
  layer's all-to-alls of heads (Megatron) run on the compute stream (exposed);
- ep: the token all-to-alls run on the compute stream (exposed), unless the dispatcher overlaps
  them with another micro-batch (Megatron's combined 1F1B); DeepEP's dispatch and combine too,
  priced by their own mechanism (cost_models.deepep);
- pp: each chunk's activation send/recv is on the critical path once per pass, over the network
  where the pipeline crosses from one scale-up domain into the next (pp_boundary_seconds), each
  followed by a re-launch after Megatron's synchronize (pp_sync_relaunch_seconds); the interleaved
  schedule's overlapped exchanges run at its slowest boundary's pace (pp_overlapped_hop_seconds); a tied embedding's
  gradient all-reduce between the first and last stage follows the dp sync, exposed
  (tied_embedding_grad_seconds);
- FSDP / ZeRO-3: each layer's parameter all-gather is prefetched behind the previous layer's
  forward, its gradient reduce-scatter behind the next layer's backward; the first gather and the
  last reduce-scatter of a pass cannot hide; DeepSpeed prefetches only stage3_prefetch_bucket_size
  parameters ahead;
- dp (DDP / distributed optimizer): gradients are reduced bucket by bucket during the last
  micro-batch's backward; what does not fit in that window, and at least the last bucket, is
  exposed. The distributed optimizer's parameter all-gather hides behind the next forward except
  the first bucket, contending there, exposed where it outlasts it (hidden_param_gather). nanotron's ZeRO-1 all-reduces the fp32 gradients after the backward and
  gathers the parameters after the optimizer step, both blocking (zero1_blocking_sync_seconds).
Communication that hides behind compute still costs the compute the SMs its NCCL kernels hold
(comm.nccl_sm_share): the compute term `contention` charges that share of every overlapped
collective, and TE's userbuffer kernels the 16 SMs they reserve.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import cached_property
from statistics import NormalDist

from cost_models import deepep
from cost_models import kernels as K
from cost_models.activations import CONVENTIONS
from cost_models.breakdown import Breakdown
from cost_models.calibration import DEFAULT, Calibration
from cost_models.comm import (
    MAX_SM_SHARE,
    Collective,
    Placement,
    collective_time,
    copy_engine_p2p_time,
    nccl_sm_share,
    placement,
    send_recv_time,
)
from cost_models.compute import (
    ACT_BYTES,
    FP32,
    Block,
    LayerTime,
    attention_kernels,
    chunk_seconds,
    float8_tp,
    head_backward_time,
    head_time,
    layer_time,
    linear_seconds,
    loss_time,
    linear_modules,
    main_grad_bytes,
    memory_seconds,
    optimizer_time,
    rowwise_linears,
    te_casts_separate,
    te_amax_reduced,
    te_weight_cast_bytes,
    titan_linears,
    tp_blocks,
    tp_gather_bytes,
    tp_grad_gather_bytes,
)
from cost_models.enums import AmaxGroup, Framework, MixerKind, MoEDispatch, Precision, Recompute, Schedule, Zero
from cost_models.flops import (
    GEMM_BACKWARD_FACTOR,
    Gemm,
    expert_tokens_per_gpu,
    head_gemm,
    layer_flops,
    local_tokens,
    model_flops_per_token,
    mtp_gemms,
    recomputed_share,
    tokens,
)
from cost_models.hardware import ClusterSpec
from cost_models.job import Job
from cost_models.mamba_shard import all_to_all_widths
from cost_models.model_spec import LayerKind, ModelSpec
from cost_models.memory import DEEPSPEED_BUCKET_ELEMENTS, DEEPSPEED_PREFETCH_ELEMENTS, torch_pipelining, ub_gather_bytes, userbuffers
from cost_models.units import MiB
from cost_models.params import norm_params
from cost_models.states import dense_params, embedding_params_local, local_kv_heads, local_layer_params, local_vocab, output_layer_vocab, padded_vocab, rank_params

# Megatron's default DDP bucket: max(40M, 1M x dp·cp) parameters, the data-parallel group counted
# with context parallelism (Megatron-LM@d98e8a64 megatron/training/training.py:2179-2194
# resolve_ddp_bucket_size; TrainingSpec.ddp_bucket_size overrides it)
MIN_DDP_BUCKET_PARAMS = 40_000_000
BUCKET_PARAMS_PER_DP_RANK = 1_000_000
DEEPSPEED_BUCKET_PARAMS = DEEPSPEED_BUCKET_ELEMENTS  # reduce_bucket_size (deepspeed/runtime/zero/config.py)
# DeepSpeed ZeRO-3 prefetches upcoming parameters only up to stage3_prefetch_bucket_size; the rest
# of a sub-module's gather waits on the critical path.
DEEPSPEED_PREFETCH_PARAMS = DEEPSPEED_PREFETCH_ELEMENTS
# nanotron's ddp_bucket_cap_mb default, passed to torch DDP's bucket_cap_mb (huggingface/nanotron@c2528430
# src/nanotron/config/config.py:222, trainer.py:847-852; torch_ddp_all_reduce_seconds)
TORCH_DDP_BUCKET_BYTES = 25 * MiB
NANOTRON_TENSORS_PER_LAYER = 6  # nanotron_param_tensors
# Transformer Engine userbuffers: the pipelined GEMM+reduce-scatter cuts the GEMM into 4 chunks and
# runs each chunk's reduce-scatter on 16 SMs beside the next chunk; bulk overlaps reserve 16 SMs too
# (TransformerEngine@40c69e75 transformer_engine/pytorch/module/base.py initialize_ub defaults;
# common/comm_gemm_overlap/comm_gemm_overlap.cpp split_overlap_rs, bulk_overlap).
UB_RS_SPLITS = 4
UB_SMS = 16
# Transformer Engine userbuffers' ring exchange rotates its chunk GEMMs over _NUM_MAX_UB_STREAMS = 3
# compute streams, each chunk's GEMM waiting only on the event of its own chunk's receive
# (TransformerEngine@40c69e75 transformer_engine/pytorch/module/base.py:64;
# common/comm_gemm_overlap/comm_gemm_overlap.cpp:994-1030 CommOverlapP2PBase::split_overlap_ag).
UB_STREAMS = 3

COMM_KINDS = ("tp", "cp", "ep", "pp", "dp")
COMPUTE_PARTS = ("gemm", "attention", "elementwise", "recompute", "contention", "sharding", "loss")


@dataclass(frozen=True)
class LayerPass:
    """Seconds of one decoder layer for one micro-batch: forward, and backward with its recompute."""

    compute: Breakdown  # gemm, attention, elementwise, recompute, contention
    forward_s: float  # the forward pass's share of compute
    comm: Breakdown  # exposed tp, cp, ep
    flop: float  # executed FLOPs, forward + backward + recompute
    recompute_flop: float = 0.0  # the recomputed forward work among them


def _grad_bytes(job: Job) -> int:
    """Bytes per gradient element in the data-parallel reduction: Megatron reduces its fp32 main
    grads for bf16 (accumulate_allreduce_grads_in_fp32 is forced on with --bf16, arguments.py) and
    fp16 grads for fp16; FSDP2 reduces in fp32 (torchtitan mixed_precision_reduce), FSDP with a bf16
    reduce dtype (TrainingSpec.fsdp_reduce_in_bf16) in bf16; DeepSpeed in the 16-bit dtype; Megatron
    with --grad-reduce-in-bf16 in bf16."""
    fw = job.training.framework
    if fw is Framework.DEEPSPEED or (fw is Framework.MEGATRON and (job.training.precision is Precision.FP16
                                                                  or job.training.grad_reduce_in_bf16)):
        return 2
    if fw is Framework.TORCHTITAN and job.training.fsdp_reduce_in_bf16:
        return 2
    return 4


def unfused_grad_accumulation_seconds(job: Job, rank: int, cal: Calibration) -> float:
    """Per micro-batch, Megatron without gradient accumulation fusion (TrainingSpec
    .grad_accumulation_fusion): main_grad.add_(param.grad) for every parameter of the rank, a
    memory-bound kernel reading the 16-bit gradient and the main grad and writing the main grad
    (Megatron-LM@d98e8a64 megatron/core/distributed/distributed_data_parallel.py:575-578). The
    fused path's read and write of the main grad happen in the wgrad GEMM's epilogue
    (compute.wgrad_out_bytes), not in a kernel of their own."""
    if job.training.framework is not Framework.MEGATRON or job.training.grad_accumulation_fusion:
        return 0.0
    params = float(rank_params(job, rank).total)
    return memory_seconds(job, params * (ACT_BYTES + 2 * main_grad_bytes(job)), cal)


TORCHTITAN_BLOCK_TENSORS = 9  # wq wk wv wo, w1 w2 w3, two RMSNorm weights (pytorch/torchtitan@9dec370ad torchtitan/models/llama/model.py:158-165, 248-250)


def pipelined_grad_accumulation_seconds(job: Job, rank: int, cal: Calibration) -> float:
    """Per micro-batch (averaged over the step), FSDP2's gradient accumulation under torch's
    pipelining (_pipelined_fsdp): the stage turns gradient sync off for every micro-batch's
    backward, so each layer's post-backward keeps its gradient unsharded and adds the micro-batch's
    into it (torch 2.13.0, git cf30153c: torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py:
    603-612 post_backward; _fsdp_param.py:802-820). With a reduce dtype other than the 16-bit
    parameters' (fp32, _grad_bytes 4) the first micro-batch's .grad is cast into a new fp32 tensor
    (to_accumulated_grad_if_needed: read 2, write 4 bytes per parameter) and each later one added
    to it (accumulate_unsharded_grad_if_needed, `unsharded_accumulated_grad += grad`: read 4 + 2,
    write 4); the same in torch 2.6.0 (git 2236df17, the torchtitan Dec 2024 runs' generation):
    _fsdp_param_group.py:378-386, _fsdp_param.py:629-647, pipelining/stage.py:636-651. With a bf16 reduce dtype autograd accumulates into .grad in place from the
    second micro-batch on (AccumulateGrad, `variable_grad += new_grad`: read 2 + 2, write 2; torch
    2.13.0 torch/csrc/autograd/functions/accumulate_grad.h:250-253). One kernel per parameter tensor
    each time (a loop over fsdp_params, not a foreach). Without pipelining FSDP reduce-scatters
    every micro-batch's gradient and accumulates only the sharded one (priced with the gathers)."""
    if not _pipelined_fsdp(job):
        return 0.0
    m = job.num_microbatches
    params = float(rank_params(job, rank).total)
    if _grad_bytes(job) > ACT_BYTES:
        moved = (ACT_BYTES + 4) + (m - 1) * (4 + ACT_BYTES + 4)
        passes = m
    else:
        moved = (m - 1) * 3 * ACT_BYTES
        passes = m - 1
    tensors = TORCHTITAN_BLOCK_TENSORS * len(job.stage_layer_ids(rank))
    return memory_seconds(job, params * moved / m, cal, launches=tensors * passes / m)


def te_weight_cast_seconds(job: Job, rank: int, cal: Calibration) -> float:
    """Per micro-batch, the 1/m share of the rank's Transformer Engine weight casts, which run once
    per step (compute.te_weight_cast_bytes) on the rank's decoder layers: memory-bound kernels at
    the stream fraction of HBM bandwidth, each paying a launch."""
    if not te_casts_separate(job):  # every layer's te_weight_cast_bytes is 0
        return 0.0
    moved, kernels = 0.0, 0
    for _, layer_id in stage_layers(job, rank):
        b, k = te_weight_cast_bytes(job, job.model.layer_kind(layer_id))
        moved, kernels = moved + b, kernels + k
    if not moved:
        return 0.0
    return memory_seconds(job, moved, cal, launches=kernels) / job.num_microbatches


def embedding_grad_seconds(job: Job, rank: int, cal: Calibration) -> float:
    """Per micro-batch on the rank holding Megatron's input embeddings: their weight gradient is a
    dense table, not a GEMM's output. F.embedding's backward (Megatron-LM@d98e8a64
    megatron/core/tensor_parallel/layers.py:358-362; the same call in the VocabularyParallelism
    fork, sail-sg/VocabularyParallelism@4dca7d20 layers.py:233-234) allocates a zeroed vocab x h
    gradient in the weight's dtype and scatters the tokens' rows into it (pytorch/pytorch@1c94016e
    aten/src/ATen/native/cuda/Embedding.cu embedding_dense_backward_cuda: at::zeros({num_weights,
    ...}) for up to 3072 tokens; @d2999467 EmbeddingBackwardKernel.cu embedding_backward_cuda_kernel
    the same for more): a 16-bit write per element. The learned position table is an nn.Embedding
    too. With gradient accumulation fusion, which covers only the wgrad GEMMs, DDP's hook then adds
    it to the main grad, main_grad.add_(param.grad) (distributed_data_parallel.py:575-579 there):
    read 16-bit and main grad, write main grad; without the fusion that pass is already
    unfused_grad_accumulation_seconds'. The scatter itself moves tokens x h and is not priced. A norm
    after the embedding (states.embedding_params_local counts it; Megatron has no flag for one) writes
    its 16-bit weight gradient too, and the same hook adds it to the main grad."""
    if rank != 0 or job.training.framework is not Framework.MEGATRON:
        return 0.0
    elements = embedding_params_local(job)
    per_element = ACT_BYTES + (ACT_BYTES + 2 * main_grad_bytes(job) if job.training.grad_accumulation_fusion else 0)
    return memory_seconds(job, elements * per_element, cal)


def rank_memory_seconds(job: Job, rank: int, cal: Calibration) -> float:
    """Per micro-batch, the rank's memory-bound kernels outside its layer passes: the main-grad
    accumulation without its fusion, FSDP2's under torch's pipelining, the embedding's dense
    gradient, the fp8 weight casts (counted as elementwise work by stage_time and compute_by_kernel
    alike)."""
    return (unfused_grad_accumulation_seconds(job, rank, cal) + pipelined_grad_accumulation_seconds(job, rank, cal)
            + embedding_grad_seconds(job, rank, cal) + te_weight_cast_seconds(job, rank, cal))


def _sms(job: Job) -> int:
    return K.sm_count(job.cluster.gpu)


# --- tensor parallelism --------------------------------------------------------------------------


@dataclass(frozen=True)
class Exposure:
    """Communication seconds left on the critical path, and compute seconds lost to the SMs that
    overlapped communication holds."""

    exposed: float = 0.0
    contention: float = 0.0

    def __add__(self, other: Exposure) -> Exposure:
        return Exposure(self.exposed + other.exposed, self.contention + other.contention)

    def times(self, n: float) -> Exposure:
        return Exposure(self.exposed * n, self.contention * n)


def _hidden(comm_s: float, compute_s: float, share: float) -> Exposure:
    """A collective running beside a compute kernel of `compute_s` seconds: what outlasts it is
    exposed; while both run, the compute has 1 − share of the SMs."""
    overlap = min(comm_s, compute_s)
    return Exposure(max(0.0, comm_s - compute_s), overlap * share / (1 - share))


def _share(job: Job, where, cal: Calibration, group: str | None = None) -> float:
    """SMs an overlapped NCCL collective takes from the compute beside it, times the fitted
    contention scale (calibration.MECHANISMS), capped at comm.MAX_SM_SHARE. `group` names the
    Megatron communicator ("dp", "tp", "cp", "pp") whose CTA cap (TrainingSpec.nccl_max_ctas) bounds
    the channels, one SM each."""
    share = nccl_sm_share(job.cluster.spec, where, _sms(job))
    caps = job.training.nccl_max_ctas
    cap = getattr(caps, group) if caps is not None and group is not None else None
    if cap is not None and where.n > 1:
        share = min(share, cap / _sms(job))
    return min(MAX_SM_SHARE, share * cal.contention_scale)


def _tp_group(job: Job):
    return placement(job.cluster.spec, job.layout.tp, 1)


def _tp_coll(job: Job, op: Collective, size: float) -> float:
    return collective_time(op, size, _tp_group(job), job.cluster.spec)


def _ring_exchange(job: Job, gemm, rows_total: int, full_s: float, transfer_s: float, cal: Calibration,
                   *, streams: int = 1) -> Exposure:
    """All-gather + GEMM in tp steps (TE ring exchange, torch async TP): step i multiplies the chunk
    it holds (rows/tp) while the next chunk moves over the copy engine (no SMs); the last GEMM has
    nothing to hide. Exposed: whatever the chunked schedule adds to the unchunked GEMM.

    `streams`: compute streams the chunk GEMMs rotate over, each chunk waiting only for its own
    data, so up to that many chunk GEMMs run at once and share the SMs as one GEMM of their rows
    would (a lone chunk of rows/tp leaves SMs idle); after the first, each step then costs that
    GEMM's time over the chunks in it."""
    tp = job.layout.tp
    g = chunk_seconds(gemm, rows_total // tp, job, cal)
    s = max(1, min(streams, tp - 1))
    step = chunk_seconds(gemm, s * (rows_total // tp), job, cal) / s if s > 1 else g
    total = g + (tp - 1) * max(step, transfer_s)
    return Exposure(max(0.0, total - full_s))


def _pipelined_rs(job: Job, gemm, rows_total: int, full_s: float, rs_s: float, cal: Calibration) -> Exposure:
    """GEMM + reduce-scatter in UB_RS_SPLITS chunks (TE pipeline): chunk i+1 computes on the SMs the
    reduce-scatter of chunk i leaves; the last chunk's reduce-scatter is exposed."""
    share = UB_SMS / _sms(job)
    c = UB_RS_SPLITS
    g = chunk_seconds(gemm, rows_total // c, job, cal, sm_share=share)
    piece = rs_s / c
    total = g + (c - 1) * max(g, piece) + piece
    return Exposure(max(0.0, total - full_s), 0.0)


def _ring_exchange_rs(job: Job, gemm, rows_total: int, full_s: float, transfer_s: float, cal: Calibration) -> Exposure:
    """GEMM + reduce-scatter as Transformer Engine's ring exchange (TrainingSpec.ub_ring_exchange_rs;
    TransformerEngine@40c69e75 common/comm_gemm_overlap/comm_gemm_overlap.cpp:1118-1205
    CommOverlapP2PBase::split_overlap_rs): tp chunk GEMMs of rows/tp, rotating over UB_STREAMS
    compute streams on all the SMs, each chunk's partial output sent to the rank that owns it on the
    copy engine beside the next chunk's GEMM (the ring-exchange step of _ring_exchange, the last
    partial's transfer after the last GEMM but one), then reduce_bf16 sums the tp partials on the
    main stream: it reads tp chunks of the 16-bit output and writes one."""
    tp = job.layout.tp
    out = _ring_exchange(job, gemm, rows_total, full_s, transfer_s, cal, streams=UB_STREAMS)
    chunk_bytes = rows_total // tp * gemm.n * ACT_BYTES
    return out + Exposure(memory_seconds(job, (tp + 1) * chunk_bytes, cal, launches=1))


def _row_forward(job: Job, b: Block, rows_total: int, rs_s: float, cal: Calibration) -> Exposure:
    """The forward row GEMM and its reduce-scatter under tp_comm_overlap: TE userbuffers' ring
    exchange where the job names the GEMM (TrainingSpec.ub_ring_exchange_rs), its partials in the
    16-bit output dtype, else the pipelined split."""
    name = {"out_proj": "proj", "mlp_fc2": "fc2"}.get(b.row.name)
    if userbuffers(job) and name in job.training.ub_ring_exchange_rs:
        partial = ub_ring_chunk_seconds(job, rows_total // job.layout.tp * b.row.n * ACT_BYTES)
        return _ring_exchange_rs(job, b.row, rows_total, b.row_fwd, partial, cal)
    return _pipelined_rs(job, b.row, rows_total, b.row_fwd, rs_s, cal)


def column_inputs(job: Job, b: Block) -> int:
    """How many times a block's column input is gathered (and its gradient reduced) per pass: once,
    or once per projection under TrainingSpec.tp_gather_per_projection: q, k and v; a gated MLP's
    gate and up; one for anything else (a plain MLP's fc1, Mamba's in_proj, MLA's latents)."""
    if not (job.training.tp_gather_per_projection and job.training.framework is Framework.TORCHTITAN):
        return 1
    if b.col.name == "qkv" and job.model.mla is None:
        return 3
    if b.col.name in ("mlp_fc1", "shared_fc1") and job.model.mlp.gated:
        return 2
    return 1


def ub_ring_chunk_seconds(job: Job, chunk_bytes: float) -> float:
    """One step of TE's ring exchange: the chunk written to the next tp rank with cudaMemcpyAsync on
    the copy engine, then a one-thread kernel that raises its flag (use_ce, True by default:
    TransformerEngine@40c69e75 transformer_engine/common/comm_gemm_overlap/userbuffers/
    userbuffers.cu:2307-2340 userbuffers_send; pytorch/module/base.py:343; the ring exchange has
    copied on the copy engine since v0.8, pytorch/csrc/comm_gemm_overlap.h:343). Peers are inside one
    NVLink domain (the function asserts INTRANODE); a tp group beyond it keeps NCCL's send/recv."""
    cl = job.cluster.spec
    if job.layout.tp > cl.scaleup_domain_gpus:
        return send_recv_time(chunk_bytes, stride=1, cluster=cl)
    return copy_engine_p2p_time(chunk_bytes, cl, launch_s=K.table_for(job.cluster.gpu).launch_s)


def micro_pipelined_gather(job: Job) -> bool:
    """Whether torch async TP decomposes torchtitan's tp all-gathers (the column inputs forward, the
    row outputs' gradients backward) into a fused all-gather-matmul. Inductor's micro-pipeline pass
    fuses an all-gather only with the matmuls that consume its result directly (mm or _scaled_mm,
    alone or between reshapes: _find_consumer_matmuls, fuse_all_gather_matmul in
    torch/_inductor/fx_passes/micro_pipeline_tp.py, read at pytorch/pytorch@5f65158a and in a 2025
    copy with _scaled_mm, paolodedios/pytorch@050fb4b3). Under rowwise float8 the gathered 16-bit
    tensor feeds the Float8Linear's casts first, so nothing fuses and the gather runs exposed;
    16-bit linears and float8_tp (which gathers the fp8 tensor itself) fuse."""
    return not rowwise_linears(job)


def micro_pipelined_scatter(job: Job, col: Gemm) -> bool:
    """Whether torch async TP fuses the backward reduce-scatter of a column block's input gradient
    with its dgrad. The pass fuses a reduce-scatter only when its input is one matmul's output with
    no other user (fuse_matmul_reduce_scatter, _find_producer_matmul; same sources as
    micro_pipelined_gather). torchtitan's Llama feeds the gathered input to several linears (wq, wk,
    wv; w1, w3: compute.linear_modules), so autograd sums their dgrads before the reduce-scatter
    and the sum is what it scatters: unfused, exposed as under plain TP."""
    return len(linear_modules(job, col)) == 1


def tp_exposure(job: Job, blocks: tuple[Block, ...], *, backward: bool, cal: Calibration, without_row: str = "") -> Exposure:
    """Exposed tensor-parallel communication of one pass of a layer's blocks (Megatron's f/g
    operators, Shoeybi et al. 2019; with sequence parallel an all-gather before the column GEMM and
    a reduce-scatter after the row GEMM, Korthikanti et al. 2022 Sec. 4.2.2).

    Forward: every collective exposed, or chunked with the GEMM under tp_comm_overlap.
    Backward (Transformer Engine and Megatron, and DeepSpeed running Megatron's layers): the
    row GEMM's incoming gradient is all-gathered first (exposed, or ring-exchanged with the dgrad
    under userbuffers); the column GEMM's input is all-gathered beside its dgrad GEMM and its input
    gradient reduce-scattered (all-reduced) beside its wgrad GEMM
    (TransformerEngine@d0067d0d transformer_engine/pytorch/module/linear.py backward; under
    userbuffers as "bulk" overlaps on UB_SMS SMs); exposed where FSDP leaves the hardware queues
    unordered (Job.unordered_queues). torchtitan's DTensor plan runs both backward
    collectives as plain ops, exposed, unless async TP fuses them with a matmul
    (micro_pipelined_gather, micro_pipelined_scatter). A forward pass that stops before the row
    GEMM named `without_row` (pruned_block_output) runs that block's column side only."""
    tp = job.layout.tp
    if tp == 1:
        return Exposure()
    fw = job.training.framework
    overlap = job.training.tp_comm_overlap and job.sp
    share = _share(job, _tp_group(job), cal, "tp")
    t = tokens(job)
    out = Exposure()
    h = job.model.hidden_size

    ub = userbuffers(job)

    def collectives(width: int) -> tuple[float, float, float, float]:
        """(all-gather, reduce-scatter, all-reduce, one ring-exchange chunk) of t x width activations;
        under userbuffers the gathers and ring chunks at ub_gather_bytes, the chunks on the copy engine."""
        size = t * width * ACT_BYTES
        if ub:
            gathered = t * width * ub_gather_bytes(job)
            return (_tp_coll(job, Collective.ALL_GATHER, gathered), _tp_coll(job, Collective.REDUCE_SCATTER, size),
                    _tp_coll(job, Collective.ALL_REDUCE, size), ub_ring_chunk_seconds(job, gathered / tp))
        gathered = t * width * tp_gather_bytes(job)
        send = send_recv_time(gathered / tp, stride=1, cluster=job.cluster.spec)
        return (_tp_coll(job, Collective.ALL_GATHER, gathered), _tp_coll(job, Collective.REDUCE_SCATTER, size),
                _tp_coll(job, Collective.ALL_REDUCE, size), send)

    # the row output's gradient gathered before the row dgrad, where its bytes differ from the
    # column inputs' (NVFP4: both usages)
    grad_gather = (_tp_coll(job, Collective.ALL_GATHER, t * h * tp_grad_gather_bytes(job))
                   if not ub and tp_grad_gather_bytes(job) != tp_gather_bytes(job) else None)
    by_width = {h: collectives(h)}
    for b in blocks:
        # _h: the residual stream the row GEMM reduces and whose gradient the row dgrad gathers;
        # _c: what the column GEMMs gather, and whose gradient they reduce (h, or MLA's latents)
        width = b.gather_width or h
        if width not in by_width:
            by_width[width] = collectives(width)
        (ag_h, rs_h, ar_h, chunk_h), (ag_c, rs_c, ar_c, chunk_c) = by_width[h], by_width[width]
        ag_h = ag_h if grad_gather is None else grad_gather
        n = column_inputs(job, b)
        ag_c, rs_c, ar_c = n * ag_c, n * rs_c, n * ar_c
        if not backward:
            has_row = b.row.name != without_row
            row_fwd = _row_forward(job, b, t, rs_h, cal) if has_row else Exposure()
            if overlap and not ub and not micro_pipelined_gather(job):
                out += Exposure(ag_c) + row_fwd
            elif overlap:
                out += _ring_exchange(job, b.col, t, b.col_fwd, chunk_c, cal, streams=UB_STREAMS if ub else 1) + row_fwd
            else:
                out += Exposure(ag_c + rs_h * has_row) if job.sp else Exposure(ar_h * has_row)
            continue
        if fw is Framework.TORCHTITAN:
            if overlap:  # torch async TP: see micro_pipelined_gather and micro_pipelined_scatter
                row = _ring_exchange(job, b.row, t, b.row_dgrad, chunk_h, cal) if micro_pipelined_gather(job) else Exposure(ag_h)
                col = (_ring_exchange(job, b.col, t, b.col_dgrad, chunk_c, cal) if micro_pipelined_scatter(job, b.col)
                       else Exposure(rs_c))
                out += row + col
            else:
                out += Exposure(ag_h + rs_c) if job.sp else Exposure(ar_c)
            continue
        if overlap:  # TE userbuffers: ring exchange for the row dgrad, bulk AG / RS beside the column GEMMs
            ub_sms = UB_SMS / _sms(job)
            out += _ring_exchange(job, b.row, t, b.row_dgrad, chunk_h, cal, streams=UB_STREAMS)
            out += _hidden(ag_c, b.col_dgrad, ub_sms) + _hidden(rs_c, b.col_wgrad, ub_sms)
        elif job.unordered_queues:  # no ordering: the collectives are not launched ahead of the GEMMs
            out += Exposure(ag_h + ag_c + rs_c) if job.sp else Exposure(ar_c)
        elif job.sp:
            out += Exposure(ag_h) + _hidden(ag_c, b.col_dgrad, share) + _hidden(rs_c, b.col_wgrad, share)
        else:
            out += _hidden(ar_c, b.col_wgrad, share)
    return out


def sac_regather(job: Job, blocks: tuple[Block, ...], cal: Calibration) -> Exposure:
    """The column inputs' all-gathers that torchtitan's per-op selective checkpointing runs again
    in backward. Its policy saves every other matmul, the attention kernel and the reduce-scatter
    outputs, not the all-gathers (pytorch/torchtitan@820504e2 torchtitan/models/llama3/
    parallelize_llama.py:218-227 _save_list, 254-268 _custom_policy), and the block gathers its
    sequence-parallel input once before the column projections (prepare_module_input, lines
    181-193), so the recomputation gathers each block's input again: before the second of q, k, v
    (wk, the 2nd matmul of the layer, recomputed) and before the gate/up pair's second (w3, the 6th).
    Plain DTensor TP runs it exposed, as in the forward; async TP pipelines it with that recomputed
    projection (the micro-pipelining pass matches an all-gather feeding a matmul in either graph),
    which a k projection of a few heads is too small to hide."""
    if not (job.training.framework is Framework.TORCHTITAN and job.layout.tp > 1 and job.sp):
        return Exposure()
    t, h = tokens(job), job.model.hidden_size
    out = Exposure()
    for b in blocks:
        width = b.gather_width or h
        size = t * width * tp_gather_bytes(job)
        gather = column_inputs(job, b) * _tp_coll(job, Collective.ALL_GATHER, size)
        modules = titan_linears(job, b.col)
        if not (job.training.tp_comm_overlap and len(modules) > 1 and micro_pipelined_gather(job)):
            out += Exposure(gather)
            continue
        again = modules[1]
        chunk = send_recv_time(size / job.layout.tp, stride=1, cluster=job.cluster.spec)
        out += _ring_exchange(job, again, t, chunk_seconds(again, t, job, cal), chunk, cal)
    return out


def float8_amax_reductions(job: Job, blocks: tuple[Block, ...]) -> tuple[int, int]:
    """(forward, backward) scalar all-reduces over tp that one layer's float8 casts wait for under
    torchtitan's float8 tensor parallelism (compute.float8_tp). Each tensorwise cast of a DTensor
    takes torch.max(torch.abs(x)) of it (pytorch/ao@62430408 torchao/float8/float8_utils.py:64-65),
    a Partial(max) DTensor that the scale's clamp and division (amax_to_scale, lines 45-48) need
    whole, and the Float8Tensor keeps a DTensor scale (float8_tensor.py:156-163). Forward: each
    block's input (PrepareFloat8ModuleInput, float8_tensor_parallel.py:232-237), each row module's
    input (Float8RowwiseParallel._prepare_input_fn, lines 123-129) and each tp-sharded weight
    (Float8Linear, float8_linear.py:99-114); backward: each module output's gradient
    (NoopFwToFloat8BwDynamic in both parallel styles, float8_tensor_parallel.py:83-87, 146-150).
    The weight's re-cast for the dgrad (float8_linear.py:177-185) repeats the forward's on the same
    tensor, which the compiled joint graph computes once (the fake dependency of lines 162-170
    exists to stop that reuse for axiswise scaling only); run eagerly, it reduces its amax again: one
    more per module in the backward. Each reduction is a latency-bound NCCL
    all-reduce the cast kernel waits for; torchtitan's float8 notes name the same overhead for the
    sharded inputs and weights under TP (pytorch/torchtitan@820504e2 docs/float8.md:48).

    Transformer Engine's current scaling or NVFP4 under Megatron (compute.te_amax_reduced) with sequence
    parallelism: a column-parallel linear's input quantizer and a row-parallel linear's grad_output
    quantizer reduce their amax over the tp group (TransformerEngine@40c69e75
    transformer_engine/pytorch/module/linear.py:1637-1661, layernorm_linear.py:1745-1791,
    layernorm_mlp.py:2102-2154 _customize_quantizers_float8_current_scaling), an all-reduce the
    cast waits for before its scale (csrc/quantizer.cpp:520-527, allreduce(...)->wait()): one per
    block forward (its column input), one per block backward (its row output's gradient). NVFP4's
    quantizers are customised alike (linear.py:1663-1683 _customize_quantizers_nvfp4) and wait for
    the same reduction (quantizer.cpp:1523-1543)."""
    if te_amax_reduced(job) and job.sp and job.layout.tp > 1:
        return len(blocks), len(blocks)
    if not float8_tp(job):
        return 0, 0
    fwd = bwd = 0
    for b in blocks:
        modules = len(linear_modules(job, b.col)) + 1  # the column linears and the row linear
        fwd += 2 + modules
        bwd += modules if job.training.compile else 2 * modules
    return fwd, bwd


def float8_amax_seconds(job: Job, blocks: tuple[Block, ...]) -> tuple[float, float]:
    """(forward, backward) seconds of float8_amax_reductions: each a scalar all-reduce over the tp
    group (latency-bound; priced at 2 bytes), exposed."""
    fwd, bwd = float8_amax_reductions(job, blocks)
    if not fwd + bwd:
        return 0.0, 0.0
    one = _tp_coll(job, Collective.ALL_REDUCE, ACT_BYTES)
    return fwd * one, bwd * one


def te_amax_group(job: Job) -> tuple[int, str | None]:
    """The ranks of TrainingSpec.te_amax_reduction's group and the communication kind its wait is
    booked as: tp; tp x cp, as context-parallel time where cp > 1; every rank of a pipeline stage
    (tp x cp x dp) as data-parallel. No reduction: a group of one, booked nowhere."""
    lay, group = job.layout, job.training.te_amax_reduction
    if group is AmaxGroup.NONE:
        return 1, None
    if group is AmaxGroup.TP:
        return lay.tp, "tp"
    if group is AmaxGroup.TP_CP:
        return lay.tp * lay.cp, "cp" if lay.cp > 1 else "tp"
    return lay.tp * lay.cp * job.dp, "dp"


def te_amax_reduction_seconds(job: Job) -> float:
    """Seconds one micro-batch waits on a pipeline rank for Transformer Engine's delayed-scaling amax
    all-reduces (TrainingSpec.te_amax_reduction, which cites the code): one when each model chunk's
    fp8_autocast region exits after its forward and one after the chunk's backward, 2·vpp per
    micro-batch, each over the named group with the compute stream waiting, so exposed. A chunk's
    message is its modules' fp32 amaxes, 3 per GEMM forward and 2 backward (TransformerEngine@8e5f00f2
    transformer_engine/pytorch/module.py:329-333): 48 bytes for a dense layer's four GEMMs, below the
    smallest size the collective curves resolve (1 KiB inside a scale-up domain, 1 MiB across them), where
    collective_time is its latency (the curve's first point inside a domain, NCCL's tree LL across
    nodes: comm.small_all_reduce_seconds) and the bytes hardly count; priced at one fp32 amax. A
    recomputed forward reduces nothing (module.py:584-586, 649-651 under release_v0.8; not counted).
    From TE 1.9 on the message is every delayed-scaling module the rank has registered with that
    recipe and group, all its chunks (TransformerEngine@d0c452cc fp8.py:204-260, 341-361), 12 bytes a
    GEMM forward and 8 backward: 768 bytes for 16 dense layers, still on the curves' latency."""
    n, _ = te_amax_group(job)
    if n == 1:
        return 0.0
    lay = job.layout
    one = collective_time(Collective.ALL_REDUCE, FP32, placement(job.cluster.spec, n, 1), job.cluster.spec)
    return 2 * lay.vpp * one


def _etp_comm(job: Job) -> float:
    """An MoE layer's routed tokens gathered over etp before the experts and reduce-scattered after.
    None under DeepEP: Megatron's flex dispatcher sends each token to every etp replica of its
    experts inside DeepEP's exchange (deepep.destinations)."""
    if job.etp == 1 or job.training.moe_dispatch is MoEDispatch.DEEPEP:
        return 0.0
    routed = expert_tokens_per_gpu(job) * job.model.hidden_size * ACT_BYTES
    where = placement(job.cluster.spec, job.etp, 1)
    return collective_time(Collective.ALL_GATHER, routed, where, job.cluster.spec) + collective_time(
        Collective.REDUCE_SCATTER, routed, where, job.cluster.spec
    )


# --- context parallelism ---------------------------------------------------------------------------


def _cp_in_domain(job: Job) -> bool:
    return job.layout.tp * job.layout.cp <= job.cluster.spec.scaleup_domain_gpus


def _kv_bytes(job: Job) -> float:
    """Bytes of a rank's local K and V (one ring message).

    The ring moves what the attention op is handed. Transformer Engine takes the grouped K/V and
    reads each group for its query heads inside the kernel; torchtitan's Llama expands K and V to
    every query head (repeat_kv) before F.scaled_dot_product_attention, which torch's context
    parallel then shards and rotates, so each message holds heads/kv_heads times the K/V
    (pytorch/torchtitan@9dec370 torchtitan/models/llama/model.py:201-209;
    activations.Convention.gqa_expands_kv). Under fp8 attention TE's ring sends the quantised K/V, and
    the backward its fp8 dK/dV, one byte per element (TransformerEngine@40c69e75 context_parallel.py:
    1208-1215, 1349, 1920-1981: uint8 data and buffers)."""
    m = job.model
    element = 1 if job.training.fp8_attention else ACT_BYTES
    heads = m.num_attention_heads // job.layout.tp
    if m.mla is not None:
        # MLA: the up-projected keys (d_qk) and values (d_v) of the rank's heads travel, not the latent
        return job.layout.mbs * job.seq_per_rank * heads * (m.head_size + m.v_head_size) * element
    expanded = CONVENTIONS[job.training.framework].gqa_expands_kv
    kv = (heads if expanded else local_kv_heads(job)) * m.head_size
    return 2 * job.layout.mbs * job.seq_per_rank * kv * element


def cp_exposure(job: Job, cal: Calibration) -> tuple[Exposure, Exposure]:
    """(forward, backward) exposed context-parallel communication of one layer.

    Megatron / Transformer Engine p2p (the default cp_comm_type): cp − 1 forward transfers of the
    local K/V, each posted before the current step's kernel and hidden behind it; backward cp
    exchanges, K/V and the accumulated dK/dV (twice the bytes) after the first, each hidden behind
    that step's backward kernel (TransformerEngine@40c69e75 context_parallel.py
    AttnFuncWithCPAndKVP2P). torch's context parallel (torchtitan, rotate method allgather, the
    default of torchtitan@9dec370 torchtitan/config_manager.py:364-377): one all-gather of K/V,
    waited for before the second step, so hidden only behind the first step's kernel; backward
    all-gathers K/V again the same way and sends the accumulated dK/dV, in fp32 (twice the bf16
    bytes), to the next rank after every step with a permute (all-to-all); each is waited for after
    the next step's kernel, and the last, sent after the last step, once the loop is over with no
    kernel left to hide it (pytorch/pytorch torch/distributed/tensor/experimental/_attention.py
    _templated_ring_attention_backward: kv_rotater, dkv_rotater ALL_TO_ALL, accum_dtype float32,
    the dkv_rotater.next_buffer() after the loop, read at 0123248a; a late-2024 copy of the file,
    of the torch nightlies torchtitan's December 2024 benchmarks ran, has the same loop)."""
    cp = job.layout.cp
    if cp == 1:
        return Exposure(), Exposure()
    cl = job.cluster.spec
    stride = job.layout.tp if _cp_in_domain(job) else cl.scaleup_domain_gpus
    group = placement(cl, cp, job.layout.tp)
    share = _share(job, group, cal, "cp")
    att = attention_kernels(job, cal)
    kv = _kv_bytes(job)
    hop = send_recv_time(kv, stride=stride, cluster=cl)
    if job.training.framework is Framework.TORCHTITAN:
        gather = collective_time(Collective.ALL_GATHER, kv * cp, group, cl)
        fwd = _hidden(gather, att.first_fwd, share)
        dkv = send_recv_time(2 * kv, stride=stride, cluster=cl)
        bwd = _hidden(gather, att.first_bwd, share) + _hidden(dkv, att.step_bwd, share).times(cp - 1) + Exposure(dkv)
        return fwd, bwd
    fwd = _hidden(hop, att.first_fwd, share) + _hidden(hop, att.step_fwd, share).times(cp - 2)
    both = send_recv_time(2 * kv, stride=stride, cluster=cl)
    bwd = _hidden(hop, att.first_bwd, share) + _hidden(both, att.step_bwd, share).times(max(0, cp - 2)) + _hidden(hop, att.step_bwd, share)
    return fwd, bwd


def mamba_cp_seconds(job: Job) -> float:
    """One forward of a Mamba-2 layer's context-parallel all-to-alls: z, x, B, C and dt before the
    conv and scan, y after them, six all_to_all_single calls over the cp group, each the rank's
    whole [seq/cp, b, width] buffer of 16-bit activations (mamba_shard.all_to_all_widths).
    Megatron issues them on the compute stream and waits (Megatron-LM@d98e8a64
    tensor_parallel/mappings.py L424-467 _AllToAll.forward: all_to_all_single without async_op,
    called from mamba_context_parallel.py L162-211 between in_proj, the scan and the norm), so
    they are exposed; each one's backward is the reverse all-to-all of the same bytes (L469-483)."""
    mb, lay, cl = job.model.mamba, job.layout, job.cluster.spec
    widths = all_to_all_widths(mb, tp=lay.tp, cp=lay.cp) if mb is not None else {}
    group = placement(cl, lay.cp, lay.tp)
    t = tokens(job)
    return sum(collective_time(Collective.ALL_TO_ALL, t * w * ACT_BYTES, group, cl) for w in widths.values())


# --- expert parallelism ----------------------------------------------------------------------------


def _ep_comm(job: Job) -> float:
    """One pass of an MoE layer's token exchange: dispatch and combine all-to-alls, each moving the
    rank's routed token copies (t/tp x top_k, times the load factor on the busiest rank) of width h
    (Megatron MoEAlltoAllTokenDispatcher; torchtitan ExpertParallel)."""
    lay, cl = job.layout, job.cluster.spec
    if lay.ep == 1:
        return 0.0
    assert job.model.moe is not None
    size = local_tokens(job) * job.model.moe.top_k * job.model.hidden_size * ACT_BYTES
    size *= job.training.moe_load_factor
    return 2 * collective_time(Collective.ALL_TO_ALL, size, placement(cl, lay.ep, job.etp), cl)


def ep_exposure(job: Job, passes: int, compute_s: float, cal: Calibration) -> Exposure:
    """The all-to-alls of `passes` passes of an MoE layer. Plain dispatchers run them on the compute
    stream (exposed). Megatron's --overlap-moe-expert-parallel-comm pairs micro-batch k+1's forward
    with k's backward layer by layer, so each all-to-all runs beside the other micro-batch's
    attention and expert GEMMs (combined_1f1b.py; model_chunk_schedule_plan.py). DeepEP's kernels
    run on the compute stream too: Megatron's flex dispatcher waits on their event before the experts
    (token_dispatcher.py:1948 token_dispatch, fused_a2a.py:129-131 after_event_overlap.current_stream_wait),
    torchtitan's dispatch op likewise (v0.2.2 deepep.py:113) and its combine before the layer's output
    is used (sync_combine); priced by deepep.pass_seconds."""
    if job.training.moe_dispatch is MoEDispatch.DEEPEP:
        return Exposure(passes * deepep.pass_seconds(job))
    a2a = passes * _ep_comm(job)
    if job.training.moe_dispatch is MoEDispatch.OVERLAP_1F1B and a2a:
        where = placement(job.cluster.spec, job.layout.ep, job.etp)
        return _hidden(a2a, compute_s, _share(job, where, cal))
    return Exposure(a2a)


# --- one layer pass --------------------------------------------------------------------------------


def recompute_kernels(job: Job, kind: LayerKind, lt: LayerTime, mode: Recompute, cal: Calibration) -> tuple[float, float, float]:
    """(GEMM, token-mixer, memory-bound) seconds of one layer's recomputed forward, whose sum is
    layer_pass's `recompute`: the recomputed share of the forward GEMMs (their fp8 casts counted as
    memory-bound) and of the mixer kernels; the whole forward's elementwise ops and casts too where
    reruns_forward_elementwise says so; less the block-output GEMM a compiled recomputation leaves
    out (pruned_block_output)."""
    return _recomputed(job, kind, lt, mode, pruned_block_output(job, kind, mode, cal))


def _recomputed(job: Job, kind: LayerKind, lt: LayerTime, mode: Recompute, pruned: Block | None) -> tuple[float, float, float]:
    """recompute_kernels with the layer's pruned_block_output given."""
    share_gemm, share_attn = recomputed_share(job, mode, kind)
    memory = lt.elementwise + lt.fp8_cast if reruns_forward_elementwise(job, mode) else share_gemm * lt.fp8_cast
    return share_gemm * lt.gemm - (pruned.row_fwd if pruned else 0.0), share_attn * lt.attention, memory


def reruns_forward_elementwise(job: Job, mode: Recompute) -> bool:
    """Whether the recomputation runs every memory-bound op of the layer's forward again: under full
    recompute, and under eager torchtitan's per-op selective checkpointing, which re-runs the block's
    forward, handing back the saved outputs (matmuls, attention) from its cache while every op its
    policy leaves to PREFER_RECOMPUTE, the norms, rope, activation and fp8 casts among them, runs
    again (torch.utils.checkpoint _CachingTorchDispatchMode / _CachedTorchDispatchMode; the policy
    pytorch/torchtitan@b5bcd76c torchtitan/distributed/activation_checkpoint.py L243-276, with no
    early stop, L285). Compiled, the partitioner recomputes only what the backward reads, fused into
    the backward's kernels, as it may without checkpointing: no forward kernel runs again as such."""
    if mode is Recompute.FULL:
        return True
    tr = job.training
    return mode is Recompute.SELECTIVE and tr.framework is Framework.TORCHTITAN and not tr.compile


def pruned_block_output(job: Job, kind: LayerKind, mode: Recompute, cal: Calibration,
                        blocks: tuple[Block, ...] | None = None) -> Block | None:
    """The MLP block whose row GEMM (fc2) a full recomputation inside a torch.compile graph does not
    run again, or None. Under torch.compile the checkpointed block is traced into the joint graph with
    every node tagged for recomputation (TagActivationCheckpoint.tag_nodes, pytorch/pytorch@0109d12a
    torch/_higher_order_ops/wrap.py:47-55; PREFER_RECOMPUTE in later versions), and the partitioner
    extracts the backward graph from the saved values to the gradients, keeping only the nodes on
    that path and dropping the rest as dead code (pytorch/pytorch@00c07b93
    torch/_functorch/partitioners.py:62-112 _extract_graph_with_inputs_outputs, called by
    _extract_fwd_bwd_modules; the output of a block that feeds the next checkpointed block is saved,
    cleanup_recompute_tags). No gradient needs fc2's output: its own backward reads its input and
    weight, the residual add's passes the gradient through. So fc2's forward GEMM, and its row
    collective under tp, drop out of the recomputation; every GEMM before it feeds a value some
    gradient reads (out_proj's output is the second norm's input). Eager checkpointing re-runs the
    module up to its last op that saves a tensor, fc2 itself (torch/utils/checkpoint.py, non-reentrant
    early stop). The checkpoint sits inside the compiled region in both frameworks: KempnerForge wraps
    the blocks, then compiles the whole model (KempnerInstitute/KempnerForge@01b461a
    kempnerforge/distributed/parallel.py:196-216); torchtitan wraps each block, then compiles it
    ("per-TransformerBlock compile after AC wrapping", pytorch/torchtitan@820504e2
    torchtitan/models/llama3/parallelize_llama.py:76-80, @9dec370 torchtitan/parallelisms/
    parallelize_llama.py:68-77). Dense MLP layers only. `blocks`: the layer's tp_blocks where the
    caller has them."""
    tr = job.training
    if not (mode is Recompute.FULL and tr.compile and tr.framework is Framework.TORCHTITAN and kind.mlp and not kind.moe):
        return None
    return next((b for b in (tp_blocks(job, kind, cal=cal) if blocks is None else blocks) if b.row.name == "mlp_fc2"), None)


def layer_pass(job: Job, kind: LayerKind, *, mode: Recompute, cal: Calibration) -> LayerPass:
    return layer_passes(job, kind, modes=(mode,), cal=cal)[0]


def layer_passes(job: Job, kind: LayerKind, *, modes: Iterable[Recompute], cal: Calibration) -> list[LayerPass]:
    """layer_pass under each recompute mode of `modes`: the layer's kernels, its forward and backward
    tp exposure and its cp exposure do not depend on the mode, so they are priced once."""
    lt = layer_time(job, kind, cal=cal)
    blocks = tp_blocks(job, kind, cal=cal)
    forward = tp_exposure(job, blocks, backward=False, cal=cal)
    backward = tp_exposure(job, blocks, backward=True, cal=cal)
    amax_f, amax_b = float8_amax_seconds(job, blocks)
    etp_comm = _etp_comm(job) if kind.moe else 0.0
    cp_f, cp_b = cp_exposure(job, cal) if kind.mixer is MixerKind.ATTENTION else (Exposure(), Exposure())
    if kind.mixer is MixerKind.MAMBA and job.layout.cp > 1:
        a2a = mamba_cp_seconds(job)
        cp_f, cp_b = Exposure(a2a), Exposure(a2a)
    out = []
    for mode in modes:
        flops = layer_flops(job, kind, mode=mode)
        pruned = pruned_block_output(job, kind, mode, cal, blocks)
        recompute = sum(_recomputed(job, kind, lt, mode, pruned))
        # passes that run the layer's forward collectives: forward, and forward again under full
        # recompute (selective recompute repeats local work only)
        fwd_passes = 2 if mode is Recompute.FULL else 1
        # the recomputed forward: the forward's collectives again, less fc2's where it is pruned
        again = Exposure()
        if mode is Recompute.FULL:
            again = forward if pruned is None else tp_exposure(job, blocks, backward=False, cal=cal, without_row=pruned.row.name)
        tp = forward + again + backward
        tp += Exposure(amax_f * fwd_passes + amax_b)
        pruned_flop = pruned.row.flop if pruned is not None else 0.0
        if mode is Recompute.SELECTIVE:
            tp += sac_regather(job, blocks, cal)
        etp = etp_comm * (fwd_passes + 1) if kind.moe else 0.0
        cp = cp_f.times(fwd_passes) + cp_b
        # TrainingSpec.sac_recomputes_all_to_all: the recomputed forward runs the all-to-alls again
        ep_passes = fwd_passes + 1 + (mode is Recompute.SELECTIVE and job.training.sac_recomputes_all_to_all)
        ep = ep_exposure(job, ep_passes, lt.gemm + lt.gemm_backward + lt.attention + lt.attention_backward, cal) if kind.moe else Exposure()
        compute = Breakdown.of(
            "s",
            gemm=lt.gemm + lt.gemm_backward,
            attention=lt.attention + lt.attention_backward,
            elementwise=lt.elementwise + lt.elementwise_backward + lt.fp8_cast + lt.fp8_cast_backward,
            recompute=recompute,
            contention=tp.contention + cp.contention + ep.contention,
        )
        comm = Breakdown.of("s", tp=tp.exposed + etp, cp=cp.exposed, ep=ep.exposed)
        out.append(LayerPass(compute=compute, forward_s=lt.total, comm=comm, flop=flops.total - pruned_flop,
                             recompute_flop=flops.recompute - pruned_flop))
    return out


# --- data parallelism ------------------------------------------------------------------------------


def fsdp_managed(job: Job) -> bool:
    """Parameters FSDP shards and gathers layer by layer: zero 3, and zero 2 under FSDP2 (torchtitan's
    fully_shard with reshard_after_forward=False, which its launch file writes as
    fsdp_reshard_after_forward = "never"; FSDP1's SHARD_GRAD_OP is the same: unshard before the
    forward, reshard after the backward). Zero 2 elsewhere keeps whole parameters and reduces
    gradients in buckets (dp_tail)."""
    return job.zero is Zero.PARAMETERS or (job.zero is Zero.GRADIENTS and job.training.framework is Framework.TORCHTITAN)


def _reshards_after_forward(job: Job) -> bool:
    """FSDP's reshard_after_forward: never under zero 2; under zero 3
    TrainingSpec.fsdp_reshard_after_forward, by default the framework's: torchtitan only without a
    pipeline; DeepSpeed ZeRO-3 always."""
    tr = job.training
    if job.zero is not Zero.PARAMETERS:
        return False
    if tr.fsdp_reshard_after_forward is not None:
        return tr.fsdp_reshard_after_forward
    return job.layout.pp == 1 or tr.framework is Framework.DEEPSPEED


def fsdp_per_microbatch(job: Job) -> bool:
    """Parameters gathered around every micro-batch (fsdp_managed): where FSDP reshards after
    forward (torchtitan without a pipeline, KempnerForge with one too), and where it reshards only
    after the backward, which it does after every micro-batch's backward, reduce-scattering its
    gradients too: reshard_after_backward and reduce_grads are on by default (torch 2.13.0, git
    cf30153c: torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py:216, 223 and post_backward,
    588-640), and torchtitan turns neither off for gradient accumulation, only for its chunked loss's
    output layer (pytorch/torchtitan@b5bcd76c6 torchtitan/components/loss.py:664-705). Torch's
    pipelining turns both off until the last micro-batch (_pipelined_fsdp)."""
    return fsdp_managed(job) and (_reshards_after_forward(job) or not torch_pipelining(job))


def fsdp_gathers(job: Job) -> tuple[float, float]:
    """(forward, backward) parameter gathers of a layer per micro-batch where FSDP gathers around
    every micro-batch outside torch's pipelining: the backward's only where it resharded after the
    forward (_reshards_after_forward)."""
    return 1.0, 1.0 if _reshards_after_forward(job) else 0.0


def _pipelined_fsdp(job: Job) -> bool:
    """FSDP2 under torch.distributed.pipelining: the stage turns gradient sync and resharding after
    backward off for every micro-batch's backward and reduce-scatters all its layers at once after
    the last one (torch 2.13.0, git cf30153c: torch/distributed/pipelining/stage.py:843-847
    backward_maybe_with_nosync, 1164-1191 perform_reduce_grad; schedules.py:1177, Schedule1F1B calls
    it after its cool-down, 960 likewise for GPipe). Nothing of that stage computes beside it."""
    return fsdp_managed(job) and torch_pipelining(job)


def pipelined_gathers(job: Job, rank: int) -> tuple[float, float]:
    """(forward, backward) parameter gathers per micro-batch on pipeline rank `rank` when FSDP2
    reshards after forward under torch's pipelining (resharding after backward is off there,
    _pipelined_fsdp): a forward finds the parameters gathered if a backward ran just before it, and
    a backward finds them freed if a forward did. 1F1B runs w = min(m, pp − r) forwards before rank
    r's first backward, then alternates, and ends with pp − r − 1 backwards in a row: w forward and
    m + 1 − w backward gathers per step. GPipe runs every forward, then every backward: m and 1.
    Either way m + 1 gathers per step instead of 2m."""
    m = job.num_microbatches
    if job.schedule is Schedule.GPIPE:
        return 1.0, 1 / m
    warm = min(m, job.layout.pp - rank)
    return warm / m, (m + 1 - warm) / m


def _rank_groups(job: Job, rank: int) -> tuple[tuple[float, Placement], tuple[float, Placement]]:
    """Pipeline rank `rank`'s dense and expert parameters, each with the group it shards or reduces
    them over."""
    p = rank_params(job, rank)
    return (dense_params(p), _dense_group(job)), (p.value("experts"), _expert_group(job))


def stage_gather_seconds(job: Job, rank: int) -> float:
    """The all-gather of every 16-bit parameter of pipeline rank `rank` over its shard groups, as
    FSDP2 runs it once a step where it keeps the stage gathered under torch's pipelining (dp_tail)."""
    return sum(collective_time(Collective.ALL_GATHER, params * ACT_BYTES, where, job.cluster.spec)
               for params, where in _rank_groups(job, rank) if params and where.n > 1)


def _dense_group(job: Job):
    return placement(job.cluster.spec, job.dense_shard_group, job.layout.tp)


def _expert_group(job: Job):
    return placement(job.cluster.spec, job.expert_shard_group, job.etp * job.layout.ep)


def fsdp_layer_comm(job: Job, layer_id: int) -> tuple[float, float]:
    key = ("fsdp_layer_comm", job.model.layer_kind(layer_id))
    if key not in job.memo:
        job.memo[key] = _fsdp_layer_comm(job, layer_id)
    return job.memo[key]


def _fsdp_layer_comm(job: Job, layer_id: int) -> tuple[float, float]:
    """(all-gather, reduce-scatter) seconds of one layer's parameters over the shard groups.

    DeepSpeed ZeRO-3 gathers over all dp ranks as one flat group, each rank's NIC carrying the
    whole buffer: MiCS (Zhang et al. 2022, VLDB, Sec. 2-3) and ZeRO++ (Wang et al. 2023, Sec. 1)
    measure ZeRO-3's cross-node gathers at about one NIC's bandwidth, which is what they fix; the
    ZeRO-3 rows of Narayanan et al. 2021 Table 2 imply the same (~23 GB/s per A100 on 200 Gb/s HDR).
    """
    cl = job.cluster.spec
    flat = job.training.framework is Framework.DEEPSPEED
    p = local_layer_params(job, layer_id)
    gather = collective_time(Collective.ALL_GATHER, p.dense * ACT_BYTES, _dense_group(job), cl, flat=flat)
    reduce = collective_time(Collective.REDUCE_SCATTER, p.dense * _grad_bytes(job), _dense_group(job), cl, flat=flat)
    if p.expert:
        gather += collective_time(Collective.ALL_GATHER, p.expert * ACT_BYTES, _expert_group(job), cl, flat=flat)
        reduce += collective_time(Collective.REDUCE_SCATTER, p.expert * _grad_bytes(job), _expert_group(job), cl, flat=flat)
    return gather, reduce


def fsdp_copy_seconds(job: Job, layer_id: int, cal: Calibration, rank: int = 0) -> float:
    """FSDP2's copies around one layer's collectives for one micro-batch (torch
    _fully_shard/_fsdp_collectives.py: foreach_all_gather_copy_out splits the flat all-gather output
    into the unsharded parameters, 2 + 2 bytes per parameter, after the forward and the backward
    gather; foreach_reduce copies the unsharded 16-bit gradients into the flat fp32 reduce-scatter
    input, 2 + 4 bytes). Before each gather _get_param_all_gather_inputs casts the fp32 shard into a
    flat 16-bit buffer with one foreach copy (4 + 2 bytes per shard element) and all_gather_copy_in_cuda
    copies that into the all-gather input (2 + 2): 10/n bytes per parameter for a shard group of n
    (torch 2.13.0, git cf30153c, _fsdp_collectives.py:263-276, 336-362, 381-425). That copy-in runs on
    FSDP2's copy-in stream, but beside GEMMs that fill every SM it takes GPU time of its own: on an
    H200 the whole 1.7B GPT plan's kernels add up to 205.9 ms a step against 204.2 ms of their union
    (benchmarks/data/measured/h200-validate-trace-summary-2026-11-27c.json and the run's split), and
    its casts and copies (777 bf16 copy kernels, 6.7 ms, and about half the 802 device copies, 7.4 ms)
    match these bytes. They are priced on a shard group of one too, as the memory model counts FSDP's
    gathered buffers there: KempnerForge keeps a dp_shard dimension of size 1 in its mesh whenever tp or
    ep is on (KempnerForge@5666d0d kempnerforge/distributed/setup.py), and validate's worker wraps a
    one-rank mesh, and torchtitan calls fully_shard at every shard degree from pytorch/torchtitan@d92336fe
    (0.3.0rc1), for its MixedPrecisionPolicy; 0.2 does not there, and a 0.2 launch refuses such layouts
    (planner.launch.options.titan02_keeps_mixed_precision). Under torch's pipelining (_pipelined_fsdp) pipeline rank `rank` gathers
    as pipelined_gathers has it, and the one reduce-scatter of the step copies the accumulated
    gradient, already in the reduce dtype (pipelined_grad_accumulation_seconds): 4 + 4 bytes once
    per step, 1/m of it per micro-batch. torchtitan only; DeepSpeed and FSDP1 gather into flat
    buffers the parameters view: FSDP1 (TrainingSpec.fsdp_flat_params) pays fsdp1_bytes_per_param
    instead."""
    if job.training.framework is not Framework.TORCHTITAN:
        return 0.0
    p = local_layer_params(job, layer_id)
    params = p.dense + p.expert
    gathers = sum(fsdp_gathers(job))
    if job.training.fsdp_flat_params:
        return memory_seconds(job, params * fsdp1_bytes_per_param(job), cal, launches=3 + gathers)
    reduces, reduce_bytes = 1.0, ACT_BYTES + _grad_bytes(job)
    if _pipelined_fsdp(job):
        gathers = sum(pipelined_gathers(job, rank))
        reduces, reduce_bytes = 1 / job.num_microbatches, 2 * _grad_bytes(job)
    # the shard's cast and its copy into the all-gather input: 10 bytes per shard element, over the
    # dense shard group for dense parameters and the expert one for experts
    shard_elements = p.dense / job.dense_shard_group + p.expert / job.expert_shard_group
    copy_in_bytes = gathers * (FP32 + ACT_BYTES + 2 * ACT_BYTES) * shard_elements
    # per gather three kernels (the cast's foreach copy, the copy into the all-gather input, the
    # copy-out), per reduce-scatter one (the copy-in of the gradients)
    return memory_seconds(job, params * (gathers * (2 + 2) + reduces * reduce_bytes) + copy_in_bytes, cal,
                          launches=reduces + 3 * gathers)


def fsdp1_bytes_per_param(job: Job) -> float:
    """Bytes FSDP1 moves per unsharded parameter and micro-batch outside its collectives (see
    TrainingSpec.fsdp_flat_params): the fp32 shard cast to 16 bits before the forward and the
    backward gather, 2·(4 + 2)/n; the 16-bit gradient cast to an fp32 reduce dtype, 2 + 4 (nothing
    when it reduces in bf16); the predivision of the unsharded gradient in place, 2·g; the
    postdivision of the shard, 2·g/n; n the shard group, g the reduce dtype's bytes."""
    n, g = job.dense_shard_group, _grad_bytes(job)
    cast = ACT_BYTES + g if g != ACT_BYTES else 0
    return sum(fsdp_gathers(job)) * (FP32 + ACT_BYTES) / n + cast + 2 * g + 2 * g / n


def _gather_bytes(job: Job) -> int:
    """Bytes per parameter the distributed optimizer all-gathers: 1 under --fp8-param-gather (the
    parameter buffer is uint8, Megatron-LM@d98e8a64 megatron/core/distributed/
    param_and_grad_buffer.py:919-924), else the 16-bit weights."""
    return 1 if job.training.fp8_param_gather else ACT_BYTES


def megatron_bucket_size(job: Job) -> int:
    """Parameters per gradient bucket of Megatron's DDP buffer: --ddp-bucket-size, else
    max(40M, 1M x dp·cp) (MIN_DDP_BUCKET_PARAMS)."""
    if job.training.ddp_bucket_size is not None:
        return job.training.ddp_bucket_size
    return max(MIN_DDP_BUCKET_PARAMS, BUCKET_PARAMS_PER_DP_RANK * job.dp * job.layout.cp)


def _norm_tensors(m: ModelSpec) -> tuple[int, ...]:
    """The tensors of one hidden-size norm: a weight, and a bias for LayerNorm."""
    h = m.hidden_size
    return (h, h) if norm_params(m, h) == 2 * h else (h,)


def megatron_layer_tensors(job: Job, layer_id: int) -> tuple[int, ...]:
    """Parameter tensors of a decoder layer's dense buffer on one rank, in module order, as
    Megatron's Transformer Engine layer spec builds an attention layer with a dense MLP: linear_qkv
    and linear_fc1 are TELayerNormColumnParallelLinear, each holding the norm before it
    (layer_norm_weight, and layer_norm_bias for LayerNorm) beside its weight (and bias), linear_proj
    and linear_fc2 TERowParallelLinear, weight (and bias) (Megatron-LM@d98e8a64
    megatron/core/models/gpt/gpt_layer_specs.py:318-346, 531-546). A Llama layer has six: four
    matrices and two RMSNorm weights. Other layer kinds (MoE, Mamba, MLA, qk-norm) count as one
    tensor of the layer's parameters: their buckets close at layer boundaries."""
    m, tp = job.model, job.layout.tp
    kind = m.layer_kind(layer_id)
    dense = local_layer_params(job, layer_id).dense
    plain = (kind.mixer is MixerKind.ATTENTION and kind.mlp and not kind.moe and m.mla is None and not m.qk_norm
             and not m.sandwich_norms and not m.attention_sinks)
    if not plain:
        return (dense,)
    h = m.hidden_size
    norm = _norm_tensors(m)
    qkv = m.q_width // tp + 2 * local_kv_heads(job) * m.head_size
    f = m.ffn_hidden_size // tp
    up = (2 if m.mlp.gated else 1) * f
    # the attention registers linear_proj before linear_qkv (transformer/attention.py:413, 1692)
    tensors = (m.q_width // tp * h, *((h,) if m.out_bias else ()), *norm, qkv * h, *((qkv,) if m.qkv_bias else ()),
               *norm, up * h, *((up,) if m.mlp_bias else ()), f * h, *((h,) if m.mlp_bias else ()))
    return tensors if sum(tensors) == dense else (dense,)


def _chunk_tensors(job: Job, rank: int, chunk: int, kind: str) -> list[int]:
    """Parameter tensors of one model chunk's dense (or expert) buffer, in registration order: the
    word and position embeddings in the first chunk of the first rank, the layers, the final norm
    and output layer in the last chunk of the last rank (with whatever else the rank holds there)."""
    layers = job.stage_chunks[rank][chunk]
    if kind == "experts":
        return [e for i in layers if (e := local_layer_params(job, i).expert)]
    out: list[int] = []
    if rank == 0 and chunk == 0:
        p = rank_params(job, 0)
        emb = int(p.value("embedding"))
        word = min(emb, local_vocab(job) * job.model.hidden_size)
        out += [word] + ([emb - word] if emb > word else [])
    for i in layers:
        out += megatron_layer_tensors(job, i)
    if rank == job.layout.pp - 1 and chunk == job.layout.vpp - 1:
        p = rank_params(job, rank)
        head = int(p.value("head"))
        # megatron_layer_tensors splits each layer's dense parameters without losing any
        layers = sum(local_layer_params(job, i).dense for i in job.stage_layer_ids(rank))
        rest = dense_params(p) - int(p.value("embedding")) - head - layers
        norm = _norm_tensors(job.model)
        out += [t for t in (rest, *norm, head - sum(norm)) if t > 0]
    return out


def megatron_buckets(job: Job, rank: int, kind: str = "dense") -> tuple[tuple[int, ...], ...]:
    """Parameters per gradient bucket of each model chunk of a pipeline rank, [chunk][bucket], each
    chunk's buckets in the order the backward fills them. Megatron walks a buffer's parameters in
    reverse registration order and closes a bucket at the first parameter that brings it to the
    bucket size (Megatron-LM@d98e8a64 megatron/core/distributed/param_and_grad_buffer.py:954-1000),
    so the last bucket holds the first layers and the embedding. Bucketing is off, one bucket per
    chunk, on every pipeline rank but the first and on every model chunk but the first
    (distributed_data_parallel.py:160-171; training.py:2505-2514), and without --overlap-grad-reduce
    (training.py:2192-2193)."""
    key = ("megatron_buckets", rank, kind)
    if key in job.memo:
        return job.memo[key]
    if job.training.apex_distributed_adam:
        job.memo[key] = apex_layer_buckets(job, rank, kind)
        return job.memo[key]
    size = megatron_bucket_size(job)
    chunks = []
    for v in range(job.layout.vpp):
        tensors = _chunk_tensors(job, rank, v, kind)
        if not tensors:
            chunks.append(())
            continue
        if rank > 0 or v > 0 or not job.training.overlap_grad_reduce:
            chunks.append((sum(tensors),))
            continue
        buckets, filled = [], 0
        for t in reversed(tensors):
            filled += t
            if filled >= size:
                buckets.append(filled)
                filled = 0
        if filled:
            buckets.append(filled)
        chunks.append(tuple(buckets))
    job.memo[key] = tuple(chunks)
    return job.memo[key]


def apex_layer_buckets(job: Job, rank: int, kind: str = "dense") -> tuple[tuple[int, ...], ...]:
    """megatron_buckets under NeMo's Apex DistributedFusedAdam (TrainingSpec.apex_distributed_adam):
    one bucket per transformer layer on every pipeline rank and model chunk, each chunk's in backward
    order, the rank's parameters outside its layers (embeddings, final norm, output layer) in the
    last bucket of the first chunk, the first forward layer's (NeMo megatron_gpt_model.py:547-580)."""
    chunks: list[list[int]] = []
    outside = 0
    for v in range(job.layout.vpp):
        layers = job.stage_chunks[rank][v]
        per_layer = [sum(megatron_layer_tensors(job, i)) if kind == "dense" else local_layer_params(job, i).expert
                     for i in reversed(layers)]
        outside += sum(_chunk_tensors(job, rank, v, kind)) - sum(per_layer)
        chunks.append([b for b in per_layer if b])
    first = next((c for c in chunks if c), None)
    if first is not None:
        first[-1] += outside
    elif outside:
        chunks[0].append(outside)
    return tuple(tuple(c) for c in chunks)


def _first_forward_bucket(chunks: tuple[tuple[int, ...], ...]) -> int:
    """The bucket the first forward module waits for: the first chunk's last bucket in backward order."""
    return next((c[-1] for c in chunks if c), 0)


def apex_bucket_elements(job: Job, n: int) -> int:
    """Elements of every bucket of Apex DistributedFusedAdam over a data-parallel group of n ranks:
    bucket_cap_mb MiB of the gradient sync dtype, cut into n shards rounded down to the 128-byte
    alignment (at least one alignment), times n (NVIDIA/apex@d571f3ee apex/contrib/optimizers/
    distributed_fused_adam.py:518-525). Each layer NeMo hands over starts a bucket of its own and
    fills as many of these as it needs (init_params_bucket marks the buckets before it full,
    :897-899; _init_param_state opens a bucket of this size whenever the last is full, :985-1000),
    and each bucket's gradients sit in a buffer of the whole bucket's size (:1115-1121), which the
    reduce-scatter reduces whole (:1353-1362), the last bucket of a layer too, however little of it
    the layer fills."""
    grad = _grad_bytes(job)
    align = 128 // grad
    shard = int(job.training.apex_bucket_cap_mb * MiB / grad / n) // align * align
    return max(shard, align) * n


def bucket_collective_seconds(job: Job, op: Collective, params: int, bytes_per_param: int, where: Placement,
                              fp32: int = 0) -> float:
    """One gradient bucket's collective (reduce-scatter or all-reduce of its gradients, all-gather of
    its parameters), `fp32` of its `params` gradients reduced in fp32 (apex_fp32_grad_params).
    Megatron's DDP: one collective of the bucket's bytes. Apex DistributedFusedAdam (megatron_buckets
    holds one group per layer there): the layer's parameters fill ceil(params / E) buckets of E
    elements (apex_bucket_elements), the fp32 ones buckets of their own (Apex's successors match a
    bucket's dtypes before filling it: NVIDIA/apex@6424da3b apex/contrib/optimizers/
    distributed_fused_adam.py:1391-1404 last_bucket_id), each communicated whole, and the optimizer
    issues the group's collectives in one coalescing group (apex@d571f3ee :1353-1362, 1508-1515),
    priced here as one collective of all its buckets' bytes: NCCL spreads the bytes of a group's
    collectives over its channels (NVIDIA/nccl v2.21.5-1 src/enqueue.cc:830-845 scheduleCollTasksToPlan:
    each channel takes maxBytesPerChannel, the group's total over the usable channels; v2.18.5-1 src/enqueue.cc:483-580 gives each collective
    of 100 MiB ceil(100 MiB / 32 MiB) channels of its own, so there the group costs at least this)."""
    return collective_time(op, bucket_message_bytes(job, params, bytes_per_param, where.n, fp32), where, job.cluster.spec)


def bucket_message_bytes(job: Job, params: int, bytes_per_param: int, n: int, fp32: int = 0) -> int:
    """Bytes one gradient bucket's collective over n ranks moves (bucket_collective_seconds): its
    parameters' bytes under Megatron's DDP; under Apex DistributedFusedAdam whole buckets of
    apex_bucket_elements, the fp32 gradients in buckets of their own."""
    rest = params - fp32
    if not job.training.apex_distributed_adam:
        return rest * bytes_per_param + fp32 * FP32
    e = apex_bucket_elements(job, n)
    return sum(-(-count // e) * e * size for count, size in ((rest, bytes_per_param), (fp32, FP32)) if count > 0)


def hidden_param_gather(job: Job, rank: int) -> float:
    """Seconds of the distributed optimizer's parameter all-gather that run beside the next step's
    first forward: with --overlap-param-gather each bucket's gather is waited on by a forward
    pre-hook of the first module using it, which then dispatches the next bucket's
    (Megatron-LM@d98e8a64 megatron/core/distributed/distributed_data_parallel.py:517-551,
    param_and_grad_buffer.py:538-573), so every bucket but the first gathers while the layers of
    the bucket before it compute (the first is in dp_tail). Megatron's distributed optimizer only;
    0 where its gather is synchronous (dp_tail) or there is none."""
    tr = job.training
    if job.zero is not Zero.OPTIMIZER or tr.framework is not Framework.MEGATRON or not tr.overlap_grad_reduce or tr.zero1_blocking_sync:
        return 0.0
    out = 0.0
    for kind, where in (("dense", _dense_group(job)), ("experts", _expert_group(job))):
        if where.n == 1:
            continue
        chunks = megatron_buckets(job, rank, kind)
        out += sum(bucket_collective_seconds(job, Collective.ALL_GATHER, b, _gather_bytes(job), where) for c in chunks for b in c)
        out -= bucket_collective_seconds(job, Collective.ALL_GATHER, _first_forward_bucket(chunks), _gather_bytes(job), where)
    return out


def serialized_param_gather(job: Job) -> bool:
    """Whether the distributed optimizer's parameter gathers run in series with the forward:
    align_param_gather without the interleaved schedule (TrainingSpec.align_param_gather)."""
    return job.training.align_param_gather and not (job.layout.pp > 1 and job.layout.vpp > 1)


def gather_window_microbatches(job: Job) -> int:
    """Micro-batch forwards the parameter gather of a rank can hide behind: the first one's, bucket
    by bucket; under the interleaved schedule model chunk j first runs after the warm-up has run
    min(m, pp) micro-batches through each chunk before it (Narayanan et al. 2021, Sec. 2.2.2,
    Fig. 4: forwards go in groups of pp micro-batches per chunk), so each chunk's gather has
    min(m, pp) micro-batches of a chunk's forward to hide behind."""
    if job.layout.pp > 1 and job.layout.vpp > 1:
        return min(job.num_microbatches, job.layout.pp)
    return 1


def dp_tail(job: Job, rank: int, cal: Calibration) -> tuple[float, float]:
    """(seconds, seconds that cannot hide) of the end-of-step data-parallel traffic of a rank."""
    lay, cl, z = job.layout, job.cluster.spec, job.zero
    p = rank_params(job, rank)
    if job.dense_shard_group == 1 and job.expert_shard_group == 1 and job.dp == 1:
        return 0.0, 0.0
    gb = _grad_bytes(job)
    groups = _rank_groups(job, rank)
    dense = groups[0][0]
    total = first = 0.0
    fw = job.training.framework
    bucket = DEEPSPEED_BUCKET_PARAMS if fw is Framework.DEEPSPEED else max(MIN_DDP_BUCKET_PARAMS, BUCKET_PARAMS_PER_DP_RANK * job.dp)
    for kind, (params, where) in zip(("dense", "experts"), groups):
        if params == 0 or where.n == 1:
            continue
        one_bucket = min(params, bucket)
        if z is Zero.NONE and job.training.ddp_buckets and kind == "dense":
            embedding, head = p.value("embedding"), p.value("head")
            t, tail = torch_ddp_all_reduce_seconds(dense - embedding - head, embedding, head, where, cl)
        elif fw is Framework.MEGATRON and z <= Zero.OPTIMIZER and not job.training.zero1_blocking_sync:
            t, tail = megatron_bucket_seconds(job, rank, kind, where)
        elif z is Zero.NONE:
            t = collective_time(Collective.ALL_REDUCE, params * gb, where, cl)
            tail = collective_time(Collective.ALL_REDUCE, one_bucket * gb, where, cl)
        elif fsdp_managed(job):
            if _pipelined_fsdp(job):
                # torch's pipelining: every layer's reduce-scatter after the last backward, exposed
                # (_pipelined_fsdp); the gather once before the first forward, all but the first
                # layer's behind the forward, unless every micro-batch gathers (stage time)
                rs = collective_time(Collective.REDUCE_SCATTER, params * gb, where, cl)
                ag = 0.0 if fsdp_per_microbatch(job) else collective_time(Collective.ALL_GATHER, params * ACT_BYTES, where, cl)
                t, tail = ag + rs, ag / max(1, len(job.stage_layer_ids(rank))) + rs
            elif fsdp_per_microbatch(job):
                t = tail = 0.0  # per micro-batch, in the stage time
            else:
                # FSDP2 under a pipeline: gather once before the first forward, reduce-scatter
                # after the last backward; one layer's worth of each cannot hide
                t = collective_time(Collective.ALL_GATHER, params * ACT_BYTES, where, cl) + collective_time(
                    Collective.REDUCE_SCATTER, params * gb, where, cl
                )
                layers = max(1, len(job.stage_layer_ids(rank)))
                tail = t / layers
        elif job.training.zero1_blocking_sync:
            t = tail = zero1_blocking_sync_seconds(params, where, cl) + zero1_gather_copy_seconds(job, rank, params, cal)
        else:
            rs = collective_time(Collective.REDUCE_SCATTER, params * gb, where, cl)
            # the parameter gather hides behind the next forward but for its first bucket; without
            # --overlap-param-gather (overlap_grad_reduce=False) the optimizer step gathers every
            # bucket synchronously (Megatron-LM@d98e8a64 megatron/core/optimizer/distrib_optimizer.py:
            # 3175-3195 step_with_ready_grads; @0609f27f megatron/optimizer/distrib_optimizer.py:861-895
            # gather_model_params, one all-gather of the whole buffer)
            synchronous = fw is Framework.MEGATRON and not job.training.overlap_grad_reduce
            ag = collective_time(Collective.ALL_GATHER, (params if synchronous else one_bucket) * _gather_bytes(job), where, cl)
            t = rs + ag
            tail = collective_time(Collective.REDUCE_SCATTER, one_bucket * gb, where, cl) + ag
        total += t
        first += tail
    if lay.dp_shard is not None and lay.dp_shard < job.dp and z >= Zero.OPTIMIZER:
        # HSDP: the shard group's result is all-reduced across the dp/dp_shard replicas
        replicas = placement(cl, job.dp // lay.dp_shard, lay.tp * lay.cp * lay.dp_shard)
        total += collective_time(Collective.ALL_REDUCE, dense * gb / job.dense_shard_group, replicas, cl)
    if fw is Framework.MEGATRON and not job.training.overlap_grad_reduce:
        first = total  # nothing of it overlaps (TrainingSpec.overlap_grad_reduce)
    return total, first


def megatron_bucket_seconds(job: Job, rank: int, kind: str, where: Placement) -> tuple[float, float]:
    """(seconds, seconds that cannot hide) of Megatron DDP's end-of-step traffic for one buffer of a
    rank: each bucket reduced by its own collective when its last gradient is ready, priced at its
    own message size, so a bucket of one small tensor costs NCCL's latency (megatron_buckets). The
    distributed optimizer reduce-scatters each bucket and all-gathers the updated parameters, the
    first forward bucket's gather in front of the next forward and the rest behind it
    (hidden_param_gather); without --overlap-param-gather (overlap_grad_reduce=False) the optimizer
    step gathers every bucket synchronously (Megatron-LM@d98e8a64 megatron/core/optimizer/
    distrib_optimizer.py:3175-3195 step_with_ready_grads). Without the distributed optimizer (zero 0),
    one all-reduce per bucket. What cannot hide: the last bucket's reduction, the first chunk's last, which the backward fills
    last, and that bucket's gather."""
    cl = job.cluster.spec
    chunks = megatron_buckets(job, rank, kind)
    last = _first_forward_bucket(chunks)
    gb = _grad_bytes(job)
    if job.zero is Zero.NONE:
        total = sum(collective_time(Collective.ALL_REDUCE, b * gb, where, cl) for c in chunks for b in c)
        return total, collective_time(Collective.ALL_REDUCE, last * gb, where, cl)
    rs = sum(bucket_collective_seconds(job, Collective.REDUCE_SCATTER, b, gb, where) for c in chunks for b in c)
    fp32 = apex_fp32_grad_params(job, rank, kind)
    rs_last = bucket_collective_seconds(job, Collective.REDUCE_SCATTER, last, gb, where, fp32)
    rs += rs_last - bucket_collective_seconds(job, Collective.REDUCE_SCATTER, last, gb, where)
    if job.training.overlap_grad_reduce:
        ag = bucket_collective_seconds(job, Collective.ALL_GATHER, last, _gather_bytes(job), where)
    else:
        # every bucket at once, whole buckets under Apex: its blocking param_sync copies all the
        # parameters out of a contiguous_param_buffer (NeMo's GPT-3 config sets it) in one
        # _param_copy, which starts every bucket's all-gather of its padded shard·n buffer in one
        # coalescing group (NVIDIA/apex@d571f3ee apex/contrib/optimizers/distributed_fused_adam.py:
        # 1834-1836 step, 1574-1577 param_sync, 1140-1164 _param_copy, 1484-1518
        # _start_bucket_param_sync; mlcommons/training_results_v4.0@6fe95437 NVIDIA/benchmarks/gpt3/
        # implementations/nemo/conf/optim/distributed_fused_adam.yaml:6)
        size = sum(bucket_message_bytes(job, b, _gather_bytes(job), where.n) for c in chunks for b in c)
        ag = collective_time(Collective.ALL_GATHER, size, where, cl)
    return rs + ag, rs_last + ag


def _interleaved_grad_sync(job: Job) -> bool:
    """Whether each model chunk's gradient reduction starts at that chunk's last backward: Megatron's
    interleaved schedule with a per-chunk grad_sync_func, which Megatron DDP installs under
    --overlap-grad-reduce with align_grad_reduce (its default; Megatron-LM@d98e8a64
    megatron/training/training.py:4346-4359, training/config/common_config.py:80) and NeMo's GPT model
    under Apex DistributedFusedAdam (reduce_overlap_gradients; NeMo as vendored in
    mlcommons/training_results_v4.0@6fe95437 ASUSTeK/benchmarks/ft-llm/implementations/pytorch/NeMo/
    nemo/collections/nlp/models/language_modeling/megatron_gpt_model.py:588-606)."""
    tr, lay = job.training, job.layout
    return (lay.pp > 1 and lay.vpp > 1 and tr.framework is Framework.MEGATRON and job.zero <= Zero.OPTIMIZER
            and tr.overlap_grad_reduce and not tr.zero1_blocking_sync)


def chunk_sync_overrun(seconds: list[float], *, last_group: int, rank: int, chunk_backward_s: float) -> float:
    """Seconds past a rank's last backward that one communicator needs for the per-chunk reductions
    `seconds[j]` (chunk j's), chunk j launched max(0, j·last_group − rank) chunk backwards before the
    end and the chunks served one after another from the last (interleaved_grad_sync_chunks)."""
    free = -math.inf
    for j in reversed(range(len(seconds))):
        if seconds[j] > 0:
            free = max(free, -max(0, j * last_group - rank) * chunk_backward_s) + seconds[j]
    return max(0.0, free)


def interleaved_grad_sync_chunks(job: Job, rank: int) -> tuple[tuple[tuple[float, ...], ...], float] | None:
    """The data-parallel gradient reduction of a rank under the interleaved schedule as each
    communicator's per-chunk seconds, [communicator][chunk], and the first forward bucket's
    parameter gather that follows them; None where chunks do not sync on their own
    (_interleaved_grad_sync). StageTime.dp_late_s turns them into what outlasts the backward.

    Megatron's interleaved schedule calls grad_sync_func for model chunk j once the backward of its
    last micro-batch is done, delayed by the rank's pipeline position so that every pipeline rank
    launches it at once: after backward virtual micro-batch k + rank, where k is chunk j's last
    (Megatron-LM@d98e8a64 megatron/core/pipeline_parallel/schedules.py:1438-1455; the same at
    df72712, the Megatron-core of the MLPerf v3.1 GPT-3 submissions, schedules.py:622-627); a chunk not launched by then is launched after the last backward
    (d98e8a64 schedules.py:2063-2069). The backward runs the last group of micro-batches through
    chunks vpp−1 … 0 in turn (get_schedule_table, schedules.py:989-1015), a group being pp
    micro-batches (microbatch_group_size_per_vp_stage's default, model_parallel_config.py:567-568;
    the schedule refuses a number of micro-batches that leaves a shorter last group,
    schedules.py:1159-1177), so after chunk j's last backward come j·pp chunk backwards of the rank:
    chunk j launches max(0, j·pp − rank) chunk backwards before the end (chunk_sync_overrun). Each
    chunk's reduction is its buckets' collectives at their own sizes (megatron_buckets); the chunks'
    go one after another on the communicator, from chunk vpp−1 down; the cooldown's idle waits,
    which would widen every window, are not counted."""
    if not _interleaved_grad_sync(job):
        return None
    gb = _grad_bytes(job)
    op = Collective.ALL_REDUCE if job.zero is Zero.NONE else Collective.REDUCE_SCATTER
    per_group: list[tuple[float, ...]] = []
    gather = 0.0
    for kind, where in (("dense", _dense_group(job)), ("experts", _expert_group(job))):
        chunks = megatron_buckets(job, rank, kind)
        if where.n == 1 or not any(chunks):
            continue
        first = next(v for v, c in enumerate(chunks) if c)
        fp32 = apex_fp32_grad_params(job, rank, kind)
        seconds = []
        for v, sizes in enumerate(chunks):
            t = sum(bucket_collective_seconds(job, op, b, gb, where) for b in sizes)
            if v == first and fp32:
                b = sizes[-1]
                t += bucket_collective_seconds(job, op, b, gb, where, fp32) - bucket_collective_seconds(job, op, b, gb, where)
            seconds.append(t)
        per_group.append(tuple(seconds))
        if job.zero is Zero.OPTIMIZER:
            gather += bucket_collective_seconds(job, Collective.ALL_GATHER, _first_forward_bucket(chunks), _gather_bytes(job), where)
    return tuple(per_group), gather


def apex_fp32_grad_params(job: Job, rank: int, kind: str) -> int:
    """Parameters of a rank whose gradients NeMo reduces in fp32 under Apex DistributedFusedAdam
    (TrainingSpec.apex_distributed_adam): the word and position embeddings on the first pipeline rank
    and the tied output weight on the last, with_fp32_embedding_grads defaulting to True (NeMo as
    vendored in mlcommons/training_results_v4.0@6fe95437 ASUSTeK/benchmarks/ft-llm/implementations/
    pytorch/NeMo/nemo/collections/nlp/models/language_modeling/megatron_gpt_model.py:500-538; the
    GPT-3 submissions do not set it), initialized with grad_sync_dtype=torch.float32 (nemo/core/optim/
    distributed_adam.py:190-205) and tied to the first forward layer's bucket (apex_layer_buckets)."""
    if not job.training.apex_distributed_adam or kind != "dense":
        return 0
    out = int(rank_params(job, 0).value("embedding")) if rank == 0 else 0
    if rank == job.layout.pp - 1 and rank > 0 and job.model.tie_embeddings:
        out += min(int(rank_params(job, rank).value("head")), output_layer_vocab(job) * job.model.hidden_size)
    return out


def torch_ddp_all_reduce_seconds(layers: float, embedding: float, head: float, where: Placement,
                                 cluster: ClusterSpec) -> tuple[float, float]:
    """(seconds, seconds that cannot hide) of nanotron's gradient all-reduce under torch DDP
    (TrainingSpec.ddp_buckets): DDP groups the 16-bit gradients into buckets of bucket_cap_mb, 25 MiB
    (nanotron's default ddp_bucket_cap_mb, huggingface/nanotron@c2528430 src/nanotron/config/config.py:222,
    passed at trainer.py:847-852; torch DistributedDataParallel's bucket_bytes_cap = bucket_cap_mb·2^20,
    pytorch/pytorch@0028a164 torch/nn/parallel/distributed.py), and nanotron's communication hook
    all-reduces each bucket's fp32 accumulation buffers when the bucket is ready
    (optim/gradient_accumulator.py:328-386): one all-reduce of 4 bytes per parameter per bucket, each
    priced at its own message size. A tensor larger than the cap is a bucket of its own: the output
    layer's, ready first, and the embedding's, ready last, which is what is left after the backward."""
    bucket = TORCH_DDP_BUCKET_BYTES // ACT_BYTES
    full, rest = divmod(layers, bucket)

    def ar(n: float) -> float:
        return collective_time(Collective.ALL_REDUCE, n * FP32, where, cluster)

    total = full * ar(bucket) + ar(rest) + ar(head) + ar(embedding)
    return total, ar(embedding) if embedding else ar(min(bucket, layers))


def zero1_blocking_sync_seconds(params: float, where: Placement, cluster: ClusterSpec) -> float:
    """nanotron's ZeRO-1 step end (TrainingSpec.zero1_blocking_sync): an all-reduce of the rank's
    whole fp32 gradient buffer (4 bytes per parameter, not a reduce-scatter of it), then an
    all-gather of every parameter's updated 16-bit shard, each blocking, neither beside compute."""
    return (collective_time(Collective.ALL_REDUCE, params * FP32, where, cluster)
            + collective_time(Collective.ALL_GATHER, params * ACT_BYTES, where, cluster))


def nanotron_param_tensors(job: Job, rank: int) -> int:
    """Parameter tensors of a pipeline rank of nanotron's Llama: six per decoder layer (the fused
    qkv_proj and gate_up_proj, o_proj, down_proj and the two RMSNorm weights, bias-free), the token
    embedding on the first rank, the final norm and the output layer on the last, the output layer
    being the embedding's tensor when both are tied on one rank (huggingface/nanotron@c2528430
    src/nanotron/models/llama.py:223-238, 384-419, 704-712, 763-770, 848-872)."""
    first, last = rank == 0, rank == job.layout.pp - 1
    shared = job.model.tie_embeddings and first and last
    return NANOTRON_TENSORS_PER_LAYER * len(job.stage_layer_ids(rank)) + first + 2 * last - shared


def zero1_gather_copy_seconds(job: Job, rank: int, params: float, cal: Calibration) -> float:
    """The copies around nanotron's ZeRO-1 parameter all-gather (optim/zero.py:217-241,
    distributed.py:195-220): the dp ranks' slices of every parameter flattened into one buffer per
    rank, torch's copy of the gathered buffer into them, then one copy_ per parameter per dp rank back
    into the parameter, each a device operation of its own (launch_s). Bytes: each of the three passes
    reads and writes the rank's 16-bit parameters once."""
    launches = nanotron_param_tensors(job, rank) * job.dp + 2 * job.dp
    return memory_seconds(job, 3 * 2 * ACT_BYTES * params, cal, launches=launches)


def _optimizer_params(job: Job, rank: int) -> float:
    p = rank_params(job, rank)
    dense = dense_params(p)
    if job.zero >= Zero.OPTIMIZER:
        return dense / job.dense_shard_group + p.value("experts") / job.expert_shard_group
    return dense + p.value("experts")


# --- one pipeline rank -------------------------------------------------------------------------------


@dataclass(frozen=True)
class StageTime:
    rank: int
    microbatch: Breakdown  # seconds of one micro-batch through all of the rank's chunks
    flop: float  # executed FLOPs of one micro-batch on one GPU of this rank
    recompute_flop: float  # the recomputed forward work among them
    dp_comm_s: float  # the gradient reduction (and parameter gather) left for the end of the step
    dp_window_s: float  # backward time of the last micro-batch, which that reduction can hide behind
    dp_bucket_s: float  # the part that can never hide (last bucket, first parameter bucket)
    dp_share: float  # SMs the end-of-step collectives hold while they hide
    optimizer_s: float
    pp_fill_s: float = 0.0  # blocking transfers of the warm-up and flush (overlapped p2p only)
    gather_s: float = 0.0  # the parameter all-gather beside the first forward (hidden_param_gather)
    forward_s: float = 0.0  # the forward that gather can hide behind (gather_window_microbatches)
    # interleaved: each communicator's per-chunk reductions and the first gather after them
    # (interleaved_grad_sync_chunks), one micro-batch's backward through one chunk, and the last group
    dp_chunks_s: tuple[tuple[float, ...], ...] | None = None
    dp_first_gather_s: float = 0.0
    chunk_backward_s: float = 0.0
    last_group: int = 0

    @property
    def dp_late_s(self) -> float | None:
        """Interleaved: the reduction (and first gather) that outlasts the rank's last backward."""
        if self.dp_chunks_s is None:
            return None
        return self.dp_first_gather_s + sum(
            chunk_sync_overrun(list(c), last_group=self.last_group, rank=self.rank, chunk_backward_s=self.chunk_backward_s)
            for c in self.dp_chunks_s)

    @property
    def drain_s(self) -> float:
        """How much earlier than rank 0's this rank's last backward ends: r backward passes, under the
        interleaved schedule r chunk backwards (the last micro-batch's chunk 0 passes down the ranks)."""
        return self.rank * (self.dp_window_s if self.dp_chunks_s is None else self.chunk_backward_s)

    @property
    def microbatch_s(self) -> float:
        return self.microbatch.total

    @property
    def dp_exposed_s(self) -> float:
        late = self.dp_late_s
        if late is not None:
            return late
        return max(self.dp_comm_s - self.dp_window_s, self.dp_bucket_s)

    @property
    def gather_exposed_s(self) -> float:
        """What of the parameter gather outlasts the first micro-batch's forward."""
        return max(0.0, self.gather_s - self.forward_s)

    @property
    def dp_contention_s(self) -> float:
        """Compute of the last backward slowed by the gradient reduction running beside it, and of
        the first forward by the parameter gather beside it."""
        late = self.dp_late_s
        if late is not None:
            reduced = max(0.0, self.dp_comm_s - late)
        else:
            reduced = max(0.0, min(self.dp_comm_s - self.dp_bucket_s, self.dp_window_s))
        hidden = reduced + min(self.gather_s, self.forward_s)
        return hidden * self.dp_share / (1 - self.dp_share)


def dense_share(job: Job, cal: Calibration) -> float:
    """SMs a collective of the dense data-parallel shard group (FSDP / ZeRO-3 gathers and
    reduce-scatters, the gradient reduction) takes from the compute it hides behind."""
    return _share(job, _dense_group(job), cal, "dp")


def _fsdp_exposure(job: Job, gathers: list[float], reduces: list[float], fwd: list[float], bwd: list[float], params: list[int],
                   cal: Calibration, counts: tuple[float, float] = (1.0, 1.0)) -> Exposure:
    """FSDP / ZeRO-3 per micro-batch: layer i's gather hides behind layer i−1's forward; backward
    gathers again (reshard after forward) and reduce-scatters layer i behind layer i−1's backward.
    DeepSpeed can hide at most DEEPSPEED_PREFETCH_PARAMS of a layer's gather; the rest waits.
    `counts`: the (forward, backward) gathers per micro-batch (pipelined_gathers; 1 and 1 otherwise)."""
    fg, bg = counts
    share = dense_share(job, cal)
    if job.training.framework is Framework.DEEPSPEED:
        cover = [min(1.0, DEEPSPEED_PREFETCH_PARAMS / max(1, p)) for p in params]
        out = Exposure(gathers[0] + gathers[-1] + reduces[0])
        for g, c, f in zip(gathers[1:], cover[1:], fwd[:-1]):
            out += Exposure(g * (1 - c)) + _hidden(g * c, f, share)
        for g, r, c, b in zip(gathers[:-1], reduces[1:], cover[:-1], bwd[1:]):
            out += Exposure(g * (1 - c)) + _hidden(g * c + r, b, share)
        return out
    out = Exposure(fg * gathers[0] + bg * gathers[-1] + reduces[0])
    for g, f in zip(gathers[1:], fwd[:-1]):
        out += _hidden(fg * g, f, share)
    for g, r, b in zip(gathers[:-1], reduces[1:], bwd[1:]):
        out += _hidden(bg * g + r, b, share)
    return out


def _pp_boundary_bytes(job: Job) -> float:
    return local_tokens(job) * job.model.hidden_size * ACT_BYTES


def pp_hop_seconds(job: Job) -> float:
    """One pipeline send/recv of a micro-batch's activations (or their gradient) between stages
    whose neighbours are a stride apart (in one scale-up domain when the stride is smaller)."""
    lay = job.layout
    return send_recv_time(_pp_boundary_bytes(job), stride=lay.tp * lay.cp * job.dp, cluster=job.cluster.spec)


def pp_overlapped_hop_seconds(job: Job) -> float:
    """The send/recv the interleaved schedule's overlapped exchanges are priced at, one hop for
    every rank: its ranks pass every chunk through every boundary in step, so the pipeline runs at
    its slowest boundary's pace, a network hop (pp_boundary_seconds) wherever the pipeline leaves a
    scale-up domain. A pipeline of pp ranks tp·cp·dp GPUs apart spans pp·tp·cp·dp GPUs and leaves
    its domain where comm.placement puts fewer than pp of its ranks in one; a stride below the
    domain size alone does not keep it inside (tp4 cp2 dp8 pp8 on 72-GPU NVL72 domains: ranks 64
    GPUs apart, a pipeline over 512 GPUs)."""
    if _pp_ranks_per_domain(job) >= job.layout.pp:
        return pp_hop_seconds(job)
    return max(pp_boundary_seconds(job, 0))


def _pp_ranks_per_domain(job: Job) -> int:
    """How many pipeline ranks one scale-up domain holds. The rank order puts pp last, so a
    pipeline rank is a block of tp·cp·dp consecutive GPUs and a domain holds as many whole blocks
    as comm.placement puts in one: one when a block fills a domain or more."""
    return placement(job.cluster.spec, job.layout.pp, job.layout.tp * job.layout.cp * job.dp).per_domain


def _crosses_domain(job: Job, rank: int, neighbour: int) -> bool:
    """Whether two pipeline ranks sit in different scale-up domains (_pp_ranks_per_domain)."""
    per_domain = _pp_ranks_per_domain(job)
    return rank // per_domain != neighbour // per_domain


def _boundary_crossings(job: Job, rank: int) -> tuple[bool, bool]:
    """Whether the rank's previous and next pipeline neighbours (around the ring) are a domain away."""
    pp = job.layout.pp
    return _crosses_domain(job, rank, (rank - 1) % pp), _crosses_domain(job, rank, (rank + 1) % pp)


def pp_boundary_seconds(job: Job, rank: int) -> tuple[float, float]:
    """(previous, next) seconds of one send/recv across each of a pipeline rank's two boundaries,
    the neighbours taken around the ring (an interleaved schedule's chunks pass from the last rank
    back to the first). A pipeline whose ranks are smaller than a scale-up domain (tp·cp·dp below
    its size) keeps most neighbours on NVLink (pp_hop_seconds), but where it crosses from one
    domain into the next the two ranks on either side exchange over the network, at one NIC's
    rate; a rank that waits on every exchange then runs slower than its equals inside a domain."""
    key = ("pp_link_seconds",)
    if key not in job.memo:
        cl, stride = job.cluster.spec, job.layout.tp * job.layout.cp * job.dp
        network = send_recv_time(_pp_boundary_bytes(job), stride=max(stride, cl.scaleup_domain_gpus), cluster=cl)
        job.memo[key] = (pp_hop_seconds(job), network)
    nvlink, network = job.memo[key]
    prev, nxt = _boundary_crossings(job, rank)
    return (network if prev else nvlink), (network if nxt else nvlink)


def pp_sync_relaunch_seconds(job: Job) -> float:
    """GPU idle time per pipeline exchange that Megatron follows with torch.cuda.synchronize().

    Without --overlap-p2p-comm (forced off without a virtual pipeline: Megatron-LM@d98e8a64
    megatron/training/arguments.py:1010-1012) Megatron batches each exchange into one
    batch_isend_irecv (batch_p2p_comm = not overlap_p2p_comm, megatron/training/argument_utils.py:307)
    and, with batch_p2p_sync at its default True (megatron/core/model_parallel_config.py:390-398;
    arguments.py:2307-2318 lists both among the fields with no command-line flag), calls torch.cuda.synchronize()
    after it (megatron/core/pipeline_parallel/p2p_communication.py:421-424, "to protect against race condition when using
    batch_isend_irecv()"). The forks behind the sail_pipeline rows do the same in their 1F1B
    baselines: sail-sg/zero-bubble-pipeline-parallelism@77b9eed9 megatron/core/pipeline_parallel/
    p2p_communication.py:342-345, megatron/core/model_parallel_config.py:186-187, megatron/arguments.py:183-189,
    483; sail-sg/VocabularyParallelism@4dca7d20 megatron/training/arguments.py:276-278, 656 and
    megatron/core/pipeline_parallel/p2p_communication.py:370-374, which skips the
    synchronize only for its own vocabulary-parallel schedule. nanotron, run here as Megatron,
    syncs too: each receive sizes its buffer from metadata received into a GPU tensor
    (huggingface/nanotron@c2528430 src/nanotron/parallel/pipeline_parallel/state.py:31, 50 call
    p2p.py:352-356, 317-345, 245-288; the batched form reads it with .tolist(), p2p.py:411-441).
    The host thus waits for the GPU at every exchange and the launch queue is empty when the next
    pass starts: that pass's first kernel begins one kernel start-up (the GPU's launch_s,
    gpu-small-kernels) after the host launches it, instead of queued behind the previous kernel.
    The host's own time up to that launch (Python, forward_step) is not counted: no measurement
    of it is at hand. Zero where the exchanges are not synchronised (the interleaved schedule's
    overlapped p2p, other frameworks)."""
    tr = job.training
    if job.layout.pp == 1 or tr.framework is not Framework.MEGATRON or _pp_overlapped(job):
        return 0.0
    return K.table_for(job.cluster.gpu).launch_s


def tied_embedding_grad_seconds(job: Job) -> float:
    """The all-reduce of the word embedding's gradient between the first and the last pipeline
    stage, which each hold a copy of it (exposed: after the data-parallel gradient sync, before the
    optimizer step, with nothing beside it).

    With tied input and output embeddings and pp > 1, Megatron keeps a second copy of the word
    embedding on the last stage for the output layer, and also one there for multi-token
    prediction whether tied or not (Megatron-LM@d98e8a64 megatron/core/models/common/
    language_module/language_module.py L253-314; gpt_model.py L166-181). Its embedding group is the
    first and the last rank of each pipeline group, one rank without a pipeline
    (parallel_state.py L560-566, L1269-1278). finalize_model_grads runs at the end of every schedule
    (pipeline_parallel/schedules.py L863-871, L2080-2097, L2482-2498), after the last backward:
    finish_grad_sync of the data-parallel reduction first, then one all_reduce of the whole
    main_grad of the copy over the embedding group (distributed/finalize_model_grads.py L636-642,
    L671-677, L164-259), in the gradient buffer's dtype (fp32 unless --grad-reduce-in-bf16:
    param_and_grad_buffer.py L924), the full vocab/tp x hidden view of the buffer under the
    distributed optimizer too. With a virtual pipeline the copies are the first chunk of rank 0 and
    the last chunk of the last rank (L233-241): the same two ranks.
    nanotron does the same for tied embeddings: sync_tied_weights_gradients, after the
    data-parallel sync and before clipping, one all_reduce_coalesced of the fp32 accumulation
    buffer over the ranks holding the two targets (huggingface/nanotron@c2528430
    src/nanotron/trainer.py L502-526, L949-971; parallel/tied_parameters.py L119-165).
    DeepSpeed's PipelineModule (TiedLayerSpec) all-reduces each tied weight's gradient over the
    stages holding it in ReduceTiedGrads, the last step's command before ReduceGrads and the
    optimizer step (deepspeedai/DeepSpeed@edaa7221 deepspeed/runtime/pipe/schedule.py L237-241;
    pipe/engine.py L278-294; pipe/module.py L481-523), in the gradient accumulation dtype, bf16 by
    default (engine.py L1485-1496, L2013-2017; bf16_optimizer.py L176), as _grad_bytes has it.
    torchtitan refuses weight tying with a pipeline (pytorch/torchtitan@b5bcd76c
    torchtitan/models/common/decoder.py L168-171; 0.2's qwen3 has no pipelining_fn,
    models/qwen3/__init__.py L199 at v0.2.0): nothing to price."""
    lay, fw = job.layout, job.training.framework
    megatron_mtp = fw is Framework.MEGATRON and job.model.mtp_layers > 0
    if lay.pp == 1 or fw is Framework.TORCHTITAN or not (job.model.tie_embeddings or megatron_mtp):
        return 0.0
    cl = job.cluster.spec
    word = local_vocab(job) * job.model.hidden_size
    # the two ranks are (pp - 1) pipeline strides apart (the rank order puts pp last): both in one
    # scale-up domain when the whole pipeline group is, else one per domain, as send_recv_time
    # places a pipeline hop
    span = lay.pp * lay.tp * lay.cp * job.dp
    where = Placement(n=2, per_domain=2 if span <= cl.scaleup_domain_gpus else 1, span_gpus=span)
    return collective_time(Collective.ALL_REDUCE, word * _grad_bytes(job), where, cl)


def _pp_overlapped(job: Job) -> bool:
    """Megatron's interleaved schedule posts each chunk's send/recv and waits for it only before
    the chunk that needs it (--overlap-p2p-communication, on by default and kept only with a
    virtual pipeline: Megatron-LM@23e00ed0 arguments.py:2348-2350, 536-555; schedules.py
    1568-1700); warm-up and flush use the blocking form. Without it (no vpp, or other frameworks)
    every exchange is waited on at once (batched p2p followed by a synchronize)."""
    return job.training.framework is Framework.MEGATRON and job.layout.vpp > 1


def stage_layers(job: Job, rank: int) -> list[tuple[int, int]]:
    """(position in its chunk, layer id) of each decoder layer a rank runs per micro-batch, in order.
    Multi-token prediction runs after the last decoder layer, on the last stage (without a custom
    pipeline layout Megatron places every MTP layer there: Megatron-LM@d98e8a64
    megatron/core/transformer/multi_token_prediction.py L788-805 mtp_on_this_rank): one layer of the
    last layer's kind per module, at position 0."""
    out = [(pos, layer_id) for chunk in job.stage_chunks[rank] for pos, layer_id in enumerate(chunk)]
    if rank == job.layout.pp - 1:
        out += [(0, job.model.num_layers - 1)] * job.model.mtp_layers
    return out


def mtp_merge_seconds(job: Job, cal: Calibration) -> tuple[float, float]:
    """(forward, backward) seconds of the MTP modules' h x 2h merge projections (flops.mtp_gemms), at
    the layers' precision: Megatron runs the merge (eh_proj) inside the same fp8 context as the MTP
    layer (Megatron-LM@d98e8a64 core/transformer/multi_token_prediction.py L1387-1397)."""
    return linear_seconds(job, mtp_gemms(job), cal)


def logits_gather_seconds(job: Job) -> float:
    """TrainingSpec.tp_replicated_vocab without a pipeline: the column-parallel output layer's
    logits all-gathered whole onto every tp rank before the loss (ColwiseParallel(input_layouts=
    Shard(1), output_layouts=Replicate()), KempnerInstitute/KempnerForge@601aba9
    kempnerforge/distributed/tensor_parallel.py:157-164), t x V 16-bit values, waited on by the
    loss. Its backward takes each rank's slice of the replicated gradient, a local copy. On
    pipeline stages the output layer is not split (flops.head_gemm) and nothing is gathered."""
    if not job.training.tp_replicated_vocab or job.layout.pp > 1:
        return 0.0
    return _tp_coll(job, Collective.ALL_GATHER, tokens(job) * padded_vocab(job) * ACT_BYTES)


def stage_time(job: Job, rank: int, cal: Calibration, passes: dict[tuple[LayerKind, Recompute], LayerPass]) -> StageTime:
    lay, cl = job.layout, job.cluster.spec
    parts = {k: 0.0 for k in COMPUTE_PARTS}
    comm = {k: 0.0 for k in COMM_KINDS}
    flop = recompute_flop = 0.0
    backward_s = 0.0
    fsdp_copies = fsdp_per_microbatch(job)
    fsdp = fsdp_copies and job.dense_shard_group > 1
    gathers: list[float] = []
    reduces: list[float] = []
    fwd_compute: list[float] = []
    bwd_compute: list[float] = []
    layer_params: list[int] = []
    first, last = rank == 0, rank == lay.pp - 1
    for pos, layer_id in stage_layers(job, rank):
        lp = passes[job.model.layer_kind(layer_id), job.recompute_mode(pos)]
        for name in COMPUTE_PARTS[:-2]:
            parts[name] += lp.compute.value(name)
        for name in ("tp", "cp", "ep"):
            comm[name] += lp.comm.value(name)
        flop += lp.flop
        recompute_flop += lp.recompute_flop
        fwd_compute.append(lp.forward_s)
        bwd_compute.append(lp.compute.total - lp.forward_s)
        backward_s += lp.compute.total - lp.forward_s
        if fsdp:
            g, r = fsdp_layer_comm(job, layer_id)
            gathers.append(g)
            reduces.append(0.0 if _pipelined_fsdp(job) else r)  # after the last backward (dp_tail)
            p = local_layer_params(job, layer_id)
            layer_params.append(p.dense + p.expert)
        if fsdp_copies:
            parts["sharding"] += fsdp_copy_seconds(job, layer_id, cal, rank)
    parts["elementwise"] += rank_memory_seconds(job, rank, cal)
    amax_s = te_amax_reduction_seconds(job)
    if amax_s:
        comm[te_amax_group(job)[1]] += amax_s  # booked by its group
    if fsdp and gathers:
        counts = pipelined_gathers(job, rank) if _pipelined_fsdp(job) else fsdp_gathers(job)
        exposure = _fsdp_exposure(job, gathers, reduces, fwd_compute, bwd_compute, layer_params, cal, counts)
        comm["dp"] += exposure.exposed
        parts["contention"] += exposure.contention
    if last:
        # the output layer and the loss once for the model and once more per MTP module, which
        # also runs its h x 2h merge projection (eh_proj)
        heads = 1 + job.model.mtp_layers
        head, head_bwd = head_time(job, cal), head_backward_time(job, cal)
        mtp_fwd, mtp_bwd = mtp_merge_seconds(job, cal)
        parts["gemm"] += heads * (head + head_bwd) + mtp_fwd + mtp_bwd
        parts["loss"] += heads * loss_time(job, cal)
        comm["tp"] += heads * logits_gather_seconds(job)
        flop += (1 + GEMM_BACKWARD_FACTOR) * (heads * head_gemm(job).flop + sum(g.flop for g in mtp_gemms(job)))
        backward_s += heads * head_bwd + mtp_bwd
    pp_fill = 0.0
    if lay.pp > 1:
        # each chunk receives its input in forward and its output gradient in backward; the
        # first chunk of rank 0 and the last chunk of the last rank have one neighbour less
        hops = 2 * lay.vpp - (1 if first else 0) - (1 if last else 0)
        hop = pp_overlapped_hop_seconds(job)
        if _pp_overlapped(job):
            # each transfer runs beside the next chunk's compute (of the other direction)
            chunk = (sum(fwd_compute) + sum(bwd_compute)) / (2 * lay.vpp)
            where = placement(cl, 2, lay.tp * lay.cp * job.dp)
            e = _hidden(hop, chunk, _share(job, where, cal, "pp")).times(hops)
            comm["pp"] = e.exposed
            parts["contention"] += e.contention
            pp_fill = 2 * (lay.pp - 1) * hop
        else:
            # every exchange waited on, each priced across the boundary it crosses, and each
            # followed by the host's re-launch after Megatron's synchronize
            prev_hop, next_hop = pp_boundary_seconds(job, rank)
            comm["pp"] = ((lay.vpp - first) * prev_hop + (lay.vpp - last) * next_hop
                          + hops * pp_sync_relaunch_seconds(job))
    dp_comm, dp_bucket = dp_tail(job, rank, cal)
    chunks = interleaved_grad_sync_chunks(job, rank)
    microbatch = Breakdown.of("s", compute=Breakdown.of("s", **parts), **comm)
    return StageTime(
        rank=rank,
        microbatch=microbatch,
        flop=flop,
        recompute_flop=recompute_flop,
        dp_comm_s=dp_comm,
        dp_window_s=backward_s,
        dp_bucket_s=dp_bucket,
        dp_share=dense_share(job, cal),
        optimizer_s=optimizer_time(job, _optimizer_params(job, rank), cal),
        pp_fill_s=pp_fill,
        gather_s=hidden_param_gather(job, rank),
        forward_s=0.0 if serialized_param_gather(job) else sum(fwd_compute) * gather_window_microbatches(job),
        dp_chunks_s=None if chunks is None else chunks[0],
        dp_first_gather_s=0.0 if chunks is None else chunks[1],
        chunk_backward_s=backward_s / lay.vpp,
        last_group=lay.pp,
    )


@dataclass(frozen=True)
class TimeEstimate:
    job: Job
    stages: tuple[StageTime, ...]
    calibration: Calibration

    @cached_property
    def critical(self) -> StageTime:
        return max(self.stages, key=lambda s: (s.microbatch_s, -s.rank))

    @cached_property
    def bubble_s(self) -> float:
        if self.job.layout.pp == 1:
            return 0.0
        return (sum(s.microbatch_s for s in self.stages) - self.critical.microbatch_s) / self.job.layout.vpp

    @cached_property
    def bubble_straggler_s(self) -> float:
        """The wait for slow GPUs inside the bubble. The bubble is the other stages' compute that
        the critical stage waits on while the pipeline fills and drains (bubble_s), and each stage
        runs it at the pace of its own slowest GPU, the slowest of gpus/pp (straggler_s's spread
        and Blom's approximation over one stage's GPUs): cv · that compute · E[max of gpus/pp]."""
        lay = self.job.layout
        if lay.pp == 1:
            return 0.0
        compute = sum(float(s.microbatch.value("compute")) for s in self.stages) - float(self.critical.microbatch.value("compute"))
        return self.calibration.gpu_speed_cv * compute / lay.vpp * expected_max_normal(self.job.gpus // lay.pp)

    @cached_property
    def dp_tail_s(self) -> float:
        """The stage that finishes last sets the tail: stage r's last backward ends about r
        backward passes before stage 0's (under the interleaved schedule r chunk backwards, drain_s),
        which leaves it that much more time."""
        return max(max(0.0, s.dp_exposed_s - s.drain_s) + s.gather_exposed_s for s in self.stages)

    @cached_property
    def fill_gathers(self) -> tuple[float, float]:
        """FSDP2 keeping each stage gathered under torch's pipelining (torchtitan's default under pp,
        reshard_after_forward=False: pytorch/torchtitan@9dec370ad torchtitan/parallelisms/
        parallelize_llama.py:325-339) reshards after the step's last backward (perform_reduce_grad
        sets reshard_after_backward, torch 2.13.0 torch/distributed/pipelining/stage.py:1174-1186;
        torch 2.6.0, git 2236df17, stage.py:641-651), so every stage gathers its layers again in
        its first forward. The first of those gathers waits for the stage's input: FSDP2's root
        pre-forward makes the gather streams wait on the compute stream (torch 2.13.0
        torch/distributed/fsdp/_fully_shard/_fsdp_state.py:146-154; 2.6.0 _fsdp_state.py:129-138),
        which waits on the receive. The pipeline fill runs the first forwards of all pp · vpp
        model chunks (each its own FSDP root: train.py:158-163 there parallelises every model chunk
        alone, pipeline_llama.py:108-124) one after another,
        so each chunk adds its first layer's gather, and each stage the slowdown of its other
        layers' gathers beside those forwards (dp_share). dp_tail_s and dp_contention_s count rank
        0's; this is the rest: (exposed seconds, contention seconds)."""
        job = self.job
        if not _pipelined_fsdp(job) or fsdp_per_microbatch(job) or job.dense_shard_group == 1:
            return 0.0, 0.0
        exposed = contention = 0.0
        for s in self.stages:
            gather = stage_gather_seconds(job, s.rank)
            first = gather / max(1, len(job.stage_layer_ids(s.rank)))
            exposed += (job.layout.vpp - (s.rank == 0)) * first
            if s.rank:
                contention += (gather - job.layout.vpp * first) * s.dp_share / (1 - s.dp_share)
        return exposed, contention

    @cached_property
    def breakdown(self) -> Breakdown:
        m = self.job.num_microbatches
        per_mb = self.critical.microbatch.scaled(m)
        comm = {k: per_mb.value(k) for k in COMM_KINDS}
        comm["dp"] += self.dp_tail_s + self.fill_gathers[0]
        comm["pp"] += self.critical.pp_fill_s + tied_embedding_grad_seconds(self.job)
        compute = per_mb["compute"]
        contention = max(s.dp_contention_s for s in self.stages) + self.fill_gathers[1]
        if contention:
            compute = Breakdown.of("s", **{k: compute.value(k) + (contention if k == "contention" else 0.0) for k in COMPUTE_PARTS})
        return Breakdown.of(
            "s",
            compute=compute,
            **comm,
            bubble=self.bubble_s,
            optimizer=max(s.optimizer_s for s in self.stages),
            straggler=self.straggler_s(float(compute.total)) + self.bubble_straggler_s,
        )

    def straggler_s(self, compute_s: float) -> float:
        """The wait for the slowest GPU: every GPU of the job synchronises each step (the gradient
        reduction, and tp/pp/cp inside it), so the step runs at the slowest GPU's sustained speed.
        With GPU speeds spread by a coefficient of variation cv (calibration.MECHANISMS
        gpu_speed_cv), the slowest of N lies E[max of N standard normals] deviations below the
        mean: Blom's approximation Φ⁻¹((N − 0.375)/(N + 0.25)) (Blom 1958; 1.42 for 8 GPUs, 3.20
        for 1024, 3.81 for 8192)."""
        return self.calibration.gpu_speed_cv * compute_s * expected_max_normal(self.job.gpus)

    @property
    def step_s(self) -> float:
        return float(self.breakdown.total)

    @property
    def tokens_per_step(self) -> int:
        tr = self.job.training
        assert tr.global_batch_size is not None
        return tr.global_batch_size * tr.seq_len

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_s

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_s / self.job.gpus

    @property
    def model_flop_per_step(self) -> float:
        return model_flops_per_token(self.job.model, self.job.training.seq_len) * self.tokens_per_step

    @property
    def hardware_flop_per_step(self) -> float:
        """FLOPs the GPUs execute, recomputation and the attention kernel's causal skipping included."""
        replicas = self.job.gpus // self.job.layout.pp
        return sum(s.flop for s in self.stages) * self.job.num_microbatches * replicas

    @property
    def peak_flop_per_s(self) -> float:
        """Dense 16-bit peak: the denominator of MFU and HFU for every precision, as Megatron-Bridge
        and torchtitan report them (fp8 runs can exceed what 16-bit utilisation suggests)."""
        return self.job.cluster.gpu.peak_flop_per_s.bf16

    @property
    def model_flop_per_s_per_gpu(self) -> float:
        return self.model_flop_per_step / self.step_s / self.job.gpus

    @property
    def mfu(self) -> float:
        return self.model_flop_per_s_per_gpu / self.peak_flop_per_s

    @property
    def hfu(self) -> float:
        """Hardware FLOPs utilisation in MFU's convention: model FLOPs plus the recomputed forward
        work (PaLM, Chowdhery et al. 2022, Appendix B: hardware FLOPs include rematerialisation),
        so HFU >= MFU, equal without recompute. The recomputed share is that of the executed FLOPs."""
        executed = sum(s.flop for s in self.stages)
        recomputed = sum(s.recompute_flop for s in self.stages)
        return self.mfu * executed / (executed - recomputed) if executed > recomputed else self.mfu

    def _mfu_at_own_peak(self, precision: Precision) -> float | None:
        """MFU against the GPU's dense peak of `precision` (its attribute of the same name), for runs
        at that precision on GPUs that have one (None otherwise)."""
        peak = getattr(self.job.cluster.gpu.peak_flop_per_s, precision.value)
        if self.job.training.precision is not precision or peak is None:
            return None
        return self.model_flop_per_s_per_gpu / peak

    @property
    def mfu_fp8(self) -> float | None:
        """MFU against the dense fp8 peak, for fp8 runs on GPUs that have one (None otherwise)."""
        return self._mfu_at_own_peak(Precision.FP8)

    @property
    def mfu_fp4(self) -> float | None:
        """MFU against the dense fp4 peak, for NVFP4 runs on GPUs that have one (None otherwise)."""
        return self._mfu_at_own_peak(Precision.FP4)

    @property
    def bottleneck(self) -> str:
        """The largest part of the step: compute, tp, cp, ep, pp, dp, bubble, optimizer or straggler."""
        name, _ = max(((n, float(self.breakdown.value(n))) for n, _ in self.breakdown), key=lambda x: x[1])
        return name


def expected_max_normal(n: int) -> float:
    """Expected maximum of n independent standard normal draws (Blom's approximation; 0 for one)."""
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def time_estimate(job: Job, *, calibration: Calibration = DEFAULT) -> TimeEstimate:
    modes = tuple({job.recompute_mode(0), job.recompute_mode(10**9), job.layout.recompute, Recompute.NONE})
    passes = {(kind, mode): lp for kind in job.model.layer_kinds
              for mode, lp in zip(modes, layer_passes(job, kind, modes=modes, cal=calibration))}
    alike: dict[tuple, StageTime] = {}  # ranks with equal signatures cost the same
    stages = []
    for r in range(job.layout.pp):
        # ranks of equal layers whose pipeline neighbours sit on other links cost differently where
        # every exchange is waited on (pp_boundary_seconds); overlapped p2p prices one hop for all
        crossings = job.layout.pp > 1 and not _pp_overlapped(job)
        sig = (job.rank_signature(r), _boundary_crossings(job, r) if crossings else None)
        if sig not in alike:
            alike[sig] = stage_time(job, r, calibration, passes)
        stages.append(replace(alike[sig], rank=r))
    return TimeEstimate(job=job, stages=tuple(stages), calibration=calibration)


def compute_by_kernel(est: TimeEstimate) -> Breakdown:
    """The step's compute on the critical stage by the kernel classes a profiler sees: GEMMs
    (forward, dgrad, wgrad, recomputed, the output layer), fused attention (forward, backward,
    recomputed, cp merges), memory-bound kernels (elementwise ops, their recomputation, fp8 casts,
    the loss, FSDP2's copies, Megatron's unfused gradient accumulation), and the SM contention of overlapped communication, which slows those
    kernels but is no kernel of its own. Accounted layer by layer apart from stage_time, so its total
    equals the breakdown's compute only when both count the same kernels."""
    job, cal, crit = est.job, est.calibration, est.critical
    gemm = attention = memory = 0.0
    fsdp = fsdp_per_microbatch(job)
    for pos, layer_id in stage_layers(job, crit.rank):
        kind = job.model.layer_kind(layer_id)
        lt = layer_time(job, kind, cal=cal)
        rg, ra, rm = recompute_kernels(job, kind, lt, job.recompute_mode(pos), cal)
        gemm += lt.gemm + lt.gemm_backward + rg
        attention += lt.attention + lt.attention_backward + ra
        memory += lt.elementwise + lt.elementwise_backward + lt.fp8_cast + lt.fp8_cast_backward + rm
        if fsdp:
            memory += fsdp_copy_seconds(job, layer_id, cal, crit.rank)
    memory += rank_memory_seconds(job, crit.rank, cal)
    if crit.rank == job.layout.pp - 1:
        heads = 1 + job.model.mtp_layers  # the output layer and loss again per MTP module (stage_time)
        gemm += heads * (head_time(job, cal) + head_backward_time(job, cal)) + sum(mtp_merge_seconds(job, cal))
        memory += heads * loss_time(job, cal)
    m = job.num_microbatches
    return Breakdown.of("s", gemm=gemm * m, attention=attention * m, elementwise=memory * m,
                        contention=float(est.breakdown.value("compute/contention")))
