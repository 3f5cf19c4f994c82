"""Request priorities: a trace's `priority` column and the workload's `priority:` distribution."""

from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

from simcore.errors import ConfigError
from tests.helpers import run
from workloads.priorities import sample_priorities
from workloads.spec import MAX_PRIORITY, MIN_PRIORITY, ChoicePriority, build_requests, parse_workload
from workloads.streams import stream

DATA = Path(__file__).parent / "data"
BASE = {
    "num_requests": 400,
    "arrivals": {"kind": "poisson", "rate": 4.0},
    "prompt_len": {"kind": "lognormal", "median": 512, "sigma": 0.8, "min": 1, "max": 8192},
    "output_len": {"kind": "uniform", "low": 1, "high": 256},
}
SESSIONS = {
    "arrivals": {"kind": "poisson", "rate": 2.0},
    "prompt_len": {"kind": "uniform", "low": 50, "high": 100},
    "output_len": {"kind": "uniform", "low": 5, "high": 40},
    "sessions": {"num_sessions": 30, "turns": {"kind": "uniform", "low": 1, "high": 5},
                 "think_time_s": {"kind": "uniform", "low": 2.0, "high": 8.0}},
}
CHOICE = {"kind": "choice", "values": [0, 1, 2], "weights": [0.2, 0.3, 0.5]}
HEADER = "arrival_s,prompt_len,output_len,priority\n"


def build(data, seed=0, base_dir=Path(".")):
    return build_requests(parse_workload(data, source="exp.yaml"), seed=seed, base_dir=base_dir, source="exp.yaml")


def trace(tmp_path, name, text, options=None, extra=None):
    (tmp_path / name).write_text(text)
    fmt = name.rsplit(".", 1)[1]
    return build({"trace": {"path": name, "format": fmt, **(options or {})}, **(extra or {})}, base_dir=tmp_path)


def trace_error(tmp_path, name, text, options=None, extra=None):
    with pytest.raises(ConfigError) as info:
        trace(tmp_path, name, text, options, extra)
    return str(info.value)


def everything_but_priority(requests):
    return [(r.request_id, r.arrival_s, r.prompt_len, r.output_len, r.segments, r.session_id, r.turn,
             r.output_key, r.parent_id, r.think_time_s) for r in requests]


# --- the trace column ------------------------------------------------------------------------------


def test_csv_priority_column_reaches_the_requests_in_arrival_order(tmp_path):
    requests = trace(tmp_path, "t.csv", HEADER + "0,5,1,2\n2,5,1,-7\n1,5,1,2147483647\n3,5,1,-2147483648\n")
    assert [(r.arrival_s, r.priority) for r in requests] == [
        (0.0, 2), (1.0, MAX_PRIORITY), (2.0, -7), (3.0, MIN_PRIORITY)]
    assert all(type(r.priority) is int for r in requests)


def test_a_trace_without_the_column_leaves_priority_zero():
    requests = build({"trace": {"path": "generic_sample.csv", "format": "csv"}}, base_dir=DATA)
    assert [r.priority for r in requests] == [0, 0, 0, 0]


def test_jsonl_and_renamed_priority_column(tmp_path):
    lines = ('{"arrival_s": 0, "prompt_len": 3, "output_len": 1, "prio": 4}\n'
             '{"arrival_s": 1, "prompt_len": 3, "output_len": 1, "prio": "-1"}\n'
             '{"arrival_s": 2, "prompt_len": 3, "output_len": 1, "prio": 3.0}\n')
    requests = trace(tmp_path, "t.jsonl", lines, {"columns": {"priority": "prio"}})
    assert [r.priority for r in requests] == [4, -1, 3]


def test_parquet_priority_column(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.table({"arrival_s": [1.0, 0.0], "prompt_len": [10, 20], "output_len": [1, 2],
                      "priority": pa.array([-3, 9], type=pa.int32())})
    pq.write_table(table, tmp_path / "t.parquet")
    requests = build({"trace": {"path": "t.parquet", "format": "parquet"}}, base_dir=tmp_path)
    assert [(r.prompt_len, r.priority) for r in requests] == [(20, 9), (10, -3)]


@pytest.mark.parametrize(
    ("cell", "expected"),
    [
        ("1.5", "bad priority; expected a whole number from -2147483648 to 2147483647, found 1.5"),
        ("2147483648", "bad priority; expected a whole number from -2147483648 to 2147483647, found 2147483648"),
        ("-2147483649", "bad priority; expected a whole number from -2147483648 to 2147483647, found -2147483649"),
        ("1e30", "bad priority; expected a whole number from -2147483648 to 2147483647, found 1e+30"),
        ("high", "not a number, found 'high'"),
        ("true", "not a number, found 'true'"),
        ("", "empty or NaN cell; expected a number"),
        ("nan", "empty or NaN cell; expected a number"),
        ("inf", "non-finite value; expected a finite number, found 'inf'"),
    ],
)
def test_bad_priority_cells_name_file_row_and_column(tmp_path, cell, expected):
    text = trace_error(tmp_path, "t.csv", HEADER + f"0,5,1,0\n1,5,1,{cell}\n")
    assert f"t.csv: row 2, column 'priority': {expected}" in text


@pytest.mark.parametrize(
    ("value", "expected"),
    [("true", "not a number, found True"), ("[1]", "not a number, found [1]"), ("2.25", "bad priority"),
     ("null", "missing or NaN value; expected a number")],
)
def test_bad_priority_values_in_jsonl_name_the_line(tmp_path, value, expected):
    lines = ('{"arrival_s": 0, "prompt_len": 3, "output_len": 1, "priority": 1}\n'
             f'{{"arrival_s": 1, "prompt_len": 3, "output_len": 1, "priority": {value}}}\n')
    assert f"t.jsonl: line 2, column 'priority': {expected}" in trace_error(tmp_path, "t.jsonl", lines)


def test_a_row_without_a_priority_is_an_error_when_the_column_exists(tmp_path):
    lines = ('{"arrival_s": 0, "prompt_len": 3, "output_len": 1, "priority": 1}\n'
             '{"arrival_s": 1, "prompt_len": 3, "output_len": 1}\n')
    assert "t.jsonl: line 2, column 'priority': missing or NaN value" in trace_error(tmp_path, "t.jsonl", lines)


def test_renamed_bad_column_is_named_as_in_the_file(tmp_path):
    text = trace_error(tmp_path, "t.csv", "arrival_s,prompt_len,output_len,tier\n0,5,1,gold\n",
                       {"columns": {"priority": "tier"}})
    assert "t.csv: row 1, column 'tier': not a number, found 'gold'" in text


def test_trace_column_and_yaml_priority_together_is_an_error(tmp_path):
    text = trace_error(tmp_path, "t.csv", HEADER + "0,5,1,0\n", extra={"priority": {"kind": "fixed", "value": 1}})
    assert text.startswith("exp.yaml: workload.priority: both this key and the trace's own column")
    assert "found \"column 'priority' in t.csv\"" in text


# --- drawn priorities ------------------------------------------------------------------------------


def test_default_is_zero_and_drawing_priorities_changes_no_other_field():
    plain = build(BASE, seed=5)
    assert {r.priority for r in plain} == {0}
    drawn = build({**BASE, "priority": CHOICE}, seed=5)
    assert everything_but_priority(drawn) == everything_but_priority(plain)
    assert {r.priority for r in drawn} == {0, 1, 2}


def test_other_fields_unchanged_with_prefixes_and_sessions():
    prefixed = {**BASE, "prefix": {"num_prefixes": 4, "prefix_len": {"kind": "fixed", "value": 64}, "share": 0.5}}
    for data in (prefixed, SESSIONS):
        plain = build(data, seed=2)
        drawn = build({**data, "priority": {"kind": "uniform", "low": -5, "high": 5}}, seed=2)
        assert everything_but_priority(drawn) == everything_but_priority(plain)
        assert [r.prompt_token_ids for r in drawn] == [r.prompt_token_ids for r in plain]


def test_draws_are_deterministic_in_the_seed_and_follow_their_own_stream():
    data = {**BASE, "priority": CHOICE}
    first = [r.priority for r in build(data, seed=11)]
    assert first == [r.priority for r in build(data, seed=11)]
    assert first != [r.priority for r in build(data, seed=12)]
    expected = sample_priorities(ChoicePriority(**CHOICE), len(first), stream(11, "priority"))
    assert first == expected.tolist()


def test_choice_weights_set_the_frequencies():
    priorities = [r.priority for r in build({**BASE, "num_requests": 20_000, "priority": CHOICE}, seed=0)]
    counts = Counter(priorities)
    for value, weight in zip(CHOICE["values"], CHOICE["weights"], strict=True):
        assert counts[value] / len(priorities) == pytest.approx(weight, abs=0.02)


def test_choice_without_weights_is_uniform_and_huge_weights_still_work():
    priorities = [r.priority for r in build({**BASE, "num_requests": 9_000,
                                             "priority": {"kind": "choice", "values": [-1, 7, 7]}})]
    assert Counter(priorities)[7] / len(priorities) == pytest.approx(2 / 3, abs=0.02)
    # Summed naively these weights overflow to inf and every probability becomes NaN.
    spec = ChoicePriority(kind="choice", values=[0, 1], weights=[1e308, 1e308])
    draws = sample_priorities(spec, 4000, stream(0, "priority"))
    assert set(draws.tolist()) == {0, 1} and abs(draws.mean() - 0.5) < 0.05


def test_fixed_and_uniform_cover_the_int32_range():
    assert {r.priority for r in build({**BASE, "priority": {"kind": "fixed", "value": -3}})} == {-3}
    wide = [r.priority for r in build({**BASE, "priority": {"kind": "uniform", "low": MIN_PRIORITY,
                                                            "high": MAX_PRIORITY}})]
    assert min(wide) < 0 < max(wide) and all(MIN_PRIORITY <= p <= MAX_PRIORITY for p in wide)
    edge = [r.priority for r in build({**BASE, "priority": {"kind": "uniform", "low": MAX_PRIORITY,
                                                            "high": MAX_PRIORITY}})]
    assert set(edge) == {MAX_PRIORITY}


def test_every_turn_of_a_session_shares_its_priority():
    requests = build({**SESSIONS, "priority": {"kind": "uniform", "low": 0, "high": 10**6}}, seed=3)
    by_session = defaultdict(set)
    for r in requests:
        by_session[r.session_id].add(r.priority)
    assert all(len(values) == 1 for values in by_session.values())
    assert len({next(iter(v)) for v in by_session.values()}) > 1


def test_a_trace_without_the_column_takes_drawn_priorities():
    data = {"trace": {"path": "azure_2023_sample.csv", "format": "azure"}, "priority": CHOICE}
    requests = build(data, seed=4, base_dir=DATA)
    assert [r.priority for r in requests] == sample_priorities(
        ChoicePriority(**CHOICE), len(requests), stream(4, "priority")).tolist()
    plain = build({"trace": data["trace"]}, base_dir=DATA)
    assert everything_but_priority(requests) == everything_but_priority(plain)


def test_trace_sessions_draw_one_priority_per_session(tmp_path):
    text = "arrival_s,prompt_len,output_len,session_id\n0,5,1,a\n1,5,1,\n2,5,1,a\n3,5,1,b\n4,5,1,\n5,5,1,b\n"
    requests = trace(tmp_path, "t.csv", text, extra={"priority": {"kind": "uniform", "low": 0, "high": 10**9}})
    p = [r.priority for r in requests]
    assert p[0] == p[2] and p[3] == p[5] and len({p[0], p[1], p[3], p[4]}) == 4
    # Users in order of their first row: a, row 2, b, row 5.
    expected = sample_priorities(parse_workload({**BASE, "priority": {"kind": "uniform", "low": 0,
                                                                      "high": 10**9}}).priority,
                                 4, stream(0, "priority")).tolist()
    assert [p[0], p[1], p[3], p[4]] == expected


def test_sharegpt_conversations_keep_one_priority():
    data = {"trace": {"path": "sharegpt_sample.json", "format": "sharegpt"}, "arrivals": {"kind": "poisson", "rate": 1},
            "priority": {"kind": "uniform", "low": -100, "high": 100}}
    requests = build(data, base_dir=DATA)
    by_session = defaultdict(set)
    for r in requests:
        by_session[r.session_id].add(r.priority)
    assert by_session and all(len(values) == 1 for values in by_session.values())


def test_priority_queue_order_serves_the_trace_priorities(tmp_path):
    requests = trace(tmp_path, "t.csv", HEADER + "0,8,4,2\n0,8,4,0\n0,8,4,1\n0,8,4,-1\n")
    _, result = run(requests, "continuous", queue_order="priority", max_num_seqs=1)
    by_finish = sorted(result.requests, key=lambda r: r.finish_s)
    assert [r.priority for r in by_finish] == [-1, 0, 1, 2]


# --- validation of the YAML ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("priority", "expected"),
    [
        ({"kind": "choice", "values": [0, 1], "weights": [1]},
         "workload.priority: weights has 1 entries but values has 2: give one weight per value"),
        ({"kind": "choice", "values": [0, 1], "weights": [1, 0]}, "workload.priority.weights[1]: out of range"),
        ({"kind": "choice", "values": [0, 1], "weights": [1, -2]}, "workload.priority.weights[1]: out of range"),
        ({"kind": "choice", "values": [0, 1], "weights": [1, float("inf")]},
         "workload.priority.weights[1]: not a finite number"),
        ({"kind": "choice", "values": [0, 1], "weights": [float("nan"), 1]},
         "workload.priority.weights[0]: not a finite number"),
        ({"kind": "choice", "values": []}, "workload.priority.values: too few items"),
        ({"kind": "choice", "values": [0, 1.5]}, "workload.priority.values[1]: wrong type; expected a whole number"),
        ({"kind": "choice", "values": [0], "weight": [1]}, "workload.priority.weight: unknown key"),
        ({"kind": "uniform", "low": 3, "high": -1}, "workload.priority: low (3) must be <= high (-1)"),
        ({"kind": "fixed", "value": 2**31}, "workload.priority.value: out of range"),
        ({"kind": "fixed", "value": -(2**31) - 1}, "workload.priority.value: out of range"),
        ({"kind": "fixed", "value": "urgent"}, "workload.priority.value: wrong type"),
        ({"kind": "fixed"}, "workload.priority.value: required key is missing"),
        ({"kind": "lognormal", "median": 3, "sigma": 1}, "workload.priority.kind: unknown priority kind"),
        ({"kind": "choise", "values": [1]}, "did you mean 'choice'"),
        (3, "workload.priority: wrong type; expected a mapping"),
    ],
)
def test_bad_priority_specs_name_the_key(priority, expected):
    with pytest.raises(ConfigError) as info:
        parse_workload({**BASE, "priority": priority}, source="exp.yaml")
    text = str(info.value)
    assert text.startswith("exp.yaml: ") and expected in text


def test_the_documented_yaml_shape_parses():
    import yaml

    spec = parse_workload(yaml.safe_load("""
    num_requests: 10
    arrivals: {kind: poisson, rate: 4.0}
    prompt_len: {kind: fixed, value: 16}
    output_len: {kind: fixed, value: 4}
    priority: {kind: choice, values: [0, 1, 2], weights: [0.2, 0.3, 0.5]}
    """))
    assert spec.priority == ChoicePriority(kind="choice", values=[0, 1, 2], weights=[0.2, 0.3, 0.5])
    assert parse_workload(BASE).priority is None
    assert np.all(np.isin([r.priority for r in build(spec.model_dump())], [0, 1, 2]))
