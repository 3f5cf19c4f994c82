"""The event loop makes no reference cycles, so the collector can run rarely during a run
(`simcore.engine.GC_YOUNG_THRESHOLD`): what a run drops is freed at once, by reference count."""

from __future__ import annotations

import gc

import pytest

from backends.base import CostContext
from backends.roofline import make_roofline
from policies.registry import make_policy
from simcore.engine import RunLimits, simulate
from simcore.presets import get_model
from tests.test_fast_path import POLICIES, workload

# The run's own ends make one cycle when it returns (the SimPy environment and its process):
# a dozen objects, whatever the run's length. A cycle made per step or per run is hundreds.
MOST_UNREACHABLE = 30


@pytest.mark.parametrize("name,opts", POLICIES)
@pytest.mark.parametrize("fast", [False, True])
def test_a_run_leaves_no_cyclic_garbage(name, opts, fast):
    cost = make_roofline({}, CostContext(model=get_model("llama-3.1-8b"), hardware_name="h100-sxm"))
    needs_host = name == "offload" or opts.get("preemption") == "swap"
    found = []
    for caching, sessions in ((False, False), (False, True), (True, True)):
        requests = workload(11, content=caching, sessions=sessions)
        policy = make_policy(name, num_blocks=64, block_size=4, prefix_caching=caching,
                             num_host_blocks=400 if needs_host else 0, max_num_seqs=12, max_num_batched_tokens=96,
                             **opts)
        gc.collect()
        gc.disable()
        try:
            result = simulate(requests, policy, cost, limits=RunLimits(fast_forward=fast))
            found.append(gc.collect())
        finally:
            gc.enable()
        assert len(result.steps) > 100  # long enough that a cycle per run would show
    assert max(found) <= MOST_UNREACHABLE, found
