"""Acceleration: the steps certain to follow a planned one, taken at once.

A layer beside the policies, opt-in (`limits.fast_forward`, `--no-fast-forward`): after a
policy planned a step, the engine asks its accelerator to `extend` the plan, and takes the
`StepRun` it gets (if any) as one event, priced by `simcore.pricing.repeat_times`. Nothing
here decides what a step does: the planned step is the policy's own, and a run only continues
what it leaves, for as many steps as the policy's predicates (`policies.base.Scheduler`, "what
accelerators ask"), its chunk rule and the block manager's arithmetic make certain. Results are
identical to taking every step on its own (tests/test_accelerate.py runs every registered
policy, queue order and cost model both ways).

- `DecodeRuns` (any policy): when every running request decodes after the planned step and
  the policy says the next step only continues them (`only_continues_next`), their decodes
  repeat until the first finish (or, where the policy allows, on past finishes with the rest),
  until their blocks run out, or until a request is delivered that could start (`arrival_waits`).
- `ChunkRuns` (ChunkedPrefillPolicy, stall-free, registered for that exact class): also where
  one prompt is in progress beside the decodes, its next chunks (`chunk_for`) up to the one
  that completes it, then its decodes beside theirs (the tail), past finishes where the
  generic runs go past them (a finish's budget goes to the next chunks): steps whose budget
  the decodes and the chunk take whole admit nothing, whatever waits. Its gain, against the
  generic runs alone (this class unregistered), side by side in one process: the 10k chunked
  prefill reference run in 1.65 s against 1.93 s (best of 3), 9,946 events against 28,224.
  The tail's share: 13,517 events without it, 11,083 with it, 9,946 past finishes too; 5%
  and 3% of the wall time (benchmarks/sim_speed.py --trees, best of 3 and of 5).

`accelerator_for(policy)` picks the one registered for the policy's exact class, else
`DecodeRuns`, where the class that wrote the policy's `fill` says its predicates describe it
(`accelerable`), else none: a subclass, or a new policy, runs correctly either way (docs/
policies.md, "Writing a policy").
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterator
from itertools import accumulate, groupby, repeat
from operator import add, sub

from policies.base import Scheduler, SchedulerOptions
from policies.chunked_prefill import ChunkedPrefillPolicy
from simcore.decode_blocks import first_new_block_step, firsts_after, max_steps_within
from simcore.itl import ItlLog
from simcore.plan import Decodes, Repeat, ScheduledSeq, StepPlan
from simcore.request import Request
from simcore.steplog import StepRecord


class StepRun:
    """The steps after a planned one in which each of `decoders` decodes (until its last output
    or the run's end) and, optionally, `prompt` runs `chunks[j]` positions in step j, the last
    of which may complete it (its first output); a completed prompt decodes in the steps after
    its chunks (the run's tail), the batch's last."""

    def __init__(self, policy: Scheduler, plan: StepPlan, decoders: list[Request], ids: list[int],
                 firsts: list[int], steps_left: list[int], num_steps: int, prompt: Request | None = None,
                 chunks: list[int] | None = None, room_from: int | None = None) -> None:
        self.policy = policy
        # The planned step (completed), and what it leaves: each decoder's next new-block step
        # (the block manager's `first_new_block_steps`) and steps until its last output (each at
        # least one), and the prompt's context.
        self.plan = plan
        self.decoders = decoders
        self.ids = ids
        self.firsts = firsts
        self.steps_left = steps_left
        self.num_steps = num_steps
        # The run's steps up to the first finish of a decoder (none: all of them).
        self.first_finish = min(steps_left) if steps_left else num_steps
        self.prompt = prompt
        self.prompt_context = prompt.num_processed if prompt is not None else 0
        self.chunks = chunks or []
        # The first step with budget left beside the decodes and the chunk (in the tail, beside
        # the decodes): admission is tried there (None: in none).
        self.room_from = room_from
        # Whether the chunks complete the prompt (its last known token: an output), and then the
        # run's steps up to its last output (in the tail, or its last chunk's).
        self.completes = prompt is not None and self.prompt_context + sum(self.chunks) == prompt.num_tokens
        self.prompt_finish = len(self.chunks) + prompt.num_target_outputs - prompt.num_outputs - 1 \
            if self.completes else None  # type: ignore[union-attr]
        # The decodes of the run's first step, as a plan's columns (built when first priced).
        self._decodes: Decodes | None = None

    # ---- what the engine asks ---------------------------------------------------------------

    def steps_kept(self, request: Request, step: int) -> int:
        """How many of the run's steps stay as planned when `request` is delivered before step
        `step` (from 0) starts: those before the first step that could admit it, or, where the
        policy rejects it, before the step that would (stepping hands it over there and it
        leaves: a reader of the engine's load counts it out from then)."""
        if self.policy.rejection_reason(request) is not None:
            return step
        if self.prompt is not None:
            return max(step, self.room_from if self.room_from is not None else self.num_steps)
        if self.policy.arrival_waits(request):
            return max(step, self.first_finish)  # a finish frees what it waits for
        return step

    def num_leaving(self, num_steps: int) -> int:
        """Requests that finish in the run's first `num_steps` steps: decoders at their last
        output, the prompt at its own (the one its last chunk selects, or one in the tail)."""
        leaving = sum(1 for left in self.steps_left if left <= num_steps)
        if self.prompt_finish is not None and self.prompt_finish <= num_steps:
            leaving += 1
        return leaving

    def repeats(self) -> Iterator[Repeat]:
        """The run's steps as cost models see them: a plan and the steps that repeat it."""
        if self.prompt is not None:
            yield from self._chunk_repeats()
            return
        yield from _repeats_of(self._plan(0, 0), self.steps_left, self.num_steps)

    def _plan(self, step: int, chunk: int, completes: bool = False) -> StepPlan:
        """The plan of the run's step `step` (from 0): the decodes, and the prompt's `chunk`
        (none: 0) on the positions the chunks before took, completing it or not."""
        prompt = self.prompt
        listed = ()
        if prompt is not None:
            context = self.prompt_context + sum(self.chunks[:step])
            listed = (ScheduledSeq(prompt.request_id, chunk, context, completes, prompt.prompt_len),)
        return StepPlan(self.plan.step_id + 1 + step, listed, decodes=self._decodes_at(step))

    def _tail_plan(self) -> StepPlan:
        """The plan of the tail's first step: every decoder's decode, then the prompt's."""
        prompt, step = self.prompt, len(self.chunks)
        assert prompt is not None
        decodes = self._decodes_at(step)
        decodes = Decodes([*decodes.request_ids, prompt.request_id],
                          [*decodes.context_lens, self.prompt_context + sum(self.chunks)],
                          [*decodes.prompt_lens, prompt.prompt_len])
        return StepPlan(self.plan.step_id + 1 + step, (), decodes=decodes)

    def _decodes_at(self, step: int) -> Decodes:
        """Every decoder's decode in the run's step `step` (from 0), those that left before it
        too (`_repeats_of` leaves them out)."""
        if self._decodes is None:
            decoders = self.decoders
            self._decodes = Decodes(self.ids, [request.num_processed for request in decoders],
                                    [request.prompt_len for request in decoders])
        decodes = self._decodes
        if step:
            decodes = decodes._replace(context_lens=[context + step for context in decodes.context_lens])
        return decodes

    def _chunk_repeats(self) -> Iterator[Repeat]:
        """The decodes with the prompt's whole chunks, a repeat of equal chunks at a time, then
        the step of its last chunk, then the tail: the decodes with the prompt's. Decoders leave
        after their last output (`_repeats_of`); the prompt runs in every step."""
        prompt, chunks, completes = self.prompt, self.chunks, self.completes
        assert prompt is not None
        body = len(chunks) - completes
        start = 0
        for chunk, equal in groupby(chunks[:body]):
            num_steps = len(list(equal))
            yield from self._from_step(start, self._plan(start, chunk), num_steps, num_steps)
            start += num_steps
        if completes:
            yield from self._from_step(body, self._plan(body, chunks[-1], completes=True), 1, 1)
        if self.num_steps > len(chunks):
            yield from self._from_step(len(chunks), self._tail_plan(), self.prompt_finish - len(chunks),
                                       self.num_steps - len(chunks))

    def _from_step(self, step: int, base: StepPlan, prompt_left: int, num_steps: int) -> Iterator[Repeat]:
        """`num_steps` steps of `base`, the plan of the run's step `step`: the decoders, each to its
        last output, then the prompt, for `prompt_left` steps."""
        yield from _repeats_of(base, [*(left - step for left in self.steps_left), prompt_left], num_steps)

    def apply(self, step_ends: list[float]) -> tuple[list[Request], StepRecord]:
        """Complete the run's first len(step_ends) steps (after the planned one's `complete`)."""
        policy, bm = self.policy, self.policy.bm
        num_steps = len(step_ends)
        delivery = policy.options.delivery_s
        times = [end + delivery for end in step_ends] if delivery else step_ends
        blocks_before, shared_before = bm.num_used_blocks, bm.num_shared_blocks
        resident_before, num_running = policy.num_resident_tokens, len(policy.running)
        # The decoders' gaps before their first output in the run (each after its own last).
        first_gaps = [times[0] - request.last_token_s for request in self.decoders]
        taken, new_blocks = self._apply_decodes(num_steps, times)
        chunks, completion, prompt_gaps = self._apply_prompt(step_ends, times, new_blocks)
        active = [len(self.decoders)] * num_steps if type(taken) is int else _active(taken, num_steps)
        # Decodes each step: the decoders', and in the tail the prompt's.
        tail, prompt_finish = len(self.chunks), self.prompt_finish
        decoding = active
        if prompt_finish is not None and num_steps > tail:
            decoding = [count + (tail <= step < prompt_finish) for step, count in enumerate(active)]
        self._add_gaps(times, decoding, first_gaps, prompt_gaps, completion)
        # Finishes, in step order (batch order within a step, the prompt last), as stepping
        # retires them: a decoder that leaves before the last step frees its blocks and seat there.
        freed_blocks, freed_tokens, leaving = [0] * num_steps, [0] * num_steps, [0] * num_steps
        done = []
        finishes = [] if self.first_finish > num_steps else \
            [(left, index) for index, left in enumerate(self.steps_left) if left <= num_steps]
        if completion is not None and prompt_finish <= num_steps:  # type: ignore[operator]
            finishes.append((prompt_finish, len(self.decoders)))  # (the batch's last)
        if finishes:
            members = [*self.decoders, self.prompt]
            for left, index in sorted(finishes):
                request = members[index]
                if left < num_steps:  # (the last step's state is read after it)
                    freed_blocks[left - 1] += bm.num_table_blocks[request.request_id]
                    leaving[left - 1] += 1
                freed_tokens[left - 1] += request.num_processed
                done.append(request)
        for request in done:
            policy.finish(request, request.last_token_s)
        first_id = policy.num_steps
        policy.num_steps += num_steps
        # Each step's counts: in it, and after it (the last step's, as the state reads now).
        running = list(accumulate(leaving, sub, initial=num_running))[1:]
        blocks = list(accumulate(map(sub, new_blocks, freed_blocks), initial=blocks_before))[1:]
        resident = list(accumulate(map(sub, map(add, decoding, chunks), freed_tokens), initial=resident_before))[1:]
        running[-1], blocks[-1], resident[-1] = len(policy.running), bm.num_used_blocks, policy.num_resident_tokens
        selected = decoding
        if completion is not None:
            selected = [*decoding[:completion], decoding[completion] + 1, *decoding[completion + 1:]]
        record = StepRecord(
            range(first_id, first_id + num_steps), 0.0, 0.0,
            _column([count + (step < tail) for step, count in enumerate(decoding)] if tail else decoding),
            _column(chunks), _column(decoding), _column(selected), _column(running), 0,
            len(policy.swapped), blocks, _until_last(shared_before, bm.num_shared_blocks, num_steps),
            policy.host.num_used_blocks if policy.host is not None else 0, resident, 0, 0, 0, 0)
        return done, record

    def _apply_decodes(self, num_steps: int, times: list[float]) -> tuple[int | list[int], list[int]]:
        """The decoders' steps: blocks, positions and outputs. Returns how many steps each took
        (an int where all took every step) and the new blocks each step took."""
        policy, bm, decoders, ids, firsts = self.policy, self.policy.bm, self.decoders, self.ids, self.firsts
        taken: int | list[int] = num_steps
        if self.first_finish < num_steps:  # each decodes up to its last output
            taken = [left if left < num_steps else num_steps for left in self.steps_left]
        new_blocks = _blocks_each_step(firsts, taken, bm.block_size, num_steps)
        if policy.prefix.enabled:
            # Blocks taken and filled blocks registered step by step, as stepping does: the
            # first of two equal blocks is the one the cache keeps, and an allocation may evict.
            # (Every decoder takes every step: with a prefix cache a run ends at its first finish.)
            for _ in range(num_steps):
                bm.append_decode_steps(ids, 1)
                for request in decoders:
                    request.num_processed += 1
                    policy.prefix.register_full_blocks(request, request.num_processed - 1)
                    request.num_outputs += 1
            last = times[-1]
            for request in decoders:
                request.last_token_s = last
        elif type(taken) is int:
            bm.append_decode_steps(ids, num_steps, firsts)
            last = times[-1]
            for request in decoders:
                request.num_processed += num_steps
                request.num_outputs += num_steps
                request.last_token_s = last
        else:
            bm.append_decode_steps(ids, taken, firsts)
            for request, count in zip(decoders, taken):
                request.num_processed += count
                request.num_outputs += count
                request.last_token_s = times[count - 1]
        policy.num_resident_tokens += len(decoders) * num_steps if type(taken) is int else sum(taken)
        return taken, new_blocks

    def _add_gaps(self, times: list[float], decoding: list[int], first_gaps: list[float],
                  prompt_gaps: list[float], completion: int | None) -> None:
        """Inter-token gaps, step by step as stepping adds them: the decoders' first, then one a
        step shared by those decoding in it; a recompute's beside theirs in the step of its
        last chunk (`completion`)."""
        itl, last = self.policy.itl, len(times) - 1
        if prompt_gaps and completion == 0:
            first_gaps, prompt_gaps = [*first_gaps, *prompt_gaps], []
        if first_gaps:
            itl.add_gaps(first_gaps)
        if not prompt_gaps:
            _add_step_gaps(itl, times, decoding, range(1, last + 1))
            return
        assert completion is not None
        _add_step_gaps(itl, times, decoding, range(1, completion))
        itl.add_gaps([times[completion] - times[completion - 1]] * decoding[completion] + prompt_gaps)
        _add_step_gaps(itl, times, decoding, range(completion + 1, last + 1))

    def _apply_prompt(self, step_ends: list[float], times: list[float],
                      new_blocks: list[int]) -> tuple[list[int], int | None, list[float]]:
        """The prompt's chunks in the first len(step_ends) steps, its output where they complete
        it, and its decodes in the tail: (the positions each step ran of it as a prompt, none
        without one; the step of its last chunk, None where not taken; the gap before that
        output, for a recompute). Adds the blocks it takes each step to `new_blocks`."""
        prompt, num_steps = self.prompt, len(step_ends)
        if prompt is None:
            return [0] * num_steps, None, []
        policy, bm = self.policy, self.policy.bm
        chunks = self.chunks[:num_steps]
        num_decodes = 0  # its decodes in the tail, to its last output
        if self.prompt_finish is not None and num_steps > len(chunks):
            num_decodes = min(num_steps, self.prompt_finish) - len(chunks)
        request_id, total = prompt.request_id, sum(chunks) + num_decodes
        resuming = request_id in policy.preempted_at
        positions = taken = 0  # the positions its chunks ran so far, and the blocks they take
        for step, chunk in enumerate(chunks):  # step by step: blocks, and a recompute back where it was
            positions += chunk
            needed = bm.num_new_blocks_needed(request_id, positions)
            new_blocks[step] += needed - taken
            taken = needed
            prompt.num_processed += chunk
            if resuming and request_id in policy.preempted_at:
                policy.note_resumed(prompt, step_ends[step])
        held = bm.num_table_blocks[request_id] + taken  # after its chunks
        bm.append(request_id, total)
        policy.num_resident_tokens += total
        if len(chunks) < len(self.chunks) or not self.completes:
            return chunks, None, []
        completion = len(chunks) - 1
        gaps = policy.select_outputs([prompt], step_ends[completion])
        if num_decodes:  # the tail: its decodes' blocks as a decoder's, from the step after its last chunk
            first = len(chunks) + first_new_block_step(held * bm.block_size, prompt.num_processed)
            tail_blocks = _blocks_each_step([first], [len(chunks) + num_decodes], bm.block_size, num_steps)
            new_blocks[:] = [count + more for count, more in zip(new_blocks, tail_blocks)]
            prompt.num_processed += num_decodes
            prompt.num_outputs += num_decodes
            prompt.last_token_s = times[completion + num_decodes]
        return [*chunks, *repeat(0, num_steps - len(chunks))], completion, gaps


def _blocks_each_step(firsts: list[int], taken: int | list[int], block_size: int, num_steps: int) -> list[int]:
    """New blocks each of `num_steps` steps takes, where each request (next new block at step
    `firsts`) decodes its first `taken` steps (all of them, where an int): one at its first,
    then every block_size steps."""
    new_blocks = [0] * num_steps
    counts = repeat(taken) if type(taken) is int else taken
    if num_steps <= block_size:  # at most one each: at its first, if it decodes then
        for first, count in zip(firsts, counts):
            if first <= count:
                new_blocks[first - 1] += 1
        return new_blocks
    for first, count in zip(firsts, counts):
        if first <= count:
            for step in range(first, count + 1, block_size):
                new_blocks[step - 1] += 1
    return new_blocks


def _repeats_of(base: StepPlan, steps_left: list[int], num_steps: int) -> Iterator[Repeat]:
    """`num_steps` steps of `base`, whose sequences each run until its `steps_left` (of
    `base`'s steps): one repeat, or past finishes a repeat for each interval between them,
    without those that left."""
    if num_steps <= min(steps_left, default=num_steps):  # nobody leaves before the last step
        yield Repeat(base, num_steps)
        return
    done = 0
    for finish in sorted(set(steps_left)):
        if finish > done:
            steps = min(finish, num_steps) - done
            gone = [index for index, left in enumerate(steps_left) if left <= done]
            yield Repeat(base.without(gone) if gone else base, steps, done)
            done += steps
        if done >= num_steps:
            return


def _add_step_gaps(itl: ItlLog, times: list[float], decoding: list[int], steps: range) -> None:
    """One gap for each of `steps`, shared by those decoding in it."""
    steps = [step for step in steps if decoding[step]]
    itl.add_weighted([times[step] - times[step - 1] for step in steps], [decoding[step] for step in steps])


def _active(taken: list[int], num_steps: int) -> list[int]:
    """How many of the decoders (each taking its `taken` steps) decode in each step."""
    num_taking = [0] * (num_steps + 1)
    for count in taken:
        num_taking[count] += 1
    num_decoders = len(taken)
    return [num_decoders - gone for gone in accumulate(num_taking[:num_steps])]


def _column(values: list[int]) -> int | list[int]:
    """A run's column: one value where every step has it, else a value a step."""
    return values[0] if values.count(values[0]) == len(values) else values


def _until_last(before: int, after: int, num_steps: int) -> int | list[int]:
    """A column that holds `before` until the run's last step, which shows `after`."""
    return before if before == after else [*([before] * (num_steps - 1)), after]


class DecodeRuns:
    """The generic accelerator: runs of decode-only steps of an unchanged batch."""

    def __init__(self, policy: Scheduler) -> None:
        self.policy = policy

    def extend(self, plan: StepPlan, finished: list[Request], *, closed_loop: bool) -> StepRun | None:
        """Where every running request decodes next (`plan` completed) and the next step only
        continues them: their decodes, repeated."""
        policy = self.policy
        running = policy.running
        if policy.emit_block_tables or not running or not policy.only_continues_next(plan, finished) \
                or any(request.is_prefilling for request in running):
            return None
        if policy.preempted_at and not policy.preempted_at.keys().isdisjoint(r.request_id for r in running):
            return None  # (never after a step that left it decoding: a safety net)
        steps_left = [request.num_target_outputs - request.num_outputs for request in running]
        past_finishes = not closed_loop and policy.runs_past_finishes()
        limit = max(steps_left) if past_finishes else min(steps_left)
        # Blocks are counted as if those that finish kept growing: never more than stepping needs.
        ids = [request.request_id for request in running]
        firsts = policy.bm.first_new_block_steps(ids)
        num_steps = policy.bm.max_decode_steps(ids, limit, firsts)
        if num_steps < 1:
            return None
        return StepRun(policy, plan, list(running), ids, firsts, steps_left, num_steps)


class ChunkRuns(DecodeRuns):
    """Chunked prefill's runs: decodes beside one prompt's chunks, else the generic ones."""

    policy: ChunkedPrefillPolicy

    def extend(self, plan: StepPlan, finished: list[Request], *, closed_loop: bool) -> StepRun | None:
        return self._chunk_run(plan, closed_loop) or super().extend(plan, finished, closed_loop=closed_loop)

    def _chunk_run(self, plan: StepPlan, closed_loop: bool) -> StepRun | None:
        """Where every running request decodes next but the newest, a prompt in progress (`plan`
        completed): the steps that run every decode and that prompt's next chunk, as `fill`
        (stall-free) does when no swapped request waits and nothing is admitted, and once its
        last chunk completes it, the steps in which it decodes with the others (the tail).
        Admission is tried only in a step whose budget the decodes and the chunk leave room in
        (`room_from`): the run stops before one while requests wait. It stops at the first
        finish, or goes on past finishes where the policy allows (`runs_past_finishes`), as the
        generic runs do: a finish frees budget the next chunks take, and a seat. It runs where
        blocks are counted only."""
        policy = self.policy
        running = policy.running
        if not running or policy.order != "stall_free" or policy.bm.tracks_block_ids or policy.swapped \
                or policy.emit_block_tables or plan.preempted_ids or plan.moves_blocks:
            return None
        prompt, decoders = running[-1], running[:-1]
        if not prompt.is_prefilling or any(request.is_prefilling for request in decoders):
            return None
        steps_left = [request.num_target_outputs - request.num_outputs for request in decoders]
        pending = prompt.num_pending
        first_finish = min(steps_left) if steps_left else math.inf
        past_finishes = not closed_loop and policy.runs_past_finishes()
        options, leaving = policy.options, sorted(steps_left)
        recompute = prompt.num_outputs > 0
        # The prompt's chunks, one a step, to its last, while no decoder finishes or past
        # finishes, each in the budget and seats the decoders still decoding leave.
        chunks: list[int] = []
        room_from = None
        while pending > 0 and (past_finishes or len(chunks) < first_finish):
            num_decodes = _num_decoding(leaving, len(chunks))
            chunk = policy.chunk_for(pending, options.max_num_batched_tokens - num_decodes)
            if chunk < 1 or (recompute and chunk == 1):
                break  # no budget; or a recompute's one position, which a step counts as a decode
            if room_from is None and _has_room(options, num_decodes, chunk):
                if policy.waiting:
                    break  # admission is tried there, with requests waiting
                room_from = len(chunks)
            chunks.append(chunk)
            pending -= chunk
        num_steps = len(chunks)
        # The tail, where the chunks complete the prompt, to the first finish (the prompt's own,
        # or a decoder's), or past finishes to the last: its steps have room where a seat and
        # budget are left beside the decodes, and after a finish, which admission tries (the
        # run stops before them while requests wait).
        outputs_after = prompt.num_target_outputs - prompt.num_outputs - 1
        room = _has_room(options, _num_decoding(leaving, num_steps), 1)
        if not pending and outputs_after and (past_finishes or first_finish > num_steps) \
                and not (room and policy.waiting):
            prompt_finish = num_steps + outputs_after
            if room and room_from is None:
                room_from = num_steps
            if past_finishes:
                if room_from is None:  # a finish frees a seat and budget: from the step after it
                    later = [left for left in leaving if left > num_steps]
                    room_from = min([prompt_finish, *later[:1]])
                num_steps = max([prompt_finish, *steps_left])
            else:
                num_steps = min(first_finish, prompt_finish)
        ids = [request.request_id for request in decoders]
        firsts = policy.bm.first_new_block_steps(ids)
        num_steps = _chunk_steps_within(policy, firsts, prompt, chunks, num_steps)
        if num_steps < 1:
            return None
        return StepRun(policy, plan, decoders, ids, firsts, steps_left, num_steps, prompt, chunks[:num_steps],
                       room_from)


def _num_decoding(leaving: list[int], step: int) -> int:
    """Decoders still decoding in a run's step `step` (from 0), of those leaving after the
    steps in `leaving` (sorted)."""
    return len(leaving) - bisect_right(leaving, step)


def _has_room(options: SchedulerOptions, num_decodes: int, num_new: int) -> bool:
    """Whether a step of `num_decodes` decodes and a prompt's `num_new` positions leaves a seat
    and budget, which admission tries."""
    return options.max_num_seqs - num_decodes - 1 > 0 and num_new < options.max_num_batched_tokens - num_decodes


def _chunk_steps_within(policy: Scheduler, firsts: list[int], prompt: Request, chunks: list[int],
                        num_steps: int) -> int:
    """Most of a chunk run's `num_steps` steps (these chunks, then the tail's decodes) whose
    new blocks, decodes' and prompt's, are free."""
    bm = policy.bm
    free, bs = bm.num_free_blocks, bm.block_size
    taken = prompt_taken = 0  # blocks the chunks' steps take, and the prompt's share
    decode_blocks = accumulate(_blocks_each_step(firsts, len(chunks), bs, len(chunks)))
    for step, (positions, decodes_taken) in enumerate(zip(accumulate(chunks), decode_blocks)):
        prompt_taken = bm.num_new_blocks_needed(prompt.request_id, positions)
        taken = decodes_taken + prompt_taken
        if taken > free:
            return step
    if num_steps == len(chunks):
        return num_steps
    # The tail: decodes, the prompt's the last, in the blocks the chunks leave free.
    capacity = (bm.num_table_blocks[prompt.request_id] + prompt_taken) * bs
    tail_firsts = [*firsts_after(firsts, len(chunks), bs),
                   first_new_block_step(capacity, prompt.num_processed + sum(chunks))]
    return len(chunks) + max_steps_within(tail_firsts, bs, free - taken, num_steps - len(chunks))


def accelerator_for(policy: Scheduler) -> DecodeRuns | None:
    """The accelerator registered for the policy's exact class, else the generic one where the
    class that wrote the policy's `fill` says its predicates describe it (`accelerable`), else
    None: plain stepping (as under multi-step scheduling, `num_scheduler_steps`)."""
    if policy.options.num_scheduler_steps > 1:
        return None  # (a run delivers each step's outputs as it ends; a multi-step group, at its end)
    cls = type(policy)
    if cls in ACCELERATORS:
        return ACCELERATORS[cls](policy)
    filler = next(klass for klass in cls.__mro__ if "fill" in vars(klass))
    return DecodeRuns(policy) if vars(filler).get("accelerable", False) else None


# Accelerators for an exact policy class, each justified by its measured gain (its docstring).
ACCELERATORS: dict[type, type[DecodeRuns]] = {ChunkedPrefillPolicy: ChunkRuns}
