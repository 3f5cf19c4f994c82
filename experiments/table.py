"""Plain-text comparison tables for the terminal."""

from __future__ import annotations

from collections.abc import Sequence

# (header, summary key, format)
SUMMARY_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("policy", "label", "{}"),
    ("done", "completed", "{:d}"),
    ("rej", "num_rejected", "{:d}"),
    ("req/s", "request_throughput", "{:.2f}"),
    ("out tok/s", "output_throughput", "{:.0f}"),
    ("TTFT p50", "median_ttft_ms", "{:.1f}"),
    ("TTFT p90", "p90_ttft_ms", "{:.1f}"),
    ("TTFT p99", "p99_ttft_ms", "{:.1f}"),
    ("TPOT p50", "median_tpot_ms", "{:.2f}"),
    ("TPOT p90", "p90_tpot_ms", "{:.2f}"),
    ("TPOT p99", "p99_tpot_ms", "{:.2f}"),
    ("E2EL p50", "median_e2el_ms", "{:.0f}"),
    ("preempt", "num_preemptions", "{:d}"),
)


# Shown only when some row has a nonzero value: prefix caching and the host tier.
OPTIONAL_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("hit rate", "prefix_cache_hit_rate", "{:.1%}"),
    ("swap GB out", "bytes_swapped_out", "{:.2f}"),
    ("swap GB in", "bytes_swapped_in", "{:.2f}"),
    ("link s", "transfer_time_s", "{:.2f}"),
    ("swap delay ms", "mean_swap_delay_ms", "{:.0f}"),
    ("recompute delay ms", "mean_recompute_delay_ms", "{:.0f}"),
)
GB_KEYS = ("bytes_swapped_out", "bytes_swapped_in")


def summary_columns(rows: Sequence[dict]) -> list[tuple[str, str, str]]:
    columns = list(SUMMARY_COLUMNS)
    for column in OPTIONAL_COLUMNS:
        if any(row.get(column[1]) for row in rows):
            columns.append(column)
    return columns


def format_summary_table(rows: Sequence[dict]) -> str:
    scaled = [{**row, **{k: row[k] / 1e9 for k in GB_KEYS if row.get(k) is not None}} for row in rows]
    return format_table(scaled, summary_columns(rows))


def format_table(rows: Sequence[dict], columns: Sequence[tuple[str, str, str]] = SUMMARY_COLUMNS) -> str:
    cells = [[header for header, _, _ in columns]]
    for row in rows:
        line = []
        for _, key, fmt in columns:
            value = row.get(key)
            line.append("-" if value is None else fmt.format(value))
        cells.append(line)
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    out = []
    for n, line in enumerate(cells):
        out.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))))
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)
