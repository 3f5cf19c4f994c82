"""`servesim hardware`: the hardware and link presets (simcore/hardware.yaml), with their numbers."""

from __future__ import annotations

import argparse
import json

from experiments.table import TABLE_STYLES, format_table, title
from simcore.hardware import DATA_FILE, GIB, raw_links, raw_presets
from simcore.presets import HARDWARE, LINKS

HARDWARE_COLUMNS = (
    ("Hardware", "name", "{}"),
    ("Memory (GiB)", "memory_gib", "{:.1f}"),
    ("HBM (TB/s)", "hbm_tb_s", "{:g}"),
    ("BF16 (TFLOP/s)", "bf16_tflops", "{:g}"),
    ("FP8 (TFLOP/s)", "fp8_tflops", "{:g}"),
    ("INT8 (TOP/s)", "int8_tflops", "{:g}"),
    ("FP4 (TFLOP/s)", "fp4_tflops", "{:g}"),
    ("Interconnect", "interconnect", "{}"),
    ("All-reduce (GB/s)", "interconnect_gb_s", "{:g}"),
    ("Kernel floor (us)", "kernel_floor_us", "{:g}"),
    ("Host link", "host_link", "{}"),
)
LINK_COLUMNS = (
    ("Link", "name", "{}"),
    ("Bandwidth (GB/s, one way)", "bandwidth_gb_s", "{:g}"),
    ("Latency per copy (us)", "latency_us", "{:g}"),
    ("Latency per ring hop (us)", "hop_latency_us", "{:g}"),
    ("All-reduce bus bandwidth (GB/s)", "allreduce_bandwidth_gb_s", "{:g}"),
    ("Mesh, per peer (GB/s)", "peer_bandwidth_gb_s", "{:g}"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object: every preset's numbers with their sources")
    parser.add_argument("--table", choices=TABLE_STYLES, default="text", help="table style")


def hardware_rows() -> list[dict]:
    rows = []
    for name, hw in HARDWARE.items():
        rows.append({
            "name": name, "memory_gib": hw.memory_bytes / GIB, "memory_bytes": hw.memory_bytes,
            "hbm_tb_s": hw.mem_bandwidth / 1e12,
            **{f"{dtype}_tflops": None if hw.peak(dtype) is None else hw.peak(dtype) / 1e12  # type: ignore[operator]
               for dtype in ("bf16", "fp8", "int8", "fp4")},
            "interconnect": hw.interconnect or f"{hw.interconnect_bandwidth / 1e9:g} GB/s",
            "interconnect_gb_s": hw.interconnect_bandwidth / 1e9,
            "interconnect_hop_latency_us": hw.interconnect_latency_s * 1e6,
            "kernel_floor_us": hw.kernel_floor_s * 1e6,
            "host_link": hw.host_link, "description": hw.description,
        })
    return rows


def link_rows() -> list[dict]:
    return [{"name": name, "bandwidth_gb_s": link.bytes_per_s / 1e9, "latency_us": link.latency_s * 1e6,
             "hop_latency_us": link.hop_latency * 1e6, "allreduce_bandwidth_gb_s": link.allreduce_bandwidth / 1e9,
             "peer_bandwidth_gb_s": None if link.peer_bytes_per_s is None else link.peer_bytes_per_s / 1e9,
             "description": link.description}
            for name, link in LINKS.items()]


def run(args: argparse.Namespace) -> int:
    if args.json:
        # The numbers as the simulator uses them, and the data file's entries with their sources.
        print(json.dumps({"data_file": str(DATA_FILE), "hardware": hardware_rows(), "links": link_rows(),
                          "sources": {"hardware": raw_presets(), "links": raw_links()}}, indent=1))
        return 0
    style = args.table
    print(title("Hardware presets (dense peaks; memory as the device reports it)", style))
    print(format_table(hardware_rows(), HARDWARE_COLUMNS, style=style))
    print()
    print(title("Link presets (interconnects, host links, networks)", style))
    print(format_table(link_rows(), LINK_COLUMNS, style=style))
    if style == "text":
        print()
        print(f"Sources for every number: {DATA_FILE} (or `servesim hardware --json`). An experiment may give "
              "`hardware:` as a mapping of the same keys (docs/cost-models.md#hardware).")
    return 0
