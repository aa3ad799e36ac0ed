"""Layout rules: each framework rule rejects what the framework rejects, with the arithmetic shown."""

from __future__ import annotations

import pytest

from cost_models.enums import Schedule, Zero
from cost_models.errors import SpecError
from cost_models.hardware import Cluster
from cost_models.rules import problem_violations
from cost_models.training import TrainingSpec
from helpers import make_job
from planner import presets

L70 = "llama-3.1-70b"  # 80 layers, 64 heads, 8 kv heads


def _err(**kw) -> str:
    with pytest.raises(SpecError) as e:
        make_job(**kw)
    return str(e.value)


def test_degrees_must_divide_gpus():
    msg = _err(model=L70, gpus=96, tp=8, pp=4, cp=2, training=dict(global_batch_size=96))
    assert "tp(8)·pp(4)·cp(2) = 64 does not divide gpus(96)" in msg


def test_explicit_dp_must_complete_the_product():
    assert "dp must be 2" in _err(model=L70, gpus=64, tp=8, pp=4, dp=4, training=dict(global_batch_size=64))


@pytest.mark.parametrize(
    "kw, needle",
    [
        (dict(tp=3, gpus=24, training=dict(global_batch_size=8)), "num_attention_heads(64) is not divisible by tp(3)"),
        (dict(pp=3, gpus=24, tp=8), "num_layers(80) is not divisible by pp(3)"),
        (dict(pp=4, vpp=3, gpus=32, tp=8), "layers per rank is not divisible by vpp(3)"),
        (dict(cp=3, gpus=24, tp=8, training=dict(seq_len=4100, global_batch_size=3)), "seq_len(4100) is not divisible by 2·cp(3) = 6"),
        (dict(tp=8, mbs=3, gpus=16, training=dict(global_batch_size=8)), "global_batch_size(8) is not divisible by mbs(3)·dp(2) = 6"),
        (dict(ep=2, gpus=16, tp=8, training=dict(global_batch_size=16)), "needs a mixture-of-experts model"),
        (dict(tp=8, gpus=8, sp=True, training=dict(framework="deepspeed", global_batch_size=8)), "no sequence parallel"),
        (dict(pp=2, zero=2, gpus=16, tp=8, training=dict(framework="deepspeed", global_batch_size=16)), "ZeRO 0 or 1 only"),
        (dict(zero=1, gpus=8, tp=8, training=dict(framework="torchtitan", global_batch_size=8)), "FSDP2 only"),
        (dict(zero=0, gpus=16, tp=8, training=dict(framework="torchtitan", global_batch_size=16)), "does not combine"),
        (dict(zero=3, pp=2, gpus=16, tp=8, training=dict(global_batch_size=16)), "runs with pp = 1"),
        (dict(dp_shard=3, zero=3, gpus=32, tp=8, training=dict(framework="torchtitan", global_batch_size=32)), "dp_shard(3) does not divide dp(4)"),
        (dict(recompute_layers=2, gpus=8, tp=8, training=dict(global_batch_size=8)), "full recompute only"),
        (dict(pp=4, vpp=2, tp=8, gpus=32, training=dict(global_batch_size=6)), "divisible by pp(4)"),
        (dict(cp=2, tp=8, gpus=16, training=dict(attention="eager", global_batch_size=8)), "fused (flash) attention"),
        (dict(tp=8, gpus=8, training=dict(compile=True, global_batch_size=8)), "torchtitan jobs only"),
    ],
)
def test_rule_messages(kw, needle):
    kw.setdefault("model", L70)
    assert needle in _err(**kw)


def test_kv_heads_rule_differs_by_framework():
    # Megatron allows tp to be a multiple of the kv groups (replicating K/V); torchtitan shards whole heads.
    make_job(L70, gpus=16, tp=16, training=dict(global_batch_size=16))
    assert "num_kv_heads(8) is not divisible by tp(16)" in _err(model=L70, gpus=16, tp=16, training=dict(framework="torchtitan", global_batch_size=16))


def test_torchtitan_seq_divisor():
    assert "tp(8)·2·cp(1) = 16" in _err(model=L70, gpus=8, tp=8, training=dict(framework="torchtitan", seq_len=4100, global_batch_size=8))


def test_expert_grid():
    msg = _err(model="mixtral-8x7b", gpus=24, tp=2, ep=8, etp=2, training=dict(global_batch_size=24))
    assert "etp(2)·ep(8)·pp(1) = 16 does not divide gpus(24)" in msg


def test_uneven_pipeline_split():
    job = make_job("llama-3.1-405b", gpus=64, tp=8, pp=8, pp_first_stage_layers=15, pp_last_stage_layers=15, training=dict(global_batch_size=64))
    assert [len(job.stage_layer_ids(r)) for r in range(8)] == [15] + [16] * 6 + [15]
    assert "does not split evenly" in _err(model="llama-3.1-405b", gpus=64, tp=8, pp=8, pp_first_stage_layers=14, pp_last_stage_layers=15, training=dict(global_batch_size=64))


def test_interleaved_chunks_follow_megatron_order():
    # virtual stage v of rank r holds global segment v·pp + r: rank 0 holds layers 0-9 and 40-49
    job = make_job(L70, gpus=32, tp=8, pp=4, vpp=2, training=dict(global_batch_size=16))
    assert job.stage_chunks[0][0] == tuple(range(0, 10)) and job.stage_chunks[0][1] == tuple(range(40, 50))
    assert job.stage_chunks[3][1] == tuple(range(70, 80))


@pytest.mark.parametrize(
    "framework, zero, sp, etp",
    [("megatron", Zero.NONE, True, 8), ("torchtitan", Zero.PARAMETERS, True, 1), ("deepspeed", Zero.NONE, False, 1)],
)
def test_framework_defaults(framework, zero, sp, etp):
    job = make_job("mixtral-8x7b", gpus=16, tp=8, training=dict(framework=framework, global_batch_size=16))
    assert (job.zero, job.sp, job.etp, job.schedule) == (zero, sp, etp, Schedule.ONE_F_ONE_B)
    assert job.dp == 2 and job.num_microbatches == 8


def test_global_batch_defaults_to_legal_microbatches():
    # no global batch: mbs·dp·m, m = 1 without a pipeline, 4·pp with one (interleaved needs m % pp == 0)
    assert make_job(L70, gpus=16, tp=8, mbs=2).training.global_batch_size == 2 * 2 * 1
    job = make_job(L70, gpus=64, tp=8, pp=4, vpp=2)
    assert job.training.global_batch_size == 1 * 2 * 16 and job.num_microbatches == 16


@pytest.mark.parametrize("training, needle", [
    (dict(framework="torchtitan", grad_accumulation_fusion=False), "grad_accumulation_fusion=False is Megatron's"),
    (dict(framework="deepspeed", overlap_grad_reduce=False), "overlap_grad_reduce=False is Megatron's"),
    (dict(framework="megatron", fsdp_reshard_after_forward=True), "fsdp_reshard_after_forward describes an FSDP2/DTensor plan"),
    (dict(framework="megatron", tp_gather_per_projection=True), "tp_gather_per_projection describes an FSDP2/DTensor plan"),
    (dict(framework="deepspeed", fsdp_reduce_in_bf16=True), "fsdp_reduce_in_bf16 describes an FSDP2/DTensor plan"),
    (dict(framework="megatron", fsdp_flat_params=True), "fsdp_flat_params describes an FSDP2/DTensor plan"),
    (dict(framework="deepspeed", fused_rms_norm=True), "fused_rms_norm describes an FSDP2/DTensor plan"),
    (dict(framework="megatron", fsdp_split_root=True), "fsdp_split_root describes an FSDP2/DTensor plan"),
    (dict(framework="torchtitan", attention_backend="sdpa_flash", sac_recomputes_attention=True),
     r"sac_recomputes_attention describes torchtitan's per-op checkpointing on SDPA's cuDNN backend .*attention_backend=sdpa_flash"),
    (dict(framework="megatron", attention_backend="cudnn", sac_recomputes_attention=True),
     "sac_recomputes_attention describes torchtitan's per-op checkpointing"),
    (dict(framework="megatron", sac_recomputes_all_to_all=True), "sac_recomputes_all_to_all describes an FSDP2/DTensor plan"),
    (dict(framework="megatron", fsdp_split_root=True, fused_rms_norm=True),
     "fused_rms_norm and fsdp_split_root describe an FSDP2/DTensor plan"),
    (dict(framework="torchtitan", ddp_buckets=True), "ddp_buckets describes nanotron's code"),
    (dict(framework="deepspeed", ddp_bucket_size=64), "ddp_bucket_size is Megatron's --ddp-bucket-size"),
    (dict(framework="megatron", ub_ring_exchange_rs={"fc2"}), "ub_ring_exchange_rs picks Transformer Engine"),
    (dict(framework="deepspeed", eager_swiglu=True), "eager_swiglu describes nanotron's code"),
    (dict(framework="torchtitan", tp_scatter_inputs_pending=True), "tp_scatter_inputs_pending describes nanotron's code"),
    (dict(framework="megatron", grads_kept_through_backward=True), "needs grad_accumulation_fusion=False"),
    (dict(framework="torchtitan", zero1_blocking_sync=True), "zero1_blocking_sync describes nanotron's code"),
    (dict(framework="megatron", zero1_blocking_sync=True), "it needs zero 1, not zero 0"),
    (dict(framework="deepspeed", apex_distributed_adam=True), "apex_distributed_adam is NeMo 1's Apex DistributedFusedAdam"),
    (dict(framework="megatron", apex_distributed_adam=True), r"framework=megatron, zero 0\); drop it"),
    (dict(framework="megatron", align_param_gather=True), "align_param_gather is Megatron DDP's, for the distributed optimizer"),
    (dict(framework="torchtitan", nccl_max_ctas={"dp": 8}), "nccl_max_ctas is Megatron's --nccl-communicator-config-path"),
    (dict(framework="torchtitan", qkv_bias_unfused=True), "qkv_bias_unfused describes Megatron's local linear_qkv"),
    (dict(framework="megatron", qkv_bias_unfused=True), r"qkv_bias=False\); drop it"),
    (dict(framework="torchtitan", qkv_bshd_copies=True), "qkv_bshd_copies describes Megatron core's q, k, v copies"),
    (dict(framework="megatron", attention="eager", qkv_bshd_copies=True), "attention=eager"),
    (dict(framework="torchtitan", cross_entropy_unfused=True), "cross_entropy_unfused describes Megatron's vocab-parallel"),
    (dict(framework="megatron", attention="flash", local_attention_copies=True), "local_attention_copies describes Megatron's local"),
    (dict(framework="megatron", attention="flash", flash_unpad_copies=True), "flash_unpad_copies describes llm-foundry's unpad"),
    (dict(framework="torchtitan", attention="eager", flash_unpad_copies=True), "attention=eager"),
    (dict(framework="megatron", loss_shift_out_of_place=True, loss_shift_beside_fp32_copy=True),
     r"loss_shift_out_of_place=True\); use framework megatron without loss_shift_out_of_place"),
    (dict(framework="megatron", optimizer="decoupled_adamw"), "decoupled_adamw is Composer's DecoupledAdamW"),
    (dict(framework="deepspeed", optimizer="decoupled_adamw"), "decoupled_adamw is Composer's DecoupledAdamW"),
])
def test_one_frameworks_switches_are_refused_for_another(training, needle):
    with pytest.raises(SpecError, match=needle):
        make_job("llama-3.1-8b", gpus=8, training=training)


@pytest.mark.parametrize("training, rule", [
    (dict(framework="megatron", optimizer="decoupled_adamw"), "decoupled_adamw"),
    (dict(framework="torchtitan", nccl_max_ctas={"dp": 8}), "nccl_max_ctas"),
    (dict(framework="deepspeed", cross_entropy_unfused=True), "cross_entropy_unfused"),
    (dict(framework="torchtitan", bf16_params=True, precision="fp16"), "bf16_params"),
    (dict(framework="torchtitan", grad_reduce_in_bf16=True), "grad_reduce_in_bf16"),
    (dict(framework="megatron", grad_reduce_in_bf16=True, precision="fp16"), "grad_reduce_in_bf16"),
    (dict(framework="torchtitan", moe_dispatch="overlap"), "moe_dispatch"),
    (dict(framework="deepspeed", moe_dispatch="deepep"), "moe_dispatch"),
])
def test_a_framework_switch_breaks_the_problem_whatever_the_layout(training, rule):
    # each reads only the training spec, so the problem check names it (and only it) before any search
    spec = TrainingSpec(global_batch_size=8, **training)
    cluster = Cluster(spec=presets.clusters()["dgx-h100"], num_gpus=8)
    assert [name for name, _ in problem_violations(presets.models()["llama-3.1-8b"], cluster, spec)] == [rule]


@pytest.mark.parametrize("training, fits", [
    (dict(framework="megatron", zero1_blocking_sync=True), dict(zero=1)),
    (dict(framework="megatron", apex_distributed_adam=True), dict(zero=1)),
    (dict(framework="torchtitan", pipeline_keeps_outputs=True), dict(pp=2)),
])
def test_a_switch_that_needs_some_layout_leaves_the_problem_solvable(training, fits):
    # the default layout (zero 0, pp 1) breaks the switch's own rule, a layout with zero 1 or pp 2
    # takes it: the search, not the problem check, is to turn the others down
    spec = TrainingSpec(global_batch_size=8, **training)
    cluster = Cluster(spec=presets.clusters()["dgx-h100"], num_gpus=8)
    assert problem_violations(presets.models()["llama-3.1-8b"], cluster, spec) == []
    with pytest.raises(SpecError, match="needs zero 1|needs pp > 1|with zero 1"):
        make_job("llama-3.1-8b", gpus=8, training=dict(training, global_batch_size=8))
    make_job("llama-3.1-8b", gpus=8, training=dict(training, global_batch_size=8), **fits)
