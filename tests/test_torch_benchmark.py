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


def test_burst_reports_its_own_bound(tmp_path):
    bench = load_benchmark()
    from simcore.presets import get_model

    spec = get_model("llama-3.1-8b")
    # Two requests of 100 prompt tokens, 3 outputs: the prompts' FLOPs at peak, then 2 decode steps.
    bound = bench.burst_bound(spec, 2, [100, 100], 3)
    prefill = 2 * bench.step_flops(spec, 100, 100 * 101 // 2) / bench.PEAK_FLOPS
    decode = (bench.step_bytes(spec, 2, 202) + bench.step_bytes(spec, 2, 204)) / bench.HBM_BYTES_PER_S
    assert bound == pytest.approx(prefill + decode)


def test_tiny_comparison_with_transformers(tmp_path, capsys):
    pytest.importorskip("transformers")
    bench = load_benchmark()
    out = tmp_path / "vs.json"
    assert bench.main(["--vs-transformers", "--tiny", "--repeats", "1", "--batches", "1,3", "--out", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert [r["batch"] for r in figures["results"]] == [1, 3]
    for row in figures["results"]:
        assert set(row["ratio"]) == {"prefill", "decode_step", "end_to_end"}
        assert all(v > 0 for v in row["ratio"].values())
        assert row["tokens_equal"] == 1.0  # the same checkpoint, fp32, greedy: the same tokens
    assert figures["meta"]["shape"]["hidden"] == 64
    assert "x decode" in capsys.readouterr().out
