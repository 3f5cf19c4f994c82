"""Comparison tables for a results folder: the summary per policy, TTFT's parts, and sweep grids."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from experiments.report_load import Results, load_results, short_key
from experiments.table import SUMMARY_COLUMNS, format_table

# TTFT = queue + prefill + delivery (seed eq. 21.4), as means in ms, with the SLO outcome.
BREAKDOWN_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("policy", "label", "{}"),
    ("TTFT mean", "mean_ttft_ms", "{:.1f}"),
    ("queue", "mean_queue_ms", "{:.1f}"),
    ("prefill", "mean_prefill_ms", "{:.1f}"),
    ("delivery", "mean_delivery_ms", "{:.1f}"),
    ("goodput req/s", "request_goodput", "{:.2f}"),
    ("ITL p99", "p99_itl_ms", "{:.1f}"),
    ("E2EL p99", "p99_e2el_ms", "{:.0f}"),
    ("end", "end_reason", "{}"),
)


def report(path: str | Path) -> str:
    """Every table for a `run`, `sweep` or `capacity` folder, ready to print."""
    capacity = Path(path) / "capacity.json"
    if capacity.is_file():
        from experiments.report_capacity import capacity_table

        return capacity_table(json.loads(capacity.read_text()))
    results = load_results(path)
    if results.kind == "sweep":
        return sweep_report(results)
    rows = _records(results.summaries)
    return "\n\n".join([
        f"{results.name} ({results.root})",
        format_table(rows),
        "TTFT parts (mean ms) and SLO outcome",
        format_table(rows, BREAKDOWN_COLUMNS),
    ])


def sweep_table(path: str | Path) -> str:
    """One line per (point, policy): the swept values, then the usual summary columns."""
    results = load_results(path)
    return format_table(_records(results.summaries), _sweep_columns(results, SUMMARY_COLUMNS))


def sweep_report(results: Results) -> str:
    rows = _records(results.summaries)
    status = sweep_status(results.root)
    if not rows:
        return f"{results.name} ({results.root}): no finished points yet\n{status}".rstrip()
    parts = [f"{results.name} ({results.root}): {results.summaries['point_id'].nunique()} finished points",
             format_table(rows, _sweep_columns(results, SUMMARY_COLUMNS)),
             "TTFT parts (mean ms) and SLO outcome",
             format_table(rows, _sweep_columns(results, BREAKDOWN_COLUMNS))]
    best = best_points(results)
    if best:
        parts += ["Best point per policy (lowest TTFT p90 among points that finished every request)",
                  format_table(best, _sweep_columns(results, SUMMARY_COLUMNS[:1] + SUMMARY_COLUMNS[5:11]))]
    if status:
        parts.append(status)
    return "\n\n".join(parts)


def sweep_status(root: Path) -> str:
    """Points of the plan that are not finished: failed ones with their error's last line, and missing ones."""
    manifest = json.loads((root / "sweep.json").read_text())
    lines = []
    missing = 0
    for point in manifest["points"]:
        folder = root / "points" / point["point_id"]
        if (folder / "DONE.json").is_file():
            continue
        error = folder / "ERROR.json"
        if error.is_file():
            message = json.loads(error.read_text())["error"].strip().splitlines()[-1]
            lines.append(f"failed: {point['point_id']}: {message}")
        else:
            missing += 1
    if missing:
        lines.append(f"not run yet: {missing} of {len(manifest['points'])} points (re-run `servesim sweep` to finish)")
    return "\n".join(lines)


def best_points(results: Results) -> list[dict]:
    frame = results.summaries
    if frame.empty or "p90_ttft_ms" not in frame:
        return []
    complete = frame[(frame["completed"] == frame["num_requests"]) & frame["p90_ttft_ms"].notna()]
    group = ["variant", "label"] if results.variants else ["label"]
    best = []
    for _, rows in complete.groupby(group, sort=False):
        best.append(rows.sort_values(["p90_ttft_ms", "point_index"], kind="stable").iloc[0].to_dict())
    return [clean_row(r) for r in best]


def _sweep_columns(results: Results, columns: tuple) -> tuple:
    head = [("point", "point_index", "{:d}")]
    if results.variants:
        head.append(("variant", "variant", "{}"))
    head += [(short_key(k, results.keys), k, "{}") for k in results.keys]
    return (*head, *columns)


def _records(frame: pd.DataFrame) -> list[dict]:
    return [clean_row(row) for row in frame.to_dict(orient="records")]


def clean_row(row: dict) -> dict:
    # Parquet turns missing values into NaN and ints into numpy ints; the table formats want None and int.
    out = {}
    for key, value in row.items():
        if isinstance(value, float) and math.isnan(value):
            value = None
        elif hasattr(value, "item"):
            value = value.item()
        out[key] = value
    return out
