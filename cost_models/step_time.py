"""Step time of a job: per-stage micro-batch time (compute + exposed tp/cp/ep/pp/FSDP communication),
the pipeline schedule around it, the data-parallel gradient tail and the optimizer step.

    step = m · T_max  +  bubble  +  dp tail  +  optimizer

T_r is one micro-batch's forward and backward through every model chunk of pipeline rank r,
T_max the slowest rank's. 1F1B and interleaved 1F1B keep every rank busy for m micro-batches
but the pipeline fills and drains around them: the bubble is (Σ_r T_r − T_max)/v, which is the
textbook (p−1)/(v·m) fraction of m·T when stages are equal (Narayanan et al. 2021, Sec. 2.2) and
lets an uneven stage (embedding, LM head) show as both a longer T_max and a longer fill. GPipe has
the same bubble as 1F1B (it differs in memory, not time).

Overlap model, per kind of communication:
- tp: exposed, or with tp_comm_overlap hidden behind the GEMMs of the same pass up to their length;
- cp: K/V ring steps hidden behind the attention kernel of the same pass up to its length;
- ep: the token all-to-alls are exposed (dispatch and combine sit between the router and the
  experts, and between the experts and the next layer);
- pp: each chunk's activation send/recv is on the critical path once per pass;
- FSDP / ZeRO-3: each layer's parameter all-gather is prefetched behind the previous layer's
  forward, its gradient reduce-scatter behind the next layer's backward; the first gather and the
  last reduce-scatter of a pass cannot hide;
- dp (DDP / distributed optimizer): gradients are reduced bucket by bucket during the last
  micro-batch's backward; what does not fit in that window, and at least the last bucket, is
  exposed. The distributed optimizer's parameter all-gather hides behind the next forward except
  the first bucket.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

from cost_models.breakdown import Breakdown
from cost_models.calibration import DEFAULT, Calibration
from cost_models.comm import Collective, collective_time, placement, send_recv_time
from cost_models.compute import ACT_BYTES, head_time, layer_time, loss_time, optimizer_time
from cost_models.enums import Framework, Precision, Recompute, Zero
from cost_models.flops import (
    GEMM_BACKWARD_FACTOR,
    attention_backward_factor,
    expert_tokens_per_gpu,
    head_gemm,
    layer_flops,
    model_flops_per_token,
    recomputed_share,
    tokens,
)
from cost_models.job import Job
from cost_models.states import dense_params, local_kv_heads, local_layer_params, rank_params

MIN_DDP_BUCKET_PARAMS = 40_000_000  # Megatron DDP bucket: max(40M, 1M x dp) params
BUCKET_PARAMS_PER_DP_RANK = 1_000_000  # (megatron/training/training.py, ddp_config.bucket_size)
DEEPSPEED_BUCKET_PARAMS = 500_000_000  # reduce_bucket_size (deepspeed/runtime/zero/config.py)

COMM_KINDS = ("tp", "cp", "ep", "pp", "dp")


@dataclass(frozen=True)
class LayerPass:
    """Seconds of one decoder layer for one micro-batch: forward, and backward with its recompute."""

    compute: Breakdown  # gemm, attention, elementwise, recompute
    forward_s: float  # the forward pass's share of compute
    comm: Breakdown  # exposed tp, cp, ep, dp (FSDP)
    flop: float  # executed FLOPs, forward + backward + recompute


def _grad_bytes(job: Job) -> int:
    """Bytes per gradient element in the data-parallel reduction: Megatron reduces its fp32 main
    grads for bf16 (accumulate_allreduce_grads_in_fp32 is forced on with --bf16, arguments.py) and
    fp16 grads for fp16; FSDP2 reduces in fp32 (torchtitan mixed_precision_reduce); DeepSpeed in
    the 16-bit dtype."""
    fw = job.training.framework
    if fw is Framework.DEEPSPEED or (fw is Framework.MEGATRON and job.training.precision is Precision.FP16):
        return 2
    return 4


def _tp_comm(job: Job, *, moe: bool) -> float:
    """One pass (forward, or backward) of a layer's tensor-parallel collectives: per block one
    all-reduce of the t x h activations (Megatron's f/g operators, Shoeybi et al. 2019), or with
    sequence parallel one all-gather and one reduce-scatter of the same tensor (Korthikanti et al.
    2022, Sec. 4.2.2), about the same time. An MoE layer's expert block has none over tp (tokens
    are dispatched from their sequence shard) but gathers its routed tokens over etp."""
    lay, cl = job.layout, job.cluster.spec
    size = tokens(job) * job.model.hidden_size * ACT_BYTES
    blocks = 1 if moe else 2
    out = 0.0
    if lay.tp > 1:
        where = placement(cl, lay.tp, 1)
        if job.sp:
            one = collective_time(Collective.ALL_GATHER, size, where, cl) + collective_time(Collective.REDUCE_SCATTER, size, where, cl)
        else:
            one = collective_time(Collective.ALL_REDUCE, size, where, cl)
        out += blocks * one
    if moe and job.etp > 1:
        routed = expert_tokens_per_gpu(job) * job.model.hidden_size * ACT_BYTES
        where = placement(cl, job.etp, 1)
        out += collective_time(Collective.ALL_GATHER, routed, where, cl) + collective_time(Collective.REDUCE_SCATTER, routed, where, cl)
    return out


def _cp_comm(job: Job) -> float:
    """Forward ring attention: cp−1 steps, each passing one rank's K and V chunk to its neighbour
    (Liu et al. 2023, Ring Attention; Megatron/TE p2p context parallel)."""
    lay = job.layout
    if lay.cp == 1:
        return 0.0
    kv = local_kv_heads(job) * job.model.head_size
    chunk = 2 * lay.mbs * job.seq_per_rank * kv * ACT_BYTES
    return (lay.cp - 1) * send_recv_time(chunk, stride=lay.tp if _cp_in_domain(job) else job.cluster.spec.scaleup_domain_gpus, cluster=job.cluster.spec)


def _cp_in_domain(job: Job) -> bool:
    return job.layout.tp * job.layout.cp <= job.cluster.spec.scaleup_domain_gpus


def _ep_comm(job: Job) -> float:
    """One pass of an MoE layer's token exchange: dispatch and combine all-to-alls, each moving the
    rank's routed token copies (t/tp x top_k) of width h (Megatron MoEAlltoAllTokenDispatcher)."""
    lay, cl = job.layout, job.cluster.spec
    if lay.ep == 1:
        return 0.0
    assert job.model.moe is not None
    size = tokens(job) // (lay.tp if job.sp else 1) * job.model.moe.top_k * job.model.hidden_size * ACT_BYTES
    return 2 * collective_time(Collective.ALL_TO_ALL, size, placement(cl, lay.ep, job.etp), cl)


def _fsdp_per_microbatch(job: Job) -> bool:
    """Parameters gathered and gradients reduce-scattered around every micro-batch: ZeRO-3 and
    FSDP2 without a pipeline (torchtitan reshards after forward only when pp = 1)."""
    return job.zero is Zero.PARAMETERS and (job.layout.pp == 1 or job.training.framework is Framework.DEEPSPEED)


def _dense_group(job: Job):
    return placement(job.cluster.spec, job.dense_shard_group, job.layout.tp)


def _expert_group(job: Job):
    return placement(job.cluster.spec, job.expert_shard_group, job.etp * job.layout.ep)


def fsdp_layer_comm(job: Job, layer_id: int) -> tuple[float, float]:
    key = ("fsdp_layer_comm", job.model.is_moe_layer(layer_id))
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


def layer_pass(job: Job, *, moe: bool, mode: Recompute, cal: Calibration) -> LayerPass:
    lt = layer_time(job, moe=moe, cal=cal)
    flops = layer_flops(job, moe=moe, mode=mode)
    attn_bwd = attention_backward_factor(job)
    share_gemm, share_attn = recomputed_share(job, mode)
    recompute = (
        share_gemm * (lt.gemm + lt.fp8_cast)
        + share_attn * lt.attention
        + (lt.elementwise if mode is Recompute.FULL else 0.0)
    )
    compute = Breakdown.of(
        "s",
        gemm=(1 + GEMM_BACKWARD_FACTOR) * lt.gemm,
        attention=(1 + attn_bwd) * lt.attention,
        # backward reads and writes about twice what forward does; fp8 casts are counted per pass
        elementwise=3 * lt.elementwise + lt.fp8_cast + lt.fp8_cast_backward,
        recompute=recompute,
        routing=(cal.moe_layer_overhead_s if moe else 0.0),
    )
    # passes that run the layer's forward collectives: forward, backward, and forward again under
    # full recompute (selective recompute repeats local work only)
    fwd_passes = 2 if mode is Recompute.FULL else 1
    tp_one = _tp_comm(job, moe=moe)
    if job.training.tp_comm_overlap:
        hidden = cal.tp_overlap_fraction * tp_one
        exposed_fwd = tp_one - min(hidden, lt.gemm)
        exposed_bwd = tp_one - min(hidden, GEMM_BACKWARD_FACTOR * lt.gemm)
    else:
        exposed_fwd = exposed_bwd = tp_one
    cp_one = _cp_comm(job)
    cp = fwd_passes * max(0.0, cp_one - lt.attention) + max(0.0, 2 * cp_one - attn_bwd * lt.attention)
    ep = (fwd_passes + 1) * _ep_comm(job) if moe else 0.0
    comm = Breakdown.of("s", tp=fwd_passes * exposed_fwd + exposed_bwd, cp=cp, ep=ep)
    return LayerPass(compute=compute, forward_s=lt.total, comm=comm, flop=flops.total)


@dataclass(frozen=True)
class StageTime:
    rank: int
    microbatch: Breakdown  # seconds of one micro-batch through all of the rank's chunks
    flop: float  # executed FLOPs of one micro-batch on one GPU of this rank
    dp_comm_s: float  # the gradient reduction (and parameter gather) left for the end of the step
    dp_window_s: float  # backward time of the last micro-batch, which that reduction can hide behind
    dp_bucket_s: float  # the part that can never hide (last bucket, first parameter bucket)
    optimizer_s: float

    @property
    def microbatch_s(self) -> float:
        return self.microbatch.total

    @property
    def dp_exposed_s(self) -> float:
        return max(self.dp_comm_s - self.dp_window_s, self.dp_bucket_s)


def dp_tail(job: Job, rank: int) -> tuple[float, float]:
    """(seconds, seconds that cannot hide) of the end-of-step data-parallel traffic of a rank."""
    lay, cl, z = job.layout, job.cluster.spec, job.zero
    p = rank_params(job, rank)
    dense = dense_params(p)
    experts = p.value("experts")
    if job.dense_shard_group == 1 and job.expert_shard_group == 1 and job.dp == 1:
        return 0.0, 0.0
    gb = _grad_bytes(job)
    groups = ((dense, _dense_group(job)), (experts, _expert_group(job)))
    total = first = 0.0
    fw = job.training.framework
    bucket = DEEPSPEED_BUCKET_PARAMS if fw is Framework.DEEPSPEED else max(MIN_DDP_BUCKET_PARAMS, BUCKET_PARAMS_PER_DP_RANK * job.dp)
    for params, where in groups:
        if params == 0 or where.n == 1:
            continue
        one_bucket = min(params, bucket)
        if z is Zero.NONE:
            t = collective_time(Collective.ALL_REDUCE, params * gb, where, cl)
            tail = collective_time(Collective.ALL_REDUCE, one_bucket * gb, where, cl)
        elif z is Zero.PARAMETERS:
            if _fsdp_per_microbatch(job):
                t = tail = 0.0  # per micro-batch, in the stage time
            else:
                # FSDP2 under a pipeline: gather once before the first forward, reduce-scatter
                # after the last backward; one layer's worth of each cannot hide
                t = collective_time(Collective.ALL_GATHER, params * ACT_BYTES, where, cl) + collective_time(
                    Collective.REDUCE_SCATTER, params * gb, where, cl
                )
                layers = max(1, len(job.stage_layer_ids(rank)))
                tail = t / layers
        else:
            rs = collective_time(Collective.REDUCE_SCATTER, params * gb, where, cl)
            ag = collective_time(Collective.ALL_GATHER, one_bucket * ACT_BYTES, where, cl)
            t = rs + ag
            tail = collective_time(Collective.REDUCE_SCATTER, one_bucket * gb, where, cl) + ag
        total += t
        first += tail
    if lay.dp_shard is not None and lay.dp_shard < job.dp and z >= Zero.OPTIMIZER:
        # HSDP: the shard group's result is all-reduced across the dp/dp_shard replicas
        replicas = placement(cl, job.dp // lay.dp_shard, lay.tp * lay.cp * lay.dp_shard)
        total += collective_time(Collective.ALL_REDUCE, dense * gb / job.dense_shard_group, replicas, cl)
    return total, first


def _optimizer_params(job: Job, rank: int) -> float:
    p = rank_params(job, rank)
    dense = dense_params(p)
    if job.zero >= Zero.OPTIMIZER:
        return dense / job.dense_shard_group + p.value("experts") / job.expert_shard_group
    return dense + p.value("experts")


def stage_time(job: Job, rank: int, cal: Calibration, passes: dict[tuple[bool, Recompute], LayerPass]) -> StageTime:
    lay, cl = job.layout, job.cluster.spec
    parts = {k: 0.0 for k in ("gemm", "attention", "elementwise", "recompute", "routing", "loss")}
    comm = {k: 0.0 for k in COMM_KINDS}
    flop = 0.0
    backward_s = 0.0
    fsdp = _fsdp_per_microbatch(job) and job.dense_shard_group > 1
    gathers: list[float] = []
    reduces: list[float] = []
    fwd_compute: list[float] = []
    bwd_compute: list[float] = []
    for chunk in job.stage_chunks[rank]:
        for pos, layer_id in enumerate(chunk):
            moe = job.model.is_moe_layer(layer_id)
            lp = passes[moe, job.recompute_mode(pos)]
            for name in ("gemm", "attention", "elementwise", "recompute", "routing"):
                parts[name] += lp.compute.value(name)
            for name in ("tp", "cp", "ep"):
                comm[name] += lp.comm.value(name)
            flop += lp.flop
            fwd_compute.append(lp.forward_s)
            bwd_compute.append(lp.compute.total - lp.forward_s)
            backward_s += lp.compute.total - lp.forward_s
            if fsdp:
                g, r = fsdp_layer_comm(job, layer_id)
                gathers.append(g)
                reduces.append(r)
    if fsdp and gathers:
        # prefetch: layer i's gather hides behind layer i−1's compute; backward gathers again
        # (reshard after forward) and reduce-scatters layer i behind layer i−1's backward
        fwd_exposed = gathers[0] + sum(max(0.0, g - c) for g, c in zip(gathers[1:], fwd_compute[:-1]))
        bwd_exposed = gathers[-1] + reduces[0] + sum(
            max(0.0, g + r - c) for g, r, c in zip(gathers[:-1], reduces[1:], bwd_compute[1:])
        )
        comm["dp"] += fwd_exposed + bwd_exposed
    first, last = rank == 0, rank == lay.pp - 1
    if last:
        head = head_time(job, cal)
        parts["gemm"] += (1 + GEMM_BACKWARD_FACTOR) * head
        parts["loss"] += loss_time(job, cal)
        flop += (1 + GEMM_BACKWARD_FACTOR) * head_gemm(job).flop
        backward_s += GEMM_BACKWARD_FACTOR * head
    if lay.pp > 1:
        # each chunk receives its input in forward and its output gradient in backward; the
        # first chunk of rank 0 and the last chunk of the last rank have one neighbour less
        boundary = tokens(job) // (lay.tp if job.sp else 1) * job.model.hidden_size * ACT_BYTES
        hops = 2 * lay.vpp - (1 if first else 0) - (1 if last else 0)
        stride = lay.tp * lay.cp * job.dp
        comm["pp"] = hops * send_recv_time(boundary, stride=stride, cluster=cl)
    dp_comm, dp_bucket = dp_tail(job, rank)
    microbatch = Breakdown.of("s", compute=Breakdown.of("s", **parts), **comm)
    return StageTime(
        rank=rank,
        microbatch=microbatch,
        flop=flop,
        dp_comm_s=dp_comm,
        dp_window_s=backward_s,
        dp_bucket_s=dp_bucket,
        optimizer_s=optimizer_time(job, _optimizer_params(job, rank), cal),
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
    def dp_tail_s(self) -> float:
        """The stage that finishes last sets the tail: stage r's last backward ends about r
        backward passes before stage 0's, which leaves it that much more time."""
        return max(max(0.0, s.dp_exposed_s - s.rank * s.dp_window_s) for s in self.stages)

    @cached_property
    def breakdown(self) -> Breakdown:
        m = self.job.num_microbatches
        per_mb = self.critical.microbatch.scaled(m)
        comm = {k: per_mb.value(k) for k in COMM_KINDS}
        comm["dp"] += self.dp_tail_s
        return Breakdown.of(
            "s",
            compute=per_mb["compute"],
            **comm,
            bubble=self.bubble_s,
            optimizer=max(s.optimizer_s for s in self.stages),
        )

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
        return self.hardware_flop_per_step / self.step_s / self.job.gpus / self.peak_flop_per_s

    @property
    def bottleneck(self) -> str:
        """The largest part of the step: compute, tp, cp, ep, pp, dp, bubble or optimizer."""
        name, _ = max(((n, float(self.breakdown.value(n))) for n, _ in self.breakdown), key=lambda x: x[1])
        return name


def time_estimate(job: Job, *, calibration: Calibration = DEFAULT) -> TimeEstimate:
    modes = {job.recompute_mode(0), job.recompute_mode(10**9), job.layout.recompute, Recompute.NONE}
    kinds = {job.model.is_moe_layer(i) for i in range(job.model.num_layers)}
    passes = {(moe, mode): layer_pass(job, moe=moe, mode=mode, cal=calibration) for moe in kinds for mode in modes}
    alike: dict[tuple, StageTime] = {}  # ranks with equal signatures cost the same
    stages = []
    for r in range(job.layout.pp):
        sig = job.rank_signature(r)
        if sig not in alike:
            alike[sig] = stage_time(job, r, calibration, passes)
        stages.append(replace(alike[sig], rank=r))
    return TimeEstimate(job=job, stages=tuple(stages), calibration=calibration)
