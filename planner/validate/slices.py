"""What `planner validate` runs: the plan as a PyTorch-native job, the largest faithful slice of it
that fits the ranks at hand, and the run description (`job.json`) the worker reads.

The emitted job applies the layout with PyTorch's own APIs (FSDP2, DTensor tensor parallel,
torch.distributed.pipelining), which is torchtitan's convention for model states and kernels, so
the job is resolved and predicted as a torchtitan job: Megatron/DeepSpeed ZeRO 1 and 2, and ZeRO 0
combined with model parallelism, run as FSDP2 without resharding after forward (zero 2).

A slice keeps every per-GPU shape and gives up, in this order, only what does not fit:
1. data-parallel replicas (fewer dp ranks, each with the plan's local batch);
2. the pipeline: one stage's layers (the stage with the most) as a whole model, on the plan's
   tp x cp group, the layer count being the only thing scaled;
3. the tp/cp/ep group: one rank's share of every split layer on one rank, whose collectives are
   then not measured.
The prediction compared with a slice is the cost model evaluated for that slice, never a rescaled
number.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from cost_models.enums import AttentionKernel, Framework, OptimizerKind, PositionKind, Precision, Recompute, Zero
from cost_models.errors import SpecError
from cost_models.hardware import Cluster, ClusterSpec
from cost_models.job import Job
from cost_models.layout import Layout
from cost_models.model_spec import MambaSpec, ModelSpec, MoESpec
from cost_models.rules import fill_defaults, resolve, violations
from cost_models.states import local_vocab
from cost_models.training import TrainingSpec
from planner.errors import spec_error

WORKER_FORMAT = 2  # planner/validate/worker.py FORMAT_VERSION

# Optimizer settings of the measured job: torchtitan's llama3 defaults (lr 8e-4 for 8B; AdamW
# betas (0.9, 0.95), eps 1e-8, weight decay 0.1). Step time does not depend on them.
OPTIMIZER = {"lr": 8e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1, "momentum": 0.9}

DTYPE_NAME = {Precision.BF16: "bfloat16", Precision.FP16: "float16"}

# The optimizer implementation a framework runs by default, in torch.optim's terms: "fused" (one
# kernel updates a group of tensors, fused=True), "foreach" (torch's multi-tensor ops, one kernel
# per op and group, foreach=True) or "for-loop" (one tensor and one op at a time, foreach=False).
# Adam(W): torchtitan's optimizer.implementation defaults to "fused" (pytorch/torchtitan@820504e2
# torchtitan/config_manager.py:139, passed as fused=/foreach= by torchtitan/components/optimizer.py:
# 275-288); Megatron runs Transformer Engine's or apex's FusedAdam (NVIDIA/Megatron-LM@d98e8a64
# megatron/core/optimizer/__init__.py:13-21, 558-562), DeepSpeed its FusedAdam unless torch_adam is
# set (deepspeedai/DeepSpeed@edaa7221 deepspeed/runtime/engine.py:2095-2139). SGD: Megatron's is TE's
# or apex's FusedSGD (__init__.py:13-21, 621-627); DeepSpeed builds torch.optim.SGD with torch's
# defaults (engine.py:2236-2238), foreach on CUDA tensors; torchtitan builds Adam and AdamW only
# (optimizer.py:290-296). Composer's DecoupledAdamW updates one tensor and one op at a time
# (worker.make_optimizer).
FUSED_ADAM = {Framework.TORCHTITAN: "fused", Framework.MEGATRON: "fused", Framework.DEEPSPEED: "fused"}
OPTIMIZER_IMPLEMENTATION: dict[OptimizerKind, dict[Framework, str]] = {
    OptimizerKind.ADAMW: FUSED_ADAM,
    OptimizerKind.ADAM: FUSED_ADAM,
    OptimizerKind.SGD: {Framework.MEGATRON: "fused", Framework.DEEPSPEED: "foreach", Framework.TORCHTITAN: "foreach"},
    OptimizerKind.DECOUPLED_ADAMW: {f: "for-loop" for f in Framework},
}


def optimizer_implementation(training: TrainingSpec) -> str:
    """The implementation of the training's optimizer its framework runs (OPTIMIZER_IMPLEMENTATION)."""
    return OPTIMIZER_IMPLEMENTATION[training.optimizer][training.framework]


# --- the plan --------------------------------------------------------------------------------------


def _only(fields: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k in fields}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _checked(fields: dict[str, Any], cls: Any, where: str) -> dict[str, Any]:
    """plan.json fields of `cls` with the JSON types the spec takes, numbers as numbers: a whole
    number given as a string ("8") or a bool is refused here, not coerced; then the spec's own
    validation (enum values, ranges) runs on them."""
    import typing

    for key, value in fields.items():
        annotation = cls.model_fields[key].annotation
        args = set(typing.get_args(annotation)) or {annotation}
        for a in list(args):
            args |= set(typing.get_args(a))
        if value is None:
            continue
        if int in args and bool not in args and (isinstance(value, bool) or not isinstance(value, int)) \
                and not (float in args and isinstance(value, float)):
            raise SpecError(f"{where}: {key} = {_short(value)}: expected a whole number")
    try:
        cls.model_validate(fields)
    except ValidationError as e:
        raise spec_error(e, cls, where) from None
    return fields


def read_plan(plan_dir: Path) -> tuple[ModelSpec, ClusterSpec, int, dict[str, Any], dict[str, Any]]:
    """(model, cluster spec, gpus, training fields, layout fields) from PLAN_DIR/plan.json, as
    `planner launch` writes it (model, cluster, gpus and training under "specs", or at the top
    level); keys beyond those are ignored."""
    from planner.files import read_mapping
    from planner.loaders import load_cluster, load_model
    from planner.presets import cluster_from_dict

    path = plan_dir / "plan.json"
    where = str(path)
    top = read_mapping(path)
    doc = {**top, **top["specs"]} if isinstance(top.get("specs"), dict) else top
    missing = [k for k in ("model", "cluster", "training", "layout") if k not in doc]
    if missing:
        raise SpecError(f"{where}: missing key(s) {missing}; a plan file has model, cluster, gpus, training and layout")
    model_doc, cluster_doc = doc["model"], doc["cluster"]
    for key, value in (("model", model_doc), ("cluster", cluster_doc)):
        if not isinstance(value, (str, dict)):
            raise SpecError(f"{where}: {key} = {_short(value)}: expected a preset name or a table of the spec")
    for key in ("training", "layout"):
        if not isinstance(doc[key], dict) and doc[key] is not None:
            raise SpecError(f"{where}: {key} = {_short(doc[key])}: expected a table of fields")
    try:
        model = load_model(model_doc) if isinstance(model_doc, str) else ModelSpec.model_validate(_only(ModelSpec.model_fields, model_doc))
    except ValidationError as e:
        raise spec_error(e, ModelSpec, f"{where} model") from None
    if isinstance(cluster_doc, str):
        cluster = load_cluster(cluster_doc)
    else:
        body = _only(ClusterSpec.model_fields, cluster_doc)
        try:
            cluster = cluster_from_dict(str(body.pop("name", "cluster")), body)
        except ValidationError as e:
            raise spec_error(e, ClusterSpec, f"{where} cluster") from None
    gpus = doc.get("gpus")
    if gpus is None and isinstance(cluster_doc, dict):
        gpus = cluster_doc.get("gpus", cluster_doc.get("num_gpus"))
    if gpus is None:
        prediction = doc.get("prediction")
        cl = prediction.get("cluster") if isinstance(prediction, dict) else None
        gpus = cl.get("gpus") if isinstance(cl, dict) else None
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
        raise SpecError(f"{where}: gpus({_short(gpus)}) must be a positive integer (top-level key gpus)")
    training = _checked(_only(TrainingSpec.model_fields, doc["training"] or {}), TrainingSpec, f"{where} training")
    layout = _checked(_only(Layout.model_fields, doc["layout"] or {}), Layout, f"{where} layout")
    return model, cluster, gpus, training, layout


# Framework rules that do not bind the PyTorch-native job: torchtitan has no Mamba-2 module, but the
# worker has its own (worker.Mamba2), so a hybrid model runs there as it would under torchtitan's parallelism.
NATIVE_WAIVED = frozenset({"hybrid_framework"})


def _without_foreign_switches(model: ModelSpec, cl: Cluster, spec: TrainingSpec, layout: Layout, planned: Framework,
                              planned_layout: Layout, notes: list[str]) -> TrainingSpec:
    """The native job's training spec less the switches that describe the plan's own framework's
    code (rules named after a TrainingSpec field, e.g. Megatron's vocab_divisible_by,
    grad_reduce_in_bf16, fp8_param_gather) which hold for the plan as planned and break for the
    native job: the native job runs without them, each said in a note with the rule's own words."""
    own = {name for name, _ in violations(fill_defaults(model, cl, spec.model_copy(update={"framework": planned}), planned_layout))}
    broken = [(name, message) for name, message in violations(fill_defaults(model, cl, spec, layout))
              if name in TrainingSpec.model_fields and name not in own]
    for name, message in broken:
        notes.append(f"{name} dropped: {message.split(';')[0]}")
    return spec.model_copy(update={name: TrainingSpec.model_fields[name].default for name, _ in broken})


def native_job(model: ModelSpec, cluster: ClusterSpec, gpus: int, training: dict[str, Any], layout: dict[str, Any]) -> tuple[Job, list[str]]:
    """The plan resolved as the PyTorch-native job validate runs, and notes on what changed."""
    notes: list[str] = []
    try:
        cl = Cluster(spec=cluster, num_gpus=gpus)
    except ValidationError as e:
        raise spec_error(e, Cluster, "--gpus") from None
    tr = {k: v for k, v in training.items() if v is not None}
    framework = Framework(tr.get("framework", Framework.MEGATRON))
    lay = {k: v for k, v in layout.items() if v is not None}
    if framework is not Framework.TORCHTITAN:
        notes.append(f"{framework} plan run with PyTorch-native parallelism (FSDP2, DTensor, pipelining)")
        zero = lay.get("zero")
        model_parallel = any(int(lay.get(k, 1) or 1) > 1 for k in ("tp", "pp", "cp", "ep"))
        if zero is not None and (int(zero) in (1, 2) or (int(zero) == 0 and model_parallel)):
            notes.append(f"zero {int(zero)} runs as FSDP2 without resharding after forward (zero 2)")
            lay["zero"] = Zero.GRADIENTS
        if "etp" in lay:
            lay["etp"] = 1
        tr["framework"] = Framework.TORCHTITAN
    try:
        spec = TrainingSpec.model_validate(tr)
        lay_spec = Layout.model_validate(lay)
    except ValidationError as e:
        raise spec_error(e, TrainingSpec, "training") from None
    if framework is not Framework.TORCHTITAN:
        planned_layout = Layout.model_validate({k: v for k, v in layout.items() if v is not None})
        spec = _without_foreign_switches(model, cl, spec, lay_spec, framework, planned_layout, notes)
    try:
        if fill_defaults(model, cl, spec, lay_spec).zero is not Zero.NONE:
            # the worker's Norm calls F.rms_norm on FSDP2's 16-bit parameters: torch's fused kernel
            spec = spec.model_copy(update={"fused_rms_norm": True})
        job = resolve(model, cl, spec, lay_spec, NATIVE_WAIVED)
    except SpecError as e:
        raise SpecError(f"the plan cannot run as a PyTorch-native job: {e}") from None
    problem = unsupported(job)
    if problem:
        raise SpecError(f"validate cannot run this layout yet: {problem}")
    return job, notes


@dataclass(frozen=True)
class Refusal:
    """A layout the emitted worker does not implement: its name, the one-line reason (with the
    alternative) validate gives, and the test on the resolved job. docs/validate.md lists them."""

    name: str
    reason: str
    applies: Callable[[Job], bool]


REFUSALS = (
    Refusal("fp8", "dtype fp8 needs torchao's float8 GEMMs; use --dtype bf16",
            lambda j: j.training.precision is Precision.FP8),
    Refusal("compile", "--compile is not part of the emitted job; use --no-compile", lambda j: j.training.compile),
    Refusal("alibi", "ALiBi position biases are not implemented; the worker has rope, learned and none",
            lambda j: j.model.position_embedding is PositionKind.ALIBI),
    Refusal("mtp", "multi-token prediction modules are not implemented in the worker; validate the spec with mtp_layers = 0",
            lambda j: j.model.mtp_layers > 0),
    Refusal("mla_tp_cp", "multi-head latent attention runs with tp 1 and cp 1 in the worker; use dp, ep and pp",
            lambda j: j.model.mla is not None and (j.layout.tp > 1 or j.layout.cp > 1)),
    Refusal("moe_tp", "mixture-of-experts layers run with tp 1 (and etp 1); use ep and dp",
            lambda j: j.model.moe is not None and j.layout.tp > 1),
    Refusal("ep_cp_hsdp", "ep > 1 runs with cp 1 and without HSDP (dp_shard = dp)",
            lambda j: j.layout.ep > 1 and (j.layout.cp > 1 or j.layout.dp_shard != j.dp)),
    Refusal("tp_unreduced_params", "learned position embeddings, q/k norms and the embedding norm run with tp 1 "
            "(their gradients are not reduced over tp)",
            lambda j: j.layout.tp > 1 and (j.model.position_embedding is PositionKind.LEARNED or j.model.qk_norm
                                           or j.model.embedding_norm)),
    Refusal("tp_sinks", "attention sinks run with tp 1 (the per-head sink logits are not split over tp)",
            lambda j: j.layout.tp > 1 and j.model.attention_sinks),
    Refusal("tied_split", "tied embeddings run with pp 1 and tp 1 (no shared-embedding group)",
            lambda j: j.model.tie_embeddings and (j.layout.pp > 1 or j.layout.tp > 1)),
    Refusal("mamba_tp", "hybrid (Mamba-2) models run with tp 1 in the worker (in_proj's [z, x, B, C, dt] output is not split by part); use dp and pp",
            lambda j: j.model.hybrid_pattern is not None and j.layout.tp > 1),
    Refusal("mamba_cp", "Mamba-2 layers run with cp 1 in the worker (no all-to-all of heads); use dp and pp",
            lambda j: j.model.mamba is not None and j.layout.cp > 1),
    Refusal("hybrid_selective", "hybrid (Mamba-2) models run with recompute none or full in the worker; use --recompute full",
            lambda j: j.model.hybrid_pattern is not None and j.layout.recompute is Recompute.SELECTIVE),
    Refusal("cp_hsdp", "cp > 1 runs without HSDP (dp_shard = dp)", lambda j: j.layout.cp > 1 and j.layout.dp_shard != j.dp),
    Refusal("tp_replicated_vocab", "the worker splits the embedding and the output layer over tp; drop "
            "tp_replicated_vocab or use tp 1", lambda j: j.training.tp_replicated_vocab and j.layout.tp > 1),
)


def refusal(job: Job) -> Refusal | None:
    """The first rule of REFUSALS the job meets, or None when the worker runs it."""
    return next((r for r in REFUSALS if r.applies(job)), None)


def unsupported(job: Job) -> str | None:
    """What the emitted worker does not implement, as one sentence with the alternative."""
    r = refusal(job)
    return None if r is None else r.reason


# --- slices ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Slice:
    plan: Job  # the plan, as a PyTorch-native job
    job: Job  # what runs: the cost model predicts exactly this
    kind: str  # "full", "fewer_replicas", "one_stage", "one_rank"
    description: str
    not_measured: tuple[str, ...]  # plan communication kinds whose collectives do not run

    @property
    def ranks(self) -> int:
        return self.job.gpus


def _cluster_sizes(cluster: ClusterSpec, at_most: int) -> list[int]:
    """GPU counts a cluster accepts (whole nodes or a divisor of one), largest first, <= at_most."""
    g = cluster.gpus_per_node
    ok = [n for n in range(at_most, 0, -1) if (n <= g and g % n == 0) or (n > g and n % g == 0)]
    return ok


def _try(model: ModelSpec, cluster: ClusterSpec, gpus: int, training: TrainingSpec, layout: Layout) -> Job | None:
    try:
        job = resolve(model, Cluster(spec=cluster, num_gpus=gpus), training, layout, NATIVE_WAIVED)
    except (SpecError, ValidationError):
        return None
    return None if unsupported(job) else job


def _stage_model(job: Job, layer_ids: tuple[int, ...]) -> ModelSpec:
    """The model with only these layers (their dense/MoE kinds kept, in order)."""
    m = job.model
    upd: dict[str, Any] = {"num_layers": len(layer_ids), "name": f"{m.name}[{layer_ids[0]}-{layer_ids[-1]}]"}
    if m.hybrid_pattern is not None:
        upd["hybrid_pattern"] = "".join(m.hybrid_pattern[lid] for lid in layer_ids)
        if "M" not in upd["hybrid_pattern"]:
            upd["mamba"] = None
        if "E" not in upd["hybrid_pattern"]:
            upd["moe"] = None
    elif m.moe is not None:
        dense = tuple(i for i, lid in enumerate(layer_ids) if not m.is_moe_layer(lid))
        upd["moe"] = m.moe.model_copy(update={"first_k_dense": 0, "layer_freq": 1, "dense_layers": dense})
    return m.model_copy(update=upd)


def _local_batch_training(job: Job, dp: int, **extra: Any) -> TrainingSpec:
    """The training spec with the plan's micro-batches per rank per step over `dp` ranks."""
    per_rank = job.layout.mbs * job.num_microbatches
    return job.training.model_copy(update={"global_batch_size": per_rank * dp, **extra})


def choose_slice(plan: Job, ranks: int) -> Slice:
    """The largest faithful part of `plan` that runs on `ranks` processes of one node."""
    lay = plan.layout
    if plan.gpus <= ranks:
        return Slice(plan, plan, "full", f"the whole plan on {plan.gpus} ranks", ())
    spec = plan.cluster.spec
    inner = lay.tp * lay.cp
    dp_shard = lay.dp_shard or plan.dp
    # 1. fewer data-parallel replicas
    for n in _cluster_sizes(spec, ranks):
        if n % (inner * lay.pp):
            continue
        d = n // (inner * lay.pp)
        if plan.dp % d:
            continue
        shard = math.gcd(dp_shard, d)
        layout = lay.model_copy(update={"dp": None, "dp_shard": shard})
        job = _try(plan.model, spec, n, _local_batch_training(plan, d), layout)
        if job is not None:
            text = (f"{d} of {plan.dp} data-parallel replicas on {n} ranks: every per-GPU shape and the "
                    f"local batch as planned; states sharded over {job.dense_shard_group} ranks instead of {plan.dense_shard_group}")
            return Slice(plan, job, "fewer_replicas", text, ())
    # 2. one pipeline stage on the tp x cp group
    if lay.pp > 1:
        rank = max(range(lay.pp), key=lambda r: (len(plan.stage_layer_ids(r)), -r))
        ids = plan.stage_layer_ids(rank)
        model = _stage_model(plan, ids)
        for n in _cluster_sizes(spec, ranks):
            if n % inner or plan.dp % (n // inner):
                continue
            d = n // inner
            rl = lay.recompute_layers
            layout = lay.model_copy(update={
                "pp": 1, "vpp": 1, "dp": None, "dp_shard": math.gcd(dp_shard, d), "schedule": None,
                "pp_first_stage_layers": None, "pp_last_stage_layers": None,
                "account_for_embedding": False, "account_for_loss": False, "pp_layout": None,
                "recompute_layers": None if rl is None else min(len(ids), rl * lay.vpp),
            })
            job = _try(model, spec, n, _local_batch_training(plan, d), layout)
            if job is not None:
                text = (f"pipeline stage {rank} alone: its {len(ids)} of {plan.model.num_layers} layers as a whole "
                        f"model (with embedding and output layer) on tp {lay.tp} x cp {lay.cp} x dp {d} = {n} ranks, "
                        f"{plan.num_microbatches} micro-batches per step; pipeline sends and the bubble are not measured")
                return Slice(plan, job, "one_stage", text, ("pp",))
    # 3. one rank's share of every split layer
    return _one_rank(plan)


def _one_rank(plan: Job) -> Slice:
    lay, m = plan.layout, plan.model
    ids = plan.stage_layer_ids(max(range(lay.pp), key=lambda r: (len(plan.stage_layer_ids(r)), -r)))
    tp = lay.tp
    stage = _stage_model(plan, ids) if lay.pp > 1 else m
    moe = stage.moe
    upd: dict[str, Any] = {
        "num_attention_heads": m.num_attention_heads // tp,
        "num_kv_heads": max(1, m.kv_heads // tp),
        "head_dim": m.head_size,
        "ffn_hidden_size": max(1, m.ffn_hidden_size // tp),
        # the rank's share as the cost model counts it (states.local_vocab): the native (torchtitan)
        # job pads nothing, so ceil(vocab / tp), or the whole vocabulary under tp_replicated_vocab;
        # the worker itself refuses tp_replicated_vocab at tp > 1 (REFUSALS), not this share
        "vocab_size": local_vocab(plan),
        "name": f"{m.name} (one rank's share)",
    }
    if moe is not None:
        local = moe.num_experts // lay.ep
        upd["moe"] = MoESpec.model_validate({
            **moe.model_dump(), "num_experts": local, "top_k": min(moe.top_k, local),
            "shared_expert_ffn_hidden_size": max(1, moe.shared_width // tp) if moe.num_shared_experts else None,
        })
    model = stage.model_copy(update=upd)
    model = ModelSpec.model_validate(model.model_dump())
    seq = plan.training.seq_len // lay.cp
    training = _local_batch_training(plan, 1, seq_len=seq)
    if training.attention is not AttentionKernel.FLASH and lay.cp > 1:
        training = training.model_copy(update={"attention": AttentionKernel.FLASH})
    rl = lay.recompute_layers
    layout = Layout(
        mbs=lay.mbs, recompute=lay.recompute, zero=lay.zero if lay.zero is not Zero.OPTIMIZER else Zero.GRADIENTS,
        recompute_layers=None if rl is None else min(len(ids), rl * lay.vpp),
    )
    job = _try(model, plan.cluster.spec, 1, training, layout)
    if job is None:
        raise SpecError(f"no slice of this plan runs on the ranks at hand: one rank's share of {m.name} is not a valid job")
    not_measured = tuple(k for k, n in (("tp", lay.tp), ("cp", lay.cp), ("ep", lay.ep), ("pp", lay.pp), ("dp", plan.dp)) if n > 1)
    parts = [f"{k} {n}" for k, n in (("tp", lay.tp), ("cp", lay.cp), ("ep", lay.ep)) if n > 1]
    text = (f"one rank's share on 1 rank: {len(ids)} of {m.num_layers} layers with "
            f"{'the per-rank shapes of ' + ' x '.join(parts) if parts else 'the planned shapes'} "
            f"(heads {model.num_attention_heads}, kv heads {model.kv_heads}, ffn {model.ffn_hidden_size}, "
            f"vocab {model.vocab_size}, seq {seq}); {', '.join(not_measured) or 'no'} collectives not measured")
    return Slice(plan, job, "one_rank", text, not_measured)


# --- the run description ---------------------------------------------------------------------------


def model_doc(m: ModelSpec) -> dict[str, Any]:
    moe = m.moe
    return {
        "layers": m.num_layers, "hidden": m.hidden_size, "ffn": m.ffn_hidden_size, "heads": m.num_attention_heads,
        "kv_heads": m.kv_heads, "head_dim": m.head_size, "vocab": m.vocab_size, "max_positions": m.max_position_embeddings,
        "tie": m.tie_embeddings, "mlp": str(m.mlp), "norm": str(m.norm), "norm_eps": m.norm_eps,
        "positions": str(m.position_embedding),
        "qkv_bias": m.qkv_bias, "out_bias": m.out_bias, "mlp_bias": m.mlp_bias, "qk_norm": m.qk_norm,
        "embedding_norm": m.embedding_norm, "hidden_dropout": m.hidden_dropout, "attention_dropout": m.attention_dropout,
        "moe": None if moe is None else {
            "experts": moe.num_experts, "top_k": moe.top_k, "ffn": moe.expert_ffn_hidden_size,
            "shared": moe.num_shared_experts, "shared_ffn": moe.shared_width, "shared_gate": moe.shared_expert_gate,
            "router_bias": moe.router_bias,
            "score": str(moe.router_score), "renormalize": moe.renormalize_top_k, "scale": moe.routed_scaling_factor,
        },
        "mla": None if m.mla is None else {
            "q_lora": m.mla.q_lora_rank, "kv_lora": m.mla.kv_lora_rank, "nope": m.mla.qk_nope_head_dim,
            "rope": m.mla.qk_rope_head_dim, "v": m.mla.v_head_dim,
        },
        "moe_layers": list(m.moe_layer_ids),
        "window": m.sliding_window, "chunk": m.attention_chunk_size,
        "local_layers": [i for i in range(m.num_layers) if m.is_local_layer(i)],
        "nope_layers": [i for i in range(m.num_layers) if not m.layer_kind(i).rope],
        "attn_softcap": m.attn_logit_softcap, "final_softcap": m.final_logit_softcap, "sinks": m.attention_sinks,
        "sandwich_norms": m.sandwich_norms, "zero_centered_norm": m.zero_centered_norm, "scale_embedding": m.scale_embedding,
        "query_pre_attn_scalar": m.query_pre_attn_scalar,
        "swiglu_limit": m.swiglu_limit, "swiglu_alpha": m.swiglu_alpha,
        "hybrid": m.hybrid_pattern,
        "mamba": None if m.mamba is None else mamba_doc(m.mamba),
    }


def mamba_doc(mb: MambaSpec) -> dict[str, Any]:
    """The Mamba-2 dimensions worker.Mamba2 is built from."""
    return {"heads": mb.num_heads, "head_dim": mb.head_dim, "state": mb.state_size, "groups": mb.num_groups,
            "conv_kernel": mb.conv_kernel, "chunk": mb.chunk_size, "conv_bias": mb.conv_bias, "proj_bias": mb.proj_bias}


def run_doc(job: Job, *, name: str, steps: int, warmup: int, fp32: bool = False, seed: int = 0,
            check: bool = False, profile: bool = True, lr: float | None = None, unprofiled_steps: int = 0) -> dict[str, Any]:
    """One entry of job.json's `runs`: everything the worker needs to build and train the slice.
    `unprofiled_steps` timed steps run without the profiler between the warm-up and the `steps`
    profiled ones."""
    lay = job.layout
    full_layers = [
        lid for chunks in job.stage_chunks for chunk in chunks for pos, lid in enumerate(chunk)
        if job.recompute_mode(pos) is Recompute.FULL
    ]
    opt = dict(OPTIMIZER, kind=str(job.training.optimizer), implementation=optimizer_implementation(job.training))
    if lr is not None:
        opt["lr"] = lr
    return {
        "name": name,
        "model": model_doc(job.model),
        "mesh": {"pp": lay.pp, "dp_replicate": job.dp // (lay.dp_shard or job.dp), "dp_shard": lay.dp_shard or job.dp,
                 "cp": lay.cp, "tp": lay.tp, "ep": lay.ep},
        "sp": job.sp,
        "zero": int(job.zero),
        "fsdp_split_root": job.training.splits_fsdp_root,
        "stages": [[list(chunk) for chunk in chunks] for chunks in job.stage_chunks],
        "schedule": str(job.schedule),
        "mbs": lay.mbs,
        "microbatches": job.num_microbatches,
        "global_batch": job.training.global_batch_size,
        "seq_len": job.training.seq_len,
        "dtype": "float32" if fp32 else DTYPE_NAME[job.training.precision],
        "recompute": {"full_layers": full_layers, "selective": lay.recompute is Recompute.SELECTIVE},
        "attention": str(job.training.attention),
        "optimizer": opt,
        "steps": steps,
        "warmup": warmup,
        "unprofiled_steps": unprofiled_steps,
        "seed": seed,
        "profile": profile,
        "check": check,
    }


def job_doc(runs: list[dict[str, Any]], *, backend: str, device: str, step_timeout_s: float,
            collective_timeout_s: float | None = None, debug: dict[str, Any] | None = None) -> dict[str, Any]:
    """The whole job.json: runs executed in order by the same ranks."""
    return {
        "version": WORKER_FORMAT,
        "backend": backend,
        "device": device,
        "timeouts": {"step_s": step_timeout_s, "collective_s": collective_timeout_s or step_timeout_s},
        "debug": debug or {},
        "runs": runs,
    }
