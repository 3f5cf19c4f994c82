"""Plots of a results folder (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def describe(info: dict, exp) -> str:  # noqa: ANN001
    """A title naming model, hardware and workload, so a plot stands on its own."""
    model = info.get("model", {}).get("name", exp.model)
    hardware = info.get("hardware", {}).get("name", exp.hardware)
    return f"{exp.name}: {model} on {hardware}, {info.get('num_requests', '?')} requests"


def plot_latency_percentiles(run, out_dir: Path) -> list[Path]:  # noqa: ANN001
    """TTFT and TPOT p50/p90/p99 per policy, side by side (PNG and SVG)."""
    labels = [r.label for r in run.runs]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    width = 0.25
    x = np.arange(len(labels))
    for ax, metric, unit in ((axes[0], "ttft", "TTFT (ms)"), (axes[1], "tpot", "TPOT (ms per token)")):
        for i, (name, key) in enumerate((("p50", "median"), ("p90", "p90"), ("p99", "p99"))):
            values = [r.summary.get(f"{key}_{metric}_ms") or 0.0 for r in run.runs]
            ax.bar(x + (i - 1) * width, values, width, label=name)
        positive = [r.summary.get(f"p99_{metric}_ms") or 0.0 for r in run.runs]
        if min(positive) > 0 and max(positive) / min(positive) > 30:
            ax.set_yscale("log")  # keep small bars readable beside a policy that is 100x worse
        ax.set_xticks(x, labels)
        ax.set_ylabel(unit)
        ax.set_title(unit.split(" ")[0] + " percentiles")
        ax.legend(title="percentile")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(describe(run.info, run.experiment))
    fig.tight_layout()
    paths = []
    for suffix in ("png", "svg"):
        path = out_dir / f"latency_percentiles.{suffix}"
        fig.savefig(path, dpi=110, metadata={"Date": None} if suffix == "svg" else None)
        paths.append(path)
    plt.close(fig)
    return paths
