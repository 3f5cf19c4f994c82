"""Paged KV-cache block manager (seed 21.5), with prefix caching (seed 21.4).

Logical position t of a request lives in logical block t // block_size, slot t % block_size;
the request's block table maps logical blocks to physical ones. Physical blocks carry a
reference count and an occupancy (filled slots). A block goes back to the free pool only when
its last reference goes; a full block with a prefix hash is kept instead as an evictable cache
entry (LRU) that a later request can hit. Writing into a shared, partially filled block copies
it first (copy-on-write).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from simcore.decode_blocks import BlockArithmetic, first_new_block_step, max_steps_within
from simcore.prefix import BlockContent


@dataclass(frozen=True, slots=True)
class PrefixHit:
    """Result of a prefix lookup: the physical blocks that already hold a request's first blocks."""

    block_ids: tuple[int, ...]
    hashes: tuple[int, ...]

    @property
    def num_blocks(self) -> int:
        return len(self.block_ids)


class BlockManager(BlockArithmetic):
    tracks_block_ids = True

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        free_block_order: Sequence[int] | None = None,
        enable_prefix_caching: bool = False,
    ) -> None:
        super().__init__(num_blocks, block_size)
        self.enable_prefix_caching = enable_prefix_caching
        order = list(range(num_blocks)) if free_block_order is None else list(free_block_order)
        if sorted(order) != list(range(num_blocks)):
            raise ValueError("free_block_order must be a permutation of range(num_blocks)")
        # Free pool: blocks with no reference and no cached content; taken from the left.
        self.free_blocks: deque[int] = deque(order)
        self.ref_counts: list[int] = [0] * num_blocks
        self.num_filled: list[int] = [0] * num_blocks
        self.block_tables: dict[int, list[int]] = {}
        # Positions each request has stored (its processed count as the manager knows it).
        self.num_positions: dict[int, int] = {}
        # Prefix cache: hash -> block, the block's hash and content (for collision checks),
        # and the evictable entries (ref count 0, still cached) in least-recently-used order.
        self.cached_blocks: dict[int, int] = {}
        self.block_hash: dict[int, int] = {}
        self.block_content: dict[int, BlockContent] = {}
        # Logical identity of cached content: a child block names its parent's entry, so a hit
        # is verified along the chain even when the parent moved to another tier and back.
        self.block_entry: dict[int, int] = {}
        self._next_entry = 0
        self.evictable: OrderedDict[int, None] = OrderedDict()
        self.num_evictions = 0
        # Blocks referenced by more than one request right now (shared prefixes, forks).
        self.num_shared_blocks = 0
        # Called with a block id when an evictable cached block is reused for new content, so a
        # host tier can keep a copy (offload of evicted prefix blocks).
        self.on_evict: Callable[[int, int, int, BlockContent], None] | None = None

    # ---- capacity -------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now: truly free plus evictable cache entries."""
        return len(self.free_blocks) + len(self.evictable)

    def num_new_blocks_needed(self, request_id: int, num_new_positions: int) -> int:
        """Blocks to add so the request can store `num_new_positions` more positions."""
        have = len(self.block_tables.get(request_id, ()))
        after = self.num_positions.get(request_id, 0) + num_new_positions
        need = self.blocks_for(after) - have
        if need < 0:
            need = 0
        if num_new_positions > 0 and self._needs_copy_on_write(request_id):
            need += 1
        return need

    # ---- prefix cache ---------------------------------------------------------------------

    def lookup_prefix(self, hashes: Sequence[int], contents: Sequence[BlockContent], root: tuple = ()) -> PrefixHit:
        """Longest run of leading blocks already cached with matching hash *and* verified content.

        A hash match alone could be a collision. A hit is verified exactly: the block's tokens
        equal ours and its parent is the very block we matched before it (or, for the first
        block, the same configuration/adapter/salt root), so no collision can alias two contexts.
        """
        if not self.enable_prefix_caching:
            return PrefixHit((), ())
        found: list[int] = []
        parent: object = root
        for block_hash, content in zip(hashes, contents):
            block = self.cached_blocks.get(block_hash)
            if block is None or self.block_content.get(block) != (parent, content):
                break
            found.append(block)
            parent = self.block_entry[block]
        return PrefixHit(tuple(found), tuple(hashes[: len(found)]))

    def cache_block(
        self, block: int, block_hash: int, content: BlockContent, parent: object = (), entry: int | None = None
    ) -> None:
        """Register a full block's identity: hash, and content + parent entry for verification."""
        if not self.enable_prefix_caching or block in self.block_hash:
            return
        if block_hash in self.cached_blocks:
            # Another block already holds this content (computed concurrently); keep the first.
            return
        if entry is None:
            entry = self._next_entry
            self._next_entry += 1
        self.cached_blocks[block_hash] = block
        self.block_hash[block] = block_hash
        self.block_content[block] = (parent, content)
        self.block_entry[block] = entry

    def parent_entry(self, block: int) -> object:
        """What a child of `block` records as its parent: the block's entry, if it is cached."""
        entry = self.block_entry.get(block)
        return ("uncached", block) if entry is None else entry

    # ---- allocation -----------------------------------------------------------------------

    def allocate(self, request_id: int, num_positions: int, prefix: PrefixHit | None = None) -> None:
        """Give a new request a block table covering `num_positions`, sharing `prefix` blocks.

        The prefix blocks count as already stored positions (they hold KV); the remaining
        positions are reserved in fresh blocks and counted as stored once processed.
        """
        if request_id in self.block_tables:
            raise ValueError(f"request {request_id} already has a block table")
        table: list[int] = []
        if prefix is not None:
            for block in prefix.block_ids:
                self._take_reference(block)
                table.append(block)
        self.block_tables[request_id] = table
        self.num_positions[request_id] = len(table) * self.block_size
        extra = self.blocks_for(max(num_positions, len(table) * self.block_size)) - len(table)
        if extra > self.num_free_blocks:
            self.free(request_id)
            raise MemoryError(f"request {request_id}: needs {extra} blocks, {self.num_free_blocks} free")
        for _ in range(extra):
            table.append(self._take_free_block())

    def share(self, request_id: int, source_id: int, num_positions: int) -> None:
        """Start `request_id` with the first `num_positions` of `source_id`'s blocks (a fork)."""
        source = self.block_tables[source_id]
        num_shared = self.blocks_for(num_positions)
        table = list(source[:num_shared])
        for block in table:
            self._take_reference(block)
        self.block_tables[request_id] = table
        self.num_positions[request_id] = num_positions

    def append(self, request_id: int, num_new_positions: int) -> list[tuple[int, int]]:
        """Store `num_new_positions` more positions; returns copy-on-write (src, dst) pairs."""
        table = self.block_tables[request_id]
        stored = self.num_positions[request_id]
        copies: list[tuple[int, int]] = []
        if num_new_positions <= 0:
            return copies
        if self._needs_copy_on_write(request_id):
            copies.append(self._copy_on_write(request_id))
        after = stored + num_new_positions
        need = self.blocks_for(after) - len(table)
        if need > self.num_free_blocks:
            raise MemoryError(f"request {request_id}: needs {need} blocks, {self.num_free_blocks} free")
        for _ in range(need):
            table.append(self._take_free_block())
        # Occupancy: fill slots block by block.
        bs = self.block_size
        first = stored // bs
        last = (after - 1) // bs
        for logical in range(first, last + 1):
            filled = min(bs, after - logical * bs)
            block = table[logical]
            if filled > self.num_filled[block]:
                self.num_filled[block] = filled
        self.num_positions[request_id] = after
        return copies

    def max_decode_steps(self, request_ids: list[int], limit: int, firsts: list[int] | None = None) -> int:
        """Most steps (<= limit) in which every request appends one position without running
        out of blocks or hitting a copy-on-write. `firsts`: first_new_block_steps(request_ids),
        when the caller has them."""
        if any(self._needs_copy_on_write(rid) for rid in request_ids):
            return 0
        if firsts is None:
            firsts = self.first_new_block_steps(request_ids)
        # With a spill hook, reusing a cached block must be planned (its copy-out), so a
        # run may only use truly free blocks.
        free = len(self.free_blocks) if self.on_evict is not None else self.num_free_blocks
        return max_steps_within(firsts, self.block_size, free, limit)

    def first_new_block_steps(self, request_ids: list[int]) -> list[int]:
        """For each request, the decode step (1-based) that first needs a new block."""
        bs = self.block_size
        return [first_new_block_step(len(self.block_tables[rid]) * bs, self.num_positions[rid]) for rid in request_ids]

    def append_decode_steps(self, request_ids: list[int], num_steps: int | Sequence[int],
                            firsts: list[int] | None = None) -> None:
        """Append one position per request per step for `num_steps` steps (or each request its
        own number of steps), with no copy-on-write.

        New blocks are taken in the order stepping one by one would take them: step by step,
        requests in the given order.
        """
        bs = self.block_size
        counts = [num_steps] * len(request_ids) if isinstance(num_steps, int) else num_steps
        if firsts is None:
            firsts = self.first_new_block_steps(request_ids)
        events = sorted((step, index) for index, (first, count) in enumerate(zip(firsts, counts))
                        for step in range(first, count + 1, bs))
        for _, index in events:
            self.block_tables[request_ids[index]].append(self._take_free_block())
        for rid, count in zip(request_ids, counts):
            after = self.num_positions[rid] + count
            table = self.block_tables[rid]
            for logical in range((after - count) // bs, (after - 1) // bs + 1):
                filled = min(bs, after - logical * bs)
                block = table[logical]
                if filled > self.num_filled[block]:
                    self.num_filled[block] = filled
            self.num_positions[rid] = after

    def free(self, request_id: int) -> None:
        """Drop a request's references, last logical block first (so evictions keep prefixes)."""
        table = self.block_tables.pop(request_id, None)
        self.num_positions.pop(request_id, None)
        if table is None:
            return
        for block in reversed(table):
            self._drop_reference(block)

    def locate(self, request_id: int, position: int) -> tuple[int, int]:
        """(physical block, slot) holding a logical position: table[t // block_size], t % block_size."""
        logical, slot = divmod(position, self.block_size)
        return self.block_tables[request_id][logical], slot

    def table(self, request_id: int) -> tuple[int, ...]:
        return tuple(self.block_tables.get(request_id, ()))

    def stored_positions(self, request_id: int) -> int:
        return self.num_positions[request_id]

    # ---- internals ------------------------------------------------------------------------

    def _needs_copy_on_write(self, request_id: int) -> bool:
        table = self.block_tables.get(request_id)
        if not table:
            return False
        stored = self.num_positions[request_id]
        last_logical = stored // self.block_size
        if stored % self.block_size == 0 or last_logical >= len(table):
            return False  # the next write starts a fresh block
        return self.ref_counts[table[last_logical]] > 1

    def _copy_on_write(self, request_id: int) -> tuple[int, int]:
        table = self.block_tables[request_id]
        logical = self.num_positions[request_id] // self.block_size
        source = table[logical]
        if self.num_free_blocks < 1:
            raise MemoryError(f"request {request_id}: copy-on-write needs a free block")
        target = self._take_free_block()
        self.num_filled[target] = self.num_positions[request_id] - logical * self.block_size
        table[logical] = target
        self._drop_reference(source)
        return source, target

    def _take_free_block(self) -> int:
        if self.free_blocks:
            block = self.free_blocks.popleft()
        elif self.evictable:
            block, _ = self.evictable.popitem(last=False)
            self._evict(block)
        else:
            raise MemoryError("no free KV block")
        self.ref_counts[block] = 1
        self.num_filled[block] = 0
        return block

    def _evict(self, block: int) -> None:
        block_hash = self.block_hash.pop(block)
        content = self.block_content.pop(block)
        entry = self.block_entry.pop(block)
        del self.cached_blocks[block_hash]
        self.num_evictions += 1
        if self.on_evict is not None:
            self.on_evict(block, block_hash, entry, content)

    def _take_reference(self, block: int) -> None:
        if self.ref_counts[block] == 0:
            # A cache hit on an evictable entry revives it.
            self.evictable.pop(block, None)
        elif self.ref_counts[block] == 1:
            self.num_shared_blocks += 1
        self.ref_counts[block] += 1

    def _drop_reference(self, block: int) -> None:
        count = self.ref_counts[block]
        if count <= 0:
            raise AssertionError(f"block {block}: reference count would drop below zero")
        self.ref_counts[block] = count - 1
        if count == 2:
            self.num_shared_blocks -= 1
        if count == 1:
            if block in self.block_hash:
                self.evictable[block] = None  # most recently used at the end
            else:
                self.num_filled[block] = 0
                self.free_blocks.append(block)

    def check(self) -> None:
        """Invariants: every block is exactly one of free / evictable / referenced, counts add up."""
        expected = [0] * self.num_blocks
        for table in self.block_tables.values():
            for block in table:
                expected[block] += 1
        if expected != self.ref_counts:
            block = next(b for b in range(self.num_blocks) if expected[b] != self.ref_counts[b])
            raise AssertionError(f"block {block}: ref count {self.ref_counts[block]} != {expected[block]} table entries")
        free = set(self.free_blocks)
        if len(free) != len(self.free_blocks):
            raise AssertionError("a block appears twice in the free pool")
        evictable = set(self.evictable)
        referenced = {b for b, count in enumerate(expected) if count}
        if free & referenced or evictable & referenced or free & evictable:
            raise AssertionError("a block is both free/evictable and referenced")
        if len(free) + len(evictable) + len(referenced) != self.num_blocks:
            raise AssertionError("block accounting does not add up")
        if self.num_shared_blocks != self.num_blocks - self.ref_counts.count(0) - self.ref_counts.count(1):
            raise AssertionError("shared-block counter is off")
        for request_id, table in self.block_tables.items():
            stored = self.num_positions[request_id]
            if len(table) < self.blocks_for(stored):
                raise AssertionError(f"request {request_id}: {len(table)} blocks cannot hold {stored} positions")
