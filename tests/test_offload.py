"""The host tier: swapped-out requests and spilled prefix blocks (seed 21.3, 21.4)."""

from __future__ import annotations

import pytest

from policies.registry import make_policy
from tests.helpers import drive, req, run
from tests.test_policies import pressured_workload

BS = 4


def ids_request(request_id, ids, arrival=0.0, output_len=1):
    return req(request_id, arrival, len(ids), output_len, prompt_token_ids=tuple(ids))


def test_evicted_prefix_blocks_spill_to_host_and_reload_on_a_hit():
    policy = make_policy("offload", num_blocks=8, block_size=BS, prefix_caching=True, num_host_blocks=20,
                         base="continuous")
    a_ids = tuple(range(100, 125))  # 25 tokens: 6 full blocks + 1
    policy.add(ids_request(0, a_ids), 0.0)
    drive(policy)
    assert len(policy.bm.evictable) == 6  # A's full blocks stay cached after it finishes
    # B needs the whole device: A's cached blocks are evicted and copied out to the host.
    policy.add(ids_request(1, tuple(range(500, 529))), 1.0)
    plan, _ = drive(policy, 1.0)
    assert len(plan.blocks_to_swap_out) == 6
    assert len(policy.prefix.host_prefix.entries) == 6
    spilled_a = sorted(e.host_block for e in policy.prefix.host_prefix.entries.values())
    # C repeats A's prompt: nothing on the device, six blocks reloaded from the host.
    c = ids_request(2, a_ids)
    policy.add(c, 2.0)
    plan, _ = drive(policy, 2.0)
    assert len(plan.blocks_to_swap_in) == 6
    host_blocks_read = sorted(h for h, _ in plan.blocks_to_swap_in)
    assert host_blocks_read == spilled_a
    assert c.num_prefix_hit_tokens == 24
    (seq,) = plan.seqs
    assert seq.context_len == 24 and seq.num_new_tokens == 1  # only the last position is computed
    policy.check()


def test_offload_policy_finishes_everything_and_matches_recompute_outputs():
    workload = pressured_workload(seed=11)
    outputs = {}
    for name, opts in (("continuous", {}), ("offload", {"base": "continuous"}), ("offload", {"chunk_size": 8})):
        policy, result = run(workload, name, num_blocks=24, block_size=BS,
                             num_host_blocks=200, max_num_seqs=8, max_num_batched_tokens=48, **opts)
        outputs[(name, tuple(opts.items()))] = {r.request_id: r.num_outputs for r in result.finished}
        assert len(result.finished) == len(workload)
        if name == "offload":
            assert policy.tally.preemptions["swap"] > 0 and policy.tally.preemptions["recompute"] == 0
            assert policy.host.num_free_blocks == 200
            swapped = [r for r in result.finished if r.num_swaps]
            assert swapped and all(r.swap_delay_s > 0 for r in swapped)
    first = next(iter(outputs.values()))
    assert all(o == first for o in outputs.values())


def test_offload_without_host_tier_is_an_error():
    with pytest.raises(ValueError, match="host tier"):
        make_policy("offload", num_blocks=8, block_size=BS)
