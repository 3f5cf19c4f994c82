"""Property-based fuzzing of trace files in every format (hypothesis).

Random and corrupted rows (empty cells, negatives, float strings, huge numbers, text, NaN/inf,
ragged rows, broken quoting, invalid JSON lines, non-UTF-8 bytes), misspelt or missing headers,
and random trace options (window, sample, rescale, cap, lengths_only). Each file is run through a
tiny experiment: it either simulates with every request reported exactly once, or raises a
ServesimError naming the file; never another exception and never a hang.
"""

from __future__ import annotations

import csv
import io
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_fuzz_config import FUZZ_SETTINGS, report, run_one, typo

EXAMPLES_PER_TEST = 1000

# --- cells and values ---------------------------------------------------------------------------

JUNK_CELLS = ["", " ", "-3", "0", "2.5", "1e30", "99999999999999999999999", "abc", "inf", "-inf", "nan", "NaN",
              "1,2", '"7"', "0x10", "1_000", "true", "[1,2]", '"', "5 ", " 5", "-0", "1e-300", "２"]
valid_count = st.integers(1, 300)
cell = st.one_of(
    valid_count.map(str), valid_count.map(str), valid_count.map(str),
    st.sampled_from(JUNK_CELLS),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-(10**20), 10**20).map(str),
    st.text(max_size=6),
)
time_cell = st.one_of(st.floats(0, 100).map(lambda x: f"{x:.3f}"), st.sampled_from(JUNK_CELLS))
json_value = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 400), st.integers(-(10**30), 10**30),
              st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=2),
    max_leaves=5,
)


# How corrupt the current file is: 0 (clean), 1 (a bad value now and then), 4 (many), out of 30.
_level = {"bad": 1}


def corruption(draw) -> None:  # noqa: ANN001
    """Draw how corrupt this file will be (clean files let the simulation itself be fuzzed)."""
    _level["bad"] = draw(st.sampled_from([0, 0, 1, 1, 4]))


def maybe(draw, strategy: st.SearchStrategy, good: Any) -> Any:  # noqa: ANN001
    """`good` most of the time, else a draw from `strategy` (a corrupted value)."""
    return draw(strategy) if draw(st.integers(1, 30)) <= _level["bad"] else good


def chance(draw, one_in: int) -> bool:  # noqa: ANN001
    """A structural corruption with probability about 1/one_in, never in a clean file."""
    return _level["bad"] > 0 and draw(st.integers(1, one_in)) == 1


def header(draw, names: list[str]) -> list[str]:  # noqa: ANN001
    """The columns, sometimes misspelt, dropped, duplicated or joined by an extra one."""
    names = list(names)
    op = draw(st.integers(0, 15)) if _level["bad"] else -1
    if op == 0 and names:
        i = draw(st.integers(0, len(names) - 1))
        names[i] = typo(names[i], draw)
    elif op == 1 and names:
        names.pop(draw(st.integers(0, len(names) - 1)))
    elif op == 2:
        names.append(draw(st.sampled_from(["extra", "arrival_s", "x y", ""])))
    return names


def csv_text(draw, names: list[str], rows: list[list[str]]) -> str:  # noqa: ANN001
    """Well-quoted CSV most of the time, else raw joined cells (broken quoting, ragged rows)."""
    if chance(draw, 4):
        lines = [",".join(names)] + [",".join(r) for r in rows]
        return "\n".join(lines) + draw(st.sampled_from(["\n", "", "\n\n"]))
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(names)
    writer.writerows(rows)
    return buffer.getvalue()


def ragged(draw, row: list[str]) -> list[str]:  # noqa: ANN001
    if chance(draw, 10):
        return row[:-1] if row and draw(st.booleans()) else [*row, "9"]
    return row


# --- files of each format ------------------------------------------------------------------------


@st.composite
def generic_csv(draw) -> tuple[str, str, dict]:
    corruption(draw)
    extras = draw(st.lists(st.sampled_from(["session_id", "turn", "cache_salt", "adapter_id", "prefix_key",
                                            "prefix_len", "prompt_token_ids", "segments", "priority"]),
                           unique=True, max_size=2))
    names = ["arrival_s", "prompt_len", "output_len", *extras]
    rows = []
    t = 0.0
    for _ in range(draw(st.integers(0, 8))):
        t += draw(st.floats(0, 3))
        row = [maybe(draw, time_cell, f"{t:.4f}"), maybe(draw, cell, str(draw(valid_count))),
               maybe(draw, cell, str(draw(st.integers(1, 40))))]
        for extra in extras:
            row.append(_extra_cell(draw, extra, row))
        rows.append(ragged(draw, row))
    return "t.csv", csv_text(draw, header(draw, names), rows), {"format": "csv"}


def _extra_cell(draw, name: str, row: list[str]) -> str:  # noqa: ANN001
    if name in ("session_id", "cache_salt", "adapter_id", "prefix_key"):
        return draw(st.sampled_from(["a", "b", "", "s1", "0"]))
    if name == "turn":
        return maybe(draw, cell, str(draw(st.integers(0, 3))))
    if name == "priority":
        return maybe(draw, cell, str(draw(st.sampled_from([0, 1, -1, 2**31 - 1, -(2**31)]))))
    if name == "prefix_len":
        return maybe(draw, cell, str(draw(st.integers(1, 20))))
    if name == "prompt_token_ids":
        ids = draw(st.lists(st.integers(0, 100), max_size=6))
        return maybe(draw, st.sampled_from(["[", "[1,-2]", "x", "[]", "[1.5]", "{}"]), json.dumps(ids))
    segs = [[draw(st.sampled_from(["k1", "k2"])), draw(st.integers(1, 30))] for _ in range(draw(st.integers(1, 2)))]
    return maybe(draw, st.sampled_from(["[]", "[[1]]", '[["a", 0]]', "nope"]), json.dumps(segs))


@st.composite
def generic_jsonl(draw) -> tuple[str, str, dict]:
    corruption(draw)
    lines = []
    t = 0.0
    for _ in range(draw(st.integers(0, 8))):
        if chance(draw, 12):
            lines.append(draw(st.sampled_from(["", "{", "[1, 2]", "5", "null", '{"arrival_s": 1,}', "garbage"])))
            continue
        t += draw(st.floats(0, 3))
        record: dict[str, Any] = {
            "arrival_s": maybe(draw, json_value, round(t, 4)),
            "prompt_len": maybe(draw, json_value, draw(valid_count)),
            "output_len": maybe(draw, json_value, draw(st.integers(1, 40))),
        }
        if draw(st.integers(0, 3)) == 0:
            ids = draw(st.lists(st.integers(0, 50), min_size=1, max_size=5))
            record["prompt_token_ids"] = maybe(draw, json_value, ids)
            if draw(st.booleans()):
                record.pop("prompt_len")
            else:
                record["prompt_len"] = maybe(draw, json_value, len(ids))
        if draw(st.integers(0, 4)) == 0 and "prompt_token_ids" not in record:
            n = draw(st.integers(1, 30))
            record["segments"] = maybe(draw, json_value, [[draw(st.sampled_from(["k", "j"])), n]])
            record["prompt_len"] = maybe(draw, json_value, n)
        if draw(st.integers(0, 4)) == 0:
            key = draw(st.sampled_from(["session_id", "cache_salt", "adapter_id", "junk", "priority"]))
            good = draw(st.integers(-3, 3)) if key == "priority" else draw(st.sampled_from(["a", "b", None]))
            record[key] = maybe(draw, json_value, good)
        if chance(draw, 6):
            record.pop(draw(st.sampled_from(sorted(record))))
        lines.append(json.dumps(record))
    return "t.jsonl", "\n".join(lines) + "\n", {"format": "jsonl"}


@st.composite
def parquet_file(draw) -> tuple[str, bytes, dict]:
    corruption(draw)
    n = draw(st.integers(0, 6))
    numbers = st.one_of(st.integers(-3, 300), st.floats(allow_nan=True, allow_infinity=True))
    frame = pd.DataFrame({
        "arrival_s": [float(maybe(draw, numbers, i)) for i in range(n)],
        "prompt_lens" if chance(draw, 5) else "prompt_len": [maybe(draw, numbers, draw(valid_count)) for _ in range(n)],
        "output_len": [maybe(draw, st.integers(-1, 50), draw(st.integers(1, 50))) for _ in range(n)],
    })
    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False)
    data = buffer.getvalue()
    if chance(draw, 8):
        data = data[: draw(st.integers(0, len(data)))]
    return "t.parquet", data, {"format": "parquet"}


@st.composite
def mooncake(draw) -> tuple[str, str, dict]:
    corruption(draw)
    lines = []
    for i in range(draw(st.integers(0, 6))):
        n = draw(st.integers(1, 1200))
        record = {
            "timestamp": maybe(draw, json_value, i * draw(st.integers(0, 500))),
            "input_length": maybe(draw, json_value, n),
            "output_length": maybe(draw, json_value, draw(st.integers(1, 30))),
            "hash_ids": maybe(draw, json_value, list(range(draw(st.integers(0, -(-n // 512)))))),
        }
        if chance(draw, 8):
            record.pop(draw(st.sampled_from(sorted(record))))
        lines.append(json.dumps(record))
    return "m.jsonl", "\n".join(lines), {"format": "mooncake", "block_size": draw(st.sampled_from([16, 512]))}


@st.composite
def azure(draw) -> tuple[str, str, dict]:
    corruption(draw)
    published = draw(st.booleans())
    names = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"] if published else \
        ["arrived_at", "num_prefill_tokens", "num_decode_tokens"]
    junk_time = st.sampled_from(["", "yesterday", "2023-13-40 25:00:00", "2023-11-16", "1700000000", "nan"])
    rows = []
    for i in range(draw(st.integers(0, 6))):
        good_time = f"2023-11-16 18:15:{i:02d}.6805900" if published else f"{i * 0.5:.2f}"
        rows.append(ragged(draw, [maybe(draw, junk_time, good_time), maybe(draw, cell, str(draw(valid_count))),
                                  maybe(draw, cell, str(draw(st.integers(1, 40))))]))
    return "a.csv", csv_text(draw, header(draw, names), rows), {"format": "azure"}


@st.composite
def burstgpt(draw) -> tuple[str, str, dict]:
    corruption(draw)
    names = ["Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type"]
    rows = []
    for i in range(draw(st.integers(0, 6))):
        rows.append(ragged(draw, [
            maybe(draw, time_cell, str(i)), draw(st.sampled_from(["ChatGPT", "GPT-4", ""])),
            maybe(draw, cell, str(draw(valid_count))), maybe(draw, cell, str(draw(st.integers(0, 40)))),
            "0", draw(st.sampled_from(["Conversation log", "API log"])),
        ]))
    options: dict[str, Any] = {"format": "burstgpt"}
    if draw(st.integers(0, 3)) == 0:
        options["model"] = draw(st.sampled_from(["ChatGPT", "GPT-4", "gpt4", ["ChatGPT", "GPT-4"]]))
    if draw(st.integers(0, 3)) == 0:
        options["log_type"] = draw(st.sampled_from(["Conversation log", "API log", "api"]))
    return "b.csv", csv_text(draw, header(draw, names), rows), options


@st.composite
def sharegpt(draw) -> tuple[str, str, dict]:
    corruption(draw)
    conversations: Any = []
    for i in range(draw(st.integers(0, 4))):
        roles = ["system"] if draw(st.integers(0, 4)) == 0 else []
        for _ in range(draw(st.integers(1, 3))):
            roles += [draw(st.sampled_from(["human", "user"])), draw(st.sampled_from(["gpt", "assistant"]))]
        if draw(st.integers(0, 4)) == 0:
            roles = draw(st.permutations(roles))
        messages = [
            {"from": maybe(draw, st.sampled_from(["robot", "", None, 5, "Human"]), role),
             "value": maybe(draw, json_value, draw(st.text(max_size=40)))}
            for role in roles
        ]
        conversations.append(maybe(draw, json_value, {"id": f"c{i}", "conversations": messages}))
    text = json.dumps(maybe(draw, json_value, conversations))
    if chance(draw, 10):
        text = text[: draw(st.integers(0, len(text)))]
    options = {"format": "sharegpt", "chars_per_token": draw(st.sampled_from([1.0, 4.0, 0.5]))}
    return "s.json", text, options


@st.composite
def binary_junk(draw) -> tuple[str, bytes, dict]:
    fmt = draw(st.sampled_from(["csv", "jsonl", "parquet", "azure", "burstgpt", "mooncake", "sharegpt"]))
    data = draw(st.binary(max_size=60))
    if draw(st.booleans()):
        data = b"arrival_s,prompt_len,output_len\n" + data
    return "junk.bin", data, {"format": fmt}


# --- trace options and the experiment around the file -------------------------------------------


@st.composite
def trace_options(draw, fmt: str) -> dict:
    options: dict[str, Any] = {}
    if draw(st.integers(0, 4)) == 0:
        options["max_requests"] = draw(st.integers(1, 5))
    if draw(st.integers(0, 4)) == 0:
        options["sample"] = {"n": draw(st.integers(1, 8)), "seed": draw(st.integers(0, 3))}
        if draw(st.booleans()):
            options["sample"]["replace"] = draw(st.booleans())
    if fmt == "sharegpt":
        return options
    if draw(st.integers(0, 4)) == 0:
        start = draw(st.floats(0, 10))
        options["time_window"] = [start, start + draw(st.floats(0, 20))]
    choice = draw(st.integers(0, 6))
    if choice == 0:
        options["time_scale"] = draw(st.floats(0.01, 100))
    elif choice == 1:
        options["target_rate"] = draw(st.floats(0.01, 100))
    if draw(st.integers(0, 5)) == 0:
        options["keep_absolute"] = True
    if draw(st.integers(0, 5)) == 0:
        options["shift_to_zero"] = True
    if draw(st.integers(0, 5)) == 0:
        options["lengths_only"] = True
    return options


def experiment_for(path: Path, options: dict, extra: dict) -> dict:
    trace = {"path": str(path), **options, **extra}
    workload: dict[str, Any] = {"trace": trace}
    if trace.get("format") == "sharegpt" or trace.get("lengths_only"):
        workload["arrivals"] = {"kind": "poisson", "rate": 5.0}
    return {
        "name": "fuzz-trace",
        "model": "llama-3.1-8b",
        "hardware": "h100-sxm",
        "kv_cache": {"block_size": 16, "num_blocks": 64, "prefix_caching": True},
        "workload": workload,
        "cost_model": {"name": "constant", "step_s": 0.01},
        "policies": [{"name": "continuous"}, {"name": "chunked_prefill", "chunk_size": 16}],
        "limits": {"max_wall_time_s": 2.0, "check_invariants": True},
        "output": {"plots": False},
    }


def fuzz_traces(files: st.SearchStrategy, tmp_path: Path, name: str) -> None:
    counts: Counter = Counter()
    started = time.perf_counter()

    @settings(max_examples=EXAMPLES_PER_TEST, **FUZZ_SETTINGS)
    @given(files, st.data())
    def check(file, data):
        filename, content, extra = file
        path = tmp_path / filename
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
        options = data.draw(trace_options(extra["format"]))
        run_one(experiment_for(path, options, extra), counts)

    check()
    report(name, counts, started)
    assert sum(counts.values()) >= EXAMPLES_PER_TEST * 0.9


def test_fuzz_generic_csv_and_parquet(tmp_path):
    fuzz_traces(st.one_of(generic_csv(), generic_csv(), parquet_file()), tmp_path, "generic csv/parquet traces")


def test_fuzz_generic_jsonl(tmp_path):
    fuzz_traces(generic_jsonl(), tmp_path, "generic jsonl traces")


def test_fuzz_published_formats(tmp_path):
    fuzz_traces(st.one_of(azure(), burstgpt(), mooncake()), tmp_path, "azure/burstgpt/mooncake traces")


def test_fuzz_sharegpt_and_binary(tmp_path):
    fuzz_traces(st.one_of(sharegpt(), binary_junk()), tmp_path, "sharegpt and binary junk")


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400"])
def test_non_finite_arrival_cells_are_named(tmp_path, value):
    """Non-finite cells are rejected with their row and column (never a NaN arrival time)."""
    from experiments.config import parse_experiment
    from experiments.runner import run_experiment
    from simcore.errors import ConfigError

    path = tmp_path / "t.csv"
    path.write_text(f"arrival_s,prompt_len,output_len\n0,5,5\n{value},5,5\n")
    exp = parse_experiment(experiment_for(path, {}, {"format": "csv"}), source="exp.yaml")
    with pytest.raises(ConfigError, match=r"t.csv: row 2, column 'arrival_s': (non-finite value|empty or NaN)"):
        run_experiment(exp, source=None)
