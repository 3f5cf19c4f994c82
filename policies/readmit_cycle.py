"""A prompt admitted and preempted in turn, taken as one stretch (the fast path, under load).

When the KV cache is nearly full, the head of the queue may find room for its first chunks but
not for the rest: steps admit it and run those chunks beside the decodes, and the next step
preempts it for recompute, as it is the newest running request: its next chunk finds too few
blocks once the decodes took theirs, or the decodes alone find too few and it is their first
victim. It heads the queue again, and the step after admits it again, while the decodes'
blocks leave room for its first chunk. A cycle often starts with a step that preempts the
prompt in progress, or the newest decoder, which then heads the queue. Under sustained load
these admissions and preemptions were a fifth of a chunked-prefill run's parts, each planned
and applied as a stretch of a step or two. Here a cycle's steps are planned together: each
step's block tests are worked out from the blocks its decodes take (a request's decodes take a
block once every block_size steps, at its own offset), and the stretch (`Stretch.readmits`)
is applied in one pass.

Its steps are certain whatever arrives: no request could join an admitting step beside the
prompt's chunk, which takes every token the step's budget leaves (or the last seat), and the
prompt stays at the head of the queue.
"""

from __future__ import annotations

from collections import Counter
from operator import sub
from typing import Any

from policies.stretch import Stretch
from simcore.request import Request


class ReadmitCycleMixin:
    # Provided by BasePolicy and its stretch planner.
    options: Any
    bm: Any
    num_steps: int
    num_resident_tokens: int
    _preempted_at: dict[int, tuple[float, int, str]]
    _now: float
    _admit: Any
    _admission_reserve: Any
    _take_off_running: Any
    _drop_for_recompute: Any
    _note_resumed: Any
    itl: Any
    _after_decode_steps: Any
    _decoders_after: Any
    _advance_decoders: Any
    _add_first_gaps: Any
    _retire: Any
    _carry: Any
    _first_chunk_limit: Any
    num_watermark_blocks: Any
    can_preempt_in_stretch: Any
    readmission_reason: Any

    def _readmit_cycle(self, first: Stretch) -> Stretch | None:
        """The steps that admit and preempt the head of the queue in turn, from `first` on: a
        step that preempts one request alone for recompute (which then heads the queue), or
        the steps that admit the head with its chunks beside every decode (planned by
        `_prefill_stretch`, cut short of its next chunk by too few blocks). As many admissions
        as are certain, each followed by the step that preempts the prompt, before any decoder
        finishes; None where there is none."""
        decoders = first.decoders
        # (Admission that reserves every block up front is never planned as a stretch.)
        if first.tail or first.newcomer is not None or not decoders or not self.can_preempt_in_stretch() \
                or self.options.admission == "reserve":
            return None
        num_decoders, bs = len(decoders), self.bm.block_size
        if first.victims:  # the cycle follows it, with the same checks as `_prefill_stretch`'s
            if first.num_steps != 1 or len(first.victims) != 1 or first.prefill is not None:
                return None
            prompt, lead = first.victims[0], 1
            chunk = self._first_chunk_limit(num_decoders)
            if chunk < 1 or num_decoders >= self.options.max_num_seqs or (prompt.num_outputs and chunk == 1):
                return None
            free = self.bm.num_free_blocks + self.bm.num_table_blocks[prompt.request_id]
            # Readmitted whole, even if every decode took a block every step: no cycle (the usual case).
            most_steps = 2 + prompt.num_tokens // chunk
            if num_decoders * most_steps + self.bm.blocks_for(prompt.num_tokens) <= free:
                return None
        else:
            prompt, lead, chunk = first.prefill, 0, first.chunk
            if not first.admits or prompt is None:
                return None
            free = self.bm.num_free_blocks
            # Its next chunk fits, even if every decode took a block every step (the usual case).
            if num_decoders * (first.num_steps + 1) + self.bm.blocks_for((first.num_steps + 1) * chunk) <= free:
                return None
        if self.readmission_reason(prompt) is not None:
            return None  # its preemption rejects it: it does not come back (`_drop_for_recompute`)
        # No one could join an admitting step (see the module docstring).
        if chunk < self.options.max_num_batched_tokens - num_decoders and num_decoders + 1 < self.options.max_num_seqs:
            return None
        firsts = first.decode_firsts
        if max(firsts) > bs:
            return None
        pending = prompt.num_tokens  # all its positions, once it is preempted (or from the queue)
        full_chunks = (pending - 1) // chunk  # chunks before its last
        by_offset = Counter(firsts)
        free -= by_offset[1] * lead  # the preempting step's decodes
        reserve, blocks_for = self.num_watermark_blocks(), self.bm.blocks_for
        admissions: list[int] = []
        step = lead  # steps so far
        while True:
            # Admission finds blocks for the decodes and the first chunk, the watermark kept free.
            if by_offset[step % bs + 1] + blocks_for(chunk) + reserve > free:
                break
            # Its chunks, while the decodes' blocks and theirs fit (as `_steps_with_blocks`
            # finds them), up to its last (the admitting stretch ends before it).
            num_chunks, grown = 0, 0
            while num_chunks < full_chunks:
                taken = by_offset[(step + num_chunks) % bs + 1]
                if grown + taken + blocks_for((num_chunks + 1) * chunk) > free:
                    break
                grown, num_chunks = grown + taken, num_chunks + 1
            stored = num_chunks * chunk
            if not num_chunks or step + num_chunks + 1 >= first.steps_to_finish:
                break  # (no decoder finishes in the cycle)
            if not admissions and not lead and num_chunks != first.num_steps:
                return None  # not the planner's stretch: a safety net
            # The step after preempts the prompt alone: its decodes fit, but then not the
            # prompt's next chunk; or they do not, and the prompt, the newest, is their first
            # victim, and enough (`_decode_victims`).
            held = blocks_for(stored)
            more = blocks_for(stored + min(pending - stored, chunk)) - held
            left = free - grown - held
            preempt_blocks = by_offset[(step + num_chunks) % bs + 1]
            if preempt_blocks > left + held or (preempt_blocks <= left and more <= left - preempt_blocks):
                break
            admissions.append(num_chunks)
            free = left + held - preempt_blocks
            step += num_chunks + 1
        if not admissions:
            return None
        return Stretch(step, decoders, first.decode_ids, firsts, first.decode_context, first.steps_to_finish, prompt,
                       chunk, admits=not lead, arrivals_wait=True, victims=first.victims, readmits=tuple(admissions))

    def _apply_readmits(self, stretch: Stretch, step_ends: list[float]) -> list[Request]:
        """apply_stretch for a stretch that admits and preempts its prompt in turn (its first
        step's admission or preemption is begin_stretch's); none finishes. Cut after an
        admitting step, it leaves the prompt running with its chunks."""
        num_steps = len(step_ends)
        prompt, chunk = stretch.prefill, stretch.chunk
        assert prompt is not None
        delivery = self.options.delivery_s
        times = [end + delivery for end in step_ends] if delivery else step_ends
        # The decoders' gaps, as stepping adds them: each one's first, then one a step for all.
        decoders = stretch.decoders
        self._add_first_gaps(decoders, times[0])
        if num_steps > 1:
            self.itl.add_run(list(map(sub, times[1:], times[:-1])), len(decoders))
        # The prompt's steps first: its blocks come and go, and the decodes' blocks, taken
        # below, were free throughout.
        request_id, reserve = prompt.request_id, self._admission_reserve(prompt)
        stored_after = stretch.readmit_positions(num_steps)
        for step, stored in enumerate(stored_after):
            if not stored:  # preempted at the start of this step (the first step's: begin_stretch)
                if step:
                    self._now = step_ends[step - 1]
                    self._take_off_running(prompt)
                    self._drop_for_recompute(prompt)
                continue
            if stored == chunk and step:  # admitted again (the first step's admission: begin_stretch)
                self._admit(prompt, step_ends[step - 1], reserve)
            self.bm.append(request_id, chunk)
            prompt.num_processed += chunk
            self.num_resident_tokens += chunk
            if self._preempted_at and request_id in self._preempted_at:
                self._note_resumed(prompt, step_ends[step])
        # The prompt, where it holds blocks now, did not decode.
        self.bm.append_decode_steps(stretch.decode_ids, num_steps, stretch.decode_firsts, (request_id,))
        # (No prefix cache: cycles are planned only without one.)
        self._advance_decoders(decoders, num_steps, times[-1])
        self.num_steps += num_steps
        self._after_decode_steps()
        self._carry = self._decoders_after(stretch, num_steps, False)
        return self._retire([], prompt if stored_after[-1] else None)
