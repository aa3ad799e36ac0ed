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
    # BabelStream triad 4.09 TB/s of 5.3 (Azure ND MI300X v5)
    assert t.stream_fraction == pytest.approx(4.09 / 5.3, abs=0.005)
    # MI210's gpu-small-kernels fit, a = 1956 ns, stands in
    assert t.launch_s == pytest.approx(1956e-9, rel=0.03)


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


def test_mi300x_fp8_gemms_land_near_azures_hipblaslt_timings():
    # Azure ND MI300X v5, hipBLASLt fp8 after 10,000 warm-ups: 8192^3 1159.23, 16384^3 1015.1,
    # 6144x12288x12288 1159.54 TFLOP/s. The three spread +-7% about their geometric mean, which the
    # ceiling is anchored on: each priced within 15%.
    for (m, n, k), measured in (((8192, 8192, 8192), 1159.23), ((16384, 16384, 16384), 1015.1),
                                ((6144, 12288, 12288), 1159.54)):
        t = K.gemm_seconds(m, n, k, 1, MI300X, Precision.FP8, operand_bytes=1)
        assert 2 * m * n * k / t / 1e12 == pytest.approx(measured, rel=0.15)


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
