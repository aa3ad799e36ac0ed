"""The emitted launch files, read by the frameworks' own parsers and configuration classes.

- Megatron-LM: megatron-core (the `test` extra pins 0.16.1, whose wheel lacks megatron/training, so
  not arguments.py) ships TransformerConfig (with ModelParallelConfig), whose fields generate most
  pretrain_gpt.py flags and whose __post_init__ enforces the parallelism rules. The argv that
  train.sh hands torchrun is mapped onto it as Megatron-LM main does (argument naming:
  megatron/training/argument_utils.py L95-212; args -> config: argument_utils.py L277-383), every
  other flag must be in NOT_CONFIG with the line that defines it, and the config is built.
- torchtitan: the installed 0.3.x ConfigManager parses train.sh's command (with torchtitan_plan.py
  on the path); the 0.2.2 wheel (downloaded once into pytest's cache) parses the TOML. Both run in
  a subprocess (tests/launch_titan_parse.py), which also asks torchtitan's pipeline code for its
  stage split.
- DeepSpeed: DeepSpeedConfig reads ds_config.json against the plan's data-parallel size.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import json
import subprocess
import sys
import typing
import zipfile
from pathlib import Path
from unittest import mock

import pytest

from launch_cases import BY_NAME, CASES, after, run_train_sh, write

# megatron-core warns about missing Transformer Engine and Apex, deprecated scopes and the like on import.
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")

MEGATRON = [c for c in CASES if c.framework == "megatron"]
TITAN03 = [c for c in CASES if c.framework == "torchtitan" and c.options.torchtitan_version == "0.3"]
TITAN02 = [c for c in CASES if c.framework == "torchtitan" and c.options.torchtitan_version == "0.2"]
DEEPSPEED = [c for c in CASES if c.framework == "deepspeed"]

# --- Megatron-LM -----------------------------------------------------------------------------------

# TransformerConfig fields that have no generated flag (arguments.py L2279-2371, the `exclude` list
# of _add_network_size_args), as far as train.sh could reach them.
EXCLUDED = {
    "virtual_pipeline_model_parallel_size", "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
    "gradient_accumulation_fusion", "overlap_p2p_comm", "num_moe_experts", "cp_comm_type", "moe_layer_freq",
    "pipeline_dtype", "params_dtype", "gated_linear_unit", "activation_func", "pipeline_model_parallel_layout",
}

# Flags of train.sh that are not config fields: where Megatron-LM main (d98e8a64) defines each, and
# the choices it accepts (None: any value of its type). ARG = megatron/training/arguments.py,
# TRC = megatron/training/config/training_config.py, CC = .../common_config.py.
NOT_CONFIG: dict[str, tuple[str, set[str] | None]] = {
    "--group-query-attention": ("ARG L2382", None),
    "--seq-length": ("ARG L3305", None),
    "--max-position-embeddings": ("ARG L2394", None),
    "--position-embedding-type": ("ARG L2397", {"learned_absolute", "rope", "yarn", "mrope", "relative", "none"}),
    "--swiglu": ("ARG L2450", None),
    "--quick-geglu": ("ARG L2452", None),
    "--yarn-original-max-position-embeddings": ("ARG L2400", None),
    "--yarn-beta-fast": ("ARG L2402", None),
    "--yarn-beta-slow": ("ARG L2404", None),
    "--no-yarn-correction-range-round-to-int": ("ARG L2408", None),
    "--rotary-scaling-factor": ("ARG L3558", None),
    "--mscale": ("ARG L3560", None),
    "--mscale-all-dim": ("ARG L3562", None),
    "--squared-relu": ("ARG L2448", None),
    "--q-lora-rank": ("ARG L3548", None),
    "--kv-lora-rank": ("ARG L3550", None),
    "--qk-head-dim": ("ARG L3552", None),
    "--qk-pos-emb-head-dim": ("ARG L3554", None),
    "--v-head-dim": ("ARG L3556", None),
    "--rope-type": ("ARG L2906", {"rope", "yarn"}),
    "--no-rope-fusion": ("ARG L2902", None),
    "--rotary-base": ("ARG L2418", None),
    "--rotary-percent": ("ARG L2420", None),
    "--window-size": ("ARG L2384", None),
    "--window-attn-skip-freq": ("ARG L2387", None),
    "--no-rope-freq": ("ARG L2428", None),
    "--use-rope-scaling": ("ARG L2424", None),
    "--rope-scaling-factor": ("ARG L2426", None),
    "--moe-router-load-balancing-type": ("ARG L3532", {"aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none"}),
    "--moe-aux-loss-coeff": ("ARG L3536", None),
    "--distributed-timeout-minutes": ("CC L77", None),
    "--untie-embeddings-and-output-weights": ("ARG L2460", None),
    "--padded-vocab-size": ("TRC L682", None),
    "--num-experts": ("ARG L3518", None),
    "--moe-layer-freq": ("ARG L3520", None),
    "--num-layers-per-virtual-pipeline-stage": ("ARG L3114", None),
    "--num-virtual-stages-per-pipeline-rank": ("ARG L3116", None),
    "--decoder-first-pipeline-num-layers": ("ARG L3095", None),
    "--decoder-last-pipeline-num-layers": ("ARG L3099", None),
    "--cp-comm-type": ("ARG L3221", {"p2p", "all_gather", "a2a", "a2a+p2p"}),
    "--use-distributed-optimizer": ("ARG L3156", None),
    "--num-distributed-optimizer-instances": ("ARG L3216", None),
    "--overlap-grad-reduce": ("ARG L3121", None),
    "--overlap-param-gather": ("ARG L3148", None),
    "--ddp-bucket-size": ("ARG L3125", None),
    "--use-megatron-fsdp": ("CC L92", None),
    "--use-torch-fsdp2": ("CC L95", None),
    "--torch-fsdp2-no-reshard-after-forward": ("ARG L3218", None),
    "--data-parallel-sharding-strategy": ("ARG L3190", {"no_shard", "optim", "optim_grads", "optim_grads_params"}),
    "--outer-dp-sharding-strategy": ("ARG L3193", {"no_shard", "optim"}),
    "--no-gradient-accumulation-fusion": ("ARG L2944", None),
    "--ckpt-format": ("TRC L486", {"torch", "torch_dist", "torch_dcp", "fsdp_dtensor"}),
    "--micro-batch-size": ("TRC L11", None),
    "--global-batch-size": ("TRC L15", None),
    "--optimizer": ("ARG L2913", {"adam", "sgd"}),
    "--tokenizer-type": ("TRC L698", {"HuggingFaceTokenizer"}),
    "--tokenizer-model": ("TRC L714", None),
    "--data-path": ("ARG L3255", None),
    "--split": ("ARG L3266", None),
    "--train-iters": ("TRC L64", None),
    "--lr": ("ARG L2984", None),
    "--min-lr": ("ARG L2991", None),
    "--lr-decay-style": ("TRC L169", {"constant", "linear", "cosine", "inverse-square-root", "WSD"}),
    "--lr-warmup-iters": ("TRC L190", None),
    "--weight-decay": ("ARG L2611", None),
    "--clip-grad": ("ARG L2615", None),
    "--log-interval": ("TRC L247", None),
    "--eval-interval": ("TRC L119", None),
    "--eval-iters": ("TRC L115", None),
    "--save": ("TRC L395", None),
    "--load": ("TRC L430", None),
    "--save-interval": ("TRC L398", None),
    "--wandb-exp-name": ("TRC L342", None),
}


def _flag_groups(argv: list[str]) -> list[tuple[str, list[str]]]:
    groups: list[tuple[str, list[str]]] = []
    for token in argv:
        if token.startswith("--"):
            groups.append((token, []))
        else:
            assert groups, f"value {token!r} before any flag"
            groups[-1][1].append(token)
    return groups


def _generated_flags(cls: type) -> dict[str, tuple[str, object]]:
    """flag -> (field, value it stores when given bare, or None when it takes a value), named as
    ArgumentGroupFactory names them (argument_utils.py L95-106, L160-212)."""
    hints = typing.get_type_hints(cls)
    out: dict[str, tuple[str, object]] = {}
    for f in dataclasses.fields(cls):
        if f.name in EXCLUDED or f.name.startswith("_"):
            continue
        meta = f.metadata.get("argparse_meta", {})
        dashed = f.name.replace("_", "-")
        if hints[f.name] is bool:
            store = f.default is False  # store_true when the default is False, else store_false
            names = meta.get("arg_names") or ([f"--{dashed}"] if store else [f"--no-{dashed}", f"--disable-{dashed}"])
            for n in names:
                out[n] = (f.name, store)
        else:
            for n in meta.get("arg_names") or [f"--{dashed}"]:
                out[n] = (f.name, None)
    return out


def _convert(kind: object, values: list[str]) -> object:
    """A flag's value(s) as argparse would type them from the field's annotation."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is typing.Union:
        options = [a for a in args if a is not type(None)]
        for option in options:
            try:
                return _convert(option, values)
            except (ValueError, AssertionError):
                continue
        raise ValueError(f"{values} fits none of {options}")
    if origin is list:
        return [_convert(args[0], [v]) for v in values]
    assert len(values) == 1, f"one value expected, got {values}"
    (value,) = values
    if origin is typing.Literal:
        assert value in args, f"{value!r} not in {args}"
        return value
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return kind[value]
    if kind in (int, float, str):
        return kind(value)
    raise AssertionError(f"unhandled type {kind}")


def megatron_config(argv: list[str]):
    """TransformerConfig from pretrain_gpt.py's argv, as core_transformer_config_from_args builds it."""
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    generated, hints = _generated_flags(TransformerConfig), typing.get_type_hints(TransformerConfig)
    kw: dict[str, object] = {}
    extra: dict[str, list[str]] = {}
    for flag, values in _flag_groups(argv):
        if flag in generated and flag not in NOT_CONFIG:  # hand-written flags of excluded fields (window_size, …)
            name, store = generated[flag]
            if store is None:
                kw[name] = _convert(hints[name], values)
            else:
                assert not values, f"{flag} takes no value"
                kw[name] = store
        elif flag in NOT_CONFIG:
            choices = NOT_CONFIG[flag][1]
            assert choices is None or set(values) <= choices, f"{flag} {values} not in {choices}"
            extra[flag] = values
        else:
            raise AssertionError(f"{flag} is neither a TransformerConfig flag nor a known pretrain_gpt.py flag")

    # What core_transformer_config_from_args and validate_args derive (argument_utils.py L297-325,
    # arguments.py L954-978 for the virtual pipeline size).
    kw["num_query_groups"] = kw.get("num_query_groups", 1) if "--group-query-attention" in extra else None
    if "--swiglu" in extra:
        kw |= {"gated_linear_unit": True, "activation_func": F.silu}
    if "--quick-geglu" in extra:  # argument_utils.py L323-325
        from megatron.core.fusions.fused_bias_geglu import quick_gelu

        kw |= {"gated_linear_unit": True, "activation_func": quick_gelu}
    if "--squared-relu" in extra:
        from megatron.core.activations import squared_relu

        kw["activation_func"] = squared_relu
    if "--num-experts" in extra:
        kw["num_moe_experts"] = int(extra["--num-experts"][0])
    if "--moe-aux-loss-coeff" in extra:  # hand-written flags of TransformerConfig fields (ARG L1661-1664)
        kw["moe_aux_loss_coeff"] = float(extra["--moe-aux-loss-coeff"][0])
        kw["moe_router_load_balancing_type"] = extra["--moe-router-load-balancing-type"][0]
    if "--moe-layer-freq" in extra:
        kw["moe_layer_freq"] = ast.literal_eval(extra["--moe-layer-freq"][0])  # arguments.py L327 moe_freq_type
    for flag, name in (("--decoder-first-pipeline-num-layers", "num_layers_in_first_pipeline_stage"),
                       ("--decoder-last-pipeline-num-layers", "num_layers_in_last_pipeline_stage")):
        if flag in extra:
            kw[name] = int(extra[flag][0])
    pp = kw.get("pipeline_model_parallel_size", 1)
    if "--num-layers-per-virtual-pipeline-stage" in extra:
        per_rank = kw["num_layers"] // pp
        per_chunk = int(extra["--num-layers-per-virtual-pipeline-stage"][0])
        assert kw["num_layers"] % pp == 0 and per_rank % per_chunk == 0, "arguments.py L954-978"
        kw["virtual_pipeline_model_parallel_size"] = per_rank // per_chunk
    if "--num-virtual-stages-per-pipeline-rank" in extra:
        kw["virtual_pipeline_model_parallel_size"] = int(extra["--num-virtual-stages-per-pipeline-rank"][0])
    if "--cp-comm-type" in extra:
        values = extra["--cp-comm-type"]
        kw["cp_comm_type"] = values[0] if len(values) == 1 else values
    if "--no-gradient-accumulation-fusion" in extra:
        kw["gradient_accumulation_fusion"] = False
    if "--window-size" in extra:  # arguments.py L377-387 tuple_type; L327 moe_freq_type for the skip frequency
        kw["window_size"] = tuple(int(v) for v in extra["--window-size"][0].strip("()").split(","))
    for flag, name in (("--window-attn-skip-freq", "window_attn_skip_freq"), ("--no-rope-freq", "no_rope_freq")):
        if flag in extra:
            kw[name] = int(extra[flag][0])
    dtype = torch.bfloat16 if kw.get("bf16") else torch.half if kw.get("fp16") else torch.float
    kw |= {"params_dtype": dtype, "pipeline_dtype": dtype, "deallocate_pipeline_outputs": True, "batch_p2p_comm": False}
    if kw.get("multi_latent_attention"):
        # core_transformer_config_from_args builds MLATransformerConfig with the hand-written MLA
        # arguments (ARG L3546-3556; --q-lora-rank defaults to None there) and --rope-type
        from megatron.core.transformer.transformer_config import MLATransformerConfig

        one = lambda flag: int(extra[flag][0]) if flag in extra else None  # noqa: E731
        mla = {"q_lora_rank": one("--q-lora-rank"), "kv_lora_rank": one("--kv-lora-rank"), "qk_head_dim": one("--qk-head-dim"),
               "qk_pos_emb_head_dim": one("--qk-pos-emb-head-dim"), "v_head_dim": one("--v-head-dim")}
        mla = {k: v for k, v in mla.items() if v is not None or k == "q_lora_rank"}
        if "--rope-type" in extra:
            mla["rope_type"] = extra["--rope-type"][0]
        # --no-rope-fusion is a store_false flag: fusion is on unless it is given (ARG L2902-2905); for
        # MLA the config then requires yarn (MLATransformerConfig.__post_init__)
        mla["apply_rope_fusion"] = "--no-rope-fusion" not in extra
        if "--rotary-base" in extra:
            mla["rotary_base"] = int(extra["--rotary-base"][0])
        for flag, name in (("--rotary-scaling-factor", "rotary_scaling_factor"), ("--mscale", "mscale"), ("--mscale-all-dim", "mscale_all_dim")):
            if flag in extra:
                mla[name] = float(extra[flag][0])
        return MLATransformerConfig(**kw, **mla), extra
    config = TransformerConfig(**kw)
    if extra.get("--position-embedding-type") == ["yarn"]:
        # argument_utils.py L384-413 (_apply_yarn_config_from_args): config.yarn_* from the flags,
        # YarnRotaryEmbedding's defaults otherwise
        for flag, name, default in (
            ("--rotary-scaling-factor", "yarn_rotary_scaling_factor", 1.0),
            ("--yarn-original-max-position-embeddings", "yarn_original_max_position_embeddings", 4096),
            ("--yarn-beta-fast", "yarn_beta_fast", 32.0),
            ("--yarn-beta-slow", "yarn_beta_slow", 1.0),
            ("--mscale", "yarn_mscale", 1.0),
            ("--mscale-all-dim", "yarn_mscale_all_dim", 0.0),
        ):
            setattr(config, name, type(default)(float(extra[flag][0])) if flag in extra else default)
        config.yarn_correction_range_round_to_int = "--no-yarn-correction-range-round-to-int" not in extra
    return config, extra


def _megatron_argv(case, tmp_path: Path) -> list[str]:
    launch = case.build()
    directory = write(launch, tmp_path / "launch")
    return after(run_train_sh(directory, tmp_path), "/opt/Megatron-LM/pretrain_gpt.py"), launch


@pytest.mark.parametrize("case", MEGATRON, ids=lambda c: c.name)
def test_megatron_flags_build_transformer_config(case, tmp_path):
    argv, launch = _megatron_argv(case, tmp_path)
    config, extra = megatron_config(argv)
    job = launch.report.job
    lay, m = job.layout, job.model
    assert (config.tensor_model_parallel_size, config.pipeline_model_parallel_size) == (lay.tp, lay.pp)
    assert config.context_parallel_size == lay.cp and config.sequence_parallel is job.sp
    assert (config.virtual_pipeline_model_parallel_size or 1) == lay.vpp
    assert config.num_layers_in_first_pipeline_stage == lay.pp_first_stage_layers
    assert config.num_layers_in_last_pipeline_stage == lay.pp_last_stage_layers
    assert (config.num_layers, config.hidden_size, config.ffn_hidden_size) == (m.num_layers, m.hidden_size, m.ffn_hidden_size)
    assert config.num_attention_heads == m.num_attention_heads
    assert (config.num_query_groups or m.num_attention_heads) == m.kv_heads
    assert config.gated_linear_unit is (m.mlp == "swiglu")
    # add_bias_linear covers every linear layer; add_qkv_bias adds q/k/v biases without the rest.
    assert config.add_bias_linear is m.out_bias and (config.add_bias_linear or config.add_qkv_bias) is m.qkv_bias
    assert config.normalization == {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}[m.norm]
    assert config.hidden_dropout == m.hidden_dropout
    assert config.layernorm_epsilon == m.norm_eps and config.qk_layernorm is m.qk_norm
    if m.position_embedding == "rope":
        # GPTModel's own arguments, not TransformerConfig fields (pretrain_gpt.py model_provider)
        assert int(extra["--rotary-base"][0]) == m.rope_theta
        assert float(extra.get("--rotary-percent", ["1.0"])[0]) == m.rotary_fraction
        llama3 = m.rope_scaling is not None and m.rope_scaling.kind == "llama3"
        assert ("--use-rope-scaling" in extra) is llama3
        if m.rope_scaling is not None and m.rope_scaling.kind == "yarn":
            rs = m.rope_scaling
            if m.mla is not None:
                assert (config.rope_type, config.rotary_scaling_factor) == ("yarn", rs.factor)
                assert (config.mscale, config.mscale_all_dim) == (rs.mscale or 1.0, rs.mscale_all_dim or 0.0)
            else:
                assert extra["--position-embedding-type"] == ["yarn"]
                assert (config.yarn_rotary_scaling_factor, config.yarn_original_max_position_embeddings) == (
                    rs.factor, rs.original_max_position_embeddings)
                assert (config.yarn_beta_fast, config.yarn_beta_slow) == (rs.beta_fast, rs.beta_slow)
                assert config.yarn_correction_range_round_to_int is rs.truncate
        if llama3:
            assert float(extra["--rope-scaling-factor"][0]) == m.rope_scaling.factor
    if m.moe:
        assert config.num_moe_experts == m.moe.num_experts and config.moe_router_topk == m.moe.top_k
        balancing = "seq_aux_loss" if m.moe.sequence_aux_loss else "aux_loss"
        assert config.moe_aux_loss_coeff == m.moe.aux_loss_coef > 0 and config.moe_router_load_balancing_type == balancing
        assert config.moe_router_score_function == m.moe.router_score
        assert config.moe_router_pre_softmax is not m.moe.renormalize_top_k
        assert config.moe_expert_capacity_factor == m.moe.capacity_factor
        assert config.expert_model_parallel_size == lay.ep and config.expert_tensor_parallel_size == job.etp
    recompute = {"none": None, "selective": "selective", "full": "full"}[lay.recompute]
    assert config.recompute_granularity == recompute
    if lay.recompute == "full":
        assert (config.recompute_method, config.recompute_num_layers) == (
            ("block", lay.recompute_layers) if lay.recompute_layers else ("uniform", 1))
    assert config.fp8 == ("hybrid" if job.training.precision == "fp8" else None)
    assert int(extra["--micro-batch-size"][0]) == lay.mbs
    assert int(extra["--global-batch-size"][0]) == job.training.global_batch_size
    assert int(extra["--seq-length"][0]) == job.training.seq_len
    assert extra["--data-path"] == ["0.7", "/data/a_text_document", "0.3", "/data/b_text_document"]
    zero_flags = {1: "--use-distributed-optimizer", 2: "--use-torch-fsdp2", 3: "--use-megatron-fsdp"}
    if int(job.zero) in zero_flags:
        assert zero_flags[int(job.zero)] in extra


def test_megatron_check_fails_on_a_misspelled_flag_or_an_invalid_combination(tmp_path):
    argv, _ = _megatron_argv(BY_NAME["megatron-gqa-selective"], tmp_path)
    megatron_config(argv)  # the real argv passes
    bad = ["--tensor-model-paralel-size" if a == "--tensor-model-parallel-size" else a for a in argv]
    with pytest.raises(AssertionError, match="tensor-model-paralel-size"):
        megatron_config(bad)
    with pytest.raises(AssertionError, match="not in"):  # a choice Megatron does not accept
        megatron_config([*argv, "--cp-comm-type", "allgather"])
    # TransformerConfig.__post_init__ runs: tp(3) does not divide 32 heads ...
    with pytest.raises(ValueError, match="multiple of tensor_model_parallel_size"):
        megatron_config(_with(argv, "--tensor-model-parallel-size", "3"))
    # ... and so does ModelParallelConfig's: sequence parallel without tensor parallel.
    with pytest.raises(ValueError, match="sequence parallelism without tensor parallelism"):
        megatron_config(_with(argv, "--tensor-model-parallel-size", "1"))


def _with(argv: list[str], flag: str, value: str) -> list[str]:
    i = argv.index(flag)
    return [*argv[:i + 1], value, *argv[i + 2:]]


# --- torchtitan -----------------------------------------------------------------------------------

HERE = Path(__file__).parent


def _titan_parse(cases, tmp_path: Path, pythonpath: str | None = None) -> list[dict]:
    import os

    jobs, launches = [], []
    for case in cases:
        launch = case.build()
        directory = write(launch, tmp_path / case.name)
        argv = run_train_sh(directory, tmp_path)
        jobs.append({"dir": str(directory), "args": after(argv, "torchtitan.train"), "layers": launch.report.job.model.num_layers})
        launches.append(launch)
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    result = subprocess.run([sys.executable, str(HERE / "launch_titan_parse.py")], input=json.dumps(jobs),
                            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return list(zip(launches, json.loads(result.stdout)))


def _check_titan(launch, parsed: dict) -> None:
    job = launch.report.job
    lay, tr = job.layout, job.training
    par, training = parsed["parallelism"], parsed["training"]
    shard = par["data_parallel_shard_degree"]
    assert par["data_parallel_replicate_degree"] * shard * lay.cp * lay.tp * lay.pp == job.gpus  # parallel_dims.py
    assert shard * lay.cp == (job.dense_shard_group if job.zero else lay.cp)
    assert (par["tensor_parallel_degree"], par["context_parallel_degree"], par["pipeline_parallel_degree"]) == (lay.tp, lay.cp, lay.pp)
    if job.model.moe:
        assert par["expert_parallel_degree"] == lay.ep
    assert training["seq_len"] == tr.seq_len and training["global_batch_size"] == tr.global_batch_size
    dp = par["data_parallel_replicate_degree"] * shard
    accumulation = training["global_batch_size"] // (training["local_batch_size"] * dp)  # torchtitan train.py
    per_step = training["local_batch_size"] // (par["pipeline_parallel_microbatch_size"] if lay.pp > 1 else training["local_batch_size"])
    assert accumulation * per_step * (lay.mbs if lay.pp > 1 else 1) * dp * (1 if lay.pp > 1 else training["local_batch_size"]) == tr.global_batch_size
    assert accumulation * per_step == job.num_microbatches
    if lay.pp > 1:
        assert par["pipeline_parallel_microbatch_size"] == lay.mbs
        assert parsed["stages"] == [list(job.stage_layer_ids(r)) for r in range(lay.pp)]
    else:
        assert training["local_batch_size"] == lay.mbs
    assert parsed["dump_folder"] == f"./outputs/{job.model.name}"


def test_torchtitan_03_config_manager_parses_the_command(tmp_path):
    pytest.importorskip("torchtitan.config")
    cases = [c for c in TITAN03 if c.training.get("precision") != "fp8"]  # float8 conversion needs a GPU
    for launch, parsed in _titan_parse(cases, tmp_path):
        _check_titan(launch, parsed)
        job = launch.report.job
        ac = {"none": "NoneType", "selective": "SelectiveAC.Config", "full": "FullAC.Config"}[job.layout.recompute]
        assert parsed["activation_checkpoint"] == ac
        assert parsed["compile"]["enable"] is job.training.compile
        assert parsed["parallelism"]["enable_sequence_parallel"] is (job.sp or job.layout.tp == 1)
        assert parsed["compile"]["enable_async_tensor_parallel"] is job.training.tp_comm_overlap
        reshard = {1: None, 2: "never", 3: "always"}.get(int(job.zero))
        if reshard:
            assert parsed["parallelism"]["fsdp_reshard_after_forward"] == reshard
        assert parsed["training"]["disable_cuda_graphs"] is (job.layout.pp > 1 or job.layout.ep > 1)


def test_torchtitan_03_fp8_config_function_is_python(tmp_path):
    launch = BY_NAME["titan-fp8-rowwise"].build()
    tree = ast.parse(launch.files["torchtitan_plan.py"].text)
    assert [n.name for n in tree.body if isinstance(n, ast.FunctionDef)] == ["plan_config"]
    assert "Float8LinearConverter.Config(recipe_name='rowwise'" in launch.files["torchtitan_plan.py"].text


@pytest.fixture(scope="session")
def torchtitan_022(pytestconfig) -> Path:
    """torchtitan 0.2.2 unpacked into pytest's cache (its last TOML release; one pip download)."""
    cache = Path(pytestconfig.cache.mkdir("torchtitan-0.2.2"))
    if not (cache / "torchtitan" / "config" / "manager.py").exists():
        result = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "torchtitan==0.2.2", "-d", str(cache)],
                                capture_output=True, text=True, timeout=300)
        wheels = list(cache.glob("torchtitan-0.2.2-*.whl"))
        if result.returncode or not wheels:
            pytest.skip(f"torchtitan 0.2.2 could not be downloaded: {result.stderr.strip()[-300:]}")
        zipfile.ZipFile(wheels[0]).extractall(cache)
    return cache


def test_torchtitan_02_config_manager_parses_the_toml(tmp_path, torchtitan_022):
    pytest.importorskip("tyro")
    for launch, parsed in _titan_parse(TITAN02, tmp_path, pythonpath=str(torchtitan_022)):
        _check_titan(launch, parsed)
        job = launch.report.job
        assert parsed["activation_checkpoint"] == str(job.layout.recompute)
        assert parsed["model"]["name"] == "llama3" if job.model.moe is None else "qwen3"
        if job.model.moe:
            assert parsed["parallelism"]["expert_tensor_parallel_degree"] == job.etp
        if job.training.precision == "fp8":
            assert parsed["model"]["converters"] == ["quantize.linear.float8"]
            assert parsed["quantize"]["linear"]["float8"]["recipe_name"] == "tensorwise"
        assert parsed["parallelism"]["enable_async_tensor_parallel"] is job.training.tp_comm_overlap


# --- DeepSpeed -------------------------------------------------------------------------------------


class _Mpu:
    """The model-parallel unit DeepSpeedConfig asks for the data-parallel world size (runtime/config.py L456-463)."""

    def __init__(self, dp: int) -> None:
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


def _deepspeed_config(config: dict, dp: int):
    from deepspeed.runtime import config as ds

    with mock.patch.object(ds.dist, "get_rank", return_value=0):  # no process group in a unit test
        return ds.DeepSpeedConfig(config, mpu=_Mpu(dp))


@pytest.mark.parametrize("case", DEEPSPEED, ids=lambda c: c.name)
def test_deepspeed_config_accepts_ds_config(case, tmp_path):
    pytest.importorskip("deepspeed.runtime.config")
    launch = case.build()
    job = launch.report.job
    directory = write(launch, tmp_path / "launch")
    config = json.loads((directory / "ds_config.json").read_text())
    parsed = _deepspeed_config(config, job.dp)
    assert parsed.train_batch_size == job.training.global_batch_size
    assert parsed.train_micro_batch_size_per_gpu == job.layout.mbs
    assert parsed.gradient_accumulation_steps == job.num_microbatches
    assert parsed.zero_optimization_stage == int(job.zero)
    assert parsed.bfloat16_config.enabled is (job.training.precision == "bf16")
    assert parsed.float16_config.enabled is (job.training.precision == "fp16")
    assert parsed.tensor_parallel_config.autotp_size == (job.layout.tp if job.layout.tp > 1 else 0)
    # The same file against another dp size breaks the batch triplet: the check is real.
    with pytest.raises(AssertionError, match="Check batch related parameters"):
        _deepspeed_config(config, job.dp * 2)
    argv = run_train_sh(directory, tmp_path)
    flags = dict(_flag_groups(after(argv, str(directory.resolve() / "train.py"))))
    assert flags["--deepspeed"] == [] and flags["--deepspeed_config"] == [str(directory.resolve() / "ds_config.json")]
    assert flags["--model-config"] == [str(directory.resolve() / "config.json")]
    assert flags["--recompute"] == ["full" if job.layout.recompute == "full" else "none"]
    assert flags["--checkpoint-dir"] == ["/ckpt"] and int(flags["--save-interval"][0]) >= 1


def test_deepspeed_config_rejects_a_misspelled_key():
    pytest.importorskip("deepspeed.runtime.config")
    launch = BY_NAME["deepspeed-zero3-full"].build()
    config = json.loads(launch.files["ds_config.json"].text)
    config["zero_optimization"]["stage3_prefetch_buket_size"] = config["zero_optimization"].pop("stage3_prefetch_bucket_size")
    with pytest.raises(Exception, match="stage3_prefetch_buket_size"):
        _deepspeed_config(config, launch.report.job.dp)


def test_megatron_window_flags_reach_transformer_config(tmp_path):
    """A spec with a 1024-token window on three layers in four and attention sinks: the emitted argv
    becomes window_size (1023, 0), window_attn_skip_freq 4 and softmax_type learnable, and
    megatron-core's own is_layer_window_attention marks the layers the spec calls local."""
    from megatron.core.transformer.utils import is_layer_window_attention

    from planner.cli import app
    from planner.loaders import load_model
    from typer.testing import CliRunner

    spec = tmp_path / "swa.toml"
    spec.write_text("num_layers = 8\nhidden_size = 512\nffn_hidden_size = 1536\nnum_attention_heads = 8\n"
                    "vocab_size = 32000\nsliding_window = 1024\nfull_attention_every = 4\nattention_sinks = true\n")
    out = tmp_path / "launch"
    result = CliRunner().invoke(app, ["launch", str(spec), "-c", "dgx-h100", "-g", "8", "--tp", "1", "--pp", "1", "--mbs", "1",
                                      "--zero", "1", "--recompute", "none", "--seq-len", "4096", "--out", str(out)])
    assert result.exit_code == 0, result.output
    config, _ = megatron_config(after(run_train_sh(out, tmp_path), "/opt/Megatron-LM/pretrain_gpt.py"))
    assert (config.window_size, config.window_attn_skip_freq, config.softmax_type) == ((1023, 0), 4, "learnable")
    m = load_model(str(spec))
    assert [is_layer_window_attention(config.window_size, config.window_attn_skip_freq, i + 1) for i in range(8)] == [
        m.is_local_layer(i) for i in range(8)]
