"""Presets: the required names exist, every entry carries a source, and the units came out right."""

from __future__ import annotations

import pytest

from cost_models.units import GB, GiB, TFLOP
from planner import presets


def test_every_preset_has_a_source():
    for table in (presets.gpus(), presets.clusters(), presets.models()):
        for name, spec in table.items():
            assert len(spec.source.strip()) > 20, f"{name} has no source"


@pytest.mark.parametrize(
    "gpu, hbm_gib, bf16_tflops",
    [("A100-80GB", 80.0, 312.0), ("H100-SXM", 81559 / 1024, 989.4), ("H200", 143771 / 1024, 989.4)],
)
def test_gpu_units_converted_once(gpu, hbm_gib, bf16_tflops):
    g = presets.gpus()[gpu]
    assert g.hbm_bytes == round(hbm_gib * GiB)
    assert g.peak_flop_per_s.bf16 == pytest.approx(bf16_tflops * TFLOP)


def test_cluster_links_per_direction():
    h100 = presets.clusters()["dgx-h100"]
    assert h100.scaleup_bandwidth_bytes_per_s == 450 * GB  # NVLink4 900 GB/s bidirectional
    assert h100.nic_bandwidth_bytes_per_s == 400 * GB / 8  # 400 Gb/s per GPU
    nvl72 = presets.clusters()["gb200-nvl72"]
    assert (nvl72.gpus_per_node, nvl72.scaleup_domain_gpus) == (4, 72)
    assert presets.clusters()["l40s-pcie-8"].scaleup_bandwidth_bytes_per_s < 100 * GB  # PCIe only


def test_gb300_numbers_are_its_sources_divided_out():
    g = presets.gpus()["GB300"]
    # nvidia-smi memory.total of a GB300 compute tray (NVIDIA/k8s-test-infra qx-gb300.xml): 284208 MiB
    assert g.hbm_bytes == 284208 * 2**20
    # NVIDIA's GB300 NVL72 page, per rack of 72 GPUs, Tensor Core figures with sparsity: FP16/BF16 360,
    # FP8/FP6 720 PFLOPS -> dense per GPU = /72/2 = 2500, 5000 TFLOP/s (GB200's); FP4 printed dense,
    # 1,080 PFLOPS -> /72 = 15000 TFLOP/s; HBM 576 TB/s -> 8 TB/s. Tolerance: float rounding only.
    assert g.peak_flop_per_s.bf16 == pytest.approx(360e15 / 72 / 2)
    assert g.peak_flop_per_s.fp8 == pytest.approx(720e15 / 72 / 2)
    assert g.peak_flop_per_s.fp4 == pytest.approx(1080e15 / 72)
    assert g.peak_flop_per_s.fp4 == pytest.approx(1.5 * presets.gpus()["GB200"].peak_flop_per_s.fp4)
    assert g.hbm_bandwidth_bytes_per_s == pytest.approx(576e12 / 72)
    assert (g.compute_capability, g.architecture) == ((10, 3), "blackwell")  # developer.nvidia.com/cuda-gpus: 10.3
    nvl72 = presets.clusters()["gb300-nvl72"]
    assert nvl72.gpu.name == "GB300"
    assert (nvl72.gpus_per_node, nvl72.scaleup_domain_gpus) == (4, 72)
    assert nvl72.scaleup_bandwidth_bytes_per_s == 1800 * GB / 2  # NVLink5 1.8 TB/s bidirectional
    assert nvl72.nic_bandwidth_bytes_per_s == 800 * GB / 8  # one 800 Gb/s ConnectX-8 per GPU


def test_gb300_fp8_gemms_priced_from_its_own_timings():
    # Azure's cuBLASLt fp8 rates at the same three shapes: ND GB300 v6 3286.3, 3308.5, 3279.5 against
    # ND GB200 v6 2876.6, 2906.9, 2895.6 TFLOP/s, geometric-mean ratio 1.138. The ceilings keep that
    # ratio to within the epilogue's share: k0 grows with the ceiling (432 against 378 steps at 8 TB/s),
    # which costs the faster GPU 0.6% at K = 8192, so 1% is the tolerance.
    from cost_models.enums import Precision
    from cost_models.kernels import tensor_core_ceiling

    gb300, gb200 = presets.gpus()["GB300"], presets.gpus()["GB200"]
    timings = ((3286.3 * 3308.5 * 3279.5) / (2876.6 * 2906.9 * 2895.6)) ** (1 / 3)
    ratio = tensor_core_ceiling(gb300, Precision.FP8) / tensor_core_ceiling(gb200, Precision.FP8)
    assert ratio == pytest.approx(timings, rel=0.01)
