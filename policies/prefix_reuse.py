"""Prefix reuse on the policy side (seed 21.4): lookups at admission, registering filled blocks,
and the host tier's copies of evicted cached blocks (spill and reload).

Mixed into `BasePolicy`; it reads the policy's block manager, hasher, host tier and plan.
"""

from __future__ import annotations

from typing import Any

from policies.host_prefix import HostPrefixCache
from policies.tally import Tally
from simcore.block_manager import PrefixHit
from simcore.request import Request

NO_HIT = PrefixHit((), ())


class PrefixReuseMixin:
    # Provided by BasePolicy.
    bm: Any
    hasher: Any
    host: Any
    host_prefix: HostPrefixCache | None
    tally: Tally
    _plan: Any
    _prefix: dict[int, tuple[list[int], list[tuple]]]

    def _lookup_prefix(self, request: Request) -> PrefixHit:
        if not self.bm.enable_prefix_caching or self.hasher is None or not self.hasher.has_content(request):
            return NO_HIT
        hashes, contents = self._prefix_chain(request)
        # Never count the last known token as a hit: its logits must be computed.
        max_blocks = (request.num_tokens - 1) // self.bm.block_size
        root = self.hasher.root_identity(request)
        return self.bm.lookup_prefix(hashes[:max_blocks], contents[:max_blocks], root)

    def _lookup_host_prefix(self, request: Request, hit: PrefixHit) -> list:
        """Where the device chain stops, continue it among blocks spilled to the host."""
        if self.host_prefix is None or not self.hasher.has_content(request):  # type: ignore[union-attr]
            return []
        hashes, contents = self._prefix_chain(request)
        start = hit.num_blocks
        stop = (request.num_tokens - 1) // self.bm.block_size
        if start >= stop:
            return []
        parent = self.bm.block_entry[hit.block_ids[-1]] if start else self.hasher.root_identity(request)  # type: ignore[union-attr]
        return self.host_prefix.lookup(hashes[start:stop], contents[start:stop], parent)

    def _reload_from_host(self, request: Request, first_logical: int, host_hits: list) -> None:
        """Fresh device blocks for host hits, filled by host -> device copies before the step."""
        assert self._plan is not None
        self._plan.pinned_host.update(h.host_block for h in host_hits)
        self._plan.copies.extend(self.bm.append(request.request_id, len(host_hits) * self.bm.block_size))
        table = self.bm.block_tables[request.request_id]
        for offset, hit in enumerate(host_hits):
            device_block = table[first_logical + offset]
            self._plan.swap_in.append((hit.host_block, device_block))
            self.bm.cache_block(device_block, hit.block_hash, hit.content, hit.parent, entry=hit.entry)
        self.tally.blocks_swapped_in += len(host_hits)
        self.tally.host_prefix_hit_blocks += len(host_hits)
        self.host_prefix.num_reloaded += len(host_hits)  # type: ignore[union-attr]

    def enable_prefix_spill(self) -> None:
        """Copy evicted prefix-cache blocks to the host tier instead of dropping them."""
        if self.host is None:
            raise ValueError("spilling prefix blocks needs a host tier (kv_cache.host_memory_gib > 0)")
        self.host_prefix = HostPrefixCache(self.host)
        self.bm.on_evict = self._spill

    def _spill(self, block: int, block_hash: int, entry: int, ident: tuple) -> None:
        assert self._plan is not None, "a cached block was evicted outside a step plan"
        host_block = self.host_prefix.spill(block_hash, entry, ident, pinned=self._plan.pinned_host)  # type: ignore[union-attr]
        if host_block is not None:
            self._plan.swap_out.append((block, host_block))
            self.tally.blocks_swapped_out += 1

    def _prefix_chain(self, request: Request) -> tuple[list[int], list[tuple]]:
        found = self._prefix.get(request.request_id)
        if found is None:
            assert self.hasher is not None
            contents = self.hasher.block_contents(request, request.num_final_positions)
            found = (self.hasher.chain(request, contents), contents)
            self._prefix[request.request_id] = found
        return found

    def _register_full_blocks(self, request: Request, before: int) -> None:
        if self.hasher is None or not self.hasher.has_content(request):
            return
        bs = self.bm.block_size
        first, last = before // bs, request.num_processed // bs
        if first == last:
            return
        hashes, contents = self._prefix_chain(request)
        table = self.bm.block_tables[request.request_id]
        root = self.hasher.root_identity(request)
        for logical in range(first, min(last, len(hashes))):
            parent = self.bm.parent_entry(table[logical - 1]) if logical else root
            self.bm.cache_block(table[logical], hashes[logical], contents[logical], parent)
