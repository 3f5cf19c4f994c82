"""Request priorities from `workload.priority`: int64 arrays of draws, one per user.

A "user" is a request, or a whole session: every turn of a conversation gets the priority drawn
for it (a chat belongs to one tenant or service tier), so a session is never split between
priority classes. Draws come from their own stream, so adding or changing `priority` never shifts
the arrivals, lengths or prefixes drawn for the same seed.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from workloads.spec import ChoicePriority, FixedPriority, PriorityDist, UniformPriority
from workloads.streams import stream


def sample_priorities(spec: PriorityDist, num: int, rng: np.random.Generator) -> np.ndarray:
    """`num` priorities following `spec`."""
    if isinstance(spec, FixedPriority):
        return np.full(num, spec.value, dtype=np.int64)
    if isinstance(spec, UniformPriority):
        return rng.integers(spec.low, spec.high + 1, num, dtype=np.int64)
    if isinstance(spec, ChoicePriority):
        values = np.asarray(spec.values, dtype=np.int64)
        if spec.weights is None:
            return rng.choice(values, num)
        weights = np.asarray(spec.weights, dtype=np.float64)
        # Scaled by the largest first: weights near the float limit would sum to inf (every
        # probability NaN), and tiny ones to a subnormal sum that loses precision.
        weights = weights / weights.max()
        return rng.choice(values, num, p=weights / weights.sum())
    raise TypeError(f"unknown priority spec {spec!r}")


def draw_priorities(spec: PriorityDist, table: pd.DataFrame, seed: int) -> np.ndarray:
    """One priority per row of `table` (rows in arrival order): a draw per request, or per session
    for rows with a `session_id`, in order of each user's first row."""
    num = len(table)
    rng = stream(seed, "priority")
    if "session_id" not in table:
        return sample_priorities(spec, num, rng)
    codes, _ = pd.factorize(table["session_id"], use_na_sentinel=True)
    rows = np.arange(num)
    # Each row's user is the first row of its session, or the row itself when it has none.
    has_session = codes >= 0
    first_of_code = np.full(int(codes.max()) + 1 if has_session.any() else 0, num, dtype=np.int64)
    np.minimum.at(first_of_code, codes[has_session], rows[has_session])
    user_row = np.where(has_session, first_of_code[np.maximum(codes, 0)], rows)
    heads = np.flatnonzero(user_row == rows)
    per_row = np.zeros(num, dtype=np.int64)
    per_row[heads] = sample_priorities(spec, len(heads), rng)
    return per_row[user_row]
