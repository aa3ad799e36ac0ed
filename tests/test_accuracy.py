"""Regression guards for the accuracy benchmarks.

Memory (benchmarks/memory_accuracy.py): torchtitan's median |error| and its largest within today's figures plus
half a point; Zero Bubble's and Vocabulary Parallelism's rows all within 10%. The fragmentation fraction is
the all-source fit the benchmark prints, and each source predicted with the fraction fitted on the others
stays within today's figures.

Step time (benchmarks/time_accuracy.py), out of sample: each source predicted with the mechanism
constants fitted on the other sources. The bounds are today's figures (docs/accuracy.md) plus one
percentage point, so a change that makes the model transfer worse fails here; DEFAULT must be the
all-source fit the benchmark prints."""

from __future__ import annotations

import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))

import memory_accuracy  # noqa: E402
import pytest  # noqa: E402
import time_accuracy  # noqa: E402

from cost_models.calibration import DEFAULT, MECHANISMS  # noqa: E402
from cost_models.enums import Precision  # noqa: E402
from cost_models.units import GiB  # noqa: E402


def test_published_torchtitan_memory():
    # with torch's ring attention backward under cp, the interleaved pipeline's fp32 gradients made
    # chunk by chunk and, under a pipeline, the sharded gradients cached on FSDP2's reduce-scatter
    # stream (which took the 405B 1F1B row from -11.7% to -8%, and the pipelined rows' median up):
    # median 4.4%, every row within 10% (the largest 9.7%, at the fragmentation fraction 0.10 the MoE
    # recompute moment of the DeepSeek-V3 rows refitted it to); the bounds are those plus half a point
    rows = memory_accuracy.rows("torchtitan")
    assert len(rows) == 20
    errors = [abs(r.error) for r in rows]
    assert statistics.median(errors) <= 0.049
    assert max(errors) <= 0.102, [(r.id, round(r.error, 3)) for r in rows]


@pytest.mark.parametrize(("group", "count", "median"), [("zerobubble", 31, 0.01), ("vocabpar", 24, 0.025)])
def test_published_megatron_fp16_memory(group, count, median):
    # Zero Bubble and Vocabulary Parallelism (Megatron forks, fp16): every row within 10%, today's
    # median (0.5% and 1.8%, docs/accuracy.md) plus half a point
    rows = memory_accuracy.rows(group)
    assert len(rows) == count
    errors = [abs(r.error) for r in rows]
    assert statistics.median(errors) <= median
    assert max(errors) <= 0.10, [(r.id, round(r.error, 3)) for r in rows]


def test_published_nanotron_memory():
    # nanotron's sweep, rank 0 with its bf16 gradients kept through each backward, DDP's buckets at
    # ZeRO-0, its loss's fp32 copy, eager SwiGLU, the [q|k|v] copy its attention keeps and its TP
    # gather buffers and the reduce-scatter inputs held while the host runs ahead: today's median
    # |error| (4.8%) plus half a point, and today's 22 of 26 rows within 10% (the 3.57B on 64 nodes
    # at dp 128, tp 4 went from +10.4% to +9.8% with the fragmentation fraction 0.10)
    rows = memory_accuracy.rows("nanotron_ultrascale")
    assert len(rows) == 26
    assert statistics.median(abs(r.error) for r in rows) <= 0.053
    assert sum(abs(r.error) <= 0.10 for r in rows) >= 22, [(r.id, round(r.error, 3)) for r in rows]


def _nanotron_step_allocated_bound(job) -> int:  # type: ignore[no-untyped-def]
    """The most torch.cuda.max_memory_allocated can read on nanotron's rank 0 once log_memory has
    reset the peaks after the forward-backward (huggingface/nanotron@c2528430 src/nanotron/
    trainer.py:497-498, logging.py:250-259): the model states, and what the gradient sync and the
    optimizer step add. ZeRO-1 all-gathers the updated bf16 parameters through
    dist.all_gather_coalesced, which flattens its input shard (P/dp elements) and the dp output
    shards (P) into new tensors (optim/zero.py:217-251, distributed.py:195-206), and
    ProcessGroupNCCL::allgather flattens that output list once more (P) before the NCCL call
    (pytorch/pytorch@0007e752 torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, allgather's
    same-size branch, flatten_for_scatter_gather). Beside them torch DDP's bf16 buckets at ZeRO-0 and
    the persistent tp gather buffers; the fp32 gradients are all-reduced in place
    (optim/gradient_accumulator.py:154-155), the clipping keeps one fp32 norm per parameter
    (optim/clip_grads.py:63-69), and reduce-scatter inputs freed ahead of the GPU are reserved, not
    allocated (cost_models.memory.pending_scatter_bytes)."""
    from cost_models.enums import Zero
    from cost_models.memory import rank_state_bytes, tp_gather_buffer_bytes
    from cost_models.states import rank_params

    params = int(rank_params(job, 0).total)
    gather = 2 * params * (2 + 1 / job.dp) if job.zero is Zero.OPTIMIZER and job.dp > 1 else 0
    ddp = 2 * params if job.training.ddp_buckets else 0
    return int(rank_state_bytes(job, 0).total + gather + ddp + tp_gather_buffer_bytes(job))


def test_published_torchtitan_deepseek_v3_memory():
    # torchtitan's DeepSeek-V3 PR rows, the project's only measured MoE memory, each on the rank that
    # logged it: PR 1616's LOG_RANK 6 is pipeline rank 3 of its [pp 4, dp_shard 2] mesh, the others rank 0
    # (pipeline rank 0). With the pre-c4e229115 selective checkpointing (PR 1610) and the sharded
    # gradients cached on FSDP2's reduce-scatter stream (PRs 1616, 2107), torchtitan's fp32 scored
    # token copies and the routed copies MoE.forward holds when a checkpointed layer re-runs it
    # (activations.moe_combine_bytes: PR 2107 -10.4% to -8.7% and -4.9% to -3.2%, PR 1610 -3.5% to
    # -2.2%; PR 1504's peak is its loss, -7.9% to -8.4% with the fragmentation fraction 0.10). PR 2107's
    # DeepEP row runs MoEDispatch.DEEPEP: DeepEP's combine holds no routed copies, its buffers lie outside
    # the counter (-3.2% to -5.5%; the model puts it 1.3 GiB under the all-to-all row, the logs 3.4 GiB).
    # Today's errors, each bound today's |error| plus half a point
    today = {"tt-pr1504-dsv3-16b-8gpu-fsdp4-cp2": -0.084, "tt-pr1610-dsv3-16b-8gpu-ep8-sdpa": -0.022,
             "tt-pr1610-dsv3-16b-8gpu-ep8-flex": -0.022, "tt-pr1616-dsv3-16b-8gpu-pp4-dp2": -0.098,
             "tt-pr2107-dsv3-671b-512gpu-deepep": -0.055, "tt-pr2107-dsv3-671b-512gpu-a2a-baseline": -0.087}
    rows = {r.id: r for g in ("tt_pr1504", "tt_pr1610", "tt_pr1616", "tt_pr2107") for r in memory_accuracy.rows(g)}
    assert sorted(rows) == sorted(today)
    for i, error in today.items():
        assert abs(rows[i].error) <= abs(error) + 0.005, (i, round(rows[i].error, 4))
        assert rows[i].peak_rank == (3 if "pr1616" in i else 0), i


def test_a_given_global_rank_is_compared_on_its_pipeline_rank():
    # torchtitan's mesh is [pp, dp_replicate, dp_shard, cp, tp] in row-major order: on 8 GPUs at pp 4
    # global ranks 2r and 2r + 1 are pipeline rank r, so rank 6 is pipeline rank 3 and rank 5 is 2; a
    # Case compares that stage even where another is larger
    how = memory_accuracy.Measure(memory_accuracy.Metric.RESERVED, memory_accuracy.Ranks.GIVEN, "", rank=6)
    assert how.pipeline_rank(8, 4) == 3 and how.compared == "global rank 6"
    assert memory_accuracy.Measure(memory_accuracy.Metric.RESERVED, memory_accuracy.Ranks.GIVEN, "", rank=5).pipeline_rank(8, 4) == 2
    assert memory_accuracy.Measure(memory_accuracy.Metric.RESERVED, memory_accuracy.Ranks.MAX, "").pipeline_rank(8, 4) is None
    case = memory_accuracy.Case("x", "x", 10.0, 1, ((12 * GiB, 0), (10 * GiB, 0)))
    assert case.predicted_gib(0.1) == 10.0


def test_nanotron_figure_is_the_reserved_counter():
    # The bench CSV has both 'Mem Alloc' and 'Mem Res' (helpers.py:609-610); after log_memory's reset
    # the allocated one sees only the step, at most rank 0's states and the step's buffers, which is
    # below the figure on every row: the figure can only be the reserved counter.
    # By hand, 80B at tp 4, pp 32, dp 1 (ZeRO-0, no DDP): rank 0 holds the embedding shard
    # 131072·8192/4 = 268,435,456 and 3 decoder layers of (4·8192² + 3·8192·28672)/4 = 243,269,632
    # plus two 8192-wide norms each: P = 998,293,504. bf16 weights 2P, fp32 gradients 4P, fp32
    # master weights 4P, Adam's two fp32 moments 8P: 18P = 17,969,283,072 bytes; with the two gather
    # buffers, each a whole [4096, 8192] bf16 tensor: 16.9 GiB, against a figure of 61.2 GiB.
    runs = {r.id: r for r in memory_accuracy.memory_runs()}
    job = runs["nanotron-usp-80p0b-16nodes-dp1-tp4-pp32-mbs1"].job()
    assert _nanotron_step_allocated_bound(job) == 18 * 998_293_504 + 2 * 4096 * 8192 * 2
    measured = {e["id"]: memory_accuracy.measured_gib(e) for e in memory_accuracy.entries()}
    ratios = {i: _nanotron_step_allocated_bound(r.job()) / GiB / measured[i]
              for i, r in runs.items() if r.group == "nanotron_ultrascale"}
    assert len(ratios) == 26
    assert max(ratios.values()) < 1, ratios


def test_published_torchao_memory():
    # torchao's torchtitan benchmark (Llama 3 8B, 8 GPUs, FSDP2, per-op SAC, compile) on H100, MI300X and
    # B200, each table with the torchtitan it ran: the H100's loss uncompiled, the later tables' split
    # root units, and the B200's cuDNN attention recomputed. Today's median |error| (6.0%) plus half a
    # point, every row within 10% (the largest today: 9.3%)
    rows = memory_accuracy.rows("torchao_torchtitan_bench")
    assert len(rows) == 12
    assert statistics.median(abs(r.error) for r in rows) <= 0.065
    assert max(abs(r.error) for r in rows) <= 0.10, [(r.id, round(r.error, 3)) for r in rows]


def test_published_kempnerforge_memory():
    # KempnerForge's two reports (max allocated, rank 0) with its bf16 states, fp32 gradients kept
    # unsharded between gradient syncs, unsplit vocabulary, eager loss on bf16 logits and whole-model
    # compile, torch pipelining's receive buffers: today's median |error| (0.7%, docs/accuracy.md) plus
    # half a point, every row within 10%
    rows = memory_accuracy.rows("kempnerforge_mfu_scaling") + memory_accuracy.rows("kempnerforge_config_validation")
    assert len(rows) == 21
    assert statistics.median(abs(r.error) for r in rows) <= 0.012
    assert max(abs(r.error) for r in rows) <= 0.10, [(r.id, round(r.error, 3)) for r in rows]


def test_published_fp8lm_memory():
    # FP8-LM's Megatron-LM (bf16 and Transformer Engine rows) with the distributed optimizer's
    # construction transient, the scripted bias-dropout-add's masks and the loss's out-of-place shift:
    # today's median |error| (7.1%) plus half a point, and today's 4 of 6 rows within 10%
    rows = memory_accuracy.rows("fp8lm")
    assert len(rows) == 6
    assert statistics.median(abs(r.error) for r in rows) <= 0.076
    assert sum(abs(r.error) <= 0.10 for r in rows) >= 4, [(r.id, round(r.error, 3)) for r in rows]


def test_fp8lm_table_5_gb_are_binary():
    # FP8-LM Table 5's 'Weight-related Comm. Volume (GB)' is the all-gather of the weights and the
    # reduce-scatter of their gradients (Azure/MS-AMP@9746ea8 docs/introduction.md:45): under
    # Megatron-LM@0609f27f's distributed optimizer once a step each, the bf16 parameter buffer gathered
    # and the gradient buffer scattered in fp32, which bf16 forces (megatron/arguments.py:159-165;
    # distrib_optimizer.py:810-899), every rank sending (dp - 1)/dp of 2 + 4 bytes per parameter.
    # By hand, 7B at tp 1, dp 32: 32 layers of 12·4096² + 13·4096 (biases, two norms), two untied
    # 50304 x 4096 vocabulary tables (50257 padded to 128) and the final norm's 8192: P = 6,856,253,440,
    # 6P·31/32 = 39,851,973,120 bytes = 37.12 GiB against 37.2 (39.85 in units of 10^9). 13B at tp 2,
    # dp 16: 40 layers of 12·5120²/2 + 48,640 (qkv and fc1 biases split, proj and fc2 biases and the
    # norms whole), two 25,216 x 5120 vocabulary shards (50257 padded to 256) and the final norm's
    # 10,240: P = 6,551,623,680, 6P·15/16 = 36,852,883,200 bytes = 34.32 GiB against 34.3 (36.85).
    # The table prints one decimal and the vocabulary is the scripts' (the paper names none): within
    # 0.5% in GiB, over 5% off in units of 10^9. So the table's GB are 2^30 bytes, as memory_accuracy
    # reads 'GPU Mem. (GB)'.
    from cost_models.states import rank_params

    runs = {r.id: r for r in memory_accuracy.memory_runs()}
    for row, params, table_gb in (("fp8lm-gpt7b-bf16-mbs2", 6_856_253_440, 37.2),
                                  ("fp8lm-gpt13b-bf16-mbs2", 6_551_623_680, 34.3)):
        job = runs[row].job()
        assert int(rank_params(job, 0).total) == params
        volume = 6 * params * (job.dp - 1) / job.dp
        assert abs(volume / GiB / table_gb - 1) <= 0.005, (row, volume / GiB)
        assert abs(volume / 1e9 / table_gb - 1) > 0.05, (row, volume / 1e9)


def test_an_allocated_peak_leaves_out_the_fragmentation_and_rank_0_is_the_first_stage():
    runs = {r.id: r for r in memory_accuracy.memory_runs()}
    run = runs["vocabpar-4b-pp8-s2k-v32k-baseline"]
    est = memory_accuracy.memory_estimate(run.job())
    reserved = memory_accuracy.allocator_bytes(est, memory_accuracy.Metric.RESERVED)
    allocated = memory_accuracy.allocator_bytes(est, memory_accuracy.Metric.ALLOCATED)
    for stage, r, a in zip(est.stages, reserved, allocated):
        b = stage.breakdown
        assert r == stage.peak_bytes - b.value("overhead/cuda_context") - b.value("overhead/nccl")
        assert a == (r - b.value("overhead/fragmentation") - b.value("overhead/cached_blocks")
                     - b.value("overhead/pending_collectives"))
    # Transformer Engine's userbuffers (MLPerf GPT-3 runs --tp-comm-overlap) are cudaMalloc'd outside the
    # caching allocator too: 14 bytes x 2048 x 12288 per GPU at fp8, tp 4, mbs 1 (six 1-byte all-gather
    # buffers and four 2-byte reduce-scatter buffers of seq x hidden)
    mlperf = memory_accuracy.memory_estimate(runs["mlperf-v3.0-nvidia-gpt3-dgxh100-64x8"].job())
    stage = mlperf.stages[0]
    assert stage.breakdown.value("buffers/tp_userbuffers") == 14 * 2048 * 12288
    assert memory_accuracy.allocator_bytes(mlperf, memory_accuracy.Metric.RESERVED)[0] == (
        stage.peak_bytes - 14 * 2048 * 12288 - stage.breakdown.value("overhead/cuda_context")
        - stage.breakdown.value("overhead/nccl"))
    # KempnerForge logs rank 0's peak: for the 13B at tp 4, pp 2 the last stage (output layer and
    # loss) is the larger one, and the first is compared
    kempner = runs["kempnerforge-cfgval-13b-32gpu-tp4-pp2"]
    per_stage = memory_accuracy.allocator_bytes(memory_accuracy.memory_estimate(kempner.job()), memory_accuracy.Metric.ALLOCATED)
    assert per_stage[1] > per_stage[0]
    row = memory_accuracy.predict(kempner, 1.0)
    assert row.peak_rank == 0 and row.predicted_gib * GiB == pytest.approx(per_stage[0])


def test_published_layouts_that_ran_are_not_called_out_of_memory_more_than_today():
    # every layout of the step-time table ran as published; today 1 is predicted above its GPU's
    # capacity and 2 above the default usable memory (docs/accuracy.md names them and why), none of
    # them a vendor's tuned recipe
    fits = memory_accuracy.fit_rows()
    assert len(fits) == 299  # the 285 timed runs and 14 whose memory alone is compared
    assert sum(f.over_capacity for f in fits) <= 1
    assert sum(f.over_usable for f in fits) <= 2
    assert not [f for f in fits if (f.over_capacity or f.over_usable) and f.id.startswith("mlperf")]


def test_step_time_out_of_sample():
    runs, _ = time_accuracy.load()
    cases = [(r, r.job()) for r in runs]
    # 273, torchao's four MI300X runs since cdna3.toml, MLPerf v5.1's two fp8 Llama-3.1-8B runs on GB300
    # NVL72 since its preset, and v5.1's six NVFP4 runs (four on GB200, two on GB300) since precision fp4
    assert len(cases) == 285
    grid = time_accuracy.Grid.build(cases)
    fitted = grid.fit(grid.every)
    for name in MECHANISMS:
        assert getattr(DEFAULT, name) == pytest.approx(getattr(fitted, name), rel=1e-3), name
    rows, _ = time_accuracy.leave_one_source_out(grid)
    errors = [abs(r.error) for r in rows]
    # the out-of-sample target is 6%. 4.0% over 285 runs today: the twelve runs added with the CDNA3
    # kernel table (torchao's four MI300X runs, 33-52% each, priced by cdna3.toml's measured anchors and
    # stand-ins), the GB300 preset (two fp8 runs) and precision fp4 (six NVFP4 runs), nothing fitted to
    # any of them, took it from 3.6% to 3.9%; the bound follows that evidence, so the 273 runs before
    # them keep their own. Two mechanisms an H200 trace of planner validate showed taking GPU time moved
    # them: FSDP2's copy-in before each gather (the 273 runs 3.64% -> 3.73%, most on KempnerForge's small
    # shard groups) and eager torch's bias-gradient reductions (the 273 runs 3.73% -> 3.83%, MPT's 45
    # biased rows). Together the 273 runs moved 0.20 points (3.64% -> 3.83%); all 285 runs moved 0.13,
    # almost all of it with the bias reductions (3.90% -> 4.03%). Each bound is today's plus a tenth of a
    # point, rounded down to a tenth: 4.03 + 0.1 -> 4.1% and 3.83 + 0.1 -> 3.9%.
    assert statistics.median(errors) <= 0.041
    new_hardware = {"MI300X", "GB300"}
    earlier_runs = [abs(r.error) for r in rows
                    if r.run.cluster.gpu.name not in new_hardware and r.run.training.precision is not Precision.FP4]
    assert len(earlier_runs) == 273 and statistics.median(earlier_runs) <= 0.039
    by_source: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        by_source[r.family].append(abs(r.error))
    # when Hopper's sustained bf16 ceiling became this project's measurement at training GEMM sizes
    # (697 TFLOP/s instead of MSMF's best-shape 755) and cuDNN attention its measured curves, the
    # median held (3.6%), the p90 (15.1 -> 14.6%) and the no-fit median (5.2 -> 4.4%) fell, and the
    # sources moved both ways: kempnerforge 3.7 -> 4.9, torchtitan 4.5 -> 5.0, torchtitan_docs_2024
    # 2.2 -> 3.2, nanotron 5.6 -> 6.3, mpt 4.1 -> 4.3, mlperf 4.2 -> 4.3; fp8lm 3.3 -> 2.5,
    # korthikanti2022 6.0 -> 5.1, narayanan2021 2.8 -> 2.1; torchtitan's selective recompute priced from its
    # policy (every second matmul of a block, and the block's elementwise ops, again) took torchtitan
    # to 4.6 and torchtitan_docs_2024 to 2.0; autograd's sums of the separate projections' input
    # gradients then took torchtitan to 5.3, kempnerforge to 5.5 and torchtitan_docs_2024 to 1.5
    # while the p90 fell from 15.1 to 14.0%; SDPA's flash backend priced from its own timing, torch's
    # ring attention with its send buffers and merges, and the 500 W board's GEMMs at the rates FBGEMM
    # timed at its limit took torchtitan to 3.3 (the median 3.6 -> 3.5%, the p90 14.0 -> 14.2%, the
    # other sources unchanged); Transformer Engine's current scaling under MLPerf v5.1's tensorwise recipe
    # took mlperf to 4.1, torch's pipelining terms (FSDP2's accumulation into fp32 gradients, every
    # chunk's first gather in the fill) torchtitan to 3.1. MPT's large-scale H100 table (18 rows at 128
    # to 512 GPUs, added as evidence, nothing fitted to them) took mpt from 4.3% over its 27 earlier rows
    # (unchanged on those) to 5.9% over 45: the bound follows the evidence, not a model change.
    # llm-foundry's unpad and pad around flash-attn 2's varlen kernel (flash_unpad_copies) left mpt
    # at 5.9% over 45 and its p90 16.7 -> 14.6%. The GB300 NVL72 preset added MLPerf v5.1's two fp8
    # Llama-3.1-8B GB300 runs (-9.6% and +36.7%, nothing fitted to them): mlperf 4.1 -> 4.2% over 46, the
    # median 3.64 -> 3.65%, the p90 13.8 -> 13.9%. Transformer Engine's amax all-reduce that the compute
    # stream waits for (te_amax_reduction: MLPerf GPT-3 v3.0 over tp x dp, v4.0 over tp) left the mlperf
    # median where it was (its five v3.0 rows +13.8..+21.5% -> +7.5..+10.1%), the p90 14.6 -> 13.7%;
    # pricing an all-reduce below the cross-node curves as NCCL's tree LL scaled to the measured 16-GPU
    # latency (comm.small_all_reduce_seconds; nothing fitted to rows) took those rows to +11.1..+17.5%,
    # the mlperf p90 12.8 -> 14.1% and the p90 13.7 -> 14.1%, the medians unchanged. The same all-reduce
    # over tp x cp where Megatron core's tp_only_amax_red or its 24.09 group ask for it (MLPerf v4.1 GPT-3,
    # v5.0 Llama 3.1 405B on H100 and H200, v5.1 Cisco) moved those rows 0.1-0.4 points slower, every
    # median and p90 unchanged. FSDP2's copy-in before each gather took kempnerforge 5.7 -> 5.9 and
    # torchtitan 3.1 -> 3.2; eager torch's bias-gradient reductions took mpt 5.9 -> 6.3 (its 27 earlier
    # rows 4.3 -> 4.6, its 18 large-scale rows 9.7 -> 8.5). `today` holds each source's median as
    # time_accuracy.leave_one_source_out measures it at this commit (rounded to a tenth of a point),
    # and each bound is today's plus a point
    today = {"fp8lm": 0.025, "kempnerforge": 0.059, "korthikanti2022": 0.052, "mlperf": 0.049, "mpt": 0.063,
             "nanotron_ultrascale": 0.068, "narayanan2021": 0.019, "sail_pipeline": 0.027, "torchtitan": 0.032,
             "torchtitan_docs_2024": 0.014}
    for source, errs in by_source.items():
        if len(errs) >= 5:
            assert statistics.median(errs) <= today[source] + 0.01, source
    # the 27 MPT rows before the large-scale table keep their own bound (4.6% today, plus a point)
    earlier = [abs(r.error) for r in rows if r.family == "mpt" and not re.fullmatch(r"mpt-h100-.*-(128|256|512)gpu", r.run.id)]
    assert len(earlier) == 27 and statistics.median(earlier) <= 0.056
    # the 18 large-scale rows: 11.0% before llm-foundry's unpad and pad around flash-attn 2 were
    # priced, 9.7% before the bias-gradient reductions, 8.5% today, plus a point
    large = [abs(r.error) for r in rows if r.family == "mpt" and re.fullmatch(r"mpt-h100-.*-(128|256|512)gpu", r.run.id)]
    assert len(large) == 18 and statistics.median(large) <= 0.095
    # KempnerForge's tail, once its unsplit vocabulary is priced in the step (loss over the whole
    # vocabulary, logits all-gather, unsplit output layer on pipeline stages; 32.5% before) and its
    # tp-2 pairs run over the 6 NVLinks between two GPUs of a switchless 4-GPU board (21.5% before):
    # p90 14.4% today (20.7% when this guard was set), plus a point
    assert time_accuracy.stats(by_source["kempnerforge"])[1] <= 0.154
    # nanotron's tail, once its rows are priced on the playbook cluster's own measured collectives
    # across nodes (presets/clusters.toml hf-science-p5; 66.8% before) and measured by the tok/s/gpu
    # the playbook prints (47.3% before): p90 44.8% today, plus a point
    assert time_accuracy.stats(by_source["nanotron_ultrascale"])[1] <= 0.458
    # A constant held at its prior because the runs leave it unpinned (Prior.unpinned) stays so only
    # while fitting it alone buys almost nothing: within 1% of the prior's objective (0.0581 against
    # 0.0582 today); a data set that pins it fails here and wants it fitted.
    for name, prior in MECHANISMS.items():
        if prior.unpinned:
            scan = time_accuracy.free_scan(grid, fitted, name)
            assert scan.objective_fitted >= 0.99 * scan.objective_prior, name


def _case(family: str, measured_gib: float, dynamic_gib: float) -> memory_accuracy.Case:
    # one stage: 10 GiB outside the fragmentation line, `dynamic_gib` that the fraction multiplies
    return memory_accuracy.Case(f"{family}-{measured_gib}", family, measured_gib, None,
                                ((10 * GiB, dynamic_gib * GiB),))


def test_fragmentation_leave_one_source_out_by_hand():
    # Families a and b read 10.5 GiB on 10 GiB dynamic (fraction 0.05), c reads 12 GiB on 20 GiB (0.10);
    # an allocated-peak row (nothing dynamic) is outside the fit set. Within 10%: a and b for fractions
    # up to 0.155, c from 0.04 to 0.16. All together, every row is within 10% from 0.04 to 0.15, and
    # the family mean of |log error|, (2 |log((10 + 10 f) / 10.5)| + |log((10 + 20 f) / 12)|) / 3,
    # rises from 0.05 on (20/(10 + 10 f) > 20/(10 + 20 f)): 0.05. Without c: 0.05. Without a (or b),
    # |log((10 + 10 f) / 10.5)| + |log((10 + 20 f) / 12)| falls up to 0.10 (1/(1 + f) < 2/(1 + 2 f)),
    # where c is exact: 0.10.
    allocated = memory_accuracy.Case("x", "x", 10.0, 0, ((10 * GiB, 0),))
    cs = [_case(f, m, d) for f, m, d in (("a", 10.5, 10), ("b", 10.5, 10), ("c", 12.0, 20)) for _ in range(3)]
    assert not allocated.informs and all(c.informs for c in cs)
    assert memory_accuracy.fit_fragmentation([*cs, allocated]) == 0.05
    loso = {out.family: out for out in memory_accuracy.leave_one_source_out([*cs, allocated])}
    assert sorted(loso) == ["a", "b", "c"]
    assert (loso["a"].fraction, loso["b"].fraction, loso["c"].fraction) == (0.10, 0.10, 0.05)
    # c predicted at 0.05: 10 + 20·0.05 = 11 GiB against 12, -8.3%; a at 0.10: 11 against 10.5, +4.8%
    assert loso["c"].cases[0].error(loso["c"].fraction) == pytest.approx(11 / 12 - 1)
    assert loso["a"].cases[0].error(loso["a"].fraction) == pytest.approx(11 / 10.5 - 1)
    # a fraction only one family informs, or fewer than 5 rows, stays at its prior (0.10, not a's 0.05)
    assert memory_accuracy.fit_fragmentation([*cs[:3], *cs[:3], allocated]) == memory_accuracy.FRAGMENTATION_PRIOR
    assert memory_accuracy.fit_fragmentation(cs[:4]) == memory_accuracy.FRAGMENTATION_PRIOR
    assert memory_accuracy.fit_fragmentation(cs[:5]) == 0.05


def test_fragmentation_is_the_all_source_fit_and_transfers():
    from cost_models.memory import FRAGMENTATION

    cs = memory_accuracy.cases()
    by_id = {r.id: r for r in memory_accuracy.rows()}
    assert len(cs) == len(by_id) == 146
    # a Case predicts what `rows` does at the model's fraction
    assert all(c.predicted_gib(FRAGMENTATION) == by_id[c.id].predicted_gib for c in cs)
    # the fit set: every reserved-peak row, six families; KempnerForge's allocated peaks leave it out
    informed = memory_accuracy.fit_set(cs)
    assert len(informed) == 125 and not [c for c in informed if c.family == "kempnerforge"]
    assert {c.family for c in informed} == {"torchtitan", "fp8lm", "sail_pipeline", "nanotron_ultrascale",
                                            "torchao_torchtitan_bench", "torchtitan_dsv3"}
    assert memory_accuracy.fit_fragmentation(cs) == FRAGMENTATION
    # leave-one-source-out: each family with the fraction fitted on the other five (0.10 to 0.11 today,
    # the all-source fit 0.10); today's median |error| plus half a point, today's rows within
    # 10% (docs/accuracy.md), and the fits within 0.05 of the all-source one
    today = {"fp8lm": (0.072, 4), "nanotron_ultrascale": (0.046, 21), "sail_pipeline": (0.012, 55), "torchtitan": (0.044, 20),
             "torchao_torchtitan_bench": (0.060, 12), "torchtitan_dsv3": (0.070, 6)}  # dsv3 5.8% to 7.0%: PR 2107's DeepEP row
    loso = memory_accuracy.leave_one_source_out(cs)
    assert sorted(out.family for out in loso) == sorted(today)
    for out in loso:
        median, within = today[out.family]
        errors = [abs(c.error(out.fraction)) for c in out.cases]
        assert abs(out.fraction - FRAGMENTATION) <= 0.05, out.family
        assert statistics.median(errors) <= median + 0.005, out.family
        assert sum(e <= 0.10 for e in errors) >= within, out.family
    assert sum(abs(c.error(out.fraction)) <= 0.10 for out in loso for c in out.cases) >= 118


def test_performance_model_page_shows_the_constants_in_use():
    # docs/performance-model.md's fitted-constants table is written by time_accuracy.py --write; a
    # change of cost_models.calibration.FITTED without regenerating it leaves the page stale
    page = (Path(__file__).parents[1] / "docs" / "performance-model.md").read_text()
    block = page.partition("<!-- fitted-constants -->")[2].partition("<!-- /fitted-constants -->")[0]
    for name, prior in MECHANISMS.items():
        row = next(line for line in block.splitlines() if line.startswith(f"| `{name}` |"))
        shown = f"not fitted ({prior.value:.3g})" if prior.unpinned else f"{getattr(DEFAULT, name):.3g}"
        assert f"| {shown} |" in row, (name, row)


def test_write_block_refuses_a_page_without_its_markers(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n<!-- t -->\nold\n<!-- /t -->\n\nkept\n")
    memory_accuracy.write_block(page, "t", "new")
    assert page.read_text() == "# Page\n\n<!-- t -->\nnew\n<!-- /t -->\n\nkept\n"
    with pytest.raises(SystemExit, match="no '<!-- u -->'"):
        memory_accuracy.write_block(page, "u", "x")
