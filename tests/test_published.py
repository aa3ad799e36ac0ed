"""benchmarks/published.py: every published entry becomes a runnable job or is skipped with a reason,
and each source's FLOP convention turns its published TFLOP/s or MFU back into the tokens/s it also
published (which checks both the convention functions and the model each run is given)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))

import published
from flop_conventions import (
    nanotron_figure_flop_per_token,
    nanotron_flop_per_token,
    narayanan_flop_per_token,
    palm_flop_per_token,
)

from cost_models.enums import MoEDispatch, Precision, ScaleupTopology
from cost_models.hardware import Cluster
from cost_models.memory import memory_estimate
from cost_models.rules import resolve
from cost_models.step_time import time_estimate
from planner.space import generated_split

ENTRIES = {e["id"]: e for e in published.entries()}
RUNS, SKIPPED = published.load()
BY_ID = {r.id: r for r in RUNS}

# Published figures are printed to 3-4 significant digits (MFU to 0.01-0.1%, TFLOP/s to 1, tokens/s
# to 1), so a correct FLOP convention reproduces the published tokens/s to well under 1%; 2% leaves
# room for that rounding and fails for any convention that differs by a term (causal halving of the
# attention, the recompute forward, the logits or the vocabulary padding each move these rows by 3-18%).
FLOP_TOLERANCE = 0.02


def test_every_entry_is_loaded_or_skipped_with_a_reason():
    wanted = {i for i, e in ENTRIES.items() if e["kind"] != "hardware_spec"}
    skipped = [i for i, _ in SKIPPED]
    assert len(set(skipped)) == len(skipped) and len(BY_ID) == len(RUNS)
    assert not set(skipped) & set(BY_ID)
    assert set(skipped) | set(BY_ID) == wanted
    assert all(reason.strip() for _, reason in SKIPPED)


def test_runs_per_group():
    # a mapping change that drops (or newly admits) a run shows up here, not as a silent skip
    assert Counter(r.group for r in RUNS) == {
        "narayanan2021": 22, "korthikanti2022": 10, "torchtitan": 32, "mpt": 45, "fp8lm": 6, "zerobubble": 31,
        "vocabpar": 24, "megatron_readme_gpt3ex": 1, "torchtitan_docs_2024": 11, "nanotron_ultrascale": 26,
        "kempnerforge_mfu_scaling": 14, "kempnerforge_config_validation": 7, "mlperf": 32, "mlperf_coreweave": 3,
        "mlperf_azure": 1, "mlperf_smc": 1, "mlperf_oracle": 3, "mlperf_cisco": 2, "mlperf_uf": 3,
        "mlperf_ibm_coreweave": 5, "mlperf_nebius": 2,  # the Llama-3.1-405B rows: embedding and loss as pipeline layers
        "torchao_torchtitan_bench": 4,  # the MI300X table (presets/kernels/cdna3.toml); H100 and B200 untimed
    }


@pytest.mark.parametrize(
    ("run_id", "reason"),
    [
        ("megatron-readme-jan2021-530b", "duplicate of narayanan2021-t1-529.6b"),
        ("megatron-readme2024-weak-70b", "micro-batch size not published"),
        ("llama3-405b-t4-16384gpu-cp16", "micro-batch size"),
        ("korthikanti2022-t4-22b-layer-baseline_no_recompute", "layer microbenchmark"),
        ("palm-540b-6144xtpuv4", "TPU"),
    ],
)
def test_skip_reasons(run_id, reason):
    assert reason in dict(SKIPPED)[run_id]


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r.id)
def test_run_resolves_to_the_published_layout(run):
    entry, job = ENTRIES[run.id], run.job()
    memory_estimate(job)
    lay = entry["layout"]
    assert job.gpus == entry["hardware"]["gpu_count"]
    assert job.training.seq_len == entry["model"]["seq_len"]
    assert job.training.global_batch_size == lay["global_batch"]
    assert (job.layout.tp, job.layout.pp, job.layout.cp) == (lay["tp"], lay["pp"], lay["cp"] or 1)
    assert job.dp == lay["dp"]
    if lay.get("vpp"):
        assert job.layout.vpp == lay["vpp"]
    if lay.get("micro_batch"):
        assert job.layout.mbs == lay["micro_batch"]
    assert run.measured_tokens_per_s_per_gpu > 0 and run.measured_from and run.assumptions


def _both_published() -> list[str]:
    """Entries that publish a tokens/s or step time and also a TFLOP/s or MFU, loaded or not."""
    out = []
    for i, e in ENTRIES.items():
        meas = e.get("measured") or {}
        has_tokens = meas.get("tokens_per_s_per_gpu") or meas.get("step_time_s")
        has_rate = meas.get("tflops_per_gpu") or meas.get("mfu")
        if e["group"] in ("mpt", "korthikanti2022") and has_tokens and has_rate :
            out.append(i)
    return out


@pytest.mark.parametrize("entry_id", _both_published())
def test_flop_convention_reproduces_published_tokens(entry_id):
    entry = ENTRIES[entry_id]
    if entry_id in BY_ID:
        run = BY_ID[entry_id]
        model, tp, measured = run.model, run.layout.tp, run.measured_tokens_per_s_per_gpu
    else:  # skipped for its layout, but its model and FLOP count are still checkable
        model, tp = published._preset_model(entry)[1], entry["layout"]["tp"]
        gbs, seq, gpus = entry["layout"]["global_batch"], entry["model"]["seq_len"], entry["hardware"]["gpu_count"]
        measured = entry["measured"]["tokens_per_s_per_gpu"] or gbs * seq / entry["measured"]["step_time_s"] / gpus
    converted, _ = published.tokens_from_flop_rate(entry, model, tp=tp)
    assert converted == pytest.approx(measured, rel=FLOP_TOLERANCE)


@pytest.mark.parametrize("run_id", [i for i in ENTRIES if i.startswith("narayanan2021")])
def test_narayanan_conversion_matches_yaml_derived(run_id):
    entry, run = ENTRIES[run_id], BY_ID[run_id]
    m, derived = entry["model"], entry["derived"]
    dims = {"num_layers": m["layers"], "hidden_size": m["hidden"], "vocab_size": m["vocab"], "seq_len": m["seq_len"]}
    if "tokens_per_s_per_gpu" in derived:
        # the yaml prints tokens/s to one decimal, which alone is 0.25% of the 1T run's 20.0
        assert abs(run.measured_tokens_per_s_per_gpu - derived["tokens_per_s_per_gpu"]) <= max(1e-3 * derived["tokens_per_s_per_gpu"], 0.05)
        gbs_tokens = entry["layout"]["global_batch"] * m["seq_len"]
        assert narayanan_flop_per_token(**dims) * gbs_tokens == pytest.approx(derived["flops_per_iteration_eq3"], rel=1e-3)
    else:  # Table 2 rows: the yaml gives the step time eq. (3) implies
        tokens = entry["layout"]["global_batch"] * m["seq_len"] / derived["step_time_s"] / entry["hardware"]["gpu_count"]
        assert run.measured_tokens_per_s_per_gpu == pytest.approx(tokens, rel=1e-3)


@pytest.mark.parametrize("run_id", [r.id for r in RUNS if r.group == "mpt"])
def test_mpt_model_has_the_published_parameter_count(run_id):
    # llm-foundry README NumParams, printed in the yaml in billions to 3 decimals
    assert BY_ID[run_id].model.params_total / 1e9 == pytest.approx(ENTRIES[run_id]["model"]["params_b"], abs=5e-4)


@pytest.mark.parametrize("entry_id", [i for i in ENTRIES if i.startswith("llama3-405b")])
def test_palm_formula_reproduces_llama3_derived_tokens(entry_id):
    # the yaml's derived tokens/s use N = 405e9 and the Table 3 shape (derived.how)
    entry = ENTRIES[entry_id]
    m = entry["model"]
    per_token = palm_flop_per_token(n_params=405 * 10**9, num_layers=m["layers"], q_width=m["hidden"], seq_len=m["seq_len"])
    tokens = entry["measured"]["tflops_per_gpu"] * 10**12 / per_token
    assert tokens == pytest.approx(entry["derived"]["tokens_per_s_per_gpu_approx"], abs=0.05)


@pytest.mark.parametrize("run_id, compiled", [
    ("kempnerforge-cfgval-13b-32gpu-tp4-pp2", False),  # configs/train/13b_32gpu_tp4_pp2.toml: compile_model = false
    ("kempnerforge-cfgval-70b-32gpu-tp4-pp4", False),
    ("kempnerforge-mfu-08-13b-8xh200-tp1-fsdp8", False),  # the report's row: 'torch.compile=off'
    ("kempnerforge-mfu-09-13b-8xh200-tp4-fsdp2", True),
])
def test_kempnerforge_compile_and_resharding_as_configured(run_id, compiled):
    job = BY_ID[run_id].job()
    assert job.training.compile is compiled
    # apply_fsdp2 keeps fully_shard's reshard_after_forward=True, pipeline or not (KempnerForge@601aba9)
    assert job.training.fsdp_reshard_after_forward is True
    # q, k, v, gate, up each gather their input; pipeline stages run tp without sequence parallelism
    assert job.training.tp_gather_per_projection is True
    if job.layout.tp > 1:
        assert job.sp is (job.layout.pp == 1)


def test_kempnerforge_tp_pairs_run_over_the_links_between_two_gpus():
    # KempnerForge's nodes: 4 H200 SXM wired to one another without an NVSwitch (presets/clusters.toml
    # kempner-h200), 6 of each GPU's 18 NVLinks to each peer. tp 2 on two of them: every tp
    # collective (sequence parallel, no overlap: all exposed) at a third of a switch's bandwidth,
    # the same sizes, so the step's tp term is 3x what a switched 4-GPU node would give
    run = BY_ID["kempnerforge-mfu-03-7b-2xh200-tp2-fsdp1"]
    assert run.cluster.spec.scaleup_topology is ScaleupTopology.MESH
    switched = run.cluster.spec.model_copy(update={"scaleup_topology": ScaleupTopology.SWITCH})
    on_switch = resolve(run.model, Cluster(spec=switched, num_gpus=2), run.training, run.layout)
    tp_mesh, tp_switch = (time_estimate(j).breakdown.value("tp") for j in (run.job(), on_switch))
    assert tp_mesh / tp_switch == pytest.approx(3.0, rel=1e-6)


def test_nanotron_splits_the_pipeline_by_its_block_costs():
    # 1.34B: a decoder layer costs 4·2048² + 3·8192·2048 = 67,108,864, the output layer
    # 131072·2048 = 268,435,456 (4 layers); total 1,342,177,280, half 671,088,640. After layer 10 the
    # running cost equals half (not above it), after layer 11 it is above: rank 0 takes 11 layers,
    # rank 1 the other 5 and the output layer.
    run = BY_ID["nanotron-usp-1p34b-1nodes-dp4-tp1-pp2-mbs4"]
    assert published.nanotron_pp_layers(run.model, 2) == [11, 5]
    assert run.layout.pp_layout == "E" + "t" * 11 + "|" + "t" * 5 + "L"
    # 80 layers over pp 32, which no even split allows, runs as nanotron places them
    deep = BY_ID["nanotron-usp-80p0b-16nodes-dp1-tp4-pp32-mbs1"]
    counts = published.nanotron_pp_layers(deep.model, 32)
    assert sum(counts) == 80 and len(counts) == 32


def test_nanotron_places_the_output_layer_before_the_last_rank_at_pp8():
    # 1.34B over pp 8, in units of a decoder layer (the output layer is 4): 16 + 4 = 20, 2.5 per rank.
    # Layers 1-3 pass 2.5 on rank 0, 4-6 pass 5 on rank 1, 7-8 pass 7.5, 9-11 pass 10, 12-13 pass 12.5,
    # 14-16 pass 15 on rank 5; the final norm (16) and the output layer (20 > 17.5) go to rank 6, the
    # fp32 cast and the loss (20, not above 20) to rank 7. Priced with the output layer on the last stage.
    model = BY_ID["nanotron-usp-1p34b-1nodes-dp4-tp1-pp2-mbs4"].model
    assert published.nanotron_pp_layers(model, 8) == [3, 3, 2, 3, 2, 3, 0, 0]
    assert published.nanotron_output_rank(model, 8) == 6
    assert published.nanotron_block_ranks(model, 8)[-2:] == [7, 7]
    assert published.nanotron_output_rank(model, 2) == 1


# The sweep figure prints MFU to 0.01% (0.1% of its smallest cell, 5.25%), the interactive figure
# tok/s/gpu to 1 (0.18% of the 80B cells' 285): a cell's FLOP count comes back to within 0.3%, while
# the two counts nanotron's figures used differ by 6hV, 1.3-16.7% of get_flops, so exactly one fits.
NANOTRON_COUNT_TOLERANCE = 0.003


@pytest.mark.parametrize("run_id", [r.id for r in RUNS if r.group == "nanotron_ultrascale"])
def test_nanotron_figure_mfu_is_its_printed_tokens_by_one_of_two_counts(run_id):
    # every row takes the tok/s/gpu the playbook's interactive figure prints for its cell; the README
    # figure's MFU times 989 TFLOP/s over it is the FLOPs per token that cell's MFU was computed with:
    # get_flops + 6hV, except the 1.34B and 3.57B cells without pipeline parallelism (get_flops alone)
    run, entry = BY_ID[run_id], ENTRIES[run_id]
    assert run.measured_from == "tokens_per_s_per_gpu: as published"
    implied = entry["measured"]["mfu"] / 100 * 989e12 / run.measured_tokens_per_s_per_gpu
    s = run.training.seq_len
    counts = {"get_flops + 6hV": nanotron_figure_flop_per_token(run.model, seq_len=s),
              "get_flops": nanotron_flop_per_token(run.model, seq_len=s)}
    fits = [name for name, count in counts.items() if implied == pytest.approx(count, rel=NANOTRON_COUNT_TOLERANCE)]
    plain = "-pp1-" in run_id and ("-1p34b-" in run_id or "-3p57b-" in run_id)
    assert fits == ["get_flops" if plain else "get_flops + 6hV"]


def test_nanotron_figure_counts_by_hand():
    # 1.34B (16 layers, h 2048, 32 heads, ffn 8192, vocab 131072, s 4096): a layer's forward per token
    # 2·2048·6144 + 4·4096·2048 + 2·2048·2048 + 6·2048·8192 = 167,772,160; get_flops
    # 3·(16·167,772,160 + 2·2048·131072) = 9,663,676,416; plus 6·2048·131072 = 1,610,612,736.
    # The 1-node cell: 44.32% x 989 TFLOP/s / 38,895 tok/s/gpu = 11.27e9, the second count (0.04%).
    small = BY_ID["nanotron-usp-1p34b-1nodes-dp4-tp1-pp2-mbs4"]
    assert nanotron_flop_per_token(small.model, seq_len=4096) == 9_663_676_416
    assert nanotron_figure_flop_per_token(small.model, seq_len=4096) == 11_274_289_152
    assert small.measured_tokens_per_s_per_gpu == 38_895
    # 80B on 8 nodes with 8 key/value heads: qkv 2·8192·(8192 + 2·1024) = 167,772,160, scores 134,217,728,
    # output 134,217,728, MLP 1,409,286,144 per layer; 3·(80·1,845,493,760 + 2·8192·131072) + 6·8192·131072
    # = 455,803,404,288, which 30.65% x 989 TFLOP/s / 665 tok/s/gpu = 455.83e9 matches; with 64 heads the
    # count is 512.2e9, 11% off
    gqa = BY_ID["nanotron-usp-80p0b-8nodes-dp1-tp4-pp16-mbs1"]
    assert gqa.model.kv_heads == 8
    assert nanotron_figure_flop_per_token(gqa.model, seq_len=4096) == 455_803_404_288
    assert 0.3065 * 989e12 / 665 == pytest.approx(455_803_404_288, rel=1e-3)


def test_nanotron_runs_on_the_playbook_cluster_and_its_measured_network():
    # the sweep ran on Hugging Face's science cluster (nanotron's SLURM partition hopper-prod, EFA):
    # every row is priced on hf-science-p5, whose cross-node collectives the playbook measured
    clusters = {r.cluster.spec.name for r in RUNS if r.group == "nanotron_ultrascale"}
    assert clusters == {"hf-science-p5"}
    spec = BY_ID["nanotron-usp-3p57b-64nodes-dp128-tp4-pp1-mbs2"].cluster.spec
    assert spec.fabric == "efa" and spec.efa_devices_per_node == 32
    assert {(p.collective, p.nodes) for p in spec.measured_busbw} >= {("all_reduce", 64), ("all_gather", 64)}


@pytest.mark.parametrize("run_id, ddp, blocking", [
    ("nanotron-usp-1p34b-16nodes-dp64-tp2-pp1-mbs4", True, False),  # ZeRO-0, dp 64: wrapped in torch DDP
    ("nanotron-usp-80p0b-4nodes-dp1-tp8-pp4-mbs1", False, False),  # ZeRO-0 but dp 1
    ("nanotron-usp-1p34b-2nodes-dp8-tp1-pp2-mbs1", False, True),  # ZeRO-1 with fp32 accumulation
])
def test_nanotron_memory_switches_as_its_trainer_sets_them(run_id, ddp, blocking):
    # trainer.py:786-788 at huggingface/nanotron@c2528430: DDP when dp > 1 and not (fp32 accumulation
    # and ZeRO > 0); the fp32 accumulator and the sharded cross entropy in every run. Without DDP,
    # ZeRO-1's gradients are all-reduced and its parameters gathered after the step (trainer.py:509-518)
    tr = BY_ID[run_id].job().training
    assert tr.ddp_buckets is ddp
    assert tr.zero1_blocking_sync is blocking
    assert tr.grads_kept_through_backward and tr.loss_shift_out_of_place and not tr.grad_accumulation_fusion
    assert tr.eager_swiglu  # models/llama.py:194-201 GLUActivation
    # scripts/scaling_benchmarks.py:87-88: REDUCE_SCATTER with async linears, whose gathers go to the
    # persistent MemoryBuffers (parallel/tensor_parallel/functional.py:153-156, 491-493)
    assert tr.tp_gather_buffers
    # the same linears' reduce-scattered outputs, held for the NCCL stream (functional.py:453-470)
    assert tr.tp_scatter_inputs_pending


def test_mpt_steps_composers_decoupled_adamw_over_its_shard():
    # llm-foundry's MPT yamls name decoupled_adamw (scripts/train/yamls/pretrain/mpt-*.yaml@b2a43a147):
    # one step updates the rank's FSDP shard, 12,853,954,560 / 8 parameters of MPT-13b, moving 88
    # bytes each (cost_models.compute OPTIMIZER_BYTES_PER_PARAM) at 0.90 of H100's 3.35 TB/s:
    # 1.6067e9 x 88 / 3.015e12 = 46.9 ms (fused AdamW's 38 bytes: 20.3 ms). rel 1e-9: same arithmetic.
    from cost_models.enums import OptimizerKind

    assert {r.training.optimizer for r in RUNS if r.group == "mpt"} == {OptimizerKind.DECOUPLED_ADAMW}
    run = BY_ID["mpt-h100-13b-seq2048-8gpu"]
    assert run.model.params_total == 12_853_954_560
    optimizer_s = time_estimate(run.job()).breakdown.value("optimizer")
    assert optimizer_s == pytest.approx(12_853_954_560 / 8 * 88 / (0.90 * 3.35e12), rel=1e-9)


@pytest.mark.parametrize(("run_id", "family"), [
    # torch SDPA's flash backend under the Dec 2024 and Jun 2025 nightlies, and torchtitan's 2024 docs
    ("torchtitan-2412-8b-8gpu-fsdp", "sdpa_flash"), ("torchtitan-2506-8b-64gpu-bf16-asynctp", "sdpa_flash"),
    ("torchtitan-docs-2408-llama31-405b-128xh100-bf16", "sdpa_flash"),
    # KempnerForge's torch 2.11.0 with cuDNN 9.19 (uv.lock @5666d0d): SDPA prefers cuDNN on sm90
    ("kempnerforge-cfgval-13b-32gpu-tp4-pp2", "cudnn"),
])
def test_torch_sdpa_runs_resolve_to_the_backend_their_torch_picks(run_id, family):
    from cost_models.compute import attention_backend

    assert attention_backend(BY_ID[run_id].job()).value == family


def test_fp8lm_runs_flash_attention_1():
    # the authors' MS-AMP image pins flash-attn 1.0.9 (Azure/MS-AMP@b0ab69cf dockerfile): one 7B layer
    # of a micro-batch, b2 x 32 heads, 2048 tokens, head dim 128, causal, runs 4·64·2048²·128/2 =
    # 68.72 GFLOP forward and 3.5x that forward + backward at FA1's H100 causal hdim-128 2k rate, 108
    # TFLOP/s (presets/kernels/hopper.toml [attention.fa1]), times the cluster GPU's compute scale; its
    # 64·16 = 1024 thread blocks fill 132 SMs as the benchmark's 8·16·16 = 2048 do (8 and 16 waves, both
    # 0.970 full); one forward and 3 backward launches of 2.4 us. 32 layers x 32 micro-batches.
    from cost_models.enums import AttentionBackend
    from cost_models.kernels import compute_scale
    from cost_models.step_time import time_estimate

    job = BY_ID["fp8lm-gpt7b-bf16-mbs2"].job()
    assert job.training.attention_backend is AttentionBackend.FA1
    one = 3.5 * 4 * 64 * 2048**2 * 128 / 2 / (108e12 * compute_scale(job.cluster.gpu)) + 4 * 2.4e-6
    assert 2.5e-3 < one < 2.6e-3  # FA2's 265 TFLOP/s would give 1.03 ms
    # rel 1e-6: the same arithmetic in another order
    assert time_estimate(job).breakdown.value("compute/attention") == pytest.approx(32 * 32 * one, rel=1e-6)


@pytest.mark.parametrize(("run_id", "bucket", "ring"), [
    # custom.yaml defaults where no config sets BUCKET_SIZE; config_common_8b.sh:19's 768M where one does;
    # the tp_overlap yaml's proj_fprop / fc2_fprop methods (benchmarks/published.py MLPERF_* tables)
    ("mlperf-v5.1-cisco-llama8b-h100-8x8", 64, frozenset()),  # tp 1: no TP overlap
    ("mlperf-v5.1-cisco-llama8b-h100-16x8", 64, frozenset()),  # TP overlap never enabled (below)
    ("mlperf-v5.1-uf-llama8b-dgxb200-32x8", 134_217_728, frozenset()),
    ("mlperf-v5.1-oracle-llama8b-b200-8x8", 768_000_000, frozenset()),
    ("mlperf-v5.1-nvidia-llama8b-gb200-128x4", 768_000_000, frozenset({"proj", "fc2"})),
    ("mlperf-v5.0-nvidia-llama405b-hgxh100-64x8", 200, frozenset({"proj", "fc2"})),
    ("mlperf-v5.0-nebius-llama405b-h200-64x8", 200, frozenset({"fc2"})),
    ("mlperf-v4.1-nvidia-gpt3-dgxh100-64x8", None, frozenset({"fc2"})),
    ("mlperf-v3.1-nvidia-gpt3-dgxh100-64x8", None, frozenset()),
])
def test_mlperf_rows_carry_their_bucket_size_and_overlap_methods(run_id, bucket, ring):
    tr = BY_ID[run_id].job().training
    assert (tr.ddp_bucket_size, tr.ub_ring_exchange_rs) == (bucket, ring)


@pytest.mark.parametrize("size", ["18x4", "128x4"])
def test_mlperf_gb300_rows_are_their_gb200_twins_on_the_gb300_rack(size):
    # NVIDIA's v5.1 GB300 and GB200 configs of the same size are the same file but for the name
    # (config_GB300_18x4x1xtp1pp1cp2_8b.sh = config_GB200_..., and the 128x4x1xtp2pp1cp4 pair): the same job on
    # another rack
    gb300 = BY_ID[f"mlperf-v5.1-nvidia-llama8b-gb300-{size}"]
    gb200 = BY_ID[f"mlperf-v5.1-nvidia-llama8b-gb200-{size}"]
    assert (gb300.cluster.spec.name, gb200.cluster.spec.name) == ("gb300-nvl72", "gb200-nvl72")
    same_model = gb300.model.model_copy(update={"source": gb200.model.source})  # each names its own results
    assert (same_model, gb300.training, gb300.layout) == (gb200.model, gb200.training, gb200.layout)
    assert gb300.cluster.num_gpus == gb200.cluster.num_gpus


def test_cisco_tp2_row_runs_without_tp_overlap_whatever_its_config_says():
    # Cisco's pretrain.py:632 leaves MegatronCommOverlapCallback out, so TP_COMM_OVERLAP=True reaches
    # nothing; NVIDIA's own 8B code appends it (pretrain.py:666) and keeps the overlap
    cisco = BY_ID["mlperf-v5.1-cisco-llama8b-h100-16x8"].job().training
    nvidia = BY_ID["mlperf-v5.1-nvidia-llama8b-gb200-128x4"].job().training
    assert (cisco.tp_comm_overlap, nvidia.tp_comm_overlap) == (False, True)
    # and Cisco keeps config_common.sh's ALIGN_PARAM_GATHER=True at pp 1, which NVIDIA's 8B turns off
    assert (cisco.align_param_gather, nvidia.align_param_gather) == (True, False)
    assert [r.id for r in BY_ID.values() if r.training.align_param_gather] == [
        "mlperf-v5.1-cisco-llama8b-h100-8x8", "mlperf-v5.1-cisco-llama8b-h100-16x8"]


def test_only_the_nemo1_gpt3_rows_from_v4_cap_their_nccl_communicators():
    # v4.0/v4.1 GPT-3 (NVIDIA, SMC) hand conf/nccl/custom_communicator_cta.yaml to Megatron; v3.x has no
    # such yaml, the Llama-3.1 NeMo 2 code never passes it (v5.0) or overrides it by NCCL_MAX_CTAS (v5.1)
    from cost_models.training import NcclCtas

    capped = {r.id for r in BY_ID.values() if r.training.nccl_max_ctas is not None}
    assert capped == {i for i in BY_ID if i.startswith(("mlperf-v4.0-nvidia-gpt3", "mlperf-v4.0-smc-gpt3", "mlperf-v4.1-nvidia-gpt3"))}
    assert len(capped) == 7
    assert BY_ID["mlperf-v4.1-nvidia-gpt3-dgxh100-64x8"].training.nccl_max_ctas == NcclCtas(dp=8, tp=8, cp=1, pp=2)


def test_mlperf_gpt3_rows_run_apex_distributed_fused_adam():
    # GPT-3's NeMo 1 code (v3.0-v4.1, every submitter) runs optim: distributed_fused_adam; the
    # Llama-3.1 rows run Megatron-core's DDP and distributed optimizer (NeMo 2)
    mlperf = [r for r in BY_ID.values() if r.id.startswith("mlperf-")]
    gpt3 = [r for r in mlperf if "-gpt3-" in r.id]
    assert len(gpt3) == 22
    assert all(r.training.apex_distributed_adam for r in gpt3)
    assert not any(r.training.apex_distributed_adam for r in mlperf if r not in gpt3)


def test_mlperf_fp8_parameters_follow_fp8_params_and_fp8_param_gather():
    # GPT-3 v4.x and the v5.0 H100/H200 405B configs export FP8_PARAMS, the v5.0 GB200 and v5.1 405B
    # ones FP8_PARAM_GATHER (tyche_ngpu256_ngc25.04_nemo/config_common.sh:69); GPT-3 v3.x neither;
    # the v5.1 NVFP4 configs turn it off (config_common_fp4.sh:4)
    mlperf = [r for r in BY_ID.values() if r.id.startswith("mlperf-")]
    fp8_params = {r.id for r in mlperf if r.training.fp8_param_gather}
    fp4 = {r.id for r in mlperf if r.training.precision is Precision.FP4}
    assert {r.id for r in mlperf if "-llama405b-" in r.id} - fp4 <= fp8_params
    assert not fp4 & fp8_params
    assert {r.id for r in mlperf if r.id.startswith(("mlperf-v4.0-", "mlperf-v4.1-"))} <= fp8_params
    assert not {r.id for r in mlperf if r.id.startswith(("mlperf-v3.0-", "mlperf-v3.1-"))} & fp8_params


def test_mlperf_llama8b_rows_gather_fp8_parameters():
    # every v5.1 8B submission's config_common.sh:73 (NVIDIA, Oracle, University of Florida) or
    # config_common.sh:58 FP8_PARAMS (Cisco) turns fp8 parameters on; the fp4 configs turn them off
    rows = [r for r in BY_ID.values() if r.id.startswith("mlperf-v5.1-") and "-llama8b-" in r.id]
    assert len(rows) == 10
    assert all(r.training.fp8_param_gather is (r.training.precision is Precision.FP8) for r in rows)
    assert sorted(r.id for r in rows if r.training.precision is Precision.FP4) == [
        "mlperf-v5.1-nvidia-llama8b-gb200-2x4", "mlperf-v5.1-nvidia-llama8b-gb300-2x4"]


def test_mlperf_fp8_attention_on_where_the_record_says_it_ran():
    # FP8_DPA=True in config_common_fp8attn.sh, sourced by the NVIDIA 8B NVFP4 2x4 configs
    # (training_results_v5.1@441d65f4 NVIDIA/benchmarks/llama31_8b/implementations/nemo/
    # config_GB{2,3}00_2x4x2xtp1pp1cp1_8b_fp4.sh:5) and by no other mapped MLPerf config; each record's
    # precision line says which ("FP8 (hybrid) attention", or "FP8 dot-product attention not enabled"
    # on the 405B NVFP4 rows, whose configs share the fp4 setup but not that file). The mapped job turns
    # fp8 attention on exactly where the record says so (tests/test_fp8_attention.py prices it).
    mlperf = [r for r in BY_ID.values() if r.id.startswith("mlperf-")]
    on = []
    for r in mlperf:
        says = "FP8 (hybrid) attention" in (ENTRIES[r.id]["hardware"].get("precision") or "")
        job = r.job()
        assert job.training.fp8_attention is says, r.id
        if says:
            # NVFP4's recipe scales attention's fp8 tensors by current scaling
            assert job.training.fp8_attention_current, r.id
            on.append(r.id)
    assert sorted(on) == ["mlperf-v5.1-nvidia-llama8b-gb200-2x4", "mlperf-v5.1-nvidia-llama8b-gb300-2x4"]


@pytest.mark.parametrize("run_id, cap", [
    ("mlperf-v3.0-coreweave-gpt3-hgxh100-448x8", 100),  # run_and_time.sh:85's default
    ("mlperf-v3.1-azure-gpt3-ndh100v5-1344x8", 100),  # distributed_fused_adam.yaml:2's default
    ("mlperf-v4.0-nvidia-gpt3-dgxh100-1452x8", 200),  # config_common.sh:69
    ("mlperf-v4.1-nvidia-gpt3-dgxh100-32x8", 125),  # the 32-node config's "Fix OOM", after config_common.sh
    ("mlperf-v4.1-oracle-gpt3-h100-384x8", 200),  # config_common.sh:61
])
def test_mlperf_gpt3_rows_carry_their_apex_bucket_cap(run_id, cap):
    assert BY_ID[run_id].job().training.apex_bucket_cap_mb == cap


@pytest.mark.parametrize("run_id, vpp, mbs", [
    # torchtitan 9dec370 splits the local batch into pp micro-batches unless told otherwise, looped
    # schedules included (pipelining_utils.py:79-81): local batch 32 over 8 -> 4 sequences each, and the
    # interleaved run also 8 micro-batches (not pp x 2 stages per rank = 16 of 2 sequences)
    ("torchtitan-2412-405b-512gpu-1f1b", 1, 4),
    ("torchtitan-2412-405b-512gpu-interleaved1f1b", 2, 4),
    ("torchtitan-2412-405b-512gpu-fsdp1-cp8-seq262144", 1, 1),  # local batch 8 over pp 8
])
def test_torchtitan_pipeline_runs_split_the_local_batch_into_pp_microbatches(run_id, vpp, mbs):
    job = BY_ID[run_id].job()
    assert (job.layout.vpp, job.layout.mbs, job.num_microbatches) == (vpp, mbs, 8)


def test_torchtitan_default_split_points():
    # generate_split_points (torchtitan 9dec370): 126 layers over 16 stages, base 7 and 14 left over:
    # the first stage 7, the next fourteen 8 each, the last 126 - 7 - 112 = 7; over 8 stages base 15,
    # 6 left over: 15, six of 16, 15. 10 over 4: 2, 3, 3, then the last 2.
    assert generated_split(126, 8, 2) == (7,) + (8,) * 14 + (7,)
    assert generated_split(126, 8, 1) == (15,) + (16,) * 6 + (15,)
    assert generated_split(10, 4, 1) == (2, 3, 3, 2)
    # looped stages: rank 0 runs stages 0 and 8 (7 + 8 layers), rank 7 stages 7 and 15 (8 + 7)
    chunks = BY_ID["torchtitan-2412-405b-512gpu-interleaved1f1b"].job().stage_chunks
    assert [len(c) for c in chunks[0]] == [7, 8] and [len(c) for c in chunks[7]] == [8, 7]
    assert [len(c) for c in chunks[3]] == [8, 8]
    one = BY_ID["torchtitan-2412-405b-512gpu-1f1b"].job().stage_chunks
    assert [len(r[0]) for r in one] == [15] + [16] * 6 + [15]


def test_torchtitan_interleaved_405b_peaks_at_the_first_chunks_first_backward():
    # 8 micro-batches over pp 8 with 2 stages per rank: warm-up (8-r-1)·2 + 8 forwards, so ranks 0-3
    # run all 16 forwards, then the 8 backwards of their second stage, then the first stage's. The fp32
    # unsharded gradients of the second stage exist from its first backward, the first stage's from
    # its own: the peak holds the first stage's 8 micro-batches and every gradient, not all 16 with
    # every gradient. Rank 7 (8 warm-up forwards, then one forward before each backward of its last
    # stage): the same moment, with the 8 kept 16-bit logits.
    from cost_models.memory import memory_estimate
    from cost_models.states import rank_params, rank_state_bytes

    job = BY_ID["torchtitan-2412-405b-512gpu-interleaved1f1b"].job()
    est = memory_estimate(job)
    assert all(s.inflight == (8, 0) for s in est.stages)
    for r in (1, 7):
        full = 4 * rank_params(job, r).total - rank_state_bytes(job, r).value("gradients")
        assert est.stages[r].breakdown.value("buffers/unsharded_grads") == full


def test_torchtitan_docs_rows_that_say_no_async_tp_run_plain_tp():
    # docs/performance.md@3faaa1a0 (Aug 2024), 405B on 128 H100s: only the last row ran async TP
    ids = ("torchtitan-docs-2408-llama31-405b-128xh100-bf16", "torchtitan-docs-2408-llama31-405b-128xh100-float8",
           "torchtitan-docs-2408-llama31-405b-128xh100-float8-asynctp")
    assert [BY_ID[i].training.tp_comm_overlap for i in ids] == [False, False, True]


def test_mpt_pure_rows_reduce_scatter_bf16_gradients():
    # Composer's mixed_precision PURE sets FSDP's reduce_dtype to bf16 (mosaicml/composer@v0.16.4
    # mosaic_fsdp_utils.py L91-94), DEFAULT to fp32 (L87-90). One MPT-13b block holds
    # 12·d² + 13·d = 12·5120² + 13·5120 = 314,639,360 parameters (qkv, out, fc1, fc2 weights and
    # biases, two LayerNorms); its reduce-scatter over the 128 A100-40GB ranks moves 2 bytes each
    # under PURE, 4 under DEFAULT. rel 1e-12: the same collective_time call on the same bytes.
    from cost_models.comm import Collective, collective_time
    from cost_models.states import local_layer_params
    from cost_models.step_time import _dense_group, _fsdp_layer_comm

    pure = {r.id for r in RUNS if r.group == "mpt" and r.training.fsdp_reduce_in_bf16}
    assert pure == {"mpt-a100-70b-seq2048-64gpu", "mpt-a100-40g-70b-seq2048-128gpu", "mpt-a100-40g-30b-seq2048-128gpu",
                    "mpt-a100-40g-13b-seq2048-128gpu", "mpt-a100-40g-7b-seq2048-128gpu", "mpt-a100-40g-7b-seq2048-8gpu"}
    job = BY_ID["mpt-a100-40g-13b-seq2048-128gpu"].job()
    assert local_layer_params(job, 0).dense == 12 * 5120**2 + 13 * 5120 == 314_639_360
    _, reduce = _fsdp_layer_comm(job, 0)
    rs = lambda nbytes: collective_time(Collective.REDUCE_SCATTER, nbytes, _dense_group(job), job.cluster.spec)  # noqa: E731
    assert reduce == pytest.approx(rs(314_639_360 * 2), rel=1e-12)
    assert reduce < 0.6 * rs(314_639_360 * 4)  # the fp32 reduce a DEFAULT row pays


def test_mpt_large_scale_rows_map_the_sharding_strategy_and_the_sweeps_kernel():
    # README@5e85bd62d 'H100 80GB BF16 (Large Scale, >= 128 GPUs)': 18 rows at 128, 256 and 512 GPUs
    # besides the 27 earlier ones. The 3b row at 256 GPUs: SHARD_GRAD_OP (zero 2), micro-batch 8, grad
    # accum 1, global batch 2048 = 8 x 256, 22,772 tokens/s/GPU, no activation checkpointing; sweep.py
    # (L49-54) ran it with attn_impl flash on flash-attn 2.4.2. FSDP1 then gathers once per micro-batch,
    # before the forward: 1·(4 + 2)/256 + (2 + 4) + 2·4 + 2·4/256 = 14 + 14/256 bytes per parameter
    # outside the collectives (exact: the same sum in binary fractions).
    from cost_models.enums import AttentionBackend, Recompute, Zero
    from cost_models.step_time import fsdp1_bytes_per_param, fsdp_gathers

    large = {r.id for r in RUNS if r.group == "mpt" and "Large Scale" in ENTRIES[r.id]["source"]["location"]}
    assert len(large) == 18
    run = BY_ID["mpt-h100-3b-seq2048-256gpu"]
    job = run.job()
    assert (job.zero, job.layout.mbs, job.training.global_batch_size, job.cluster.num_gpus, job.dp) == (
        Zero.GRADIENTS, 8, 2048, 256, 256)
    assert job.num_microbatches == 1 and job.layout.recompute is Recompute.NONE
    assert job.training.attention_backend is AttentionBackend.FA2
    assert run.measured_tokens_per_s_per_gpu == 22772 and run.model.params_total == 2_651_837_440  # the table's NumParams
    assert fsdp_gathers(job) == (1.0, 0.0)
    assert fsdp1_bytes_per_param(job) == 14 + 14 / 256
    # the 1b and 3b rows are the zero-2 ones; 13b and 30b ran attn_impl triton (FlashAttention-1's rates)
    zero2 = {i for i in large if BY_ID[i].layout.zero is Zero.GRADIENTS}
    assert zero2 == {f"mpt-h100-{s}-seq2048-{n}gpu" for s in ("1b", "3b") for n in (128, 256, 512)}
    fa1 = {i for i in large if BY_ID[i].training.attention_backend is AttentionBackend.FA1}
    assert fa1 == {f"mpt-h100-{s}-seq2048-{n}gpu" for s in ("13b", "30b") for n in (128, 256, 512)}
    # every earlier mpt row stays FULL_SHARD at FlashAttention-1's rates
    assert all(r.layout.zero is Zero.PARAMETERS and r.training.attention_backend is AttentionBackend.FA1
               for r in RUNS if r.group == "mpt" and r.id not in large)


def test_mpt_fsdp1_copies_are_casts_and_divisions_not_a_copy_out():
    # FSDP1's FlatParameter is viewed, not copied out (TrainingSpec.fsdp_flat_params). Per parameter and
    # micro-batch it moves: the fp32 shard cast to bf16 before both gathers, 2·(4 + 2)/n; under DEFAULT
    # the bf16 gradient cast to fp32, 2 + 4, and its predivision in place, 2·4; the shard's
    # postdivision, 2·4/n. 8 ranks: 1.5 + 6 + 8 + 1 = 16.5 bytes. PURE reduces in bf16: no cast,
    # predivision 2·2; 128 ranks: 12/128 + 4 + 4/128 = 4.125 bytes (FSDP2's copies: 2·(2 + 2) + 2 + 2 = 12).
    from cost_models.step_time import fsdp1_bytes_per_param

    default = BY_ID["mpt-h100-13b-seq2048-8gpu"].job()
    pure = BY_ID["mpt-a100-40g-13b-seq2048-128gpu"].job()
    assert default.training.fsdp_flat_params and pure.training.fsdp_flat_params
    assert fsdp1_bytes_per_param(default) == 16.5
    assert fsdp1_bytes_per_param(pure) == 4.125


def test_dsv3_16b_row_maps_to_torchtitans_flavor_and_layout():
    """tt-pr1610's SDPA run by hand: the 16B flavor at d0cdb1433^ (q_lora_rank 0, kv_lora_rank 512,
    qk_nope 128 + qk_rope 64 = 192, v 128; 64 routed experts of 1408, top 6, softmax scores renormalized
    by route_norm, the two shared experts one FeedForward of 2·1408 = 2816, one dense layer first) on 8
    GPUs with expert parallelism 8 over dp_shard 8 (--parallelism.expert_parallel_degree=8), local
    batch 8, the toml's op-level SAC and loss-only compile."""
    model, cluster, training, layout, _ = published.dsv3_mapped(ENTRIES["tt-pr1610-dsv3-16b-8gpu-ep8-sdpa"])
    mla, moe = model.mla, model.moe
    assert (mla.q_lora_rank, mla.kv_lora_rank, mla.qk_head_dim, mla.v_head_dim) == (None, 512, 192, 128)
    assert (model.head_size, model.v_head_size) == (192, 128) and model.kv_heads == model.num_attention_heads == 16
    assert (moe.num_experts, moe.top_k, moe.expert_ffn_hidden_size, moe.first_k_dense) == (64, 6, 1408, 1)
    assert (moe.num_shared_experts, moe.shared_width) == (1, 2816)
    assert moe.renormalize_top_k and moe.expert_bias and moe.aux_loss_coef == 0.0 and moe.router_groups is None
    assert (layout.tp, layout.pp, layout.cp, layout.ep, layout.mbs) == (1, 1, 1, 8, 8)
    job = resolve(model, cluster, training, layout)
    assert job.layout.dp == 8 and job.layout.ep == 8
    assert layout.recompute.value == "selective" and not training.compile and training.compiles_loss
    assert training.global_batch_size == 64 and cluster.spec.name == "grand-teton-h100"
    # d0cdb1433^ predates torchtitan@c4e229115: its SAC save list keeps no all-to-all output
    assert training.sac_recomputes_all_to_all
    # its apply_fsdp wraps tok_embeddings, each layer and [norm, output] as units of their own
    assert training.fsdp_split_root


def test_dsv3_671b_flavor_groups_its_router_and_scales_it():
    """The 671B flavor at d021aa9ca^: q_lora_rank 1536, sigmoid scores over 8 expert groups of which 4
    are kept, route_scale 2.5, one shared expert of 2048; ep 32 inside dp_shard 64 under pp 8."""
    model, _, training, layout, _ = published.dsv3_mapped(ENTRIES["tt-pr2107-dsv3-671b-512gpu-a2a-baseline"])
    moe = model.moe
    assert model.mla.q_lora_rank == 1536 and moe.router_score.value == "sigmoid"
    assert (moe.router_groups, moe.router_group_top_k, moe.routed_scaling_factor, moe.shared_width) == (8, 4, 2.5, 2048)
    assert (layout.pp, layout.vpp, layout.ep, layout.dp) == (8, 2, 32, 64) and training.compile
    assert not training.sac_recomputes_all_to_all  # d021aa9ca^ comes after c4e229115
    assert training.moe_dispatch is MoEDispatch.ALLTOALL
    # the PR's "After" run: --parallelism.expert_parallel_comm_backend=deepep
    _, _, deepep, _, notes = published.dsv3_mapped(ENTRIES["tt-pr2107-dsv3-671b-512gpu-deepep"])
    assert deepep.moe_dispatch is MoEDispatch.DEEPEP and any("DeepEP dispatch and combine" in n for n in notes)


def test_dsv3_1504_router_does_not_renormalize_softmax_scores():
    # decfd3fef^'s router divides the kept scores by their sum for sigmoid scores only (moe.py:223-225)
    model, _, training, layout, _ = published.dsv3_mapped(ENTRIES["tt-pr1504-dsv3-16b-8gpu-fsdp4-cp2"])
    assert not model.moe.renormalize_top_k and (layout.cp, layout.ep, layout.dp) == (2, 1, 4)
    assert not training.compile and not training.compiles_loss
    # its apply_fsdp wraps each layer and then the root, which holds the embedding and output layer
    assert not training.splits_fsdp_root


@pytest.mark.parametrize(
    ("run_id", "reason"),
    [
        ("tt-pr1610-dsv3-16b-8gpu-ep8-flex", "FlexAttention with torchtitan's block_causal (document) mask: its attention "
         "work depends on the lengths of the c4 documents packed into each sequence, which neither the PR nor the config gives"),
        ("tt-pr1616-dsv3-16b-8gpu-pp4-dp2", "block_causal (document) mask"),
        ("tt-pr2107-dsv3-671b-512gpu-a2a-baseline", "block_causal (document) mask"),
        ("tt-pr2107-dsv3-671b-512gpu-deepep", "block_causal (document) mask"),
        ("tt-pr1610-dsv3-16b-8gpu-ep8-sdpa", "memory-efficient (CUTLASS) kernel for MLA's head dims"),
        ("tt-pr1504-dsv3-16b-8gpu-fsdp4-cp2", "no Hopper curve of that kernel"),
    ],
)
def test_dsv3_rows_are_skipped_for_their_attention_kernel(run_id, reason):
    assert reason in dict(SKIPPED)[run_id] and "cannot express" not in dict(SKIPPED)[run_id]


def test_rows_whose_step_time_is_not_priced_still_have_their_memory_mapped():
    """A power limit, an unstated H100 variant or an unpriced attention kernel decides a row's step time,
    not what it allocates: such rows stay out of the timed runs and come back, fully mapped, from
    memory_only, with the same reason. The MI300X rows, priced by presets/kernels/cdna3.toml, are timed
    on the mi300x-8 preset."""
    untimed = {run.id: (run, why) for run, why in published.memory_only()}
    for run_id in ("torchao-e2e-llama3-8b-8xb200-bf16", "torchao-e2e-llama3-8b-8xh100-bf16", "tt-pr1610-dsv3-16b-8gpu-ep8-sdpa"):
        assert run_id not in BY_ID
        run, why = untimed[run_id]
        assert why == dict(SKIPPED)[run_id]
        assert memory_estimate(run.job()).stages
    # the B200 row on the dgx-b200 preset, the H100 row of unstated variant on dgx-h100
    assert untimed["torchao-e2e-llama3-8b-8xb200-bf16"][0].cluster.spec.name == "dgx-b200"
    assert untimed["torchao-e2e-llama3-8b-8xh100-bf16"][0].cluster.spec.name == "dgx-h100"
    assert untimed["tt-pr1610-dsv3-16b-8gpu-ep8-sdpa"][0].layout.ep == 8
    mi300x = BY_ID["torchao-e2e-llama3-8b-8xmi300x-bf16"]
    assert "torchao-e2e-llama3-8b-8xmi300x-bf16" not in untimed
    assert mi300x.cluster.spec.name == "mi300x-8" and memory_estimate(mi300x.job()).stages


UNTIMED = {run.id: run for run, _ in published.memory_only()}
TORCHAO = {i: r for i, r in (UNTIMED | BY_ID).items() if r.group == "torchao_torchtitan_bench"}
LLAMA3_8B_LAYER = 4096 * (4096 + 2 * 1024 + 4096) + 3 * 4096 * 14336 + 2 * 4096  # 218,112,000 parameters
LLAMA3_8B_LOGITS = 8192 * 128256  # one 8192-token sequence over the vocabulary


def test_torchao_rows_run_the_torchtitan_each_table_names():
    # pytorch/ao's three tables: H100 (8c81863ba, torchtitan 069bae286..54ef42221: loss uncompiled, the
    # root FSDP unit holding embedding and output), MI300X (853f87d1b, torchtitan 2c8b5947) and B200
    # (d8bb51f63, torchtitan 6fc499f6f): loss compiled, split root; SDPA's cuDNN backend on the B200 only
    assert len(TORCHAO) == 12
    for run_id, run in TORCHAO.items():
        tr, gpu = run.training, run_id.split("-")[4]
        assert tr.compile and tr.compile_loss is (gpu != "8xh100"), run_id
        assert tr.fsdp_split_root is (gpu != "8xh100"), run_id
        assert tr.sac_recomputes_attention is (gpu == "8xb200"), run_id
        assert tr.attention_backend == ("cudnn" if gpu == "8xb200" else "sdpa_flash"), run_id
        recipe = "mxfp8" if "mxfp8" in run_id else "rowwise" if "rowwise" in run_id else "tensorwise"
        assert (tr.precision, tr.fp8_recipe) == (("bf16", "tensorwise") if run_id.endswith("bf16") else ("fp8", recipe)), run_id


def test_torchao_h100_eager_loss_by_hand():
    # torchtitan@54ef42221 cross_entropy(pred.float()) uncompiled: fp32 logits kept (8192·128256·4 =
    # 4,202,692,608 bytes) and the backward's fp32 nll and log-softmax gradients, 8 bytes per logit
    # (8,405,385,216); at the loss the root (embedding 525,336,576 and output 525,340,672 parameters,
    # its final norm included) and the last layer stay gathered in bf16
    from cost_models.activations import head_activations
    job = TORCHAO["torchao-e2e-llama3-8b-8xh100-bf16"].job()
    b = memory_estimate(job).stages[0].breakdown
    assert head_activations(job).value("logits") == 4 * LLAMA3_8B_LOGITS == 4_202_692_608
    assert b.value("transient/loss_backward") == 8 * LLAMA3_8B_LOGITS
    assert b.value("buffers/unsharded_params") == 2 * (525_336_576 + 525_340_672 + LLAMA3_8B_LAYER)


def _without(run, **off):  # type: ignore[no-untyped-def]
    return memory_estimate(resolve(run.model, run.cluster, run.training.model_copy(update=off), run.layout)).stages[0].breakdown


def test_torchao_b200_cudnn_attention_recomputed_by_hand():
    # per-op SAC at torchtitan@6fc499f6f saves SDPA's flash and efficient outputs, not cuDNN's: per layer
    # the attention output (8192·4096·2 = 67,108,864) and its fp32 statistics (32 heads·8192·4 =
    # 1,048,576) are not kept, 32 layers: 2,181,038,080 bytes; the kernel runs again in backward
    run = TORCHAO["torchao-e2e-llama3-8b-8xb200-bf16"]
    kept = memory_estimate(run.job()).stages[0].breakdown.value("activations/layers")
    assert _without(run, sac_recomputes_attention=False).value("activations/layers") - kept == 32 * (8192 * 4096 * 2 + 32 * 8192 * 4)
    from cost_models.enums import Recompute
    from cost_models.flops import layer_flops
    job = run.job()
    f = layer_flops(job, next(iter(job.model.layer_kinds)), mode=Recompute.SELECTIVE)
    assert f.recompute_attention == f.forward_attention > 0


def test_torchao_b200_split_root_by_hand():
    # torchtitan@6fc499f6f wraps the embedding, each layer and [norm, output] as units of their own: in
    # the layers' backward only the current and the prefetched layer are gathered (2·2·218,112,000) with
    # one layer's bf16 gradient and fp32 copy (6·218,112,000); the root-held plan adds the gathered
    # embedding and output layer and the output layer's bf16 gradient. At the loss the [norm, output]
    # unit is the one gathered.
    run = TORCHAO["torchao-e2e-llama3-8b-8xb200-bf16"]
    split = memory_estimate(run.job()).stages[0].breakdown
    assert split.value("buffers/unsharded_params") == 2 * 2 * LLAMA3_8B_LAYER == 872_448_000
    assert split.value("buffers/unsharded_grads") == 6 * LLAMA3_8B_LAYER
    whole = _without(run, fsdp_split_root=False)
    assert whole.value("buffers/unsharded_params") - split.value("buffers/unsharded_params") == 2 * (525_336_576 + 525_340_672)
    assert whole.value("buffers/unsharded_grads") - split.value("buffers/unsharded_grads") == 2 * 525_340_672
    from cost_models.memory import loss_only_buffers
    assert loss_only_buffers(run.job(), 0) == 2 * 525_340_672
