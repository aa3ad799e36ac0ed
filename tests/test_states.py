"""Weights, gradients and optimizer states: the model's bytes against a real torch model with a real
torch.optim.AdamW/SGD state after one step on CPU, and the sharding arithmetic by hand."""

from __future__ import annotations

import pytest

from cost_models.enums import Zero
from cost_models.states import padded_vocab, rank_params, rank_state_bytes, state_bytes
from helpers import LLAMA_TINY, make_job

torch = pytest.importorskip("torch")

from planner.torch_model import Transformer  # noqa: E402


def _step(model, optimizer):
    tokens = torch.randint(0, LLAMA_TINY.vocab_size, (2, 32))
    model(tokens).float().logsumexp(-1).mean().backward()
    optimizer.step()


def _optimizer_bytes(optimizer, keys) -> int:
    # Adam/SGD also keep a 0-dim `step` counter per parameter tensor; those are not per-parameter
    # states and are left out of both sides.
    return sum(t.numel() * t.element_size() for st in optimizer.state.values() for k, t in st.items() if k in keys)


def test_torchtitan_fp32_states_match_adamw():
    # FSDP2 keeps fp32 parameters, fp32 gradients and AdamW's two fp32 moments: 4 + 4 + 8 bytes.
    torch.manual_seed(0)
    model = Transformer(LLAMA_TINY, max_seq=32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    _step(model, opt)
    n = LLAMA_TINY.params_total
    job = make_job(LLAMA_TINY, gpus=1, zero=0, training=dict(framework="torchtitan", seq_len=32, global_batch_size=1))
    predicted = state_bytes(job, params=n, shard=1)
    assert predicted.value("weights") == sum(p.numel() * p.element_size() for p in model.parameters())
    assert predicted.value("gradients") == sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())
    assert predicted.value("optimizer_states") == _optimizer_bytes(opt, {"exp_avg", "exp_avg_sq"})
    assert predicted.value("master_weights") == 0


def test_megatron_mixed_precision_states_match_torch():
    # bf16 model weights, fp32 main gradients, fp32 master weights and AdamW moments on the master
    # copies: 2 + 4 + 4 + 8 = 18 bytes per parameter (Megatron dist_optimizer.md table).
    torch.manual_seed(0)
    model = Transformer(LLAMA_TINY, max_seq=32).to(torch.bfloat16)
    master = [p.detach().float().requires_grad_() for p in model.parameters()]
    opt = torch.optim.AdamW(master, lr=1e-3)
    tokens = torch.randint(0, LLAMA_TINY.vocab_size, (2, 32))
    model(tokens).float().logsumexp(-1).mean().backward()
    main_grads = [p.grad.float() for p in model.parameters()]
    for m, g in zip(master, main_grads):
        m.grad = g
    opt.step()
    job = make_job(LLAMA_TINY, gpus=1, zero=0, training=dict(framework="megatron", seq_len=32, global_batch_size=1))
    predicted = state_bytes(job, params=LLAMA_TINY.params_total, shard=1)
    assert predicted.value("weights") == sum(p.numel() * p.element_size() for p in model.parameters())
    assert predicted.value("gradients") == sum(g.numel() * g.element_size() for g in main_grads)
    assert predicted.value("master_weights") == sum(m.numel() * m.element_size() for m in master)
    assert predicted.value("optimizer_states") == _optimizer_bytes(opt, {"exp_avg", "exp_avg_sq"})
    assert predicted.total == 18 * LLAMA_TINY.params_total


def test_sgd_momentum_keeps_one_state():
    torch.manual_seed(0)
    model = Transformer(LLAMA_TINY, max_seq=32)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    _step(model, opt)
    job = make_job(LLAMA_TINY, gpus=1, zero=0, training=dict(framework="torchtitan", optimizer="sgd", seq_len=32, global_batch_size=1))
    predicted = state_bytes(job, params=LLAMA_TINY.params_total, shard=1)
    assert predicted.value("optimizer_states") == _optimizer_bytes(opt, {"momentum_buffer"})


@pytest.mark.parametrize(
    "framework, zero, per_param",
    [
        # Megatron: 18 replicated; distributed optimizer 6 + 12/d (dist_optimizer.md); d = 8
        ("megatron", 0, 18),
        ("megatron", 1, 6 + 12 / 8),
        ("megatron", 2, 2 + 16 / 8),
        # DeepSpeed / ZeRO paper: 16; 4 + 12/d; 2 + 14/d; 16/d
        ("deepspeed", 0, 16),
        ("deepspeed", 1, 4 + 12 / 8),
        ("deepspeed", 2, 2 + 14 / 8),
        ("deepspeed", 3, 16 / 8),
        # FSDP2: fp32 params, grads and moments all sharded: 16/d
        ("torchtitan", 3, 16 / 8),
        ("torchtitan", 2, 16 / 8),
    ],
)
def test_sharding_arithmetic(framework, zero, per_param):
    job = make_job(LLAMA_TINY, gpus=8, zero=zero, training=dict(framework=framework, seq_len=256, global_batch_size=8))
    n = 8_000_000  # divisible by 8 so the per-shard ceiling is exact
    assert state_bytes(job, params=n, shard=job.dense_shard_group).total == pytest.approx(per_param * n)


def test_fp16_megatron_keeps_fp32_gradient_copy():
    job = make_job(LLAMA_TINY, gpus=8, zero=1, training=dict(precision="fp16", seq_len=256, global_batch_size=8))
    n = 8_000_000
    assert state_bytes(job, params=n, shard=8).total == pytest.approx((4 + 16 / 8) * n)


def test_rank_params_partition_the_model():
    # pp=4, tp=1, untied, no vocab padding (torchtitan): the stages hold every parameter exactly once
    job = make_job("llama-3.1-8b", gpus=8, pp=4, training=dict(framework="torchtitan", seq_len=4096, global_batch_size=32))
    assert sum(rank_params(job, r).total for r in range(4)) == job.model.params_total


@pytest.mark.parametrize("name", ["gemma-2-9b", "gemma-3-1b", "gpt-oss-20b", "llama-4-maverick-17b-128e"])
def test_one_rank_holds_every_parameter_of_the_new_layer_types(name):
    # tp = pp = ep = 1, torchtitan (no vocab padding): the rank's count is the model's, so sandwich
    # norms, sinks, router biases and the dense/MoE mix are counted once and exactly
    job = make_job(name, gpus=1, training=dict(framework="torchtitan", seq_len=4096, global_batch_size=1))
    assert rank_params(job, 0).total == job.model.params_total


def test_tensor_parallel_split_by_hand():
    # Llama-3.1-8B, tp=8, megatron with its default --make-vocab-size-divisible-by 128 (vocab padded to a
    # multiple of 128·8 = 1024: 128256 -> 126 x 1024 = 129024).
    job = make_job("llama-3.1-8b", gpus=8, tp=8, training=dict(seq_len=4096, global_batch_size=8, vocab_divisible_by=128))
    assert padded_vocab(job) == 129024
    h, f, q, kv = 4096, 14336, 4096, 1024
    layer = h * (q + 2 * kv) // 8 + q * h // 8 + 3 * h * f // 8 + 2 * h  # attention/tp, mlp/tp, 2 RMSNorms replicated
    expected = 32 * layer + 2 * 129024 * h // 8 + h  # + embedding and output shards + final norm
    assert rank_params(job, 0).total == expected


def test_experts_shard_over_ep_and_their_own_dp():
    # Mixtral 8x7B on 64 GPUs, tp=2, ep=8, etp=1: dense states shard over dp = 32, expert states over
    # expert-dp = 64 / (etp·ep·pp) = 8.
    job = make_job("mixtral-8x7b", gpus=64, tp=2, ep=8, etp=1, zero=1, training=dict(seq_len=4096, global_batch_size=64))
    assert job.dense_shard_group == 32 and job.expert_shard_group == 8
    p = rank_params(job, 0)
    assert p.value("experts") == 32 * 1 * 3 * 4096 * 14336  # one whole expert per layer per rank
    states = rank_state_bytes(job, 0)
    dense, expert = p.total - p.value("experts"), p.value("experts")
    assert states.value("master_weights") == -(-dense * 4 // 32) + -(-expert * 4 // 8)
    assert job.zero is Zero.OPTIMIZER


def test_bf16_gradient_buffer_gets_an_fp32_copy_in_the_step():
    # --grad-reduce-in-bf16: a 2-byte gradient buffer, and the distributed optimizer's step takes an
    # fp32 copy of its shard (4 bytes over dp = 8); the rest as Megatron bf16 with ZeRO-1:
    # weights 2 + gradients 2 + (master 4 + Adam 8 + copy 4) / 8 = 6 bytes per parameter
    job = make_job(LLAMA_TINY, gpus=8, zero=1, training=dict(grad_reduce_in_bf16=True, seq_len=256, global_batch_size=8))
    n = 8_000_000
    states = state_bytes(job, params=n, shard=8)
    assert states.value("fp32_gradients") == 4 * n // 8
    assert states.total == 6 * n
