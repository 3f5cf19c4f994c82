"""Inter-token latencies as weighted samples, so memory grows with steps, not with tokens.

Within a run of decode-only steps every running request's gap equals the step's duration, so
one (gap, count) pair stands for the whole batch. Percentiles are those of the expanded list
(numpy's linear interpolation), so the representation never changes a reported figure.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter

import numpy as np


class ItlLog:
    def __init__(self) -> None:
        # Typed arrays: 16 bytes an entry, not two Python objects.
        self.values = array("d")
        self.weights = array("q")

    @classmethod
    def merged(cls, logs: list[ItlLog]) -> ItlLog:
        """Every gap of several logs (a cluster's replicas) in one."""
        merged = cls()
        for log in logs:
            merged.values.extend(log.values)
            merged.weights.extend(log.weights)
        return merged

    def add(self, gap_s: float, count: int = 1) -> None:
        self.values.append(gap_s)
        self.weights.append(count)

    def add_weighted(self, gaps: list[float], counts: list[int]) -> None:
        """Successive steps' gaps, each shared by its own count of requests (a run's steps, whose
        batch shrinks as requests finish)."""
        if len(gaps) != len(counts):
            raise ValueError(f"{len(gaps)} gaps with {len(counts)} counts")
        self.values.extend(gaps)
        self.weights.extend(counts)

    def add_gaps(self, gaps: list[float]) -> None:
        """One step's gaps: a weighted entry for each distinct value, first seen first (the order
        stepping adds them in); one for the whole step where all are equal (the common case)."""
        if gaps.count(gaps[0]) == len(gaps):
            self.add(gaps[0], len(gaps))
            return
        for gap, count in Counter(gaps).items():
            self.add(gap, count)

    @property
    def num_samples(self) -> int:
        return int(sum(self.weights))

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return np.frombuffer(self.values, dtype=np.float64).copy(), np.frombuffer(self.weights, dtype=np.int64).copy()


def weighted_percentile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """np.percentile(np.repeat(values, weights), q) without materialising the repeat."""
    return _SortedWeighted(values, weights).percentile(q)


class _SortedWeighted:
    """Values sorted once with their cumulative weights, for any number of percentiles."""

    def __init__(self, values: np.ndarray, weights: np.ndarray) -> None:
        # Not a stable sort (twice as fast on millions): however equal values are ordered, the
        # cumulative weights at each boundary between distinct values are the same.
        order = np.argsort(values)
        self.values = values[order]
        # The last copy of values[i] in the expanded list sits at index ends[i] - 1.
        self.ends = np.cumsum(weights[order])
        self.total = int(self.ends[-1]) if self.ends.size else 0

    def percentile(self, q: float) -> float:
        position = q / 100.0 * (self.total - 1)
        below = int(np.floor(position))
        frac = position - below
        lo = self.values[np.searchsorted(self.ends, below, side="right")]
        hi = self.values[np.searchsorted(self.ends, min(below + 1, self.total - 1), side="right")]
        return float(lo + (hi - lo) * frac)


def weighted_stats(values: np.ndarray, weights: np.ndarray, percentiles: tuple[int, ...]) -> dict[str, float]:
    mean, std = mean_and_std(values, weights)
    ranked = _SortedWeighted(values, weights)
    out = {"mean": mean, "median": ranked.percentile(50), "std": std}
    for p in percentiles:
        out[f"p{p}"] = ranked.percentile(p)
    return out


def mean_and_std(values: np.ndarray, weights: np.ndarray | None = None) -> tuple[float, float]:
    """Mean and standard deviation (weighted, if weights are given) of finite values, however
    large: where sums or squares would pass the float range, they are taken on the values
    scaled down by the largest (the same figures as plain numpy everywhere else)."""
    with np.errstate(over="ignore", invalid="ignore"):
        mean, std = _plain_mean_and_std(values, weights)
        if not (math.isfinite(mean) and math.isfinite(std)) and values.size and np.isfinite(values).all():
            scale = float(np.abs(values).max())
            mean, std = (scale * figure for figure in _plain_mean_and_std(values / scale, weights))
    return mean, std


def _plain_mean_and_std(values: np.ndarray, weights: np.ndarray | None) -> tuple[float, float]:
    if weights is None:
        return float(np.mean(values)), float(np.std(values))
    total = weights.sum()
    mean = float((values * weights).sum() / total)
    return mean, float((weights * (values - mean) ** 2).sum() / total) ** 0.5
