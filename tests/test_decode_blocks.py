"""Block arithmetic of decode runs against a brute-force count, step by step."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.decode_blocks import (
    after_storing,
    after_storing_each,
    blocks_taken_by,
    decode_blocks_fit,
    max_steps_within,
)


def _needed(firsts: list[int], block_size: int, num_steps: int) -> int:
    """Blocks taken by num_steps steps, counted one step and one request at a time."""
    taken = 0
    for first in firsts:
        taken += sum(1 for step in range(1, num_steps + 1) if step >= first and (step - first) % block_size == 0)
    return taken


@settings(max_examples=300, deadline=None)
@given(block_size=st.integers(1, 20), firsts=st.lists(st.integers(1, 60), max_size=12),
       free=st.integers(0, 80), limit=st.integers(0, 90), within_a_block=st.booleans())
def test_max_steps_within_is_the_most_steps_that_fit(block_size, firsts, free, limit, within_a_block):
    if within_a_block:  # the usual case (blocks allocated as needed): the closed form applies
        firsts = [(f - 1) % block_size + 1 for f in firsts]
    steps = max_steps_within(firsts, block_size, free, limit)
    assert 0 <= steps <= limit
    assert _needed(firsts, block_size, steps) <= free
    if steps < limit:
        assert _needed(firsts, block_size, steps + 1) > free


@settings(max_examples=300, deadline=None)
@given(block_size=st.integers(1, 20), held=st.integers(0, 6), stored=st.integers(0, 120),
       num_positions=st.integers(0, 90))
def test_after_storing_matches_a_block_counter(block_size, held, stored, num_positions):
    """The blocks and next new-block step `after_storing` predicts are those a BlockCounter
    reaches by appending the positions one at a time."""
    from simcore.block_counter import BlockCounter

    bm = BlockCounter(10_000, block_size)
    bm.allocate(0, held * block_size)
    bm.append(0, stored)
    (first,) = bm.first_new_block_steps([0])
    free = bm.num_free_blocks
    for _ in range(num_positions):
        bm.append(0, 1)
    assert after_storing(first, num_positions, block_size) == (free - bm.num_free_blocks,
                                                                 bm.first_new_block_steps([0])[0])
    assert bm.num_positions == {0: stored + num_positions}


@settings(max_examples=200, deadline=None)
@given(block_size=st.integers(1, 20), firsts=st.lists(st.integers(1, 60), max_size=12), num_positions=st.integers(0, 90))
def test_many_requests_at_once_match_one_at_a_time(block_size, firsts, num_positions):
    each = [after_storing(first, num_positions, block_size) for first in firsts]
    assert after_storing_each(firsts, num_positions, block_size) == (sum(n for n, _ in each), [f for _, f in each])
    assert blocks_taken_by(firsts, num_positions, block_size) == _needed(firsts, block_size, num_positions)


@settings(max_examples=300, deadline=None)
@given(block_size=st.integers(1, 20), offsets=st.lists(st.integers(0, 19), max_size=12), num_blocks=st.integers(0, 3),
       extra=st.integers(0, 19), slack=st.integers(-3, 3))
def test_decode_blocks_fit_when_just_enough_are_free(block_size, offsets, num_blocks, extra, slack):
    """Free blocks around what the decodes need (a few short, just enough, a few to spare),
    with next new blocks within a block (allocated as needed: the usual case)."""
    firsts = [offset % block_size + 1 for offset in offsets]
    num_positions = num_blocks * block_size + extra % block_size
    needed = _needed(firsts, block_size, num_positions)
    assert decode_blocks_fit(firsts, num_positions, block_size, needed + slack) == (slack >= 0)
