"""What every trace reader shares: the normalised table, and checks that name file, row and column.

A reader returns a `TraceData` whose frame has one row per request with the columns
`arrival_s` (float seconds), `prompt_len`, `output_len` (int64) and `row` (the 1-based data row
of a table, or line number of a JSONL file, used in error messages), plus any of the optional
columns `prompt_token_ids`, `segments`, `session_id`, `turn`, `cache_salt`, `adapter_id`,
`priority`.
"""

from __future__ import annotations

import csv
import json
import math
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simcore.errors import ConfigError, close_match, cut

# At most this many characters of a value from a file are quoted in a message (a cell may be a
# megabyte of text); longer ones are cut short with "...".
MAX_SHOWN = 80
# JSON text escapes of UTF-16 surrogates (\ud800-\udfff): only where one appears can a decoded
# string hold a lone surrogate, which is not Unicode text (it cannot be written as UTF-8).
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


@dataclass
class TraceData:
    frame: pd.DataFrame
    # Things the caller should tell the user (rows dropped, estimates used); readers never print.
    notes: list[str] = field(default_factory=list)
    # Where arrival times came from, for messages about them after the trace options ran:
    # the file's column and what its `row` numbers count ("row" of a table, "line" of JSONL).
    arrival_column: str = "arrival_s"
    unit: str = "row"


def where(unit: str, number: int, column: str) -> str:
    return f"{unit} {number}, column {column!r}"


def require_columns(header: list[str], needed: list[str], *, source: Path, hint: str = "") -> None:
    """Fail on the first column of `needed` that the file lacks, suggesting a close spelling."""
    # `row` is the readers' own numbering, not a column of the file.
    present = [str(c) for c in header if c != "row"]
    for name in needed:
        if name not in present:
            similar = close_match(name, present)
            extra = f" (did you mean {similar!r}?)" if similar else ""
            raise ConfigError(
                f"missing column {shown(name)!r}{extra}{hint}", source=str(source), where="header",
                expected=shown(f"columns {needed}"), found=shown(", ".join(present)),
            )


def numbers(frame: pd.DataFrame, column: str, *, source: Path, unit: str, label: str | None = None) -> np.ndarray:
    """A numeric column as float64; the first empty, non-numeric or non-finite cell (or one past
    the float range) is an error naming its row and quoting the cell as the file has it."""
    values = frame[column]
    label = label or column

    def place(i: int) -> str:
        return where(unit, int(frame["row"].iat[i]), label)

    if len(values) and (pd.api.types.is_datetime64_any_dtype(values) or pd.api.types.is_timedelta64_dtype(values)):
        # pandas would turn these into nanosecond counts: seconds off by 1e9 without a word.
        raise ConfigError("a date/time column, not numbers", source=str(source), where=place(0),
                          expected="numbers", found=shown(values.iat[0]))
    if pd.api.types.is_bool_dtype(values) or not pd.api.types.is_numeric_dtype(values):
        result, not_number, past_range = _object_numbers(values)
    else:
        result = values.to_numpy(dtype=np.float64, na_value=np.nan)
        not_number = past_range = np.zeros(len(result), dtype=bool)
    bad = np.flatnonzero(not_number | past_range | ~np.isfinite(result))
    if len(bad):
        i = int(bad[0])
        cell = values.iat[i]
        if not_number[i]:
            raise ConfigError("not a number", source=str(source), where=place(i), found=shown(cell))
        if past_range[i]:
            raise ConfigError("number past the float range", source=str(source), where=place(i),
                              expected="a finite number", found=shown(cell))
        if np.isnan(result[i]) and _is_missing(cell):
            raise ConfigError("empty or NaN cell" if unit == "row" else "missing or NaN value", source=str(source),
                              where=place(i), expected="a number")
        raise ConfigError("non-finite value", source=str(source), where=place(i), expected="a finite number",
                          found=shown(cell if isinstance(cell, str) else str(result[i])))
    return result


def _object_numbers(values: pd.Series) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A column that is not plainly numeric (text, or mixed cells of a JSONL file or CSV) as
    float64, with masks of its cells that are not numbers and of whole numbers past the float
    range (pandas keeps a CSV's or JSON's 400-digit integer as a Python int, which neither
    pandas nor numpy turns into a float: they raise OverflowError)."""
    cells = values.tolist()
    not_number = np.zeros(len(cells), dtype=bool)
    past_range = np.zeros(len(cells), dtype=bool)
    prepared: list[Any] = []
    for i, value in enumerate(cells):
        if isinstance(value, (bool, np.bool_, list, tuple, dict, np.ndarray)):
            # Lists or dicts (JSONL, Parquet) are not numbers; booleans are not counts.
            not_number[i] = True
            value = None
        elif isinstance(value, int):
            try:
                value = float(value)
            except OverflowError:
                past_range[i] = True
                value = None
        prepared.append(value)
    coerced = pd.to_numeric(pd.Series(prepared, dtype=object), errors="coerce").to_numpy(
        dtype=np.float64, na_value=np.nan)
    # A cell pandas could not read as a number (text) comes back NaN where the file had something.
    not_number |= np.isnan(coerced) & values.notna().to_numpy() & ~past_range
    return coerced, not_number, past_range


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


def text_cells(frame: pd.DataFrame, column: str, *, source: Path, unit: str) -> list[str | None]:
    """Optional text cells (ids, salts, keys) as str, with empty cells (None/NaN) as None; a
    list or object (JSONL, Parquet) is an error naming its row."""
    values = frame[column]
    cells = values.tolist()
    if not pd.api.types.is_string_dtype(values) or values.dtype == object:
        # Only an object column (JSONL, Parquet) can hold a list: looked for there alone.
        for i, value in enumerate(cells):
            if isinstance(value, (list, tuple, dict, np.ndarray)):
                raise ConfigError("not a text or number cell", source=str(source),
                                  where=where(unit, int(frame["row"].iat[i]), column), found=shown(value))
    return [None if _is_missing(v) else (str(int(v)) if isinstance(v, float) and v.is_integer() else str(v))
            for v in cells]


def shown(value: Any) -> Any:
    """A value from a file as a message quotes it: a plain Python value (not numpy's), a text cut
    short past MAX_SHOWN characters (a cell may hold a megabyte of text). ConfigError bounds
    what it repeats of any other value (simcore.errors.short_repr: long numbers, deep lists)."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    elif isinstance(value, np.generic):
        value = value.item()
    return cut(value, MAX_SHOWN) if isinstance(value, str) else value


def lone_surrogate_at(record: dict[str, Any]) -> str | None:
    """The column of a decoded JSON record whose name or value (at any depth) holds a lone
    UTF-16 surrogate ("\\ud800" escaped in the file), as a message names it; None if none does."""
    for key, value in record.items():
        if not _is_unicode(key) or holds_lone_surrogate(value):
            return f"column {shown(key)!r}"
    return None


def holds_lone_surrogate(value: Any) -> bool:
    """Whether a decoded JSON value has a string (or dict key) that is not Unicode text. Walked
    without recursion: the value may be nested as deeply as the JSON decoder allows."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if not _is_unicode(item):
                return True
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return False


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def decode_json(text: str | bytes) -> Any:
    """json.loads, with each of its failures a ValueError saying what is wrong (see json_problem)."""
    try:
        return json.loads(text)
    except (RecursionError, ValueError) as exc:
        raise ValueError(json_problem(exc)) from None


def json_problem(exc: RecursionError | ValueError) -> str:
    """What json.loads found wrong: a syntax error, nesting past the recursion limit, or an
    integer past Python's limit of 4,300 digits (a plain ValueError)."""
    if isinstance(exc, RecursionError):
        return "invalid JSON (nested too deeply)"
    if isinstance(exc, json.JSONDecodeError):
        return f"invalid JSON ({exc.msg})"
    return "invalid JSON (a number with thousands of digits)"


def read_jsonl(path: Path) -> tuple[list[dict[str, Any]], list[int]]:
    """The objects of a JSONL file and their 1-based line numbers (blank lines skipped)."""
    records: list[dict[str, Any]] = []
    lines: list[int] = []
    with _open_binary(path) as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                # A byte-order mark, as some Windows tools write, may start the file.
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise ConfigError(f"not UTF-8 text (byte {exc.start + 1} of the line)", source=str(path),
                                  where=f"line {number}", expected="a UTF-8 JSONL file") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (RecursionError, ValueError) as exc:
                raise ConfigError(json_problem(exc), source=str(path), where=f"line {number}") from None
            if not isinstance(record, dict):
                raise ConfigError(
                    "each line must be a JSON object", source=str(path), where=f"line {number}",
                    found=type(record).__name__,
                )
            if b"\\u" in raw and SURROGATE_ESCAPE.search(raw):
                bad = lone_surrogate_at(record)
                if bad is not None:
                    raise ConfigError("text with a lone UTF-16 surrogate (\\ud800-\\udfff), not Unicode",
                                      source=str(path), where=f"line {number}, {bad}")
            records.append(record)
            lines.append(number)
    if not records:
        raise ConfigError("the file has no JSON lines", source=str(path), expected="one JSON object per line")
    return records, lines


def _open_binary(path: Path):  # noqa: ANN202 - a binary file object
    try:
        return open(path, "rb")
    except OSError as exc:
        raise ConfigError(f"cannot open trace ({exc.strerror})", source=str(path)) from None


def read_csv(path: Path) -> pd.DataFrame:
    """A CSV file with its data rows numbered 1.. in a `row` column."""
    try:
        with warnings.catch_warnings():
            # By default a first data row with more fields than the header becomes the index,
            # every column shifted by one without a word ("0,5,5," with a trailing comma), and a
            # row of thousands of extra fields an index of thousands of levels (minutes). With
            # index_col=False the columns stay in place, and extra fields are a warning: an error.
            warnings.simplefilter("error", pd.errors.ParserWarning)
            frame = pd.read_csv(path, skipinitialspace=True, index_col=False)
    except pd.errors.ParserWarning:
        raise ConfigError("more fields than the header names", source=str(path), where=f"line {_first_long_row(path)}",
                          expected="one field per column") from None
    except OSError as exc:
        raise ConfigError(f"cannot open trace ({exc.strerror})", source=str(path)) from None
    except pd.errors.EmptyDataError:
        raise ConfigError("the file is empty", source=str(path), expected="a header and data rows") from None
    except UnicodeDecodeError:
        line, byte = _first_non_utf8(path)
        raise ConfigError(f"not UTF-8 text (byte {byte} of the line)", source=str(path), where=f"line {line}",
                          expected="a UTF-8 CSV file") from None
    except (pd.errors.ParserError, ValueError, OverflowError) as exc:
        raise ConfigError(f"not a readable CSV file ({shown(' '.join(str(exc).split()))})", source=str(path)) from None
    names = [str(c).strip() for c in frame.columns]
    if len(names) == 1 and any(sep in names[0] for sep in ";\t|"):
        # A whole header in one column: the file is separated by something else than commas.
        raise ConfigError("not comma-separated", source=str(path), where="header",
                          expected="columns separated by ','", found=shown(names[0]))
    _check_unique_header(path, names)
    frame.columns = names
    return with_rows(frame, np.arange(1, len(frame) + 1))


def with_rows(frame: pd.DataFrame, rows: Any) -> pd.DataFrame:
    """`frame` with its `row` column (data row or line numbers, for messages). A file of
    thousands of columns makes a frame pandas calls fragmented; adding one column to it is no
    performance problem worth a warning to the user."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pd.errors.PerformanceWarning)
        frame["row"] = np.asarray(rows, dtype=np.int64)
    return frame


def _check_unique_header(path: Path, names: list[str]) -> None:
    """pandas renames a second `x` column to `x.1`, so the reader would take one of two columns
    of the same name without a word: an error instead."""
    if not any(re.search(r"\.\d+$", name) for name in names):
        return
    header = pd.read_csv(path, header=None, nrows=1, skipinitialspace=True, dtype=str).iloc[0].tolist()
    seen: set[str] = set()
    for name in (str(n).strip() for n in header):
        if name in seen:
            raise ConfigError("the header names a column twice", source=str(path), where="header",
                              found=shown(name))
        seen.add(name)


def _first_long_row(path: Path) -> int:
    """The line where the first row with more (non-empty) fields than the header ends."""
    with open(path, encoding="utf-8-sig", newline="") as handle:
        reader = csv.reader(handle, skipinitialspace=True)
        width = len(next(reader, []))
        for row in reader:
            if len(row) > width and any(field.strip() for field in row[width:]):
                return reader.line_num
    return 1  # pandas saw what the csv module does not (not expected)


def _first_non_utf8(path: Path) -> tuple[int, int]:
    """(line number, byte within the line) of the first bytes that are not UTF-8."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                return number, exc.start + 1
    return 1, 1  # pandas saw what a line-by-line reading does not (not expected)


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
