"""`servesim capacity` on a timed trace: it searches the trace's mean arrival rate by itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.capacity_search import RATE_PATH, TRACE_RATE_PATH, build_series, choose_param, trace_rate
from experiments.cli import main
from simcore.errors import ConfigError
from tests.test_sweep_run import write_yaml


def _trace_experiment(folder: Path, **trace_options) -> dict:
    rows = ["arrival_s,prompt_len,output_len"] + [f"{0.5 * i},{64 + 8 * (i % 5)},{4 + i % 3}" for i in range(24)]
    (folder / "trace.csv").write_text("\n".join(rows) + "\n")
    return {
        "name": "trace_capacity",
        "workload": {"trace": {"path": "trace.csv", "format": "csv", **trace_options}},
        "policies": [{"name": "continuous"}],
        "output": {"plots": False},
    }


def test_the_rate_searched_follows_the_workload(tmp_path: Path):
    assert choose_param({"workload": {"arrivals": {"kind": "poisson", "rate": 2}}}, source=None) == RATE_PATH
    assert choose_param(_trace_experiment(tmp_path), source=None) == TRACE_RATE_PATH
    with pytest.raises(ConfigError, match="request rate"):
        choose_param({"workload": {"trace": {"path": "x.json", "format": "sharegpt"}}}, source=None)
    with pytest.raises(ConfigError, match="time_scale"):
        build_series(_trace_experiment(tmp_path), source=None, param="workload.trace.time_scale")


def test_a_trace_time_scale_gives_way_to_the_searched_rate(tmp_path: Path):
    notes: list[str] = []
    series = build_series(_trace_experiment(tmp_path, time_scale=3.0), source=str(tmp_path / "exp.yaml"),
                          param=TRACE_RATE_PATH, notes=notes)
    trace = series[0].data["workload"]["trace"]
    assert "time_scale" not in trace and "target_rate" in trace
    assert notes == ["the trace's time_scale is replaced by the searched target_rate"]


def test_capacity_on_a_trace_needs_no_extra_flags(tmp_path: Path, capsys):
    source = write_yaml(tmp_path, _trace_experiment(tmp_path))
    out = tmp_path / "cap"
    assert main(["capacity", str(source), "--slo", "ttft_p90_ms=12", "--low", "1", "--high", "400", "--tol", "8",
                 "--out", str(out), "--quiet"]) == 0
    result = json.loads((out / "capacity.json").read_text())
    assert result["param"] == TRACE_RATE_PATH
    (series,) = result["series"]
    assert series["status"] == "ok", series
    probes = {p["rate"]: p for p in series["probes"]}
    assert probes[series["max_rate"]]["passed"] and not probes[series["first_failing_rate"]]["passed"]
    assert probes[series["max_rate"]]["p90_ttft_ms"] <= 12


def test_the_trace_own_rate_is_named_as_a_reference(tmp_path: Path, capsys):
    data = _trace_experiment(tmp_path)
    source = str(write_yaml(tmp_path, data))
    (series,) = build_series(data, source=source, param=TRACE_RATE_PATH)
    assert trace_rate(series.data, source=source) == pytest.approx(2.0)  # 24 rows, 0.5 s apart
    assert main(["capacity", source, "--slo", "ttft_p90_ms=1000", "--low", "4", "--high", "8", "--tol", "4",
                 "--out", str(tmp_path / "cap")]) == 0
    assert "the trace's own mean rate is 2 req/s (outside; set --low/--high around it" in capsys.readouterr().err
