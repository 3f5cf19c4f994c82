"""Continuous batching (Orca / vLLM): membership changes between steps, whole prompts per step.

By default a step that can admit waiting prompts is a prefill-only step (vLLM v0's default
order), so the seed's 12-token prompt is processed whole before the next decode. With
`mixed: true` admitted prompts share the step with the running decodes (vLLM v1 without
chunked prefill). Preemption when blocks run out: the most recently admitted running request
(or, under `queue_order: priority`, the one of lowest priority).
"""

from __future__ import annotations

from policies.base import Scheduler
from policies.budget import StepBudget
from simcore.request import Request


class ContinuousPolicy(Scheduler):
    accelerable = True
    name = "continuous"
    admits_whole_prompts = True

    def __init__(self, *args, mixed: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.mixed = mixed

    def rejection_reason(self, request: Request) -> str | None:
        reason = super().rejection_reason(request)
        if reason is None and request.prompt_len > self.options.max_num_batched_tokens:
            reason = (
                f"prompt of {request.prompt_len} tokens exceeds max_num_batched_tokens "
                f"{self.options.max_num_batched_tokens} and this policy does not chunk prompts"
            )
        return reason

    def fill(self, now: float) -> None:
        budget = StepBudget(self.options.max_num_batched_tokens, self.options.max_num_seqs)
        # Swapped-out requests come back before anything is admitted.
        if not self.mixed and not self.swapped:
            self.admit_waiting(budget, now)
            if self._builder.has_seqs:  # type: ignore[union-attr]
                return  # a prefill-only step
        # Whole prompts are prefilled on admission, so every running request is decoding.
        self.schedule_decodes(list(self.running), budget)
        if self._builder.preempted:  # type: ignore[union-attr]
            return
        self.resume_swapped(budget)
        if self.mixed and not self.swapped:
            self.admit_waiting(budget, now)
