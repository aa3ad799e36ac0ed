"""A reference decoder-only transformer in torch, built from a ModelSpec (imports torch: used by
`validate` and the tests only, never by plan/estimate/memory).

Its parameters mirror the Hugging Face/Megatron layouts exactly (so `sum(p.numel())` equals
`ModelSpec.params_total`), and its kernels can be chosen to save for backward what the fused CUDA
kernels of the frameworks save, so the activation model can be checked against it on a CPU:

- `FusedNorm`: keeps its 16-bit input and fp32 per-token statistics (TE/apex/torch CUDA rms_norm).
- `ByteMaskDropout`: keeps a 1-byte mask (CUDA native_dropout; torch's CPU dropout keeps a 16-bit one).
- `FusedSwiGLU`: keeps the [gate|up] input only and recomputes silu (Megatron bias_swiglu_impl).
- `Mamba2`: validate's Mamba-2 mixer (transformers' NemotronHMamba2Mixer parameters, the chunked SSD
  scan in plain torch, Dao & Gu 2024 Sec. 6), exact on a CPU.
- attention "flash": torch SDPA (on CPU the `_scaled_dot_product_flash_attention_for_cpu` kernel,
  which keeps q, k, v, the output and the fp32 log-sum-exp); "eager": explicit scores, softmax,
  dropout and matmul, as in Korthikanti et al. 2022.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from cost_models.enums import MixerKind, MLPKind, NormKind, PositionKind, RouterScore
from cost_models.model_spec import ModelSpec
from planner.validate import worker
from planner.validate.slices import mamba_doc


@dataclass(frozen=True)
class Kernels:
    attention: str = "flash"  # "flash" (SDPA) or "eager"
    fused_norm: bool = True
    fused_swiglu: bool = False
    gqa_expand: bool = True  # repeat K/V to every query head (torchtitan/HF) or let SDPA group them
    byte_dropout_mask: bool = True


class _FusedRMSNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (xf * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        xhat = x.float() * rstd
        g = grad.float() * weight.float()
        dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
        dw = (grad.float() * xhat).reshape(-1, x.shape[-1]).sum(0)
        return dx.to(x.dtype), dw.to(weight.dtype), None


class _FusedLayerNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        xf = x.float()
        mean = xf.mean(-1, keepdim=True)
        rstd = torch.rsqrt((xf - mean).pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, mean, rstd)
        return ((xf - mean) * rstd).to(x.dtype) * weight + bias

    @staticmethod
    def backward(ctx, grad):
        x, weight, mean, rstd = ctx.saved_tensors
        xhat = (x.float() - mean) * rstd
        g = grad.float() * weight.float()
        dx = rstd * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
        flat = grad.float().reshape(-1, x.shape[-1])
        dw = (flat * xhat.reshape(-1, x.shape[-1])).sum(0)
        return dx.to(x.dtype), dw.to(weight.dtype), flat.sum(0).to(weight.dtype), None


class Norm(nn.Module):
    """LayerNorm or RMSNorm; `one_plus` stores the weight as an offset from 1 (LayerNorm1P)."""

    def __init__(self, width: int, kind: NormKind, fused: bool, eps: float = 1e-5, one_plus: bool = False):
        super().__init__()
        self.kind, self.fused, self.eps, self.one_plus = kind, fused, eps, one_plus
        self.weight = nn.Parameter(torch.zeros(width) if one_plus else torch.ones(width))
        self.bias = nn.Parameter(torch.zeros(width)) if kind is NormKind.LAYERNORM else None

    def forward(self, x):
        weight = self.weight + 1 if self.one_plus else self.weight
        if self.kind is NormKind.LAYERNORM:
            if self.fused:
                return _FusedLayerNormFn.apply(x, weight, self.bias, self.eps)
            return F.layer_norm(x, (x.shape[-1],), weight, self.bias, self.eps)
        if self.fused:
            return _FusedRMSNormFn.apply(x, weight, self.eps)
        return F.rms_norm(x, (x.shape[-1],), weight, self.eps)


def norm(spec: ModelSpec, width: int, kernels: Kernels) -> Norm:
    return Norm(width, spec.norm, kernels.fused_norm, spec.norm_eps, spec.zero_centered_norm)


class _ByteMaskDropoutFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p):
        mask = torch.rand_like(x, dtype=torch.float32) >= p
        ctx.save_for_backward(mask)
        ctx.scale = 1.0 / (1.0 - p)
        return x * mask * ctx.scale

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return grad * mask * ctx.scale, None


def dropout(x: torch.Tensor, p: float, kernels: Kernels, training: bool) -> torch.Tensor:
    if not training or p == 0:
        return x
    return _ByteMaskDropoutFn.apply(x, p) if kernels.byte_dropout_mask else F.dropout(x, p, True)


class _FusedSwiGLUFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate_up):
        ctx.save_for_backward(gate_up)
        g, u = gate_up.chunk(2, dim=-1)
        return F.silu(g) * u

    @staticmethod
    def backward(ctx, grad):
        (gate_up,) = ctx.saved_tensors
        g, u = gate_up.float().chunk(2, dim=-1)
        sig = torch.sigmoid(g)
        silu = g * sig
        dg = grad.float() * u * sig * (1 + g * (1 - sig))
        du = grad.float() * silu
        return torch.cat([dg, du], dim=-1).to(gate_up.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, kernels: Kernels):
        super().__init__()
        h, d = spec.hidden_size, spec.head_size
        self.spec, self.kernels = spec, kernels
        self.heads, self.kv_heads, self.head_dim = spec.num_attention_heads, spec.kv_heads, d
        self.wq = nn.Linear(h, spec.q_width, bias=spec.qkv_bias)
        self.wk = nn.Linear(h, spec.kv_width, bias=spec.qkv_bias)
        self.wv = nn.Linear(h, spec.kv_width, bias=spec.qkv_bias)
        self.wo = nn.Linear(spec.q_width, h, bias=spec.out_bias)
        if spec.qk_norm:
            self.q_norm = norm(spec, d, kernels)
            self.k_norm = norm(spec, d, kernels)
        self.rope = spec.position_embedding is PositionKind.ROPE
        # GPT-OSS's sinks: one learned logit per head (parameters only; the attention here is causal)
        self.sinks = nn.Parameter(torch.zeros(self.heads)) if spec.attention_sinks else None

    def forward(self, x, cos, sin, causal_mask):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.heads, self.head_dim)
        k = self.wk(x).view(b, s, self.kv_heads, self.head_dim)
        v = self.wv(x).view(b, s, self.kv_heads, self.head_dim)
        if self.spec.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope:
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        rep = self.heads // self.kv_heads
        expand = rep > 1 and (self.kernels.gqa_expand or self.kernels.attention == "eager")
        if expand:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        if self.kernels.attention == "flash":
            p = self.spec.attention_dropout if self.training else 0.0
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True, enable_gqa=rep > 1 and not expand)
        else:
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
            scores = scores.masked_fill(causal_mask[:s, :s], float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            probs = dropout(probs, self.spec.attention_dropout, self.kernels, self.training)
            out = probs @ v
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class MLAttention(nn.Module):
    """Multi-head latent attention, the matrices of transformers' DeepseekV3Attention: q_a / q_a_norm /
    q_b (or one q_proj), kv_a (latent and the shared rope key), kv_a_norm, kv_b (per-head key part
    without rope and value), o. Rotary on the rope part only; the value is made contiguous before the
    attention kernel, which reads it apart from the key part it was projected with."""

    def __init__(self, spec: ModelSpec, kernels: Kernels):
        super().__init__()
        a = spec.mla
        assert a is not None
        h, n = spec.hidden_size, spec.num_attention_heads
        self.spec, self.kernels, self.a, self.heads = spec, kernels, a, n
        if a.q_lora_rank is None:
            self.q_proj = nn.Linear(h, n * a.qk_head_dim, bias=False)
        else:
            self.q_a = nn.Linear(h, a.q_lora_rank, bias=spec.qkv_bias)
            self.q_a_norm = norm(spec, a.q_lora_rank, kernels)
            self.q_b = nn.Linear(a.q_lora_rank, n * a.qk_head_dim, bias=False)
        self.kv_a = nn.Linear(h, a.kv_lora_rank + a.qk_rope_head_dim, bias=spec.qkv_bias)
        self.kv_a_norm = norm(spec, a.kv_lora_rank, kernels)
        self.kv_b = nn.Linear(a.kv_lora_rank, n * (a.qk_nope_head_dim + a.v_head_dim), bias=False)
        self.o = nn.Linear(n * a.v_head_dim, h, bias=spec.out_bias)

    def forward(self, x, cos, sin, causal_mask):
        a, n = self.a, self.heads
        b, s, _ = x.shape
        q = self.q_proj(x) if a.q_lora_rank is None else self.q_b(self.q_a_norm(self.q_a(x)))
        q_nope, q_rope = q.view(b, s, n, a.qk_head_dim).split([a.qk_nope_head_dim, a.qk_rope_head_dim], dim=-1)
        latent, k_rope = self.kv_a(x).split([a.kv_lora_rank, a.qk_rope_head_dim], dim=-1)
        k_nope, v = self.kv_b(self.kv_a_norm(latent)).view(b, s, n, -1).split([a.qk_nope_head_dim, a.v_head_dim], dim=-1)
        k_rope = k_rope[:, :, None, :]
        q_rope = q_rope * cos + _rotate_half(q_rope) * sin
        k_rope = k_rope * cos + _rotate_half(k_rope) * sin
        q = torch.cat([q_nope, q_rope], dim=-1).transpose(1, 2)
        k = torch.cat([k_nope, k_rope.expand(b, s, n, a.qk_rope_head_dim)], dim=-1).transpose(1, 2)
        v = v.contiguous().transpose(1, 2)
        if self.kernels.attention == "flash":
            p = self.spec.attention_dropout if self.training else 0.0
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(a.qk_head_dim))
            scores = scores.masked_fill(causal_mask[:s, :s], float("-inf"))
            probs = dropout(torch.softmax(scores, dim=-1), self.spec.attention_dropout, self.kernels, self.training)
            out = probs @ v
        return self.o(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec, ffn: int, kernels: Kernels):
        super().__init__()
        self.swiglu, self.kernels = spec.mlp.gated, kernels
        self.geglu = spec.mlp is MLPKind.GEGLU  # Gemma: gelu_tanh(gate) * up
        self.squared_relu = spec.mlp is MLPKind.SQUARED_RELU
        self.fc1 = nn.Linear(spec.hidden_size, 2 * ffn if self.swiglu else ffn, bias=spec.mlp_bias)
        self.fc2 = nn.Linear(ffn, spec.hidden_size, bias=spec.mlp_bias)

    def forward(self, x):
        y = self.fc1(x)
        if self.swiglu:
            if self.kernels.fused_swiglu and not self.geglu:
                y = _FusedSwiGLUFn.apply(y)
            else:
                g, u = y.chunk(2, dim=-1)
                y = (F.gelu(g, approximate="tanh") if self.geglu else F.silu(g)) * u
        elif self.squared_relu:
            y = torch.pow(F.relu(y), 2)
        else:
            y = F.gelu(y)
        return self.fc2(y)


class Mamba2(worker.Mamba2):
    """validate's Mamba-2 mixer (planner/validate/worker.py: transformers' NemotronHMamba2Mixer
    parameters and the chunked SSD scan of the spec's chunk length), with transformers' init of the
    per-head parameters: A_log = log(1..heads), D = dt_bias = 1 (NemotronHMamba2Mixer.init_nemotron_h_weights)."""

    def __init__(self, spec: ModelSpec):
        assert spec.mamba is not None
        super().__init__(spec.hidden_size, mamba_doc(spec.mamba), spec.norm_eps)
        with torch.no_grad():
            self.A_log.copy_(torch.log(torch.arange(1, spec.mamba.num_heads + 1, dtype=torch.float32)))


class MoE(nn.Module):
    """Router, routed experts (top-k of the softmax or sigmoid scores, renormalised and scaled as the
    spec says; DeepSeek-V3's score-correction bias is a buffer) and shared experts."""

    def __init__(self, spec: ModelSpec, kernels: Kernels):
        super().__init__()
        moe = spec.moe
        assert moe is not None
        self.moe, self.top_k = moe, moe.top_k
        self.router = nn.Linear(spec.hidden_size, moe.num_experts, bias=moe.router_bias)
        if moe.expert_bias:
            self.register_buffer("expert_bias", torch.zeros(moe.num_experts))
        self.experts = nn.ModuleList(MLP(spec, moe.expert_ffn_hidden_size, kernels) for _ in range(moe.num_experts))
        self.shared = nn.ModuleList(MLP(spec, moe.shared_width, kernels) for _ in range(moe.num_shared_experts))
        self.shared_gate = nn.Linear(spec.hidden_size, 1, bias=False) if moe.shared_expert_gate else None

    def forward(self, x):
        b, s, h = x.shape
        flat = x.reshape(-1, h)
        logits = self.router(flat).float()
        if self.moe.router_score is RouterScore.SIGMOID:
            probs = torch.sigmoid(logits)
            choice = probs + self.expert_bias if self.moe.expert_bias else probs
            chosen = choice.topk(self.top_k, dim=-1).indices
            weights = probs.gather(1, chosen)
        else:
            probs = torch.softmax(logits, dim=-1)
            weights, chosen = probs.topk(self.top_k, dim=-1)
        if self.moe.router_score is RouterScore.SIGMOID and self.moe.renormalize_top_k:
            weights = weights / weights.sum(-1, keepdim=True)
        weights = weights * self.moe.routed_scaling_factor
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token, slot = (chosen == e).nonzero(as_tuple=True)
            if token.numel():
                out.index_add_(0, token, expert(flat[token]) * weights[token, slot, None].to(flat.dtype))
        for shared in self.shared:
            y = shared(flat)
            if self.shared_gate is not None:
                y = y * torch.sigmoid(self.shared_gate(flat))
            out = out + y
        return out.view(b, s, h)


class HybridBlock(nn.Module):
    """One layer of a hybrid model: a norm and one block (Mamba-2, attention, MLP or MoE), with its residual."""

    def __init__(self, spec: ModelSpec, layer_id: int, kernels: Kernels):
        super().__init__()
        self.spec, self.kernels = spec, kernels
        kind = spec.layer_kind(layer_id)
        self.norm = norm(spec, spec.hidden_size, kernels)
        self.mixer: nn.Module
        if kind.mixer is MixerKind.MAMBA:
            self.mixer, self.attention = Mamba2(spec), False
        elif kind.mixer is MixerKind.ATTENTION:
            self.mixer, self.attention = Attention(spec, kernels), True
        elif kind.moe:
            self.mixer, self.attention = MoE(spec, kernels), False
        else:
            self.mixer, self.attention = MLP(spec, spec.ffn_hidden_size, kernels), False

    def forward(self, x, cos, sin, causal_mask):
        y = self.norm(x)
        y = self.mixer(y, cos, sin, causal_mask) if self.attention else self.mixer(y)
        return x + dropout(y, self.spec.hidden_dropout, self.kernels, self.training)


class Block(nn.Module):
    def __init__(self, spec: ModelSpec, layer_id: int, kernels: Kernels):
        super().__init__()
        self.spec, self.kernels = spec, kernels
        self.attn_norm = norm(spec, spec.hidden_size, kernels)
        self.attn = MLAttention(spec, kernels) if spec.mla is not None else Attention(spec, kernels)
        self.mlp_norm = norm(spec, spec.hidden_size, kernels)
        self.mlp = MoE(spec, kernels) if spec.is_moe_layer(layer_id) else MLP(spec, spec.ffn_hidden_size, kernels)
        # Gemma's sandwich norms on the attention and MLP outputs
        self.post_attn_norm = norm(spec, spec.hidden_size, kernels) if spec.sandwich_norms else None
        self.post_mlp_norm = norm(spec, spec.hidden_size, kernels) if spec.sandwich_norms else None

    def forward(self, x, cos, sin, causal_mask):
        p = self.spec.hidden_dropout
        a = self.attn(self.attn_norm(x), cos, sin, causal_mask)
        x = x + dropout(a if self.post_attn_norm is None else self.post_attn_norm(a), p, self.kernels, self.training)
        y = self.mlp(self.mlp_norm(x))
        return x + dropout(y if self.post_mlp_norm is None else self.post_mlp_norm(y), p, self.kernels, self.training)


class Transformer(nn.Module):
    def __init__(self, spec: ModelSpec, kernels: Kernels = Kernels(), max_seq: int | None = None):
        super().__init__()
        self.spec, self.kernels = spec, kernels
        h = spec.hidden_size
        self.embed = nn.Embedding(spec.vocab_size, h)
        self.pos = nn.Embedding(spec.max_position_embeddings, h) if spec.position_embedding is PositionKind.LEARNED else None
        self.embed_norm = norm(spec, h, kernels) if spec.embedding_norm else None
        layer = HybridBlock if spec.hybrid_pattern is not None else Block
        self.layers = nn.ModuleList(layer(spec, i, kernels) for i in range(spec.num_layers))
        self.final_norm = norm(spec, h, kernels)
        self.output = None if spec.tie_embeddings else nn.Linear(h, spec.vocab_size, bias=False)
        n = max_seq or min(spec.max_position_embeddings, 8192)
        d = spec.head_size if spec.mla is None else spec.mla.qk_rope_head_dim
        inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        ang = torch.outer(torch.arange(n, dtype=torch.float32), inv)
        ang = torch.cat([ang, ang], dim=-1)[:, None, :]  # (s, 1, d): broadcasts over (b, s, heads, d)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)
        self.register_buffer("causal_mask", torch.ones(n, n, dtype=torch.bool).triu(1), persistent=False)

    def rope_tables(self, s: int, dtype: torch.dtype):
        return self.cos[:s].to(dtype), self.sin[:s].to(dtype)

    def forward(self, tokens):
        b, s = tokens.shape
        x = self.embed(tokens)
        if self.pos is not None:
            x = x + self.pos(torch.arange(s, device=tokens.device))
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        x = dropout(x, self.spec.hidden_dropout, self.kernels, self.training)
        cos, sin = self.rope_tables(s, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, self.causal_mask)
        x = self.final_norm(x)
        weight = self.embed.weight if self.output is None else self.output.weight
        return F.linear(x, weight)


def saved_activation_bytes(spec: ModelSpec, kernels: Kernels, *, b: int, s: int, recompute: bool) -> int:
    """Bytes one decoder layer (layer 0 of `spec`) saves for backward on this machine, in bf16, each
    storage counted once; parameters, rope tables and the causal mask are not activations. With
    `recompute`, the layer runs under reentrant torch.utils.checkpoint, which keeps only its inputs.
    Backward runs afterwards outside the hooks, so the graph is a real one."""
    torch.manual_seed(0)
    model = Transformer(spec, kernels, max_seq=s).to(torch.bfloat16)
    block = model.layers[0]
    block.train()
    cos, sin = model.rope_tables(s, torch.bfloat16)
    x = torch.randn(b, s, spec.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    constants = [*block.parameters(), cos, sin, model.causal_mask]
    exclude = {t.untyped_storage().data_ptr() for t in constants}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in exclude:
            seen.setdefault(storage.data_ptr(), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        if recompute:
            out = torch.utils.checkpoint.checkpoint(block, x, cos, sin, model.causal_mask, use_reentrant=True)
        else:
            out = block(x, cos, sin, model.causal_mask)
    out.float().sum().backward()
    return sum(seen.values())
