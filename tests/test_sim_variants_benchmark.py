"""benchmarks/sim_variants.py in a small mode: each variant it names runs and is reported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "sim_variants.py"


def test_sim_variants_reports_each_variant():
    names = ["chunked-seats16", "mixed-seats16", "chunked-1000-blocks"]
    done = subprocess.run([sys.executable, str(SCRIPT), "--size", "300", "--variants", *names],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()[2:]]
    assert [row[0] for row in rows] == names
    for _, wall, events, steps, completed in rows:
        assert float(wall) > 0 and 0 < int(events) < int(steps) + 300  # a run of steps is one event
        assert 0 < int(completed) <= 300
