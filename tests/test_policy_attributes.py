"""A policy keeps at most 29 attributes of its own, so that its instance dictionary stays shared.

CPython 3.11 shares one table of attribute names among the instances of a class, while they have
few: on this project's machine (Python 3.11.7) an instance with 29 attributes keeps the shared
table, and one with 30 gets a dictionary of its own (`sys.getsizeof(vars(obj))`: 296 bytes against
1,584). Reading an attribute then takes about 2.4 ns more (15.4 ns against 13.0, best of seven).
A policy's attributes are read many times in every step and every run of steps: with 28 instead
of 32, continuous batching's 10k reference run took 1.6% fewer instructions (benchmarks/README.md,
"Twenty-fourth session"). What only the summary reads is kept in one object
(`policies.tally.Tally`), and so is what the plans carry for the cost model (`PlanExtras`).
"""

from __future__ import annotations

import pytest

from backends.base import CostContext
from backends.roofline import make_roofline
from simcore.engine import RunLimits, simulate
from simcore.presets import get_model
from tests.test_fast_path import POLICIES, small_policy, workload

# The most attributes an instance has with its dictionary still shared (CPython 3.11.7).
MOST_SHARED_ATTRIBUTES = 29


@pytest.mark.parametrize("name,opts", POLICIES)
@pytest.mark.parametrize("caching", [False, True])
@pytest.mark.parametrize("fast", [False, True])
def test_a_policy_keeps_at_most_29_attributes_through_a_run(name, opts, caching, fast):
    cost = make_roofline({}, CostContext(model=get_model("llama-3.1-8b"), hardware_name="h100-sxm"))
    policy = small_policy(name, opts, caching=caching)
    simulate(workload(5, content=caching, sessions=True), policy, cost, limits=RunLimits(fast_forward=fast))
    assert len(vars(policy)) <= MOST_SHARED_ATTRIBUTES, sorted(vars(policy))
