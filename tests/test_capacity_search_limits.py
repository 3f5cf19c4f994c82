"""The capacity search always ends: a --tol finer than the rates it can tell apart is an error,
which bounds the rounds (at most 52), and a bracket that cannot narrow any further closes."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from experiments import capacity_search
from experiments.capacity_search import Probe, Series, check_tol, search
from simcore.errors import ConfigError


def test_the_defaults_take_eleven_rounds():
    assert check_tol(0.25, 64.0, 0.1) == 11  # both ends, then 10 halvings of 63.75 down to 0.1


@pytest.mark.parametrize(("low", "high", "tol", "pattern"), [
    (0.25, 64.0, 1e-9, r"^--tol: finer than the rates the search can tell apart; expected at least 1e-06 "
                       r"\(probe rates are rounded to 6 decimals\), found 1e-09$"),
    (0.25, 64.0, 5e-324, r"expected at least 1e-06 .*found 5e-324"),
    (1.0, 1e300, 0.1, r"expected at least 5\.9\d+e\+284 \(floats near --high 1e\+300 are 1\.4\d+e\+284 apart\)"),
    (1.0, 1e15, 0.1, r"expected at least 0\.5 \(floats near --high 1e\+15 are 0\.125 apart\), found 0\.1"),
])
def test_a_tol_finer_than_the_search_can_tell_apart_is_an_error(low, high, tol, pattern):
    with pytest.raises(ConfigError, match=pattern):
        check_tol(low, high, tol)


def test_every_allowed_tol_takes_at_most_52_rounds():
    rng = random.Random(0)
    worst = 0
    for _ in range(20_000):
        high = 10 ** rng.uniform(-5, 308.2)
        low = high * rng.choice([1e-300, rng.random()])
        if not 0 < low < high < math.inf:
            continue
        worst = max(worst, check_tol(low, high, max(1e-6, 4 * math.ulp(high))))
    assert 45 < worst <= 52 < capacity_search.MAX_ROUNDS


def test_a_bad_tol_is_refused_before_anything_is_stored(tmp_path: Path):
    out = tmp_path / "cap"
    with pytest.raises(ConfigError, match="--tol"):
        search([], {"p90_ttft_ms": 1.0}, out, low=0.25, high=64.0, tol=1e-12, source=None)
    assert not out.exists()


def fake_probes(passes: Callable[[float], bool]) -> Callable:
    """_run_probes without simulations: each wanted rate passes or fails by `passes`."""

    def run(series, wanted, slo, store, pool, *, source, param):  # noqa: ANN001, ARG001
        for s in series:
            for rate in wanted.get(s.index, []):
                s.probes.append(Probe(rate, passes(rate), {}))

    return run


def bisect(monkeypatch, passes: Callable[[float], bool], *, low: float, high: float,  # noqa: ANN001
           tol: float) -> tuple[Series, int]:
    """One series bisected with fake probes: (the series, rounds taken)."""
    monkeypatch.setattr(capacity_search, "_run_probes", fake_probes(passes))
    series = Series(0, None, "fake", {})
    rounds: list[int] = []
    capacity_search._bisect([series], {}, None, None, low=low, high=high, tol=tol, source=None, param="rate",
                            on_round=lambda n, _open: rounds.append(n))
    return series, len(rounds)


def test_a_monotone_search_brackets_the_answer(monkeypatch):
    s, rounds = bisect(monkeypatch, lambda rate: rate <= 10.3, low=0.25, high=64.0, tol=0.1)
    assert s.status == "ok" and s.low <= 10.3 < s.high and s.high - s.low <= 0.1
    assert rounds == check_tol(0.25, 64.0, 0.1)


def test_a_bracket_that_cannot_narrow_closes_instead_of_looping(monkeypatch):
    # A tol under the 6-decimal rounding of probe rates (search() refuses it; _bisect is called
    # directly): once no rounded rate lies strictly inside the bracket, the search stops.
    s, rounds = bisect(monkeypatch, lambda rate: rate <= 1.2345678, low=1.0, high=2.0, tol=1e-12)
    assert s.status == "ok" and s.high - s.low == pytest.approx(1e-6) and rounds < 30
    # The same near the float limit, where floats are 2**971 apart (and high + low overflows).
    s, rounds = bisect(monkeypatch, lambda rate: rate <= 1.5e308, low=1e308, high=1.7e308, tol=1.0)
    assert s.status == "ok" and s.high - s.low <= 4 * math.ulp(1.7e308) and rounds < 60


@pytest.mark.parametrize("seed", range(5))
def test_non_monotone_results_still_end(monkeypatch, seed):
    """Latency need not be monotone in the rate: probes passing and failing at random still give
    a bracket (a pass below the lowest fail) within the rounds check_tol counts."""
    rng = random.Random(seed)
    outcome: dict[float, bool] = {}
    s, rounds = bisect(monkeypatch, lambda rate: outcome.setdefault(rate, rng.random() < 0.5),
                       low=0.25, high=64.0, tol=0.01)
    assert s.status in ("ok", "at-high", "below-low")
    assert rounds <= check_tol(0.25, 64.0, 0.01)
    if s.status == "ok":
        assert s.high - s.low <= 0.01 and not outcome[s.high] and (s.low == 0.25 or outcome[s.low])
