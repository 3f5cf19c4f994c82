"""`servesim report`: tables for a run folder and a sweep folder, and clear errors for anything else."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.cli import main
from tests.test_sweep_run import TINY, write_yaml


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("report")
    source = write_yaml(root, dict(TINY, sweep={"workload.arrivals.rate": [4.0, 16.0]},
                                   variants={"base": {}, "small-blocks": {"kv_cache.block_size": 8}}))
    assert main(["sweep", str(source), "--out", str(root / "sweep"), "--quiet"]) == 0
    assert main(["run", str(source), "--out", str(root / "run"), "--quiet"]) == 0
    return {"run": root / "run", "sweep": root / "sweep"}


def test_run_report(folders, capsys):
    assert main(["report", str(folders["run"])]) == 0
    out = capsys.readouterr().out
    assert "P90 TTFT (ms)" in out and "continuous" in out and "chunked_prefill" in out
    assert "Mean queue (ms)" in out and "Mean prefill (ms)" in out and "Request goodput (req/s)" in out
    assert max(map(len, out.splitlines()[1:])) <= 100  # all but the title line fit a terminal


def test_run_report_as_csv_and_markdown(folders, capsys):
    import csv

    assert main(["report", str(folders["run"]), "--table", "csv"]) == 0
    tables = capsys.readouterr().out.split("\n\n")
    rows = list(csv.DictReader(tables[1].splitlines()))
    assert [row["Policy"] for row in rows] == ["continuous", "chunked_prefill"]
    assert all(float(row["Request throughput (req/s)"]) > 0 for row in rows)
    assert main(["report", str(folders["run"]), "--table", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "| Policy | Successful requests |" in out and "| continuous |" in out


def test_run_prints_its_summary_as_csv(tmp_path: Path, capsys):
    import csv

    source = write_yaml(tmp_path, TINY)
    assert main(["run", str(source), "--out", str(tmp_path / "run"), "--quiet", "--table", "csv"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = list(csv.DictReader(out[:-1]))  # the last line names the results folder
    assert [row["Policy"] for row in rows] == ["continuous", "chunked_prefill"]
    assert all(int(row["Successful requests"]) > 0 for row in rows)


def test_sweep_report_has_axes_variants_and_best(folders, capsys):
    assert main(["report", str(folders["sweep"])]) == 0
    out = capsys.readouterr().out
    assert "4 finished points" in out
    header = next(line for line in out.splitlines() if line.startswith("point"))
    assert header.split()[:4] == ["point", "variant", "rate", "Policy"]
    assert "small-blocks" in out and "Best point per policy" in out
    assert max(map(len, out.splitlines()[1:])) <= 100


def test_report_errors_are_user_errors(tmp_path: Path, capsys):
    assert main(["report", str(tmp_path / "nothing")]) == 2
    assert "results folder not found" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "not a results folder" in capsys.readouterr().err
