"""Feed emitted torchtitan commands to torchtitan's own ConfigManager (run as a subprocess by
tests/test_launch_parsers.py, since importing torchtitan pulls in most of torch).

stdin: a JSON list of {"dir": launch dir, "args": argv after `-m torchtitan.train`, "pp": int,
"layers": int}. stdout: one JSON object per case with the parsed settings and, with a pipeline, the
stage -> decoder-layer split torchtitan itself computes from them (each pipeline rank's layers,
in its chunk order). Works with torchtitan 0.3.x (--module/--config) and 0.2.x (--job.config_file).
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


def main() -> None:
    cases = json.load(sys.stdin)
    from torchtitan.config import ConfigManager

    results = []
    for case in cases:
        sys.path.insert(0, case["dir"])
        with contextlib.redirect_stdout(io.StringIO()):
            config = ConfigManager().parse_args(case["args"])
        sys.path.remove(case["dir"])
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
        })
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
