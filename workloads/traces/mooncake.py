"""Mooncake traces (JSONL): `timestamp` (ms), `input_length`, `output_length`, `hash_ids`.

Each hash id names one block of `block_size` (512) prompt tokens; equal ids across requests mean
equal blocks (Mooncake hashes a block together with everything before it). Segments:
("mc:<hash_id>", 512) per full block, the last id covering the remaining tokens, and when the
prompt is longer than the ids cover, a tail ("mc:line:<n>", rest) that no other request shares.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from simcore.errors import ConfigError
from simcore.request import Segment
from workloads.traces.common import (
    TraceData,
    finish,
    numbers,
    read_jsonl,
    require_columns,
    shown,
    token_counts,
    where,
    with_rows,
)

# Hash ids name blocks; they are stored as int64 wherever they are kept.
INT64 = (-(2**63), 2**63 - 1)


def read_mooncake(path: Path, *, block_size: int = 512, keep_absolute: bool = False) -> TraceData:
    """A Mooncake JSONL trace with block-hash content as segments."""
    records, lines = read_jsonl(path)
    frame = with_rows(pd.DataFrame.from_records(records), lines)
    require_columns(
        [c for c in frame.columns if c != "row"], ["timestamp", "input_length", "output_length", "hash_ids"],
        source=path,
    )
    prompt = token_counts(frame, "input_length", source=path, unit="line")
    segments = [
        _segments(ids, int(n), line, block_size, path)
        for ids, n, line in zip(frame["hash_ids"].tolist(), prompt.tolist(), lines, strict=True)
    ]
    out = pd.DataFrame({
        "row": frame["row"].to_numpy(),
        "arrival_s": numbers(frame, "timestamp", source=path, unit="line") / 1000.0,
        "prompt_len": prompt,
        "output_len": token_counts(frame, "output_length", source=path, unit="line"),
        "segments": segments,
    })
    return TraceData(finish(out, keep_absolute=keep_absolute), arrival_column="timestamp", unit="line")


def _segments(hash_ids: object, prompt_len: int, line: int, block_size: int, path: Path) -> tuple[Segment, ...]:
    if not isinstance(hash_ids, list):
        raise ConfigError(
            "hash_ids must be a list of integers", source=str(path), where=where("line", line, "hash_ids"),
            found=shown(hash_ids),
        )
    for k, h in enumerate(hash_ids):
        if not isinstance(h, int) or isinstance(h, bool) or not INT64[0] <= h <= INT64[1]:
            raise ConfigError(
                f"hash id {k + 1} is not an integer in int64 range", source=str(path),
                where=where("line", line, "hash_ids"), found=shown(h),
            )
    num_blocks = -(-prompt_len // block_size)
    if len(hash_ids) > num_blocks:
        raise ConfigError(
            "more hash ids than blocks in the prompt", source=str(path), where=where("line", line, "hash_ids"),
            expected=f"at most {num_blocks} for input_length {prompt_len} and block size {block_size}",
            found=len(hash_ids),
        )
    segments = [(f"mc:{h}", min(block_size, prompt_len - k * block_size)) for k, h in enumerate(hash_ids)]
    covered = len(hash_ids) * block_size
    if prompt_len > covered:
        segments.append((f"mc:line:{line}", prompt_len - covered))
    return tuple(segments)
