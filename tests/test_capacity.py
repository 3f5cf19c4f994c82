"""KV block budget: what is left of device memory after weights and a reserve, in whole blocks."""

from __future__ import annotations

import pytest

from simcore.capacity import block_bytes, kv_heads_per_gpu, num_gpu_blocks, weight_bytes_per_gpu
from simcore.errors import ConfigError
from simcore.presets import HardwareSpec, get_hardware, get_model

TOY = HardwareSpec("toy", peak_flops=1e12, mem_bandwidth=1e9, memory_bytes=10**6,
                   interconnect_bandwidth=1e9, interconnect_latency_s=0.0)


def test_block_bytes_is_eq_21_3_times_block_size():
    m = get_model("llama-3.1-8b")
    assert block_bytes(m, 16, 2) == 16 * 131072 == 2 * 1024**2
    assert block_bytes(m, 16, 2, tensor_parallel=2) == 1024**2
    assert block_bytes(m, 16, 1, tensor_parallel=8) == 16 * 2 * 32 * 1 * 128
    # The seed's 21.6 geometry: 256 bytes per position, so a 16-slot block holds 4096.
    assert block_bytes(get_model("tiny-llama"), 16, 2) == 4096


def test_kv_heads_replicate_when_tp_exceeds_them():
    m = get_model("llama-3.2-1b")  # 8 KV heads
    assert [kv_heads_per_gpu(m, tp) for tp in (1, 2, 4, 8, 16)] == [8, 4, 2, 1, 1]
    with pytest.raises(ConfigError, match="exp.yaml: tensor_parallel: .*cannot be split evenly"):
        block_bytes(get_model("tiny-llama"), 16, 2, 3, source="exp.yaml")
    with pytest.raises(ConfigError, match="tensor_parallel"):
        kv_heads_per_gpu(m, 0)


def test_num_gpu_blocks_by_hand():
    tiny = get_model("tiny-llama")
    # 106,816 parameters x 2 bytes = 213,632 bytes of weights; 1e6 x 0.5 usable; 4096-byte blocks.
    assert weight_bytes_per_gpu(tiny, 2) == 213632
    n = num_gpu_blocks(tiny, TOY, block_size=16, kv_dtype_bytes=2, weight_dtype_bytes=2,
                       gpu_memory_utilization=0.5, activation_reserve_bytes=0)
    assert n == (500000 - 213632) // 4096 == 69
    with_reserve = num_gpu_blocks(tiny, TOY, block_size=16, kv_dtype_bytes=2, weight_dtype_bytes=2,
                                  gpu_memory_utilization=0.5, activation_reserve_bytes=100000)
    assert with_reserve == (500000 - 213632 - 100000) // 4096
    # Tensor parallelism halves both the weights and the block on each GPU.
    tp2 = num_gpu_blocks(tiny, TOY, block_size=16, kv_dtype_bytes=2, weight_dtype_bytes=2,
                         gpu_memory_utilization=0.5, tensor_parallel=2, activation_reserve_bytes=0)
    assert tp2 == (500000 - 213632 // 2) // 2048


def test_llama_8b_on_h100_is_in_the_expected_range():
    n = num_gpu_blocks(get_model("llama-3.1-8b"), get_hardware("h100-sxm"), block_size=16, kv_dtype_bytes=2,
                       weight_dtype_bytes=2, gpu_memory_utilization=0.9)
    # 0.9 x 81559 MiB (the memory an H100 reports) = 76.97e9 usable - 16.06e9 weights - 1.5 GiB reserve
    # = ~59.3e9 bytes of 2 MiB blocks.
    assert 27500 < n < 29000


def test_weights_that_do_not_fit_say_the_numbers():
    m, hw = get_model("llama-3.1-70b"), get_hardware("h100-sxm")
    with pytest.raises(ConfigError) as err:
        num_gpu_blocks(m, hw, block_size=16, kv_dtype_bytes=2, weight_dtype_bytes=2, gpu_memory_utilization=0.9,
                       source="exp.yaml")
    text = str(err.value)
    assert "exp.yaml" in text and "141.11 GB" in text and "76.97 GB" in text and "h100-sxm" in text
    assert num_gpu_blocks(m, hw, block_size=16, kv_dtype_bytes=2, weight_dtype_bytes=2,
                          gpu_memory_utilization=0.9, tensor_parallel=4) > 0


@pytest.mark.parametrize("util", [0.0, 1.5, -0.1])
def test_utilisation_must_be_a_fraction(util):
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        num_gpu_blocks(get_model("tiny-llama"), TOY, block_size=16, kv_dtype_bytes=2, weight_dtype_bytes=2,
                       gpu_memory_utilization=util)


def test_block_size_must_be_positive():
    with pytest.raises(ConfigError, match="block_size"):
        block_bytes(get_model("tiny-llama"), 0, 2)
