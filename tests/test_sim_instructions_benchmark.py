"""benchmarks/sim_instructions.py: its cases switch off only what they say, and it refuses what
it cannot measure. (Counting under valgrind takes a minute a case: not run here.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "sim_instructions.py"


def _case(without: str, mode: str = "run") -> dict | None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--case", str(ROOT), "200", "chunked_prefill", without, mode],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_part_switched_off_changes_nothing_else():
    full, no_steps, no_itl = _case("-"), _case("step_log"), _case("itl")
    assert full["completed"] > 0 and full["steps_written"] and full["itl_samples"] > 0
    assert not no_steps["steps_written"] and no_steps["itl_samples"] == full["itl_samples"]
    assert no_itl["itl_samples"] == 0 and no_itl["steps_written"]
    for other in (no_steps, no_itl):
        assert (other["completed"], other["p50_ttft_ms"]) == (full["completed"], full["p50_ttft_ms"])


def test_setup_stops_before_the_simulation():
    assert _case("-", "setup") is None


def test_refuses_a_folder_that_is_not_a_source_tree(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--trees", str(tmp_path)], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert done.returncode == 2 and "not a servesim source tree" in done.stderr and str(tmp_path) in done.stderr


def test_refuses_to_run_without_valgrind(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, cwd=ROOT, timeout=60,
                          env={"PATH": str(tmp_path)})
    assert done.returncode == 2 and "valgrind is not on the PATH" in done.stderr

