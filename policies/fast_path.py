"""The fast path's policy side: which run of steps is certain to come next, and taking it at once.

Mixed into `BasePolicy`; it reads the policy's queues, options and block manager. A stretch reads
the batch in a handful of list comprehensions and a few calls, whatever its length. (Comprehensions,
not `map` over an `attrgetter`: Python 3.11 reads a slot attribute in one two to three times as
fast as an attrgetter, which looks it up by name each call; measured on batches of 8 to 128.)
"""

from __future__ import annotations

from bisect import bisect_left
from operator import sub
from typing import Any

from policies.stretch import DecoderCarry, Stretch
from simcore.decode_blocks import after_storing, after_storing_each, blocks_taken_by, max_steps_within
from simcore.request import Request
from simcore.run_counts import RunCounts

# Decoders a run must have had for what it leaves past finishes to be carried to the next plan
# (see `StretchMixin._survivors_after`).
MIN_BATCH_CARRIED_PAST_FINISHES = 64


def request_ids(requests: list[Request]) -> list[int]:
    return [request.request_id for request in requests]


def total_context(requests: list[Request]) -> int:
    """Positions the requests have processed, all together."""
    return sum([request.num_processed for request in requests])


def steps_left(requests: list[Request], after: int = 0) -> list[int]:
    """Steps (one output each) until each of `requests` has all its outputs (`_num_target`:
    num_target_outputs without the property call), counted from `after` steps from now."""
    return [request._num_target - request.num_outputs - after for request in requests]


def steps_to_first_finish(requests: list[Request]) -> int:
    """Steps (one output each) until the first of `requests` has all its outputs."""
    return min(steps_left(requests))


class StretchMixin:
    # Provided by BasePolicy.
    running: list[Request]
    options: Any
    bm: Any
    itl: Any
    num_steps: int
    num_resident_tokens: int
    waiting: Any
    swapped: Any
    host: Any
    _select_output: Any
    _admit: Any
    _num_known_decoding: int
    _preempted_at: dict[int, tuple[float, int, str]]
    _note_resumed: Any
    _decode_victims: Any
    _can_swap_in: Any
    _take_off_running: Any
    _drop_for_recompute: Any
    _now: float
    # Set by the engine: nothing outside the policy needs a run to stop at a finish.
    run_past_finishes: bool = False
    # What the last run left of its decoders (see `_carried`); dropped by anything else that
    # changes the batch (`schedule`, finishes).
    _carry: DecoderCarry | None

    def plan_stretch(self) -> Stretch | None:
        """The run of decode-only steps of the whole running batch that is certain to come next.

        While no request is admitted, needs a block it cannot get, or is preempted, and none
        arrives that could be admitted, each step processes one token for every running
        request, so the steps can be taken at once (`apply_stretch`) with results identical
        to stepping one by one. None when the
        next step is not of that kind. The run ends at the first finish, or, when the engine
        allows it (`run_past_finishes`) and nothing waits that a freed slot or block could
        admit, goes on without the finished requests. Arrivals are the engine's to bound,
        unless a queue waits already (see `Stretch.arrivals_wait`).
        """
        running = self.running
        # The newest request is the one most likely still prefilling: look there first.
        if not running or running[-1].is_prefilling:
            return None
        if not self._decodes_all_fit(len(running)):
            return None
        swapped = bool(self.swapped)
        if swapped and (self.bm.tracks_block_ids or self._may_swap_in_during_stretch()):
            return None
        # While a request is swapped out, none is admitted (it comes back first). Where a step's
        # decodes take their new blocks before admission asks for the head's, a head that fits
        # now may not fit after them: that is decided once their first step's blocks are known.
        may_admit = bool(self.waiting) and not swapped and self._may_admit_during_stretch()
        if may_admit and not self._admits_after_decodes():
            return None
        carry = self._carried(running)
        remaining: list[int] | None = None
        if carry is not None:
            ids, context, to_finish = carry.ids, carry.context, carry.steps_to_finish
        else:
            # Each column read once: what the decoding check needs, the stretch needs too.
            outputs = [request.num_outputs for request in running]
            context = total_context(running)
            if len(running) > self._num_known_decoding and not self._all_decoding(running, outputs, context):
                return None
            ids = request_ids(running)
            remaining = steps_left(running)
            to_finish = min(remaining)
        firsts = self.bm.first_new_block_steps(ids)
        if may_admit and self._may_admit_during_stretch(firsts.count(1)):  # a first of 1: a block in step 1
            return None
        # A finish frees blocks and a seat that a swapped-out request may take: not past one then.
        if self.run_past_finishes and not self.waiting and not swapped and self.can_run_past_finishes():
            if remaining is None:  # read from the carry: its own, when it knew them
                remaining = self._steps_left(running, carry)
            # Blocks are counted as if finished requests kept growing: never more than stepping needs.
            num_steps = self.bm.max_decode_steps(ids, max(remaining), firsts)
        else:
            num_steps, remaining = self.bm.max_decode_steps(ids, to_finish, firsts), None
        if num_steps < 1:  # too few blocks for the next step's decodes
            if not self.can_preempt_in_stretch():
                return None
            num_kept, victims = self._decode_victims(running, firsts)
            return self._preempting_step(running, ids, firsts, context, to_finish, num_kept, victims)
        # A queue that waits now waits behind a head the run cannot admit, or a swapped-out
        # request that comes back first (checked above).
        return Stretch(num_steps, list(running), ids, firsts, context, to_finish, remaining=remaining,
                       arrivals_wait=bool(self.waiting) or swapped)

    def _preempting_step(self, decoders: list[Request], ids: list[int], firsts: list[int], context: int,
                         to_finish: int | None, num_kept: int, victims: list[Request]) -> Stretch | None:
        """The step that preempts `victims` (the newest running requests, in the order they go)
        and decodes the first `num_kept` of `decoders` (the oldest, every one decoding; their
        ids, next new-block steps, total context and steps to the first finish, when known), as
        a stretch of one step: a step that preempts admits nothing. None where it preempts
        nothing or decodes nothing (stepping then plans again with the room made)."""
        # The seats test mirrors `_schedule_decodes`, which preempts on counts only where every
        # decode fits the step's budget (the running batch never exceeds the seats).
        if not victims or not num_kept or len(decoders) > self.options.max_num_seqs:
            return None
        if num_kept < len(decoders):
            decoders, ids, firsts = decoders[:num_kept], ids[:num_kept], firsts[:num_kept]
            context, to_finish = total_context(decoders), None
        if to_finish is None:
            to_finish = steps_to_first_finish(decoders)
        return Stretch(1, list(decoders), ids, firsts, context, to_finish, victims=victims)

    def can_preempt_in_stretch(self) -> bool:
        """Whether a step short of blocks preempts as `_decode_victims` works it out, for
        recompute: where block ids carry no meaning and no host tier takes swaps."""
        return not self.bm.tracks_block_ids and self.host is None

    def _decoder_columns(self, decoders: list[Request],
                         carry: DecoderCarry | None) -> tuple[list[int], int, int | None] | None:
        """The ids, total context and steps to the first finish (None: not read) of `decoders`,
        a prefix of the running batch: from `carry` (`_carried(decoders)`) when there is one,
        else read, once every one of them is known to decode. None where some does not."""
        if carry is not None:
            return carry.ids, carry.context, carry.steps_to_finish
        if len(decoders) > self._num_known_decoding and not self._all_decoding(decoders):
            return None
        return request_ids(decoders), total_context(decoders), None

    def _carried(self, decoders: list[Request]) -> DecoderCarry | None:
        """What the last run left of `decoders` (a prefix of the running batch), when they are
        the requests it advanced. Since that run, the batch has changed only by admissions,
        which append to it (anything else drops the carry): so a prefix of the same length is
        the same requests, and the last one is compared only to be safe."""
        carry = self._carry
        if carry is None or len(carry.ids) != len(decoders) or not decoders or carry.requests[-1] is not decoders[-1]:
            return None
        return carry

    def _decoders_after(self, stretch: Stretch, num_steps: int, completes: bool) -> DecoderCarry | None:
        """What the first `num_steps` steps of `stretch` leave for the next plan (see
        `DecoderCarry`), when none of its requests finished: its decoders, and its prompt if
        completed. None when there are none."""
        n = len(stretch.decoders)
        prompt = stretch.prefill if completes else None
        if prompt is None:
            if not n:
                return None
            return DecoderCarry(stretch.decoders, stretch.decode_ids, stretch.decode_context + num_steps * n,
                                stretch.steps_to_finish - num_steps, stretch.remaining, num_steps)
        # The prompt now decodes after them. It always comes next in the batch (it was admitted
        # after them); checked only so that a future kind of run cannot make a carry that is
        # not a prefix of the batch.
        if self.running[n] is not prompt:
            return None
        to_finish = prompt.num_target_outputs - prompt.num_outputs
        if n:
            to_finish = min(to_finish, stretch.steps_to_finish - num_steps)
        return DecoderCarry([*stretch.decoders, prompt], [*stretch.decode_ids, prompt.request_id],
                            stretch.decode_context + num_steps * n + prompt.num_processed, to_finish)

    def _survivors_after(self, stretch: Stretch, num_steps: int, completes: bool, num_done: int) -> DecoderCarry | None:
        """`_decoders_after` for a run in which `num_done` requests finished: its decoders that
        did not (and its prompt if completed), where the run knew each one's steps left (it ran
        past finishes) and every request that finished was one of them. Under load the batch
        is large and a run ends past some finish more often than not: the next plan need not
        read the batch again. None otherwise, and for a small batch: a few C-level passes read
        one of under `MIN_BATCH_CARRIED_PAST_FINISHES` decoders again for less than working out
        what left (measured: 2.5% slower on the 10k reference run under continuous batching,
        whose batches after a finish are mostly under 48; 1.5% faster under chunked prefill at
        twice the rate, where they are 64 to 100)."""
        remaining = stretch.remaining
        if remaining is None or len(remaining) < MIN_BATCH_CARRIED_PAST_FINISHES:
            return None
        requests, ids, left = list(stretch.decoders), list(stretch.decode_ids), list(remaining)
        # Every decoder was advanced num_steps; those that left, less the steps they did not
        # take (set back). Copies less the few that left: under load the batch is large and few
        # leave in a run.
        context = stretch.decode_context + num_steps * len(requests)
        if stretch.has_departures(num_steps):
            # The first in finish order, when every request that finished was one of them (the
            # last test cannot fail, as `done` holds every decoder that finished: a safety net).
            departures = stretch.departures()
            gone = departures[:num_done]
            if len(gone) < num_done or gone[-1][0] > num_steps or \
                    (len(departures) > num_done and departures[num_done][0] <= num_steps):
                return None  # the prompt finished too (its first output was its last)
            leaving = sorted([(index, num_steps - finish_step) for finish_step, index, _ in gone], reverse=True)
        else:  # every one that left finished in the last step
            if left.count(num_steps) != num_done:
                return None  # the prompt finished too
            index, leaving = -1, []
            for _ in range(num_done):
                index = left.index(num_steps, index + 1)
                leaving.append((index, 0))
            leaving.reverse()
        for index, back in leaving:  # from the back, so that each index still holds
            context -= requests[index].num_processed + back
            del requests[index], ids[index], left[index]
        if completes:
            # The prompt decodes after them (it comes next in the batch: see _decoders_after).
            prompt = stretch.prefill
            assert prompt is not None
            if self.running[len(stretch.decoders)] is not prompt:
                return None
            requests.append(prompt)
            ids.append(prompt.request_id)
            left.append(prompt.num_target_outputs - prompt.num_outputs + num_steps)
            context += prompt.num_processed
        if not requests:
            return None
        return DecoderCarry(requests, ids, context, min(left) - num_steps, left, num_steps)

    @staticmethod
    def _steps_left(decoders: list[Request], carry: DecoderCarry | None) -> list[int]:
        """Each decoder's steps until its last output: the carry's, when it knew them (it is
        `_carried(decoders)`), else read from the requests."""
        return (carry.steps_left() if carry is not None else None) or steps_left(decoders)

    def can_run_past_finishes(self) -> bool:
        """Whether a finish changes nothing for the requests still running but the batch size:
        true where freed blocks are mere counts (no ids, no cache) and the policy releases them
        at once. (Runs past finishes are planned only while nothing is swapped out, and none
        swaps a request out.)"""
        return not self.bm.tracks_block_ids

    def _all_decoding(self, requests: list[Request], outputs: list[int] | None = None,
                      num_processed: int | None = None) -> bool:
        """Whether each request has its prompt done and exactly its newest output to process.
        `outputs` (their output counts) and `num_processed` (their processed total) when the
        caller has them."""
        if not requests:
            return True
        if self._preempted_at and not self._preempted_at.keys().isdisjoint(request_ids(requests)):
            return False
        if outputs is None:
            outputs = [request.num_outputs for request in requests]
        if min(outputs) == 0:
            return False
        if num_processed is None:
            num_processed = total_context(requests)
        # A running request always has at least one position pending (checked by `check`), so
        # all have exactly one when the pending positions add up to one each.
        return sum([request.prompt_len for request in requests]) + sum(outputs) - num_processed == len(requests)

    def _decodes_all_fit(self, num_decodes: int) -> bool:
        """Whether one step's budget always schedules every running decode."""
        return num_decodes <= self.options.max_num_batched_tokens

    def _may_admit_during_stretch(self, decode_blocks: int = 0) -> bool:
        """Whether the waiting head might be admitted while the batch decodes (conservative),
        where a step's decodes first take `decode_blocks` new blocks (those of the run's first
        step; 0 where admission comes first, or they are not known yet).

        Running count and free blocks cannot grow during a stretch, so a head blocked by either
        in its first step stays blocked until its last (later steps' decodes take more blocks).
        """
        if len(self.running) >= self.options.max_num_seqs:
            return False
        if self.bm.enable_prefix_caching:
            return True
        head = self.waiting[0]
        need = self._blocks_to_admit(head, min(head.num_tokens, self._first_chunk_limit(len(self.running))))
        return need <= 0 or self.bm.can_allocate(need + decode_blocks, reserve=self.num_watermark_blocks())

    def _admits_after_decodes(self) -> bool:
        """Whether a step schedules every running decode, with its new blocks, before it admits
        a waiting request (stall-free chunked prefill, mixed continuous batching)."""
        return False

    def _may_swap_in_during_stretch(self) -> bool:
        """Whether the first swapped-out request might come back while the batch decodes, as
        `_resume_swapped` takes it after the decodes (conservative). The seats, the budget the
        decodes leave and the free blocks cannot grow during a stretch that ends at its first
        finish, so a request blocked by any of them now stays blocked to its last step."""
        num_running = len(self.running)
        if num_running >= self.options.max_num_seqs:
            return False
        return self._can_swap_in(self.swapped[0], self.options.max_num_batched_tokens - num_running)

    def _first_chunk_limit(self, num_decodes: int) -> int:
        return self.options.max_num_batched_tokens

    def _after_decode_steps(self) -> None:
        """Policy state a run of decode-only steps changes (e.g. alternating order)."""

    def _decodes_after_prompt(self, stretch: Stretch, pending: int, queue: bool = False) -> Stretch | None:
        """The decode-only stretch that follows one whose last step completes its prompt (the
        tail, `pending` positions from now): that request now decodes beside the stretch's
        decoders that did not finish in it (where it runs past finishes). Planned from the state
        the stretch leaves; with `queue`, behind a queue held back to the first finish (`_decodes_joined`)."""
        num_steps, prompt = stretch.num_steps, stretch.prefill
        assert prompt is not None
        decoders, ids = stretch.decoders, stretch.decode_ids
        # Blocks as if the decoders that finish kept theirs: fewer free than stepping would have.
        taken, firsts, prompt_first = self._blocks_after(stretch, pending)
        if stretch.remaining is not None:
            remaining = [left - num_steps for left in stretch.remaining]
        else:
            remaining = steps_left(decoders, after=num_steps)
        contexts = [request.num_processed + num_steps for request in decoders]
        if stretch.steps_to_finish <= num_steps:  # some finished: the others go on
            stay = [index for index, left in enumerate(remaining) if left > 0]
            decoders, ids, firsts, remaining, contexts = (
                [column[index] for index in stay] for column in (decoders, ids, firsts, remaining, contexts))
        firsts.append(prompt_first)
        remaining.append(prompt.num_target_outputs - prompt.num_outputs - 1)  # its output in the tail's step
        contexts.append(prompt.num_processed + pending)
        then = self._decodes_joined([*decoders, prompt], [*ids, prompt.request_id], firsts, remaining,
                                    contexts, self.bm.num_free_blocks - taken, queue)
        if then is not None:
            # Every decoder of the stretch goes on (none finished in it), the prompt after them,
            # and its first output was a first token: `apply_joined` can take both at once.
            then.joins = stretch.steps_to_finish > num_steps and stretch.remaining is None and \
                prompt.num_outputs == 0 and stretch.newcomer is None and not stretch.victims and \
                not stretch.readmits and not (self._preempted_at and prompt.request_id in self._preempted_at)
        return then

    def _decodes_joined(self, decoders: list[Request], ids: list[int], firsts: list[int], remaining: list[int],
                        contexts: list[int], num_free: int, queue: bool = False) -> Stretch | None:
        """The decode-only stretch of `decoders` that follows a part which brought the last of
        them into the batch, planned from what that part leaves: their next new-block steps,
        steps to their last outputs and contexts, and the blocks free. With `queue`, requests
        wait that none of its steps can admit before the first finish (the caller's check: every
        seat taken, or, mixed, a head that the budget or the blocks keep out): it ends there, and
        lets arrivals wait."""
        to_finish = min(remaining)
        past = not queue and self.run_past_finishes and self.can_run_past_finishes()
        limit = max_steps_within(firsts, self.bm.block_size, num_free, max(remaining) if past else to_finish)
        if limit < 1 or not self._decodes_all_fit(len(firsts)):
            return None
        return Stretch(limit, decoders, ids, firsts, sum(contexts), to_finish, remaining=remaining if past else None,
                       decode_contexts=contexts, arrivals_wait=queue)

    def _blocks_after(self, stretch: Stretch, pending: int) -> tuple[int, list[int], int]:
        """What a prefill stretch's steps, and its prompt's `pending` positions, leave to the block
        manager: blocks taken, then each decoder's and the prompt's next new-block step."""
        taken, firsts = after_storing_each(stretch.decode_firsts, stretch.num_steps, self.bm.block_size)
        prompt_taken, prompt_after = self._prompt_blocks_after(stretch, pending)
        return taken + prompt_taken, firsts, prompt_after

    def _prompt_blocks_after(self, stretch: Stretch, pending: int) -> tuple[int, int]:
        """Blocks a prefill stretch's prompt takes for its `pending` positions, and its next
        new-block step then."""
        prompt = stretch.prefill
        assert prompt is not None
        if stretch.admits:  # admitted by the stretch: it holds the blocks admission gives it
            return self._blocks_on_admission(prompt, pending)
        return after_storing(self.bm.first_new_block_step_of(prompt.request_id), pending, self.bm.block_size)

    def _blocks_on_admission(self, request: Request, num_positions: int) -> tuple[int, int]:
        """Blocks a request admitted now holds once its first `num_positions` positions are
        stored (those admission reserves up front, and any more they need), and its next
        new-block step then."""
        bs = self.bm.block_size
        reserved = self.bm.blocks_for(self._admission_reserve(request))
        need, first = after_storing(reserved * bs + 1, num_positions, bs)
        return reserved + need, first

    def _blocks_to_admit(self, request: Request, num_positions: int) -> int:
        """Blocks admission must find free to admit a waiting request with its first
        `num_positions` positions (reserve admission: blocks for every position it will hold)."""
        return self.bm.blocks_for(self._admission_reserve(request) or num_positions)

    def _admission_reserve(self, request: Request) -> int:
        """Positions admission allocates blocks for up front (reserve admission: all of them)."""
        return request.num_final_positions if self.options.admission == "reserve" else 0

    def begin_stretch(self, stretch: Stretch, now: float) -> None:
        """What a stretch's first step does before any position is processed (at `now`, its
        start): preempt its victims, admit its prompt from the queue, as the step would (see
        `Stretch.admits`), and its newcomers when that step is its last (later, `apply_stretch`
        admits them)."""
        if stretch.victims:
            # For recompute only: `can_preempt_in_stretch` rules out a host tier, so `_preempt`
            # would do the same, less the step plan it appends to.
            self._now = now  # the preemption's time, as `schedule` notes it
            for victim in stretch.victims:
                self._take_off_running(victim)
                self._drop_for_recompute(victim)
        if stretch.admits:
            assert stretch.prefill is not None
            self._admit(stretch.prefill, now, self._admission_reserve(stretch.prefill))
        if stretch.newcomer is not None and stretch.num_steps == 1:
            self._admit_newcomers(stretch, now)

    def _admit_newcomers(self, stretch: Stretch, now: float) -> None:
        """Admit the requests the stretch's last step admits, in queue order (at `now`)."""
        for request in stretch.newcomers:
            self._admit(request, now, self._admission_reserve(request))

    def stretch_run_counts(self, stretch: Stretch, num_steps: int) -> RunCounts:
        """What the step records of the stretch's first `num_steps` steps derive their counts
        from (decoders, running requests, blocks in use, resident tokens), read before
        `apply_stretch`; the engine adds the state after the last step."""
        departures = []
        if stretch.has_departures(num_steps):
            # Some decoders finish before the last step and release everything they hold.
            held, ids = self.bm.num_table_blocks, stretch.decode_ids
            for finish_step, index, context in stretch.departures():
                if finish_step >= num_steps:
                    break  # in finish order: the rest stay to the last step
                departures.append((finish_step, index, context, held[ids[index]]))
        prompt = stretch.prefill
        newcomer = stretch.admits_newcomer(num_steps)
        completes = stretch.reaches_tail(num_steps)
        return RunCounts(num_steps, self.bm.block_size, len(self.running), self.bm.num_used_blocks,
                         self.num_resident_tokens, stretch.decode_firsts, departures, stretch.chunk,
                         self.bm.first_new_block_step_of(prompt.request_id) if prompt is not None else 0,
                         prompt is not None, completes,
                         stretch.num_newcomers if newcomer else 0,
                         stretch.num_newcomers_selecting if newcomer else 0, stretch.chunk_cap,
                         stretch.tail if completes else 0, stretch.newcomer_positions if newcomer else 0)

    def apply_stretch(self, stretch: Stretch, step_ends: list[float]) -> list[Request]:
        """Complete the stretch's first len(step_ends) steps at once; returns finished requests."""
        num_steps = len(step_ends)
        running = stretch.decoders
        if not running and stretch.prefill is None:
            return self._apply_admission_step(stretch, step_ends)
        if stretch.readmits:
            return self._apply_readmits(stretch, step_ends)
        delivery = self.options.delivery_s
        times = [end + delivery for end in step_ends] if delivery else step_ends
        first, last = times[0], times[-1]
        departures = stretch.has_departures(num_steps)
        if running:
            self._add_run_first_gaps(running, first)
            self._add_later_gaps(stretch, times, departures)
        # Every decoder is advanced all the steps; one that finishes earlier is set back below.
        # The blocks it is grown for the steps it does not take go back with the rest when it
        # finishes (departures happen only where blocks are counts), and the plan counted them.
        prefill = stretch.prefill
        if running:  # a step that admits a request alone decodes none
            # The prompt holds blocks and does not decode, nor do the newcomers that the first
            # step admitted (the block counter then advances the whole batch at once).
            others = () if prefill is None else (prefill.request_id,)
            if stretch.newcomer is not None and stretch.num_steps == 1:  # as begin_stretch admits them
                others = (*others, *[request.request_id for request in stretch.newcomers])
            self.bm.append_decode_steps(stretch.decode_ids, num_steps, stretch.decode_firsts, others)
        if self.bm.enable_prefix_caching:
            for request in running:
                before = request.num_processed
                request.num_processed = before + num_steps
                request.num_outputs += num_steps
                request.last_token_s = last
                self._register_full_blocks(request, before)
            self.num_resident_tokens += num_steps * len(running)
        else:
            self._advance_decoders(running, num_steps, last)
        done = []
        if departures:
            done = self._settle_departures(stretch, times)
        elif running and num_steps >= stretch.steps_to_finish:
            done = [request for request in running if request.num_outputs >= request._num_target]
        completes = False
        if prefill is not None:
            completes = stretch.reaches_tail(num_steps)
            # A run that completes the prompt processes all it has pending (its chunks, where
            # they grow at finishes, are summed only for a run cut before).
            processed = prefill.num_pending if completes else stretch.prompt_positions(num_steps)
            self.bm.append(prefill.request_id, processed)
            prefill.num_processed += processed
            self.num_resident_tokens += processed
            if self._preempted_at and prefill.request_id in self._preempted_at:
                self._resumed_in(stretch, num_steps, step_ends)
            if completes:
                gaps = []
                self._select_output(prefill, step_ends[-1], gaps)
                if gaps:
                    self.itl.add_gaps(gaps)
                if prefill.is_finished:
                    done.append(prefill)
        # Every running request is in the stretch, and all but its prompts decoded before it.
        still_prefilling = prefill if prefill is not None and not completes else None
        newcomer = stretch.newcomer if stretch.admits_newcomer(num_steps) else None
        if newcomer is not None:
            if num_steps > 1:  # admitted by the last step, after the others (not by begin_stretch)
                self._admit_newcomers(stretch, step_ends[-2])
            end = step_ends[-1]
            for request, chunk in zip(stretch.whole_newcomers, stretch.whole_chunks):
                self._apply_first_chunk(request, chunk, end, done)
            if self._apply_first_chunk(newcomer, stretch.newcomer_chunk, end, done):
                still_prefilling = newcomer
        self.num_steps += num_steps
        self._after_decode_steps()
        # A request that decodes from this run's end on without being among its decoders (a
        # newcomer whose whole prompt ran) is not in the carry: none then.
        if newcomer is not None and (still_prefilling is not newcomer or stretch.whole_newcomers):
            self._carry = None
        else:
            self._leave_carry(stretch, num_steps, completes, done, last)
        return self._retire(done, still_prefilling)

    def _advance_decoders(self, decoders: list[Request], num_steps: int, last: float) -> None:
        """`num_steps` more decode steps for each of `decoders`, their last output at `last`
        (without a prefix cache: `apply_stretch` registers full blocks where there is one)."""
        for request in decoders:
            request.num_processed += num_steps
            request.num_outputs += num_steps
            request.last_token_s = last
        self.num_resident_tokens += num_steps * len(decoders)

    def _leave_carry(self, stretch: Stretch, num_steps: int, completes: bool, done: list[Request],
                     last: float) -> None:
        """What the first `num_steps` steps of `stretch` (its prompt completed, where `completes`;
        `done` finished) leave for the next plan (see `DecoderCarry`)."""
        if done:
            carry = self._survivors_after(stretch, num_steps, completes, len(done))
        else:
            carry = self._decoders_after(stretch, num_steps, completes)
        if carry is not None:  # its decoders decoded in the last step, and a completed prompt selected there
            carry.last_token_s = last
        self._carry = carry

    def _add_run_first_gaps(self, decoders: list[Request], first: float) -> None:
        """The gaps before the decoders' outputs in a run's first step (ending at `first`)."""
        carry = self._carry
        if carry is not None and carry.last_token_s is not None and self._carried(decoders) is carry:
            # What the last run left, each with its output in that run's last step: one gap.
            self.itl.add(first - carry.last_token_s, len(decoders))
        else:
            self._add_first_gaps(decoders, first)

    def _add_later_gaps(self, stretch: Stretch, times: list[float], departures: bool) -> None:
        """The decoders' gaps between the successive steps of a run of `stretch` (their output
        times, with delivery), where some finish before its last (`departures`) or none do."""
        gaps = list(map(sub, times[1:], times[:-1]))
        if departures:
            counts = _decoders_per_gap(stretch, len(times))
            if not counts[-1]:  # a prompt's chunks went on after every decoder finished
                none_left = counts.index(0)
                del gaps[none_left:], counts[none_left:]
            self.itl.add_weighted(gaps, counts)
        elif gaps:  # none in a run of one step
            self.itl.add_run(gaps, len(stretch.decoders))

    def apply_joined(self, stretch: Stretch, then: Stretch, step_ends: list[float]) -> list[Request]:
        """`apply_stretch` for a stretch whose last step completes its prompt and some steps of
        the decodes after it (`then`, which `joins` it), with what both would do, in one pass
        over the decoders: `len(step_ends)` steps, more than the stretch's own. Returns the
        finished requests."""
        num_first, num_steps = stretch.num_steps, len(step_ends)
        num_then = num_steps - num_first
        decoders, prompt = stretch.decoders, stretch.prefill
        assert then.joins and num_then > 0 and prompt is not None and then.decoders[-1] is prompt
        delivery = self.options.delivery_s
        times = [end + delivery for end in step_ends] if delivery else step_ends
        last = times[-1]
        # The gaps in the order the two parts add them: the decoders' over the stretch, then,
        # at the step after the prompt's first output, theirs and its own (all alike: each
        # output in the stretch's last step), then the decodes'.
        if decoders:
            self._add_run_first_gaps(decoders, times[0])
            self._add_later_gaps(stretch, times[:num_first], False)
            self.bm.append_decode_steps(stretch.decode_ids, num_steps, stretch.decode_firsts, (prompt.request_id,))
            self._advance_decoders(decoders, num_steps, last)  # no prefix cache where stretches have prompts
        positions = prompt.num_pending  # all of it: its last chunk is in the stretch (as joined_run_counts)
        self.bm.append(prompt.request_id, positions + num_then)
        prompt.num_processed += positions
        gaps: list[float] = []
        self._select_output(prompt, step_ends[num_first - 1], gaps)
        if gaps:
            self.itl.add_gaps(gaps)
        self.num_resident_tokens += positions
        self._advance_decoders([prompt], num_then, last)
        self.itl.add(times[num_first] - times[num_first - 1], len(then.decoders))
        departures = then.has_departures(num_then)
        self._add_later_gaps(then, times[num_first:], departures)
        if departures:
            done = self._settle_departures(then, times[num_first:])
        elif num_then >= then.steps_to_finish:
            done = [request for request in then.decoders if request.num_outputs >= request._num_target]
        else:
            done = []
        self.num_steps += num_steps
        self._after_decode_steps()
        self._leave_carry(then, num_then, False, done, last)
        return self._retire(done, None)

    def joined_run_counts(self, stretch: Stretch, then: Stretch, num_then: int) -> tuple[RunCounts, RunCounts]:
        """`stretch_run_counts` for `apply_joined`'s steps: the stretch's, whose state after its
        last step is worked out here (its decoders' new blocks and its prompt's), and the first
        `num_then` of `then`, from that state."""
        num_first, bm = stretch.num_steps, self.bm
        prompt = stretch.prefill
        assert prompt is not None
        first = self.stretch_run_counts(stretch, num_first)
        positions = prompt.num_pending  # all of it: its last chunk is in the stretch
        prompt_blocks = bm.num_new_blocks_needed(prompt.request_id, positions)
        bs, firsts = bm.block_size, stretch.decode_firsts
        first.last = (first.running, first.blocks + blocks_taken_by(firsts, num_first, bs) + prompt_blocks,
                      first.resident + num_first * len(firsts) + positions)
        departures = []
        if then.has_departures(num_then):
            # Blocks each one that leaves holds when `then` starts: before the stretch, and those
            # it took in the stretch's steps.
            held, ids, num_decoders = bm.num_table_blocks, then.decode_ids, len(firsts)
            for finish_step, index, context in then.departures():
                if finish_step >= num_then:
                    break
                taken = after_storing(firsts[index], num_first, bs)[0] if index < num_decoders else prompt_blocks
                departures.append((finish_step, index, context, held[ids[index]] + taken))
        return first, RunCounts(num_then, bs, first.running, first.last[1], first.last[2], then.decode_firsts,
                                departures)

    def _add_first_gaps(self, decoders: list[Request], first: float) -> None:
        """The gaps before the outputs of a run's first step (ending at `first`), read from the
        decoders' last output times: add_gaps' entries, without its passes where all but the
        newest are alike."""
        lasts = [request.last_token_s for request in decoders]
        num_alike = lasts.count(lasts[0])
        if num_alike == len(lasts):  # each decoded in the same step (the usual case)
            self.itl.add(first - lasts[0], num_alike)
        elif num_alike == len(lasts) - 1 and lasts[-1] != lasts[0]:
            # All but the newest, admitted by the step before (a run that follows an
            # admission): add_gaps' entries, without its passes.
            self.itl.add_two(first - lasts[0], num_alike, first - lasts[-1])
        else:
            self.itl.add_gaps([first - t for t in lasts])

    def _resumed_in(self, stretch: Stretch, num_steps: int, step_ends: list[float]) -> None:
        """The prompt of a stretch that was preempted: once a step brings it back where it was,
        the time since is charged at that step's end (as `complete` does each step)."""
        prompt = stretch.prefill
        assert prompt is not None
        target = self._preempted_at[prompt.request_id][1]
        before = prompt.num_processed - stretch.prompt_positions(num_steps)
        # The first of the steps whose chunks, added up, reach it (prompt_positions grows).
        step = bisect_left(range(1, num_steps + 1), target - before, key=stretch.prompt_positions)
        if step < num_steps:
            self._note_resumed(prompt, step_ends[step])

    def _apply_admission_step(self, stretch: Stretch, step_ends: list[float]) -> list[Request]:
        """apply_stretch for a step that only admits its newcomer (continuous batching's
        prefill-only step): no decodes, no prompt chunk, nothing for the next plan to carry."""
        done: list[Request] = []
        newcomer = stretch.newcomer
        assert newcomer is not None and not stretch.whole_newcomers
        still_prefilling = newcomer if self._apply_first_chunk(newcomer, stretch.newcomer_chunk, step_ends[-1],
                                                                done) else None
        self.num_steps += len(step_ends)
        self._after_decode_steps()
        self._carry = None
        return self._retire(done, still_prefilling)

    def _apply_first_chunk(self, newcomer: Request, chunk: int, end: float, done: list[Request]) -> bool:
        """A newcomer's first `chunk` positions, run in the stretch's last step (ending at `end`;
        admitted by then), and its first output when that chunk is its whole prompt (a finished
        request goes to `done`). Returns whether it is still prefilling. (No prefix-cache blocks
        to register: stretches with a newcomer are planned only without a prefix cache.) A
        recompute, back after a preemption, may be back where it was by then, and its output
        after the ones it had is a gap."""
        self.bm.append(newcomer.request_id, chunk)
        newcomer.num_processed += chunk
        self.num_resident_tokens += chunk
        if self._preempted_at and newcomer.request_id in self._preempted_at:
            self._note_resumed(newcomer, end)
        if newcomer.num_processed != newcomer.num_tokens:
            return True
        gaps: list[float] = []
        self._select_output(newcomer, end, gaps)
        if gaps:
            self.itl.add_gaps(gaps)
        if newcomer.is_finished:
            done.append(newcomer)
        return False

    def _retire(self, done: list[Request], still_prefilling: Request | None) -> list[Request]:
        """The end of applying a stretch: its finished requests leave, and the policy notes how
        many running requests decode (all but `still_prefilling`, the newest, if any)."""
        for request in done:
            self._finish(request, request.last_token_s)
        running_now = self.running
        if still_prefilling is None:
            self._num_known_decoding = len(running_now)
        else:  # the newest, admitted last
            self._num_known_decoding = len(running_now) - 1 if running_now[-1] is still_prefilling else 0
        return done

    def _settle_departures(self, stretch: Stretch, times: list[float]) -> list[Request]:
        """Set back the decoders that finished before the last of `times`' steps to where they
        stopped; returns every finished decoder in step order (batch order within a step), as
        stepping retires them."""
        num_steps = len(times)
        decoders = stretch.decoders
        done = []
        for finish_step, index, _ in stretch.departures():
            if finish_step > num_steps:
                break  # in finish order: the rest are still running
            request = decoders[index]
            back = num_steps - finish_step
            if back:
                request.num_processed -= back
                request.num_outputs -= back
                request.last_token_s = times[finish_step - 1]
                self.num_resident_tokens -= back
            done.append(request)
        return done


def _decoders_per_gap(stretch: Stretch, num_steps: int) -> list[int]:
    """For each gap between successive steps of a run with departures (the gap before step
    k + 1 of the first `num_steps`, from k = 1), the decoders in that step: those whose finish
    step is k + 1 or later."""
    counts: list[int] = []
    num_active, assigned = len(stretch.decoders), 0
    for finish_step, _, _ in stretch.departures():
        if finish_step >= num_steps:
            break  # in finish order: the rest decode in every step with a gap before it
        # The gaps before steps 2 .. finish_step have it; those after, not.
        if finish_step - 1 > assigned:
            counts.extend([num_active] * (finish_step - 1 - assigned))
            assigned = finish_step - 1
        num_active -= 1
    counts.extend([num_active] * (num_steps - 1 - assigned))
    return counts
