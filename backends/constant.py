"""A hand-checkable cost model: t = a + b * tokens + c * requests (+ transfers at a link speed)."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

from backends.base import CostContext
from simcore.plan import Repeat, StepPlan


@dataclass
class ConstantCostModel:
    # Fixed cost of every step (launch, scheduling), seconds.
    step_s: float = 0.01
    # Cost per processed position (prefill or decode), seconds.
    per_token_s: float = 0.0
    # Cost per scheduled request, seconds.
    per_request_s: float = 0.0
    # Host<->device link for swaps: bytes per second (0 disables transfer cost) and fixed latency.
    link_bytes_per_s: float = 0.0
    transfer_latency_s: float = 0.0

    def __post_init__(self) -> None:
        # Every parameter is a finite number >= 0 (build_model_from_params has checked the types).
        for name in ("step_s", "per_token_s", "per_request_s", "link_bytes_per_s", "transfer_latency_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf \
                    or value > sys.float_info.max:
                raise ValueError(f"{name}: expected a finite number >= 0, found {value!r}")
            # Seconds as floats, so that every step's arithmetic is a float's.
            setattr(self, name, float(value))
        if self.step_s + self.per_token_s + self.per_request_s <= 0:
            raise ValueError("step_s, per_token_s and per_request_s are all 0: every step would take no time; "
                             "give at least one of them a positive value")

    def step_time(self, plan: StepPlan) -> float:
        compute = self.step_s + self.per_token_s * plan.num_batched_tokens + self.per_request_s * plan.num_seqs
        return compute + self.transfer_time(plan)

    def repeat_times(self, repeat: Repeat) -> list[float]:
        """Times of a repeat's steps, bit-equal to step_time: a step's time does not depend on
        context, so every step takes its plan's (which moves no blocks)."""
        plan = repeat.plan
        return [self.step_time(plan)] * repeat.num_steps

    def transfer_time(self, plan: StepPlan) -> float:
        num_moved = len(plan.blocks_to_swap_in) + len(plan.blocks_to_swap_out)
        if num_moved == 0 or self.link_bytes_per_s <= 0:
            return 0.0
        return self.transfer_latency_s + num_moved * plan.block_bytes / self.link_bytes_per_s


def make_constant(params: dict, ctx: CostContext) -> ConstantCostModel:
    from simcore.validate import build_model_from_params

    return build_model_from_params(ConstantCostModel, params, where="cost_model", source=ctx.source)
