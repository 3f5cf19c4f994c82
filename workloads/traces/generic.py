"""Our own trace layout in CSV, JSONL or Parquet: `arrival_s, prompt_len, output_len` + optionals.

Columns may be renamed with `columns: {our_name: file_name}`. Optional per-request content:
`prompt_token_ids` (list of ints; prompt_len defaults to its length), `segments` (list of
[content_key, num_tokens]; prompt_len defaults to their sum), or `prefix_key` + `prefix_len` (a
shared prefix followed by a tail unique to the row). In CSV the list-valued cells are JSON text.
Also `session_id`, `turn`, `cache_salt`, `adapter_id`, and `priority` (a whole number in int32
range, negatives allowed, lower served first under `queue_order: priority`; when the column is
there every row needs one, as for `turn`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simcore.errors import ConfigError
from simcore.request import Segment
from workloads.spec import GENERIC_COLUMNS, MAX_PRIORITY, MAX_TOKENS, MIN_PRIORITY
from workloads.traces.common import (
    TraceData,
    decode_json,
    finish,
    holds_lone_surrogate,
    number_turns,
    numbers,
    read_csv,
    read_jsonl,
    require_columns,
    shown,
    text_cells,
    token_counts,
    where,
    whole_numbers,
    with_rows,
)

SECONDS_PER_UNIT = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
# Token ids are vocabulary indices, kept as int64 wherever they are stored (Parquet, numpy, torch).
MAX_TOKEN_ID = 2**63 - 1


def read_generic(
    path: Path,
    *,
    fmt: str,
    columns: dict[str, str] | None = None,
    time_unit: str = "s",
    keep_absolute: bool = False,
) -> TraceData:
    """A csv/jsonl/parquet trace in our column names (or renamed ones), normalised."""
    frame, unit = _load(path, fmt)
    names = {ours: (columns or {}).get(ours, ours) for ours in GENERIC_COLUMNS}
    header = [c for c in frame.columns if c != "row"]
    has_content = names["prompt_token_ids"] in header or names["segments"] in header
    needed = [names["arrival_s"]] + ([] if has_content else [names["prompt_len"]]) + [names["output_len"]]
    require_columns(header, needed, source=path, hint=" (rename columns with trace.columns)")

    out = pd.DataFrame({"row": frame["row"].to_numpy()})
    arrival = numbers(frame, names["arrival_s"], source=path, unit=unit)
    out["arrival_s"] = arrival * SECONDS_PER_UNIT[time_unit]
    out["output_len"] = token_counts(frame, names["output_len"], source=path, unit=unit)
    if has_content or names["prefix_key"] in header:
        _content_columns(frame, out, names, header, source=path, unit=unit)
    else:
        out["prompt_len"] = token_counts(frame, names["prompt_len"], source=path, unit=unit)
    for ours in ("session_id", "cache_salt", "adapter_id"):
        if names[ours] in header:
            out[ours] = text_cells(frame, names[ours], source=path, unit=unit)
    if names["turn"] in header:
        out["turn"] = token_counts(frame, names["turn"], source=path, unit=unit, minimum=0)
    if names["priority"] in header:
        out["priority"] = whole_numbers(frame, names["priority"], source=path, unit=unit, low=MIN_PRIORITY,
                                        high=MAX_PRIORITY, problem="bad priority")
    return TraceData(number_turns(finish(out, keep_absolute=keep_absolute)), arrival_column=names["arrival_s"],
                     unit=unit)


def _load(path: Path, fmt: str) -> tuple[pd.DataFrame, str]:
    if fmt == "csv":
        return read_csv(path), "row"
    if fmt == "parquet":
        return _read_parquet(path), "row"
    records, lines = read_jsonl(path)
    return with_rows(pd.DataFrame.from_records(records), lines), "line"


def _read_parquet(path: Path) -> pd.DataFrame:
    try:
        frame = pd.read_parquet(path)
    except FileNotFoundError:
        raise ConfigError("cannot open trace (no such file)", source=str(path)) from None
    except Exception as exc:  # pyarrow raises several unrelated types for a damaged file
        detail = shown(" ".join(str(exc).split()))
        raise ConfigError(f"not a readable Parquet file ({detail})", source=str(path)) from None
    return with_rows(frame.reset_index(drop=True), np.arange(1, len(frame) + 1))


def _content_columns(
    frame: pd.DataFrame, out: pd.DataFrame, names: dict[str, str], header: list[str], *, source: Path, unit: str
) -> None:
    """prompt_len, prompt_token_ids and segments, each row's values checked against each other."""
    rows = frame["row"].tolist()
    num = len(frame)
    ids = _per_row(frame, names["prompt_token_ids"], header, rows, source, unit, _token_ids)
    segs = _per_row(frame, names["segments"], header, rows, source, unit, _segments)
    if names["prompt_len"] in header:
        # Object cells, so a row's derived count can fill a missing one whatever the column holds
        # (a column of text cells is a string dtype, which refuses an integer).
        given = frame[names["prompt_len"]].astype(object)
    else:
        given = pd.Series([np.nan] * num, dtype=object)
    label = names["prompt_len"]
    for i in range(num):
        derived = []
        if ids[i] is not None:
            derived.append(len(ids[i]))
        if segs[i] is not None:
            derived.append(sum(n for _, n in segs[i]))
        if not derived:
            continue
        value = given.iat[i]
        if value is None or (isinstance(value, float) and np.isnan(value)):
            given.iat[i] = derived[0]
            value = derived[0]
        if any(d != _as_number(value) for d in derived):
            raise ConfigError(
                "prompt_len disagrees with the prompt content", source=str(source), where=where(unit, rows[i], label),
                expected=f"{derived[0]} (the token ids' count / the segments' sum)", found=shown(value),
            )
    lens_frame = pd.DataFrame({"p": given.to_numpy(), "row": rows})
    prompt_lens = token_counts(lens_frame, "p", source=source, unit=unit, label=label)
    if names["prefix_key"] in header:
        segs = _prefix_segments(frame, names, header, segs, prompt_lens, rows, source, unit)
    out["prompt_len"] = prompt_lens
    if names["prompt_token_ids"] in header:
        out["prompt_token_ids"] = ids
    if any(s is not None for s in segs):
        out["segments"] = segs


def _prefix_segments(frame, names, header, segs, prompt_lens, rows, source, unit) -> list:
    if names["prefix_len"] not in header:
        raise ConfigError(
            f"column {names['prefix_key']!r} needs a {names['prefix_len']!r} column", source=str(source),
            where="header",
        )
    keys = text_cells(frame, names["prefix_key"], source=source, unit=unit)
    lens = frame[names["prefix_len"]]
    result = list(segs)
    for i, key in enumerate(keys):
        if key is None or segs[i] is not None:
            continue
        n = _as_whole(lens.iat[i])
        if n is None or not 1 <= n <= prompt_lens[i]:
            raise ConfigError(
                "bad prefix length", source=str(source), where=where(unit, rows[i], names["prefix_len"]),
                expected=f"a whole number from 1 to prompt_len ({prompt_lens[i]})", found=shown(lens.iat[i]),
            )
        tail = int(prompt_lens[i]) - n
        result[i] = ((key, n), (f"row:{rows[i]}", tail)) if tail else ((key, n),)
    return result


def _per_row(frame, column, header, rows, source, unit, parse) -> list:
    if column not in header:
        return [None] * len(frame)
    parsed = []
    for value, row in zip(frame[column].tolist(), rows, strict=True):
        try:
            parsed.append(parse(value))
        except ValueError as exc:
            raise ConfigError(
                str(exc), source=str(source), where=where(unit, row, column), found=shown(value)
            ) from None
    return parsed


def _token_ids(value: Any) -> tuple[int, ...] | None:
    value = _decoded(value)
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not all(_is_count(x, 0, MAX_TOKEN_ID) for x in value):
        raise ValueError(f"prompt_token_ids must be a list of whole numbers from 0 to {MAX_TOKEN_ID}")
    if not value:
        raise ValueError("prompt_token_ids is empty")
    return tuple(int(x) for x in value)


def _segments(value: Any) -> tuple[Segment, ...] | None:
    value = _decoded(value)
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError("segments must be a non-empty list of [content_key, num_tokens] pairs")
    result = []
    for item in value:
        if not (isinstance(item, (list, tuple)) and len(item) == 2 and _is_count(item[1], 1, MAX_TOKENS)
                and isinstance(item[0], (str, int, float, np.integer, np.floating))):
            raise ValueError(f"each segment must be [content_key, num_tokens from 1 to {MAX_TOKENS}], the key a "
                             "string or number")
        result.append((str(item[0]), int(item[1])))
    return tuple(result)


def _decoded(value: Any) -> Any:
    """Lists arrive as lists (JSONL), numpy arrays (Parquet) or JSON text (CSV); NaN means absent."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return None
    if isinstance(value, np.ndarray):
        return [v.tolist() if isinstance(v, np.ndarray) else v for v in value.tolist()]
    if isinstance(value, str):
        decoded = decode_json(value)
        # JSON text may escape a lone surrogate (\\ud800), which no text file can hold.
        if "\\u" in value and holds_lone_surrogate(decoded):
            raise ValueError("text with a lone UTF-16 surrogate (\\ud800-\\udfff), not Unicode")
        return decoded
    return value


def _is_count(value: Any, minimum: int, maximum: int) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return False
    if isinstance(value, (int, np.integer)):
        return minimum <= value <= maximum
    return isinstance(value, (float, np.floating)) and value.is_integer() and minimum <= value <= maximum


def _as_number(value: Any) -> Any:
    """A cell as a float where it reads as one, else as it is (text, or an int past the float range)."""
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return value


def _as_whole(value: Any) -> int | None:
    """A cell as an int where it is a whole number (an int, or a float or text of one), else None
    (an empty cell reads as NaN, and "inf" as infinity: neither is whole)."""
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    number = _as_number(value)
    return int(number) if isinstance(number, float) and number.is_integer() else None
