"""Property tests: random allocate/append/share/free sequences never corrupt the block pool."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.block_manager import BlockManager

OPS = st.lists(
    st.tuples(st.sampled_from(["new", "append", "share", "free", "cache"]), st.integers(0, 7), st.integers(1, 9)),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops=OPS, num_blocks=st.integers(1, 12), block_size=st.integers(1, 5), caching=st.booleans())
def test_random_operations_keep_the_pool_consistent(ops, num_blocks, block_size, caching):
    bm = BlockManager(num_blocks, block_size, enable_prefix_caching=caching)
    # Who wrote each (block, slot) and which request's view it belongs to.
    written: dict[tuple[int, int], int] = {}
    next_id = 0
    next_hash = 0
    for op, pick, n in ops:
        live = sorted(bm.block_tables)
        if op == "new":
            if bm.can_allocate(bm.blocks_for(n)):
                bm.allocate(next_id, 0)
                bm.append(next_id, n)
                _record_writes(bm, next_id, 0, n, written)
                next_id += 1
        elif op == "append" and live:
            rid = live[pick % len(live)]
            stored = bm.num_positions[rid]
            if bm.can_append(rid, n):
                copies = bm.append(rid, n)
                for _source, target in copies:
                    assert bm.ref_counts[target] == 1
                    # The copy carries the shared slots into the private block.
                    for slot in range(bm.num_filled[target]):
                        written[(target, slot)] = rid
                _record_writes(bm, rid, stored, n, written)
        elif op == "share" and live:
            source = live[pick % len(live)]
            positions = min(n, bm.num_positions[source])
            if positions > 0:
                bm.share(next_id, source, positions)
                next_id += 1
        elif op == "free" and live:
            bm.free(live[pick % len(live)])
        elif op == "cache" and live and caching:
            rid = live[pick % len(live)]
            full = bm.num_positions[rid] // block_size
            for logical in range(full):
                bm.cache_block(bm.block_tables[rid][logical], next_hash, ("c", next_hash))
                next_hash += 1
        bm.check()
        assert all(count >= 0 for count in bm.ref_counts)
    for rid in list(bm.block_tables):
        bm.free(rid)
    bm.check()
    assert bm.num_free_blocks == num_blocks  # nothing leaked
    assert all(count == 0 for count in bm.ref_counts)


def _record_writes(bm, rid, start, n, written):
    """A write may only land in a block that this request alone references."""
    for position in range(start, start + n):
        block, slot = bm.locate(rid, position)
        assert bm.ref_counts[block] == 1, f"request {rid} wrote into shared block {block}"
        written[(block, slot)] = rid


@settings(max_examples=100, deadline=None)
@given(lengths=st.lists(st.integers(1, 30), min_size=1, max_size=10), block_size=st.integers(1, 8))
def test_tables_cover_exactly_the_stored_positions(lengths, block_size):
    bm = BlockManager(400, block_size)  # room for 10 x 30 positions at block size 1
    for rid, length in enumerate(lengths):
        bm.allocate(rid, 0)
        bm.append(rid, length)
        assert len(bm.table(rid)) == -(-length // block_size)
        assert sum(bm.num_filled[b] for b in bm.table(rid)) == length
