"""What the engine needs of a cost model: a step's time, and a run's built from it.

A cost model needs only `step_time(plan)`. A run of steps taken at once comes as `Repeat`s
(a plan, and the steps that repeat it on longer contexts); `repeat_times` prices one with the
model's own `repeat_times` where it has one (a faster way to the very same numbers, which
tests/test_cost_models.py checks bit for bit against `step_time` for every registered model),
else one plan at a time with `step_time`. A subclass that writes its own `step_time` is priced
by it, step by step, unless it writes a `repeat_times` too: the one it inherits describes its
base's `step_time`, not its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Protocol, runtime_checkable

from simcore.plan import Repeat, StepPlan


@runtime_checkable
class CostModel(Protocol):
    def step_time(self, plan: StepPlan) -> float:
        """Seconds the engine spends on this step (compute plus any transfers in the plan)."""
        ...


def repeat_times(cost_model: CostModel, repeat: Repeat) -> Sequence[float]:
    """Each of a repeat's steps' time, in order (a list or an array of floats)."""
    if prices_repeats(type(cost_model)):
        return cost_model.repeat_times(repeat)  # type: ignore[attr-defined]
    return [cost_model.step_time(plan) for plan in repeat.plans()]


@cache
def prices_repeats(cls: type) -> bool:
    """Does `cls` have a `repeat_times` written for the `step_time` it has: defined by the class
    that defines its `step_time`, or by a subclass of it?"""
    def owner(name: str) -> type | None:
        return next((base for base in cls.__mro__ if name in vars(base)), None)

    fast, step = owner("repeat_times"), owner("step_time")
    return fast is not None and step is not None and issubclass(fast, step)


def step_extras(cost_model: object) -> dict[str, float]:
    """Extra per-step columns a cost model measured for its last step (e.g. GPU-only time)."""
    extras = getattr(cost_model, "last_step_extras", None)
    return dict(extras) if extras else {}
