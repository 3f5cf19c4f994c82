"""Per-step records: one tuple per step, or columns for a run of steps; kept as column chunks.

Rows are buffered and turned into numpy column chunks every CHUNK_ROWS steps, so memory per
step is a few dozen bytes; with a spill file the chunks go to Parquet instead, so a run of
millions of steps keeps none of them in memory.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

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
CHUNK_ROWS = 16384  # rows buffered as Python objects before they become numpy columns


class StepLog:
    def __init__(self, spill_path: Path | None = None) -> None:
        # Single steps arrive as row tuples; runs of steps as columns. Both wait in `columns`
        # (rows are moved there when a run comes) until a chunk is sealed.
        self.rows: list[tuple] = []
        self.columns: list[list] = [[] for _ in STEP_COLUMNS]
        self.chunks: list[dict[str, np.ndarray]] = []
        self.num_rows = 0
        # Columns only some steps have (a cost model's measurements, link time): step -> value.
        self.extras: dict[str, dict[int, float]] = {}
        self.spill_path = spill_path
        self._writer = None
        self._spilled = False
        self.extra_totals: dict[str, float] = {}

    def __len__(self) -> int:
        return self.num_rows

    def append(self, values: tuple, extras: dict[str, float] | None = None) -> None:
        if extras:
            for key, value in extras.items():
                self.extras.setdefault(key, {})[self.num_rows] = value
                self.extra_totals[key] = self.extra_totals.get(key, 0.0) + value
        self.rows.append(values)
        self.num_rows += 1
        if self.num_buffered >= CHUNK_ROWS:
            self._seal()

    def extend_columns(self, columns: Sequence[Iterable]) -> None:
        """A run of steps, one iterable per column of STEP_COLUMNS (all of one length)."""
        self._rows_to_columns()
        before = len(self.columns[0])
        for column, values in zip(self.columns, columns):
            column.extend(values)
        added = len(self.columns[0]) - before
        self.num_rows += added
        if self.num_buffered >= CHUNK_ROWS:
            self._seal()

    @property
    def num_buffered(self) -> int:
        """Steps not yet sealed into a chunk."""
        return len(self.rows) + len(self.columns[0])

    def _rows_to_columns(self) -> None:
        if self.rows:
            for column, values in zip(self.columns, zip(*self.rows)):
                column.extend(values)
            self.rows = []

    def _seal(self) -> None:
        self._rows_to_columns()
        if not self.num_buffered:
            return
        first = self.num_rows - self.num_buffered
        chunk = {
            name: np.asarray(column, dtype=np.float64 if name in FLOAT_COLUMNS else np.int64)
            for name, column in zip(STEP_COLUMNS, self.columns)
        }
        self.columns = [[] for _ in STEP_COLUMNS]
        if self.spill_path is None:
            self.chunks.append(chunk)
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        nan = float("nan")
        for key, values in self.extras.items():
            chunk[key] = np.asarray([values.pop(i, nan) for i in range(first, first + len(chunk["step_id"]))])
        table = pa.table(chunk)
        if self._writer is None:
            self._writer = pq.ParquetWriter(self.spill_path, table.schema)
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
            self._writer.close()
            self._writer = None

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
