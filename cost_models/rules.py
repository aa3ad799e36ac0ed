"""The rules a layout must obey, per framework, as named predicates; `resolve` applies them.

Each rule returns None when it holds, else a message that names the fields, shows the arithmetic
and says what would be accepted. Sources are the validation code of each framework, as listed in
shared/reference/launch_formats.md (Megatron §1.3, torchtitan §2.6, DeepSpeed §3) and cited per rule.
The same predicates serve the search, so a rejected layout always carries a readable reason.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from operator import attrgetter

from cost_models import deepep, kernels, mamba_shard
from cost_models.enums import AmaxGroup, AttentionBackend, AttentionKernel, Fp8Recipe, Framework, MoEDispatch, OptimizerKind, PositionKind, Precision, Recompute, Schedule, Zero
from cost_models.errors import SpecError
from cost_models.hardware import Cluster, GPUSpec
from cost_models.job import Job
from cost_models.pipeline_split import layout_errors, parse_pp_layout, stage_layer_counts
from cost_models.layout import Layout
from cost_models.model_spec import ModelSpec
from cost_models.training import TrainingSpec

MEGATRON, TITAN, DEEPSPEED = Framework.MEGATRON, Framework.TORCHTITAN, Framework.DEEPSPEED
ALL = frozenset(Framework)

# Defaults each framework applies when a flag is not given.
DEFAULT_ZERO = {
    MEGATRON: Zero.NONE,  # DDP unless --use-distributed-optimizer
    TITAN: Zero.PARAMETERS,  # FSDP2 fully_shard, reshard after forward
    DEEPSPEED: Zero.NONE,  # zero_optimization.stage defaults to 0
}


def _divisors(n: int) -> str:
    ds = [d for d in range(1, n + 1) if n % d == 0]
    return ", ".join(map(str, ds if len(ds) <= 12 else ds[:6] + ["…"] + ds[-3:]))


def _mul(**axes: int) -> str:
    return "·".join(f"{k}({v})" for k, v in axes.items())


@dataclass(frozen=True)
class Rule:
    name: str
    frameworks: frozenset[Framework]
    check: Callable[[Job], str | None]
    source: str


def fill_defaults(model: ModelSpec, cluster: Cluster, training: TrainingSpec, layout: Layout) -> Job:
    """Derive dp, etp, sp, zero, dp_shard, schedule and a missing global batch; raise SpecError if dp
    cannot be derived."""
    fw, lay, gpus = training.framework, layout, cluster.num_gpus
    model_par = lay.tp * lay.pp * lay.cp
    if gpus % model_par:
        raise SpecError(f"{_mul(tp=lay.tp, pp=lay.pp, cp=lay.cp)} = {model_par} does not divide gpus({gpus})")
    dp = gpus // model_par
    if lay.dp is not None and lay.dp != dp:
        raise SpecError(
            f"{_mul(tp=lay.tp, pp=lay.pp, cp=lay.cp, dp=lay.dp)} = {model_par * lay.dp} != gpus({gpus}); "
            f"dp must be {dp}"
        )
    sp = lay.sp if lay.sp is not None else (lay.tp > 1 and fw is not DEEPSPEED)
    etp = lay.etp if lay.etp is not None else (lay.tp if fw is MEGATRON else 1)
    zero = lay.zero if lay.zero is not None else DEFAULT_ZERO[fw]
    vpp = _layout_vpp(lay)
    schedule = lay.schedule or (Schedule.INTERLEAVED if vpp > 1 else Schedule.ONE_F_ONE_B)
    filled = lay.model_copy(
        update=dict(dp=dp, sp=sp, etp=etp, zero=Zero(zero), schedule=schedule, dp_shard=lay.dp_shard or dp, vpp=vpp)
    )
    if training.global_batch_size is None:
        microbatches = 1 if lay.pp == 1 else 4 * lay.pp
        training = training.model_copy(update=dict(global_batch_size=lay.mbs * dp * microbatches))
    return Job(model=model, cluster=cluster, training=training, layout=filled)


def _layout_vpp(lay: Layout) -> int:
    """vpp as an explicit pipeline layout sets it: its stages over pp (Megatron arguments.py L941-951).
    A layout that does not parse or split over pp keeps the given vpp; the pipeline_split rule says why."""
    if lay.pp_layout is None:
        return lay.vpp
    try:
        stages = len(parse_pp_layout(lay.pp_layout))
    except ValueError:
        return lay.vpp
    if stages % lay.pp:
        return lay.vpp
    if lay.vpp not in (1, stages // lay.pp):
        raise SpecError(f"vpp({lay.vpp}) disagrees with pp_layout: {stages} stages over pp({lay.pp}) make vpp {stages // lay.pp}; "
                        "drop vpp or make them agree")
    return stages // lay.pp


# --- rules --------------------------------------------------------------------------------------


def _heads(job: Job) -> str | None:
    a, tp = job.model.num_attention_heads, job.layout.tp
    if a % tp:
        return f"num_attention_heads({a}) is not divisible by tp({tp}); tp must divide {a}: one of {_divisors(a)}"
    return None


def _kv_heads_megatron(job: Job) -> str | None:
    g, tp = job.model.kv_heads, job.layout.tp
    if g % tp and tp % g:
        return f"num_kv_heads({g}) and tp({tp}) must divide one another (Megatron num_query_groups rule)"
    return None


def _kv_heads_titan(job: Job) -> str | None:
    g, tp = job.model.kv_heads, job.layout.tp
    if g % tp:
        return f"num_kv_heads({g}) is not divisible by tp({tp}); torchtitan shards whole K/V heads: tp in {_divisors(g)}"
    return None


def _ffn(job: Job) -> str | None:
    m, lay = job.model, job.layout
    if any(k.mlp and not k.moe for k in m.layer_kinds) and m.ffn_hidden_size % lay.tp:
        return f"ffn_hidden_size({m.ffn_hidden_size}) is not divisible by tp({lay.tp})"
    if m.moe and m.moe.expert_ffn_hidden_size % job.etp:
        return f"expert_ffn_hidden_size({m.moe.expert_ffn_hidden_size}) is not divisible by etp({job.etp})"
    return None


def _hybrid_framework(job: Job) -> str | None:
    if job.model.hybrid_pattern is not None:
        return (f"model {job.model.name!r} has Mamba-2 / hybrid layers, which {job.training.framework} does not run here "
                "(torchtitan ships no Mamba mixer; DeepSpeed's transformers NemotronH runs mamba_ssm's kernels or a torch "
                "fallback, which this planner does not price); "
                "use --framework megatron (Megatron-LM pretrain_hybrid.py)")
    return None


def _mamba_tp(job: Job) -> str | None:
    mb, tp = job.model.mamba, job.layout.tp
    if mb is None:
        return None
    if mb.num_heads % tp or mb.num_groups % tp:
        return (f"mamba num_heads({mb.num_heads}) and num_groups({mb.num_groups}) must both be divisible by tp({tp}); "
                f"tp in {_divisors(math.gcd(mb.num_heads, mb.num_groups))}")
    return None


def _mamba_cp(job: Job) -> str | None:
    mb, tp, cp = job.model.mamba, job.layout.tp, job.layout.cp
    if mb is None:
        return None
    error = mamba_shard.cp_error(mb, tp, cp)
    if error:
        return f"{error} (Megatron's Mamba context parallel splits heads and groups over cp); cp in {', '.join(map(str, mamba_shard.cp_values(mb, tp)))}"
    return None


def _seq_cp(job: Job) -> str | None:
    s, cp = job.training.seq_len, job.layout.cp
    if cp > 1 and s % (2 * cp):
        return f"seq_len({s}) is not divisible by 2·cp({cp}) = {2 * cp} (load-balanced context parallel)"
    return None


def _seq_sp(job: Job) -> str | None:
    s, cp, tp = job.training.seq_len, job.layout.cp, job.layout.tp
    if job.sp and (s // cp) % tp:
        return f"seq_len({s})/cp({cp}) = {s // cp} is not divisible by tp({tp}), as sequence parallel needs"
    return None


def _seq_titan(job: Job) -> str | None:
    s, tp, cp = job.training.seq_len, job.layout.tp, job.layout.cp
    d = tp * 2 * cp
    if s % d:
        return f"seq_len({s}) is not divisible by tp({tp})·2·cp({cp}) = {d} (torchtitan seq_len_divisor)"
    return None


def _positions(job: Job) -> str | None:
    m, s = job.model, job.training.seq_len
    if m.position_embedding is PositionKind.LEARNED and s > m.max_position_embeddings:
        return (f"seq_len({s}) exceeds max_position_embeddings({m.max_position_embeddings}) of the learned position table; "
                f"use --seq-len {m.max_position_embeddings} or less")
    return None


def _sp_needs_tp(job: Job) -> str | None:
    if job.sp and job.layout.tp == 1:
        return "sequence parallel needs tp > 1; drop --sp or raise tp"
    return None


def _pipeline_split(job: Job) -> str | None:
    lay, n = job.layout, job.model.num_layers
    first, last, pp, vpp = lay.pp_first_stage_layers, lay.pp_last_stage_layers, lay.pp, lay.vpp
    accounted = lay.account_for_embedding or lay.account_for_loss
    if pp == 1:
        given = [name for name, on in (("pp_first/last_stage_layers", first is not None or last is not None),
                                       ("account_for_embedding/loss", accounted), ("pp_layout", lay.pp_layout is not None)) if on]
        if given == ["pp_layout"]:
            try:
                parsed = parse_pp_layout(lay.pp_layout)  # type: ignore[arg-type]
            except ValueError as e:
                return f"pp_layout: {e}"
            count = len(parsed)
            broken = layout_errors(parsed, n, count)
            if broken:  # wrong at any pp: say that first
                return broken
            depths = [d for d in range(2, count + 1) if count % d == 0]
            return (f"pp_layout needs pp > 1: give --pp {' or '.join(map(str, depths))} for its {count} stages"
                    if depths else "pp_layout needs pp > 1: it has 1 stage; separate the stages with '|'")
        if given:
            return f"{' and '.join(given)} need pp > 1; give --pp too, or drop them"
        return None if vpp == 1 else f"vpp({vpp}) needs pp > 1; give --pp too, or drop --vpp"
    if lay.pp_layout is not None:
        # transformer_config.py L2244-2260: the layout excludes the other split arguments
        if first is not None or last is not None or accounted:
            return "pp_layout cannot be combined with pp_first/last_stage_layers or account_for_embedding/loss"
        try:
            stages = parse_pp_layout(lay.pp_layout)
        except ValueError as e:
            return f"pp_layout: {e}"
        return layout_errors(stages, n, pp)
    if accounted:
        # transformer_config.py L2229-2240
        if first is not None or last is not None:
            return "account_for_embedding/loss cannot be combined with pp_first/last_stage_layers (Megatron refuses both)"
        units = n + int(lay.account_for_embedding) + int(lay.account_for_loss)
        if units % (pp * vpp):
            return (f"num_layers({n}) + {units - n} accounted = {units} is not divisible by pp({pp})·vpp({vpp}); "
                    f"pp·vpp must divide {units}: one of {_divisors(units)}")
        return None
    if first is None and last is None:
        if n % pp:
            return f"num_layers({n}) is not divisible by pp({pp}); pp in {_divisors(n)}, or {_split_hint(n, pp, vpp)}"
        if (n // pp) % vpp:
            return (f"num_layers({n})/pp({pp}) = {n // pp} layers per rank is not divisible by vpp({vpp}); "
                    f"vpp in {_divisors(n // pp)}, or {_split_hint(n, pp, vpp)}")
        return None
    ends = [x for x in (first, last) if x is not None]
    middle = pp - len(ends)
    rest = n - sum(ends)
    if rest < middle or (middle == 0 and rest != 0) or (middle and rest % middle):
        return (
            f"num_layers({n}) - first/last stage layers({sum(ends)}) = {rest} does not split evenly over "
            f"the {middle} middle stages; or {_split_hint(n, pp, vpp)}"
        )
    for count in stage_layer_counts(n, pp, first, last):
        if count % vpp:
            return f"a stage with {count} layers cannot be split into vpp({vpp}) equal chunks; or {_split_hint(n, pp, vpp)}"
    return None


def _split_hint(n: int, pp: int, vpp: int) -> str:
    """What else would make n decoder layers legal on pp·vpp stages in Megatron."""
    stages = pp * vpp
    if (n + 2) % stages == 0:
        return (f"count the embedding and the loss as layers (--account-for-embedding --account-for-loss: "
                f"{n + 2} = {stages}·{(n + 2) // stages})")
    if (n + 1) % stages == 0:
        return (f"count the embedding or the loss as a layer (--account-for-embedding or --account-for-loss: "
                f"{n + 1} = {stages}·{(n + 1) // stages})")
    return "give every stage's layers with --pp-layout (Megatron --pipeline-model-parallel-layout)"


def _global_batch(job: Job) -> str | None:
    b, mbs, dp = job.training.global_batch_size, job.layout.mbs, job.dp
    if b % (mbs * dp):
        return f"global_batch_size({b}) is not divisible by mbs({mbs})·dp({dp}) = {mbs * dp}; {nearest_batches(b, mbs * dp)}"
    return None


def nearest_batches(b: int, step: int) -> str:
    """The global batches either side of b that `step` (mbs·dp) divides."""
    near = [n for n in ((b // step) * step, (b // step + 1) * step) if n > 0]
    return f"the nearest multiple{'s' if len(near) > 1 else ''} of {step}: --global-batch-size {' or '.join(map(str, near))}"


def _interleaved_megatron(job: Job) -> str | None:
    lay, m = job.layout, job.num_microbatches
    if job.schedule is Schedule.INTERLEAVED:
        if lay.vpp == 1:
            return "the interleaved schedule needs vpp > 1; give --vpp too, or another --schedule"
        if m % lay.pp:
            return f"interleaved 1F1B needs micro-batches({m}) divisible by pp({lay.pp}) (microbatch group = pp)"
    elif lay.vpp > 1:
        return f"vpp({lay.vpp}) > 1 runs only with the interleaved schedule, not {job.schedule}"
    return None


def _pipeline_titan(job: Job) -> str | None:
    lay, m = job.layout, job.num_microbatches
    if lay.pp == 1:
        return None
    if job.schedule is Schedule.INTERLEAVED:
        if lay.vpp == 1:
            return "the interleaved schedule needs vpp > 1"
        rounds = max(1, m // lay.pp)
        if m % rounds:
            return f"Interleaved1F1B needs micro-batches({m}) to be a multiple of its rounds ({rounds} = {m}//pp({lay.pp}))"
    elif lay.vpp > 1:
        return f"vpp({lay.vpp}) > 1 needs a multi-stage schedule (interleaved), not {job.schedule}"
    elif m < lay.pp:
        return f"{job.schedule} needs micro-batches({m}) >= pp({lay.pp}) (torch.distributed.pipelining)"
    return None


def _moe(job: Job) -> str | None:
    m, lay = job.model, job.layout
    if m.moe is None:
        if lay.ep > 1:
            return f"ep({lay.ep}) > 1 needs a mixture-of-experts model; {m.name} is dense"
        return None
    if m.moe.num_experts % lay.ep:
        return f"num_experts({m.moe.num_experts}) is not divisible by ep({lay.ep}); ep in {_divisors(m.moe.num_experts)}"
    return None


def _expert_grid_megatron(job: Job) -> str | None:
    lay, g = job.layout, job.gpus
    d = job.etp * lay.ep * lay.pp
    if g % d:
        return f"{_mul(etp=job.etp, ep=lay.ep, pp=lay.pp)} = {d} does not divide gpus({g}) (Megatron expert grid)"
    return None


def _expert_grid_titan(job: Job) -> str | None:
    lay = job.layout
    if job.etp not in (1, lay.tp):
        return f"etp({job.etp}) must be 1 or tp({lay.tp}) in torchtitan"
    assert lay.dp_shard is not None
    pool = lay.dp_shard * lay.cp * lay.tp  # the ranks torchtitan carves EP (x ETP) out of
    if pool % (lay.ep * job.etp):
        return f"ep({lay.ep})·etp({job.etp}) must divide dp_shard({lay.dp_shard})·cp({lay.cp})·tp({lay.tp}) = {pool} in torchtitan"
    return None


def _zero_titan(job: Job) -> str | None:
    lay, z = job.layout, job.zero
    if z is Zero.OPTIMIZER:
        return "torchtitan shards with FSDP2 only: use zero 3 (reshard after forward), 2 (no reshard) or 0 (DDP)"
    if z is Zero.NONE and (lay.tp > 1 or lay.pp > 1 or lay.cp > 1 or lay.ep > 1):
        return "torchtitan's DDP (zero 0) does not combine with tp/pp/cp/ep; use zero 2 or 3"
    return None


def _zero_deepspeed(job: Job) -> str | None:
    if job.layout.pp > 1 and job.zero >= Zero.GRADIENTS:
        return f"DeepSpeed pipeline parallelism runs with ZeRO 0 or 1 only, not {int(job.zero)}"
    return None


def _deepspeed_axes(job: Job) -> str | None:
    lay = job.layout
    if lay.account_for_embedding or lay.account_for_loss or lay.pp_layout is not None:
        return ("account_for_embedding/loss and pp_layout are Megatron's pipeline splits; DeepSpeed's PipelineModule "
                "places layers by its partition_method: use megatron or torchtitan, or pp_first/last_stage_layers")
    if lay.cp > 1:
        return "DeepSpeed has no context parallelism (cp must be 1); use megatron or torchtitan"
    if lay.vpp > 1 or job.schedule is not Schedule.ONE_F_ONE_B:
        return "DeepSpeed's pipeline engine runs 1F1B only (vpp must be 1)"
    if job.sp:
        return "DeepSpeed AutoTP has no sequence parallel; drop --sp"
    if lay.recompute is Recompute.SELECTIVE:
        return "DeepSpeed checkpoints whole layers only: use recompute none or full"
    return None


def _dp_shard(job: Job) -> str | None:
    lay = job.layout
    assert lay.dp_shard is not None
    if job.dp % lay.dp_shard:
        return f"dp_shard({lay.dp_shard}) does not divide dp({job.dp}); dp_shard in {_divisors(job.dp)}"
    if lay.dp_shard < job.dp and job.zero is Zero.NONE:
        return f"dp_shard({lay.dp_shard}) < dp({job.dp}) shards states, which needs zero >= 1"
    return None


def _recompute_layers(job: Job) -> str | None:
    lay = job.layout
    if lay.recompute_layers is None:
        return None
    if lay.recompute is not Recompute.FULL:
        return f"recompute_layers applies to full recompute only (recompute={lay.recompute}); add --recompute full or drop --recompute-layers"
    fewest = min(len(job.stage_layer_ids(r)) for r in range(lay.pp))
    if lay.recompute_layers > fewest:
        return f"recompute_layers({lay.recompute_layers}) exceeds the {fewest} layers of the smallest stage"
    return None


def _cp_flash(job: Job) -> str | None:
    if job.layout.cp > 1 and job.training.attention is not AttentionKernel.FLASH:
        return "context parallel needs a fused (flash) attention kernel"
    return None


def _cp_local_attention(job: Job) -> str | None:
    m = job.model
    if job.layout.cp > 1 and (m.sliding_window is not None or m.attention_chunk_size is not None):
        what = f"sliding-window ({m.sliding_window})" if m.sliding_window else f"chunked ({m.attention_chunk_size})"
        return (
            f"context parallel (cp={job.layout.cp}) with {what} attention layers: Transformer Engine's p2p ring refuses "
            "sliding windows (only its a2a and all_gather exchanges take them) and the planner prices the causal p2p / "
            "all-gather ring only; use cp 1"
        )
    return None


def _hf_attention(job: Job) -> str | None:
    m = job.model
    if job.training.attention is AttentionKernel.FLASH and (m.attn_logit_softcap or m.attention_sinks):
        what = "soft-capped scores" if m.attn_logit_softcap else "attention sinks"
        return (
            f"{what}: transformers' Gemma2 and GptOss models have no SDPA path (_supports_sdpa = False), so DeepSpeed's "
            "train.py runs them with eager attention; use --attention eager"
        )
    return None


def _sinks_backend(job: Job) -> str | None:
    chosen = job.training.attention_backend
    if job.model.attention_sinks and job.training.attention is AttentionKernel.FLASH and chosen not in (None, AttentionBackend.CUDNN):
        return (
            f"attention sinks with --attention-backend {chosen.value}: Transformer Engine disables FlashAttention for "
            "softmax_type learnable and runs cuDNN's FusedAttention; use --attention-backend cudnn"
        )
    if job.model.attention_sinks and job.layout.cp > 1:
        return (
            f"attention sinks with context parallel (cp={job.layout.cp}): Transformer Engine's FusedAttention takes them "
            "only with cp_comm_type a2a, and the planner prices the p2p ring (Megatron's default); use cp 1"
        )
    return None


def _attention_backend_available(job: Job) -> str | None:
    """A named fused-attention family the GPU's kernel generation runs (presets/kernels/<architecture>.toml):
    cuDNN, FA3 and FA4 are NVIDIA libraries and kernels, absent on ROCm; SDPA's flash backend picks its
    own (compute.attention_backend)."""
    chosen, gpu = job.training.attention_backend, job.cluster.gpu
    if (job.training.attention is not AttentionKernel.FLASH or chosen in (None, AttentionBackend.SDPA_FLASH)
            or kernels.family_available(gpu, chosen)):
        return None
    have = ", ".join(sorted(f.value for f in kernels.table_for(gpu).attention))
    return (f"attention_backend {chosen.value}: {gpu.name} ({gpu.architecture or 'no architecture'}) runs no such kernels; "
            f"use one of {have}")


def _compile(job: Job) -> str | None:
    if job.training.compile:
        return f"compile is modelled for torchtitan jobs only, not {job.training.framework}"
    return None


def _tp_comm_overlap(job: Job) -> str | None:
    tr = job.training
    if tr.ub_ring_exchange_rs and not (tr.tp_comm_overlap and tr.framework is MEGATRON):
        return (f"ub_ring_exchange_rs picks Transformer Engine userbuffers' method under Megatron --tp-comm-overlap "
                f"(framework={tr.framework}, tp_comm_overlap={tr.tp_comm_overlap}); set both or drop it")
    if not job.training.tp_comm_overlap:
        return None
    if job.layout.tp == 1 or not job.sp:
        return f"tp_comm_overlap needs tp > 1 with sequence parallel (tp={job.layout.tp}, sp={job.sp})"
    if job.training.framework is DEEPSPEED:
        return "tp_comm_overlap is a Megatron (--tp-comm-overlap) or torchtitan (async TP) feature"
    return None


@dataclass(frozen=True)
class FrameworkSwitches:
    """TrainingSpec switches that describe one framework's code, priced only as a `framework` job;
    `message` is a str.format template with {names} (those set), {describe} ("describes" after one name,
    "describe" after several) and {framework} (the job's)."""

    fields: tuple[str, ...]
    framework: Framework
    message: str


# nanotron's switches: nanotron is priced as a Megatron job
NANOTRON_SWITCHES = FrameworkSwitches(
    ("grads_kept_through_backward", "ddp_buckets", "loss_shift_out_of_place", "eager_swiglu",
     "zero1_blocking_sync", "qkv_copy_kept", "tp_gather_buffers", "tp_scatter_inputs_pending"),
    MEGATRON, "{names} {describe} nanotron's code, priced as a Megatron job (framework={framework}); drop it")
TITAN_SWITCHES = FrameworkSwitches(
    ("fsdp_reshard_after_forward", "tp_gather_per_projection", "bf16_params", "fsdp_sync_last_microbatch",
     "tp_replicated_vocab", "loss_on_16bit_logits", "compile_whole_model", "pipeline_keeps_outputs",
     "fsdp_reduce_in_bf16", "fsdp_flat_params", "fused_rms_norm", "fsdp_split_root", "sac_recomputes_all_to_all"),
    TITAN, "{names} {describe} an FSDP2/DTensor plan (framework torchtitan), not framework={framework}; drop it")


def _switched(tr: TrainingSpec, names: tuple[str, ...]) -> list[str]:
    """The fields among `names` set away from TrainingSpec's default."""
    return [n for n in names if getattr(tr, n) != TrainingSpec.model_fields[n].default]


def _megatron_grad_flags(job: Job) -> str | None:
    tr = job.training
    megatron = _switched(tr, ("grad_accumulation_fusion", "overlap_grad_reduce"))
    if megatron and tr.framework is not MEGATRON:
        return (f"{' and '.join(megatron)}=False is Megatron's --no-gradient-accumulation-fusion / default of no "
                f"--overlap-grad-reduce (framework={tr.framework}); drop it")
    return None


def _megatron_only(field: str, what: str, job: Job) -> str | None:
    """The message for a TrainingSpec switch that describes Megatron's code, set away from its
    default on another framework; None where it is not."""
    tr = job.training
    if tr.framework is MEGATRON or not _switched(tr, (field,)):
        return None
    return f"{field} {what} (framework={tr.framework}); drop it, or use framework megatron"


def _megatron_rule(field: str, what: str, *, source: str) -> Rule:
    """The SWITCH_RULES rule, named after its field, that checks one switch of Megatron's code
    (_megatron_only)."""
    return Rule(field, ALL, partial(_megatron_only, field, what), source)


@dataclass(frozen=True)
class SwitchNeeds:
    """A TrainingSpec switch that describes `framework`'s code on a path that runs only where
    `needs`, a job attribute such as "training.attention" or "model.qkv_bias", is one of `accepted`."""

    field: str
    framework: Framework
    needs: str
    accepted: frozenset[object]
    describes: str  # what the switch is, said after its name
    remedy: str


def _switch_needs(switch: SwitchNeeds, job: Job) -> str | None:
    """The message for `switch` set on another framework or where its path does not run; None where
    it is off or holds."""
    tr, have = job.training, attrgetter(switch.needs)(job)
    if not _switched(tr, (switch.field,)) or (tr.framework is switch.framework and have in switch.accepted):
        return None
    return (f"{switch.field} {switch.describes} (framework={tr.framework}, {switch.needs.rpartition('.')[2]}={have}); "
            f"{switch.remedy}")


def _needs_rule(field: str, framework: Framework, needs: str, accepted: frozenset[object] | set[object],
                describes: str, remedy: str, *, source: str) -> Rule:
    """The SWITCH_RULES rule, named after its field, that checks one SwitchNeeds."""
    switch = SwitchNeeds(field, framework, needs, frozenset(accepted), describes, remedy)
    return Rule(field, ALL, partial(_switch_needs, switch), source)


def _framework_switches(switches: FrameworkSwitches, job: Job) -> str | None:
    """The message for `switches` set on a job of another framework; None where none is set or the
    framework is theirs."""
    tr = job.training
    names = _switched(tr, switches.fields)
    if names and tr.framework is not switches.framework:
        return switches.message.format(names=" and ".join(names), describe="describes" if len(names) == 1 else "describe",
                                       framework=tr.framework)
    return None


def _apex_framework(job: Job) -> str | None:
    if job.training.apex_distributed_adam and job.training.framework is not MEGATRON:
        return _apex_distributed_adam(job)
    return None


def _grads_kept_through_backward(job: Job) -> str | None:
    tr = job.training
    if tr.grads_kept_through_backward and tr.grad_accumulation_fusion:
        return ("grads_kept_through_backward describes 16-bit gradients written outside the GEMMs; "
                "it needs grad_accumulation_fusion=False")
    return None


def _loss_on_16bit_logits(job: Job) -> str | None:
    tr = job.training
    if tr.loss_on_16bit_logits and tr.compiles_loss:
        return ("loss_on_16bit_logits describes an eager cross entropy outside the compiled model; "
                "it needs compile_loss=False")
    return None


def _compile_whole_model(job: Job) -> str | None:
    tr = job.training
    if tr.compile_whole_model and not tr.compile:
        return "compile_whole_model describes how torch.compile wraps the model; it needs compile=True"
    return None


def _bf16_params(job: Job) -> str | None:
    tr = job.training
    if tr.bf16_params and tr.precision is not Precision.BF16:
        return f"bf16_params keeps the parameters in bf16, the compute dtype of precision bf16 (precision={tr.precision}); drop it"
    if tr.bf16_params and tr.optimizer is OptimizerKind.DECOUPLED_ADAMW:
        return ("bf16_params describes torch's AdamW or SGD on bf16 parameters (optimizer=decoupled_adamw, Composer's "
                "fp32 per-op update); drop it, or use optimizer adamw, adam or sgd")
    return None


def _nccl_max_ctas(job: Job) -> str | None:
    tr = job.training
    if tr.nccl_max_ctas is None or tr.framework is MEGATRON:
        return None
    return (f"nccl_max_ctas is Megatron's --nccl-communicator-config-path (per-group max_ctas; framework={tr.framework}); "
            "drop it, or set NCCL_MAX_CTAS for the whole job instead")


def _decoupled_adamw(job: Job) -> str | None:
    if job.training.optimizer is OptimizerKind.DECOUPLED_ADAMW:
        return (f"optimizer decoupled_adamw is Composer's DecoupledAdamW (llm-foundry), priced under FSDP as framework "
                f"torchtitan, not {job.training.framework}; use adamw")
    return None


def _apex_distributed_adam(job: Job) -> str:
    return (f"apex_distributed_adam is NeMo 1's Apex DistributedFusedAdam, a zero-1 optimizer on Megatron's model "
            f"(framework={job.training.framework}, zero {int(job.zero)}); drop it, or use framework megatron with zero 1")


def _switch_layout(job: Job) -> str | None:
    """The TrainingSpec switches that some layouts of their framework cannot take (so not a
    PROBLEM_RULES rule: the search keeps the layouts that can)."""
    tr = job.training
    if tr.apex_distributed_adam and job.zero is not Zero.OPTIMIZER:
        return _apex_distributed_adam(job)
    if tr.zero1_blocking_sync and job.zero is not Zero.OPTIMIZER:
        return (f"zero1_blocking_sync describes nanotron's ZeRO-1 gradient and parameter sync; it needs zero 1, "
                f"not zero {int(job.zero)}")
    if tr.pipeline_keeps_outputs and job.layout.pp == 1:
        return "pipeline_keeps_outputs describes torch.distributed.pipelining's stages; it needs pp > 1 (pp=1)"
    return None


def _fp8_recipe(job: Job) -> str | None:
    recipe, tr = job.training.fp8_recipe, job.training
    if recipe is Fp8Recipe.TENSORWISE:
        return None
    if tr.precision is not Precision.FP8:
        return f"fp8_recipe {recipe} needs precision fp8 (precision={tr.precision})"
    if recipe is Fp8Recipe.ROWWISE and tr.framework is not TITAN:
        return f"fp8_recipe rowwise is torchao's (torchtitan); {tr.framework} uses tensorwise or mxfp8"
    if recipe is Fp8Recipe.DELAYED and tr.framework is not MEGATRON:
        return f"fp8_recipe delayed is Megatron's --fp8-recipe delayed (framework={tr.framework}); use tensorwise"
    gpu = job.cluster.gpu
    if recipe is Fp8Recipe.MXFP8 and gpu.before_blackwell:
        return (f"fp8_recipe mxfp8 needs Blackwell tensor cores, compute capability 10.0 or later "
                f"({_gpu_is(gpu)}); use tensorwise")
    return None


def _gpu_is(gpu: GPUSpec) -> str:
    """"H100-SXM is hopper, 9.0": the GPU's name, generation and compute capability, as the hardware
    refusals say them."""
    return f"{gpu.name} is {gpu.architecture or 'another architecture'}, {'.'.join(map(str, gpu.compute_capability))}"


def _fp8_hardware(job: Job) -> str | None:
    gpu = job.cluster.gpu
    if job.training.precision is Precision.FP8 and gpu.peak_flop_per_s.fp8 is None:
        return (f"precision fp8 needs fp8 tensor cores; {gpu.name} ({gpu.architecture or 'its architecture'}) has none "
                "(fp8 came with NVIDIA Hopper and Ada, AMD CDNA 3); use bf16")
    return None


def _fp4(job: Job) -> str | None:
    """Precision fp4 (NVFP4) as Transformer Engine and Megatron run it (sources: the fp4 Rule)."""
    tr, gpu = job.training, job.cluster.gpu
    if tr.precision is not Precision.FP4:
        return None
    if tr.framework is not MEGATRON:
        return (f"precision fp4 is Transformer Engine's NVFP4 recipe, run by Megatron's --fp4-format e2m1 "
                f"(framework={tr.framework}: torchtitan's quantisation converters train float8 and MXFP8, DeepSpeed "
                "has no fp4 setting); use framework megatron, or precision fp8")
    if gpu.compute_capability < (10, 0) or gpu.peak_flop_per_s.fp4 is None:
        return (f"precision fp4 needs NVFP4 tensor cores, compute capability 10.0 or later (Blackwell); {_gpu_is(gpu)}; "
                "use fp8 or bf16")
    if tr.tp_comm_overlap:
        return ("precision fp4 runs without tp_comm_overlap: Transformer Engine's userbuffers gather fp8 and MXFP8 "
                "tensors only, not NVFP4; drop tp_comm_overlap, or use precision fp8")
    return None


def _te_amax_reduction(job: Job) -> str | None:
    """TrainingSpec.te_amax_reduction where Transformer Engine's delayed scaling runs (sources: the
    te_amax_reduction Rule)."""
    tr = job.training
    if tr.te_amax_reduction is AmaxGroup.NONE:
        return None
    if tr.framework is not MEGATRON or tr.precision is not Precision.FP8 or tr.fp8_recipe is not Fp8Recipe.DELAYED:
        return (f"te_amax_reduction is Transformer Engine's delayed-scaling amax all-reduce under Megatron "
                f"(framework={tr.framework}, precision={tr.precision}, fp8_recipe={tr.fp8_recipe}); use framework megatron "
                "with precision fp8 and fp8_recipe delayed, or drop it")
    return None


def _fp8_attention(job: Job) -> str | None:
    """TrainingSpec.fp8_attention where Transformer Engine runs it (sources: the fp8_attention Rule)."""
    tr, gpu, m = job.training, job.cluster.gpu, job.model
    if not tr.fp8_attention:
        return None
    if tr.framework is not MEGATRON:
        return (f"fp8_attention is Transformer Engine's fp8 dot-product attention under Megatron "
                f"(framework={tr.framework}); drop it, or use framework megatron")
    if not tr.precision.low:
        return (f"fp8_attention runs inside Transformer Engine's fp8 autocast, which needs precision fp8 or fp4 "
                f"(precision={tr.precision}); use precision fp8, or drop it")
    if tr.precision is Precision.FP8 and tr.fp8_recipe not in (Fp8Recipe.TENSORWISE, Fp8Recipe.DELAYED):
        return (f"fp8_attention scales q, k, v as the linears' recipe does, current (tensorwise) or delayed scaling "
                f"(fp8_recipe={tr.fp8_recipe}); use fp8_recipe tensorwise or delayed, or drop it")
    backend = tr.attention_backend
    if tr.attention is not AttentionKernel.FLASH or backend not in (None, AttentionBackend.CUDNN):
        return (f"fp8_attention runs on cuDNN's fused attention only (attention={tr.attention}, "
                f"attention_backend={backend or 'default'}); use flash attention with attention_backend cudnn, or drop it")
    cc, where = gpu.compute_capability, _gpu_is(gpu)
    # cc: a GPU without a kernel table of its own reads Hopper's, which has fp8 attention curves
    if cc < (9, 0) or not kernels.fp8_attention_available(gpu):
        return f"fp8_attention needs cuDNN's fp8 attention, on NVIDIA Hopper or Blackwell (compute capability 9.0+); {where}; drop it"
    if tr.fp8_attention_current and cc < (10, 0):
        return (f"fp8_attention with current scaling (fp8_recipe tensorwise) needs compute capability 10.0 or later "
                f"(Blackwell); {where}; use fp8_recipe delayed, or drop it")
    if m.mla is not None:
        return "fp8_attention with multi-latent attention is not modelled (unequal q/k and v head dims); drop it"
    d = m.head_size
    if cc < (10, 0) and d != 128:
        return f"fp8_attention trains head dim 128 only before Blackwell (head_dim={d}, {where}); drop it"
    if d > 128 or d % 16:
        return f"fp8_attention takes head dims up to 128 in multiples of 16 (head_dim={d}); drop it"
    if m.attention_sinks:
        return "fp8_attention runs the plain softmax only, without attention sinks (model.attention_sinks); drop it"
    if m.sliding_window is not None or m.attention_chunk_size is not None:
        return "fp8_attention has no sliding-window or chunked kernel (model.sliding_window / attention_chunk_size); drop it"
    if m.position_embedding is PositionKind.ALIBI:
        return "fp8_attention takes no bias on the scores (model.position_embedding alibi); drop it"
    return None


def expert_axes_given(model: ModelSpec, given: dict[str, object], how: str) -> None:
    """ep or etp given (as a flag or a --fix) for a dense model, where they name nothing: refused
    with the reason, rather than left to the search to find no layout."""
    if model.moe is not None:
        return
    ep, etp = given.get("ep"), given.get("etp")
    if isinstance(ep, int) and ep > 1:
        raise SpecError(f"{how}ep({ep}) > 1 needs a mixture-of-experts model; {model.name} is dense (no experts to split)")
    if etp is not None:
        raise SpecError(f"{how}etp({etp}) is the tensor-parallel size of expert layers; {model.name} is dense "
                        "(no experts): drop it (dense layers take tp)")


def _align_param_gather(job: Job) -> str | None:
    tr = job.training
    if not tr.align_param_gather:
        return None
    if tr.framework is not MEGATRON or job.zero is not Zero.OPTIMIZER or not tr.overlap_grad_reduce or tr.apex_distributed_adam:
        return (f"align_param_gather is Megatron DDP's, for the distributed optimizer with overlapped gathers "
                f"(framework={tr.framework}, zero {int(job.zero)}, overlap_grad_reduce={tr.overlap_grad_reduce}); "
                "drop it, or use zero 1 with overlap_grad_reduce")
    return None


def _fp8_param_gather(job: Job) -> str | None:
    tr = job.training
    if not tr.fp8_param_gather:
        return None
    if tr.framework is not MEGATRON or tr.precision is not Precision.FP8:
        return f"fp8_param_gather is Megatron's --fp8-param-gather with precision fp8 (framework={tr.framework}, precision={tr.precision})"
    if job.zero is Zero.NONE:
        return "fp8_param_gather needs the distributed optimizer (zero 1) or fully sharded data parallel; use zero 1"
    return None


def _moe_dispatch(job: Job) -> str | None:
    tr = job.training
    if tr.moe_dispatch is MoEDispatch.OVERLAP_1F1B and tr.framework is not MEGATRON:
        return f"moe_dispatch overlap is Megatron's --overlap-moe-expert-parallel-comm ({tr.framework} has none); use alltoall"
    if tr.moe_dispatch is MoEDispatch.DEEPEP and not deepep.framework_ships(tr.framework):
        return (f"moe_dispatch deepep is Megatron's flex token dispatcher or torchtitan's expert_parallel_comm_backend "
                f"\"deepep\" ({tr.framework} has no DeepEP dispatcher); use alltoall, or framework megatron or torchtitan")
    return None


def _deepep(job: Job) -> str | None:
    """What DeepEP and the frameworks that call it ask of the layout (sources: the deepep Rule)."""
    if job.training.moe_dispatch is not MoEDispatch.DEEPEP or job.model.moe is None:
        return None
    lay, fw, n = job.layout, job.training.framework, deepep.group_size(job)
    if fw is TITAN and lay.ep == 1:
        return "moe_dispatch deepep needs ep > 1 in torchtitan (its DeepEP MoE code does not run ep 1); use ep > 1 or moe_dispatch alltoall"
    if fw is TITAN and job.etp > 1:
        return f"moe_dispatch deepep runs with etp 1 in torchtitan (DeepEP with expert tensor parallelism is not supported), not etp({job.etp}); use etp 1 or moe_dispatch alltoall"
    if n == 1:
        return "moe_dispatch deepep needs etp·ep > 1 (Megatron's DeepEP dispatcher requires TPxEP > 1); use ep > 1 or moe_dispatch alltoall"
    if n not in deepep.GROUP_SIZES:
        sizes = ", ".join(map(str, deepep.GROUP_SIZES))
        return (f"moe_dispatch deepep: DeepEP has no config for a group of {_mul(ep=lay.ep, etp=job.etp)} = {n} ranks; "
                f"use a group of {sizes}, or moe_dispatch alltoall")
    need, domain = min(n, deepep.NVL_PEERS), job.cluster.spec.scaleup_domain_gpus
    if domain < need:
        return (f"moe_dispatch deepep takes its group's ranks {need} to an NVLink domain, and {job.cluster.spec.name} has "
                f"{domain} GPUs in one; use a group of at most {domain} ranks on one node, or moe_dispatch alltoall")
    return None


def _fsdp2_megatron(job: Job) -> str | None:
    lay = job.layout
    if job.zero is Zero.PARAMETERS and lay.pp > 1:
        return "Megatron's fully sharded data parallel (zero 3) runs with pp = 1; use zero 1 (distributed optimizer)"
    return None


# TrainingSpec switches set where they do not hold: for a framework whose code they do not describe,
# or without the switch, precision or optimizer they need. Each reads only the training spec and the
# model, so no layout can help (PROBLEM_RULES). Fuller sources: the fields' citations in
# cost_models/training.py.
SWITCH_RULES: tuple[Rule, ...] = (
    _needs_rule("grad_reduce_in_bf16", MEGATRON, "training.precision", {Precision.BF16, Precision.FP8, Precision.FP4},
                "is Megatron's --grad-reduce-in-bf16 for bf16, fp8 or fp4 runs", "drop it",
                source="Megatron-LM@d98e8a64 arguments.py:1204-1217, 3053"),
    _needs_rule("nvfp4_disable_rht", MEGATRON, "training.precision", {Precision.FP4},
                "is Transformer Engine's NVTE_NVFP4_DISABLE_RHT=1, for precision fp4 under Megatron", "drop it",
                source="TransformerEngine@40c69e75 transformer_engine/common/recipe/__init__.py:411-412"),
    Rule("megatron_grad_flags", ALL, _megatron_grad_flags, "Megatron-LM@d98e8a64 arguments.py:2944-2948, 3121-3122"),
    _megatron_rule("ddp_bucket_size", "is Megatron's --ddp-bucket-size",
                   source="Megatron-LM@d98e8a64 megatron/training/training.py:2179-2194"),
    Rule("apex_framework", ALL, _apex_framework,
         "NeMo 1 as vendored in mlcommons/training_results_v4.0@6fe95437 megatron_gpt_model.py:547-580"),
    _megatron_rule("param_buffer_init_copy", "describes Megatron's distributed optimizer",
                   source="NVIDIA/Megatron-LM@0609f27f megatron/optimizer/distrib_optimizer.py:354-423"),
    _megatron_rule("bda_mask_kept", "describes Megatron's TorchScript bias-dropout-add",
                   source="NVIDIA/Megatron-LM@0609f27f megatron/model/transformer.py:717-737"),
    _needs_rule("loss_shift_beside_fp32_copy", MEGATRON, "training.loss_shift_out_of_place", {False},
                "describes Megatron's vocab-parallel cross entropy before 9634c0e4",
                "use framework megatron without loss_shift_out_of_place, or drop it",
                source="NVIDIA/Megatron-LM@0609f27f megatron/core/tensor_parallel/cross_entropy.py:24"),
    Rule("nanotron_switches", ALL, partial(_framework_switches, NANOTRON_SWITCHES),
         "huggingface/nanotron@c2528430, as each switch's TrainingSpec field cites it"),
    Rule("grads_kept_through_backward", ALL, _grads_kept_through_backward,
         "huggingface/nanotron@c2528430 src/nanotron/optim/gradient_accumulator.py:204-223"),
    Rule("titan_switches", ALL, partial(_framework_switches, TITAN_SWITCHES), "torch fully_shard reshard_after_forward, DTensor ColwiseParallel"),
    Rule("loss_on_16bit_logits", ALL, _loss_on_16bit_logits, "KempnerInstitute/KempnerForge@01b461a scripts/train.py:294-297"),
    _needs_rule("sac_recomputes_attention", TITAN, "training.attention_backend", {AttentionBackend.CUDNN},
                "describes torchtitan's per-op checkpointing on SDPA's cuDNN backend",
                "drop it, or use framework torchtitan with attention_backend cudnn",
                source="pytorch/torchtitan@6fc499f6 torchtitan/models/llama3/infra/parallelize.py:233-243, "
                       "torchtitan/models/attention.py:200-211"),
    Rule("compile_whole_model", ALL, _compile_whole_model,
         "KempnerInstitute/KempnerForge@01b461a kempnerforge/distributed/parallel.py:214-216"),
    _needs_rule("qkv_bias_unfused", MEGATRON, "model.qkv_bias", {True},
                "describes Megatron's local linear_qkv bias add", "drop it, or use framework megatron with a qkv bias",
                source="sail-sg/zero-bubble-pipeline-parallelism@77b9eed9 megatron/core/tensor_parallel/layers.py:337-340"),
    _needs_rule("qkv_bshd_copies", MEGATRON, "training.attention", {AttentionKernel.FLASH},
                "describes Megatron core's q, k, v copies for Transformer Engine's flash attention",
                "drop it, or use framework megatron with flash attention",
                source="sail-sg/VocabularyParallelism@4dca7d20 megatron/core/transformer/custom_layers/transformer_engine.py:503-524"),
    _needs_rule("local_attention_copies", MEGATRON, "training.attention", {AttentionKernel.EAGER},
                "describes Megatron's local unfused attention", "drop it, or use framework megatron with eager attention",
                source="sail-sg/zero-bubble-pipeline-parallelism@77b9eed9 megatron/model/transformer.py:368-373, 421-422"),
    _needs_rule("flash_unpad_copies", TITAN, "training.attention", {AttentionKernel.FLASH},
                "describes llm-foundry's unpad and pad around flash-attn 2's varlen kernel",
                "drop it, or use framework torchtitan with flash attention",
                source="mosaicml/llm-foundry@5e85bd62d llmfoundry/models/layers/attention.py:270-289, 367-369"),
    _megatron_rule("cross_entropy_unfused", "describes Megatron's vocab-parallel cross entropy without "
                   "--cross-entropy-loss-fusion",
                   source="sail-sg/VocabularyParallelism@4dca7d20 megatron/training/arguments.py:1169-1171"),
    Rule("bf16_params", ALL, _bf16_params, "KempnerInstitute/KempnerForge@01b461a kempnerforge/distributed/parallel.py:205-212"),
    Rule("nccl_max_ctas", ALL, _nccl_max_ctas, "Megatron-LM@d98e8a64 megatron/core/parallel_state.py:168-195 get_nccl_options"),
    Rule("decoupled_adamw", frozenset({MEGATRON, DEEPSPEED}), _decoupled_adamw,
         "mosaicml/composer@v0.16.4 composer/optim/decoupled_weight_decay.py"),
    Rule("moe_dispatch", ALL, _moe_dispatch, "Megatron-LM@23e00ed0 arguments.py:2889 (--overlap-moe-expert-parallel-comm); "
         "Megatron-LM@d98e8a64 transformer_config.py:891-900 (flex dispatcher, deepep backend); torchtitan@v0.2.2 "
         "torchtitan/config/job_config.py:474-483 (expert_parallel_comm_backend)"),
    Rule("te_amax_reduction", ALL, _te_amax_reduction,
         "TransformerEngine@8e5f00f2 (release_v0.8) transformer_engine/pytorch/fp8.py:535-599; "
         "TransformerEngine@9e4091e7 (v1.6rc1) transformer_engine/pytorch/fp8.py:300-418"),
    _megatron_rule("vocab_divisible_by", "is Megatron's --make-vocab-size-divisible-by",
                   source="Megatron-LM@d98e8a64 megatron/training/vocab_utils.py:44-59"),
)


RULES: tuple[Rule, ...] = (
    Rule("pipeline_split", ALL, _pipeline_split, "Megatron arguments.py L954-998, transformer_config.py L2294-2368"),
    Rule("heads_tp", ALL, _heads, "Megatron transformer_config.py L1446-1450"),
    Rule("kv_heads_tp", frozenset({MEGATRON, DEEPSPEED}), _kv_heads_megatron, "Megatron transformer_config.py L1461-1467"),
    Rule("kv_heads_tp", frozenset({TITAN}), _kv_heads_titan, "torchtitan colwise wk/wv shard whole heads"),
    Rule("hybrid_framework", frozenset({TITAN, DEEPSPEED}), _hybrid_framework, "torchtitan models/ has no Mamba; transformers v5.23.0 NemotronHMamba2Mixer picks mamba_ssm kernels or a torch path at run time"),
    Rule("mamba_tp", ALL, _mamba_tp, "Megatron-LM@d98e8a64 megatron/core/ssm/mamba_mixer.py L262-274 (nheads % tp, ngroups % tp)"),
    Rule("mamba_cp", ALL, _mamba_cp, "Megatron-LM@d98e8a64 megatron/core/ssm/mamba_context_parallel.py L105-129 (nheads/tp % cp, ngroups/tp and cp)"),
    Rule("ffn_tp", ALL, _ffn, "Megatron ColumnParallelLinear divides the output dim by tp"),
    Rule("seq_cp", frozenset({MEGATRON}), _seq_cp, "Megatron arguments.py L1335-1338"),
    Rule("seq_sp", frozenset({MEGATRON}), _seq_sp, "Megatron scatter_to_sequence_parallel_region splits s by tp"),
    Rule("seq_divisor", frozenset({TITAN}), _seq_titan, "torchtitan parallel_dims.py seq_len_divisor"),
    Rule("positions", ALL, _positions, "a learned position table has max_position_embeddings rows"),
    Rule("sp_needs_tp", ALL, _sp_needs_tp, "Megatron model_parallel_config.py L502-504"),
    Rule("global_batch", ALL, _global_batch, "Megatron num_microbatches_calculator.py L367-392; torchtitan train.py"),
    Rule("schedule", frozenset({MEGATRON}), _interleaved_megatron, "Megatron arguments.py L1000-1009, schedules.py L1160-1180"),
    Rule("schedule", frozenset({TITAN}), _pipeline_titan, "torch.distributed.pipelining schedules"),
    Rule("moe", ALL, _moe, "Megatron arguments.py L1656-1659"),
    Rule("deepep", frozenset({MEGATRON, TITAN}), _deepep,
         "Megatron-LM@d98e8a64 megatron/core/transformer/moe/token_dispatcher.py:1835-1843 (TPxEP > 1); "
         "torchtitan@v0.2.2 torchtitan/models/deepseek_v3/infra/parallelize.py:99-111, llama4/infra/parallelize.py:113-125 "
         "(ep > 1, etp 1); deepseek-ai/DeepEP@b57e5e2 deep_ep/buffer.py:245-289 (group sizes), csrc/deep_ep.cpp "
         "Buffer::Buffer (8 ranks to an NVLink node)"),
    Rule("expert_grid", frozenset({MEGATRON, DEEPSPEED}), _expert_grid_megatron, "Megatron parallel_state.py L873-884"),
    Rule("expert_grid", frozenset({TITAN}), _expert_grid_titan, "torchtitan parallel_dims.py (v0.2.2 L59, main L187-192)"),
    Rule("zero", frozenset({TITAN}), _zero_titan, "torchtitan llama3 parallelize.py (FSDP2 / DDP)"),
    Rule("zero", frozenset({MEGATRON}), _fsdp2_megatron, "Megatron arguments.py L1031-1049 (--use-torch-fsdp2: PP==1)"),
    Rule("zero", frozenset({DEEPSPEED}), _zero_deepspeed, "DeepSpeed runtime/pipe/engine.py: ZeRO-2/3 incompatible with PP"),
    Rule("deepspeed_axes", frozenset({DEEPSPEED}), _deepspeed_axes, "DeepSpeed has no CP, VPP, SP or selective recompute"),
    Rule("dp_shard", ALL, _dp_shard, "HSDP: shard groups tile the dp group"),
    Rule("recompute_layers", ALL, _recompute_layers, "Megatron --recompute-method block --recompute-num-layers"),
    Rule("compile", frozenset({MEGATRON, DEEPSPEED}), _compile, "torchtitan --compile.enable"),
    Rule("tp_comm_overlap", ALL, _tp_comm_overlap, "Megatron arguments.py (--tp-comm-overlap requires --sequence-parallel); torchtitan async TP"),
    Rule("fp8_hardware", ALL, _fp8_hardware, "presets/gpus.toml peak_tflops.fp8: given exactly for the GPUs with fp8 tensor cores (datasheets)"),
    Rule("fp8_recipe", ALL, _fp8_recipe, "Megatron --fp8-recipe (transformer_config.py L594); torchtitan quantize.linear.float8 recipe_name"),
    Rule("fp4", ALL, _fp4,
         "Megatron-LM@d3391901 megatron/training/arguments.py:662-672, 1325-1332 (--fp4-format e2m1, --fp4-recipe nvfp4); "
         "TransformerEngine@40c69e75 transformer_engine/pytorch/fp8.py:57-61 (check_nvfp4_support: compute capability "
         ">= 10.0), pytorch/module/base.py:503-636 (userbuffers gather Float8 and MXFP8 only); pytorch/torchtitan@00f555e1 "
         "torchtitan/components/quantization/mx.py (MXFP8 only)"),
    Rule("fp8_attention", ALL, _fp8_attention,
         "Megatron-LM@d98e8a64 megatron/core/fp8_utils.py:777-787, fp4_utils.py:222-226, extensions/transformer_engine.py:"
         "3349-3351 (fp8_dpa in the recipe); TransformerEngine@40c69e75 transformer_engine/pytorch/attention/"
         "dot_product_attention/utils.py:456-478 (fused attention only; current scaling on sm100+), "
         "common/fused_attn/fused_attn.cpp:162-190 (sm90+; head dim 128 in training on sm90, up to 128 in multiples "
         "of 16 on sm100; no bias; vanilla softmax), utils.py:921-933 (no sliding window)"),
    Rule("cp_local_attention", ALL, _cp_local_attention,
         "TransformerEngine@d0067d0d context_parallel.py:5054-5060 (sliding window only with cp_comm_type a2a or all_gather); "
         "Megatron-LM@d98e8a64 arguments.py:3221 (--cp-comm-type default p2p)"),
    Rule("hf_attention", frozenset({DEEPSPEED}), _hf_attention,
         "transformers v5.23.0 modeling_gemma2.py L352, modeling_gpt_oss.py L379 (_supports_sdpa = False); "
         "planner/launch/ds_script.py builds from_config without attn_implementation"),
    Rule("sinks_backend", frozenset({MEGATRON}), _sinks_backend,
         "TransformerEngine@d0067d0d transformer_engine/pytorch/attention/dot_product_attention/utils.py L1113-1124"),
    Rule("cp_flash", ALL, _cp_flash, "ring attention (Megatron/TE, torch context_parallel) uses fused attention"),
    Rule("attention_backend", ALL, _attention_backend_available,
         "presets/kernels/<architecture>.toml [attention.*]: the families each GPU generation has kernels of"),
    *SWITCH_RULES,
    Rule("switch_layout", ALL, _switch_layout,
         "the TrainingSpec fields' own citations: NeMo 1 distributed_fused_adam (zero 1); nanotron@c2528430 "
         "trainer.py:509-518 (ZeRO-1); torch.distributed.pipelining stage.py (pp > 1)"),
    Rule("fp8_param_gather", ALL, _fp8_param_gather, "Megatron-LM@d98e8a64 arguments.py:1095-1098, 2016-2018"),
    Rule("align_param_gather", ALL, _align_param_gather,
         "Megatron-LM@d98e8a64 megatron/core/distributed/distributed_data_parallel.py:542-550, param_and_grad_buffer.py:555-573"),
)


def _unordered_queues(job: Job) -> str | None:
    if not job.unordered_queues:
        return None
    axes = " and ".join(f"{a} {v}" for a, v in (("tp", job.layout.tp), ("cp", job.layout.cp)) if v > 1)
    return (f"Megatron-LM warns against {axes} with fully sharded data parallelism before Blackwell: FSDP needs "
            "CUDA_DEVICE_MAX_CONNECTIONS unset, tp's backward overlap needs it 1; the backward tp collectives are "
            "priced exposed")


def _kernel_caveat(job: Job) -> str | None:
    gpu = job.cluster.gpu
    table = kernels.table_for(gpu)
    if table.architecture != gpu.architecture:
        return (f"{gpu.name} has no kernel table of its own ({gpu.architecture or 'no architecture'}): its kernels are "
                f"priced with {table.architecture}'s measurements, scaled by its own matmul rate")
    return f"{gpu.name}: {table.caveat}" if table.caveat else None


# What a framework warns about a legal layout, and what the cost model's kernel tables say of their
# own stand-ins: said beside the plan (a framework's warning is priced where it costs time).
NOTES: tuple[Rule, ...] = (
    Rule("unordered_queues", frozenset({MEGATRON}), _unordered_queues,
         "Megatron-LM@d98e8a64 arguments.py L1451-1465, core/tensor_parallel/layers.py L842-849"),
    Rule("kernel_caveat", ALL, _kernel_caveat, "presets/kernels/<architecture>.toml `caveat`; kernels.FALLBACK_ARCHITECTURE"),
)


def notes(job: Job) -> list[str]:
    """The framework's warnings about a legal job and its kernel table's caveat, in NOTES order."""
    return [m for rule in NOTES if job.training.framework in rule.frameworks and (m := rule.check(job))]


def violations(job: Job, waive: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """Every rule the job breaks, as (rule name, message), in rule order; rules named in `waive`
    are not checked."""
    out = []
    for rule in RULES:
        if job.training.framework in rule.frameworks and rule.name not in waive:
            message = rule.check(job)
            if message:
                out.append((rule.name, message))
    return out


# Rules that read only the model, the cluster and the training spec: when one breaks, no layout can help.
PROBLEM_RULES = frozenset({"positions", "compile", "fp8_hardware", "fp8_recipe", "fp4", "fp8_attention", "hybrid_framework", "hf_attention",
                           "attention_backend",
                           *(rule.name for rule in SWITCH_RULES)})


def problem_violations(model: ModelSpec, cluster: Cluster, training: TrainingSpec) -> list[tuple[str, str]]:
    """The PROBLEM_RULES a model, cluster and training spec break, whatever the layout."""
    job = fill_defaults(model, cluster, training, Layout())
    return [(name, message) for name, message in violations(job) if name in PROBLEM_RULES]


def resolve(model: ModelSpec, cluster: Cluster, training: TrainingSpec, layout: Layout,
            waive: frozenset[str] = frozenset()) -> Job:
    """Fill the layout's derived fields and check every rule but those named in `waive`; raise
    SpecError on the first broken one."""
    job = fill_defaults(model, cluster, training, layout)
    broken = violations(job, waive)
    if broken:
        raise SpecError(f"layout: {broken[0][1]} [{training.framework}]")
    return job
