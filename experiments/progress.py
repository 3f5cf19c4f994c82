"""Progress for long commands: a live line on stderr while work goes on.

Shown only when stderr is a terminal and `--quiet` is not given: a log file or a pipe (and the
tests) sees exactly what it saw before. Bars are tqdm's (a dependency already); they redraw at
most twice a second, so a caller may report as often as it likes.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# Bars redraw at most this often (seconds).
REDRAW_S = 0.5
# And appear only once work has gone on this long, so quick work leaves no flicker.
SHOW_AFTER_S = 1.0


def progress_wanted(quiet: bool = False) -> bool:
    """Whether to draw progress: stderr is a terminal and the user did not ask for quiet."""
    return not quiet and sys.stderr.isatty()


def progress_bar(total: float | None, desc: str, *, unit: str = "it", enabled: bool = True,  # noqa: ANN201 - tqdm
                 **options: Any):
    """A tqdm bar on stderr that clears itself when closed (the command's own lines stay)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=not enabled, leave=False,
                dynamic_ncols=True, mininterval=REDRAW_S, delay=SHOW_AFTER_S, **options)


class RunProgress:
    """One bar per policy of a `run`: simulated time, requests finished of the total, and the
    simulated seconds per wall second. The engine reports every few hundred events."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._bar = None
        self._started = 0.0
        self._next_draw = 0.0

    def policy(self, label: str, num_requests: int) -> Callable[[float, int], None] | None:
        """Open the bar for one policy; returns the engine's `on_progress` (None when disabled)."""
        self.close()
        if not self.enabled:
            return None
        self._bar = progress_bar(num_requests, f"  {label}", unit="req")
        self._started = time.perf_counter()
        self._next_draw = self._started + SHOW_AFTER_S
        return self._report

    def _report(self, sim_time_s: float, num_finished: int) -> None:
        now = time.perf_counter()
        if now < self._next_draw:  # most reports cost only this check
            return
        self._next_draw = now + REDRAW_S
        self._bar.n = num_finished
        speed = sim_time_s / max(now - self._started, 1e-9)
        self._bar.set_postfix_str(f"{sim_time_s:,.0f} s simulated, {speed:,.0f}x real time")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


@contextmanager
def elapsed(desc: str, *, enabled: bool = True) -> Iterator[None]:
    """For work that cannot count its parts: a line with the time spent so far, redrawn by a
    thread until the block ends."""
    if not enabled:
        yield
        return
    bar = progress_bar(None, desc, bar_format="{desc}: {elapsed}")
    stop = threading.Event()

    def tick() -> None:
        if stop.wait(SHOW_AFTER_S):
            return
        while not stop.is_set():
            bar.refresh()
            stop.wait(REDRAW_S)

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        bar.close()
