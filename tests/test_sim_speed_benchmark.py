"""benchmarks/sim_speed.py in a small mode: it runs, and reports figures that add up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "sim_speed.py"
TABLE = ROOT / "tests" / "data" / "profiles" / "cpu-tiny-llama.csv"


def _run(tmp_path: Path, *extra: str) -> list[dict]:
    out = tmp_path / "rows.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--sizes", "300", "--json", str(out), *extra],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())


def test_sim_speed_reports_each_policy(tmp_path):
    rows = _run(tmp_path)
    assert [r["policy"] for r in rows] == ["continuous", "chunked_prefill"]
    for row in rows:
        assert row["size"] == 300 and row["completed"] + row["rejected"] == 300
        assert 0 < row["events"] < row["steps"] + row["size"]  # a run of steps is one event
        assert 0 < row["simulate_s"] <= row["wall_s"] and row["peak_mib"] > 0
        # One process's CPU time cannot exceed its wall time by more than its other threads'
        # (pyarrow's writers): a bound, not a timing.
        assert 0 < row["cpu_s"] < 4 * row["wall_s"]
        assert row["steal_s"] is None or row["steal_s"] >= 0


def test_sim_speed_with_a_profiled_table(tmp_path):
    rows = _run(tmp_path, "--policies", "continuous", "--profile-table", str(TABLE))
    assert len(rows) == 1 and rows[0]["completed"] + rows[0]["rejected"] == 300


def test_sim_speed_repeats_each_case(tmp_path):
    """--repeat: the best of the runs, their median, and every run's wall time; the counts agree.
    (--no-compile: the bytecode as found.)"""
    rows = _run(tmp_path, "--policies", "continuous", "--repeat", "3", "--no-compile")
    (row,) = rows
    assert len(row["wall_s_runs"]) == 3
    assert row["wall_s"] == min(row["wall_s_runs"]) <= row["median_wall_s"] <= max(row["wall_s_runs"])
    assert 0 < row["simulate_s"] <= row["wall_s"]


def test_sim_speed_runs_that_disagree_are_refused(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    import sim_speed

    run = {"size": 10, "policy": "continuous", "wall_s": 1.0, "simulate_s": 0.5, "sim_time_s": 3.0, "steps": 7,
           "events": 4, "peak_mib": 100.0, "completed": 10, "rejected": 0, "cpu_s": 0.7, "steal_s": 0.25}
    row = sim_speed.summarize_runs([run, {**run, "wall_s": 0.8, "cpu_s": 0.75, "steal_s": 0.0}])
    # The best wall time, the stolen time of that run, the least CPU time of any.
    assert (row["wall_s"], row["steal_s"], row["cpu_s"]) == (0.8, 0.0, 0.7)
    with pytest.raises(SystemExit, match="disagree on steps"):
        sim_speed.summarize_runs([run, {**run, "steps": 8}])


def test_stolen_time_from_the_machines_counters(monkeypatch):
    """Steal is the eighth counter of /proc/stat's cpu line, in clock ticks."""
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    import sim_speed

    ticks = sim_speed.os.sysconf("SC_CLK_TCK")
    before = [100, 0, 50, 900, 0, 0, 0, 10, 0, 0]
    after = [200, 0, 60, 950, 0, 0, 0, 10 + 3 * ticks, 0, 0]
    assert sim_speed.stolen_seconds(before, after) == 3.0
    assert sim_speed.stolen_seconds(None, after) is None and sim_speed.stolen_seconds(before, before[:7]) is None
    reading = sim_speed.machine_times()
    assert reading is None or (len(reading) >= 8 and all(value >= 0 for value in reading))


def test_sim_speed_side_by_side_stepping_and_a_queue_order(tmp_path):
    """Two trees (here the same one twice), each case also stepped, under priority order: the
    same counts every way (stepping changes only how the steps are taken)."""
    rows = _run(tmp_path, "--policies", "continuous", "--trees", str(ROOT), str(ROOT), "--stepping",
                "--queue-order", "priority")
    assert len(rows) == 4 and {row["stepping"] for row in rows} == {False, True}
    assert {row["queue_order"] for row in rows} == {"priority"}
    assert len({(row["steps"], row["sim_time_s"], row["completed"]) for row in rows}) == 1
    fast = [row for row in rows if not row["stepping"]]
    assert all(row["events"] < stepped["events"] for row in fast for stepped in rows if stepped["stepping"])
