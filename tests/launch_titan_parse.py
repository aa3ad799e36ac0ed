"""Feed emitted torchtitan commands to torchtitan's own ConfigManager (run as a subprocess by
tests/test_launch_parsers.py, since importing torchtitan pulls in most of torch).

stdin: a JSON list of {"dir": launch dir, "args": argv after `-m torchtitan.train`, "pp": int,
"layers": int, "build": bool} or {"flavour": [module, flavour]}. stdout: one JSON object per case with the parsed settings and, with a pipeline, the
stage -> decoder-layer split torchtitan itself computes from them (each pipeline rank's layers,
in its chunk order); with "build" (0.3.x), the model torchtitan builds from the parsed config.
Works with torchtitan 0.3.x (--module/--config) and 0.2.x (--job.config_file).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import sys


def _plain(obj):
    if dataclasses.is_dataclass(obj):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [_plain(x) for x in obj]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return repr(obj)


def _stages(par, num_layers: int) -> list[list[int]] | None:
    """Decoder layers of each pipeline rank, as torchtitan's pipeline code splits them."""
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class
    from torchtitan.distributed import pipeline_parallel as tpp

    pp = par.pipeline_parallel_degree
    if pp == 1:
        return None
    fqns = par.module_fqns_per_model_part
    if fqns is None:
        single = issubclass(get_schedule_class(par.pipeline_parallel_schedule), PipelineScheduleSingle)
        first, last = par.pipeline_parallel_first_stage_less_layers, par.pipeline_parallel_last_stage_less_layers
        per = par.pipeline_parallel_layers_per_stage
        # _get_pipeline_metadata (0.3.0 pipeline_parallel.py L194-265; v0.2.2 the same arithmetic)
        stages = math.ceil((num_layers + first + last) / per) if per else pp * (1 if single else 2)
        # 0.3.0 _generate_llm_fqn_per_model_part (L366); v0.2.2 generate_llm_fqn_per_model_part (L236)
        generate = getattr(tpp, "_generate_llm_fqn_per_model_part", None) or tpp.generate_llm_fqn_per_model_part
        fqns = generate(stages, num_layers, first, last)
    mapping = getattr(tpp, "_get_pp_rank_to_stage_indices_mapping", None)  # 0.3.0 L541
    out = []
    for rank in range(pp):
        if mapping is not None:
            ids = mapping(rank, pp, par.pipeline_parallel_schedule, len(fqns))
        else:  # v0.2.2 pipeline_module_split L459-461, looped schedules
            ids = tuple(rank + s * pp for s in range(len(fqns) // pp))
        out.append([int(m.split(".")[1]) for s in ids for m in fqns[s] if m.startswith("layers.")])
    return out


def _built(model_config) -> dict:
    """The model torchtitan builds from a model config, as its trainer does (0.3.0 trainer.py
    L344-367: model_config.build() on the meta device): parameter count, rope, norms, router."""
    import torch
    from torchtitan.models.common.moe import MoE
    from torchtitan.models.common.rope import RoPE

    with torch.device("meta"):
        model = model_config.build()
    ropes = {(c.theta, c.scaling, c.scaling_factor, c.low_freq_factor, c.high_freq_factor, c.original_max_position_embeddings, c.dim)
             for _, c, _, _ in model_config.traverse(RoPE.Config)}
    moes = [c for _, c, _, _ in model_config.traverse(MoE.Config)]
    routers = {(c.num_experts, c.router.top_k, c.router.score_func, c.router.route_norm, c.load_balance_coeff) for c in moes}
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "ropes": sorted(map(list, ropes)),
        "norms": sorted({(type(m).__name__, m.eps) for m in model.modules() if hasattr(m, "eps") and "Norm" in type(m).__name__}),
        "qk_norm": any(getattr(getattr(layer, "attention", None), "q_norm", None) is not None for layer in model.layers.values()),
        "layers": len(model.layers),
        "moe_layers": len(moes),
        "routers": sorted(map(list, routers)),
    }


def main() -> None:
    cases = json.load(sys.stdin)
    from torchtitan.config import ConfigManager

    results = []
    for case in cases:
        if "flavour" in case:  # a registry flavour itself: {"flavour": [module, flavour]}
            import importlib

            module, flavour = case["flavour"]
            registry = importlib.import_module(f"torchtitan.models.{module}").model_registry
            results.append({"built": _built(registry(flavour).model)})
            continue
        sys.path.insert(0, case["dir"])
        with contextlib.redirect_stdout(io.StringIO()):
            config = ConfigManager().parse_args(case["args"])
        sys.path.remove(case["dir"])
        sys.modules.pop("torchtitan_plan", None)  # each launch directory has its own torchtitan_plan.py
        ac = config.activation_checkpoint
        results.append({
            "parallelism": _plain(config.parallelism),
            "training": _plain(config.training),
            "compile": _plain(config.compile),
            "activation_checkpoint": type(ac).__qualname__ if not dataclasses.is_dataclass(ac) or not hasattr(ac, "mode") else ac.mode,
            "activation_checkpoint_fields": _plain(ac),
            "dump_folder": getattr(config, "dump_folder", None) or config.job.dump_folder,
            "model": _plain(getattr(config, "model", None)),
            "quantize": _plain(getattr(config, "quantize", None)),
            "stages": _stages(config.parallelism, case["layers"]),
            "built": _built(config.model_spec.model) if case.get("build") else None,
        })
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
