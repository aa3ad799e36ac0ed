"""The training job `planner validate` emits and runs: `torchrun --nproc-per-node N worker.py job.json`.

Self-contained: it needs only torch and the standard library, so the copy kept in a validate output
directory can be read and rerun anywhere (multi-node too, under the Slurm file from `launch`).
`job.json` next to it describes one or more runs (the model slice, the device mesh, the layout,
the steps); this file builds the transformer with the run's real per-GPU shapes, applies the
layout with PyTorch's own distributed APIs and measures it:

- mesh: one DeviceMesh with dimensions (pp, dp_replicate, dp_shard, cp, tp), with dp_shard split
  into (dp_shard_out, ep) when experts are parallel (torchtitan's order: tp fastest), and the
  dense FSDP dimension flattened from it;
- data parallel: DDP (zero 0), FSDP2 `fully_shard` per block and at the root (zero 2: no reshard
  after forward, zero 3: reshard), HSDP on a 2-D (dp_replicate, dp_shard) mesh;
- tensor/sequence parallel: `parallelize_module` with the Colwise/Rowwise/SequenceParallel plan of
  torchtitan's llama (q/k/v and gate/up column-wise, output and down row-wise);
- pipeline: `torch.distributed.pipelining` stages (virtual stage v of rank r holds segment v*pp + r)
  under Schedule1F1B, ScheduleInterleaved1F1B or ScheduleGPipe;
- experts: top-k routing with all-to-all token dispatch and combine over the ep group;
- hybrid models (Nemotron-H): Mamba-2 layers with the chunked SSD scan in plain torch (ssd_scan),
  attention and MLP layers, one norm and one block per layer;
- context parallel: ring attention with one flash kernel per step, the next K/V block's transfer
  overlapped with the current step, log-sum-exp merge (load-balanced chunks, torch's CP scheme);
- recompute: `checkpoint_wrapper` on the planned layers (full), or on every block with torchtitan's
  per-op selective policy (selective: matmul outputs saved but every second one, attention saved).

Per rank it writes progress lines, a result file (step times, the profiler's time split, state bytes,
peak memory) and a Chrome trace, or an error file with the cause when it fails.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import re
import signal
import sys
import threading
import time
import traceback
import zlib
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

FORMAT_VERSION = 2
INIT_STD = 0.02  # GPT-2/Megatron init: N(0, 0.02) for every matrix (Radford et al. 2019; Megatron init_method_std)

# --------------------------------------------------------------------------------------------------
# model


class Norm(nn.Module):
    """LayerNorm or RMSNorm; `one_plus` scales an RMSNorm by (1 + weight) (Gemma's RMSNorm). A
    zero-centered LayerNorm (LayerNorm1P) runs as LayerNorm: the same parameters and kernels."""

    def __init__(self, width: int, kind: str, eps: float = 1e-5, one_plus: bool = False):
        super().__init__()
        self.kind, self.eps, self.one_plus = kind, eps, one_plus and kind != "layernorm"
        self.weight = nn.Parameter(torch.ones(width))
        self.bias = nn.Parameter(torch.zeros(width)) if kind == "layernorm" else None

    def forward(self, x):
        if self.kind == "layernorm":
            return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)
        return F.rms_norm(x, (x.shape[-1],), self.weight + 1 if self.one_plus else self.weight, self.eps)


def _norm(width: int, m: dict) -> Norm:
    return Norm(width, m["norm"], m.get("norm_eps", 1e-5), one_plus=m.get("zero_centered_norm", False))


def local_mask(s: int, window: int | None, chunk: int | None, device) -> torch.Tensor:
    """Keys each query may attend (True), (s, s): causal, within the last `window` tokens (the query
    included: transformers' sliding_window_overlay kv > q − window) or within the query's chunk of
    `chunk` tokens (chunked_overlay)."""
    q = torch.arange(s, device=device)[:, None]
    k = torch.arange(s, device=device)[None, :]
    keep = k <= q
    if window is not None:
        keep = keep & (k > q - window)
    if chunk is not None:
        keep = keep & (k // chunk == q // chunk)
    return keep


def _rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def rope_tables(positions: torch.Tensor, head_dim: int, dtype: torch.dtype):
    """cos/sin of rotary embedding (Su et al. 2021) for the given token positions, shape (s, 1, d)."""
    inv = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim))
    ang = torch.outer(positions.float(), inv)
    ang = torch.cat([ang, ang], dim=-1)[:, None, :]
    return ang.cos().to(dtype), ang.sin().to(dtype)


class _Transfer:
    """One ring step of a buffer, asynchronous: send it to the next rank of the group and receive the
    previous rank's into a new buffer; `wait()` returns the received one. Issued before the compute
    it overlaps with (torch's context parallel: the next K/V is exchanged before this step's
    attention)."""

    def __init__(self, buf, group):
        n, r = dist.get_world_size(group), dist.get_rank(group)
        self.recv = torch.empty_like(buf)
        with torch.profiler.record_function("cp_ring"):  # names these sends/receives for the trace analysis
            ops = [dist.P2POp(dist.isend, buf, group=group, group_peer=(r + 1) % n),
                   dist.P2POp(dist.irecv, self.recv, group=group, group_peer=(r - 1) % n)]
            self.works = dist.batch_isend_irecv(ops)

    def wait(self):
        with torch.profiler.record_function("cp_ring"):
            for w in self.works:
                w.wait()
        return self.recv


def _flash_fwd(q, k, v, causal: bool, scale: float):
    """One block's attention by the flash kernel: (output, fp32 log-sum-exp (b, h, s_q), what the
    kernel's backward needs besides). CUDA: aten::_scaled_dot_product_flash_attention (bf16/fp16);
    CPU: aten::_scaled_dot_product_flash_attention_for_cpu, which tiles q and k and never forms the
    s_q x s_k score matrix either."""
    if q.device.type == "cuda":
        out, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v, 0.0, causal, False, scale=scale)
        return out, lse, (cum_q, cum_k, max_q, max_k, seed, offset)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
    return out, lse, ()


def _flash_bwd(dout, q, k, v, out, lse, causal: bool, scale: float, rest):
    if q.device.type == "cuda":
        cum_q, cum_k, max_q, max_k, seed, offset = rest
        return torch.ops.aten._scaled_dot_product_flash_attention_backward(
            dout, q, k, v, out, lse, cum_q, cum_k, max_q, max_k, 0.0, causal, seed, offset, scale=scale)
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(dout, q, k, v, out, lse, 0.0, causal, scale=scale)


def _ring_block(i: int, r: int, n: int):
    """What rank r computes at ring step i with the load-balanced split (rank c holds sequence chunks
    c and 2n-1-c of 2n): (causal, q half, k/v half), a half being None (all), 0 or 1. Step 0 is the
    rank's own block, causal; a block from a lower rank j meets all queries with its first chunk
    only (chunk j precedes both of ours, chunk 2n-1-j follows both); a block from a higher rank meets
    only our second query chunk, with both of its chunks. torch's _templated_ring_attention makes the
    same choice (torch 2.13, torch/distributed/tensor/experimental/_context_parallel/_attention.py)."""
    if i == 0:
        return True, None, None
    return (False, None, 0) if i <= r else (False, 1, None)


def _half(t, which):
    return t if which is None else t.chunk(2, dim=2)[which]


class _RingFlashAttention(torch.autograd.Function):
    """Causal attention over a context-parallel ring (Liu et al. 2023, Ring Attention) as torch's
    context parallel runs it (torch 2.13.0, git cf30153c, torch/distributed/tensor/experimental/
    _context_parallel/_attention.py: _templated_ring_attention and its backward): each rank keeps
    its queries; the K/V blocks travel around the ring, the next one sent before the current one is
    computed; every step is one flash kernel call whose output is merged into the running one by
    log-sum-exp; fully masked blocks are skipped by the load balance above. Backward runs the flash
    backward per step with the merged output and log-sum-exp, and each block's K/V gradient travels
    with the block until it returns to its owner."""

    @staticmethod
    def forward(ctx, q, k, v, group, scale):
        n, r = dist.get_world_size(group), dist.get_rank(group)
        kv = torch.cat([k.contiguous().flatten(), v.contiguous().flatten()])
        out = lse = None
        rests = []
        for i in range(n):
            pending = _Transfer(kv, group) if i < n - 1 else None
            kb, vb = kv[: k.numel()].view(k.shape), kv[k.numel():].view(v.shape)
            causal, qh, kh = _ring_block(i, r, n)
            o, l, rest = _flash_fwd(_half(q, qh), _half(kb, kh), _half(vb, kh), causal, scale)
            rests.append(rest)
            o, l = o.float(), l.float().unsqueeze(-1)
            if out is None:
                out, lse = o, l
            else:  # the stable merge of torch's _SDPAMerger (ring-flash-attention PR 34)
                cur_o, cur_l = _half(out, qh), _half(lse, qh)
                new_o = cur_o - torch.sigmoid(l - cur_l) * (cur_o - o)
                new_l = cur_l - F.logsigmoid(cur_l - l)
                if qh is None:
                    out, lse = new_o, new_l
                else:
                    out = torch.cat([out.chunk(2, dim=2)[0], new_o], dim=2)
                    lse = torch.cat([lse.chunk(2, dim=2)[0], new_l], dim=2)
            if pending is not None:
                kv = pending.wait()
        out = out.to(q.dtype)
        lse = lse.squeeze(-1).contiguous()
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.scale, ctx.rests = group, scale, rests
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group, scale = ctx.group, ctx.scale
        n, r = dist.get_world_size(group), dist.get_rank(group)
        dout = dout.contiguous()
        dq = torch.zeros_like(q, dtype=torch.float32)
        kv = torch.cat([k.contiguous().flatten(), v.contiguous().flatten()])
        back = None  # the K/V gradient travelling with the block
        for i in range(n):
            pending = _Transfer(kv, group) if i < n - 1 else None
            kb, vb = kv[: k.numel()].view(k.shape), kv[k.numel():].view(v.shape)
            causal, qh, kh = _ring_block(i, r, n)
            dqb, dkb, dvb = _flash_bwd(_half(dout, qh), _half(q, qh), _half(kb, kh), _half(vb, kh), _half(out, qh),
                                      lse if qh is None else lse.chunk(2, dim=2)[qh].contiguous(), causal, scale, ctx.rests[i])
            _half(dq, qh).add_(dqb.float())
            dkv = torch.zeros(kv.shape, dtype=torch.float32, device=kv.device) if back is None else back.wait()
            dk, dv = dkv[: k.numel()].view(k.shape), dkv[k.numel():].view(v.shape)
            _half(dk, kh).add_(dkb.float())
            _half(dv, kh).add_(dvb.float())
            back = _Transfer(dkv, group) if n > 1 else None
            if pending is not None:
                kv = pending.wait()
        if back is not None:
            dkv = back.wait()  # after n steps, this rank's own block's gradient
        dk, dv = dkv[: k.numel()].view(k.shape), dkv[k.numel():].view(v.shape)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None


def ring_attention(q, k, v, group, scale):
    """(b, heads, s_local, d) queries, keys and values of this rank's two sequence chunks -> output."""
    return _RingFlashAttention.apply(q, k, v, group, scale)


def attention_core(q, k, v, *, eager: bool, scale: float, dropout: float, training: bool,
                   window: int | None = None, chunk: int | None = None, softcap: float | None = None, sinks=None):
    """Causal attention of (b, heads, s, d) queries, keys and values, within the last `window` tokens
    or the query's `chunk` when given (local_mask): torch SDPA, or explicit scores when eager,
    soft-capped or with sinks."""
    s = q.shape[-2]
    if eager or softcap is not None or sinks is not None:
        # explicit scores: soft-capping c·tanh(x/c) and sinks have no SDPA form
        scores = (q @ k.transpose(-2, -1)) * scale
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        scores = scores.masked_fill(~local_mask(s, window, chunk, q.device), float("-inf"))
        if sinks is not None:
            sink = sinks.to(scores.dtype)[None, :, None, None].expand(*scores.shape[:-1], 1)
            probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        else:
            probs = torch.softmax(scores, dim=-1)
        return F.dropout(probs, dropout, training) @ v
    p = dropout if training else 0.0
    if window is not None or chunk is not None:
        mask = local_mask(s, window, chunk, q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, scale=scale)
    return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True, scale=scale)


class Attention(nn.Module):
    def __init__(self, m: dict, attention: str, layer_id: int = 0):
        super().__init__()
        h, d = m["hidden"], m["head_dim"]
        self.head_dim, self.kind = d, attention
        self.rope = m["positions"] == "rope" and layer_id not in m.get("nope_layers", ())
        local = layer_id in m.get("local_layers", ())
        self.window = m.get("window") if local else None
        self.chunk = m.get("chunk") if local else None
        self.softcap = m.get("attn_softcap")
        self.scale = (m.get("query_pre_attn_scalar") or d) ** -0.5
        # GPT-OSS sinks: a learned logit per head in every row's softmax, no value
        self.sinks = nn.Parameter(torch.zeros(m["heads"])) if m.get("sinks") else None
        self.dropout = m.get("attention_dropout", 0.0)
        self.wq = nn.Linear(h, m["heads"] * d, bias=m["qkv_bias"])
        self.wk = nn.Linear(h, m["kv_heads"] * d, bias=m["qkv_bias"])
        self.wv = nn.Linear(h, m["kv_heads"] * d, bias=m["qkv_bias"])
        self.wo = nn.Linear(m["heads"] * d, h, bias=m["out_bias"])
        if m["qk_norm"]:
            self.q_norm, self.k_norm = _norm(d, m), _norm(d, m)
        else:
            self.q_norm = self.k_norm = None
        self.cp = None  # (group, positions of the local tokens) when context parallel

    def _core(self, q, k, v):
        if self.cp is not None:
            return ring_attention(q, k, v, self.cp[0], self.scale)
        return attention_core(q, k, v, eager=self.kind == "eager", scale=self.scale, dropout=self.dropout, training=self.training,
                              window=self.window, chunk=self.chunk, softcap=self.softcap, sinks=self.sinks)

    def forward(self, x):
        b, s, _ = x.shape
        d = self.head_dim
        q = self.wq(x).view(b, s, -1, d)  # local heads under tp: the column split keeps whole heads
        k = self.wk(x).view(b, s, -1, d)
        v = self.wv(x).view(b, s, -1, d)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope:
            pos = self.cp[1] if self.cp is not None else torch.arange(s, device=x.device)
            cos, sin = rope_tables(pos, d, q.dtype)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        rep = q.shape[1] // k.shape[1]
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = self._core(q, k, v)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class MLAttention(nn.Module):
    """Multi-head latent attention (DeepSeek-V2/V3; torchtitan's deepseek_v3 names): wq_a, q_norm,
    wq_b (or one wq), wkv_a (the latent and the rope key shared by all heads), kv_norm, wkv_b (each
    head's key part without rope and its value), wo; rotary on the rope parts only."""

    def __init__(self, m: dict, attention: str):
        super().__init__()
        a, h, n = m["mla"], m["hidden"], m["heads"]
        self.a, self.kind, self.heads = a, attention, n
        self.qk = a["nope"] + a["rope"]
        if a["q_lora"] is None:
            self.wq = nn.Linear(h, n * self.qk, bias=False)
        else:
            self.wq_a = nn.Linear(h, a["q_lora"], bias=m["qkv_bias"])
            self.q_norm = _norm(a["q_lora"], m)
            self.wq_b = nn.Linear(a["q_lora"], n * self.qk, bias=False)
        self.wkv_a = nn.Linear(h, a["kv_lora"] + a["rope"], bias=m["qkv_bias"])
        self.kv_norm = _norm(a["kv_lora"], m)
        self.wkv_b = nn.Linear(a["kv_lora"], n * (a["nope"] + a["v"]), bias=False)
        self.wo = nn.Linear(n * a["v"], h, bias=m["out_bias"])
        self.dropout = m.get("attention_dropout", 0.0)
        self.cp = None  # the planner refuses MLA under cp (slices.unsupported)

    def _core(self, q, k, v):
        return attention_core(q, k, v, eager=self.kind == "eager", scale=1.0 / math.sqrt(self.qk), dropout=self.dropout,
                              training=self.training)

    def forward(self, x):
        a, n = self.a, self.heads
        b, s, _ = x.shape
        q = self.wq(x) if a["q_lora"] is None else self.wq_b(self.q_norm(self.wq_a(x)))
        q_nope, q_rope = q.view(b, s, n, self.qk).split([a["nope"], a["rope"]], dim=-1)
        latent, k_rope = self.wkv_a(x).split([a["kv_lora"], a["rope"]], dim=-1)
        k_nope, v = self.wkv_b(self.kv_norm(latent)).view(b, s, n, -1).split([a["nope"], a["v"]], dim=-1)
        cos, sin = rope_tables(torch.arange(s, device=x.device), a["rope"], q.dtype)
        q_rope = q_rope * cos + _rotate_half(q_rope) * sin
        k_rope = k_rope[:, :, None, :] * cos + _rotate_half(k_rope[:, :, None, :]) * sin
        q = torch.cat([q_nope, q_rope], dim=-1).transpose(1, 2)
        k = torch.cat([k_nope, k_rope.expand(b, s, n, a["rope"])], dim=-1).transpose(1, 2)
        v = v.transpose(1, 2)
        out = self._core(q, k, v)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


GATED = ("swiglu", "geglu")  # mlp kinds with a gate matrix beside the up matrix


def activation(x, kind: str):
    """The MLP activation by the spec's mlp kind: of the gate for SwiGLU (silu) and GeGLU
    (tanh-approximated GELU, Gemma), of the one matrix for GELU and squared ReLU (Nemotron-4)."""
    if kind == "squared_relu":
        return torch.pow(F.relu(x), 2)
    if kind == "swiglu":
        return F.silu(x)
    if kind == "geglu":
        return F.gelu(x, approximate="tanh")
    return F.gelu(x)


def glu(gate, up, kind: str, clamp: tuple[float, float] | None):
    """A gated MLP's hidden activation from its gate and up projections: activation(gate)·up, or
    GPT-OSS's clamped SwiGLU for clamp = (limit, alpha): gate clamped above at limit, up to ±limit,
    gate·sigmoid(alpha·gate)·(up + 1) (transformers v5.24.0 modeling_gpt_oss.py GptOssExperts)."""
    if clamp is None:
        return activation(gate, kind) * up
    limit, alpha = clamp
    gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    return gate * torch.sigmoid(alpha * gate) * (up + 1)


def _clamp(m: dict) -> tuple[float, float] | None:
    return (m["swiglu_limit"], m["swiglu_alpha"]) if m.get("swiglu_limit") else None


class MLP(nn.Module):
    """SwiGLU and GeGLU as gate (w1), up (w3) and down (w2) matrices, torchtitan's names; GELU or
    squared ReLU as w1, w2. `act` is the spec's mlp kind (activation)."""

    def __init__(self, h: int, ffn: int, act: str, bias: bool, clamp: tuple[float, float] | None = None):
        super().__init__()
        self.w1 = nn.Linear(h, ffn, bias=bias)
        self.w2 = nn.Linear(ffn, h, bias=bias)
        self.w3 = nn.Linear(h, ffn, bias=bias) if act in GATED else None
        self.act, self.clamp = act, clamp

    def forward(self, x):
        if self.w3 is not None:
            return self.w2(glu(self.w1(x), self.w3(x), self.act, self.clamp))
        return self.w2(activation(self.w1(x), self.act))


class Experts(nn.Module):
    """The routed experts held by one ep rank, stacked: w1/w3 (E_local, h, ffn), w2 (E_local, ffn, h)."""

    running = False  # inside forward: sac_policy recomputes these matmuls as torchtitan's grouped GEMM

    def __init__(self, n: int, h: int, ffn: int, act: str, bias: bool, clamp: tuple[float, float] | None = None):
        super().__init__()
        self.act, self.clamp = act, clamp
        gated = act in GATED
        self.w1 = nn.Parameter(torch.empty(n, h, ffn))
        self.w2 = nn.Parameter(torch.empty(n, ffn, h))
        self.w3 = nn.Parameter(torch.empty(n, h, ffn)) if gated else None
        self.b1 = nn.Parameter(torch.zeros(n, ffn)) if bias else None
        self.b2 = nn.Parameter(torch.zeros(n, h)) if bias else None
        self.b3 = nn.Parameter(torch.zeros(n, ffn)) if bias and gated else None

    def forward(self, x, splits: list[int]):
        """Token rows grouped by local expert (`splits` rows each) -> each expert's output, same order.
        A module call, so FSDP's hooks gather the stacked weights around it."""
        outs = []
        Experts.running = True
        try:
            for e, xe in enumerate(x.split(splits)):
                a = xe @ self.w1[e] + (self.b1[e] if self.b1 is not None else 0)
                if self.w3 is not None:
                    a = glu(a, xe @ self.w3[e] + (self.b3[e] if self.b3 is not None else 0), self.act, self.clamp)
                else:
                    a = activation(a, self.act)
                outs.append(a @ self.w2[e] + (self.b2[e] if self.b2 is not None else 0))
        finally:
            Experts.running = False
        return torch.cat(outs)


class MoE(nn.Module):
    """Router (softmax, top-k, weights not renormalised: Mixtral/torch_model; or DeepSeek-V3's sigmoid
    scores, renormalised and scaled), routed experts split
    over ep, and shared experts. With ep > 1 the routed token copies are sorted by expert and sent to
    the expert's rank with an all-to-all, and the outputs come back with the reverse one."""

    def __init__(self, m: dict, ep: int):
        super().__init__()
        moe, h = m["moe"], m["hidden"]
        self.num_experts, self.top_k, self.ep = moe["experts"], moe["top_k"], ep
        self.local = moe["experts"] // ep
        self.router = nn.Linear(h, moe["experts"], bias=moe.get("router_bias", False))
        self.experts = Experts(self.local, h, moe["ffn"], m["mlp"], m["mlp_bias"], _clamp(m))
        self.shared = nn.ModuleList(MLP(h, moe["shared_ffn"], m["mlp"], m["mlp_bias"], _clamp(m)) for _ in range(moe["shared"]))
        # sigmoid scores, renormalised over the chosen experts and scaled (DeepSeek-V3's router; its
        # group limit and balancing bias change which experts a token visits, not the work)
        self.sigmoid = moe.get("score") == "sigmoid"
        self.renormalize, self.scale = moe.get("renormalize", False), moe.get("scale", 1.0)
        self.shared_gate = nn.Linear(h, 1, bias=False) if moe["shared_gate"] else None
        self.ep_group = None

    def forward(self, x):
        b, s, h = x.shape
        flat = x.reshape(-1, h)
        logits = self.router(flat).float()
        probs = torch.sigmoid(logits) if self.sigmoid else torch.softmax(logits, dim=-1)
        weights, chosen = probs.topk(self.top_k, dim=-1)
        if self.sigmoid and self.renormalize:
            weights = weights / weights.sum(-1, keepdim=True)
        if self.scale != 1.0:
            weights = weights * self.scale
        order = chosen.reshape(-1).argsort(stable=True)
        token = order // self.top_k
        routed = flat[token]  # token copies sorted by expert
        counts = torch.bincount(chosen.reshape(-1), minlength=self.num_experts)
        if self.ep_group is None:
            back = self.experts(routed, counts.tolist())
        else:
            back = self._dispatch(routed, counts)
        out = torch.zeros_like(flat).index_add(0, token, back * weights.reshape(-1)[order, None].to(flat.dtype))
        for shared in self.shared:
            y = shared(flat)
            if self.shared_gate is not None:
                y = y * torch.sigmoid(self.shared_gate(flat))
            out = out + y
        return out.view(b, s, h)

    def _dispatch(self, routed, counts):
        from torch.distributed._functional_collectives import all_to_all_single_autograd

        ep, n = self.ep, self.local
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts, group=self.ep_group)
        send_split = counts.view(ep, n).sum(1).tolist()
        recv_split = recv_counts.view(ep, n).sum(1).tolist()
        recv = all_to_all_single_autograd(routed, recv_split, send_split, self.ep_group)
        grid = recv_counts.view(ep, n).tolist()  # [source rank][local expert]
        pieces = list(recv.split([c for row in grid for c in row]))
        by_expert = torch.cat([pieces[src * n + e] for e in range(n) for src in range(ep)])
        sizes = [sum(grid[src][e] for src in range(ep)) for e in range(n)]
        outs = self.experts(by_expert, sizes).split(sizes)
        per_src = [list(o.split([grid[src][e] for src in range(ep)])) for e, o in enumerate(outs)]
        regrouped = torch.cat([per_src[e][src] for src in range(ep) for e in range(n)])
        return all_to_all_single_autograd(regrouped, send_split, recv_split, self.ep_group)


def _segment_sums(a):
    """Σ_{j<k<=i} a_k for every i >= j along the last axis, -inf above the diagonal: out[..., i, j]."""
    n = a.shape[-1]
    tiled = a[..., :, None].expand(*a.shape, n)  # [..., k, j] = a_k
    tiled = tiled.masked_fill(~torch.ones(n, n, dtype=torch.bool, device=a.device).tril(-1), 0.0)  # a_k where k > j
    sums = tiled.cumsum(dim=-2)  # [..., i, j] = Σ_{j<k<=i} a_k
    return sums.masked_fill(~torch.ones(n, n, dtype=torch.bool, device=a.device).tril(), float("-inf"))


def ssd_scan(x, a, B, C, chunk: int):
    """The SSD scan of Mamba-2 by chunks of `chunk` steps (Dao & Gu 2024, arXiv 2405.21060, Sec. 6):
    y_i = Σ_{j<=i} exp(Σ_{j<k<=i} a_k) (C_i·B_j) x_j, per head. Inside a chunk, the quadratic (dual)
    form; between chunks, each chunk's final state carried by its decay. x (b, s, heads, p) already
    multiplied by dt, a = dt·A (b, s, heads), B and C (b, s, heads, n). One chunk is the dual form."""
    b, s, hh, p = x.shape
    q = min(chunk, s)
    pad = -s % q
    if pad:  # zero steps at the end: causal, so the first s outputs do not see them
        x, a, B, C = (F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad)) for t in (x, a, B, C))
    c = x.shape[1] // q
    x, B, C = (t.reshape(b, c, q, hh, t.shape[-1]) for t in (x, B, C))
    a = a.reshape(b, c, q, hh).permute(0, 3, 1, 2)  # (b, heads, chunks, q)
    cum = a.cumsum(dim=-1)
    # within each chunk: the dual form
    decay = torch.exp(_segment_sums(a))  # (b, heads, chunks, i, j)
    y = torch.einsum("bcihn,bcjhn,bhcij,bcjhp->bcihp", C, B, decay, x)
    # each chunk's state at its end, then the states entering each chunk (a recurrence over chunks)
    to_end = torch.exp(cum[..., -1:] - cum)  # (b, heads, chunks, q)
    states = torch.einsum("bcjhn,bhcj,bcjhp->bchpn", B, to_end, x)
    states = torch.cat([torch.zeros_like(states[:, :1]), states], dim=1)
    across = torch.exp(_segment_sums(F.pad(cum[..., -1], (1, 0))))  # (b, heads, chunks + 1, chunks + 1)
    entering = torch.einsum("bhzc,bchpn->bzhpn", across, states)[:, :-1]
    y = y + torch.einsum("bcihn,bchpn,bhci->bcihp", C, entering, torch.exp(cum))
    return y.reshape(b, c * q, hh, p)[:, :s]


class GatedNorm(nn.Module):
    """Mamba-2's output norm: RMSNorm of y·silu(z) over groups of width/groups channels, in fp32
    (transformers v5.23.0 MambaRMSNormGated; Megatron's RMSNormGated with group_size inner/ngroups)."""

    def __init__(self, width: int, groups: int, eps: float):
        super().__init__()
        self.groups, self.eps = groups, eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, y, z):
        b, s, w = y.shape
        g = (y.float() * F.silu(z.float())).reshape(b, s, self.groups, w // self.groups)
        g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * g.reshape(b, s, w)


class Mamba2(nn.Module):
    """A Mamba-2 mixer with the parameters of transformers' NemotronHMamba2Mixer: in_proj to [z, x,
    B, C, dt], a depthwise causal conv1d over [x, B, C] with silu, dt = softplus(dt + dt_bias),
    A = -exp(A_log), the chunked SSD scan (ssd_scan) plus D·x, the gated group norm and out_proj.
    `mb` holds the dimensions (slices.model_doc): heads, head_dim, state, groups, conv_kernel,
    chunk, conv_bias, proj_bias. The scan runs in fp32."""

    def __init__(self, h: int, mb: dict, eps: float):
        super().__init__()
        self.mb = mb
        inner, hh, gn = mb["heads"] * mb["head_dim"], mb["heads"], mb["groups"] * mb["state"]
        self.split = [inner, inner + 2 * gn, hh]  # z, [x, B, C], dt
        conv = inner + 2 * gn
        self.in_proj = nn.Linear(h, sum(self.split), bias=mb["proj_bias"])
        self.conv1d = nn.Conv1d(conv, conv, mb["conv_kernel"], groups=conv, padding=mb["conv_kernel"] - 1, bias=mb["conv_bias"])
        self.dt_bias = nn.Parameter(torch.ones(hh))
        self.A_log = nn.Parameter(torch.zeros(hh))
        self.D = nn.Parameter(torch.ones(hh))
        self.norm = GatedNorm(inner, mb["groups"], eps)
        self.out_proj = nn.Linear(inner, h, bias=mb["proj_bias"])

    def forward(self, u):
        mb = self.mb
        b, s, _ = u.shape
        hh, p, n, g = mb["heads"], mb["head_dim"], mb["state"], mb["groups"]
        z, xbc, dt = self.in_proj(u).split(self.split, dim=-1)
        xbc = F.silu(self.conv1d(xbc.transpose(1, 2))[..., :s].transpose(1, 2))
        x, B, C = xbc.split([hh * p, g * n, g * n], dim=-1)
        x = x.reshape(b, s, hh, p).float()
        B = B.reshape(b, s, g, n).float().repeat_interleave(hh // g, dim=2)  # (b, s, heads, n)
        C = C.reshape(b, s, g, n).float().repeat_interleave(hh // g, dim=2)
        dt = F.softplus(dt.float() + self.dt_bias.float())  # (b, s, heads)
        y = ssd_scan(x * dt[..., None], dt * -torch.exp(self.A_log.float()), B, C, mb["chunk"])
        y = (y + self.D.float()[:, None] * x).reshape(b, s, hh * p)
        return self.out_proj(self.norm(y, z).to(u.dtype))


class HybridBlock(nn.Module):
    """One layer of a hybrid model (Nemotron-H): a norm, then one block by the pattern's character
    (M Mamba-2, * attention, - MLP, E MoE), with its residual."""

    def __init__(self, m: dict, layer_id: int, run: dict):
        super().__init__()
        self.dropout = m.get("hidden_dropout", 0.0)
        self.norm = _norm(m["hidden"], m)
        kind = m["hybrid"][layer_id]
        if kind == "M":
            self.mixer = Mamba2(m["hidden"], m["mamba"], m.get("norm_eps", 1e-5))
        elif kind == "*":
            self.mixer = Attention(m, run.get("attention", "flash"), layer_id)
        elif kind == "E":
            self.mixer = MoE(m, run["mesh"]["ep"])
        else:
            self.mixer = MLP(m["hidden"], m["ffn"], m["mlp"], m["mlp_bias"], _clamp(m))
        # the attributes apply_tp, the cp set-up and the ep set-up and apply_fsdp reach for
        self.attn = self.mixer if kind == "*" else None
        self.mlp = self.mixer if kind == "E" else None

    def forward(self, x):
        return x + F.dropout(self.mixer(self.norm(x)), self.dropout, self.training)


class Block(nn.Module):
    def __init__(self, m: dict, layer_id: int, run: dict):
        super().__init__()
        self.dropout = m.get("hidden_dropout", 0.0)
        self.attn_norm = _norm(m["hidden"], m)
        if m.get("mla"):
            self.attn = MLAttention(m, run.get("attention", "flash"))
        else:
            self.attn = Attention(m, run.get("attention", "flash"), layer_id)
        self.mlp_norm = _norm(m["hidden"], m)
        if layer_id in m["moe_layers"]:
            self.mlp = MoE(m, run["mesh"]["ep"])
        else:
            self.mlp = MLP(m["hidden"], m["ffn"], m["mlp"], m["mlp_bias"], _clamp(m))
        # Gemma's sandwich norms: the attention and MLP outputs are normed before the residual add
        sandwich = m.get("sandwich_norms", False)
        self.post_attn_norm = _norm(m["hidden"], m) if sandwich else None
        self.post_mlp_norm = _norm(m["hidden"], m) if sandwich else None

    def forward(self, x):
        a = self.attn(self.attn_norm(x))
        x = x + F.dropout(a if self.post_attn_norm is None else self.post_attn_norm(a), self.dropout, self.training)
        y = self.mlp(self.mlp_norm(x))
        return x + F.dropout(y if self.post_mlp_norm is None else self.post_mlp_norm(y), self.dropout, self.training)


class Stage(nn.Module):
    """The layers of one pipeline stage (all of them without a pipeline): the embedding on the first,
    the final norm and output layer on the last. Layers are keyed by their global id, so a stage's
    parameter names are the full model's."""

    def __init__(self, m: dict, layer_ids, run: dict, *, first: bool, last: bool):
        super().__init__()
        h = m["hidden"]
        self.first, self.last = first, last
        self.embed = nn.Embedding(m["vocab"], h) if first else None
        self.pos = nn.Embedding(m["max_positions"], h) if first and m["positions"] == "learned" else None
        self.embed_norm = _norm(h, m) if first and m["embedding_norm"] else None
        self.embed_scale = math.sqrt(h) if m.get("scale_embedding") else None
        self.final_softcap = m.get("final_softcap")
        block = HybridBlock if m.get("hybrid") else Block
        self.layers = nn.ModuleDict({str(i): block(m, i, run) for i in layer_ids})
        self.norm = _norm(h, m) if last else None
        self.output = nn.Linear(h, m["vocab"], bias=False) if last else None
        self.tied = last and first and m["tie"]  # refused with a pipeline or tp (slices.REFUSALS)
        self.tie()
        self.dropout = m.get("hidden_dropout", 0.0)
        self.cp_positions = None
        self.autocast_dtype = None  # the compute dtype when autocast runs (no FSDP mixed precision)

    def tie(self) -> None:
        """The output layer uses the embedding's parameter. Module.to_empty gives a plain parameter
        on the meta device a new Parameter in each module that holds it (torch 2.13.0
        torch/nn/modules/module.py Module._apply L957-1004: a meta and a device tensor are not of
        compatible shallow-copy types), so a model built on the meta device is re-tied after it, as
        torchtitan re-ties before initialising (pytorch/torchtitan@b5bcd76c
        torchtitan/models/common/decoder.py:261-273, after to_empty in torchtitan/trainer.py:461-466
        and 489-493). FSDP2's DTensor parameters are swapped in place by the same _apply and stay tied."""
        if self.tied and self.output.weight is not self.embed.weight:
            self.output.weight = self.embed.weight

    def forward(self, x):
        # autocast here, inside the module, and not around the caller: a pipeline schedule calls
        # each stage's forward itself, so a context around the training step would not reach it
        if self.autocast_dtype is None:
            return self._forward(x)
        with torch.autocast(x.device.type, dtype=self.autocast_dtype):
            return self._forward(x)

    def _forward(self, x):
        if self.embed is not None:
            tokens = x
            x = self.embed(tokens)
            if self.embed_scale is not None:
                x = x * self.embed_scale
            if self.pos is not None:
                pos = self.cp_positions if self.cp_positions is not None else torch.arange(tokens.shape[1], device=x.device)
                x = x + self.pos(pos)
            if self.embed_norm is not None:
                x = self.embed_norm(x)
            x = F.dropout(x, self.dropout, self.training)
        for layer in self.layers.values():
            x = layer(x)
        if self.output is not None:
            x = self.output(self.norm(x))
            if self.final_softcap is not None:
                x = self.final_softcap * torch.tanh(x / self.final_softcap)
        return x


def _parent(name: str) -> str:
    """The module a parameter belongs to, by its dotted name ("experts" for "layers.0.moe.experts.w1")."""
    return name.rsplit(".", 2)[-2] if name.count(".") else ""


def _init_kind(module: nn.Module, name: str) -> str:
    """How a parameter of `module` starts, by its name: "zero" (biases, and the weight of a (1 + w)
    norm, which then scales by 1 as Gemma's RMSNorm and torch_model.Norm start), "one" (other norm
    weights) or "normal" (the rest)."""
    leaf, parent = name.rsplit(".", 1)[-1], _parent(name)
    if leaf == "bias" or (parent == "experts" and leaf.startswith("b")):
        return "zero"
    if "norm" in parent and leaf == "weight":
        return "zero" if getattr(module.get_submodule(name.rpartition(".")[0]), "one_plus", False) else "one"
    return "normal"


def init_local(module: nn.Module, seed: int) -> None:
    """Draw only this rank's shards (timing runs): the same distributions as init_parameters."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            t = _local(p)
            kind = _init_kind(module, name)
            if kind == "zero":
                t.zero_()
            elif kind == "one":
                t.fill_(1.0)
            else:
                t.copy_(torch.empty(t.shape, dtype=torch.float32).normal_(0.0, INIT_STD, generator=gen))


def init_parameters(module: nn.Module, seed: int, expert_slice: tuple[int, int] | None = None) -> None:
    """Deterministic init by parameter name, so that every rank, stage and the single-process
    reference get identical full tensors: matrices N(0, 0.02), norm scales 1, biases 0. Routed
    experts are drawn full (all experts) and sliced to this ep rank's block."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            kind = _init_kind(module, name)
            if kind == "zero":
                p.zero_()
            elif kind == "one":
                p.fill_(1.0)
            else:
                gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
                if _parent(name) == "experts" and expert_slice is not None:
                    ep, rank = expert_slice
                    full = torch.empty((p.shape[0] * ep, *p.shape[1:]), dtype=torch.float32).normal_(0.0, INIT_STD, generator=gen)
                    p.copy_(full[rank * p.shape[0] : (rank + 1) * p.shape[0]])
                else:
                    p.copy_(torch.empty(p.shape, dtype=torch.float32).normal_(0.0, INIT_STD, generator=gen))


# --------------------------------------------------------------------------------------------------
# data and reference


def batch(run: dict, step: int, device="cpu"):
    """The global batch of one step: random tokens (inputs) and the next tokens (targets)."""
    gen = torch.Generator().manual_seed(run["seed"] * 7919 + step)
    tokens = torch.randint(0, run["model"]["vocab"], (run["global_batch"], run["seq_len"] + 1), generator=gen)
    return tokens[:, :-1].to(device), tokens[:, 1:].to(device)


def loss_fn(logits, targets):
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


# torch.optim's arguments for each implementation slices.OPTIMIZER_IMPLEMENTATION names
IMPLEMENTATION_ARGS = {"fused": {"fused": True}, "foreach": {"foreach": True}, "for-loop": {"foreach": False}}


def param_groups(params) -> list[dict]:
    """The parameters in one group per mesh (plain tensors in a group of their own): torch's fused and
    foreach kernels take a group's tensors in one call, which refuses plain tensors beside DTensors
    (a norm that tp without sp leaves whole, beside tp-sharded matrices). Each tensor is updated by
    the same kernel either way; only the launches are split by group."""
    groups: dict = {}
    for p in params:
        groups.setdefault(getattr(p, "device_mesh", None), []).append(p)
    return [{"params": ps} for ps in groups.values()]


def make_optimizer(params, opt: dict):
    """The optimizer of opt["kind"], run by the implementation opt["implementation"] (the one the
    plan's framework runs)."""
    impl = IMPLEMENTATION_ARGS[opt["implementation"]]
    params = param_groups(params)
    if opt["kind"] == "sgd":
        return torch.optim.SGD(params, lr=opt["lr"], momentum=opt.get("momentum", 0.9), weight_decay=opt["weight_decay"], **impl)
    if opt["kind"] == "decoupled_adamw":
        # Composer's DecoupledAdamW updates one tensor and one op at a time: torch's single-tensor
        # AdamW (foreach=False) runs the same per-tensor ops. Composer decays by wd·lr/initial_lr
        # (composer@v0.16.4 composer/optim/decoupled_weight_decay.py L243-246), torch by lr·wd':
        # wd' = wd/lr gives the same decay at the worker's constant learning rate
        return torch.optim.AdamW(params, lr=opt["lr"], betas=tuple(opt["betas"]), eps=opt["eps"],
                                 weight_decay=opt["weight_decay"] / opt["lr"], **impl)
    cls = torch.optim.AdamW if opt["kind"] == "adamw" else torch.optim.Adam
    return cls(params, lr=opt["lr"], betas=tuple(opt["betas"]), eps=opt["eps"], weight_decay=opt["weight_decay"], **impl)


def reference(run: dict) -> dict:
    """The same training in one process on the whole global batch: per-step losses, the first
    step's gradients and the weights after the last step (fp32, CPU)."""
    torch.manual_seed(run["seed"])
    m = run["model"]
    one = dict(run, mesh=dict(run["mesh"], ep=1), recompute={"full_layers": [], "selective": False})
    model = Stage(m, range(m["layers"]), one, first=True, last=True)
    init_parameters(model, run["seed"])
    opt = make_optimizer(model.parameters(), run["optimizer"])
    losses, grads = [], {}
    for step in range(run["warmup"] + run["unprofiled_steps"] + run["steps"]):
        x, y = batch(run, step)
        loss = loss_fn(model(x), y)
        loss.backward()
        if step == 0:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return {"losses": losses, "grads": grads, "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


# --------------------------------------------------------------------------------------------------
# process groups and mesh


def _thread_ids() -> set[int]:
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:
        return set()


class Groups:
    """Creates every process group itself (each rank calls new_group for every group, as c10d
    requires) and remembers which gloo worker threads each group of this rank started, so that the
    profiler's `gloo:*` events, which carry no group, can be attributed to a mesh dimension."""

    def __init__(self, rank: int):
        self.rank = rank
        self.thread_kind: dict[int, str] = {}
        self.name_kind: dict[str, str] = {}  # process group name (the profiler's "Process Group Name") -> kind

    def new(self, ranks: list[int], kind: str, desc: str):
        before = _thread_ids()
        g = dist.new_group(ranks, group_desc=desc)
        new = _thread_ids() - before
        if self.rank in ranks:
            for t in new:
                self.thread_kind[t] = kind
            self.name_kind[g.group_name] = kind
            return g
        return None


KIND_OF_DIM = {"pp": "pp", "dp_replicate": "dp", "dp_shard": "dp", "dp_shard_out": "dp", "dp_dense": "dp", "ep": "ep", "cp": "cp",
               "tp": "tp", "sync": "sync"}


def mesh_dims(run: dict) -> list[tuple[str, int]]:
    ms = run["mesh"]
    dims = [("pp", ms["pp"]), ("dp_replicate", ms["dp_replicate"])]
    if ms["ep"] > 1:
        dims += [("dp_shard_out", ms["dp_shard"] // ms["ep"]), ("ep", ms["ep"])]
    else:
        dims += [("dp_shard", ms["dp_shard"])]
    return dims + [("cp", ms["cp"]), ("tp", ms["tp"])]


def build_mesh(run: dict, groups: Groups, device_type: str):
    """The run's DeviceMesh from groups made here, and the dense-parameter FSDP mesh: dp_shard x cp
    (and ep, which torchtitan carves out of dp_shard) flattened into one dimension "dp_dense" of the
    same root mesh (torchtitan's dp_shard_cp). One root matters: FSDP2 over a tp-sharded DTensor
    joins its mesh with the tp mesh (DeviceMesh._concatenate), which refuses meshes of two roots."""
    from torch.distributed.device_mesh import DeviceMesh

    dims = mesh_dims(run)
    names = tuple(n for n, _ in dims)
    sizes = [s for _, s in dims]
    world = math.prod(sizes)
    grid = torch.arange(world).view(*sizes)
    dim_groups = []
    for i, name in enumerate(names):
        lines = grid.transpose(i, -1).reshape(-1, sizes[i]).tolist()
        mine = None
        for line in lines:
            g = groups.new(line, KIND_OF_DIM[name], f"validate_{name}")
            if g is not None:
                mine = g
        dim_groups.append(mine)
    mesh = DeviceMesh.from_group(dim_groups, device_type, mesh=grid, mesh_dim_names=names)
    flat = tuple(n for n in names if n in ("dp_shard", "dp_shard_out", "ep", "cp"))
    # DeviceMesh makes the flattened dimension's groups itself (group_desc "mesh_dp_dense"); the
    # gloo threads they start are recorded as dp here
    before = _thread_ids()
    dense = mesh[flat]._flatten("dp_dense")
    for t in _thread_ids() - before:
        groups.thread_kind[t] = "dp"
    groups.name_kind[dense.get_group().group_name] = "dp"
    return mesh, dense


# --------------------------------------------------------------------------------------------------
# parallelism


def apply_tp(stage: Stage, tp_mesh, sp: bool) -> None:
    """torchtitan's llama plan (torchtitan/models/llama3/infra/parallelize.py apply_tp)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    seq = Shard(1) if sp else Replicate()
    top = {}
    if stage.embed is not None:
        top["embed"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
    if stage.output is not None:
        if sp:
            top["norm"] = SequenceParallel()
        top["output"] = ColwiseParallel(input_layouts=seq, output_layouts=Replicate())
    if top:
        parallelize_module(stage, tp_mesh, top)
    for block in stage.layers.values():
        plan = {
            "attn": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
            "attn.wq": ColwiseParallel(),
            "attn.wk": ColwiseParallel(),
            "attn.wv": ColwiseParallel(),
            "attn.wo": RowwiseParallel(output_layouts=seq),
            "mlp": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
            "mlp.w1": ColwiseParallel(),
            "mlp.w2": RowwiseParallel(output_layouts=seq),
        }
        if block.mlp.w3 is not None:
            plan["mlp.w3"] = ColwiseParallel()
        if sp:
            plan["attn_norm"] = SequenceParallel()
            plan["mlp_norm"] = SequenceParallel()
            if block.post_attn_norm is not None:
                # their output joins the (local, sequence-sharded) residual stream directly
                plan["post_attn_norm"] = SequenceParallel(use_local_output=True)
                plan["post_mlp_norm"] = SequenceParallel(use_local_output=True)
        parallelize_module(block, tp_mesh, plan)


def keep_grad_layout(module: nn.Module) -> None:
    """Give each DTensor gradient its parameter's placements after accumulation. DTensor's embedding
    backward returns a replicated gradient for a row-sharded (vocab-parallel) table; FSDP would
    reduce-scatter it, and without FSDP this keeps the shard, as Megatron's vocab-parallel embedding
    does (the redistribution from Replicate to Shard is a local slice)."""
    for p in module.parameters():
        if hasattr(p, "placements"):

            def hook(param):
                g = param.grad
                if g is not None and hasattr(g, "placements") and g.placements != param.placements:
                    param.grad = g.redistribute(param.device_mesh, param.placements)

            p.register_post_accumulate_grad_hook(hook)


def sac_save_ops() -> set:
    """The ops whose outputs torchtitan's per-op selective checkpointing saves (pytorch/torchtitan@b5bcd76c
    torchtitan/distributed/activation_checkpoint.py L31-94 _get_default_save_ops): the partitioner's
    compute-intensive ops (get_default_op_list, torch/_functorch/partitioners.py L2971-2983 in torch
    2.13.0, listed here: importing the partitioner takes seconds), cuDNN and math SDPA, max, linear,
    topk, flex attention, and the reduce-scatter and all-to-all collectives. Ops absent from this
    torch build are skipped, as there. The CPU flash kernel, which SDPA runs in place of the CUDA
    flash kernel on CPU, is saved as that kernel is."""
    aten, funcol = torch.ops.aten, torch.ops._c10d_functional
    named = [(aten, n) for n in (
        # get_default_op_list().compute_intensive_ops
        "mm", "convolution", "convolution_backward", "bmm", "addmm", "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention", "_flash_attention_forward", "_efficient_attention_forward",
        "upsample_bilinear2d", "_scaled_mm",
        # torchtitan's own
        "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_attention_math",
        "_scaled_dot_product_fused_attention_overrideable", "max", "linear", "topk",
        "_scaled_dot_product_flash_attention_for_cpu")]
    named += [(funcol, "reduce_scatter_tensor"), (funcol, "all_to_all_single")]
    ops = set()
    for owner, name in named:
        try:
            ops.add(getattr(owner, name).default)
        except AttributeError:
            pass
    ops.add(torch._higher_order_ops.flex_attention)
    return ops


def sac_policy(save_ops: set, forced: set):
    """A fresh policy for one checkpointed forward, torchtitan's SelectiveAC (L243-276 there): save the
    outputs of `save_ops` except every second mm (counted in forward order through the block, the
    recomputation keeping its own count), recompute everything else; an mm whose weight has a shape in
    `forced` (the MoE router's, torchtitan's default force_recompute_mm_shapes_by_fqns
    ["moe.router.gate"], L196-198) is recomputed and not counted; device-to-host copies are saved.
    The routed experts' matmuls are recomputed and not counted: torchtitan runs them as one
    torch._grouped_mm (torchtitan/models/common/moe.py L110-120), an op outside the saved set."""
    from torch.utils.checkpoint import CheckpointPolicy

    mm_ops = (torch.ops.aten.mm.default, torch.ops.aten.linear.default)
    count = {False: 0, True: 0}  # ctx.is_recompute -> matmuls seen

    def policy(ctx, func, *args, **kwargs):
        if (func == torch.ops.aten._to_copy.default and "cuda" in str(args[0].device)
                and str(kwargs.get("device", "")) == "cpu"):
            return CheckpointPolicy.MUST_SAVE
        if func in mm_ops:
            w = args[1].shape
            if func == torch.ops.aten.linear.default:
                w = torch.Size((w[1], w[0]))  # linear's weight is (out, in), an mm's operand (in, out)
            if w in forced or Experts.running:
                return CheckpointPolicy.PREFER_RECOMPUTE
            count[ctx.is_recompute] += 1
        if func in save_ops:
            if func in mm_ops and count[ctx.is_recompute] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def apply_recompute(stage: Stage, full_layers: set[int], selective: bool) -> None:
    """Full recompute of the planned layers; selective: every block under torchtitan's per-op policy
    (sac_policy), wrapped as torchtitan wraps it (checkpoint_wrapper with a context_fn, RNG state
    preserved, no early stop: activation_checkpoint.py L278-287 at the commit above)."""
    import torch.utils.checkpoint as checkpoint_module
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    save_ops = sac_save_ops() if selective else set()
    # Profiler annotations are not computation: SAC replays ops by their count, and FSDP's hooks on
    # a module inside the block (MoE experts over their own mesh) can annotate a recomputation a
    # different number of times than the forward, which fails the replay (pytorch/torchtitan#3427);
    # ignored as pytorch/pytorch#196862 proposes
    if selective:
        checkpoint_module.SAC_IGNORED_OPS.update({torch.ops.profiler._record_function_enter_new.default,
                                                  torch.ops.profiler._record_function_exit._RecordFunction})
    for key in list(stage.layers.keys()):
        block = stage.layers[key]
        if int(key) in full_layers:
            stage.layers[key] = checkpoint_wrapper(block, preserve_rng_state=False)
        elif selective:
            forced = {torch.Size((m.router.in_features, m.router.out_features)) for m in block.modules() if isinstance(m, MoE)}
            stage.layers[key] = checkpoint_wrapper(
                block, context_fn=lambda forced=forced: create_selective_checkpoint_contexts(sac_policy(save_ops, forced)),
                preserve_rng_state=True, early_stop=False)


def apply_fsdp(stage: Stage, fsdp_mesh, expert_mesh, run: dict, dtype: torch.dtype) -> None:
    """FSDP2 per block, then the root (torchtitan apply_fsdp): zero 3 reshards after forward without
    a pipeline, zero 2 (and any pipeline) keeps the gathered parameters until backward. Experts are
    sharded over their own (expert-dp) mesh first, their gradients divided by the dense group's size.
    With the run's fsdp_split_root (torchtitan from 83e69410 on, v0.2.2 parallelize.py:333-357) the
    token embedding is a unit of its own, resharded as the blocks are, and [norm, output] one kept
    gathered from its forward to its backward; the root keeps the rest. A tied output layer stays in
    the root with the embedding: its weight is the embedding's, and one parameter cannot be in two units."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype != torch.float32 else MixedPrecisionPolicy()
    reshard = run["zero"] == 3 and run["mesh"]["pp"] == 1
    split = run.get("fsdp_split_root", False) and not stage.tied
    dense_size = fsdp_mesh.size()
    if split and stage.embed is not None:
        fully_shard(stage.embed, mesh=fsdp_mesh, reshard_after_forward=reshard, mp_policy=mp)
    for block in stage.layers.values():
        moe = getattr(getattr(block, "_checkpoint_wrapped_module", block), "mlp", None)
        if isinstance(moe, MoE) and expert_mesh is not None:
            fully_shard(moe.experts, mesh=expert_mesh, reshard_after_forward=reshard, mp_policy=mp)
            moe.experts.set_gradient_divide_factor(float(dense_size))
        fully_shard(block, mesh=fsdp_mesh, reshard_after_forward=reshard, mp_policy=mp)
    if split and stage.output is not None:
        fully_shard([stage.norm, stage.output], mesh=fsdp_mesh, reshard_after_forward=False, mp_policy=mp)
    fully_shard(stage, mesh=fsdp_mesh, reshard_after_forward=reshard, mp_policy=mp)


# --------------------------------------------------------------------------------------------------
# one run


def _dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def state_bytes(modules, optimizer) -> dict[str, int]:
    """Bytes this rank holds: local shards of parameters and gradients, and the optimizer's
    per-parameter state tensors (exp_avg, exp_avg_sq, momentum; the scalar `step` is not one)."""
    seen: set[int] = set()
    weights = grads = opt = 0
    params = []
    for mod in modules:
        for p in mod.parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            params.append(p)
            lp = _local(p)
            weights += lp.numel() * lp.element_size()
            if p.grad is not None:
                lg = _local(p.grad)
                grads += lg.numel() * lg.element_size()
    for p in params:
        for t in optimizer.state.get(p, {}).values():
            if torch.is_tensor(t) and t.shape == p.shape:
                lt = _local(t)
                opt += lt.numel() * lt.element_size()
    return {"weights": weights, "gradients": grads, "optimizer_states": opt}


class Progress:
    """Progress lines and failure files that the launcher reads while the job runs."""

    def __init__(self, out: str, rank: int):
        self.out, self.rank = out, rank
        self.path = os.path.join(out, f"progress_rank{rank}.jsonl")
        self.run, self.step, self.step_started = "", -1, None
        self.main_thread = threading.main_thread().ident

    def event(self, **kv) -> None:
        kv.update(rank=self.rank, t=time.time())
        with open(self.path, "a") as f:
            f.write(json.dumps(kv) + "\n")

    def start_step(self, run: str, step: int) -> None:
        self.run, self.step, self.step_started = run, step, time.time()
        self.event(run=run, step=step, phase="start")

    def end_step(self, run: str, step: int, seconds: float) -> None:
        self.step_started = None
        self.event(run=run, step=step, phase="end", seconds=seconds)

    def write(self, name: str, doc: dict) -> None:
        tmp = os.path.join(self.out, f"{name}.tmp{self.rank}")
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, os.path.join(self.out, name))


def _where(frame_summary) -> str:
    return f"{os.path.basename(frame_summary.filename)}:{frame_summary.lineno} in {frame_summary.name}"


def watchdog(progress: Progress, step_timeout_s: float, parent: int) -> None:
    """Background thread: when a step runs past the per-step timeout, record where the main thread
    is (the launcher tells a hung rank from ranks waiting for it by this); exit if the launcher died."""
    reported = None
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(3)
        started = progress.step_started
        if started is None or time.time() - started < step_timeout_s or reported == (progress.run, progress.step):
            continue
        reported = (progress.run, progress.step)
        frame = sys._current_frames().get(progress.main_thread)
        stack = traceback.extract_stack(frame) if frame is not None else []
        inner = [_where(f) for f in stack[-6:]]
        in_comm = any("distributed" in f.filename or "pipelining" in f.filename for f in stack[-12:])
        progress.write(
            f"stuck_rank{progress.rank}.json",
            {"rank": progress.rank, "run": progress.run, "step": progress.step, "seconds": time.time() - started,
             "in_collective": in_comm, "where": inner},
        )


def _debug_hook(job: dict, rank: int, run: str, step: int) -> None:
    """Fault injection for tests of the launcher: raise, hang, allocate too much or die at once
    (SIGKILL to itself: no error file, as the kernel's OOM killer leaves it) on one rank."""
    dbg = job.get("debug") or {}
    if not dbg or dbg.get("rank") != rank or dbg.get("step", 0) != step or dbg.get("run", run) != run:
        return
    mode = dbg.get("mode")
    if mode == "raise":
        raise RuntimeError(f"injected failure (debug mode raise) on rank {rank}")
    if mode == "hang":
        while True:
            time.sleep(1)
    if mode == "oom":
        torch.empty(int(dbg.get("bytes", 2**50)), dtype=torch.uint8)
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)


def memory_available_bytes(device) -> int | None:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def run_one(job: dict, run: dict, out: str, progress: Progress, device) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    ms = run["mesh"]
    groups = Groups(rank)
    mesh, dense = build_mesh(run, groups, device.type)
    coord = dict(zip(mesh.mesh_dim_names, mesh.get_coordinate()))
    m = run["model"]
    dtype = _dtype(run["dtype"])
    pp, vpp = ms["pp"], len(run["stages"][0])
    pp_rank = coord["pp"]
    n_stages = pp * vpp
    stage_ids = [v * pp + pp_rank for v in range(vpp)]
    torch.manual_seed(run["seed"] + rank)

    # modules of this rank: one per virtual stage. To compare with the reference (check), each is
    # built full with the reference's init and then split; otherwise on the meta device, split, and
    # only the local shards are allocated and drawn (torchtitan's order), so large slices fit.
    ep_rank = coord.get("ep", 0)
    full_init = bool(run.get("check"))
    stages = []
    for v, sid in enumerate(stage_ids):
        with torch.device("cpu" if full_init else "meta"):
            st = Stage(m, run["stages"][pp_rank][v], run, first=sid == 0, last=sid == n_stages - 1)
        if full_init:
            init_parameters(st, run["seed"], (ms["ep"], ep_rank) if ms["ep"] > 1 else None)
            st = st.to(device)  # moves each parameter in place (Module._apply's set_data path): still tied
        stages.append(st)

    def materialize():
        if not full_init:
            for st in stages:
                st.to_empty(device=device)
                st.tie()
                init_local(st, run["seed"] * 1_000_003 + rank)

    full_layers = set(run["recompute"]["full_layers"])
    expert_mesh = None
    if ms["ep"] > 1:
        expert_mesh = mesh["dp_shard_out"]
        for st in stages:
            for block in st.layers.values():
                if isinstance(block.mlp, MoE):
                    block.mlp.ep_group = mesh["ep"].get_group()
    if ms["cp"] > 1:
        cp_group = mesh["cp"].get_group()
        s_local = run["seq_len"] // ms["cp"]
        half = s_local // 2
        c = coord["cp"]
        # load-balanced causal split: rank c holds chunks c and 2cp-1-c of 2cp (Megatron/TE, torch CP)
        positions = torch.cat([torch.arange(c * half, (c + 1) * half), torch.arange((2 * ms["cp"] - 1 - c) * half, (2 * ms["cp"] - c) * half)]).to(device)
        for st in stages:
            st.cp_positions = positions
            for block in st.layers.values():
                if block.attn is not None:  # a hybrid's Mamba, MLP and MoE layers have none
                    block.attn.cp = (cp_group, positions)
    if ms["tp"] > 1:
        for st in stages:
            apply_tp(st, mesh["tp"], run["sp"])
    for st in stages:
        apply_recompute(st, full_layers, run["recompute"]["selective"])
    dp_total = ms["dp_replicate"] * ms["dp_shard"]
    shard_size = ms["dp_shard"] * ms["cp"]
    ddp, sharded = None, False
    if run["zero"] == 0 and dp_total * ms["cp"] > 1:
        from torch.nn.parallel import DistributedDataParallel

        dp_group = mesh["dp_replicate"].get_group() if ms["dp_shard"] == 1 else dense.get_group()
        assert len(stages) == 1 and ms["tp"] == 1 and ms["pp"] == 1, "DDP runs alone (torchtitan: zero 0 without tp/pp/cp/ep)"
        materialize()
        ddp = DistributedDataParallel(stages[0], process_group=dp_group)
    elif run["zero"] > 0 and (shard_size > 1 or ms["dp_replicate"] > 1 or world == 1):
        # FSDP2 on a job of one rank too (validate's one-rank slices): torchtitan always applies it,
        # for its MixedPrecisionPolicy (pytorch/torchtitan@b5bcd76c torchtitan/models/llama3/
        # parallelize.py L57-58): 16-bit parameters gathered per block, a 16-bit residual stream,
        # where autocast would keep a 16-bit copy of every weight through the forward and an fp32
        # residual stream. With tp, pp or ep and no data parallelism the worker stays on autocast:
        # FSDP2 over a mesh of one beside gloo tensor parallelism aborted a rank in backward on CPU
        if ms["dp_replicate"] > 1:
            fsdp_mesh = mesh["dp_replicate", "dp_shard"]
        elif ms["ep"] > 1 or ms["cp"] > 1:
            fsdp_mesh = dense
        else:
            fsdp_mesh = mesh["dp_shard"]
        for st in stages:
            apply_fsdp(st, fsdp_mesh, expert_mesh, run, dtype)
        sharded = True
    if ddp is None:
        materialize()
    if ms["tp"] > 1 and not sharded:
        for st in stages:
            keep_grad_layout(st)
    modules = stages
    params = [p for st in stages for p in st.parameters()]
    optimizer = make_optimizer(params, run["optimizer"])
    # Mixed precision on every path: FSDP2 casts by its MixedPrecisionPolicy; otherwise (zero 0: DDP,
    # or tp, a pipeline or one rank without data parallelism) each stage runs its forward under autocast. torchtitan itself
    # turns mixed precision off for tp or pp without FSDP (torchtitan/distributed/utils.py
    # maybe_enable_amp, commit 30b9ea0b) and trains those in fp32; validate computes in the dtype the
    # estimate prices.
    if dtype != torch.float32 and not sharded:
        for st in stages:
            st.autocast_dtype = dtype

    # data: this rank's rows of the global batch, and its sequence chunks under cp
    dp_index = coord["dp_replicate"] * ms["dp_shard"] + (coord["dp_shard_out"] * ms["ep"] + coord["ep"] if ms["ep"] > 1 else coord["dp_shard"])
    local = run["global_batch"] // dp_total

    def my_batch(step):
        x, y = batch(run, step)
        x, y = x[dp_index * local : (dp_index + 1) * local], y[dp_index * local : (dp_index + 1) * local]
        if ms["cp"] > 1:
            pos = stages[0].cp_positions.cpu()
            x, y = x[:, pos], y[:, pos]
        return x.to(device), y.to(device)

    schedule = None
    if pp > 1:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

        pp_group = mesh["pp"].get_group()
        pstages = [PipelineStage(st, sid, n_stages, device, group=pp_group) for st, sid in zip(stages, stage_ids)]
        nmb = run["microbatches"]
        if vpp > 1:
            schedule = ScheduleInterleaved1F1B(pstages, n_microbatches=nmb, loss_fn=loss_fn)
        elif run["schedule"] == "gpipe":
            schedule = ScheduleGPipe(pstages[0], n_microbatches=nmb, loss_fn=loss_fn)
        else:
            schedule = Schedule1F1B(pstages[0], n_microbatches=nmb, loss_fn=loss_fn)
    has_first = 0 in stage_ids
    has_last = n_stages - 1 in stage_ids

    def train_step(step: int, check: bool):
        x, y = my_batch(step)
        if schedule is not None:
            losses: list = []
            if has_first:
                schedule.step(x, target=y if has_last else None, losses=losses if has_last else None)
            elif has_last:
                schedule.step(target=y, losses=losses)
            else:
                schedule.step()
            loss = torch.stack(losses).mean().detach() if has_last else torch.zeros((), device=device)
        else:
            model = ddp if ddp is not None else stages[0]
            mb = run["microbatches"]
            xs, ys = x.chunk(mb), y.chunk(mb)
            total = torch.zeros((), device=device)
            for i in range(mb):
                sync = ddp is None or i == mb - 1
                ctx = ddp.no_sync() if not sync else _null()
                with ctx:
                    with torch.profiler.record_function("forward"):
                        out = model(xs[i])
                    lo = loss_fn(out, ys[i]) / mb
                # the logits are freed before the backward (torchtitan@b5bcd76c trainer.py L795 `del pred`)
                del out
                with torch.profiler.record_function("backward"):
                    lo.backward()
                total += lo.detach()
            loss = total
        grads = gather_full(stages, mesh, ms, grads=True) if check else None
        measured = state_bytes(modules, optimizer)
        with torch.profiler.record_function("optimizer"):
            optimizer.step()
            # zeroed in place, so the gradients stay allocated through the next step as torchtitan keeps
            # them (pytorch/torchtitan@b5bcd76c trainer.py L845: set_to_none = training.disable_cuda_graphs,
            # False by default, config/configs.py L75) and as the memory model counts them
            # one tensor at a time: a foreach zero refuses a mix of DTensor (tp-sharded) and plain grads
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.detach_().zero_()
        measured["optimizer_states"] = state_bytes(modules, optimizer)["optimizer_states"]
        return loss, grads, measured

    # global loss: the last stage's, averaged over data (and context) parallel ranks
    def global_loss(loss):
        loss = loss.float().clone()
        if pp > 1:  # only the last stage holds a loss; the others add zero
            dist.all_reduce(loss, op=dist.ReduceOp.SUM, group=mesh["pp"].get_group())
        for name in ("dp_replicate", "dp_shard", "dp_shard_out", "ep", "cp"):
            if name in mesh.mesh_dim_names and mesh[name].size() > 1:
                dist.all_reduce(loss, op=dist.ReduceOp.AVG, group=mesh[name].get_group())
        return loss.item()

    prof_ctx = None
    # warm-up, then the steps timed without the profiler (its host-side recording of every operator
    # slows a host-bound step), then the profiled steps the time split is read from
    unprofiled = run["unprofiled_steps"]
    first_profiled = run["warmup"] + unprofiled
    total_steps = first_profiled + run["steps"]
    step_times, unprofiled_times, losses, first_grads, measured, linear_dtypes = [], [], [], None, {}, {}
    from torch.profiler import ProfilerActivity, profile, record_function

    sync = groups.new(list(range(world)), "sync", "validate_sync")
    for step in range(total_steps):
        if step == run["warmup"] and device.type == "cuda":  # the peak of the measured steps, with the profiler on or off
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        if step == first_profiled:
            if run.get("profile", True):
                activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
                prof_ctx = profile(activities=activities, profile_memory=device.type == "cpu")
                prof_ctx.__enter__()
        progress.start_step(run["name"], step)
        _debug_hook(job, rank, run["name"], step)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        hooks = watch_linear_dtypes(stages, linear_dtypes) if step == 0 else []
        t0 = time.perf_counter()
        with record_function(f"step{step}"):
            loss, grads, measured = train_step(step, check=run.get("check", False) and step == 0)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        seconds = time.perf_counter() - t0
        for h in hooks:
            h.remove()
        if grads is not None:
            first_grads = grads
        losses.append(global_loss(loss))
        if step >= first_profiled:
            step_times.append(seconds)
        elif step >= run["warmup"]:
            unprofiled_times.append(seconds)
        progress.end_step(run["name"], step, seconds)
    dist.barrier(group=sync)
    rundir = os.path.join(out, run["name"])
    os.makedirs(rundir, exist_ok=True)
    trace_path = os.path.join(rundir, f"trace_rank{rank}.json")
    split = None
    peak = {}
    if device.type == "cuda":
        peak = {"max_allocated_bytes": torch.cuda.max_memory_allocated(device), "max_reserved_bytes": torch.cuda.max_memory_reserved(device)}
    if prof_ctx is not None:
        prof_ctx.__exit__(None, None, None)
        prof_ctx.export_chrome_trace(trace_path)
        split = analyze_trace(trace_path, threading.get_native_id(), groups.thread_kind, first_profiled, total_steps,
                              group_kind=groups.name_kind)
        if device.type != "cuda":
            peak = {"profiler_peak_bytes": split.pop("peak_allocated_bytes", None)}
        else:
            split.pop("peak_allocated_bytes", None)
    check = {}
    if run.get("check"):
        params = gather_full(stages, mesh, ms, grads=False)
        owner = all(coord[n] == 0 for n in coord if n != "pp")
        if owner:
            torch.save({"params": params, "grads": first_grads}, os.path.join(rundir, f"check_pp{pp_rank}.pt"))
        check = {"saved": owner}
    dist.barrier(group=sync)
    return {
        "rank": rank,
        "coord": coord,
        "stage_ids": stage_ids,
        "step_times_s": step_times,
        "unprofiled_step_times_s": unprofiled_times,
        "losses": losses,
        "state_bytes": measured,
        "peak_memory": peak,
        "split": split,
        "trace": os.path.basename(trace_path) if prof_ctx is not None else None,
        "check": check,
        "linear_dtypes": linear_dtypes,
        "optimizer": {"class": type(optimizer).__name__, "implementation": run["optimizer"]["implementation"],
                      "fused": bool(optimizer.defaults.get("fused")), "foreach": optimizer.defaults.get("foreach")},
        "device": device_info(device),
    }


def device_info(device) -> dict:
    """The device this rank ran on, as torch reports it (the name nvidia-smi shows, e.g. 'NVIDIA H200')."""
    if device.type != "cuda":
        return {"type": device.type, "name": None}
    p = torch.cuda.get_device_properties(device)
    return {"type": "cuda", "name": p.name, "total_memory_bytes": p.total_memory, "sm_count": p.multi_processor_count,
            "capability": f"{p.major}.{p.minor}", "torch": torch.__version__, "cuda": torch.version.cuda}


def watch_linear_dtypes(stages, counts: dict) -> list:
    """Count, by dtype, the outputs of every nn.Linear call (the dense GEMMs) while the hooks stay:
    which dtype the matrix multiplies ran in, whatever cast them (autocast or FSDP's policy)."""

    def hook(_module, _inputs, output):
        name = str(output.dtype).removeprefix("torch.")
        counts[name] = counts.get(name, 0) + 1

    return [mod.register_forward_hook(hook) for st in stages for mod in st.modules() if isinstance(mod, nn.Linear)]


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def gather_full(stages, mesh, ms, grads: bool) -> dict:
    """Full tensors of every parameter (or gradient) of this rank's stages, gathered over the mesh:
    DTensors with `full_tensor()` (a collective, so every rank calls it), routed experts
    concatenated over the ep group."""
    out = {}
    for st in stages:
        for name, p in st.named_parameters():
            t = p.grad if grads else p
            if t is None:
                continue
            t = t.full_tensor() if hasattr(t, "full_tensor") else t
            t = t.detach()
            if ".experts." in name and ms["ep"] > 1:
                parts = [torch.empty_like(t) for _ in range(ms["ep"])]
                dist.all_gather(parts, t.contiguous(), group=mesh["ep"].get_group())
                t = torch.cat(parts)
            out[name.replace("_checkpoint_wrapped_module.", "")] = t.float().cpu().clone()
    return out


# --------------------------------------------------------------------------------------------------
# the profiler's trace: compute by kernel class, optimizer and communication time per step


COMM_PREFIXES = ("c10d::", "_c10d_functional", "gloo:", "nccl", "record_param_comms", "aten::wait", "wait_tensor")
# communication kinds in the order their exposed time is counted; "unattributed": NCCL kernels whose
# process group the trace does not name (reported as such, never as dp)
KIND_ORDER = ("tp", "cp", "ep", "dp", "pp", "unattributed")
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")  # kineto's device events: tid is the stream
KERNEL_CLASSES = ("gemm", "attention", "elementwise")


def is_step(name: str) -> bool:
    """The annotation of one training step: record_function(f"step{step}") in the training loop."""
    return name.startswith("step") and name[4:].isdigit()


# Kernel and operator names by class, matched in lower case, attention first (a fused attention kernel
# may carry "cutlass" in its name: fmha_cutlassF_*). Attention: PyTorch's flash (pytorch_flash::
# flash_fwd_kernel), memory-efficient (fmha_cutlassF_*, fmha_cutlassB_*), cuDNN (*sdpa*) kernels and
# the aten::_scaled_dot_product_*attention* operators. GEMM: cuBLAS/cuBLASLt (*gemm*, *gemv*,
# splitKreduce_kernel, nvjet_*), CUTLASS (cutlass::Kernel<...>) kernels and the aten matrix-multiply
# operators (CPU traces, where operators are all there is). The rest of compute is elementwise
# (memory-bound): norms, activations, rope, copies, reductions, the loss, casts.
ATTENTION_SIGNS = ("flash", "fmha", "sdpa", "attention")
GEMM_SIGNS = ("gemm", "gemv", "splitkreduce", "nvjet", "cutlass", "cublas", "aten::mm", "aten::addmm", "aten::bmm",
              "aten::baddbmm", "aten::matmul", "aten::linear", "aten::_grouped_mm")


def kernel_class(name: str) -> str:
    """"comm", "attention", "gemm" or "elementwise" for a device kernel or a CPU operator name."""
    n = name.lower()
    if "nccl" in n or n.startswith(("record_param_comms", "c10d::", "_c10d_functional", "gloo:")):
        return "comm"
    if any(s in n for s in ATTENTION_SIGNS):
        return "attention"
    if any(s in n for s in GEMM_SIGNS):
        return "gemm"
    return "elementwise"


def _union(intervals):
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _subtract(intervals, minus):
    """Parts of unioned `intervals` not covered by unioned `minus`."""
    out = []
    j = 0
    for a, b in intervals:
        cur = a
        while j < len(minus) and minus[j][1] <= cur:
            j += 1
        k = j
        while k < len(minus) and minus[k][0] < b:
            if minus[k][0] > cur:
                out.append([cur, minus[k][0]])
            cur = max(cur, minus[k][1])
            k += 1
        if cur < b:
            out.append([cur, b])
    return out


def _intersect(intervals, other):
    return _subtract(intervals, _subtract(intervals, other))


def _seconds(intervals) -> float:
    """Total length of [start, end] intervals of the trace (microseconds, Chrome trace format), in seconds."""
    return sum(b - a for a, b in intervals) / 1e6


def _clip(intervals, lo, hi):
    return [[max(a, lo), min(b, hi)] for a, b in intervals if b > lo and a < hi]


def _group_kind(args: dict, group_kind: dict[str, str]) -> str | None:
    """The communication kind of a collective from the group fields torch's profiler records for it
    (record_param_comms: "Process Group Name" is the group's name, "Process Group Description" its
    group_desc; torch 2.13 torch/csrc/profiler/util.h kProcessGroupName, kProcessGroupDesc; kineto
    copies both onto the NCCL kernel the op launched: pytorch/kineto@114171df
    libkineto/src/output_json.cpp, ChromeTraceLogger::handleActivity), or None when absent."""
    name = args.get("Process Group Name")
    if name is not None and str(name) in group_kind:
        return group_kind[str(name)]
    desc = str(args.get("Process Group Description", ""))
    for prefix in ("validate_", "mesh_"):  # groups made here, or by DeviceMesh (the flattened dp_dense)
        if desc.startswith(prefix) and desc[len(prefix):] in KIND_OF_DIM:
            return KIND_OF_DIM[desc[len(prefix):]]
    return None


def analyze_trace(path: str, main_tid: int, thread_kind: dict[int, str], first_step: int, end_step: int,
                  group_kind: dict[str, str] | None = None) -> dict:
    """Seconds per profiled step of compute by kernel class (gemm, attention, elementwise), of the
    optimizer step, and per kind of communication its busy time and the part not hidden behind
    compute (exposed); the rest of the step is idle.

    With device events (CUDA) every time comes from the device: compute is the union of the non-NCCL
    kernels and copies on all streams, the optimizer is the span from the first to the last kernel
    launched inside its CPU region, communication is the NCCL kernels, each attributed to its process
    group by the group fields of the op that launched it, or "unattributed". CPU spans (a launch, a
    wait, a ring annotation) are never counted as compute or communication there.
    Without device events (CPU, gloo) compute is the main thread's operators less the time inside
    communication calls and the optimizer; a gloo collective's time is its `gloo:*` events on the
    worker thread of its group (`thread_kind`); point-to-point calls on the main thread are the
    pipeline's, or context parallel's when issued inside a `cp_ring` annotation."""
    group_kind = group_kind or {}
    with open(path) as f:
        events = json.load(f).get("traceEvents", [])
    device = any(e.get("cat") in GPU_CATEGORIES and e.get("ph") == "X" for e in events)
    steps, optim, peak = {}, [], None
    comm: dict[str, list] = {k: [] for k in KIND_ORDER}
    by_class: dict[str, list] = {k: [] for k in KERNEL_CLASSES}
    compute_all: list = []
    optim_device: list = []
    unattributed: dict[str, int] = {}
    if device:
        _device_events(events, main_tid, group_kind, steps, optim, comm, by_class, optim_device, unattributed)
        compute_all = _union([iv for k in KERNEL_CLASSES for iv in by_class[k]])
    else:
        peak = _host_events(events, main_tid, thread_kind, steps, optim, comm, by_class, compute_all)
    optim_u = _union(optim_device if device else optim)
    comm_u = {k: _union(v) for k, v in comm.items()}
    # each instant of compute in one class: attention over gemm over elementwise (a GEMM inside an
    # attention op, an elementwise op inside a GEMM op, kernels of two classes on two streams)
    att = _union(by_class["attention"])
    gemm = _subtract(_union(by_class["gemm"]), att)
    per_step = []
    for k in range(first_step, end_step):
        if k not in steps:
            continue
        lo, hi = steps[k]
        opt = _clip(optim_u, lo, hi)
        compute = _subtract(_clip(compute_all, lo, hi), opt)
        a = _intersect(compute, _clip(att, lo, hi))
        g = _intersect(compute, _clip(gemm, lo, hi))
        classes = {"gemm_s": _seconds(g), "attention_s": _seconds(a)}
        classes["elementwise_s"] = max(0.0, _seconds(compute) - classes["gemm_s"] - classes["attention_s"])
        covered = _union(compute + opt)
        row = {"step_s": _seconds([[lo, hi]]), "compute_s": _seconds(compute), "optimizer_s": _seconds(opt),
               "classes": classes, "comm": {}}
        for kind in KIND_ORDER:
            busy = _clip(comm_u[kind], lo, hi)
            exposed = _subtract(busy, covered)
            row["comm"][kind] = {"busy_s": _seconds(busy), "exposed_s": _seconds(exposed)}
            covered = _union(covered + exposed)
        row["other_s"] = max(0.0, row["step_s"] - _seconds(covered))
        per_step.append(row)
    return {"steps": per_step, "peak_allocated_bytes": peak, "device_times": device,
            "unattributed_kernels": dict(sorted(unattributed.items(), key=lambda kv: -kv[1])[:8])}


def _device_events(events, main_tid, group_kind, steps, optim, comm, by_class, optim_device, unattributed) -> None:
    """Kernels and copies by class, NCCL kernels by kind, the optimizer's kernels' span (see analyze_trace)."""
    launch_at = {}  # correlation id -> (thread, time) of the CPU's launch (cuda_runtime/cuda_driver event)
    ops_by_ext = {}  # External id -> CPU op
    comms_ops = {}  # tid -> record_param_comms ops (they carry the group fields)
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        args, cat, name = e.get("args") or {}, e.get("cat", ""), e.get("name", "")
        if cat in ("cuda_runtime", "cuda_driver") and "correlation" in args:
            launch_at[args["correlation"]] = (e.get("tid"), float(e["ts"]))
        elif cat in ("cpu_op", "user_annotation"):
            if "External id" in args:
                ops_by_ext[args["External id"]] = e
            if name == "record_param_comms":
                comms_ops.setdefault(e.get("tid"), []).append(e)
            if e.get("tid") == main_tid:
                if is_step(name):
                    steps[int(name[4:])] = (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
                elif name == "optimizer":
                    optim.append([float(e["ts"]), float(e["ts"]) + float(e["dur"])])
    for ops in comms_ops.values():
        ops.sort(key=lambda o: float(o["ts"]))

    def launched_at(args) -> tuple | None:
        if args.get("correlation") in launch_at:
            return launch_at[args["correlation"]]
        op = ops_by_ext.get(args.get("External id"))
        return (op.get("tid"), float(op["ts"])) if op is not None else None

    def kind_of(name: str, args) -> str | None:
        kind = _group_kind(args, group_kind)
        if kind is not None:
            return kind
        op = ops_by_ext.get(args.get("External id"))
        if op is not None:
            kind = _group_kind(op.get("args") or {}, group_kind)
            if kind is not None:
                return kind
        at = launched_at(args)
        if at is None:
            return None
        tid, t = at
        ops = comms_ops.get(tid, [])
        # the record_param_comms op around the launch, on its thread
        inside = [c for c in ops if float(c["ts"]) <= t <= float(c["ts"]) + float(c["dur"])]
        if inside:
            return _group_kind(inside[-1].get("args") or {}, group_kind)
        # batched sends and receives (batch_isend_irecv) are launched together when the batch ends
        # (ProcessGroupNCCL::endCoalescing, under "nccl:coalesced", which records no group): a
        # SendRecv kernel takes the group of the last send or receive its thread recorded before it
        before = [c for c in ops if float(c["ts"]) <= t]
        if "sendrecv" in name.lower() and before:
            last = before[-1].get("args") or {}
            if str(last.get("Collective name", "")).strip('"') in ("send", "recv"):
                return _group_kind(last, group_kind)
        return None

    spans = _union(optim)
    opt_kernels: dict[int, list] = {}
    for e in events:
        if e.get("cat") not in GPU_CATEGORIES or e.get("ph") != "X" or "dur" not in e:
            continue
        a, b = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        args, name = e.get("args") or {}, e.get("name", "")
        cls = kernel_class(name)
        if cls == "comm":
            kind = kind_of(name, args)
            if kind not in KIND_ORDER:
                kind = "unattributed"
                unattributed[name[:80]] = unattributed.get(name[:80], 0) + 1
            comm[kind].append([a, b])
            continue
        at = launched_at(args)
        region = next((i for i, (lo, hi) in enumerate(spans) if at is not None and lo <= at[1] <= hi), None)
        if region is not None:
            opt_kernels.setdefault(region, []).append((a, b))
        by_class[cls].append([a, b])
    for ks in opt_kernels.values():  # the optimizer's time: its kernels' span on the device
        optim_device.append([min(a for a, _ in ks), max(b for _, b in ks)])


def _host_events(events, main_tid, thread_kind, steps, optim, comm, by_class, compute_all) -> float | None:
    """Operators of the main thread by class, gloo events by kind (see analyze_trace); the profiler's
    peak of allocated bytes."""
    main_ops, comm_main, ring, p2p, peak = [], [], [], [], None
    for e in events:
        name, ph = e.get("name", ""), e.get("ph")
        if name == "[memory]":
            total = (e.get("args") or {}).get("Total Allocated")
            if total is not None:
                peak = total if peak is None else max(peak, total)
            continue
        if ph != "X" or "dur" not in e:
            continue
        a, b = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        tid, cat = e.get("tid"), e.get("cat", "")
        if tid == main_tid:
            if is_step(name):
                steps[int(name[4:])] = (a, b)
            elif name == "optimizer":
                optim.append([a, b])
            elif name == "cp_ring":
                ring.append([a, b])
                comm_main.append([a, b])
            elif name.startswith(("gloo:send", "gloo:recv")):
                p2p.append([a, b])  # asynchronous: the span runs on while the thread computes
            elif name.startswith(("c10d::send", "c10d::recv")):
                p2p.append([a, b])  # a blocking receive waits here
                comm_main.append([a, b])
            elif name.startswith(COMM_PREFIXES):
                comm_main.append([a, b])
            elif cat == "cpu_op":
                main_ops.append([a, b])
                cls = kernel_class(name)
                if cls in ("gemm", "attention"):
                    by_class[cls].append([a, b])
        elif name.startswith("gloo:"):
            kind = thread_kind.get(tid)
            if kind in comm:
                comm[kind].append([a, b])
    # a send or receive issued inside a cp_ring span is the ring's (its span runs on past the issue
    # while the step's attention computes); the others are the pipeline's
    ring_u = _union(ring)
    starts = [a for a, _ in ring_u]

    def in_ring(t):
        k = bisect.bisect_right(starts, t) - 1
        return k >= 0 and t <= ring_u[k][1]

    comm["cp"] += _union(ring_u + [iv for iv in p2p if in_ring(iv[0])])
    comm["pp"] += _union([iv for iv in p2p if not in_ring(iv[0])])
    compute_all.extend(_subtract(_union(main_ops), _union(comm_main)))
    return peak


# --------------------------------------------------------------------------------------------------
# entry point


def main(argv: list[str]) -> int:
    job_path = argv[1] if len(argv) > 1 else "job.json"
    with open(job_path) as f:
        job = json.load(f)
    if job.get("version") != FORMAT_VERSION:
        print(f"job.json version {job.get('version')} is not {FORMAT_VERSION}", file=sys.stderr)
        return 2
    out = os.path.dirname(os.path.abspath(job_path))
    rank = int(os.environ.get("RANK", "0"))
    progress = Progress(out, rank)
    threading.Thread(target=watchdog, args=(progress, float(job["timeouts"]["step_s"]), os.getppid()), daemon=True).start()
    device = torch.device("cpu")
    try:
        progress.event(phase="setup")
        if job["device"] == "cuda":
            local = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(local)
            device = torch.device("cuda", local)
        else:
            torch.set_num_threads(int(job.get("threads_per_rank", 1)))
        dist.init_process_group(job["backend"], timeout=timedelta(seconds=float(job["timeouts"]["collective_s"])))
        for run in job["runs"]:
            progress.run, progress.step = run["name"], -1
            res = run_one(job, run, out, progress, device)
            progress.write(os.path.join(run["name"], f"result_rank{rank}.json"), res)
        progress.event(phase="done")
        dist.destroy_process_group()
        return 0
    except BaseException as e:  # one file with the cause, then leave without waiting on peers
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        needed = None
        if "tried to allocate" in str(e).lower():
            hit = re.search(r"tried to allocate (\d+(?:\.\d+)?) ?(bytes|[KMGT]iB)", str(e), re.IGNORECASE)
            if hit:
                unit = {"bytes": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}[hit.group(2).lower()]
                needed = int(float(hit.group(1)) * unit)
        text = str(e).lower()
        oom = isinstance(e, torch.OutOfMemoryError) or any(s in text for s in ("out of memory", "not enough memory", "can't allocate memory"))
        progress.write(
            f"error_rank{rank}.json",
            {"rank": rank, "run": progress.run, "step": progress.step, "type": type(e).__name__, "message": msg,
             "oom": oom, "needed_bytes": needed, "available_bytes": memory_available_bytes(device) if oom else None,
             "traceback": traceback.format_exc()[-4000:], "t": time.time()},
        )
        sys.stderr.flush()
        os._exit(1)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
