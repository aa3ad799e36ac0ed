"""Every category the specs and cost functions branch on, as a StrEnum (never a bare string)."""

from enum import IntEnum, StrEnum


class MLPKind(StrEnum):
    GELU = "gelu"  # two matrices: h->f, activation, f->h (GPT-2/3, BLOOM, GPT-NeoX)
    SWIGLU = "swiglu"  # three matrices: gate and up h->f, silu(gate)*up, down f->h (Llama, Mistral, Qwen)
    SQUARED_RELU = "squared_relu"  # two matrices: h->f, relu(x)², f->h (Nemotron-4 and Nemotron-H "relu2"; Megatron --squared-relu)
    GEGLU = "geglu"  # three matrices like SwiGLU, gelu_tanh(gate)*up (Gemma 2 and 3: GemmaMLP hidden_activation)

    @property
    def gated(self) -> bool:
        """Three matrices (gate, up, down) and an elementwise product, not two."""
        return self in (MLPKind.SWIGLU, MLPKind.GEGLU)


class MixerKind(StrEnum):
    """What mixes tokens in a decoder layer."""

    ATTENTION = "attention"  # self-attention
    MAMBA = "mamba"  # a Mamba-2 (SSD) mixer (Dao & Gu 2024)
    NONE = "none"  # no token mixer: an MLP-only layer (Nemotron-H "-" and "E" layers)


class NormKind(StrEnum):
    LAYERNORM = "layernorm"  # weight and bias, saves mean and rstd
    RMSNORM = "rmsnorm"  # weight only, saves rstd


class PositionKind(StrEnum):
    LEARNED = "learned"  # absolute position table of max_position_embeddings x hidden
    ROPE = "rope"  # rotary, no parameters
    ALIBI = "alibi"  # linear biases on the scores, no parameters (BLOOM)
    NONE = "none"


class RouterScore(StrEnum):
    """How an MoE router turns logits into expert scores."""

    SOFTMAX = "softmax"  # Mixtral, Qwen-MoE
    SIGMOID = "sigmoid"  # DeepSeek-V3


class Precision(StrEnum):
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"  # fp8 GEMMs, bf16 activations and weights, fp32 master weights
    # NVFP4 GEMMs (fprop, dgrad and wgrad): Transformer Engine's NVFP4BlockScaling, e2m1 values in
    # blocks of 16 with an e4m3 scale each and an fp32 scale per tensor (TransformerEngine@40c69e75,
    # release_v2.8, transformer_engine/common/recipe/__init__.py:381-446); bf16 activations and
    # weights, fp32 master weights. Megatron's --fp4-format e2m1 --fp4-recipe nvfp4, which excludes
    # --fp8-format (Megatron-LM@d3391901, 25.09-alpha.rc1, megatron/training/arguments.py:662-664,
    # 1325-1332): a precision of its own, not an fp8 recipe.
    FP4 = "fp4"

    @property
    def low(self) -> bool:
        """Whether the linears' GEMMs run on quantised operands (fp8 or NVFP4), not 16-bit ones."""
        return self in (Precision.FP8, Precision.FP4)


class Fp8Recipe(StrEnum):
    """How fp8 GEMM operands are scaled (only read when precision is fp8)."""

    # one scale per tensor: torchao tensorwise; Megatron's --fp8-recipe tensorwise, which builds
    # Transformer Engine's Float8CurrentScaling (Megatron-LM@d98e8a64 megatron/core/fp8_utils.py:777-780)
    TENSORWISE = "tensorwise"
    # one scale per tensor from the amax history of earlier steps: Megatron's --fp8-recipe delayed,
    # Transformer Engine's DelayedScaling (fp8_utils.py, the same function)
    DELAYED = "delayed"
    ROWWISE = "rowwise"  # one scale per row: torchao rowwise (row-scaled CUTLASS GEMMs)
    MXFP8 = "mxfp8"  # one e8m0 scale per 32 elements: TE MXFP8BlockScaling, Blackwell tensor cores only


class AmaxGroup(StrEnum):
    """The process group over which Transformer Engine's delayed scaling all-reduces the amaxes of
    each fp8_autocast region while the compute stream waits (TrainingSpec.te_amax_reduction)."""

    NONE = "none"  # no all-reduce the compute stream waits for (asynchronous, or not reduced)
    TP = "tp"  # the tensor-parallel group
    # tp x cp, contiguous in the rank order: Megatron core's TransformerConfig.tp_only_amax_red, its
    # fp8_autocast group get_amax_reduction_group(with_context_parallel=True, tp_only_amax_red=True)
    # (Megatron-LM@7c00175e = core_r0.11.0 megatron/core/parallel_state.py:1241-1253), and what core
    # 24.09-alpha.rc0's get_amax_reduction_group(with_context_parallel=True) returns, it having no
    # tp_only_amax_red (Megatron-LM@dd182053 parallel_state.py:971-977, transformer_block.py:411)
    TP_CP = "tp_cp"
    TP_DP = "tp_dp"  # every rank of one pipeline stage: tp x cp x dp, contiguous in the rank order


class OptimizerKind(StrEnum):
    ADAMW = "adamw"  # two fp32 states per parameter (exp_avg, exp_avg_sq)
    ADAM = "adam"
    SGD = "sgd"  # with momentum: one fp32 state per parameter
    # Composer's DecoupledAdamW (llm-foundry's decoupled_adamw): AdamW's two states, updated one
    # tensor and one op at a time (compute.OPTIMIZER_BYTES_PER_PARAM)
    DECOUPLED_ADAMW = "decoupled_adamw"


class Framework(StrEnum):
    MEGATRON = "megatron"
    TORCHTITAN = "torchtitan"
    DEEPSPEED = "deepspeed"


class AttentionKernel(StrEnum):
    FLASH = "flash"  # fused kernel: saves q, k, v, output and the fp32 log-sum-exp, never the s x s scores
    EAGER = "eager"  # unfused: scores, softmax and dropout stored, as in Korthikanti et al. 2022


class AttentionBackend(StrEnum):
    """The fused attention kernel family a flash job runs (published curves in presets/kernels)."""

    FA1 = "fa1"  # FlashAttention-1 (flash-attn 1.x; llm-foundry's Triton FlashAttention priced as it)
    FA2 = "fa2"  # FlashAttention-2 (the flash-attn 2.x package)
    # PyTorch SDPA's flash backend: flash-attn's FlashAttention-2 kernels built into libtorch, priced
    # from this project's own timings of it where measured (presets/kernels/hopper.toml)
    SDPA_FLASH = "sdpa_flash"
    FA3 = "fa3"  # FlashAttention-3 (Hopper)
    FA4 = "fa4"  # FlashAttention-4 (Blackwell)
    CUDNN = "cudnn"  # cuDNN fused flash attention (Transformer Engine FusedAttention; SDPA's cuDNN backend)


class MoEDispatch(StrEnum):
    """How an MoE layer's token all-to-alls run."""

    ALLTOALL = "alltoall"  # on the compute stream (Megatron alltoall dispatcher, torchtitan standard)
    OVERLAP_1F1B = "overlap"  # Megatron --overlap-moe-expert-parallel-comm: beside another micro-batch
    DEEPEP = "deepep"  # DeepEP's normal kernels on the compute stream (cost_models.deepep)


class Zero(IntEnum):
    """What data parallelism shards (ZeRO stages, Rajbhandari et al. 2020, Sec. 5)."""

    NONE = 0  # replicated (DDP)
    OPTIMIZER = 1  # optimizer states (ZeRO-1, Megatron distributed optimizer)
    GRADIENTS = 2  # + gradients (ZeRO-2, FSDP without reshard after forward)
    PARAMETERS = 3  # + parameters (ZeRO-3, FSDP / FSDP2 fully_shard)


class Recompute(StrEnum):
    NONE = "none"
    SELECTIVE = "selective"  # framework's selective recomputation (see cost_models.activations)
    FULL = "full"  # keep only each layer's input, recompute the layer in backward


class Schedule(StrEnum):
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"  # interleaved 1F1B with vpp model chunks per rank
    GPIPE = "gpipe"


class ScaleupTopology(StrEnum):
    """How the GPUs of one scale-up domain are wired (cost_models.comm.domain_link_share)."""

    SWITCH = "switch"  # every link of a GPU goes to a switch (NVSwitch) that reaches every peer
    MESH = "mesh"  # no switch: each GPU's links are split over direct links to each of its peers


class Fabric(StrEnum):
    """The scale-out network between nodes: it decides the launch's network environment, and the
    measured start-up of a small all-reduce across nodes (cost_models.comm.SMALL_ALL_REDUCE_16_GPUS_S)."""

    INFINIBAND = "infiniband"
    ROCE = "roce"  # RDMA over Converged Ethernet
    EFA = "efa"  # AWS Elastic Fabric Adapter (libfabric)
    UNSPECIFIED = "unspecified"
