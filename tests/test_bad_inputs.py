"""Input you cannot break: every bad file under tests/data/bad and every bad flag gives one line
`error: ...` naming what is wrong and what is accepted, exit code 2, no traceback, and nothing
written to (or changed in) an --out directory."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner.cli import app, main

runner = CliRunner()
BAD = Path(__file__).parent / "data" / "bad"
H100 = ["--cluster", "dgx-h100", "--gpus", "8"]
M = "llama-3.1-8b"


def _one_line_error(result, needle: str) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert needle in lines[0], lines[0]
    return lines[0]


# --- files: (file under tests/data/bad, expected fragment) ----------------------------------------
# Model files are given as MODEL, cluster files as --cluster.

MODEL_FILES = [
    ("model_unterminated_string.toml", "malformed TOML: Illegal character"),
    ("model_duplicate_key.toml", "malformed TOML: Cannot overwrite a value"),
    ("model_trailing_comma.json", "malformed JSON: Expecting property name enclosed in double quotes at line 1"),
    ("model_bad_indent.yaml", "malformed YAML: mapping values are not allowed here at line 2"),
    ("model_tab_indent.yaml", "malformed YAML: found character '\\t'"),
    ("model_empty.toml", "file is empty"),
    ("model_empty.json", "file is empty"),
    ("model_whitespace.yaml", "file is empty"),
    ("model_latin1.json", "not UTF-8 text (byte 13 is 0xe9)"),
    ("model_binary.toml", "not UTF-8 text"),
    ("model_utf16.json", "not UTF-8 text (byte 0 is 0xff)"),
    ("model_top_level_list.json", "the top level must be a table/object of keys, got list"),
    ("model_top_level_scalar.yaml", "the top level must be a table/object of keys, got int"),
    ("model_top_level_null.yaml", "the top level must be a table/object of keys, got NoneType"),
    ("model_unknown_ext.txt", "unknown file type .txt; use one of .toml, .json, .yaml, .yml"),
    ("model_layers_string.toml", "num_layers = 'four': Input should be a valid integer"),
    ("model_layers_float.json", "num_layers = 4.5: Input should be a valid integer, got a number with a fractional part"),
    ("model_layers_list.yaml", "num_layers: Input should be a valid integer"),
    ("model_bool_layers.json", "num_layers = True: expected a whole number > 0, got true"),
    ("model_unknown_key.yaml", "unknown key 'hidden_sise' (did you mean 'hidden_size'?); allowed keys: name, num_layers, hidden_size"),
    ("model_unknown_moe_key.toml", "unknown key 'moe.experts_per_token'; allowed keys: num_experts, top_k"),
    # a misspelt required key is named as the typo it is, with the key meant, not as the key then missing
    ("model_misspelt_required_key.yaml", "unknown key 'ffn_hiden_size' (did you mean 'ffn_hidden_size'?); allowed keys: name,"),
    ("model_missing_hidden.json", "missing required key 'hidden_size'"),
    ("model_missing_moe_field.yaml", "missing required key 'moe.top_k'"),
    ("model_zero_layers.toml", "num_layers = 0: Input should be greater than 0"),
    ("model_negative_vocab.yaml", "vocab_size = -32000: Input should be greater than 0"),
    ("model_huge_hidden.toml", "hidden_size = 1152921504606846976: Input should be less than or equal to 16777216"),
    ("model_nan_dropout.toml", "hidden_dropout = nan: Input should be a finite number"),
    ("model_inf_dropout.toml", "attention_dropout = inf: Input should be a finite number"),
    ("model_json_nan.json", "num_layers = nan: Input should be a finite number"),
    ("model_dropout_one.yaml", "hidden_dropout = 1.0: Input should be less than 1"),
    ("model_kv_heads.toml", "num_attention_heads(8) must be a multiple of num_kv_heads(3)"),
    ("model_hidden_heads.json", "hidden_size(500) is not divisible by num_attention_heads(8); give head_dim explicitly"),
    ("model_moe_top_k.toml", "top_k(8) must be <= num_experts(4)"),
    ("model_moe_dense_layers.yaml", "dense layers [9] beyond num_layers(4)"),
    ("model_bad_mlp.toml", "mlp = 'relu': Input should be 'gelu', 'swiglu', 'squared_relu' or 'geglu'"),
    ("model_moe_string.json", "moe = 'yes': Input should be a valid dictionary"),
    ("model_too_many_layers.toml", "num_layers(100000) exceeds 4096"),
    ("model_too_many_params.toml", "parameters exceed 35,184,372,088,832 (2^45)"),
    # Hugging Face configs (directories holding config.json)
    ("hf_t5", "model_type 't5' is not supported; supported: bloom, deepseek_v2, deepseek_v3, gemma2, gemma3_text, gpt2, gpt_neox, gpt_oss, llama, llama4_text"),
    ("hf_bert", "has no model_type; supported: bloom, deepseek_v2, deepseek_v3, gemma2, gemma3_text, gpt2"),
    ("hf_model_type_list", "model_type ['llama'] is not supported; supported:"),
    ("hf_llama_no_hidden", "config.json: missing hidden_size (model_type 'llama')"),
    ("hf_llama_negative_layers", "num_layers = -2: Input should be greater than 0"),
    ("hf_llama_string_heads", "config.json: num_attention_heads = 'many' must be a whole number"),
    ("hf_llama_list_heads", "config.json: num_attention_heads = [32] must be a whole number"),
    ("hf_mixtral_no_experts", "config.json: missing num_local_experts (model_type 'mixtral')"),
    ("hf_gpt2_bad_dropout", "config.json: resid_pdrop = 'high' must be a number"),
    ("hf_qwen2_moe_bad_step", "config.json: decoder_sparse_step = 'two' must be a whole number"),
    ("hf_no_config", "directory has no config.json; give a spec file or a Hugging Face model directory"),
    # names are printed and written into scripts: no control characters, lone surrogates, bidi overrides
    ("model_name_nul.json", "name = 'llama\\x00evil': character '\\x00' at position 5 is not allowed in a name"),
    ("model_name_escape.json", "character '\\x1b' at position 0 is not allowed in a name"),
    ("model_name_newline.toml", "character '\\n' at position 3 is not allowed in a name"),
    ("model_name_bidi.json", "character '\\u202e' at position 3 is not allowed in a name"),
    ("model_name_surrogate.json", "name = 'x\\ud800y': Input should be a valid string, unable to parse raw data as a unicode string"),
    # the extension names the format
    ("model_yaml_in_json.json", "malformed JSON: Expecting value at line 1 column 1"),
    ("model_json_in_toml.toml", "malformed TOML: Invalid statement"),
    ("model_5000_digits.json", "model_5000_digits.json: malformed JSON: a number has more than 4300 digits"),
    ("model_5000_digits.toml", "model_5000_digits.toml: malformed TOML: a number has more than 4300 digits"),
    # counts beyond any real model
    ("model_moe_millions.toml", "about 1,006,633,558,212,608 parameters exceed 35,184,372,088,832 (2^45)"),
    ("model_moe_too_many_experts.toml", "moe.num_experts = 16777217: Input should be less than or equal to 16777216"),
]

CLUSTER_FILES = [
    ("cluster_missing_gpus_per_node.toml", "missing required key 'gpus_per_node'"),
    ("cluster_unknown_gpu.toml", "unknown GPU preset 'H100-SMX'; closest: H100-SXM"),
    ("cluster_gpu_number.toml", "gpu = 100: Input should be a valid dictionary"),
    ("cluster_inline_gpu_incomplete.toml", "missing required key 'gpu.hbm_bandwidth_bytes_per_s'"),
    ("cluster_gpu_no_compute_capability.toml", "missing required key 'gpu.compute_capability'; give [major, minor] as torch.cuda.get_device_capability() reports it"),
    ("cluster_domain_mismatch.toml", "scaleup_domain_gpus(12) and gpus_per_node(8) must divide one another"),
    ("cluster_negative_nic.toml", "nic_bandwidth_gbit_per_s: must be a finite number >= 0, got -400"),
    ("cluster_zero_gpus_per_node.toml", "gpus_per_node = 0: Input should be greater than 0"),
    ("cluster_both_units.toml", "nic_bandwidth_gbit_per_s: given together with nic_bandwidth_bytes_per_s; give one of them"),
    ("cluster_unit_string.toml", "scaleup_latency_us: must be a number, got '3.4 us'"),
    ("cluster_nan_latency.toml", "nic_latency_us: must be a finite number >= 0, got nan"),
    ("cluster_oversubscription.toml", "network_tiers.0.oversubscription = 0.5: Input should be greater than or equal to 1"),
    ("cluster_unknown_key.yaml", "unknown key 'nvlink'; allowed keys: name, gpu, gpus_per_node"),
    ("cluster_tiers_not_list.json", "network_tiers = 'fat-tree': Input should be a valid tuple"),
    # physical ranges: every time derived from them stays finite (no division by zero, no overflow)
    ("cluster_zero_scaleup.toml", "scaleup_bandwidth_bytes_per_s = 0: Input should be greater than or equal to 125000000"),
    ("cluster_tiny_nic.toml", "nic_bandwidth_bytes_per_s = 1.25e-292: Input should be greater than or equal to 125000000"),
    ("cluster_huge_latency.toml", "nic_latency_s = 1e+294: Input should be less than or equal to 0.001"),
    ("cluster_huge_bandwidth.toml", "scaleup_bandwidth_bytes_per_s = 1.0000000000000001e+39: Input should be less than or equal to 1000000000000000"),
    ("cluster_gpu_tiny_flops.toml", "gpu.peak_flop_per_s.bf16 = 1000000.0: Input should be greater than or equal to 1000000000"),
    ("cluster_gpu_huge_hbm.toml", "gpu.hbm_bytes = 1073741824000000000000: Input should be less than or equal to 17592186044416"),
    ("cluster_oversubscription_huge.toml", "network_tiers.0.oversubscription = 1000000000.0: Input should be less than or equal to 1024"),
    ("cluster_yaml_alias_bomb.yaml", "YAML alias *a0 at line 2 column 14: aliases are not accepted in a spec file"),
    ("cluster_name_escape.json", "name = '\\x1b]0;owned\\x07\\x1b[2J': character '\\x1b' at position 0 is not allowed in a name"),
]

OTHER_FILES = {  # used by FLAGS and PLAN_DIRS below
    "nodes_empty.txt", "nodes_duplicate.txt", "nodes_dash.txt", "nodes_bad_char.txt",
    "calibration_list.json", "calibration_huge.json", "calibration_nan.json", "calibration_yaml.yaml", "calibration_source_list.json",
    "plan_tp_string", "plan_tp_numeric_string", "plan_model_list", "plan_framework_jax", "plan_training_string",
    "plan_cluster_number", "plan_gpus_string", "plan_seq_len_float", "plan_missing_layout",
}


@pytest.mark.parametrize("name, needle", MODEL_FILES, ids=[c[0] for c in MODEL_FILES])
def test_bad_model_file(name, needle):
    _one_line_error(runner.invoke(app, ["memory", str(BAD / name), *H100]), needle)


@pytest.mark.parametrize("name, needle", CLUSTER_FILES, ids=[c[0] for c in CLUSTER_FILES])
def test_bad_cluster_file(name, needle):
    _one_line_error(runner.invoke(app, ["memory", M, "--cluster", str(BAD / name), "--gpus", "8"]), needle)


def test_every_corpus_file_is_exercised():
    on_disk = {p.name for p in BAD.iterdir()}
    used = {n for n, _ in MODEL_FILES + CLUSTER_FILES} | OTHER_FILES
    assert on_disk == used
    assert len(used) >= 80


# --- flags: (argv, expected fragment) -------------------------------------------------------------

FLAGS = [
    # GPU counts
    (["memory", M, "--cluster", "dgx-h100", "--gpus", "0"], "--gpus: num_gpus = 0: Input should be greater than 0"),
    (["estimate", M, "--cluster", "dgx-h100", "--gpus", "-8"], "num_gpus = -8"),
    (["plan", M, "--cluster", "dgx-h100", "--gpus", "12"], "gpus(12) is not a multiple of gpus_per_node(8) of dgx-h100; use 8 or 16"),
    (["estimate", M, "--cluster", "dgx-h100", "--gpus", "3"], "gpus(3) is part of one 8-GPU node of dgx-h100: use one of [1, 2, 4, 8]"),
    (["estimate", M, "--cluster", "dgx-h100", "--gpus", str(2**40)], "Input should be less than or equal to 16777216"),
    (["sweep", M, "--cluster", "dgx-h100", "--gpus", "12,16"], "gpus(12) is not a multiple of gpus_per_node(8)"),
    (["sweep", M, "--cluster", "dgx-h100", "--gpus", "8..x"], "expected LO..HI (powers of two between) or a list"),
    # layout and training numbers
    (["estimate", M, *H100, "--tp", "3"], "tp(3)·pp(1)·cp(1) = 3 does not divide gpus(8)"),
    (["estimate", M, *H100, "--zero", "5"], "zero = 5: Input should be 0, 1, 2 or 3"),
    (["estimate", M, *H100, "--zero", "-1"], "zero = -1: Input should be 0, 1, 2 or 3"),
    (["estimate", M, *H100, "--seq-len", "-1"], "seq_len = -1: Input should be greater than 0"),
    (["plan", M, *H100, "--seq-len", "0"], "seq_len = 0: Input should be greater than 0"),
    (["estimate", M, *H100, "--global-batch-size", "7"], "global_batch_size(7) is not divisible by mbs(1)·dp(8) = 8; the nearest multiple of 8: --global-batch-size 8 ["),
    # mbs(4)·dp(8) = 32: 130 lies between 4·32 = 128 and 5·32 = 160
    (["estimate", M, *H100, "--global-batch-size", "130", "--mbs", "4"], "= 32; the nearest multiples of 32: --global-batch-size 128 or 160 ["),
    (["plan", M, *H100, "--global-batch-size", "0"], "global_batch_size = 0: Input should be greater than 0"),
    (["plan", M, *H100, "--seq-len", str(2**24), "--global-batch-size", str(2**24)], "tokens per step exceeds 68,719,476,736 (2^36)"),
    (["estimate", M, *H100, "--mbs", "0"], "mbs = 0: Input should be greater than 0"),
    (["estimate", M, *H100, "--vpp", "2"], "vpp(2) needs pp > 1; give --pp too, or drop --vpp"),
    # a layout of 4 stages runs on pp 2 (vpp 2) or pp 4 (vpp 1)
    (["estimate", M, *H100, "--pp-layout", "Et*8|t*8|t*8|t*8L"], "pp_layout needs pp > 1: give --pp 2 or 4 for its 4 stages"),
    (["estimate", M, *H100, "--pp", "2", "--pp-layout", "Et*16|(t*16L"], "pp_layout: a '(' must close with ')*n' (n repeats, no nesting)"),
    (["estimate", M, *H100, "--ep", "2"], "--ep(2) > 1 needs a mixture-of-experts model; llama-3.1-8b is dense"),
    (["estimate", M, *H100, "--recompute", "selective", "--recompute-layers", "2"], "recompute_layers applies to full recompute only (recompute=selective); add --recompute full or drop --recompute-layers"),
    (["estimate", M, *H100, "--recompute-layers", "2"], "recompute_layers applies to full recompute only (recompute=none); add --recompute full or drop --recompute-layers"),
    (["estimate", M, "--cluster", "dgx-h100", "--gpus", "24", "--pp", "3"], "num_layers(32) is not divisible by pp(3); pp in 1, 2, 4, 8, 16, 32"),
    (["estimate", M, *H100, "--pp-first-layers", "4"], "pp_first/last_stage_layers need pp > 1; give --pp too, or drop them"),
    (["estimate", M, *H100, "--schedule", "interleaved"], "the interleaved schedule needs vpp > 1; give --vpp too, or another --schedule"),
    # no E and no L: wrong at any pp, so that comes before the missing --pp
    (["estimate", M, *H100, "--pp-layout", "(t*8|)*4"], "pp_layout needs exactly one E (embedding) and one L (loss)"),
    (["estimate", M, *H100, "--dp-shard", "3"], "dp_shard(3) does not divide dp(8); dp_shard in 1, 2, 4, 8"),
    (["estimate", M, *H100, "--sp"], "sequence parallel needs tp > 1; drop --sp or raise tp"),
    (["estimate", "qwen2.5-7b", *H100, "--tp", "8"], "num_attention_heads(28) is not divisible by tp(8); tp must divide 28: one of 1, 2, 4, 7, 14, 28"),
    (["estimate", "gpt2", *H100, "--seq-len", "2048"], "seq_len(2048) exceeds max_position_embeddings(1024) of the learned position table; use --seq-len 1024 or less"),
    # --fix, --top, presets, --cluster
    (["plan", M, *H100, "--fix", "pp=0"], "--fix pp=0: must be a positive integer"),
    (["plan", M, *H100, "--fix", "tp=8", "--fix", "tp=4"], "--fix tp is given twice (tp=8 and tp=4); pin each axis once"),
    (["plan", M, *H100, "--fix", "foo=1"], "--fix 'foo=1': expected AXIS=VALUE with AXIS one of tp, sp, pp"),
    (["plan", M, *H100, "--fix", "zero=7"], "--fix zero=7: must be 0, 1, 2 or 3"),
    (["plan", M, *H100, "--fix", "recompute=most"], "--fix recompute=most: must be none, selective or full"),
    # a pinned value no layout takes names its rule and the values that are taken, not the memory bound
    (["plan", M, *H100, "--fix", "tp=3"], "--fix tp=3: tp must divide num_attention_heads(32) and gpus(8) and stay within the 8-GPU scale-up domain (--allow-cross-node-tp lifts that); tp in 1, 2, 4, 8"),
    (["plan", M, *H100, "--fix", "cp=3"], "--fix cp=3: cp must divide gpus(8), and seq_len(4096) must split into 2·cp equal chunks with at least 1024 tokens per rank; cp in 1, 2, 4"),
    (["plan", M, *H100, "--fix", "pp=64"], "--fix pp=64: pp must divide gpus(8) and be at most num_layers(32); pp in 1, 2, 4, 8"),
    # 13 is prime: only dp 1 divides it; 8 and 16 are the multiples of dp 8 either side
    (["plan", M, *H100, "--global-batch-size", "13", "--fix", "dp=8"], "--fix dp=8: dp must divide gpus(8) and global_batch_size(13); dp in 1; or the nearest multiples of 8: --global-batch-size 8 or 16"),
    # pinned pipeline axes that leave no split of the 32 layers: was a traceback from the search's tables
    (["plan", M, *H100, "--fix", "vpp=9"], "--fix vpp=9: no pipeline split of the 32 layers takes it (vpp in 1 to 8"),
    (["plan", M, *H100, "--fix", "recompute=full", "--fix", "recompute_layers=40"], "--fix recompute=full recompute_layers=40: no pipeline split"),
    (["plan", M, *H100, "--fix", "recompute=selective", "--fix", "recompute_layers=2"], "--fix recompute_layers=2: applies to full recompute only (--fix recompute=selective); pin recompute=full or drop recompute_layers"),
    (["plan", M, *H100, "--framework", "torchtitan", "--fix", "recompute_layers=2"], "--fix recompute_layers=2: the search offers full recompute of the first layers of each chunk with Megatron only"),
    (["plan", M, *H100, "--framework", "deepspeed", "--fix", "recompute=selective"], "--fix recompute=selective: the search recomputes deepspeed layouts in these modes only; recompute in none, full"),
    (["plan", M, *H100, "--fix", "zero=2"], "--fix zero=2: the search shards megatron layouts at these ZeRO stages only; zero in 0, 1, 3"),
    # pins legal one by one that the framework refuses together: the rule that refuses them at the other axes' defaults
    (["plan", M, *H100, "--fix", "zero=3", "--fix", "pp=2"], "(with the other axes at their defaults the pins are refused: Megatron's fully sharded data parallel (zero 3) runs with pp = 1"),
    (["plan", M, *H100, "--fix", "tp=8", "--fix", "cp=2"], "(with the other axes at their defaults the pins are refused: tp(8)·pp(1)·cp(2) = 16 does not divide gpus(8))"),
    (["plan", M, *H100, "--global-batch-size", "24", "--fix", "mbs=32"], "--fix mbs=32: mbs must divide global_batch_size(24) and be at most 16; mbs in 1, 2, 3, 4, 6, 8, 12"),
    (["plan", M, *H100, "--top", "0"], "--top(0) must be at least 1"),
    # the search's tables take far longer than a microsecond: it stops before scoring a layout, and says so
    (["plan", M, *H100, "--time-limit", "1e-6"], "ran out of its 1e-06 s time limit before scoring any layout, so none fits so far; this is not a proof that none does: raise --time-limit"),
    (["plan", M, *H100, "--time-limit", "0"], "--time-limit(0) must be a positive finite number of seconds, e.g. 30"),
    (["plan", M, *H100, "--time-limit", "nan"], "--time-limit(nan) must be a positive finite number of seconds"),
    (["plan", "llama-4-8b", *H100], "unknown model preset 'llama-4-8b'; closest: llama-3.1-8b"),
    (["plan", M, "--cluster", "dgx-h1000", "--gpus", "8"], "unknown cluster preset 'dgx-h1000'; closest: dgx-h100"),
    (["estimate", M, "--cluster", str(BAD), "--gpus", "8"], "is a directory, expected a file"),
    # fractions and outlook numbers
    (["plan", M, *H100, "--headroom", "1.5"], "headroom(1.5) must be a fraction in [0, 1)"),
    (["sweep", M, "--cluster", "dgx-h100", "--gpus", "8", "--headroom", "-0.1"], "headroom(-0.1) must be a fraction in [0, 1)"),
    (["estimate", M, *H100, "--headroom", "nan"], "headroom(nan) must be a fraction in [0, 1)"),
    (["estimate", M, *H100, "--tokens", "nan"], "--tokens(nan) must be a positive finite number"),
    (["plan", M, *H100, "--tokens", "-1"], "--tokens(-1.0) must be a positive finite number"),
    (["estimate", M, *H100, "--tokens", "inf"], "--tokens(inf) must be a positive finite number"),
    (["estimate", M, *H100, "--gpu-hour-cost", "-3"], "--gpu-hour-cost(-3.0) must be a positive finite number"),
    (["estimate", M, *H100, "--ckpt-write-gbps", "0"], "--ckpt-write-gbps(0.0) must be a positive finite number"),
    (["plan", M, *H100, "--gpu-hour-cost", "2.5"], "--gpu-hour-cost(2.5) prices the GPU-hours to train --tokens T; give --tokens too"),
    (["sweep", M, "--cluster", "dgx-h100", "--gpus", "8", "--gpu-hour-cost", "2"], "give --tokens too"),
    (["estimate", M, *H100, "--calibration", str(BAD / "calibration_list.json")], "the top level must be a table/object of keys, got list"),
    (["estimate", M, *H100, "--calibration", str(BAD)], "bad: is a directory, expected a file"),
    (["estimate", M, *H100, "--calibration", str(BAD / "calibration_huge.json")], "gemm_scale.hopper(1e+300) must be a number in [1e-06, 1000]"),
    (["plan", M, *H100, "--calibration", str(BAD / "calibration_nan.json")], "gemm_scale.hopper(nan) must be a number in [1e-06, 1000]"),
    (["estimate", M, *H100, "--calibration", str(BAD / "calibration_yaml.yaml")], "unknown file type .yaml; use one of .json"),
    (["estimate", M, *H100, "--calibration", str(BAD / "calibration_source_list.json")], "source(['x']) must be a string"),
    (["estimate", M, *H100, "--ckpt-write-gbps", "1e308"], "--ckpt-write-gbps(1e+308) must be between 0.001 and 1e+09"),
    (["estimate", M, *H100, "--gpu-mtbf-hours", "1e-300"], "--gpu-mtbf-hours(1e-300) must be between 0.01 and 1e+09"),
    (["plan", M, *H100, "--tokens", "1e19"], "--tokens(1e+19) must be between 1 and 1e+18"),
    # sweep sizes: each count is a full search
    (["sweep", M, "--cluster", "dgx-h100", "--gpus", ",".join(str(8 * i) for i in range(1, 10001))], "58,613 characters"),
    (["sweep", M, "--cluster", "dgx-h100", "--gpus", ",".join(str(8 * i) for i in range(1, 34))], "--gpus: 33 counts; a sweep takes at most 32"),
    (["sweep", M, "--cluster", "dgx-h100", "--gpus", "1..99999999999"], "--gpus: 99,999,999,999 GPUs; a cluster spec takes at most 16,777,216"),
    (["sweep", M, "--cluster", "dgx-h100", "--gpus", f"8..{2**40}"], "--gpus: 1,099,511,627,776 GPUs; a cluster spec takes at most 16,777,216"),
    (["sweep", M, "--cluster", "dgx-h100", "--gpus", "8,99999999"], "--gpus: 99,999,999 GPUs"),
    # hardware: precisions a GPU cannot run
    (["estimate", M, "--cluster", "dgx-a100-80gb", "--gpus", "8", "--dtype", "fp8"], "precision fp8 needs fp8 tensor cores; A100-80GB (ampere) has none"),
    (["memory", M, "--cluster", "dgx-a100-40gb", "--gpus", "8", "--dtype", "fp8"], "A100-40GB (ampere) has none"),
    (["plan", M, "--cluster", "dgx-a100-80gb", "--gpus", "8", "--dtype", "fp8"], "no layout of llama-3.1-8b can run: precision fp8 needs fp8 tensor cores"),
    (["sweep", M, "--cluster", "dgx-a100-80gb", "--gpus", "8", "--dtype", "fp8"], "precision fp8 needs fp8 tensor cores"),
    (["estimate", M, *H100, "--dtype", "fp8", "--fp8-recipe", "mxfp8"], "fp8_recipe mxfp8 needs Blackwell tensor cores, compute capability 10.0 or later (H100-SXM is hopper, 9.0)"),
    (["estimate", M, *H100, "--framework", "torchtitan", "--dtype", "fp8", "--fp8-recipe", "delayed"],
     "fp8_recipe delayed is Megatron's --fp8-recipe delayed (framework=torchtitan); use tensorwise"),
    (["estimate", M, *H100, "--dtype", "fp4"],
     "precision fp4 needs NVFP4 tensor cores, compute capability 10.0 or later (Blackwell); H100-SXM is hopper, 9.0; use fp8 or bf16"),
    (["plan", M, *H100, "--dtype", "fp4"], "no layout of llama-3.1-8b can run: precision fp4 needs NVFP4 tensor cores"),
    (["estimate", M, "--cluster", "dgx-b200", "--gpus", "8", "--framework", "torchtitan", "--dtype", "fp4"],
     "precision fp4 is Transformer Engine's NVFP4 recipe, run by Megatron's --fp4-format e2m1 (framework=torchtitan"),
    (["estimate", M, "--cluster", "dgx-b200", "--gpus", "8", "--tp", "2", "--dtype", "fp4", "--tp-comm-overlap"],
     "precision fp4 runs without tp_comm_overlap"),
    # expert axes on a dense model
    (["estimate", M, *H100, "--tp", "2", "--etp", "2"], "--etp(2) is the tensor-parallel size of expert layers; llama-3.1-8b is dense"),
    (["memory", M, *H100, "--etp", "1"], "--etp(1) is the tensor-parallel size of expert layers"),
    (["memory", M, *H100, "--ep", "2"], "--ep(2) > 1 needs a mixture-of-experts model; llama-3.1-8b is dense"),
    (["plan", M, *H100, "--fix", "ep=2"], "--fix ep(2) > 1 needs a mixture-of-experts model; llama-3.1-8b is dense"),
    (["plan", M, *H100, "--fix", "etp=2"], "--fix etp(2) is the tensor-parallel size of expert layers"),
    (["sweep", M, "--cluster", "dgx-h100", "--gpus", "8,16", "--fix", "ep=8"], "--fix ep(8) > 1 needs a mixture-of-experts model"),
    # user text in a message is escaped
    (["memory", "llama\x1b[31m", *H100], "unknown model preset 'llama\\x1b[31m'"),
    (["memory", "\udcff\udcfe", *H100], "unknown model preset '\\udcff\\udcfe'"),
    (["memory", "/nowhere/\x1b[2J.toml", *H100], "/nowhere/\\x1b[2J.toml: no such file"),
    # torchtitan rules
    (["estimate", M, *H100, "--framework", "torchtitan", "--zero", "1"], "torchtitan shards with FSDP2 only: use zero 3"),
    (["estimate", M, *H100, "--framework", "torchtitan", "--zero", "0", "--tp", "2"], "torchtitan's DDP (zero 0) does not combine with tp/pp/cp/ep"),
    (["estimate", M, "--cluster", "dgx-h100", "--gpus", "16", "--framework", "torchtitan", "--tp", "16"], "num_kv_heads(8) is not divisible by tp(16); torchtitan shards whole K/V heads: tp in 1, 2, 4, 8"),
    (["estimate", M, *H100, "--framework", "torchtitan", "--tp", "2", "--cp", "2", "--seq-len", "4100"], "seq_len(4100) is not divisible by tp(2)·2·cp(2) = 8 (torchtitan seq_len_divisor)"),
    (["estimate", "mixtral-8x7b", *H100, "--framework", "torchtitan", "--tp", "4", "--etp", "2"], "etp(2) must be 1 or tp(4) in torchtitan"),
    (["estimate", M, *H100, "--framework", "torchtitan", "--pp", "4", "--global-batch-size", "4"], "1f1b needs micro-batches(2) >= pp(4)"),
    (["estimate", M, *H100, "--framework", "torchtitan", "--pp", "2", "--vpp", "2", "--schedule", "1f1b"], "vpp(2) > 1 needs a multi-stage schedule (interleaved), not 1f1b"),
    # Megatron rules
    (["estimate", M, *H100, "--zero", "3", "--pp", "2"], "Megatron's fully sharded data parallel (zero 3) runs with pp = 1; use zero 1"),
    (["estimate", "qwen2.5-7b", "--cluster", "dgx-h100", "--gpus", "56", "--tp", "7"], "num_kv_heads(4) and tp(7) must divide one another (Megatron num_query_groups rule)"),
    (["estimate", M, *H100, "--cp", "2", "--seq-len", "4098"], "seq_len(4098) is not divisible by 2·cp(2) = 4 (load-balanced context parallel)"),
    (["estimate", M, *H100, "--tp", "8", "--seq-len", "4100"], "seq_len(4100)/cp(1) = 4100 is not divisible by tp(8), as sequence parallel needs"),
    (["estimate", M, *H100, "--pp", "2", "--vpp", "2", "--global-batch-size", "12"], "interleaved 1F1B needs micro-batches(3) divisible by pp(2)"),
    (["estimate", M, *H100, "--pp", "2", "--vpp", "2", "--schedule", "1f1b"], "vpp(2) > 1 runs only with the interleaved schedule, not 1f1b"),
    (["estimate", M, *H100, "--compile"], "compile is modelled for torchtitan jobs only, not megatron"),
    # a switch no layout can take is refused before the search, not after it has scored every layout
    (["plan", M, *H100, "--optimizer", "decoupled_adamw"], "no layout of llama-3.1-8b can run: optimizer decoupled_adamw is Composer's"),
    # DeepSpeed rules
    (["estimate", M, *H100, "--framework", "deepspeed", "--zero", "3", "--pp", "2"], "DeepSpeed pipeline parallelism runs with ZeRO 0 or 1 only, not 3"),
    (["estimate", M, *H100, "--framework", "deepspeed", "--cp", "2"], "DeepSpeed has no context parallelism (cp must be 1)"),
    (["estimate", M, *H100, "--framework", "deepspeed", "--pp", "2", "--vpp", "2"], "DeepSpeed's pipeline engine runs 1F1B only (vpp must be 1)"),
    (["estimate", M, *H100, "--framework", "deepspeed", "--tp", "2", "--sp"], "DeepSpeed AutoTP has no sequence parallel; drop --sp"),
    (["estimate", M, *H100, "--framework", "deepspeed", "--recompute", "selective"], "DeepSpeed checkpoints whole layers only: use recompute none or full"),
    # infeasible problems
    (["plan", "llama-3.1-405b", *H100], "no layout of llama-3.1-405b on 8x H100-SXM passes the memory bound"),
    (["plan", M, *H100, "--fix", "tp=8", "--fix", "pp=8"], "no layout of llama-3.1-8b on 8x H100-SXM with --fix tp=8 pp=8"),
]


@pytest.mark.parametrize("argv, needle", FLAGS, ids=[" ".join(a[:1] + a[2:])[:80] for a, _ in FLAGS])
def test_bad_flags(argv, needle):
    _one_line_error(runner.invoke(app, argv), needle)


# --- --out directories: nothing half-written ------------------------------------------------------

OUT_CASES = [
    (["launch", M, *H100, "--tp", "3"], "does not divide gpus(8)"),
    (["launch", str(BAD / "model_empty.toml"), *H100], "file is empty"),
    (["launch", str(BAD / "hf_t5"), *H100], "model_type 't5' is not supported"),
    (["launch", M, *H100, "--framework", "deepspeed", "--zero", "3", "--pp", "2"], "DeepSpeed pipeline parallelism runs with ZeRO 0 or 1 only"),
    (["launch", M, *H100, "--framework", "torchtitan", "--zero", "1"], "torchtitan shards with FSDP2 only"),
    (["launch", M, *H100, "--nodes-file", str(BAD / "nodes_empty.txt")], "lists no hosts"),
    (["launch", M, "-c", "dgx-h100", "-g", "24", "--tp", "8", "--nodes-file", str(BAD / "nodes_duplicate.txt")], "line 3: host 'node1' is listed already on line 1"),
    (["launch", M, "-c", "dgx-h100", "-g", "16", "--tp", "8", "--nodes-file", str(BAD / "nodes_dash.txt")], "line 1: '-oProxyCommand=touch_x' is not a host name"),
    (["launch", M, "-c", "dgx-h100", "-g", "16", "--tp", "8", "--nodes-file", str(BAD / "nodes_bad_char.txt")], "line 1: 'node1;reboot' is not a host name"),
    (["launch", M, *H100, "--tp", "8", "--etp", "8"], "--etp(8) is the tensor-parallel size of expert layers"),
    (["launch", M, "--cluster", "dgx-a100-80gb", "--gpus", "8", "--dtype", "fp8"], "precision fp8 needs fp8 tensor cores"),
    (["validate", M, *H100, "--etp", "2", "--backend", "gloo"], "--etp(2) is the tensor-parallel size of expert layers"),
    (["launch", M, *H100, "--fix", "pp=0"], "--fix pp=0: must be a positive integer"),
    (["launch", M, *H100, "--rank", "0"], "--rank(0) must be at least 1"),
    (["launch", M, *H100, "--time-limit", "1e-6"], "ran out of its 1e-06 s time limit before scoring any layout"),
    (["launch", M, *H100, "--tp", "8", "--time-limit", "5"], "--time-limit steers the search; it does not combine with layout flags (tp)"),
    (["launch", M, *H100, "--tp", "8", "--port", "70000"], "--port(70000) must be between 1 and 65535"),
    (["launch", "llama-3.1-405b", *H100], "no layout of llama-3.1-405b on 8x H100-SXM"),
    (["validate", M, *H100, "--tp", "3"], "does not divide gpus(8)"),
    (["validate", M], "give a PLAN_DIR holding plan.json, or MODEL with --cluster and --gpus"),
    (["validate", str(BAD / "model_json_nan.json"), *H100], "num_layers = nan: Input should be a finite number"),
    (["validate", M, *H100, "--steps", "0"], "--steps(0) must be at least 1"),
    (["validate", M, *H100, "--warmup", "-1"], "--warmup(-1) must be 0 or more"),
    (["validate", M, *H100, "--timeout", "-5", "--backend", "gloo"], "--timeout(-5.0) must be a positive number of seconds"),
    (["validate", M, *H100, "--step-timeout", "0", "--backend", "gloo"], "--step-timeout(0.0) must be a positive number of seconds"),
    (["validate", M, *H100, "--framework", "torchtitan", "--zero", "1"], "torchtitan shards with FSDP2 only"),
]


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("argv, needle", OUT_CASES, ids=[" ".join(a[:1] + a[2:])[:80] for a, _ in OUT_CASES])
def test_out_directory_is_not_written(tmp_path, argv, needle):
    fresh = tmp_path / "fresh"
    _one_line_error(runner.invoke(app, [*argv, "--out", str(fresh)]), needle)
    assert not fresh.exists()
    assert list(tmp_path.iterdir()) == []  # no staging directory left beside it either
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine\n")
    before = _tree(kept)
    _one_line_error(runner.invoke(app, [*argv, "--out", str(kept), "--force"]), needle)
    assert _tree(kept) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]


@pytest.mark.parametrize("command", ["launch", "validate"])
def test_out_that_is_a_file(tmp_path, command):
    target = tmp_path / "plan"
    target.write_text("not a directory\n")
    result = runner.invoke(app, [command, M, *H100, "--tp", "8", "--backend" if command == "validate" else "--port",
                                 "gloo" if command == "validate" else "29500", "--out", str(target)])
    _one_line_error(result, f"--out {target}: is a file, expected a directory")
    assert target.read_text() == "not a directory\n"


# --- usage errors: through the console entry point, as a shell sees them --------------------------

USAGE = [
    (["memory", M, "--cluster", "dgx-h100", "--gpus", "abc"], "Invalid value for '--gpus'"),
    (["estimate", M, *H100, "--framework", "jax"], "'jax' is not one of 'megatron', 'torchtitan', 'deepspeed'"),
    (["estimate", M, *H100, "--recompute", "most"], "'most' is not one of 'none', 'selective', 'full'"),
    (["estimate", M, *H100, "--tpp", "2"], "No such option: --tpp"),
    (["plan", M, "--gpus", "8"], "Missing option '--cluster'"),
    (["estimate", M, *H100, "--tokens", "lots"], "Invalid value for '--tokens'"),
]


@pytest.mark.parametrize("argv, needle", USAGE, ids=[" ".join(a[2:])[:60] for a, _ in USAGE])
def test_usage_errors_through_main(monkeypatch, capsys, argv, needle):
    monkeypatch.setattr(sys, "argv", ["planner", *argv])
    with pytest.raises(SystemExit) as exit_:
        main()
    out = capsys.readouterr()
    assert exit_.value.code == 2
    text = out.out + out.err
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), text
    assert needle in lines[0] and "Value error" not in lines[0]


# --- a plan directory's plan.json: every field of the type the spec takes ---------------------------

PLAN_DIRS = [
    ("plan_tp_string", "plan.json layout: tp = 'two': expected a whole number"),
    ("plan_tp_numeric_string", "plan.json layout: tp = '8': expected a whole number"),
    ("plan_seq_len_float", "plan.json training: seq_len = 32.5: expected a whole number"),
    ("plan_model_list", "plan.json: model = ['llama']: expected a preset name or a table of the spec"),
    ("plan_cluster_number", "plan.json: cluster = 3: expected a preset name or a table of the spec"),
    ("plan_training_string", "plan.json: training = 'fast': expected a table of fields"),
    ("plan_framework_jax", "plan.json training: framework = 'jax': Input should be 'megatron', 'torchtitan' or 'deepspeed'"),
    ("plan_gpus_string", "plan.json: gpus('8') must be a positive integer"),
    ("plan_missing_layout", "plan.json: missing key(s) ['layout']"),
]


@pytest.mark.parametrize("name, needle", PLAN_DIRS, ids=[c[0] for c in PLAN_DIRS])
def test_bad_plan_json(tmp_path, name, needle):
    _one_line_error(runner.invoke(app, ["validate", str(BAD / name), "--backend", "gloo", "--out", str(tmp_path / "v")]), needle)
    assert list(tmp_path.iterdir()) == []


# --- files that are not files: refused by name, before they are opened ----------------------------


def _special(tmp_path: Path, kind: str, suffix: str) -> Path:
    import os

    path = tmp_path / f"input{suffix}"
    if kind == "fifo":
        os.mkfifo(path)  # reading it would block forever
    elif kind == "zero link":
        path.symlink_to("/dev/zero")  # reading it would never end
    elif kind == "big":
        path.write_text('{"num_layers": 4, "pad": "' + "x" * (1 << 20) + '"}')
    elif kind == "deep":
        nested = "[" * 100_000 + "]" * 100_000
        path.write_text(nested if suffix == ".json" else f"num_layers = {nested}" if suffix == ".toml" else f"num_layers: {nested}")
    return path


SPECIAL = [
    # (what, how the path is made, suffix, argv with {p} for the path, expected fragment)
    ("model FIFO", "fifo", ".toml", ["memory", "{p}", *H100], "is a FIFO (named pipe), expected a regular file"),
    ("cluster FIFO", "fifo", ".toml", ["memory", M, "--cluster", "{p}", "--gpus", "8"], "is a FIFO (named pipe), expected a regular file"),
    ("calibration FIFO", "fifo", ".json", ["estimate", M, *H100, "--calibration", "{p}"], "is a FIFO (named pipe)"),
    ("nodes FIFO", "fifo", ".txt", ["launch", M, *H100, "--tp", "8", "--nodes-file", "{p}", "--out", "{o}"], "is a FIFO (named pipe)"),
    ("FIFO of unknown type", "fifo", ".txt", ["memory", "{p}", *H100], "is a FIFO (named pipe)"),
    ("model link to /dev/zero", "zero link", ".toml", ["memory", "{p}", *H100], "is a character device, expected a regular file"),
    ("cluster link to /dev/zero", "zero link", ".yaml", ["plan", M, "--cluster", "{p}", "--gpus", "8"], "is a character device"),
    ("calibration link to /dev/zero", "zero link", ".json", ["plan", M, *H100, "--calibration", "{p}"], "is a character device"),
    ("model 1 MiB", "big", ".json", ["memory", "{p}", *H100], "bytes is more than the 1,048,576 bytes an input file may hold"),
    ("JSON nested 100,000 deep", "deep", ".json", ["memory", "{p}", *H100], "nested too deeply to be a spec"),
    ("TOML nested 100,000 deep", "deep", ".toml", ["memory", M, "--cluster", "{p}", "--gpus", "8"], "nested too deeply to be a spec"),
    ("YAML nested 100,000 deep", "deep", ".yaml", ["memory", "{p}", *H100], "nested too deeply to be a spec (more than 32 levels)"),
    ("/dev/zero as model", None, "", ["memory", "/dev/zero", *H100], "/dev/zero: is a character device"),
    ("/dev/null as nodes file", None, "", ["launch", M, *H100, "--tp", "8", "--nodes-file", "/dev/null", "--out", "{o}"], "/dev/null: is a character device"),
]


@pytest.mark.parametrize("what, kind, suffix, argv, needle", SPECIAL, ids=[c[0] for c in SPECIAL])
def test_special_files_are_refused_without_reading(tmp_path, what, kind, suffix, argv, needle):
    path = _special(tmp_path, kind, suffix) if kind else None
    out = tmp_path / "out"
    _one_line_error(runner.invoke(app, [a.format(p=path, o=out) for a in argv]), needle)
    assert not out.exists()


# --- output paths: checked before any work, one line naming the path and the cause ----------------

LAUNCH = ["launch", M, *H100, "--tp", "8"]


@pytest.mark.parametrize("out, needle", [
    (".", "--out .: name a directory to create (or an empty one), not '.', '..' or '/'"),
    ("..", "not '.', '..' or '/'"),
    ("/", "not '.', '..' or '/'"),
    ("/proc", "--out /proc: is a mount point; name a directory inside it"),
    ("/nonexistent-planner-dir/out", "directory /nonexistent-planner-dir does not exist"),
], ids=["dot", "dotdot", "root", "mount point", "missing parent"])
@pytest.mark.parametrize("command", ["launch", "validate"])
def test_out_names_refused(command, out, needle):
    argv = LAUNCH if command == "launch" else ["validate", M, *H100, "--tp", "8", "--backend", "gloo"]
    _one_line_error(runner.invoke(app, [*argv, "--out", out, "--force"]), needle)


def test_out_name_too_long(tmp_path):
    _one_line_error(runner.invoke(app, [*LAUNCH, "--out", str(tmp_path / ("a" * 300))]), "the name is 300 bytes; at most 239")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("code, cause", [
    ("EROFS", "read-only file system"), ("ENOSPC", "no space left on device"), ("EDQUOT", "disk quota exceeded"),
    ("EACCES", "permission denied"), ("ENAMETOOLONG", "file name too long"),
])
def test_out_os_errors_are_one_line(tmp_path, monkeypatch, code, cause):
    import errno
    import tempfile

    def failing(*a, **k):
        raise OSError(getattr(errno, code), "injected")

    monkeypatch.setattr(tempfile, "mkdtemp", failing)
    out = tmp_path / "out"
    _one_line_error(runner.invoke(app, [*LAUNCH, "--out", str(out)]), f"--out {out}: {cause}")
    assert list(tmp_path.iterdir()) == []


def test_disk_full_midway_leaves_nothing(tmp_path, monkeypatch):
    from helpers import disk_full_at_fsync

    disk_full_at_fsync(monkeypatch, 3)
    out = tmp_path / "out"
    _one_line_error(runner.invoke(app, [*LAUNCH, "--out", str(out)]), f"--out {out}: no space left on device")
    assert list(tmp_path.iterdir()) == []


def test_a_second_run_into_a_locked_out_fails_at_once(tmp_path):
    from planner.writing import lock

    out = tmp_path / "out"
    with lock(out):
        _one_line_error(runner.invoke(app, [*LAUNCH, "--out", str(out)]), "another planner run is writing it")
        _one_line_error(runner.invoke(app, ["validate", M, *H100, "--backend", "gloo", "--out", str(out)]), "another planner run is writing it")
    assert list(tmp_path.iterdir()) == []  # the lock file goes with the run


def test_empty_out_keeps_its_inode_and_mode(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o710)
    inode = out.stat().st_ino
    result = runner.invoke(app, [*LAUNCH, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert out.stat().st_ino == inode and out.stat().st_mode & 0o777 == 0o710
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "plan.json", "train.sh"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_failed_force_restores_the_old_directory(tmp_path, monkeypatch):
    import errno
    import os

    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("mine\n")
    real = os.replace

    def replace(src, dst):
        if Path(dst) == out and ".old" not in str(src):  # the staging directory moving into place
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    result = runner.invoke(app, [*LAUNCH, "--out", str(out), "--force"])
    _one_line_error(result, f"--out {out}: Invalid cross-device link")
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and _tree(out) == {"mine.txt": b"mine\n"}


def test_force_replaces_and_keeps_the_mode(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o750)
    (out / "old.txt").write_text("old\n")
    result = runner.invoke(app, [*LAUNCH, "--out", str(out), "--force"])
    assert result.exit_code == 0, result.output
    assert not (out / "old.txt").exists() and out.stat().st_mode & 0o777 == 0o750
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no .old directory left


def test_validate_keeps_the_users_files_without_force(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "job.json").write_text("mine\n")
    (out / "progress_rank0.jsonl").write_text("mine\n")
    before = _tree(out)
    _one_line_error(runner.invoke(app, ["validate", M, *H100, "--tp", "8", "--backend", "gloo", "--out", str(out)]),
                    "directory is not empty and holds no earlier validate run; pass --force")
    assert _tree(out) == before


def test_validate_reuses_its_own_directory(tmp_path):
    from cost_models.errors import SpecError
    from planner.validate.command import MARKER_FILE, check_out

    out = tmp_path / "out"
    out.mkdir()
    (out / "validate.json").write_text("{}")
    with pytest.raises(SpecError, match="holds no earlier validate run"):
        check_out(out, force=False)
    (out / MARKER_FILE).write_text("")  # an earlier validate wrote it: reused without --force
    check_out(out, force=False)


@pytest.mark.parametrize("calibrate, needle", [
    ("missing/cal.json", "--calibrate {t}/missing/cal.json: directory {t}/missing does not exist"),
    ("cal.txt", "--calibrate {t}/cal.txt: expected a file name ending in .json"),
    ("dir.json", "--calibrate {t}/dir.json: is a directory, expected a file name"),
])
def test_validate_calibrate_is_checked_before_the_run(tmp_path, calibrate, needle):
    (tmp_path / "dir.json").mkdir()
    result = runner.invoke(app, ["validate", M, *H100, "--tp", "8", "--backend", "gloo", "--out", str(tmp_path / "v"),
                                 "--calibrate", str(tmp_path / calibrate)])
    _one_line_error(result, needle.format(t=tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.json"]


@pytest.mark.parametrize("png, needle", [
    ("dir.png", "--png {t}/dir.png: is a directory, expected a file name"),
    ("b" * 300 + ".png", "the name is 304 bytes"),
    ("missing/m.png", "--png {t}/missing/m.png: directory {t}/missing does not exist"),
    ("m.jpg", "--png {t}/m.jpg: expected a file name ending in .png"),
])
@pytest.mark.parametrize("command", ["memory", "sweep"])
def test_png_names_refused(tmp_path, command, png, needle):
    (tmp_path / "dir.png").mkdir()
    argv = ["memory", M, *H100] if command == "memory" else ["sweep", M, "--cluster", "dgx-h100", "--gpus", "8"]
    _one_line_error(runner.invoke(app, [*argv, "--png", str(tmp_path / png)]), needle.format(t=tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.png"]


def test_png_disk_full_leaves_nothing(tmp_path, monkeypatch):
    import errno
    import os

    def fsync(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", fsync)
    png = tmp_path / "m.png"
    _one_line_error(runner.invoke(app, ["memory", M, *H100, "--png", str(png)]), f"--png {png}: no space left on device")
    assert list(tmp_path.iterdir()) == []


# --- --json is strict JSON ------------------------------------------------------------------------


def test_json_never_prints_nan_or_infinity():
    import json

    from planner.text import finite_json

    doc = finite_json({"a": float("inf"), "b": [float("nan"), 1.0], "c": {"d": float("-inf")}})
    assert doc == {"a": None, "a_note": "infinite", "b": [None, 1.0], "c": {"d": None, "d_note": "minus infinite"}}
    result = runner.invoke(app, ["estimate", M, *H100, "--json"])
    json.loads(result.stdout, parse_constant=lambda c: pytest.fail(f"{c} in --json"))


# --- an ASCII-only terminal (LANG=C, PYTHONIOENCODING=ascii), as on many batch nodes ----------------


@pytest.mark.parametrize("argv, code", [
    (["memory", M, *H100], 0),
    (["plan", M, *H100, "--top", "2", "--explain"], 0),
    (["launch", M, *H100, "--tp", "8", "--out", "{t}/o"], 0),
    (["estimate", "llamä-\x1b[31m", *H100], 2),
], ids=["memory", "plan --explain", "launch", "error with non-ASCII"])
def test_ascii_locale(tmp_path, argv, code):
    import os
    import subprocess

    env = {**os.environ, "LANG": "C", "LC_ALL": "C", "PYTHONIOENCODING": "ascii"}
    proc = subprocess.run([sys.executable, "-m", "planner.cli", *[a.format(t=tmp_path) for a in argv]], env=env,
                          capture_output=True, timeout=120)
    text = (proc.stdout + proc.stderr).decode("ascii")  # every byte is ASCII
    assert proc.returncode == code, text
    assert "Traceback" not in text and "\x1b" not in text
    if code == 2:
        assert text.strip().count("\n") == 0 and "unknown model preset 'llam\\xe4-\\x1b[31m'" in text
