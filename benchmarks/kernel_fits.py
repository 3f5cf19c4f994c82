"""The kernel floors and all-reduce bus bandwidths in simcore/hardware.yaml, fitted again from
NVIDIA aiconfigurator's kernel measurements.

The data is not in this repository: give the `systems/data` folder of an aiconfigurator checkout
(github.com/ai-dynamo/aiconfigurator; the numbers in the data file come from commit 095f58a5,
`aic-core/src/aiconfigurator_core/systems/data`).

    python benchmarks/kernel_fits.py --data ~/aiconfigurator/aic-core/src/aiconfigurator_core/systems/data
    python benchmarks/kernel_fits.py --data DIR --gpus h100_sxm a100_sxm

For each GPU folder, engine and version:

- GEMMs (`gemm/<engine>/<version>/gemm_perf.parquet`, bf16): the least-squares line of time
  against weight bytes over the GEMMs of at most 16 rows and 300 MB of weights. Its intercept
  is the kernel floor (`kernel_floor_us`); its slope, against the part's HBM bandwidth, the share
  of it a weight stream reaches. And the median time of those under 2 MB of weights.
- All-reduces (`comm/nccl/<version>/nccl_perf.parquet` and `comm/<engine>/<version>/
  custom_allreduce_perf.parquet`, bf16): per GPU count n, the line of time against
  2 (n - 1) / n x bytes over 1-16 MB; the inverse slope is the bus bandwidth
  (`allreduce_bandwidth_gb_s`), beside the median time of messages up to 16 KB.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

# HBM bandwidth (TB/s) of the GPU folders, as simcore/hardware.yaml gives it.
HBM_TB_S = {"a100_sxm": 2.039, "h100_sxm": 3.35, "h200_sxm": 4.8, "b200_sxm": 8.0, "l40s": 0.864}
BF16 = ("bfloat16", "float16", "half")
MB = 1e6


def gemm_fit(table: pd.DataFrame) -> dict | None:
    """Floor (us), bytes' share of the bandwidth line (GB/s) and the small GEMMs' median (us)."""
    rows = table[table["gemm_dtype"].isin(BF16) & (table["m"] <= 16)]
    weight_mb = rows["n"] * rows["k"] * 2 / MB
    keep = weight_mb <= 300
    rows, weight_mb = rows[keep], weight_mb[keep]
    if len(rows) < 20:
        return None
    times_us = rows["latency"].to_numpy() * 1e3  # the tables give milliseconds
    slope, intercept = np.polyfit(weight_mb.to_numpy(), times_us, 1)
    return {"floor_us": float(intercept), "stream_gb_s": float(1e3 / slope),
            "small_median_us": _median(times_us[weight_mb.to_numpy() < 2])}


def _median(values: np.ndarray) -> float:
    return float(np.median(values)) if values.size else float("nan")


def allreduce_fits(table: pd.DataFrame) -> dict[int, dict]:
    """Per GPU count: bus bandwidth (GB/s) over 1-16 MB and the small messages' median (us)."""
    if "op_name" in table:
        table = table[table["op_name"] == "all_reduce"]
    dtype = next(column for column in table.columns if column.endswith("dtype"))
    table = table[table[dtype].isin(BF16)]
    fits = {}
    for num_gpus, rows in table.groupby("num_gpus"):
        mid = rows[(rows["message_size"] >= 2**20) & (rows["message_size"] <= 16 * 2**20)]
        if len(mid) < 3:
            continue
        ring = 2 * (num_gpus - 1) / num_gpus
        slope, _ = np.polyfit(ring * mid["message_size"].to_numpy(), mid["latency"].to_numpy() * 1e3, 1)
        small = rows[rows["message_size"] <= 16384]["latency"].to_numpy() * 1e3
        fits[int(num_gpus)] = {"bus_gb_s": float(1e-3 / slope), "small_median_us": _median(small)}
    return fits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="aiconfigurator's systems/data folder")
    parser.add_argument("--gpus", nargs="+", default=sorted(HBM_TB_S), help="GPU folders to read")
    args = parser.parse_args(argv)
    if not args.data.is_dir():
        print(f"kernel_fits.py: --data {args.data}: not a folder", file=sys.stderr)
        return 2
    print(f"{'gpu':<10} {'source':<34} {'floor us':>9} {'stream':>7} {'small us':>9}")
    for gpu in args.gpus:
        for path in sorted((args.data / gpu).glob("gemm/*/*/gemm_perf.parquet")):
            fit = gemm_fit(pd.read_parquet(path))
            if fit is not None:
                share = fit["stream_gb_s"] / (HBM_TB_S[gpu] * 1e3) if gpu in HBM_TB_S else float("nan")
                print(f"{gpu:<10} {path.parent.parent.name + ' ' + path.parent.name:<34} "
                      f"{fit['floor_us']:>9.2f} {share:>7.2f} {fit['small_median_us']:>9.2f}")
    print()
    print(f"{'gpu':<10} {'source':<34} {'GPUs':>4} {'bus GB/s':>9} {'small us':>9}")
    for gpu in args.gpus:
        paths = [*sorted((args.data / gpu).glob("comm/nccl/*/nccl_perf.parquet")),
                 *sorted((args.data / gpu).glob("comm/*/*/custom_allreduce_perf.parquet"))]
        for path in paths:
            for num_gpus, fit in allreduce_fits(pd.read_parquet(path)).items():
                print(f"{gpu:<10} {path.parent.parent.name + ' ' + path.parent.name:<34} {num_gpus:>4} "
                      f"{fit['bus_gb_s']:>9.0f} {fit['small_median_us']:>9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
