"""One GPU's share of a Mamba-2 mixer under tensor and context parallelism, as Megatron splits it.

Megatron-LM@d98e8a64 megatron/core/ssm/mamba_context_parallel.py (MambaContextParallel):
- tp splits heads and groups (mamba_mixer.py L262-274); in_proj runs on the rank's seq/cp tokens
  and writes [z, x, B, C, dt] for its nheads/tp heads and ngroups/tp groups;
- with cp > 1, pre_conv_ssm (L140-199) all-to-alls z, x, B, C and dt one by one over the cp group,
  turning [seq/cp, b, width/tp] into [seq, b, width/(tp·cp)]: the conv and the scan then run over the
  whole sequence on nheads/(tp·cp) heads (L110); post_conv_ssm (L201-211) all-to-alls the scan's
  output y back to [seq/cp, b, inner/tp] before the norm and out_proj (mamba_mixer.py L728-731);
- B and C of a group go with its heads: when a tp rank holds fewer groups than cp, each group's
  B and C are repeated cp/(ngroups/tp) times before the all-to-all (L119-125, L171-184), so every
  cp rank gets one group;
- the asserts: nheads/tp divisible by cp (L106-108); cp divisible by ngroups/tp when it is the
  larger (L120-122), else ngroups/tp divisible by cp (L127-129).
With cp = 1 none of this runs (L97-101, L144-145, L205-206) and the shard is the tp one.
"""

from __future__ import annotations

from dataclasses import dataclass

from cost_models.model_spec import MambaSpec


def cp_error(mb: MambaSpec, tp: int, cp: int) -> str | None:
    """Megatron's MambaContextParallel asserts (module docstring), or None when cp splits the
    rank's heads and groups."""
    heads, groups = mb.num_heads // tp, mb.num_groups // tp
    if cp == 1:
        return None
    if heads % cp:
        return f"mamba num_heads({mb.num_heads})/tp({tp}) = {heads} is not divisible by cp({cp})"
    if groups < cp and cp % groups:
        return f"cp({cp}) is not divisible by mamba num_groups({mb.num_groups})/tp({tp}) = {groups}"
    if groups >= cp and groups % cp:
        return f"mamba num_groups({mb.num_groups})/tp({tp}) = {groups} is not divisible by cp({cp})"
    return None


def cp_values(mb: MambaSpec, tp: int) -> list[int]:
    """The cp degrees Megatron's Mamba mixer accepts at this tp (at most nheads/tp: one head per rank)."""
    return [c for c in range(1, mb.num_heads // tp + 1) if cp_error(mb, tp, c) is None]


@dataclass(frozen=True)
class MambaShard:
    """What one GPU's conv and scan run over: `seq` positions of each sequence, and `local`, the
    mixer the rank holds as a MambaSpec of its nheads_local_tpcp heads and ngroups_local_tpcp B/C
    groups, whose widths are the rank's: inner, conv_dim (x, B and C: conv1d_channels(),
    mamba_context_parallel.py L227-231) and in_proj_width (the zxBCdt the fused conv + scan kernel
    reads)."""

    seq: int
    repeat: int  # group_repeat_count: copies of each group's B and C sent over the cp group
    local: MambaSpec


def _repeat(groups: int, cp: int) -> int:
    """group_repeat_count (L119-133): cp/(ngroups/tp) where a tp rank holds fewer groups than cp."""
    return cp // groups if groups < cp else 1


def mamba_shard(mb: MambaSpec, *, tp: int, cp: int, seq_len: int) -> MambaShard:
    assert cp_error(mb, tp, cp) is None, "rules.mamba_cp refuses this split"
    heads, groups = mb.num_heads // tp, mb.num_groups // tp
    local = mb.model_copy(update={"num_heads": heads // cp, "num_groups": max(1, groups // cp)})
    return MambaShard(seq=seq_len, repeat=_repeat(groups, cp), local=local)


def all_to_all_widths(mb: MambaSpec, *, tp: int, cp: int) -> dict[str, int]:
    """Per token of a rank's seq/cp, the elements of each tensor one cp all-to-all sends (its whole
    buffer, [seq/cp, b, width]): z, x, B and C (repeated), dt in pre_conv_ssm, y in post_conv_ssm.
    Each is 16-bit (in_proj's output and the scan's output are in the activation dtype). Empty at cp 1."""
    if cp == 1:
        return {}
    assert cp_error(mb, tp, cp) is None, "rules.mamba_cp refuses this split"
    inner, groups = mb.inner // tp, mb.num_groups // tp
    bc = groups * _repeat(groups, cp) * mb.state_size
    return {"z": inner, "x": inner, "B": bc, "C": bc, "dt": mb.num_heads // tp, "y": inner}
