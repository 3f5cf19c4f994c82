"""The contract between the event loop and a scheduling policy (no SimPy on this side)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from simcore.itl import ItlLog
from simcore.plan import StepPlan
from simcore.request import Request


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

    def decode_stretch_bound(self) -> int:
        """How many next steps are certain to be decode-only steps of the same batch (0: unknown)."""

    def stretch_sum_context(self) -> int:
        """Total context of the running batch, for pricing a run of decode steps."""

    def apply_decode_stretch(self, step_ends: list[float]) -> list[Request]:
        """Complete len(step_ends) decode steps at once; return requests that finished."""

    def drain_unfinished(self) -> list[Request]:
        """A time horizon ended the run: everything still queued or running, marked unfinished."""

    def check(self) -> None:
        """Raise AssertionError if block accounting or request state is inconsistent."""

    def check_drained(self) -> None:
        """Raise AssertionError if any block is still held after every request finished."""
