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



def _job(model: ModelSpec = TINY, **layout):
    from helpers import make_job

    return make_job(model, gpus=layout.pop("gpus", 1), training={"seq_len": 16, "global_batch_size": layout.pop("gbs", 8)}, **layout)


def test_ssd_scan_flops_by_hand():
    # Dao & Gu 2024 Sec. 6 per chunk: C·Bᵀ 2·Q²·N per group; (L∘CBᵀ)·X 2·Q²·P, Bᵀ·X 2·Q·N·P and C·h
    # 2·Q·N·P per head. T = 16, Q = 8, N = 16, P = 8, H = 8, G = 2: T·(H·(2QP + 4NP) + G·2QN) = 90,112.
    from cost_models.flops import layer_flops
    from cost_models.enums import Recompute

    job = _job()
    mamba, attention, mlp = (TINY.layer_kind(i) for i in (0, 1, 2))
    f = layer_flops(job, mamba, mode=Recompute.NONE)
    assert f.forward_attention == 16 * (8 * (2 * 8 * 8 + 4 * 16 * 8) + 2 * 2 * 8 * 16) == 90_112
    # in_proj 2·16·(2·64 + 2·2·16 + 8)·32 + out_proj 2·16·32·64
    assert f.forward_gemm == 2 * 16 * 200 * 32 + 2 * 16 * 32 * 64
    assert f.backward == 2 * f.forward
    assert layer_flops(job, mlp, mode=Recompute.NONE).forward_attention == 0
    assert layer_flops(job, mlp, mode=Recompute.NONE).forward_gemm == 2 * (2 * 16 * 64 * 32)
    # an attention layer without MLP: q, k, v (32 + 2·16 wide) and o, plus causal core attention
    assert layer_flops(job, attention, mode=Recompute.NONE).forward_gemm == 2 * 16 * 64 * 32 + 2 * 16 * 32 * 32


def test_mamba_layer_activations_and_selective_recompute():
    # Megatron, tp 2 with sp, one sequence of 16 tokens: zxBCdt 16·200/2 bf16, the gated norm's input
    # 16·64/2 bf16 and rstd 16·2/2 fp32, out_proj's input 16·64/2 bf16, in_proj's (sp-sharded) input
    # 16·32/2 bf16, the pre-norm's input 16·32/2 bf16 and rstd 8 fp32.
    from cost_models import activations as act
    from cost_models.enums import Recompute

    job = _job(gpus=2, tp=2)
    items = act.layer_items(job, 0)["mamba"]
    assert items.value("zxbcdt") == 16 * 100 * 2
    assert items.value("gated_norm") == 16 * 32 * 2 + 16 * 1 * 4
    assert items.value("out_proj_input") == 16 * 32 * 2
    assert items.total == 3200 + 1088 + 1024 + 16 * 16 * 2 + (8 * 32 * 2 + 8 * 4)
    # Megatron's selective recompute (core attention) leaves a Mamba layer whole
    assert act.layer_activations(job, 0, Recompute.SELECTIVE).total == items.total
    assert "attention" not in dict(act.layer_items(job, 2)) and "mamba" not in dict(act.layer_items(job, 2))


def test_one_rank_holds_the_hybrid_layers_counted_in_the_model():
    # tp = pp = 1: the rank's decoder-layer parameters are the model's, biases on the attention
    # projections included (params.layer_params and states count the same layer kinds)
    from cost_models.params import model_params
    from cost_models.states import rank_params

    spec = TINY.model_copy(update={"qkv_bias": True, "out_bias": True})
    layers = sum(part.total for name, part in model_params(spec) if name.endswith("_layers"))
    assert rank_params(_job(model=spec), 0).value("layers") == layers == TINY.params_total - 2 * 64 * 32 - 32 + 64 + 32


def test_kernel_split_of_the_compute_leaves_mamba_layers_unrecomputed_under_selective():
    # validate's per-class split (compute_by_kernel) recounts the critical stage layer by layer: with
    # Megatron's selective recompute (core attention only) it must repeat no Mamba scan, as stage_time
    # does, so both reach the same compute (to rounding); full recompute repeats every mixer
    from cost_models.step_time import compute_by_kernel, time_estimate

    for mode in ("selective", "full"):
        est = time_estimate(_job(recompute=mode))
        split = compute_by_kernel(est)
        assert split.total == pytest.approx(float(est.breakdown.value("compute")), rel=1e-12), mode


def test_hybrid_rules_refuse_in_one_line():
    from cost_models.errors import SpecError

    with pytest.raises(SpecError, match=r"num_groups\(2\) must both be divisible by tp\(4\)"):
        _job(gpus=4, tp=4)
    # Megatron's MambaContextParallel: nheads/tp = 8 heads do not split over cp 3
    with pytest.raises(SpecError, match=r"num_heads\(8\)/tp\(1\) = 8 is not divisible by cp\(3\).*; cp in 1, 2, 4, 8 \["):
        _job(gpus=24, cp=3)
    with pytest.raises(SpecError, match="torchtitan ships no Mamba mixer.*--framework megatron"):
        from helpers import make_job

        make_job(TINY, gpus=1, training={"seq_len": 16, "framework": "torchtitan"})


def test_megatron_launch_splits_the_pattern_at_the_planners_stages():
    from cost_models.errors import SpecError
    from planner.launch.megatron import hybrid_pattern, train_sh
    from planner.launch.target import Target

    from helpers import make_job

    spec = ModelSpec.model_validate({**TINY.model_dump(), "mamba": {**TINY.mamba.model_dump(), "chunk_size": 128}})
    job = make_job(spec, gpus=2, training={"seq_len": 16, "global_batch_size": 8}, pp=2, pp_first_stage_layers=3)
    pattern = hybrid_pattern(job)
    segments = pattern.split("|")
    assert segments == ["M*-", "M-"]
    text = train_sh(Target(job=job))
    assert '"$MEGATRON_LM/pretrain_hybrid.py"' in text and "--num-layers " not in text
    for flag in ("--hybrid-layer-pattern", "--mamba-num-heads 8", "--mamba-num-groups 2", "--mamba-state-dim 16",
                 "--mamba-head-dim 8", "--squared-relu", "--position-embedding-type none", "hybrid_stack_spec"):
        assert flag in text
    assert "virtual" not in text and "decoder-first" not in text  # the | segments say it
    with pytest.raises(SpecError, match="chunk_size 8 have no Megatron flags"):
        train_sh(Target(job=_job()))


def test_estimate_of_the_preset_counts_model_flops_on_its_attention_layers_only():
    # PaLM's 6·N + 12·L·H·Q·T per token with L the 4 attention layers of the 52 ("*" in the pattern;
    # a Mamba scan adds no such term), N the parameters less the 131072 x 4096 input embedding
    import json

    from typer.testing import CliRunner

    from planner.cli import app

    out = CliRunner().invoke(app, ["estimate", "nemotron-h-8b", "-c", "dgx-h100", "-g", "16", "--tp", "4", "--seq-len", "8192", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    n = doc["model"]["params_total"] - 131072 * 4096
    per_token = 6 * n + 12 * 4 * 32 * 128 * 8192
    assert doc["throughput"]["model_flop_per_step"] == per_token * doc["throughput"]["tokens_per_step"]
    bad = CliRunner().invoke(app, ["estimate", "nemotron-h-8b", "-c", "dgx-h100", "-g", "16", "--framework", "torchtitan"])
    assert bad.exit_code == 2 and "Traceback" not in bad.output


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


def test_ssd_scan_equals_the_recurrence_at_any_chunk_length():
    """The chunked scan against the SSM's definition, one step at a time: h_t = exp(a_t)·h_{t-1} +
    x_t ⊗ B_t, y_t = h_t·C_t (Dao & Gu 2024, Sec. 2). 13 steps: chunks of 1, 4 and 5 leave a partial
    last chunk, 13 and 64 are one chunk (the quadratic form). float64, so 1e-12 is rounding only."""
    from planner.validate.worker import ssd_scan

    gen = torch.Generator().manual_seed(0)
    b, s, h, p, n = 2, 13, 4, 3, 5
    x, B, C = (torch.randn(b, s, h, d, generator=gen, dtype=torch.float64) for d in (p, n, n))
    a = -torch.rand(b, s, h, generator=gen, dtype=torch.float64)
    state, want = torch.zeros(b, h, p, n, dtype=torch.float64), []
    for t in range(s):
        state = state * a[:, t].exp()[..., None, None] + x[:, t, :, :, None] * B[:, t, :, None, :]
        want.append(torch.einsum("bhpn,bhn->bhp", state, C[:, t]))
    want = torch.stack(want, dim=1)
    for chunk in (1, 4, 5, 13, 64):
        assert (ssd_scan(x, a, B, C, chunk) - want).abs().max() < 1e-12, chunk


@pytest.mark.parametrize("tokens", [16, 20])
def test_mamba_mixer_matches_transformers(tokens):
    """validate's Mamba2 (torch_model.Mamba2 is the same module) against NemotronHMamba2Mixer's torch
    path with the same weights: chunks of 8 over 16 tokens (two chunks and a carried state) and over
    20 (a partial last chunk). Outputs and input gradients to 1e-4: fp32 sums in different orders."""
    from planner.torch_model import Mamba2

    _, hf = _hf_mixer()
    ours = Mamba2(TINY).float()
    with torch.no_grad():
        for p in (hf.dt_bias, hf.A_log, hf.D, hf.norm.weight):
            p.uniform_(0.5, 1.5)
        missing = ours.load_state_dict(hf.state_dict(), strict=True)
    assert not missing.missing_keys and not missing.unexpected_keys  # the same parameter names
    x = torch.randn(2, tokens, 32, requires_grad=True)
    hf.eval()
    got, want = ours(x), hf(x)
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)
    dy = torch.randn_like(got)
    (g_ours,) = torch.autograd.grad(got, x, dy)
    (g_hf,) = torch.autograd.grad(want, x, dy)
    assert torch.allclose(g_ours, g_hf, atol=1e-4, rtol=1e-4)


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
