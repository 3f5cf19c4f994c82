"""Policy behaviour under memory pressure, admission modes, rejection and time horizons."""

from __future__ import annotations

import random

import pytest

from backends.constant import ConstantCostModel
from policies.accelerate import accelerator_for
from policies.registry import make_policy
from simcore.cluster import simulate
from simcore.engine import RunLimits
from simcore.errors import ServesimError
from simcore.metrics import summarize
from tests.helpers import req, run

POLICY_OPTIONS = (
    ("static", {"max_batch_size": 6}),
    ("continuous", {}),
    ("continuous", {"mixed": True}),
    ("chunked_prefill", {"chunk_size": 8}),
    ("chunked_prefill", {"chunk_size": 8, "order": "alternate"}),
)


def pressured_workload(n: int = 40, seed: int = 1):
    rng = random.Random(seed)
    return [req(i, i * 0.02, rng.randint(1, 40), rng.randint(1, 40)) for i in range(n)]


@pytest.mark.parametrize("name,opts", POLICY_OPTIONS)
def test_every_request_finishes_once_under_pressure(name, opts):
    workload = pressured_workload()
    policy, result = run(workload, name, num_blocks=30, block_size=4,
                         max_num_seqs=8, max_num_batched_tokens=48, **opts)
    ids = sorted(r.request_id for r in result.requests)
    assert ids == list(range(len(workload)))
    assert len(result.finished) == len(workload)
    assert all(r.num_outputs == r.output_len for r in result.finished)
    assert policy.bm.num_free_blocks == policy.bm.num_blocks  # zero leaked blocks
    assert policy.num_resident_tokens == 0


@pytest.mark.parametrize("name,opts", [p for p in POLICY_OPTIONS if p[0] != "static"])
def test_recompute_and_swap_give_the_same_output_lengths(name, opts):
    workload = pressured_workload(seed=3)
    outputs = {}
    for mode in ("recompute", "swap"):
        policy, result = run(workload, name, num_blocks=24, block_size=4,
                             num_host_blocks=200, preemption=mode, max_num_seqs=8,
                             max_num_batched_tokens=48, **opts)
        outputs[mode] = {r.request_id: r.num_outputs for r in result.finished}
        assert policy.tally.preemptions[mode] > 0, "the workload should force preemption"
        assert policy.host.num_free_blocks == 200  # nothing left on the host tier
    assert outputs["recompute"] == outputs["swap"]


def test_swap_in_restores_exactly_the_blocks_swapped_out():
    policy = make_policy("continuous", num_blocks=12, block_size=4, num_host_blocks=20, preemption="swap")
    a, b = req(0, 0.0, 8, 30), req(1, 0.0, 8, 30)
    policy.add(a, 0.0)
    policy.add(b, 0.0)
    swapped_out, swapped_in, now = [], [], 0.0
    while policy.has_work() and now < 5:
        plan = policy.schedule(now)
        swapped_out += list(plan.blocks_to_swap_out)
        swapped_in += list(plan.blocks_to_swap_in)
        now += 0.01
        policy.complete(plan, now)
        policy.check()
        if swapped_in:
            break
    assert swapped_out and swapped_in
    out_host = sorted(h for _, h in swapped_out)
    in_host = sorted(h for h, _ in swapped_in)
    assert out_host == in_host  # every host block written is read back, once


def test_hand_computed_swap_transfer_time_with_constant_cost_model():
    cost = ConstantCostModel(step_s=0.010, link_bytes_per_s=1e9, transfer_latency_s=0.001)
    policy = make_policy("continuous", num_blocks=12, block_size=4, num_host_blocks=20, preemption="swap",
                         block_bytes=1_000_000)
    policy.add(req(0, 0.0, 8, 30), 0.0)
    policy.add(req(1, 0.0, 8, 30), 0.0)
    now = 0.0
    while True:
        plan = policy.schedule(now)
        if plan.blocks_to_swap_out:
            break
        now += cost.step_time(plan)
        policy.complete(plan, now)
    moved = len(plan.blocks_to_swap_out)
    # 10 ms compute + 1 ms latency + moved x 1 MB at 1 GB/s.
    assert cost.step_time(plan) == pytest.approx(0.010 + 0.001 + moved * 1e-3)


def test_reserve_admission_never_preempts():
    workload = pressured_workload(seed=5)
    policy, result = run(workload, "continuous", num_blocks=30, block_size=4,
                         admission="reserve", max_num_batched_tokens=48)
    assert sum(policy.tally.preemptions.values()) == 0
    assert len(result.finished) == len(workload)


def test_prompt_admission_ends_the_chunk_preemption_cycle():
    # Request 1's first chunk fits beside request 0, its whole prompt does not. Admitted on its
    # first chunk's blocks (optimistic, as vLLM v1), each later chunk finds no block, and the
    # most recently admitted running request is request 1 itself: it preempts itself, is
    # admitted again next step, recomputes its first chunk, and so on until request 0 finishes.
    # Admitted on its whole prompt's blocks (prompt, as vLLM v0), it waits instead.
    workload = [req(0, 0.0, 40, 30), req(1, 0.05, 40, 4)]
    results = {}
    for admission in ("optimistic", "prompt"):
        policy, result = run(workload, "chunked_prefill", num_blocks=20, block_size=4, admission=admission,
                             chunk_size=8, max_num_batched_tokens=16)
        assert len(result.finished) == 2
        results[admission] = {r.request_id: r for r in result.finished}
    cycled, waited = results["optimistic"][1], results["prompt"][1]
    assert cycled.num_preemptions >= 5 and cycled.num_recomputed_tokens >= 5 * 8
    assert waited.num_preemptions == 0 and waited.num_recomputed_tokens == 0
    # It could start only when request 0 left, either way.
    assert waited.first_token_s == cycled.first_token_s


def test_prompt_admission_allocates_the_whole_prompt():
    policy = make_policy("chunked_prefill", num_blocks=100, block_size=4, admission="prompt", chunk_size=8)
    policy.add(req(0, 0.0, 30, 5), 0.0)
    plan = policy.schedule(0.0)
    assert plan.seqs[0].num_new_tokens == 8
    assert policy.bm.num_used_blocks == 8  # ceil(30 / 4), not the chunk's 2


def test_watermark_keeps_blocks_free_at_admission():
    policy = make_policy("continuous", num_blocks=100, block_size=1, admission="watermark", watermark=0.2)
    for i in range(5):
        policy.add(req(i, 0.0, 30, 5), 0.0)
    plan = policy.schedule(0.0)
    # 30 positions each: two fit while 20 blocks stay free; a third would leave 10.
    assert len(plan.seqs) == 2


def test_impossible_requests_are_rejected_with_a_reason_and_the_run_continues():
    workload = [req(0, 0.0, 10, 5), req(1, 0.0, 500, 5), req(2, 0.0, 10, 85), req(3, 0.1, 10, 5)]
    policy, result = run(workload, "continuous", num_blocks=20, block_size=4, max_model_len=100,
                         max_num_batched_tokens=1000)
    rejected = {r.request_id: r.reject_reason for r in result.rejected}
    assert set(rejected) == {1, 2}
    assert "max_model_len" in rejected[1]
    assert "KV blocks" in rejected[2]
    assert sorted(r.request_id for r in result.finished) == [0, 3]
    summary = summarize(result.requests)
    assert summary["num_rejected"] == summary["num_rejected_on_arrival"] == 2 and summary["completed"] == 2


def test_time_horizon_reports_unfinished_requests():
    workload = [req(i, i * 0.001, 50, 200) for i in range(100)]
    policy = make_policy("continuous", num_blocks=200, block_size=16, max_num_seqs=4)
    result = simulate(workload, policy, ConstantCostModel(step_s=0.01), limits=RunLimits(max_sim_time_s=1.0))
    assert result.end_reason == "max_sim_time"
    assert result.sim_time_s == pytest.approx(1.0)
    total = len(result.finished) + len(result.rejected) + len(result.unfinished)
    assert total == 100 and len(result.unfinished) > 0
    assert sorted(r.request_id for r in result.requests) == list(range(100))


def test_wall_time_limit_ends_the_run_cleanly():
    workload = [req(i, 0.0, 10, 100000) for i in range(4)]
    policy = make_policy("continuous", num_blocks=100000, block_size=16)
    result = simulate(workload, policy, ConstantCostModel(step_s=0.01), limits=RunLimits(max_wall_time_s=0.2))
    assert result.end_reason == "max_wall_time"
    assert len(result.unfinished) == 4


def test_a_run_that_cannot_finish_says_why():
    class NeverSchedules:
        """A policy that accepts work but never plans a step."""

        def __init__(self):
            self.waiting, self.running, self.swapped, self.finished, self.rejected = [], [], [], [], []

        def add(self, request, now):
            self.waiting.append(request)

        def schedule(self, now):
            return None

        def has_work(self):
            return bool(self.waiting)

    policy = NeverSchedules()
    policy.bm = make_policy("continuous", num_blocks=4).bm
    with pytest.raises(ServesimError, match="cannot finish"):
        simulate([req(0, 0.0, 4, 4)], policy, ConstantCostModel())


def test_static_entry_runs_without_the_global_prefix_cache_when_told_so(tmp_path):
    from experiments.config import parse_experiment
    from experiments.runner import run_experiment
    from tests.helpers import SMALL_EXPERIMENT

    data = {**SMALL_EXPERIMENT, "kv_cache": {**SMALL_EXPERIMENT["kv_cache"], "prefix_caching": True},
            "policies": [{"name": "static", "max_batch_size": 4, "prefix_caching": False}, {"name": "continuous"}]}
    run = run_experiment(parse_experiment(data, source="exp.yaml"), source="exp.yaml", out_dir=tmp_path)
    # Lookups are counted where the cache is on: the static run made none, the other did.
    assert [r.requests["num_prefix_query_tokens"].sum() > 0 for r in run.runs] == [False, True]


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_a_victim_that_could_never_come_back_is_rejected(fast, mode):
    """Request 1 is preempted with 7 positions; the watermark (2 of 8 blocks) leaves 6 for
    admission, and a swap-in needs as many, so it could never come back: it is rejected with the
    outputs it has (vLLM ignores it) instead of the run ending stuck. Its follow-up turn is
    released at that time."""
    requests = [req(0, 0.0, 1, 3), req(1, 0.0, 5, 3), req(2, 0.0, 2, 2, parent_id=1, think_time_s=0.5)]
    policy = make_policy("continuous", num_blocks=8, block_size=1, admission="watermark", watermark=0.25,
                         preemption=mode, num_host_blocks=100 if mode == "swap" else 0)
    result = simulate(requests, policy, ConstantCostModel(step_s=0.01),
                      limits=RunLimits(check_invariants=True),
                      accelerator=accelerator_for(policy) if fast else None)
    (victim,) = result.rejected
    assert victim.request_id == 1 and victim.num_outputs == 2 and victim.num_preemptions == 1
    assert "preempted with 7 positions" in victim.reject_reason and "leaving 6" in victim.reject_reason
    assert victim.num_recomputed_tokens == 0  # nothing was computed again
    assert sorted(r.request_id for r in result.finished) == [0, 2]
    follow_up = next(r for r in result.finished if r.request_id == 2)
    assert follow_up.arrival_s == victim.finish_s + 0.5
    assert policy.tally.preemptions == {"recompute": 0, "swap": 0, mode: 1}
    assert policy.bm.num_free_blocks == policy.bm.num_blocks
    assert policy.host is None or policy.host.num_free_blocks == 100  # nothing went to the host


def test_static_padded_reserves_the_group_maximum():
    policy = make_policy("static", num_blocks=100, block_size=4, max_batch_size=3, padded=True)
    for i, (p, o) in enumerate([(4, 1), (4, 1), (40, 1)]):
        policy.add(req(i, 0.0, p, o), 0.0)
    policy.schedule(0.0)
    # Each row reserves the longest member's 40 positions: 10 blocks, 30 in all.
    assert policy.bm.num_used_blocks == 30



def test_static_padded_rows_hold_their_rectangle_until_the_group_is_done():
    policy = make_policy("static", num_blocks=100, block_size=4, max_batch_size=3, padded=True)
    for i, output_len in enumerate((2, 5, 9)):
        policy.add(req(i, 0.0, 4, output_len), 0.0)
    from tests.helpers import drive

    now = 0.0
    used = []
    while policy.has_work() or policy.bm.num_used_blocks:
        plan, now = drive(policy, now)
        if plan is None:
            break
        used.append(policy.bm.num_used_blocks)
    # Three rows of the longest length (4 + 9 - 1 = 12 positions: 3 blocks) until the last finishes.
    assert used[:-1] == [9] * (len(used) - 1)
    policy.schedule(now)  # the next group forms: the rectangle is released
    assert policy.bm.num_used_blocks == 0


@pytest.mark.parametrize("opts", [{"chunk_size": 8}, {"chunk_size": 8, "order": "alternate"}])
def test_recompute_delay_runs_from_the_first_preemption_to_the_position_it_found(monkeypatch, opts):
    """A request's recompute delay is the time from its preemption until a step brings it back to
    the position the preemption found it at; one preempted again before it got back (a recompute
    in chunks, caught part way) is charged once, from the first preemption to the first
    position. Checked against an observer that follows every preemption and step of a
    memory-starved run."""
    from policies.base import Scheduler
    from simcore.request import Status

    preempt, complete = Scheduler.preempt, Scheduler.complete
    open_since: dict[int, tuple] = {}  # request id -> (request, preempted at, position then)
    expected: dict[int, float] = {}
    caught_again = []

    def observe_preempt(self, victim):  # noqa: ANN001, ANN202
        if victim.request_id in open_since:
            caught_again.append(victim.request_id)
        else:
            open_since[victim.request_id] = (victim, self._now, victim.num_processed)
        return preempt(self, victim)

    def observe_complete(self, plan, now):  # noqa: ANN001, ANN202
        done = complete(self, plan, now)
        for request_id, (request, since, position) in list(open_since.items()):
            if request.status is Status.RUNNING or request in done:
                if request.num_processed >= position:
                    expected[request_id] = expected.get(request_id, 0.0) + now - since
                    del open_since[request_id]
        return done

    monkeypatch.setattr(Scheduler, "preempt", observe_preempt)
    monkeypatch.setattr(Scheduler, "complete", observe_complete)
    policy = make_policy("chunked_prefill", num_blocks=24, block_size=4, max_num_seqs=12, max_num_batched_tokens=16,
                         **opts)
    result = simulate(pressured_workload(60, seed=3), policy, ConstantCostModel(step_s=0.01, per_token_s=1e-4),
                      limits=RunLimits(check_invariants=True))
    assert caught_again, "the workload should preempt some request again before it got back"
    delays = {r.request_id: r.recompute_delay_s for r in result.requests}
    assert delays == pytest.approx({i: expected.get(i, 0.0) for i in delays}, abs=1e-12)


def test_conservative_admission_keeps_room_for_outputs_and_relaxes_step_by_step():
    """SGLang's new_token_ratio: room for 0.7 of the outputs still to come at first, falling to
    0.098 over 600 steps, back to 0.7 when the batch empties."""
    policy = make_policy("continuous", num_blocks=100, block_size=4, admission="conservative")
    assert policy.new_token_ratio() == 0.7
    policy.num_steps = 300
    assert policy.new_token_ratio() == pytest.approx(0.7 - 300 * (0.7 - 0.098) / 600)
    policy.num_steps = 5000
    assert policy.new_token_ratio() == 0.098
    policy.schedule(0.0)  # an empty batch starts cautious again
    assert policy.new_token_ratio() == 0.7
    # One request running with 398 outputs to come, one asking 199 more: at 0.699, room for
    # ceil(0.699 x 597 / 4) = 105 blocks and its own 2 are more than the 105 free, so the newcomer
    # waits, until the share and the first's outputs to come have fallen enough.
    workload = [req(0, 0.0, 8, 400), req(1, 0.001, 8, 200)]
    policy, result = run(workload, "continuous", num_blocks=108, block_size=4, admission="conservative",
                         cost=ConstantCostModel(step_s=0.01))
    first, second = sorted(result.finished, key=lambda r: r.request_id)
    assert second.first_scheduled_s == pytest.approx(0.05) and second.num_preemptions == 0  # 5 steps on
    # Optimistic admission takes it at once.
    _, result = run(workload, "continuous", num_blocks=108, block_size=4, cost=ConstantCostModel(step_s=0.01))
    assert sorted(result.finished, key=lambda r: r.request_id)[1].first_scheduled_s < 0.02


def test_a_preemption_re_estimates_the_conservative_share():
    policy, result = run(pressured_workload(seed=3), "continuous", num_blocks=30, block_size=4,
                         admission="conservative", new_token_ratio=0.1, min_new_token_ratio=0.0)
    assert len(result.finished) == 40
    assert sum(policy.tally.preemptions.values()) > 0  # too little room kept: it preempted, and re-estimated
