"""Options every timed trace shares: window, sample, rescale, cap, new arrivals.

Applied in this order: time_window (on the trace's clock) -> sample -> time_scale / target_rate
-> lengths_only (new arrivals) -> max_requests -> shift_to_zero. Rescaling keeps the first
kept arrival where it is and stretches the gaps after it.

The simulation clock starts at 0 s, and every request is delivered at its arrival time: one
that arrived before 0 would be delivered at 0 and charged the difference in its TTFT. Without
keep_absolute the trace's times start at 0; with it, `check_arrivals` makes an arrival still
before 0 after the options (a file clock with negative times, or an Azure time before 1970) an
error naming its row, rather than shift the file's clock without a word.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from simcore.errors import ConfigError
from workloads.arrivals import sample_arrivals
from workloads.spec import ArrivalSpec, TimedTrace, TraceSample
from workloads.streams import stream
from workloads.traces.common import where


def apply_time_options(
    frame: pd.DataFrame,
    trace: TimedTrace,
    *,
    seed: int,
    arrivals: ArrivalSpec | None,
    max_requests: int | None,
    source: str | None,
) -> tuple[pd.DataFrame, list[str]]:
    """`frame` (sorted by arrival) with the trace options applied, and notes for the user."""
    notes: list[str] = []
    if trace.time_window is not None:
        start, end = trace.time_window
        times = frame["arrival_s"].to_numpy()
        frame = frame.loc[(times >= start) & (times < end)]
        if len(frame) == 0:
            raise ConfigError("no request arrives inside the time window", source=source,
                              where="workload.trace.time_window", found=[start, end])
    if trace.sample is not None:
        frame = sample_rows(frame, trace.sample, seed=seed, notes=notes)
    frame = frame.reset_index(drop=True)
    if trace.time_scale is not None:
        frame["arrival_s"] = _stretch(frame["arrival_s"].to_numpy(), trace.time_scale, option="time_scale",
                                      value=trace.time_scale, source=source)
    elif trace.target_rate is not None:
        frame["arrival_s"] = _stretch_to_rate(frame["arrival_s"].to_numpy(), trace.target_rate, source)
    if trace.lengths_only:
        if "session_id" in frame and frame["session_id"].notna().any():
            raise ConfigError("lengths_only would reorder the turns of the trace's sessions", source=source,
                              where="workload.trace.lengths_only")
        assert arrivals is not None  # WorkloadSpec requires it with lengths_only
        frame["arrival_s"] = sample_arrivals(arrivals, len(frame), stream(seed, "arrivals"))
    if max_requests is not None:
        frame = frame.iloc[:max_requests].copy()
    if trace.shift_to_zero and len(frame):
        frame["arrival_s"] = frame["arrival_s"] - frame["arrival_s"].iat[0]
    return frame, notes


def check_arrivals(frame: pd.DataFrame, *, keep_absolute: bool, path: Path, column: str, unit: str) -> None:
    """Every arrival (after the trace options) a finite time, and with keep_absolute at or after
    the simulation clock's start, 0 s; else an error naming the request's row."""
    if len(frame) == 0:
        return
    times = frame["arrival_s"].to_numpy()
    not_finite = np.flatnonzero(~np.isfinite(times))
    if len(not_finite):
        # The file's times are finite, but not always their distance from the first (-1e308 to 1e308).
        i = int(not_finite[0])
        raise ConfigError("arrival time past the float range, counted from the first request", source=str(path),
                          where=where(unit, int(frame["row"].iat[i]), column), expected="finite times in seconds")
    first = int(np.argmin(times))
    if keep_absolute and times[first] < 0:
        raise ConfigError(
            f"arrives at {float(times[first]):.9g} s with keep_absolute: true, before the simulation clock "
            "starts (0 s)", source=str(path), where=where(unit, int(frame["row"].iat[first]), column),
            expected="times from 0 s on the trace's clock (or shift_to_zero: true, or no keep_absolute)",
        )


def sample_rows(frame: pd.DataFrame, sample: TraceSample, *, seed: int, notes: list[str]) -> pd.DataFrame:
    """n rows drawn (without replacement unless sample.replace), kept in their original order."""
    chosen = sample_indices(len(frame), sample, seed=seed, notes=notes)
    return frame.iloc[chosen]


def sample_indices(num: int, sample: TraceSample, *, seed: int, notes: list[str], what: str = "rows") -> np.ndarray:
    if getattr(sample, "replace", False):
        if num == 0:
            return np.arange(0)  # nothing to resample from; the caller reports an empty trace
        rng = np.random.default_rng(sample.seed) if sample.seed is not None else stream(seed, "trace_sample")
        return np.sort(rng.choice(num, sample.n, replace=True))
    if sample.n >= num:
        notes.append(f"sample.n = {sample.n} but only {num} {what} are left; keeping all")
        return np.arange(num)
    rng = np.random.default_rng(sample.seed) if sample.seed is not None else stream(seed, "trace_sample")
    return np.sort(rng.choice(num, sample.n, replace=False))


def _stretch(times: np.ndarray, scale: float, *, option: str, value: float, source: str | None) -> np.ndarray:
    if len(times) == 0:
        return times
    with np.errstate(over="ignore", invalid="ignore"):
        stretched = times[0] + (times - times[0]) * scale
    if not np.isfinite(stretched).all():
        raise ConfigError("stretches the trace's times past the float range", source=source,
                          where=f"workload.trace.{option}",
                          expected="a smaller time_scale" if option == "time_scale" else "a larger target_rate",
                          found=value)
    return stretched


def _stretch_to_rate(times: np.ndarray, target_rate: float, source: str | None) -> np.ndarray:
    span = float(times[-1] - times[0]) if len(times) else 0.0
    if len(times) < 2 or span <= 0:
        raise ConfigError("target_rate needs at least two requests at different times", source=source,
                          where="workload.trace.target_rate", found=len(times))
    # Mean gap now span/(n-1); the wanted one is 1/target_rate.
    product = span * target_rate
    scale = (len(times) - 1) / product if product > 0 else math.inf
    if math.isfinite(scale):
        return _stretch(times, scale, option="target_rate", value=target_rate, source=source)
    # A span so short (1e-310 s) that the scale is past the float range, though the wanted
    # times are not: each time's fraction of the span, stretched to the wanted span.
    fractions = (times - times[0]) / span
    gaps = _stretch(fractions, (len(times) - 1) / target_rate, option="target_rate", value=target_rate,
                    source=source)
    return times[0] + gaps
