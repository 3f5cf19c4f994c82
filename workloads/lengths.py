"""Token-length distributions: int64 arrays of n lengths, every one >= 1."""

from __future__ import annotations

import numpy as np

from workloads.spec import (
    MAX_TOKENS,
    EmpiricalLength,
    FixedLength,
    LengthDist,
    LognormalLength,
    NormalLength,
    UniformLength,
)


def fixed_lengths(value: int, num: int) -> np.ndarray:
    return np.full(num, value, dtype=np.int64)


def uniform_lengths(low: int, high: int, num: int, rng: np.random.Generator) -> np.ndarray:
    """Integers uniform on [low, high], both included."""
    return rng.integers(low, high + 1, num, dtype=np.int64)


def lognormal_lengths(
    median: float, sigma: float, num: int, rng: np.random.Generator, *, min_len: int = 1, max_len: int | None = None
) -> np.ndarray:
    # Clip rather than redraw: cheap, vectorised and deterministic, at the price of small
    # point masses at the bounds, which is what "min/max" means in most serving benchmarks.
    with np.errstate(over="ignore"):  # a huge sigma overflows to inf, which the clip below bounds
        draws = median * np.exp(sigma * rng.standard_normal(num))
    return _round_clip(draws, min_len, max_len)


def normal_lengths(
    mean: float, std: float, num: int, rng: np.random.Generator, *, min_len: int = 1, max_len: int | None = None
) -> np.ndarray:
    # + 0.0 turns -0.0 into 0.0: it passes `std >= 0`, but numpy reads the sign bit and refuses it.
    return _round_clip(rng.normal(mean, std + 0.0, num), min_len, max_len)


def empirical_lengths(values: list[int], num: int, rng: np.random.Generator) -> np.ndarray:
    """Each draw one of `values`, uniformly (duplicates weight a value)."""
    return rng.choice(np.asarray(values, dtype=np.int64), num)


def _round_clip(draws: np.ndarray, min_len: int, max_len: int | None) -> np.ndarray:
    # Without a max, a huge median or sigma must still give lengths that fit int64 (and no NaN).
    upper = MAX_TOKENS if max_len is None else min(max_len, MAX_TOKENS)
    return np.clip(np.nan_to_num(np.rint(draws), nan=upper), min_len, upper).astype(np.int64)


def sample_lengths(spec: LengthDist, num: int, rng: np.random.Generator) -> np.ndarray:
    """`num` token lengths following `spec`."""
    if isinstance(spec, FixedLength):
        return fixed_lengths(spec.value, num)
    if isinstance(spec, UniformLength):
        return uniform_lengths(spec.low, spec.high, num, rng)
    if isinstance(spec, LognormalLength):
        return lognormal_lengths(spec.median, spec.sigma, num, rng, min_len=spec.min, max_len=spec.max)
    if isinstance(spec, NormalLength):
        return normal_lengths(spec.mean, spec.std, num, rng, min_len=spec.min, max_len=spec.max)
    if isinstance(spec, EmpiricalLength):
        return empirical_lengths(spec.values, num, rng)
    raise TypeError(f"unknown length spec {spec!r}")
