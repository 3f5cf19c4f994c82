"""A run of steps whose shape is known in advance, so they can be taken at once (the fast path).

Every step of a stretch processes one position for each of `decoders` still running (each
selects a token) and, optionally, one `chunk` of a single prompt, which may be admitted by the
first step (`admits`) and completed by the last (`tail`). A stretch's last step may also admit
a `newcomer` with its first chunk: beside the tail, or alone (continuous batching's
prefill-only step, a stretch of one step, whose decode-only steps follow as `then`), and
before it others with their whole prompts (`whole_newcomers`). A step
short of blocks, a stretch of one step, may preempt the newest running requests first
(`victims`); a prompt that finds no room to stay may be admitted and preempted in turn
(`readmits`). Nothing else is admitted, preempted or swapped meanwhile, and no request arrives,
unless it can only join the queue (`arrivals_wait`). Decoders may finish: in the stretch's
last step, or, when the stretch runs past finishes (`remaining` is given), in any step, after
which the batch goes on without them. A stretch may be followed by another (`then`): the
engine takes them as one run, and applies the decodes that follow a prompt's last chunk together
with the steps before them where it can (`joins`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

import numpy as np

from simcore.plan import RunShape
from simcore.request import Request

# Decoders from which a stretch sorts only those that finish within it: in a smaller batch the
# pass that picks them costs more than it saves (measured on the 10k reference runs: about 1%
# slower under continuous batching, whose runs past finishes see nearly every decoder finish;
# 3% faster under chunked prefill at twice the rate, with batches of 64 to 100).
MIN_BATCH_SORTED_IN_PART = 64

# RunShape from all eight fields, in order, without the named tuple's own __new__ (a Python
# function: 0.54 us a shape, against 0.29 us; every part of a run makes one to three).
_shape = partial(tuple.__new__, RunShape)


@dataclass(slots=True)
class Stretch:
    num_steps: int  # most steps certain to keep this shape (the engine may take fewer)
    decoders: list[Request]
    decode_ids: list[int]  # their request ids, for the block manager's bulk calls
    decode_firsts: list[int]  # the block manager's first_new_block_steps for them
    decode_context: int  # their total context before the first step
    steps_to_finish: int  # steps until the first decoder has all its outputs
    prefill: Request | None = None
    chunk: int = 0  # positions of `prefill` processed each step
    prefill_context: int = 0
    # Size of the chunk that completes the prompt in the stretch's last step (num_steps), when
    # the stretch reaches it; 0 when every step's chunk is `chunk` and selects nothing.
    tail: int = 0
    # Where the chunk is the budget left beside the decodes, below this most a step takes: in a
    # stretch that runs past finishes, each finish leaves the steps after it one position more
    # (`chunk_beside`). 0 where the chunk never changes.
    chunk_cap: int = 0
    # Whether `prefill` heads the waiting queue and the first step admits it.
    admits: bool = False
    # A waiting request the stretch's last step admits with its first chunk: beside the tail,
    # or with no prompt chunk (continuous batching's step that admits a whole prompt). A run
    # cut before that step admits none.
    newcomer: Request | None = None
    newcomer_chunk: int = 0
    # Waiting requests that step admits before the newcomer, each with its whole prompt (their
    # positions: `whole_chunks`), as a step's admissions go on while budget and seats are left:
    # each selects its first output there.
    whole_newcomers: tuple[Request, ...] = ()
    whole_chunks: tuple[int, ...] = ()
    # Each decoder's steps until its last output (batch order), when the stretch may run past
    # finishes; None when it ends at the first one.
    remaining: list[int] | None = None
    # The decoders' contexts when the stretch starts, when they are not those of `decoders` now
    # (a stretch that follows another: see `then`).
    decode_contexts: list[int] | None = None
    # A decode-only stretch that follows this one's last step, planned from the state it leaves
    # (the prompt completed by the tail decodes beside the others): by `plan_then`, given this
    # stretch, when the engine's pricing first reaches it (see `next_part`). A run is often cut
    # by an arrival before, and planning it reads the whole batch. It lets arrivals wait as this
    # one does: where they wait, it is planned without the queue, which none of its steps can
    # admit from before its first finish, where it ends. (`plan_then` is given the stretch rather
    # than holding it: a stretch that held itself would be a reference cycle, left to the
    # garbage collector when never reached.)
    then: Stretch | None = None
    plan_then: Callable[[Stretch], Stretch | None] | None = None
    # Whether requests arriving during this stretch's steps cannot change them: they join the
    # queue behind a head that none of its steps can admit (admission is first come, first
    # served), so the engine need not stop at them. Every part of a run says the same (the
    # engine checks). Such a run changes the queue only by those arrivals and its own admissions (the
    # engine's step records count on it). Under load, where a queue builds up, arrivals come
    # every step or two.
    arrivals_wait: bool = False
    # Running requests that a stretch of one step preempts for recompute before any position is
    # processed, in the order they go: the newest, where the decodes, or the prompt's next
    # chunk after them, find too few blocks free (`BasePolicy._decode_victims`). Such a step
    # admits nothing; `decoders` are the rest of the batch.
    victims: list[Request] | None = None
    # A prompt that the batch has no room to keep, admitted again and again (`policies.
    # readmit_cycle`): each admission takes `prefill` from the head of the queue and runs as
    # many of its chunks as this tuple says, one a step, and the next step preempts it for
    # recompute (its next chunk, or the decodes, find too few blocks free). The first step
    # admits it (`admits`), or preempts it first (`victims`: it alone, then running). Every
    # decoder decodes in every step and none finishes.
    readmits: tuple[int, ...] = ()
    # Whether the engine may apply this stretch and the one before it as one (`apply_joined`):
    # this is the decode-only stretch that follows a prompt's last chunk (`then`), its decoders
    # that part's, none of which finished in it, and then that prompt, whose first output was
    # its first token (no recompute, nothing preempted): one pass over the decoders does for
    # both parts, and the engine records the two in one go.
    joins: bool = False
    # Departures in finish order, worked out when first needed (see `departures`), and the
    # stretch length they cover.
    _sorted: list[tuple[int, int, int]] | None = None
    _sorted_upto: int = 0

    @property
    def newcomer_selects(self) -> bool:
        """Whether the newcomer's first chunk is its whole prompt (it selects a token)."""
        return self.newcomer is not None and self.newcomer_chunk == self.newcomer.num_tokens

    @property
    def newcomer_positions(self) -> int:
        """Positions of the prompts the newcomer's step admits (its chunk and the whole ones)."""
        return self.newcomer_chunk + sum(self.whole_chunks)

    @property
    def num_newcomers(self) -> int:
        """Requests the newcomer's step admits."""
        return (self.newcomer is not None) + len(self.whole_newcomers)

    @property
    def num_newcomers_selecting(self) -> int:
        """Of those, the ones that select a token in that step (whose whole prompt runs)."""
        return self.newcomer_selects + len(self.whole_newcomers)

    @property
    def newcomers(self) -> tuple[Request, ...]:
        """The requests the newcomer's step admits, in queue order (the whole ones, then it)."""
        return self.whole_newcomers if self.newcomer is None else (*self.whole_newcomers, self.newcomer)

    def admits_newcomer(self, num_steps: int) -> bool:
        """Whether the first `num_steps` steps include the one that admits the newcomer."""
        return self.newcomer is not None and num_steps == self.num_steps

    def chunk_beside(self, num_active: int) -> int:
        """The prompt's chunk in a step with `num_active` decoders (a whole chunk, not the tail)."""
        if self.chunk_cap:
            return min(self.chunk_cap, self.chunk + len(self.decoders) - num_active)
        return self.chunk

    def prompt_positions(self, num_steps: int) -> int:
        """Positions of the prompt that the first `num_steps` steps process."""
        if self.chunk_cap and self.has_departures(num_steps):
            return sum(self.step_chunks(num_steps))  # the chunk grows at finishes
        return (num_steps - 1) * self.chunk + self.tail if self.reaches_tail(num_steps) else num_steps * self.chunk

    def step_chunks(self, num_steps: int) -> list[int]:
        """The prompt positions each of the first `num_steps` steps processes, in a run with
        departures (before the last of them)."""
        assert self.has_departures(num_steps), "decode_spans covers runs with departures only"
        chunks: list[int] = []
        for steps, num_active, _ in self.decode_spans(num_steps):
            chunks += [self.chunk_beside(num_active)] * steps
        if self.reaches_tail(num_steps):
            chunks[-1] = self.tail
        return chunks

    def next_part(self) -> Stretch | None:
        """The stretch that follows this one (`then`), planned when first asked for; it must be
        asked for before this stretch is applied, whose state it is planned from."""
        if self.plan_then is not None:
            self.then, self.plan_then = self.plan_then(self), None
        return self.then

    def may_go_on(self) -> bool:
        """Whether a stretch may follow this one."""
        return self.then is not None or self.plan_then is not None

    def parts(self) -> Iterator[Stretch]:
        """This stretch and those that follow it, in order, each planned when reached."""
        part: Stretch | None = self
        while part is not None:
            yield part
            part = part.next_part()

    def readmit_positions(self, num_steps: int) -> list[int]:
        """For a readmission cycle (`readmits`), the prompt's positions stored after each of its
        first `num_steps` steps: 0 after a step that preempts it."""
        stored = [0] if self.victims else []
        for num_chunks in self.readmits:
            stored += range(self.chunk, (num_chunks + 1) * self.chunk, self.chunk)
            stored.append(0)
        return stored[:num_steps]

    def reaches_tail(self, num_steps: int) -> bool:
        """Whether the first `num_steps` steps include the one that completes the prompt."""
        return self.tail > 0 and num_steps == self.num_steps

    def has_departures(self, num_steps: int) -> bool:
        """Whether some decoder finishes before the last of the first `num_steps` steps."""
        return self.remaining is not None and num_steps > self.steps_to_finish

    def runs(self, num_steps: int | None = None) -> Iterator[tuple[int, RunShape]]:
        """(steps, shape) pieces covering the first `num_steps` steps (all by default): one
        shape, or one per span between finishes, since the batch shrinks after each; and the
        step of the prompt's last chunk (the tail) on its own."""
        limit = self.num_steps if num_steps is None else num_steps
        if self.readmits:  # steps with the prompt's chunks, then one without it, in turn
            n, chunk = len(self.decoders), self.chunk
            for step, stored in enumerate(self.readmit_positions(limit)):
                yield 1, _shape((n, self.decode_context + step * n, chunk if stored else 0, max(stored - chunk, 0),
                                 False, 0, False, ()))
            return
        if self.newcomer is not None and self.prefill is None:  # a step that admits it alone (beside a tail: below)
            yield 1, _shape((len(self.decoders), self.decode_context, self.chunk, self.prefill_context, False,
                             self.newcomer_chunk, self.newcomer_selects, self.whole_chunks))
            return
        completes = self.reaches_tail(limit)
        body = limit - 1 if completes else limit  # steps of a whole chunk (or of decodes alone)
        n = len(self.decoders)
        if not self.has_departures(limit):
            if body:
                yield body, self.run_shape()
            decode_context = self.decode_context + body * n
            prefill_context = self.prefill_context + body * self.chunk
        else:
            done, prefill_context = 0, self.prefill_context
            for steps, n, context in self.decode_spans(limit):
                if completes and done + steps == limit:  # the last span: its last step is the tail's
                    steps -= 1
                    decode_context = context + steps * n
                if steps:
                    q = self.chunk_beside(n)
                    yield steps, _shape((n, context, q, prefill_context, False, 0, False, ()))
                    prefill_context += steps * q
                done += steps
        if completes:
            yield 1, _shape((n, decode_context, self.tail, prefill_context, True, self.newcomer_chunk,
                             self.newcomer_selects, self.whole_chunks))

    def decode_spans(self, num_steps: int) -> Iterator[tuple[int, int, int]]:
        """(steps, number of decoders, their total context at the span's first step): pieces
        covering the first `num_steps` steps of a run with departures, one per span between
        finishes (and one with none left, when a prompt's chunks go on after every decoder
        finished)."""
        assert num_steps <= self.num_steps, "departures cover the stretch's steps only"
        done = self.steps_to_finish  # steps yielded so far
        num_active, context = len(self.decoders), self.decode_context
        yield done, num_active, context
        for finish_step, _, leaving_context in self.departures():
            if finish_step > done:  # a span up to this finish with the batch as it is
                steps = min(finish_step, num_steps) - done
                yield steps, num_active, context + done * num_active
                done += steps
                if done >= num_steps:
                    return
            num_active -= 1
            context -= leaving_context
        if done < num_steps:  # decoders that finish after the stretch, if any, stay to its end
            yield num_steps - done, num_active, (context + done * num_active) if num_active else 0

    def departures(self) -> list[tuple[int, int, int]]:
        """(finish step, batch index, context before the run) of every decoder, in finish order
        (batch order within a step); in a large batch, of those that finish within the
        stretch's steps only (the rest stay to its end). Worked out when first needed (many
        runs end, cut by an arrival, before their first finish), which must be before the run
        is applied: the contexts are read from the requests. Pricing past the first finish,
        `stretch_run_counts` and the ITL pass of `apply_stretch` all come first."""
        if self._sorted is None or self.num_steps > self._sorted_upto:
            remaining = self.remaining
            assert remaining is not None
            contexts = self.decode_contexts
            # (finish step, index) pairs are distinct: contexts are never compared.
            if len(remaining) < MIN_BATCH_SORTED_IN_PART:
                if contexts is None:
                    contexts = [request.num_processed for request in self.decoders]
                self._sorted = sorted(zip(remaining, range(len(remaining)), contexts))
            else:
                # Under load most of a large batch outlasts a run: sort only those that leave in
                # it, and read only their contexts.
                num_steps = self.num_steps
                if contexts is None:
                    decoders = self.decoders
                    self._sorted = sorted([(left, index, decoders[index].num_processed)
                                           for index, left in enumerate(remaining) if left <= num_steps])
                else:
                    self._sorted = sorted([(left, index, contexts[index])
                                           for index, left in enumerate(remaining) if left <= num_steps])
            self._sorted_upto = self.num_steps
        return self._sorted

    def run_shape(self) -> RunShape:
        """What a cost model needs to price the steps one at a time (`iter_step_times`)."""
        return _shape((len(self.decoders), self.decode_context, self.chunk, self.prefill_context, False, 0, False, ()))


@dataclass(slots=True)
class DecoderCarry:
    """What a run leaves of its decoders for the next plan, so that it need not read them all
    again: the running requests it advanced (a prefix of the batch, in order), their ids and
    total context, and the steps until the first has all its outputs. Each one's steps left
    are `remaining` less `steps_taken`, when the run knew them."""

    requests: list[Request]
    ids: list[int]
    context: int
    steps_to_finish: int
    remaining: list[int] | None = None
    steps_taken: int = 0
    # When every one of them last output a token at the same time (the run's last step), that
    # time: the next run's first gaps are then all one value (None: not known to be so).
    last_token_s: float | None = None

    def steps_left(self) -> list[int] | None:
        if self.remaining is None:
            return None
        taken = self.steps_taken
        return [left - taken for left in self.remaining]


def run_aggregates(shape: RunShape, num_steps: int) -> tuple:
    """Per-step aggregates of `num_steps` steps of one shape, for a cost model that prices them
    in bulk: tokens, sequences, selecting positions (the same each step), attention work
    sum q (2c + q) and KV positions touched (context + new) (arrays)."""
    n, q = shape.num_decodes, shape.chunk
    j = np.arange(num_steps, dtype=np.int64)
    decode_context = shape.decode_context + j * n
    prefill_context = shape.prefill_context + j * q
    num_tokens = n + q + shape.new_positions
    # Decodes: sum (2c + 1); the chunk: q (2c + q); new prompts' chunks: q^2 each.
    attn_work = 2 * decode_context + n + q * (2 * prefill_context + q) + shape.new_attention_work
    kv_positions = decode_context + prefill_context + num_tokens
    return num_tokens, shape.num_seqs, shape.num_selecting, attn_work, kv_positions
