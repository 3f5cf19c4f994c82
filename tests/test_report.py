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
    assert "TTFT p90" in out and "continuous" in out and "chunked_prefill" in out
    assert "queue" in out and "prefill" in out and "goodput" in out


def test_sweep_report_has_axes_variants_and_best(folders, capsys):
    assert main(["report", str(folders["sweep"])]) == 0
    out = capsys.readouterr().out
    assert "4 finished points" in out
    header = next(line for line in out.splitlines() if line.startswith("point"))
    assert header.split()[:4] == ["point", "variant", "rate", "policy"]
    assert "small-blocks" in out and "Best point per policy" in out


def test_report_errors_are_user_errors(tmp_path: Path, capsys):
    assert main(["report", str(tmp_path / "nothing")]) == 2
    assert "results folder not found" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "not a results folder" in capsys.readouterr().err
