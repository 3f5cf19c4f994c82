"""Trace readers, one module per format, and `load_trace` that applies the shared options.

Readers: generic (csv/jsonl/parquet), azure, burstgpt, mooncake, sharegpt. Each returns a
`TraceData` (see common.py) and never prints; notes go back to the caller.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from simcore.errors import ConfigError
from workloads.durations import sample_durations
from workloads.spec import (
    AzureTrace,
    BurstGptTrace,
    GenericTrace,
    MooncakeTrace,
    ShareGptTrace,
    TimedTrace,
    WorkloadSpec,
)
from workloads.streams import stream
from workloads.traces.common import TraceData


def load_trace(spec: WorkloadSpec, *, seed: int, base_dir: Path, source: str | None = None) -> TraceData:
    """The requests of `spec.trace` as a frame sorted by arrival, options applied, plus notes."""
    from workloads.traces.builtin import resolve_trace_path
    from workloads.traces.options import apply_time_options, check_arrivals

    trace = spec.trace
    assert trace is not None
    path = resolve_trace_path(trace.path, base_dir=base_dir, source=source)
    cap = _cap(trace.max_requests, spec.num_requests)
    if isinstance(trace, ShareGptTrace):
        return _load_sharegpt(trace, path, spec=spec, seed=seed, base_dir=base_dir, cap=cap, source=source)
    assert isinstance(trace, TimedTrace)
    data = read_timed(trace, path, source=source)
    frame, notes = apply_time_options(
        data.frame, trace, seed=seed, arrivals=spec.arrivals, max_requests=cap, source=source
    )
    check_arrivals(frame, keep_absolute=trace.keep_absolute, path=path, column=data.arrival_column, unit=data.unit)
    return TraceData(frame, data.notes + notes)


def read_timed(trace: TimedTrace, path: Path, *, source: str | None = None) -> TraceData:
    """Dispatch to the reader of `trace.format`."""
    absolute = trace.keep_absolute
    if isinstance(trace, GenericTrace):
        from workloads.traces.generic import read_generic

        return read_generic(path, fmt=trace.format, columns=trace.columns, time_unit=trace.time_unit,
                            keep_absolute=absolute)
    if isinstance(trace, AzureTrace):
        from workloads.traces.azure import read_azure

        return read_azure(path, keep_absolute=absolute)
    if isinstance(trace, BurstGptTrace):
        from workloads.traces.burstgpt import read_burstgpt

        return read_burstgpt(path, models=_as_list(trace.model), log_types=_as_list(trace.log_type),
                             keep_absolute=absolute, option_source=source)
    if isinstance(trace, MooncakeTrace):
        from workloads.traces.mooncake import read_mooncake

        return read_mooncake(path, block_size=trace.block_size, keep_absolute=absolute)
    raise TypeError(f"no reader for {trace!r}")


def _load_sharegpt(
    trace: ShareGptTrace, path: Path, *, spec: WorkloadSpec, seed: int, base_dir: Path, cap: int | None,
    source: str | None,
) -> TraceData:
    from workloads.arrivals import sample_arrivals
    from workloads.traces.options import sample_indices
    from workloads.traces.sharegpt import count_tokens, load_conversations, sharegpt_table

    notes: list[str] = []
    conversations = load_conversations(path)
    if trace.sample is not None:
        keep = sample_indices(len(conversations), trace.sample, seed=seed, notes=notes, what="conversations")
        conversations = [conversations[i] for i in keep]
    texts = [t for conv in conversations for t in conv.texts]
    tokenizer = (Path(base_dir) / trace.tokenizer).resolve() if trace.tokenizer else None
    counts, count_notes = count_tokens(texts, tokenizer=tokenizer, chars_per_token=trace.chars_per_token,
                                       source=source)
    notes += count_notes
    token_lens, at = [], 0
    for conv in conversations:
        token_lens.append(counts[at:at + len(conv.texts)])
        at += len(conv.texts)
    assert spec.arrivals is not None  # WorkloadSpec requires it for sharegpt
    starts = sample_arrivals(spec.arrivals, len(conversations), stream(seed, "arrivals"))
    # One think time per message: enough for every turn, known before the turns are counted.
    think_s = sample_durations(trace.think_time_s, max(len(texts), 1), stream(seed, "think_time"))
    frame, num_empty = sharegpt_table(conversations, token_lens, starts=starts, think_s=think_s,
                                      max_tokens=spec.max_tokens)
    if num_empty:
        notes.append(f"{path.name}: left out {num_empty} conversation(s) without a reply to a prompt")
    _check_prompt_lengths(frame, path)
    frame = frame.sort_values("arrival_s", kind="stable").reset_index(drop=True)
    if cap is not None:
        frame = frame.iloc[:cap]
    return TraceData(frame, notes)


def _check_prompt_lengths(frame: pd.DataFrame, path: Path) -> None:
    """A turn's prompt is its whole conversation so far: past MAX_TOKENS (estimated with a small
    chars_per_token, or a very long conversation) it is an error naming the conversation."""
    from workloads.spec import MAX_TOKENS

    too_long = np.flatnonzero(frame["prompt_len"].to_numpy() > MAX_TOKENS)
    if len(too_long):
        i = int(too_long[0])
        conversation = int(frame["session_id"].iat[i].removeprefix("s")) + 1
        raise ConfigError(
            f"turn {int(frame['turn'].iat[i]) + 1}'s prompt (the conversation so far) has "
            f"{int(frame['prompt_len'].iat[i])} tokens", source=str(path), where=f"conversation {conversation}",
            expected=f"at most {MAX_TOKENS}",
        )


def _cap(*limits: int | None) -> int | None:
    given = [n for n in limits if n is not None]
    return min(given) if given else None


def _as_list(value: str | list[str] | None) -> list[str] | None:
    return [value] if isinstance(value, str) else value


__all__ = ["TraceData", "load_trace", "read_timed"]
