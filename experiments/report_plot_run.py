"""Plots comparing the policies (and variants) of one workload: latency CDFs, TTFT parts, timelines."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.plots import plt, save_figure, series_colors

CDF_METRICS = (("ttft_s", "TTFT (ms)"), ("tpot_s", "TPOT (ms per output token)"), ("e2el_s", "E2E latency (ms)"))
# At most this many points per timeline line: long runs have 10^5+ steps, far more than pixels.
TIMELINE_POINTS = 4000


@dataclass
class Series:
    """One line of a comparison: a policy (of one variant) with its summary and results folder."""

    name: str
    summary: dict
    folder: Path
    kv_capacity_blocks: int | None = None
    host_capacity_blocks: int | None = None


def plot_cdfs(series: list[Series], requests: dict[str, pd.DataFrame], title: str, out_dir: Path,
              stem: str = "latency_cdf") -> list[Path]:
    """Empirical CDFs of TTFT, TPOT and E2EL (finished requests), one line per series."""
    colors = series_colors([s.name for s in series])
    fig, axes = plt.subplots(1, len(CDF_METRICS), figsize=(14, 4.4))
    for ax, (column, label) in zip(axes, CDF_METRICS, strict=True):
        spans = []
        for s in series:
            frame = requests[s.name]
            values = np.sort(frame.loc[frame["status"] == "finished", column].dropna().to_numpy(float) * 1000.0)
            if values.size == 0:
                continue
            fraction = np.arange(1, values.size + 1) / values.size
            ax.step(values, fraction, where="post", color=colors[s.name], label=s.name)
            spans.append(values)
        _log_if_wide(ax, spans)
        ax.set_xlabel(label)
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.set_title(label.split(" (")[0] + " CDF")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, out_dir, stem)


def _log_if_wide(ax, spans: list[np.ndarray]) -> None:  # noqa: ANN001 - matplotlib Axes
    values = np.concatenate(spans) if spans else np.zeros(0)
    values = values[values > 0]
    # Static batching's TTFT can be 100x continuous batching's; a log axis keeps both readable.
    if values.size and values.max() / values.min() > 100:
        ax.set_xscale("log")


def plot_ttft_breakdown(series: list[Series], title: str, out_dir: Path, stem: str = "ttft_breakdown") -> list[Path]:
    """Mean TTFT split into queue, prefill and delivery (seed eq. 21.4), one stacked bar per series:
    in ms on the left, as shares of that series' TTFT on the right (readable when policies differ 100x)."""
    parts = (("queue", "mean_queue_ms", "#9ecae1"), ("prefill", "mean_prefill_ms", "#3182bd"),
             ("delivery", "mean_delivery_ms", "#fd8d3c"))
    values = np.array([[s.summary.get(key) or 0.0 for _, key, _ in parts] for s in series], dtype=float)
    totals = values.sum(axis=1)
    shares = np.divide(values, totals[:, None], out=np.zeros_like(values), where=totals[:, None] > 0) * 100
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.55 * len(series) + 2.2), sharey=True)
    y = np.arange(len(series))
    for ax, data in ((axes[0], values), (axes[1], shares)):
        left = np.zeros(len(series))
        for i, (name, _, color) in enumerate(parts):
            ax.barh(y, data[:, i], left=left, color=color, label=name, height=0.6)
            left += data[:, i]
        ax.grid(axis="x", alpha=0.3)
    for i, total in enumerate(totals):
        axes[0].annotate(f" {total:.1f} ms", (total, i), va="center", fontsize=8)
    axes[0].set_yticks(y, [s.name for s in series])
    axes[0].invert_yaxis()
    axes[0].set_xlabel("mean TTFT (ms) = queue + prefill + delivery")
    axes[0].set_xlim(0, totals.max() * 1.25 if totals.max() > 0 else 1)
    axes[0].set_title("TTFT parts (ms)")
    axes[1].set_xlabel("share of mean TTFT (%)")
    axes[1].set_xlim(0, 100)
    axes[1].set_title("TTFT parts (share)")
    axes[1].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, out_dir, stem, tight=True)


def plot_timelines(series: list[Series], steps: dict[str, pd.DataFrame], title: str, out_dir: Path,
                   stem: str = "timeline") -> list[Path]:
    """Running/waiting requests and KV blocks used over simulated time, one column per series
    (a cluster's are drawn by replica: `plot_replica_timelines`)."""
    series = [s for s in series if "replica" not in steps[s.name]]
    if not series:
        return []
    with_host = any(steps[s.name]["host_blocks_used"].max() > 0 for s in series if len(steps[s.name]))
    rows = 3 if with_host else 2
    fig, axes = plt.subplots(rows, len(series), figsize=(4.6 * len(series) + 1, 2.6 * rows + 1),
                             sharex="col", sharey="row", squeeze=False)
    for col, s in enumerate(series):
        frame = _thin(steps[s.name])
        t = frame["start_s"].to_numpy(float)
        ax = axes[0][col]
        ax.step(t, frame["num_running"], where="post", label="running", color="#2ca02c")
        ax.step(t, frame["num_waiting"], where="post", label="waiting", color="#d62728")
        ax.step(t, frame["num_swapped"], where="post", label="swapped", color="#9467bd")
        ax.set_title(s.name)
        ax = axes[1][col]
        ax.step(t, frame["kv_blocks_used"], where="post", label="blocks used", color="#1f77b4")
        if s.kv_capacity_blocks:
            ax.axhline(s.kv_capacity_blocks, color="black", linestyle="--", linewidth=1, label="capacity")
        if with_host:
            ax = axes[2][col]
            ax.step(t, frame["host_blocks_used"], where="post", label="blocks used", color="#8c564b")
            if s.host_capacity_blocks:
                ax.axhline(s.host_capacity_blocks, color="black", linestyle="--", linewidth=1, label="capacity")
        axes[-1][col].set_xlabel("simulated time (s)")
        for row in axes:
            row[col].grid(alpha=0.3)
    for row, label in zip(axes, ("requests", "device KV blocks", "host KV blocks"), strict=False):
        row[0].set_ylabel(label)
        # Legends beside the last column, where they cover no line.
        row[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, out_dir, stem, tight=True)


# Replicas drawn one line each in a cluster's timelines (the first ones; the title says so).
MAX_REPLICA_LINES = 16


def plot_replica_timelines(series: list[Series], steps: dict[str, pd.DataFrame], title: str, out_dir: Path,
                           stem: str = "replica_timeline") -> list[Path]:
    """A cluster's load over simulated time, a line per replica: requests on it (running,
    waiting or swapped out) and device KV blocks used; one column per series."""
    clusters = [s for s in series if "replica" in steps[s.name] and len(steps[s.name])]
    if not clusters:
        return []
    fig, axes = plt.subplots(2, len(clusters), figsize=(4.6 * len(clusters) + 1.6, 6.2),
                             sharex="col", sharey="row", squeeze=False)
    for col, s in enumerate(clusters):
        frame = steps[s.name]
        replicas = sorted(frame["replica"].unique().tolist())
        colors = series_colors([str(r) for r in replicas[:MAX_REPLICA_LINES]])
        for replica in replicas[:MAX_REPLICA_LINES]:
            own = _thin(frame[frame["replica"] == replica])
            t = own["start_s"].to_numpy(float)
            load = own["num_running"] + own["num_waiting"] + own["num_swapped"]
            axes[0][col].step(t, load, where="post", color=colors[str(replica)], label=f"replica {replica}")
            axes[1][col].step(t, own["kv_blocks_used"], where="post", color=colors[str(replica)],
                              label=f"replica {replica}")
        if len(replicas) > MAX_REPLICA_LINES:
            axes[0][col].set_title(f"{s.name} (first {MAX_REPLICA_LINES} of {len(replicas)} replicas)")
        else:
            axes[0][col].set_title(s.name)
        capacities = {part.get("kv_num_blocks") for part in _replica_summaries(s.summary)}
        if len(capacities) == 1 and None not in capacities:  # (replicas that differ: a line each would crowd)
            axes[1][col].axhline(capacities.pop(), color="black", linestyle="--", linewidth=1, label="capacity")
        axes[-1][col].set_xlabel("simulated time (s)")
        for row in axes:
            row[col].grid(alpha=0.3)
    for row, label in zip(axes, ("requests on the replica", "device KV blocks")):
        row[0].set_ylabel(label)
        row[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, out_dir, stem, tight=True)


def _replica_summaries(summary: dict) -> list[dict]:
    """A cluster run's per-replica summaries (a list, or JSON text where a sweep's table holds it)."""
    replicas = summary.get("replicas")
    if isinstance(replicas, str):
        replicas = json.loads(replicas)
    return replicas if isinstance(replicas, list) else []


def _thin(frame: pd.DataFrame) -> pd.DataFrame:
    """At most TIMELINE_POINTS rows, keeping each time bin's peak so short spikes stay visible."""
    if len(frame) <= TIMELINE_POINTS:
        return frame
    bins = np.minimum((np.arange(len(frame)) * TIMELINE_POINTS) // len(frame), TIMELINE_POINTS - 1)
    grouped = frame.groupby(bins, sort=True)
    thinned = grouped.max(numeric_only=True)
    thinned["start_s"] = grouped["start_s"].min().to_numpy()
    return thinned.reset_index(drop=True)
