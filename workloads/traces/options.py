"""Options every timed trace shares: window, sample, rescale, cap, new arrivals.

Applied in this order: time_window (on the trace's clock) -> sample -> time_scale / target_rate
-> lengths_only (new arrivals) -> max_requests -> shift_to_zero. Rescaling keeps the first
kept arrival where it is and stretches the gaps after it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from simcore.errors import ConfigError
from workloads.arrivals import sample_arrivals
from workloads.spec import ArrivalSpec, TimedTrace, TraceSample
from workloads.streams import stream


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
        frame["arrival_s"] = _stretch(frame["arrival_s"].to_numpy(), trace.time_scale)
    elif trace.target_rate is not None:
        frame["arrival_s"] = _stretch(frame["arrival_s"].to_numpy(), _scale_for_rate(frame, trace.target_rate, source))
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


def _stretch(times: np.ndarray, scale: float) -> np.ndarray:
    if len(times) == 0:
        return times
    return times[0] + (times - times[0]) * scale


def _scale_for_rate(frame: pd.DataFrame, target_rate: float, source: str | None) -> float:
    times = frame["arrival_s"].to_numpy()
    span = float(times[-1] - times[0]) if len(times) else 0.0
    if len(times) < 2 or span <= 0:
        raise ConfigError("target_rate needs at least two requests at different times", source=source,
                          where="workload.trace.target_rate", found=len(times))
    # Mean gap now span/(n-1); the wanted one is 1/target_rate.
    return (len(times) - 1) / (span * target_rate)
