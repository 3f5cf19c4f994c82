"""Every experiment file under experiments/examples/ runs as it is (at a small size)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.cli import main
from tests.helpers import small_example

EXAMPLES = sorted((Path(__file__).parent.parent / "experiments" / "examples").glob("*.yaml"))


def test_there_are_examples():
    assert len(EXAMPLES) >= 4


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(path, tmp_path, capsys):
    out = tmp_path / "out"
    sets = [item for override in small_example(path, 24) for item in ("--set", override)]
    code = main(["run", str(path), "--out", str(out), *sets, "--check", "--quiet"])
    assert code == 0
    summaries = json.loads((out / "summary.json").read_text())
    assert summaries and all(s["completed"] + s["num_rejected"] + s["num_unfinished"] == s["num_requests"]
                             for s in summaries)
    assert (out / "resolved.yaml").exists() and (out / "run_info.json").exists()
    for summary in summaries:
        assert (out / summary["label"] / "requests.parquet").exists()
        assert (out / summary["label"] / "steps.parquet").exists()
    printed = capsys.readouterr().out
    assert "Median TTFT (ms)" in printed


def test_step_records_stay_readable_after_the_results_are_written(tmp_path):
    from experiments.config import load_experiment
    from experiments.runner import run_experiment

    path = EXAMPLES[0].parent / "quickstart.yaml"
    run = run_experiment(load_experiment(path, ["workload.num_requests=12"]), source=path, out_dir=tmp_path)
    steps = run.runs[0].result.steps
    assert steps.spilled and len(steps.as_dict()["step_id"]) == len(steps)


def test_rows_a_trace_reader_drops_are_reported(tmp_path, capsys):
    trace = Path(__file__).parent / "data" / "burstgpt_sample.csv"
    experiment = tmp_path / "burst.yaml"
    experiment.write_text(
        "name: burst\nmodel: llama-3.1-8b\nhardware: h100-sxm\n"
        f"workload: {{trace: {{path: '{trace}', format: burstgpt}}}}\n"
        "policies: [{name: continuous}]\noutput: {plots: false}\n"
    )
    assert main(["run", str(experiment), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "note: workload: burstgpt_sample.csv: dropped" in err and "with 0 response tokens" in err
    info = json.loads((tmp_path / "out" / "run_info.json").read_text())
    assert info["workload_notes"]
