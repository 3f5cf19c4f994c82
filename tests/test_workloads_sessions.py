"""Multi-turn sessions: content grows turn by turn; think times for a closed-loop engine."""

from collections import defaultdict
from pathlib import Path

import pytest

from workloads.sessions import session_predecessors, session_think_times
from workloads.spec import build_requests, parse_workload

BASE = {
    "arrivals": {"kind": "poisson", "rate": 2.0},
    "prompt_len": {"kind": "uniform", "low": 50, "high": 100},
    "output_len": {"kind": "uniform", "low": 5, "high": 40},
    "sessions": {
        "num_sessions": 40,
        "turns": {"kind": "uniform", "low": 1, "high": 5},
        "think_time_s": {"kind": "uniform", "low": 2.0, "high": 8.0},
        "message_len": {"kind": "fixed", "value": 7},
    },
}


def build(data, seed=0):
    return build_requests(parse_workload(data, source="exp.yaml"), seed=seed, base_dir=Path("."))


def by_session(requests):
    groups = defaultdict(list)
    for r in requests:
        groups[r.session_id].append(r)
    return groups


def test_each_turn_extends_the_previous_prompt_and_output():
    requests = build(BASE)
    assert [r.request_id for r in requests] == list(range(len(requests)))
    assert [r.arrival_s for r in requests] == sorted(r.arrival_s for r in requests)
    for sid, turns in by_session(requests).items():
        assert sid.startswith("s") and [t.turn for t in turns] == list(range(len(turns)))
        first = turns[0]
        assert first.segments == ((f"msg:{sid}:0", first.prompt_len),) and 50 <= first.prompt_len <= 100
        for prev, cur in zip(turns, turns[1:], strict=False):
            expected = prev.segments + ((f"out:{sid}:{prev.turn}", prev.output_len), (f"msg:{sid}:{cur.turn}", 7))
            assert cur.segments == expected
            assert cur.prompt_len == prev.prompt_len + prev.output_len + 7
            assert sum(n for _, n in cur.segments) == cur.prompt_len


def test_think_times_are_the_static_gaps_and_drawn_from_the_distribution():
    requests = build(BASE)
    think = session_think_times(requests)
    preds = session_predecessors(requests)
    later_turns = [r for r in requests if r.turn > 0]
    assert set(think) == set(preds) == {r.request_id for r in later_turns}
    for r in later_turns:
        prev = requests[preds[r.request_id]]
        assert prev.session_id == r.session_id and prev.turn == r.turn - 1
        assert 2.0 <= think[r.request_id] <= 8.0
        assert r.arrival_s == pytest.approx(prev.arrival_s + think[r.request_id])
        # Closed-loop data on the request itself.
        assert r.parent_id == prev.request_id and r.think_time_s == think[r.request_id]
        assert prev.output_key == f"out:{prev.session_id}:{prev.turn}" == r.segments[-2][0]
    assert all(r.parent_id is None and r.think_time_s == 0.0 for r in requests if r.turn == 0)


def test_sessions_are_deterministic_and_num_requests_caps():
    assert [(r.arrival_s, r.segments) for r in build(BASE, 1)] == [(r.arrival_s, r.segments) for r in build(BASE, 1)]
    assert [r.segments for r in build(BASE, 1)] != [r.segments for r in build(BASE, 2)]
    capped = build({**BASE, "num_requests": 10})
    assert len(capped) == 10 and capped == capped[:10]


def test_max_tokens_caps_the_output_carried_into_the_next_turn():
    requests = build({**BASE, "max_tokens": 6})
    for turns in by_session(requests).values():
        for prev, cur in zip(turns, turns[1:], strict=False):
            assert cur.prompt_len == prev.prompt_len + min(prev.output_len, 6) + 7


def test_sessions_share_a_prefix_when_asked():
    prefix = {"num_prefixes": 2, "prefix_len": {"kind": "fixed", "value": 300}}
    requests = build({**BASE, "prefix": prefix})
    for turns in by_session(requests).values():
        heads = {t.segments[0] for t in turns}
        assert len(heads) == 1 and next(iter(heads))[0] in ("pfx:0", "pfx:1")
        assert turns[0].prompt_len == 300 + turns[0].segments[1][1]


def test_message_len_defaults_to_prompt_len():
    sessions = {k: v for k, v in BASE["sessions"].items() if k != "message_len"}
    requests = build({**BASE, "sessions": sessions})
    messages = [n for r in requests for key, n in r.segments if key.startswith("msg:")]
    assert min(messages) >= 50 and max(messages) <= 100
