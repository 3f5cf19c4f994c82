"""benchmarks/published: the figures file holds cited, complete, positive figures; the script runs."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "published.py"
FIGURES = REPO / "benchmarks" / "published" / "figures.yaml"
_SPEC = importlib.util.spec_from_file_location("published_benchmark", SCRIPT)
published = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(published)


@pytest.fixture(scope="module")
def data() -> dict:
    return yaml.safe_load(FIGURES.read_text(encoding="utf-8"))


def test_the_file_parses_and_passes_the_script_checks(data):
    checked = published.load(FIGURES)
    assert checked["figures"] == data["figures"]
    assert len(data["figures"]) >= 30


def test_every_source_is_cited_and_has_a_role(data):
    for key, source in data["sources"].items():
        assert source.get("url", "").startswith("https://"), key
        assert source.get("title") and source.get("engine") and source.get("metric_note"), key
        assert source.get("role") in published.ROLES, key


def test_every_figure_has_a_source_a_role_a_place_and_a_positive_value(data):
    ids = [f["id"] for f in data["figures"]]
    assert len(ids) == len(set(ids))
    for fig in data["figures"]:
        assert fig["source"] in data["sources"], fig["id"]
        assert fig["role"] == data["sources"][fig["source"]]["role"], fig["id"]
        assert fig["where"].strip(), fig["id"]
        assert isinstance(fig["value"], (int, float)) and fig["value"] > 0, fig["id"]
        assert fig["input_len"] > 0 and fig["output_len"] > 0 and fig["tensor_parallel"] >= 1, fig["id"]


def test_both_roles_are_populated(data):
    roles = {f["role"] for f in data["figures"]}
    assert roles == set(published.ROLES)


def test_load_rejects_duplicates_and_bad_values(tmp_path, data):
    fig = dict(data["figures"][0])
    bad = {"sources": data["sources"], "figures": [fig, dict(fig)]}
    path = tmp_path / "f.yaml"
    path.write_text(yaml.safe_dump(bad), encoding="utf-8")
    with pytest.raises(ValueError, match="duplicate"):
        published.load(path)
    bad["figures"] = [dict(fig, value=-1.0)]
    path.write_text(yaml.safe_dump(bad), encoding="utf-8")
    with pytest.raises(ValueError, match="positive"):
        published.load(path)


def test_an_unknown_model_is_reported_not_dropped(data):
    fig = dict(data["figures"][0], model="no-such-model")
    row = published.simulate(fig, data["sources"][fig["source"]], max_requests=50, quick=True)
    assert row["status"] == "not expressible"
    assert "model" in row["reason"]


def test_quick_run_prints_the_table_and_summaries(tmp_path):
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--json", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "published" in text and "simulated" in text and "error" in text
    assert "median |err|" in text
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == published.QUICK_FIGURES
    for row in rows:
        assert row["id"] in text
        assert row["status"] in ("ok", "not expressible")
        if row["status"] == "ok":
            assert row["simulated"] > 0


def test_a_steady_state_source_leaves_out_the_first_and_last_round():
    """genai-perf's measurement window is the experiment's warm-up and cool-down."""
    figures = yaml.safe_load(published.FIGURES.read_text())
    fig = next(f for f in figures["figures"] if f["scenario"] == "closed_loop"
               and figures["sources"][f["source"]].get("measurement") == "steady_state")
    source = figures["sources"][fig["source"]]
    exp = published.experiment_for(fig, source, max_requests=4000, quick=False)
    concurrency = int(fig["concurrency"])
    assert exp["metrics"] == {"warmup_requests": concurrency, "cooldown_requests": concurrency}
    assert exp["workload"]["num_requests"] >= 3 * concurrency
