"""The simulated clock: whole picoseconds.

SimPy's clock counts ticks, so a sum of step times is exact and independent of how the steps
are grouped: a run of steps taken at once ends at the very tick the same steps taken one by one
end at, and no code keeps a clock of its own. Step times, arrival times and every time a request
or a step record reports stay float seconds; each is rounded to the nearest tick once, where it
enters the clock.

A picosecond, not a nanosecond: rounding each step time to the nearest tick adds up like a
random walk, about 0.3 tick over a million steps, which is below the float clock's own rounding
at the times such runs reach (a float's spacing at 25,000 s is 3.6 ps).
"""

from __future__ import annotations

import math

TICKS_PER_SECOND = 10**12


def to_ticks(seconds: float) -> int:
    """The tick nearest to `seconds` (finite, >= 0)."""
    return round(seconds * TICKS_PER_SECOND)


def to_seconds(ticks: int) -> float:
    return ticks / TICKS_PER_SECOND


def duration_ticks(seconds: float) -> int:
    """A step time in ticks: at least one (a step takes time), for a finite `seconds` > 0.
    Raises ValueError naming the value otherwise."""
    if not 0 < seconds < math.inf:
        raise ValueError(f"step time {seconds!r}; expected a positive finite number of seconds")
    scaled = seconds * TICKS_PER_SECOND
    if scaled == math.inf:
        raise ValueError(f"step time {seconds!r} s is past what the clock counts")
    return max(round(scaled), 1)
