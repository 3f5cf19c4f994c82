"""Terminal tables (units, `bench serve` names, at most 100 columns), their CSV and Markdown forms,
the capacity table's two ends, and the progress hooks (off without a terminal)."""

from __future__ import annotations

import csv

from experiments.progress import RunProgress, progress_wanted
from experiments.report_capacity import capacity_table
from experiments.table import SUMMARY_COLUMNS, format_summary_table, format_table

SUMMARY = {"completed": 300, "num_rejected": 2, "request_throughput": 7.47, "output_throughput": 1441.2,
           "median_ttft_ms": 20.6, "p90_ttft_ms": 56.8, "p99_ttft_ms": 108.8, "median_tpot_ms": 7.77,
           "p90_tpot_ms": 8.75, "p99_tpot_ms": 10.16, "median_e2el_ms": 1284.0, "num_preemptions": 0}


def test_summary_is_vertical_with_units_and_wraps_many_policies():
    rows = [dict(SUMMARY, label=f"chunked_prefill_{i}") for i in range(9)]
    text = format_summary_table(rows)
    lines = text.splitlines()
    assert max(map(len, lines)) <= 100
    for name in ("Successful requests", "Request throughput (req/s)", "Output token throughput (tok/s)",
                 "Median TTFT (ms)", "P99 TPOT (ms)"):
        assert sum(line.startswith(name) for line in lines) > 1, name  # one line per block
    assert all(f"chunked_prefill_{i}" in text for i in range(9))
    assert "hit rate" not in text.lower()  # an optional row shows only when some value is nonzero


def test_wide_table_repeats_its_key_columns_in_every_block():
    rows = [dict(SUMMARY, label="continuous", point_index=3)]
    text = format_table(rows, [("point", "point_index", "{:d}"), *SUMMARY_COLUMNS], keys=2)
    blocks = text.split("\n\n")
    assert len(blocks) > 1 and max(map(len, text.splitlines())) <= 100
    assert all(block.splitlines()[-1].split()[:2] == ["3", "continuous"] for block in blocks)


def test_csv_and_markdown_hold_every_column_unwrapped():
    rows = [dict(SUMMARY, label="continuous"), dict(SUMMARY, label="static", median_ttft_ms=None)]
    parsed = list(csv.DictReader(format_summary_table(rows, "csv").splitlines()))
    assert [row["Policy"] for row in parsed] == ["continuous", "static"]
    assert parsed[0]["Median TTFT (ms)"] == "20.6" and parsed[1]["Median TTFT (ms)"] == ""
    markdown = format_summary_table(rows, "markdown").splitlines()
    assert markdown[0].startswith("| Policy | Successful requests | Rejected requests |")
    assert markdown[1].startswith("| --- | ---: |") and len(markdown) == 4


def test_capacity_table_shows_what_was_measured_at_both_ends():
    result = {"name": "q", "slo": {"p90_ttft_ms": 500.0}, "param": "workload.arrivals.rate",
              "low": 0.25, "high": 64.0, "tol": 0.1, "series": [
                  {"variant": "", "label": "continuous", "status": "ok", "max_rate": 8.1, "first_failing_rate": 8.2,
                   "probes": [{"rate": 8.1, "p90_ttft_ms": 400.0}, {"rate": 8.2, "p90_ttft_ms": 612.5}]},
                  {"variant": "", "label": "static", "status": "below-low", "max_rate": None,
                   "first_failing_rate": 0.25, "probes": [{"rate": 0.25, "p90_ttft_ms": 900.0}]},
                  {"variant": "", "label": "chunked", "status": "at-high", "max_rate": 64.0,
                   "first_failing_rate": None, "probes": [{"rate": 64.0, "p90_ttft_ms": 90.0}]}]}
    lines = {line.split()[0]: line.split() for line in capacity_table(result).splitlines()[1:]}
    assert lines["continuous"][1:5] == ["8.1", "400.0", "8.2", "612.5"]
    assert lines["static"][1:6] == ["<", "0.25", "-", "0.25", "900.0"]  # measured below the low end
    assert lines["chunked"][1:5] == ["64", "90.0", ">", "64"]
    assert "lower --low" in capacity_table(result) and "raise --high" in capacity_table(result)
    assert capacity_table(result, "csv").splitlines()[1].startswith("Policy,Max rate (req/s),P90 TTFT (ms) <= 500")


def test_progress_is_off_without_a_terminal_and_a_run_reports_through_the_engine():
    from experiments.config import load_experiment
    from experiments.runner import run_experiment
    from tests.test_examples import EXAMPLES

    assert not progress_wanted()  # pytest captures stderr: no terminal
    assert not progress_wanted(quiet=True)

    class Recording(RunProgress):
        def __init__(self) -> None:
            super().__init__(enabled=True)
            self.reports: list[tuple[str, float, int]] = []

        def policy(self, label: str, num_requests: int):  # noqa: ANN201
            return lambda sim_s, finished: self.reports.append((label, sim_s, finished))

    path = EXAMPLES[0].parent / "quickstart.yaml"
    exp = load_experiment(path, ["workload.num_requests=200", "policies=[{name: continuous}]",
                                 "limits.fast_forward=false"])  # one event per step
    recording = Recording()
    reported = run_experiment(exp, source=path, progress=recording)
    plain = run_experiment(exp, source=path)
    assert recording.reports, "a run of a few thousand events reports its progress"
    for label in {label for label, _, _ in recording.reports}:
        times = [sim_s for name, sim_s, _ in recording.reports if name == label]
        finished = [count for name, _, count in recording.reports if name == label]
        assert times == sorted(times) and finished == sorted(finished) and finished[-1] <= 200
    assert [r.summary for r in reported.runs] == [r.summary for r in plain.runs]
