"""Durations in seconds (float64 arrays, every one >= 0), used for think times between turns."""

from __future__ import annotations

import numpy as np

from workloads.spec import DurationDist, ExponentialDuration, FixedDuration, LognormalDuration, UniformDuration


def sample_durations(spec: DurationDist, num: int, rng: np.random.Generator) -> np.ndarray:
    """`num` durations following `spec`."""
    if isinstance(spec, FixedDuration):
        return np.full(num, float(spec.value))
    if isinstance(spec, UniformDuration):
        return rng.uniform(spec.low, spec.high, num)
    if isinstance(spec, LognormalDuration):
        with np.errstate(over="ignore"):  # a huge sigma overflows to inf: clipped by max, else reported
            draws = spec.median * np.exp(spec.sigma * rng.standard_normal(num))
        return draws if spec.max is None else np.minimum(draws, spec.max)
    if isinstance(spec, ExponentialDuration):
        return rng.exponential(spec.mean, num)
    raise TypeError(f"unknown duration spec {spec!r}")
