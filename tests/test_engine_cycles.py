"""The event loop makes no reference cycles, so the collector can run rarely during a run
(`simcore.engine.GC_YOUNG_THRESHOLD`): what a run drops is freed at once, by reference count."""

from __future__ import annotations

import gc

import pytest

from backends.base import CostContext
from backends.constant import ConstantCostModel
from backends.roofline import make_roofline
from policies.accelerate import accelerator_for
from policies.registry import make_policy
from simcore.cluster import simulate
from simcore.engine import GC_YOUNG_THRESHOLD
from simcore.presets import get_model
from tests.test_accelerate import CONFIGS, small_policy, workload

# The run's own ends make one cycle when it returns (the SimPy environment and its process):
# a dozen objects, whatever the run's length. A cycle made per step or per run is hundreds.
MOST_UNREACHABLE = 30


@pytest.mark.parametrize("name,opts", CONFIGS)
@pytest.mark.parametrize("fast", [False, True])
def test_a_run_leaves_no_cyclic_garbage(name, opts, fast):
    cost = make_roofline({}, CostContext(model=get_model("llama-3.1-8b"), hardware_name="h100-sxm"))
    found = []
    for caching, sessions in ((False, False), (False, True), (True, True)):
        requests = workload(11, content=caching, sessions=sessions)
        policy = small_policy(name, opts, caching=caching)
        while gc.collect():  # (what earlier tests left: a pass can free what makes more garbage)
            pass
        gc.disable()
        try:
            result = simulate(requests, policy, cost, accelerator=accelerator_for(policy) if fast else None)
            found.append(gc.collect())
        finally:
            gc.enable()
        assert len(result.steps) > 100  # long enough that a cycle per run would show
    assert max(found) <= MOST_UNREACHABLE, found


@pytest.mark.parametrize("young", [0, 700, 250_000])
def test_a_run_restores_the_collector_thresholds(young):
    """The rarer young passes last the run only; a threshold of 0 (automatic collection off)
    stays off, and a rarer one than the run's is kept."""
    seen = []
    policy = make_policy("continuous", num_blocks=64, block_size=4)
    before = gc.get_threshold()
    gc.set_threshold(young, 10, 10)
    try:
        simulate(workload(3, content=False), policy, ConstantCostModel(step_s=0.01),
                 on_step=lambda _: seen.append(gc.get_threshold()[0]))
        after = gc.get_threshold()
    finally:
        gc.set_threshold(*before)
    assert after == (young, 10, 10)
    assert seen and set(seen) == {young if young in (0, 250_000) else GC_YOUNG_THRESHOLD}
