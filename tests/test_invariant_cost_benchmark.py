"""benchmarks/invariant_cost.py in a small mode: every configuration runs, and stepping and
checking take the paths they name (the same requests finish either way)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_invariant_cost_runs_every_configuration():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "invariant_cost.py"), "--reps", "1",
                           "--set", "workload.num_requests=12"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = {parts[0]: parts[1:] for parts in map(str.split, done.stdout.splitlines())
            if len(parts) > 1 and parts[1] != "/"}  # (not the ratios: "checked / plain = ...")
    for config in ("plain", "checked", "stepwise", "stepwise-checked"):
        assert float(rows[config][0]) > 0, config
    assert "checked / plain" in done.stdout


def test_stepwise_takes_every_step_alone():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import invariant_cost
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    from experiments import runner

    seen = []
    original = runner.simulate_cluster

    def spy(requests, replicas, **kwargs):
        result = original(requests, replicas, **kwargs)
        seen.extend((replica.accelerator is None, run.num_events, len(run.steps))
                    for replica, run in zip(replicas, result.replicas))
        return result

    runner.simulate_cluster = spy
    try:
        invariant_cost.run_once(invariant_cost.QUICKSTART, ["workload.num_requests=12"], "stepwise")
        stepwise, seen[:] = list(seen), []
        invariant_cost.run_once(invariant_cost.QUICKSTART, ["workload.num_requests=12"], "plain")
    finally:
        runner.simulate_cluster = original
    assert all(no_accelerator and events == steps for no_accelerator, events, steps in stepwise)
    assert any(events < steps for _, events, steps in seen)
