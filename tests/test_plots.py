"""`servesim plot`: the plot files exist, carry no date, and are byte-reproducible."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.cli import main
from tests.test_sweep_run import TINY, tree, write_yaml


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("plots")
    data = dict(TINY, sweep={"workload.arrivals.rate": [4.0, 16.0]},
                kv_cache={"host_memory_gib": 1.0})
    source = write_yaml(root, data)
    assert main(["sweep", str(source), "--out", str(root / "sweep"), "--quiet"]) == 0
    run_source = write_yaml(root, dict(data, sweep=None, output={"plots": True}), "run.yaml")
    assert main(["run", str(run_source), "--out", str(root / "run"), "--quiet"]) == 0
    return {"run": root / "run", "sweep": root / "sweep"}


def test_run_folder_plots(folders):
    run = folders["run"]
    # `servesim run` itself still draws its bar chart (experiments.runner calls plot_latency_percentiles).
    assert (run / "latency_percentiles.png").is_file() and (run / "latency_percentiles.svg").is_file()
    assert main(["plot", str(run)]) == 0
    names = {p.name for p in (run / "plots").iterdir()}
    for stem in ("latency_percentiles", "latency_cdf", "ttft_breakdown", "timeline"):
        assert {f"{stem}.png", f"{stem}.svg"} <= names, stem


def test_sweep_folder_plots(folders):
    sweep = folders["sweep"]
    assert main(["plot", str(sweep)]) == 0
    names = {p.name for p in (sweep / "plots").iterdir()}
    for stem in ("percentiles_vs_rate", "latency_vs_rate", "goodput_vs_rate"):
        assert {f"{stem}.png", f"{stem}.svg"} <= names, stem
    combos = sorted(p.name for p in (sweep / "plots" / "combos").iterdir())
    assert combos == ["rate=16.0", "rate=4.0"]
    assert {"latency_cdf.png", "ttft_breakdown.svg", "timeline.png"} <= {
        p.name for p in (sweep / "plots" / "combos" / "rate=4.0").iterdir()}


def test_plots_are_reproducible(folders, tmp_path: Path):
    sweep = folders["sweep"]
    assert main(["plot", str(sweep), "--out", str(tmp_path / "a"), "--no-combos"]) == 0
    assert main(["plot", str(sweep), "--out", str(tmp_path / "b"), "--no-combos"]) == 0
    first = tree(tmp_path / "a")
    assert first and first == tree(tmp_path / "b")
    svg = first["latency_vs_rate.svg"].decode()
    assert "<dc:date>" not in svg and "offered request rate (req/s)" in svg


def test_titles_name_the_requests_a_session_workload_made():
    from experiments.plots import describe_setup, describe_workload

    sessions = {"num_requests": 2000, "sessions": {"num_sessions": 80}, "arrivals": {"kind": "poisson", "rate": 1.5}}
    # For sessions num_requests is only a cap: the run's own count is named, else "at most".
    assert describe_workload(sessions, 414).startswith("414 requests, poisson 1.5 sessions/s")
    assert describe_workload(sessions).startswith("at most 2000 requests")
    resolved = {"name": "multi_turn", "workload": sessions}
    assert "414 requests" in describe_setup(resolved, {"num_requests": 414})
    assert "414" not in describe_setup(resolved, {"num_requests": 414}, swept=["rate"])
