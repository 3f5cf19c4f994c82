"""The fast path's policy side: which run of steps is certain to come next, and taking it at once.

Mixed into `BasePolicy`; it reads the policy's queues, options and block manager. The batch is
read in C-level passes (`map` over attribute getters, no Python call per request), so a stretch
costs a handful of fast passes over the batch and a few calls, whatever its length.
"""

from __future__ import annotations

from operator import attrgetter, sub
from typing import Any

from policies.stretch import Stretch
from simcore.request import Request

request_id_of = attrgetter("request_id")
num_processed_of = attrgetter("num_processed")
num_outputs_of = attrgetter("num_outputs")
prompt_len_of = attrgetter("prompt_len")
num_target_of = attrgetter("_num_target")  # num_target_outputs without the property call
last_token_of = attrgetter("last_token_s")


def request_ids(requests: list[Request]) -> list[int]:
    return list(map(request_id_of, requests))


def steps_to_first_finish(requests: list[Request]) -> int:
    """Steps (one output each) until the first of `requests` has all its outputs."""
    return min(map(sub, map(num_target_of, requests), map(num_outputs_of, requests)))


class StretchMixin:
    # Provided by BasePolicy.
    running: list[Request]
    options: Any
    bm: Any
    itl: Any
    num_steps: int
    num_resident_tokens: int

    def plan_stretch(self) -> Stretch | None:
        """The run of decode-only steps of the whole running batch that is certain to come next.

        While no request arrives, finishes, is admitted, needs a block it cannot get, or is
        preempted, each step processes one token for every running request, so the steps can
        be taken at once (`apply_stretch`) with results identical to stepping one by one.
        None when the next step is not of that kind. The step in which the first request
        finishes is included; arrivals are the engine's to bound.
        """
        running = self.running
        # The newest request is the one most likely still prefilling: look there first.
        if not running or self.swapped or running[-1].is_prefilling:
            return None
        if not self._decodes_all_fit(len(running)):
            return None
        if self.waiting and self._may_admit_during_stretch():
            return None
        if not self._all_decoding(running):
            return None
        ids = request_ids(running)
        firsts = self.bm.first_new_block_steps(ids)
        to_finish = steps_to_first_finish(running)
        num_steps = self.bm.max_decode_steps(ids, to_finish, firsts)
        return Stretch(num_steps, list(running), ids, firsts, sum(map(num_processed_of, running)), to_finish)

    def _all_decoding(self, requests: list[Request]) -> bool:
        """Whether each request has its prompt done and exactly its newest output to process."""
        if not requests:
            return True
        if self._preempted_at and not self._preempted_at.keys().isdisjoint(map(request_id_of, requests)):
            return False
        if min(map(num_outputs_of, requests)) == 0:
            return False
        # A running request always has at least one position pending (checked by `check`), so
        # all have exactly one when the pending positions add up to one each.
        pending = sum(map(prompt_len_of, requests)) + sum(map(num_outputs_of, requests)) - sum(map(num_processed_of, requests))
        return pending == len(requests)

    def _decodes_all_fit(self, num_decodes: int) -> bool:
        """Whether one step's budget always schedules every running decode."""
        return num_decodes <= self.options.max_num_batched_tokens

    def _may_admit_during_stretch(self) -> bool:
        """Whether the waiting head might be admitted while the batch decodes (conservative).

        Running count and free blocks cannot grow during a stretch, so a head blocked by either
        now stays blocked until the stretch's last step.
        """
        if len(self.running) >= self.options.max_num_seqs:
            return False
        if self.bm.enable_prefix_caching:
            return True
        head = self.waiting[0]
        if self.options.admission == "reserve":
            need = self.bm.blocks_for(head.num_final_positions)
        else:
            need = self.bm.blocks_for(min(head.num_tokens, self._first_chunk_limit(len(self.running))))
        return need <= 0 or self.bm.can_allocate(need, reserve=self.num_watermark_blocks())

    def _first_chunk_limit(self, num_decodes: int) -> int:
        return self.options.max_num_batched_tokens

    def _after_decode_steps(self) -> None:
        """Policy state a run of decode-only steps changes (e.g. alternating order)."""

    def stretch_blocks_added(self, stretch: Stretch, num_steps: int) -> list[int]:
        """Blocks in use beyond today's after each of the stretch's first `num_steps` steps."""
        added = self.bm.blocks_used_after_decode_steps(stretch.decode_ids, num_steps, stretch.decode_firsts)
        if stretch.prefill is not None:
            rid = stretch.prefill.request_id
            added = [a + self.bm.num_new_blocks_needed(rid, (j + 1) * stretch.chunk) for j, a in enumerate(added)]
        return added

    def apply_stretch(self, stretch: Stretch, step_ends: list[float]) -> list[Request]:
        """Complete the stretch's first len(step_ends) steps at once; returns finished requests."""
        num_steps = len(step_ends)
        running = stretch.decoders
        self.bm.append_decode_steps(stretch.decode_ids, num_steps, stretch.decode_firsts)
        delivery = self.options.delivery_s
        times = [end + delivery for end in step_ends] if delivery else step_ends
        first, last = times[0], times[-1]
        if running:
            self.itl.add_gaps([first - t for t in map(last_token_of, running)])
            self.itl.add_run(list(map(sub, times[1:], times[:-1])), len(running))
        if self.bm.enable_prefix_caching:
            for request in running:
                before = request.num_processed
                request.num_processed = before + num_steps
                request.num_outputs += num_steps
                request.last_token_s = last
                self._register_full_blocks(request, before)
        else:
            for request in running:
                request.num_processed += num_steps
                request.num_outputs += num_steps
                request.last_token_s = last
        done = []
        if running and num_steps >= stretch.steps_to_finish:
            done = [r for r in running if r.num_outputs >= r.num_target_outputs]
        self.num_resident_tokens += num_steps * len(running)
        if stretch.prefill is not None:
            processed = num_steps * stretch.chunk
            self.bm.append(stretch.prefill.request_id, processed)
            stretch.prefill.num_processed += processed
            self.num_resident_tokens += processed
        self.num_steps += num_steps
        self._after_decode_steps()
        for request in done:
            self._finish(request, last)
        return done
