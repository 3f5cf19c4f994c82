"""Atomic result files: write to a temporary name in the same folder, then rename.

A reader therefore sees either the old file or the whole new one, never a partial file.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        # mkstemp creates 0600; give the file the permissions a plain open() would.
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False, default=_jsonable) + "\n")


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def write_table(frame: pd.DataFrame, path: Path, fmt: str) -> Path:
    """Write a table as Parquet or CSV (suffix set from the format), atomically."""
    path = path.with_suffix(".parquet" if fmt == "parquet" else ".csv")
    if fmt == "parquet":
        import io

        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pandas(frame, preserve_index=False)
        # Dictionary pages only for non-numeric columns (text with few distinct values): on the
        # numeric ones they tripled the write time of a 10k-request table and grew the file.
        others = [f.name for f in table.schema if not (pa.types.is_integer(f.type) or pa.types.is_floating(f.type))]
        buffer = io.BytesIO()
        pq.write_table(table, buffer, use_dictionary=others)
        atomic_write_bytes(path, buffer.getvalue())
    else:
        atomic_write_text(path, frame.to_csv(index=False))
    return path


def read_table(path: Path) -> pd.DataFrame:
    if path.suffix == ".parquet":
        return pd.read_parquet(path)
    return pd.read_csv(path)
