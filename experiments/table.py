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
