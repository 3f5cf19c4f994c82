"""Same YAML + seed -> byte-identical results, across processes; every policy sees the same workload.

Each example under experiments/examples/ runs twice as `servesim run` in separate processes
(with different PYTHONHASHSEED, so nothing may depend on str hashing or set order) into different
folders at 30 requests; summary.json, requests.parquet and steps.parquet must match byte for byte.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from experiments.config import load_experiment
from tests.helpers import small_example
from workloads.spec import build_requests

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "experiments" / "examples").glob("*.yaml"))
# Each example at 30 requests (tests.helpers.small_example).
NUM_REQUESTS = 30


def servesim_run(path: Path, out: Path, hash_seed: str, *extra: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": hash_seed}
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.cli", "run", str(path), "--out", str(out), "--quiet",
         *(item for override in small_example(path, NUM_REQUESTS) for item in ("--set", override)), *extra],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr


def result_files(out: Path) -> list[Path]:
    files = [out / "summary.json"]
    for summary in json.loads((out / "summary.json").read_text()):
        folder = out / summary["label"]
        files += [folder / "summary.json", folder / "requests.parquet", folder / "steps.parquet"]
    return files


def test_every_example_is_covered():
    assert len(EXAMPLES) >= 4


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_rerun_gives_identical_bytes(path, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    servesim_run(path, first, "1")
    servesim_run(path, second, "2")
    files = result_files(first)
    assert len(files) >= 4
    for file in files:
        twin = second / file.relative_to(first)
        assert twin.exists(), twin
        assert file.read_bytes() == twin.read_bytes(), f"{file.relative_to(first)} differs between reruns"
    check_identical_workload(path, first)


def check_identical_workload(path: Path, out: Path) -> None:
    """Every policy's requests table holds the workload as built from the file: same ids, lengths, and
    arrivals (follow-up turns of closed-loop sessions arrive after their parent finishes, and
    closed-loop clients send requests as earlier ones come back, both depending on the policy, so
    only their lengths are compared)."""
    exp = load_experiment(path, small_example(path, NUM_REQUESTS))
    template = build_requests(exp.workload, seed=exp.seed, base_dir=path.parent, source=str(path))
    expected = pd.DataFrame({
        "request_id": [r.request_id for r in template],
        "prompt_len": [r.prompt_len for r in template],
        "output_len": [r.num_target_outputs for r in template],
    })
    fixed_arrivals = {r.request_id: r.arrival_s for r in template if r.parent_id is None and exp.clients is None}
    labels = [s["label"] for s in json.loads((out / "summary.json").read_text())]
    for label in labels:
        table = pd.read_parquet(out / label / "requests.parquet").sort_values("request_id").reset_index(drop=True)
        pd.testing.assert_frame_equal(table[list(expected.columns)], expected, check_dtype=False, obj=label)
        arrivals = table.set_index("request_id")["arrival_s"]
        for request_id, arrival in fixed_arrivals.items():
            assert arrivals[request_id] == arrival, f"{label}: request {request_id} arrival differs"


def test_seed_changes_the_workload(tmp_path):
    """The comparison above is not vacuous: another seed gives other bytes."""
    path = ROOT / "experiments" / "examples" / "quickstart.yaml"
    servesim_run(path, tmp_path / "a", "1")
    servesim_run(path, tmp_path / "b", "1", "--set", "seed=1")
    a = (tmp_path / "a" / "static" / "requests.parquet").read_bytes()
    b = (tmp_path / "b" / "static" / "requests.parquet").read_bytes()
    assert a != b
