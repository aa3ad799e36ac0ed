"""Each model family of issue 16, as a user meets it: a tiny config.json of its Hugging Face type
(tests/data/families: the tests/data/hf fixture of the family with hidden 64, 2-6 layers, vocabulary
256 and small experts; every other key as the fixture has it) is planned on 2 GPUs and launched with
a framework that runs it, whose files carry the family's own settings; the frameworks that cannot
run it refuse in one line, naming one that can. validate's worker runs the same layer types in
tests/test_validate_parallel.py (gemma_fsdp, chunked_tp_sp, mla_ep, nemotron_fsdp, hybrid_*)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner.cli import app

DATA = Path(__file__).parent / "data" / "families"
PROBLEM = ["-c", "dgx-h100", "-g", "2", "--seq-len", "64", "--global-batch-size", "8"]
runner = CliRunner()

# family -> (framework and flags of its launch, what its train.sh or config.json must carry)
LAUNCHES = {
    "deepseek_v3": (["--framework", "megatron"], ["--multi-latent-attention", "--q-lora-rank 32", "--num-experts 4"]),
    "nemotron": (["--framework", "megatron"], ["--squared-relu"]),
    "gpt_oss": (["--framework", "megatron"], ["--softmax-type learnable", "--window-size '(7,0)'", "--activation-func-clamp-value 7.0"]),
    "nemotron_h": (["--framework", "megatron"], ["pretrain_hybrid.py", "--hybrid-layer-pattern 'M*-M-*'"]),
    "nemotron_h_moe": (["--framework", "megatron"], ["pretrain_hybrid.py", "--hybrid-layer-pattern 'M*EM-E'", "--num-experts 4"]),
    "llama4_text": (["--framework", "deepspeed"], {"model_type": "llama4_text", "attention_chunk_size": 8}),
    "gemma2": (["--framework", "deepspeed", "--attention", "eager"], {"model_type": "gemma2", "sliding_window": 8, "attn_logit_softcapping": 50.0}),
    "gemma3_text": (["--framework", "deepspeed"], {"model_type": "gemma3_text", "sliding_window": 8}),
}
# what Megatron-LM cannot say, refused in one line naming the framework that runs it
MEGATRON_REFUSES = {"llama4_text": "chunked attention", "gemma2": "soft-capping", "gemma3_text": "four norms per layer"}


@pytest.mark.parametrize("family", list(LAUNCHES))
def test_each_family_plans_and_launches_with_its_settings(family, tmp_path):
    spec = str(DATA / f"{family}.json")
    plan = runner.invoke(app, ["plan", spec, *PROBLEM, "--json"])
    assert plan.exit_code == 0, plan.output
    assert json.loads(plan.stdout)["plans"], family
    flags, carried = LAUNCHES[family]
    out = tmp_path / "launch"
    result = runner.invoke(app, ["launch", spec, *PROBLEM, *flags, "--out", str(out)])
    assert result.exit_code == 0, result.output
    if isinstance(carried, dict):
        config = json.loads((out / "config.json").read_text())
        assert {k: config.get(k) for k in carried} == carried
    else:
        text = (out / "train.sh").read_text()
        assert [f for f in carried if f not in text] == []


@pytest.mark.parametrize("family", list(MEGATRON_REFUSES))
def test_megatron_refuses_what_it_cannot_say_naming_deepspeed(family, tmp_path):
    result = runner.invoke(app, ["launch", str(DATA / f"{family}.json"), *PROBLEM, "--framework", "megatron", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2
    line = result.output.strip()
    assert "\n" not in line and MEGATRON_REFUSES[family] in line and "--framework deepspeed" in line
    assert not (tmp_path / "x").exists()
