"""Azure LLM inference traces (2023 from the Splitwise paper, 2024 week-long), two layouts:

- as published: `TIMESTAMP,ContextTokens,GeneratedTokens`, with wall-clock timestamps such as
  `2023-11-16 18:15:46.6805900` (7 fractional digits; an ISO-8601 offset is accepted too);
- as processed in the Vidur repository: `arrived_at,num_prefill_tokens,num_decode_tokens`, with
  arrivals already in seconds from the first request.
With keep_absolute, published timestamps become seconds since the Unix epoch (UTC).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from simcore.errors import ConfigError
from workloads.traces.common import TraceData, finish, numbers, read_csv, token_counts, where

PUBLISHED = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
VIDUR = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")


def read_azure(path: Path, *, keep_absolute: bool = False) -> TraceData:
    """An Azure trace in either layout, as arrival_s / prompt_len / output_len."""
    frame = read_csv(path)
    header = list(frame.columns)
    if all(c in header for c in PUBLISHED):
        time, prompt, output = PUBLISHED
        arrival = _timestamps(frame, time, source=path)
    elif all(c in header for c in VIDUR):
        time, prompt, output = VIDUR
        arrival = numbers(frame, time, source=path, unit="row")
    else:
        raise ConfigError(
            "not an Azure trace header", source=str(path), where="header",
            expected=f"columns {','.join(PUBLISHED)} or {','.join(VIDUR)}",
            found=",".join(c for c in header if c != "row"),
        )
    out = pd.DataFrame({
        "row": frame["row"].to_numpy(),
        "arrival_s": arrival,
        "prompt_len": token_counts(frame, prompt, source=path, unit="row"),
        "output_len": token_counts(frame, output, source=path, unit="row"),
    })
    return TraceData(finish(out, keep_absolute=keep_absolute))


def _timestamps(frame: pd.DataFrame, column: str, *, source: Path) -> np.ndarray:
    """Wall-clock timestamps as seconds since the epoch; the first unparseable one names its row."""
    text = frame[column]
    # As strings: pandas will read bare numbers as epoch times in a future version; here they are errors.
    parsed = pd.to_datetime(text.astype(str), format="ISO8601", errors="coerce", utc=True)
    bad = np.flatnonzero(parsed.isna().to_numpy())
    if len(bad):
        i = int(bad[0])
        raise ConfigError(
            "not a timestamp", source=str(source), where=where("row", int(frame["row"].iat[i]), column),
            expected="a time like 2023-11-16 18:15:46.6805900",
            found=text.iat[i].item() if isinstance(text.iat[i], np.generic) else text.iat[i],
        )
    # Integer nanoseconds first: float seconds since 1970 keep only ~0.2 µs of resolution.
    nanos = parsed.dt.tz_localize(None).dt.as_unit("ns").astype("int64").to_numpy()
    return nanos / 1e9
