"""nanotron's own kernels where they differ from Megatron's: the eager SwiGLU on the two halves of
the fused [gate|up] output, priced at its measured rate, and the copies its multi-head attention
makes of the qkv output. Hand-worked on small shapes."""

from __future__ import annotations

import pytest

from cost_models import kernels as K
from cost_models.calibration import Calibration
from cost_models.compute import EAGER, Impl, elementwise_seconds, op_seconds, qkv_copy_bytes
from cost_models.model_spec import LayerKind
from planner import presets
from tests.helpers import LLAMA_TINY, make_job

CAL = Calibration()
H100 = presets.gpus()["H100-SXM"]


def _swiglu_gap(cluster: str, backward: bool) -> tuple[float, float]:
    """elementwise time with nanotron's eager SwiGLU minus Megatron's fused one, and the ffn
    elements: LLAMA_TINY on one GPU, 2 x 1024 tokens x 688 = 1,409,024 ffn elements."""
    times = []
    for eager in (True, False):
        job = make_job(LLAMA_TINY, gpus=1, mbs=2, cluster=cluster,
                       training=dict(seq_len=1024, global_batch_size=2, framework="megatron", eager_swiglu=eager))
        times.append(elementwise_seconds(job, LayerKind(), backward=backward, cal=CAL))
    return times[0] - times[1], 2 * 1024 * 688


@pytest.mark.parametrize("backward, bytes_per_element, split, megatron", [
    (False, 6, 0.32, 0.55),  # reads gate and up, writes the product
    (True, 10, 0.26, 0.19),  # reads gate, up and dy, writes both gradients
])
def test_nanotron_swiglu_runs_at_the_split_halves_rate(backward, bytes_per_element, split, megatron):
    """On H100 (3.35 TB/s) the eager SwiGLU moves the same compulsory bytes as Megatron's fused
    kernel at 0.32 of the HBM peak forward (Megatron's 0.55) and 0.26 backward (Megatron's 0.19),
    one kernel start-up each: forward 1,409,024 x 6 x (1/0.32 - 1/0.55) / 3.35e12 = 3.3 us slower,
    backward 1,409,024 x 10 x (1/0.26 - 1/0.19) / 3.35e12 = 6.0 us faster."""
    gap, elements = _swiglu_gap("dgx-h100", backward)
    expected = elements * bytes_per_element * (1 / split - 1 / megatron) / 3.35e12
    assert gap == pytest.approx(expected, rel=1e-9)  # the same float terms in another order
    assert (gap > 0) is (not backward)


def test_split_rate_reproduces_its_measurement():
    """The Liger CSV's torch SwiGLU at 8192 tokens x F = 8192 (the point the fraction was not read
    from): forward 0.38304 ms, backward alone 1.169504 - 0.38304 = 0.786464 ms. The model lands
    within 3% of both (the fractions are the F = 32768 rates, which run 2-3% faster)."""
    elements = 8192 * 8192
    fwd = op_seconds(H100, "swiglu", Impl.SPLIT, elements, backward=False)
    bwd = op_seconds(H100, "swiglu", Impl.SPLIT, elements, backward=True)
    assert fwd == pytest.approx(0.38304e-3, rel=0.03)
    assert bwd == pytest.approx(0.786464e-3, rel=0.03)


def test_without_a_measurement_the_split_halves_run_the_eager_chain():
    """Ampere's table measures no split SwiGLU: the op falls back to the eager chain, 10 bytes per
    ffn element forward in 2 kernels at the stream fraction."""
    a100 = presets.gpus()["A100-80GB"]
    assert "swiglu.split.fwd" not in K.table_for(a100).op_fractions
    elements = 2 * 1024 * 688
    table = K.table_for(a100)
    chain = EAGER["swiglu"]
    expected = elements * chain.bytes_per_element / (a100.hbm_bandwidth_bytes_per_s * table.stream_fraction) + chain.kernels * table.launch_s
    assert op_seconds(a100, "swiglu", Impl.SPLIT, elements, backward=False) == pytest.approx(expected, rel=1e-12)


MHA_TINY = LLAMA_TINY.model_copy(update={"name": "llama-tiny-mha", "num_kv_heads": 8})


def test_qkv_copy_bytes_by_hand():
    """Multi-head, hidden 2048 on one rank (q = kv = 2048): forward 4·6144 + 16·2048 = 57,344 bytes
    a token (28·h), backward 8·2048 + 8·6144 = 65,536 (32·h), three kernels each."""
    assert qkv_copy_bytes(2048, 2048, backward=False) == (57_344, 3)
    assert qkv_copy_bytes(2048, 2048, backward=True) == (65_536, 3)


@pytest.mark.parametrize("backward, per_hidden", [(False, 28), (True, 32)])
def test_nanotron_mha_pays_its_qkv_copies(backward, per_hidden):
    """MHA_TINY (hidden 256, 8 heads of 8 kv) on one H100, 2 x 1024 tokens: the copies add
    2048 x 256 x 28 bytes forward (32 backward) at 0.90 of 3.35 TB/s plus three 2.4 us start-ups."""
    times = []
    for kept in (True, False):
        job = make_job(MHA_TINY, gpus=1, mbs=2, training=dict(seq_len=1024, global_batch_size=2, framework="megatron", qkv_copy_kept=kept))
        times.append(elementwise_seconds(job, LayerKind(), backward=backward, cal=CAL))
    expected = 2048 * 256 * per_hidden / (3.35e12 * 0.90) + 3 * 2.4e-6
    assert times[0] - times[1] == pytest.approx(expected, rel=1e-9)  # the same float terms in another order


def test_grouped_query_attention_copies_nothing_extra():
    """With grouped-query attention nanotron copies q, k and v apart instead: not this term."""
    times = []
    for kept in (True, False):
        job = make_job(LLAMA_TINY, gpus=1, mbs=2, training=dict(seq_len=1024, global_batch_size=2, framework="megatron", qkv_copy_kept=kept))
        times.append(elementwise_seconds(job, LayerKind(), backward=False, cal=CAL))
    assert times[0] == times[1]
