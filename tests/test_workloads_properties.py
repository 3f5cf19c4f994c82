"""Invariants for any synthetic spec: content adds up, order and ids hold, seeds replay."""

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from workloads.spec import build_requests, parse_workload

lengths = st.one_of(
    st.builds(lambda v: {"kind": "fixed", "value": v}, st.integers(1, 300)),
    st.builds(lambda a, b: {"kind": "uniform", "low": min(a, b), "high": max(a, b)},
              st.integers(1, 300), st.integers(1, 300)),
    st.builds(lambda m, s: {"kind": "lognormal", "median": m, "sigma": s, "max": 2000},
              st.floats(1, 500), st.floats(0, 2)),
)
arrivals = st.one_of(
    st.builds(lambda r: {"kind": "poisson", "rate": r}, st.floats(0.1, 100)),
    st.builds(lambda r, cv: {"kind": "gamma", "rate": r, "cv": cv}, st.floats(0.1, 100), st.floats(0.2, 5)),
    st.just({"kind": "burst"}),
)


@settings(max_examples=25, deadline=None)
@given(arrivals, lengths, lengths, st.booleans(), st.booleans(), st.integers(0, 2**32))
def test_synthetic_invariants(arrival, prompt, output, use_prefix, use_sessions, seed):
    data = {"num_requests": 60, "arrivals": arrival, "prompt_len": prompt, "output_len": output}
    if use_prefix:
        data["prefix"] = {"num_prefixes": 3, "prefix_len": prompt, "share": 0.7}
    if use_sessions:
        data["sessions"] = {"num_sessions": 15, "turns": {"kind": "uniform", "low": 1, "high": 4},
                            "think_time_s": {"kind": "exponential", "mean": 3.0}}
    spec = parse_workload(data)
    requests = build_requests(spec, seed=seed, base_dir=Path("."))
    assert [r.request_id for r in requests] == list(range(len(requests)))
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(requests, requests[1:], strict=False))
    for r in requests:
        assert r.prompt_len >= 1 and r.output_len >= 1
        if r.segments is not None:
            assert sum(n for _, n in r.segments) == r.prompt_len
    replay = build_requests(spec, seed=seed, base_dir=Path("."))
    assert [(r.arrival_s, r.prompt_len, r.segments) for r in replay] == [
        (r.arrival_s, r.prompt_len, r.segments) for r in requests
    ]
