"""Turning a WorkloadSpec into Request objects: draw or read columns, then build them in one pass."""

from __future__ import annotations

import contextlib
import gc
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from simcore.errors import ConfigError
from simcore.request import Request
from workloads.arrivals import sample_arrivals
from workloads.lengths import sample_lengths
from workloads.spec import WorkloadSpec
from workloads.streams import stream

# Columns a request table may carry beyond arrival_s / prompt_len / output_len.
OPTIONAL_FIELDS = ("prompt_token_ids", "segments", "cache_salt", "adapter_id", "session_id", "output_key", "turn",
                   "priority")
# Generated sessions also carry `turn_row`/`parent_row` (see sessions.session_table) and `think_time_s`.


@dataclass
class Workload:
    requests: list[Request]
    # Messages for the user (dropped rows, estimates); the caller decides how to show them.
    notes: list[str] = field(default_factory=list)


def build(spec: WorkloadSpec, *, seed: int, base_dir: Path, source: str | None = None) -> Workload:
    """Requests sorted by arrival with ids 0..n-1; deterministic in (spec, seed)."""
    with paused_gc():
        return _build(spec, seed=seed, base_dir=base_dir, source=source)


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Collector off while millions of acyclic objects are made.

    Each generation-0 collection would rescan the growing list of new requests; with it on,
    building 1M requests takes 3-4x longer. Nothing made here forms reference cycles.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _build(spec: WorkloadSpec, *, seed: int, base_dir: Path, source: str | None) -> Workload:
    notes: list[str] = []
    if spec.trace is not None:
        from workloads.traces import load_trace

        data = load_trace(spec, seed=seed, base_dir=base_dir, source=source)
        table, notes = data.frame, data.notes
        if len(table) == 0:
            # A header without rows, or filters that dropped every row: almost surely a mistake.
            detail = f" ({'; '.join(notes)})" if notes else ""
            raise ConfigError(f"the trace gives no requests{detail}", source=source, where="workload.trace.path",
                              expected="at least one data row", found=spec.trace.path)
    elif spec.sessions is not None:
        from workloads.sessions import synthetic_sessions

        table = synthetic_sessions(spec, seed)
        table = table.sort_values("arrival_s", kind="stable").reset_index(drop=True)
        if spec.num_requests is not None:
            table = table.iloc[: spec.num_requests]
    else:
        table = synthetic_table(spec, seed)
    think_where = "workload.trace.think_time_s" if spec.trace is not None else "workload.sessions.think_time_s"
    _check_times_finite(table, source, think_where)
    if spec.priority is not None:
        table = _with_priorities(table, spec, seed, source)
    return Workload(to_requests(table, max_tokens=spec.max_tokens), notes)


def _with_priorities(table: pd.DataFrame, spec: WorkloadSpec, seed: int, source: str | None) -> pd.DataFrame:
    """`table` (final rows, in arrival order) with a `priority` column drawn from `spec.priority`.

    Drawn last, after any window, sample or cap, so the draws follow the requests that are kept.
    """
    assert spec.priority is not None
    from workloads.priorities import draw_priorities

    if "priority" in table:
        # Only a trace brings the column. Two sources for one value: silently preferring either
        # would hide the other from the user.
        assert spec.trace is not None
        column = getattr(spec.trace, "columns", {}).get("priority", "priority")
        raise ConfigError("both this key and the trace's own column give each request's priority",
                          source=source, where="workload.priority",
                          expected="only one of them (remove workload.priority, or the column)",
                          found=f"column {column!r} in {spec.trace.path}")
    if len(table) > 1 and np.any(np.diff(table["arrival_s"].to_numpy()) < 0):
        # to_requests would reorder the rows; draw in the order the requests will have.
        table = table.sort_values("arrival_s", kind="stable")
    table = table.reset_index(drop=True)
    table["priority"] = draw_priorities(spec.priority, table, seed)
    return table


def _check_times_finite(table: pd.DataFrame, source: str | None, think_where: str) -> None:
    """Arrival and think times past the float range (a huge sigma or scale, or their running
    sums) would leave requests that never arrive: say so instead. Think times first: turns'
    arrivals add them up."""
    checks = (("think_time_s", think_where), ("arrival_s", "workload.arrivals"))
    for column, where in checks:
        if column not in table:
            continue
        times = table[column].to_numpy(dtype=np.float64)
        bad = ~np.isfinite(times)
        if bad.any():
            raise ConfigError(f"{int(bad.sum())} of {len(times)} sampled times overflow the float range",
                              source=source, where=where, expected="finite times in seconds (a smaller scale or "
                              "spread)", found=float(times[bad][0]))


def synthetic_table(spec: WorkloadSpec, seed: int) -> pd.DataFrame:
    """Independent requests: arrivals and lengths from separate streams; shared prefixes if asked."""
    assert spec.num_requests is not None and spec.arrivals is not None
    assert spec.prompt_len is not None and spec.output_len is not None
    num = spec.num_requests
    columns: dict[str, object] = {
        "arrival_s": sample_arrivals(spec.arrivals, num, stream(seed, "arrivals")),
        "prompt_len": sample_lengths(spec.prompt_len, num, stream(seed, "prompt_len")),
        "output_len": sample_lengths(spec.output_len, num, stream(seed, "output_len")),
    }
    if spec.prefix is not None:
        from workloads.prefix import draw_prefixes, prefixed_requests

        # Arrival processes return sorted times, so row i is request i and "req:<i>" its own key.
        indices, prefix_lens = draw_prefixes(spec.prefix, num, seed)
        columns["prompt_len"], columns["segments"] = prefixed_requests(indices, prefix_lens, columns["prompt_len"])
    return pd.DataFrame(columns)


def to_requests(table: pd.DataFrame, *, max_tokens: int | None = None) -> list[Request]:
    """One Request per row, in row order after a stable sort by arrival; ids 0..n-1."""
    arrival = table["arrival_s"].to_numpy(dtype=np.float64)
    if len(arrival) > 1 and np.any(np.diff(arrival) < 0):
        table = table.sort_values("arrival_s", kind="stable")
        arrival = table["arrival_s"].to_numpy(dtype=np.float64)
    prompt = table["prompt_len"].to_numpy(dtype=np.int64).tolist()
    output = table["output_len"].to_numpy(dtype=np.int64).tolist()
    # Absent columns are endless repeats of the default, so this zip cannot be strict.
    ids, segments, salts, adapters, sessions, out_keys = (_optional(table, name) for name in OPTIONAL_FIELDS[:6])
    turns = table["turn"].to_numpy(dtype=np.int64).tolist() if "turn" in table else itertools.repeat(0)
    priorities = table["priority"].to_numpy(dtype=np.int64).tolist() if "priority" in table else itertools.repeat(0)
    parents, thinks = _turn_links(table)
    return [
        Request(request_id=i, arrival_s=a, prompt_len=p, output_len=o, max_tokens=max_tokens, prompt_token_ids=t,
                segments=s, cache_salt=c, adapter_id=d, session_id=sid, turn=k, output_key=ok, parent_id=pa,
                think_time_s=th, priority=pr)
        for i, (a, p, o, t, s, c, d, sid, ok, k, pa, th, pr) in enumerate(
            zip(arrival.tolist(), prompt, output, ids, segments, salts, adapters, sessions, out_keys, turns,
                parents, thinks, priorities, strict=False)
        )
    ]


def _turn_links(table: pd.DataFrame) -> tuple[Iterable[int | None], Iterable[float]]:
    """Each row's parent request id (its previous turn, now renumbered in arrival order) and think
    time, for generated sessions; None and 0.0 everywhere else."""
    if "parent_row" not in table:
        return itertools.repeat(None), itertools.repeat(0.0)
    turn_row = table["turn_row"].to_numpy(dtype=np.int64)
    parent_row = table["parent_row"].to_numpy(dtype=np.int64)
    position = np.full(int(turn_row.max()) + 1 if len(turn_row) else 0, -1, dtype=np.int64)
    position[turn_row] = np.arange(len(turn_row))
    # A parent always arrives first, so a cap on the first n requests never drops only the parent.
    parent_id = np.where(parent_row >= 0, position[np.maximum(parent_row, 0)], -1)
    parents = [None if p < 0 else p for p in parent_id.tolist()]
    return parents, table["think_time_s"].to_numpy(dtype=np.float64).tolist()


def _optional(table: pd.DataFrame, name: str) -> Iterable[object]:
    """A column's values with absent cells as None (pandas may have turned them into NaN)."""
    if name not in table:
        return itertools.repeat(None)
    column = table[name]
    missing = column.isna().to_numpy()
    values = column.tolist()
    if missing.any():
        for i in np.flatnonzero(missing).tolist():
            values[i] = None
    return values
