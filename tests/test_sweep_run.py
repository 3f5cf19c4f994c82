"""`servesim sweep` end to end: results layout, dataset, resume, failures and --jobs independence."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from experiments.cli import main

TINY = {
    "name": "tiny",
    "workload": {
        "num_requests": 12,
        "arrivals": {"kind": "poisson", "rate": 8.0},
        "prompt_len": {"kind": "uniform", "low": 32, "high": 256},
        "output_len": {"kind": "uniform", "low": 2, "high": 16},
    },
    "policies": [{"name": "continuous"}, {"name": "chunked_prefill", "chunk_size": 64}],
    "metrics": {"slo": {"ttft_ms": 50, "tpot_ms": 20}},
    "output": {"plots": False},
    "sweep": {"policy.max_num_seqs": [2, 8], "workload.arrivals.rate": [4.0, 16.0]},
}


def write_yaml(folder: Path, data: dict, name: str = "exp.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("sweep")
    assert main(["sweep", str(write_yaml(folder, TINY)), "--out", str(folder / "out"), "--quiet"]) == 0
    return folder / "out"


def test_layout_and_dataset(swept: Path):
    manifest = json.loads((swept / "sweep.json").read_text())
    assert manifest["keys"] == ["policy.max_num_seqs", "workload.arrivals.rate"]
    assert len(manifest["points"]) == 4
    for point in manifest["points"]:
        folder = swept / "points" / point["point_id"]
        done = json.loads((folder / "DONE.json").read_text())
        assert [s["label"] for s in done["summaries"]] == ["continuous", "chunked_prefill"]
        for name in ("resolved.yaml", "run_info.json", "summary.json", "continuous/requests.parquet",
                     "chunked_prefill/steps.parquet"):
            assert (folder / name).is_file(), name
        assert yaml.safe_load((folder / "resolved.yaml").read_text())["sweep"] is None
    frame = pd.read_parquet(swept / "sweep.parquet")
    assert len(frame) == 8
    assert list(frame.columns[:7]) == ["point_index", "point_id", "variant", "policy.max_num_seqs",
                                       "workload.arrivals.rate", "label", "policy"]
    for metric in ("median_ttft_ms", "p90_ttft_ms", "p99_tpot_ms", "request_goodput", "output_throughput"):
        assert metric in frame.columns
    assert frame["point_index"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert frame["workload.arrivals.rate"].tolist() == [4.0, 4.0, 16.0, 16.0] * 2
    assert (frame["completed"] == 12).all()


def test_rerun_skips_finished_points(swept: Path, capsys):
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in (swept / "points").rglob("DONE.json")}
    source = swept.parent / "exp.yaml"
    assert main(["sweep", str(source), "--out", str(swept), "--quiet"]) == 0
    assert "4 points were already finished" in capsys.readouterr().err
    after = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in (swept / "points").rglob("DONE.json")}
    assert after == before


def test_jobs_do_not_change_a_byte(swept: Path, tmp_path: Path):
    source = swept.parent / "exp.yaml"
    assert main(["sweep", str(source), "--out", str(tmp_path / "j2"), "--jobs", "2", "--quiet"]) == 0
    assert tree(tmp_path / "j2") == tree(swept)


def test_a_failing_point_is_reported_and_retried(tmp_path: Path, capsys):
    data = dict(TINY, sweep={"hardware": ["h100-sxm", "no-such-gpu"]})
    source = write_yaml(tmp_path, data)
    out = tmp_path / "out"
    assert main(["sweep", str(source), "--out", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "1 of 2 points failed" in err and "no-such-gpu" in err
    ok, bad = json.loads((out / "sweep.json").read_text())["points"]
    assert (out / "points" / ok["point_id"] / "DONE.json").is_file()
    error = json.loads((out / "points" / bad["point_id"] / "ERROR.json").read_text())
    assert "no-such-gpu" in error["error"] and not (out / "points" / bad["point_id"] / "DONE.json").exists()
    assert len(pd.read_parquet(out / "sweep.parquet")) == 2
    assert main(["report", str(out)]) == 0
    assert f"failed: {bad['point_id']}" in capsys.readouterr().out
    # A re-run retries only the failed point (and fails again: the value is still wrong).
    assert main(["sweep", str(source), "--out", str(out), "--quiet"]) == 1
    assert "1 points were already finished" in capsys.readouterr().err


def test_structured_and_missing_values_fit_one_parquet_column(tmp_path: Path):
    arrivals = [{"kind": "poisson", "rate": 4.0}, {"kind": "gamma", "rate": 4.0, "cv": 3.0}]
    source = write_yaml(tmp_path, dict(TINY, sweep={"mode": "zip", "workload.arrivals": arrivals,
                                                    "kv_cache.num_blocks": [None, 4000]}))
    assert main(["sweep", str(source), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    frame = pd.read_parquet(tmp_path / "out" / "sweep.parquet")
    assert json.loads(frame["workload.arrivals"].iloc[2]) == arrivals[1]
    assert frame["kv_cache.num_blocks"].isna().tolist() == [True, True, False, False]


def test_dry_run_lists_points(tmp_path: Path, capsys):
    source = write_yaml(tmp_path, TINY)
    assert main(["sweep", str(source), "--dry-run"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4 and lines[0].startswith("0000-") and "workload.arrivals.rate=4.0" in lines[0]


def test_bad_sweep_key_is_a_user_error(tmp_path: Path, capsys):
    source = write_yaml(tmp_path, dict(TINY, sweep={"policy.max_num_sqs": [1]}))
    assert main(["sweep", str(source), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert str(source) in err and "policy.max_num_sqs" in err and "Traceback" not in err


def test_example_sweep_runs_small(tmp_path: Path):
    example = Path(__file__).parent.parent / "experiments" / "examples" / "sweep_batch_chunk.yaml"
    out = tmp_path / "out"
    assert main(["sweep", str(example), "--out", str(out), "--quiet", "--set", "workload.num_requests=20"]) == 0
    frame = pd.read_parquet(out / "sweep.parquet")
    assert set(frame["label"]) == {"continuous", "chunked_prefill"}
    assert len(frame) == 2 * frame["point_id"].nunique() and frame["point_id"].nunique() >= 4
    assert (frame["completed"] == 20).all()


SLOW = {
    "name": "slow",
    "workload": {
        "num_requests": 300,
        "arrivals": {"kind": "poisson", "rate": 40.0},
        "prompt_len": {"kind": "uniform", "low": 32, "high": 1024},
        "output_len": {"kind": "uniform", "low": 16, "high": 256},
    },
    "policies": [{"name": "chunked_prefill", "chunk_size": 128}],
    "output": {"plots": False},
    "sweep": {"seed": [0, 1, 2, 3, 4, 5, 6, 7]},
}


def test_resume_after_sigkill_loses_and_repeats_nothing(tmp_path: Path):
    import os
    import signal
    import subprocess
    import sys
    import time

    source = write_yaml(tmp_path, SLOW)
    out = tmp_path / "out"
    root = Path(__file__).parent.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen([sys.executable, "-m", "experiments.cli", "sweep", str(source), "--out", str(out),
                             "--quiet"], cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not list(out.glob("points/*/DONE.json")):
            assert proc.poll() is None, "the sweep ended before it could be killed"
            assert time.monotonic() < deadline, "no point finished within 60 s"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    finished = {p.parent.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.glob("points/*/DONE.json")}
    assert 1 <= len(finished) < 8, "kill the sweep part-way"
    assert main(["sweep", str(source), "--out", str(out), "--quiet"]) == 0
    after = {p.parent.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.glob("points/*/DONE.json")}
    assert len(after) == 8
    assert {k: after[k] for k in finished} == finished  # no finished point was run again
    frame = pd.read_parquet(out / "sweep.parquet")
    assert len(frame) == 8 and frame["point_id"].is_unique and sorted(frame["seed"]) == list(range(8))
    assert not list(out.rglob("*.tmp")), "an interrupted atomic write left a temporary file"
    # The resumed sweep equals one run straight through.
    assert main(["sweep", str(source), "--out", str(tmp_path / "straight"), "--quiet"]) == 0
    assert tree(tmp_path / "straight" / "points") == tree(out / "points")


def test_missing_ray_is_a_clear_error(monkeypatch, tmp_path: Path, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` fail
    source = write_yaml(tmp_path, dict(TINY, sweep={"workload.arrivals.rate": [4.0]}))
    assert main(["sweep", str(source), "--out", str(tmp_path / "out"), "--executor", "ray", "--quiet"]) == 2
    assert "pip install -e '.[ray]'" in capsys.readouterr().err
