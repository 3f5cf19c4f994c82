"""Block arithmetic of runs of decode steps, shared by the id-tracking and the counting managers.

A request that holds `capacity` slots and stores `stored` positions first needs a new block at
step capacity - stored + 1 (the step that writes position `capacity`), then every block_size
steps after that.
"""

from __future__ import annotations


def first_new_block_step(capacity: int, stored: int) -> int:
    return capacity - stored + 1


def firsts_after(firsts: list[int], num_steps: int, block_size: int) -> list[int]:
    """Each request's first new-block step (`firsts`) counted again after `num_steps` decode steps."""
    return [first - num_steps if first > num_steps else (first - num_steps - 1) % block_size + 1 for first in firsts]


def max_steps_within(firsts: list[int], block_size: int, free: int, limit: int) -> int:
    """Most steps (<= limit) whose new blocks, for requests first needing one at `firsts`, fit in `free`."""
    if len(firsts) * (limit // block_size + 1) <= free:
        return limit  # even if every request took its most blocks (the usual case: plenty free)
    if firsts and max(firsts) <= block_size:
        # Each request needs a block once per block_size steps, at its own offset: the blocks
        # are taken in rounds of len(firsts), so the (free + 1)-th, the first that does not
        # fit, is the one at index free % n of the sorted offsets in round free // n.
        offsets = sorted(firsts)
        rounds, index = divmod(free, len(offsets))
        return min(limit, rounds * block_size + offsets[index] - 1)
    firsts = [f for f in firsts if f <= limit]
    if not firsts:
        return limit

    def needed(num_steps: int) -> int:
        return sum([(num_steps - f) // block_size + 1 for f in firsts if f <= num_steps])

    if needed(limit) <= free:
        return limit
    low, high = 0, limit  # needed(low) <= free < needed(high)
    while high - low > 1:
        mid = (low + high) // 2
        if needed(mid) <= free:
            low = mid
        else:
            high = mid
    return low


# Largest block: no request is longer (workloads cap lengths at 2**31 - 1), and step records
# count blocks with int64 arithmetic (`simcore.run_counts`).
MAX_BLOCK_SIZE = 2**31 - 1


class BlockArithmetic:
    """Capacity checks shared by both block managers (they differ in how blocks are held)."""

    num_free_blocks: int

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if not 1 <= block_size <= MAX_BLOCK_SIZE:
            raise ValueError(f"block_size must be between 1 and {MAX_BLOCK_SIZE}, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size

    @property
    def num_used_blocks(self) -> int:
        """Blocks referenced by at least one request."""
        return self.num_blocks - self.num_free_blocks

    def blocks_for(self, num_positions: int) -> int:
        return -(-num_positions // self.block_size)

    def can_allocate(self, num_blocks: int, *, reserve: int = 0) -> bool:
        """Whether `num_blocks` can be taken while still leaving `reserve` blocks free."""
        return num_blocks + reserve <= self.num_free_blocks

    def can_append(self, request_id: int, num_new_positions: int, *, reserve: int = 0) -> bool:
        return self.can_allocate(self.num_new_blocks_needed(request_id, num_new_positions), reserve=reserve)

    def num_new_blocks_needed(self, request_id: int, num_new_positions: int) -> int:
        raise NotImplementedError

    def first_new_block_steps(self, request_ids: list[int]) -> list[int]:
        """For each request, the decode step (1-based) that first needs a new block."""
        raise NotImplementedError
