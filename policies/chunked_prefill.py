"""Chunked prefill (Sarathi-Serve): a token budget per step, prompts split into chunks.

`order: stall_free` (default) fills each step with every running decode first, then the next
chunk of partially prefilled prompts, then new requests, so decodes never stall behind a long
prompt. `order: alternate` reproduces the seed's schedule instead: prefill chunk, decode the
active requests, prefill chunk, ... Later chunks continue the same request's positions.
"""

from __future__ import annotations

from typing import Literal

from policies.base import Scheduler
from policies.budget import StepBudget
from simcore.plan import StepPlan
from simcore.request import Request, Status


class ChunkedPrefillPolicy(Scheduler):
    accelerable = True
    name = "chunked_prefill"

    def __init__(self, *args, chunk_size: int = 512, order: Literal["stall_free", "alternate"] = "stall_free",
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.chunk_size = chunk_size
        self.order = order
        # Alternate order: the last step that ran prompt chunks while decodes waited, and
        # whether the step planned last ran the decodes for that reason, without trying prompts.
        self._decodes_waited_at: int | None = None
        self._decodes_take_turn = False

    def fill(self, now: float) -> None:
        budget = StepBudget(self.options.max_num_batched_tokens, self.options.max_num_seqs)
        if self.order == "alternate":
            self._fill_alternate(budget, now)
            return
        decoding: list[Request] = []
        prefilling: list[Request] = []
        for request in self.running:
            (prefilling if request.is_prefilling else decoding).append(request)
        self.schedule_decodes(decoding, budget)
        if not self._builder.preempted:  # type: ignore[union-attr]
            self.resume_swapped(budget)
        self._run_prompts(budget, now, prefilling)

    def _fill_alternate(self, budget: StepBudget, now: float) -> None:
        # Only a chunk that made decodes wait (in the last step) earns them this one; otherwise
        # prompts first.
        has_decodes = any(not request.is_prefilling for request in self.running)
        self._decodes_take_turn = self._decodes_waited_at == self.num_steps - 1 and has_decodes
        if self._decodes_take_turn:
            self._decodes_waited_at = None  # their turn, taken (a step planned again tries prompts)
        else:
            self._run_prompts(budget, now, [request for request in self.running if request.is_prefilling])
            if self._builder.has_seqs:  # type: ignore[union-attr]
                if has_decodes:
                    self._decodes_waited_at = self.num_steps
                return
        # (Read again: the prompts' chunks may have preempted some.)
        self.schedule_decodes([request for request in self.running if not request.is_prefilling], budget)
        if not self._builder.preempted:  # type: ignore[union-attr]
            self.resume_swapped(budget)

    def _run_prompts(self, budget: StepBudget, now: float, prefilling: list[Request]) -> None:
        """The next chunks of prompts in progress, then admissions with their first chunks."""
        builder = self._builder
        assert builder is not None
        for request in prefilling:
            if budget.is_spent:
                return
            if request.status is Status.RUNNING and request.request_id not in builder.scheduled:
                chunk = self.chunk_for(request.num_pending, budget.num_tokens)
                if self.schedule_running(request, chunk):
                    budget.take(chunk)
        # Swapped-out requests come back before anything is admitted.
        if self.swapped or builder.preempted:
            return
        self.admit_waiting(budget, now)

    def chunk_for(self, num_pending: int, num_tokens: int) -> int:
        """The chunk a step with `num_tokens` of its budget left runs of a prompt in progress
        with `num_pending` positions to go."""
        return min(num_pending, self.chunk_size, num_tokens)

    def first_chunk_limit(self, request: Request) -> int:
        return self.chunk_size

    def only_continues_next(self, plan: StepPlan, finished: list[Request]) -> bool:
        # Alternate order: decodes that took their turn tried no admission, which the next step will.
        if self._decodes_take_turn and (self.waiting or self.swapped):
            return False
        return super().only_continues_next(plan, finished)
