"""Property-based fuzzing of trace files in every format (hypothesis).

Random and corrupted rows (empty cells, negatives, float strings, huge numbers, text, NaN/inf,
ragged rows, broken quoting, invalid JSON lines, non-UTF-8 bytes), misspelt or missing headers,
and random trace options (window, sample, rescale, cap, lengths_only). Each file is run through a
tiny experiment: it either simulates with every request reported exactly once, or raises a
ServesimError naming the file; never another exception and never a hang.

Then (test_fuzz_edges_*) the edges of number and text parsing in every reader and every reader
option, checked on the workload alone, so thousands of cases run (see "edges of numbers and
text" below). Per-test example counts print at the end of each test (pytest -rP).
"""

from __future__ import annotations

import csv
import decimal
import io
import json
import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_fuzz_config import FUZZ_SETTINGS, hang_guard, memory_guard, report, run_one, typo

# Many generated cases: run with `-m fuzz` (CI does; the default run leaves them out).
pytestmark = pytest.mark.fuzz

EXAMPLES_PER_TEST = 1000

# --- cells and values ---------------------------------------------------------------------------

JUNK_CELLS = ["", " ", "-3", "0", "2.5", "1e30", "99999999999999999999999", "abc", "inf", "-inf", "nan", "NaN",
              "1,2", '"7"', "0x10", "1_000", "true", "[1,2]", '"', "5 ", " 5", "-0", "1e-300", "２", "9" * 400, "1e400"]
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
    st.one_of(st.none(), st.booleans(), st.integers(-5, 400), st.integers(-(10**30), 10**30), st.just(-(10**400)),
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

# The generic format's optional columns.
OPTIONAL_COLUMNS = ["session_id", "turn", "cache_salt", "adapter_id", "prefix_key", "prefix_len",
                    "prompt_token_ids", "segments", "priority"]


@st.composite
def generic_csv(draw) -> tuple[str, str, dict]:
    corruption(draw)
    extras = draw(st.lists(st.sampled_from(OPTIONAL_COLUMNS), unique=True, max_size=2))
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


# --- edges of numbers and text, straight through the readers -----------------------------------------
#
# Files of every format whose cells sit at the edges of number and text parsing (integers past
# int64 and past the float range, 1e400, NaN/inf in every spelling, 5,000-digit integers, JSON
# nested past the recursion limit, lone surrogates, BOMs, UTF-16, stray bytes, timestamps outside
# 1677-2262 or with zones mixed, empty, blank, header-only and binary files, huge lines), read with
# every reader option at its own edges (0, negative, NaN, inf, 5e-324, 1e308, empty or unknown
# column names, empty lists). Only the workload is built (a few ms a case, no simulation), so
# thousands of cases run. The property: a valid workload (every arrival a finite time >= 0, the
# simulation clock's start; counts in range; text that is Unicode), or a ConfigError naming the
# file and where in it (row, line, column, header) or the trace option, in a bounded message;
# never another exception, never a hang.

EDGE_EXAMPLES = 700
# Longest message a case may give: a temporary folder's path, a list of expected names, a value
# cut to ~80 characters.
MAX_MESSAGE = 600
HUGE = "9" * 400
DEEP = "[" * 3000 + "]" * 3000  # past the recursion limit (1,000)
NESTED = "[" * 300 + "1" + "]" * 300  # within it
EDGE_NUMBERS = [  # cells of a CSV (or text cells of JSON): pandas reads them itself
    HUGE, "-" + HUGE, str(2**63), str(2**64), str(-(2**63) - 1), "1" * 5000, "1e400", "-1e400", "1e308", "-1e308",
    "1e-400", "5e-324", "nan", "NaN", "inf", "-Infinity", "0", "-0", "-1", "0.5", "1e19", "", " ", "0x1F", "1_000",
    "５", "\u00a07", "7\x00", "x" * 3000,
]
EDGE_JSON = [  # JSON literals, as a JSONL line or a JSON text cell spells them
    HUGE, "-" + HUGE, str(2**63), str(2**64), str(-(2**63) - 1), "1" * 5000, "1e400", "-1e400", "1e308", "5e-324",
    "NaN", "Infinity", "-Infinity", "0", "-0", "-1", "0.5", "true", "null", '"7"', '"1e400"', f'"{HUGE}"', '"x"',
    "[]", "{}", "[1]", '"\\ud800"', '"a\\udfff"', '"\\ud83d\\ude00"', f'"{"x" * 3000}"', DEEP, NESTED,
]
# Lists of JSON with an edge inside (token ids, segments, hash ids), or an edge instead of the list.
EDGE_LISTS = [f"[1, {v}]" for v in EDGE_JSON] + EDGE_JSON
EDGE_SEGMENTS = [f'[["k", {v}]]' for v in EDGE_JSON] + [f"[[{v}, 16]]" for v in EDGE_JSON] + EDGE_JSON
EDGE_TEXT = ["", " ", "a", "0", "1.0", "\u00e9", "\x00", "x" * 3000, "\u0661", "nan", "None", "True"]
EDGE_TIMES = [
    "2023-11-16 18:15:46.6805900", "10000-01-01 00:00:00", "9999-12-31 23:59:59", "1677-09-21 00:12:43",
    "1677-09-22 00:00:00", "2262-04-11 23:47:16", "2262-04-12 00:00:00", "1969-12-31 23:59:59",
    "1970-01-01 00:00:00", "0001-01-01 00:00:00", "2023-11-16 18:15:46+02:00", "2023-11-16T18:15:46Z",
    "2023-11-16 18:15:46-05:00", "2023-11-16", "20231116T181546", "1700000000", "", "x" * 500,
    "2023-11-16 18:15:46.123456789123",
]
NAN, INF = float("nan"), float("inf")
TINY = 5e-324
# A message about a whole file (nothing narrower to name) says one of these.
WHOLE_FILE = ("the file is empty", "the file has no JSON lines", "not a readable", "invalid JSON",
              "expected a JSON list", "not UTF-8")


# How many of a file's cells are at an edge, out of 12: none (clean files let the options and the
# checks on valid workloads be fuzzed), one now and then, or many.
_edge_rate = {"per_12": 1}


def edge_level(draw) -> None:  # noqa: ANN001
    _edge_rate["per_12"] = draw(st.sampled_from([0, 0, 1, 1, 3]))


def edge(draw, good: Any, edges: list) -> Any:  # noqa: ANN001
    """`good`, or (at this file's rate) one of `edges`."""
    return draw(st.sampled_from(edges)) if draw(st.integers(1, 12)) <= _edge_rate["per_12"] else good


def mutated_bytes(draw, data: bytes) -> bytes:  # noqa: ANN001
    """The file as written (always for a clean file), or with a byte-order mark, in UTF-16, with a
    stray or NUL byte, CRLF line ends, cut short, blank, empty, binary, with a line of one 200 KB
    field or of 2,000 fields."""
    if _edge_rate["per_12"] == 0 or draw(st.integers(0, 2)) > 0:
        return data
    how = draw(st.sampled_from(["bom", "utf16", "stray-byte", "surrogate-bytes", "nul", "crlf", "cut", "blank",
                                "empty", "binary", "huge-line", "wide-line"]))
    if how == "bom":
        return b"\xef\xbb\xbf" + data
    if how == "utf16":
        return data.decode("utf-8").encode("utf-16")
    if how in ("stray-byte", "surrogate-bytes", "nul"):
        at = draw(st.integers(0, len(data)))
        return data[:at] + {"stray-byte": b"\xff", "surrogate-bytes": b"\xed\xa0\x80", "nul": b"\x00"}[how] + data[at:]
    if how == "crlf":
        return data.replace(b"\n", b"\r\n")
    if how == "cut":
        return data[: draw(st.integers(0, len(data)))]
    if how == "blank":
        return b" \n\t\n\n"
    if how == "empty":
        return b""
    if how == "binary":
        return draw(st.binary(min_size=1, max_size=200))
    if how == "wide-line":
        return data + b"\n" + b"1," * 2000 + b"\n"
    return data + b"\n0,5," + b"7" * 200_000 + b"\n"


def csv_bytes(names: list[str], rows: list[list[str]]) -> bytes:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(names)
    writer.writerows(rows)
    return buffer.getvalue().encode("utf-8")


def jsonl_line(fields: dict[str, str]) -> str:
    """A JSON object from raw JSON literals (so NaN, 400-digit integers, escapes stay as written);
    a key already in quotes is taken as written too (an escaped lone surrogate)."""
    keys = [key if key.startswith('"') else json.dumps(key) for key in fields]
    return "{" + ", ".join(f"{key}: {value}" for key, value in zip(keys, fields.values(), strict=True)) + "}"


@st.composite
def edge_generic_csv(draw) -> tuple[str, bytes, dict]:
    edge_level(draw)
    extras = draw(st.lists(st.sampled_from(OPTIONAL_COLUMNS), unique=True, max_size=3))
    names = ["arrival_s", "prompt_len", "output_len", *extras]
    rows = []
    for i in range(draw(st.integers(0, 4))):
        row = [edge(draw, str(i), EDGE_NUMBERS), edge(draw, "16", EDGE_NUMBERS), edge(draw, "4", EDGE_NUMBERS)]
        for extra in extras:
            if extra in ("session_id", "cache_salt", "adapter_id", "prefix_key"):
                row.append(edge(draw, "s1", EDGE_TEXT))
            elif extra == "prompt_token_ids":
                row.append(edge(draw, json.dumps(list(range(16))), EDGE_LISTS))
            elif extra == "segments":
                row.append(edge(draw, '[["k", 16]]', EDGE_SEGMENTS))
            else:  # turn, prefix_len, priority
                row.append(edge(draw, "1", EDGE_NUMBERS))
        rows.append(row)
    return "t.csv", mutated_bytes(draw, csv_bytes(names, rows)), {"format": "csv"}


@st.composite
def edge_generic_jsonl(draw) -> tuple[str, bytes, dict]:
    edge_level(draw)
    lines = []
    for i in range(draw(st.integers(0, 4))):
        fields = {"arrival_s": edge(draw, str(i), EDGE_JSON), "prompt_len": edge(draw, "16", EDGE_JSON),
                  "output_len": edge(draw, "4", EDGE_JSON)}
        extra = draw(st.sampled_from([None, "session_id", "cache_salt", "prefix", "prompt_token_ids", "segments",
                                      "priority", "turn", '"\\udc00"']))
        if extra in ("session_id", "cache_salt", '"\\udc00"'):
            fields[extra] = edge(draw, '"s1"', EDGE_JSON)
        elif extra == "prefix":
            fields["prefix_key"], fields["prefix_len"] = edge(draw, '"p"', EDGE_JSON), edge(draw, "8", EDGE_JSON)
        elif extra == "prompt_token_ids":
            fields.pop("prompt_len")
            fields[extra] = edge(draw, json.dumps(list(range(16))), EDGE_LISTS)
        elif extra == "segments":
            fields.pop("prompt_len")
            fields[extra] = edge(draw, '[["k", 16]]', EDGE_SEGMENTS)
        elif extra is not None:
            fields[extra] = edge(draw, "1", EDGE_JSON)
        lines.append(edge(draw, jsonl_line(fields), EDGE_JSON))
    return "t.jsonl", mutated_bytes(draw, "\n".join(lines).encode("utf-8")), {"format": "jsonl"}


@st.composite
def edge_mooncake(draw) -> tuple[str, bytes, dict]:
    edge_level(draw)
    lines = []
    for i in range(draw(st.integers(0, 4))):
        fields = {"timestamp": edge(draw, str(i * 100), EDGE_JSON), "input_length": edge(draw, "600", EDGE_JSON),
                  "output_length": edge(draw, "4", EDGE_JSON),
                  "hash_ids": edge(draw, "[1, 2]", EDGE_LISTS)}
        lines.append(jsonl_line(fields))
    return "m.jsonl", mutated_bytes(draw, "\n".join(lines).encode("utf-8")), {"format": "mooncake"}


@st.composite
def edge_azure(draw) -> tuple[str, bytes, dict]:
    edge_level(draw)
    if draw(st.booleans()):
        names = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]
        times = [edge(draw, f"2023-11-16 18:15:{i:02d}.6805900", EDGE_TIMES) for i in range(draw(st.integers(0, 4)))]
    else:
        names = ["arrived_at", "num_prefill_tokens", "num_decode_tokens"]
        times = [edge(draw, f"{i * 0.5}", EDGE_NUMBERS) for i in range(draw(st.integers(0, 4)))]
    rows = [[t, edge(draw, "16", EDGE_NUMBERS), edge(draw, "4", EDGE_NUMBERS)] for t in times]
    return "a.csv", mutated_bytes(draw, csv_bytes(names, rows)), {"format": "azure"}


@st.composite
def edge_burstgpt(draw) -> tuple[str, bytes, dict]:
    edge_level(draw)
    names = ["Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type"]
    rows = [[edge(draw, str(i), EDGE_NUMBERS), edge(draw, "ChatGPT", EDGE_TEXT), edge(draw, "16", EDGE_NUMBERS),
             edge(draw, "4", EDGE_NUMBERS), "20", edge(draw, "API log", EDGE_TEXT)]
            for i in range(draw(st.integers(0, 4)))]
    return "b.csv", mutated_bytes(draw, csv_bytes(names, rows)), {"format": "burstgpt"}


@st.composite
def edge_sharegpt(draw) -> tuple[str, bytes, dict]:
    edge_level(draw)
    conversations = []
    for i in range(draw(st.integers(0, 3))):
        messages = [
            jsonl_line({"from": edge(draw, f'"{role}"', EDGE_JSON), "value": edge(draw, '"hello there"', EDGE_JSON)})
            for role in ("human", "gpt") * draw(st.integers(1, 2))
        ]
        fields = {"id": edge(draw, f'"c{i}"', EDGE_JSON), "conversations": "[" + ", ".join(messages) + "]"}
        conversations.append(jsonl_line(fields))
    text = edge(draw, "[" + ", ".join(conversations) + "]", EDGE_JSON)
    return "s.json", mutated_bytes(draw, text.encode("utf-8")), {"format": "sharegpt"}


EDGE_ARRAYS = {  # Parquet columns at their edges (pyarrow types pandas reads in its own ways)
    "float": lambda pa: pa.array([0.0, NAN, INF, -INF, 1e308, TINY]),
    "int64": lambda pa: pa.array([0, 2**63 - 1, -(2**63), 1, 2, 3], pa.int64()),
    "uint64": lambda pa: pa.array([0, 2**64 - 1, 2**63, 1, 2, 3], pa.uint64()),
    "decimal": lambda pa: pa.array([decimal.Decimal("1" + "0" * 70)] * 6, pa.decimal256(76, 0)),
    "timestamp": lambda pa: pa.array([0, 10**6, 2 * 10**6, 3 * 10**6, 4 * 10**6, 5 * 10**6], pa.timestamp("us")),
    "duration": lambda pa: pa.array([0, 1, 2, 3, 4, 5], pa.duration("s")),
    "text": lambda pa: pa.array(["1", "x" * 3000, "", "nan", HUGE, "2"]),
    "bool": lambda pa: pa.array([True, False] * 3),
    "null": lambda pa: pa.nulls(6),
    "list": lambda pa: pa.array([[1], [2**64 - 1], [], None, [0], [5]], pa.list_(pa.uint64())),
}


@st.composite
def edge_parquet(draw) -> tuple[str, bytes, dict]:
    edge_level(draw)
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    n = draw(st.integers(0, 6))
    columns = {"arrival_s": pa.array([float(i) for i in range(n)]), "prompt_len": pa.array([16] * n),
               "output_len": pa.array([4] * n)}
    for name in draw(st.lists(st.sampled_from([*columns, "prompt_token_ids", "session_id", "priority", "turn"]),
                              unique=True, max_size=2)):
        columns[name] = EDGE_ARRAYS[draw(st.sampled_from(sorted(EDGE_ARRAYS)))](pa).slice(0, n)
    buffer = io.BytesIO()
    pq.write_table(pa.table(columns), buffer)
    data = buffer.getvalue()
    if draw(st.integers(0, 9)) == 0:
        data = data[: draw(st.integers(0, len(data)))]
    return "t.parquet", data, {"format": "parquet"}


TIMED_OPTIONS = ["path", "max_requests", "sample", "time_scale", "target_rate", "time_window", "keep_absolute",
                 "shift_to_zero", "lengths_only"]
EDGE_OPTION_KEYS = {
    "csv": [*TIMED_OPTIONS, "time_unit", "columns"], "jsonl": [*TIMED_OPTIONS, "time_unit", "columns"],
    "parquet": [*TIMED_OPTIONS, "time_unit", "columns"], "azure": TIMED_OPTIONS,
    "mooncake": [*TIMED_OPTIONS, "block_size"], "burstgpt": [*TIMED_OPTIONS, "model", "log_type"],
    "sharegpt": ["path", "max_requests", "sample", "chars_per_token", "tokenizer", "think_time_s"],
}


@st.composite
def edge_options(draw, fmt: str) -> dict:  # noqa: ANN001
    """Trace options, each at its edges now and then (the spec rejects most: that is checked too)."""
    options: dict[str, Any] = {}
    # Up to two options a case: with more, most cases would stop at the first bad one.
    chosen_keys = draw(st.sets(st.sampled_from(EDGE_OPTION_KEYS[fmt]), max_size=draw(st.sampled_from([0, 1, 1, 2]))))

    def sometimes(key: str, values: list) -> None:
        if key in chosen_keys:
            options[key] = draw(st.sampled_from(values))

    sometimes("path", ["", ".", "nope.csv", "a\x00b", "x" * 5000, "a/" * 3000, "\ud800", "builtin:", "builtin:nope",
                       "builtin:azure_conv_2023"])
    sometimes("max_requests", [0, -1, 1, 2, 2**63, 10**30, 1.5])
    sometimes("sample", [{"n": 0}, {"n": 1}, {"n": 2**31}, {"n": 10**12}, {"n": 2, "seed": -1}, {"n": 2, "seed": 2**64},
                         {"n": 3, "replace": True}, {"n": 1, "replace": True, "seed": 0}])
    if fmt == "sharegpt":
        sometimes("chars_per_token", [0, -1.0, TINY, 1e-300, 1e-9, 1e308, NAN, INF, 4.0])
        sometimes("tokenizer", ["nope", ""])
        sometimes("think_time_s", [{"kind": "fixed", "value": 1e308}, {"kind": "fixed", "value": -1.0},
                                   {"kind": "fixed", "value": TINY}])
        return options
    sometimes("time_scale", [0, -1.0, NAN, INF, TINY, 1e-308, 1e308, 1.0])
    sometimes("target_rate", [0, -1.0, NAN, INF, TINY, 1e-308, 1e308, 1.0])
    sometimes("time_window", [[NAN, 1.0], [0.0, NAN], [0.0, INF], [-INF, 0.0], [1e308, INF], [5.0, 5.0], [10.0, 1.0],
                              [-1e308, 1e308], [0.0, 1e-300]])
    sometimes("keep_absolute", [True, True, False])
    sometimes("shift_to_zero", [True, False])
    sometimes("lengths_only", [True])
    if fmt in ("csv", "jsonl", "parquet"):
        sometimes("time_unit", ["s", "ms", "us", "h", ""])
        sometimes("columns", [{"arrival_s": ""}, {"arrival_s": "nope"}, {"arrival_s": "prompt_len"},
                              {"prompt_len": "arrival_s"}, {"arrival_s": "row"}, {"row": "x"}, {"arrival_s": "x" * 500},
                              {"session_id": "arrival_s"}, {"prompt_len": "output_len"}])
    if fmt == "mooncake":
        sometimes("block_size", [0, -1, 1, 2**31, 2**31 - 1, 16])
    if fmt == "burstgpt":
        sometimes("model", [[], "", "x" * 500, ["ChatGPT", "nope"], "ChatGPT", [""]])
        sometimes("log_type", [[], "API log", "api", "\u00e9"])
    return options


def read_edge_case(path: Path, trace: dict, counts: Counter) -> None:
    """Build the workload of one file and options; count the outcome; fail on anything else."""
    from simcore.errors import ServesimError
    from workloads.spec import build_workload, parse_workload
    from workloads.traces.builtin import BUILTIN_TRACES

    workload: dict[str, Any] = {"trace": {"path": path.name, **trace}}  # an edge of `path` replaces it
    read = BUILTIN_TRACES.get(str(trace.get("path")).removeprefix("builtin:"), path)  # the file messages name
    if trace["format"] == "sharegpt" or trace.get("lengths_only") is True:
        workload["arrivals"] = {"kind": "poisson", "rate": 5.0}
    with hang_guard(), memory_guard():
        try:
            spec = parse_workload(workload, source="fuzz.yaml")
        except ServesimError as exc:
            assert str(exc).startswith("fuzz.yaml: workload"), f"message does not name the option: {exc}"
            counts["rejected-option"] += 1
            return
        try:
            built = build_workload(spec, seed=0, base_dir=path.parent, source="fuzz.yaml")
        except ServesimError as exc:
            counts[_named(str(exc), read)] += 1
            return
    check_requests(built.requests)
    counts["valid"] += 1


def _named(message: str, path: Path) -> str:
    """The kind of a rejection; fails unless the message is bounded and names the file and where
    in it (or the trace option at fault)."""
    assert len(message) <= MAX_MESSAGE, f"unbounded message ({len(message)} characters): {message[:300]}..."
    if message.startswith("fuzz.yaml: workload."):
        return "rejected-option-at-read"
    assert message.startswith(f"{path}: "), f"message does not name the file: {message}"
    rest = message[len(f"{path}: "):]
    if rest.startswith(("row ", "line ", "conversation ")):
        return "rejected-row"
    if rest.startswith("header"):
        return "rejected-header"
    assert any(kind in rest for kind in WHOLE_FILE), f"message names no row, column or whole-file problem: {message}"
    return "rejected-file"


def check_requests(requests: list) -> None:  # noqa: ANN001 - simcore.request.Request
    """A valid workload: ids in order, arrivals finite, sorted and not before the clock's start,
    counts in range, content consistent with the counts, text that UTF-8 can hold."""
    from workloads.spec import MAX_TOKENS

    assert [r.request_id for r in requests] == list(range(len(requests)))
    arrivals = [r.arrival_s for r in requests]
    assert all(math.isfinite(a) and a >= 0 for a in arrivals), arrivals[:5]
    assert arrivals == sorted(arrivals)
    for r in requests:
        assert 1 <= r.prompt_len <= MAX_TOKENS and 1 <= r.output_len <= MAX_TOKENS, (r.prompt_len, r.output_len)
        if r.prompt_token_ids is not None:
            assert len(r.prompt_token_ids) == r.prompt_len
            assert all(0 <= t < 2**63 for t in r.prompt_token_ids)
        if r.segments is not None:
            assert sum(n for _, n in r.segments) == r.prompt_len
        for text in (r.session_id, r.cache_salt, r.adapter_id, *(key for key, _ in r.segments or ())):
            if text is not None:
                text.encode("utf-8")


def fuzz_edges(files: st.SearchStrategy, tmp_path: Path, name: str, examples: int = EDGE_EXAMPLES) -> None:
    counts: Counter = Counter()
    started = time.perf_counter()

    @settings(max_examples=examples, **FUZZ_SETTINGS)
    @given(files, st.data())
    def check(file, data):
        filename, content, extra = file
        path = tmp_path / filename
        path.write_bytes(content)
        read_edge_case(path, {**data.draw(edge_options(extra["format"])), **extra}, counts)

    check()
    report(name, counts, started)
    assert sum(counts.values()) >= examples * 0.9


def test_fuzz_edges_of_csv_readers(tmp_path):
    fuzz_edges(st.one_of(edge_generic_csv(), edge_azure(), edge_burstgpt()), tmp_path,
               "number/text edges: csv, azure, burstgpt")


def test_fuzz_edges_of_json_readers(tmp_path):
    fuzz_edges(st.one_of(edge_generic_jsonl(), edge_mooncake(), edge_sharegpt()), tmp_path,
               "number/text edges: jsonl, mooncake, sharegpt")


def test_fuzz_edges_of_parquet(tmp_path):
    # Fewer: writing a Parquet file takes longer than the reading checked here.
    fuzz_edges(edge_parquet(), tmp_path, "number/text edges: parquet", examples=400)
