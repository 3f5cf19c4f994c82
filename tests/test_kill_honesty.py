"""kill -9 at a random moment: the folder then holds the previous complete results or the new ones.

`servesim run`, `sweep`, `capacity` and `export` each run as a subprocess into a folder that
holds the complete results of another configuration (with --overwrite where that is needed),
and are killed at a seeded random moment while they hold the folder. The reader's view
(experiments.report_load / report, the exported files) must then be the whole old result or
the whole new one: never old summaries over half-new tables, one plan's manifest with another
plan's dataset, or an incomplete folder. The next run into the folder must succeed (the killed
process's lock is gone with it) and leave no temporary file or hidden staging folder behind.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import yaml

from experiments.cli import main
from experiments.io import LOCK_FILE, SCRATCH_DIR
from experiments.report import report
from experiments.report_load import load_results, read_policy_table
from simcore.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
# Kill moments per command; each starts from a complete folder.
KILLS = 2
EXPERIMENT = {
    "name": "crash",
    "kv_cache": {"block_size": 16, "num_blocks": 256},
    "workload": {
        "num_requests": 60,
        "arrivals": {"kind": "poisson", "rate": 20.0},
        "prompt_len": {"kind": "uniform", "low": 16, "high": 256},
        "output_len": {"kind": "uniform", "low": 4, "high": 64},
    },
    "cost_model": {"name": "constant", "step_s": 0.01, "per_token_s": 0.0001},
    "policies": [{"name": "continuous"}, {"name": "chunked_prefill", "chunk_size": 64}],
    "output": {"plots": False},
}


def write_experiment(folder: Path, name: str, **changes) -> Path:  # noqa: ANN003
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**EXPERIMENT, **changes}, sort_keys=False))
    return path


def kill_at_random_moment(args: list[str], out: Path, rng: random.Random, window_s: float) -> None:
    """Start `servesim ARGS`, wait until it holds `out` (its pid in the lock file: from then on it
    writes), then SIGKILL it after a random part of `window_s`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-m", "experiments.cli", *quiet(args)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while _holder(out) != proc.pid:
            if proc.poll() is not None:
                return  # finished before the kill: the folder is simply complete
            assert time.monotonic() < deadline, "the command never took the folder"
            time.sleep(0.001)
        time.sleep(rng.uniform(0, window_s))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _holder(out: Path) -> int | None:
    try:
        text = (out / LOCK_FILE).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def quiet(args: list[str]) -> list[str]:
    return args if args[0] == "export" else [*args, "--quiet"]  # export prints only its file names


def timed(args: list[str]) -> float:
    started = time.perf_counter()
    assert main(quiet(args)) == 0
    return time.perf_counter() - started


def assert_tidy(out: Path) -> None:
    """After a finished run: no lock, scratch folder, temporary file or staging folder is left."""
    assert not (out / LOCK_FILE).exists() and not (out / SCRATCH_DIR).exists()
    assert not [p for p in out.rglob("*") if p.name.endswith((".tmp", ".partial"))]
    assert sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")) == []


def assert_marked_incomplete(error: ConfigError) -> None:
    text = str(error)
    assert "incomplete" in text or "sweep.parquet is missing" in text, text


# --- servesim run ----------------------------------------------------------------------------


def read_run(out: Path) -> list[dict] | None:
    """The summaries a reader gets from a run folder, checked against the files beside them;
    None when the folder says it is incomplete."""
    try:
        load_results(out)
    except ConfigError as error:
        assert_marked_incomplete(error)
        return None
    summaries = json.loads((out / "summary.json").read_text())
    seeds = {yaml.safe_load((out / "resolved.yaml").read_text())["seed"],
             json.loads((out / "run_info.json").read_text())["seed"]}
    assert len(seeds) == 1, f"resolved.yaml and run_info.json are of different runs: {seeds}"
    for row in summaries:
        folder = out / row["label"]
        assert json.loads((folder / "summary.json").read_text()) == row
        requests = read_policy_table(folder, "requests")
        assert len(requests) == row["num_requests"]
        assert math.isclose(1000 * requests["ttft_s"].mean(), row["mean_ttft_ms"], rel_tol=1e-9)
        assert len(read_policy_table(folder, "steps")) == row["num_steps"]
    return summaries


def test_killed_run_leaves_the_previous_or_the_new_folder(tmp_path: Path):
    rng = random.Random(20240601)
    out = tmp_path / "out"
    window = timed(["run", str(write_experiment(tmp_path, "seed0")), "--out", str(out)])
    before = read_run(out)
    assert before is not None
    for kill in range(1, KILLS + 1):
        source = str(write_experiment(tmp_path, f"seed{kill}", seed=kill))
        args = ["run", source, "--out", str(out), "--overwrite"]
        kill_at_random_moment(args, out, rng, window)
        seen = read_run(out)
        assert main([*args, "--quiet"]) == 0  # the dead process's lock is gone
        after = read_run(out)
        assert after is not None and after != before
        assert seen in (before, after)
        assert_tidy(out)
        before = after


# --- servesim sweep ----------------------------------------------------------------------------


def read_sweep(out: Path) -> set[str] | None:
    """The point ids a reader gets from a sweep folder, each row checked against its DONE.json and
    the manifest beside the dataset; None when the folder says it is incomplete."""
    try:
        results = load_results(out)
    except ConfigError as error:
        assert_marked_incomplete(error)
        return None
    manifest = json.loads((out / "sweep.json").read_text())
    planned = {p["point_id"] for p in manifest["points"]}
    frame = results.summaries
    assert set(frame["point_id"]) <= planned, "the dataset holds points of another plan"
    for point_id, rows in frame.groupby("point_id"):
        done = json.loads((out / "points" / point_id / "DONE.json").read_text())
        assert rows["label"].tolist() == [s["label"] for s in done["summaries"]]
        assert rows["mean_ttft_ms"].tolist() == [s["mean_ttft_ms"] for s in done["summaries"]]
    # What the dataset lacks of the plan, the report says is not run yet.
    missing = len(planned - set(frame["point_id"]))
    if missing:
        assert f"not run yet: {missing} of {len(planned)} points" in report(out)
    return set(frame["point_id"])


def test_killed_sweep_leaves_the_previous_or_the_new_folder(tmp_path: Path):
    rng = random.Random(20240602)
    out = tmp_path / "out"
    window = timed(["sweep", str(write_experiment(tmp_path, "plan0", sweep={"seed": [0, 1, 2]})), "--out", str(out)])
    before = read_sweep(out)
    for kill in range(1, KILLS + 1):
        seeds = [3 * kill, 3 * kill + 1, 3 * kill + 2]
        source = str(write_experiment(tmp_path, f"plan{kill}", sweep={"seed": seeds}))
        # Another plan: built beside the folder (resumed there after the kill) and swapped in whole.
        args = ["sweep", source, "--out", str(out), "--overwrite"]
        kill_at_random_moment(args, out, rng, window)
        seen = read_sweep(out)
        assert main([*args, "--quiet"]) == 0
        after = read_sweep(out)
        assert after is not None and len(after) == 3 and after != before
        assert seen in (before, after)
        assert len(pd.read_parquet(out / "sweep.parquet")) == 3 * len(EXPERIMENT["policies"])
        assert_tidy(out)
        before = after


# --- servesim capacity -------------------------------------------------------------------------


def read_capacity(out: Path) -> dict | None:
    try:
        text = report(out)
    except ConfigError as error:
        assert_marked_incomplete(error)
        return None
    result = json.loads((out / "capacity.json").read_text())
    assert all(s["label"] in text for s in result["series"])
    return result


def test_killed_capacity_search_leaves_the_previous_or_the_new_folder(tmp_path: Path):
    rng = random.Random(20240603)
    out = tmp_path / "out"
    # Two rounds of one policy's probes (2 and 64 req/s, then 33): a short search.
    flags = ["--out", str(out), "--low", "2", "--high", "64", "--tol", "32"]
    source = str(write_experiment(tmp_path, "exp", policies=[{"name": "continuous"}]))
    window = timed(["capacity", source, "--slo", "ttft_p90_ms=300", *flags])
    before = read_capacity(out)
    assert before is not None
    for kill in range(1, KILLS + 1):
        # A new seed: new probes to run (the finished ones of the same configuration are reused).
        args = ["capacity", source, "--slo", f"ttft_p90_ms={300 + 100 * kill}", "--set", f"seed={kill}", *flags]
        kill_at_random_moment(args, out, rng, window)
        seen = read_capacity(out)
        assert main([*args, "--quiet"]) == 0
        after = read_capacity(out)
        assert after is not None and after != before
        assert seen in (before, after)
        assert_tidy(out)
        before = after


# --- servesim export ---------------------------------------------------------------------------


def read_export(folder: Path) -> dict[str, str]:
    """label -> date of the exported files, each checked whole (its per-request lists as long as
    its num_prompts); all of one export (one date)."""
    dates = {}
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        assert len(data["input_lens"]) == len(data["ttfts"]) == data["num_prompts"]
        dates[path.stem] = data["date"]
    assert len(set(dates.values())) <= 1, dates
    return dates


def test_killed_export_leaves_the_previous_or_the_new_files(tmp_path: Path, monkeypatch):
    rng = random.Random(20240604)
    out = tmp_path / "out"
    assert main(["run", str(write_experiment(tmp_path, "exp")), "--out", str(out), "--quiet"]) == 0
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")
    window = timed(["export", "--vllm", str(out), "--policy", "continuous"])
    before = read_export(out / "vllm")
    for kill in range(1, KILLS + 1):
        # Both policies now, dated otherwise: a mix would show two dates or one policy's file.
        monkeypatch.setenv("SOURCE_DATE_EPOCH", str(86400 * kill))
        args = ["export", "--vllm", str(out), *(["--policy", "continuous"] if kill % 2 == 0 else [])]
        kill_at_random_moment(args, out, rng, window)
        seen = read_export(out / "vllm")
        assert main(args) == 0
        after = read_export(out / "vllm")
        assert after != before
        assert seen in (before, after)
        assert_tidy(out)
        before = after
