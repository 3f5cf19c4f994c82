"""The capacity search: SLO parsing, and a bisection whose answer passes while a bit more fails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.capacity_search import meets, parse_slo
from experiments.cli import main
from simcore.errors import ConfigError
from tests.test_sweep_run import TINY, write_yaml


def test_parse_slo_accepts_both_orders():
    assert parse_slo("ttft_p90_ms=500, tpot_p90_ms=50") == {"p90_ttft_ms": 500.0, "p90_tpot_ms": 50.0}
    assert parse_slo("p99_e2el_ms=2000,median_itl_ms=8") == {"p99_e2el_ms": 2000.0, "median_itl_ms": 8.0}


@pytest.mark.parametrize(("text", "pattern"), [
    ("ttft_p91_ms=5", "unknown SLO metric"), ("ttfx_p90_ms=5", "unknown SLO metric"),
    ("ttft_p90_ms=fast", "a number"), ("ttft_p90_ms=-1", "positive"), ("", "at least one SLO"),
])
def test_parse_slo_errors(text, pattern):
    with pytest.raises(ConfigError, match=pattern):
        parse_slo(text)


def test_meets_needs_every_request_finished():
    summary = {"completed": 10, "num_requests": 10, "p90_ttft_ms": 90.0}
    assert meets(summary, {"p90_ttft_ms": 100})
    assert not meets(summary, {"p90_ttft_ms": 80})
    assert not meets(dict(summary, completed=9), {"p90_ttft_ms": 100})
    assert not meets(dict(summary, p90_ttft_ms=None), {"p90_ttft_ms": 100})
    # A request rejected as it arrived is rejected at any rate; one rejected later is overload.
    assert meets(dict(summary, completed=9, num_rejected=1, num_rejected_on_arrival=1), {"p90_ttft_ms": 100})
    assert not meets(dict(summary, completed=9, num_rejected=1, num_rejected_on_arrival=0), {"p90_ttft_ms": 100})


def test_search_brackets_the_capacity(tmp_path: Path, capsys):
    data = dict(TINY, sweep=None, workload=dict(TINY["workload"], num_requests=30))
    source = write_yaml(tmp_path, data)
    out = tmp_path / "cap"
    args = ["capacity", str(source), "--slo", "ttft_p90_ms=40", "--low", "0.5", "--high", "400", "--tol", "2",
            "--out", str(out), "--quiet"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "continuous" in printed and "chunked_prefill" in printed and "Max rate" in printed and "Fails at" in printed
    result = json.loads((out / "capacity.json").read_text())
    for series in result["series"]:
        assert series["status"] == "ok", series
        probes = {p["rate"]: p for p in series["probes"]}
        best, fail = probes[series["max_rate"]], probes[series["first_failing_rate"]]
        assert best["passed"] and best["p90_ttft_ms"] <= 40
        assert not fail["passed"] and 0 < fail["rate"] - best["rate"] <= 2
    assert (out / "capacity.png").is_file() and (out / "capacity.svg").is_file()
    # Resumed: every probe is already stored, and the answer is the same.
    assert main(args) == 0
    assert json.loads((out / "capacity.json").read_text()) == result


def test_search_reports_when_high_is_not_high_enough(tmp_path: Path, capsys):
    data = dict(TINY, sweep=None)
    source = write_yaml(tmp_path, data)
    assert main(["capacity", str(source), "--slo", "ttft_p99_ms=100000", "--low", "1", "--high", "2",
                 "--out", str(tmp_path / "cap"), "--quiet"]) == 0
    assert "raise --high" in capsys.readouterr().out
    result = json.loads((tmp_path / "cap" / "capacity.json").read_text())
    assert {s["status"] for s in result["series"]} == {"at-high"}


def test_search_over_closed_loop_concurrency(tmp_path: Path, capsys):
    """With closed-loop clients the search varies their number: whole numbers, one apart at the end."""
    data = dict(TINY, sweep=None, workload=dict(TINY["workload"], num_requests=30), clients={"concurrency": 4})
    source = write_yaml(tmp_path, data)
    out = tmp_path / "cap"
    assert main(["capacity", str(source), "--slo", "ttft_p90_ms=40", "--high", "64", "--out", str(out),
                 "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "concurrency" in printed and "(clients)" in printed and "req/s" not in printed
    result = json.loads((out / "capacity.json").read_text())
    assert result["param"] == "clients.concurrency" and (result["low"], result["high"]) == (1, 64)
    for series in result["series"]:
        assert all(p["rate"] == int(p["rate"]) for p in series["probes"])
        if series["status"] == "ok":
            assert series["first_failing_rate"] - series["max_rate"] == 1
    assert main(["capacity", str(source), "--slo", "ttft_p90_ms=40", "--low", "0.5", "--out", str(out),
                 "--quiet"]) == 2
    assert "a whole number of clients" in capsys.readouterr().err
