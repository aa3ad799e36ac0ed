"""torchtitan 0.3.x config function written by planner launch: the registry's config with
what no command-line flag reaches. train.sh selects it with --module torchtitan_plan --config plan_config."""

from torchtitan.models.llama3.config_registry import llama3_8b
from torchtitan.components.quantization import Float8LinearConverter
from torchtitan.models.llama3 import model_registry


def plan_config():
    config = llama3_8b()
    config.model_spec = model_registry('8B', converters=[Float8LinearConverter.Config(recipe_name='rowwise', filter_fqns=['lm_head'], model_compile_enabled=config.compile.enable)])
    return config
