"""Decoder layers per virtual pipeline stage, as Megatron-LM places them.

Stages are numbered in Megatron's order: virtual stage v of pipeline rank r is stage v·pp + r
(Megatron-LM@d98e8a64 megatron/core/transformer/pipeline_parallel_layer_layout.py, the 1D-to-2D
conversion in PipelineParallelLayerLayout.__init__; layer offsets follow the same order). Four ways
to say a split, one at a time (arguments.py L926-998, transformer_config.py L2229-2260):

- even: num_layers / (pp·vpp) decoder layers per stage;
- uneven ends (--decoder-first/last-pipeline-num-layers): the first and/or last rank hold the
  given layers, the middle ranks share the rest evenly, each rank splits its layers evenly over
  its vpp chunks (transformer_block.py get_num_layers_to_build);
- embedding and loss counted as layers (--account-for-embedding-in-pipeline-split,
  --account-for-loss-in-pipeline-split): num_layers + 1 (+ 1) units split evenly over pp·vpp,
  and the first (last) stage builds one decoder layer fewer (the same function);
- an explicit layout (--pipeline-model-parallel-layout), e.g. "Et*3|(tt|)*29|tL": one string per
  stage separated by "|", E the embedding, t a decoder layer, L the loss, m a multi-token-
  prediction layer; "(…)*n" and "x*n" repeat, commas are cosmetic (parse_str_to_list).
"""

from __future__ import annotations

import functools
import re

# Megatron's layer characters (pipeline_parallel_layer_layout.py parse_str_to_list)
LAYER_CHARS = {"E": "embedding", "L": "loss", "t": "decoder", "m": "mtp"}
# Repetitions Megatron unrolls, in this order: a parenthesised group, then one character.
_REPEATS = (re.compile(r"\(([^)]+)\)\*(\d+)"), re.compile(r"(.)\*(\d+)"))
MAX_LAYOUT_STAGES = 65536  # a layout longer than this is not a pipeline any cluster runs
MAX_LAYOUT_CHARS = 16 * MAX_LAYOUT_STAGES  # unrolled characters: up to 16 layers per stage on average


@functools.lru_cache(maxsize=64)
def parse_pp_layout(text: str) -> tuple[str, ...]:
    """The stages of a --pipeline-model-parallel-layout string, each a string of layer characters.
    Raises ValueError naming what is wrong. Cached: resolve, the rules and the stage split all read it."""
    s = text.replace(",", "")
    for pattern in _REPEATS:
        grown = [len(s)]

        def unroll(m: re.Match[str]) -> str:
            n = int(m.group(2))
            grown[0] += len(m.group(1)) * n - len(m.group(0))
            if n > MAX_LAYOUT_STAGES or grown[0] > MAX_LAYOUT_CHARS:  # checked before the text is built
                raise ValueError(f"unrolls to more than {MAX_LAYOUT_CHARS} characters (repeat {n})")
            return m.group(1) * n
        s = pattern.sub(unroll, s)
    if "(" in s or ")" in s:  # a group the pattern did not unroll: unbalanced, nested, or without its *n
        raise ValueError("a '(' must close with ')*n' (n repeats, no nesting), e.g. '(tt|)*4'")
    stages = s.split("|")
    for stage in stages:
        bad = sorted(set(stage) - set(LAYER_CHARS))
        if bad:
            raise ValueError(
                f"unknown layer character {bad[0]!r} in stage {stage!r}; use E (embedding), t (decoder layer), "
                f"L (loss), m (multi-token prediction), '|' between stages, 't*n' or '(…)*n' to repeat"
            )
    return tuple(stages)


def layout_errors(stages: tuple[str, ...], num_layers: int, pp: int) -> str | None:
    """What Megatron's PipelineParallelLayerLayout refuses in a parsed layout (validate_layer_layout),
    restricted to what this model has (no multi-token-prediction layers)."""
    if len(stages) % pp:
        return f"pp_layout has {len(stages)} stages, not a multiple of pp({pp})"
    flat = "".join(stages)
    if flat.count("E") != 1 or flat.count("L") != 1:
        return "pp_layout needs exactly one E (embedding) and one L (loss)"
    if "E" not in stages[0]:
        return "pp_layout must place E (embedding) in the first stage"
    if flat[0] != "E" or flat[-1] != "L":
        return "pp_layout must start with E (embedding) and end with L (loss)"
    if "L" not in stages[-1]:
        return "pp_layout must place L (loss) in the last stage (rank pp-1's last virtual stage)"
    if "m" in flat:
        return "pp_layout has m (multi-token prediction) layers, which this model has none of"
    if flat.count("t") != num_layers:
        return f"pp_layout has {flat.count('t')} decoder layers (t), the model has num_layers({num_layers})"
    return None


def virtual_stage_layers(num_layers: int, pp: int, vpp: int, *, first: int | None = None, last: int | None = None,
                         embedding: bool = False, loss: bool = False, layout: str | None = None) -> list[int]:
    """Decoder layers of each virtual stage, in Megatron's stage order v·pp + r. Assumes the
    split is legal (cost_models.rules checks it); floors where it is not."""
    if layout is not None:
        return [stage.count("t") for stage in parse_pp_layout(layout)]
    stages = pp * vpp
    if first is not None or last is not None:
        per_rank = stage_layer_counts(num_layers, pp, first, last)
        return [per_rank[r] // vpp for _ in range(vpp) for r in range(pp)]
    units = num_layers + int(embedding) + int(loss)
    counts = [units // stages] * stages
    if embedding:
        counts[0] -= 1
    if loss:
        counts[-1] -= 1
    return counts


def stage_layer_counts(num_layers: int, pp: int, first: int | None, last: int | None) -> list[int]:
    """Decoder layers per pipeline rank with uneven ends; the middle ranks share what the ends leave evenly."""
    if pp == 1:
        return [num_layers]
    ends = [x for x in (first, last) if x is not None]
    middle_ranks = pp - len(ends)
    rest = num_layers - sum(ends)
    each = rest // middle_ranks if middle_ranks else 0
    counts = [each] * pp
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    return counts


def format_pp_layout(per_rank: list[int] | tuple[int, ...], vpp: int) -> str:
    """The --pipeline-model-parallel-layout string of a split given as decoder layers per pipeline
    rank, each rank's layers spread evenly over its vpp chunks (as uneven ends are): stage v·pp + r
    holds per_rank[r]/vpp layers, E opens the first stage and L closes the last. Compact in
    Megatron's own grammar (parse_str_to_list): "t*k" for k layers, "(…|)*n" for n equal stages in
    a row, a cosmetic comma after each such group, e.g. [6, 8, 8, 10] -> "Et*6|(t*8|)*2,t*10L"."""
    pp = len(per_rank)
    assert all(n % vpp == 0 and n > 0 for n in per_rank), (per_rank, vpp)
    return format_stage_layers([per_rank[s % pp] // vpp for s in range(pp * vpp)])


def format_stage_layers(per_stage: list[int] | tuple[int, ...]) -> str:
    """The --pipeline-model-parallel-layout string of decoder layers per virtual stage, in stage
    order v·pp + r (chunks of one rank may differ), compact as format_pp_layout says."""
    assert all(k > 0 for k in per_stage), per_stage
    stages = []
    for s, k in enumerate(per_stage):
        body = "t" if k == 1 else f"t*{k}"
        stages.append(("E" if s == 0 else "") + body + ("L" if s == len(per_stage) - 1 else ""))
    out, i = "", 0
    while i < len(stages):
        j = i
        while j < len(stages) and stages[j] == stages[i]:
            j += 1
        last = j == len(stages)
        if j - i > 1:  # never the ends: E and L make the first and the last stage unique
            out += f"({stages[i]}|)*{j - i},"
        else:
            out += stages[i] + ("" if last else "|")
        i = j
    return out
