"""Trace readers on small fixtures that mimic each real format, and the shared trace options."""

from pathlib import Path

import numpy as np
import pytest

from workloads.sessions import session_think_times
from workloads.spec import build_workload, parse_workload
from workloads.traces.azure import read_azure
from workloads.traces.burstgpt import read_burstgpt
from workloads.traces.generic import read_generic
from workloads.traces.mooncake import read_mooncake

DATA = Path(__file__).parent / "data"


def load(data, seed=0, base_dir=DATA):
    workload = build_workload(parse_workload(data, source="exp.yaml"), seed=seed, base_dir=base_dir)
    return workload.requests, workload.notes


def rows(requests):
    return [(r.arrival_s, r.prompt_len, r.output_len) for r in requests]


def test_azure_published_layout_timestamps_to_seconds_from_first():
    frame = read_azure(DATA / "azure_2023_sample.csv").frame
    assert frame["arrival_s"].tolist() == pytest.approx([0.0, 4.314579, 4.541877, 4.710427, 5.31941, 5.81941])
    assert frame["prompt_len"].tolist()[:2] == [374, 396] and frame["output_len"].tolist()[-1] == 383


def test_azure_keep_absolute_gives_epoch_seconds():
    frame = read_azure(DATA / "azure_2023_sample.csv", keep_absolute=True).frame
    assert frame["arrival_s"].iat[0] == pytest.approx(1700158546.68059)


def test_azure_vidur_layout_matches_the_published_one():
    vidur = read_azure(DATA / "azure_vidur_sample.csv").frame
    published = read_azure(DATA / "azure_2023_sample.csv").frame.iloc[:4]
    assert vidur["arrival_s"].tolist() == pytest.approx(published["arrival_s"].tolist())
    assert vidur["prompt_len"].tolist() == published["prompt_len"].tolist()


def test_burstgpt_drops_failed_rows_with_a_note_and_filters():
    data = read_burstgpt(DATA / "burstgpt_sample.csv")
    assert len(data.frame) == 5 and 1087 not in data.frame["prompt_len"].tolist()
    assert data.notes == ["burstgpt_sample.csv: dropped 1 failed request(s) with 0 response tokens"]
    assert data.frame["arrival_s"].tolist() == [0, 113, 120, 161, 165]
    gpt4 = read_burstgpt(DATA / "burstgpt_sample.csv", models=["GPT-4"], log_types=["API log"])
    assert gpt4.frame["prompt_len"].tolist() == [1027] and gpt4.notes == []


def test_burstgpt_through_the_spec_reports_notes():
    requests, notes = load({"trace": {"path": "burstgpt_sample.csv", "format": "burstgpt", "model": "ChatGPT"}})
    assert [r.prompt_len for r in requests] == [472, 1360, 204] and len(notes) == 1


def test_mooncake_blocks_become_shared_segments():
    frame = read_mooncake(DATA / "mooncake_sample.jsonl").frame
    segs = frame["segments"].tolist()
    assert segs[0] == (("mc:0", 512), ("mc:1", 512), ("mc:2", 176))
    assert segs[1] == (("mc:0", 512), ("mc:1", 512), ("mc:3", 76))
    assert segs[2] == (("mc:0", 512), ("mc:4", 512), ("mc:line:4", 976))  # line 3 of the file is blank
    assert segs[3] == (("mc:5", 512),)
    assert frame["arrival_s"].tolist() == [0.0, 0.027, 1.5, 2.1]
    assert all(sum(n for _, n in s) == p for s, p in zip(segs, frame["prompt_len"], strict=True))


def test_generic_csv_with_optional_columns():
    requests, _ = load({"trace": {"path": "generic_sample.csv", "format": "csv"}})
    assert rows(requests) == [(0.0, 100, 10), (0.5, 200, 20), (1.0, 300, 30), (1.5, 40, 4)]
    assert [r.session_id for r in requests] == [None, "chat1", "chat1", None]
    assert [r.turn for r in requests] == [0, 0, 1, 0]
    assert [r.cache_salt for r in requests] == [None, "salt-a", "salt-a", None]
    assert [r.adapter_id for r in requests] == [None, None, "lora-1", "lora-1"]
    # Logged sessions replay open-loop: no parent link, the think time is the logged gap.
    assert requests[2].parent_id is None and session_think_times(requests) == {2: 0.5}


def test_generic_jsonl_content_fields():
    requests, _ = load({"trace": {"path": "generic_sample.jsonl", "format": "jsonl"}})
    ids, segs, prefixed, plain = requests
    assert ids.prompt_token_ids == (1, 2, 3, 4) and ids.prompt_len == 4
    assert segs.segments == (("sys", 4), ("u1", 2)) and segs.cache_salt == "tenant-1"
    assert prefixed.segments == (("sys", 4), ("row:3", 6)) and prefixed.adapter_id == "lora-2"
    assert plain.segments is None and plain.session_id == "u9"


def test_generic_columns_mapping_and_time_unit(tmp_path):
    (tmp_path / "t.csv").write_text("ts_ms,in,out\n1000,5,6\n1500,7,8\n")
    columns = {"arrival_s": "ts_ms", "prompt_len": "in", "output_len": "out"}
    requests, _ = load({"trace": {"path": "t.csv", "format": "csv", "columns": columns, "time_unit": "ms"}},
                       base_dir=tmp_path)
    assert rows(requests) == [(0.0, 5, 6), (0.5, 7, 8)]


def test_generic_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.table({
        "arrival_s": [2.0, 1.0, 3.0],
        "prompt_len": [10, 20, 30],
        "output_len": [1, 2, 3],
        "prompt_token_ids": [None, list(range(20)), None],
    })
    pq.write_table(table, tmp_path / "t.parquet")
    frame = read_generic(tmp_path / "t.parquet", fmt="parquet").frame
    assert frame["prompt_len"].tolist() == [20, 10, 30]  # sorted by arrival
    assert frame["arrival_s"].tolist() == [0.0, 1.0, 2.0]
    assert frame["prompt_token_ids"].iat[0] == tuple(range(20))


AZURE = {"path": "azure_2023_sample.csv", "format": "azure"}


def test_time_window_keeps_own_times_unless_shifted():
    requests, _ = load({"trace": {**AZURE, "time_window": [4.4, 5.5]}})
    assert [r.prompt_len for r in requests] == [879, 91, 2048]
    assert requests[0].arrival_s == pytest.approx(4.541877)
    shifted, _ = load({"trace": {**AZURE, "time_window": [4.4, 5.5], "shift_to_zero": True}})
    assert shifted[0].arrival_s == 0.0
    assert shifted[-1].arrival_s == pytest.approx(5.31941 - 4.541877)


def test_time_scale_and_target_rate():
    base, _ = load({"trace": AZURE})
    scaled, _ = load({"trace": {**AZURE, "time_scale": 2.0}})
    assert [r.arrival_s for r in scaled] == pytest.approx([2 * r.arrival_s for r in base])
    rated, _ = load({"trace": {**AZURE, "target_rate": 10.0}})
    span = rated[-1].arrival_s - rated[0].arrival_s
    assert (len(rated) - 1) / span == pytest.approx(10.0)
    assert [r.prompt_len for r in rated] == [r.prompt_len for r in base]


def test_sample_keeps_arrival_order_and_is_seeded():
    one, _ = load({"trace": {**AZURE, "sample": {"n": 3}}}, seed=1)
    again, _ = load({"trace": {**AZURE, "sample": {"n": 3}}}, seed=1)
    assert rows(one) == rows(again) and len(one) == 3
    assert [r.arrival_s for r in one] == sorted(r.arrival_s for r in one)
    fixed_a, _ = load({"trace": {**AZURE, "sample": {"n": 3, "seed": 9}}}, seed=1)
    fixed_b, _ = load({"trace": {**AZURE, "sample": {"n": 3, "seed": 9}}}, seed=2)
    assert rows(fixed_a) == rows(fixed_b)
    everything, notes = load({"trace": {**AZURE, "sample": {"n": 100}}})
    assert len(everything) == 6 and "keeping all" in notes[0]


def test_max_requests_and_num_requests_cap():
    requests, _ = load({"trace": {**AZURE, "max_requests": 4}})
    assert len(requests) == 4
    requests, _ = load({"num_requests": 2, "trace": {**AZURE, "max_requests": 4}})
    assert len(requests) == 2


def test_lengths_only_draws_new_arrivals():
    spec = {"trace": {**AZURE, "lengths_only": True}, "arrivals": {"kind": "constant", "rate": 2.0}}
    requests, _ = load(spec)
    assert [r.arrival_s for r in requests] == [0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    assert [r.prompt_len for r in requests] == [374, 396, 879, 91, 2048, 1200]


def test_traces_are_deterministic_ids_in_order():
    requests, _ = load({"trace": {"path": "mooncake_sample.jsonl", "format": "mooncake"}})
    assert [r.request_id for r in requests] == [0, 1, 2, 3]
    again, _ = load({"trace": {"path": "mooncake_sample.jsonl", "format": "mooncake"}})
    assert [(r.arrival_s, r.segments) for r in requests] == [(r.arrival_s, r.segments) for r in again]


def test_unsorted_trace_is_sorted_stably(tmp_path):
    (tmp_path / "t.csv").write_text("arrival_s,prompt_len,output_len\n5,1,1\n3,2,2\n3,3,3\n")
    requests, _ = load({"trace": {"path": "t.csv", "format": "csv"}}, base_dir=tmp_path)
    assert rows(requests) == [(0.0, 2, 2), (0.0, 3, 3), (2.0, 1, 1)]
    assert np.all(np.diff([r.request_id for r in requests]) == 1)


# --- keep_absolute and the simulation clock's start ------------------------------------------------


def ttfts(trace: dict, base_dir: Path) -> list[tuple[float, float, float]]:
    """(arrival_s, first_token_s, ttft_s) of each request of `trace` run on an idle engine whose
    every step takes 10 ms."""
    from experiments.config import parse_experiment
    from experiments.runner import run_experiment

    exp = parse_experiment({
        "name": "abs", "model": "llama-3.1-8b", "hardware": "h100-sxm",
        "kv_cache": {"block_size": 16, "num_blocks": 64}, "workload": {"trace": trace},
        "cost_model": {"name": "constant", "step_s": 0.01}, "policies": [{"name": "continuous"}],
        "output": {"plots": False},
    }, source=str(base_dir / "exp.yaml"))
    frame = run_experiment(exp, source=None, out_dir=None).runs[0].requests
    return list(zip(frame["arrival_s"], frame["first_token_s"], frame["ttft_s"], strict=True))


def test_keep_absolute_ttft_is_first_token_minus_arrival(tmp_path):
    """The file's own clock (here from 100 s): no request is charged time before it arrived, so
    each TTFT is its first-token time minus its arrival, the same as on the trace's clock from 0."""
    (tmp_path / "t.csv").write_text("arrival_s,prompt_len,output_len\n100,16,4\n100.5,16,4\n")
    trace = {"path": str(tmp_path / "t.csv"), "format": "csv"}
    absolute = ttfts({**trace, "keep_absolute": True}, tmp_path)
    relative = ttfts(trace, tmp_path)
    assert [a for a, _, _ in absolute] == [100.0, 100.5]
    for arrival, first_token, ttft in absolute:
        assert first_token > arrival and ttft == first_token - arrival
    assert [t for _, _, t in absolute] == pytest.approx([t for _, _, t in relative])
    assert [t for _, _, t in relative] == pytest.approx([0.01, 0.01])


def test_keep_absolute_arrival_before_the_clock_start_is_an_error(tmp_path):
    """Was: a request at -5 s was delivered at 0 s, the simulation clock's start, and charged
    the 5 s in its TTFT (5.01 s for a 10 ms step)."""
    from simcore.errors import ConfigError

    (tmp_path / "t.csv").write_text("ts,prompt_len,output_len\n1,16,4\n-5,16,4\n")
    trace = {"path": "t.csv", "format": "csv", "columns": {"arrival_s": "ts"}, "keep_absolute": True}
    with pytest.raises(ConfigError, match=r"t.csv: row 2, column 'ts': arrives at -5 s with keep_absolute: "
                                          r"true, before the simulation clock starts \(0 s\)"):
        load({"trace": trace}, base_dir=tmp_path)
    # Rows before 0 left out by the window, or the clock shifted to the first request: fine.
    requests, _ = load({"trace": {**trace, "time_window": [0, 10]}}, base_dir=tmp_path)
    assert rows(requests) == [(1.0, 16, 4)]
    shifted = ttfts({**trace, "path": str(tmp_path / "t.csv"), "shift_to_zero": True}, tmp_path)
    assert [a for a, _, _ in shifted] == [0.0, 6.0]
    assert [t for _, _, t in shifted] == pytest.approx([0.01, 0.01])


def test_keep_absolute_azure_time_before_1970_is_an_error(tmp_path):
    from simcore.errors import ConfigError

    (tmp_path / "a.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                    "1969-12-31 23:59:59,16,4\n1970-01-01 00:00:01,16,4\n")
    with pytest.raises(ConfigError, match=r"a.csv: row 1, column 'TIMESTAMP': arrives at -1 s with keep_absolute"):
        load({"trace": {"path": "a.csv", "format": "azure", "keep_absolute": True}}, base_dir=tmp_path)
    requests, _ = load({"trace": {"path": "a.csv", "format": "azure"}}, base_dir=tmp_path)
    assert [r.arrival_s for r in requests] == [0.0, 2.0]


def test_azure_times_from_the_first_keep_every_fractional_digit(tmp_path):
    """Was: epoch seconds became floats (0.24 us apart at 2023) before the first was taken off."""
    (tmp_path / "a.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                    "2023-11-16 18:15:46.0000000,16,4\n2023-11-16 18:15:46.0000001,16,4\n")
    frame = read_azure(tmp_path / "a.csv").frame
    assert frame["arrival_s"].tolist() == [0.0, 1e-7]


def test_azure_utc_offsets(tmp_path):
    (tmp_path / "a.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                    "2023-03-26 01:59:00+01:00,16,4\n2023-03-26 03:01:00+02:00,16,4\n")
    frame = read_azure(tmp_path / "a.csv").frame  # a daylight saving change: 2 minutes apart
    assert frame["arrival_s"].tolist() == [0.0, 120.0]
