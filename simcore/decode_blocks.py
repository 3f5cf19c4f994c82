"""Block arithmetic of runs of decode steps, shared by the id-tracking and the counting managers.

A request that holds `capacity` slots and stores `stored` positions first needs a new block at
step capacity - stored + 1 (the step that writes position `capacity`), then every block_size
steps after that.
"""

from __future__ import annotations

from collections import Counter


def first_new_block_step(capacity: int, stored: int) -> int:
    return capacity - stored + 1


def after_storing(first: int, num_positions: int, block_size: int) -> tuple[int, int]:
    """(new blocks taken, next first-new-block step) once a request whose next new block comes
    at step `first` stores `num_positions` more positions (a decode stores one a step)."""
    if first > num_positions:
        return 0, first - num_positions
    need = (num_positions - first) // block_size + 1
    return need, first - num_positions + need * block_size


def blocks_taken_by(firsts: list[int], num_positions: int, block_size: int) -> int:
    """New blocks taken once each request (next new block at `firsts`) stores `num_positions`
    more positions: after_storing's first element, summed."""
    if num_positions <= block_size:  # at most one each (firsts are >= 1)
        return len([first for first in firsts if first <= num_positions])
    return sum([(num_positions - first) // block_size + 1 for first in firsts if first <= num_positions])


def decode_blocks_fit(firsts: list[int], num_positions: int, block_size: int, free: int) -> bool:
    """Whether the new blocks each request (next new block at `firsts`) takes to store
    `num_positions` more positions fit in `free`: first against the most they could take (plenty
    free: the usual case, no pass over them), else counted."""
    if len(firsts) * (num_positions // block_size + 1) <= free:
        return True
    return blocks_taken_by(firsts, num_positions, block_size) <= free


def after_storing_each(firsts: list[int], num_positions: int, block_size: int) -> tuple[int, list[int]]:
    """after_storing for many requests at once: (blocks taken in all, each one's next first)."""
    if num_positions == 0:  # a run of no steps before a prompt's last chunk
        return 0, list(firsts)
    if num_positions <= block_size:
        # At most one new block each, as firsts are >= 1 (the usual case: runs end at arrivals
        # long before a block fills twice).
        shifted = [first - num_positions if first > num_positions else first - num_positions + block_size
                   for first in firsts]
        return blocks_taken_by(firsts, num_positions, block_size), shifted
    needs = [(num_positions - first) // block_size + 1 if first <= num_positions else 0 for first in firsts]
    return sum(needs), [first - num_positions + need * block_size for first, need in zip(firsts, needs)]


def blocks_each_step(firsts: list[int], num_steps: int, block_size: int) -> list[int]:
    """New blocks each of the next `num_steps` decode steps takes, for requests whose next new
    block comes at `firsts`, each at most block_size: a request takes one at step first, then
    every block_size steps, so a step takes one for each request of its offset."""
    by_offset = Counter(firsts)
    return [by_offset[step % block_size + 1] for step in range(num_steps)]


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

    def first_new_block_step_of(self, request_id: int) -> int:
        """first_new_block_steps for one request."""
        return self.first_new_block_steps([request_id])[0]
