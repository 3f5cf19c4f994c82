"""The cost-model contract and what a cost model may know about the run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from simcore.model import ModelSpec
from simcore.plan import StepPlan


@dataclass(frozen=True)
class CostContext:
    """Run-wide facts a cost model is built with (never per-step state)."""

    model: ModelSpec
    hardware_name: str
    kv_dtype_bytes: int = 2
    weight_dtype_bytes: int = 2
    block_size: int = 16
    num_blocks: int = 0
    num_host_blocks: int = 0
    tensor_parallel: int = 1
    seed: int = 0
    # Where relative paths in the cost model's parameters are resolved, and named in errors.
    source: Path | None = None


@runtime_checkable
class CostModel(Protocol):
    def step_time(self, plan: StepPlan) -> float:
        """Seconds the engine spends on this step (compute plus any transfers in the plan)."""
        ...


def step_extras(cost_model: object) -> dict[str, float]:
    """Extra per-step columns a cost model measured for its last step (e.g. GPU-only time)."""
    extras = getattr(cost_model, "last_step_extras", None)
    return dict(extras) if extras else {}
