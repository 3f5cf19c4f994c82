"""A run of steps whose shape is known in advance, so they can be taken at once (the fast path).

Every step of a stretch processes one position for each of `decoders` (each selects a token)
and, optionally, one `chunk` of a single prefilling request that does not finish its prompt
within the stretch. Nothing arrives, is admitted, preempted or swapped meanwhile; the first
finishes may happen in the last step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simcore.plan import RunShape
from simcore.request import Request

# Runs shorter than this are taken as single steps (a run's bookkeeping costs about one step's).
MIN_RUN_STEPS = 2


@dataclass(frozen=True, slots=True)
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

    @property
    def num_seqs(self) -> int:
        return len(self.decoders) + (1 if self.prefill is not None else 0)

    def shapes(self) -> tuple:
        """Per-step aggregates a cost model prices: tokens, sequences, selecting positions,
        attention work sum q (2c + q), and KV positions touched (context + new)."""
        n, q = len(self.decoders), self.chunk
        j = np.arange(self.num_steps, dtype=np.int64)
        decode_context = self.decode_context + j * n
        prefill_context = self.prefill_context + j * q
        num_tokens = n + q
        # Decodes: sum (2c + 1); the chunk: q (2c + q).
        attn_work = 2 * decode_context + n + q * (2 * prefill_context + q)
        kv_positions = decode_context + prefill_context + num_tokens
        return num_tokens, self.num_seqs, n, attn_work, kv_positions

    def run_shape(self) -> RunShape:
        """What a cost model needs to price the steps one at a time (`iter_step_times`)."""
        return RunShape(len(self.decoders), self.decode_context, self.chunk, self.prefill_context)
