"""Megatron-LM: train.sh running `torchrun … pretrain_gpt.py` with the plan's flags, or
`pretrain_hybrid.py` for a hybrid Mamba-2 / attention model.

Spellings are those of Megatron-LM main (core 0.19/0.20.dev, commit d98e8a64), read from the files
named per flag: ARG = megatron/training/arguments.py, TC = megatron/core/transformer/
transformer_config.py, MPC = megatron/core/model_parallel_config.py, TRC = megatron/training/config/
training_config.py, CC = megatron/training/config/common_config.py; "§" = a section of
shared/reference/launch_formats.md. Since core 0.16, flags named after a TransformerConfig or
ModelParallelConfig field are generated from it (`--field-name`; a bool defaulting to True becomes
`--no-field-name`/`--disable-field-name`; megatron/training/argument_utils.py L160-212).
"""

from __future__ import annotations

from cost_models.enums import (
    AmaxGroup, AttentionKernel, MLPKind, MoEDispatch, NormKind, OptimizerKind, PositionKind, Precision, Recompute, RouterScore,
    Schedule, Zero,
)
from cost_models.errors import LayoutError, SpecError
from cost_models.job import Job
from cost_models.model_spec import ModelSpec
from cost_models.states import padded_vocab
from planner.launch.shell import Raw, Word, command
from planner.launch.slurm import environment_lines, script_head, torchrun_head
from planner.launch.target import CHECKPOINT_DIR_LINE, MegatronFsdp, Target, save_interval_lines

VERSION = "Megatron-LM main (core 0.19 spellings; checked against commit d98e8a64)"

Flag = tuple[Word, ...]

# --use-rope-scaling applies Llama 3.1's scaling with low_freq_factor 1, high_freq_factor 4 and an
# original length of 8192 fixed (megatron/core/models/common/embeddings/rotary_pos_embedding.py
# _apply_scaling, L92-99). --rope-scaling-factor exists (ARG L2424-2427), but pretrain_gpt.py's model
# builder does not hand it to GPTModel (Megatron-LM d98e8a64 gpt_builders.py L86-104 passes rope_scaling only), so the
# factor is GPTModel's default, 8.0 (megatron/core/models/gpt/gpt_model.py L116).
LLAMA3_ROPE_FIXED = (1.0, 4.0, 8192)
MEGATRON_ROPE_FACTOR = 8.0

# quick_gelu(y) = y·sigmoid(1.702·y) (Megatron-LM@d98e8a64 megatron/core/fusions/fused_bias_geglu.py L185-187)
QUICK_GELU_ALPHA = 1.702

# torch.distributed's timeout, minutes: Megatron's default (DistributedInitConfig.distributed_timeout_minutes,
# CC L77), written out so train.sh says what runs.
DISTRIBUTED_TIMEOUT_MINUTES = 10


def fsdp_kind(job: Job, target: Target) -> MegatronFsdp | None:
    """Which fully sharded data parallel runs zero 2/3, or None (DDP / distributed optimizer)."""
    return target.options.megatron_fsdp if job.zero >= Zero.GRADIENTS else None


# Megatron's MambaMixer: `assert not bias`, `assert conv_bias` (Megatron-LM@d98e8a64
# megatron/core/ssm/mamba_mixer.py L276-277); d_conv = 4 and chunk_size = 128 are constructor
# defaults with no flag (mamba_mixer.py __init__, L174-194).
MEGATRON_MAMBA_CONV_KERNEL = 4
MEGATRON_MAMBA_CHUNK = 128


def check(target: Target) -> None:
    """Refuse what Megatron cannot run or the flags cannot say, with the rule and the way out."""
    job = target.job
    m, lay, tr = job.model, job.layout, job.training
    mb = m.mamba
    if tr.fp8_attention:
        raise SpecError(
            "fp8_attention has no Megatron-LM flag: pretrain_gpt.py's arguments leave out TransformerConfig."
            "fp8_dot_product_attention (Megatron-LM@d98e8a64 megatron/training/arguments.py:2307, 2333: \"no CLI "
            "argument exists for these\"), which NeMo sets in its model config; drop --fp8-attention to write a Megatron-LM launch"
        )
    if tr.te_amax_reduction in (AmaxGroup.TP, AmaxGroup.TP_CP):
        raise SpecError(
            f"te_amax_reduction {tr.te_amax_reduction} is TransformerConfig.tp_only_amax_red, which Megatron-LM's arguments leave without "
            "a flag (Megatron-LM@d98e8a64 megatron/training/arguments.py:2307, 2335); its delayed scaling reduces the "
            "amaxes over tp x cp x dp (megatron/core/fp8_utils.py:859-860): use te_amax_reduction tp_dp or none to write "
            "a Megatron-LM launch"
        )
    if mb is not None:
        if mb.proj_bias or not mb.conv_bias:
            raise SpecError(
                f"model {m.name!r}: Megatron's MambaMixer has no in_proj/out_proj bias and always a conv1d bias "
                "(mamba_mixer.py L276-277: assert not bias, assert conv_bias); this Mamba block cannot be emitted for megatron"
            )
        if (mb.conv_kernel, mb.chunk_size) != (MEGATRON_MAMBA_CONV_KERNEL, MEGATRON_MAMBA_CHUNK):
            raise SpecError(
                f"model {m.name!r}: Mamba conv_kernel {mb.conv_kernel} and chunk_size {mb.chunk_size} have no Megatron flags; "
                f"its MambaMixer uses {MEGATRON_MAMBA_CONV_KERNEL} and {MEGATRON_MAMBA_CHUNK} (mamba_mixer.py __init__ defaults)"
            )
    if m.position_embedding is PositionKind.ALIBI:
        raise SpecError(
            f"model {m.name!r}: alibi positions have no Megatron flag (--position-embedding-type takes "
            "learned_absolute, rope, yarn, mrope, relative or none; ARG L2397); this model cannot be emitted for megatron"
        )
    if m.embedding_norm:
        raise SpecError(f"model {m.name!r}: a norm after the token embedding has no Megatron flag; this model cannot be emitted for megatron")
    if (m.qkv_bias, m.out_bias, m.mlp_bias) not in {(True, True, True), (False, False, False), (True, False, False)}:
        raise SpecError(
            f"model {m.name!r}: biases qkv={m.qkv_bias} out={m.out_bias} mlp={m.mlp_bias} have no Megatron flags; "
            "Megatron has all linear biases, none (--disable-bias-linear) or q/k/v only (--add-qkv-bias)"
        )
    blocker = megatron_blocker(m)
    if blocker:
        raise SpecError(f"model {m.name!r}: {blocker} has no Megatron flag (Megatron-LM@d98e8a64); use --framework deepspeed, "
                        "whose training script builds the Hugging Face model from config.json")
    if m.moe is not None and m.moe.expert_bias and m.moe.router_score is not RouterScore.SIGMOID:
        raise SpecError(
            f"model {m.name!r}: Megatron's expert bias (aux-loss-free balancing) runs with the sigmoid router only "
            "(Megatron-LM@d98e8a64 transformer_config.py L2617-2624)"
        )
    if m.mtp_layers and lay.pp_layout is not None:
        raise LayoutError(
            f"layout: with {m.mtp_layers} MTP layer(s) Megatron's --pipeline-model-parallel-layout must place them "
            "(pipeline_parallel_layer_layout.py L112-114), which --pp-layout cannot say; use --pp-first-layers / "
            "--pp-last-layers (the MTP layers then go to the last stage)"
        )
    if m.mla is not None and (m.qkv_bias or m.out_bias):
        raise SpecError(
            f"model {m.name!r}: multi-latent attention with biases has no Megatron form: MLASelfAttention builds its "
            "down projections without bias (Megatron-LM@d98e8a64 multi_latent_attention.py L537-600)"
        )
    if m.position_embedding is PositionKind.ROPE:
        if not float(m.rope_theta).is_integer():
            raise SpecError(f"model {m.name!r}: rope_theta {m.rope_theta} is not a whole number; Megatron's --rotary-base is an int (ARG L2418)")
        rs = m.rope_scaling
        if rs is not None and rs.kind == "yarn":
            why = yarn_blocker(m)
            if why:
                raise SpecError(f"model {m.name!r}: yarn rope scaling {why}; use --framework deepspeed, whose config.json carries it")
        elif rs is not None and (rs.low_freq_factor, rs.high_freq_factor, rs.original_max_position_embeddings) != LLAMA3_ROPE_FIXED:
            raise SpecError(
                f"model {m.name!r}: rope scaling low/high frequency factors and original length "
                f"({rs.low_freq_factor}, {rs.high_freq_factor}, {rs.original_max_position_embeddings}) have no Megatron flag; "
                f"--use-rope-scaling fixes them at {LLAMA3_ROPE_FIXED} (rotary_pos_embedding.py _apply_scaling)"
            )
        if rs is not None and rs.kind == "llama3" and rs.factor != MEGATRON_ROPE_FACTOR:
            raise SpecError(
                f"model {m.name!r}: rope scaling factor {rs.factor} cannot reach Megatron's model: pretrain_gpt.py builds "
                f"GPTModel without --rope-scaling-factor (gpt_builders.py L86-104), so the factor is {MEGATRON_ROPE_FACTOR}; "
                "use --framework deepspeed, whose config.json carries the factor"
            )
    if m.moe is not None and m.moe.router_score is RouterScore.SIGMOID and not m.moe.renormalize_top_k and m.moe.top_k > 1:
        raise SpecError(
            f"model {m.name!r}: Megatron's sigmoid router always rescales the top-k scores to sum to 1 "
            "(moe_utils.py topk_routing_with_score_function); renormalize_top_k = false has no flag"
        )
    if job.schedule is Schedule.GPIPE and lay.pp > 1:
        raise LayoutError("layout: Megatron pipelines run 1F1B or interleaved 1F1B, not gpipe; drop --schedule gpipe [megatron]")
    fsdp = fsdp_kind(job, target)
    if fsdp is not None and lay.pp > 1:
        raise LayoutError(
            f"layout: zero {int(job.zero)} runs Megatron's fully sharded data parallel, which runs with pp = 1 "
            f"(pp={lay.pp}; ARG L1031-1049 for torch-FSDP2); use zero 1 (distributed optimizer) [megatron]"
        )
    if fsdp is MegatronFsdp.TORCH:
        # ARG L1031-1049: the --use-torch-fsdp2 assertions.
        why = None
        if lay.ep > 1:
            why = f"expert parallelism (ep={lay.ep})"
        elif m.tie_embeddings:
            why = "tied embeddings (it needs --untie-embeddings-and-output-weights)"
        elif tr.precision is Precision.FP16:
            why = "fp16"
        elif lay.dp_shard != job.dp:
            why = f"sharding within groups of {lay.dp_shard} (HSDP has no torch-FSDP2 flag in Megatron)"
        if why:
            raise LayoutError(f"layout: Megatron's --use-torch-fsdp2 does not run with {why} (ARG L1031-1049); use --megatron-fsdp megatron")


# MLATransformerConfig's YaRN fields that no flag sets (Megatron-LM@d98e8a64 transformer_config.py
# L3318-3325: original_max_position_embeddings 4096, beta_fast 32, beta_slow 1; the --yarn-* flags
# of ARG L2400-2410 fill config.yarn_* for non-MLA models only, argument_utils.py L397-400), and
# MLA's YarnRotaryEmbedding is built without correction_range_round_to_int (multi_latent_attention.py
# L188-199), so its default, True (yarn_rotary_pos_embedding.py L63), applies.
MLA_YARN_FIXED = (4096, 32.0, 1.0, True)


def yarn_blocker(m: ModelSpec) -> str | None:
    """What of the model's YaRN scaling Megatron's flags cannot say, or None. Megatron's cos/sin
    factor is get_mscale(factor, --mscale) / get_mscale(factor, --mscale-all-dim) (defaults 1 and 0;
    yarn_rotary_pos_embedding.py _yarn_get_concentration_factor, L282-296); transformers' is that
    ratio only when both keys are non-zero, else get_mscale(factor) (YarnScaling.concentration):
    the two agree unless mscale is set to other than 1 without mscale_all_dim."""
    rs = m.rope_scaling
    assert rs is not None and rs.kind == "yarn"
    if m.mla is not None:
        have = (rs.original_max_position_embeddings, rs.beta_fast, rs.beta_slow, rs.truncate)
        if have != MLA_YARN_FIXED:
            return (f"(original length, beta_fast, beta_slow, truncate) = {have} under multi-latent attention has no "
                    f"Megatron flag; MLATransformerConfig fixes them at {MLA_YARN_FIXED} (transformer_config.py L3318-3325)")
    if rs.mscale not in (None, 1.0) and not rs.mscale_all_dim:
        return (f"mscale {rs.mscale} without mscale_all_dim: transformers ignores it (cos/sin x {rs.concentration:.4f}), "
                "Megatron's --mscale would not")
    return None


def _yarn(m: ModelSpec) -> list[Flag]:
    """YaRN's flags. Under MLA, MLATransformerConfig's own fields: --rope-type yarn (ARG L2906),
    --rotary-scaling-factor, --mscale, --mscale-all-dim (ARG L3558-3563, the MLA group; the rest
    fixed, MLA_YARN_FIXED). Otherwise GPTModel's YarnRotaryEmbedding (gpt_model.py L196-212) under
    --position-embedding-type yarn (ARG L2397), its config.yarn_* attributes set from the same three
    flags and --yarn-original-max-position-embeddings, --yarn-beta-fast, --yarn-beta-slow and
    --no-yarn-correction-range-round-to-int (ARG L2400-2410; argument_utils.py L384-413
    _apply_yarn_config_from_args); transformers' truncate is that rounding (_compute_yarn_parameters
    find_correction_range, v5.23.0)."""
    rs = m.rope_scaling
    assert rs is not None and rs.kind == "yarn"
    out: list[Flag] = [("--rotary-scaling-factor", rs.factor)]
    if rs.mscale is not None:
        out.append(("--mscale", rs.mscale))
    if rs.mscale_all_dim is not None:
        out.append(("--mscale-all-dim", rs.mscale_all_dim))
    if m.mla is not None:
        return [("--rope-type", "yarn"), *out]
    out += [
        ("--yarn-original-max-position-embeddings", rs.original_max_position_embeddings),
        ("--yarn-beta-fast", rs.beta_fast),
        ("--yarn-beta-slow", rs.beta_slow),
    ]
    if not rs.truncate:
        out.append(("--no-yarn-correction-range-round-to-int",))
    return out


def megatron_blocker(m: ModelSpec) -> str | None:
    """What of the model pretrain_gpt.py's flags cannot say, or None. At Megatron-LM@d98e8a64 the
    transformer flags are TransformerConfig's fields (arguments.py:2373, ArgumentGroupFactory) less
    an exclusion list (arguments.py:2280-2372, which drops softmax_scale and activation_func) plus
    the hand-written ones; none of them soft-caps scores or logits, adds norms after the attention
    and MLP outputs, scales the embedding, gates a GELU (--swiglu is SiLU only; ARG L2450), masks
    attention in chunks, gives local layers their own rotary base, scales the queries by position,
    or scales scores by other than head_dim^-1/2; and the router
    has a bias exactly when all linear layers have one."""
    all_biases = m.qkv_bias and m.out_bias and m.mlp_bias
    checks = [
        (m.attn_logit_softcap or m.final_logit_softcap, "tanh soft-capping of attention scores or logits"),
        (m.sandwich_norms, "a norm on the attention and MLP outputs (four norms per layer)"),
        (m.scale_embedding, "the embedding scaled by sqrt(hidden_size)"),
        (m.mlp is MLPKind.GEGLU, "a gated GELU MLP"),
        # quick_gelu's slope is fixed (fused_bias_geglu.py L185-187)
        (m.swiglu_limit is not None and m.swiglu_alpha != QUICK_GELU_ALPHA, f"a clamped SwiGLU with sigmoid slope {m.swiglu_alpha} (quick_gelu's is {QUICK_GELU_ALPHA})"),
        (m.swiglu_limit is not None and m.moe is None, "a clamped SwiGLU in a dense MLP (Megatron clamps in its MoE experts)"),
        (m.attention_chunk_size is not None, "chunked attention"),
        (m.rope_local_theta is not None, "a separate rotary base for local layers"),
        (m.attn_temperature_tuning, "attention temperature tuning"),
        (m.query_pre_attn_scalar is not None and m.query_pre_attn_scalar != m.head_size, "query_pre_attn_scalar"),
        (m.rope_scaling is not None and m.rope_scaling.kind == "linear", "linear rope scaling"),
        # the router has a bias exactly when every linear layer has one (router.py L67, add_bias_linear)
        (m.moe is not None and m.moe.router_bias != all_biases,
         f"a router {'with' if m.moe is not None and m.moe.router_bias else 'without'} a bias beside "
         f"{'all' if all_biases else 'these'} linear biases"),
    ]
    return next((what for bad, what in checks if bad), None)


def args(target: Target) -> dict[str, list[Flag]]:
    """pretrain_gpt.py flags, in named groups (each a bash array in train.sh)."""
    check(target)
    job = target.job
    return {
        "MODEL_ARGS": _model(job),
        "PARALLEL_ARGS": _parallel(job, target),
        "BATCH_ARGS": _batch(job),
        "PRECISION_ARGS": _precision(job),
        "DATA_ARGS": _data(job, target),
    }


def hybrid_pattern(job: Job) -> str:
    """The model's layer pattern with a `|` after each pipeline segment: segment vp·pp + rank holds
    that rank's chunk vp (Megatron-LM@d98e8a64 megatron/core/models/hybrid/hybrid_layer_allocation.py
    select_pipeline_segment, L466-467), so the planner's split, uneven ends and vpp included, is the
    one Megatron builds; with pp = 1 and vpp = 1 there is no `|`."""
    pattern, lay = job.model.hybrid_pattern, job.layout
    assert pattern is not None
    if lay.pp == 1 and lay.vpp == 1:
        return pattern
    segments = [
        "".join(pattern[i] for i in job.stage_chunks[rank][chunk]) for chunk in range(lay.vpp) for rank in range(lay.pp)
    ]
    return "|".join(segments)


def _hybrid(job: Job) -> list[Flag]:
    """A hybrid model's layer pattern and Mamba shape: --hybrid-layer-pattern (ARG L3652; it sets
    num_layers and the pipeline segments, ARG L787-863), the TransformerConfig fields mamba_state_dim,
    mamba_head_dim, mamba_num_groups, mamba_num_heads (TC L1259-1268, generated flags), and the layer
    spec pretrain_hybrid.py requires (hybrid_builders.py L22-25: --spec <module> <name>;
    megatron/core/models/hybrid/hybrid_layer_specs.py L107 hybrid_stack_spec)."""
    mb = job.model.mamba
    out: list[Flag] = [("--hybrid-layer-pattern", hybrid_pattern(job))]
    if mb is not None:
        out += [
            ("--mamba-state-dim", mb.state_size),
            ("--mamba-head-dim", mb.head_dim),
            ("--mamba-num-groups", mb.num_groups),
            ("--mamba-num-heads", mb.num_heads),
        ]
    out.append(("--spec", "megatron.core.models.hybrid.hybrid_layer_specs", "hybrid_stack_spec"))
    return out


def _model(job: Job) -> list[Flag]:
    m, s = job.model, job.training.seq_len
    hybrid = m.hybrid_pattern is not None
    out: list[Flag] = _hybrid(job) if hybrid else [("--num-layers", m.num_layers)]  # TC L65
    out += [
        ("--hidden-size", m.hidden_size),  # TC L145
        ("--ffn-hidden-size", m.ffn_hidden_size),  # TC L180
        ("--num-attention-heads", m.num_attention_heads),  # TC L148
    ]
    if m.head_dim is not None:
        out.append(("--kv-channels", m.head_size))  # TC L184
    if m.kv_heads != m.num_attention_heads:
        # Without --group-query-attention, --num-query-groups is ignored (argument_utils.py L330-333, §1.2).
        out += [("--group-query-attention",), ("--num-query-groups", m.kv_heads)]  # ARG L2382, TC L175
    # max positions >= seq length (ARG L1354); a rotary model's table size is only that limit.
    positions = m.max_position_embeddings if m.position_embedding is PositionKind.LEARNED else max(m.max_position_embeddings, s)
    out += [("--seq-length", s), ("--max-position-embeddings", positions)]  # ARG L3305, L2394
    kind = {PositionKind.ROPE: "rope", PositionKind.LEARNED: "learned_absolute", PositionKind.NONE: "none"}[m.position_embedding]
    yarn = m.rope_scaling is not None and m.rope_scaling.kind == "yarn"
    if yarn and m.mla is None:
        kind = "yarn"  # GPTModel's YarnRotaryEmbedding (MLA builds its own, from --rope-type)
    out.append(("--position-embedding-type", kind))  # ARG L2397
    if m.position_embedding is PositionKind.ROPE:
        out.append(("--rotary-base", int(m.rope_theta)))  # ARG L2418 (int, default 10000)
        if m.rotary_fraction != 1.0:
            out.append(("--rotary-percent", m.rotary_fraction))  # ARG L2420 (fraction of head_dim, default 1.0)
        if yarn:
            out += _yarn(m)
        elif m.rope_scaling is not None:
            # ARG L2424-2427: Llama 3.x scaling, factor default 8.0 (the rest fixed; LLAMA3_ROPE_FIXED)
            out += [("--use-rope-scaling",), ("--rope-scaling-factor", m.rope_scaling.factor)]
    if m.swiglu_limit is not None:
        # GPT-OSS's clamped SwiGLU as Megatron runs it: quick_gelu(x) = x·sigmoid(1.702·x), gated
        # (ARG L2452; argument_utils.py L323-326), times (up + --glu-linear-offset) (TC L231), both
        # halves of fc1's output clamped at --activation-func-clamp-value (TC L235;
        # fused_bias_geglu.py L424-431 weighted_bias_quick_geglu_impl)
        out += [("--quick-geglu",), ("--glu-linear-offset", 1.0), ("--activation-func-clamp-value", m.swiglu_limit)]
    elif m.mlp is MLPKind.SWIGLU:
        out.append(("--swiglu",))  # ARG L2450 (gelu is the default activation)
    elif m.mlp is MLPKind.SQUARED_RELU:
        out.append(("--squared-relu",))  # ARG L2448 (activation_func squared_relu, argument_utils.py L320-322)
    norm = {NormKind.RMSNORM: "RMSNorm", NormKind.LAYERNORM: "LayerNorm"}
    out.append(("--normalization", norm[m.norm]))  # TC L256
    out.append(("--norm-epsilon", m.norm_eps))  # TC L201 layernorm_epsilon (arg_names --norm-epsilon), default 1e-5
    if m.zero_centered_norm:
        out.append(("--apply-layernorm-1p",))  # TC L206-207 layernorm_zero_centered_gamma (arg_names --apply-layernorm-1p)
    if m.qk_norm:
        out.append(("--qk-layernorm",))  # TC L259 qk_layernorm (uses --normalization)
    if m.qk_l2_norm:
        out.append(("--qk-l2-norm",))  # TC L262 qk_l2_norm, "llama 4-style qk L2 norm" (generated flag)
    if m.sliding_window is not None:
        # TC L247 window_size (left, right), ARG L2384 tuple_type "(l,r)": a query attends keys
        # [i − left, i + right]; the spec's window counts the query itself, so left = window − 1.
        out.append(("--window-size", f"({m.sliding_window - 1},0)"))
        if m.full_attention_every is not None:
            # ARG L2387, utils.py:531-542: layer_number (1-based) % N != 0 is a window layer; left
            # unset (None), every layer is (Mistral)
            out.append(("--window-attn-skip-freq", m.full_attention_every))
    if m.nope_full_layers:
        # ARG L2428 no_rope_freq N: layers N, 2N, … (1-based) skip rotary
        out.append(("--no-rope-freq", m.full_attention_every))
    if m.attention_sinks:
        out.append(("--softmax-type", "learnable"))  # TC L170: a learned offset logit per head (generated flag)
    if m.mla is not None:
        a = m.mla
        out.append(("--multi-latent-attention",))  # TC L288 (pretrain_gpt then builds MLATransformerConfig, TC L3279)
        if a.q_lora_rank is not None:
            out.append(("--q-lora-rank", a.q_lora_rank))  # ARG L3548 (default None: one query projection)
        out += [
            ("--kv-lora-rank", a.kv_lora_rank),  # ARG L3550
            ("--qk-head-dim", a.qk_nope_head_dim),  # ARG L3552 (the part without rope)
            ("--qk-pos-emb-head-dim", a.qk_rope_head_dim),  # ARG L3554
            ("--v-head-dim", a.v_head_dim),  # ARG L3556
        ]
        if not yarn:
            out += [
                # MLATransformerConfig.rope_type defaults to yarn (TC L3306); plain rotary without scaling
                ("--rope-type", "rope"),  # ARG L2906
                # rope fusion is on by default (ARG L2902-2905, store_false) and MLATransformerConfig
                # refuses it with any rope type but yarn (TC L3345-3346)
                ("--no-rope-fusion",),
            ]
        if not m.qk_norm:
            # the latent norms: gpt_layer_specs.py L106-115 builds the up projections with their norm
            # (column_parallel_layer_norm_linear) only under qk_layernorm, else the norms are IdentityOp
            out.append(("--qk-layernorm",))  # TC L259
    if m.mtp_layers:
        out.append(("--mtp-num-layers", m.mtp_layers))  # TC L68 (loss weight mtp_loss_scaling_factor, default 0.1, TC L75)
    if not m.tie_embeddings:
        out.append(("--untie-embeddings-and-output-weights",))  # ARG L2460
    if not m.out_bias:
        out.append(("--disable-bias-linear",))  # TC L212 (add_bias_linear=False)
        if m.qkv_bias:
            out.append(("--add-qkv-bias",))  # TC L218 add_qkv_bias
    # Megatron's dropouts default to 0.1 (TC hidden_dropout / attention_dropout); the spec's are explicit.
    out += [("--hidden-dropout", m.hidden_dropout), ("--attention-dropout", m.attention_dropout)]
    # The embedding's rows. Without this flag Megatron takes the tokenizer's length (HuggingFaceTokenizer
    # .vocab_size is len(tokenizer), megatron/core/tokenizers/text/libraries/huggingface_tokenizer.py L343-345)
    # padded to a multiple of make_vocab_size_divisible_by·tp (build_tokenizer.py L133-152), which is
    # not the model's vocabulary when the tokenizer has fewer tokens than the embedding has rows.
    # TokenizerConfig.padded_vocab_size (TRC L682, a generated flag, ARG L3246) sets the rows: the
    # ones the estimate prices (cost_models.states.padded_vocab, TrainingSpec.vocab_divisible_by),
    # divisible by tp, as the vocab-parallel embedding needs.
    out.append(("--padded-vocab-size", padded_vocab(job)))
    if job.training.attention is AttentionKernel.EAGER:
        out.append(("--attention-backend", "unfused"))  # TC attention_backend (AttnBackend)
    if m.moe is not None:
        moe = m.moe
        out += [
            ("--num-experts", moe.num_experts),  # ARG L3518 (-> num_moe_experts)
            ("--moe-router-topk", moe.top_k),  # TC L760
            ("--moe-ffn-hidden-size", moe.expert_ffn_hidden_size),  # TC L740
            ("--moe-grouped-gemm",),  # TC L850
            *_dispatcher(job),
            ("--moe-router-score-function", str(moe.router_score)),  # TC L808 (softmax | sigmoid | sqrtsoftplus)
            # Load balancing: GShard/Switch aux loss (ARG L3532, the default type) with the model's
            # coefficient; megatron-core's default coefficient is 0, no balancing (ARG L3536, TC L875).
            # seq_aux_loss: the same loss per sequence (DeepSeek-V3), one of ARG L3532's choices
            ("--moe-router-load-balancing-type", "seq_aux_loss" if moe.sequence_aux_loss else "aux_loss"),
            ("--moe-aux-loss-coeff", moe.aux_loss_coef),
        ]
        if moe.router_score is RouterScore.SOFTMAX and not moe.renormalize_top_k:
            # softmax over all experts, then top-k, not renormalised (Qwen-MoE norm_topk_prob false);
            # the default (top-k of the logits, then softmax) equals renormalised scores (moe_utils.py L900-914).
            out.append(("--moe-router-pre-softmax",))  # TC L799
        if moe.z_loss_coef:
            out.append(("--moe-z-loss-coeff", moe.z_loss_coef))  # TC L880 (default None: no z-loss)
        if moe.router_groups is not None:
            out += [("--moe-router-num-groups", moe.router_groups), ("--moe-router-group-topk", moe.router_group_top_k)]  # TC L780, L796
        if moe.routed_scaling_factor != 1.0:
            out.append(("--moe-router-topk-scaling-factor", moe.routed_scaling_factor))  # TC L804 (moe_utils.py L933-934)
        if moe.expert_bias:
            # aux-loss-free balancing, bias update rate 1e-3 (TC L821; DeepSeek-V3 report Sec. 4.2: 0.001)
            out.append(("--moe-router-enable-expert-bias",))  # TC L816
        if moe.capacity_factor is not None:
            out.append(("--moe-expert-capacity-factor", moe.capacity_factor))  # TC L917 (default None: dropless)
        if moe.num_shared_experts:
            out.append(("--moe-shared-expert-intermediate-size", moe.num_shared_experts * moe.shared_width))  # TC L701
            if moe.shared_expert_gate:
                out.append(("--moe-shared-expert-gate",))  # TC moe_shared_expert_gate
        # A hybrid's MoE layers are its pattern's E layers (HybridBlock builds submodules.moe_layer
        # for each, Megatron-LM@d98e8a64 megatron/core/models/hybrid/hybrid_block.py L184-192;
        # hybrid_layer_specs.py L63-67, L226-229); moe_layer_freq is read by the GPT layer specs only.
        if m.num_dense_layers and not hybrid:
            # A Python list, one entry per layer, 1 = MoE (ARG L327 moe_freq_type; TC moe_layer_freq).
            pattern = ",".join("1" if m.is_moe_layer(i) else "0" for i in range(m.num_layers))
            out.append(("--moe-layer-freq", f"[{pattern}]"))  # ARG L3520
    return out


def _parallel(job: Job, target: Target) -> list[Flag]:
    lay = job.layout
    out: list[Flag] = [("--tensor-model-parallel-size", lay.tp)]  # MPC L55
    if job.sp:
        out.append(("--sequence-parallel",))  # MPC L94
    out.append(("--pipeline-model-parallel-size", lay.pp))  # MPC L83
    if job.model.hybrid_pattern is not None:
        # The `|` segments of --hybrid-layer-pattern give every stage and virtual stage; the other
        # split flags are refused beside them (ARG L802-838).
        return out + _parallel_rest(job, target)
    uneven = lay.pp_first_stage_layers is not None or lay.pp_last_stage_layers is not None
    if lay.pp_first_stage_layers is not None:
        out.append(("--decoder-first-pipeline-num-layers", lay.pp_first_stage_layers))  # ARG L3095
    if lay.pp_last_stage_layers is not None:
        out.append(("--decoder-last-pipeline-num-layers", lay.pp_last_stage_layers))  # ARG L3099
    # Embedding and loss as pipeline layers (flags generated from TC L137/L141 by ARG L2373; ARG
    # L954-998 adds 1 each to the layers split over pp; transformer_block.py get_num_layers_to_build
    # builds one decoder layer fewer on the first and last virtual stage), or every stage given
    # (--pipeline-model-parallel-layout, ARG L3103, which sets vpp itself and excludes the other vpp
    # flags, ARG L926-951).
    if lay.account_for_embedding:
        out.append(("--account-for-embedding-in-pipeline-split",))
    if lay.account_for_loss:
        out.append(("--account-for-loss-in-pipeline-split",))
    if lay.pp_layout is not None:
        out.append(("--pipeline-model-parallel-layout", lay.pp_layout))
    elif job.schedule is Schedule.INTERLEAVED:
        # --virtual-pipeline-model-parallel-size does not exist on main (§1.1). With uneven ends only
        # the stages-per-rank form is accepted (ARG L954-978).
        if uneven or lay.account_for_embedding or lay.account_for_loss:
            out.append(("--num-virtual-stages-per-pipeline-rank", lay.vpp))  # ARG L3116
        else:
            out.append(("--num-layers-per-virtual-pipeline-stage", job.model.num_layers // (lay.pp * lay.vpp)))  # ARG L3114
    return out + _parallel_rest(job, target)


def _dispatcher(job: Job) -> list[Flag]:
    """The token dispatcher the planner times: alltoall (the Mixtral example's choice, §1.5), or for
    MoEDispatch.DEEPEP the flex dispatcher with its DeepEP backend (TC L891-900; --moe-enable-deepep is
    the deprecated spelling of the backend, TC L1743-1752)."""
    if job.training.moe_dispatch is MoEDispatch.DEEPEP:
        return [("--moe-token-dispatcher-type", "flex"), ("--moe-flex-dispatcher-backend", "deepep")]
    return [("--moe-token-dispatcher-type", "alltoall")]  # TC L891


def _parallel_rest(job: Job, target: Target) -> list[Flag]:
    lay = job.layout
    out: list[Flag] = []
    if lay.cp > 1:
        # Ring attention with p2p exchange of K/V, as the planner times it; spelled as TE spells it (§1.2).
        out += [("--context-parallel-size", lay.cp), ("--cp-comm-type", "p2p")]  # MPC L100, ARG L3221
    if job.model.moe is not None:
        out += [("--expert-model-parallel-size", lay.ep), ("--expert-tensor-parallel-size", job.etp)]  # MPC L127, L130
    out += _sharding(job, target)
    if job.training.tp_comm_overlap:
        out.append(("--tp-comm-overlap",))  # MPC L265 (needs --sequence-parallel, ARG L1441)
    if job.model.moe is not None and job.training.moe_dispatch is MoEDispatch.OVERLAP_1F1B:
        # the combined-1F1B all-to-all overlap the planner times (Megatron-LM@23e00ed0 arguments.py:2889)
        out.append(("--overlap-moe-expert-parallel-comm",))
    out += _recompute(job)
    return out


def _sharding(job: Job, target: Target) -> list[Flag]:
    lay, zero = job.layout, job.zero
    fsdp = fsdp_kind(job, target)
    reduce_group = job.dp * lay.cp  # gradients are reduced over the dp-cp group (§1.4)
    instances = job.dp // lay.dp_shard if lay.dp_shard else 1
    out: list[Flag] = []
    if fsdp is MegatronFsdp.TORCH:
        out.append(("--use-torch-fsdp2",))  # CC L95
        if zero is Zero.GRADIENTS:
            out.append(("--torch-fsdp2-no-reshard-after-forward",))  # ARG L3218
        out.append(("--no-gradient-accumulation-fusion",))  # ARG L2944; required by ARG L1039
        return out
    if fsdp is MegatronFsdp.MEGATRON:
        strategy = "optim_grads" if zero is Zero.GRADIENTS else "optim_grads_params"
        out += [
            ("--use-megatron-fsdp",),  # CC L92
            ("--data-parallel-sharding-strategy", strategy),  # ARG L3190
            ("--use-distributed-optimizer",),  # ARG L3156; Megatron-FSDP v1 needs it (ARG L1124-1136)
            ("--no-gradient-accumulation-fusion",),  # ARG L2944, as examples/megatron_fsdp (§1.5)
            ("--ckpt-format", "fsdp_dtensor"),  # TRC L486; required by ARG L1169
        ]
        if instances > 1:
            # HSDP: shard within dp_shard ranks, replicate across (ARG L3193, L3216).
            out += [("--num-distributed-optimizer-instances", instances), ("--outer-dp-sharding-strategy", "no_shard")]
    elif zero is Zero.OPTIMIZER:
        out.append(("--use-distributed-optimizer",))  # ARG L3156
        if instances > 1:
            out.append(("--num-distributed-optimizer-instances", instances))  # ARG L3216 (partial DistOpt)
    if reduce_group > 1:
        out.append(("--overlap-grad-reduce",))  # ARG L3121
        if zero >= Zero.OPTIMIZER:
            out.append(("--overlap-param-gather",))  # ARG L3148; needs DistOpt/FSDP and grad overlap (ARG L1024-1029)
    if job.training.ddp_bucket_size is not None:
        out.append(("--ddp-bucket-size", job.training.ddp_bucket_size))  # ARG L3125 (training.py L2179-2194)
    return out


def _recompute(job: Job) -> list[Flag]:
    lay = job.layout
    if lay.recompute is Recompute.SELECTIVE:
        # Core attention only (--recompute-modules defaults to core_attn), the planner's selective mode;
        # selective forbids --recompute-method/--recompute-num-layers (TC L1901-1932).
        return [("--recompute-granularity", "selective")]  # TC L532
    if lay.recompute is Recompute.FULL:
        if lay.recompute_layers is not None:
            # The first k layers of each model chunk (TC L543-551: block method).
            return [("--recompute-granularity", "full"), ("--recompute-method", "block"), ("--recompute-num-layers", lay.recompute_layers)]
        # Every layer checkpointed on its own: uniform units of one layer (TC L543-551).
        return [("--recompute-granularity", "full"), ("--recompute-method", "uniform"), ("--recompute-num-layers", 1)]
    return []


def _batch(job: Job) -> list[Flag]:
    assert job.training.global_batch_size is not None
    return [
        ("--micro-batch-size", job.layout.mbs),  # TRC L11
        ("--global-batch-size", job.training.global_batch_size),  # TRC L15; mbs·dp divides it (rules.global_batch)
    ]


def _precision(job: Job) -> list[Flag]:
    tr = job.training
    if tr.precision is Precision.FP16:
        return [("--fp16",)]  # MPC L177
    out: list[Flag] = [("--bf16",)]  # MPC L180
    if tr.grad_reduce_in_bf16:
        out.append(("--grad-reduce-in-bf16",))  # ARG L3053: bf16 grad buffer and reduction (ARG L1204-1217)
    if tr.precision is Precision.FP8:
        # E4M3 forward, E5M2 gradients (TC L587 `fp8` exposed as --fp8-format); recipe TC L594.
        out += [("--fp8-format", "hybrid"), ("--fp8-recipe", str(tr.fp8_recipe))]
        if tr.fp8_param_gather:
            out.append(("--fp8-param-gather",))  # Megatron-LM@d98e8a64 arguments.py:2016-2018
    if tr.precision is Precision.FP4:
        # NVFP4: TC L673-674 `fp4` exposed as --fp4-format (e2m1 its only value), TC L679 fp4_recipe
        # (nvfp4, Transformer Engine's NVFP4BlockScaling: core/fp4_utils.py get_fp4_recipe)
        out += [("--fp4-format", "e2m1"), ("--fp4-recipe", "nvfp4")]
    optimizer = "sgd" if tr.optimizer is OptimizerKind.SGD else "adam"  # ARG L2913: adam is AdamW (decoupled decay)
    out.append(("--optimizer", optimizer))
    return out


def _data(job: Job, target: Target) -> list[Flag]:
    """Data, tokenizer, schedule and checkpoints: user-filled variables (train.sh's first block)."""
    out: list[Flag] = [
        ("--tokenizer-type", "HuggingFaceTokenizer"),  # TRC L698
        ("--tokenizer-model", Raw('"$TOKENIZER_MODEL"')),  # TRC L714
        ("--data-path", Raw('"${DATA_PATH[@]}"')),  # ARG L3255 (nargs='*': weight prefix ... pairs)
        ("--split", Raw('"$SPLIT"')),  # ARG L3266
        ("--train-iters", Raw('"$TRAIN_ITERS"')),  # TRC L64
        ("--lr", Raw('"$LR"')),  # ARG L2984
        ("--min-lr", Raw('"$MIN_LR"')),  # ARG L2991
        ("--lr-decay-style", "cosine"),  # TRC L169
        ("--lr-warmup-iters", Raw('"$LR_WARMUP_ITERS"')),  # TRC L190
        ("--weight-decay", 0.1),  # ARG L2611
        ("--clip-grad", 1.0),  # ARG L2615
        ("--log-interval", 10),  # TRC L247
        ("--distributed-timeout-minutes", DISTRIBUTED_TIMEOUT_MINUTES),  # CC L77 (DistributedInitConfig, ARG L3092)
        ("--eval-interval", Raw('"$EVAL_INTERVAL"')),  # TRC L119
        ("--eval-iters", 10),  # TRC L115
        ("--save", Raw('"$CHECKPOINT_DIR"')),  # TRC L395
        ("--load", Raw('"$CHECKPOINT_DIR"')),  # TRC L430
        ("--save-interval", Raw('"$SAVE_INTERVAL"')),  # TRC L398
        ("--wandb-exp-name", Raw('"$RUN_NAME"')),  # TRC L342 (used when --wandb-project is given)
    ]
    return out


def environment(target: Target) -> list[str]:
    """CUDA_DEVICE_MAX_CONNECTIONS: 1 where Megatron asserts it, unset where FSDP forbids it;
    NVTE_NVFP4_DISABLE_RHT=1 where the plan turns NVFP4's Hadamard transform off."""
    job = target.job
    lay = job.layout
    out = []
    if job.training.nvfp4_disable_rht:
        # read when Transformer Engine builds the NVFP4 recipe (TransformerEngine@40c69e75
        # transformer_engine/common/recipe/__init__.py:411-412)
        out += ["# NVFP4 without the random Hadamard transform (TrainingSpec.nvfp4_disable_rht).",
                "export NVTE_NVFP4_DISABLE_RHT=1"]
    if fsdp_kind(job, target) is not None:
        out += ["# Megatron-FSDP and torch-FSDP2 need more than one hardware queue (ARG L1048, L1166).",
                "unset CUDA_DEVICE_MAX_CONNECTIONS"]
    elif (lay.tp > 1 or lay.cp > 1) and job.cluster.gpu.before_blackwell:
        out += ["# tp or cp > 1 before Blackwell: Megatron asserts one hardware queue (ARG L1453-1478).",
                "export CUDA_DEVICE_MAX_CONNECTIONS=1"]
    return out


def fill_in(target: Target) -> list[str]:
    return [
        'MEGATRON_LM="${MEGATRON_LM:?set MEGATRON_LM to a Megatron-LM checkout (main, core 0.19 or later)}"',
        'TOKENIZER_MODEL="${TOKENIZER_MODEL:?set TOKENIZER_MODEL to a Hugging Face tokenizer name or directory}"',
        "# One or more Megatron indexed-dataset prefixes, optionally weighted: \"0.7 /data/a_text_document 0.3 /data/b_text_document\".",
        'read -r -a DATA_PATH <<< "${DATA_PATH:?set DATA_PATH to the prefix(es) of the preprocessed .bin/.idx data}"',
        CHECKPOINT_DIR_LINE,
        'SPLIT="${SPLIT:-99,1,0}"',
        "# Schedule and optimizer settings are not part of the plan; these are common defaults.",
        'TRAIN_ITERS="${TRAIN_ITERS:-1000}"',
        'LR="${LR:-3e-4}"',
        'MIN_LR="${MIN_LR:-3e-5}"',
        'LR_WARMUP_ITERS="${LR_WARMUP_ITERS:-100}"',
        'EVAL_INTERVAL="${EVAL_INTERVAL:-1000}"',
        *save_interval_lines(target),
    ]


def train_sh(target: Target) -> str:
    groups = args(target)
    lines = script_head(target, f"Megatron-LM launch written by planner launch, for {VERSION}.", fill_in(target))
    lines += environment_lines(target)
    env = environment(target)
    if env:
        lines += [*env, ""]
    for name, flags in groups.items():
        lines.append(f"{name}=(")
        lines += ["  " + command(flag, []) for flag in flags]
        lines += [")", ""]
    # pretrain_hybrid.py builds HybridModel (Mamba / attention / MLP layers); pretrain_mamba.py is its
    # deprecated wrapper (Megatron-LM@d98e8a64 pretrain_mamba.py L1-19).
    entry = "pretrain_hybrid.py" if target.job.model.hybrid_pattern is not None else "pretrain_gpt.py"
    head = [*torchrun_head(), Raw(f'"$MEGATRON_LM/{entry}"')]
    tail = [(Raw(f'"${{{name}[@]}}"'),) for name in groups] + [(Raw('"$@"'),)]
    lines += [command(head, tail), ""]
    return "\n".join(lines)
