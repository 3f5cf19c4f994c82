"""Azure LLM inference traces (2023 from the Splitwise paper, 2024 week-long), two layouts:

- as published: `TIMESTAMP,ContextTokens,GeneratedTokens`, with wall-clock timestamps such as
  `2023-11-16 18:15:46.6805900` (7 fractional digits; an ISO-8601 offset is accepted too);
- as processed in the Vidur repository: `arrived_at,num_prefill_tokens,num_decode_tokens`, with
  arrivals already in seconds from the first request.
With keep_absolute, published timestamps become seconds since the Unix epoch (UTC). Timestamps
are read from 1677-09-22 to 2262-04-11 (pandas' nanosecond range); a file either gives every one
with a UTC offset or none (then they are read as UTC).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from simcore.errors import ConfigError
from workloads.traces.common import TraceData, finish, numbers, read_csv, shown, token_counts, where

PUBLISHED = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
VIDUR = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")


def read_azure(path: Path, *, keep_absolute: bool = False) -> TraceData:
    """An Azure trace in either layout, as arrival_s / prompt_len / output_len."""
    frame = read_csv(path)
    header = list(frame.columns)
    if all(c in header for c in PUBLISHED):
        time, prompt, output = PUBLISHED
        arrival = _timestamps(frame, time, source=path, keep_absolute=keep_absolute)
    elif all(c in header for c in VIDUR):
        time, prompt, output = VIDUR
        arrival = numbers(frame, time, source=path, unit="row")
    else:
        raise ConfigError(
            "not an Azure trace header", source=str(path), where="header",
            expected=f"columns {','.join(PUBLISHED)} or {','.join(VIDUR)}",
            found=shown(",".join(c for c in header if c != "row")),
        )
    out = pd.DataFrame({
        "row": frame["row"].to_numpy(),
        "arrival_s": arrival,
        "prompt_len": token_counts(frame, prompt, source=path, unit="row"),
        "output_len": token_counts(frame, output, source=path, unit="row"),
    })
    return TraceData(finish(out, keep_absolute=keep_absolute), arrival_column=time)


# A UTC offset (Z, +02:00, +0200, +02) at the end of an ISO-8601 time of day.
UTC_OFFSET = r"[T\s]\d{2}(?::?\d{2}){0,2}(?:[.,]\d+)?\s*(?:[Zz]|[+-]\d{2}(?::?\d{2})?)\s*$"


def _timestamps(frame: pd.DataFrame, column: str, *, source: Path, keep_absolute: bool) -> np.ndarray:
    """Wall-clock timestamps as seconds since the epoch, or (without keep_absolute) since the
    earliest; the first unparseable, out-of-range or differently zoned one names its row."""
    # As strings: pandas will read bare numbers as epoch times in a future version; here they are errors.
    text = frame[column].astype(str)

    def fail(i: int, problem: str, expected: str) -> ConfigError:
        return ConfigError(problem, source=str(source), where=where("row", int(frame["row"].iat[i]), column),
                           expected=expected, found=shown(text.iat[i]))

    try:
        parsed = pd.to_datetime(text, format="ISO8601", errors="coerce")
        mixed_zones = False
    except ValueError:
        # pandas' "Mixed timezones": several UTC offsets (daylight saving time), or some times
        # with one and some without; checked below, once every time has been read.
        parsed = pd.to_datetime(text, format="ISO8601", errors="coerce", utc=True)
        mixed_zones = True
    if isinstance(parsed.dtype, pd.DatetimeTZDtype):
        parsed = parsed.dt.tz_convert("UTC").dt.tz_localize(None)
    out_of_range = (parsed < pd.Timestamp.min) | (parsed > pd.Timestamp.max)
    bad = np.flatnonzero(parsed.isna().to_numpy() | out_of_range.to_numpy())
    if len(bad):
        i = int(bad[0])
        # pandas reads a column with 7 fractional digits in nanoseconds, and a time past that
        # range then as missing: alone, it reads.
        if out_of_range.iat[i] or pd.notna(pd.to_datetime(text.iloc[i:i + 1], format="ISO8601", errors="coerce").iat[0]):
            raise fail(i, "timestamp out of range", "a time from 1677-09-22 to 2262-04-11")
        raise fail(i, "not a timestamp", "a time like 2023-11-16 18:15:46.6805900")
    if mixed_zones:
        # With some times zoned and others not, the others would be taken as UTC: a guess.
        zoned = text.str.contains(UTC_OFFSET, regex=True).to_numpy(dtype=bool)
        if zoned.any() and not zoned.all():
            i = int(np.flatnonzero(zoned != zoned[0])[0])
            raise fail(i, "timestamp with a UTC offset among ones without" if zoned[i] else
                       "timestamp without a UTC offset among ones with", "every time with an offset, or none")
    # Integer nanoseconds first: float seconds since 1970 keep only ~0.2 µs of resolution, so
    # times from the first request are taken before they become floats.
    nanos = parsed.dt.as_unit("ns").astype("int64").to_numpy()
    if keep_absolute or len(nanos) == 0:
        return nanos / 1e9
    earliest = int(nanos.min())
    if int(nanos.max()) - earliest > np.iinfo(np.int64).max:
        # Over 292 years apart: the difference would wrap around in int64.
        return nanos / 1e9 - earliest / 1e9
    return (nanos - earliest) / 1e9
