"""Sweep plots: latency percentiles against each swept parameter, and latency/goodput against rate."""

from __future__ import annotations

import numbers
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.plots import PERCENTILE_STYLES, plt, save_figure, series_colors
from experiments.report_load import Results, short_key
from experiments.sweep import POLICY_MODELS, POLICY_PREFIX

LATENCY_PANELS = (("ttft", "TTFT (ms)"), ("tpot", "TPOT (ms per output token)"))


def is_rate_key(key: str) -> bool:
    """The swept key that sets the offered load (synthetic arrivals, or a trace's rescaled rate)."""
    return key.endswith("arrivals.rate") or key.endswith("trace.target_rate")


def plot_percentiles_vs(results: Results, key: str, title: str, out_dir: Path) -> list[Path]:
    """The headline plot: TTFT and TPOT p50/p90/p99 against `key`, one line per policy (per variant
    and per value of the other swept keys). Rows are percentiles, columns the two metrics."""
    frame = results.summaries
    x, ticks = _axis(frame, key)
    groups = _series(results, frame, exclude=key)
    colors = series_colors(list(groups))
    fig, axes = plt.subplots(len(PERCENTILE_STYLES), len(LATENCY_PANELS), figsize=(12, 9), sharex=True,
                             squeeze=False)
    for col, (metric, unit) in enumerate(LATENCY_PANELS):
        for row, (pname, prefix, _) in enumerate(PERCENTILE_STYLES):
            ax = axes[row][col]
            column = f"{prefix}_{metric}_ms"
            for name, rows in groups.items():
                order = np.argsort(x[rows.index], kind="stable")
                ax.plot(x[rows.index][order], rows[column].to_numpy(float)[order], marker="o", markersize=4,
                        color=colors[name], label=name)
            ax.set_title(f"{unit.split(' ')[0]} {pname}", fontsize=9)
            ax.set_ylabel(f"{pname} {unit}", fontsize=8)
            ax.grid(alpha=0.3)
            _log_y_if_wide(ax, frame[column])
    _format_x(axes[-1], frame, key, ticks, results.keys)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, title="series")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, out_dir, f"percentiles_vs_{short_key(key, results.keys)}", tight=True)


def plot_latency_vs_rate(results: Results, rate_key: str, slo: dict, title: str, out_dir: Path) -> list[Path]:
    """TTFT and TPOT p90/p99 against the offered request rate, with the experiment's SLOs as lines."""
    frame = results.summaries
    groups = _series(results, frame, exclude=rate_key)
    colors = series_colors(list(groups))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for ax, (metric, unit) in zip(axes, LATENCY_PANELS, strict=True):
        for name, rows in groups.items():
            rows = rows.sort_values(rate_key, kind="stable")
            for _, prefix, style in PERCENTILE_STYLES[1:]:
                ax.plot(rows[rate_key], rows[f"{prefix}_{metric}_ms"], linestyle=style, marker="o", markersize=3,
                        color=colors[name])
        limit = slo.get(f"{metric}_ms")
        if limit:
            ax.axhline(limit, color="black", linestyle="-.", linewidth=1.2)
            ax.annotate(f"SLO {limit:g} ms", (0.01, limit), xycoords=("axes fraction", "data"), va="bottom",
                        fontsize=8)
        ax.set_xlabel("offered request rate (req/s)")
        ax.set_ylabel(unit)
        ax.set_title(f"{unit.split(' ')[0]} p90 and p99 vs rate", fontsize=9)
        _log_y_if_wide(ax, frame[[f"p90_{metric}_ms", f"p99_{metric}_ms"]].stack())
        ax.grid(alpha=0.3)
    styles = [(f"{pname}", style) for pname, _, style in PERCENTILE_STYLES[1:]] + [("SLO", "-.")]
    _legend_outside(fig, colors, styles)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, out_dir, "latency_vs_rate", tight=True)


def plot_goodput_vs_rate(results: Results, rate_key: str, slo: dict, title: str, out_dir: Path) -> list[Path]:
    """Goodput (requests meeting every SLO per second) and throughput against the offered rate."""
    frame = results.summaries
    groups = _series(results, frame, exclude=rate_key)
    colors = series_colors(list(groups))
    fig, ax = plt.subplots(figsize=(8, 5))
    rates = frame[rate_key].to_numpy(float)
    ax.plot([0, rates.max()], [0, rates.max()], color="grey", linewidth=1, linestyle=":")
    has_goodput = "request_goodput" in frame
    for name, rows in groups.items():
        rows = rows.sort_values(rate_key, kind="stable")
        if has_goodput:
            ax.plot(rows[rate_key], rows["request_goodput"], marker="o", color=colors[name])
        ax.plot(rows[rate_key], rows["request_throughput"], linestyle="--", marker=".", color=colors[name])
    slo_text = ", ".join(f"{k} <= {v:g}" for k, v in slo.items() if v) or "no SLO set: throughput only"
    ax.set_title(f"goodput (SLO: {slo_text}) and throughput vs rate", fontsize=9)
    ax.set_xlabel("offered request rate (req/s)")
    ax.set_ylabel("requests per second")
    ax.grid(alpha=0.3)
    styles = ([("goodput", "-")] if has_goodput else []) + [("throughput", "--"), ("offered load", ":")]
    _legend_outside(fig, colors, styles)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, out_dir, "goodput_vs_rate", tight=True)


def _legend_outside(fig, colors: dict, styles: list[tuple[str, str]]) -> None:  # noqa: ANN001 - Figure
    """One legend right of the plots: a colour per series, then what each line style means."""
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=c, marker="o", markersize=4, label=name) for name, c in colors.items()]
    handles += [Line2D([], [], color="black", linestyle=style, label=name) for name, style in styles]
    fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)


def _series(results: Results, frame: pd.DataFrame, *, exclude: str) -> dict[str, pd.DataFrame]:
    """Rows grouped into lines: by policy label, variant and every swept key except `exclude`.

    A `policy.X` key that a policy does not have (chunk_size for continuous batching) does not
    split that policy's line: against such a key the policy draws one flat reference line."""
    groups: dict[str, list[int]] = {}
    for index, row in frame.iterrows():
        others = [k for k in results.keys if k != exclude and applies(k, str(row.get("policy")))]
        groups.setdefault(results.series_name(row, with_keys=others), []).append(index)
    # Within a line each x appears once; repeats come from keys that do not apply, so they are equal.
    return {name: frame.loc[rows].drop_duplicates(subset=[exclude]) for name, rows in groups.items()}


def applies(key: str, policy_name: str) -> bool:
    """Whether swept `key` can change this policy's run (a `policy.X` key needs the field X)."""
    if not key.startswith(POLICY_PREFIX):
        return True
    model = POLICY_MODELS.get(policy_name)
    return model is None or key[len(POLICY_PREFIX):].split(".")[0] in model.model_fields


def _axis(frame: pd.DataFrame, key: str) -> tuple[np.ndarray, list | None]:
    """x positions for `key`: the values themselves when numeric, else 0..n-1 in sweep order."""
    values = frame[key].tolist()
    if all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in values):
        return np.asarray(values, dtype=float), None
    categories = list(dict.fromkeys(str(v) for v in values))
    return np.asarray([categories.index(str(v)) for v in values], dtype=float), categories


def _format_x(bottom_axes, frame: pd.DataFrame, key: str, ticks: list | None, keys: list[str]) -> None:  # noqa: ANN001
    for ax in bottom_axes:
        ax.set_xlabel(key)
        if ticks is not None:
            ax.set_xticks(range(len(ticks)), ticks, rotation=20, fontsize=8)
            continue
        values = sorted(set(frame[key].astype(float)))
        if values and values[0] > 0 and values[-1] / values[0] >= 8:
            # Batch and chunk sizes are usually powers of two: space them evenly.
            ax.set_xscale("log", base=2)
        ax.set_xticks(values, [f"{v:g}" for v in values], fontsize=8)
        ax.minorticks_off()


def _log_y_if_wide(ax, values: pd.Series) -> None:  # noqa: ANN001 - matplotlib Axes
    v = pd.to_numeric(values, errors="coerce").to_numpy(float)
    v = v[np.isfinite(v) & (v > 0)]
    if v.size and v.max() / v.min() > 50:
        ax.set_yscale("log")
