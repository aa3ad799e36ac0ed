"""TrainingSpec: sequence, batch, precision, optimizer and the framework that runs the job."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from cost_models.enums import AmaxGroup, AttentionBackend, AttentionKernel, Fp8Recipe, Framework, MoEDispatch, OptimizerKind, Precision
from cost_models.model_spec import Count, Spec

# Tokens in one optimizer step, at most: 2**36 (~69 billion) is thousands of times the largest
# published batches (Llama 3 405B: 16M tokens) and keeps step times in nanoseconds within int64.
MAX_TOKENS_PER_STEP = 2**36


class NcclCtas(Spec):
    """The most CTAs NCCL may run a communicator's collectives and transfers on, by Megatron process
    group: the max_ctas of Megatron's --nccl-communicator-config-path yaml, which get_nccl_options hands
    to ProcessGroupNCCL.Options.config.max_ctas for the groups "dp"/"dp_cp", "tp", "cp" and "pp"
    (Megatron-LM@d98e8a64 megatron/core/parallel_state.py:168-195, 967, 1057, 1121, 1168, 1248).
    NCCL connects no more channels than that (one CTA, so one SM, per channel), and point-to-point
    no more than the collectives (NVIDIA/nccl@v2.22.3-1 src/graph/connect.cc:480-483,
    src/graph/paths.cc:742-745); an NCCL_MAX_CTAS in the environment replaces every communicator's
    (src/init.cc:1487-1490), so a run that exports one has no per-group cap. None: NCCL's own count.
    The cap bounds the SMs a collective holds, not its bus bandwidth: NCCL's own tuning model prices
    a ring at the channels its graph search found, before the cap (src/graph/tuning.cc:175)."""

    dp: Count | None = None  # the data-parallel gradient group ("dp_cp" when cp > 1)
    tp: Count | None = None
    cp: Count | None = None
    pp: Count | None = None


class TrainingSpec(Spec):
    seq_len: Count = 4096
    # sequences per optimizer step; None = mbs·dp·m with m = 1 micro-batch without a pipeline and
    # 4·pp with one (legal for every schedule), filled in by cost_models.rules.resolve
    global_batch_size: Count | None = None
    precision: Precision = Precision.BF16  # compute dtype; master weights are always fp32
    fp8_recipe: Fp8Recipe = Fp8Recipe.TENSORWISE  # scaling of fp8 GEMM operands (precision fp8 only)
    optimizer: OptimizerKind = OptimizerKind.ADAMW
    framework: Framework = Framework.MEGATRON
    attention: AttentionKernel = AttentionKernel.FLASH
    # Which fused kernel family a flash job runs; None = what the framework picks on the GPU
    # generation today (cost_models.compute.attention_backend).
    attention_backend: AttentionBackend | None = None
    # torch.compile of the model and the loss (torchtitan --compile.enable): the memory model counts
    # its fused cross entropy (cost_models.activations.head_activations / loss_workspace).
    compile: bool = False
    # The loss compiled with the model: None = same as compile. False for torchtitan before 2025,
    # which compiled the transformer blocks only (9dec370 and earlier).
    compile_loss: bool | None = None
    # Tensor-parallel communication overlapped with the GEMMs around it: Megatron --tp-comm-overlap
    # (Transformer Engine userbuffers, needs sequence parallel), torchtitan async TP
    # (--parallelism.enable_async_tensor_parallel, needs compile).
    tp_comm_overlap: bool = False
    # Under Megatron --tp-comm-overlap, the row-parallel GEMMs whose forward reduce-scatter runs
    # Transformer Engine's ring exchange (userbuffers method "ring_exchange" for proj_fprop / fc2_fprop:
    # tp chunk GEMMs whose partial outputs move to their rank on the copy engine, then one reduction
    # kernel; CommOverlapP2PBase::split_overlap_rs) rather than TE's default "pipeline" (4 chunks, the
    # reduce-scatter on 16 SMs) (TransformerEngine@40c69e75 transformer_engine/pytorch/module/base.py:
    # 303-311 initialize_ub methods, 337-340; common/comm_gemm_overlap/comm_gemm_overlap.cpp:1118-1205).
    # "proj" is the attention output projection, "fc2" the MLP's down projection.
    ub_ring_exchange_rs: frozenset[Literal["proj", "fc2"]] = frozenset()
    # How MoE token all-to-alls run (cost_models.step_time.ep_exposure).
    moe_dispatch: MoEDispatch = MoEDispatch.ALLTOALL
    # Tokens the busiest expert-parallel rank receives over the mean: 1 when routing is balanced
    # (as forced-balance benchmarks run), up to the capacity factor when tokens are dropped above it.
    moe_load_factor: Annotated[float, Field(ge=1.0, le=64.0)] = 1.0
    # Megatron --fp8-param-gather: weights kept in fp8 (a uint8 parameter buffer) and gathered in fp8
    # (Megatron-LM@d98e8a64 megatron/core/distributed/param_and_grad_buffer.py:919-924); fp8 only.
    fp8_param_gather: bool = False
    # Transformer Engine's NVTE_NVFP4_DISABLE_RHT=1 (precision fp4): no random Hadamard transform
    # before the column-wise quantisation of inputs and output gradients, which NVFP4BlockScaling
    # applies by default (TransformerEngine@40c69e75 transformer_engine/common/recipe/__init__.py:
    # 411-446); priced in cost_models.compute.nvfp4_cast. MLPerf Training v5.1's NVFP4 Llama 3.1 runs
    # set it (mlcommons/training_results_v5.1@441d65f4 NVIDIA/benchmarks/llama31_405b/implementations/
    # tyche_ngpu512_ngc25.09_nemo/config_common_fp4.sh:10).
    nvfp4_disable_rht: bool = False
    # Transformer Engine's fp8 dot-product attention: TransformerConfig.fp8_dot_product_attention,
    # handed to TE's recipe as fp8_dpa (Megatron-LM@d98e8a64 megatron/core/fp8_utils.py:777-787 current
    # scaling, extensions/transformer_engine.py:3349-3351 delayed scaling, fp4_utils.py:222-226 NVFP4);
    # Megatron-LM's pretrain_gpt.py has no flag for it (arguments.py:2307, 2333 leave the field out of the
    # generated arguments), NeMo sets it (mlcommons/training_results_v5.1@441d65f4 NVIDIA/benchmarks/
    # llama31_8b/implementations/nemo/config_common_fp8attn.sh:1 FP8_DPA=True, conf/custom.yaml:127,
    # pretrain.py:254,280). DotProductAttention then quantises q, k, v and runs cuDNN's fp8 fused
    # attention forward and backward (TransformerEngine@40c69e75 = v2.8 transformer_engine/pytorch/
    # attention/dot_product_attention/backends.py:1105-1205, 1380-1468): with current scaling (precision
    # fp8 with fp8_recipe tensorwise; precision fp4 with NVTE_DPA_FP8_RECIPE=Float8CurrentScaling, as
    # those MLPerf configs export, config_common_fp4.sh:15) the output stays 16-bit
    # (NVTE_DPA_FP8CS_O_in_F16, default 1, backends.py:139); with delayed scaling it is fp8. Priced in
    # cost_models.compute (fp8 kernels, casts) and activations (what is saved). Megatron, precision fp8
    # or fp4, cuDNN attention on Hopper or Blackwell (rules._fp8_attention).
    fp8_attention: bool = False
    # Transformer Engine's delayed scaling with reduce_amax: the amaxes a model chunk's fp8 modules
    # recorded are concatenated and all-reduced (max) over the fp8_autocast's group once when the
    # autocast region exits after the chunk's forward, and once after the backward of its first module
    # (the chunk's last backward); the value names that group where the compute stream waits for the
    # all-reduce, NONE where it does not (the default, not priced). One autocast region per model chunk
    # and micro-batch: NeMo 1.17's ParallelTransformer.forward (NVIDIA/NeMo@0b4c3dbf = v1.17.0_pt_23.04
    # nemo/collections/nlp/modules/common/megatron/transformer.py:1424-1431) and Megatron core's
    # TransformerBlock.forward (Megatron-LM@3c0f3ef3 = core_v0.7.0.beta megatron/core/transformer/
    # transformer_block.py:365-374) each wrap their layers in one. Priced in
    # cost_models.step_time.te_amax_reduction_seconds.
    # - TE release_v0.8 (TransformerEngine@8e5f00f2): the forward reduction at autocast exit
    #   (transformer_engine/pytorch/fp8.py:298-303, set up by module.py:654-662), the backward one in
    #   _prepare_backward for the first module (module.py:141-149); over fp8_meta["fp8_group"] unless
    #   NVTE_DP_AMAX_REDUCE_INTERVAL skips the data-parallel reduction (fp8.py:564-587), with
    #   async_op=NVTE_ASYNC_AMAX_REDUCTION, default 0 (module.py:305-307, fp8.py:535-547, 592-596):
    #   torch.distributed.all_reduce without async_op makes the current stream wait for it. NeMo 1.17
    #   hands fp8_autocast apex's amax reduction group (transformer.py:1425-1431), the tp x dp ranks
    #   of one pipeline stage (NVIDIA/apex@57057e2f apex/transformer/parallel_state.py:206-218): TP_DP.
    # - TE 09ba8427 and 4ee8e8ec (the same code): NVTE_DP_AMAX_REDUCE_INTERVAL=0 reduces over tp only
    #   (fp8.py:329-356), and NVTE_ASYNC_AMAX_REDUCTION=1 waits for the forward handle at the next
    #   chunk's first module and for the backward one at the next backward (module/base.py:76, 616): NONE.
    # - TE v1.6rc1 (TransformerEngine@9e4091e7): always async_op=False (fp8.py:300-310) at autocast exit
    #   (fp8.py:411-418) and in the first module's backward (module/linear.py:538-539,
    #   layernorm_linear.py:669, layernorm_mlp.py:1128); the NVTE_* variables are no longer read. Megatron
    #   core 0.7's autocast group is the tensor-parallel group (transformer_block.py:365-367), and its
    #   TEDelayedScaling leaves reduce_amax at DelayedScaling's default True (custom_layers/
    #   transformer_engine.py:543-561; TE common/recipe/__init__.py:128): TP.
    # - TE v1.9 to v2.x (TransformerEngine@e79d915a = v1.9, @d0c452cc = v2.2.1, @40c69e75 = v2.8): the same
    #   synchronous reductions, at the outermost autocast's exit in grad mode (v2.2.1 transformer_engine/
    #   pytorch/fp8.py:439-448) and in the backward of its first module (module/linear.py:351-357, 707-710),
    #   all_reduce with async_op=False (fp8.py:330-338); the NVTE_* variables are read by the Paddle code
    #   only. Megatron core builds one autocast around a chunk's layers for delayed scaling
    #   (Megatron-LM@ea651a3b = core_v0.13.1 transformer_block.py:551-560) over
    #   get_amax_reduction_group(with_context_parallel=True, tp_only_amax_red) (fp8_utils.py:475-477;
    #   Megatron-LM@d98e8a64 fp8_utils.py:858-861): tp x cp x dp (TP_DP), or tp x cp (TP_CP) with
    #   TransformerConfig.tp_only_amax_red, which NeMo's MLPerf Llama 3.1 code sets by default
    #   (training_results_v5.0@0fdc28f0 .../llama31_405b/implementations/*/conf/custom.yaml:113, pretrain.py:238).
    # Megatron, precision fp8, fp8_recipe delayed only.
    te_amax_reduction: AmaxGroup = AmaxGroup.NONE
    # Megatron --grad-reduce-in-bf16 (megatron-core DistributedDataParallelConfig grad_reduce_in_fp32=
    # False): the gradient buffer and its reduction in bf16, 2 bytes per parameter instead of the fp32
    # main grads Megatron-LM forces for --bf16 otherwise (Megatron-LM@d98e8a64 arguments.py:1204-1217,
    # 3053; param_and_grad_buffer.py:923). NVIDIA's and Cisco's MLPerf Llama-3.1 NeMo code sets it
    # (mlcommons/training_results_v5.0@0fdc28f0 NVIDIA/benchmarks/llama31_405b/.../pretrain.py:252,355).
    grad_reduce_in_bf16: bool = False
    # FSDP2 fully_shard(reshard_after_forward=...): whether each layer's gathered parameters are freed
    # after its forward, so that every micro-batch gathers them again. None = the framework's default:
    # torchtitan reshards only without a pipeline (torchtitan 0.3.0 distributed/fsdp.py:71-74, "to
    # avoid per-microbatch all-gathers, which can be expensive and non-overlapped"); DeepSpeed ZeRO-3
    # always re-gathers. KempnerForge keeps fully_shard's True under its pipeline too
    # (KempnerInstitute/KempnerForge@601aba9 kempnerforge/distributed/parallel.py:110-153 apply_fsdp2,
    # called without the argument at scripts/train.py:111,120).
    fsdp_reshard_after_forward: bool | None = None
    # torchtitan's FSDP2 plan from pytorch/torchtitan@83e69410 (2025-07-28) on, without a pipeline:
    # tok_embeddings one fully_shard unit and every decoder layer one, each resharded after its
    # forward (the last layer too), and [norm, output] one unit kept gathered from its forward until
    # its backward; the root wraps nothing else (torchtitan/models/llama3/infra/parallelize.py:388-422
    # at 6fc499f6). Before it, the root held the embedding, final norm and output layer and the last
    # layer stayed gathered (parallelize_llama.py:346-369 at 54ef4222). FSDP2 reshards every unit after
    # its backward (FSDPParamGroup.post_backward, reshard_after_backward defaults to True;
    # torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py:606-609, read in torch 2.13.0), so the
    # output layer's gathered weight and 16-bit gradient are gone before the decoder layers' backward
    # and the embedding is gathered only after it (cost_models.memory.stage_buffers). Framework
    # torchtitan only. None = the torchtitan `planner launch` writes for (v0.2.2 and 0.3.0, both after
    # 83e69410: torchtitan/models/llama3/infra/parallelize.py:333-357 at v0.2.2, 73a0e697), so the
    # split plan on framework torchtitan and none elsewhere (splits_fsdp_root).
    fsdp_split_root: bool | None = None
    # Megatron's wgrad GEMMs accumulate straight into the fp32 main grad (gradient_accumulation_fusion,
    # the default). --no-gradient-accumulation-fusion (False here) makes them write a 16-bit
    # param.grad that the DDP backward hook then adds into main_grad, once per micro-batch
    # (Megatron-LM@d98e8a64 megatron/training/arguments.py:2944-2948;
    # megatron/core/distributed/distributed_data_parallel.py:575-578). Megatron only.
    grad_accumulation_fusion: bool = True
    # Megatron --overlap-grad-reduce and --overlap-param-gather (what the Megatron launch files pass):
    # the gradient reduction bucket by bucket during the last backward, the distributed optimizer's
    # parameter gather behind the next forward. Megatron's defaults are off (Megatron-LM@d98e8a64
    # megatron/training/arguments.py:3121-3122, 3148-3149): False here runs both after the backward
    # and the optimizer step, exposed. Megatron only.
    overlap_grad_reduce: bool = True
    # Megatron --ddp-bucket-size: parameters per gradient bucket of the DDP buffer, each bucket one
    # reduce-scatter (all-reduce without the distributed optimizer) and one parameter all-gather of its
    # own (cost_models.step_time.megatron_buckets). None = Megatron's default, max(40M, 1M x dp·cp)
    # (Megatron-LM@d98e8a64 megatron/training/training.py:2179-2194 resolve_ddp_bucket_size). A bucket
    # closes at the first parameter that brings it to this size, so a size below every parameter's
    # makes each parameter tensor a bucket. Megatron only.
    ddp_bucket_size: Annotated[int, Field(ge=1)] | None = None
    # NeMo 1's Apex DistributedFusedAdam (NeMo `optim: distributed_fused_adam`) in place of Megatron's
    # DDP buffer: NeMo hands the optimizer one parameter bucket per transformer layer, every layer of
    # every model chunk, reversed, and puts every other parameter (embeddings, final norm, the tied
    # output weight) into the bucket of the rank's first layer (NeMo as vendored in mlcommons/
    # training_results_v4.0@6fe95437 ASUSTeK/benchmarks/ft-llm/implementations/pytorch/NeMo/nemo/
    # collections/nlp/models/language_modeling/megatron_gpt_model.py:547-580, handed over one group at
    # a time at megatron_base_model.py:851-857); Apex's init_params_bucket makes all buckets cut from one such group depend
    # on every parameter of it, so they are reduced together (NVIDIA/apex@d571f3ee
    # apex/contrib/optimizers/distributed_fused_adam.py:867-930), in whole buckets of bucket_cap_mb
    # (apex_bucket_cap_mb). Each layer is one reduce-scatter when its last gradient is ready and one
    # all-gather before its next forward (cost_models.step_time.megatron_buckets,
    # bucket_collective_seconds), on every pipeline rank and chunk, where
    # Megatron's DDP turns bucketing off but on the first. Megatron framework with zero 1 only.
    apex_distributed_adam: bool = False
    # Apex DistributedFusedAdam's bucket_cap_mb (NeMo `optim.bucket_cap_mb`): MiB of gradients per
    # bucket; a layer's group fills whole buckets, communicated whole
    # (cost_models.step_time.apex_bucket_elements); Apex's default is 100 (NVIDIA/apex@d571f3ee
    # apex/contrib/optimizers/distributed_fused_adam.py:416). Read only with apex_distributed_adam.
    apex_bucket_cap_mb: Annotated[float, Field(gt=0)] = 100.0
    # A DTensor plan (torchtitan framework) that shards q, k, v (and a gated MLP's gate and up) as
    # separate ColwiseParallel modules, each taking the sequence-sharded input itself: one all-gather
    # of the input per projection in forward and one reduce-scatter (all-reduce without sequence
    # parallel) of its gradient in backward, where torchtitan's PrepareModuleInput gathers once per
    # block (KempnerInstitute/KempnerForge@601aba9 kempnerforge/distributed/tensor_parallel.py:62-78).
    tp_gather_per_projection: bool = False
    # Whether a layer's q, k, v projections (and a gated MLP's gate and up) run as one fused GEMM.
    # None: the framework's own model code decides. Megatron (linear_qkv, linear_fc1) and nanotron
    # fuse them; torchtitan's Llama keeps separate wq, wk, wv, w1, w3 nn.Linear modules
    # (pytorch/torchtitan@820504e2 torchtitan/models/llama3/model.py L205-210, L297-299), each a GEMM
    # of its own that reads the shared input again (compute.linear_modules).
    fused_projections: bool | None = None
    # nanotron's fp32 gradient accumulation (accumulate_grad_in_fp32, huggingface/nanotron@c2528430
    # src/nanotron/optim/gradient_accumulator.py:204-223, called for every micro-batch from
    # parallel/pipeline_parallel/engine.py:82-86): the whole backward runs first, leaving a 16-bit
    # .grad on every parameter of the stage, and only then is each added into the fp32 buffer and
    # freed. The stage's 16-bit gradients are all alive when a backward ends. Megatron framework with
    # grad_accumulation_fusion=False only (the gradients are written outside the GEMMs).
    grads_kept_through_backward: bool = False
    # Megatron DDP's align_param_gather (DistributedDataParallelConfig, as NeMo 2 code builds it): the
    # forward pre-hooks no longer dispatch the next bucket's parameter all-gather
    # (Megatron-LM@d98e8a64 megatron/core/distributed/distributed_data_parallel.py:542-550), leaving
    # it to the interleaved schedule, which gathers each model chunk ahead of its first forward
    # (core/pipeline_parallel/schedules.py:1219-1221, 1341). Without that schedule nothing dispatches
    # ahead: each bucket's gather starts at the pre-hook of the first module using it and is waited
    # on there (param_and_grad_buffer.py:555-573), so the gathers run in series with the forward.
    # Megatron's own argument parsing turns it off without interleaving (training/arguments.py:
    # 1005-1013); code that builds the DDP config itself can leave it on. Megatron, distributed
    # optimizer (zero 1) with overlap_grad_reduce only.
    align_param_gather: bool = False
    # Per-communicator NCCL CTA caps (NcclCtas): the SMs an overlapped collective holds
    # (cost_models.step_time._share). Megatron framework only.
    nccl_max_ctas: NcclCtas | None = None
    # Megatron --make-vocab-size-divisible-by as the run used it: the word embedding and output layer
    # get the vocabulary rounded up to a multiple of this·tp (Megatron-LM@d98e8a64
    # megatron/training/vocab_utils.py L44-59; default 128, megatron/training/arguments.py L2441).
    # None: the planner's own choice, the largest power of two up to 128 that pads nothing where one
    # exists (cost_models.states.vocab_divisor), which `planner launch` writes as --padded-vocab-size.
    # Megatron framework only.
    vocab_divisible_by: Count | None = None
    # The model wrapped in torch DistributedDataParallel besides the framework's own gradient buffer:
    # nanotron wraps it when dp > 1 unless it accumulates in fp32 under ZeRO-1 (huggingface/nanotron
    # @c2528430 src/nanotron/trainer.py:786-788, 843-852). DDP's reducer allocates a flat gradient
    # buffer per bucket in the parameters' dtype at construction and keeps it (cost_models.memory), and
    # reduces the gradients bucket by bucket, each bucket its own all-reduce of nanotron's fp32 buffers
    # (cost_models.step_time.torch_ddp_all_reduce_seconds). Megatron framework only.
    ddp_buckets: bool = False
    # nanotron's ZeRO-1 with fp32 gradient accumulation (no DDP): once the pipeline's last backward
    # ends, the stage's whole fp32 gradient buffer is all-reduced across dp in one blocking call
    # (huggingface/nanotron@c2528430 src/nanotron/trainer.py:509-518 passes reduce_scatter=False;
    # optim/gradient_accumulator.py:128-155 all_reduce of _contiguous_fp32_grad_buffer, allocated
    # float at :173), and after the optimizer step every parameter's updated 16-bit shard is
    # all-gathered in one blocking call (optim/zero.py:95-120, 217-241; distributed.py:153-220). Neither
    # overlaps compute (cost_models.step_time.dp_tail). Megatron framework with zero=1 only.
    zero1_blocking_sync: bool = False
    # nanotron's sharded cross entropy casts the 16-bit logits to fp32 (a copy) and then subtracts
    # the row maximum out of place (huggingface/nanotron@c2528430 src/nanotron/models/llama.py:
    # 971-973; parallel/tensor_parallel/functional.py:40-43, 110-115), where Megatron subtracts in
    # place (Megatron-LM@d98e8a64 megatron/core/tensor_parallel/cross_entropy.py:25, 42). Megatron
    # framework only.
    loss_shift_out_of_place: bool = False
    # SwiGLU as eager silu(gate) * up on views of the fused [gate|up] output, as nanotron runs it
    # (huggingface/nanotron@c2528430 src/nanotron/models/llama.py:194-201 GLUActivation, 241-245;
    # nn/activations.py:139-149 F.silu): autograd keeps [gate|up], silu(gate) and the product, 4
    # f-wide tensors where Megatron's fused kernel keeps 3 (cost_models.activations.Convention).
    # Step time prices the activation as eager PyTorch on the two strided halves at its measured
    # rate (cost_models.compute Impl.SPLIT, presets/kernels "swiglu.split"). Megatron framework only
    # (the others' convention is eager already).
    eager_swiglu: bool = False
    # nanotron's multi-head (not grouped-query) attention permutes the fused qkv output into one
    # contiguous [q|k|v] copy, takes q as a view of it and concatenates k and v into a second
    # contiguous copy (huggingface/nanotron@c2528430 src/nanotron/models/llama.py:469-474, 655-660);
    # flash-attn's rotary embedding turns q and kv in place (Dao-AILab/flash-attention@418d6771, v2.6.3,
    # flash_attn/layers/rotary.py:414-481; nanotron pins flash-attn>=2.5.0,<2.7.0 in pyproject.toml:48)
    # and flash attention saves q, k and v, so the whole first copy stays alive: its k and v parts are
    # two kv-wide tensors per layer beyond Megatron's q, k, v (cost_models.activations); step time
    # prices the copies themselves, forward and backward (cost_models.compute.qkv_copy_bytes). Megatron
    # framework only; no effect with grouped-query attention, where q, k and v are copied apart.
    qkv_copy_kept: bool = False
    # nanotron's sequence-parallel linears (tp_mode REDUCE_SCATTER with tp_linear_async_communication,
    # which its benchmark script sets, scripts/scaling_benchmarks.py:87-88) gather the sequence into a
    # process-wide MemoryBuffer rather than a tensor of their own: a column-parallel linear's input
    # into buffer "allgather" in forward and again in backward (tp_recompute_allgather defaults to
    # True, config/parallelism_config.py:37), a row-parallel linear's output gradient into
    # "allgather2" in backward (huggingface/nanotron@c2528430 src/nanotron/parallel/tensor_parallel/
    # functional.py:153-156, 286-288, 491-493). The buffers are made on first use and never freed
    # (parallel/utils.py:14-28): two 16-bit [seq, mbs, hidden] tensors alive for the whole run
    # (cost_models.memory.stage_buffers), where Megatron's gathered input lives only in the
    # layer's backward. Megatron framework only; nothing with tp 1 or without sequence parallel.
    tp_gather_buffers: bool = False
    # nanotron's row-parallel linears (attention output and MLP down projection, sequence parallel)
    # compute their whole [seq, mbs, hidden] output and free it right after reduce-scattering it
    # (huggingface/nanotron@c2528430 src/nanotron/parallel/tensor_parallel/functional.py:453-470,
    # distributed_differentiable_primitives.py:92-120). ProcessGroupNCCL records each collective's
    # input on its NCCL stream, so the caching allocator returns the freed block only once that
    # reduce-scatter has run on the GPU (pytorch/pytorch@0007e752 torch/csrc/distributed/c10d/
    # ProcessGroupNCCL.cpp, the [Sync Streams] note: recordStream "delays GC until that event is
    # done"). Blocks freed while the host runs ahead of the GPU stay reserved but unusable
    # (cost_models.memory.pending_scatter_bytes). Megatron framework only; nothing with tp 1 or
    # without sequence parallel.
    tp_scatter_inputs_pending: bool = False

    # KempnerForge's FSDP2 stack (framework torchtitan), read at KempnerInstitute/KempnerForge@01b461a
    # (its config-validation report ran @601aba9, the same code in these places):
    # The parameters themselves in bf16: the model is cast to train.param_dtype (bf16 by default)
    # before or right after fully_shard (kempnerforge/distributed/parallel.py:205-212;
    # config/schema.py:148,164-170), so the sharded parameters are bf16; FSDP2 casts each
    # reduce-scattered gradient back to the sharded parameter's dtype (pytorch/pytorch@17a7e1e0
    # torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py foreach_reduce,
    # `_to_dtype_if_needed(reduce_output, orig_dtype)`), and AdamW creates exp_avg and exp_avg_sq
    # with zeros_like(param) (training/optimizer.py:66-73; pytorch/pytorch@005941eb
    # torch/optim/adam.py, Adam.step's lazy state initialisation): 2 + 2 + 2·2 bytes per parameter
    # and no fp32 copy anywhere. Framework torchtitan only.
    bf16_params: bool = False
    # RMSNorm as torch's nn.RMSNorm / F.rms_norm with the weight in the input's dtype (FSDP2's bf16
    # parameters), which runs the fused _fused_rms_norm kernel, one forward and two backward
    # kernels (pytorch/pytorch@3de78edb aten/src/ATen/native/layer_norm.cpp rms_norm_symint; the
    # rms_norm_composite chain only for channels-last, complex or mismatched dtypes): torchtitan's
    # RMSNorm is nn.RMSNorm (pytorch/torchtitan@b5bcd76c torchtitan/models/common/nn_modules.py
    # L134), and validate's worker calls F.rms_norm (planner/validate/worker.py Norm). Off: the
    # eager chain of x.float(), pow, mean, rsqrt, mul, type_as, mul (KempnerForge's RMSNorm,
    # KempnerInstitute/KempnerForge@5666d0d kempnerforge/model/norm.py L22-27, and torchtitan's own
    # RMSNorm of 2024). Framework torchtitan only.
    fused_rms_norm: bool = False
    # The FSDP gradient reduce-scatter in bf16 instead of fp32: torch FSDP's MixedPrecision with
    # reduce_dtype=bfloat16, as Composer's mixed_precision PURE builds it (param, reduce and buffer
    # dtypes all the 16-bit precision: mosaicml/composer@v0.16.4 composer/trainer/mosaic_fsdp_utils.py
    # L91-94, the same in v0.14.1 and v0.15.0 composer/trainer/mosaic_fsdp.py L89-92), where its
    # DEFAULT (L87-90) and torchtitan's mixed_precision_reduce default reduce in fp32: 2 bytes per
    # gradient element on the wire and in the reduce-scatter's copy-in instead of 4. Framework
    # torchtitan only.
    fsdp_reduce_in_bf16: bool = False
    # torch's FullyShardedDataParallel (FSDP1) rather than fully_shard (FSDP2): each wrapped unit's
    # parameters live in one FlatParameter that the all-gather fills and the module's parameters view,
    # so there is no copy-out; what it moves per micro-batch instead (cost_models.step_time
    # fsdp_copy_seconds) is the cast of the fp32 shard to the 16-bit param dtype before each gather
    # (_flat_param.py _use_low_precision_shard), the cast of the unsharded 16-bit gradient to the
    # reduce dtype where they differ (_runtime_utils.py _post_backward_hook, L759-764), and the in-place
    # divisions of the unsharded gradient before the reduce-scatter and of the shard after it
    # (_reduce_grad L852, L879; predivide factor > 1 for any world size >= 2,
    # algorithms/_comm_hooks/default_hooks.py L38-42), as read in torch 2.13.0 (pytorch/pytorch@cf30153c).
    # llm-foundry's MPT benchmark image ran torch 2.1.0 (mosaicml/pytorch:2.1.0, sweep.sh@b2a43a147),
    # where each step stands the same at pytorch/pytorch@7bcf7da3 (v2.1.0, torch/distributed/): the
    # shard's cast in fsdp/flat_param.py:1211-1228 _use_low_precision_shard, the gradient's in
    # fsdp/_runtime_utils.py:773-780 _post_backward_hook, the divisions at :852 and :872 (_reduce_grad),
    # the predivide factor from the data-parallel world size at fsdp/_init_utils.py:118-128 and
    # algorithms/_comm_hooks/default_hooks.py:38-43. Framework torchtitan only.
    fsdp_flat_params: bool = False
    # FSDP2's gradient reduction turned off on every micro-batch but the last
    # (set_requires_gradient_sync(False), training/grad.py:16-40, around each micro-batch at
    # scripts/train.py:293-297): each parameter's unsharded gradient is then kept from the first
    # micro-batch's backward to the last one's reduce-scatter, upcast to the fp32 reduce dtype
    # (pytorch/pytorch@17a7e1e0 torch/distributed/fsdp/_fully_shard/_fsdp_param.py
    # FSDPParam.to_accumulated_grad_if_needed / accumulate_unsharded_grad_if_needed;
    # parallel.py:67-72 reduce_dtype=torch.float32). Under a pipeline torch's schedule does the same
    # for every FSDP2 job (cost_models.memory.stage_buffers). Framework torchtitan only.
    fsdp_sync_last_microbatch: bool = False
    # A tensor-parallel plan that leaves the vocabulary unsplit: the token embedding replicated over
    # tp (tensor_parallel.py:122-132 wraps its output, no plan entry), the output layer column-
    # parallel with its logits gathered whole onto every rank (output_layouts=Replicate(),
    # tensor_parallel.py:157-164), and on pipeline stages, where that plan is not applied, the
    # output layer replicated as well (tensor_parallel.py:116-120, 159). Every tp rank then holds
    # the full embedding and runs the loss over the whole vocabulary. Framework torchtitan only.
    tp_replicated_vocab: bool = False
    # The loss taken eagerly on the model's 16-bit logits, outside the compiled model:
    # F.cross_entropy(logits.view(-1, V), ...) with the logits still referenced by the training
    # loop (scripts/train.py:294-297, 137-138; parallel.py:214-216 compiles the model only).
    # cross_entropy's log_softmax keeps a 16-bit output, and its backward makes two 16-bit
    # gradients, nll_loss's and log_softmax's (cost_models.activations.loss_workspace). Needs the
    # loss uncompiled (compile_loss False). Framework torchtitan only.
    loss_on_16bit_logits: bool = False
    # torch.compile around the whole model (parallel.py:214-216), where torchtitan compiles each block:
    # with no FSDP or DDP hook to break it (one GPU, no device mesh: setup.py:81-85) the model is one
    # graph, run as one autograd.Function (AOTAutograd's CompiledFunction, pytorch/pytorch@7aee3376
    # torch/_functorch/_aot_autograd/runtime_wrappers.py) whose backward returns every parameter's
    # gradient together at its end. With gradients accumulated over micro-batches, a whole new set
    # is then alive beside .grad before autograd adds it in (cost_models.memory). Framework
    # torchtitan with compile only.
    compile_whole_model: bool = False
    # torchtitan's per-op selective checkpointing on SDPA's cuDNN backend, before the save list held
    # that kernel: its save list names SDPA's flash and memory-efficient ops only
    # (pytorch/torchtitan@6fc499f6 torchtitan/models/llama3/infra/parallelize.py:233-243; the cuDNN
    # op joined it at b39377f9, 2025-12-01), while its attention module puts CUDNN_ATTENTION first
    # on compute capability 10.0 (torchtitan/models/attention.py:200-211 there, since 3b85aa31). The
    # policy returns PREFER_RECOMPUTE for every op outside the list (parallelize.py:295-310), so the
    # attention output and its softmax statistics are not kept and the kernel runs again in the
    # backward (cost_models.activations._per_op_sac, cost_models.flops.recomputed_share).
    # Framework torchtitan, attention_backend cudnn only.
    sac_recomputes_attention: bool = False
    # Megatron's distributed optimizer before NVIDIA/Megatron-LM@c1d27dfa ("fix param_buffer peak
    # memory may be OOM", Dec 2023) built its 16-bit parameter buffers with torch.tensor(storage,
    # ...) on the grad buffer's storage, which first allocates a new tensor of the storage's size and
    # only then points it at the storage (NVIDIA/Megatron-LM@0609f27f megatron/optimizer/
    # distrib_optimizer.py:354-423): at optimizer construction a transient as large as the grad
    # buffer, beside the weights, the grad buffer and the fp32 master shards, before any Adam state
    # or activation (cost_models.memory). report_memory's peaks count from the process's start.
    # Framework megatron only; without the distributed optimizer (zero 0) there is no such buffer.
    param_buffer_init_copy: bool = False
    # torch.distributed.pipelining before pytorch/pytorch#153383 (merged 2025-05-13, "[PP] Optimize memory
    # usage by releasing output memory earlier"): _PipelineStageBase.forward_one_chunk appended every
    # micro-batch's output to stage.output_chunks on every stage (the PR adds `if self.is_last:`), and
    # they are dropped only when the next step() starts (clear_runtime_states); the last stage's are
    # merged for step()'s return value. So through a step every stage keeps all its micro-batches'
    # outputs: a boundary tensor each beyond those still in flight, and on the last stage the 16-bit
    # logits of each (detached after their backward since pytorch/pytorch#138504, Oct 2024, their data
    # kept) (cost_models.memory.kept_pipeline_outputs). torchtitan's Dec 2024 benchmarks ran torch nightly
    # 1963fc8 of 2024-12-23 (pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, 'Versions
    # and Dates'). Framework torchtitan with pp > 1 only.
    pipeline_keeps_outputs: bool = False
    # torchtitan's per-op selective checkpointing before pytorch/torchtitan@c4e229115 (2025-09-06,
    # "Save _to_copy and a2a in selective AC policy"): its save list was aten.mm, SDPA's flash and
    # memory-efficient kernels, reduce_scatter_tensor and max (torchtitan@d0cdb1433^
    # torchtitan/models/llama3/infra/parallelize.py:237-246, which DeepSeek-V3's parallelize imports
    # through apply_ac, deepseek_v3/infra/parallelize.py:27, 101), with no all_to_all_single and no
    # topk: an MoE layer keeps neither its expert-parallel all-to-alls' outputs nor the router's top-k
    # (activations._sac_moe), and its backward's recomputation runs the dispatch and combine
    # all-to-alls again (step_time.layer_pass). c4e229115 added all_to_all_single to the DeepSeek-V3 and
    # Llama 4 save lists (deepseek_v3/infra/parallelize.py:38 there). Framework torchtitan, selective.
    sac_recomputes_all_to_all: bool = False
    # Megatron's local (non-Transformer-Engine) linear_qkv adds its bias outside the GEMM: the legacy
    # model's query_key_value is a ColumnParallelLinear with skip_bias_add at its default False
    # (sail-sg/zero-bubble-pipeline-parallelism@77b9eed9 megatron/model/transformer.py:553-559,
    # megatron/core/tensor_parallel/layers.py:599, 749), whose autograd function runs
    # `output = output + bias` after torch.matmul (layers.py:337-340) and reduces the bias gradient
    # with grad_output.sum(dim=0) (layers.py:447): one add kernel forward, one reduction backward
    # (compute.qkv_bias_seconds). --transformer-impl defaults to local there (megatron/arguments.py:535)
    # and --add-bias-linear to on (:927-929). Transformer Engine's linear_qkv adds the bias and reduces
    # its gradient in the cuBLASLt epilogue, so this is off by default. Framework megatron with a
    # qkv bias only.
    qkv_bias_unfused: bool = False
    # Megatron core's TEDotProductAttention with rope fusion on (--no-rope-fusion not passed: it defaults
    # on, whatever the position embedding) hands Transformer Engine q, k and v as bshd, copying each
    # strided view of the fused qkv output with transpose(0, 1).contiguous()
    # (sail-sg/VocabularyParallelism@4dca7d20 megatron/core/transformer/custom_layers/
    # transformer_engine.py:503-524; megatron/training/arguments.py:1165-1168, copied into the
    # TransformerConfig by name at :648-650; the views:
    # megatron/core/transformer/attention.py:486-526). In backward their gradients, three tensors of
    # flash-attn's own, are joined back into the fused gradient with torch.cat (Transformer Engine
    # _SplitAlongDim.backward, NVIDIA/TransformerEngine@v1.4 transformer_engine/pytorch/attention.py:
    # 1247-1287, unchanged in v1.3 and v1.5). At one sequence per micro-batch the output's transpose
    # back is a view (a dimension of 1), so only the q, k, v copies and the join are priced
    # (compute.qkv_layout_copy_seconds). Framework megatron with flash attention only.
    qkv_bshd_copies: bool = False
    # Megatron's bias-dropout-add as a TorchScript function (the legacy layer's
    # bias_dropout_add_fused_train, NVIDIA/Megatron-LM@0609f27f megatron/model/transformer.py:717-737,
    # called on both block outputs at :1082-1101 and :1156-1161 under --bias-dropout-fusion, on by
    # default, megatron/arguments.py:827-829; Transformer Engine v0.11's TransformerLayer does the
    # same, NVIDIA/TransformerEngine@v0.11 transformer_engine/pytorch/jit.py:115-142, transformer.py:
    # 256, 518-531, 587-590) keeps its 1-byte dropout mask for backward even at --hidden-dropout 0:
    # both set the profiling executor with autodiff subgraph inlining off (megatron/initialize.py:
    # 262-283 at 0609f27f; jit.py:23-36 at v0.11), so the scripted function runs as one
    # differentiable graph whose backward is TorchScript's dropout formula, which needs the mask
    # (torch/csrc/jit/runtime/symbolic_script.cpp `dropout`: a bool mask the input's size, made
    # whatever p is; on torch 2.13 saved_tensors_hooks see exactly one bool tensor of the block
    # output's shape at p = 0). Eager dropout at p = 0 returns its input and keeps nothing
    # (aten/src/ATen/native/Dropout.cpp). So each block output keeps a mask of the residual stream's
    # size, dropout or not (cost_models.activations). Framework megatron only.
    bda_mask_kept: bool = False
    # Megatron's vocab-parallel cross entropy before NVIDIA/Megatron-LM@9634c0e4 ("Reduce logit memory
    # pressure by using in-place operation", 2024-06-13) subtracted the row maximum out of place
    # (`vocab_parallel_logits = vocab_parallel_logits - logits_max.unsqueeze(dim=-1)`,
    # NVIDIA/Megatron-LM@0609f27f megatron/core/tensor_parallel/cross_entropy.py:24), a new fp32
    # tensor that becomes the saved softmax (:57, :69, :91), while its fp32 input, `output.float()`
    # passed by the GPT model, and the 16-bit logits the model still holds in `output`
    # (megatron/model/gpt_model.py:21-36) are alive: 2 + 4 bytes per logit beside the saved 4 at
    # the loss's forward, where the in-place code has only the 16-bit ones (cost_models.activations
    # .loss_workspace). Framework megatron only.
    loss_shift_beside_fp32_copy: bool = False
    # Megatron's vocab-parallel cross entropy as its separate eager kernels instead of the fused ones
    # of --cross-entropy-loss-fusion, which the cost model otherwise takes for Megatron (the
    # "loss.megatron" rate). The legacy GPT model of sail-sg/zero-bubble-pipeline-parallelism@77b9eed9,
    # a Megatron of late 2023 that has no fused cross entropy, casts the 16-bit logits to fp32
    # (megatron/model/gpt_model.py:32-36, --fp16-lm-cross-entropy off) and runs max, subtract, exp,
    # sum and divide over them forward and one multiply backward
    # (megatron/core/tensor_parallel/cross_entropy.py:19, 24, 57-58, 69, 124): the passes of Megatron
    # core's unfused vocab_parallel_cross_entropy (NVIDIA/Megatron-LM@d98e8a64
    # megatron/core/tensor_parallel/cross_entropy.py:20-114, which casts inside), the one Liger-Kernel's
    # benchmark times as "megatron-unfused" (compute.loss_time, "loss.megatron.unfused"). Megatron core
    # of early 2024 takes the same path whenever --cross-entropy-loss-fusion (store_true) is not passed
    # (sail-sg/VocabularyParallelism@4dca7d20 megatron/training/arguments.py:1169-1171,
    # megatron/core/models/common/language_module/language_module.py:37-40,
    # megatron/core/tensor_parallel/cross_entropy.py:27). Framework megatron only.
    cross_entropy_unfused: bool = False
    # Megatron's local (legacy) unfused attention copies what its views cannot express
    # (sail-sg/zero-bubble-pipeline-parallelism@77b9eed9 megatron/model/transformer.py): forward, the
    # context [b, np, sq, hn] -> [sq, b, np, hn] with permute(2, 0, 1, 3).contiguous() (:421-422);
    # q, k and v stay strided views of the fused qkv output (torch.split at :677-693, the views at
    # :356-361, 407-409), so in backward torch.split's gradient is the cat of dq, dk and dv
    # (split_with_sizes_backward), and torch.baddbmm(..., beta=0.0, alpha=1/norm_factor) (:368-373)
    # scales dq and dk by alpha with a multiply of its own after each bmm (pytorch/pytorch@d327a787
    # tools/autograd/derivatives.yaml, baddbmm: `grad.bmm(batch2.transpose(1, 2)) * alpha`; later
    # versions maybe_multiply, the same multiply for alpha != 1); the buffer operand needs no gradient
    # (compute.local_attention_copy_seconds). Framework megatron with eager attention only.
    local_attention_copies: bool = False
    # llm-foundry's attn_impl 'flash' with flash-attn 2 (mosaicml/llm-foundry@5e85bd62d
    # llmfoundry/models/layers/attention.py flash_attn_fn, L270-289, 342-369) hands the varlen kernel
    # q, k and v unpadded by flash-attn's bert_padding.unpad_input, one call each (a gather of every
    # row kept by the key padding mask, all rows for unpadded pretraining data), and pads the output
    # back with pad_input (zeros, then an index put); backward runs their transposes, a gather of the
    # output gradient and zeros + scatter_ for each of dq, dk, dv (Dao-AILab/flash-attention@v2.4.2
    # flash_attn/bert_padding.py L8-61, 98-122, 197-209; compute.flash_unpad_copy_seconds). The
    # torch.split of the fused qkv output and its gradient's cat are the model's, on every attn_impl,
    # and are not part of it; nor are the ALiBi slopes, n_heads floats made once per model forward
    # (llmfoundry/models/mpt/modeling_mpt.py L611-615 there). Framework torchtitan (llm-foundry's
    # FSDP) with flash attention only.
    flash_unpad_copies: bool = False

    @model_validator(mode="after")
    def _check(self) -> TrainingSpec:
        tokens = (self.global_batch_size or 1) * self.seq_len
        if tokens > MAX_TOKENS_PER_STEP:
            raise ValueError(
                f"global_batch_size({self.global_batch_size})·seq_len({self.seq_len}) = {tokens:,} tokens per step "
                f"exceeds {MAX_TOKENS_PER_STEP:,} (2^36); lower --global-batch-size or --seq-len"
            )
        return self

    @property
    def compiles_loss(self) -> bool:
        return self.compile if self.compile_loss is None else self.compile_loss

    @property
    def fp8_attention_current(self) -> bool:
        """Whether fp8 attention quantises with current scaling: precision fp4 (the NVFP4 linears' run
        exports NVTE_DPA_FP8_RECIPE=Float8CurrentScaling) or fp8 with fp8_recipe tensorwise; fp8 delayed
        takes the linears' delayed scaling (TransformerEngine@40c69e75 transformer_engine/pytorch/
        attention/dot_product_attention/dot_product_attention.py:90-140)."""
        return self.precision is Precision.FP4 or self.fp8_recipe is Fp8Recipe.TENSORWISE

    @property
    def splits_fsdp_root(self) -> bool:
        if self.fsdp_split_root is None:
            return self.framework is Framework.TORCHTITAN
        return self.fsdp_split_root
