"""Prefix caching across requests (seed 21.4): hash chains, verification, isolation, retention."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.registry import make_policy
from simcore.prefix import PrefixHasher
from tests.helpers import drive, req, run

BS = 4
BASE = tuple(range(100, 112))  # three blocks of four tokens: "A gentle breeze stirred" ...


def tokens_request(request_id, ids, arrival=0.0, output_len=2, **kw):
    return req(request_id, arrival, len(ids), output_len, prompt_token_ids=tuple(ids), **kw)


def chain(ids, **kw):
    hasher = PrefixHasher(BS)
    r = tokens_request(0, ids, **kw)
    return hasher.chain(r, hasher.block_contents(r, len(ids)))


def test_seed_block_change_examples():
    h = chain(BASE)
    changed_3 = chain(BASE[:8] + (999,) + BASE[9:])
    changed_2 = chain(BASE[:4] + (999,) + BASE[5:])
    other_prefix = chain((7, 7, 7, 7, 8, 8, 8, 8) + BASE[8:])
    # A change only in block 3 keeps blocks 1 and 2 reusable.
    assert changed_3[:2] == h[:2] and changed_3[2] != h[2]
    # A change in block 2 keeps block 1 but changes both later identities.
    assert changed_2[0] == h[0] and changed_2[1] != h[1] and changed_2[2] != h[2]
    # An identical block-3 phrase after a different prefix is not interchangeable.
    assert other_prefix[2] != h[2]


def _hit_tokens_after(first_ids, second_ids, **kw2):
    policy = make_policy("continuous", num_blocks=50, block_size=BS, prefix_caching=True)
    first = tokens_request(0, first_ids, output_len=1)
    policy.add(first, 0.0)
    drive(policy)
    assert first.is_finished  # its blocks are now evictable cache entries
    second = tokens_request(1, second_ids, output_len=1, **kw2)
    policy.add(second, 1.0)
    plan, _ = drive(policy, 1.0)
    return second.num_prefix_hit_tokens, plan


def test_seed_examples_through_the_policy():
    longer = BASE + (1, 2, 3)  # a suffix, so block 3 is not the prompt's last token
    assert _hit_tokens_after(longer, BASE[:8] + (999,) + BASE[9:] + (1, 2, 3))[0] == 8
    assert _hit_tokens_after(longer, BASE[:4] + (999,) + BASE[5:] + (1, 2, 3))[0] == 4
    assert _hit_tokens_after(longer, (7, 7, 7, 7, 8, 8, 8, 8) + BASE[8:] + (1, 2, 3))[0] == 0


def test_fully_cached_prompt_still_computes_its_last_position():
    hits, plan = _hit_tokens_after(BASE, BASE)
    # 12 tokens all cached, but first-token logits need a computed position: one block recomputed.
    assert hits == 8
    (seq,) = plan.seqs
    assert seq.context_len == 8 and seq.num_new_tokens == 4 and seq.selects_token


def test_cost_models_see_the_saved_work():
    _, plan = _hit_tokens_after(BASE + (1, 2, 3), BASE + (4, 5, 6))
    assert plan.num_prefill_tokens == 15 - 12


def test_different_salts_or_adapters_never_share():
    longer = BASE + (1,)
    assert _hit_tokens_after(longer, longer)[0] == 12
    assert _hit_tokens_after(longer, longer, cache_salt="tenant-b")[0] == 0
    assert _hit_tokens_after(longer, longer, adapter_id="lora-7")[0] == 0


def test_hash_collisions_are_caught_by_content_verification():
    policy = make_policy("continuous", num_blocks=50, block_size=BS, prefix_caching=True,
                         hasher=PrefixHasher(BS, hash_fn=lambda parts: 42))  # every block collides
    a = tokens_request(0, BASE + (1,), output_len=1)
    policy.add(a, 0.0)
    drive(policy)
    b = tokens_request(1, (9, 9, 9, 9) + BASE[4:] + (1,), output_len=1)
    policy.add(b, 1.0)
    drive(policy, 1.0)
    assert b.num_prefix_hit_tokens == 0  # same hash, different tokens: no aliasing


def test_segments_share_like_tokens_without_token_ids():
    policy = make_policy("continuous", num_blocks=50, block_size=BS, prefix_caching=True)
    system = ("sys:0", 10)
    a = req(0, 0.0, 13, 1, segments=(system, ("user:a", 3)))
    b = req(1, 1.0, 14, 1, segments=(system, ("user:b", 4)))
    policy.add(a, 0.0)
    drive(policy)
    policy.add(b, 1.0)
    drive(policy, 1.0)
    assert b.num_prefix_hit_tokens == 8  # two full blocks of the 10-token system prompt


def test_lru_eviction_of_cached_blocks_under_pressure():
    policy = make_policy("continuous", num_blocks=6, block_size=BS, prefix_caching=True)
    for i in range(4):
        r = tokens_request(i, tuple(range(1000 * i, 1000 * i + 13)), arrival=float(i), output_len=1)
        policy.add(r, float(i))
        drive(policy, float(i))
    assert policy.bm.num_evictions > 0
    policy.check()


def test_hit_rate_metrics_and_caching_off_vs_on():
    def workload():
        rng = random.Random(0)
        prefixes = [tuple(rng.randrange(1000) for _ in range(24)) for _ in range(3)]
        return [
            tokens_request(i, prefixes[i % 3] + tuple(rng.randrange(1000) for _ in range(5)), arrival=i * 0.05,
                           output_len=3)
            for i in range(30)
        ]

    results = {}
    for caching in (False, True):
        policy, result = run(workload(), "chunked_prefill", num_blocks=200, block_size=BS, chunk_size=8,
                             prefix_caching=caching)
        results[caching] = result
        assert policy.bm.num_free_blocks == 200
    outputs = [{r.request_id: r.num_outputs for r in results[c].finished} for c in (False, True)]
    assert outputs[0] == outputs[1]
    hits = sum(r.num_prefix_hit_tokens for r in results[True].finished)
    assert hits >= 27 * 24  # every request after the first of each prefix reuses all 6 blocks
    assert sum(results[True].steps.as_dict()["num_prefill_tokens"]) < sum(results[False].steps.as_dict()["num_prefill_tokens"])


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    num_blocks=st.integers(12, 60),
    policy_name=st.sampled_from(["continuous", "chunked_prefill"]),
    preemption=st.sampled_from(["recompute", "swap"]),
)
def test_random_workloads_read_only_their_own_prefix(seed, num_blocks, policy_name, preemption):
    """The blocks a request reads always hold its own content; nothing crosses salts."""
    rng = random.Random(seed)
    prefixes = [tuple(rng.randrange(50) for _ in range(rng.randint(4, 20))) for _ in range(3)]
    requests = []
    for i in range(20):
        ids = rng.choice(prefixes) + tuple(rng.randrange(50) for _ in range(rng.randint(1, 8)))
        requests.append(tokens_request(i, ids, arrival=i * 0.01, output_len=rng.randint(1, 6),
                                       cache_salt=rng.choice([None, "x"])))
    options = {"chunk_size": 6} if policy_name == "chunked_prefill" else {}
    policy = make_policy(policy_name, num_blocks=num_blocks, block_size=BS, prefix_caching=True,
                         num_host_blocks=100, preemption=preemption, max_num_batched_tokens=64, **options)
    truth: dict[int, int] = {}  # physical block -> hash of the content it was filled with
    host_truth: dict[int, int] = {}
    pending = sorted(requests, key=lambda r: r.arrival_s)
    now = 0.0
    for _ in range(2000):
        while pending and pending[0].arrival_s <= now:
            policy.add(pending.pop(0), now)
        if not policy.has_work() and not pending:
            break
        plan = policy.schedule(now)
        now += 0.01
        if plan is None:
            continue
        # Apply the plan's data movement the way an engine would, before the step runs.
        for dev, host in plan.blocks_to_swap_out:
            if dev in truth:
                host_truth[host] = truth[dev]
        for host, dev in plan.blocks_to_swap_in:
            truth.pop(dev, None)
            if host in host_truth:
                truth[dev] = host_truth.pop(host)
        for src, dst in plan.blocks_to_copy:
            truth.pop(dst, None)
            if src in truth:
                truth[dst] = truth[src]
        for seq in plan.seqs:
            r = policy.by_id[seq.request_id]
            hashes, _ = policy.prefix._chain(r)
            table = policy.bm.block_tables[r.request_id]
            # Every full block the request reads as context must hold its own chain's content.
            for logical in range(seq.context_len // BS):
                if logical < len(hashes) and table[logical] in truth:
                    assert truth[table[logical]] == hashes[logical]
        # Record what each block now holds: the full blocks this step's writes completed.
        written = []
        for seq in plan.seqs:
            r = policy.by_id[seq.request_id]
            hashes, _ = policy.prefix._chain(r)
            table = policy.bm.block_tables[r.request_id]
            for logical in range(seq.context_len // BS, min(seq.end_len // BS, len(hashes))):
                written.append((table[logical], hashes[logical]))
        policy.complete(plan, now)
        truth.update(written)
        policy.check()
    assert not policy.has_work()
    assert policy.bm.num_used_blocks == 0


def test_collision_that_ignores_the_chain_still_cannot_cross_salts():
    # A deliberately weak hash: a block's hash depends only on its own tokens, not on h_{i-1}
    # or the salt. Verification (content + parent identity) must still refuse the hit.
    def weak(parts):
        return hash(parts[1]) if len(parts) == 2 else 0

    policy = make_policy("continuous", num_blocks=50, block_size=BS, prefix_caching=True,
                         hasher=PrefixHasher(BS, hash_fn=weak))
    a = tokens_request(0, BASE + (1,), output_len=1)
    policy.add(a, 0.0)
    drive(policy)
    b = tokens_request(1, BASE + (1,), output_len=1, cache_salt="other-tenant")
    policy.add(b, 1.0)
    drive(policy, 1.0)
    assert b.num_prefix_hit_tokens == 0
    c = tokens_request(2, BASE + (1,), output_len=1)
    policy.add(c, 2.0)
    drive(policy, 2.0)
    assert c.num_prefix_hit_tokens == 12  # same salt: the weak hash still finds the real match


@pytest.mark.parametrize("name,options", [
    ("continuous", {}),
    ("continuous", {"admission": "watermark", "watermark": 0.1}),
    ("chunked_prefill", {"chunk_size": 16}),
    ("offload", {"chunk_size": 16}),
])
def test_a_cache_that_cannot_hit_runs_on_block_counts_with_the_same_results(tmp_path, name, options):
    """Requests of lengths alone carry no token content, so a prefix cache can never hit: the
    runner then runs the policy on block counts (every fast path), counting the lookups only.
    Its tables are those of the same run on a caching block manager, stepped one step at a time."""
    import pandas as pd

    from backends.constant import ConstantCostModel
    from experiments.config import parse_experiment
    from experiments.runner import run_experiment
    from simcore.cluster import simulate
    from simcore.engine import RunLimits
    from simcore.metrics import request_frame
    from tests.helpers import SMALL_EXPERIMENT
    from workloads.build import build as build_workload

    host_gib = 0.01 if name == "offload" else 0.0
    data = {**SMALL_EXPERIMENT, "kv_cache": {"block_size": 4, "num_blocks": 60, "prefix_caching": True,
                                             "host_memory_gib": host_gib},
            "workload": {**SMALL_EXPERIMENT["workload"], "num_requests": 60, "arrivals": {"kind": "poisson", "rate": 100.0}},
            "cost_model": {"name": "constant", "step_s": 0.01, "per_token_s": 0.0001},
            "policies": [{"name": name, "max_num_batched_tokens": 64, "max_num_seqs": 8, **options}]}
    run = run_experiment(parse_experiment(data, source="exp.yaml"), source="exp.yaml", out_dir=tmp_path)
    assert any("cannot hit" in note for note in run.info["workload_notes"])
    (fast,) = run.runs
    policy = make_policy(name, num_blocks=60, block_size=4, prefix_caching=True, max_num_batched_tokens=64,
                         max_num_seqs=8, num_host_blocks=run.info["kv_num_host_blocks"],
                         block_bytes=run.info["kv_block_bytes"], **options)
    assert policy.bm.enable_prefix_caching
    template = build_workload(run.experiment.workload, seed=run.experiment.seed, base_dir=tmp_path).requests
    slow = simulate(template, policy, ConstantCostModel(step_s=0.01, per_token_s=0.0001),
                    limits=RunLimits(check_invariants=True))
    pd.testing.assert_frame_equal(request_frame(slow.requests), fast.requests, check_exact=True)
    pd.testing.assert_frame_equal(pd.DataFrame(slow.steps.as_dict()), pd.DataFrame(fast.result.steps.as_dict()),
                                  check_exact=True)
    assert fast.summary["prefix_cache_queries"] > 0 and fast.summary["prefix_cache_hits"] == 0
    assert fast.summary["num_preemptions"] > 0, "the workload should be crowded enough to preempt"
    if name == "offload":
        assert fast.summary["num_preemptions_swap"] > 0


def test_a_cache_that_can_hit_is_kept(tmp_path):
    """With shared prefixes (token content) the cache runs on its block manager and hits."""
    from experiments.config import parse_experiment
    from experiments.runner import run_experiment
    from tests.helpers import SMALL_EXPERIMENT

    workload = {**SMALL_EXPERIMENT["workload"], "num_requests": 30,
                "prefix": {"num_prefixes": 2, "prefix_len": {"kind": "fixed", "value": 64}, "choice": {"kind": "uniform"}}}
    data = {**SMALL_EXPERIMENT, "kv_cache": {"block_size": 16, "num_blocks": 200, "prefix_caching": True},
            "workload": workload}
    run = run_experiment(parse_experiment(data, source="exp.yaml"), source="exp.yaml", out_dir=tmp_path)
    assert not any("cannot hit" in note for note in run.info["workload_notes"])
    assert run.runs[0].summary["prefix_cache_hits"] > 0
