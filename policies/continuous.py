"""Continuous batching (Orca / vLLM): membership changes between steps, whole prompts per step.

By default a step that can admit waiting prompts is a prefill-only step (vLLM v0's default
order), so the seed's 12-token prompt is processed whole before the next decode. With
`mixed: true` admitted prompts share the step with the running decodes (vLLM v1 without
chunked prefill). Preemption when blocks run out: the most recently admitted running request.
"""

from __future__ import annotations

from policies.base import BasePolicy
from policies.budget import StepBudget


class ContinuousPolicy(BasePolicy):
    name = "continuous"

    def __init__(self, *args, mixed: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.mixed = mixed

    def rejection_reason(self, request):  # type: ignore[no-untyped-def]
        reason = super().rejection_reason(request)
        if reason is None and request.prompt_len > self.options.max_num_batched_tokens:
            reason = (
                f"prompt of {request.prompt_len} tokens exceeds max_num_batched_tokens "
                f"{self.options.max_num_batched_tokens} and this policy does not chunk prompts"
            )
        return reason

    def _fill(self, now: float) -> None:
        budget = StepBudget(self.options.max_num_batched_tokens, self.options.max_num_seqs)
        if not self.mixed and not self.swapped:
            self._admit_whole_prompts(budget, now)
            if self._plan.num_seqs:  # type: ignore[union-attr]
                return
        # Whole prompts are prefilled on admission, so every running request is decoding.
        self._schedule_decodes(list(self.running), budget)
        if self._plan.preempted:  # type: ignore[union-attr]
            return
        self._resume_swapped(budget)
        if self.mixed and not self.swapped:
            self._admit_whole_prompts(budget, now)

    def _admit_whole_prompts(self, budget: StepBudget, now: float) -> None:
        admission = self._admission_budget(budget)
        while self.waiting and not admission.is_spent:
            request = self.waiting[0]
            max_chunk = request.num_tokens
            if not self._plan.num_seqs and request.num_tokens > admission.num_tokens:  # type: ignore[union-attr]
                # A recompute of prompt + outputs may exceed the budget; it then runs alone.
                admission.num_tokens = request.num_tokens
            taken = self._try_admit(request, admission, max_chunk, now, whole=True)
            if taken == 0:
                return
            budget.take(taken)
