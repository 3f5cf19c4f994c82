"""The fast path (decode stretches taken at once) changes nothing: identical results to stepping."""

from __future__ import annotations

import random

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.constant import ConstantCostModel
from policies.registry import make_policy
from simcore.engine import RunLimits, simulate
from simcore.metrics import request_frame
from tests.helpers import req

POLICIES = (
    ("static", {"max_batch_size": 5}),
    ("static", {"max_batch_size": 5, "padded": True}),
    ("continuous", {}),
    ("continuous", {"mixed": True}),
    ("continuous", {"admission": "reserve"}),
    ("continuous", {"admission": "watermark", "watermark": 0.1}),
    ("chunked_prefill", {"chunk_size": 16}),
    ("chunked_prefill", {"chunk_size": 200}),  # the chunk is the budget left beside the decodes
    ("chunked_prefill", {"chunk_size": 16, "order": "alternate"}),
    ("continuous", {"preemption": "swap"}),
    ("chunked_prefill", {"chunk_size": 16, "preemption": "swap"}),
    ("offload", {"base": "continuous"}),
    ("offload", {"chunk_size": 16}),
)



def small_policy(name: str, opts: dict, *, caching: bool, num_blocks: int = 64):
    """One of POLICIES on a small device (a host tier where it swaps), 12 seats, 96 tokens a step."""
    needs_host = name == "offload" or opts.get("preemption") == "swap"
    return make_policy(name, num_blocks=num_blocks, block_size=4, prefix_caching=caching,
                       num_host_blocks=400 if needs_host else 0, max_num_seqs=12, max_num_batched_tokens=96, **opts)

def workload(seed: int, *, content: bool, sessions: bool = False):
    rng = random.Random(seed)
    prefixes = [tuple(rng.randrange(100) for _ in range(rng.randint(8, 40))) for _ in range(3)]
    requests = []
    t = 0.0
    for i in range(60):
        t += rng.expovariate(20.0)
        prompt = rng.choice(prefixes) + tuple(rng.randrange(100) for _ in range(rng.randint(1, 30)))
        kw = {"prompt_token_ids": prompt} if content else {}
        if sessions and i % 4 and i > 0:
            kw.update(parent_id=i - 1, think_time_s=rng.uniform(0.01, 0.2))
        requests.append(req(i, t, len(prompt), rng.randint(1, 60), **kw))
    return requests


def run_both(requests, name, opts, *, cost, caching: bool, horizon=None):
    frames = []
    for fast in (False, True):
        policy = small_policy(name, opts, caching=caching)
        result = simulate(requests, policy, cost,
                          limits=RunLimits(fast_forward=fast, max_sim_time_s=horizon, check_invariants=True))
        frames.append((result, request_frame(result.requests), pd.DataFrame(result.steps.as_dict())))
    return frames


@pytest.mark.parametrize("name,opts", POLICIES)
@pytest.mark.parametrize("caching", [False, True])
def test_fast_path_matches_step_by_step(name, opts, caching):
    from backends.base import CostContext
    from backends.roofline import make_roofline
    from simcore.presets import get_model

    cost = make_roofline({}, CostContext(model=get_model("llama-3.1-8b"), hardware_name="h100-sxm"))
    requests = workload(7, content=caching, sessions=True)
    (slow, slow_requests, slow_steps), (fast, fast_requests, fast_steps) = run_both(
        requests, name, opts, cost=cost, caching=caching)
    pd.testing.assert_frame_equal(slow_requests, fast_requests, check_exact=True)
    pd.testing.assert_frame_equal(slow_steps, fast_steps, check_exact=True)
    assert _expanded(slow.itl) == _expanded(fast.itl)  # the same inter-token gaps
    assert slow.sim_time_s == fast.sim_time_s


def _expanded(itl):
    merged: dict[float, int] = {}
    for value, weight in zip(itl.values, itl.weights):
        merged[value] = merged.get(value, 0) + weight
    return sorted(merged.items())


@pytest.mark.parametrize("seed", [3, 5])
@pytest.mark.parametrize("name,opts", POLICIES)
def test_counting_blocks_matches_tracking_block_ids(name, opts, seed):
    """Also the preemption worked out on counts (`_preempt_for_decodes`) against the one-by-one
    loop, and swaps to a host tier on counts (a small one: some victims find it full and are
    recomputed) against swaps of tracked blocks; the counted runs on the fast path too."""
    from backends.base import CostContext
    from backends.roofline import make_roofline
    from simcore.block_counter import BlockCounter
    from simcore.presets import get_model

    cost = make_roofline({}, CostContext(model=get_model("llama-3.1-8b"), hardware_name="h100-sxm"))
    requests = workload(seed, content=False, sessions=True)
    swaps = name == "offload" or opts.get("preemption") == "swap"
    frames = []
    for track, fast in ((True, False), (False, False), (False, True)):
        policy = make_policy(name, num_blocks=64, block_size=4, max_num_seqs=12, max_num_batched_tokens=96,
                             num_host_blocks=24 if swaps else 0, block_bytes=4096, track_block_ids=track, **opts)
        assert isinstance(policy.bm, BlockCounter) != track
        result = simulate(requests, policy, cost, limits=RunLimits(fast_forward=fast, check_invariants=True))
        frames.append((request_frame(result.requests), pd.DataFrame(result.steps.as_dict()), result.itl))
        if swaps:
            assert policy.tally.preemptions["swap"] > 0 and policy.tally.blocks_swapped_in > 0
    for other in frames[1:]:
        pd.testing.assert_frame_equal(frames[0][0], other[0], check_exact=True)
        pd.testing.assert_frame_equal(frames[0][1], other[1], check_exact=True)
        assert _expanded(frames[0][2]) == _expanded(other[2])


def test_a_host_tier_alone_counts_blocks():
    """Swaps copy blocks that a cost model only counts: a host tier needs no block ids (only a
    prefix cache or a real engine's tables do), and the copies' device side says so."""
    from simcore.block_counter import BlockCounter
    from simcore.plan import NO_BLOCK_ID

    policy = make_policy("continuous", num_blocks=12, block_size=4, num_host_blocks=20, preemption="swap")
    assert isinstance(policy.bm, BlockCounter)
    assert not isinstance(make_policy("continuous", num_blocks=12, num_host_blocks=20, prefix_caching=True).bm,
                          BlockCounter)
    requests = [req(0, 0.0, 8, 30), req(1, 0.0, 8, 30)]
    for request in requests:
        policy.add(request, 0.0)
    moves = []
    now = 0.0
    while policy.has_work() and now < 10:
        plan = policy.schedule(now)
        moves += [*plan.blocks_to_swap_out, *plan.blocks_to_swap_in]
        now += 0.01
        policy.complete(plan, now)
        policy.check()
    assert moves and {device for device, _ in moves[:1]} == {NO_BLOCK_ID}
    assert all(NO_BLOCK_ID in move for move in moves)


@pytest.mark.parametrize("name,opts", POLICIES[:4])
def test_fast_path_matches_with_constant_costs_ties_and_a_horizon(name, opts):
    # Constant step times and arrivals on the same grid make ties between arrivals and step ends.
    requests = [req(i, 0.01 * (i // 2), 5 + i % 7, 3 + (i * 7) % 30) for i in range(40)]
    cost = ConstantCostModel(step_s=0.01)
    (slow, slow_requests, slow_steps), (fast, fast_requests, fast_steps) = run_both(
        requests, name, opts, cost=cost, caching=False, horizon=0.6)
    pd.testing.assert_frame_equal(slow_requests, fast_requests, check_exact=True)
    pd.testing.assert_frame_equal(slow_steps, fast_steps, check_exact=True)
    assert slow.end_reason == fast.end_reason


def test_mixed_stretches_are_planned_and_match():
    """Chunked prefill without caching or a host tier takes decode+chunk steps at once too."""
    from tests.helpers import drive

    policy = make_policy("chunked_prefill", num_blocks=200, block_size=4, chunk_size=16, max_num_batched_tokens=64)
    policy.add(req(0, 0.0, 8, 50), 0.0)
    _, now = drive(policy)
    policy.add(req(1, now, 300, 5), now)
    _, now = drive(policy, now)  # request 1 admitted with its first chunk beside request 0's decode
    stretch = policy.plan_stretch()
    assert stretch is not None and stretch.prefill.request_id == 1 and stretch.chunk == 16
    pending = 300 - 16
    # Every chunk, and, with nothing waiting, the shorter one completing the prompt (the tail).
    assert stretch.num_steps == (pending - 1) // 16 + 1 and stretch.tail == pending - (pending - 1) // 16 * 16

    # A waiting request joins the last chunk's step (here the chunks fill the budget, so only
    # that step has room): the stretch's last step admits it with a first chunk in the room left.
    policy = make_policy("chunked_prefill", num_blocks=200, block_size=4, chunk_size=16, max_num_batched_tokens=17)
    policy.add(req(0, 0.0, 8, 50), 0.0)
    _, now = drive(policy)
    policy.add(req(1, now, 300, 5), now)
    _, now = drive(policy, now)
    policy.add(req(2, now, 40, 5), now)
    stretch = policy.plan_stretch()
    tail = pending - (pending - 1) // 16 * 16
    assert stretch is not None and stretch.num_steps == (pending - 1) // 16 + 1 and stretch.tail == tail
    assert stretch.newcomer.request_id == 2 and stretch.newcomer_chunk == 17 - 1 - tail and stretch.then is None
    assert stretch.admits_newcomer(stretch.num_steps) and not stretch.admits_newcomer(stretch.num_steps - 1)

    requests = [req(i, 0.05 * i, 120, 30) for i in range(8)]  # fits the 64 x 4 positions of run_both
    cost = ConstantCostModel(step_s=0.01, per_token_s=1e-4)
    (_, slow_requests, slow_steps), (_, fast_requests, fast_steps) = run_both(
        requests, "chunked_prefill", {"chunk_size": 16}, cost=cost, caching=False)
    pd.testing.assert_frame_equal(slow_requests, fast_requests, check_exact=True)
    pd.testing.assert_frame_equal(slow_steps, fast_steps, check_exact=True)
    assert ((fast_steps["num_prefill_tokens"] > 0) & (fast_steps["num_decode_tokens"] > 0)).any()


def test_weighted_percentiles_equal_the_expanded_list():
    import numpy as np

    from simcore.itl import weighted_percentile

    rng = np.random.default_rng(0)
    for size in [*rng.integers(1, 20, size=50), 3000, 20000]:  # large ones: a sort that moves equal values
        values = rng.random(size).round(2)
        weights = rng.integers(1, 5, size=values.size)
        expanded = np.repeat(values, weights)
        for q in (0, 1, 50, 90, 95, 99, 100):
            assert weighted_percentile(values, weights, q) == pytest.approx(np.percentile(expanded, q), abs=1e-12)


def test_fast_path_plans_decodes_as_groups_and_the_step_path_does_not():
    """Single steps on the fast path carry their decodes as one DecodeGroup (columns); stepping
    one by one keeps one ScheduledSeq per request. test_fast_path_matches_step_by_step shows the
    two agree."""
    seen = {True: [], False: []}

    class Spy(ConstantCostModel):
        def step_time(self, plan):  # noqa: ANN001, ANN202
            seen[fast].append(plan.decodes is not None)
            return super().step_time(plan)

    # Arrivals in pairs: two prompts share steps, which no stretch plans, so single steps remain.
    requests = [req(i, 0.05 * (i // 2), 40, 30) for i in range(8)]
    for fast in (False, True):
        policy = make_policy("chunked_prefill", num_blocks=200, block_size=4, chunk_size=16,
                             max_num_batched_tokens=64)
        simulate(requests, policy, Spy(step_s=0.01, per_token_s=1e-4),
                 limits=RunLimits(fast_forward=fast, check_invariants=True))
    assert any(seen[True]) and not any(seen[False])


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), config=st.sampled_from(POLICIES), caching=st.booleans(),
       num_blocks=st.sampled_from([24, 64, 400]))
def test_fast_path_matches_step_by_step_on_random_workloads(seed, config, caching, num_blocks):
    """Random arrivals, lengths, sessions and memory pressure: the fast path (stretches, decode
    groups, preemption on counts) and the straightforward loop give the same tables."""
    from backends.base import CostContext
    from backends.roofline import make_roofline
    from simcore.presets import get_model

    name, opts = config
    cost = make_roofline({}, CostContext(model=get_model("llama-3.1-8b"), hardware_name="h100-sxm"))
    requests = [r for r in workload(seed, content=caching, sessions=seed % 2 == 0)
                if (r.prompt_len + r.output_len + 3) // 4 <= num_blocks]
    frames = []
    for fast in (False, True):
        policy = small_policy(name, opts, caching=caching, num_blocks=num_blocks)
        result = simulate(requests, policy, cost, limits=RunLimits(fast_forward=fast))
        frames.append((request_frame(result.requests), pd.DataFrame(result.steps.as_dict()), _expanded(result.itl)))
    pd.testing.assert_frame_equal(frames[0][0], frames[1][0], check_exact=True)
    pd.testing.assert_frame_equal(frames[0][1], frames[1][1], check_exact=True)
    assert frames[0][2] == frames[1][2]


def _spy_parts(monkeypatch, *, ends: bool = False, when=None):  # noqa: ANN001
    """Record every stretch part the engine applies, with the steps it took of it (their end
    times, with `ends`); with `when`, only those applied while `when(policy)` holds."""
    from policies.fast_path import StretchMixin

    applied = []
    original, original_joined = StretchMixin.apply_stretch, StretchMixin.apply_joined

    def spy(self, stretch, step_ends):  # noqa: ANN001, ANN202
        if when is None or when(self):
            applied.append((stretch, list(step_ends) if ends else len(step_ends)))
        return original(self, stretch, step_ends)

    def spy_joined(self, stretch, then, step_ends):  # noqa: ANN001, ANN202
        # Both parts, each with its steps, as if applied one after the other.
        if when is None or when(self):
            first, rest = step_ends[:stretch.num_steps], step_ends[stretch.num_steps:]
            applied.append((stretch, list(first) if ends else len(first)))
            applied.append((then, list(rest) if ends else len(rest)))
        return original_joined(self, stretch, then, step_ends)

    monkeypatch.setattr(StretchMixin, "apply_stretch", spy)
    monkeypatch.setattr(StretchMixin, "apply_joined", spy_joined)
    return applied


@pytest.mark.parametrize("name,opts", [("continuous", {}), ("chunked_prefill", {"chunk_size": 16})])
def test_stretches_run_past_finishes_and_match(monkeypatch, name, opts):
    """Without follow-up turns, a run goes on after some of its decoders finish (the batch
    shrinks), and the tables still equal stepping's."""
    from backends.base import CostContext
    from backends.roofline import make_roofline
    from simcore.presets import get_model

    applied = _spy_parts(monkeypatch)
    cost = make_roofline({}, CostContext(model=get_model("llama-3.1-8b"), hardware_name="h100-sxm"))
    requests = workload(11, content=False)
    (slow, slow_requests, slow_steps), (fast, fast_requests, fast_steps) = run_both(
        requests, name, opts, cost=cost, caching=False)
    pd.testing.assert_frame_equal(slow_requests, fast_requests, check_exact=True)
    pd.testing.assert_frame_equal(slow_steps, fast_steps, check_exact=True)
    assert _expanded(slow.itl) == _expanded(fast.itl)
    assert any(stretch.has_departures(taken) for stretch, taken in applied)
    assert fast.num_events < slow.num_events


def test_chunked_stretches_admit_complete_the_prompt_and_decode_on(monkeypatch):
    """A chunked-prefill run can admit the waiting prompt in its first step, take its last
    chunk (which selects its first output), and go on decoding it beside the others."""
    applied = _spy_parts(monkeypatch)
    requests = [req(0, 0.0, 8, 60), req(1, 0.05, 70, 30)]
    cost = ConstantCostModel(step_s=0.01, per_token_s=1e-4)
    (_, slow_requests, slow_steps), (_, fast_requests, fast_steps) = run_both(
        requests, "chunked_prefill", {"chunk_size": 16}, cost=cost, caching=False)
    pd.testing.assert_frame_equal(slow_requests, fast_requests, check_exact=True)
    pd.testing.assert_frame_equal(slow_steps, fast_steps, check_exact=True)
    (second,) = [stretch for stretch, _ in applied if stretch.admits and stretch.prefill.request_id == 1]
    assert len(second.decoders) == 1 and second.chunk == 16  # request 0 decodes beside its chunks
    assert second.tail == 70 - 4 * 16 and second.then is not None
    assert any(stretch is second.then for stretch, _ in applied)  # the decodes after it ran
    assert fast_requests.loc[1, "first_token_s"] == slow_requests.loc[1, "first_token_s"]


def test_the_last_chunk_admits_the_next_prompt_in_the_run(monkeypatch):
    """A prompt's last chunk leaves budget for the next waiting prompt's first chunk: the run
    ends with that step (both prompts in it), as stepping schedules it."""
    applied = _spy_parts(monkeypatch)
    # The chunk fills the budget beside one decode (16 of 17 tokens): request 2, arriving while
    # request 1 is prefilled, can only join the step of request 1's last chunk (6 positions).
    requests = [req(0, 0.0, 8, 60), req(1, 0.05, 70, 30), req(2, 0.08, 30, 10)]
    cost = ConstantCostModel(step_s=0.01, per_token_s=1e-4)
    frames = []
    for fast in (False, True):
        policy = make_policy("chunked_prefill", num_blocks=200, block_size=4, chunk_size=16, max_num_batched_tokens=17)
        result = simulate(requests, policy, cost, limits=RunLimits(fast_forward=fast, check_invariants=True))
        frames.append((request_frame(result.requests), pd.DataFrame(result.steps.as_dict()), _expanded(result.itl)))
    pd.testing.assert_frame_equal(frames[0][0], frames[1][0], check_exact=True)
    pd.testing.assert_frame_equal(frames[0][1], frames[1][1], check_exact=True)
    assert frames[0][2] == frames[1][2]
    (joined,) = [stretch for stretch, _ in applied if stretch.newcomer is not None]
    assert (joined.prefill.request_id, joined.tail, joined.newcomer.request_id, joined.newcomer_chunk) == (1, 6, 2, 10)


@pytest.mark.parametrize("budget", [18, 40])  # the chunk is the budget left beside the decodes / always 16
def test_prompt_chunks_run_past_finishes(monkeypatch, budget):
    """While a long prompt is prefilled and nothing waits, the decoders beside its chunks may
    finish within the run. Where the chunk is the budget left beside them, each finish makes
    the chunks after it one position longer (up to chunk_size), which moves the prompt's last
    chunk; the decodes after it follow in the same run. Tables equal stepping's."""
    applied = _spy_parts(monkeypatch)
    cost = ConstantCostModel(step_s=0.01, per_token_s=1e-4)
    tails = set()
    for prompt_len in range(200, 217):  # the last chunk: every size from 1 to 16
        applied.clear()
        # Four decode a few outputs each; request 4's prompt takes a dozen steps beside them.
        requests = [req(0, 0.0, 4, 3), req(1, 0.0, 4, 5), req(2, 0.0, 4, 6), req(3, 0.0, 4, 9),
                    req(4, 0.001, prompt_len, 5)]
        _, steps = _both_paths_equal(requests, "chunked_prefill", cost, num_blocks=200, block_size=4, chunk_size=16,
                                     max_num_batched_tokens=budget)
        (stretch, taken), = [(stretch, taken) for stretch, taken in applied if stretch.prefill is not None
                             and stretch.prefill.request_id == 4 and stretch.reaches_tail(taken)]
        assert stretch.has_departures(taken) and stretch.chunk_cap == (16 if budget == 18 else 0)
        chunks = stretch.step_chunks(taken)
        assert sum(chunks) == stretch.prompt_positions(taken) == prompt_len - stretch.prefill_context
        if budget == 18:
            assert chunks[0] == 18 - 4 and max(chunks[:-1]) == 16  # longer once two of the four left
        assert stretch.then is not None and any(part is stretch.then for part, _ in applied)
        tails.add(chunks[-1])
        assert steps["num_prefill_tokens"].sum() == prompt_len + 4 * 4
    assert tails == set(range(1, 17))


@pytest.mark.parametrize("seats,budget", [(128, 16), (5, 40)])
def test_prompt_chunks_run_past_finishes_while_a_queue_waits(monkeypatch, seats, budget):
    """Requests 5 and 6 wait while request 4's prompt is chunked beside four decoders that
    finish one by one. Where the step budget is at most a chunk (16 of 16), each step's chunk
    takes what the decodes leave, so no finish lets a waiting request in before the last
    chunk: the run goes on past them, and its last step may admit request 5 beside the last
    chunk, in the room the finished decoders left. Where seats limit admission instead (5, with
    a budget of 40), a finish frees one, and the next step admits: runs stop at finishes.
    Tables equal stepping's."""
    applied = _spy_parts(monkeypatch)
    cost = ConstantCostModel(step_s=0.01, per_token_s=1e-4)
    num_joined = 0
    for prompt_len in range(40, 80):
        applied.clear()
        requests = [req(0, 0.0, 4, 3), req(1, 0.0, 4, 5), req(2, 0.0, 4, 6), req(3, 0.0, 4, 9),
                    req(4, 0.001, prompt_len, 5), req(5, 0.002, 6, 4), req(6, 0.003, 20, 3)]
        _, steps = _both_paths_equal(requests, "chunked_prefill", cost, num_blocks=200, block_size=4,
                                     chunk_size=16, max_num_batched_tokens=budget, max_num_seqs=seats)
        past = [(stretch, taken) for stretch, taken in applied
                if stretch.prefill is not None and stretch.arrivals_wait and stretch.has_departures(taken)]
        assert bool(past) == (budget <= 16)
        for stretch, taken in past:
            assert stretch.prefill.request_id == 4 and stretch.chunk_cap == 16
            assert sum(stretch.step_chunks(taken)) == stretch.prompt_positions(taken)
            if stretch.reaches_tail(taken) and stretch.admits_newcomer(taken):
                num_joined += 1
                # Request 5 first (request 6 after it, where its whole prompt left room).
                assert [r.request_id for r in (*stretch.whole_newcomers, stretch.newcomer)] in ([5], [5, 6])
                # The last step: every decoder that did not finish before it, the prompts' chunks.
                survivors = sum(left >= taken for left in stretch.remaining)
                assert stretch.tail + stretch.newcomer_positions + survivors <= budget
        assert steps["num_prefill_tokens"].sum() == 4 * 4 + prompt_len + 6 + 20
    assert (num_joined > 0) == (budget <= 16)


def test_the_decodes_after_a_run_are_planned_only_when_it_reaches_them(monkeypatch):
    """A run that an arrival cuts before its first part ends never plans the decode-only part
    that would follow it (its `plan_then` is left unused)."""
    applied = _spy_parts(monkeypatch)
    # Request 1 arrives during the chunks of request 0's prompt (160 positions, 16 a step).
    requests = [req(0, 0.0, 160, 20), req(1, 0.03, 8, 5)]
    cost = ConstantCostModel(step_s=0.01, per_token_s=1e-4)
    _both_paths_equal(requests, "chunked_prefill", cost, num_blocks=200, block_size=4, chunk_size=16)
    cut = [stretch for stretch, taken in applied if stretch.prefill is not None and taken < stretch.num_steps]
    assert cut and all(stretch.plan_then is not None and stretch.then is None for stretch in cut)


def _both_paths_equal(requests, name, cost, **options):  # noqa: ANN001, ANN003, ANN202
    """Run `requests` stepping and on the fast path (invariants checked); assert the request and
    step tables and the inter-token gaps are identical; return the fast run's result and steps."""
    frames = []
    for fast in (False, True):
        policy = make_policy(name, **options)
        result = simulate(requests, policy, cost, limits=RunLimits(fast_forward=fast, check_invariants=True))
        frames.append((result, request_frame(result.requests), pd.DataFrame(result.steps.as_dict())))
    (slow, slow_requests, slow_steps), (fast, fast_requests, fast_steps) = frames
    pd.testing.assert_frame_equal(slow_requests, fast_requests, check_exact=True)
    pd.testing.assert_frame_equal(slow_steps, fast_steps, check_exact=True)
    assert _expanded(slow.itl) == _expanded(fast.itl)
    return fast, fast_steps


@pytest.mark.parametrize("second_arrival", [0.0001, 0.008])
def test_a_newcomer_whose_whole_prompt_runs_beside_the_last_chunk(monkeypatch, second_arrival):
    """Request 1 arrives while request 0 (250 positions, 96 a step) is prefilled: the step of
    request 0's last chunk admits it whole, so both select an output in it. Arriving during
    the first chunk, the run takes one more chunk before that step; arriving during the second,
    that step is the run (no chunk before it)."""
    from backends.base import CostContext
    from backends.roofline import make_roofline
    from simcore.presets import get_model

    applied = _spy_parts(monkeypatch)
    cost = make_roofline({}, CostContext(model=get_model("llama-3.1-8b"), hardware_name="h100-sxm"))
    requests = [req(0, 0.0, 250, 5), req(1, second_arrival, 30, 5)]
    _, steps = _both_paths_equal(requests, "chunked_prefill", cost, num_blocks=640, block_size=4, chunk_size=200,
                                 max_num_batched_tokens=96)
    assert steps.loc[2, ["num_prefill_tokens", "num_selected"]].tolist() == [58 + 30, 2]
    (joined,) = [stretch for stretch, _ in applied if stretch.newcomer is not None]
    assert (joined.tail, joined.newcomer_chunk) == (58, 30)


@pytest.mark.parametrize("name,opts", [("continuous", {}), ("chunked_prefill", {"chunk_size": 16})])
def test_runs_carry_their_decoders_to_the_next_plan(monkeypatch, name, opts):
    """A plan that follows a run takes the decoders' ids, context and steps to the first finish
    from what the run left (not read again from every request); the results still equal
    stepping's, and the invariant check compared each carry with the batch."""
    from policies.base import BasePolicy
    from policies.fast_path import StretchMixin

    used = []
    carried = StretchMixin._carried

    def spy(self, decoders):
        carry = carried(self, decoders)
        used.append(carry is not None)
        return carry

    monkeypatch.setattr(StretchMixin, "_carried", spy)
    checked = []
    check_carry = BasePolicy._check_carry

    def count_checks(self):
        checked.append(self._carry is not None)
        check_carry(self)

    monkeypatch.setattr(BasePolicy, "_check_carry", count_checks)
    cost = ConstantCostModel(step_s=0.01, per_token_s=1e-4)
    (_, slow_requests, slow_steps), (_, fast_requests, fast_steps) = run_both(
        workload(3, content=False), name, opts, cost=cost, caching=False)
    pd.testing.assert_frame_equal(slow_requests, fast_requests, check_exact=True)
    pd.testing.assert_frame_equal(slow_steps, fast_steps, check_exact=True)
    assert any(used) and any(checked)


@pytest.mark.parametrize("name,opts,seed", [("continuous", {}, 0), ("chunked_prefill", {"chunk_size": 16}, 0),
                                            ("chunked_prefill", {"chunk_size": 16}, 1)])
def test_runs_with_finishes_carry_the_decoders_left(monkeypatch, name, opts, seed):
    """A run in which some decoders finished leaves the others (and its prompt, when it
    completed) for the next plan: made from the run's own figures, less those that left, and
    compared with the batch by the invariant check after every run; results equal stepping's.
    Both this and sorting only the decoders that leave within a stretch are for large batches:
    here every batch counts as large."""
    from policies.fast_path import StretchMixin

    survivors_after = StretchMixin._survivors_after
    made = []
    monkeypatch.setattr("policies.fast_path.MIN_BATCH_CARRIED_PAST_FINISHES", 1)  # batches of a dozen here
    monkeypatch.setattr("policies.stretch.MIN_BATCH_SORTED_IN_PART", 1)

    def spy(self, stretch, num_steps, completes, num_done):
        carry = survivors_after(self, stretch, num_steps, completes, num_done)
        if carry is not None:
            made.append((num_done, completes))
        return carry

    monkeypatch.setattr(StretchMixin, "_survivors_after", spy)
    cost = ConstantCostModel(step_s=0.01, per_token_s=1e-4)
    (_, slow_requests, slow_steps), (_, fast_requests, fast_steps) = run_both(
        workload(seed, content=False), name, opts, cost=cost, caching=False)
    pd.testing.assert_frame_equal(slow_requests, fast_requests, check_exact=True)
    pd.testing.assert_frame_equal(slow_steps, fast_steps, check_exact=True)
    assert made and any(num_done > 1 for num_done, _ in made)
    if name == "chunked_prefill":
        assert any(completes for _, completes in made)


@pytest.mark.parametrize("name,seed,budget", [("chunked_prefill", 0, 16), ("chunked_prefill", 10, 96),
                                               ("continuous", 0, 96)])
def test_recomputes_run_on_the_fast_path(monkeypatch, name, seed, budget):
    """After a preemption for recompute, the victim's readmission, its chunks of prompt and
    outputs and its last chunk (with the decodes after it, or a newcomer beside it), or under
    continuous batching the step that admits it whole, are runs too; the time since the
    preemption is charged at the step that brings it back where it was, its next output is a
    gap, and every table, the gaps and the recompute delays equal stepping's."""
    from policies.fast_path import StretchMixin

    seen = set()
    original = StretchMixin.apply_stretch

    def spy(self, stretch, step_ends):  # noqa: ANN001, ANN202
        prompt, newcomer, num_steps = stretch.prefill, stretch.newcomer, len(step_ends)
        if prompt is not None and prompt.request_id in self._preempted_at and prompt.num_outputs:
            seen.update({"admitted"} if stretch.admits else set())
            seen.update({"last chunk"} if stretch.reaches_tail(num_steps) else set())
        if newcomer is not None and stretch.admits_newcomer(num_steps) and newcomer.num_outputs:
            seen.add("whole newcomer" if stretch.newcomer_selects else "newcomer")
        return original(self, stretch, step_ends)

    monkeypatch.setattr(StretchMixin, "apply_stretch", spy)
    cost = ConstantCostModel(step_s=0.01, per_token_s=1e-4)
    options = {"chunk_size": 16} if name == "chunked_prefill" else {}
    fast, _ = _both_paths_equal(workload(seed, content=False), name, cost, num_blocks=24, block_size=4,
                                max_num_seqs=12, max_num_batched_tokens=budget, **options)
    expected = {"continuous": {"whole newcomer"}, "chunked_prefill": {"admitted", "last chunk"}}[name]
    if name == "chunked_prefill" and budget == 16:  # a queue waits: the last chunk's step admits the next
        expected = expected | {"newcomer"}
    assert expected <= seen
    assert (request_frame(fast.requests)["recompute_delay_s"] > 0).any()


@pytest.mark.parametrize("name,budget,block_size,num_blocks,seed,expected", [
    ("chunked_prefill", 16, 4, 24, 7, {"decodes", "own chunk"}),
    ("chunked_prefill", 96, 4, 24, 7, {"decodes", "own chunk"}),
    ("chunked_prefill", 16, 2, 48, 2, {"decodes", "own chunk", "several"}),
    ("continuous", 96, 4, 24, 7, {"decodes"}),
])
def test_steps_that_preempt_run_on_the_fast_path(monkeypatch, name, budget, block_size, num_blocks, seed, expected):
    """A step short of blocks is a stretch of one step that preempts first: the newest running
    requests where the decodes find too few blocks (several, newest first, where one does not
    free enough), or (chunked prefill) the prompt in progress where its next chunk does, which
    preempts itself. Every table, the gaps and the recompute delays equal stepping's, and the
    step records count the preemptions."""
    from policies.fast_path import StretchMixin

    kinds = set()
    original = StretchMixin.begin_stretch

    def spy(self, stretch, now):  # noqa: ANN001, ANN202
        if stretch.victims:
            # A step of its own, or the first of a readmission cycle (`policies.readmit_cycle`).
            assert stretch.newcomer is None and (stretch.readmits or stretch.num_steps == 1 and stretch.prefill is None)
            # The prompt's own chunk found too few blocks where the decodes alone fit.
            decodes_fit = self.bm.max_decode_steps(stretch.decode_ids, 1, stretch.decode_firsts) == 1
            own_chunk = decodes_fit and stretch.victims == [self.running[-1]] and self.running[-1].is_prefilling
            kinds.add("own chunk" if own_chunk else "decodes")
            kinds.update({"several"} if len(stretch.victims) > 1 else set())
        return original(self, stretch, now)

    monkeypatch.setattr(StretchMixin, "begin_stretch", spy)
    cost = ConstantCostModel(step_s=0.01, per_token_s=1e-4)
    options = {"chunk_size": 16} if name == "chunked_prefill" else {}
    fast, steps = _both_paths_equal(workload(seed, content=False), name, cost, num_blocks=num_blocks,
                                    block_size=block_size, max_num_seqs=12, max_num_batched_tokens=budget, **options)
    assert expected <= kinds
    assert steps["num_preempted"].sum() > 0
    assert (request_frame(fast.requests)["recompute_delay_s"] > 0).any()


def test_a_wrong_carry_fails_the_invariant_check(monkeypatch):
    from policies.fast_path import StretchMixin

    decoders_after = StretchMixin._decoders_after

    def off_by_one(self, stretch, num_steps, completes):
        carry = decoders_after(self, stretch, num_steps, completes)
        if carry is not None:
            carry.steps_to_finish += 1
        return carry

    monkeypatch.setattr(StretchMixin, "_decoders_after", off_by_one)
    policy = make_policy("chunked_prefill", num_blocks=64, block_size=4, chunk_size=16, max_num_seqs=12,
                         max_num_batched_tokens=96)
    with pytest.raises(AssertionError, match="carry"):
        simulate(workload(3, content=False), policy, ConstantCostModel(step_s=0.01, per_token_s=1e-4),
                 limits=RunLimits(check_invariants=True))


def _queued_workload(seed: int, num_requests: int = 80, *, rejected: bool = False):
    """Arrivals far faster than the batch drains: a queue builds up behind a blocked head. With
    `rejected`, some prompts are too long for the cache and are turned away as they arrive."""
    rng = random.Random(seed)
    requests, t = [], 0.0
    for i in range(num_requests):
        t += rng.expovariate(300.0)
        prompt = 400 if rejected and i % 7 == 3 else rng.randint(5, 60)
        requests.append(req(i, t, prompt, rng.randint(2, 50)))
    return requests


@pytest.mark.parametrize("name,opts", [
    ("continuous", {}),
    ("continuous", {"admission": "watermark", "watermark": 0.1}),
    ("chunked_prefill", {"chunk_size": 16}),
    ("chunked_prefill", {"chunk_size": 200}),
    ("static", {"max_batch_size": 4}),
])
@pytest.mark.parametrize("rejected", [False, True])
def test_runs_go_on_past_arrivals_that_must_queue(monkeypatch, name, opts, rejected):
    """While a queue waits behind a head no step of a run can admit, requests arriving during
    the run only join the queue: the run takes them as it goes. The step records still count
    each step's queue as stepping does (arrivals join before the first step that starts after
    them), and every table equals stepping's."""
    applied = _spy_parts(monkeypatch, ends=True)
    requests = _queued_workload(5, rejected=rejected)
    cost = ConstantCostModel(step_s=0.01, per_token_s=1e-4)
    fast, fast_steps = _both_paths_equal(requests, name, cost, num_blocks=40, block_size=4, max_num_seqs=6,
                                         max_num_batched_tokens=96, **opts)
    assert rejected == bool(len(fast.rejected))
    # Some run went on past a request that arrived after its first step started and before its
    # last one did (stepping takes such a request between two of the run's steps).
    arrivals = sorted(r.arrival_s for r in requests)
    absorbed = [stretch for stretch, ends in _runs_of(applied)
                if stretch.arrivals_wait and len(ends) > 2 and any(ends[0] < t <= ends[-2] for t in arrivals)]
    assert absorbed
    waiting = fast_steps["num_waiting"].to_numpy()
    assert (waiting[1:] > waiting[:-1]).any()


def _runs_of(applied):
    """(first part, step ends) of each run, from the parts applied with their steps' ends (a
    run's parts follow each other through `then`)."""
    runs, following = [], None
    for stretch, ends in applied:
        if following is not None and stretch is following:
            runs[-1][1].extend(ends)
        else:
            runs.append((stretch, list(ends)))
        following = stretch.then
    return runs


def test_a_newcomer_step_with_room_left_stops_for_arrivals():
    """The step of a prompt's last chunk admits the waiting request 2 (3 positions) and leaves
    room: request 3, arriving while the run's chunks before that step run, joins that step too,
    as stepping has it; so that run cannot go on past arrivals."""
    requests = [req(0, 0.0, 8, 60), req(1, 0.05, 70, 30), req(2, 0.08, 3, 10), req(3, 0.09, 3, 10)]
    cost = ConstantCostModel(step_s=0.01, per_token_s=1e-4)
    _, steps = _both_paths_equal(requests, "chunked_prefill", cost, num_blocks=200, block_size=4, chunk_size=16,
                                 max_num_batched_tokens=17)
    # The step of request 1's last chunk (6 positions) with both newcomers' prompts whole.
    assert ((steps["num_prefill_tokens"] == 6 + 3 + 3) & (steps["num_selected"] == 4)).any()


@pytest.mark.parametrize("opts", [{}, {"admission": "reserve"}, {"admission": "watermark", "watermark": 0.2},
                                  {"delivery_s": 0.003}, {"track_block_ids": True}])
@pytest.mark.parametrize("cost_name", ["roofline", "constant"])
def test_continuous_runs_admit_the_only_waiting_request(monkeypatch, opts, cost_name):
    """Continuous batching's step that admits the one waiting request (prefill only, its whole
    prompt) starts a run, and the decode-only steps that follow with it in the batch go on in
    the same run; outputs equal stepping's. A request with one output finishes in that step."""
    from backends.base import CostContext
    from backends.roofline import make_roofline
    from simcore.presets import get_model

    applied = _spy_parts(monkeypatch)
    cost = (make_roofline({}, CostContext(model=get_model("llama-3.1-8b"), hardware_name="h100-sxm"))
            if cost_name == "roofline" else ConstantCostModel(step_s=0.01, per_token_s=1e-4))
    requests = [req(0, 0.0, 30, 40), req(1, 0.1, 50, 1), req(2, 0.15, 20, 30), req(3, 0.2, 9, 25)]
    fast, steps = _both_paths_equal(requests, "continuous", cost, num_blocks=64, block_size=4, **opts)
    admitting = [(stretch, taken) for stretch, taken in applied if stretch.newcomer is not None]
    assert [stretch.newcomer.request_id for stretch, _ in admitting] == [0, 1, 2, 3]
    assert all(taken == 1 and not stretch.decoders and stretch.prefill is None for stretch, taken in admitting)
    assert [stretch.may_go_on() for stretch, _ in admitting] == [True, False, True, True]
    ran = [stretch for stretch, _ in applied]
    assert all(stretch.then in ran for stretch, _ in admitting if stretch.then is not None)
    # Every step is taken by a run: none is scheduled one at a time.
    assert fast.num_events == len(requests) + len(admitting) + sum(
        1 for stretch in ran if stretch.newcomer is None and not any(stretch is s.then for s, _ in admitting))
    assert steps["num_prefill_tokens"].tolist().count(0) == len(steps) - 4


def test_continuous_admission_runs_leave_queues_and_recomputes_to_stepping(monkeypatch):
    """No admission run where two requests wait (the step could admit both), where the head has
    no seat or blocks, or for a preempted request's recompute; the results still equal stepping's."""
    from backends.base import CostContext
    from backends.roofline import make_roofline
    from simcore.presets import get_model

    applied = _spy_parts(monkeypatch)
    cost = make_roofline({}, CostContext(model=get_model("llama-3.1-8b"), hardware_name="h100-sxm"))
    # Two arrive together; then two one by one (admitted by runs), whose batch runs out of
    # blocks (recompute preemption); then one while both hold the seats.
    requests = [req(0, 0.0, 12, 30), req(1, 0.0, 12, 30), req(2, 0.5, 40, 60), req(3, 0.6, 40, 60),
                req(4, 0.65, 8, 5)]
    _, steps = _both_paths_equal(requests, "continuous", cost, num_blocks=40, block_size=4, max_num_seqs=2)
    admitted = [stretch.newcomer.request_id for stretch, _ in applied if stretch.newcomer is not None]
    # 0 and 1 are admitted together by a scheduled step; 3's recompute and 4 wait together.
    assert admitted == [2, 3]
    assert steps["num_preempted"].sum() > 0


@pytest.mark.parametrize("limit", ["tokens", "seats", "blocks"])
def test_continuous_admission_runs_admit_the_head_alone_while_others_wait(monkeypatch, limit):
    """Where others wait but the step can admit only the head (the next needs more tokens than
    the budget leaves, a seat or blocks beside the head's), that step is a run of its own, with
    no decode steps after it (the next step tries the queue again), unless the head took the
    last seat: then the decodes up to the first finish follow it, arrivals waiting. Results equal
    stepping's. Where the next fits too, `schedule` plans the step (tested above)."""
    from backends.base import CostContext
    from backends.roofline import make_roofline
    from simcore.presets import get_model

    applied = _spy_parts(monkeypatch)
    cost = make_roofline({}, CostContext(model=get_model("llama-3.1-8b"), hardware_name="h100-sxm"))
    options = {"tokens": {"max_num_batched_tokens": 64}, "seats": {"max_num_seqs": 2},
               "blocks": {"admission": "watermark", "watermark": 0.1}}[limit]
    num_blocks = 24 if limit == "blocks" else 200
    # One decodes; three arrive together while it does (40-token prompts: 10 blocks each).
    requests = [req(0, 0.0, 8, 30), req(1, 0.05, 40, 20), req(2, 0.05, 40, 20), req(3, 0.05, 40, 20)]
    _both_paths_equal(requests, "continuous", cost, num_blocks=num_blocks, block_size=4, **options)
    # (Request 0 is admitted alone, nothing waiting: the decodes follow it.)
    admitting = [stretch for stretch, _ in applied if stretch.newcomer is not None and stretch.newcomer.request_id]
    assert [stretch.newcomer.request_id for stretch in admitting][:1] == [1]
    # Request 1 takes the last seat where there are two: the decodes follow, behind the queue.
    assert admitting[0].may_go_on() == (limit == "seats")
    assert admitting[0].arrivals_wait == (limit == "seats")


@pytest.mark.parametrize("horizon", [None, 1.2])
def test_continuous_admission_runs_with_follow_up_turns_and_a_horizon(monkeypatch, horizon):
    """Follow-up turns (released when their parent finishes) and a horizon that ends the run
    mid-way: admission runs still fire and the results equal stepping's."""
    from backends.base import CostContext
    from backends.roofline import make_roofline
    from simcore.presets import get_model

    applied = _spy_parts(monkeypatch)
    cost = make_roofline({}, CostContext(model=get_model("llama-3.1-8b"), hardware_name="h100-sxm"))
    requests = workload(7, content=False, sessions=True)
    (slow, slow_requests, slow_steps), (fast, fast_requests, fast_steps) = run_both(
        requests, "continuous", {}, cost=cost, caching=False, horizon=horizon)
    pd.testing.assert_frame_equal(slow_requests, fast_requests, check_exact=True)
    pd.testing.assert_frame_equal(slow_steps, fast_steps, check_exact=True)
    assert _expanded(slow.itl) == _expanded(fast.itl)
    assert slow.end_reason == fast.end_reason == ("done" if horizon is None else "max_sim_time")
    admitted = [stretch.newcomer for stretch, _ in applied if stretch.newcomer is not None]
    assert any(request.parent_id is not None for request in admitted)  # a follow-up turn among them


@pytest.mark.parametrize("name,opts", [("chunked_prefill", {"chunk_size": 16, "preemption": "swap"}),
                                       ("continuous", {"preemption": "swap"}), ("offload", {"base": "continuous"})])
def test_decode_runs_go_on_while_a_request_is_swapped_out(monkeypatch, name, opts):
    """A swapped-out request that cannot come back yet (too few blocks) cannot until a finish
    frees some: the decodes before it are certain, and requests that arrive wait behind it.
    Such runs are taken at once (several steps, with a request swapped out), as stepping."""
    from backends.base import CostContext
    from backends.roofline import make_roofline
    from simcore.presets import get_model

    taken_while_swapped = _spy_parts(monkeypatch, when=lambda policy: bool(policy.swapped))
    cost = make_roofline({}, CostContext(model=get_model("llama-3.1-8b"), hardware_name="h100-sxm"))
    _both_paths_equal(workload(11, content=False), name, cost, num_blocks=48, block_size=4, max_num_seqs=12,
                      max_num_batched_tokens=96, num_host_blocks=400, block_bytes=4096, **opts)
    assert max((steps for _, steps in taken_while_swapped), default=0) > 1


def test_mixed_steps_run_on_while_a_long_prompt_waits_for_budget(monkeypatch):
    """Mixed continuous batching admits a whole prompt in the budget the decodes leave: a head
    of 62 positions waits while more than 2 of the 64 tokens go to decodes, however many blocks
    are free, and the request behind it waits too. The decodes up to the first finish are
    certain meanwhile: taken at once (several steps with the queue waiting), as stepping."""
    taken_while_waiting = _spy_parts(monkeypatch, when=lambda policy: bool(policy.waiting))
    requests = [req(i, 0.0, 10, 20 + 7 * i) for i in range(6)]
    requests += [req(6, 0.05, 62, 5), req(7, 0.06, 4, 5)]
    fast, _ = _both_paths_equal(requests, "continuous", ConstantCostModel(step_s=0.01), num_blocks=400, block_size=4,
                                max_num_seqs=16, max_num_batched_tokens=64, mixed=True)
    assert max((steps for _, steps in taken_while_waiting), default=0) > 1
    assert {6, 7} <= {r.request_id for r in fast.finished}


@pytest.mark.parametrize("limit,held_back", [("seats", True), ("tokens", True), ("blocks", True), ("none", False)])
def test_mixed_steps_that_admit_the_head_alone(monkeypatch, limit, held_back):
    """Mixed continuous batching admits request 2 whole beside the decodes of 0 and 1, not 3
    behind it (no seat, too few tokens or blocks left): that step is a stretch of one step
    whose prompt is admitted and completed in it. Where 3 stays out of the decode steps after
    it to the first finish (no seat, a prompt longer than the budget the decodes leave, too few
    blocks), those steps follow in the same run, arrivals waiting; where it could join the next
    step (it fits the budget once 2's prompt is done), the run is that step alone. Tables equal
    stepping's."""
    applied = _spy_parts(monkeypatch)
    options = {"seats": {"max_num_seqs": 3}, "tokens": {}, "blocks": {"admission": "watermark", "watermark": 0.1},
               "none": {}}[limit]
    following = {"tokens": 62, "none": 40}.get(limit, 40)
    requests = [req(0, 0.0, 8, 30), req(1, 0.0, 8, 40), req(2, 0.05, 30, 20), req(3, 0.05, following, 20)]
    _both_paths_equal(requests, "continuous", ConstantCostModel(step_s=0.01), block_size=4, mixed=True,
                      num_blocks=24 if limit == "blocks" else 400, max_num_batched_tokens=64,
                      **{"max_num_seqs": 16, **options})
    admission = next(stretch for stretch, _ in applied if stretch.admits and stretch.prefill.request_id == 2)
    assert admission.num_steps == 1 and admission.tail == 30 and len(admission.decoders) == 2
    assert admission.may_go_on() == held_back == admission.arrivals_wait
    if held_back:
        assert any(stretch.arrivals_wait and stretch.decode_contexts is not None and steps > 1
                   for stretch, steps in applied)


@pytest.mark.parametrize("name,opts", [("chunked_prefill", {"chunk_size": 16, "max_num_batched_tokens": 16}),
                                       ("chunked_prefill", {"chunk_size": 16, "max_num_batched_tokens": 64}),
                                       ("continuous", {"max_num_batched_tokens": 64}),
                                       ("continuous", {"max_num_batched_tokens": 64, "mixed": True})])
def test_runs_behind_a_queue_while_every_seat_is_taken(monkeypatch, name, opts):
    """With a queue and every seat taken, no waiting request can join a step before the first
    finish: under chunked prefill the prompt's stretch takes the step of its last chunk too
    (unless a decoder finishes before it), and the decodes after it with that request among
    them; under continuous batching the decodes follow the step that admits the head into the
    last seat. Arrivals wait throughout: one run, not one to each arrival. The tables match
    stepping (a token budget of one chunk, whose steps before the last chunk's run past
    finishes, and of four)."""
    from backends.base import CostContext
    from backends.roofline import make_roofline
    from simcore.presets import get_model

    applied = _spy_parts(monkeypatch, when=lambda policy: len(policy.waiting) > 1)
    cost = make_roofline({}, CostContext(model=get_model("llama-3.1-8b"), hardware_name="h100-sxm"))
    _both_paths_equal(workload(7, content=False), name, cost, num_blocks=400, block_size=4, max_num_seqs=4, **opts)
    if name == "chunked_prefill":
        assert any(stretch.tail and stretch.arrivals_wait and stretch.newcomer is None and steps == stretch.num_steps
                   for stretch, steps in applied)
    # A decode part planned after the part that brought its newest request in (its contexts
    # given), letting arrivals wait as that part did.
    assert any(stretch.arrivals_wait and stretch.decode_contexts is not None and steps > 1
               for stretch, steps in applied)


def test_reserve_admission_on_a_prompts_stretch(monkeypatch):
    """Under reserve admission the step that admits the queue's head gives it blocks for every
    position it will hold: the prompt's stretch from its admission counts those, not its
    chunks', and so does the step of a prompt's last chunk that admits the next request (the
    newcomer) beside it; both match stepping (crowded enough that some heads find too few)."""
    from backends.base import CostContext
    from backends.roofline import make_roofline
    from simcore.presets import get_model

    applied = _spy_parts(monkeypatch)
    cost = make_roofline({}, CostContext(model=get_model("llama-3.1-8b"), hardware_name="h100-sxm"))
    _both_paths_equal(workload(13, content=False), "chunked_prefill", cost, num_blocks=64, block_size=4,
                      max_num_seqs=12, max_num_batched_tokens=16, chunk_size=16, admission="reserve")
    assert any(stretch.admits and steps > 1 for stretch, steps in applied)
    assert any(stretch.newcomer is not None and stretch.prefill is not None and steps == stretch.num_steps
               for stretch, steps in applied)


def test_run_pieces_are_whole_run_shapes() -> None:
    """Stretch.runs builds its shapes from every field in order, past the named tuple's own
    constructor: each must be the RunShape the constructor would make (a field added to
    RunShape, or two swapped, shows here)."""
    from policies.stretch import Stretch
    from simcore.plan import RunShape

    decoders = [req(i, 0.0, prompt_len=5, output_len=9) for i in range(3)]
    newcomer = req(9, 0.0, prompt_len=3, output_len=2)
    prompt = req(8, 0.0, prompt_len=20, output_len=4)
    stretches = [
        Stretch(4, decoders, [0, 1, 2], [2, 3, 4], 15, 6),  # decodes only
        Stretch(3, decoders, [0, 1, 2], [2, 3, 4], 15, 1, remaining=[1, 2, 5]),  # past finishes
        Stretch(3, decoders, [0, 1, 2], [2, 3, 4], 15, 6, prompt, 8, 0, tail=4, newcomer=newcomer,
                newcomer_chunk=3),  # chunks, the tail and a newcomer with its whole prompt
        Stretch(1, [], [], [], 0, 1, newcomer=newcomer, newcomer_chunk=2),  # a step that admits alone
        Stretch(5, decoders, [0, 1, 2], [2, 3, 4], 15, 6, prompt, 4, readmits=(2, 1)),
    ]
    seen = []
    for stretch in stretches:
        for _, shape in stretch.runs():
            assert type(shape) is RunShape and len(shape) == len(RunShape._fields)
            assert shape == RunShape(**shape._asdict())
            seen.append(shape)
    tail = [shape for shape in seen if shape.chunk_selects]
    assert tail == [RunShape(3, 21, 4, 16, True, 3, True)]
    assert RunShape(0, 0, 0, 0, False, 2, False) in seen


@pytest.mark.parametrize("name,opts", [("chunked_prefill", {"chunk_size": 16}), ("continuous", {"mixed": True})])
@pytest.mark.parametrize("seed", [0, 3])
def test_decode_runs_go_on_while_the_first_steps_decodes_leave_the_head_too_few_blocks(monkeypatch, name, opts,
                                                                                      seed):
    """Where a step schedules the decodes before admissions, their new blocks come first: a head
    whose blocks are free now but not once the first step's decodes took theirs waits through
    every step to the first finish (free blocks only shrink meanwhile). Those decode steps run
    at once, the queue waiting (they were stepped one by one while the head's blocks alone
    decided), and the tables match stepping."""
    applied = []
    from policies.fast_path import StretchMixin

    original = StretchMixin.apply_stretch

    def spy(self, stretch, step_ends):  # noqa: ANN001, ANN202
        # A decode run planned from the batch (not after a part that brought a request in)
        # while the head's blocks are free before the step.
        if self.waiting and stretch.prefill is None and stretch.newcomer is None and not stretch.victims \
                and stretch.decode_contexts is None and self._may_admit_during_stretch():
            applied.append((stretch, len(step_ends)))
        return original(self, stretch, step_ends)

    monkeypatch.setattr(StretchMixin, "apply_stretch", spy)
    cost = ConstantCostModel(step_s=0.01, per_token_s=1e-4)
    _both_paths_equal(_queued_workload(seed), name, cost, num_blocks=40, block_size=4, max_num_seqs=8,
                      max_num_batched_tokens=96, **opts)
    assert any(stretch.arrivals_wait and steps > 1 for stretch, steps in applied)


def test_a_step_that_admits_a_whole_prompt_and_the_next_request(monkeypatch):
    """With nothing prefilling, the step that admits the queue's head, whose whole prompt fits
    the budget the decodes leave, admits the request behind it with its first chunk in what is
    left (as stepping does): one step on the fast path, with the head's first output, and the
    newcomer's where its whole prompt fits too. Arrivals wait where no room is left."""
    from policies.fast_path import StretchMixin

    both = []  # (whether the newcomer's whole prompt runs, whether arrivals wait) of each such step
    original = StretchMixin.apply_stretch

    def spy(self, stretch, step_ends):  # noqa: ANN001, ANN202
        if stretch.admits and stretch.newcomer is not None and len(step_ends) == 1:
            both.append((stretch.newcomer_selects, stretch.arrivals_wait))  # read before the step
        return original(self, stretch, step_ends)

    monkeypatch.setattr(StretchMixin, "apply_stretch", spy)
    cost = ConstantCostModel(step_s=0.01, per_token_s=1e-4)
    _both_paths_equal(_queued_workload(2), "chunked_prefill", cost, num_blocks=200, block_size=4, max_num_seqs=8,
                      max_num_batched_tokens=96, chunk_size=16)
    assert any(selects for selects, _ in both)
    assert any(waits for _, waits in both)


@pytest.mark.parametrize("opts", [{}, {"admission": "reserve"}, {"admission": "watermark", "watermark": 0.1}])
@pytest.mark.parametrize("budget", [32, 96])
def test_a_step_that_admits_several_waiting_requests(monkeypatch, opts, budget):
    """The step of a prompt's last chunk (or the one that admits the head whole) goes on
    admitting waiting requests while seats and budget are left, as stepping does: each but the
    last with its whole prompt (each selects its first output), the last with its first chunk.
    Such steps run on the fast path, also as the last step of a longer run, and the tables
    match stepping's (priced by the roofline: the prompts' attention counts)."""
    from backends.base import CostContext
    from backends.roofline import make_roofline
    from policies.fast_path import StretchMixin
    from simcore.presets import get_model

    whole = []  # (admitted whole, steps of the run's part) of each part whose last step admits several
    original = StretchMixin.apply_stretch

    def spy(self, stretch, step_ends):  # noqa: ANN001, ANN202
        if stretch.whole_newcomers and len(step_ends) == stretch.num_steps:
            whole.append((len(stretch.whole_newcomers), len(step_ends)))
        return original(self, stretch, step_ends)

    monkeypatch.setattr(StretchMixin, "apply_stretch", spy)
    cost = make_roofline({}, CostContext(model=get_model("llama-3.1-8b"), hardware_name="h100-sxm"))
    for seed in (0, 2):
        _both_paths_equal(_queued_workload(seed), "chunked_prefill", cost, num_blocks=80, block_size=4,
                          max_num_seqs=8, max_num_batched_tokens=budget, chunk_size=budget, **opts)
    if budget > 32:  # room for three or more in a step
        assert any(num_whole >= 2 for num_whole, _ in whole)
    else:  # chunks of a longer prompt first
        assert any(steps > 1 for _, steps in whole)


@pytest.mark.parametrize("opts", [{}, {"admission": "watermark", "watermark": 0.1}])
def test_the_last_chunks_step_with_a_queue_that_cannot_join_it(monkeypatch, opts):
    """A prompt's last chunk runs beside the decodes with seats left while a queue waits, and
    no waiting request joins that step: the chunk takes the budget the decodes leave, or the
    queue's head finds too few blocks once the decodes and the chunk took theirs. That step is
    certain (arrivals wait); after a blocked head, so are the decodes that follow to the first
    finish (the free blocks only shrink). Tables equal stepping's."""
    from policies.fast_path import StretchMixin

    alone = []  # (steps of the part, whether decodes follow it) of each such part
    original = StretchMixin.apply_stretch

    def spy(self, stretch, step_ends):  # noqa: ANN001, ANN202
        if stretch.tail and stretch.newcomer is None and self.waiting and len(step_ends) == stretch.num_steps \
                and len(self.running) < self.options.max_num_seqs:
            alone.append((len(step_ends), stretch.then is not None))
        return original(self, stretch, step_ends)

    monkeypatch.setattr(StretchMixin, "apply_stretch", spy)
    cost = ConstantCostModel(step_s=0.01, per_token_s=1e-4)
    for seed in (0, 1):
        _both_paths_equal(_queued_workload(seed), "chunked_prefill", cost, num_blocks=40, block_size=4,
                          max_num_seqs=8, max_num_batched_tokens=32, chunk_size=32, **opts)
    assert any(then for _, then in alone)
    assert any(not then for _, then in alone)
    assert any(steps > 1 for steps, _ in alone)


def test_a_prompts_last_chunk_and_the_decodes_after_it_applied_as_one(monkeypatch):
    """A run whose first part completes a prompt and whose second decodes it beside the same
    decoders (`Stretch.joins`) is applied in one pass (`apply_joined`): with one chunk step or
    several before the decodes, one decode step or several, no decoders beside the prompt,
    decoders and the prompt finishing within the decodes or at their last step, behind a queue,
    admitted by the run, under chunked prefill and mixed continuous batching. The request and
    step tables and the gaps equal stepping's."""
    from policies.fast_path import StretchMixin

    seen = set()
    original = StretchMixin.apply_joined

    def spy(self, stretch, then, step_ends):  # noqa: ANN001, ANN202
        first, rest = stretch.num_steps, len(step_ends) - stretch.num_steps
        seen.update({"one chunk step" if first == 1 else "chunk steps", "one decode step" if rest == 1 else
                     "decode steps", "decoders" if stretch.decoders else "no decoders"})
        seen.update({"behind a queue"} if stretch.arrivals_wait else set())
        seen.update({"admitted"} if stretch.admits else set())
        if then.has_departures(rest):
            leaving = [index for step, index, _ in then.departures() if step < rest]
            seen.update({"the prompt finishes" if len(then.decoders) - 1 in leaving else "decoders finish"})
        elif rest >= then.steps_to_finish:
            seen.add("finish in the last step")
        return original(self, stretch, then, step_ends)

    monkeypatch.setattr(StretchMixin, "apply_joined", spy)
    cost = ConstantCostModel(step_s=0.01, per_token_s=1e-4)
    for seed in (0, 2):
        _both_paths_equal(workload(seed, content=False), "chunked_prefill", cost, num_blocks=200, block_size=4,
                          max_num_seqs=8, max_num_batched_tokens=64, chunk_size=16)
    expected = {"one chunk step", "chunk steps", "one decode step", "decode steps", "decoders", "no decoders",
                "behind a queue", "admitted", "the prompt finishes", "decoders finish", "finish in the last step"}
    assert seen == expected
    seen.clear()
    _both_paths_equal(workload(1, content=False), "continuous", cost, num_blocks=200, block_size=4, max_num_seqs=8,
                      max_num_batched_tokens=96, mixed=True)
    assert {"one chunk step", "decode steps", "admitted", "the prompt finishes"} <= seen
