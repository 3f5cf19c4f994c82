"""The step plan: the only thing a cost model (simulated or real) sees of a step.

Plain data, produced by a policy's `schedule()` and consumed by its `complete()`. A run
of steps taken at once is a list of `Repeat`s: a plan and how many steps repeat it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NamedTuple


class ScheduledSeq(NamedTuple):
    """One request's share of a step (a NamedTuple: cheap to build, thousands per simulated second)."""

    request_id: int
    # Positions processed this step (q_i): a prefill chunk, a recompute, or 1 for a decode.
    num_new_tokens: int
    # Positions already in the KV cache before this step (c_i), prefix-cache hits included;
    # the new positions are context_len .. context_len + num_new_tokens - 1.
    context_len: int
    # Whether this step reaches the last known token, so its logits select an output.
    selects_token: bool
    # Prompt length, so a backend can tell prompt positions from generated ones.
    prompt_len: int
    # Physical KV block ids for logical blocks 0..n-1 after this step's allocation.
    block_table: tuple[int, ...] = ()
    # Prompt content when the workload carries token ids (the real engine feeds them).
    prompt_token_ids: tuple[int, ...] | None = None
    # Prompt content as keyed segments ((content key, tokens), ...) when the workload gives them, so
    # the real engine can synthesize equal tokens for equal keys (shared prefixes hit shared KV).
    segments: tuple | None = None

    @property
    def is_decode(self) -> bool:
        """A single generated token processed on top of a complete prompt."""
        return self.num_new_tokens == 1 and self.context_len >= self.prompt_len

    @property
    def end_len(self) -> int:
        return self.context_len + self.num_new_tokens


# A device block in a swap's copies where block ids are not tracked (see StepPlan).
NO_BLOCK_ID = -1


class Decodes(NamedTuple):
    """A step's decodes as columns: each request processes one position on top of its complete
    prompt and selects an output. How a policy plans a batch of decodes (often hundreds a
    step) without building a sequence for each; read one by one, they are `ScheduledSeq`s."""

    request_ids: Sequence[int]
    context_lens: Sequence[int]
    prompt_lens: Sequence[int]


NO_DECODES = Decodes((), (), ())


class StepPlan:
    """A step's plan (plain data, not changed once built): the sequences that run, in batch
    order, and the blocks the step moves. Decodes may come as columns (`decodes`, first in the
    batch) besides sequences built one by one (`listed`); `seqs` reads them all as sequences."""

    __slots__ = ("step_id", "decodes", "listed", "blocks_to_copy", "blocks_to_swap_out", "blocks_to_swap_in",
                 "block_bytes", "preempted_ids", "admitted_ids", "group_step", "num_batched_tokens", "num_prefill_tokens",
                 "num_decode_tokens", "num_selecting", "num_seqs", "_seqs")

    def __init__(
        self,
        step_id: int,
        seqs: tuple[ScheduledSeq, ...] = (),
        *,
        decodes: Decodes = NO_DECODES,
        blocks_to_copy: tuple[tuple[int, int], ...] = (),
        blocks_to_swap_out: tuple[tuple[int, int], ...] = (),
        blocks_to_swap_in: tuple[tuple[int, int], ...] = (),
        block_bytes: int = 0,
        preempted_ids: tuple[int, ...] = (),
        admitted_ids: tuple[int, ...] = (),
        group_step: int = 0,
    ) -> None:
        self.step_id = step_id
        # Decodes as columns, then sequences built one by one (`seqs`, after them in the batch).
        self.decodes = decodes
        self.listed = seqs
        # Copy-on-write block copies to perform before the step: (source block, destination block).
        self.blocks_to_copy = blocks_to_copy
        # Device -> host block moves (swap-out / offload): (device block, host block). The device
        # side is NO_BLOCK_ID where the block manager only counts blocks (no cost model that reads
        # device ids runs then: a real engine's has them tracked).
        self.blocks_to_swap_out = blocks_to_swap_out
        # Host -> device block moves (swap-in / prefix reload): (host block, device block), the
        # device side as above.
        self.blocks_to_swap_in = blocks_to_swap_in
        # Bytes of one KV block, so transfer costs need no model knowledge beyond the plan.
        self.block_bytes = block_bytes
        # Requests preempted while forming this plan (they do not run in it).
        self.preempted_ids = preempted_ids
        # Requests admitted from the queue by this plan (they run in it).
        self.admitted_ids = admitted_ids
        # Its place in a multi-step group (`num_scheduler_steps`): 0 for a step a scheduler pass
        # planned; k for the k-th step after it, which repeats that schedule with no pass (a
        # cost model charges it no CPU scheduling time).
        self.group_step = group_step
        # Counts, derived once (read by cost models and step records).
        num_decodes = len(decodes.request_ids)
        batched = prefill = 0
        decode = selecting = num_decodes
        for seq in seqs:
            batched += seq.num_new_tokens
            if seq.is_decode:
                decode += 1
            else:
                prefill += seq.num_new_tokens
            if seq.selects_token:
                selecting += 1
        self.num_seqs = num_decodes + len(seqs)
        self.num_batched_tokens = batched + num_decodes
        self.num_prefill_tokens = prefill
        self.num_decode_tokens = decode
        self.num_selecting = selecting
        self._seqs: tuple[ScheduledSeq, ...] | None = None if num_decodes else seqs

    @property
    def seqs(self) -> tuple[ScheduledSeq, ...]:
        """Every sequence of the step, in batch order (the decodes' columns read once, when asked)."""
        if self._seqs is None:
            decodes = self.decodes
            self._seqs = (*(ScheduledSeq(request_id, 1, context, True, prompt_len) for request_id, context, prompt_len
                            in zip(decodes.request_ids, decodes.context_lens, decodes.prompt_lens)), *self.listed)
        return self._seqs

    @property
    def moves_blocks(self) -> bool:
        """Whether the step copies or swaps blocks besides running its sequences."""
        return bool(self.blocks_to_copy or self.blocks_to_swap_out or self.blocks_to_swap_in)

    def without(self, indices: Sequence[int]) -> StepPlan:
        """This plan's sequences but those at `indices` (batch order), for a plan that moves no
        blocks (a run's, past finishes); decodes stay columns."""
        gone, num_decodes = set(indices), len(self.decodes.request_ids)
        kept = [index for index in range(num_decodes) if index not in gone]
        decodes = Decodes(*([column[index] for index in kept] for column in self.decodes))
        listed = tuple(seq for index, seq in enumerate(self.listed, num_decodes) if index not in gone)
        return StepPlan(self.step_id, listed, decodes=decodes, group_step=self.group_step)

    def with_seqs(self, seqs: tuple[ScheduledSeq, ...], step_id: int | None = None) -> StepPlan:
        """This plan with other sequences (all listed) and, if given, another step id."""
        return StepPlan(self.step_id if step_id is None else step_id, seqs, blocks_to_copy=self.blocks_to_copy,
                        blocks_to_swap_out=self.blocks_to_swap_out, blocks_to_swap_in=self.blocks_to_swap_in,
                        block_bytes=self.block_bytes, preempted_ids=self.preempted_ids, admitted_ids=self.admitted_ids,
                        group_step=self.group_step)

    def _key(self) -> tuple:
        return (self.step_id, self.seqs, self.blocks_to_copy, self.blocks_to_swap_out, self.blocks_to_swap_in,
                self.block_bytes, self.preempted_ids, self.admitted_ids, self.group_step)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StepPlan) and self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={value!r}" for name, value in zip(
            ("step_id", "seqs", "blocks_to_copy", "blocks_to_swap_out", "blocks_to_swap_in", "block_bytes",
             "preempted_ids", "admitted_ids", "group_step"), self._key()))
        return f"StepPlan({fields})"

    def __getstate__(self) -> tuple:
        return self._key()

    def __setstate__(self, state: tuple) -> None:
        step_id, seqs, copy, swap_out, swap_in, block_bytes, preempted, admitted, group_step = state
        self.__init__(step_id, seqs, blocks_to_copy=copy, blocks_to_swap_out=swap_out,  # type: ignore[misc]
                      blocks_to_swap_in=swap_in, block_bytes=block_bytes, preempted_ids=preempted,
                      admitted_ids=admitted, group_step=group_step)


class Repeat(NamedTuple):
    """`num_steps` steps of one shape, as a run hands them to a cost model. Step j (from 0) is
    `plan` advanced by `advance + j` steps: each of its requests processes as many positions as
    in `plan` (a decode one, a prompt chunk its chunk), on a context longer by that many times
    what it processes, and selects the same tokens. Such a plan moves no blocks. (Past a finish,
    a run goes on with a repeat of its plan `without` those that left.)"""

    plan: StepPlan
    num_steps: int
    advance: int = 0

    def plans(self) -> Iterator[StepPlan]:
        """Every step's plan, in order (what `simcore.pricing.repeat_times` prices by default)."""
        plan = self.plan
        for step in range(self.advance, self.advance + self.num_steps):
            seqs = tuple(seq._replace(context_len=seq.context_len + step * seq.num_new_tokens) for seq in plan.seqs)
            yield plan.with_seqs(seqs, plan.step_id + step)
