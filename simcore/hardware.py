"""Accelerators and links: the data file (simcore/hardware.yaml), its checks, and hardware an
experiment gives as a mapping.

A hardware mapping (in the data file, or an experiment's `hardware:`) has these keys; a number
may be plain or `{value: N, source: "..."}` (the data file always gives the source):

    name: my-gpu                  # an experiment's mapping only (the data file's key names it)
    base: h100-sxm                # optional: start from a preset and change the keys given
    description: free text
    memory_mib: 81559             # as nvidia-smi reports it; or memory_gib / memory_gb (1e9)
    hbm_bandwidth_tb_s: 3.35      # 1e12 bytes/s
    peak_tflops: {bf16: 989, fp8: 1979, int8: 1979, fp4: ...}   # dense; bf16 required
    interconnect: nvlink-4        # a link preset, or {bandwidth_gb_s, latency_us, hop_latency_us,
                                  #   allreduce_bandwidth_gb_s, peer_bandwidth_gb_s}
    host_link: pcie-gen5-pinned   # a link preset, for swaps
    kernel_floor_us: 3.85         # optional: a kernel's fixed time (0 where not given)
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

from simcore.errors import ConfigError
from simcore.precision import PEAK_DTYPES, PEAK_OF_DTYPE, WIDER_PEAK

GB = 10**9  # vendors' decimal gigabyte
MIB = 2**20
GIB = 2**30
DATA_FILE = Path(__file__).with_name("hardware.yaml")

HARDWARE_KEYS = ("name", "base", "description", "memory_mib", "memory_gib", "memory_gb", "hbm_bandwidth_tb_s",
                 "peak_tflops", "interconnect", "host_link", "kernel_floor_us")
MEMORY_KEYS = {"memory_mib": MIB, "memory_gib": GIB, "memory_gb": GB}
LINK_KEYS = ("description", "bandwidth_gb_s", "latency_us", "hop_latency_us", "allreduce_bandwidth_gb_s",
             "peer_bandwidth_gb_s")


@dataclass(frozen=True)
class LinkSpec:
    """A copy path (host<->device, or between devices or machines): sustained bytes per second
    one way, a fixed cost per copy, and the cost of one step of a ring collective over it."""

    name: str
    bytes_per_s: float
    latency_s: float
    # One step of a ring collective (NCCL's per-hop latency); None: latency_s.
    hop_latency_s: float | None = None
    description: str = ""
    # The bus bandwidth a ring all-reduce reaches over the link at a serving step's sizes (1-16
    # MB), measured; None: bytes_per_s.
    allreduce_bytes_per_s: float | None = None
    # A fully connected mesh's usable bytes/s to each peer (no switch: a collective over n GPUs
    # has n - 1 links a GPU); None: a switched link, the same for any n.
    peer_bytes_per_s: float | None = None

    @property
    def hop_latency(self) -> float:
        return self.latency_s if self.hop_latency_s is None else self.hop_latency_s

    @property
    def allreduce_bandwidth(self) -> float:
        """Bytes/s one way that a ring all-reduce's payload term divides by."""
        return self.bytes_per_s if self.allreduce_bytes_per_s is None else self.allreduce_bytes_per_s


def mesh_bandwidth(bandwidth: float, peer_bytes_per_s: float | None, num_gpus: int) -> float:
    """`bandwidth`, capped on a fully connected mesh at num_gpus - 1 links of peer_bytes_per_s."""
    if peer_bytes_per_s is None:
        return bandwidth
    return min(bandwidth, max(num_gpus - 1, 1) * peer_bytes_per_s)


@dataclass(frozen=True)
class HardwareSpec:
    """One accelerator as the roofline sees it."""

    name: str
    # Dense bf16 tensor-core peak, FLOP/s (also the fp16 and fp32 peak the roofline uses).
    peak_flops: float
    # Device memory bandwidth, bytes/s.
    mem_bandwidth: float
    # Device memory capacity as the device reports it, bytes.
    memory_bytes: int
    # Per-GPU one-way bandwidth seen by a tensor-parallel ring all-reduce, bytes/s.
    interconnect_bandwidth: float
    # One step (hop) of a ring collective over the interconnect, seconds.
    interconnect_latency_s: float
    # The host link a cost model uses for swaps when the user names none.
    host_link: str = "pcie-gen4-pinned"
    # Dense 8-bit and 4-bit tensor-core peaks, FLOP/s (OP/s for int8); None where the part has none.
    peak_flops_fp8: float | None = None
    peak_flops_int8: float | None = None
    peak_flops_fp4: float | None = None
    # The link preset the interconnect numbers come from (None: given as numbers).
    interconnect: str | None = None
    description: str = ""
    # Fixed time of one kernel, seconds: what a small GEMM takes beyond its bytes at the
    # bandwidth it streams them (the intercept of time against weight bytes).
    kernel_floor_s: float = 0.0
    # The interconnect's usable bytes/s to each peer where it is a fully connected mesh (None: switched).
    interconnect_peer_bandwidth: float | None = None

    def peak(self, dtype: str) -> float | None:
        """The dense peak for one of PEAK_DTYPES, or None where the part has none."""
        return {"bf16": self.peak_flops, "fp8": self.peak_flops_fp8, "int8": self.peak_flops_int8,
                "fp4": self.peak_flops_fp4}[dtype]

    def compute_peak(self, activation_dtype: str) -> tuple[str, float]:
        """(peak name, FLOP/s) a GEMM with activations of this dtype runs at: its own peak, or the
        next wider one the part has (simcore.precision)."""
        if activation_dtype not in PEAK_OF_DTYPE:
            raise ValueError(f"activation_dtype: expected one of {sorted(PEAK_OF_DTYPE)}, found {activation_dtype!r}")
        name = PEAK_OF_DTYPE[activation_dtype]
        while self.peak(name) is None:
            name = WIDER_PEAK[name]
        return name, float(self.peak(name))  # type: ignore[arg-type]


# --- the data file ----------------------------------------------------------------------------


@functools.cache
def _data() -> dict[str, Any]:
    with DATA_FILE.open(encoding="utf-8") as stream:
        data = yaml.safe_load(stream)
    if not isinstance(data, dict) or not isinstance(data.get("links"), dict) or not isinstance(data.get("hardware"), dict):
        raise ConfigError("expected a mapping with `links` and `hardware`", source=str(DATA_FILE))
    return data


def raw_presets() -> dict[str, Any]:
    """The data file's `hardware` mapping, as written (sources included)."""
    return _data()["hardware"]


def raw_links() -> dict[str, Any]:
    """The data file's `links` mapping, as written (sources included)."""
    return _data()["links"]


@functools.cache
def load_links() -> dict[str, LinkSpec]:
    return {name: link_from_mapping(entry, name=name, source=str(DATA_FILE), where=f"links.{name}")
            for name, entry in raw_links().items()}


@functools.cache
def load_presets() -> dict[str, HardwareSpec]:
    return {name: hardware_from_mapping(entry, name=name, source=str(DATA_FILE), where=f"hardware.{name}",
                                        links=load_links())
            for name, entry in raw_presets().items()}


# --- checks -------------------------------------------------------------------------------------


def number(entry: dict, key: str, *, source: str | None, where: str, required: bool = True,
           allow_zero: bool = False) -> float | None:
    """entry[key] as a positive (or, with allow_zero, non-negative) finite number, plain or
    {value, source}; a clear ConfigError naming `where.key` otherwise."""
    place = f"{where}.{key}"
    if key not in entry or entry[key] is None:
        if required:
            raise ConfigError("missing field", source=source, where=place, expected="a number")
        return None
    value = entry[key]
    if isinstance(value, dict):
        extra = set(value) - {"value", "source"}
        if "value" not in value or extra:
            raise ConfigError("a sourced number is {value: N, source: \"...\"}", source=source, where=place,
                              expected="keys value and source", found=sorted(map(str, value)))
        value = value["value"]
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    try:
        # (A whole number past the float range is refused, not an OverflowError.)
        ok = ok and math.isfinite(value) and math.isfinite(_scaled(float(value), 12))
    except OverflowError:
        ok = False
    if not ok or (value < 0 if allow_zero else value <= 0):
        expected = ("a non-negative number" if allow_zero else "a positive number") + " (finite, below 1e290)"
        raise ConfigError("invalid value", source=source, where=place, expected=expected, found=value)
    return float(value)


def _scaled(value: float, exponent: int) -> float:
    """value x 10**exponent rounded once from the decimal written (2.039 TB/s is 2.039e12 exactly
    as the literal, where 2.039 * 1e12 is off by one unit in the last place)."""
    return float(Decimal(repr(value)).scaleb(exponent))


def _mapping(value: Any, *, source: str | None, where: str, keys: tuple[str, ...]) -> dict:
    if not isinstance(value, dict):
        raise ConfigError("expected a mapping", source=source, where=where, expected=f"a mapping of {list(keys)}",
                          found=value)
    for key in value:
        if key not in keys:
            raise ConfigError("unknown field", source=source, where=f"{where}.{key}", expected=f"one of {list(keys)}",
                              found=str(key), choices=keys)
    return value


def link_from_mapping(entry: Any, *, name: str, source: str | None, where: str) -> LinkSpec:
    entry = _mapping(entry, source=source, where=where, keys=LINK_KEYS)
    bandwidth = number(entry, "bandwidth_gb_s", source=source, where=where)
    latency = number(entry, "latency_us", source=source, where=where, allow_zero=True)
    hop = number(entry, "hop_latency_us", source=source, where=where, required=False, allow_zero=True)
    allreduce = number(entry, "allreduce_bandwidth_gb_s", source=source, where=where, required=False)
    peer = number(entry, "peer_bandwidth_gb_s", source=source, where=where, required=False)
    return LinkSpec(name, _scaled(bandwidth, 9), _scaled(latency, -6),  # type: ignore[arg-type]
                    None if hop is None else _scaled(hop, -6), str(entry.get("description", "")),
                    None if allreduce is None else _scaled(allreduce, 9), None if peer is None else _scaled(peer, 9))


def _link_name(value: Any, links: dict[str, LinkSpec], *, source: str | None, where: str) -> LinkSpec:
    if not isinstance(value, str) or value not in links:
        raise ConfigError("unknown link", source=source, where=where, expected=f"one of {sorted(links)}",
                          found=value, choices=links)
    return links[value]


def hardware_from_mapping(entry: Any, *, name: str | None = None, source: str | None = None, where: str = "hardware",
                          links: dict[str, LinkSpec] | None = None) -> HardwareSpec:
    """A HardwareSpec from a mapping (module docstring), every field checked: a missing or bad
    one is a ConfigError naming `source` and the field."""
    links = load_links() if links is None else links
    entry = _mapping(entry, source=source, where=where, keys=HARDWARE_KEYS)
    if "base" in entry:
        known = raw_presets()
        base = entry["base"]
        if not isinstance(base, str) or base not in known:
            raise ConfigError("unknown hardware preset", source=source, where=f"{where}.base",
                              expected=f"one of {sorted(known)}", found=base, choices=known)
        base_entry = dict(known[base])
        given = {k: v for k, v in entry.items() if k != "base"}
        if any(k in MEMORY_KEYS for k in given):  # a memory given replaces the base's, whatever its unit
            base_entry = {k: v for k, v in base_entry.items() if k not in MEMORY_KEYS}
        if isinstance(given.get("peak_tflops"), dict) and isinstance(base_entry.get("peak_tflops"), dict):
            given["peak_tflops"] = {**base_entry["peak_tflops"], **given["peak_tflops"]}
        entry = {**base_entry, "name": entry.get("name", base), **given}
    if name is None:
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigError("missing field" if name is None else "invalid value", source=source,
                              where=f"{where}.name", expected="a name for the hardware (a string)", found=name)
    memories = [key for key in MEMORY_KEYS if key in entry]
    if len(memories) != 1:
        raise ConfigError("missing field" if not memories else "give the memory once", source=source,
                          where=f"{where}.memory_mib", expected="one of memory_mib, memory_gib or memory_gb",
                          found=memories or None)
    # Whole MiB/GiB/GB counts are exact integers of bytes; a fractional one is rounded down.
    memory = number(entry, memories[0], source=source, where=where)
    memory_bytes = int(_scaled(memory, 9)) if memories[0] == "memory_gb" else int(memory * MEMORY_KEYS[memories[0]])
    bandwidth = number(entry, "hbm_bandwidth_tb_s", source=source, where=where)
    if "peak_tflops" not in entry:
        raise ConfigError("missing field", source=source, where=f"{where}.peak_tflops",
                          expected="a mapping of dense TFLOP/s per dtype, bf16 at least")
    peaks_entry = _mapping(entry["peak_tflops"], source=source, where=f"{where}.peak_tflops", keys=PEAK_DTYPES)
    peaks = {dtype: number(peaks_entry, dtype, source=source, where=f"{where}.peak_tflops", required=dtype == "bf16")
             for dtype in PEAK_DTYPES}
    interconnect = entry.get("interconnect")
    if interconnect is None:
        raise ConfigError("missing field", source=source, where=f"{where}.interconnect",
                          expected=f"a link preset ({', '.join(sorted(links))}) or {{bandwidth_gb_s, latency_us}}")
    if isinstance(interconnect, dict):
        link = link_from_mapping(interconnect, name=f"{name}-interconnect", source=source, where=f"{where}.interconnect")
        link_name = None
    else:
        link = _link_name(interconnect, links, source=source, where=f"{where}.interconnect")
        link_name = link.name
    host_link = entry.get("host_link", "pcie-gen4-pinned")
    _link_name(host_link, links, source=source, where=f"{where}.host_link")
    description = entry.get("description", "")
    kernel_floor = number(entry, "kernel_floor_us", source=source, where=where, required=False, allow_zero=True)
    return HardwareSpec(
        name=name, peak_flops=_scaled(peaks["bf16"], 12), mem_bandwidth=_scaled(bandwidth, 12),  # type: ignore[arg-type]
        memory_bytes=memory_bytes, interconnect_bandwidth=link.allreduce_bandwidth,
        interconnect_latency_s=link.hop_latency,
        host_link=host_link,
        **{f"peak_flops_{d}": (None if peaks[d] is None else _scaled(peaks[d], 12)) for d in ("fp8", "int8", "fp4")},
        interconnect=link_name, description=str(description),
        kernel_floor_s=0.0 if kernel_floor is None else _scaled(kernel_floor, -6),
        interconnect_peer_bandwidth=link.peer_bytes_per_s,
    )
