"""BlockCounter against BlockManager: the same counts after the same random operations, decode
steps taken by some of the requests holding blocks, all for one number of steps or each its own."""

from __future__ import annotations

import random

import pytest

from simcore.block_counter import BlockCounter
from simcore.block_manager import BlockManager


def _same_state(counter: BlockCounter, manager: BlockManager) -> None:
    holders = sorted(manager.block_tables)
    assert sorted(counter.num_table_blocks) == holders
    assert counter.num_free_blocks == manager.num_free_blocks
    assert [counter.num_table_blocks[rid] for rid in holders] == [len(manager.block_tables[rid]) for rid in holders]
    assert counter.first_new_block_steps(holders) == manager.first_new_block_steps(holders)
    assert counter.num_positions == {rid: manager.num_positions[rid] for rid in holders}
    assert [counter.stored_positions(rid) for rid in holders] == [manager.stored_positions(rid) for rid in holders]
    for rid in holders:
        for more in (1, 5, 17):
            assert counter.num_new_blocks_needed(rid, more) == manager.num_new_blocks_needed(rid, more)
    counter.check()


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("seed", range(12))
def test_random_operations_count_as_block_ids_do(seed, block_size):
    rng = random.Random(seed)
    counter, manager = BlockCounter(400, block_size), BlockManager(400, block_size)
    next_id = 0
    for _ in range(300):
        holders = sorted(manager.block_tables)
        op = rng.random()
        if op < 0.2 or not holders:  # admit, reserving some positions (or none)
            positions = rng.choice([0, 0, rng.randrange(1, 60)])
            if manager.can_allocate(manager.blocks_for(positions)):
                for bm in (counter, manager):
                    bm.allocate(next_id, positions)
                next_id += 1
        elif op < 0.35:  # a prompt's chunk
            rid, chunk = rng.choice(holders), rng.randrange(1, 40)
            if manager.num_new_blocks_needed(rid, chunk) <= manager.num_free_blocks:
                for bm in (counter, manager):
                    bm.append(rid, chunk)
        elif op < 0.45:
            rid = rng.choice(holders)
            for bm in (counter, manager):
                bm.free(rid)
        else:  # decode steps: every holder or some, each the same number of steps or its own
            decoders = [rid for rid in holders if rng.random() < 0.8] if rng.random() < 0.5 else holders
            num_steps = rng.choice([1, 2, 3, block_size, block_size + 1, 3 * block_size + 2])
            firsts = manager.first_new_block_steps(decoders)
            if manager.max_decode_steps(decoders, num_steps, firsts) < num_steps:
                continue
            steps = num_steps if rng.random() < 0.5 else [rng.randint(0, num_steps) for _ in decoders]
            counter.append_decode_steps(decoders, steps, counter.first_new_block_steps(decoders))
            manager.append_decode_steps(decoders, steps, firsts)
        _same_state(counter, manager)
