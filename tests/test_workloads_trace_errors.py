"""Bad trace files: every error names the file, the row (or line) and the column."""

from pathlib import Path

import pytest

from simcore.errors import ConfigError
from workloads.spec import build_requests, parse_workload


def error(tmp_path, name, text, trace_options=None, extra=None):
    path = tmp_path / name
    path.write_text(text)
    fmt = {"csv": "csv", "jsonl": "jsonl", "json": "sharegpt"}[name.rsplit(".", 1)[1]]
    trace = {"path": name, "format": fmt, **(trace_options or {})}
    spec = parse_workload({"trace": trace, **(extra or {})}, source="exp.yaml")
    with pytest.raises(ConfigError) as info:
        build_requests(spec, seed=0, base_dir=tmp_path, source="exp.yaml")
    return str(info.value)


def test_missing_column_suggests_the_close_spelling(tmp_path):
    text = error(tmp_path, "t.csv", "arrival_s,prompt_lens,output_len\n0,1,1\n")
    assert "t.csv: header: missing column 'prompt_len' (did you mean 'prompt_lens'?)" in text


def test_non_numeric_cell_names_row_and_column(tmp_path):
    text = error(tmp_path, "t.csv", "arrival_s,prompt_len,output_len\n0,1,1\n1,2,2\n2,abc,3\n")
    assert "t.csv: row 3, column 'prompt_len': not a number, found 'abc'" in text


def test_negative_and_fractional_lengths(tmp_path):
    text = error(tmp_path, "t.csv", "arrival_s,prompt_len,output_len\n0,1,1\n1,2,-4\n")
    assert "row 2, column 'output_len': bad token count; expected a whole number >= 1, found -4" in text
    text = error(tmp_path, "u.csv", "arrival_s,prompt_len,output_len\n0,1.5,1\n")
    assert "u.csv: row 1, column 'prompt_len'" in text and "found 1.5" in text


def test_empty_cell(tmp_path):
    text = error(tmp_path, "t.csv", "arrival_s,prompt_len,output_len\n0,1,1\n,2,2\n")
    assert "t.csv: row 2, column 'arrival_s': empty" in text


def test_renamed_column_errors_use_the_file_name_of_the_column(tmp_path):
    text = error(tmp_path, "t.csv", "ts,in,out\n0,x,1\n", {"columns": {"arrival_s": "ts", "prompt_len": "in",
                                                                     "output_len": "out"}})
    assert "row 1, column 'in'" in text


def test_jsonl_errors_name_the_line(tmp_path):
    good = '{"arrival_s": 0, "prompt_len": 3, "output_len": 1}\n'
    assert "t.jsonl: line 3: invalid JSON" in error(tmp_path, "t.jsonl", good + "\n{oops\n")
    text = error(tmp_path, "u.jsonl", good + '{"arrival_s": 1, "prompt_len": "many", "output_len": 1}\n')
    assert "u.jsonl: line 2, column 'prompt_len': not a number" in text
    text = error(tmp_path, "v.jsonl", good + '{"arrival_s": 1, "output_len": 1}\n')
    assert "v.jsonl: line 2, column 'prompt_len'" in text
    text = error(tmp_path, "w.jsonl",
                 '{"arrival_s": 0, "prompt_len": 3, "prompt_token_ids": [1, 2], "output_len": 1}\n')
    assert "w.jsonl: line 1, column 'prompt_len': prompt_len disagrees" in text
    text = error(tmp_path, "x.jsonl", '{"arrival_s": 0, "segments": [["a", 0]], "output_len": 1}\n')
    assert "x.jsonl: line 1, column 'segments'" in text
    text = error(tmp_path, "y.jsonl", '{"arrival_s": 0, "prompt_len": 3, "prefix_key": "p", "prefix_len": 9, '
                                      '"output_len": 1}\n')
    assert "y.jsonl: line 1, column 'prefix_len': bad prefix length" in text


def test_text_prompt_len_beside_a_row_that_derives_it(tmp_path):
    """Found by the trace fuzzer: when every given prompt_len is text, the column is a string
    dtype, and filling the missing one from the token ids raised a pandas TypeError."""
    text = error(tmp_path, "t.jsonl", '{"arrival_s": 0, "prompt_len": "x", "output_len": 3}\n'
                                      '{"arrival_s": 1, "prompt_token_ids": [1, 2, 3], "output_len": 3}\n')
    assert "t.jsonl: line 1, column 'prompt_len': not a number, found 'x'" in text


def test_azure_bad_header_and_timestamp(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("TIMESTAMP,ContextTokens,Generated\n2023-11-16 18:15:46.6805900,3,4\n")
    spec = parse_workload({"trace": {"path": "a.csv", "format": "azure"}}, source="exp.yaml")
    with pytest.raises(ConfigError, match=r"a.csv: header: not an Azure trace header; expected columns "
                                          r"TIMESTAMP,ContextTokens,GeneratedTokens or arrived_at"):
        build_requests(spec, seed=0, base_dir=tmp_path, source="exp.yaml")
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,3,4\nyesterday,3,4\n")
    with pytest.raises(ConfigError, match=r"a.csv: row 2, column 'TIMESTAMP': not a timestamp"):
        build_requests(spec, seed=0, base_dir=tmp_path, source="exp.yaml")


def test_burstgpt_unknown_model_filter(tmp_path):
    data = Path(__file__).parent / "data"
    spec = parse_workload({"trace": {"path": "burstgpt_sample.csv", "format": "burstgpt", "model": "GPT4"}},
                          source="exp.yaml")
    with pytest.raises(ConfigError, match=r"exp.yaml: workload.trace.model: .*did you mean 'GPT-4'"):
        build_requests(spec, seed=0, base_dir=data, source="exp.yaml")


def test_mooncake_too_many_hash_ids(tmp_path):
    line = '{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [1, 2, 3]}\n'
    (tmp_path / "m.jsonl").write_text(line)
    spec = parse_workload({"trace": {"path": "m.jsonl", "format": "mooncake"}}, source="exp.yaml")
    with pytest.raises(ConfigError, match=r"m.jsonl: line 1, column 'hash_ids': more hash ids than blocks"):
        build_requests(spec, seed=0, base_dir=tmp_path, source="exp.yaml")


def test_sharegpt_unknown_speaker(tmp_path):
    text = error(tmp_path, "c.json", '[{"id": "x", "conversations": [{"from": "humn", "value": "hi"}]}]',
                 extra={"arrivals": {"kind": "poisson", "rate": 1}})
    assert "c.json: conversation 1 (id 'x'), message 1, field 'from': unknown speaker" in text
    assert "did you mean 'human'" in text


def test_missing_file_and_unknown_builtin(tmp_path):
    spec = parse_workload({"trace": {"path": "nope.csv", "format": "csv"}}, source="exp.yaml")
    with pytest.raises(ConfigError, match=r"exp.yaml: workload.trace.path: trace file not found"):
        build_requests(spec, seed=0, base_dir=tmp_path, source="exp.yaml")
    spec = parse_workload({"trace": {"path": "builtin:azure_conv", "format": "azure"}}, source="exp.yaml")
    with pytest.raises(ConfigError, match=r"did you mean 'azure_conv_2023'"):
        build_requests(spec, seed=0, base_dir=tmp_path, source="exp.yaml")


def test_empty_time_window(tmp_path):
    text = error(tmp_path, "t.csv", "arrival_s,prompt_len,output_len\n0,1,1\n", {"time_window": [10, 20]})
    assert "workload.trace.time_window: no request arrives inside the time window" in text


# --- edges of numbers and text: each a message naming file, row (line) and column -------------------

H = "arrival_s,prompt_len,output_len\n"
MOONCAKE = '{"timestamp": %s, "input_length": 5, "output_length": 5, "hash_ids": [%s]}\n'
AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,5,5\n%s,5,5\n"
DEEP = "[" * 5000 + "]" * 5000
EDGE_CASES = [
    # Integers past the float range (pandas and numpy raised OverflowError) and past int64.
    ("int-past-float-csv", "t.csv", "csv", H + "0," + "9" * 400 + ",5\n",
     "t.csv: row 1, column 'prompt_len': number past the float range; expected a finite number, "
     "found <a whole number of 400 digits>"),
    ("int-past-float-jsonl", "t.jsonl", "jsonl", '{"arrival_s": -%s, "prompt_len": 5, "output_len": 5}\n' % ("9" * 400),
     "t.jsonl: line 1, column 'arrival_s': number past the float range"),
    ("int-past-float-azure", "a.csv", "azure", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,%s\n" % ("7" * 400),
     "a.csv: row 1, column 'num_decode_tokens': number past the float range"),
    ("int-past-float-prefix-len", "t.csv", "csv", "arrival_s,prompt_len,output_len,prefix_key,prefix_len\n0,5,5,k,"
     + "9" * 400 + "\n", "t.csv: row 1, column 'prefix_len': bad prefix length"),
    ("int-past-int64", "t.csv", "csv", H + f"0,{2**64},5\n", "row 1, column 'prompt_len': bad token count; expected at most"),
    ("token-id-past-int64", "t.jsonl", "jsonl", f'{{"arrival_s": 0, "output_len": 5, "prompt_token_ids": [1, {2**63}]}}\n',
     "t.jsonl: line 1, column 'prompt_token_ids': prompt_token_ids must be a list of whole numbers from 0 to "
     "9223372036854775807"),
    ("segment-past-max-tokens", "t.jsonl", "jsonl", '{"arrival_s": 0, "output_len": 5, "segments": [["k", %s]]}\n'
     % ("9" * 400), "t.jsonl: line 1, column 'segments': each segment must be [content_key, num_tokens from 1 to"),
    ("hash-id-past-int64", "m.jsonl", "mooncake", MOONCAKE % (0, 2**64), "m.jsonl: line 1, column 'hash_ids': hash id 1 "
     "is not an integer in int64 range, found 18446744073709551616"),
    ("json-int-past-4300-digits", "m.jsonl", "mooncake", MOONCAKE % ("1" * 5000, 1),
     "m.jsonl: line 1: invalid JSON (a number with thousands of digits)"),
    ("float-past-range", "t.csv", "csv", H + "1e400,5,5\n", "t.csv: row 1, column 'arrival_s': non-finite value"),
    ("json-nan", "t.jsonl", "jsonl", '{"arrival_s": NaN, "prompt_len": 5, "output_len": 5}\n',
     "t.jsonl: line 1, column 'arrival_s': missing or NaN value"),
    ("json-infinity", "t.jsonl", "jsonl", '{"arrival_s": 0, "prompt_len": Infinity, "output_len": 5}\n',
     "t.jsonl: line 1, column 'prompt_len': non-finite value"),
    # Nesting past the recursion limit (a RecursionError escaped from a CSV cell).
    ("deep-json-in-csv-cell", "t.csv", "csv", "arrival_s,output_len,prompt_token_ids\n0,5,\"" + DEEP + "\"\n",
     "t.csv: row 1, column 'prompt_token_ids': invalid JSON (nested too deeply), found '[[[["),
    ("deep-json-line", "t.jsonl", "jsonl", f'{{"arrival_s": 0, "x": {DEEP}}}\n', "t.jsonl: line 1: invalid JSON (nested"),
    # Lone surrogates: valid JSON escapes, not Unicode (pandas' arrow strings raised UnicodeEncodeError).
    ("lone-surrogate-jsonl", "t.jsonl", "jsonl", '{"arrival_s": 0, "prompt_len": 5, "output_len": 5, '
     '"session_id": "a\\ud800"}\n', "t.jsonl: line 1, column 'session_id': text with a lone UTF-16 surrogate"),
    ("lone-surrogate-csv-json-cell", "t.csv", "csv", 'arrival_s,output_len,segments\n0,5,"[[""\\udc00"", 5]]"\n',
     "t.csv: row 1, column 'segments': text with a lone UTF-16 surrogate"),
    ("lone-surrogate-sharegpt", "s.json", "sharegpt",
     '[{"id": "c", "conversations": [{"from": "human", "value": "\\ud83d"}, {"from": "gpt", "value": "ok"}]}]',
     "s.json: conversation 1 (id 'c'), message 1, field 'value': text with a lone UTF-16 surrogate"),
    ("list-as-session-id", "t.jsonl", "jsonl", '{"arrival_s": 0, "prompt_len": 5, "output_len": 5, "session_id": [1]}\n',
     "t.jsonl: line 1, column 'session_id': not a text or number cell, found [1]"),
    # Timestamps: pandas' nanosecond range (OutOfBoundsDatetime escaped), and zones mixed.
    ("year-9999", "a.csv", "azure", AZURE % "9999-12-31 23:59:59",
     "a.csv: row 2, column 'TIMESTAMP': timestamp out of range; expected a time from 1677-09-22 to 2262-04-11"),
    ("year-1677", "a.csv", "azure", AZURE % "1677-09-21 00:00:00", "row 2, column 'TIMESTAMP': timestamp out of range"),
    ("year-10000", "a.csv", "azure", AZURE % "10000-01-01 00:00:00", "row 2, column 'TIMESTAMP': not a timestamp"),
    ("zone-among-none", "a.csv", "azure", AZURE % "2023-11-16 18:15:47+02:00",
     "a.csv: row 2, column 'TIMESTAMP': timestamp with a UTC offset among ones without"),
    # Whole files.
    ("empty-jsonl", "t.jsonl", "jsonl", "\n  \n", "t.jsonl: the file has no JSON lines"),
    ("whitespace-csv", "t.csv", "csv", " \n\t\n", "t.csv: the file is empty"),
    ("header-only", "t.csv", "csv", H, "exp.yaml: workload.trace.path: the trace gives no requests"),
    ("not-utf8-line-3", "t.csv", "csv", H.encode() + b"0,5,5\n1,\xff,5\n", "t.csv: line 3: not UTF-8 text (byte 3"),
    ("utf16", "t.csv", "csv", (H + "0,5,5\n").encode("utf-16"), "t.csv: line 1: not UTF-8 text"),
    ("semicolons", "t.csv", "csv", "arrival_s;prompt_len;output_len\n0;5;5\n", "t.csv: header: not comma-separated"),
    ("header-twice", "t.csv", "csv", "arrival_s,prompt_len,output_len,arrival_s\n0,5,5,1\n",
     "t.csv: header: the header names a column twice, found 'arrival_s'"),
    # Options.
    ("time-scale-past-float-range", "t.csv", "csv", H + "0,5,5\n1e300,5,5\n",
     "exp.yaml: workload.trace.time_scale: stretches the trace's times past the float range"),
    ("span-past-float-range", "t.csv", "csv", H + "-1e308,5,5\n1e308,5,5\n",
     "t.csv: row 2, column 'arrival_s': arrival time past the float range"),
    ("chars-per-token-tiny", "s.json", "sharegpt",
     '[{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "ok"}]}]',
     "exp.yaml: workload.trace.chars_per_token: estimates a message of 2 characters at inf tokens"),
    ("model-empty-list", "b.csv", "burstgpt", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
     "0,ChatGPT,5,5,10,API log\n", "exp.yaml: workload.trace.model: an empty list selects no rows"),
]
EDGE_OPTIONS = {"time-scale-past-float-range": {"time_scale": 1e10}, "chars-per-token-tiny": {"chars_per_token": 5e-324},
                "model-empty-list": {"model": []}}


@pytest.mark.parametrize(("case", "name", "fmt", "content", "expected"), EDGE_CASES, ids=[c[0] for c in EDGE_CASES])
def test_number_and_text_edges_are_named(tmp_path, case, name, fmt, content, expected):
    """Each was a traceback (OverflowError, RecursionError, UnicodeEncodeError, OutOfBoundsDatetime,
    ValueError) or an unnamed or unbounded message; now a ConfigError naming where."""
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    workload = {"trace": {"path": name, "format": fmt, **EDGE_OPTIONS.get(case, {})}}
    if fmt == "sharegpt":
        workload["arrivals"] = {"kind": "poisson", "rate": 1.0}
    spec = parse_workload(workload, source="exp.yaml")
    with pytest.raises(ConfigError) as info:
        build_requests(spec, seed=0, base_dir=tmp_path, source="exp.yaml")
    message = str(info.value)
    assert expected in message
    assert len(message) - len(str(tmp_path)) < 300, message  # never the whole of a huge cell


def test_long_cells_and_headers_are_cut_short(tmp_path):
    text = error(tmp_path, "t.csv", H + "0," + "x" * 100_000 + ",5\n")
    assert "t.csv: row 1, column 'prompt_len': not a number, found 'xxxx" in text and text.endswith("...'")
    assert len(text) - len(str(tmp_path)) < 150
    text = error(tmp_path, "u.csv", ",".join(f"column{i}" for i in range(5000)) + "\n" + "1," * 4999 + "1\n")
    assert "u.csv: header: missing column 'arrival_s'" in text and len(text) - len(str(tmp_path)) < 250


def test_byte_order_marks_are_accepted(tmp_path):
    bom = b"\xef\xbb\xbf"
    (tmp_path / "t.csv").write_bytes(bom + (H + "0,5,6\n").encode())
    (tmp_path / "t.jsonl").write_bytes(bom + b'{"arrival_s": 0, "prompt_len": 5, "output_len": 6}\n')
    (tmp_path / "s.json").write_bytes(bom + b'[{"conversations": [{"from": "human", "value": "hi"}, '
                                            b'{"from": "gpt", "value": "ok"}]}]')
    for name, fmt in (("t.csv", "csv"), ("t.jsonl", "jsonl"), ("s.json", "sharegpt")):
        workload = {"trace": {"path": name, "format": fmt}}
        if fmt == "sharegpt":
            workload["arrivals"] = {"kind": "poisson", "rate": 1.0}
        requests = build_requests(parse_workload(workload), seed=0, base_dir=tmp_path)
        assert len(requests) == 1, name


def test_date_time_parquet_column_is_not_read_as_nanoseconds(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    times = pa.array([0, 1_000_000], pa.timestamp("us"))  # 1 s apart; read as numbers, 1e9 "s"
    pq.write_table(pa.table({"arrival_s": times, "prompt_len": [5, 5], "output_len": [5, 5]}), tmp_path / "t.parquet")
    spec = parse_workload({"trace": {"path": "t.parquet", "format": "parquet"}})
    with pytest.raises(ConfigError, match=r"t.parquet: row 1, column 'arrival_s': a date/time column, not numbers"):
        build_requests(spec, seed=0, base_dir=tmp_path)


def test_target_rate_on_a_span_below_the_float_range_of_its_scale(tmp_path):
    """Two requests 1e-310 s apart at 1e10 req/s: the scale (1e300) is past the float range, the
    wanted gap (1e-10 s) is not."""
    (tmp_path / "t.csv").write_text(H + "0,5,5\n1e-310,5,5\n")
    spec = parse_workload({"trace": {"path": "t.csv", "format": "csv", "target_rate": 1e10}})
    requests = build_requests(spec, seed=0, base_dir=tmp_path)
    assert [r.arrival_s for r in requests] == pytest.approx([0.0, 1e-10])


def test_a_first_row_with_an_extra_field_shifts_no_column(tmp_path):
    """Found by the edge fuzzer: pandas made the first field of a first row wider than the header
    the index, so every column of every row moved one to the left without a word (and a row of
    thousands of fields took minutes). A trailing comma on every row is fine."""
    text = error(tmp_path, "t.csv", H + "0,5,6,7\n1,5,6\n")
    assert "t.csv: line 2: more fields than the header names" in text
    (tmp_path / "u.csv").write_text(H + "0,5,6,\n1,7,8,\n")
    requests = build_requests(parse_workload({"trace": {"path": "u.csv", "format": "csv"}}), seed=0, base_dir=tmp_path)
    assert [(r.arrival_s, r.prompt_len, r.output_len) for r in requests] == [(0.0, 5, 6), (1.0, 7, 8)]


def test_empty_date_time_parquet_column(tmp_path):
    """Found by the edge fuzzer: the check of a date/time column named its first row, of none."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.table({"arrival_s": pa.array([], pa.float64()), "prompt_len": pa.array([], pa.timestamp("us")),
                      "output_len": pa.array([], pa.int64())})
    pq.write_table(table, tmp_path / "t.parquet")
    spec = parse_workload({"trace": {"path": "t.parquet", "format": "parquet"}}, source="exp.yaml")
    with pytest.raises(ConfigError, match="the trace gives no requests"):
        build_requests(spec, seed=0, base_dir=tmp_path, source="exp.yaml")


@pytest.mark.parametrize("path", ["a\x00b", "x" * 5000, "\ud800"], ids=["nul", "too-long", "lone-surrogate"])
def test_unusable_trace_paths(tmp_path, path):
    """Was: ValueError, OSError (file name too long) and UnicodeEncodeError tracebacks."""
    spec = parse_workload({"trace": {"path": path, "format": "csv"}}, source="exp.yaml")
    with pytest.raises(ConfigError, match=r"exp.yaml: workload.trace.path: not a usable path") as info:
        build_requests(spec, seed=0, base_dir=tmp_path, source="exp.yaml")
    assert len(str(info.value)) < 300
