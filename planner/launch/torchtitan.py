"""torchtitan: train.sh running `torchrun … -m torchtitan.train`.

0.3.x (--torchtitan-version 0.3): `--module M --config C` picks a config function of torchtitan's
registry, and `--parallelism.* --training.* --compile.*` flags and an `activation-checkpoint:MODE`
subcommand override it (torchtitan/config/manager.py, ConfigManager.parse_args; §2.4 of
shared/reference/launch_formats.md). What no flag reaches (float8/MX converters, an explicit
stage split) goes into torchtitan_plan.py, a config function that wraps the registry's.
0.2.x (--torchtitan-version 0.2): torchtitan.toml with [job] [model] [training] [parallelism]
[activation_checkpoint] [compile] [quantize…] (torchtitan/config/job_config.py v0.2.2, §2.2),
passed as --job.config_file.

torchtitan's degrees: dp_replicate·dp_shard·cp·tp·pp = world (parallel_dims.py); FSDP shards over
dp_shard·cp, as the planner's dense shard group. local_batch_size is one gradient-accumulation
step of one dp rank; with a pipeline it is split into micro-batches of
pipeline_parallel_microbatch_size (configs.py TrainingConfig, trainer.py L118-140 in 0.3.0).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from cost_models.enums import Fp8Recipe, MLPKind, MoEDispatch, NormKind, PositionKind, Precision, Recompute, Schedule, Zero
from cost_models.errors import LayoutError, SpecError
from cost_models.job import Job
from cost_models.model_spec import ModelSpec
from planner.launch.shell import Raw, Word, command
from planner.launch.slurm import environment_lines, layout_summary, script_head, torchrun_head
from planner.launch.options import titan02_keeps_mixed_precision
from planner.launch.target import CHECKPOINT_DIR_LINE, File, Target, TitanVersion, check_single_axes, save_interval_lines

PLAN_MODULE = "torchtitan_plan"  # torchtitan_plan.py, the config function for 0.3.x
PLAN_FUNCTION = "plan_config"


@dataclass(frozen=True)
class TitanModel:
    """A model of torchtitan's registry and the planner preset with its shape."""

    preset: str
    module: str  # torchtitan.models.<module>
    config: str | None  # 0.3.0 config_registry function (None: the registry has none)
    flavor: str  # 0.2.2 [model] flavor; 0.3.0 model_registry key
    # The 0.3.0 config function also switches on what the plan may not have: llama3_405b() adds a
    # Float8LinearConverter and compile with async tensor parallel (llama3/config_registry.py
    # L295-310), so torchtitan_plan.py rebuilds the model spec and sets compile from the plan.
    config_extras: bool = False
    # 0.3 only: no flavour equals the model; torchtitan_plan.py builds a llama3 model config of the
    # spec's dimensions (generated_model below) inside llama3_8b()'s trainer settings.
    generated: bool = False


# torchtitan/models/llama3/config_registry.py L184-295 and qwen3/config_registry.py L295 (0.3.0);
# flavors in torchtitan/models/{llama3,qwen3}/__init__.py (v0.2.2 and 0.3.0). Each flavour's
# dimensions, rope (theta, Llama-3.1 scaling) and norm epsilon equal the preset's in both releases
# (tests/test_launch_titan_model.py builds the 0.3.0 ones; tests/test_launch_titan_02_flavours.py
# applies v0.2.2's rules to its TransformerModelArgs, tests/data/torchtitan_022_flavours.toml). Not listed: qwen3 `235B-A22B`, whose rope theta is
# 5,000,000 (0.3.0 qwen3/__init__.py _235b_a22b; v0.2.2 the same) where Qwen3-235B-A22B's
# config.json has 1,000,000: that flavour trains another model.
TITAN_MODELS = (
    TitanModel("llama-3.1-8b", "llama3", "llama3_8b", "8B"),
    TitanModel("llama-3.1-70b", "llama3", "llama3_70b", "70B"),
    TitanModel("llama-3.1-405b", "llama3", "llama3_405b", "405B", config_extras=True),
    TitanModel("qwen3-30b-a3b", "qwen3", "qwen3_30b_a3b", "30B-A3B"),
)

# torchtitan 0.2.2 models whose TrainSpec has pipelining_fn=None (qwen3/__init__.py L199 at v0.2.2): the
# trainer raises "Pipeline Parallel is enabled but qwen3 does not support pipelining" (train.py L218-223).
NO_PIPELINING_02 = frozenset({"qwen3"})

# torchtitan's MoE balances experts without an auxiliary loss: a per-expert routing bias updated
# before each optimizer step at rate load_balance_coeff (default 1e-3; torchtitan 0.3.0
# models/common/moe.py L369-395, components/optimizer/optimizer.py register_moe_load_balancing_hook;
# DeepSeek's auxiliary-loss-free balancing, arXiv 2408.15664). No setting adds the GShard/Switch loss.
TITAN_BALANCING = "auxiliary-loss-free (a routing bias per expert, update rate 1e-3)"

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z0-9_.-]+")


def _shape(model: ModelSpec) -> dict:
    return model.model_dump(exclude={"name", "source"})


def without_idle_window(model: ModelSpec, seq_len: int) -> ModelSpec:
    """The model as trained at seq_len: a sliding window of at least seq_len tokens masks nothing (a
    query attends keys i − window < j ≤ i, all earlier ones when i < window; transformers
    masking_utils sliding_window_overlay), so it is full causal attention, which torchtitan's
    llama3 modules run. Local layers with their own rotary base (Gemma 3) stay apart."""
    if model.sliding_window is None or seq_len > model.sliding_window or model.rope_local_theta is not None:
        return model
    return ModelSpec.model_validate(model.model_dump() | {"sliding_window": None, "full_attention_every": None})


def single_axes(target: Target) -> dict[str, str]:
    """The layout axes this launch runs only at 1, each with its refusal ({} the degree): pp for a
    model with tied embeddings on 0.3, and for a torchtitan 0.2 model without pipelining. A model
    with no registry entry is refused whole (titan_model), whatever the layout."""
    if target.options.torchtitan_version is not TitanVersion.V02:
        if not target.job.model.tie_embeddings:
            return {}
        # torchtitan 0.3.0rc1 (pytorch/torchtitan@1fdf90d3) torchtitan/models/common/decoder.py L139-142:
        # Decoder.update_from_config raises NotImplementedError for enable_weight_tying with pp > 1
        return {"pp": ("torchtitan 0.3 does not run tied embeddings under pipeline parallelism (\"Weight tying is "
                       "not supported with Pipeline Parallel\"), so pp({}) > 1 fails at start; use --pp 1, or "
                       "--framework megatron")}
    try:
        module = titan_model(target).module
    except SpecError:
        return {}
    if module not in NO_PIPELINING_02:
        return {}
    return {"pp": (f"torchtitan 0.2's {module} model has no pipelining (pipelining_fn None), "
                   "so pp({}) > 1 fails at start; use --pp 1, or --torchtitan-version 0.3")}


def titan_model(target: Target) -> TitanModel:
    """The registry entry for the plan's model: --torchtitan-model, else the preset of the same shape."""
    opts = target.options
    model = without_idle_window(target.job.model, target.job.training.seq_len)
    v03 = opts.torchtitan_version is TitanVersion.V03
    if model.mlp is MLPKind.SQUARED_RELU or (model.zero_centered_norm and model.norm is NormKind.LAYERNORM):
        # torchtitan 0.3.0's language models (torchtitan/models/: llama3, qwen3, qwen3_5, deepseek_v3,
        # kimi_k2_7, gpt_oss) have no squared-ReLU MLP and no LayerNorm1P
        raise SpecError(
            f"model {model.name!r}: torchtitan has no Nemotron-4 model (squared-ReLU MLP, LayerNorm1P); "
            "Megatron-LM runs it (--squared-relu --apply-layernorm-1p): use --framework megatron"
        )
    if opts.torchtitan_model is not None:
        if not _NAME.fullmatch(opts.torchtitan_model):
            form = "MODULE:CONFIG, e.g. llama3:llama3_8b" if v03 else "NAME:FLAVOR, e.g. llama3:8B"
            raise SpecError(f"--torchtitan-model {opts.torchtitan_model!r}: expected {form}")
        module, _, second = opts.torchtitan_model.partition(":")
        return TitanModel("", module, second if v03 else None, "" if v03 else second)
    from planner import presets

    known = presets.models()
    for entry in TITAN_MODELS:
        if _shape(known[entry.preset]) == _shape(model) and (entry.config or not v03):
            return entry
    why = generation_blocker(model)
    if v03 and why is None:
        return TitanModel("", "llama3", "llama3_8b", "8B", generated=True)
    have = ", ".join(e.preset for e in TITAN_MODELS if e.config or not v03)
    form = "MODULE:CONFIG" if v03 else "NAME:FLAVOR"
    reason = f"no model config can be generated ({why})" if v03 else "0.2 takes a flavour only (0.3 generates llama3 configs)"
    raise SpecError(
        f"model {model.name!r}: torchtitan {opts.torchtitan_version} has no registry entry of its shape "
        f"(known: {have}) and {reason}; name one with --torchtitan-model {form}, or use --framework megatron or deepspeed"
    )


def generation_blocker(m: ModelSpec) -> str | None:
    """Why torchtitan 0.3's llama3 modules cannot hold the model, or None when they can: RMSNorm,
    rotary over the whole head (ComplexRoPE, optional Llama-3.1 scaling), SwiGLU, no biases, no
    q/k norm, no dropout (torchtitan/models/llama3/__init__.py _build_llama3_layers and
    models/common: Linear bias False, FusedQKVLinear, FeedForward w1/w2/w3)."""
    checks = [
        (m.mla is not None, "multi-head latent attention: torchtitan's deepseek_v3 module has it, e.g. deepseek_v3:deepseek_v3_671b"),
        (m.moe is not None, "mixture of experts"),
        (m.position_embedding is not PositionKind.ROPE, f"{m.position_embedding} positions"),
        (m.norm is not NormKind.RMSNORM, f"{m.norm}"),
        (m.mlp is not MLPKind.SWIGLU, f"{m.mlp} MLP"),
        (m.qkv_bias or m.out_bias or m.mlp_bias, "linear biases"),
        (m.qk_norm, "q/k norms"),
        (m.embedding_norm, "a norm after the embedding"),
        (m.rotary_fraction != 1.0, "partial rotary"),
        (m.head_dim is not None and m.head_dim * m.num_attention_heads != m.hidden_size, "head_dim other than hidden/heads"),
        (m.hidden_dropout or m.attention_dropout, "dropout"),
        (m.sliding_window is not None, "sliding-window attention"),
        (m.attention_chunk_size is not None or m.nope_full_layers, "chunked attention and NoPE layers"),
        (m.attn_logit_softcap or m.final_logit_softcap, "soft-capping"),
        (m.attention_sinks, "attention sinks"),
        (m.sandwich_norms or m.zero_centered_norm or m.scale_embedding, "Gemma's norms and embedding scale"),
        (m.rope_scaling is not None and m.rope_scaling.kind != "llama3", "rope scaling other than Llama 3.1's"),
        (m.qk_l2_norm or m.attn_temperature_tuning or m.query_pre_attn_scalar is not None, "Llama 4 / Gemma attention scaling"),
    ]
    return next((what for bad, what in checks if bad), None)


def generated_model(m: ModelSpec, seq_len: int) -> list[str]:
    """Lines of torchtitan_plan.py's function that build the spec's model config with torchtitan
    0.3.0's own llama3 builders (the same helpers and initialisers as its 8B/70B/405B flavours)."""
    heads = m.num_attention_heads
    rope = [f"dim={m.hidden_size // heads}", f"max_seq_len={max(m.max_position_embeddings, seq_len)}", f"theta={m.rope_theta!r}"]
    if m.rope_scaling is not None:
        rs = m.rope_scaling
        rope += ["scaling='llama'", f"scaling_factor={rs.factor!r}", f"low_freq_factor={rs.low_freq_factor!r}",
                 f"high_freq_factor={rs.high_freq_factor!r}", f"original_max_position_embeddings={rs.original_max_position_embeddings}"]
    h, v = m.hidden_size, m.vocab_size
    return [
        "    # generated from the planned model (no torchtitan flavour equals it)",
        f"    rope = ComplexRoPE.Config({', '.join(rope)})",
        "    model = Llama3Model.Config(",
        f"        dim={h}, vocab_size={v}, enable_weight_tying={m.tie_embeddings},",
        f"        tok_embeddings=Embedding.Config(num_embeddings={v}, embedding_dim={h}, param_init=_EMBEDDING_INIT),",
        f"        norm=RMSNorm.Config(normalized_shape={h}, eps={m.norm_eps!r}, param_init=_NORM_INIT),",
        f"        lm_head=Linear.Config(in_features={h}, out_features={v}, param_init=_output_linear_init({h})),",
        f"        layers=_build_llama3_layers(n_layers={m.num_layers}, dim={h}, n_heads={heads}, n_kv_heads={m.kv_heads},",
        f"                                    hidden_dim={m.ffn_hidden_size}, rope=rope, fuse_qkv=True, attn_backend='flex'),",
        "    )",
        "    for layer in model.layers:  # the builder leaves RMSNorm's default epsilon (1e-5) on the layer norms",
        f"        layer.attention_norm.eps = layer.ffn_norm.eps = {m.norm_eps!r}",
        f"    config.model_spec = dataclasses.replace(model_registry('8B'), flavor={m.name!r}, model=model)",
        f"    config.loss.loss_fn.global_vocab_size = {v}",
    ]


def check(target: Target) -> None:
    job = target.job
    lay, tr = job.layout, job.training
    v = target.options.torchtitan_version
    if tr.precision is Precision.FP16:  # fp4 never gets here: the fp4 rule (cost_models.rules) refuses it first
        raise SpecError("training: torchtitan trains in bf16 or fp8 (mixed_precision_param: bfloat16, float32; float8 and "
                        "MXFP8 converters), not fp16; use --dtype bf16 or fp8")
    m = job.model
    if m.sliding_window is not None and tr.seq_len > m.sliding_window and target.options.torchtitan_model is None:
        # torchtitan 0.3.0's llama3 modules (the ones a model config is generated for) attend in full
        raise SpecError(
            f"model {m.name!r}: sliding_window {m.sliding_window} < seq_len {tr.seq_len}, and torchtitan's llama3 "
            f"modules have no sliding-window attention; use --seq-len {m.sliding_window} or less, or --framework megatron or deepspeed"
        )
    if lay.recompute_layers is not None:
        raise LayoutError(
            "layout: recompute_layers (full recompute of the first k layers of each chunk) has no torchtitan "
            "setting (activation checkpointing is none, selective, full or memory_budget); drop --recompute-layers"
        )
    if job.schedule is Schedule.GPIPE and lay.vpp > 1:
        raise LayoutError("layout: GPipe is a single-stage schedule; use vpp 1")
    if tr.moe_dispatch is MoEDispatch.DEEPEP and v is TitanVersion.V03:
        # 0.3 picks DeepEP in the model's config function (models/common/config_utils.py comm_backend
        # at b5bcd76c6), no flag; 0.2.2 has [parallelism] expert_parallel_comm_backend (job_config.py L474)
        raise LayoutError("training: moe_dispatch deepep is written as torchtitan 0.2's [parallelism] "
                          "expert_parallel_comm_backend; use --torchtitan-version 0.2, or --moe-dispatch alltoall")
    if lay.ep > 1 or job.model.moe is not None:
        if v is TitanVersion.V03 and job.etp != 1:
            raise LayoutError(
                f"layout: torchtitan 0.3 has no expert tensor parallel (ParallelismConfig lost "
                f"expert_tensor_parallel_degree); etp({job.etp}) must be 1, or use --torchtitan-version 0.2"
            )
    check_single_axes(target, single_axes(target))
    if v is TitanVersion.V02 and job.zero is not Zero.NONE and not titan02_keeps_mixed_precision(
            tp=lay.tp, pp=lay.pp, cp=lay.cp, ep=lay.ep, dp=lay.dp, dp_shard=lay.dp_shard):
        raise LayoutError(
            f"layout: torchtitan 0.2 applies FSDP2 only at dp_shard > 1 or cp > 1 (or ep > 1), and dp_shard is "
            f"{lay.dp_shard} with cp {lay.cp}: it would "
            + ("train this layout in fp32 (mixed precision needs FSDP with tp or pp)" if lay.tp * lay.pp > 1
               else "run DDP instead")
            + "; use --torchtitan-version 0.3 (fully_shard at every degree), a layout with dp_shard >= 2 or cp >= 2"
            + ("" if lay.tp * lay.pp > 1 else ", or zero 0"))
    if v is TitanVersion.V02 and lay.tp > 1 and not job.sp:
        raise LayoutError("layout: torchtitan 0.2 always runs sequence parallel with tp > 1; use --sp or --torchtitan-version 0.3")
    if tr.precision is Precision.FP8 and v is TitanVersion.V03 and titan_model(target).generated:
        raise SpecError(
            f"training: fp8 converts a flavour's model config in torchtitan 0.3 (model_registry(flavor, converters)); "
            f"{job.model.name!r} has no flavour, its config is generated; use --dtype bf16"
        )
    if tr.precision is Precision.FP8 and v is TitanVersion.V03:
        if tr.fp8_recipe is Fp8Recipe.TENSORWISE:
            raise SpecError(
                "training: torchtitan 0.3's Float8LinearConverter has recipes rowwise and rowwise_with_gw_hp only "
                "(torchtitan/components/quantization/float8.py L58); use --fp8-recipe rowwise or --torchtitan-version 0.2"
            )
        if target.options.torchtitan_model is not None:
            raise SpecError("training: fp8 with --torchtitan-model needs the model's flavor; drop --torchtitan-model or use --torchtitan-version 0.2")


# --- the stage split ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Split:
    """How torchtitan is told the planner's stage split: layers per virtual stage and the
    first/last "less layers" weights (pipeline_parallel.py 0.3.0 L194-265, L366-476), or an
    explicit module list when no weights give it (uneven ends with vpp > 1, middle ranks of different sizes)."""

    layers_per_stage: int | None
    first_less: int
    last_less: int
    fqns: list[list[str]] | None


def split(job: Job, output: str) -> Split:
    lay = job.layout
    if lay.pp == 1:
        return Split(None, 1, 1, None)
    stages = [len(job.stage_chunks[r][v]) for v in range(lay.vpp) for r in range(lay.pp)]
    if len(set(stages)) == 1:
        # Weights 0: ceil(n / per) = pp·vpp stages of exactly n/(pp·vpp) layers each.
        return Split(stages[0], 0, 0, None)
    counts = [len(job.stage_layer_ids(r)) for r in range(lay.pp)]
    middle = max(counts)
    if lay.vpp == 1 and all(c == middle for c in counts[1:-1]):
        # Weights middle-first and middle-last: pp stages of `middle` effective layers, the first
        # holding `first` real layers and the last `last` (the generator's arithmetic).
        return Split(middle, middle - counts[0], middle - counts[-1], None)
    # Stage s = chunk v of rank r with s = v·pp + r (the "loop" style, pipeline_parallel.py L541-575).
    fqns: list[list[str]] = []
    for v in range(lay.vpp):
        for r in range(lay.pp):
            layers = [f"layers.{i}" for i in job.stage_chunks[r][v]]
            s = v * lay.pp + r
            head = ["tok_embeddings"] if s == 0 else []
            tail = ["norm", output] if s == lay.pp * lay.vpp - 1 else []
            fqns.append(head + layers + tail)
    return Split(None, 1, 1, fqns)


def _schedule(job: Job) -> str:
    # torch.distributed.pipelining get_schedule_class names (§2.2).
    return {Schedule.ONE_F_ONE_B: "1F1B", Schedule.INTERLEAVED: "Interleaved1F1B", Schedule.GPIPE: "GPipe"}[job.schedule]


def settings(job: Job, output: str) -> dict[str, dict[str, object]]:
    """The plan as torchtitan sections and keys (the same names in 0.2.2's TOML and 0.3.0's flags)."""
    lay, tr = job.layout, job.training
    assert tr.global_batch_size is not None and lay.dp_shard is not None
    par: dict[str, object] = {}
    if job.zero is Zero.NONE:
        par |= {"data_parallel_replicate_degree": job.dp, "data_parallel_shard_degree": 1}  # DDP
    else:
        par |= {
            "data_parallel_replicate_degree": job.dp // lay.dp_shard,  # HSDP when > 1
            "data_parallel_shard_degree": lay.dp_shard,
            # zero 3 reshards after forward, zero 2 keeps the gathered parameters (§2.2)
            "fsdp_reshard_after_forward": "always" if job.zero is Zero.PARAMETERS else "never",
        }
    par["tensor_parallel_degree"] = lay.tp
    par["context_parallel_degree"] = lay.cp
    if lay.pp > 1:
        sp = split(job, output)
        par |= {"pipeline_parallel_degree": lay.pp, "pipeline_parallel_schedule": _schedule(job)}
        if sp.fqns is not None:
            par["module_fqns_per_model_part"] = sp.fqns
        else:
            par |= {
                "pipeline_parallel_layers_per_stage": sp.layers_per_stage,
                "pipeline_parallel_first_stage_less_layers": sp.first_less,
                "pipeline_parallel_last_stage_less_layers": sp.last_less,
            }
        par["pipeline_parallel_microbatch_size"] = lay.mbs
    if job.model.moe is not None:
        par["expert_parallel_degree"] = lay.ep
    # With a pipeline, one step of a dp rank is all its micro-batches; else one micro-batch per
    # gradient-accumulation step (torchtitan train.py: accumulation = global / (local·dp)).
    local = lay.mbs * job.num_microbatches if lay.pp > 1 else lay.mbs
    training: dict[str, object] = {
        "local_batch_size": local,
        "global_batch_size": tr.global_batch_size,
        "seq_len": tr.seq_len,
        "mixed_precision_param": "bfloat16",
    }
    ac = {Recompute.NONE: "none", Recompute.SELECTIVE: "selective", Recompute.FULL: "full"}[lay.recompute]
    return {"parallelism": par, "training": training, "activation_checkpoint": {"mode": ac}}


# --- 0.3.x: flags and a config function -----------------------------------------------------------


def _flag_value(value: object) -> list[Word]:
    assert not isinstance(value, (bool, list)), value
    return [value]  # type: ignore[list-item]


def overrides(target: Target) -> tuple[list[tuple[Word, ...]], str | None]:
    """0.3.x: the flags after --module/--config, and the text of torchtitan_plan.py (or None)."""
    job = target.job
    conf = settings(job, "lm_head")  # 0.3.0 names the output projection lm_head (pipeline_parallel.py L396)
    par = conf["parallelism"]
    fqns = par.pop("module_fqns_per_model_part", None)
    out: list[tuple[Word, ...]] = []
    for key, value in par.items():
        out.append((f"--parallelism.{key}", *_flag_value(value)))  # configs.py ParallelismConfig L112
    if job.layout.tp > 1 and not job.sp:
        out.append(("--parallelism.no_enable_sequence_parallel",))  # configs.py: enable_sequence_parallel=True
    for key, value in conf["training"].items():
        out.append((f"--training.{key}", *_flag_value(value)))  # configs.py TrainingConfig L36
    if job.layout.pp > 1 or job.layout.ep > 1:
        # CUDA graphs are on by default and refuse pp > 1, and ep > 1 with the standard dispatcher (trainer.py L179-209).
        out.append(("--training.disable_cuda_graphs",))
    if job.training.compile:
        out.append(("--compile.enable",))  # configs.py CompileConfig L291
    if job.training.tp_comm_overlap:
        out.append(("--compile.enable_async_tensor_parallel",))  # configs.py L295 (needs compile of the model)
    entry = titan_model(target)
    need_function = fqns is not None or job.training.precision is Precision.FP8 or entry.config_extras or entry.generated
    return out, (plan_function(target, fqns) if need_function else None)


def plan_function(target: Target, fqns: list[list[str]] | None) -> str:
    """torchtitan_plan.py: the registry's config function with what no flag can set."""
    entry = titan_model(target)
    tr = target.job.training
    module = entry.module if "." in entry.module else f"torchtitan.models.{entry.module}"
    lines = [
        '"""torchtitan 0.3.x config function written by planner launch: the registry\'s config with',
        'what no command-line flag reaches. train.sh selects it with --module torchtitan_plan --config plan_config."""',
        "",
        f"from {module}.config_registry import {entry.config}",
    ]
    body = [f"    config = {entry.config}()"]
    if entry.generated:
        lines[-1:] = [
            "import dataclasses",
            "",
            f"from {module} import (",
            "    _EMBEDDING_INIT, _NORM_INIT, Llama3Model, _build_llama3_layers, _output_linear_init, model_registry,",
            ")",
            f"from {module}.config_registry import {entry.config}",
            "from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm",
        ]
        body += generated_model(target.job.model, tr.seq_len)
    elif tr.precision is Precision.FP8:
        if tr.fp8_recipe is Fp8Recipe.MXFP8:
            lines.append("from torchtitan.components.quantization import MXFP8LinearConverter")
            converter = "MXFP8LinearConverter.Config(model_compile_enabled=config.compile.enable)"
        else:
            lines.append("from torchtitan.components.quantization import Float8LinearConverter")
            converter = (f"Float8LinearConverter.Config(recipe_name={str(tr.fp8_recipe)!r}, filter_fqns=['lm_head'], "
                         "model_compile_enabled=config.compile.enable)")
        lines.append(f"from {module} import model_registry")
        # model_spec is not reachable from the command line (Trainer.Config: tyro.conf.Suppress, §2.1).
        body.append(f"    config.model_spec = model_registry({entry.flavor!r}, converters=[{converter}])")
    elif entry.config_extras:
        lines.append(f"from {module} import model_registry")
        body.append(f"    config.model_spec = model_registry({entry.flavor!r})  # bf16: no float8 converter")
    if entry.config_extras:
        # the plan's compile settings; --compile.* flags after --config can still switch them on
        body.append(f"    config.compile.enable = {tr.compile}")
        body.append(f"    config.compile.enable_async_tensor_parallel = {tr.tp_comm_overlap}")
    if fqns is not None:
        body.append("    # A split no layers-per-stage weights give (uneven ranks): stage s = chunk v of pipeline rank r, s = v*pp + r.")
        body.append("    config.parallelism.module_fqns_per_model_part = [")
        body += [f"        {json.dumps(stage)}," for stage in fqns]
        body.append("    ]")
    lines += ["", "", f"def {PLAN_FUNCTION}():", *body, "    return config", ""]
    return "\n".join(lines)


# --- 0.2.x: a TOML file -------------------------------------------------------------------------


def _toml_string(text: str) -> str:
    """A TOML basic string: '"' and '\\' escaped, control characters as \\uXXXX, every other
    character as itself (TOML 1.0 forbids \\u escapes of surrogates, which json.dumps writes for
    characters beyond U+FFFF)."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(value)


def toml(target: Target) -> str:
    job = target.job
    entry = titan_model(target)
    tr = job.training
    conf = settings(job, "output")  # v0.2.2 names the output projection output (pipeline_parallel.py L264)
    model: dict[str, object] = {"name": entry.module, "flavor": entry.flavor}
    sections: dict[str, dict[str, object]] = {
        "job": {"dump_folder": "./outputs", "description": target.run_name},
        "model": model,
        "training": conf["training"] | {"dataset": "c4"},
        "parallelism": conf["parallelism"],
        "activation_checkpoint": conf["activation_checkpoint"],
    }
    if job.layout.recompute is Recompute.SELECTIVE:
        sections["activation_checkpoint"]["selective_ac_option"] = "op"  # per-op SAC, as 0.3's default
    if job.layout.tp > 1 and tr.tp_comm_overlap:
        sections["parallelism"]["enable_async_tensor_parallel"] = True
    if job.model.moe is not None:
        sections["parallelism"]["expert_tensor_parallel_degree"] = job.etp
        if tr.moe_dispatch is MoEDispatch.DEEPEP:
            sections["parallelism"]["expert_parallel_comm_backend"] = "deepep"  # job_config.py L474 (v0.2.2)
    if tr.compile:
        sections["compile"] = {"enable": True, "components": ["model", "loss"]}
    # folder and interval come from train.sh (CHECKPOINT_DIR, SAVE_INTERVAL); timeouts as 0.3's flags
    sections["checkpoint"] = {"enable": True}
    sections["comm"] = {"init_timeout_seconds": TIMEOUT_S, "train_timeout_seconds": TIMEOUT_S}
    if tr.precision is Precision.FP8:
        if tr.fp8_recipe is Fp8Recipe.MXFP8:
            model["converters"] = ["quantize.linear.mx"]  # job_config.py L767 MXLinear
            sections["quantize.linear.mx"] = {"recipe_name": "mxfp8_cublas"}
        else:
            # The registry key is quantize.linear.float8, not the "float8" of the shipped 405B TOML (§2.2 gotcha).
            model["converters"] = ["quantize.linear.float8"]
            sections["quantize.linear.float8"] = {"recipe_name": str(tr.fp8_recipe), "filter_fqns": ["output"]}
    lines = [
        "# torchtitan 0.2.x job written by planner launch; train.sh passes it as --job.config_file.",
        f"# {job.gpus} GPUs: {layout_summary(job)}",
        "# plan.json holds the layout, the specs and the prediction.",
    ]
    for name, keys in sections.items():
        lines += ["", f"[{name}]"]
        lines += [f"{key} = {_toml_value(value)}" for key, value in keys.items()]
    return "\n".join(lines) + "\n"


# --- train.sh -----------------------------------------------------------------------------------

# torch.distributed timeouts, seconds: Megatron's 10-minute default (DistributedInitConfig), for
# initialisation and for training alike.
TIMEOUT_S = 600


def fill_in(target: Target) -> list[str]:
    return [
        'HF_ASSETS_PATH="${HF_ASSETS_PATH:?set HF_ASSETS_PATH to the Hugging Face assets (tokenizer) directory of the model}"',
        CHECKPOINT_DIR_LINE,
        "# A dataset name torchtitan registers (c4, c4_test, ...); add --dataloader.dataset_path / --training.dataset_path after the script name for a local copy.",
        'DATASET="${DATASET:-c4}"',
        'STEPS="${STEPS:-1000}"',
        *save_interval_lines(target),
    ]


def files(target: Target) -> dict[str, File]:
    check(target)
    job = target.job
    v03 = target.options.torchtitan_version is TitanVersion.V03
    out: dict[str, File] = {}
    head = [
        *script_head(target, f"torchtitan {target.options.torchtitan_version}.x launch written by planner launch.", fill_in(target)),
        *environment_lines(target),
        'export PYTORCH_ALLOC_CONF="expandable_segments:True"  # as torchtitan run_train.sh (§2.5)',
    ]
    run = [*torchrun_head(), "-m", "torchtitan.train"]
    if v03:
        flags, function = overrides(target)
        if function is not None:
            out[f"{PLAN_MODULE}.py"] = File(function)
            head.append('export PYTHONPATH="$LAUNCH_DIR${PYTHONPATH:+:$PYTHONPATH}"  # torchtitan_plan.py')
            selected: list[tuple[Word, ...]] = [("--module", PLAN_MODULE), ("--config", PLAN_FUNCTION)]
        else:
            entry = titan_model(target)
            selected = [("--module", entry.module), ("--config", entry.config or "")]
        ac = settings(job, "lm_head")["activation_checkpoint"]["mode"]
        args = [
            *selected,
            ("--hf_assets_path", Raw('"$HF_ASSETS_PATH"')),  # Trainer.Config.hf_assets_path
            ("--dataloader.dataset", Raw('"$DATASET"')),  # HuggingFaceTextDataLoader.Config.dataset
            ("--training.steps", Raw('"$STEPS"')),
            ("--dump_folder", Raw('"./outputs/$RUN_NAME"')),  # Trainer.Config.dump_folder
            # components/checkpointer/base.py Config L223-266 (enable False, folder joined to dump_folder
            # as os.path.join does, so an absolute path stands; interval 500 by default)
            ("--checkpoint.enable",),
            ("--checkpoint.folder", Raw('"$CHECKPOINT_DIR"')),
            ("--checkpoint.interval", Raw('"$SAVE_INTERVAL"')),
            # config/configs.py CommConfig L314-321 (defaults 300 s and 100 s), as Megatron's 10 minutes
            ("--comm.init_timeout_seconds", TIMEOUT_S),
            ("--comm.train_timeout_seconds", TIMEOUT_S),
            *flags,
            (Raw('"$@"'),),
            # A tyro subcommand (distributed/activation_checkpoint.py); it comes last.
            (f"activation-checkpoint:{ac}",),
        ]
    else:
        out["torchtitan.toml"] = File(toml(target))
        args = [
            ("--job.config_file", Raw('"$LAUNCH_DIR/torchtitan.toml"')),  # v0.2.2 run_train.sh
            ("--model.hf_assets_path", Raw('"$HF_ASSETS_PATH"')),
            ("--training.dataset", Raw('"$DATASET"')),
            ("--training.steps", Raw('"$STEPS"')),
            ("--job.dump_folder", Raw('"./outputs/$RUN_NAME"')),
            ("--checkpoint.folder", Raw('"$CHECKPOINT_DIR"')),
            ("--checkpoint.interval", Raw('"$SAVE_INTERVAL"')),
            (Raw('"$@"'),),
        ]
    text = "\n".join([*head, "", command(run, args), ""])
    out["train.sh"] = File(text, executable=True)
    return out
