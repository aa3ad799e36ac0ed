"""planner validate: slices of a plan, the trace analysis, the failure causes and the calibration
fit (fast, no processes), then real runs on CPU with gloo: an end-to-end validate with the profiler
and --calibrate, a rank that raises (CLI, exit 1) and a rank that hangs (torn down, no process
left). The numerical equivalence of each layout is in tests/test_validate_parallel.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cost_models.calibration import DEFAULT
from cost_models.errors import SpecError
from cost_models.states import local_layer_params
from cost_models.step_time import time_estimate
from planner import presets
from planner.cli import app
from planner.files import load_calibration
from planner.loaders import load_model
from planner.validate import worker
from planner.validate.calibrate import fit, write
from planner.validate.command import Options, ValidateReport, render, run_validate
from planner.validate.runner import TEARDOWN_LIMIT_S, failure_cause, find_processes
from planner.validate.slices import choose_slice, native_job, read_plan, run_doc
from tests.helpers import make_job

DATA = Path(__file__).parent / "data" / "validate"
TINY = str(DATA / "tiny-llama.toml")
TINY_FLAGS = ["--cluster", "dgx-h100", "--gpus", "2", "--framework", "torchtitan", "--seq-len", "32", "--global-batch-size", "8"]
TRAINING = {"framework": "torchtitan", "seq_len": 32, "global_batch_size": 8}
runner = CliRunner()


def titan(model: str, gpus: int, **layout):
    return make_job(model, gpus=gpus, training={"framework": "torchtitan", "seq_len": 8192, "global_batch_size": 64}, **layout)


# --- slices ----------------------------------------------------------------------------------------


def test_the_whole_plan_when_the_ranks_suffice():
    plan = make_job(load_model(TINY), gpus=2, training=TRAINING, tp=2)
    s = choose_slice(plan, 4)
    assert s.kind == "full" and s.job is plan and s.ranks == 2 and s.not_measured == ()


def test_fewer_replicas_keep_every_per_gpu_shape():
    plan = titan("llama-3.1-8b", 64, tp=8)  # dp 8, local batch 8 sequences
    s = choose_slice(plan, 16)
    assert s.kind == "fewer_replicas" and s.ranks == 16
    assert (s.job.layout.tp, s.job.dp, s.job.local_batch_size) == (8, 2, plan.local_batch_size)
    assert s.job.model == plan.model and s.not_measured == ()


def test_one_stage_scales_only_the_layer_count():
    plan = titan("llama-3.1-70b", 64, tp=8, pp=4)  # 80 layers, 20 per stage, dp 2
    s = choose_slice(plan, 8)
    assert s.kind == "one_stage" and s.ranks == 8 and s.not_measured == ("pp",)
    assert s.job.model.num_layers == 20 and s.job.layout.tp == 8 and s.job.layout.pp == 1
    assert s.job.num_microbatches == plan.num_microbatches
    assert local_layer_params(s.job, 0) == local_layer_params(plan, 0)
    # the prediction it is compared with is the cost model's for the slice: a 20-layer job
    assert time_estimate(s.job).step_s < time_estimate(plan).step_s


def test_one_rank_share_has_the_plans_per_gpu_layer_shapes():
    plan = titan("llama-3.1-70b", 64, tp=8, pp=4)
    s = choose_slice(plan, 4)  # fewer than tp: one rank's share
    assert s.kind == "one_rank" and s.ranks == 1
    assert set(s.not_measured) == {"tp", "pp", "dp"}
    m = s.job.model
    assert (m.num_attention_heads, m.kv_heads, m.head_size) == (8, 1, 128)  # 64/8 heads, 8/8 kv heads
    assert m.ffn_hidden_size == 28672 // 8 and m.vocab_size == 128256 // 8
    # the same parameters per layer as one tp rank of the plan holds
    assert local_layer_params(s.job, 0) == local_layer_params(plan, 0)


def test_one_rank_share_keeps_the_whole_vocabulary_where_every_tp_rank_holds_it():
    # tp_replicated_vocab: every tp rank holds the 128256-row embedding and takes the loss over the
    # whole vocabulary (states.local_vocab), so the share has all of it, not 128256 / 8
    plan = make_job("llama-3.1-70b", gpus=64, tp=8, pp=4, training={"framework": "torchtitan", "seq_len": 8192,
                                                                     "global_batch_size": 64, "tp_replicated_vocab": True})
    assert choose_slice(plan, 4).job.model.vocab_size == 128256


def test_megatron_plans_run_as_pytorch_native_jobs():
    job, notes = native_job(presets.models()["llama-3.1-8b"], presets.clusters()["dgx-h100"], 8,
                            {"seq_len": 4096}, {"tp": 2, "zero": 1})
    assert str(job.training.framework) == "torchtitan" and int(job.zero) == 2
    assert any("zero 1 runs as FSDP2" in n for n in notes)
    # Megatron's vocabulary padding (vocab_divisible_by, as `planner plan --vocab-divisible-by` writes it)
    # is no field of the native job, whose embedding has the model's 128256 rows: dropped, not refused
    job, notes = native_job(presets.models()["llama-3.1-8b"], presets.clusters()["dgx-h100"], 8,
                            {"framework": "megatron", "vocab_divisible_by": 64}, {"tp": 2})
    assert job.training.vocab_divisible_by is None and job.model.vocab_size == 128256
    assert any("vocab_divisible_by dropped" in n for n in notes)
    # so is Megatron's --grad-reduce-in-bf16 (any switch whose rule holds as planned and breaks natively),
    # said in the rule's words
    job, notes = native_job(presets.models()["llama-3.1-8b"], presets.clusters()["dgx-h100"], 8,
                            {"framework": "megatron", "grad_reduce_in_bf16": True}, {"tp": 2})
    assert not job.training.grad_reduce_in_bf16
    assert any(n.startswith("grad_reduce_in_bf16 dropped: grad_reduce_in_bf16 is Megatron's") for n in notes), notes


def test_layouts_the_worker_lacks_are_refused_with_the_reason():
    moe = "mixtral-8x7b"
    with pytest.raises(SpecError, match="mixture-of-experts layers run with tp 1"):
        native_job(presets.models()[moe], presets.clusters()["dgx-h100"], 8, {"framework": "torchtitan"}, {"tp": 2})
    v3, lite = presets.models()["deepseek-v3"], presets.models()["deepseek-v2-lite"]
    with pytest.raises(SpecError, match="multi-token prediction modules are not implemented in the worker"):
        native_job(v3, presets.clusters()["dgx-h100"], 8, {"framework": "torchtitan"}, {"ep": 8})
    with pytest.raises(SpecError, match="multi-head latent attention runs with tp 1 and cp 1"):
        native_job(lite, presets.clusters()["dgx-h100"], 8, {"framework": "torchtitan"}, {"cp": 2})


def test_run_description_names_the_checkpointed_layers():
    plan = make_job(load_model(TINY), gpus=4, training=TRAINING, pp=2, vpp=2, recompute="full", recompute_layers=1)
    run = run_doc(plan, name="x", steps=2, warmup=1)
    # chunks: rank 0 holds layers [0] and [2], rank 1 [1] and [3]; the first layer of each chunk recomputes
    assert run["stages"] == [[[0], [2]], [[1], [3]]]
    assert sorted(run["recompute"]["full_layers"]) == [0, 1, 2, 3]
    assert run["mesh"] == {"pp": 2, "dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 1, "ep": 1}
    assert run["microbatches"] == plan.num_microbatches and run["dtype"] == "bfloat16"


def test_the_worker_shards_the_units_the_planned_torchtitan_shards(tmp_path):
    """A torchtitan plan's run splits the root as torchtitan v0.2.2 does (the memory model's
    TrainingSpec.splits_fsdp_root): the token embedding a unit of its own, [norm, output] one,
    the root holding neither; a run with the split off, or a tied output layer, keeps them in the root."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule

    def units(job, **model):
        run = run_doc(job, name="x", steps=1, warmup=0)
        stage = worker.Stage(dict(run["model"], **model), run["stages"][0][0], run, first=True, last=True)
        worker.apply_fsdp(stage, init_device_mesh("cpu", (1,)), None, run, torch.float32)
        return run["fsdp_split_root"], [isinstance(m, FSDPModule) for m in (stage.embed, stage.norm, stage.output)]

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        plan = make_job(load_model(TINY), gpus=1, training=TRAINING, zero=3)
        assert units(plan) == (True, [True, True, True])
        old = make_job(load_model(TINY), gpus=1, training=dict(TRAINING, fsdp_split_root=False), zero=3)
        assert units(old) == (False, [False, False, False])
        assert units(plan, tie=True)[1] == [False, False, False]
    finally:
        dist.destroy_process_group()


def test_the_worker_runs_the_optimizer_implementation_of_the_framework():
    """AdamW as torchtitan runs it by default, fused (one kernel per group of tensors), as Megatron's
    and DeepSpeed's FusedAdam do; Composer's DecoupledAdamW one tensor and one op at a time; SGD as
    Megatron (FusedSGD) and DeepSpeed (torch.optim.SGD's default, foreach on CUDA) run it."""
    import torch

    from cost_models.training import TrainingSpec
    from planner.validate.slices import optimizer_implementation

    tiny = load_model(TINY)
    run = run_doc(make_job(tiny, gpus=2, training=TRAINING), name="x", steps=1, warmup=0)
    assert run["optimizer"]["implementation"] == "fused"
    opt = worker.make_optimizer([torch.nn.Parameter(torch.zeros(4))], run["optimizer"])
    assert type(opt) is torch.optim.AdamW and opt.defaults["fused"] is True
    run = run_doc(make_job(tiny, gpus=2, training={**TRAINING, "optimizer": "decoupled_adamw"}), name="x", steps=1, warmup=0)
    opt = worker.make_optimizer([torch.nn.Parameter(torch.zeros(4))], run["optimizer"])
    assert run["optimizer"]["implementation"] == "for-loop" and opt.defaults["foreach"] is False and not opt.defaults["fused"]
    for framework, want in (("megatron", "fused"), ("deepspeed", "fused"), ("torchtitan", "fused")):
        assert optimizer_implementation(TrainingSpec(framework=framework, optimizer="adamw")) == want
    assert optimizer_implementation(TrainingSpec(framework="megatron", optimizer="sgd")) == "fused"
    assert optimizer_implementation(TrainingSpec(framework="deepspeed", optimizer="sgd")) == "foreach"


def test_a_run_on_another_gpu_is_predicted_for_the_gpu_that_ran():
    """The worker records the device's name (torch.cuda.get_device_name); a GPU preset that names it
    takes over the prediction, with a note naming both GPUs; the plan's own GPU, or a CPU run, keeps
    the slice; an unknown GPU keeps the plan's with a note that the times are not comparable."""
    from cost_models.step_time import time_estimate
    from planner.validate.device import match_device
    from planner.validate.slices import Slice

    plan, _ = native_job(presets.models()["megatron-gpt-1.7b"], presets.clusters()["dgx-h100"], 1,
                         {"framework": "torchtitan", "seq_len": 2048}, {"mbs": 4, "recompute": "none"})
    whole = Slice(plan, plan, "full", "", ())
    gpus = presets.gpus()
    h200 = match_device(whole, {"type": "cuda", "name": "NVIDIA H200"}, gpus)
    assert h200.slice.job.cluster.gpu.name == "H200" and h200.slice.plan.cluster.gpu.name == "H100-SXM"
    assert h200.note == "ran on NVIDIA H200 (GPU preset H200), not the plan's H100-SXM: predicted for the H200"
    # the H200's 4.8 TB/s against the H100's 3.35 (presets/gpus.toml) prices the memory-bound optimizer step
    # 3.35/4.8 as long: both at the same fraction of peak bandwidth
    before, after = time_estimate(plan).stages[0].optimizer_s, time_estimate(h200.slice.job).stages[0].optimizer_s
    assert after == pytest.approx(before * 3.35 / 4.8, rel=1e-9)
    for same in ({"type": "cuda", "name": "NVIDIA H100 80GB HBM3"}, {"type": "cpu", "name": None}, None):
        m = match_device(whole, same, gpus)
        assert m.slice is whole and m.note is None, same
    unknown = match_device(whole, {"type": "cuda", "name": "NVIDIA Imaginary 1"}, gpus)
    assert unknown.slice is whole and unknown.note.startswith("ran on NVIDIA Imaginary 1, which no GPU preset names")
    assert unknown.note.endswith("predicted for the plan's H100-SXM: the times are not comparable")


def _ops_in_passes(spec):
    """aten ops of one forward and of its backward of the whole model under selective recompute, by name."""
    import collections

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from planner.validate.slices import model_doc

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    m = model_doc(spec)
    run = {"attention": "flash", "recompute": {"selective": True, "full_layers": []}, "mesh": {"ep": 1}}
    stage = worker.Stage(m, range(m["layers"]), run, first=True, last=True)
    worker.init_parameters(stage, 0)
    worker.apply_recompute(stage, set(), True)
    tokens = torch.randint(0, m["vocab"], (1, 8), generator=torch.Generator().manual_seed(0))
    with Count() as forward:
        loss = stage(tokens).float().square().mean()
    with Count() as backward:
        loss.backward()
    return forward.seen, backward.seen


def test_selective_recompute_reruns_every_second_matmul_and_no_attention():
    """torchtitan's per-op policy in the worker. Without recompute the backward runs two matmuls per
    forward one (data and weight gradients); on top of those, of a SwiGLU layer's 7 matmuls in
    forward order (wq wk wv wo w1 w3 w2) the 2nd, 4th and 6th run again, 3 per layer, and the
    attention kernel does not. An MoE layer reruns wk, wo, the router (forced) and every routed
    expert's 3 matmuls (torchtitan's grouped GEMM is not saved): 2 + 1 + 4 x 3 = 15. A GPT-style
    layer's linears all have biases (addmm, always saved): nothing reruns."""
    from tests.test_validate_parallel import TINY_GPT, TINY_MOE

    flash = "_scaled_dot_product_flash_attention_for_cpu"
    # tiny-moe: layers 1 and 3 of 4 are MoE layers
    for spec, extra in ((TINY_MOE, 2 * 3 + 2 * 15), (TINY_GPT, 0)):
        forward, backward = _ops_in_passes(spec)
        assert backward["mm"] + backward["addmm"] == 2 * (forward["mm"] + forward["addmm"]) + extra, spec.name
        assert backward[flash] == 0 and backward[flash + "_backward"] == forward[flash] == spec.num_layers, spec.name


def test_every_norm_of_a_fresh_model_scales_by_one():
    """After init_parameters every norm is the plain norm of its input: a (1 + w) RMSNorm (Gemma)
    starts at w = 0, not at w = 1 (which would double every normed activation), and a zero-centered
    LayerNorm (Nemotron's LayerNorm1P, run as LayerNorm) at weight 1. Tolerance: fp32 rounding."""
    import torch
    import torch.nn.functional as F

    from planner.validate.slices import model_doc
    from tests.test_validate_parallel import TINY_GEMMA, TINY_NEMOTRON

    run = {"attention": "flash", "recompute": {"selective": False, "full_layers": []}, "mesh": {"ep": 1}}
    x = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(0))
    # Gemma's epsilon is 1e-6 (transformers Gemma2Config rms_norm_eps): the worker's norms take it
    gemma = TINY_GEMMA.model_copy(update={"norm_eps": 1e-6})
    for spec, plain in ((gemma, F.rms_norm), (TINY_NEMOTRON, F.layer_norm)):
        stage = worker.Stage(model_doc(spec), [0], run, first=True, last=True)
        worker.init_parameters(stage, 0)
        norms = {n: mod for n, mod in stage.named_modules() if isinstance(mod, worker.Norm) and mod.weight.shape == (64,)}
        assert len(norms) >= 3, spec.name
        for name, mod in norms.items():
            assert mod.eps == spec.norm_eps, (spec.name, name)  # the model's epsilon, not a default
            assert (mod(x) - plain(x, (64,), eps=mod.eps)).abs().max() <= 1e-6, (spec.name, name)


def test_plan_file_is_read_with_extra_keys(tmp_path):
    doc = {
        "model": {**presets.models()["llama-3.1-8b"].model_dump(mode="json"), "params_total": 8030261248},
        "cluster": "dgx-h100", "gpus": 16,
        "training": {"seq_len": 8192, "framework": "torchtitan", "global_batch_size": 32},
        "layout": {"tp": 8, "pp": 1, "dp": 2, "zero": 3, "sp": True, "emitter": "torchtitan"},
        "prediction": {"time": {"step_s": 1.0}}, "launcher": "slurm",
    }
    (tmp_path / "plan.json").write_text(json.dumps(doc))
    model, cluster, gpus, training, layout = read_plan(tmp_path)
    assert model.name == "llama-3.1-8b" and cluster.name == "dgx-h100" and gpus == 16
    assert layout == {"tp": 8, "pp": 1, "dp": 2, "zero": 3, "sp": True} and training["seq_len"] == 8192
    # planner launch's shape: the specs grouped, the layout with its derived counts
    launch_doc = {"planner": "0.1.0", "framework": "torchtitan", "rank": 1, "files": ["plan.json"],
                  "layout": {**doc["layout"], "num_microbatches": 2, "expert_dp": 2},
                  "specs": {k: doc[k] for k in ("model", "gpus", "training")} | {"cluster": presets.clusters()["dgx-h100"].model_dump(mode="json")}}
    (tmp_path / "plan.json").write_text(json.dumps(launch_doc))
    model, cluster, gpus, training, layout = read_plan(tmp_path)
    assert (model.name, cluster, gpus) == ("llama-3.1-8b", presets.clusters()["dgx-h100"], 16) and layout["tp"] == 8
    del doc["layout"]
    (tmp_path / "plan.json").write_text(json.dumps(doc))
    with pytest.raises(SpecError, match=r"missing key\(s\) \['layout'\]"):
        read_plan(tmp_path)


# --- trace analysis, failure causes, calibration (no processes) ------------------------------------


def test_trace_split_by_hand(tmp_path):
    """Main thread 1; gloo thread 7 serves the tp group, thread 8 the dp group. Step 5 spans
    0-1000 us: operators 0-300 and 400-700, an all-reduce call 300-400 (waiting, not compute), the
    optimizer 800-900. tp's all-reduce runs 250-450: exposed where no compute covers it, 300-400
    (100 us). dp's runs 650-800: exposed 700-800 (100 us). Idle: 900-1000."""
    def ev(name, tid, a, b, cat="cpu_op"):
        return {"name": name, "ph": "X", "tid": tid, "ts": a, "dur": b - a, "cat": cat}

    events = [
        ev("step5", 1, 0, 1000, "user_annotation"), ev("aten::mm", 1, 0, 300), ev("c10d::allreduce_", 1, 300, 400),
        ev("aten::mm", 1, 400, 700), ev("optimizer", 1, 800, 900, "user_annotation"), ev("aten::add_", 1, 800, 900),
        ev("gloo:all_reduce", 7, 250, 450, "user_annotation"), ev("gloo:all_reduce", 8, 650, 800, "user_annotation"),
        {"name": "[memory]", "ph": "i", "tid": 1, "ts": 10, "args": {"Total Allocated": 4096}},
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    out = worker.analyze_trace(str(path), 1, {7: "tp", 8: "dp"}, 5, 6)
    (step,) = out["steps"]
    assert step["step_s"] == pytest.approx(1e-3) and step["compute_s"] == pytest.approx(600e-6)
    assert step["optimizer_s"] == pytest.approx(100e-6) and step["other_s"] == pytest.approx(100e-6)
    assert step["comm"]["tp"] == pytest.approx({"busy_s": 200e-6, "exposed_s": 100e-6})
    assert step["comm"]["dp"] == pytest.approx({"busy_s": 150e-6, "exposed_s": 100e-6})
    assert out["peak_allocated_bytes"] == 4096


def _gpu_trace(tmp_path, events):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return str(path)


def test_gpu_trace_times_come_from_the_device(tmp_path):
    """A kineto trace as torch 2.13 writes it on CUDA: CPU ops on the main thread (tid 1), the
    runtime's launches carrying the kernel's correlation id, kernels on streams 7 (compute) and 20
    (NCCL), pid 0. Step 3 spans 0-1000 us on the CPU. Compute kernels: a GEMM 100-300 (stream 7), a
    flash-attention kernel 250-400 on stream 8 beside it (attention wins the overlap: 250-300),
    elementwise 400-450. The optimizer's CPU region is 500-520 (launches only); its kernels run
    600-650 and 700-760 on the device, so the optimizer is their span, 600-760 = 160 us, not the
    CPU's 20 us. NCCL kernels: the tp group's 300-500 named on the kernel itself (kineto copies
    record_param_comms' group fields onto the kernel it launched), the flattened FSDP group's 800-900
    found through its External id (the record_param_comms op around the launching op), a batched
    send/receive of the cp group 970-990, and one with no group anywhere, 900-950: unattributed,
    not dp. A cp_ring annotation on the CPU (100-900) and a CPU-side c10d::allreduce_ span are not
    communication here."""
    def op(name, a, b, cat="cpu_op", tid=1, **args):
        return {"name": name, "ph": "X", "pid": 1, "tid": tid, "ts": a, "dur": b - a, "cat": cat, "args": args}

    def kernel(name, a, b, stream, corr, **args):
        return {"name": name, "ph": "X", "pid": 0, "tid": stream, "ts": a, "dur": b - a, "cat": "kernel",
                "args": {"correlation": corr, "stream": stream, **args}}

    def launch(t, corr):
        return op("cudaLaunchKernel", t, t + 5, cat="cuda_runtime", correlation=corr)

    events = [
        op("step3", 0, 1000, "user_annotation"), op("cp_ring", 100, 900, "user_annotation"),
        op("aten::mm", 10, 20), launch(12, 1), kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", 100, 300, 7, 1),
        op("aten::_scaled_dot_product_flash_attention", 20, 30), launch(22, 2),
        kernel("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64, 64, 4> >(Flash_fwd_params)", 250, 400, 8, 2),
        op("aten::add", 30, 40), launch(32, 3),
        kernel("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float> >", 400, 450, 7, 3),
        op("c10d::allreduce_", 40, 60), op("record_param_comms", 41, 59, **{"External id": 50, "Process Group Name": "3"}),
        launch(45, 4), kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 300, 500, 20, 4,
                              **{"External id": 50, "Process Group Name": "3", "Process Group Description": "validate_tp"}),
        op("optimizer", 500, 520, "user_annotation"), op("aten::_foreach_add_", 505, 515),
        launch(506, 5), kernel("void at::native::multi_tensor_apply_kernel<TensorListMetadata<4> >", 600, 650, 7, 5),
        launch(510, 6), kernel("void at::native::multi_tensor_apply_kernel<TensorListMetadata<2> >", 700, 760, 7, 6),
        op("record_param_comms", 770, 790, **{"External id": 60, "Process Group Name": "9", "Process Group Description": "mesh_dp_dense",
                                              "Collective name": "_reduce_scatter_base"}),
        op("nccl:_reduce_scatter_base", 772, 788, **{"External id": 61}), launch(775, 7),
        kernel("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 800, 900, 20, 7, **{"External id": 61}),
        launch(795, 8), kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 900, 950, 21, 8),
        # a batch_isend_irecv inside the ring: the send and the receive record the cp group, the
        # batch's SendRecv kernel is launched at its end under nccl:coalesced, which names none
        op("record_param_comms", 960, 962, **{"Process Group Name": "5", "Process Group Description": "validate_cp",
                                              "Collective name": "send"}),
        op("record_param_comms", 963, 965, **{"Process Group Name": "5", "Process Group Description": "validate_cp",
                                              "Collective name": "recv"}),
        op("nccl:coalesced", 966, 970, **{"External id": 70}), launch(967, 9),
        kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 970, 990, 21, 9, **{"External id": 70}),
    ]
    out = worker.analyze_trace(_gpu_trace(tmp_path, events), 1, {}, 3, 4)
    (step,) = out["steps"]
    assert out["device_times"]
    assert step["optimizer_s"] == pytest.approx(160e-6)
    # compute: 100-450 less nothing = 350 us; attention 250-400 (150), GEMM 100-250 (150), elementwise 400-450
    assert step["compute_s"] == pytest.approx(350e-6)
    assert step["classes"] == pytest.approx({"gemm_s": 150e-6, "attention_s": 150e-6, "elementwise_s": 50e-6})
    # tp 300-500: covered by compute up to 450, exposed 450-500; dp 800-900 all exposed; cp none
    assert step["comm"]["tp"] == pytest.approx({"busy_s": 200e-6, "exposed_s": 50e-6})
    assert step["comm"]["dp"] == pytest.approx({"busy_s": 100e-6, "exposed_s": 100e-6})
    assert step["comm"]["unattributed"] == pytest.approx({"busy_s": 50e-6, "exposed_s": 50e-6})
    assert step["comm"]["cp"] == pytest.approx({"busy_s": 20e-6, "exposed_s": 20e-6}) and step["comm"]["pp"]["busy_s"] == 0
    assert out["unattributed_kernels"] == {"ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)": 1}
    # 1000 us = 350 compute + 160 optimizer + 50 + 100 + 50 + 20 exposed + 270 idle
    assert step["other_s"] == pytest.approx(270e-6)
    # the group's name alone (no description) finds its kind through the worker's name map
    for e in events:
        e["args"].pop("Process Group Description", None)
    (step,) = worker.analyze_trace(_gpu_trace(tmp_path, events), 1, {}, 3, 4, group_kind={"3": "tp", "9": "dp"})["steps"]
    assert step["comm"]["tp"]["busy_s"] == pytest.approx(200e-6) and step["comm"]["dp"]["busy_s"] == pytest.approx(100e-6)


# Kernel names as they appear in real profiler traces: Holistic Trace Analysis' test traces
# (facebookresearch/HolisticTraceAnalysis@f4d0062c, tests/data/: trace_diff/control/control.json.gz,
# nccl_parser_config/nccl_data.json.gz, ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz,
# critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz, trace_file_list/inference_rank_1.json.gz,
# negative_queue_length_values_check/rank0.json.gz); PyTorch's attention kernels from their source
# (pytorch/pytorch@04ff5beb aten/src/ATen/native/transformers/cuda/flash_attn/flash_fwd_launch_template.h:
# pytorch_flash::flash_fwd_kernel<Kernel_traits, ...>; pytorch/pytorch@24866316 .../mem_eff_attention/kernels/
# cutlassF_bf16_aligned.cu: fmha_cutlassF_bf16_aligned_64x64_rf_sm80); NCCL's generated device kernels
# (NVIDIA/nccl@081eafaf src/device/generate.py: "ncclDevKernel" + coll, redop, type, algo, proto
# joined by "_", ncclDevKernel_SendRecv for point-to-point); CPU operator names from the traces this
# worker writes on CPU (torch 2.13).
REAL_NAMES = {
    "gemm": [
        "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4::Params)",
        "void cutlass::Kernel<cutlass_70_wmma_tensorop_f16_s161616gemm_f16_32x32_64x2_tn_align8>(cutlass_70_wmma_tensorop_f16_s161616gemm_f16_32x32_64x2_tn_align8::Params)",
        "volta_sgemm_64x64_nt", "ampere_sgemm_32x32_sliced1x4_tn",
        "void splitKreduce_kernel<32, 16, int, float, float, float, float, true, false, false>(cublasSplitKParams<float>, float const*, float const*, float*, float const*, float const*, float const*, float const*, float*, void*, long, float*, int*)",
        "aten::mm", "aten::addmm", "aten::bmm", "aten::linear",
    ],
    "attention": [
        "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, true, false, false, false, true, true, false>(Flash_fwd_params)",
        "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t, cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)",
        "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
    ],
    "comm": [
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
        "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
        "ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
        "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        "void ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
    ],
    "elementwise": [
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)",
        "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> > >(at::TensorIteratorBase&, at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> > const&)::{lambda(int)#1}>(int, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> > >(at::TensorIteratorBase&, at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> > const&)::{lambda(int)#1})",
        "Memcpy DtoD (Device -> Device)", "aten::rms_norm", "aten::silu", "aten::mul", "aten::_softmax",
    ],
}


@pytest.mark.parametrize("cls", list(REAL_NAMES))
def test_kernel_names_fall_in_their_class(cls):
    assert [worker.kernel_class(n) for n in REAL_NAMES[cls]] == [cls] * len(REAL_NAMES[cls])


@pytest.mark.parametrize("layout", [{"tp": 2}, {"pp": 2, "recompute": "full"}, {"zero": 3, "recompute": "selective"},
                                    {"pp": 2, "vpp": 2, "recompute": "full", "recompute_layers": 1}, {"tp": 2, "cp": 2}])
@pytest.mark.parametrize("framework", ["megatron", "torchtitan"])
def test_compute_by_kernel_accounts_for_every_compute_part(layout, framework):
    """compute_by_kernel counts the critical stage's kernels layer by layer, apart from stage_time:
    both must reach the same compute (to rounding), so no term is lost or counted twice when the
    report splits it by class."""
    from cost_models.step_time import compute_by_kernel

    job = make_job("llama-3.1-8b", gpus=8, training={"framework": framework, "seq_len": 4096, "global_batch_size": 32}, **layout)
    t = time_estimate(job)
    split = compute_by_kernel(t)
    assert split.total == pytest.approx(float(t.breakdown.value("compute")), rel=1e-12)
    assert min(split.value(k) for k in ("gemm", "attention", "elementwise")) > 0


def test_failure_cause_names_the_rank_that_ran_out_of_memory(tmp_path):
    (tmp_path / "error_rank0.json").write_text(json.dumps(
        {"rank": 0, "run": "validate", "step": 1, "type": "RuntimeError", "t": 2.0,
         "message": "[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:4321"}))
    (tmp_path / "error_rank3.json").write_text(json.dumps(
        {"rank": 3, "run": "validate", "step": 1, "type": "OutOfMemoryError", "t": 3.0, "oom": True,
         "message": "CUDA out of memory.", "needed_bytes": 2 * 2**30, "available_bytes": 3 * 2**29}))
    cause = failure_cause(tmp_path, 4, stalled=False, timed_out_s=None, returncode=1)
    assert cause == "OOM on rank 3 at step 1 of run validate: needed 2.0 GiB, had 1.5 GiB free"


def test_calibration_fit_reproduces_the_fitted_steps_and_loads(tmp_path):
    job = make_job(load_model(TINY), gpus=2, training=TRAINING, tp=2)
    steps = [{"compute_s": 0.05, "optimizer_s": 0.004} for _ in range(4)]
    f = fit(job, steps, [0.08] * 4, DEFAULT, what="a test")
    t = time_estimate(job, calibration=f.calibration)
    assert float(t.breakdown.value("compute")) == pytest.approx(0.05, rel=1e-6)
    assert float(t.breakdown.value("optimizer")) == pytest.approx(0.004, rel=1e-9)
    assert abs(f.after["compute_s"]) < 1e-6 < abs(f.before["compute_s"])
    write(f.calibration, tmp_path / "cal.json")
    assert load_calibration(tmp_path / "cal.json").to_json() == {**f.calibration.to_json(), "source": f.calibration.source}


# --- real runs (gloo, CPU) -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def validated(tmp_path_factory):
    out = tmp_path_factory.mktemp("validate")
    report = run_validate(
        TINY, cluster="dgx-h100", gpus=2, training=TRAINING, layout={"zero": 3}, out_dir=out / "job",
        options=Options(steps=4, warmup=1, backend="gloo", fp32=True, step_timeout_s=60, timeout_s=240,
                        calibrate=out / "cal.json"),
    )
    assert report.ok, report.launch.cause
    return out, report


def test_validate_measures_every_term(validated):
    out, report = validated
    doc = json.loads((out / "job" / "validate.json").read_text())
    assert doc["status"] == "ok" and doc["slice"]["kind"] == "full" and doc["run"]["dtype"] == "float32"
    terms = {r["term"]: r for r in doc["comparison"]}
    assert {"step time", "compute", "dp exposed", "optimizer", "tokens/s/GPU", "MFU", "memory weights"} <= set(terms)
    split = doc["measured"]["split"]
    assert split["comm"]["dp"]["busy_s"] > 0 and split["comm"]["tp"]["busy_s"] == 0  # FSDP over 2 ranks, no tp
    # each step's split is a partition of that profiled step: compute + optimizer + exposed comm + idle
    # (per step, since the medians of the parts need not add up to the median step)
    for one in doc["measured"]["split_steps"]:
        parts = one["compute_s"] + one["optimizer_s"] + one["other_s"] + sum(c["exposed_s"] for c in one["comm"].values())
        assert parts == pytest.approx(one["step_s"], rel=1e-6)
        assert sum(one["classes"].values()) == pytest.approx(one["compute_s"], rel=1e-6)  # the classes partition compute
        # the tiny model runs its linear layers (GEMM) and SDPA (attention) in every step
        assert one["classes"]["gemm_s"] > 0 and one["classes"]["attention_s"] > 0 and one["classes"]["elementwise_s"] > 0
    # kernel classes one to one with the cost model's terms for the same kernels
    from cost_models.step_time import compute_by_kernel

    pred = compute_by_kernel(report.prediction.time)
    for key, term in (("gemm", "compute: GEMM"), ("attention", "compute: attention"), ("elementwise", "compute: elementwise (memory-bound)")):
        assert terms[term]["predicted"] == pytest.approx(float(pred.value(key)))
        assert terms[term]["measured"] == pytest.approx(split["classes"][f"{key}_s"])
    assert split["comm"]["unattributed"]["busy_s"] == 0  # gloo: every collective's thread is known
    for part in ("weights", "gradients", "optimizer_states"):
        assert terms[f"memory {part}"]["error"] == 0.0
    assert doc["states_exact"] == {"ok": True, "mismatches": []}
    # the optimizer torchtitan runs by default, recorded from the optimizer the worker built
    assert doc["measured"]["optimizer"] == {"class": "AdamW", "implementation": "fused", "fused": True, "foreach": None}
    for rank in (0, 1):  # the job, its worker and a Chrome trace per rank stay for the user
        assert "traceEvents" in json.loads((out / "job" / "validate" / f"trace_rank{rank}.json").read_text())
    assert (out / "job" / "worker.py").read_text() == Path(worker.__file__).read_text()
    assert json.loads((out / "job" / "job.json").read_text())["runs"][0]["mesh"]["dp_shard"] == 2


def test_validate_table_has_predicted_measured_and_error(validated):
    from rich.console import Console

    _, report = validated
    console = Console(record=True, width=160)
    render(report, console)
    text = console.export_text()
    assert "Predicted vs measured" in text and "step time" in text and "dp exposed" in text
    assert "compute: GEMM" in text and "compute: attention" in text and "compute: elementwise (memory-bound)" in text
    assert "equal the memory model on all 2 ranks" in text and "held-out steps" in text


def test_calibration_lowers_the_held_out_error_and_feeds_estimate(validated):
    out, report = validated
    f = report.fit
    assert f.fit_steps == 2 and f.held_out_steps == 2
    assert abs(f.after["compute_s"]) < abs(f.before["compute_s"])
    assert abs(f.after["step_s"]) < abs(f.before["step_s"])
    est = runner.invoke(app, ["estimate", TINY, *TINY_FLAGS, "--zero", "3", "--calibration", str(out / "cal.json"), "--json"])
    assert est.exit_code == 0, est.output
    doc = json.loads(est.stdout)
    assert doc["time"]["calibration"]["gemm_scale"]["hopper"] == pytest.approx(f.calibration.gemm_scale["hopper"])
    assert doc["time"]["step_s"] > time_estimate(report.slice.job).step_s  # CPU-fitted constants: slower


def _no_comm() -> dict:
    """A step's communication split as the worker writes it, every kind (worker.KIND_ORDER) at zero."""
    return {k: {"busy_s": 0.0, "exposed_s": 0.0} for k in worker.KIND_ORDER}


def _validate_one_fake_rank(out_dir: Path, monkeypatch: pytest.MonkeyPatch, *, step: dict, device: dict,
                            **result: object) -> ValidateReport:
    """run_validate of TINY on one rank of a dgx-h100, the launch replaced by that rank's result: one
    step timed with the profiler (0.2 s), `step` its split (no communication), `device` the worker's
    device_info; `result` adds to the result or replaces its keys."""
    from planner.validate import command
    from planner.validate.runner import LaunchResult

    rank = {"rank": 0, "coord": {"pp": 0, "dp_replicate": 0, "dp_shard": 0, "cp": 0, "tp": 0}, "stage_ids": [0],
            "step_times_s": [0.2], "losses": [4.8], "state_bytes": {"weights": 0, "gradients": 0, "optimizer_states": 0},
            "peak_memory": {}, "split": {"steps": [{**step, "comm": _no_comm()}]}, "trace": None, "check": {},
            "linear_dtypes": {}, "optimizer": {"class": "AdamW", "implementation": "fused", "fused": True, "foreach": None},
            "device": device, **result}
    monkeypatch.setattr(command, "launch", lambda *a, **k: LaunchResult(
        ok=True, cause=None, returncode=0, wall_s=1.0, launch_id="fake", command=[], results={command.RUN_NAME: [rank]}))
    return run_validate(TINY, cluster="dgx-h100", gpus=1, training=TRAINING, layout={}, out_dir=out_dir,
                        options=Options(steps=1, warmup=0, backend="gloo", nproc=1))


def test_validate_predicts_for_the_gpu_the_worker_reports(tmp_path, monkeypatch):
    """Through run_validate, with the launch replaced by one rank's result whose device is an H200
    (the worker's device_info on such a GPU): the prediction, the note and validate.json name the
    H200, while the plan stays the H100-SXM it was planned on."""
    step = {"step_s": 0.2, "compute_s": 0.15, "optimizer_s": 0.03, "other_s": 0.02,
            "classes": {"gemm_s": 0.1, "attention_s": 0.02, "elementwise_s": 0.03}}
    device = {"type": "cuda", "name": "NVIDIA H200", "total_memory_bytes": 150109880320, "sm_count": 132}
    report = _validate_one_fake_rank(tmp_path / "v", monkeypatch, step=step, device=device)
    assert report.slice.plan.cluster.gpu.name == "H100-SXM" and report.slice.job.cluster.gpu.name == "H200"
    assert report.notes[-1] == "ran on NVIDIA H200 (GPU preset H200), not the plan's H100-SXM: predicted for the H200"
    assert report.prediction.time.step_s == pytest.approx(time_estimate(report.slice.job).step_s)
    doc = json.loads((tmp_path / "v" / "validate.json").read_text())
    assert doc["run"]["gpu"] == {"planned": "H100-SXM", "predicted_for": "H200", "ran_on": "NVIDIA H200"}
    assert doc["measured"]["device"]["name"] == "NVIDIA H200"
    assert next(r for r in doc["comparison"] if r["term"] == "MFU")["note"].startswith("of H200's")


def test_validate_times_the_step_without_the_profiler_on_a_gpu(tmp_path, monkeypatch):
    """A GPU rank's result with one step timed without the profiler (150 ms) and one with it (200 ms,
    of which 120 ms kernels and 80 ms idle): the step-time row reads 150 ms and the idle row 150 - 120
    = 30 ms, since the profiler slows the host, not the kernels; validate.json says the profiler was
    off for the step and keeps the profiled median."""
    step = {"step_s": 0.2, "compute_s": 0.1, "optimizer_s": 0.02, "other_s": 0.08,
            "classes": {"gemm_s": 0.06, "attention_s": 0.02, "elementwise_s": 0.02}}
    device = {"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "total_memory_bytes": 85520809984, "sm_count": 132}
    _validate_one_fake_rank(tmp_path / "v", monkeypatch, step=step, device=device,
                            unprofiled_step_times_s=[0.15], losses=[4.8, 4.7])
    doc = json.loads((tmp_path / "v" / "validate.json").read_text())
    rows = {r["term"]: r for r in doc["comparison"]}
    assert rows["step time"]["measured"] == pytest.approx(0.15) and "without the profiler (200.0 ms with it" in rows["step time"]["note"]
    assert rows["bubble / idle"]["measured"] == pytest.approx(0.03)
    assert doc["measured"]["step_s"]["profiler"] == "off" and doc["measured"]["profiled_step_s"]["median"] == pytest.approx(0.2)
    # read back (benchmarks/gpu_validate.py predicts stored reports again), the same measurements
    from planner.validate.compare import Measured

    back = Measured.from_json(doc["measured"])
    assert back.unprofiled and back.step_s == pytest.approx(0.15) and back.idle_s == pytest.approx(0.03)


def _alive_with_marker(launch_id: str) -> list[int]:
    return find_processes(launch_id)


def test_a_rank_that_raises_fails_validate_in_one_line(tmp_path, monkeypatch):
    """Through the CLI, from a plan directory: exit 1, one line naming the rank and step, the
    partial measurements kept, no process left."""
    doc = {"model": str(DATA / "tiny-llama.toml"), "cluster": "dgx-h100", "gpus": 2,
           "training": TRAINING, "layout": {"zero": 3}, "prediction": {}}
    (tmp_path / "plan.json").write_text(json.dumps(doc))
    monkeypatch.setenv("PLANNER_VALIDATE_FAULT", json.dumps({"rank": 1, "step": 1, "mode": "raise"}))
    result = runner.invoke(app, ["validate", str(tmp_path), "--backend", "gloo", "--fp32", "--steps", "2", "--warmup", "1",
                                 "--step-timeout", "30", "--out", str(tmp_path / "out")])
    assert result.exit_code == 1
    line = result.stderr.strip()
    assert "\n" not in line and line.startswith("error: rank 1 failed at step 1 of run validate: RuntimeError: injected failure")
    out = json.loads((tmp_path / "out" / "validate.json").read_text())
    assert out["status"] == "failed" and out["cause"] in line
    assert len(out["partial"]["step_times_s_per_rank"][0]) >= 1  # step 0 finished before the failure
    assert out["run"]["killed_after_teardown"] == []
    # no process of this run is left (other validate runs on the machine carry the marker too)
    assert _markers_in((tmp_path / "out").resolve()) == []


def _marker_in(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return b"PLANNER_VALIDATE_ID=" in f.read()
    except OSError:
        return False


def test_a_hung_rank_is_torn_down_within_the_step_timeout(tmp_path):
    report = run_validate(
        TINY, cluster="dgx-h100", gpus=2, training=TRAINING, layout={"zero": 3}, out_dir=tmp_path,
        options=Options(steps=2, warmup=1, backend="gloo", fp32=True, step_timeout_s=3, timeout_s=120,
                        debug={"rank": 1, "step": 1, "mode": "hang"}),
    )
    assert not report.ok
    assert report.launch.cause.startswith("rank 1 hung at step 1 of run validate (worker.py:")
    assert "rank(s) 0 waited for it in a collective" in report.launch.cause
    assert report.launch.wall_s < 60
    assert _alive_with_marker(report.launch.launch_id) == []


@pytest.mark.parametrize("args, message", [
    ([TINY], "give a PLAN_DIR holding plan.json, or MODEL with --cluster and --gpus"),
    ([TINY, *TINY_FLAGS, "--steps", "0"], "--steps(0) must be at least 1"),
    ([TINY, *TINY_FLAGS, "--backend", "nccl"], "--backend nccl needs CUDA GPUs"),
    (["mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "8", "--framework", "torchtitan", "--tp", "2"],
     "validate cannot run this layout yet: mixture-of-experts layers run with tp 1"),
    ([TINY, "--cluster", "dgx-h100", "--gpus", "8", "--tp", "8"], "num_attention_heads(4) is not divisible by tp(8)"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, args, message):
    result = runner.invoke(app, ["validate", *args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and result.stderr.strip().count("\n") == 0


# --- a batch system's signals and ranks that die without a word --------------------------------------


def _markers_in(directory: Path) -> list[int]:
    """Live processes of a validate run in `directory` (its marker, its working directory)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _marker_in(int(entry)):
            try:
                if Path(os.readlink(f"/proc/{entry}/cwd")) == directory:
                    found.append(int(entry))
            except OSError:
                continue
    return found


def test_sigterm_tears_down_torchrun_and_every_rank(tmp_path):
    """What scancel and a job time limit send: validate stops torchrun and every rank within
    TEARDOWN_LIMIT_S, exits 128 + 15 with one line, leaves no process. (SIGINT takes the same
    handler, runner._stop_on_signals; one run keeps the test's time down.)"""
    sig = signal.SIGTERM
    out = tmp_path / "out"
    env = {**os.environ, "PLANNER_VALIDATE_FAULT": json.dumps({"rank": 0, "step": 1, "mode": "hang"})}
    proc = subprocess.Popen([sys.executable, "-m", "planner.cli", "validate", TINY, *TINY_FLAGS, "--backend", "gloo", "--fp32",
                             "--steps", "2", "--warmup", "0", "--nproc-per-node", "1", "--step-timeout", "120", "--out", str(out)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # until rank 0 hangs in step 1
            rows = [json.loads(ln) for ln in (out / "progress_rank0.jsonl").read_text().splitlines()] \
                if (out / "progress_rank0.jsonl").exists() else []
            if any(r.get("step") == 1 and r.get("phase") == "start" for r in rows):
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        assert _markers_in(out), "the job is running"
        sent = time.monotonic()
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=TEARDOWN_LIMIT_S + 10)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, stderr
    assert took < TEARDOWN_LIMIT_S + 3  # + the interpreter's exit
    line = stderr.decode().strip()
    assert "\n" not in line and line.startswith(f"error: stopped by {signal.Signals(sig).name} after 1 of 2 steps")
    assert json.loads((out / "validate.json").read_text())["status"] == "failed"
    assert _markers_in(out) == []


TORCHRUN_ROOT_CAUSE = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
=====================================================
worker.py FAILED
-----------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
-----------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-23_16:52:49
  host      : localhost
  rank      : {rank} (local_rank: {rank})
  exitcode  : {code} (pid: 6015)
  error_file: <N/A>
  traceback : {traceback}
=====================================================
"""


def _died(tmp_path, *, rank, code, traceback, before="", progress=(), errors=()):
    # the block torchrun 2.13 prints when a rank exits without an error file (from a real run: a
    # rank SIGKILLed in step 1)
    (tmp_path / "launch.log").write_text(before + TORCHRUN_ROOT_CAUSE.format(rank=rank, code=code, traceback=traceback))
    (tmp_path / f"progress_rank{rank}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in progress))
    for e in errors:
        (tmp_path / f"error_rank{e['rank']}.json").write_text(json.dumps(e))
    return failure_cause(tmp_path, 2, stalled=False, timed_out_s=None, returncode=1)


def test_a_killed_rank_is_named_with_its_step_and_signal(tmp_path):
    cause = _died(tmp_path, rank=0, code=-9, traceback="Signal 9 (SIGKILL) received by PID 6015",
                  progress=[{"phase": "setup"}, {"run": "validate", "step": 0, "phase": "start"},
                            {"run": "validate", "step": 0, "phase": "end"}, {"run": "validate", "step": 1, "phase": "start"}])
    assert cause == "rank 0 died in step 1 of run validate: killed by SIGKILL (exit code -9: the kernel OOM killer or a kill -9)"


def test_a_rank_dying_in_setup_is_named_with_its_error(tmp_path):
    cause = _died(tmp_path, rank=1, code=1, traceback="<N/A>", progress=[{"phase": "setup"}],
                  before="Traceback (most recent call last):\n  File \"worker.py\", line 3\nModuleNotFoundError: No module named 'torchao'\n")
    assert cause == "rank 1 died during setup: exited with code 1: ModuleNotFoundError: No module named 'torchao'"


def test_the_rank_that_died_first_is_named_not_its_waiting_peer(tmp_path):
    peer = {"rank": 0, "run": "validate", "step": 2, "type": "DistBackendError", "message": "Connection closed by peer", "t": 5.0}
    cause = _died(tmp_path, rank=1, code=-9, traceback="Signal 9 (SIGKILL)", errors=[peer],
                  progress=[{"run": "validate", "step": 2, "phase": "start"}])
    assert cause.startswith("rank 1 died in step 2 of run validate: killed by SIGKILL") and cause.endswith("the others failed waiting for it")


def test_ring_attention_never_forms_the_score_matrix():
    """The ring runs the flash kernel per step: no tensor of s x s scores appears in forward or
    backward (the explicit-scores ring built (b, h, s, s) at every step), and its output and
    gradients are causal attention's. One rank (a gloo group of one), so the ring has one step:
    the causal diagonal block. Tolerances: fp32 flash against SDPA's math kernel, observed <= 1e-6."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    s = 256
    shapes = []

    class Shapes(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    shapes.append((str(func), tuple(t.shape)))
            return out

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, s, 16, generator=gen, requires_grad=True) for _ in range(3))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with Shapes():
            out = worker.ring_attention(q, k, v, dist.group.WORLD, 0.25)
            out.square().sum().backward()
    finally:
        dist.destroy_process_group()
    assert shapes and not [x for x in shapes if len(x[1]) >= 2 and x[1][-2:] == (s, s)], shapes
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        want = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.25)
        want.square().sum().backward()
    assert (out - want).abs().max() <= 1e-5
    for g, t in zip(grads, (q, k, v)):
        assert (g - t.grad).abs().max() <= 1e-5 * t.grad.abs().max()


def test_ring_transfers_are_cp_and_pipeline_transfers_pp(tmp_path):
    """An asynchronous send issued inside a cp_ring span (300-310) runs on to 600 while attention
    computes: it is cp's busy time, 300-600 minus nothing = 300 us, exposed only where no compute
    covers it (none: compute 0-1000 less the ring's own spans). A send issued outside (700) is the
    pipeline's: 700-800, 100 us."""
    def ev(name, a, b, cat="cpu_op"):
        return {"name": name, "ph": "X", "tid": 1, "ts": a, "dur": b - a, "cat": cat}

    events = [ev("step0", 0, 1000, "user_annotation"), ev("aten::mm", 0, 1000), ev("cp_ring", 300, 310, "user_annotation"),
              ev("gloo:send", 301, 600), ev("gloo:send", 700, 800)]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    (step,) = worker.analyze_trace(str(path), 1, {}, 0, 1)["steps"]
    assert step["comm"]["cp"]["busy_s"] == pytest.approx(300e-6)
    assert step["comm"]["pp"]["busy_s"] == pytest.approx(100e-6)


def test_a_host_bound_step_is_named():
    """Idle beyond the predicted bubble by more than a tenth of the step gets a note: 30 ms idle of a
    150 ms step (the unprofiled step less 120 ms of the profiled steps' kernels) with no bubble
    predicted; with 20 ms of bubble predicted the 10 ms left is under the 15 ms share, and no note."""
    from planner.validate.command import host_bound_note
    from planner.validate.compare import Measured

    split = {"step_s": 0.2, "compute_s": 0.1, "optimizer_s": 0.02, "other_s": 0.08, "comm": _no_comm()}
    m = Measured(steps_s=[0.15], critical_rank=0, split=split, split_steps=[split], state_bytes={}, stage_of_rank={0: 0},
                 peak={}, world=1, optimizer={}, device={}, profiled_steps_s=[0.2])
    assert m.idle_s == pytest.approx(0.03)
    assert host_bound_note(m, 0.0).startswith("the GPU stood idle 30 ms of each 150 ms step beyond the predicted bubble (0 ms)")
    assert host_bound_note(m, 0.02) is None
