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
from typing import Any

import yaml

from cost_models.enums import (
    AttentionKernel,
    Fp8Recipe,
    Framework,
    MLPKind,
    NormKind,
    PositionKind,
    Precision,
    Recompute,
    Schedule,
    Zero,
)
from cost_models.errors import SpecError
from cost_models.hardware import Cluster
from cost_models.job import Job
from cost_models.layout import Layout
from cost_models.memory import memory_estimate
from cost_models.model_spec import ModelSpec
from cost_models.rules import resolve
from cost_models.training import TrainingSpec
from planner import presets

sys.path.insert(0, str(Path(__file__).parent))
from flop_conventions import (  # one function per source's FLOP count
    korthikanti_model_flop_per_token,
    mpt_flop_per_token,
    narayanan_flop_per_token,
    tokens_from_flops,
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
    vpp = 2 if interleaved else 1  # torchtitan 9dec370: two stages per rank for looped schedules
    if lay["micro_batch"]:
        mbs = lay["micro_batch"]
    else:
        # torchtitan 9dec370 pipeline_llama.py: n_microbatches defaults to pp x stages per rank
        mbs = lay["local_batch"] // (pp * vpp)
    rc = Recompute.FULL if lay["recompute"].startswith("full") else Recompute.SELECTIVE
    first = last = None
    if pp > 1 and num_layers % (pp * vpp):
        # 126 layers: the ends take fewer layers so the middle ranks split evenly (torchtitan's
        # split points also shorten the first and last stages).
        first, last = (15, 15) if vpp == 1 else (16, 14)
    return Layout(
        tp=tp, pp=pp, vpp=vpp, cp=cp, dp=dp, mbs=mbs, zero=Zero.PARAMETERS, recompute=rc,
        schedule=Schedule.INTERLEAVED if interleaved else (Schedule.ONE_F_ONE_B if pp > 1 else None),
        pp_first_stage_layers=first, pp_last_stage_layers=last,
    )


def torchtitan_training(row: dict) -> TrainingSpec:
    techniques = row["layout"].get("techniques") or ""
    float8 = "Float8" in techniques or "Float8" in (row["hardware"].get("precision") or "")
    # torchtitan compiled only the transformer blocks at the Dec 2024 commit (9dec370); from 2025 on
    # --training.compile also compiles the loss (TrainingSpec.compile_loss).
    compiled = "compile" in techniques
    return TrainingSpec(
        compile=compiled,
        compile_loss=compiled and not row["id"].startswith("torchtitan-2412"),
        seq_len=row["model"]["seq_len"],
        global_batch_size=row["layout"]["global_batch"],
        framework=Framework.TORCHTITAN,
        precision=Precision.FP8 if float8 else Precision.BF16,
        fp8_recipe=Fp8Recipe.ROWWISE if "rowwise" in (row["hardware"].get("precision") or "") else Fp8Recipe.TENSORWISE,
        tp_comm_overlap="AsyncTP" in techniques,
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
    for key, preset in (("GB200", "gb200-nvl72"), ("B200", "dgx-b200"), ("H200", "hgx-h200"), ("H100", "dgx-h100")):
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
    if "fsdp (size" in t:  # Megatron FSDP shards parameters, gradients and optimizer states
        return Zero.PARAMETERS
    if "distributed optimizer" in t:
        return Zero.OPTIMIZER
    if t.startswith("none"):
        return Zero.NONE
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
    if "MLA" in (m.get("arch_notes") or "") and m["name"].startswith("DeepSeek"):
        return "DeepSeek-V3 uses multi-head latent attention (MLA), which ModelSpec cannot express"
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
    if not any(meas.get(k) for k in ("tokens_per_s_per_gpu", "step_time_s", "tflops_per_gpu", "mfu")):
        return "no throughput measured"
    if "microbatch-level" in (lay.get("recompute") or ""):
        return ("recompute 'selective + microbatch-level skip of checkpointing' (Korthikanti 2022 App. C) is not "
                "expressible; the same layout without it is the korthikanti2022-t5 seqpar_selective run")
    return None


def _measured_tokens(entry: dict, gbs: int, seq_len: int) -> tuple[float, str] | None:
    """A measured tokens/s/GPU or step time, preferred over any FLOP-rate conversion."""
    meas, gpus = entry["measured"], entry["hardware"]["gpu_count"]
    if meas.get("tokens_per_s_per_gpu"):
        return float(meas["tokens_per_s_per_gpu"]), "tokens_per_s_per_gpu: as published"
    if meas.get("step_time_s"):
        return gbs * seq_len / meas["step_time_s"] / gpus, "step_time_s: tokens = gbs*seq/step/gpus"
    return None


# --- per-source mappings ---------------------------------------------------------------------------

Mapped = tuple[ModelSpec, Cluster, TrainingSpec, Layout, list[str]]


def _megatron_papers(entry: dict) -> Mapped:
    """narayanan2021 and korthikanti2022: Megatron-LM on Selene (DGX A100 80GB)."""
    lay, m = entry["layout"], entry["model"]
    name, model = _preset_model(entry)
    notes = [f"model = preset {name} (Megatron-LM defaults: 4h GELU MLP, biases, tied embeddings, learned positions, dropout 0.1)",
             "attention kernel eager: 2021-22 Megatron-LM had no fused flash attention"]
    if "--fp16" not in (entry["hardware"].get("precision") or ""):
        notes.append("precision fp16: the paper says 'mixed precision'; the 2021-22 Megatron A100 run scripts use --fp16")
    zero3 = "ZeRO-3" in lay["zero"]
    if zero3:  # Narayanan Table 2: DeepSpeed ZeRO-3 without model parallelism
        framework, zero = Framework.DEEPSPEED, Zero.PARAMETERS
    else:
        framework, zero = Framework.MEGATRON, _megatron_zero(lay["zero"])
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
                            framework=framework, attention=AttentionKernel.EAGER)
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
        notes.append(f"vpp {layout.vpp} and micro-batch {layout.mbs} = local batch / (pp x stages per rank), torchtitan 9dec370 defaults")
    if layout.pp_first_stage_layers:
        notes.append(f"126 layers split {layout.pp_first_stage_layers}/.../{layout.pp_last_stage_layers} (shorter end stages)")
    return model, torchtitan_cluster(entry), training, layout, notes


def _mpt(entry: dict) -> Mapped:
    lay, m = entry["layout"], entry["model"]
    cluster = _cluster(entry)
    notes = ["llm-foundry FSDP FULL_SHARD modelled as FSDP (framework torchtitan, zero 3)",
             ("MPT shape from the benchmark config: biases on, learned positions (MPTConfig defaults), LayerNorm with "
              "bias (low_precision_layernorm is a kernel choice); the README's NumParams match this model exactly"),
             "attention kernel flash (README: 'our models use Flash Attention')",
             "optimizer AdamW (TrainingSpec default; the benchmark table does not state it)",
             f"network: the {cluster.spec.name} preset stands in for the MosaicML cluster (README: 1600 Gbps RoCE per node on A100)"]
    training = TrainingSpec(seq_len=m["seq_len"], global_batch_size=lay["global_batch"], precision=Precision.BF16,
                            framework=Framework.TORCHTITAN, attention=AttentionKernel.FLASH)
    layout = Layout(tp=1, pp=1, mbs=lay["micro_batch"], zero=Zero.PARAMETERS, recompute=_recompute(lay["recompute"]))
    return mpt_model(entry), cluster, training, layout, notes


MAPPINGS = {"narayanan2021": _megatron_papers, "korthikanti2022": _megatron_papers, "torchtitan": _torchtitan,
            "mpt": _mpt}


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
    if entry["group"] == "mpt" and meas.get("mfu"):
        tflops = meas["mfu"] * entry["hardware"]["peak_dense_tflops_used_for_mfu"]
        per_token = mpt_flop_per_token(n_params=m.params_total, num_layers=m.num_layers, hidden_size=m.hidden_size, seq_len=s)
        return tokens_from_flops(tflops, per_token), "mfu x peak / llm-foundry MFU FLOPs per token"
    raise Skip(f"no FLOP convention to convert {meas.get('tflops_convention')!r}")


def _run(entry: dict) -> PublishedRun:
    if entry["group"] not in MAPPINGS:
        raise Skip(f"no mapping for group {entry['group']}")
    model, cluster, training, layout, notes = MAPPINGS[entry["group"]](entry)
    try:
        job = resolve(model, cluster, training, layout)
    except SpecError as err:
        raise Skip(str(err)) from None
    memory_estimate(job)  # must not raise for any returned run
    # what the yaml itself inferred (dp = gpus/(tp·pp·cp) is arithmetic, not an assumption)
    notes += [f"{field} (yaml derived_fields)" for field in entry["derived_fields"] if not field.startswith("layout.dp")]
    measured = _measured_tokens(entry, training.global_batch_size or 0, training.seq_len) or tokens_from_flop_rate(entry, model, tp=layout.tp)
    return PublishedRun(id=entry["id"], group=entry["group"], model=model, cluster=cluster, training=training, layout=layout,
                        measured_tokens_per_s_per_gpu=measured[0], measured_from=measured[1], assumptions=tuple(notes))


@cache
def entries(path: Path = DATA) -> list[dict[str, Any]]:
    """The yaml's entries, parsed once (the C loader where PyYAML has it: 0.1 s instead of 0.8 s)."""
    return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def load(path: Path = DATA) -> tuple[list[PublishedRun], list[tuple[str, str]]]:
    """(runs, skipped) where skipped is [(id, reason)] for every non-hardware entry not turned into a run."""
    all_entries = entries(path)
    runs, skipped = [], []
    for entry in all_entries:
        if entry["kind"] == "hardware_spec":
            continue
        try:
            reason = _skip_reason(entry, all_entries)
            if reason:
                raise Skip(reason)
            runs.append(_run(entry))
        except Skip as skip:
            skipped.append((entry["id"], str(skip)))
    return runs, skipped


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
