"""The emitted job really implements each layout: multi-process gloo runs on CPU (2 and 4 ranks)
train the same model on the same batches as a single-process reference, and each rank holds exactly
the parameter, gradient and optimizer bytes the memory model predicts.

Each batch of layouts runs in one torchrun job (the worker runs them in order), so torch is
imported and the ranks rendezvous once per world size.
"""

from __future__ import annotations

import json

import pytest
import torch

from cost_models.model_spec import ModelSpec, MoESpec
from planner.loaders import load_model
from planner.validate import worker
from planner.validate.compare import check_states, measure
from planner.validate.runner import emit, launch
from planner import presets
from planner.validate.slices import Slice, job_doc, native_job, run_doc
from tests.helpers import make_job

TINY = load_model("tests/data/validate/tiny-llama.toml")
# every second layer MoE: 4 experts of width 64, top-2
TINY_MOE = TINY.model_copy(update={"name": "tiny-moe", "moe": MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=64, layer_freq=2)})
# GPT-2's family: LayerNorm, GELU, learned positions, biases everywhere, tied embeddings
TINY_GPT = ModelSpec(name="tiny-gpt", num_layers=2, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4, vocab_size=128,
                     max_position_embeddings=64, tie_embeddings=True, mlp="gelu", norm="layernorm", position_embedding="learned",
                     qkv_bias=True, out_bias=True, mlp_bias=True)
# Gemma 2's layer: sliding window of 8 on even layers, soft-capped scores and logits, four (1 + w)
# RMSNorms, gated GELU-tanh, scaled and tied embedding; with GPT-OSS's attention sinks
TINY_GEMMA = ModelSpec.model_validate({**TINY.model_dump(),
    "name": "tiny-gemma", "mlp": "geglu", "tie_embeddings": True, "sliding_window": 8, "full_attention_every": 2,
    "attn_logit_softcap": 50.0, "final_logit_softcap": 30.0, "query_pre_attn_scalar": 16, "sandwich_norms": True,
    "zero_centered_norm": True, "scale_embedding": True, "attention_sinks": True})
# Llama 4's: chunks of 8 on three layers in four, the fourth full without rope; with sandwich norms
# (their SequenceParallel placement under tp + sp)
TINY_CHUNKED = ModelSpec.model_validate({**TINY.model_dump(), "name": "tiny-chunked", "attention_chunk_size": 8, "full_attention_every": 4,
                                         "nope_full_layers": True, "sandwich_norms": True})
# DeepSeek-V3's family: multi-head latent attention (query bottleneck, d_qk 24 against d_v 16), a dense
# first layer, then MoE layers with a shared expert and the sigmoid router, renormalised and scaled
TINY_MLA = ModelSpec(name="tiny-mla", num_layers=4, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, vocab_size=128,
                     max_position_embeddings=256,
                     mla={"q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16},
                     moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=32, num_shared_experts=1, first_k_dense=1,
                                 router_score="sigmoid", routed_scaling_factor=2.5, expert_bias=True))
# Nemotron-4's family: squared-ReLU MLP, LayerNorm1P (as LayerNorm in the worker: the same parameters), GQA
TINY_NEMOTRON = ModelSpec(name="tiny-nemotron", num_layers=2, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4,
                          num_kv_heads=2, vocab_size=128, max_position_embeddings=256, mlp="squared_relu", norm="layernorm",
                          zero_centered_norm=True)
# Nemotron-H's family: Mamba-2, attention and MLP layers (M*-M-*), chunked SSD scan over 4 chunks
TINY_HYBRID = load_model("tests/data/validate/tiny-nemotron-h.toml")
# Nemotron 3's kinds: E (MoE) layers among Mamba, attention and MLP ones, 4 sigmoid-routed experts
# (renormalised, scaled 2.5, with a correction bias) and a shared expert
TINY_HYBRID_MOE = ModelSpec.model_validate({
    **TINY_HYBRID.model_dump(), "name": "tiny-nemotron-h-moe", "hybrid_pattern": "M*EM-E",
    "moe": {"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 32, "num_shared_experts": 1,
            "shared_expert_ffn_hidden_size": 64, "router_score": "sigmoid", "routed_scaling_factor": 2.5, "expert_bias": True}})
TRAINING = {"framework": "torchtitan", "seq_len": 32, "global_batch_size": 8}
STEPS, WARMUP, LR = 1, 1, 1e-3  # two optimizer steps; the profiler is on for PROFILED runs only (tests/test_validate.py runs it)

# Tolerances, fp32 on CPU. Loss: the parallel run sums the same products in another order
# (sharded matmuls, micro-batch accumulation, reductions over ranks); observed differences are
# <= 5e-7 on a loss of 4.85, and 1e-5 is 20x that. First-step gradients: each tensor's max
# difference relative to its largest element, observed <= 1.1e-6, with a floor of 1e-4 for the
# element scale: the key bias's true gradient is zero (softmax ignores a constant added to every
# score of a row), so its ~1e-11 rounding residues have no scale of their own. Weights after 2 AdamW steps:
# Adam moves every element by about lr = 1e-3 whatever the gradient's scale, so a wrong shard or a
# missing reduction shows at 1e-4..1e-3, while rounding matters only where |g| is near Adam's eps
# (1e-8): there the first update is lr·g/(|g| + eps), so a rounding difference δg moves it by up
# to lr·δg/eps. Observed <= 4.8e-6 on one CPU and 2.6e-5 on another (chunked_tp_sp's
# layers.1.mlp.w2, whose gradients sum in another order there); bound 5e-5 (5% of lr), half the
# smallest error a wrong shard makes. Gradient scaling errors, which Adam would hide, are caught by
# the gradient check.
LOSS_TOL, GRAD_REL_TOL, WEIGHT_TOL = 1e-5, 1e-5, 5e-5


def _job(model=TINY, gpus=2, **layout):
    return make_job(model, gpus=gpus, training=TRAINING, **layout)


def _native(model, gpus=2, **layout):
    """The job as validate resolves it: torchtitan's rules less those the worker's own modules lift
    (a hybrid model, which torchtitan has no module for)."""
    return native_job(model, presets.clusters()["dgx-h100"], gpus, TRAINING, layout)[0]


# The layouts of one axis each that tests/test_validate_grid.py also runs (ep, FSDP over a tied
# embedding, FSDP x TP, interleaved stages, HSDP) are left to the grid; these are the named
# regressions, the model families and the cases other tests here read.
RUNS_2 = {
    "dp": _job(zero=0, mbs=2),  # DDP, 2 micro-batches of gradient accumulation
    "fsdp": _job(zero=3, mbs=2, recompute="full", recompute_layers=2),  # FSDP2, 2 of 4 layers checkpointed
    "tp_sp": _job(tp=2, recompute="selective"),  # tensor + sequence parallel, torchtitan's per-op selective recompute
    "pp_1f1b": _job(pp=2, mbs=2),  # 2 stages, 4 micro-batches
    "pp_layout": _job(pp=2, mbs=2, pp_layout="Et|tttL"),  # Megatron's layout grammar: 1 layer, then 3
    "cp": _job(cp=2),  # ring attention over 2 ranks
    "gemma_fsdp": _job(TINY_GEMMA, zero=3),  # sliding window, soft-capping, sinks, sandwich norms under FSDP2
    "chunked_tp_sp": _job(TINY_CHUNKED, tp=2),  # chunked and NoPE layers, sandwich norms under tensor + sequence parallel
    "mla_ep": _job(TINY_MLA, ep=2),  # MLA layers and sigmoid-routed experts over 2 ranks, FSDP over the same 2
    "nemotron_fsdp": _job(TINY_NEMOTRON, zero=3),
    "hybrid_fsdp": _native(TINY_HYBRID, zero=3, recompute="full", recompute_layers=3),  # Mamba-2 under FSDP2, 3 of 6 layers checkpointed
    "hybrid_pp": _native(TINY_HYBRID, pp=2, mbs=2),  # a Mamba layer on each side of the pipeline cut
    "hybrid_ep": _native(TINY_HYBRID_MOE, ep=2),  # E layers' experts over 2 ranks, FSDP over the same 2
}
# bf16 as asked (not --fp32): a pipeline without data parallelism, and DDP, both cast by autocast in
# the stage
RUNS_2_BF16 = {
    "pp_bf16": _job(pp=2, mbs=2),
    "dp_bf16": _job(zero=0, mbs=2),
}
# built on the meta device and allocated by to_empty, as every run without `check` is (the timing
# runs on a GPU): the tied embedding must stay one parameter there too, without FSDP (DDP's
# materialisation is the one-rank path's) and under FSDP2
RUNS_2_META = {
    "gpt_dp_meta": _job(TINY_GPT, zero=0),
    "gpt_fsdp_meta": _job(TINY_GPT, zero=3),
}
PROFILED = {"cp"}  # the ring's trace: test_ring_transfers_overlap_the_attention_steps
RUNS_4 = {
    "pp_layout_empty_ends": _job(gpus=4, pp=2, pp_layout="E|tt|tt|L"),  # vpp 2 from the layout; chunks without decoder layers
    "tp_cp": _job(gpus=4, tp=2, cp=2),  # TP 2 x ring attention over 2, FSDP over cp: one mesh for both
}


def _batch(tmp_path_factory, name: str, runs: dict, nproc: int, bf16: dict | None = None, meta: dict | None = None):
    out = tmp_path_factory.mktemp(name)
    # a profiled run also times a step without the profiler first, as validate does on GPUs
    docs = [run_doc(job, name=n, steps=STEPS, warmup=WARMUP, fp32=True, check=True, lr=LR, profile=n in PROFILED,
                    unprofiled_steps=int(n in PROFILED)) for n, job in runs.items()]
    docs += [run_doc(job, name=n, steps=STEPS, warmup=WARMUP, fp32=False, check=False, lr=LR, profile=False) for n, job in (bf16 or {}).items()]
    docs += [run_doc(job, name=n, steps=STEPS, warmup=WARMUP, fp32=True, check=False, lr=LR, profile=False) for n, job in (meta or {}).items()]
    emit(out, job_doc(docs, backend="gloo", device="cpu", step_timeout_s=60))
    result = launch(out, nproc, timeout_s=240, step_timeout_s=60)
    assert result.ok, result.cause
    return out, {d["name"]: d for d in docs}, result


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    return _batch(tmp_path_factory, "two", RUNS_2, 2, RUNS_2_BF16, RUNS_2_META)


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    return _batch(tmp_path_factory, "four", RUNS_4, 4)


_REFERENCES: dict[str, dict] = {}


def _reference(run: dict) -> dict:
    key = json.dumps({k: run[k] for k in ("model", "global_batch", "seq_len", "steps", "warmup", "unprofiled_steps", "seed",
                                          "optimizer")}, sort_keys=True)
    if key not in _REFERENCES:
        _REFERENCES[key] = worker.reference(run)
    return _REFERENCES[key]


def _check(batch, name: str, jobs: dict):
    out, docs, result = batch
    run = docs[name]
    ref = _reference(run)
    ranks = result.results[name]
    saved = {}
    for f in sorted((out / name).glob("check_pp*.pt")):
        saved.update({kind: {**saved.get(kind, {}), **d} for kind, d in torch.load(f).items()})
    # every rank reports the same global loss, equal to the reference's at every step
    for r in ranks:
        assert r["losses"] == pytest.approx(ref["losses"], abs=LOSS_TOL), (name, r["rank"])
    assert set(saved["params"]) == set(ref["params"]), name  # the stages together hold the whole model
    for n, want in ref["grads"].items():
        got = saved["grads"][n]
        assert got.shape == want.shape, (name, n)
        assert (got - want).abs().max() <= GRAD_REL_TOL * want.abs().max().clamp_min(1e-4), (name, n)
    for n, want in ref["params"].items():
        assert (saved["params"][n] - want).abs().max() <= WEIGHT_TOL, (name, n)
    # exact state bytes on every rank
    job = jobs[name]
    states = check_states(Slice(job, job, "full", "", ()), measure(ranks))
    assert states.ok, states.mismatches


@pytest.mark.parametrize("name", list(RUNS_2))
def test_two_ranks_train_like_one_process(two, name):
    _check(two, name, RUNS_2)


@pytest.mark.parametrize("name", list(RUNS_4))
def test_four_ranks_train_like_one_process(four, name):
    _check(four, name, RUNS_4)


def test_states_are_sharded_as_the_layout_says(two, four):
    """The exact-bytes check has teeth: FSDP halves what DDP holds, tp=2 holds half of every matrix
    but whole norms, and each pipeline stage holds its own layers (arithmetic in the comments)."""
    b = {name: batch[2].results[name][0]["state_bytes"] for batch, runs in ((two, RUNS_2), (four, RUNS_4)) for name in runs}
    # tiny-llama: embedding and output 128x64 each, 4 layers x (q 64x64, k/v 32x64 each, o 64x64,
    # gate/up/down 3x64x128, 2 norms of 64), final norm 64: 16,384 + 4 x 36,992 + 64 = 164,416
    # parameters, 4 bytes each in fp32
    params = 2 * 128 * 64 + 4 * (64 * 64 + 2 * 32 * 64 + 64 * 64 + 3 * 64 * 128 + 2 * 64) + 64
    assert b["dp"]["weights"] == 4 * params
    assert b["fsdp"]["weights"] == 4 * params // 2
    assert b["dp"]["optimizer_states"] == 2 * 4 * params  # AdamW: exp_avg and exp_avg_sq in fp32
    norms = 4 * 2 * 64 + 64  # replicated over tp
    assert b["tp_sp"]["weights"] == 4 * ((params - norms) // 2 + norms)


def test_tied_embedding_is_one_parameter_when_built_on_meta(two):
    """A tied output layer shares the embedding's parameter in the runs built on the meta device,
    whose modules to_empty allocates one by one: one matrix of weights, gradients and optimizer
    state, as the memory model counts."""
    _, _, result = two
    # tiny-gpt: embedding 128x64 (the output layer's too), positions 64x64, 2 layers x (2 LayerNorms
    # 2x64, qkv 3x(64x64 + 64), out 64x64 + 64, fc1 64x256 + 256, fc2 256x64 + 64) = 2 x 49,984, final
    # LayerNorm 128: 8,192 + 4,096 + 99,968 + 128 = 112,384 parameters, 4 bytes each in fp32; an
    # untied output layer would add 128x64
    params = 128 * 64 + 64 * 64 + 2 * (2 * 128 + 3 * (64 * 64 + 64) + 64 * 64 + 64 + 64 * 256 + 256 + 256 * 64 + 64) + 128
    b = {name: result.results[name][0]["state_bytes"] for name in RUNS_2_META}
    assert b["gpt_dp_meta"]["weights"] == 4 * params
    assert b["gpt_dp_meta"]["optimizer_states"] == 2 * 4 * params
    assert b["gpt_fsdp_meta"]["weights"] == 4 * params // 2
    for name, job in RUNS_2_META.items():
        states = check_states(Slice(job, job, "full", "", ()), measure(result.results[name]))
        assert states.ok, (name, states.mismatches)


def test_bf16_is_computed_in_bf16_on_every_path(two):
    """Every dense GEMM (nn.Linear call) of the first step runs in bf16 when bf16 is asked, with a
    pipeline too (whose schedule calls the stages itself, outside any context around the step), and
    in fp32 under --fp32; the bf16 runs still train the same model as the fp32 reference."""
    _, docs, result = two
    for name in RUNS_2_BF16:
        assert docs[name]["dtype"] == "bfloat16"
        for r in result.results[name]:
            assert set(r["linear_dtypes"]) == {"bfloat16"}, (name, r["rank"], r["linear_dtypes"])
    for r in result.results["pp_1f1b"]:
        assert set(r["linear_dtypes"]) == {"float32"}, (r["rank"], r["linear_dtypes"])
    # The same computation in bf16 by two paths: before any update the pipeline's loss and DDP's
    # differ only by the order bf16 partial results are summed (observed 0.0021 on a loss of 4.87,
    # bound 0.005), while bf16 against fp32 differs by more (observed 0.019 and 0.021 at step 0),
    # which is what a pipeline computing in fp32 would show. Each bf16 run stays within 0.05 of the
    # fp32 reference at every step (observed <= 0.021): a bound on bf16 rounding only; wrong training
    # of these layouts is caught by their fp32 runs above (pp_1f1b, dp).
    ref = _reference(docs["pp_1f1b"])
    pp, dp = result.results["pp_bf16"][0]["losses"], result.results["dp_bf16"][0]["losses"]
    assert abs(pp[0] - dp[0]) <= 0.005, (pp, dp)
    for name in RUNS_2_BF16:
        for r in result.results[name]:
            assert r["losses"] == pytest.approx(ref["losses"], abs=0.05), (name, r["rank"], r["losses"], ref["losses"])


def test_ring_transfers_overlap_the_attention_steps(two):
    """Ring attention issues the next K/V block's transfer before the current block's flash kernel
    and waits for it after (torch's context parallel order): in rank 0's trace of the cp run, every
    flash call but each pass's last is preceded by a cp_ring span (the issue) that began before it
    and followed by one (the wait) that begins after it ends. A ring that exchanged blocks
    synchronously would issue and wait inside one span before the kernel. cp = 2: per layer and
    pass, issue, flash, wait, flash."""
    out, _, _ = two
    events = json.loads((out / "cp" / "trace_rank0.json").read_text())["traceEvents"]
    main = [e for e in events if e.get("ph") == "X" and (
        e.get("name") == "cp_ring" or str(e.get("name", "")).startswith("aten::_scaled_dot_product_flash_attention_for_cpu"))]
    seq = [("ring" if e["name"] == "cp_ring" else "bwd" if e["name"].endswith("backward") else "fwd", e["ts"], e["ts"] + e["dur"])
           for e in sorted(main, key=lambda e: e["ts"])]
    fwd = [x for x in seq if x[0] != "bwd"]
    kinds = [k for k, _, _ in fwd]
    # the forward of 4 layers: (ring issue, flash, ring wait, flash) each
    assert "".join(k[0] for k in kinds[:4]) == "rfrf", kinds[:8]
    for i in range(0, 4 * 4, 4):
        issue, first, wait, second = fwd[i : i + 4]
        assert issue[1] <= first[1] and first[2] <= wait[1] <= second[1], fwd[i : i + 4]


def test_profiled_run_times_steps_without_the_profiler_first(two):
    """The cp run (one unprofiled step, as validate runs on GPUs): each rank times that step apart
    from the STEPS profiled ones, its trace's split covers only the profiled steps, and its losses,
    equal to the reference's at every step above, cover warm-up, unprofiled and profiled steps."""
    _, docs, result = two
    assert docs["cp"]["unprofiled_steps"] == 1
    for r in result.results["cp"]:
        assert len(r["unprofiled_step_times_s"]) == 1 and len(r["step_times_s"]) == STEPS
        assert len(r["split"]["steps"]) == STEPS and len(r["losses"]) == WARMUP + 1 + STEPS
    assert all(r["unprofiled_step_times_s"] == [] for r in result.results["tp_sp"])
