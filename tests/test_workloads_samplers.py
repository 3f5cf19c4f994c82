"""Arrival, length and duration samplers: loose statistical checks with fixed seeds."""

import numpy as np
import pytest

from workloads.arrivals import burst_arrivals, constant_arrivals, gamma_arrivals, poisson_arrivals
from workloads.durations import sample_durations
from workloads.lengths import empirical_lengths, lognormal_lengths, normal_lengths, sample_lengths, uniform_lengths
from workloads.spec import ExponentialDuration, FixedLength, LognormalDuration, UniformDuration
from workloads.streams import stream

N = 200_000


def rng(seed=0):
    return np.random.default_rng(seed)


def gaps(times):
    return np.diff(np.concatenate(([0.0], times)))


def test_poisson_gaps_are_exponential_with_mean_one_over_rate():
    g = gaps(poisson_arrivals(4.0, N, rng()))
    assert g.mean() == pytest.approx(0.25, rel=0.02)
    assert g.std() / g.mean() == pytest.approx(1.0, rel=0.03)
    # No capping: the far tail of an exponential is there (P(gap > 10/rate) = e^-10 ≈ 4.5e-5).
    assert g.max() > 2.0


@pytest.mark.parametrize("cv", [0.5, 1.0, 3.0])
def test_gamma_gaps_have_requested_mean_and_cv(cv):
    g = gaps(gamma_arrivals(2.0, cv, N, rng(1)))
    assert g.mean() == pytest.approx(0.5, rel=0.03)
    assert g.std() / g.mean() == pytest.approx(cv, rel=0.05)


def test_arrivals_are_sorted_and_start_one_gap_after_zero():
    for times in (poisson_arrivals(3.0, 1000, rng()), gamma_arrivals(3.0, 2.0, 1000, rng()), constant_arrivals(2.0, 5)):
        assert np.all(np.diff(times) >= 0) and times[0] > 0
    assert constant_arrivals(2.0, 4).tolist() == [0.5, 1.0, 1.5, 2.0]
    assert burst_arrivals(3.0, 3).tolist() == [3.0, 3.0, 3.0]


def test_uniform_lengths_cover_both_ends():
    x = uniform_lengths(3, 7, N, rng())
    assert set(np.unique(x).tolist()) == {3, 4, 5, 6, 7}
    assert x.mean() == pytest.approx(5.0, rel=0.01)


def test_lognormal_median_and_clipping():
    x = lognormal_lengths(512, 0.8, N, rng(), min_len=1, max_len=8192)
    assert np.median(x) == pytest.approx(512, rel=0.02)
    assert x.dtype == np.int64 and x.min() >= 1 and x.max() <= 8192
    clipped = lognormal_lengths(512, 2.0, N, rng(), min_len=100, max_len=1000)
    assert clipped.min() == 100 and clipped.max() == 1000


def test_normal_is_rounded_and_clipped():
    x = normal_lengths(100, 30, N, rng(), min_len=50, max_len=140)
    assert x.min() == 50 and x.max() == 140
    inner = normal_lengths(1000, 10, N, rng())
    assert inner.mean() == pytest.approx(1000, rel=0.001)
    assert inner.std() == pytest.approx(10, rel=0.03)


def test_empirical_draws_only_given_values_uniformly():
    x = empirical_lengths([10, 20, 20], N, rng())
    assert set(x.tolist()) == {10, 20}
    assert (x == 20).mean() == pytest.approx(2 / 3, rel=0.02)


def test_fixed_lengths():
    assert sample_lengths(FixedLength(kind="fixed", value=7), 3, rng()).tolist() == [7, 7, 7]


def test_durations():
    uniform = sample_durations(UniformDuration(kind="uniform", low=1, high=3), N, rng())
    assert uniform.mean() == pytest.approx(2, rel=0.01) and uniform.min() >= 1 and uniform.max() <= 3
    exponential = sample_durations(ExponentialDuration(kind="exponential", mean=5), N, rng())
    assert exponential.mean() == pytest.approx(5, rel=0.02)
    capped = sample_durations(LognormalDuration(kind="lognormal", median=10, sigma=1, max=30), N, rng())
    assert np.median(capped) == pytest.approx(10, rel=0.03) and capped.max() == 30


def test_streams_are_independent_and_reproducible():
    a = stream(7, "arrivals").random(5)
    assert np.array_equal(a, stream(7, "arrivals").random(5))
    assert not np.array_equal(a, stream(7, "prompt_len").random(5))
    assert not np.array_equal(a, stream(8, "arrivals").random(5))
