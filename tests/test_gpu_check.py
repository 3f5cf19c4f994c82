"""benchmarks/gpu_check.py runs as the device runs it, in its CPU mode, and installs what is missing."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / "benchmarks" / "wheels"


def script():
    return importlib.import_module("benchmarks.gpu_check")


def _run(*args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "benchmarks/gpu_check.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_cpu_mode_runs_every_stage_and_writes_json_lines(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out, export = tmp_path / "gpu", tmp_path / "export"
    proc = _run("--tiny", "--device", "cpu", "--out", str(out), "--export", str(export))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    lines = _lines(out / "measurements.jsonl")
    assert _lines(export / "measurements.jsonl") == lines
    assert lines[0]["kind"] == "start" and lines[-1] == {**lines[-1], "kind": "end", "ok": True}
    times = [line["t_s"] for line in lines]
    assert times == sorted(times)
    stages = {line["stage"]: line for line in lines if line["kind"] == "stage"}
    assert all(s["ok"] for s in stages.values()), stages
    assert {"dependencies", "cuda tests", "engine eager", "transformers", "profile", "calibrate", "capacity"} <= set(stages)
    assert sum(name.startswith("validate ") for name in stages) == 3
    decode = [line for line in lines if line["kind"] == "decode"]
    assert {(d["engine"], d["batch"], d["context"]) for d in decode} == {
        (e, b, c) for e in ("servesim", "transformers") for b in (1, 8) for c in (64, 256)}
    assert all(d["step_s"] > 0 and d["x_roofline"] > 1 for d in decode)
    (burst,) = [line for line in lines if line["kind"] == "burst"]
    assert burst["output_tokens_per_s"] > 0 and burst["x_bound"] > 1 and burst["steps"] >= 3
    fidelity = [line for line in lines if line["kind"] == "fidelity"]
    assert len(fidelity) == 3 * 2 * 2 and {v["verdict"] for v in fidelity} <= {"ok", "MISS"}
    assert {p.name for p in export.iterdir()} == {"measurements.jsonl", "summary.json", "profile.csv", "calib.yaml",
                                                  "cuda_tests.log", "gpu_check.tar.gz"}
    assert "fidelity summary" in proc.stdout and "decode step" in proc.stdout


def test_deadline_stops_a_running_stage_and_skips_the_rest(tmp_path):
    out = tmp_path / "cut"
    proc = _run("--tiny", "--device", "cpu", "--out", str(out), "--deadline-s", "8", timeout=120)
    assert proc.returncode == 1
    lines = _lines(out / "measurements.jsonl")
    stages = {line["stage"]: line for line in lines if line["kind"] == "stage"}
    assert stages["dependencies"]["ok"]
    assert any(s.get("skipped") == "deadline" for s in stages.values())
    assert lines[-1]["kind"] == "end" and lines[-1]["seconds"] < 30


def test_every_pinned_requirement_has_its_wheel_and_the_readme_its_hash():
    readme = (WHEELS / "README.md").read_text()
    pins = {r for reqs in script().REQUIREMENTS.values() for r in reqs}
    names = {re.sub(r"[-_.]+", "-", w.name.split("-")[0]).lower(): w for w in WHEELS.glob("*.whl")}
    assert len(names) == len(pins)
    for pin in pins:
        name, version = pin.split("==")
        wheel = names[re.sub(r"[-_.]+", "-", name).lower()]
        assert wheel.name.split("-")[1] == version
        assert hashlib.sha256(wheel.read_bytes()).hexdigest() in readme, wheel.name
        assert wheel.name in readme


def test_a_missing_module_comes_from_the_committed_wheels(tmp_path, monkeypatch):
    gpu = script()
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    target = tmp_path / "site"
    got = gpu.ensure_dependencies({"simpy": ("simpy==4.1.2",)}, target=target, registry=False,
                                  is_missing=lambda m: True, log=lambda *_: None)
    assert got["source"] == "wheels (pip)" and got["missing"] == ["simpy"]
    assert sys.path[0] == str(target) and os.environ["PYTHONPATH"].split(os.pathsep)[0] == str(target)
    # A stage's subprocess sees the installed copy first.
    where = subprocess.run([sys.executable, "-c", "import simpy; print(simpy.__file__)"], capture_output=True,
                           text=True, env=dict(os.environ), check=True).stdout
    assert where.startswith(str(target))


def test_registry_first_then_wheels_then_unzipping(tmp_path, monkeypatch):
    gpu = script()
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "")
    calls = []
    monkeypatch.setattr(gpu, "_pip", lambda args, timeout: calls.append(args) or False)  # no pip, no network
    got = gpu.ensure_dependencies({"annotated_types": ("annotated-types==0.8.0",)}, target=tmp_path / "site",
                                  is_missing=lambda m: True, log=lambda *_: None)
    assert [("--no-index" in c) for c in calls] == [False, True]
    assert got["source"] == "wheels (unzipped)"
    assert (tmp_path / "site" / "annotated_types" / "__init__.py").exists()


def test_nothing_is_installed_when_nothing_is_missing(tmp_path):
    got = script().ensure_dependencies({"json": ("nothing==0",)}, target=tmp_path / "site", log=lambda *_: None)
    assert got == {"missing": [], "source": None} and not (tmp_path / "site").exists()


def test_stages_select_and_skip():
    selected = script().selected_stages
    assert selected("all") == set(script().STAGES)
    assert selected("prefill,fidelity") == {"prefill", "profile", "validate"}
    assert selected("all", "cuda-tests,engine,transformers") == {"prefill", "profile", "validate"}
    with pytest.raises(SystemExit, match="unknown stage"):
        selected("profile,nonsense")


def test_prefill_stage_alone_compares_first_calls_and_names_sdpa_kernels(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "prefill"
    proc = _run("--tiny", "--device", "cpu", "--out", str(out), "--stages", "prefill", timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    lines = _lines(out / "measurements.jsonl")
    stages = {line["stage"] for line in lines if line["kind"] == "stage"}
    assert stages == {"dependencies", "prefill"}
    summaries = [line for line in lines if line["kind"] == "prefill_first_call_summary"]
    assert {(s["form"], s["allow_cudnn"]) for s in summaries} == {
        (f, a) for f in ("fresh", "continued", "mixed") for a in (False, True)}
    assert all(s["first_median_s"] > 0 and s["repeat_median_s"] > 0 for s in summaries)
    choices = [line for line in lines if line["kind"] == "sdpa_choice"]
    assert len(choices) == 3 and all(c["engine (no cuDNN)"] != "CUDNN_ATTENTION" for c in choices)
    assert "prefill steps on new prompt shapes" in proc.stdout
