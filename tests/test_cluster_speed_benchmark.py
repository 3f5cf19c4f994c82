"""benchmarks/cluster_speed.py in a small mode: it runs every case and prints rows that add up."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_cluster_speed_runs_each_case():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cluster_speed.py"), "--replicas", "4",
                           "--requests-per-replica", "50", "--routers", "round_robin", "least_kv"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = {line[:32].strip(): line[32:].split() for line in done.stdout.splitlines()[1:]}
    assert list(rows) == ["one engine", "4 x round_robin", "4 x least_kv", "1P:3D round_robin"]
    assert rows["one engine"][1] == rows["one engine"][3] == "1.00"  # wall and CPU time over its own
    for name, (wall, _, cpu, _, finished, steps) in rows.items():
        assert float(wall) > 0 and float(cpu) > 0 and int(steps) > 0
        assert int(finished) == (50 if name == "one engine" else 200)
