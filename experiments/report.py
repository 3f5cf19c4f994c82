"""Comparison tables for a results folder: the summary per policy, TTFT's parts, and sweep grids."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from experiments.report_load import Results, load_results, short_key
from experiments.table import (
    LATENCY_COLUMNS,
    SUMMARY_COLUMNS,
    format_summary_table,
    format_table,
    format_vertical,
    title,
)

# TTFT = queue + prefill + delivery (seed eq. 21.4), as means in ms, with the SLO outcome.
BREAKDOWN_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("Policy", "label", "{}"),
    ("Mean TTFT (ms)", "mean_ttft_ms", "{:.1f}"),
    ("Mean queue (ms)", "mean_queue_ms", "{:.1f}"),
    ("Mean prefill (ms)", "mean_prefill_ms", "{:.1f}"),
    ("Mean delivery (ms)", "mean_delivery_ms", "{:.1f}"),
    ("Request goodput (req/s)", "request_goodput", "{:.2f}"),
    ("P99 ITL (ms)", "p99_itl_ms", "{:.1f}"),
    ("P99 E2EL (ms)", "p99_e2el_ms", "{:.0f}"),
    ("End reason", "end_reason", "{}"),
)


def report(path: str | Path, style: str = "text") -> str:
    """Every table for a `run`, `sweep` or `capacity` folder, ready to print (`style`: text,
    csv or markdown; see experiments.table)."""
    capacity = Path(path) / "capacity.json"
    if capacity.is_file():
        from experiments.report_capacity import capacity_table

        return capacity_table(json.loads(capacity.read_text()), style)
    results = load_results(path)
    if results.kind == "sweep":
        return sweep_report(results, style)
    rows = _records(results.summaries)
    breakdown = format_vertical(rows, BREAKDOWN_COLUMNS) if style == "text" else \
        format_table(rows, BREAKDOWN_COLUMNS, style=style)
    return "\n\n".join([
        title(f"{results.name} ({results.root})", style),
        format_summary_table(rows, style),
        title("TTFT parts and SLO outcome", style),
        breakdown,
    ])


def sweep_table(path: str | Path, style: str = "text") -> str:
    """One line per (point, policy): the swept values, then the usual summary columns."""
    results = load_results(path)
    columns = _sweep_columns(results, SUMMARY_COLUMNS)
    return format_table(_records(results.summaries), columns, style=style, keys=_num_keys(columns))


def sweep_report(results: Results, style: str = "text") -> str:
    rows = _records(results.summaries)
    status = sweep_status(results.root)
    if not rows:
        return f"{results.name} ({results.root}): no finished points yet\n{status}".rstrip()

    def table(table_rows: list[dict], columns: tuple) -> str:
        return format_table(table_rows, columns, style=style, keys=_num_keys(columns))

    parts = [title(f"{results.name} ({results.root}): {results.summaries['point_id'].nunique()} finished points",
                   style),
             table(rows, _sweep_columns(results, SUMMARY_COLUMNS)),
             title("TTFT parts and SLO outcome", style),
             table(rows, _sweep_columns(results, BREAKDOWN_COLUMNS))]
    best = best_points(results)
    if best:
        parts += [title("Best point per policy (lowest P90 TTFT among points that finished every request)", style),
                  table(best, _sweep_columns(results, LATENCY_COLUMNS))]
    if status:
        parts.append(status if style == "text" else "\n".join(title(line, style) for line in status.splitlines()))
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


def _num_keys(columns: tuple) -> int:
    """How many columns name a row (the point, variant, swept values and policy): a wrapped
    text table repeats them in every block."""
    return next(i for i, column in enumerate(columns) if column[1] == "label") + 1


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
