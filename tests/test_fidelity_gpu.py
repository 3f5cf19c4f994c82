"""The one-command GPU fidelity script runs end to end in its CPU-sized mode."""

from __future__ import annotations

import importlib
import json

import pytest

pytest.importorskip("torch")


def test_tiny_cpu_run_does_every_stage(tmp_path, capsys):
    script = importlib.import_module("benchmarks.fidelity_gpu")
    out = tmp_path / "fid"
    # The CUDA tests only skip on a CPU; the rest runs as on the GPU, at toy sizes.
    exported = tmp_path / "export"
    assert script.main(["--tiny", "--device", "cpu", "--out", str(out), "--skip-pytest", "--export", str(exported)]) == 0
    assert {p.name for p in exported.iterdir()} == {"summary.json", "profile.csv", "calib.yaml", "torch_engine.json",
                                                    "fidelity_gpu.tar.gz"}
    summary = json.loads((out / "summary.json").read_text())
    assert all(stage["ok"] for stage in summary["stages"].values())
    assert {"engine benchmark", "profile", "calibrate", "capacity"} <= set(summary["stages"])
    assert [r["rate_name"] for r in summary["runs"]] == ["light", "near_saturation", "overloaded"]
    rates = [r["rate"] for r in summary["runs"]]
    assert rates == sorted(rates) and rates[0] > 0
    assert len(summary["verdicts"]) == 3 * 2 * 2
    assert {v["against"] for v in summary["verdicts"]} == {"profiled", "roofline"}
    assert all(v["verdict"] in ("ok", "MISS") for v in summary["verdicts"])
    for name in ("profile.csv", "calib.yaml", "torch_engine.json", "light/fidelity.json",
                 "overloaded/plots/step_scatter_chunked_prefill.png"):
        assert (out / name).exists(), name
    printed = capsys.readouterr().out
    assert "fidelity summary" in printed and "near_saturation" in printed
