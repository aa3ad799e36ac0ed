"""The plans the launch tests emit: small, fast layouts covering each emitter's features, shared by
the golden tests (tests/test_launch.py) and the real-parser tests (tests/test_launch_parsers.py)."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.launch.build import LaunchFiles, LaunchOptions, run_launch
from planner.launch.options import MegatronFsdp, TitanVersion

GOLDEN = Path(__file__).parent / "golden" / "launch"
STUB_DIR = Path(__file__).parent / "data" / "launch_stub"  # torchrun that writes its argv as JSON


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    gpus: int
    framework: str
    layout: dict[str, Any]
    training: dict[str, Any] = field(default_factory=dict)
    options: LaunchOptions = LaunchOptions()
    cluster: str = "dgx-h100"

    def build(self) -> LaunchFiles:
        training = {"framework": self.framework, **self.training}
        return run_launch(self.model, self.cluster, self.gpus, training=training, layout=self.layout, options=self.options)


V02 = LaunchOptions(torchtitan_version=TitanVersion.V02)

CASES = [
    # Megatron-LM
    Case("megatron-gqa-selective", "llama-3.1-8b", 8, "megatron", {"tp": 2, "zero": 1, "recompute": "selective"}),
    Case("megatron-gpt-learned-tied", "gpt2", 8, "megatron", {"tp": 1, "zero": 0, "mbs": 4},
         {"seq_len": 1024, "global_batch_size": 64}),
    Case("megatron-moe-ep", "mixtral-8x7b", 32, "megatron",
         {"tp": 2, "pp": 2, "ep": 4, "etp": 1, "zero": 1, "recompute": "full"}, {"global_batch_size": 64}),
    Case("megatron-qwen3-moe", "qwen3-30b-a3b", 16, "megatron", {"tp": 1, "ep": 8, "etp": 1, "zero": 1, "recompute": "selective"}),
    Case("megatron-cp", "llama-3.1-8b", 16, "megatron", {"tp": 2, "cp": 2, "zero": 1}, {"seq_len": 16384}),
    Case("megatron-interleaved-fp8", "llama-3.1-70b", 32, "megatron",
         {"tp": 4, "pp": 4, "vpp": 5, "zero": 1, "recompute": "full", "recompute_layers": 2},
         {"precision": "fp8", "global_batch_size": 64}),
    Case("megatron-nvfp4", "llama-3.1-8b", 8, "megatron", {"tp": 2, "zero": 1},
         {"precision": "fp4", "nvfp4_disable_rht": True}, cluster="dgx-b200"),
    Case("megatron-uneven-pp", "llama-3.1-8b", 32, "megatron",
         {"tp": 2, "pp": 4, "vpp": 2, "pp_first_stage_layers": 6, "pp_last_stage_layers": 6, "zero": 1}, {"global_batch_size": 64}),
    Case("megatron-fsdp", "llama-3.1-8b", 16, "megatron", {"tp": 2, "zero": 3}),
    Case("megatron-torch-fsdp2-zero2", "llama-3.1-8b", 8, "megatron", {"tp": 1, "zero": 2, "mbs": 2},
         options=LaunchOptions(megatron_fsdp=MegatronFsdp.TORCH, partition="batch", account="llm", time="04:00:00")),
    # torchtitan 0.3.x
    Case("titan-fsdp-tp-compile", "llama-3.1-8b", 16, "torchtitan", {"tp": 2, "recompute": "selective"},
         {"compile": True, "tp_comm_overlap": True}),
    Case("titan-hsdp-cp", "llama-3.1-8b", 32, "torchtitan", {"tp": 2, "cp": 2, "dp_shard": 4, "recompute": "full"},
         {"seq_len": 8192}),
    Case("titan-interleaved", "llama-3.1-8b", 32, "torchtitan", {"tp": 2, "pp": 4, "vpp": 2}, {"global_batch_size": 32}),
    Case("titan-uneven-pp", "llama-3.1-8b", 32, "torchtitan", {"tp": 2, "pp": 4, "pp_first_stage_layers": 6, "pp_last_stage_layers": 6},
         {"global_batch_size": 32}),
    Case("titan-uneven-interleaved", "llama-3.1-8b", 32, "torchtitan",
         {"tp": 2, "pp": 4, "vpp": 2, "pp_first_stage_layers": 6, "pp_last_stage_layers": 6}, {"global_batch_size": 32}),
    Case("titan-moe-ep", "qwen3-30b-a3b", 16, "torchtitan", {"ep": 8, "zero": 2, "recompute": "full"}),
    Case("titan-tp-without-sp", "llama-3.1-8b", 8, "torchtitan", {"tp": 2, "sp": False}),
    Case("titan-fp8-rowwise", "llama-3.1-8b", 8, "torchtitan", {"tp": 1}, {"precision": "fp8", "fp8_recipe": "rowwise"}),
    # torchtitan 0.2.x
    Case("titan02-fsdp-tp-compile", "llama-3.1-8b", 16, "torchtitan", {"tp": 2, "recompute": "selective"},
         {"compile": True, "tp_comm_overlap": True}, V02),
    Case("titan02-uneven-interleaved", "llama-3.1-8b", 32, "torchtitan",
         {"tp": 2, "pp": 4, "vpp": 2, "pp_first_stage_layers": 6, "pp_last_stage_layers": 6}, {"global_batch_size": 32}, V02),
    Case("titan02-moe-etp", "qwen3-30b-a3b", 16, "torchtitan", {"tp": 2, "ep": 4, "etp": 2, "zero": 3}, {}, V02),
    Case("titan02-fp8", "llama-3.1-8b", 8, "torchtitan", {"tp": 1}, {"precision": "fp8"}, V02),
    # DeepSpeed
    Case("deepspeed-zero3-full", "llama-3.1-8b", 8, "deepspeed", {"zero": 3, "recompute": "full"}, {"global_batch_size": 32}),
    Case("deepspeed-autotp-fp16", "llama-3.1-8b", 16, "deepspeed", {"tp": 2, "zero": 1, "mbs": 2},
         {"precision": "fp16", "global_batch_size": 64}),
    Case("deepspeed-zero2-gpt", "gpt2", 8, "deepspeed", {"zero": 2, "mbs": 8}, {"seq_len": 1024, "global_batch_size": 128}),
]

BY_NAME = {c.name: c for c in CASES}


def write(launch: LaunchFiles, directory: Path) -> Path:
    from planner.launch.build import write_launch

    write_launch(launch, directory)
    return directory


def run_train_sh(directory: Path, tmp: Path, env: dict[str, str] | None = None, *extra: str) -> list[str]:
    """Run train.sh with the stub torchrun first on PATH; return the argv torchrun got."""
    out = tmp / "argv.json"
    full = {
        "PATH": f"{STUB_DIR}:{os.environ['PATH']}",
        "ARGV_OUT": str(out),
        "MASTER_ADDR": "node0",
        "MEGATRON_LM": "/opt/Megatron-LM",
        "TOKENIZER_MODEL": "meta-llama/Llama-3.1-8B",
        "DATA_PATH": "0.7 /data/a_text_document 0.3 /data/b_text_document",
        "HF_ASSETS_PATH": "/assets/tokenizer",
        "CHECKPOINT_DIR": "/ckpt",
        "HOME": str(tmp),
        **(env or {}),
    }
    result = subprocess.run(["bash", str(directory / "train.sh"), *extra], env=full, capture_output=True, text=True, cwd=tmp)
    assert result.returncode == 0, result.stderr
    return json.loads(out.read_text())


def after(argv: list[str], marker: str) -> list[str]:
    return argv[argv.index(marker) + 1:]
