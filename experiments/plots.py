"""Plots of a results folder (matplotlib, headless): shared style, titles and deterministic saving.

Figures are saved as PNG and SVG. Both are byte-reproducible: the SVG carries no date and its
element ids come from a fixed salt instead of a random one, so re-plotting the same results (or
a sweep run with a different --jobs) gives identical files.
"""

from __future__ import annotations

import hashlib
import io
import re
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from experiments.io import NAME_MAX_LENGTH, atomic_write_bytes, path_under  # noqa: E402

# A fixed salt makes SVG ids (clip paths, glyph defs) the same on every save.
matplotlib.rcParams["svg.hashsalt"] = "servesim"
FORMATS = ("png", "svg")
# Percentiles drawn in every latency plot: (legend name, summary-key prefix, line style).
PERCENTILE_STYLES = (("p50", "median", "-"), ("p90", "p90", "--"), ("p99", "p99", ":"))


def save_figure(fig: plt.Figure, out_dir: Path, stem: str, *, tight: bool = False) -> list[Path]:
    """Write `stem.png` and `stem.svg` atomically and close the figure.

    `tight` grows the canvas to fit artists outside the axes (a legend beside the plots); it
    costs a second draw, so figures laid out by tight_layout alone leave it off."""
    paths = []
    for fmt in FORMATS:
        buffer = io.BytesIO()
        # No creation date in the SVG (PNG's metadata holds none by default), so files are reproducible.
        fig.savefig(buffer, format=fmt, dpi=110, metadata={"Date": None} if fmt == "svg" else None,
                    bbox_inches="tight" if tight else None)
        path = path_under(out_dir, f"{safe_stem(stem)}.{fmt}")
        atomic_write_bytes(path, buffer.getvalue())
        paths.append(path)
    plt.close(fig)
    return paths


def safe_stem(text: str) -> str:
    """A file-name-safe version of a label like 'max_num_seqs=16, chunk_size=256': no path
    separators, no leading dot, and at most NAME_MAX_LENGTH characters (a long one keeps its
    start and gains a hash of the whole, so distinct labels stay distinct files)."""
    stem = re.sub(r"[^A-Za-z0-9._=-]+", "_", text).strip("_.") or "plot"
    if len(stem) > NAME_MAX_LENGTH:
        digest = hashlib.sha256(text.encode()).hexdigest()[:10]
        stem = f"{stem[:NAME_MAX_LENGTH - 11]}-{digest}"
    return stem


def series_colors(names: list[str]) -> dict[str, Any]:
    """One colour per series, stable across the figures of one folder."""
    cmap = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    return {name: cmap(i % cmap.N) for i, name in enumerate(names)}


def describe_workload(workload: dict[str, Any], num_requests: int | None = None) -> str:
    """'300 requests, poisson 8 req/s, prompt lognormal~600, output lognormal~150' (or the trace).

    `num_requests` is the count the run actually had (run info); for sessions and traces the
    workload's own `num_requests` is only a cap, so that count is named instead."""
    if not workload:
        return "workload ?"
    trace = workload.get("trace")
    if trace:
        return f"trace {trace.get('path')}" + (f", {num_requests} requests" if num_requests else "")
    parts = []
    if num_requests:
        parts.append(f"{num_requests} requests")
    elif workload.get("num_requests"):
        cap = workload.get("sessions") is not None
        parts.append(f"{'at most ' if cap else ''}{workload['num_requests']} requests")
    arrivals = workload.get("arrivals") or {}
    if arrivals:
        rate = arrivals.get("rate")
        unit = "sessions/s" if workload.get("sessions") else "req/s"  # sessions arrive, their turns follow
        parts.append(f"{arrivals.get('kind')} {rate:g} {unit}" if rate is not None else str(arrivals.get("kind")))
    for name in ("prompt_len", "output_len"):
        dist = workload.get(name)
        if dist:
            parts.append(f"{name.split('_')[0]} {_dist(dist)}")
    if workload.get("sessions"):
        parts.append(f"{workload['sessions'].get('num_sessions')} sessions")
    if workload.get("prefix"):
        parts.append("shared prefixes")
    return ", ".join(parts)


def _dist(dist: dict[str, Any]) -> str:
    kind = dist.get("kind")
    if kind == "fixed":
        return f"{dist['value']}"
    if kind == "uniform":
        return f"{dist['low']}-{dist['high']}"
    if kind == "lognormal":
        return f"~{dist['median']:g}"
    if kind == "normal":
        return f"~{dist['mean']:g}"
    return str(kind)


def describe_setup(resolved: dict[str, Any], info: dict[str, Any], *, swept: list[str] | None = None,
                   note: str | None = None) -> str:
    """A title naming model, hardware, cost model and workload, so a plot stands on its own."""
    model = info.get("model", {}).get("name", resolved.get("model", "?"))
    hardware = info.get("hardware", {}).get("name", resolved.get("hardware", "?"))
    tp = resolved.get("tensor_parallel", 1)
    cost = (resolved.get("cost_model") or {}).get("name", "?")
    head = f"{resolved.get('name', 'experiment')}: {model} on {hardware}" + (f" x{tp}" if tp and tp > 1 else "")
    # A sweep's points may differ in their count (info is one point's), so only a run names it.
    count = None if swept else info.get("num_requests")
    line2 = f"{describe_workload(resolved.get('workload') or {}, count)}; {cost} cost model"
    if swept:
        line2 += f"; sweep over {', '.join(swept)}"
    if note:
        line2 += f"; {note}"
    return f"{head}\n{line2}"


def describe(info: dict, exp) -> str:  # noqa: ANN001 - experiments.config.Experiment
    """Title of the per-run bar chart written by `servesim run`."""
    return describe_setup(exp.model_dump(mode="json"), info)


def plot_latency_percentiles(run, out_dir: Path) -> list[Path]:  # noqa: ANN001 - runner.ExperimentRun
    """TTFT and TPOT p50/p90/p99 per policy, side by side (PNG and SVG); `servesim run` calls this."""
    return plot_percentile_bars([r.label for r in run.runs], [r.summary for r in run.runs],
                                describe(run.info, run.experiment), out_dir)


def plot_percentile_bars(labels: list[str], summaries: list[dict], title: str, out_dir: Path,
                         stem: str = "latency_percentiles") -> list[Path]:
    """Grouped bars: for each series, TTFT and TPOT at p50/p90/p99."""
    fig, axes = plt.subplots(1, 2, figsize=(max(11, 1.6 * len(labels) + 4), 4.6))
    width = 0.25
    x = np.arange(len(labels))
    for ax, metric, unit in ((axes[0], "ttft", "TTFT (ms)"), (axes[1], "tpot", "TPOT (ms per token)")):
        for i, (name, key, _) in enumerate(PERCENTILE_STYLES):
            values = [s.get(f"{key}_{metric}_ms") or 0.0 for s in summaries]
            ax.bar(x + (i - 1) * width, values, width, label=name)
        positive = [s.get(f"p99_{metric}_ms") or 0.0 for s in summaries]
        if min(positive) > 0 and max(positive) / min(positive) > 30:
            ax.set_yscale("log")  # keep small bars readable beside a policy that is 100x worse
        ax.set_xticks(x, labels, rotation=15 if len(labels) > 4 else 0, fontsize=8)
        ax.set_ylabel(unit)
        ax.set_title(unit.split(" ")[0] + " percentiles")
        ax.legend(title="percentile")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, out_dir, stem)
