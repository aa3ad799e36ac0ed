"""The CLI through typer's CliRunner: output documents, and one clear line with exit code 2 for
every kind of bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner.cli import app

runner = CliRunner()
HF = Path(__file__).parent / "data" / "hf"
BASE = ["--cluster", "dgx-h100", "--gpus", "8"]


def run(*args: str):
    return runner.invoke(app, list(args))


def memory_json(*args: str) -> dict:
    result = run("memory", *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_memory_json_document():
    doc = memory_json("llama-3.1-70b", "--cluster", "dgx-h100", "--gpus", "64", "--tp", "8", "--pp", "4", "--recompute", "full", "--zero", "1", "--seq-len", "8192")
    assert doc["model"] == {"name": "llama-3.1-70b", "params_total": 70_553_706_496, "params_active": 70_553_706_496}
    mem = doc["memory"]
    assert set(mem) >= {"peak_bytes", "capacity_bytes", "fits", "breakdown", "per_stage"}
    assert len(mem["per_stage"]) == 4
    assert mem["peak_bytes"] == max(s["peak_bytes"] for s in mem["per_stage"]) == mem["breakdown"]["total"]
    assert mem["fits"] is (mem["peak_bytes"] <= mem["usable_bytes"])
    assert doc["layout"]["dp"] == 2 and doc["layout"]["zero"] == 1 and doc["layout"]["sp"] is True


def test_memory_accepts_hf_directory_and_spec_file(tmp_path):
    doc = memory_json(str(HF / "Mixtral-8x7B-v0.1"), *BASE, "--ep", "8", "--recompute", "full")
    assert doc["model"]["params_total"] == 46_702_792_704
    spec = tmp_path / "tiny.yaml"
    spec.write_text("num_layers: 4\nhidden_size: 512\nffn_hidden_size: 1376\nnum_attention_heads: 8\nvocab_size: 32000\n")
    assert memory_json(str(spec), *BASE)["model"]["name"] == "tiny"


def test_memory_table_names_the_peak_and_fit():
    result = run("memory", "llama-3.1-8b", *BASE, "--tp", "8")
    assert result.exit_code == 0
    assert "peak" in result.output and "fits" in result.output and "model_states/weights" in result.output


def test_presets_lists_every_required_name():
    result = run("presets", "--json")
    doc = json.loads(result.stdout)
    assert {"dgx-a100-40gb", "dgx-a100-80gb", "dgx-h100", "hgx-h200", "dgx-b200", "gb200-nvl72", "gb300-nvl72", "mi300x-8",
            "l40s-pcie-8"} <= set(doc["clusters"])
    assert {"A100-40GB", "A100-80GB", "H100-SXM", "H100-PCIe", "H200", "B200", "GB200", "GB300", "MI300X", "L40S"} <= set(doc["gpus"])
    assert {"gpt3-175b", "megatron-gpt-1t", "llama-2-70b", "llama-3.1-405b", "mistral-7b", "mixtral-8x22b", "qwen2.5-72b", "qwen3-235b-a22b"} <= set(doc["models"])


def estimate_json(*args: str) -> dict:
    result = run("estimate", *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_estimate_json_document():
    args = ["llama-3.1-70b", "--cluster", "dgx-h100", "--gpus", "64", "--tp", "8", "--pp", "4", "--recompute", "full", "--zero", "1"]
    doc = estimate_json(*args)
    assert doc["layout"]["dp"] == 2
    assert doc["memory"] == memory_json(*args)["memory"]  # the same memory model and document
    t, thr = doc["time"], doc["throughput"]
    assert t["step_s"] == pytest.approx(t["breakdown"]["total"])
    parts = {k for k in t["breakdown"] if k != "total"}
    assert parts == {"compute", "tp", "cp", "ep", "pp", "dp", "bubble", "optimizer", "straggler"}
    assert thr["tokens_per_s"] == pytest.approx(thr["tokens_per_step"] / t["step_s"])
    assert thr["tokens_per_s_per_gpu"] == pytest.approx(thr["tokens_per_s"] / 64)
    assert 0 < thr["mfu"] < thr["hfu"] < 1  # full recompute: executed FLOPs exceed model FLOPs
    assert doc["bottleneck"] == max(parts, key=lambda k: t["breakdown"][k]["total"] if isinstance(t["breakdown"][k], dict) else t["breakdown"][k])


def test_estimate_of_a_layout_that_does_not_fit_still_has_a_time():
    doc = estimate_json("llama-3.1-70b", *BASE)
    assert doc["memory"]["fits"] is False
    assert doc["time"]["step_s"] > 0 and doc["throughput"]["mfu"] > 0


def test_estimate_reads_a_calibration_file(tmp_path):
    base = estimate_json("llama-3.1-8b", *BASE)
    slow = tmp_path / "cal.json"
    slow.write_text(json.dumps({"gemm_scale": {"hopper": 0.25}, "source": "test"}))
    doc = estimate_json("llama-3.1-8b", *BASE, "--calibration", str(slow))
    assert doc["time"]["calibration"]["gemm_scale"]["hopper"] == 0.25
    assert doc["time"]["breakdown"]["compute"]["gemm"] > 1.5 * base["time"]["breakdown"]["compute"]["gemm"]


def test_estimate_table_shows_the_step_and_throughput():
    result = run("estimate", "llama-3.1-8b", *BASE)
    assert result.exit_code == 0, result.output
    assert "Step time" in result.output and "tokens/s/GPU" in result.output and "MFU" in result.output


def test_version():
    result = run("--version")
    assert result.exit_code == 0 and result.output.startswith("planner ")


# --- bad input: one line naming what is wrong, exit code 2, no traceback ---------------------------


def _write(tmp_path: Path, name: str, content: bytes | str) -> str:
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(path)


GOOD_TOML = 'num_layers = 4\nhidden_size = 512\nffn_hidden_size = 1376\nnum_attention_heads = 8\nvocab_size = 32000\n'

BAD = [
    ("unknown model preset", lambda t: ["memory", "llama-3.1-7b", *BASE], "closest: llama-3.1-70b"),
    ("unknown cluster preset", lambda t: ["memory", "llama-3.1-8b", "--cluster", "dgx-h10", "--gpus", "8"], "unknown cluster preset 'dgx-h10'"),
    ("malformed toml", lambda t: ["memory", _write(t, "m.toml", "num_layers = = 4"), *BASE], "malformed TOML"),
    ("malformed json", lambda t: ["memory", _write(t, "m.json", '{"num_layers": 4,'), *BASE], "malformed JSON"),
    ("malformed yaml", lambda t: ["memory", _write(t, "m.yaml", "num_layers: [4\n"), *BASE], "malformed YAML"),
    ("non-utf8", lambda t: ["memory", _write(t, "m.toml", b"num_layers = 4\n\xff\xfe"), *BASE], "not UTF-8"),
    ("empty file", lambda t: ["memory", _write(t, "m.toml", ""), *BASE], "file is empty"),
    ("unknown key", lambda t: ["memory", _write(t, "m.toml", GOOD_TOML + "num_layerz = 3\n"), *BASE], "unknown key 'num_layerz'"),
    ("negative size", lambda t: ["memory", _write(t, "m.toml", GOOD_TOML.replace("num_layers = 4", "num_layers = -4")), *BASE], "num_layers = -4"),
    ("missing key", lambda t: ["memory", _write(t, "m.toml", GOOD_TOML.replace("vocab_size = 32000\n", "")), *BASE], "missing required key 'vocab_size'"),
    ("zero tp", lambda t: ["memory", "llama-3.1-8b", *BASE, "--tp", "0"], "tp = 0"),
    ("non-divisible layout", lambda t: ["memory", "llama-3.1-70b", "--cluster", "dgx-h100", "--gpus", "96", "--tp", "8", "--pp", "4", "--cp", "2"], "tp(8)·pp(4)·cp(2) = 64 does not divide gpus(96)"),
    ("gpus not whole nodes", lambda t: ["memory", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "12"], "not a multiple of gpus_per_node(8)"),
    ("directory without config", lambda t: ["memory", str(t), *BASE], "has no config.json"),
    ("unsupported hf", lambda t: ["memory", _write(t, "config.json", '{"model_type": "t5", "d_model": 512}'), *BASE], "model_type 't5' is not supported"),
    ("bad cluster file", lambda t: ["memory", "llama-3.1-8b", "--cluster", _write(t, "c.toml", 'gpu = "H100-SXM"\ngpus_per_node = 8\n'), "--gpus", "8"], "missing required key"),
    ("unknown gpu in cluster", lambda t: ["memory", "llama-3.1-8b", "--cluster", _write(t, "c.toml", 'gpu = "H1000"\n'), "--gpus", "8"], "unknown GPU preset 'H1000'"),
    ("directory as cluster file", lambda t: ["memory", "llama-3.1-8b", "--cluster", str(t), "--gpus", "8"], "is a directory"),
    ("zero stage", lambda t: ["memory", "llama-3.1-8b", *BASE, "--zero", "5"], "zero = 5"),
    ("negative seq", lambda t: ["memory", "llama-3.1-8b", *BASE, "--seq-len", "-5"], "seq_len = -5"),
    ("framework rule", lambda t: ["memory", "llama-3.1-8b", *BASE, "--tp", "8", "--zero", "1", "--framework", "torchtitan"], "FSDP2 only"),
    ("headroom", lambda t: ["memory", "llama-3.1-8b", *BASE, "--headroom", "1.5"], "headroom(1.5) must be a fraction in [0, 1)"),
    ("estimate layout", lambda t: ["estimate", "llama-3.1-70b", "--cluster", "dgx-h100", "--gpus", "96", "--tp", "8", "--pp", "4", "--cp", "2"], "does not divide gpus(96)"),
    ("fp8 recipe without fp8", lambda t: ["estimate", "llama-3.1-8b", *BASE, "--fp8-recipe", "rowwise"], "fp8_recipe rowwise needs precision fp8"),
    ("rowwise on megatron", lambda t: ["estimate", "llama-3.1-8b", *BASE, "--dtype", "fp8", "--fp8-recipe", "rowwise"], "fp8_recipe rowwise is torchao's (torchtitan)"),
    ("mxfp8 on hopper", lambda t: ["estimate", "llama-3.1-8b", *BASE, "--dtype", "fp8", "--fp8-recipe", "mxfp8"], "fp8_recipe mxfp8 needs Blackwell tensor cores"),
    ("tp overlap without tp", lambda t: ["estimate", "llama-3.1-8b", *BASE, "--tp-comm-overlap"], "tp_comm_overlap needs tp > 1"),
    ("moe load factor below 1", lambda t: ["estimate", "mixtral-8x7b", *BASE, "--ep", "8", "--moe-load-factor", "0.5"], "moe_load_factor = 0.5"),
    ("moe overlap outside megatron", lambda t: ["estimate", "mixtral-8x7b", *BASE, "--ep", "8", "--framework", "torchtitan", "--moe-dispatch", "overlap"], "moe_dispatch overlap is Megatron's"),
    ("deepep under deepspeed", lambda t: ["estimate", "mixtral-8x7b", *BASE, "--ep", "8", "--framework", "deepspeed", "--moe-dispatch", "deepep"], "moe_dispatch deepep is Megatron's flex token dispatcher"),
    ("fp8 params without fp8", lambda t: ["estimate", "llama-3.1-8b", *BASE, "--fp8-param-gather"], "fp8_param_gather is Megatron's --fp8-param-gather with precision fp8"),
    ("calibration not json", lambda t: ["estimate", "llama-3.1-8b", *BASE, "--calibration", _write(t, "c.json", "{")], "malformed JSON"),
    ("calibration unknown key", lambda t: ["estimate", "llama-3.1-8b", *BASE, "--calibration", _write(t, "c.json", '{"gemm_eff": 0.5}')], "unknown field(s) ['gemm_eff']"),
    ("calibration bad value", lambda t: ["estimate", "llama-3.1-8b", *BASE, "--calibration", _write(t, "c.json", '{"gemm_scale": {"hopper": -1}}')], "gemm_scale.hopper(-1) must be a number in [1e-06, 1000]"),
    ("calibration missing", lambda t: ["estimate", "llama-3.1-8b", *BASE, "--calibration", str(t / "none.json")], "none.json: no such file"),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_input_is_one_line_exit_2(tmp_path, case):
    _, argv, needle = case
    result = run(*argv(tmp_path))
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert needle in lines[0]
    assert "Traceback" not in result.output


def test_plan_on_one_gb300_nvl72_rack():
    # 72 GPUs = one NVLink domain of 18 four-GPU trays; capacity is nvidia-smi's 284208 MiB per GPU
    # (presets/gpus.toml GB300), and usable is that less the 5% headroom
    r = run("plan", "llama-3.1-8b", "--cluster", "gb300-nvl72", "--gpus", "72", "--seq-len", "8192",
            "--global-batch-size", "72", "--dtype", "fp8", "--top", "1", "--json")
    assert r.exit_code == 0, r.output
    [best] = json.loads(r.stdout)["plans"]
    mem = best["memory"]
    assert mem["capacity_bytes"] == 284208 * 2**20 and mem["fits"]
    assert mem["usable_bytes"] == pytest.approx(0.95 * mem["capacity_bytes"], abs=1)
    lay = best["layout"]
    assert lay["tp"] * lay["pp"] * lay["cp"] * lay["dp"] == 72


def test_plan_names_the_batches_the_gpu_count_divides():
    # 1024 over 72 GPUs: data parallelism is held to divisors of 1024; 14·72 = 1008 and 15·72 = 1080
    from planner.runners import batch_hint

    assert batch_hint(1024, 72) == {"global_batch_size": 1024, "gpus": 72, "nearest": [1008, 1080]}
    assert batch_hint(1024, 64) is None and batch_hint(40, 72) == {"global_batch_size": 40, "gpus": 72, "nearest": [72]}
    r = CliRunner().invoke(app, ["plan", "llama-3.1-8b", "-c", "dgx-h100", "-g", "72", "--global-batch-size", "1024", "--top", "1"])
    assert r.exit_code == 0, r.output
    assert "--global-batch-size 1008 or 1080 is a multiple of 72" in " ".join(r.output.split())
