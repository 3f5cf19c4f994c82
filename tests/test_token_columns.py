"""Token columns of the requests table (without a real engine): added only when recorded, one
row per request whatever its status, JSON text in CSV, and the JSONL export's reading of them."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from experiments.cli import main
from experiments.token_export import token_lines
from simcore.metrics import add_token_columns, token_columns_as_text
from tests.test_sweep_run import write_yaml

RUN = {
    "name": "no_tokens",
    "workload": {"num_requests": 4, "arrivals": {"kind": "poisson", "rate": 8.0},
                 "prompt_len": {"kind": "fixed", "value": 32}, "output_len": {"kind": "fixed", "value": 3}},
    "policies": [{"name": "continuous"}],
    "output": {"plots": False},
}


def _frame() -> pd.DataFrame:
    return pd.DataFrame({"request_id": [0, 1, 2], "status": ["finished", "rejected", "unfinished"]})


def test_outputs_by_request_id_and_prompts_where_given():
    frame = _frame()
    add_token_columns(frame, {2: [5], 0: [7, 8, 9]}, {0: (1, 2), 2: (3,)})
    assert [a.tolist() for a in frame["output_token_ids"]] == [[7, 8, 9], [], [5]]
    assert [None if a is None else a.tolist() for a in frame["prompt_token_ids"]] == [[1, 2], None, [3]]
    assert all(a.dtype == np.int64 for a in frame["output_token_ids"])


def test_no_prompt_column_without_prompt_ids():
    frame = _frame()
    add_token_columns(frame, {}, {})
    assert "prompt_token_ids" not in frame.columns
    assert [len(a) for a in frame["output_token_ids"]] == [0, 0, 0]


def test_csv_text_and_jsonl_lines_read_back():
    frame = _frame()
    add_token_columns(frame, {0: [7, 8]}, {1: [4]})
    text = token_columns_as_text(frame)
    assert text["output_token_ids"].tolist() == ["[7, 8]", "[]", "[]"]
    assert [None if pd.isna(v) else v for v in text["prompt_token_ids"]] == [None, "[4]", None]
    assert isinstance(frame.loc[0, "output_token_ids"], np.ndarray), "the frame itself keeps its arrays"
    # What read_csv gives back: JSON text, and NaN for an empty cell.
    read_back = text.assign(prompt_token_ids=[np.nan, "[4]", np.nan])
    for lines in (list(token_lines(frame)), list(token_lines(read_back))):
        assert [json.loads(line) for line in lines] == [
            {"request_id": 0, "prompt_token_ids": None, "output_token_ids": [7, 8]},
            {"request_id": 1, "prompt_token_ids": [4], "output_token_ids": []},
            {"request_id": 2, "prompt_token_ids": None, "output_token_ids": []},
        ]


def test_a_run_without_recorded_tokens_has_no_token_columns_and_export_says_why(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", str(write_yaml(tmp_path, RUN)), "--out", str(out), "--quiet"]) == 0
    table = pd.read_parquet(out / "continuous" / "requests.parquet")
    assert "output_token_ids" not in table.columns and "prompt_token_ids" not in table.columns
    capsys.readouterr()
    assert main(["export", "--tokens", str(out)]) != 0
    assert "record_tokens" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # one format at a time
        main(["export", "--tokens", "--vllm", str(out)])
