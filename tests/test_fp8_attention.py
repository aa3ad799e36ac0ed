"""Transformer Engine's fp8 dot-product attention (TrainingSpec.fp8_attention): cuDNN's fp8 kernels at
the measured fp8/16-bit ratio, TE's casts around them by their bytes, what the backward keeps, TE's
conditions as refusals, and the launch that Megatron-LM's flags cannot write."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cost_models import kernels as K
from cost_models.activations import layer_items
from cost_models.calibration import DEFAULT
from cost_models.compute import attention_kernels, fp8_attention_cast_bytes
from cost_models.model_spec import LayerKind, ModelSpec
from cost_models.step_time import _kv_bytes
from planner import presets
from planner.cli import app
from tests.helpers import LLAMA_TINY, make_job

# Llama 3.1 8B's attention as MLPerf v5.1's NVFP4 8B rows run it: seq 8192, two sequences per
# micro-batch, tp 1, on GB200 (mlperf-v5.1-nvidia-llama8b-gb200-2x4)
GB200_8B = dict(cluster="gb200-nvl72", gpus=4, tp=1, mbs=2)
FP4 = dict(seq_len=8192, precision="fp4", framework="megatron", global_batch_size=8)


def test_fp8_kernels_run_at_the_measured_ratio_to_the_16_bit_ones():
    # cuDNN frontend SDPA benchmark, Llama 3.1 attention on GB200, cuDNN 9.22.0 (NVIDIA/cudnn-frontend
    # @3929da2e benchmark/sdpa_benchmark_training/results/llama3.1/gb200/llama3.1_20260424_100750.csv),
    # causal ("top_left"), seq 8192: bf16 forward 1574 TFLOP/s, fp8 2047; backward 1332 and 1454.
    # One layer's kernels for one micro-batch, FLOPs 4·(b·heads = 64)·8192²·128·0.5 = 2.199e12 forward,
    # run at the 16-bit price times 2047/1574 = 1.3005 and 1454/1332 = 1.0916: each kernel's time
    # less its launches is the 16-bit one's over that ratio (exactly: the same FLOPs, wave fill and
    # clock; only the rate changes).
    launch = K.table_for(presets.gpus()["GB200"]).launch_s
    bf16 = attention_kernels(make_job("llama-3.1-8b", training=FP4, **GB200_8B), DEFAULT)
    fp8 = attention_kernels(make_job("llama-3.1-8b", training={**FP4, "fp8_attention": True}, **GB200_8B), DEFAULT)
    assert (fp8.first_fwd - launch) == pytest.approx((bf16.first_fwd - launch) * 1574 / 2047, rel=1e-9)
    assert (fp8.first_bwd - 3 * launch) == pytest.approx((bf16.first_bwd - 3 * launch) * 1332 / 1454, rel=1e-9)
    # GB300 reads its own run (llama3.1/gb300/llama3.1_20260424_100757.csv, causal, seq 8192): bf16
    # forward 1856 TFLOP/s, fp8 2897; backward 1435 and 1781. The same layer on gb300-nvl72: its fp8
    # kernels take the 16-bit ones' time (less launches) times 1856/2897 = 0.6407 and 1435/1781 =
    # 0.8057, against GB200's 0.7689 and 0.9161 above; priced with GB200's run instead they would not.
    gb300_8b = {**GB200_8B, "cluster": "gb300-nvl72"}
    launch = K.table_for(presets.gpus()["GB300"]).launch_s
    bf16 = attention_kernels(make_job("llama-3.1-8b", training=FP4, **gb300_8b), DEFAULT)
    fp8 = attention_kernels(make_job("llama-3.1-8b", training={**FP4, "fp8_attention": True}, **gb300_8b), DEFAULT)
    assert (fp8.first_fwd - launch) == pytest.approx((bf16.first_fwd - launch) * 1856 / 2897, rel=1e-9)
    assert (fp8.first_bwd - 3 * launch) == pytest.approx((bf16.first_bwd - 3 * launch) * 1435 / 1781, rel=1e-9)
    # between the measured lengths linear in log2 of the key length: halfway from 4096 to 8192
    # (GB200, forward causal: 1805/1408 and 2047/1574); flat beyond the grid's ends
    gb200 = presets.gpus()["GB200"]
    mid = (1805 / 1408 + 2047 / 1574) / 2
    assert K.fp8_attention_speedup(gb200, K.Pass.FORWARD, causal=True, k_len=2**12.5) == pytest.approx(mid)
    assert K.fp8_attention_speedup(gb200, K.Pass.BACKWARD, causal=True, k_len=512) == pytest.approx(831 / 885)
    # a B200 has no run of its own: GB200's (the same B200 silicon); every Hopper GPU the H200's,
    # whose causal fp8 backward at 16k keys is slower than the 16-bit one (374 against 579 TFLOP/s)
    assert K.fp8_attention_speedup(presets.gpus()["B200"], K.Pass.FORWARD, causal=True, k_len=8192) == pytest.approx(2047 / 1574)
    h100 = presets.gpus()["H100-SXM"]
    assert K.fp8_attention_speedup(h100, K.Pass.BACKWARD, causal=True, k_len=16384) == pytest.approx(374 / 579)


# A Llama-shaped model with head dim 128 (the only one TE's fp8 backward takes on Hopper): 4 heads of
# 128, 2 key/value heads
LLAMA_D128 = LLAMA_TINY.model_copy(update=dict(name="llama-d128", hidden_size=512, num_attention_heads=4, num_kv_heads=2,
                                               ffn_hidden_size=1376))


def test_fp8_attention_casts_by_hand():
    # LLAMA_TINY, 128 tokens, tp 1 on B200: q 128 x 256 = 32,768 elements, k and v 128 x 64 = 8,192
    # each, 49,152 in all; the output as q. Current scaling (precision fp4, or fp8 tensorwise):
    # forward torch.cat of q, k, v (read 2, write 2) then one quantize of the concatenation: amax read
    # (2), amax-to-scale, cast (read 2, write 1): 9 x 49,152 = 442,368 bytes in 1 + 3 kernels;
    # backward the quantize of dO: 5 x 32,768 = 163,840 in 3 (dQ, dK, dV come out in 16 bits)
    # (TransformerEngine@40c69e75 backends.py:1105-1205, 1380-1468; utils.py:2028-2038)
    current = make_job(LLAMA_TINY, gpus=1, cluster="dgx-b200",
                       training=dict(seq_len=128, precision="fp8", global_batch_size=4, fp8_attention=True))
    assert fp8_attention_cast_bytes(current, LayerKind()) == (442_368, 163_840, 4, 3)
    # delayed scaling on H100, head dim 128: q 128 x 512 = 65,536, k and v 128 x 256 = 32,768 each,
    # 131,072 in all. Forward: the cat (4) and a cast with its amax in the kernel (3) over q, k, v, and
    # the fp8 output dequantised for the output projection (read 1, write 2) over o:
    # 7 x 131,072 + 3 x 65,536 = 1,114,112 in 3 kernels. Backward: dO's cast, 3 x 65,536 = 196,608,
    # and fp8 dQ, dK, dV concatenated (read 1, write 1) and dequantised (read 1, write 2):
    # 5 x 131,072 = 655,360 -> 851,968 in 3
    delayed = make_job(LLAMA_D128, gpus=1, training=dict(seq_len=128, precision="fp8", fp8_recipe="delayed",
                                                         global_batch_size=4, fp8_attention=True))
    assert fp8_attention_cast_bytes(delayed, LayerKind()) == (1_114_112, 851_968, 3, 3)
    # none without the switch
    plain = make_job(LLAMA_TINY, gpus=1, cluster="dgx-b200", training=dict(seq_len=128, precision="fp8", global_batch_size=4))
    assert fp8_attention_cast_bytes(plain, LayerKind()) == (0.0, 0.0, 0, 0)


def test_fp8_attention_keeps_fp8_q_k_v_and_two_row_statistics():
    # LLAMA_TINY, 128 tokens on B200 under current scaling: the backward keeps q_fp8, k_fp8, v_fp8 (1 byte:
    # 32,768 + 2 x 8,192 = 49,152 bytes instead of 98,304), the 16-bit output (NVTE_DPA_FP8CS_O_in_F16:
    # 65,536 as before), and cuDNN's fp8 forward's two fp32 statistics per row, M and ZInv
    # (fused_attn_fp8.cu:2850-2863): 2 x 8 heads x 128 x 4 = 8,192 bytes instead of 4,096
    # (TransformerEngine@40c69e75 backends.py:1194-1201)
    base = dict(seq_len=128, precision="fp8", global_batch_size=4)
    bf16 = layer_items(make_job(LLAMA_TINY, gpus=1, cluster="dgx-b200", training=base), 0)
    fp8 = layer_items(make_job(LLAMA_TINY, gpus=1, cluster="dgx-b200", training={**base, "fp8_attention": True}), 0)
    for name, before, after in (("query", 65_536, 32_768), ("key", 16_384, 8_192), ("value", 16_384, 8_192),
                                ("attention_output", 65_536, 65_536), ("softmax_lse", 4_096, 8_192)):
        assert (bf16.value(f"attention/{name}"), fp8.value(f"attention/{name}")) == (before, after), name
    # under delayed scaling the kept output is the fp8 one
    delayed = layer_items(make_job(LLAMA_D128, gpus=1, training={**base, "fp8_recipe": "delayed", "fp8_attention": True}), 0)
    assert delayed.value("attention/attention_output") == 128 * 512


def test_fp8_attention_ring_sends_one_byte_per_element():
    # TE's ring under cp sends the quantised K/V (uint8, context_parallel.py:1208-1215, 1349): LLAMA_TINY
    # at cp 2, 64 tokens per rank, 2 kv heads x 32: 2 x 64 x 64 = 8,192 elements, 16,384 bytes in 16 bits
    base = dict(seq_len=128, precision="fp8", global_batch_size=4)
    assert _kv_bytes(make_job(LLAMA_TINY, gpus=2, cp=2, cluster="dgx-b200", training=base)) == 16_384
    assert _kv_bytes(make_job(LLAMA_TINY, gpus=2, cp=2, cluster="dgx-b200", training={**base, "fp8_attention": True})) == 8_192


runner = CliRunner()
B200 = ["--cluster", "dgx-b200", "--gpus", "8"]
H100 = ["--cluster", "dgx-h100", "--gpus", "8"]


@pytest.mark.parametrize("argv, needle", [
    (["estimate", "llama-3.1-8b", *B200, "--fp8-attention"], "fp8_attention runs inside Transformer Engine's fp8 autocast"),
    (["estimate", "llama-3.1-8b", *B200, "--dtype", "fp8", "--framework", "torchtitan", "--fp8-attention"],
     "fp8_attention is Transformer Engine's fp8 dot-product attention under Megatron (framework=torchtitan)"),
    (["estimate", "llama-3.1-8b", *H100, "--dtype", "fp8", "--fp8-attention"],
     "fp8_attention with current scaling (fp8_recipe tensorwise) needs compute capability 10.0 or later"),
    (["estimate", "llama-3.1-8b", *B200, "--dtype", "fp8", "--attention-backend", "fa4", "--fp8-attention"],
     "fp8_attention runs on cuDNN's fused attention only"),
    (["estimate", "gpt-oss-20b", *B200, "--dtype", "fp8", "--fp8-attention"],
     "fp8_attention runs the plain softmax only, without attention sinks (model.attention_sinks)"),
], ids=["bf16", "torchtitan", "tensorwise on hopper", "fa4", "gpt-oss"])
def test_fp8_attention_refusals_are_one_line_exit_2(argv, needle):
    result = runner.invoke(app, argv)
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in " ".join(result.output.split()), result.output
    assert "Traceback" not in result.output


def test_fp8_attention_head_dims():
    # sm90 trains head dim 128 only, sm100 up to 128 in multiples of 16 (fused_attn.cpp:170-182)
    from cost_models.hardware import Cluster
    from cost_models.layout import Layout
    from cost_models.rules import fill_defaults, violations
    from cost_models.training import TrainingSpec

    def broken(model: ModelSpec, cluster: str, recipe: str) -> list[str]:
        training = TrainingSpec(seq_len=128, precision="fp8", fp8_recipe=recipe, fp8_attention=True)
        job = fill_defaults(model, Cluster(spec=presets.clusters()[cluster], num_gpus=1), training, Layout())
        return [m for name, m in violations(job) if name == "fp8_attention"]

    assert broken(LLAMA_TINY, "dgx-h100", "delayed") == [
        "fp8_attention trains head dim 128 only before Blackwell (head_dim=32, H100-SXM is hopper, 9.0); drop it"]
    assert broken(LLAMA_D128, "dgx-h100", "delayed") == []
    assert broken(LLAMA_TINY, "dgx-b200", "tensorwise") == []  # 32: a multiple of 16 up to 128
    wide = LLAMA_TINY.model_copy(update=dict(name="llama-d256", hidden_size=512, num_attention_heads=2, num_kv_heads=2))
    assert broken(wide, "dgx-b200", "tensorwise") == ["fp8_attention takes head dims up to 128 in multiples of 16 (head_dim=256); drop it"]


def test_fp8_attention_launch_is_refused_for_megatron_lm(tmp_path):
    # Megatron-LM's pretrain_gpt.py has no flag for TransformerConfig.fp8_dot_product_attention
    # (Megatron-LM@d98e8a64 megatron/training/arguments.py:2307, 2333); NeMo sets it in its model config
    base = ["launch", "llama-3.1-8b", *B200, "--tp", "1", "--dtype", "fp8"]
    result = runner.invoke(app, [*base, "--fp8-attention", "--out", str(tmp_path / "fp8")])
    assert result.exit_code == 2, result.output
    line = " ".join(result.output.split())
    assert line.startswith("error: fp8_attention has no Megatron-LM flag") and "arguments.py:2307, 2333" in line
    assert "drop --fp8-attention" in line and "Traceback" not in result.output
    assert not (tmp_path / "fp8").exists()
    # without the switch the same plan is written, the linears' fp8 flags and no attention flag
    ok = runner.invoke(app, [*base, "--out", str(tmp_path / "plain")])
    assert ok.exit_code == 0, ok.output
    train = (tmp_path / "plain" / "train.sh").read_text()
    assert "--fp8-recipe tensorwise" in train and "dot-product" not in train and "DPA" not in train


def test_a_searched_launch_refused_for_the_settings_names_no_layout_way_out(tmp_path):
    # a refusal of the training settings (not a LayoutError) holds for every layout the search could
    # give: the one line says so and does not send the user to --fix or --rank
    base = ["launch", "llama-3.1-8b", *B200, "--dtype", "fp8", "--seq-len", "8192", "--global-batch-size", "32"]
    result = runner.invoke(app, [*base, "--fp8-attention", "--out", str(tmp_path / "fp8")])
    assert result.exit_code == 2, result.output
    line = " ".join(result.output.split())
    assert line.startswith("error: no plan of the search can be launched: fp8_attention has no Megatron-LM flag"), line
    assert "--fix" not in line and "--rank" not in line and "Traceback" not in result.output
    assert not (tmp_path / "fp8").exists()
