"""Nemotron-H hybrid models (Mamba-2 / attention / MLP layers): the reference torch model against
transformers' NemotronH modules, and the cost model's per-kind terms on a hand-sized layer."""

from __future__ import annotations

import pytest

from cost_models.enums import MixerKind
from cost_models.model_spec import ModelSpec

TINY = ModelSpec.model_validate(dict(
    name="tiny-nemotron-h", num_layers=5, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4, num_kv_heads=2,
    head_dim=8, vocab_size=64, max_position_embeddings=64, mlp="squared_relu", position_embedding="none",
    hybrid_pattern="M*-M-", mamba=dict(num_heads=8, head_dim=8, state_size=16, num_groups=2, chunk_size=8),
))


def test_layer_kinds_follow_the_pattern():
    kinds = [TINY.layer_kind(i) for i in range(5)]
    assert [k.mixer for k in kinds] == [MixerKind.MAMBA, MixerKind.ATTENTION, MixerKind.NONE, MixerKind.MAMBA, MixerKind.NONE]
    assert [k.mlp for k in kinds] == [False, False, True, False, True]
    assert {k.label for k in kinds} == {"mamba", "attention", "mlp"}
    # one norm per layer: 5·32; Mamba: in_proj 32·(2·64 + 2·2·16 + 8) = 6400, conv (64 + 64)·4 + 128 = 640,
    # 3·8 per-head, norm 64, out_proj 64·32 = 2048 -> 9176 each; attention 32·(32 + 2·16) + 32·32 = 3072;
    # MLP 2·32·64 = 4096 each; embedding and output 2·64·32; final norm 32.
    assert TINY.params_total == 5 * 32 + 2 * 9176 + 3072 + 2 * 4096 + 2 * 64 * 32 + 32


def test_bad_patterns_name_the_rule():
    base = TINY.model_dump()
    for update, words in (({"hybrid_pattern": "M*-MX"}, "not layer kinds"), ({"hybrid_pattern": "M*-M"}, "must be equal"),
                          ({"mamba": None}, "together")):
        with pytest.raises(ValueError, match=words):
            ModelSpec.model_validate({**base, **update})


torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _hf_mixer():
    cfg = transformers.NemotronHConfig(
        hybrid_override_pattern=TINY.hybrid_pattern, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, vocab_size=64, mamba_num_heads=8, mamba_head_dim=8, ssm_state_size=16,
        n_groups=2, chunk_size=8, layer_norm_epsilon=TINY.norm_eps,
    )
    torch.manual_seed(0)
    model = transformers.NemotronHForCausalLM(cfg).float()
    return model, model.model.layers[0].mixer


def test_reference_model_counts_transformers_parameters():
    from planner.torch_model import Transformer

    model, _ = _hf_mixer()
    assert sum(p.numel() for p in Transformer(TINY, max_seq=16).parameters()) == TINY.params_total
    assert TINY.params_total == sum(p.numel() for p in model.parameters())


def test_quadratic_ssd_matches_transformers_chunked_scan():
    """Our Mamba2 (quadratic form, one pass) against NemotronHMamba2Mixer's torch path (chunked scan,
    chunk 8 over 16 tokens: two chunks and a carried state) with the same weights. Tolerance 1e-4:
    fp32 sums in different orders."""
    from planner.torch_model import Mamba2

    _, hf = _hf_mixer()
    ours = Mamba2(TINY).float()
    with torch.no_grad():
        for p in (hf.dt_bias, hf.A_log, hf.D, hf.norm.weight):
            p.uniform_(0.5, 1.5)
        ours.in_proj.weight.copy_(hf.in_proj.weight)
        ours.conv1d.weight.copy_(hf.conv1d.weight)
        ours.conv1d.bias.copy_(hf.conv1d.bias)
        ours.out_proj.weight.copy_(hf.out_proj.weight)
        for name, src in (("dt_bias", hf.dt_bias), ("A_log", hf.A_log), ("D", hf.D), ("norm_weight", hf.norm.weight)):
            getattr(ours, name).copy_(src)
    x = torch.randn(2, 16, 32)
    hf.eval()
    assert torch.allclose(ours(x), hf(x), atol=1e-4, rtol=1e-4)


def test_tiny_hybrid_trains_on_cpu():
    """One process, fp32, a fixed batch: 20 AdamW steps at lr 1e-2 bring the loss well below its
    start (a model whose gradients do not reach every layer kind would stall)."""
    from planner.torch_model import Transformer

    torch.manual_seed(0)
    model = Transformer(TINY, max_seq=16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tokens = torch.randint(0, 64, (2, 17))
    losses = []
    for _ in range(20):
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in model.named_parameters() if ".mixer." in n)
