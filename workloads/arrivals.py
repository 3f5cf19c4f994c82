"""Arrival processes: absolute arrival times (seconds) for n requests, sorted ascending.

Every process starts its clock at 0 and the first request arrives one gap later (as in a
renewal process), except `burst`, where all arrive at `at`.
"""

from __future__ import annotations

import numpy as np

from workloads.spec import ArrivalSpec, BurstArrivals, ConstantArrivals, GammaArrivals, PoissonArrivals


def poisson_arrivals(rate: float, num_requests: int, rng: np.random.Generator) -> np.ndarray:
    """Exponential gaps with mean 1/rate; no capping, so the tail is the real exponential one."""
    return np.cumsum(rng.exponential(1.0 / rate, num_requests))


def gamma_arrivals(rate: float, cv: float, num_requests: int, rng: np.random.Generator) -> np.ndarray:
    """Gamma gaps with mean 1/rate and coefficient of variation cv (shape 1/cv², scale cv²/rate)."""
    shape = 1.0 / (cv * cv)
    return np.cumsum(rng.gamma(shape, 1.0 / (rate * shape), num_requests))


def constant_arrivals(rate: float, num_requests: int) -> np.ndarray:
    return np.arange(1, num_requests + 1, dtype=np.float64) / rate


def burst_arrivals(at: float, num_requests: int) -> np.ndarray:
    return np.full(num_requests, float(at))


def sample_arrivals(spec: ArrivalSpec, num_requests: int, rng: np.random.Generator) -> np.ndarray:
    """Arrival times for `num_requests` requests following `spec`."""
    # A tiny rate can put times past the float range: they become inf, which the workload
    # builder reports as a config error (a warning here would only add noise).
    with np.errstate(over="ignore", invalid="ignore"):
        if isinstance(spec, PoissonArrivals):
            return poisson_arrivals(spec.rate, num_requests, rng)
        if isinstance(spec, GammaArrivals):
            return gamma_arrivals(spec.rate, spec.cv, num_requests, rng)
        if isinstance(spec, ConstantArrivals):
            return constant_arrivals(spec.rate, num_requests)
        if isinstance(spec, BurstArrivals):
            return burst_arrivals(spec.at, num_requests)
    raise TypeError(f"unknown arrival spec {spec!r}")
