"""The step plan: the only thing a cost model (simulated or real) sees of a step.

Plain frozen data, produced by a policy's `schedule()` and consumed by `complete()`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
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


class RunShape(NamedTuple):
    """A run of steps of one shape, as the fast path hands it to a cost model (plain data).

    Step j (from 0) decodes `num_decodes` requests whose contexts total decode_context +
    j * num_decodes (each processes one position and selects a token) and, if chunk > 0,
    processes `chunk` positions of one prompt on a context of prefill_context + j * chunk.
    The chunk selects a token only if `chunk_selects` (it completes the prompt: a run of one
    step); otherwise the prompt is not done within the run. A run of one step may also carry
    `new_chunk` positions of a newly admitted prompt (on no context), selecting a token if
    `new_selects` (the whole prompt), and before it further prompts admitted whole (on no
    context), each `new_whole` positions, each selecting a token.
    """

    num_decodes: int
    decode_context: int
    chunk: int = 0
    prefill_context: int = 0
    chunk_selects: bool = False
    new_chunk: int = 0
    new_selects: bool = False
    new_whole: tuple[int, ...] = ()

    @property
    def num_seqs(self) -> int:
        return self.num_decodes + (1 if self.chunk else 0) + (1 if self.new_chunk else 0) + len(self.new_whole)

    @property
    def num_selecting(self) -> int:
        return self.num_decodes + (1 if self.chunk_selects else 0) + (1 if self.new_selects else 0) + len(self.new_whole)

    @property
    def new_positions(self) -> int:
        """Positions of the newly admitted prompts (the new chunk and the whole ones)."""
        return self.new_chunk + sum(self.new_whole)

    @property
    def new_attention_work(self) -> int:
        """Their attention work, sum q (2c + q) on no context: the sum of their squares."""
        return self.new_chunk * self.new_chunk + sum([q * q for q in self.new_whole])


@dataclass(frozen=True, slots=True)
class DecodeGroup:
    """Decodes of many requests kept as columns: each processes one position on top of its
    complete prompt and selects a token. Cheaper to build and price than one ScheduledSeq each."""

    request_ids: tuple[int, ...]
    context_lens: tuple[int, ...]
    prompt_lens: tuple[int, ...]
    sum_context: int

    def __len__(self) -> int:
        return len(self.request_ids)

    def seqs(self) -> tuple[ScheduledSeq, ...]:
        return tuple(ScheduledSeq(rid, 1, context, True, prompt)
                     for rid, context, prompt in zip(self.request_ids, self.context_lens, self.prompt_lens))


class StepSeqs(Sequence):
    """A step's sequences when its decodes come as a `DecodeGroup` (first in batch order) and the
    rest one by one. Reads as the full tuple of ScheduledSeq; aware readers use the columns."""

    __slots__ = ("decodes", "others", "_all")

    def __init__(self, decodes: DecodeGroup, others: tuple[ScheduledSeq, ...]) -> None:
        self.decodes = decodes
        self.others = others
        self._all: tuple[ScheduledSeq, ...] | None = None

    def _materialized(self) -> tuple[ScheduledSeq, ...]:
        if self._all is None:
            self._all = self.decodes.seqs() + self.others
        return self._all

    def __len__(self) -> int:
        return len(self.decodes) + len(self.others)

    def __getitem__(self, index):  # noqa: ANN001, ANN204
        return self._materialized()[index]

    def __iter__(self) -> Iterator[ScheduledSeq]:
        return iter(self._materialized())

    def __eq__(self, other: object) -> bool:
        return tuple(self) == tuple(other) if isinstance(other, Sequence) else NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"StepSeqs({len(self.decodes)} grouped decodes, {self.others!r})"


# A device block in a swap's copies where block ids are not tracked (see StepPlan).
NO_BLOCK_ID = -1


@dataclass(frozen=True, slots=True)
class StepPlan:
    step_id: int
    # Requests that run this step, in batch order: a tuple, or StepSeqs (a decode group first).
    seqs: tuple[ScheduledSeq, ...] | StepSeqs
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

    # Token counts, derived once from `seqs` (read by cost models and step records).
    num_batched_tokens: int = field(init=False, default=0)
    num_prefill_tokens: int = field(init=False, default=0)
    num_decode_tokens: int = field(init=False, default=0)
    num_selecting: int = field(init=False, default=0)

    @property
    def decodes(self) -> DecodeGroup | None:
        """The step's decode group, if its decodes come as columns (see StepSeqs)."""
        return self.seqs.decodes if isinstance(self.seqs, StepSeqs) else None

    def __post_init__(self) -> None:
        batched = prefill = decode = selecting = 0
        seqs = self.seqs
        if isinstance(seqs, StepSeqs):
            batched = decode = selecting = len(seqs.decodes)
            seqs = seqs.others
        for seq in seqs:
            batched += seq.num_new_tokens
            if seq.num_new_tokens == 1 and seq.context_len >= seq.prompt_len:
                decode += 1
            else:
                prefill += seq.num_new_tokens
            if seq.selects_token:
                selecting += 1
        object.__setattr__(self, "num_batched_tokens", batched)
        object.__setattr__(self, "num_prefill_tokens", prefill)
        object.__setattr__(self, "num_decode_tokens", decode)
        object.__setattr__(self, "num_selecting", selecting)
