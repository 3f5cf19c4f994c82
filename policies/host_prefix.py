"""Prefix-cache entries spilled to the host tier when their device block is reused (seed 21.3/21.4).

An evicted cached block is copied out instead of lost; a later request whose chain continues
past its device hits can find the rest here and have it copied back in, paying link time
instead of recompute. Entries keep their logical identity (entry id), so verification along
the chain works across tiers. Swapped-out requests have priority: spilled entries only use free
host blocks and are evicted (LRU) when a swap needs room.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from policies.host_pool import HostPool


@dataclass(frozen=True, slots=True)
class HostEntry:
    host_block: int
    block_hash: int
    entry: int
    parent: object
    content: tuple


class HostPrefixCache:
    def __init__(self, host: HostPool) -> None:
        self.host = host
        self.entries: OrderedDict[int, HostEntry] = OrderedDict()  # hash -> entry, LRU first
        self.num_spilled = 0
        self.num_reloaded = 0

    def spill(self, block_hash: int, entry: int, ident: tuple, pinned: set[int] = frozenset()) -> int | None:  # type: ignore[assignment]
        """Keep a copy of an evicted device block; returns the host block to copy into, if any."""
        if block_hash in self.entries:
            self.entries.move_to_end(block_hash)
            return None
        host_block = self.host.take_block()
        if host_block is None:
            victim = self._oldest_unpinned(pinned)
            if victim is None:
                return None
            host_block = self.entries.pop(victim).host_block
        parent, content = ident
        self.entries[block_hash] = HostEntry(host_block, block_hash, entry, parent, content)
        self.num_spilled += 1
        return host_block

    def lookup(self, hashes, contents, parent: object) -> list[HostEntry]:  # noqa: ANN001
        """Continue a chain on the host: consecutive verified entries starting at hashes[0]."""
        found: list[HostEntry] = []
        for block_hash, content in zip(hashes, contents):
            hit = self.entries.get(block_hash)
            if hit is None or hit.parent != parent or hit.content != content:
                break
            found.append(hit)
            parent = hit.entry
        for hit in found:
            self.entries.move_to_end(hit.block_hash)
        return found

    def make_room(self, num_blocks: int, pinned: set[int] = frozenset()) -> None:  # type: ignore[assignment]
        """Evict spilled entries until the host has `num_blocks` free blocks for a swap."""
        while self.host.num_free_blocks < num_blocks:
            victim = self._oldest_unpinned(pinned)
            if victim is None:
                return
            self.host.give_block(self.entries.pop(victim).host_block)

    def _oldest_unpinned(self, pinned: set[int]) -> int | None:
        for block_hash, entry in self.entries.items():
            if entry.host_block not in pinned:
                return block_hash
        return None

    def held_blocks(self) -> list[int]:
        return [e.host_block for e in self.entries.values()]
