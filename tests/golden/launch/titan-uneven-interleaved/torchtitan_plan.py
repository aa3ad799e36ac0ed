"""torchtitan 0.3.x config function written by planner launch: the registry's config with
what no command-line flag reaches. train.sh selects it with --module torchtitan_plan --config plan_config."""

from torchtitan.models.llama3.config_registry import llama3_8b


def plan_config():
    config = llama3_8b()
    # A split no layers-per-stage weights give (uneven ranks): stage s = chunk v of pipeline rank r, s = v*pp + r.
    config.parallelism.module_fqns_per_model_part = [
        ["tok_embeddings", "layers.0", "layers.1", "layers.2"],
        ["layers.3", "layers.4", "layers.5", "layers.6", "layers.7"],
        ["layers.8", "layers.9", "layers.10", "layers.11", "layers.12"],
        ["layers.13", "layers.14", "layers.15"],
        ["layers.16", "layers.17", "layers.18"],
        ["layers.19", "layers.20", "layers.21", "layers.22", "layers.23"],
        ["layers.24", "layers.25", "layers.26", "layers.27", "layers.28"],
        ["layers.29", "layers.30", "layers.31", "norm", "lm_head"],
    ]
    return config
