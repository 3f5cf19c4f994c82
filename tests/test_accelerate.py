"""Runs of steps taken at once (policies.accelerate) change nothing: identical results to stepping.

Every registered policy, with every queue order where it has one, with the prefix cache off and
on, swaps and offload, every registered cost model, and policy subclasses that register nothing,
run the same workloads both ways; request tables, step tables, inter-token gaps and the end of the
run must be identical (the clock counts whole femtoseconds, so a run's step ends are the very ticks
its steps end at one by one).
"""

from __future__ import annotations

import random
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.base import CostContext
from backends.registry import build_cost_model
from policies.accelerate import ACCELERATORS, ChunkRuns, DecodeRuns, accelerator_for
from policies.chunked_prefill import ChunkedPrefillPolicy
from policies.continuous import ContinuousPolicy
from policies.queues import QUEUE_ORDERS, QueueOrder, WaitingQueue
from policies.registry import POLICIES, make_policy
from simcore.cluster import simulate
from simcore.engine import RunLimits
from simcore.metrics import request_frame
from simcore.presets import get_model
from tests.helpers import req

# Each registered policy, with the options that change what its steps look like.
CONFIGS = (
    ("static", {"max_batch_size": 5}),
    ("static", {"max_batch_size": 5, "padded": True}),
    ("continuous", {}),
    ("continuous", {"mixed": True}),
    ("continuous", {"admission": "reserve"}),
    ("continuous", {"admission": "watermark", "watermark": 0.1}),
    ("continuous", {"preemption": "swap"}),
    ("chunked_prefill", {"chunk_size": 16}),
    ("chunked_prefill", {"chunk_size": 200}),  # the chunk is the budget left beside the decodes
    ("chunked_prefill", {"chunk_size": 16, "order": "alternate"}),
    ("chunked_prefill", {"chunk_size": 16, "preemption": "swap"}),
    ("chunked_prefill", {"chunk_size": 16, "admission": "reserve"}),
    ("chunked_prefill", {"chunk_size": 16, "admission": "prompt"}),
    ("offload", {"base": "continuous"}),
    ("offload", {"chunk_size": 16}),
    # (Last, so that slices of the ones above keep their meaning elsewhere.)
    ("continuous", {"admission": "conservative"}),
    ("chunked_prefill", {"chunk_size": 16, "admission": "conservative", "new_token_ratio_decay_steps": 40}),
)
ORDERED = [(name, {**opts, "queue_order": order}) for name, opts in
           (("continuous", {}), ("continuous", {"mixed": True}), ("chunked_prefill", {"chunk_size": 16}),
            ("offload", {"chunk_size": 16})) for order in QUEUE_ORDERS]
TABLE = Path(__file__).parent / "data" / "profiles" / "cpu-tiny-llama.csv"
COSTS = {
    "constant": {"step_s": 0.01, "per_token_s": 1e-4},
    "roofline": {},
    "profiled": {"table": str(TABLE), "check_model": False},
}


def cost_model(name: str = "roofline"):  # noqa: ANN201
    return build_cost_model(name, COSTS[name], CostContext(model=get_model("llama-3.1-8b"), hardware_name="h100-sxm"))


def small_policy(name: str, opts: dict, *, caching: bool, num_blocks: int = 64):
    """A policy on a small device (a host tier where it swaps), 12 seats, 96 tokens a step."""
    needs_host = name == "offload" or opts.get("preemption") == "swap"
    if name == "static":
        caching = False  # static batching has no prefix cache
    return make_policy(name, num_blocks=num_blocks, block_size=4, prefix_caching=caching,
                       num_host_blocks=400 if needs_host else 0, max_num_seqs=12, max_num_batched_tokens=96, **opts)


def workload(seed: int, *, content: bool, sessions: bool = False, num_requests: int = 60,
             rate: float = 20.0) -> list:
    rng = random.Random(seed)
    prefixes = [tuple(rng.randrange(100) for _ in range(rng.randint(8, 40))) for _ in range(3)]
    requests = []
    t = 0.0
    for i in range(num_requests):
        t += rng.expovariate(rate)
        prompt = rng.choice(prefixes) + tuple(rng.randrange(100) for _ in range(rng.randint(1, 30)))
        kw = {"prompt_token_ids": prompt} if content else {}
        if sessions and i % 4 and i > 0:
            kw.update(parent_id=i - 1, think_time_s=rng.uniform(0.01, 0.2))
        requests.append(req(i, t, len(prompt), rng.randint(1, 60), priority=rng.randint(0, 2), **kw))
    return requests


def both_ways(requests, make, cost, *, horizon=None) -> list[tuple]:  # noqa: ANN001
    """(result, request table, step table, gaps) stepping, then with the policy's accelerator."""
    outcomes = []
    for fast in (False, True):
        policy = make()
        result = simulate(requests, policy, cost, limits=RunLimits(max_sim_time_s=horizon, check_invariants=True),
                          accelerator=accelerator_for(policy) if fast else None)
        outcomes.append((result, request_frame(result.requests), pd.DataFrame(result.steps.as_dict()),
                         _expanded(result.itl)))
    return outcomes


def assert_same(outcomes: list[tuple]) -> None:
    (slow, slow_requests, slow_steps, slow_gaps), (fast, fast_requests, fast_steps, fast_gaps) = outcomes
    pd.testing.assert_frame_equal(slow_requests, fast_requests, check_exact=True)
    pd.testing.assert_frame_equal(slow_steps, fast_steps, check_exact=True)
    assert slow_gaps == fast_gaps  # the same inter-token gaps
    assert (slow.sim_time_s, slow.end_reason) == (fast.sim_time_s, fast.end_reason)


def _expanded(itl) -> list[tuple[float, int]]:  # noqa: ANN001
    merged: dict[float, int] = {}
    for value, weight in zip(itl.values, itl.weights):
        merged[value] = merged.get(value, 0) + weight
    return sorted(merged.items())


def test_every_registered_policy_and_queue_order_is_checked():
    assert {name for name, _ in CONFIGS} == set(POLICIES)
    assert {opts["queue_order"] for _, opts in ORDERED} == set(QUEUE_ORDERS)


@pytest.mark.parametrize("name,opts", CONFIGS + tuple(ORDERED))
@pytest.mark.parametrize("caching", [False, True])
def test_runs_match_stepping(name, opts, caching):
    requests = workload(7, content=caching, sessions=True)
    outcomes = both_ways(requests, lambda: small_policy(name, opts, caching=caching), cost_model())
    assert_same(outcomes)
    assert outcomes[1][0].num_events < outcomes[0][0].num_events or name == "static"


@pytest.mark.parametrize("cost_name", sorted(COSTS))
@pytest.mark.parametrize("name,opts", [("continuous", {}), ("chunked_prefill", {"chunk_size": 16}),
                                       ("continuous", {"queue_order": "priority"})])
def test_runs_match_stepping_with_every_cost_model(cost_name, name, opts):
    requests = workload(11, content=False, num_requests=80, rate=40.0)
    outcomes = both_ways(requests, lambda: small_policy(name, opts, caching=False, num_blocks=48), cost_model(cost_name))
    assert_same(outcomes)
    assert outcomes[1][0].num_events < outcomes[0][0].num_events


class LongestPromptFirst(QueueOrder):
    """An order a contributor might write: longest prompt first (its key is all that says so)."""

    name = "longest_prompt_first"

    def arrival_key(self, request):  # noqa: ANN001, ANN201
        return (-request.prompt_len, next(self._arrivals))

    def preempted_key(self, request):  # noqa: ANN001, ANN201
        return self.arrival_key(request)


class LongestPromptFirstPolicy(ContinuousPolicy):
    """Continuous batching with its own queue order, registering no accelerator."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.waiting = WaitingQueue(LongestPromptFirst())


class HalfBudgetChunks(ChunkedPrefillPolicy):
    """Chunked prefill that writes its own `fill` (half the budget a step) and says nothing of
    its predicates: it must be stepped."""

    def fill(self, now: float) -> None:
        budget_before = self.options.max_num_batched_tokens
        self.options.max_num_batched_tokens = max(budget_before // 2, 1)
        try:
            super().fill(now)
        finally:
            self.options.max_num_batched_tokens = budget_before


def test_subclasses_that_register_nothing_run_correctly():
    """A subclass is never taken for the class it extends: one that keeps its base's `fill` gets
    the generic accelerator (not the base's registered one), one with a `fill` of its own none."""
    policy = make_policy("continuous", num_blocks=64)
    policy.__class__ = LongestPromptFirstPolicy
    assert type(accelerator_for(policy)) is DecodeRuns
    chunked = make_policy("chunked_prefill", num_blocks=64)
    assert type(accelerator_for(chunked)) is ChunkRuns and ACCELERATORS[ChunkedPrefillPolicy] is ChunkRuns
    chunked.__class__ = HalfBudgetChunks
    assert accelerator_for(chunked) is None

    requests = workload(3, content=False, num_requests=80, rate=40.0)
    for policy_class, name, opts in ((LongestPromptFirstPolicy, "continuous", {}),
                                     (HalfBudgetChunks, "chunked_prefill", {"chunk_size": 16})):
        def make(policy_class=policy_class, name=name, opts=opts):  # noqa: ANN001, ANN202
            policy = small_policy(name, opts, caching=False, num_blocks=48)
            policy.__class__ = policy_class
            if policy_class is LongestPromptFirstPolicy:
                policy.waiting = WaitingQueue(LongestPromptFirst())
            return policy
        assert_same(both_ways(requests, make, cost_model()))


@pytest.mark.parametrize("name,opts", CONFIGS[:4] + (("chunked_prefill", {"chunk_size": 16}),))
def test_runs_match_with_constant_costs_ties_and_a_horizon(name, opts):
    # Constant step times and arrivals on the same grid make ties between arrivals and step ends.
    requests = [req(i, 0.01 * (i // 2), 5 + i % 7, 3 + (i * 7) % 30) for i in range(40)]
    outcomes = both_ways(requests, lambda: small_policy(name, opts, caching=False), cost_model("constant"),
                         horizon=0.6)
    assert_same(outcomes)
    assert outcomes[0][0].end_reason == "max_sim_time"


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10**6), config=st.sampled_from(CONFIGS + tuple(ORDERED)), caching=st.booleans(),
       num_blocks=st.sampled_from([24, 48, 200]), sessions=st.booleans())
def test_runs_match_stepping_on_random_workloads(seed, config, caching, num_blocks, sessions):
    """Tight and roomy caches (preemption, swaps, recompute cycles), queues, sessions."""
    name, opts = config
    rng = random.Random(seed)
    requests = workload(seed, content=caching, sessions=sessions, num_requests=rng.randint(5, 60),
                        rate=rng.choice([5.0, 40.0, 400.0]))
    policy_opts = {**opts, "max_model_len": 200}  # longer ones are rejected with a reason
    assert_same(both_ways(requests, lambda: small_policy(name, policy_opts, caching=caching, num_blocks=num_blocks),
                          cost_model(rng.choice(sorted(COSTS)))))


def test_runs_go_on_past_arrivals_that_queue_behind_a_blocked_head():
    """First come, first served: behind a head that the budget the decodes leave keeps out (mixed
    steps), requests that arrive only join the queue, and the run goes on past them; under
    priority order, arrivals of higher priority than the head end it."""
    def run(order: str) -> int:
        requests = [req(0, 0.0, 40, 200, priority=1), req(1, 0.0, 40, 200, priority=1),
                    req(2, 0.001, 99, 5, priority=1)]  # more than the 98 tokens the two decodes leave
        requests += [req(3 + i, 0.05 + 0.01 * i, 8, 5, priority=0) for i in range(4)]
        outcomes = both_ways(requests, lambda: make_policy("continuous", num_blocks=400, block_size=4, mixed=True,
                                                           max_num_batched_tokens=100, queue_order=order),
                             cost_model("constant"))
        assert_same(outcomes)
        return outcomes[1][0].num_events

    assert run("fcfs") < 5 < run("priority")


def test_a_run_is_priced_as_far_as_the_delivery_that_cuts_it():
    """The engine prices a run's steps as far as the next event due, here each arrival, which
    cuts it: with steps of one length every step priced is taken (lookaheads that doubled from
    16 priced 767 steps for these 503)."""
    class Counting:
        def __init__(self) -> None:
            self.num_priced = 0

        def step_time(self, plan) -> float:  # noqa: ANN001
            self.num_priced += 1
            return 0.01

    requests = [req(0, 0.0, 8, 500), *(req(i, i + 0.005, 8, 2) for i in (1, 2, 3))]
    policy = make_policy("continuous", num_blocks=400, block_size=4)
    cost_model = Counting()
    result = simulate(requests, policy, cost_model, accelerator=accelerator_for(policy),
                      limits=RunLimits(check_invariants=True))
    assert len(result.finished) == 4 and result.num_events <= 8
    assert cost_model.num_priced == len(result.steps)


def test_chunk_runs_take_a_prompts_chunks_at_once():
    """A long prompt beside decodes: its chunks up to the one that completes it in one run."""
    requests = [req(0, 0.0, 8, 100), req(1, 0.05, 300, 5)]
    outcomes = both_ways(requests, lambda: make_policy("chunked_prefill", num_blocks=400, block_size=4,
                                                       chunk_size=16, max_num_batched_tokens=17),
                         cost_model("constant"))
    assert_same(outcomes)
    steps = outcomes[1][2]
    assert ((steps["num_prefill_tokens"] > 0) & (steps["num_decode_tokens"] > 0)).sum() == 300 // 16 + 1
    assert outcomes[1][0].num_events < 10


def test_chunk_runs_go_on_with_the_completed_prompts_decodes():
    """Once its last chunk completes a prompt, the run goes on with its decodes beside the
    others' (the tail): past its finish, four outputs later, to the decoder's last output where
    nothing waits; to the first finish in a closed loop (a finish releases requests)."""
    def chunk_run(closed_loop: bool):  # noqa: ANN202
        policy = make_policy("chunked_prefill", num_blocks=400, block_size=4, chunk_size=16,
                             max_num_batched_tokens=17)
        policy.add(req(0, 0.0, 8, 100), 0.0)
        policy.complete(policy.schedule(0.0), 0.01)
        policy.add(req(1, 0.01, 300, 5), 0.01)
        plan = policy.schedule(0.01)  # the decode and the prompt's first chunk
        return ChunkRuns(policy).extend(plan, policy.complete(plan, 0.02), closed_loop=closed_loop)

    run = chunk_run(closed_loop=False)
    # 284 positions left: 17 chunks of 16, then 12; then 4 steps with the prompt, 76 without it.
    assert len(run.chunks) == 18 and run.num_steps == 98
    *_, with_prompt, without = run.repeats()
    assert list(with_prompt.plan.decodes.request_ids) == [0, 1] and with_prompt.num_steps == 4
    assert (without.advance, list(without.plan.decodes.request_ids), without.num_steps) == (4, [0], 76)
    assert [run.num_leaving(steps) for steps in (21, 22, 97, 98)] == [0, 1, 1, 2]
    assert chunk_run(closed_loop=True).num_steps == 22
    # The same, stepped and with runs, with a request delivered during the tail (it cuts it there).
    requests = [req(0, 0.0, 8, 100), req(1, 0.01, 300, 5), req(2, 0.245, 20, 3)]
    outcomes = both_ways(requests, lambda: make_policy("chunked_prefill", num_blocks=400, block_size=4,
                                                       chunk_size=16, max_num_batched_tokens=17),
                         cost_model("constant"))
    assert_same(outcomes)


def test_chunk_runs_go_on_past_finishes_with_the_budget_they_free():
    """Where nothing waits, a decoder's finish does not end a chunk run: the next chunks take
    the budget it frees (15 positions beside two decodes, 16 beside one)."""
    def make():  # noqa: ANN202
        return make_policy("chunked_prefill", num_blocks=400, block_size=4, chunk_size=64, max_num_batched_tokens=17)

    policy = make()
    for request in (req(0, 0.0, 8, 100), req(1, 0.0, 8, 6)):
        policy.add(request, 0.0)
    policy.complete(policy.schedule(0.0), 0.01)
    policy.add(req(2, 0.01, 300, 5), 0.01)
    plan = policy.schedule(0.01)  # two decodes and the prompt's first chunk
    run = ChunkRuns(policy).extend(plan, policy.complete(plan, 0.02), closed_loop=False)
    assert run.chunks[:6] == [15, 15, 15, 15, 16, 16] and run.steps_left[1] == 4
    first, second, *_ = (repeat.plan for repeat in run.repeats())
    assert [(len(plan.decodes.request_ids), plan.listed[0].num_new_tokens) for plan in (first, second)] \
        == [(2, 15), (1, 16)]
    assert [repeat.num_steps for repeat in run.repeats()][:2] == [4, 14]
    assert second.listed[0].context_len == 15 * 5  # (the planned step's chunk, then four)
    requests = [req(0, 0.0, 8, 100), req(1, 0.0, 8, 6), req(2, 0.01, 300, 5), req(3, 0.1, 40, 3)]
    outcomes = both_ways(requests, make, cost_model("constant"))
    assert_same(outcomes)


def test_weighted_percentiles_equal_the_expanded_list():
    import numpy as np

    from simcore.itl import weighted_percentile

    rng = np.random.default_rng(0)
    values = rng.random(50)
    weights = rng.integers(1, 20, size=50)
    expanded = np.repeat(values, weights)
    for q in (0, 1, 37.5, 50, 90, 99, 100):
        assert weighted_percentile(values, weights, q) == np.percentile(expanded, q)


def test_no_fast_forward_gives_byte_identical_results_folders(tmp_path):
    """`servesim run --no-fast-forward` (limits.fast_forward: false) writes the same tables."""
    import yaml

    from experiments.cli import main
    from tests.helpers import SMALL_EXPERIMENT

    experiment = {**SMALL_EXPERIMENT, "workload": {**SMALL_EXPERIMENT["workload"], "num_requests": 40},
                  "policies": [{"name": "continuous"}, {"name": "chunked_prefill", "chunk_size": 32}],
                  "kv_cache": {"block_size": 16, "num_blocks": 40}}
    path = tmp_path / "e.yaml"
    path.write_text(yaml.safe_dump(experiment))
    assert main(["run", str(path), "--out", str(tmp_path / "fast"), "--quiet"]) == 0
    assert main(["run", str(path), "--out", str(tmp_path / "plain"), "--quiet", "--no-fast-forward"]) == 0
    for table in sorted((tmp_path / "fast").glob("*/*.parquet")):
        assert table.read_bytes() == (tmp_path / "plain" / table.parent.name / table.name).read_bytes(), table
    resolved = yaml.safe_load((tmp_path / "plain" / "resolved.yaml").read_text())
    assert resolved["limits"]["fast_forward"] is False
