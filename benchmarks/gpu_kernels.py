"""Measure, on this machine's CUDA GPU, the kernel quantities the cost model prices.

    python benchmarks/gpu_kernels.py --out measured.json

What it times (CUDA events around back-to-back launches, after warm-up; median of repeats; the
inputs rotate over enough copies to exceed the L2 cache):
- GEMMs at the weight-gradient shapes of published layouts (an (m x k)·(k x n) product whose k is
  the tokens of one micro-batch), in the layouts the frameworks run them:
  * `wgrad_bf16`: dW = dYᵀ·X, bf16 in and out (torch.mm on a transposed view, cublas op T/N);
  * `wgrad_bf16_acc32`: the same into an fp32 main gradient with beta = 1, as Megatron's gradient
    accumulation fusion runs it (apex wgrad_gemm_accum_fp32: cublasGemmEx, bf16 A/B, fp32 C,
    CUBLAS_OP_N / CUBLAS_OP_T, NVIDIA/apex@27017a4a csrc/megatron/fused_weight_gradient_dense_cuda.cu);
  * `wgrad_bf16_out32`: the same with beta = 0 (the fp32 store without the load);
  * `fwd_bf16`: Y = X·Wᵀ with m = tokens (torch.nn.functional.linear's layout);
  * `fp8`: torch._scaled_mm, e4m3 per-tensor scales, bf16 out (fp8 GEMMs run TN on Hopper).
- Attention: torch SDPA's flash and cuDNN backends, forward and forward+backward, causal and not,
  at the FlashAttention benchmark's shapes (batch x seqlen = 16k tokens, heads x head_dim = 2048).
- Memory-bound kernels: eager RMSNorm, SwiGLU on split halves, fp32 cross-entropy, fused AdamW.

A 20 s burn-in on a large GEMM first brings the board to its power limit, so the figures are the
sustained ones a training step sees; the SM clock and board power are read through NVML after each
pass. Everything is written to --out as JSON; a short table is printed last.
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import math
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

L2_ROTATE_BYTES = 160 * 2**20   # rotate inputs over more than 3x the 50-60 MB L2 of H100/H200

# (name, m, n): weight-gradient output shapes [out_features, in_features] of one linear of a shard.
WGRAD_SHAPES = [
    ("gpt3-175b tp8 qkv", 4608, 12288),
    ("gpt3-175b tp8 proj", 12288, 1536),
    ("gpt3-175b tp8 fc1", 6144, 12288),
    ("gpt3-175b tp4 fc1", 12288, 12288),
    ("llama-70b tp8 fc1", 7168, 8192),
    ("llama-70b tp8 fc2", 8192, 3584),
    ("llama-8b tp1 qkv", 6144, 4096),
]
TOKENS = [512, 1024, 2048, 4096, 8192, 16384]


def nvml_state() -> dict:
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        return {
            "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
            "mem_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
            "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000,
            "temp_c": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
        }
    except Exception as exc:  # NVML missing: the timings stand without it
        return {"nvml": repr(exc)}


def device_info() -> dict:
    p = torch.cuda.get_device_properties(0)
    info = {
        "gpu": p.name, "sm_count": p.multi_processor_count, "memory_bytes": p.total_memory,
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(), "python": sys.version.split()[0],
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        info["driver"] = pynvml.nvmlSystemGetDriverVersion()
        info["power_limit_w"] = pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000
        info["max_sm_clock_mhz"] = pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)
    except Exception as exc:
        info["nvml"] = repr(exc)
    return info


def time_call(fn, *, target_s: float = 0.004, repeats: int = 5) -> float:
    """Median seconds of one call of `fn` (which rotates its own inputs), timed in blocks of
    back-to-back calls between two CUDA events, each block about `target_s` long."""
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    one = max(start.elapsed_time(end) / 1e3, 1e-6)
    n = max(1, min(200, int(target_s / one)))
    samples = []
    for _ in range(repeats):
        start.record()
        for _ in range(n):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / n)
    return statistics.median(samples)


def copies(nbytes: int) -> int:
    return max(2, min(8, math.ceil(L2_ROTATE_BYTES / max(nbytes, 1))))


class Rotor:
    def __init__(self, items):
        self.items, self.i = items, 0

    def next(self):
        self.i = (self.i + 1) % len(self.items)
        return self.items[self.i]


# --- cuBLAS GemmEx through ctypes (the call apex's wgrad_gemm_accum_fp32 makes) -------------------

CUDA_R_32F, CUDA_R_16BF = 0, 14
CUBLAS_COMPUTE_32F = 68
CUBLAS_GEMM_DEFAULT_TENSOR_OP = 99
CUBLAS_OP_N, CUBLAS_OP_T = 0, 1


def _cublas():
    import glob
    import os
    names = []
    for base in sys.path:
        names += glob.glob(os.path.join(base, "nvidia", "cu*", "lib", "libcublas.so*"))
        names += glob.glob(os.path.join(base, "nvidia", "cublas", "lib", "libcublas.so*"))
    names += ["libcublas.so.13", "libcublas.so.12", "libcublas.so"]
    for name in names:
        try:
            lib = ctypes.CDLL(name)
            handle = ctypes.c_void_p()
            if lib.cublasCreate_v2(ctypes.byref(handle)) == 0:
                # the legacy default stream, which torch's events are recorded on here
                lib.cublasSetStream_v2(handle, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
                return lib, handle, name
        except OSError:
            continue
    raise RuntimeError("no libcublas found")


def gemm_ex_wgrad(lib, handle, dy, x, c, beta: float):
    """c[m, n] = dy[k, m]ᵀ · x[k, n] + beta·c in cuBLAS column-major terms: C'(n x m) = X'(n x k) ·
    op_T(DY'(m x k)), exactly apex's (OP_N, OP_T, in_dim, out_dim, tokens) call."""
    k, m = dy.shape
    n = x.shape[1]
    alpha_v, beta_v = ctypes.c_float(1.0), ctypes.c_float(beta)
    rc = lib.cublasGemmEx(
        handle, CUBLAS_OP_N, CUBLAS_OP_T, n, m, k, ctypes.byref(alpha_v),
        ctypes.c_void_p(x.data_ptr()), CUDA_R_16BF, n,
        ctypes.c_void_p(dy.data_ptr()), CUDA_R_16BF, m,
        ctypes.byref(beta_v), ctypes.c_void_p(c.data_ptr()), CUDA_R_32F, n,
        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT_TENSOR_OP)
    if rc != 0:
        raise RuntimeError(f"cublasGemmEx returned {rc}")


def check_gemm_ex(lib, handle) -> float:
    k, m, n = 256, 384, 512
    dy = torch.randn(k, m, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    c = torch.randn(m, n, device="cuda", dtype=torch.float32)
    ref = dy.double().t() @ x.double() + c.double()
    gemm_ex_wgrad(lib, handle, dy, x, c, 1.0)
    torch.cuda.synchronize()
    return float((c.double() - ref).norm() / ref.norm())


# --- GEMMs -----------------------------------------------------------------------------------------


def gemm_points(shapes, tokens, cublas) -> list[dict]:
    rows = []
    for name, m, n in shapes:
        for k in tokens:
            rows.append({"kind": "gemm", "variant": "wgrad_bf16", "shape": name, "m": m, "n": n, "k": k})
            if cublas is not None:
                rows.append({"kind": "gemm", "variant": "wgrad_bf16_acc32", "shape": name, "m": m, "n": n, "k": k})
                rows.append({"kind": "gemm", "variant": "wgrad_bf16_out32", "shape": name, "m": m, "n": n, "k": k})
            rows.append({"kind": "gemm", "variant": "fwd_bf16", "shape": name, "m": k, "n": m, "k": n})
            rows.append({"kind": "gemm", "variant": "fp8", "shape": name, "m": m, "n": n, "k": k})
    return rows


def run_gemm(row: dict, cublas) -> float:
    m, n, k, v = row["m"], row["n"], row["k"], row["variant"]
    bf = torch.bfloat16
    if v.startswith("wgrad"):
        per = 2 * k * (m + n)
        sets = [(torch.randn(k, m, device="cuda", dtype=bf), torch.randn(k, n, device="cuda", dtype=bf))
                for _ in range(copies(per))]
        rot = Rotor(sets)
        if v == "wgrad_bf16":
            def fn():
                dy, x = rot.next()
                return dy.t() @ x
        else:
            lib, handle, _ = cublas
            c = torch.zeros(m, n, device="cuda", dtype=torch.float32)
            beta = 1.0 if v == "wgrad_bf16_acc32" else 0.0

            def fn():
                dy, x = rot.next()
                gemm_ex_wgrad(lib, handle, dy, x, c, beta)
    elif v == "fwd_bf16":
        per = 2 * (m * k + k * n)
        sets = [(torch.randn(m, k, device="cuda", dtype=bf), torch.randn(n, k, device="cuda", dtype=bf))
                for _ in range(copies(per))]
        rot = Rotor(sets)

        def fn():
            x, w = rot.next()
            return F.linear(x, w)
    elif v == "fp8":
        per = m * k + k * n
        f8 = torch.float8_e4m3fn
        one = torch.tensor(1.0, device="cuda")
        sets = [((torch.randn(m, k, device="cuda") * 0.5).to(f8), (torch.randn(n, k, device="cuda") * 0.5).to(f8))
                for _ in range(copies(per))]
        rot = Rotor(sets)

        def fn():
            a, b = rot.next()
            return torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=bf)
    else:
        raise ValueError(v)
    s = time_call(fn)
    del sets
    return s


# --- attention -------------------------------------------------------------------------------------


def attention_points() -> list[dict]:
    rows = []
    for backend in ("flash", "cudnn"):
        for hd, causal in ((128, True), (128, False), (64, True)):
            for seq in (512, 1024, 2048, 4096, 8192, 16384, 32768):
                rows.append({"kind": "attention", "backend": backend, "head_dim": hd, "causal": causal, "seq": seq,
                             "batch": max(1, 16384 // seq), "heads": 2048 // hd, "kv_heads": 2048 // hd})
        # grouped-query attention at Llama-3 8B's local shapes (32 query heads, 8 key/value heads)
        for seq in (2048, 8192):
            rows.append({"kind": "attention", "backend": backend, "head_dim": 128, "causal": True, "seq": seq,
                         "batch": max(1, 16384 // seq), "heads": 32, "kv_heads": 8})
    return rows


def run_attention(row: dict) -> tuple[float, float]:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[row["backend"]]
    b, s, h, hk, d = row["batch"], row["seq"], row["heads"], row["kv_heads"], row["head_dim"]
    bf = torch.bfloat16

    def make():
        q = torch.randn(b, s, h, d, device="cuda", dtype=bf).transpose(1, 2).requires_grad_()
        k = torch.randn(b, s, hk, d, device="cuda", dtype=bf).transpose(1, 2).requires_grad_()
        v = torch.randn(b, s, hk, d, device="cuda", dtype=bf).transpose(1, 2).requires_grad_()
        return q, k, v
    per = 2 * b * s * d * (h + 2 * hk)
    rot = Rotor([make() for _ in range(copies(per))])
    gqa = {"enable_gqa": True} if hk != h else {}
    grad = torch.randn(b, h, s, d, device="cuda", dtype=bf)
    with sdpa_kernel([backend]):
        def fwd():
            q, k, v = rot.next()
            with torch.no_grad():
                return F.scaled_dot_product_attention(q, k, v, is_causal=row["causal"], **gqa)

        def fwd_bwd():
            q, k, v = rot.next()
            out = F.scaled_dot_product_attention(q, k, v, is_causal=row["causal"], **gqa)
            out.backward(grad)
            q.grad = k.grad = v.grad = None
        return time_call(fwd), time_call(fwd_bwd)


def attention_flop(row: dict) -> float:
    """Forward FLOPs in the FlashAttention benchmark convention (4·b·s²·h·d, halved when causal)."""
    f = 4 * row["batch"] * row["seq"] ** 2 * row["heads"] * row["head_dim"]
    return f / 2 if row["causal"] else f


# --- memory-bound kernels ------------------------------------------------------------------------


def run_memory_bound() -> list[dict]:
    out = []
    bf = torch.bfloat16
    t, hdim, ffn = 8192, 8192, 28672
    x = torch.randn(t, hdim, device="cuda", dtype=bf, requires_grad=True)
    w = torch.ones(hdim, device="cuda", dtype=bf, requires_grad=True)
    g = torch.randn(t, hdim, device="cuda", dtype=bf)

    def norm_fwd():
        with torch.no_grad():
            F.rms_norm(x, (hdim,), w)

    def norm_fwd_bwd():
        F.rms_norm(x, (hdim,), w).backward(g)
    out.append({"op": "rmsnorm eager fwd", "bytes": 2 * t * hdim * 2, "s": time_call(norm_fwd)})
    out.append({"op": "rmsnorm eager fwd+bwd", "bytes": (2 + 3) * t * hdim * 2, "s": time_call(norm_fwd_bwd)})
    y = torch.randn(t, 2 * ffn // 8, device="cuda", dtype=bf, requires_grad=True)
    gy = torch.randn(t, ffn // 8, device="cuda", dtype=bf)

    def swiglu_fwd():
        with torch.no_grad():
            a, b2 = torch.chunk(y, 2, dim=-1)
            F.silu(a) * b2

    def swiglu_fwd_bwd():
        a, b2 = torch.chunk(y, 2, dim=-1)
        (F.silu(a) * b2).backward(gy)
    f = ffn // 8
    out.append({"op": "swiglu split fwd", "bytes": t * 3 * f * 2, "s": time_call(swiglu_fwd)})
    out.append({"op": "swiglu split fwd+bwd", "bytes": t * (3 + 5) * f * 2, "s": time_call(swiglu_fwd_bwd)})
    vocab = 128256
    logits = torch.randn(4096, vocab, device="cuda", dtype=torch.float32, requires_grad=True)
    labels = torch.randint(0, vocab, (4096,), device="cuda")

    def ce():
        F.cross_entropy(logits, labels).backward()
    out.append({"op": "cross-entropy fp32 fwd+bwd", "bytes": 4096 * vocab * 16, "s": time_call(ce)})
    n = 2**28  # 268M fp32 parameters in 8 tensors
    params = [torch.zeros(n // 8, device="cuda", requires_grad=True) for _ in range(8)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
    # fused AdamW: read param, grad, exp_avg, exp_avg_sq; write param, exp_avg, exp_avg_sq (fp32)
    out.append({"op": "adamw fused fp32 step", "bytes": n * 4 * 7, "s": time_call(opt.step, target_s=0.02)})
    for r in out:
        r["tb_per_s"] = r["bytes"] / r["s"] / 1e12
    return out


def burn(seconds: float) -> float:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(50):
            a @ b
        torch.cuda.synchronize()
    s = time_call(lambda: a @ b, target_s=0.05)
    return 2 * 8192**3 / s / 1e12


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu_kernels.json")
    ap.add_argument("--passes", type=int, default=3, help="GEMM sweeps, median taken (default 3)")
    ap.add_argument("--burn-s", type=float, default=20.0)
    ap.add_argument("--quick", action="store_true", help="two shapes, three token counts")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_kernels: no CUDA GPU here; it measures the GPU it runs on", file=sys.stderr)
        return 2
    result = {"device": device_info(), "command": " ".join(["python"] + sys.argv), "states": []}
    try:
        result["nvidia_smi"] = subprocess.run(["nvidia-smi", "-q", "-d", "CLOCK,POWER,PERFORMANCE"],
                                              capture_output=True, text=True, timeout=20).stdout[-6000:]
    except Exception as exc:
        result["nvidia_smi"] = repr(exc)
    try:
        lib, handle, name = _cublas()
        err = check_gemm_ex(lib, handle)
        result["device"]["cublas"] = name
        result["gemm_ex_check_rel_err"] = err
        cublas = (lib, handle, name) if err < 1e-2 else None
    except Exception as exc:
        result["device"]["cublas"] = repr(exc)
        cublas = None
    t0 = time.time()
    result["burn_in_bf16_8192_tflops"] = burn(args.burn_s)
    result["states"].append({"after": "burn-in", **nvml_state()})
    shapes, tokens = (WGRAD_SHAPES[:2], TOKENS[1:4]) if args.quick else (WGRAD_SHAPES, TOKENS)
    points = gemm_points(shapes, tokens, cublas)
    times: dict[int, list[float]] = {i: [] for i in range(len(points))}
    for p in range(args.passes):
        order = list(range(len(points)))
        if p % 2:
            order.reverse()
        for i in order:
            try:
                times[i].append(run_gemm(points[i], cublas))
            except Exception as exc:
                points[i]["error"] = repr(exc)[:200]
        result["states"].append({"after": f"gemm pass {p + 1}", **nvml_state()})
        print(f"gemm pass {p + 1} done at {time.time() - t0:.0f} s", flush=True)
    for i, row in enumerate(points):
        if times[i]:
            row["s"] = statistics.median(times[i])
            row["tflops"] = 2 * row["m"] * row["n"] * row["k"] / row["s"] / 1e12
    result["gemm"] = points
    att = attention_points()
    for row in att:
        try:
            f, fb = run_attention(row)
            fl = attention_flop(row)
            row.update(fwd_s=f, fwd_bwd_s=fb, fwd_tflops=fl / f / 1e12, fwd_bwd_tflops=3.5 * fl / fb / 1e12,
                       bwd_tflops=2.5 * fl / max(fb - f, 1e-9) / 1e12)
        except Exception as exc:
            row["error"] = repr(exc)[:200]
        torch.cuda.empty_cache()
    result["states"].append({"after": "attention", **nvml_state()})
    result["attention"] = att
    print(f"attention done at {time.time() - t0:.0f} s", flush=True)
    try:
        result["memory_bound"] = run_memory_bound()
    except Exception as exc:
        result["memory_bound"] = [{"error": repr(exc)[:300]}]
    result["states"].append({"after": "memory-bound", **nvml_state()})
    result["end_bf16_8192_tflops"] = burn(2.0)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)
    print(json.dumps(result["device"]))
    print("burn-in 8192^3 bf16 TFLOP/s:", round(result["burn_in_bf16_8192_tflops"], 1),
          "end:", round(result["end_bf16_8192_tflops"], 1), "gemm_ex check:", result.get("gemm_ex_check_rel_err"))
    for st in result["states"]:
        print(st)
    print(f"{'shape':22} {'variant':18} " + " ".join(f"{k:>6}" for k in tokens))
    for name, _, _ in shapes:
        for v in ("wgrad_bf16", "wgrad_bf16_acc32", "wgrad_bf16_out32", "fwd_bf16", "fp8"):
            cells = {r["k"] if v != "fwd_bf16" else r["m"]: r.get("tflops") for r in points if r["shape"] == name and r["variant"] == v}
            if cells:
                print(f"{name:22} {v:18} " + " ".join(f"{cells.get(k) or 0:6.0f}" for k in tokens))
    for r in att:
        print(r["backend"], r["head_dim"], "causal" if r["causal"] else "full", r["seq"], f"h{r['heads']}/{r['kv_heads']}",
              *(f"{r[k]:.0f}" if k in r else r.get("error", "")[:60] for k in ("fwd_tflops", "bwd_tflops", "fwd_bwd_tflops")))
    for r in result["memory_bound"]:
        print(r)
    print(f"total {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
