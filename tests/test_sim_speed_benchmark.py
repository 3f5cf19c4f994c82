"""benchmarks/sim_speed.py in a small mode: it runs, and reports figures that add up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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


def test_sim_speed_with_a_profiled_table(tmp_path):
    rows = _run(tmp_path, "--policies", "continuous", "--profile-table", str(TABLE))
    assert len(rows) == 1 and rows[0]["completed"] + rows[0]["rejected"] == 300
