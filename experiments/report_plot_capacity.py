"""The capacity plot: max rate per series, and every probe's distance from the SLO."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from experiments.plots import describe_setup, plt, save_figure, series_colors
from experiments.report_capacity import searched
from experiments.report_load import read_resolved, read_run_info


def plot_capacity(result: dict[str, Any], title: str, out_dir: Path) -> list[Path]:
    series = result["series"]
    names = [s["label"] if not s["variant"] else f"{s['label']} / {s['variant']}" for s in series]
    colors = series_colors(names)
    slo = result["slo"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 0.45 * len(series) + 3.5))
    y = np.arange(len(series))
    rates = [s["max_rate"] or 0.0 for s in series]
    axes[0].barh(y, rates, color=[colors[n] for n in names], height=0.6)
    for i, (s, rate) in enumerate(zip(series, rates, strict=True)):
        mark = {"at-high": " (>= --high)", "below-low": " (< --low)", "error": " (error)"}.get(s["status"], "")
        axes[0].annotate(f" {rate:.4g}{mark}", (rate, i), va="center", fontsize=8)
    axes[0].set_yticks(y, names)
    axes[0].invert_yaxis()
    axes[0].set_xlim(0, max(rates + [result["low"]]) * 1.3)
    what, unit = searched(result["param"])
    quantity = "request rate" if what == "rate" else what
    axes[0].set_xlabel(f"highest {quantity} meeting the SLOs ({unit})")
    axes[0].set_title("capacity per policy")
    axes[0].grid(axis="x", alpha=0.3)
    ax = axes[1]
    for name, s in zip(names, series, strict=True):
        probes = [p for p in s["probes"] if not p["error"]]
        x = [p["rate"] for p in probes]
        ratio = [_slo_ratio(p, slo) for p in probes]
        ax.plot(x, ratio, color=colors[name], linewidth=0.8, alpha=0.6)
        ax.scatter([r for r, p in zip(x, probes, strict=True) if p["passed"]],
                   [q for q, p in zip(ratio, probes, strict=True) if p["passed"]], color=colors[name], marker="o",
                   s=18, label=name)
        ax.scatter([r for r, p in zip(x, probes, strict=True) if not p["passed"]],
                   [q for q, p in zip(ratio, probes, strict=True) if not p["passed"]], color=colors[name],
                   marker="x", s=24)
    ax.axhline(1.0, color="black", linestyle="-.", linewidth=1)
    ax.set_yscale("log")
    ax.set_xlabel(f"probed {quantity} ({unit})")
    ax.set_ylabel("worst metric / its SLO limit (1 = at the limit)")
    ax.set_title("probes: o = passed, x = failed", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, out_dir, "capacity", tight=True)


def _slo_ratio(probe: dict[str, Any], slo: dict[str, float]) -> float:
    # An unfinished run has no meaningful percentile; draw it above the line so it reads as a miss.
    ratios = [probe[k] / v for k, v in slo.items() if probe.get(k) is not None]
    worst = max(ratios) if ratios else 10.0
    if probe.get("completed") != probe.get("num_requests"):
        worst = max(worst, 1.5)
    return worst


def capacity_title(out: Path) -> str:
    """Model, hardware and workload of the first probe, with the searched rate left out."""
    points = sorted((out / "points").iterdir()) if (out / "points").is_dir() else []
    if not points:
        return "capacity search"
    resolved = read_resolved(points[0])
    arrivals = (resolved.get("workload") or {}).get("arrivals")
    if isinstance(arrivals, dict):
        arrivals["rate"] = None
    return describe_setup(resolved, read_run_info(points[0]), note="request rate searched")
