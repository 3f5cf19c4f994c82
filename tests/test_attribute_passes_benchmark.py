"""benchmarks/attribute_passes.py: the comparison behind reading the batch in comprehensions."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_attribute_passes_compares_equal_columns():
    """It runs, each way giving the same column (it asserts so), a row per batch size."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "attribute_passes.py"), "--number", "20"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120, env={"PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    rows = [line.split()[0] for line in done.stdout.splitlines()[2:]]
    assert rows == ["8", "24", "64", "128"]
