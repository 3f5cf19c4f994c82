"""Summary statistics of latencies near the float range: finite figures, no overflow warnings."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from simcore.itl import mean_and_std, weighted_stats
from simcore.metrics import summarize
from simcore.request import Status
from tests.helpers import req


def test_ordinary_values_give_numpys_figures_exactly():
    rng = np.random.default_rng(1)
    values = rng.random(50) * 0.03
    weights = rng.integers(1, 9, size=50)
    assert mean_and_std(values) == (float(np.mean(values)), float(np.std(values)))
    expanded = np.repeat(values, weights)
    mean, std = mean_and_std(values, weights)
    assert mean == pytest.approx(np.mean(expanded), rel=1e-12) and std == pytest.approx(np.std(expanded), rel=1e-12)


@pytest.mark.parametrize("weighted", [False, True])
def test_huge_values_keep_a_finite_mean_and_spread(weighted):
    values = np.array([1e300, 3e300, 2e300, 1e300])
    weights = np.array([1, 1, 2, 1]) if weighted else None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an overflow warning fails the test
        mean, std = mean_and_std(values, weights)
        stats = weighted_stats(values, np.ones(4, dtype=np.int64), (50,))
    expanded = np.repeat(values / 1e300, weights if weighted else 1)
    assert mean == pytest.approx(1e300 * np.mean(expanded), rel=1e-12)
    assert std == pytest.approx(1e300 * np.std(expanded), rel=1e-12)
    assert np.isfinite([stats["mean"], stats["std"], stats["p50"]]).all()


def test_a_run_of_astronomically_long_steps_summarizes_without_warnings():
    done = []
    for request_id, scale in ((0, 1.0), (1, 3.0)):
        request = req(request_id, 0.0, 4, 3)
        request.first_scheduled_s, request.prefill_done_s, request.first_token_s = 0.0, scale * 1e298, scale * 1e298
        request.last_token_s = request.finish_s = scale * 3e298
        request.num_outputs, request.status = 3, Status.FINISHED
        done.append(request)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # before: "overflow encountered in square" from the spread
        summary = summarize(done)
    assert summary["mean_e2el_ms"] == pytest.approx(6e301) and summary["std_e2el_ms"] == pytest.approx(3e301)
