"""Per-step records: one tuple per step, or columns for a run of steps; kept as column chunks.

Within a run most columns hold one value, or one until the last step, so a run is kept as the
tuple of its columns (a value or (value, last) pair each; lists for the columns that change
every step: ids, times) and expanded a chunk of runs at a time, in bulk. The counts a run's
steps derive from a few numbers (decoders, running requests, blocks, resident tokens: see
`simcore.run_counts`) are filled in for a whole chunk at once when it is sealed.

The per-step columns go into typed arrays as they come, while their values are fresh in the
cache: a long run makes millions of step times, and reading them back as Python floats when a
chunk is sealed, scattered through memory by then, cost a cache miss each (about 100 ns a
value on the 1M reference run, against some 15 ns to take each in as it comes); and a run's
other columns are kept without them, so that the floats are freed while they are fresh too.

Rows are buffered and turned into numpy column chunks every CHUNK_ROWS steps, so memory per
step is a few dozen bytes; with a spill file the chunks go to Parquet instead, so a run of
millions of steps keeps none of them in memory.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from simcore.run_counts import RunCounts, expand_run_counts

STEP_COLUMNS = (
    "step_id",
    "start_s",
    "duration_s",
    "num_seqs",
    "num_prefill_tokens",
    "num_decode_tokens",
    "num_selected",
    "num_running",
    "num_waiting",
    "num_swapped",
    "kv_blocks_used",
    "kv_blocks_shared",
    "host_blocks_used",
    "resident_tokens",
    "num_preempted",
    "blocks_swapped_out",
    "blocks_swapped_in",
    "blocks_copied",
)
FLOAT_COLUMNS = {"start_s", "duration_s"}
# Columns that change at every step of a run come as a value per step; the others, which within
# a run mostly hold one value (or one until its last step), as that value. Counts that a run
# derives (`RunCounts`) are filled in when the chunk is sealed.
PER_STEP_COLUMNS = {"step_id", "start_s", "duration_s"}
CHUNK_ROWS = 16384  # rows buffered as Python objects before they become numpy columns

_DTYPES = tuple(np.float64 if name in FLOAT_COLUMNS else np.int64 for name in STEP_COLUMNS)
# The buffers take them from the first three places of a row (or a run's columns), and keep the rest.
assert all(name in PER_STEP_COLUMNS for name in STEP_COLUMNS[:3]) and len(PER_STEP_COLUMNS) == 3
_NUM_PER_STEP = len(PER_STEP_COLUMNS)
# Typed-array codes of the per-step columns (int64, float64).
_ARRAY_CODES = tuple("d" if name in FLOAT_COLUMNS else "q" for name in STEP_COLUMNS[:_NUM_PER_STEP])
# Integer columns delta-encoded and not compressed, the times compressed: on the 100k reference
# run's 942k steps, 17% less write time than dictionary pages and snappy, and a file 18% smaller.
_INT_COLUMNS = [name for name in STEP_COLUMNS if name not in FLOAT_COLUMNS]
_WRITE_OPTIONS = {
    "use_dictionary": False,
    "column_encoding": dict.fromkeys(_INT_COLUMNS, "DELTA_BINARY_PACKED"),
    "compression": {**dict.fromkeys(_INT_COLUMNS, "none"), **dict.fromkeys(FLOAT_COLUMNS, "snappy")},
}


class StepLog:
    def __init__(self, spill_path: Path | None = None) -> None:
        # Steps are buffered as runs, in order: a run's columns but the per-step ones (`runs`:
        # see `add_run`; a single step's row is a run of one) and its length (`run_lengths`),
        # turned into columns when the chunk is sealed; the per-step columns' values are
        # gathered as they come (`run_steps`: a typed array per column).
        self.runs: list[Sequence[Any]]
        self.run_lengths: list[int]
        self.run_steps: tuple[array, ...]
        self._num_buffered: int
        self._reset_buffers()
        self.chunks: list[dict[str, np.ndarray]] = []
        self.num_rows = 0
        # Columns only some steps have (a cost model's measurements, link time): step -> value.
        self.extras: dict[str, dict[int, float]] = {}
        self.spill_path = spill_path
        self._writer = None
        # Spill files after the first, when an extra column appears once the first was opened.
        self._parts: list[Path] = []
        self._schema = None
        self._spilled = False
        self.extra_totals: dict[str, float] = {}

    def __len__(self) -> int:
        return self.num_rows

    def append(self, values: tuple, extras: dict[str, float] | None = None) -> None:
        """One step's row: a value per column of STEP_COLUMNS."""
        if extras:
            for key, value in extras.items():
                self.extras.setdefault(key, {})[self.num_rows] = value
                self.extra_totals[key] = self.extra_totals.get(key, 0.0) + value
        self.runs.append(values[_NUM_PER_STEP:])
        self.run_lengths.append(1)
        step_ids, starts, durations = self.run_steps
        step_ids.append(values[0])
        starts.append(values[1])
        durations.append(values[2])
        self.num_rows += 1
        self._num_buffered += 1
        if self._num_buffered >= CHUNK_ROWS:
            self._seal()

    def add_run(self, num_steps: int, columns: Sequence[Any], derived: RunCounts | None = None) -> None:
        """A run of `num_steps` steps, one entry per column of STEP_COLUMNS: for the per-step
        columns, their values (an iterable of that length); for the others, one value for
        every step, a (value, last) pair (one value for every step but the last), or a list
        of every step's values. With `derived`, the columns it derives (see
        `expand_run_counts`) come from it, whatever `columns` holds for them. The columns but
        the per-step ones are kept as given (the caller must not change them) and expanded a
        chunk at a time: a run costs one append, not one per column."""
        if derived is not None:
            self._derived_runs.append((self._num_buffered, derived))
        self.runs.append(columns[_NUM_PER_STEP:])
        self.run_lengths.append(num_steps)
        step_ids, starts, durations = self.run_steps
        step_ids.extend(columns[0])
        starts.extend(columns[1])
        durations.extend(columns[2])
        self.num_rows += num_steps
        self._num_buffered += num_steps
        if self._num_buffered >= CHUNK_ROWS:
            self._seal()

    def _reset_buffers(self) -> None:
        self.runs = []
        self.run_lengths = []
        self.run_steps = tuple(array(code) for code in _ARRAY_CODES)
        self._num_buffered = 0
        # Runs whose counts are derived at sealing: (first row among the buffered rows, counts).
        self._derived_runs: list[tuple[int, RunCounts]] = []

    def _buffered_columns(self) -> list[np.ndarray]:
        """The buffered steps as one array per column, in step order."""
        derived, rows = self._derived_columns()
        out = []
        for name, dtype, values in zip(STEP_COLUMNS, _DTYPES, self.run_steps):
            column = np.frombuffer(values, dtype=dtype).copy()
            if len(column) != self._num_buffered:
                raise ValueError(f"step log column {name}: {len(column)} values for {self._num_buffered} steps")
            out.append(column)
        by_column = list(zip(*self.runs)) if self.runs else [()] * (len(STEP_COLUMNS) - _NUM_PER_STEP)
        lengths = np.array(self.run_lengths, dtype=np.int64)
        for name, dtype, entries in zip(STEP_COLUMNS[_NUM_PER_STEP:], _DTYPES[_NUM_PER_STEP:], by_column):
            column = _expand_run_column(entries, lengths, dtype)
            if name in derived:
                column[rows] = derived[name]
            out.append(column)
        return out

    def _derived_columns(self) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
        """The derived runs' columns, and their rows among the buffered rows."""
        if not self._derived_runs:
            return {}, None
        first_rows = np.array([first for first, _ in self._derived_runs], dtype=np.int64)
        lengths = np.array([run.num_steps for _, run in self._derived_runs], dtype=np.int64)
        within = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        return expand_run_counts([run for _, run in self._derived_runs]), np.repeat(first_rows, lengths) + within

    def _seal(self) -> None:
        if not self._num_buffered:
            return
        first = self.num_rows - self._num_buffered
        chunk = dict(zip(STEP_COLUMNS, self._buffered_columns()))
        self._reset_buffers()
        if self.spill_path is None:
            self.chunks.append(chunk)
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        nan = float("nan")
        for key, values in self.extras.items():
            chunk[key] = np.asarray([values.pop(i, nan) for i in range(first, first + len(chunk["step_id"]))])
        table = pa.table(chunk)
        if self._writer is not None and not table.schema.equals(self._writer.schema):
            # A column first seen in this chunk (an extra: a swap's link time, say; extras are
            # never dropped once seen). A file's columns are fixed when it is opened, so the rest
            # goes to a new part, and `close` merges the parts.
            self._writer.close()
            self._writer = None
            self._parts.append(self.spill_path.with_name(f"{self.spill_path.name}.part{len(self._parts) + 1}"))
        if self._writer is None:
            path = self._parts[-1] if self._parts else self.spill_path
            self._writer = pq.ParquetWriter(path, table.schema, **_WRITE_OPTIONS)
            self._spilled = True
        self._writer.write_table(table)

    @property
    def spilled(self) -> bool:
        return self._spilled

    def move_spill(self, path: Path) -> None:
        """Give the (closed) spill file its final name; later reads follow it there."""
        self.close()
        os.replace(self.spill_path, path)
        self.spill_path = path

    def close(self) -> None:
        """Flush a spill file (the caller renames it into place)."""
        self._seal()
        if self._writer is not None:
            self._schema = self._writer.schema
            self._writer.close()
            self._writer = None
        if self._parts:
            self._merge_parts()

    def _merge_parts(self) -> None:
        """One spill file from its parts (see `_seal`), row group by row group (memory stays at
        a chunk's): the columns a part lacks are NaN there, as `as_dict` fills them in memory."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        assert self.spill_path is not None and self._schema is not None
        schema = self._schema  # the last part's: every column, in the order they were first seen
        merged = self.spill_path.with_name(f"{self.spill_path.name}.merged")
        with pq.ParquetWriter(merged, schema, **_WRITE_OPTIONS) as writer:
            for path in [self.spill_path, *self._parts]:
                source = pq.ParquetFile(path)
                for group in range(source.num_row_groups):
                    table = source.read_row_group(group)
                    for name in schema.names:
                        if name not in table.column_names:
                            table = table.append_column(name, pa.array(np.full(table.num_rows, np.nan)))
                    writer.write_table(table.select(schema.names))
        for path in self._parts:
            path.unlink()
        os.replace(merged, self.spill_path)
        self._parts = []

    def as_dict(self) -> dict[str, Any]:
        """Every step as columns (numpy arrays); reads a spill file back if there is one."""
        if self._spilled:
            import pyarrow.parquet as pq

            self.close()
            table = pq.read_table(self.spill_path)
            return {name: table.column(name).to_numpy() for name in table.column_names}
        self._seal_in_memory()
        out: dict[str, Any] = {}
        for name in STEP_COLUMNS:
            parts = [chunk[name] for chunk in self.chunks]
            dtype = np.float64 if name in FLOAT_COLUMNS else np.int64
            out[name] = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
        nan = float("nan")
        for key, values in self.extras.items():
            out[key] = np.asarray([values.get(i, nan) for i in range(self.num_rows)], dtype=np.float64)
        return out

    def _seal_in_memory(self) -> None:
        spill, self.spill_path = self.spill_path, None
        try:
            self._seal()
        finally:
            self.spill_path = spill


def _expand_run_column(entries: Sequence[Any], lengths: np.ndarray, dtype: type) -> np.ndarray:
    """One column of runs (an entry per run, in any of `StepLog.add_run`'s forms) as a value
    per step. Most columns hold one value per run, some a (body, last) pair: those in bulk; the
    few runs with every step's values (lists) are then written over their rows."""
    first = entries[0] if entries else None
    if type(first) is int and entries.count(first) == len(entries):  # one value throughout (swaps, copies...)
        return np.full(int(lengths.sum()), first, dtype=dtype)
    kinds = set(map(type, entries))
    if tuple not in kinds and list not in kinds:
        return np.repeat(np.array(entries, dtype=dtype), lengths)
    # A list's first and last values stand for it in the bulk pass (its rows are then written).
    body = [entry[0] if type(entry) is tuple or type(entry) is list else entry for entry in entries]
    column = np.repeat(np.array(body, dtype=dtype), lengths)
    ends = np.cumsum(lengths)
    column[ends - 1] = [entry[-1] if type(entry) is tuple or type(entry) is list else entry for entry in entries]
    if list in kinds:
        ends, run_lengths = ends.tolist(), lengths.tolist()
        for index in [index for index, entry in enumerate(entries) if type(entry) is list]:
            values, end = entries[index], ends[index]
            if len(values) != run_lengths[index]:
                raise ValueError(f"step log: a run of {run_lengths[index]} steps has {len(values)} values in a column")
            column[end - len(values):end] = values
    return column
