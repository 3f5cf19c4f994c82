"""Per-step records: one tuple per step (cheap to append), turned into columns at the end."""

from __future__ import annotations

from typing import Any

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


class StepLog:
    def __init__(self) -> None:
        self.rows: list[tuple] = []
        # Columns only some steps have (a cost model's measurements, link time): step -> value.
        self.extras: dict[str, dict[int, float]] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def append(self, values: tuple, extras: dict[str, float] | None = None) -> None:
        if extras:
            index = len(self.rows)
            for key, value in extras.items():
                self.extras.setdefault(key, {})[index] = value
        self.rows.append(values)

    def extend(self, rows: list[tuple]) -> None:
        self.rows.extend(rows)

    @property
    def columns(self) -> dict[str, list[Any]]:
        return self.as_dict()

    def as_dict(self) -> dict[str, list[Any]]:
        n = len(self.rows)
        if n:
            out = {name: list(column) for name, column in zip(STEP_COLUMNS, zip(*self.rows))}
        else:
            out = {name: [] for name in STEP_COLUMNS}
        nan = float("nan")
        for key, values in self.extras.items():
            out[key] = [values.get(i, nan) for i in range(n)]
        return out
