"""`planner launch`: golden files per emitter, the written directory, quoting, refusals and the
search path.

Golden files live in tests/golden/launch/<case>/<file> (the cases are in tests/launch_cases.py);
plan.json and README.md are not pinned, as they carry the cost model's numbers. After a deliberate
change to an emitter, regenerate them with

    PLANNER_UPDATE_GOLDEN=1 python -m pytest tests/test_launch.py -k golden

and review the diff.
"""

from __future__ import annotations

import functools
import json
import os
import re
import stat
import subprocess
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cost_models.errors import SpecError
from cost_models.states import embedding_params_local, megatron_padded_vocab, vocab_divisor
from helpers import LLAMA_TINY
from launch_cases import BY_NAME, CASES, GOLDEN, after, run_train_sh, write
from planner import presets
from planner.cli import app
from planner.launch.build import LaunchOptions, run_launch, write_launch
from planner.launch.shell import slug

runner = CliRunner()
UPDATE = os.environ.get("PLANNER_UPDATE_GOLDEN") == "1"
PINNED = {"train.sh", "job.sbatch", "ds_config.json", "torchtitan.toml", "torchtitan_plan.py"}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_golden(case):
    files = case.build().files
    folder = GOLDEN / case.name
    pinned = {name: f.text for name, f in files.items() if name in PINNED}
    if UPDATE:
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.iterdir():
            old.unlink()
        for name, text in pinned.items():
            (folder / name).write_text(text)
    assert sorted(p.name for p in folder.iterdir()) == sorted(pinned), "files differ from the golden set"
    for name, text in pinned.items():
        assert text == (folder / name).read_text(), f"{case.name}/{name} differs from its golden file"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_scripts_are_valid_bash(case, tmp_path):
    directory = write(case.build(), tmp_path / "launch")
    for script in ("train.sh", "job.sbatch"):
        if (directory / script).exists():
            result = subprocess.run(["bash", "-n", str(directory / script)], capture_output=True, text=True)
            assert result.returncode == 0, result.stderr
            assert os.stat(directory / script).st_mode & stat.S_IXUSR


# --- what the files say ---------------------------------------------------------------------------


def test_plan_json_is_the_estimate_document(tmp_path):
    args = ["llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "16", "--tp", "2", "--pp", "2", "--zero", "1", "--recompute", "full"]
    result = runner.invoke(app, ["launch", *args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    estimate = json.loads(runner.invoke(app, ["estimate", *args, "--json"]).stdout)
    assert plan["prediction"] == estimate
    assert plan["layout"] == estimate["layout"] and plan["rank"] is None
    assert plan["specs"]["model"]["name"] == "llama-3.1-8b" and plan["specs"]["gpus"] == 16
    assert plan["specs"]["training"] == estimate["training"]
    assert (plan["nodes"], plan["gpus_per_node"]) == (2, 8)
    assert plan["files"] == sorted(p.name for p in (tmp_path / "out").iterdir())
    readme = (tmp_path / "out" / "README.md").read_text()
    assert f"step time {estimate['time']['step_s']:.3f} s" in readme
    assert f"MFU {estimate['throughput']['mfu']:.1%}" in readme
    assert "`MEGATRON_LM`" in readme and "`job.sbatch`" in readme and "sbatch job.sbatch" in readme


def test_search_takes_plan_k(tmp_path):
    base = ["llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch-size", "64"]
    plans = json.loads(runner.invoke(app, ["plan", *base, "--top", "2", "--json"]).stdout)["plans"]
    for rank in (1, 2):
        out = tmp_path / f"rank{rank}"
        flags = [] if rank == 1 else ["--rank", "2"]
        result = runner.invoke(app, ["launch", *base, *flags, "--out", str(out)])
        assert result.exit_code == 0, result.output
        plan = json.loads((out / "plan.json").read_text())
        assert plan["rank"] == rank
        assert plan["layout"] == plans[rank - 1]["layout"]
        assert plan["prediction"]["time"]["step_s"] == pytest.approx(plans[rank - 1]["time"]["step_s"])
        assert "from plan #%d of `planner plan`" % rank in (out / "README.md").read_text()


def test_search_with_fix_pins_the_axis(tmp_path):
    result = runner.invoke(app, ["launch", "llama-3.1-8b", "-c", "dgx-h100", "-g", "8", "--global-batch-size", "64",
                                 "--framework", "deepspeed", "--fix", "pp=2", "--out", str(tmp_path / "o")])
    # plan ranks no layout its launch refuses: DeepSpeed's launch writes no pipeline
    assert result.exit_code == 2 and "launch refuses it: DeepSpeed's pipeline (pp=2)" in result.output
    assert not (tmp_path / "o").exists()
    result = runner.invoke(app, ["launch", "llama-3.1-8b", "-c", "dgx-h100", "-g", "8", "--global-batch-size", "64",
                                 "--framework", "deepspeed", "--fix", "pp=1", "--fix", "zero=1", "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "o" / "ds_config.json").read_text())
    assert config["zero_optimization"]["stage"] == 1


def test_megatron_environment_follows_the_rules():
    def env(name: str, **kw) -> str:
        return next(line for line in BY_NAME[name].build().files["train.sh"].text.splitlines()
                    if "CUDA_DEVICE_MAX_CONNECTIONS" in line and not line.startswith("#"))

    assert env("megatron-gqa-selective") == "export CUDA_DEVICE_MAX_CONNECTIONS=1"  # tp 2 on Hopper
    assert env("megatron-fsdp") == "unset CUDA_DEVICE_MAX_CONNECTIONS"  # FSDP forbids 1, even with tp 2
    text = BY_NAME["megatron-gpt-learned-tied"].build().files["train.sh"].text  # tp 1, cp 1: neither
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in text


def test_megatron_nvfp4_flags_and_environment():
    # --fp4-format e2m1 --fp4-recipe nvfp4 with --bf16 and no fp8 flag (Megatron refuses both formats:
    # Megatron-LM@d3391901 arguments.py:662-664), and TE's NVTE_NVFP4_DISABLE_RHT where the plan turns
    # the Hadamard transform off
    text = BY_NAME["megatron-nvfp4"].build().files["train.sh"].text
    assert "--fp4-format e2m1" in text and "--fp4-recipe nvfp4" in text and "--bf16" in text
    assert "--fp8-format" not in text and "--fp8-param-gather" not in text
    assert "export NVTE_NVFP4_DISABLE_RHT=1" in text.splitlines()
    default = run_launch("llama-3.1-8b", "dgx-b200", 8, training={"precision": "fp4"}, layout={"tp": 2}).files["train.sh"].text
    assert "--fp4-format e2m1" in default and "NVTE_NVFP4_DISABLE_RHT" not in default


def test_megatron_on_blackwell_leaves_the_queues_alone():
    report = run_launch("llama-3.1-8b", "dgx-b200", 8, training={}, layout={"tp": 2}).files["train.sh"].text
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in report


@pytest.mark.parametrize(("vocab", "tp", "divisor", "padded"), [
    (128256, 2, 128, 128256),  # 128256 = 2^8 * 501: 128 * 2 divides it, no padding
    (128256, 8, 32, 128256),  # 128 * 8 and 64 * 8 do not divide it, 32 * 8 = 256 does
    (50257, 1, 1, 50257),  # GPT-2's odd vocabulary needs no padding without tp
    (50257, 8, 128, 51200),  # ... and cannot avoid it with tp 8: Megatron's default, up to a multiple of 1024
])
def test_vocab_padding(vocab, tp, divisor, padded):
    assert vocab_divisor(vocab, tp) == divisor
    assert megatron_padded_vocab(vocab, tp, divisor) == padded


def _launched_rows(model: str, training: dict) -> tuple[int, int]:
    """(--padded-vocab-size of the Megatron train.sh at tp 8, the estimate's word-embedding parameters on a rank)."""
    files = run_launch(model, "dgx-h100", 8, training=training, layout={"tp": 8})
    rows = re.search(r"--padded-vocab-size (\d+)", files.files["train.sh"].text)
    assert rows is not None
    return int(rows.group(1)), embedding_params_local(files.report.job)


@pytest.mark.parametrize(("training", "rows"), [
    # 128256 = 2^8·501: 32·8 = 256 divides it, so the planner pads nothing
    ({}, 128256),
    # Megatron's own default 128 (--make-vocab-size-divisible-by): up to a multiple of 128·8 = 1024, 126·1024
    ({"vocab_divisible_by": 128}, 129024),
])
def test_launch_writes_the_vocabulary_the_estimate_prices(training, rows):
    # Llama 3.1 8B at tp 8 (hidden 4096, rotary positions, no embedding norm): each rank's word embedding
    # is rows·4096/8 parameters, and train.sh gives Megatron the same rows
    padded, embedding = _launched_rows("llama-3.1-8b", training)
    assert padded == rows
    assert embedding == rows * 4096 // 8


@pytest.mark.parametrize(("vocab", "training", "rows"), [
    (50257, {}, 51200),  # odd: no power of two times 8 divides it, so Megatron's 128: 50·1024
    (50257, {"vocab_divisible_by": 1}, 50264),  # a multiple of 1·8: 6283·8
    (1000, {}, 1000),  # 1000 = 8·125: divisor 1 pads nothing
    (1000, {"vocab_divisible_by": 128}, 1024),  # up to a multiple of 1024
])
def test_padded_vocabulary_of_a_spec_file(tmp_path, vocab, training, rows):
    # llama-tiny (hidden 256) at tp 8: each rank's word embedding is rows·256/8 parameters
    spec = tmp_path / "model.json"
    spec.write_text(LLAMA_TINY.model_copy(update={"vocab_size": vocab}).model_dump_json())
    padded, embedding = _launched_rows(str(spec), training)
    assert padded == rows
    assert embedding == rows * 256 // 8


def test_vocab_divisible_by_is_megatrons_flag():
    result = runner.invoke(app, ["estimate", "llama-3.1-8b", "-c", "dgx-h100", "-g", "8", "--tp", "8",
                                 "--framework", "torchtitan", "--vocab-divisible-by", "128"])
    assert result.exit_code == 2
    assert "vocab_divisible_by is Megatron's --make-vocab-size-divisible-by (framework=torchtitan)" in result.output
    assert "Traceback" not in result.output
    result = runner.invoke(app, ["estimate", "llama-3.1-8b", "-c", "dgx-h100", "-g", "8", "--tp", "8",
                                 "--vocab-divisible-by", "0"])
    assert result.exit_code == 2
    assert "vocab_divisible_by" in result.output and "Traceback" not in result.output


def test_slurm_options_and_nodes_file(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("# two nodes\ngpu-a01\ngpu-a02 slots=8\n\n")
    out = tmp_path / "o"
    result = runner.invoke(app, ["launch", "llama-3.1-8b", "-c", "dgx-h100", "-g", "16", "--tp", "2", "--zero", "1",
                                 "--nodes-file", str(hosts), "--partition", "gpu", "--time", "01:00:00", "--port", "29600",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    sbatch = (out / "job.sbatch").read_text()
    assert "#SBATCH --nodes=2" in sbatch and "#SBATCH --partition=gpu" in sbatch and "#SBATCH --time=01:00:00" in sbatch
    assert "#SBATCH --nodelist=gpu-a01,gpu-a02" in sbatch and "export MASTER_PORT=29600" in sbatch
    assert 'MASTER_ADDR="${MASTER_ADDR:-gpu-a01}"' in (out / "train.sh").read_text()  # the first host by default
    argv = run_train_sh(out, tmp_path)  # MASTER_ADDR=node0, as job.sbatch exports it
    assert argv[argv.index("--rdzv-endpoint") + 1] == "node0:29600"


def test_single_node_needs_no_rendezvous_and_no_sbatch(tmp_path):
    launch = BY_NAME["megatron-gqa-selective"].build()
    assert "job.sbatch" not in launch.files
    directory = write(launch, tmp_path / "launch")
    argv = run_train_sh(directory, tmp_path, {"MASTER_ADDR": "localhost"})
    assert argv[:10] == ["--nnodes", "1", "--nproc-per-node", "8", "--rdzv-backend", "c10d",
                         "--rdzv-endpoint", "localhost:29500", "--rdzv-id", "planner"]


def test_multi_node_train_sh_demands_master_addr(tmp_path):
    directory = write(BY_NAME["megatron-cp"].build(), tmp_path / "launch")
    env = {"PATH": os.environ["PATH"], "MEGATRON_LM": "/m", "TOKENIZER_MODEL": "t", "DATA_PATH": "/d", "CHECKPOINT_DIR": "/c"}
    result = subprocess.run(["bash", str(directory / "train.sh")], env=env, capture_output=True, text=True)
    assert result.returncode != 0 and "MASTER_ADDR" in result.stderr


REQUIRED = {
    "megatron-gqa-selective": ["MEGATRON_LM", "TOKENIZER_MODEL", "DATA_PATH", "CHECKPOINT_DIR"],
    "titan-fsdp-tp-compile": ["HF_ASSETS_PATH", "CHECKPOINT_DIR"],
    "deepspeed-zero3-full": ["TOKENIZER_MODEL", "DATA_PATH", "CHECKPOINT_DIR"],
}


@pytest.mark.parametrize("name", REQUIRED)
def test_fill_in_variables_are_required(name, tmp_path):
    """Each data / tokenizer / checkpoint path left unset stops train.sh before torchrun, naming it."""
    directory = write(BY_NAME[name].build(), tmp_path / "launch")
    full = {"PATH": os.environ["PATH"], "MASTER_ADDR": "n0", **{v: "/x" for v in REQUIRED[name]}}
    for var in REQUIRED[name]:
        env = {k: v for k, v in full.items() if k != var}
        result = subprocess.run(["bash", str(directory / "train.sh")], env=env, capture_output=True, text=True)
        assert result.returncode != 0 and f"{var}: set {var}" in result.stderr, (var, result.stderr)


# --- quoting --------------------------------------------------------------------------------------


# Llama 3.1 8B's shape, rope and norm: a spec file that torchtitan's 8B flavour equals.
LLAMA_31_8B = {
    "num_layers": 32, "hidden_size": 4096, "ffn_hidden_size": 14336, "num_attention_heads": 32, "num_kv_heads": 8,
    "vocab_size": 128256, "max_position_embeddings": 131072, "rope_theta": 500000.0, "norm_eps": 1e-5,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
}


def test_hostile_model_name_cannot_inject(tmp_path):
    marker = tmp_path / f"pwned-{uuid.uuid4().hex}"
    name = f'evil $(touch {marker}) `touch {marker}` "quote\' name; touch {marker} & next | word'
    spec = {"name": name, **LLAMA_31_8B}
    spec_file = tmp_path / "evil.json"
    spec_file.write_text(json.dumps(spec))
    checked = 0
    for framework, marker_arg in (("megatron", "--wandb-exp-name"), ("torchtitan", "--dump_folder"), ("deepspeed", None)):
        out = tmp_path / framework
        flags = ["--tp", "2", "--zero", "1" if framework != "torchtitan" else "3"]
        result = runner.invoke(app, ["launch", str(spec_file), "-c", "dgx-h100", "-g", "16", "--framework", framework,
                                     *flags, "--partition", "p1", "--out", str(out)])
        assert result.exit_code == 0, result.output
        for script in ("train.sh", "job.sbatch"):
            check = subprocess.run(["bash", "-n", str(out / script)], capture_output=True, text=True)
            assert check.returncode == 0, check.stderr
        assert "#SBATCH --job-name=evil-touch" in (out / "job.sbatch").read_text()
        argv = run_train_sh(out, tmp_path)
        assert not marker.exists(), f"{framework}: the name ran a command"
        if marker_arg:
            value = argv[argv.index(marker_arg) + 1]
            assert value.endswith(name)  # one argv element, quotes and all
            checked += 1
        assert json.loads((out / "plan.json").read_text())["specs"]["model"]["name"] == name
    assert checked == 2


def test_megatron_refuses_a_rope_factor_its_model_builder_drops(tmp_path):
    """pretrain_gpt.py builds GPTModel without --rope-scaling-factor, so only 8.0 reaches the model
    (Llama 3.2's 32 would train Llama 3.1's scaling); DeepSpeed's config.json carries the factor."""
    spec = {"name": "llama-factor-32", **LLAMA_31_8B, "rope_scaling": {**LLAMA_31_8B["rope_scaling"], "factor": 32.0}}
    spec_file = tmp_path / "m.json"
    spec_file.write_text(json.dumps(spec))
    common = ["launch", str(spec_file), "-c", "dgx-h100", "-g", "8", "--tp", "1", "--zero", "1"]
    result = runner.invoke(app, [*common, "--out", str(tmp_path / "m")])
    assert result.exit_code == 2 and "rope scaling factor 32.0" in result.output and not (tmp_path / "m").exists()
    result = runner.invoke(app, [*common, "--framework", "deepspeed", "--out", str(tmp_path / "d")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "d" / "config.json").read_text())["rope_scaling"]["factor"] == 32.0


def test_torchtitan_toml_escapes_the_name(tmp_path):
    import tomllib

    name = 'quote" back\\slash ] [section] modèle 😀 # not a comment'
    spec = {"name": name, **LLAMA_31_8B}
    (tmp_path / "m.json").write_text(json.dumps(spec))
    launch = run_launch(str(tmp_path / "m.json"), "dgx-h100", 8, training={"framework": "torchtitan"}, layout={"tp": 1},
                        options=LaunchOptions(torchtitan_version="0.2"))
    doc = tomllib.loads(launch.files["torchtitan.toml"].text)
    assert doc["job"]["description"] == name and doc["model"] == {"name": "llama3", "flavor": "8B"}


def test_a_name_with_a_control_character_is_refused(tmp_path):
    """A name is written into scripts, TOML and one-line tables: a newline, NUL or escape sequence in
    it is refused where the spec is read, before anything is written."""
    for bad in ("two\nlines", "nul\x00byte", "\x1b[31mred"):
        spec = {"name": bad, "num_layers": 4, "hidden_size": 512, "ffn_hidden_size": 1376, "num_attention_heads": 8,
                "vocab_size": 32000}
        (tmp_path / "m.json").write_text(json.dumps(spec))
        result = runner.invoke(app, ["launch", str(tmp_path / "m.json"), "-c", "dgx-h100", "-g", "8", "--tp", "1",
                                     "--out", str(tmp_path / "o")])
        assert result.exit_code == 2 and "is not allowed in a name" in result.output, result.output
        assert "\x1b[" not in result.output and not (tmp_path / "o").exists()


def test_slug():
    assert slug("evil $(touch x)") == "evil-touch-x"
    assert slug("$$$") == "planner"


# --- refusals: one line, exit 2, nothing written -----------------------------------------------------


@pytest.mark.parametrize(("args", "message"), [
    (["llama-3.1-8b", "-g", "16", "--pp", "2", "--zero", "3"], "zero 3"),  # torch-FSDP2 / FSDP with pp > 1 (rules)
    (["gpt2", "-g", "8", "--seq-len", "1024", "--zero", "3", "--megatron-fsdp", "torch"], "--use-torch-fsdp2 does not run with tied embeddings"),
    (["mixtral-8x7b", "-g", "16", "--ep", "8", "--zero", "3", "--megatron-fsdp", "torch"], "expert parallelism"),
    (["llama-3.1-8b", "-g", "16", "--pp", "2", "--zero", "2"], "runs with pp = 1"),
    (["llama-3.1-8b", "-g", "16", "--pp", "2", "--framework", "deepspeed"], "PipelineModule"),
    (["llama-3.1-8b", "-g", "16", "--pp", "2", "--schedule", "gpipe"], "not gpipe"),
    (["llama-3.1-8b", "-g", "16", "--tp", "2", "--zero", "3", "--framework", "deepspeed"], "AutoTP"),
    (["llama-3.1-8b", "-g", "16", "--zero", "3", "--dp-shard", "8", "--framework", "deepspeed"], "MiCS"),
    (["llama-3.1-8b", "-g", "8", "--framework", "deepspeed", "--dtype", "fp8"], "fp8"),
    (["llama-3.1-8b", "-g", "8", "--framework", "torchtitan", "--dtype", "fp16"], "bf16 or fp8"),
    (["llama-3.1-8b", "-g", "8", "--framework", "torchtitan", "--dtype", "fp4"], "run by Megatron's --fp4-format e2m1 (framework=torchtitan"),
    (["llama-3.1-8b", "-g", "8", "--framework", "deepspeed", "--dtype", "fp4"], "run by Megatron's --fp4-format e2m1 (framework=deepspeed"),
    (["llama-3.1-8b", "-g", "8", "--framework", "torchtitan", "--recompute", "full", "--recompute-layers", "2"], "recompute_layers"),
    (["qwen3-30b-a3b", "-g", "16", "--framework", "torchtitan", "--tp", "2", "--ep", "4", "--etp", "2"], "etp(2) must be 1"),
    (["llama-3.1-8b", "-g", "8", "--framework", "torchtitan", "--dtype", "fp8"], "rowwise"),
    (["llama-3.1-8b", "-g", "8", "--framework", "torchtitan", "--tp", "2", "--no-sp", "--torchtitan-version", "0.2"], "sequence parallel"),
    # torchtitan 0.2 applies fully_shard only at dp_shard or cp above 1: tp without it trains in fp32,
    # data parallelism alone runs DDP (planner.launch.options.titan02_keeps_mixed_precision)
    (["llama-3.1-8b", "-g", "8", "--framework", "torchtitan", "--tp", "8", "--torchtitan-version", "0.2"], "train this layout in fp32"),
    (["llama-3.1-8b", "-g", "8", "--framework", "torchtitan", "--zero", "3", "--dp-shard", "1", "--torchtitan-version", "0.2"], "run DDP instead"),
    (["mixtral-8x7b", "-g", "32", "--ep", "8", "--framework", "torchtitan"], "no registry entry"),
    (["minitron-4b", "-g", "8", "--framework", "torchtitan"], "torchtitan has no Nemotron-4 model"),
    (["deepseek-v2-lite", "-g", "8", "--ep", "8", "--framework", "torchtitan"], "torchtitan's deepseek_v3 module"),
    (["deepseek-v3", "-g", "512", "--zero", "3", "--framework", "deepspeed", "--recompute", "full"], "builds no multi-token prediction module"),
    (["llama-3.1-8b", "-g", "8", "--framework", "torchtitan", "--torchtitan-model", "llama3 8B"], "--torchtitan-model"),
    (["llama-3.1-8b", "-g", "8", "--tp", "2", "--rank", "2"], "--rank steers the search"),
    (["llama-3.1-8b", "-g", "8", "--global-batch-size", "64", "--rank", "0"], "--rank(0) must be at least 1"),
    (["llama-3.1-8b", "-g", "8", "--global-batch-size", "64", "--rank", "3", *"--fix tp=8 --fix sp=true --fix mbs=1 --fix zero=1 --fix recompute=none".split()],
     "--rank(3): the search found only"),
    (["llama-3.1-8b", "-g", "16", "--tp", "2", "--partition", "a b"], "#SBATCH value"),
    (["llama-3.1-8b", "-g", "8", "--tp", "3"], "tp(3)·pp(1)·cp(1) = 3 does not divide gpus(8)"),
    # what no Megatron-LM@d98e8a64 flag says: each names the framework that runs the model
    (["gemma-2-9b", "-g", "8"], "tanh soft-capping of attention scores or logits has no Megatron flag"),
    (["gemma-3-1b", "-g", "8"], "four norms per layer) has no Megatron flag (Megatron-LM@d98e8a64); use --framework deepspeed"),
    (["llama-4-scout-17b-16e", "-g", "16", "--ep", "16", "--etp", "1"], "chunked attention has no Megatron flag"),
    (["gemma-2-9b", "-g", "8", "--framework", "torchtitan"], "no model config can be generated (geglu MLP)"),
    (["llama-4-scout-17b-16e", "-g", "16", "--ep", "16", "--framework", "torchtitan"], "no registry entry"),
])
def test_refusals_are_one_line_and_write_nothing(tmp_path, args, message):
    out = tmp_path / "out"
    result = runner.invoke(app, ["launch", *args, "--cluster", "dgx-h100", "--out", str(out)])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.output
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_nodes_file_must_match_the_node_count(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("a\nb\nc\n")
    result = runner.invoke(app, ["launch", "llama-3.1-8b", "-c", "dgx-h100", "-g", "16", "--tp", "2",
                                 "--nodes-file", str(hosts), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "lists 3 hosts" in result.output and not (tmp_path / "o").exists()


def test_non_empty_out_needs_force(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("keep")
    args = ["launch", "llama-3.1-8b", "-c", "dgx-h100", "-g", "8", "--tp", "2", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "--force" in result.output and result.output.count("\n") == 1
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    result = runner.invoke(app, [*args, "--force"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "plan.json", "train.sh"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no staging directory left behind


def test_write_is_all_or_nothing(tmp_path, monkeypatch):
    """The disk fills up at the second file: one line naming --out and the cause, nothing left."""
    from helpers import disk_full_at_fsync

    launch = BY_NAME["megatron-gqa-selective"].build()
    out = tmp_path / "out"
    disk_full_at_fsync(monkeypatch, 2)
    with pytest.raises(SpecError, match=r"--out .*/out: no space left on device"):
        write_launch(launch, out)
    monkeypatch.undo()
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_train_sh_passes_extra_arguments(tmp_path):
    directory = write(BY_NAME["titan-interleaved"].build(), tmp_path / "launch")
    argv = run_train_sh(directory, tmp_path, None, "--training.steps", "5")
    assert after(argv, "torchtitan.train")[-3:] == ["--training.steps", "5", "activation-checkpoint:none"]


# --- Kubernetes -----------------------------------------------------------------------------------

SCHEMA = Path(__file__).parent / "data" / "pytorchjob_v1_schema.json"


def _strict(node):
    """The CRD schema with unknown fields refused: Kubernetes prunes or (kubectl --validate=strict, the
    default since 1.27) rejects fields a structural schema does not list; jsonschema would accept them."""
    if isinstance(node, dict):
        out = {k: _strict(v) for k, v in node.items()}
        if "properties" in node and "additionalProperties" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


@functools.cache
def _validator():
    import jsonschema

    schema = _strict(json.loads(SCHEMA.read_text()))
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


@pytest.mark.parametrize("name", ["megatron-cp", "titan-interleaved", "megatron-torch-fsdp2-zero2", "titan02-fsdp-tp-compile",
                                  "deepspeed-autotp-fp16"])
def test_job_yaml_validates_against_the_pytorchjob_crd(name):
    jsonschema = pytest.importorskip("jsonschema")
    import yaml

    launch = BY_NAME[name].build()
    doc = yaml.safe_load(launch.files["job.yaml"].text)
    validator = _validator()
    validator.validate(doc)
    target = launch.report.job
    specs = doc["spec"]["pytorchReplicaSpecs"]
    pods = sum(s["replicas"] for s in specs.values())
    gpus = {s["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] for s in specs.values()}
    assert pods * gpus.pop() == target.gpus and int(doc["spec"]["nprocPerNode"]) * pods == target.gpus
    container = specs["Master"]["template"]["spec"]["containers"][0]
    assert container["name"] == "pytorch" and container["ports"][0]["name"] == "pytorchjob-port"
    assert container["command"] == ["bash", "/launch/train.sh"]
    # a misspelled key fails: the check is real
    specs["Master"]["template"]["spec"]["containers"][0]["resorces"] = {}
    with pytest.raises(jsonschema.ValidationError, match="resorces"):
        validator.validate(doc)


def _cluster_file(tmp_path: Path, **changes) -> str:
    """dgx-h100's preset table as a cluster file, with some fields changed."""
    import tomllib

    table = tomllib.loads((Path(__file__).parents[1] / "presets" / "clusters.toml").read_text())["dgx-h100"]
    table = {**table, "name": "test-cluster", **changes}
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({k: v for k, v in table.items() if v is not None}))
    return str(path)


@pytest.mark.parametrize(("fabric", "lines"), [
    ("infiniband", ["# Fabric: InfiniBand."]),
    ("roce", ["# Fabric: RoCE.", "NCCL_IB_GID_INDEX"]),
    ("efa", ['export FI_PROVIDER="${FI_PROVIDER:-efa}"', 'export NCCL_BUFFSIZE="${NCCL_BUFFSIZE:-2097152}"',
             'export FI_EFA_SET_CUDA_SYNC_MEMOPS="${FI_EFA_SET_CUDA_SYNC_MEMOPS:-0}"']),
    ("unspecified", []),
])
def test_fabric_environment_and_devices(tmp_path, fabric, lines):
    changes = {"fabric": fabric, "efa_devices_per_node": 32 if fabric == "efa" else None}
    cluster = _cluster_file(tmp_path, **changes)
    launch = run_launch("llama-3.1-8b", cluster, 16, training={"framework": "megatron"}, layout={"tp": 2, "zero": 1})
    files = launch.files
    text = files["train.sh"].text
    assert all(line in text for line in lines)
    assert ("FI_PROVIDER" in text) is (fabric == "efa") and ("# Fabric:" in text) is (fabric != "unspecified")
    import yaml

    doc = yaml.safe_load(files["job.yaml"].text)
    _validator().validate(doc)
    limits = [s["template"]["spec"]["containers"][0]["resources"]["limits"] for s in doc["spec"]["pytorchReplicaSpecs"].values()]
    expected = {"nvidia.com/gpu": 8, **({"vpc.amazonaws.com/efa": 32} if fabric == "efa" else {})}
    assert limits == [expected, expected]
    # the directory runs: train.sh with the EFA exports is valid bash and reaches torchrun
    run_train_sh(write(launch, tmp_path / "launch"), tmp_path)


def test_efa_needs_its_device_count(tmp_path):
    result = runner.invoke(app, ["launch", "llama-3.1-8b", "-c", _cluster_file(tmp_path, fabric="efa"), "-g", "16",
                                 "--tp", "2", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "efa_devices_per_node" in result.output


HF = Path(__file__).parent / "data" / "hf"


def test_megatron_window_sink_and_nope_flags(tmp_path):
    """A sliding window of w tokens is --window-size (w-1,0) (TE window_size (left, right) counts keys
    besides the query); one full layer in four is --window-attn-skip-freq 4; sinks are
    --softmax-type learnable (Megatron-LM@d98e8a64 arguments.py:2384-2392, transformer_config.py:170)."""
    spec = tmp_path / "swa.toml"
    spec.write_text('num_layers = 8\nhidden_size = 512\nffn_hidden_size = 1536\nnum_attention_heads = 8\n'
                    'vocab_size = 32000\nsliding_window = 1024\nfull_attention_every = 4\nattention_sinks = true\n')
    out = tmp_path / "o"
    fixed = ["--pp", "1", "--mbs", "1", "--zero", "1", "--recompute", "none", "--seq-len", "4096"]
    result = runner.invoke(app, ["launch", str(spec), "-c", "dgx-h100", "-g", "8", "--tp", "1", *fixed, "--out", str(out)])
    assert result.exit_code == 0, result.output
    text = (out / "train.sh").read_text()
    assert "--window-size '(1023,0)'" in text and "--window-attn-skip-freq 4" in text and "--softmax-type learnable" in text
    # the same model with context parallelism: TE's p2p ring refuses a window
    result = runner.invoke(app, ["launch", str(spec), "-c", "dgx-h100", "-g", "8", "--tp", "1", "--cp", "2", *fixed, "--out", str(tmp_path / "p")])
    assert result.exit_code == 2 and "context parallel (cp=2) with sliding-window (1024)" in result.output


@pytest.mark.parametrize(("fixture", "framework", "seq", "message"), [
    ("pythia-1.4b", "megatron", 2048, "use_parallel_residual"),
    ("pythia-1.4b", "deepspeed", 2048, None),  # gpt_neox's config default keeps the parallel residual
    ("Qwen2.5-7B", "megatron", 8192, None),  # sliding_window with use_sliding_window false
    # Mistral's window is the spec's: carried by Megatron and DeepSpeed, refused by torchtitan's llama3
    # modules only where it masks something (seq > window)
    ("Mistral-7B-v0.1", "megatron", 8192, None),
    ("mistral-7b", "deepspeed", 8192, None),
    ("mistral-7b", "torchtitan", 8192, "sliding_window 4096 < seq_len 8192, and torchtitan's llama3 modules have no sliding-window"),
    ("mistral-7b", "torchtitan", 4096, None),  # a window as long as the sequence is full causal attention
])
def test_hf_settings_the_spec_drops_are_refused(tmp_path, fixture, framework, seq, message):
    out = tmp_path / "o"
    model = str(HF / fixture) if (HF / fixture).exists() else fixture
    zero = "3" if framework == "torchtitan" else "1"
    result = runner.invoke(app, ["launch", model, "-c", "dgx-h100", "-g", "8", "--tp", "1", "--zero", zero,
                                 "--framework", framework, "--seq-len", str(seq), "--out", str(out)])
    if message is None:
        assert result.exit_code == 0, result.output
    else:
        lines = [ln for ln in result.output.splitlines() if ln.strip()]
        assert result.exit_code == 2 and len(lines) == 1 and message in lines[0], result.output
        assert not out.exists()


def test_mtp_with_a_pipeline_layout_is_a_refused_layout():
    """--pp-layout has no m (MTP) character here, so an MTP model's explicit layout is refused as a
    layout (the search skips it), and the same model with --pp-first-layers is launched."""
    from helpers import LLAMA_TINY, make_job

    from cost_models.errors import LayoutError
    from planner.launch.build import launch_refusal

    mtp = LLAMA_TINY.model_copy(update={"name": "tiny-mtp", "mtp_layers": 1})
    refused = launch_refusal(make_job(mtp, gpus=16, pp=2, pp_layout="Ett|ttL", training=dict(framework="megatron")))
    assert isinstance(refused, LayoutError) and "MTP layer(s)" in str(refused)
    assert launch_refusal(make_job(mtp, gpus=16, pp=2, pp_first_stage_layers=2, training=dict(framework="megatron"))) is None


def test_mistral_window_reaches_megatron_and_deepspeed(tmp_path):
    """Mistral-7B-v0.1's 4096-token window on every layer: Megatron's --window-size (left 4095: the
    query itself counts) without --window-attn-skip-freq (all layers windowed when it is unset), and
    a MistralConfig config.json with sliding_window 4096 for DeepSpeed's Hugging Face model."""
    common = ["-c", "dgx-h100", "-g", "8", "--tp", "1", "--zero", "1", "--seq-len", "8192"]
    mg = runner.invoke(app, ["launch", "mistral-7b", *common, "--out", str(tmp_path / "m")])
    assert mg.exit_code == 0, mg.output
    text = (tmp_path / "m" / "train.sh").read_text()
    assert "--window-size '(4095,0)'" in text and "--window-attn-skip-freq" not in text
    ds = runner.invoke(app, ["launch", "mistral-7b", *common, "--framework", "deepspeed", "--out", str(tmp_path / "d")])
    assert ds.exit_code == 0, ds.output
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    assert (cfg["model_type"], cfg["sliding_window"]) == ("mistral", 4096)


def test_megatron_yarn_outside_mla_fixed_fields_is_refused(tmp_path):
    """MLATransformerConfig's original length and betas have no flag (megatron.MLA_YARN_FIXED): a
    DeepSeek-V2-Lite with beta_fast 16 is refused with the rule, a 40x YaRN at the fixed values is
    carried by --rope-type yarn and the factor."""
    spec = presets.models()["deepseek-v2-lite"]
    for beta, expected in ((16.0, 2), (32.0, 0)):
        rs = spec.rope_scaling.model_copy(update={"beta_fast": beta})
        path = tmp_path / f"ds-{int(beta)}.json"
        path.write_text(json.dumps(spec.model_copy(update={"rope_scaling": rs}).model_dump(mode="json")))
        out = tmp_path / f"out-{int(beta)}"
        result = runner.invoke(app, ["launch", str(path), "-g", "8", "--ep", "8", "--cluster", "dgx-h100", "--out", str(out)])
        assert result.exit_code == expected, result.output
        if expected:
            assert "(original length, beta_fast, beta_slow, truncate) = (4096, 16.0, 1.0, True)" in result.output
        else:
            text = (out / "train.sh").read_text()
            assert "--rope-type yarn" in text and "--rotary-scaling-factor 40.0" in text and "--mscale-all-dim 0.707" in text


DOC_MODELS = {"llama-3.1-70b": "Llama-3.1-70B", "mixtral-8x7b": "Mixtral-8x7B-v0.1", "qwen3-30b-a3b": "Qwen3-30B-A3B"}


def _doc_tables() -> list[dict[str, list[list[str]]]]:
    """docs/launch.md "The model's settings, three examples": each table as model -> cells of each column."""
    text = (Path(__file__).parents[1] / "docs" / "launch.md").read_text()
    section = text.split("## The model's settings, three examples", 1)[1].split("\n## ", 1)[0]
    tables, current = [], None
    for line in section.splitlines():
        if not line.startswith("| `"):
            current = None
            continue
        if current is None:
            current = {}
            tables.append(current)
        model, *columns = [c.strip() for c in line.strip("|").split(" | ")]
        current[model.strip("`")] = [re.findall(r"`([^`]+)`", c) if "`" in c else [c] for c in columns]
    return tables


def test_docs_show_the_model_settings_the_launch_writes():
    """Every cell of docs/launch.md's three-example tables is in the files launch writes, for the
    preset and for its Hugging Face fixture alike; "refused" cells are refused."""
    import tomllib

    megatron, deepspeed, titan = _doc_tables()
    assert set(megatron) == set(deepspeed) == set(titan) == set(DOC_MODELS)
    hf = Path(__file__).parent / "data" / "hf"

    def words(text: str) -> str:  # the script's words, continuation lines joined
        return " " + " ".join(text.replace("\\\n", " ").split()) + " "

    for preset, fixture in DOC_MODELS.items():
        for model in (preset, str(hf / fixture)):
            moe = {"ep": 8} if presets.models()[preset].moe else {}
            run = functools.partial(run_launch, model, "dgx-h100", 16)
            sh = words(run(training={"framework": "megatron"}, layout={"tp": 2, "zero": 1, **moe}).files["train.sh"].text)
            for cell in megatron[preset][0]:
                assert f" {cell} " in sh, (model, cell)
            config = json.loads(run(training={"framework": "deepspeed"}, layout={"tp": 1, "zero": 3}).files["config.json"].text)
            for cell in deepspeed[preset][0]:
                [(key, value)] = json.loads("{" + cell + "}").items()
                assert config.get(key) == value, (model, key, config.get(key), value)
            for version, cells in zip(("0.3", "0.2"), titan[preset]):
                def launch():
                    return run(training={"framework": "torchtitan"}, layout={"tp": 1, "zero": 3, **moe},
                               options=LaunchOptions(torchtitan_version=version))
                if cells[0].startswith("refused"):
                    with pytest.raises(SpecError, match="no registry entry of its shape"):
                        launch()
                elif version == "0.3":
                    sh = words(launch().files["train.sh"].text)
                    assert all(f" {cell} " in sh for cell in cells), (model, cells)
                else:
                    doc = tomllib.loads(launch().files["torchtitan.toml"].text)
                    assert {k: doc["model"].get(k) for k in tomllib.loads("\n".join(cells))} == tomllib.loads("\n".join(cells)), model


def test_launch_options_take_the_version_as_a_string():
    """A library caller's "0.3" is torchtitan 0.3 (the emitters compare with the enum), "0.2" is 0.2."""
    from planner.launch.options import TitanVersion

    assert LaunchOptions(torchtitan_version="0.3").torchtitan_version is TitanVersion.V03
    v02 = run_launch("llama-3.1-8b", "dgx-h100", 8, training={"framework": "torchtitan"}, layout={"tp": 1},
                     options=LaunchOptions(torchtitan_version="0.2"))
    v03 = run_launch("llama-3.1-8b", "dgx-h100", 8, training={"framework": "torchtitan"}, layout={"tp": 1},
                     options=LaunchOptions(torchtitan_version="0.3"))
    assert "torchtitan.toml" in v02.files and "torchtitan.toml" not in v03.files


def _plan_pps(version: str) -> list[int]:
    result = runner.invoke(app, ["plan", "qwen3-30b-a3b", "-c", "dgx-h100", "-g", "16", "--framework", "torchtitan",
                                 "--torchtitan-version", version, "--top", "3", "--json"])
    assert result.exit_code == 0, result.output
    return [p["layout"]["pp"] for p in json.loads(result.output)["plans"]]


def test_plan_ranks_only_what_the_chosen_torchtitan_version_launches(tmp_path):
    # torchtitan 0.2's qwen3 has no pipelining_fn (NO_PIPELINING_02); 0.3 pipelines it. On 16 GPUs the
    # 0.3 search ranks a pp 4 layout second, so the 0.2 search must differ there, not merely agree.
    assert any(pp > 1 for pp in _plan_pps("0.3"))
    assert _plan_pps("0.2") == [1, 1, 1]
    result = runner.invoke(app, ["plan", "qwen3-30b-a3b", "-c", "dgx-h100", "-g", "16", "--framework", "torchtitan",
                                 "--torchtitan-version", "0.2", "--fix", "pp=2"])
    assert result.exit_code == 2
    assert result.output.strip().startswith("error: --fix pp=2: launch refuses it: torchtitan 0.2's qwen3 model has no pipelining")
    # launch without layout flags searches with its own options: plan #2 of the 0.2 search launches
    result = runner.invoke(app, ["launch", "qwen3-30b-a3b", "-c", "dgx-h100", "-g", "16", "--framework", "torchtitan",
                                 "--torchtitan-version", "0.2", "--rank", "2", "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "o" / "plan.json").read_text())["layout"]["pp"] == 1


def test_plan_for_torchtitan_02_keeps_fsdp_under_tp_and_pp():
    # With dp fixed at 1, the 0.3 search ranks tp/pp layouts with a shard group of one first (0.3 applies
    # fully_shard at every degree); torchtitan 0.2 would train those in fp32, so its search keeps only
    # layouts with cp > 1, where fully_shard still runs, and 0.3's list must hold at least one of the other kind.
    def plans(version):
        result = runner.invoke(app, ["plan", "llama-3.1-8b", "-c", "dgx-h100", "-g", "8", "--framework", "torchtitan",
                                     "--fix", "dp=1", "--torchtitan-version", version, "--json"])
        assert result.exit_code == 0, result.output
        return [p["layout"] for p in json.loads(result.output)["plans"]]
    assert any(lay["cp"] == 1 for lay in plans("0.3"))
    v02 = plans("0.2")
    assert v02 and all(lay["cp"] > 1 for lay in v02)


def test_torchtitan_03_refuses_tied_embeddings_under_a_pipeline(tmp_path):
    # torchtitan 0.3.0rc1 raises NotImplementedError for enable_weight_tying with pp > 1
    # (pytorch/torchtitan@1fdf90d3 torchtitan/models/common/decoder.py L139-142): launch refuses it in
    # one line, and plan holds pp at 1 for a tied model, so it never ranks a pipeline launch refuses
    result = runner.invoke(app, ["launch", "gpt2-medium", "-c", "dgx-h100", "-g", "8", "--framework", "torchtitan",
                                 "--pp", "2", "--seq-len", "1024", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and not (tmp_path / "o").exists()
    assert "torchtitan 0.3 does not run tied embeddings under pipeline parallelism" in result.output
    result = runner.invoke(app, ["plan", "gpt2-medium", "-c", "dgx-h100", "-g", "64", "--framework", "torchtitan",
                                 "--global-batch-size", "64", "--seq-len", "1024", "--json"])
    assert result.exit_code == 0, result.output
    assert {p["layout"]["pp"] for p in json.loads(result.output)["plans"]} == {1}


def test_megatron_passes_the_ddp_bucket_size_it_priced():
    # TrainingSpec.ddp_bucket_size is Megatron's --ddp-bucket-size (arguments.py L3125); None leaves
    # Megatron's default max(40M, 1M x dp·cp), the one the step time prices then
    from helpers import make_job
    from planner.launch.megatron import _sharding
    from planner.launch.target import Target

    job = make_job("llama-3.1-8b", gpus=16, zero=1, training=dict(global_batch_size=64, ddp_bucket_size=64))
    assert ("--ddp-bucket-size", 64) in _sharding(job, Target(job))
    default = make_job("llama-3.1-8b", gpus=16, zero=1, training=dict(global_batch_size=64))
    assert not [f for f in _sharding(default, Target(default)) if f[0] == "--ddp-bucket-size"]


def test_a_plan_the_search_did_not_prove_is_launched_saying_so(monkeypatch, tmp_path):
    # A search stopped by its time limit ranks the layouts scored so far: the launch takes #1 of those,
    # and its README.md and the command say that a faster layout may exist
    import dataclasses

    import planner.search as search

    real = search.search
    monkeypatch.setattr(search, "search", lambda *a, **k: dataclasses.replace(real(*a, **k), optimal=False, timed_out=True))
    files = run_launch("llama-3.1-8b", "dgx-h100", 8, training={}, layout={}, time_limit_s=5)
    assert files.unproven.startswith("the search stopped at its 5 s time limit after scoring")
    assert "Not proven: the search stopped at its 5 s time limit" in files.files["README.md"].text
    res = CliRunner().invoke(app, ["launch", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "8", "--out", str(tmp_path / "o")])
    assert res.exit_code == 0 and "plan #1 is not proven the fastest" in res.output, res.output
    # a proven search says nothing of the kind
    monkeypatch.setattr(search, "search", real)
    proven = run_launch("llama-3.1-8b", "dgx-h100", 8, training={}, layout={})
    assert proven.unproven == "" and "Not proven" not in proven.files["README.md"].text


def test_launch_of_the_searched_405b_split_writes_both_account_flags(tmp_path):
    # The search's #1 at tp 8 pp 8 vpp 8 cp 2 counts the embedding and the loss as layers (the only split
    # of 126 layers at vpp 8, tests/test_search.py): Megatron is told so, and the virtual stages per rank,
    # the form Megatron takes beside the account flags (ARG L954-998)
    result = runner.invoke(app, ["launch", "llama-3.1-405b", "-c", "dgx-h100", "-g", "512", "--seq-len", "8192",
                                 "--fix", "tp=8", "--fix", "pp=8", "--fix", "vpp=8", "--fix", "cp=2", "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    train = (tmp_path / "o" / "train.sh").read_text()
    assert "--account-for-embedding-in-pipeline-split" in train and "--account-for-loss-in-pipeline-split" in train
    assert re.search(r"--num-virtual-stages-per-pipeline-rank[ =]8\b", train)
    assert "--num-layers-per-virtual-pipeline-stage" not in train and "--pipeline-model-parallel-layout" not in train


def test_deepep_dispatch_is_written_as_each_framework_selects_it():
    import tomllib

    # Megatron-LM@d98e8a64: the flex token dispatcher with its DeepEP backend (transformer_config.py L891-900)
    launch = run_launch("mixtral-8x7b", "dgx-h100", 16, training={"moe_dispatch": "deepep"}, layout={"ep": 8})
    text = launch.files["train.sh"].text
    assert "--moe-token-dispatcher-type flex" in text and "--moe-flex-dispatcher-backend deepep" in text
    assert "--moe-token-dispatcher-type alltoall" not in text
    plain = run_launch("mixtral-8x7b", "dgx-h100", 16, training={}, layout={"ep": 8}).files["train.sh"].text
    assert "--moe-token-dispatcher-type alltoall" in plain and "deepep" not in plain
    # torchtitan 0.2.2: [parallelism] expert_parallel_comm_backend (job_config.py L474); 0.3 has no such key
    titan = dict(framework="torchtitan", moe_dispatch="deepep")
    launch = run_launch("qwen3-30b-a3b", "dgx-h100", 16, training=titan, layout={"ep": 8},
                        options=LaunchOptions(torchtitan_version="0.2"))
    assert tomllib.loads(launch.files["torchtitan.toml"].text)["parallelism"]["expert_parallel_comm_backend"] == "deepep"
    with pytest.raises(SpecError, match="use --torchtitan-version 0.2"):
        run_launch("qwen3-30b-a3b", "dgx-h100", 16, training=titan, layout={"ep": 8}, options=LaunchOptions(torchtitan_version="0.3"))
