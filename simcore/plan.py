"""The step plan: the only thing a cost model (simulated or real) sees of a step.

Plain data, produced by a policy's `schedule()` and consumed by its `complete()`. A run
of steps taken at once is a list of `Repeat`s: a plan and how many steps repeat it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
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


@dataclass(slots=True)
class StepPlan:
    """A step's plan (plain data, not changed once built)."""

    step_id: int
    # Requests that run this step, in batch order.
    seqs: tuple[ScheduledSeq, ...]
    # Copy-on-write block copies to perform before the step: (source block, destination block).
    blocks_to_copy: tuple[tuple[int, int], ...] = ()
    # Device -> host block moves (swap-out / offload): (device block, host block). The device
    # side is NO_BLOCK_ID where the block manager only counts blocks (no cost model that reads
    # device ids runs then: a real engine's has them tracked).
    blocks_to_swap_out: tuple[tuple[int, int], ...] = ()
    # Host -> device block moves (swap-in / prefix reload): (host block, device block), the
    # device side as above.
    blocks_to_swap_in: tuple[tuple[int, int], ...] = ()
    # Bytes of one KV block, so transfer costs need no model knowledge beyond the plan.
    block_bytes: int = 0
    # Requests preempted while forming this plan (they do not run in it).
    preempted_ids: tuple[int, ...] = ()
    # Requests admitted from the queue by this plan (they run in it).
    admitted_ids: tuple[int, ...] = ()

    # Token counts, derived once from `seqs` (read by cost models and step records).
    num_batched_tokens: int = field(init=False, default=0)
    num_prefill_tokens: int = field(init=False, default=0)
    num_decode_tokens: int = field(init=False, default=0)
    num_selecting: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        batched = prefill = decode = selecting = 0
        for seq in self.seqs:
            batched += seq.num_new_tokens
            if seq.num_new_tokens == 1 and seq.context_len >= seq.prompt_len:
                decode += 1
            else:
                prefill += seq.num_new_tokens
            if seq.selects_token:
                selecting += 1
        self.num_batched_tokens = batched
        self.num_prefill_tokens = prefill
        self.num_decode_tokens = decode
        self.num_selecting = selecting

    @property
    def moves_blocks(self) -> bool:
        """Whether the step copies or swaps blocks besides running its sequences."""
        return bool(self.blocks_to_copy or self.blocks_to_swap_out or self.blocks_to_swap_in)


class Repeat(NamedTuple):
    """`num_steps` steps of one shape, as a run hands them to a cost model. Step j (from 0) is
    `plan` advanced by `advance + j` steps: each of its requests processes as many positions as
    in `plan` (a decode one, a prompt chunk its chunk), on a context longer by that many times
    what it processes, and selects the same tokens; but for the sequences at the indices in
    `without` (requests that left the batch: a run past finishes). Such a plan moves no blocks."""

    plan: StepPlan
    num_steps: int
    advance: int = 0
    without: tuple[int, ...] = ()

    def plans(self) -> Iterator[StepPlan]:
        """Every step's plan, in order (what `simcore.pricing.run_step_times` prices by default)."""
        plan, gone = self.plan, set(self.without)
        kept = [seq for index, seq in enumerate(plan.seqs) if index not in gone]
        for step in range(self.advance, self.advance + self.num_steps):
            seqs = tuple(seq._replace(context_len=seq.context_len + step * seq.num_new_tokens) for seq in kept)
            yield replace(plan, step_id=plan.step_id + step, seqs=seqs)
