"""The Ray executor on a private local Ray instance gives the same files as the local executor."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.cli import main
from tests.test_sweep_run import TINY, tree, write_yaml

pytest.importorskip("ray")


def test_ray_matches_inline(tmp_path: Path):
    source = write_yaml(tmp_path, dict(TINY, sweep={"workload.arrivals.rate": [4.0, 16.0]}))
    assert main(["sweep", str(source), "--out", str(tmp_path / "ray"), "--executor", "ray", "--jobs", "2",
                 "--quiet"]) == 0
    assert main(["sweep", str(source), "--out", str(tmp_path / "inline"), "--quiet"]) == 0
    assert tree(tmp_path / "ray") == tree(tmp_path / "inline")

