"""Pipeline splits as Megatron-LM places layers (Megatron-LM@d98e8a64): even, uneven ends, the
embedding and loss counted as layers, and an explicit --pipeline-model-parallel-layout. Expected
values are worked by hand from the rules quoted in cost_models/pipeline_split.py."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cost_models.errors import SpecError
from cost_models.pipeline_split import format_pp_layout, layout_errors, parse_pp_layout, virtual_stage_layers
from helpers import make_job
from planner.cli import app

L405 = "llama-3.1-405b"  # 126 layers
Q235 = "qwen3-235b-a22b"  # 94 layers, 128 experts


def test_layout_grammar_unrolls_groups_then_characters():
    # "(tt|)*2" -> "tt|tt|", then "t*3" -> "ttt"; commas are dropped
    assert parse_pp_layout("Et*3|(tt|)*2,t|tL") == ("Ettt", "tt", "tt", "t", "tL")
    with pytest.raises(ValueError, match="unknown layer character 'x'"):
        parse_pp_layout("Et|xL")
    # 60,000 stages of 60,000 layers would unroll to 3.6e9 characters: refused before it is built
    with pytest.raises(ValueError, match="unrolls to more than"):
        parse_pp_layout("(t*60000|)*60000")


def test_a_split_per_rank_writes_as_a_compact_layout_megatron_reads_back():
    # 6/8/8/10 layers over pp 4: E on the first stage, L after the last, the two 8-layer ranks as a group
    assert format_pp_layout([6, 8, 8, 10], 1) == "Et*6|(t*8|)*2,t*10L"
    # vpp 2: each rank's layers halved over its two chunks, stage v·pp + r; single layers as "t"
    assert format_pp_layout([2, 4, 4, 6], 2) == "Et|(t*2|)*2,t*3|t|(t*2|)*2,t*3L"
    for counts, vpp in (([6, 8, 8, 10], 1), ([2, 4, 4, 6], 2), ([1, 1, 1, 1], 1), ([3, 9, 9, 9, 12], 3)):
        text = format_pp_layout(counts, vpp)
        pp = len(counts)
        assert layout_errors(parse_pp_layout(text), sum(counts), pp) is None
        stages = virtual_stage_layers(sum(counts), pp, vpp, layout=text)
        assert stages == [counts[s % pp] // vpp for s in range(pp * vpp)], (text, stages)


def test_embedding_and_loss_counted_as_layers():
    # 126 + 2 = 128 units over 16 stages: 8 each; the first and last build one decoder layer fewer
    assert virtual_stage_layers(126, 16, 1, embedding=True, loss=True) == [7] + [8] * 14 + [7]
    # Qwen3-235B: 94 + 2 = 96 over pp 8 x vpp 4 = 32 virtual stages of 3
    assert virtual_stage_layers(94, 8, 4, embedding=True, loss=True) == [2] + [3] * 30 + [2]
    # only the loss: 79 + 1 = 80 over 8 stages; the last stage is the one short
    assert virtual_stage_layers(79, 8, 1, loss=True) == [10] * 7 + [9]


def test_interleaved_chunks_follow_megatrons_stage_order():
    job = make_job(Q235, gpus=2048, tp=2, pp=8, vpp=4, ep=32, account_for_embedding=True, account_for_loss=True)
    sizes = [[len(c) for c in chunks] for chunks in job.stage_chunks]
    assert sizes[0] == [2, 3, 3, 3] and sizes[7] == [3, 3, 3, 2] and sizes[3] == [3, 3, 3, 3]
    # stage v·pp + r: rank 0 chunk 0 holds layers 0-1, rank 1 chunk 0 layers 2-4, rank 0 chunk 1
    # starts after the 8 first-round stages (2 + 7·3 = 23 layers)
    assert job.stage_chunks[0][0] == (0, 1) and job.stage_chunks[1][0] == (2, 3, 4) and job.stage_chunks[0][1][0] == 23
    assert sum(len(job.stage_layer_ids(r)) for r in range(8)) == 94


def test_explicit_layout_sets_vpp_and_places_every_layer():
    job = make_job(L405, gpus=16384, tp=8, pp=16, pp_layout="Et*7|(t*8|)*14,t*7L")
    assert job.layout.vpp == 1 and [len(job.stage_layer_ids(r)) for r in (0, 1, 15)] == [7, 8, 7]
    job = make_job(L405, gpus=16384, tp=8, pp=16, pp_layout="E|(t*4|)*30,t*6L")
    assert job.layout.vpp == 2  # 32 stages over pp 16
    assert job.stage_chunks[0][0] == ()  # the embedding alone
    assert len(job.stage_chunks[15][1]) == 6 and len(job.stage_chunks[0][1]) == 4


@pytest.mark.parametrize("kw, needle", [
    (dict(pp=16), "or count the embedding and the loss as layers (--account-for-embedding --account-for-loss: 128 = 16·8)"),
    (dict(pp=16, account_for_embedding=True), "127 is not divisible by pp(16)·vpp(1)"),
    (dict(pp=16, account_for_embedding=True, account_for_loss=True, pp_first_stage_layers=7),
     "cannot be combined with pp_first/last_stage_layers"),
    (dict(pp=16, pp_layout="Et*7|(t*8|)*14,t*6L"), "pp_layout has 125 decoder layers (t), the model has num_layers(126)"),
    (dict(pp=16, pp_layout="t*7|(t*8|)*14,Et*7L"), "pp_layout must place E (embedding) in the first stage"),
    (dict(pp=16, pp_layout="Et*7|(t*8|)*13,t*7L"), "pp_layout has 15 stages, not a multiple of pp(16)"),
    (dict(pp=16, vpp=4, pp_layout="E|(t*4|)*30,t*6L"), "vpp(4) disagrees with pp_layout: 32 stages over pp(16) make vpp 2"),
    (dict(pp=16, account_for_embedding=True, account_for_loss=True, training=dict(framework="deepspeed")),
     "Megatron's pipeline splits; DeepSpeed's PipelineModule"),
])
def test_splits_megatron_refuses_are_refused_with_the_way_out(kw, needle):
    kw.setdefault("training", {})
    with pytest.raises(SpecError) as e:
        make_job(L405, gpus=16384, tp=8, **kw)
    assert needle in str(e.value)


def test_published_layouts_type_and_estimate_as_published():
    runner = CliRunner()
    r = runner.invoke(app, ["estimate", L405, "-c", "dgx-h100", "-g", "16384", "--tp", "8", "--pp", "16", "--vpp", "2",
                            "--account-for-embedding", "--account-for-loss"])
    assert r.exit_code == 0, r.output
    assert "pp 16×vpp 2 (layers 7/8/…/7; embedding and loss counted as layers)" in " ".join(r.output.split())
    r = runner.invoke(app, ["estimate", Q235, "-c", "dgx-h100", "-g", "2048", "--tp", "2", "--pp", "8", "--vpp", "4",
                            "--ep", "32", "--account-for-embedding", "--account-for-loss"])
    assert r.exit_code == 0, r.output
    # 94 + 2 = 96 units over 32 virtual stages of 3: 4 chunks per rank, the first and last a layer short
    assert "pp 8×vpp 4 (layers 11/12/…/11; embedding and loss counted as layers)" in " ".join(r.output.split())


def test_megatron_launch_says_the_split_and_the_gradient_dtype(tmp_path):
    runner = CliRunner()
    r = runner.invoke(app, ["launch", L405, "-c", "dgx-h100", "-g", "16384", "--tp", "8", "--pp", "16",
                            "--pp-layout", "Et*7|(t*8|)*14,t*7L", "--out", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    text = (tmp_path / "a" / "train.sh").read_text()
    assert "--pipeline-model-parallel-layout 'Et*7|(t*8|)*14,t*7L'" in text
    assert "--num-layers-per-virtual-pipeline-stage" not in text and "--num-virtual-stages-per-pipeline-rank" not in text
    r = runner.invoke(app, ["launch", L405, "-c", "dgx-h100", "-g", "16384", "--tp", "8", "--pp", "16", "--vpp", "2",
                            "--account-for-embedding", "--account-for-loss", "--grad-reduce-in-bf16", "--out", str(tmp_path / "b")])
    assert r.exit_code == 0, r.output
    text = (tmp_path / "b" / "train.sh").read_text()
    for flag in ("--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
                 "--num-virtual-stages-per-pipeline-rank 2", "--grad-reduce-in-bf16"):
        assert flag in text
