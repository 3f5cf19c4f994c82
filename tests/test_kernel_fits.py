"""benchmarks/kernel_fits.py recovers a known kernel floor, stream rate and all-reduce bus
bandwidth from tables laid out as aiconfigurator's, and refuses a missing folder."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "kernel_fits.py"
_SPEC = importlib.util.spec_from_file_location("kernel_fits_benchmark", SCRIPT)
kernel_fits = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(kernel_fits)


def _gemms(floor_us: float, stream_bytes_per_s: float) -> pd.DataFrame:
    # bf16 GEMMs of 1-16 rows: floor + weight bytes / stream rate (milliseconds, as the tables).
    rows = [(m, n, k) for m in (1, 8, 16) for n in (512, 4096, 8192) for k in (1024, 4096, 8192, 16384)]
    table = pd.DataFrame(rows, columns=["m", "n", "k"]).assign(gemm_dtype="bfloat16")
    table["latency"] = (floor_us * 1e-6 + table["n"] * table["k"] * 2 / stream_bytes_per_s) * 1e3
    fp8 = table.assign(gemm_dtype="fp8", latency=table["latency"] * 3)  # not read: bf16 only
    return pd.concat([table, fp8], ignore_index=True)


def _allreduces(base_us: float, bus_bytes_per_s: float) -> pd.DataFrame:
    sizes = [2**p for p in range(7, 27)]
    rows = [(n, size, (base_us * 1e-6 + 2 * (n - 1) / n * size / bus_bytes_per_s) * 1e3)
            for n in (2, 4, 8) for size in sizes]
    table = pd.DataFrame(rows, columns=["num_gpus", "message_size", "latency"])
    return table.assign(op_name="all_reduce", nccl_dtype="half")


def test_fits_recover_the_numbers_the_tables_were_made_with(tmp_path, capsys):
    gemm = kernel_fits.gemm_fit(_gemms(4.0, 2.8e12))
    assert gemm["floor_us"] == pytest.approx(4.0, rel=1e-6)
    assert gemm["stream_gb_s"] == pytest.approx(2800, rel=1e-6)
    fits = kernel_fits.allreduce_fits(_allreduces(15.0, 150e9))
    assert sorted(fits) == [2, 4, 8]
    assert all(fit["bus_gb_s"] == pytest.approx(150, rel=1e-6) for fit in fits.values())
    # The script over a folder laid out as aiconfigurator's systems/data.
    gemm_dir = tmp_path / "h100_sxm" / "gemm" / "vllm" / "0.1"
    comm_dir = tmp_path / "h100_sxm" / "comm" / "nccl" / "2.0"
    gemm_dir.mkdir(parents=True)
    comm_dir.mkdir(parents=True)
    _gemms(4.0, 2.8e12).to_parquet(gemm_dir / "gemm_perf.parquet")
    _allreduces(15.0, 150e9).to_parquet(comm_dir / "nccl_perf.parquet")
    assert kernel_fits.main(["--data", str(tmp_path), "--gpus", "h100_sxm"]) == 0
    out = capsys.readouterr().out
    share = f"{2.8e12 / 3.35e12:.2f}"
    assert "vllm 0.1" in out and "4.00" in out and share in out
    assert np.isclose(float(out.split("nccl 2.0")[1].split()[1]), 150)


def test_a_missing_folder_is_a_clear_error(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--data", str(tmp_path / "nope")], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 2 and "not a folder" in done.stderr and "Traceback" not in done.stderr
