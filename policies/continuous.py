"""Continuous batching (Orca / vLLM): membership changes between steps, whole prompts per step.

By default a step that can admit waiting prompts is a prefill-only step (vLLM v0's default
order), so the seed's 12-token prompt is processed whole before the next decode. With
`mixed: true` admitted prompts share the step with the running decodes (vLLM v1 without
chunked prefill). Preemption when blocks run out: the most recently admitted running request.
"""

from __future__ import annotations

from functools import partial

from policies.base import BasePolicy
from policies.budget import StepBudget
from policies.fast_path import request_ids, steps_to_first_finish
from policies.stretch import DecoderCarry, Stretch
from simcore.request import Request


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

    def plan_stretch(self) -> Stretch | None:
        """Decode-only runs (the base's), and also, when the head of the queue can be admitted
        alone, the prefill-only step that admits it whole and, when nothing else waits, the
        decode-only steps that follow with it in the batch: most steps that `schedule` would
        plan are those (under light load the queue is that one request; under load, long
        prompts leave no budget for a second)."""
        # Only where nothing else shapes the admission step: swapped requests come back before
        # any admission, and a prefix cache gives prompts hits and block ids that planning
        # would have to work out (as would a host tier's copies, where blocks have ids).
        can_plan_admission = not (self.swapped or self.bm.enable_prefix_caching
                                  or (self.host is not None and self.bm.tracks_block_ids))
        if can_plan_admission and self.waiting:
            # Where the head can be admitted, the next step admits it: no decode-only run first.
            head = self.waiting[0]
            stretch = self._mixed_admission_stretch(head) if self.mixed else self._admission_stretch(head)
            if stretch is not None:
                return stretch
        return super().plan_stretch()

    def _admits_after_decodes(self) -> bool:
        return self.mixed

    def _may_admit_during_stretch(self, decode_blocks: int = 0) -> bool:
        """Mixed steps admit whole prompts in the budget the decodes leave, which a decode-only
        run does not change (it ends at its first finish while a queue waits): a head longer
        than that waits to the run's end, and those behind it with it (first come, first
        served). Without a prefix cache, whose hits would shorten what it has to run."""
        if self.mixed and not self.bm.enable_prefix_caching and \
                self.waiting[0].num_tokens > self.options.max_num_batched_tokens - len(self.running):
            return False
        return super()._may_admit_during_stretch(decode_blocks)

    def _admission_stretch(self, head: Request) -> Stretch | None:
        """The step `_admit_whole_prompts` takes when it admits `head` alone, whole (the first
        admission of a step gets the budget it needs), where a seat and the blocks admission
        asks for are free and the next waiting request, if any, cannot join it; then, when
        nothing else waits, the decode-only steps that follow."""
        running = self.running
        # The head may be a recompute (prompt and outputs, after a preemption): admitted whole
        # the same way (see `_apply_newcomer`).
        if len(running) >= self.options.max_num_seqs:
            return None
        prompt = head.num_tokens
        watermark = self.num_watermark_blocks()
        if not self.bm.can_allocate(self._blocks_to_admit(head, prompt), reserve=watermark):
            return None
        others_wait = len(self.waiting) > 1
        if others_wait and self._admits_next_beside(head, watermark):
            return None  # the step admits more than the head: `schedule` plans it
        carry = self._carried(running)
        if carry is None and len(running) > self._num_known_decoding and not self._all_decoding(running):
            return None  # every running request must decode in the steps that follow
        # One step, no decoders in it (none has a step to its first finish).
        stretch = Stretch(num_steps=1, decoders=[], decode_ids=[], decode_firsts=[], decode_context=0,
                          steps_to_finish=1, newcomer=head, newcomer_chunk=prompt)
        # While others wait, the next step tries to admit the next of them: no decode run is
        # certain after this step, unless the head takes the last seat; then none is admitted
        # before the first finish, and arrivals wait with them.
        if head.num_target_outputs > head.num_outputs + 1:
            if not others_wait:
                stretch.plan_then = partial(self._decodes_after_admission, carry=carry)
            elif len(running) + 1 >= self.options.max_num_seqs:
                stretch.arrivals_wait = True
                stretch.plan_then = partial(self._decodes_after_admission, carry=carry, queue=True)
        return stretch

    def _mixed_admission_stretch(self, head: Request) -> Stretch | None:
        """The mixed step that admits `head` alone, whole, beside every running decode (its
        prompt admitted and completed in one step: a chunk the size of the prompt, chunked
        prefill's `tail`), where the blocks and the budget the decodes leave admit it and not
        the next waiting request; then the decodes that follow with it among them, where nothing
        else waits, or what waits cannot be admitted before the first finish. With nothing
        running, the step is the unmixed one (`_admission_stretch`)."""
        running = self.running
        if not running:
            return self._admission_stretch(head)
        num_running, prompt = len(running), head.num_tokens
        budget_left = self.options.max_num_batched_tokens - num_running  # after the decodes
        if num_running >= self.options.max_num_seqs or prompt > budget_left:
            return None
        carry = self._carried(running)
        columns = self._decoder_columns(running, carry)
        if columns is None:
            return None
        ids, context, to_finish = columns
        if to_finish is None:
            to_finish = steps_to_first_finish(running)
        firsts = self.bm.first_new_block_steps(ids)
        # The decodes take their blocks first (too few: they preempt, stepping's), then
        # admission asks for the head's while the watermark stays free (as _try_admit).
        free = self.bm.num_free_blocks - firsts.count(1)  # a decode needs a block where its first is 1
        watermark = self.num_watermark_blocks()
        if free < 0 or self._blocks_to_admit(head, prompt) + watermark > free:
            return None
        queue = len(self.waiting) > 1
        held_back = False  # whether what waits stays out of the decode steps after, to the first finish
        if queue:
            following = self.waiting[1]
            seats_left = self.options.max_num_seqs - num_running - 1
            fits_blocks = self._blocks_to_admit(following, following.num_tokens) + watermark <= \
                free - self._blocks_on_admission(head, prompt)[0]
            if seats_left > 0 and following.num_tokens <= budget_left - prompt and fits_blocks:
                return None  # the step admits it too: `schedule` plans it
            # Until the first finish the seats, the budget the decodes leave and the free
            # blocks only shrink.
            held_back = seats_left <= 0 or following.num_tokens > budget_left - 1 or not fits_blocks
        stretch = Stretch(1, list(running), ids, firsts, context, to_finish, head, prompt, tail=prompt, admits=True)
        # A finish in this step ends the run where a queue may take the seat it frees, or where
        # the engine stops at finishes (follow-up turns).
        past = not queue and self.run_past_finishes and self.can_run_past_finishes()
        if head.num_target_outputs > head.num_outputs + 1 and (to_finish > 1 or past) and (held_back or not queue):
            stretch.arrivals_wait = queue
            stretch.plan_then = partial(self._decodes_after_prompt, pending=prompt, queue=queue)
        return stretch

    def _admits_next_beside(self, head: Request, watermark: int) -> bool:
        """Whether the step that admits `head` (the first admission, given the budget it
        needs) also admits the next waiting request, as `_admit_whole_prompts` goes on: a seat
        and the tokens left for its whole prompt, and its blocks beside the head's. It repeats
        their rules (with no prefix cache or host tier): a change to either must change it too;
        tests/test_fast_path.py compares both paths on random workloads."""
        budget = self.options.max_num_batched_tokens
        tokens_left = max(budget, head.num_tokens) - head.num_tokens
        seats_left = self.options.max_num_seqs - len(self.running) - 1
        if tokens_left <= 0 or seats_left <= 0:
            return False
        following = self.waiting[1]
        if following.num_tokens > tokens_left:
            return False
        head_blocks, _ = self._blocks_on_admission(head, head.num_tokens)
        need = self._blocks_to_admit(following, following.num_tokens)
        return need + watermark <= self.bm.num_free_blocks - head_blocks

    def _decodes_after_admission(self, admission: Stretch, carry: DecoderCarry | None,
                                 queue: bool = False) -> Stretch | None:
        """The decode-only steps of the running batch and the request that `admission` (a step
        that admits a whole prompt) admits, after that step, planned from the state that step
        leaves: nothing waits then, or, with `queue`, what waits cannot take a seat before the
        first finish (`_decodes_joined`)."""
        running, head = self.running, admission.newcomer
        assert head is not None
        taken, head_first = self._blocks_on_admission(head, head.num_tokens)
        ids = carry.ids if carry is not None else request_ids(running)
        remaining = self._steps_left(running, carry)
        remaining.append(head.num_target_outputs - head.num_outputs - 1)  # its output in that step
        # The running requests did not advance in the admission step.
        contexts = [request.num_processed for request in running]
        contexts.append(head.num_tokens)
        return self._decodes_joined([*running, head], [*ids, head.request_id],
                                    [*self.bm.first_new_block_steps(ids), head_first], remaining, contexts,
                                    self.bm.num_free_blocks - taken, queue)
