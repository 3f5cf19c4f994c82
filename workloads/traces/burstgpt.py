"""BurstGPT (Azure OpenAI usage at a campus): `Timestamp,Model,Request tokens,Response tokens,
Total tokens,Log Type`, Timestamp in seconds from the start of the log.

Rows may be filtered by `Model` (e.g. ChatGPT, GPT-4) and `Log Type` (Conversation log, API log).
Failed requests appear with 0 response tokens; they are dropped and counted in a note.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from simcore.errors import ConfigError
from workloads.traces.common import TraceData, finish, numbers, read_csv, require_columns, shown, token_counts

COLUMNS = ["Timestamp", "Model", "Request tokens", "Response tokens", "Log Type"]


def read_burstgpt(
    path: Path,
    *,
    models: list[str] | None = None,
    log_types: list[str] | None = None,
    keep_absolute: bool = False,
    option_source: str | None = None,
) -> TraceData:
    """Successful requests of a BurstGPT log, optionally of some models / log types only."""
    frame = read_csv(path)
    require_columns(list(frame.columns), COLUMNS, source=path)
    notes: list[str] = []
    keep = np.ones(len(frame), dtype=bool)
    for column, wanted, option in (("Model", models, "model"), ("Log Type", log_types, "log_type")):
        if wanted == []:
            # An empty list would keep no row: surely not what was meant.
            raise ConfigError("an empty list selects no rows", source=option_source, where=f"workload.trace.{option}",
                              expected="a name, a list of names, or no key (every row)")
        if wanted:
            keep &= _matching(frame[column], wanted, option=option, path=path, option_source=option_source)

    arrival = numbers(frame, "Timestamp", source=path, unit="row")
    output = token_counts(frame, "Response tokens", source=path, unit="row", minimum=0)
    failed = keep & (output == 0)
    if failed.any():
        notes.append(f"{path.name}: dropped {int(failed.sum())} failed request(s) with 0 response tokens")
    keep &= ~failed
    # Failed rows may log an empty request too; only the kept ones must have a prompt.
    prompt = token_counts(frame.loc[keep], "Request tokens", source=path, unit="row")
    out = pd.DataFrame({
        "row": frame["row"].to_numpy()[keep],
        "arrival_s": arrival[keep],
        "prompt_len": prompt,
        "output_len": output[keep],
    })
    return TraceData(finish(out, keep_absolute=keep_absolute), notes, arrival_column="Timestamp")


def _matching(
    values: pd.Series, wanted: list[str], *, option: str, path: Path, option_source: str | None
) -> np.ndarray:
    present = sorted(values.dropna().astype(str).unique().tolist())
    for name in wanted:
        if name not in present:
            # A log may hold thousands of distinct names: the message lists a few.
            listed = shown(", ".join(repr(p) for p in present[:10]) + (", ..." if len(present) > 10 else ""))
            raise ConfigError(
                f"no rows with this value in {path.name}", source=option_source, where=f"workload.trace.{option}",
                expected=f"one of {listed}", found=shown(name), choices=present,
            )
    return values.astype(str).isin(wanted).to_numpy()
