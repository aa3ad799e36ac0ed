"""The emitted DeepSpeed train.py, run: one CPU process (DeepSpeed's CPU accelerator, gloo), a tiny
Llama-shaped model, two optimizer steps of two micro-batches on random tokens (train.py --mock-data).

The arguments are the ones train.sh gives torchrun (read through the stub torchrun of the launch
tests), so the plan's --recompute and ds_config.json reach the script as on a cluster. A wrapper
(tests/data/launch_stub/count_layer_forwards.py) counts each decoder layer's forward calls inside
and outside DeepSpeedEngine.backward and records the ZeRO stage the engine reports:

- recompute full: every layer runs forward once per micro-batch and once more in the backward;
- recompute none: once, and never in the backward;
- engine.zero_optimization_stage() is the planned --zero;
- a Mistral-shaped model keeps its sliding window through the planner into the model train.py builds.

A subprocess test of about 10 s of CPU per run (imports of torch, transformers and DeepSpeed
included); skipped where DeepSpeed is not installed.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from launch_cases import STUB_DIR, run_train_sh, write
from planner.launch.build import run_launch

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("deepspeed")

# Llama-shaped, small enough that a CPU step takes well under a second: 2 layers of hidden 64.
TINY = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 256,
    "max_position_embeddings": 256, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": False,
    "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
}
# The same shape as a Mistral: a sliding window of 16 tokens, shorter than the 32-token sequence.
TINY_MISTRAL = {**TINY, "architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": 16}
LAYERS, STEPS, MICRO = 2, 2, 2  # global batch 2 = mbs 1 x 2 micro-batches x dp 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(tmp: Path, layout: dict, config: dict) -> tuple[dict, str]:
    model = tmp / "tiny"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    launch = run_launch(str(model), "dgx-h100", 1, training={"framework": "deepspeed", "seq_len": 32, "global_batch_size": 2},
                        layout={"tp": 1, "mbs": 1, **layout})
    out = write(launch, tmp / "launch")
    argv = run_train_sh(out, tmp, {"CHECKPOINT_DIR": str(tmp / "ckpt")},
                        "--mock-data", "--train-iters", str(STEPS), "--log-interval", "1")
    script = argv.index(str(out / "train.py"))  # torchrun's own options come before the script
    counts = tmp / "counts.json"
    env = {
        **os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "RANK": "0", "WORLD_SIZE": "1",
        "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "COUNTS_OUT": str(counts), "OMP_NUM_THREADS": "1",
    }
    result = subprocess.run([sys.executable, str(STUB_DIR / "count_layer_forwards.py"), *argv[script:]],
                            env=env, cwd=tmp, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(counts.read_text()), result.stdout


@pytest.mark.parametrize("zero, recompute, config", [(3, "full", TINY), (1, "none", TINY_MISTRAL)],
                         ids=["zero3-full-llama", "zero1-none-mistral"])
def test_deepspeed_train_py_runs_and_recomputes_as_planned(tmp_path, zero, recompute, config):
    counts, stdout = _run(tmp_path, {"zero": zero, "recompute": recompute}, config)
    assert counts["zero_stage"] == zero
    # the model built from the emitted config.json: the planned type and window (read, planned, emitted)
    assert (counts["model_type"], counts["sliding_window"]) == (config["model_type"], config.get("sliding_window"))
    assert f"DeepSpeed engine: ZeRO stage {zero}," in stdout and f"recompute {recompute}" in stdout
    assert counts["layers"] == LAYERS and counts["steps"] == STEPS
    forwards = LAYERS * MICRO * STEPS  # each layer once per micro-batch of each step
    assert counts["forward"] == forwards
    assert counts["forward_in_backward"] == (forwards if recompute == "full" else 0)
    losses = [float(x) for x in re.findall(r"^step \d+ loss (\S+)", stdout, re.M)]
    # random tokens over 256 ids: the loss starts near ln 256 = 5.55 (untrained logits are near uniform)
    assert len(losses) == STEPS and all(math.isfinite(x) and abs(x - math.log(256)) < 1.0 for x in losses)
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == f"step{STEPS}"  # saved at the last step
