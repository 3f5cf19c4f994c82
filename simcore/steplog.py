"""Per-step records, kept as columns (cheap to append, one DataFrame at the end)."""

from __future__ import annotations

from collections import defaultdict
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
        self.columns: dict[str, list[Any]] = {name: [] for name in STEP_COLUMNS}
        self.extras: dict[str, list[Any]] = defaultdict(list)

    def __len__(self) -> int:
        return len(self.columns["step_id"])

    def append(self, values: tuple, extras: dict[str, float] | None = None) -> None:
        for name, value in zip(STEP_COLUMNS, values):
            self.columns[name].append(value)
        if extras:
            n = len(self) - 1
            for key, value in extras.items():
                column = self.extras[key]
                column.extend([float("nan")] * (n - len(column)))
                column.append(value)

    def as_dict(self) -> dict[str, list[Any]]:
        out = dict(self.columns)
        n = len(self)
        for key, column in self.extras.items():
            out[key] = column + [float("nan")] * (n - len(column))
        return out
