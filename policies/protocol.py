"""The contract between the event loop and a scheduling policy (no SimPy on this side)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from policies.stretch import Stretch
from simcore.itl import ItlLog
from simcore.plan import StepPlan
from simcore.request import Request
from simcore.run_counts import RunCounts


class Policy(Protocol):
    name: str
    # Queues the engine reports on (per-step records, end-of-run accounting).
    waiting: Sequence[Request]
    running: list[Request]
    swapped: Sequence[Request]
    finished: list[Request]
    rejected: list[Request]
    itl: ItlLog
    num_resident_tokens: int

    def add(self, request: Request, now: float) -> None:
        """A request arrives: queue it, or reject it with a reason if it can never run."""

    def schedule(self, now: float) -> StepPlan | None:
        """The next step's plan, or None when nothing can run until something arrives."""

    def complete(self, plan: StepPlan, now: float) -> list[Request]:
        """The step ended at `now`: advance processed counts, select outputs; return finished requests."""

    def has_work(self) -> bool:
        """Whether anything is queued, running or swapped out."""

    def plan_stretch(self) -> Stretch | None:
        """The run of steps of one known shape certain to come next, if any (the fast path)."""

    def begin_stretch(self, stretch: Stretch, now: float) -> None:
        """Before a stretch's steps are counted and applied: what its first step does first."""

    def stretch_run_counts(self, stretch: Stretch, num_steps: int) -> RunCounts:
        """What the step records of a stretch's first steps derive their counts from (decoders,
        running requests, blocks in use, resident tokens), read before they are applied."""

    def apply_stretch(self, stretch: Stretch, step_ends: list[float]) -> list[Request]:
        """Complete a stretch's first len(step_ends) steps at once; return requests that finished."""

    def joined_run_counts(self, stretch: Stretch, then: Stretch, num_then: int) -> tuple[RunCounts, RunCounts]:
        """stretch_run_counts for a stretch and the first `num_then` steps of the one that joins
        it (`Stretch.joins`), applied together (`apply_joined`)."""

    def apply_joined(self, stretch: Stretch, then: Stretch, step_ends: list[float]) -> list[Request]:
        """apply_stretch for a stretch and the steps of the one that joins it that follow it,
        len(step_ends) in all (more than the stretch's); return requests that finished."""

    def drain_unfinished(self) -> list[Request]:
        """A time horizon ended the run: everything still queued or running, marked unfinished."""

    def check(self) -> None:
        """Raise AssertionError if block accounting or request state is inconsistent."""

    def check_drained(self) -> None:
        """Raise AssertionError if any block is still held after every request finished."""
