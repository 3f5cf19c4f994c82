"""The Ray executor on a private local Ray instance gives the same files as the local executor."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from experiments import sweep_exec
from experiments.cli import main
from tests.test_output_safety import descendants, listening_addresses
from tests.test_sweep_run import TINY, tree, write_yaml

pytest.importorskip("ray")


def test_ray_matches_inline(tmp_path: Path, monkeypatch):
    # While the private instance is up (just before it is shut down), every socket its processes
    # listen on is a loopback one: nothing outside this machine can reach it.
    listening: list[str] = []
    close = sweep_exec.RayExecutor.close

    def close_after_looking(self, **kwargs) -> None:  # noqa: ANN001, ANN003
        if Path("/proc/net/tcp").exists():
            listening.extend(listening_addresses(descendants(os.getpid())) or ["none found"])
        close(self, **kwargs)

    monkeypatch.setattr(sweep_exec.RayExecutor, "close", close_after_looking)
    source = write_yaml(tmp_path, dict(TINY, sweep={"workload.arrivals.rate": [4.0, 16.0]}))
    assert main(["sweep", str(source), "--out", str(tmp_path / "ray"), "--executor", "ray", "--jobs", "2",
                 "--quiet"]) == 0
    assert all(ip.startswith("127.") or ip == "::1" for ip in listening), listening
    assert main(["sweep", str(source), "--out", str(tmp_path / "inline"), "--quiet"]) == 0
    assert tree(tmp_path / "ray") == tree(tmp_path / "inline")

