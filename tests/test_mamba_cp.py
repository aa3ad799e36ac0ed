"""Mamba-2 layers under context parallelism, as Megatron-LM@d98e8a64 runs them
(megatron/core/ssm/mamba_context_parallel.py): the all-to-alls' bytes, the split of the conv and the
scan, what is saved, the exposed time, the divisibility refusals and the launch flags."""

from __future__ import annotations

import pytest

from cost_models.enums import Recompute
from cost_models.model_spec import ModelSpec
from tests.helpers import make_job

# tests/test_hybrid.py's hand-sized Nemotron-H: Mamba heads 8 of 8, 2 groups, state 16, chunk 8
TINY = ModelSpec.model_validate(dict(
    name="tiny-nemotron-h", num_layers=5, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4, num_kv_heads=2,
    head_dim=8, vocab_size=64, max_position_embeddings=64, mlp="squared_relu", position_embedding="none",
    hybrid_pattern="M*-M-", mamba=dict(num_heads=8, head_dim=8, state_size=16, num_groups=2, chunk_size=8),
))

# nemotron-h-8b's Mamba mixer (128 heads of 64, 8 groups, state 128) in a Mamba-only stack
MAMBA_8B = ModelSpec.model_validate(dict(
    name="mamba-only", num_layers=2, hidden_size=4096, ffn_hidden_size=16384, num_attention_heads=32, num_kv_heads=8,
    vocab_size=1024, max_position_embeddings=65536, mlp="squared_relu", position_embedding="none",
    hybrid_pattern="MM", mamba=dict(num_heads=128, head_dim=64, state_size=128, num_groups=8),
))


def _tiny(**layout):
    return make_job(TINY, gpus=layout.pop("gpus"), training={"seq_len": 16, "global_batch_size": 8}, **layout)


def test_all_to_all_widths_and_bytes_by_hand():
    from cost_models.comm import Collective, collective_time, placement
    from cost_models.mamba_shard import all_to_all_widths
    from cost_models.step_time import mamba_cp_seconds

    # TINY: inner 8·8 = 64, 2 groups of state 16, 8 heads. tp 1, cp 2: every rank sends its 8 tokens
    # of z, x (64 wide), B, C (2·16, no repeat: 2 groups over 2 ranks), dt (8) and y (64), bf16.
    assert all_to_all_widths(TINY.mamba, tp=1, cp=2) == {"z": 64, "x": 64, "B": 32, "C": 32, "dt": 8, "y": 64}
    job = _tiny(gpus=2, cp=2)
    cl = job.cluster.spec
    sizes = (8 * 64 * 2, 8 * 64 * 2, 8 * 32 * 2, 8 * 32 * 2, 8 * 8 * 2, 8 * 64 * 2)  # 4,224 bytes in all
    expected = sum(collective_time(Collective.ALL_TO_ALL, b, placement(cl, 2, 1), cl) for b in sizes)
    assert mamba_cp_seconds(job) == pytest.approx(expected, rel=1e-12)
    # tp 2, cp 4: a tp rank holds 1 group, repeated 4 times so that each cp rank gets it
    # (mamba_context_parallel.py L119-125): B and C 1·4·16 = 64 wide; 4 tokens of 32 over tp 2
    assert all_to_all_widths(TINY.mamba, tp=2, cp=4) == {"z": 32, "x": 32, "B": 64, "C": 64, "dt": 4, "y": 32}
    assert all_to_all_widths(TINY.mamba, tp=2, cp=1) == {}


def test_the_scan_runs_the_whole_sequence_on_a_share_of_the_heads():
    from cost_models import activations as act
    from cost_models.flops import layer_flops, mamba_local

    # tp 2, cp 2: 8/(2·2) = 2 heads, 1 group (2/2 = 1 < cp: repeated), all 16 positions
    job = _tiny(gpus=4, tp=2, cp=2)
    sh = mamba_local(job)
    assert (sh.seq, sh.local.num_heads, sh.local.num_groups, sh.repeat) == (16, 2, 1, 2)
    # SSD per chunk (Q 8, N 16, P 8): per head 2QP + 4NP, per group 2QN, for T/Q = 2 chunks:
    # 16·(2·(2·8·8 + 4·16·8) + 1·2·8·16) = 16·1,536 = 24,576 (cp 1 at tp 2: 4 heads, 1 group, 40,960)
    f = layer_flops(job, TINY.layer_kind(0), mode=Recompute.NONE)
    assert f.forward_attention == 16 * (2 * (2 * 8 * 8 + 4 * 16 * 8) + 2 * 8 * 16) == 24_576
    # the projections see the rank's 8 tokens: in_proj 2·8·(200/2)·32, out_proj 2·8·32·(64/2)
    assert f.forward_gemm == 2 * 8 * 100 * 32 + 2 * 8 * 32 * 32
    # the fused kernel keeps zxBCdt as it reads it: 16 positions of z, x (2·8), B, C (2·16), dt (2)
    # = 66 wide, against 8 tokens of 200/2 = 100 wide at cp 1's split of the same tokens
    items = act.layer_items(job, 0)["mamba"]
    assert items.value("zxbcdt") == 16 * 66 * 2 == 2112
    # the gated norm and out_proj see y back at the rank's 8 tokens, 64/2 wide
    assert items.value("out_proj_input") == 8 * 32 * 2
    # backward: residual gradients in and out (8·32/2 each, sp), the gathered input 8·32, the
    # kernel's zxBCdt gradient 16·66, y's 8·32 and in_proj's output gradient 8·100 coming back
    assert act.layer_backward_workspace(job, 0) == (2 * 128 + 256 + 16 * 66 + 8 * 32 + 8 * 100) * 2 == 5248


def test_cp_2_costs_the_exposed_all_to_alls_on_a_compute_bound_layer():
    # One Mamba layer of nemotron-h-8b's shape at 32,768 tokens, tp 1, on one H100 node: cp 2 halves
    # the work per rank (projections on 16,384 tokens, the scan on 64 of 128 heads) and adds the
    # all-to-alls. Per rank at cp 2 each forward sends 16,384 tokens of
    #   z, x, y: 8,192 wide -> 256 MiB each; B, C: 8·128 = 1,024 -> 32 MiB each; dt: 128 -> 4 MiB,
    # at (n−1)/n = 1/2 of each over the H100 NVLink all-to-all plateau 320 GB/s (comm.py) times the
    # share a message of that size reaches (DOMAIN_CURVE: 256 MiB 0.900; 32 MiB between 16 MiB 0.490
    # and 64 MiB 0.755 in log2: 0.6225; 4 MiB 0.288):
    #   3 · 134,217,728/(320e9·0.900) + 2 · 16,777,216/(320e9·0.6225) + 2,097,152/(320e9·0.288)
    #   = 3 · 0.46603 + 2 · 0.08422 + 0.02276 ms = 1.5893 ms
    # and backward the same again, all exposed (Megatron's all_to_all_single waits on the stream).
    from cost_models.calibration import DEFAULT
    from cost_models.compute import memory_seconds, mamba_reorder_bytes
    from cost_models.step_time import layer_pass, mamba_cp_seconds

    training = {"seq_len": 32768, "global_batch_size": 8}
    one = make_job(MAMBA_8B, gpus=1, training=training)
    two = make_job(MAMBA_8B, gpus=2, training=training, cp=2)
    kind = MAMBA_8B.layer_kind(0)
    assert mamba_cp_seconds(two) == pytest.approx(1.5893e-3, rel=1e-4)
    p1 = layer_pass(one, kind, mode=Recompute.NONE, cal=DEFAULT)
    p2 = layer_pass(two, kind, mode=Recompute.NONE, cal=DEFAULT)
    assert p1.comm.value("cp") == 0
    assert p2.comm.value("cp") == pytest.approx(2 * 1.5893e-3, rel=1e-4)
    # the copies around the all-to-alls: z, x, B, C, dt (16,384·(2·8,192 + 2·1,024 + 128) elements)
    # three times (split/cat, concatenation, load-balance reorder) and y (16,384·8,192) twice, each
    # read and written in bf16, once forward and once backward (memory-bound: 4.7 GB a pass)
    moved, copies = mamba_reorder_bytes(two)
    assert moved == 2 * 2 * 16384 * (3 * (2 * 8192 + 2 * 1024 + 128) + 2 * 8192) and copies == 9
    reorder = 2 * memory_seconds(two, moved, DEFAULT, launches=copies)
    # without them, compute per rank halves: the same GEMM shapes at half the rows and the scan at
    # half the heads run within 3% of the same rate (large shapes on the efficiency plateau)
    assert p2.compute.total - reorder == pytest.approx(p1.compute.total / 2, rel=0.03)
    # so per token, cp 2 is slower than cp 1 by the exposed all-to-alls and the copies, to within
    # that 3% of the compute
    per_token_1, per_token_2 = (p1.compute.total + p1.comm.total) / 32768, (p2.compute.total + p2.comm.total) / 16384
    assert per_token_2 - per_token_1 == pytest.approx((p2.comm.value("cp") + reorder) / 16384, abs=0.03 * per_token_1)
    assert p2.comm.value("cp") / 16384 > 0.03 * per_token_1  # the all-to-alls are above that tolerance


def test_divisibility_refusals_name_the_working_cp():
    from cost_models.errors import SpecError
    from cost_models.mamba_shard import cp_error, cp_values
    from cost_models.model_spec import MambaSpec

    mb = MambaSpec(num_heads=12, head_dim=8, state_size=16, num_groups=4)
    # mamba_context_parallel.py L106-108: 12 heads over cp 8
    assert cp_error(mb, 1, 8) == "mamba num_heads(12)/tp(1) = 12 is not divisible by cp(8)"
    # L127-129: 4 groups over cp 3 (12 heads would split)
    assert cp_error(mb, 1, 3) == "mamba num_groups(4)/tp(1) = 4 is not divisible by cp(3)"
    # L120-122: cp 6 over 4 groups (each group's state repeated a whole number of times)
    assert cp_error(mb, 1, 6) == "cp(6) is not divisible by mamba num_groups(4)/tp(1) = 4"
    # 12 heads: cp 1, 2, 4 and 12 (12 = 3·4 repeats each group 3 times); at tp 2, 6 heads, 2 groups: 1, 2, 6
    assert cp_values(mb, 1) == [1, 2, 4, 12] and cp_values(mb, 2) == [1, 2, 6]
    with pytest.raises(SpecError, match=r"^layout: mamba num_heads\(8\)/tp\(2\) = 4 is not divisible by cp\(8\) .*; cp in 1, 2, 4 \[megatron\]$"):
        make_job(TINY, gpus=16, training={"seq_len": 32, "global_batch_size": 8}, tp=2, cp=8)


def test_megatron_launch_of_a_hybrid_job_under_cp():
    from planner.launch.megatron import train_sh
    from planner.launch.target import Target

    spec = ModelSpec.model_validate({**TINY.model_dump(), "mamba": {**TINY.mamba.model_dump(), "chunk_size": 128}})
    text = train_sh(Target(job=make_job(spec, gpus=4, training={"seq_len": 16, "global_batch_size": 8}, tp=2, cp=2)))
    assert '"$MEGATRON_LM/pretrain_hybrid.py"' in text
    for flag in ("--context-parallel-size 2", "--tensor-model-parallel-size 2", "--hybrid-layer-pattern"):
        assert flag in text


def test_the_cli_refuses_an_unsplittable_cp_in_one_line():
    from typer.testing import CliRunner

    from planner.cli import app

    out = CliRunner().invoke(app, ["estimate", "nemotron-h-8b", "-c", "dgx-h100", "-g", "24", "--cp", "3", "--seq-len", "12288"])
    assert out.exit_code == 2 and "Traceback" not in out.output
    # 128 heads over tp 1 split over cp 1 … 128 (8 groups: from cp 16 on each group's B, C repeat)
    assert "num_heads(128)/tp(1) = 128 is not divisible by cp(3)" in out.output
    assert "cp in 1, 2, 4, 8, 16, 32, 64, 128" in out.output
