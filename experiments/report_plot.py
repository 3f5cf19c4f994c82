"""`servesim plot`: every plot for a `run` or `sweep` results folder, written under DIR/plots/.

A run folder gets percentile bars, latency CDFs, the TTFT breakdown and step timelines (a
cluster's by replica), each comparing its policies. A sweep folder gets the sweep plots (percentiles against every swept
key; latency and goodput against rate when the rate is swept), and, for each combination of
swept values, the same comparison plots across its policies and variants (plots/combos/...).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pandas as pd

from experiments.io import path_under
from experiments.plots import describe_setup, plot_percentile_bars, safe_stem
from experiments.report import clean_row
from experiments.report_load import (
    Results,
    load_results,
    read_policy_table,
    read_resolved,
    read_run_info,
    short_key,
)
from experiments.report_plot_run import Series, plot_cdfs, plot_replica_timelines, plot_timelines, plot_ttft_breakdown
from experiments.report_plot_sweep import is_rate_key, plot_goodput_vs_rate, plot_latency_vs_rate, plot_percentiles_vs


def plot_results(path: str | Path, out: Path | None = None, *, combos: bool = True) -> list[Path]:
    if (Path(path) / "capacity.json").is_file():
        return _plot_capacity(Path(path), out)
    results = load_results(path)
    out = Path(out) if out is not None else results.root / "plots"
    if results.summaries.empty:
        return []
    if results.kind == "run":
        return plot_comparison(results, results.summaries, _title(results), out)
    return plot_sweep(results, out, combos=combos)


def plot_sweep(results: Results, out: Path, *, combos: bool) -> list[Path]:
    title = _title(results)
    resolved = read_resolved(results.first_run_folder())
    slo = ((resolved.get("metrics") or {}).get("slo") or {})
    paths: list[Path] = []
    for key in results.keys:
        paths += plot_percentiles_vs(results, key, title, out)
    rate_keys = [k for k in results.keys if is_rate_key(k)]
    if rate_keys:
        paths += plot_latency_vs_rate(results, rate_keys[0], slo, title, out)
        paths += plot_goodput_vs_rate(results, rate_keys[0], slo, title, out)
    if not results.keys:
        # Variants only: one workload, so the whole sweep is one comparison.
        return paths + plot_comparison(results, results.summaries, title, out)
    if combos:
        for values, rows in _combos(results):
            label = ", ".join(f"{short_key(k, results.keys)}={v}" for k, v in zip(results.keys, values, strict=True))
            # The percentile bars would repeat the sweep plots above, one slice at a time.
            paths += plot_comparison(results, rows, f"{title}\n{label}", path_under(out, "combos", safe_stem(label)),
                                     bars=False)
    return paths


def plot_comparison(results: Results, rows: pd.DataFrame, title: str, out: Path, *, bars: bool = True) -> list[Path]:
    """Percentile bars, CDFs, TTFT breakdown and timelines across the given rows (one workload)."""
    series = []
    for row in rows.to_dict(orient="records"):
        folder = results.policy_folder(row)
        info = read_run_info(folder.parent)
        series.append(Series(results.series_name(row), clean_row(row), folder, info.get("kv_num_blocks"),
                             info.get("kv_num_host_blocks")))
    requests = {s.name: read_policy_table(s.folder, "requests") for s in series}
    steps = {s.name: read_policy_table(s.folder, "steps") for s in series}
    paths = plot_percentile_bars([s.name for s in series], [s.summary for s in series], title, out) if bars else []
    paths += plot_cdfs(series, requests, title, out)
    paths += plot_ttft_breakdown(series, title, out)
    paths += plot_timelines(series, steps, title, out)
    paths += plot_replica_timelines(series, steps, title, out)
    return paths


def _combos(results: Results) -> list[tuple[tuple, pd.DataFrame]]:
    frame = results.summaries
    groups: dict[tuple, list[int]] = {}
    for index, values in zip(frame.index, frame[results.keys].itertuples(index=False, name=None), strict=True):
        groups.setdefault(tuple(values), []).append(index)
    return [(values, frame.loc[rows]) for values, rows in groups.items()]


def _title(results: Results) -> str:
    folder = results.first_run_folder()
    resolved = _without_swept(read_resolved(folder), results.keys)
    return describe_setup(resolved, read_run_info(folder), swept=[short_key(k, results.keys) for k in results.keys])


def _without_swept(resolved: dict, keys: list[str]) -> dict:
    """The first point's configuration with swept values blanked, so a title does not name one of them."""
    out = copy.deepcopy(resolved)
    for key in keys:
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and parts[-1] in node:
            node[parts[-1]] = None
    return out


def _plot_capacity(root: Path, out: Path | None) -> list[Path]:
    import json

    from experiments.report_plot_capacity import capacity_title, plot_capacity

    return plot_capacity(json.loads((root / "capacity.json").read_text()), capacity_title(root), out or root)
