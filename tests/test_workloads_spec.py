"""The workload: section: validation messages, determinism, synthetic builds."""

from pathlib import Path

import numpy as np
import pytest

from simcore.errors import ConfigError
from workloads.spec import build_requests, build_workload, parse_workload

BASE = {
    "num_requests": 500,
    "arrivals": {"kind": "poisson", "rate": 4.0},
    "prompt_len": {"kind": "lognormal", "median": 512, "sigma": 0.8, "min": 1, "max": 8192},
    "output_len": {"kind": "uniform", "low": 1, "high": 256},
}


def build(data, seed=0):
    return build_requests(parse_workload(data, source="exp.yaml"), seed=seed, base_dir=Path("."))


def as_rows(requests):
    return [(r.request_id, r.arrival_s, r.prompt_len, r.output_len, r.segments, r.session_id, r.turn)
            for r in requests]


def error_text(data):
    with pytest.raises(ConfigError) as info:
        parse_workload(data, source="exp.yaml")
    return str(info.value)


def test_same_seed_same_requests_different_seed_different():
    assert as_rows(build(BASE, seed=3)) == as_rows(build(BASE, seed=3))
    assert as_rows(build(BASE, seed=3)) != as_rows(build(BASE, seed=4))


def test_changing_one_distribution_does_not_shift_the_others():
    a = build(BASE)
    b = build({**BASE, "output_len": {"kind": "fixed", "value": 9}})
    assert [r.arrival_s for r in a] == [r.arrival_s for r in b]
    assert [r.prompt_len for r in a] == [r.prompt_len for r in b]


def test_requests_sorted_with_ids_in_arrival_order():
    requests = build(BASE)
    assert [r.request_id for r in requests] == list(range(500))
    times = [r.arrival_s for r in requests]
    assert times == sorted(times) and times[0] > 0  # the first keeps its own time
    assert all(r.segments is None and r.session_id is None for r in requests)


def test_max_tokens_applies_to_every_request():
    requests = build({**BASE, "max_tokens": 16})
    assert all(r.max_tokens == 16 and r.num_target_outputs <= 16 for r in requests)


def test_burst_puts_everything_at_one_instant():
    requests = build({**BASE, "arrivals": {"kind": "burst", "at": 2.5}})
    assert {r.arrival_s for r in requests} == {2.5}


def test_large_build_is_vectorised_and_correct():
    requests = build({**BASE, "num_requests": 100_000, "output_len": {"kind": "fixed", "value": 128}})
    assert len(requests) == 100_000 and requests[-1].request_id == 99_999
    prompts = np.array([r.prompt_len for r in requests])
    assert np.median(prompts) == pytest.approx(512, rel=0.03)


def test_workload_returns_notes_list():
    workload = build_workload(parse_workload(BASE), seed=0, base_dir=Path("."))
    assert workload.notes == [] and len(workload.requests) == 500


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"arrivals": {"kind": "poisson", "rate": 0}}, "workload.arrivals.rate"),
        ({"arrivals": {"kind": "gamma", "rate": 1}}, "workload.arrivals.cv: required key is missing"),
        ({"prompt_len": {"kind": "uniform", "low": 9, "high": 3}}, "low (9) must be <= high (3)"),
        ({"prompt_len": {"kind": "fixed", "value": 0}}, "workload.prompt_len.value"),
        (
            {"prompt_len": {"kind": "lognormal", "median": 5, "sigma": 1, "min": 10, "max": 2}},
            "min (10) must be <= max (2)",
        ),
        ({"output_len": {"kind": "empirical", "values": []}}, "workload.output_len.values"),
        ({"num_request": 5}, "did you mean 'num_requests'"),
        ({"arrivals": {"kind": "poisson", "rate": 1, "burst": 2}}, "workload.arrivals.burst: unknown key"),
        ({"arrivals": {"kind": "poison", "rate": 1}}, "'poison'"),
    ],
)
def test_bad_values_name_file_and_field(change, expected):
    text = error_text({**BASE, **change})
    assert text.startswith("exp.yaml: ") and expected in text


def test_synthetic_workload_needs_its_fields():
    text = error_text({"num_requests": 3, "arrivals": {"kind": "poisson", "rate": 1}})
    assert "needs ['prompt_len', 'output_len']" in text


def test_trace_and_synthetic_lengths_are_mutually_exclusive():
    text = error_text({"trace": {"path": "t.csv", "format": "csv"}, "prompt_len": {"kind": "fixed", "value": 3}})
    assert "trace and ['prompt_len'] are mutually exclusive" in text


def test_trace_arrivals_only_with_lengths_only():
    text = error_text({"trace": {"path": "t.csv", "format": "csv"}, "arrivals": {"kind": "poisson", "rate": 1}})
    assert "lengths_only" in text
    text = error_text({"trace": {"path": "t.csv", "format": "csv", "lengths_only": True}})
    assert "add it" in text


def test_trace_options_validated():
    assert "did you mean 'time_scale'" in error_text({"trace": {"path": "t.csv", "format": "csv", "time_scal": 2}})
    assert "set only one" in error_text(
        {"trace": {"path": "t.csv", "format": "csv", "time_scale": 2, "target_rate": 3}})
    assert "did you mean 'prompt_len'" in error_text(
        {"trace": {"path": "t.csv", "format": "csv", "columns": {"prompt_lens": "x"}}})
    assert "trace format" in error_text({"trace": {"path": "t.csv"}})
    assert "workload.trace.block_size: unknown key" in error_text(
        {"trace": {"path": "t.csv", "format": "burstgpt", "block_size": 3}})


def test_negative_seed_is_a_config_error():
    with pytest.raises(ConfigError, match="seed"):
        build(BASE, seed=-1)


def test_the_documented_yaml_shape_parses():
    import yaml

    text = """
    num_requests: 300
    arrivals: {kind: gamma, rate: 4.0, cv: 2.0}
    prompt_len: {kind: lognormal, median: 512, sigma: 0.8, min: 1, max: 8192}
    output_len: {kind: fixed, value: 128}
    max_tokens: null
    prefix: {num_prefixes: 4, prefix_len: {kind: fixed, value: 256}, choice: {kind: zipf, s: 1.1}, share: 0.5}
    """
    requests = build(yaml.safe_load(text))
    assert len(requests) == 300 and all(r.max_tokens is None for r in requests)
