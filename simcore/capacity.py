"""How many KV blocks fit on a device once the weights are loaded (vLLM-style memory budget)."""

from __future__ import annotations

import math
from pathlib import Path

from simcore.errors import ConfigError
from simcore.model import GIB, ModelSpec
from simcore.presets import HardwareSpec

# Memory kept back for activations, workspace and CUDA graphs. vLLM logs for Llama-3.1-8B on
# one H100 show ~1.2 GiB peak activations plus ~0.2 GiB outside PyTorch; 1.5 GiB covers that.
DEFAULT_ACTIVATION_RESERVE_BYTES = 3 * GIB // 2


def kv_heads_per_gpu(model: ModelSpec, tensor_parallel: int = 1, *, source: str | Path | None = None) -> int:
    """KV heads one GPU stores: a shard of H_KV, or one replicated head when tp exceeds H_KV.

    This is Megatron/vLLM's tensor-parallel attention layout: heads are split evenly, and when
    there are fewer KV heads than ranks each rank keeps a copy of the one its queries use.
    """
    if not isinstance(tensor_parallel, int) or tensor_parallel < 1:
        raise ConfigError("invalid tensor_parallel", source=_text(source), where="tensor_parallel",
                          expected="an integer >= 1", found=tensor_parallel)
    heads = model.num_kv_heads
    if heads % tensor_parallel and tensor_parallel % heads:
        raise ConfigError(
            f"{model.name} has {heads} KV heads, which cannot be split evenly over {tensor_parallel} GPUs",
            source=_text(source), where="tensor_parallel", expected=f"a divisor or multiple of {heads}",
            found=tensor_parallel,
        )
    return max(1, heads // tensor_parallel)


def block_bytes(
    model: ModelSpec, block_size: int, kv_dtype_bytes: int, tensor_parallel: int = 1, *,
    source: str | Path | None = None, attention_data_parallel: bool = False,
) -> int:
    """Bytes of one KV block on one GPU: eq. 21.3 per position, times block_size positions.

    Per GPU because that is what each GPU stores and what each GPU's own host link moves. Under
    attention data parallelism a block is one GPU's, with every head (its requests are its own).
    """
    if block_size < 1:
        raise ConfigError("invalid block_size", source=_text(source), where="block_size",
                          expected="a positive integer", found=block_size)
    heads_split = 1 if attention_data_parallel else tensor_parallel
    kv_heads_per_gpu(model, heads_split, source=source)  # checks the split
    # 2 x heads x d_head per layer, or MLA's latent (kept whole on every rank): ModelSpec's arithmetic.
    return model.num_layers * model.kv_scalars_per_token_per_layer(heads_split) * kv_dtype_bytes * block_size


def weight_bytes_per_gpu(model: ModelSpec, weight_dtype_bytes: float, tensor_parallel: int = 1,
                         expert_weight_dtype_bytes: float | None = None, *,
                         attention_data_parallel: bool = False) -> float:
    """Parameters x bytes (routed experts at their own bytes where given: ModelSpec.weight_bytes),
    split evenly over the tensor-parallel ranks (norms are tiny); under attention data
    parallelism only the routed experts split (each GPU holds every other weight)."""
    total = model.weight_bytes(weight_dtype_bytes, expert_weight_dtype_bytes)
    if not attention_data_parallel:
        return total / tensor_parallel
    experts = model.routed_expert_params * (weight_dtype_bytes if expert_weight_dtype_bytes is None
                                            else expert_weight_dtype_bytes)
    return total - experts + experts / tensor_parallel


def num_gpu_blocks(
    model: ModelSpec,
    hardware: HardwareSpec,
    *,
    block_size: int,
    kv_dtype_bytes: int,
    weight_dtype_bytes: float,
    gpu_memory_utilization: float,
    tensor_parallel: int = 1,
    activation_reserve_bytes: int = DEFAULT_ACTIVATION_RESERVE_BYTES,
    source: str | Path | None = None,
    pipeline_parallel: int = 1,
    expert_weight_dtype_bytes: float | None = None,
    attention_data_parallel: bool = False,
) -> int:
    """floor((memory x utilisation - weights/tp/pp - reserve) / block bytes per GPU), where a
    pipeline stage holds 1/pp of the layers: of the weights and of every block (pp divides the
    layers; simcore.capacity.block_bytes is a whole tensor-parallel rank's block). Under attention
    data parallelism each of the tp GPUs holds its own blocks, whole: tp times as many."""
    where_src = _text(source)
    if not 0 < gpu_memory_utilization <= 1:
        raise ConfigError("invalid gpu_memory_utilization", source=where_src, where="gpu_memory_utilization",
                          expected="a fraction in (0, 1]", found=gpu_memory_utilization)
    usable = hardware.memory_bytes * gpu_memory_utilization
    weights = weight_bytes_per_gpu(model, weight_dtype_bytes, tensor_parallel, expert_weight_dtype_bytes,
                                   attention_data_parallel=attention_data_parallel) / pipeline_parallel
    free = usable - weights - activation_reserve_bytes
    per_block = block_bytes(model, block_size, kv_dtype_bytes, tensor_parallel, source=source,
                            attention_data_parallel=attention_data_parallel) // pipeline_parallel
    if free < per_block:
        raise ConfigError(
            f"{model.name} does not leave room for one KV block on {hardware.name}: usable memory "
            f"{_gb(usable)} ({gpu_memory_utilization:g} x {_gb(hardware.memory_bytes)}) minus weights "
            f"{_gb(weights)} per GPU (tp={tensor_parallel}, pp={pipeline_parallel}) minus reserve {_gb(activation_reserve_bytes)} "
            f"leaves {_gb(free)}, less than one block of {per_block} bytes",
            source=where_src, where="hardware",
        )
    return math.floor(free / per_block) * (tensor_parallel if attention_data_parallel else 1)


def _gb(num_bytes: float) -> str:
    return f"{num_bytes / 1e9:.2f} GB"


def _text(source: str | Path | None) -> str | None:
    return str(source) if source is not None else None
