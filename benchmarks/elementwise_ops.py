"""The memory-bound kernels of the stored H100 validate runs, op class by op class: the cost model's
predicted milliseconds per step against the profiled kernels' (benchmarks/data/measured/
h100-validate-kernel-summary-2026-11-27b.json, every CUDA kernel of rank 0's 5 timed steps).

    python benchmarks/elementwise_ops.py

Kernels are put in classes by name (CLASSES, first match wins); the GEMM, attention and NCCL kernels
the worker classes apart (planner.validate.worker.kernel_class) and the optimizer's are left out.
The model's side prices the same classes with cost_models.compute's per-op functions, layer by layer
as compute_by_kernel does."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cost_models import compute as C  # noqa: E402
from cost_models import step_time as S  # noqa: E402
from cost_models.enums import MixerKind, PositionKind  # noqa: E402
from planner import presets  # noqa: E402
from planner.validate.slices import choose_slice, native_job  # noqa: E402
from planner.validate.worker import kernel_class  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "measured"
SUMMARY = DATA / "h100-validate-kernel-summary-2026-11-27b.json"
# the summary's traces, in the order the two validate commands ran
RUNS = (("llama-3.1-8b tp8 share, selective", "/tmp/v1/validate/trace_rank0.json",
         "h100-validate-llama8b-tp8-onerank-2026-11-27b.json"),
        ("gpt-1.7b whole, no recompute", "/tmp/v2/validate/trace_rank0.json",
         "h100-validate-gpt1.7b-full-2026-11-27b.json"))
STEPS = 5

# (class, kernel-name pattern); first match wins
CLASSES = (
    ("optimizer", r"FusedOptimizerTensorListMetadata|TensorListMetadata<1>.*::Z|TensorListMetadata<1>.*::B"),
    ("norm fwd", r"vectorized_layer_norm_kernel"),
    ("norm bwd", r"layer_norm_grad_input|GammaBetaBackward"),
    ("activation fwd", r"silu_kernel|GeluCUDAKernelImpl"),
    ("activation bwd", r"silu_backward|GeluBackward"),
    ("dropout", r"fused_dropout|masked_scale"),
    ("adds bf16 (residual, rope, dgrad sums)", r"CUDAFunctor_add<c10::BFloat16>"),
    ("adds fp32 (FSDP2 grad accumulation)", r"CUDAFunctor_add<float>"),
    ("muls bf16 (rope, SwiGLU)", r"MulFunctor|BinaryFunctor<c10::BFloat16"),
    ("rope rotate_half (neg, cat)", r"neg_kernel|CatArrayBatchedCopy<"),
    ("rope tables (fp32 cos/sin)", r"cos_kernel|sin_kernel|pow_tensor|reciprocal|arange|CatArrayBatchedCopy_vectorized"
                                   r"|FillFunctor<double>|BinaryFunctor<float|Functor<float, float, float"),
    ("casts to bf16 (FSDP2 copy-in, rope tables)", r"bfloat16_copy_kernel"),
    ("FSDP2 copy-out (Memcpy DtoD)", r"Memcpy DtoD"),
    ("FSDP2 reduce-scatter copy-in (chunk_cat)", r"chunk_cat"),
    ("contiguous copies", r"direct_copy_kernel"),
    ("bias / GQA grad sums (reduce)", r"reduce_kernel"),
    ("loss (log_softmax, nll)", r"SoftMax|nll_loss"),
    ("embedding backward", r"embedding_backward|compute_grad_weight|sum_and_scatter|radix_sort|unique_by_key|scan::"
                           r"|partial_segment|partials_per_segment|num_of_partial|gather_kernel"),
    ("memset, fills, host copies", r"Memset|FillFunctor|Memcpy HtoD|Memcpy DtoH"),
)


def measured(trace: str) -> tuple[dict[str, float], list[str]]:
    """ms per step by class, and the names no pattern matched."""
    rows = json.loads(SUMMARY.read_text())[trace]
    out: dict[str, float] = {}
    unmapped = []
    for name, _calls, total_us in rows:
        if kernel_class(name) != "elementwise" or "cudnn" in name or "philox" in name:
            continue
        cls = next((c for c, pat in CLASSES if re.search(pat, name)), None)
        if cls is None:
            unmapped.append(name)
            cls = "unmapped"
        out[cls] = out.get(cls, 0.0) + total_us / STEPS / 1e3
    return out, unmapped


def predicted(report: str) -> dict[str, float]:
    """The model's ms per step by op class for the report's slice."""
    d = json.loads((DATA / report).read_text())
    plan = d["plan"]
    job, _ = native_job(presets.models()[plan["model"]], presets.clusters()[plan["cluster"]], plan["gpus"],
                        plan["training"], plan["layout"])
    job = choose_slice(job, 1).job
    est = S.time_estimate(job)
    cal = est.calibration
    m, lay = job.model, job.layout
    t = C.tokens(job)
    res = t / (lay.tp if job.sp else 1)
    out: dict[str, float] = {}

    def put(cls: str, s: float) -> None:
        out[cls] = out.get(cls, 0.0) + s * 1e3 * job.num_microbatches

    for pos, layer_id in S.stage_layers(job, est.critical.rank):
        kind = m.layer_kind(layer_id)
        again = S.reruns_forward_elementwise(job, job.recompute_mode(pos))
        fwd = 2 if again else 1
        norms = kind.norms * (2 if m.sandwich_norms else 1)
        put("norm fwd", fwd * norms * C._op_seconds(job, "norm", m.hidden_size * res, False, cal))
        put("norm bwd", norms * C._op_seconds(job, "norm", m.hidden_size * res, True, cal))
        add = "adds bf16 (residual, rope, dgrad sums)"
        put(add, fwd * kind.norms * C._op_seconds(job, "add", m.hidden_size * res, False, cal))
        put(add, kind.norms * C._op_seconds(job, "add", m.hidden_size * res, True, cal)
            + C.dgrad_sum_seconds(job, kind, cal))
        if m.hidden_dropout > 0:
            put("dropout", fwd * kind.norms * C._op_seconds(job, "dropout", m.hidden_size * res, False, cal))
            put("dropout", kind.norms * C._op_seconds(job, "dropout", m.hidden_size * res, True, cal))
        if m.position_embedding is PositionKind.ROPE and kind.mixer is MixerKind.ATTENTION and kind.rope and m.mla is None:
            e = (m.q_width + m.kv_width) / lay.tp * t
            put("rope (all its kernels)", fwd * C._op_seconds(job, "rope", e, False, cal)
                + C._op_seconds(job, "rope", e, True, cal))
        act = "swiglu" if m.mlp.gated else "gelu"
        if kind.mlp and not kind.moe:
            e = m.ffn_hidden_size / lay.tp * t
            put("activation fwd", fwd * C._op_seconds(job, act, e, False, cal))
            put("activation bwd", C._op_seconds(job, act, e, True, cal))
        put("bias grads", C.bias_grad_seconds(job, kind, cal))
        put("qkv copies and biases", sum(f(job, kind, backward=b, cal=cal) * (fwd if not b else 1)
                                         for f in (C.qkv_bias_seconds, C.qkv_layout_copy_seconds,
                                                   C.qkv_copy_seconds, C.local_attention_copy_seconds)
                                         for b in (False, True)))
        if S.fsdp_per_microbatch(job) and job.dense_shard_group > 1:
            put("FSDP2 copies (all)", S.fsdp_copy_seconds(job, layer_id, cal, est.critical.rank))
    put("rank memory (grad accumulation, embedding grad)", S.rank_memory_seconds(job, est.critical.rank, cal))
    if est.critical.rank == lay.pp - 1:
        put("loss (log_softmax, nll)", C.loss_time(job, cal))
    total = S.compute_by_kernel(est).value("elementwise") * 1e3
    out["(other model terms)"] = total - sum(out.values())
    return out


# every stored H100 validate report: the model's memory-bound total against the worker's
# elementwise_s (compute less GEMM and attention kernels, the optimizer outside it)
REPORTS = ("h100-validate-llama8b-tp8-onerank-2026-11-27b.json", "h100-validate-llama8b-tp8-onerank-none-2026-11-27b.json",
           "h100-validate-llama8b-tp8-onerank-full-2026-11-27b.json", "h100-validate-gpt1.7b-full-2026-11-27b.json")


def main() -> None:
    print(f"{'report':58s} {'model ms':>9s} {'measured ms':>12s}")
    for report in REPORTS:
        meas = json.loads((DATA / report).read_text())["measured"]["split"]["classes"]["elementwise_s"] * 1e3
        print(f"{report:58s} {sum(predicted(report).values()):9.1f} {meas:12.1f}")
    print()
    for title, trace, report in RUNS:
        meas, unmapped = measured(trace)
        pred = predicted(report)
        print(f"## {title} ({report})")
        print(f"{'class':50s} {'model ms':>9s} {'measured ms':>12s}")
        for cls in sorted(set(meas) | set(pred), key=lambda c: -max(meas.get(c, 0.0), pred.get(c, 0.0))):
            p, q = pred.get(cls), meas.get(cls)
            print(f"{cls:50s} {'-' if p is None else f'{p:9.2f}':>9s} {'-' if q is None else f'{q:12.2f}':>12s}")
        opt = meas.get("optimizer", 0.0)
        print(f"{'total (measured without the optimizer)':50s} {sum(pred.values()):9.2f} {sum(meas.values()) - opt:12.2f}")
        for name in unmapped:
            print("  unmapped:", name[:120])
        print()


if __name__ == "__main__":
    main()
