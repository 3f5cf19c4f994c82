"""Block arithmetic of decode runs against a brute-force count, step by step."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.decode_blocks import firsts_after, max_steps_within


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
@given(block_size=st.integers(1, 20), firsts=st.lists(st.integers(1, 60), max_size=12),
       num_steps=st.integers(1, 40), each=st.booleans(), seed=st.integers(0, 100))
def test_a_runs_new_blocks_step_by_step_match_a_count(block_size, firsts, num_steps, each, seed):
    """What the accelerator records as each step's new blocks, against counting them."""
    import random

    from policies.accelerate import _blocks_each_step

    rng = random.Random(seed)
    taken = [rng.randint(0, num_steps) for _ in firsts] if each else num_steps
    per_step = _blocks_each_step(firsts, taken, block_size, num_steps)
    counts = taken if each else [num_steps] * len(firsts)
    expected = [sum(1 for first, count in zip(firsts, counts)
                    if first <= step <= count and (step - first) % block_size == 0) for step in range(1, num_steps + 1)]
    assert per_step == expected


@settings(max_examples=300, deadline=None)
@given(block_size=st.integers(1, 20), firsts=st.lists(st.integers(1, 60), max_size=12), num_steps=st.integers(0, 90))
def test_firsts_after_some_steps_count_the_same_blocks(block_size, firsts, num_steps):
    """After `num_steps` steps, the next steps take the blocks the whole run's later steps take."""
    after = firsts_after(firsts, num_steps, block_size)
    assert all(first >= 1 for first in after)
    for more in (0, 1, block_size, 3 * block_size + 1):
        assert _needed(after, block_size, more) == (_needed(firsts, block_size, num_steps + more)
                                                     - _needed(firsts, block_size, num_steps))
