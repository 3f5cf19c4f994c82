"""Block accounting by counts alone, for runs where no one needs physical block ids.

Scheduling decisions depend only on how many blocks each request holds and how many are free.
Without prefix caching (shared blocks), a host tier (block-to-block copies) or a real engine
(which reads the block tables), the ids themselves carry no information, so this manager keeps
per-request counts in O(1) per call instead of a table entry per block. Results are identical
to `BlockManager` (tested); the runner picks it automatically.
"""

from __future__ import annotations

from collections.abc import Sequence

from simcore.block_manager import PrefixHit
from simcore.decode_blocks import BlockArithmetic, first_new_block_step, max_steps_within


class BlockCounter(BlockArithmetic):
    tracks_block_ids = False
    enable_prefix_caching = False
    on_evict = None
    num_evictions = 0
    num_shared_blocks = 0

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        # A plain attribute, not BlockManager's property (no pool to measure).
        self.num_free_blocks = num_blocks
        # Per request: blocks held and positions stored.
        self.num_table_blocks: dict[int, int] = {}
        self.num_positions: dict[int, int] = {}
        # No block is ever shared, so no reference is ever revived: an empty mapping suffices.
        self.ref_counts: dict[int, int] = {}

    def stored_positions(self, request_id: int) -> int:
        return self.num_positions[request_id]

    def num_new_blocks_needed(self, request_id: int, num_new_positions: int) -> int:
        held = self.num_table_blocks.get(request_id, 0)
        after = self.num_positions.get(request_id, 0) + num_new_positions
        return max(self.blocks_for(after) - held, 0)

    def lookup_prefix(self, hashes, contents, root=()) -> PrefixHit:  # noqa: ANN001
        return PrefixHit((), ())

    def allocate(self, request_id: int, num_positions: int, prefix: PrefixHit | None = None) -> None:
        if request_id in self.num_table_blocks:
            raise ValueError(f"request {request_id} already has a block table")
        need = self.blocks_for(num_positions)
        if need > self.num_free_blocks:
            raise MemoryError(f"request {request_id}: needs {need} blocks, {self.num_free_blocks} free")
        self.num_free_blocks -= need
        self.num_table_blocks[request_id] = need
        self.num_positions[request_id] = 0

    def append(self, request_id: int, num_new_positions: int) -> list[tuple[int, int]]:
        if num_new_positions <= 0:
            return []
        need = self.num_new_blocks_needed(request_id, num_new_positions)
        if need > self.num_free_blocks:
            raise MemoryError(f"request {request_id}: needs {need} blocks, {self.num_free_blocks} free")
        self.num_free_blocks -= need
        self.num_table_blocks[request_id] += need
        self.num_positions[request_id] += num_new_positions
        return []

    def free(self, request_id: int) -> None:
        held = self.num_table_blocks.pop(request_id, None)
        self.num_positions.pop(request_id, None)
        if held is not None:
            self.num_free_blocks += held

    def table(self, request_id: int) -> tuple[int, ...]:
        raise RuntimeError("BlockCounter keeps no block ids; use BlockManager where tables are read")

    def max_decode_steps(self, request_ids: list[int], limit: int, firsts: list[int] | None = None) -> int:
        if firsts is None:
            firsts = self.first_new_block_steps(request_ids)
        return max_steps_within(firsts, self.block_size, self.num_free_blocks, limit)

    def first_new_block_steps(self, request_ids: list[int]) -> list[int]:
        """For each request, the decode step (1-based) that first needs a new block."""
        bs, held, stored = self.block_size, self.num_table_blocks, self.num_positions
        return [first_new_block_step(held[rid] * bs, stored[rid]) for rid in request_ids]

    def append_decode_steps(self, request_ids: list[int], num_steps: int | Sequence[int],
                            firsts: list[int] | None = None) -> None:
        """Append one position per request per step for `num_steps` steps (or each request its
        own number of steps)."""
        if firsts is None:
            firsts = self.first_new_block_steps(request_ids)
        bs, held, stored = self.block_size, self.num_table_blocks, self.num_positions
        counts = [num_steps] * len(request_ids) if isinstance(num_steps, int) else num_steps
        needs = [(count - first) // bs + 1 if first <= count else 0 for first, count in zip(firsts, counts)]
        taken = sum(needs)
        if taken > self.num_free_blocks:
            raise MemoryError(f"decode steps need {taken} blocks, {self.num_free_blocks} free")
        self.num_free_blocks -= taken
        for rid, count, need in zip(request_ids, counts, needs):
            stored[rid] += count
            if need:
                held[rid] += need

    def check(self) -> None:
        held = sum(self.num_table_blocks.values())
        if held + self.num_free_blocks != self.num_blocks:
            raise AssertionError(f"block accounting does not add up: {held} held + {self.num_free_blocks} free")
        for rid, num in self.num_table_blocks.items():
            if self.blocks_for(self.num_positions[rid]) > num:
                raise AssertionError(f"request {rid}: {num} blocks cannot hold {self.num_positions[rid]} positions")
