"""The cost-model contract and what a cost model may know about the run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from simcore.hardware import HardwareSpec
from simcore.model import ModelSpec
from simcore.pricing import CostModel, repeat_times, step_extras

__all__ = ["CostContext", "CostModel", "repeat_times", "step_extras"]


@dataclass(frozen=True)
class CostContext:
    """Run-wide facts a cost model is built with (never per-step state)."""

    model: ModelSpec
    hardware_name: str
    kv_dtype_bytes: int = 2
    # Bytes per stored weight: 0.5 for 4-bit formats (simcore.precision).
    weight_dtype_bytes: float = 2
    # Bytes per stored routed-expert weight where the experts are quantized apart (gpt-oss's
    # MXFP4); None: weight_dtype_bytes.
    expert_weight_dtype_bytes: float | None = None
    block_size: int = 16
    num_blocks: int = 0
    num_host_blocks: int = 0
    tensor_parallel: int = 1
    # Pipeline stages (each holds num_layers / pipeline_parallel layers).
    pipeline_parallel: int = 1
    # Attention data parallel over the tensor_parallel GPUs, experts spread over them (the
    # roofline's attention_data_parallel).
    attention_data_parallel: bool = False
    # The GEMMs' compute dtype (simcore.precision.default_activation_dtype of the weights by default).
    activation_dtype: str = "bf16"
    # The hardware itself, where the experiment gave a mapping rather than a preset name (whose
    # name is hardware_name); None: the preset hardware_name.
    hardware: HardwareSpec | None = None
    seed: int = 0
    # Where relative paths in the cost model's parameters are resolved, and named in errors.
    source: Path | None = None
