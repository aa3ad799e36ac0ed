"""Published training runs (benchmarks/data/published_runs.yaml) as jobs the cost model can evaluate.

`load()` turns every entry that measured a throughput and publishes a layout complete enough to run
into a `PublishedRun` (model, cluster, training spec, layout, measured tokens/s/GPU) and lists every
other non-hardware entry with the reason it was left out. The yaml's own conventions per source are
in benchmarks/data/published_runs.md; each rule below cites where its value comes from, and every
value a source did not give is said in words in the run's `assumptions`.

Run: python benchmarks/published.py   (prints the runs per group and the skipped entries)
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from cost_models.enums import (
    AmaxGroup,
    AttentionBackend,
    AttentionKernel,
    Fp8Recipe,
    Framework,
    MLPKind,
    MoEDispatch,
    NormKind,
    OptimizerKind,
    PositionKind,
    Precision,
    Recompute,
    RouterScore,
    Schedule,
    Zero,
)
from cost_models.errors import SpecError
from cost_models.hardware import Cluster
from cost_models.job import Job
from cost_models.layout import Layout
from cost_models.memory import memory_estimate
from cost_models.model_spec import MLASpec, ModelSpec, MoESpec
from cost_models.rules import resolve
from cost_models.states import MEGATRON_VOCAB_DIVISOR
from cost_models.training import NcclCtas, TrainingSpec
from planner import presets
from planner.space import generated_split

sys.path.insert(0, str(Path(__file__).parent))
from flop_conventions import (  # one function per source's FLOP count
    korthikanti_model_flop_per_token,
    mpt_flop_per_token,
    nanotron_figure_flop_per_token,
    narayanan_flop_per_token,
    tokens_from_flops,
    vocabpar_flop_per_token,
)

DATA = Path(__file__).parent / "data" / "published_runs.yaml"


@dataclass(frozen=True)
class PublishedRun:
    id: str
    group: str  # the yaml `group`
    model: ModelSpec
    cluster: Cluster
    training: TrainingSpec
    layout: Layout
    measured_tokens_per_s_per_gpu: float
    measured_from: str  # which measured field and how it was converted
    assumptions: tuple[str, ...]  # every value the source did not give, in words

    def job(self) -> Job:
        return resolve(self.model, self.cluster, self.training, self.layout)


class Skip(Exception):
    """An entry that cannot become a run; the message is the reason."""


class TimeSkip(Skip):
    """An entry whose step time the model cannot price (the message says why) but whose mapping is
    complete, so its memory can still be predicted (`memory_only`)."""

    def __init__(self, reason: str, mapped: Mapped) -> None:
        super().__init__(reason)
        self.mapped = mapped


# --- torchtitan (shared with benchmarks/memory_accuracy.py) ---------------------------------------

TORCHTITAN_MODELS = {"Llama 3.1 8B": "llama-3.1-8b", "Llama 3.1 70B": "llama-3.1-70b", "Llama 3.1 405B": "llama-3.1-405b"}
def torchtitan_cluster(row: dict) -> Cluster:
    """Trainy's rows ran on HGX H200; the Dec 2024 and June 2025 rows on Meta's Grand Teton H100s
    (96 GB HBM2e at 2.4 TB/s, 500 W; the grand-teton-h100 preset and its sources)."""
    hw = row["hardware"]
    spec = presets.clusters()["hgx-h200" if "H200" in hw["gpu"] else "grand-teton-h100"]
    return Cluster(spec=spec, num_gpus=hw["gpu_count"])


def torchtitan_layout(row: dict, num_layers: int) -> Layout:
    lay = row["layout"]
    tp, pp, cp, dp = lay["tp"], lay["pp"], lay["cp"], lay["dp"]
    interleaved = (lay.get("pp_schedule") or "").lower().startswith("interleaved")
    vpp = 2 if interleaved else 1  # torchtitan 9dec370 pipelining_utils.py:22-27: two stages per rank for looped schedules
    if lay["micro_batch"]:
        mbs = lay["micro_batch"]
    else:
        # torchtitan 9dec370 splits the local batch into pipeline_parallel_microbatches, which
        # defaults to the pp degree for every schedule, looped ones included
        # (torchtitan/parallelisms/pipelining_utils.py:79-81, pipeline_llama.py:67-69)
        mbs = lay["local_batch"] // pp
    rc = Recompute.FULL if lay["recompute"].startswith("full") else Recompute.SELECTIVE
    # torchtitan's default split points (generate_split_points), stage s on rank s % pp: None where even
    split = generated_split(num_layers, pp, vpp) if pp > 1 else None
    ends = {}
    if split and vpp == 1 and len(set(split[1:-1])) == 1:
        ends = dict(pp_first_stage_layers=split[0], pp_last_stage_layers=split[-1])  # even middle: the same split
    elif split:
        ends = dict(pp_layout="E" + "|".join("t" * n for n in split) + "L")
    return Layout(
        tp=tp, pp=pp, vpp=vpp, cp=cp, dp=dp, mbs=mbs, zero=Zero.PARAMETERS, recompute=rc,
        schedule=Schedule.INTERLEAVED if interleaved else (Schedule.ONE_F_ONE_B if pp > 1 else None), **ends,
    )


def torchtitan_training(row: dict) -> TrainingSpec:
    techniques = row["layout"].get("techniques") or ""
    float8 = "Float8" in techniques or "Float8" in (row["hardware"].get("precision") or "")
    # torchtitan compiled only the transformer blocks at the Dec 2024 commit (9dec370); from 2025 on
    # --training.compile also compiles the loss (TrainingSpec.compile_loss).
    compiled = "compile" in techniques
    return TrainingSpec(
        # torch SDPA's flash backend (flash-attn's FlashAttention-2 kernels in libtorch) on H100 at these
        # commits: the Dec 2024 and Jun 2025 nightlies predate cuDNN attention becoming SDPA's default
        # (opt-in since pytorch/pytorch#138522, default again only with cuDNN > 9.15 in torch 2.11)
        attention_backend=AttentionBackend.SDPA_FLASH,
        compile=compiled,
        compile_loss=compiled and not row["id"].startswith("torchtitan-2412"),
        seq_len=row["model"]["seq_len"],
        global_batch_size=row["layout"]["global_batch"],
        framework=Framework.TORCHTITAN,
        precision=Precision.FP8 if float8 else Precision.BF16,
        fp8_recipe=Fp8Recipe.ROWWISE if "rowwise" in (row["hardware"].get("precision") or "") else Fp8Recipe.TENSORWISE,
        tp_comm_overlap="AsyncTP" in techniques,
        # the Dec 2024 runs' torch nightly (1963fc8, 2024-12-23) predates pytorch/pytorch#153383: every
        # pipeline stage keeps all its micro-batches' outputs through the step
        pipeline_keeps_outputs=row["id"].startswith("torchtitan-2412") and (row["layout"]["pp"] or 1) > 1,
        # torchtitan's FSDP root unit before 83e69410 (2025-07-28): these rows ran 9dec370 (Dec 2024)
        # and 820504e (Jun 2025)
        fsdp_split_root=False,
    )


# --- shared mapping helpers -----------------------------------------------------------------------


def _preset_model(entry: dict) -> tuple[str, ModelSpec]:
    """The model preset whose shape is the entry's: layers, hidden, heads, kv heads, vocab, and the FFN
    and MoE widths where the entry gives them. Exactly one must match."""
    m = entry["model"]
    want = (m["layers"], m["hidden"], m["heads"], m["kv_heads"], m["vocab"])
    found = []
    for name, spec in presets.models().items():
        if (spec.num_layers, spec.hidden_size, spec.num_attention_heads, spec.kv_heads, spec.vocab_size) != want:
            continue
        if m["moe"] is None and (spec.moe or spec.ffn_hidden_size != m["ffn_hidden"]):
            continue
        if m["moe"] and not (spec.moe and (spec.moe.num_experts, spec.moe.top_k, spec.moe.expert_ffn_hidden_size)
                             == (m["moe"]["routed_experts"], m["moe"]["top_k"], m["moe"]["expert_ffn_hidden"])):
            continue
        found.append((name, spec))
    if len(found) != 1:
        raise Skip(f"no single model preset has the shape of {m['name']} (matches: {[n for n, _ in found]})")
    return found[0]


def mpt_model(entry: dict) -> ModelSpec:
    """MPT as llm-foundry benchmarked it. GELU MLP of 4d, LayerNorm, tied embeddings and vocab 50368
    from scripts/train/yamls/pretrain/mpt-*.yaml; biases on and a learned position table of max_seq_len
    rows are MPTConfig's defaults (no_bias=False, learned_pos_emb=True), which the benchmark yamls keep:
    the README's NumParams column counts exactly these (7b at 2048: 6,658,859,008; +6144·4096 at 8192)."""
    m = entry["model"]
    return ModelSpec(
        name=m["name"], num_layers=m["layers"], hidden_size=m["hidden"], ffn_hidden_size=m["ffn_hidden"],
        num_attention_heads=m["heads"], vocab_size=m["vocab"], max_position_embeddings=m["seq_len"],
        tie_embeddings=True, mlp=MLPKind.GELU, norm=NormKind.LAYERNORM, position_embedding=PositionKind.LEARNED,
        qkv_bias=True, out_bias=True, mlp_bias=True,
        source="mosaicml/llm-foundry scripts/train/benchmarking/README.md (NumParams) and yamls/mpt/*.yaml; MPTConfig defaults",
    )


def _cluster(entry: dict) -> Cluster:
    """The cluster preset of the entry's GPU (the yaml `hardware.gpu` text)."""
    gpu = entry["hardware"]["gpu"]
    if gpu.startswith("NVIDIA Blackwell GPU") and "(" not in gpu:  # MLPerf's system files name only the generation
        gpu += " GB200" if "gb200" in entry["id"] else " B200" if "b200" in entry["id"] else ""
    for key, preset in (("GB300", "gb300-nvl72"), ("GB200", "gb200-nvl72"), ("B200", "dgx-b200"), ("H200", "hgx-h200"),
                        ("H100", "dgx-h100")):
        if key in gpu:
            return Cluster(spec=presets.clusters()[preset], num_gpus=entry["hardware"]["gpu_count"])
    if "A100" in gpu:
        preset = "dgx-a100-40gb" if "40G" in gpu.upper().replace(" ", "") else "dgx-a100-80gb"
        return Cluster(spec=presets.clusters()[preset], num_gpus=entry["hardware"]["gpu_count"])
    raise Skip(f"no cluster preset for GPU {gpu!r}")


def _recompute(text: str) -> Recompute:
    t = text.lower()
    for mode in (Recompute.FULL, Recompute.SELECTIVE, Recompute.NONE):
        if t.startswith(mode.value):
            return mode
    raise Skip(f"recompute {text!r} is not one of none/selective/full")


def _megatron_zero(text: str) -> Zero:
    t = text.lower()
    if t.startswith("none"):  # before the phrases below: "none (... has no distributed optimizer)"
        return Zero.NONE
    if "fsdp (size" in t:  # Megatron FSDP shards parameters, gradients and optimizer states
        return Zero.PARAMETERS
    if "distributed optimizer" in t:
        return Zero.OPTIMIZER
    raise Skip(f"data-parallel sharding {text!r} not understood")


def _vpp_from_script(entry: dict) -> int:
    """vpp = layers / pp / (--num-layers-per-virtual-pipeline-stage), the last read from the yaml's
    pp_schedule text; must agree with layout.vpp where the yaml gives it."""
    lay, layers = entry["layout"], entry["model"]["layers"]
    found = re.search(r"(\d+) layers per virtual stage", lay.get("pp_schedule") or "")
    if not found:
        return lay.get("vpp") or 1
    vpp = layers // lay["pp"] // int(found.group(1))
    assert lay.get("vpp") in (None, vpp), (entry["id"], lay.get("vpp"), vpp)
    return vpp


def _skip_reason(entry: dict, all_entries: list[dict]) -> str | None:
    """Why an entry cannot be a run, before any mapping is tried; None if it may be one."""
    hw, lay, m, meas = entry["hardware"], entry["layout"], entry["model"], entry["measured"]
    if entry["kind"] == "layer_microbenchmark":
        return "layer microbenchmark (one layer's forward/backward times), not a training step"
    if "TPU" in hw["gpu"]:
        return f"{hw['gpu']} run: no GPU cluster preset (MFU anchor only)"
    if "V100" in hw["gpu"]:
        return "V100 run with no published layout (MFU anchor only)"
    if lay.get("tp") is None or lay.get("pp") is None:
        for other in all_entries:
            if (other["group"] == "narayanan2021" and other["id"] != entry["id"] and other["model"].get("layers") == m.get("layers")
                    and other["model"].get("hidden") == m.get("hidden") and other["hardware"].get("gpu_count") == hw.get("gpu_count")
                    and other["layout"].get("global_batch") == lay.get("global_batch")):
                return (f"duplicate of {other['id']} (same model, GPUs and batch; this table gives only the "
                        f"model-parallel size {lay.get('model_parallel_size')}, not the TP x PP split or the micro-batch)")
        if lay.get("model_parallel_size"):
            return f"TP x PP split of the model-parallel size {lay['model_parallel_size']} and the micro-batch not published"
        return "tensor/pipeline parallel degrees not published"
    if lay.get("micro_batch") is None and lay.get("local_batch") is None:
        if entry["group"] == "megatron_readme":
            return ("micro-batch size not published (Megatron-LM README 2024 text and images/model_table.png give "
                    "TP, PP and the global batch only; FFN width, precision and recompute are not stated either)")
        if entry["group"] == "llama3":
            return ("micro-batch size and virtual-pipeline size not published (Llama 3 paper Table 4 and Sec. 3.3.2 "
                    "give only the batch size per DP group and a 'tunable N' interleaved schedule)")
        return "micro-batch size not published"
    if not any(meas.get(k) for k in ("tokens_per_s_per_gpu", "step_time_s", "tflops_per_gpu", "mfu")) and not _published_rate(entry):
        return "no throughput measured"
    if "microbatch-level" in (lay.get("recompute") or ""):
        return ("recompute 'selective + microbatch-level skip of checkpointing' (Korthikanti 2022 App. C) is not "
                "expressible; the same layout without it is the korthikanti2022-t5 seqpar_selective run")
    return None


def _published_rate(entry: dict) -> float | None:
    """tokens/s/GPU the yaml derived by arithmetic alone from a throughput the source printed in
    samples (FP8-LM Table 5 samples/s; Zero Bubble's samples per GPU per second)."""
    derived = entry.get("derived") or {}
    how = derived.get("how") or ""
    if derived.get("tokens_per_s_per_gpu") and "samples" in how and "MFU" not in how:
        return float(derived["tokens_per_s_per_gpu"])
    return None


def _measured_tokens(entry: dict, gbs: int, seq_len: int) -> tuple[float, str] | None:
    """A measured tokens/s/GPU or step time, preferred over any FLOP-rate conversion."""
    meas, gpus = entry["measured"], entry["hardware"]["gpu_count"]
    if meas.get("tokens_per_s_per_gpu"):
        return float(meas["tokens_per_s_per_gpu"]), "tokens_per_s_per_gpu: as published"
    if meas.get("step_time_s"):
        return gbs * seq_len / meas["step_time_s"] / gpus, "step_time_s: tokens = gbs*seq/step/gpus"
    rate = _published_rate(entry)
    if rate is not None:
        return rate, "published samples/s x seq_len / GPUs (yaml derived)"
    return None


# --- per-source mappings ---------------------------------------------------------------------------

Mapped = tuple[ModelSpec, Cluster, TrainingSpec, Layout, list[str]]


# --make-vocab-size-divisible-by as the Megatron-family runs used it (TrainingSpec.vocab_divisible_by).
# None of their scripts passes the flag, so Megatron's default, 128, pads the vocabulary to a multiple
# of 128·tp: NVIDIA/Megatron-LM@0609f27f megatron/arguments.py:589, megatron/tokenizer/tokenizer.py:53-66
# (the Megatron of FP8-LM's MS-AMP-Examples; its gpt3/pretrain_*_megatron.sh at @b646e282 pass no such flag,
# nor do the sc21 scripts of the Narayanan et al. runs, Megatron-LM@d98e8a64
# examples/academic_paper_scripts/sc21/); sail-sg/zero-bubble-pipeline-parallelism@77b9eed9
# megatron/arguments.py:656, megatron/tokenizer/tokenizer.py:56-64; sail-sg/VocabularyParallelism@4dca7d20
# megatron/training/arguments.py:828, megatron/training/tokenizer/tokenizer.py:86-99 (pretrain_gpt.sh passes
# none). NeMo pads the same way: NeMo 1's make_vocab_size_divisible_by: 128 (mlcommons/training_results_v3.0
# @63e326c4 NVIDIA/benchmarks/gpt3/implementations/pytorch/conf/megatron_gpt_config.yaml:80) and NeMo 2's
# GPTConfig.make_vocab_size_divisible_by = 128 handed to get_vocab_size (NVIDIA/NeMo@v2.2.0
# nemo/collections/llm/gpt/model/base.py:176, 228; nemo/lightning/base.py:37-50), whose log in the MLPerf
# Llama-3.1 405B runs reads "Padded vocab_size: 32256, original vocab_size: 32000" at tp 4
# (mlcommons/training_results_v5.0@0fdc28f0 Nebius/results/nebius_soperator_8xH200_n128_ngc25.01_nemo/
# llama31_405b/result_1.txt:5996).
MEGATRON_RUNS_VOCAB_DIVISOR = MEGATRON_VOCAB_DIVISOR
# nanotron pads to a multiple of its config's model.make_vocab_size_divisible_by·tp, 1 by default
# (huggingface/nanotron@c2528430 src/nanotron/config/config.py:221, trainer.py:680-685, helpers.py:50-55),
# and the bench config of the playbook's sweep sets 1 (huggingface/nanotron@67c5ebb6, branch nouamane/bench2,
# examples/config_tiny_llama_bench.yaml:34).
NANOTRON_VOCAB_DIVISOR = 1


def _megatron_papers(entry: dict) -> Mapped:
    """narayanan2021 and korthikanti2022: Megatron-LM on Selene (DGX A100 80GB)."""
    lay, m = entry["layout"], entry["model"]
    name, model = _preset_model(entry)
    notes = [f"model = preset {name} (Megatron-LM defaults: 4h GELU MLP, biases, tied embeddings, learned positions, dropout 0.1)",
             "attention kernel eager: 2021-22 Megatron-LM had no fused flash attention"]
    if "--fp16" not in (entry["hardware"].get("precision") or ""):
        notes.append("precision fp16: the paper says 'mixed precision'; the 2021-22 Megatron A100 run scripts use --fp16")
    zero3 = "ZeRO-3" in (lay["zero"] or "")
    if zero3:  # Narayanan Table 2: DeepSpeed ZeRO-3 without model parallelism
        framework, zero = Framework.DEEPSPEED, Zero.PARAMETERS
    else:
        framework, zero = Framework.MEGATRON, _megatron_zero(lay["zero"] or "none (Jan 2021 Megatron-LM has no distributed optimizer)")
    vpp = _vpp_from_script(entry)
    if "ptdp" in entry["id"]:
        # Table 2 gives only the model-parallel size; the yaml infers TP8 x PP12 (175B) and TP8 x PP35
        # (530B). "Interleaved" (paper Sec. 5.1) with the virtual stages of the released scripts for the
        # same split: run_figure_12.sh (175B, TP8/PP12) 2 layers per virtual stage, run_table_1.sh
        # (530B, TP8/PP35) 1 layer per virtual stage (examples/academic_paper_scripts/sc21).
        per_virtual_stage = 2 if m["layers"] == 96 else 1
        vpp = m["layers"] // lay["pp"] // per_virtual_stage
        notes.append(f"vpp {vpp}: {per_virtual_stage} layer(s) per virtual stage, as the released sc21 script for this split")
    if "assumes" in lay["recompute"]:
        notes.append("full recompute: the paper does not say; its FLOP count (eq. 3) assumes recomputation")
    training = TrainingSpec(seq_len=m["seq_len"], global_batch_size=lay["global_batch"], precision=Precision.FP16,
                            framework=framework, attention=AttentionKernel.EAGER,
                            vocab_divisible_by=None if zero3 else MEGATRON_RUNS_VOCAB_DIVISOR)
    layout = Layout(tp=lay["tp"], pp=lay["pp"], vpp=vpp, cp=lay.get("cp") or 1, mbs=lay["micro_batch"], sp=bool(lay.get("sp")),
                    zero=zero, recompute=_recompute(lay["recompute"]))
    return model, _cluster(entry), training, layout, notes


def _torchtitan(entry: dict) -> Mapped:
    model = presets.models()[TORCHTITAN_MODELS[entry["model"]["name"]]]
    training = torchtitan_training(entry)
    layout = torchtitan_layout(entry, model.num_layers)
    notes = [f"model = preset {TORCHTITAN_MODELS[entry['model']['name']]}"]
    if "H200" not in entry["hardware"]["gpu"]:
        notes.append("Grand Teton H100 = grand-teton-h100 preset (96 GB HBM2e, 2.4 TB/s, peak between H100 SXM and NVL)")
    if training.compile and not training.compiles_loss:
        notes.append("torchtitan 9dec370 compiled the blocks only: compile_loss False")
    techniques, precision = entry["layout"].get("techniques") or "", entry["hardware"].get("precision") or ""
    if "AsyncTP" in techniques:
        notes.append("AsyncTP = tp_comm_overlap")
    if "rowwise" in precision:
        notes.append("Float8 (rowwise) = fp8_recipe rowwise")
    if "float8 all-gather" in techniques:
        notes.append("FSDP float8 all-gather (parameters gathered in fp8) is not modelled")
    if layout.pp > 1:
        notes.append(f"vpp {layout.vpp} (stages per rank) and micro-batch {layout.mbs} = local batch / pp micro-batches, torchtitan 9dec370 defaults")
    if layout.pp_layout or layout.pp_first_stage_layers:
        sizes = generated_split(model.num_layers, layout.pp, layout.vpp) or ()
        notes.append(f"{model.num_layers} layers split {'/'.join(map(str, sizes))} over the stages (torchtitan's default split points)")
    return model, torchtitan_cluster(entry), training, layout, notes


# The notes that depend on the table's FSDP mixed-precision mode (its "MP Mode" column), per mode:
# which llm-foundry ran the row, and the gradient reduce-scatter's dtype.
# DEFAULT: the runs llm-foundry@b2a43a147 published: its submit_benchmarks.py leaves mixed_precision
# at DEFAULT (L268, never passed by run_config) and installs llm-foundry v0.3.0 (L397-403), which pins
# Composer 0.16 (setup.py L50); Composer 0.16's DEFAULT gathers bf16 parameters and reduces gradients
# in fp32 (mosaicml/composer@v0.16.4 composer/trainer/mosaic_fsdp_utils.py L87-90; DEFAULT is also
# the fsdp_config default, dist_strategy.py L143).
# PURE: rows carried over from the README's earlier tables (README@c6cfb4284, 2023-07-21, lists
# them; b2a43a147's message: "added back old numbers that I didn't reproduce"), run by an earlier
# submit_benchmarks.py whose attn_impl default is also 'triton' (a7d6a4475 L119); PURE reduces in
# bf16 (mosaic_fsdp_utils.py L91-94).
MPT_MODE_NOTES = {
    "PURE": (
        ("a row the README carried over from its tables before llm-foundry@b2a43a147 (README@c6cfb4284 lists it), "
         "run with submit_benchmarks.py's attn_impl default 'triton' (a7d6a4475 L119) on the code of its day"),
        ("gradients reduce-scattered in bf16 (fsdp_reduce_in_bf16): the table's mixed_precision PURE sets "
         "FSDP's reduce_dtype to the 16-bit precision (Composer@v0.16.4 mosaic_fsdp_utils.py L91-94; "
         "v0.15.0 mosaic_fsdp.py L89-92)"),
    ),
    "DEFAULT": (
        ("run as llm-foundry@b2a43a147 published it: submit_benchmarks.py installs llm-foundry v0.3.0 (L397-403), "
         "which pins Composer 0.16 (setup.py L50)"),
        ("gradients reduce-scattered in fp32: the table's mixed_precision DEFAULT gathers bf16 parameters and "
         "reduces in fp32 (Composer@v0.16.4 mosaic_fsdp_utils.py L87-90), as torchtitan's FSDP2 does"),
    ),
}


# The table's Sharding Strategy column as a ZeRO stage. Composer hands the name to torch's FSDP1
# (Composer@v0.16.4 mosaic_fsdp_utils.py L38, @v0.17.2 L39: SHARDING_MAP), whose ShardingStrategy
# docstring (torch/distributed/fsdp/api.py L37-49, read in torch 2.13.0) says FULL_SHARD unshards
# the parameters before the forward, reshards after it, unshards again before the backward and
# reshards after it (zero 3); SHARD_GRAD_OP unshards before the forward, does not reshard after
# it and reshards only after the backward, gradients reduce-scattered after the backward (zero 2).
MPT_SHARDING = {"FULL_SHARD": (Zero.PARAMETERS, "zero 3"), "SHARD_GRAD_OP": (Zero.GRADIENTS, "zero 2")}

# The rows of the README's 'H100 80GB BF16 (Large Scale, >= 128 GPUs)' table, added by
# llm-foundry@5e85bd62d (2024-01-06) with the sweep.py that submitted them: submit_benchmarks.py at
# that commit installs llm-foundry main with the gpu-flash2 extra (L401-402), flash-attn 2.4.2
# (setup.py L100-101), Composer 0.17 (setup.py L50); sweep.py passes --fsdp_config_mixed_precision
# PURE (L13), which run_config never hands to mod_parameters (L451-468), so the fsdp_config's
# mixed_precision is mod_parameters' DEFAULT (L268, L335), as the table's MP Mode column says.
MPT_LARGE_NOTES = (
    ("run as llm-foundry@5e85bd62d's sweep.py submitted it: submit_benchmarks.py installs llm-foundry main (at that "
     "commit __version__ 0.4.0, llmfoundry/__init__.py L98) with the gpu-flash2 extra (L401-402: flash-attn 2.4.2, setup.py L100-101), which pins Composer 0.17 (setup.py L50); "
     "sweep.py's --fsdp_config_mixed_precision PURE (L13) never reaches the config (run_config L451-468), which keeps "
     "mod_parameters' DEFAULT (L268, L335), as the table's MP Mode says"),
    ("gradients reduce-scattered in fp32: the table's mixed_precision DEFAULT gathers bf16 parameters and reduces "
     "in fp32 (Composer@v0.17.2 mosaic_fsdp_utils.py L94-96), as torchtitan's FSDP2 does"),
)


@dataclass(frozen=True)
class MptCode:
    """Where the earlier MPT rows' code (llm-foundry v0.3.0, b2a43a147) and the large-scale sweep's
    (5e85bd62d) say what `_mpt` assumes: the checkpointed module, the pretrain yamls' commit, the
    loss, the fused Wqkv and FSDP1's backward prefetch."""

    commit: str
    checkpoint: str
    loss: str
    wqkv: str
    prefetch: str


MPT_CODE = {  # keyed by whether the row is from the large-scale table
    False: MptCode(
        "b2a43a147", "(llm-foundry v0.3.0 modeling_mpt.py L619-620)",
        ("loss as a fused one (compile_loss): MPT's default loss_fn at llm-foundry v0.3.0 is 'fused_crossentropy', "
         "flash_attn's CrossEntropyLoss, which keeps the 16-bit logits and a per-row log-sum-exp (modeling_mpt.py L721-727)"),
        "(llm-foundry v0.3.0 llmfoundry/models/layers/attention.py L484)",
        ("FSDP1's backward prefetch priced as FSDP2's (the next layer's gather issued ahead of its backward): the "
         "benchmark leaves backward_prefetch at Composer's default BACKWARD_POST (Composer@v0.16.4 "
         "dist_strategy.py L135; yamls/pretrain/mpt-*.yaml@b2a43a147 fsdp_config sets limit_all_gathers: true, "
         "no backward_prefetch), which issues that gather after the current layer's gradients (the BackwardPrefetch "
         "docstring of torch/distributed/fsdp/api.py, read in torch 2.13.0); how much it then overlaps depends on how far the CPU runs ahead")),
    True: MptCode(
        "5e85bd62d", "(activation_checkpointing_target unset: llmfoundry/models/mpt/modeling_mpt.py L839-855 at 5e85bd62d)",
        ("loss as a fused one (compile_loss): MPT's default loss_fn at llm-foundry 5e85bd62d is 'fused_crossentropy' "
         "(modeling_mpt.py L981-987), flash-attn 2.4.2's CrossEntropyLoss, a Triton kernel (flash_attn/losses/"
         "cross_entropy.py L6 at v2.4.2) that keeps the 16-bit logits and a per-row log-sum-exp "
         "(ops/triton/cross_entropy.py L56-57)"),
        "(llmfoundry/models/layers/attention.py L559 at 5e85bd62d)",
        ("FSDP1's backward prefetch priced as FSDP2's (the next layer's gather issued ahead of its backward): the "
         "sweep sets backward_prefetch BACKWARD_PRE and forward_prefetch true (sweep.py@5e85bd62d L14-16), which "
         "issues that gather before the current layer's gradients (the BackwardPrefetch docstring of "
         "torch/distributed/fsdp/api.py, read in torch 2.13.0)")),
}


def _mpt_attention(entry: dict, large: bool) -> tuple[AttentionBackend, str]:
    """The attention kernel a row ran: attn_impl 'flash' with flash-attn 2 installed (the large-scale
    sweep's 1b, 3b, 7b and 70b rows) is FlashAttention-2; 'triton' (every other row) is priced at
    FlashAttention-1's rates."""
    if "attn_impl flash" in (entry["layout"].get("techniques") or ""):
        return AttentionBackend.FA2, (
            "attention FlashAttention-2 (fa2): sweep.py@5e85bd62d passes --attn_impl flash for this size (L40-82) and "
            "the gpu-flash2 extra installs flash-attn 2.4.2, whose flash_attn_varlen_func llm-foundry calls with the "
            "ALiBi slopes (llmfoundry/models/layers/attention.py L342-362 at 5e85bd62d), priced without an ALiBi cost (the "
            "PR that added it, Dao-AILab/flash-attention#540, reports 'almost no loss' on A100 in plots without numbers); "
            "the unpadding of q, k, v and the padding of the output around it (flash_unpad_copies: L270-289, 367-369 "
            "there; flash-attn v2.4.2 flash_attn/bert_padding.py L8-61, 98-122, 197-209)")
    if large:
        return AttentionBackend.FA1, (
            "attention kernel at FlashAttention-1's rates, no curve of the kernel that ran being published: "
            "sweep.py@5e85bd62d passes --attn_impl triton for this size (L40-82), llm-foundry's own Triton "
            "FlashAttention (flash_attn_triton.py, llmfoundry/models/layers/attention.py L373-391 at 5e85bd62d), "
            "copied from flash-attention@eff9fe6b, on triton-pre-mlir's sm90 branch (setup.py L66)")
    return AttentionBackend.FA1, (
        "attention kernel at FlashAttention-1's rates, no curve of the kernel that ran being published: attn_impl "
        "'triton' (submit_benchmarks.py@b2a43a147 L144, L305) is flash_attn_triton.py, Tri Dao's Triton "
        "FlashAttention (llm-foundry v0.3.0 layers/attention.py L300-425, copied from flash-attention@eff9fe6b) "
        "on triton-pre-mlir's sm90 branch (setup.py L66); its docstring puts its forward + backward 'slightly "
        "slower' than CUDA FlashAttention on A100 (L38-40), llm-foundry's TUTORIAL.md L301 'slightly faster' "
        "than attn_impl 'flash', flash-attn 1.0.9 (setup.py L89)")


def _mpt(entry: dict) -> Mapped:
    lay, m = entry["layout"], entry["model"]
    cluster = _cluster(entry)
    pure = "PURE" in entry["hardware"]["precision"].upper()
    large = "Large Scale" in entry["source"]["location"]
    code_note, reduce_note = MPT_LARGE_NOTES if large else MPT_MODE_NOTES["PURE" if pure else "DEFAULT"]
    strategy = lay["zero"].split()[1] if lay["zero"].startswith("FSDP ") else lay["zero"]
    if strategy not in MPT_SHARDING:
        raise Skip(f"layout.zero {lay['zero']!r}: the sharding strategy must be one of {', '.join(MPT_SHARDING)}")
    zero, stage = MPT_SHARDING[strategy]
    backend, attention_note = _mpt_attention(entry, large)
    code = MPT_CODE[large]
    notes = [(f"llm-foundry FSDP {strategy} (torch's FullyShardedDataParallel under Composer) modelled as FSDP (framework "
              f"torchtitan, {stage}: the ShardingStrategy docstring of torch/distributed/fsdp/api.py L37-49, torch 2.13.0) "
              "with FSDP1's flat parameters (fsdp_flat_params): no copy-out after the gathers, the "
              "gradient cast to the reduce dtype and divided in place before the reduce-scatter"),
             code_note,
             ("MPT shape from the benchmark config: biases on, learned positions (MPTConfig defaults), LayerNorm with "
              "bias (low_precision_layernorm is a kernel choice); the README's NumParams match this model exactly"),
             attention_note,
             "every MPTBlock checkpointed whole where the table says activation checkpointing, attention included " + code.checkpoint,
             reduce_note,
             ("optimizer decoupled_adamw, Composer's DecoupledAdamW, as the benchmark yamls name it "
              f"(scripts/train/yamls/pretrain/mpt-*.yaml@{code.commit} optimizer.name, weight_decay 0.0)"),
             code.loss,
             f"network: the {cluster.spec.name} preset stands in for the MosaicML cluster (README: 1600 Gbps RoCE per node on A100)",
             "q, k, v as one fused GEMM (fused_projections): MPT's attention has one Wqkv linear " + code.wqkv,
             code.prefetch]
    training = TrainingSpec(seq_len=m["seq_len"], global_batch_size=lay["global_batch"], precision=Precision.BF16,
                            framework=Framework.TORCHTITAN, attention=AttentionKernel.FLASH, attention_backend=backend,
                            compile_loss=True, fused_projections=True, optimizer=OptimizerKind.DECOUPLED_ADAMW,
                            fsdp_reduce_in_bf16=pure, fsdp_flat_params=True, fsdp_split_root=False,
                            flash_unpad_copies=backend is AttentionBackend.FA2)
    layout = Layout(tp=1, pp=1, mbs=lay["micro_batch"], zero=zero, recompute=_recompute(lay["recompute"]))
    return mpt_model(entry), cluster, training, layout, notes


# --- sources added with the bottom-up model -------------------------------------------------------

# The unit a leave-one-source-out refit holds out together: submitters running one vendor's code
# (MLPerf), one lab's papers on one cluster and code base (Sea AI Lab's Zero Bubble and Vocabulary
# Parallelism), one project's two reports (KempnerForge).
FAMILIES = {"zerobubble": "sail_pipeline", "vocabpar": "sail_pipeline", "kempnerforge_mfu_scaling": "kempnerforge",
            "kempnerforge_config_validation": "kempnerforge"}
FAMILIES |= {g: "torchtitan_dsv3" for g in ("tt_pr1504", "tt_pr1610", "tt_pr1616", "tt_pr2107")}  # DSV3_CODE's PRs


def family(group: str) -> str:
    return "mlperf" if group.startswith("mlperf") else FAMILIES.get(group, group)


def _dims(entry: dict) -> dict[str, Any]:
    m = entry["model"]
    return dict(num_layers=m["layers"], hidden_size=m["hidden"], num_attention_heads=m["heads"],
                num_kv_heads=m.get("kv_heads") or m["heads"], max_position_embeddings=max(m["seq_len"], 2048))


def _gpt_model(entry: dict, *, vocab: int, ffn: int | None = None, tied: bool, rope: bool = False) -> ModelSpec:
    """Megatron's GPT defaults: GELU MLP of 4h, LayerNorm, biases, learned absolute positions
    (megatron/training/arguments.py: --position-embedding-type learned_absolute), unless the source
    says rotary."""
    m = entry["model"]
    return ModelSpec(name=m["name"], **_dims(entry), ffn_hidden_size=ffn or m.get("ffn_hidden") or 4 * m["hidden"],
                     vocab_size=vocab, tie_embeddings=tied, mlp=MLPKind.GELU, norm=NormKind.LAYERNORM,
                     position_embedding=PositionKind.ROPE if rope else PositionKind.LEARNED,
                     qkv_bias=True, out_bias=True, mlp_bias=True, source=entry["source"]["url"])


def _llama_model(entry: dict, *, tied: bool = False) -> ModelSpec:
    m = entry["model"]
    return ModelSpec(name=m["name"], **_dims(entry), ffn_hidden_size=m["ffn_hidden"], vocab_size=m["vocab"],
                     tie_embeddings=tied, source=entry["source"]["url"])


def _layout(entry: dict, *, zero: Zero, recompute: Recompute, recompute_layers: int | None = None,
            schedule: Schedule | None = None, first: int | None = None, last: int | None = None) -> Layout:
    lay = entry["layout"]
    return Layout(tp=lay["tp"], pp=lay["pp"], vpp=lay.get("vpp") or 1, cp=lay.get("cp") or 1, ep=lay.get("ep") or 1,
                  mbs=lay["micro_batch"], sp=bool(lay.get("sp")) if lay["tp"] > 1 else None, zero=zero,
                  recompute=recompute, recompute_layers=recompute_layers, schedule=schedule,
                  pp_first_stage_layers=first, pp_last_stage_layers=last)


def _fp8lm(entry: dict) -> Mapped:
    """FP8-LM (Peng et al. 2023, arXiv:2310.18313) Table 5: Megatron-LM on Azure NDv5 H100."""
    if "MS-AMP" in entry["id"] or "ours" in entry["id"].lower() or "msamp" in entry["id"].lower():
        raise Skip("MS-AMP's FP8 optimizer and FP8 collectives are not a framework the model prices")
    notes = ["GPT with rotary embeddings (paper Sec. 3.1.2), otherwise Megatron GPT defaults; FFN 4h and the GPT-2 BPE "
             "vocabulary (50257) are not stated in the paper (MS-AMP-Examples' GPT scripts use them)",
             "attention FlashAttention-1 (flash-attn 1.0.9) in the bf16 and te runs alike: the authors' MS-AMP image of "
             "the paper's month installs flash-attn==1.0.9 with Transformer Engine v0.11 on nvcr.io/nvidia/pytorch:23.04 "
             "(Azure/MS-AMP@b0ab69cf dockerfile/torch2.1-cuda12.1.dockerfile:1,53, 2023-10-18; the same at v0.3.0, "
             "@4e2de182); Megatron's --use-flash-attn path calls flash-attn's 1.x flash_attn_unpadded_func "
             "(NVIDIA/Megatron-LM@0609f27f, the MS-AMP-Examples submodule, megatron/model/transformer.py:27-33, 386-390) "
             "and TE v0.11's DotProductAttention runs flash-attn before its cuDNN FusedAttention "
             "(NVIDIA/TransformerEngine@v0.11 transformer_engine/pytorch/attention.py:955-975)",
             "recompute none (the paper names none)",
             "network: the dgx-h100 preset stands in for Azure NDv5 (8x400G InfiniBand per VM)",
             "no gradient accumulation fusion: the authors' released Megatron scripts pass "
             "--no-gradient-accumulation-fusion to the bf16, te and msamp runs alike (Azure/MS-AMP-Examples@b646e282 "
             "gpt3/pretrain_6b7_megatron.sh, @18bedc0e gpt3/pretrain_13b_megatron.sh)",
             "no --overlap-grad-reduce or --overlap-param-gather (the same scripts pass neither, and Megatron at "
             "their submodule commit 0609f27f has neither flag): the distributed optimizer's reduce-scatter and "
             "its gather of every parameter are exposed (megatron/optimizer/distrib_optimizer.py:810-899 there)",
             ("memory: the distributed optimizer's construction, a transient the size of the grad buffer "
              "(torch.tensor(storage) in the Megatron-LM those scripts pin, Azure/MS-AMP-Examples@b646e282 "
              "third_party/Megatron-LM = NVIDIA/Megatron-LM@0609f27f), counts in a peak since the process started"),
             ("memory: both block outputs of every layer keep a 1-byte dropout mask at --hidden-dropout 0.0 (the "
              "scripts' setting): the bias-dropout-add runs under torch.jit.script with autodiff subgraph "
              "inlining off, in Megatron's local layer and in Transformer Engine v0.11's TransformerLayer alike "
              "(TrainingSpec.bda_mask_kept)"),
             ("memory: the loss's forward holds the 16-bit logits, their fp32 copy and the out-of-place shifted "
              "fp32 softmax together (Megatron-LM@0609f27f cross_entropy.py:24, gpt_model.py:21-36; in place from "
              "9634c0e4, 2024-06-13): TrainingSpec.loss_shift_beside_fp32_copy")]
    prec = entry["hardware"]["precision"].upper()
    fp8 = "FP8" in prec or "TE" in entry["id"].upper()
    if fp8:
        notes.append("fp8 delayed scaling: Megatron-LM@0609f27f builds TE's DelayedScaling "
                     "(megatron/model/transformer.py:1351)")
    training = TrainingSpec(seq_len=entry["model"]["seq_len"], global_batch_size=entry["layout"]["global_batch"],
                            precision=Precision.FP8 if fp8 else Precision.BF16, framework=Framework.MEGATRON,
                            fp8_recipe=Fp8Recipe.DELAYED if fp8 else Fp8Recipe.TENSORWISE,
                            attention=AttentionKernel.FLASH, attention_backend=AttentionBackend.FA1,
                            grad_accumulation_fusion=False, overlap_grad_reduce=False, param_buffer_init_copy=True,
                            bda_mask_kept=True, loss_shift_beside_fp32_copy=True, vocab_divisible_by=MEGATRON_RUNS_VOCAB_DIVISOR)
    layout = _layout(entry, zero=Zero.OPTIMIZER, recompute=Recompute.NONE)
    return _gpt_model(entry, vocab=50257, tied=False, rope=True), _cluster(entry), training, layout, notes


def _sail_pipeline(entry: dict) -> Mapped:
    """Zero Bubble PP (Qi et al., ICLR 2024) and Vocabulary Parallelism (Yeung et al., MLSys 2025):
    Megatron-LM's own 1F1B / interleaved baselines, pure pipeline parallelism on A100 80GB."""
    lay, m = entry["layout"], entry["model"]
    zb = entry["group"] == "zerobubble"
    notes = ["Megatron GPT defaults (GELU 4h, LayerNorm, biases, learned positions)"]
    if zb:
        if "interleav" in (lay.get("pp_schedule") or "").lower() or (lay.get("vpp") or 1) > 1:
            raise Skip("interleaved baseline: the virtual-stage count and the shorter end stages are not published "
                       "(the paper: 'each transformer layer serves as a chunk')")
        notes += ["fp16, no flash attention, no recompute, dropout 0.1 on attention and hidden states: the "
                  "authors' released script at the time (sail-sg/zero-bubble-pipeline-parallelism@ed85b11c "
                  "examples/pretrain_llama_7b.sh sets none of them; megatron/arguments.py there: "
                  "--attention-dropout and --hidden-dropout default 0.1)", "vocabulary 32000 (a SentencePiece "
                  "tokenizer of unstated size; 32000 is LLaMA's)",
                  ("no distributed optimizer, no --overlap-grad-reduce, gradient accumulation fusion at Megatron's "
                   "default (on): the run script of the paper's time, sail-sg/zero-bubble-pipeline-parallelism@77b9eed9 "
                   "examples/pretrain_zero_bubble.sh:64-100, passes none of --use-distributed-optimizer, "
                   "--overlap-grad-reduce, --no-gradient-accumulation-fusion (megatron/arguments.py:949-953, 1175, "
                   "1212 there)"),
                  ("Megatron's local transformer (--transformer-impl defaults to local, megatron/arguments.py:535 "
                   "@77b9eed9): linear_qkv adds its bias and reduces its gradient outside the GEMM (qkv_bias_unfused)"),
                  ("tied input and output embeddings: examples/pretrain_zero_bubble.sh:64-100 @77b9eed9 does not pass "
                   "--untie-embeddings-and-output-weights (store_true, megatron/arguments.py:687-688), so the legacy GPT "
                   "model shares them (megatron/model/gpt_model.py:53) and the 1F1B baseline all-reduces the word "
                   "embedding's gradient between the first and last stage after every step "
                   "(megatron/core/distributed/finalize_model_grads.py:16-50, 156-166; pipeline_parallel/schedules.py:1312-1316)"),
                  ("Megatron's local unfused attention copies the context and, in backward, joins the q, k, v "
                   "gradients and scales dq and dk by itself (local_attention_copies; megatron/model/transformer.py:"
                   "368-373, 421-422, 677-693 @77b9eed9)"),
                  ("Megatron's unfused cross entropy on fp32 logits (cross_entropy_unfused): the fork has no "
                   "--cross-entropy-loss-fusion; its legacy GPT model casts the logits with .float() "
                   "(megatron/model/gpt_model.py:32-36 @77b9eed9)")]
        vocab, attention, backend, dropout = 32000, AttentionKernel.EAGER, None, 0.1
        per_middle = -(-m["layers"] // lay["pp"])
        end = per_middle - 1  # Sec. 5.1: the first and last stages hold one layer fewer
        first = last = end if end * 2 + per_middle * (lay["pp"] - 2) == m["layers"] else None
        if first is None:
            raise Skip(f"{m['layers']} layers do not split as the paper says (ends one layer fewer) over pp {lay['pp']}")
    else:
        notes += ["fp16, flash-attn 2, no dropout (the authors' pretrain_gpt.sh: --fp16 --use-flash-attn "
                  "--attention-dropout 0 --hidden-dropout 0)", "untied embeddings, the nominal vocabulary (authors' artifact)",
                  ("distributed optimizer, no --overlap-grad-reduce, gradient accumulation fusion at Megatron's default "
                   "(on): sail-sg/VocabularyParallelism@4dca7d20 pretrain_gpt.sh:78-120 passes --use-distributed-optimizer "
                   "and neither --overlap-grad-reduce nor --no-gradient-accumulation-fusion (megatron/training/"
                   "arguments.py:1198-1202, 1451-1452, 1491-1492 there); its --sequence-parallel is dropped at tp 1 "
                   "(arguments.py:500-504)"),
                  ("rope fusion at its default (on): Megatron core copies q, k, v to bshd for Transformer Engine's "
                   "flash attention (qkv_bshd_copies)"),
                  ("Megatron's unfused cross entropy (cross_entropy_unfused): pretrain_gpt.sh:78-120 @4dca7d20 passes "
                   "no --cross-entropy-loss-fusion (store_true, megatron/training/arguments.py:1169-1171), so the "
                   "baseline's loss is vocab_parallel_cross_entropy (megatron/core/models/gpt/gpt_model.py:247-254, "
                   "language_module.py:37-40)")]
        vocab, attention, backend, dropout = m["vocab"], AttentionKernel.FLASH, AttentionBackend.FA2, 0.0
        first = last = None
    training = TrainingSpec(seq_len=m["seq_len"], global_batch_size=lay["global_batch"], precision=Precision.FP16,
                            framework=Framework.MEGATRON, attention=attention, attention_backend=backend,
                            overlap_grad_reduce=False, qkv_bias_unfused=zb, qkv_bshd_copies=not zb,
                            cross_entropy_unfused=True, local_attention_copies=zb, vocab_divisible_by=MEGATRON_RUNS_VOCAB_DIVISOR)
    layout = _layout(entry, zero=Zero.NONE if zb else Zero.OPTIMIZER, recompute=Recompute.NONE,
                     schedule=Schedule.ONE_F_ONE_B, first=first, last=last)
    model = _gpt_model(entry, vocab=vocab, tied=zb).model_copy(update=dict(attention_dropout=dropout, hidden_dropout=dropout))
    return model, _cluster(entry), training, layout, notes


def _torch_recompute(text: str, layers: int) -> tuple[Recompute, int | None, str | None]:
    t = (text or "none").lower()
    if t.startswith("full"):
        return Recompute.FULL, None, None
    if "layer" in t:
        # torchtitan selective "layer" AC checkpoints every selective_ac_option-th block (default 2):
        # half the blocks are fully recomputed; block positions do not change the time
        return Recompute.FULL, layers // 2, "selective layer AC = full recompute of every 2nd block (torchtitan default option 2)"
    if "op" in t or "sac" in t or t.startswith("selective"):
        return Recompute.SELECTIVE, None, None
    return Recompute.NONE, None, None


@dataclass(frozen=True)
class TorchaoBench:
    """The torchtitan code one torchao benchmark table ran (benchmarks/float8/training/ at the README's
    commit: torchtitan's llama3_8b.toml, --training.local-batch-size=1 (batch_size=1 before),
    --training.compile, the float8 or mx converter, through torchtitan's run_train.sh), and what that
    code decides about memory."""

    readme: str  # the pytorch/ao commit that published the table (the rows' source.repo_path)
    torchtitan: str  # the torchtitan commit it ran (the README's), or the range the script's flags allow
    compile_loss: bool
    split_root: bool  # TrainingSpec.fsdp_split_root (torchtitan 83e69410 and after)
    # SDPA's cuDNN backend first on compute capability 10.0, its op outside the per-op SAC save list
    # (TrainingSpec.sac_recomputes_attention)
    cudnn_first_on_sm100: bool
    notes: tuple[str, ...]


SPLIT_ROOT_NOTE = ("FSDP2 units as torchtitan wraps them since 83e694105 (fsdp_split_root): the embedding and every "
                   "layer resharded after forward, [norm, output] kept gathered until its backward "
                   "(torchtitan/models/llama3/infra/parallelize.py:388-422 at {})")

TORCHAO_BENCH = (
    TorchaoBench(
        "8c81863ba", "069bae286..54ef42221", False, False, False,
        ("torchtitan between 069bae286 (2025-02-27), the first to take --float8.recipe_name, and 54ef42221, the last "
         "before the table (2025-03-12): the script passes --model.converters=float8, --float8.recipe_name and the "
         "config torchtitan/models/llama/train_configs/llama3_8b.toml (pytorch/ao@8c81863ba "
         "benchmarks/float8/training/float8_training_benchmark.sh:24-30, 42); torchtitan 0.0.2 as the README says",
         "loss uncompiled (compile_loss False): torchtitan compiled the transformer blocks only between e8977b007 "
         "(2024-12-18) and bbb1b616e (2025-04-02), cross_entropy on the .float() logits with the compile left out "
         "('compiling loss function causes CUDA errors, turning off for now', torchtitan/components/loss.py:10-18 "
         "at 069bae286 and 54ef42221; the llama TrainSpec's loss_fn=cross_entropy_loss, torchtitan/models/llama/__init__.py:73, "
         "called as it is at torchtitan/train.py:327 at 54ef42221)")),
    TorchaoBench(
        "853f87d1b", "2c8b5947", True, True, True,
        ("torchtitan 2c8b5947 (the README's): with --training.compile the loss is compiled too "
         "(torchtitan/components/loss.py:25-30 build_cross_entropy_loss, since bbb1b616e)",
         SPLIT_ROOT_NOTE.format("2c8b5947"),
         "SDPA's flash backend on the MI300X: torchtitan puts cuDNN first only on compute capability 10.0 "
         "(torchtitan/models/attention.py:200-211 at 2c8b5947); torch reports the MI300X as 9.4 (presets/gpus.toml)")),
    TorchaoBench(
        "d8bb51f63", "6fc499f6f", True, True, True,
        ("torchtitan 6fc499f6f (the README's): with --training.compile the loss is compiled too "
         "(torchtitan/components/loss.py:25-30 build_cross_entropy_loss, since bbb1b616e)",
         SPLIT_ROOT_NOTE.format("6fc499f6f"),
         "SDPA's cuDNN backend on the B200 (torchtitan/models/attention.py:200-211 at 6fc499f6f), whose op the "
         "per-op SAC save list leaves out (torchtitan/models/llama3/infra/parallelize.py:233-243 there, until "
         "b39377f9f): attention output and statistics recomputed in backward (sac_recomputes_attention)")),
)


def torchao_bench(entry: dict) -> TorchaoBench:
    """The TORCHAO_BENCH entry of a torchao_torchtitan_bench row, by the commit its source names."""
    commit = entry["source"]["repo_path"].split("@")[1].split(":")[0]
    found = [b for b in TORCHAO_BENCH if commit.startswith(b.readme)]
    assert len(found) == 1, (entry["id"], commit)
    return found[0]


def _torchao_fp8_recipe(tech: str) -> Fp8Recipe:
    """The fp8 scaling of a torchao row: torchao's float8 rowwise recipes (rowwise, rowwise_with_gw_hp),
    MX's mxfp8_cublas(_rceil) (one e8m0 scale per 32 elements), else tensorwise."""
    t = tech.lower()
    if "mxfp8" in t:
        return Fp8Recipe.MXFP8
    return Fp8Recipe.ROWWISE if "rowwise" in t else Fp8Recipe.TENSORWISE


def _torch_native(entry: dict) -> Mapped:
    """torchtitan's older docs, torchao's torchtitan benchmarks, KempnerForge: FSDP2/DTensor stacks."""
    lay, m, hw = entry["layout"], entry["model"], entry["hardware"]
    g = entry["group"]
    # Power and clock decide these rows' step time, not what they allocate: their memory is still predicted
    # (on the dgx-b200 and dgx-h100 presets, whose capacities the allocator's counters do not depend on).
    untimed = None
    if "B200" in hw["gpu"] and "750" in (hw.get("hw_notes") or "") + (hw.get("gpu") or "") + str(entry.get("notes")):
        untimed = "B200 held at a 750 W power limit, which no GPU preset describes"
    if "variant not stated" in hw["gpu"]:
        untimed = "the H100 variant is not stated: a 700 W SXM part and Meta's 500 W part differ by ~30% in measured matmul rate"
    tech = (lay.get("techniques") or "") + " " + (hw.get("precision") or "")
    notes = []
    compiled = "compile" in tech and "no torch.compile" not in tech and "compile=false" not in tech and "compile off" not in tech and "compile=off" not in tech
    low = tech.lower()
    fp8 = ("float8" in low or "mxfp8" in low) and "none (bfloat16)" not in low and "no float8" not in low
    # "Async TP" / "AsyncTP", not where the row says "no async TP" (torchtitan docs Aug 2024's bf16 and float8 rows)
    squeezed = tech.lower().replace(" ", "").replace("-", "")
    async_tp = "asynctp" in squeezed and "noasynctp" not in squeezed
    rc, rc_layers, note = _torch_recompute(lay.get("recompute") or "", m["layers"])
    if note:
        notes.append(note)
    cluster = _torch_native_cluster(entry)
    bench = torchao_bench(entry) if g == "torchao_torchtitan_bench" else None
    # torchao's B200 table: SDPA's cuDNN backend first, its op outside the per-op SAC save list (its notes say so)
    sac_attention = bench is not None and bench.cudnn_first_on_sm100 and cluster.gpu.compute_capability >= (10, 0)
    backend = AttentionBackend.CUDNN if sac_attention else AttentionBackend.SDPA_FLASH
    if g.startswith("kempnerforge"):
        backend = AttentionBackend.CUDNN
        notes.append("SDPA on cuDNN: torch 2.11 (uv.lock) bundles a cuDNN newer than 9.15, where SDPA prefers it on sm90")
    elif not sac_attention and cluster.gpu.vendor == "nvidia":
        notes.append("SDPA's flash backend, FlashAttention-2 kernels (torch before 2.11 on H100/A100; cuDNN attention was opt-in)")
    elif cluster.gpu.vendor == "amd":
        notes.append("SDPA's flash backend on ROCm, AOTriton's kernels: priced by presets/kernels/cdna3.toml's stand-in "
                     "curves (no published MI300X curve)")
    # KempnerForge keeps fully_shard's reshard_after_forward=True under its pipeline (apply_fsdp2's
    # default, KempnerInstitute/KempnerForge@601aba9 kempnerforge/distributed/parallel.py:110-153,
    # called without it at scripts/train.py:111,120); torchtitan's own default otherwise
    reshard = True if g.startswith("kempnerforge") else None
    # KempnerForge's TP plan: q, k, v, gate and up each a ColwiseParallel of their own, and no
    # sequence parallelism on pipeline stages (@601aba9 kempnerforge/distributed/tensor_parallel.py:
    # 62-78 _build_block_tp_plan, 117-120 seq_parallel = not is_pp_stage and not tie)
    per_projection = kf = g.startswith("kempnerforge")
    if kf:
        notes.append("KempnerForge memory: bf16 parameters, gradients and AdamW states; FSDP2 gradient sync on the "
                     "last micro-batch only (fp32 unsharded gradients in between); the vocabulary unsplit over tp; "
                     "eager cross entropy on the bf16 logits outside the compiled model; torch.compile around the "
                     "whole model (TrainingSpec fields)")
    compile_loss, split_root = False if kf else None, False
    if bench is not None:
        notes += list(bench.notes)
        compile_loss, split_root = bench.compile_loss, bench.split_root
        if fp8 and _torchao_fp8_recipe(tech) is Fp8Recipe.MXFP8:
            notes.append("MXFP8 linears (precision fp8, fp8_recipe mxfp8): torchao's mx_mm keeps the 16-bit input and "
                         "weight for its backward (pytorch/ao@e4e681be6, the table's torchao, torchao/prototype/mx_formats/"
                         "mx_linear.py:95-117), as Float8Linear does: their saved activations are 16-bit")
    training = TrainingSpec(seq_len=m["seq_len"], global_batch_size=lay["global_batch"],
                            precision=Precision.FP8 if fp8 else Precision.BF16, framework=Framework.TORCHTITAN,
                            fp8_recipe=_torchao_fp8_recipe(tech) if fp8 else Fp8Recipe.TENSORWISE,
                            attention=AttentionKernel.FLASH, attention_backend=backend, compile=compiled,
                            tp_comm_overlap=async_tp,
                            fsdp_reshard_after_forward=reshard, tp_gather_per_projection=per_projection,
                            bf16_params=kf, fsdp_sync_last_microbatch=kf, tp_replicated_vocab=kf,
                            loss_on_16bit_logits=kf, compile_loss=compile_loss, sac_recomputes_attention=sac_attention,
                            fsdp_split_root=split_root,
                            compile_whole_model=kf and compiled)
    # FSDP2 wraps every model of these stacks (a one-rank shard group moves nothing), except
    # KempnerForge on one GPU: no device mesh, no FSDP (KempnerInstitute/KempnerForge@01b461a
    # kempnerforge/distributed/setup.py:81-85, parallel.py:208-212)
    zero = Zero.NONE if kf and hw["gpu_count"] == 1 else Zero.PARAMETERS
    schedule = Schedule.ONE_F_ONE_B if lay["pp"] > 1 else None
    layout = _layout(entry, zero=zero, recompute=rc, recompute_layers=rc_layers, schedule=schedule)
    if per_projection and lay["pp"] > 1 and lay["tp"] > 1:
        layout = layout.model_copy(update={"sp": False})
        notes.append("no sequence parallelism: KempnerForge's pipeline stages run basic TP")
    model = _llama_model(entry)
    if g == "torchtitan_docs_2024" and "Llama 2" in m["name"]:
        notes.append("Llama 2 13B/70B: torchtitan's llama2 flavours (vocab 32000 as in the yaml)")
    if untimed:
        raise TimeSkip(untimed, (model, cluster, training, layout, notes))
    return model, cluster, training, layout, notes


@dataclass(frozen=True)
class Dsv3Code:
    """The torchtitan code one DeepSeek-V3 PR's run used (the squash commit's parent) and what it
    decides for the model and its memory.

    - route_norm: the router renormalizes the kept top-k scores to sum to 1. At decfd3fef^ it does so
      for sigmoid scores only (torchtitan/models/deepseek_v3/model/moe.py:204-225 there), so the softmax
      16B flavor does not; from d0cdb1433^ on MoEArgs(route_norm=True) in the 16B and 671B flavors does
      (torchtitan/models/deepseek_v3/__init__.py:81-103, 129-156 at d0cdb1433^ and d021aa9ca^).
    - sac_recomputes_all_to_all: the code predates torchtitan@c4e229115 (2025-09-06), whose selective
      checkpointing saves the all-to-all outputs: every commit but d021aa9ca^ (2025-12-17), by the git
      ancestry of each in pytorch/torchtitan.
    - split_root (TrainingSpec.fsdp_split_root): apply_fsdp (torchtitan/experiments/llama4/infra/
      parallelize.py, which models/deepseek_v3/infra/parallelize.py imports) wraps tok_embeddings, each
      layer and [norm, output] as units of their own at d0cdb1433^ and 8a749c618^ (lines 319-378) and
      d021aa9ca^ (models/llama4/infra/parallelize.py:337-398); at decfd3fef^ the layers and the root
      alone (experiments/llama4/infra/parallelize.py:318-335)."""

    commit: str
    route_norm: bool
    sac_recomputes_all_to_all: bool
    split_root: bool


DSV3_CODE = {"tt_pr1504": Dsv3Code("decfd3fef^", False, True, False),
             "tt_pr1610": Dsv3Code("d0cdb1433^", True, True, True),
             "tt_pr1616": Dsv3Code("8a749c618^", True, True, True),
             "tt_pr2107": Dsv3Code("d021aa9ca^", True, False, True)}


def dsv3_attention_skip(entry: dict) -> str | None:
    """Why a torchtitan DeepSeek-V3 row's attention cannot be priced from sources; None if it can.

    FlexAttention with the block_causal mask attends within each document of the packed sequence
    (torchtitan's 16B flavor with use_flex_attn at d0cdb1433 and after, the 671B flavor's
    attn_type "flex", attn_mask_type "block_causal" at d021aa9ca^ torchtitan/models/deepseek_v3/
    __init__.py:154-155): its work is the sum of the squared document lengths of the c4 text each
    sequence packs, which neither the PRs nor the configs give. torch SDPA with MLA's head dims (q and k
    qk_nope + qk_rope = 192, v 128) cannot run the flash backend, which needs one head dim for q, k
    and v, while the memory-efficient backend needs only q and k to agree, and the cuDNN backend, last
    in SDPA's order, takes head dims up to 128 (pytorch/pytorch@21c3369e aten/src/ATen/native/
    transformers/cuda/sdp_utils.cpp: priority_order, check_head_dim_size_flash,
    check_head_dim_size_mem_efficient, check_cudnn_tensor_shapes; the flash rule unchanged in the
    installed torch 2.13's mirror for nested inputs, torch/nested/_internal/sdpa.py:89-112). The PR
    #1610 text says the same of the run: "the only available backend for SDPA for DeepSeekV3 is
    efficient attention kernel". presets/kernels holds no curve of SDPA's memory-efficient (CUTLASS)
    kernel on Hopper."""
    arch = entry["model"].get("arch_notes") or ""
    if "flex" in arch.lower() and "block_causal" in arch:
        return ("FlexAttention with torchtitan's block_causal (document) mask: its attention work depends on the "
                "lengths of the c4 documents packed into each sequence, which neither the PR nor the config gives")
    if "SDPA" in arch:
        return ("torch SDPA runs its memory-efficient (CUTLASS) kernel for MLA's head dims (q/k 192, v 128: the flash "
                "backend needs one head dim, sdp_utils.cpp check_head_dim_size_flash; PR #1610: 'the only available "
                "backend for SDPA for DeepSeekV3 is efficient attention kernel'), and presets/kernels has no Hopper "
                "curve of that kernel")
    return None


def _torchtitan_dsv3(entry: dict) -> Mapped:
    reason = dsv3_attention_skip(entry)
    if reason:
        raise TimeSkip(reason, dsv3_mapped(entry))
    return dsv3_mapped(entry)


# The MLA ranks and router settings of torchtitan's two DeepSeek-V3 flavors these rows ran, the same at
# every DSV3_CODE commit: "16B" q_lora_rank 0 (one query projection), kv_lora_rank 512, qk_nope_head_dim
# 128, qk_rope_head_dim 64, v_head_dim 128, route_scale 1.0, no expert groups (n_expert_groups 1)
# (torchtitan/models/deepseek_v3/__init__.py:81-103 at d0cdb1433^, :71-89 at decfd3fef^); "671B"
# q_lora_rank 1536, the same other ranks, sigmoid scores, num_expert_groups 8, num_limited_groups 4,
# route_scale 2.5 (__init__.py:130-156 at d021aa9ca^). (flavor: (MLA, router groups, route_scale).)
DSV3_FLAVORS = {
    "16B": (MLASpec(kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128), None, 1.0),
    "671B": (MLASpec(q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128), (8, 4), 2.5),
}


def dsv3_model(entry: dict) -> ModelSpec:
    """torchtitan's DeepSeekV3Model of the row's flavor (DSV3_FLAVORS, at the DSV3_CODE commit): MLA,
    RMSNorm, SwiGLU dense MLPs in the first n_dense_layers, then MoE layers of GroupedExperts, a
    TokenChoiceTopKRouter and the shared experts as one FeedForward of moe_inter_dim x num_shared_experts
    (torchtitan/models/moe.py:314-336 at d0cdb1433^; deepseek_v3/model/moe.py:278-287 at decfd3fef^);
    untied output. The auxiliary-loss-free balancing (load_balance_coeff 1e-3, MoEArgs' default,
    moe.py:31 at d0cdb1433^) keeps an expert_bias buffer and adds no loss term."""
    m, moe = entry["model"], entry["model"]["moe"]
    flavor = re.search(r'flavor "(\w+)"', m["name"]).group(1)
    mla, groups, scale = DSV3_FLAVORS[flavor]
    shared = moe["expert_ffn_hidden"] * moe["shared_experts"]  # FeedForward(hidden_dim=moe_inter_dim * num_shared_experts)
    assert shared == moe["shared_ffn_hidden"] * (moe["shared_experts"] if flavor == "671B" else 1), (entry["id"], shared)
    return ModelSpec(
        name=m["name"], num_layers=m["layers"], hidden_size=m["hidden"], ffn_hidden_size=m["ffn_hidden"],
        num_attention_heads=m["heads"], vocab_size=m["vocab"], max_position_embeddings=m["seq_len"], mla=mla,
        moe=MoESpec(num_experts=moe["routed_experts"], top_k=moe["top_k"], expert_ffn_hidden_size=moe["expert_ffn_hidden"],
                    router_score=RouterScore(moe["router_score_function"]), renormalize_top_k=DSV3_CODE[entry["group"]].route_norm,
                    router_groups=groups[0] if groups else None, router_group_top_k=groups[1] if groups else None,
                    aux_loss_coef=0.0, expert_bias=True, num_shared_experts=1, shared_expert_ffn_hidden_size=shared,
                    first_k_dense=moe["dense_first_layers"], routed_scaling_factor=scale),
        source=f"{entry['source']['url']}; torchtitan@{DSV3_CODE[entry['group']].commit} torchtitan/models/deepseek_v3/__init__.py",
    )


def dsv3_mapped(entry: dict) -> Mapped:
    """A torchtitan DeepSeek-V3 row as a job, its attention left at SDPA's flash family (which
    dsv3_attention_skip says no row ran)."""
    lay, hw = entry["layout"], entry["hardware"]
    model, code = dsv3_model(entry), DSV3_CODE[entry["group"]]
    tech = lay.get("techniques") or ""
    # "torch.compile on model and loss" / "model+loss" (2107) or on the loss only (the 16B toml's
    # components = ["loss"], deepseek_v3_16b.toml:67-69 at d0cdb1433^); "no torch.compile" (1504)
    whole = "compile on model" in tech or "compile model" in tech
    # --parallelism.expert_parallel_comm_backend=deepep (PR 2107's "After" run)
    deepep = "DeepEP" in (lay.get("dispatcher") or "")
    loss_only = "compile on loss only" in tech
    training = TrainingSpec(seq_len=entry["model"]["seq_len"], global_batch_size=lay["global_batch"], precision=Precision.BF16,
                            framework=Framework.TORCHTITAN, attention=AttentionKernel.FLASH,
                            attention_backend=AttentionBackend.SDPA_FLASH, compile=whole, compile_loss=whole or loss_only,
                            moe_dispatch=MoEDispatch.DEEPEP if deepep else MoEDispatch.ALLTOALL, moe_load_factor=1.0,
                            sac_recomputes_all_to_all=code.sac_recomputes_all_to_all, fsdp_split_root=code.split_root)
    layout = torchtitan_layout(entry, model.num_layers).model_copy(update={"ep": lay["ep"] or 1})
    notes = [f"model: torchtitan's DeepSeek-V3 flavor at {code.commit} (MLA, shared experts as one FFN of "
             f"{model.moe.shared_width}, expert_bias balancing without an auxiliary loss)",
             "expert parallelism over the dp_shard ranks (torchtitan borrows ep from dp_shard): ep "
             f"{layout.ep}, dp {lay['dp']}; "
             + ("DeepEP dispatch and combine (expert_parallel_comm_backend deepep)" if deepep
                else "NCCL all-to-all dispatch (torchtitan's default EP path)"),
             ("routing exactly balanced (moe_load_factor 1): --debug.moe_force_load_balance" if "forced" in tech.lower()
              else "routing taken as balanced (moe_load_factor 1): the learned router's per-step imbalance is not published")]
    if "H100" in hw["gpu"] and "95.00 GiB" in hw["gpu"]:
        cluster = Cluster(spec=presets.clusters()["grand-teton-h100"], num_gpus=hw["gpu_count"])
        notes.append("95.00 GiB H100 = Meta's 96 GB Grand Teton H100 (grand-teton-h100 preset); its power limit is not stated")
    else:
        cluster = _cluster(entry)
        notes.append(f"network: the {cluster.spec.name} preset stands in for the cluster (interconnect not stated)")
    if layout.pp > 1:
        sizes = generated_split(model.num_layers, layout.pp, layout.vpp) or ()
        notes.append(f"{model.num_layers} layers split {'/'.join(map(str, sizes))} over the stages (torchtitan's default split points)")
    return model, cluster, training, layout, notes


def _torch_native_cluster(entry: dict) -> Cluster:
    hw = entry["hardware"]
    if entry["group"].startswith("kempnerforge"):
        # 4 H200 SXM per node wired to one another by NVLink without a switch, NDR 400 Gb/s
        # InfiniBand per GPU (KempnerForge reports; the preset's sources)
        return Cluster(spec=presets.clusters()["kempner-h200"], num_gpus=hw["gpu_count"])
    if "HBM2e" in (hw.get("gpu") or "") or "lower TDP" in (hw.get("gpu") or "") + str(hw.get("hw_notes")):
        return Cluster(spec=presets.clusters()["grand-teton-h100"], num_gpus=hw["gpu_count"])
    if "MI300X" in hw["gpu"]:  # one 8-GPU MI300X node (the torchao table: "Single-node training on 8xMI300X GPUs")
        return Cluster(spec=presets.clusters()["mi300x-8"], num_gpus=hw["gpu_count"])
    return _cluster(entry)


def _nanotron(entry: dict) -> Mapped:
    """nanotron's Ultra-Scale Playbook sweep: its own TP/PP/ZeRO-1 with fused kernels (flash-attn 2,
    fused norms, async TP linear communication), priced as Megatron's kernels."""
    lay, m = entry["layout"], entry["model"]
    notes = ["nanotron priced with Megatron's kernels (fused norms, flash-attn 2, async tensor-parallel linears)",
             "throughput: the tok/s/gpu the playbook's interactive sweep figure prints for the cell (yaml measured)",
             "gradients accumulated in fp32 outside the GEMMs (accumulate_grad_in_fp32): the 16-bit gradient "
             "added into the fp32 buffer per parameter and micro-batch (huggingface/nanotron@c2528430 "
             "src/nanotron/optim/gradient_accumulator.py:212-219, 333-341)"]
    zero = Zero.OPTIMIZER if "ZeRO-1" in (lay.get("zero") or "") else Zero.NONE
    # torch DDP wraps the model when dp > 1 unless fp32 accumulation runs with ZeRO-1
    # (huggingface/nanotron@c2528430 src/nanotron/trainer.py:786-788)
    ddp = lay["dp"] > 1 and zero is Zero.NONE
    notes.append("memory: every parameter's bf16 .grad held until each backward ends, nanotron's fp32 copy and "
                 "out-of-place shift in the cross entropy, eager SwiGLU's saved tensors, the [q|k|v] copy its "
                 "multi-head attention keeps whole, the reduce-scatter inputs the allocator holds while the host runs ahead"
                 + (", torch DDP's bf16 gradient buckets" if ddp else ""))
    training = TrainingSpec(seq_len=m["seq_len"], global_batch_size=lay["global_batch"], precision=Precision.BF16,
                            framework=Framework.MEGATRON, attention=AttentionKernel.FLASH, attention_backend=AttentionBackend.FA2,
                            grad_accumulation_fusion=False, grads_kept_through_backward=True, ddp_buckets=ddp,
                            loss_shift_out_of_place=True, eager_swiglu=True, qkv_copy_kept=True, tp_gather_buffers=True,
                            tp_scatter_inputs_pending=True, zero1_blocking_sync=zero is Zero.OPTIMIZER,
                            vocab_divisible_by=NANOTRON_VOCAB_DIVISOR)
    if zero is Zero.OPTIMIZER:
        notes.append("ZeRO-1: the fp32 gradients all-reduced after the backward and the bf16 parameters all-gathered "
                     "after the optimizer step, both blocking (huggingface/nanotron@c2528430 src/nanotron/trainer.py:509-518, "
                     "optim/gradient_accumulator.py:128-155, optim/zero.py:95-120, 217-241)")
    layout = _layout(entry, zero=zero, recompute=Recompute.NONE, schedule=Schedule.ONE_F_ONE_B if lay["pp"] > 1 else None)
    model = _llama_model(entry, tied=m["ffn_hidden"] < 10000)
    if lay["pp"] > 1:
        counts = nanotron_pp_layers(model, lay["pp"])
        stages = ["t" * n for n in counts]
        layout = layout.model_copy(update={"pp_layout": "|".join(["E" + stages[0], *stages[1:-1], stages[-1] + "L"])})
        notes.append(f"pipeline split by nanotron's compute costs (build_model): {counts} decoder layers per stage")
        output = nanotron_output_rank(model, lay["pp"])
        if output < lay["pp"] - 1:
            # the layout's L is the output layer with the loss, on the last stage: nanotron runs the output layer
            # on an earlier rank and only the fp32 cast and the loss after it, so the stages before it are exact
            # and the last stage carries both ranks' work
            notes.append(f"nanotron's output layer is on rank {output}, its fp32 cast and loss on the ranks after it; "
                         f"priced with the output layer on the last rank (the ranks before {output} as nanotron has them)")
    notes.append("cluster: Hugging Face's science cluster (AWS p5, EFA) with the playbook's own collective measurements "
                 "across nodes (presets/clusters.toml hf-science-p5)")
    return model, _nanotron_cluster(entry), training, layout, notes


def _nanotron_cluster(entry: dict) -> Cluster:
    """The cluster the Ultra-Scale Playbook sweep ran on: its figure's GPUs ("H100 80GB (HF
    'hopper-prod' cluster)", nanotron's SLURM partition) on the preset that carries that cluster's
    measured network (hf-science-p5's source)."""
    assert "hopper-prod" in entry["hardware"]["gpu"], entry["id"]
    return Cluster(spec=presets.clusters()["hf-science-p5"], num_gpus=entry["hardware"]["gpu_count"])


def nanotron_block_ranks(model: ModelSpec, pp: int) -> list[int]:
    """The pipeline rank of each of nanotron's Llama pipeline blocks, in model order: the embedding, the
    decoder layers, the final norm, the output layer, the fp32 cast and the loss (huggingface/nanotron@c2528430
    src/nanotron/models/llama.py:811-874, 991). A decoder layer costs 4·heads·d_head·h + 3·ffn·h, the output
    layer vocab·h, every other block 0 (llama.py:913-925 get_block_compute_costs); each block goes to the
    current rank, which moves on by one after a block whose running cost exceeds (rank + 1)/pp of the total
    (models/base.py:216-235 build_model): one rank at most per block, and never past the last, where the
    running cost would have to exceed the whole. So the output layer lands before the last rank where the
    decoder layers already pass its threshold; its running cost is then the whole, so each zero-cost block
    after it goes one rank further until the last rank, which takes the rest (1.34B over pp 8: the output
    layer on rank 6, the fp32 cast and the loss both on rank 7)."""
    h, heads = model.hidden_size, model.num_attention_heads
    layer = 4 * heads * (h // heads) * h + 3 * model.ffn_hidden_size * h
    costs = [0] + [layer] * model.num_layers + [0, model.vocab_size * h, 0, 0]
    total = sum(costs)
    ranks, rank, running = [], 0, 0
    for cost in costs:
        ranks.append(rank)
        running += cost
        if running > total * (rank + 1) / pp:
            rank += 1
    return ranks


def nanotron_pp_layers(model: ModelSpec, pp: int) -> list[int]:
    """Decoder layers per pipeline rank as nanotron places them (nanotron_block_ranks)."""
    ranks = nanotron_block_ranks(model, pp)[1:1 + model.num_layers]
    return [ranks.count(r) for r in range(pp)]


def nanotron_output_rank(model: ModelSpec, pp: int) -> int:
    """The pipeline rank nanotron places the output layer on (nanotron_block_ranks): the last one, or an
    earlier one whose successors hold only the fp32 cast and the loss."""
    return nanotron_block_ranks(model, pp)[model.num_layers + 2]


# Megatron --ddp-bucket-size of each MLPerf Llama-3.1 submission: the NeMo code passes its
# model.optim.bucket_size to DistributedDataParallelConfig(bucket_size=...) (mlcommons/
# training_results_v5.0@0fdc28f0 NVIDIA/benchmarks/llama31_405b/implementations/eos-dfw_n256_ngc25.01_nemo/
# pretrain.py:333,360; training_results_v5.1@441d65f4 NVIDIA/benchmarks/llama31_8b/implementations/nemo/
# pretrain.py:358,395 and Cisco/benchmarks/llama31_8b/implementations/nemo/pretrain.py:335,361), whose
# value is the BUCKET_SIZE of the run's config or custom.yaml's default. (id prefix, elements, where.)
MLPERF_BUCKET_SIZES = (
    # v5.0 405B: no config sets BUCKET_SIZE; custom.yaml:149 defaults it to 200 (every implementation
    # directory of NVIDIA, IBM+CoreWeave+NVIDIA and Nebius, training_results_v5.0@0fdc28f0)
    ("mlperf-v5.0-", 200, "v5.0 llama31_405b conf/custom.yaml:149"),
    # v5.1 405B (NVIDIA, University of Florida): custom.yaml:165 defaults it to 134217728 and the 405B
    # configs leave it (training_results_v5.1@441d65f4 NVIDIA/benchmarks/llama31_405b/implementations/
    # */conf/custom.yaml:165, University-of-Florida/benchmarks/llama31_405b/implementations/b200_nemo/conf/custom.yaml:165)
    ("mlperf-v5.1-nvidia-llama405b", 134_217_728, "v5.1 llama31_405b conf/custom.yaml:165"),
    ("mlperf-v5.1-uf-llama405b", 134_217_728, "v5.1 llama31_405b conf/custom.yaml:165"),
    # v5.1 8B: NVIDIA's and Oracle's config_common_8b.sh:19 export BUCKET_SIZE=768000000 (training_results_v5.1
    # @441d65f4 NVIDIA/benchmarks/llama31_8b/implementations/nemo/config_common_8b.sh:19, also
    # config_GB200_128x4x1xtp2pp1cp4_8b.sh:15; Oracle/benchmarks/llama31_8b/config_common_8b.sh:19)
    ("mlperf-v5.1-nvidia-llama8b", 768_000_000, "v5.1 llama31_8b config_common_8b.sh:19"),
    ("mlperf-v5.1-oracle-llama8b", 768_000_000, "v5.1 llama31_8b config_common_8b.sh:19"),
    # University of Florida's b200_nemo/config_common_8b.sh sets none: custom.yaml:165's 134217728
    ("mlperf-v5.1-uf-llama8b", 134_217_728, "v5.1 llama31_8b b200_nemo/conf/custom.yaml:165"),
    # Cisco's configs set none (their BUCKET_CAP_MB=125 is read by nothing): custom.yaml:157's 64
    # elements, below every parameter, so each parameter tensor is a bucket of its own
    # (Cisco/benchmarks/llama31_8b/implementations/nemo/conf/custom.yaml:157, config_common.sh,
    # config_DGXH100_8x8x1xtp1pp1cp1.sh:30 and config_DGXH100_16x8x1xtp2pp1cp1.sh:31)
    ("mlperf-v5.1-cisco-llama8b", 64, "Cisco llama31_8b conf/custom.yaml:157"),
)


# Apex DistributedFusedAdam's bucket_cap_mb of each MLPerf GPT-3 submission (TrainingSpec.apex_bucket_cap_mb):
# NeMo's optim.bucket_cap_mb, which the submission's yaml reads from BUCKET_CAP_MB. (id prefix, MiB, where.)
MLPERF_APEX_BUCKET_CAP_MB = (
    # v3.0 (NVIDIA and NVIDIA_CoreWeave): run_and_time.sh:85 defaults BUCKET_CAP_MB to 100 and hands it
    # over at :249 (megatron_gpt_config.yaml:224 says 100 too); no config sets it (training_results_v3.0
    # @63e326c4 NVIDIA/benchmarks/gpt3/implementations/pytorch/)
    ("mlperf-v3.0-", 100, "v3.0 gpt3 run_and_time.sh:85"),
    # v3.1 (NVIDIA, Azure+NVIDIA): conf/optim/distributed_fused_adam.yaml:2 defaults it to 100 and no
    # config sets it (training_results_v3.1@d06288b2 */benchmarks/gpt3/implementations/pytorch/)
    ("mlperf-v3.1-", 100, "v3.1 gpt3 conf/optim/distributed_fused_adam.yaml:2"),
    # v4.1 NVIDIA at 32 nodes: config_DGXH100_32x8x256x4x8_mbs2.sh:43 sets 125 ("Fix OOM") after sourcing
    # config_common.sh (training_results_v4.1@b87b9e39 NVIDIA/benchmarks/gpt3/implementations/eos_n32_ngc24.09_nemo/)
    ("mlperf-v4.1-nvidia-gpt3-dgxh100-32x8", 125, "v4.1 gpt3 eos_n32 config_DGXH100_32x8x256x4x8_mbs2.sh:43"),
    # v4.0 (NVIDIA, SMC): config_common.sh:69 exports 200 (training_results_v4.0@6fe95437
    # {NVIDIA,smc}/benchmarks/gpt3/implementations/nemo/config_common.sh:69); v4.1 (NVIDIA's other
    # directories, Oracle): config_common.sh:61 (b200_n8_preview_nemo :64) exports 200
    ("mlperf-v4.0-", 200, "v4.0 gpt3 nemo/config_common.sh:69"),
    ("mlperf-v4.1-", 200, "v4.1 gpt3 config_common.sh:61"),
)


# The row-parallel GEMMs whose forward reduce-scatter each submission's tp_overlap yaml runs as
# Transformer Engine's ring exchange (TrainingSpec.ub_ring_exchange_rs; the rest "pipeline"). NeMo
# picks the yaml ${GPU_ARCH}tp${TP}mbs${MBS} (custom.yaml:3), GPU_ARCH defaulting to h100; no config sets
# FC2_FPROP_METHOD, so fc2_fprop keeps the yaml's default. (id prefix, GEMMs, where.)
MLPERF_UB_RING_EXCHANGE_RS = (
    # GPT-3 v4.1, NVIDIA (H100 and the B200 preview, GPU_ARCH unset): h100tp4mbs2.yaml proj_fprop
    # pipeline (L51-52), fc2_fprop ring_exchange (L60-61) (training_results_v4.1@b87b9e39
    # NVIDIA/benchmarks/gpt3/implementations/{eos_n32,eos_n64,b200_n8_preview}_*/conf/tp_overlap/)
    ("mlperf-v4.1-nvidia-gpt3", frozenset({"fc2"}), "v4.1 gpt3 tp_overlap/h100tp4mbs2.yaml:51-61"),
    # Llama 3.1 405B v5.0 on H100 at tp 8: h100tp8mbs1.yaml ring_exchange for both (L42-47)
    # (training_results_v5.0@0fdc28f0 NVIDIA/benchmarks/llama31_405b/implementations/eos-dfw_*/conf/tp_overlap/)
    ("mlperf-v5.0-nvidia-llama405b-hgxh100", frozenset({"proj", "fc2"}), "v5.0 405b tp_overlap/h100tp8mbs1.yaml:42-47"),
    # v5.0 at tp 4 (NVIDIA's and IBM+CoreWeave's GB200, Nebius's H200; GPU_ARCH unset): h100tp4mbs1.yaml
    # proj_fprop pipeline (L51-52), fc2_fprop ring_exchange (L60-61)
    ("mlperf-v5.0-", frozenset({"fc2"}), "v5.0 405b tp_overlap/h100tp4mbs1.yaml:51-61"),
    # v5.1 NVIDIA (config_common.sh:99 GPU_ARCH=gb200): gb200tp4mbs1.yaml and, for the 8B, gb200tp2mbs1.yaml
    # ring_exchange for both (L49-57) (training_results_v5.1@441d65f4 NVIDIA/benchmarks/llama31_405b/
    # implementations/*/conf/tp_overlap/gb200tp4mbs1.yaml, llama31_8b/implementations/nemo/conf/tp_overlap/gb200tp2mbs1.yaml)
    ("mlperf-v5.1-nvidia-", frozenset({"proj", "fc2"}), "v5.1 tp_overlap/gb200tp{2,4}mbs1.yaml:49-57"),
    # University of Florida's 405B (GPU_ARCH unset): b200_nemo/conf/tp_overlap/h100tp4mbs1.yaml L51-61
    ("mlperf-v5.1-uf-llama405b", frozenset({"fc2"}), "v5.1 UF 405b tp_overlap/h100tp4mbs1.yaml:51-61"),
)

# Submissions whose code never turns Transformer Engine's userbuffers TP overlap on, whatever their
# TP_COMM_OVERLAP says: NeMo 2 sets tp_comm_overlap only through MegatronCommOverlapCallback, which
# pretrain.py's get_overlap_callback builds and main() appends (training_results_v5.1@441d65f4
# NVIDIA/benchmarks/llama31_8b/implementations/nemo/pretrain.py:470-540, appended at :666); Cisco's
# copy has the append commented out (Cisco/benchmarks/llama31_8b/implementations/nemo/pretrain.py:436-526,
# :632 "# trainer.callbacks.append(get_overlap_callback(cfg))") and sets tp_comm_overlap nowhere else,
# so the model config keeps Megatron's default tp_comm_overlap=False (Megatron-LM@d98e8a64
# megatron/core/model_parallel_config.py:265): the tp collectives run as plain NCCL calls. (id prefix, where.)
MLPERF_NO_TP_OVERLAP = (
    ("mlperf-v5.1-cisco-llama8b", "Cisco llama31_8b pretrain.py:632, the overlap callback's append commented out"),
)


# Per-communicator NCCL CTA caps the submission's code applies (TrainingSpec.nccl_max_ctas): its
# config_common.sh points NCCL_CFG_PATH at conf/nccl/custom_communicator_cta.yaml, whose dp, dp_cp and tp
# groups get max_ctas 8, pp 2 and cp 1 (L3-22), and its NeMo 1 launcher hands that path to Megatron's
# initialize_model_parallel (megatron_gpt_pretraining_custom.py nccl_communicator_config_path=), with no
# NCCL_MAX_CTAS in the environment to replace the caps. The NeMo 2 Llama-3.1 code does not: v5.0's
# pretrain.py never passes the path (training_results_v5.0@0fdc28f0 NVIDIA/benchmarks/llama31_405b/
# implementations/*/pretrain.py, and Cisco's v5.1 copy), and v5.1's does but config_common.sh exports
# NCCL_MIN_CTAS=16 and NCCL_MAX_CTAS=32 (training_results_v5.1@441d65f4 NVIDIA/benchmarks/llama31_8b/
# implementations/nemo/config_common.sh:85-86, University-of-Florida/.../b200_nemo/config_common.sh:85-86),
# which replace every communicator's. Oracle's v4.1 GPT-3 sets NCCL_CFG_PATH but its directory holds no
# such yaml, so its caps are not known. (id prefix, caps, where.)
MLPERF_CTA_CAPS = NcclCtas(dp=8, tp=8, cp=1, pp=2)
MLPERF_NCCL_CTAS = (
    # training_results_v4.0@6fe95437 NVIDIA/benchmarks/gpt3/implementations/nemo/config_common.sh:58,
    # conf/nccl/custom_communicator_cta.yaml:3-22, megatron_gpt_pretraining_custom.py:106 (the eos_* result
    # directories' code); smc/benchmarks/gpt3/implementations/nemo/ the same files
    ("mlperf-v4.0-nvidia-gpt3", MLPERF_CTA_CAPS, "v4.0 gpt3 nemo/conf/nccl/custom_communicator_cta.yaml:3-22"),
    ("mlperf-v4.0-smc-gpt3", MLPERF_CTA_CAPS, "v4.0 SMC gpt3 nemo/conf/nccl/custom_communicator_cta.yaml:3-22"),
    # training_results_v4.1@b87b9e39 NVIDIA/benchmarks/gpt3/implementations/{eos_n32,eos_n64}_ngc24.09_nemo
    # and b200_n8_preview_nemo: config_common.sh:50-53, conf/nccl/custom_communicator_cta.yaml:3-22,
    # megatron_gpt_pretraining_custom.py:83
    ("mlperf-v4.1-nvidia-gpt3", MLPERF_CTA_CAPS, "v4.1 gpt3 conf/nccl/custom_communicator_cta.yaml:3-22"),
)


# NeMo 2 Llama-3.1 8B submissions whose config turns on fp8 parameters (TrainingSpec.fp8_param_gather)
# without their techniques line saying so: config_common.sh:73 exports FP8_PARAM_GATHER=True, which
# conf/custom.yaml:166 reads into model.optim.fp8_param_gather and pretrain.py hands to both
# MegatronMixedPrecision and DistributedDataParallelConfig (pretrain.py:203, 273, 359, 397), and no 8B
# config turns it off (only config_common_fp4.sh:4 does) (training_results_v5.1@441d65f4
# NVIDIA/benchmarks/llama31_8b/implementations/nemo/, Oracle/benchmarks/llama31_8b/,
# University-of-Florida/benchmarks/llama31_8b/implementations/b200_nemo/). (id prefix, where.)
MLPERF_FP8_PARAM_GATHER = (
    ("mlperf-v5.1-nvidia-llama8b", "v5.1 llama31_8b nemo/config_common.sh:73"),
    ("mlperf-v5.1-oracle-llama8b", "v5.1 Oracle llama31_8b config_common.sh:73"),
    ("mlperf-v5.1-uf-llama8b", "v5.1 UF llama31_8b b200_nemo/config_common.sh:73"),
)


# Submissions whose Megatron linears quantise with Transformer Engine's current scaling
# (Fp8Recipe.TENSORWISE): config_common.sh exports FP8_RECIPE="tensorwise", which conf/custom.yaml
# reads into model.fp8_recipe and pretrain.py hands to MegatronMixedPrecision (training_results_v5.1@441d65f4
# NVIDIA/benchmarks/llama31_8b/implementations/nemo/config_common.sh:91, conf/custom.yaml:117,
# pretrain.py:204,270; the same line in NVIDIA/benchmarks/llama31_405b/implementations/*/config_common.sh:91,
# Oracle/benchmarks/llama31_8b/config_common.sh:91, University-of-Florida/benchmarks/llama31_{8b,405b}/
# implementations/b200_nemo/config_common.sh:91). The other submissions run delayed scaling
# (Fp8Recipe.DELAYED): the v5.0 Llama-3.1 code and Cisco's v5.1 copy leave custom.yaml's default,
# fp8_recipe delayed (training_results_v5.0@0fdc28f0 .../llama31_405b/implementations/*/conf/custom.yaml:108-109;
# v5.1 Cisco/benchmarks/llama31_8b/implementations/nemo/conf/custom.yaml:116), and the GPT-3 NeMo 1
# code builds recipe.DelayedScaling (training_results_v4.0@6fe95437 NVIDIA/benchmarks/gpt3/implementations/
# nemo/custom_callbacks.py:210; v4.1@b87b9e39 the same file :208), as every run before Transformer
# Engine 2.2 must: Megatron builds Float8CurrentScaling only from it on (Megatron-LM@d98e8a64
# megatron/core/fp8_utils.py:777). (id prefix, where.)
MLPERF_CURRENT_SCALING = (
    ("mlperf-v5.1-nvidia-llama", "v5.1 NVIDIA llama31 config_common.sh:91"),
    ("mlperf-v5.1-oracle-llama8b", "v5.1 Oracle llama31_8b config_common.sh:91"),
    ("mlperf-v5.1-uf-llama", "v5.1 UF llama31 b200_nemo/config_common.sh:91"),
)


# NeMo 2 submissions whose DDP config keeps align_param_gather on without the interleaved schedule
# (TrainingSpec.align_param_gather): config_common.sh exports ALIGN_PARAM_GATHER=True and pretrain.py
# hands it to DistributedDataParallelConfig (Cisco/benchmarks/llama31_8b/implementations/nemo/
# config_common.sh:56, pretrain.py:333,359), the 8B configs at pp 1 sourcing no config_common_8b.sh to
# turn it off; NVIDIA's, Oracle's and University of Florida's 8B configs do (config_common_8b.sh:13
# ALIGN_PARAM_GATHER=False in each, training_results_v5.1@441d65f4). (id prefix, where.)
MLPERF_ALIGN_PARAM_GATHER = (
    ("mlperf-v5.1-cisco-llama8b", "Cisco llama31_8b config_common.sh:56, pretrain.py:333,359"),
)


# Submissions that run Transformer Engine's fp8 dot-product attention (TrainingSpec.fp8_attention): the
# config sources config_common_fp8attn.sh, whose FP8_DPA=True conf/custom.yaml:127 reads into
# model.fp8_dot_product_attention and pretrain.py:254,280 hands to the model config and
# MegatronMixedPrecision; with the NVFP4 linears config_common_fp4.sh:15 exports
# NVTE_DPA_FP8_RECIPE=Float8CurrentScaling (training_results_v5.1@441d65f4 NVIDIA/benchmarks/llama31_8b/
# implementations/nemo/). No other mapped row does: NVIDIA's other v5.1 configs, Oracle's 8x8 and
# University of Florida's hpg.dgxb200x8 ones source no config_common_fp8attn.sh and config_common.sh sets
# no FP8_DPA (custom.yaml's default False); Cisco's 8B code reads no FP8_DPA; the v5.0 Llama 3.1 405B and the
# v3.0-v4.1 GPT-3 code has no fp8_dot_product_attention setting at all (training_results_v5.0@0fdc28f0,
# v4.1@b87b9e39, v4.0@6fe95437, v3.1@d06288b2, v3.0@63e326c4: no FP8_DPA or fp8_dot_product_attention in
# their gpt3 / llama31_405b configs). (id prefix, where.)
MLPERF_FP8_ATTENTION = (
    ("mlperf-v5.1-nvidia-llama8b-gb200-2x4", "v5.1 llama31_8b nemo/config_GB200_2x4x2xtp1pp1cp1_8b_fp4.sh:5, config_common_fp8attn.sh:1"),
    ("mlperf-v5.1-nvidia-llama8b-gb300-2x4", "v5.1 llama31_8b nemo/config_GB300_2x4x2xtp1pp1cp1_8b_fp4.sh:5, config_common_fp8attn.sh:1"),
)

# Transformer Engine's delayed-scaling amax all-reduce the compute stream waits for
# (TrainingSpec.te_amax_reduction, which cites the TE, NeMo, Apex and Megatron code), by the TE each
# GPT-3 submission builds. v3.0 (NVIDIA and NVIDIA_CoreWeave): TE release_v0.8 and NeMo v1.17.0_pt_23.04
# (Dockerfile:47, 56), FP8_REDUCE_AMAX=True (config_fp8.sh:6, run_and_time.sh:264) and neither
# NVTE_DP_AMAX_REDUCE_INTERVAL nor NVTE_ASYNC_AMAX_REDUCTION set anywhere in the implementation, so TE's
# defaults: every reduction over the tp x dp group, synchronous (training_results_v3.0@63e326c4
# {NVIDIA,NVIDIA_CoreWeave}/benchmarks/gpt3/implementations/pytorch/). v3.1 (NVIDIA, Azure+NVIDIA): TE
# 09ba8427 / 4ee8e8ec (Dockerfile:63, :64) with NVTE_DP_AMAX_REDUCE_INTERVAL=0 and NVTE_ASYNC_AMAX_REDUCTION=1
# ("AMAX AR overlap and disable DP", NVIDIA config_common.sh:48-50, Azure+NVIDIA config_common.sh:24-25,
# training_results_v3.1@d06288b2): tp only and waited for a chunk later, so none here. v4.0 (NVIDIA, smc):
# TE v1.6rc1 = 9e4091e7 (NVIDIA nemo/Dockerfile:47, smc :52), Megatron core_v0.7.0.beta / core_r0.7.0.beta
# (:87, :92) with mcore_gpt: True (conf/custom.yaml:39): synchronous over tp, the NVTE_* variables that
# config_common.sh:51-52 still exports no longer read (training_results_v4.0@6fe95437). v4.1 (NVIDIA,
# Oracle): PyTorch NGC 24.09's TE, NeMo and Megatron 24.09-alpha.rc0 (eos_n64_ngc24.09_nemo/Dockerfile:22,
# 49, 56, 73; Oracle DGXH100_*/Dockerfile the same lines) with mcore_gpt: True (conf/custom.yaml:40) and
# FP8_REDUCE_AMAX=True (config_fp8.sh:6): Megatron's block autocast over get_amax_reduction_group(
# with_context_parallel=True), tp x cp (Megatron-LM@dd182053 transformer_block.py:404-413,
# parallel_state.py:971-977), synchronous in TE 1.9 to 2.x (TrainingSpec.te_amax_reduction); B200's
# per-layer CUDA graphs (config_DGXB200_8x8x1024x4x8_mbs2_cg.sh:28) leave both reductions outside the
# graphs (TransformerEngine@e79d915a = v1.9 transformer_engine/pytorch/graph.py:316, 340, 398)
# (training_results_v4.1@b87b9e39). v5.0 Llama 3.1 405B on H100 and H200 (NVIDIA eos-dfw, Nebius):
# NGC 25.01's TE, NeMo v2.2.0, Megatron core_r0.11.0 (eos-dfw_n64_ngc25.01_nemo/Dockerfile:22, 58, 73, 103),
# reduce_amax and tp_only_amax_red left True (conf/custom.yaml:112-113, pretrain.py:238; no config sets
# FP8_REDUCE_AMAX or TP_ONLY_AMAX_RED), so tp x cp (Megatron-LM@7c00175e transformer_block.py:506-528,
# parallel_state.py:1241-1253), no CUDA graph (MCORE_CUDA_GRAPH and LAYER_CUDA_GRAPH unset, custom.yaml:73,
# 81) (training_results_v5.0@0fdc28f0). The v5.0 GB200 submissions (NVIDIA tyche, IBM+CoreWeave carina)
# source config_common_cg.sh, FULL_CUDA_GRAPH=True (the copies under tyche_ngpu512 and carina_*;
# tyche_ngpu256's config sources one its directory does not publish): the whole step captured in one
# CUDA graph, where TE 2.2.1 skips the backward reduction (module/linear.py:707) and the forward one
# replays inside the graph, not this mechanism: none (their tp x cp of 8 GPUs is one NVLink domain).
# v5.1 Cisco: TE v2.5, NeMo v2.4.0, Megatron core_v0.13.1 (Cisco/benchmarks/llama31_8b/implementations/
# nemo/Dockerfile:65, 80, 110), tp_only_amax_red True (conf/custom.yaml:121, pretrain.py:238), no CUDA
# graph (config_DGXH100_*.sh MCORE_CUDA_GRAPH=False): tp x cp (Megatron-LM@ea651a3b fp8_utils.py:475-477),
# one GPU at tp 1 and cp 1, where TE skips the collective (v2.2.1 fp8.py:356-361)
# (training_results_v5.1@441d65f4). v5.1 NVIDIA, Oracle and University of Florida: current scaling or
# NVFP4, no amax buffer (none). (id prefix, group, where.)
MLPERF_TE_AMAX_REDUCTION = (
    ("mlperf-v3.0-", AmaxGroup.TP_DP, "TE release_v0.8 defaults, v3.0 gpt3 Dockerfile:47, config_fp8.sh:6"),
    ("mlperf-v4.0-", AmaxGroup.TP, "TE v1.6rc1 under Megatron core 0.7, v4.0 gpt3 nemo/Dockerfile:47, conf/custom.yaml:39"),
    ("mlperf-v4.1-", AmaxGroup.TP_CP, "Megatron 24.09-alpha.rc0, v4.1 gpt3 Dockerfile:73, conf/custom.yaml:40"),
    ("mlperf-v5.0-nvidia-llama405b-hgxh100-", AmaxGroup.TP_CP,
     "tp_only_amax_red, v5.0 llama31_405b eos-dfw conf/custom.yaml:113, Dockerfile:103"),
    ("mlperf-v5.0-nebius-llama405b-h200-", AmaxGroup.TP_CP,
     "tp_only_amax_red, v5.0 Nebius llama31_405b conf/custom.yaml:113, Dockerfile:103"),
    ("mlperf-v5.1-cisco-", AmaxGroup.TP_CP, "tp_only_amax_red, v5.1 Cisco llama31_8b conf/custom.yaml:121, Dockerfile:110"),
)


def mlperf_setting(table: tuple[tuple, ...], run_id: str) -> tuple | None:
    """The row of an MLPERF_* table (id prefix, values..., where) whose prefix the submission's id
    starts with, first match first, less the prefix; None where none does: for MLPERF_BUCKET_SIZES,
    GPT-3's NeMo 1 code, which runs Apex's DistributedFusedAdam, not Megatron's DDP, whose per-layer
    buckets no bucket size changes (TrainingSpec.apex_distributed_adam); for
    MLPERF_UB_RING_EXCHANGE_RS, where no tp_overlap yaml was read (GPT-3 before v4.1, Oracle's):
    TE's default, pipeline."""
    return next((row[1:] for row in table if run_id.startswith(row[0])), None)


def _mlperf(entry: dict) -> Mapped:
    """MLPerf Training submissions running NVIDIA's NeMo / Megatron-core code with Transformer Engine."""
    lay, m, hw = entry["layout"], entry["model"], entry["hardware"]
    prec = hw["precision"] or ""
    # NVFP4 (v5.1 NVIDIA GB200 and GB300 configs *_fp4.sh, all sourcing one config_common_fp4.sh per
    # implementation): config_common_fp4.sh sets FP4=True, FP4_RECIPE=nvfp4, FP8=False,
    # FP8_PARAM_GATHER=False, TP_COMM_OVERLAP=False and NVTE_NVFP4_DISABLE_RHT=1 (also stochastic
    # rounding and 2D quantisation off), and pretrain.py hands fp4="e2m1" and fp4_recipe to
    # MegatronMixedPrecision (training_results_v5.1@441d65f4 NVIDIA/benchmarks/llama31_405b/implementations/
    # tyche_ngpu512_ngc25.09_nemo/config_common_fp4.sh:1-12, pretrain.py:205-209,260-280, conf/custom.yaml:120-126,
    # FIRST_LAST_LAYERS_BF16 left False: every layer in NVFP4; llama31_8b/implementations/nemo/config_common_fp4.sh:1-12)
    fp4 = "FP4" in prec.upper()
    notes = ["Megatron-core with Transformer Engine: cuDNN fused attention, "
             + ("NVFP4 GEMMs without the Hadamard transform (the submission's config_common_fp4.sh)" if fp4
                else "fp8 tensorwise scales"),
             "CUDA graphs and the submission's NCCL tuning other than its per-communicator CTA caps are not modelled"]
    gpt3 = m["layers"] == 96  # the GPT-3 175B benchmark; the others are the Llama-3.1 ones
    if gpt3:
        model = _gpt_model(entry, vocab=m["vocab"], tied=True)
        notes.append("GPT-3 175B as the benchmark configures it: LayerNorm, biases, learned positions, GELU, tied embeddings")
    else:
        model = _llama_model(entry)
    tech = lay.get("techniques") or ""
    overlap = "TP comm overlap" in tech and "not enabled" not in tech and not fp4  # config_common_fp4.sh:7
    unregistered = mlperf_setting(MLPERF_NO_TP_OVERLAP, entry["id"])
    if overlap and unregistered and lay["tp"] > 1:
        notes.append(f"TP comm overlap off: the config asks for it but the code never enables it ({unregistered[0]})")
    overlap = overlap and not unregistered
    # FP8_PARAMS (v4.x GPT-3, v5.0 H100/H200 405B custom.yaml optim.fp8_params) or FP8_PARAM_GATHER (v5.0
    # GB200 and v5.1 405B: training_results_v5.0@0fdc28f0 NVIDIA/benchmarks/llama31_405b/implementations/
    # tyche_ngpu256_ngc25.04_nemo/config_common.sh:69, conf/custom.yaml:150 optim.fp8_param_gather, pretrain.py:193,249,353)
    fp8_params = (any(s in tech for s in ("FP8_PARAMS", "FP8 params", "FP8 param gather"))
                  or mlperf_setting(MLPERF_FP8_PARAM_GATHER, entry["id"]) is not None) and not fp4  # config_common_fp4.sh:4
    if fp8_params:
        notes.append("fp8 parameters (the submission's FP8_PARAMS: --fp8-param-gather)")
    # The Llama-3.1 benchmarks' NeMo 2 code keeps gradients in bf16: MegatronMixedPrecision and
    # DistributedDataParallelConfig with grad_reduce_in_fp32=False (mlcommons/training_results_v5.0@0fdc28f0
    # NVIDIA/benchmarks/llama31_405b/implementations/eos-dfw_n256_ngc25.01_nemo/pretrain.py:252,355;
    # training_results_v5.1@441d65f4 NVIDIA/benchmarks/llama31_8b/implementations/nemo/pretrain.py and
    # Cisco/benchmarks/llama31_8b/implementations/nemo/pretrain.py:254,356). GPT-3's NeMo 1 code runs Apex's
    # DistributedFusedAdam with contiguous_grad_buffer: True and grad_sync_dtype: bf16 in every NVIDIA-code
    # submission (training_results_v3.0@63e326c4 NVIDIA/benchmarks/gpt3/implementations/pytorch/conf/
    # megatron_gpt_config.yaml L222-228; v3.1@d06288b2, v4.0@6fe95437 and v4.1@b87b9e39
    # .../gpt3/implementations/*/conf/optim/distributed_fused_adam.yaml L5-8), and that optimizer allocates
    # its contiguous gradient buffer in grad_sync_dtype (NVIDIA/apex@d571f3ee
    # apex/contrib/optimizers/distributed_fused_adam.py `_init_grad_buffer`).
    if gpt3:
        notes.append("gradients kept and reduced in bf16 (Apex DistributedFusedAdam, grad_sync_dtype: bf16)")
        notes.append("Apex DistributedFusedAdam's per-layer buckets (NeMo's distributed_adam_buckets), on every pipeline rank")
    else:
        notes.append("gradients kept and reduced in bf16 (the NeMo code's grad_reduce_in_fp32=False)")
    bf16_grads = True
    bucket = mlperf_setting(MLPERF_BUCKET_SIZES, entry["id"])
    if bucket:
        notes.append(f"DDP gradient buckets of {bucket[0]:,} parameters ({bucket[1]})")
    ring = mlperf_setting(MLPERF_UB_RING_EXCHANGE_RS, entry["id"]) if overlap and lay["tp"] > 1 else None
    if ring:
        notes.append(f"forward reduce-scatter of {' and '.join(sorted(ring[0]))} by TE ring exchange ({ring[1]})")
    align = mlperf_setting(MLPERF_ALIGN_PARAM_GATHER, entry["id"])
    if align and not (lay["pp"] > 1 and (lay.get("vpp") or 1) > 1):
        notes.append(f"parameter all-gathers in series with the forward: align_param_gather without interleaving ({align[0]})")
    apex_cap = mlperf_setting(MLPERF_APEX_BUCKET_CAP_MB, entry["id"]) if gpt3 else None
    if apex_cap:
        notes.append(f"Apex DistributedFusedAdam buckets of {apex_cap[0]} MiB, each its own collective ({apex_cap[1]})")
    ctas = mlperf_setting(MLPERF_NCCL_CTAS, entry["id"])
    if ctas:
        notes.append(f"NCCL CTAs per communicator capped (dp {ctas[0].dp}, tp {ctas[0].tp}, cp {ctas[0].cp}, pp {ctas[0].pp}; {ctas[1]})")
    current = mlperf_setting(MLPERF_CURRENT_SCALING, entry["id"])
    if not fp4:
        notes.append(f"fp8 current scaling ({current[0]})" if current else "fp8 delayed scaling")
    fp8_attention = mlperf_setting(MLPERF_FP8_ATTENTION, entry["id"])
    if fp8_attention:
        notes.append(f"fp8 dot-product attention, current scaling, 16-bit output ({fp8_attention[0]})")
    amax = mlperf_setting(MLPERF_TE_AMAX_REDUCTION, entry["id"])
    if amax:
        notes.append(f"Transformer Engine's amax all-reduce over {amax[0]} after each model chunk's forward and backward, "
                     f"waited on ({amax[1]})")
    training = TrainingSpec(seq_len=m["seq_len"], global_batch_size=lay["global_batch"],
                            precision=Precision.FP4 if fp4 else Precision.FP8, nvfp4_disable_rht=fp4,
                            fp8_recipe=Fp8Recipe.TENSORWISE if current or fp4 else Fp8Recipe.DELAYED,
                            framework=Framework.MEGATRON, attention=AttentionKernel.FLASH,
                            attention_backend=AttentionBackend.CUDNN, tp_comm_overlap=overlap and lay["tp"] > 1,
                            fp8_param_gather=fp8_params, grad_reduce_in_bf16=bf16_grads,
                            ddp_bucket_size=bucket[0] if bucket else None, apex_distributed_adam=gpt3,
                            **({"apex_bucket_cap_mb": apex_cap[0]} if apex_cap else {}),
                            ub_ring_exchange_rs=ring[0] if ring else frozenset(), nccl_max_ctas=ctas[0] if ctas else None,
                            align_param_gather=align is not None, vocab_divisible_by=MEGATRON_RUNS_VOCAB_DIVISOR,
                            fp8_attention=fp8_attention is not None,
                            te_amax_reduction=amax[0] if amax else AmaxGroup.NONE)
    first = last = None
    accounted = m["layers"] == 126 and lay["pp"] > 1 and ("account_for_embedding" in tech or "ASYM_PP_EMBED" in tech)
    if accounted:
        notes.append("embedding and loss counted as pipeline layers (the submission's ASYM_PP_EMBED/ASYM_PP_LOSS: "
                     "--account-for-embedding/loss-in-pipeline-split)")
    layout = _layout(entry, zero=Zero.OPTIMIZER, recompute=Recompute.NONE,
                     schedule=(Schedule.INTERLEAVED if (lay.get("vpp") or 1) > 1 else Schedule.ONE_F_ONE_B) if lay["pp"] > 1 else None,
                     first=first, last=last)
    if accounted:
        layout = layout.model_copy(update=dict(account_for_embedding=True, account_for_loss=True))
    if "Oracle" in entry["source"]["title"] or "oracle" in entry["id"]:
        notes.append("network: the dgx-h100 preset stands in for Oracle's RoCEv2 fabric (per-GPU rate not stated)")
    return model, _cluster(entry), training, layout, notes


def _not_mapped(reason: str):
    def skip(entry: dict) -> Mapped:
        raise Skip(reason)
    return skip


MAPPINGS = {"narayanan2021": _megatron_papers, "korthikanti2022": _megatron_papers, "torchtitan": _torchtitan,
            "mpt": _mpt, "fp8lm": _fp8lm, "zerobubble": _sail_pipeline, "vocabpar": _sail_pipeline,
            "torchtitan_docs_2024": _torch_native, "torchao_torchtitan_bench": _torch_native,
            "kempnerforge_mfu_scaling": _torch_native, "kempnerforge_config_validation": _torch_native,
            "nanotron_ultrascale": _nanotron,
            "neox20b": _not_mapped("the paper's 117 TFLOP/s has no stated FLOP convention, so no throughput follows from it"),
            "megatron_readme_gpt3ex": _megatron_papers,
            "olmo_core_readme": _not_mapped("the README table does not give the GPU count (8 is inferred from a launch default)"),
            "tinyllama_litgpt": _not_mapped("the README does not say on how many GPUs the 24k tokens/s was measured"),
            **{g: _mlperf for g in ("mlperf", "mlperf_coreweave", "mlperf_azure", "mlperf_smc", "mlperf_oracle",
                                    "mlperf_ibm_coreweave", "mlperf_nebius", "mlperf_uf", "mlperf_cisco")},
            **{g: _torchtitan_dsv3 for g in DSV3_CODE},
            "torchao_moe_readme": _not_mapped("Llama 4 Scout's chunked-attention and no-rope layers are not expressible in ModelSpec")}


def tokens_from_flop_rate(entry: dict, model: ModelSpec, *, tp: int) -> tuple[float, str]:
    """tokens/s/GPU from the published TFLOP/s or MFU, by the source's own FLOP count (tp only sets
    Megatron's vocabulary padding)."""
    meas, m, s = entry["measured"], model, entry["model"]["seq_len"]
    dims = {"num_layers": m.num_layers, "hidden_size": m.hidden_size, "vocab_size": m.vocab_size, "seq_len": s}
    if entry["group"] == "narayanan2021" and meas.get("tflops_per_gpu"):
        per_token = narayanan_flop_per_token(**dims)
        return tokens_from_flops(meas["tflops_per_gpu"], per_token), "tflops_per_gpu / Narayanan eq.(3) FLOPs per token (recompute counted)"
    if entry["group"] == "korthikanti2022" and meas.get("mfu"):
        tflops = meas["mfu"] * entry["hardware"]["peak_dense_tflops_used_for_mfu"]
        return tokens_from_flops(tflops, korthikanti_model_flop_per_token(**dims)), "mfu x 312 TFLOP/s / Korthikanti App. A model FLOPs per token"
    if entry["group"] == "vocabpar" and meas.get("mfu"):
        per_token = vocabpar_flop_per_token(num_layers=m.num_layers, hidden_size=m.hidden_size,
                                            ffn_hidden_size=m.ffn_hidden_size, vocab_size=m.vocab_size, seq_len=s)
        return tokens_from_flops(meas["mfu"] * 312, per_token), "mfu x 312 TFLOP/s / the authors' artifact FLOPs per token"
    if entry["group"] == "nanotron_ultrascale" and meas.get("mfu"):
        # the figure's MFU is in percent, over 989 TFLOP/s (H100 SXM bf16), by the count most of its
        # cells use (nanotron_figure_flop_per_token); every row also has its tok/s/gpu as printed.
        # Neither the playbook nor the nanotron that ran the sweep states the peak: nanotron@c2528430
        # logs model TFLOP/s and tok/s/gpu only (src/nanotron/helpers.py:588-611) and reads its MFU
        # from a csv made elsewhere (scripts/scaling_benchmarks.py:484). nanotron's own MFU log, added
        # later, divides by 989 (huggingface/nanotron@55488bd4 src/nanotron/helpers.py:857-872,
        # trainer.py:765-767); Hugging Face's nanotron benchmark harness by 1979 / 2 = 989.5
        # (huggingface/bench_cluster@f55b5e5e bench_cluster/report.py:232-255, 342). They differ by
        # 0.05%, inside the 0.3% to which tests/test_published.py recovers each cell's count
        # (NANOTRON_COUNT_TOLERANCE), so the figure does not tell them apart
        per_token = nanotron_figure_flop_per_token(m, seq_len=s)
        return tokens_from_flops(meas["mfu"] / 100 * 989, per_token), "mfu x 989 TFLOP/s / (nanotron get_flops + 6hV)"
    if entry["group"] == "mpt" and meas.get("mfu"):
        tflops = meas["mfu"] * entry["hardware"]["peak_dense_tflops_used_for_mfu"]
        per_token = mpt_flop_per_token(n_params=m.params_total, num_layers=m.num_layers, hidden_size=m.hidden_size, seq_len=s)
        return tokens_from_flops(tflops, per_token), "mfu x peak / llm-foundry MFU FLOPs per token"
    raise Skip(f"no FLOP convention to convert {meas.get('tflops_convention')!r}")


def _run(entry: dict) -> PublishedRun:
    if entry["group"] not in MAPPINGS:
        raise Skip(f"no mapping for group {entry['group']}")
    return _built(entry, MAPPINGS[entry["group"]](entry), timed=True)


def _built(entry: dict, mapped: Mapped, *, timed: bool) -> PublishedRun:
    """The run of a complete mapping; untimed (memory only), its measured rate is nan where none can be derived."""
    model, cluster, training, layout, notes = mapped
    try:
        job = resolve(model, cluster, training, layout)
    except SpecError as err:
        raise Skip(str(err)) from None
    memory_estimate(job)  # must not raise for any returned run
    # what the yaml itself inferred (dp = gpus/(tp·pp·cp) is arithmetic, not an assumption)
    notes = [*notes, *(f"{field} (yaml derived_fields)" for field in entry["derived_fields"] if not field.startswith("layout.dp"))]
    try:
        measured = _measured_tokens(entry, training.global_batch_size or 0, training.seq_len) or tokens_from_flop_rate(entry, model, tp=layout.tp)
    except Skip:
        if timed:
            raise
        measured = (float("nan"), "not derived: the row's step time is not compared")
    return PublishedRun(id=entry["id"], group=entry["group"], model=model, cluster=cluster, training=training, layout=layout,
                        measured_tokens_per_s_per_gpu=measured[0], measured_from=measured[1], assumptions=tuple(notes))


def entries(path: Path = DATA) -> list[dict[str, Any]]:
    """The yaml's entries, parsed once per file (entries() and entries(DATA) share one parse)."""
    return _parsed(path)


@cache
def _parsed(path: Path) -> list[dict[str, Any]]:
    """The C loader where PyYAML has it: 0.1 s instead of 0.8 s."""
    return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


class Loaded(NamedTuple):
    runs: list[PublishedRun]
    skipped: list[tuple[str, str]]  # (id, reason) of every non-hardware entry not turned into a run
    untimed: list[tuple[PublishedRun, str]]  # the skipped ones whose mapping raised TimeSkip, with its reason


def load_all(path: Path = DATA) -> Loaded:
    """Every entry mapped once: the runs, the skipped entries, and of those the runs whose step time the
    model cannot price but whose memory it can (TimeSkip)."""
    all_entries = entries(path)
    out = Loaded([], [], [])
    for entry in all_entries:
        if entry["kind"] == "hardware_spec":
            continue
        try:
            reason = _skip_reason(entry, all_entries)
            if reason:
                raise Skip(reason)
            out.runs.append(_run(entry))
        except TimeSkip as skip:
            out.skipped.append((entry["id"], str(skip)))
            try:
                out.untimed.append((_built(entry, skip.mapped, timed=False), str(skip)))
            except Skip:
                pass
        except Skip as skip:
            out.skipped.append((entry["id"], str(skip)))
    return out


def load(path: Path = DATA) -> tuple[list[PublishedRun], list[tuple[str, str]]]:
    """(runs, skipped) where skipped is [(id, reason)] for every non-hardware entry not turned into a run."""
    loaded = load_all(path)
    return loaded.runs, loaded.skipped


@cache
def memory_only(path: Path = DATA) -> tuple[tuple[PublishedRun, str], ...]:
    """(run, why its step time is not compared) of every entry whose mapping raised TimeSkip: the model
    cannot price its step time, but everything its memory depends on is mapped."""
    return tuple(load_all(path).untimed)


def main() -> int:
    runs, skipped = load()
    for group, n in Counter(r.group for r in runs).items():
        print(f"{group}: {n} runs")
    print(f"{len(runs)} runs; {len(skipped)} skipped:")
    for run_id, reason in skipped:
        print(f"  {run_id}: {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
