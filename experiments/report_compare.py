"""`servesim compare`: a real vLLM benchmark against simulated policies, as a table and a plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from experiments.io import path_under, write_json
from experiments.plots import describe_setup, plt, save_figure, series_colors
from experiments.report import clean_row
from experiments.report_load import load_results, read_policy_table, read_resolved, read_run_info
from experiments.table import format_table
from experiments.vllm_interop import (
    LATENCY_METRICS,
    STAT_RE,
    compare_rows,
    read_vllm,
    stat_order,
    to_vllm,
    workload_notes,
)
from simcore.errors import ConfigError


def compare(real_path: Path, sim_path: Path, *, policies: list[str] | None = None, out: Path | None = None,
            plot: bool = True) -> str:
    real = read_vllm(real_path)
    sims, title, default_out = _load_sims(Path(sim_path), policies or [])
    out = out or default_out
    table_rows = _table_rows(real, sims)
    columns = [("metric", "metric", "{}"), ("real", "real", "{:.4g}")]
    for name in sims:
        columns += [(name, name, "{:.4g}"), ("err %", f"{name} err", "{:+.1f}")]
    lines = [f"real: {real_path} ({real.get('model_id')}, {real.get('num_prompts')} prompts, "
             f"rate {real.get('request_rate')}) vs simulated: {sim_path}", format_table(table_rows, columns)]
    for name, sim in sims.items():
        lines += [f"note: {name}: {n}" for n in workload_notes(real, sim)]
    write_json(path_under(out, "compare.json"), {"real": str(real_path), "sim": str(sim_path),
                                      "rows": {name: compare_rows(real, sim) for name, sim in sims.items()}})
    if plot:
        plot_compare(real, sims, f"{title}\nvs real: {Path(real_path).name} ({real.get('model_id')})", out)
        lines.append(f"plot: {out / 'compare.png'}")
    return "\n".join(lines)


def _load_sims(sim_path: Path, policies: list[str]) -> tuple[dict[str, dict[str, Any]], str, Path]:
    """Simulated results in vLLM layout, by policy label (or by file name for a JSON)."""
    if sim_path.suffix == ".json":
        return {sim_path.stem: read_vllm(sim_path)}, f"simulated: {sim_path.name}", sim_path.parent / "compare"
    results = load_results(sim_path)
    if results.kind != "run":
        raise ConfigError("compare needs one workload: give a run folder, or one sweep point "
                          "(DIR/points/<point_id>)", source=str(sim_path))
    rows = [clean_row(r) for r in results.summaries.to_dict(orient="records")]
    known = [r["label"] for r in rows]
    for name in policies:
        if name not in known:
            raise ConfigError("no such policy label", where="--policy", expected=f"one of {known}", found=name,
                              choices=known)
    resolved = read_resolved(results.root)
    sims = {}
    for row in rows:
        if policies and row["label"] not in policies:
            continue
        folder = results.policy_folder(row)
        sims[row["label"]] = to_vllm(row, read_policy_table(folder, "requests"), read_policy_table(folder, "steps"),
                                     resolved, date="")
    return sims, describe_setup(resolved, read_run_info(results.root)), results.root / "compare"


def _table_rows(real: dict[str, Any], sims: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    by_metric: dict[str, dict[str, Any]] = {}
    for name, sim in sims.items():
        for row in compare_rows(real, sim):
            entry = by_metric.setdefault(row["metric"], {"metric": row["metric"], "real": row["real"]})
            entry[name] = row["sim"]
            entry[f"{name} err"] = None if row["rel_err"] is None else 100.0 * row["rel_err"]
    return list(by_metric.values())


def plot_compare(real: dict[str, Any], sims: dict[str, dict[str, Any]], title: str, out: Path) -> list[Path]:
    """Real vs simulated statistics per latency metric, relative errors, and the TTFT CDFs."""
    names = list(sims)
    colors = series_colors(["real", *names])
    colors["real"] = "#444444"
    fig, axes = plt.subplots(2, 3, figsize=(16, 8.5))
    for ax, metric in zip(axes.flat[:4], LATENCY_METRICS, strict=True):
        stats = [k for k in _stat_keys(real, metric) if all(isinstance(s.get(k), (int, float)) for s in sims.values())]
        x = np.arange(len(stats))
        width = 0.8 / (1 + len(names))
        for i, (name, source) in enumerate([("real", real), *sims.items()]):
            ax.bar(x + (i - len(names) / 2) * width, [source[k] for k in stats], width, color=colors[name], label=name)
        ax.set_xticks(x, [STAT_RE.match(k).group(1) for k in stats])
        ax.set_ylabel(f"{metric.upper()} (ms)")
        ax.set_title(f"{metric.upper()}: real vs simulated", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    _plot_errors(axes.flat[4], real, sims, colors)
    _plot_ttft_cdf(axes.flat[5], real, sims, colors)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, out, "compare")


def _stat_keys(data: dict[str, Any], metric: str) -> list[str]:
    keys = [k for k in data if (m := STAT_RE.match(k)) and m.group(2) == metric and m.group(1) != "std"]
    return sorted(keys, key=lambda k: stat_order(STAT_RE.match(k).group(1)))


def _plot_errors(ax, real: dict[str, Any], sims: dict[str, dict[str, Any]], colors: dict) -> None:  # noqa: ANN001
    rows = {name: [r for r in compare_rows(real, sim) if r["rel_err"] is not None] for name, sim in sims.items()}
    metrics = list(dict.fromkeys(r["metric"] for found in rows.values() for r in found))
    y = np.arange(len(metrics))
    height = 0.8 / max(1, len(rows))
    for i, (name, found) in enumerate(rows.items()):
        errors = {r["metric"]: 100.0 * r["rel_err"] for r in found}
        ax.barh(y + i * height, [errors.get(m, 0.0) for m in metrics], height, color=colors[name], label=name)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(y + height * (len(rows) - 1) / 2, metrics, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("relative error (sim - real) / real (%)")
    ax.set_title("relative error per metric", fontsize=9)
    ax.grid(axis="x", alpha=0.3)


def _plot_ttft_cdf(ax, real: dict[str, Any], sims: dict[str, dict[str, Any]], colors: dict) -> None:  # noqa: ANN001
    drawn = False
    for name, source in [("real", real), *sims.items()]:
        ttfts = source.get("ttfts")
        errors = source.get("errors") or [""] * len(ttfts or [])
        if not ttfts:
            continue
        values = np.sort([t * 1000.0 for t, e in zip(ttfts, errors, strict=False) if not e])
        if values.size:
            ax.step(values, np.arange(1, values.size + 1) / values.size, where="post", color=colors[name], label=name)
            drawn = True
    ax.set_title("TTFT CDF (per-request ttfts)" if drawn else "TTFT CDF: no per-request ttfts in the real file",
                 fontsize=9)
    ax.set_xlabel("TTFT (ms)")
    ax.set_ylabel("fraction of requests")
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=8)
