"""Shared-prefix generator."""

from collections import Counter
from pathlib import Path

import pytest

from workloads.prefix import choice_probabilities
from workloads.spec import PrefixSpec, build_requests, parse_workload

BASE = {
    "num_requests": 4000,
    "arrivals": {"kind": "constant", "rate": 10.0},
    "prompt_len": {"kind": "uniform", "low": 10, "high": 50},
    "output_len": {"kind": "fixed", "value": 8},
}


def build(prefix, seed=0, **extra):
    spec = parse_workload({**BASE, **extra, "prefix": prefix})
    return build_requests(spec, seed=seed, base_dir=Path("."))


def test_every_request_is_prefix_plus_own_suffix():
    requests = build({"num_prefixes": 3, "prefix_len": {"kind": "uniform", "low": 100, "high": 900}})
    lens = {}
    for r in requests:
        (pkey, plen), (skey, slen) = r.segments
        assert pkey.startswith("pfx:") and skey == f"req:{r.request_id}"
        assert r.prompt_len == plen + slen and 10 <= slen <= 50
        assert lens.setdefault(pkey, plen) == plen  # one length per prefix
    assert set(lens) == {"pfx:0", "pfx:1", "pfx:2"}


def test_suffix_draws_do_not_depend_on_the_prefix_option():
    plain = build_requests(parse_workload(BASE), seed=0, base_dir=Path("."))
    prefixed = build({"num_prefixes": 2, "prefix_len": {"kind": "fixed", "value": 64}})
    assert [r.segments[-1][1] for r in prefixed] == [r.prompt_len for r in plain]
    assert [r.arrival_s for r in prefixed] == [r.arrival_s for r in plain]


def test_share_leaves_some_requests_without_prefix():
    requests = build({"num_prefixes": 2, "prefix_len": {"kind": "fixed", "value": 64}, "share": 0.25})
    with_prefix = sum(1 for r in requests if r.segments[0][0].startswith("pfx:"))
    assert with_prefix / len(requests) == pytest.approx(0.25, abs=0.03)
    lonely = next(r for r in requests if len(r.segments) == 1)
    assert lonely.segments == ((f"req:{lonely.request_id}", lonely.prompt_len),)


def test_zipf_choice_favours_low_ranks():
    spec = PrefixSpec(num_prefixes=5, prefix_len={"kind": "fixed", "value": 4}, choice={"kind": "zipf", "s": 1.1})
    probs = choice_probabilities(spec)
    assert probs.sum() == pytest.approx(1.0) and all(probs[:-1] > probs[1:])
    requests = build({"num_prefixes": 5, "prefix_len": {"kind": "fixed", "value": 4}, "choice": {"kind": "zipf"}})
    counts = Counter(r.segments[0][0] for r in requests)
    assert counts["pfx:0"] / len(requests) == pytest.approx(probs[0], abs=0.03)
    assert counts["pfx:0"] > counts["pfx:1"] > counts["pfx:4"]


def test_zipf_choice_with_a_huge_exponent_puts_everything_on_the_first_without_warnings():
    # Found by the config fuzzer: k^s overflowed with a RuntimeWarning; the limit is exact.
    import warnings

    spec = PrefixSpec(num_prefixes=5, prefix_len={"kind": "fixed", "value": 4}, choice={"kind": "zipf", "s": 1e6})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        probs = choice_probabilities(spec)
    assert list(probs) == [1.0, 0.0, 0.0, 0.0, 0.0]


def test_uniform_choice_is_even():
    requests = build({"num_prefixes": 4, "prefix_len": {"kind": "fixed", "value": 4}})
    counts = Counter(r.segments[0][0] for r in requests)
    assert all(c / len(requests) == pytest.approx(0.25, abs=0.03) for c in counts.values())


def test_prefix_is_deterministic():
    prefix = {"num_prefixes": 4, "prefix_len": {"kind": "lognormal", "median": 200, "sigma": 0.5}}
    assert [r.segments for r in build(prefix, seed=5)] == [r.segments for r in build(prefix, seed=5)]
    assert [r.segments for r in build(prefix, seed=5)] != [r.segments for r in build(prefix, seed=6)]
