"""AMD CDNA3 (MI300X): its kernel table, hand-worked kernel prices from the cited figures, RCCL's
measured bus bandwidth, and the CLI on the mi300x-8 preset."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cost_models import kernels as K
from cost_models.enums import AttentionBackend, Precision
from planner import presets
from planner.cli import app
from tests.helpers import make_job

MI300X = presets.gpus()["MI300X"]
H100 = presets.gpus()["H100-SXM"]


def test_the_cdna3_table_loads_with_the_rocm_families_only():
    t = K.table_for(MI300X)
    assert (t.architecture, t.reference_gpu) == ("cdna3", "MI300X")
    # SDPA's flash backend (AOTriton) and flash-attn's ROCm build; no cuDNN, FA3 or FA4 on ROCm
    assert set(t.attention) == {AttentionBackend.SDPA_FLASH, AttentionBackend.FA2}
    # BabelStream's triad streamed 4.09 TB/s on one MI300X (Azure ND MI300X v5): a memory-bound kernel
    # moving 4.09 TB takes a second (the table keeps 4.09 / 5.3 = 0.7717 as 0.77: 0.2%, so 0.5%); and a
    # thousand back-to-back empty kernels 1000 x 1956 ns (MI210's gpu-small-kernels fit, a = 1956 ns,
    # stands in; kept as 2.0 us: 3%)
    assert K.memory_seconds(4.09e12, MI300X) == pytest.approx(1.0, rel=0.005)
    assert K.memory_seconds(0, MI300X, launches=1000) == pytest.approx(1000 * 1956e-9, rel=0.03)
    # an op with no MI300X figure runs at the share of a streaming kernel's rate it reaches on the H100
    # (cdna3.toml ops_from = "hopper"): every H100 op is there, each at the H100's fraction times
    # 0.77 / 0.90: torch's unpermute 0.05 -> 0.0428, the fused norm's forward 0.74 -> 0.633 (hopper.toml)
    assert set(t.op_fractions) == set(K.table_for(H100).op_fractions)
    assert K.op_fraction(MI300X, "unpermute.torch") == pytest.approx(0.05 * 0.77 / 0.90, rel=1e-9)
    assert K.op_fraction(MI300X, "norm.fused.fwd") == pytest.approx(0.74 * 0.77 / 0.90, rel=1e-9)


def test_an_mi300x_bf16_gemm_from_amds_maf_rate_by_hand():
    # AMD's MAF: 708 TFLOP/s at 4096 x 4864 x 32896 at the 750 W limit (1207 MHz), a sustained timing.
    # The shape is two whole waves of 128x256 tiles (32 x 19 = 608 = 2 x 304 CUs), fill 1; the
    # epilogue at the measured rate costs k0 = 2 bytes x 708 TFLOP/s / (2 x 5.3 TB/s) = 133.6 steps of
    # k, so the ceiling is 708 x (32896 + 133.6) / 32896 = 710.9 TFLOP/s.
    c = 708e12 * (32896 + 708e12 / 5.3e12) / 32896
    assert c / 1e12 == pytest.approx(710.875, abs=0.01)
    assert K.tensor_core_ceiling(MI300X, Precision.BF16) == pytest.approx(c, rel=1e-9)
    # Burst: over the H100 reference's sustained/burst ratio (cdna3.toml sustained_ratio_from), since
    # no MI300X GEMM is timed both ways with one library.
    assert K.burst_ceiling(MI300X, Precision.BF16) == pytest.approx(c / K.sustained_ratio(H100), rel=1e-9)
    # 8192^3: 128x256 tiles -> 64 x 32 = 2048 tiles on 304 CUs = 7 waves, fill 2048 / (7 x 304);
    # epilogue k0 = 2 bytes x C / (2 x 5.3 TB/s); plus one kernel start-up (2.0 us).
    fill = 2048 / (7 * 304)
    k0 = 2 * c / (2 * 5.3e12)
    expected = 2 * 8192**3 / (c * fill * 8192 / (8192 + k0)) + 2.0e-6
    assert K.gemm_seconds(8192, 8192, 8192, 1, MI300X, Precision.BF16, operand_bytes=2) == pytest.approx(expected, rel=1e-9)


def test_an_mi300x_fp8_gemm_from_azures_hipblaslt_timings_by_hand():
    # Azure ND MI300X v5, hipBLASLt fp8 after 10,000 warm-ups: 8192^3 1159.23, 16384^3 1015.1,
    # 6144x12288x12288 1159.54 TFLOP/s. Each timing over the model's efficiency at its shape (wave
    # fill on 304 CUs of the best 128x256 / 256x128 / 128x128 tile, times k/(k + k0) with the epilogue
    # k0 = 2 bytes x rate / (2 x 5.3 TB/s) at that timing's own rate), geometric mean:
    #   8192^3:           2048 tiles of 128x256 in 7 waves of 304, fill 2048/2128;  k0 = 218.7
    #   16384^3:          8192 tiles in 27 waves, fill 8192/8208;                    k0 = 191.5
    #   6144x12288x12288: 48 x 48 = 2304 tiles in 8 waves, fill 2304/2432;           k0 = 218.8
    def one(rate, fill, k):  # type: ignore[no-untyped-def]
        return rate / (fill * k / (k + rate / 5.3e12))

    c = (one(1159.23e12, 2048 / 2128, 8192) * one(1015.1e12, 8192 / 8208, 16384)
         * one(1159.54e12, 2304 / 2432, 12288)) ** (1 / 3)
    assert c / 1e12 == pytest.approx(1166.0, abs=0.1)
    assert K.tensor_core_ceiling(MI300X, Precision.FP8) == pytest.approx(c, rel=1e-9)
    # A shape none of the timings has: Llama-3-8B's fused gate/up projection over 8192 tokens,
    # 8192 x 28672 x 4096: 64 x 112 = 7168 tiles of 128x256 in 24 waves (7296), k0 = C / 5.3 TB/s
    # at the ceiling; compute-bound (0.62 GB moved takes 0.15 ms at 0.77 x 5.3 TB/s, the FLOPs 1.7 ms),
    # plus one kernel start-up
    m, n, k = 8192, 28672, 4096
    expected = 2 * m * n * k / (c * 7168 / 7296 * k / (k + c / 5.3e12)) + K.table_for(MI300X).launch_s
    assert K.gemm_seconds(m, n, k, 1, MI300X, Precision.FP8, operand_bytes=1) == pytest.approx(expected, rel=1e-9)


def test_mi300x_sdpa_attention_from_the_stand_in_curve_by_hand():
    # hopper.toml sdpa_flash fwd causal hdim 128 at 8k: 317 TFLOP/s; x 668.4/794.5 = 0.841 (cdna3.toml),
    # x the sustained/burst ratio of a training step (compute_scale: the MI300X's sustained ceiling over
    # its burst one, the H100's ratio since neither is timed both ways). At the benchmark's own shape
    # (2 x 16 heads, 8k queries: 2048 blocks of 128 rows on both sides) the wave factor is 1.
    rate = K.attention_rate(MI300X, AttentionBackend.SDPA_FLASH, K.Pass.FORWARD, causal=True, head_dim=128,
                            q_len=8192, k_len=8192, batch_heads=32)
    assert rate == pytest.approx(317e12 * 0.841 * K.sustained_ratio(H100), rel=1e-9)


def test_cli_plans_on_mi300x_and_refuses_cudnn_there():
    args = ["plan", "llama-3.1-8b", "--cluster", "mi300x-8", "--gpus", "8", "--seq-len", "8192",
            "--global-batch-size", "8", "--top", "1"]
    ok = CliRunner().invoke(app, args)
    assert ok.exit_code == 0, ok.output
    bad = CliRunner().invoke(app, [*args, "--attention-backend", "cudnn"])
    assert bad.exit_code == 2
    assert "attention_backend cudnn" in bad.output and "fa2, sdpa_flash" in bad.output
    assert "Traceback" not in bad.output


def test_a_plan_on_a_stand_in_kernel_table_says_so():
    # the note beside every plan (rules.NOTES kernel_caveat): CDNA3's table names its stand-ins, a GPU of
    # a generation without a table (the L40S, Ada) says whose measurements price it, and a generation
    # measured throughout (Hopper) says nothing
    from cost_models.rules import notes

    mi300x = make_job("llama-3.1-8b", cluster="mi300x-8", gpus=8, training=dict(framework="torchtitan"), zero=3)
    assert [n for n in notes(mi300x) if n.startswith("MI300X: ") and "stand-ins" in n and "optimistic" in n]
    l40s = make_job("llama-3.1-8b", cluster="l40s-pcie-8", gpus=8, training=dict(framework="torchtitan", seq_len=4096),
                    zero=3, recompute="full")
    assert "L40S has no kernel table of its own (ada): its kernels are priced with hopper's measurements" in " ".join(notes(l40s))
    h100 = make_job("llama-3.1-8b", gpus=8, training=dict(framework="torchtitan"), zero=3)
    assert not [n for n in notes(h100) if "kernel table" in n]
