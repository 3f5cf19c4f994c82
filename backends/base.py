"""The cost-model contract and what a cost model may know about the run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from simcore.model import ModelSpec
from simcore.pricing import CostModel, repeat_times, step_extras

__all__ = ["CostContext", "CostModel", "repeat_times", "step_extras"]


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
