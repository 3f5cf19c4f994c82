"""Chunked prefill (Sarathi-Serve): a token budget per step, prompts split into chunks.

`order: stall_free` (default) fills each step with every running decode first, then the next
chunk of partially prefilled prompts, then new requests, so decodes never stall behind a long
prompt. `order: alternate` reproduces the seed's schedule instead: prefill chunk, decode the
active requests, prefill chunk, ... Later chunks continue the same request's positions.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Literal

from policies.base import BasePolicy
from policies.budget import StepBudget
from policies.fast_path import steps_left
from policies.stretch import Stretch
from simcore.decode_blocks import decode_blocks_fit
from simcore.request import Request, Status


class ChunkedPrefillPolicy(BasePolicy):
    name = "chunked_prefill"

    def __init__(self, *args, chunk_size: int = 512, order: Literal["stall_free", "alternate"] = "stall_free",
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.chunk_size = chunk_size
        self.order = order
        self._last_was_prefill = False

    def _fill(self, now: float) -> None:
        budget = StepBudget(self.options.max_num_batched_tokens, self.options.max_num_seqs)
        if self.order == "alternate":
            self._fill_alternate(budget, now)
            return
        # Those known to decode need no test (under memory pressure a schedule()d step has a
        # batch of ~80, and the test is a property call each).
        running = self.running
        known = self._decoding_before_step[0]
        decoding, prefilling = running[:known], []
        for request in running[known:] if known else running:
            (prefilling if request.is_prefilling else decoding).append(request)
        self._run_decodes(budget, decoding)
        if not self._plan.preempted:  # type: ignore[union-attr]
            self._resume_swapped(budget)
        self._run_prefill_chunks(budget, now, prefilling)

    def _fill_alternate(self, budget: StepBudget, now: float) -> None:
        has_decodes = any(not r.is_prefilling for r in self.running)
        if not (self._last_was_prefill and has_decodes):
            self._run_prefill_chunks(budget, now)
            if self._plan.num_seqs:  # type: ignore[union-attr]
                # Only a chunk that made decodes wait earns them the next step.
                self._last_was_prefill = has_decodes
                return
        self._run_decodes(budget)
        if not self._plan.preempted:  # type: ignore[union-attr]
            self._resume_swapped(budget)
        self._last_was_prefill = False

    def _run_decodes(self, budget: StepBudget, decoding: list[Request] | None = None) -> None:
        """Every running request that is not prefilling (given, or picked from the batch)."""
        if decoding is None:
            decoding = [r for r in self.running if not r.is_prefilling]
        # Not prefilling means exactly the newest output is pending: decoding, by definition.
        self._schedule_decodes(decoding, budget, all_decoding=True)

    def _run_prefill_chunks(self, budget: StepBudget, now: float, prefilling: list[Request] | None = None) -> None:
        """Next chunks of prompts in progress (given, or picked from the batch), then admissions."""
        if prefilling is None:
            prefilling = [r for r in self.running if r.is_prefilling]
        for request in prefilling:
            if budget.is_spent:
                return
            if request.status is Status.RUNNING and not self._is_scheduled(request):
                chunk = min(request.num_pending, self.chunk_size, budget.num_tokens)
                if self._schedule_running(request, chunk):
                    budget.take(chunk)
        if self.swapped or self._plan.preempted:  # type: ignore[union-attr]
            return
        admission = self._admission_budget(budget)
        while self.waiting and not admission.is_spent:
            taken = self._try_admit(self.waiting[0], admission, self.chunk_size, now)
            if taken == 0:
                return
            budget.take(taken)

    def plan_stretch(self) -> Stretch | None:
        """Decode-only stretches, and also steps of every decode beside one prompt's chunks.

        While one request (the newest) is prefilling, stall-free steps carry every decode plus
        a chunk of q = min(chunk_size, budget - decodes) of that prompt. Until its last chunk the
        shape is fixed, so those steps are certain too when nothing can be admitted beside them;
        with nothing waiting, so is the step of the last chunk (the stretch's `tail`), which
        selects the prompt's first output, and the decodes that follow with that request among
        them (`then`). When every running request decodes, the same holds from the step that
        admits the head of the queue (`admits`). Decoders may finish within such a run (where
        the engine allows it) when nothing waits, or when the step budget is at most a chunk
        (no step before the last chunk's has room for a waiting request): the batch shrinks
        and, where the chunk is the budget left beside the decodes, grows (`Stretch.chunk_cap`).
        Requests waiting for the last chunk's step join it while seats and budget are left, each
        but the last with its whole prompt (`whole_newcomers`), the last with its first chunk
        (`newcomer`); where none can (no budget left, or too few blocks for the queue's head),
        that step runs without them, and after a blocked head so do the decodes that follow.
        A recompute after a preemption runs as a first prefill, but for a last chunk of one
        position (a step counts it as a decode). Only where block ids carry no meaning (no
        prefix cache; a host tier only where blocks are counted) and nothing is swapped out."""
        if self.order != "stall_free" or self.swapped or self.bm.enable_prefix_caching or \
                (self.host is not None and self.bm.tracks_block_ids):
            return super().plan_stretch()
        # The decode-only planner comes last: while a prompt is in progress it plans nothing,
        # nor where the queue's head can be admitted (that head's stretch, if any, comes first).
        running = self.running
        if running and running[-1].is_prefilling:
            prompt, decoders = running[-1], running[:-1]
            # The prompt's next chunk, as `_run_prefill_chunks` sizes it after the decodes.
            chunk = min(prompt.num_pending, self._first_chunk_limit(len(decoders)))
            # Even if each decode took a block, and the chunk its most, none preempts (the usual case).
            if len(decoders) + self.bm.blocks_for(chunk) > self.bm.num_free_blocks:
                stretch = self._chunk_preempting(prompt, decoders, chunk)
                if stretch is not None:
                    return self._readmit_cycle(stretch) or stretch
            return self._prefill_stretch(prompt, decoders)
        if self.waiting:
            # Only a head that the next step admits gives a stretch here (its own admission
            # check is stricter than `_may_admit_during_stretch`): none means either the decode
            # steps go on without it, or the step is left to stepping, as that test decides.
            stretch = self._prefill_stretch(self.waiting[0], list(running), admits=True)
            if stretch is not None:
                # Cut short of the prompt's next chunk by too few blocks: possibly the first
                # admission of a readmission cycle.
                if not stretch.tail and stretch.newcomer is None:
                    return self._readmit_cycle(stretch) or stretch
                return stretch
        stretch = super().plan_stretch()
        if stretch is not None and stretch.victims:  # the newest decoder preempted: it may come back in turn
            return self._readmit_cycle(stretch) or stretch
        return stretch

    def _prefill_stretch(self, prefill: Request, decoders: list[Request], *, admits: bool = False) -> Stretch | None:
        """Every decode beside `prefill`'s chunks (from its admission, when `admits`: it heads
        the queue and the first step admits it, as `_run_prefill_chunks` would), and the
        decodes that follow its last chunk when that chunk is in the run. Where a request
        waits, the stretch's last step may be that of the last chunk with the newcomer's first."""
        # The checks that cost O(1) first: most calls end at one of them.
        budget_left = self.options.max_num_batched_tokens - len(decoders)
        chunk = min(self.chunk_size, budget_left)
        if chunk < 1 or (admits and len(decoders) >= self.options.max_num_seqs):
            return None
        num_waiting = len(self.waiting) - (1 if admits else 0)
        pending = prefill.num_tokens - prefill.num_processed
        # A recompute (of prompt and outputs, after a preemption) runs as a first prefill does,
        # but for a last chunk of one position (`_counted_as_decode`); it takes no one-position
        # chunks at all.
        recompute = prefill.num_outputs > 0
        if recompute and chunk == 1:
            return None
        # Every seat taken (the decoders and the prompt): no waiting request joins a step until
        # a decoder finishes.
        seats_full = len(decoders) + 1 >= self.options.max_num_seqs
        # The last chunk is all that is left (or, for a head admitted now, its whole prompt fits
        # one), and a request waits to join its step: that step alone, planned below (its own
        # checks decide who else could join).
        last_chunk_only = num_waiting > 0 and pending <= chunk and not seats_full \
            and not _counted_as_decode(prefill, pending)
        if num_waiting and chunk < budget_left and not seats_full and not last_chunk_only:
            return None  # budget left beside the chunk: a waiting request could be admitted
        num_steps = (pending - 1) // chunk  # steps before the chunk that completes the prompt
        # With nothing waiting, the step of that last chunk is certain too: nothing joins it; nor
        # where the seats stay taken to its end (checked below, once the finishes are known).
        tail = 0 if num_waiting and not seats_full else pending - num_steps * chunk
        if _counted_as_decode(prefill, tail):
            tail = 0
        total = num_steps + (1 if tail else 0)
        if total < 1 and not last_chunk_only:
            return None
        carry = self._carried(decoders)
        columns = self._decoder_columns(decoders, carry)
        if columns is None:
            return None
        ids, context, to_finish = columns
        left = None  # each decoder's steps left, where read here (not carried)
        if to_finish is None:
            if decoders:
                left = steps_left(decoders)
                to_finish = min(left)
            else:
                to_finish = total + 1
        if num_waiting and tail and to_finish < total:
            # A decoder finishes before the last chunk's step, whose seat a waiting request may
            # take there: the steps before it, as under any queue (they may run past finishes,
            # below; total >= 2, as to_finish >= 1).
            tail, total = 0, num_steps
        firsts = self.bm.first_new_block_steps(ids)
        if last_chunk_only:
            before = Stretch(0, decoders, ids, firsts, context, to_finish, prefill, chunk, prefill.num_processed,
                             admits=admits)
            return self._last_chunk_with_newcomer(before, pending)
        if admits:
            # Admission's own check, after the step's decodes took their blocks (as _try_admit).
            decode_blocks = firsts.count(1)  # a step's decode needs a block where its first is 1 (firsts are >= 1)
            need = self._blocks_to_admit(prefill, min(pending, chunk))
            if not self.bm.can_allocate(decode_blocks + need, reserve=self.num_watermark_blocks()):
                return None
        # With others waiting, none can join these steps (the checks above), however many come.
        stretch = Stretch(total, decoders, ids, firsts, context, to_finish, prefill, chunk, prefill.num_processed,
                          tail=tail, admits=admits, arrivals_wait=num_waiting > 0)
        # With a queue, the steps before the last chunk's (`total`) run past finishes, which
        # then also come before the step that admits the next prompt.
        # (Not with a tail while others wait: every seat stays taken to its end, where the
        # first finish comes, if any.)
        last_chunk = None  # the chunk that completes the prompt, where worked out here
        if to_finish < total + (num_waiting > 0) and not (num_waiting and tail) and \
                self._can_run_past_finishes_beside(num_waiting, recompute):
            stretch.remaining = left if left is not None else self._steps_left(decoders, carry)
            if chunk < self.chunk_size:
                stretch.chunk_cap = self.chunk_size
                before_tail, last_chunk = self._chunks_past_finishes(stretch, pending)
                if num_waiting:
                    total = stretch.num_steps = before_tail  # the last chunk's step is planned below
                else:
                    stretch.tail = last_chunk
                    total = stretch.num_steps = before_tail + 1
        # Blocks are counted as if finished decoders kept growing: never more than stepping needs.
        limit = self._steps_with_blocks(firsts, prefill, stretch.prompt_positions,
                                        total if stretch.remaining else min(total, to_finish), pending, admits)
        if limit < 1:
            return None
        if limit < total:
            stretch.num_steps, stretch.tail = limit, 0
        if stretch.tail and (to_finish > limit or stretch.remaining) and prefill.num_target_outputs > prefill.num_outputs + 1:
            # With a queue, every seat is taken to the first finish (a tail is planned only then).
            stretch.plan_then = partial(self._decodes_after_prompt, pending=pending, queue=num_waiting > 0)
        elif num_waiting and not stretch.tail and limit == total and (to_finish > limit or stretch.remaining):
            # Its decoders are those of the steps before: one part, not a part of one step after it.
            return self._last_chunk_with_newcomer(stretch, pending, last_chunk) or stretch
        return stretch

    def _chunk_preempting(self, prompt: Request, decoders: list[Request], chunk: int) -> Stretch | None:
        """The step that preempts (`_preempting_step`), where the decodes of `decoders` (every
        running request but `prompt`, the newest, whose prompt is in progress) find too few
        blocks free (`_decode_victims`: `prompt` goes first), or, after them, `prompt`'s next
        `chunk` does (it preempts itself, the newest, as `_schedule_running` does). None where the
        step preempts nothing: it is planned as any other."""
        # Decodes that fill the budget leave no chunk; such a step may still preempt: stepping's.
        if not decoders or chunk < 1 or not self.can_preempt_in_stretch():
            return None
        columns = self._decoder_columns(decoders, self._carried(decoders))
        if columns is None:
            return None
        ids, context, to_finish = columns
        firsts = self.bm.first_new_block_steps(ids)
        if self.bm.max_decode_steps(ids, 1, firsts) < 1:
            num_kept, victims = self._decode_victims(decoders, firsts)
        else:  # the decodes fit; the chunk after them finds the blocks they leave
            free_after_decodes = self.bm.num_free_blocks - firsts.count(1)
            if self.bm.num_new_blocks_needed(prompt.request_id, chunk) <= free_after_decodes:
                return None
            num_kept, victims = len(decoders), [prompt]
        return self._preempting_step(decoders, ids, firsts, context, to_finish, num_kept, victims)

    def _can_run_past_finishes_beside(self, num_waiting: int, recompute: bool) -> bool:
        """Whether a prompt's chunks may run on past finishes of the decoders beside them: past
        one, the batch only shrinks, and the chunk grows where it is the budget left beside the
        decodes. Either nothing waits for the seats or blocks a finish frees, or no step before
        the last chunk's has room for a waiting request: the step budget is at most a chunk, so
        each such step's chunk takes all the budget the decodes leave, however few they are."""
        if recompute or not (self.run_past_finishes and self.can_run_past_finishes()):
            return False
        return not num_waiting or self.options.max_num_batched_tokens <= self.chunk_size

    def _last_chunk_with_newcomer(self, stretch: Stretch, pending: int,
                                  tail: int | None = None) -> Stretch | None:
        """`stretch` (every chunk of its prompt but the last; none, for a stretch of no steps)
        and the step after it: the last chunk, the decodes, and the waiting requests admitted
        with their first chunks in the budget left, as `_run_prefill_chunks` would do it, each
        but the last with its whole prompt (`Stretch.whole_newcomers`), when nothing else could
        join that step (`stretch` itself, made longer; None, and `stretch` unchanged, otherwise).
        `tail`: that last chunk, where the caller has worked it out (its chunks grow at finishes:
        `_chunks_past_finishes`), else the positions `stretch` leaves of `pending`."""
        num_steps, prompt = stretch.num_steps, stretch.prefill
        assert prompt is not None
        # The decoders in that step: those that did not finish in the steps before.
        remaining = stretch.remaining
        num_decodes = len(stretch.decoders) if remaining is None else len([left for left in remaining if left > num_steps])
        if tail is None:
            tail = pending - stretch.prompt_positions(num_steps)
        if _counted_as_decode(prompt, tail):
            return None
        # Admission goes on while seats and budget are left (the prompt holds a seat).
        seats = self.options.max_num_seqs - num_decodes - 1
        room = self.options.max_num_batched_tokens - num_decodes - tail
        waiting, index = self.waiting, 1 if stretch.admits else 0
        admitted: list[Request] = []
        chunks: list[int] = []
        prompt_need = need = self._prompt_blocks_after(stretch, pending)[0]
        while seats > 0 and room > 0 and index < len(waiting):
            request = waiting[index]
            chunk = min(request.num_tokens, self.chunk_size, room)
            admitted.append(request)
            chunks.append(chunk)
            # Blocks admission gives it (under reserve admission, for every position it will hold).
            need += self._blocks_to_admit(request, chunk)
            seats, room, index = seats - 1, room - chunk, index + 1
            if chunk < request.num_tokens and seats > 0 and room > 0 and index < len(waiting):
                return None  # a second request would be admitted beside one still prefilling
        # Blocks: the decodes' in all these steps, the prompt's, then the newcomers', which
        # admission takes only while the watermark stays free (each in turn: so all of them,
        # once the last fits). Decoders that finished before are counted as if they kept
        # growing (stepping has their blocks back: as many free).
        watermark, bs, firsts = self.num_watermark_blocks(), self.bm.block_size, stretch.decode_firsts
        if not admitted or not decode_blocks_fit(firsts, num_steps + 1, bs, self.bm.num_free_blocks - need - watermark):
            head_need = prompt_need + watermark + self._blocks_to_admit(admitted[0], chunks[0]) if admitted else None
            return self._last_chunk_alone(stretch, pending, tail, prompt_need, head_need)
        # The stretch, made for this plan alone, becomes the one a step longer. A request that
        # arrives before that step would join it where there is room (none could join the steps
        # before: the queue waits, see _prefill_stretch).
        stretch.num_steps, stretch.tail = num_steps + 1, tail
        stretch.newcomer, stretch.newcomer_chunk = admitted[-1], chunks[-1]
        if len(admitted) > 1:
            stretch.whole_newcomers, stretch.whole_chunks = tuple(admitted[:-1]), tuple(chunks[:-1])
        stretch.arrivals_wait = seats <= 0 or room <= 0
        return stretch

    def _last_chunk_alone(self, stretch: Stretch, pending: int, tail: int, prompt_need: int,
                          head_need: int | None) -> Stretch | None:
        """`_last_chunk_with_newcomer` where no waiting request joins that step (its prompt takes
        `prompt_need` new blocks): none has a seat or budget left (`head_need` None), or the
        queue's head finds too few blocks free once the decodes, the last chunk and the watermark
        took theirs (`head_need` blocks in all, with its own), in a stretch of that step alone
        (where they are counted exactly). The head then waits to the first finish (the blocks
        free only shrink, and the budget the decodes leave it only grows): the decodes that
        follow are certain too, as behind any queue. None where the step is not certain that
        way, or finds too few blocks for the decodes and the chunk (or, for a prompt the step
        admits, too few to admit it)."""
        num_steps, prompt = stretch.num_steps, stretch.prefill
        assert prompt is not None
        firsts, bs, free = stretch.decode_firsts, self.bm.block_size, self.bm.num_free_blocks
        if head_need is not None and (num_steps or decode_blocks_fit(firsts, 1, bs, free - head_need)):
            return None  # the head may fit: stepping decides
        # A prompt admitted by the step: only while the watermark stays free.
        reserve = self.num_watermark_blocks() if stretch.admits else 0
        if not decode_blocks_fit(firsts, num_steps + 1, bs, free - prompt_need - reserve):
            return None  # the step preempts, or does not admit the prompt
        stretch.num_steps, stretch.tail, stretch.arrivals_wait = num_steps + 1, tail, True
        if head_need is not None and stretch.steps_to_finish > 1 and prompt.num_target_outputs > prompt.num_outputs + 1:
            stretch.plan_then = partial(self._decodes_after_prompt, pending=pending, queue=True)
        return stretch

    def _chunks_past_finishes(self, stretch: Stretch, pending: int) -> tuple[int, int]:
        """(steps before the one that completes the prompt, its chunk) in a stretch whose chunk
        grows as its decoders finish (`Stretch.chunk_cap`): span by span between finishes,
        each step takes a chunk of the prompt's `pending` positions."""
        remaining = stretch.remaining
        assert remaining is not None
        num_active, done = len(remaining), 0
        for finish in [*sorted(remaining), math.inf]:
            if finish > done:  # steps done + 1 .. finish, with num_active decoders
                chunk = stretch.chunk_beside(num_active)
                if pending <= (finish - done) * chunk:
                    before = (pending - 1) // chunk
                    return done + before, pending - before * chunk
                pending -= (finish - done) * chunk
                done = finish
            num_active -= 1
        raise AssertionError("unreachable: the last span has no end")

    def _steps_with_blocks(self, firsts: list[int], prefill: Request, positions: Callable[[int], int], limit: int,
                           pending: int, admits: bool = False) -> int:
        """Most steps (<= limit) whose new blocks, decodes and chunks together, are free now
        (the first k steps process positions(k) of the prompt's `pending` positions; the first
        admits the prompt where `admits`, with the blocks admission gives it)."""
        free, bs = self.bm.num_free_blocks, self.bm.block_size
        if limit < 1:
            return limit
        # Even if every decoder took its most blocks, and the prompt all it has left (plenty
        # free: the usual case; no closure is made before it is ruled out).
        if len(firsts) * (limit // bs + 1) + self._prompt_blocks(prefill, pending, admits) <= free:
            return limit

        def fits(num_steps: int) -> bool:
            prompt_blocks = self._prompt_blocks(prefill, min(positions(num_steps), pending), admits)
            return decode_blocks_fit(firsts, num_steps, bs, free - prompt_blocks)

        if fits(limit):
            return limit
        low, high = 0, limit
        while high - low > 1:
            mid = (low + high) // 2
            if fits(mid):
                low = mid
            else:
                high = mid
        return low

    def _prompt_blocks(self, prefill: Request, num_positions: int, admits: bool) -> int:
        """New blocks `prefill` takes for its next `num_positions` positions (from its admission,
        with the blocks admission gives it, where `admits`)."""
        if admits:
            return self._blocks_on_admission(prefill, num_positions)[0]
        return self.bm.num_new_blocks_needed(prefill.request_id, num_positions)

    def _after_decode_steps(self) -> None:
        self._last_was_prefill = False

    def _admits_after_decodes(self) -> bool:
        return self.order == "stall_free"  # alternate: a step with a chunk or admissions decodes none

    def _first_chunk_limit(self, num_decodes: int) -> int:
        return min(self.chunk_size, self.options.max_num_batched_tokens - num_decodes)

    def _is_scheduled(self, request: Request) -> bool:
        return request.request_id in self._plan.scheduled  # type: ignore[union-attr]


def _counted_as_decode(prompt: Request, last_chunk: int) -> bool:
    """Whether the chunk that completes `prompt` is one position past its prompt, which a step
    counts as a decode (`ScheduledSeq.is_decode`), not as a prompt chunk as a stretch records
    it: a recompute's (prompt and outputs, after a preemption) last position alone. Such a
    chunk is left to stepping."""
    return last_chunk == 1 and prompt.num_outputs > 0
