"""Comparison tables for the terminal (at most 100 columns wide), and the same tables as CSV or Markdown.

Names and units follow the printout of vLLM's `bench serve` ("Request throughput (req/s)",
"Median TTFT (ms)", ...), so numbers read the same in both tools.
"""

from __future__ import annotations

import csv
import io
import textwrap
from collections.abc import Sequence

# (header, summary key, format)
Column = tuple[str, str, str]

# How `--table` prints a table: aligned text, CSV, or a Markdown table.
TABLE_STYLES = ("text", "csv", "markdown")
# Text tables wrap to fit a terminal this wide.
TABLE_WIDTH = 100

SUMMARY_COLUMNS: tuple[Column, ...] = (
    ("Policy", "label", "{}"),
    ("Successful requests", "completed", "{:d}"),
    ("Rejected requests", "num_rejected", "{:d}"),
    ("Request throughput (req/s)", "request_throughput", "{:.2f}"),
    ("Output token throughput (tok/s)", "output_throughput", "{:.0f}"),
    ("Median TTFT (ms)", "median_ttft_ms", "{:.1f}"),
    ("P90 TTFT (ms)", "p90_ttft_ms", "{:.1f}"),
    ("P99 TTFT (ms)", "p99_ttft_ms", "{:.1f}"),
    ("Median TPOT (ms)", "median_tpot_ms", "{:.2f}"),
    ("P90 TPOT (ms)", "p90_tpot_ms", "{:.2f}"),
    ("P99 TPOT (ms)", "p99_tpot_ms", "{:.2f}"),
    ("Median E2EL (ms)", "median_e2el_ms", "{:.0f}"),
    ("Preemptions", "num_preemptions", "{:d}"),
)
# The columns a one-line-per-point table keeps: the policy and the latency percentiles.
LATENCY_COLUMNS: tuple[Column, ...] = SUMMARY_COLUMNS[:1] + SUMMARY_COLUMNS[5:11]

# Shown only when some row has a nonzero value: prefix caching and the host tier.
OPTIONAL_COLUMNS: tuple[Column, ...] = (
    ("Prefix cache hit rate", "prefix_cache_hit_rate", "{:.1%}"),
    ("Swapped out (GB)", "bytes_swapped_out", "{:.2f}"),
    ("Swapped in (GB)", "bytes_swapped_in", "{:.2f}"),
    ("Host link busy (s)", "transfer_time_s", "{:.2f}"),
    ("Mean swap delay (ms)", "mean_swap_delay_ms", "{:.0f}"),
    ("Mean recompute delay (ms)", "mean_recompute_delay_ms", "{:.0f}"),
)
GB_KEYS = ("bytes_swapped_out", "bytes_swapped_in")
GAP = "  "
# A text table's header wraps onto lines about this wide (or its longest word, or its values).
HEADER_WIDTH = 8


def summary_columns(rows: Sequence[dict]) -> list[Column]:
    columns = list(SUMMARY_COLUMNS)
    for column in OPTIONAL_COLUMNS:
        if any(row.get(column[1]) for row in rows):
            columns.append(column)
    return columns


def format_summary_table(rows: Sequence[dict], style: str = "text", width: int = TABLE_WIDTH) -> str:
    """The run summary: in text, one column per policy (metrics as rows, as `bench serve` prints
    them); as CSV or Markdown, one row per policy."""
    scaled = [{**row, **{k: row[k] / 1e9 for k in GB_KEYS if row.get(k) is not None}} for row in rows]
    columns = summary_columns(rows)
    if style == "text":
        return format_vertical(scaled, columns, width=width)
    return format_table(scaled, columns, style=style)


def title(text: str, style: str = "text") -> str:
    """A line naming the table below it: a comment line in CSV, a heading in Markdown."""
    return {"csv": f"# {text}", "markdown": f"### {text}"}.get(style, text)


def format_cell(row: dict, key: str, fmt: str) -> str:
    value = row.get(key)
    return "-" if value is None else fmt.format(value)


def format_table(rows: Sequence[dict], columns: Sequence[Column] = SUMMARY_COLUMNS, *, style: str = "text",
                 width: int = TABLE_WIDTH, keys: int = 1) -> str:
    """One line per row. In text, the columns after the first `keys` wrap into blocks that fit
    `width`, each block repeating the key columns."""
    header = [name for name, _, _ in columns]
    cells = [[format_cell(row, key, fmt) for _, key, fmt in columns] for row in rows]
    if style == "csv":
        return _csv([header, *cells])
    if style == "markdown":
        return _markdown(header, cells, keys)
    if style != "text":
        raise ValueError(f"unknown table style {style!r}")
    # Long headers go on several lines, so a column is about as wide as its values.
    widths = [max([len(line[i]) for line in cells] + [min(len(header[i]), HEADER_WIDTH) if i >= keys else 0,
                                                       *map(len, header[i].split())])
              for i in range(len(columns))]
    wrapped = [textwrap.wrap(name, widths[i]) or [""] for i, name in enumerate(header)]
    widths = [max(column_width, *map(len, lines)) for column_width, lines in zip(widths, wrapped)]
    depth = max(map(len, wrapped))
    # Bottom-aligned, so each header's last line sits on the rule.
    header_lines = [[([""] * (depth - len(lines)) + lines)[n] for lines in wrapped] for n in range(depth)]
    blocks = _blocks(widths, keys, width)
    return "\n\n".join(_aligned([*header_lines, *cells], widths, block, keys, header_lines=depth)
                        for block in blocks)


def format_vertical(rows: Sequence[dict], columns: Sequence[Column], *, width: int = TABLE_WIDTH) -> str:
    """Metrics as rows and one column per row of `rows` (headed by its first column's value),
    wrapping the columns into blocks that fit `width`."""
    first, *metrics = columns
    header = ["", *(format_cell(row, first[1], first[2]) for row in rows)]
    lines = [header] + [[name, *(format_cell(row, key, fmt) for row in rows)] for name, key, fmt in metrics]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    blocks = _blocks(widths, 1, width)
    return "\n\n".join(_aligned(lines, widths, block, 1, header_lines=1) for block in blocks)


def _blocks(widths: list[int], keys: int, width: int) -> list[list[int]]:
    """The indexes of the non-key columns, split into runs that fit `width` beside the key
    columns (a column wider than that gets a block of its own)."""
    used = sum(widths[:keys]) + len(GAP) * max(keys - 1, 0)
    blocks: list[list[int]] = [[]]
    line = used
    for index in range(keys, len(widths)):
        if blocks[-1] and line + len(GAP) + widths[index] > width:
            blocks.append([])
            line = used
        blocks[-1].append(index)
        line += len(GAP) + widths[index]
    return blocks


def _aligned(lines: list[list[str]], widths: list[int], block: list[int], keys: int, *, header_lines: int) -> str:
    shown = [*range(keys), *block]
    out = []
    for n, line in enumerate(lines):
        text = GAP.join(line[i].ljust(widths[i]) if i < keys else line[i].rjust(widths[i]) for i in shown).rstrip()
        if text or n >= header_lines:  # a header line blank in this block is left out
            out.append(text)
        if n == header_lines - 1:
            out.append(GAP.join("-" * widths[i] for i in shown))
    return "\n".join(out)


def _csv(lines: list[list[str]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    # A missing value is an empty field, as CSV readers expect, not the text tables' "-".
    writer.writerows([["" if cell == "-" else cell for cell in line] for line in lines])
    return buffer.getvalue().rstrip("\n")


def _markdown(header: list[str], cells: list[list[str]], keys: int) -> str:
    def line(values: list[str]) -> str:
        return "| " + " | ".join(v.replace("|", "\\|") for v in values) + " |"

    rule = ["---" if i < keys else "---:" for i in range(len(header))]
    return "\n".join([line(header), line(rule), *(line(row) for row in cells)])
