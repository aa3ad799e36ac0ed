"""Kernel prices (cost_models.kernels) against published measurements that no constant was set from
(benchmarks/data/kernel_measurements.yaml, read through benchmarks/kernel_accuracy.py), and the
mechanisms the prices are built from."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))

import kernel_accuracy  # noqa: E402

from cost_models import compute  # noqa: E402
from cost_models import kernels as K  # noqa: E402
from cost_models.compute import FP8_CAST_BYTES  # noqa: E402
from cost_models.enums import AttentionBackend, Precision  # noqa: E402
from helpers import make_job  # noqa: E402
from planner import presets  # noqa: E402

CHECKS = kernel_accuracy.checks()
GPUS = presets.gpus()


def _of(kind: str) -> list[kernel_accuracy.Check]:
    return [c for c in CHECKS if c.kind == kind]


# --- GEMM ---------------------------------------------------------------------------------------


def test_gemms_the_presets_do_not_anchor_on_are_priced_from_their_shape():
    gemms = _of("gemm")
    assert len(gemms) == 19
    # median within 5%: the anchors themselves scatter by 2-3% around the model (gpus.toml)
    assert statistics.median(abs(c.error) for c in gemms) <= 0.05
    # large GEMMs (every dimension >= 4096) within 8%: the largest miss, GB200 fp8 4096^3 (-7.8%),
    # runs 256 tiles on 148 SMs, where cuBLAS's kernel choice matters most
    large = [c for c in gemms if min(int(x) for x in c.what.split()[-1].split("x")) >= 4096]
    assert len(large) == 7
    assert all(abs(c.error) <= 0.08 for c in large), [(c.what, round(c.error, 3)) for c in large]
    # every shape within 30%: at 2048^3 (64 tiles of 256x256 outputs or 128 of 128x256 on 108-148
    # SMs) cuBLAS's split-K and stream-K kernels, which the tile model does not have, decide
    assert all(abs(c.error) <= 0.30 for c in gemms), [(c.what, round(c.error, 3)) for c in gemms]


def test_training_runs_gemms_at_the_sustained_clock():
    # H100 / H200 bf16: this project's GEMMs at the 700 W limit (benchmarks/data/measured): 8192^3
    # ran at 684.6 (H100) and 676.8 (H200) TFLOP/s after the burn-in; the ceiling is anchored on
    # those and on seven wgrad shapes at 16384 tokens, so pricing the cube must give its measured
    # rate back within 4% (the anchors spread from 649 to 697 on H100; the model's tile and wave
    # fill at the cube, 0.97, costs it 3.8% there). Both stay below the
    # best-shape figures, MAMF 794.5 burst and MSMF 755 sustained, which small GEMMs reach.
    h200, h100 = GPUS["H200"], GPUS["H100-SXM"]
    for gpu, measured in ((h100, 684.6e12), (h200, 676.8e12)):
        cube = 2 * 8192**3 / K.gemm_seconds(8192, 8192, 8192, 1, gpu, Precision.BF16, operand_bytes=2)
        assert cube == pytest.approx(measured, rel=0.04)
        assert K.tensor_core_ceiling(gpu, Precision.BF16) < 755e12 < K.burst_ceiling(gpu, Precision.BF16)
    # Blackwell: the B200's MSMF 1429 against its 1745 MAMF; the GB200 (no bf16 MSMF) takes the
    # sustained/burst ratio its own fp8 timings show (Azure's 10,000-warm-up cuBLASLt over MAMF)
    b200, gb200 = GPUS["B200"], GPUS["GB200"]
    assert K.sustained_ratio(b200) == pytest.approx(1429 / 1745)
    fp8_ratio = K.tensor_core_ceiling(gb200, Precision.FP8) / K.burst_ceiling(gb200, Precision.FP8)
    assert K.tensor_core_ceiling(gb200, Precision.BF16) == pytest.approx(1822e12 * fp8_ratio)
    assert 0.8 < fp8_ratio < 0.9


def test_a_500w_board_prices_its_gemms_at_the_rates_timed_at_its_limit():
    # FBGEMM's "H100 500W" bf16 timings (585.2, 575.1, 546.3 TFLOP/s at 8192^3, 65536x8192x7168 and
    # 65536x3584x8192) lie below the 700 W board's sustained 684.6 at 8192^3: they were timed at the
    # 500 W limit and anchor the training-step ceiling as they are, not derated again by the 700 W
    # board's sustained/burst ratio (0.94). Priced at those three shapes the model gives them back,
    # geometric mean within 1% (the anchor is their geometric mean over the model's shape factors; the
    # epilogue factor at each uses that timing's own rate), each within 6% (the three spread 7%)
    gpu = GPUS["H100-SXM-96GB-500W"]
    timed = {(8192, 8192, 8192): 585.23e12, (65536, 8192, 7168): 575.12e12, (65536, 3584, 8192): 546.31e12}
    ratios = [2 * m * n * k / K.gemm_seconds(m, n, k, 1, gpu, Precision.BF16, operand_bytes=2) / rate
              for (m, n, k), rate in timed.items()]
    assert statistics.geometric_mean(ratios) == pytest.approx(1.0, abs=0.01)
    assert all(r == pytest.approx(1.0, abs=0.06) for r in ratios)
    assert K.tensor_core_ceiling(gpu, Precision.BF16) < K.tensor_core_ceiling(GPUS["H100-SXM"], Precision.BF16)


@pytest.mark.parametrize("k, n, measured", [(512, 32768, 801), (2048, 7168, 1185), (16384, 7168, 1500)])
def test_short_k_gemms_lose_the_epilogue_that_deepgemm_shows(k, n, measured):
    # DeepGEMM PR 81 on H800 (H100 compute), fp8 with fine-grained scaling, M = 4096 (tiles
    # 256x128): the rate falls with K as each tile's store stops hiding behind its k loop. Relative
    # to K = 7168 (N 4096: 1377 TFLOP/s) the model's k/(k + k0) with k0 = 419 steps for fp8 on H100
    # follows the measured fall within 12% (DeepGEMM's own scaling kernels are not modelled).
    gpu = GPUS["H100-SXM"]

    def rate(kk: int, nn: int) -> float:
        return 2 * 4096 * nn * kk / K.gemm_seconds(4096, nn, kk, 1, gpu, Precision.FP8, operand_bytes=1)

    assert rate(k, n) / rate(7168, 4096) == pytest.approx(measured / 1377, rel=0.12)


# Azure/AI-benchmarking-guide "GEMM CuBLASLt" rows at 4096^3 and 16384^3 (ND H100 v5 @ae0b6a7f, ND H200
# v5 @7f20e5fa: fp8; ND A100 v4 @3bb66cac: fp16), run by superbench's cublaslt_gemm (microsoft/superbenchmark
# @089f0b91 superbench/benchmarks/micro_benchmarks/cublaslt_gemm/cublaslt_gemm.cu: TN, e4m3 inputs with an fp16
# output, launched back to back after the warm-ups).
@pytest.mark.parametrize("gpu, precision, small, large", [
    ("H100-SXM", Precision.FP8, 1216.9, 1377.3),
    ("H200", Precision.FP8, 1249.1, 1366.3),
])
def test_cublaslt_fp8_gains_with_size_as_much_as_its_unhidden_epilogue_predicts(gpu, precision, small, large):
    # In the ratio of the two rates the ceiling cancels: what is left is tile/wave fill, the launch
    # cost and k/(k + k0). Measured 16384^3 over 4096^3: H100 1377.3 / 1216.9 = 1.132, H200
    # 1366.3 / 1249.1 = 1.094; the model gives 1.124 and 1.100, and 1.048 and 1.047 with the
    # epilogue taken out (k0 = 0: fill 0.970 -> 0.993 and the 2.4 us launch only). So cuBLASLt's
    # Hopper fp8 kernels do not hide the output store behind the next tile's k loop at these
    # shapes; a free fit of k0 over Azure's five H100 fp8 rows gives 400 steps against the
    # model's 419. Within 3%: the two hypotheses lie 7% apart, and the Azure rows scatter about 1%
    # (H200's 32768^3 row is below its 16384^3 one).
    g = GPUS[gpu]

    def rate(s: int) -> float:
        return 2 * s**3 / K.gemm_seconds(s, s, s, 1, g, precision, operand_bytes=1)

    assert rate(16384) / rate(4096) == pytest.approx(large / small, rel=0.03)


def test_a100_cublas_loses_at_least_the_epilogue_the_model_gives_it():
    # Ampere's cuBLAS kernels run one CTA per tile, not persistently. Azure's A100 fp16 rows rise
    # from 228.0 (4096^3) to 256.5 TFLOP/s (16384^3), 1.125x; the model rises 1.081x (254.9 /
    # 235.7), its k/(k + k0) with k0 = 126 steps, against the 1.057x that tile/wave fill (0.948 ->
    # 0.998) and the launch give alone. A free fit of k0 over the four rows gives 340: the model's
    # short-K loss on A100 is a lower bound, never an overstatement.
    g = GPUS["A100-80GB"]

    def rate(s: int) -> float:
        return 2 * s**3 / K.gemm_seconds(s, s, s, 1, g, Precision.FP16, operand_bytes=2)

    assert 1.065 < rate(16384) / rate(4096) <= 256.5 / 228.0


def test_a_gemm_accumulating_into_its_output_reads_it_in_the_epilogue():
    # A100 fp16 at its sustained ceiling (257.4 TFLOP/s, gpus.toml's three Azure timings) and
    # 2.039 TB/s: a 16-bit store costs k0 = 2 x 257.4e12 / (2 x 2.039e12) = 126.3 k-steps; a wgrad
    # accumulating into fp16 main grads (beta = 1) reads and writes 2 + 2 bytes, k0 = 252.5. At
    # k = 2048 tokens (3072 x 9216 weight) the rate drops by (2048 + 126.3) / (2048 + 252.5) = 0.9451
    # and at k = 1024 by 1150.3 / 1276.5 = 0.9011; the ceiling is known to 4 digits, hence rel 1e-3
    gpu = GPUS["A100-80GB"]
    assert K.tensor_core_ceiling(gpu, Precision.FP16) == pytest.approx(257.4e12, rel=1e-3)
    for k, drop in ((2048, 0.9451), (1024, 0.9011)):
        plain = K.gemm_efficiency(3072, 9216, k, 1, gpu, Precision.FP16)
        accumulating = K.gemm_efficiency(3072, 9216, k, 1, gpu, Precision.FP16, out_bytes=4)
        assert accumulating / plain == pytest.approx(drop, rel=1e-3)


def test_fp8_layer_gemms_save_no_more_than_transformer_engine_measures_on_hopper():
    # Transformer Engine's GEMM profiling of a layer with hidden 4096, QKV 12288, FFN 16384 and
    # M = 31 x 512 = 15,872 tokens on H200 NVL, pre-quantized (GEMM kernels only): fprop + dgrad +
    # wgrad of the four linears take 31.968 ms in bf16 and 16.785 ms in fp8 (current scaling), a
    # ratio of 16.785 / 31.968 = 0.525 (NVIDIA/TransformerEngine@1609c890
    # docs/examples/gemm_profiling/gemm_profiling.rst, "Worked Example: 5B Model on H200"). The
    # model prices the same twelve GEMMs on H200 at 0.514, within 3%: the profile ran on the NVL
    # part, whose lower power limit slows both operand types but not necessarily alike. This
    # project's H200 SXM gives 0.50 at the wgrad shapes of 16384 tokens (bf16 666-680 TFLOP/s,
    # fp8 1309-1425; benchmarks/data/measured/h200-kernels-2026-11-27.json).
    gpu, m = GPUS["H200"], 31 * 512

    def layer(p: Precision) -> float:
        operand = 1 if p is Precision.FP8 else 2
        total = 0.0
        for k, n in ((4096, 12288), (4096, 4096), (4096, 16384), (16384, 4096)):
            for a, b, c in ((m, n, k), (m, k, n), (k, n, m)):  # fprop, dgrad, wgrad as (m, n, k)
                total += K.gemm_seconds(a, b, c, 1, gpu, p, operand_bytes=operand)
        return total

    ratio, measured = layer(Precision.FP8) / layer(Precision.BF16), 16.785 / 31.968
    assert ratio == pytest.approx(measured, rel=0.03)


def test_wave_quantisation_makes_one_extra_tile_cost_a_wave():
    # 132 SMs: 132 tiles of 128x256 fill one wave. One more output row needs 143 such tiles (a
    # second, nearly empty wave); the best the library can do is 286 tiles of 128x128 in three
    # waves (0.72 full, rows padded to 1664): two thirds of the rate
    gpu = GPUS["H100-SXM"]
    one = K.gemm_efficiency(128 * 12, 256 * 11, 8192, 1, gpu, Precision.BF16)
    two = K.gemm_efficiency(128 * 12 + 1, 256 * 11, 8192, 1, gpu, Precision.BF16)
    assert two / one == pytest.approx((286 / 396) * (1537 / 1664), rel=0.01)


# --- attention ----------------------------------------------------------------------------------


def test_attention_of_a_long_sequence_matches_transformer_engines_benchmark():
    # TE's notebook at 8k tokens, 32 heads (causal, hdim 128): the FA2 backend within 10%
    [c] = [c for c in _of("attention") if "s8192" in c.what]
    assert abs(c.error) <= 0.10


def test_cudnn_attention_beats_flash_attention_2_on_hopper_by_the_measured_ratio():
    # TE's notebook on H100: cuDNN / flash-attn fwd+bwd 1.60 at 2k and 1.59 at 8k (causal, hdim 128);
    # "cuDNN attention has 20-50% advantages on Hopper"
    gpu = GPUS["H100-SXM"]
    for heads, seq, measured in ((16, 2048, 0.5850 / 0.3664), (32, 8192, 11.8879 / 7.4875)):
        shape = dict(batch=2, heads=heads, head_dim=128, seq=seq, causal=True)
        cudnn = kernel_accuracy.attention_fwd_bwd_seconds(gpu, AttentionBackend.CUDNN, **shape)
        fa2 = kernel_accuracy.attention_fwd_bwd_seconds(gpu, AttentionBackend.FA2, **shape)
        assert fa2 / cudnn == pytest.approx(measured, rel=0.10)


def test_a_short_key_loop_runs_at_a_lower_rate():
    # a context-parallel step runs its own, shorter key loop: FA2's H100 curve at 1k is 0.72 of 8k
    # (causal hdim 128 forward 260 vs 333 TFLOP/s at 16k tokens per batch)
    gpu = GPUS["H100-SXM"]
    rate = {k: K.attention_rate(gpu, AttentionBackend.FA2, K.Pass.FORWARD, causal=True, head_dim=128, q_len=k, k_len=k,
                                batch_heads=16384 // k * 16) for k in (1024, 8192)}
    assert rate[1024] / rate[8192] == pytest.approx(260 / 333, rel=0.01)


def test_sdpa_flash_forward_runs_at_the_measured_rate_at_a_measured_point():
    # this project's H100 timing of SDPA's flash backend, causal hdim 128 at 4096 tokens, b4 x 16 heads:
    # 4·64·4096²·128/2 = 274.9 GFLOP in 0.89288 ms = 307.86 TFLOP/s, stored as 308
    # ([attention.sdpa_flash]); at the burst clock the benchmark ran at, on the reference GPU itself
    # compute_scale x isolated_scale = 1, and the shape is the benchmark's own (wave fill ratio 1). rel
    # 0.3%: the stored rate's rounding (0.05%) and the kernel's 2.4 us start-up (0.27%)
    gpu = GPUS["H100-SXM"]
    s = compute.attention_seconds(gpu, AttentionBackend.SDPA_FLASH, K.Pass.FORWARD, causal=True, head_dim=128, q_len=4096,
                                  k_len=4096, batch_heads=4 * 16, rate_scale=K.isolated_scale(gpu))
    assert s == pytest.approx(4 * 64 * 4096**2 * 128 / 2 / 307.86e12, rel=0.003)
    # the flash-attn package's FA2 curve at the same point: 319 TFLOP/s, 3.6% faster
    fa2 = compute.attention_seconds(gpu, AttentionBackend.FA2, K.Pass.FORWARD, causal=True, head_dim=128, q_len=4096,
                                    k_len=4096, batch_heads=4 * 16, rate_scale=K.isolated_scale(gpu))
    assert s / fa2 == pytest.approx(319 / 308, rel=0.001)


@pytest.mark.parametrize(("cluster", "family"), [
    ("dgx-h100", AttentionBackend.SDPA_FLASH),  # measured on Hopper
    ("dgx-a100-80gb", AttentionBackend.FA2),  # no Ampere timing: flash-attn's A100 curve of the same kernels
    ("dgx-b200", AttentionBackend.CUDNN),  # no FA2 curve on Blackwell: the family SDPA prefers there
])
def test_a_torchtitan_job_on_sdpa_flash_is_priced_by_the_generations_curve(cluster, family):
    job = make_job("llama-3.1-8b", cluster=cluster, training=dict(framework="torchtitan", seq_len=4096, global_batch_size=64,
                                                               attention_backend="sdpa_flash"), tp=1, pp=1, mbs=1)
    assert compute.attention_backend(job) is family


def test_small_attention_kernels_are_priced_optimistically_and_this_is_known():
    # TE's 512- and 2k-token cases take 34-586 µs: per-kernel start-up and the causal tail of few
    # thread blocks, which the curves (measured at 16k tokens per batch) do not carry. The model is
    # optimistic there, never pessimistic by more than 5%, except cuDNN's non-causal hdim-64
    # 512-token case: no non-causal cuDNN backward is measured at hdim 64, and the causal one this
    # project measured (140 TFLOP/s at 512 tokens, diagonal blocks dominating) prices it, 27% slow.
    small = [c for c in _of("attention") if "s8192" not in c.what]
    assert all(-0.05 <= c.error <= 0.35 for c in small if "cudnn b2 h16 d64 s512" not in c.what), [(c.what, round(c.error, 3)) for c in small]
    assert all(-0.30 <= c.error <= 0.35 for c in small), [(c.what, round(c.error, 3)) for c in small]


# --- memory-bound kernels -------------------------------------------------------------------------


def test_a_fused_norm_runs_at_the_measured_fraction_of_hbm():
    # Liger's RMSNorm forward on A100, 2048 rows: the fused-norm fraction was set from the same
    # database's LayerNorm rows at 4096 rows, so these are held out. Within 15%: the largest miss
    # (+14%, hidden 8192) is the shortest kernel, 52 µs, where the fixed start-up weighs most.
    fused = [c for c in _of("memory-bound") if " fused " in c.what]
    assert len(fused) == 3
    assert all(abs(c.error) <= 0.15 for c in fused), [(c.what, round(c.error, 3)) for c in fused]


# --- torchao rowwise float8 linears ----------------------------------------------------------------


def test_a_rowwise_linear_costs_what_the_block_speedup_leaves_after_the_norm_and_sigmoid():
    # torchao's H100 grid, M 16384, K 8192, N 8192: the LN -> Linear -> Sigmoid block runs 1.33x
    # faster in fp8 rowwise. Its bf16 GEMMs on H100 SXM (sustained ceiling 697.45 TFLOP/s, epilogue
    # k0 = 2·697.45/(2·3.35) = 208.2 steps): forward and dgrad 128x128 tiles, 8192 on 132 SMs in 63
    # waves (0.9851) x 8192/8400.2 = 0.9607, 2.199e12 FLOP each in 3.282 ms; wgrad (M = K 8192,
    # k = 16384) 0.9697 x 16384/16592.2 = 0.9575, 3.293 ms; 9.864 ms with three 2.4 µs starts.
    # LN and sigmoid move 10 B x 16384 x (8192 + 8192) = 2.684 GB at 0.90 x 3.35 TB/s = 0.890 ms,
    # plus four starts: 0.900 ms, so o = 0.0912 and r = (1 + o)/1.33 - o = 0.7292 (0.2%: the
    # rounding of the hand arithmetic)
    h100 = GPUS["H100-SXM"]
    assert K.rowwise_linear_ratio(h100, 16384, 8192, 8192) == pytest.approx(0.7292, rel=2e-3)
    # the linear alone gains more than the block shows where fp8 wins, and loses more where it
    # loses (block 0.52 at M 8192, K 4096, N 1024: the linear takes more than 1/0.52 of bf16)
    assert K.rowwise_linear_ratio(h100, 16384, 8192, 8192) < 1 / 1.33
    assert K.rowwise_linear_ratio(h100, 8192, 4096, 1024) > 1 / 0.52


def test_a_tensorwise_linear_priced_from_fp8_gemms_and_casts_matches_torchaos_block_speedup():
    # torchao's README gives the tensorwise LN -> Linear -> Sigmoid block (fwd + bwd, compiled, H100)
    # at M, K, N = 4096, 8192, 16384 a 1.39x speedup over bf16 (pytorch/ao@fdddb2cf
    # torchao/float8/README.md L146-148; speedup as float8_roofline.py L278-280 defines it). Priced
    # bottom-up as the tensorwise runs are, three fp8 GEMMs plus the casts compute.fp8_cast_bytes
    # counts outside float8_tp (5 bytes an element: input and weight forward, grad_output twice,
    # weight and input backward), against three bf16 GEMMs and the block's LN and sigmoid (as for
    # rowwise): 1.35x, 3% under the measurement (rel 0.05: one published point, read to 2 digits).
    h100 = GPUS["H100-SXM"]
    m, k, n = 4096, 8192, 16384
    gemms = ((m, n, k), (m, k, n), (k, n, m))  # forward, dgrad, wgrad as (m, n, k)
    bf16 = sum(K.gemm_seconds(a, b, c, 1, h100, Precision.BF16, operand_bytes=2) for a, b, c in gemms)
    fp8 = sum(K.gemm_seconds(a, b, c, 1, h100, Precision.FP8, operand_bytes=1) for a, b, c in gemms)
    casts = K.memory_seconds(FP8_CAST_BYTES * ((m * k + k * n) + (2 * m * n + k * n + m * k)), h100)
    block = K.memory_seconds(K.ROWWISE_BLOCK_BYTES * m * (k + n), h100, launches=K.ROWWISE_BLOCK_KERNELS)
    assert (block + bf16) / (block + fp8 + casts) == pytest.approx(1.39, rel=0.05)


def test_a_rowwise_linear_outside_the_grid_is_read_at_its_edge():
    # Llama 3 8B at tp 8 with 12 x 8192 tokens: wk and wv are (98304 x 4096)·(4096 x 128), past the
    # grid's largest M (32768) and below its smallest N (1024); no extrapolation either way
    h100 = GPUS["H100-SXM"]
    assert K.rowwise_linear_ratio(h100, 98304, 4096, 128) == K.rowwise_linear_ratio(h100, 32768, 4096, 1024)
    # a GPU of a generation without its own grid reads Hopper's
    assert K.table_for(GPUS["B200"]).rowwise is None
    assert K.rowwise_linear_ratio(GPUS["B200"], 8192, 8192, 8192) == K.rowwise_linear_ratio(h100, 8192, 8192, 8192)


def test_unfused_attention_batched_gemms_read_the_a100_curve_by_head_dim():
    # Anthony et al. 2024 Fig. 7 on A100 (presets/kernels/ampere.toml): the key-query GEMM at d = 64
    # and 96 reads 58.8 and 92.1 TFLOP/s, attention over values 80.5 and 108.0; d = 80 lies halfway,
    # 75.45 and 94.25, each at A100-80GB's sustained compute over the benchmark's (compute_scale)
    gpu = GPUS["A100-80GB"]
    scale = K.compute_scale(gpu)
    assert K.eager_bmm_rate(gpu, 64, reduces_head_dim=True) == pytest.approx(58.8e12 * scale, rel=1e-12)
    assert K.eager_bmm_rate(gpu, 80, reduces_head_dim=True) == pytest.approx(75.45e12 * scale, rel=1e-12)
    assert K.eager_bmm_rate(gpu, 80, reduces_head_dim=False) == pytest.approx(94.25e12 * scale, rel=1e-12)
    assert K.eager_bmm_rate(gpu, 256, reduces_head_dim=False) == pytest.approx(216.9e12 * scale, rel=1e-12)
    # outside the measured head dims (32-256), and on a generation without a curve, the GEMM model prices it
    assert K.eager_bmm_rate(gpu, 16, reduces_head_dim=True) is None
    assert K.eager_bmm_rate(gpu, 512, reduces_head_dim=True) is None
    assert K.eager_bmm_rate(GPUS["H100-SXM"], 128, reduces_head_dim=True) is None


def test_unfused_attention_gemms_take_their_curve_by_role_even_when_a_side_equals_the_head_dim():
    # 128 tokens, head dim 128, 8 heads on A100: every GEMM has k = 128, yet only the forward QKᵀ
    # ("scores") and the backward's dP = dO·Vᵀ ("context.dgrad") reduce over the head dimension
    # (Fig. 7a, 105.5 TFLOP/s); PV and the other backward GEMMs read Fig. 7b (137.7). Each:
    # 2 x 128^3 x 8 FLOP / rate + the 2.6 us launch (gemm_scale 1 in the default calibration)
    from cost_models.calibration import DEFAULT
    from cost_models.compute import backward_gemms, eager_bmm_seconds
    from cost_models.flops import Gemm
    from tests.helpers import LLAMA_TINY, make_job

    job = make_job(LLAMA_TINY, gpus=1, cluster="dgx-a100-80gb", training=dict(seq_len=128, attention="eager"))
    scale = K.compute_scale(job.cluster.gpu)
    scores, context = Gemm("scores", 128, 128, 128, 8), Gemm("context", 128, 128, 128, 8)
    flop = 2 * 128**3 * 8
    for g, tflops in ((scores, 105.5), (context, 137.7), *zip(backward_gemms(scores), (137.7, 137.7)),
                      *zip(backward_gemms(context), (105.5, 137.7))):
        assert eager_bmm_seconds(job, g, 128, DEFAULT) == pytest.approx(flop / (tflops * 1e12 * scale) + 2.6e-6, rel=1e-12), g.name
