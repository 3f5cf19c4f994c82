"""Prefix reuse on the policy side (seed 21.4): lookups at admission, registering filled blocks,
and the host tier's copies of evicted cached blocks (spill and reload)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from policies.host_pool import HostPool
from policies.host_prefix import HostEntry, HostPrefixCache
from policies.tally import Tally
from simcore.block_manager import BlockManager, PrefixHit
from simcore.prefix import BlockContent, PrefixHasher
from simcore.request import Request

if TYPE_CHECKING:
    from policies.base import PlanBuilder

NO_HIT = PrefixHit((), ())


class PrefixReuse:
    """What a scheduler needs of the prefix cache: hits for a request, and its filled blocks
    registered as it goes. Inert (no hits, nothing registered) where the block manager has no
    prefix cache or requests carry no content."""

    def __init__(self, bm: BlockManager, hasher: PrefixHasher | None, host: HostPool | None, tally: Tally) -> None:
        self.bm = bm
        self.hasher = hasher
        self.host = host
        self.tally = tally
        # Whether there is a prefix cache to hit and to register blocks in.
        self.enabled = bm.enable_prefix_caching and hasher is not None
        # Blocks evicted from the device cache copied to the host tier (offload's spill_prefix).
        self.host_prefix: HostPrefixCache | None = None
        # The plan being built, which an eviction's copy to the host joins (set by `schedule`).
        self.builder: PlanBuilder | None = None
        # Each request's block hashes and contents, worked out once.
        self._chains: dict[int, tuple[list[int], list[BlockContent]]] = {}

    def lookup(self, request: Request, *, remember: bool = True) -> PrefixHit:
        """The device blocks that already hold the request's first blocks (`remember`: keep the
        request's block hashes for its later lookups; a router asking about a request that may
        never come here does not)."""
        if not self.enabled or not self.hasher.has_content(request):  # type: ignore[union-attr]
            return NO_HIT
        hashes, contents = self._chain(request, remember)
        # Never count the last known token as a hit: its logits must be computed.
        max_blocks = (request.num_tokens - 1) // self.bm.block_size
        root = self.hasher.root_identity(request)  # type: ignore[union-attr]
        return self.bm.lookup_prefix(hashes[:max_blocks], contents[:max_blocks], root)

    def lookup_host(self, request: Request, hit: PrefixHit) -> list[HostEntry]:
        """Where the device chain stops, its continuation among blocks spilled to the host."""
        if self.host_prefix is None or not self.hasher.has_content(request):  # type: ignore[union-attr]
            return []
        hashes, contents = self._chain(request)
        start = hit.num_blocks
        stop = (request.num_tokens - 1) // self.bm.block_size
        if start >= stop:
            return []
        parent = self.bm.block_entry[hit.block_ids[-1]] if start else self.hasher.root_identity(request)  # type: ignore[union-attr]
        return self.host_prefix.lookup(hashes[start:stop], contents[start:stop], parent)

    def reload_from_host(self, request: Request, first_logical: int, host_hits: list[HostEntry]) -> None:
        """Fresh device blocks for host hits, filled by host -> device copies before the step."""
        builder = self.builder
        assert builder is not None and self.host_prefix is not None
        builder.pinned_host.update(hit.host_block for hit in host_hits)
        builder.copies.extend(self.bm.append(request.request_id, len(host_hits) * self.bm.block_size))
        table = self.bm.block_tables[request.request_id]
        for offset, hit in enumerate(host_hits):
            device_block = table[first_logical + offset]
            builder.swap_in.append((hit.host_block, device_block))
            self.bm.cache_block(device_block, hit.block_hash, hit.content, hit.parent, entry=hit.entry)
        self.tally.blocks_swapped_in += len(host_hits)
        self.tally.host_prefix_hit_blocks += len(host_hits)
        self.host_prefix.num_reloaded += len(host_hits)

    def enable_spill(self) -> None:
        """Copy evicted prefix-cache blocks to the host tier instead of dropping them."""
        if self.host is None:
            raise ValueError("spilling prefix blocks needs a host tier (kv_cache.host_memory_gib > 0)")
        self.host_prefix = HostPrefixCache(self.host)
        self.bm.on_evict = self._spill

    def _spill(self, block: int, block_hash: int, entry: int, ident: tuple) -> None:
        builder = self.builder
        assert builder is not None and self.host_prefix is not None, "a cached block was evicted outside a step plan"
        host_block = self.host_prefix.spill(block_hash, entry, ident, pinned=builder.pinned_host)
        if host_block is not None:
            builder.swap_out.append((block, host_block))
            self.tally.blocks_swapped_out += 1

    def register_full_blocks(self, request: Request, before: int) -> None:
        """Blocks the request filled since it had `before` positions become cache entries."""
        if not self.enabled or not self.hasher.has_content(request):  # type: ignore[union-attr]
            return
        bs = self.bm.block_size
        first, last = before // bs, request.num_processed // bs
        if first == last:
            return
        hashes, contents = self._chain(request)
        table = self.bm.block_tables[request.request_id]
        root = self.hasher.root_identity(request)  # type: ignore[union-attr]
        for logical in range(first, min(last, len(hashes))):
            parent = self.bm.parent_entry(table[logical - 1]) if logical else root
            self.bm.cache_block(table[logical], hashes[logical], contents[logical], parent)

    def forget(self, request_id: int) -> None:
        self._chains.pop(request_id, None)

    def _chain(self, request: Request, remember: bool = True) -> tuple[list[int], list[BlockContent]]:
        found = self._chains.get(request.request_id)
        if found is None:
            assert self.hasher is not None
            contents = self.hasher.block_contents(request, request.num_final_positions)
            found = (self.hasher.chain(request, contents), contents)
            if remember:
                self._chains[request.request_id] = found
        return found
