"""What every trace reader shares: the normalised table, and checks that name file, row and column.

A reader returns a `TraceData` whose frame has one row per request with the columns
`arrival_s` (float seconds), `prompt_len`, `output_len` (int64) and `row` (the 1-based data row
of a table, or line number of a JSONL file, used in error messages), plus any of the optional
columns `prompt_token_ids`, `segments`, `session_id`, `turn`, `cache_salt`, `adapter_id`,
`priority`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simcore.errors import ConfigError, close_match


@dataclass
class TraceData:
    frame: pd.DataFrame
    # Things the caller should tell the user (rows dropped, estimates used); readers never print.
    notes: list[str] = field(default_factory=list)


def where(unit: str, number: int, column: str) -> str:
    return f"{unit} {number}, column {column!r}"


def require_columns(header: list[str], needed: list[str], *, source: Path, hint: str = "") -> None:
    """Fail on the first column of `needed` that the file lacks, suggesting a close spelling."""
    for name in needed:
        if name not in header:
            similar = close_match(name, header)
            extra = f" (did you mean {similar!r}?)" if similar else ""
            raise ConfigError(
                f"missing column {name!r}{extra}{hint}", source=str(source), where="header",
                expected=f"columns {needed}", found=", ".join(map(str, header)),
            )


def numbers(frame: pd.DataFrame, column: str, *, source: Path, unit: str, label: str | None = None) -> np.ndarray:
    """A numeric column as float64; the first empty or non-numeric cell is an error naming its row."""
    values = frame[column]
    label = label or column
    if pd.api.types.is_bool_dtype(values) or not pd.api.types.is_numeric_dtype(values):
        coerced = pd.to_numeric(values.map(_scalar_or_nan), errors="coerce")
        bad = np.flatnonzero(coerced.isna().to_numpy() & values.notna().to_numpy())
        if len(bad):
            i = int(bad[0])
            raise ConfigError(
                "not a number", source=str(source), where=where(unit, int(frame["row"].iat[i]), label),
                found=_short_cell(values.iat[i]),
            )
        values = coerced
    result = values.to_numpy(dtype=np.float64, na_value=np.nan)
    missing = np.flatnonzero(~np.isfinite(result))
    if len(missing):
        i = int(missing[0])
        place = where(unit, int(frame["row"].iat[i]), label)
        if np.isnan(result[i]) and _is_missing(frame[column].iat[i]):
            raise ConfigError("empty or NaN cell" if unit == "row" else "missing or NaN value", source=str(source),
                              where=place, expected="a number")
        raise ConfigError("non-finite value", source=str(source), where=place, expected="a finite number",
                          found=str(values.iat[i]))
    return result


def token_counts(
    frame: pd.DataFrame, column: str, *, source: Path, unit: str, label: str | None = None, minimum: int = 1
) -> np.ndarray:
    """A column of token counts as int64: whole numbers >= minimum, else an error naming the row."""
    from workloads.spec import MAX_TOKENS

    return whole_numbers(
        frame, column, source=source, unit=unit, low=minimum, high=MAX_TOKENS, problem="bad token count",
        label=label,
        expected=lambda value: f"a whole number >= {minimum}" if value <= MAX_TOKENS else f"at most {MAX_TOKENS}",
    )


def whole_numbers(
    frame: pd.DataFrame, column: str, *, source: Path, unit: str, low: int, high: int, problem: str,
    label: str | None = None, expected: Callable[[float], str] | None = None,
) -> np.ndarray:
    """A column of whole numbers in [low, high] as int64; the first other cell (empty, text, a
    fraction, out of range) is an error naming its row, and what was expected (`expected` of
    the bad value, where given)."""
    values = numbers(frame, column, source=source, unit=unit, label=label)
    bad = np.flatnonzero((values != np.floor(values)) | (values < low) | (values > high))
    if len(bad):
        i = int(bad[0])
        raise ConfigError(
            problem, source=str(source), where=where(unit, int(frame["row"].iat[i]), label or column),
            expected=expected(values[i]) if expected is not None else f"a whole number from {low} to {high}",
            found=_plain(values[i]),
        )
    return values.astype(np.int64)


def text_or_none(values: pd.Series) -> list[str | None]:
    """Optional string cells (ids, salts) as str, with empty cells (None/NaN) as None."""
    return [None if _is_missing(v) else (str(int(v)) if isinstance(v, float) and v.is_integer() else str(v))
            for v in values.tolist()]


def read_jsonl(path: Path) -> tuple[list[dict[str, Any]], list[int]]:
    """The objects of a JSONL file and their 1-based line numbers (blank lines skipped)."""
    records: list[dict[str, Any]] = []
    lines: list[int] = []
    with _open_binary(path) as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ConfigError("not UTF-8 text", source=str(path), where=f"line {number}",
                                  expected="a UTF-8 JSONL file") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"invalid JSON ({exc.msg})", source=str(path), where=f"line {number}") from None
            except RecursionError:
                raise ConfigError("invalid JSON (nested too deeply)", source=str(path), where=f"line {number}") from None
            if not isinstance(record, dict):
                raise ConfigError(
                    "each line must be a JSON object", source=str(path), where=f"line {number}",
                    found=type(record).__name__,
                )
            records.append(record)
            lines.append(number)
    return records, lines


def _open_binary(path: Path):  # noqa: ANN202 - a binary file object
    try:
        return open(path, "rb")
    except OSError as exc:
        raise ConfigError(f"cannot open trace ({exc.strerror})", source=str(path)) from None


def open_text(path: Path):
    try:
        return open(path, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot open trace ({exc.strerror})", source=str(path)) from None


def read_csv(path: Path) -> pd.DataFrame:
    """A CSV file with its data rows numbered 1.. in a `row` column."""
    try:
        frame = pd.read_csv(path, skipinitialspace=True)
    except OSError as exc:
        raise ConfigError(f"cannot open trace ({exc.strerror})", source=str(path)) from None
    except pd.errors.EmptyDataError:
        raise ConfigError("the file is empty", source=str(path), expected="a header and data rows") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        detail = " ".join(str(exc).split())
        raise ConfigError(f"not a readable CSV file ({detail})", source=str(path)) from None
    frame.columns = [str(c).strip() for c in frame.columns]
    frame["row"] = np.arange(1, len(frame) + 1)
    return frame


def finish(frame: pd.DataFrame, *, keep_absolute: bool) -> pd.DataFrame:
    """Rows sorted by arrival (stable, so equal times keep file order), times from the first one."""
    if len(frame) == 0:
        return frame.reset_index(drop=True)
    frame = frame.sort_values("arrival_s", kind="stable").reset_index(drop=True)
    if not keep_absolute:
        frame["arrival_s"] = frame["arrival_s"] - frame["arrival_s"].iat[0]
    return frame


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _scalar_or_nan(value: Any) -> Any:
    # Lists or dicts in a numeric column (JSONL) are not numbers; booleans are not counts.
    if isinstance(value, (list, dict, bool)):
        return "not-a-number"
    return value


def _short_cell(value: Any) -> Any:
    """A bad cell as found in the file, cut short when it is a long list or object (JSONL)."""
    text = repr(value)
    return value if len(text) <= 60 else text[:57] + "..."


def _plain(value: float) -> int | float:
    value = float(value)
    return int(value) if value.is_integer() and abs(value) < 2**63 else value


def number_turns(frame: pd.DataFrame) -> pd.DataFrame:
    """Fill a missing `turn` column with each row's position within its session, by arrival."""
    if "session_id" not in frame or "turn" in frame:
        return frame
    has_session = frame["session_id"].notna()
    turns = np.zeros(len(frame), dtype=np.int64)
    turns[has_session.to_numpy()] = frame.loc[has_session].groupby("session_id", sort=False).cumcount().to_numpy()
    frame["turn"] = turns
    return frame
