"""Named models, accelerators and host links, with the public numbers they come from.

Model geometry is copied from each model's Hugging Face `config.json` (keys spelt as there).
A model's context length, the default max_model_len, is derived from max_position_embeddings
and rope_scaling as vLLM does (simcore.hf_config.context_length); each entry notes its value.
Hardware numbers are vendor datasheet figures: dense (no sparsity) bf16 tensor-core FLOP/s and
HBM bandwidth. Memory sizes use the vendor's "GB" read as 1e9 bytes. That is conservative:
the A100-80GB and H100-SXM actually carry 80 GiB (85.9e9 bytes) and an H200 reports about
140 GiB, so capacities computed from these presets come out ~7% low rather than optimistic.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from simcore.errors import ConfigError
from simcore.model import ModelSpec
from simcore.paths import expand_home

GB = 10**9  # vendors' decimal gigabyte

# Llama 3.1 / 3.2 long-context RoPE scaling, spelt as in their config.json files.
_LLAMA31_ROPE_SCALING = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}
_LLAMA32_ROPE_SCALING = {**_LLAMA31_ROPE_SCALING, "factor": 32.0}
# (Each preset gets its own copy below: the dicts are mutable and must not be shared.)

MODELS: dict[str, ModelSpec] = {
    # meta-llama/Llama-3.1-8B config.json. Context 131072: max_position_embeddings already gives
    # the extended length (llama3 RoPE scaling, 8x the original 8192).
    "llama-3.1-8b": ModelSpec(
        name="llama-3.1-8b", num_layers=32, hidden_size=4096, num_q_heads=32, num_kv_heads=8,
        head_dim=128, intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False,
        rope_theta=500000.0, rope_scaling=dict(_LLAMA31_ROPE_SCALING), max_position_embeddings=131072,
        rms_norm_eps=1e-5,
    ),
    # meta-llama/Llama-3.2-1B config.json: explicit head_dim 64, tied embeddings. Context 131072
    # (llama3 RoPE scaling, already in max_position_embeddings).
    "llama-3.2-1b": ModelSpec(
        name="llama-3.2-1b", num_layers=16, hidden_size=2048, num_q_heads=32, num_kv_heads=8,
        head_dim=64, intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True,
        rope_theta=500000.0, rope_scaling=dict(_LLAMA32_ROPE_SCALING), max_position_embeddings=131072,
        rms_norm_eps=1e-5,
    ),
    # meta-llama/Llama-2-7b-hf config.json: multi-head attention (H_KV = H_Q). Context 4096.
    "llama-2-7b": ModelSpec(
        name="llama-2-7b", num_layers=32, hidden_size=4096, num_q_heads=32, num_kv_heads=32,
        head_dim=128, intermediate_size=11008, vocab_size=32000, tie_word_embeddings=False,
        rope_theta=10000.0, max_position_embeddings=4096, rms_norm_eps=1e-5,
    ),
    # mistralai/Mistral-7B-v0.1 config.json. Its sliding_window (4096) is ignored: the
    # simulator keeps and attends to the whole context, so long contexts are over-priced. Context
    # 32768 (max_position_embeddings; vLLM does not shorten it to the window either).
    "mistral-7b": ModelSpec(
        name="mistral-7b", num_layers=32, hidden_size=4096, num_q_heads=32, num_kv_heads=8,
        head_dim=128, intermediate_size=14336, vocab_size=32000, tie_word_embeddings=False,
        rope_theta=10000.0, max_position_embeddings=32768, rms_norm_eps=1e-5,
    ),
    # Qwen/Qwen2.5-7B config.json (base model); Qwen2 puts a bias on q/k/v. Context 131072 (the
    # Instruct model's config.json says 32768, reaching 131072 only with YaRN added).
    "qwen2.5-7b": ModelSpec(
        name="qwen2.5-7b", num_layers=28, hidden_size=3584, num_q_heads=28, num_kv_heads=4,
        head_dim=128, intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False,
        rope_theta=1000000.0, max_position_embeddings=131072, rms_norm_eps=1e-6,
        attention_bias=True,
    ),
    # meta-llama/Llama-3.1-70B config.json. Context 131072, as Llama-3.1-8B.
    "llama-3.1-70b": ModelSpec(
        name="llama-3.1-70b", num_layers=80, hidden_size=8192, num_q_heads=64, num_kv_heads=8,
        head_dim=128, intermediate_size=28672, vocab_size=128256, tie_word_embeddings=False,
        rope_theta=500000.0, rope_scaling=dict(_LLAMA31_ROPE_SCALING), max_position_embeddings=131072,
        rms_norm_eps=1e-5,
    ),
    # A made-up Llama small enough for CPU tests of the real engine (GQA with 2 groups); context 2048.
    "tiny-llama": ModelSpec(
        name="tiny-llama", num_layers=2, hidden_size=64, num_q_heads=4, num_kv_heads=2,
        head_dim=16, intermediate_size=128, vocab_size=256, tie_word_embeddings=False,
        rope_theta=10000.0, max_position_embeddings=2048, rms_norm_eps=1e-5,
    ),
}


@dataclass(frozen=True)
class LinkSpec:
    """A copy path (host<->device, or between devices or machines): sustained bytes per second
    one way, and a fixed cost per copy."""

    name: str
    bytes_per_s: float
    latency_s: float


@dataclass(frozen=True)
class HardwareSpec:
    """One accelerator as the roofline sees it."""

    name: str
    # Dense bf16 tensor-core peak, FLOP/s.
    peak_flops: float
    # Device memory bandwidth, bytes/s.
    mem_bandwidth: float
    # Device memory capacity, bytes.
    memory_bytes: int
    # Per-GPU one-way bandwidth seen by a tensor-parallel ring all-reduce, bytes/s.
    interconnect_bandwidth: float
    # Fixed cost of one all-reduce (launch and synchronisation), seconds.
    interconnect_latency_s: float
    # The host link a cost model uses for swaps when the user names none.
    host_link: str = "pcie-gen4-pinned"


# Copy latency: ~10 us for a cudaMemcpyAsync launch plus DMA setup (order of magnitude).
_COPY_LATENCY_S = 10e-6

LINKS: dict[str, LinkSpec] = {
    # PCIe 4.0 x16 is 32 GB/s raw per direction; pinned copies reach ~25, pageable ~12
    # because the driver stages pageable memory through a pinned bounce buffer.
    "pcie-gen4-pinned": LinkSpec("pcie-gen4-pinned", 25 * GB, _COPY_LATENCY_S),
    "pcie-gen4-pageable": LinkSpec("pcie-gen4-pageable", 12 * GB, _COPY_LATENCY_S),
    # PCIe 5.0 x16 doubles the raw rate (64 GB/s); the pinned and pageable figures below are
    # taken as twice the gen4 ones, except where a host was measured (the h200-host entries).
    "pcie-gen5-pinned": LinkSpec("pcie-gen5-pinned", 50 * GB, _COPY_LATENCY_S),
    "pcie-gen5-pageable": LinkSpec("pcie-gen5-pageable", 24 * GB, _COPY_LATENCY_S),
    # Measured on one H200 host (DESIGN.md): ~55 GB/s pinned and ~21 GB/s pageable each way.
    "h200-host-pinned": LinkSpec("h200-host-pinned", 55 * GB, _COPY_LATENCY_S),
    "h200-host-pageable": LinkSpec("h200-host-pageable", 21 * GB, _COPY_LATENCY_S),
}
# NVLink all-reduce latency of a few microseconds per call (NCCL small-message regime).
_NVLINK_LATENCY_S = 5e-6
# Links between devices or machines, for a disaggregated cluster's KV transfers (one direction):
# NVLink 4 (H100/H200 datasheets: 900 GB/s per GPU, both directions together); a 400 Gb/s NIC,
# InfiniBand NDR or RoCE (NVIDIA ConnectX-7 datasheet: 400 Gb/s = 50 GB/s), with RDMA's few
# microseconds per transfer, RoCE's a little more over Ethernet switches (order of magnitude).
LINKS["nvlink-4"] = LinkSpec("nvlink-4", 450 * GB, _NVLINK_LATENCY_S)
LINKS["infiniband-ndr"] = LinkSpec("infiniband-ndr", 50 * GB, 5e-6)
LINKS["roce-400g"] = LinkSpec("roce-400g", 50 * GB, 10e-6)
# A bare generation name means pinned memory, which is what engines allocate for swap space.
LINKS["pcie-gen4"] = LinkSpec("pcie-gen4", LINKS["pcie-gen4-pinned"].bytes_per_s, _COPY_LATENCY_S)
LINKS["pcie-gen5"] = LinkSpec("pcie-gen5", LINKS["pcie-gen5-pinned"].bytes_per_s, _COPY_LATENCY_S)


HARDWARE: dict[str, HardwareSpec] = {
    # NVIDIA A100 datasheet: 312 TFLOP/s bf16 dense, 2,039 GB/s (80GB SXM), NVLink3 600 GB/s
    # total, i.e. 300 GB/s each way.
    "a100-80gb": HardwareSpec("a100-80gb", 312e12, 2.039e12, 80 * GB, 300 * GB, _NVLINK_LATENCY_S),
    # NVIDIA H100 SXM datasheet: 989 TFLOP/s bf16 dense, 3.35 TB/s, NVLink4 900 GB/s total.
    "h100-sxm": HardwareSpec(
        "h100-sxm", 989e12, 3.35e12, 80 * GB, 450 * GB, _NVLINK_LATENCY_S, host_link="pcie-gen5-pinned"
    ),
    # NVIDIA H200 datasheet: same compute as H100, 4.8 TB/s, 141 GB HBM3e.
    "h200": HardwareSpec(
        "h200", 989e12, 4.8e12, 141 * GB, 450 * GB, _NVLINK_LATENCY_S, host_link="h200-host-pinned"
    ),
    # NVIDIA L4 datasheet: 121 TFLOP/s bf16 dense (242 with sparsity), 300 GB/s, 24 GB; no
    # NVLink, so tensor parallelism goes over PCIe 4.0.
    "l4": HardwareSpec("l4", 121e12, 0.3e12, 24 * GB, 25 * GB, 20e-6),
    # A nominal CPU "device" for tests and CPU runs of the real engine; order-of-magnitude only.
    "cpu": HardwareSpec("cpu", 1e12, 50 * GB, 64 * GB, 20 * GB, 20e-6, host_link="pcie-gen4-pinned"),
}


def model_names() -> list[str]:
    return sorted(MODELS)


def hardware_names() -> list[str]:
    return sorted(HARDWARE)


def link_names() -> list[str]:
    return sorted(LINKS)


def get_model(name_or_path: str, *, source: str | Path | None = None) -> ModelSpec:
    """A preset by name, or the geometry in a Hugging Face `config.json` (file or its directory).

    A relative path is taken relative to the folder of `source` (the file that names it) when
    `source` is given, else to the working directory.
    """
    if not isinstance(name_or_path, str) or not name_or_path:
        raise ConfigError("model must be a preset name or a config.json path", source=_text(source),
                          where="model", expected=f"one of {model_names()} or a path", found=name_or_path)
    if name_or_path in MODELS:
        return MODELS[name_or_path]
    path = _resolve(name_or_path, source)
    if _looks_like_path(name_or_path) or path.exists():
        from simcore.hf_config import load_hf_config

        return load_hf_config(path)
    raise ConfigError(
        "unknown model", source=_text(source), where="model",
        expected=f"one of {model_names()} or a path to a config.json", found=name_or_path, choices=MODELS,
    )


def get_hardware(name: str, *, source: str | Path | None = None) -> HardwareSpec:
    if name not in HARDWARE:
        raise ConfigError("unknown hardware", source=_text(source), where="hardware",
                          expected=f"one of {hardware_names()}", found=name, choices=HARDWARE)
    return HARDWARE[name]


def get_link(name: str, *, source: str | Path | None = None) -> LinkSpec:
    if name not in LINKS:
        raise ConfigError("unknown host link", source=_text(source), where="link",
                          expected=f"one of {link_names()}", found=name, choices=LINKS)
    return LINKS[name]


def _looks_like_path(text: str) -> bool:
    return "/" in text or "\\" in text or text.endswith(".json")


def _resolve(text: str, source: str | Path | None) -> Path:
    path = expand_home(text)
    if not path.is_absolute() and source is not None and Path(source).is_file():
        path = Path(source).parent / path
    return path


def _text(source: str | Path | None) -> str | None:
    return str(source) if source is not None else None
