"""The host-memory tier: a second pool of KV blocks that swapped-out requests live in (seed 21.3)."""

from __future__ import annotations

from collections import deque


class HostPool:
    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.free_blocks: deque[int] = deque(range(num_blocks))
        # request id -> (host blocks, stored positions)
        self.tables: dict[int, tuple[list[int], int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_blocks)

    def can_hold(self, num_blocks: int) -> bool:
        return num_blocks <= len(self.free_blocks)

    def store(self, request_id: int, num_blocks: int, num_positions: int) -> list[int]:
        if num_blocks > len(self.free_blocks):
            raise MemoryError(f"host tier: request {request_id} needs {num_blocks} blocks")
        blocks = [self.free_blocks.popleft() for _ in range(num_blocks)]
        self.tables[request_id] = (blocks, num_positions)
        return blocks

    def release(self, request_id: int) -> tuple[list[int], int]:
        blocks, num_positions = self.tables.pop(request_id)
        self.free_blocks.extend(blocks)
        return blocks, num_positions

    def take_block(self) -> int | None:
        return self.free_blocks.popleft() if self.free_blocks else None

    def give_block(self, block: int) -> None:
        self.free_blocks.append(block)

    def check(self, other_held: list[int] = ()) -> None:  # type: ignore[assignment]
        held = [b for blocks, _ in self.tables.values() for b in blocks] + list(other_held)
        if len(set(held)) != len(held) or set(held) & set(self.free_blocks):
            raise AssertionError("host tier: a block is held twice or both held and free")
        if len(held) + len(self.free_blocks) != self.num_blocks:
            raise AssertionError("host tier: block accounting does not add up")
