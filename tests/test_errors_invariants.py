"""Runs that end early still account for every request; the invariant checker runs and bites."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from backends.constant import ConstantCostModel
from experiments.cli import main
from experiments.config import load_experiment
from experiments.runner import run_experiment
from policies.registry import make_policy
from simcore.cluster import simulate
from simcore.engine import RunLimits
from tests.helpers import req

QUICKSTART = Path(__file__).resolve().parent.parent / "experiments" / "examples" / "quickstart.yaml"


def test_quickstart_runs_with_invariant_checks():
    exp = load_experiment(QUICKSTART, ["workload.num_requests=30", "limits.check_invariants=true"])
    assert exp.limits.check_invariants
    run = run_experiment(exp, source=QUICKSTART)
    for policy_run in run.runs:
        assert policy_run.summary["completed"] == 30, policy_run.label


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_invariant_checker_catches_corrupted_accounting(prefix_caching):
    policy = make_policy("continuous", num_blocks=64, block_size=4, prefix_caching=prefix_caching)
    steps = {"n": 0}

    def corrupt(now: float) -> None:
        steps["n"] += 1
        if steps["n"] == 3:
            request = policy.running[0]
            policy.bm.append(request.request_id, 1)  # one more position stored than processed

    requests = [req(i, 0.0, 8, 6) for i in range(4)]
    with pytest.raises(AssertionError, match="stores"):
        simulate(requests, policy, ConstantCostModel(), limits=RunLimits(check_invariants=True), on_step=corrupt)


OVERLOAD = ["workload.num_requests=300", "workload.arrivals={kind: poisson, rate: 1000}",
            "limits.max_sim_time_s=0.05", "output.plots=false"]


def test_overload_stopped_by_sim_time_accounts_for_every_request(tmp_path, capsys):
    out = tmp_path / "out"
    args = [arg for item in OVERLOAD for arg in ("--set", item)]
    assert main(["run", str(QUICKSTART), "--out", str(out), *args]) == 0
    err = capsys.readouterr().err
    summaries = json.loads((out / "summary.json").read_text())
    assert len(summaries) == 3
    for summary in summaries:
        label = summary["label"]
        assert summary["end_reason"] == "max_sim_time"
        assert summary["num_requests"] == 300
        assert summary["completed"] + summary["num_rejected"] + summary["num_unfinished"] == 300
        assert summary["num_unfinished"] > 0
        assert f"note: {label} stopped at max_sim_time with {summary['num_unfinished']} requests unfinished" in err
        table = pd.read_parquet(out / label / "requests.parquet")
        assert sorted(table["request_id"]) == list(range(300))
        counts = table["status"].value_counts().to_dict()
        assert counts.get("finished", 0) == summary["completed"]
        assert counts.get("unfinished", 0) == summary["num_unfinished"]
        assert set(counts) <= {"finished", "rejected", "unfinished"}
        # Requests that had not arrived by the horizon are unfinished too, with their arrival times.
        late = table[table["arrival_s"] > 0.05]
        assert len(late) and (late["status"] == "unfinished").all()


def test_wall_time_limit_ends_cleanly():
    exp = load_experiment(QUICKSTART, ["workload.num_requests=300", "limits.max_wall_time_s=0.001",
                                       "output.plots=false"])
    run = run_experiment(exp, source=QUICKSTART)
    for policy_run in run.runs:
        summary = policy_run.summary
        assert summary["end_reason"] in ("max_wall_time", "done")
        assert summary["completed"] + summary["num_rejected"] + summary["num_unfinished"] == 300
        assert sorted(policy_run.requests["request_id"]) == list(range(300))
