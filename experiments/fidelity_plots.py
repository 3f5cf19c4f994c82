"""Figures for `servesim validate`: predicted-vs-measured step times and latency CDFs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from experiments.io import path_under

MARKERS = {"profiled": ("tab:blue", "o"), "roofline": ("tab:orange", "s")}


def plot_fidelity(folder: Path, steps: pd.DataFrame, measured, predicted: dict) -> dict[str, str]:  # noqa: ANN001
    """One step-time scatter and one TTFT/TPOT CDF figure per policy; returns name -> relative path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}
    for run in measured.runs:
        label = run.label
        part = steps[steps["policy"] == label] if len(steps) else steps
        fig, ax = plt.subplots(figsize=(5.5, 5))
        lo, hi = np.inf, 0.0
        for name, frame in part.groupby("against", sort=False) if len(part) else ():
            color, marker = MARKERS.get(name, ("tab:green", "^"))
            for kind, alpha in (("decode", 0.35), ("prefill", 0.8), ("mixed", 0.8)):
                sub = frame[frame["kind"] == kind]
                if len(sub):
                    ax.scatter(sub["measured_s"] * 1e3, sub["predicted_s"] * 1e3, s=12 if kind == "decode" else 28,
                               alpha=alpha, color=color,
                               marker={"decode": marker, "prefill": "x", "mixed": "+"}[kind],
                               label=f"{name}: {kind} ({len(sub)})")
            values = np.concatenate([frame["measured_s"].to_numpy(), frame["predicted_s"].to_numpy()]) * 1e3
            values = values[values > 0]
            if values.size:
                lo, hi = min(lo, values.min()), max(hi, values.max())
        if hi > 0:
            ax.plot([lo / 1.2, hi * 1.2], [lo / 1.2, hi * 1.2], color="black", linewidth=1, label="y = x")
            ax.set_xscale("log")
            ax.set_yscale("log")
        ax.set_xlabel("measured step time (ms)")
        ax.set_ylabel("predicted step time (ms)")
        ax.set_title(f"{label}: the real run's steps, priced by each model", fontsize=10)
        ax.legend(fontsize=7, loc="upper left")
        fig.tight_layout()
        name = f"step_scatter_{_safe(label)}.png"
        fig.savefig(path_under(folder, name), dpi=110)
        plt.close(fig)
        files[f"step_scatter:{label}"] = f"plots/{name}"

        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for ax, column, title in ((axes[0], "ttft_s", "TTFT"), (axes[1], "tpot_s", "TPOT")):
            _cdf(ax, run.requests[column], "measured (torch)", "black", "-")
            for other_name, other_run in predicted.items():
                other = next(r for r in other_run.runs if r.label == label)
                color, _ = MARKERS.get(other_name, ("tab:green", "^"))
                _cdf(ax, other.requests[column], other_name, color, "--")
            ax.set_xlabel(f"{title} (ms)")
            ax.set_ylabel("fraction of requests")
            ax.set_title(f"{label}: {title}", fontsize=10)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        name = f"latency_cdf_{_safe(label)}.png"
        fig.savefig(path_under(folder, name), dpi=110)
        plt.close(fig)
        files[f"latency_cdf:{label}"] = f"plots/{name}"
    return files


def _cdf(ax, values: pd.Series, label: str, color: str, style: str) -> None:  # noqa: ANN001
    v = np.sort(values.to_numpy(dtype=float) * 1e3)
    v = v[np.isfinite(v)]
    if v.size:
        ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", label=label, color=color, linestyle=style)


def _safe(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in label)
