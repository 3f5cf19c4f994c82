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
)
from simcore.errors import ConfigError

# A simulated workload whose mean prompt or output length, or request rate, is further than this
# from the real one's (relative) is reported as a mismatch: latencies then differ for that reason.
WORKLOAD_TOLERANCE = 0.05
# Relative errors (in %) within +-this are drawn on a linear scale, larger ones logarithmically,
# so that a 19,000% error and a 3% one are both readable on one axis.
ERROR_LINEAR_PERCENT = 10.0


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
    missing = [m.upper() for m in LATENCY_METRICS if not _stat_keys(real, m)]
    if missing:
        lines.append(f"note: the real file has no {'/'.join(missing)} statistics; "
                     "those metrics are left out (vLLM bench serve --percentile-metrics chooses them)")
    mismatches = {name: workload_mismatches(real, sim) for name, sim in sims.items()}
    # Policies of one run share their workload: a mismatch they all have is said once.
    for message in dict.fromkeys(m for found in mismatches.values() for m in found):
        having = [name for name, found in mismatches.items() if message in found]
        whose = "" if len(having) == len(sims) else f" ({', '.join(having)})"
        lines.append(f"warning: workload mismatch{whose}: {message}")
    if any(mismatches.values()):
        lines.append("warning: the errors above include the workload's difference; simulate the real run's "
                     "workload (e.g. its prompts as a trace) for a fair comparison")
    else:
        lines.append(f"workload check: same request count, mean lengths and rate (within "
                     f"{WORKLOAD_TOLERANCE:.0%}) as the real run")
    write_json(path_under(out, "compare.json"), {"real": str(real_path), "sim": str(sim_path),
                                      "rows": {name: compare_rows(real, sim) for name, sim in sims.items()},
                                      "workload_mismatches": mismatches})
    if plot:
        differing = sorted({m.split(" differs")[0] for found in mismatches.values() for m in found})
        warning = f"workload mismatch: {', '.join(differing)} differ" if differing else None
        plot_compare(real, sims, f"{title}\nvs real: {Path(real_path).name} ({real.get('model_id')})", out,
                     warning=warning)
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


def workload_mismatches(real: dict[str, Any], sim: dict[str, Any]) -> list[str]:
    """How the simulated workload differs from the real one: request count, mean prompt and
    output lengths, and request rate (the latter three beyond WORKLOAD_TOLERANCE). Empty when
    they match or the files do not say (a field missing on either side is not checked)."""
    found = []
    real_count, sim_count = _number(real.get("num_prompts")), _number(sim.get("num_prompts"))
    if real_count is not None and sim_count is not None and real_count != sim_count:
        found.append(f"num_prompts differs: real {real_count:g}, simulated {sim_count:g}")
    for what, lens_key, total_key in (("prompt", "input_lens", "total_input_tokens"),
                                      ("output", "output_lens", "total_output_tokens")):
        real_mean, sim_mean = _mean_length(real, lens_key, total_key), _mean_length(sim, lens_key, total_key)
        if real_mean and sim_mean and not _close(real_mean, sim_mean):
            found.append(f"mean {what} length differs: real {real_mean:.1f}, simulated {sim_mean:.1f} tokens")
    # vLLM writes "inf" for all requests at once, which float() reads as infinity.
    real_rate, sim_rate = _number(real.get("request_rate")), _number(sim.get("request_rate"))
    if real_rate is not None and sim_rate is not None and not _close(real_rate, sim_rate):
        found.append(f"request_rate differs: real {real_rate:g}, simulated {sim_rate:g} req/s")
    return found


def _close(real: float, sim: float) -> bool:
    if real == sim:
        return True
    finite = np.isfinite(real) and np.isfinite(sim) and real > 0
    return bool(finite and abs(sim / real - 1) <= WORKLOAD_TOLERANCE)


def _number(value: Any) -> float | None:
    try:
        return float(value) if value is not None and not isinstance(value, bool) else None
    except (TypeError, ValueError):
        return None


def _mean_length(data: dict[str, Any], lens_key: str, total_key: str) -> float | None:
    """Mean tokens per request: from the per-request list, else the total over the count."""
    lens = data.get(lens_key)
    values = [v for v in map(_number, lens) if v is not None] if isinstance(lens, list) else []
    if values:
        return float(np.mean(values))
    total = _number(data.get(total_key))
    count = _number(data.get("completed" if total_key == "total_output_tokens" else "num_prompts"))
    return total / count if total is not None and count else None


def _table_rows(real: dict[str, Any], sims: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    by_metric: dict[str, dict[str, Any]] = {}
    for name, sim in sims.items():
        for row in compare_rows(real, sim):
            entry = by_metric.setdefault(row["metric"], {"metric": row["metric"], "real": row["real"]})
            entry[name] = row["sim"]
            entry[f"{name} err"] = None if row["rel_err"] is None else 100.0 * row["rel_err"]
    return list(by_metric.values())


def plot_compare(real: dict[str, Any], sims: dict[str, dict[str, Any]], title: str, out: Path, *,
                 warning: str | None = None) -> list[Path]:
    """Real vs simulated statistics for each latency metric the real file has, the relative
    errors on a symmetric-log axis, and the TTFT CDFs: one figure, sized for a paper's page."""
    names = list(sims)
    colors = series_colors(["real", *names])
    colors["real"] = "#444444"
    metrics = [m for m in LATENCY_METRICS if _shared_stat_keys(real, sims, m)]
    columns = max(2, len(metrics))
    fig, axes = plt.subplots(2, columns, figsize=(3.2 * columns, 6.4), squeeze=False)
    for ax, metric in zip(axes[0], metrics, strict=False):
        _plot_metric(ax, metric, real, sims, colors)
    for ax in axes[0][len(metrics):]:
        ax.set_visible(False)
    if metrics:
        axes[0][0].legend(fontsize=7)
    # The bottom row: errors across half the width (at least one column), the CDF beside them.
    grid = axes[1][0].get_gridspec()
    for ax in axes[1]:
        ax.remove()
    split = (columns + 1) // 2
    _plot_errors(fig.add_subplot(grid[1, :split]), real, sims, colors)
    _plot_ttft_cdf(fig.add_subplot(grid[1, split:]), real, sims, colors)
    fig.suptitle(title + (f"\n{warning}" if warning else ""), fontsize=9)
    fig.tight_layout()
    return save_figure(fig, out, "compare")


def _plot_metric(ax, metric: str, real: dict[str, Any], sims: dict[str, dict[str, Any]],  # noqa: ANN001
                 colors: dict) -> None:
    """Grouped bars of one metric's statistics; a log axis when the values span over 10x, so that
    a far-off simulation does not flatten the real bars."""
    stats = _shared_stat_keys(real, sims, metric)
    sources = [("real", real), *sims.items()]
    x = np.arange(len(stats))
    width = 0.8 / len(sources)
    for i, (name, source) in enumerate(sources):
        ax.bar(x + (i - (len(sources) - 1) / 2) * width, [source[k] for k in stats], width, color=colors[name],
               label=name)
    values = [source[k] for _, source in sources for k in stats if source[k] > 0]
    if values and max(values) > 10 * min(values):
        ax.set_yscale("log")
    ax.set_xticks(x, [STAT_RE.match(k).group(1) for k in stats], fontsize=8)
    ax.set_ylabel(f"{metric.upper()} (ms)", fontsize=8)
    ax.set_title(f"{metric.upper()}: real vs simulated", fontsize=9)
    ax.tick_params(axis="y", labelsize=7)
    ax.grid(axis="y", alpha=0.3)


def _shared_stat_keys(real: dict[str, Any], sims: dict[str, dict[str, Any]], metric: str) -> list[str]:
    """The real file's statistics of `metric` that every simulated result has too."""
    return [k for k in _stat_keys(real, metric) if all(isinstance(s.get(k), (int, float)) for s in sims.values())]


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
    # Linear within +-ERROR_LINEAR_PERCENT, logarithmic beyond: 3% and 19,000% on one readable axis.
    ax.set_xscale("symlog", linthresh=ERROR_LINEAR_PERCENT)
    ax.xaxis.set_major_formatter(lambda value, _: f"{value:+,.0f}%" if value else "0")
    for side in (-1, 1):
        ax.axvline(side * ERROR_LINEAR_PERCENT, color="grey", linewidth=0.5, linestyle=":")
    ax.set_yticks(y + height * (len(rows) - 1) / 2, metrics, fontsize=7)
    ax.tick_params(axis="x", labelsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"relative error (sim - real) / real; linear within +-{ERROR_LINEAR_PERCENT:g}%, log beyond",
                  fontsize=8)
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
    ax.set_xlabel("TTFT (ms)", fontsize=8)
    ax.set_ylabel("fraction of requests", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=8)
