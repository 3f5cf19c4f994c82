"""The engine benchmark script runs end to end in its CPU-sized mode."""

from __future__ import annotations

import importlib
import json

import pytest

pytest.importorskip("torch")


def load_benchmark():
    return importlib.import_module("benchmarks.torch_engine")


def test_tiny_benchmark_writes_figures(tmp_path, capsys):
    bench = load_benchmark()
    out = tmp_path / "bench.json"
    assert bench.main(["--tiny", "--device", "cpu", "--reps", "1", "--burst-requests", "4", "--burst-outputs", "3",
                       "--out", str(out)]) == 0
    figures = json.loads(out.read_text())
    cases = [r["case"] for r in figures["results"]]
    assert len(cases) == 5 and cases[-1].startswith("burst 4 req")
    assert all(r["time_s"] > 0 and r["x_roofline"] > 0 for r in figures["results"])
    assert figures["results"][-1]["steps"] >= 3
    assert "x roofline" in capsys.readouterr().out


def test_block_allocator_reserves_whole_lifetimes():
    bench = load_benchmark()
    alloc = bench.BlockAllocator(10)
    assert alloc.can_reserve(10) and not alloc.can_reserve(11)
    alloc.reserve(6)
    assert not alloc.can_reserve(5)
    taken = [alloc.take() for _ in range(2)]
    alloc.give_back(taken, unused_reservation=4)
    assert alloc.can_reserve(10)
