"""A prompt admitted and preempted in turn, taken as one stretch (`policies.readmit_cycle`)."""

from __future__ import annotations

import random

import pandas as pd
import pytest

from backends.constant import ConstantCostModel
from policies.registry import make_policy
from simcore.decode_blocks import after_storing_each, blocks_each_step
from simcore.engine import RunLimits, simulate
from simcore.metrics import request_frame
from tests.helpers import req
from tests.test_fast_path import _both_paths_equal, _expanded, _spy_parts

COST = ConstantCostModel(step_s=0.01, per_token_s=1e-4)


def crowded(seed: int, num_requests: int = 60):
    """Prompts of several chunks arriving faster than a small KV cache can hold them."""
    rng = random.Random(seed)
    t, requests = 0.0, []
    for i in range(num_requests):
        t += rng.expovariate(50.0)
        requests.append(req(i, t, rng.randint(20, 60), rng.randint(10, 50)))
    return requests


def options(num_blocks: int, admission: str, seats: int = 12, budget: int = 16) -> dict:
    extra = {"watermark": 0.05} if admission == "watermark" else {}
    return {"num_blocks": num_blocks, "block_size": 4, "max_num_seqs": seats, "max_num_batched_tokens": budget,
            "chunk_size": 16, "admission": admission, **extra}


@pytest.mark.parametrize("seed,num_blocks,admission", [
    (0, 24, "optimistic"), (1, 24, "watermark"), (2, 32, "optimistic"), (3, 48, "watermark"),
])
def test_readmission_cycles_run_as_one_stretch_and_match_stepping(monkeypatch, seed, num_blocks, admission):
    """Where the head of the queue finds room for its first chunks but not the next, the steps
    that admit it and preempt it again, in turn, are one stretch; every table, the gaps, the
    preemption counts and the recompute delays equal stepping's."""
    applied = _spy_parts(monkeypatch)
    fast, steps = _both_paths_equal(crowded(seed), "chunked_prefill", COST, **options(num_blocks, admission))
    cycles = [(stretch, taken) for stretch, taken in applied if stretch.readmits]
    assert cycles and max(taken for _, taken in cycles) >= 4
    # Its records alternate: the prompt's chunks beside the decodes, then the prompt preempted.
    assert (steps["num_preempted"] > 0).sum() >= sum(stretch.readmit_positions(taken).count(0)
                                                     for stretch, taken in cycles)
    # Some admissions run several chunks before the prompt is preempted, and some cycles
    # admit it several times.
    assert max(max(stretch.readmits) for stretch, _ in cycles) >= 2
    assert max(len(stretch.readmits) for stretch, _ in cycles) >= 2
    frame = request_frame(fast.requests)
    assert frame["num_preemptions"].max() >= 2
    assert (frame["recompute_delay_s"] > 0).any()


def test_no_cycle_where_another_request_could_join_the_admitting_step(monkeypatch):
    """With budget left beside the chunk and a seat free, a request arriving during the cycle
    could join an admitting step: no such stretch is planned, and the results still match."""
    applied = _spy_parts(monkeypatch)
    _, steps = _both_paths_equal(crowded(0), "chunked_prefill", COST, **options(24, "optimistic", budget=48))
    assert not [stretch for stretch, _ in applied if stretch.readmits]
    # The run has such pairs of steps: a prompt's chunk, then a preemption with one fewer running.
    preempts = (steps["num_preempted"] == 1) & (steps["num_prefill_tokens"].shift() > 0) \
        & (steps["num_running"] == steps["num_running"].shift() - 1)
    assert preempts.sum() >= 10


@pytest.mark.parametrize("into", [0.5, 1.5, 2.5])
def test_a_cycle_cut_by_the_horizon_matches_stepping(monkeypatch, into):
    """A run that ends inside a readmission cycle, after an admitting step (the prompt left
    running with its chunk) or after a preempting one, reports what stepping reports."""
    applied = _spy_parts(monkeypatch, ends=True)
    requests, opts = crowded(1), options(24, "optimistic")
    simulate(requests, make_policy("chunked_prefill", **opts), COST, limits=RunLimits())
    cycle_ends = next(ends for stretch, ends in applied if stretch.readmits and len(ends) >= 4)
    step = int(into)
    horizon = cycle_ends[step] + (cycle_ends[step + 1] - cycle_ends[step]) * (into - step)
    applied.clear()
    frames = []
    for fast in (False, True):
        result = simulate(requests, make_policy("chunked_prefill", **opts), COST,
                          limits=RunLimits(fast_forward=fast, max_sim_time_s=horizon, check_invariants=True))
        assert result.end_reason == "max_sim_time"
        frames.append((request_frame(result.requests), pd.DataFrame(result.steps.as_dict()), _expanded(result.itl)))
    pd.testing.assert_frame_equal(frames[0][0], frames[1][0], check_exact=True)
    pd.testing.assert_frame_equal(frames[0][1], frames[1][1], check_exact=True)
    assert frames[0][2] == frames[1][2]
    # The fast run was cut inside a cycle.
    assert any(stretch.readmits and len(ends) < stretch.num_steps for stretch, ends in applied)


@pytest.mark.parametrize("seed", range(5))
def test_blocks_each_step_counts_each_decode_steps_new_blocks(seed):
    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 4, 16])
    firsts = [rng.randint(1, block_size) for _ in range(rng.randint(0, 40))]
    num_steps = rng.randint(0, 3 * block_size + 2)
    expected, current = [], firsts
    for _ in range(num_steps):  # one step at a time
        taken, current = after_storing_each(current, 1, block_size)
        expected.append(taken)
    assert blocks_each_step(firsts, num_steps, block_size) == expected


@pytest.mark.parametrize("seed", range(8))
def test_random_crowded_configurations_match_stepping(seed):
    """Random small crowded configurations (budget, chunk, block size and count, seats,
    admission), each run both ways: identical tables and gaps."""
    rng = random.Random(seed)
    for _ in range(10):
        chunk = rng.choice([2, 4, 8, 16, 200])
        budget = rng.choice([chunk, chunk, 16, 48])
        block_size, num_blocks = rng.choice([1, 2, 4, 8]), rng.choice([12, 16, 24, 40])
        admission = rng.choice(["optimistic", "watermark", "reserve"])
        requests, t = [], 0.0
        for i in range(rng.randint(20, 60)):
            t += rng.expovariate(rng.choice([50.0, 1000.0]))
            prompt, output = rng.randint(1, 60), rng.randint(1, 60)
            if -(-(prompt + output) // block_size) <= num_blocks:
                requests.append(req(i, t, prompt, output))
        _both_paths_equal(requests, "chunked_prefill", COST, num_blocks=num_blocks, block_size=block_size,
                          max_num_seqs=rng.choice([2, 4, 12]), max_num_batched_tokens=budget, chunk_size=chunk,
                          admission=admission, **({"watermark": 0.05} if admission == "watermark" else {}))


def test_no_cycle_for_a_prompt_that_its_preemption_rejects():
    """Request 17 (59 positions and its outputs) is the newest decoder when the decodes find too
    few blocks; preempted with more positions than the watermark leaves (10 of 16 blocks of 8),
    it could never be admitted again and is rejected (`BasePolicy.readmission_reason`). The
    cycle planner must not plan it back in: both paths reject it at the same step."""
    from backends.base import CostContext
    from backends.roofline import make_roofline
    from simcore.presets import get_model

    roofline = make_roofline({}, CostContext(model=get_model("llama-3.1-8b"), hardware_name="h100-sxm"))
    requests = [req(13, 0.1729, 10, 59), req(15, 0.1925, 24, 36), req(16, 0.2041, 6, 54), req(17, 0.2673, 59, 41)]
    fast, _ = _both_paths_equal(requests, "chunked_prefill", roofline, num_blocks=16, block_size=8, max_num_seqs=2,
                                max_num_batched_tokens=16, chunk_size=200, admission="watermark", watermark=0.4)
    (rejected,) = fast.rejected
    assert rejected.request_id == 17 and rejected.num_outputs > 0
    assert "preempted with" in rejected.reject_reason
