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
