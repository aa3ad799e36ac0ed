"""benchmarks/nanotron_allocator_replay.py: the caching allocator's large-pool rules, by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))

from nanotron_allocator_replay import CachingAllocator, replay  # noqa: E402

from cost_models.units import MiB  # noqa: E402


def test_requests_under_10_mib_share_a_20_mib_segment_and_larger_ones_get_their_own():
    a = CachingAllocator()
    assert a.malloc(MiB) is None  # 1 MiB and below: the small pool, not replayed
    x = a.malloc(8 * MiB)  # a new 20 MiB segment, split: 12 MiB stay free
    y = a.malloc(8 * MiB)  # fits in those 12 MiB, 4 MiB stay free (more than 1 MiB: split)
    assert (a.reserved, a.allocated) == (20 * MiB, 16 * MiB)
    a.malloc(8 * MiB)  # 4 MiB do not fit: a second 20 MiB segment
    assert a.reserved == 40 * MiB
    a.malloc(11 * MiB)  # the second segment's free 12 MiB hold it
    assert a.reserved == 40 * MiB
    a.malloc(13 * MiB + 1)  # no free block holds it and it is above 10 MiB: its own segment, 14 MiB
    assert a.reserved == 54 * MiB
    # freed neighbours merge: x, y and the 4 MiB tail are one 20 MiB block again, which a 19 MiB
    # request takes whole (1 MiB would remain: not split) with no new segment
    a.release(x)
    a.release(y)
    z = a.malloc(19 * MiB)
    assert z.size == 20 * MiB and a.reserved == 54 * MiB


def test_a_request_takes_the_smallest_free_block_that_fits():
    a = CachingAllocator()
    big, small = a.malloc(64 * MiB), a.malloc(32 * MiB)
    a.release(big)
    a.release(small)
    assert a.malloc(30 * MiB).segment == small.segment  # best fit, not the first free block
    # nothing cached holds 70 MiB: a new segment, and the reserved bytes never go down
    a.malloc(70 * MiB)
    assert a.reserved == (64 + 32 + 70) * MiB


def test_a_capacity_releases_whole_cached_segments_before_giving_up():
    a = CachingAllocator(capacity_bytes=100 * MiB)
    a.release(a.malloc(64 * MiB))
    a.malloc(30 * MiB)  # carved from the cached 64 MiB segment, which is now split
    with pytest.raises(MemoryError):
        a.malloc(60 * MiB)  # 64 + 60 > 100, and a split segment is not released
    b = CachingAllocator(capacity_bytes=100 * MiB)
    b.release(b.malloc(64 * MiB))
    b.malloc(80 * MiB)  # 64 + 80 > 100: the whole cached 64 MiB segment is released first
    assert (b.releases, b.reserved) == (1, 80 * MiB)
    with pytest.raises(MemoryError):
        b.malloc(40 * MiB)


def test_the_replay_settles_after_the_first_step():
    # the reserved bytes of the first step are those of the third: what the CSV reads at iteration 3
    # is settled by iteration 1 (its optimizer step makes Adam's moments and ZeRO-1's flat copies)
    kw = dict(vocab=4096, h=1024, f=4096, layers=2, tokens=2048, pp=2, microbatches=4, dp=4, zero1=True)
    one, three = replay(iterations=1, **kw), replay(iterations=3, **kw)
    assert one.reserved == three.reserved and three.reserved >= three.peak_allocated


def test_a_capacity_beside_an_allocator_passed_in_is_refused():
    # the capacity bounds only the modelled allocator; silently dropping it would replay unbounded
    with pytest.raises(ValueError, match="capacity_bytes"):
        replay(vocab=8, h=8, f=8, layers=1, tokens=8, pp=1, microbatches=1, dp=1, zero1=False,
               capacity_bytes=100 * MiB, allocator=CachingAllocator())
