"""`servesim export --tokens DIR`: what the real engine produced, as JSONL, one file per policy.

One line per request, in request-id order: {"request_id", "prompt_token_ids", "output_token_ids"}.
The token columns are in a requests table only when the run recorded them (the torch cost
model with `record_tokens: true`); `prompt_token_ids` is null for a request the workload gave
no ids.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from experiments.report_load import Results
from simcore.errors import ConfigError


def token_ids(cell: object) -> list[int] | None:
    """A token-list cell as read back: an array (Parquet), JSON text (CSV), or missing."""
    if cell is None or (isinstance(cell, float) and math.isnan(cell)) or cell is pd.NA:
        return None
    if isinstance(cell, str):
        return json.loads(cell)
    return [int(t) for t in cell]


def token_lines(requests: pd.DataFrame) -> Iterator[str]:
    """The JSONL lines of one requests table."""
    prompts = requests["prompt_token_ids"] if "prompt_token_ids" in requests.columns else [None] * len(requests)
    for request_id, prompt, output in zip(requests["request_id"], prompts, requests["output_token_ids"],
                                          strict=True):
        yield json.dumps({"request_id": int(request_id), "prompt_token_ids": token_ids(prompt),
                          "output_token_ids": token_ids(output) or []})


def export_tokens(results: Results, rows: list[dict], out: Path | None) -> list[Path]:
    """Write each policy's tokens; `out` is a .jsonl file (one policy) or a folder (default
    DIR/tokens/<label>.jsonl, or DIR/tokens/<point_id>/<label>.jsonl for a sweep)."""
    from experiments.io import atomic_write_text, locked_folder, path_under
    from experiments.report_load import read_policy_table

    single_file = out is not None and out.suffix == ".jsonl"
    if single_file and len(rows) != 1:
        raise ConfigError(f"--out names one file but {len(rows)} policies would be exported; "
                          "give a folder or pick one with --policy", where="--out")
    folder = out if out is not None and not single_file else results.root / "tokens"
    written = []
    # Writing inside the results folder: held (as `export --vllm` holds it), so that a run
    # replacing that folder meanwhile waits. Each file is written whole or not at all.
    with locked_folder(results.root, where="DIR") if out is None else contextlib.nullcontext():
        for row in rows:
            policy_folder = results.policy_folder(row)
            requests = read_policy_table(policy_folder, "requests")
            if "output_token_ids" not in requests.columns:
                raise ConfigError("this run recorded no tokens; run it with the torch cost model and "
                                  "record_tokens: true", source=str(policy_folder))
            sub = str(row["point_id"]) if row.get("point_id") else ""
            # Labels and point ids come from the results folder: path_under keeps a file inside `folder`.
            path = out if single_file else path_under(folder, sub, f"{row['label']}.jsonl")
            atomic_write_text(path, "".join(line + "\n" for line in token_lines(requests)))
            written.append(path)
    return written
