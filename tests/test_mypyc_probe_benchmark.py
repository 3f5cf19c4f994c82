"""benchmarks/mypyc_probe.py: its case runs the reference workload from a tree and says which
modules it imported compiled, its output check finds a difference, and it refuses what it cannot
measure. (Compiling takes mypy, which the project does not install: not run here.)"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "mypyc_probe.py"
sys.path.insert(0, str(ROOT / "benchmarks"))

import mypyc_probe  # noqa: E402


def _probe(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_a_case_from_the_source_tree_imports_nothing_compiled(tmp_path):
    done = _probe("--case", str(ROOT), str(tmp_path), "200", "chunked_prefill", json.dumps(mypyc_probe.DEFAULT_MODULES))
    assert done.returncode == 0, done.stderr
    case = json.loads(done.stdout.strip().splitlines()[-1])
    assert case["compiled"] == 0 and 0 < case["loop_s"] <= case["wall_s"]
    assert (tmp_path / "chunked_prefill" / "requests.parquet").is_file()


def test_the_output_check_finds_a_changed_or_missing_file(tmp_path):
    done = _probe("--case", str(ROOT), str(tmp_path / "a"), "100", "continuous", "[]")
    assert done.returncode == 0, done.stderr
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    assert mypyc_probe.same_outputs(tmp_path / "a", tmp_path / "b") == []
    summary = tmp_path / "b" / "continuous" / "summary.json"
    summary.write_text(summary.read_text().replace("1", "2", 1))
    (tmp_path / "b" / "continuous" / "steps.parquet").unlink()
    assert mypyc_probe.same_outputs(tmp_path / "a", tmp_path / "b") == ["continuous/steps.parquet",
                                                                       "continuous/summary.json"]


def test_refuses_a_module_outside_the_packages():
    done = _probe("--modules", "policies/no_such_module.py")
    assert done.returncode == 2 and "--modules policies/no_such_module.py" in done.stderr
    done = _probe("--modules", "setup.cfg")
    assert done.returncode == 2 and "expected a .py file of the tree's packages" in done.stderr


def test_refuses_to_keep_the_copy_in_a_folder_that_exists(tmp_path):
    done = _probe("--keep", str(tmp_path))
    assert done.returncode == 2 and f"--keep {tmp_path}: already exists" in done.stderr


@pytest.mark.skipif(importlib.util.find_spec("mypyc") is not None, reason="mypyc is installed here")
def test_says_how_to_get_mypyc():
    done = _probe()
    assert done.returncode == 2 and "pip install mypy" in done.stderr
