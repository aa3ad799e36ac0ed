"""Shared builders for tests: jobs from presets or inline specs, with every field explicit."""

from __future__ import annotations

from typing import Any

from cost_models.hardware import Cluster
from cost_models.job import Job
from cost_models.layout import Layout
from cost_models.model_spec import ModelSpec
from cost_models.rules import resolve
from cost_models.training import TrainingSpec
from planner import presets


def make_job(
    model: str | ModelSpec,
    *,
    gpus: int = 8,
    cluster: str = "dgx-h100",
    training: dict[str, Any] | None = None,
    **layout: Any,
) -> Job:
    spec = presets.models()[model] if isinstance(model, str) else model
    cl = Cluster(spec=presets.clusters()[cluster], num_gpus=gpus)
    return resolve(spec, cl, TrainingSpec(**(training or {})), Layout(**layout))


LLAMA_TINY = ModelSpec(
    name="llama-tiny", num_layers=4, hidden_size=256, ffn_hidden_size=688, num_attention_heads=8,
    num_kv_heads=2, vocab_size=1000, max_position_embeddings=4096,
)
GPT_TINY = ModelSpec(
    name="gpt-tiny", num_layers=4, hidden_size=256, ffn_hidden_size=1024, num_attention_heads=8,
    vocab_size=1000, max_position_embeddings=1024, tie_embeddings=True, mlp="gelu", norm="layernorm",
    position_embedding="learned", qkv_bias=True, out_bias=True, mlp_bias=True,
    hidden_dropout=0.1, attention_dropout=0.1,
)


def disk_full_at_fsync(monkeypatch: Any, nth: int) -> None:
    """Make the nth os.fsync of the test fail with ENOSPC, as a disk that fills up mid-write."""
    import errno
    import os

    real, calls = os.fsync, []

    def fsync(fd: int) -> None:
        calls.append(fd)
        if len(calls) == nth:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
