"""Model states per GPU: which parameters a rank holds, and the bytes each framework keeps for them.

Placement: dense matrices are split by tp, norms and row-parallel biases are replicated over tp,
routed experts are split over ep (whole experts) and etp (within an expert), and pipeline rank r
holds its decoder layers plus the embedding (first rank) or final norm and output layer (last
rank). States are then sharded over data parallelism according to the framework's ZeRO stage.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from cost_models.breakdown import Breakdown
from cost_models.enums import Framework, MixerKind, OptimizerKind, PositionKind, Precision, Zero
from cost_models.job import Job
from cost_models.params import mamba_params, mla_params, mlp_params, norm_params

# Megatron pads the vocabulary to a multiple of this x tp: --make-vocab-size-divisible-by's default
# (Megatron-LM@d98e8a64 megatron/training/arguments.py L2441; the padding: megatron_padded_vocab).
MEGATRON_VOCAB_DIVISOR = 128


def megatron_padded_vocab(vocab: int, tp: int, divisible_by: int = MEGATRON_VOCAB_DIVISOR) -> int:
    """`vocab` rounded up to a multiple of divisible_by·tp, as Megatron pads it for
    --make-vocab-size-divisible-by (Megatron-LM@d98e8a64 megatron/training/vocab_utils.py L58-59,
    megatron/core/tokenizers/utils/build_tokenizer.py L138-139)."""
    multiple = divisible_by * tp
    return -(-vocab // multiple) * multiple


def vocab_divisor(vocab: int, tp: int) -> int:
    """The planner's own --make-vocab-size-divisible-by (TrainingSpec.vocab_divisible_by None): the
    largest power of two up to Megatron's default, 128, with vocab % (d·tp) == 0, so the embedding is
    not padded; 128 when no such d exists."""
    d = MEGATRON_VOCAB_DIVISOR
    while d >= 1:
        if vocab % (d * tp) == 0:
            return d
        d //= 2
    return MEGATRON_VOCAB_DIVISOR


def padded_vocab(job: Job) -> int:
    """Rows of the job's word embedding and output layer. Megatron: the vocabulary padded to a
    multiple of TrainingSpec.vocab_divisible_by·tp, or of vocab_divisor's divisor·tp where that is
    None; the --padded-vocab-size `planner launch` writes is this number (planner.launch.megatron).
    torchtitan and DeepSpeed: the vocabulary as it is, since the models their launch files build
    take vocab_size unpadded: torchtitan's tok_embeddings and lm_head have vocab_size rows
    (pytorch/torchtitan@b5bcd76c torchtitan/models/llama3/__init__.py:155-168, an nn.Embedding of
    num_embeddings rows, models/common/embedding.py:24-36; planner/launch/torchtitan.py writes the
    model's vocab_size), and the Hugging Face model DeepSpeed trains has nn.Embedding(config.vocab_size,
    ...) (huggingface/transformers@5dd4a635 models/llama/modeling_llama.py LlamaModel.__init__) with
    config.json's vocab_size the model's (planner/launch/hf_config.py). Megatron-DeepSpeed, which the
    planner does not launch, pads as Megatron does (microsoft/Megatron-DeepSpeed@b3405e15
    megatron/tokenizer/tokenizer.py _vocab_size_with_padding): price it as framework megatron."""
    v, tp = job.model.vocab_size, job.layout.tp
    if job.training.framework is not Framework.MEGATRON:
        return v
    d = job.training.vocab_divisible_by
    return megatron_padded_vocab(v, tp, vocab_divisor(v, tp) if d is None else d)


def local_kv_heads(job: Job) -> int:
    """K/V heads on one tp rank; Megatron replicates a group on several ranks when tp > kv heads."""
    return max(1, job.model.kv_heads // job.layout.tp)


@dataclass(frozen=True)
class LayerParams:
    """Parameters of one decoder layer on one rank: `dense` ones follow dp sharding, `expert` ones expert-dp."""

    dense: int
    expert: int

    @property
    def total(self) -> int:
        return self.dense + self.expert


def local_layer_params(job: Job, layer_id: int) -> LayerParams:
    """Parameters of one decoder layer on one GPU: the same for every layer of a kind (dense/MoE)."""
    key = ("layer_params", job.model.layer_kind(layer_id))
    if key not in job.memo:
        job.memo[key] = _local_layer_params(job, layer_id)
    return job.memo[key]


def _local_attention_params(job: Job) -> int:
    """Self-attention on one tp rank: q, k, v column-parallel over heads (kv heads replicated where
    fewer than tp), the output projection row-parallel."""
    m, tp = job.model, job.layout.tp
    if m.mla is not None:
        return int(mla_params(m, tp).total)
    h, d = m.hidden_size, m.head_size
    q_local = m.q_width // tp
    kv_local = local_kv_heads(job) * d
    return (
        h * (q_local + 2 * kv_local)
        + ((q_local + 2 * kv_local) if m.qkv_bias else 0)
        + q_local * h
        + (h if m.out_bias else 0)  # row-parallel bias: replicated
        + (2 * norm_params(m, d) if m.qk_norm else 0)
        + (m.num_attention_heads // tp if m.attention_sinks else 0)  # one sink logit per local head
    )


def _local_layer_params(job: Job, layer_id: int) -> LayerParams:
    """A layer of a kind, as params.layer_params counts it, on one rank: its norms (replicated), its
    mixer, and its dense MLP or MoE block."""
    m, tp = job.model, job.layout.tp
    h = m.hidden_size
    kind = m.layer_kind(layer_id)
    dense = kind.norms * (2 if m.sandwich_norms else 1) * norm_params(m, h)
    if kind.mixer is MixerKind.ATTENTION:
        dense += _local_attention_params(job)
    elif kind.mixer is MixerKind.MAMBA:
        dense += int(mamba_params(m, tp).total)
    if not kind.mlp:
        return LayerParams(dense=dense, expert=0)
    if not kind.moe:
        return LayerParams(dense=dense + mlp_params(m, m.ffn_hidden_size // tp), expert=0)
    moe = m.moe
    assert moe is not None
    shared = moe.num_shared_experts * mlp_params(m, moe.shared_width // tp) + (h if moe.shared_expert_gate else 0)
    experts = moe.num_experts // job.layout.ep * mlp_params(m, moe.expert_ffn_hidden_size // job.etp)
    router = h * moe.num_experts + (moe.num_experts if moe.router_bias else 0)
    return LayerParams(dense=dense + router + shared, expert=experts)


def vocab_split(job: Job, *, output_layer: bool = False) -> int:
    """Ranks the vocabulary is split over: tp, or 1 under TrainingSpec.tp_replicated_vocab, where
    the output layer (`output_layer`) stays column-parallel over tp without a pipeline (its logits
    gathered whole after) and is replicated only on pipeline stages."""
    if job.training.tp_replicated_vocab and not (output_layer and job.layout.pp == 1):
        return 1
    return job.layout.tp


def local_vocab(job: Job) -> int:
    """Padded vocabulary entries on this rank of the word embedding and of the logits the loss takes."""
    return -(-padded_vocab(job) // vocab_split(job))


def output_layer_vocab(job: Job) -> int:
    """Vocabulary columns of the output layer's weight (and of the logits it writes) on this rank."""
    return -(-padded_vocab(job) // vocab_split(job, output_layer=True))


def embedding_params_local(job: Job) -> int:
    m = job.model
    h = m.hidden_size
    word = local_vocab(job) * h
    position = m.max_position_embeddings * h if m.position_embedding is PositionKind.LEARNED else 0
    return word + position + (norm_params(m, h) if m.embedding_norm else 0)


def head_params_local(job: Job) -> int:
    """Final norm and output layer; with tied embeddings and pp > 1 the last rank keeps its own copy
    of the word embedding for the output layer (Megatron's shared embedding group)."""
    m = job.model
    output = output_layer_vocab(job) * m.hidden_size
    if m.tie_embeddings and job.layout.pp == 1:
        output = 0
    return norm_params(m, m.hidden_size) + output


def rank_params(job: Job, rank: int) -> Breakdown:
    """Parameters held by pipeline rank `rank` (any tp/cp/dp coordinate), by component."""
    key = ("rank_params", rank)
    if key not in job.memo:
        job.memo[key] = _rank_params(job, rank)
    return job.memo[key]


def mtp_module_params(job: Job) -> LayerParams:
    """Parameters of one multi-token prediction module on a rank of the last stage
    (step_time.stage_time runs them after its last decoder layer): a decoder layer of the last
    layer's kind, with three replicated norms and the column-parallel h x 2h eh_proj."""
    m = job.model
    h = m.hidden_size
    extra = 3 * norm_params(m, h) + 2 * h * h // job.layout.tp
    last = local_layer_params(job, m.num_layers - 1)
    return LayerParams(dense=last.dense + extra, expert=last.expert)


def rank_layer_params(job: Job, rank: int) -> tuple[tuple[LayerParams, int], ...]:
    """Pipeline rank `rank`'s decoder layers as (one layer's parameters, how many layers), one entry
    per layer kind it holds, in the order of ModelSpec.layer_kinds: every layer of a kind holds the
    same parameters (local_layer_params), so sums over the rank's layers are sums over its kinds."""
    key = ("rank_layer_params", rank)
    if key not in job.memo:
        counts = Counter(map(job.model.kinds_by_layer.__getitem__, job.stage_layer_ids(rank)))
        job.memo[key] = tuple((local_layer_params(job, first), counts[kind]) for kind, first in job.model.layer_kinds.items()
                              if kind in counts)
    return job.memo[key]


def _rank_params(job: Job, rank: int) -> Breakdown:
    layers = rank_layer_params(job, rank)
    m = job.model
    if rank == job.layout.pp - 1 and m.mtp_layers:
        layers = [*layers, (mtp_module_params(job), m.mtp_layers)]
    return Breakdown.of(
        "params",
        embedding=embedding_params_local(job) if rank == 0 else 0,
        layers=sum(p.dense * n for p, n in layers),
        experts=sum(p.expert * n for p, n in layers),
        head=head_params_local(job) if rank == job.layout.pp - 1 else 0,
    )


# --- bytes per parameter ------------------------------------------------------------------------


@dataclass(frozen=True)
class StateConvention:
    """Bytes per parameter a framework keeps, and the ZeRO stage from which each is sharded."""

    weight_bytes: int
    weight_sharded_from: Zero
    grad_bytes: int
    grad_sharded_from: Zero
    optimizer_grad_bytes: int  # fp32 copy of 16-bit gradients the optimizer takes in its step (Megatron)
    master_bytes: int  # fp32 master weights (0 when the working weights are fp32 already)
    optimizer_state_bytes: int = 4  # each optimizer state (exp_avg, exp_avg_sq): fp32 unless noted


def convention(framework: Framework, precision: Precision, fp8_params: bool = False, bf16_grads: bool = False,
               bf16_params: bool = False) -> StateConvention:
    if framework is Framework.MEGATRON:
        # Megatron-LM docs/source/api-guide/dist_optimizer.md, "Data flow" table: bf16 params with
        # fp32 main grads = 18 bytes/param (6 + 12/d distributed); fp16 params and grads = 20 (4 + 16/d).
        # fp8 keeps bf16 params and fp32 main grads (TE casts to fp8 per GEMM); with
        # --fp8-param-gather the parameter buffer is uint8, one byte per weight
        # (Megatron-LM@d98e8a64 megatron/core/distributed/param_and_grad_buffer.py:919-924).
        if precision is Precision.FP16:
            return StateConvention(2, Zero.PARAMETERS, 2, Zero.GRADIENTS, 4, 4)
        # --grad-reduce-in-bf16 keeps the grad buffer in bf16 (param_and_grad_buffer.py:923-924); the
        # optimizer step then takes an fp32 copy of it, as for fp16 (distrib_optimizer.py:2792,
        # optimizer.py:1097; alive in the step only: cost_models.memory.step_peak).
        return StateConvention(1 if fp8_params else 2, Zero.PARAMETERS, 2 if bf16_grads else 4, Zero.GRADIENTS,
                               4 if bf16_grads else 0, 4)
    if framework is Framework.TORCHTITAN and bf16_params:
        # TrainingSpec.bf16_params: bf16 sharded parameters, their gradients cast back to bf16 and
        # AdamW's states zeros_like(param): 2 + 2 + 2 per state, nothing in fp32
        return StateConvention(2, Zero.GRADIENTS, 2, Zero.GRADIENTS, 0, 0, optimizer_state_bytes=2)
    if framework is Framework.TORCHTITAN:
        # FSDP2 keeps sharded fp32 parameters and fp32 gradients (MixedPrecisionPolicy param_dtype=bf16,
        # reduce_dtype=fp32, torchtitan config mixed_precision_param/reduce); the optimizer updates
        # them directly, so there is no separate master copy. Unsharded bf16 copies are buffers
        # (cost_models.memory). FSDP2 shards parameters at zero 2 as well (reshard_after_forward=False
        # only keeps the unsharded copies alive between forward and backward).
        return StateConvention(4, Zero.GRADIENTS, 4, Zero.GRADIENTS, 0, 0)
    # DeepSpeed, as the ZeRO paper counts mixed-precision Adam (Rajbhandari et al. 2020, Sec. 3.1 and
    # Fig. 1): 2 (16-bit params) + 2 (16-bit grads) + 12 (fp32 params, momentum, variance).
    return StateConvention(2, Zero.PARAMETERS, 2, Zero.GRADIENTS, 0, 4)


def optimizer_states_per_param(optimizer: OptimizerKind) -> int:
    """States per parameter: Adam/AdamW exp_avg and exp_avg_sq; SGD a momentum buffer."""
    return 1 if optimizer is OptimizerKind.SGD else 2


def state_parts(framework: Framework, precision: Precision, optimizer: OptimizerKind, zero: Zero,
                fp8_params: bool = False, bf16_grads: bool = False, bf16_params: bool = False) -> dict[str, tuple[int, bool]]:
    """Bytes per parameter of each model state, and whether `zero` shards it over the dp group."""
    c = convention(framework, precision, fp8_params, bf16_grads, bf16_params)
    return {
        "weights": (c.weight_bytes, zero >= c.weight_sharded_from),
        "gradients": (c.grad_bytes, zero >= c.grad_sharded_from),
        "fp32_gradients": (c.optimizer_grad_bytes, zero >= Zero.OPTIMIZER),
        "master_weights": (c.master_bytes, zero >= Zero.OPTIMIZER),
        "optimizer_states": (c.optimizer_state_bytes * optimizer_states_per_param(optimizer), zero >= Zero.OPTIMIZER),
    }


def state_bytes(job: Job, *, params: int, shard: int) -> Breakdown:
    """Weights, gradients and optimizer bytes of `params` parameters sharded over `shard` ranks."""
    tr = job.training
    parts = state_parts(tr.framework, tr.precision, tr.optimizer, job.zero, tr.fp8_param_gather, tr.grad_reduce_in_bf16,
                        tr.bf16_params)
    return Breakdown.of(
        "bytes",
        **{name: -(-params * n // shard) if sharded else params * n for name, (n, sharded) in parts.items()},
    )


def dense_params(params: Breakdown) -> int:
    """The parameters of a rank_params breakdown that follow dense (dp·cp) sharding: all but experts."""
    return int(params.value("embedding") + params.value("layers") + params.value("head"))


def rank_state_bytes(job: Job, rank: int) -> Breakdown:
    """Model states of pipeline rank `rank`: dense parameters shard over dp·cp (or the HSDP shard
    group), expert parameters over expert-dp."""
    p = rank_params(job, rank)
    dense = dense_params(p)
    dense_states = state_bytes(job, params=dense, shard=job.dense_shard_group)
    expert_states = state_bytes(job, params=int(p.value("experts")), shard=job.expert_shard_group)
    merged = {name: dense_states.value(name) + expert_states.value(name) for name, _ in dense_states}
    return Breakdown.of("bytes", **merged)
